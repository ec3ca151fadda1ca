#include "seqpar/parallel/partition.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "seqpar/core/param_error.h"
#include "seqpar/parallel/position_runs.h"

namespace seqpar {

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kStriped: return "striped";
    case Layout::kZigzag: return "zigzag";
    case Layout::kCustom: return "custom";
  }
  return "?";
}

namespace {
// Start of chunk c when [0, seq) is cut into n chunks whose lengths differ by at most one
// (the first seq mod n chunks are one longer).
int64_t chunk_start(int64_t seq, int64_t n, int64_t c) {
  int64_t base = seq / n, extra = seq % n;
  return c * base + std::min(c, extra);
}
void append_range(std::vector<int64_t>& v, int64_t begin, int64_t end) {
  for (int64_t p = begin; p < end; ++p) v.push_back(p);
}
}  // namespace

Partition::Partition(int64_t seq, int ranks, Layout layout) : seq_(seq), layout_(layout) {
  SEQPAR_PARAM_CHECK(seq >= 1, "seq", "at least 1", param("seq"), " ", seq,
                     " is invalid; it must be at least 1");
  SEQPAR_PARAM_CHECK(ranks >= 1, "ranks", "at least 1", param("ranks"), " ", ranks,
                     " is invalid; it must be at least 1");
  SEQPAR_PARAM_CHECK(ranks <= seq, "ranks", detail::concat("at most ", seq), param("ranks"), " ",
                     ranks, " exceeds ", param("seq"), " ", seq,
                     "; every rank needs a token: use at most ", seq, " ranks");
  positions_.resize(ranks);
  for (int r = 0; r < ranks; ++r) {
    auto& pos = positions_[r];
    switch (layout) {
      case Layout::kContiguous:
        append_range(pos, chunk_start(seq, ranks, r), chunk_start(seq, ranks, r + 1));
        break;
      case Layout::kStriped:
        for (int64_t p = r; p < seq; p += ranks) pos.push_back(p);
        break;
      case Layout::kZigzag: {
        const int64_t n2 = 2 * static_cast<int64_t>(ranks);
        const int64_t lo = r, hi = n2 - 1 - r;
        append_range(pos, chunk_start(seq, n2, lo), chunk_start(seq, n2, lo + 1));
        append_range(pos, chunk_start(seq, n2, hi), chunk_start(seq, n2, hi + 1));
        break;
      }
      case Layout::kCustom:
        throw InvalidArgument("a custom layout is built with Partition::from_counts or from_positions");
    }
  }
}

Partition Partition::from_counts(std::span<const int64_t> counts) {
  std::vector<std::vector<int64_t>> pos(counts.size());
  int64_t next = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    SEQPAR_ARG_CHECK(counts[r] >= 1, "rank ", r, " would hold ", counts[r],
                     " tokens; every rank needs at least 1");
    append_range(pos[r], next, next + counts[r]);
    next += counts[r];
  }
  return from_positions(std::move(pos));
}

Partition Partition::from_positions(std::vector<std::vector<int64_t>> positions) {
  SEQPAR_ARG_CHECK(!positions.empty(), "a partition needs at least one rank");
  int64_t seq = 0;
  for (const auto& p : positions) seq += static_cast<int64_t>(p.size());
  std::vector<uint8_t> seen(seq, 0);
  for (size_t r = 0; r < positions.size(); ++r) {
    SEQPAR_ARG_CHECK(!positions[r].empty(), "rank ", r, " holds no token");
    for (size_t i = 0; i < positions[r].size(); ++i) {
      const int64_t p = positions[r][i];
      SEQPAR_ARG_CHECK(p >= 0 && p < seq && !seen[p], "position ", p, " of rank ", r,
                       " is outside [0, ", seq, ") or held twice");
      SEQPAR_ARG_CHECK(i == 0 || positions[r][i - 1] < p, "positions of rank ", r,
                       " must ascend");
      seen[p] = 1;
    }
  }
  Partition part;
  part.seq_ = seq;
  part.layout_ = Layout::kCustom;
  part.positions_ = std::move(positions);
  return part;
}

