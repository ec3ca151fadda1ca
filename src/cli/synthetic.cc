#include "synthetic.h"

#include <vector>

#include "seqpar/core/dtype.h"

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
  // Generated row by row in fp32 and stored in dtype directly (no full-size fp32 copy: a long
  // bf16 cache would otherwise peak at three times its size).
  Tensor t({batch, n, heads, head_dim}, dtype);
  std::vector<float> vals(static_cast<size_t>(row));
  const size_t esz = dtype_size(dtype);
  char* out = static_cast<char*>(t.raw());
  constexpr float kScale = 1.7320508f / 8388608.f;  // sqrt(3) / 2^23
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      uint64_t state = seed * 0x2545f4914f6cdd1dull ^ (static_cast<uint64_t>(which) << 56) ^
                       (static_cast<uint64_t>(b) << 40) ^ static_cast<uint64_t>(positions[i]);
      splitmix64(state);
      float* dst = vals.data();
      for (int64_t j = 0; j < row; j += 2) {
        uint64_t x = splitmix64(state);
        dst[j] = static_cast<float>(static_cast<int32_t>(x >> 40) - (1 << 23)) * kScale;
        if (j + 1 < row)
          dst[j + 1] =
              static_cast<float>(static_cast<int32_t>((x >> 16) & 0xffffff) - (1 << 23)) * kScale;
      }
      convert(dst, DType::kF32, out + (b * n + i) * row * esz, dtype, static_cast<size_t>(row));
    }
  }
  return t;
}

}  // namespace seqpar::cli
