#include "seqpar/model/decoder.h"

#include <cstring>

#include "seqpar/model/ops.h"

namespace seqpar {

namespace {
constexpr float kEps = 1e-5f;
}  // namespace

std::vector<WeightStore::Spec> Decoder::parameters(const ModelPreset& m) {
  const int64_t d = m.hidden, kv = m.kv_heads * m.head_dim;
  std::vector<WeightStore::Spec> p = {{"embed_tokens.weight", {m.vocab, d}, 1.0f}};
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    p.push_back({l + "input_layernorm.weight", {d}, -1});
    p.push_back({l + "self_attn.q_proj.weight", {d, d}});
    p.push_back({l + "self_attn.k_proj.weight", {kv, d}});
    p.push_back({l + "self_attn.v_proj.weight", {kv, d}});
    p.push_back({l + "self_attn.o_proj.weight", {d, d}});
    p.push_back({l + "post_attention_layernorm.weight", {d}, -1});
    p.push_back({l + "mlp.gate_proj.weight", {m.ffn_dim, d}});
    p.push_back({l + "mlp.up_proj.weight", {m.ffn_dim, d}});
    p.push_back({l + "mlp.down_proj.weight", {d, m.ffn_dim}});
  }
  p.push_back({"norm.weight", {d}, -1});
  p.push_back({"lm_head.weight", {m.vocab, d}});
  return p;
}

const SpPlan& Decoder::sp_plan() {
  static const SpPlan plan = {
      {"layers.0", SpAction::kShard, {"hidden", "rope"}},
      {"norm", SpAction::kGather, {"hidden"}},
  };
  return plan;
}

Decoder::Decoder(const ModelPreset& m, const WeightStore& ws, const ParallelContext& ctx) : m_(m) {
  SEQPAR_ARG_CHECK(m.family == ModelFamily::kLlm, "model ", m.name, " is not a decoder");
  const int tp = ctx.tp_size();
  SEQPAR_ARG_CHECK(m.heads % tp == 0 && (m.kv_heads % tp == 0 || tp % m.kv_heads == 0), "--tp ",
                   tp, " must divide the ", m.heads, " heads, and divide or be a multiple of the ",
                   m.kv_heads, " kv heads of ", m.name);
  embed_w = ws.get("embed_tokens.weight");
  norm_w = ws.get("norm.weight");
  lm_head_w = ws.get("lm_head.weight");
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    Layer layer;
    layer.input_norm = ws.get(l + "input_layernorm.weight");
    layer.post_norm = ws.get(l + "post_attention_layernorm.weight");
    layer.attn = SelfAttention::load(ws, l + "self_attn", m.hidden, m.heads, m.kv_heads, ctx,
                                     false, false, {"q_proj", "k_proj", "v_proj", "o_proj"});
    layer.mlp = FeedForward::load(ws, l + "mlp", m.hidden, m.ffn_dim, FeedForward::Kind::kSwiGlu,
                                  ctx);
    layers_.push_back(std::move(layer));
  }
}

Tensor Decoder::embed(std::span<const int32_t> tokens) const {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = m_.hidden;
  Tensor x({1, n, d});
  for (int64_t i = 0; i < n; ++i) {
    SEQPAR_ARG_CHECK(tokens[i] >= 0 && tokens[i] < m_.vocab, "token ", tokens[i],
                     " is outside the vocabulary of ", m_.vocab);
    std::memcpy(x.data<float>() + i * d, embed_w.data<float>() + tokens[i] * d, d * sizeof(float));
  }
  return x;
}

Tensor Decoder::logits_of(const Tensor& h_last) const {
  return linear(rms_norm(h_last, norm_w, kEps), lm_head_w, Tensor());
}

namespace {
int32_t argmax(const Tensor& logits) {
  int32_t best = 0;
  for (int64_t i = 1; i < logits.numel(); ++i)
    if (logits.data<float>()[i] > logits.data<float>()[best]) best = static_cast<int32_t>(i);
  return best;
}
}  // namespace

Decoder::Output Decoder::generate(const std::vector<int32_t>& prompt, int decode_steps,
                                  ParallelContext& ctx) {
  const int64_t P = static_cast<int64_t>(prompt.size()), d = m_.hidden;
  SEQPAR_ARG_CHECK(P >= 1, "the prompt is empty");
  SEQPAR_ARG_CHECK(decode_steps >= 0, "--decode ", decode_steps, " is invalid");
  Output out;
  // ---- prefill: context parallel over the prompt.
  SpRuntime sp(sp_plan(), ctx, P);
  std::vector<int64_t> all_pos(P);
  for (int64_t i = 0; i < P; ++i) all_pos[i] = i;
  Tensor x = sp.at("layers.0", "hidden", embed(prompt));
  Tensor rope = sp.at("layers.0", "rope",
                      reshape(rope_1d(all_pos, m_.head_dim, m_.rope_theta), {1, P, m_.head_dim}));
  rope = reshape(std::move(rope), {x.dim(1), m_.head_dim / 2, 2});
  for (Layer& layer : layers_) {
    Tensor h = layer.attn.forward(rms_norm(x, layer.input_norm, kEps), rope, ctx, sp, true,
                                  &layer.cache);
    add_(x, h);
    add_(x, layer.mlp.forward(rms_norm(x, layer.post_norm, kEps), *ctx.tp));
  }
  x = sp.at("norm", "hidden", std::move(x));  // (1, P, d) on every rank
  Tensor last({d});
  std::memcpy(last.raw(), x.data<float>() + (P - 1) * d, d * sizeof(float));
  out.logits.push_back(logits_of(last));
  out.tokens.push_back(argmax(out.logits.back()));

  // ---- decode: one token a step, pass-Q over the caches prefill left.
  const int n = ctx.sp_size();
  KvPlacement place;
  place.kv_pos.resize(n);
  place.q_pos.resize(n);
  const Partition& part = sp.partition();
  for (int r = 0; r < n; ++r)
    for (int64_t p : part.positions(r))
      if (p < P) place.kv_pos[r].push_back(p);
  for (int step = 0; step < decode_steps; ++step) {
    const int64_t pos = P + step;
    const int owner = static_cast<int>(pos % n);
    for (auto& q : place.q_pos) q.clear();
    place.q_pos[owner].push_back(pos);
    place.kv_pos[owner].push_back(pos);
    const int64_t position[1] = {pos};
    Tensor r1 = rope_1d(position, m_.head_dim, m_.rope_theta);
    Tensor h = embed(std::span<const int32_t>(&out.tokens.back(), 1));
    for (Layer& layer : layers_) {
      add_(h, layer.attn.decode(rms_norm(h, layer.input_norm, kEps), r1, ctx, layer.cache, place));
      add_(h, layer.mlp.forward(rms_norm(h, layer.post_norm, kEps), *ctx.tp));
    }
    out.logits.push_back(logits_of(reshape(std::move(h), {d})));
    out.tokens.push_back(argmax(out.logits.back()));
  }
  return out;
}

}  // namespace seqpar
