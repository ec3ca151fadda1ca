#include "seqpar/model/dit.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "seqpar/core/param_error.h"
#include "seqpar/model/ops.h"

namespace seqpar {

namespace {
constexpr double kRopeTheta = 10000.0;
constexpr float kImageNormEps = 1e-5f;   // img_emb's LayerNorms: torch's default eps
constexpr int64_t kI2vTextTokens = 512;  // diffusers: the last 512 context tokens are the text

// x · Φ(x), the exact (erf) GELU of img_emb's MLP, in place.
void gelu_erf_(Tensor& x) {
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i)
    p[i] = 0.5f * p[i] * (1.0f + std::erf(p[i] * static_cast<float>(M_SQRT1_2)));
}
}  // namespace

AttentionSpec DiTConfig::attention() const {
  AttentionSpec a;
  a.hidden = hidden;
  a.heads = a.kv_heads = heads;
  a.head_dim = head_dim;
  a.qkv_bias = a.o_bias = true;
  a.qk_norm = QkNorm::kAcrossHeads;
  a.qk_norm_eps = static_cast<float>(eps);
  a.rope_pairs = RopePairs::kInterleaved;
  return a;  // names q, k, v, o, norm_q, norm_k
}

std::vector<WeightStore::Spec> DiT::parameters(const DiTConfig& m) {
  const int64_t d = m.hidden, P = m.patch[0] * m.patch[1] * m.patch[2], pv = m.in_channels * P,
                pout = m.predicted_channels() * P;
  std::vector<WeightStore::Spec> p = {
      {"patch_embedding.weight", {d, pv}},     {"patch_embedding.bias", {d}, 0},
      {"text_embedding.0.weight", {d, m.text_dim}}, {"text_embedding.0.bias", {d}, 0},
      {"text_embedding.2.weight", {d, d}},     {"text_embedding.2.bias", {d}, 0},
      {"time_embedding.0.weight", {d, m.freq_dim}}, {"time_embedding.0.bias", {d}, 0},
      {"time_embedding.2.weight", {d, d}},     {"time_embedding.2.bias", {d}, 0},
      {"time_projection.1.weight", {6 * d, d}}, {"time_projection.1.bias", {6 * d}, 0},
  };
  const int64_t img = m.image_dim;
  if (img > 0) {  // Wan's MLPProj: LayerNorm, Linear, GELU, Linear, LayerNorm
    p.push_back({"img_emb.proj.0.weight", {img}, -1});
    p.push_back({"img_emb.proj.0.bias", {img}, 0});
    p.push_back({"img_emb.proj.1.weight", {img, img}});
    p.push_back({"img_emb.proj.1.bias", {img}, 0});
    p.push_back({"img_emb.proj.3.weight", {d, img}});
    p.push_back({"img_emb.proj.3.bias", {d}, 0});
    p.push_back({"img_emb.proj.4.weight", {d}, -1});
    p.push_back({"img_emb.proj.4.bias", {d}, 0});
  }
  auto append = [&](std::vector<WeightStore::Spec> more) {
    p.insert(p.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  };
  const AttentionSpec attention = m.attention();
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    p.push_back({b + "modulation", {6, d}});
    append(attention.parameters(b + "self_attn", 0.02f, 0));
    append(attention.parameters(b + "cross_attn", 0.02f, 0));
    if (img > 0) {  // Wan's WanI2VCrossAttention: K/V of the image context, its K's RMSNorm
      p.push_back({b + "cross_attn.k_img.weight", {d, d}});
      p.push_back({b + "cross_attn.k_img.bias", {d}, 0});
      p.push_back({b + "cross_attn.v_img.weight", {d, d}});
      p.push_back({b + "cross_attn.v_img.bias", {d}, 0});
      p.push_back({b + "cross_attn.norm_k_img.weight", {d}, -1});
    }
    if (m.cross_attn_norm) {
      p.push_back({b + "norm3.weight", {d}, -1});
      p.push_back({b + "norm3.bias", {d}, 0});
    }
    append(FeedForward::parameters(b + "ffn", FeedForward::Kind::kGeluTanh, d, m.ffn_dim, true, 0));
  }
  p.push_back({"head.modulation", {2, d}});
  p.push_back({"head.head.weight", {pout, d}});
  p.push_back({"head.head.bias", {pout}, 0});
  return p;
}

const SpPlan& DiT::sp_plan() {
  static const SpPlan plan = {
      {"blocks.0", SpAction::kShard, {"hidden", "rope"}},
      {"proj_out", SpAction::kGather, {"hidden"}},
      {"text_embedding", SpAction::kReplicate, {"context"}},
      {"img_emb", SpAction::kReplicate, {"image_context"}},
  };
  return plan;
}

