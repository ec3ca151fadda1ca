// Hugging Face Llama directories: written and reopened (one file and sharded, fp32 and bf16),
// every rank reading only its share, the llama3 RoPE frequencies, rotate-half RoPE, and a
// checkpoint's decoder on meshes against one rank. The comparison with transformers itself is
// tests/python/test_llama_generate.py.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <numbers>

#include "seqpar/comm/threads.h"
#include "seqpar/model/causal_lm.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/llama.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/ops.h"
#include "seqpar/parallel/mesh.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {
namespace {

DecoderConfig tiny_llama(bool tied) {
  DecoderConfig m = decoder_preset("tiny-llm");
  m.vocab = 250;  // not divisible by the tp sizes below
  m.max_positions = 256;
  m.rope_theta = 500000.0;
  m.rope_scaling = {8.0, 1.0, 4.0, 16};
  m.tie_embeddings = tied;
  m.qkv_bias = m.o_bias = !tied;
  m.mlp_bias = !tied;
  return m;
}

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("seqpar_test_llama_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(Llama, CheckpointRoundTripKeepsDtypeAndNames) {
  for (bool tied : {false, true})
    for (int64_t shard : {int64_t{0}, int64_t{20000}}) {
      const DecoderConfig m = tiny_llama(tied);
      const WeightStore ws = WeightStore::random(Decoder::parameters(m), 3);
      const std::string dir = temp_dir("rt");
      write_llama_checkpoint(dir, m, ws, DType::kBF16, shard, {7, 9});
      EXPECT_EQ(std::filesystem::exists(dir + "/model.safetensors.index.json"), shard > 0);
      CausalLmCheckpoint ck = open_causal_lm(dir);
      EXPECT_EQ(ck.config.hidden, m.hidden);
      EXPECT_EQ(ck.config.kv_heads, m.kv_heads);
      EXPECT_EQ(ck.config.tie_embeddings, tied);
      EXPECT_EQ(ck.config.rope_scaling.original_max_positions, 16);
      EXPECT_EQ(ck.eos_token_ids, (std::vector<int64_t>{7, 9}));
      EXPECT_EQ(ck.weights.names().size(), Decoder::parameters(m).size());
      EXPECT_EQ(ck.weights.dtype("layers.1.mlp.down_proj.weight"), DType::kBF16);
      EXPECT_EQ(ck.weights.has("lm_head.weight"), !tied);
      const Tensor a = ck.weights.get("layers.0.self_attn.q_proj.weight");
      const Tensor b = ws.get("layers.0.self_attn.q_proj.weight").to(DType::kBF16).to(DType::kF32);
      EXPECT_EQ(max_abs_diff(a, b), 0.0);
      std::filesystem::remove_all(dir);
    }
}

TEST(Llama, Llama3FrequenciesFollowTransformers) {
  // Values of transformers' _compute_llama3_parameters for head_dim 16, theta 500000, factor 8,
  // low 1, high 4, original context 16: pair 0 (wavelength 6.28, between 4 and 16) is
  // interpolated, the others (wavelengths > 16) are divided by 8.
  DecoderConfig m = tiny_llama(false);
  m.head_dim = 16;
  const std::vector<float> f = rope_inv_freq(m.head_dim, m.rope_theta, m.rope_scaling);
  ASSERT_EQ(f.size(), 8u);
  const double wavelen = 2 * std::numbers::pi, smooth = (16 / wavelen - 1) / 3;
  EXPECT_NEAR(f[0], (1 - smooth) / 8 + smooth, 1e-6);
  for (int j = 1; j < 8; ++j) {
    const double want = std::pow(500000.0, -2.0 * j / 16) / 8;
    EXPECT_NEAR(f[j], want, 1e-7 * want);  // fp32
  }
  m.rope_scaling.factor = 0;
  EXPECT_NEAR(rope_inv_freq(m.head_dim, m.rope_theta, m.rope_scaling)[1],
              std::pow(500000.0, -2.0 / 16), 1e-7);
}

// transformers 4.57's inverse frequencies as fp32 bit patterns (ROPE_INIT_FUNCTIONS "default"
// and "llama3" on PyTorch 2.8's CPU), for Llama 3.1 8B (head_dim 128, theta 500000, llama3 factor
// 8, low 1, high 4, original context 8192), Llama 3.2 1B (head_dim 64, factor 32) and a scaling
// whose band between the two wavelengths is wide (high 16, original context 300).
struct RecordedFrequencies {
  int64_t head_dim;
  RopeScaling scaling;
  std::vector<uint32_t> base, llama3;
};
const RecordedFrequencies kRecorded[] = {
    {128, {8.0, 1.0, 4.0, 8192},
     {0x3f800000, 0x3f508ac1, 0x3f29e1c6, 0x3f0a6384, 0x3ee177bc, 0x3eb7ab7d, 0x3e959ee3, 0x3e73c461,
      0x3e4693b0, 0x3e21c3a0, 0x3e03c6a0, 0x3dd6b19c, 0x3daee4ad, 0x3d8e7898, 0x3d681e67, 0x3d3d1684,
      0x3d1a08c8, 0x3cfaf53f, 0x3ccc6f49, 0x3ca68939, 0x3c87a9c3, 0x3c5d06ec, 0x3c340d6d, 0x3c12ac7f,
      0x3beef74f, 0x3bc2aa76, 0x3b9e9402, 0x3b812e35, 0x3b527720, 0x3b2b72dc, 0x3b0baa41, 0x3ae38c10,
      0x3ab95d21, 0x3a970023, 0x3a7603ea, 0x3a486886, 0x3a23418d, 0x3a04fdbf, 0x39d8ac81, 0x39b08199,
      0x398fc8f8, 0x396a426f, 0x393ed4f4, 0x391b7475, 0x38fd45c3, 0x38ce51f5, 0x38a8126b, 0x3888ea0f,
      0x385f10c4, 0x3835b687, 0x381406cb, 0x37f12b80, 0x37c47610, 0x37a00a69, 0x37825f34, 0x37546808,
      0x372d07a7, 0x370cf400, 0x36e5a54d, 0x36bb12c7, 0x369864a7, 0x367848c2, 0x364a41b0, 0x3624c2ff},
     {0x3f800000, 0x3f508ac1, 0x3f29e1c6, 0x3f0a6384, 0x3ee177bc, 0x3eb7ab7d, 0x3e959ee3, 0x3e73c461,
      0x3e4693b0, 0x3e21c3a0, 0x3e03c6a0, 0x3dd6b19c, 0x3daee4ad, 0x3d8e7898, 0x3d681e67, 0x3d3d1684,
      0x3d1a08c8, 0x3cfaf53f, 0x3ccc6f49, 0x3ca68939, 0x3c87a9c3, 0x3c5d06ec, 0x3c340d6d, 0x3c12ac7f,
      0x3beef74f, 0x3bc2aa76, 0x3b9e9402, 0x3b812e35, 0x3b527720, 0x3b0dfd06, 0x3ab3d11d, 0x3a60979e,
      0x3a0995d2, 0x39a3f108, 0x393b2dd2, 0x38c86886, 0x38a3418d, 0x3884fdbf, 0x3858ac81, 0x38308199,
      0x380fc8f8, 0x37ea426f, 0x37bed4f4, 0x379b7475, 0x377d45c3, 0x374e51f5, 0x3728126b, 0x3708ea0f,
      0x36df10c4, 0x36b5b687, 0x369406cb, 0x36712b80, 0x36447610, 0x36200a69, 0x36025f34, 0x35d46808,
      0x35ad07a7, 0x358cf400, 0x3565a54d, 0x353b12c7, 0x351864a7, 0x34f848c2, 0x34ca41b0, 0x34a4c2ff}},
    {64, {32.0, 1.0, 4.0, 8192},
     {0x3f800000, 0x3f29e1c6, 0x3ee177bc, 0x3e959ee3, 0x3e4693b0, 0x3e03c6a0, 0x3daee4ad, 0x3d681e67,
      0x3d1a08c8, 0x3ccc6f49, 0x3c87a9c3, 0x3c340d6d, 0x3beef74f, 0x3b9e9402, 0x3b527720, 0x3b0baa41,
      0x3ab95d21, 0x3a7603ea, 0x3a23418d, 0x39d8ac81, 0x398fc8f8, 0x393ed4f4, 0x38fd45c3, 0x38a8126b,
      0x385f10c4, 0x381406cb, 0x37c47610, 0x37825f34, 0x372d07a7, 0x36e5a54d, 0x369864a7, 0x364a41b0},
     {0x3f800000, 0x3f29e1c6, 0x3ee177bc, 0x3e959ee3, 0x3e4693b0, 0x3e03c6a0, 0x3daee4ad, 0x3d681e67,
      0x3d1a08c8, 0x3ccc6f49, 0x3c87a9c3, 0x3c340d6d, 0x3beef74f, 0x3b9e9402, 0x3b527720, 0x3aa9279b,
      0x39e13620, 0x38cb98f7, 0x37a3418d, 0x3758ac81, 0x370fc8f8, 0x36bed4f4, 0x367d45c3, 0x3628126b,
      0x35df10c4, 0x359406cb, 0x35447610, 0x35025f34, 0x34ad07a7, 0x3465a54d, 0x341864a7, 0x33ca41b0}},
    {128, {8.0, 1.0, 16.0, 300},
     {0x3f800000, 0x3f508ac1, 0x3f29e1c6, 0x3f0a6384, 0x3ee177bc, 0x3eb7ab7d, 0x3e959ee3, 0x3e73c461,
      0x3e4693b0, 0x3e21c3a0, 0x3e03c6a0, 0x3dd6b19c, 0x3daee4ad, 0x3d8e7898, 0x3d681e67, 0x3d3d1684,
      0x3d1a08c8, 0x3cfaf53f, 0x3ccc6f49, 0x3ca68939, 0x3c87a9c3, 0x3c5d06ec, 0x3c340d6d, 0x3c12ac7f,
      0x3beef74f, 0x3bc2aa76, 0x3b9e9402, 0x3b812e35, 0x3b527720, 0x3b2b72dc, 0x3b0baa41, 0x3ae38c10,
      0x3ab95d21, 0x3a970023, 0x3a7603ea, 0x3a486886, 0x3a23418d, 0x3a04fdbf, 0x39d8ac81, 0x39b08199,
      0x398fc8f8, 0x396a426f, 0x393ed4f4, 0x391b7475, 0x38fd45c3, 0x38ce51f5, 0x38a8126b, 0x3888ea0f,
      0x385f10c4, 0x3835b687, 0x381406cb, 0x37f12b80, 0x37c47610, 0x37a00a69, 0x37825f34, 0x37546808,
      0x372d07a7, 0x370cf400, 0x36e5a54d, 0x36bb12c7, 0x369864a7, 0x367848c2, 0x364a41b0, 0x3624c2ff},
     {0x3f800000, 0x3f508ac1, 0x3f29e1c6, 0x3f0a6384, 0x3ee177bc, 0x3eb7ab7d, 0x3e83c0df, 0x3e31e048,
      0x3df0fc6b, 0x3da3eac4, 0x3d6010c4, 0x3d19ff32, 0x3cd507ec, 0x3c946925, 0x3c507229, 0x3c13ac31,
      0x3bd33890, 0x3b98929d, 0x3b5eb520, 0x3b268939, 0x3b07a9c3, 0x3add06ec, 0x3ab40d6d, 0x3a92ac7f,
      0x3a6ef74f, 0x3a42aa76, 0x3a1e9402, 0x3a012e35, 0x39d27720, 0x39ab72dc, 0x398baa41, 0x39638c10,
      0x39395d21, 0x39170023, 0x38f603ea, 0x38c86886, 0x38a3418d, 0x3884fdbf, 0x3858ac81, 0x38308199,
      0x380fc8f8, 0x37ea426f, 0x37bed4f4, 0x379b7475, 0x377d45c3, 0x374e51f5, 0x3728126b, 0x3708ea0f,
      0x36df10c4, 0x36b5b687, 0x369406cb, 0x36712b80, 0x36447610, 0x36200a69, 0x36025f34, 0x35d46808,
      0x35ad07a7, 0x358cf400, 0x3565a54d, 0x353b12c7, 0x351864a7, 0x34f848c2, 0x34ca41b0, 0x34a4c2ff}},
};

std::vector<float> floats_of(const std::vector<uint32_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = std::bit_cast<float>(bits[i]);
  return f;
}

TEST(Llama, FrequenciesAreTransformersFp32Values) {
  for (const RecordedFrequencies& r : kRecorded) {
    const RopeScaling& scaling = r.scaling;
    // llama3's scaling of transformers' own base frequencies: the same bits.
    const std::vector<float> want = floats_of(r.llama3);
    EXPECT_EQ(rope_llama3_scaled(floats_of(r.base), scaling), want) << "head_dim " << r.head_dim;
    // From theta: within one fp32 step everywhere (PyTorch's vectorized pow), and the same bits
    // on most (rounding theta^(-2j/D) in double once instead differs on a third of them).
    const std::vector<float> got = rope_inv_freq(r.head_dim, 500000.0, scaling);
    ASSERT_EQ(got.size(), want.size());
    size_t same = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_LE(std::abs(static_cast<int64_t>(std::bit_cast<uint32_t>(got[j])) -
                         static_cast<int64_t>(r.llama3[j])),
                1)
          << "pair " << j;
      same += got[j] == want[j];
    }
    EXPECT_GE(same, got.size() * 9 / 10) << "head_dim " << r.head_dim;
  }
}

