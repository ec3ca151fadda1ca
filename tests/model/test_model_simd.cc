// The elementwise and normalisation kernels of src/model/simd_ops.h (norms, activations, residual
// adds, modulation, RoPE, the full-range exp), every variant this CPU runs, against a float64
// reference of the same formula over a sweep: features 1..5000 (tails of every length below the
// widest vector, and past it), rows 1..2000, values over many decades with zeros, subnormals,
// values near fp32's largest, NaN and ±Inf.
//
// Finite outputs must lie within the error bound simd_ops.h derives for the op and variant;
// non-finite ones must be what the scalar variant (the reference loops) gives at that place: NaN
// for NaN, the same signed Inf for Inf. Every variant must also give the same bits for any number
// of threads, and on a board of ranks as threads (core/team.h) where another rank takes chunks.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "seqpar/core/team.h"
#include "seqpar/model/ops.h"
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

// Runs op on member 0 of a board of two threads of one OpenMP thread each (as tp 2's ranks on the
// threads backend), while member 1 runs the chunks it can claim, until op returns.
void on_board(const std::function<void()>& op) {
  TeamBoard board(2);
  std::atomic<bool> done{false};
  std::thread helper([&] {
    omp_set_num_threads(1);
    OnTeamBoard on(board, 1);
    while (!done.load()) help_on_board();
  });
  std::thread owner([&] {
    omp_set_num_threads(1);
    OnTeamBoard on(board, 0);
    op();
    done.store(true);
  });
  owner.join();
  helper.join();
}

// On a board, the products' column loops of a member with one thread are chunked for the
// board's threads (each column once), so that another member can take a share.
TEST(ModelSimd, ColumnLoopsOnABoardAreChunkedForItsThreads) {
  std::vector<std::pair<int64_t, int64_t>> columns;
  std::mutex mu;
  on_board([&] {
    EXPECT_EQ(loop_threads(), 2);
    over_columns(4096, 16, [&](int64_t j0, int64_t j1) {
      std::lock_guard<std::mutex> lock(mu);
      columns.emplace_back(j0, j1);
    });
  });
  std::sort(columns.begin(), columns.end());
  ASSERT_GE(columns.size(), 2u);
  EXPECT_EQ(columns.front().first, 0);
  for (size_t i = 1; i < columns.size(); ++i) EXPECT_EQ(columns[i].first, columns[i - 1].second);
  EXPECT_EQ(columns.back().second, 4096);
}

// Every op's bits for 1, 2, 3 and 7 threads and on a board of two one-thread members, on shapes
// large enough to be split (2000 x 300, a prefill's rows).
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
      std::fill(many.begin(), many.end(), 0.f);
      on_board([&] { op(many.data()); });
      EXPECT_EQ(std::memcmp(one.data(), many.data(), n * sizeof(float)), 0)
          << name << " " << isa_name(isa) << " on a board";
    }
  }
  omp_set_num_threads(saved);
}

// ---- per-channel int8 (ops.h quantize_int8_channel, gemv_i8_channel, dequant_i8_channel) -----

// Roundings one output of gemv_i8_channel passes through (simd_ops.h): those of the 16-bit gemv for
// the same m and k (its product or FMA chain, the accumulator adds, the lane tree, the bias), and
// the multiply by the row's scale.
int64_t i8_channel_roundings(const Kernels& kern, int64_t m, int64_t k) {
  const int64_t w = kern.width;
  int64_t d;
  if (kern.isa == Isa::kScalar) {  // product, chain of ceil(k / w) adds, w - 1 lane adds, bias
    d = 1 + (k + w - 1) / w + (w - 1) + 1;
  } else {
    const int64_t u = gemv_unroll(m, static_cast<int>(w));
    int64_t tree = 0;
    while ((int64_t{1} << tree) < w) ++tree;
    d = k / (u * w) + u + (u - 1) + tree + 1;
  }
  return d + 1;
}

