// ring pass-Q (passq with schedule ring; docs/algorithms.md "ring pass-Q"): the K/V cache stays
// put, the query blocks travel around the ring (the ring driver, ring_driver.h), each member
// attends every block to its K/V shard, and the partial states return to their owners in one
// all-to-all, where they merge by LSE.
//
// Accepts: a KvPlacement: member i holds the K/V of its cache share and new tokens (kv_pos[i];
//   k, v (B, K_i, Hkv, D)) and the queries of its new tokens (q_pos[i]; q (B, T_i, H, D),
//   T_i possibly 0), fp32, bf16 or fp16; CpOptions: causal, documents (packed requests).
// Returns: the state of the own new tokens over the whole cache, out (B, T_r, H, D) and
//   lse (B, T_r, H), fp32; *stats reset.
// Steps on member r of N (next = r+1, prev = r-1; T = Σ T_i); at step s it holds the Q block of
// member src = r-s (its own at s = 0):
//   1. if s < N-1: irecv(prev) of the block of member r-s-1, isend(next) of the held block
//   2. attend the held block (B, T_src, H, D) to the local K/V; its partial state goes into
//      src's slot of the all-to-all send buffer as [B][T_src][H·D | H] fp32 (out rows, then
//      lse); an empty block (T_src = 0) passes and computes nothing
//   3. wait; the received block becomes the held one
//   then all_to_allv of the partials (member j gets the rows of its queries from every member)
//   and the merge of each own query's N partials by LSE, in member order.
// Q blocks held (member i holds the block of member i-s), N = 4:
//   step   member 0   member 1   member 2   member 3
//   0      q0         q1         q2         q3
//   1      q3         q0         q1         q2
//   2      q2         q3         q0         q1
//   3      q1         q2         q3         q0
//   then   partials of q0 from members 0..3 on member 0, of q1 on member 1, ...
// Bytes per member (e: the input element size):
//   sent     B·(T - T_{r+1})·H·D·e (N-1 send_recv, overlapped) + B·(T - T_r)·H·(D+1)·4
//   received B·(T - T_r)·H·D·e + B·T_r·H·(D+1)·4·(N-1)
//   summed over the members, the bytes of all-gather pass-Q.
// Memory: the own K/V shard (CpStats::peak_kv_bytes); two Q receive slots (the largest blocks);
//   the fp32 partials of all T queries (B·T·H·(D+1)·4) and the N received ones of the own
//   queries (N·B·T_r·H·(D+1)·4). Blocks are copied on every backend (a Q block is small next to
//   the K/V it meets).
// Limitations: online softmax only; for T = 1 the one Q block crosses N-1 hops in series, which
//   all-gather pass-Q does in one collective (choose_cache_strategy replays both).
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <vector>

#include "ring_driver.h"
#include "schedule_build.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "strategy_common.h"

