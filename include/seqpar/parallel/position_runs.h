// Token positions as arithmetic runs, and the attention work between two sets of them in O(runs)
// instead of O(tokens): what lets a schedule (schedule.h) count the visible score elements of every
// (query rank, key block) pair of a 1024-rank ring over a million tokens.
//
// A rank of Partition(seq, ranks, layout) holds one run (contiguous: stride 1; striped: stride
// ranks) or two (zigzag: chunks r and 2N-1-r). layout_runs() follows Partition's rule exactly
// (the first seq mod n chunks are one token longer); tests check the two agree.
// Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "seqpar/parallel/partition.h"

namespace seqpar {

// Positions start, start + stride, ..., start + (count-1)·stride.
struct PositionRun {
  int64_t start = 0;
  int64_t count = 0;
  int64_t stride = 1;
};
using PositionRuns = std::vector<PositionRun>;

// The positions of `rank` in Partition(seq, ranks, layout) (contiguous, striped or zigzag).
PositionRuns layout_runs(int64_t seq, int ranks, Layout layout, int rank);
// A contiguous run [begin, end).
PositionRuns range_runs(int64_t begin, int64_t end);

int64_t run_count(const PositionRuns& runs);  // number of positions
int64_t run_min(const PositionRuns& runs);    // smallest position (runs non-empty)
int64_t run_max(const PositionRuns& runs);    // largest position (runs non-empty)

// Visible (query, key) pairs: all pairs, or with causal those with k <= q; keys at positions
// >= valid_len are padding and never visible (valid_len 0: no padding). Equals
// visible_score_elements(1, 1, |q|, |k|, mask) for these positions.
// Positions (ascending or not) as runs: consecutive positions with one stride form one run.
PositionRuns runs_of(std::span<const int64_t> positions);

// cu_seqlens (packed documents, partition.h) non-empty: only pairs of one document.
int64_t visible_pairs(const PositionRuns& q, const PositionRuns& k, bool causal,
                      int64_t valid_len = 0, std::span<const int64_t> cu_seqlens = {});

// Packed pieces (varlen): piece i holds the positions [starts[i], starts[i] + lens[i]), and each
// piece is split over `ranks` by `layout` on its own:
//   contiguous: N chunks, rank r holds chunk r;
//   zigzag:     2N chunks, rank r holds chunks r and 2N-1-r;
//   striped:    the piece's j-th token on rank (o + j) mod N.
// A piece of L tokens gives every chunk floor(L/C) tokens (C chunks) and its L mod C extra ones to
// the ranks o, o+1, ... (mod N) in turn, a rank's first chunk first (zigzag: then the ranks o-1,
// o-2, ... their second chunk); o starts at 0 and moves past the ranks served, so the extras of
// short pieces spread over the ranks instead of piling on rank 0. One piece at o = 0 splits as
// layout_runs does. Pieces shorter than the ranks leave some ranks none of them.
// Returns every rank's runs, pieces in the given order.
std::vector<PositionRuns> piece_layout_runs(std::span<const int64_t> starts,
                                            std::span<const int64_t> lens, int ranks,
                                            Layout layout);

}  // namespace seqpar
