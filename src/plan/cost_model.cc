// The cost model of one mesh: per-rank bytes (parallel/'s predictions, split into the
// collectives that carry them), work (position runs), memory, and a replay of one layer's
// schedule on the profile's two-level alpha-beta network.
#include "seqpar/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"

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
  const int64_t s = checked_add(w.seq, w.text_tokens, "tokens (seq + text_tokens)");
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

int64_t ulysses_member_kernel_kv_heads(int64_t heads, int64_t kv_heads, int n, int j) {
  // The kernel reads local kv head i / (|q| / |kv|) for local query head i; that must be the kv
  // head h / (H / Hkv) of every global query head h, else K/V are expanded to one per query head.
  const IndexRange q = ulysses_q_heads(heads, n, j), kv = ulysses_kv_heads(heads, kv_heads, n, j);
  const int64_t group = heads / kv_heads;
  bool standard = kv.size() > 0 && q.size() % kv.size() == 0;
  for (int64_t i = 0; standard && i < q.size(); ++i)
    standard = (q.begin + i) / group - kv.begin == i / (q.size() / kv.size());
  return standard ? kv.size() : q.size();
}

PassChoice choose_pass_all2all(int64_t new_tokens, int64_t cached_tokens, int ranks, int64_t heads,
                               int64_t kv_heads, size_t elem_bytes, double flops_per_s,
                               double bytes_per_s) {
  PassChoice c;
  const double n = ranks, e = static_cast<double>(elem_bytes);
  c.threshold_tokens = n * flops_per_s * kv_heads * e / (2.0 * heads * bytes_per_s);
  c.miss_rate = static_cast<double>(new_tokens) / static_cast<double>(new_tokens + cached_tokens);
  c.miss_threshold =
      2.0 * kv_heads / heads - 4.0 * new_tokens * bytes_per_s / (n * flops_per_s * e);
  char buf[320];
  if (new_tokens >= c.threshold_tokens) {
    c.kind = Strategy::kPassKv;
    std::snprintf(buf, sizeof buf, "passkv: T = %lld new tokens >= N*C*Hkv*e/(2*H*BW) = %.0f",
                  static_cast<long long>(new_tokens), c.threshold_tokens);
  } else if (c.miss_rate >= c.miss_threshold) {
    c.kind = Strategy::kPassKv;
    std::snprintf(buf, sizeof buf,
                  "passkv: T/(T+P) = %.4f >= 2*Hkv/H - 4*T*BW/(N*C*e) = %.4f (pass-Q's "
                  "all-to-all would cost more)",
                  c.miss_rate, c.miss_threshold);
  } else {
    c.kind = Strategy::kPassQ;
    std::snprintf(buf, sizeof buf,
                  "passq: T = %lld < %.0f tokens and T/(T+P) = %.4f < 2*Hkv/H - "
                  "4*T*BW/(N*C*e) = %.4f",
                  static_cast<long long>(new_tokens), c.threshold_tokens, c.miss_rate,
                  c.miss_threshold);
  }
  c.reason = buf;
  return c;
}

namespace {

constexpr double kLseBytes = 4;  // fp32

int64_t cap64(int64_t bytes) {
  return bytes <= 0 ? 0 : std::max<int64_t>(64, (bytes + 63) / 64 * 64);
}

// Everything one mesh's cost needs, resolved once.
class MeshModel {
 public:
  MeshModel(const Workload& w, const ParallelConfig& m, const HardwareProfile& hw, double memory_limit)
      : w_(w), m_(m), hw_(hw), memory_limit_(memory_limit) {}

  MeshCost run() {
    validate();
    place_tokens();
    cost_.config = m_;
    cost_.seq = w_.seq;
    cost_.padded_seq = S_;
    cost_.remainder = w_.seq % N_;
    cost_.ranks.assign(N_, RankCost{});
    collectives_.assign(N_, {});
    t_.assign(N_, 0.0);
    for (int r = 0; r < N_; ++r) cost_.ranks[r].tokens = run_count(q_runs_[r]);
    attention();
    model_layers();
    check_bytes();
    finish();
    memory();
    return cost_;
  }