TEST(Llama, RotateHalfPairsFeatureJWithJPlusHalf) {
  // x = e_j rotated by angle a: rotate-half moves it into feature j + D/2 by sin(a).
  const int64_t D = 8;
  const int64_t pos[1] = {3};
  const std::vector<float> inv = {0.5f, 0.25f, 0.125f, 0.0625f};
  const Tensor table = rope_1d(pos, inv);
  for (int64_t j = 0; j < D / 2; ++j) {
    Tensor x({1, 1, 1, D});
    x.data<float>()[j] = 1.f;
    apply_rope_(x, table, RopePairs::kHalves);
    EXPECT_NEAR(x.data<float>()[j], std::cos(3 * inv[j]), 1e-6);
    EXPECT_NEAR(x.data<float>()[j + D / 2], std::sin(3 * inv[j]), 1e-6);
  }
}

TEST(Llama, DecodeRowsTimesBf16WeightEqualFp32) {
  // Up to 8 rows multiply the bf16 matrix directly; more go through converted blocks.
  const Tensor w = random_normal({300, 136}, 1).to(DType::kBF16);
  const Tensor bias = random_normal({300}, 2);
  for (int64_t m : {1, 3, 8, 9}) {
    const Tensor x = random_normal({1, m, 136}, 3 + m);
    const Tensor want = linear(x, w.to(DType::kF32), bias);
    EXPECT_LE(max_abs_diff(linear(x, w, bias), want), 1e-4) << m << " rows";
  }
}

