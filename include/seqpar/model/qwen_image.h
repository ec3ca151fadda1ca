// Qwen-Image: the dual-stream (MMDiT) diffusion transformer of diffusers'
// QwenImageTransformer2DModel, composed of the shared blocks:
//   packed latents (B, S, in_channels)  -> img_in (Linear)                         image stream
//   text states (B, L, text_dim)        -> txt_norm (RMSNorm) -> txt_in (Linear)   text stream
//   timestep t (0..1) -> sinusoid(1000·t, 256) -> Linear -> SiLU -> Linear -> temb
//   N dual-stream blocks, each stream with its own adaLN (SiLU -> Linear(6·hidden) of temb):
//     x += gate · JointAttention(modulate(LayerNorm(x)), modulate(LayerNorm(c)))  and c likewise
//     x += gate · FFN_img(modulate(LayerNorm(x)));  c += gate · FFN_txt(modulate(LayerNorm(c)))
//   norm_out (LayerNorm, scale then shift of SiLU(temb)) -> proj_out -> (B, S, p·p·out_channels)
// RoPE (diffusers' QwenEmbedRope, scale_rope): image token (f, y, x) of image i on grid (F, H, W)
// rotates by frame i + f, row y − ⌈H/2⌉, column x − ⌈W/2⌉ over the axes' pairs (axes_dims_rope,
// interleaved pairs); text token j by m + j on every axis, m = max over images of max(⌊H/2⌋,
// ⌊W/2⌋).
// Sequence parallel by its SpPlan: the image tokens (and their RoPE rows) sharded at the first
// block, gathered after proj_out; the text stream replicated and attended once (joint attention).
// Tensor parallel over heads and FFN columns; the adaLN projections split by rows over tp and
// all-gathered.
// Thread-safety: one QwenImage per rank thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "seqpar/model/blocks/ffn.h"
#include "seqpar/model/blocks/joint_attention.h"
#include "seqpar/model/blocks/linear.h"
#include "seqpar/model/blocks/norm.h"
#include "seqpar/model/context.h"
#include "seqpar/model/presets.h"
#include "seqpar/model/safetensors.h"
#include "seqpar/model/sp_plan.h"

namespace seqpar {

// The config of a QwenImageTransformer2DModel: ModelPreset's shapes (hidden = heads·head_dim,
// ffn_dim = 4·hidden, in_channels, text_dim = joint_attention_dim, layers, patch {1, p, p}) and
// the rest of diffusers' config.
struct QwenImageConfig : ModelPreset {
  int64_t out_channels = 16;                     // predicted channels per patch position
  std::array<int64_t, 3> axes_dims{16, 56, 56};  // RoPE features per axis (frame, height, width)
  double eps = 1e-6;

  int64_t patch_size() const { return patch[1]; }
  int64_t out_features() const { return patch[1] * patch[2] * out_channels; }
  AttentionSpec image_attention() const;  // to_q, to_k, to_v, to_out.0; norm_q, norm_k
  AttentionSpec text_attention() const;   // add_q_proj, ..., to_add_out; norm_added_q, _k
};

// RoPE tables (tokens, head_dim/2, 2) of one call: the image tokens of `images` (frames, height,
// width each, in order) and `text_len` text tokens.
struct QwenImageRope {
  Tensor image, text;
};
QwenImageRope qwen_image_rope(std::span<const std::array<int64_t, 3>> images, int64_t text_len,
                              std::array<int64_t, 3> axes_dims, double theta = 10000.0);

class QwenImage {
 public:
  // Parameter names (diffusers', the FFNs' net.0.proj / net.2 as .0 / .2) and shapes.
  static std::vector<WeightStore::Spec> parameters(const QwenImageConfig& m);
  static const SpPlan& sp_plan();

  QwenImage(const QwenImageConfig& m, const WeightStore& ws, const ParallelContext& ctx);

  // One forward of one batch row: hidden (1, S, in_channels) of the images `images` (their
  // f·h·w summing to S) at timestep t in [0, 1], text (1, L, text_dim) (the row's valid tokens
  // only). Every rank of the mesh returns the prediction (1, S, out_features).
  Tensor forward(const Tensor& hidden, std::span<const std::array<int64_t, 3>> images, float t,
                 const Tensor& text, ParallelContext& ctx) const;

  const QwenImageConfig& config() const { return m_; }

