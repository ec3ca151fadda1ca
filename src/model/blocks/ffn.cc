#include "seqpar/model/blocks/ffn.h"

#include "seqpar/core/param_error.h"
#include "seqpar/model/ops.h"

namespace seqpar {

namespace {
// The names of (up, gate, down) under `name`; gate empty for GELU-tanh.
struct FfnNames {
  std::string up, gate, down;
};
FfnNames names_of(const std::string& name, FeedForward::Kind kind) {
  if (kind == FeedForward::Kind::kGeluTanh) return {name + ".0", "", name + ".2"};
  return {name + ".up_proj", name + ".gate_proj", name + ".down_proj"};
}
}  // namespace

std::vector<WeightStore::Spec> FeedForward::parameters(const std::string& name, Kind kind,
                                                       int64_t hidden, int64_t inner, bool bias,
                                                       float bias_std) {
  const FfnNames n = names_of(name, kind);
  std::vector<WeightStore::Spec> s;
  if (kind == Kind::kSwiGlu) s.push_back({n.gate + ".weight", {inner, hidden}});
  s.push_back({n.up + ".weight", {inner, hidden}});
  if (kind == Kind::kGeluTanh && bias) s.push_back({n.up + ".bias", {inner}, bias_std});
  s.push_back({n.down + ".weight", {hidden, inner}});
  if (bias) {
    if (kind == Kind::kSwiGlu) {
      s.push_back({n.gate + ".bias", {inner}, bias_std});
      s.push_back({n.up + ".bias", {inner}, bias_std});
    }
    s.push_back({n.down + ".bias", {hidden}, bias_std});
  }
  return s;
}

FeedForward FeedForward::load(const WeightStore& ws, const std::string& name, Kind kind,
                              int64_t inner, bool bias, const ParallelContext& ctx) {
  SEQPAR_PARAM_CHECK(inner % ctx.tp_size() == 0, "tp", "", param("tp"), " ", ctx.tp_size(),
                     " must divide the FFN's inner width ", inner);
  const FfnNames n = names_of(name, kind);
  FeedForward f;
  f.kind = kind;
  auto [c0, c1] = tp_share(inner, ctx.tp_rank(), ctx.tp_size());
  f.up = ColumnLinear::load(ws, n.up, c0, c1, bias);
  if (kind == Kind::kSwiGlu) f.gate = ColumnLinear::load(ws, n.gate, c0, c1, bias);
  f.down = RowLinear::load(ws, n.down, c0, c1, bias);
  return f;
}

Tensor FeedForward::forward(const Tensor& x, Communicator& tp) const {
  if (kind == Kind::kGeluTanh) {
    Tensor h = up.forward(x);
    gelu_tanh_(h);
    return down.forward(h, tp);
  }
  return down.forward(swiglu(gate.forward(x), up.forward(x)), tp);
}

}  // namespace seqpar
