// Hugging Face Llama directories: config.json to a ModelPreset, the (sharded) safetensors mapped
// into a WeightStore under the Decoder's names, and the writer the tests and benchmarks use.
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/llama.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {

namespace {

using nlohmann::json;

constexpr const char* kConfig = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

// A JSON file's text, read whole: a regular file of at most limits::kMaxFileBytes.
std::string read_text_file(const std::string& path) {
  return files::read_input("", path, "a JSON file", limits::kMaxFileBytes);
}

// A JSON file read whole, within JsonLimits.
json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  check_json_limits(text, path, {.max_bytes = static_cast<size_t>(limits::kMaxFileBytes)});
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(detail::concat(path, ": not valid JSON (", e.what(), ")"));
  }
}

// The config's keys, each read with the key and the expected kind named on error.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    SEQPAR_ARG_CHECK(j_.is_object(), path_, ": not a JSON object");
  }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    SEQPAR_ARG_CHECK(has(key), path_, ": key '", key, "' is missing; expected an integer");
    return integer_of(j_.at(key), key, lo, hi);
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi, int64_t fallback) const {
    return has(key) ? integer_of(j_.at(key), key, lo, hi) : fallback;
  }
  double real(const json& v, const std::string& key, double lo, double hi) const {
    SEQPAR_ARG_CHECK(v.is_number(), path_, ": ", key, " is ", json_excerpt(v),
                     "; expected a number");
    const double x = v.get<double>();
    SEQPAR_ARG_CHECK(std::isfinite(x) && lo <= x && x <= hi, path_, ": ", key, " ", x,
                     " is out of range; valid: ", lo, " to ", hi);
    return x;
  }
  double real(const char* key, double lo, double hi, double fallback) const {
    return has(key) ? real(j_.at(key), key, lo, hi) : fallback;
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    SEQPAR_ARG_CHECK(j_.at(key).is_boolean(), path_, ": ", key, " is ", json_excerpt(j_.at(key)),
                     "; expected true or false");
    return j_.at(key).get<bool>();
  }
  std::string string(const char* key) const {
    if (!has(key)) return "";
    SEQPAR_ARG_CHECK(j_.at(key).is_string(), path_, ": ", key, " is ", json_excerpt(j_.at(key)),
                     "; expected a string");
    return j_.at(key).get<std::string>();
  }
  int64_t integer_of(const json& v, const std::string& key, int64_t lo, int64_t hi) const {
    SEQPAR_ARG_CHECK(v.is_number_integer(), path_, ": ", key, " is ", json_excerpt(v),
                     "; expected an integer");
    const int64_t x =
        v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX ? INT64_MAX : v.get<int64_t>();
    SEQPAR_ARG_CHECK(lo <= x && x <= hi, path_, ": ", key, " ", x, " is out of range; valid: ", lo,
                     " to ", hi);
    return x;
  }
  const json& at(const char* key) const { return j_.at(key); }
  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string path_;
};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The checkpoint's name of a Decoder parameter.
std::string stored_name(const std::string& name) {
  return name == "lm_head.weight" ? name : "model." + name;
}

