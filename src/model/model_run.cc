#include "seqpar/model/model_run.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/safetensors.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

ParallelConfig model_mesh(int cfg, int tp, int ring_degree, int ulysses_degree,
                          const std::string& ring_axis, const std::string& layout,
                          const std::string& ulysses_mode, bool pad) {
  using limits::check_range;
  check_range("cfg", int64_t{cfg}, 1, 2);
  check_range("tp", int64_t{tp}, 1, limits::kMaxRanks);
  check_range("ring_degree", int64_t{ring_degree}, 1, limits::kMaxRanks);
  check_range("ulysses_degree", int64_t{ulysses_degree}, 1, limits::kMaxRanks);
  (void)limits::checked_product(
      {cfg, tp, ring_degree, ulysses_degree},
      detail::concat("ranks of ", param("cfg"), " x ", param("tp"), " x ", param("ring_degree"),
                     " x ", param("ulysses_degree")),
      limits::kMaxRanks);
  ParallelConfig c;
  c.mesh = {cfg, tp, ring_degree, ulysses_degree};
  c.layout = parse_layout(layout);
  c.ulysses_mode = parse_ulysses_mode(ulysses_mode);
  c.pad = pad;
  c.strategy = strategy_for_degrees(ulysses_degree, ring_degree, parse_strategy(ring_axis));
  return c;
}

ParallelContext model_context(MeshComms& mc, const ParallelConfig& c) {
  ParallelContext ctx;
  ctx.tp = &mc.tp();
  ctx.sp = &mc.sp_comms();
  ctx.cfg = &mc.cfg();
  ctx.config = c;
  if (mc.sp_comms().sp().size() == 1) {  // one rank attends locally: no schedule, no ring
    ctx.config.strategy = Strategy::kLocal;
    ctx.config.schedule = ScheduleKind::kDefault;
    ctx.config.softmax = SoftmaxMode::kOnline;
  }
  return ctx;
}

void check_causal_lm_tp(const CausalLmCheckpoint& ck, int64_t tp, const CausalLmRunNames& names) {
  const DecoderConfig& m = ck.config;
  SEQPAR_PARAM_CHECK(
      m.heads % tp == 0 && (m.kv_heads % tp == 0 || tp % m.kv_heads == 0) && m.ffn_dim % tp == 0,
      names.tp, "", param(names.tp), " ", tp, " must divide num_attention_heads ", m.heads,
      " and intermediate_size ", m.ffn_dim, ", and divide or be a multiple of num_key_value_heads ",
      m.kv_heads, " (", ck.dir, "/config.json)");
}

void check_causal_lm_int8(const CausalLmCheckpoint& ck, int64_t tp, const CausalLmRunNames& names) {
  const DecoderConfig& m = ck.config;
  const std::pair<std::string, int64_t> inputs[] = {
      {"hidden_size", m.hidden},
      {"the attention output's inputs per rank (num_attention_heads x head_dim / " + names.tp + ")",
       m.heads * m.head_dim / tp},
      {"intermediate_size / " + names.tp, m.ffn_dim / tp}};
  for (const auto& [what, k] : inputs) {
    SEQPAR_ARG_CHECK(k % 32 == 0, names.int8, " quantizes blocks of 32 inputs; ", what, " is ", k,
                     " (", ck.dir, "/config.json); valid: multiples of 32");
  }
}

