// Joint attention (MMDiT dual stream; docs/algorithms.md "joint attention"): image tokens
// sharded, text tokens replicated on every rank, one bidirectional sequence with the text after
// the image; every text key and value enters exactly once.
//
// Accepts: a strategy and its communicators (SpComms), a Partition of the image tokens; this
//   rank's image q (B, n_r, H, D), k, v (B, n_r, Hkv, D) and the whole text text_q (B, T, H, D),
//   text_k, text_v (B, T, Hkv, D); CpOptions: padding of the image keys (valid_len). Not causal,
//   no documents.
// Returns: JointState: the own image rows' state (B, n_r, H, D) + (B, n_r, H) and the text
//   rows' state (B, T, H, D) + (B, T, H), the same on every rank; fp32. Adds the text part to
//   *stats after the strategy set it.
// Steps on rank r of N:
//   step 0: image queries over all image keys through the chosen strategy
//   step 1: image queries over the text keys (local: text is replicated), folded into the image
//           state by the kernel (AttnParams::accumulate)
//   step 2: text queries over the local image shard -> partial state
//   step 3: all_gather the text partials (B, T, H, D+1 fp32 each), merge them in rank order
//   step 4: text queries over the text keys (local), folded into the text state
// What each rank attends (I_i: the image shard of rank i, T the text), N = 4:
//   step   rank 0             rank 1             rank 2             rank 3
//   0      I_0 x I_0..I_3     I_1 x I_0..I_3     I_2 x I_0..I_3     I_3 x I_0..I_3
//   1      I_0 x T            I_1 x T            I_2 x T            I_3 x T
//   2      T x I_0            T x I_1            T x I_2            T x I_3
//   3      T's partials over I_0..I_3, on every rank
//   4      T x T              T x T              T x T              T x T
// Bytes per rank: the strategy's, plus B·T·H·(D+1)·4·(N-1) each way (the text partials).
// Memory: the strategy's, plus the text's q, k, v (replicated) and the gathered text partials
//   (N·B·T·H·(D+1)·4).
// Limitations: bidirectional only (causal refused), no documents (cu_seqlens); text over text is
//   computed on every rank (counted once in CpStats::work, on rank 0).
#include <cstring>
#include <vector>

#include "schedule_build.h"
#include "seqpar/core/param_error.h"
#include "seqpar/core/timer.h"
#include "seqpar/parallel/strategy_table.h"
#include "strategy_common.h"

