// ring with schedule steal (work stealing, DistFlashAttn's balance with the tokens left in
// place; docs/algorithms.md "ring, schedule steal"): causal attention on contiguous shards
// leaves the first ranks idle, so the ranks with the dearest rows (late positions) give the
// work of some of them to the ranks with the cheapest, which compute it during the ring and
// send the states back. The plan (steal_plan.h) is a pure function of the partition.
//
// Accepts: a Partition whose ranks hold contiguous runs of positions (layout contiguous, uneven
//   and padded shards; InvalidArgument otherwise); this rank's q (B, n_r, H, D) and
//   k, v (B, n_r, Hkv, D), fp32, bf16 or fp16; CpOptions: causal, padding (valid_len),
//   documents (cu_seqlens); softmax online only.
// Returns: the state of the own queries, out (B, n_r, H, D) and lse (B, n_r, H), fp32; *stats
//   set. With a plan of no pieces (non-causal even shards) it is the plain ring.
// Steps on rank r of N, with the plan:
//   1. for each piece r gives away: isend of its query rows to the helper, irecv of the
//      helper's out and lse; for each piece r helps with: irecv of its query rows
//   2. the ring (ring_over_blocks) over the rows r keeps; at every step, after its own rows, r
//      attends the rows it helps with to the block it holds (waiting for their queries the first
//      time a block is visible to them), merging by LSE per piece
//   3. isend each helped piece's state (out fp32, lse fp32) to its owner; the owner waits for the
//      states of its pieces and places them into its rows (the rows it gave away are otherwise
//      empty: the merge with the empty state)
// Rows each rank computes, causal, S = 4096 on N = 4 (shards of 1024; the K/V block held at
// each ring step is ring.cc's table):
//   rank   own rows kept   rows it helps with (owner: positions)   work / mean
//   0      0..1023         2: 2897..3071, 3: 3693..3967            1.0014
//   1      1024..2047      3: 3968..4095                           0.9961
//   2      2048..2896      -                                       1.0009
//   3      3072..3692      -                                       1.0015
//   (without steal: 0.25, 0.75, 1.25, 1.75)
// Bytes per rank: the ring's, plus per piece of m rows B·m·H·D·e of queries, owner to helper
//   (1 message), and B·m·H·(D+1)·4 of state, helper to owner (2 messages: out, lse); at most N-1
//   pieces.
// Memory: the ring's K/V (own shard plus two receive slots); besides, the query rows and states
//   of the pieces it gives and helps with, a copy of the kept rows' queries when it gives any,
//   and the assembled result.
// Limitations: contiguous shards only, online softmax only; the balance holds over the call,
//   not per ring step (ranks busy at different steps wait for each other where the ring's
//   transfers couple them); zigzag balances every step without the extra exchange, but reorders
//   the tokens.
#include <algorithm>
#include <cstring>
#include <vector>

#include "schedule_build.h"
#include "seqpar/core/param_error.h"
#include "seqpar/core/tensor_view.h"
#include "seqpar/core/timer.h"
#include "steal_plan.h"
#include "strategy_common.h"

