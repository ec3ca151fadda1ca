// Non-finite inputs through the strategies (docs/kernel.md "Numerics: non-finite inputs"): a NaN or
// Inf key on one rank makes exactly the rows that see it NaN, whichever rank holds them and however
// the partial states travel and merge (ring, const-max ring, allgather, ulysses, usp, passq,
// passkv); a padded key stays invisible whatever it holds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cp_test_util.h"
#include "seqpar/parallel/decode.h"

namespace seqpar {
namespace {

using seqpar::testing::random_tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kTol = 1e-4;

constexpr int64_t kSeq = 96, kHeads = 4, kKvHeads = 2, kDim = 16;
constexpr int64_t kBadPos = 40, kBadHead = 1;  // the poisoned key: position, kv head

struct Global {
  Tensor q, k, v;
};

Global make_global(float bad, bool in_value) {
  std::mt19937 rng(3);
  Global g;
  g.q = random_tensor({1, kSeq, kHeads, kDim}, rng, DType::kF32);
  g.k = random_tensor({1, kSeq, kKvHeads, kDim}, rng, DType::kF32);
  g.v = random_tensor({1, kSeq, kKvHeads, kDim}, rng, DType::kF32);
  Tensor& t = in_value ? g.v : g.k;
  t.data<float>()[(kBadPos * kKvHeads + kBadHead) * kDim + 3] = bad;
  return g;
}

// Rows (B = 1, S, H) that see the bad key: heads of its kv head; causal: positions >= it;
// padding (valid_len): none when the key is padding.
bool sees_bad(int64_t pos, int64_t h, bool causal, int64_t valid_len) {
  if (valid_len > 0 && kBadPos >= valid_len) return false;
  if (h / (kHeads / kKvHeads) != kBadHead) return false;
  return !causal || pos >= kBadPos;
}

// Every row: NaN (out and lse) iff it sees the bad key; the others match the reference.
void expect_state(const AttnState& got, const AttnState& ref, bool causal, int64_t valid_len,
                  const std::string& what) {
  const int64_t rows_to_check = valid_len > 0 ? valid_len : kSeq;  // padded queries: meaningless
  int64_t nan_rows = 0;
  for (int64_t i = 0; i < rows_to_check; ++i)
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t r = i * kHeads + h;
      const bool want_nan = sees_bad(i, h, causal, valid_len);
      nan_rows += want_nan;
      ASSERT_EQ(std::isnan(got.lse.at(r)), want_nan) << what << " position " << i << " head " << h;
      ASSERT_EQ(std::isnan(ref.lse.at(r)), want_nan) << what << " reference position " << i;
      for (int64_t e = 0; e < kDim; ++e) {
        const float o = got.out.at(r * kDim + e);
        if (want_nan) {
          ASSERT_TRUE(std::isnan(o)) << what << " position " << i << " head " << h;
        } else {
          ASSERT_NEAR(o, ref.out.at(r * kDim + e), kTol) << what << " position " << i;
        }
      }
      if (!want_nan) {
        ASSERT_NEAR(got.lse.at(r), ref.lse.at(r), kTol) << what << " position " << i;
      }
    }
  EXPECT_EQ(nan_rows > 0, !(valid_len > 0 && kBadPos >= valid_len)) << what;
}

AttnState run_strategy(const Global& g, Strategy s, const Partition& part, const CpOptions& opts,
                       int ulysses_degree) {
  const int ranks = part.ranks();
  std::vector<Tensor> outs(ranks), lses(ranks);
  ThreadWorld::run(ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    Tensor q = shard(g.q, part, r), k = shard(g.k, part, r), v = shard(g.v, part, r);
    SpComms comms(comm, ulysses_degree);
    AttnState st = testing::cp_call(s, comms, part, q, k, v, opts);
    outs[r] = std::move(st.out);
    lses[r] = std::move(st.lse);
    lses[r].resize({1, part.count(r), kHeads, 1});
  });
  AttnState all;
  all.out = unshard(outs, part);
  all.lse = unshard(lses, part);
  all.lse.resize({1, kSeq, kHeads});
  return all;
}

