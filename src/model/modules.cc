#include "seqpar/model/modules.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "seqpar/attention/attention.h"
#include "seqpar/model/ops.h"
#include "seqpar/parallel/cp_attention.h"

namespace seqpar {

IndexRange tp_share(int64_t count, int rank, int n) {
  SEQPAR_CHECK(count % n == 0, count, " is not divisible by the tensor-parallel size ", n);
  return {count / n * rank, count / n * (rank + 1)};
}

// ---- linear layers -----------------------------------------------------------------------

ColumnLinear ColumnLinear::load(const WeightStore& ws, const std::string& name, int64_t begin,
                                int64_t end, bool bias) {
  ColumnLinear l;
  l.w = ws.rows(name + ".weight", begin, end);
  if (bias) l.b = ws.rows(name + ".bias", begin, end).to(DType::kF32);
  return l;
}

Tensor ColumnLinear::forward(const Tensor& x) const { return linear(x, w, b); }

RowLinear RowLinear::load(const WeightStore& ws, const std::string& name, int64_t begin,
                          int64_t end, bool bias) {
  RowLinear l;
  l.w = ws.cols(name + ".weight", begin, end);
  if (bias) l.b = ws.get(name + ".bias");
  return l;
}

Tensor RowLinear::forward(const Tensor& x, Communicator& tp) const {
  Tensor y = linear(x, w, Tensor());
  if (tp.size() > 1) tp.all_reduce(std::span<float>(y.data<float>(), y.numel()), ReduceOp::kSum);
  if (!b.empty()) {
    const int64_t n = b.numel(), rows = y.numel() / n;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i) y.data<float>()[r * n + i] += b.data<float>()[i];
  }
  return y;
}

DistRmsNorm DistRmsNorm::load(const WeightStore& ws, const std::string& name, int64_t begin,
                              int64_t end, int64_t full_width, float eps) {
  DistRmsNorm n;
  n.weight = ws.rows(name + ".weight", begin, end).to(DType::kF32);
  n.full_width = full_width;
  n.eps = eps;
  return n;
}

Tensor DistRmsNorm::forward(const Tensor& x, Communicator& tp) const {
  Tensor ss = row_sum_squares(x);
  if (tp.size() > 1) tp.all_reduce(std::span<float>(ss.data<float>(), ss.numel()), ReduceOp::kSum);
  return rms_norm_with_stats(x, ss, full_width, weight, eps);
}

// ---- rotary embedding ---------------------------------------------------------------------

namespace {
void fill_pair(float* t, double angle) {
  t[0] = static_cast<float>(std::cos(angle));
  t[1] = static_cast<float>(std::sin(angle));
}
}  // namespace

Tensor rope_1d(std::span<const int64_t> positions, int64_t head_dim, double theta) {
  const int64_t n = static_cast<int64_t>(positions.size()), pairs = head_dim / 2;
  Tensor t({n, pairs, 2});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < pairs; ++j)
      fill_pair(t.data<float>() + (i * pairs + j) * 2,
                positions[i] * std::pow(theta, -2.0 * j / head_dim));
  return t;
}

Tensor rope_3d(std::span<const int64_t> positions, std::array<int64_t, 3> grid, int64_t head_dim,
               double theta) {
  const int64_t n = static_cast<int64_t>(positions.size()), pairs = head_dim / 2;
  const int64_t ph = pairs / 3, pw = pairs / 3, pf = pairs - ph - pw;
  Tensor t({n, pairs, 2});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = positions[i];
    const int64_t coord[3] = {p / (grid[1] * grid[2]), p / grid[2] % grid[1], p % grid[2]};
    const int64_t width[3] = {pf, ph, pw};
    int64_t j = 0;
    for (int axis = 0; axis < 3; ++axis)
      for (int64_t k = 0; k < width[axis]; ++k, ++j)
        fill_pair(t.data<float>() + (i * pairs + j) * 2,
                  coord[axis] * std::pow(theta, -2.0 * k / (2 * width[axis])));
  }
  return t;
}

