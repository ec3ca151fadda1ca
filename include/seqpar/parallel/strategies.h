// Context-parallel attention: each rank holds the queries, keys and values of its tokens (a
// Partition of the sequence) and gets the attention of its queries over the whole sequence.
// Strategies compose attention/ (local kernel, merge) with comm/ (the Communicator).
//
// Shapes on rank r (n_r = part.count(r) tokens at global positions part.positions(r)):
//   q (B, n_r, H, D)   k, v (B, n_r, Hkv, D)   -> AttnState{out (B, n_r, H, D), lse (B, n_r, H)}
// Costs per rank (e = element bytes; docs/algorithms.md):
//   allgather: K and V gathered in one bulk op each; sent 2·B·n_r·Hkv·D·e·(N-1),
//              received 2·B·(S-n_r)·Hkv·D·e. K/V memory: the full sequence.
//   ring:      N-1 steps; step s passes the block that arrived at step s-1 (own at s=0) to rank
//              r+1 while computing on it; sent 2·B·(S-n_{r+1})·Hkv·D·e, received
//              2·B·(S-n_r)·Hkv·D·e. K/V memory: own shard plus two blocks in flight.
// Thread-safety: one call per rank thread; ranks run the same call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/comm/communicator.h"
#include "seqpar/parallel/partition.h"

namespace seqpar {

enum class Strategy { kAllGather, kRing };
std::string_view strategy_name(Strategy s);
Strategy parse_strategy(std::string_view name);  // throws InvalidArgument listing valid names

struct CpOptions {
  bool causal = false;
  float scale = 0.f;  // 0 = 1/sqrt(D)
  int block_q = 0;    // kernel block sizes, 0 = the kernel's choice
  int block_k = 0;
};

// What one call did on this rank, besides CommStats.
struct CpStats {
  int64_t peak_kv_bytes = 0;  // K/V bytes held at once (own shard + received blocks)
  int64_t work = 0;           // visible score elements computed (B·H·pairs)
  double compute_seconds = 0;  // time inside the local kernel and merges
  double wait_seconds = 0;     // time blocked on communication
};

AttnState allgather_attention(Communicator& comm, const Partition& part, const Tensor& q,
                              const Tensor& k, const Tensor& v, const CpOptions& opts,
                              CpStats* stats = nullptr);

AttnState ring_attention(Communicator& comm, const Partition& part, const Tensor& q,
                         const Tensor& k, const Tensor& v, const CpOptions& opts,
                         CpStats* stats = nullptr);

// Dispatches on strategy. Validates shapes against the partition (InvalidArgument).
AttnState context_parallel_attention(Strategy strategy, Communicator& comm, const Partition& part,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const CpOptions& opts, CpStats* stats = nullptr);

// Bytes this rank is predicted to send and receive in one call (the formulas above), for
// checking CommStats exactly and for the planner.
struct CommPrediction {
  uint64_t sent = 0;
  uint64_t recv = 0;
};
CommPrediction predict_comm_bytes(Strategy strategy, const Partition& part, int rank,
                                  int64_t batch, int64_t kv_heads, int64_t head_dim,
                                  size_t elem_bytes);

}  // namespace seqpar