 private:
  // ---- validation and placement ----------------------------------------------------------

  void validate() {
    const ParallelConfig& m = m_;
    SEQPAR_ARG_CHECK(m.mesh.cfg >= 1 && m.mesh.tp >= 1 && m.mesh.ulysses >= 1 && m.mesh.ring >= 1,
                     "degrees must be at least 1");
    N_ = m.sp();
    U_ = m.mesh.ulysses;
    R_ = m.mesh.ring;
    SEQPAR_ARG_CHECK(w_.heads >= 1 && w_.kv_heads >= 1 && w_.heads % w_.kv_heads == 0 &&
                         w_.head_dim >= 1 && w_.batch >= 1 && w_.seq >= 1,
                     "the workload needs heads divisible by kv heads, head_dim, batch and tokens");
    check_mesh_degrees(w_, m.mesh.cfg, m.mesh.tp);
    H_ = w_.heads / m.mesh.tp;
    Hkv_ = std::max<int64_t>(1, w_.kv_heads / m.mesh.tp);  // replicated when tp > kv heads
    D_ = w_.head_dim;
    e_ = dtype_size(w_.dtype);
    B_ = w_.batch * (w_.cfg_branches / m.mesh.cfg);
    const bool decode = w_.decode();
    const Strategy s = m.strategy;
    if (N_ == 1) {
      SEQPAR_ARG_CHECK(s == Strategy::kLocal, "one sequence-parallel rank: strategy local only");
    } else {
      SEQPAR_ARG_CHECK(s != Strategy::kLocal, "strategy local needs a sequence-parallel size of 1");
    }
    if (decode) {
      SEQPAR_ARG_CHECK(s == Strategy::kLocal || s == Strategy::kPassKv || s == Strategy::kPassQ,
                       strategy_name(s),
                       " does not run over a K/V cache (cached, new); valid: ", "passkv, passq");
      SEQPAR_ARG_CHECK(!m.pad, "a K/V cache (cached, new) is not padded");
      SEQPAR_ARG_CHECK(w_.text_tokens == 0, "a K/V cache (cached, new) takes no text tokens");
    } else {
      SEQPAR_ARG_CHECK(s != Strategy::kPassKv && s != Strategy::kPassQ, strategy_name(s),
                       " runs over a K/V cache: give cached and new token counts");
    }
    if (s == Strategy::kAllGather || s == Strategy::kRing || s == Strategy::kPassKv ||
        s == Strategy::kPassQ)
      SEQPAR_ARG_CHECK(U_ == 1, strategy_name(s), " takes no ulysses degree; use usp");
    if (s == Strategy::kUlysses)
      SEQPAR_ARG_CHECK(R_ == 1, "ulysses uses the whole sequence-parallel group; ring ", R_,
                       " needs usp");
    if (s == Strategy::kUsp)
      SEQPAR_ARG_CHECK(U_ > 1 && R_ > 1, "usp needs a ulysses degree and a ring degree above 1");
    SEQPAR_ARG_CHECK(w_.text_tokens == 0 || !w_.causal,
                     "joint attention (text tokens) is bidirectional; not causal");
  }

