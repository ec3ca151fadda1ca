// Limits on the JSON seqpar reads (safetensors headers, hardware profiles, checkpoint configs),
// checked on the raw text before it is parsed, and short quotes of untrusted values for messages.
//
// nlohmann::json parses any depth without recursion, but dump(), comparison and the readers' own
// walks recurse: a 200 KB header nesting 100,000 lists parses and then overflows the stack when an
// error message quotes it. So every reader calls check_json_limits(text, ...) first (a linear
// scan: depth of [ and { outside strings, and size), and messages quote untrusted values only
// through quote_for_message / json_excerpt, which never produce more than a fixed length.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/error.h"

namespace seqpar {

struct JsonLimits {
  size_t max_bytes = 1 << 20;  // a config or profile; a safetensors header allows 100 MB
  int max_depth = 64;          // nested arrays and objects; seqpar's files need 3
};

// Characters of an untrusted value quoted in a message, "..." included.
inline constexpr size_t kMessageQuoteChars = 60;
// Characters of a JSON parser's own error quoted in a message (it quotes the offending input).
inline constexpr size_t kParseErrorChars = 200;

// Throws InvalidArgument "<source>: ..." (one line) if `text` is longer than limits.max_bytes or
// nests arrays/objects deeper than limits.max_depth. Says nothing about validity otherwise: that
// is the parser's job.
void check_json_limits(std::string_view text, std::string_view source, JsonLimits limits = {});

// `s` as one line of printable ASCII of at most `max_chars` characters: other bytes become '?',
// and a longer value is cut to end in "...".
std::string quote_for_message(std::string_view s, size_t max_chars = kMessageQuoteChars);

// A nlohmann JSON value as compact text for a message, at most `max_chars` characters, built
// without dumping the whole value (it stops once the budget is spent, and writes nested values
// past JsonLimits{}.max_depth as "..."), so any parsed value can be quoted.
template <typename Json>
std::string json_excerpt(const Json& j, size_t max_chars = kMessageQuoteChars);

// `text` parsed as Json (nlohmann::json), refusing a key repeated within one object, which
// nlohmann would keep the last of silently: FileContentError "<source>: the key 'k' appears twice
// in one object (inside 'parent')". Syntax errors propagate as the parser's own exceptions.
template <typename Json>
Json parse_json_unique_keys(std::string_view text, std::string_view source);

// ---- implementation ----

namespace detail {
// A value cut at a byte budget may end inside a UTF-8 sequence: dump it with the bad bytes
// replaced (quote_for_message turns every non-ASCII byte into '?' anyway) instead of throwing.
template <typename Json>
std::string dump_for_message(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

template <typename Json>
void json_excerpt_into(const Json& j, std::string& out, size_t budget, int depth) {
  if (out.size() > budget) return;
  if (j.is_array() || j.is_object()) {
    if (depth >= JsonLimits{}.max_depth) {
      out += "...";
      return;
    }
    out += j.is_array() ? '[' : '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (out.size() > budget) return;
      if (!first) out += ',';
      first = false;
      if (j.is_object()) {
        out += dump_for_message(Json(it.key().substr(0, budget)));
        out += ':';
      }
      json_excerpt_into(*it, out, budget, depth + 1);
    }
    out += j.is_array() ? ']' : '}';
  } else if (j.is_string()) {
    out += dump_for_message(Json(j.template get_ref<const typename Json::string_t&>().substr(0, budget)));
  } else {
    out += dump_for_message(j);  // a number, bool or null: short
  }
}
}  // namespace detail

template <typename Json>
std::string json_excerpt(const Json& j, size_t max_chars) {
  std::string out;
  detail::json_excerpt_into(j, out, max_chars, 0);
  return quote_for_message(out, max_chars);
}

template <typename Json>
Json parse_json_unique_keys(std::string_view text, std::string_view source) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::vector<std::string> last;            // the key just read, per open object
  auto callback = [&](int, typename Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        last.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back(), last.pop_back();
        break;
      case Json::parse_event_t::key: {
        const auto& k = parsed.template get_ref<const typename Json::string_t&>();
        if (!keys.empty() && !keys.back().insert(k).second) {
          std::string where;
          if (keys.size() >= 2) where = " (inside '" + quote_for_message(last[last.size() - 2]) + "')";
          throw FileContentError("", std::string(source) + ": the key '" + quote_for_message(k) +
                                         "' appears twice in one object" + where +
                                         "; expected each key once");
        }
        if (!last.empty()) last.back() = k;
        break;
      }
      default:
        break;
    }
    return true;
  };
  return Json::parse(text.begin(), text.end(), callback);
}

}  // namespace seqpar
