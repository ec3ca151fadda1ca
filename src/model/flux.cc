#include "seqpar/model/flux.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "seqpar/core/param_error.h"
#include "seqpar/model/ops.h"

namespace seqpar {

namespace {
constexpr int64_t kTimeChannels = 256;  // Timesteps(num_channels=256, flip_sin_to_cos=True)
constexpr float kTimeScale = 1000.0f;   // the model's timestep · 1000 (and guidance · 1000)
constexpr float kEps = 1e-6f;           // every LayerNorm and QK RMSNorm of FLUX

AttentionSpec flux_attention(const FluxConfig& m) {
  AttentionSpec a;
  a.hidden = m.hidden;
  a.heads = a.kv_heads = m.heads;
  a.head_dim = m.head_dim;
  a.qkv_bias = a.o_bias = true;
  a.qk_norm = QkNorm::kPerHead;
  a.qk_norm_eps = kEps;
  a.rope_pairs = RopePairs::kInterleaved;  // apply_rotary_emb's (2k, 2k+1) pairs
  return a;
}

// TimestepEmbedding of diffusers' Timesteps(256, flip_sin_to_cos) of v·1000 (fp32, as the model
// scales its timestep and guidance before the sinusoid).
Tensor time_mlp(const Linear& fc1, const Linear& fc2, float v) {
  Tensor e = fc1.forward(timestep_embedding(v * kTimeScale, kTimeChannels, 1.0f));
  silu_(e);
  return fc2.forward(e);  // (d)
}
}  // namespace

AttentionSpec FluxConfig::image_attention() const {
  AttentionSpec a = flux_attention(*this);
  a.proj = {"to_q", "to_k", "to_v", "to_out.0"};
  a.norm = {"norm_q", "norm_k"};
  return a;
}

AttentionSpec FluxConfig::text_attention() const {
  AttentionSpec a = flux_attention(*this);
  a.proj = {"add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"};
  a.norm = {"norm_added_q", "norm_added_k"};
  return a;
}

AttentionSpec FluxConfig::single_attention() const {
  AttentionSpec a = flux_attention(*this);
  a.proj = {"to_q", "to_k", "to_v", ""};
  a.norm = {"norm_q", "norm_k"};
  return a;
}

Tensor flux_rope(const std::vector<float>& ids, std::array<int64_t, 3> axes, double theta) {
  const int64_t n = static_cast<int64_t>(ids.size()) / 3;
  const int64_t pairs = (axes[0] + axes[1] + axes[2]) / 2;
  // get_1d_rotary_pos_embed(freqs_dtype=float64): 1 / theta^(2k/dim), outer with the fp32 ids,
  // cos and sin in float64, then .float().
  std::vector<double> freq;
  for (int a = 0; a < 3; ++a)
    for (int64_t k = 0; k < axes[a] / 2; ++k)
      freq.push_back(1.0 /
                     std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(axes[a])));
  Tensor t({n, pairs, 2});
  float* cs = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t p = 0;
    for (int a = 0; a < 3; ++a) {
      const double pos = static_cast<double>(ids[i * 3 + a]);
      for (int64_t k = 0; k < axes[a] / 2; ++k, ++p) {
        const double angle = pos * freq[p];
        cs[(i * pairs + p) * 2] = static_cast<float>(std::cos(angle));
        cs[(i * pairs + p) * 2 + 1] = static_cast<float>(std::sin(angle));
      }
    }
  }
  return t;
}

std::vector<WeightStore::Spec> Flux::parameters(const FluxConfig& m) {
  const int64_t d = m.hidden;
  std::vector<WeightStore::Spec> p = {
      {"x_embedder.weight", {d, m.in_channels}},
      {"x_embedder.bias", {d}, 0},
      {"context_embedder.weight", {d, m.text_dim}},
      {"context_embedder.bias", {d}, 0},
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    p.push_back({name + ".weight", {out, in}});
    p.push_back({name + ".bias", {out}, 0});
  };
  const std::string te = "time_text_embed.";
  linear(te + "timestep_embedder.linear_1", d, kTimeChannels);
  linear(te + "timestep_embedder.linear_2", d, d);
  if (m.guidance_embeds) {
    linear(te + "guidance_embedder.linear_1", d, kTimeChannels);
    linear(te + "guidance_embedder.linear_2", d, d);
  }
  linear(te + "text_embedder.linear_1", d, m.pooled_dim);
  linear(te + "text_embedder.linear_2", d, d);
  auto append = [&](std::vector<WeightStore::Spec> more) {
    p.insert(p.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  };
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    linear(b + "norm1.linear", 6 * d, d);
    linear(b + "norm1_context.linear", 6 * d, d);
    append(m.image_attention().parameters(b + "attn", 0.02f, 0));
    append(m.text_attention().parameters(b + "attn", 0.02f, 0));
    for (const char* ff : {"ff", "ff_context"})
      append(FeedForward::parameters(b + ff, FeedForward::Kind::kGeluTanh, d, m.ffn_dim, true, 0));
  }
  for (int64_t i = 0; i < m.single_layers; ++i) {
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".";
    linear(b + "norm.linear", 3 * d, d);
    append(m.single_attention().parameters(b + "attn", 0.02f, 0));
    linear(b + "proj_mlp", m.ffn_dim, d);
    linear(b + "proj_out", d, d + m.ffn_dim);
  }
  linear("norm_out.linear", 2 * d, d);
  linear("proj_out", m.out_features(), d);
  return p;
}