Tensor rope_1d(std::span<const int64_t> positions, std::span<const float> inv_freq) {
  const int64_t n = static_cast<int64_t>(positions.size()),
                pairs = static_cast<int64_t>(inv_freq.size());
  Tensor t({n, pairs, 2});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < pairs; ++j) {
      const float angle = static_cast<float>(positions[i]) * inv_freq[j];
      t.data<float>()[(i * pairs + j) * 2] = std::cos(angle);
      t.data<float>()[(i * pairs + j) * 2 + 1] = std::sin(angle);
    }
  return t;
}

void apply_rope_(Tensor& x, const Tensor& table, RopePairs pairs_of) {
  const int64_t B = x.dim(0), n = x.dim(1), H = x.dim(2), D = x.dim(3), pairs = D / 2;
  SEQPAR_CHECK(table.dim(0) == n && table.dim(1) == pairs, "rope table ", table.shape_str(),
               " for x ", x.shape_str());
  // Pair j is features (first + j·step, second + j·step).
  const bool halves = pairs_of == RopePairs::kHalves;
  const int64_t step = halves ? 1 : 2, second = halves ? pairs : 1;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const float* cs = table.data<float>() + i * pairs * 2;
      for (int64_t h = 0; h < H; ++h) {
        float* row = x.data<float>() + ((b * n + i) * H + h) * D;
        for (int64_t j = 0; j < pairs; ++j) {
          float& a = row[j * step];
          float& c = row[j * step + second];
          const float a0 = a, c0 = c;
          a = a0 * cs[2 * j] - c0 * cs[2 * j + 1];
          c = a0 * cs[2 * j + 1] + c0 * cs[2 * j];
        }
      }
    }
}

// ---- caches --------------------------------------------------------------------------------

namespace {
// Concatenates a (B, n, H, D) and b (B, m, H, D) along tokens.
Tensor concat_tokens(const Tensor& a, const Tensor& b) {
  if (a.empty() && a.ndim() != 4) return b;
  const int64_t B = b.dim(0), n = a.dim(1), m = b.dim(1), row = b.dim(2) * b.dim(3);
  Tensor c({B, n + m, b.dim(2), b.dim(3)});
  for (int64_t bb = 0; bb < B; ++bb) {
    std::memcpy(c.data<float>() + bb * (n + m) * row, a.data<float>() + bb * n * row,
                n * row * sizeof(float));
    std::memcpy(c.data<float>() + (bb * (n + m) + n) * row, b.data<float>() + bb * m * row,
                m * row * sizeof(float));
  }
  return c;
}
}  // namespace

void KvCache::append(const Tensor& k_new, const Tensor& v_new, std::span<const int64_t> pos) {
  k = concat_tokens(k, k_new);
  v = concat_tokens(v, v_new);
  positions.insert(positions.end(), pos.begin(), pos.end());
}

// ---- attention -------------------------------------------------------------------------------

SelfAttention SelfAttention::load(const WeightStore& ws, const std::string& name, int64_t hidden,
                                  int64_t heads, int64_t kv_heads, const ParallelContext& ctx,
                                  bool bias, bool qk_norm, const std::array<std::string, 4>& proj,
                                  int64_t head_dim) {
  SelfAttention a;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim > 0 ? head_dim : hidden / heads;
  const int t = ctx.tp_rank(), n = ctx.tp_size();
  auto [h0, h1] = tp_share(heads, t, n);
  a.h0 = h0;
  a.h1 = h1;
  // kv heads the local query heads read (a contiguous range; replicated when tp > kv_heads).
  const int64_t group = heads / kv_heads;
  a.kv0 = h0 / group;
  a.kv1 = (h1 - 1) / group + 1;
  const int64_t d = a.head_dim;
  a.q = ColumnLinear::load(ws, name + "." + proj[0], h0 * d, h1 * d, bias);
  a.k = ColumnLinear::load(ws, name + "." + proj[1], a.kv0 * d, a.kv1 * d, bias);
  a.v = ColumnLinear::load(ws, name + "." + proj[2], a.kv0 * d, a.kv1 * d, bias);
  a.o = RowLinear::load(ws, name + "." + proj[3], h0 * d, h1 * d, bias);
  a.qk_norm = qk_norm;
  if (qk_norm) {
    SEQPAR_ARG_CHECK(kv_heads % n == 0, "QK-norm needs the ", kv_heads,
                     " kv heads divisible by the tensor-parallel size ", n);
    a.norm_q = DistRmsNorm::load(ws, name + ".norm_q", h0 * d, h1 * d, heads * d, 1e-6f);
    a.norm_k = DistRmsNorm::load(ws, name + ".norm_k", a.kv0 * d, a.kv1 * d, kv_heads * d, 1e-6f);
  }
  return a;
}

