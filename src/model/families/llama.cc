// Llama (LlamaForCausalLM, model_type llama: Llama 2, 3, 3.1, 3.2) on the Decoder's blocks, as
// transformers' modeling_llama.py computes them: q/k/v/o biases when attention_bias, MLP biases
// when mlp_bias, llama3 RoPE scaling; and the writer of a Llama directory (tests, benchmarks).
#include "seqpar/model/llama.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "families/hf_decoder.h"
#include "seqpar/core/error.h"
#include "seqpar/core/files.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {

namespace {

DecoderConfig read_llama_config(const ConfigJson& c) {
  DecoderConfig m = read_hf_decoder(c, "llama", {.max_positions = 2048, .rms_norm_eps = 1e-6});
  if (c.has("pretraining_tp")) (void)c.integer("pretraining_tp", 1, 1);
  m.qkv_bias = m.o_bias = c.boolean("attention_bias", false);
  m.mlp_bias = c.boolean("mlp_bias", false);
  m.tensor_keys = detail::concat("tie_word_embeddings ", m.tie_embeddings ? "true" : "false",
                                 ", attention_bias ", m.qkv_bias ? "true" : "false", ", mlp_bias ",
                                 m.mlp_bias ? "true" : "false");
  return m;
}

}  // namespace

const CausalLmFamily& llama_family() {
  static const CausalLmFamily family{"llama", "LlamaForCausalLM", "llama", read_llama_config,
                                     hf_stored_name};
  return family;
}

void write_llama_checkpoint(const std::string& dir, const DecoderConfig& m,
                            const WeightStore& weights, DType dtype, int64_t max_shard_bytes,
                            const std::vector<int64_t>& eos_token_ids) {
  using nlohmann::json;
  SEQPAR_CHECK(m.qkv_bias == m.o_bias && m.qk_norm == QkNorm::kNone,
               "write_llama_checkpoint: ", m.name,
               " is not a Llama (biases of q/k/v and o "
               "differ, or a QK-norm)");
  std::filesystem::create_directories(dir);
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_act", "silu"},
                 {"hidden_size", m.hidden},
                 {"intermediate_size", m.ffn_dim},
                 {"num_hidden_layers", m.layers},
                 {"num_attention_heads", m.heads},
                 {"num_key_value_heads", m.kv_heads},
                 {"head_dim", m.head_dim},
                 {"vocab_size", m.vocab},
                 {"rms_norm_eps", m.rms_norm_eps},
                 {"rope_theta", m.rope_theta},
                 {"max_position_embeddings", m.max_positions > 0 ? m.max_positions : 131072},
                 {"tie_word_embeddings", m.tie_embeddings},
                 {"attention_bias", m.qkv_bias},
                 {"mlp_bias", m.mlp_bias},
                 {"torch_dtype", dtype == DType::kF32    ? "float32"
                                 : dtype == DType::kBF16 ? "bfloat16"
                                                         : "float16"}};
  if (m.rope_scaling.factor > 0)
    config["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", m.rope_scaling.factor},
        {"low_freq_factor", m.rope_scaling.low_freq_factor},
        {"high_freq_factor", m.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", m.rope_scaling.original_max_positions}};
  if (eos_token_ids.size() == 1) config["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) config["eos_token_id"] = eos_token_ids;
  files::write_atomically("dir", dir + "/config.json", config.dump(2) + "\n");
  // Shards in parameter order, each up to max_shard_bytes (a larger tensor gets its own).
  std::vector<std::map<std::string, Tensor>> shards(1);
  int64_t bytes = 0;
  for (const auto& spec : Decoder::parameters(m)) {
    Tensor t = weights.get(spec.name).to(dtype);
    if (max_shard_bytes > 0 && bytes > 0 &&
        bytes + static_cast<int64_t>(t.nbytes()) > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    bytes += static_cast<int64_t>(t.nbytes());
    shards.back()[hf_stored_name(spec.name)] = std::move(t);
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (max_shard_bytes <= 0) {
    write_safetensors(dir + "/model.safetensors", shards[0], meta);
    return;
  }
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  const size_t n = shards.size();
  for (size_t k = 0; k < n; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, n);
    write_safetensors(dir + "/" + name, shards[k], meta);
    for (const auto& [stored, t] : shards[k]) index["weight_map"][stored] = name;
  }
  files::write_atomically("dir", dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace seqpar
