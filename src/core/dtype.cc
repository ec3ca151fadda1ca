#include "seqpar/core/dtype.h"

#include "seqpar/core/error.h"

namespace seqpar {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "f16" || s == "float16") return DType::kF16;
  throw InvalidArgument(detail::concat("dtype '", s, "' is unknown; valid: fp32, bf16, fp16"));
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

void convert(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (st) {
      case DType::kF32: return static_cast<const float*>(src)[i];
      case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    }
    return 0.f;
  };
  for (size_t i = 0; i < n; ++i) {
    float v = load(i);
    switch (dt) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); break;
      case DType::kF16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(v); break;
    }
  }
}

}  // namespace seqpar
