// Non-finite inputs (docs/kernel.md "Numerics: non-finite inputs"): an Inf or NaN in a query row,
// or in a key or value row that a query row sees, makes exactly the rows that see it NaN (out and
// lse), in the kernel (every ISA path on this CPU, fp32/bf16/fp16, decode shapes, key splits, fixed
// row maximum) and in the reference alike. Masked keys (causal, padding, another segment) stay
// invisible whatever they hold; a row that sees no key stays empty. Merging keeps NaN.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "seqpar/attention/attention.h"
#include "simd.h"

namespace seqpar {
namespace {

namespace simd = attn_simd;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Where { kQuery, kKey, kValue };
enum class Mask { kNone, kCausal, kPadding, kShuffledCausal };

std::string where_name(Where w) {
  return w == Where::kQuery ? "query" : w == Where::kKey ? "key" : "value";
}
std::string mask_name(Mask m) {
  switch (m) {
    case Mask::kNone:
      return "none";
    case Mask::kCausal:
      return "causal";
    case Mask::kPadding:
      return "padding";
    default:
      return "shuffled_causal";
  }
}
std::string value_name(float x) { return std::isnan(x) ? "nan" : x > 0 ? "inf" : "neg_inf"; }

struct Shape {
  int64_t b = 2, sq = 160, sk = 160, h = 4, hkv = 2, d = 40;
  int bq = 64, bk = 48;
};

// Inputs with one non-finite element, the mask (owning its spans) and which rows see it.
struct Problem {
  Shape s;
  Tensor q, k, v;
  std::vector<int64_t> q_pos, k_pos;
  std::vector<uint8_t> k_valid;
  AttnParams params;
  std::vector<uint8_t> want_nan;  // (B, Sq, H)
};

Tensor random_f32(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t(std::move(shape));
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// The bad element sits in the last batch, token `tok` (a query for kQuery, else a key), head `head`
// (a query head for kQuery, else a kv head), element 5 of its row.
Problem make_problem(const Shape& s, DType dtype, Where where, Mask mask, float bad, int64_t tok,
                     int64_t head) {
  Problem p;
  p.s = s;
  std::mt19937 rng(11);
  Tensor q = random_f32({s.b, s.sq, s.h, s.d}, rng);
  Tensor k = random_f32({s.b, s.sk, s.hkv, s.d}, rng);
  Tensor v = random_f32({s.b, s.sk, s.hkv, s.d}, rng);
  const int64_t bb = s.b - 1;
  Tensor& t = where == Where::kQuery ? q : where == Where::kKey ? k : v;
  const int64_t heads = where == Where::kQuery ? s.h : s.hkv;
  const int64_t seq = where == Where::kQuery ? s.sq : s.sk;
  t.data<float>()[((bb * seq + tok) * heads + head) * s.d + 5] = bad;
  p.q = q.to(dtype);
  p.k = k.to(dtype);
  p.v = v.to(dtype);
  // The conversions keep the value non-finite (and its kind).
  const Tensor& conv = where == Where::kQuery ? p.q : where == Where::kKey ? p.k : p.v;
  const float got = conv.at(((bb * seq + tok) * heads + head) * s.d + 5);
  EXPECT_TRUE(std::isnan(bad) ? std::isnan(got) : got == bad);

  // Queries are the last Sq positions of the Sk keys (decode shapes: the newest tokens).
  p.q_pos.resize(s.sq);
  p.k_pos.resize(s.sk);
  std::iota(p.k_pos.begin(), p.k_pos.end(), 0);
  std::iota(p.q_pos.begin(), p.q_pos.end(), s.sk - s.sq);
  if (mask == Mask::kShuffledCausal) {  // unsorted positions: the per-element (general) mask
    std::mt19937 prng(5);
    std::shuffle(p.k_pos.begin(), p.k_pos.end(), prng);
    if (s.sq == s.sk) p.q_pos = p.k_pos;
  }
  p.params.mask.q_pos = p.q_pos;
  p.params.mask.k_pos = p.k_pos;
  p.params.mask.causal = mask == Mask::kCausal || mask == Mask::kShuffledCausal;
  if (mask == Mask::kPadding) {  // every 7th key of each batch, and the bad key row, are padding
    p.k_valid.assign(s.b * s.sk, 1);
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t j = 0; j < s.sk; j += 7) p.k_valid[b * s.sk + j] = 0;
    if (where != Where::kQuery) p.k_valid[bb * s.sk + tok] = 0;
    p.params.mask.k_valid = p.k_valid;
  }
  p.params.block_q = s.bq;
  p.params.block_k = s.bk;

  // Which rows see the bad element, from the definition.
  auto visible = [&](int64_t b, int64_t i, int64_t j) {
    if (p.params.mask.causal && p.k_pos[j] > p.q_pos[i]) return false;
    return p.k_valid.empty() || p.k_valid[b * s.sk + j] != 0;
  };
  p.want_nan.assign(s.b * s.sq * s.h, 0);
  for (int64_t i = 0; i < s.sq; ++i)
    for (int64_t h = 0; h < s.h; ++h) {
      bool nan = false;
      if (where == Where::kQuery) {
        if (i == tok && h == head)
          for (int64_t j = 0; j < s.sk; ++j) nan = nan || visible(bb, i, j);
      } else {
        nan = h / (s.h / s.hkv) == head && visible(bb, i, tok);
      }
      p.want_nan[(bb * s.sq + i) * s.h + h] = nan;
    }
  return p;
}

double tolerance(DType t) { return t == DType::kF32 ? 1e-4 : t == DType::kBF16 ? 1e-2 : 1e-3; }

// Rows in want_nan are NaN in out (every element) and lse; the others are finite (or empty) and
// match `ref` within the dtype's tolerance. Counts the NaN rows into *nan_rows if given.
void expect_rows(const Problem& p, const AttnState& got, const AttnState& ref, DType dtype,
                 const std::string& what, int64_t* nan_rows = nullptr) {
  const int64_t d = p.s.d;
  if (nan_rows != nullptr) *nan_rows = 0;
  for (int64_t r = 0; r < static_cast<int64_t>(p.want_nan.size()); ++r) {
    const float lse = got.lse.at(r);
    if (p.want_nan[r]) {
      if (nan_rows != nullptr) ++*nan_rows;
      EXPECT_TRUE(std::isnan(lse)) << what << " row " << r << ": lse " << lse << ", want NaN";
      for (int64_t e = 0; e < d; ++e)
        ASSERT_TRUE(std::isnan(got.out.at(r * d + e))) << what << " row " << r << " element " << e;
      continue;
    }
    ASSERT_FALSE(std::isnan(lse) || lse == kInf) << what << " row " << r << ": lse " << lse;
    const float want_lse = ref.lse.at(r);
    if (want_lse == -kInf) {
      EXPECT_EQ(lse, -kInf) << what << " row " << r;
    } else {
      EXPECT_NEAR(lse, want_lse, tolerance(dtype)) << what << " row " << r;
    }
    for (int64_t e = 0; e < d; ++e)
      ASSERT_NEAR(got.out.at(r * d + e), ref.out.at(r * d + e), tolerance(dtype))
          << what << " row " << r << " element " << e;
  }
}

std::vector<simd::Isa> cpu_isas() {
  std::vector<simd::Isa> v;
  for (simd::Isa isa : {simd::Isa::kScalar, simd::Isa::kAvx2, simd::Isa::kAvx512})
    if (simd::cpu_has(isa)) v.push_back(isa);
  return v;
}

struct IsaGuard {
  ~IsaGuard() { simd::force_softmax_isa(std::nullopt); }
};

// The reference, then the kernel on every ISA path: both give NaN on exactly want_nan.
void check(const Problem& p, DType dtype, const std::string& what, bool expect_some_nan) {
  IsaGuard guard;
  const AttnState ref = reference_attention(p.q, p.k, p.v, p.params);
  int64_t n = 0;
  expect_rows(p, ref, ref, dtype, what + " reference", &n);
  EXPECT_EQ(n > 0, expect_some_nan) << what;
  for (simd::Isa isa : cpu_isas()) {
    simd::force_softmax_isa(isa);
    const AttnState got = flash_attention(p.q, p.k, p.v, p.params);
    expect_rows(p, got, ref, dtype, what + " kernel " + std::string(simd::isa_name(isa)));
  }
}

using SweepParam = std::tuple<DType, Where, Mask>;

class NonFiniteSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(NonFiniteSweep, KernelAndReferencePoisonExactlyTheRowsThatSeeIt) {
  const auto [dtype, where, mask] = GetParam();
  const Shape s;
  for (float bad : {kNaN, kInf, -kInf}) {
    // Token 100: in the middle (causal rows after it see it); head 1.
    const Problem p = make_problem(s, dtype, where, mask, bad, 100, 1);
    const bool padded_key = mask == Mask::kPadding && where != Where::kQuery;
    check(p, dtype, value_name(bad), !padded_key);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, NonFiniteSweep,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(Where::kQuery, Where::kKey, Where::kValue),
                       ::testing::Values(Mask::kNone, Mask::kCausal, Mask::kPadding,
                                         Mask::kShuffledCausal)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      return std::string(dtype_name(std::get<0>(info.param))) + "_" +
             where_name(std::get<1>(info.param)) + "_" + mask_name(std::get<2>(info.param));
    });

// Decode shapes (few query rows: every kv head per item, stacked heads; the few-row FMA loops, or
// oneDNN with SEQPAR_KERNEL_SMALL_MM=0), with the keys split across threads and the partial states
// merged: 12 rows per kv head (bf16 and fp16 K/V converted) and 4 (read in place).
TEST(NonFinite, DecodeShapesWithKeySplits) {
  const int saved = omp_get_max_threads();
  Shape s;
  s.sk = 300;
  s.h = 8;
  s.hkv = 2;
  s.bq = 0;
  s.bk = 56;
  for (int64_t sq : {3, 1})
    for (int threads : {1, 4})
      for (const char* small_mm : {"1", "0"}) {
        omp_set_num_threads(threads);
        setenv("SEQPAR_KERNEL_SMALL_MM", small_mm, 1);
        for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
          for (Where where : {Where::kQuery, Where::kKey, Where::kValue})
            for (Mask mask : {Mask::kNone, Mask::kCausal, Mask::kPadding})
              for (float bad : {kNaN, kInf, -kInf}) {
                // A query: the last new token; a key: one in the cache, which every new token sees.
                s.sq = sq;
                const int64_t tok = where == Where::kQuery ? sq - 1 : 150;
                const Problem p = make_problem(s, dtype, where, mask, bad, tok, 1);
                const bool padded_key = mask == Mask::kPadding && where != Where::kQuery;
                check(p, dtype,
                      std::to_string(sq) + " new, " + std::to_string(threads) +
                          " threads, small_mm " + small_mm + " " + std::string(dtype_name(dtype)) +
                          " " + where_name(where) + " " + mask_name(mask) + " " + value_name(bad),
                      !padded_key);
              }
      }
  unsetenv("SEQPAR_KERNEL_SMALL_MM");
  omp_set_num_threads(saved);
}

// A causal key after every query of a block is never read, nor a key of another segment.
TEST(NonFinite, KeysOfSkippedBlocksAndOtherSegmentsAreInvisible) {
  Shape s;
  s.b = 1;
  Problem p = make_problem(s, DType::kF32, Where::kKey, Mask::kCausal, kNaN, 150, 0);
  const AttnState ref = reference_attention(p.q, p.k, p.v, p.params);
  const AttnState got = flash_attention(p.q, p.k, p.v, p.params);
  p.want_nan.assign(p.want_nan.size(), 0);
  for (int64_t i = 150; i < s.sq; ++i)
    for (int64_t h = 0; h < 2; ++h) p.want_nan[i * s.h + h] = 1;
  expect_rows(p, ref, ref, DType::kF32, "causal reference");
  expect_rows(p, got, ref, DType::kF32, "causal kernel");

  // Two packed sequences [0, 80) and [80, 160): a NaN value in the second is invisible to the
  // first.
  Problem seg = make_problem(s, DType::kF32, Where::kValue, Mask::kNone, kNaN, 100, 0);
  std::vector<int32_t> ids(s.sq);
  for (int64_t i = 0; i < s.sq; ++i) ids[i] = i < 80 ? 0 : 1;
  seg.params.mask.q_segment = ids;
  seg.params.mask.k_segment = ids;
  seg.want_nan.assign(seg.want_nan.size(), 0);
  for (int64_t i = 80; i < s.sq; ++i)
    for (int64_t h = 0; h < 2; ++h) seg.want_nan[i * s.h + h] = 1;
  const AttnState sref = reference_attention(seg.q, seg.k, seg.v, seg.params);
  expect_rows(seg, sref, sref, DType::kF32, "segments reference");
  expect_rows(seg, flash_attention(seg.q, seg.k, seg.v, seg.params), sref, DType::kF32,
              "segments kernel");
}

// A non-finite query row that sees no key (its only keys are padding) stays empty: out 0, lse -inf.
TEST(NonFinite, QueryRowThatSeesNoKeyStaysEmpty) {
  Shape s;
  s.b = 1;
  Problem p = make_problem(s, DType::kF32, Where::kQuery, Mask::kCausal, kNaN, 0, 2);
  p.k_valid.assign(s.sk, 1);
  p.k_valid[0] = 0;  // query 0 (causal) sees only key 0
  p.params.mask.k_valid = p.k_valid;
  p.want_nan.assign(p.want_nan.size(), 0);
  for (const AttnState& st :
       {reference_attention(p.q, p.k, p.v, p.params), flash_attention(p.q, p.k, p.v, p.params)}) {
    EXPECT_EQ(st.lse.at(2), -kInf);
    for (int64_t e = 0; e < s.d; ++e) EXPECT_EQ(st.out.at(2 * s.d + e), 0.f);
    for (int64_t r = s.h; r < st.lse.numel(); ++r) {
      EXPECT_TRUE(std::isfinite(st.lse.at(r))) << r;  // rows of query 0 see no key: empty
    }
  }
}

// Fixed row maximum: a poisoned row is NaN, its row_sum NaN, and it is flagged kRowMaxExceeded
// (its sums are not relative to the bound), so accumulators merge it instead of adding it.
TEST(NonFinite, FixedRowMaxRows) {
  for (Where where : {Where::kQuery, Where::kKey, Where::kValue}) {
    Shape s;
    const Problem p = make_problem(s, DType::kF32, where, Mask::kCausal, kNaN, 100, 1);
    std::vector<float> row_max(p.want_nan.size(), 12.f), row_sum(p.want_nan.size());
    std::vector<uint8_t> flags(p.want_nan.size());
    AttnParams params = p.params;
    params.row_max = row_max;
    params.row_sum = row_sum;
    params.row_flags = flags;
    const AttnState ref = reference_attention(p.q, p.k, p.v, p.params);
    const AttnState got = flash_attention(p.q, p.k, p.v, params);
    int64_t n = 0;
    expect_rows(p, got, ref, DType::kF32, "fixed max " + where_name(where), &n);
    EXPECT_GT(n, 0);
    for (size_t r = 0; r < p.want_nan.size(); ++r) {
      EXPECT_EQ(std::isnan(row_sum[r]), p.want_nan[r] != 0) << r;
      if (p.want_nan[r]) {
        EXPECT_TRUE(flags[r] & AttnParams::kRowMaxExceeded) << r;
      }
    }
  }
}

// Logits of finite inputs that overflow fp32 to +inf give NaN (2^(inf - inf)), not an empty row.
TEST(NonFinite, KernelLogitOverflowGivesNaNNotEmpty) {
  Tensor q({1, 1, 1, 16}), k({1, 4, 1, 16}), v({1, 4, 1, 16});
  q.fill(3e19f);
  k.fill(0.5f);
  v.fill(1.f);
  for (int64_t e = 0; e < 16; ++e) k.data<float>()[2 * 16 + e] = 3e19f;
  const AttnState got = flash_attention(q, k, v);
  EXPECT_TRUE(std::isnan(got.lse.at(0))) << got.lse.at(0);
  EXPECT_TRUE(std::isnan(got.out.at(0)));
}

// merge: NaN is not the empty state; it wins against empty, finite and NaN states in either
// order; two empty states stay empty.
TEST(NonFinite, MergeKeepsNaN) {
  const int64_t d = 3;
  auto state = [&](float lse, float o) {
    AttnState s = AttnState::empty(1, 1, 1, d);
    s.lse.data<float>()[0] = lse;
    s.out.fill(o);
    return s;
  };
  const AttnState empty = AttnState::empty(1, 1, 1, d);
  const AttnState nan_lse = state(kNaN, kNaN), nan_out = state(0.5f, kNaN);
  const AttnState finite = state(1.f, 2.f), far = state(-200.f, 1.f);
  for (const AttnState* bad : {&nan_lse, &nan_out}) {
    for (const AttnState* other : {&empty, &finite, &far, &nan_lse}) {
      for (const AttnState& m : {merge_states(*bad, *other), merge_states(*other, *bad)}) {
        for (int64_t e = 0; e < d; ++e) EXPECT_TRUE(std::isnan(m.out.at(e)));
      }
    }
  }
  // NaN lse stays NaN (merging with empty leaves it as it is).
  EXPECT_TRUE(std::isnan(merge_states(nan_lse, empty).lse.at(0)));
  EXPECT_TRUE(std::isnan(merge_states(empty, nan_lse).lse.at(0)));
  EXPECT_TRUE(std::isnan(merge_states(nan_lse, finite).lse.at(0)));
  EXPECT_TRUE(std::isnan(merge_states(finite, nan_lse).lse.at(0)));
  const AttnState ee = merge_states(empty, empty);
  EXPECT_EQ(ee.lse.at(0), -kInf);
  EXPECT_EQ(ee.out.at(0), 0.f);
}

}  // namespace
}  // namespace seqpar
