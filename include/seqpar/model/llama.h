// Hugging Face Llama checkpoints: a model directory as transformers writes it
//   config.json                                   (LlamaConfig)
//   model.safetensors                             (one file), or
//   model-0000k-of-0000n.safetensors + model.safetensors.index.json ({"weight_map": {name: file}})
// with tensors named "model.embed_tokens.weight", "model.layers.<i>.…", "model.norm.weight" and
// "lm_head.weight" (absent when tie_word_embeddings). The directory opens into a ModelPreset (the
// architecture) and a WeightStore that maps every Decoder parameter to its tensor in the mapped
// files: nothing is read until a rank asks for its slice, in the stored dtype (F32, BF16, F16).
//
// Every disagreement is an InvalidArgument of one line naming the file, the key or the tensor and
// what was expected ("<dir>/config.json: rope_scaling.rope_type 'yarn' is not supported; valid:
// llama3, default").
//
// Thread-safety: a LlamaCheckpoint is immutable once opened; its WeightStore may be read from any
// rank thread (the mapped files are read-only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/model/context.h"
#include "seqpar/model/presets.h"

namespace seqpar {

struct LlamaCheckpoint {
  std::string dir;
  ModelPreset config;                  // family kLlm, name = dir
  std::vector<int64_t> eos_token_ids;  // eos_token_id (an int or a list; empty if absent)
  WeightStore weights;                 // the Decoder's names (Decoder::parameters(config))
  int64_t file_bytes = 0;              // bytes of tensor data the parameters occupy in the files
};

// Parses config.json's text (`path` names it in messages).
ModelPreset llama_config_from_json(const std::string& text, const std::string& path,
                                   std::vector<int64_t>* eos_token_ids = nullptr);

// Opens `dir`: config.json, the index or the single file, every shard's header, and checks that
// the tensors are exactly the parameters the config describes (names, shapes, dtypes).
LlamaCheckpoint open_llama_checkpoint(const std::string& dir);

// Writes `weights` (the Decoder's names for `m`) as a Hugging Face directory in `dtype`:
// config.json and model.safetensors, or shards of at most max_shard_bytes with the index
// (max_shard_bytes 0: one file). Creates `dir` if needed.
void write_llama_checkpoint(const std::string& dir, const ModelPreset& m,
                            const WeightStore& weights, DType dtype, int64_t max_shard_bytes = 0,
                            const std::vector<int64_t>& eos_token_ids = {});

// RoPE inverse frequencies (head_dim / 2) of a Llama config: theta^(-2j/D), then rope_scaling
// (llama3) applied, in fp32 as transformers computes them (_compute_llama3_parameters).
std::vector<float> llama_rope_inv_freq(const ModelPreset& m);

}  // namespace seqpar
