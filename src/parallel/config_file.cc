#include "seqpar/parallel/config_file.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "seqpar/core/error.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"

namespace seqpar {

namespace {

constexpr const char* kKeys =
    "tensor_parallel_size, cfg_parallel_size, ulysses_degree, ring_degree, "
    "sequence_parallel_size, ulysses_mode, pipeline_parallel_size, data_parallel_size";

// One key of the mapping, its value as text (ints as decimal), into the spec.
void set_key(DegreeSpec& d, const std::string& key, const std::string& value, bool is_int,
             std::string_view source) {
  const std::string what = detail::concat(source, ": '", quote_for_message(key), "'");
  if (key == "ulysses_mode") {
    d.ulysses_mode = std::string(ulysses_mode_name(parse_ulysses_mode(value)));
    return;
  }
  std::optional<int64_t>* slot = key == "tensor_parallel_size"     ? &d.tp
                                 : key == "cfg_parallel_size"      ? &d.cfg
                                 : key == "ulysses_degree"         ? &d.ulysses
                                 : key == "ring_degree"            ? &d.ring
                                 : key == "sequence_parallel_size" ? &d.sp
                                                                   : nullptr;
  const bool fixed_one = key == "pipeline_parallel_size" || key == "data_parallel_size";
  SEQPAR_ARG_CHECK(slot != nullptr || fixed_one, what,
                   " is not a parallel-config key; valid: ", kKeys);
  const std::optional<int64_t> v = is_int ? limits::parse_int64(value) : std::nullopt;
  SEQPAR_ARG_CHECK(v && *v >= 1 && *v <= limits::kMaxRanks, what, " is '", quote_for_message(value),
                   "'; valid: an integer from 1 to ", limits::max_text(limits::kMaxRanks));
  if (fixed_one) {
    SEQPAR_ARG_CHECK(*v == 1, what, " is ", *v, "; seqpar runs no pipeline or data parallelism ",
                     "(valid: 1)");
    return;
  }
  *slot = *v;
}

// ---- JSON ----

const nlohmann::json* find_json_section(const nlohmann::json& j, int depth) {
  if (depth > 8) return nullptr;
  if (j.is_object()) {
    if (auto it = j.find("parallel_config"); it != j.end() && it->is_object()) return &*it;
    for (const auto& [k, v] : j.items())
      if (const nlohmann::json* f = find_json_section(v, depth + 1)) return f;
  } else if (j.is_array()) {
    for (const auto& v : j)
      if (const nlohmann::json* f = find_json_section(v, depth + 1)) return f;
  }
  return nullptr;
}

DegreeSpec parse_json(std::string_view text, std::string_view source) {
  check_json_limits(text, source);
  nlohmann::json j;
  try {
    j = parse_json_unique_keys<nlohmann::json>(text, source);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(detail::concat(source, ": not valid JSON (",
                                         quote_for_message(e.what(), kParseErrorChars), ")"));
  }
  SEQPAR_ARG_CHECK(j.is_object(), source, ": a parallel config is a JSON object");
  const nlohmann::json* section = find_json_section(j, 0);
  const nlohmann::json& m = section ? *section : j;
  DegreeSpec d;
  for (const auto& [k, v] : m.items()) {
    if (v.is_number_integer()) {
      set_key(d, k, std::to_string(v.get<int64_t>()), true, source);
    } else if (v.is_string()) {
      set_key(d, k, v.get<std::string>(), false, source);
    } else {
      set_key(d, k, json_excerpt(v), false, source);
    }
  }
  return d;
}

// ---- YAML (block mappings, lists of mappings, scalars) ----

struct YamlLine {
  int indent = 0;          // columns before the key (a "- " list marker counts as indentation)
  std::string key, value;  // value empty: a mapping or list follows
  int number = 0;
};

std::string trim(std::string s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

// A scalar without its quotes and trailing comment; `quoted` says whether it was a string.
std::string scalar(std::string v, bool& quoted) {
  quoted = false;
  if (!v.empty() && (v[0] == '"' || v[0] == '\'')) {
    const size_t end = v.find(v[0], 1);
    quoted = true;
    return end == std::string::npos ? v.substr(1) : v.substr(1, end - 1);
  }
  if (const size_t hash = v.find(" #"); hash != std::string::npos) v = v.substr(0, hash);
  return trim(v);
}

std::vector<YamlLine> yaml_lines(std::string_view text, std::string_view source) {
  std::vector<YamlLine> lines;
  std::istringstream in{std::string(text)};
  std::string raw;
  int number = 0;
  while (std::getline(in, raw)) {
    ++number;
    SEQPAR_ARG_CHECK(raw.find('\t') == std::string::npos || trim(raw).empty(), source, ": line ",
                     number, " is indented with a tab; YAML indents with spaces");
    std::string s = raw;
    int indent = 0;
    while (indent < static_cast<int>(s.size()) && s[indent] == ' ') ++indent;
    s = s.substr(indent);
    if (s.empty() || s[0] == '#' || s == "---" || s == "...") continue;
    while (s.size() >= 2 && s[0] == '-' && s[1] == ' ') {  // list item: "- key: value"
      s = trim(s.substr(2));
      indent += 2;
    }
    if (s == "-") continue;
    const size_t colon = s.find(':');
    SEQPAR_ARG_CHECK(colon != std::string::npos && colon > 0, source, ": line ", number,
                     " is not 'key: value' (", quote_for_message(trim(raw)), ")");
    YamlLine l;
    l.indent = indent;
    l.key = trim(s.substr(0, colon));
    l.value = trim(s.substr(colon + 1));
    if (!l.value.empty() && l.value[0] == '#') l.value.clear();
    l.number = number;
    lines.push_back(std::move(l));
  }
  return lines;
}

DegreeSpec parse_yaml(std::string_view text, std::string_view source) {
  const std::vector<YamlLine> lines = yaml_lines(text, source);
  size_t first = 0, last = lines.size();
  int indent = lines.empty() ? 0 : lines[0].indent;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].key != "parallel_config" || !lines[i].value.empty()) continue;
    first = i + 1;
    last = first;
    while (last < lines.size() && lines[last].indent > lines[i].indent) ++last;
    indent = first < last ? lines[first].indent : 0;
    break;
  }
  DegreeSpec d;
  for (size_t i = first; i < last; ++i) {
    const YamlLine& l = lines[i];
    if (l.indent != indent) {
      SEQPAR_ARG_CHECK(l.indent > indent, source, ": line ", l.number,
                       " is indented less than the keys before it");
      continue;  // inside a nested value of a key at this level
    }
    const bool nested = l.value.empty() && i + 1 < last && lines[i + 1].indent > indent;
    SEQPAR_ARG_CHECK(!nested, source, ": line ", l.number, ": '", quote_for_message(l.key),
                     "' holds a nested mapping; a parallel config's keys hold numbers or names",
                     first == 0 ? " (and this file has no parallel_config mapping)" : "");
    bool quoted = false;
    const std::string v = scalar(l.value, quoted);
    set_key(d, l.key, v, !quoted && limits::parse_int64(v).has_value(), source);
  }
  return d;
}

}  // namespace

