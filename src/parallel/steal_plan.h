// The plan of ring with schedule steal (private to src/parallel/; docs/algorithms.md "steal"):
// which query rows each rank computes, as a pure function of the partition, the same on every
// rank.
//
// Rank r holds the contiguous rows [first[r], first[r] + count[r]). A row at position p costs
// the keys it sees: causal min(p + 1, V), else V (V = valid_len, or the sequence when 0). With T
// the total cost and t = T/N the mean:
//   keep:   every rank keeps the prefix of its rows while what it kept is below t (so a rank
//           keeps at least its first row, and less than t plus one row);
//   gifts:  the rows it does not keep (a suffix, the most expensive ones), in rank order, go to
//           the ranks that kept all of theirs, in rank order: a helper takes rows while its
//           cost is below t, then the next helper takes over.
// The gifts never outnumber the helpers' room (what the donors keep is at least t each), so
// every rank ends below t + c_max (c_max: the dearest row, at most S keys): work imbalance
// below 1 + c_max/t, causal about 1 + 2N/S.
// Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "schedule_build.h"
#include "seqpar/parallel/partition.h"

namespace seqpar {

// Rows [begin, end) of `owner` (indices into its rows), computed by `helper`.
struct StealPiece {
  int owner = 0;
  int64_t begin = 0, end = 0;
  int helper = 0;
  int64_t rows() const { return end - begin; }
};

struct StealPlan {
  std::vector<int64_t> keep;       // per rank: its first keep[r] rows are its own to compute
  std::vector<StealPiece> pieces;  // by owner, then row; piece i uses tags from i
  std::vector<int64_t> cost;       // per rank: the keys its computed rows see (one batch, head)
};

// first[r], count[r]: rank r's rows; keys = V above.
StealPlan steal_plan(std::span<const int64_t> first, std::span<const int64_t> count, bool causal,
                     int64_t keys);
// The plan of a partition whose ranks hold contiguous runs (InvalidArgument otherwise).
StealPlan steal_plan(const Partition& part, bool causal, int64_t valid_len);

// The schedule of ring with schedule steal over any contiguous runs (c.q == c.kv, one run per
// rank): the ring of add_ring over the kept rows, the stolen rows' attention added to the ring
// steps of their helpers, and the exchanges of the stolen queries (before the ring) and of
// their states (after it) when the plan has pieces; else ring_schedule's steps.
Schedule steal_schedule_of(const CallRuns& c);

}  // namespace seqpar