// A per-channel weight (n, k): int8 values with zeros sprinkled in, every third row all zeros
// (its scale 0 or not), scales over 50 decades (1e-30 .. 1e20).
struct ChannelCase {
  std::vector<int8_t> q;
  std::vector<float> s;
};
ChannelCase random_channel(int64_t n, int64_t k, std::mt19937& rng) {
  std::uniform_int_distribution<int> qd(-127, 127), zero(0, 7);
  std::uniform_real_distribution<float> decade(-30.f, 20.f);
  ChannelCase c{std::vector<int8_t>(n * k), std::vector<float>(n)};
  for (int64_t j = 0; j < n; ++j) {
    c.s[j] = std::pow(10.f, decade(rng));
    for (int64_t i = 0; i < k; ++i)
      c.q[j * k + i] = j % 3 == 2 || zero(rng) == 0 ? 0 : static_cast<int8_t>(qd(rng));
    if (j % 6 == 5) c.s[j] = 0.f;
  }
  return c;
}

// Every variant against float64 over k 1..2048 (tails of every length below the widest unrolled
// step, k not a multiple of 32 or of the vector width), m 1..8, odd n, with and without bias, x
// over six decades: within γ_d · (s·Σ|x·q| + |b|), d from the summation simd_ops.h states.
TEST(ModelSimd, GemvI8ChannelWithinSummationBoundOfFloat64) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    std::mt19937 rng(21);
    std::normal_distribution<float> dist(0.f, 1.f);
    std::uniform_real_distribution<float> decade(-3.f, 3.f);
    double worst = 0;
    for (int64_t m = 1; m <= kMaxRows; ++m)
      for (int64_t k : {1,  2,  3,  7,  8,  9,   15,  16,  17,  31,   32,
                        33, 45, 63, 64, 65, 100, 127, 129, 257, 1000, 2048})
        for (int64_t n : {1, 7, 33}) {
          for (bool bias : {false, true}) {
            const ChannelCase w = random_channel(n, k, rng);
            std::vector<float> x(m * k), b(n);
            for (float& v : x) v = dist(rng) * std::pow(10.f, decade(rng));
            for (int64_t i = 0; i < m * k; i += 5) x[i] = 0.f;
            for (float& v : b) v = dist(rng);
            std::vector<float> y(m * n, NAN);
            kern.gemv_i8_channel(x.data(), m, k, w.q.data(), w.s.data(), n,
                                 bias ? b.data() : nullptr, y.data());
            const double d = static_cast<double>(i8_channel_roundings(kern, m, k));
            const double gamma = d * kU / (1 - d * kU);
            for (int64_t r = 0; r < m; ++r)
              for (int64_t j = 0; j < n; ++j) {
                double dot = 0, mag = 0;
                for (int64_t i = 0; i < k; ++i) {
                  const double p = static_cast<double>(x[r * k + i]) * w.q[j * k + i];
                  dot += p;
                  mag += std::fabs(p);
                }
                const double bj = bias ? b[j] : 0.0;
                const double exact = dot * w.s[j] + bj,
                             bound = gamma * (mag * w.s[j] + std::fabs(bj));
                const double err = std::fabs(y[r * n + j] - exact);
                ASSERT_LE(err, bound)
                    << isa_name(isa) << " m " << m << " k " << k << " n " << n << " bias " << bias
                    << " at (" << r << ", " << j << "): " << y[r * n + j] << " vs " << exact;
                if (bound > 0) worst = std::max(worst, err / bound);
              }
          }
        }
    std::printf("  gemv_i8_channel %-7s worst error / bound %.3f\n",
                std::string(isa_name(isa)).c_str(), worst);
  }
  omp_set_num_threads(saved);
}

// The dequantized rows are s·q rounded once to fp32: float64's product (exact: 8 x 24 bits)
// rounded to fp32, bit for bit, in every variant; k with tails of every length.
TEST(ModelSimd, DequantI8ChannelIsTheRoundedProduct) {
  for (Isa isa : variants()) {
    std::mt19937 rng(23);
    for (int64_t k : {1, 5, 8, 15, 16, 17, 33, 45, 100}) {
      const int64_t rows = 7;
      const ChannelCase w = random_channel(rows, k, rng);
      std::vector<float> out(rows * k, NAN);
      kernels(isa).dequant_i8_channel(w.q.data(), w.s.data(), rows, k, out.data());
      for (int64_t i = 0; i < rows * k; ++i)
        ASSERT_EQ(out[i], static_cast<float>(static_cast<double>(w.s[i / k]) * w.q[i]))
            << isa_name(isa) << " k " << k << " element " << i;
    }
  }
}

