// tiny-dit and tiny-llm on every mesh of up to 8 ranks (cfg x tp x ring x ulysses, each layout,
// uneven shards and padding) against the same model on one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "seqpar/comm/threads.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/ops.h"
#include "seqpar/model/safetensors.h"
#include "seqpar/parallel/mesh.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {
namespace {

constexpr double kTol = 1e-4;

struct MeshCase {
  MeshShape shape;
  Layout layout = Layout::kContiguous;
  bool pad = false;
  Strategy ring_strategy = Strategy::kRing;  // for ring-only meshes: ring or allgather
};

std::string name_of(const MeshCase& c) {
  return mesh_shape_text(c.shape) + " " + std::string(layout_name(c.layout)) +
         (c.pad ? " pad" : "") + " " + std::string(strategy_name(c.ring_strategy));
}

ParallelConfig config_of(const MeshCase& c) {
  ParallelConfig config;
  config.mesh = c.shape;
  config.strategy = strategy_for_degrees(c.shape.ulysses, c.shape.ring, c.ring_strategy);
  config.layout = c.layout;
  config.pad = c.pad;
  return config;
}

// Runs fn(ctx) on every rank of the mesh; returns rank 0's result and checks that every rank
// returned the same thing.
template <typename Fn>
auto on_mesh(const MeshCase& c, Fn fn) {
  using R = decltype(fn(std::declval<ParallelContext&>()));
  std::vector<R> results(c.shape.world());
  ThreadWorld::run(c.shape.world(), [&](Communicator& world) {
    MeshComms mc(world, c.shape);
    ParallelContext ctx = model_context(mc, config_of(c));
    results[world.rank()] = fn(ctx);
  });
  return results;
}

Tensor seeded(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

std::vector<MeshCase> dit_meshes() {
  std::vector<MeshCase> v;
  // {cfg, tp, ring, ulysses}
  for (MeshShape s : std::vector<MeshShape>{{1, 1, 2, 1}, {1, 1, 1, 2}, {1, 2, 1, 1}, {2, 1, 1, 1},
                                            {1, 1, 2, 2}, {1, 2, 2, 1}, {1, 2, 1, 2}, {2, 2, 1, 1},
                                            {2, 1, 2, 1}, {1, 1, 4, 1}, {1, 1, 1, 4}, {1, 4, 1, 1},
                                            {1, 1, 8, 1}, {1, 1, 1, 8}, {1, 1, 4, 2}, {1, 1, 2, 4},
                                            {2, 1, 2, 2}, {2, 2, 2, 1}, {1, 2, 2, 2}, {1, 4, 2, 1},
                                            {1, 1, 3, 1}, {1, 1, 1, 3}, {1, 1, 3, 2}, {2, 1, 3, 1}})
    for (Layout l : {Layout::kContiguous, Layout::kZigzag}) v.push_back({s, l});
  for (MeshShape s : std::vector<MeshShape>{{1, 1, 4, 1}, {1, 1, 2, 2}, {1, 1, 1, 4}}) {
    v.push_back({s, Layout::kStriped});
    v.push_back({s, Layout::kContiguous, true});
    v.push_back({s, Layout::kZigzag, true});
  }
  v.push_back({{1, 1, 4, 1}, Layout::kContiguous, false, Strategy::kAllGather});
  v.push_back({{1, 2, 4, 1}, Layout::kZigzag, true, Strategy::kAllGather});
  return v;
}

class TinyDit : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    preset_ = new DiTConfig(dit_preset("tiny-dit"));
    weights_ = new WeightStore(WeightStore::random(DiT::parameters(*preset_), 5));
    // 9 frames of 80x112: latent 3 x 10 x 14, tokens 3 x 5 x 7 = 105 (uneven on most meshes).
    shape_ = latent_shape(*preset_, 9, 80, 112);
    latent_ = new Tensor(seeded({1, preset_->in_channels, shape_.latent_frames,
                                 shape_.latent_height, shape_.latent_width}, 1));
    text_ = new Tensor(seeded({1, preset_->text_len, preset_->text_dim}, 2));
    null_text_ = new Tensor({1, preset_->text_len, preset_->text_dim});
  }
  static Tensor run(const MeshCase& c, int steps) {
    auto results = on_mesh(c, [&](ParallelContext& ctx) {
      DiT dit(*preset_, *weights_, ctx);
      if (steps == 0) return dit.guided(*latent_, 700.f, *text_, *null_text_, 5.0f, ctx);
      return dit.sample(*latent_, steps, *text_, *null_text_, 5.0f, ctx);
    });
    for (size_t r = 1; r < results.size(); ++r)
      EXPECT_LE(max_abs_diff(results[r], results[0]), 1e-6) << name_of(c) << ": rank " << r;
    return results[0];
  }
  static inline DiTConfig* preset_ = nullptr;
  static inline WeightStore* weights_ = nullptr;
  static inline LatentShape shape_;
  static inline Tensor *latent_ = nullptr, *text_ = nullptr, *null_text_ = nullptr;
};