namespace seqpar {

namespace {

// Piece i's messages: its queries, then the returned out and lse.
constexpr int kTagSteal = 300;
int tag_q(size_t piece) { return kTagSteal + 3 * static_cast<int>(piece); }
int tag_out(size_t piece) { return tag_q(piece) + 1; }
int tag_lse(size_t piece) { return tag_q(piece) + 2; }

int64_t row_cost(int64_t p, bool causal, int64_t keys) {
  return causal ? std::min(p + 1, keys) : keys;
}

// Bytes of one row (dimension 1) of x (B, n, ...).
// Rows [begin, end) of x (B, n, ...): a view of x (dense when x is and B is 1).
TensorView rows_of(const TensorView& x, int64_t begin, int64_t end) {
  return x.narrow(1, begin, end - begin);
}

}  // namespace

// ---- the plan --------------------------------------------------------------------------------

StealPlan steal_plan(std::span<const int64_t> first, std::span<const int64_t> count, bool causal,
                     int64_t keys) {
  const int n = static_cast<int>(count.size());
  SEQPAR_CHECK(static_cast<int>(first.size()) == n && n >= 1 && keys >= 1, "steal plan inputs");
  StealPlan plan;
  plan.keep.assign(n, 0);
  plan.cost.assign(n, 0);
  std::vector<int64_t> load(n, 0);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count[r]; ++i) load[r] += row_cost(first[r] + i, causal, keys);
    total += load[r];
  }
  // Compared as n·x against total: x below the mean t = total / n.
  auto below_mean = [&](int64_t x) { return static_cast<__int128>(x) * n < total; };
  for (int r = 0; r < n; ++r) {
    int64_t kept = 0, i = 0;
    while (i < count[r] && below_mean(kept)) kept += row_cost(first[r] + i++, causal, keys);
    plan.keep[r] = i;
    plan.cost[r] = kept;
  }
  int helper = 0;
  auto next_helper = [&] {
    while (helper < n && (plan.keep[helper] < count[helper] || !below_mean(plan.cost[helper])))
      ++helper;
    SEQPAR_CHECK(helper < n, "steal plan: gifts beyond the helpers' room");
  };
  for (int r = 0; r < n; ++r) {
    for (int64_t i = plan.keep[r]; i < count[r]; ++i) {
      next_helper();
      plan.cost[helper] += row_cost(first[r] + i, causal, keys);
      StealPiece* last = plan.pieces.empty() ? nullptr : &plan.pieces.back();
      if (last && last->owner == r && last->helper == helper && last->end == i) {
        ++last->end;
      } else {
        plan.pieces.push_back({r, i, i + 1, helper});
      }
    }
  }
  return plan;
}

StealPlan steal_plan(const Partition& part, bool causal, int64_t valid_len) {
  const int n = part.ranks();
  std::vector<int64_t> first(n), count(n);
  for (int r = 0; r < n; ++r) {
    const auto pos = part.positions(r);
    count[r] = static_cast<int64_t>(pos.size());
    first[r] = pos.empty() ? 0 : pos.front();
    SEQPAR_PARAM_CHECK(pos.empty() || pos.back() - pos.front() + 1 == count[r], "layout",
                       "contiguous", param("schedule"), " 'steal' needs contiguous shards; rank ",
                       r, " of ", param("layout"), " '", layout_name(part.layout()),
                       "' holds positions ", pos.front(), "..", pos.back(), " with gaps");
  }
  return steal_plan(first, count, causal, valid_len > 0 ? valid_len : part.seq());
}

// ---- the run ---------------------------------------------------------------------------------

