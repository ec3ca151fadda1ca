#include "seqpar/model/dit.h"

#include <cstring>
#include <string>

#include "seqpar/model/ops.h"

namespace seqpar {

namespace {
constexpr double kRopeTheta = 10000.0;
// A replicated linear weight, whole, in its stored dtype (linear() converts bf16/fp16 per block).
Tensor stored_weight(const WeightStore& ws, const std::string& name) {
  return ws.rows(name, 0, ws.shape(name).at(0));
}
int64_t out_channels(const ModelPreset& m) {
  return m.out_channels ? m.out_channels : m.in_channels;
}
}  // namespace

std::vector<WeightStore::Spec> DiT::parameters(const ModelPreset& m) {
  const int64_t d = m.hidden, P = m.patch[0] * m.patch[1] * m.patch[2], pv = m.in_channels * P,
                pout = out_channels(m) * P;
  std::vector<WeightStore::Spec> p = {
      {"patch_embedding.weight", {d, pv}},     {"patch_embedding.bias", {d}, 0},
      {"text_embedding.0.weight", {d, m.text_dim}}, {"text_embedding.0.bias", {d}, 0},
      {"text_embedding.2.weight", {d, d}},     {"text_embedding.2.bias", {d}, 0},
      {"time_embedding.0.weight", {d, m.freq_dim}}, {"time_embedding.0.bias", {d}, 0},
      {"time_embedding.2.weight", {d, d}},     {"time_embedding.2.bias", {d}, 0},
      {"time_projection.1.weight", {6 * d, d}}, {"time_projection.1.bias", {6 * d}, 0},
  };
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    p.push_back({b + "modulation", {6, d}});
    for (const char* attn : {"self_attn", "cross_attn"}) {
      for (const char* w : {"q", "k", "v", "o"}) {
        p.push_back({b + attn + "." + w + ".weight", {d, d}});
        p.push_back({b + attn + "." + w + ".bias", {d}, 0});
      }
      p.push_back({b + attn + ".norm_q.weight", {d}, -1});
      p.push_back({b + attn + ".norm_k.weight", {d}, -1});
    }
    if (m.cross_attn_norm) {
      p.push_back({b + "norm3.weight", {d}, -1});
      p.push_back({b + "norm3.bias", {d}, 0});
    }
    p.push_back({b + "ffn.0.weight", {m.ffn_dim, d}});
    p.push_back({b + "ffn.0.bias", {m.ffn_dim}, 0});
    p.push_back({b + "ffn.2.weight", {d, m.ffn_dim}});
    p.push_back({b + "ffn.2.bias", {d}, 0});
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
  };
  return plan;
}

DiT::DiT(const ModelPreset& m, const WeightStore& ws, const ParallelContext& ctx) : m_(m) {
  SEQPAR_ARG_CHECK(m.family == ModelFamily::kDiT, "model ", m.name, " is not a DiT");
  SEQPAR_ARG_CHECK(m.heads % ctx.tp_size() == 0, "--tp ", ctx.tp_size(), " does not divide the ",
                   m.heads, " heads of ", m.name);
  patch_w = stored_weight(ws, "patch_embedding.weight");
  patch_b = ws.get("patch_embedding.bias");
  for (int i : {0, 2}) {
    text_w.push_back(stored_weight(ws, "text_embedding." + std::to_string(i) + ".weight"));
    text_b.push_back(ws.get("text_embedding." + std::to_string(i) + ".bias"));
    time_w.push_back(stored_weight(ws, "time_embedding." + std::to_string(i) + ".weight"));
    time_b.push_back(ws.get("time_embedding." + std::to_string(i) + ".bias"));
  }
  proj_w = stored_weight(ws, "time_projection.1.weight");
  proj_b = ws.get("time_projection.1.bias");
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    Block blk;
    blk.modulation = ws.get(b + "modulation");
    blk.self_attn = SelfAttention::load(ws, b + "self_attn", m.hidden, m.heads, m.heads, ctx,
                                        true, true, {"q", "k", "v", "o"});
    blk.cross_attn = CrossAttention::load(ws, b + "cross_attn", m.hidden, m.heads, ctx);
    for (DistRmsNorm* n : {&blk.self_attn.norm_q, &blk.self_attn.norm_k, &blk.cross_attn.norm_q,
                           &blk.cross_attn.norm_k})
      n->eps = static_cast<float>(m.eps);
    if (m.cross_attn_norm) {
      blk.norm3_w = ws.get(b + "norm3.weight");
      blk.norm3_b = ws.get(b + "norm3.bias");
    }
    blk.ffn = FeedForward::load(ws, b + "ffn", m.ffn_dim, FeedForward::Kind::kGeluTanh, ctx);
    blocks_.push_back(std::move(blk));
  }
  head_mod = ws.get("head.modulation");
  head_w = stored_weight(ws, "head.head.weight");
  head_b = ws.get("head.head.bias");
}

