// Attention over a distributed K/V cache: partial prefill and decode.
//
// Each rank holds a K/V shard (its share of P cached tokens plus the K/V of the new tokens it
// owns) and the queries of the new tokens it owns (T in all; a rank may own none). Two ways to
// bring queries and keys together:
//   passkv: K/V shards travel around the ring (ring_over_blocks), the queries stay;
//   passq:  the queries travel (all-gathered), every rank attends them to its K/V shard, and the
//           partial states go back to the query owners (all-to-all) and merge there by LSE.
// `choose_pass` picks one with the rule of Meta's context-parallel inference paper.
// Thread-safety: one call per rank thread; ranks run the same call concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/parallel/strategies.h"

namespace seqpar {

// cached tokens [0, P) split by `layout` over the ranks (P >= ranks); new tokens [P, P+T) split
// contiguously (floor or ceil of T/N each; with T < N the last T ranks get one each, as decode
// appends the newest token to the last rank).
KvPlacement decode_placement(int64_t cached, int64_t fresh, int ranks, Layout layout);
// The new tokens rank r of `ranks` owns when `fresh` new tokens are split: floor(T/N), one more
// on the last T mod N ranks (so that with T < N the newest tokens sit on the last ranks).
int64_t new_token_share(int64_t fresh, int ranks, int rank);
// A batch of requests packed one after another (varlen): request i is cached_lens[i] cached
// tokens then fresh_lens[i] new ones, a document of its own (AttnShape::cached_lens,
// fresh_lens; CpOptions::cu_seqlens = shape_cu_seqlens). Every request's cache is split over the
// ranks by `layout` on its own (position_runs.h piece_layout_runs: a cache shorter than the ranks
// leaves some ranks none of it), its new tokens as above. InvalidArgument if a rank would hold no
// K/V token.
KvPlacement decode_placement(std::span<const int64_t> cached_lens,
                             std::span<const int64_t> fresh_lens, int ranks, Layout layout);


// Attention of this rank's queries q (B, Tq_r, H, D) over every rank's K/V (B, Kv_r, Hkv, D).
AttnState passq_attention(Communicator& comm, const KvPlacement& place, const Tensor& q,
                          const Tensor& k, const Tensor& v, const CpOptions& opts,
                          CpStats* stats = nullptr);
// passq with schedule ring (docs/algorithms.md "ring pass-Q"): Q blocks pass around the ring,
// overlapped with attention on the local K/V; the partial states return in one all-to-all.
AttnState passq_ring_attention(Communicator& comm, const KvPlacement& place, const Tensor& q,
                               const Tensor& k, const Tensor& v, const CpOptions& opts,
                               CpStats* stats = nullptr);
AttnState passkv_attention(Communicator& comm, const KvPlacement& place, const Tensor& q,
                           const Tensor& k, const Tensor& v, const CpOptions& opts,
                           CpStats* stats = nullptr);

// Meta's rule: pass-KV if T >= N·C·Hkv·e / (2·H·BW) or T/(T+P) >= 2·Hkv/H, else pass-Q.
// C: attention compute rate of a rank (FLOP/s); BW: its network bandwidth (bytes/s).
struct PassChoice {
  Strategy kind;
  double threshold_tokens;  // N·C·Hkv·e / (2·H·BW)
  double miss_rate;         // T / (T + P)
  double miss_threshold;    // 2·Hkv / H
  std::string reason;       // one line
};
PassChoice choose_pass(int64_t new_tokens, int64_t cached_tokens, int ranks, int64_t heads,
                       int64_t kv_heads, size_t elem_bytes, double flops_per_s,
                       double bytes_per_s);
// The rule with another miss-rate threshold (its value and its formula, for the reason): what
// Meta's rule and the planner's All2All-aware variant (plan/cost_model.h) share.
PassChoice pass_choice(int64_t new_tokens, int64_t cached_tokens, int ranks, int64_t heads,
                       int64_t kv_heads, size_t elem_bytes, double flops_per_s, double bytes_per_s,
                       double miss_threshold, std::string_view miss_threshold_formula);

// Bytes this rank sends and receives in one call: the sum over its schedule (passkv_schedule,
// passq_schedule in schedule.h; docs/algorithms.md).
CommPrediction predict_decode_bytes(Strategy kind, const KvPlacement& place, int rank,
                                    int64_t batch, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, size_t elem_bytes);

}  // namespace seqpar
