// FLUX.1: the dual-stream then single-stream (MMDiT) diffusion transformer of diffusers'
// FluxTransformer2DModel (FLUX.1-dev with its guidance embedding, FLUX.1-schnell without),
// composed of the shared blocks:
//   packed latents (B, S, in_channels)  -> x_embedder (Linear)           image stream
//   text states (B, L, text_dim)        -> context_embedder (Linear)     text stream
//   temb = TimestepEmbedding(sinusoid(1000·t, 256)) [+ the same of 1000·guidance (dev)]
//          + text_embedder(pooled (B, pooled_dim)): Linear -> SiLU -> Linear
//   num_layers double-stream blocks, each stream with its own AdaLayerNormZero (SiLU -> Linear
//   (6·hidden) of temb: shift, scale, gate of the attention, then of the FFN):
//     x += gate · JointAttention(modulate(LayerNorm(x)), modulate(LayerNorm(c)))  and c likewise
//     x += gate · ff(modulate(LayerNorm(x)));  c += gate · ff_context(modulate(LayerNorm(c)))
//   num_single_layers single-stream blocks over [text, image] with one AdaLayerNormZeroSingle
//   (shift, scale, gate) and one set of weights for every token:
//     h = modulate(LayerNorm([c, x]))
//     [c, x] += gate · proj_out(concat(attn(h), gelu(proj_mlp(h))))
//     (attn: to_q/k/v + norm_q/k, RoPE, no output projection)
//   norm_out (LayerNorm, scale then shift of SiLU(temb)) -> proj_out -> (B, S, p·p·out_channels)
// RoPE (diffusers' FluxPosEmbed): token i with ids (a0, a1, a2) (txt_ids (L, 3), img_ids (S, 3))
// rotates pair k of axis j by a_j · theta^(-2k/axes_dims[j]) over interleaved pairs (2k, 2k+1),
// the angle and its cos/sin in float64, then rounded to fp32 as FluxPosEmbed does on the CPU.
// Sequence parallel by its SpPlan: the image tokens (and their RoPE rows) sharded at x_embedder,
// through every block, gathered after proj_out. The text rows are split over the
// group too (forward() does it): rank r of N embeds and carries text rows [r·L/N, (r+1)·L/N)
// through every block, and each block all-gathers the text q/k/v so that the joint attention (the
// one attention entry point's joint path; in the single blocks with the same projections for
// both streams) sees every text key once; nothing reads the text after the blocks, so it is never
// gathered (docs/models.md: what each rank computes).
// Tensor parallel over heads and MLP columns; the adaLN projections split by rows over tp and
// all-gathered.
// Thread-safety: one Flux per rank thread.
#pragma once

#include <array>
#include <cstdint>
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

// The config of a FluxTransformer2DModel: ModelPreset's shapes (hidden = heads·head_dim,
// ffn_dim = 4·hidden, in_channels, text_dim = joint_attention_dim, layers = num_layers, patch
// {1, p, p}) and the rest of diffusers' config.
struct FluxConfig : ModelPreset {
  int64_t single_layers = 38;
  int64_t out_channels = 64;  // predicted channels per patch position (default in_channels)
  int64_t pooled_dim = 768;   // pooled_projection_dim
  bool guidance_embeds = false;
  std::array<int64_t, 3> axes_dims{16, 56, 56};  // RoPE features per id axis

  int64_t patch_size() const { return patch[1]; }
  int64_t out_features() const { return patch[1] * patch[2] * out_channels; }
  AttentionSpec image_attention() const;   // to_q, to_k, to_v, to_out.0; norm_q, norm_k
  AttentionSpec text_attention() const;    // add_q_proj, ..., to_add_out; norm_added_q, _k
  AttentionSpec single_attention() const;  // to_q, to_k, to_v (no output projection); norm_q, _k
};

// The RoPE table (tokens, head_dim/2, 2) of ids (tokens, 3) (row-major, as the pipeline's
// txt_ids or img_ids hold them), as FluxPosEmbed computes it.
Tensor flux_rope(const std::vector<float>& ids, std::array<int64_t, 3> axes_dims,
                 double theta = 10000.0);

class Flux {
 public:
  // Parameter names (diffusers', the FFNs' net.0.proj / net.2 as .0 / .2) and shapes.
  static std::vector<WeightStore::Spec> parameters(const FluxConfig& m);
  static const SpPlan& sp_plan();

  Flux(const FluxConfig& m, const WeightStore& ws, const ParallelContext& ctx);

  // One forward of one batch row: hidden (1, S, in_channels) with img_ids (S·3), text (1, L,
  // text_dim) with txt_ids (L·3), pooled (pooled_dim), timestep t in [0, 1], guidance (the
  // pipeline's guidance_scale; used when the config has guidance_embeds). Every rank of the mesh
  // returns the prediction (1, S, out_features).
  Tensor forward(const Tensor& hidden, const std::vector<float>& img_ids, const Tensor& text,
                 const std::vector<float>& txt_ids, const float* pooled, float t, float guidance,
                 ParallelContext& ctx) const;

