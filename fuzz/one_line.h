// What every fuzz target asks of a refusal: one line of at most kMaxMessageChars.
#pragma once

#include <cstddef>
#include <string>

namespace seqpar::fuzz {

inline constexpr size_t kMaxMessageChars = 1024;

inline void expect_one_short_line(const std::string& message) {
  if (message.size() > kMaxMessageChars || message.find('\n') != std::string::npos)
    __builtin_trap();
}

}  // namespace seqpar::fuzz
