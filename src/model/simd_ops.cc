// Per-ISA instantiations of the model's vector routines (simd_ops_body.inc) and their run-time
// dispatch. Each variant lives in its own namespace; the AVX ones are compiled under
// `#pragma GCC target`, so the library needs no -m flags and runs on any x86-64 (or other) CPU.
#include "simd_ops.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "seqpar/model/ops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define SEQPAR_X86_SIMD 1
// GCC 12 reports -Wmaybe-uninitialized inside avx512fintrin.h (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#else
#define SEQPAR_X86_SIMD 0
#endif

// Unrolls the loop that follows completely (its trip count is a template constant).
#if defined(__clang__)
#define SEQPAR_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define SEQPAR_UNROLL _Pragma("GCC unroll 16")
#else
#define SEQPAR_UNROLL
#endif

namespace seqpar::model_simd {

// ---- portable scalar variant: the reference ----------------------------------------------------
namespace scalar {
constexpr int kLanes = 8;  // partial sums of one dot product

template <bool kF16>
void gemv_cols(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
               const float* bias, float* y, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint16_t* row = w + j * k;
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * k;
      float acc[kLanes] = {};
      for (int64_t i0 = 0; i0 < k; i0 += kLanes) {
        const int64_t lanes = std::min<int64_t>(kLanes, k - i0);
        for (int64_t l = 0; l < lanes; ++l) {
          const float wf = kF16 ? f16_to_f32(row[i0 + l]) : bf16_to_f32(row[i0 + l]);
          acc[l] += xr[i0 + l] * wf;
        }
      }
      float s = 0.f;
      for (float a : acc) s += a;
      y[r * n + j] = s + (bias ? bias[j] : 0.f);
    }
  }
}

void gemv_q8_cols(const float* x, int64_t m, int64_t k, const int8_t* q, const uint16_t* d,
                  int64_t n, const float* bias, float* y, int64_t j0, int64_t j1) {
  const int64_t blocks = k / kQ8Block;
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * k;
      float acc = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int8_t* qb = q + j * k + b * kQ8Block;
        float t = 0.f;
        for (int64_t i = 0; i < kQ8Block; ++i)
          t += xr[b * kQ8Block + i] * static_cast<float>(qb[i]);
        acc += t * f16_to_f32(d[j * blocks + b]);
      }
      y[r * n + j] = acc + (bias ? bias[j] : 0.f);
    }
  }
}

void dequant_q8(const int8_t* q, const uint16_t* d, int64_t rows, int64_t k, float* w) {
  const int64_t blocks = rows * (k / kQ8Block);
  for (int64_t b = 0; b < blocks; ++b) {
    const float s = f16_to_f32(d[b]);
    for (int64_t i = 0; i < kQ8Block; ++i)
      w[b * kQ8Block + i] = s * static_cast<float>(q[b * kQ8Block + i]);
  }
}
}  // namespace scalar