std::vector<int32_t> check_causal_lm_prompt(const CausalLmCheckpoint& ck,
                                            const std::vector<int64_t>& ids, int64_t max_new_tokens,
                                            bool allow_long_context,
                                            const CausalLmRunNames& names) {
  const DecoderConfig& m = ck.config;
  const std::string config = ck.dir + "/config.json";
  limits::check_range(names.max_new_tokens, max_new_tokens, 1, limits::kMaxSteps);
  SEQPAR_ARG_CHECK(!ids.empty(), names.prompt, ": the prompt is empty; give at least one token id");
  for (size_t i = 0; i < ids.size(); ++i)
    SEQPAR_ARG_CHECK(ids[i] >= 0 && ids[i] < m.vocab, names.token, " ", ids[i], " at position ", i,
                     " is outside the vocabulary of ", config, " (vocab_size ", m.vocab,
                     "); valid: 0 to ", m.vocab - 1);
  limits::check_range("prompt tokens", static_cast<int64_t>(ids.size()), 1, limits::kMaxTokens);
  // Positions 0 .. P + N - 2 enter the model (the last new token is not fed back).
  const int64_t last = static_cast<int64_t>(ids.size()) + max_new_tokens - 1;
  SEQPAR_PARAM_CHECK(last <= m.max_positions || allow_long_context, names.max_new_tokens, "",
                     "the prompt (", ids.size(), " tokens) and ", param(names.max_new_tokens), " ",
                     max_new_tokens, " need ", last, " positions, beyond max_position_embeddings ",
                     m.max_positions, " of ", config, "; shorten them, or pass ",
                     names.allow_long_context);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

CausalLmMemory causal_lm_memory(const CausalLmCheckpoint& ck, const ParallelConfig& mesh,
                                int64_t prefill, int64_t cached, int64_t new_tokens,
                                DType kv_cache) {
  const DecoderConfig& m = ck.config;
  const double tp = static_cast<double>(mesh.mesh.tp), sp = static_cast<double>(mesh.sp());
  CausalLmMemory r;
  r.weights = static_cast<double>(ck.file_bytes) / tp;
  r.cache = Decoder::cache_bytes(m, mesh.mesh.tp, cached, kv_cache);
  // A layer's inputs, norms, q/k/v/o, the attention's partial outputs and the MLP's three
  // intermediates, for the rank's tokens of the prefill; the logits of every new token.
  const double tokens = std::ceil(prefill / sp);
  const double activations =
      4.0 * tokens * (8.0 * m.hidden + 3.0 * static_cast<double>(m.ffn_dim) / tp);
  const double logits = 4.0 * static_cast<double>(m.vocab) * (new_tokens + 1);
  r.run = r.cache + activations + logits;
  return r;
}

namespace {

// Row b of dimension 0 of t, as [1, ...].
Tensor batch_row(const Tensor& t, int64_t b) {
  std::vector<int64_t> shape = t.shape();
  shape[0] = 1;
  Tensor r(shape);
  std::memcpy(r.raw(), t.data<float>() + b * r.numel(), r.nbytes());
  return r;
}

// run(latents, t, text, negative) -> N velocities, once when every row of latents has the same
// timestep, else row by row (rows of text and of negative, if given) with the rows' results
// stacked along dimension 0.
template <size_t N, class Run>
std::array<Tensor, N> by_timestep(const Tensor& latents, const std::vector<float>& t,
                                  const Tensor& text, const Tensor& negative, const Tensor& image,
                                  Run run) {
  if (std::all_of(t.begin(), t.end(), [&](float v) { return v == t[0]; }))
    return run(latents, t[0], text, negative, image);
  const int64_t B = latents.dim(0);
  std::array<Tensor, N> out;
  for (int64_t b = 0; b < B; ++b) {
    const std::array<Tensor, N> v = run(batch_row(latents, b), t[b], batch_row(text, b),
                                        negative.empty() ? Tensor() : batch_row(negative, b),
                                        image.empty() ? Tensor() : batch_row(image, b));
    for (size_t i = 0; i < N; ++i) {
      const Tensor& row = v[i];
      Tensor& o = out[i];
      if (b == 0) {
        std::vector<int64_t> shape = row.shape();
        shape[0] = B;
        o = Tensor(shape);
      }
      std::memcpy(o.data<float>() + b * row.numel(), row.raw(), row.nbytes());
    }
  }
  return out;
}

}  // namespace

WanRank::WanRank(const WanModel& model, const ParallelContext& ctx) {
  for (const WanExpert& e : model.experts) {
    WeightStore ws = wan_weights(e);
    ws.set_activations(model.activations);
    dits_.emplace_back(e.preset, ws, ctx);
    weight_bytes_ += ws.bytes_read();
  }
}

int WanRank::expert_at(float t, const WanGuidance& g) const {
  return dits_.size() == 2 && t < g.boundary ? 2 : 1;
}

Tensor WanRank::velocity(const Tensor& latents, const std::vector<float>& t, const Tensor& text,
                         const Tensor& negative, const WanGuidance& g, ParallelContext& ctx,
                         const Tensor& image) const {
  auto one = [&](const Tensor& x, float tb, const Tensor& txt, const Tensor& neg,
                 const Tensor& img) {
    const bool low = expert_at(tb, g) == 2;
    const float scale = low ? g.guidance_2 : g.guidance;
    const DiT& dit = dits_[low ? 1 : 0];
    if (!neg.empty() && scale > 1.0f)
      return std::array{dit.guided(x, tb, txt, neg, scale, ctx, img)};
    return std::array{dit.forward(x, tb, txt, ctx, img)};
  };
  return by_timestep<1>(latents, t, text, negative, image, one)[0];
}

std::array<Tensor, 2> WanRank::branches(const Tensor& latents, const std::vector<float>& t,
                                        const Tensor& text, const Tensor& negative,
                                        const WanGuidance& g, ParallelContext& ctx,
                                        const Tensor& image) const {
  auto both = [&](const Tensor& x, float tb, const Tensor& txt, const Tensor& neg,
                  const Tensor& img) {
    return dits_[expert_at(tb, g) - 1].branches(x, tb, txt, neg, ctx, img);
  };
  return by_timestep<2>(latents, t, text, negative, image, both);
}

void check_wan_inputs(const ModelPreset& m, const Tensor& x, const Tensor& text,
                      const Tensor& negative, const std::string& p, const Tensor& image,
                      int64_t image_dim) {
  const std::string grid = detail::concat("F, H, W multiples of the patch ", m.patch[0], "x",
                                          m.patch[1], "x", m.patch[2]);
  SEQPAR_ARG_CHECK(x.ndim() == 5 && x.dim(1) == m.in_channels && x.dim(0) >= 1, p,
                   ": tensor 'latents' has shape ", x.shape_str(), "; expected [B, ", m.in_channels,
                   ", F, H, W]");
  SEQPAR_ARG_CHECK(x.dim(2) % m.patch[0] == 0 && x.dim(3) % m.patch[1] == 0 &&
                       x.dim(4) % m.patch[2] == 0 && x.dim(2) > 0 && x.dim(3) > 0 && x.dim(4) > 0,
                   p, ": tensor 'latents' has shape ", x.shape_str(), "; expected ", grid);
  const int64_t B = x.dim(0);
  const std::string text_shape = detail::concat("[", B, ", L, ", m.text_dim, "]");
  auto check_text = [&](const std::string& name, const Tensor& t) {
    SEQPAR_ARG_CHECK(t.ndim() == 3 && t.dim(0) == B && t.dim(1) >= 1 && t.dim(2) == m.text_dim, p,
                     ": tensor '", name, "' has shape ", t.shape_str(), "; expected ", text_shape,
                     " (the model's text_dim ", m.text_dim, ")");
  };
  check_text("encoder_hidden_states", text);
  if (!negative.empty()) check_text("negative_encoder_hidden_states", negative);
  SEQPAR_ARG_CHECK(image_dim > 0 || image.empty(), p,
                   ": tensor 'encoder_hidden_states_image' is given; the model is text-to-video "
                   "(no image_dim), expected no image states");
  if (image_dim > 0) {
    const std::string image_shape = detail::concat("[", B, ", 257, ", image_dim, "]");
    SEQPAR_ARG_CHECK(!image.empty(), p,
                     ": tensor 'encoder_hidden_states_image' is missing; expected ", image_shape,
                     " (the image encoder's states) for this image-to-video model");
    SEQPAR_ARG_CHECK(
        image.ndim() == 3 && image.dim(0) == B && image.dim(1) >= 1 && image.dim(2) == image_dim, p,
        ": tensor 'encoder_hidden_states_image' has shape ", image.shape_str(), "; expected ",
        image_shape);
    for (auto [name, t] : {std::pair{"encoder_hidden_states", &text},
                           std::pair{"negative_encoder_hidden_states", &negative}})
      SEQPAR_ARG_CHECK(t->empty() || t->dim(1) == 512, p, ": tensor '", name, "' has ", t->dim(1),
                       " tokens; an image-to-video model takes 512 (padded as the pipelines "
                       "pad it: diffusers reads the last 512 context tokens as the text)");
  }
  for (auto [name, t] : {std::pair{"latents", &x}, std::pair{"encoder_hidden_states", &text},
                         std::pair{"negative_encoder_hidden_states", &negative},
                         std::pair{"encoder_hidden_states_image", &image}})
    for (int64_t i = 0; i < t->numel(); ++i)
      SEQPAR_ARG_CHECK(std::isfinite(t->data<float>()[i]), p, ": tensor '", name,
                       "' holds a non-finite value at element ", i, "; expected finite values");
}

namespace {

// The values of tensor 'timestep': F32, BF16, F16 as the other inputs, F64, or integers (I64, I32:
// diffusers' pipelines pass integer timesteps).
std::vector<double> timestep_values(const SafetensorsFile& f, const std::string& expected) {
  SEQPAR_ARG_CHECK(f.contains("timestep"), f.path(), ": tensor 'timestep' is missing; expected ",
                   expected);
  const std::string& dtype = f.entry("timestep").dtype;
  SEQPAR_ARG_CHECK(
      f.entry("timestep").seqpar_dtype() || dtype == "F64" || dtype == "I64" || dtype == "I32",
      f.path(), ": tensor 'timestep' has dtype ", dtype,
      "; expected F32, BF16, F16, F64, I64 or I32");
  return tensor_values(f, "timestep");
}

}  // namespace

WanInputs read_wan_inputs(const std::string& path, const DiTConfig& m, int64_t steps,
                          double guidance) {
  const SafetensorsFile f(path);
  const std::string& p = path;
  static constexpr std::string_view kInputs[] = {"latents", "timestep", "encoder_hidden_states",
                                                 "negative_encoder_hidden_states",
                                                 "encoder_hidden_states_image"};
  check_tensor_names(f, kInputs, "Wan");
  auto need = [&](const std::string& name, const std::string& expected) -> Tensor {
    SEQPAR_ARG_CHECK(f.contains(name), p, ": tensor '", name, "' is missing; expected ", expected);
    return f.tensor(name, DType::kF32);
  };
  const std::string grid = detail::concat("F, H, W multiples of the patch ", m.patch[0], "x",
                                          m.patch[1], "x", m.patch[2]);
  WanInputs in;
  in.latents = need("latents", detail::concat("[B, ", m.in_channels, ", F, H, W] with ", grid));
  const int64_t B = in.latents.ndim() == 5 && in.latents.dim(0) >= 1 ? in.latents.dim(0) : 1;
  const std::string text_shape = detail::concat("[", B, ", L, ", m.text_dim, "]");
  in.text = need("encoder_hidden_states", text_shape);
  if (f.contains("negative_encoder_hidden_states"))
    in.negative = f.tensor("negative_encoder_hidden_states", DType::kF32);
  if (f.contains("encoder_hidden_states_image"))
    in.image = f.tensor("encoder_hidden_states_image", DType::kF32);
  check_wan_inputs(m, in.latents, in.text, in.negative, p, in.image, m.image_dim);
  SEQPAR_PARAM_CHECK(steps == 0 || guidance <= 1 || !in.negative.empty(), "guidance", "1", p,
                     ": tensor 'negative_encoder_hidden_states' is missing; expected ", text_shape,
                     " for ", param("guidance"), " ", guidance, " (> 1), or ", param("guidance"),
                     " 1 for no guidance");
  if (steps == 0) {
    const std::vector<double> t = timestep_values(
        f, detail::concat("[", B, "] (one transformer call), or steps for a sampling loop"));
    SEQPAR_ARG_CHECK(static_cast<int64_t>(t.size()) == B && f.entry("timestep").shape.size() <= 1,
                     p, ": tensor 'timestep' has shape ", shape_text(f.entry("timestep").shape),
                     "; expected [", B, "]");
    for (const double v : t) {
      SEQPAR_ARG_CHECK(std::isfinite(v) && v >= 0 && v <= 1000, p, ": tensor 'timestep' holds ", v,
                       "; expected values in [0, 1000]");
      in.timestep.push_back(static_cast<float>(v));
    }
  }
  return in;
}

}  // namespace seqpar