AttnState steal_attention(Communicator& comm, const Partition& part, const TensorView& q,
                          const TensorView& k_in, const TensorView& v_in, const CpOptions& opts,
                          CpStats* stats) {
  validate_local_shapes(comm, part, q, k_in, v_in);
  SEQPAR_PARAM_CHECK(opts.softmax == SoftmaxMode::kOnline, "softmax", "online", param("schedule"),
                     " 'steal' runs with ", param("softmax"), " 'online', not '",
                     softmax_mode_name(opts.softmax), "'");
  const StealPlan plan = steal_plan(part, opts.causal, opts.valid_len);
  if (plan.pieces.empty()) return ring_attention(comm, part, q, k_in, v_in, opts, stats);
  // k and v travel as ring blocks: dense as given, else packed once.
  const Tensor k = k_in.contiguous(), v = v_in.contiguous();
  if (stats) *stats = CpStats{};

  const int n = comm.size(), r = comm.rank();
  const int64_t B = q.dim(0), rows = q.dim(1), H = q.dim(2), D = q.dim(3);
  std::vector<std::span<const int64_t>> blocks(n);
  for (int i = 0; i < n; ++i) blocks[i] = part.positions(i);
  const int64_t keep = plan.keep[r];

  // 1. Post the stolen queries' exchange and the receives of the states coming back.
  struct Given {  // a piece of this rank's rows computed by a helper
    size_t index;
    const StealPiece* piece;
    Tensor q;
    AttnState back;
    Request send_q, recv_out, recv_lse;
  };
  struct Helped {  // a piece of another rank's rows computed here
    size_t index = 0;
    const StealPiece* piece = nullptr;
    std::span<const int64_t> q_pos;
    Tensor q;
    Request recv_q, send_out, send_lse;
    bool arrived = false, attended = false;
    AttnState acc;
  };
  std::vector<Given> given;
  std::vector<Helped> helped;
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const StealPiece& p = plan.pieces[i];
    if (p.owner == r) given.push_back({i, &p, {}, {}, {}, {}, {}});
    if (p.helper == r) {
      Helped& h = helped.emplace_back();
      h.index = i;
      h.piece = &p;
      h.q_pos = part.positions(p.owner).subspan(p.begin, p.rows());
    }
  }
  double compute = 0, wait = 0;
  int64_t work = 0;
  for (Helped& h : helped) {
    h.q = Tensor({B, h.piece->rows(), H, D}, q.dtype());
    h.recv_q = comm.irecv(h.q.raw(), h.q.nbytes(), h.piece->owner, tag_q(h.index));
  }
  for (Given& g : given) {
    g.q = rows_of(q, g.piece->begin, g.piece->end).contiguous();  // sent as one block
    g.back.out = Tensor({B, g.piece->rows(), H, D});
    g.back.lse = Tensor({B, g.piece->rows(), H});
    g.recv_out =
        comm.irecv(g.back.out.raw(), g.back.out.nbytes(), g.piece->helper, tag_out(g.index));
    g.recv_lse =
        comm.irecv(g.back.lse.raw(), g.back.lse.nbytes(), g.piece->helper, tag_lse(g.index));
    g.send_q = comm.isend(g.q.raw(), g.q.nbytes(), g.piece->helper, tag_q(g.index));
  }

  // 2. The ring over the kept rows; the helped rows attend each block after them.
  auto on_block = [&](int src, const Tensor& bk, const Tensor& bv,
                      const std::function<void()>& progress) {
    for (Helped& h : helped) {
      if (fully_hidden(opts, h.q_pos, blocks[src])) continue;
      if (!h.arrived) {
        const double t = now_seconds();
        h.recv_q.wait();
        wait += now_seconds() - t;
        h.arrived = true;
      }
      const double t0 = now_seconds();
      KernelCall call(opts, h.q_pos, blocks[src], B);
      call.params.progress = progress;
      if (h.attended) {  // folded into the state by the kernel
        flash_attention_fold(h.acc, h.q, bk, bv, call.params);
      } else {
        h.acc = flash_attention(h.q, bk, bv, call.params);
        h.attended = true;
      }
      work += visible_score_elements(B, H, h.piece->rows(), bk.dim(1), call.params.mask);
      compute += now_seconds() - t0;
    }
  };
  // The kept rows, read in place by the kernel.
  AttnState own = ring_over_blocks(comm, blocks, part.positions(r).first(keep), rows_of(q, 0, keep),
                                   k, v, opts, stats, on_block);

  // 3. States back to their owners; this rank's rows assembled.
  double t = now_seconds();
  for (Helped& h : helped) {
    h.recv_q.wait();
    if (!h.attended) h.acc = AttnState::empty(B, h.piece->rows(), H, D);
    h.send_out = comm.isend(h.acc.out.raw(), h.acc.out.nbytes(), h.piece->owner, tag_out(h.index));
    h.send_lse = comm.isend(h.acc.lse.raw(), h.acc.lse.nbytes(), h.piece->owner, tag_lse(h.index));
  }
  wait += now_seconds() - t;
  AttnState result;
  {
    const double t0 = now_seconds();
    result.out = Tensor({B, rows, H, D});
    result.lse = Tensor({B, rows, H});
    MutableTensorView(result.out).narrow(1, 0, keep).copy_from(own.out);
    MutableTensorView(result.lse).narrow(1, 0, keep).copy_from(own.lse);
    compute += now_seconds() - t0;
  }
  for (Given& g : given) {
    t = now_seconds();
    g.recv_out.wait();
    g.recv_lse.wait();
    g.send_q.wait();
    wait += now_seconds() - t;
    const double t0 = now_seconds();
    const int64_t n = g.piece->rows();
    MutableTensorView(result.out).narrow(1, g.piece->begin, n).copy_from(g.back.out);
    MutableTensorView(result.lse).narrow(1, g.piece->begin, n).copy_from(g.back.lse);
    compute += now_seconds() - t0;
  }
  t = now_seconds();
  for (Helped& h : helped) {
    h.send_out.wait();
    h.send_lse.wait();
  }
  wait += now_seconds() - t;
  if (stats) {
    stats->work += work;
    stats->compute_seconds += compute;
    stats->wait_seconds += wait;
  }
  return result;
}

// ---- the schedule ----------------------------------------------------------------------------

