// Adaptive modulation of a diffusion transformer (adaLN): the timestep's embedding, and per block
// a learned table added to its projection, giving shift, scale and gate vectors.
//   TimestepEmbedding: t -> sinusoid of t·scale (freq_dim: cos then sin halves, fp32 as
//                      diffusers) -> Linear -> SiLU -> Linear -> e (d)
//   Modulation:        table (n, d) + e_n (n·d, or d broadcast to every row) -> n vectors of d
// modulate_ (x·(1 + scale) + shift) and gated_add_ (x += gate·y) in ops.h apply them.
// Replicated on every rank.
// Thread-safety: a block is used by one rank thread; load() reads the store only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/model/blocks/linear.h"

namespace seqpar {

struct TimestepEmbedding {
  Linear fc1, fc2;
  int64_t freq_dim = 0;
  float scale = 1.0f;  // Qwen-Image: 1000 (its timesteps are 0..1)
  // fc1 (d, freq_dim) and fc2 (d, d) with biases.
  static TimestepEmbedding load(const WeightStore& ws, const std::string& fc1,
                                const std::string& fc2, int64_t freq_dim, float scale = 1.0f);
  Tensor forward(float t) const;  // (d)
};

struct Modulation {
  Tensor table;  // (n, d), fp32
  // <name> holding n·d values (stored (n, d) or (1, n, d)).
  static Modulation load(const WeightStore& ws, const std::string& name, int64_t n, int64_t d);
  // (n·d) row-major: table + e, e of n·d values or of d (added to every row).
  std::vector<float> rows(const Tensor& e) const;
};

}  // namespace seqpar