// int8 values widened to bf16 are the values themselves: every int8 value, at every position of
// a vector and in tails of every length, the bits of f32_to_bf16 of the value, in every variant;
// nothing written past n.
TEST(ModelSimd, WidenI8Bf16IsExact) {
  std::vector<int8_t> q(256 + 37);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>(i * 7 - 128);
  for (Isa isa : variants())
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 256, 256 + 37}) {
      std::vector<uint16_t> out(n + 1, 0xdead);
      kernels(isa).widen_i8_bf16(q.data(), n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], f32_to_bf16(static_cast<float>(q[i])))
            << isa_name(isa) << " n " << n << " element " << i;
        ASSERT_EQ(bf16_to_f32(out[i]), static_cast<float>(q[i]));
      }
      ASSERT_EQ(out[n], 0xdead) << isa_name(isa) << " wrote past " << n;
    }
}

// ---- int8 activations (ops.h linear(): row_abs_max, quantize_rows_s8, scale_int32_rows) --------

// Every variant gives the definition's bits: the row maxima of |x| (+Inf for a row holding a NaN
// or an Inf, wherever it lies), the quotients x / s rounded to nearest with ties to even and away
// from zero (values placed on the ties n + 1/2, just below them, on ±127.5 and beyond ±127, and
// rows with s 0, Inf or NaN: zeros),
// and fl(fl(fl(acc)·s_x)·s_w) (+ b) from int32 sums in place, with acc beyond 2^24 (a rounded
// conversion); k and n with tails of every length; nothing written past a row.
TEST(ModelSimd, Int8ActivationKernelsGiveTheDefinitionsBits) {
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    std::mt19937 rng(41);
    std::normal_distribution<float> dist(0.f, 1.f);
    std::uniform_int_distribution<int32_t> big(-(1 << 30), 1 << 30);
    for (int64_t k : {1, 5, 8, 15, 16, 17, 33, 100}) {
      const int64_t rows = 6;
      std::vector<float> x(rows * k);
      for (float& v : x) v = dist(rng) * 3.f;
      x[(2 * k) + k / 2] = NAN;        // row 2: NaN
      x[(3 * k) + k - 1] = -INFINITY;  // row 3: -Inf in the tail
      std::vector<float> amax(rows, -1.f);
      kern.row_abs_max(x.data(), rows, k, amax.data());
      for (int64_t r = 0; r < rows; ++r) {
        float want = 0.f;
        bool bad = false;
        for (int64_t i = 0; i < k; ++i) {
          bad |= !std::isfinite(x[r * k + i]);
          want = std::max(want, std::fabs(x[r * k + i]));
        }
        ASSERT_EQ(amax[r], bad ? INFINITY : want) << isa_name(isa) << " k " << k << " row " << r;
      }
      // Quotients on ties and past the range, rounded both ways: s = 1 (row 0), 0.5 (row 1), 0
      // (row 2), Inf (3), NaN (4), 1 / 64 (5).
      const float s[rows] = {1.f, 0.5f, 0.f, INFINITY, NAN, 1.f / 64.f};
      for (int64_t i = 0; i < k; ++i) {
        x[i] = static_cast<float>(i % 9) - 4.5f;                 // ties: -4.5 .. 3.5
        x[k + i] = (i % 2 ? 1.f : -1.f) * (63.75f + 0.25f * i);  // 127.5, 128, ... and below
        // Row 5: ties ±0.5 .. ±3.5 and the floats just below them (0.5 - 2^-25 and the like,
        // which a rounding by trunc(|t| + 0.5) takes up), each over s = 1 / 64 exactly.
        const float tie = static_cast<float>(i % 4) + 0.5f;
        x[5 * k + i] = (i % 2 ? -1.f : 1.f) * (i % 3 ? tie : std::nextafter(tie, 0.f)) / 64.f;
      }
      for (const Ties ties : {Ties::kEven, Ties::kAway}) {
        std::vector<int8_t> q(rows * k + 1, 99);
        kern.quantize_rows_s8(x.data(), rows, k, s, ties, q.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < k; ++i) {
            const bool zero = !(s[r] > 0.f) || !std::isfinite(s[r]);
            const float t = std::clamp(x[r * k + i] / s[r], -127.f, 127.f);
            const int8_t want =
                zero ? 0
                     : static_cast<int8_t>(ties == Ties::kEven ? std::nearbyint(t) : std::round(t));
            ASSERT_EQ(q[r * k + i], want) << isa_name(isa) << " k " << k << " row " << r << " " << t
                                          << " ties " << (ties == Ties::kEven ? "even" : "away");
          }
        ASSERT_EQ(q[rows * k], 99) << isa_name(isa) << " wrote past the rows";
      }
      // The int32 sums in place, a row stride past n (untouched between rows).
      const int64_t n = k, ldc = n + 3;
      std::vector<float> y(rows * ldc), sx(rows), sw(n), b(n);
      std::vector<int32_t> acc(rows * n);
      for (int64_t r = 0; r < rows; ++r) sx[r] = std::fabs(dist(rng)) * 0.01f;
      for (int64_t j = 0; j < n; ++j) {
        sw[j] = std::fabs(dist(rng)) * 0.01f;
        b[j] = dist(rng);
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < ldc; ++j) {
          if (j < n) {
            acc[r * n + j] = j % 3 ? big(rng) : static_cast<int32_t>(j * 1000 - 7);
            std::memcpy(&y[r * ldc + j], &acc[r * n + j], 4);
          } else {
            y[r * ldc + j] = -7.f;
          }
        }
      for (const bool with_bias : {false, true}) {
        std::vector<float> z = y;
        kern.scale_int32_rows(z.data(), rows, n, ldc, sx.data(), sw.data(),
                              with_bias ? b.data() : nullptr);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < ldc; ++j) {
            float want = -7.f;
            if (j < n) {
              want = static_cast<float>(acc[r * n + j]) * sx[r] * sw[j];
              if (with_bias) want += b[j];
            }
            ASSERT_EQ(z[r * ldc + j], want)
                << isa_name(isa) << " n " << n << " bias " << with_bias << " at " << r << ", " << j;
          }
      }
    }
  }
}