  void place_tokens() {
    const int n = N_;
    if (w_.decode()) {
      SEQPAR_ARG_CHECK(w_.cached >= n, "cached ", w_.cached, " is too small: each of the ", n,
                       " sequence-parallel ranks needs at least one cached token");
      S_ = w_.seq;
      place_ = decode_placement(w_.cached, w_.fresh, n, m_.layout);
      int64_t next = w_.cached;
      for (int r = 0; r < n; ++r) {
        const int64_t share = static_cast<int64_t>(place_.q_pos[r].size());
        PositionRuns kv = layout_runs(w_.cached, n, m_.layout, r);
        PositionRuns q = range_runs(next, next + share);
        kv.insert(kv.end(), q.begin(), q.end());
        q_runs_.push_back(q);
        kv_runs_.push_back(kv);
        next += share;
      }
      return;
    }
    S_ = w_.seq;
    SEQPAR_ARG_CHECK(n <= w_.seq, n, " sequence-parallel ranks exceed the ", w_.seq,
                     " tokens; every rank needs a real token (padding would leave some with ",
                     "padding only): at most ", w_.seq);
    if (m_.pad) {
      const int64_t mult = m_.layout == Layout::kZigzag ? 2 * int64_t{n} : n;
      S_ = (w_.seq + mult - 1) / mult * mult;
      if (S_ != w_.seq) valid_len_ = w_.seq;
    }
    SEQPAR_ARG_CHECK(n <= S_, n, " sequence-parallel ranks exceed the ", S_,
                     " tokens; every rank needs a token: at most ", S_);
    part_ = Partition(S_, n, m_.layout);
    for (int r = 0; r < n; ++r) {
      q_runs_.push_back(layout_runs(S_, n, m_.layout, r));
      kv_runs_.push_back(q_runs_.back());
    }
    if (m_.strategy == Strategy::kUlysses || m_.strategy == Strategy::kUsp) {
      CpOptions opts;
      opts.ulysses_mode = m_.ulysses_mode;
      check_strategy_shape(m_.strategy == Strategy::kUlysses ? Strategy::kUlysses : Strategy::kUsp,
                           part_, H_, Hkv_, U_, opts);
    }
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
  double attn_rate() const { return rank_attention_flops(hw_, ranks_on_node(hw_, m_.world())); }
  double gemm_rate() const { return rank_gemm_flops(hw_, ranks_on_node(hw_, m_.world())); }
  double flops_of(int64_t score_elements) const {
    return 4.0 * D_ * static_cast<double>(score_elements);
  }

  std::vector<int> sp_group() const {
    std::vector<int> g(N_);
    std::iota(g.begin(), g.end(), 0);
    return g;
  }

  // Adds a collective to every member's list and advances the members' clocks together: it
  // starts when the last member arrives and ends when the slowest member's transfers end.
  // per_member[i] = {sent, recv, intra_bytes, inter_bytes} of member i.
  struct Share {
    uint64_t sent = 0, recv = 0;
    double intra = 0, inter = 0;  // bytes this member moves over each kind of link
  };
  void collective(const std::vector<int>& members, const std::string& op, const std::string& what,
                  const std::string& group, const std::vector<Share>& shares, bool ring_algorithm,
                  int64_t calls = 1) {
    const bool span = spans(members);
    const int n = static_cast<int>(members.size());
    double start = 0, dur = 0;
    for (int x : members) start = std::max(start, t_[x]);
    for (int i = 0; i < n; ++i) {
      double d;
      if (ring_algorithm) {  // all_gather: every link of the ring carries what a member receives
        d = (n - 1) * alpha(span) + static_cast<double>(shares[i].recv) / bw(span);
      } else {  // all_to_all: the two kinds of links in parallel
        d = (n - 1) * alpha(span) +
            std::max(shares[i].intra / hw_.intra_node_bw, shares[i].inter / hw_.inter_node_bw);
      }
      dur = std::max(dur, d * calls);
    }
    for (int i = 0; i < n; ++i) {
      const int x = members[i];
      t_[x] = start + dur;
      CollectiveCost c{op, what, group, shares[i].sent, shares[i].recv, calls, span, false, dur};
      collectives_[x].push_back(c);
    }
  }

  void compute(int r, double seconds) {
    t_[r] += seconds;
    cost_.ranks[r].compute_s += seconds;
  }

  // Ring over `members` (ring order); member i holds block i; at step s it computes on block
  // (i - s) and receives block (i - s - 1) of `block_bytes[]` from member i-1.
  // step_compute(i, s) is the compute of member i at step s.
  template <typename StepCompute>
  void ring_steps(const std::vector<int>& members, const std::vector<int64_t>& block_bytes,
                  const std::string& what, const std::string& group, StepCompute&& step_compute) {
    const int n = static_cast<int>(members.size());
    const bool span = spans(members);
    std::vector<double> xfer(n, 0);  // per member, total transfer seconds
    std::vector<uint64_t> sent(n, 0), recv(n, 0);
    std::vector<double> start(n);
    for (int s = 0; s < n; ++s) {
      for (int i = 0; i < n; ++i) start[i] = t_[members[i]];
      for (int i = 0; i < n; ++i) {
        const int x = members[i];
        const int prev = (i + n - 1) % n, next = (i + 1) % n;
        const double c = step_compute(i, s);
        cost_.ranks[x].compute_s += c;
        double end = start[i] + c;
        if (s + 1 < n) {
          const int incoming = ((i - s - 1) % n + n) % n;
          const int outgoing = ((i - s) % n + n) % n;
          const bool in_inter = inter(members[prev], x), out_inter = inter(x, members[next]);
          const double x_in = alpha(in_inter) + block_bytes[incoming] / bw(in_inter);
          const double x_out = alpha(out_inter) + block_bytes[outgoing] / bw(out_inter);
          // The transfer starts when both ends have posted (rendezvous); what cannot overlap
          // with compute (1 - overlap) is paid by this rank's thread.
          const double recv_done = std::max(start[prev], start[i]) + x_in;
          const double send_done = std::max(start[i], start[next]) + x_out;
          end = std::max({start[i] + c + (1 - hw_.overlap) * x_in, recv_done, send_done});
          xfer[i] += x_in;
          sent[i] += block_bytes[outgoing];
          recv[i] += block_bytes[incoming];
        }
        t_[x] = end;
      }
    }
    for (int i = 0; i < n; ++i) {
      CollectiveCost c{"send_recv",        what, group, sent[i], recv[i],
                       2 * int64_t{n - 1}, span, true,  xfer[i]};
      collectives_[members[i]].push_back(c);
    }
  }

  // ---- attention ----------------------------------------------------------------------------

  int64_t visible(const PositionRuns& q, const PositionRuns& k) const {
    return visible_pairs(q, k, w_.causal, valid_len_);
  }
  bool hidden(const PositionRuns& q, const PositionRuns& k) const {
    // ring's fully_hidden: no keys, all padding, or causal with every key after every query.
    if (run_count(q) == 0 || run_count(k) == 0) return true;
    if (valid_len_ > 0 && run_min(k) >= valid_len_) return true;
    return w_.causal && run_min(k) > run_max(q);
  }
  double merge_s(int64_t rows, int64_t heads) const {
    return copy_s(3.0 * static_cast<double>(B_) * rows * heads * (D_ + 1) * 4);
  }

  void attention() {
    switch (m_.strategy) {
      case Strategy::kLocal:
        local();
        break;
      case Strategy::kAllGather:
        allgather();
        break;
      case Strategy::kRing:
        ring(kv_runs_, Strategy::kRing);
        break;
      case Strategy::kPassKv:
        ring(kv_runs_, Strategy::kPassKv);
        break;
      case Strategy::kUlysses:
      case Strategy::kUsp:
        ulysses();
        break;
      case Strategy::kPassQ:
        passq();
        break;
    }
    if (w_.text_tokens > 0) joint_text();
  }

  void local() {
    const int64_t work = B_ * H_ * visible(q_runs_[0], kv_runs_[0]);
    cost_.ranks[0].work = work;
    cost_.ranks[0].peak_kv_bytes = 2 * B_ * run_count(kv_runs_[0]) * Hkv_ * D_ * e_;
    cost_.ranks[0].attention_flops += flops_of(work);
    compute(0, flops_of(work) / attn_rate());
  }

  void allgather() {
    const uint64_t tk = B_ * Hkv_ * D_ * e_;  // one of K or V, per token
    PositionRuns all;
    for (const auto& r : kv_runs_) all.insert(all.end(), r.begin(), r.end());
    std::vector<Share> shares(N_);
    for (int r = 0; r < N_; ++r) {
      const int64_t n_r = run_count(kv_runs_[r]);
      shares[r].sent = tk * n_r * (N_ - 1);
      shares[r].recv = tk * (S_ - n_r);
    }
    const auto g = sp_group();
    collective(g, "all_gatherv", "k", "sp", shares, true);
    collective(g, "all_gatherv", "v", "sp", shares, true);
    for (int r = 0; r < N_; ++r) {
      const int64_t work = B_ * H_ * visible(q_runs_[r], all);
      cost_.ranks[r].work = work;
      cost_.ranks[r].peak_kv_bytes = 2 * B_ * S_ * Hkv_ * D_ * e_;
      cost_.ranks[r].attention_flops += flops_of(work);
      const double regroup = B_ > 1 ? copy_s(2.0 * shares[r].recv) : 0;
      compute(r, flops_of(work) / attn_rate() + regroup);
    }
  }

  // Ring (pass-KV) over the sp group with K/V blocks kv[r] and this rank's queries q_runs_[r].
  void ring(const std::vector<PositionRuns>& kv, Strategy scheme) {
    const int n = N_;
    const int64_t tok = 2 * B_ * Hkv_ * D_ * e_;  // K and V of a token
    std::vector<int64_t> block_bytes(n), len(n);
    for (int i = 0; i < n; ++i) {
      len[i] = run_count(kv[i]);
      block_bytes[i] = tok * len[i];
    }
    std::vector<int> visible_blocks(n, 0);
    ring_steps(sp_group(), block_bytes, "k, v", "sp", [&](int i, int s) {
      const int src = ((i - s) % n + n) % n;
      if (hidden(q_runs_[i], kv[src])) return 0.0;
      const int64_t work = B_ * H_ * visible(q_runs_[i], kv[src]);
      cost_.ranks[i].work += work;
      cost_.ranks[i].attention_flops += flops_of(work);
      const double merge = visible_blocks[i]++ > 0 ? merge_s(cost_.ranks[i].tokens, H_) : 0;
      return flops_of(work) / attn_rate() + merge;
    });
    for (int r = 0; r < n; ++r)
      cost_.ranks[r].peak_kv_bytes = ring_peak_kv(len, r, B_ * Hkv_ * D_ * e_);
    (void)scheme;
  }

  // What ring_over_blocks holds: the own block plus two receive buffers (K and V each), buffer
  // i refilled at steps s = i (mod 2), s < n-1, to the largest block it received (capacity).
  static int64_t ring_peak_kv(const std::vector<int64_t>& len, int r, int64_t token_bytes) {
    const int n = static_cast<int>(len.size());
    int64_t buf[2] = {0, 0};
    for (int s = 0; s + 1 < n; ++s) {
      const int incoming = ((r - s - 1) % n + n) % n;
      buf[s % 2] = std::max(buf[s % 2], len[incoming] * token_bytes);
    }
    return 2 * len[r] * token_bytes + 2 * (cap64(buf[0]) + cap64(buf[1]));
  }

  void ulysses() {
    const int u = U_, groups = R_;
    std::vector<IndexRange> qh(u), kvh(u);
    std::vector<int64_t> kvk(u);
    for (int j = 0; j < u; ++j) {
      qh[j] = ulysses_q_heads(H_, u, j);
      kvh[j] = ulysses_kv_heads(H_, Hkv_, u, j);
      kvk[j] = ulysses_member_kernel_kv_heads(H_, Hkv_, u, j);
    }
    std::vector<PositionRuns> group_runs(groups);
    std::vector<int64_t> group_len(groups, 0);
    for (int r = 0; r < N_; ++r) {
      auto& g = group_runs[r / u];
      g.insert(g.end(), q_runs_[r].begin(), q_runs_[r].end());
      group_len[r / u] += run_count(q_runs_[r]);
    }
    const double e = static_cast<double>(e_);
    // Steps 0 and 1: token counts, then q, k, v sequence -> heads, inside each Ulysses group.
    for (int g = 0; g < groups; ++g) {
      std::vector<int> members(u);
      for (int j = 0; j < u; ++j) members[j] = g * u + j;
      auto counts = [&](int j) { return cost_.ranks[members[j]].tokens; };
      auto exchange = [&](const std::string& what, auto&& sent_to, auto&& recv_from, bool lse) {
        std::vector<Share> sh(u);
        for (int me = 0; me < u; ++me)
          for (int j = 0; j < u; ++j) {
            if (j == me) continue;
            const uint64_t s = sent_to(me, j), rv = recv_from(me, j);
            sh[me].sent += s;
            sh[me].recv += rv;
            const bool x = inter(members[me], members[j]);
            (x ? sh[me].inter : sh[me].intra) += std::max(s, rv);
          }
        (void)lse;
        collective(members, "all_to_allv", what, "ulysses", sh, false);
      };
      std::vector<Share> cnt(u);
      for (int j = 0; j < u; ++j) cnt[j].sent = cnt[j].recv = 8ull * (u - 1);
      for (int j = 0; j < u; ++j) cnt[j].intra = 8.0 * (u - 1);
      collective(members, "all_gather", "token counts", "ulysses", cnt, true);
      auto to_heads = [&](const std::string& what, const std::vector<IndexRange>& heads) {
        exchange(
            what,
            [&](int me, int j) {
              return static_cast<uint64_t>(B_ * counts(me) * heads[j].size() * D_ * e);
            },
            [&](int me, int j) {
              return static_cast<uint64_t>(B_ * counts(j) * heads[me].size() * D_ * e);
            },
            false);
      };
      to_heads("q", qh);
      to_heads("k", kvh);
      to_heads("v", kvh);
      // Local copies: packing the sends, placing the receives.
      for (int j = 0; j < u; ++j) {
        const int x = members[j];
        double bytes = 0;
        for (const auto& c : collectives_[x])
          if (c.op == "all_to_allv") bytes += c.sent + c.recv;
        compute(x, copy_s(bytes));
      }
    }
    // Step 2: attention of the local heads over the whole sequence (ulysses) or the ring of the
    // groups' sequences (usp).
    if (groups == 1) {
      PositionRuns all = group_runs[0];
      for (int j = 0; j < u; ++j) {
        const int64_t work = B_ * qh[j].size() * visible(all, all);
        cost_.ranks[j].work = work;
        cost_.ranks[j].attention_flops += flops_of(work);
        cost_.ranks[j].peak_kv_bytes = 2 * B_ * S_ * (qh[j].size() > 0 ? kvk[j] : 0) * D_ * e_;
        compute(j, flops_of(work) / attn_rate());
      }
    } else {
      for (int j = 0; j < u; ++j) {
        std::vector<int> members(groups);
        for (int g = 0; g < groups; ++g) members[g] = g * u + j;
        if (qh[j].size() == 0) continue;  // idle member: no kernel, no ring
        const int64_t tok = 2 * B_ * kvk[j] * D_ * e_;
        std::vector<int64_t> block_bytes(groups);
        for (int g = 0; g < groups; ++g) block_bytes[g] = tok * group_len[g];
        std::vector<int> visible_blocks(groups, 0);
        ring_steps(members, block_bytes, "k, v", "ring", [&](int i, int s) {
          const int src = ((i - s) % groups + groups) % groups;
          if (hidden(group_runs[i], group_runs[src])) return 0.0;
          const int64_t work = B_ * qh[j].size() * visible(group_runs[i], group_runs[src]);
          const int x = members[i];
          cost_.ranks[x].work += work;
          cost_.ranks[x].attention_flops += flops_of(work);
          const double merge = visible_blocks[i]++ > 0 ? merge_s(group_len[i], qh[j].size()) : 0;
          return flops_of(work) / attn_rate() + merge;
        });
        for (int g = 0; g < groups; ++g)
          cost_.ranks[members[g]].peak_kv_bytes = ring_peak_kv(group_len, g, B_ * kvk[j] * D_ * e_);
      }
    }
    // Step 3: out and lse (fp32) heads -> sequence.
    for (int g = 0; g < groups; ++g) {
      std::vector<int> members(u);
      for (int j = 0; j < u; ++j) members[j] = g * u + j;
      std::vector<Share> sh(u);
      for (int me = 0; me < u; ++me)
        for (int j = 0; j < u; ++j) {
          if (j == me) continue;
          const uint64_t s = B_ * cost_.ranks[members[j]].tokens * qh[me].size() * (D_ + 1) * 4;
          const uint64_t rv = B_ * cost_.ranks[members[me]].tokens * qh[j].size() * (D_ + 1) * 4;
          sh[me].sent += s;
          sh[me].recv += rv;
          (inter(members[me], members[j]) ? sh[me].inter : sh[me].intra) += std::max(s, rv);
        }
      collective(members, "all_to_allv", "out, lse", "ulysses", sh, false);
      for (int j = 0; j < u; ++j) compute(members[j], copy_s(sh[j].sent + sh[j].recv));
    }
  }

  void passq() {
    const int n = N_;
    const double e = static_cast<double>(e_);
    int64_t total = 0;
    PositionRuns all_q;
    for (int r = 0; r < n; ++r) {
      total += cost_.ranks[r].tokens;
      all_q.insert(all_q.end(), q_runs_[r].begin(), q_runs_[r].end());
    }
    std::vector<Share> gather(n), back(n);
    for (int r = 0; r < n; ++r) {
      const int64_t mine = cost_.ranks[r].tokens;
      gather[r].sent = static_cast<uint64_t>(B_ * mine * H_ * D_ * e) * (n - 1);
      gather[r].recv = static_cast<uint64_t>(B_ * (total - mine) * H_ * D_ * e);
      back[r].sent = static_cast<uint64_t>(B_ * (total - mine) * H_ * (D_ + 1) * 4);
      back[r].recv = static_cast<uint64_t>(B_ * mine * H_ * (D_ + 1) * 4) * (n - 1);
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        const double bytes = B_ * static_cast<double>(cost_.ranks[j].tokens) * H_ * (D_ + 1) * 4;
        (inter(r, j) ? back[r].inter : back[r].intra) += bytes;
      }
    }
    const auto g = sp_group();
    collective(g, "all_gatherv", "q", "sp", gather, true);
    for (int r = 0; r < n; ++r) {
      const int64_t work = B_ * H_ * visible(all_q, kv_runs_[r]);
      cost_.ranks[r].work = work;
      cost_.ranks[r].attention_flops += flops_of(work);
      cost_.ranks[r].peak_kv_bytes = 2 * B_ * run_count(kv_runs_[r]) * Hkv_ * D_ * e_;
      compute(r, flops_of(work) / attn_rate());
    }
    collective(g, "all_to_allv", "partial out, lse", "sp", back, false);
    for (int r = 0; r < n; ++r) compute(r, n * merge_s(cost_.ranks[r].tokens, H_));
  }

