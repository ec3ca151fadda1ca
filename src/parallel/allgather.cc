// allgather (docs/algorithms.md "allgather"): every rank gathers the whole K and V, then
// attends its queries to all of it. The always-correct fallback: no ordering, no overlap.
//
// Accepts: a Partition (any layout, uneven and padded shards, documents); this rank's
//   q (B, n_r, H, D) and k, v (B, n_r, Hkv, D), fp32, bf16 or fp16, H a multiple of Hkv;
//   CpOptions: causal, padding (valid_len), documents (cu_seqlens).
// Returns: the state of the own queries over the whole sequence, out (B, n_r, H, D) and
//   lse (B, n_r, H), fp32; *stats set.
// Steps on rank r of N:
//   step 0: all_gatherv K, then V ([B, n_i, Hkv, D] from each rank, in rank order)
//   step 1: (B > 1 only) regroup [rank][B][n_i] -> [B][rank, n_i]
//   step 2: flash_attention(q, K, V) with the gathered key positions (the ranks' positions
//           concatenated), so masks follow global positions for every layout.
// K/V blocks held (block i: the K/V of rank i), N = 4:
//   step     rank 0     rank 1     rank 2     rank 3
//   start    0          1          2          3
//   0        0 1 2 3    0 1 2 3    0 1 2 3    0 1 2 3
// Bytes per rank (t = 2·B·Hkv·D·e, a token's K and V; S = Σ n_i): sent t·n_r·(N-1), received
//   t·(S - n_r); even shards 2·S·Hkv·D·e·B·(N-1)/N each way, in two collectives.
// Memory: the whole sequence's K/V, t·S (CpStats::peak_kv_bytes); with B > 1 each gather also
//   stages the tensor it gathers before the regroup (up to t·S/2 more while V is gathered).
// Limitations: K/V memory grows with S on every rank; the gather is not overlapped with compute.
#include <cstring>
#include <vector>

#include "schedule_build.h"
#include "seqpar/core/timer.h"
#include "strategy_common.h"

namespace seqpar {

namespace {

// Gathers x (B, n_r, Hkv, D) from every rank into (B, S, Hkv, D), keys in rank order.
Tensor gather_tokens(Communicator& comm, const Partition& part, const Tensor& x) {
  const int n = comm.size();
  const int64_t B = x.dim(0), S = part.seq();
  const size_t row = static_cast<size_t>(x.dim(2) * x.dim(3)) * dtype_size(x.dtype());
  std::vector<size_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = static_cast<size_t>(B * part.count(i)) * row;
  Tensor full({B, S, x.dim(2), x.dim(3)}, x.dtype());
  if (B == 1) {
    comm.all_gatherv(x.raw(), full.raw(), counts);
    return full;
  }
  Tensor staged({B * S, x.dim(2), x.dim(3)}, x.dtype());
  comm.all_gatherv(x.raw(), staged.raw(), counts);
  const char* src = static_cast<const char*>(staged.raw());
  char* dst = static_cast<char*>(full.raw());
  int64_t offset = 0;  // token offset of rank i's block within a batch row
  for (int i = 0; i < n; ++i) {
    const int64_t ni = part.count(i);
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(dst + (b * S + offset) * row, src, ni * row);
      src += ni * row;
    }
    offset += ni;
  }
  return full;
}

}  // namespace

AttnState allgather_attention(Communicator& comm, const Partition& part, const TensorView& q,
                              const TensorView& k, const TensorView& v, const CpOptions& opts,
                              CpStats* stats) {
  validate_local_shapes(comm, part, q, k, v);
  const int r = comm.rank();
  double t0 = now_seconds();
  // q is read where it lies; k and v are sent as they are when dense, else packed once.
  Tensor k_full = gather_tokens(comm, part, k.contiguous());
  Tensor v_full = gather_tokens(comm, part, v.contiguous());
  double t1 = now_seconds();
  const std::vector<int64_t> k_pos = part.concatenated_positions();
  KernelCall call(opts, part.positions(r), k_pos, q.dim(0));
  const AttnParams& params = call.params;
  AttnState state = flash_attention(q, k_full, v_full, params);
  double t2 = now_seconds();
  if (stats) {
    stats->peak_kv_bytes = static_cast<int64_t>(k_full.nbytes() + v_full.nbytes());
    stats->measured_kv_bytes =
        static_cast<int64_t>(k_full.capacity_bytes() + v_full.capacity_bytes());
    stats->work = visible_score_elements(q.dim(0), q.dim(2), q.dim(1), k_full.dim(1), params.mask);
    stats->wait_seconds = t1 - t0;
    stats->compute_seconds = t2 - t1;
  }
  return state;
}

// The schedule: two all_gatherv (K, V) over the group, then attention over the whole sequence
// (with B > 1 the gathered rows are regrouped: a copy of what was received).
void add_allgather(Schedule& s, const CallRuns& c) {
  const int n = c.n();
  const uint64_t token = c.B * c.Hkv * c.D * c.e;  // K or V of one token
  PositionRuns all;
  for (const auto& kv : c.kv) all.insert(all.end(), kv.begin(), kv.end());
  for (int r = 0; r < n; ++r) {
    const int64_t mine = run_count(c.kv[r]);
    const uint64_t sent = token * mine * (n - 1), recv = token * (c.seq - mine);
    RankSchedule& rs = s.ranks[r];
    for (const char* what : {"k", "v"})
      rs.steps.push_back(collective_step(OpKind::kAllGather, true, what, CommGroup::kSp,
                                         consecutive_members(0, n), sent, recv));
    rs.steps.push_back(compute_step(c.B * c.H * c.visible(c.q[r], all),
                                    c.B > 1 ? 2.0 * static_cast<double>(recv) : 0));
    rs.peak_kv_bytes = 2 * c.B * c.seq * c.Hkv * c.D * c.e;
  }
}

Schedule allgather_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = sequence_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  add_allgather(s, c);
  return s;
}

}  // namespace seqpar