// Q8_0's quantization (ops.h quantize_q8_0) gives the definition's bits in every variant: per
// block of 32 the scale fp16(max |w| / 127) and round(w · (1 / s)), ties away from zero; on
// blocks over 70 decades, zero blocks, a block with one nonzero, and blocks whose scale is 1 with
// elements on the ties n + 1/2 and just below them.
TEST(ModelSimd, QuantizeQ8GivesTheDefinitionsBits) {
  std::mt19937 rng(43);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::uniform_real_distribution<float> ed(-38.f, 30.f);
  const int64_t rows = 7, k = 4 * kQ8Block;
  std::vector<float> w(rows * k);
  for (int64_t b = 0; b < rows * k / kQ8Block; ++b) {
    const float scale = std::pow(10.f, ed(rng));
    for (int64_t i = 0; i < kQ8Block; ++i) w[b * kQ8Block + i] = dist(rng) * scale;
  }
  for (int64_t i = 0; i < kQ8Block; ++i) {
    w[i] = 0.f;                                // a zero block
    w[kQ8Block + i] = i == 5 ? -3e-30f : 0.f;  // one nonzero
    const float tie = static_cast<float>(i % 8) + 0.5f;
    w[2 * kQ8Block + i] = (i % 2 ? -1.f : 1.f) * (i % 3 ? tie : std::nextafter(tie, 0.f));
    w[3 * kQ8Block + i] = i == 9 ? 1e-44f : 0.f;  // a / 127 rounds to 0: s is 0, so is q
  }
  w[2 * kQ8Block] = 127.f;  // that block's scale: 1
  for (Isa isa : variants()) {
    std::vector<int8_t> q(rows * k + 1, 99);
    std::vector<uint16_t> d(rows * k / kQ8Block + 1, 7);
    kernels(isa).quantize_q8(w.data(), rows, k, q.data(), d.data());
    for (int64_t b = 0; b < rows * k / kQ8Block; ++b) {
      float a = 0.f;
      for (int64_t i = 0; i < kQ8Block; ++i) a = std::max(a, std::fabs(w[b * kQ8Block + i]));
      const float s = a / 127.f, inv = s == 0.f ? 0.f : 1.f / s;
      ASSERT_EQ(d[b], f32_to_f16(s)) << isa_name(isa) << " block " << b;
      for (int64_t i = 0; i < kQ8Block; ++i)
        ASSERT_EQ(q[b * kQ8Block + i], static_cast<int8_t>(std::round(w[b * kQ8Block + i] * inv)))
            << isa_name(isa) << " block " << b << " element " << i;
    }
    ASSERT_EQ(q[rows * k], 99) << isa_name(isa) << " wrote past the values";
    ASSERT_EQ(d[rows * k / kQ8Block], 7) << isa_name(isa) << " wrote past the scales";
  }
}

