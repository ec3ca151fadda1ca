// Per-ISA instantiations of the model's vector routines (simd_ops_body.inc) and their run-time
// dispatch. Each variant lives in its own namespace; the AVX ones are compiled under
// `#pragma GCC target`, so the library needs no -m flags and runs on any x86-64 (or other) CPU.
#include "simd_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemm_packed.h"
#include "gemm_q8.h"
#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "seqpar/model/ops.h"
#include "simd_preamble.inc"
#if SEQPAR_X86_SIMD
// The lambdas of simd_ops_body.inc that return vectors are called inlined, under their variant's
// target; GCC still warns for their (unused) conversions to function pointers.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace seqpar::model_simd {

// The simple elementwise ops as plain loops, one copy for every variant: each variant's function
// inlines them and the compiler vectorises them under that variant's target (GCC 12 -O3
// -fopt-info-vec: "loop vectorized using 64 byte vectors" in the AVX-512 variant, 32 in the AVX2
// one, 16 (SSE2) in the scalar one), so they are not written with intrinsics.
[[gnu::always_inline]] inline void add_plain(float* x, const float* y, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
}
[[gnu::always_inline]] inline void modulate_plain(float* x, int64_t f, const float* shift,
                                                  const float* scale, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < f; ++i) x[r * f + i] = x[r * f + i] * (1.0f + scale[i]) + shift[i];
}
[[gnu::always_inline]] inline void gated_add_plain(float* x, int64_t f, const float* gate,
                                                   const float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < f; ++i) x[r * f + i] += gate[i] * y[r * f + i];
}

// ---- portable scalar variant: the reference ----------------------------------------------------
namespace scalar {
constexpr int kLanes = 8;  // partial sums of one dot product

void sum_squares_rows(const float* x, int64_t f, float* s, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    double acc = 0;
    for (int64_t i = 0; i < f; ++i) acc += static_cast<double>(x[r * f + i]) * x[r * f + i];
    s[r] = static_cast<float>(acc);
  }
}

void rms_norm_rows(const float* x, int64_t f, const float* sum_sq, int64_t full_width,
                   const float* weight, float eps, float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float inv = inverse_scale(sum_sq[r] / full_width + eps);
    for (int64_t i = 0; i < f; ++i) {
      const float v = x[r * f + i] * inv;
      y[r * f + i] = weight ? v * weight[i] : v;
    }
  }
}

void layer_norm_rows(const float* x, int64_t f, const float* weight, const float* bias, float eps,
                     float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* p = x + r * f;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < f; ++i) mean += p[i];
    mean /= f;
    for (int64_t i = 0; i < f; ++i) var += (p[i] - mean) * (p[i] - mean);
    var /= f;
    const float inv = inverse_scale(static_cast<float>(var) + eps);
    float* q = y + r * f;
    for (int64_t i = 0; i < f; ++i) {
      float v = (p[i] - static_cast<float>(mean)) * inv;
      if (weight) v *= weight[i];
      if (bias) v += bias[i];
      q[i] = v;
    }
  }
}

void silu_range(float* x, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void gelu_tanh_range(float* x, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
  }
}

void swiglu_range(const float* a, const float* b, float* y, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float v = a[i];
    y[i] = v / (1.0f + std::exp(-v)) * b[i];
  }
}

void add_range(float* x, const float* y, int64_t i0, int64_t i1) { add_plain(x, y, i0, i1); }
void modulate_rows(float* x, int64_t f, const float* shift, const float* scale, int64_t r0,
                   int64_t r1) {
  modulate_plain(x, f, shift, scale, r0, r1);
}
void gated_add_rows(float* x, int64_t f, const float* gate, const float* y, int64_t r0,
                    int64_t r1) {
  gated_add_plain(x, f, gate, y, r0, r1);
}

void rope_tokens(float* x, int64_t heads, int64_t d, const float* table, bool halves, int64_t t0,
                 int64_t t1) {
  const int64_t pairs = d / 2;
  // Pair j is features (j·step, j·step + second).
  const int64_t step = halves ? 1 : 2, second = halves ? pairs : 1;
  for (int64_t t = t0; t < t1; ++t) {
    const float* cs = table + t * pairs * 2;
    for (int64_t h = 0; h < heads; ++h) {
      float* row = x + (t * heads + h) * d;
      for (int64_t j = 0; j < pairs; ++j) {
        float& a = row[j * step];
        float& c = row[j * step + second];
        const float a0 = a, c0 = c;
        a = a0 * cs[2 * j] - c0 * cs[2 * j + 1];
        c = a0 * cs[2 * j + 1] + c0 * cs[2 * j];
      }
    }
  }
}

