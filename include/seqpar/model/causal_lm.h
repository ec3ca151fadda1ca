// Causal language models from Hugging Face directories, one family per architecture. A family is
// what a new architecture writes (src/model/families/<name>.cc, registered in causal_lm.cc):
//   a config reader  config.json -> DecoderConfig: the shared shapes and the Decoder's block
//                    variants (biases, QK-norm, RoPE scaling, tied embeddings);
//   a weight-name map  a Decoder parameter name -> the checkpoint's tensor name;
// and its block graph is the Decoder's (decoder.h). Registered: llama (LlamaForCausalLM), qwen2
// (Qwen2ForCausalLM, Qwen2.5 too), qwen3 (Qwen3ForCausalLM).
//
// A directory as transformers' save_pretrained writes it:
//   config.json                                   (the family's config; `architectures` or
//                                                 `model_type` names the family)
//   model.safetensors                             (one file), or
//   model-0000k-of-0000n.safetensors + model.safetensors.index.json ({"weight_map": {name: file}})
// opens into a DecoderConfig and a WeightStore that maps every Decoder parameter to its tensor in
// the mapped files: nothing is read until a rank asks for its slice, in the stored dtype (F32,
// BF16, F16). Every disagreement is an InvalidArgument of one line naming the file, the key or
// the tensor and what is valid ("<dir>/config.json: use_sliding_window is true; ...").
//
// Thread-safety: the families and the functions are reentrant; a CausalLmCheckpoint is immutable
// once opened and its WeightStore may be read from any rank thread (the files are read-only).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/model/context.h"
#include "seqpar/model/decoder.h"

namespace seqpar {

class ConfigJson;  // a config.json's keys, read with one-line errors (src/model/config_json.h)

struct CausalLmFamily {
  std::string_view name;          // "qwen2"
  std::string_view architecture;  // config.json's architectures: "Qwen2ForCausalLM"
  std::string_view model_type;    // config.json's model_type: "qwen2"
  // config.json -> the Decoder's config; InvalidArgument naming the key and what is valid.
  DecoderConfig (*read_config)(const ConfigJson& config);
  // The checkpoint's name of a Decoder parameter ("layers.0.self_attn.q_proj.weight" ->
  // "model.layers.0.self_attn.q_proj.weight").
  std::string (*stored_name)(const std::string& parameter);
};

// The registered families, in the order messages list them.
const std::vector<const CausalLmFamily*>& causal_lm_families();
// The family named `name` ("qwen3"); InvalidArgument listing the registered ones.
const CausalLmFamily& causal_lm_family(std::string_view name);

// config.json's text (`path` names it in messages) read by its family: the family from
// `architectures` (a list naming one registered architecture), else `model_type`, else llama;
// when both are given they must agree. eos_token_id (an id or a list) into *eos_token_ids.
DecoderConfig causal_lm_config_from_json(const std::string& text, const std::string& path,
                                         std::vector<int64_t>* eos_token_ids = nullptr);

struct CausalLmCheckpoint {
  std::string dir;
  const CausalLmFamily* family = nullptr;
  DecoderConfig config;                // name = dir
  std::vector<int64_t> eos_token_ids;  // eos_token_id (an int or a list; empty if absent)
  WeightStore weights;                 // the Decoder's names (Decoder::parameters(config))
  int64_t file_bytes = 0;              // bytes of tensor data the parameters occupy in the files
};

// Opens `dir`: config.json, the index or the single file, every shard's header, and checks that
// the tensors are exactly the parameters the config describes (names, shapes, dtypes).
CausalLmCheckpoint open_causal_lm(const std::string& dir);

}  // namespace seqpar
