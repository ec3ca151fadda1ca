#include "seqpar/model/presets.h"

#include <algorithm>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/dit.h"

namespace seqpar {

std::string_view model_family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kDiT: return "dit";
    case ModelFamily::kMMDiT: return "mmdit";
    case ModelFamily::kLlm: return "llm";
  }
  return "?";
}

namespace {

DiTConfig dit(std::string name, std::string desc, int64_t hidden, int64_t heads, int64_t layers,
              int64_t ffn, int64_t in_ch, std::array<int64_t, 3> vae, int64_t params) {
  DiTConfig m;
  m.name = std::move(name);
  m.description = std::move(desc);
  m.family = ModelFamily::kDiT;
  m.hidden = hidden;
  m.heads = m.kv_heads = heads;
  m.head_dim = hidden / heads;
  m.layers = layers;
  m.ffn_dim = ffn;
  m.in_channels = in_ch;
  m.vae_stride = vae;
  m.text_dim = 4096;  // umT5-XXL
  m.text_len = 512;
  m.freq_dim = 256;
  m.video = true;
  m.params = params;
  return m;
}

ModelPreset mmdit(std::string name, std::string desc, int64_t layers, int64_t text_dim,
                  int64_t text_len, int64_t ffn, int64_t in_ch, int64_t params) {
  ModelPreset m;
  m.name = std::move(name);
  m.description = std::move(desc);
  m.family = ModelFamily::kMMDiT;
  m.hidden = 3072;
  m.heads = m.kv_heads = 24;
  m.head_dim = 128;
  m.layers = layers;
  m.ffn_dim = ffn;
  m.in_channels = in_ch;
  m.patch = {1, 2, 2};
  m.vae_stride = {1, 8, 8};
  m.text_dim = text_dim;
  m.text_len = text_len;
  m.freq_dim = 256;
  m.params = params;
  return m;
}

DecoderConfig llm(std::string name, std::string desc, int64_t hidden, int64_t heads,
                  int64_t kv_heads, int64_t layers, int64_t ffn, int64_t vocab, double theta,
                  int64_t params) {
  DecoderConfig m;
  m.name = std::move(name);
  m.description = std::move(desc);
  m.family = ModelFamily::kLlm;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_dim = hidden / heads;
  m.layers = layers;
  m.ffn_dim = ffn;
  m.vocab = vocab;
  m.rope_theta = theta;
  m.params = params;
  return m;
}

// Every preset, in the order model_preset_names() lists them: the dit ones (runnable DiTs), the
// mmdit ones (shapes for the planner only), the llm ones (runnable Llama decoders).
struct Presets {
  std::vector<DiTConfig> dits;
  std::vector<ModelPreset> mmdits;
  std::vector<DecoderConfig> llms;
  std::vector<const ModelPreset*> all;
};

const Presets& presets() {
  static const Presets all = [] {
    Presets p;
    auto& v = p.dits;
    v.push_back(dit("wan2.1-t2v-1.3b", "Wan 2.1 text-to-video 1.3B", 1536, 12, 30, 8960, 16,
                    {4, 8, 8}, 1'300'000'000));
    v.push_back(dit("wan2.1-t2v-14b", "Wan 2.1 text-to-video 14B", 5120, 40, 40, 13824, 16,
                    {4, 8, 8}, 14'000'000'000));
    v.push_back(dit("wan2.2-t2v-a14b", "Wan 2.2 text-to-video A14B (two 14B experts, one active)",
                    5120, 40, 40, 13824, 16, {4, 8, 8}, 14'000'000'000));
    v.push_back(dit("wan2.2-ti2v-5b", "Wan 2.2 text/image-to-video 5B (16x16 VAE)", 3072, 24, 30,
                    14336, 48, {4, 16, 16}, 5'000'000'000));
    DiTConfig tiny =
        dit("tiny-dit", "small Wan-style DiT for tests (Wan's 4x8x8 VAE, 1x2x2 patches)", 64, 4, 2,
            128, 4, {4, 8, 8}, 0);
    tiny.text_dim = 32;
    tiny.text_len = 16;
    tiny.freq_dim = 32;
    v.push_back(tiny);
    p.mmdits.push_back(mmdit("flux.1-dev", "FLUX.1 [dev] 12B (19 dual + 38 single stream blocks)",
                             57, 4096, 512, 12288, 16, 12'000'000'000));
    p.mmdits.back().aliases = {"flux-dev"};
    p.mmdits.push_back(
        mmdit("qwen-image", "Qwen-Image 20B MMDiT", 60, 3584, 512, 12288, 16, 20'000'000'000));
    auto& l = p.llms;
    l.push_back(
        llm("llama3-8b", "Llama 3 8B", 4096, 32, 8, 32, 14336, 128256, 500000.0, 8'000'000'000));
    l.push_back(
        llm("llama3-70b", "Llama 3 70B", 8192, 64, 8, 80, 28672, 128256, 500000.0, 70'000'000'000));
    l.push_back(llm("llama3-405b", "Llama 3.1 405B", 16384, 128, 8, 126, 53248, 128256, 500000.0,
                    405'000'000'000));
    DecoderConfig l1b = llm("llama3.2-1b", "Llama 3.2 1B (tied embeddings, llama3 RoPE scaling)",
                            2048, 32, 8, 16, 8192, 128256, 500000.0, 1'235'814'400);
    l1b.max_positions = 131072;
    l1b.rope_scaling = {32.0, 1.0, 4.0, 8192};
    l1b.tie_embeddings = true;
    l.push_back(l1b);
    l.push_back(
        llm("tiny-llm", "small Llama-style decoder for tests", 64, 4, 2, 2, 128, 256, 10000.0, 0));
    for (const auto& m : p.dits) p.all.push_back(&m);
    for (const auto& m : p.mmdits) p.all.push_back(&m);
    for (const auto& m : p.llms) p.all.push_back(&m);
    return p;
  }();
  return all;
}

std::string names_text(const std::vector<std::string>& names) {
  std::string valid;
  for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
  return valid;
}

bool answers_to(const ModelPreset& m, std::string_view name) {
  return m.name == name || std::find(m.aliases.begin(), m.aliases.end(), name) != m.aliases.end();
}

// The preset named `name` of `list`, or InvalidArgument naming the valid ones.
template <typename Config>
const Config& find_preset(const std::vector<Config>& list, std::string_view name,
                          std::string_view kind) {
  std::vector<std::string> names;
  for (const auto& m : list) {
    if (answers_to(m, name)) return m;
    names.push_back(m.name);
  }
  (void)model_preset(name);  // an unknown name: the message lists every preset
  throw ParamError("model", names_text(names),
                   detail::concat(param("model"), " '", name, "' is not a ", kind,
                                  " preset; valid: ", names_text(names)));
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset* m : presets().all) names.push_back(m->name);
  return names;
}

const ModelPreset& model_preset(std::string_view name) {
  for (const ModelPreset* m : presets().all)
    if (answers_to(*m, name)) return *m;
  throw ParamError("model", names_text(model_preset_names()),
                   detail::concat(param("model"), " '", name,
                                  "' is unknown; valid: ", names_text(model_preset_names())));
}

const DecoderConfig& decoder_preset(std::string_view name) {
  return find_preset(presets().llms, name, "language model (llm)");
}

const DiTConfig& dit_preset(std::string_view name) {
  return find_preset(presets().dits, name, "dit");
}

LatentShape latent_shape(const ModelPreset& m, int64_t frames, int64_t height, int64_t width) {
  SEQPAR_PARAM_CHECK(m.family != ModelFamily::kLlm, "model", "", param("model"), " ", m.name,
                     " is a language model; give a token count, not frames x height x width");
  const int64_t st = m.vae_stride[0], sh = m.vae_stride[1] * m.patch[1],
                sw = m.vae_stride[2] * m.patch[2];
  for (auto [flag, v] :
       {std::pair{"frames", frames}, std::pair{"height", height}, std::pair{"width", width}})
    limits::check_range(flag, v, 1, limits::kMaxPixels);
  if (m.video) {
    const int64_t below = (frames - 1) / st * st + 1;
    SEQPAR_PARAM_CHECK((frames - 1) % st == 0, "frames", "", param("frames"), " ", frames,
                       " does not fit ", m.name, "'s temporal VAE stride ", st, ": frames must be ",
                       st, "k+1; nearest: ", below, " or ", below + st);
  } else {
    SEQPAR_PARAM_CHECK(frames == 1, "frames", "", param("frames"), " ", frames, ": ", m.name,
                       " is an image model; use 1");
  }
  auto nearest = [](int64_t x, int64_t m) {
    const int64_t lo = x / m * m;
    return detail::concat(lo > 0 ? std::to_string(lo) + " or " : std::string(), lo + m);
  };
  SEQPAR_PARAM_CHECK(height % sh == 0, "height", "", param("height"), " ", height,
                     " is not a multiple of ", sh, " (VAE stride x patch) for ", m.name,
                     "; nearest: ", nearest(height, sh));
  SEQPAR_PARAM_CHECK(width % sw == 0, "width", "", param("width"), " ", width,
                     " is not a multiple of ", sw, " (VAE stride x patch) for ", m.name,
                     "; nearest: ", nearest(width, sw));
  LatentShape s;
  s.latent_frames = m.video ? (frames - 1) / st + 1 : 1;
  s.latent_height = height / m.vae_stride[1];
  s.latent_width = width / m.vae_stride[2];
  s.grid = {s.latent_frames / m.patch[0], s.latent_height / m.patch[1],
            s.latent_width / m.patch[2]};
  s.tokens = limits::checked_product({s.grid[0], s.grid[1], s.grid[2]}, "latent tokens",
                                     limits::kMaxTokens);
  return s;
}

}  // namespace seqpar