TEST_F(TinyDit, LatentShapeOfTheSeedExample) {
  LatentShape s = latent_shape(*preset_, 33, 240, 432);
  EXPECT_EQ(s.latent_frames, 9);
  EXPECT_EQ(s.grid[1], 15);
  EXPECT_EQ(s.grid[2], 27);
  EXPECT_EQ(s.tokens, 3645);
  EXPECT_THROW(latent_shape(*preset_, 32, 240, 432), InvalidArgument);
  EXPECT_THROW(latent_shape(*preset_, 33, 250, 432), InvalidArgument);
}

TEST_F(TinyDit, PatchifyRoundTrips) {
  Tensor tokens = patchify(*latent_, preset_->patch);
  EXPECT_EQ(tokens.dim(1), shape_.tokens);
  EXPECT_EQ(max_abs_diff(unpatchify(tokens, preset_->in_channels, shape_.grid, preset_->patch),
                         *latent_),
            0.0);
}

TEST_F(TinyDit, OneStepOnEveryMeshEqualsOneRank) {
  const Tensor single = run({{1, 1, 1, 1}}, 0);
  double scale = 0;
  for (int64_t i = 0; i < single.numel(); ++i) scale = std::max(scale, std::fabs(double(single.at(i))));
  ASSERT_GT(scale, 1e-3);  // a real signal, not zeros
  for (const MeshCase& c : dit_meshes())
    EXPECT_LE(max_abs_diff(run(c, 0), single), kTol) << name_of(c);
}

TEST_F(TinyDit, FourStepLoopEqualsOneRank) {
  const Tensor single = run({{1, 1, 1, 1}}, 4);
  for (const MeshCase& c : std::vector<MeshCase>{{{2, 2, 2, 1}, Layout::kZigzag},
                                                 {{1, 1, 2, 2}, Layout::kContiguous, true},
                                                 {{2, 1, 1, 4}, Layout::kStriped},
                                                 {{1, 2, 1, 3}, Layout::kContiguous}})
    EXPECT_LE(max_abs_diff(run(c, 4), single), kTol) << name_of(c);
}