#if SEQPAR_X86_SIMD
// ---- AVX2 + FMA + F16C: 8 floats ----------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#if defined(__clang__)  // clang ignores the GCC pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#endif
namespace avx2 {
using V = __m256;
constexpr int kW = 8;
inline V vzero() { return _mm256_setzero_ps(); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vfmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float hsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline V vload_part(const float* p, int64_t n) {
  alignas(32) float t[kW] = {};
  std::memcpy(t, p, n * sizeof(float));
  return _mm256_load_ps(t);
}
inline V vload_bf16(const uint16_t* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
inline V vload_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline V vload_bf16_part(const uint16_t* p, int64_t n) {
  alignas(16) uint16_t t[kW] = {};
  std::memcpy(t, p, n * sizeof(uint16_t));
  return vload_bf16(t);
}
inline V vload_f16_part(const uint16_t* p, int64_t n) {
  alignas(16) uint16_t t[kW] = {};
  std::memcpy(t, p, n * sizeof(uint16_t));
  return vload_f16(t);
}
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline V vbroadcast_f16(uint16_t h) { return _mm256_set1_ps(_cvtsh_ss(h)); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
#include "simd_ops_body.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options

// ---- AVX-512 (F, BW, VL): 16 floats -------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")
#if defined(__clang__)  // clang ignores the GCC pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl"))), \
                             apply_to = function)
#endif
namespace avx512 {
using V = __m512;
constexpr int kW = 16;
inline V vzero() { return _mm512_setzero_ps(); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vfmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
inline __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline V vload_part(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
inline V widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline V vload_bf16(const uint16_t* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline V vload_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline V vload_bf16_part(const uint16_t* p, int64_t n) {
  return widen_bf16(_mm256_maskz_loadu_epi16(first(n), p));
}
inline V vload_f16_part(const uint16_t* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(n), p));
}
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline V vbroadcast_f16(uint16_t h) { return _mm512_set1_ps(_cvtsh_ss(h)); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
#include "simd_ops_body.inc"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#endif  // SEQPAR_X86_SIMD

namespace {

using GemvCols = void (*)(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                          const float* bias, float* y, int64_t j0, int64_t j1);

// Runs cols(j0, j1) over [0, n) on the calling thread's OpenMP team: chunks of columns handed
// out one at a time (about 8 a thread), so that a descheduled thread's chunks go to the others.
template <typename Cols>
void over_columns(int64_t n, Cols&& cols) {
  const int team = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (team == 1) return cols(0, n);
  const int64_t chunk = std::max<int64_t>(16, (n + 8 * team - 1) / (8 * team));
  const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (int64_t c = 0; c < chunks; ++c) cols(c * chunk, std::min(n, (c + 1) * chunk));
}

template <GemvCols kCols>
void gemv(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, const float* bias,
          float* y) {
  SEQPAR_CHECK(m >= 1 && m <= kMaxRows, "gemv: ", m, " rows; at most ", kMaxRows);
  over_columns(n, [&](int64_t j0, int64_t j1) { kCols(x, m, k, w, n, bias, y, j0, j1); });
}

using GemvQ8Cols = void (*)(const float* x, int64_t m, int64_t k, const int8_t* q,
                            const uint16_t* d, int64_t n, const float* bias, float* y, int64_t j0,
                            int64_t j1);

template <GemvQ8Cols kCols>
void gemv_q8(const float* x, int64_t m, int64_t k, const int8_t* q, const uint16_t* d, int64_t n,
             const float* bias, float* y) {
  SEQPAR_CHECK(m >= 1 && m <= kMaxRows, "gemv_q8: ", m, " rows; at most ", kMaxRows);
  SEQPAR_CHECK(k % kQ8Block == 0, "gemv_q8: k ", k, " is not a multiple of ", kQ8Block);
  over_columns(n, [&](int64_t j0, int64_t j1) { kCols(x, m, k, q, d, n, bias, y, j0, j1); });
}

const Kernels kScalar{Isa::kScalar,
                      &gemv<&scalar::gemv_cols<false>>,
                      &gemv<&scalar::gemv_cols<true>>,
                      &gemv_q8<&scalar::gemv_q8_cols>,
                      &scalar::dequant_q8,
                      scalar::kLanes};
#if SEQPAR_X86_SIMD
const Kernels kAvx2{Isa::kAvx2,
                    &gemv<&avx2::gemv_cols<false>>,
                    &gemv<&avx2::gemv_cols<true>>,
                    &gemv_q8<&avx2::gemv_q8_cols>,
                    &avx2::dequant_q8,
                    avx2::kW};
const Kernels kAvx512{Isa::kAvx512,
                      &gemv<&avx512::gemv_cols<false>>,
                      &gemv<&avx512::gemv_cols<true>>,
                      &gemv_q8<&avx512::gemv_q8_cols>,
                      &avx512::dequant_q8,
                      avx512::kW};
#endif

}  // namespace

const Kernels& kernels(Isa isa) {
  check_cpu_has(isa);
#if SEQPAR_X86_SIMD
  if (isa == Isa::kAvx512) return kAvx512;
  if (isa == Isa::kAvx2) return kAvx2;
#endif
  return kScalar;
}

const Kernels& kernels() {
  static const Kernels& chosen = kernels(kernel_isa());
  return chosen;
}

}  // namespace seqpar::model_simd

namespace seqpar {

std::string model_kernel_info() {
  const std::string_view gemv = model_simd::isa_name(model_simd::kernels().isa);
  return detail::concat("gemv_bf16 ", gemv, ", gemv_f16 ", gemv, ", gemv_q8 ", gemv, ", convert ",
                        convert_isa(), ", bf16 activations ", bf16_activations_path());
}

}  // namespace seqpar