  const FluxConfig& config() const { return m_; }

 private:
  struct DoubleBlock {
    ColumnLinear mod_image, mod_text;  // this tp rank's rows of norm1(_context).linear
    JointAttention attn;
    FeedForward ff, ff_context;
  };
  struct SingleBlock {
    ColumnLinear mod;  // this tp rank's rows of norm.linear (3·hidden, hidden)
    StreamProjections attn;
    ColumnLinear proj_mlp;            // this rank's MLP columns
    Tensor out_attn, out_mlp, out_b;  // proj_out's columns of this rank's heads and MLP columns
  };
  // A modulation's rows from silu(temb), gathered over tp.
  std::vector<float> modulation(const ColumnLinear& mod, int64_t rows, const Tensor& temb_act,
                                Communicator& tp) const;
  // proj_out of a single block: (.., h·D) and (.., mlp columns) -> (.., hidden), all-reduced.
  Tensor single_out(const SingleBlock& s, const Tensor& attn, const Tensor& mlp,
                    Communicator& tp) const;

  FluxConfig m_;
  int64_t h0_ = 0, h1_ = 0;
  DType activations_ = DType::kF32;  // proj_out's inputs rounded to it (WeightStore::activations)
  Linear x_embedder_, context_embedder_, time_fc1_, time_fc2_, guidance_fc1_, guidance_fc2_,
      text_fc1_, text_fc2_, norm_out_, proj_out_;
  std::vector<DoubleBlock> blocks_;
  std::vector<SingleBlock> singles_;
};

// A FLUX.1 checkpoint in diffusers' layout: a FluxPipeline directory (model_index.json,
// transformer/), or a transformer directory itself (config.json with _class_name
// FluxTransformer2DModel; weights diffusion_pytorch_model.safetensors or its sharded
// .index.json). Every parameter is checked present with its shape, nothing else stored.
struct FluxCheckpoint {
  std::string dir;  // the transformer directory
  FluxConfig config;
  SafetensorsFiles tensors;  // stored name -> its file
  // The linear layers' inputs as computed (fp32) or rounded to bf16 (WeightStore::activations;
  // `seqpar denoise --activations`), set before flux_weights().
  DType activations = DType::kF32;
};

// Opens the config and weight files. InvalidArgument in one line naming the file, key or tensor
// and what was expected.
FluxCheckpoint open_flux(const std::string& dir);
// The parameters under Flux's names, mapped onto the files (a store per rank).
WeightStore flux_weights(const FluxCheckpoint& ck);
// The stored (diffusers) name of Flux parameter `name`.
std::string flux_stored_name(const std::string& name);

// One transformer call as diffusers' FluxPipeline makes it, for a batch of B rows:
//   hidden (B, S, in_channels) packed latents with img_ids (S, 3);
//   text (B, L, text_dim) with txt_ids (L, 3), pooled (B, pooled_dim);
//   timesteps [B] in [0, 1] (the pipeline's t / 1000);
//   guidance [B] (the pipeline's guidance_scale): required when the config has guidance_embeds
//   (FLUX.1-dev), refused otherwise;
//   negative (B, L', text_dim) with negative_txt_ids (L', 3) and negative_pooled, or empty: no
//   true CFG.
struct FluxRequest {
  Tensor hidden;
  std::vector<float> img_ids;  // S·3
  std::vector<float> timesteps;
  Tensor text;
  std::vector<float> txt_ids;  // L·3
  Tensor pooled;               // (B, pooled_dim)
  std::vector<float> guidance;
  Tensor negative;
  std::vector<float> negative_txt_ids;
  Tensor negative_pooled;
  float true_cfg = 1.0f;  // true_cfg_scale: applied when > 1 and negative is given
};

// Checks a request against config m, each problem one line naming the tensor as diffusers' call
// names it, prefixed by `where`.
void check_flux_request(const FluxConfig& m, const FluxRequest& r, const std::string& where);

// A rank's FLUX transformer on its mesh (the same calls as QwenImageRank).
class FluxRank {
 public:
  FluxRank(const FluxCheckpoint& ck, const ParallelContext& ctx);
  // The noise prediction (B, S, out_features), row by row; with true CFG as FluxPipeline
  // combines the branches: neg + s·(pos − neg), no rescale. Every rank returns it.
  Tensor predict(const FluxRequest& r, ParallelContext& ctx) const;
  // The two branches, {conditional, negative}: on a cfg group of 2 in one parallel call (cfg
  // rank 0: conditional), else one after the other.
  std::array<Tensor, 2> branches(const FluxRequest& r, ParallelContext& ctx) const;
  // One branch: the prediction for `text` with its ids and pooled projections.
  Tensor branch(const FluxRequest& r, const Tensor& text, const std::vector<float>& txt_ids,
                const Tensor& pooled, ParallelContext& ctx) const;
  int64_t weight_bytes() const { return weight_bytes_; }
  const FluxConfig& config() const { return model_.config(); }

 private:
  Flux model_;
  int64_t weight_bytes_ = 0;
};

}  // namespace seqpar
