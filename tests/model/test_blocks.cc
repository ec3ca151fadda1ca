// The shared blocks against naive references computed here in double: the per-head QK-norm
// (Qwen3) and the across-heads one (Wan, statistics over tp), and a self-attention block with
// per-head QK-norm, q/k/v biases, GQA, head_dim apart from hidden / heads and rotate-half RoPE,
// on meshes of tp and sequence parallelism. The families' whole models are checked against
// transformers and diffusers in tests/python.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "seqpar/comm/threads.h"
#include "seqpar/model/blocks/attention.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/ops.h"
#include "seqpar/parallel/mesh.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {
namespace {

// y[r, h, :] = x[r, h, :] / sqrt(mean over `width` features of x² + eps) · w, where a group of
// `width` features is one head (per head) or all heads (across heads).
std::vector<double> naive_rms(const Tensor& x, const Tensor& w, int64_t width, double eps) {
  std::vector<double> y(x.numel());
  for (int64_t g = 0; g < x.numel() / width; ++g) {
    double ss = 0;
    for (int64_t i = 0; i < width; ++i) ss += double(x.at(g * width + i)) * x.at(g * width + i);
    const double inv = 1.0 / std::sqrt(ss / width + eps);
    for (int64_t i = 0; i < width; ++i)
      y[g * width + i] = x.at(g * width + i) * inv * w.at((g * width + i) % w.numel());
  }
  return y;
}

double max_diff(const Tensor& got, const std::vector<double>& want) {
  double e = 0;
  for (int64_t i = 0; i < got.numel(); ++i) e = std::max(e, std::fabs(got.at(i) - want[i]));
  return e;
}

// rope_3d against its definition per token (diffusers' Wan rotary embedding: pair k of an axis of
// width w rotates by coordinate · theta^(-2k / 2w), in float64, then cos and sin rounded to fp32),
// bit for bit: every position of a grid, one rank's shard of it, positions past the last frame,
// and positions so sparse that each is computed on its own.
TEST(Rope, ThreeDIsTheDefinitionOfEachToken) {
  for (int64_t head_dim : {12, 128}) {
    const std::array<int64_t, 3> grid = {3, 4, 5};
    std::vector<int64_t> all(60), shard, sparse = {7, 1000003, 20000000}, past = {58, 59, 60, 75};
    for (int64_t i = 0; i < 60; ++i) all[i] = i;
    for (int64_t i = 13; i < 40; i += 2) shard.push_back(i);
    for (const auto& positions : {all, shard, sparse, past}) {
      const Tensor t = rope_3d(positions, grid, head_dim, 10000.0);
      const int64_t pairs = head_dim / 2, ph = pairs / 3, pw = pairs / 3;
      const int64_t width[3] = {pairs - ph - pw, ph, pw};
      ASSERT_EQ(t.shape(), (std::vector<int64_t>{static_cast<int64_t>(positions.size()), pairs, 2}));
      for (size_t i = 0; i < positions.size(); ++i) {
        const int64_t p = positions[i];
        const int64_t coord[3] = {p / 20, p / 5 % 4, p % 5};
        int64_t j = 0;
        for (int axis = 0; axis < 3; ++axis)
          for (int64_t k = 0; k < width[axis]; ++k, ++j) {
            const double angle = static_cast<double>(coord[axis]) *
                                 std::pow(10000.0, -2.0 * static_cast<double>(k) /
                                                       static_cast<double>(2 * width[axis]));
            ASSERT_EQ(t.at((i * pairs + j) * 2), static_cast<float>(std::cos(angle)))
                << "position " << p << " pair " << j;
            ASSERT_EQ(t.at((i * pairs + j) * 2 + 1), static_cast<float>(std::sin(angle)))
                << "position " << p << " pair " << j;
          }
      }
    }
  }
}

// Appending to a K/V cache token by token (a decode) and in chunks, batch 2, through several
// growths of its storage, equals the tokens concatenated, in fp32 or rounded to the cache's bf16 or
// fp16 (to nearest even, as core/dtype.h's scalar conversions round); positions follow.
class KvCacheDtype : public ::testing::TestWithParam<DType> {};

TEST_P(KvCacheDtype, AppendEqualsConcatenation) {
  const int64_t B = 2, H = 3, D = 4;
  const DType dtype = GetParam();
  auto stored = [dtype](float x) {
    return dtype == DType::kBF16  ? bf16_to_f32(f32_to_bf16(x))
           : dtype == DType::kF16 ? f16_to_f32(f32_to_f16(x))
                                  : x;
  };
  std::vector<int64_t> steps = {5, 1, 1, 3, 1, 1, 1, 7, 1, 1, 1, 1, 2, 1};
  KvCache cache;
  cache.dtype = dtype;
  std::vector<std::vector<float>> want_k(B), want_v(B);  // per batch, token-major rows of H·D
  int64_t n = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    const int64_t m = steps[s];
    Tensor k = random_normal({B, m, H, D}, 100 + s), v = random_normal({B, m, H, D}, 200 + s);
    std::vector<int64_t> pos(m);
    for (int64_t i = 0; i < m; ++i) pos[i] = n + i;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < m * H * D; ++i) {
        want_k[b].push_back(stored(k.at(b * m * H * D + i)));
        want_v[b].push_back(stored(v.at(b * m * H * D + i)));
      }
    cache.append(k, v, pos);
    n += m;
    ASSERT_EQ(cache.k.shape(), (std::vector<int64_t>{B, n, H, D}));
    ASSERT_EQ(cache.v.shape(), cache.k.shape());
    ASSERT_EQ(cache.k.dtype(), dtype);
    ASSERT_EQ(cache.v.dtype(), dtype);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n * H * D; ++i) {
        ASSERT_EQ(cache.k.at(b * n * H * D + i), want_k[b][i]) << "step " << s << " batch " << b;
        ASSERT_EQ(cache.v.at(b * n * H * D + i), want_v[b][i]) << "step " << s << " batch " << b;
      }
  }
  ASSERT_EQ(static_cast<int64_t>(cache.positions.size()), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(cache.positions[i], i);
}

