// The FLUX.1 family on the dual-stream and single-stream blocks (flux.h): diffusers' config
// reader and its weight-name map (diffusers' names but for the FFNs' net.0.proj / net.2).
#include "seqpar/model/flux.h"

#include <filesystem>
#include <map>
#include <set>

#include "../config_json.h"
#include "diffusers_checkpoint.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"

namespace seqpar {

namespace {

constexpr const char* kClass = "FluxTransformer2DModel";

FluxConfig read_config(const std::string& path) {
  const ConfigJson c = ConfigJson::parse(read_json_text(path), path);
  FluxConfig m;
  m.name = path;
  m.description = "FLUX.1 transformer";
  m.family = ModelFamily::kMMDiT;
  const int64_t p = c.integer("patch_size", 1, 16, 1);
  m.patch = {1, p, p};
  m.in_channels = c.integer("in_channels", 1, 1 << 16, 64);
  m.out_channels = c.integer("out_channels", 1, 1 << 16, m.in_channels);
  m.layers = c.integer("num_layers", 0, 1024, 19);
  m.single_layers = c.integer("num_single_layers", 0, 1024, 38);
  m.head_dim = c.integer("attention_head_dim", 2, 1024, 128);
  m.heads = c.integer("num_attention_heads", 1, 1024, 24);
  m.text_dim = c.integer("joint_attention_dim", 1, 1 << 16, 4096);
  m.pooled_dim = c.integer("pooled_projection_dim", 1, 1 << 16, 768);
  m.guidance_embeds = c.boolean("guidance_embeds", false);
  m.axes_dims = read_axes_dims_rope(c, m.head_dim);
  m.kv_heads = m.heads;
  m.hidden = m.heads * m.head_dim;
  m.ffn_dim = 4 * m.hidden;  // FeedForward's and proj_mlp's mlp_ratio 4
  m.freq_dim = 256;
  return m;
}

}  // namespace

std::string flux_stored_name(const std::string& name) {
  return diffusers_ffn_name(name, {".ff.", ".ff_context."});
}

FluxCheckpoint open_flux(const std::string& dir) {
  check_model_dir(dir, "a diffusers FluxPipeline or FluxTransformer2DModel directory");
  FluxCheckpoint ck;
  ck.dir = diffusers_transformer_dir(dir, kClass);
  SEQPAR_FILE_CHECK(!ck.dir.empty(), dir,
                    ": no config.json or transformer/config.json with "
                    "_class_name \"",
                    kClass, "\"; expected a diffusers FLUX.1 checkpoint");
  const std::string config = ck.dir + "/config.json";
  ck.config = read_config(config);
  ck.tensors =
      open_diffusers_weights(ck.dir, config, Flux::parameters(ck.config), flux_stored_name, kClass);
  return ck;
}

WeightStore flux_weights(const FluxCheckpoint& ck) {
  WeightStore ws = map_diffusers_weights(ck.tensors, Flux::parameters(ck.config), flux_stored_name);
  ws.set_activations(ck.activations);
  return ws;
}

}  // namespace seqpar
