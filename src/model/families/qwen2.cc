// Qwen2 and Qwen2.5 (Qwen2ForCausalLM, model_type qwen2) on the Decoder's blocks, as
// transformers' modeling_qwen2.py computes them: Llama's graph with biases on q_proj, k_proj and
// v_proj (always; the config has no key for them), none on o_proj or the MLP. Sliding-window
// attention (use_sliding_window) is refused.
#include "families/hf_decoder.h"
#include "seqpar/core/error.h"

namespace seqpar {

namespace {

DecoderConfig read_qwen2_config(const ConfigJson& c) {
  DecoderConfig m = read_hf_decoder(c, "qwen2", {.max_positions = 32768, .rms_norm_eps = 1e-6});
  refuse_sliding_window(c);
  m.qkv_bias = true;
  m.o_bias = false;
  m.mlp_bias = false;
  m.tensor_keys = detail::concat("tie_word_embeddings ", m.tie_embeddings ? "true" : "false",
                                 "; Qwen2ForCausalLM: q/k/v biases, no o_proj or MLP bias");
  return m;
}

}  // namespace

const CausalLmFamily& qwen2_family() {
  static const CausalLmFamily family{"qwen2", "Qwen2ForCausalLM", "qwen2", read_qwen2_config,
                                     hf_stored_name};
  return family;
}

}  // namespace seqpar
