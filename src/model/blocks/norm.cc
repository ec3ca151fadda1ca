#include "seqpar/model/blocks/norm.h"

#include "seqpar/model/ops.h"

namespace seqpar {

RmsNorm RmsNorm::load(const WeightStore& ws, const std::string& name, float eps) {
  return RmsNorm{ws.get(name + ".weight"), eps};
}

Tensor RmsNorm::forward(const Tensor& x) const { return rms_norm(x, weight, eps); }

DistRmsNorm DistRmsNorm::load(const WeightStore& ws, const std::string& name, int64_t begin,
                              int64_t end, int64_t full_width, float eps) {
  DistRmsNorm n;
  n.weight = ws.rows(name + ".weight", begin, end).to(DType::kF32);
  n.full_width = full_width;
  n.eps = eps;
  return n;
}

Tensor DistRmsNorm::forward(const Tensor& x, Communicator& tp) const {
  Tensor ss = row_sum_squares(x);
  if (tp.size() > 1) tp.all_reduce(std::span<float>(ss.data<float>(), ss.numel()), ReduceOp::kSum);
  return rms_norm_with_stats(x, ss, full_width, weight, eps);
}

HeadRmsNorm HeadRmsNorm::load(const WeightStore& ws, const std::string& name, float eps) {
  return HeadRmsNorm{ws.get(name + ".weight"), eps};
}

Tensor HeadRmsNorm::forward(const Tensor& x) const {
  SEQPAR_CHECK(x.ndim() >= 2 && x.dim(-1) == weight.numel(), "per-head RMSNorm of x ",
               x.shape_str(), " with a weight of ", weight.numel());
  return rms_norm(x, weight, eps);  // the last dimension is one head's features
}

LayerNorm LayerNorm::load(const WeightStore& ws, const std::string& name, float eps) {
  return LayerNorm{ws.get(name + ".weight"), ws.get(name + ".bias"), eps};
}

LayerNorm LayerNorm::plain(float eps) { return LayerNorm{Tensor(), Tensor(), eps}; }

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }

}  // namespace seqpar