Tensor patchify(const Tensor& latent, std::array<int64_t, 3> patch) {
  const int64_t B = latent.dim(0), C = latent.dim(1), F = latent.dim(2), H = latent.dim(3),
                W = latent.dim(4);
  const int64_t gf = F / patch[0], gh = H / patch[1], gw = W / patch[2];
  const int64_t pv = C * patch[0] * patch[1] * patch[2];
  Tensor t({B, gf * gh * gw, pv});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < gf; ++f)
      for (int64_t y = 0; y < gh; ++y)
        for (int64_t x = 0; x < gw; ++x) {
          float* dst = t.data<float>() + ((b * gf + f) * gh * gw + y * gw + x) * pv;
          int64_t j = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t df = 0; df < patch[0]; ++df)
              for (int64_t dy = 0; dy < patch[1]; ++dy)
                for (int64_t dx = 0; dx < patch[2]; ++dx, ++j)
                  dst[j] = latent.data<float>()[(((b * C + c) * F + f * patch[0] + df) * H +
                                                 y * patch[1] + dy) * W + x * patch[2] + dx];
        }
  return t;
}

Tensor unpatchify(const Tensor& tokens, int64_t C, std::array<int64_t, 3> grid,
                  std::array<int64_t, 3> patch) {
  const int64_t B = tokens.dim(0), F = grid[0] * patch[0], H = grid[1] * patch[1],
                W = grid[2] * patch[2];
  const int64_t pv = C * patch[0] * patch[1] * patch[2];
  Tensor latent({B, C, F, H, W});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < grid[0]; ++f)
      for (int64_t y = 0; y < grid[1]; ++y)
        for (int64_t x = 0; x < grid[2]; ++x) {
          const float* src =
              tokens.data<float>() + ((b * grid[0] + f) * grid[1] * grid[2] + y * grid[2] + x) * pv;
          int64_t j = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t df = 0; df < patch[0]; ++df)
              for (int64_t dy = 0; dy < patch[1]; ++dy)
                for (int64_t dx = 0; dx < patch[2]; ++dx, ++j)
                  latent.data<float>()[(((b * C + c) * F + f * patch[0] + df) * H + y * patch[1] +
                                        dy) * W + x * patch[2] + dx] = src[j];
        }
  return latent;
}

