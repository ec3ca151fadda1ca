// The causal-LM families: each config reader against the keys transformers' config classes have
// (defaults included), the weight-name maps against the names transformers' *ForCausalLM
// state_dict holds, the readers' one-line refusals of malformed configs, and a Qwen3-style
// decoder on meshes against one rank. The models themselves are checked against transformers in
// tests/python/test_qwen_generate.py and test_llama_generate.py.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "seqpar/comm/threads.h"
#include "seqpar/core/error.h"
#include "seqpar/model/causal_lm.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/model_run.h"
#include "seqpar/parallel/mesh.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {
namespace {

// A one-layer config of `architecture` (hidden 16, 4 heads over 2 kv heads, FFN 24,
// vocabulary 10) with `extra` keys ("\"head_dim\": 6").
std::string config_text(const std::string& architecture, const std::string& model_type,
                        const std::string& extra = "") {
  // A key of `extra` replaces the base's: a config holds each key once.
  const std::pair<const char*, const char*> base[] = {
      {"hidden_size", "16"},        {"intermediate_size", "24"}, {"num_hidden_layers", "1"},
      {"num_attention_heads", "4"}, {"num_key_value_heads", "2"}, {"vocab_size", "10"},
      {"tie_word_embeddings", "false"}};
  std::string text = "{\"architectures\": [\"" + architecture + "\"], \"model_type\": \"" +
                     model_type + "\"";
  for (const auto& [key, value] : base)
    if (extra.find(std::string("\"").append(key).append("\":")) == std::string::npos)
      text += ", \"" + std::string(key) + "\": " + value;
  return text + (extra.empty() ? "" : ", " + extra) + "}";
}

// The checkpoint's names and shapes of every Decoder parameter of `config`.
std::map<std::string, std::vector<int64_t>> stored_shapes(const std::string& config) {
  const DecoderConfig m = causal_lm_config_from_json(config, "ck/config.json");
  const CausalLmFamily& f = causal_lm_family(m.family_name);
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& spec : Decoder::parameters(m)) out[f.stored_name(spec.name)] = spec.shape;
  return out;
}

using Shapes = std::map<std::string, std::vector<int64_t>>;

// What every family shares (embeddings, norms, MLP, lm_head) with layer 0's attention `attn`.
Shapes with_common(Shapes attn) {
  const std::string l = "model.layers.0.";
  Shapes s = {{"model.embed_tokens.weight", {10, 16}},
              {l + "input_layernorm.weight", {16}},
              {l + "post_attention_layernorm.weight", {16}},
              {l + "mlp.gate_proj.weight", {24, 16}},
              {l + "mlp.up_proj.weight", {24, 16}},
              {l + "mlp.down_proj.weight", {16, 24}},
              {"model.norm.weight", {16}},
              {"lm_head.weight", {10, 16}}};
  for (auto& [n, shape] : attn) s["model.layers.0.self_attn." + n] = shape;
  return s;
}

// The names and shapes transformers 4.57's Qwen2ForCausalLM, Qwen3ForCausalLM and
// LlamaForCausalLM state_dict() hold for these configs.
TEST(CausalLmFamilies, NameMapsGiveTransformersNames) {
  EXPECT_EQ(stored_shapes(config_text("Qwen2ForCausalLM", "qwen2")),
            with_common({{"q_proj.weight", {16, 16}},
                         {"q_proj.bias", {16}},
                         {"k_proj.weight", {8, 16}},
                         {"k_proj.bias", {8}},
                         {"v_proj.weight", {8, 16}},
                         {"v_proj.bias", {8}},
                         {"o_proj.weight", {16, 16}}}));
  EXPECT_EQ(stored_shapes(config_text("Qwen3ForCausalLM", "qwen3", "\"head_dim\": 6")),
            with_common({{"q_proj.weight", {24, 16}},
                         {"k_proj.weight", {12, 16}},
                         {"v_proj.weight", {12, 16}},
                         {"o_proj.weight", {16, 24}},
                         {"q_norm.weight", {6}},
                         {"k_norm.weight", {6}}}));
  Shapes llama = with_common({{"q_proj.weight", {16, 16}},
                              {"q_proj.bias", {16}},
                              {"k_proj.weight", {8, 16}},
                              {"k_proj.bias", {8}},
                              {"v_proj.weight", {8, 16}},
                              {"v_proj.bias", {8}},
                              {"o_proj.weight", {16, 16}},
                              {"o_proj.bias", {16}}});
  llama["model.layers.0.mlp.gate_proj.bias"] = {24};
  llama["model.layers.0.mlp.up_proj.bias"] = {24};
  llama["model.layers.0.mlp.down_proj.bias"] = {16};
  EXPECT_EQ(stored_shapes(config_text("LlamaForCausalLM", "llama",
                                      "\"attention_bias\": true, \"mlp_bias\": true")),
            llama);
  // Qwen3 with attention_bias: q/k/v/o biases, as transformers' Qwen3Attention.
  const Shapes qwen3_bias = stored_shapes(
      config_text("Qwen3ForCausalLM", "qwen3", "\"head_dim\": 6, \"attention_bias\": true"));
  for (const char* b : {"q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"})
    EXPECT_EQ(qwen3_bias.count(std::string("model.layers.0.self_attn.") + b), 1u) << b;
  // Tied: no lm_head.
  EXPECT_EQ(stored_shapes(config_text("Qwen2ForCausalLM", "qwen2", "\"tie_word_embeddings\": true"))
                .count("lm_head.weight"),
            0u);
}