DiT::DiT(const DiTConfig& m, const WeightStore& ws, const ParallelContext& ctx) : m_(m) {
  SEQPAR_PARAM_CHECK(m.family == ModelFamily::kDiT, "model", "", param("model"), " ", m.name,
                     " is not a DiT");
  SEQPAR_PARAM_CHECK(m.heads % ctx.tp_size() == 0, "tp", "", param("tp"), " ", ctx.tp_size(),
                     " does not divide the ", m.heads, " heads of ", m.name);
  const float eps = static_cast<float>(m.eps);
  patch_embedding_ = PatchEmbedding::load(ws, "patch_embedding", m.patch);
  text_in_ = Linear::load(ws, "text_embedding.0", true);
  text_out_ = Linear::load(ws, "text_embedding.2", true);
  time_embedding_ = TimestepEmbedding::load(ws, "time_embedding.0", "time_embedding.2", m.freq_dim);
  time_projection_ = Linear::load(ws, "time_projection.1", true);
  if (m.image_dim > 0) {
    image_norm_in_ = LayerNorm::load(ws, "img_emb.proj.0", kImageNormEps);
    image_in_ = Linear::load(ws, "img_emb.proj.1", true);
    image_out_ = Linear::load(ws, "img_emb.proj.3", true);
    image_norm_out_ = LayerNorm::load(ws, "img_emb.proj.4", kImageNormEps);
  }
  const AttentionSpec attention = m.attention();
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    Block blk;
    blk.modulation = Modulation::load(ws, b + "modulation", 6, m.hidden);
    blk.self_attn = SelfAttention::load(ws, b + "self_attn", attention, ctx);
    blk.cross_attn = CrossAttention::load(ws, b + "cross_attn", attention, ctx, m.image_dim > 0);
    blk.norm3 = m.cross_attn_norm ? LayerNorm::load(ws, b + "norm3", eps) : LayerNorm::plain(eps);
    blk.ffn = FeedForward::load(ws, b + "ffn", FeedForward::Kind::kGeluTanh, m.ffn_dim, true, ctx);
    blocks_.push_back(std::move(blk));
  }
  head_modulation_ = Modulation::load(ws, "head.modulation", 2, m.hidden);
  head_ = Linear::load(ws, "head.head", true);
}

