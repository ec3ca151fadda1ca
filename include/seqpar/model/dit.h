// DiT: the Wan 2.1 / 2.2 text-to-video diffusion transformer (presets, and checkpoints through
// wan.h, which maps them onto these parameter names).
//   latent (B, C, F, H, W) -> 3-D patches (1x2x2) -> patch embedding -> N blocks
//   (adaLN-modulated self-attention with QK-norm and 3-D RoPE, cross-attention to the text,
//   GELU-tanh FFN) -> adaLN head -> unpatchify -> velocity (B, C_out, F, H, W)
// The preset sets the shapes, out_channels, the norms' eps and whether norm3 is affine.
// Sequence parallel by its SpPlan (shard the input of blocks.0 and the RoPE table, gather the
// output of proj_out; the text stream is replicated), tensor parallel over heads and FFN
// columns, classifier-free guidance over the cfg group.
// Thread-safety: one DiT per rank thread.
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/model/context.h"
#include "seqpar/model/modules.h"
#include "seqpar/model/presets.h"
#include "seqpar/model/sp_plan.h"

namespace seqpar {

class DiT {
 public:
  // Parameter names and shapes of the preset (Wan's original naming; head.head rows in
  // unpatchify's channel-major order).
  static std::vector<WeightStore::Spec> parameters(const ModelPreset& m);
  static const SpPlan& sp_plan();

  DiT(const ModelPreset& m, const WeightStore& ws, const ParallelContext& ctx);

  // One forward: velocity for latent (B, C, F, Hl, Wl) at timestep t (0..1000) given the text
  // states (B, L, text_dim). Every rank of the mesh returns the full velocity.
  Tensor forward(const Tensor& latent, float t, const Tensor& text, ParallelContext& ctx) const;

  // Guided velocity: v_uncond + scale·(v_cond − v_uncond); with a cfg group of 2 the two branches
  // run on the two groups (cfg rank 0: conditional), else one after the other.
  Tensor guided(const Tensor& latent, float t, const Tensor& text, const Tensor& null_text,
                float guidance, ParallelContext& ctx) const;

  // K steps of the flow-matching Euler sampler from latent (sigma 1 -> 0, t = 1000·sigma).
  Tensor sample(Tensor latent, int steps, const Tensor& text, const Tensor& null_text,
                float guidance, ParallelContext& ctx) const;

  const ModelPreset& preset() const { return m_; }

 private:
  struct Block {
    Tensor modulation;  // (6, hidden)
    SelfAttention self_attn;
    CrossAttention cross_attn;
    Tensor norm3_w, norm3_b;
    FeedForward ffn;
  };
  ModelPreset m_;
  Tensor patch_w, patch_b;
  std::vector<Tensor> text_w, text_b;  // text_embedding.0, .2
  std::vector<Tensor> time_w, time_b;  // time_embedding.0, .2
  Tensor proj_w, proj_b;               // time_projection.1
  std::vector<Block> blocks_;
  Tensor head_mod, head_w, head_b;
};

// Latent (B, C, F, H, W) <-> patch tokens (B, S, C·pt·ph·pw) in (frame, row, column) order.
Tensor patchify(const Tensor& latent, std::array<int64_t, 3> patch);
Tensor unpatchify(const Tensor& tokens, int64_t channels, std::array<int64_t, 3> grid,
                  std::array<int64_t, 3> patch);

}  // namespace seqpar
