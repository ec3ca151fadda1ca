// What the Hugging Face causal-LM families share (internal to the model layer): the config keys
// every *ForCausalLM has, their checkpoints' tensor names, and the families' registrations.
// A family file (llama.cc, qwen2.cc, qwen3.cc) reads its own keys on top of read_hf_decoder and
// defines its CausalLmFamily; causal_lm.cc lists them.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "config_json.h"
#include "seqpar/model/causal_lm.h"

namespace seqpar {

// Defaults of the family's config class for keys a config.json may omit.
struct HfDecoderDefaults {
  int64_t max_positions = 2048;  // max_position_embeddings
  double rms_norm_eps = 1e-6;
  int64_t head_dim = 0;  // head_dim; 0: hidden_size / num_attention_heads
};

// The shapes, norms, RoPE and embeddings of a *ForCausalLM config: hidden_act (silu),
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, vocab_size, rms_norm_eps, rope_theta, rope_scaling (null, default, llama3),
// max_position_embeddings, tie_word_embeddings. The blocks' variants are left at none (no
// biases, no QK-norm) for the family to set.
DecoderConfig read_hf_decoder(const ConfigJson& c, std::string_view family,
                              const HfDecoderDefaults& defaults);

// Refuses sliding-window attention (use_sliding_window true, or a layer_types entry other than
// full_attention): seqpar attends the whole causal context.
void refuse_sliding_window(const ConfigJson& c);

// transformers' names: "model." before every parameter but lm_head.weight.
std::string hf_stored_name(const std::string& parameter);

// The families (families/<name>.cc).
const CausalLmFamily& llama_family();
const CausalLmFamily& qwen2_family();
const CausalLmFamily& qwen3_family();

}  // namespace seqpar