// causal_lm_memory's K/V cache term: keys and values of every layer for the tokens the rank holds,
// of the rank's kv heads (at least one: tp beyond the kv heads replicates them), at the cache's
// dtype. Read off as the difference between two dtypes' totals, which share every other term.
TEST(Llama, MemoryEstimateCountsTheKvCacheAtItsDtype) {
  CausalLmCheckpoint ck;
  ck.config = tiny_llama(false);
  ck.config.kv_heads = 4;
  ck.file_bytes = 1 << 20;
  const DecoderConfig& m = ck.config;
  for (const MeshShape shape : {MeshShape{1, 1, 1, 1}, MeshShape{1, 2, 1, 1}, MeshShape{1, 1, 2, 2},
                                MeshShape{1, 8, 3, 1}}) {
    ParallelConfig mesh;
    mesh.mesh = shape;
    for (const int64_t cached : {1, 77, 1000}) {
      SCOPED_TRACE(mesh_shape_text(shape) + ", " + std::to_string(cached) + " tokens cached");
      const double kv_heads = std::max<int64_t>(1, m.kv_heads / shape.tp);
      const double per_byte = 2.0 * m.layers * kv_heads * m.head_dim * cached;
      const auto estimate = [&](DType kv) {
        return causal_lm_memory(ck, mesh, 100, cached, 8, kv);
      };
      EXPECT_EQ(estimate(DType::kF32).cache, 4 * per_byte);
      EXPECT_EQ(estimate(DType::kBF16).cache, 2 * per_byte);
      EXPECT_EQ(estimate(DType::kF16).cache, 2 * per_byte);
      EXPECT_EQ(estimate(DType::kF32).run - estimate(DType::kBF16).run, 2 * per_byte);
      // The default is fp32; the weights do not depend on the cache.
      EXPECT_EQ(causal_lm_memory(ck, mesh, 100, cached, 8).run, estimate(DType::kF32).run);
      EXPECT_EQ(estimate(DType::kBF16).weights, static_cast<double>(ck.file_bytes) / shape.tp);
    }
  }
}