Tensor DiT::forward(const Tensor& latent, float t, const Tensor& text, ParallelContext& ctx,
                    const Tensor& image) const {
  const int64_t d = m_.hidden;
  const bool i2v = m_.image_dim > 0;
  SEQPAR_ARG_CHECK(i2v || image.empty(), "encoder_hidden_states_image is given; ", m_.name,
                   " is a text-to-video model (no image_dim)");
  SEQPAR_ARG_CHECK(!i2v || !image.empty(), "encoder_hidden_states_image is missing; ", m_.name,
                   " is an image-to-video model: expected (B, 257, ", m_.image_dim, ")");
  SEQPAR_ARG_CHECK(!i2v || (image.ndim() == 3 && image.dim(0) == latent.dim(0) &&
                            image.dim(1) >= 1 && image.dim(2) == m_.image_dim),
                   "encoder_hidden_states_image has shape ", image.shape_str(), "; expected (",
                   latent.dim(0), ", 257, ", m_.image_dim, ")");
  SEQPAR_ARG_CHECK(!i2v || (text.ndim() == 3 && text.dim(1) == kI2vTextTokens),
                   "encoder_hidden_states has ", text.dim(1),
                   " tokens; an image-to-video model takes ", kI2vTextTokens,
                   " (the text padded as the pipelines pad it: diffusers reads the last 512 "
                   "context tokens as the text)");
  SEQPAR_ARG_CHECK(latent.ndim() == 5 && latent.dim(1) == m_.in_channels,
                   "latent must be (B, ", m_.in_channels, ", F, H, W); got ", latent.shape_str());
  SEQPAR_ARG_CHECK(latent.dim(2) % m_.patch[0] == 0 && latent.dim(3) % m_.patch[1] == 0 &&
                       latent.dim(4) % m_.patch[2] == 0,
                   "latent ", latent.shape_str(), ": frames, height and width must be multiples "
                   "of the patch ", m_.patch[0], "x", m_.patch[1], "x", m_.patch[2]);
  const std::array<int64_t, 3> grid = {latent.dim(2) / m_.patch[0], latent.dim(3) / m_.patch[1],
                                       latent.dim(4) / m_.patch[2]};
  const int64_t S = grid[0] * grid[1] * grid[2];
  SpRuntime sp(sp_plan(), ctx, S);

  // Replicated on every rank: patch embedding, timestep and text embeddings, the RoPE table.
  Tensor x = patch_embedding_.forward(latent);  // (B, S, d)
  const Tensor e = time_embedding_.forward(t);  // (d)
  Tensor e_act = e;
  silu_(e_act);
  const Tensor e6 = time_projection_.forward(e_act);  // (6d): shift, scale, gate for attn and ffn
  Tensor context = text_in_.forward(text);
  gelu_tanh_(context);
  context = sp.at("text_embedding", "context", text_out_.forward(context));
  // diffusers splits [image; text] at L − 512: with 512 text tokens, exactly the image states.
  Tensor image_context;
  if (i2v) {
    image_context = image_in_.forward(image_norm_in_.forward(image));
    gelu_erf_(image_context);
    image_context = image_norm_out_.forward(image_out_.forward(image_context));
    image_context = sp.at("img_emb", "image_context", std::move(image_context));
    expect_finite(image_context, "img_emb");
  }
  std::vector<int64_t> all_pos(S);
  for (int64_t i = 0; i < S; ++i) all_pos[i] = i;
  Tensor rope = reshape(rope_3d(all_pos, grid, m_.head_dim, kRopeTheta), {1, S, m_.head_dim});

  x = sp.at("blocks.0", "hidden", std::move(x));
  rope = sp.at("blocks.0", "rope", std::move(rope));
  const int64_t n = x.dim(1);
  rope = reshape(std::move(rope), {n, m_.head_dim / 2, 2});

  expect_finite(x, "patch_embedding");
  expect_finite(e6, "time_projection");
  expect_finite(context, "text_embedding");

  const LayerNorm plain = LayerNorm::plain(static_cast<float>(m_.eps));
  for (int64_t b = 0; b < static_cast<int64_t>(blocks_.size()); ++b) {
    const Block& blk = blocks_[b];
    const std::vector<float> mod = blk.modulation.rows(e6);
    const float *shift_msa = &mod[0], *scale_msa = &mod[d], *gate_msa = &mod[2 * d],
                *shift_mlp = &mod[3 * d], *scale_mlp = &mod[4 * d], *gate_mlp = &mod[5 * d];
    Tensor y = plain.forward(x);
    modulate_(y, shift_msa, scale_msa);
    expect_finite(y, "blocks", b, "norm1");
    const Tensor a = blk.self_attn.forward(y, rope, ctx, sp, false, nullptr);
    expect_finite(a, "blocks", b, "self_attn");
    gated_add_(x, gate_msa, a);
    expect_finite(x, "blocks", b, "self_attn's residual add");
    const Tensor c = blk.cross_attn.forward(blk.norm3.forward(x), context, ctx, image_context);
    expect_finite(c, "blocks", b, "cross_attn");
    add_(x, c);
    expect_finite(x, "blocks", b, "cross_attn's residual add");
    y = plain.forward(x);
    modulate_(y, shift_mlp, scale_mlp);
    expect_finite(y, "blocks", b, "norm2");
    const Tensor f = blk.ffn.forward(y, *ctx.tp);
    expect_finite(f, "blocks", b, "ffn");
    gated_add_(x, gate_mlp, f);
    expect_finite(x, "blocks", b, "ffn's residual add");
  }

  const std::vector<float> hmod = head_modulation_.rows(e);  // shift, scale
  Tensor y = plain.forward(x);
  modulate_(y, &hmod[0], &hmod[d]);
  y = head_.forward(y);  // (B, n, C·pt·ph·pw)
  expect_finite(y, "proj_out");
  y = sp.at("proj_out", "hidden", std::move(y));
  return unpatchify(y, m_.predicted_channels(), grid, m_.patch);
}

std::array<Tensor, 2> DiT::branches(const Tensor& latent, float t, const Tensor& text,
                                    const Tensor& null_text, ParallelContext& ctx,
                                    const Tensor& image) const {
  return cfg_branches(
      *ctx.cfg, [&](int i) { return forward(latent, t, i == 0 ? text : null_text, ctx, image); });
}

Tensor DiT::guided(const Tensor& latent, float t, const Tensor& text, const Tensor& null_text,
                   float guidance, ParallelContext& ctx, const Tensor& image) const {
  auto [cond, uncond] = branches(latent, t, text, null_text, ctx, image);
  for (int64_t i = 0; i < cond.numel(); ++i)
    cond.data<float>()[i] =
        uncond.data<float>()[i] + guidance * (cond.data<float>()[i] - uncond.data<float>()[i]);
  return cond;
}

Tensor DiT::sample(Tensor latent, int steps, const Tensor& text, const Tensor& null_text,
                   float guidance, ParallelContext& ctx) const {
  SEQPAR_PARAM_CHECK(steps >= 1, "steps", "", param("steps"), " ", steps,
                     " is invalid; it must be at least 1");
  for (int i = 0; i < steps; ++i) {
    const float sigma = 1.0f - static_cast<float>(i) / steps;
    const float next = 1.0f - static_cast<float>(i + 1) / steps;
    Tensor v = guided(latent, 1000.0f * sigma, text, null_text, guidance, ctx);
    for (int64_t j = 0; j < latent.numel(); ++j)
      latent.data<float>()[j] += (next - sigma) * v.data<float>()[j];
  }
  return latent;
}

}  // namespace seqpar
