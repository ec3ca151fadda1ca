// ring (pass-KV): K/V blocks travel around the ring while each rank computes on the block it
// holds; partial states merge by LSE. On member r of N, with next = r+1 and prev = r-1 (mod N):
//   step s (0 <= s < N), holding the block of member src = r - s:
//     1. if s < N-1: post irecv(prev) into the free buffer, isend(next) of the held block
//     2. attend q to the held block unless causal masking hides all of it; merge into acc
//     3. wait for both transfers; the received block (of member r-s-1) becomes the held block
// Buffers: the own block plus two receive buffers used alternately, so a buffer is refilled only
// after its send and its compute finished (the step before).
// Zero copy (comm.borrows(): ranks share memory, threads backend): every block the ring carries
// is some member's own k/v, which no member modifies during the call, so nothing is copied at
// all: step 1 receives with irecv_borrow (the address of the sender's block, and a lease on it)
// and step 1 of the next step forwards that address. Sends are not waited per step (a send
// completes when its receiver drops the lease); at the end each member drops the lease of the
// block it held last (never forwarded), then, from the last send back to the first, waits for
// the send and drops the lease of the block it sent (which completes its sender's send). Every chain of borrows ends
// at a member that releases without waiting, so this drain cannot deadlock, and no member
// returns while another still reads its k/v. CommStats count the same logical bytes.
//
// softmax const-max (docs/algorithms.md "const-max ring"): before step 0, all-reduce (max) the
// largest key norm of every (batch, kv head) and bound every query row's logits by
// scale·|q|·max|k|. The first block attended runs with the online softmax and decides per row:
// fixed max (bound within 30 of its lse) or fallback. Every later step runs the kernel with the
// fixed max for the fixed rows, whose sums then add without rescaling (ConstMaxAccumulator).
#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "schedule_build.h"
#include "strategy_common.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "strategy_common.h"

namespace seqpar {

namespace {
constexpr int kTagK = 101;
constexpr int kTagV = 102;
}  // namespace

AttnState ring_over_blocks(Communicator& comm, std::span<const std::span<const int64_t>> block_pos,
                           std::span<const int64_t> q_pos, const Tensor& q, const Tensor& k,
                           const Tensor& v, const CpOptions& opts, CpStats* stats,
                           const RingBlockHook& on_block) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t B = q.dim(0), H = q.dim(2), D = q.dim(3), Hkv = k.dim(2);
  SEQPAR_CHECK(static_cast<int>(block_pos.size()) == n, "one block per ring member");
  SEQPAR_CHECK(k.dim(1) == static_cast<int64_t>(block_pos[r].size()), "own block size");

  AttnState acc = AttnState::empty(B, q.dim(1), H, D);
  std::array<Tensor, 2> buf_k, buf_v;
  const Tensor* cur_k = &k;
  const Tensor* cur_v = &v;
  // Zero copy: views of the borrowed blocks, the leases on them (index s: the block held at
  // step s+1) and every step's sends, all settled after the last step. (sends before leases:
  // destroyed after them, so an unwinding member first drops what it borrowed, and only then
  // waits for its own lent blocks.)
  const bool borrow = comm.borrows() && n > 1;
  Tensor held_k, held_v;
  // Bytes a receive buffer of that many bytes occupies (Tensor's 64-byte rounding, at least 64).
  auto slot_bytes = [](size_t bytes) { return std::max<size_t>(64, (bytes + 63) / 64 * 64); };
  std::array<size_t, 2> borrowed_capacity = {0, 0};  // per receive slot, K (V is the same)
  std::vector<std::array<Request, 2>> sends(borrow ? n - 1 : 0);
  std::vector<std::array<std::shared_ptr<void>, 2>> leases(borrow ? n - 1 : 0);
  int src = r;
  double compute = 0, wait = 0, end_sync = 0;
  int64_t work = 0;
  bool first = true;
  std::optional<ConstMaxAccumulator> cmax;
  if (opts.softmax == SoftmaxMode::kConstMax) {
    const double t = now_seconds();
    cmax.emplace(const_max_row_bounds(comm, q, k, block_pos[r], opts));
    wait += now_seconds() - t;
  }

