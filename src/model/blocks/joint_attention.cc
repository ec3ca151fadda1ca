#include "seqpar/model/blocks/joint_attention.h"

#include "seqpar/attention/attention.h"
#include "seqpar/core/param_error.h"
#include "seqpar/model/ops.h"
#include "seqpar/parallel/cp_attention.h"

namespace seqpar {

StreamProjections StreamProjections::load(const WeightStore& ws, const std::string& prefix,
                                          const AttentionSpec& spec, int64_t h0, int64_t h1,
                                          bool o_bias) {
  const int64_t d = spec.head_dim;
  const std::string p = prefix + ".";
  StreamProjections s;
  s.q = ColumnLinear::load(ws, p + spec.proj[0], h0 * d, h1 * d, spec.qkv_bias);
  s.k = ColumnLinear::load(ws, p + spec.proj[1], h0 * d, h1 * d, spec.qkv_bias);
  s.v = ColumnLinear::load(ws, p + spec.proj[2], h0 * d, h1 * d, spec.qkv_bias);
  if (!spec.proj[3].empty())
    s.o = RowLinear::load(ws, p + spec.proj[3], h0 * d, h1 * d, spec.o_bias && o_bias);
  s.norm_q = QkNormBlock::load(ws, p + spec.norm[0], spec.qk_norm, h0, h1, spec.heads, d,
                               spec.qk_norm_eps);
  s.norm_k = QkNormBlock::load(ws, p + spec.norm[1], spec.qk_norm, h0, h1, spec.heads, d,
                               spec.qk_norm_eps);
  return s;
}

JointAttention JointAttention::load(const WeightStore& ws, const std::string& prefix,
                                    const AttentionSpec& image_spec, const AttentionSpec& text_spec,
                                    const ParallelContext& ctx, bool split_text_by_head) {
  SEQPAR_CHECK(image_spec.heads == text_spec.heads && image_spec.head_dim == text_spec.head_dim &&
                   image_spec.kv_heads == image_spec.heads && text_spec.kv_heads == text_spec.heads,
               "joint attention: both streams need the same heads (no GQA)");
  SEQPAR_PARAM_CHECK(image_spec.heads % ctx.tp_size() == 0, "tp", "", param("tp"), " ",
                     ctx.tp_size(), " must divide the ", image_spec.heads,
                     " heads of a joint attention");
  JointAttention a;
  a.image_spec = image_spec;
  a.text_spec = text_spec;
  auto [h0, h1] = tp_share(image_spec.heads, ctx.tp_rank(), ctx.tp_size());
  a.h0 = h0;
  a.h1 = h1;
  a.image = StreamProjections::load(ws, prefix, image_spec, h0, h1);
  a.t0 = h0;
  a.t1 = h1;
  a.text_by_heads = split_text_by_head && ctx.sp->sp().size() > 1 && ctx.sp->ulysses_degree() > 1 &&
                    text_spec.qk_norm != QkNorm::kAcrossHeads;
  if (a.text_by_heads) {
    const IndexRange slots =
        ulysses_q_heads(h1 - h0, ctx.sp->ulysses_degree(), ctx.sp->ulysses().rank());
    a.t0 = h0 + slots.begin;
    a.t1 = h0 + slots.end;
    if (text_spec.o_bias) a.text_o_bias = ws.get(prefix + "." + text_spec.proj[3] + ".bias");
  }
  if (a.t1 > a.t0)
    a.text = StreamProjections::load(ws, prefix, text_spec, a.t0, a.t1, !a.text_by_heads);
  return a;
}

namespace {

// (B, n, ...) and (B, m, ...) joined along the tokens: rows of (B, tokens·features).
Tensor join_tokens(const Tensor& a, const Tensor& b) {
  const int64_t B = a.dim(0);
  std::vector<int64_t> shape = a.shape();
  shape[1] += b.dim(1);
  return reshape(concat_cols(reshape(a, {B, a.numel() / B}), reshape(b, {B, b.numel() / B})),
                 std::move(shape));
}

}  // namespace

StreamQkv project_stream(const StreamProjections& s, const AttentionSpec& spec, int64_t h,
                         const Tensor& x, const Tensor& rope, Communicator& tp) {
  const int64_t B = x.dim(0), n = x.dim(1), d = spec.head_dim;
  StreamQkv r{reshape(s.norm_q.forward(s.q.forward(x), tp), {B, n, h, d}),
              reshape(s.norm_k.forward(s.k.forward(x), tp), {B, n, h, d}),
              reshape(s.v.forward(x), {B, n, h, d})};
  apply_rope_(r.q, rope, spec.rope_pairs);
  apply_rope_(r.k, rope, spec.rope_pairs);
  return r;
}

JointAttention::Result joint_attend(const StreamQkv& img, const StreamQkv& txt,
                                    ParallelContext& ctx, const SpRuntime& sp, bool text_by_heads) {
  const int64_t B = img.q.dim(0), n = img.q.dim(1), T = txt.q.dim(1), h = img.q.dim(2),
                ht = txt.q.dim(2), d = img.q.dim(3);
  SEQPAR_CHECK(!text_by_heads || sp.sharded(), "joint_attend: text by heads needs a sharded call");
  Tensor image_out, text_out;  // (B, n, h·D), (B, T, ht·D)
  if (!sp.sharded()) {
    // One attention over [text, image] on this rank.
    AttnParams params;
    AttnState s = flash_attention(join_tokens(txt.q, img.q), join_tokens(txt.k, img.k),
                                  join_tokens(txt.v, img.v), params);
    const Tensor rows = reshape(std::move(s.out), {B, (T + n) * h * d});
    text_out = reshape(slice_cols(rows, 0, T * h * d), {B, T, h * d});
    image_out = reshape(slice_cols(rows, T * h * d, (T + n) * h * d), {B, n, h * d});
  } else {
    // The image sharded over the group, the text replicated: the one entry point's joint path.
    ParallelConfig group = ctx.config;
    group.mesh = {1, 1, ctx.sp->ring_degree(), ctx.sp->ulysses_degree()};
    AttnShape shape;
    shape.batch = B;
    shape.seq = sp.seq();
    shape.heads = shape.kv_heads = h;
    shape.head_dim = d;
    shape.text_tokens = T;
    shape.text_by_heads = text_by_heads;
    shape.dtype = img.q.dtype();
    shape.lse = false;  // the block keeps the outputs only
    Placement place;
    place.part = sp.partition();
    AttnOutputs out;
    attention(group, shape, *ctx.sp, place, {img.q, img.k, img.v, txt.q, txt.k, txt.v}, out,
              nullptr, {ctx.cp.scale, ctx.cp.block_q, ctx.cp.block_k});
    image_out = reshape(std::move(out.out), {B, n, h * d});
    text_out = reshape(std::move(out.text_out), {B, T, ht * d});
  }
  return {std::move(image_out), std::move(text_out)};
}

JointAttention::Result JointAttention::forward(const Tensor& x, const Tensor& context,
                                               const Tensor& rope_image, const Tensor& rope_text,
                                               ParallelContext& ctx, const SpRuntime& sp) const {
  const int64_t B = context.dim(0), T = context.dim(1), d = image_spec.head_dim;
  const int64_t ht = t1 - t0;  // the text heads this rank computes
  const StreamQkv txt =
      ht > 0 ? project_stream(text, text_spec, ht, context, rope_text, *ctx.tp)
             : StreamQkv{Tensor({B, T, 0, d}), Tensor({B, T, 0, d}), Tensor({B, T, 0, d})};
  const bool by_heads = text_by_heads && sp.sharded();
  Result a = joint_attend(project_stream(image, image_spec, h1 - h0, x, rope_image, *ctx.tp), txt,
                          ctx, sp, by_heads);
  Tensor image_out = image.o.forward(a.image, *ctx.tp);
  if (!by_heads) return {std::move(image_out), text.o.forward(a.text, *ctx.tp)};
  // This Ulysses member's heads' share of the text output, summed over the group (every member
  // of this rank's tp group holds as many heads), then the bias once.
  Tensor y = ht > 0 ? text.o.forward(a.text, *ctx.tp) : Tensor({B, T, image_spec.hidden});
  ctx.sp->ulysses().all_reduce(std::span<float>(y.data<float>(), y.numel()), ReduceOp::kSum);
  if (!text_o_bias.empty()) {
    const int64_t F = text_o_bias.numel();
    for (int64_t r = 0; r < y.numel() / F; ++r)
      for (int64_t i = 0; i < F; ++i) y.data<float>()[r * F + i] += text_o_bias.data<float>()[i];
  }
  return {std::move(image_out), std::move(y)};
}

}  // namespace seqpar
