// wan_checkpoint: writes a seeded Wan 2.1 T2V 1.3B-shaped transformer as a checkpoint in Wan's
// original layout (config.json, diffusion_pytorch_model.safetensors, fp32 as published) and the
// inputs of `seqpar denoise` for a video of --frames x --height x --width pixels (Wan's 4x8x8 VAE:
// 33 x 240 x 432 -> latents [1, 16, 9, 30, 54], 9 x 15 x 27 = 3645 tokens), with 512 text tokens
// of width 4096 and their negative. Prints one JSON object: tokens and the FLOPs of one
// transformer call (matmuls 2·m·n·k, attention 4·S·S_kv·dim), for bench/wan_step.sh.
//
//   wan_checkpoint --out DIR [--layers 30] [--frames 33] [--height 240] [--width 432] [--seed 0]
//
// Not a test: the weights are random (normal, std 0.02), the numbers only time the model.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "seqpar/core/tensor.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/ops.h"
#include "seqpar/model/presets.h"
#include "seqpar/model/safetensors.h"

namespace {

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr,
               "wan_checkpoint: %s\nusage: wan_checkpoint --out DIR [--layers 30] "
               "[--frames 33] [--height 240] [--width 432] [--seed 0]\n",
               msg.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace seqpar;
  std::string out;
  int64_t layers = 30, frames = 33, height = 240, width = 432;
  uint64_t seed = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--out")
      out = v;
    else if (a == "--layers")
      layers = std::atoll(v.c_str());
    else if (a == "--frames")
      frames = std::atoll(v.c_str());
    else if (a == "--height")
      height = std::atoll(v.c_str());
    else if (a == "--width")
      width = std::atoll(v.c_str());
    else if (a == "--seed")
      seed = std::strtoull(v.c_str(), nullptr, 10);
    else
      usage("unknown option " + a);
  }
  if (out.empty()) usage("--out is required");
  if (layers < 1 || layers > 30) usage("--layers must be 1..30");
  try {
    DiTConfig m = dit_preset("wan2.1-t2v-1.3b");
    m.layers = layers;
    const LatentShape s = latent_shape(m, frames, height, width);
    const std::string dir = out + "/wan";
    ::mkdir(out.c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);

    // DiT's parameters, stored under the same names in the published shapes.
    WeightStore ws = WeightStore::random(DiT::parameters(m), seed);
    std::map<std::string, Tensor> t = ws.all();
    const int64_t d = m.hidden;
    t["patch_embedding.weight"] = reshape(std::move(t["patch_embedding.weight"]),
                                          {d, m.in_channels, m.patch[0], m.patch[1], m.patch[2]});
    t["head.modulation"] = reshape(std::move(t["head.modulation"]), {1, 2, d});
    for (int64_t i = 0; i < layers; ++i) {
      const std::string n = "blocks." + std::to_string(i) + ".modulation";
      t[n] = reshape(std::move(t[n]), {1, 6, d});
    }
    write_safetensors(dir + "/diffusion_pytorch_model.safetensors", t);
    std::ofstream(dir + "/config.json")
        << "{\"_class_name\": \"WanModel\", \"model_type\": \"t2v\", \"dim\": " << d
        << ", \"ffn_dim\": " << m.ffn_dim << ", \"freq_dim\": " << m.freq_dim
        << ", \"in_dim\": " << m.in_channels << ", \"out_dim\": " << m.in_channels
        << ", \"num_heads\": " << m.heads << ", \"num_layers\": " << layers
        << ", \"text_len\": " << m.text_len << ", \"text_dim\": " << m.text_dim
        << ", \"eps\": 1e-06}\n";

    const int64_t L = m.text_len;
    write_safetensors(
        out + "/inputs.safetensors",
        {{"latents",
          random_normal({1, m.in_channels, s.latent_frames, s.latent_height, s.latent_width},
                        seed + 1)},
         {"encoder_hidden_states", random_normal({1, L, m.text_dim}, seed + 2)},
         {"negative_encoder_hidden_states", random_normal({1, L, m.text_dim}, seed + 3)},
         {"timestep", Tensor({1})}});

    // FLOPs of one transformer call.
    const double S = static_cast<double>(s.tokens), D = static_cast<double>(d),
                 F = static_cast<double>(m.ffn_dim), Lt = static_cast<double>(L),
                 pv = static_cast<double>(m.in_channels * m.patch[0] * m.patch[1] * m.patch[2]);
    const double per_layer = 2 * S * D * D * 4     // self-attention q, k, v, o
                             + 2 * S * D * D * 2   // cross-attention q, o
                             + 2 * Lt * D * D * 2  // cross-attention k, v of the text
                             + 2 * S * D * F * 2   // FFN
                             + 4 * S * S * D       // self-attention scores and values
                             + 4 * S * Lt * D;     // cross-attention
    const double outside = 2 * S * pv * D * 2      // patch, head
                           + 2 * Lt * (static_cast<double>(m.text_dim) + D) * D;  // text MLP
    std::printf(
        "{\"dir\": \"%s\", \"layers\": %lld, \"tokens\": %lld, \"text_tokens\": %lld, "
        "\"flops_per_call\": %.6e, \"flops_per_layer\": %.6e}\n",
        dir.c_str(), static_cast<long long>(layers), static_cast<long long>(s.tokens),
        static_cast<long long>(L), per_layer * layers + outside, per_layer);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wan_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
