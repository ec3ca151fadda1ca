// The flash-attention kernel against the naive reference over a wide sweep of shapes, masks,
// layouts, dtypes, block sizes, instruction sets and thread counts; the vector routines against
// scalar math; visible_score_elements against brute force; argument checks.
//
// Tolerances (max abs error vs reference_attention on the same, possibly bf16-rounded, inputs):
// the kernel path's error bound (seqpar/attention/error_bound.h, docs/kernel.md "Error bounds")
// for the case's keys, head dim, largest |v| and logit scale (q_scale, growing keys).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/attention/error_bound.h"
#include "simd.h"

namespace seqpar {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
namespace simd = attn_simd;

// ---- inputs ----------------------------------------------------------------------------------

enum class Layout { kContiguous, kStriped, kZigzag, kShuffled };

struct Case {
  std::string name;
  int64_t b = 1, sq = 64, sk = -1, h = 4, hkv = 4, d = 64;  // sk -1: = sq
  bool causal = false;
  Layout layout = Layout::kContiguous;
  bool padding = false;
  bool segments = false;
  DType dtype = DType::kF32;
  int bq = 0, bk = 0;
  float q_scale = 1.f;        // multiplies q: large logits
  bool growing_keys = false;  // key norms grow along the sequence: the running max keeps moving
};

// gtest prints a failing parameter with this (instead of its bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed) {
  Tensor t(std::move(shape), DType::kF32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

// Positions of the n tokens of rank r out of `ranks` under a layout (global sequence of
// n·ranks tokens); kShuffled: a random subset of [0, 2n) in random order.
std::vector<int64_t> layout_positions(Layout layout, int64_t n, int r, int ranks, uint64_t seed) {
  std::vector<int64_t> pos(static_cast<size_t>(n));
  switch (layout) {
    case Layout::kContiguous:
      for (int64_t i = 0; i < n; ++i) pos[i] = r * n + i;
      break;
    case Layout::kStriped:
      for (int64_t i = 0; i < n; ++i) pos[i] = i * ranks + r;
      break;
    case Layout::kZigzag: {  // 2·ranks chunks; rank r holds chunks r and 2·ranks-1-r
      const int64_t c = (n + 1) / 2;
      for (int64_t i = 0; i < n; ++i) {
        pos[i] = i < c ? r * c + i : (2 * ranks - 1 - r) * c + (i - c);
      }
      break;
    }
    case Layout::kShuffled: {
      std::vector<int64_t> all(static_cast<size_t>(2 * n));
      std::iota(all.begin(), all.end(), 0);
      std::mt19937_64 rng(seed);
      std::shuffle(all.begin(), all.end(), rng);
      std::copy_n(all.begin(), n, pos.begin());
      break;
    }
  }
  return pos;
}

struct Inputs {
  Tensor q, k, v;
  std::vector<int64_t> q_pos, k_pos;
  std::vector<uint8_t> k_valid;
  std::vector<int32_t> q_seg, k_seg;
  AttnParams params;
};

Inputs make_inputs(const Case& c, uint64_t seed = 1) {
  const int64_t sk = c.sk < 0 ? c.sq : c.sk;
  Inputs in;
  in.q = random_tensor({c.b, c.sq, c.h, c.d}, seed * 3 + 0);
  in.k = random_tensor({c.b, sk, c.hkv, c.d}, seed * 3 + 1);
  in.v = random_tensor({c.b, sk, c.hkv, c.d}, seed * 3 + 2);
  if (c.q_scale != 1.f) {
    for (int64_t i = 0; i < in.q.numel(); ++i) in.q.data<float>()[i] *= c.q_scale;
  }
  if (c.growing_keys) {
    for (int64_t bi = 0; bi < c.b; ++bi) {
      for (int64_t j = 0; j < sk; ++j) {
        float* row = in.k.data<float>() + (bi * sk + j) * c.hkv * c.d;
        const float f = 1.f + 6.f * static_cast<float>(j) / static_cast<float>(sk);
        for (int64_t e = 0; e < c.hkv * c.d; ++e) row[e] *= f;
      }
    }
  }
  if (c.dtype != DType::kF32) {
    in.q = in.q.to(c.dtype);
    in.k = in.k.to(c.dtype);
    in.v = in.v.to(c.dtype);
  }
  MaskSpec& m = in.params.mask;
  m.causal = c.causal;
  if (c.layout == Layout::kContiguous) {
    if (c.sq != sk) {  // queries are the last sq tokens (prefill continuation / decode)
      in.q_pos.resize(c.sq);
      std::iota(in.q_pos.begin(), in.q_pos.end(), sk - c.sq);
    }
  } else if (c.layout == Layout::kShuffled) {
    in.q_pos = layout_positions(c.layout, c.sq, 0, 1, seed + 11);
    in.k_pos = layout_positions(c.layout, sk, 0, 1, seed + 12);
  } else {  // queries of rank 1 against the keys of rank 2 (a ring step), 4 ranks
    in.q_pos = layout_positions(c.layout, c.sq, 1, 4, 0);
    in.k_pos = layout_positions(c.layout, sk, 2, 4, 0);
  }
  std::mt19937_64 rng(seed + 5);
  if (c.padding) {
    in.k_valid.assign(static_cast<size_t>(c.b * sk), 1);
    for (int64_t bi = 0; bi < c.b; ++bi) {
      uint8_t* row = in.k_valid.data() + bi * sk;
      if (bi % 3 == 0) {  // trailing padding
        for (int64_t j = sk - sk / 4; j < sk; ++j) row[j] = 0;
      } else if (bi % 3 == 1) {  // random holes
        for (int64_t j = 0; j < sk; ++j) row[j] = rng() % 5 != 0;
      } else {  // a fully padded sequence: every row of this batch is empty
        std::fill_n(row, sk, 0);
      }
    }
  }
  if (c.segments) {
    // Packed sequences: random lengths over the global positions of the keys.
    const int64_t span = 2 * std::max(c.sq, sk) * 4;
    std::vector<int32_t> seg_of_pos(static_cast<size_t>(span));
    int32_t s = 0;
    for (int64_t p = 0; p < span;) {
      const int64_t len = 1 + static_cast<int64_t>(rng() % (std::max<int64_t>(sk, 4) / 3 + 1));
      for (int64_t e = 0; e < len && p < span; ++e) seg_of_pos[p++] = s;
      ++s;
    }
    in.q_seg.resize(c.sq);
    in.k_seg.resize(sk);
    for (int64_t i = 0; i < c.sq; ++i) in.q_seg[i] = seg_of_pos[in.q_pos.empty() ? i : in.q_pos[i]];
    for (int64_t j = 0; j < sk; ++j) in.k_seg[j] = seg_of_pos[in.k_pos.empty() ? j : in.k_pos[j]];
  }
  m.q_pos = in.q_pos;
  m.k_pos = in.k_pos;
  m.k_valid = in.k_valid;
  m.q_segment = in.q_seg;
  m.k_segment = in.k_seg;
  in.params.block_q = c.bq;
  in.params.block_k = c.bk;
  return in;
}

// ---- comparison --------------------------------------------------------------------------------

struct Errors {
  double out = 0, lse = 0;
  bool nan = false;
  int64_t empty_mismatch = 0;  // rows empty in one and not the other
};

Errors compare(const AttnState& got, const AttnState& want) {
  Errors e;
  EXPECT_EQ(got.out.shape(), want.out.shape());
  EXPECT_EQ(got.lse.shape(), want.lse.shape());
  const int64_t d = want.head_dim();
  for (int64_t r = 0; r < want.lse.numel(); ++r) {
    const float gl = got.lse.at(r), wl = want.lse.at(r);
    if (std::isnan(gl)) e.nan = true;
    if ((gl == -kInf) != (wl == -kInf)) {
      ++e.empty_mismatch;
    } else if (wl != -kInf) {
      e.lse = std::max(e.lse, std::fabs(static_cast<double>(gl) - wl));
    }
    for (int64_t x = 0; x < d; ++x) {
      const float go = got.out.at(r * d + x), wo = want.out.at(r * d + x);
      if (std::isnan(go)) e.nan = true;
      e.out = std::max(e.out, std::fabs(static_cast<double>(go) - wo));
    }
  }
  return e;
}

ErrorBound tolerance(const Case& c, const Inputs& in) {
  double vmax = 0;
  for (int64_t i = 0; i < in.v.numel(); ++i) vmax = std::max(vmax, std::fabs(double(in.v.at(i))));
  const double logit_scale = c.q_scale * (c.growing_keys ? 7.0 : 1.0);  // keys grow up to 7x
  return attention_error_bound(c.dtype, c.sk < 0 ? c.sq : c.sk, c.d, vmax, logit_scale);
}

void expect_matches_reference(const Case& c, const Inputs& in, const AttnState& got,
                              const AttnState& want) {
  const Errors e = compare(got, want);
  const ErrorBound tol = tolerance(c, in);
  EXPECT_FALSE(e.nan) << c.name;
  EXPECT_EQ(e.empty_mismatch, 0) << c.name;
  EXPECT_LE(e.out, tol.out) << c.name;
  EXPECT_LE(e.lse, tol.lse) << c.name;
  if (std::getenv("SEQPAR_TEST_PRINT_ERRORS") != nullptr)
    std::printf("errors %s %s out %.3g / %.3g lse %.3g / %.3g\n",
                std::string(kernel_path_name(kernel_path(c.dtype))).c_str(), c.name.c_str(), e.out,
                tol.out, e.lse, tol.lse);
}

void check_case(const Case& c) {
  const Inputs in = make_inputs(c);
  const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
  const AttnState got = flash_attention(in.q, in.k, in.v, in.params);
  expect_matches_reference(c, in, got, want);
}

std::string layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous:
      return "contig";
    case Layout::kStriped:
      return "striped";
    case Layout::kZigzag:
      return "zigzag";
    case Layout::kShuffled:
      return "shuffled";
  }
  return "?";
}

