#include <random>

#include "seqpar/model/context.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {

WeightStore WeightStore::random(const std::vector<Spec>& specs, uint64_t seed) {
  WeightStore ws;
  for (const auto& s : specs) {
    Tensor t(s.shape);
    if (s.init_std < 0) {
      t.fill(1.f);
    } else if (s.init_std > 0) {
      // Each parameter has its own stream, so adding a parameter changes no other.
      std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                        static_cast<uint32_t>(std::hash<std::string>()(s.name))};
      std::mt19937 rng(seq);
      std::normal_distribution<float> dist(0.f, s.init_std);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    }
    ws.tensors_[s.name] = std::move(t);
  }
  return ws;
}

WeightStore WeightStore::from_safetensors(const std::string& path, const std::vector<Spec>& specs) {
  SafetensorsFile file(path);
  WeightStore ws;
  for (const auto& s : specs) ws.tensors_[s.name] = load_checked(file, s.name, s.shape, DType::kF32);
  SEQPAR_ARG_CHECK(file.names().size() == specs.size(), path, ": holds ", file.names().size(),
                   " tensors, the model has ", specs.size(), " parameters");
  return ws;
}

const Tensor& WeightStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  SEQPAR_CHECK(it != tensors_.end(), "no weight named '", name, "'");
  return it->second;
}

}  // namespace seqpar
