// seqpar denoise on a FLUX.1 checkpoint (diffusers' FluxPipeline or FluxTransformer2DModel
// directory) on a cfg x tp x ring x ulysses mesh: one transformer call as the pipeline makes it,
// fed the tensors of its call from a safetensors file:
//   IN:  hidden_states (or latents) [B, S, in_channels] (packed latents), img_ids [S, 3],
//        encoder_hidden_states [B, L, text_dim], txt_ids [L, 3], pooled_projections
//        [B, pooled_dim], timestep [B] in [0, 1], guidance [B] (FLUX.1-dev only: required when
//        the config has guidance_embeds, refused otherwise); for true CFG
//        negative_encoder_hidden_states [B, L', text_dim], negative_pooled_projections and
//        negative_txt_ids [L', 3] (default: txt_ids)
//   OUT: noise_pred [B, S, p·p·out_channels], guided as the pipeline's true CFG (neg + s·(pos −
//        neg), s = --guidance) when the negative states are given and --guidance > 1.
#include "denoise_mmdit.h"
#include "seqpar/model/flux.h"

namespace seqpar::cli {

namespace {

// The values of tensor `name` of `f` as fp32 ids [n, 3] (shape checked by the request).
std::vector<float> ids_of(const SafetensorsFile& f, const std::string& name, const std::string& p,
                          const std::string& what) {
  SEQPAR_ARG_CHECK(f.contains(name), p, ": tensor '", name, "' is missing; expected [", what,
                   ", 3] position ids");
  const std::vector<int64_t>& shape = f.entry(name).shape;
  SEQPAR_ARG_CHECK(shape.size() == 2 && shape[1] == 3, p, ": tensor '", name, "' has shape ",
                   shape_text(shape), "; expected [", what, ", 3]");
  std::vector<float> v;
  for (const double x : tensor_values(f, name)) v.push_back(static_cast<float>(x));
  return v;
}

FluxRequest read_request(const DenoiseOptions& o, const FluxConfig& m) {
  const SafetensorsFile f(o.inputs);
  const std::string& p = o.inputs;
  // FluxTransformer2DModel's call takes no text mask: every text token is attended.
  static constexpr std::string_view kInputs[] = {"hidden_states",
                                                 "latents",
                                                 "encoder_hidden_states",
                                                 "pooled_projections",
                                                 "img_ids",
                                                 "txt_ids",
                                                 "timestep",
                                                 "guidance",
                                                 "negative_encoder_hidden_states",
                                                 "negative_pooled_projections",
                                                 "negative_txt_ids"};
  check_tensor_names(f, kInputs, "FLUX.1 (it takes no text mask: every text token is attended)");
  const std::string hidden = f.contains("hidden_states") ? "hidden_states" : "latents";
  SEQPAR_ARG_CHECK(f.contains(hidden), p, ": tensor 'hidden_states' is missing; expected [B, S, ",
                   m.in_channels, "] (the packed latents)");
  FluxRequest r;
  r.hidden = f.tensor(hidden, DType::kF32);
  const int64_t B = r.hidden.ndim() == 3 ? r.hidden.dim(0) : 1;
  SEQPAR_ARG_CHECK(f.contains("encoder_hidden_states"), p,
                   ": tensor 'encoder_hidden_states' is missing; expected [", B, ", L, ",
                   m.text_dim, "]");
  r.text = f.tensor("encoder_hidden_states", DType::kF32);
  SEQPAR_ARG_CHECK(f.contains("pooled_projections"), p,
                   ": tensor 'pooled_projections' is missing; expected [", B, ", ", m.pooled_dim,
                   "]");
  r.pooled = f.tensor("pooled_projections", DType::kF32);
  r.img_ids = ids_of(f, "img_ids", p, "S");
  r.txt_ids = ids_of(f, "txt_ids", p, "L");
  if (f.contains("negative_encoder_hidden_states")) {
    r.negative = f.tensor("negative_encoder_hidden_states", DType::kF32);
    SEQPAR_ARG_CHECK(f.contains("negative_pooled_projections"), p,
                     ": tensor 'negative_pooled_projections' is missing; expected [", B, ", ",
                     m.pooled_dim, "] with negative_encoder_hidden_states");
    r.negative_pooled = f.tensor("negative_pooled_projections", DType::kF32);
    // The pipeline's negative_text_ids; its txt_ids when not given (both are zeros in
    // FluxPipeline).
    r.negative_txt_ids =
        f.contains("negative_txt_ids") ? ids_of(f, "negative_txt_ids", p, "L'") : r.txt_ids;
  }
  SEQPAR_ARG_CHECK(f.contains("timestep"), p, ": tensor 'timestep' is missing; expected [", B,
                   "] in [0, 1] (the pipeline's t / 1000)");
  for (const double t : tensor_values(f, "timestep")) r.timesteps.push_back(static_cast<float>(t));
  if (f.contains("guidance")) {
    SEQPAR_ARG_CHECK(m.guidance_embeds, p,
                     ": tensor 'guidance' is given but the checkpoint has guidance_embeds false "
                     "(FLUX.1-schnell embeds no guidance); expected no 'guidance'");
    for (const double g : tensor_values(f, "guidance")) r.guidance.push_back(static_cast<float>(g));
  } else {
    SEQPAR_ARG_CHECK(!m.guidance_embeds, p, ": tensor 'guidance' is missing; expected [", B,
                     "] (the checkpoint has guidance_embeds true: FLUX.1-dev's guidance scale)");
  }
  r.true_cfg = static_cast<float>(o.guidance);
  check_flux_request(m, r, p);
  return r;
}

struct FluxFamily {
  using Checkpoint = FluxCheckpoint;
  using Request = FluxRequest;
  using Rank = FluxRank;
  static constexpr const char* kName = "FLUX.1";
  static constexpr const char* kJson = "flux";
  static Checkpoint open(const std::string& dir) { return open_flux(dir); }
  static Request read(const DenoiseOptions& o, const Checkpoint& ck) {
    return read_request(o, ck.config);
  }
};

}  // namespace

int denoise_flux(const DenoiseOptions& o) { return mmdit::denoise_mmdit<FluxFamily>(o); }

}  // namespace seqpar::cli