TEST(CausalLmFamilies, ReadersTakeTheConfigClassesDefaults) {
  // Qwen3Config's head_dim is 128 unless given; Qwen2's is hidden / heads.
  const DecoderConfig q3 =
      causal_lm_config_from_json(config_text("Qwen3ForCausalLM", "qwen3"), "c.json");
  EXPECT_EQ(q3.family_name, "qwen3");
  EXPECT_EQ(q3.head_dim, 128);
  EXPECT_EQ(q3.qk_norm, QkNorm::kPerHead);
  EXPECT_FALSE(q3.qkv_bias || q3.o_bias || q3.mlp_bias);
  EXPECT_EQ(q3.max_positions, 32768);
  EXPECT_EQ(q3.rms_norm_eps, 1e-6);
  const DecoderConfig q2 =
      causal_lm_config_from_json(config_text("Qwen2ForCausalLM", "qwen2"), "c.json");
  EXPECT_EQ(q2.head_dim, 4);
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias || q2.mlp_bias);
  EXPECT_EQ(q2.qk_norm, QkNorm::kNone);
  // The family from model_type alone; Llama when neither key is there.
  EXPECT_EQ(causal_lm_config_from_json(
                R"({"model_type": "qwen3", "hidden_size": 16, "intermediate_size": 24,
                    "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10})",
                "c.json")
                .family_name,
            "qwen3");
  EXPECT_EQ(causal_lm_config_from_json(
                R"({"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
                    "num_attention_heads": 4, "vocab_size": 10})",
                "c.json")
                .family_name,
            "llama");
  // What transformers 4.57 writes when sliding windows are off is accepted.
  EXPECT_NO_THROW(causal_lm_config_from_json(
      config_text("Qwen2ForCausalLM", "qwen2",
                  "\"use_sliding_window\": false, \"sliding_window\": null, "
                  "\"max_window_layers\": 28, \"layer_types\": [\"full_attention\"]"),
      "c.json"));
  EXPECT_EQ(causal_lm_family("qwen2").architecture, "Qwen2ForCausalLM");
}