 private:
  struct Stream {
    ColumnLinear mod;  // this tp rank's rows of <stream>_mod.1 (6·hidden, hidden)
    FeedForward ffn;
  };
  struct Block {
    Stream image, text;
    JointAttention attn;
  };
  // The 6·hidden modulation of a stream from silu(temb), gathered over tp.
  std::vector<float> modulation(const Stream& s, const Tensor& temb_act, Communicator& tp) const;

  QwenImageConfig m_;
  Linear img_in_, txt_in_, time_fc1_, time_fc2_, norm_out_, proj_out_;
  RmsNorm txt_norm_;
  std::vector<Block> blocks_;
};

// A Qwen-Image checkpoint in diffusers' layout: a QwenImagePipeline directory (model_index.json,
// transformer/), or a transformer directory itself (config.json with _class_name
// QwenImageTransformer2DModel; weights diffusion_pytorch_model.safetensors or its sharded
// .index.json). Every parameter is checked present with its shape, nothing else stored.
struct QwenImageCheckpoint {
  std::string dir;  // the transformer directory
  QwenImageConfig config;
  SafetensorsFiles tensors;  // stored name -> its file
  // The linear layers' inputs as computed (fp32) or rounded to bf16 (WeightStore::activations;
  // `seqpar denoise --activations`), set before qwen_image_weights().
  DType activations = DType::kF32;
};

// Opens the config and weight files (tensors read later, on request). InvalidArgument in one
// line naming the file, key or tensor and what was expected.
QwenImageCheckpoint open_qwen_image(const std::string& dir);
// The parameters under QwenImage's names, mapped onto the files (a store per rank).
WeightStore qwen_image_weights(const QwenImageCheckpoint& ck);
// The stored (diffusers) name of QwenImage parameter `name`.
std::string qwen_image_stored_name(const std::string& name);
// Bytes of tensor data the weights take as stored.
double qwen_image_weight_bytes(const QwenImageCheckpoint& ck);

// One transformer call as diffusers' QwenImagePipeline makes it, for a batch of B rows:
//   hidden (B, S, in_channels): the packed latents of `images` (f·h·w summing to S);
//   timesteps [B] in [0, 1] (the pipeline's t / 1000);
//   text (B, L, text_dim) with text_lens[b] valid tokens in row b (a prefix; the rest is padding,
//   masked: row b gives what the row alone with its valid tokens gives);
//   negative (B, L', text_dim) with negative_lens, or empty: no guidance.
struct QwenImageRequest {
  Tensor hidden;
  std::vector<std::array<int64_t, 3>> images;
  std::vector<float> timesteps;
  Tensor text;
  std::vector<int64_t> text_lens;
  Tensor negative;
  std::vector<int64_t> negative_lens;
  float guidance = 1.0f;  // true_cfg_scale: applied when > 1 and negative is given
};

// Checks a request against config m, each problem one line naming the tensor as diffusers' call
// names it, prefixed by `where`.
void check_qwen_image_request(const QwenImageConfig& m, const QwenImageRequest& r,
                              const std::string& where);

// A rank's Qwen-Image transformer on its mesh.
class QwenImageRank {
 public:
  QwenImageRank(const QwenImageCheckpoint& ck, const ParallelContext& ctx);
  // The noise prediction (B, S, out_features), row by row; guided as QwenImagePipeline combines
  // the branches: c = u + g·(p − u), rescaled per token to the norm of p (unguided on a cfg
  // group of 2: both groups compute it). Every rank returns it.
  Tensor predict(const QwenImageRequest& r, ParallelContext& ctx) const;
  // The two branches unguided, {conditional, unconditional}: on a cfg group of 2 in one parallel
  // call (cfg rank 0: conditional), else one after the other.
  std::array<Tensor, 2> branches(const QwenImageRequest& r, ParallelContext& ctx) const;
  // One branch: the prediction for `text` with `lens`.
  Tensor branch(const QwenImageRequest& r, const Tensor& text, const std::vector<int64_t>& lens,
                ParallelContext& ctx) const;
  int64_t weight_bytes() const { return weight_bytes_; }
  const QwenImageConfig& config() const { return model_.config(); }

 private:
  int64_t weight_bytes_ = 0;  // set while model_ loads: declared first
  QwenImage model_;
};

}  // namespace seqpar
