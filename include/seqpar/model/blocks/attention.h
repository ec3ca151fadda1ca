// Attention blocks: self-attention (q/k/v column-parallel by heads, an optional QK-norm, RoPE,
// attention over the sequence-parallel group, o row-parallel) and cross-attention to replicated
// encoder states. A family chooses the variant with an AttentionSpec: biases, the QK-norm (none,
// across all heads as Wan, per head as Qwen3), the RoPE pairing, and the parameter names.
//
// attend() is the one place the model layer calls attention: every block goes through it, over
// this rank's tokens, over the whole sharded sequence, or over a distributed K/V cache.
//
// Shapes are per rank: H_t = this rank's heads, Hkv_t its kv heads, D the head dimension.
// Thread-safety: a block is used by one rank thread; load() reads the store only.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "seqpar/model/blocks/linear.h"
#include "seqpar/model/blocks/norm.h"
#include "seqpar/model/blocks/rope.h"
#include "seqpar/model/sp_plan.h"
#include "seqpar/parallel/decode.h"

namespace seqpar {

// Normalization of q and k after their projections, before RoPE.
enum class QkNorm {
  kNone,
  kAcrossHeads,  // RMSNorm over all heads' features together (Wan): weight (H·D), the
                 // statistics all-reduced over tp
  kPerHead,      // RMSNorm over each head's features (Qwen3): weight (D), shared by the heads
};

// An attention block's shape, optional parts and parameter names. Parameters under its prefix:
//   <proj[0]>.weight (H·D, hidden), <proj[1]>.weight and <proj[2]>.weight (Hkv·D, hidden),
//   <proj[3]>.weight (hidden, H·D); .bias of q, k, v when qkv_bias, of o when o_bias;
//   <norm[0]>.weight, <norm[1]>.weight: (H·D) and (Hkv·D) across heads, (D) and (D) per head.
struct AttentionSpec {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool qkv_bias = false;
  bool o_bias = false;
  QkNorm qk_norm = QkNorm::kNone;
  float qk_norm_eps = 1e-6f;
  RopePairs rope_pairs = RopePairs::kInterleaved;
  std::array<std::string, 4> proj{"q", "k", "v", "o"};
  std::array<std::string, 2> norm{"norm_q", "norm_k"};

  // The parameters under `prefix` ("layers.0.self_attn"), with seeded inits: q and k weights of
  // std qk_std, v and o of 0.02, biases of bias_std, norm scales ones.
  std::vector<WeightStore::Spec> parameters(const std::string& prefix, float qk_std,
                                            float bias_std) const;
};

// q's or k's normalization as AttentionSpec::qk_norm says, on this rank's heads [h0, h1) of
// `heads`.
struct QkNormBlock {
  QkNorm kind = QkNorm::kNone;
  DistRmsNorm across_heads;
  HeadRmsNorm per_head;
  static QkNormBlock load(const WeightStore& ws, const std::string& name, QkNorm kind, int64_t h0,
                          int64_t h1, int64_t heads, int64_t head_dim, float eps);
  Tensor forward(Tensor x, Communicator& tp) const;  // (B, n, (h1-h0)·D) -> the same
};

// What the queries of a block attend.
struct AttendOver {
  enum class Kind {
    kLocal,      // k and v on this rank
    kSequence,   // the whole sequence, sharded over the sp group as sp's partition says
    kCache,      // every rank's K/V cache (k and v: this rank's), new tokens placed by `place`
    kDocuments,  // packed documents of one sequence, sharded over the sp group by `part`
  };
  Kind kind = Kind::kLocal;
  bool causal = false;
  const SpRuntime* sp = nullptr;       // kSequence
  const KvPlacement* place = nullptr;  // kCache
  Strategy pass = Strategy::kPassQ;    // kCache: kPassQ (queries travel) or kPassKv (caches do)
  ScheduleKind schedule = ScheduleKind::kDefault;  // kCache: pass-Q's ring of Q blocks (kRing)
  const Partition* part = nullptr;         // kDocuments: place_call's partition of the documents
  std::span<const int64_t> seq_lens = {};  // kDocuments: the documents' lengths, in order

