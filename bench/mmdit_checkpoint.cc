// mmdit_checkpoint: writes a seeded dual-stream transformer of a real model's shape in diffusers'
// layout, bf16 as published (or --dtype fp32), with fewer blocks, and the inputs of one guided
// `seqpar denoise` call at --size x --size pixels (the 8x VAE and 2x2 packing: 1024 -> 4096 image
// tokens) with --text text tokens and their negative:
//   qwen-image: QwenImageTransformer2DModel, 24 heads of 128, FFN 12288, text width 3584,
//               --layers dual-stream blocks (the model has 60);
//   flux:       FluxTransformer2DModel of FLUX.1-dev (guidance embedding, pooled width 768, text
//               width 4096), --layers double-stream and --single single-stream blocks (19, 38).
// Prints one JSON object: tokens, the FLOPs of one transformer call (matmuls 2·m·n·k, attention
// 4·(S+L)²·dim over the joint sequence) and of one block (both kinds cost 12·hidden² a token in
// their matmuls), and the model's own block count, for bench/mmdit_step.sh.
//
//   mmdit_checkpoint --out DIR --family qwen-image|flux [--layers 2] [--single 0] [--size 1024]
//                    [--text 512] [--dtype bf16|fp32] [--seed 0]
//
// Not a test: the weights are random (normal, std 0.02), the numbers only time the model.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "seqpar/core/tensor.h"
#include "seqpar/model/flux.h"
#include "seqpar/model/ops.h"
#include "seqpar/model/qwen_image.h"
#include "seqpar/model/safetensors.h"