  // Joint attention's text part: image queries over the text keys, text queries over the local
  // image shard, all_gather of the text partials, text over text (on every rank).
  void joint_text() {
    const int64_t T = w_.text_tokens;
    std::vector<Share> sh(N_);
    for (int r = 0; r < N_; ++r)
      sh[r].sent = sh[r].recv = static_cast<uint64_t>(B_ * T * H_ * (D_ + 1) * 4) * (N_ - 1);
    for (int r = 0; r < N_; ++r) {
      const int64_t n_r = cost_.ranks[r].tokens;
      const int64_t work = B_ * H_ * (2 * n_r * T + T * T);
      cost_.ranks[r].attention_flops += flops_of(work);
      compute(r, flops_of(work) / attn_rate() + merge_s(n_r, H_));
    }
    collective(sp_group(), "all_gather", "text partials", "sp", sh, true);
    for (int r = 0; r < N_; ++r) compute(r, N_ * merge_s(T, H_));
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

  // The collectives' attention bytes must be what parallel/ predicts (and CommStats measures).
  void check_bytes() {
    for (int r = 0; r < N_; ++r) {
      uint64_t sent = 0, recv = 0;
      for (const auto& c : collectives_[r])
        if (c.group != "tp") {
          sent += c.sent;
          recv += c.recv;
        }
      CommPrediction p;
      if (w_.decode()) {
        if (m_.strategy != Strategy::kLocal)
          p = predict_decode_bytes(
              m_.strategy == Strategy::kPassQ ? Strategy::kPassQ : Strategy::kPassKv, place_, r, B_, H_,
              Hkv_, D_, e_);
      } else if (m_.strategy != Strategy::kLocal) {
        const Strategy st = m_.strategy == Strategy::kAllGather ? Strategy::kAllGather
                            : m_.strategy == Strategy::kRing    ? Strategy::kRing
                            : m_.strategy == Strategy::kUlysses ? Strategy::kUlysses
                                                            : Strategy::kUsp;
        p = predict_comm_bytes(st, part_, r, B_, H_, Hkv_, D_, e_, U_, w_.text_tokens);
      }
      SEQPAR_CHECK(sent == p.sent && recv == p.recv, "cost model collectives of rank ", r, " (",
                   config_label(m_), ") add up to ", sent, "/", recv, " bytes, parallel/ predicts ",
                   p.sent, "/", p.recv);
      cost_.ranks[r].sent = p.sent;
      cost_.ranks[r].recv = p.recv;
    }
  }

  void finish() {
    int crit = 0;
    int64_t max_work = 0, sum_work = 0;
    for (int r = 0; r < N_; ++r) {
      cost_.ranks[r].finish_s = t_[r];
      if (t_[r] > t_[crit]) crit = r;
      max_work = std::max(max_work, cost_.ranks[r].work);
      sum_work += cost_.ranks[r].work;
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
                                          run_count(kv_runs_[r]) * Hkv_ * D_ * e_);
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
  int N_ = 1, U_ = 1, R_ = 1;
  int64_t S_ = 0, valid_len_ = 0, B_ = 1, H_ = 1, Hkv_ = 1, D_ = 1;
  size_t e_ = 2;
  Partition part_;
  KvPlacement place_;
  std::vector<PositionRuns> q_runs_, kv_runs_;
  std::vector<std::vector<CollectiveCost>> collectives_;
  std::vector<double> t_;
  MeshCost cost_;
};

}  // namespace

void check_mesh_degrees(const Workload& w, int cfg, int tp) {
  SEQPAR_ARG_CHECK(cfg == 1 || cfg == w.cfg_branches, "cfg ", cfg, " needs ", cfg,
                   " guidance branches; ", w.model, " runs ", w.cfg_branches,
                   w.cfg_branches == 1 ? " (cfg 1 only)" : " (cfg 1 or 2)");
  SEQPAR_ARG_CHECK(tp == 1 || !w.attention_only, "tp ", tp,
                   ": a bare attention call (seq and heads without a model) plans sequence "
                   "parallelism only; use tp 1");
  SEQPAR_ARG_CHECK(w.heads % tp == 0, "tp ", tp, " does not divide the ", w.heads,
                   " heads; valid tp: ", divisors_text(w.heads));
  SEQPAR_ARG_CHECK(w.kv_heads % tp == 0 || tp % w.kv_heads == 0, "tp ", tp,
                   " neither divides nor is a multiple of the ", w.kv_heads, " kv heads");
}

MeshCost cost_mesh(const Workload& w, const ParallelConfig& m, const HardwareProfile& hw,
                   double memory_limit) {
  return MeshModel(w, m, hw, memory_limit).run();
}

}  // namespace seqpar
