// int8 activations times Q8_0 weights (src/model/gemm_q8.h), against float64:
// - every vector variant the CPU runs (AMX, AVX512-VNNI, AVX-VNNI, AVX2) gives the portable reference's
//   bits, on 1 to 3 threads, over a sweep of rows (padded panels; 300 x 2048 packed by the team),
//   inputs, outputs (partial tiles), biases, and weights of -128 and 127 beside activations of
//   ±127 (the largest sums, and AVX2's pairs of products at their largest);
// - linear() with int8 activations and a Q8_0 weight stays within its bound of the quantized
//   product, computed here from the definition: per block of 32, s = a / 127, q = x / s rounded
//   to nearest (ties to even) and clamped, then Σ_b d_b·s_b·Σ q_x·q_w + bias in float64; the bound
//   γ_(nb+2) on the int32 sums (gemm_q8.h); on the fp32 paths on x̂ = fl(s·q) (a few rows, or no
//   vector variant: SEQPAR_KERNEL_ISA=scalar shows it, tests/CMakeLists.txt) the Q8_0 decode
//   product's depth up to 32 rows and γ_(k+2) (oneDNN, any order) past them;
// - a row holding a NaN gives NaN; the result differs from fp32 activations';
// - every variant's int32 sums (per-channel int8 weights) equal the sums in int64, tails of
//   fewer than 32 inputs included, with the extreme values at the largest depth the tests run.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gemm_q8.h"
#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "seqpar/model/ops.h"
#include "simd_ops.h"

namespace seqpar::model_simd {
namespace {

constexpr double kU = 1.0 / (1 << 24);
double gamma(int64_t d) { return d * kU / (1 - d * kU); }

// Activations with a spread of magnitudes (an outlier column, rows of different scales, a zero
// block, exact ties x / s = n + 1/2).
std::vector<float> activations(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i)
    x[i] = dist(rng) * (i % k == 3 ? 30.f : 1.f) * static_cast<float>(1 + (i / k) % 5);
  if (k >= 64 && m > 1) std::fill_n(x.begin() + k + 32, 32, 0.f);  // row 1, block 1: zero
  if (m > 2) {  // row 2, block 0: max 127, so s = 1 and 2.5, -0.5 are ties
    float* r = x.data() + 2 * k;
    r[0] = 127.f;
    r[1] = 2.5f;
    r[2] = -0.5f;
  }
  return x;
}

// The int32 sums of every variant against Σ q_x·q_w in int64, straight from the unpacked values:
// k below one block, across block boundaries and with tails; rows in partial panels; outputs in
// partial tiles; 1 to 3 threads; every product at its extreme (127 · -128) in one output, and
// -127 · -128 over a depth of 16384 (a sum of 2.7e8: past 2^24, within int32).
TEST(GemmQ8, EveryVariantSumsExactly) {
  const std::vector<GemmQ8Variant> variants = gemm_q8_variants();
  if (variants.empty()) GTEST_SKIP() << "no vector variant runs on this CPU";
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> xd(-127, 127), wd(-128, 127);
  const int saved = omp_get_max_threads();
  auto check = [&](int64_t m, int64_t k, int64_t n, const std::vector<int8_t>& x,
                   const std::vector<int8_t>& w) {
    const int64_t ldy = n + 2;
    std::vector<int32_t> want(static_cast<size_t>(m * ldy), -7);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) {
        int64_t sum = 0;
        for (int64_t i = 0; i < k; ++i) sum += int64_t{x[r * k + i]} * w[j * k + i];
        want[r * ldy + j] = static_cast<int32_t>(sum);
      }
    for (const GemmQ8Variant& v : variants)
      for (int threads = 1; threads <= 3; ++threads) {
        omp_set_num_threads(threads);
        Q8Rows rows;
        pack_s8_rows(x.data(), m, k, k, rows, v.layout);
        std::vector<int32_t> got(static_cast<size_t>(m * ldy), -7);
        v.sums(rows, w.data(), n, got.data(), ldy);
        ASSERT_EQ(got, want) << v.name << ": m " << m << " k " << k << " n " << n << " threads "
                             << threads;
      }
  };
  for (const int64_t k : {1, 4, 31, 32, 33, 64, 100, 160, 2048, 2050})
    for (const int64_t m : {1, 5, 8, 9, 16, 17, 33, 100})
      for (const int64_t n : {1, 3, 4, 5, 6, 7, 13, 37}) {
        std::vector<int8_t> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
        for (int8_t& v : x) v = static_cast<int8_t>(xd(rng));
        for (int8_t& v : w) v = static_cast<int8_t>(wd(rng));
        std::fill_n(x.begin(), k, static_cast<int8_t>(127));
        std::fill_n(w.begin(), k, static_cast<int8_t>(-128));
        check(m, k, n, x, w);
      }
  const int64_t k = 16384, m = 17, n = 7;
  std::vector<int8_t> x(m * k, static_cast<int8_t>(-127)), w(n * k, static_cast<int8_t>(-128));
  for (int64_t i = 0; i < k; i += 3) w[i] = 127;  // row 0 mixed
  check(m, k, n, x, w);
  omp_set_num_threads(saved);
}