namespace {

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr,
               "mmdit_checkpoint: %s\nusage: mmdit_checkpoint --out DIR --family qwen-image|flux "
               "[--layers 2] [--single 0] [--size 1024] [--text 512] [--dtype bf16|fp32] "
               "[--seed 0]\n",
               msg.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace seqpar;
  std::string out, family;
  int64_t layers = 2, single = 0, size = 1024, text = 512;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--out")
      out = v;
    else if (a == "--family" && (v == "qwen-image" || v == "flux"))
      family = v;
    else if (a == "--layers")
      layers = std::atoll(v.c_str());
    else if (a == "--single")
      single = std::atoll(v.c_str());
    else if (a == "--size")
      size = std::atoll(v.c_str());
    else if (a == "--text")
      text = std::atoll(v.c_str());
    else if (a == "--dtype" && (v == "bf16" || v == "fp32"))
      dtype = v == "bf16" ? DType::kBF16 : DType::kF32;
    else if (a == "--seed")
      seed = std::strtoull(v.c_str(), nullptr, 10);
    else
      usage("unknown option or value " + a + " " + v);
  }
  if (out.empty() || family.empty()) usage("--out and --family are required");
  const bool flux = family == "flux";
  if (layers < 0 || layers > 60 || single < 0 || single > 38 || layers + single < 1 ||
      (!flux && single > 0))
    usage("--layers 0..60 and --single 0..38 (flux only), at least one block");
  if (size < 16 || size > 4096 || size % 16 != 0)
    usage("--size must be a multiple of 16 in 16..4096");
  if (text < 1 || text > 4096) usage("--text must be 1..4096");
  try {
    const int64_t heads = 24, head_dim = 128, d = heads * head_dim, grid = size / 16,
                  S = grid * grid;
    const std::string dir = out + "/" + family;
    ::mkdir(out.c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);
    std::vector<WeightStore::Spec> params;
    std::function<std::string(const std::string&)> stored;
    std::map<std::string, Tensor> inputs;
    int64_t text_dim = 0, in_channels = 64, model_layers = 0;
    if (flux) {
      FluxConfig m;
      m.heads = m.kv_heads = heads;
      m.head_dim = head_dim;
      m.hidden = d;
      m.ffn_dim = 4 * d;
      m.in_channels = 64;
      m.out_channels = 64;
      m.patch = {1, 1, 1};
      m.text_dim = text_dim = 4096;
      m.pooled_dim = 768;
      m.guidance_embeds = true;
      m.layers = layers;
      m.single_layers = single;
      params = Flux::parameters(m);
      stored = flux_stored_name;
      model_layers = 19 + 38;
      std::ofstream(dir + "/config.json")
          << "{\"_class_name\": \"FluxTransformer2DModel\", \"patch_size\": 1, "
          << "\"in_channels\": 64, \"out_channels\": null, \"num_layers\": " << layers
          << ", \"num_single_layers\": " << single
          << ", \"attention_head_dim\": 128, \"num_attention_heads\": 24, "
          << "\"joint_attention_dim\": 4096, \"pooled_projection_dim\": 768, "
          << "\"guidance_embeds\": true, \"axes_dims_rope\": [16, 56, 56]}\n";
      // FluxPipeline's ids: the image grid's (0, row, column), the text's zeros.
      Tensor img_ids({S, 3}), txt_ids({text, 3});
      for (int64_t y = 0; y < grid; ++y)
        for (int64_t x = 0; x < grid; ++x) {
          img_ids.data<float>()[(y * grid + x) * 3 + 1] = static_cast<float>(y);
          img_ids.data<float>()[(y * grid + x) * 3 + 2] = static_cast<float>(x);
        }
      Tensor guidance({1});
      guidance.data<float>()[0] = 3.5f;
      inputs = {{"img_ids", img_ids},
                {"txt_ids", txt_ids},
                {"guidance", guidance},
                {"pooled_projections", random_normal({1, 768}, seed + 4)},
                {"negative_pooled_projections", random_normal({1, 768}, seed + 5)}};
    } else {
      QwenImageConfig m;
      m.heads = m.kv_heads = heads;
      m.head_dim = head_dim;
      m.hidden = d;
      m.ffn_dim = 4 * d;
      m.in_channels = 64;
      m.out_channels = 16;
      m.text_dim = text_dim = 3584;
      m.layers = layers;
      m.patch = {1, 2, 2};
      params = QwenImage::parameters(m);
      stored = qwen_image_stored_name;
      model_layers = 60;
      std::ofstream(dir + "/config.json")
          << "{\"_class_name\": \"QwenImageTransformer2DModel\", \"patch_size\": 2, "
          << "\"in_channels\": 64, \"out_channels\": 16, \"num_layers\": " << layers
          << ", \"attention_head_dim\": 128, \"num_attention_heads\": 24, "
          << "\"joint_attention_dim\": 3584, \"guidance_embeds\": false, "
          << "\"axes_dims_rope\": [16, 56, 56]}\n";
      Tensor shapes({1, 3});
      shapes.data<float>()[0] = 1;
      shapes.data<float>()[1] = static_cast<float>(grid);
      shapes.data<float>()[2] = static_cast<float>(grid);
      inputs = {{"img_shapes", shapes}};
    }
    // Stored in --dtype (bf16 as published) under diffusers' names, one parameter at a time.
    std::map<std::string, Tensor> t;
    for (const WeightStore::Spec& s : params)
      t[stored(s.name)] = WeightStore::random({s}, seed).get(s.name).to(dtype);
    write_safetensors(dir + "/diffusion_pytorch_model.safetensors", t);
    Tensor timestep({1});
    timestep.data<float>()[0] = 0.5f;
    inputs["hidden_states"] = random_normal({1, S, in_channels}, seed + 1);
    inputs["encoder_hidden_states"] = random_normal({1, text, text_dim}, seed + 2);
    inputs["negative_encoder_hidden_states"] = random_normal({1, text, text_dim}, seed + 3);
    inputs["timestep"] = timestep;
    write_safetensors(out + "/inputs.safetensors", inputs);

    // FLOPs of one transformer call: per block the projections and FFNs of every token (12·d²
    // a token in either kind of block) and the joint attention; outside, the embeddings and the
    // head (Qwen-Image skips its last block's text FFN).
    const double Si = static_cast<double>(S), L = static_cast<double>(text),
                 D = static_cast<double>(d), F = 4 * D;
    const double per_layer = 2 * (Si + L) * (4 * D * D + 2 * D * F) + 4 * (Si + L) * (Si + L) * D;
    double outside = 2 * Si * static_cast<double>(in_channels) * D +
                     2 * L * static_cast<double>(text_dim) * D + 2 * Si * D * 64;
    if (!flux) outside -= 2 * L * D * F * 2;
    std::printf(
        "{\"dir\": \"%s\", \"family\": \"%s\", \"dtype\": \"%s\", \"layers\": %lld, "
        "\"model_layers\": %lld, \"tokens\": %lld, \"text_tokens\": %lld, "
        "\"flops_per_call\": %.6e, \"flops_per_layer\": %.6e}\n",
        dir.c_str(), family.c_str(), dtype == DType::kBF16 ? "bf16" : "fp32",
        static_cast<long long>(layers + single), static_cast<long long>(model_layers),
        static_cast<long long>(S), static_cast<long long>(text),
        per_layer * static_cast<double>(layers + single) + outside, per_layer);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mmdit_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
