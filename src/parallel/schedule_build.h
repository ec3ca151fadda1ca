// Building schedules (private to src/parallel/): a call's sizes and every rank's token positions
// as runs, and the steps the strategies share.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/position_runs.h"
#include "seqpar/parallel/schedule.h"

namespace seqpar {

// One call as the schedules see it: sizes, masks, and per sp rank its queries and its K/V.
struct CallRuns {
  int64_t B = 1, H = 1, Hkv = 1, D = 1;
  size_t e = 4;  // element bytes of q, k, v
  size_t out_e = 4;  // element bytes of the output the caller keeps (AttnShape::out_dtype)
  bool lse = true;   // the caller keeps the lse (AttnShape::lse)
  KvUse kv_use = KvUse::kKeep;  // what the rings do with the own k and v (AttnShape::kv_use)
  bool causal = false;
  int64_t valid_len = 0;  // keys at positions >= valid_len are padding (0: none)
  int64_t text_tokens = 0;
  bool text_by_heads = false;  // the text split by head over Ulysses groups of ulysses ranks
  int ulysses = 1;
  int64_t seq = 0;  // sharded tokens (padding included; over a cache: K/V tokens)
  std::vector<int64_t> cu;  // packed documents (CpOptions::cu_seqlens); empty: one
  std::vector<PositionRuns> q, kv;
  int n() const { return static_cast<int>(q.size()); }
  int64_t visible(const PositionRuns& qr, const PositionRuns& kr) const {
    return visible_pairs(qr, kr, causal, valid_len, cu);
  }
  // fully_hidden (strategy_common.h) on runs: no queries or keys, all padding, causal with
  // every key after every query, or documents that do not meet.
  bool hidden(const PositionRuns& qr, const PositionRuns& kr) const;
  // Bytes of a merge of `rows` query rows of `heads` heads into an accumulator: read both
  // states, write one (fp32 out and lse).
  double merge_bytes(int64_t rows, int64_t heads) const {
    return 3.0 * static_cast<double>(B) * rows * heads * (D + 1) * 4;
  }
  // Bytes of a state folded into by the kernel (AttnParams::accumulate): read once into its
  // accumulators (the write is the kernel's own, as for any call).
  double fold_bytes(int64_t rows, int64_t heads) const {
    return static_cast<double>(B) * rows * heads * (D + 1) * 4;
  }
};

// Over a sharded sequence: sharded_seq(c, s) tokens in c's layout over c.sp() ranks.
CallRuns sequence_runs(const ParallelConfig& c, const AttnShape& s);
// Over a K/V cache: decode_placement's positions (cache in c's layout, new tokens appended).
CallRuns cache_runs(const ParallelConfig& c, const AttnShape& s);
// decode_placement's per-request rule as runs (decode.cc): per rank, its new tokens (queries) and
// its K/V (every request's cache share, then its new tokens, request by request).
struct RequestRuns {
  std::vector<PositionRuns> q, kv;
};
RequestRuns request_runs(std::span<const int64_t> cached_lens, std::span<const int64_t> fresh_lens,
                         int ranks, Layout layout);
// From explicit positions (any Partition; KvPlacement).
CallRuns partition_runs(const Partition& part, int64_t batch, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, size_t elem_bytes);
CallRuns placement_runs(const KvPlacement& place, int64_t batch, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, size_t elem_bytes);

GroupMembers consecutive_members(int first, int n);  // first, first+1, ..., first+n-1
Schedule empty_schedule(const CallRuns& c);          // tokens set, no steps

// A step with a collective of uniform shares (all_gather(v), all_reduce) of this rank.
Step collective_step(OpKind op, bool varying, std::string what, CommGroup group,
                     GroupMembers members, uint64_t sent, uint64_t recv);
Step compute_step(int64_t work, double copy_bytes = 0);

// The steps of the strategies, appended to s (each defined next to its strategy):
// allgather.cc: all_gatherv of K and V over the whole group, attention over the whole sequence.
void add_allgather(Schedule& s, const CallRuns& c);
// ring.cc: the ring over `members` (sp ranks, ring order), member i holding the K/V block
// blocks[i] of kv_heads heads per token and the queries queries[i] of `heads` heads; sets each
// member's peak K/V. const-max adds the key norms' all-reduce first (const_max.cc); c.kv_use as
// CpOptions::kv_use (kLend: one more transfer, the own block home; kLend, kConsume: one buffer
// less).
void add_ring(Schedule& s, const CallRuns& c, GroupMembers members,
              std::span<const PositionRuns> blocks, std::span<const PositionRuns> queries,
              int64_t heads, int64_t kv_heads, CommGroup group, SoftmaxMode softmax);
// const_max.cc: the all-reduce (max) of B·kv_heads fp32 key norms over `members`.
Step key_norms_step(const CallRuns& c, GroupMembers members, int64_t kv_heads, CommGroup group);
// ulysses.cc: Ulysses inside groups of u consecutive ranks, then (groups > 1) a ring across
// groups: ulysses (u = n) and usp.
void add_ulysses(Schedule& s, const CallRuns& c, int u, SoftmaxMode softmax);
// decode.cc: pass-Q over a cache.
void add_passq(Schedule& s, const CallRuns& c);
// joint.cc: joint attention's text part.
void add_joint_text(Schedule& s, const CallRuns& c);

}  // namespace seqpar