Partition Partition::documents(std::span<const int64_t> seq_lens, int64_t seq, int ranks,
                               Layout layout) {
  const std::vector<int64_t> cu = cu_seqlens(seq_lens);
  SEQPAR_PARAM_CHECK(ranks >= 1, "ranks", "at least 1", param("ranks"), " ", ranks,
                     " is invalid; it must be at least 1");
  SEQPAR_PARAM_CHECK(seq >= cu.back(), "seq", detail::concat("at least ", cu.back()), param("seq"),
                     " ", seq, " is shorter than the ", cu.back(), " tokens of ",
                     param("seq_lens"));
  std::vector<int64_t> starts(cu.begin(), cu.end() - 1), lens(seq_lens.begin(), seq_lens.end());
  if (seq > cu.back()) {  // padding: one more piece after the last document
    starts.push_back(cu.back());
    lens.push_back(seq - cu.back());
  }
  const std::vector<PositionRuns> runs = piece_layout_runs(starts, lens, ranks, layout);
  std::vector<std::vector<int64_t>> pos(ranks);
  for (int r = 0; r < ranks; ++r) {
    for (const PositionRun& run : runs[r])
      for (int64_t i = 0; i < run.count; ++i) pos[r].push_back(run.start + i * run.stride);
    std::sort(pos[r].begin(), pos[r].end());
    SEQPAR_PARAM_CHECK(!pos[r].empty(), "ranks", "fewer ranks or longer documents", "rank ", r,
                       " of ", ranks, " would hold no token of the ", seq_lens.size(),
                       " documents in ", param("seq_lens"), " split by ", param("layout"), " ",
                       layout_name(layout), " per document; use fewer ranks or longer documents");
  }
  Partition part = from_positions(std::move(pos));
  part.layout_ = layout;
  return part;
}

std::vector<int64_t> cu_seqlens(std::span<const int64_t> seq_lens) {
  std::vector<int64_t> cu(1, 0);
  cu.reserve(seq_lens.size() + 1);
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    SEQPAR_PARAM_CHECK(seq_lens[i] >= 1, "seq_lens", "lengths of at least 1", param("seq_lens"),
                       "[", i, "] = ", seq_lens[i],
                       " is invalid; every document length must be at least 1");
    SEQPAR_PARAM_CHECK(cu.back() <= INT64_MAX - seq_lens[i], "seq_lens", "a sum within int64",
                       param("seq_lens"), " sum overflows");
    cu.push_back(cu.back() + seq_lens[i]);
  }
  return cu;
}

int32_t document_of(std::span<const int64_t> cu, int64_t pos) {
  if (cu.size() < 2) return 0;
  return static_cast<int32_t>(std::upper_bound(cu.begin() + 1, cu.end() - 1, pos) - cu.begin() -
                              (pos < cu.back() ? 1 : 0));
}

std::vector<int32_t> document_ids(std::span<const int64_t> cu, std::span<const int64_t> positions) {
  std::vector<int32_t> ids(positions.size());
  for (size_t i = 0; i < positions.size(); ++i) ids[i] = document_of(cu, positions[i]);
  return ids;
}

int64_t Partition::max_count() const {
  int64_t m = 0;
  for (const auto& p : positions_) m = std::max<int64_t>(m, p.size());
  return m;
}

std::vector<int64_t> Partition::concatenated_positions() const {
  std::vector<int64_t> all;
  all.reserve(seq_);
  for (const auto& p : positions_) all.insert(all.end(), p.begin(), p.end());
  return all;
}

Tensor shard(const Tensor& full, const Partition& part, int rank) {
  SEQPAR_CHECK(full.ndim() == 4 && full.dim(1) == part.seq(), "shard: tensor ", full.shape_str(),
               " does not hold ", part.seq(), " tokens");
  const int64_t B = full.dim(0), S = full.dim(1);
  const size_t row = static_cast<size_t>(full.dim(2) * full.dim(3)) * dtype_size(full.dtype());
  auto pos = part.positions(rank);
  Tensor out({B, static_cast<int64_t>(pos.size()), full.dim(2), full.dim(3)}, full.dtype());
  auto* dst = static_cast<char*>(out.raw());
  const auto* src = static_cast<const char*>(full.raw());
  for (int64_t b = 0; b < B; ++b)
    for (size_t i = 0; i < pos.size(); ++i)
      std::memcpy(dst + (b * pos.size() + i) * row, src + (b * S + pos[i]) * row, row);
  return out;
}

Tensor unshard(std::span<const Tensor> shards, const Partition& part) {
  SEQPAR_CHECK(static_cast<int>(shards.size()) == part.ranks(), "unshard: need one shard per rank");
  const Tensor& s0 = shards[0];
  const int64_t B = s0.dim(0), S = part.seq();
  const size_t row = static_cast<size_t>(s0.dim(2) * s0.dim(3)) * dtype_size(s0.dtype());
  Tensor full({B, S, s0.dim(2), s0.dim(3)}, s0.dtype());
  for (int r = 0; r < part.ranks(); ++r) {
    auto pos = part.positions(r);
    SEQPAR_CHECK(shards[r].dim(1) == static_cast<int64_t>(pos.size()), "unshard: shard ", r,
                 " has ", shards[r].dim(1), " tokens, partition says ", pos.size());
    const auto* src = static_cast<const char*>(shards[r].raw());
    auto* dst = static_cast<char*>(full.raw());
    for (int64_t b = 0; b < B; ++b)
      for (size_t i = 0; i < pos.size(); ++i)
        std::memcpy(dst + (b * S + pos[i]) * row, src + (b * pos.size() + i) * row, row);
  }
  return full;
}

}  // namespace seqpar
