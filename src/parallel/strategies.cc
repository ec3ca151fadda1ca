#include "seqpar/parallel/strategies.h"

#include <numeric>

#include "schedule_build.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/strategy_table.h"
#include "strategy_common.h"

namespace seqpar {

void check_softmax_mode(Strategy strategy, const CpOptions& opts) {
  SEQPAR_PARAM_CHECK(opts.softmax == SoftmaxMode::kOnline || has_ring(strategy), "softmax",
                     "online", param("softmax"), " 'const-max' needs a ring: valid with ",
                     param("strategy"), " 'ring' or 'usp' (its ring part), not '",
                     strategy_name(strategy), "'");
}

// ---- communicators -------------------------------------------------------------------------

SpComms::SpComms(Communicator& sp, int ulysses_degree)
    : sp_(sp), ulysses_degree_(ulysses_degree == 0 ? sp.size() : ulysses_degree) {
  const int n = sp.size();
  SEQPAR_PARAM_CHECK(ulysses_degree_ >= 1 && n % ulysses_degree_ == 0, "ulysses_degree",
                     divisors_text(n), param("ulysses_degree"), " ", ulysses_degree_,
                     " does not divide the ", n, " ranks; valid: ", divisors_text(n));
  if (ulysses_degree_ != n) ulysses_ = sp.split(sp.rank() / ulysses_degree_, sp.rank());
  if (ulysses_degree_ != 1) ring_ = sp.split(sp.rank() % ulysses_degree_, sp.rank());
}

Communicator& SpComms::ulysses() { return ulysses_ ? *ulysses_ : sp_; }
Communicator& SpComms::ring() { return ring_ ? *ring_ : sp_; }

CommStats SpComms::stats() const {
  CommStats s = sp_.stats();
  if (ulysses_) s += ulysses_->stats();
  if (ring_) s += ring_->stats();
  return s;
}

void SpComms::reset_stats() {
  sp_.stats().reset();
  if (ulysses_) ulysses_->stats().reset();
  if (ring_) ring_->stats().reset();
}

// ---- shapes ---------------------------------------------------------------------------------

IndexRange ulysses_q_heads(int64_t heads, int n, int j) {
  const int64_t per = (heads + n - 1) / n;
  return {std::min(j * per, heads), std::min((j + 1) * per, heads)};
}

IndexRange ulysses_kv_heads(int64_t heads, int64_t kv_heads, int n, int j) {
  const IndexRange q = ulysses_q_heads(heads, n, j);
  if (q.size() == 0) return {0, 0};
  const int64_t group = heads / kv_heads;
  return {q.begin / group, (q.end - 1) / group + 1};
}

bool standard_gqa(IndexRange q, IndexRange kv, int64_t group) {
  bool standard = kv.size() > 0 && q.size() % kv.size() == 0;
  for (int64_t i = 0; standard && i < q.size(); ++i)
    standard = (q.begin + i) / group - kv.begin == i / (q.size() / kv.size());
  return standard;
}

int64_t ulysses_kernel_kv_heads(int64_t heads, int64_t kv_heads, int n, int j) {
  const IndexRange q = ulysses_q_heads(heads, n, j), kv = ulysses_kv_heads(heads, kv_heads, n, j);
  return standard_gqa(q, kv, heads / kv_heads) ? kv.size() : q.size();
}

void validate_local_shapes(const Communicator& comm, const Partition& part, const TensorView& q,
                           const TensorView& k, const TensorView& v) {
  SEQPAR_ARG_CHECK(part.ranks() == comm.size(), "partition has ", part.ranks(),
                   " ranks but the communicator has ", comm.size());
  const int64_t n = part.count(comm.rank());
  SEQPAR_ARG_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4,
                   "q, k, v must be (B, S, H, D); got q ", q.shape_str(), ", k ", k.shape_str(),
                   ", v ", v.shape_str());
  SEQPAR_ARG_CHECK(q.dim(1) == n && k.dim(1) == n && v.dim(1) == n, "rank ", comm.rank(), " holds ",
                   n, " tokens but q, k, v have ", q.dim(1), ", ", k.dim(1), ", ", v.dim(1));
  SEQPAR_ARG_CHECK(k.shape() == v.shape(), "k ", k.shape_str(), " and v ", v.shape_str(),
                   " must have the same shape");
  SEQPAR_ARG_CHECK(q.dim(0) == k.dim(0) && q.dim(3) == k.dim(3), "q ", q.shape_str(), " and k ",
                   k.shape_str(), " must agree on batch and head_dim");
  SEQPAR_PARAM_CHECK(k.dim(2) >= 1 && q.dim(2) % k.dim(2) == 0, "kv_heads", divisors_text(q.dim(2)),
                     param("heads"), " ", q.dim(2), " is not divisible by ", param("kv_heads"), " ",
                     k.dim(2));
  SEQPAR_ARG_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), "q, k, v must have one dtype");
}