void exp_array(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// y[r, j] = (Σ_i x[r, i]·widen(w[j, i]))·scale[j] + bias[j] (scale null: no scale), the sum in
// kLanes partial sums added in sequence: the 16-bit and the per-channel int8 products.
template <typename W, typename Widen>
void gemv_lanes(const float* x, int64_t m, int64_t k, const W* w, int64_t n, const float* scale,
                const float* bias, float* y, int64_t j0, int64_t j1, Widen widen) {
  for (int64_t j = j0; j < j1; ++j) {
    const W* row = w + j * k;
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * k;
      float acc[kLanes] = {};
      for (int64_t i0 = 0; i0 < k; i0 += kLanes) {
        const int64_t lanes = std::min<int64_t>(kLanes, k - i0);
        for (int64_t l = 0; l < lanes; ++l) acc[l] += xr[i0 + l] * widen(row[i0 + l]);
      }
      float t = 0.f;
      for (float a : acc) t += a;
      y[r * n + j] = (scale ? t * scale[j] : t) + (bias ? bias[j] : 0.f);
    }
  }
}

template <bool kF16>
void gemv_cols(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
               const float* bias, float* y, int64_t j0, int64_t j1) {
  gemv_lanes(x, m, k, w, n, nullptr, bias, y, j0, j1,
             [](uint16_t v) { return kF16 ? f16_to_f32(v) : bf16_to_f32(v); });
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

void gemv_i8_channel_cols(const float* x, int64_t m, int64_t k, const int8_t* q, const float* s,
                          int64_t n, const float* bias, float* y, int64_t j0, int64_t j1) {
  gemv_lanes(x, m, k, q, n, s, bias, y, j0, j1, [](int8_t v) { return static_cast<float>(v); });
}

void dequant_i8_channel(const int8_t* q, const float* s, int64_t rows, int64_t k, float* w) {
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t i = 0; i < k; ++i) w[j * k + i] = s[j] * static_cast<float>(q[j * k + i]);
}

void widen_i8_bf16(const int8_t* q, int64_t n, uint16_t* w) {
  for (int64_t i = 0; i < n; ++i) w[i] = f32_to_bf16(static_cast<float>(q[i]));
}

void row_abs_max(const float* x, int64_t rows, int64_t k, float* amax) {
  for (int64_t r = 0; r < rows; ++r) {
    float a = 0.f;
    for (int64_t i = 0; i < k; ++i) {
      const float e = std::fabs(x[r * k + i]);
      if (!(e <= std::numeric_limits<float>::max())) {  // Inf or NaN
        a = std::numeric_limits<float>::infinity();
        break;
      }
      a = std::max(a, e);
    }
    amax[r] = a;
  }
}

void quantize_rows_s8(const float* x, int64_t rows, int64_t k, const float* s, Ties ties,
                      int8_t* q) {
  for (int64_t r = 0; r < rows; ++r) {
    const bool zero = !(s[r] > 0.f) || !std::isfinite(s[r]);
    for (int64_t i = 0; i < k; ++i) {
      const float t = std::clamp(x[r * k + i] / s[r], -127.f, 127.f);
      q[r * k + i] =
          zero ? 0 : static_cast<int8_t>(ties == Ties::kEven ? std::nearbyint(t) : std::round(t));
    }
  }
}

void quantize_q8(const float* w, int64_t rows, int64_t k, int8_t* q, uint16_t* d) {
  const int64_t blocks = rows * (k / kQ8Block);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = w + b * kQ8Block;
    float a = 0.f;
    for (int64_t i = 0; i < kQ8Block; ++i) a = std::max(a, std::fabs(v[i]));
    const float s = a / 127.f, inv = s == 0.f ? 0.f : 1.f / s;
    for (int64_t i = 0; i < kQ8Block; ++i)
      q[b * kQ8Block + i] = static_cast<int8_t>(std::round(v[i] * inv));
    d[b] = f32_to_f16(s);
  }
}

