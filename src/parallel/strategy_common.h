// Pieces shared by the strategy implementations (private to src/parallel/).
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "seqpar/parallel/strategies.h"

namespace seqpar {

// Throws InvalidArgument if the local q/k/v do not fit this rank's share of the partition.
void validate_local_shapes(const Communicator& comm, const Partition& part, const Tensor& q,
                           const Tensor& k, const Tensor& v);

// "1, 2, 4, 8": the divisors of x, for error messages listing valid degrees.
std::string divisors_text(int64_t x);

// True if the kernel's GQA rule on local heads (local query head i reads local kv head
// i / (|q| / |kv|)) gives every query head of q (global query head h reads kv head h / group)
// its kv head from kv.
bool standard_gqa(HeadRange q, HeadRange kv, int64_t group);
// The kv heads a Ulysses member's kernel reads: its kv heads when standard_gqa holds, else one
// per query head (expanded locally; the ring of usp then carries the expanded heads).
int64_t ulysses_kernel_kv_heads(int64_t heads, int64_t kv_heads, int n, int j);

// Kernel parameters for queries at q_pos attending keys at k_pos under opts, with the padding
// mask (keys at positions >= opts.valid_len) for `batch` rows when padding is on. Holds the mask
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
};

// True if the mask hides every (query, key) pair: every key is padding, or causal and every key
// comes after every query.
inline bool fully_hidden(const CpOptions& opts, std::span<const int64_t> q_pos,
                         std::span<const int64_t> k_pos) {
  if (q_pos.empty() || k_pos.empty()) return true;
  const int64_t k_min = *std::min_element(k_pos.begin(), k_pos.end());
  if (opts.valid_len > 0 && k_min >= opts.valid_len) return true;
  return opts.causal && k_min > *std::max_element(q_pos.begin(), q_pos.end());
}

// The ring core: member i of comm holds the K/V block of the tokens at block_pos[i] (any
// order); this member's queries are at q_pos. Adds to *stats (does not reset it).
AttnState ring_over_blocks(Communicator& comm, std::span<const std::span<const int64_t>> block_pos,
                           std::span<const int64_t> q_pos, const Tensor& q, const Tensor& k,
                           const Tensor& v, const CpOptions& opts, CpStats* stats);

}  // namespace seqpar
