#include "seqpar/model/blocks/attention.h"

#include <algorithm>
#include <cstring>

#include "seqpar/attention/attention.h"
#include "seqpar/core/param_error.h"
#include "seqpar/model/ops.h"
#include "seqpar/parallel/cp_attention.h"

namespace seqpar {

// ---- parameters ------------------------------------------------------------------------------

std::vector<WeightStore::Spec> AttentionSpec::parameters(const std::string& prefix, float qk_std,
                                                         float bias_std) const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  const std::string p = prefix + ".";
  std::vector<WeightStore::Spec> s = {{p + proj[0] + ".weight", {q, hidden}, qk_std},
                                      {p + proj[1] + ".weight", {kv, hidden}, qk_std},
                                      {p + proj[2] + ".weight", {kv, hidden}}};
  const bool has_o = !proj[3].empty();  // empty: no output projection (FLUX's single blocks)
  if (has_o) s.push_back({p + proj[3] + ".weight", {hidden, q}});
  if (qkv_bias) {
    s.push_back({p + proj[0] + ".bias", {q}, bias_std});
    s.push_back({p + proj[1] + ".bias", {kv}, bias_std});
    s.push_back({p + proj[2] + ".bias", {kv}, bias_std});
  }
  if (has_o && o_bias) s.push_back({p + proj[3] + ".bias", {hidden}, bias_std});
  if (qk_norm == QkNorm::kAcrossHeads) {
    s.push_back({p + norm[0] + ".weight", {q}, -1});
    s.push_back({p + norm[1] + ".weight", {kv}, -1});
  } else if (qk_norm == QkNorm::kPerHead) {
    s.push_back({p + norm[0] + ".weight", {head_dim}, -1});
    s.push_back({p + norm[1] + ".weight", {head_dim}, -1});
  }
  return s;
}

// ---- QK-norm ---------------------------------------------------------------------------------

QkNormBlock QkNormBlock::load(const WeightStore& ws, const std::string& name, QkNorm kind,
                              int64_t h0, int64_t h1, int64_t heads, int64_t head_dim, float eps) {
  QkNormBlock n;
  n.kind = kind;
  if (kind == QkNorm::kAcrossHeads)
    n.across_heads =
        DistRmsNorm::load(ws, name, h0 * head_dim, h1 * head_dim, heads * head_dim, eps);
  if (kind == QkNorm::kPerHead) n.per_head = HeadRmsNorm::load(ws, name, eps);
  return n;
}

Tensor QkNormBlock::forward(Tensor x, Communicator& tp) const {
  switch (kind) {
    case QkNorm::kNone:
      return x;
    case QkNorm::kAcrossHeads:
      return across_heads.forward(x, tp);
    case QkNorm::kPerHead: {
      const std::vector<int64_t> shape = x.shape();
      const int64_t d = per_head.weight.numel(), rows = x.numel() / d;
      return reshape(per_head.forward(reshape(std::move(x), {rows, d})), shape);
    }
  }
  return x;
}

// ---- attention over a sequence or a cache ------------------------------------------------------

