#include "seqpar/core/dtype.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "seqpar/core/cpu_isa.h"
#include "seqpar/core/error.h"
#include "seqpar/core/param_error.h"
#include "x86_simd.inc"

namespace seqpar {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kI8:
      return "int8";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "f16" || s == "float16") return DType::kF16;
  throw ParamError(
      "dtype", "fp32, bf16, fp16",
      detail::concat(param("dtype"), " '", s, "' is unknown; valid: fp32, bf16, fp16"));
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (mag < 0x38800000u) {  // subnormal or zero in half
    if (mag < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t m = (mag & 0x007fffffu) | 0x00800000u;
    int shift = 113 - static_cast<int>(mag >> 23) + 13;  // 126 - e + 1 ... to half subnormal
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t h = ((mag - 0x38000000u) >> 13);
  uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    if (m == 0) {
      x = sign;
    } else {  // subnormal: normalize
      int shift = 0;
      while (!(m & 0x400u)) {
        m <<= 1;
        ++shift;
      }
      m &= 0x3ffu;
      x = sign | (static_cast<uint32_t>(113 - shift) << 23) | (m << 13);
    }
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {

// ---- bf16/fp16 -> fp32 widening, one variant per instruction set --------------------------------
// Widening is exact, so every variant writes the same bits as bf16_to_f32 / f16_to_f32.
using Widen = void (*)(const uint16_t* src, float* dst, size_t n);

void widen_bf16_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void widen_f16_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// ---- fp32 -> bf16 narrowing: f32_to_bf16 (round to nearest even; a NaN keeps its sign and top
// payload bits and is made quiet), bit for bit in every variant ----------------------------------
using Narrow = void (*)(const float* src, uint16_t* dst, size_t n);

void narrow_bf16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

#if SEQPAR_X86_SIMD
// vcvtph2ps quiets a signalling NaN (sets mantissa bit 22); f16_to_f32 keeps the payload as it is,
// so lanes that were a signalling NaN get that bit cleared again.
__attribute__((target("avx2,fma,f16c"))) inline __m256 f16_exact8(__m128i h) {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m256i x = _mm256_cvtepu16_epi32(h);
  const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff));
  const __m256i snan = _mm256_and_si256(_mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7c00)),
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7e00), mag));
  return _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_and_si256(snan, _mm256_set1_epi32(1 << 22))),
                          f);
}
__attribute__((target("avx2,fma,f16c"))) void widen_bf16_avx2(const uint16_t* src, float* dst,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
__attribute__((target("avx2,fma,f16c"))) void widen_f16_avx2(const uint16_t* src, float* dst,
                                                             size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     f16_exact8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// Eight fp32 lanes narrowed as f32_to_bf16, in the low 16 bits of each 32-bit lane.
__attribute__((target("avx2,fma,f16c"))) inline __m256i bf16_bits8(__m256i u) {
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}
__attribute__((target("avx2,fma,f16c"))) void narrow_bf16_avx2(const float* src, uint16_t* dst,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = bf16_bits8(_mm256_castps_si256(_mm256_loadu_ps(src + i)));
    // Lanes hold 0..0xffff: the unsigned-saturating pack keeps them; the permute puts the two
    // 128-bit halves' four words each side by side.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

#define SEQPAR_AVX512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
__attribute__((target(SEQPAR_AVX512))) inline __m512 f16_exact16(__m256i h) {
  const __m512 f = _mm512_cvtph_ps(h);
  const __m512i mag = _mm512_and_si512(_mm512_cvtepu16_epi32(h), _mm512_set1_epi32(0x7fff));
  const __mmask16 snan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7c00)) &
                         _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(0x7e00));
  return _mm512_castsi512_ps(_mm512_mask_andnot_epi32(
      _mm512_castps_si512(f), snan, _mm512_set1_epi32(1 << 22), _mm512_castps_si512(f)));
}
__attribute__((target(SEQPAR_AVX512))) void widen_bf16_avx512(const uint16_t* src, float* dst,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
    _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
  }
}
__attribute__((target(SEQPAR_AVX512))) void widen_f16_avx512(const uint16_t* src, float* dst,
                                                             size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i,
                     f16_exact16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(dst + i, m, f16_exact16(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}
__attribute__((target(SEQPAR_AVX512))) inline __m256i bf16_bits16(__m512i u) {
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}
__attribute__((target(SEQPAR_AVX512))) void narrow_bf16_avx512(const float* src, uint16_t* dst,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        bf16_bits16(_mm512_castps_si512(_mm512_loadu_ps(src + i))));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(dst + i, m,
                             bf16_bits16(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i))));
  }
}
#undef SEQPAR_AVX512

#endif

struct WidenIsa {
  std::string_view name;
  Widen bf16, f16;
  Narrow to_bf16;
};

// The variants by Isa (core/cpu_isa.h), the same choice as the attention kernel's and the model's.
const WidenIsa kWiden[] = {
    {"scalar", &widen_bf16_scalar, &widen_f16_scalar, &narrow_bf16_scalar},
#if SEQPAR_X86_SIMD
    {"avx2", &widen_bf16_avx2, &widen_f16_avx2, &narrow_bf16_avx2},
    {"avx512", &widen_bf16_avx512, &widen_f16_avx512, &narrow_bf16_avx512},
#endif
};

const WidenIsa& widen() {
  static const WidenIsa& chosen = kWiden[static_cast<int>(kernel_isa())];
  return chosen;
}

}  // namespace

std::string_view convert_isa() { return widen().name; }

bool detail::widen_to_f32_with(std::string_view isa, DType st, const uint16_t* src, float* dst,
                               size_t n) {
  SEQPAR_CHECK(st == DType::kBF16 || st == DType::kF16, "widen_to_f32_with: ", dtype_name(st));
  const Isa want = parse_isa(isa);
  if (!cpu_has(want)) return false;
  const WidenIsa& w = kWiden[static_cast<int>(want)];
  (st == DType::kBF16 ? w.bf16 : w.f16)(src, dst, n);
  return true;
}

bool detail::narrow_to_bf16_with(std::string_view isa, const float* src, uint16_t* dst, size_t n) {
  const Isa want = parse_isa(isa);
  if (!cpu_has(want)) return false;
  kWiden[static_cast<int>(want)].to_bf16(src, dst, n);
  return true;
}

void convert(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  SEQPAR_CHECK(st != DType::kI8 && dt != DType::kI8, "convert: int8 holds quantized values, which ",
               "only their scales turn into numbers (", dtype_name(st), " to ", dtype_name(dt),
               ")");
  if (dt == DType::kF32) {  // widening: exact, vectorized
    const WidenIsa& w = widen();
    (st == DType::kBF16 ? w.bf16 : w.f16)(static_cast<const uint16_t*>(src),
                                          static_cast<float*>(dst), n);
    return;
  }
  if (st == DType::kF32 && dt == DType::kBF16) {  // narrowing to bf16: vectorized, as f32_to_bf16
    widen().to_bf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (st) {
      case DType::kF32: return static_cast<const float*>(src)[i];
      case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::kI8:
        break;
    }
    return 0.f;
  };
  for (size_t i = 0; i < n; ++i) {
    float v = load(i);
    switch (dt) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); break;
      case DType::kF16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(v); break;
      case DType::kI8:
        break;
    }
  }
}

}  // namespace seqpar