// Each layer's K/V cache takes its storage once, at the prefill, for exactly the tokens its rank
// will hold (Decoder::cache_tokens): after a generate with chunks (smaller than the ranks too),
// decoded tokens and chat turns, every rank's caches hold those tokens in storage of their size
// (rounded up to 64 bytes a tensor), neither grown nor larger; the ranks' tokens add up to every
// position fed; and the memory estimate's cache term, given the most any rank holds, covers it.
TEST(Llama, KvCacheTakesItsStorageOnceForItsRanksTokens) {
  const DecoderConfig m = tiny_llama(false);
  const WeightStore ws = WeightStore::random(Decoder::parameters(m), 9);
  CausalLmCheckpoint ck;
  ck.config = m;
  std::vector<int32_t> prompt(61);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 53 + 11) % 250);
  struct Case {
    MeshShape shape;
    Layout layout;
    bool pad;
    int64_t chunk, new_tokens;
    std::vector<std::vector<int32_t>> turns;
    DType kv;
  };
  for (const Case& c :
       {Case{{1, 1, 1, 1}, Layout::kContiguous, false, 0, 5, {}, DType::kF32},
        Case{{1, 1, 2, 1}, Layout::kContiguous, false, 0, 6, {}, DType::kBF16},
        Case{{1, 1, 4, 1}, Layout::kZigzag, false, 1, 3, {}, DType::kF32},
        Case{{1, 2, 3, 1}, Layout::kStriped, true, 2, 4, {{7, 8, 9}}, DType::kF16},
        Case{{1, 1, 2, 2}, Layout::kZigzag, true, 9, 2, {{1}, {4, 5}}, DType::kBF16},
        Case{{1, 4, 1, 1}, Layout::kContiguous, false, 16, 7, {{3, 3}}, DType::kF32}}) {
    ParallelConfig config;
    config.mesh = c.shape;
    config.strategy = strategy_for_degrees(c.shape.ulysses, c.shape.ring, Strategy::kRing);
    config.layout = c.layout;
    config.pad = c.pad;
    Decoder::Options opts;
    opts.max_new_tokens = c.new_tokens;
    opts.prefill_chunk = c.chunk;
    opts.chunk_strategy = Strategy::kPassQ;
    opts.next_turns = c.turns;
    opts.kv_cache = c.kv;
    SCOPED_TRACE(config_label(config) + ", chunk " + std::to_string(c.chunk));
    const int sp = c.shape.sp();
    std::vector<Decoder::CacheUse> use(c.shape.world());
    std::vector<int> sp_rank(c.shape.world());
    int64_t first_chunk = 0;  // the prefill's, as generate ran it
    ThreadWorld::run(c.shape.world(), [&](Communicator& world) {
      MeshComms mc(world, c.shape);
      ParallelContext ctx = model_context(mc, config);
      Decoder dec(m, ws, ctx);
      const Decoder::Output out = dec.generate(prompt, opts, ctx);
      if (world.rank() == 0) first_chunk = out.chunks.at(0).end - out.chunks.at(0).begin;
      use[world.rank()] = dec.kv_cache_use();
      sp_rank[world.rank()] = ctx.sp_rank();
    });
    // Every position but the last token chosen of each turn enters the caches.
    int64_t fed = static_cast<int64_t>(prompt.size()) + c.new_tokens - 1;
    for (const auto& t : c.turns) fed += static_cast<int64_t>(t.size()) + c.new_tokens;
    const int64_t kv_heads = std::max<int64_t>(1, m.kv_heads / c.shape.tp);
    const int64_t row = kv_heads * m.head_dim * static_cast<int64_t>(dtype_size(c.kv));
    int64_t most = 0, most_bytes = 0;
    std::vector<int64_t> per_sp(sp, -1);
    for (int r = 0; r < c.shape.world(); ++r) {
      const int64_t tokens =
          Decoder::cache_tokens(opts, static_cast<int64_t>(prompt.size()), config, sp_rank[r]);
      EXPECT_EQ(use[r].tokens, tokens) << "rank " << r;
      EXPECT_EQ(use[r].bytes, 2 * m.layers * ((tokens * row + 63) / 64 * 64)) << "rank " << r;
      per_sp[sp_rank[r]] = tokens;
      most = std::max(most, tokens);
      most_bytes = std::max(most_bytes, use[r].bytes);
    }
    int64_t total = 0;
    for (int64_t t : per_sp) total += t;
    EXPECT_EQ(total, fed);
    // What the memory checks take: the first chunk generate ran, the most any rank held.
    const Decoder::Footprint at_most = Decoder::footprint(opts, 61, config);
    EXPECT_EQ(at_most.first_chunk, first_chunk);
    EXPECT_EQ(at_most.cached, most);
    const double cache = causal_lm_memory(ck, config, 61, most, c.new_tokens, c.kv).cache;
    EXPECT_GE(cache + 2 * m.layers * 64, static_cast<double>(most_bytes));
    EXPECT_LE(cache, static_cast<double>(most_bytes));
  }
  // A prompt shorter than the sequence-parallel ranks: one line saying what would do.
  ParallelConfig four;
  four.mesh = MeshShape{1, 1, 4, 1};
  try {
    (void)Decoder::footprint(Decoder::Options{}, 3, four);
    ADD_FAILURE() << "a prompt of 3 tokens on 4 ranks was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "the prompt has 3 tokens, fewer than the 4 sequence-parallel ranks (padding or not, "
              "every rank needs a token); use at most 3 ranks, or a longer prompt");
  }
}

