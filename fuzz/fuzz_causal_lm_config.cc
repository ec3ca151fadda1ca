// Fuzzes the causal-LM config readers (config.json of Llama, Qwen2 and Qwen3 checkpoints: the
// family chosen by architectures or model_type, every key's kind and range, rope_scaling). A text
// is either refused with InvalidArgument (one short line naming the file) or read into a config
// whose shapes are consistent: heads a multiple of kv_heads, an even head_dim, the parameters'
// shapes positive.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "one_line.h"
#include "seqpar/core/error.h"
#include "seqpar/model/causal_lm.h"
#include "seqpar/model/decoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqpar;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    std::vector<int64_t> eos;
    const DecoderConfig m = causal_lm_config_from_json(text, "ck/config.json", &eos);
    if (m.heads < 1 || m.kv_heads < 1 || m.heads % m.kv_heads != 0 || m.head_dim % 2 != 0 ||
        m.layers < 1 || m.vocab < 1)
      __builtin_trap();
    for (const auto& spec : Decoder::parameters(m))
      for (int64_t d : spec.shape)
        if (d < 1) __builtin_trap();
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
    if (std::string_view(e.what()).rfind("ck/config.json", 0) != 0) __builtin_trap();
  }
  return 0;
}
