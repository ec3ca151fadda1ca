// Normalization blocks: RMSNorm over a whole feature vector, over a feature vector split over the
// tensor-parallel group (statistics all-reduced), or over each attention head's features; and
// LayerNorm with or without its affine parameters. Activations are (.., F), fp32; the scales are
// read as fp32.
// Thread-safety: a block is used by one rank thread; load() reads the store only.
#pragma once

#include <cstdint>
#include <string>

#include "seqpar/model/context.h"

namespace seqpar {

// y = x / sqrt(mean(x²) + eps) · weight over the last dimension, the whole vector on every rank
// (a decoder's input_layernorm, post_attention_layernorm, norm). Weights: <name>.weight (F).
struct RmsNorm {
  Tensor weight;
  float eps = 1e-6f;
  static RmsNorm load(const WeightStore& ws, const std::string& name, float eps);
  Tensor forward(const Tensor& x) const;  // (.., F) -> (.., F)
};

// RMSNorm over a feature dimension of width full_width that is split over the tp group: the
// sums of squares are all-reduced over tp only (Wan's QK-norm over all heads, sharded by head).
// weight: this rank's slice [begin, end) of <name>.weight (full_width).
struct DistRmsNorm {
  Tensor weight;
  int64_t full_width = 0;
  float eps = 1e-6f;
  static DistRmsNorm load(const WeightStore& ws, const std::string& name, int64_t begin,
                          int64_t end, int64_t full_width, float eps);
  Tensor forward(const Tensor& x, Communicator& tp) const;  // (.., end-begin) -> same
};

// RMSNorm over each head's D features with one weight of D shared by every head (Qwen3's q_norm
// and k_norm). A tp rank holds whole heads, so nothing is communicated. Weights: <name>.weight (D).
struct HeadRmsNorm {
  Tensor weight;
  float eps = 1e-6f;
  static HeadRmsNorm load(const WeightStore& ws, const std::string& name, float eps);
  Tensor forward(const Tensor& x) const;  // (.., H, D) -> (.., H, D)
};

// LayerNorm over the last dimension; affine (<name>.weight, <name>.bias) or not.
struct LayerNorm {
  Tensor weight, bias;  // empty: not affine
  float eps = 1e-6f;
  static LayerNorm load(const WeightStore& ws, const std::string& name, float eps);
  static LayerNorm plain(float eps);
  Tensor forward(const Tensor& x) const;  // (.., F) -> (.., F)
};

}  // namespace seqpar
