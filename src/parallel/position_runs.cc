#include "seqpar/parallel/position_runs.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "seqpar/core/error.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/partition.h"

namespace seqpar {

namespace {

// Partition's rule: [0, seq) cut into n chunks, the first seq mod n one longer.
int64_t chunk_start(int64_t seq, int64_t n, int64_t c) {
  const int64_t base = seq / n, extra = seq % n;
  return c * base + std::min(c, extra);
}

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// sum_{x=0}^{X} clamp(x, 0, l) for X >= -1 (0 for X < 0).
int64_t clamp_prefix(int64_t X, int64_t l) {
  if (X < 0) return 0;
  if (X <= l) return X * (X + 1) / 2;
  return l * (l + 1) / 2 + (X - l) * l;
}

// Keys of run k clipped below `limit` (positions < limit only).
PositionRun clip_below(PositionRun k, int64_t limit) {
  if (k.count == 0 || k.start >= limit) return {k.start, 0, k.stride};
  const int64_t fit = (limit - 1 - k.start) / k.stride + 1;
  k.count = std::min(k.count, fit);
  return k;
}

// #{ j < k.count : k.start + j·k.stride <= q }
int64_t keys_at_or_below(const PositionRun& k, int64_t q) {
  if (k.count == 0 || q < k.start) return 0;
  return std::min(k.count, (q - k.start) / k.stride + 1);
}

int64_t causal_pairs(const PositionRun& q, const PositionRun& k) {
  if (q.count == 0 || k.count == 0) return 0;
  if (q.stride == k.stride) {
    // q_i = a + i·s: keys at or below = clamp(floor((a - b)/s) + 1 + i, 0, l).
    const int64_t c0 = floor_div(q.start - k.start, k.stride) + 1;
    const int64_t c1 = c0 + q.count - 1;
    return clamp_prefix(c1, k.count) - clamp_prefix(c0 - 1, k.count);
  }
  int64_t pairs = 0;  // different strides: one query at a time
  for (int64_t i = 0; i < q.count; ++i) pairs += keys_at_or_below(k, q.start + i * q.stride);
  return pairs;
}

}  // namespace

PositionRuns layout_runs(int64_t seq, int ranks, Layout layout, int rank) {
  SEQPAR_PARAM_CHECK(seq >= 1 && ranks >= 1 && ranks <= seq && rank >= 0 && rank < ranks,
                     seq >= 1 && ranks <= seq ? "ranks" : "seq", "", "layout_runs: ", param("seq"),
                     " ", seq, ", ", param("ranks"), " ", ranks, ", rank ", rank);
  switch (layout) {
    case Layout::kContiguous: {
      const int64_t b = chunk_start(seq, ranks, rank), e = chunk_start(seq, ranks, rank + 1);
      return {{b, e - b, 1}};
    }
    case Layout::kStriped:
      return {{rank, (seq - rank + ranks - 1) / ranks, ranks}};
    case Layout::kZigzag: {
      const int64_t n2 = 2 * static_cast<int64_t>(ranks), lo = rank, hi = n2 - 1 - rank;
      const int64_t b0 = chunk_start(seq, n2, lo), e0 = chunk_start(seq, n2, lo + 1);
      const int64_t b1 = chunk_start(seq, n2, hi), e1 = chunk_start(seq, n2, hi + 1);
      PositionRuns runs;
      if (e0 > b0) runs.push_back({b0, e0 - b0, 1});
      if (e1 > b1) runs.push_back({b1, e1 - b1, 1});
      return runs;
    }
    case Layout::kCustom:
      break;
  }
  throw InvalidArgument("layout_runs: a custom layout has no runs");
}

PositionRuns range_runs(int64_t begin, int64_t end) {
  if (end <= begin) return {};
  return {{begin, end - begin, 1}};
}

int64_t run_count(const PositionRuns& runs) {
  int64_t n = 0;
  for (const auto& r : runs) n += r.count;
  return n;
}

int64_t run_min(const PositionRuns& runs) {
  int64_t m = INT64_MAX;
  for (const auto& r : runs)
    if (r.count > 0) m = std::min(m, r.start);
  return m;
}

int64_t run_max(const PositionRuns& runs) {
  int64_t m = INT64_MIN;
  for (const auto& r : runs)
    if (r.count > 0) m = std::max(m, r.start + (r.count - 1) * r.stride);
  return m;
}

PositionRuns runs_of(std::span<const int64_t> positions) {
  PositionRuns runs;
  for (int64_t p : positions) {
    if (!runs.empty()) {
      PositionRun& last = runs.back();
      const int64_t next = last.start + last.count * last.stride;
      if (last.count == 1 && p > last.start) {
        last.stride = p - last.start;
        last.count = 2;
        continue;
      }
      if (p == next) {
        ++last.count;
        continue;
      }
    }
    runs.push_back({p, 1, 1});
  }
  return runs;
}

namespace {

// The pieces of run r inside each document (document_of: positions past the last document form
// one more), appended to out as (document, piece).
void split_by_document(const PositionRun& r, std::span<const int64_t> cu,
                       std::vector<std::pair<int64_t, PositionRun>>& out) {
  const int64_t docs = static_cast<int64_t>(cu.size()) - 1;
  for (int64_t i = 0; i < r.count;) {
    const int64_t p = r.start + i * r.stride;
    const int64_t d = document_of(cu, p);
    const int64_t end = d < docs ? cu[d + 1] : INT64_MAX;  // the document's positions are < end
    const int64_t stop =
        end == INT64_MAX ? r.count : std::min(r.count, (end - 1 - r.start) / r.stride + 1);
    out.push_back({d, {p, stop - i, r.stride}});
    i = stop;
  }
}

}  // namespace

int64_t visible_pairs(const PositionRuns& q, const PositionRuns& k, bool causal, int64_t valid_len,
                      std::span<const int64_t> cu_seqlens) {
  auto pairs_of = [causal](const PositionRun& qr, const PositionRun& kv) {
    return causal ? causal_pairs(qr, kv) : qr.count * kv.count;
  };
  if (cu_seqlens.empty()) {
    int64_t pairs = 0;
    for (const auto& kr : k) {
      const PositionRun kv = valid_len > 0 ? clip_below(kr, valid_len) : kr;
      if (kv.count == 0) continue;
      for (const auto& qr : q) pairs += pairs_of(qr, kv);
    }
    return pairs;
  }
  // Documents: both sides cut into per-document pieces, and pieces of one document paired.
  std::vector<std::pair<int64_t, PositionRun>> qp, kp;
  for (const auto& qr : q) split_by_document(qr, cu_seqlens, qp);
  for (const auto& kr : k) {
    const PositionRun kv = valid_len > 0 ? clip_below(kr, valid_len) : kr;
    if (kv.count > 0) split_by_document(kv, cu_seqlens, kp);
  }
  auto by_doc = [](const auto& a, const auto& b) { return a.first < b.first; };
  std::stable_sort(qp.begin(), qp.end(), by_doc);
  std::stable_sort(kp.begin(), kp.end(), by_doc);
  int64_t pairs = 0;
  size_t j = 0;
  for (size_t i = 0; i < qp.size();) {
    const int64_t d = qp[i].first;
    size_t i_end = i;
    while (i_end < qp.size() && qp[i_end].first == d) ++i_end;
    while (j < kp.size() && kp[j].first < d) ++j;
    for (size_t jj = j; jj < kp.size() && kp[jj].first == d; ++jj)
      for (size_t ii = i; ii < i_end; ++ii) pairs += pairs_of(qp[ii].second, kp[jj].second);
    i = i_end;
  }
  return pairs;
}

std::vector<PositionRuns> piece_layout_runs(std::span<const int64_t> starts,
                                            std::span<const int64_t> lens, int ranks,
                                            Layout layout) {
  SEQPAR_PARAM_CHECK(starts.size() == lens.size() && ranks >= 1, "ranks", "",
                     "piece_layout_runs: ", starts.size(), " starts, ", lens.size(), " lengths, ",
                     param("ranks"), " ", ranks);
  SEQPAR_ARG_CHECK(layout != Layout::kCustom, "piece_layout_runs: a custom layout has no rule");
  const int64_t n = ranks;
  std::vector<PositionRuns> out(ranks);
  int64_t o = 0;  // the rank the next piece's first extra token goes to
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t start = starts[i], len = lens[i];
    if (len <= 0) continue;
    if (layout == Layout::kStriped) {
      for (int64_t r = 0; r < n; ++r) {
        const int64_t first = ((r - o) % n + n) % n;  // the first j with (o + j) mod N == r
        if (first < len) out[r].push_back({start + first, (len - first + n - 1) / n, n});
      }
      o = (o + len) % n;
      continue;
    }
    const bool zigzag = layout == Layout::kZigzag;
    const int64_t chunks = zigzag ? 2 * n : n, base = len / chunks, extra = len % chunks;
    std::vector<int64_t> chunk(chunks, base);
    for (int64_t x = 0; x < extra; ++x) {
      if (x < n) {
        ++chunk[(o + x) % n];  // rank (o + x)'s first chunk
      } else {
        const int64_t r = ((o - 1 - (x - n)) % n + n) % n;  // ranks o-1, o-2, ...: second chunk
        ++chunk[2 * n - 1 - r];
      }
    }
    if (extra < n) o = (o + extra) % n;
    int64_t next = start;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r = c < n ? c : 2 * n - 1 - c;
      if (chunk[c] > 0) out[r].push_back({next, chunk[c], 1});
      next += chunk[c];
    }
  }
  return out;
}

}  // namespace seqpar
