// The elementwise and normalisation kernels of src/model/simd_ops.h (norms, activations, residual
// adds, modulation, RoPE, the full-range exp), every variant this CPU runs, against a float64
// reference of the same formula over a sweep: features 1..5000 (tails of every length below the
// widest vector, and past it), rows 1..2000, values over many decades with zeros, subnormals,
// values near fp32's largest, NaN and ±Inf.
//
// Finite outputs must lie within the error bound simd_ops.h derives for the op and variant;
// non-finite ones must be what the scalar variant (the reference loops) gives at that place: NaN
// for NaN, the same signed Inf for Inf. Every variant must also give the same bits for any number
// of threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "simd_ops.h"

namespace seqpar::model_simd {
namespace {

constexpr double kU = 0x1p-24;
// Outputs in fp32's subnormal range carry another absolute error of this (simd_ops.h).
constexpr double kSubnormal = 0x1p-125;

std::vector<Isa> variants() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (cpu_has(isa)) v.push_back(isa);
  return v;
}

// n values: normal with a scale from 1e-6 to 1e6 per value; with `specials`, about one in 16 is a
// zero (of either sign), a subnormal, ±1e30, ±3e38, NaN or ±Inf.
std::vector<float> values(int64_t n, std::mt19937& rng, bool specials) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> decade(-6.f, 6.f);
  std::uniform_int_distribution<int> pick(0, 15 * 9);
  const float kSpecial[] = {0.f,   -0.f,   1e-40f, -3e-42f,  1e30f,    -1e30f,
                            3e38f, -3e38f, NAN,    INFINITY, -INFINITY};
  std::vector<float> v(n);
  for (float& x : v) {
    x = normal(rng) * std::pow(10.f, decade(rng));
    const int p = pick(rng);
    if (specials && p < 11) x = kSpecial[p];
  }
  return v;
}

// Compares one op's outputs: `got` from a variant, `scalar` from the scalar variant, `exact` the
// float64 value and `bound` its allowed error. Reports the first few failures and keeps the
// largest error / bound seen.
struct Checker {
  std::string op;
  Isa isa;
  double worst = 0;  // max |got - exact| / bound
  int failures = 0;

  void check(const std::string& where, const float* got, const float* scalar,
             const std::vector<double>& exact, const std::vector<double>& bound) {
    for (size_t i = 0; i < exact.size(); ++i) {
      const float g = got[i], s = scalar[i];
      bool ok;
      if (!std::isfinite(g) || !std::isfinite(s)) {
        ok = (std::isnan(g) && std::isnan(s)) || g == s;
      } else {
        const double err = std::fabs(static_cast<double>(g) - exact[i]);
        ok = err <= bound[i];
        if (bound[i] > 0) worst = std::max(worst, err / bound[i]);
      }
      if (!ok && ++failures <= 5) {
        ADD_FAILURE() << op << " " << isa_name(isa) << " " << where << " [" << i << "]: " << g
                      << " (scalar " << s << ", exact " << exact[i] << ", bound " << bound[i]
                      << ")";
      }
    }
  }
  ~Checker() {
    std::printf("  %-12s %-7s worst error / bound %.3f\n", op.c_str(),
                std::string(isa_name(isa)).c_str(), worst);
  }
};

const std::vector<int64_t> kFeatures = {1,   2,   3,   5,   7,    8,    9,    15,   16,
                                        17,  31,  32,  33,  63,   64,   65,   100,  127,
                                        128, 129, 255, 257, 1000, 1023, 2048, 3000, 5000};

// Calls fn(rows, f, "rows x f") for every shape of the sweep: each number of features with 1, a
// few and (for narrow rows) many rows.
template <typename Fn>
void for_each_shape(Fn&& fn) {
  for (int64_t f : kFeatures) {
    const std::vector<int64_t> rows_list = f <= 16    ? std::vector<int64_t>{1, 3, 2000}
                                           : f <= 128 ? std::vector<int64_t>{1, 7, 300}
                                                      : std::vector<int64_t>{1, 5};
    for (int64_t rows : rows_list) fn(rows, f, std::to_string(rows) + "x" + std::to_string(f));
  }
}

