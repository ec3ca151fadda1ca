// The cost model of one mesh: the sequence-parallel group's schedule (parallel/schedule.h: bytes,
// work, K/V memory per rank) replayed on the profile's two-level alpha-beta network, then the
// model's other layers and memory.
#include "seqpar/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/runner.h"
#include "seqpar/parallel/schedule.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

void check_workload_limits(const Workload& w) {
  using limits::checked_add;
  using limits::checked_product;
  limits::check_range("batch", w.batch, 1, limits::kMaxBatch);
  limits::check_range("heads", w.heads, 1, limits::kMaxHeads);
  limits::check_range("kv_heads", w.kv_heads, 1, limits::kMaxHeads);
  limits::check_range("head_dim", w.head_dim, 1, limits::kMaxHeadDim);
  limits::check_range("seq", w.seq, 0, limits::kMaxTokens);
  limits::check_range("text_tokens", w.text_tokens, 0, limits::kMaxTokens);
  limits::check_range("cross_tokens", w.cross_tokens, 0, limits::kMaxTokens);
  const int64_t s =
      checked_add(w.seq, w.text_tokens,
                  detail::concat("tokens (", param("seq"), " + ", param("text_tokens"), ")"));
  const int64_t b = checked_product({w.batch, w.cfg_branches}, "batch x guidance branches");
  // Every int64 count of the model is at most one of these (times small constants).
  (void)checked_product({b, w.heads, s, std::max(s, w.cross_tokens)},
                        "attention score elements (batch x heads x seq x seq)",
                        limits::kMaxScoreElements);
  (void)checked_product({b, s, w.heads + 2 * w.kv_heads, w.head_dim + 1, 8},
                        "activation bytes (batch x seq x heads x head_dim)",
                        limits::kMaxScoreElements);
}

Workload model_workload(const ModelPreset& m, int64_t tokens, int64_t batch, DType dtype,
                        bool guidance, int64_t text_tokens, int64_t cached, int64_t fresh) {
  Workload w;
  w.model = m.name;
  w.family = m.family;
  w.attention_only = false;
  w.batch = batch;
  w.heads = m.heads;
  w.kv_heads = m.kv_heads;
  w.head_dim = m.head_dim;
  w.hidden = m.hidden;
  w.ffn_dim = m.ffn_dim;
  w.layers = m.layers;
  w.params = m.params;
  w.dtype = dtype;
  switch (m.family) {
    case ModelFamily::kDiT:
      w.seq = tokens;
      w.cross_tokens = m.text_len;
      w.cfg_branches = guidance ? 2 : 1;
      break;
    case ModelFamily::kMMDiT:
      w.seq = tokens;
      w.text_tokens = text_tokens;
      w.cfg_branches = guidance ? 2 : 1;
      break;
    case ModelFamily::kLlm:
      w.causal = true;
      w.cached = cached;
      w.fresh = fresh;
      w.seq = fresh > 0 ? limits::checked_add(cached, fresh, "cached + new tokens") : tokens;
      break;
  }
  check_workload_limits(w);
  return w;
}

Workload attention_workload(int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                            int64_t batch, bool causal, DType dtype, int64_t text_tokens,
                            int64_t cached, int64_t fresh) {
  Workload w;
  w.seq = fresh > 0 ? limits::checked_add(cached, fresh, "cached + new tokens") : seq;
  w.heads = heads;
  w.kv_heads = kv_heads == 0 ? heads : kv_heads;
  w.head_dim = head_dim;
  w.batch = batch;
  w.causal = causal;
  w.dtype = dtype;
  w.text_tokens = text_tokens;
  w.cached = cached;
  w.fresh = fresh;
  check_workload_limits(w);
  return w;
}

int ranks_on_node(const HardwareProfile& hw, int world) {
  return hw.ranks_per_node <= 0 ? world : std::min(hw.ranks_per_node, world);
}

int node_of(const HardwareProfile& hw, int world_rank) {
  return hw.ranks_per_node <= 0 ? 0 : world_rank / hw.ranks_per_node;
}

