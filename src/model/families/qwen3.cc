// Qwen3 (Qwen3ForCausalLM, model_type qwen3) on the Decoder's blocks, as transformers'
// modeling_qwen3.py computes them: Llama's graph with an RMSNorm over each head's features of q
// and of k (self_attn.q_norm, k_norm: weights of head_dim, eps rms_norm_eps) after their
// projections and before RoPE; head_dim 128 unless the config says; q/k/v/o biases when
// attention_bias. Sliding-window attention (use_sliding_window) is refused.
#include "families/hf_decoder.h"
#include "seqpar/core/error.h"

namespace seqpar {

namespace {

DecoderConfig read_qwen3_config(const ConfigJson& c) {
  DecoderConfig m =
      read_hf_decoder(c, "qwen3", {.max_positions = 32768, .rms_norm_eps = 1e-6, .head_dim = 128});
  refuse_sliding_window(c);
  m.qk_norm = QkNorm::kPerHead;
  m.qkv_bias = m.o_bias = c.boolean("attention_bias", false);
  m.mlp_bias = false;
  m.tensor_keys = detail::concat("tie_word_embeddings ", m.tie_embeddings ? "true" : "false",
                                 ", attention_bias ", m.qkv_bias ? "true" : "false",
                                 "; Qwen3ForCausalLM: q_norm and k_norm of head_dim ", m.head_dim);
  return m;
}

}  // namespace

const CausalLmFamily& qwen3_family() {
  static const CausalLmFamily family{"qwen3", "Qwen3ForCausalLM", "qwen3", read_qwen3_config,
                                     hf_stored_name};
  return family;
}

}  // namespace seqpar