TEST(ModelSimd, ExpFullRange) {
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> wide(-120.f, 100.f);
    std::vector<float> x(200000);
    for (float& v : x) v = wide(rng);
    for (float v : {0.f,     -0.f,    1e-30f,   -1e-30f,  88.72f,   88.7228f,  88.73f,
                    -87.33f, -87.34f, -103.97f, -103.98f, -104.f,   -110.f,    -200.f,
                    200.f,   1e30f,   -1e30f,   NAN,      INFINITY, -INFINITY, 1.5f})
      x.push_back(v);
    std::vector<float> y(x.size(), NAN);  // an output left unwritten fails
    kern.exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
    double worst = 0, worst_rel = 0;  // worst_rel: max |y - e| / e where e is normal in fp32
    int failures = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = std::exp(static_cast<double>(x[i]));
      bool ok;
      if (std::isnan(x[i])) {
        ok = std::isnan(y[i]);
      } else if (std::isinf(y[i])) {
        ok = y[i] > 0 && e >= FLT_MAX * (1 - 5 * kU);
      } else {
        const double bound = 5 * kU * e + 0x1p-150;
        ok = std::fabs(y[i] - e) <= bound;
        worst = std::max(worst, std::fabs(y[i] - e) / bound);
        if (e >= 0x1p-126) worst_rel = std::max(worst_rel, std::fabs(y[i] - e) / e);
      }
      if (!ok && ++failures <= 5)
        ADD_FAILURE() << isa_name(isa) << " exp(" << x[i] << ") = " << y[i] << ", exact " << e;
    }
    std::printf("  %-12s %-7s worst error / bound %.3f (relative error %.2f u)\n", "exp",
                std::string(isa_name(isa)).c_str(), worst, worst_rel / kU);
  }
}

