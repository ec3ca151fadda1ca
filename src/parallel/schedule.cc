// Schedules: the shared pieces (token positions as runs, steps, sums) and the dispatch. Each
// strategy's steps are in its own file.
#include "seqpar/parallel/schedule.h"

#include "schedule_build.h"
#include "seqpar/core/error.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

std::string_view comm_group_name(CommGroup g) {
  switch (g) {
    case CommGroup::kSp:
      return "sp";
    case CommGroup::kUlysses:
      return "ulysses";
    case CommGroup::kRing:
      return "ring";
  }
  return "?";
}

std::string Transfer::op_name() const {
  std::string name(op_kind_name(op));
  return varying ? name + "v" : name;
}

CommPrediction schedule_bytes(const Schedule& s, int rank) {
  CommPrediction p;
  for (const Step& step : s.ranks.at(rank).steps)
    if (step.comm) {
      p.sent += step.comm->sent;
      p.recv += step.comm->recv;
    }
  return p;
}

int64_t schedule_work(const Schedule& s, int rank) {
  int64_t work = 0;
  for (const Step& step : s.ranks.at(rank).steps)
    if (!step.replicated || rank == 0) work += step.work;
  return work;
}

// ---- positions ------------------------------------------------------------------------------

bool CallRuns::hidden(const PositionRuns& qr, const PositionRuns& kr) const {
  if (run_count(qr) == 0 || run_count(kr) == 0) return true;
  if (valid_len > 0 && run_min(kr) >= valid_len) return true;
  if (causal && run_min(kr) > run_max(qr)) return true;
  return !cu.empty() && (document_of(cu, run_max(kr)) < document_of(cu, run_min(qr)) ||
                         document_of(cu, run_min(kr)) > document_of(cu, run_max(qr)));
}

namespace {

CallRuns sizes(const AttnShape& s) {
  CallRuns c;
  c.B = s.batch;
  c.H = s.heads;
  c.Hkv = s.kv();
  c.D = s.head_dim;
  c.e = dtype_size(s.dtype);
  c.out_e = dtype_size(s.out_dtype);
  c.lse = s.lse;
  c.kv_use = s.kv_use;
  c.causal = s.causal;
  c.text_tokens = s.text_tokens;
  c.text_by_heads = s.text_by_heads;
  c.cu = shape_cu_seqlens(s);
  return c;
}

CallRuns sizes(int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, size_t e) {
  CallRuns c;
  c.B = batch;
  c.H = heads;
  c.Hkv = kv_heads;
  c.D = head_dim;
  c.e = e;
  return c;
}

}  // namespace

CallRuns sequence_runs(const ParallelConfig& cfg, const AttnShape& s) {
  CallRuns c = sizes(s);
  const int n = cfg.sp();
  c.seq = sharded_seq(cfg, s);
  if (c.seq != s.seq) c.valid_len = s.seq;
  if (!s.seq_lens.empty() && cfg.layout != Layout::kContiguous) {
    // Partition::documents' rule: every document (and the padding after them) on its own.
    std::vector<int64_t> starts(c.cu.begin(), c.cu.end() - 1), lens(s.seq_lens);
    if (c.seq > s.seq) {
      starts.push_back(s.seq);
      lens.push_back(c.seq - s.seq);
    }
    c.q = piece_layout_runs(starts, lens, n, cfg.layout);
    c.kv = c.q;
    return c;
  }
  for (int r = 0; r < n; ++r) {
    c.q.push_back(layout_runs(c.seq, n, cfg.layout, r));
    c.kv.push_back(c.q.back());
  }
  return c;
}

CallRuns cache_runs(const ParallelConfig& cfg, const AttnShape& s) {
  CallRuns c = sizes(s);
  const int n = cfg.sp();
  c.seq = s.cached + s.fresh;
  if (!s.cached_lens.empty()) {
    RequestRuns rr = request_runs(s.cached_lens, s.fresh_lens, n, cfg.layout);
    c.q = std::move(rr.q);
    c.kv = std::move(rr.kv);
    return c;
  }
  // decode_placement's rule on runs: the first ranks get floor(T/N) new tokens, the last T mod N
  // one more.
  int64_t next = s.cached;
  for (int r = 0; r < n; ++r) {
    const int64_t share = new_token_share(s.fresh, n, r);
    PositionRuns kv = layout_runs(s.cached, n, cfg.layout, r);
    PositionRuns q = range_runs(next, next + share);
    kv.insert(kv.end(), q.begin(), q.end());
    c.q.push_back(std::move(q));
    c.kv.push_back(std::move(kv));
    next += share;
  }
  c.seq = s.cached + s.fresh;
  return c;
}

CallRuns partition_runs(const Partition& part, int64_t batch, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, size_t elem_bytes) {
  CallRuns c = sizes(batch, heads, kv_heads, head_dim, elem_bytes);
  c.seq = part.seq();
  for (int r = 0; r < part.ranks(); ++r) {
    c.q.push_back(runs_of(part.positions(r)));
    c.kv.push_back(c.q.back());
  }
  return c;
}

CallRuns placement_runs(const KvPlacement& place, int64_t batch, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, size_t elem_bytes) {
  CallRuns c = sizes(batch, heads, kv_heads, head_dim, elem_bytes);
  for (int r = 0; r < place.ranks(); ++r) {
    c.q.push_back(runs_of(place.q_pos[r]));
    c.kv.push_back(runs_of(place.kv_pos[r]));
    c.seq += static_cast<int64_t>(place.kv_pos[r].size());
  }
  return c;
}

// ---- steps ----------------------------------------------------------------------------------

GroupMembers consecutive_members(int first, int n) { return {first, 1, n}; }

Schedule empty_schedule(const CallRuns& c) {
  Schedule s;
  s.ranks.resize(c.n());
  for (int r = 0; r < c.n(); ++r) {
    s.ranks[r].tokens = run_count(c.q[r]);
    s.ranks[r].kv_tokens = run_count(c.kv[r]);
  }
  return s;
}

Step collective_step(OpKind op, bool varying, std::string what, CommGroup group,
                     GroupMembers members, uint64_t sent, uint64_t recv) {
  Step step;
  Transfer& t = step.comm.emplace();
  t.op = op;
  t.varying = varying;
  t.what = std::move(what);
  t.group = group;
  t.members = members;
  t.sent = sent;
  t.recv = recv;
  return step;
}

Step compute_step(int64_t work, double copy_bytes) {
  Step step;
  step.work = work;
  step.copy_bytes = copy_bytes;
  return step;
}

// ---- local and the dispatch -----------------------------------------------------------------

Schedule local_schedule(const ParallelConfig& cfg, const AttnShape& s) {
  const CallRuns c = s.over_cache() ? cache_runs(cfg, s) : sequence_runs(cfg, s);
  Schedule out = empty_schedule(c);
  for (int r = 0; r < c.n(); ++r) {
    out.ranks[r].steps.push_back(compute_step(c.B * c.H * c.visible(c.q[r], c.kv[r])));
    out.ranks[r].peak_kv_bytes = 2 * c.B * run_count(c.kv[r]) * c.Hkv * c.D * c.e;
  }
  return out;
}

Schedule attention_schedule(const ParallelConfig& c, const AttnShape& s) {
  ParallelConfig sp = c;  // s is the sequence-parallel group's view: tp and cfg are applied
  sp.mesh.cfg = sp.mesh.tp = 1;
  validate_config(sp, s);
  Schedule out = schedule_row(c.strategy, c.schedule).schedule(sp, image_call(s));
  if (s.text_tokens > 0) add_joint_text_schedule(out, sp, s);
  return out;
}

}  // namespace seqpar
