// The Wan family (Wan 2.1 / 2.2 text-to-video, Wan 2.1 image-to-video transformers) on the DiT's
// blocks: a config reader and a weight-name map for each of its two checkpoint layouts (diffusers',
// Wan's original), the layout detected from the directory, and diffusers' flow-matching schedule.
#include "seqpar/model/wan.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "../config_json.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/ops.h"

namespace seqpar {

std::string_view wan_layout_name(WanLayout layout) {
  return layout == WanLayout::kDiffusers ? "diffusers" : "original";
}

namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  const std::string text = files::read_input("", path, "a JSON file", limits::kMaxFileBytes);
  check_json_limits(text, path, JsonLimits{static_cast<size_t>(limits::kMaxFileBytes), 64});
  json j;
  try {
    j = parse_json_unique_keys<json>(text, path);
  } catch (const json::exception&) {
    j = json::value_t::discarded;
  }
  SEQPAR_FILE_CHECK(!j.is_discarded() && j.is_object(), path, ": is not a JSON object");
  return j;
}

// Integer key `key` of config `path`, in [lo, hi]; `fallback` when absent (nullopt: required).
int64_t int_key(const json& c, const std::string& path, const char* key, int64_t lo, int64_t hi,
                std::optional<int64_t> fallback = std::nullopt) {
  if (!c.contains(key) || c[key].is_null()) {
    SEQPAR_FILE_CHECK(fallback.has_value(), path, ": key '", key,
                      "' is missing; expected an integer");
    return *fallback;
  }
  SEQPAR_FILE_CHECK(c[key].is_number_integer(), path, ": key '", key, "' is ", json_excerpt(c[key]),
                    "; expected an integer");
  if (c[key].is_number_unsigned())  // above INT64_MAX it would wrap: say it as written
    SEQPAR_FILE_CHECK(c[key].get<uint64_t>() <= static_cast<uint64_t>(hi), path, ": key '", key,
                      "' is ", c[key].get<uint64_t>(), "; expected ", lo, "..", hi);
  const int64_t v = c[key].get<int64_t>();
  SEQPAR_FILE_CHECK(lo <= v && v <= hi, path, ": key '", key, "' is ", v, "; expected ", lo, "..",
                    hi);
  return v;
}

// String key `key` of config `path`; `fallback` when absent or null.
std::string string_key(const json& c, const std::string& path, const char* key,
                       const std::string& fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  SEQPAR_FILE_CHECK(c[key].is_string(), path, ": key '", key, "' is ", json_excerpt(c[key]),
                    "; expected a string");
  return c[key].get<std::string>();
}

double float_key(const json& c, const std::string& path, const char* key, double fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  SEQPAR_FILE_CHECK(c[key].is_number(), path, ": key '", key, "' is ", json_excerpt(c[key]),
                    "; expected a number");
  const double v = c[key].get<double>();
  SEQPAR_FILE_CHECK(std::isfinite(v) && v > 0 && v < 1, path, ": key '", key, "' is ", v,
                    "; expected a number in (0, 1)");
  return v;
}

bool bool_key(const json& c, const std::string& path, const char* key, bool fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  SEQPAR_FILE_CHECK(c[key].is_boolean(), path, ": key '", key, "' is ", json_excerpt(c[key]),
                    "; expected true or false");
  return c[key].get<bool>();
}

std::array<int64_t, 3> patch_key(const json& c, const std::string& path) {
  if (!c.contains("patch_size")) return {1, 2, 2};
  const json& p = c["patch_size"];
  SEQPAR_FILE_CHECK(p.is_array() && p.size() == 3 && p[0].is_number_integer() &&
                        p[1].is_number_integer() && p[2].is_number_integer(),
                    path, ": key 'patch_size' is ", json_excerpt(p),
                    "; expected [frames, height, width]");
  std::array<int64_t, 3> v{};
  for (int i = 0; i < 3; ++i) {
    v[i] = p[i].get<int64_t>();
    SEQPAR_FILE_CHECK(1 <= v[i] && v[i] <= 16, path, ": key 'patch_size' is ", json_excerpt(p),
                      "; expected three integers in 1..16");
  }
  return v;
}

DiTConfig new_dit_config(const std::string& name) {
  DiTConfig m;
  m.name = name;
  m.family = ModelFamily::kDiT;
  m.video = true;
  return m;
}