PassChoice choose_pass_all2all(int64_t new_tokens, int64_t cached_tokens, int ranks, int64_t heads,
                               int64_t kv_heads, size_t elem_bytes, double flops_per_s,
                               double bytes_per_s) {
  const double e = static_cast<double>(elem_bytes);
  const double threshold =
      2.0 * kv_heads / heads - 4.0 * new_tokens * bytes_per_s / (ranks * flops_per_s * e);
  PassChoice c = pass_choice(new_tokens, cached_tokens, ranks, heads, kv_heads, elem_bytes,
                             flops_per_s, bytes_per_s, threshold, "2*Hkv/H - 4*T*BW/(N*C*e)");
  if (c.kind == Strategy::kPassKv && new_tokens < c.threshold_tokens)
    c.reason += " (pass-Q's all-to-all would cost more)";
  return c;
}

AttnShape workload_shape(const Workload& w) {
  AttnShape s;
  s.batch = w.batch * w.cfg_branches;
  s.seq = w.seq;
  s.heads = w.heads;
  s.kv_heads = w.kv_heads;
  s.head_dim = w.head_dim;
  s.causal = w.causal;
  s.text_tokens = w.text_tokens;
  if (w.decode()) {
    s.cached = w.cached;
    s.fresh = w.fresh;
  }
  s.dtype = w.dtype;
  // A model's blocks keep the output in their activations' dtype and no lse (attend(),
  // model/blocks/attention.h); a bare call keeps both in fp32 (seqpar run). Self-attention over
  // a sequence gives up its fresh k and v (KvUse::kConsume: 2 shards of K/V where blocks are
  // copied); joint blocks and a cache keep theirs.
  if (!w.attention_only) {
    s.out_dtype = w.dtype;
    s.lse = false;
    s.kv_use = w.text_tokens == 0 && !w.decode() ? KvUse::kConsume : KvUse::kKeep;
  }
  return s;
}

AttnShape workload_shape(const Workload& w, const HardwareProfile& hw) {
  AttnShape s = workload_shape(w);
  if (w.attention_only) s.kv_use = runner_kv_use(hw.shared_node);
  return s;
}

namespace {

// One mesh's cost: the sequence-parallel group's schedule (parallel/schedule.h) replayed on the
// profile, the model's other layers, memory.
class MeshModel {
 public:
  MeshModel(const Workload& w, const ParallelConfig& m, const HardwareProfile& hw,
            double memory_limit)
      : w_(w), m_(m), hw_(hw), memory_limit_(memory_limit) {}

  MeshCost run() {
    validate();
    schedule_ = attention_schedule(m_, shape_);
    cost_.config = m_;
    cost_.seq = w_.seq;
    cost_.padded_seq = w_.decode() ? w_.seq : sharded_seq(m_, shape_);
    cost_.remainder = w_.seq % N_;
    cost_.ranks.assign(N_, RankCost{});
    collectives_.assign(N_, {});
    t_.assign(N_, 0.0);
    for (int r = 0; r < N_; ++r) {
      RankCost& rc = cost_.ranks[r];
      const RankSchedule& rs = schedule_.ranks[r];
      rc.tokens = rs.tokens;
      rc.work = schedule_work(schedule_, r);
      rc.peak_kv_bytes = rs.peak_kv_bytes;
      const CommPrediction bytes = schedule_bytes(schedule_, r);
      rc.sent = bytes.sent;
      rc.recv = bytes.recv;
    }
    replay();
    model_layers();
    finish();
    memory();
    return cost_;
  }

