#include "seqpar/plan/hardware.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "seqpar/core/error.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"

namespace seqpar {

namespace {

using nlohmann::json;

// A profile is a few hundred bytes of flat JSON; these bounds leave room and stop abuse.
constexpr JsonLimits kHardwareProfileLimits{.max_bytes = 1 << 20, .max_depth = 8};
// Characters of a parse error kept in a message: nlohmann quotes the whole offending token.

// {name, JSON text} of profiles/*.json, generated at configure time (src/plan/CMakeLists.txt).
const std::vector<std::pair<std::string, std::string>>& builtin_texts() {
  static const std::vector<std::pair<std::string, std::string>> texts = {
#include "builtin_profiles.inc"
  };
  return texts;
}

const std::vector<HardwareProfile>& builtin_profiles() {
  static const std::vector<HardwareProfile> all = [] {
    std::vector<HardwareProfile> v;
    for (const auto& [name, text] : builtin_texts()) {
      HardwareProfile p = hardware_profile_from_json(text, "built-in");
      SEQPAR_CHECK(p.name == name, "profiles/", name, ".json names itself '", p.name, "'");
      v.push_back(std::move(p));
    }
    return v;
  }();
  return all;
}

std::string names_text() {
  std::string valid;
  for (const auto& n : hardware_profile_names()) valid += (valid.empty() ? "" : ", ") + n;
  return valid;
}

bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Never blocks (a FIFO is refused, not opened for reading).
HardwareProfile read_profile_file(const std::string& path) {
  SEQPAR_PARAM_CHECK(file_exists(path), "hardware", "", param("hardware"), " '", path, "'",
                     ": cannot read the file; valid names: ", names_text(),
                     ", or a path to a profile JSON file");
  return hardware_profile_from_json(
      files::read_input("hardware", path, "a profile JSON file", limits::kMaxFileBytes), path);
}

// The JSON fields, in the order they are written.
template <typename Fn>
void for_each_field(HardwareProfile& p, Fn&& fn) {
  fn("name", p.name);
  fn("description", p.description);
  fn("dtype", p.dtype);
  fn("attention_flops", p.attention_flops);
  fn("gemm_flops", p.gemm_flops);
  fn("intra_node_bw", p.intra_node_bw);
  fn("inter_node_bw", p.inter_node_bw);
  fn("latency_s", p.latency_s);
  fn("inter_node_latency_s", p.inter_node_latency_s);
  fn("ranks_per_node", p.ranks_per_node);
  fn("memory_bytes", p.memory_bytes);
  fn("local_copy_bw", p.local_copy_bw);
  fn("overlap", p.overlap);
  fn("shared_node", p.shared_node);
  fn("cores_per_node", p.cores_per_node);
  fn("thread_efficiency", p.thread_efficiency);
}

}  // namespace

std::vector<std::string> hardware_profile_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : builtin_texts()) names.push_back(name);
  return names;
}

HardwareProfile hardware_profile(std::string_view name) {
  for (const auto& p : builtin_profiles())
    if (p.name == name) return p;
  throw ParamError("hardware", "",
                   detail::concat(param("hardware"), " '", name, "' is unknown; valid: ",
                                  names_text(), ", or a path to a profile JSON file"));
}