namespace seqpar {

JointState joint_attention(Strategy strategy, SpComms& comms, const Partition& part,
                           const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& text_q, const TensorView& text_k,
                           const TensorView& text_v, const CpOptions& opts, CpStats* stats) {
  Communicator& comm = comms.sp();
  SEQPAR_PARAM_CHECK(!opts.causal, "causal", "false",
                     "joint attention (text tokens) is bidirectional; ", param("causal"),
                     " must be false");
  SEQPAR_ARG_CHECK(opts.cu_seqlens.empty(), "joint attention (text tokens) with packed ",
                   "documents (cu_seqlens) is not supported; give one or the other");
  SEQPAR_ARG_CHECK(text_q.ndim() == 4 && text_k.ndim() == 4 && text_k.shape() == text_v.shape() &&
                       text_q.dim(1) == text_k.dim(1) && text_q.dim(2) == q.dim(2) &&
                       text_k.dim(2) == k.dim(2) && text_q.dim(3) == q.dim(3) &&
                       text_q.dim(0) == q.dim(0),
                   "text q ", text_q.shape_str(), ", k ", text_k.shape_str(), ", v ",
                   text_v.shape_str(), " must be (B, T, H, D) and (B, T, Hkv, D) like the image's");
  const int n = comm.size();
  const int64_t B = q.dim(0), T = text_q.dim(1), H = q.dim(2), D = q.dim(3);
  const int64_t n_r = q.dim(1);
  const auto image_pos = part.positions(comm.rank());
  std::vector<int64_t> text_pos(T);
  for (int64_t t = 0; t < T; ++t) text_pos[t] = part.seq() + t;
  CpOptions text_keys = opts;  // text keys are never padding
  text_keys.valid_len = 0;

  JointState js;
  // step 0 and 1
  Placement place;
  place.part = part;
  SEQPAR_CHECK(opts.out_dtype == DType::kF32 && opts.lse,
               "joint_attention: the image state it merges must be fp32 with its lse (image_call)");
  js.image = schedule_row(strategy, opts.schedule).run({comms, place, q, k, v, opts, stats});
  double t0 = now_seconds();
  {
    KernelCall call(text_keys, image_pos, text_pos, B);
    flash_attention_fold(js.image, q, text_k, text_v, call.params);
  }
  // step 2
  AttnState partial;
  {
    KernelCall call(opts, text_pos, image_pos, B);
    partial = fully_hidden(opts, text_pos, image_pos)
                  ? AttnState::empty(B, T, H, D)
                  : flash_attention(text_q, k, v, call.params);
  }
  double t1 = now_seconds();
  // step 3: pack (out row, lse) per (b, t), gather, merge in rank order.
  const int64_t w = H * (D + 1);
  std::vector<float> mine(static_cast<size_t>(B * T * w));
  for (int64_t row = 0; row < B * T; ++row) {
    std::memcpy(&mine[row * w], partial.out.data<float>() + row * H * D, H * D * sizeof(float));
    std::memcpy(&mine[row * w + H * D], partial.lse.data<float>() + row * H, H * sizeof(float));
  }
  std::vector<float> all(mine.size() * n);
  comm.all_gather(mine.data(), mine.size() * sizeof(float), all.data());
  double t2 = now_seconds();
  js.text = AttnState::empty(B, T, H, D);
  for (int i = 0; i < n; ++i) {
    const float* src = all.data() + i * mine.size();
    for (int64_t row = 0; row < B * T; ++row)
      for (int64_t h = 0; h < H; ++h)
        merge_row(js.text.out.data<float>() + (row * H + h) * D,
                  js.text.lse.data<float>() + row * H + h, src + row * w + h * D,
                  src[row * w + H * D + h], D);
  }
  // step 4
  {
    KernelCall call(text_keys, text_pos, text_pos, B);
    flash_attention_fold(js.text, text_q, text_k, text_v, call.params);
  }
  if (stats) {
    stats->wait_seconds += t2 - t1;
    stats->compute_seconds += (t1 - t0) + (now_seconds() - t2);
    stats->work += B * H * (n_r * T + T * static_cast<int64_t>(image_pos.size()));
    stats->work += comm.rank() == 0 ? B * H * T * T : 0;  // text-text: counted once
  }
  return js;
}

// The text part's schedule (steps 1 to 4): image queries over the text keys and text queries
// over the image shard, folded into the image state; the all_gather of the text partials; the
// merges of the partials and text over text folded into them (on every rank, counted once by
// CpStats).
void add_joint_text(Schedule& s, const CallRuns& c) {
  const int n = c.n();
  const int64_t T = c.text_tokens;
  if (c.text_by_heads) {
    // ulysses_joint_attention: member j's heads only; usp gathers the text partials over the
    // ring (the members of one Ulysses rank across the R groups); text over text once per head.
    const int u = c.ulysses, R = n / u;
    for (int r = 0; r < n; ++r) {
      RankSchedule& rs = s.ranks[r];
      const int64_t hq = ulysses_q_heads(c.H, u, r % u).size();
      int64_t group_tokens = 0;
      for (int j = 0; j < u; ++j) group_tokens += run_count(c.q[r / u * u + j]);
      rs.steps.push_back(
          compute_step(2 * c.B * hq * group_tokens * T, c.fold_bytes(group_tokens, hq)));
      if (R > 1 && hq > 0) {
        const uint64_t partials = 4ull * c.B * T * hq * (c.D + 1) * (R - 1);
        rs.steps.push_back(collective_step(OpKind::kAllGather, false, "text partials",
                                           CommGroup::kRing, {r % u, u, R}, partials, partials));
      }
      Step text =
          compute_step(c.B * hq * T * T, (R - 1) * c.merge_bytes(T, hq) + c.fold_bytes(T, hq));
      text.replicated = r / u != 0;
      rs.steps.push_back(text);
    }
    return;
  }
  const uint64_t partials = 4ull * c.B * T * c.H * (c.D + 1) * (n - 1);
  for (int r = 0; r < n; ++r) {
    RankSchedule& rs = s.ranks[r];
    rs.steps.push_back(compute_step(2 * c.B * c.H * rs.tokens * T, c.fold_bytes(rs.tokens, c.H)));
    rs.steps.push_back(collective_step(OpKind::kAllGather, false, "text partials", CommGroup::kSp,
                                       consecutive_members(0, n), partials, partials));
    Step text =
        compute_step(c.B * c.H * T * T, (n - 1) * c.merge_bytes(T, c.H) + c.fold_bytes(T, c.H));
    text.replicated = true;
    rs.steps.push_back(text);
  }
}

AttnShape image_call(const AttnShape& s) {
  AttnShape image = s;
  if (s.text_tokens > 0 && !s.text_by_heads) {
    image.out_dtype = DType::kF32;
    image.lse = true;
  }
  // Joint attention reads the image shard's k and v after the ring: lent, never consumed.
  if (s.text_tokens > 0 && s.kv_use == KvUse::kConsume) image.kv_use = KvUse::kLend;
  return image;
}

void add_joint_text_schedule(Schedule& image, const ParallelConfig& cfg, const AttnShape& shape) {
  CallRuns c = sequence_runs(cfg, shape);
  c.ulysses = cfg.mesh.ulysses;
  add_joint_text(image, c);
}

}  // namespace seqpar
