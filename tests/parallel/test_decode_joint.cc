// Padding, joint text attention, and attention over a distributed K/V cache (passq, passkv)
// against reference_attention; the pass choice rule on the paper's examples; exact bytes.
#include <gtest/gtest.h>

#include <cstring>

#include "parallel/cp_test_util.h"
#include "seqpar/parallel/cp_attention.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/schedule.h"

namespace seqpar {

using seqpar::testing::Problem;
using seqpar::testing::inputs_for;
using seqpar::testing::max_err_lse;
using seqpar::testing::random_tensor;

constexpr double kTol = 1e-4;

// ---- padding ---------------------------------------------------------------------------------

// Runs `strategy` on the problem padded to `padded` tokens with zero rows; returns the state of
// the real tokens.
AttnState run_padded(const Problem& p, Strategy strategy, Layout layout, int ranks, int64_t padded,
                     int ulysses_degree, std::vector<CommStats>* comm_stats = nullptr) {
  const auto& in = inputs_for(p);
  auto pad = [&](const Tensor& x) {
    Tensor y({x.dim(0), padded, x.dim(2), x.dim(3)}, x.dtype());
    const size_t row = x.dim(2) * x.dim(3) * dtype_size(x.dtype());
    for (int64_t b = 0; b < x.dim(0); ++b)
      std::memcpy(static_cast<char*>(y.raw()) + b * padded * row,
                  static_cast<const char*>(x.raw()) + b * x.dim(1) * row, x.dim(1) * row);
    return y;
  };
  Tensor q = pad(in.q), k = pad(in.k), v = pad(in.v);
  Partition part(padded, ranks, layout);
  CpOptions opts;
  opts.causal = p.causal;
  opts.valid_len = p.seq;
  std::vector<Tensor> outs(ranks), lses(ranks);
  if (comm_stats) comm_stats->resize(ranks);
  ThreadWorld::run(ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    SpComms comms(comm, ulysses_degree);
    AttnState s = testing::cp_call(strategy, comms, part, shard(q, part, r), shard(k, part, r),
                                   shard(v, part, r), opts);
    if (comm_stats) (*comm_stats)[r] = comms.stats();
    outs[r] = std::move(s.out);
    lses[r] = std::move(s.lse);
    lses[r].resize({p.batch, part.count(r), p.heads, 1});
  });
  Tensor out = unshard(outs, part), lse = unshard(lses, part);
  // Drop the padded rows.
  AttnState real = AttnState::empty(p.batch, p.seq, p.heads, p.head_dim);
  for (int64_t b = 0; b < p.batch; ++b) {
    std::memcpy(real.out.data<float>() + b * p.seq * p.heads * p.head_dim,
                out.data<float>() + b * padded * p.heads * p.head_dim,
                p.seq * p.heads * p.head_dim * sizeof(float));
    std::memcpy(real.lse.data<float>() + b * p.seq * p.heads,
                lse.data<float>() + b * padded * p.heads, p.seq * p.heads * sizeof(float));
  }
  return real;
}

class PaddedSweep
    : public ::testing::TestWithParam<std::tuple<Strategy, Layout, int, bool, int64_t>> {};

TEST_P(PaddedSweep, RealTokensMatchReference) {
  auto [strategy, layout, ranks, causal, seq] = GetParam();
  Problem p;
  p.seq = seq;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.causal = causal;
  const int64_t m = layout == Layout::kZigzag ? 2 * ranks : ranks;
  const int64_t padded = (seq + m - 1) / m * m;
  AttnState s = run_padded(p, strategy, layout, ranks, padded, strategy == Strategy::kUsp ? 2 : 0);
  EXPECT_LE(max_abs_diff(s.out, inputs_for(p).ref.out), seqpar::testing::bound_for(p).out);
  EXPECT_LE(max_err_lse(s.lse, inputs_for(p).ref.lse), seqpar::testing::bound_for(p).lse);
}

INSTANTIATE_TEST_SUITE_P(
    All, PaddedSweep,
    ::testing::Combine(::testing::Values(Strategy::kAllGather, Strategy::kRing,
                                         Strategy::kUlysses, Strategy::kUsp),
                       ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Values(2, 4), ::testing::Bool(),
                       ::testing::Values(int64_t{37}, int64_t{101})));