SelfAttention::Qkv SelfAttention::project(const Tensor& x, const Tensor& rope,
                                          ParallelContext& ctx) const {
  const int64_t B = x.dim(0), n = x.dim(1), d = head_dim;
  Tensor qx = q.forward(x), kx = k.forward(x), vx = v.forward(x);
  if (qk_norm) {
    qx = norm_q.forward(qx, *ctx.tp);
    kx = norm_k.forward(kx, *ctx.tp);
  }
  Qkv h{reshape(std::move(qx), {B, n, h1 - h0, d}), reshape(std::move(kx), {B, n, kv1 - kv0, d}),
        reshape(std::move(vx), {B, n, kv1 - kv0, d})};
  apply_rope_(h.q, rope, rope_pairs);
  apply_rope_(h.k, rope, rope_pairs);
  return h;
}

Tensor SelfAttention::forward(const Tensor& x, const Tensor& rope, ParallelContext& ctx,
                              const SpRuntime& sp, bool causal, KvCache* cache) const {
  const int64_t B = x.dim(0), n = x.dim(1), d = head_dim;
  auto [qh, kh, vh] = project(x, rope, ctx);
  if (cache) {  // this rank's real tokens (padding is never cached)
    auto pos = sp.local_positions();
    std::vector<int64_t> keep;
    for (int64_t p : pos)
      if (p < sp.seq()) keep.push_back(p);
    const int64_t m = static_cast<int64_t>(keep.size()), row = (kv1 - kv0) * d;
    cache->k = Tensor({B, m, kv1 - kv0, d});
    cache->v = Tensor({B, m, kv1 - kv0, d});
    for (int64_t b = 0; b < B; ++b) {  // real tokens come first: padding sits at the end
      std::memcpy(cache->k.data<float>() + b * m * row, kh.data<float>() + b * n * row,
                  m * row * sizeof(float));
      std::memcpy(cache->v.data<float>() + b * m * row, vh.data<float>() + b * n * row,
                  m * row * sizeof(float));
    }
    cache->positions = std::move(keep);
  }
  AttnState s;
  if (sp.sharded()) {
    // The sequence-parallel group's view: its degrees, this tp rank's heads.
    ParallelConfig group = ctx.config;
    group.mesh = {1, 1, ctx.sp->ring_degree(), ctx.sp->ulysses_degree()};
    AttnShape shape;
    shape.batch = B;
    shape.seq = sp.seq();
    shape.heads = h1 - h0;
    shape.kv_heads = kv1 - kv0;
    shape.head_dim = d;
    shape.causal = causal;
    Placement place;
    place.part = sp.partition();
    AttnOutputs out;
    attention(group, shape, *ctx.sp, place, {qh, kh, vh}, out, nullptr,
              {ctx.cp.scale, ctx.cp.block_q, ctx.cp.block_k});
    s = {std::move(out.out), std::move(out.lse)};
  } else {
    AttnParams params;
    params.mask.causal = causal;
    s = flash_attention(qh, kh, vh, params);
  }
  return o.forward(reshape(std::move(s.out), {B, n, (h1 - h0) * d}), *ctx.tp);
}