void scale_int32_rows(float* y, int64_t rows, int64_t n, int64_t ldc, const float* sx,
                      const float* sw, const float* bias) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float& e = y[r * ldc + j];
      const float v = static_cast<float>(std::bit_cast<int32_t>(e)) * sx[r] * sw[j];
      e = bias ? v + bias[j] : v;
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
#include "../core/simd_vec_avx2.inc"
inline V vload_part(const float* p, int64_t n) {
  alignas(32) float t[kW] = {};
  std::memcpy(t, p, n * sizeof(float));
  return _mm256_load_ps(t);
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
inline V vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline V vload_i8_part(const int8_t* p, int64_t n) {
  alignas(8) int8_t t[kW] = {};
  std::memcpy(t, p, n);
  return vload_i8(t);
}
inline V vbroadcast_f16(uint16_t h) { return _mm256_set1_ps(_cvtsh_ss(h)); }
inline void vstore_part(float* p, V v, int64_t n) {
  alignas(32) float t[kW];
  _mm256_store_ps(t, v);
  std::memcpy(p, t, n * sizeof(float));
}
inline __m128i high_halves(V v) {
  const __m256i h = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  // Packed within each 128-bit lane (h0..h3 h0..h3 | h4..h7 h4..h7); quadwords 0 and 2 kept.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08));
}
inline void vstore_high_halves(uint16_t* p, V v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), high_halves(v));
}
inline void vstore_high_halves_part(uint16_t* p, V v, int64_t n) {
  alignas(16) uint16_t t[kW];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), high_halves(v));
  std::memcpy(p, t, n * sizeof(uint16_t));
}
// v (integers in [-127, 127] after rounding to nearest, ties to even) as int8.
inline __m128i low_bytes(V v) {
  const __m256i i = _mm256_cvtps_epi32(v);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  return _mm_packs_epi16(w, w);
}
inline void vstore_i8(int8_t* p, V v) {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), low_bytes(v));
}
inline void vstore_i8_part(int8_t* p, V v, int64_t n) {
  alignas(16) int8_t t[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), low_bytes(v));
  std::memcpy(p, t, n);
}
// kW floats as fp16, rounded to nearest even (core/dtype.h f32_to_f16's bits).
inline void vstore_f16(uint16_t* p, V v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline V vload_i32(const int32_t* p) {
  return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline V vload_i32_part(const int32_t* p, int64_t n) {
  alignas(32) int32_t t[kW] = {};
  std::memcpy(t, p, n * sizeof(int32_t));
  return vload_i32(t);
}
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vround(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V vfloor(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline V vtrunc(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); }
inline V vpow2i(V n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
inline V vswap_pairs(V v) { return _mm256_permute_ps(v, 0xB1); }
using VD = __m256d;
inline VD vdzero() { return _mm256_setzero_pd(); }
inline VD vdset1(double a) { return _mm256_set1_pd(a); }
inline VD vd_lo(V v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
inline VD vd_hi(V v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
inline VD vdadd(VD a, VD b) { return _mm256_add_pd(a, b); }
inline VD vdsub(VD a, VD b) { return _mm256_sub_pd(a, b); }
inline VD vdfmadd(VD a, VD b, VD c) { return _mm256_fmadd_pd(a, b, c); }
inline double vdhsum(VD v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}
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
#include "../core/simd_vec_avx512.inc"
inline __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline V vload_part(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
inline V widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline V vload_bf16_part(const uint16_t* p, int64_t n) {
  return widen_bf16(_mm256_maskz_loadu_epi16(first(n), p));
}
inline V vload_f16_part(const uint16_t* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(n), p));
}
inline V vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline V vload_i8_part(const int8_t* p, int64_t n) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(first(n), p)));
}
inline V vbroadcast_f16(uint16_t h) { return _mm512_set1_ps(_cvtsh_ss(h)); }
inline void vstore_part(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
inline __m256i high_halves(V v) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
}
inline void vstore_high_halves(uint16_t* p, V v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), high_halves(v));
}
inline void vstore_high_halves_part(uint16_t* p, V v, int64_t n) {
  _mm256_mask_storeu_epi16(p, first(n), high_halves(v));
}
// v (integers in [-127, 127] after rounding to nearest, ties to even) as int8.
inline void vstore_i8(int8_t* p, V v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}
inline void vstore_i8_part(int8_t* p, V v, int64_t n) {
  _mm_mask_storeu_epi8(p, first(n), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}
// kW floats as fp16, rounded to nearest even (core/dtype.h f32_to_f16's bits).
inline void vstore_f16(uint16_t* p, V v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline V vload_i32(const int32_t* p) { return _mm512_cvtepi32_ps(_mm512_loadu_si512(p)); }
inline V vload_i32_part(const int32_t* p, int64_t n) {
  return _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(first(n), p));
}
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vround(V x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline V vfloor(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline V vtrunc(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); }
inline V vpow2i(V n) {
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
inline V vswap_pairs(V v) { return _mm512_permute_ps(v, 0xB1); }
using VD = __m512d;
inline VD vdzero() { return _mm512_setzero_pd(); }
inline VD vdset1(double a) { return _mm512_set1_pd(a); }
inline VD vd_lo(V v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
inline VD vd_hi(V v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
inline VD vdadd(VD a, VD b) { return _mm512_add_pd(a, b); }
inline VD vdsub(VD a, VD b) { return _mm512_sub_pd(a, b); }
inline VD vdfmadd(VD a, VD b, VD c) { return _mm512_fmadd_pd(a, b, c); }
inline double vdhsum(VD v) { return _mm512_reduce_add_pd(v); }
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

// Runs cols(x_g, rows, y_g, j0, j1) over [0, n) on the calling thread's team (over_columns): up
// to kMaxRows rows of x (m, k) as one group; more in groups of kRowGroup rows, each thread's
// columns a piece of about kRowPieceBytes of weights (weight_bytes_per_column each) at a time,
// every group over the piece in turn while it is in the core's cache. y (m, n).
template <typename Cols>
void over_row_groups(const float* x, int64_t m, int64_t k, float* y, int64_t n,
                     int64_t weight_bytes_per_column, Cols&& cols) {
  over_columns(n, 1, [&](int64_t j0, int64_t j1) {
    if (m <= kMaxRows) return cols(x, m, y, j0, j1);
    const int64_t piece = std::max<int64_t>(16, kRowPieceBytes / weight_bytes_per_column);
    for (int64_t c0 = j0; c0 < j1; c0 += piece)
      for (int64_t r0 = 0; r0 < m; r0 += kRowGroup)
        cols(x + r0 * k, std::min(kRowGroup, m - r0), y + r0 * n, c0, std::min(j1, c0 + piece));
  });
}

template <GemvCols kCols>
void gemv(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, const float* bias,
          float* y) {
  SEQPAR_CHECK(m >= 1, "gemv: ", m, " rows; at least 1");
  over_row_groups(x, m, k, y, n, 2 * k,
                  [&](const float* xg, int64_t rows, float* yg, int64_t j0, int64_t j1) {
                    kCols(xg, rows, k, w, n, bias, yg, j0, j1);
                  });
}

using GemvQ8Cols = void (*)(const float* x, int64_t m, int64_t k, const int8_t* q,
                            const uint16_t* d, int64_t n, const float* bias, float* y, int64_t j0,
                            int64_t j1);

template <GemvQ8Cols kCols>
void gemv_q8(const float* x, int64_t m, int64_t k, const int8_t* q, const uint16_t* d, int64_t n,
             const float* bias, float* y) {
  SEQPAR_CHECK(m >= 1, "gemv_q8: ", m, " rows; at least 1");
  SEQPAR_CHECK(k % kQ8Block == 0, "gemv_q8: k ", k, " is not a multiple of ", kQ8Block);
  over_row_groups(x, m, k, y, n, k + k / kQ8Block * 2,
                  [&](const float* xg, int64_t rows, float* yg, int64_t j0, int64_t j1) {
                    kCols(xg, rows, k, q, d, n, bias, yg, j0, j1);
                  });
}

using GemvI8ChannelCols = void (*)(const float* x, int64_t m, int64_t k, const int8_t* q,
                                   const float* s, int64_t n, const float* bias, float* y,
                                   int64_t j0, int64_t j1);

template <GemvI8ChannelCols kCols>
void gemv_i8_channel(const float* x, int64_t m, int64_t k, const int8_t* q, const float* s,
                     int64_t n, const float* bias, float* y) {
  SEQPAR_CHECK(m >= 1, "gemv_i8_channel: ", m, " rows; at least 1");
  over_row_groups(x, m, k, y, n, k,
                  [&](const float* xg, int64_t rows, float* yg, int64_t j0, int64_t j1) {
                    kCols(xg, rows, k, q, s, n, bias, yg, j0, j1);
                  });
}

// Runs fn(r0, r1) over [0, rows) on the calling thread's team, as over_columns, when the
// rows hold at least kParallelFloats floats in all (below that, waking the team costs more than
// it saves); else on the calling thread.
constexpr int64_t kParallelFloats = int64_t{1} << 15;
template <typename Rows>
void over_rows(int64_t rows, int64_t floats_per_row, Rows&& fn) {
  if (rows <= 0) return;
  const int team = loop_threads();
  if (team == 1 || rows == 1 || rows * floats_per_row < kParallelFloats) return fn(0, rows);
  const int64_t chunk = (rows + 4 * team - 1) / (4 * team);
  parallel_for((rows + chunk - 1) / chunk,
               [&](int64_t c) { fn(c * chunk, std::min(rows, (c + 1) * chunk)); });
}

// The flat elementwise ops: blocks of kFlatBlock floats as the rows of over_rows.
constexpr int64_t kFlatBlock = 4096;
template <typename Range>
void over_elements(int64_t n, Range&& fn) {
  over_rows((n + kFlatBlock - 1) / kFlatBlock, kFlatBlock,
            [&](int64_t b0, int64_t b1) { fn(b0 * kFlatBlock, std::min(n, b1 * kFlatBlock)); });
}

template <auto kRows>
void sum_squares(const float* x, int64_t rows, int64_t f, float* s) {
  over_rows(rows, f, [&](int64_t r0, int64_t r1) { kRows(x, f, s, r0, r1); });
}
template <auto kRows>
void rms_norm(const float* x, int64_t rows, int64_t f, const float* sum_sq, int64_t full_width,
              const float* weight, float eps, float* y) {
  over_rows(rows, f, [&](int64_t r0, int64_t r1) {
    kRows(x, f, sum_sq, full_width, weight, eps, y, r0, r1);
  });
}
template <auto kRows>
void layer_norm(const float* x, int64_t rows, int64_t f, const float* weight, const float* bias,
                float eps, float* y) {
  over_rows(rows, f, [&](int64_t r0, int64_t r1) { kRows(x, f, weight, bias, eps, y, r0, r1); });
}
// int8 activations' quantization (ops.cc linear()): the rows on the team.
template <auto kRows>
void row_abs_max(const float* x, int64_t rows, int64_t k, float* amax) {
  over_rows(rows, k, [&](int64_t r0, int64_t r1) { kRows(x + r0 * k, r1 - r0, k, amax + r0); });
}
template <auto kRows>
void quantize_rows_s8(const float* x, int64_t rows, int64_t k, const float* s, Ties ties,
                      int8_t* q) {
  over_rows(rows, k, [&](int64_t r0, int64_t r1) {
    kRows(x + r0 * k, r1 - r0, k, s + r0, ties, q + r0 * k);
  });
}
template <auto kRange>
void unary(float* x, int64_t n) {
  over_elements(n, [&](int64_t i0, int64_t i1) { kRange(x, i0, i1); });
}
template <auto kRange>
void swiglu(const float* a, const float* b, int64_t n, float* y) {
  over_elements(n, [&](int64_t i0, int64_t i1) { kRange(a, b, y, i0, i1); });
}
template <auto kRange>
void add(float* x, const float* y, int64_t n) {
  over_elements(n, [&](int64_t i0, int64_t i1) { kRange(x, y, i0, i1); });
}
template <auto kRows>
void modulate(float* x, int64_t rows, int64_t f, const float* shift, const float* scale) {
  over_rows(rows, f, [&](int64_t r0, int64_t r1) { kRows(x, f, shift, scale, r0, r1); });
}
template <auto kRows>
void gated_add(float* x, int64_t rows, int64_t f, const float* gate, const float* y) {
  over_rows(rows, f, [&](int64_t r0, int64_t r1) { kRows(x, f, gate, y, r0, r1); });
}
template <auto kTokens>
void rope(float* x, int64_t tokens, int64_t heads, int64_t d, const float* table, bool halves) {
  over_rows(tokens, heads * d,
            [&](int64_t t0, int64_t t1) { kTokens(x, heads, d, table, halves, t0, t1); });
}

// The elementwise and normalisation entries of a variant's table, from its namespace.
#define SEQPAR_ELEMENTWISE_OPS(ns)                                                              \
  &sum_squares<&ns::sum_squares_rows>, &rms_norm<&ns::rms_norm_rows>,                           \
      &layer_norm<&ns::layer_norm_rows>, &unary<&ns::silu_range>, &unary<&ns::gelu_tanh_range>, \
      &swiglu<&ns::swiglu_range>, &add<&ns::add_range>, &modulate<&ns::modulate_rows>,          \
      &gated_add<&ns::gated_add_rows>, &rope<&ns::rope_tokens>, &ns::exp_array

const Kernels kScalar{Isa::kScalar,
                      &gemv<&scalar::gemv_cols<false>>,
                      &gemv<&scalar::gemv_cols<true>>,
                      &gemv_q8<&scalar::gemv_q8_cols>,
                      &scalar::quantize_q8,
                      &scalar::dequant_q8,
                      &gemv_i8_channel<&scalar::gemv_i8_channel_cols>,
                      &scalar::dequant_i8_channel,
                      &scalar::widen_i8_bf16,
                      &row_abs_max<&scalar::row_abs_max>,
                      &quantize_rows_s8<&scalar::quantize_rows_s8>,
                      &scalar::scale_int32_rows,
                      scalar::kLanes,
                      SEQPAR_ELEMENTWISE_OPS(scalar)};
#if SEQPAR_X86_SIMD
const Kernels kAvx2{Isa::kAvx2,
                    &gemv<&avx2::gemv_cols<false>>,
                    &gemv<&avx2::gemv_cols<true>>,
                    &gemv_q8<&avx2::gemv_q8_cols>,
                    &avx2::quantize_q8,
                    &avx2::dequant_q8,
                    &gemv_i8_channel<&avx2::gemv_i8_channel_cols>,
                    &avx2::dequant_i8_channel,
                    &avx2::widen_i8_bf16,
                    &row_abs_max<&avx2::row_abs_max>,
                    &quantize_rows_s8<&avx2::quantize_rows_s8>,
                    &avx2::scale_int32_rows,
                    avx2::kW,
                    SEQPAR_ELEMENTWISE_OPS(avx2)};
const Kernels kAvx512{Isa::kAvx512,
                      &gemv<&avx512::gemv_cols<false>>,
                      &gemv<&avx512::gemv_cols<true>>,
                      &gemv_q8<&avx512::gemv_q8_cols>,
                      &avx512::quantize_q8,
                      &avx512::dequant_q8,
                      &gemv_i8_channel<&avx512::gemv_i8_channel_cols>,
                      &avx512::dequant_i8_channel,
                      &avx512::widen_i8_bf16,
                      &row_abs_max<&avx512::row_abs_max>,
                      &quantize_rows_s8<&avx512::quantize_rows_s8>,
                      &avx512::scale_int32_rows,
                      avx512::kW,
                      SEQPAR_ELEMENTWISE_OPS(avx512)};
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
  return detail::concat(
      "gemv_bf16 ", gemv, ", gemv_f16 ", gemv, ", gemv_q8 ", gemv, ", gemv_i8_channel ", gemv,
      ", many-row products ", model_simd::gemm_packed_path(), ", convert ", convert_isa(),
      ", bf16 activations ", bf16_activations_path(), ", int8 activations ",
      int8_activations_path(), ", int8 activations x Q8_0 ", model_simd::gemm_q8_path());
}

std::vector<std::pair<std::string, std::string>> model_op_paths() {
  const std::string isa(model_simd::isa_name(model_simd::kernels().isa));
  std::vector<std::pair<std::string, std::string>> paths;
  for (const char* op : {"sum_squares", "rms_norm", "layer_norm", "silu", "gelu_tanh", "swiglu",
                         "add", "modulate", "gated_add", "rope"})
    paths.emplace_back(op, isa);
  return paths;
}

std::string model_op_info() {
  std::string line;
  for (const auto& [op, isa] : model_op_paths()) line += (line.empty() ? "" : ", ") + op + " " + isa;
  return line;
}

}  // namespace seqpar