INSTANTIATE_TEST_SUITE_P(Blocks, KvCacheDtype,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

TEST(Blocks, PerHeadQkNormEqualsNaive) {
  const int64_t heads = 3, D = 8;
  WeightStore ws;
  ws.set("q_norm.weight", random_normal({D}, 1));
  const Tensor x = random_normal({2, 5, heads * D}, 2);
  ThreadWorld::run(1, [&](Communicator& tp) {
    const QkNormBlock n =
        QkNormBlock::load(ws, "q_norm", QkNorm::kPerHead, 0, heads, heads, D, 1e-6f);
    const Tensor y = n.forward(x, tp);
    ASSERT_EQ(y.shape(), x.shape());
    EXPECT_LE(max_diff(y, naive_rms(x, ws.get("q_norm.weight"), D, 1e-6)), 1e-5);
    // Not the same as one norm over all heads (with the weight repeated per head).
    EXPECT_GT(max_diff(y, naive_rms(x, ws.get("q_norm.weight"), heads * D, 1e-6)), 1e-2);
  });
}

TEST(Blocks, AcrossHeadsQkNormOnTwoTpRanksEqualsNaive) {
  const int64_t heads = 4, D = 6;
  WeightStore ws;
  ws.set("norm_q.weight", random_normal({heads * D}, 3));
  const Tensor x = random_normal({1, 7, heads * D}, 4);
  const std::vector<double> want = naive_rms(x, ws.get("norm_q.weight"), heads * D, 1e-6);
  ThreadWorld::run(2, [&](Communicator& tp) {
    const int64_t h0 = 2 * tp.rank(), h1 = h0 + 2;
    const QkNormBlock n =
        QkNormBlock::load(ws, "norm_q", QkNorm::kAcrossHeads, h0, h1, heads, D, 1e-6f);
    const Tensor y = n.forward(slice_cols(x, h0 * D, h1 * D), tp);
    std::vector<double> mine;
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t i = h0 * D; i < h1 * D; ++i) mine.push_back(want[r * heads * D + i]);
    EXPECT_LE(max_diff(y, mine), 1e-5) << "tp rank " << tp.rank();
  });
}