TEST(Padding, StrictUlyssesRunsOncePadded) {
  // 3645 tokens (Wan's 240x432x33 latent) on 8 ranks: strict fails, padded to 3648 it runs.
  Partition uneven(3645, 8, Layout::kContiguous);
  CpOptions strict;
  strict.ulysses_mode = UlyssesMode::kStrict;
  EXPECT_THROW(check_strategy_shape(Strategy::kUlysses, uneven, 8, 8, 8, strict), InvalidArgument);
  Partition padded(3648, 8, Layout::kContiguous);
  EXPECT_NO_THROW(check_strategy_shape(Strategy::kUlysses, padded, 8, 8, 8, strict));
}

// ---- joint attention -----------------------------------------------------------------------------

TEST(Joint, ImageAndTextMatchReference) {
  for (Strategy strategy : {Strategy::kAllGather, Strategy::kRing, Strategy::kUlysses,
                            Strategy::kUsp}) {
    for (int ranks : {1, 2, 4}) {
      for (int64_t T : {1, 13}) {
        const int64_t S = 61, H = 4, Hkv = 2, D = 16, B = 2;
        std::mt19937 rng(11);
        Tensor q = random_tensor({B, S + T, H, D}, rng, DType::kF32);
        Tensor k = random_tensor({B, S + T, Hkv, D}, rng, DType::kF32);
        Tensor v = random_tensor({B, S + T, Hkv, D}, rng, DType::kF32);
        AttnState ref = reference_attention(q, k, v);
        // Split the joint sequence: image = tokens [0, S), text = [S, S+T).
        auto slice = [&](const Tensor& x, int64_t from, int64_t len) {
          Tensor y({x.dim(0), len, x.dim(2), x.dim(3)});
          const size_t row = x.dim(2) * x.dim(3) * 4;
          for (int64_t b = 0; b < x.dim(0); ++b)
            std::memcpy(static_cast<char*>(y.raw()) + b * len * row,
                        static_cast<const char*>(x.raw()) + (b * x.dim(1) + from) * row, len * row);
          return y;
        };
        Tensor iq = slice(q, 0, S), ik = slice(k, 0, S), iv = slice(v, 0, S);
        Tensor tq = slice(q, S, T), tk = slice(k, S, T), tv = slice(v, S, T);
        Partition part(S, ranks, Layout::kZigzag);
        std::vector<Tensor> outs(ranks);
        std::vector<Tensor> texts(ranks);
        ThreadWorld::run(ranks, [&](Communicator& comm) {
          const int r = comm.rank();
          SpComms comms(comm, strategy == Strategy::kUsp && ranks >= 2 ? 2 : 0);
          JointState js = joint_attention(strategy, comms, part, shard(iq, part, r),
                                          shard(ik, part, r), shard(iv, part, r), tq, tk, tv, {});
          outs[r] = std::move(js.image.out);
          texts[r] = std::move(js.text.out);
        });
        Tensor image_out = unshard(outs, part);
        Tensor ref_image = slice(ref.out, 0, S), ref_text = slice(ref.out, S, T);
        EXPECT_LE(max_abs_diff(image_out, ref_image), kTol)
            << strategy_name(strategy) << " ranks " << ranks << " T " << T;
        for (int r = 0; r < ranks; ++r)
          EXPECT_LE(max_abs_diff(texts[r], ref_text), kTol) << "text on rank " << r;
      }
    }
  }
}