std::string auto_name(const Case& c) {
  std::string s = "B" + std::to_string(c.b) + "_Sq" + std::to_string(c.sq) + "_Sk" +
                  std::to_string(c.sk < 0 ? c.sq : c.sk) + "_H" + std::to_string(c.h) + "_" +
                  std::to_string(c.hkv) + "_D" + std::to_string(c.d) + "_" + layout_name(c.layout);
  if (c.causal) s += "_causal";
  if (c.padding) s += "_pad";
  if (c.segments) s += "_seg";
  if (c.dtype != DType::kF32) s += "_" + std::string(dtype_name(c.dtype));
  if (c.bq || c.bk) s += "_bq" + std::to_string(c.bq) + "_bk" + std::to_string(c.bk);
  if (c.q_scale != 1.f) s += "_qx" + std::to_string(static_cast<int>(c.q_scale));
  if (c.growing_keys) s += "_grow";
  return s;
}

// ---- the sweep ---------------------------------------------------------------------------------

// Appends c named by its parameters.
void add_named(std::vector<Case>& cases, Case c) {
  c.name = auto_name(c);
  cases.push_back(std::move(c));
}

std::vector<Case> sweep_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) { add_named(cases, std::move(c)); };
  // Shapes: S x D x (H, Hkv) x causal.
  for (int64_t s : {1, 7, 64, 1000}) {
    for (int64_t d : {64, 128}) {
      for (auto [h, hkv] : {std::pair<int64_t, int64_t>{8, 8}, {8, 2}, {5, 5}}) {
        for (bool causal : {false, true}) {
          Case c;
          c.b = s <= 64 ? 2 : 1;
          c.sq = s;
          c.d = d;
          c.h = h;
          c.hkv = hkv;
          c.causal = causal;
          add(c);
        }
      }
    }
  }
  for (int64_t d : {64, 128}) {
    for (bool causal : {false, true}) {
      Case c;
      c.sq = 4096;
      c.h = c.hkv = 1;
      c.d = d;
      c.causal = causal;
      add(c);
    }
  }
  // Layouts (a ring step between two ranks' shards), with several block shapes.
  for (Layout l : {Layout::kStriped, Layout::kZigzag, Layout::kShuffled}) {
    for (auto [bq, bk] : {std::pair<int, int>{0, 0}, {64, 48}, {32, 100}}) {
      Case c;
      c.b = 2;
      c.sq = 300;
      c.sk = 333;
      c.h = 4;
      c.hkv = 2;
      c.causal = true;
      c.layout = l;
      c.bq = bq;
      c.bk = bk;
      add(c);
    }
  }
  {  // contiguous: queries at the end of a longer key sequence; decode
    Case c;
    c.sq = 200;
    c.sk = 900;
    c.causal = true;
    c.bk = 128;
    add(c);
    c.sq = 1;
    c.b = 3;
    add(c);
    c.causal = false;
    add(c);
  }
  // Padding (trailing, holes, a fully padded sequence), with and without causal / layouts.
  for (bool causal : {false, true}) {
    for (Layout l : {Layout::kContiguous, Layout::kStriped}) {
      Case c;
      c.b = 3;
      c.sq = 257;
      c.h = 6;
      c.hkv = 3;
      c.causal = causal;
      c.layout = l;
      c.padding = true;
      c.bq = 64;
      c.bk = 64;
      add(c);
    }
  }
  // Segments (packed sequences), sorted and shuffled, with causal and padding.
  for (bool causal : {false, true}) {
    for (Layout l : {Layout::kContiguous, Layout::kZigzag, Layout::kShuffled}) {
      Case c;
      c.b = 2;
      c.sq = 400;
      c.h = 4;
      c.hkv = 1;
      c.causal = causal;
      c.layout = l;
      c.segments = true;
      c.bq = 64;
      c.bk = 32;
      add(c);
    }
  }
  {
    Case c;
    c.b = 3;
    c.sq = 300;
    c.h = 2;
    c.hkv = 2;
    c.causal = true;
    c.layout = Layout::kStriped;
    c.segments = true;
    c.padding = true;
    c.bq = 32;
    c.bk = 64;
    add(c);
  }
  // bf16 and fp16 inputs.
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (bool causal : {false, true}) {
      Case c;
      c.b = 2;
      c.sq = 500;
      c.h = 8;
      c.hkv = 2;
      c.d = 128;
      c.causal = causal;
      c.dtype = t;
      add(c);
    }
    Case c;
    c.b = 3;
    c.sq = 200;
    c.sk = 260;
    c.h = 4;
    c.hkv = 2;
    c.causal = true;
    c.layout = Layout::kStriped;
    c.padding = true;
    c.segments = true;
    c.dtype = t;
    add(c);
  }
  // Decode: a few queries over many keys (Sq·group <= 64: one item walks every kv head in memory
  // order, a tile stacks the query heads of a kv head), GQA ratios 1..16, odd blocks, masks.
  for (int64_t sq : {1, 4, 13}) {
    for (auto [h, hkv] : {std::pair<int64_t, int64_t>{32, 8}, {8, 8}, {6, 2}, {16, 1}}) {
      if (sq * (h / hkv) > 64) continue;
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
        Case c;
        c.b = 2;
        c.sq = sq;
        c.sk = 1100;
        c.h = h;
        c.hkv = hkv;
        c.d = 128;
        c.causal = true;
        c.layout = sq == 4 ? Layout::kStriped : Layout::kContiguous;
        c.padding = sq != 1;
        c.segments = sq == 13;
        c.dtype = t;
        c.bk = sq == 13 ? 96 : 0;
        add(c);
      }
    }
  }
  // Block sizes: tiny, odd, larger than the sequence.
  for (auto [bq, bk] : {std::pair<int, int>{1, 1}, {3, 17}, {256, 512}, {1000, 1000}}) {
    Case c;
    c.sq = bq == 1 ? 40 : 300;
    c.h = 2;
    c.hkv = 1;
    c.causal = true;
    c.bq = bq;
    c.bk = bk;
    add(c);
  }
  // Head dims that are not a multiple of the vector width.
  for (int64_t d : {1, 80}) {
    Case c;
    c.b = 2;
    c.sq = 150;
    c.h = 3;
    c.hkv = 1;
    c.d = d;
    c.causal = true;
    c.padding = true;
    c.bq = 64;
    c.bk = 64;
    add(c);
  }
  // Large logits: the stale running max must be moved and the accumulators rescaled.
  for (bool causal : {false, true}) {
    Case c;
    c.sq = 600;
    c.h = 2;
    c.hkv = 2;
    c.causal = causal;
    c.bk = 64;
    c.q_scale = 30.f;
    add(c);
    c.q_scale = 3.f;
    c.growing_keys = true;
    add(c);
  }
  return cases;
}

class FlashVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(FlashVsReference, Matches) { check_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Sweep, FlashVsReference, ::testing::ValuesIn(sweep_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- every instruction set this CPU runs, and several thread counts --------------------------

std::vector<Case> small_cases() {
  std::vector<Case> cases;
  Case c;
  c.b = 2;
  c.sq = 150;
  c.sk = 170;
  c.h = 4;
  c.hkv = 2;
  c.causal = true;
  c.layout = Layout::kStriped;
  c.padding = true;
  c.bq = 32;
  c.bk = 40;
  cases.push_back(c);
  c.layout = Layout::kShuffled;
  c.segments = true;
  cases.push_back(c);
  c.layout = Layout::kContiguous;
  c.segments = false;
  c.padding = false;
  c.dtype = DType::kBF16;
  cases.push_back(c);
  c.dtype = DType::kF32;
  c.q_scale = 30.f;
  c.causal = false;
  cases.push_back(c);
  // Decode shapes (the few-row loops): 1..36 stacked rows (odd tails of every vector width),
  // odd head dims (column tails), fp32/bf16/fp16 (converted, or read in place for up to 4 rows),
  // masks.
  using D = DType;
  for (auto [sq, h, hkv, d, dtype] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, D>{1, 1, 1, 64, D::kF32},
        {3, 12, 4, 40, D::kBF16},
        {9, 4, 1, 128, D::kF32},
        {4, 32, 8, 20, D::kF32},
        {13, 1, 1, 7, D::kF16},
        {1, 12, 4, 40, D::kBF16},
        {2, 4, 2, 72, D::kF16},
        {1, 8, 2, 7, D::kBF16}}) {
    Case x;
    x.b = 2;
    x.sq = sq;
    x.sk = 300;
    x.h = h;
    x.hkv = hkv;
    x.d = d;
    x.causal = true;
    x.layout = sq == 9 ? Layout::kShuffled : Layout::kStriped;
    x.padding = true;
    x.segments = sq == 3;
    x.bk = 56;
    x.dtype = dtype;
    cases.push_back(x);
  }
  for (Case& x : cases) x.name = auto_name(x);
  return cases;
}

struct IsaGuard {
  ~IsaGuard() { simd::force_softmax_isa(std::nullopt); }
};

// One test per instruction set; those this CPU lacks are reported as skipped.
class FlashIsa : public ::testing::TestWithParam<simd::Isa> {};

TEST_P(FlashIsa, MatchesReference) {
  IsaGuard guard;
  const simd::Isa isa = GetParam();
  if (!simd::cpu_has(isa)) {
    EXPECT_THROW(simd::force_softmax_isa(isa), InvalidArgument);
    GTEST_SKIP() << simd::isa_name(isa) << " not supported on this CPU";
  }
  simd::force_softmax_isa(isa);
  EXPECT_EQ(simd::kernels().isa, isa);
  for (Case c : small_cases()) {
    c.name += std::string("_") + std::string(simd::isa_name(isa));
    check_case(c);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, FlashIsa,
                         ::testing::Values(simd::Isa::kScalar, simd::Isa::kAvx2,
                                           simd::Isa::kAvx512),
                         [](const ::testing::TestParamInfo<simd::Isa>& info) {
                           return std::string(simd::isa_name(info.param));
                         });

// ---- accumulate: a state folded into by later calls (ring steps) ------------------------------

// Keys [j0, j1) of the inputs as a call of their own: K/V rows and the mask's key spans.
struct KeyChunk {
  Tensor k, v;
  std::vector<int64_t> pos;
  std::vector<uint8_t> valid;
  std::vector<int32_t> seg;
};
KeyChunk key_chunk(const Inputs& in, int64_t j0, int64_t j1) {
  const int64_t b = in.k.dim(0), sk = in.k.dim(1), n = j1 - j0;
  KeyChunk c{Tensor({b, n, in.k.dim(2), in.k.dim(3)}, in.k.dtype()),
             Tensor({b, n, in.v.dim(2), in.v.dim(3)}, in.v.dtype()),
             {},
             {},
             {}};
  const size_t row = in.k.nbytes() / static_cast<size_t>(b * sk);
  for (int64_t bi = 0; bi < b; ++bi) {
    std::memcpy(static_cast<char*>(c.k.raw()) + bi * n * row,
                static_cast<const char*>(in.k.raw()) + (bi * sk + j0) * row, n * row);
    std::memcpy(static_cast<char*>(c.v.raw()) + bi * n * row,
                static_cast<const char*>(in.v.raw()) + (bi * sk + j0) * row, n * row);
    if (!in.k_valid.empty())
      c.valid.insert(c.valid.end(), in.k_valid.begin() + bi * sk + j0,
                     in.k_valid.begin() + bi * sk + j1);
  }
  for (int64_t j = j0; j < j1; ++j) c.pos.push_back(in.k_pos.empty() ? j : in.k_pos[j]);
  if (!in.k_seg.empty()) c.seg.assign(in.k_seg.begin() + j0, in.k_seg.begin() + j1);
  return c;
}

// The keys cut into `parts` chunks of random lengths (some empty), each folded into one state
// that starts empty (params.accumulate), equal attention over all keys within the kernel's bound
// for one call over them all: the ring's steps. Every case of the sweep (masks, padding,
// segments, layouts, GQA, bf16 / fp16, decode shapes), one, two and four threads (four split
// the key blocks of the decode shapes, the first split starting from the state).
TEST(FlashAccumulate, FoldedChunksMatchReference) {
  const int saved = omp_get_max_threads();
  std::mt19937_64 rng(3);
  for (const Case& base : small_cases()) {
    const Inputs in = make_inputs(base);
    const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
    const int64_t sk = in.k.dim(1);
    for (int parts : {1, 2, 5}) {
      std::vector<int64_t> cuts{0, sk};
      for (int x = 1; x < parts; ++x) cuts.push_back(static_cast<int64_t>(rng() % (sk + 1)));
      std::sort(cuts.begin(), cuts.end());
      for (int threads : {1, 2, 4}) {
        omp_set_num_threads(threads);
        AttnState st = AttnState::empty(in.q.dim(0), in.q.dim(1), in.q.dim(2), in.q.dim(3));
        for (size_t x = 0; x + 1 < cuts.size(); ++x) {
          const KeyChunk c = key_chunk(in, cuts[x], cuts[x + 1]);
          AttnParams p = in.params;
          p.accumulate = true;
          p.mask.k_pos = c.pos;
          p.mask.k_valid = c.valid;
          p.mask.k_segment = c.seg;
          flash_attention_into(in.q, c.k, c.v, p, st.out, st.lse);
        }
        Case c = base;
        c.name = auto_name(base) + "_parts" + std::to_string(parts) + "_threads" +
                 std::to_string(threads);
        expect_matches_reference(c, in, st, want);
      }
    }
  }
  omp_set_num_threads(saved);
}

// A state's own rows pass through a call that adds no keys to them; NaN rows stay NaN; no keys
// at all leave the state as it is; accumulate with row_max is refused.
TEST(FlashAccumulate, StatesPassThroughAndArgumentChecks) {
  const Tensor q = random_tensor({1, 40, 2, 16}, 5), k = random_tensor({1, 30, 2, 16}, 6),
               v = random_tensor({1, 30, 2, 16}, 7);
  AttnState st = flash_attention(q, k, v);
  st.lse.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  const AttnState before = st;
  // Keys at positions 100.. under causal with queries at 0..39: every row sees none.
  std::vector<int64_t> kpos(30);
  std::iota(kpos.begin(), kpos.end(), 100);
  AttnParams p;
  p.accumulate = true;
  p.mask.causal = true;
  p.mask.k_pos = kpos;
  flash_attention_into(q, k, v, p, st.out, st.lse);
  for (int64_t r = 0; r < st.lse.numel(); ++r) {
    if (r == 3) {
      EXPECT_TRUE(std::isnan(st.lse.at(r)));
      for (int64_t e = 0; e < 16; ++e) EXPECT_TRUE(std::isnan(st.out.at(r * 16 + e)));
      continue;
    }
    EXPECT_NEAR(st.lse.at(r), before.lse.at(r), 1e-6) << r;
    for (int64_t e = 0; e < 16; ++e)
      EXPECT_NEAR(st.out.at(r * 16 + e), before.out.at(r * 16 + e), 1e-6) << r;
  }
  const Tensor none_k({1, 0, 2, 16}), none_v({1, 0, 2, 16});
  AttnState kept = before;
  AttnParams plain;
  plain.accumulate = true;
  flash_attention_into(q, none_k, none_v, plain, kept.out, kept.lse);
  EXPECT_EQ(std::memcmp(kept.out.raw(), before.out.raw(), before.out.nbytes()), 0);
  std::vector<float> row_max(80, 10.f);
  plain.row_max = row_max;
  EXPECT_THROW(flash_attention_into(q, k, v, plain, kept.out, kept.lse), InvalidArgument);
}

TEST(FlashThreads, SameResultForAnyThreadCount) {
  Case c = small_cases()[0];
  c.sq = 700;
  c.sk = 650;
  const Inputs in = make_inputs(c);
  const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
  const int saved = omp_get_max_threads();
  AttnState first;
  for (int threads : {1, 2, 3, 5}) {
    omp_set_num_threads(threads);
    const AttnState got = flash_attention(in.q, in.k, in.v, in.params);
    c.name = auto_name(c) + "_threads" + std::to_string(threads);
    expect_matches_reference(c, in, got, want);
    if (threads == 1) {
      first = got;
    } else {  // tiles are computed the same way whatever the work split: bitwise equal
      EXPECT_EQ(std::memcmp(first.out.raw(), got.out.raw(), got.out.nbytes()), 0) << threads;
      EXPECT_EQ(std::memcmp(first.lse.raw(), got.lse.raw(), got.lse.nbytes()), 0) << threads;
    }
  }
  omp_set_num_threads(saved);
  // Called from inside a parallel region (ranks as OpenMP threads): runs serially per caller.
  std::vector<AttnState> results(2);
#pragma omp parallel for num_threads(2)
  for (int r = 0; r < 2; ++r) results[r] = flash_attention(in.q, in.k, in.v, in.params);
  for (const AttnState& r : results) expect_matches_reference(c, in, r, want);
}

TEST(FlashThreads, KeySplitWhenFewerItemsThanThreads) {
  // Decode-like shapes give one work item; with several threads the key blocks are split and the
  // partial states merged.
  const int saved = omp_get_max_threads();
  for (auto [sq, h, hkv] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 2, 1}, {5, 2, 1}, {4, 32, 8}, {3, 8, 8}}) {
    Case c;
    c.sq = sq;
    c.sk = 2000;
    c.h = h;
    c.hkv = hkv;
    c.b = 1;
    c.causal = true;
    c.padding = true;
    c.bk = 128;
    c.name = auto_name(c);
    const Inputs in = make_inputs(c);
    const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
    for (int threads : {2, 4}) {
      omp_set_num_threads(threads);
      expect_matches_reference(c, in, flash_attention(in.q, in.k, in.v, in.params), want);
    }
  }
  omp_set_num_threads(saved);
}