 private:
  // The workload on this mesh: validate_config's checks of the whole mesh, the planner's own
  // (cfg against the guidance branches, tp of a bare call, usp with both degrees above 1, one
  // sp rank is local), and the shape the sequence-parallel group sees.
  void validate() {
    SEQPAR_PARAM_CHECK(w_.heads >= 1 && w_.kv_heads >= 1 && w_.heads % w_.kv_heads == 0 &&
                           w_.head_dim >= 1 && w_.batch >= 1 && w_.seq >= 1,
                       "heads", "", "the workload needs heads divisible by kv heads, ",
                       param("head_dim"), ", ", param("batch"), " and tokens");
    check_mesh_degrees(w_, m_.mesh.cfg, m_.mesh.tp);
    validate_config(m_, workload_shape(w_));
    N_ = m_.sp();
    SEQPAR_PARAM_CHECK(N_ > 1 || m_.strategy == Strategy::kLocal, "strategy", "local",
                       "one sequence-parallel rank: ", param("strategy"), " local only");
    SEQPAR_ARG_CHECK(m_.strategy != Strategy::kUsp || (m_.mesh.ulysses > 1 && m_.mesh.ring > 1),
                     "usp needs a ulysses degree and a ring degree above 1");
    shape_ = workload_shape(w_, hw_);
    shape_.batch = w_.batch * (w_.cfg_branches / m_.mesh.cfg);
    shape_.heads = w_.heads / m_.mesh.tp;
    shape_.kv_heads = std::max<int64_t>(1, w_.kv_heads / m_.mesh.tp);  // replicated past kv heads
    B_ = shape_.batch;
    H_ = shape_.heads;
    Hkv_ = shape_.kv_heads;
    D_ = w_.head_dim;
    e_ = dtype_size(w_.dtype);
    attn_rate_ = rank_attention_flops(hw_, ranks_on_node(hw_, m_.world()));
    gemm_rate_ = rank_gemm_flops(hw_, ranks_on_node(hw_, m_.world()));
  }

  // ---- network ----------------------------------------------------------------------------

  // World rank of sequence-parallel rank r in the first cfg and tp group.
  int world_rank(int r) const { return r; }
  bool inter(int a, int b) const {
    return node_of(hw_, world_rank(a)) != node_of(hw_, world_rank(b));
  }
  bool spans(const std::vector<int>& members) const {
    for (int x : members)
      if (inter(x, members.front())) return true;
    return false;
  }
  double alpha(bool inter_node) const {
    return inter_node && hw_.inter_node_latency_s > 0 ? hw_.inter_node_latency_s : hw_.latency_s;
  }
  double bw(bool inter_node) const { return inter_node ? hw_.inter_node_bw : hw_.intra_node_bw; }
  double copy_s(double bytes) const {
    return hw_.local_copy_bw > 0 ? bytes / hw_.local_copy_bw : 0;
  }
  // A rank's rates, asked of the profile once per mesh (a shared-node profile without
  // cores_per_node asks the system for its cores).
  double attn_rate() const { return attn_rate_; }
  double gemm_rate() const { return gemm_rate_; }
  double flops_of(int64_t score_elements) const {
    return 4.0 * D_ * static_cast<double>(score_elements);
  }

  void compute(int r, double seconds) {
    t_[r] += seconds;
    cost_.ranks[r].compute_s += seconds;
  }

  // ---- the replay -------------------------------------------------------------------------

  // The compute of a step: its attention and its local copies and merges.
  double step_compute_s(int r, const Step& st) {
    cost_.ranks[r].attention_flops += flops_of(st.work);
    return flops_of(st.work) / attn_rate() + copy_s(st.copy_bytes);
  }

  const Step* current(int r) const {
    const auto& steps = schedule_.ranks[r].steps;
    return pc_[r] < steps.size() ? &steps[pc_[r]] : nullptr;
  }