// The text split by head over the Ulysses group (shape.text_by_heads, through the one entry
// point): each member passes its heads of the text and gets its heads' text state; image and
// text against the reference on the whole joint sequence, uneven head slots (uaa: 3 heads over
// 2 and 4 members, members without heads), GQA, padding, usp; the bytes sent equal the
// schedule's.
TEST(Joint, TextByHeadsMatchesReference) {
  struct Case {
    Strategy strategy;
    int ranks, ulysses;
    int64_t H, Hkv;
    bool pad;
  };
  for (const Case& c :
       {Case{Strategy::kUlysses, 2, 2, 4, 2, false}, Case{Strategy::kUlysses, 2, 2, 3, 3, false},
        Case{Strategy::kUlysses, 4, 4, 3, 3, true}, Case{Strategy::kUlysses, 3, 3, 6, 2, true},
        Case{Strategy::kUsp, 4, 2, 4, 2, false}, Case{Strategy::kUsp, 6, 2, 3, 3, true}}) {
    const int64_t S = 61, T = 13, D = 16, B = 2;
    std::mt19937 rng(17);
    Tensor q = random_tensor({B, S + T, c.H, D}, rng, DType::kF32);
    Tensor k = random_tensor({B, S + T, c.Hkv, D}, rng, DType::kF32);
    Tensor v = random_tensor({B, S + T, c.Hkv, D}, rng, DType::kF32);
    const AttnState ref = reference_attention(q, k, v);
    auto tokens = [&](const Tensor& x, int64_t from, int64_t len, int64_t h0, int64_t h1,
                      int64_t pad_to = 0) {  // tokens [from, from+len) of heads [h0, h1)
      const int64_t H = x.dim(2), rows = std::max(len, pad_to);
      Tensor y({x.dim(0), rows, h1 - h0, D});
      for (int64_t b = 0; b < x.dim(0); ++b)
        for (int64_t t = 0; t < len; ++t)
          std::memcpy(y.data<float>() + ((b * rows + t) * (h1 - h0)) * D,
                      x.data<float>() + ((b * x.dim(1) + from + t) * H + h0) * D,
                      (h1 - h0) * D * sizeof(float));
      return y;
    };
    ParallelConfig config;
    config.strategy = c.strategy;
    config.mesh = {1, 1, c.ranks / c.ulysses, c.ulysses};
    config.layout = Layout::kZigzag;
    config.ulysses_mode = UlyssesMode::kUaa;
    config.pad = c.pad;
    AttnShape shape{B, S, c.H, c.Hkv, D, false, T, 0, 0, DType::kF32};
    shape.text_by_heads = true;
    const Placement place = place_call(config, shape);
    const int64_t padded = place.part.seq();
    const Tensor iq = tokens(q, 0, S, 0, c.H, padded), ik = tokens(k, 0, S, 0, c.Hkv, padded),
                 iv = tokens(v, 0, S, 0, c.Hkv, padded);
    const Schedule schedule = attention_schedule(config, shape);
    std::vector<Tensor> outs(c.ranks), texts(c.ranks);
    std::vector<CommStats> stats(c.ranks);
    ThreadWorld::run(c.ranks, [&](Communicator& comm) {
      const int r = comm.rank();
      SpComms comms(comm, c.ulysses);
      const int u = comms.ulysses().rank();
      const IndexRange qh = ulysses_q_heads(c.H, c.ulysses, u);
      const IndexRange kvh = ulysses_kv_heads(c.H, c.Hkv, c.ulysses, u);
      const Tensor tq = tokens(q, S, T, qh.begin, qh.end), tk = tokens(k, S, T, kvh.begin, kvh.end),
                   tv = tokens(v, S, T, kvh.begin, kvh.end);
      AttnOutputs out;
      attention(config, shape, comms, place,
                {shard(iq, place.part, r), shard(ik, place.part, r), shard(iv, place.part, r), tq, tk,
                 tv},
                out);
      stats[r] = comms.stats();
      outs[r] = std::move(out.out);
      texts[r] = std::move(out.text_out);
    });
    const std::string what = detail::concat(strategy_name(c.strategy), " ranks ", c.ranks, " H ",
                                            c.H, " Hkv ", c.Hkv, c.pad ? " padded" : "");
    const Tensor image = unshard(outs, place.part);
    EXPECT_LE(max_abs_diff(tokens(image, 0, S, 0, c.H), tokens(ref.out, 0, S, 0, c.H)), kTol)
        << what;
    for (int r = 0; r < c.ranks; ++r) {
      const IndexRange qh = ulysses_q_heads(c.H, c.ulysses, r % c.ulysses);
      if (qh.size() > 0) {
        EXPECT_LE(max_abs_diff(texts[r], tokens(ref.out, S, T, qh.begin, qh.end)), kTol)
            << what << ": text on rank " << r;
      }
      const CommPrediction want = schedule_bytes(schedule, r);
      EXPECT_EQ(stats[r].total_sent(), want.sent) << what << ": bytes sent by rank " << r;
    }
  }
}