TEST(FlashThreads, ConcurrentCallsFromStdThreads) {
  // Ranks as std::threads, each with its own inputs; thread-local caches must not interfere.
  std::vector<Case> cases = small_cases();
  std::vector<Inputs> ins;
  std::vector<AttnState> want, got(cases.size());
  for (const Case& c : cases) {
    ins.push_back(make_inputs(c));
    want.push_back(
        reference_attention(ins.back().q, ins.back().k, ins.back().v, ins.back().params));
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cases.size(); ++i) {
    threads.emplace_back([&, i] {
      omp_set_num_threads(1);
      for (int rep = 0; rep < 3; ++rep)
        got[i] = flash_attention(ins[i].q, ins[i].k, ins[i].v, ins[i].params);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < cases.size(); ++i)
    expect_matches_reference(cases[i], ins[i], got[i], want[i]);
}

// ---- masking details ------------------------------------------------------------------------

// Keys in fully masked blocks are poisoned with NaN: if the kernel computed those blocks at all
// (0·NaN = NaN in P·V), the output would be NaN.
TEST(FlashMask, FullyMaskedBlocksAreNeverComputed) {
  for (bool padding_case : {false, true}) {
    Case c;
    c.b = 1;
    c.sq = 256;
    c.sk = 1024;
    c.h = 2;
    c.hkv = 1;
    c.bq = 128;
    c.bk = 256;
    Inputs in = make_inputs(c);
    std::vector<int64_t> qpos(256);
    std::iota(qpos.begin(), qpos.end(), 0);
    std::vector<uint8_t> valid(1024, 1);
    int64_t poison_from = 512, poison_to = 1024;
    if (padding_case) {  // keys 256..511 are padding; no causal
      std::fill(valid.begin() + 256, valid.begin() + 512, 0);
      poison_from = 256;
      poison_to = 512;
      in.params.mask.k_valid = valid;
    } else {  // queries 0..255, causal: key blocks from 256 on are in the future
      in.params.mask.causal = true;
      in.params.mask.q_pos = qpos;
      poison_from = 256;
    }
    for (int64_t j = poison_from; j < poison_to; ++j) {
      for (int64_t e = 0; e < c.d; ++e) {
        in.k.data<float>()[j * c.d + e] = std::nanf("");
        in.v.data<float>()[j * c.d + e] = std::nanf("");
      }
    }
    const AttnState got = flash_attention(in.q, in.k, in.v, in.params);
    const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
    c.name = padding_case ? "padding_poisoned" : "causal_poisoned";
    expect_matches_reference(c, in, got, want);
  }
}

TEST(FlashMask, RowsThatSeeNoKeyAreEmpty) {
  // Causal, keys all after the queries: every row is empty; nothing NaN.
  Case c;
  c.sq = 50;
  c.sk = 70;
  Inputs in = make_inputs(c);
  std::vector<int64_t> kpos(70);
  std::iota(kpos.begin(), kpos.end(), 1000);
  in.params.mask.causal = true;
  in.params.mask.k_pos = kpos;
  const AttnState got = flash_attention(in.q, in.k, in.v, in.params);
  for (int64_t i = 0; i < got.lse.numel(); ++i) ASSERT_EQ(got.lse.at(i), -kInf);
  for (int64_t i = 0; i < got.out.numel(); ++i) ASSERT_EQ(got.out.at(i), 0.f);
}

TEST(FlashMask, EmptyInputsGiveEmptyStates) {
  const Tensor q = random_tensor({2, 5, 2, 16}, 1);
  const Tensor k = random_tensor({2, 0, 2, 16}, 2), v = random_tensor({2, 0, 2, 16}, 3);
  const AttnState st = flash_attention(q, k, v);
  EXPECT_EQ(st.out.shape(), (std::vector<int64_t>{2, 5, 2, 16}));
  for (int64_t i = 0; i < st.lse.numel(); ++i) EXPECT_EQ(st.lse.at(i), -kInf);
  const Tensor q0 = random_tensor({2, 0, 2, 16}, 4), k1 = random_tensor({2, 9, 2, 16}, 5);
  EXPECT_EQ(flash_attention(q0, k1, k1).out.numel(), 0);
}

TEST(FlashMask, ScaleIsApplied) {
  Case c;
  c.sq = 100;
  c.causal = true;
  Inputs in = make_inputs(c);
  in.params.scale = 0.37f;
  const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
  const AttnState got = flash_attention(in.q, in.k, in.v, in.params);
  c.name = "scale";
  expect_matches_reference(c, in, got, want);
  AttnParams def = in.params;
  def.scale = 0.f;
  EXPECT_GT(max_abs_diff(flash_attention(in.q, in.k, in.v, def).out, got.out), 1e-3);
}

TEST(FlashProgress, CalledBetweenKeyBlocksFromTheCallingThread) {
  Case c;
  c.sq = 300;
  c.sk = 1000;
  c.bk = 100;
  c.h = 4;
  Inputs in = make_inputs(c);
  int calls = 0;
  bool other_thread = false;
  const auto caller = std::this_thread::get_id();
  in.params.progress = [&] {
    ++calls;
    other_thread = other_thread || std::this_thread::get_id() != caller;
  };
  // On one thread the calling thread walks every key block of the 8 items (4 heads x 2 query
  // blocks). On two, the items are handed out dynamically: the calling thread calls progress for
  // the key blocks of the items it takes, which may be none when the machine is loaded and the
  // other thread takes them all (seen on a loaded 2-core machine), so only where it is called
  // from is checked there.
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    calls = 0;
    flash_attention(in.q, in.k, in.v, in.params);
    if (threads == 1) {
      EXPECT_GE(calls, 10);  // at least once per key block
    }
  }
  EXPECT_FALSE(other_thread);
  // An exception thrown by progress (e.g. a failed transfer) reaches the caller: on one thread,
  // where the calling thread is sure to call it.
  omp_set_num_threads(1);
  in.params.progress = [] { throw CommError("peer died"); };
  EXPECT_THROW(flash_attention(in.q, in.k, in.v, in.params), CommError);
  omp_set_num_threads(saved);
}

TEST(FlashInfo, NamesThePath) {
  const std::string info = attention_kernel_info();
  EXPECT_NE(info.find("oneDNN"), std::string::npos) << info;
  EXPECT_NE(info.find(std::string(simd::isa_name(simd::kernels().isa))), std::string::npos) << info;
  // The fp32 products of query tiles: panel products where the kernels are AVX2.
  EXPECT_EQ(
      info.find("panel products avx2") != std::string::npos,
      simd::kernels().isa == simd::Isa::kAvx2 && std::getenv("SEQPAR_KERNEL_PANELS") == nullptr)
      << info;
  std::printf("[   INFO   ] %s\n", info.c_str());
}

// ---- argument checks --------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

TEST(FlashArgs, ShapeErrorsThrowInvalidArgument) {
  const Tensor q = random_tensor({1, 8, 6, 16}, 1), k = random_tensor({1, 8, 4, 16}, 2);
  const Tensor k2 = random_tensor({1, 8, 2, 16}, 3);
  const std::string heads = error_of([&] { flash_attention(q, k, k); });
  EXPECT_EQ(heads, "heads 6 is not divisible by kv_heads 4; valid kv_heads: 1, 2, 3, 6");
  EXPECT_NE(error_of([&] { reference_attention(q, k, k); }).find("kv_heads 4"),
            std::string::npos);
  const Tensor q3 = random_tensor({8, 6, 16}, 4);
  EXPECT_NE(error_of([&] { flash_attention(q3, k2, k2); }).find("q must be 4-D"),
            std::string::npos);
  const Tensor kd = random_tensor({1, 8, 2, 32}, 5);
  EXPECT_NE(error_of([&] { flash_attention(q, kd, kd); }).find("head_dim"), std::string::npos);
  const Tensor kb = random_tensor({2, 8, 2, 16}, 6);
  EXPECT_NE(error_of([&] { flash_attention(q, kb, kb); }).find("batch"), std::string::npos);
  const Tensor vs = random_tensor({1, 9, 2, 16}, 7);
  EXPECT_NE(error_of([&] { flash_attention(q, k2, vs); }).find("v shape"), std::string::npos);
  const Tensor kbf = k2.to(DType::kBF16);
  EXPECT_NE(error_of([&] { flash_attention(q, kbf, k2); }).find("dtype"), std::string::npos);

  AttnParams p;
  std::vector<int64_t> pos(7);
  p.mask.q_pos = pos;
  EXPECT_NE(error_of([&] { flash_attention(q, k2, k2, p); }).find("mask.q_pos has 7"),
            std::string::npos);
  p = {};
  p.mask.k_pos = pos;
  EXPECT_NE(error_of([&] { flash_attention(q, k2, k2, p); }).find("mask.k_pos"), std::string::npos);
  p = {};
  std::vector<uint8_t> valid(7, 1);
  p.mask.k_valid = valid;
  EXPECT_NE(error_of([&] { flash_attention(q, k2, k2, p); }).find("mask.k_valid"),
            std::string::npos);
  p = {};
  std::vector<int32_t> seg(8);
  p.mask.q_segment = seg;
  EXPECT_NE(error_of([&] { flash_attention(q, k2, k2, p); }).find("together"), std::string::npos);
  std::vector<int32_t> seg7(7);
  p.mask.k_segment = seg7;
  EXPECT_NE(error_of([&] { flash_attention(q, k2, k2, p); }).find("mask.k_segment"),
            std::string::npos);
  p = {};
  p.scale = -1.f;
  EXPECT_NE(error_of([&] { flash_attention(q, k2, k2, p); }).find("scale"), std::string::npos);
  EXPECT_NO_THROW(validate_attention_inputs(q, k2, k2, {}));
}

// ---- vector routines --------------------------------------------------------------------------

std::vector<simd::Isa> cpu_isas() {
  std::vector<simd::Isa> v;
  for (simd::Isa isa : {simd::Isa::kScalar, simd::Isa::kAvx2, simd::Isa::kAvx512}) {
    if (simd::cpu_has(isa)) v.push_back(isa);
  }
  return v;
}

TEST(Simd, Exp2Accuracy) {
  std::vector<float> x;
  for (float t = -126.f; t <= 9.f; t += 0.0137f) x.push_back(t);
  for (float t : {0.f, -0.5f, 0.5f, 1.f, -1.f, 8.f, -125.99f}) x.push_back(t);
  std::vector<float> y(x.size());
  for (simd::Isa isa : cpu_isas()) {
    const simd::Kernels& k = simd::kernels(isa);
    for (int deg : {5, 3}) {
      (deg == 5 ? k.exp2_deg5 : k.exp2_deg3)(x.data(), y.data(), static_cast<int64_t>(x.size()));
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double want = std::exp2(static_cast<double>(x[i]));
        worst = std::max(worst, std::fabs(y[i] - want) / want);
      }
      EXPECT_LE(worst, deg == 5 ? 3e-7 : 1e-4) << simd::isa_name(isa) << " deg " << deg;
    }
    // Masked scores: -inf, NaN and anything below -127 give exactly 0, never NaN.
    const float special[6] = {-kInf,  -1e30f, -200.f,
                              -127.f, -3e4f,  std::numeric_limits<float>::quiet_NaN()};
    float out[6];
    k.exp2_deg5(special, out, 6);
    for (float o : out) EXPECT_EQ(o, 0.f) << simd::isa_name(isa);
  }
}

