// Element types and conversions. Storage may be fp32, bf16 or fp16; all arithmetic is fp32. int8
// holds quantized weights (ops.h's Q8_0), meaningful only with their scales: convert() refuses it.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace seqpar {

enum class DType { kF32, kBF16, kF16, kI8 };

inline size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : t == DType::kI8 ? 1 : 2; }
std::string_view dtype_name(DType t);  // "fp32", "bf16", "fp16", "int8"
// Parses "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16"; throws InvalidArgument.
DType parse_dtype(std::string_view name);

// bf16: the upper 16 bits of an fp32, rounded to nearest even (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE half precision, round to nearest even.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// Converts n elements between storage types (src and dst must not overlap; int8 only to itself).
// bf16/fp16 -> fp32 is exact and runs vectorized (AVX-512, or AVX2 with F16C), bit-identical to the
// scalar functions above; so does fp32 -> bf16 (f32_to_bf16's rounding and NaNs, bit for bit).
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);
// The instruction set convert() widens bf16/fp16 to fp32 and narrows fp32 to bf16 with: "avx512",
// "avx2" or "scalar", the widest this CPU runs, capped by the environment variable
// SEQPAR_KERNEL_ISA (read once).
std::string_view convert_isa();

namespace detail {
// convert()'s bf16/fp16 -> fp32 widening (src_type kBF16 or kF16) by the named variant, for tests
// and benchmarks; returns false, writing nothing, where this CPU cannot run it.
bool widen_to_f32_with(std::string_view isa, DType src_type, const uint16_t* src, float* dst,
                       size_t n);
// convert()'s fp32 -> bf16 narrowing by the named variant, the same way.
bool narrow_to_bf16_with(std::string_view isa, const float* src, uint16_t* dst, size_t n);
}  // namespace detail

}  // namespace seqpar
