// Patches of a latent video: (B, C, F, H, W) <-> tokens (B, S, C·pt·ph·pw) in (frame, row,
// column) order, each token's features channel-major (c, t, y, x) as a Conv3d's weight reads
// them; and the patch embedding, a linear map of each patch (the Conv3d with stride = kernel).
// Replicated on every rank.
// Thread-safety: pure functions; a block is used by one rank thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "seqpar/model/blocks/linear.h"

namespace seqpar {

Tensor patchify(const Tensor& latent, std::array<int64_t, 3> patch);
Tensor unpatchify(const Tensor& tokens, int64_t channels, std::array<int64_t, 3> grid,
                  std::array<int64_t, 3> patch);

struct PatchEmbedding {
  Linear proj;  // (d, C·pt·ph·pw) with bias
  std::array<int64_t, 3> patch{1, 2, 2};
  static PatchEmbedding load(const WeightStore& ws, const std::string& name,
                             std::array<int64_t, 3> patch);
  Tensor forward(const Tensor& latent) const;  // (B, C, F, H, W) -> (B, S, d)
};

}  // namespace seqpar
