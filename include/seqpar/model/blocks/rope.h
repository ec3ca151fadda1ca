// Rotary position embeddings: tables of (cos, sin) per token and pair of features, built from
// each token's global position so that every layout and shard rotates its own tokens, and their
// application to q and k.
//   1-D (language models): pair j rotates by pos·inv_freq[j], inv_freq from theta and an optional
//       llama3 frequency scaling, computed in fp32 as transformers does;
//   3-D (Wan's video patches): frames, rows and columns each rotate their own part of the pairs.
// Which features form pair j is a mode: interleaved (2j, 2j+1), as Meta's original layout and
// Wan, or halves (j, j + D/2), as Hugging Face's layout ("rotate_half").
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "seqpar/core/tensor.h"

namespace seqpar {

// Llama 3.1's frequency scaling (rope_scaling {"rope_type": "llama3", ...} in config.json):
// wavelengths longer than original_max_positions / low_freq_factor are divided by factor,
// shorter than original_max_positions / high_freq_factor kept, and those between interpolated.
// factor == 0: no scaling.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_positions = 8192;
};

// The head_dim / 2 inverse frequencies theta^(-2j/D), then `scaling` applied, in fp32 as
// transformers computes them (_compute_default_rope_parameters, _compute_llama3_parameters): every
// step rounded to fp32; theta^e correctly rounded, where PyTorch's vectorized pow may be one fp32
// step away (measured: 1.2% of frequencies over head dims 16-256 and thetas 1e4-5e6).
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling = {});

// `inv_freq` with llama3's scaling applied (unchanged when scaling.factor == 0), in fp32 step by
// step as transformers' _compute_llama3_parameters rounds.
std::vector<float> rope_llama3_scaled(std::vector<float> inv_freq, const RopeScaling& scaling);

// 1-D: (n, D/2, 2), pair j of token i rotating by positions[i]·inv_freq[j] (angle, cos and sin in
// fp32).
Tensor rope_1d(std::span<const int64_t> positions, std::span<const float> inv_freq);

// 3-D (video frames x height x width): position p is (f, y, x) on grid (F, Hp, Wp) in row-major
// order; the D/2 pairs split into frames: D/2 - 2·(D/2/3), height: D/2/3, width: D/2/3, each part
// rotating by its axis coordinate with frequencies theta^(-2k/width) of its own width.
Tensor rope_3d(std::span<const int64_t> positions, std::array<int64_t, 3> grid, int64_t head_dim,
               double theta);

// x (B, n, H, D) rotated in place by table (n, D/2, 2) (the same for every batch row and head).
enum class RopePairs { kInterleaved, kHalves };
void apply_rope_(Tensor& x, const Tensor& table, RopePairs pairs = RopePairs::kInterleaved);

}  // namespace seqpar
