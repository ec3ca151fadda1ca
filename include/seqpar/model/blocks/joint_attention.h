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
// spec.proj[3] is empty (FLUX's single-stream blocks).
struct StreamProjections {
  ColumnLinear q, k, v;
  RowLinear o;
  QkNormBlock norm_q, norm_k;
  static StreamProjections load(const WeightStore& ws, const std::string& prefix,
                                const AttentionSpec& spec, int64_t h0, int64_t h1);
};

struct JointAttention {
  AttentionSpec image_spec, text_spec;  // the same heads and head_dim; their own names
  int64_t h0 = 0, h1 = 0;
  StreamProjections image, text;

  // Both streams' parameters under `prefix`; InvalidArgument when tp does not divide the heads.
  static JointAttention load(const WeightStore& ws, const std::string& prefix,
                             const AttentionSpec& image_spec, const AttentionSpec& text_spec,
                             const ParallelContext& ctx);

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
// (B, n, h·D) and (B, T, h·D). FLUX's single-stream blocks project both streams with the same
// weights and call this directly.
JointAttention::Result joint_attend(const StreamQkv& image, const StreamQkv& text,
                                    ParallelContext& ctx, const SpRuntime& sp);

}  // namespace seqpar