std::string user_profile_dir() {
  if (const char* d = std::getenv("SEQPAR_PROFILE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x != nullptr && *x != '\0')
    return std::string(x) + "/seqpar";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return std::string(h) + "/.config/seqpar";
  return "";
}

HardwareProfile load_hardware_profile(std::string_view name_or_path) {
  const std::string s(name_or_path);
  SEQPAR_PARAM_CHECK(!s.empty(), "hardware", "", param("hardware"),
                     " is empty; valid: ", names_text(), ", or a path to a profile JSON file");
  const bool is_path = s.find('/') != std::string::npos ||
                       (s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0);
  if (is_path) return read_profile_file(s);
  const std::string dir = user_profile_dir();
  if (!dir.empty() && file_exists(dir + "/" + s + ".json")) {
    HardwareProfile p = read_profile_file(dir + "/" + s + ".json");
    SEQPAR_ARG_CHECK(p.name == s, dir, "/", s, ".json names itself '", quote_for_message(p.name),
                     "'; its \"name\" must be '", s, "'");
    return p;
  }
  return hardware_profile(s);
}

HardwareProfile hardware_profile_from_json(std::string_view text, std::string_view source) {
  const std::string label = detail::concat("hardware profile ", source);
  // The messages below name the profile as the parameter that gave it.
  const std::string marked = detail::concat(param("hardware"), " profile ", source);
  check_json_limits(text, label, kHardwareProfileLimits);
  json j;
  try {
    j = parse_json_unique_keys<json>(text, label);
  } catch (const json::exception& e) {
    // A syntax error, or a number out of range (1e400: out_of_range, not parse_error). nlohmann
    // quotes the whole offending token: keep the message short.
    throw ParamError("hardware", "",
                     detail::concat(marked, " is not valid JSON: ",
                                    quote_for_message(e.what(), kParseErrorChars)));
  }
  SEQPAR_PARAM_CHECK(j.is_object(), "hardware", "", marked, " must be a JSON object");
  HardwareProfile p;
  p.source = std::string(source);
  std::vector<std::string> known;
  for_each_field(p, [&](const char* key, auto& field) {
    known.push_back(key);
    auto it = j.find(key);
    if (it == j.end()) return;
    using T = std::decay_t<decltype(field)>;
    try {
      if constexpr (std::is_same_v<T, bool>) {
        field = it->get<bool>();
      } else if constexpr (std::is_same_v<T, int>) {
        SEQPAR_ARG_CHECK(it->is_number_integer(), "not an integer");
        field = it->get<int>();
      } else if constexpr (std::is_same_v<T, double>) {
        SEQPAR_ARG_CHECK(it->is_number(), "not a number");
        field = it->get<double>();
      } else {
        field = it->get<std::string>();
      }
    } catch (const std::exception& e) {
      throw ParamError("hardware", "",
                       detail::concat(marked, ": field \"", key, "\" has the wrong type (",
                                      json_excerpt(*it), ")"));
    }
  });
  for (auto it = j.begin(); it != j.end(); ++it)
    SEQPAR_PARAM_CHECK(std::find(known.begin(), known.end(), it.key()) != known.end(), "hardware",
                       "", marked, ": unknown field \"", quote_for_message(it.key()), "\"");
  SEQPAR_PARAM_CHECK(!p.name.empty(), "hardware", "", marked, " lacks \"name\"");
  SEQPAR_PARAM_CHECK(p.attention_flops > 0 && p.intra_node_bw > 0 && p.inter_node_bw > 0,
                     "hardware", "", marked, " needs positive \"attention_flops\", ",
                     "\"intra_node_bw\" and \"inter_node_bw\"");
  SEQPAR_PARAM_CHECK(p.latency_s >= 0 && p.inter_node_latency_s >= 0 && p.gemm_flops >= 0 &&
                         p.local_copy_bw >= 0 && p.memory_bytes >= 0 && p.cores_per_node >= 0,
                     "hardware", "", marked, ": rates, latencies and sizes must not be negative");
  SEQPAR_PARAM_CHECK(p.overlap >= 0 && p.overlap <= 1, "hardware", "", marked,
                     ": \"overlap\" must be between 0 and 1");
  SEQPAR_PARAM_CHECK(p.thread_efficiency > 0 && p.thread_efficiency <= 1, "hardware", "", marked,
                     ": \"thread_efficiency\" must be in (0, 1]");
  SEQPAR_PARAM_CHECK(p.dtype == "fp32" || p.dtype == "bf16" || p.dtype == "fp16", "hardware", "",
                     marked, ": \"dtype\" must be fp32, bf16 or fp16");
  return p;
}

std::string hardware_profile_to_json(const HardwareProfile& profile) {
  HardwareProfile p = profile;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for_each_field(p, [&](const char* key, auto& field) { j[key] = field; });
  return j.dump(2) + "\n";
}

int profile_cores(const HardwareProfile& p) {
  if (p.cores_per_node > 0) return p.cores_per_node;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int threads_per_rank(const HardwareProfile& p, int ranks_on_node) {
  if (!p.shared_node) return 1;
  return std::max(1, profile_cores(p) / std::max(1, ranks_on_node));
}

namespace {
// Share of one rank in the node's rate of `per_core`: t threads each, all ranks' threads
// time-sharing the cores when they outnumber them.
double shared_rate(const HardwareProfile& p, double per_core, int ranks_on_node) {
  const int k = std::max(1, ranks_on_node), cores = profile_cores(p);
  const int t = threads_per_rank(p, k);
  const double eff = t > 1 ? p.thread_efficiency : 1.0;
  const double busy = static_cast<double>(k) * t;  // threads wanting a core
  return per_core * t * eff * std::min(1.0, cores / busy);
}
}  // namespace

double rank_attention_flops(const HardwareProfile& p, int ranks_on_node) {
  return p.shared_node ? shared_rate(p, p.attention_flops, ranks_on_node) : p.attention_flops;
}

double rank_gemm_flops(const HardwareProfile& p, int ranks_on_node) {
  const double g = p.gemm_flops > 0 ? p.gemm_flops : p.attention_flops;
  return p.shared_node ? shared_rate(p, g, ranks_on_node) : g;
}

double rank_memory_bytes(const HardwareProfile& p, int ranks_on_node) {
  return p.shared_node ? p.memory_bytes / std::max(1, ranks_on_node) : p.memory_bytes;
}

}  // namespace seqpar
