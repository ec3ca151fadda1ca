#include "seqpar/core/json_limits.h"

#include "seqpar/core/error.h"

namespace seqpar {

void check_json_limits(std::string_view text, std::string_view source, JsonLimits limits) {
  SEQPAR_ARG_CHECK(text.size() <= limits.max_bytes, source, ": the JSON is ", text.size(),
                   " bytes, over the limit of ", limits.max_bytes, " bytes");
  // One pass: depth counts open [ and { outside strings; inside a string, '\' skips a byte.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      SEQPAR_ARG_CHECK(++depth <= limits.max_depth, source, ": the JSON nests arrays and objects ",
                       "deeper than ", limits.max_depth, " levels (at byte ", i, ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

std::string quote_for_message(std::string_view s, size_t max_chars) {
  std::string out(s.substr(0, max_chars));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  if (s.size() > max_chars && max_chars >= 3) out.replace(max_chars - 3, 3, "...");
  return out;
}

}  // namespace seqpar
