// Per-ISA instantiations of the kernel's vector routines (simd_body.inc) and run-time dispatch.
// Each variant lives in its own namespace; the AVX ones are compiled under `#pragma GCC target`
// so the library itself needs no -m flags and runs on any x86-64 (or other) CPU.
#include "simd.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "../core/x86_simd.inc"
#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"

namespace seqpar::attn_simd {

// ---- portable scalar variant: vectors of one float ---------------------------------------------
namespace scalar {
using V = float;
constexpr int kW = 1;
inline V vload(const float* p) { return *p; }
inline void vstore(float* p, V v) { *p = v; }
inline V vzero() { return 0.f; }
inline V vset1(float x) { return x; }
inline V vadd(V a, V b) { return a + b; }
inline V vsub(V a, V b) { return a - b; }
inline V vmul(V a, V b) { return a * b; }
inline V vmax(V a, V b) { return a > b ? a : b; }
inline V vmin(V a, V b) { return a < b ? a : b; }
// Fused in double: exact product, one rounding (matches the FMA of the vector variants closely).
inline V vfmadd(V a, V b, V c) {
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + c);
}
inline float hmax(V v) { return v; }
inline float hsum(V v) { return v; }
inline V vsum_lanes(const V* v) { return v[0]; }
inline V vpow2_shifted(V r) {
  uint32_t bits;
  std::memcpy(&bits, &r, 4);
  bits <<= 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline V vload_bf16(const uint16_t* p) { return ::seqpar::bf16_to_f32(*p); }
inline V vload_f16(const uint16_t* p) { return ::seqpar::f16_to_f32(*p); }
inline void vstore_bf16(uint16_t* p, V v) { *p = ::seqpar::f32_to_bf16(v); }
#include "simd_body.inc"
}  // namespace scalar

#if SEQPAR_X86_SIMD
// ---- AVX2 + FMA + F16C: 8 floats --------------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#if defined(__clang__)  // clang ignores the GCC pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#endif
namespace avx2 {
#include "../core/simd_vec_avx2.inc"
// Lane i: the sum of v[i]'s lanes, for the 8 vectors v[0, 8).
inline V vsum_lanes(const V* v) {
  const __m256 ab = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 cd = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // ab's low half: v[0..3] over lanes 0-3, its high half over lanes 4-7; cd the same for v[4..7].
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}
inline V vpow2_shifted(V r) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(r), 23));
}
inline void vstore_bf16(uint16_t* p, V v) {
  // Round to nearest even: u + 0x7fff + ((u >> 16) & 1), keep the upper half.
  __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  u = _mm256_srli_epi32(u, 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
#include "simd_body.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options

// ---- AVX-512 (F, BW, DQ, VL): 16 floats ---------------------------------------------------------
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")
#if defined(__clang__)  // clang ignores the GCC pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl"))), apply_to = function)
#endif
namespace avx512 {
#include "../core/simd_vec_avx512.inc"
// Lane i: the sum of v[i]'s lanes, for the 16 vectors v[0, 16): each folded to 8 lanes, then as
// AVX2's vsum_lanes on each half.
inline V vsum_lanes(const V* v) {
  __m256 h[16];
  for (int i = 0; i < 16; ++i)
    h[i] = _mm256_add_ps(_mm512_castps512_ps256(v[i]), _mm512_extractf32x8_ps(v[i], 1));
  return _mm512_insertf32x8(_mm512_castps256_ps512(avx2::vsum_lanes(h)), avx2::vsum_lanes(h + 8),
                            1);
}
inline V vpow2_shifted(V r) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(r), 23));
}
inline void vstore_bf16(uint16_t* p, V v) {
  __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}
#define SEQPAR_EXP2V_SCALEF 1  // exp2v by vrndscaleps and vscalefps (simd_body.inc)
#include "simd_body.inc"
#undef SEQPAR_EXP2V_SCALEF
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options

// ---- AVX-512 with AVX512_BF16: the avx512 variant, P rounded to bf16 in one instruction ---------
// vcvtneps2bf16 rounds to nearest even as vstore_bf16 above does, in one instruction for its five,
// but treats denormal inputs as zero: probabilities below 2^-126 of the row's running max become
// 0 instead of bf16 denormals (docs/kernel.md "Error bounds"). Only row_update_bf16 is taken from
// here (the table below); f32_to_bf16, whose outputs users see, keeps the denormals.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")
#if defined(__clang__)
#pragma clang attribute push(                                                               \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))), \
    apply_to = function)
#endif
namespace avx512_bf16 {
using namespace avx512;  // every primitive but the one below
inline void vstore_bf16(uint16_t* p, V v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}
#define SEQPAR_EXP2V_SCALEF 1
#include "simd_body.inc"
#undef SEQPAR_EXP2V_SCALEF
}  // namespace avx512_bf16
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#endif  // SEQPAR_X86_SIMD

namespace {

#define SEQPAR_KERNEL_TABLE(ns, isa)                                                         \
  Kernels {                                                                                  \
    isa, &ns::row_update_f32<5>, &ns::row_update_f32<3>, &ns::row_update_bf16<3>,            \
        &ns::exp2_array<5>, &ns::exp2_array<3>, &ns::scale_copy, &ns::bf16_to_f32,           \
        &ns::f16_to_f32, &ns::f32_to_bf16, &ns::any_nonfinite_f32, &ns::any_nonfinite_bf16,  \
        &ns::any_nonfinite_f16, &ns::small_qk, &ns::small_pv, ns::kPanelW, &ns::pack_panels, \
        &ns::pack_panels_t, &ns::panel_product, false                                        \
  }

const Kernels kScalar = SEQPAR_KERNEL_TABLE(scalar, Isa::kScalar);
#if SEQPAR_X86_SIMD
const Kernels kAvx2 = SEQPAR_KERNEL_TABLE(avx2, Isa::kAvx2);

// The avx512 table; where the CPU has AVX512_BF16, P rounded to bf16 by it. row_update_bf16 runs
// only beside the bf16 matmul, which needs AVX512_BF16 or AMX (flash.cc use_bf16_matmul), so the
// software rounding is what a CPU without them would take, were it ever called there.
const Kernels& avx512_kernels() {
  static const Kernels table = [] {
    Kernels k = SEQPAR_KERNEL_TABLE(avx512, Isa::kAvx512);
    if (__builtin_cpu_supports("avx512bf16")) {
      k.row_update_bf16_deg3 = &avx512_bf16::row_update_bf16<3>;
      k.p_rounded_by_avx512_bf16 = true;
    }
    return k;
  }();
  return table;
}
#endif

// -1: no override; otherwise an Isa value.
std::atomic<int> g_forced_isa{-1};

}  // namespace

const Kernels& kernels(Isa isa) {
  check_cpu_has(isa);
#if SEQPAR_X86_SIMD
  if (isa == Isa::kAvx512) return avx512_kernels();
  if (isa == Isa::kAvx2) return kAvx2;
#endif
  return kScalar;
}

const Kernels& kernels() {
  const int forced = g_forced_isa.load(std::memory_order_relaxed);
  if (forced >= 0) return kernels(static_cast<Isa>(forced));
  static const Isa from_env = kernel_isa();
  return kernels(from_env);
}

void force_softmax_isa(std::optional<Isa> isa) {
  if (isa) check_cpu_has(*isa);
  g_forced_isa.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
}

}  // namespace seqpar::attn_simd