// Tensors checkpoints carry that are not parameters (older transformers saved RoPE buffers).
bool ignorable(const std::string& stored) {
  const std::string suffix = "rotary_emb.inv_freq";
  return stored.size() >= suffix.size() &&
         stored.compare(stored.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ModelPreset llama_config_from_json(const std::string& text, const std::string& path,
                                   std::vector<int64_t>* eos_token_ids) {
  check_json_limits(text, path, {.max_bytes = static_cast<size_t>(limits::kMaxFileBytes)});
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(detail::concat(path, ": not valid JSON (", e.what(), ")"));
  }
  ConfigReader c(j, path);
  if (c.has("architectures")) {
    const json& a = c.at("architectures");
    bool llama = false;
    if (a.is_array())
      for (const json& x : a) llama = llama || (x.is_string() && x == "LlamaForCausalLM");
    SEQPAR_ARG_CHECK(llama, path, ": architectures ", json_excerpt(a),
                     " is not supported; valid: [\"LlamaForCausalLM\"]");
  }
  if (c.has("model_type"))
    SEQPAR_ARG_CHECK(c.string("model_type") == "llama", path, ": model_type '",
                     quote_for_message(c.string("model_type")), "' is not supported; valid: llama");
  if (c.has("hidden_act"))
    SEQPAR_ARG_CHECK(c.string("hidden_act") == "silu", path, ": hidden_act '",
                     quote_for_message(c.string("hidden_act")), "' is not supported; valid: silu");
  if (c.has("pretraining_tp")) (void)c.integer("pretraining_tp", 1, 1);

  ModelPreset m;
  m.family = ModelFamily::kLlm;
  m.description = "Hugging Face Llama checkpoint";
  m.hidden = c.integer("hidden_size", 1, int64_t{1} << 20);
  m.ffn_dim = c.integer("intermediate_size", 1, int64_t{1} << 22);
  m.layers = c.integer("num_hidden_layers", 1, 4096);
  m.heads = c.integer("num_attention_heads", 1, limits::kMaxHeads);
  m.kv_heads = c.integer("num_key_value_heads", 1, m.heads, m.heads);
  SEQPAR_ARG_CHECK(m.heads % m.kv_heads == 0, path, ": num_key_value_heads ", m.kv_heads,
                   " does not divide num_attention_heads ", m.heads);
  SEQPAR_ARG_CHECK(c.has("head_dim") || m.hidden % m.heads == 0, path, ": hidden_size ", m.hidden,
                   " is not a multiple of num_attention_heads ", m.heads,
                   " and head_dim is absent");
  m.head_dim = c.integer("head_dim", 2, limits::kMaxHeadDim, m.hidden / m.heads);
  SEQPAR_ARG_CHECK(m.head_dim % 2 == 0, path, ": head_dim ", m.head_dim,
                   " is odd; RoPE rotates pairs of features");
  m.vocab = c.integer("vocab_size", 1, int64_t{1} << 31);
  m.rms_norm_eps = c.real("rms_norm_eps", 0.0, 1.0, 1e-6);
  m.rope_theta = c.real("rope_theta", 1.0, 1e30, 10000.0);
  m.max_positions = c.integer("max_position_embeddings", 1, limits::kMaxTokens, 2048);
  m.tie_embeddings = c.boolean("tie_word_embeddings", false);
  m.attention_bias = c.boolean("attention_bias", false);
  m.mlp_bias = c.boolean("mlp_bias", false);
  if (c.has("rope_scaling")) {
    const json& rs = c.at("rope_scaling");
    SEQPAR_ARG_CHECK(rs.is_object(), path, ": rope_scaling is ", json_excerpt(rs),
                     "; expected an object or null");
    const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
    const json type = rs.contains(type_key) ? rs.at(type_key) : json("default");
    SEQPAR_ARG_CHECK(type == "llama3" || type == "default", path, ": rope_scaling.", type_key, " ",
                     json_excerpt(type), " is not supported; valid: llama3, default");
    if (type == "llama3") {
      auto need = [&](const char* key) -> const json& {
        SEQPAR_ARG_CHECK(rs.contains(key), path, ": rope_scaling.", key,
                         " is missing; rope_type llama3 needs factor, low_freq_factor, "
                         "high_freq_factor and original_max_position_embeddings");
        return rs.at(key);
      };
      LlamaRopeScaling& s = m.rope_scaling;
      s.factor = c.real(need("factor"), "rope_scaling.factor", 1.0, 1e6);
      s.low_freq_factor =
          c.real(need("low_freq_factor"), "rope_scaling.low_freq_factor", 1e-6, 1e6);
      s.high_freq_factor =
          c.real(need("high_freq_factor"), "rope_scaling.high_freq_factor", 1e-6, 1e6);
      SEQPAR_ARG_CHECK(s.high_freq_factor > s.low_freq_factor, path,
                       ": rope_scaling.high_freq_factor ", s.high_freq_factor,
                       " must exceed low_freq_factor ", s.low_freq_factor);
      s.original_max_positions =
          c.integer_of(need("original_max_position_embeddings"),
                       "rope_scaling.original_max_position_embeddings", 1, limits::kMaxTokens);
    }
  }
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

LlamaCheckpoint open_llama_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  SEQPAR_ARG_CHECK(fs::is_directory(dir, ec), "--model ", dir,
                   ": not a directory; give a Hugging Face model directory (config.json and "
                   "model.safetensors or model.safetensors.index.json)");
  const std::string config_path = dir + "/" + kConfig;
  SEQPAR_ARG_CHECK(files::is_regular_file(config_path), config_path,
                   ": missing; a Hugging Face Llama directory holds config.json");
  LlamaCheckpoint ck;
  ck.dir = dir;
  ck.config = llama_config_from_json(read_text_file(config_path), config_path, &ck.eos_token_ids);
  ck.config.name = dir;

  // Which file holds each stored tensor.
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> where;
  const std::string index_path = dir + "/" + kIndex;
  if (files::is_regular_file(index_path)) {
    const json index = read_json_file(index_path);
    SEQPAR_ARG_CHECK(
        index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
        index_path, ": no \"weight_map\" object");
    std::map<std::string, std::shared_ptr<const SafetensorsFile>> shards;
    for (const auto& [name, file] : index.at("weight_map").items()) {
      SEQPAR_ARG_CHECK(file.is_string(), index_path, ": weight_map['", quote_for_message(name),
                       "'] is ", json_excerpt(file), "; expected a file name");
      const std::string shard = file.get<std::string>();
      SEQPAR_ARG_CHECK(!shard.empty() && shard.find('/') == std::string::npos, index_path,
                       ": weight_map['", quote_for_message(name), "'] is '",
                       quote_for_message(shard), "'; expected a file name in ", dir);
      auto it = shards.find(shard);
      if (it == shards.end()) {
        const std::string shard_path = dir + "/" + shard;
        SEQPAR_ARG_CHECK(files::is_regular_file(shard_path), index_path, ": names shard '",
                         quote_for_message(shard), "' (for '", quote_for_message(name),
                         "'), which is missing from ", dir);
        it = shards.emplace(shard, std::make_shared<const SafetensorsFile>(shard_path)).first;
      }
      SEQPAR_ARG_CHECK(it->second->contains(name), it->second->path(), ": no tensor '",
                       quote_for_message(name), "', which ", index_path, " places there");
      where[name] = it->second;
    }
  } else {
    const std::string single = dir + "/" + kSingleFile;
    SEQPAR_ARG_CHECK(files::is_regular_file(single), dir, ": neither ", kSingleFile, " nor ",
                     kIndex, " is there; expected the weights of a Hugging Face Llama directory");
    auto file = std::make_shared<const SafetensorsFile>(single);
    for (const std::string& name : file->names()) where[name] = file;
  }

  // Every parameter the config describes, with its shape; nothing else.
  const ModelPreset& m = ck.config;
  const std::string why = detail::concat(
      "config.json: hidden_size ", m.hidden, ", intermediate_size ", m.ffn_dim,
      ", num_attention_heads ", m.heads, ", num_key_value_heads ", m.kv_heads, ", head_dim ",
      m.head_dim, ", vocab_size ", m.vocab, ", num_hidden_layers ", m.layers);
  std::set<std::string> used;
  for (const auto& spec : Decoder::parameters(m)) {
    const std::string stored = stored_name(spec.name);
    auto it = where.find(stored);
    SEQPAR_ARG_CHECK(it != where.end(), dir, ": no tensor '", stored, "' (", why,
                     m.tie_embeddings ? ", tie_word_embeddings true" : "",
                     m.attention_bias ? ", attention_bias true" : "",
                     m.mlp_bias ? ", mlp_bias true" : "", ")");
    const SafetensorsEntry& e = it->second->entry(stored);
    SEQPAR_ARG_CHECK(e.shape == spec.shape, it->second->path(), ": tensor '", stored,
                     "' has shape ", shape_text(e.shape), "; ", why, " expects ",
                     shape_text(spec.shape));
    ck.weights.map(spec.name, it->second, stored);
    ck.file_bytes += static_cast<int64_t>(e.nbytes());
    used.insert(stored);
  }
  for (const auto& [stored, file] : where) {
    if (used.count(stored) || ignorable(stored)) continue;
    // A tied checkpoint may still carry lm_head.weight (transformers ties it to the embedding).
    if (stored == "lm_head.weight" && m.tie_embeddings) continue;
    throw InvalidArgument(detail::concat(file->path(), ": tensor '", quote_for_message(stored),
                                         "' is not a parameter of the model ", why,
                                         m.tie_embeddings ? ", tie_word_embeddings true" : "",
                                         m.attention_bias ? "" : ", attention_bias false",
                                         m.mlp_bias ? "" : ", mlp_bias false", ")"));
  }
  return ck;
}

void write_llama_checkpoint(const std::string& dir, const ModelPreset& m,
                            const WeightStore& weights, DType dtype, int64_t max_shard_bytes,
                            const std::vector<int64_t>& eos_token_ids) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
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
                 {"attention_bias", m.attention_bias},
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
  files::write_atomically("dir", dir + "/" + kConfig, config.dump(2) + "\n");
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
    shards.back()[stored_name(spec.name)] = std::move(t);
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (max_shard_bytes <= 0) {
    write_safetensors(dir + "/" + kSingleFile, shards[0], meta);
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
  files::write_atomically("dir", dir + "/" + kIndex, index.dump(2) + "\n");
}

std::vector<float> llama_rope_inv_freq(const ModelPreset& m) {
  const int64_t pairs = m.head_dim / 2;
  std::vector<float> f(pairs);
  for (int64_t j = 0; j < pairs; ++j)
    f[j] = static_cast<float>(1.0 / std::pow(m.rope_theta, 2.0 * j / m.head_dim));
  const LlamaRopeScaling& s = m.rope_scaling;
  if (s.factor <= 0) return f;
  // transformers' _compute_llama3_parameters, elementwise.
  const double old_len = static_cast<double>(s.original_max_positions);
  const double low_wavelen = old_len / s.low_freq_factor,
               high_wavelen = old_len / s.high_freq_factor;
  for (float& x : f) {
    const double wavelen = 2 * M_PI / x;
    if (wavelen > low_wavelen) {
      x = static_cast<float>(x / s.factor);
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      x = static_cast<float>((1 - smooth) * x / s.factor + smooth * x);
    }
  }
  return f;
}

}  // namespace seqpar
