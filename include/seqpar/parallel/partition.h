// Partition of a sequence over the ranks of a sequence-parallel group: which global token
// positions each rank holds. Every layout keeps each rank's positions ascending.
//   contiguous: rank r holds one run; the first S mod N ranks hold ceil(S/N), the rest floor.
//   striped:    token i on rank i mod N.
//   zigzag:     2N chunks (lengths differ by at most one); rank r holds chunks r and 2N-1-r,
//               which balances causal work.
// Packed sequences (varlen): documents of seq_lens tokens one after another. cu_seqlens and
// document_of are the one place positions map to documents; Partition::documents splits every
// document on its own (zigzag per document, as ring-flash-attention's varlen zigzag does).
// Thread-safety: immutable value once built.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/tensor.h"

namespace seqpar {

enum class Layout { kContiguous, kStriped, kZigzag, kCustom };  // kCustom: from_counts/positions
std::string_view layout_name(Layout layout);
Layout parse_layout(std::string_view name);  // throws InvalidArgument listing valid names

// Packed documents: cu_seqlens(seq_lens) = {0, l0, l0+l1, ..., sum} (flash-attn's cu_seqlens;
// lengths >= 1, else InvalidArgument naming seq_lens). document_of(cu, p): the document holding
// position p, the i with cu[i] <= p < cu[i+1]; positions >= cu.back() (padding after the last
// document) are document cu.size() - 1, one past the last. cu empty: one document, 0.
std::vector<int64_t> cu_seqlens(std::span<const int64_t> seq_lens);
int32_t document_of(std::span<const int64_t> cu_seqlens, int64_t pos);
// Segment ids (MaskSpec::q_segment / k_segment) of positions: document_of each.
std::vector<int32_t> document_ids(std::span<const int64_t> cu_seqlens,
                                  std::span<const int64_t> positions);

class Partition {
 public:
  Partition() = default;
  // Throws InvalidArgument if seq < 1, ranks < 1, or ranks > seq.
  Partition(int64_t seq, int ranks, Layout layout);
  // Contiguous runs (layout kCustom) of the given lengths (rank r holds the next counts[r] tokens); each >= 1.
  static Partition from_counts(std::span<const int64_t> counts);
  // Explicit positions per rank: each ascending, together every token of [0, S) exactly once.
  static Partition from_positions(std::vector<std::vector<int64_t>> positions);
  // Packed documents of seq_lens tokens followed by seq - sum(seq_lens) padding tokens, each
  // document (and the padding) split by `layout` on its own (position_runs.h piece_layout_runs):
  // zigzag per document (layout() reports zigzag), contiguous or striped per document. Contiguous
  // over the whole packed sequence is Partition(seq, ranks, kContiguous). InvalidArgument if a
  // rank would hold no token.
  static Partition documents(std::span<const int64_t> seq_lens, int64_t seq, int ranks,
                             Layout layout);

  int64_t seq() const { return seq_; }
  int ranks() const { return static_cast<int>(positions_.size()); }
  Layout layout() const { return layout_; }
  int64_t count(int rank) const { return static_cast<int64_t>(positions_[rank].size()); }
  int64_t max_count() const;
  std::span<const int64_t> positions(int rank) const { return positions_[rank]; }
  // All positions in rank order (rank 0's, then rank 1's, ...): the key order after a gather.
  std::vector<int64_t> concatenated_positions() const;

 private:
  int64_t seq_ = 0;
  Layout layout_ = Layout::kContiguous;
  std::vector<std::vector<int64_t>> positions_;
};

// Where the tokens of a partial prefill / decode live: per rank, ascending global positions of
// its K/V (cache and own new tokens) and of its queries (own new tokens, possibly none).
// decode_placement (decode.h) makes one.
struct KvPlacement {
  std::vector<std::vector<int64_t>> kv_pos;
  std::vector<std::vector<int64_t>> q_pos;
  int ranks() const { return static_cast<int>(kv_pos.size()); }
};

// Where one attention call's tokens live on the sequence-parallel ranks: over a sequence, the
// Partition of its (padded) tokens, a rank's queries and keys alike; over a K/V cache, each
// rank's K/V and query positions.
struct Placement {
  bool over_cache = false;
  Partition part;     // over a sequence
  KvPlacement cache;  // over a cache
  int ranks() const { return over_cache ? cache.ranks() : part.ranks(); }
  // Global positions of rank r's queries and of its keys and values (ascending).
  std::span<const int64_t> q_pos(int r) const {
    return over_cache ? std::span<const int64_t>(cache.q_pos[r]) : part.positions(r);
  }
  std::span<const int64_t> kv_pos(int r) const {
    return over_cache ? std::span<const int64_t>(cache.kv_pos[r]) : part.positions(r);
  }
};

// full (B, S, H, D) -> this rank's rows (B, count(rank), H, D), in its position order.
Tensor shard(const Tensor& full, const Partition& part, int rank);
// Inverse of shard: shards[r] (B, count(r), H, D) -> (B, S, H, D).
Tensor unshard(std::span<const Tensor> shards, const Partition& part);

}  // namespace seqpar