TEST(ModelSimd, NormsWithinBound) {
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    const Kernels& ref = kernels(Isa::kScalar);
    Checker sums{"sum_squares", isa}, rms{"rms_norm", isa}, ln{"layer_norm", isa};
    std::mt19937 rng(2);
    for_each_shape([&](int64_t rows, int64_t f, const std::string& where) {
      // Rows 0, 3, 6, ... are finite, of one decade each (their bounds are checked); the
      // others hold specials and large values (their NaN and Inf are checked).
      std::vector<float> x = values(rows * f, rng, true);
      std::normal_distribution<float> normal(0.f, 1.f);
      for (int64_t r = 0; r < rows; r += 3) {
        // A decade from 1e-6 to 1e6, and on odd rows a mean as large as the spread.
        const float scale = std::pow(10.f, static_cast<float>(r % 13) - 6.f);
        for (int64_t i = 0; i < f; ++i) x[r * f + i] = normal(rng) * scale + (r % 2 ? scale : 0);
      }
      const std::vector<float> w = values(f, rng, false), b = values(f, rng, false);
      const float eps = 1e-6f;

      // Sums of squares, and rms_norm from them (with and without a weight).
      std::vector<float> s(rows, NAN), s_ref(rows);
      kern.sum_squares(x.data(), rows, f, s.data());
      ref.sum_squares(x.data(), rows, f, s_ref.data());
      std::vector<double> exact(rows), bound(rows);
      for (int64_t r = 0; r < rows; ++r) {
        long double acc = 0;
        for (int64_t i = 0; i < f; ++i)
          acc += static_cast<long double>(x[r * f + i]) * x[r * f + i];
        exact[r] = static_cast<double>(acc);
        bound[r] = 1.01 * kU * exact[r] + 0x1p-149;
      }
      sums.check(where, s.data(), s_ref.data(), exact, bound);
      for (const float* weight : {static_cast<const float*>(nullptr), w.data()}) {
        std::vector<float> y(rows * f, NAN), y_ref(rows * f);
        kern.rms_norm(x.data(), rows, f, s.data(), f, weight, eps, y.data());
        ref.rms_norm(x.data(), rows, f, s_ref.data(), f, weight, eps, y_ref.data());
        std::vector<double> ye(rows * f), yb(rows * f);
        for (int64_t r = 0; r < rows; ++r) {
          const double inv = 1 / std::sqrt(exact[r] / f + eps);
          for (int64_t i = 0; i < f; ++i) {
            ye[r * f + i] = x[r * f + i] * inv * (weight ? weight[i] : 1.0);
            yb[r * f + i] = 5.6 * kU * std::fabs(ye[r * f + i]) + kSubnormal;
          }
        }
        rms.check(where + (weight ? " weight" : ""), y.data(), y_ref.data(), ye, yb);
      }

      // layer_norm with every combination of weight and bias.
      for (int affine = 0; affine < 4; ++affine) {
        const float* weight = affine & 1 ? w.data() : nullptr;
        const float* bias = affine & 2 ? b.data() : nullptr;
        std::vector<float> y(rows * f, NAN), y_ref(rows * f);
        kern.layer_norm(x.data(), rows, f, weight, bias, eps, y.data());
        ref.layer_norm(x.data(), rows, f, weight, bias, eps, y_ref.data());
        std::vector<double> ye(rows * f), yb(rows * f);
        for (int64_t r = 0; r < rows; ++r) {
          const float* p = x.data() + r * f;
          long double sum = 0, abs_sum = 0, var = 0;
          for (int64_t i = 0; i < f; ++i) sum += p[i], abs_sum += std::fabs(p[i]);
          const long double mu = sum / f;
          for (int64_t i = 0; i < f; ++i) var += (p[i] - mu) * (p[i] - mu);
          const double inv = 1 / std::sqrt(static_cast<double>(var / f) + eps);
          for (int64_t i = 0; i < f; ++i) {
            const double wi = weight ? weight[i] : 1.0, bi = bias ? bias[i] : 0.0;
            const double t = static_cast<double>(p[i] - mu) * inv * wi;
            ye[r * f + i] = t + bi;
            yb[r * f + i] = kU * std::fabs(t + bi) + 6.1 * kU * std::fabs(t) +
                            1.1 * kU * static_cast<double>(std::fabs(mu) + abs_sum / f / 32) * inv *
                                std::fabs(wi) +
                            kSubnormal;
          }
        }
        ln.check(where + " affine " + std::to_string(affine), y.data(), y_ref.data(), ye, yb);
      }
    });
  }
}

double sigmoid(double z) { return 1 / (1 + std::exp(-z)); }

TEST(ModelSimd, ActivationsWithinBound) {
  const double k = 0.7978845608f, c = 0.044715f;
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    const Kernels& ref = kernels(Isa::kScalar);
    const bool vector = isa != Isa::kScalar;
    Checker silu{"silu", isa}, gelu{"gelu_tanh", isa}, glu{"swiglu", isa};
    std::mt19937 rng(3);
    for_each_shape([&](int64_t rows, int64_t f, const std::string& where) {
      const int64_t n = rows * f;
      // Activations live on [-30, 30] mostly: a decade scale of 1e-6..1e6 covers both the
      // linear part and the saturated tails.
      const std::vector<float> a = values(n, rng, true), b = values(n, rng, true);
      std::vector<double> ye(n), yb(n);

      std::vector<float> y = a, y_ref = a;
      kern.silu(y.data(), n);
      ref.silu(y_ref.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ye[i] = a[i] * sigmoid(a[i]);
        yb[i] = 7.1 * kU * std::fabs(ye[i]) + 0x1p-120;
      }
      silu.check(where, y.data(), y_ref.data(), ye, yb);

      y = a, y_ref = a;
      kern.gelu_tanh(y.data(), n);
      ref.gelu_tanh(y_ref.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double v = a[i], z = k * (v + c * v * v * v);
        ye[i] = v * sigmoid(2 * z);
        yb[i] = (vector ? 7.1 : 3.1) * kU * std::fabs(ye[i]) +
                (vector ? 0.92 : 2.2) * kU * std::fabs(v) + kSubnormal;
      }
      gelu.check(where, y.data(), y_ref.data(), ye, yb);

      kern.swiglu(a.data(), b.data(), n, y.data());
      ref.swiglu(a.data(), b.data(), n, y_ref.data());
      for (int64_t i = 0; i < n; ++i) {
        ye[i] = a[i] * sigmoid(a[i]) * b[i];
        yb[i] = 8.1 * kU * std::fabs(ye[i]) + 0x1p-120 * std::fabs(b[i]) + kSubnormal;
      }
      glu.check(where, y.data(), y_ref.data(), ye, yb);
    });
  }
}

