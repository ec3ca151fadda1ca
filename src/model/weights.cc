#include <cmath>
#include <cstdint>
#include <cstring>
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

namespace {

// A weight with an Inf or NaN would make every output that reads it NaN (docs/kernel.md
// "Numerics: non-finite inputs"): refuse it at load time, naming the tensor and the first one.
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  const float* x = t.data<float>();
  unsigned bad = 0;  // branch-free (vectorized) first: exponent bits all set
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  if (bad == 0) return;
  for (int64_t i = 0; i < t.numel(); ++i) {
    SEQPAR_ARG_CHECK(std::isfinite(x[i]), path, ": tensor '", name, "' holds a non-finite value (",
                     x[i], " at element ", i, " of ", t.numel(), "); valid: finite weights");
  }
}

}  // namespace

WeightStore WeightStore::from_safetensors(const std::string& path, const std::vector<Spec>& specs) {
  SafetensorsFile file(path);
  WeightStore ws;
  for (const auto& s : specs) {
    Tensor t = load_checked(file, s.name, s.shape, DType::kF32);
    check_finite(path, s.name, t);
    ws.tensors_[s.name] = std::move(t);
  }
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