TEST(Llama, CheckpointDecoderOnMeshesEqualsOneRank) {
  const DecoderConfig m = tiny_llama(false);
  const std::string dir = temp_dir("mesh");
  write_llama_checkpoint(dir, m, WeightStore::random(Decoder::parameters(m), 5), DType::kBF16,
                         30000);
  const CausalLmCheckpoint ck = open_causal_lm(dir);
  std::vector<int32_t> prompt(77);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 5) % 250);
  auto run = [&](MeshShape shape, Strategy s, Layout layout) {
    Decoder::Output out;
    std::vector<int64_t> bytes(shape.world());
    ThreadWorld::run(shape.world(), [&](Communicator& world) {
      MeshComms mc(world, shape);
      ParallelConfig config;
      config.mesh = shape;
      config.strategy = s;
      config.layout = layout;
      ParallelContext ctx = model_context(mc, config);
      WeightStore mine = ck.weights;
      Decoder dec(ck.config, mine, ctx);
      bytes[world.rank()] = mine.bytes_read();
      Decoder::Output o = dec.generate(prompt, 5, ctx);
      if (world.rank() == 0) out = std::move(o);
    });
    return std::make_pair(out, bytes);
  };
  const auto [one, one_bytes] = run({1, 1, 1, 1}, Strategy::kRing, Layout::kContiguous);
  EXPECT_EQ(one_bytes[0], ck.file_bytes);  // one rank reads every tensor once, in bf16
  struct Case {
    MeshShape shape;
    Strategy s;
    Layout layout;
  };
  for (const Case& c : {Case{{1, 2, 1, 1}, Strategy::kRing, Layout::kContiguous},
                        Case{{1, 1, 3, 1}, Strategy::kRing, Layout::kZigzag},
                        Case{{1, 2, 2, 2}, Strategy::kUsp, Layout::kZigzag},
                        Case{{1, 4, 1, 2}, Strategy::kUlysses, Layout::kStriped}}) {
    const auto [got, bytes] = run(c.shape, c.s, c.layout);
    EXPECT_EQ(got.tokens, one.tokens) << mesh_shape_text(c.shape);
    for (size_t i = 0; i < got.logits.size(); ++i)
      EXPECT_LE(max_abs_diff(got.logits[i], one.logits[i]), 1e-4) << mesh_shape_text(c.shape);
    // A tp rank reads its share of the matrices: under 1/tp of the file (1/kv_heads when tp
    // exceeds the kv heads, which it then replicates) plus the replicated norms and o/down biases.
    const int64_t replicated = 4 * m.hidden * (2 * m.layers + 1) + 4 * m.hidden * 2 * m.layers;
    const int64_t share = std::min<int64_t>(c.shape.tp, m.kv_heads);
    for (int64_t b : bytes) EXPECT_LE(b, ck.file_bytes / share + replicated);
  }
  std::filesystem::remove_all(dir);
}

