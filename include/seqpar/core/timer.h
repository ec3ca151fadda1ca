// Wall-clock timing and the median of repeated measurements. Thread-safety: pure.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace seqpar {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// The median of v (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2) return v[mid];
  return 0.5 * (*std::max_element(v.begin(), v.begin() + mid) + v[mid]);
}

}  // namespace seqpar
