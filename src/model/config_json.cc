#include "config_json.h"

#include <cmath>
#include <filesystem>

#include "seqpar/core/error.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"

namespace seqpar {

using nlohmann::json;

std::string read_json_text(const std::string& path) {
  return files::read_input("", path, "a JSON file", limits::kMaxFileBytes);
}

json read_json_file(const std::string& path) {
  const std::string text = read_json_text(path);
  check_json_limits(text, path, {.max_bytes = static_cast<size_t>(limits::kMaxFileBytes)});
  try {
    return parse_json_unique_keys<json>(text, path);
  } catch (const json::exception& e) {
    throw InvalidArgument(detail::concat(path, ": not valid JSON (",
                                         quote_for_message(e.what(), kParseErrorChars), ")"));
  }
}

std::string json_class_name(const std::string& path) {
  if (!files::is_regular_file(path)) return "";
  try {
    const nlohmann::json j = read_json_file(path);
    return j.is_object() && j.contains("_class_name") && j["_class_name"].is_string()
               ? j["_class_name"].get<std::string>()
               : "";
  } catch (const Error&) {
    return "";
  }
}

std::string diffusers_transformer_dir(const std::string& dir, const std::string& cls) {
  if (json_class_name(dir + "/config.json") == cls) return dir;
  if (json_class_name(dir + "/transformer/config.json") == cls) return dir + "/transformer";
  return "";
}

void check_model_dir(const std::string& dir, const char* expected) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return;
  // "org/name" with no such path here: most likely a Hugging Face hub id.
  const size_t slash = dir.find('/');
  const bool hub_id = slash != std::string::npos && slash > 0 && slash + 1 < dir.size() &&
                      dir.find('/', slash + 1) == std::string::npos && dir[0] != '.';
  if (hub_id)
    throw ParamError(
        "model", "",
        detail::concat(param("model"), " ", dir,
                       ": not a directory; seqpar reads local directories and downloads nothing: "
                       "fetch a hub model first (huggingface-cli download ",
                       dir, " --local-dir DIR) and give DIR"));
  throw ParamError("model", expected,
                   detail::concat(param("model"), " ", dir, ": not a directory; give ", expected));
}

ConfigJson ConfigJson::parse(const std::string& text, const std::string& path) {
  check_json_limits(text, path, {.max_bytes = static_cast<size_t>(limits::kMaxFileBytes)});
  try {
    return ConfigJson(parse_json_unique_keys<json>(text, path), path);
  } catch (const json::exception& e) {
    throw InvalidArgument(detail::concat(path, ": not valid JSON (",
                                         quote_for_message(e.what(), kParseErrorChars), ")"));
  }
}

ConfigJson::ConfigJson(json j, std::string path) : j_(std::move(j)), path_(std::move(path)) {
  SEQPAR_FILE_CHECK(j_.is_object(), path_, ": not a JSON object");
}

bool ConfigJson::has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

int64_t ConfigJson::integer(const char* key, int64_t lo, int64_t hi) const {
  SEQPAR_FILE_CHECK(has(key), path_, ": key '", key, "' is missing; expected an integer");
  return integer_of(j_.at(key), key, lo, hi);
}

int64_t ConfigJson::integer(const char* key, int64_t lo, int64_t hi, int64_t fallback) const {
  return has(key) ? integer_of(j_.at(key), key, lo, hi) : fallback;
}

double ConfigJson::real(const char* key, double lo, double hi, double fallback) const {
  return has(key) ? real_of(j_.at(key), key, lo, hi) : fallback;
}

bool ConfigJson::boolean(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  SEQPAR_FILE_CHECK(j_.at(key).is_boolean(), path_, ": ", key, " is ", json_excerpt(j_.at(key)),
                    "; expected true or false");
  return j_.at(key).get<bool>();
}

std::string ConfigJson::string(const char* key) const {
  if (!has(key)) return "";
  SEQPAR_FILE_CHECK(j_.at(key).is_string(), path_, ": ", key, " is ", json_excerpt(j_.at(key)),
                    "; expected a string");
  return j_.at(key).get<std::string>();
}

int64_t ConfigJson::integer_of(const json& v, const std::string& key, int64_t lo,
                               int64_t hi) const {
  SEQPAR_FILE_CHECK(v.is_number_integer(), path_, ": ", key, " is ", json_excerpt(v),
                    "; expected an integer");
  const int64_t x =
      v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX ? INT64_MAX : v.get<int64_t>();
  SEQPAR_FILE_CHECK(lo <= x && x <= hi, path_, ": ", key, " ", x, " is out of range; valid: ", lo,
                    " to ", hi);
  return x;
}

double ConfigJson::real_of(const json& v, const std::string& key, double lo, double hi) const {
  SEQPAR_FILE_CHECK(v.is_number(), path_, ": ", key, " is ", json_excerpt(v),
                    "; expected a number");
  const double x = v.get<double>();
  SEQPAR_FILE_CHECK(std::isfinite(x) && lo <= x && x <= hi, path_, ": ", key, " ", x,
                    " is out of range; valid: ", lo, " to ", hi);
  return x;
}

}  // namespace seqpar
