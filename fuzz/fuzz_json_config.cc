// Fuzzes the path every JSON config reader shares (core/json_limits.h): check_json_limits on the
// raw text, nlohmann's parser, and json_excerpt for quoting values in messages. Text that passes
// the limits parses (or fails to parse) without a stack overflow, nests no deeper than the limit,
// and quotes to at most kMessageQuoteChars printable characters.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "seqpar/core/error.h"
#include "seqpar/core/json_limits.h"

namespace {

using nlohmann::json;

int depth_of(const json& j) {
  int d = 0;
  if (j.is_array() || j.is_object())
    for (const json& v : j) d = std::max(d, depth_of(v));
  return (j.is_array() || j.is_object()) ? d + 1 : 0;
}

bool printable_line(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqpar;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const JsonLimits limits{.max_bytes = 1 << 16, .max_depth = 16};
  try {
    check_json_limits(text, "fuzz.json", limits);
  } catch (const InvalidArgument& e) {
    if (std::string_view(e.what()).size() > 200) __builtin_trap();
    return 0;
  }
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  if (depth_of(j) > limits.max_depth) __builtin_trap();
  const std::string quote = json_excerpt(j);
  if (quote.size() > kMessageQuoteChars || !printable_line(quote)) __builtin_trap();
  (void)j.dump();
  const std::string raw = quote_for_message(text);
  if (raw.size() > kMessageQuoteChars || !printable_line(raw)) __builtin_trap();
  return 0;
}
