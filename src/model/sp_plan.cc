#include "seqpar/model/sp_plan.h"

#include <cstring>

namespace seqpar {

SpRuntime::SpRuntime(const SpPlan& plan, ParallelContext& ctx, int64_t seq)
    : plan_(plan), ctx_(ctx), seq_(seq) {
  const int n = ctx.sp_size();
  // Padding evens out shard sizes but cannot give a rank a token of its own.
  SEQPAR_ARG_CHECK(seq >= n, "the sequence has ", seq, " tokens, fewer than the ", n,
                   " sequence-parallel ranks (padding or not, every rank needs a token); use at "
                   "most ",
                   seq, " ranks");
  part_ = partition_of(seq, n, ctx.config);
  all_positions_.resize(seq);
  for (int64_t i = 0; i < seq; ++i) all_positions_[i] = i;
}

Partition SpRuntime::partition_of(int64_t seq, int n, const ParallelConfig& config) {
  return Partition(config.pad ? seqpar::padded_seq(seq, n, config.layout) : seq, n, config.layout);
}

std::span<const int64_t> SpRuntime::local_positions() const {
  return sharded_ ? part_.positions(ctx_.sp_rank()) : std::span<const int64_t>(all_positions_);
}

CpOptions SpRuntime::cp_options(bool causal) const {
  CpOptions o = ctx_.cp;
  o.ulysses_mode = ctx_.config.ulysses_mode;
  o.softmax = ctx_.config.softmax;
  o.causal = causal;
  o.valid_len = part_.seq() != seq_ ? seq_ : 0;
  return o;
}

Tensor SpRuntime::at(std::string_view module, std::string_view name, Tensor x) {
  const SpBoundary* b = nullptr;
  for (const auto& entry : plan_)
    if (entry.module == module)
      for (const auto& t : entry.tensors)
        if (t == name) b = &entry;
  if (b == nullptr || b->action == SpAction::kReplicate) return x;
  SEQPAR_CHECK(x.ndim() == 3, "sequence-parallel boundary tensors are (B, S, F); ", name, " is ",
               x.shape_str());
  const int64_t B = x.dim(0), F = x.dim(2);
  const int r = ctx_.sp_rank();
  if (b->action == SpAction::kShard) {
    SEQPAR_CHECK(x.dim(1) == seq_, "shard at ", module, ": ", name, " has ", x.dim(1),
                 " tokens, the sequence ", seq_);
    auto pos = part_.positions(r);
    Tensor y({B, static_cast<int64_t>(pos.size()), F});
    for (int64_t bb = 0; bb < B; ++bb)
      for (size_t i = 0; i < pos.size(); ++i)
        if (pos[i] < seq_)  // padding rows stay zero
          std::memcpy(y.data<float>() + (bb * pos.size() + i) * F,
                      x.data<float>() + (bb * seq_ + pos[i]) * F, F * sizeof(float));
    sharded_ = true;
    return y;
  }
  // kGather: all_gatherv over the group in rank order, then back to token order, padding dropped.
  Communicator& comm = ctx_.sp->sp();
  const int n = comm.size();
  std::vector<size_t> counts(n);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    counts[i] = static_cast<size_t>(B * part_.count(i) * F) * sizeof(float);
    total += part_.count(i);
  }
  SEQPAR_CHECK(x.dim(1) == part_.count(r), "gather at ", module, ": ", name, " has ", x.dim(1),
               " tokens, this rank holds ", part_.count(r));
  std::vector<float> all(static_cast<size_t>(B * total * F));
  comm.all_gatherv(x.raw(), all.data(), counts);
  Tensor y({B, seq_, F});
  const float* src = all.data();
  for (int i = 0; i < n; ++i) {
    auto pos = part_.positions(i);
    for (int64_t bb = 0; bb < B; ++bb)
      for (size_t t = 0; t < pos.size(); ++t, src += F)
        if (pos[t] < seq_)
          std::memcpy(y.data<float>() + (bb * seq_ + pos[t]) * F, src, F * sizeof(float));
  }
  sharded_ = false;
  return y;
}

}  // namespace seqpar