TEST(Simd, ConversionsMatchScalar) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 10.f);
  std::vector<float> f(1003);
  for (float& x : f) x = n(rng);
  f[5] = 0.f;
  f[6] = -0.f;
  f[7] = 1e-40f;  // subnormal
  std::vector<uint16_t> bf(f.size()), hf(f.size()), got16(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    bf[i] = f32_to_bf16(f[i]);
    hf[i] = f32_to_f16(f[i]);
  }
  std::vector<float> got(f.size());
  for (simd::Isa isa : cpu_isas()) {
    const simd::Kernels& k = simd::kernels(isa);
    const auto n_el = static_cast<int64_t>(f.size());
    k.bf16_to_f32(bf.data(), got.data(), n_el);
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(got[i], bf16_to_f32(bf[i])) << i;
    k.f16_to_f32(hf.data(), got.data(), n_el);
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(got[i], f16_to_f32(hf[i])) << i;
    k.f32_to_bf16(f.data(), got16.data(), n_el);
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(got16[i], bf[i]) << i;
    k.scale_copy(f.data(), 0.25f, got.data(), n_el);
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(got[i], f[i] * 0.25f) << i;
  }
}

// Each length up to 140 (two rounds of the four running sums at 16 lanes, whole vectors and tails
// of every width), one element non-finite at each position in turn, or none: the answer of
// std::isfinite over the elements.
TEST(Simd, AnyNonFiniteFindsEachElement) {
  const float kinds[3] = {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()};
  const float finite[4] = {3.38e38f, -1e-40f, 0.f, -0.f};  // near the largest, subnormal, zeros
  for (simd::Isa isa : cpu_isas()) {
    const simd::Kernels& k = simd::kernels(isa);
    for (int64_t n = 0; n <= 140; ++n) {
      std::vector<float> f(n);
      std::vector<uint16_t> bf(n);
      for (int64_t i = 0; i < n; ++i) f[i] = finite[i % 4];
      for (int64_t bad = -1; bad < n; ++bad)
        for (float x : kinds) {
          if (bad >= 0) f[bad] = x;
          for (int64_t i = 0; i < n; ++i) bf[i] = f32_to_bf16(f[i]);
          const bool want = bad >= 0;
          ASSERT_EQ(k.any_nonfinite_f32(f.data(), n), want)
              << simd::isa_name(isa) << " n " << n << " at " << bad << " " << x;
          ASSERT_EQ(k.any_nonfinite_bf16(bf.data(), n), want)
              << simd::isa_name(isa) << " bf16 n " << n << " at " << bad << " " << x;
          if (bad >= 0) f[bad] = finite[bad % 4];
        }
    }
  }
}

// γ_n = n·u / (1 - n·u), u = 2^-24: the bound on the relative error of a sum of n fp32 products.
double gamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

// The few-row products of decode shapes against float64: S = Q·Kᵀ (up to 4 rows with D in the
// lanes, more with the rows in the lanes) and O += P·V, for rows 1-9, keys 1-37, head dims with
// and without a tail, K and V rows further apart than D, K and V in fp32, bf16 and fp16 (the
// reference takes their exact fp32 values); every ISA the CPU runs. Each element within the
// summation bound γ_n·Σ|a·b| (n the products summed, u = 2^-24), beside the accumulated O's own
// rounding for P·V.
TEST(Simd, SmallProductsWithinSummationBound) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::pair<simd::KvType, DType> types[] = {{simd::KvType::kF32, DType::kF32},
                                                  {simd::KvType::kBF16, DType::kBF16},
                                                  {simd::KvType::kF16, DType::kF16}};
  for (simd::Isa isa : cpu_isas())
    for (auto [kt, dtype] : types) {
      const simd::Kernels& kern = simd::kernels(isa);
      for (int64_t d : {8, 16, 40, 64, 128})
        for (int64_t rows = 1; rows <= 9; ++rows)
          for (int64_t n : {1, 3, 4, 5, 17, 37}) {
            const int64_t ld = d + 5, rp = simd::round_up_row(rows), ld_s = simd::round_up_row(n);
            std::vector<float> q(rows * d), qt(d * rp, 0.f), k(n * ld), v(n * ld), p(rows * ld_s);
            for (float& x : q) x = nd(rng);
            for (float& x : k) x = nd(rng);
            for (float& x : v) x = nd(rng);
            for (float& x : p) x = std::fabs(nd(rng));
            // K and V as the kernel reads them, and their exact values for the reference.
            const Tensor k16 = Tensor::borrow(k.data(), {n * ld}, DType::kF32).to(dtype);
            const Tensor v16 = Tensor::borrow(v.data(), {n * ld}, DType::kF32).to(dtype);
            for (int64_t i = 0; i < n * ld; ++i) {
              k[i] = k16.at(i);
              v[i] = v16.at(i);
            }
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < d; ++c) qt[c * rp + r] = q[r * d + c];
            std::vector<float> sc(rows * ld_s, -7.f), o(rows * d);
            for (float& x : o) x = nd(rng);
            const std::vector<float> o0 = o;
            kern.small_qk(q.data(), qt.data(), rp, rows, k16.raw(), kt, ld, n, d, sc.data(), ld_s);
            kern.small_pv(p.data(), ld_s, rows, v16.raw(), kt, ld, n, d, o.data());
            const std::string what = std::string(simd::isa_name(isa)) + " " +
                                     std::string(dtype_name(dtype)) + " d " + std::to_string(d) +
                                     " rows " + std::to_string(rows) + " n " + std::to_string(n);
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < n; ++j) {
                double want = 0, mag = 0;
                for (int64_t c = 0; c < d; ++c) {
                  want += double(q[r * d + c]) * k[j * ld + c];
                  mag += std::fabs(double(q[r * d + c]) * k[j * ld + c]);
                }
                ASSERT_LE(std::fabs(sc[r * ld_s + j] - want), gamma(d) * mag) << what << " S " << r;
              }
              for (int64_t c = 0; c < d; ++c) {
                double want = o0[r * d + c], mag = std::fabs(o0[r * d + c]);
                for (int64_t j = 0; j < n; ++j) {
                  want += double(p[r * ld_s + j]) * v[j * ld + c];
                  mag += std::fabs(double(p[r * ld_s + j]) * v[j * ld + c]);
                }
                ASSERT_LE(std::fabs(o[r * d + c] - want), gamma(n + 1) * mag) << what << " O " << r;
              }
            }
          }
    }
}

