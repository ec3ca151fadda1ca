// A checkpoint's config.json as its readers see it: the file read within the JSON limits, and
// each key read with its kind and range checked, every refusal one line naming the file, the key
// and what is valid (InvalidArgument). Internal to the model layer: the family readers
// (families/*.cc) use it.
// Thread-safety: a ConfigJson is an immutable value once parsed.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace seqpar {

// A JSON file's text, read whole: a regular file of at most limits::kMaxFileBytes.
std::string read_json_text(const std::string& path);
// A JSON file parsed, within the JSON limits (anything but an object is refused by ConfigJson).
nlohmann::json read_json_file(const std::string& path);

// InvalidArgument unless `dir` is a directory: "model DIR: not a directory; give <expected>",
// and for a name shaped like a hub id ("org/name") that seqpar downloads nothing.
void check_model_dir(const std::string& dir, const char* expected);

// The "_class_name" a JSON file declares (diffusers' configs), "" when the file is missing, not a
// readable JSON object or declares none.
std::string json_class_name(const std::string& path);

// The directory of a diffusers transformer of class `cls` in `dir`: `dir` itself when its
// config.json declares the class, dir/transformer when that one's does (a pipeline directory),
// else "".
std::string diffusers_transformer_dir(const std::string& dir, const std::string& cls);

class ConfigJson {
 public:
  // `text` parsed (`path` names it in messages); InvalidArgument unless a JSON object.
  static ConfigJson parse(const std::string& text, const std::string& path);
  ConfigJson(nlohmann::json j, std::string path);

  // Present and not null.
  bool has(const char* key) const;
  // Required integer in [lo, hi].
  int64_t integer(const char* key, int64_t lo, int64_t hi) const;
  // Optional integer in [lo, hi], `fallback` when absent.
  int64_t integer(const char* key, int64_t lo, int64_t hi, int64_t fallback) const;
  double real(const char* key, double lo, double hi, double fallback) const;
  bool boolean(const char* key, bool fallback) const;
  std::string string(const char* key) const;  // "" when absent
  // A value read inside the config (`key` names it in messages: "rope_scaling.factor").
  int64_t integer_of(const nlohmann::json& v, const std::string& key, int64_t lo, int64_t hi) const;
  double real_of(const nlohmann::json& v, const std::string& key, double lo, double hi) const;

  const nlohmann::json& at(const char* key) const { return j_.at(key); }
  const std::string& path() const { return path_; }

 private:
  nlohmann::json j_;
  std::string path_;
};

}  // namespace seqpar
