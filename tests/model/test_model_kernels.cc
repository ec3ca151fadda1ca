// The model's vector kernels (src/model/simd_ops.h), every variant this CPU runs, against a
// float64 reference over a sweep of shapes: m 1..8 rows, k from 1 to past the widest unrolled
// step (tails of every length), n 1..300, with and without bias, bf16 and fp16 weights.
//
// Error bound: each output passes through at most d roundings (the FMA chain of one lane, the
// accumulator and lane sums, the bias add), so |y - y_exact| <= gamma_d · (sum_i |x_i w_i| + |b|)
// with gamma_d = d·u / (1 - d·u), u = 2^-24. d follows the kernel's summation (simd_ops.h).
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

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "seqpar/model/ops.h"
#include "simd_ops.h"

namespace seqpar::model_simd {
namespace {

// bias + sum_i x_i * w_i in float64, with |bias| + sum_i |x_i * w_i|: the reference of every
// bound in this file.
struct Exact {
  double value, magnitude;
};
template <class W>
Exact exact_dot(const float* x, const W* w, int64_t k, double bias) {
  Exact e{bias, std::fabs(bias)};
  for (int64_t i = 0; i < k; ++i) {
    const double p = double{x[i]} * static_cast<double>(w[i]);
    e.value += p;
    e.magnitude += std::fabs(p);
  }
  return e;
}

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
        const auto [exact, mag] = exact_dot(&x[r * c.k], &wf[j * c.k], c.k, c.bias ? b[j] : 0.0);
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

// call(y) writes `outputs` floats: the same bits with 2, 3 and 7 threads as with 1.
template <typename Call>
void expect_same_for_thread_counts(Isa isa, int64_t outputs, Call&& call) {
  std::vector<float> one(outputs), many(outputs);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  call(one.data());
  for (int t : {2, 3, 7}) {
    omp_set_num_threads(t);
    call(many.data());
    EXPECT_EQ(one, many) << isa_name(isa) << " with " << t << " threads";
  }
  omp_set_num_threads(saved);
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
  expect_same_for_thread_counts(
      isa, m * n, [&](float* y) { kern.gemv_bf16(x.data(), m, k, w.data(), n, b.data(), y); });
}

// The columns are read several at a time as separate streams (gemv_streams): each output must
// have the bits of the same column multiplied on its own, for every row count, in all three
// weight formats, with run lengths that leave 0 to 3 columns over.
TEST_P(ModelKernels, GemvStreamsGiveTheBitsOfOneColumnAtATime) {
  const Isa isa = GetParam();
  if (!cpu_has(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_name(isa) << " variant";
  const Kernels& kern = kernels(isa);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t k = 96 + 5;  // whole steps, whole vectors and a tail
  const int64_t kq = 96;     // Q8_0: whole blocks
  for (int64_t m = 1; m <= kMaxRows; ++m)
    for (int64_t n : {2, 3, 4, 5, 6, 7, 9, 13, 64}) {
      std::vector<float> x(m * k), b(n), s(n), y(m * n), one(m);
      std::vector<uint16_t> w(n * k), d(n * kq / kQ8Block);
      std::vector<int8_t> q(n * k);
      for (float& v : x) v = dist(rng);
      for (float& v : b) v = dist(rng);
      for (float& v : s) v = std::fabs(dist(rng));
      for (uint16_t& v : w) v = f32_to_bf16(dist(rng));
      for (uint16_t& v : d) v = f32_to_f16(0.01f * std::fabs(dist(rng)));
      for (int8_t& v : q) v = static_cast<int8_t>(std::clamp(dist(rng) * 40.f, -127.f, 127.f));
      const auto expect = [&](const char* what, auto&& all, auto&& column) {
        all(y.data());
        for (int64_t j = 0; j < n; ++j) {
          column(j, one.data());
          for (int64_t r = 0; r < m; ++r)
            ASSERT_EQ(std::memcmp(&y[r * n + j], &one[r], sizeof(float)), 0)
                << what << " " << isa_name(isa) << " m " << m << " n " << n << " at (" << r << ", "
                << j << "): " << y[r * n + j] << " vs " << one[r];
        }
      };
      expect(
          "bf16", [&](float* o) { kern.gemv_bf16(x.data(), m, k, w.data(), n, b.data(), o); },
          [&](int64_t j, float* o) { kern.gemv_bf16(x.data(), m, k, &w[j * k], 1, &b[j], o); });
      expect(
          "f16", [&](float* o) { kern.gemv_f16(x.data(), m, k, w.data(), n, nullptr, o); },
          [&](int64_t j, float* o) { kern.gemv_f16(x.data(), m, k, &w[j * k], 1, nullptr, o); });
      expect(
          "int8 per channel",
          [&](float* o) {
            kern.gemv_i8_channel(x.data(), m, k, q.data(), s.data(), n, b.data(), o);
          },
          [&](int64_t j, float* o) {
            kern.gemv_i8_channel(x.data(), m, k, &q[j * k], &s[j], 1, &b[j], o);
          });
      // Q8_0 reads x with row stride kq: the first kq of each row of x, rows packed.
      std::vector<float> xq(m * kq);
      for (int64_t r = 0; r < m; ++r) std::copy_n(&x[r * k], kq, &xq[r * kq]);
      expect(
          "Q8_0",
          [&](float* o) { kern.gemv_q8(xq.data(), m, kq, q.data(), d.data(), n, b.data(), o); },
          [&](int64_t j, float* o) {
            kern.gemv_q8(xq.data(), m, kq, &q[j * kq], &d[j * kq / kQ8Block], 1, &b[j], o);
          });
    }
  omp_set_num_threads(saved);
}

// Past kMaxRows rows the products run the rows in groups of kRowGroup over pieces of columns
// (simd_ops.h): every output must have the bits of its group multiplied alone (whose bound the
// tests above derive), in all four weight formats, for row counts that leave 0 to 3 rows in the
// last group, columns cut into several pieces (k 2048: 32 to 64 columns a piece), on 1 to 7
// threads.
TEST_P(ModelKernels, RowGroupsGiveTheBitsOfEachGroupAlone) {
  const Isa isa = GetParam();
  if (!cpu_has(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_name(isa) << " variant";
  const Kernels& kern = kernels(isa);
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t k = 2048, n = 150;
  std::vector<float> b(n), s(n);
  std::vector<uint16_t> w(n * k), d(n * k / kQ8Block);
  std::vector<int8_t> q(n * k);
  for (float& v : b) v = dist(rng);
  for (float& v : s) v = std::fabs(dist(rng));
  for (uint16_t& v : w) v = f32_to_bf16(dist(rng) * 0.05f);
  for (uint16_t& v : d) v = f32_to_f16(0.01f * std::fabs(dist(rng)));
  for (int8_t& v : q) v = static_cast<int8_t>(std::clamp(dist(rng) * 40.f, -127.f, 127.f));
  for (const int64_t m : {9, 10, 15, 16, 23, 40, 64}) {
    std::vector<float> x(m * k), want(m * n);
    for (float& v : x) v = dist(rng);
    const auto expect = [&](const char* what, auto&& product) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(1);
      for (int64_t r0 = 0; r0 < m; r0 += kRowGroup)
        product(&x[r0 * k], std::min(kRowGroup, m - r0), &want[r0 * n]);
      omp_set_num_threads(saved);
      expect_same_for_thread_counts(isa, m * n, [&](float* y) {
        product(x.data(), m, y);
        for (int64_t i = 0; i < m * n; ++i)
          ASSERT_EQ(std::memcmp(&y[i], &want[i], sizeof(float)), 0)
              << what << " " << isa_name(isa) << " m " << m << " at (" << i / n << ", " << i % n
              << "): " << y[i] << " vs " << want[i];
      });
    };
    expect("bf16", [&](const float* xr, int64_t rows, float* y) {
      kern.gemv_bf16(xr, rows, k, w.data(), n, b.data(), y);
    });
    expect("f16", [&](const float* xr, int64_t rows, float* y) {
      kern.gemv_f16(xr, rows, k, w.data(), n, nullptr, y);
    });
    expect("int8 per channel", [&](const float* xr, int64_t rows, float* y) {
      kern.gemv_i8_channel(xr, rows, k, q.data(), s.data(), n, b.data(), y);
    });
    expect("Q8_0", [&](const float* xr, int64_t rows, float* y) {
      kern.gemv_q8(xr, rows, k, q.data(), d.data(), n, b.data(), y);
    });
  }
}

// Roundings one output of gemv_q8 passes through (simd_ops.h): within a block, the product and
// the FMAs over its vectors (scalar: a product and 31 adds); the block's scale (scalar: a
// multiply; vector: the FMA into the accumulator); the chain over blocks; the lane tree; the bias.
int64_t q8_roundings(const Kernels& kern, int64_t k) {
  const int64_t blocks = k / kQ8Block;
  if (kern.isa == Isa::kScalar) return kQ8Block + 1 + blocks + 1;
  int64_t tree = 0;
  while ((int64_t{1} << tree) < kern.width) ++tree;
  return kQ8Block / kern.width + blocks + tree + 1;
}

struct Q8Case {
  std::vector<int8_t> q;
  std::vector<uint16_t> d;
  std::vector<double> w;  // d · q in float64
};

// Random int8 values and fp16 scales over six decades (subnormal fp16 scales included).
Q8Case random_q8(int64_t n, int64_t k, std::mt19937& rng) {
  std::uniform_int_distribution<int> qd(-127, 127);
  std::uniform_real_distribution<float> ed(-9.f, -1.f);
  Q8Case c;
  c.q.resize(n * k);
  c.d.resize(n * k / kQ8Block);
  c.w.resize(n * k);
  for (int8_t& v : c.q) v = static_cast<int8_t>(qd(rng));
  for (uint16_t& v : c.d) v = f32_to_f16(std::pow(4.f, ed(rng)));
  for (int64_t i = 0; i < n * k; ++i)
    c.w[i] = static_cast<double>(f16_to_f32(c.d[i / kQ8Block])) * c.q[i];
  return c;
}

TEST_P(ModelKernels, GemvQ8WithinSummationBoundOfFloat64) {
  const Isa isa = GetParam();
  if (!cpu_has(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_name(isa) << " variant";
  const Kernels& kern = kernels(isa);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  double worst_ratio = 0;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  for (int64_t m = 1; m <= kMaxRows; ++m)
    for (int64_t k : {32, 64, 96, 160, 1024, 2048})
      for (int64_t n : {1, 5, 64}) {
        if (m * k * n > 200000 && n > 5) continue;
        for (bool bias : {false, true}) {
          const Q8Case w = random_q8(n, k, rng);
          std::vector<float> x(m * k), b(n);
          for (float& v : x) v = dist(rng);
          for (float& v : b) v = dist(rng);
          std::vector<float> y(m * n, NAN);
          kern.gemv_q8(x.data(), m, k, w.q.data(), w.d.data(), n, bias ? b.data() : nullptr,
                       y.data());
          const double dd = static_cast<double>(q8_roundings(kern, k));
          const double u = std::ldexp(1.0, -24), gamma = dd * u / (1 - dd * u);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < n; ++j) {
              const auto [exact, mag] = exact_dot(&x[r * k], &w.w[j * k], k, bias ? b[j] : 0.0);
              const double err = std::fabs(y[r * n + j] - exact), bound = gamma * mag;
              ASSERT_LE(err, bound)
                  << isa_name(isa) << " m " << m << " k " << k << " n " << n << " bias " << bias
                  << " at (" << r << ", " << j << "): " << y[r * n + j] << " vs " << exact;
              if (bound > 0) worst_ratio = std::max(worst_ratio, err / bound);
            }
        }
      }
  omp_set_num_threads(saved);
  std::printf("%s gemv_q8: at most %.3g of the bound\n", std::string(isa_name(isa)).c_str(),
              worst_ratio);
}

TEST_P(ModelKernels, DequantQ8IsExact) {
  const Isa isa = GetParam();
  if (!cpu_has(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_name(isa) << " variant";
  std::mt19937 rng(13);
  const int64_t rows = 7, k = 96;
  const Q8Case w = random_q8(rows, k, rng);
  std::vector<float> out(rows * k, NAN);
  kernels(isa).dequant_q8(w.q.data(), w.d.data(), rows, k, out.data());
  for (int64_t i = 0; i < rows * k; ++i) ASSERT_EQ(static_cast<double>(out[i]), w.w[i]) << i;
}

TEST_P(ModelKernels, GemvQ8DoesNotDependOnThreadCount) {
  const Isa isa = GetParam();
  if (!cpu_has(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_name(isa) << " variant";
  const Kernels& kern = kernels(isa);
  const int64_t m = 3, k = 512, n = 301;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  const Q8Case w = random_q8(n, k, rng);
  std::vector<float> x(m * k);
  for (float& v : x) v = dist(rng);
  expect_same_for_thread_counts(isa, m * n, [&](float* y) {
    kern.gemv_q8(x.data(), m, k, w.q.data(), w.d.data(), n, nullptr, y);
  });
}

INSTANTIATE_TEST_SUITE_P(Variants, ModelKernels,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

// linear() multiplies up to 64 rows with the chosen variant's product (from 9 rows in groups),
// 16-bit and per-channel int8 weights; Q8_0 up to 32 rows (ops.cc, kFewRows).
TEST(ModelKernels, LinearUsesTheChosenVariant) {
  const int64_t k = 96, n = 33;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  Tensor w({n, k}, DType::kF16), bias({n}), wb({n, k}, DType::kBF16);
  for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = dist(rng);
  auto* wp = static_cast<uint16_t*>(w.raw());
  for (int64_t i = 0; i < w.numel(); ++i) wp[i] = f32_to_f16(dist(rng));
  for (int64_t i = 0; i < wb.numel(); ++i) wb.data<uint16_t>()[i] = f32_to_bf16(dist(rng));
  const Q8Weight q8 = quantize_q8_0(wb, "w");
  const Int8ChannelWeight ch = quantize_int8_channel(wb, "w");
  for (const int64_t m : {2, 9, 32, 64}) {
    Tensor x({m, k});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
    const auto same = [&](const char* what, const Tensor& y, auto&& product) {
      std::vector<float> want(m * n);
      product(want.data());
      EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + m * n), want)
          << what << " m " << m;
    };
    same("f16", linear(x, w, bias), [&](float* o) {
      kernels().gemv_f16(x.data<float>(), m, k, wp, n, bias.data<float>(), o);
    });
    same("int8 per channel", linear(x, ch.q, bias, ch.s), [&](float* o) {
      kernels().gemv_i8_channel(x.data<float>(), m, k, ch.q.data<int8_t>(), ch.s.data<float>(), n,
                                bias.data<float>(), o);
    });
    if (m <= 32)
      same("Q8_0", linear(x, q8.q, bias, q8.d), [&](float* o) {
        kernels().gemv_q8(x.data<float>(), m, k, q8.q.data<int8_t>(), q8.d.data<uint16_t>(), n,
                          bias.data<float>(), o);
      });
  }
  const std::string info = model_kernel_info();
  EXPECT_NE(info.find(std::string("gemv_bf16 ") + std::string(isa_name(kernels().isa))),
            std::string::npos)
      << info;
}

}  // namespace
}  // namespace seqpar::model_simd

namespace seqpar {
namespace {

// quantize_q8_0 against its definition, computed here in float64: every block's scale is the
// fp16 of max |w| / 127, the block's largest element becomes ±127, and each element is within
// s / 2 + 127 · |s - d| of d · q (ops.h), on fp32 and bf16 weights over six decades, with zero
// blocks and a block holding one nonzero.
TEST(QuantizeQ8, MatchesTheDefinitionAndItsErrorBound) {
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::uniform_real_distribution<float> ed(-6.f, 1.f);
  for (DType t : {DType::kF32, DType::kBF16}) {
    const int64_t n = 9, k = 128;
    Tensor wf({n, k});
    for (int64_t j = 0; j < n; ++j) {
      const float scale = std::pow(10.f, ed(rng));
      for (int64_t i = 0; i < k; ++i) wf.data<float>()[j * k + i] = dist(rng) * scale;
    }
    for (int64_t i = 0; i < 32; ++i) wf.data<float>()[i] = 0.f;  // a zero block
    for (int64_t i = 32; i < 64; ++i) wf.data<float>()[i] = i == 40 ? -3.f : 0.f;
    const Tensor w = wf.to(t);
    const Q8Weight qw = quantize_q8_0(w, "w");
    ASSERT_EQ(qw.q.dtype(), DType::kI8);
    ASSERT_EQ(qw.d.shape(), (std::vector<int64_t>{n, k / 32}));
    std::vector<float> deq(n * k);
    dequantize_q8_0(qw.q, qw.d, 0, n, deq.data());
    for (int64_t j = 0; j < n; ++j)
      for (int64_t b = 0; b < k / 32; ++b) {
        double a = 0;
        for (int64_t i = 0; i < 32; ++i)
          a = std::max(a, std::fabs(double{w.at(j * k + b * 32 + i)}));
        const float s = static_cast<float>(a) / 127.f;
        const uint16_t d = qw.d.data<uint16_t>()[j * (k / 32) + b];
        ASSERT_EQ(d, f32_to_f16(s)) << dtype_name(t) << " block (" << j << ", " << b << ")";
        const double ds = f16_to_f32(d);
        int top = 0;
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t e = j * k + b * 32 + i;
          const int q = qw.q.data<int8_t>()[e];
          ASSERT_LE(std::abs(q), 127);
          // llama.cpp's rounding: the value times the fp32 reciprocal, half away from zero.
          const float scaled = w.at(e) * (s == 0.f ? 0.f : 1.f / s);
          const double frac = std::fabs(scaled) - std::floor(std::fabs(scaled));
          const int expect = static_cast<int>(
              std::copysign(std::floor(std::fabs(scaled)) + (frac >= 0.5 ? 1 : 0), scaled));
          ASSERT_EQ(q, expect) << dtype_name(t) << " element " << e;
          if (std::fabs(double{w.at(e)}) == a && a > 0) top = std::abs(q);
          ASSERT_EQ(double{deq[e]}, ds * q);
          const double bound = s / 2.0 * (1 + 1e-6) + 127 * std::fabs(s - ds);
          ASSERT_LE(std::fabs(w.at(e) - ds * q), bound) << dtype_name(t) << " element " << e;
        }
        if (a > 0) {
          EXPECT_EQ(top, 127) << "block (" << j << ", " << b << ")";
        }
      }
    EXPECT_EQ(qw.q.data<int8_t>()[40], -127);
  }
}

TEST(QuantizeQ8, RefusesWhatItCannotHold) {
  Tensor odd({4, 40});
  odd.fill(1.f);
  EXPECT_THROW(
      {
        try {
          quantize_q8_0(odd, "layers.0.mlp.up_proj.weight");
        } catch (const InvalidArgument& e) {
          EXPECT_STREQ(e.what(),
                       "int8 weights: layers.0.mlp.up_proj.weight has 40 inputs, not a multiple "
                       "of the block of 32");
          throw;
        }
      },
      InvalidArgument);
  Tensor inf({2, 32});
  inf.fill(1.f);
  inf.data<float>()[37] = INFINITY;
  EXPECT_THROW(quantize_q8_0(inf, "w"), InvalidArgument);
  EXPECT_THROW(Tensor({2, 32}, DType::kI8).to(DType::kF32), Error);
}

// linear() with Q8_0 weights: up to 8 rows through gemv_q8, more through blocks dequantized for
// oneDNN's GEMM; both against float64 on the dequantized weights, the GEMM path within the bound
// of a k-term dot product (its summation order is oneDNN's).
TEST(QuantizeQ8, LinearOnBothPaths) {
  std::mt19937 rng(19);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t k = 192, n = 70;
  Tensor w({n, k}, DType::kBF16), bias({n});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<uint16_t>()[i] = f32_to_bf16(dist(rng) * 0.05f);
  for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = dist(rng);
  const Q8Weight qw = quantize_q8_0(w, "w");
  std::vector<float> deq(n * k);
  dequantize_q8_0(qw.q, qw.d, 0, n, deq.data());
  for (int64_t m : {1, 8, 9, 300}) {
    Tensor x({m, k});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
    const Tensor y = linear(x, qw.q, bias, qw.d);
    const double u = std::ldexp(1.0, -24), g = (k + 2) * u / (1 - (k + 2) * u);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const auto [exact, mag] =
            model_simd::exact_dot(x.data<float>() + r * k, &deq[j * k], k, bias.data<float>()[j]);
        ASSERT_LE(std::fabs(y.data<float>()[r * n + j] - exact), g * mag)
            << "m " << m << " at (" << r << ", " << j << ")";
      }
  }
  EXPECT_THROW(linear(Tensor({2, k}), qw.q, Tensor()), Error);
}

// bf16 activations: y = round_bf16(x) · wᵀ + b, every product exact in fp32 (bf16 times bf16) and
// summed in fp32 in some order, so |y - exact| <= gamma_(k+1) · (sum |x_r w| + |b|), exact
// computed in float64 from the rounded x. Rows 1..8 (the decode product on the rounded values)
// and more (oneDNN's bf16 matmul where the CPU has it, bf16_activations_path()), bf16, fp16 and
// fp32 weights; the same call with fp32 activations differs (x was not rounded there).
TEST(BF16Activations, LinearWithinTheBoundOfTheRoundedProduct) {
  std::mt19937 rng(23);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::printf("bf16 activations: %s\n", std::string(bf16_activations_path()).c_str());
  for (const DType wdt : {DType::kBF16, DType::kF16, DType::kF32})
    for (const int64_t k : {1, 31, 160, 2048})
      for (const int64_t m : {1, 8, 9, 16, 100}) {
        const int64_t n = 37;
        const bool has_bias = k != 160;
        Tensor x({m, k}), w32({n, k}), bias({n});
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
        for (int64_t i = 0; i < w32.numel(); ++i) w32.data<float>()[i] = dist(rng) * 0.05f;
        for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = dist(rng);
        const Tensor w = w32.to(wdt), wf = w.to(DType::kF32),
                     xr = x.to(DType::kBF16).to(DType::kF32);
        if (!has_bias) std::fill(bias.data<float>(), bias.data<float>() + n, 0.f);
        const Tensor y = linear(x, w, has_bias ? bias : Tensor(), Tensor(), DType::kBF16);
        const double u = std::ldexp(1.0, -24), g = (k + 1) * u / (1 - (k + 1) * u);
        double worst = 0;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) {
            const auto [exact, mag] = model_simd::exact_dot(
                xr.data<float>() + r * k, wf.data<float>() + j * k, k, bias.data<float>()[j]);
            const double err = std::fabs(y.data<float>()[r * n + j] - exact);
            ASSERT_LE(err, g * mag)
                << dtype_name(wdt) << " m " << m << " k " << k << " at (" << r << ", " << j << ")";
            worst = std::max(worst, err / (g * mag));
          }
        if (k == 2048 && m == 100) {
          std::printf("  %s weights, m %lld k %lld: worst error %.2e of the bound\n",
                      std::string(dtype_name(wdt)).c_str(), static_cast<long long>(m),
                      static_cast<long long>(k), worst);
          const Tensor y32 = linear(x, w, bias);
          EXPECT_NE(std::vector<float>(y32.data<float>(), y32.data<float>() + m * n),
                    std::vector<float>(y.data<float>(), y.data<float>() + m * n));
        }
      }
}

// bf16 activations with int8 weights. Per-channel: y = s·(round_bf16(x) · qᵀ) + b; from 9 rows on
// a CPU with native bf16 products (oneDNN's bf16 matmul on q widened to bf16, exactly) every
// product is exact and summed in fp32, then one multiply and the bias: within gamma_(k+1) ·
// (s·Σ|x_r·q| + |b|) of float64 on the rounded x and s·q; elsewhere (rows 1..8, gemv_i8_channel;
// no native bf16: fp32 products on s·q rounded to fp32) within gamma_(k+2). Q8_0 weights take the
// fp32 paths on the rounded values, within gamma_(k+2) of float64 on d·q.
TEST(BF16Activations, Int8WeightsWithinTheBoundOfTheRoundedProduct) {
  std::mt19937 rng(29);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (const bool q8 : {false, true})
    for (const int64_t k : {32, 160, 2048})
      for (const int64_t m : {1, 8, 9, 100}) {
        const int64_t n = 37;
        const bool has_bias = k != 160;
        Tensor x({m, k}), w({n, k}, DType::kBF16), bias({n});
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
        for (int64_t i = 0; i < w.numel(); ++i)
          w.data<uint16_t>()[i] =
              f32_to_bf16(dist(rng) * 0.05f * static_cast<float>(1 + i / k % 3));
        for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = has_bias ? dist(rng) : 0.f;
        Tensor q, scale;
        std::vector<double> deq(n * k);
        if (q8) {
          Q8Weight qw = quantize_q8_0(w, "w");
          std::vector<float> d(n * k);
          dequantize_q8_0(qw.q, qw.d, 0, n, d.data());  // d·q, exact in fp32
          std::copy(d.begin(), d.end(), deq.begin());
          q = std::move(qw.q);
          scale = std::move(qw.d);
        } else {
          Int8ChannelWeight cw = quantize_int8_channel(w, "w");
          for (int64_t i = 0; i < n * k; ++i)
            deq[i] = double{cw.s.data<float>()[i / k]} * cw.q.data<int8_t>()[i];
          q = std::move(cw.q);
          scale = std::move(cw.s);
        }
        const Tensor xr = x.to(DType::kBF16).to(DType::kF32);
        const Tensor y = linear(x, q, has_bias ? bias : Tensor(), scale, DType::kBF16);
        const bool native = !q8 && m > 8 && bf16_activations_path() == "onednn bf16";
        const double u = std::ldexp(1.0, -24), d = static_cast<double>(k + (native ? 1 : 2)),
                     g = d * u / (1 - d * u);
        double worst = 0;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) {
            const auto [exact, mag] = model_simd::exact_dot(xr.data<float>() + r * k, &deq[j * k],
                                                            k, bias.data<float>()[j]);
            const double err = std::fabs(y.data<float>()[r * n + j] - exact);
            ASSERT_LE(err, g * mag) << (q8 ? "Q8_0" : "per-channel") << " m " << m << " k " << k
                                    << " at (" << r << ", " << j << ")";
            worst = std::max(worst, err / (g * mag));
          }
        if (k == 2048 && m == 100)
          std::printf("  %s int8 weights, m 100 k 2048 (%s): worst error %.2e of the bound\n",
                      q8 ? "Q8_0" : "per-channel", native ? "onednn bf16" : "fp32", worst);
      }
}

// int8 activations (per-channel int8 weights): each row of x quantized as the test does it here
// (s = a / 127 in fp32, q = nearbyint(x / s) clamped), then past 4 rows y within gamma_4 ·
// (|s_x·s_w·Σ q_x·q_w| + |b|) of that value in float64 (the sums exact in int32: oneDNN's int8
// matmul with VNNI, else gemm_q8.h's sums, as under ONEDNN_MAX_CPU_ISA=AVX2
// SEQPAR_KERNEL_ISA=avx2), up to 4 rows (the per-channel decode product on x̂ = fl(s_x·q_x)), and
// at any row count where neither runs (int8_activations_path() says "fp32 of the quantized
// values"), within gamma_(k+2) · (Σ|x̂·s_w·q_w| + |b|).
// Rows with an outlier column (a spread of magnitudes, as real activations have), given row
// maxima (a row-parallel rank's), a zero row (the bias) and a row holding a NaN (NaN); the call
// differs from fp32 activations; bf16 weights are refused.
TEST(Int8Activations, WithinTheBoundOfTheQuantizedProduct) {
  std::mt19937 rng(31);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::printf("int8 activations: %s\n", std::string(int8_activations_path()).c_str());
  const double u = std::ldexp(1.0, -24);
  for (const int64_t k : {1, 31, 128, 160, 256, 2048})
    for (const int64_t m : {1, 4, 5, 8, 9, 24, 57, 64, 300})
      for (const bool given_max : {false, true}) {
        const int64_t n = k == 128 ? 256 : k == 256 ? 128 : 37;
        const bool has_bias = k != 160;
        Tensor x({m, k}), w({n, k}, DType::kBF16), bias({n});
        for (int64_t i = 0; i < x.numel(); ++i)
          x.data<float>()[i] = dist(rng) * (i % k == 3 ? 20.f : 1.f);
        if (m > 2) std::fill_n(x.data<float>() + k, k, 0.f);  // row 1: zero
        for (int64_t i = 0; i < w.numel(); ++i)
          w.data<uint16_t>()[i] =
              f32_to_bf16(dist(rng) * 0.05f * static_cast<float>(1 + i / k % 3));
        for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = has_bias ? dist(rng) : 0.f;
        const Int8ChannelWeight cw = quantize_int8_channel(w, "w");
        Tensor amax = row_abs_max(x);
        if (given_max)
          for (int64_t r = 0; r < m; ++r) amax.data<float>()[r] *= 1.5f;
        const Tensor y = linear(x, cw.q, has_bias ? bias : Tensor(), cw.s, DType::kI8,
                                given_max ? amax : Tensor());
        const bool exact_sums = m > 4 && int8_activations_path() != "fp32 of the quantized values";
        const double g = exact_sums ? 4 * u / (1 - 4 * u) : (k + 2) * u / (1 - (k + 2) * u);
        std::vector<float> xh(k);
        std::vector<double> qx(k), deq(k), qw(k);
        double worst = 0;
        for (int64_t r = 0; r < m; ++r) {
          const float s = amax.data<float>()[r] / 127.f;
          for (int64_t i = 0; i < k; ++i) {
            const float v = x.data<float>()[r * k + i];
            qx[i] = s == 0.f ? 0.f : std::clamp(std::nearbyint(v / s), -127.f, 127.f);
            xh[i] = s * static_cast<float>(qx[i]);
          }
          for (int64_t j = 0; j < n; ++j) {
            const float sw = cw.s.data<float>()[j];
            for (int64_t i = 0; i < k; ++i) {
              qw[i] = cw.q.data<int8_t>()[j * k + i];
              deq[i] = double{sw} * qw[i];
            }
            const double b = bias.data<float>()[j];
            double exact, mag;
            if (exact_sums) {
              double sum = 0;
              for (int64_t i = 0; i < k; ++i) sum += qx[i] * qw[i];
              const double p = double{s} * sw * sum;
              exact = p + b;
              mag = std::fabs(p) + std::fabs(b);
            } else {
              const auto e = model_simd::exact_dot(xh.data(), deq.data(), k, b);
              exact = e.value;
              mag = e.magnitude;
            }
            const double err = std::fabs(y.data<float>()[r * n + j] - exact);
            ASSERT_LE(err, g * mag) << "m " << m << " k " << k << " given max " << given_max
                                    << " at (" << r << ", " << j << ")";
            if (mag > 0) worst = std::max(worst, err / (g * mag));
          }
        }
        if (k == 2048 && (m == 4 || m == 300) && !given_max) {
          std::printf("  m %lld k 2048 (%s): worst error %.2e of the bound\n",
                      static_cast<long long>(m), exact_sums ? "int32 sums" : "fp32 products on x̂",
                      worst);
          const Tensor y32 = linear(x, cw.q, bias, cw.s);
          EXPECT_NE(std::vector<float>(y32.data<float>(), y32.data<float>() + m * n),
                    std::vector<float>(y.data<float>(), y.data<float>() + m * n));
        }
      }
  // A row holding a NaN gives NaN (both paths); the others are unaffected.
  for (const int64_t m : {4, 9}) {
    const int64_t k = 64, n = 16;
    Tensor x({m, k}), w({n, k});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = dist(rng);
    x.data<float>()[2 * k + 5] = std::numeric_limits<float>::quiet_NaN();
    const Int8ChannelWeight cw = quantize_int8_channel(w, "w");
    const Tensor y = linear(x, cw.q, Tensor(), cw.s, DType::kI8);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(std::isnan(y.data<float>()[r * n + j]), r == 2) << "m " << m << " row " << r;
  }
  // Only int8 weights take int8 activations (Q8_0 ones: test_gemm_q8.cc).
  Tensor x({9, 64}), w({8, 64}, DType::kBF16);
  EXPECT_THROW(linear(x, w, Tensor(), Tensor(), DType::kI8), Error);
}

// expect_finite finds an Inf or a NaN wherever it lies (first, middle, last element) in tensors
// below and above the size from which the check is split over the team, on 1 to 3 threads, names
// its row and feature, and passes a finite tensor.
TEST(ExpectFinite, FindsEveryNonFiniteElementOnAnyTeam) {
  const int saved = omp_get_max_threads();
  for (const int64_t f : {int64_t{100}, int64_t{1} << 12}) {
    const int64_t rows = 300;  // 30000 and 1228800 elements
    Tensor t({rows, f});
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i % 7) - 3.f;
    for (int threads = 1; threads <= 3; ++threads) {
      omp_set_num_threads(threads);
      EXPECT_NO_THROW(expect_finite(t, "layers", 2, "mlp"));
      for (const int64_t at : {int64_t{0}, t.numel() / 2 + 1, t.numel() - 1})
        for (const float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
          const float kept = t.data<float>()[at];
          t.data<float>()[at] = bad;
          try {
            expect_finite(t, "layers", 2, "mlp");
            ADD_FAILURE() << "no error for " << bad << " at " << at << " on " << threads;
          } catch (const Error& e) {
            const std::string where = "layers.2.mlp produced a non-finite value";
            const std::string place =
                "at row " + std::to_string(at / f) + ", feature " + std::to_string(at % f) + " ";
            EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(place), std::string::npos) << e.what();
          }
          t.data<float>()[at] = kept;
        }
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace seqpar
