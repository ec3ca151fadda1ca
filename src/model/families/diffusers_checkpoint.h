// What the diffusers-layout family readers share (families/qwen_image.cc, families/flux.cc): the
// weights of a transformer directory checked against the graph's parameters, the name map of
// diffusers' FeedForward, and the store a rank reads them through. Internal to the model layer.
// Thread-safety: reentrant.
#pragma once

#include <array>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "../config_json.h"
#include "seqpar/model/context.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {

using StoredName = std::function<std::string(const std::string&)>;

// dir's diffusion_pytorch_model.safetensors, or its sharded .index.json, opened; every parameter
// present as stored(name) with its shape, nothing else stored. Refusals in one line naming the
// tensor, the shape expected (from `config`) and, for a tensor too many, `model`'s class name.
SafetensorsFiles open_diffusers_weights(const std::string& dir, const std::string& config,
                                        const std::vector<WeightStore::Spec>& params,
                                        const StoredName& stored, const std::string& model);

// A store of the parameters mapped onto their stored tensors (read on request).
WeightStore map_diffusers_weights(const SafetensorsFiles& files,
                                  const std::vector<WeightStore::Spec>& params,
                                  const StoredName& stored);

// A config's axes_dims_rope (RoPE features per position axis; `fallback` when absent): three even
// widths summing to head_dim, each refusal one line naming the key.
std::array<int64_t, 3> read_axes_dims_rope(const ConfigJson& c, int64_t head_dim,
                                           std::array<int64_t, 3> fallback = {16, 56, 56});

// diffusers' FeedForward names for the blocks' GELU FFN: "<p><ffn>0.x" -> "<p><ffn>net.0.proj.x",
// "<p><ffn>2.x" -> "<p><ffn>net.2.x" for each `ffn` infix (".img_mlp."); other names unchanged.
std::string diffusers_ffn_name(const std::string& name, std::initializer_list<const char*> ffns);

}  // namespace seqpar