TEST(Joint, RejectsCausal) {
  Partition part(8, 1, Layout::kContiguous);
  CpOptions opts;
  opts.causal = true;
  EXPECT_THROW(ThreadWorld::run(1,
                                [&](Communicator& comm) {
                                  SpComms comms(comm);
                                  Tensor q({1, 8, 2, 4}), t({1, 2, 2, 4});
                                  joint_attention(Strategy::kRing, comms, part, q, q, q, t, t, t,
                                                  opts);
                                }),
               InvalidArgument);
}

// ---- decode over a distributed K/V cache ------------------------------------------------------

struct DecodeCase {
  int ranks;
  int64_t cached, fresh;
  Layout layout;
  int heads, kv_heads;
};

void check_decode(const DecodeCase& c, Strategy kind, int64_t head_dim = 16) {
  const int64_t total = c.cached + c.fresh, B = 1;
  std::mt19937 rng(7);
  Tensor q_all = random_tensor({B, total, c.heads, head_dim}, rng, DType::kF32);
  Tensor k_all = random_tensor({B, total, c.kv_heads, head_dim}, rng, DType::kF32);
  Tensor v_all = random_tensor({B, total, c.kv_heads, head_dim}, rng, DType::kF32);
  KvPlacement place = decode_placement(c.cached, c.fresh, c.ranks, c.layout);
  // Reference: the new queries over all keys, causal.
  std::vector<int64_t> new_pos;
  for (int64_t p = c.cached; p < total; ++p) new_pos.push_back(p);
  auto rows_of = [&](const Tensor& x, std::span<const int64_t> pos) {
    Tensor y({B, static_cast<int64_t>(pos.size()), x.dim(2), x.dim(3)});
    const size_t row = x.dim(2) * x.dim(3) * 4;
    for (size_t i = 0; i < pos.size(); ++i)
      std::memcpy(static_cast<char*>(y.raw()) + i * row,
                  static_cast<const char*>(x.raw()) + pos[i] * row, row);
    return y;
  };
  AttnParams params;
  params.mask.causal = true;
  params.mask.q_pos = new_pos;
  AttnState ref = reference_attention(rows_of(q_all, new_pos), k_all, v_all, params);

  CpOptions opts;
  opts.causal = true;
  std::vector<AttnState> got(c.ranks);
  std::vector<CommStats> stats(c.ranks);
  std::vector<CpStats> cp(c.ranks);
  ThreadWorld::run(c.ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    Tensor q = rows_of(q_all, place.q_pos[r]);
    Tensor k = rows_of(k_all, place.kv_pos[r]), v = rows_of(v_all, place.kv_pos[r]);
    got[r] = kind == Strategy::kPassQ ? passq_attention(comm, place, q, k, v, opts, &cp[r])
                                      : passkv_attention(comm, place, q, k, v, opts, &cp[r]);
    stats[r] = comm.stats();
  });
  // New tokens are placed in rank order, so concatenating the ranks' rows gives new_pos order.
  int64_t row = 0;
  for (int r = 0; r < c.ranks; ++r) {
    const int64_t n = static_cast<int64_t>(place.q_pos[r].size());
    for (int64_t i = 0; i < n; ++i, ++row) {
      for (int64_t x = 0; x < c.heads * head_dim; ++x)
        ASSERT_NEAR(got[r].out.at(i * c.heads * head_dim + x),
                    ref.out.at(row * c.heads * head_dim + x), kTol)
            << strategy_name(kind) << " rank " << r << " row " << i;
      for (int64_t h = 0; h < c.heads; ++h)
        ASSERT_NEAR(got[r].lse.at(i * c.heads + h), ref.lse.at(row * c.heads + h), kTol);
    }
    CommPrediction want = predict_decode_bytes(kind, place, r, B, c.heads, c.kv_heads, head_dim, 4);
    EXPECT_EQ(stats[r].total_sent(), want.sent) << strategy_name(kind) << " rank " << r;
    EXPECT_EQ(stats[r].total_recv(), want.recv) << strategy_name(kind) << " rank " << r;
    // The schedule: bytes, work and peak K/V of every rank.
    ParallelConfig config;
    config.strategy = kind;
    config.mesh.ring = c.ranks;
    config.layout = c.layout;
    const AttnShape shape{.batch = B,
                          .seq = total,
                          .heads = c.heads,
                          .kv_heads = c.kv_heads,
                          .head_dim = head_dim,
                          .causal = true,
                          .cached = c.cached,
                          .fresh = c.fresh};
    const Schedule s = attention_schedule(config, shape);
    EXPECT_EQ(schedule_bytes(s, r).sent, want.sent) << strategy_name(kind) << " rank " << r;
    EXPECT_EQ(schedule_bytes(s, r).recv, want.recv) << strategy_name(kind) << " rank " << r;
    EXPECT_EQ(schedule_work(s, r), cp[r].work) << strategy_name(kind) << " rank " << r;
    EXPECT_EQ(s.ranks[r].peak_kv_bytes, cp[r].peak_kv_bytes)
        << strategy_name(kind) << " rank " << r;
  }
}

