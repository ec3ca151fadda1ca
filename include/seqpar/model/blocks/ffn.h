// Feed-forward blocks, the inner width split over the tensor-parallel group (up and gate
// column-parallel, down row-parallel):
//   GELU-tanh: down(gelu_tanh(up(x)))       parameters <name>.0, <name>.2 (Wan's nn.Sequential)
//   SwiGLU:    down(silu(gate(x)) · up(x))  parameters <name>.gate_proj, .up_proj, .down_proj
// each with or without biases.
// Thread-safety: a block is used by one rank thread; load() reads the store only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/model/blocks/linear.h"

namespace seqpar {

struct FeedForward {
  enum class Kind { kGeluTanh, kSwiGlu };
  Kind kind = Kind::kGeluTanh;
  ColumnLinear up, gate;
  RowLinear down;

  // The parameters under `name` for a hidden width and an inner width, with seeded inits
  // (weights 0.02, biases bias_std).
  static std::vector<WeightStore::Spec> parameters(const std::string& name, Kind kind,
                                                   int64_t hidden, int64_t inner, bool bias,
                                                   float bias_std);
  // This rank's share; InvalidArgument when tp does not divide the inner width.
  static FeedForward load(const WeightStore& ws, const std::string& name, Kind kind, int64_t inner,
                          bool bias, const ParallelContext& ctx);
  Tensor forward(const Tensor& x, Communicator& tp) const;  // (.., hidden) -> (.., hidden)
};

}  // namespace seqpar
