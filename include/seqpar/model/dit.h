// DiT: the block graph of the Wan 2.1 / 2.2 text-to-video diffusion transformer (presets, and
// checkpoints through wan.h, which maps them onto these parameter names), composed of the shared
// blocks:
//   latent (B, C, F, H, W) -> PatchEmbedding (1x2x2) -> N blocks of
//     x += gate_msa · SelfAttention(modulate(LayerNorm(x)))   QK-norm across heads, 3-D RoPE
//     x += CrossAttention(LayerNorm_affine(x), text)           QK-norm across heads
//          (image-to-video: + the attention to the image context through k_img, v_img,
//          norm_k_img, added before o; the context from img_emb's MLP of the CLIP states)
//     x += gate_mlp · FeedForward(modulate(LayerNorm(x)))      GELU-tanh
//   with adaLN Modulation of the TimestepEmbedding -> adaLN head -> unpatchify -> velocity
//   (B, C_out, F, H, W)
// Sequence parallel by its SpPlan (shard the input of blocks.0 and the RoPE table, gather the
// output of proj_out; the text stream is replicated), tensor parallel over heads and FFN
// columns, classifier-free guidance over the cfg group.
// Thread-safety: one DiT per rank thread.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "seqpar/model/blocks/attention.h"
#include "seqpar/model/blocks/ffn.h"
#include "seqpar/model/blocks/linear.h"
#include "seqpar/model/blocks/modulation.h"
#include "seqpar/model/blocks/norm.h"
#include "seqpar/model/blocks/patch.h"
#include "seqpar/model/context.h"
#include "seqpar/model/presets.h"
#include "seqpar/model/sp_plan.h"

namespace seqpar {

// Wan's config on the DiT's blocks: the shared shapes (ModelPreset: hidden, heads, layers,
// ffn_dim, in_channels, patch, text_dim, freq_dim) and what a Wan checkpoint's config sets
// beside them.
struct DiTConfig : ModelPreset {
  int64_t out_channels = 0;     // predicted channels; 0: in_channels
  double eps = 1e-6;            // LayerNorm and QK-norm epsilon
  bool cross_attn_norm = true;  // affine LayerNorm (norm3) before the cross-attention
  // Wan 2.1 image-to-video: the width of the image encoder's states (CLIP's 1280), which
  // img_emb maps to hidden; 0: text-to-video (no img_emb, k_img, v_img, norm_k_img).
  int64_t image_dim = 0;

  int64_t predicted_channels() const { return out_channels ? out_channels : in_channels; }
  // The self- and cross-attention: heads of hidden / heads, biases, QK-norm across heads.
  AttentionSpec attention() const;
};

// A runnable dit preset (tiny-dit, wan2.1-t2v-1.3b, ...) as a DiT config; InvalidArgument naming
// the valid ones.
const DiTConfig& dit_preset(std::string_view name);

class DiT {
 public:
  // Parameter names and shapes of the config (Wan's original naming; head.head rows in
  // unpatchify's channel-major order).
  static std::vector<WeightStore::Spec> parameters(const DiTConfig& m);
  static const SpPlan& sp_plan();

  DiT(const DiTConfig& m, const WeightStore& ws, const ParallelContext& ctx);

  // One forward: velocity for latent (B, C, F, Hl, Wl) at timestep t (0..1000) given the text
  // states (B, L, text_dim). Every rank of the mesh returns the full velocity.
  // Image-to-video (image_dim > 0) also takes image (B, L_img, image_dim), the image encoder's
  // states (CLIP: L_img 257), replicated like the text; text must then hold 512 tokens, as
  // diffusers takes the last 512 tokens of [image; text] as the text (InvalidArgument otherwise,
  // and when image is given to a text-to-video config or missing for an image-to-video one).
  Tensor forward(const Tensor& latent, float t, const Tensor& text, ParallelContext& ctx,
                 const Tensor& image = Tensor()) const;

  // The two guidance branches {v_cond, v_uncond} for text and null_text (both with `image`, as
  // WanImageToVideoPipeline); with a cfg group of 2 they run on the two groups at once (cfg rank
  // 0: conditional) and are exchanged, else one after the other. Every rank returns both.
  std::array<Tensor, 2> branches(const Tensor& latent, float t, const Tensor& text,
                                 const Tensor& null_text, ParallelContext& ctx,
                                 const Tensor& image = Tensor()) const;

  // Guided velocity: v_uncond + scale·(v_cond − v_uncond) of the branches.
  Tensor guided(const Tensor& latent, float t, const Tensor& text, const Tensor& null_text,
                float guidance, ParallelContext& ctx, const Tensor& image = Tensor()) const;

  // K steps of the flow-matching Euler sampler from latent (sigma 1 -> 0, t = 1000·sigma).
  Tensor sample(Tensor latent, int steps, const Tensor& text, const Tensor& null_text,
                float guidance, ParallelContext& ctx) const;

  const DiTConfig& preset() const { return m_; }

 private:
  struct Block {
    Modulation modulation;  // (6, hidden): shift, scale, gate of the attention and of the FFN
    SelfAttention self_attn;
    CrossAttention cross_attn;
    LayerNorm norm3;  // before the cross-attention, affine or not
    FeedForward ffn;
  };
  DiTConfig m_;
  PatchEmbedding patch_embedding_;
  Linear text_in_, text_out_;  // text_embedding.0, .2 (GELU-tanh between)
  TimestepEmbedding time_embedding_;
  // img_emb.proj.0 .. .4: LayerNorm, Linear, GELU (erf), Linear, LayerNorm (image_dim > 0)
  LayerNorm image_norm_in_, image_norm_out_;
  Linear image_in_, image_out_;
  Linear time_projection_;  // silu(e) -> (6·hidden)
  std::vector<Block> blocks_;
  Modulation head_modulation_;  // (2, hidden): shift, scale of the head
  Linear head_;
};

}  // namespace seqpar
