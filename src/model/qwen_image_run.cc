// A rank's Qwen-Image transformer as QwenImagePipeline calls it: batch rows, text masks,
// classifier-free guidance over the cfg group (qwen_image.h).
#include <cmath>
#include <cstring>

#include "seqpar/core/param_error.h"
#include "seqpar/model/ops.h"
#include "seqpar/model/qwen_image.h"

namespace seqpar {

namespace {

void check_text(const QwenImageConfig& m, const Tensor& t, const std::vector<int64_t>& lens,
                int64_t B, const std::string& name, const std::string& where) {
  SEQPAR_ARG_CHECK(t.ndim() == 3 && t.dim(0) == B && t.dim(1) >= 1 && t.dim(2) == m.text_dim, where,
                   "tensor '", name, "' has shape ", shape_text(t.shape()), "; expected [", B,
                   ", L, ", m.text_dim, "] with L >= 1");
  SEQPAR_ARG_CHECK(static_cast<int64_t>(lens.size()) == B, where, "tensor '", name, "_mask' gives ",
                   lens.size(), " rows; expected ", B);
  for (int64_t b = 0; b < B; ++b)
    SEQPAR_ARG_CHECK(lens[b] >= 1 && lens[b] <= t.dim(1), where, "tensor '", name, "_mask' row ", b,
                     " has ", lens[b], " valid tokens; expected 1..", t.dim(1));
}

// Rows [b, b+1) of x (B, ...) with the first `tokens` tokens of dimension 1.
Tensor row_prefix(const Tensor& x, int64_t b, int64_t tokens) {
  const Tensor row = slice_rows(x, b, b + 1);
  const int64_t per_token = row.numel() / row.dim(1);
  std::vector<int64_t> shape = row.shape();
  shape[1] = tokens;
  return reshape(slice_cols(reshape(row, {1, row.numel()}), 0, tokens * per_token),
                 std::move(shape));
}

}  // namespace

void check_qwen_image_request(const QwenImageConfig& m, const QwenImageRequest& r,
                              const std::string& where_) {
  const std::string where = where_.empty() ? "" : where_ + ": ";
  const Tensor& h = r.hidden;
  SEQPAR_ARG_CHECK(h.ndim() == 3 && h.dim(0) >= 1 && h.dim(1) >= 1 && h.dim(2) == m.in_channels,
                   where, "tensor 'hidden_states' has shape ", shape_text(h.shape()),
                   "; expected [B, S, ", m.in_channels, "] (packed latents)");
  const int64_t B = h.dim(0), S = h.dim(1);
  SEQPAR_ARG_CHECK(!r.images.empty(), where,
                   "img_shapes is empty; expected (frames, height, width) of each image");
  int64_t tokens = 0;
  for (const auto& [f, y, x] : r.images) {
    SEQPAR_ARG_CHECK(f >= 1 && y >= 1 && x >= 1 && f <= 4096 && y <= 8192 && x <= 8192, where,
                     "img_shapes holds (", f, ", ", y, ", ", x,
                     "); expected positive frames, height and width (in patches)");
    tokens += f * y * x;
  }
  SEQPAR_ARG_CHECK(tokens == S, where, "img_shapes give ", tokens,
                   " image tokens (the sum of frames x height x width) but 'hidden_states' holds ",
                   S, "; expected them equal");
  SEQPAR_ARG_CHECK(static_cast<int64_t>(r.timesteps.size()) == B, where, "tensor 'timestep' has ",
                   r.timesteps.size(), " values; expected [", B, "]");
  for (const float t : r.timesteps)
    SEQPAR_ARG_CHECK(std::isfinite(t) && t >= 0 && t <= 1, where, "tensor 'timestep' holds ", t,
                     "; expected values in [0, 1] (the pipeline's t / 1000)");
  check_text(m, r.text, r.text_lens, B, "encoder_hidden_states", where);
  if (!r.negative.empty())
    check_text(m, r.negative, r.negative_lens, B, "negative_encoder_hidden_states", where);
  SEQPAR_PARAM_CHECK(std::isfinite(r.guidance) && r.guidance >= 0 && r.guidance <= 100, "guidance",
                     "0..100", where, param("guidance"), " ", r.guidance,
                     " is invalid; valid: 0..100");
}

namespace {
QwenImage load_model(const QwenImageCheckpoint& ck, const ParallelContext& ctx, int64_t& bytes) {
  const WeightStore ws = qwen_image_weights(ck);
  QwenImage model(ck.config, ws, ctx);
  bytes = ws.bytes_read();
  return model;
}
}  // namespace

QwenImageRank::QwenImageRank(const QwenImageCheckpoint& ck, const ParallelContext& ctx)
    : model_(load_model(ck, ctx, weight_bytes_)) {}

Tensor QwenImageRank::branch(const QwenImageRequest& r, const Tensor& text,
                             const std::vector<int64_t>& lens, ParallelContext& ctx) const {
  const int64_t B = r.hidden.dim(0), S = r.hidden.dim(1), F = config().out_features();
  Tensor out({B, S, F});
  for (int64_t b = 0; b < B; ++b) {
    const Tensor y = model_.forward(slice_rows(r.hidden, b, b + 1), r.images, r.timesteps[b],
                                    row_prefix(text, b, lens[b]), ctx);
    std::memcpy(out.data<float>() + b * S * F, y.data<float>(), S * F * sizeof(float));
  }
  return out;
}

std::array<Tensor, 2> QwenImageRank::branches(const QwenImageRequest& r,
                                              ParallelContext& ctx) const {
  SEQPAR_ARG_CHECK(!r.negative.empty(), "the unconditional branch needs the negative text states");
  return cfg_branches(*ctx.cfg, [&](int i) {
    return i == 0 ? branch(r, r.text, r.text_lens, ctx)
                  : branch(r, r.negative, r.negative_lens, ctx);
  });
}

Tensor QwenImageRank::predict(const QwenImageRequest& r, ParallelContext& ctx) const {
  // Unguided on a cfg group of 2, both groups compute the one prediction.
  if (r.negative.empty() || r.guidance <= 1) return branch(r, r.text, r.text_lens, ctx);
  auto [cond, uncond] = branches(r, ctx);
  // QwenImagePipeline: comb = u + g·(c − u), then comb · |c| / |comb| over each token's features.
  const int64_t F = cond.dim(2), rows = cond.numel() / F;
  for (int64_t i = 0; i < rows; ++i) {
    float* c = cond.data<float>() + i * F;
    const float* u = uncond.data<float>() + i * F;
    float cond_sq = 0, comb_sq = 0;
    for (int64_t f = 0; f < F; ++f) {
      const float comb = u[f] + r.guidance * (c[f] - u[f]);
      cond_sq += c[f] * c[f];
      comb_sq += comb * comb;
      c[f] = comb;  // c now holds comb; |c| kept in cond_sq
    }
    const float ratio = std::sqrt(cond_sq) / std::sqrt(comb_sq);
    for (int64_t f = 0; f < F; ++f) c[f] *= ratio;
  }
  return cond;
}

}  // namespace seqpar