void finish_config(DiTConfig& m, const std::string& path) {
  m.kv_heads = m.heads;
  m.hidden = m.heads * m.head_dim;
  SEQPAR_FILE_CHECK(m.head_dim % 2 == 0, path, ": the head dimension ", m.head_dim,
                    " is odd; expected an even one (RoPE rotates pairs)");
  if (m.out_channels == 0) m.out_channels = m.in_channels;
}

// ---- config readers: diffusers' transformer/config.json, Wan's own config.json ----------------

DiTConfig diffusers_config(const json& c, const std::string& path) {
  SEQPAR_FILE_CHECK(c.contains("_class_name") && c["_class_name"] == "WanTransformer3DModel", path,
                    ": key '_class_name' is ", json_excerpt(c.value("_class_name", json())),
                    "; expected \"WanTransformer3DModel\"");
  SEQPAR_FILE_CHECK(
      !c.contains("pos_embed_seq_len") || c["pos_embed_seq_len"].is_null(), path,
      ": key 'pos_embed_seq_len' is ", json_excerpt(c.value("pos_embed_seq_len", json())),
      "; first-last-frame conditioning (Wan 2.1 FLF2V) is not supported, expected null");
  const std::string qk = string_key(c, path, "qk_norm", "rms_norm_across_heads");
  SEQPAR_FILE_CHECK(qk == "rms_norm_across_heads", path, ": key 'qk_norm' is \"",
                    quote_for_message(qk), "\"; expected \"rms_norm_across_heads\"");
  DiTConfig m = new_dit_config(path);
  m.heads = int_key(c, path, "num_attention_heads", 1, 1024, 40);
  m.head_dim = int_key(c, path, "attention_head_dim", 2, 1024, 128);
  m.in_channels = int_key(c, path, "in_channels", 1, 4096, 16);
  m.out_channels = int_key(c, path, "out_channels", 1, 4096, 16);
  m.text_dim = int_key(c, path, "text_dim", 1, 1 << 16, 4096);
  m.freq_dim = int_key(c, path, "freq_dim", 2, 1 << 16, 256);
  m.ffn_dim = int_key(c, path, "ffn_dim", 1, 1 << 20, 13824);
  m.layers = int_key(c, path, "num_layers", 1, 1024, 40);
  m.eps = float_key(c, path, "eps", 1e-6);
  m.cross_attn_norm = bool_key(c, path, "cross_attn_norm", true);
  m.patch = patch_key(c, path);
  m.text_len = 512;
  finish_config(m, path);
  // Image-to-video: image_dim (the image encoder's width) and added_kv_proj_dim (the width
  // add_k_proj / add_v_proj read: the image embedder's output, hidden) are given together.
  const bool image = c.contains("image_dim") && !c["image_dim"].is_null();
  const bool added = c.contains("added_kv_proj_dim") && !c["added_kv_proj_dim"].is_null();
  SEQPAR_FILE_CHECK(image == added, path, ": key '", image ? "added_kv_proj_dim" : "image_dim",
                    "' is null while '", image ? "image_dim" : "added_kv_proj_dim",
                    "' is set; expected both (image-to-video) or neither (text-to-video)");
  if (image) {
    m.image_dim = int_key(c, path, "image_dim", 1, 1 << 16);
    int_key(c, path, "added_kv_proj_dim", m.hidden, m.hidden);
  }
  return m;
}

DiTConfig original_config(const json& c, const std::string& path) {
  const std::string type = string_key(c, path, "model_type", "t2v");
  SEQPAR_FILE_CHECK(type == "t2v" || type == "ti2v" || type == "i2v", path,
                    ": key 'model_type' is \"", quote_for_message(type),
                    "\"; supported: \"t2v\", \"ti2v\", \"i2v\" (not flf2v, vace)");
  DiTConfig m = new_dit_config(path);
  const int64_t dim = int_key(c, path, "dim", 2, 1 << 16);
  m.heads = int_key(c, path, "num_heads", 1, 1024);
  SEQPAR_FILE_CHECK(dim % m.heads == 0, path, ": key 'dim' ", dim,
                    " is not divisible by 'num_heads' ", m.heads);
  m.head_dim = dim / m.heads;
  m.in_channels = int_key(c, path, "in_dim", 1, 4096);
  m.out_channels = int_key(c, path, "out_dim", 1, 4096);
  m.text_dim = int_key(c, path, "text_dim", 1, 1 << 16, 4096);
  m.freq_dim = int_key(c, path, "freq_dim", 2, 1 << 16);
  m.ffn_dim = int_key(c, path, "ffn_dim", 1, 1 << 20);
  m.layers = int_key(c, path, "num_layers", 1, 1024);
  m.text_len = int_key(c, path, "text_len", 1, 1 << 20, 512);
  m.eps = float_key(c, path, "eps", 1e-6);
  m.cross_attn_norm = bool_key(c, path, "cross_attn_norm", true);
  SEQPAR_FILE_CHECK(bool_key(c, path, "qk_norm", true), path,
                    ": key 'qk_norm' is false; expected true (Wan's RMS QK-norm)");
  m.patch = patch_key(c, path);
  finish_config(m, path);
  // i2v: img_emb (MLPProj) reads the image encoder's states, of img_emb.proj.0's width (1280
  // in Wan's code); open_expert sets it from that tensor.
  if (type == "i2v") m.image_dim = -1;
  return m;
}