AttnState attend(const Tensor& q, const Tensor& k, const Tensor& v, ParallelContext& ctx,
                 const AttendOver& over) {
  const bool sharded = (over.kind == AttendOver::Kind::kSequence && over.sp->sharded()) ||
                       over.kind == AttendOver::Kind::kDocuments;
  if (over.kind == AttendOver::Kind::kLocal ||
      (over.kind == AttendOver::Kind::kSequence && !sharded)) {
    AttnParams params;
    params.mask.causal = over.causal;
    return flash_attention(q, k, v, params);
  }
  // The sequence-parallel group's view of the call (this tp rank's heads) through the one entry
  // point (parallel/cp_attention.h).
  ParallelConfig group = ctx.config;
  AttnShape shape;
  shape.batch = q.dim(0);
  shape.heads = q.dim(2);
  shape.kv_heads = k.dim(2);
  shape.head_dim = q.dim(3);
  shape.causal = over.causal;
  shape.dtype = q.dtype();
  shape.lse = false;  // the blocks keep the output only
  Placement place;
  if (over.kind == AttendOver::Kind::kDocuments) {
    group.mesh = {1, 1, ctx.sp->ring_degree(), ctx.sp->ulysses_degree()};
    shape.seq_lens.assign(over.seq_lens.begin(), over.seq_lens.end());
    for (int64_t len : over.seq_lens) shape.seq += len;
    place.part = *over.part;
  } else if (sharded) {
    group.mesh = {1, 1, ctx.sp->ring_degree(), ctx.sp->ulysses_degree()};
    shape.seq = over.sp->seq();
    place.part = over.sp->partition();
  } else {  // kCache: the new tokens over every rank's cache
    group.mesh = {1, 1, ctx.sp->sp().size(), 1};
    group.strategy = over.pass;
    group.schedule = over.schedule;
    group.pad = false;
    group.softmax = SoftmaxMode::kOnline;
    place.over_cache = true;
    place.cache = *over.place;
    for (const auto& kv : place.cache.kv_pos) shape.seq += static_cast<int64_t>(kv.size());
    for (const auto& qp : place.cache.q_pos) shape.fresh += static_cast<int64_t>(qp.size());
    shape.cached = shape.seq - shape.fresh;
  }
  // Over a sequence (or packed documents) k and v are this layer's fresh projections, dropped
  // after the call (a prefill's cache holds its own copy): where blocks are copied the rings may
  // use their storage as a receive buffer (K/V memory 2 shards instead of 3, no more bytes). Over a
  // cache they are the cache: kept.
  shape.kv_use = over.kind == AttendOver::Kind::kCache ? KvUse::kKeep : KvUse::kConsume;
  AttnOutputs out;
  attention(group, shape, *ctx.sp, place, {q, k, v}, out, nullptr,
            {ctx.cp.scale, ctx.cp.block_q, ctx.cp.block_k});
  return {std::move(out.out), std::move(out.lse)};
}

// ---- caches --------------------------------------------------------------------------------