TEST_F(TinyDit, WanSeedSequenceOnEightRanks) {
  // Wan's seed example: 240 x 432, 33 frames -> 3645 tokens; 3645 mod 8 = 5.
  LatentShape s = latent_shape(*preset_, 33, 240, 432);
  Tensor latent = seeded({1, preset_->in_channels, s.latent_frames, s.latent_height,
                          s.latent_width}, 3);
  auto velocity = [&](const MeshCase& c, UlyssesMode mode) {
    auto results = on_mesh(c, [&](ParallelContext& ctx) {
      ctx.config.ulysses_mode = mode;
      DiT dit(*preset_, *weights_, ctx);
      return dit.forward(latent, 500.f, *text_, ctx);
    });
    return results[0];
  };
  const Tensor single = velocity({{1, 1, 1, 1}}, UlyssesMode::kUaa);
  // Uneven shards (uaa) and padding both match the single rank.
  EXPECT_LE(max_abs_diff(velocity({{1, 1, 1, 8}}, UlyssesMode::kUaa), single), kTol);
  EXPECT_LE(max_abs_diff(velocity({{1, 1, 2, 4}, Layout::kContiguous, true}, UlyssesMode::kStrict),
                         single), kTol);
  EXPECT_LE(max_abs_diff(velocity({{1, 1, 8, 1}, Layout::kZigzag, true}, UlyssesMode::kUaa),
                         single), kTol);
  EXPECT_LE(max_abs_diff(velocity({{1, 1, 4, 2}, Layout::kZigzag}, UlyssesMode::kUaa), single), kTol);
  // Strict mode without padding refuses, naming the remainder.
  try {
    velocity({{1, 1, 2, 4}}, UlyssesMode::kStrict);
    ADD_FAILURE() << "strict Ulysses ran 3645 tokens on 8 ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("remainder 5"), std::string::npos) << e.what();
  }
}

// ---- tiny-llm ---------------------------------------------------------------------------------

class TinyLlm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    preset_ = new DecoderConfig(decoder_preset("tiny-llm"));
    weights_ = new WeightStore(WeightStore::random(Decoder::parameters(*preset_), 9));
    std::mt19937 rng(4);
    prompt_ = new std::vector<int32_t>(1003);
    for (auto& t : *prompt_) t = static_cast<int32_t>(rng() % preset_->vocab);
  }
  static Decoder::Output run(const MeshCase& c, int decode) {
    auto results = on_mesh(c, [&](ParallelContext& ctx) {
      Decoder dec(*preset_, *weights_, ctx);
      return dec.generate(*prompt_, decode, ctx);
    });
    for (size_t r = 1; r < results.size(); ++r)
      EXPECT_EQ(results[r].tokens, results[0].tokens) << name_of(c) << ": rank " << r;
    return results[0];
  }
  static inline DecoderConfig* preset_ = nullptr;
  static inline WeightStore* weights_ = nullptr;
  static inline std::vector<int32_t>* prompt_ = nullptr;
};

TEST_F(TinyLlm, PrefillAndDecodeOnEveryMeshEqualOneRank) {
  const Decoder::Output single = run({{1, 1, 1, 1}}, 16);
  ASSERT_EQ(single.tokens.size(), 17u);
  std::vector<MeshCase> meshes;
  for (MeshShape s : std::vector<MeshShape>{{1, 1, 2, 1}, {1, 1, 1, 2}, {1, 2, 1, 1},
                                            {1, 4, 1, 1}, {1, 1, 2, 2}, {1, 2, 2, 1},
                                            {1, 2, 1, 2}, {1, 1, 4, 1}, {1, 1, 8, 1},
                                            {1, 1, 4, 2}, {1, 2, 2, 2}, {1, 4, 2, 1},
                                            {1, 1, 3, 1}, {1, 1, 1, 3}})
    for (Layout l : {Layout::kContiguous, Layout::kZigzag}) meshes.push_back({s, l});
  meshes.push_back({{1, 1, 4, 1}, Layout::kStriped});
  meshes.push_back({{1, 1, 4, 1}, Layout::kContiguous, true});
  meshes.push_back({{1, 2, 2, 1}, Layout::kZigzag, true});
  meshes.push_back({{1, 1, 4, 1}, Layout::kContiguous, false, Strategy::kAllGather});
  for (const MeshCase& c : meshes) {
    Decoder::Output got = run(c, 16);
    EXPECT_EQ(got.tokens, single.tokens) << name_of(c);
    ASSERT_EQ(got.logits.size(), single.logits.size());
    for (size_t i = 0; i < got.logits.size(); ++i)
      EXPECT_LE(max_abs_diff(got.logits[i], single.logits[i]), kTol) << name_of(c) << " step " << i;
  }
}

