// A rank's FLUX transformer as FluxPipeline calls it: batch rows, the guidance embedding, true
// classifier-free guidance over the cfg group (flux.h).
#include <cmath>
#include <cstring>

#include "seqpar/model/flux.h"
#include "seqpar/model/ops.h"

namespace seqpar {

namespace {

void check_ids(const std::vector<float>& ids, int64_t n, const std::string& name,
               const std::string& what, const std::string& where) {
  SEQPAR_ARG_CHECK(static_cast<int64_t>(ids.size()) == 3 * n, where, "tensor '", name, "' holds ",
                   ids.size() / 3, " rows of 3; expected [", n, ", 3] (", what, ")");
  for (const float v : ids)
    SEQPAR_ARG_CHECK(std::isfinite(v) && std::fabs(v) <= 1e6f, where, "tensor '", name, "' holds ",
                     v, "; expected finite positions");
}

void check_text(const FluxConfig& m, const Tensor& t, const std::vector<float>& ids,
                const Tensor& pooled, int64_t B, const std::string& name, const std::string& prefix,
                const std::string& where) {
  SEQPAR_ARG_CHECK(t.ndim() == 3 && t.dim(0) == B && t.dim(1) >= 1 && t.dim(2) == m.text_dim, where,
                   "tensor '", name, "' has shape ", shape_text(t.shape()), "; expected [", B,
                   ", L, ", m.text_dim, "] with L >= 1");
  check_ids(ids, t.dim(1), prefix + "txt_ids", "one row per token of '" + name + "'", where);
  SEQPAR_ARG_CHECK(pooled.ndim() == 2 && pooled.dim(0) == B && pooled.dim(1) == m.pooled_dim, where,
                   "tensor '", prefix, "pooled_projections' has shape ", shape_text(pooled.shape()),
                   "; expected [", B, ", ", m.pooled_dim, "]");
}

}  // namespace

void check_flux_request(const FluxConfig& m, const FluxRequest& r, const std::string& where_) {
  const std::string where = where_.empty() ? "" : where_ + ": ";
  const Tensor& h = r.hidden;
  SEQPAR_ARG_CHECK(h.ndim() == 3 && h.dim(0) >= 1 && h.dim(1) >= 1 && h.dim(2) == m.in_channels,
                   where, "tensor 'hidden_states' has shape ", shape_text(h.shape()),
                   "; expected [B, S, ", m.in_channels, "] (packed latents)");
  const int64_t B = h.dim(0), S = h.dim(1);
  check_ids(r.img_ids, S, "img_ids", "one row per token of 'hidden_states'", where);
  SEQPAR_ARG_CHECK(static_cast<int64_t>(r.timesteps.size()) == B, where, "tensor 'timestep' has ",
                   r.timesteps.size(), " values; expected [", B, "]");
  for (const float t : r.timesteps)
    SEQPAR_ARG_CHECK(std::isfinite(t) && t >= 0 && t <= 1, where, "tensor 'timestep' holds ", t,
                     "; expected values in [0, 1] (the pipeline's t / 1000)");
  check_text(m, r.text, r.txt_ids, r.pooled, B, "encoder_hidden_states", "", where);
  if (!r.negative.empty())
    check_text(m, r.negative, r.negative_txt_ids, r.negative_pooled, B,
               "negative_encoder_hidden_states", "negative_", where);
  if (m.guidance_embeds) {
    SEQPAR_ARG_CHECK(static_cast<int64_t>(r.guidance.size()) == B, where, "tensor 'guidance' has ",
                     r.guidance.size(), " values; expected [", B,
                     "] (the checkpoint has guidance_embeds: FLUX.1-dev's guidance scale)");
    for (const float g : r.guidance)
      SEQPAR_ARG_CHECK(std::isfinite(g) && g >= 0 && g <= 1000, where, "tensor 'guidance' holds ",
                       g, "; expected values in 0..1000");
  } else {
    SEQPAR_ARG_CHECK(r.guidance.empty(), where,
                     "tensor 'guidance' is given but the checkpoint has guidance_embeds false "
                     "(FLUX.1-schnell embeds no guidance); expected no 'guidance'");
  }
  SEQPAR_ARG_CHECK(std::isfinite(r.true_cfg) && r.true_cfg >= 0 && r.true_cfg <= 100, where,
                   "true_cfg_scale ", r.true_cfg, " is invalid; valid: 0..100");
}

namespace {
Flux load_model(const FluxCheckpoint& ck, const ParallelContext& ctx, int64_t& bytes) {
  const WeightStore ws = flux_weights(ck);
  Flux model(ck.config, ws, ctx);
  bytes = ws.bytes_read();
  return model;
}
}  // namespace

FluxRank::FluxRank(const FluxCheckpoint& ck, const ParallelContext& ctx)
    : model_(load_model(ck, ctx, weight_bytes_)) {}

Tensor FluxRank::branch(const FluxRequest& r, const Tensor& text, const std::vector<float>& txt_ids,
                        const Tensor& pooled, ParallelContext& ctx) const {
  const int64_t B = r.hidden.dim(0), S = r.hidden.dim(1), F = config().out_features();
  const int64_t P = config().pooled_dim;
  const Tensor pooled_b = pooled.to(DType::kF32);
  Tensor out({B, S, F});
  for (int64_t b = 0; b < B; ++b) {
    const float g = r.guidance.empty() ? 0.0f : r.guidance[b];
    const Tensor y =
        model_.forward(slice_rows(r.hidden, b, b + 1), r.img_ids, slice_rows(text, b, b + 1),
                       txt_ids, pooled_b.data<float>() + b * P, r.timesteps[b], g, ctx);
    std::memcpy(out.data<float>() + b * S * F, y.data<float>(), S * F * sizeof(float));
  }
  return out;
}

std::array<Tensor, 2> FluxRank::branches(const FluxRequest& r, ParallelContext& ctx) const {
  SEQPAR_ARG_CHECK(!r.negative.empty(), "the negative branch needs the negative text states");
  return cfg_branches(*ctx.cfg, [&](int i) {
    return i == 0 ? branch(r, r.text, r.txt_ids, r.pooled, ctx)
                  : branch(r, r.negative, r.negative_txt_ids, r.negative_pooled, ctx);
  });
}

Tensor FluxRank::predict(const FluxRequest& r, ParallelContext& ctx) const {
  // Unguided on a cfg group of 2, both groups compute the one prediction.
  if (r.negative.empty() || r.true_cfg <= 1) return branch(r, r.text, r.txt_ids, r.pooled, ctx);
  auto [pos, neg] = branches(r, ctx);
  // FluxPipeline: noise = neg + s·(pos − neg), no rescale.
  float* p = pos.data<float>();
  const float* u = neg.data<float>();
  for (int64_t i = 0; i < pos.numel(); ++i) p[i] = u[i] + r.true_cfg * (p[i] - u[i]);
  return pos;
}

}  // namespace seqpar