const SpPlan& Flux::sp_plan() {
  static const SpPlan plan = {
      {"x_embedder", SpAction::kShard, {"hidden", "rope"}},
      {"proj_out", SpAction::kGather, {"hidden"}},
  };  // the text rows are split by forward() itself: they are never gathered
  return plan;
}

Flux::Flux(const FluxConfig& m, const WeightStore& ws, const ParallelContext& ctx)
    : m_(m), activations_(ws.activations()) {
  const int tp = ctx.tp_size();
  SEQPAR_PARAM_CHECK(m.heads % tp == 0, "tp", "", param("tp"), " ", tp, " does not divide the ",
                     m.heads, " heads of ", m.name);
  SEQPAR_PARAM_CHECK(m.ffn_dim % tp == 0, "tp", "", param("tp"), " ", tp, " does not divide the ",
                     m.ffn_dim, " MLP columns of ", m.name);
  const auto [h0, h1] = tp_share(m.heads, ctx.tp_rank(), tp);
  h0_ = h0;
  h1_ = h1;
  x_embedder_ = Linear::load(ws, "x_embedder", true);
  context_embedder_ = Linear::load(ws, "context_embedder", true);
  const std::string te = "time_text_embed.";
  time_fc1_ = Linear::load(ws, te + "timestep_embedder.linear_1", true);
  time_fc2_ = Linear::load(ws, te + "timestep_embedder.linear_2", true);
  if (m.guidance_embeds) {
    guidance_fc1_ = Linear::load(ws, te + "guidance_embedder.linear_1", true);
    guidance_fc2_ = Linear::load(ws, te + "guidance_embedder.linear_2", true);
  }
  text_fc1_ = Linear::load(ws, te + "text_embedder.linear_1", true);
  text_fc2_ = Linear::load(ws, te + "text_embedder.linear_2", true);
  norm_out_ = Linear::load(ws, "norm_out.linear", true);
  proj_out_ = Linear::load(ws, "proj_out", true);
  const int64_t d = m.hidden, D = m.head_dim;
  auto [m0, m1] = tp_share(6 * d, ctx.tp_rank(), tp);
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    DoubleBlock blk;
    blk.mod_image = ColumnLinear::load(ws, b + "norm1.linear", m0, m1, true);
    blk.mod_text = ColumnLinear::load(ws, b + "norm1_context.linear", m0, m1, true);
    blk.attn = JointAttention::load(ws, b + "attn", m.image_attention(), m.text_attention(), ctx);
    blk.ff = FeedForward::load(ws, b + "ff", FeedForward::Kind::kGeluTanh, m.ffn_dim, true, ctx);
    blk.ff_context =
        FeedForward::load(ws, b + "ff_context", FeedForward::Kind::kGeluTanh, m.ffn_dim, true, ctx);
    blocks_.push_back(std::move(blk));
  }
  auto [s0, s1] = tp_share(3 * d, ctx.tp_rank(), tp);
  auto [f0, f1] = tp_share(m.ffn_dim, ctx.tp_rank(), tp);
  for (int64_t i = 0; i < m.single_layers; ++i) {
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".";
    SingleBlock s;
    s.mod = ColumnLinear::load(ws, b + "norm.linear", s0, s1, true);
    s.attn = StreamProjections::load(ws, b + "attn", m.single_attention(), h0_, h1_);
    s.proj_mlp = ColumnLinear::load(ws, b + "proj_mlp", f0, f1, true);
    // proj_out (hidden, hidden + ffn): its input is concat(attn, mlp); this rank holds the
    // attention columns of its heads and its MLP columns, reduced over tp.
    s.out_attn = ws.cols(b + "proj_out.weight", h0_ * D, h1_ * D);
    s.out_mlp = ws.cols(b + "proj_out.weight", d + f0, d + f1);
    s.out_b = ws.get(b + "proj_out.bias").to(DType::kF32);
    singles_.push_back(std::move(s));
  }
}

