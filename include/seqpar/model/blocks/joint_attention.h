// Joint attention of a dual-stream block (Qwen-Image; FLUX's double-stream blocks): the image
// tokens (this rank's shard of the sequence) and the text tokens (replicated on every rank of the
// sequence-parallel group) each have their own q/k/v projections, per-head RMS QK-norm, RoPE and
// output projection, and attend together in one bidirectional attention over [text, image] in
// which every text key and value enters exactly once (parallel/joint.cc under sequence
// parallelism; on one rank, one attention over the concatenation).
// Heads are split over the tensor-parallel group (q/k/v column-parallel, the outputs
// row-parallel), as in SelfAttention.
// Thread-safety: a block is used by one rank thread; load() reads the store only.
#pragma once

#include <cstdint>
#include <string>

#include "seqpar/model/blocks/attention.h"

namespace seqpar {

// One stream's projections and QK-norm for this rank's heads [h0, h1); no output projection when
// spec.proj[3] is empty (FLUX's single-stream blocks), its bias only when spec.o_bias and o_bias.
struct StreamProjections {
  ColumnLinear q, k, v;
  RowLinear o;
  QkNormBlock norm_q, norm_k;
  static StreamProjections load(const WeightStore& ws, const std::string& prefix,
                                const AttentionSpec& spec, int64_t h0, int64_t h1,
                                bool o_bias = true);
};

struct JointAttention {
  AttentionSpec image_spec, text_spec;  // the same heads and head_dim; their own names
  int64_t h0 = 0, h1 = 0;               // this tp rank's heads
  // The text's heads this rank projects and attends: [h0, h1), or with text_by_heads (asked for
  // at load, a sharded sequence, ulysses_degree > 1, no QK-norm across heads) its Ulysses
  // member's slots of them (ulysses_q_heads): no member computes another's text heads. The text
  // output projection is then this rank's columns, summed over the Ulysses group, its bias added
  // once (forward).
  int64_t t0 = 0, t1 = 0;
  bool text_by_heads = false;
  Tensor text_o_bias;  // text_by_heads: the text output projection's bias, added after the sums
  StreamProjections image, text;

  // Both streams' parameters under `prefix`; InvalidArgument when tp does not divide the heads.
  // split_text_by_head: the text by head over the Ulysses group where that applies (Qwen-Image;
  // FLUX splits its text by rows instead).
  static JointAttention load(const WeightStore& ws, const std::string& prefix,
                             const AttentionSpec& image_spec, const AttentionSpec& text_spec,
                             const ParallelContext& ctx, bool split_text_by_head = false);

  struct Result {
    Tensor image, text;  // (B, n, hidden), (B, T, hidden)
  };
  // x (B, n, hidden): this rank's image tokens at sp's local positions with rope_image
  // (n, D/2, 2); context (B, T, hidden): the text with rope_text (T, D/2, 2), the same on every
  // rank.
  Result forward(const Tensor& x, const Tensor& context, const Tensor& rope_image,
                 const Tensor& rope_text, ParallelContext& ctx, const SpRuntime& sp) const;
};

// q, k, v (B, n, h, D) of one stream on this rank's h heads: x (B, n, hidden) projected by `s`,
// QK-normed, and q, k rotated by rope (n, D/2, 2).
struct StreamQkv {
  Tensor q, k, v;
};
StreamQkv project_stream(const StreamProjections& s, const AttentionSpec& spec, int64_t h,
                         const Tensor& x, const Tensor& rope, Communicator& tp);

// The joint attention of two projected streams before their output projections: the image
// (B, n, h, D) (this rank's shard at sp's local positions) and the text (B, T, h, D) (the same on
// every rank of the group) attend together over [text, image], every text key once. Returns
// (B, n, h·D) and (B, T, h·D). With text_by_heads the text holds this rank's Ulysses heads only
// (B, T, h_u, D) and so does its result (parallel/cp_attention.h). FLUX's single-stream blocks
// project both streams with the same weights and call this directly.
JointAttention::Result joint_attend(const StreamQkv& image, const StreamQkv& text,
                                    ParallelContext& ctx, const SpRuntime& sp,
                                    bool text_by_heads = false);

}  // namespace seqpar