// The message of reading `config` (InvalidArgument), or "" if it read.
std::string refusal(const std::string& config) {
  try {
    causal_lm_config_from_json(config, "ck/config.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(CausalLmFamilies, ReadersRefuseMalformedConfigsInOneLineNamingTheKey) {
  const std::string q2 = "Qwen2ForCausalLM", q3 = "Qwen3ForCausalLM";
  const std::pair<std::string, std::string> cases[] = {
      {config_text(q2, "qwen2", "\"use_sliding_window\": true"),
       "ck/config.json: use_sliding_window is true; sliding-window attention is not supported, "
       "valid: false"},
      {config_text(q3, "qwen3", "\"layer_types\": [\"full_attention\", \"sliding_attention\"]"),
       "ck/config.json: layer_types[1] is \"sliding_attention\"; valid: \"full_attention\""},
      {config_text(q3, "qwen3", "\"layer_types\": \"full_attention\""),
       "layer_types is \"full_attention\"; expected a list"},
      {config_text("MistralForCausalLM", "mistral"),
       "ck/config.json: architectures [\"MistralForCausalLM\"] is not supported; valid: "
       "[\"LlamaForCausalLM\", \"Qwen2ForCausalLM\", \"Qwen3ForCausalLM\"]"},
      {R"({"model_type": "gemma"})",
       "ck/config.json: model_type 'gemma' is not supported; valid: llama, qwen2, qwen3"},
      {config_text(q3, "qwen2"),
       "model_type 'qwen2' does not match architectures [\"Qwen3ForCausalLM\"]; valid: qwen3"},
      {config_text(q3, "qwen3", "\"hidden_act\": \"gelu\""),
       "hidden_act 'gelu' is not supported; valid: silu"},
      {config_text(q3, "qwen3", "\"head_dim\": 33"), "head_dim 33 is odd; valid: an even head_dim"},
      {config_text(q2, "qwen2", "\"num_key_value_heads\": 3"),
       "num_key_value_heads 3 does not divide num_attention_heads 4"},
      {config_text(q2, "qwen2", "\"num_key_value_heads\": 5"),
       "num_key_value_heads 5 is out of range; valid: 1 to 4"},
      {config_text(q3, "qwen3", "\"attention_bias\": \"yes\""),
       "attention_bias is \"yes\"; expected true or false"},
      {config_text(q2, "qwen2", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}"),
       "rope_scaling.rope_type \"yarn\" is not supported; valid: llama3, default"},
      {config_text(q3, "qwen3", "\"rope_theta\": \"big\""),
       "rope_theta is \"big\"; expected a number"},
      {R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 16})",
       "key 'intermediate_size' is missing; expected an integer"},
      {"[1, 2]", "ck/config.json: not a JSON object"},
      {"{\"hidden_size\": ", "ck/config.json: not valid JSON"},
  };
  for (const auto& [config, want] : cases) {
    const std::string got = refusal(config);
    EXPECT_NE(got.find(want), std::string::npos) << "config: " << config << "\ngot: " << got;
    EXPECT_EQ(got.find('\n'), std::string::npos) << got;
  }
  EXPECT_THROW(causal_lm_family("gpt2"), InvalidArgument);
}

// A Qwen3-style decoder (per-head QK-norm, q/k/v/o biases, head_dim apart from hidden / heads)
// and a Qwen2-style one (q/k/v biases only) on meshes equal one rank.
TEST(CausalLmFamilies, QwenStyleDecodersOnMeshesEqualOneRank) {
  for (const std::string family : {"qwen2", "qwen3"}) {
    DecoderConfig m = decoder_preset("tiny-llm");
    m.family_name = family;
    m.vocab = 250;
    m.head_dim = family == "qwen3" ? 24 : m.head_dim;
    m.qkv_bias = true;
    m.o_bias = family == "qwen3";
    m.qk_norm = family == "qwen3" ? QkNorm::kPerHead : QkNorm::kNone;
    const WeightStore ws = WeightStore::random(Decoder::parameters(m), 17);
    std::vector<int32_t> prompt(45);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 29 + 3) % 250);
    auto run = [&](MeshShape shape) {
      Decoder::Output out;
      ThreadWorld::run(shape.world(), [&](Communicator& world) {
        MeshComms mc(world, shape);
        ParallelConfig config;
        config.mesh = shape;
        config.strategy = strategy_for_degrees(shape.ulysses, shape.ring, Strategy::kRing);
        config.layout = Layout::kZigzag;
        ParallelContext ctx = model_context(mc, config);
        Decoder dec(m, ws, ctx);
        Decoder::Output o = dec.generate(prompt, 4, ctx);
        if (world.rank() == 0) out = std::move(o);
      });
      return out;
    };
    const Decoder::Output one = run({1, 1, 1, 1});
    for (MeshShape shape : {MeshShape{1, 2, 1, 1}, MeshShape{1, 4, 2, 1}, MeshShape{1, 1, 2, 2},
                            MeshShape{1, 1, 3, 1}}) {
      const Decoder::Output got = run(shape);
      EXPECT_EQ(got.tokens, one.tokens) << family << " " << mesh_shape_text(shape);
      for (size_t i = 0; i < got.logits.size(); ++i)
        EXPECT_LE(max_abs_diff(got.logits[i], one.logits[i]), 1e-4)
            << family << " " << mesh_shape_text(shape);
    }
  }
}

}  // namespace
}  // namespace seqpar
