// What every caller that runs a model on a mesh shares (the CLI's generate and denoise, and the
// Python module): the mesh a model runs on, a rank's ParallelContext over it, the checks of a
// causal LM generation against its checkpoint, and a rank's Wan transformer (one or two experts,
// classifier-free guidance, per-row timesteps) as WanPipeline calls it.
// Messages name the parameters as the API calls them ("tp", "max_new_tokens"); the CLI passes
// its flag names where it has its own.
// Thread-safety: the functions are reentrant; a WanRank belongs to its rank thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/model/causal_lm.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/wan.h"
#include "seqpar/parallel/mesh.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// The parallel layout of a model on a cfg x tp x ring x ulysses mesh: each degree in
// 1..limits::kMaxRanks (cfg 1 or 2); the strategy follows from the degrees
// (strategy_for_degrees: usp, ulysses, or ring_axis "ring" | "allgather").
ParallelConfig model_mesh(int cfg, int tp, int ring_degree, int ulysses_degree,
                          const std::string& ring_axis, const std::string& layout,
                          const std::string& ulysses_mode, bool pad);

// Rank `mc`'s context on mesh m (strategies apply only where the sequence is sharded).
ParallelContext model_context(MeshComms& mc, const ParallelConfig& m);

// Checks a greedy generation of max_new_tokens after `prompt` on tensor-parallel size tp against
// the checkpoint: ids in the vocabulary, positions within max_position_embeddings (unless
// allow_long_context), tp dividing the heads and FFN. `names` are the words for the prompt,
// max_new_tokens and tp in messages.
struct CausalLmRunNames {
  std::string prompt = "prompt", max_new_tokens = "max_new_tokens", tp = "tp",
              allow_long_context = "allow_long_context=True", token = "prompt token",
              int8 = "weights_dtype='int8'";
};
void check_causal_lm_tp(const CausalLmCheckpoint& ck, int64_t tp,
                        const CausalLmRunNames& names = {});
// With Q8_0 weights (WeightFormat::kQ8_0), every input dimension a rank quantizes must be a
// multiple of Q8_0's block of 32: hidden_size, heads x head_dim / tp, intermediate_size / tp.
// Per-channel int8 (kInt8Channel) has no such rule: any input dimension, and a row-parallel rank's
// columns take the whole row's scale (ops.h quantize_int8_channel).
void check_causal_lm_int8(const CausalLmCheckpoint& ck, int64_t tp,
                          const CausalLmRunNames& names = {});
std::vector<int32_t> check_causal_lm_prompt(const CausalLmCheckpoint& ck,
                                            const std::vector<int64_t>& prompt,
                                            int64_t max_new_tokens, bool allow_long_context,
                                            const CausalLmRunNames& names = {});

// The memory one rank of `mesh` needs to generate with `ck`, known before anything is loaded:
// `weights`, its share as the files store it (tp splits the matrices and the vocabulary), and
// `run`, with `prefill` tokens entering at once: its K/V cache of `cached` tokens (the most any
// rank holds, Decoder::cache_tokens) in kv_cache and its kv heads, a prefill's activations and
// the logits kept. `cache` is the K/V cache's part of `run`.
struct CausalLmMemory {
  double weights = 0, run = 0, cache = 0;
};
CausalLmMemory causal_lm_memory(const CausalLmCheckpoint& ck, const ParallelConfig& mesh,
                                int64_t prefill, int64_t cached, int64_t new_tokens,
                                DType kv_cache = DType::kF32);

// How a WanRank combines its experts and guidance: the high-noise expert (or the only one) at
// t >= boundary with `guidance`, the low-noise one below with `guidance_2`; guidance applies
// when the negative text states are given and the scale is > 1.
struct WanGuidance {
  float guidance = 1.0f;
  float guidance_2 = 1.0f;
  double boundary = 0;  // timestep (0..1000) where experts[1] takes over
};

// A rank's Wan model: one DiT per expert, loaded on construction (collective over ctx's groups
// only in that every rank loads its share).
class WanRank {
 public:
  WanRank(const WanModel& model, const ParallelContext& ctx);

  // Velocity (B, C_out, F, H, W) for latents (B, C, F, H, W) at timesteps [B] (one forward when
  // they are equal, else row by row) given text (B, L, text_dim) and negative (B, L', text_dim)
  // or an empty tensor. Every rank returns the full velocity.
  // Image-to-video models also take image (B, 257, image_dim) for both branches (DiT::forward).
  Tensor velocity(const Tensor& latents, const std::vector<float>& timesteps, const Tensor& text,
                  const Tensor& negative, const WanGuidance& g, ParallelContext& ctx,
                  const Tensor& image = Tensor()) const;

  // The two guidance branches unguided, {v_cond, v_uncond}, each (B, C_out, F, H, W), for text
  // and negative (B, L', text_dim), of the expert `g` picks at each timestep: on a cfg group of
  // 2 in one parallel call (a group each), else one after the other (g's scales are not used).
  std::array<Tensor, 2> branches(const Tensor& latents, const std::vector<float>& timesteps,
                                 const Tensor& text, const Tensor& negative, const WanGuidance& g,
                                 ParallelContext& ctx, const Tensor& image = Tensor()) const;

  // 1 or 2: the expert that runs at timestep t.
  int expert_at(float t, const WanGuidance& g) const;
  int64_t weight_bytes() const { return weight_bytes_; }
  size_t experts() const { return dits_.size(); }

 private:
  std::vector<DiT> dits_;
  int64_t weight_bytes_ = 0;
};

// Checks latents (B, C, F, H, W), text states (B, L, text_dim) and optional negative states
// against preset m; `where` prefixes the messages, the tensors are named as in WanPipeline.
// image_dim > 0 (image-to-video): image (B, L_img, image_dim) is required, the text states hold
// 512 tokens; image_dim 0: image must be empty.
void check_wan_inputs(const ModelPreset& m, const Tensor& latents, const Tensor& text,
                      const Tensor& negative, const std::string& where,
                      const Tensor& image = Tensor(), int64_t image_dim = 0);

// The inputs of a Wan call as `seqpar denoise --inputs` gives them (a safetensors file named as in
// WanPipeline's transformer call), read in fp32 and checked against m.
struct WanInputs {
  Tensor latents;               // [B, C, F, H, W]
  Tensor text, negative;        // [B, L, text_dim]; negative empty when absent
  Tensor image;                 // [B, L_img, image_dim] (image-to-video); empty when absent
  std::vector<float> timestep;  // [B] in [0, 1000]; empty for a sampling loop (steps > 0)
};
// Reads `path`: latents and encoder_hidden_states required; negative_encoder_hidden_states
// required when steps > 0 and guidance > 1; timestep ([B]: F32, BF16, F16, F64, I64 or I32)
// required when steps == 0; encoder_hidden_states_image for image-to-video; any other tensor
// refused. InvalidArgument, one line naming the tensor and what was expected, otherwise.
WanInputs read_wan_inputs(const std::string& path, const DiTConfig& m, int64_t steps,
                          double guidance);

}  // namespace seqpar
