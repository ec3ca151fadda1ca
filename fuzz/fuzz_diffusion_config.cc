// Fuzzes the diffusion transformers' config.json readers: the input (after its first byte) is a
// config.json, the first byte's low bits pick where it lies in a checkpoint directory: the
// directory itself (a transformer directory: Wan diffusers or original, Qwen-Image, FLUX),
// transformer/ (a diffusers pipeline) or high_noise_model/ (Wan 2.2 A14B's original layout). The
// directory is opened as seqpar denoise opens it: diffusion_family reads the class the config
// declares, then that family's reader (open_wan_model, open_qwen_image, open_flux) reads the
// config.
//
// With the first byte's high bit set, the rest is retyped before it is written: parsed, and one key
// the readers know (kKeys) set to one of kValues or removed, the pair picked by a hash of the
// text. Each edit that keeps the JSON valid (a digit, a letter in a string) then gives some key
// another kind of value, which byte edits of JSON text rarely do (they break the JSON first).
//
// Beside each config lies a weights file that holds no tensor, so no directory opens: a config is
// either refused with InvalidArgument (one short line naming the directory or its config), or
// accepted, and then its first parameter is reported missing with the shape the config gives it,
// which must be positive (no width overflowed).
#include <sys/stat.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "one_line.h"
#include "seqpar/core/error.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/model/diffusion_family.h"
#include "seqpar/model/flux.h"
#include "seqpar/model/qwen_image.h"
#include "seqpar/model/safetensors.h"
#include "seqpar/model/wan.h"
#include "temp_dir.h"

namespace {

// Where a config lies under a checkpoint directory: "" (the directory is the transformer).
constexpr const char* kConfigFolders[] = {"", "transformer/", "high_noise_model/"};
constexpr int kLayouts = 3;

// Every key the readers read (families/wan.cc's two layouts, qwen_image.cc, flux.cc), and the
// values a retyped key takes: every JSON kind, the integers at the edges of int64 and uint64.
constexpr const char* kKeys = R"([
  "_class_name", "model_type", "dim", "num_heads", "in_dim", "out_dim", "text_dim", "freq_dim",
  "ffn_dim", "num_layers", "text_len", "eps", "cross_attn_norm", "qk_norm", "patch_size",
  "pos_embed_seq_len", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
  "image_dim", "added_kv_proj_dim", "joint_attention_dim", "pooled_projection_dim",
  "guidance_embeds", "axes_dims_rope", "num_single_layers"])";
constexpr const char* kValues = R"([
  null, true, false, 0, -1, 1, 2, 3, 1024, 1025, 0.5, 1e308, -0.0, 9223372036854775807,
  -9223372036854775808, 18446744073709551615, "", "t2v", "rms_norm_across_heads",
  "WanTransformer3DModel", [], [1, 2, 2], [2, 2, 2], [0, 2, 2], ["a", 2, 2], [16, 56, 56, 2], {},
  {"a": 1}])";

// `text` with one key retyped (the key and its value picked by a hash of `text`), or `text` when it
// is not a JSON object within the readers' limits (nlohmann's dump recurses).
std::string retyped(const std::string& text) {
  try {
    seqpar::check_json_limits(text, "config.json", {.max_bytes = 1 << 16, .max_depth = 64});
  } catch (const seqpar::InvalidArgument&) {
    return text;
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return text;
  static const nlohmann::json keys = nlohmann::json::parse(kKeys);
  static const nlohmann::json values = nlohmann::json::parse(kValues);
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const char c : text) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  const std::string& key = keys[h % keys.size()].get_ref<const std::string&>();
  const size_t value = (h / keys.size()) % (values.size() + 1);  // values.size(): removed
  if (value == values.size()) {
    j.erase(key);
  } else {
    j[key] = values[value];
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A checkpoint directory per layout, each with an empty weights file where its config lies.
const std::string& checkpoint_dir(int layout) {
  static const seqpar::fuzz::TempDir root("seqpar-fuzz-diffusion-config");
  static const std::array<std::string, kLayouts> dirs = [] {
    std::array<std::string, kLayouts> out;
    for (int i = 0; i < kLayouts; ++i) {
      out[i] = root.path() + "/ck" + std::to_string(i);
      const std::string folder = out[i] + "/" + kConfigFolders[i];
      if (mkdir(out[i].c_str(), 0755) != 0 ||
          (folder != out[i] + "/" && mkdir(folder.c_str(), 0755) != 0))
        std::abort();
      seqpar::write_safetensors(folder + "diffusion_pytorch_model.safetensors", {},
                                {{"format", "pt"}});
    }
    return out;
  }();
  return dirs[layout];
}

// The shape an accepted config's refusal gives its first parameter ("' is missing; expected shape
// [a, b]") holds no negative width.
void expect_positive_shape(std::string_view m) {
  constexpr std::string_view kExpected = "' is missing; expected shape [";
  const size_t at = m.find(kExpected);
  if (at == std::string_view::npos) return;
  const size_t begin = at + kExpected.size();
  const std::string_view shape = m.substr(begin, m.find(']', begin) - begin);
  if (shape.find('-') != std::string_view::npos) __builtin_trap();
}

// Writes `text` as the config of checkpoint directory `dir` (layout `layout`) and opens the
// directory as seqpar denoise does.
void open_checkpoint(const std::string& dir, int layout, const std::string& text) {
  using namespace seqpar;
  const std::string config = dir + "/" + kConfigFolders[layout] + "config.json";
  std::FILE* f = std::fopen(config.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!text.empty() && std::fwrite(text.data(), 1, text.size(), f) != text.size()) std::abort();
  std::fclose(f);
  try {
    switch (diffusion_family(dir)) {
      case DiffusionFamily::kWan:
        (void)open_wan_model(dir);
        break;
      case DiffusionFamily::kQwenImage:
        (void)open_qwen_image(dir);
        break;
      case DiffusionFamily::kFlux:
        (void)open_flux(dir);
        break;
    }
    __builtin_trap();  // a directory without weights opened
  } catch (const InvalidArgument& e) {
    const std::string_view m = e.what();
    fuzz::expect_one_short_line(e.what());
    if (m.find(dir) == std::string_view::npos) __builtin_trap();
    expect_positive_shape(m);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int layout = (data[0] & 0x7f) % kLayouts;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  open_checkpoint(checkpoint_dir(layout), layout, data[0] & 0x80 ? retyped(text) : text);
  return 0;
}