// The same bits for 1, 2 and 3 threads (columns split over the team), m 1..8, n odd.
TEST(ModelSimd, GemvI8ChannelDoesNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  const int64_t k = 333, n = 301;
  for (Isa isa : variants()) {
    const Kernels& kern = kernels(isa);
    std::mt19937 rng(25);
    std::normal_distribution<float> dist(0.f, 1.f);
    const ChannelCase w = random_channel(n, k, rng);
    std::vector<float> x(kMaxRows * k), b(n);
    for (float& v : x) v = dist(rng);
    for (float& v : b) v = dist(rng);
    for (int64_t m = 1; m <= kMaxRows; ++m) {
      std::vector<float> one(m * n), many(m * n);
      omp_set_num_threads(1);
      kern.gemv_i8_channel(x.data(), m, k, w.q.data(), w.s.data(), n, b.data(), one.data());
      for (int t : {2, 3}) {
        omp_set_num_threads(t);
        kern.gemv_i8_channel(x.data(), m, k, w.q.data(), w.s.data(), n, b.data(), many.data());
        EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
            << isa_name(isa) << " m " << m << " with " << t << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace seqpar::model_simd

namespace seqpar {
namespace {

// The per-element bound of ops.h: |w - s·q| <= s·(1/2 + 128u), |w - fl(s·q)| <= s·(1/2 + 255u),
// each with another 2^-143 where s is subnormal.
constexpr double kUnit = 0x1p-24;
double channel_slack(float s) { return s < FLT_MIN ? 0x1p-143 : 0.0; }

// quantize_int8_channel against its definition, in float64: s = fp32(max |w| / 127) per row, q the
// fp32 quotient w / s rounded half away from zero, the largest element of a row ±127, each
// element within the bound; on fp32, bf16 and fp16 weights, k = 45 (no block rule), rows over
// 70 decades (up to 3e38, down to subnormals), a zero row and a row with one nonzero.
TEST(QuantizeInt8Channel, MatchesTheDefinitionAndItsErrorBound) {
  std::mt19937 rng(27);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::uniform_real_distribution<float> ed(-38.f, 30.f);
  double worst_q = 0, worst_deq = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = 40, k = 45;
    Tensor wf({n, k});
    for (int64_t j = 0; j < n; ++j) {
      // fp16 holds 6e-8 .. 65504; the others fp32's range
      const float scale =
          t == DType::kF16 ? std::pow(10.f, ed(rng) / 8.f) : std::pow(10.f, ed(rng));
      for (int64_t i = 0; i < k; ++i) wf.data<float>()[j * k + i] = dist(rng) * scale;
    }
    for (int64_t i = 0; i < k; ++i) wf.data<float>()[i] = 0.f;  // a zero row
    for (int64_t i = k; i < 2 * k; ++i) wf.data<float>()[i] = i == k + 7 ? -3.f : 0.f;
    if (t != DType::kF16) {
      for (int64_t i = 0; i < k; ++i) wf.data<float>()[2 * k + i] = (i % 3 - 1) * 3e38f;
      for (int64_t i = 0; i < k; ++i) wf.data<float>()[3 * k + i] = (i % 5) * 1e-39f;
      for (int64_t i = 0; i < k; ++i) wf.data<float>()[4 * k + i] = (i % 5) * 3e-45f;
    }
    const Tensor w = wf.to(t);
    const Int8ChannelWeight qw = quantize_int8_channel(w, "w");
    ASSERT_EQ(qw.q.dtype(), DType::kI8);
    ASSERT_EQ(qw.s.dtype(), DType::kF32);
    ASSERT_EQ(qw.s.shape(), (std::vector<int64_t>{n}));
    std::vector<float> deq(n * k);
    dequantize_int8_channel(qw.q, qw.s, 0, n, deq.data());
    for (int64_t j = 0; j < n; ++j) {
      double a = 0;
      for (int64_t i = 0; i < k; ++i) a = std::max(a, std::fabs(double{w.at(j * k + i)}));
      const float s = static_cast<float>(a) / 127.f;
      ASSERT_EQ(qw.s.data<float>()[j], s) << dtype_name(t) << " row " << j;
      int top = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t e = j * k + i;
        const int q = qw.q.data<int8_t>()[e];
        ASSERT_LE(std::abs(q), 127);
        const float scaled = s == 0.f ? 0.f : w.at(e) / s;
        const double frac = std::fabs(scaled) - std::floor(std::fabs(scaled));
        const double rounded =
            std::copysign(std::floor(std::fabs(scaled)) + (frac >= 0.5 ? 1 : 0), scaled);
        const int expect = static_cast<int>(std::clamp(rounded, -127.0, 127.0));
        ASSERT_EQ(q, expect) << dtype_name(t) << " element " << e << " (" << scaled << ")";
        if (std::fabs(double{w.at(e)}) == a && a > 0) top = std::abs(q);
        ASSERT_EQ(deq[e], static_cast<float>(double{s} * q));
        const double err_q = std::fabs(w.at(e) - double{s} * q);
        const double err_deq = std::fabs(w.at(e) - double{deq[e]});
        const double bound_q = s * (0.5 + 128 * kUnit) + channel_slack(s);
        const double bound_deq = s * (0.5 + 255 * kUnit) + channel_slack(s);
        ASSERT_LE(err_q, bound_q) << dtype_name(t) << " element " << e;
        ASSERT_LE(err_deq, bound_deq) << dtype_name(t) << " element " << e;
        if (s > 0) {
          worst_q = std::max(worst_q, err_q / bound_q);
          worst_deq = std::max(worst_deq, err_deq / bound_deq);
        }
      }
      if (a > 0 && s >= FLT_MIN) {
        EXPECT_EQ(top, 127) << dtype_name(t) << " row " << j;
      }
    }
    EXPECT_EQ(qw.q.data<int8_t>()[k + 7], -127);
  }
  std::printf("  quantize_int8_channel: worst |w - s·q| / bound %.3f, |w - fl(s·q)| / bound %.3f\n",
              worst_q, worst_deq);
}

// A slice of columns quantized with the whole rows' maxima holds the same scales, and the same
// values as those columns of the whole matrix quantized: a row-parallel rank's share.
TEST(QuantizeInt8Channel, ColumnSlicesWithTheRowMaximaMatchTheWhole) {
  std::mt19937 rng(29);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t n = 9, k = 70;
  Tensor w({n, k});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = dist(rng);
  const Int8ChannelWeight whole = quantize_int8_channel(w, "w");
  Tensor amax({n});
  for (int64_t j = 0; j < n; ++j) {
    float a = 0.f;
    for (int64_t i = 0; i < k; ++i) a = std::max(a, std::fabs(w.data<float>()[j * k + i]));
    amax.data<float>()[j] = a;
  }
  for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, 35}, {35, 70}, {10, 11}}) {
    Tensor part({n, c1 - c0});
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = c0; i < c1; ++i)
        part.data<float>()[j * (c1 - c0) + i - c0] = w.data<float>()[j * k + i];
    const Int8ChannelWeight q = quantize_int8_channel(part, "w", amax);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(q.s.data<float>()[j], whole.s.data<float>()[j]) << "row " << j;
      for (int64_t i = c0; i < c1; ++i)
        ASSERT_EQ(q.q.data<int8_t>()[j * (c1 - c0) + i - c0], whole.q.data<int8_t>()[j * k + i])
            << "(" << j << ", " << i << ")";
    }
  }
  Tensor small({n});
  small.fill(1e-3f);
  EXPECT_THROW(quantize_int8_channel(w, "w", small), Error);
}