// Rank 0's output of generate(prompt, opts) for a seeded model on a mesh of `shape`.
Decoder::Output generate_on(const DecoderConfig& m, const WeightStore& ws, MeshShape shape,
                            Layout layout, const std::vector<int32_t>& prompt,
                            const Decoder::Options& opts) {
  Decoder::Output out;
  ThreadWorld::run(shape.world(), [&](Communicator& world) {
    MeshComms mc(world, shape);
    ParallelConfig config;
    config.mesh = shape;
    config.strategy = strategy_for_degrees(shape.ulysses, shape.ring, Strategy::kRing);
    config.layout = layout;
    ParallelContext ctx = model_context(mc, config);
    Decoder dec(m, ws, ctx);
    Decoder::Output o = dec.generate(prompt, opts, ctx);
    if (world.rank() == 0) out = std::move(o);
  });
  return out;
}

// Chunked prefill: each chunk after the first attends the cache by pass-KV or pass-Q; the tokens
// and logits equal the whole prompt's prefill on one rank.
TEST(Llama, ChunkedPrefillEqualsTheWholePrompt) {
  const DecoderConfig m = tiny_llama(false);
  WeightStore ws = WeightStore::random(Decoder::parameters(m), 9);
  std::vector<int32_t> prompt(61);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 53 + 11) % 250);
  auto run = [&](MeshShape shape, Layout layout, const Decoder::Options& opts) {
    return generate_on(m, ws, shape, layout, prompt, opts);
  };
  Decoder::Options whole;
  whole.max_new_tokens = 4;
  const Decoder::Output one = run({1, 1, 1, 1}, Layout::kContiguous, whole);
  ASSERT_EQ(one.chunks.size(), 1u);
  struct Case {
    MeshShape shape;
    Layout layout;
    int64_t chunk;
    std::optional<Strategy> pinned;
    ScheduleKind schedule = ScheduleKind::kDefault;
  };
  for (const Case& c :
       {Case{{1, 1, 2, 1}, Layout::kContiguous, 20, Strategy::kPassKv},
        Case{{1, 1, 3, 1}, Layout::kZigzag, 7, Strategy::kPassQ},
        Case{{1, 1, 3, 1}, Layout::kZigzag, 7, Strategy::kPassQ, ScheduleKind::kRing},
        Case{{1, 2, 2, 1}, Layout::kZigzag, 1, Strategy::kPassQ},
        Case{{1, 2, 2, 1}, Layout::kContiguous, 9, Strategy::kPassQ, ScheduleKind::kRing},
        Case{{1, 1, 2, 2}, Layout::kStriped, 16, Strategy::kPassKv},
        Case{{1, 1, 4, 1}, Layout::kContiguous, 25, std::nullopt},
        Case{{1, 1, 1, 1}, Layout::kContiguous, 30, Strategy::kPassKv}}) {
    Decoder::Options opts = whole;
    opts.prefill_chunk = c.chunk;
    opts.chunk_strategy = c.pinned;
    opts.chunk_schedule = c.schedule;
    // Unpinned: the caller's chooser answers (here the three ways in turn), with the chunk's
    // call as the group sees it.
    std::vector<AttnShape> asked;
    std::mutex asked_mu;
    opts.choose_chunk = [&](const AttnShape& call, int ranks) {
      std::lock_guard<std::mutex> lock(asked_mu);
      asked.push_back(call);
      EXPECT_EQ(ranks, c.shape.sp());
      ParallelConfig way;
      const int pick = static_cast<int>(call.cached % 3);
      way.strategy = pick == 0 ? Strategy::kPassKv : Strategy::kPassQ;
      way.schedule = pick == 2 ? ScheduleKind::kRing : ScheduleKind::kDefault;
      return std::pair{way, std::string("chosen")};
    };
    const Decoder::Output got = run(c.shape, c.layout, opts);
    const std::string what = mesh_shape_text(c.shape) + " chunk " + std::to_string(c.chunk);
    EXPECT_EQ(got.tokens, one.tokens) << what;
    for (size_t i = 0; i < got.logits.size(); ++i)
      EXPECT_LE(max_abs_diff(got.logits[i], one.logits[i]), 1e-4) << what << " token " << i;
    const int64_t first = std::max<int64_t>(c.chunk, c.shape.sp());
    const int64_t chunks = 1 + (61 - first + c.chunk - 1) / c.chunk;
    ASSERT_EQ(static_cast<int64_t>(got.chunks.size()), chunks) << what;
    for (size_t i = 1; i < got.chunks.size(); ++i) {
      const Decoder::Chunk& k = got.chunks[i];
      EXPECT_EQ(k.cached, k.begin) << what;
      EXPECT_EQ(k.begin, got.chunks[i - 1].end) << what;
      if (c.pinned) {
        EXPECT_EQ(k.strategy, *c.pinned) << what;
        EXPECT_EQ(k.schedule, c.schedule) << what;
      } else {  // what the chooser said for this chunk's call
        const int pick = static_cast<int>(k.cached % 3);
        EXPECT_EQ(k.strategy, pick == 0 ? Strategy::kPassKv : Strategy::kPassQ) << what;
        EXPECT_EQ(k.schedule, pick == 2 ? ScheduleKind::kRing : ScheduleKind::kDefault) << what;
        EXPECT_EQ(k.reason, "chosen") << what;
      }
    }
    EXPECT_EQ(got.chunks.back().end, 61) << what;
    if (!c.pinned) {  // every rank asked for every chunk, with the chunk's call
      ASSERT_EQ(asked.size(), (got.chunks.size() - 1) * c.shape.world()) << what;
      for (const AttnShape& call : asked) {
        EXPECT_EQ(call.heads, m.heads / c.shape.tp);
        EXPECT_EQ(call.seq, call.cached + call.fresh);
        EXPECT_TRUE(call.causal);
      }
    } else {
      EXPECT_TRUE(asked.empty()) << what;
    }
  }
}

