// qwen_image_checkpoint: writes a seeded Qwen-Image-shaped transformer (diffusers'
// QwenImageTransformer2DModel: 24 heads of 128, hidden 3072, FFN 12288, text width 3584, packed
// latents of 64 channels; bf16, as published) with --layers blocks, and the inputs of one guided
// `seqpar denoise` call at --size x --size pixels (the 8x VAE and 2x2 packing: 1024 -> a 64 x 64
// grid, 4096 image tokens) with --text text tokens and their negative. Prints one JSON object:
// tokens and the FLOPs of one transformer call (matmuls 2·m·n·k, attention 4·S·S·dim over the
// joint sequence), for bench/qwen_image_step.sh.
//
//   qwen_image_checkpoint --out DIR [--layers 2] [--size 1024] [--text 512] [--dtype bf16|fp32]
//                         [--seed 0]
//
// Not a test: the weights are random (normal, std 0.02), the numbers only time the model.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "seqpar/core/tensor.h"
#include "seqpar/model/ops.h"
#include "seqpar/model/qwen_image.h"
#include "seqpar/model/safetensors.h"

namespace {

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr,
               "qwen_image_checkpoint: %s\nusage: qwen_image_checkpoint --out DIR [--layers 2] "
               "[--size 1024] [--text 512] [--dtype bf16|fp32] [--seed 0]\n",
               msg.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace seqpar;
  std::string out;
  int64_t layers = 2, size = 1024, text = 512;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--out")
      out = v;
    else if (a == "--layers")
      layers = std::atoll(v.c_str());
    else if (a == "--size")
      size = std::atoll(v.c_str());
    else if (a == "--text")
      text = std::atoll(v.c_str());
    else if (a == "--dtype" && (v == "bf16" || v == "fp32"))
      dtype = v == "bf16" ? DType::kBF16 : DType::kF32;
    else if (a == "--seed")
      seed = std::strtoull(v.c_str(), nullptr, 10);
    else
      usage("unknown option " + a);
  }
  if (out.empty()) usage("--out is required");
  if (layers < 1 || layers > 60) usage("--layers must be 1..60");
  if (size < 16 || size > 4096 || size % 16 != 0)
    usage("--size must be a multiple of 16 in 16..4096");
  if (text < 1 || text > 4096) usage("--text must be 1..4096");
  try {
    QwenImageConfig m;
    m.name = "qwen-image-bench";
    m.family = ModelFamily::kMMDiT;
    m.heads = m.kv_heads = 24;
    m.head_dim = 128;
    m.hidden = m.heads * m.head_dim;
    m.ffn_dim = 4 * m.hidden;
    m.in_channels = 64;
    m.out_channels = 16;
    m.text_dim = 3584;
    m.layers = layers;
    m.patch = {1, 2, 2};
    const std::string dir = out + "/qwen-image";
    ::mkdir(out.c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);

    // Stored in --dtype (bf16 as published) under diffusers' names, one parameter at a time.
    std::map<std::string, Tensor> t;
    for (const WeightStore::Spec& s : QwenImage::parameters(m))
      t[qwen_image_stored_name(s.name)] = WeightStore::random({s}, seed).get(s.name).to(dtype);
    write_safetensors(dir + "/diffusion_pytorch_model.safetensors", t);
    std::ofstream(dir + "/config.json")
        << "{\"_class_name\": \"QwenImageTransformer2DModel\", \"patch_size\": 2, "
        << "\"in_channels\": 64, \"out_channels\": 16, \"num_layers\": " << layers
        << ", \"attention_head_dim\": 128, \"num_attention_heads\": 24, "
        << "\"joint_attention_dim\": 3584, \"guidance_embeds\": false, "
        << "\"axes_dims_rope\": [16, 56, 56]}\n";

    const int64_t grid = size / 16, S = grid * grid;
    Tensor shapes({1, 3});
    shapes.data<float>()[0] = 1;
    shapes.data<float>()[1] = static_cast<float>(grid);
    shapes.data<float>()[2] = static_cast<float>(grid);
    Tensor timestep({1});
    timestep.data<float>()[0] = 0.5f;
    write_safetensors(
        out + "/inputs.safetensors",
        {{"hidden_states", random_normal({1, S, m.in_channels}, seed + 1)},
         {"encoder_hidden_states", random_normal({1, text, m.text_dim}, seed + 2)},
         {"negative_encoder_hidden_states", random_normal({1, text, m.text_dim}, seed + 3)},
         {"timestep", timestep},
         {"img_shapes", shapes}});

    // FLOPs of one transformer call: per block both streams' projections and FFNs, the joint
    // attention; outside, the embeddings and the head, less the last block's text FFN (skipped).
    const double Si = static_cast<double>(S), L = static_cast<double>(text),
                 D = static_cast<double>(m.hidden), F = static_cast<double>(m.ffn_dim);
    const double per_layer = 2 * (Si + L) * D * D * 4        // q, k, v, o of each stream
                             + 2 * (Si + L) * D * F * 2      // FFNs
                             + 4 * (Si + L) * (Si + L) * D;  // joint attention
    const double outside = 2 * Si * 64 * D + 2 * L * static_cast<double>(m.text_dim) * D +
                           2 * Si * D * 64 - 2 * L * D * F * 2;
    std::printf(
        "{\"dir\": \"%s\", \"dtype\": \"%s\", \"layers\": %lld, \"tokens\": %lld, \"text_tokens\": "
        "%lld, "
        "\"flops_per_call\": %.6e, \"flops_per_layer\": %.6e}\n",
        dir.c_str(), dtype == DType::kBF16 ? "bf16" : "fp32", static_cast<long long>(layers),
        static_cast<long long>(S), static_cast<long long>(text), per_layer * layers + outside,
        per_layer);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qwen_image_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
