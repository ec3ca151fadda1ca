// The config keys and tensor names the Hugging Face causal-LM families share.
#include "families/hf_decoder.h"

#include "seqpar/core/error.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"

namespace seqpar {

using nlohmann::json;

namespace {

// rope_scaling: null, {"rope_type": "default"} or llama3's ("type" read as "rope_type").
RopeScaling read_rope_scaling(const ConfigJson& c) {
  RopeScaling s;
  if (!c.has("rope_scaling")) return s;
  const std::string& path = c.path();
  const json& rs = c.at("rope_scaling");
  SEQPAR_FILE_CHECK(rs.is_object(), path, ": rope_scaling is ", json_excerpt(rs),
                    "; expected an object or null");
  const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
  const json type = rs.contains(type_key) ? rs.at(type_key) : json("default");
  SEQPAR_FILE_CHECK(type == "llama3" || type == "default", path, ": rope_scaling.", type_key, " ",
                    json_excerpt(type), " is not supported; valid: llama3, default");
  if (type != "llama3") return s;
  auto need = [&](const char* key) -> const json& {
    SEQPAR_FILE_CHECK(rs.contains(key), path, ": rope_scaling.", key,
                      " is missing; rope_type llama3 needs factor, low_freq_factor, "
                      "high_freq_factor and original_max_position_embeddings");
    return rs.at(key);
  };
  s.factor = c.real_of(need("factor"), "rope_scaling.factor", 1.0, 1e6);
  s.low_freq_factor = c.real_of(need("low_freq_factor"), "rope_scaling.low_freq_factor", 1e-6, 1e6);
  s.high_freq_factor =
      c.real_of(need("high_freq_factor"), "rope_scaling.high_freq_factor", 1e-6, 1e6);
  SEQPAR_FILE_CHECK(s.high_freq_factor > s.low_freq_factor, path,
                    ": rope_scaling.high_freq_factor ", s.high_freq_factor,
                    " must exceed low_freq_factor ", s.low_freq_factor);
  s.original_max_positions =
      c.integer_of(need("original_max_position_embeddings"),
                   "rope_scaling.original_max_position_embeddings", 1, limits::kMaxTokens);
  return s;
}

}  // namespace

DecoderConfig read_hf_decoder(const ConfigJson& c, std::string_view family,
                              const HfDecoderDefaults& d) {
  const std::string& path = c.path();
  if (c.has("hidden_act"))
    SEQPAR_FILE_CHECK(c.string("hidden_act") == "silu", path, ": hidden_act '",
                      quote_for_message(c.string("hidden_act")), "' is not supported; valid: silu");
  DecoderConfig m;
  m.family_name = std::string(family);
  m.description = detail::concat("Hugging Face ", family, " checkpoint");
  m.hidden = c.integer("hidden_size", 1, int64_t{1} << 20);
  m.ffn_dim = c.integer("intermediate_size", 1, int64_t{1} << 22);
  m.layers = c.integer("num_hidden_layers", 1, 4096);
  m.heads = c.integer("num_attention_heads", 1, limits::kMaxHeads);
  m.kv_heads = c.integer("num_key_value_heads", 1, m.heads, m.heads);
  SEQPAR_FILE_CHECK(m.heads % m.kv_heads == 0, path, ": num_key_value_heads ", m.kv_heads,
                    " does not divide num_attention_heads ", m.heads);
  if (d.head_dim > 0) {
    m.head_dim = c.integer("head_dim", 2, limits::kMaxHeadDim, d.head_dim);
  } else {
    SEQPAR_FILE_CHECK(c.has("head_dim") || m.hidden % m.heads == 0, path, ": hidden_size ",
                      m.hidden, " is not a multiple of num_attention_heads ", m.heads,
                      " and head_dim is absent");
    m.head_dim = c.integer("head_dim", 2, limits::kMaxHeadDim, m.hidden / m.heads);
  }
  SEQPAR_FILE_CHECK(m.head_dim % 2 == 0, path, ": head_dim ", m.head_dim,
                    " is odd; valid: an even head_dim (RoPE rotates pairs of features)");
  m.vocab = c.integer("vocab_size", 1, int64_t{1} << 31);
  m.rms_norm_eps = c.real("rms_norm_eps", 0.0, 1.0, d.rms_norm_eps);
  m.rope_theta = c.real("rope_theta", 1.0, 1e30, 10000.0);
  m.max_positions = c.integer("max_position_embeddings", 1, limits::kMaxTokens, d.max_positions);
  m.tie_embeddings = c.boolean("tie_word_embeddings", false);
  m.rope_scaling = read_rope_scaling(c);
  return m;
}

void refuse_sliding_window(const ConfigJson& c) {
  SEQPAR_FILE_CHECK(!c.boolean("use_sliding_window", false), c.path(),
                    ": use_sliding_window is true; sliding-window attention is not supported, "
                    "valid: false (every layer attends the whole causal context)");
  if (!c.has("layer_types")) return;
  const json& types = c.at("layer_types");
  SEQPAR_FILE_CHECK(types.is_array(), c.path(), ": layer_types is ", json_excerpt(types),
                    "; expected a list of \"full_attention\"");
  for (size_t i = 0; i < types.size(); ++i)
    SEQPAR_FILE_CHECK(types[i] == "full_attention", c.path(), ": layer_types[", i, "] is ",
                      json_excerpt(types[i]),
                      "; valid: \"full_attention\" (sliding-window attention is not supported)");
}

std::string hf_stored_name(const std::string& parameter) {
  return parameter == "lm_head.weight" ? parameter : "model." + parameter;
}

}  // namespace seqpar
