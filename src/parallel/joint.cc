// Joint attention (MMDiT dual stream) on rank r of N:
//   step 0: image queries over all image keys through the chosen strategy
//   step 1: image queries over the text keys (local: text is replicated); merge
//   step 2: text queries over the local image shard -> partial state
//   step 3: all_gather the text partials (B, T, H, D+1 fp32 each), merge them in rank order
//   step 4: text queries over the text keys (local); merge
// Every text key and value enters exactly once (steps 1 and 4 are local, never gathered).
#include <cstring>
#include <vector>

#include "schedule_build.h"
#include "strategy_common.h"
#include "seqpar/core/timer.h"
#include "seqpar/parallel/strategy_table.h"
#include "strategy_common.h"

namespace seqpar {

JointState joint_attention(Strategy strategy, SpComms& comms, const Partition& part,
                           const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& text_q, const Tensor& text_k, const Tensor& text_v,
                           const CpOptions& opts, CpStats* stats) {
  Communicator& comm = comms.sp();
  SEQPAR_ARG_CHECK(!opts.causal,
                   "joint attention (text tokens) is bidirectional; causal must be false");
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
  js.image = schedule_row(strategy, opts.schedule).run({comms, place, q, k, v, opts, stats});
  double t0 = now_seconds();
  {
    KernelCall call(text_keys, image_pos, text_pos, B);
    merge_into(js.image, flash_attention(q, text_k, text_v, call.params));
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
    merge_into(js.text, flash_attention(text_q, text_k, text_v, call.params));
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
// over the image shard, with the merge of the image state; the all_gather of the text partials;
// text over text (on every rank, counted once by CpStats) and the merges of the partials.
void add_joint_text(Schedule& s, const CallRuns& c) {
  const int n = c.n();
  const int64_t T = c.text_tokens;
  const uint64_t partials = 4ull * c.B * T * c.H * (c.D + 1) * (n - 1);
  for (int r = 0; r < n; ++r) {
    RankSchedule& rs = s.ranks[r];
    rs.steps.push_back(compute_step(2 * c.B * c.H * rs.tokens * T, c.merge_bytes(rs.tokens, c.H)));
    rs.steps.push_back(collective_step(OpKind::kAllGather, false, "text partials", CommGroup::kSp,
                                       consecutive_members(0, n), partials, partials));
    Step text = compute_step(c.B * c.H * T * T, n * c.merge_bytes(T, c.H));
    text.replicated = true;
    rs.steps.push_back(text);
  }
}

void add_joint_text_schedule(Schedule& image, const ParallelConfig& cfg, const AttnShape& shape) {
  add_joint_text(image, sequence_runs(cfg, shape));
}

}  // namespace seqpar
