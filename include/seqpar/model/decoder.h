// Decoder: a Llama-style language model (RMSNorm, GQA self-attention with 1-D RoPE, causal,
// SwiGLU FFN, tied-free lm_head). Prefill runs context parallel (the prompt sharded by the
// SpPlan: shard the input of layers.0, gather the output of norm); each layer keeps its K/V
// shard where prefill left it, and greedy decode runs pass-Q over that distributed cache
// (new token i is owned by sequence-parallel rank (prompt_len + i) mod N).
// Thread-safety: one Decoder per rank thread.
#pragma once

#include <cstdint>
#include <vector>

#include "seqpar/model/context.h"
#include "seqpar/model/modules.h"
#include "seqpar/model/presets.h"
#include "seqpar/model/sp_plan.h"

namespace seqpar {

class Decoder {
 public:
  static std::vector<WeightStore::Spec> parameters(const ModelPreset& m);
  static const SpPlan& sp_plan();

  Decoder(const ModelPreset& m, const WeightStore& ws, const ParallelContext& ctx);

  struct Output {
    std::vector<int32_t> tokens;  // the greedy tokens: one from prefill, then one per decode step
    std::vector<Tensor> logits;   // (vocab) of each generated token's step
  };
  // Prefill `prompt` (B = 1) context parallel, then `decode_steps` greedy steps with pass-Q.
  Output generate(const std::vector<int32_t>& prompt, int decode_steps, ParallelContext& ctx);

 private:
  struct Layer {
    Tensor input_norm, post_norm;
    SelfAttention attn;
    FeedForward mlp;
    KvCache cache;
  };
  Tensor embed(std::span<const int32_t> tokens) const;  // (1, n, hidden)
  Tensor logits_of(const Tensor& h_last) const;          // (hidden) -> (vocab)
  ModelPreset m_;
  Tensor embed_w, norm_w, lm_head_w;
  std::vector<Layer> layers_;
};

}  // namespace seqpar
