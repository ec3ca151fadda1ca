// The Llama family's writer: a Hugging Face Llama directory (config.json with
// LlamaForCausalLM, model.safetensors or shards and their index) from a DecoderConfig and its
// weights, for tests and benchmarks. Reading any family's directory is causal_lm.h's.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/model/context.h"
#include "seqpar/model/decoder.h"

namespace seqpar {

// Writes `weights` (the Decoder's names for `m`, a Llama config: q/k/v/o biases together, no
// QK-norm) as a Hugging Face directory in `dtype`: config.json and model.safetensors, or shards
// of at most max_shard_bytes with the index (max_shard_bytes 0: one file). Creates `dir` if
// needed.
void write_llama_checkpoint(const std::string& dir, const DecoderConfig& m,
                            const WeightStore& weights, DType dtype, int64_t max_shard_bytes = 0,
                            const std::vector<int64_t>& eos_token_ids = {});

}  // namespace seqpar