// A non-finite weight is refused in one line naming the weight, the value and its place.
TEST(QuantizeInt8Channel, RefusesNonFiniteWeights) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      Tensor w({3, 7});
      w.fill(0.5f);
      w.data<float>()[1 * 7 + 5] = bad;
      const Tensor wt = w.to(t);
      try {
        quantize_int8_channel(wt, "layers.0.self_attn.o_proj.weight");
        ADD_FAILURE() << "no error for " << bad;
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        const std::string value = std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf";
        EXPECT_EQ(what, "int8 weights: layers.0.self_attn.o_proj.weight holds " + value +
                            " at row 1, column 5; valid: finite weights");
        EXPECT_EQ(what.find('\n'), std::string::npos);
      }
    }
  }
}

// linear() with per-channel weights (k = 45, n odd): up to 8 rows through gemv_i8_channel, more
// through blocks dequantized for oneDNN's GEMM; both against float64 on s·q, within the bound of
// a k-term dot product, one more rounding for the scale or the dequantized weight.
TEST(QuantizeInt8Channel, LinearOnBothPaths) {
  std::mt19937 rng(31);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t k = 45, n = 71;
  Tensor w({n, k}, DType::kBF16), bias({n});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<uint16_t>()[i] = f32_to_bf16(dist(rng) * 0.05f);
  for (int64_t i = 0; i < k; ++i) w.data<uint16_t>()[3 * k + i] = 0;  // a zero row
  for (int64_t i = 0; i < n; ++i) bias.data<float>()[i] = dist(rng);
  const Int8ChannelWeight qw = quantize_int8_channel(w, "w");
  double worst = 0;
  for (int64_t m : {1, 3, 8, 9, 300}) {
    Tensor x({m, k});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
    const Tensor y = linear(x, qw.q, bias, qw.s);
    const double d = k + 3, g = d * kUnit / (1 - d * kUnit);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const double s = qw.s.data<float>()[j];
        double exact = bias.data<float>()[j], mag = std::fabs(exact);
        for (int64_t i = 0; i < k; ++i) {
          const double p = double{x.data<float>()[r * k + i]} * s * qw.q.data<int8_t>()[j * k + i];
          exact += p;
          mag += std::fabs(p);
        }
        const double err = std::fabs(y.data<float>()[r * n + j] - exact);
        ASSERT_LE(err, g * mag) << "m " << m << " at (" << r << ", " << j << ")";
        worst = std::max(worst, err / (g * mag));
      }
  }
  std::printf("  linear int8-channel: worst error / bound %.3f\n", worst);
  EXPECT_THROW(linear(Tensor({2, k}), qw.q, Tensor()), Error);
  EXPECT_THROW(linear(Tensor({2, k}), qw.q, Tensor(), Tensor({n + 1})), Error);
  const std::string info = model_kernel_info();
  EXPECT_NE(info.find(std::string("gemv_i8_channel ") +
                      std::string(model_simd::isa_name(model_simd::kernels().isa))),
            std::string::npos)
      << info;
}

}  // namespace
}  // namespace seqpar
