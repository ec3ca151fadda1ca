// convert()'s bf16/fp16 -> fp32 widening, every variant this CPU runs, against the scalar
// functions: widening is exact, so the bits must be identical for all 65536 patterns (NaN
// payloads, signalling NaNs, infinities, subnormals, -0 included) and at every tail length.
// Its fp32 -> bf16 narrowing the same way against f32_to_bf16: every high half with the low
// halves where rounding turns (ties to even and odd, just below and above them), and random bits.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "seqpar/core/dtype.h"

namespace seqpar {
namespace {

class ConvertIsa : public ::testing::TestWithParam<const char*> {};

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

TEST_P(ConvertIsa, WideningIsBitIdenticalToScalar) {
  const std::string isa = GetParam();
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<float> want(all.size()), got(all.size(), -1.f);
    for (size_t i = 0; i < all.size(); ++i)
      want[i] = t == DType::kBF16 ? bf16_to_f32(all[i]) : f16_to_f32(all[i]);
    if (!detail::widen_to_f32_with(isa, t, all.data(), got.data(), all.size()))
      GTEST_SKIP() << "this CPU cannot run the " << isa << " variant";
    const auto wb = bits_of(want), gb = bits_of(got);
    for (size_t i = 0; i < all.size(); ++i)
      ASSERT_EQ(gb[i], wb[i]) << isa << " " << dtype_name(t) << " pattern 0x" << std::hex << i;
    // Every tail length and an unaligned start; the element past the end stays untouched.
    for (size_t n = 0; n <= 40; ++n) {
      std::vector<float> out(n + 1, 7.f);
      detail::widen_to_f32_with(isa, t, all.data() + 0x7bf1, out.data(), n);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(bits_of({out[i]})[0], wb[0x7bf1 + i]) << isa << " n " << n << " i " << i;
      ASSERT_EQ(out[n], 7.f) << isa << " wrote past n = " << n;
    }
  }
}

TEST_P(ConvertIsa, NarrowingToBf16IsBitIdenticalToScalar) {
  const std::string isa = GetParam();
  std::vector<uint32_t> bits;
  for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu})
    for (uint32_t hi = 0; hi < 0x10000; ++hi) bits.push_back(hi << 16 | lo);
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 20); ++i) bits.push_back(rng());
  std::vector<float> in(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * sizeof(float));
  std::vector<uint16_t> got(in.size(), 0x1234);
  if (!detail::narrow_to_bf16_with(isa, in.data(), got.data(), in.size()))
    GTEST_SKIP() << "this CPU cannot run the " << isa << " variant";
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(got[i], f32_to_bf16(in[i])) << isa << " fp32 bits 0x" << std::hex << bits[i];
  for (size_t n = 0; n <= 40; ++n) {
    std::vector<uint16_t> out(n + 1, 0x7777);
    detail::narrow_to_bf16_with(isa, in.data() + 3 * 0x10000 + 5, out.data(), n);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(out[i], f32_to_bf16(in[3 * 0x10000 + 5 + i])) << isa << " n " << n << " i " << i;
    ASSERT_EQ(out[n], 0x7777) << isa << " wrote past n = " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, ConvertIsa, ::testing::Values("scalar", "avx2", "avx512"),
                         [](const auto& info) { return std::string(info.param); });

TEST(ConvertIsa, ConvertUsesAVariantAndMatchesScalar) {
  const std::string isa(convert_isa());
  EXPECT_TRUE(isa == "scalar" || isa == "avx2" || isa == "avx512") << isa;
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> got(all.size());
  convert(all.data(), DType::kF16, got.data(), DType::kF32, all.size());
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = f16_to_f32(all[h]);
    ASSERT_EQ(std::memcmp(&got[h], &want, 4), 0) << std::hex << h;
  }
}

}  // namespace
}  // namespace seqpar