  // Every rank runs its steps in order; a step with communication runs once every member of
  // its group has reached it (members reach their steps on a group in the same order).
  void replay() {
    pc_.assign(N_, 0);
    std::map<std::tuple<int, int, int>, int> arrived;  // per group: members waiting at a step
    std::vector<int> ready(N_);
    std::iota(ready.begin(), ready.end(), 0);
    while (!ready.empty()) {
      const int r = ready.back();
      ready.pop_back();
      const Step* st = current(r);
      for (; st && !st->comm; st = current(r)) {
        compute(r, step_compute_s(r, *st));
        ++pc_[r];
      }
      if (!st) continue;
      const GroupMembers& g = st->comm->members;
      int& waiting = arrived[{g.first, g.stride, g.count}];
      if (++waiting < g.count) continue;
      waiting = 0;
      std::vector<int> members(g.count);
      for (int i = 0; i < g.count; ++i) {
        members[i] = g[i];
        const Step* o = current(members[i]);
        SEQPAR_CHECK(o && o->comm && o->comm->op == st->comm->op && o->comm->what == st->comm->what,
                     "the schedule of ", config_label(m_), " does not line up: sp rank ",
                     members[i], " is not at ", st->comm->what);
      }
      if (st->comm->overlaps_compute) {
        ring_step(members);
      } else {
        collective(members);
      }
      for (int x : members) {
        ++pc_[x];
        ready.push_back(x);
      }
    }
    for (int r = 0; r < N_; ++r)
      SEQPAR_CHECK(current(r) == nullptr, "the schedule of ", config_label(m_),
                   " does not line up: sp rank ", r, " waits for a member that never comes");
  }

  // A collective: it starts when the last member arrives and ends when the slowest member's
  // transfers end: (n-1)·latency (once per step: a step's calls go back to back), plus for an
  // all_to_all the bytes to and from each peer over its kind of link, the two kinds in parallel;
  // for the others (ring algorithms) what the member receives over the group's slowest link.
  void collective(const std::vector<int>& members) {
    const bool span = spans(members);
    const int n = static_cast<int>(members.size());
    double start = 0, dur = 0;
    for (int x : members) start = std::max(start, t_[x]);
    for (int x : members) {
      const Transfer& t = *current(x)->comm;
      double bytes_s;
      if (t.op == OpKind::kAllToAll) {
        double intra = 0, inter_bytes = 0;
        for (const PeerBytes& p : t.peers)
          (inter(x, p.peer) ? inter_bytes : intra) += static_cast<double>(std::max(p.sent, p.recv));
        bytes_s = std::max(intra / hw_.intra_node_bw, inter_bytes / hw_.inter_node_bw);
      } else {
        bytes_s = static_cast<double>(t.recv) / bw(span);
      }
      dur = std::max(dur, (n - 1) * alpha(span) + bytes_s);
    }
    for (int x : members) {
      const Transfer& t = *current(x)->comm;
      t_[x] = start + dur;
      collectives_[x].push_back({t.op_name(), t.what, std::string(comm_group_name(t.group)), t.sent,
                                 t.recv, t.calls, span, false, dur});
    }
  }

  // One step of a ring: every member sends to the next while receiving from the previous and
  // computing. A transfer starts when both ends have posted (rendezvous); what cannot overlap
  // with compute (1 - overlap) is paid by the receiving rank's thread.
  void ring_step(const std::vector<int>& members) {
    const int n = static_cast<int>(members.size());
    const bool span = spans(members);
    std::vector<double> start(n);
    for (int i = 0; i < n; ++i) start[i] = t_[members[i]];
    for (int i = 0; i < n; ++i) {
      const int x = members[i], prev = (i + n - 1) % n, next = (i + 1) % n;
      const Step& st = *current(x);
      const Transfer& t = *st.comm;
      const double c = step_compute_s(x, st);
      cost_.ranks[x].compute_s += c;
      const bool in_inter = inter(members[prev], x), out_inter = inter(x, members[next]);
      const double x_in = alpha(in_inter) + static_cast<double>(t.recv) / bw(in_inter);
      const double x_out = alpha(out_inter) + static_cast<double>(t.sent) / bw(out_inter);
      const double recv_done = std::max(start[prev], start[i]) + x_in;
      const double send_done = std::max(start[i], start[next]) + x_out;
      t_[x] = std::max({start[i] + c + (1 - hw_.overlap) * x_in, recv_done, send_done});
      // One entry per ring: its steps' transfers add up.
      auto& list = collectives_[x];
      const std::string group(comm_group_name(t.group));
      if (list.empty() || !list.back().overlapped || list.back().what != t.what ||
          list.back().group != group)
        list.push_back({t.op_name(), t.what, group, 0, 0, 0, span, true, 0});
      list.back().sent += t.sent;
      list.back().recv += t.recv;
      list.back().calls += t.calls;
      list.back().seconds += x_in;
    }
  }

