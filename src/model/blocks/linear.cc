#include "seqpar/model/blocks/linear.h"

#include "seqpar/core/block_cache.h"
#include "seqpar/model/ops.h"

namespace seqpar {

IndexRange tp_share(int64_t count, int rank, int n) {
  SEQPAR_CHECK(count % n == 0, count, " is not divisible by the tensor-parallel size ", n);
  return {count / n * rank, count / n * (rank + 1)};
}

void hold_matrix(const WeightStore& ws, const std::string& name, Tensor read, Tensor& w,
                 Tensor& w_scale, const Tensor& row_abs_max) {
  switch (ws.weight_format()) {
    case WeightFormat::kCheckpoint:
      w = std::move(read);
      return;
    case WeightFormat::kQ8_0: {
      Q8Weight q = quantize_q8_0(read, name);
      w = std::move(q.q);
      w_scale = std::move(q.d);
      break;
    }
    case WeightFormat::kInt8Channel: {
      Int8ChannelWeight q = quantize_int8_channel(read, name, row_abs_max);
      w = std::move(q.q);
      w_scale = std::move(q.s);
      break;
    }
  }
  // The matrix as read is not kept for a later tensor (core/block_cache.h): it is the size of a
  // weight, which no activation is, and would add to the load's peak.
  read = Tensor();
  block_cache::release();
}

Linear Linear::load(const WeightStore& ws, const std::string& name, bool bias) {
  Linear l;
  const std::string w = name + ".weight";
  hold_matrix(ws, w, ws.rows(w, 0, ws.shape(w).at(0)), l.w, l.w_scale);
  if (bias) l.b = ws.get(name + ".bias");
  l.activations = ws.activations();
  return l;
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, w, b, w_scale, activations); }

ColumnLinear ColumnLinear::load(const WeightStore& ws, const std::string& name, int64_t begin,
                                int64_t end, bool bias) {
  ColumnLinear l;
  hold_matrix(ws, name + ".weight", ws.rows(name + ".weight", begin, end), l.w, l.w_scale);
  if (bias) l.b = ws.rows(name + ".bias", begin, end).to(DType::kF32);
  l.activations = ws.activations();
  return l;
}

Tensor ColumnLinear::forward(const Tensor& x) const {
  return linear(x, w, b, w_scale, activations);
}

RowLinear RowLinear::load(const WeightStore& ws, const std::string& name, int64_t begin,
                          int64_t end, bool bias) {
  RowLinear l;
  const std::string w = name + ".weight";
  // Per-channel int8: every rank scales its columns by the whole row's maximum, so the ranks'
  // partial products add up to the product of the matrix quantized whole.
  const bool whole = begin == 0 && end == ws.shape(w).at(1);
  const Tensor row_abs_max =
      ws.weight_format() == WeightFormat::kInt8Channel && !whole ? ws.row_abs_max(w) : Tensor();
  hold_matrix(ws, w, ws.cols(w, begin, end), l.w, l.w_scale, row_abs_max);
  if (bias) l.b = ws.get(name + ".bias");
  l.activations = ws.activations();
  return l;
}

Tensor RowLinear::forward(const Tensor& x, Communicator& tp) const {
  // int8 activations with per-channel weights: every rank scales a row by the whole row's
  // maximum, so the ranks' partial products add up to the product of the row quantized whole.
  // (With Q8_0 weights each block of 32 has its own scale, and lies within one rank's columns.)
  Tensor x_row_max;
  const bool q8 = w_scale.dtype() == DType::kF16;
  if (activations == DType::kI8 && tp.size() > 1 && !q8) {
    x_row_max = row_abs_max(x);
    tp.all_reduce(std::span<float>(x_row_max.data<float>(), x_row_max.numel()), ReduceOp::kMax);
  }
  Tensor y = linear(x, w, Tensor(), w_scale, activations, x_row_max);
  if (tp.size() > 1) tp.all_reduce(std::span<float>(y.data<float>(), y.numel()), ReduceOp::kSum);
  if (!b.empty()) {
    const int64_t n = b.numel(), rows = y.numel() / n;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i) y.data<float>()[r * n + i] += b.data<float>()[i];
  }
  return y;
}

}  // namespace seqpar
