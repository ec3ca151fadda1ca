// Pieces shared by the strategy implementations (private to src/parallel/).
#pragma once

#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// Throws InvalidArgument if the local q/k/v do not fit this rank's share of the partition.
void validate_local_shapes(const Communicator& comm, const Partition& part, const TensorView& q,
                           const TensorView& k, const TensorView& v);

// True if the kernel's GQA rule on local heads (local query head i reads local kv head
// i / (|q| / |kv|)) gives every query head of q (global query head h reads kv head h / group)
// its kv head from kv.
bool standard_gqa(IndexRange q, IndexRange kv, int64_t group);

// Kernel parameters for queries at q_pos attending keys at k_pos under opts, with the padding
// mask (keys at positions >= opts.valid_len) for `batch` rows when padding is on, and the
// document ids (q_segment, k_segment: document_of) with opts.cu_seqlens. Holds the mask
// storage, so it is neither copied nor moved; `params` refers into it.
class KernelCall {
 public:
  KernelCall(const CpOptions& opts, std::span<const int64_t> q_pos, std::span<const int64_t> k_pos,
             int64_t batch);
  KernelCall(const KernelCall&) = delete;
  KernelCall& operator=(const KernelCall&) = delete;
  AttnParams params;

 private:
  std::vector<uint8_t> k_valid_;
  std::vector<int32_t> q_segment_, k_segment_;
};

// True if the mask hides every (query, key) pair: every key is padding, causal and every key
// comes after every query, or (documents) the queries' documents and the keys' documents span
// ranges that do not meet.
inline bool fully_hidden(const CpOptions& opts, std::span<const int64_t> q_pos,
                         std::span<const int64_t> k_pos) {
  if (q_pos.empty() || k_pos.empty()) return true;
  const auto [k_min, k_max] = std::minmax_element(k_pos.begin(), k_pos.end());
  const auto [q_min, q_max] = std::minmax_element(q_pos.begin(), q_pos.end());
  if (opts.valid_len > 0 && *k_min >= opts.valid_len) return true;
  if (opts.causal && *k_min > *q_max) return true;
  const auto& cu = opts.cu_seqlens;
  return !cu.empty() && (document_of(cu, *k_max) < document_of(cu, *q_min) ||
                         document_of(cu, *k_min) > document_of(cu, *q_max));
}

// Throws InvalidArgument if the local q/k/v do not fit this rank's share of a cache placement.
void validate_placement(const Communicator& comm, const KvPlacement& place, const Tensor& q,
                        const Tensor& k, const Tensor& v);

// ---- partial states in flight (pass-Q and ring pass-Q's all-to-all; decode.cc) ----
// One query row of a partial state packed as H·D out values then H lse values (fp32):
// kPackedRow(H, D) floats. pack_partial_rows copies `rows` rows of s (rows of (B·T) order, from
// `first`) to dst; merge_packed_partials merges `members` consecutive blocks of `rows` packed
// rows each (one per member, in member order) by LSE into one state of B x T rows.
inline int64_t packed_row_floats(int64_t heads, int64_t head_dim) { return heads * (head_dim + 1); }
void pack_partial_rows(const AttnState& s, int64_t first, int64_t rows, float* dst);
AttnState merge_packed_partials(const float* packed, int members, int64_t batch, int64_t tokens,
                                int64_t heads, int64_t head_dim);

// ---- const-max softmax (src/parallel/const_max.cc; docs/algorithms.md "const-max ring") ----

// Collective over comm: each query row's bound on its scaled logits,
//   bound(b, i, h) = scale·|q(b, i, h)|·K(b, h / (H/Hkv))   (Cauchy–Schwarz),
// with K(b, hk) the largest norm of a key of kv head hk over every member's block, all-reduced
// (max) as B·Hkv fp32 values. Keys at positions >= opts.valid_len (padding) are left out.
// q (B, Sq, H, D), k (B, Sk, Hkv, D) at positions k_pos  ->  (B, Sq, H).
std::vector<float> const_max_row_bounds(Communicator& comm, const TensorView& q, const Tensor& k,
                                        std::span<const int64_t> k_pos, const CpOptions& opts);

// The attention state of one set of query rows (B, Sq, H) over key blocks that arrive one by
// one, with the const-max softmax:
//   start(first)     the first block's state, computed with the online softmax. A row whose
//                    bound M lies within AttnParams::kRowMaxLooseLimit of that state's lse (so
//                    within it of its final lse, which only grows) continues with the fixed
//                    max M: O = out·l, l = exp(lse − M). The others fall back: they keep the
//                    normalized state and merge every later block by LSE (merge_row).
//   prepare(params)  points the kernel's row_max (M for fixed rows, NaN for fallback rows),
//                    row_sum and row_flags at this accumulator's buffers.
//   add(part)        the state the kernel computed with those params: fixed rows add
//                    O += out·l_step, l += l_step (no rescaling; any order of blocks gives the
//                    same sums up to fp32 rounding); fallback rows merge by LSE. A fixed row that
//                    the kernel flags kRowMaxExceeded (its bound was wrong) is normalized and
//                    falls back from then on.
//   finish()         out = O / l, lse = M + ln l for fixed rows; the fallback rows as merged.
// Thread-safety: a value used by one thread.
class ConstMaxAccumulator {
 public:
  explicit ConstMaxAccumulator(std::vector<float> bounds);  // (B, Sq, H) row bounds M
  bool started() const { return started_; }
  void start(AttnState first);
  void prepare(AttnParams& params);
  void add(const AttnState& part);
  AttnState finish();
  // Rows running the online merge (decided at start, or exceeded since).
  int64_t fallback_rows() const;

 private:
  std::vector<float> bound_;       // M per row, natural log
  std::vector<double> bound_eff_;  // the max the kernel applies: fp32(M·log2 e)·ln 2
  std::vector<float> kernel_max_;  // M for fixed rows, NaN for fallback rows
  std::vector<double> l_;          // fixed rows: Σ exp(s − M) so far
  std::vector<float> step_sum_;    // the kernel's row_sum and row_flags of the last block
  std::vector<uint8_t> step_flags_;
  AttnState acc_;  // fixed rows: out holds the unnormalized O; fallback rows: the merged state
  bool started_ = false;
};

// More attention on the block a ring member holds (schedule steal: other members' queries):
// called at every step with the member whose block it is and the block (valid for the call
// only), after the step's own attention and before its transfers are waited for; progress()
// tests those transfers (for AttnParams::progress).
using RingBlockHook = std::function<void(int src, const Tensor& k, const Tensor& v,
                                         const std::function<void()>& progress)>;

// The ring core (ring.cc; the rotation is ring_pass, ring_driver.h): member i of comm holds the
// K/V block of the tokens at block_pos[i] (any order); this member's queries are at q_pos. Adds
// to *stats (does not reset it).
AttnState ring_over_blocks(Communicator& comm, std::span<const std::span<const int64_t>> block_pos,
                           std::span<const int64_t> q_pos, const TensorView& q, const Tensor& k,
                           const Tensor& v, const CpOptions& opts, CpStats* stats,
                           const RingBlockHook& on_block = {});

}  // namespace seqpar