Tensor DiT::forward(const Tensor& latent, float t, const Tensor& text, ParallelContext& ctx) const {
  const int64_t d = m_.hidden;
  const float eps = static_cast<float>(m_.eps);
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
  Tensor x = linear(patchify(latent, m_.patch), patch_w, patch_b);  // (B, S, d)
  Tensor e = linear(timestep_embedding(t, m_.freq_dim), time_w[0], time_b[0]);
  silu_(e);
  e = linear(e, time_w[1], time_b[1]);  // (d)
  Tensor e_act = e;
  silu_(e_act);
  Tensor e6 = linear(e_act, proj_w, proj_b);  // (6d): shift, scale, gate for attn and ffn
  Tensor context = linear(text, text_w[0], text_b[0]);
  gelu_tanh_(context);
  context = sp.at("text_embedding", "context", linear(context, text_w[1], text_b[1]));
  std::vector<int64_t> all_pos(S);
  for (int64_t i = 0; i < S; ++i) all_pos[i] = i;
  Tensor rope = reshape(rope_3d(all_pos, grid, m_.head_dim, kRopeTheta), {1, S, m_.head_dim});

  x = sp.at("blocks.0", "hidden", std::move(x));
  rope = sp.at("blocks.0", "rope", std::move(rope));
  const int64_t n = x.dim(1);
  rope = reshape(std::move(rope), {n, m_.head_dim / 2, 2});

  for (const Block& blk : blocks_) {
    std::vector<float> mod(6 * d);
    for (int64_t i = 0; i < 6 * d; ++i) mod[i] = blk.modulation.data<float>()[i] + e6.data<float>()[i];
    const float *shift_msa = &mod[0], *scale_msa = &mod[d], *gate_msa = &mod[2 * d],
                *shift_mlp = &mod[3 * d], *scale_mlp = &mod[4 * d], *gate_mlp = &mod[5 * d];
    Tensor y = layer_norm(x, Tensor(), Tensor(), eps);
    modulate_(y, shift_msa, scale_msa);
    gated_add_(x, gate_msa, blk.self_attn.forward(y, rope, ctx, sp, false, nullptr));
    y = layer_norm(x, blk.norm3_w, blk.norm3_b, eps);
    add_(x, blk.cross_attn.forward(y, context, ctx));
    y = layer_norm(x, Tensor(), Tensor(), eps);
    modulate_(y, shift_mlp, scale_mlp);
    gated_add_(x, gate_mlp, blk.ffn.forward(y, *ctx.tp));
  }

  std::vector<float> hmod(2 * d);
  for (int64_t i = 0; i < 2 * d; ++i) hmod[i] = head_mod.data<float>()[i] + e.data<float>()[i % d];
  Tensor y = layer_norm(x, Tensor(), Tensor(), eps);
  modulate_(y, &hmod[0], &hmod[d]);
  y = linear(y, head_w, head_b);  // (B, n, C·pt·ph·pw)
  y = sp.at("proj_out", "hidden", std::move(y));
  return unpatchify(y, out_channels(m_), grid, m_.patch);
}

Tensor DiT::guided(const Tensor& latent, float t, const Tensor& text, const Tensor& null_text,
                   float guidance, ParallelContext& ctx) const {
  Communicator& cfg = *ctx.cfg;
  SEQPAR_ARG_CHECK(cfg.size() <= 2, "--cfg ", cfg.size(), " is invalid; valid: 1, 2");
  Tensor cond, uncond;
  if (cfg.size() == 2) {
    // Each cfg group computes one branch; the two velocities are exchanged.
    Tensor mine = forward(latent, t, cfg.rank() == 0 ? text : null_text, ctx);
    Tensor both({2, mine.numel()});
    cfg.all_gather(mine.raw(), mine.nbytes(), both.raw());
    cond = Tensor(mine.shape());
    uncond = Tensor(mine.shape());
    std::memcpy(cond.raw(), both.data<float>(), mine.nbytes());
    std::memcpy(uncond.raw(), both.data<float>() + mine.numel(), mine.nbytes());
  } else {
    cond = forward(latent, t, text, ctx);
    uncond = forward(latent, t, null_text, ctx);
  }
  for (int64_t i = 0; i < cond.numel(); ++i)
    cond.data<float>()[i] =
        uncond.data<float>()[i] + guidance * (cond.data<float>()[i] - uncond.data<float>()[i]);
  return cond;
}

Tensor DiT::sample(Tensor latent, int steps, const Tensor& text, const Tensor& null_text,
                   float guidance, ParallelContext& ctx) const {
  SEQPAR_ARG_CHECK(steps >= 1, "--steps ", steps, " is invalid; it must be at least 1");
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
