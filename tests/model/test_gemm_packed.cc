// fp32 activations times a narrower weight made fp32 in the packing step (src/model/gemm_packed.h):
// - the portable reference stays within γ_(k+1)·(Σ|x·ŵ| + |b|) of the float64 sum, ŵ computed
//   here from each kind's definition (bf16: the upper 16 bits of an fp32; fp16: its value;
//   per-channel int8: fl(s·q); Q8_0: fl(d·q) with the block's fp16 scale);
// - the AVX2 and AVX-512 variants give the reference's bits (each where the CPU runs it), on 1 to 3
//   threads, over a sweep of rows (partial tiles of 6 and 12, blocks of 256), inputs (tails past
//   the last 8, passes of 512), outputs (partial panels of 16 and 32, blocks of 128), with and
//   without bias, into a wider row stride (the columns past n untouched);
// - linear() takes it past its few-row products wherever gemm_packed() names it (and `seqpar
//   info` says which), and is within the same bound on every path (SEQPAR_KERNEL_ISA=scalar: oneDNN
//   on converted blocks, tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gemm_packed.h"
#include "seqpar/core/cpu_isa.h"
#include "seqpar/core/dtype.h"
#include "seqpar/core/tensor.h"
#include "seqpar/model/ops.h"
#include "simd_ops.h"

namespace seqpar::model_simd {
namespace {

using Kind = PackedWeight::Kind;
constexpr Kind kKinds[] = {Kind::kBF16, Kind::kF16, Kind::kI8Channel, Kind::kQ8};
const char* kind_name(Kind kind) {
  return kind == Kind::kBF16        ? "bf16"
         : kind == Kind::kF16       ? "fp16"
         : kind == Kind::kI8Channel ? "int8 per channel"
                                    : "Q8_0";
}

// A weight of each kind with its values ŵ from the definition (in float64, each exact in fp32).
struct Weight {
  Kind kind;
  int64_t n, k;
  std::vector<uint16_t> w16, scale16;
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<double> values;  // ŵ (n, k)
  PackedWeight view() const {
    const bool int8 = kind == Kind::kI8Channel || kind == Kind::kQ8;
    return {kind, int8 ? static_cast<const void*>(q.data()) : w16.data(),
            kind == Kind::kQ8          ? static_cast<const void*>(scale16.data())
            : kind == Kind::kI8Channel ? static_cast<const void*>(s.data())
                                       : nullptr,
            n, k};
  }
};

Weight make_weight(Kind kind, int64_t n, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::uniform_int_distribution<int> qd(-128, 127);
  Weight w{kind, n, k, {}, {}, {}, {}, std::vector<double>(static_cast<size_t>(n * k))};
  if (kind == Kind::kBF16 || kind == Kind::kF16) {
    w.w16.resize(static_cast<size_t>(n * k));
    for (int64_t i = 0; i < n * k; ++i) {
      const float v = dist(rng) * (i % 7 == 0 ? 50.f : 1.f);
      if (kind == Kind::kBF16) {
        w.w16[i] = f32_to_bf16(v);
        const uint32_t bits = uint32_t{w.w16[i]} << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        w.values[i] = f;
      } else {
        w.w16[i] = f32_to_f16(v);
        w.values[i] = f16_to_f32(w.w16[i]);
      }
    }
    return w;
  }
  w.q.resize(static_cast<size_t>(n * k));
  for (int8_t& v : w.q) v = static_cast<int8_t>(qd(rng));
  if (kind == Kind::kI8Channel) {
    w.s.resize(static_cast<size_t>(n));
    for (float& v : w.s) v = std::exp(dist(rng)) / 127.f;
    for (int64_t i = 0; i < n * k; ++i)
      w.values[i] = w.s[i / k] * static_cast<float>(w.q[i]);  // fl(s·q): one fp32 rounding
    return w;
  }
  w.scale16.resize(static_cast<size_t>(n * k / kQ8Block));
  for (uint16_t& v : w.scale16) v = f32_to_f16(std::exp(dist(rng)) / 127.f);
  for (int64_t i = 0; i < n * k; ++i)
    w.values[i] = f16_to_f32(w.scale16[i / kQ8Block]) * static_cast<float>(w.q[i]);
  return w;
}

std::vector<float> rows_of_x(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) x[i] = dist(rng) * static_cast<float>(1 + (i / k) % 4);
  return x;
}

std::vector<float> biases(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> b(static_cast<size_t>(n));
  for (float& v : b) v = 4.f * dist(rng);
  return b;
}

// y (row stride ldy) within γ_(k+1)·(Σ|x·ŵ| + |b|) of the float64 sum.
void expect_within_bound(const std::vector<float>& x, int64_t m, const Weight& w, const float* bias,
                         const float* y, int64_t ldy, const char* what) {
  const double u = std::ldexp(1.0, -24), d = static_cast<double>(w.k + 1), g = d * u / (1 - d * u);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < w.n; ++j) {
      double exact = bias ? bias[j] : 0.0, mag = bias ? std::fabs(bias[j]) : 0.0;
      for (int64_t i = 0; i < w.k; ++i) {
        const double p = double{x[r * w.k + i]} * w.values[j * w.k + i];
        exact += p;
        mag += std::fabs(p);
      }
      ASSERT_LE(std::fabs(y[r * ldy + j] - exact), g * mag)
          << what << " " << kind_name(w.kind) << ": m " << m << " k " << w.k << " n " << w.n
          << " at (" << r << ", " << j << ")";
    }
}