TEST(GemmQ8, EveryVariantGivesTheReferencesBits) {
  const std::vector<GemmQ8Variant> variants = gemm_q8_variants();
  std::printf("int8 activations x Q8_0: %s; variants here:", gemm_q8_path());
  for (const GemmQ8Variant& v : variants) std::printf(" %s", v.name);
  std::printf("\n");
  if (variants.empty()) GTEST_SKIP() << "no vector variant runs on this CPU";
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> qd(-128, 127);
  std::uniform_real_distribution<float> ed(-9.f, -1.f);
  const int saved = omp_get_max_threads();
  for (const int64_t k : {32, 64, 160, 512, 2048})
    for (const int64_t m : {1, 5, 7, 8, 9, 15, 16, 17, 32, 33, 48, 100, 300})
      for (const int64_t n : {1, 2, 3, 4, 5, 6, 7, 13, 37, 64}) {
        std::vector<float> x = activations(m, k, rng);
        std::vector<int8_t> q(static_cast<size_t>(n * k));
        std::vector<uint16_t> d(static_cast<size_t>(n * k / kQ8Block));
        std::vector<float> bias(static_cast<size_t>(n));
        for (int8_t& v : q) v = static_cast<int8_t>(qd(rng));
        // The largest sums: row 0's first block all 127 (q_x = 127) against weight row 0's
        // first block, which alternates -128 / 127 in pairs (AVX2 adds each pair in int16:
        // 128 · 127 · 2 = 32512 at most), and all -128 in weight row n - 1's last block.
        std::fill_n(x.begin(), kQ8Block, 127.f);
        for (int64_t i = 0; i < kQ8Block; ++i) q[i] = i % 4 < 2 ? -128 : 127;
        std::fill_n(q.end() - kQ8Block, kQ8Block, static_cast<int8_t>(-128));
        for (uint16_t& v : d) v = f32_to_f16(std::pow(4.f, ed(rng)));
        for (float& v : bias) v = static_cast<float>(qd(rng)) / 7.f;
        Q8Rows rows;
        quantize_q8_rows(x.data(), m, k, rows);
        const bool has_bias = (m + n) % 2 == 0;
        // The output has a wider row stride than n: untouched columns stay as they were.
        const int64_t ldy = n + 3;
        std::vector<float> want(static_cast<size_t>(m * ldy), -1.f);
        omp_set_num_threads(1);
        gemm_q8_scalar(rows, q.data(), d.data(), n, has_bias ? bias.data() : nullptr, want.data(),
                       ldy);
        for (const GemmQ8Variant& v : variants)
          for (int threads = 1; threads <= 3; ++threads) {
            omp_set_num_threads(threads);
            Q8Rows packed;
            quantize_q8_rows(x.data(), m, k, packed, v.layout);
            std::vector<float> got(static_cast<size_t>(m * ldy), -1.f);
            v.gemm(packed, q.data(), d.data(), n, has_bias ? bias.data() : nullptr, got.data(),
                   ldy);
            ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                << v.name << ": m " << m << " k " << k << " n " << n << " threads " << threads;
          }
      }
  omp_set_num_threads(saved);
}

// The scalar loops' sums against float64 on the extremes above: every product exact, so each
// block's sum is exact and y is within γ_(nb+2) of Σ_b d_b·s_x·S_b (gemm_q8.h).
TEST(GemmQ8, ReferenceSumsExactlyAtTheExtremes) {
  const int64_t m = 3, k = 64, n = 2, nb = k / kQ8Block;
  std::vector<float> x(static_cast<size_t>(m * k), -127.f);
  std::vector<int8_t> q(static_cast<size_t>(n * k), -128);
  for (int64_t i = 0; i < k; ++i) q[k + i] = i % 2 ? 127 : -128;
  std::vector<uint16_t> d(static_cast<size_t>(n * nb), f32_to_f16(0.5f));
  Q8Rows rows;
  quantize_q8_rows(x.data(), m, k, rows);
  std::vector<float> y(static_cast<size_t>(m * n));
  gemm_q8_scalar(rows, q.data(), d.data(), n, nullptr, y.data(), n);
  // s_x = 1 and q_x = -127 everywhere: row 0 of w sums to 127 · 128 · 32 a block, row 1 to
  // -127 · 16 · (127 - 128) a block.
  for (int64_t r = 0; r < m; ++r) {
    EXPECT_EQ(y[r * n], 0.5f * 127 * 128 * 32 * nb);
    EXPECT_EQ(y[r * n + 1], 0.5f * 127 * 16 * nb);
  }
}

// The quantized product of one row of x (k) with row j of a Q8_0 weight, from the definition.
struct Quantized {
  std::vector<double> s;  // per block
  std::vector<int> q;
};
Quantized quantize(const float* x, int64_t k) {
  Quantized r{std::vector<double>(k / kQ8Block), std::vector<int>(k)};
  for (int64_t b = 0; b < k / kQ8Block; ++b) {
    float a = 0;
    for (int64_t i = 0; i < kQ8Block; ++i) a = std::max(a, std::fabs(x[b * kQ8Block + i]));
    const float s = a / 127.f;
    r.s[b] = s;
    for (int64_t i = 0; i < kQ8Block; ++i)
      r.q[b * kQ8Block + i] = s == 0.f
                                  ? 0
                                  : static_cast<int>(std::clamp(
                                        std::nearbyint(x[b * kQ8Block + i] / s), -127.f, 127.f));
  }
  return r;
}