// Opens the weights of a transformer directory: one file or the shards of an index.
void open_weights(WanExpert& e) {
  const std::string single = e.dir + "/diffusion_pytorch_model.safetensors";
  const std::string index = single + ".index.json";
  if (files::is_regular_file(single)) {
    auto f = std::make_shared<const SafetensorsFile>(single);
    for (const std::string& n : f->names()) e.tensors.emplace_back(n, f);
    return;
  }
  SEQPAR_FILE_CHECK(files::is_regular_file(index), e.dir,
                    ": holds no weights; expected diffusion_pytorch_model.safetensors or "
                    "diffusion_pytorch_model.safetensors.index.json");
  for (const auto& [name, file] : open_safetensors_index(index, e.dir))
    e.tensors.emplace_back(name, file);
}

WanExpert open_expert(const std::string& dir, WanLayout layout) {
  WanExpert e;
  e.dir = dir;
  e.layout = layout;
  const std::string config = dir + "/config.json";
  const json c = read_json(config);
  e.preset =
      layout == WanLayout::kDiffusers ? diffusers_config(c, config) : original_config(c, config);
  open_weights(e);
  // Every parameter present with its shape, and nothing DiT does not run.
  std::map<std::string, std::vector<int64_t>> stored_shape;
  for (const auto& [n, f] : e.tensors) stored_shape[n] = f->entry(n).shape;
  if (e.preset.image_dim < 0) {  // original i2v: the width img_emb reads
    auto it = stored_shape.find("img_emb.proj.0.weight");
    SEQPAR_FILE_CHECK(it != stored_shape.end() && it->second.size() == 1 && it->second[0] >= 1, dir,
                      ": tensor 'img_emb.proj.0.weight' is ",
                      it == stored_shape.end() ? "missing" : "misshapen",
                      "; expected [image_dim] for an i2v model (", config, ")");
    e.preset.image_dim = it->second[0];
  }
  const DiTConfig& m = e.preset;
  const int64_t d = m.hidden;
  std::set<std::string> expected;
  for (const WeightStore::Spec& s : DiT::parameters(m)) {
    const std::string stored = wan_stored_name(s.name, layout);
    std::vector<int64_t> want = s.shape;
    if (s.name == "patch_embedding.weight") {
      want = {d, m.in_channels, m.patch[0], m.patch[1], m.patch[2]};
    } else if (s.name.ends_with("modulation")) {  // blocks.i.modulation, head.modulation
      want = {1, s.shape[0], d};
    }
    auto it = stored_shape.find(stored);
    SEQPAR_FILE_CHECK(it != stored_shape.end(), dir, ": tensor '", stored,
                      "' is missing; expected shape ", shape_text(want));
    SEQPAR_FILE_CHECK(it->second == want, dir, ": tensor '", stored, "' has shape ",
                      shape_text(it->second), "; expected ", shape_text(want), " (from ", config,
                      ")");
    expected.insert(stored);
  }
  for (const auto& [n, shape] : stored_shape)
    SEQPAR_FILE_CHECK(expected.count(n) || (layout == WanLayout::kDiffusers &&
                                            n.find(".attn2.norm_added_q.") != std::string::npos),
                      dir, ": tensor '", quote_for_message(n), "' is not part of a Wan ",
                      m.image_dim > 0 ? "image-to-video" : "text-to-video", " transformer as ",
                      config, " describes it");
  return e;
}

}  // namespace

// ---- the weight-name maps --------------------------------------------------------------------