  for (int step = 0; step < n; ++step) {
    std::array<Request, 4> reqs;
    const int incoming = (r + n - step - 1) % n;
    const int64_t in_len = static_cast<int64_t>(block_pos[incoming].size());
    const void* in_k = nullptr;
    const void* in_v = nullptr;
    trace::Scope step_span(trace::enabled() ? detail::concat("ring step ", step) : std::string(),
                           "ring", trace::Lane::kCompute);
    step_span.arg("block_of", src);
    step_span.arg("keys", static_cast<int64_t>(block_pos[src].size()));
    const double post_us = step_span.active() ? trace::now_us() : 0;
    double arrived_us = 0;  // --trace: when the incoming block was first seen complete
    if (step + 1 < n) {
      if (borrow) {
        const size_t bytes = static_cast<size_t>(B * in_len * Hkv * D) * dtype_size(k.dtype());
        // A borrowed block occupies a receive slot as a copied one would (peak_kv_bytes below
        // counts the same K/V a rank reads at once, whether or not the backend copies it).
        borrowed_capacity[step % 2] = std::max(borrowed_capacity[step % 2], slot_bytes(bytes));
        reqs[0] = comm.irecv_borrow(nullptr, bytes, prev, kTagK, &in_k, &leases[step][0]);
        reqs[1] = comm.irecv_borrow(nullptr, bytes, prev, kTagV, &in_v, &leases[step][1]);
        sends[step][0] = comm.isend(cur_k->raw(), cur_k->nbytes(), next, kTagK);
        sends[step][1] = comm.isend(cur_v->raw(), cur_v->nbytes(), next, kTagV);
      } else {
        Tensor& nk = buf_k[step % 2];
        Tensor& nv = buf_v[step % 2];
        nk.resize({B, in_len, Hkv, D}, k.dtype());
        nv.resize({B, in_len, Hkv, D}, v.dtype());
        in_k = nk.raw();
        in_v = nv.raw();
        reqs[0] = comm.irecv(nk.raw(), nk.nbytes(), prev, kTagK);
        reqs[1] = comm.irecv(nv.raw(), nv.nbytes(), prev, kTagV);
        reqs[2] = comm.isend(cur_k->raw(), cur_k->nbytes(), next, kTagK);
        reqs[3] = comm.isend(cur_v->raw(), cur_v->nbytes(), next, kTagV);
      }
    }

    const auto k_pos = block_pos[src];
    if (!fully_hidden(opts, q_pos, k_pos)) {
      double t0 = now_seconds();
      KernelCall call(opts, q_pos, k_pos, B);
      AttnParams& params = call.params;
      params.progress = [&reqs, &arrived_us] {
        for (auto& rq : reqs) rq.test();
        // --trace: the first moment the incoming block is seen complete (requests that are done
        // are empty, so test() is then free).
        if (arrived_us == 0 && trace::enabled() && reqs[0].test() && reqs[1].test())
          arrived_us = trace::now_us();
      };
      if (cmax && cmax->started()) cmax->prepare(params);
      AttnState part_state = flash_attention(q, *cur_k, *cur_v, params);
      if (cmax) {
        if (cmax->started()) {
          cmax->add(part_state);
        } else {
          cmax->start(std::move(part_state));
        }
      } else if (first) {
        acc = std::move(part_state);
        first = false;
      } else {
        merge_into(acc, part_state);
      }
      work += visible_score_elements(B, H, q.dim(1), cur_k->dim(1), params.mask);
      compute += now_seconds() - t0;
    }
    if (on_block) {  // more queries on the held block (schedule steal)
      on_block(src, *cur_k, *cur_v, [&reqs] {
        for (auto& rq : reqs) rq.test();
      });
    }

    double t1 = now_seconds();
    wait_all(reqs);  // zero copy: the receives only; the sends settle in the drain below
    wait += now_seconds() - t1;
    if (step + 1 < n) {
      if (trace::enabled()) {  // one slice per step's transfer, from posting to arrival
        const size_t block = static_cast<size_t>(B * in_len * Hkv * D) * dtype_size(k.dtype());
        trace::complete(detail::concat("ring step ", step, " transfer"), "comm",
                        trace::Lane::kComm, post_us, arrived_us > 0 ? arrived_us : trace::now_us(),
                        {{"bytes_sent", static_cast<int64_t>(cur_k->nbytes() + cur_v->nbytes())},
                         {"bytes_recv", static_cast<int64_t>(2 * block)},
                         {"to", next},
                         {"from", prev},
                         {"zero_copy", borrow ? 1 : 0}});
      }
      if (borrow) {
        held_k = Tensor::borrow(in_k, {B, in_len, Hkv, D}, k.dtype());
        held_v = Tensor::borrow(in_v, {B, in_len, Hkv, D}, v.dtype());
        cur_k = &held_k;
        cur_v = &held_v;
      } else {
        cur_k = &buf_k[step % 2];
        cur_v = &buf_v[step % 2];
      }
      src = incoming;
    }
  }
  if (borrow) {
    trace::Scope drain_span("ring drain", "comm", trace::Lane::kComm);
    const double t = now_seconds();
    leases[n - 2] = {};  // the last block held: not forwarded
    for (int s = n - 2; s >= 0; --s) {
      wait_all(sends[s]);
      if (s > 0) leases[s - 1] = {};  // the block sent at step s
    }
    end_sync = now_seconds() - t;
    wait += end_sync;
  }