TEST(NonFiniteParallel, BadKeyPoisonsExactlyTheRowsThatSeeIt) {
  struct Run {
    Strategy strategy;
    SoftmaxMode softmax;
    int ulysses_degree;
  };
  const std::vector<Run> runs = {{Strategy::kRing, SoftmaxMode::kOnline, 0},
                                 {Strategy::kRing, SoftmaxMode::kConstMax, 0},
                                 {Strategy::kAllGather, SoftmaxMode::kOnline, 0},
                                 {Strategy::kUlysses, SoftmaxMode::kOnline, 0},
                                 {Strategy::kUsp, SoftmaxMode::kOnline, 2}};
  for (bool in_value : {false, true})
    for (float bad : {kNaN, kInf, -kInf}) {
      const Global g = make_global(bad, in_value);
      for (bool causal : {false, true})
        for (int64_t valid_len : {int64_t{0}, int64_t{80}, int64_t{kBadPos}}) {
          AttnParams params;
          params.mask.causal = causal;
          std::vector<uint8_t> valid;
          if (valid_len > 0) {
            valid.assign(kSeq, 0);
            for (int64_t j = 0; j < valid_len; ++j) valid[j] = 1;
            params.mask.k_valid = valid;
          }
          const AttnState ref = reference_attention(g.q, g.k, g.v, params);
          for (const Run& run : runs)
            for (int ranks : {2, 4})
              for (Layout layout : {Layout::kContiguous, Layout::kZigzag}) {
                if (run.strategy == Strategy::kUsp && ranks != 4) continue;
                CpOptions opts;
                opts.causal = causal;
                opts.valid_len = valid_len;
                opts.softmax = run.softmax;
                const std::string what =
                    std::string(strategy_name(run.strategy)) + " " +
                    std::string(softmax_mode_name(run.softmax)) + " " + std::to_string(ranks) +
                    " ranks " + std::string(layout_name(layout)) + (causal ? " causal" : "") +
                    " valid_len " + std::to_string(valid_len) + (in_value ? " value " : " key ") +
                    std::to_string(bad);
                const AttnState got = run_strategy(g, run.strategy, Partition(kSeq, ranks, layout),
                                                   opts, run.ulysses_degree);
                expect_state(got, ref, causal, valid_len, what);
              }
        }
    }
}

// A distributed K/V cache with one bad cached key: every new token sees it (causal), so exactly
// the heads of its kv head are NaN on every rank, through passq and passkv.
TEST(NonFiniteParallel, BadCachedKeyThroughPassQAndPassKv) {
  const int64_t cached = 80, fresh = 5, total = cached + fresh;
  for (Strategy kind : {Strategy::kPassQ, Strategy::kPassKv})
    for (float bad : {kNaN, kInf, -kInf})
      for (int ranks : {2, 4}) {
        std::mt19937 rng(9);
        Tensor q_all = random_tensor({1, total, kHeads, kDim}, rng, DType::kF32);
        Tensor k_all = random_tensor({1, total, kKvHeads, kDim}, rng, DType::kF32);
        Tensor v_all = random_tensor({1, total, kKvHeads, kDim}, rng, DType::kF32);
        k_all.data<float>()[(kBadPos * kKvHeads + kBadHead) * kDim + 3] = bad;
        const KvPlacement place = decode_placement(cached, fresh, ranks, Layout::kZigzag);
        auto rows_of = [&](const Tensor& x, std::span<const int64_t> pos) {
          Tensor y({1, static_cast<int64_t>(pos.size()), x.dim(2), x.dim(3)});
          const size_t row = x.dim(2) * x.dim(3) * 4;
          for (size_t i = 0; i < pos.size(); ++i)
            std::memcpy(static_cast<char*>(y.raw()) + i * row,
                        static_cast<const char*>(x.raw()) + pos[i] * row, row);
          return y;
        };
        std::vector<int64_t> new_pos;
        for (int64_t p = cached; p < total; ++p) new_pos.push_back(p);
        AttnParams params;
        params.mask.causal = true;
        params.mask.q_pos = new_pos;
        const AttnState ref = reference_attention(rows_of(q_all, new_pos), k_all, v_all, params);
        CpOptions opts;
        opts.causal = true;
        std::vector<AttnState> got(ranks);
        ThreadWorld::run(ranks, [&](Communicator& comm) {
          const int r = comm.rank();
          Tensor q = rows_of(q_all, place.q_pos[r]);
          Tensor k = rows_of(k_all, place.kv_pos[r]), v = rows_of(v_all, place.kv_pos[r]);
          got[r] = kind == Strategy::kPassQ ? passq_attention(comm, place, q, k, v, opts)
                                            : passkv_attention(comm, place, q, k, v, opts);
        });
        const std::string what = std::string(strategy_name(kind)) + " " + std::to_string(ranks) +
                                 " ranks " + std::to_string(bad);
        int64_t row = 0;
        for (int r = 0; r < ranks; ++r)
          for (size_t i = 0; i < place.q_pos[r].size(); ++i, ++row)
            for (int64_t h = 0; h < kHeads; ++h) {
              const bool want_nan = h / (kHeads / kKvHeads) == kBadHead;
              const float lse = got[r].lse.at(i * kHeads + h);
              ASSERT_EQ(std::isnan(lse), want_nan) << what << " rank " << r << " head " << h;
              ASSERT_EQ(std::isnan(ref.lse.at(row * kHeads + h)), want_nan) << what;
              for (int64_t e = 0; e < kDim; ++e) {
                const float o = got[r].out.at((i * kHeads + h) * kDim + e);
                if (want_nan) {
                  ASSERT_TRUE(std::isnan(o)) << what << " rank " << r << " head " << h;
                } else {
                  ASSERT_NEAR(o, ref.out.at((row * kHeads + h) * kDim + e), kTol) << what;
                }
              }
            }
      }
}

}  // namespace
}  // namespace seqpar
