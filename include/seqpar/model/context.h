// What a module needs to run on one rank: its communicators (tensor-parallel group,
// sequence-parallel group, cfg group), the attention strategy, and the model's weights.
// Thread-safety: one ParallelContext per rank thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "seqpar/comm/communicator.h"
#include "seqpar/core/tensor.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

struct ParallelContext {
  Communicator* tp = nullptr;   // tensor-parallel group: heads and FFN columns split over it
  SpComms* sp = nullptr;        // sequence-parallel group (ulysses x ring)
  Communicator* cfg = nullptr;  // classifier-free-guidance group (size 1 or 2)
  Strategy strategy = Strategy::kRing;
  Layout layout = Layout::kContiguous;
  CpOptions cp;                 // ulysses mode etc.; causal and valid_len are set per call
  bool pad = false;             // pad sequences that do not divide instead of uneven shards

  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
  int sp_rank() const { return sp->sp().rank(); }
  int sp_size() const { return sp->sp().size(); }
};

// A model's parameters by name, full (unsharded) fp32 tensors; modules slice their shard.
class WeightStore {
 public:
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    float init_std = 0.02f;  // seeded init: normal(0, std); 0 = zeros; < 0 = ones
  };
  // Every parameter from a seeded normal init (each name has its own stream).
  static WeightStore random(const std::vector<Spec>& specs, uint64_t seed);
  // Every parameter from a safetensors file (fp32/bf16/fp16 converted to fp32); the file must
  // hold exactly these names with these shapes, and only finite values (InvalidArgument naming
  // what differs, or the tensor holding an Inf or NaN).
  static WeightStore from_safetensors(const std::string& path, const std::vector<Spec>& specs);

  const Tensor& get(const std::string& name) const;  // Error if missing
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const std::map<std::string, Tensor>& all() const { return tensors_; }
  void set(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }

 private:
  std::map<std::string, Tensor> tensors_;
};

}  // namespace seqpar