std::vector<float> Flux::modulation(const ColumnLinear& mod, int64_t rows, const Tensor& temb_act,
                                    Communicator& tp) const {
  const Tensor mine = mod.forward(temb_act);  // this rank's rows
  std::vector<float> all(rows);
  if (tp.size() == 1) {
    std::copy_n(mine.data<float>(), mine.numel(), all.data());
  } else {
    tp.all_gather(mine.raw(), mine.nbytes(), all.data());
  }
  return all;
}

Tensor Flux::single_out(const SingleBlock& s, const Tensor& attn, const Tensor& mlp,
                        Communicator& tp) const {
  Tensor y = linear(attn, s.out_attn, Tensor(), Tensor(), activations_);
  add_(y, linear(mlp, s.out_mlp, Tensor(), Tensor(), activations_));
  if (tp.size() > 1) tp.all_reduce(std::span<float>(y.data<float>(), y.numel()), ReduceOp::kSum);
  const int64_t n = s.out_b.numel(), rows = y.numel() / n;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y.data<float>()[r * n + i] += s.out_b.data<float>()[i];
  return y;
}

Tensor Flux::forward(const Tensor& hidden, const std::vector<float>& img_ids, const Tensor& text,
                     const std::vector<float>& txt_ids, const float* pooled, float t,
                     float guidance, ParallelContext& ctx) const {
  const int64_t d = m_.hidden, S = hidden.dim(1), D = m_.head_dim;
  SpRuntime sp(sp_plan(), ctx, S);

  // The image tokens sharded from the start: x_embedder on this rank's n rows only. On every
  // rank: the conditioning and the RoPE tables.
  Tensor x = x_embedder_.forward(sp.at("x_embedder", "hidden", hidden));  // (1, n, d)
  // temb = (timestep_emb [+ guidance_emb]) + text_embedder(pooled), in diffusers' order.
  Tensor temb = time_mlp(time_fc1_, time_fc2_, t);
  if (m_.guidance_embeds) add_(temb, time_mlp(guidance_fc1_, guidance_fc2_, guidance));
  Tensor pooled_row({1, m_.pooled_dim});
  std::copy_n(pooled, m_.pooled_dim, pooled_row.data<float>());
  Tensor pe = text_fc1_.forward(pooled_row);
  silu_(pe);
  add_(temb, text_fc2_.forward(pe));
  Tensor temb_act = reshape(temb, {1, d});
  silu_(temb_act);
  const Tensor rope_text = flux_rope(txt_ids, m_.axes_dims);
  Tensor rope_image = reshape(flux_rope(img_ids, m_.axes_dims), {1, S, D});

  rope_image = sp.at("x_embedder", "rope", std::move(rope_image));
  const int64_t n = x.dim(1);
  rope_image = reshape(std::move(rope_image), {n, D / 2, 2});

  // The text rows are split over the sequence-parallel group as well: rank r of N embeds and
  // carries text rows [r·L/N, (r+1)·L/N) only (norms, q/k/v, output projections, FFN and MLP of
  // those rows), and every block all-gathers the text q/k/v, so each text key enters the joint
  // attention once; each rank reads its rows of the attention's text output (which the joint path
  // gives every rank). Nothing after the blocks reads the text, so it is never gathered back.
  const int64_t h = h1_ - h0_, L = text.dim(1);
  Communicator& group = ctx.sp->sp();
  const int N = sp.sharded() ? group.size() : 1, r = sp.sharded() ? group.rank() : 0;
  const int64_t t0 = L * r / N, t1 = L * (r + 1) / N, nt = t1 - t0;
  std::vector<size_t> qkv_counts(N);  // bytes of each rank's text q (k, v) rows
  for (int i = 0; i < N; ++i)
    qkv_counts[i] = static_cast<size_t>(L * (i + 1) / N - L * i / N) * h * D * sizeof(float);
  Tensor c, rope_c;  // this rank's text rows (1, nt, d) and their RoPE rows; none when nt = 0
  if (nt > 0) {
    const int64_t td = text.dim(2);
    c = context_embedder_.forward(
        N == 1 ? text : reshape(slice_rows(reshape(text, {L, td}), t0, t1), {1, nt, td}));
    rope_c = N == 1 ? rope_text : slice_rows(rope_text, t0, t1);
    expect_finite(c, "context_embedder");
  }
  // The text q, k, v of the whole text (1, L, h, D) from each rank's rows (1, nt, h, D).
  auto gather_text = [&](StreamQkv mine) {
    if (N == 1) return mine;
    auto gather = [&](const Tensor& t) {
      Tensor all({1, L, h, D});
      group.all_gatherv(nt ? t.raw() : nullptr, all.raw(), qkv_counts);
      return all;
    };
    return StreamQkv{gather(mine.q), gather(mine.k), gather(mine.v)};
  };
  // This rank's rows (1, nt, h·D) of the attention's text output (1, L, h·D).
  auto own_text = [&](const Tensor& t) {
    return N == 1 ? t : reshape(slice_rows(reshape(t, {L, h * D}), t0, t1), {1, nt, h * D});
  };

  expect_finite(x, "x_embedder");
  expect_finite(temb, "time_text_embed");

  const LayerNorm plain = LayerNorm::plain(kEps);
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const DoubleBlock& blk = blocks_[b];
    const JointAttention& at = blk.attn;
    // AdaLayerNormZero: shift, scale, gate of the attention, then shift, scale, gate of the FFN.
    const std::vector<float> mi = modulation(blk.mod_image, 6 * d, temb_act, *ctx.tp);
    const std::vector<float> mt = modulation(blk.mod_text, 6 * d, temb_act, *ctx.tp);
    Tensor xi = plain.forward(x);
    modulate_(xi, &mi[0], &mi[d]);
    const StreamQkv img = project_stream(at.image, at.image_spec, h, xi, rope_image, *ctx.tp);
    StreamQkv txt;
    if (nt > 0) {
      Tensor ct = plain.forward(c);
      modulate_(ct, &mt[0], &mt[d]);
      txt = project_stream(at.text, at.text_spec, h, ct, rope_c, *ctx.tp);
    }
    const JointAttention::Result a = joint_attend(img, gather_text(std::move(txt)), ctx, sp);
    gated_add_(x, &mi[2 * d], at.image.o.forward(a.image, *ctx.tp));
    expect_finite(x, "transformer_blocks", b, "attn's residual add");
    xi = plain.forward(x);
    modulate_(xi, &mi[3 * d], &mi[4 * d]);
    gated_add_(x, &mi[5 * d], blk.ff.forward(xi, *ctx.tp));
    expect_finite(x, "transformer_blocks", b, "ff's residual add");
    if (nt == 0) continue;
    gated_add_(c, &mt[2 * d], at.text.o.forward(own_text(a.text), *ctx.tp));
    Tensor ct = plain.forward(c);
    modulate_(ct, &mt[3 * d], &mt[4 * d]);
    gated_add_(c, &mt[5 * d], blk.ff_context.forward(ct, *ctx.tp));
    expect_finite(c, "transformer_blocks", b, "ff_context's residual add");
  }

  // Single-stream blocks over [text, image]: one set of weights for every token, the image rows
  // and this rank's text rows each through the same norm, q/k/v, MLP and proj_out.
  const AttentionSpec spec = m_.single_attention();
  const int64_t last = static_cast<int64_t>(singles_.size()) - 1;
  for (int64_t b = 0; b <= last; ++b) {
    const SingleBlock& s = singles_[b];
    const std::vector<float> ms =
        modulation(s.mod, 3 * d, temb_act, *ctx.tp);  // shift, scale, gate
    Tensor xi = plain.forward(x);
    modulate_(xi, &ms[0], &ms[d]);
    const StreamQkv img = project_stream(s.attn, spec, h, xi, rope_image, *ctx.tp);
    Tensor ct;
    StreamQkv txt;
    if (nt > 0) {
      ct = plain.forward(c);
      modulate_(ct, &ms[0], &ms[d]);
      txt = project_stream(s.attn, spec, h, ct, rope_c, *ctx.tp);
    }
    const JointAttention::Result a = joint_attend(img, gather_text(std::move(txt)), ctx, sp);
    Tensor mlp_i = s.proj_mlp.forward(xi);
    gelu_tanh_(mlp_i);
    gated_add_(x, &ms[2 * d], single_out(s, a.image, mlp_i, *ctx.tp));
    expect_finite(x, "single_transformer_blocks", b, "proj_out's residual add");
    if (b == last || nt == 0) continue;  // the last block's text rows reach nothing
    Tensor mlp_t = s.proj_mlp.forward(ct);
    gelu_tanh_(mlp_t);
    gated_add_(c, &ms[2 * d], single_out(s, own_text(a.text), mlp_t, *ctx.tp));
    expect_finite(c, "single_transformer_blocks", b, "proj_out's residual add (text)");
  }

  // AdaLayerNormContinuous: scale, then shift.
  const Tensor so = norm_out_.forward(temb_act);
  Tensor y = plain.forward(x);
  modulate_(y, so.data<float>() + d, so.data<float>());
  y = proj_out_.forward(y);  // (1, n, p·p·C)
  expect_finite(y, "proj_out");
  return sp.at("proj_out", "hidden", std::move(y));
}

}  // namespace seqpar
