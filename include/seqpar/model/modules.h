// Transformer modules under tensor parallelism, each holding its shard of the weights.
// Activations are (B, n, F) with n this rank's tokens; heads and FFN columns are split over the
// tensor-parallel group (ParallelContext::tp), the sequence over the sequence-parallel group
// (through the attention strategy). Shapes in comments are per rank (H_t = H / tp).
// Thread-safety: a module is used by one rank thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "seqpar/core/index_range.h"
#include "seqpar/model/context.h"
#include "seqpar/model/sp_plan.h"
#include "seqpar/parallel/decode.h"

namespace seqpar {

// y = x·Wᵀ + b with W (out, in): this rank holds output rows [begin, end) (column-parallel).
struct ColumnLinear {
  Tensor w, b;
  static ColumnLinear load(const WeightStore& ws, const std::string& name, int64_t begin,
                           int64_t end, bool bias);
  Tensor forward(const Tensor& x) const;  // (.., in) -> (.., end-begin)
};

// y = all_reduce_tp(x_t·W_tᵀ) + b with W (out, in): this rank holds input columns [begin, end)
// (row-parallel); the bias is added once, after the reduction.
struct RowLinear {
  Tensor w, b;
  static RowLinear load(const WeightStore& ws, const std::string& name, int64_t begin, int64_t end,
                        bool bias);
  Tensor forward(const Tensor& x, Communicator& tp) const;  // (.., end-begin) -> (.., out)
};

// RMSNorm over a feature dimension of width full_width that is split over the tp group: the
// sums of squares are all-reduced over tp only (QK-norm over sharded heads). weight: this
// rank's slice.
struct DistRmsNorm {
  Tensor weight;
  int64_t full_width = 0;
  float eps = 1e-6f;
  static DistRmsNorm load(const WeightStore& ws, const std::string& name, int64_t begin,
                          int64_t end, int64_t full_width, float eps);
  Tensor forward(const Tensor& x, Communicator& tp) const;
};

// Rotary embedding tables: (n, D/2, 2) cos and sin per token and pair of features, from global
// token positions, so that every layout and shard gets its own tokens' rotations.
// 1-D (LLM): pair j rotates by pos·theta^(-2j/D).
Tensor rope_1d(std::span<const int64_t> positions, int64_t head_dim, double theta);
// 3-D (video frames x height x width): position p is (f, y, x) on grid (F, Hp, Wp) in row-major
// order; the D/2 pairs split into frames: D/2 - 2·(D/2/3), height: D/2/3, width: D/2/3, each part
// rotating by its axis coordinate with its own frequencies.
Tensor rope_3d(std::span<const int64_t> positions, std::array<int64_t, 3> grid, int64_t head_dim,
               double theta);
// 1-D from given inverse frequencies (D/2 of them, e.g. llama_rope_inv_freq): pair j rotates by
// pos·inv_freq[j], the angle and its cos/sin computed in fp32 as transformers does.
Tensor rope_1d(std::span<const int64_t> positions, std::span<const float> inv_freq);
// x (B, n, H, D) rotated in place by table (n, D/2, 2) (the same for every batch row and head).
// Which features form pair j: Meta's original layout (and Wan's) rotates interleaved pairs
// (2j, 2j+1); Hugging Face's Llama layout rotates halves (j, j + D/2) ("rotate_half").
enum class RopePairs { kInterleaved, kHalves };
void apply_rope_(Tensor& x, const Tensor& table, RopePairs pairs = RopePairs::kInterleaved);

// A K/V cache on one rank: this rank's share of the tokens of a sequence (post-RoPE K and V)
// and their global positions. Decode appends tokens to the rank that owns them.
struct KvCache {
  Tensor k, v;  // (B, n_cached, Hkv_t, D)
  std::vector<int64_t> positions;
  void append(const Tensor& k_new, const Tensor& v_new, std::span<const int64_t> pos);
};

// Self-attention: q, k, v column-parallel (heads), optional QK-norm (distributed RMSNorm over the
// full width), RoPE, context-parallel attention through ctx's strategy, o row-parallel.
// Weights: <name>.{q,k,v,o}.weight (+ .bias), <name>.norm_q.weight, <name>.norm_k.weight.
struct SelfAttention {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // full counts
  int64_t h0 = 0, h1 = 0, kv0 = 0, kv1 = 0;       // this tp rank's heads
  ColumnLinear q, k, v;
  RowLinear o;
  bool qk_norm = false;
  DistRmsNorm norm_q, norm_k;
  RopePairs rope_pairs = RopePairs::kInterleaved;

  // names: q/k/v/o suffixes (Wan "q", Llama "q_proj"). head_dim 0: hidden / heads.
  static SelfAttention load(const WeightStore& ws, const std::string& name, int64_t hidden,
                            int64_t heads, int64_t kv_heads, const ParallelContext& ctx, bool bias,
                            bool qk_norm, const std::array<std::string, 4>& proj,
                            int64_t head_dim = 0);
  // x (B, n, hidden) at sp's local positions -> (B, n, hidden). With a cache, the local K/V
  // (post-RoPE) are stored in it (prefill).
  Tensor forward(const Tensor& x, const Tensor& rope, ParallelContext& ctx, const SpRuntime& sp,
                 bool causal, KvCache* cache) const;
  // Decode or a chunk of a prefill: x (B, T, hidden), the T new tokens (replicated on every rank
  // of the sp group) at positions place.q_pos of their owners. Each owner appends their K/V to
  // its cache; with pass (kPassQ) the queries travel to every rank's cache, with kPassKv the
  // caches travel around the ring to the queries; the owners' outputs are broadcast back to the
  // group. place.kv_pos: every rank's cache positions after the append.
  Tensor decode(const Tensor& x, const Tensor& rope, ParallelContext& ctx, KvCache& cache,
                const KvPlacement& place, Strategy pass = Strategy::kPassQ) const;

 private:
  // q, k, v of x (B, n, hidden) as (B, n, local heads, head_dim): projected, QK-normed, RoPE'd.
  struct Qkv {
    Tensor q, k, v;
  };
  Qkv project(const Tensor& x, const Tensor& rope, ParallelContext& ctx) const;
};

// Cross-attention from this rank's tokens to replicated encoder states (text): no
// sequence-parallel communication. Weights like SelfAttention (Wan: with QK-norm).
struct CrossAttention {
  int64_t heads = 0, head_dim = 0, h0 = 0, h1 = 0;
  ColumnLinear q, k, v;
  RowLinear o;
  DistRmsNorm norm_q, norm_k;
  static CrossAttention load(const WeightStore& ws, const std::string& name, int64_t hidden,
                             int64_t heads, const ParallelContext& ctx);
  Tensor forward(const Tensor& x, const Tensor& context, ParallelContext& ctx) const;
};

// Feed-forward: GELU-tanh (Wan: <name>.0, <name>.2 with biases) or SwiGLU (Llama:
// <name>.gate_proj, up_proj, down_proj, with biases when swiglu_bias: mlp_bias); the inner
// width split over tp.
struct FeedForward {
  enum class Kind { kGeluTanh, kSwiGlu } kind = Kind::kGeluTanh;
  ColumnLinear up, gate;
  RowLinear down;
  static FeedForward load(const WeightStore& ws, const std::string& name, int64_t inner,
                          Kind kind, const ParallelContext& ctx, bool swiglu_bias = false);
  Tensor forward(const Tensor& x, Communicator& tp) const;
};

// The contiguous share of `count` items of tp rank r of n (count divisible by n).
IndexRange tp_share(int64_t count, int rank, int n);

}  // namespace seqpar