  static AttendOver local(bool causal) { return {Kind::kLocal, causal}; }
  static AttendOver sequence(const SpRuntime& sp, bool causal) {
    return {Kind::kSequence, causal, &sp};
  }
  static AttendOver cache(const KvPlacement& place, Strategy pass,
                          ScheduleKind schedule = ScheduleKind::kDefault) {
    return {Kind::kCache, true, nullptr, &place, pass, schedule};
  }
  static AttendOver documents(const Partition& part, std::span<const int64_t> seq_lens) {
    return {Kind::kDocuments,       true,  nullptr, nullptr, Strategy::kPassQ,
            ScheduleKind::kDefault, &part, seq_lens};
  }
};

// softmax(q·kᵀ/sqrt(D))·v of q (B, n, H_t, D) against k, v (B, m, Hkv_t, D), as `over` says:
//   kLocal:    on this rank (flash_attention);
//   kSequence: this rank's tokens of sp's partition against the whole sequence over the sp group
//              by ctx's configuration (strategy, schedule, softmax; on this rank when not sharded);
//   kCache:    this rank's new tokens (place.q_pos) against every rank's cache by pass-Q (with
//              `schedule` ring: Q blocks around the ring) or pass-KV;
//   kDocuments: this rank's tokens of part (place_call's partition of the packed sequence: the
//              padding after the last document, if any, at the end of each rank's rows) against
//              their own document only (seq_lens: AttnShape::seq_lens, causal inside it) over
//              the sp group by ctx's configuration, on one rank too;
// both through the one entry point (parallel/cp_attention.h).
// kSequence and kDocuments consume k and v (KvUse::kConsume: where blocks are copied, the rings
// use their storage as a receive buffer, and they hold another rank's block afterwards); kCache
// and kLocal only read them. The state's lse is the kernel's on one rank and empty through the
// entry point, which sends back only the output (AttnShape::lse off).
// The only call of the attention and parallel layers' attention from the model layer.
AttnState attend(const Tensor& q, const Tensor& k, const Tensor& v, ParallelContext& ctx,
                 const AttendOver& over);

// A K/V cache on one rank: this rank's share of the tokens of a sequence (post-RoPE K and V)
// and their global positions. Decode appends tokens to the rank that owns them. The cache keeps
// K and V in `dtype`: fp32 as computed, or rounded to bf16 or fp16 (to nearest even) as they are
// stored; the queries that attend a 16-bit cache are rounded to its dtype too (the attention
// kernel takes one dtype), and the products run in fp32 on those values.
// Its storage is taken once at the first fill for `more` tokens after it (a hint; beyond it the
// storage grows by half again when full), so that a decode step copies only its own rows.
struct KvCache {
  DType dtype = DType::kF32;
  int64_t more = 0;
  Tensor k, v;  // (B, n_cached, Hkv_t, D) in dtype
  std::vector<int64_t> positions;
  // k_new, v_new (B, m, Hkv_t, D) fp32, rounded to dtype as they are appended.
  void append(const Tensor& k_new, const Tensor& v_new, std::span<const int64_t> pos);
};

// Self-attention: q, k, v column-parallel (heads; kv heads replicated when tp exceeds them),
// QK-norm, RoPE, attention over the sequence, o row-parallel.
struct SelfAttention {
  AttentionSpec spec;
  int64_t h0 = 0, h1 = 0, kv0 = 0, kv1 = 0;  // this tp rank's heads and the kv heads they read
  ColumnLinear q, k, v;
  RowLinear o;
  QkNormBlock norm_q, norm_k;

  // The parameters `prefix`.<spec's names>, this rank's share. InvalidArgument when tp does not
  // divide the heads (or, with a QK-norm across heads, the kv heads).
  static SelfAttention load(const WeightStore& ws, const std::string& prefix,
                            const AttentionSpec& spec, const ParallelContext& ctx);
  // x (B, n, hidden) at sp's local positions, rope (n, D/2, 2) -> (B, n, hidden). With a cache,
  // the local K/V (post-RoPE, padding excluded) are stored in it (prefill).
  Tensor forward(const Tensor& x, const Tensor& rope, ParallelContext& ctx, const SpRuntime& sp,
                 bool causal, KvCache* cache) const;
  // x (B, n, hidden) at this rank's positions of over.part, rope (n, D/2, 2) -> (B, n, hidden):
  // packed documents (`over` kDocuments), no cache.
  Tensor forward(const Tensor& x, const Tensor& rope, ParallelContext& ctx,
                 const AttendOver& over) const;
  // Decode or a chunk of a prefill: x (B, T, hidden), the T new tokens (replicated on every rank
  // of the sp group) at positions place.q_pos of their owners. Each owner appends their K/V to
  // its cache; with pass kPassQ the queries travel to every rank's cache (schedule kRing: Q
  // blocks around the ring), with kPassKv the caches travel around the ring to the queries; the
  // owners' outputs are broadcast back to the group. place.kv_pos: every rank's cache positions
  // after the append.
  Tensor decode(const Tensor& x, const Tensor& rope, ParallelContext& ctx, KvCache& cache,
                const KvPlacement& place, Strategy pass = Strategy::kPassQ,
                ScheduleKind schedule = ScheduleKind::kDefault) const;

 private:
  // q, k, v of x (B, n, hidden) as (B, n, local heads, D): projected, QK-normed, RoPE'd.
  struct Qkv {
    Tensor q, k, v;
  };
  Qkv project(const Tensor& x, const Tensor& rope, ParallelContext& ctx) const;
};

// Cross-attention from this rank's tokens to replicated encoder states (text): heads over tp, no
// sequence-parallel communication, no RoPE. Parameters as AttentionSpec's (no GQA). With
// image_kv (Wan 2.1 image-to-video, diffusers' add_k_proj / add_v_proj / norm_added_k) also
// <prefix>.k_img, .v_img (hidden, hidden) with biases and .norm_k_img (hidden, QK-norm across
// heads): the same queries attend the image context too, and the two attention outputs are
// summed before o:  o(attn(q, k(text), v(text)) + attn(q, norm_k_img(k_img(img)), v_img(img))).
struct CrossAttention {
  AttentionSpec spec;
  int64_t h0 = 0, h1 = 0;
  ColumnLinear q, k, v;
  RowLinear o;
  QkNormBlock norm_q, norm_k;
  bool image_kv = false;
  ColumnLinear k_img, v_img;
  QkNormBlock norm_k_img;
  static CrossAttention load(const WeightStore& ws, const std::string& prefix,
                             const AttentionSpec& spec, const ParallelContext& ctx,
                             bool image_kv = false);
  // x (B, n, hidden), context (B, L, hidden), image_context (B, L_img, hidden) (image_kv only;
  // required then) -> (B, n, hidden)
  Tensor forward(const Tensor& x, const Tensor& context, ParallelContext& ctx,
                 const Tensor& image_context = Tensor()) const;
};

}  // namespace seqpar