std::string wan_stored_name(const std::string& name, WanLayout layout) {
  if (layout == WanLayout::kOriginal) return name;
  static const std::vector<std::pair<std::string, std::string>> top = {
      {"text_embedding.0.", "condition_embedder.text_embedder.linear_1."},
      {"text_embedding.2.", "condition_embedder.text_embedder.linear_2."},
      {"time_embedding.0.", "condition_embedder.time_embedder.linear_1."},
      {"time_embedding.2.", "condition_embedder.time_embedder.linear_2."},
      {"time_projection.1.", "condition_embedder.time_proj."},
      {"head.head.", "proj_out."},
      {"img_emb.proj.0.", "condition_embedder.image_embedder.norm1."},
      {"img_emb.proj.1.", "condition_embedder.image_embedder.ff.net.0.proj."},
      {"img_emb.proj.3.", "condition_embedder.image_embedder.ff.net.2."},
      {"img_emb.proj.4.", "condition_embedder.image_embedder.norm2."},
  };
  // Inside blocks.i.: original Wan's norm3 (cross-attention) is diffusers' norm2.
  static const std::vector<std::pair<std::string, std::string>> block = {
      {"self_attn.q.", "attn1.to_q."},
      {"self_attn.k.", "attn1.to_k."},
      {"self_attn.v.", "attn1.to_v."},
      {"self_attn.o.", "attn1.to_out.0."},
      {"self_attn.norm_", "attn1.norm_"},
      {"cross_attn.q.", "attn2.to_q."},
      {"cross_attn.k.", "attn2.to_k."},
      {"cross_attn.v.", "attn2.to_v."},
      {"cross_attn.o.", "attn2.to_out.0."},
      {"cross_attn.k_img.", "attn2.add_k_proj."},
      {"cross_attn.v_img.", "attn2.add_v_proj."},
      {"cross_attn.norm_k_img.", "attn2.norm_added_k."},
      {"cross_attn.norm_", "attn2.norm_"},
      {"norm3.", "norm2."},
      {"ffn.0.", "ffn.net.0.proj."},
      {"ffn.2.", "ffn.net.2."},
  };
  if (name == "head.modulation") return "scale_shift_table";
  for (const auto& [from, to] : top)
    if (name.starts_with(from)) return to + name.substr(from.size());
  if (name.starts_with("blocks.")) {
    const size_t dot = name.find('.', 7);
    const std::string prefix = name.substr(0, dot + 1), rest = name.substr(dot + 1);
    if (rest == "modulation") return prefix + "scale_shift_table";
    for (const auto& [from, to] : block)
      if (rest.starts_with(from)) return prefix + to + rest.substr(from.size());
  }
  return name;  // patch_embedding.*
}

WanModel open_wan_model(const std::string& dir) {
  check_model_dir(dir,
                  "a diffusers WanTransformer3DModel or WanPipeline directory, or Wan's "
                  "original layout");
  WanModel w;
  if (files::is_regular_file(dir + "/model_index.json") ||
      files::is_regular_file(dir + "/transformer/config.json")) {
    w.experts.push_back(open_expert(dir + "/transformer", WanLayout::kDiffusers));
    if (files::is_regular_file(dir + "/transformer_2/config.json")) {
      w.experts.push_back(open_expert(dir + "/transformer_2", WanLayout::kDiffusers));
      const std::string index = dir + "/model_index.json";
      SEQPAR_FILE_CHECK(files::is_regular_file(index), dir,
                        ": has transformer_2 but no model_index.json; "
                        "expected one with key 'boundary_ratio'");
      w.boundary_ratio = float_key(read_json(index), index, "boundary_ratio", 0);
      SEQPAR_ARG_CHECK(*w.boundary_ratio > 0, index,
                       ": key 'boundary_ratio' is missing; expected a number in (0, 1) for the "
                       "two experts");
    }
  } else if (files::is_regular_file(dir + "/high_noise_model/config.json")) {
    // Wan 2.2 A14B as published: the experts switch at t = 875 for text-to-video.
    w.experts.push_back(open_expert(dir + "/high_noise_model", WanLayout::kOriginal));
    w.experts.push_back(open_expert(dir + "/low_noise_model", WanLayout::kOriginal));
    w.boundary_ratio = 0.875;
  } else if (files::is_regular_file(dir + "/config.json")) {
    const json c = read_json(dir + "/config.json");
    const bool diffusers = c.contains("_class_name") && c["_class_name"] == "WanTransformer3DModel";
    SEQPAR_FILE_CHECK(diffusers || c.contains("dim"), dir,
                      "/config.json: key 'dim' is missing and '_class_name' is not "
                      "\"WanTransformer3DModel\"; expected a Wan transformer config (original or "
                      "diffusers)");
    w.experts.push_back(open_expert(dir, diffusers ? WanLayout::kDiffusers : WanLayout::kOriginal));
  } else {
    throw ParamError(
        "model", "",
        detail::concat(param("model"), " ", dir,
                       ": neither a diffusers Wan checkpoint (model_index.json or "
                       "transformer/config.json) nor "
                       "an original one (config.json, or high_noise_model/ and low_noise_model/)"));
  }
  if (w.experts.size() == 2) {
    const DiTConfig &a = w.experts[0].preset, &b = w.experts[1].preset;
    SEQPAR_FILE_CHECK(a.in_channels == b.in_channels && a.out_channels == b.out_channels &&
                          a.text_dim == b.text_dim && a.patch == b.patch &&
                          a.image_dim == b.image_dim,
                      dir,
                      ": the two experts differ in channels, text width, image width or "
                      "patch size");
  }
  return w;
}