DegreeSpec DegreeSpec::merged_with(const DegreeSpec& over) const {
  DegreeSpec d = *this;
  if (over.cfg) d.cfg = over.cfg;
  if (over.tp) d.tp = over.tp;
  if (over.ring) d.ring = over.ring;
  if (over.ulysses) d.ulysses = over.ulysses;
  if (over.sp) d.sp = over.sp;
  if (over.ulysses_mode) d.ulysses_mode = over.ulysses_mode;
  return d;
}

DegreeSpec parse_parallel_config(std::string_view text, std::string_view source) {
  const size_t start = text.find_first_not_of(" \t\r\n");
  if (start != std::string_view::npos && text[start] == '{') return parse_json(text, source);
  SEQPAR_ARG_CHECK(text.size() <= static_cast<size_t>(limits::kMaxFileBytes), source, " is ",
                   text.size(), " bytes; a parallel config is at most ",
                   limits::max_text(limits::kMaxFileBytes));
  return parse_yaml(text, source);
}

namespace {

// The file at `path` read and parsed; messages name it by its path.
DegreeSpec read_config_text(const std::string& path) {
  const std::string source = quote_for_message(path);
  const std::string text =
      files::read_input("", path, "a JSON or YAML file", limits::kMaxFileBytes);
  return parse_parallel_config(text, source);
}

}  // namespace

DegreeSpec read_parallel_config_file(const std::string& path) {
  try {
    return read_config_text(path);
  } catch (const InvalidArgument& e) {
    throw FileContentError("parallel_config", e.what());
  }
}

MeshShape resolve_degrees(const DegreeSpec& d) {
  auto narrow = [](const char* name, std::optional<int64_t> v, int64_t fallback) {
    const int64_t x = v.value_or(fallback);
    limits::check_range(name, x, 1, limits::kMaxRanks);
    return static_cast<int>(x);
  };
  MeshShape m;
  m.cfg = narrow("cfg_parallel_size", d.cfg, 1);
  m.tp = narrow("tensor_parallel_size", d.tp, 1);
  if (!d.sp) {
    m.ring = narrow("ring_degree", d.ring, 1);
    m.ulysses = narrow("ulysses_degree", d.ulysses, 1);
    return m;
  }
  const int sp = narrow("sequence_parallel_size", d.sp, 1);
  if (d.ring && d.ulysses) {
    m.ring = narrow("ring_degree", d.ring, 1);
    m.ulysses = narrow("ulysses_degree", d.ulysses, 1);
    SEQPAR_PARAM_CHECK(int64_t{m.ring} * m.ulysses == sp, "sequence_parallel_size",
                       detail::concat(int64_t{m.ring} * m.ulysses), param("sequence_parallel_size"),
                       " ", sp, " must equal ", param("ulysses_degree"), " x ",
                       param("ring_degree"), " = ", m.ulysses, " x ", m.ring);
  } else if (d.ulysses || d.ring) {
    const int given =
        narrow(d.ulysses ? "ulysses_degree" : "ring_degree", d.ulysses ? d.ulysses : d.ring, 1);
    const char* name = d.ulysses ? "ulysses_degree" : "ring_degree";
    SEQPAR_PARAM_CHECK(sp % given == 0, name, divisors_text(sp), param(name), " ", given,
                       " does not divide ", param("sequence_parallel_size"), " ", sp,
                       "; valid: ", divisors_text(sp));
    (d.ulysses ? m.ulysses : m.ring) = given;
    (d.ulysses ? m.ring : m.ulysses) = sp / given;
  } else {
    m.ring = sp;
  }
  return m;
}

}  // namespace seqpar
