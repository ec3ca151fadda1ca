// Wall-clock timing. Thread-safety: pure.
#pragma once

#include <chrono>

namespace seqpar {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

}  // namespace seqpar
