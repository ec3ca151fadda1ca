// Architectures of real models and small test ones: the shapes the runnable models (model/)
// and the planner (plan/) share.
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

// Llama 3.1's RoPE frequency scaling (rope_scaling {"rope_type": "llama3", ...} in config.json):
// wavelengths longer than original_max_positions / low_freq_factor are divided by factor,
// shorter than original_max_positions / high_freq_factor kept, and those between interpolated.
// factor == 0: no scaling.
struct LlamaRopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_positions = 8192;
};
std::string_view model_family_name(ModelFamily f);

struct ModelPreset {
  std::string name;
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
  int64_t params = 0;     // parameter count, for memory estimates
  // dit (appended): what a Wan checkpoint's config sets
  int64_t out_channels = 0;     // predicted channels; 0: in_channels
  double eps = 1e-6;            // LayerNorm and QK-norm epsilon
  bool cross_attn_norm = true;  // affine LayerNorm (norm3) before the cross-attention
  // llm, as Hugging Face's LlamaConfig names them (config.json)
  double rms_norm_eps = 1e-5;
  int64_t max_positions = 0;  // max_position_embeddings (0: no limit)
  LlamaRopeScaling rope_scaling;
  bool tie_embeddings = false;  // tie_word_embeddings: lm_head is embed_tokens
  bool attention_bias = false;  // q/k/v/o biases
  bool mlp_bias = false;        // gate/up/down biases
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