  // ---- the rest of a transformer layer -----------------------------------------------------

  void model_layers() {
    if (w_.attention_only) return;
    const double h = static_cast<double>(w_.hidden), f = static_cast<double>(w_.ffn_dim);
    const int tp = m_.mesh.tp;
    for (int r = 0; r < N_; ++r) {
      RankCost& rc = cost_.ranks[r];
      double tokens = static_cast<double>(rc.tokens), fixed = 0, per_token = 0, reduce_rows = 0;
      int reduces = 2;
      double extra_attention = 0;
      switch (w_.family) {
        case ModelFamily::kDiT:
          per_token = (12 * h * h + 4 * h * f) / tp;
          fixed = 4 * h * h * w_.cross_tokens / tp;  // text K, V projections of cross-attention
          extra_attention = flops_of(B_ * H_ * rc.tokens * w_.cross_tokens);
          reduce_rows = tokens;
          reduces = 3;
          break;
        case ModelFamily::kMMDiT:
          per_token = (8 * h * h + 4 * h * f) / tp;
          tokens += static_cast<double>(w_.text_tokens);  // the text stream, replicated
          reduce_rows = tokens;
          break;
        case ModelFamily::kLlm:
          per_token = (4 * h * h + 4 * h * w_.kv_heads * w_.head_dim + 6 * h * f) / tp;
          reduce_rows = tokens;
          break;
      }
      rc.linear_flops = B_ * (tokens * per_token + fixed);
      rc.attention_flops += extra_attention;
      compute(r, rc.linear_flops / gemm_rate() + extra_attention / attn_rate());
      if (tp > 1) {
        const double n = B_ * reduce_rows * h * e_;  // bytes of one all-reduce
        const uint64_t acc = static_cast<uint64_t>(n) * (tp - 1) * reduces;
        // Ring all-reduce on the wire: 2(tp-1) steps of n/tp bytes. The tp group's members
        // are sp() ranks apart.
        const bool span = node_of(hw_, 0) != node_of(hw_, (tp - 1) * N_);
        const double secs =
            reduces * (2.0 * (tp - 1) * alpha(span) + 2.0 * n * (tp - 1) / tp / bw(span));
        t_[r] += secs;
        collectives_[r].push_back({"all_reduce", "row-parallel outputs", "tp", acc, acc,
                                   int64_t{reduces}, span, false, secs});
        if (r == 0) cost_.tp_bytes = acc;
      }
    }
  }

  // ---- results ------------------------------------------------------------------------------

  void finish() {
    int crit = 0;
    int64_t max_work = 0, sum_work = 0;
    for (int r = 0; r < N_; ++r) {
      cost_.ranks[r].finish_s = t_[r];
      if (t_[r] > t_[crit]) crit = r;
      // What the rank computes: CpStats' count plus the work every rank repeats (joint
      // attention's text over text, counted on rank 0 only).
      int64_t work = 0;
      for (const Step& st : schedule_.ranks[r].steps) work += st.work;
      max_work = std::max(max_work, work);
      sum_work += work;
    }
    cost_.critical_rank = crit;
    cost_.collectives = collectives_[crit];
    cost_.layer_s = t_[crit];
    cost_.compute_s = cost_.ranks[crit].compute_s;
    cost_.exposed_comm_s = std::max(0.0, cost_.layer_s - cost_.compute_s);
    for (const auto& c : cost_.collectives) cost_.comm_s += c.seconds;
    cost_.step_s = cost_.layer_s * (w_.attention_only ? 1 : w_.layers);
    cost_.work_imbalance = sum_work > 0 ? max_work / (static_cast<double>(sum_work) / N_) : 1.0;
  }