Schedule steal_schedule_of(const CallRuns& c) {
  const int n = c.n();
  std::vector<int64_t> first(n), count(n);
  for (int r = 0; r < n; ++r) {
    count[r] = run_count(c.q[r]);
    first[r] = count[r] == 0 ? 0 : run_min(c.q[r]);
    SEQPAR_PARAM_CHECK(count[r] == 0 || run_max(c.q[r]) - first[r] + 1 == count[r], "layout",
                       "contiguous", param("schedule"), " 'steal' needs contiguous shards; rank ",
                       r, " holds positions ", first[r], "..", run_max(c.q[r]), " with gaps");
  }
  const StealPlan plan = steal_plan(first, count, c.causal, c.valid_len > 0 ? c.valid_len : c.seq);
  Schedule s = empty_schedule(c);
  const GroupMembers members = consecutive_members(0, n);
  if (plan.pieces.empty()) {
    add_ring(s, c, members, c.kv, c.q, c.H, c.Hkv, CommGroup::kSp, SoftmaxMode::kOnline);
    return s;
  }
  const uint64_t q_row = c.B * c.H * c.D * c.e;          // one query row, all heads
  const uint64_t state_row = c.B * c.H * (c.D + 1) * 4;  // its fp32 out and lse
  auto exchange = [&](int r, const char* what, uint64_t give_row, uint64_t help_row,
                      int64_t calls_per_piece) {
    Step st = collective_step(OpKind::kSendRecv, false, what, CommGroup::kSp, members, 0, 0);
    Transfer& t = *st.comm;
    t.calls = 0;
    for (const StealPiece& p : plan.pieces) {
      if (p.owner == r) {
        t.sent += give_row * p.rows();
        t.recv += help_row * p.rows();
        t.peers.push_back({p.helper, give_row * p.rows(), help_row * p.rows()});
      } else if (p.helper == r) {
        t.sent += help_row * p.rows();
        t.recv += give_row * p.rows();
        t.peers.push_back({p.owner, help_row * p.rows(), give_row * p.rows()});
      } else {
        continue;
      }
      t.calls += calls_per_piece;
    }
    return st;
  };
  std::vector<PositionRuns> kept(n);
  for (int r = 0; r < n; ++r) {
    kept[r] = range_runs(first[r], first[r] + plan.keep[r]);
    // Before the ring: the stolen queries go to their helpers (the owner's out and lse receives
    // are posted then too, but their bytes count when they arrive: the step after the ring).
    s.ranks[r].steps.push_back(exchange(r, "stolen q", q_row, 0, 1));
  }
  add_ring(s, c, members, c.kv, kept, c.H, c.Hkv, CommGroup::kSp, SoftmaxMode::kOnline);
  for (const StealPiece& p : plan.pieces) {
    const PositionRuns q = range_runs(first[p.owner] + p.begin, first[p.owner] + p.end);
    RankSchedule& rs = s.ranks[p.helper];
    bool attended = false;
    for (int step = 0; step < n; ++step) {
      const int src = ((p.helper - step) % n + n) % n;
      if (c.hidden(q, c.kv[src])) continue;
      Step& st = rs.steps[1 + step];
      st.work += c.B * c.H * c.visible(q, c.kv[src]);
      if (attended) st.copy_bytes += c.fold_bytes(p.rows(), c.H);
      attended = true;
    }
  }
  for (int r = 0; r < n; ++r) {
    RankSchedule& rs = s.ranks[r];
    rs.steps.push_back(exchange(r, "stolen out, lse", 0, state_row, 2));
    // The own rows and the returned pieces placed into the result: read and written once.
    rs.steps.push_back(compute_step(0, 2.0 * state_row * rs.tokens));
  }
  return s;
}

Schedule steal_schedule(const ParallelConfig& cfg, const AttnShape& shape) {
  SEQPAR_PARAM_CHECK(cfg.softmax == SoftmaxMode::kOnline, "softmax", "online", param("schedule"),
                     " 'steal' runs with ", param("softmax"), " 'online', not '",
                     softmax_mode_name(cfg.softmax), "'");
  SEQPAR_PARAM_CHECK(cfg.layout == Layout::kContiguous, "layout", "contiguous", param("schedule"),
                     " 'steal' balances contiguous shards; ", param("layout"), " '",
                     layout_name(cfg.layout), "' is not");
  return steal_schedule_of(sequence_runs(cfg, shape));
}

}  // namespace seqpar
