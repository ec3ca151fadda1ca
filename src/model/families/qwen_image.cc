// The Qwen-Image family on the dual-stream blocks (qwen_image.h): diffusers' config reader and
// its weight-name map (diffusers' names but for the FFNs' net.0.proj / net.2).
#include "seqpar/model/qwen_image.h"

#include <filesystem>
#include <map>
#include <set>

#include "../config_json.h"
#include "diffusers_checkpoint.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"

namespace seqpar {

namespace {

constexpr const char* kClass = "QwenImageTransformer2DModel";

QwenImageConfig read_config(const std::string& path) {
  const ConfigJson c = ConfigJson::parse(read_json_text(path), path);
  QwenImageConfig m;
  m.name = path;
  m.description = "Qwen-Image transformer";
  m.family = ModelFamily::kMMDiT;
  const int64_t p = c.integer("patch_size", 1, 16, 2);
  m.patch = {1, p, p};
  m.in_channels = c.integer("in_channels", 1, 1 << 16, 64);
  m.out_channels = c.integer("out_channels", 1, 1 << 16, 16);
  m.layers = c.integer("num_layers", 1, 1024, 60);
  m.head_dim = c.integer("attention_head_dim", 2, 1024, 128);
  m.heads = c.integer("num_attention_heads", 1, 1024, 24);
  m.text_dim = c.integer("joint_attention_dim", 1, 1 << 16, 3584);
  SEQPAR_FILE_CHECK(!c.boolean("guidance_embeds", false), path,
                    ": guidance_embeds is true; diffusers' QwenImageTransformer2DModel runs none "
                    "(its timestep embedding takes no guidance), expected false");
  m.axes_dims = read_axes_dims_rope(c, m.head_dim);
  m.kv_heads = m.heads;
  m.hidden = m.heads * m.head_dim;
  m.ffn_dim = 4 * m.hidden;
  m.freq_dim = 256;
  return m;
}

}  // namespace

std::string qwen_image_stored_name(const std::string& name) {
  return diffusers_ffn_name(name, {".img_mlp.", ".txt_mlp."});
}

QwenImageCheckpoint open_qwen_image(const std::string& dir) {
  check_model_dir(dir, "a diffusers QwenImagePipeline or QwenImageTransformer2DModel directory");
  QwenImageCheckpoint ck;
  ck.dir = diffusers_transformer_dir(dir, kClass);
  SEQPAR_FILE_CHECK(!ck.dir.empty(), dir,
                    ": no config.json or transformer/config.json with "
                    "_class_name \"",
                    kClass, "\"; expected a diffusers Qwen-Image checkpoint");
  const std::string config = ck.dir + "/config.json";
  ck.config = read_config(config);
  ck.tensors = open_diffusers_weights(ck.dir, config, QwenImage::parameters(ck.config),
                                      qwen_image_stored_name, kClass);
  return ck;
}

WeightStore qwen_image_weights(const QwenImageCheckpoint& ck) {
  WeightStore ws =
      map_diffusers_weights(ck.tensors, QwenImage::parameters(ck.config), qwen_image_stored_name);
  ws.set_activations(ck.activations);
  return ws;
}

double qwen_image_weight_bytes(const QwenImageCheckpoint& ck) {
  double bytes = 0;
  for (const auto& [name, file] : ck.tensors)
    bytes += static_cast<double>(file->entry(name).nbytes());
  return bytes;
}

}  // namespace seqpar