// The panel products of query tiles against float64: S = Q·Kᵀ from K packed transposed and
// O += P·V from V packed, for rows 1-13 (tiles of 6 and their tails), keys and head dims with and
// without a partial last panel, K and V rows further apart than D, every ISA the CPU runs. Each
// element within γ_n·Σ|a·b| (S), and γ_(n+1)·(Σ|p·v| + |O|) for O (the sum, then its addition);
// C's columns past cols (the score row's padding) are never written.
TEST(Simd, PanelProductsWithinSummationBound) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (simd::Isa isa : cpu_isas()) {
    const simd::Kernels& kern = simd::kernels(isa);
    const int64_t w = kern.panel_width;
    for (int64_t d : {1, 8, 40, 72, 128})
      for (int64_t rows : {1, 5, 6, 7, 13})
        for (int64_t n : {1, 15, 16, 17, 37, 300}) {
          const int64_t ld = d + 3, ld_s = simd::round_up_row(n) + 16;
          const int64_t np = (n + w - 1) / w, dp = (d + w - 1) / w;
          std::vector<float> q(rows * d), k(n * ld), v(n * ld), p(rows * ld_s);
          for (float& x : q) x = nd(rng);
          for (float& x : k) x = nd(rng);
          for (float& x : v) x = nd(rng);
          for (float& x : p) x = std::fabs(nd(rng));
          std::vector<float> kp(np * w * d, -1.f), vp(n * dp * w, -1.f);
          kern.pack_panels_t(k.data(), ld, d, n, kp.data());
          kern.pack_panels(v.data(), ld, n, d, vp.data());
          std::vector<float> sc(rows * ld_s, -7.f), o(rows * (d + 2));
          for (float& x : o) x = nd(rng);
          const std::vector<float> o0 = o;
          kern.panel_product(q.data(), d, rows, kp.data(), d, d * w, n, sc.data(), ld_s, false);
          kern.panel_product(p.data(), ld_s, rows, vp.data(), n, n * w, d, o.data(), d + 2, true);
          const std::string what = std::string(simd::isa_name(isa)) + " d " + std::to_string(d) +
                                   " rows " + std::to_string(rows) + " n " + std::to_string(n);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < ld_s; ++j) {
              if (j >= n) {
                ASSERT_EQ(sc[r * ld_s + j], -7.f) << what << " S written past n at " << r;
                continue;
              }
              double want = 0, mag = 0;
              for (int64_t c = 0; c < d; ++c) {
                want += double(q[r * d + c]) * k[j * ld + c];
                mag += std::fabs(double(q[r * d + c]) * k[j * ld + c]);
              }
              ASSERT_LE(std::fabs(sc[r * ld_s + j] - want), gamma(d) * mag) << what << " S " << r;
            }
            for (int64_t c = 0; c < d + 2; ++c) {
              const int64_t at = r * (d + 2) + c;
              if (c >= d) {
                ASSERT_EQ(o[at], o0[at]) << what << " O written past d at " << r;
                continue;
              }
              double want = o0[at], mag = std::fabs(o0[at]);
              for (int64_t j = 0; j < n; ++j) {
                want += double(p[r * ld_s + j]) * v[j * ld + c];
                mag += std::fabs(double(p[r * ld_s + j]) * v[j * ld + c]);
              }
              ASSERT_LE(std::fabs(o[at] - want), gamma(n + 1) * mag) << what << " O " << r;
            }
          }
        }
  }
}

TEST(Simd, RowUpdateRescalesWhenTheMaxMovesFar) {
  // Two blocks for one row: the second block's max is 20 (log2 units) above the first's, so the
  // stale max must move and the accumulator be rescaled; the result equals exact softmax.
  for (simd::Isa isa : cpu_isas()) {
    const simd::Kernels& k = simd::kernels(isa);
    const float c = 1.f;  // scores already in log2 units
    std::vector<float> s1(32, -kInf), s2(32, -kInf);
    for (int j = 0; j < 20; ++j) s1[j] = 0.1f * j;
    for (int j = 3; j < 13; ++j) s2[j] = 20.f + 0.2f * j;
    float m = -kInf;
    double l = 0;
    float o[3] = {0, 0, 0};
    k.row_update_deg5(s1.data(), 0, 20, 20, c, &m, &l, o, 3);
    double o_ref = 0, l_ref = 0;
    for (int j = 0; j < 20; ++j) {  // o accumulates p_j · v_j with v_j = 1
      o[0] += s1[j];
      o_ref += std::exp2(0.1 * j);
      l_ref += std::exp2(0.1 * j);
    }
    k.row_update_deg5(s2.data(), 3, 13, 20, c, &m, &l, o, 3);
    for (int j = 3; j < 13; ++j) {
      o[0] += s2[j];
      o_ref += std::exp2(20 + 0.2 * j);
      l_ref += std::exp2(20 + 0.2 * j);
    }
    for (int j = 0; j < 20; ++j) {
      if (j < 3 || j >= 13) {
        EXPECT_EQ(s2[j], 0.f) << j;  // outside the run: p = 0
      }
    }
    const double lse = m + std::log2(l), lse_ref = std::log2(l_ref);
    EXPECT_NEAR(lse, lse_ref, 1e-5) << simd::isa_name(isa);
    EXPECT_NEAR(o[0] / l, o_ref / l_ref, 1e-6) << simd::isa_name(isa);
    EXPECT_GE(m, 20.f);  // moved
  }
}

// The bf16 row update against the fp32 one of the same variant: the same running max and sum, and
// each probability the fp32 one rounded to bf16 (to nearest even), for rows whose probabilities
// span 2^-140 to 2^8 (the stale max's slack), with masked margins of every width. The one allowed
// difference: where the variant rounds with AVX512_BF16 (p_rounded_by_avx512_bf16), probabilities
// below 2^-126 (fp32 denormals) become 0 rather than bf16 denormals.
TEST(Simd, RowUpdateBF16RoundsTheFp32Probabilities) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> score(-140.f, 0.f);
  int denormals = 0;
  for (simd::Isa isa : cpu_isas()) {
    const simd::Kernels& k = simd::kernels(isa);
    for (int64_t n : {1, 7, 16, 33, 256}) {
      for (int rep = 0; rep < 6; ++rep) {
        const int64_t cap = simd::round_up_row(n);
        const int64_t lo = rep == 0 ? 0 : static_cast<int64_t>(rng() % n);
        const int64_t hi = rep == 0 ? n : lo + 1 + static_cast<int64_t>(rng() % (n - lo));
        std::vector<float> s(cap, 0.f);
        for (int64_t j = 0; j < n; ++j) s[j] = score(rng);
        s[lo] = 0.f;  // the block's max; an earlier max 8 above it keeps it (stale)
        std::vector<float> s32 = s, s16 = s;
        std::vector<uint16_t> p16(cap, 0xffff);
        float m32 = -8.f, m16 = -8.f;
        double l32 = 1, l16 = 1;
        float o32[3] = {1, 2, 3}, o16[3] = {1, 2, 3};
        k.row_update_deg3(s32.data(), lo, hi, n, 1.f, &m32, &l32, o32, 3);
        k.row_update_bf16_deg3(s16.data(), p16.data(), lo, hi, n, 1.f, &m16, &l16, o16, 3);
        const std::string what = std::string(simd::isa_name(isa)) + " n " + std::to_string(n) +
                                 " [" + std::to_string(lo) + ", " + std::to_string(hi) + ")";
        EXPECT_EQ(m16, m32) << what;
        EXPECT_EQ(l16, l32) << what;
        for (int i = 0; i < 3; ++i) EXPECT_EQ(o16[i], o32[i]) << what;
        for (int64_t j = 0; j < n; ++j) {
          const bool denormal = s32[j] != 0.f && std::fabs(s32[j]) < 0x1p-126f;
          denormals += denormal;
          const uint16_t want =
              denormal && k.p_rounded_by_avx512_bf16 ? uint16_t{0} : f32_to_bf16(s32[j]);
          ASSERT_EQ(p16[j], want) << what << " at " << j << ": p " << s32[j];
        }
      }
    }
  }
  EXPECT_GT(denormals, 0);  // the rows reach below 2^-126
}

