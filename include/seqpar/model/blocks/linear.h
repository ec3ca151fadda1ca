// Linear layers of the blocks: whole on every rank (embeddings and heads of a DiT), or split over
// the tensor-parallel group by output rows (column-parallel: q/k/v, FFN up) or by input columns
// (row-parallel: o, FFN down). Weights stay in the checkpoint's dtype (ops' linear converts), or
// become int8 with their scales in w_scale when the store says so (weight_format: Q8_0 or
// per-channel; a row-parallel share per channel takes the whole row's scale); their
// inputs are rounded to the store's activations dtype in the product (linear()). Shapes are per
// rank.
// Thread-safety: a layer is used by one rank thread; load() reads the store only.
#pragma once

#include <cstdint>
#include <string>

#include "seqpar/core/index_range.h"
#include "seqpar/model/context.h"

namespace seqpar {

// The contiguous share of `count` items of tp rank r of n (count divisible by n).
IndexRange tp_share(int64_t count, int rank, int n);

// A matrix weight `read` from the store under `name`, held as the store's weight_format() says:
// into w as read, or quantized into w (int8) and w_scale (Q8_0: fp16 (rows, cols / 32);
// per-channel: fp32 (rows), from row_abs_max where given: ops.h quantize_int8_channel).
void hold_matrix(const WeightStore& ws, const std::string& name, Tensor read, Tensor& w,
                 Tensor& w_scale, const Tensor& row_abs_max = Tensor());

// y = x·Wᵀ + b with W (out, in), the same on every rank.
// Weights: <name>.weight (+ .bias).
struct Linear {
  Tensor w, b, w_scale;
  DType activations = DType::kF32;
  static Linear load(const WeightStore& ws, const std::string& name, bool bias);
  Tensor forward(const Tensor& x) const;  // (.., in) -> (.., out)
};

// y = x·Wᵀ + b with W (out, in): this rank holds output rows [begin, end) (column-parallel).
struct ColumnLinear {
  Tensor w, b, w_scale;
  DType activations = DType::kF32;
  static ColumnLinear load(const WeightStore& ws, const std::string& name, int64_t begin,
                           int64_t end, bool bias);
  Tensor forward(const Tensor& x) const;  // (.., in) -> (.., end-begin)
};

// y = all_reduce_tp(x_t·W_tᵀ) + b with W (out, in): this rank holds input columns [begin, end)
// (row-parallel); the bias is added once, after the reduction.
struct RowLinear {
  Tensor w, b, w_scale;
  DType activations = DType::kF32;
  static RowLinear load(const WeightStore& ws, const std::string& name, int64_t begin, int64_t end,
                        bool bias);
  Tensor forward(const Tensor& x, Communicator& tp) const;  // (.., end-begin) -> (.., out)
};

}  // namespace seqpar