TEST(ModelSimd, ResidualOpsWithinBound) {
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    const Kernels& ref = kernels(Isa::kScalar);
    Checker add{"add", isa}, mod{"modulate", isa}, gated{"gated_add", isa};
    std::mt19937 rng(4);
    for_each_shape([&](int64_t rows, int64_t f, const std::string& where) {
      const int64_t n = rows * f;
      const std::vector<float> x = values(n, rng, true), y = values(n, rng, true);
      const std::vector<float> shift = values(f, rng, true), scale = values(f, rng, true);
      std::vector<double> ye(n), yb(n);

      std::vector<float> out = x, out_ref = x;
      kern.add(out.data(), y.data(), n);
      ref.add(out_ref.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ye[i] = static_cast<double>(x[i]) + y[i];
        yb[i] = kU * std::fabs(ye[i]);
      }
      add.check(where, out.data(), out_ref.data(), ye, yb);

      out = x, out_ref = x;
      kern.modulate(out.data(), rows, f, shift.data(), scale.data());
      ref.modulate(out_ref.data(), rows, f, shift.data(), scale.data());
      for (int64_t i = 0; i < n; ++i) {
        const double m = static_cast<double>(x[i]) * (1.0 + scale[i % f]);
        ye[i] = m + shift[i % f];
        yb[i] = kU * std::fabs(ye[i]) + 2.01 * kU * std::fabs(m) + kSubnormal;
      }
      mod.check(where, out.data(), out_ref.data(), ye, yb);

      out = x, out_ref = x;
      kern.gated_add(out.data(), rows, f, shift.data(), y.data());
      ref.gated_add(out_ref.data(), rows, f, shift.data(), y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double g = static_cast<double>(shift[i % f]) * y[i];
        ye[i] = x[i] + g;
        yb[i] = kU * std::fabs(ye[i]) + 1.01 * kU * std::fabs(g) + kSubnormal;
      }
      gated.check(where, out.data(), out_ref.data(), ye, yb);
    });
  }
}