void check_strategy_shape(Strategy strategy, const Partition& part, int64_t heads, int64_t kv_heads,
                          int ulysses_degree, const CpOptions& opts) {
  const int n = part.ranks();
  check_softmax_mode(strategy, opts);
  if (!uses_ulysses(strategy)) return;
  const int u = strategy == Strategy::kUlysses ? n : (ulysses_degree == 0 ? n : ulysses_degree);
  SEQPAR_PARAM_CHECK(u >= 1 && n % u == 0, "ulysses_degree", divisors_text(n),
                     param("ulysses_degree"), " ", u, " does not divide the ", n,
                     " ranks; valid: ", divisors_text(n));
  if (opts.ulysses_mode == UlyssesMode::kStrict) {
    // Degrees that would work: for ulysses (degree = ranks) those dividing heads and sequence;
    // for usp the divisors of the ranks that divide the heads.
    std::string valid;
    for (int64_t d = 1; d <= (strategy == Strategy::kUlysses ? heads : n); ++d) {
      const bool fits = strategy == Strategy::kUlysses ? heads % d == 0 && part.seq() % d == 0
                                                       : n % d == 0 && heads % d == 0;
      if (fits) valid += (valid.empty() ? "" : ", ") + std::to_string(d);
    }
    SEQPAR_PARAM_CHECK(heads % u == 0, "ulysses_mode", "uaa", param("ulysses_mode"),
                       " 'strict' needs ", param("heads"), " ", heads,
                       " divisible by the Ulysses degree ", u,
                       "; valid degrees here: ", valid.empty() ? "none" : valid, "; or use ",
                       param("ulysses_mode"), " 'uaa'");
    // The all-to-all of strict mode needs equal shards inside each Ulysses group.
    for (int r = 0; r < n; ++r) {
      const int first = r / u * u;
      SEQPAR_PARAM_CHECK(
          part.count(r) == part.count(first), "ulysses_mode", "uaa", param("ulysses_mode"),
          " 'strict' needs equal shards in a Ulysses group, but rank ", first, " holds ",
          part.count(first), " tokens and rank ", r, " holds ", part.count(r), " (", param("seq"),
          " ", part.seq(), " on ", n, " ranks, remainder ", part.seq() % n, "); ",
          part.seq() % n != 0 || part.layout() == Layout::kCustom
              ? detail::concat("pad to ", (part.seq() + n - 1) / n * n, " tokens (", param("pad"),
                               "), or use ", param("ulysses_mode"), " 'uaa'")
              : detail::concat("packed documents (", param("seq_lens"),
                               ") split per document: use ", param("layout"), " 'contiguous', or ",
                               param("ulysses_mode"), " 'uaa'"));
    }
  }
  if (strategy == Strategy::kUsp && opts.ulysses_mode == UlyssesMode::kStrict) {
    // Ring peers must hold sequences of one length after the Ulysses exchange.
    std::vector<int64_t> lengths;
    for (int g = 0; g < n / u; ++g) {
      int64_t len = 0;
      for (int j = 0; j < u; ++j) len += part.count(g * u + j);
      lengths.push_back(len);
    }
    for (size_t g = 1; g < lengths.size(); ++g)
      SEQPAR_PARAM_CHECK(lengths[g] == lengths[0], "ulysses_mode", "uaa",
                         "usp ring groups hold different lengths after "
                         "the Ulysses exchange (group 0: ",
                         lengths[0], " tokens, group ", g, ": ", lengths[g], "); make ",
                         param("seq"), " divisible by the ranks or use ", param("ulysses_mode"),
                         " 'uaa'");
  }
}

KernelCall::KernelCall(const CpOptions& opts, std::span<const int64_t> q_pos,
                       std::span<const int64_t> k_pos, int64_t batch) {
  params.scale = opts.scale;
  params.block_q = opts.block_q;
  params.block_k = opts.block_k;
  params.mask.causal = opts.causal;
  params.mask.q_pos = q_pos;
  params.mask.k_pos = k_pos;
  if (opts.valid_len > 0) {
    bool any_pad = false;
    for (int64_t p : k_pos) any_pad |= p >= opts.valid_len;
    if (any_pad) {
      const size_t sk = k_pos.size();
      k_valid_.resize(sk * batch);
      for (size_t j = 0; j < sk; ++j) k_valid_[j] = k_pos[j] < opts.valid_len;
      for (int64_t b = 1; b < batch; ++b)
        std::copy(k_valid_.begin(), k_valid_.begin() + sk, k_valid_.begin() + b * sk);
      params.mask.k_valid = k_valid_;
    }
  }
  if (!opts.cu_seqlens.empty()) {
    q_segment_ = document_ids(opts.cu_seqlens, q_pos);
    k_segment_ = document_ids(opts.cu_seqlens, k_pos);
    params.mask.q_segment = q_segment_;
    params.mask.k_segment = k_segment_;
  }
}

// ---- predicted bytes --------------------------------------------------------------------------

CommPrediction predict_comm_bytes(Strategy strategy, const Partition& part, int rank, int64_t batch,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  size_t elem_bytes, int ulysses_degree, int64_t text_tokens,
                                  SoftmaxMode softmax) {
  CallRuns c = partition_runs(part, batch, heads, kv_heads, head_dim, elem_bytes);
  c.text_tokens = text_tokens;
  Schedule s = empty_schedule(c);
  const int n = part.ranks();
  switch (strategy) {
    case Strategy::kAllGather:
      add_allgather(s, c);
      break;
    case Strategy::kRing:
      add_ring(s, c, consecutive_members(0, n), c.kv, c.q, c.H, c.Hkv, CommGroup::kSp, softmax);
      break;
    case Strategy::kUlysses:
      add_ulysses(s, c, n, softmax);
      break;
    case Strategy::kUsp:
      add_ulysses(s, c, ulysses_degree == 0 ? n : ulysses_degree, softmax);
      break;
    case Strategy::kLocal:
    case Strategy::kPassKv:
    case Strategy::kPassQ:
      SEQPAR_CHECK(false, "predict_comm_bytes: strategy ", strategy_name(strategy),
                   " is not one over a sharded sequence");
  }
  if (text_tokens > 0) add_joint_text(s, c);
  return schedule_bytes(s, rank);
}

}  // namespace seqpar
