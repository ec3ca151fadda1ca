// IndexRange: a half-open range [begin, end) of indices (heads of a rank, tokens of a rank, rows
// of a weight shard).
// Thread-safety: a value; safe to use from any thread.
#pragma once

#include <cstdint>

namespace seqpar {

struct IndexRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

}  // namespace seqpar