TEST(ModelSimd, RopeWithinBound) {
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    const Kernels& ref = kernels(Isa::kScalar);
    Checker rope{"rope", isa};
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> angle(-100.f, 100.f);
    for (int64_t d : {1, 2, 4, 6, 7, 14, 16, 18, 31, 32, 34, 64, 66, 96, 128, 130, 256})
      for (int64_t tokens : {1, 5, 40})
        for (int64_t heads : {1, 3})
          for (bool halves : {false, true}) {
            const int64_t pairs = d / 2, n = tokens * heads * d;
            const std::string where = std::to_string(tokens) + "x" + std::to_string(heads) + "x" +
                                      std::to_string(d) + (halves ? " halves" : "");
            std::vector<float> table(tokens * pairs * 2);
            for (int64_t i = 0; i < tokens * pairs; ++i) {
              const float a = angle(rng);
              table[2 * i] = std::cos(a);
              table[2 * i + 1] = std::sin(a);
            }
            const std::vector<float> x = values(n, rng, true);
            std::vector<float> y = x, y_ref = x;
            kern.rope(y.data(), tokens, heads, d, table.data(), halves);
            ref.rope(y_ref.data(), tokens, heads, d, table.data(), halves);
            std::vector<double> ye(x.begin(), x.end()), yb(n, 0.0);
            const int64_t step = halves ? 1 : 2, second = halves ? pairs : 1;
            for (int64_t t = 0; t < tokens; ++t)
              for (int64_t h = 0; h < heads; ++h)
                for (int64_t j = 0; j < pairs; ++j) {
                  const int64_t ia = (t * heads + h) * d + j * step, ic = ia + second;
                  const double a = x[ia], c = x[ic], co = table[(t * pairs + j) * 2],
                               si = table[(t * pairs + j) * 2 + 1];
                  ye[ia] = a * co - c * si;
                  ye[ic] = a * si + c * co;
                  yb[ia] = 2.01 * kU * (std::fabs(a * co) + std::fabs(c * si)) + kSubnormal;
                  yb[ic] = 2.01 * kU * (std::fabs(a * si) + std::fabs(c * co)) + kSubnormal;
                }
            rope.check(where, y.data(), y_ref.data(), ye, yb);
          }
  }
}

// Every op's bits for 1, 2, 3 and 7 threads, on shapes large enough to be split (2000 x 300,
// a prefill's rows).
TEST(ModelSimd, ResultsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  const int64_t rows = 2000, f = 300, n = rows * f, heads = 5, d = 60;
  std::mt19937 rng(6);
  const std::vector<float> x = values(n, rng, true), y = values(n, rng, true);
  const std::vector<float> w = values(f, rng, false), b = values(f, rng, false);
  std::vector<float> table(rows * f / heads);
  for (float& v : table) v = std::cos(static_cast<float>(&v - table.data()));
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    const std::vector<std::pair<std::string, std::function<void(float*)>>> ops = {
        {"sum_squares", [&](float* out) { kern.sum_squares(x.data(), rows, f, out); }},
        {"rms_norm",
         [&](float* out) {
           std::vector<float> s(rows, 5.f);
           kern.rms_norm(x.data(), rows, f, s.data(), f, w.data(), 1e-6f, out);
         }},
        {"layer_norm",
         [&](float* out) { kern.layer_norm(x.data(), rows, f, w.data(), b.data(), 1e-6f, out); }},
        {"silu", [&](float* out) { std::copy(x.begin(), x.end(), out), kern.silu(out, n); }},
        {"gelu_tanh",
         [&](float* out) { std::copy(x.begin(), x.end(), out), kern.gelu_tanh(out, n); }},
        {"swiglu", [&](float* out) { kern.swiglu(x.data(), y.data(), n, out); }},
        {"add",
         [&](float* out) { std::copy(x.begin(), x.end(), out), kern.add(out, y.data(), n); }},
        {"modulate",
         [&](float* out) {
           std::copy(x.begin(), x.end(), out), kern.modulate(out, rows, f, w.data(), b.data());
         }},
        {"gated_add",
         [&](float* out) {
           std::copy(x.begin(), x.end(), out), kern.gated_add(out, rows, f, w.data(), y.data());
         }},
        {"rope", [&](float* out) {
           std::copy(x.begin(), x.end(), out);
           kern.rope(out, rows, heads, d, table.data(), true);
         }}};
    for (const auto& [name, op] : ops) {
      std::vector<float> one(n), many(n);
      omp_set_num_threads(1);
      op(one.data());
      for (int t : {2, 3, 7}) {
        omp_set_num_threads(t);
        op(many.data());
        EXPECT_EQ(std::memcmp(one.data(), many.data(), n * sizeof(float)), 0)
            << name << " " << isa_name(isa) << " with " << t << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace seqpar::model_simd
