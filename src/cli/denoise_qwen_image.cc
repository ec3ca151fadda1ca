// seqpar denoise on a Qwen-Image checkpoint (diffusers' QwenImagePipeline or
// QwenImageTransformer2DModel directory) on a cfg x tp x ring x ulysses mesh: one transformer
// call as the pipeline makes it, fed the tensors of its call from a safetensors file:
//   IN:  hidden_states (or latents) [B, S, in_channels] (packed latents), encoder_hidden_states
//        [B, L, text_dim], encoder_hidden_states_mask [B, L] (optional; 1s then 0s), timestep
//        [B] in [0, 1], img_shapes [N, 3] (frames, height, width of each image, in patches);
//        for guidance negative_encoder_hidden_states [B, L', text_dim] and its _mask
//   OUT: noise_pred [B, S, p·p·out_channels], guided as the pipeline's true CFG when the
//        negative states are given and --guidance > 1.
#include "denoise_mmdit.h"
#include "seqpar/model/qwen_image.h"

namespace seqpar::cli {

namespace {

// The valid tokens of each row of mask `name` [B, L] (1s then 0s); all L when absent.
std::vector<int64_t> mask_lengths(const SafetensorsFile& f, const std::string& name, int64_t B,
                                  int64_t L) {
  if (!f.contains(name)) return std::vector<int64_t>(B, L);
  const std::vector<int64_t>& shape = f.entry(name).shape;
  SEQPAR_ARG_CHECK(shape == std::vector<int64_t>({B, L}), f.path(), ": tensor '", name,
                   "' has shape ", shape_text(shape), "; expected [", B, ", ", L, "]");
  const std::vector<double> v = tensor_values(f, name);
  std::vector<int64_t> lens(B);
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0;
    while (n < L && v[b * L + n] != 0) ++n;
    for (int64_t i = n; i < L; ++i)
      SEQPAR_ARG_CHECK(v[b * L + i] == 0, f.path(), ": tensor '", name, "' row ", b,
                       " is not 1s then 0s (valid tokens first, then padding); position ", i,
                       " is ", v[b * L + i], " after a 0");
    lens[b] = n;
  }
  return lens;
}

QwenImageRequest read_request(const DenoiseOptions& o, const QwenImageConfig& m) {
  const SafetensorsFile f(o.inputs);
  const std::string& p = o.inputs;
  static constexpr std::string_view kInputs[] = {"hidden_states",
                                                 "latents",
                                                 "encoder_hidden_states",
                                                 "encoder_hidden_states_mask",
                                                 "img_shapes",
                                                 "timestep",
                                                 "negative_encoder_hidden_states",
                                                 "negative_encoder_hidden_states_mask"};
  check_tensor_names(f, kInputs, "Qwen-Image");
  const std::string hidden = f.contains("hidden_states") ? "hidden_states" : "latents";
  SEQPAR_ARG_CHECK(f.contains(hidden), p, ": tensor 'hidden_states' is missing; expected [B, S, ",
                   m.in_channels, "] (the packed latents)");
  QwenImageRequest r;
  r.hidden = f.tensor(hidden, DType::kF32);
  const int64_t B = r.hidden.ndim() == 3 ? r.hidden.dim(0) : 1;
  SEQPAR_ARG_CHECK(f.contains("encoder_hidden_states"), p,
                   ": tensor 'encoder_hidden_states' is missing; expected [", B, ", L, ",
                   m.text_dim, "]");
  r.text = f.tensor("encoder_hidden_states", DType::kF32);
  const int64_t L = r.text.ndim() == 3 ? r.text.dim(1) : 0;
  r.text_lens = mask_lengths(f, "encoder_hidden_states_mask", B, L);
  if (f.contains("negative_encoder_hidden_states")) {
    r.negative = f.tensor("negative_encoder_hidden_states", DType::kF32);
    r.negative_lens = mask_lengths(f, "negative_encoder_hidden_states_mask", B,
                                   r.negative.ndim() == 3 ? r.negative.dim(1) : 0);
  }
  SEQPAR_ARG_CHECK(f.contains("img_shapes"), p,
                   ": tensor 'img_shapes' is missing; expected [N, 3] integers: frames, height "
                   "and width (in patches) of each image, their products summing to S");
  const std::vector<int64_t>& shape = f.entry("img_shapes").shape;
  SEQPAR_ARG_CHECK(shape.size() == 2 && shape[1] == 3 && shape[0] >= 1, p,
                   ": tensor 'img_shapes' has shape ", shape_text(shape), "; expected [N, 3]");
  const std::vector<double> dims = tensor_values(f, "img_shapes");
  for (int64_t i = 0; i < shape[0]; ++i) {
    std::array<int64_t, 3> fhw{};
    for (int a = 0; a < 3; ++a) {
      const double v = dims[i * 3 + a];
      SEQPAR_ARG_CHECK(v == std::floor(v) && v >= 1 && v <= 8192, p, ": tensor 'img_shapes' holds ",
                       v, "; expected whole numbers in 1..8192");
      fhw[a] = static_cast<int64_t>(v);
    }
    r.images.push_back(fhw);
  }
  SEQPAR_ARG_CHECK(f.contains("timestep"), p, ": tensor 'timestep' is missing; expected [", B,
                   "] in [0, 1] (the pipeline's t / 1000)");
  for (const double t : tensor_values(f, "timestep")) r.timesteps.push_back(static_cast<float>(t));
  r.guidance = static_cast<float>(o.guidance);
  check_qwen_image_request(m, r, p);
  return r;
}

struct QwenImageFamily {
  using Checkpoint = QwenImageCheckpoint;
  using Request = QwenImageRequest;
  using Rank = QwenImageRank;
  static constexpr const char* kName = "Qwen-Image";
  static constexpr const char* kJson = "qwen-image";
  static Checkpoint open(const std::string& dir) { return open_qwen_image(dir); }
  static Request read(const DenoiseOptions& o, const Checkpoint& ck) {
    return read_request(o, ck.config);
  }
};

}  // namespace

int denoise_qwen_image(const DenoiseOptions& o) { return mmdit::denoise_mmdit<QwenImageFamily>(o); }

}  // namespace seqpar::cli