// A chat turn (a second prompt after the first one's tokens) continues over the cache: its
// tokens equal one rank's whole run of the concatenation (prompt, tokens generated, turn).
TEST(Llama, ChatTurnEqualsTheConcatenatedPrompt) {
  const DecoderConfig m = tiny_llama(false);
  WeightStore ws = WeightStore::random(Decoder::parameters(m), 9);
  std::vector<int32_t> prompt(23), turn(17);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 53 + 11) % 250);
  for (size_t i = 0; i < turn.size(); ++i) turn[i] = static_cast<int32_t>((i * 31 + 7) % 250);
  auto run = [&](MeshShape shape, const std::vector<int32_t>& ids, const Decoder::Options& opts) {
    return generate_on(m, ws, shape, Layout::kContiguous, ids, opts);
  };
  Decoder::Options opts;
  opts.max_new_tokens = 3;
  opts.chunk_strategy = Strategy::kPassQ;
  // The reference: the first turn alone, then the whole conversation, on one rank.
  const Decoder::Output first = run({1, 1, 1, 1}, prompt, opts);
  std::vector<int32_t> whole = prompt;
  whole.insert(whole.end(), first.tokens.begin(), first.tokens.end());
  whole.insert(whole.end(), turn.begin(), turn.end());
  const Decoder::Output second = run({1, 1, 1, 1}, whole, opts);
  for (MeshShape shape : {MeshShape{1, 1, 1, 1}, MeshShape{1, 1, 3, 1}, MeshShape{1, 2, 2, 1},
                          MeshShape{1, 1, 2, 2}}) {
    for (int64_t chunk : {0, 5}) {
      for (Strategy pass : {Strategy::kPassQ, Strategy::kPassKv}) {
        Decoder::Options chat = opts;
        chat.next_turns = {turn};
        chat.prefill_chunk = chunk;
        chat.chunk_strategy = pass;
        const Decoder::Output got = run(shape, prompt, chat);
        const std::string what = mesh_shape_text(shape) + " chunk " + std::to_string(chunk) +
                                 " " + std::string(strategy_name(pass));
        ASSERT_EQ(got.turn_tokens, (std::vector<int64_t>{3, 3})) << what;
        EXPECT_EQ(std::vector<int32_t>(got.tokens.begin(), got.tokens.begin() + 3), first.tokens)
            << what;
        EXPECT_EQ(std::vector<int32_t>(got.tokens.begin() + 3, got.tokens.end()), second.tokens)
            << what;
        for (size_t i = 0; i < 3; ++i)
          EXPECT_LE(max_abs_diff(got.logits[3 + i], second.logits[i]), 1e-4) << what << " " << i;
        // The turn's chunks start where the cache ends: after the prompt and two decoded tokens.
        const Decoder::Chunk& k = got.chunks[got.chunks.size() - (chunk ? 4 : 1)];
        EXPECT_EQ(k.begin, 23 + 2) << what;
        EXPECT_EQ(got.chunks.back().end, 23 + 3 + 17) << what;
      }
    }
  }
}

}  // namespace
}  // namespace seqpar