// ---- visible_score_elements ----------------------------------------------------------------

int64_t brute_visible(int64_t b, int64_t h, int64_t sq, int64_t sk, const MaskSpec& m) {
  int64_t n = 0;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t j = 0; j < sk; ++j) {
        const int64_t qp = m.q_pos.empty() ? i : m.q_pos[i];
        const int64_t kp = m.k_pos.empty() ? j : m.k_pos[j];
        if (m.causal && kp > qp) continue;
        if (!m.k_valid.empty() && !m.k_valid[bi * sk + j]) continue;
        if (!m.q_segment.empty() && m.q_segment[i] != m.k_segment[j]) continue;
        ++n;
      }
    }
  }
  return n * h;
}

TEST(VisibleScoreElements, MatchesBruteForce) {
  int checked = 0;
  for (Layout l : {Layout::kContiguous, Layout::kStriped, Layout::kZigzag, Layout::kShuffled}) {
    for (bool causal : {false, true}) {
      for (bool padding : {false, true}) {
        for (bool segments : {false, true}) {
          for (auto [sq, sk] : {std::pair<int64_t, int64_t>{37, 37}, {20, 53}, {1, 9}}) {
            Case c;
            c.b = 3;
            c.sq = sq;
            c.sk = sk;
            c.h = 2;
            c.hkv = 1;
            c.d = 4;
            c.layout = l;
            c.causal = causal;
            c.padding = padding;
            c.segments = segments;
            const Inputs in = make_inputs(c, 17 + checked);
            EXPECT_EQ(visible_score_elements(3, 2, sq, sk, in.params.mask),
                      brute_visible(3, 2, sq, sk, in.params.mask))
                << auto_name(c);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(visible_score_elements(2, 3, 0, 5, {}), 0);
  EXPECT_EQ(visible_score_elements(2, 3, 4, 5, {}), 2 * 3 * 4 * 5);
}

// Counts at a million tokens a side, checked against closed forms. (A loop over every pair would
// not finish within ctest's timeout; the test judges the counts only.)
TEST(VisibleScoreElements, MillionTokenShardsCountExactly) {
  const int64_t s = 1 << 20;
  MaskSpec m;
  m.causal = true;
  EXPECT_EQ(visible_score_elements(1, 2, s, s, m), 2 * s * (s + 1) / 2);
  // Striped shards: queries of rank 1, keys of rank 2 of 4: query i sees keys 0..i-1.
  std::vector<int64_t> qpos(s), kpos(s);
  for (int64_t i = 0; i < s; ++i) {
    qpos[i] = 4 * i + 1;
    kpos[i] = 4 * i + 2;
  }
  m.q_pos = qpos;
  m.k_pos = kpos;
  EXPECT_EQ(visible_score_elements(1, 1, s, s, m), s * (s - 1) / 2);
  // Unsorted positions: a permutation of 0..s-1 on both sides, causal: s(s+1)/2 again.
  std::vector<int64_t> perm(s);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(5));
  m.q_pos = perm;
  m.k_pos = perm;
  EXPECT_EQ(visible_score_elements(1, 1, s, s, m), s * (s + 1) / 2);
}

// ---- fixed row maximum (const-max softmax) ------------------------------------------------

// Cauchy–Schwarz bounds (B, Sq, H): scale·|q|·max_j |k_j| of the row's kv head, plus `offset`.
std::vector<float> norm_bounds(const Inputs& in, float offset = 0.f) {
  const int64_t b = in.q.dim(0), sq = in.q.dim(1), h = in.q.dim(2), d = in.q.dim(3);
  const int64_t sk = in.k.dim(1), hkv = in.k.dim(2);
  const double scale = in.params.scale != 0.f ? in.params.scale : 1.0 / std::sqrt(double(d));
  auto norm = [&](const Tensor& t, int64_t off) {
    double x = 0;
    for (int64_t e = 0; e < d; ++e) x += double(t.at(off + e)) * t.at(off + e);
    return std::sqrt(x);
  };
  std::vector<float> bound(static_cast<size_t>(b * sq * h));
  for (int64_t bi = 0; bi < b; ++bi) {
    std::vector<double> kmax(static_cast<size_t>(hkv), 0.0);
    for (int64_t j = 0; j < sk; ++j)
      for (int64_t hk = 0; hk < hkv; ++hk)
        kmax[hk] = std::max(kmax[hk], norm(in.k, ((bi * sk + j) * hkv + hk) * d));
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t hh = 0; hh < h; ++hh) {
        const int64_t row = (bi * sq + i) * h + hh;
        bound[row] =
            static_cast<float>(scale * norm(in.q, row * d) * kmax[hh / (h / hkv)]) + offset;
      }
  }
  return bound;
}

// The max the kernel applies for a bound (fp32 in log2 units), in natural log.
double applied_max(float bound) {
  return double(float(bound * 1.44269504088896340736)) * 0.6931471805599453;
}

struct FixedRun {
  AttnState state;
  std::vector<float> sum;
  std::vector<uint8_t> flags;
};

FixedRun run_fixed(const Inputs& in, const std::vector<float>& bound) {
  FixedRun r;
  r.sum.assign(bound.size(), -1.f);  // the kernel must overwrite every entry
  r.flags.assign(bound.size(), 0xff);
  AttnParams params = in.params;
  params.row_max = bound;
  params.row_sum = r.sum;
  params.row_flags = r.flags;
  r.state = flash_attention(in.q, in.k, in.v, params);
  return r;
}

std::vector<Case> fixed_max_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) { add_named(cases, std::move(c)); };
  for (bool causal : {false, true}) {
    Case c;
    c.b = 2;
    c.sq = 300;
    c.h = 6;
    c.hkv = 2;
    c.causal = causal;
    c.bq = 64;
    c.bk = 96;
    add(c);
    c.layout = Layout::kZigzag;  // a ring step: rows that see nothing in this block
    add(c);
    c.layout = Layout::kContiguous;
    c.padding = true;  // includes a fully padded batch row
    c.b = 3;
    add(c);
  }
  Case c;
  c.sq = 200;
  c.sk = 333;
  c.d = 128;
  c.dtype = DType::kBF16;
  c.causal = true;
  add(c);
  c.dtype = DType::kF32;
  c.q_scale = 2.f;  // larger logits (norm bounds of random vectors grow with them, see below)
  add(c);
  c.q_scale = 1.f;
  c.layout = Layout::kShuffled;  // the general mask path
  add(c);
  return cases;
}

TEST(FlashFixedMax, MatchesReferenceWithNormBounds) {
  for (const Case& c : fixed_max_cases()) {
    const Inputs in = make_inputs(c);
    const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
    const std::vector<float> bound = norm_bounds(in);
    const FixedRun got = run_fixed(in, bound);
    expect_matches_reference(c, in, got.state, want);
    int64_t checked = 0;
    for (size_t i = 0; i < bound.size(); ++i) {
      const float wl = want.lse.at(static_cast<int64_t>(i));
      if (wl == -kInf) {  // saw no key: sum 0, flagged loose (there is nothing to be exact about)
        EXPECT_EQ(got.sum[i], 0.f) << c.name << " row " << i;
        EXPECT_EQ(got.flags[i], AttnParams::kRowMaxLoose) << c.name << " row " << i;
        continue;
      }
      ++checked;
      EXPECT_EQ(got.flags[i], 0) << c.name << " row " << i;
      // row_sum = Σ exp(s − M) = exp(lse − M), relative to the max the kernel applied.
      const double want_sum = std::exp(double(wl) - applied_max(bound[i]));
      EXPECT_NEAR(got.sum[i] / want_sum, 1.0, 10 * tolerance(c, in).lse) << c.name << " row " << i;
    }
    EXPECT_GT(checked, 0) << c.name;
  }
}

TEST(FlashFixedMax, SumsOverKeyHalvesAddWithoutRescaling) {
  // Two calls over disjoint key halves with the same bounds: O = out1·l1 + out2·l2 and
  // l = l1 + l2 give the attention over all keys (what a const-max ring does).
  Case c;
  c.b = 2;
  c.sq = 150;
  c.sk = 260;
  c.h = 4;
  c.hkv = 2;
  c.causal = true;
  c.name = auto_name(c);
  const Inputs in = make_inputs(c);
  const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
  const std::vector<float> bound = norm_bounds(in);
  const int64_t d = c.d, half = 130, rows = c.b * c.sq * c.h;
  std::vector<int64_t> kpos(c.sk);
  std::iota(kpos.begin(), kpos.end(), 0);
  std::vector<FixedRun> parts;
  for (int part = 0; part < 2; ++part) {
    Inputs sub = in;
    const int64_t k0 = part * half, nk = part == 0 ? half : c.sk - half;
    sub.k = Tensor({c.b, nk, c.hkv, d});
    sub.v = Tensor({c.b, nk, c.hkv, d});
    for (int64_t bi = 0; bi < c.b; ++bi) {
      const size_t row = c.hkv * d * sizeof(float);
      std::memcpy(sub.k.data<float>() + bi * nk * c.hkv * d,
                  in.k.data<float>() + (bi * c.sk + k0) * c.hkv * d, nk * row);
      std::memcpy(sub.v.data<float>() + bi * nk * c.hkv * d,
                  in.v.data<float>() + (bi * c.sk + k0) * c.hkv * d, nk * row);
    }
    sub.k_pos.assign(kpos.begin() + k0, kpos.begin() + k0 + nk);
    sub.params.mask.k_pos = sub.k_pos;
    sub.params.mask.q_pos = sub.q_pos;
    parts.push_back(run_fixed(sub, bound));
  }
  double err_out = 0, err_lse = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double l = double(parts[0].sum[i]) + parts[1].sum[i];
    ASSERT_GT(l, 0) << i;
    for (int64_t x = 0; x < d; ++x) {
      const double o = double(parts[0].state.out.at(i * d + x)) * parts[0].sum[i] +
                       double(parts[1].state.out.at(i * d + x)) * parts[1].sum[i];
      err_out = std::max(err_out, std::fabs(o / l - want.out.at(i * d + x)));
    }
    err_lse = std::max(err_lse, std::fabs(applied_max(bound[i]) + std::log(l) - want.lse.at(i)));
  }
  EXPECT_LE(err_out, 1e-4);
  EXPECT_LE(err_lse, 1e-4);
}