namespace seqpar {

namespace {

constexpr int kTagQ = 111;
constexpr RingTraceNames kTraceNames{"passq ring", "passq", "queries"};

// Rows (B·T) of the empty state (out 0, lse -inf), packed as pack_partial_rows packs them.
void pack_empty_rows(int64_t rows, int64_t H, int64_t D, float* dst) {
  const int64_t w = packed_row_floats(H, D);
  for (int64_t row = 0; row < rows; ++row) {
    std::fill(dst + row * w, dst + row * w + H * D, 0.f);
    std::fill(dst + row * w + H * D, dst + (row + 1) * w, -std::numeric_limits<float>::infinity());
  }
}

}  // namespace

AttnState passq_ring_attention(Communicator& comm, const KvPlacement& place, const Tensor& q,
                               const Tensor& k, const Tensor& v, const CpOptions& opts,
                               CpStats* stats) {
  const int n = comm.size(), r = comm.rank();
  validate_placement(comm, place, q, k, v);
  const int64_t B = q.dim(0), H = q.dim(2), D = q.dim(3);
  const int64_t w = packed_row_floats(H, D);  // one packed partial row: out, then lse
  if (stats) *stats = CpStats{};

  // Slot of member j's queries in the all-to-all send buffer: [j][B][T_j][w].
  std::vector<int64_t> counts(n), slot(n + 1, 0);
  for (int j = 0; j < n; ++j) {
    counts[j] = static_cast<int64_t>(place.q_pos[j].size());
    slot[j + 1] = slot[j] + B * counts[j] * w;
  }
  std::vector<float> send(static_cast<size_t>(slot[n]));

  // 1. The ring of Q blocks; each step attends the held block (B, T_src, H, D) to the local K/V
  // and packs the partial state into src's slot.
  double compute = 0;
  int64_t work = 0;
  const auto k_pos = std::span<const int64_t>(place.kv_pos[r]);
  auto attend_block = [&](const RingBlock& block, const std::function<void()>& progress) {
    const double t0 = now_seconds();
    const int src = block.owner;
    const auto q_pos = std::span<const int64_t>(place.q_pos[src]);
    float* dst = send.data() + slot[src];
    if (fully_hidden(opts, q_pos, k_pos)) {  // no visible key (or no query)
      pack_empty_rows(B * counts[src], H, D, dst);
    } else {
      KernelCall call(opts, q_pos, k_pos, B);
      call.params.progress = progress;
      const AttnState part = flash_attention(block[0], k, v, call.params);
      work += visible_score_elements(B, H, counts[src], k.dim(1), call.params.mask);
      pack_partial_rows(part, 0, B * counts[src], dst);
    }
    compute += now_seconds() - t0;
  };
  const RingPayload payload{{&q}, {kTagQ}, counts, /*zero_copy=*/false};
  const RingTotals ring = ring_pass(comm, payload, kTraceNames, attend_block);

  // 2. All-to-all: member j's slot goes to member j; from every member, the rows of our queries.
  const double t2 = now_seconds();
  std::vector<size_t> send_counts(n), recv_counts(n);
  for (int j = 0; j < n; ++j) {
    send_counts[j] = static_cast<size_t>(slot[j + 1] - slot[j]) * sizeof(float);
    recv_counts[j] = static_cast<size_t>(B * counts[r] * w) * sizeof(float);
  }
  std::vector<float> recv(static_cast<size_t>(n * B * counts[r] * w));
  {
    trace::Scope span("passq ring all_to_allv", "comm", trace::Lane::kComm);
    comm.all_to_allv(send.data(), send_counts, recv.data(), recv_counts);
  }
  const double t3 = now_seconds();

  // 3. Merge, member by member.
  AttnState acc = merge_packed_partials(recv.data(), n, B, counts[r], H, D);
  if (stats) {
    stats->peak_kv_bytes = static_cast<int64_t>(k.nbytes() + v.nbytes());
    stats->measured_kv_bytes = stats->peak_kv_bytes;  // the own shard only
    stats->work = work;
    stats->wait_seconds = ring.wait_seconds + (t3 - t2);
    stats->compute_seconds = compute + (now_seconds() - t3);
  }
  return acc;
}

// ---- schedule -------------------------------------------------------------------------------

// Member r at step s (0 <= s < N) attends the Q block of member r - s to its K/V and, for
// s < N-1, sends that block to member r+1 while receiving the block of member r-s-1 from member
// r-1 (one send_recv of q, overlapped). Then one all_to_allv of the fp32 partial rows (out, lse)
// with per-peer bytes, and the N merges of each own row.
Schedule passq_ring_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = cache_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  const int n = c.n();
  const GroupMembers members = consecutive_members(0, n);
  const uint64_t q_token = c.B * c.H * c.D * c.e;
  const uint64_t partial = c.B * c.H * (c.D + 1) * 4;  // fp32 out row and lse of one token
  std::vector<int64_t> count(n);
  for (int j = 0; j < n; ++j) count[j] = run_count(c.q[j]);
  for (int r = 0; r < n; ++r) {
    RankSchedule& rs = s.ranks[r];
    for (int step = 0; step < n; ++step) {
      const int src = ((r - step) % n + n) % n;
      Step st;
      if (!c.hidden(c.q[src], c.kv[r])) st.work = c.B * c.H * c.visible(c.q[src], c.kv[r]);
      if (step + 1 < n) {
        Transfer& t = st.comm.emplace();
        t.op = OpKind::kSendRecv;
        t.what = "q";
        t.group = CommGroup::kSp;
        t.members = members;
        t.sent = q_token * count[src];
        t.recv = q_token * count[((r - step - 1) % n + n) % n];
        t.calls = 1;
        t.overlaps_compute = true;
      }
      rs.steps.push_back(std::move(st));
    }
    Step back =
        collective_step(OpKind::kAllToAll, true, "partial out, lse", CommGroup::kSp, members, 0, 0);
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const PeerBytes p{j, partial * count[j], partial * count[r]};
      back.comm->sent += p.sent;
      back.comm->recv += p.recv;
      back.comm->peers.push_back(p);
    }
    rs.steps.push_back(std::move(back));
    rs.steps.push_back(compute_step(0, n * c.merge_bytes(count[r], c.H)));
    rs.peak_kv_bytes = 2 * c.B * run_count(c.kv[r]) * c.Hkv * c.D * c.e;
  }
  return s;
}

}  // namespace seqpar