namespace {
// Appends b (B, m, H, D) after the n tokens of a (B, n, H, D) of b's dtype, in place. The storage
// grows by half again when full, so a decode step copies its own rows (and, for B > 1, moves
// each batch's rows up) rather than the whole cache into a new one.
void append_tokens(Tensor& a, const Tensor& b) {
  if (a.empty() && a.ndim() != 4) {
    a = b;
    return;
  }
  const int64_t B = b.dim(0), n = a.dim(1), m = b.dim(1);
  const size_t row = static_cast<size_t>(b.dim(2) * b.dim(3)) * dtype_size(b.dtype());
  const size_t need = static_cast<size_t>(B * (n + m)) * row;
  if (need > a.capacity_bytes()) a.reserve(std::max(need, a.capacity_bytes() / 2 * 3));
  a.resize({B, n + m, b.dim(2), b.dim(3)});
  char* c = static_cast<char*>(a.raw());
  const char* src = static_cast<const char*>(b.raw());
  for (int64_t bb = B - 1; bb >= 0; --bb) {  // the last batch first: rows only move up
    if (bb > 0) std::memmove(c + bb * (n + m) * row, c + bb * n * row, n * row);
    std::memcpy(c + (bb * (n + m) + n) * row, src + bb * m * row, m * row);
  }
}

// t in dtype: itself when it already is, else rounded (to nearest even).
Tensor in_dtype(Tensor t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// The first m of the n tokens of x (B, n, H, D) fp32 as (B, m, H, D) in dtype (rounded to nearest
// even), its storage taken for m + more tokens.
Tensor first_tokens(const Tensor& x, int64_t m, int64_t more, DType dtype) {
  const int64_t B = x.dim(0), n = x.dim(1), row = x.dim(2) * x.dim(3);
  const size_t e = dtype_size(dtype);
  Tensor t;
  t.reserve(static_cast<size_t>(B * (m + more) * row) * e);
  t.resize({B, m, x.dim(2), x.dim(3)}, dtype);
  for (int64_t b = 0; b < B; ++b)
    convert(x.data<float>() + b * n * row, DType::kF32,
            static_cast<char*>(t.raw()) + static_cast<size_t>(b * m * row) * e, dtype,
            static_cast<size_t>(m * row));
  return t;
}
}  // namespace

void KvCache::append(const Tensor& k_new, const Tensor& v_new, std::span<const int64_t> pos) {
  append_tokens(k, in_dtype(k_new, dtype));
  append_tokens(v, in_dtype(v_new, dtype));
  positions.insert(positions.end(), pos.begin(), pos.end());
}

// ---- self-attention --------------------------------------------------------------------------

SelfAttention SelfAttention::load(const WeightStore& ws, const std::string& prefix,
                                  const AttentionSpec& spec, const ParallelContext& ctx) {
  const int t = ctx.tp_rank(), n = ctx.tp_size();
  SEQPAR_PARAM_CHECK(spec.heads % n == 0 && (spec.kv_heads % n == 0 || n % spec.kv_heads == 0),
                     "tp", "", param("tp"), " ", n, " must divide the ", spec.heads,
                     " attention heads, and divide or be a multiple of the ", spec.kv_heads,
                     " kv heads");
  SEQPAR_ARG_CHECK(spec.qk_norm != QkNorm::kAcrossHeads || spec.kv_heads % n == 0,
                   "a QK-norm across heads needs the ", spec.kv_heads, " kv heads divisible by tp ",
                   n);
  SelfAttention a;
  a.spec = spec;
  auto [h0, h1] = tp_share(spec.heads, t, n);
  a.h0 = h0;
  a.h1 = h1;
  // kv heads the local query heads read (a contiguous range; replicated when tp > kv_heads).
  const int64_t group = spec.heads / spec.kv_heads;
  a.kv0 = h0 / group;
  a.kv1 = (h1 - 1) / group + 1;
  const int64_t d = spec.head_dim;
  const std::string p = prefix + ".";
  a.q = ColumnLinear::load(ws, p + spec.proj[0], h0 * d, h1 * d, spec.qkv_bias);
  a.k = ColumnLinear::load(ws, p + spec.proj[1], a.kv0 * d, a.kv1 * d, spec.qkv_bias);
  a.v = ColumnLinear::load(ws, p + spec.proj[2], a.kv0 * d, a.kv1 * d, spec.qkv_bias);
  a.o = RowLinear::load(ws, p + spec.proj[3], h0 * d, h1 * d, spec.o_bias);
  a.norm_q = QkNormBlock::load(ws, p + spec.norm[0], spec.qk_norm, h0, h1, spec.heads, d,
                               spec.qk_norm_eps);
  a.norm_k = QkNormBlock::load(ws, p + spec.norm[1], spec.qk_norm, a.kv0, a.kv1, spec.kv_heads, d,
                               spec.qk_norm_eps);
  return a;
}

SelfAttention::Qkv SelfAttention::project(const Tensor& x, const Tensor& rope,
                                          ParallelContext& ctx) const {
  const int64_t B = x.dim(0), n = x.dim(1), d = spec.head_dim;
  Tensor qx = norm_q.forward(q.forward(x), *ctx.tp);
  Tensor kx = norm_k.forward(k.forward(x), *ctx.tp);
  Qkv h{reshape(std::move(qx), {B, n, h1 - h0, d}), reshape(std::move(kx), {B, n, kv1 - kv0, d}),
        reshape(v.forward(x), {B, n, kv1 - kv0, d})};
  apply_rope_(h.q, rope, spec.rope_pairs);
  apply_rope_(h.k, rope, spec.rope_pairs);
  return h;
}

Tensor SelfAttention::forward(const Tensor& x, const Tensor& rope, ParallelContext& ctx,
                              const SpRuntime& sp, bool causal, KvCache* cache) const {
  const int64_t B = x.dim(0), n = x.dim(1), d = spec.head_dim;
  auto [qh, kh, vh] = project(x, rope, ctx);
  if (cache) {  // this rank's real tokens (padding is never cached)
    auto pos = sp.local_positions();
    std::vector<int64_t> keep;
    for (int64_t p : pos)
      if (p < sp.seq()) keep.push_back(p);
    const int64_t m = static_cast<int64_t>(keep.size());
    // Real tokens come first: padding sits at the end.
    cache->k = first_tokens(kh, m, cache->more, cache->dtype);
    cache->v = first_tokens(vh, m, cache->more, cache->dtype);
    cache->positions = std::move(keep);
  }
  AttnState s = attend(qh, kh, vh, ctx, AttendOver::sequence(sp, causal));
  return o.forward(reshape(std::move(s.out), {B, n, (h1 - h0) * d}), *ctx.tp);
}

Tensor SelfAttention::forward(const Tensor& x, const Tensor& rope, ParallelContext& ctx,
                              const AttendOver& over) const {
  const int64_t B = x.dim(0), n = x.dim(1), d = spec.head_dim;
  auto [qh, kh, vh] = project(x, rope, ctx);
  AttnState s = attend(qh, kh, vh, ctx, over);
  return o.forward(reshape(std::move(s.out), {B, n, (h1 - h0) * d}), *ctx.tp);
}

Tensor SelfAttention::decode(const Tensor& x, const Tensor& rope, ParallelContext& ctx,
                             KvCache& cache, const KvPlacement& place, Strategy pass,
                             ScheduleKind schedule) const {
  const int64_t B = x.dim(0), T = x.dim(1), d = spec.head_dim;
  Communicator& sp = ctx.sp->sp();
  const int r = sp.rank();
  auto [qh, kh, vh] = project(x, rope, ctx);
  // Rows of the new tokens by position: each rank keeps its own tokens' q, k, v.
  std::vector<int64_t> all_new;
  for (const auto& qp : place.q_pos) all_new.insert(all_new.end(), qp.begin(), qp.end());
  std::sort(all_new.begin(), all_new.end());
  auto pick = [&](const Tensor& t, std::span<const int64_t> pos) {
    const int64_t h = t.dim(2);
    Tensor y({B, static_cast<int64_t>(pos.size()), h, d});
    for (int64_t b = 0; b < B; ++b)
      for (size_t i = 0; i < pos.size(); ++i) {
        const int64_t row =
            std::lower_bound(all_new.begin(), all_new.end(), pos[i]) - all_new.begin();
        std::memcpy(y.data<float>() + ((b * pos.size() + i) * h) * d,
                    t.data<float>() + ((b * T + row) * h) * d, h * d * sizeof(float));
      }
    return y;
  };
  const auto& mine = place.q_pos[r];
  cache.append(pick(kh, mine), pick(vh, mine), mine);
  SEQPAR_CHECK(cache.positions == place.kv_pos[r], "decode: rank ", r,
               "'s cache does not hold the positions the placement says");
  AttnState s = attend(in_dtype(pick(qh, mine), cache.dtype), cache.k, cache.v, ctx,
                       AttendOver::cache(place, pass, schedule));
  // Every rank needs every new token's output: each owner broadcasts its rows.
  Tensor out({B, T, h1 - h0, d});
  for (int owner = 0; owner < sp.size(); ++owner) {
    const auto& pos = place.q_pos[owner];
    if (pos.empty()) continue;
    Tensor rows =
        owner == r ? std::move(s.out) : Tensor({B, static_cast<int64_t>(pos.size()), h1 - h0, d});
    sp.broadcast(rows.raw(), rows.nbytes(), owner);
    for (int64_t b = 0; b < B; ++b)
      for (size_t i = 0; i < pos.size(); ++i) {
        const int64_t row =
            std::lower_bound(all_new.begin(), all_new.end(), pos[i]) - all_new.begin();
        std::memcpy(out.data<float>() + ((b * T + row) * (h1 - h0)) * d,
                    rows.data<float>() + ((b * pos.size() + i) * (h1 - h0)) * d,
                    (h1 - h0) * d * sizeof(float));
      }
  }
  return o.forward(reshape(std::move(out), {B, T, (h1 - h0) * d}), *ctx.tp);
}

// ---- cross-attention -------------------------------------------------------------------------

CrossAttention CrossAttention::load(const WeightStore& ws, const std::string& prefix,
                                    const AttentionSpec& spec, const ParallelContext& ctx,
                                    bool image_kv) {
  SEQPAR_PARAM_CHECK(spec.heads % ctx.tp_size() == 0 && spec.kv_heads == spec.heads, "tp", "",
                     param("tp"), " ", ctx.tp_size(), " must divide the ", spec.heads,
                     " heads of a cross-attention");
  CrossAttention a;
  a.spec = spec;
  auto [h0, h1] = tp_share(spec.heads, ctx.tp_rank(), ctx.tp_size());
  a.h0 = h0;
  a.h1 = h1;
  const int64_t d = spec.head_dim;
  const std::string p = prefix + ".";
  a.q = ColumnLinear::load(ws, p + spec.proj[0], h0 * d, h1 * d, spec.qkv_bias);
  a.k = ColumnLinear::load(ws, p + spec.proj[1], h0 * d, h1 * d, spec.qkv_bias);
  a.v = ColumnLinear::load(ws, p + spec.proj[2], h0 * d, h1 * d, spec.qkv_bias);
  a.o = RowLinear::load(ws, p + spec.proj[3], h0 * d, h1 * d, spec.o_bias);
  a.norm_q = QkNormBlock::load(ws, p + spec.norm[0], spec.qk_norm, h0, h1, spec.heads, d,
                               spec.qk_norm_eps);
  a.norm_k = QkNormBlock::load(ws, p + spec.norm[1], spec.qk_norm, h0, h1, spec.heads, d,
                               spec.qk_norm_eps);
  a.image_kv = image_kv;
  if (image_kv) {  // Wan's names; the same head split as k and v
    a.k_img = ColumnLinear::load(ws, p + "k_img", h0 * d, h1 * d, true);
    a.v_img = ColumnLinear::load(ws, p + "v_img", h0 * d, h1 * d, true);
    a.norm_k_img = QkNormBlock::load(ws, p + "norm_k_img", spec.qk_norm, h0, h1, spec.heads, d,
                                     spec.qk_norm_eps);
  }
  return a;
}

Tensor CrossAttention::forward(const Tensor& x, const Tensor& context, ParallelContext& ctx,
                               const Tensor& image_context) const {
  SEQPAR_CHECK(image_kv == !image_context.empty(), "cross-attention: image context ",
               image_context.empty() ? "missing" : "given", " for a block ",
               image_kv ? "with" : "without", " image K/V");
  const int64_t B = x.dim(0), n = x.dim(1), L = context.dim(1), d = spec.head_dim, h = h1 - h0;
  Tensor qh = reshape(norm_q.forward(q.forward(x), *ctx.tp), {B, n, h, d});
  Tensor kh = reshape(norm_k.forward(k.forward(context), *ctx.tp), {B, L, h, d});
  Tensor vh = reshape(v.forward(context), {B, L, h, d});
  AttnState s = attend(qh, kh, vh, ctx, AttendOver::local(false));
  if (image_kv) {  // (B, n, h, D) outputs of the two attentions summed, as diffusers adds them
    const int64_t Li = image_context.dim(1);
    Tensor ki = reshape(norm_k_img.forward(k_img.forward(image_context), *ctx.tp), {B, Li, h, d});
    Tensor vi = reshape(v_img.forward(image_context), {B, Li, h, d});
    add_(s.out, attend(qh, ki, vi, ctx, AttendOver::local(false)).out);
  }
  return o.forward(reshape(std::move(s.out), {B, n, h * d}), *ctx.tp);
}

}  // namespace seqpar
