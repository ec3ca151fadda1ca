// Seeded synthetic inputs of an attention job (parallel/runner.h, `seqpar run`, calibration):
// each (tensor, batch, position) row of H·D values comes from its own counter-based stream, so a
// rank generates exactly its tokens and any rank can regenerate any row (for verification)
// without communication.
// Thread-safety: pure.
#pragma once

#include <cstdint>
#include <span>

#include "seqpar/core/tensor.h"

namespace seqpar {

// Text rows (joint attention) are their own streams, indexed by text position 0..T-1.
enum class SyntheticTensor : uint64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kTextQ = 4,
  kTextK = 5,
  kTextV = 6
};

// (B, positions.size(), heads, head_dim) holding rows at the given global positions.
// Values are uniform with unit variance (in [-sqrt(3), sqrt(3)]), rounded to dtype.
Tensor synthetic_rows(uint64_t seed, SyntheticTensor which, int64_t batch,
                      std::span<const int64_t> positions, int64_t heads, int64_t head_dim,
                      DType dtype);

}  // namespace seqpar