TEST(Int8ActivationsQ8, WithinTheBoundOfTheQuantizedProduct) {
  std::printf("int8 activations x Q8_0: %s\n", gemm_q8_path());
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.f, 1.f);
  const bool vector = gemm_q8() != nullptr;
  for (const int64_t k : {32, 96, 256, 2048})
    for (const int64_t m : {1, 4, 5, 6, 8, 17, 33, 64, 300}) {
      const int64_t n = k == 256 ? 130 : 37;
      const bool has_bias = m % 2 == 1;
      const std::vector<float> xv = activations(m, k, rng);
      Tensor x({m, k}), w({n, k}, DType::kBF16), bias({n});
      std::copy(xv.begin(), xv.end(), x.data<float>());
      for (int64_t i = 0; i < w.numel(); ++i)
        w.data<uint16_t>()[i] = f32_to_bf16(dist(rng) * 0.05f * static_cast<float>(1 + i % 3));
      for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = has_bias ? dist(rng) : 0.f;
      const Q8Weight qw = quantize_q8_0(w, "w");
      const Tensor y = linear(x, qw.q, has_bias ? bias : Tensor(), qw.d, DType::kI8);
      const bool int32_sums = m > 5 && vector;  // past 5 rows (ops.h linear())
      const int64_t nb = k / kQ8Block;
      // The fp32 paths: the Q8_0 decode product up to 32 rows (its summation's depth, as
      // test_model_kernels.cc's GemvQ8 test derives it), oneDNN's matmul past them (any order).
      const Kernels& kern = kernels();
      const int64_t gemv_depth =
          kern.isa == Isa::kScalar
              ? kQ8Block + 1 + nb + 1
              : kQ8Block / kern.width + nb + static_cast<int64_t>(std::log2(kern.width)) + 1;
      const double g = int32_sums ? gamma(nb + 2) : m <= 32 ? gamma(gemv_depth) : gamma(k + 2);
      double worst = 0;
      for (int64_t r = 0; r < m; ++r) {
        const Quantized xq = quantize(x.data<float>() + r * k, k);
        for (int64_t j = 0; j < n; ++j) {
          double exact = bias.data<float>()[j], mag = std::fabs(exact);
          for (int64_t b = 0; b < nb; ++b) {
            const double dw = f16_to_f32(qw.d.data<uint16_t>()[j * nb + b]);
            if (int32_sums) {
              double sum = 0;
              for (int64_t i = b * kQ8Block; i < (b + 1) * kQ8Block; ++i)
                sum += xq.q[i] * qw.q.data<int8_t>()[j * k + i];
              exact += dw * xq.s[b] * sum;
              mag += std::fabs(dw * xq.s[b] * sum);
            } else {  // x̂ = fl(s·q), then the Q8_0 product's fp32 sums
              for (int64_t i = b * kQ8Block; i < (b + 1) * kQ8Block; ++i) {
                const double xh = static_cast<float>(xq.s[b]) * static_cast<float>(xq.q[i]);
                const double p = xh * dw * qw.q.data<int8_t>()[j * k + i];
                exact += p;
                mag += std::fabs(p);
              }
            }
          }
          const double err = std::fabs(y.data<float>()[r * n + j] - exact);
          ASSERT_LE(err, g * mag) << "m " << m << " k " << k << " at (" << r << ", " << j << ")";
          if (mag > 0) worst = std::max(worst, err / (g * mag));
        }
      }
      if (k == 2048 && (m == 4 || m == 300))
        std::printf("  m %lld k 2048 (%s): worst error %.2e of the bound\n",
                    static_cast<long long>(m), int32_sums ? "int32 sums" : "fp32 products on x̂",
                    worst);
      if (k == 2048 && m == 300) {
        const Tensor y32 = linear(x, qw.q, has_bias ? bias : Tensor(), qw.d);
        EXPECT_NE(std::vector<float>(y32.data<float>(), y32.data<float>() + m * n),
                  std::vector<float>(y.data<float>(), y.data<float>() + m * n));
      }
    }
  // A row holding a NaN gives NaN on both paths; the others are unaffected.
  for (const int64_t m : {4, 9, 40}) {
    const int64_t k = 64, n = 16;
    Tensor x({m, k}), w({n, k});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = dist(rng);
    x.data<float>()[2 * k + 40] = std::numeric_limits<float>::quiet_NaN();
    x.data<float>()[3 * k + 1] = std::numeric_limits<float>::infinity();
    const Q8Weight qw = quantize_q8_0(w, "w");
    const Tensor y = linear(x, qw.q, Tensor(), qw.d, DType::kI8);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(std::isnan(y.data<float>()[r * n + j]), r == 2 || r == 3)
            << "m " << m << " row " << r;
  }
}

}  // namespace
}  // namespace seqpar::model_simd
