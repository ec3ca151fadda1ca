// The model's vector kernels (src/model/simd_ops.h), every variant this CPU runs, against a
// float64 reference over a sweep of shapes: m 1..8 rows, k from 1 to past the widest unrolled
// step (tails of every length), n 1..300, with and without bias, bf16 and fp16 weights.
//
// Error bound: each output passes through at most d roundings (the FMA chain of one lane, the
// accumulator and lane sums, the bias add), so |y - y_exact| <= gamma_d · (sum_i |x_i w_i| + |b|)
// with gamma_d = d·u / (1 - d·u), u = 2^-24. d follows the kernel's summation (simd_ops.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/model/ops.h"
#include "simd_ops.h"

namespace seqpar::model_simd {
namespace {

// Roundings one output of a variant passes through, for m rows and a dot product of length k.
int64_t roundings(const Kernels& kern, int64_t m, int64_t k) {
  const int64_t w = kern.width;
  if (kern.isa == Isa::kScalar)  // product, chain of ceil(k / w) adds, w - 1 lane adds, bias
    return 1 + (k + w - 1) / w + (w - 1) + 1;
  const int64_t u = gemv_unroll(m, static_cast<int>(w));
  int64_t tree = 0;
  while ((int64_t{1} << tree) < w) ++tree;
  // lane chain: whole groups, up to u - 1 whole vectors and the tail; u - 1 adds, tree, bias
  return k / (u * w) + u + (u - 1) + tree + 1;
}

struct Case {
  int64_t m, k, n;
  bool bias;
  DType wtype;
};

std::vector<Case> sweep() {
  std::vector<Case> cases;
  for (int64_t m = 1; m <= kMaxRows; ++m)
    for (int64_t k : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 257, 1000})
      for (int64_t n : {1, 7, 64, 300}) {
        if (m * k * n > 100000 && n > 7) continue;  // keeps the float64 reference quick
        for (bool bias : {false, true})
          for (DType t : {DType::kBF16, DType::kF16}) cases.push_back({m, k, n, bias, t});
      }
  return cases;
}

class ModelKernels : public ::testing::TestWithParam<Isa> {};

TEST_P(ModelKernels, GemvWithinSummationBoundOfFloat64) {
  const Isa isa = GetParam();
  if (!cpu_has(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_name(isa) << " variant";
  const Kernels& kern = kernels(isa);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  double worst_ratio = 0, worst_err = 0;
  // One thread: the sweep makes thousands of small calls (GemvDoesNotDependOnThreadCount covers
  // teams), and waking a team for each is slow on a shared machine.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  for (const Case& c : sweep()) {
    std::vector<float> x(c.m * c.k), b(c.n), wf(c.n * c.k);
    std::vector<uint16_t> w(c.n * c.k);
    for (float& v : x) v = dist(rng);
    for (float& v : b) v = dist(rng);
    for (size_t i = 0; i < w.size(); ++i) {
      const float v = dist(rng) * 0.05f;
      w[i] = c.wtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      wf[i] = c.wtype == DType::kBF16 ? bf16_to_f32(w[i]) : f16_to_f32(w[i]);
    }
    std::vector<float> y(c.m * c.n, NAN);
    (c.wtype == DType::kBF16 ? kern.gemv_bf16 : kern.gemv_f16)(
        x.data(), c.m, c.k, w.data(), c.n, c.bias ? b.data() : nullptr, y.data());
    const double d = static_cast<double>(roundings(kern, c.m, c.k));
    const double u = std::ldexp(1.0, -24), gamma = d * u / (1 - d * u);
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t j = 0; j < c.n; ++j) {
        double exact = c.bias ? b[j] : 0.0, mag = c.bias ? std::fabs(b[j]) : 0.0;
        for (int64_t i = 0; i < c.k; ++i) {
          const double p = static_cast<double>(x[r * c.k + i]) * wf[j * c.k + i];
          exact += p;
          mag += std::fabs(p);
        }
        const double err = std::fabs(y[r * c.n + j] - exact), bound = gamma * mag;
        ASSERT_LE(err, bound) << isa_name(isa) << " m " << c.m << " k " << c.k << " n " << c.n
                              << " bias " << c.bias << " " << dtype_name(c.wtype) << " at (" << r
                              << ", " << j << "): " << y[r * c.n + j] << " vs " << exact;
        if (bound > 0 && err / bound > worst_ratio) worst_ratio = err / bound;
        if (err > worst_err) worst_err = err;
      }
  }
  omp_set_num_threads(saved);
  std::printf("%s: largest error %.3g, at most %.3g of its bound\n",
              std::string(isa_name(isa)).c_str(), worst_err, worst_ratio);
}

TEST_P(ModelKernels, GemvDoesNotDependOnThreadCount) {
  const Isa isa = GetParam();
  if (!cpu_has(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_name(isa) << " variant";
  const Kernels& kern = kernels(isa);
  const int64_t m = 3, k = 515, n = 301;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(m * k), b(n);
  std::vector<uint16_t> w(n * k);
  for (float& v : x) v = dist(rng);
  for (float& v : b) v = dist(rng);
  for (uint16_t& v : w) v = f32_to_bf16(dist(rng));
  std::vector<float> one(m * n), many(m * n);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  kern.gemv_bf16(x.data(), m, k, w.data(), n, b.data(), one.data());
  for (int t : {2, 3, 7}) {
    omp_set_num_threads(t);
    kern.gemv_bf16(x.data(), m, k, w.data(), n, b.data(), many.data());
    EXPECT_EQ(one, many) << isa_name(isa) << " with " << t << " threads";
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(Variants, ModelKernels,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

TEST(ModelKernels, LinearUsesTheChosenVariant) {
  const int64_t m = 2, k = 70, n = 33;
  Tensor x({m, k}), w({n, k}, DType::kF16), bias({n});
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
  for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = dist(rng);
  auto* wp = static_cast<uint16_t*>(w.raw());
  for (int64_t i = 0; i < w.numel(); ++i) wp[i] = f32_to_f16(dist(rng));
  const Tensor y = linear(x, w, bias);
  std::vector<float> want(m * n);
  kernels().gemv_f16(x.data<float>(), m, k, wp, n, bias.data<float>(), want.data());
  EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + m * n), want);
  const std::string info = model_kernel_info();
  EXPECT_NE(info.find(std::string("gemv_bf16 ") + std::string(isa_name(kernels().isa))),
            std::string::npos)
      << info;
}

}  // namespace
}  // namespace seqpar::model_simd
