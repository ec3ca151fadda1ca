// Properties of attention states and their merge: splitting the keys anywhere and merging equals
// attention over all keys; the empty state is the identity; merging is commutative and
// associative; empty and fully masked rows stay (0, -inf) without NaN; huge logits stay finite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/attention/state.h"

namespace seqpar {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t(std::move(shape), DType::kF32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// A random non-empty state (as if from attention over some keys).
AttnState random_state(int64_t b, int64_t s, int64_t h, int64_t d, uint64_t seed,
                       float lse_lo = -5.f, float lse_hi = 5.f) {
  AttnState st{random_tensor({b, s, h, d}, seed),
               random_tensor({b, s, h}, seed + 1, lse_lo, lse_hi)};
  return st;
}

bool any_nan(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (std::isnan(t.at(i))) return true;
  }
  return false;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Keys [from, to) of k/v as their own tensors, with their global positions.
struct KeySlice {
  Tensor k, v;
  std::vector<int64_t> pos;
};
KeySlice slice_keys(const Tensor& k, const Tensor& v, const std::vector<int64_t>& idx) {
  const int64_t b = k.dim(0), sk = k.dim(1), h = k.dim(2), d = k.dim(3);
  const int64_t n = static_cast<int64_t>(idx.size());
  KeySlice s{Tensor({b, n, h, d}), Tensor({b, n, h, d}), {}};
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t e = 0; e < h * d; ++e) {
        s.k.data<float>()[(bi * n + j) * h * d + e] =
            k.data<float>()[(bi * sk + idx[j]) * h * d + e];
        s.v.data<float>()[(bi * n + j) * h * d + e] =
            v.data<float>()[(bi * sk + idx[j]) * h * d + e];
      }
    }
  }
  s.pos = idx;
  return s;
}