  int64_t fallback = 0;
  if (cmax && cmax->started()) {
    const double t = now_seconds();
    fallback = cmax->fallback_rows();
    acc = cmax->finish();
    compute += now_seconds() - t;
  }
  if (stats) {
    stats->fallback_rows += fallback;
    int64_t kv = static_cast<int64_t>(k.nbytes() + v.nbytes());
    for (int i = 0; i < 2; ++i)
      kv += static_cast<int64_t>(buf_k[i].capacity_bytes() + buf_v[i].capacity_bytes() +
                                 2 * borrowed_capacity[i]);
    stats->peak_kv_bytes = std::max(stats->peak_kv_bytes, kv);
    // Storage actually allocated: the receive buffers (empty when every block was borrowed).
    int64_t held = static_cast<int64_t>(k.nbytes() + v.nbytes());
    for (int i = 0; i < 2; ++i)
      held += static_cast<int64_t>(buf_k[i].capacity_bytes() + buf_v[i].capacity_bytes());
    stats->measured_kv_bytes = std::max(stats->measured_kv_bytes, held);
    stats->work += work;
    stats->compute_seconds += compute;
    stats->wait_seconds += wait;
    stats->end_sync_seconds += end_sync;
  }
  return acc;
}

AttnState ring_attention(Communicator& comm, const Partition& part, const Tensor& q,
                         const Tensor& k, const Tensor& v, const CpOptions& opts,
                         CpStats* stats) {
  validate_local_shapes(comm, part, q, k, v);
  std::vector<std::span<const int64_t>> blocks(part.ranks());
  for (int i = 0; i < part.ranks(); ++i) blocks[i] = part.positions(i);
  if (stats) *stats = CpStats{};
  return ring_over_blocks(comm, blocks, part.positions(comm.rank()), q, k, v, opts, stats);
}

// ---- schedule -------------------------------------------------------------------------------

namespace {

// Tensor's capacity rule: 64-byte multiples, at least 64 (0 for nothing).
int64_t capacity_bytes(int64_t bytes) {
  return bytes <= 0 ? 0 : std::max<int64_t>(64, (bytes + 63) / 64 * 64);
}

// What ring_over_blocks holds on member r: its own block plus two receive buffers (K and V
// each), buffer i refilled at steps s = i (mod 2), s < n-1, growing to the largest block it
// received. len[i]: tokens of block i; token_bytes: K or V of one token.
int64_t ring_peak_kv(std::span<const int64_t> len, int r, int64_t token_bytes) {
  const int n = static_cast<int>(len.size());
  int64_t buf[2] = {0, 0};
  for (int s = 0; s + 1 < n; ++s) {
    const int incoming = ((r - s - 1) % n + n) % n;
    buf[s % 2] = std::max(buf[s % 2], len[incoming] * token_bytes);
  }
  return 2 * len[r] * token_bytes + 2 * (capacity_bytes(buf[0]) + capacity_bytes(buf[1]));
}

}  // namespace

// Member i at step s (0 <= s < n) attends to the block of member i - s and, for s < n-1, sends
// the block it holds to member i+1 while receiving that of member i-s-1 from member i-1. A step
// after the first attended block merges its state into the accumulator.
void add_ring(Schedule& s, const CallRuns& c, GroupMembers members,
              std::span<const PositionRuns> blocks, std::span<const PositionRuns> queries,
              int64_t heads, int64_t kv_heads, CommGroup group, SoftmaxMode softmax) {
  const int n = static_cast<int>(members.size());
  const int64_t token = c.B * kv_heads * c.D * static_cast<int64_t>(c.e);  // K or V of a token
  std::vector<int64_t> len(n);
  for (int i = 0; i < n; ++i) len[i] = run_count(blocks[i]);
  for (int i = 0; i < n; ++i) {
    RankSchedule& rs = s.ranks[members[i]];
    if (softmax == SoftmaxMode::kConstMax && n > 1)
      rs.steps.push_back(key_norms_step(c, members, kv_heads, group));
    const int64_t rows = run_count(queries[i]);
    bool attended = false;
    for (int step = 0; step < n; ++step) {
      const int src = ((i - step) % n + n) % n;
      Step st;
      if (!c.hidden(queries[i], blocks[src])) {
        st.work = c.B * heads * c.visible(queries[i], blocks[src]);
        if (attended) st.copy_bytes = c.merge_bytes(rows, heads);
        attended = true;
      }
      if (step + 1 < n) {
        Transfer& t = st.comm.emplace();
        t.op = OpKind::kSendRecv;
        t.what = "k, v";
        t.group = group;
        t.members = members;
        t.sent = 2 * token * len[src];
        t.recv = 2 * token * len[((i - step - 1) % n + n) % n];
        t.calls = 2;
        t.overlaps_compute = true;
      }
      rs.steps.push_back(std::move(st));
    }
    rs.peak_kv_bytes = ring_peak_kv(len, i, token);
  }
}

Schedule ring_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  const CallRuns c = sequence_runs(cfg, shape);
  Schedule s = empty_schedule(c);
  add_ring(s, c, consecutive_members(0, c.n()), c.kv, c.q, c.H, c.Hkv, CommGroup::kSp, cfg.softmax);
  return s;
}

}  // namespace seqpar