// Self-attention of x (1, S, hidden) computed naively: q/k/v with biases, per-head RMSNorm of q
// and k, rotate-half RoPE (theta 10000), causal softmax with GQA, o without bias.
std::vector<double> naive_attention(const AttentionSpec& a, const WeightStore& ws, const Tensor& x,
                                    const std::vector<float>& inv_freq) {
  const int64_t S = x.dim(1), E = a.hidden, H = a.heads, Hkv = a.kv_heads, D = a.head_dim;
  auto project = [&](const std::string& name, int64_t rows, bool bias) {
    const Tensor w = ws.get("a." + name + ".weight");
    std::vector<double> y(S * rows);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t o = 0; o < rows; ++o) {
        double acc = bias ? ws.get("a." + name + ".bias").at(o) : 0.0;
        for (int64_t i = 0; i < E; ++i) acc += double(x.at(s * E + i)) * w.at(o * E + i);
        y[s * rows + o] = acc;
      }
    return y;
  };
  std::vector<double> q = project("q_proj", H * D, a.qkv_bias),
                      k = project("k_proj", Hkv * D, a.qkv_bias),
                      v = project("v_proj", Hkv * D, a.qkv_bias);
  auto norm_and_rotate = [&](std::vector<double>& t, int64_t heads, const std::string& norm) {
    const Tensor w = ws.get("a." + norm + ".weight");
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < heads; ++h) {
        double* row = &t[(s * heads + h) * D];
        double ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += row[i] * row[i];
        const double inv = 1.0 / std::sqrt(ss / D + a.qk_norm_eps);
        for (int64_t i = 0; i < D; ++i) row[i] *= inv * w.at(i);
        for (int64_t j = 0; j < D / 2; ++j) {
          const double angle = double(float(s) * inv_freq[j]);
          const double c = std::cos(angle), sn = std::sin(angle), x0 = row[j], x1 = row[j + D / 2];
          row[j] = x0 * c - x1 * sn;
          row[j + D / 2] = x0 * sn + x1 * c;
        }
      }
  };
  norm_and_rotate(q, H, "q_norm");
  norm_and_rotate(k, Hkv, "k_norm");
  std::vector<double> att(S * H * D, 0.0);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      std::vector<double> logits(s + 1);
      double mx = -1e300, sum = 0;
      for (int64_t t = 0; t <= s; ++t) {
        double dot = 0;
        for (int64_t i = 0; i < D; ++i) dot += q[(s * H + h) * D + i] * k[(t * Hkv + g) * D + i];
        logits[t] = dot / std::sqrt(double(D));
        mx = std::max(mx, logits[t]);
      }
      for (double& l : logits) sum += (l = std::exp(l - mx));
      for (int64_t t = 0; t <= s; ++t)
        for (int64_t i = 0; i < D; ++i)
          att[(s * H + h) * D + i] += logits[t] / sum * v[(t * Hkv + g) * D + i];
    }
  const Tensor wo = ws.get("a.o_proj.weight");
  std::vector<double> out(S * E, 0.0);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t o = 0; o < E; ++o)
      for (int64_t i = 0; i < H * D; ++i)
        out[s * E + o] += att[s * H * D + i] * wo.at(o * H * D + i);
  return out;
}

TEST(Blocks, SelfAttentionWithPerHeadQkNormEqualsNaiveOnMeshes) {
  AttentionSpec a;
  a.hidden = 24;
  a.heads = 4;
  a.kv_heads = 2;
  a.head_dim = 10;  // q is 40 wide over a hidden width of 24
  a.qkv_bias = true;
  a.qk_norm = QkNorm::kPerHead;
  a.rope_pairs = RopePairs::kHalves;
  a.proj = {"q_proj", "k_proj", "v_proj", "o_proj"};
  a.norm = {"q_norm", "k_norm"};
  WeightStore ws = WeightStore::random(a.parameters("a", 0.4f, 0.3f), 7);
  // Norm scales around 2.5, so that the normalized q·k single out positions.
  for (auto [n, seed] : {std::pair{"a.q_norm.weight", 11}, std::pair{"a.k_norm.weight", 12}}) {
    Tensor w = random_normal({a.head_dim}, seed);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = 2.5f + 0.5f * w.data<float>()[i];
    ws.set(n, w);
  }
  const int64_t S = 13;
  const Tensor x = random_normal({1, S, a.hidden}, 8);
  const std::vector<float> inv_freq = rope_inv_freq(a.head_dim, 10000.0);
  const std::vector<double> want = naive_attention(a, ws, x, inv_freq);
  for (MeshShape shape : {MeshShape{1, 1, 1, 1}, MeshShape{1, 2, 1, 1}, MeshShape{1, 4, 1, 1},
                          MeshShape{1, 1, 3, 1}, MeshShape{1, 2, 2, 1}, MeshShape{1, 1, 2, 2}}) {
    ThreadWorld::run(shape.world(), [&](Communicator& world) {
      MeshComms mc(world, shape);
      ParallelConfig config;
      config.mesh = shape;
      config.strategy = strategy_for_degrees(shape.ulysses, shape.ring, Strategy::kRing);
      config.layout = Layout::kZigzag;
      ParallelContext ctx = model_context(mc, config);
      const SelfAttention attn = SelfAttention::load(ws, "a", a, ctx);
      std::vector<int64_t> pos(S);
      for (int64_t i = 0; i < S; ++i) pos[i] = i;
      SpRuntime sp(Decoder::sp_plan(), ctx, S);
      const Tensor xl = sp.at("layers.0", "hidden", x);
      Tensor rope = sp.at("layers.0", "rope", reshape(rope_1d(pos, inv_freq), {1, S, a.head_dim}));
      rope = reshape(std::move(rope), {xl.dim(1), a.head_dim / 2, 2});
      const Tensor y = sp.at("norm", "hidden", attn.forward(xl, rope, ctx, sp, true, nullptr));
      EXPECT_LE(max_diff(y, want), 2e-4) << mesh_shape_text(shape) << " rank " << world.rank();
    });
  }
}

}  // namespace
}  // namespace seqpar