TEST(AttnState, EmptyIsZeroAndMinusInf) {
  AttnState e = AttnState::empty(2, 3, 4, 5);
  EXPECT_EQ(e.out.shape(), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(e.lse.shape(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(e.batch(), 2);
  EXPECT_EQ(e.seq(), 3);
  EXPECT_EQ(e.heads(), 4);
  EXPECT_EQ(e.head_dim(), 5);
  for (int64_t i = 0; i < e.out.numel(); ++i) EXPECT_EQ(e.out.at(i), 0.f);
  for (int64_t i = 0; i < e.lse.numel(); ++i) EXPECT_EQ(e.lse.at(i), -kInf);
}

TEST(AttnState, EmptyIsIdentityOnBothSides) {
  const AttnState a = random_state(2, 5, 3, 16, 7);
  const AttnState e = AttnState::empty(2, 5, 3, 16);
  const AttnState left = merge_states(e, a);
  const AttnState right = merge_states(a, e);
  EXPECT_TRUE(bitwise_equal(left.out, a.out));
  EXPECT_TRUE(bitwise_equal(left.lse, a.lse));
  EXPECT_TRUE(bitwise_equal(right.out, a.out));
  EXPECT_TRUE(bitwise_equal(right.lse, a.lse));
}

TEST(AttnState, TwoEmptiesGiveEmptyWithoutNaN) {
  const AttnState e = AttnState::empty(1, 4, 2, 8);
  const AttnState m = merge_states(e, e);
  EXPECT_FALSE(any_nan(m.out));
  EXPECT_FALSE(any_nan(m.lse));
  for (int64_t i = 0; i < m.out.numel(); ++i) EXPECT_EQ(m.out.at(i), 0.f);
  for (int64_t i = 0; i < m.lse.numel(); ++i) EXPECT_EQ(m.lse.at(i), -kInf);
}

TEST(AttnState, MergeIsCommutative) {
  const AttnState a = random_state(2, 9, 3, 32, 11), b = random_state(2, 9, 3, 32, 13);
  const AttnState ab = merge_states(a, b), ba = merge_states(b, a);
  EXPECT_TRUE(bitwise_equal(ab.out, ba.out));
  EXPECT_TRUE(bitwise_equal(ab.lse, ba.lse));
}

TEST(AttnState, MergeIsAssociative) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const AttnState a = random_state(1, 17, 4, 24, seed * 10);
    const AttnState b = random_state(1, 17, 4, 24, seed * 10 + 3, -20.f, 20.f);
    const AttnState c = random_state(1, 17, 4, 24, seed * 10 + 6);
    const AttnState left = merge_states(merge_states(a, b), c);
    const AttnState right = merge_states(a, merge_states(b, c));
    EXPECT_LE(max_abs_diff(left.out, right.out), 1e-6);
    EXPECT_LE(max_abs_diff(left.lse, right.lse), 1e-5);
  }
}

TEST(AttnState, MergeMatchesClosedForm) {
  // out = (e^la·oa + e^lb·ob) / (e^la + e^lb), lse = log(e^la + e^lb), in double.
  const AttnState a = random_state(1, 6, 2, 8, 21), b = random_state(1, 6, 2, 8, 22);
  const AttnState m = merge_states(a, b);
  for (int64_t r = 0; r < a.lse.numel(); ++r) {
    const double la = a.lse.at(r), lb = b.lse.at(r);
    const double mx = std::max(la, lb);
    const double wa = std::exp(la - mx), wb = std::exp(lb - mx);
    EXPECT_NEAR(m.lse.at(r), mx + std::log(wa + wb), 1e-5);
    for (int64_t e = 0; e < 8; ++e) {
      const double want = (wa * a.out.at(r * 8 + e) + wb * b.out.at(r * 8 + e)) / (wa + wb);
      EXPECT_NEAR(m.out.at(r * 8 + e), want, 1e-6);
    }
  }
}

TEST(AttnState, HugeLogitsStayFinite) {
  AttnState a = random_state(1, 4, 1, 8, 31), b = random_state(1, 4, 1, 8, 32);
  const float la[4] = {1e4f, -1e4f, 1e4f, 3e4f};
  const float lb[4] = {1e4f + 5.f, 1e4f, -kInf, 3e4f};
  for (int r = 0; r < 4; ++r) {
    a.lse.data<float>()[r] = la[r];
    b.lse.data<float>()[r] = lb[r];
  }
  const AttnState m = merge_states(a, b);
  EXPECT_FALSE(any_nan(m.out));
  EXPECT_FALSE(any_nan(m.lse));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(std::isfinite(m.lse.at(r))) << r;
  EXPECT_NEAR(m.lse.at(0), 1e4 + 5 + std::log1p(std::exp(-5.0)), 1e-2);
  EXPECT_NEAR(m.lse.at(1), 1e4, 1e-2);  // the -1e4 side weighs e^-2e4 = 0
  for (int e = 0; e < 8; ++e) EXPECT_FLOAT_EQ(m.out.at(8 + e), b.out.at(8 + e));
  EXPECT_EQ(m.lse.at(2), 1e4f);  // merged with an empty row: unchanged
  EXPECT_NEAR(m.lse.at(3), 3e4 + std::log(2.0), 1e-2);
}

TEST(AttnState, ShapeMismatchThrows) {
  AttnState a = AttnState::empty(1, 4, 2, 8);
  const AttnState b = AttnState::empty(1, 4, 2, 16);
  EXPECT_THROW(merge_into(a, b), InvalidArgument);
  const AttnState c = AttnState::empty(1, 5, 2, 8);
  EXPECT_THROW(merge_states(a, c), InvalidArgument);
}

// Splitting the keys into arbitrary (even interleaved) sets, running attention on each and
// merging must give attention over all keys: the contract ring and pass-Q rely on.
class SplitKeys : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(SplitKeys, MergeOfPartsEqualsWhole) {
  const auto [causal, parts] = GetParam();
  const int64_t b = 2, s = 150, h = 4, hkv = 2, d = 32;
  const Tensor q = random_tensor({b, s, h, d}, 100), k = random_tensor({b, s, hkv, d}, 101),
               v = random_tensor({b, s, hkv, d}, 102);
  AttnParams whole_p;
  whole_p.mask.causal = causal;
  const AttnState whole = reference_attention(q, k, v, whole_p);

  // Assign every key to a random part (so parts are unsorted, uneven, and some rows of some
  // parts are fully masked under causal).
  std::mt19937 rng(7 + parts);
  std::vector<std::vector<int64_t>> idx(parts);
  for (int64_t j = 0; j < s; ++j) idx[rng() % parts].push_back(j);
  if (parts >= 3) {  // uneven, and one part empty
    idx[0].insert(idx[0].begin(), idx[parts - 1].begin(), idx[parts - 1].end());
    idx[parts - 1].clear();
  }

  for (bool use_kernel : {false, true}) {
    AttnState acc = AttnState::empty(b, s, h, d);
    for (int p = 0; p < parts; ++p) {
      const KeySlice ks = slice_keys(k, v, idx[p]);
      AttnParams pp;
      pp.mask.causal = causal;
      pp.mask.k_pos = ks.pos;
      pp.block_k = 32;
      pp.block_q = 64;
      const AttnState part =
          use_kernel ? flash_attention(q, ks.k, ks.v, pp) : reference_attention(q, ks.k, ks.v, pp);
      merge_into(acc, part);
    }
    EXPECT_LE(max_abs_diff(acc.out, whole.out), use_kernel ? 1e-4 : 1e-5) << use_kernel;
    EXPECT_LE(max_abs_diff(acc.lse, whole.lse), use_kernel ? 1e-4 : 1e-5) << use_kernel;
    EXPECT_FALSE(any_nan(acc.out));
  }
}

INSTANTIATE_TEST_SUITE_P(Parts, SplitKeys,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(2, 3, 7)));

TEST(AttnState, FullyMaskedRowsAreEmptyAndMergeAsIdentity) {
  // Queries at positions 0..9, keys at 5..14, causal: rows 0..4 see no key.
  const Tensor q = random_tensor({1, 10, 2, 16}, 41), k = random_tensor({1, 10, 2, 16}, 42),
               v = random_tensor({1, 10, 2, 16}, 43);
  std::vector<int64_t> kpos(10);
  std::iota(kpos.begin(), kpos.end(), 5);
  AttnParams p;
  p.mask.causal = true;
  p.mask.k_pos = kpos;
  for (bool use_kernel : {false, true}) {
    const AttnState st = use_kernel ? flash_attention(q, k, v, p) : reference_attention(q, k, v, p);
    EXPECT_FALSE(any_nan(st.out));
    EXPECT_FALSE(any_nan(st.lse));
    for (int64_t i = 0; i < 10; ++i) {
      for (int64_t hh = 0; hh < 2; ++hh) {
        const float lse = st.lse.at(i * 2 + hh);
        if (i < 5) {
          EXPECT_EQ(lse, -kInf) << i;
          for (int e = 0; e < 16; ++e) EXPECT_EQ(st.out.at((i * 2 + hh) * 16 + e), 0.f);
        } else {
          EXPECT_TRUE(std::isfinite(lse)) << i;
        }
      }
    }
    const AttnState other = random_state(1, 10, 2, 16, 44);
    const AttnState m = merge_states(other, st);
    for (int64_t r = 0; r < 10; ++r) {  // masked rows (0..4 -> flat rows 0..9) keep `other`
      EXPECT_EQ(m.lse.at(r), other.lse.at(r));
    }
  }
}

}  // namespace
}  // namespace seqpar