TEST_F(TinyLlm, RejectsBadInput) {
  EXPECT_THROW(run({{1, 3, 1, 1}}, 1), InvalidArgument);  // 4 heads on tp 3
  auto bad = *prompt_;
  bad[5] = 100000;
  EXPECT_THROW(on_mesh({{1, 1, 1, 1}},
                       [&](ParallelContext& ctx) {
                         Decoder dec(*preset_, *weights_, ctx);
                         return dec.generate(bad, 1, ctx).tokens;
                       }),
               InvalidArgument);
}

// A checkpoint tensor holding an Inf or NaN is refused at load time, in one line naming it; the
// same file with finite values loads.
TEST_F(TinyLlm, NonFiniteCheckpointTensorIsRefusedAtLoad) {
  const auto specs = Decoder::parameters(*preset_);
  std::string target;
  for (const auto& s : specs)
    if (s.name.find("q_proj") != std::string::npos) target = s.name;
  ASSERT_FALSE(target.empty());
  const std::string path = ::testing::TempDir() + "seqpar_nonfinite_weights.safetensors";
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      std::map<std::string, Tensor> tensors;
      for (const auto& [name, t] : weights_->all()) tensors[name] = t.to(dtype);
      write_safetensors(path, tensors);
      EXPECT_NO_THROW(WeightStore::from_safetensors(path, specs));
      Tensor poisoned = weights_->get(target);
      poisoned.data<float>()[poisoned.numel() / 2] = bad;
      tensors[target] = poisoned.to(dtype);
      write_safetensors(path, tensors);
      try {
        WeightStore::from_safetensors(path, specs);
        ADD_FAILURE() << "loaded " << target << " holding " << bad << " (" << dtype_name(dtype)
                      << ")";
      } catch (const InvalidArgument& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("'" + target + "'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    }
  std::remove(path.c_str());
}

// A norm whose mean square or variance overflows fp32 scales its row by rsqrt(inf) = 0 (PyTorch's
// answer): zeros that every later check takes for finite activations. The norms give NaN there
// instead, so the model stops at the layer where the overflow happened.
TEST(Norms, AnOverflowingRowIsNotFinite) {
  Tensor x({2, 4});
  const float rows[2][4] = {{1e20f, 1.f, 2.f, 3.f}, {1.f, 2.f, 3.f, 4.f}};
  std::memcpy(x.data<float>(), rows, sizeof(rows));
  for (const Tensor& y : {rms_norm(x, Tensor(), 1e-6f), layer_norm(x, Tensor(), Tensor(), 1e-6f)}) {
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(y.data<float>()[i])) << i;
    for (int i = 4; i < 8; ++i) EXPECT_TRUE(std::isfinite(y.data<float>()[i])) << i;
  }
}

// down_proj scaled so that layer 0's output is finite but the next norm's sum of squares is not:
// generate stops there, naming it, rather than running on a row of zeros.
TEST_F(TinyLlm, OverflowInsideANormIsNamed) {
  const auto specs = Decoder::parameters(*preset_);
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : weights_->all()) tensors[name] = t;
  Tensor& down = tensors.at("layers.0.mlp.down_proj.weight");
  for (int64_t i = 0; i < down.numel(); ++i) down.data<float>()[i] *= 1e36f;
  const std::string path = ::testing::TempDir() + "seqpar_overflow_weights.safetensors";
  write_safetensors(path, tensors);
  const WeightStore scaled = WeightStore::from_safetensors(path, specs);
  std::remove(path.c_str());
  try {
    on_mesh({{1, 1, 1, 1}}, [&](ParallelContext& ctx) {
      Decoder dec(*preset_, scaled, ctx);
      return dec.generate(*prompt_, 1, ctx).tokens;
    });
    ADD_FAILURE() << "generate ran on overflowing activations";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.input_layernorm produced a non-finite value"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace seqpar
