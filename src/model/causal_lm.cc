// Hugging Face causal-LM directories: the registered families, config.json dispatched to its
// family's reader, the (sharded) safetensors mapped into a WeightStore under the Decoder's names.
#include "seqpar/model/causal_lm.h"

#include <map>
#include <memory>
#include <set>

#include "config_json.h"
#include "families/hf_decoder.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {

namespace {

using nlohmann::json;

constexpr const char* kConfig = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

// ["LlamaForCausalLM", "Qwen2ForCausalLM", ...] and "llama, qwen2, ...", for messages.
std::string architectures_text() {
  std::string t;
  for (const CausalLmFamily* f : causal_lm_families())
    t += detail::concat(t.empty() ? "[" : ", ", "\"", f->architecture, "\"");
  return t + "]";
}
std::string model_types_text() {
  std::string t;
  for (const CausalLmFamily* f : causal_lm_families())
    t += detail::concat(t.empty() ? "" : ", ", f->model_type);
  return t;
}

// The family config.json names: by architectures, else model_type, else llama.
const CausalLmFamily& family_of(const ConfigJson& c) {
  const std::string& path = c.path();
  const CausalLmFamily* by_architecture = nullptr;
  if (c.has("architectures")) {
    const json& a = c.at("architectures");
    if (a.is_array())
      for (const json& x : a)
        for (const CausalLmFamily* f : causal_lm_families())
          if (!by_architecture && x.is_string() && x == f->architecture) by_architecture = f;
    SEQPAR_FILE_CHECK(by_architecture, path, ": architectures ", json_excerpt(a),
                      " is not supported; valid: ", architectures_text());
  }
  if (!c.has("model_type")) return by_architecture ? *by_architecture : llama_family();
  const std::string type = c.string("model_type");
  const CausalLmFamily* by_type = nullptr;
  for (const CausalLmFamily* f : causal_lm_families())
    if (type == f->model_type) by_type = f;
  SEQPAR_FILE_CHECK(by_type, path, ": model_type '", quote_for_message(type),
                    "' is not supported; valid: ", model_types_text());
  SEQPAR_FILE_CHECK(!by_architecture || by_architecture == by_type, path, ": model_type '", type,
                    "' does not match architectures ", json_excerpt(c.at("architectures")),
                    "; valid: ", by_architecture ? by_architecture->model_type : "");
  return *by_type;
}

// Tensors checkpoints carry that are not parameters (older transformers saved RoPE buffers).
bool ignorable(const std::string& stored) { return stored.ends_with("rotary_emb.inv_freq"); }

}  // namespace

const std::vector<const CausalLmFamily*>& causal_lm_families() {
  static const std::vector<const CausalLmFamily*> families = {&llama_family(), &qwen2_family(),
                                                              &qwen3_family()};
  return families;
}

const CausalLmFamily& causal_lm_family(std::string_view name) {
  for (const CausalLmFamily* f : causal_lm_families())
    if (f->name == name) return *f;
  throw InvalidArgument(detail::concat("causal LM family '", quote_for_message(name),
                                       "' is unknown; valid: ", model_types_text()));
}

DecoderConfig causal_lm_config_from_json(const std::string& text, const std::string& path,
                                         std::vector<int64_t>* eos_token_ids) {
  const ConfigJson c = ConfigJson::parse(text, path);
  DecoderConfig m = family_of(c).read_config(c);
  if (eos_token_ids) {
    eos_token_ids->clear();
    if (c.has("eos_token_id")) {
      const json& e = c.at("eos_token_id");
      if (e.is_array()) {
        for (const json& x : e)
          eos_token_ids->push_back(c.integer_of(x, "eos_token_id", 0, m.vocab - 1));
      } else {
        eos_token_ids->push_back(c.integer_of(e, "eos_token_id", 0, m.vocab - 1));
      }
    }
  }
  m.params = 0;
  for (const auto& spec : Decoder::parameters(m)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n = limits::checked_mul(n, d, "parameter count");
    m.params = limits::checked_add(m.params, n, "parameter count");
  }
  return m;
}

CausalLmCheckpoint open_causal_lm(const std::string& dir) {
  check_model_dir(dir,
                  "a Hugging Face model directory (config.json and model.safetensors or "
                  "model.safetensors.index.json)");
  const std::string config_path = dir + "/" + kConfig;
  SEQPAR_FILE_CHECK(files::is_regular_file(config_path), config_path,
                    ": missing; a Hugging Face model directory holds config.json");
  CausalLmCheckpoint ck;
  ck.dir = dir;
  ck.config =
      causal_lm_config_from_json(read_json_text(config_path), config_path, &ck.eos_token_ids);
  ck.config.name = dir;
  ck.family = &causal_lm_family(ck.config.family_name);

  // Which file holds each stored tensor.
  SafetensorsFiles where;
  const std::string index_path = dir + "/" + kIndex;
  if (files::is_regular_file(index_path)) {
    where = open_safetensors_index(index_path, dir, ignorable);
  } else {
    const std::string single = dir + "/" + kSingleFile;
    SEQPAR_FILE_CHECK(files::is_regular_file(single), dir, ": neither ", kSingleFile, " nor ",
                      kIndex, " is there; expected the weights of a Hugging Face model directory");
    auto file = std::make_shared<const SafetensorsFile>(single);
    for (const std::string& name : file->names()) where[name] = file;
  }

  // Every parameter the config describes, with its shape; nothing else.
  const DecoderConfig& m = ck.config;
  const std::string why = detail::concat(
      "config.json: hidden_size ", m.hidden, ", intermediate_size ", m.ffn_dim,
      ", num_attention_heads ", m.heads, ", num_key_value_heads ", m.kv_heads, ", head_dim ",
      m.head_dim, ", vocab_size ", m.vocab, ", num_hidden_layers ", m.layers, ", ", m.tensor_keys);
  std::set<std::string> used;
  for (const auto& spec : Decoder::parameters(m)) {
    const std::string stored = ck.family->stored_name(spec.name);
    auto it = where.find(stored);
    SEQPAR_FILE_CHECK(it != where.end(), dir, ": no tensor '", stored, "' (", why, ")");
    const SafetensorsEntry& e = it->second->entry(stored);
    SEQPAR_FILE_CHECK(e.shape == spec.shape, it->second->path(), ": tensor '", stored,
                      "' has shape ", shape_text(e.shape), "; ", why, " expects ",
                      shape_text(spec.shape));
    ck.weights.map(spec.name, it->second, stored);
    ck.file_bytes += static_cast<int64_t>(e.nbytes());
    used.insert(stored);
  }
  for (const auto& [stored, file] : where) {
    if (used.count(stored) || ignorable(stored)) continue;
    // A tied checkpoint may still carry lm_head.weight (transformers ties it to the embedding).
    if (stored == ck.family->stored_name("lm_head.weight") && m.tie_embeddings) continue;
    throw InvalidArgument(detail::concat(file->path(), ": tensor '", quote_for_message(stored),
                                         "' is not a parameter of the model (", why, ")"));
  }
  return ck;
}

}  // namespace seqpar