TEST(GemmPacked, ReferenceWithinTheBoundOfFloat64) {
  std::mt19937 rng(3);
  for (const Kind kind : kKinds)
    for (const int64_t k : {32, 96, 1056})
      for (const int64_t m : {1, 7})
        for (const int64_t n : {1, 17}) {
          const Weight w = make_weight(kind, n, k, rng);
          const std::vector<float> x = rows_of_x(m, k, rng), b = biases(n, rng);
          const float* bias = (m + n) % 2 == 0 ? b.data() : nullptr;
          std::vector<float> y(static_cast<size_t>(m * n));
          gemm_packed_scalar(x.data(), m, w.view(), bias, y.data(), n);
          expect_within_bound(x, m, w, bias, y.data(), n, "reference");
        }
}

TEST(GemmPacked, VariantsGiveTheReferencesBits) {
  std::printf("fp32 activations x narrow weights past the few rows: %s\n", gemm_packed_path());
  struct Variant {
    Isa isa;
    GemmPacked gemm;
  };
  std::vector<Variant> variants;
  for (const Variant v :
       {Variant{Isa::kAvx2, &gemm_packed_avx2}, Variant{Isa::kAvx512, &gemm_packed_avx512}}) {
    if (cpu_has(v.isa))
      variants.push_back(v);
    else
      std::printf("  %s: not on this CPU, not run\n", std::string(isa_name(v.isa)).c_str());
  }
  if (variants.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(11);
  const int saved = omp_get_max_threads();
  // (m, k, n): tiles of 6 (AVX2) and 12 rows (AVX-512) and their remainders, a block of 256 rows
  // and one past it; inputs in tails of 1..7 past a multiple of 8, one pass of 512 and a partial
  // second; panels of 16 and 32 columns, partial panels, a block of 128 columns and one past it.
  struct Shape {
    int64_t m, k, n;
  };
  std::vector<Shape> shapes;
  for (const int64_t m : {1, 5, 6, 7, 12, 13, 25})
    for (const int64_t k : {1, 7, 8, 9, 32, 33, 100})
      for (const int64_t n : {1, 15, 16, 17, 31, 32, 33, 65}) shapes.push_back({m, k, n});
  for (const Shape s : {Shape{257, 64, 40}, Shape{20, 520, 150}, Shape{70, 1030, 130},
                        Shape{300, 96, 300}, Shape{12, 2048, 256}})
    shapes.push_back(s);
  for (const Variant& v : variants)
    for (const Kind kind : kKinds)
      for (const Shape& s : shapes) {
        const int64_t k = kind == Kind::kQ8 ? (s.k + kQ8Block - 1) / kQ8Block * kQ8Block : s.k;
        const Weight w = make_weight(kind, s.n, k, rng);
        const std::vector<float> x = rows_of_x(s.m, k, rng), b = biases(s.n, rng);
        const float* bias = (s.m + s.n + k) % 2 == 0 ? b.data() : nullptr;
        const int64_t ldy = s.n + 3;
        std::vector<float> want(static_cast<size_t>(s.m * ldy), -1.f);
        gemm_packed_scalar(x.data(), s.m, w.view(), bias, want.data(), ldy);
        for (int threads = 1; threads <= 3; ++threads) {
          omp_set_num_threads(threads);
          std::vector<float> got(static_cast<size_t>(s.m * ldy), -1.f);
          v.gemm(x.data(), s.m, w.view(), bias, got.data(), ldy);
          ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << isa_name(v.isa) << " " << kind_name(kind) << ": m " << s.m << " k " << k << " n "
              << s.n << " threads " << threads;
        }
      }
  omp_set_num_threads(saved);
}

// linear() past its few-row products (65, 300 and 512 rows; Q8_0 from 33): gemm_packed()'s bits
// where it names a variant, and within the bound on every path (oneDNN's from 513 rows).
TEST(GemmPacked, LinearTakesItPastTheFewRows) {
  std::mt19937 rng(23);
  const int64_t k = 160, n = 70;
  for (const Kind kind : kKinds) {
    const Weight w = make_weight(kind, n, k, rng);
    Tensor wt, scale;
    if (kind == Kind::kBF16 || kind == Kind::kF16) {
      wt = Tensor({n, k}, kind == Kind::kBF16 ? DType::kBF16 : DType::kF16);
      std::memcpy(wt.raw(), w.w16.data(), w.w16.size() * 2);
    } else {
      wt = Tensor({n, k}, DType::kI8);
      std::memcpy(wt.raw(), w.q.data(), w.q.size());
      if (kind == Kind::kQ8) {
        scale = Tensor({n, k / kQ8Block}, DType::kF16);
        std::memcpy(scale.raw(), w.scale16.data(), w.scale16.size() * 2);
      } else {
        scale = Tensor({n});
        std::memcpy(scale.raw(), w.s.data(), w.s.size() * 4);
      }
    }
    const std::vector<float> b = biases(n, rng);
    Tensor bias({n});
    std::memcpy(bias.raw(), b.data(), b.size() * 4);
    for (const int64_t m : {33, 65, 300, 512, 513}) {
      if (m == 33 && kind != Kind::kQ8) continue;
      const std::vector<float> x = rows_of_x(m, k, rng);
      Tensor xt({m, k});
      std::memcpy(xt.raw(), x.data(), x.size() * 4);
      const Tensor y = linear(xt, wt, bias, scale);
      expect_within_bound(x, m, w, b.data(), y.data<float>(), n, "linear");
      if (const GemmPacked packed = gemm_packed(); packed && m <= kPackedMaxRows) {
        std::vector<float> want(static_cast<size_t>(m * n));
        packed(x.data(), m, w.view(), b.data(), want.data(), n);
        EXPECT_EQ(0, std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)))
            << kind_name(kind) << " m " << m;
      }
    }
  }
  const std::string info = model_kernel_info();
  EXPECT_NE(info.find(std::string("many-row products ") + gemm_packed_path()), std::string::npos)
      << info;
}

}  // namespace
}  // namespace seqpar::model_simd