Tensor SelfAttention::decode(const Tensor& x, const Tensor& rope, ParallelContext& ctx,
                             KvCache& cache, const KvPlacement& place, Strategy pass) const {
  const int64_t B = x.dim(0), T = x.dim(1), d = head_dim;
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
  // The group's view of the new tokens over every rank's cache.
  ParallelConfig group = ctx.config;
  group.mesh = {1, 1, sp.size(), 1};
  group.strategy = pass;
  group.schedule = ScheduleKind::kDefault;
  group.pad = false;
  group.softmax = SoftmaxMode::kOnline;
  AttnShape shape;
  shape.batch = B;
  shape.heads = h1 - h0;
  shape.kv_heads = kv1 - kv0;
  shape.head_dim = d;
  shape.causal = true;
  shape.fresh = T;
  for (const auto& kv : place.kv_pos) shape.cached += static_cast<int64_t>(kv.size());
  shape.cached -= T;
  shape.seq = shape.cached + shape.fresh;
  Placement where;
  where.over_cache = true;
  where.cache = place;
  AttnOutputs res;
  const Tensor q_mine = pick(qh, mine);
  attention(group, shape, *ctx.sp, where, {q_mine, cache.k, cache.v}, res, nullptr,
            {ctx.cp.scale, ctx.cp.block_q, ctx.cp.block_k});
  AttnState s{std::move(res.out), std::move(res.lse)};
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

CrossAttention CrossAttention::load(const WeightStore& ws, const std::string& name, int64_t hidden,
                                    int64_t heads, const ParallelContext& ctx) {
  CrossAttention a;
  a.heads = heads;
  a.head_dim = hidden / heads;
  auto [h0, h1] = tp_share(heads, ctx.tp_rank(), ctx.tp_size());
  a.h0 = h0;
  a.h1 = h1;
  const int64_t d = a.head_dim;
  a.q = ColumnLinear::load(ws, name + ".q", h0 * d, h1 * d, true);
  a.k = ColumnLinear::load(ws, name + ".k", h0 * d, h1 * d, true);
  a.v = ColumnLinear::load(ws, name + ".v", h0 * d, h1 * d, true);
  a.o = RowLinear::load(ws, name + ".o", h0 * d, h1 * d, true);
  a.norm_q = DistRmsNorm::load(ws, name + ".norm_q", h0 * d, h1 * d, hidden, 1e-6f);
  a.norm_k = DistRmsNorm::load(ws, name + ".norm_k", h0 * d, h1 * d, hidden, 1e-6f);
  return a;
}

Tensor CrossAttention::forward(const Tensor& x, const Tensor& context, ParallelContext& ctx) const {
  const int64_t B = x.dim(0), n = x.dim(1), L = context.dim(1), d = head_dim, h = h1 - h0;
  Tensor qh = reshape(norm_q.forward(q.forward(x), *ctx.tp), {B, n, h, d});
  Tensor kh = reshape(norm_k.forward(k.forward(context), *ctx.tp), {B, L, h, d});
  Tensor vh = reshape(v.forward(context), {B, L, h, d});
  AttnState s = flash_attention(qh, kh, vh);
  return o.forward(reshape(std::move(s.out), {B, n, h * d}), *ctx.tp);
}

// ---- feed-forward ----------------------------------------------------------------------------

FeedForward FeedForward::load(const WeightStore& ws, const std::string& name, int64_t inner,
                              Kind kind, const ParallelContext& ctx, bool swiglu_bias) {
  FeedForward f;
  f.kind = kind;
  auto [c0, c1] = tp_share(inner, ctx.tp_rank(), ctx.tp_size());
  if (kind == Kind::kGeluTanh) {
    f.up = ColumnLinear::load(ws, name + ".0", c0, c1, true);
    f.down = RowLinear::load(ws, name + ".2", c0, c1, true);
  } else {
    f.gate = ColumnLinear::load(ws, name + ".gate_proj", c0, c1, swiglu_bias);
    f.up = ColumnLinear::load(ws, name + ".up_proj", c0, c1, swiglu_bias);
    f.down = RowLinear::load(ws, name + ".down_proj", c0, c1, swiglu_bias);
  }
  return f;
}

Tensor FeedForward::forward(const Tensor& x, Communicator& tp) const {
  if (kind == Kind::kGeluTanh) {
    Tensor h = up.forward(x);
    gelu_tanh_(h);
    return down.forward(h, tp);
  }
  return down.forward(swiglu(gate.forward(x), up.forward(x)), tp);
}

}  // namespace seqpar
