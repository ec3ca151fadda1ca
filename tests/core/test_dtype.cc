#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"

namespace seqpar {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): ties to even -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even -> 1 + 2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, Bf16RelativeErrorBound) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 100.f);
  for (int i = 0; i < 10000; ++i) {
    float x = dist(rng);
    float y = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * std::ldexp(1.0f, -8) * 1.0001f);
  }
}

TEST(DType, F16MatchesReferenceRounding) {
  // Every finite half value round-trips exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // inf / nan
    float f = f16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(70000.f), 0x7c00);                  // overflow to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);    // underflow to zero
  // Halfway between 1 and the next half (1 + 2^-10): ties to even -> 1.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
}

TEST(DType, ConvertRoundTrips) {
  float src[4] = {1.5f, -2.25f, 0.f, 1024.f};
  uint16_t mid[4];
  float back[4];
  for (DType t : {DType::kBF16, DType::kF16}) {
    convert(src, DType::kF32, mid, t, 4);
    convert(mid, t, back, DType::kF32, 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], src[i]);
  }
}

TEST(DType, ParseNamesAndRejectUnknown) {
  EXPECT_EQ(parse_dtype("fp32"), DType::kF32);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("fp16"), DType::kF16);
  EXPECT_THROW(parse_dtype("int8"), InvalidArgument);
}

}  // namespace seqpar
