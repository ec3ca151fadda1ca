#include "seqpar/model/blocks/rope.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "seqpar/core/error.h"
#include "simd_ops.h"

namespace seqpar {

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s) {
  // transformers' steps, each rounded to fp32 as PyTorch rounds them: the exponent 2j/D, theta^e
  // (rounded once from double here; PyTorch's vectorized pow is within one fp32 step of it), 1/x.
  const int64_t pairs = head_dim / 2;
  const float base = static_cast<float>(theta), dim = static_cast<float>(head_dim);
  std::vector<float> f(pairs);
  for (int64_t j = 0; j < pairs; ++j) {
    const float e = static_cast<float>(2 * j) / dim;
    f[j] = 1.0f / static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
  }
  return rope_llama3_scaled(std::move(f), s);
}

std::vector<float> rope_llama3_scaled(std::vector<float> f, const RopeScaling& s) {
  if (s.factor <= 0) return f;
  // _compute_llama3_parameters, elementwise in fp32. A Python scalar divided by a tensor is
  // PyTorch's reciprocal(x) * c, not c / x: both are kept as written there.
  const double old_len = static_cast<double>(s.original_max_positions);
  const float factor = static_cast<float>(s.factor), low = static_cast<float>(s.low_freq_factor),
              old = static_cast<float>(old_len), two_pi = static_cast<float>(2 * M_PI),
              low_wavelen = static_cast<float>(old_len / s.low_freq_factor),
              high_wavelen = static_cast<float>(old_len / s.high_freq_factor),
              span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  for (float& x : f) {
    const float wavelen = (1.0f / x) * two_pi;
    float scaled = wavelen > low_wavelen ? x / factor : x;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      const float smooth = ((1.0f / wavelen) * old - low) / span;
      const float kept = (1.0f - smooth) * scaled / factor, moved = smooth * scaled;
      scaled = kept + moved;
    }
    x = scaled;
  }
  return f;
}

Tensor rope_1d(std::span<const int64_t> positions, std::span<const float> inv_freq) {
  const int64_t n = static_cast<int64_t>(positions.size()),
                pairs = static_cast<int64_t>(inv_freq.size());
  Tensor t({n, pairs, 2});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < pairs; ++j) {
      const float angle = static_cast<float>(positions[i]) * inv_freq[j];
      t.data<float>()[(i * pairs + j) * 2] = std::cos(angle);
      t.data<float>()[(i * pairs + j) * 2 + 1] = std::sin(angle);
    }
  return t;
}

Tensor rope_3d(std::span<const int64_t> positions, std::array<int64_t, 3> grid, int64_t head_dim,
               double theta) {
  const int64_t n = static_cast<int64_t>(positions.size()), pairs = head_dim / 2;
  const int64_t ph = pairs / 3, pw = pairs / 3, pf = pairs - ph - pw;
  const int64_t width[3] = {pf, ph, pw};
  const auto coord_of = [&](int64_t p, int axis) {
    return axis == 0 ? p / (grid[1] * grid[2]) : axis == 1 ? p / grid[2] % grid[1] : p % grid[2];
  };
  Tensor t({n, pairs, 2});
  float* out = t.data<float>();
  // An entry depends only on its axis' coordinate and its pair: cos and sin are computed once for
  // each coordinate in the positions' range (a 720p video's 75600 tokens use 21 + 45 + 80) and
  // copied to every token that has it. A range wider than the token count is computed per token.
  int64_t j0 = 0;
  for (int axis = 0; axis < 3; ++axis) {
    const int64_t w = width[axis];
    std::vector<double> freq(w);
    for (int64_t k = 0; k < w; ++k) freq[k] = std::pow(theta, -2.0 * k / (2 * w));
    const auto entry = [&](int64_t c, int64_t k, float* cs) {
      const double angle = c * freq[k];
      cs[0] = static_cast<float>(std::cos(angle));
      cs[1] = static_cast<float>(std::sin(angle));
    };
    int64_t lo = 0, hi = -1;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = coord_of(positions[i], axis);
      lo = i == 0 ? c : std::min(lo, c);
      hi = i == 0 ? c : std::max(hi, c);
    }
    const bool once = hi - lo < n;
    std::vector<float> table(once ? (hi - lo + 1) * w * 2 : 0);
    if (once)
      for (int64_t c = lo; c <= hi; ++c)
        for (int64_t k = 0; k < w; ++k) entry(c, k, &table[((c - lo) * w + k) * 2]);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = coord_of(positions[i], axis);
      float* row = out + (i * pairs + j0) * 2;
      if (once) {
        std::copy_n(&table[(c - lo) * w * 2], w * 2, row);
      } else {
        for (int64_t k = 0; k < w; ++k) entry(c, k, row + k * 2);
      }
    }
    j0 += w;
  }
  return t;
}

void apply_rope_(Tensor& x, const Tensor& table, RopePairs pairs_of) {
  const int64_t B = x.dim(0), n = x.dim(1), H = x.dim(2), D = x.dim(3), pairs = D / 2;
  SEQPAR_CHECK(table.dim(0) == n && table.dim(1) == pairs, "rope table ", table.shape_str(),
               " for x ", x.shape_str());
  // The vector kernel of simd_ops.h, on the calling thread's team (tokens split over it).
  const model_simd::Kernels& kern = model_simd::kernels();
  for (int64_t b = 0; b < B; ++b)
    kern.rope(x.data<float>() + b * n * H * D, n, H, D, table.data<float>(),
              pairs_of == RopePairs::kHalves);
}

}  // namespace seqpar
