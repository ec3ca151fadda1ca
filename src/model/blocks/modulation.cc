#include "seqpar/model/blocks/modulation.h"

#include "seqpar/model/ops.h"

namespace seqpar {

TimestepEmbedding TimestepEmbedding::load(const WeightStore& ws, const std::string& fc1,
                                          const std::string& fc2, int64_t freq_dim, float scale) {
  return TimestepEmbedding{Linear::load(ws, fc1, true), Linear::load(ws, fc2, true), freq_dim,
                           scale};
}

Tensor TimestepEmbedding::forward(float t) const {
  Tensor e = fc1.forward(timestep_embedding(t, freq_dim, scale));
  silu_(e);
  return fc2.forward(e);
}

Modulation Modulation::load(const WeightStore& ws, const std::string& name, int64_t n, int64_t d) {
  Tensor t = ws.get(name);
  SEQPAR_CHECK(t.numel() == n * d, "modulation '", name, "' ", t.shape_str(), " for ", n, " x ", d);
  return Modulation{reshape(std::move(t), {n, d})};
}

std::vector<float> Modulation::rows(const Tensor& e) const {
  const int64_t all = table.numel(), d = table.dim(1);
  SEQPAR_CHECK(e.numel() == all || e.numel() == d, "modulation of ", table.shape_str(), " by ",
               e.shape_str());
  std::vector<float> m(all);
  for (int64_t i = 0; i < all; ++i)
    m[i] = table.data<float>()[i] + e.data<float>()[e.numel() == all ? i : i % d];
  return m;
}

}  // namespace seqpar