TEST(FlashFixedMax, LooseBoundsAreFlagged) {
  Case c;
  c.b = 2;
  c.sq = 100;
  c.h = 4;
  c.hkv = 2;
  c.causal = true;
  c.name = auto_name(c);
  const Inputs in = make_inputs(c);
  const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
  auto above_lse = [&](float x) {  // bounds x above each row's log-sum-exp (>= its max)
    std::vector<float> b(static_cast<size_t>(want.lse.numel()));
    for (size_t i = 0; i < b.size(); ++i) b[i] = want.lse.at(static_cast<int64_t>(i)) + x;
    return b;
  };
  // 40 above: beyond the loose limit, yet the sums stay far above fp32's underflow (exp(-87)),
  // so the result is still right; flagged.
  FixedRun got = run_fixed(in, above_lse(40.f));
  expect_matches_reference(c, in, got.state, want);
  for (uint8_t f : got.flags) EXPECT_EQ(f, AttnParams::kRowMaxLoose);
  // 200 above: every term underflows to 0 (the row comes out empty); flagged, never NaN.
  got = run_fixed(in, above_lse(200.f));
  for (uint8_t f : got.flags) EXPECT_EQ(f, AttnParams::kRowMaxLoose);
  for (float s : got.sum) EXPECT_EQ(s, 0.f);
  for (int64_t i = 0; i < got.state.out.numel(); ++i) EXPECT_FALSE(std::isnan(got.state.out.at(i)));
  // Within the limit (25 above): not flagged.
  got = run_fixed(in, above_lse(25.f));
  expect_matches_reference(c, in, got.state, want);
  for (uint8_t f : got.flags) EXPECT_EQ(f, 0);
}

TEST(FlashFixedMax, ExceededBoundsAreFlaggedAndStillRight) {
  Case c;
  c.b = 1;
  c.sq = 300;
  c.h = 4;
  c.hkv = 4;
  c.q_scale = 4.f;  // logits up to ~±30
  c.bk = 64;
  c.name = auto_name(c);
  const Inputs in = make_inputs(c);
  const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
  // A "bound" far below the logits: the kernel moves the max (online) and flags every row.
  std::vector<float> low(static_cast<size_t>(c.sq * c.h), -50.f);
  FixedRun got = run_fixed(in, low);
  expect_matches_reference(c, in, got.state, want);
  for (uint8_t f : got.flags)
    EXPECT_EQ(f & AttnParams::kRowMaxExceeded, AttnParams::kRowMaxExceeded);
  // Slightly below the true row max (by 1, within the stale-max slack of 2^8): no flag, and the
  // sums are still relative to the given bound.
  std::vector<float> tight(low.size());
  for (size_t i = 0; i < tight.size(); ++i) {
    double mx = -1e30;
    const int64_t row = static_cast<int64_t>(i), d = c.d;
    for (int64_t j = 0; j < c.sq; ++j) {
      double s = 0;
      for (int64_t x = 0; x < d; ++x)
        s += double(in.q.at(row * d + x)) * in.k.at((j * c.hkv + row % c.h) * d + x);
      mx = std::max(mx, s / std::sqrt(double(d)));
    }
    tight[i] = static_cast<float>(mx - 1.0);
  }
  got = run_fixed(in, tight);
  expect_matches_reference(c, in, got.state, want);
  for (size_t i = 0; i < tight.size(); ++i) {
    EXPECT_EQ(got.flags[i], 0) << i;
    const double want_sum = std::exp(double(want.lse.at(i)) - applied_max(tight[i]));
    EXPECT_NEAR(got.sum[i] / want_sum, 1.0, 1e-4) << i;
  }
}

TEST(FlashFixedMax, NonFiniteEntriesRunOnlineBitwise) {
  Case c;
  c.b = 2;
  c.sq = 200;
  c.h = 4;
  c.hkv = 1;
  c.causal = true;
  c.name = auto_name(c);
  const Inputs in = make_inputs(c);
  const AttnState online = flash_attention(in.q, in.k, in.v, in.params);
  std::vector<float> bound = norm_bounds(in);
  for (size_t i = 0; i < bound.size(); i += 3) bound[i] = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 1; i < bound.size(); i += 7) bound[i] = kInf;
  const FixedRun got = run_fixed(in, bound);
  expect_matches_reference(c, in, got.state, reference_attention(in.q, in.k, in.v, in.params));
  const int64_t d = c.d;
  for (size_t i = 0; i < bound.size(); ++i) {
    if (std::isfinite(bound[i])) continue;
    EXPECT_EQ(got.flags[i], 0) << i;
    EXPECT_EQ(got.sum[i], 0.f) << i;
    EXPECT_EQ(std::memcmp(got.state.out.data<float>() + i * d, online.out.data<float>() + i * d,
                          d * sizeof(float)),
              0)
        << i;
    EXPECT_EQ(got.state.lse.at(i), online.lse.at(i)) << i;
  }
}

TEST(FlashFixedMax, KeySplitAcrossThreads) {
  const int saved = omp_get_max_threads();
  Case c;
  c.sq = 3;
  c.sk = 2000;
  c.h = 2;
  c.hkv = 1;
  c.causal = true;
  c.bk = 128;
  c.name = auto_name(c);
  const Inputs in = make_inputs(c);
  const AttnState want = reference_attention(in.q, in.k, in.v, in.params);
  const std::vector<float> bound = norm_bounds(in);
  for (int threads : {1, 4}) {
    omp_set_num_threads(threads);
    const FixedRun got = run_fixed(in, bound);
    expect_matches_reference(c, in, got.state, want);
    for (size_t i = 0; i < bound.size(); ++i) {
      EXPECT_EQ(got.flags[i], 0) << i;
      const double want_sum = std::exp(double(want.lse.at(i)) - applied_max(bound[i]));
      EXPECT_NEAR(got.sum[i] / want_sum, 1.0, 1e-4) << threads << " threads, row " << i;
    }
  }
  omp_set_num_threads(saved);
}

TEST(FlashFixedMax, ArgumentChecks) {
  Case c;
  c.sq = 16;
  const Inputs in = make_inputs(c);
  std::vector<float> short_bounds(5, 1.f), sums(16 * 4);
  std::vector<uint8_t> flags(16 * 4);
  AttnParams p = in.params;
  p.row_max = short_bounds;
  EXPECT_THROW(flash_attention(in.q, in.k, in.v, p), InvalidArgument);
  p = in.params;
  p.row_sum = sums;  // outputs need row_max
  EXPECT_THROW(flash_attention(in.q, in.k, in.v, p), InvalidArgument);
  p = in.params;
  p.row_flags = flags;
  EXPECT_THROW(flash_attention(in.q, in.k, in.v, p), InvalidArgument);
}

}  // namespace
}  // namespace seqpar
