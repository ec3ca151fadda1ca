// Sequence-parallel plans: a model declares, as data, where its activations go from replicated
// to sharded over the sequence-parallel group and back, at named module boundaries; SpRuntime
// applies the plan when the forward code passes a boundary. Block code has no sharding logic:
// it sees local tokens, their positions and an attention call that reaches the whole sequence.
//
//   SpPlan dit_plan = {{"blocks.0", SpAction::kShard, {"hidden", "rope"}},
//                      {"proj_out", SpAction::kGather, {"hidden"}},
//                      {"text_embedding", SpAction::kReplicate, {"context"}}};
//
// Tensors crossing a boundary are (B, S, F): batch, tokens, features. Sharding picks this rank's
// tokens of the Partition (any layout; uneven shards, or zero padding to a multiple of the group
// when ParallelContext::pad is set, with padded keys masked); gathering all-gathers over the group,
// restores token order and drops the padding.
// Thread-safety: one SpRuntime per rank thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/model/context.h"
#include "seqpar/parallel/partition.h"

namespace seqpar {

enum class SpAction { kShard, kGather, kReplicate };

struct SpBoundary {
  std::string module;                // "blocks.0": the input of that module; "proj_out": its output
  SpAction action;
  std::vector<std::string> tensors;  // names of the tensors crossing there
};

using SpPlan = std::vector<SpBoundary>;

class SpRuntime {
 public:
  // A runtime for a sequence of `seq` tokens over ctx.sp (padding if ctx.pad and S does not
  // divide the group: to a multiple of the group, 2x the group for zigzag).
  SpRuntime(const SpPlan& plan, ParallelContext& ctx, int64_t seq);
  // The partition such a runtime takes for `seq` tokens over n sequence-parallel ranks with
  // config's layout and padding.
  static Partition partition_of(int64_t seq, int n, const ParallelConfig& config);

  // Applies the plan at `module` to the tensor `name` (B, S or n_local, F): returns it sharded,
  // gathered, or unchanged when the plan says nothing (or kReplicate) there.
  Tensor at(std::string_view module, std::string_view name, Tensor x);

  bool sharded() const { return sharded_; }
  const Partition& partition() const { return part_; }
  int64_t seq() const { return seq_; }             // real tokens
  int64_t padded_seq() const { return part_.seq(); }
  // Global positions of this rank's tokens while sharded (all tokens otherwise).
  std::span<const int64_t> local_positions() const;
  // Attention options for the current state: valid_len masks the padding.
  CpOptions cp_options(bool causal) const;

 private:
  const SpPlan& plan_;
  ParallelContext& ctx_;
  int64_t seq_;
  Partition part_;
  std::vector<int64_t> all_positions_;
  bool sharded_ = false;
};

}  // namespace seqpar