TEST(Decode, PassQAndPassKvMatchReference) {
  for (Strategy kind : {Strategy::kPassQ, Strategy::kPassKv})
    for (DecodeCase c : std::vector<DecodeCase>{{1, 50, 3, Layout::kContiguous, 4, 4},
                                                {2, 100, 1, Layout::kContiguous, 4, 2},
                                                {3, 257, 5, Layout::kZigzag, 6, 3},
                                                {4, 1000, 64, Layout::kStriped, 8, 2},
                                                {4, 999, 2, Layout::kContiguous, 4, 1},
                                                {8, 513, 17, Layout::kZigzag, 8, 8}})
      check_decode(c, kind);
}

TEST(Decode, LongCacheFewNewTokens) {
  // Decode of 1..64 new tokens over caches up to 64K tokens.
  for (int64_t fresh : {1, 64})
    check_decode({4, 65536, fresh, Layout::kContiguous, 2, 1}, Strategy::kPassQ, 8);
  check_decode({2, 16384, 16, Layout::kZigzag, 2, 2}, Strategy::kPassKv, 8);
}

TEST(Decode, ChooserReproducesThePapersExamples) {
  // Llama3 405B (128 heads, 8 KV heads, bf16) on 4 ranks of H100s (989 TFLOP/s of attention)
  // with 50 GB/s per rank between nodes (profiles/h100.json), 128K tokens in all.
  const double flops = 989e12, bw = 50e9;
  PassChoice a = choose_pass(3200, 124800, 4, 128, 8, 2, flops, bw);
  EXPECT_EQ(a.kind, Strategy::kPassQ) << a.reason;
  PassChoice b = choose_pass(12800, 115200, 4, 128, 8, 2, flops, bw);
  EXPECT_EQ(b.kind, Strategy::kPassKv) << b.reason;
  // A full prefill (no cache) always passes K/V: T/(T+P) = 1 >= 2·Hkv/H.
  EXPECT_EQ(choose_pass(10, 0, 4, 128, 8, 2, 1e15, 1e9).kind, Strategy::kPassKv);
}

TEST(Decode, PlacementPutsNewestTokensLast) {
  KvPlacement p = decode_placement(100, 2, 4, Layout::kContiguous);
  EXPECT_TRUE(p.q_pos[0].empty());
  EXPECT_TRUE(p.q_pos[1].empty());
  EXPECT_EQ(p.q_pos[2], std::vector<int64_t>{100});
  EXPECT_EQ(p.q_pos[3], std::vector<int64_t>{101});
  EXPECT_THROW(decode_placement(3, 1, 4, Layout::kContiguous), InvalidArgument);
}

}  // namespace seqpar