WeightStore wan_weights(const WanExpert& e) {
  const DiTConfig& m = e.preset;
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> file_of(e.tensors.begin(),
                                                                        e.tensors.end());
  WeightStore ws;
  for (const WeightStore::Spec& s : DiT::parameters(m)) {
    const std::string stored = wan_stored_name(s.name, e.layout);
    ws.map(s.name, file_of.at(stored), stored);
  }
  // Same bytes, DiT's 2-D shapes: replicated and small, so read whole (fp32) and kept.
  auto reshaped = [&](const std::string& name, std::vector<int64_t> shape) {
    ws.set(name, reshape(ws.get(name), std::move(shape)));
  };
  const int64_t d = m.hidden, P = m.patch[0] * m.patch[1] * m.patch[2], C = m.out_channels;
  reshaped("patch_embedding.weight", {d, m.in_channels * P});
  reshaped("head.modulation", {2, d});
  for (int64_t i = 0; i < m.layers; ++i)
    reshaped("blocks." + std::to_string(i) + ".modulation", {6, d});
  // head.head: stored row p·C + c (patch position p major, as Wan's unpatchify reads them) is
  // DiT's row c·P + p (channel major, as unpatchify() writes them).
  const Tensor w = ws.get("head.head.weight"), b = ws.get("head.head.bias");
  Tensor w2({C * P, d}), b2({C * P});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t p = 0; p < P; ++p) {
      std::copy_n(w.data<float>() + (p * C + c) * d, d, w2.data<float>() + (c * P + p) * d);
      b2.data<float>()[c * P + p] = b.data<float>()[p * C + c];
    }
  ws.set("head.head.weight", std::move(w2));
  ws.set("head.head.bias", std::move(b2));
  return ws;
}

FlowMatchSchedule flow_match_schedule(int steps, double shift) {
  SEQPAR_PARAM_CHECK(steps >= 1, "steps", "", param("steps"), " ", steps,
                     " is invalid; it must be at least 1");
  SEQPAR_PARAM_CHECK(std::isfinite(shift) && shift > 0, "shift", "", param("shift"), " ", shift,
                     " is invalid; it must be > 0");
  // The scheduler's training sigmas are fp32: sigma_min = shifted(1/1000), sigma_max = 1.
  const float s = static_cast<float>(shift), t_min = 1.0f / 1000.0f;
  const float sigma_min = s * t_min / (1.0f + (s - 1.0f) * t_min);
  const double t_max = 1000.0, t_lo = static_cast<double>(sigma_min) * 1000.0;
  const double step = steps == 1 ? 0.0 : (t_lo - t_max) / (steps - 1);
  FlowMatchSchedule f;
  for (int i = 0; i < steps; ++i) {
    // np.linspace(t_max, t_lo, steps) in float64 (i·step + start, the last one exact), / 1000,
    // shifted in float64, then rounded to fp32.
    const double t = i == steps - 1 && steps > 1 ? t_lo : i * step + t_max;
    const double sig = t / 1000.0;
    f.sigmas.push_back(static_cast<float>(shift * sig / (1.0 + (shift - 1.0) * sig)));
    f.timesteps.push_back(f.sigmas.back() * 1000.0f);
  }
  f.sigmas.push_back(0.0f);
  return f;
}

double wan_weight_bytes(const WanModel& model) {
  double bytes = 0;
  for (const WanExpert& e : model.experts)
    for (const auto& [name, file] : e.tensors)
      bytes += static_cast<double>(file->entry(name).nbytes());
  return bytes;
}

}  // namespace seqpar
