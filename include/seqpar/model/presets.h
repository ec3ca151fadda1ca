// Architectures of real models and small test ones: the shapes the runnable models (model/)
// and the planner (plan/) share. What only a family's blocks need (norm epsilons, biases, RoPE
// scaling, ...) is in its config beside these shapes: DecoderConfig (decoder.h) for causal
// language models, DiTConfig (dit.h) for Wan; decoder_preset() and dit_preset() give the
// runnable presets as those configs.
//   dit:   Wan-style text-to-video transformer (3-D patches of a VAE latent, text
//          cross-attention, adaLN modulation);
//   mmdit: FLUX / Qwen-Image-style dual-stream transformer (image and text tokens in one joint
//          attention);
//   llm:   Llama-style decoder (GQA, causal, RoPE).
// Thread-safety: immutable values.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace seqpar {

enum class ModelFamily { kDiT, kMMDiT, kLlm };

std::string_view model_family_name(ModelFamily f);

struct ModelPreset {
  std::string name;
  std::vector<std::string> aliases;  // other names it answers to ("flux-dev")
  std::string description;
  ModelFamily family = ModelFamily::kDiT;
  int64_t hidden = 0;    // model width
  int64_t heads = 0;     // attention heads
  int64_t kv_heads = 0;  // == heads unless GQA
  int64_t head_dim = 0;
  int64_t layers = 0;    // transformer blocks (mmdit: dual-stream + single-stream)
  int64_t ffn_dim = 0;
  // dit / mmdit
  int64_t in_channels = 0;                  // latent channels
  std::array<int64_t, 3> patch{1, 2, 2};    // frames, height, width
  std::array<int64_t, 3> vae_stride{4, 8, 8};
  int64_t text_dim = 0;   // width of the text encoder states
  int64_t text_len = 0;   // text tokens
  int64_t freq_dim = 0;   // timestep embedding width
  bool video = false;     // frames beyond one
  // llm
  int64_t vocab = 0;
  double rope_theta = 10000.0;
  int64_t params = 0;  // parameter count, for memory estimates
};

// Throws InvalidArgument listing the known names.
const ModelPreset& model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// The token grid of a DiT input: latent frames (F-1)/stride_t + 1, latent height and width
// H/stride_h, W/stride_w, then patches. tokens = grid[0]·grid[1]·grid[2].
struct LatentShape {
  int64_t latent_frames = 0, latent_height = 0, latent_width = 0;
  std::array<int64_t, 3> grid{};  // tokens along frames, height, width
  int64_t tokens = 0;
};
// Throws InvalidArgument naming the nearest valid sizes when frames, height or width do not fit
// the VAE stride and patch (frames: 4k+1 for video; height, width: multiples of stride·patch).
LatentShape latent_shape(const ModelPreset& m, int64_t frames, int64_t height, int64_t width);

}  // namespace seqpar
