#include "seqpar/parallel/strategies.h"

#include "parallel/strategy_common.h"

namespace seqpar {

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kAllGather: return "allgather";
    case Strategy::kRing: return "ring";
  }
  return "?";
}

Strategy parse_strategy(std::string_view name) {
  if (name == "allgather" || name == "all_gather" || name == "all-gather")
    return Strategy::kAllGather;
  if (name == "ring" || name == "passkv" || name == "pass-kv") return Strategy::kRing;
  throw InvalidArgument(
      detail::concat("--strategy '", name, "' is unknown; valid: ring, allgather"));
}

void validate_local_shapes(const Communicator& comm, const Partition& part, const Tensor& q,
                           const Tensor& k, const Tensor& v) {
  SEQPAR_ARG_CHECK(part.ranks() == comm.size(), "partition has ", part.ranks(),
                   " ranks but the communicator has ", comm.size());
  const int64_t n = part.count(comm.rank());
  SEQPAR_ARG_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4,
                   "q, k, v must be (B, S, H, D); got q ", q.shape_str(), ", k ", k.shape_str(),
                   ", v ", v.shape_str());
  SEQPAR_ARG_CHECK(q.dim(1) == n && k.dim(1) == n && v.dim(1) == n, "rank ", comm.rank(),
                   " holds ", n, " tokens but q, k, v have ", q.dim(1), ", ", k.dim(1), ", ",
                   v.dim(1));
  SEQPAR_ARG_CHECK(k.shape() == v.shape(), "k ", k.shape_str(), " and v ", v.shape_str(),
                   " must have the same shape");
  SEQPAR_ARG_CHECK(q.dim(0) == k.dim(0) && q.dim(3) == k.dim(3), "q ", q.shape_str(), " and k ",
                   k.shape_str(), " must agree on batch and head_dim");
  SEQPAR_ARG_CHECK(k.dim(2) >= 1 && q.dim(2) % k.dim(2) == 0, "heads ", q.dim(2),
                   " is not divisible by kv_heads ", k.dim(2));
  SEQPAR_ARG_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(),
                   "q, k, v must have one dtype");
}

AttnParams kernel_params(const CpOptions& opts, std::span<const int64_t> q_pos,
                         std::span<const int64_t> k_pos) {
  AttnParams p;
  p.scale = opts.scale;
  p.block_q = opts.block_q;
  p.block_k = opts.block_k;
  p.mask.causal = opts.causal;
  p.mask.q_pos = q_pos;
  p.mask.k_pos = k_pos;
  return p;
}

AttnState context_parallel_attention(Strategy strategy, Communicator& comm, const Partition& part,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const CpOptions& opts, CpStats* stats) {
  switch (strategy) {
    case Strategy::kAllGather: return allgather_attention(comm, part, q, k, v, opts, stats);
    case Strategy::kRing: return ring_attention(comm, part, q, k, v, opts, stats);
  }
  throw Error("unknown strategy");
}

CommPrediction predict_comm_bytes(Strategy strategy, const Partition& part, int rank,
                                  int64_t batch, int64_t kv_heads, int64_t head_dim,
                                  size_t elem_bytes) {
  const int n = part.ranks();
  const uint64_t token_kv = 2ull * batch * kv_heads * head_dim * elem_bytes;  // K and V of a token
  const uint64_t others = static_cast<uint64_t>(part.seq() - part.count(rank));
  CommPrediction p;
  if (n == 1) return p;
  switch (strategy) {
    case Strategy::kAllGather:
      p.sent = token_kv * part.count(rank) * (n - 1);
      p.recv = token_kv * others;
      break;
    case Strategy::kRing:
      p.sent = token_kv * (part.seq() - part.count((rank + 1) % n));
      p.recv = token_kv * others;
      break;
  }
  return p;
}

}  // namespace seqpar
