// Wan checkpoints: the scheduler's sigmas bit for bit against diffusers', the name map, and the
// loader's one-line refusals. The model itself is checked against diffusers in
// tests/python/test_wan.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "seqpar/core/error.h"
#include "seqpar/model/wan.h"

namespace seqpar {
namespace {

// Values printed by diffusers 0.35.2: FlowMatchEulerDiscreteScheduler(shift=s).set_timesteps(k);
// scheduler.sigmas as float.hex().
TEST(WanSchedule, EqualsDiffusersBitForBit) {
  struct Case {
    int steps;
    double shift;
    std::vector<std::pair<int, double>> sigmas;  // index, value
  };
  const Case cases[] = {
      {4, 3.0, {{0, 0x1p+0}, {1, 0x1.b72372p-1}, {2, 0x1.344d14p-1}, {3, 0x1.24924ap-7}, {4, 0}}},
      {50, 5.0, {{0, 0x1p+0}, {1, 0x1.fde2e2p-1}, {2, 0x1.fbb39ap-1}, {49, 0x1.900004p-6}}},
      {1, 1.0, {{0, 0x1p+0}, {1, 0}}},
  };
  for (const Case& c : cases) {
    const FlowMatchSchedule s = flow_match_schedule(c.steps, c.shift);
    ASSERT_EQ(s.sigmas.size(), static_cast<size_t>(c.steps) + 1);
    for (auto [i, v] : c.sigmas)
      EXPECT_EQ(s.sigmas[i], static_cast<float>(v)) << c.steps << " " << i;
    for (int i = 0; i < c.steps; ++i) EXPECT_EQ(s.timesteps[i], s.sigmas[i] * 1000.0f);
  }
}

TEST(WanNames, DiffusersMapAndOriginalIdentity) {
  const std::pair<const char*, const char*> map[] = {
      {"blocks.3.self_attn.q.weight", "blocks.3.attn1.to_q.weight"},
      {"blocks.3.self_attn.o.bias", "blocks.3.attn1.to_out.0.bias"},
      {"blocks.12.cross_attn.norm_k.weight", "blocks.12.attn2.norm_k.weight"},
      {"blocks.0.norm3.bias", "blocks.0.norm2.bias"},
      {"blocks.0.ffn.0.weight", "blocks.0.ffn.net.0.proj.weight"},
      {"blocks.0.ffn.2.bias", "blocks.0.ffn.net.2.bias"},
      {"blocks.7.modulation", "blocks.7.scale_shift_table"},
      {"head.modulation", "scale_shift_table"},
      {"head.head.weight", "proj_out.weight"},
      {"time_projection.1.bias", "condition_embedder.time_proj.bias"},
      {"text_embedding.2.weight", "condition_embedder.text_embedder.linear_2.weight"},
      {"time_embedding.0.weight", "condition_embedder.time_embedder.linear_1.weight"},
      {"patch_embedding.weight", "patch_embedding.weight"},
  };
  for (auto [dit, diffusers] : map) {
    EXPECT_EQ(wan_stored_name(dit, WanLayout::kDiffusers), diffusers);
    EXPECT_EQ(wan_stored_name(dit, WanLayout::kOriginal), dit);
  }
}

// The message of open_wan_model(dir) (InvalidArgument), or "" if it opened.
std::string open_error(const std::filesystem::path& dir) {
  try {
    open_wan_model(dir.string());
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(WanOpen, RefusesWithOneLineNamingTheKey) {
  const auto root =
      std::filesystem::temp_directory_path() / ("seqpar_test_wan_" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "neither");
  EXPECT_NE(open_error(root / "neither").find("neither a diffusers Wan checkpoint"),
            std::string::npos);
  auto config = [&](const std::string& name, const std::string& json) {
    std::filesystem::create_directories(root / name);
    std::ofstream(root / name / "config.json") << json;
    return root / name;
  };
  // Image-to-video needs both image_dim and added_kv_proj_dim; first-last-frame is refused.
  const std::string i2v =
      open_error(config("i2v", R"({"_class_name": "WanTransformer3DModel", "image_dim": 1280})"));
  EXPECT_NE(i2v.find("key 'added_kv_proj_dim' is null while 'image_dim' is set"), std::string::npos)
      << i2v;
  const std::string flf = open_error(
      config("flf", R"({"_class_name": "WanTransformer3DModel", "pos_embed_seq_len": 514})"));
  EXPECT_NE(flf.find("key 'pos_embed_seq_len' is 514; first-last-frame"), std::string::npos) << flf;
  const std::string type = open_error(config("flf2v", R"({"dim": 64, "model_type": "flf2v"})"));
  EXPECT_NE(type.find("key 'model_type' is \"flf2v\"; supported"), std::string::npos) << type;
  const std::string heads = open_error(
      config("heads", R"({"dim": 64, "ffn_dim": 128, "freq_dim": 32, "in_dim": 4, "out_dim": 4,
                   "num_layers": 1, "text_len": 8})"));
  EXPECT_NE(heads.find("key 'num_heads' is missing; expected an integer"), std::string::npos)
      << heads;
  const std::string weights = open_error(config(
      "noweights", R"({"dim": 64, "num_heads": 4, "ffn_dim": 128, "freq_dim": 32, "in_dim": 4,
                       "out_dim": 4, "num_layers": 1, "text_len": 8})"));
  EXPECT_NE(weights.find("holds no weights; expected diffusion_pytorch_model.safetensors"),
            std::string::npos)
      << weights;
  for (const std::string& m : {i2v, flf, type, heads, weights})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace seqpar