  void memory() {
    double worst_act = 0, worst_kv = 0;
    for (int r = 0; r < N_; ++r) {
      const RankCost& rc = cost_.ranks[r];
      const double tokens =
          static_cast<double>(rc.tokens) + (w_.family == ModelFamily::kMMDiT ? w_.text_tokens : 0);
      double act;
      if (w_.attention_only) {
        act = B_ * (rc.tokens * (H_ + 2.0 * Hkv_) * D_ * e_ + rc.tokens * H_ * (D_ + 1) * 4.0);
      } else {
        act = B_ * tokens * e_ *
                  (4.0 * w_.hidden + (H_ + 2.0 * Hkv_) * D_ +
                   static_cast<double>(w_.ffn_dim) / m_.mesh.tp) +
              B_ * rc.tokens * H_ * (D_ + 1) * 4.0;
      }
      act += rc.peak_kv_bytes;
      worst_act = std::max(worst_act, act);
      if (!w_.attention_only && w_.family == ModelFamily::kLlm)
        worst_kv = std::max(worst_kv, static_cast<double>(w_.layers) * 2 * B_ *
                                          schedule_.ranks[r].kv_tokens * Hkv_ * D_ * e_);
    }
    cost_.weight_bytes = w_.attention_only ? 0 : static_cast<double>(w_.params) * e_ / m_.mesh.tp;
    cost_.kv_cache_bytes = worst_kv;
    cost_.activation_bytes = worst_act;
    cost_.memory_bytes = cost_.weight_bytes + cost_.kv_cache_bytes + cost_.activation_bytes;
    cost_.memory_limit =
        memory_limit_ > 0 ? memory_limit_ : rank_memory_bytes(hw_, ranks_on_node(hw_, m_.world()));
    cost_.fits_memory = cost_.memory_limit <= 0 || cost_.memory_bytes <= cost_.memory_limit;
  }

  const Workload& w_;
  const ParallelConfig& m_;
  const HardwareProfile& hw_;
  double memory_limit_;
  int N_ = 1;
  int64_t B_ = 1, H_ = 1, Hkv_ = 1, D_ = 1;
  size_t e_ = 2;
  double attn_rate_ = 1, gemm_rate_ = 1;
  AttnShape shape_;
  Schedule schedule_;
  std::vector<size_t> pc_;  // per rank, its next step in the replay
  std::vector<std::vector<CollectiveCost>> collectives_;
  std::vector<double> t_;
  MeshCost cost_;
};

}  // namespace

void check_mesh_degrees(const Workload& w, int cfg, int tp) {
  SEQPAR_PARAM_CHECK(cfg == 1 || cfg == w.cfg_branches, "cfg", w.cfg_branches == 1 ? "1" : "1 or 2",
                     param("cfg"), " ", cfg, " needs ", cfg, " guidance branches; ", w.model,
                     " runs ", w.cfg_branches, " (", param("cfg"),
                     w.cfg_branches == 1 ? " 1 only)" : " 1 or 2)");
  SEQPAR_PARAM_CHECK(tp == 1 || !w.attention_only, "tp", "1", param("tp"), " ", tp,
                     ": a bare attention call (", param("seq"), " and ", param("heads"),
                     " without a model) plans sequence parallelism only; use ", param("tp"), " 1");
  ParallelConfig c;  // the degrees alone: one sequence-parallel rank
  c.mesh.cfg = cfg;
  c.mesh.tp = tp;
  c.strategy = Strategy::kLocal;
  AttnShape s = workload_shape(w);
  s.text_tokens = 0;
  s.causal = false;
  validate_config(c, s);
}

MeshCost cost_mesh(const Workload& w, const ParallelConfig& m, const HardwareProfile& hw,
                   double memory_limit) {
  return MeshModel(w, m, hw, memory_limit).run();
}

}  // namespace seqpar
