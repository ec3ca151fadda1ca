#include "cli/synthetic.h"

namespace seqpar::cli {

namespace {
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

Tensor synthetic_rows(uint64_t seed, Which which, int64_t batch, std::span<const int64_t> positions,
                      int64_t heads, int64_t head_dim, DType dtype) {
  const int64_t n = static_cast<int64_t>(positions.size());
  const int64_t row = heads * head_dim;
  Tensor t({batch, n, heads, head_dim}, DType::kF32);
  float* out = t.data<float>();
  constexpr float kScale = 1.7320508f / 8388608.f;  // sqrt(3) / 2^23
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      uint64_t state = seed * 0x2545f4914f6cdd1dull ^ (static_cast<uint64_t>(which) << 56) ^
                       (static_cast<uint64_t>(b) << 40) ^ static_cast<uint64_t>(positions[i]);
      splitmix64(state);
      float* dst = out + (b * n + i) * row;
      for (int64_t j = 0; j < row; j += 2) {
        uint64_t x = splitmix64(state);
        dst[j] = static_cast<float>(static_cast<int32_t>(x >> 40) - (1 << 23)) * kScale;
        if (j + 1 < row)
          dst[j + 1] =
              static_cast<float>(static_cast<int32_t>((x >> 16) & 0xffffff) - (1 << 23)) * kScale;
      }
    }
  }
  return dtype == DType::kF32 ? t : t.to(dtype);
}

}  // namespace seqpar::cli
