// The Wan family: Wan 2.1 / 2.2 text-to-video and Wan 2.1 image-to-video checkpoints as
// published, in two layouts, each with its config reader and weight-name map onto the DiT's
// blocks (dit.h):
//   diffusers: DIR/model_index.json + DIR/transformer[/_2]/config.json (_class_name
//              WanTransformer3DModel), or a transformer directory itself; weights
//              diffusion_pytorch_model.safetensors or its sharded .index.json;
//   original:  DIR/config.json (dim, ffn_dim, freq_dim, in_dim, out_dim, num_heads, num_layers,
//              text_len, eps, model_type) with the same weight file names; Wan 2.2 A14B as
//              DIR/high_noise_model and DIR/low_noise_model.
// Both map onto DiT's parameter names (Wan's original names) and shapes; the few tensors whose
// shape or row order differs are transformed here, once (docs/models.md "Wan checkpoints"):
//   patch_embedding.weight  Conv3d [dim, C, pt, ph, pw]  -> [dim, C·pt·ph·pw]
//   blocks.i.modulation     [1, 6, dim]                   -> [6, dim]
//   head.modulation         [1, 2, dim]                   -> [2, dim]
//   head.head.weight/.bias  rows (pt, ph, pw, C) order    -> rows (C, pt, ph, pw) order
// Every other tensor is mapped, so each rank reads only its tensor-parallel share, in the
// checkpoint's dtype. Image-to-video (diffusers: image_dim and added_kv_proj_dim set; original:
// model_type "i2v") adds Wan's img_emb.proj.{0,1,3,4} (diffusers'
// condition_embedder.image_embedder.{norm1, ff.net.0.proj, ff.net.2, norm2}) and per block
// cross_attn.{k_img, v_img, norm_k_img} (attn2.{add_k_proj, add_v_proj, norm_added_k});
// first-last-frame (pos_embed_seq_len, flf2v) is refused.
// The sampler reproduces diffusers' FlowMatchEulerDiscreteScheduler.
// Thread-safety: the functions are reentrant; a WanExpert is an immutable value whose files may be
// read from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "seqpar/model/context.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {

enum class WanLayout { kDiffusers, kOriginal };
std::string_view wan_layout_name(WanLayout layout);

// One transformer of a checkpoint: its shapes and its opened weight files.
struct WanExpert {
  std::string dir;  // the directory of its config and weights
  WanLayout layout = WanLayout::kDiffusers;
  DiTConfig preset;  // the config's shapes, out_channels, eps, cross_attn_norm
  // Stored tensor name -> the file holding it (one file, or the shards of an index).
  std::vector<std::pair<std::string, std::shared_ptr<const SafetensorsFile>>> tensors;
};

// A Wan model: one transformer, or Wan 2.2 A14B's two experts, experts[0] for the high-noise
// timesteps t >= boundary_ratio·1000 and experts[1] below (as diffusers' WanPipeline switches
// transformer and transformer_2).
struct WanModel {
  std::vector<WanExpert> experts;
  std::optional<double> boundary_ratio;  // set when there are two experts
  // The linear layers' inputs (the patch embedding's included) as computed (fp32) or rounded to
  // bf16 (WeightStore::activations; `seqpar denoise --activations`), for every expert.
  DType activations = DType::kF32;
};

// Detects the layout of `dir` and opens its configs and weight files (tensors read later, on
// request). Throws InvalidArgument with one line naming the file, key or tensor and what was
// expected: a directory in neither layout, a config key missing or out of range, first-last-frame
// conditioning (pos_embed_seq_len, flf2v), a missing, misshapen or unexpected tensor.
WanModel open_wan_model(const std::string& dir);

// Bytes of tensor data the experts' weights take as stored (every expert; for memory estimates).
double wan_weight_bytes(const WanModel& model);

// The expert's parameters under DiT's names, in a store of its own (one per rank: a store counts
// the bytes its rank reads).
WeightStore wan_weights(const WanExpert& expert);

// The stored name of DiT parameter `name` in `layout` ("blocks.0.self_attn.q.weight" ->
// "blocks.0.attn1.to_q.weight" in diffusers; the same name in the original layout).
std::string wan_stored_name(const std::string& name, WanLayout layout);

// diffusers' FlowMatchEulerDiscreteScheduler (num_train_timesteps 1000, static shift) after
// set_timesteps(steps): `steps` sigmas from 1 down, shifted, then 0 appended; timestep i is
// 1000·sigmas[i] (fp32, as diffusers rounds them). Euler: x += (sigmas[i+1] − sigmas[i])·v.
struct FlowMatchSchedule {
  std::vector<float> sigmas;     // steps + 1
  std::vector<float> timesteps;  // steps
};
FlowMatchSchedule flow_match_schedule(int steps, double shift);

}  // namespace seqpar
