// seqpar._core's models: a rank's causal LM (greedy generation of a Llama, Qwen2 or Qwen3
// directory), a rank's Wan transformer (noise prediction) and a rank's Qwen-Image or FLUX.1
// transformer (one call as diffusers' pipeline makes it), each on its rank's Comm, built from the
// library's model_run.h (and the Qwen-Image and FLUX.1 model headers) as the CLI's generate and
// denoise are. The package (python/seqpar/models.py) runs them on ThreadWorld ranks or under MPI.
//
// Thread-safety: a model belongs to its rank (the thread holding its Comm); every call releases
// the GIL while the library computes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gil.h"
#include "seqpar/core/limits.h"
#include "seqpar/model/causal_lm.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/flux.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/qwen_image.h"
#include "seqpar/model/wan.h"
#include "seqpar/parallel/config_file.h"
#include "seqpar/parallel/strategy_table.h"

namespace py = pybind11;

namespace seqpar::python {

// module.cc: the Communicator of a Comm (raises if the Comm is closed).
Communicator& communicator_of(py::handle comm);

namespace {

// One rank's model on its mesh. The Comm object is held so the communicator outlives the
// groups split from it; every call checks it is still open (a ThreadWorld comm closes after
// run()).
struct RankMesh {
  py::object comm;
  ParallelConfig mesh;
  std::unique_ptr<MeshComms> comms;
  ParallelContext ctx;
  std::string backend;  // the world's: "threads" or "mpi"

  RankMesh(py::object c, const ParallelConfig& m) : comm(std::move(c)), mesh(m) {
    Communicator& world = communicator_of(comm);
    backend = world.backend();
    SEQPAR_ARG_CHECK(world.size() == mesh.mesh.world(), "the mesh ", mesh_shape_text(mesh.mesh),
                     " needs ", mesh.mesh.world(), " ranks but comm has ", world.size());
    without_gil([&] {
      comms = std::make_unique<MeshComms>(world, mesh.mesh);
      ctx = model_context(*comms, mesh);
    });
  }
  void check_open() const { (void)communicator_of(comm); }
};

ParallelConfig mesh_of(const py::dict& d) {
  ParallelConfig c = model_mesh(d["cfg"].cast<int>(), d["tp"].cast<int>(),
                                d["ring_degree"].cast<int>(), d["ulysses_degree"].cast<int>(),
                                d["strategy"].cast<std::string>(), d["layout"].cast<std::string>(),
                                d["ulysses_mode"].cast<std::string>(), d["pad"].cast<bool>());
  c.schedule = parse_schedule_kind(d["schedule"].cast<std::string>());
  c.softmax = parse_softmax_mode(d["softmax"].cast<std::string>());
  if (c.sp() > 1) check_options(c);  // one rank runs locally and takes neither
  return c;
}

// The activations keyword (every model's from_pretrained) as a dtype; ValueError naming where
// (the class) and the valid names. int8 multiplies int8 weights only: a causal LM's weights_dtype
// "int8" or "int8-channel" (int8_weights); the diffusion models load no int8 weights.
DType activations_keyword(std::string_view where, const std::string& activations,
                          bool int8_weights = false) {
  const std::optional<DType> d = activations_named(activations);
  SEQPAR_ARG_CHECK(d.has_value(), where, ": activations '", activations,
                   "' is unknown; valid: ", activations_names("'"));
  SEQPAR_ARG_CHECK(*d != DType::kI8 || int8_weights, where,
                   ": activations 'int8' needs int8 weights (CausalLM's weights_dtype 'int8' or "
                   "'int8-channel'); valid here: 'fp32', 'bf16'");
  return *d;
}

class CausalLmRank {
 public:
  CausalLmRank(py::object comm, const std::string& dir, const py::dict& mesh,
               const std::string& weights_dtype, const std::string& activations,
               const std::string& kv_cache_dtype)
      : rank_(std::move(comm), mesh_of(mesh)) {
    const std::optional<DType> kv = kv_cache_dtype_named(kv_cache_dtype);
    SEQPAR_ARG_CHECK(kv.has_value(), "CausalLM: kv_cache_dtype '", kv_cache_dtype,
                     "' is unknown; valid: ", kv_cache_dtype_names("'"));
    kv_cache_ = *kv;
    SEQPAR_ARG_CHECK(rank_.mesh.mesh.cfg == 1, "CausalLM: cfg ", rank_.mesh.mesh.cfg,
                     " is invalid; valid: 1 (guidance branches are for diffusion models)");
    const std::optional<WeightFormat> format = weight_format_named(weights_dtype);
    SEQPAR_ARG_CHECK(format.has_value(), "CausalLM: weights_dtype '", weights_dtype,
                     "' is unknown; valid: ", weight_format_names("'"));
    const DType act =
        activations_keyword("CausalLM", activations, format != WeightFormat::kCheckpoint);
    without_gil([&] {
      ck_ = open_causal_lm(dir);
      check_causal_lm_tp(ck_, rank_.mesh.mesh.tp);
      if (weights_dtype == "int8") check_causal_lm_int8(ck_, rank_.mesh.mesh.tp);
      check_memory("from_pretrained", causal_lm_memory(ck_, rank_.mesh, 1, 1, 1).weights);
      ck_.weights.set_weight_format(*format);
      ck_.weights.set_activations(act);
      decoder_ = std::make_unique<Decoder>(ck_.config, ck_.weights, rank_.ctx);
      ck_.weights = WeightStore();  // the decoder holds its slices
    });
  }

  // (tokens [N] int64, logits [N, vocab] fp32 as bytes, stopped)
  py::tuple generate(const std::vector<int64_t>& ids, int64_t max_new_tokens, bool ignore_eos,
                     bool allow_long_context) {
    rank_.check_open();
    const std::vector<int32_t> prompt =
        check_causal_lm_prompt(ck_, ids, max_new_tokens, allow_long_context);
    Decoder::Options opts;
    opts.max_new_tokens = max_new_tokens;
    opts.kv_cache = kv_cache_;
    if (!ignore_eos) opts.stop_tokens = ck_.eos_token_ids;
    // The K/V cache of the rank that holds the most tokens, at its dtype.
    const Decoder::Footprint at_most =
        Decoder::footprint(opts, static_cast<int64_t>(prompt.size()), rank_.mesh);
    check_memory("generate", causal_lm_memory(ck_, rank_.mesh, at_most.first_chunk, at_most.cached,
                                              max_new_tokens, kv_cache_)
                                 .run);
    Decoder::Output out = without_gil([&] { return decoder_->generate(prompt, opts, rank_.ctx); });
    const int64_t vocab = ck_.config.vocab;
    std::string logits(out.logits.size() * vocab * sizeof(float), '\0');
    for (size_t i = 0; i < out.logits.size(); ++i)
      std::memcpy(logits.data() + i * vocab * sizeof(float), out.logits[i].raw(),
                  vocab * sizeof(float));
    std::vector<int64_t> tokens(out.tokens.begin(), out.tokens.end());
    return py::make_tuple(tokens, py::bytes(logits), out.stopped);
  }

  // Packed documents (Decoder::prefill_documents): (tokens [D] int64, logits [D, vocab] fp32 as
  // bytes, every row's logits [sum of lengths, vocab] fp32 as bytes or None).
  py::tuple prefill_documents(const std::vector<std::vector<int64_t>>& docs, bool all_logits,
                              bool allow_long_context) {
    rank_.check_open();
    std::vector<std::vector<int32_t>> prompts;
    int64_t total = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      CausalLmRunNames names;
      names.prompt = detail::concat("prompts[", i, "]");
      names.token = names.prompt + " token";
      // Empty documents are left to check_documents (one message for them).
      prompts.push_back(docs[i].empty() ? std::vector<int32_t>{}
                                        : check_causal_lm_prompt(ck_, docs[i], 1, true, names));
      total += static_cast<int64_t>(docs[i].size());
    }
    (void)Decoder::check_documents(ck_.config, rank_.ctx.config, prompts, allow_long_context);
    const int64_t D = static_cast<int64_t>(prompts.size());
    check_memory("prefill_documents",
                 causal_lm_memory(ck_, rank_.mesh, total, total, all_logits ? total + D : D).run);
    Decoder::DocumentsOutput out =
        without_gil([&] { return decoder_->prefill_documents(prompts, rank_.ctx, all_logits); });
    auto bytes_of = [&](const std::vector<Tensor>& rows) {
      size_t n = 0;
      for (const Tensor& t : rows) n += t.nbytes();
      std::string b(n, '\0');
      size_t at = 0;
      for (const Tensor& t : rows) {
        std::memcpy(b.data() + at, t.raw(), t.nbytes());
        at += t.nbytes();
      }
      return py::bytes(b);
    };
    std::vector<int64_t> tokens(out.tokens.begin(), out.tokens.end());
    return py::make_tuple(tokens, bytes_of(out.logits),
                          all_logits ? py::object(bytes_of(out.all_logits)) : py::none());
  }

  // The bytes of storage each rank's K/V caches hold now (Decoder::kv_cache_use), by world rank:
  // a collective, as generate's --json kv_cache_bytes_per_rank.
  std::vector<int64_t> kv_cache_bytes_per_rank() {
    Communicator& world = communicator_of(rank_.comm);  // raises if the comm is closed
    const int64_t mine = decoder_->kv_cache_use().bytes;
    std::vector<int64_t> all(world.size());
    without_gil([&] { world.all_gather(&mine, sizeof(mine), all.data()); });
    return all;
  }

  int64_t vocab() const { return ck_.config.vocab; }

 private:
  // Every rank refuses alike: the ranks on this machine together against MemAvailable.
  void check_memory(const char* call, double bytes_per_rank) const {
    limits::check_ranks_fit_memory(
        detail::concat("CausalLM.", call, " with ", ck_.dir, " (",
                       limits::bytes_text(static_cast<double>(ck_.file_bytes)), " of weights, tp ",
                       rank_.mesh.mesh.tp, ")"),
        bytes_per_rank, rank_.mesh.mesh.world(), rank_.backend);
  }

 public:
  std::vector<int64_t> eos_token_ids() const { return ck_.eos_token_ids; }
  int64_t max_positions() const { return ck_.config.max_positions; }
  std::string family() const { return std::string(ck_.family->name); }
  std::string architecture() const { return std::string(ck_.family->architecture); }

 private:
  RankMesh rank_;
  CausalLmCheckpoint ck_;
  DType kv_cache_ = DType::kF32;  // kv_cache_dtype
  std::unique_ptr<Decoder> decoder_;
};

// A caller's contiguous fp32 array by address and shape (borrowed for the call).
Tensor f32_view(uintptr_t address, const std::vector<int64_t>& shape) {
  if (address == 0) return Tensor();
  return Tensor::borrow(reinterpret_cast<const void*>(address), shape, DType::kF32);
}

class WanTransformerRank {
 public:
  WanTransformerRank(py::object comm, const std::string& dir, const py::dict& mesh,
                     py::object boundary_ratio, const std::string& activations)
      : rank_(std::move(comm), mesh_of(mesh)) {
    const DType act = activations_keyword("WanTransformer", activations);
    if (!boundary_ratio.is_none()) {
      const double r = boundary_ratio.cast<double>();
      SEQPAR_ARG_CHECK(r > 0 && r < 1, "boundary_ratio ", r, " is invalid; valid: (0, 1)");
      ratio_ = r;
    }
    without_gil([&] {
      model_ = open_wan_model(dir);
      model_.activations = act;
      const DiTConfig& m = model_.experts[0].preset;
      SEQPAR_ARG_CHECK(m.heads % rank_.mesh.mesh.tp == 0, "tp ", rank_.mesh.mesh.tp,
                       " does not divide the ", m.heads, " heads of ", dir,
                       "; valid: ", divisors_text(m.heads));
      if (model_.experts.size() == 2 && !ratio_) ratio_ = *model_.boundary_ratio;
      const double weights = wan_weight_bytes(model_);  // tp splits the matrices
      limits::check_ranks_fit_memory(
          detail::concat("WanTransformer.from_pretrained with ", dir, " (",
                         limits::bytes_text(weights), " of weights, tp ", rank_.mesh.mesh.tp, ")"),
          weights / rank_.mesh.mesh.tp, rank_.mesh.mesh.world(), rank_.backend);
      wan_ = std::make_unique<WanRank>(model_, rank_.ctx);
    });
  }

  // Velocity (B, C_out, F, H, W) fp32 as (bytes, shape), guided when negative is given and the
  // expert's scale is > 1 (on a cfg mesh of 2 unguided, both groups compute the one prediction).
  // image: encoder_hidden_states_image (B, 257, image_dim) of an image-to-video model, or 0.
  py::tuple forward(uintptr_t latents, const std::vector<int64_t>& latents_shape,
                    const std::vector<float>& timesteps, uintptr_t text,
                    const std::vector<int64_t>& text_shape, uintptr_t negative,
                    const std::vector<int64_t>& negative_shape, uintptr_t image,
                    const std::vector<int64_t>& image_shape, double guidance,
                    py::object guidance_2) {
    rank_.check_open();
    const Tensor x = f32_view(latents, latents_shape), t = f32_view(text, text_shape),
                 n = f32_view(negative, negative_shape), im = f32_view(image, image_shape);
    const WanGuidance g = guidance_of(guidance, guidance_2);
    return velocity_bytes(without_gil([&] {
      check_inputs(x, timesteps, t, n, im);
      return wan_->velocity(x, timesteps, t, n, g, rank_.ctx, im);
    }));
  }

  // The two branches unguided, (cond, uncond), each as forward's (bytes, shape): on a cfg mesh
  // of 2 in one parallel call.
  py::tuple branches(uintptr_t latents, const std::vector<int64_t>& latents_shape,
                     const std::vector<float>& timesteps, uintptr_t text,
                     const std::vector<int64_t>& text_shape, uintptr_t negative,
                     const std::vector<int64_t>& negative_shape, uintptr_t image,
                     const std::vector<int64_t>& image_shape) {
    rank_.check_open();
    const Tensor x = f32_view(latents, latents_shape), t = f32_view(text, text_shape),
                 n = f32_view(negative, negative_shape), im = f32_view(image, image_shape);
    SEQPAR_ARG_CHECK(!n.empty(), "branches need negative_encoder_hidden_states");
    const WanGuidance g = guidance_of(1.0, py::none());
    const std::array<Tensor, 2> v = without_gil([&] {
      check_inputs(x, timesteps, t, n, im);
      return wan_->branches(x, timesteps, t, n, g, rank_.ctx, im);
    });
    return py::make_tuple(velocity_bytes(v[0]), velocity_bytes(v[1]));
  }

  // Raises the ValueError forward and branches would for these inputs.
  void check(uintptr_t latents, const std::vector<int64_t>& latents_shape,
             const std::vector<float>& timesteps, uintptr_t text,
             const std::vector<int64_t>& text_shape, uintptr_t negative,
             const std::vector<int64_t>& negative_shape, uintptr_t image,
             const std::vector<int64_t>& image_shape) const {
    without_gil([&] {
      check_inputs(f32_view(latents, latents_shape), timesteps, f32_view(text, text_shape),
                   f32_view(negative, negative_shape), f32_view(image, image_shape));
    });
  }

  // The config under diffusers' WanTransformer3DModel names, and seqpar's: experts, layout,
  // boundary_ratio.
  py::dict config() const {
    const DiTConfig& m = model_.experts[0].preset;
    py::dict d;
    d["patch_size"] = py::make_tuple(m.patch[0], m.patch[1], m.patch[2]);
    d["num_attention_heads"] = m.heads;
    d["attention_head_dim"] = m.head_dim;
    d["in_channels"] = m.in_channels;
    d["out_channels"] = m.predicted_channels();
    d["text_dim"] = m.text_dim;
    d["freq_dim"] = m.freq_dim;
    d["ffn_dim"] = m.ffn_dim;
    d["num_layers"] = m.layers;
    d["cross_attn_norm"] = m.cross_attn_norm;
    d["eps"] = m.eps;
    d["image_dim"] = m.image_dim > 0 ? py::cast(m.image_dim) : py::none();
    d["added_kv_proj_dim"] = m.image_dim > 0 ? py::cast(m.hidden) : py::none();
    d["experts"] = model_.experts.size();
    d["layout"] = std::string(wan_layout_name(model_.experts[0].layout));
    d["boundary_ratio"] = ratio_ ? py::cast(*ratio_) : py::none();
    return d;
  }

 private:
  WanGuidance guidance_of(double guidance, py::object guidance_2) const {
    WanGuidance g;
    for (auto [name, v] : {std::pair{"guidance_scale", guidance},
                           std::pair{"guidance_scale_2",
                                     guidance_2.is_none() ? guidance : guidance_2.cast<double>()}})
      SEQPAR_ARG_CHECK(std::isfinite(v) && v >= 0 && v <= 100, name, " ", v,
                       " is invalid; valid: 0..100");
    g.guidance = static_cast<float>(guidance);
    g.guidance_2 = static_cast<float>(guidance_2.is_none() ? guidance : guidance_2.cast<double>());
    g.boundary = ratio_.value_or(0) * 1000.0;
    return g;
  }

  void check_inputs(const Tensor& x, const std::vector<float>& timesteps, const Tensor& t,
                    const Tensor& n, const Tensor& image) const {
    const DiTConfig& m = model_.experts[0].preset;
    check_wan_inputs(m, x, t, n, "WanTransformer.forward", image, m.image_dim);
    SEQPAR_ARG_CHECK(static_cast<int64_t>(timesteps.size()) == x.dim(0),
                     "WanTransformer.forward: timestep has ", timesteps.size(),
                     " values; expected one or [", x.dim(0), "]");
    for (float tb : timesteps)
      SEQPAR_ARG_CHECK(std::isfinite(tb) && tb >= 0 && tb <= 1000,
                       "WanTransformer.forward: timestep ", tb, " is invalid; valid: 0..1000");
  }

  static py::tuple velocity_bytes(const Tensor& v) {
    return py::make_tuple(py::bytes(static_cast<const char*>(v.raw()), v.nbytes()), v.shape());
  }

  RankMesh rank_;
  WanModel model_;
  std::optional<double> ratio_;
  std::unique_ptr<WanRank> wan_;
};

// A dual-stream rank's call in `mode`, the request checked first, as (bytes, shape) tuples:
// "check": (); "predict": (the prediction,); "branches": (conditional, unconditional).
template <typename Rank, typename Request, typename Check>
py::tuple mmdit_call(const Rank& model, const Request& r, ParallelContext& ctx,
                     const std::string& mode, Check&& check) {
  const std::vector<Tensor> out = without_gil([&] {
    check();
    if (mode == "check") return std::vector<Tensor>{};
    if (mode == "predict") return std::vector<Tensor>{model.predict(r, ctx)};
    const std::array<Tensor, 2> v = model.branches(r, ctx);
    return std::vector<Tensor>{v[0], v[1]};
  });
  py::tuple t(out.size());
  for (size_t i = 0; i < out.size(); ++i)
    t[i] = py::make_tuple(py::bytes(static_cast<const char*>(out[i].raw()), out[i].nbytes()),
                          out[i].shape());
  return t;
}

// A rank's Qwen-Image transformer: one call of diffusers' QwenImageTransformer2DModel per batch
// row, guided as QwenImagePipeline's true CFG when negative states are given.
class QwenImageTransformerRank {
 public:
  QwenImageTransformerRank(py::object comm, const std::string& dir, const py::dict& mesh,
                           const std::string& activations)
      : rank_(std::move(comm), mesh_of(mesh)) {
    const DType act = activations_keyword("QwenImageTransformer", activations);
    without_gil([&] {
      ck_ = open_qwen_image(dir);
      ck_.activations = act;
      const QwenImageConfig& m = ck_.config;
      SEQPAR_ARG_CHECK(m.heads % rank_.mesh.mesh.tp == 0, "tp ", rank_.mesh.mesh.tp,
                       " does not divide the ", m.heads, " heads of ", dir,
                       "; valid: ", divisors_text(m.heads));
      const double weights = qwen_image_weight_bytes(ck_);
      limits::check_ranks_fit_memory(
          detail::concat("QwenImageTransformer.from_pretrained with ", dir, " (",
                         limits::bytes_text(weights), " of weights, tp ", rank_.mesh.mesh.tp, ")"),
          weights / rank_.mesh.mesh.tp, rank_.mesh.mesh.world(), rank_.backend);
      model_ = std::make_unique<QwenImageRank>(ck_, rank_.ctx);
    });
  }

  // mode "predict": (the noise prediction (B, S, out) as (bytes, shape),); "branches": (cond,
  // uncond) unguided; "check": () once the request is checked.
  py::tuple forward(uintptr_t hidden, const std::vector<int64_t>& hidden_shape,
                    const std::vector<float>& timesteps,
                    const std::vector<std::array<int64_t, 3>>& images, uintptr_t text,
                    const std::vector<int64_t>& text_shape, const std::vector<int64_t>& text_lens,
                    uintptr_t negative, const std::vector<int64_t>& negative_shape,
                    const std::vector<int64_t>& negative_lens, double guidance,
                    const std::string& mode) {
    rank_.check_open();
    QwenImageRequest r;
    r.hidden = f32_view(hidden, hidden_shape);
    r.timesteps = timesteps;
    r.images = images;
    r.text = f32_view(text, text_shape);
    r.text_lens = text_lens;
    r.negative = f32_view(negative, negative_shape);
    r.negative_lens = negative_lens;
    r.guidance = static_cast<float>(guidance);
    return mmdit_call(*model_, r, rank_.ctx, mode, [&] {
      check_qwen_image_request(ck_.config, r, "QwenImageTransformer.forward");
    });
  }

  // The config under diffusers' QwenImageTransformer2DModel names.
  py::dict config() const {
    const QwenImageConfig& m = ck_.config;
    py::dict d;
    d["patch_size"] = m.patch_size();
    d["in_channels"] = m.in_channels;
    d["out_channels"] = m.out_channels;
    d["num_layers"] = m.layers;
    d["attention_head_dim"] = m.head_dim;
    d["num_attention_heads"] = m.heads;
    d["joint_attention_dim"] = m.text_dim;
    d["guidance_embeds"] = false;
    d["axes_dims_rope"] = py::make_tuple(m.axes_dims[0], m.axes_dims[1], m.axes_dims[2]);
    return d;
  }

 private:
  RankMesh rank_;
  QwenImageCheckpoint ck_;
  std::unique_ptr<QwenImageRank> model_;
};

// A rank's FLUX.1 transformer: one call of diffusers' FluxTransformer2DModel per batch row,
// guided as FluxPipeline's true CFG when negative states are given.
class FluxTransformerRank {
 public:
  FluxTransformerRank(py::object comm, const std::string& dir, const py::dict& mesh,
                      const std::string& activations)
      : rank_(std::move(comm), mesh_of(mesh)) {
    const DType act = activations_keyword("FluxTransformer", activations);
    without_gil([&] {
      ck_ = open_flux(dir);
      ck_.activations = act;
      const FluxConfig& m = ck_.config;
      SEQPAR_ARG_CHECK(m.heads % rank_.mesh.mesh.tp == 0, "tp ", rank_.mesh.mesh.tp,
                       " does not divide the ", m.heads, " heads of ", dir,
                       "; valid: ", divisors_text(m.heads));
      double weights = 0;
      for (const auto& [name, file] : ck_.tensors)
        weights += static_cast<double>(file->entry(name).nbytes());
      limits::check_ranks_fit_memory(
          detail::concat("FluxTransformer.from_pretrained with ", dir, " (",
                         limits::bytes_text(weights), " of weights, tp ", rank_.mesh.mesh.tp, ")"),
          weights / rank_.mesh.mesh.tp, rank_.mesh.mesh.world(), rank_.backend);
      model_ = std::make_unique<FluxRank>(ck_, rank_.ctx);
    });
  }

  // Tensors by (address, shape), ids as (rows·3) lists. mode "predict": (the noise prediction
  // (B, S, out) as (bytes, shape),); "branches": (cond, negative) unguided; "check": () once the
  // request is checked.
  py::tuple forward(uintptr_t hidden, const std::vector<int64_t>& hidden_shape,
                    const std::vector<float>& img_ids, const std::vector<float>& timesteps,
                    uintptr_t text, const std::vector<int64_t>& text_shape,
                    const std::vector<float>& txt_ids, uintptr_t pooled,
                    const std::vector<int64_t>& pooled_shape, const std::vector<float>& guidance,
                    uintptr_t negative, const std::vector<int64_t>& negative_shape,
                    const std::vector<float>& negative_txt_ids, uintptr_t negative_pooled,
                    const std::vector<int64_t>& negative_pooled_shape, double true_cfg,
                    const std::string& mode) {
    rank_.check_open();
    FluxRequest r;
    r.hidden = f32_view(hidden, hidden_shape);
    r.img_ids = img_ids;
    r.timesteps = timesteps;
    r.text = f32_view(text, text_shape);
    r.txt_ids = txt_ids;
    r.pooled = f32_view(pooled, pooled_shape);
    r.guidance = guidance;
    r.negative = f32_view(negative, negative_shape);
    r.negative_txt_ids = negative_txt_ids;
    r.negative_pooled = f32_view(negative_pooled, negative_pooled_shape);
    r.true_cfg = static_cast<float>(true_cfg);
    return mmdit_call(*model_, r, rank_.ctx, mode,
                      [&] { check_flux_request(ck_.config, r, "FluxTransformer.forward"); });
  }

  // The config under diffusers' FluxTransformer2DModel names.
  py::dict config() const {
    const FluxConfig& m = ck_.config;
    py::dict d;
    d["patch_size"] = m.patch_size();
    d["in_channels"] = m.in_channels;
    d["out_channels"] = m.out_channels;
    d["num_layers"] = m.layers;
    d["num_single_layers"] = m.single_layers;
    d["attention_head_dim"] = m.head_dim;
    d["num_attention_heads"] = m.heads;
    d["joint_attention_dim"] = m.text_dim;
    d["pooled_projection_dim"] = m.pooled_dim;
    d["guidance_embeds"] = m.guidance_embeds;
    d["axes_dims_rope"] = py::make_tuple(m.axes_dims[0], m.axes_dims[1], m.axes_dims[2]);
    return d;
  }

 private:
  RankMesh rank_;
  FluxCheckpoint ck_;
  std::unique_ptr<FluxRank> model_;
};

}  // namespace

void bind_models(py::module_& m) {
  py::class_<CausalLmRank>(m, "_CausalLMRank")
      .def(py::init<py::object, const std::string&, const py::dict&, const std::string&,
                    const std::string&, const std::string&>())
      .def("generate", &CausalLmRank::generate)
      .def("prefill_documents", &CausalLmRank::prefill_documents)
      .def("kv_cache_bytes_per_rank", &CausalLmRank::kv_cache_bytes_per_rank)
      .def_property_readonly("vocab_size", &CausalLmRank::vocab)
      .def_property_readonly("eos_token_ids", &CausalLmRank::eos_token_ids)
      .def_property_readonly("max_position_embeddings", &CausalLmRank::max_positions)
      .def_property_readonly("family", &CausalLmRank::family)
      .def_property_readonly("architecture", &CausalLmRank::architecture);
  py::class_<WanTransformerRank>(m, "_WanTransformerRank")
      .def(py::init<py::object, const std::string&, const py::dict&, py::object,
                    const std::string&>())
      .def("forward", &WanTransformerRank::forward)
      .def("branches", &WanTransformerRank::branches)
      .def("check", &WanTransformerRank::check)
      .def_property_readonly("config", &WanTransformerRank::config);
  py::class_<QwenImageTransformerRank>(m, "_QwenImageTransformerRank")
      .def(py::init<py::object, const std::string&, const py::dict&, const std::string&>())
      .def("forward", &QwenImageTransformerRank::forward)
      .def_property_readonly("config", &QwenImageTransformerRank::config);
  py::class_<FluxTransformerRank>(m, "_FluxTransformerRank")
      .def(py::init<py::object, const std::string&, const py::dict&, const std::string&>())
      .def("forward", &FluxTransformerRank::forward)
      .def_property_readonly("config", &FluxTransformerRank::config);
  m.def("_check_model_mesh", [](const py::dict& mesh) { (void)mesh_of(mesh); });
  // (cfg, tp, ring_degree, ulysses_degree) of the degrees given (None: not given), as the CLI
  // resolves its flags: sequence_parallel_size is ulysses_degree x ring_degree.
  m.def("_resolve_degrees",
        [](std::optional<int64_t> cfg, std::optional<int64_t> tp, std::optional<int64_t> ring,
           std::optional<int64_t> ulysses, std::optional<int64_t> sp) {
          const MeshShape d = resolve_degrees({cfg, tp, ring, ulysses, sp, std::nullopt});
          return py::make_tuple(d.cfg, d.tp, d.ring, d.ulysses);
        });
  m.def("_flow_match_schedule", [](int64_t steps, double shift) {
    limits::check_range("num_inference_steps", steps, 1, limits::kMaxSteps);
    SEQPAR_ARG_CHECK(std::isfinite(shift) && shift > 0 && shift <= 100, "shift ", shift,
                     " is invalid; valid: (0, 100]");
    const FlowMatchSchedule s = flow_match_schedule(static_cast<int>(steps), shift);
    return py::make_tuple(s.sigmas, s.timesteps);
  });
  // core/limits.h's bounds, for the package's checks of its keywords (the CLI's bounds).
  py::dict bounds;
  bounds["ranks"] = limits::kMaxRanks;
  bounds["threads"] = limits::kMaxThreads;
  bounds["tokens"] = limits::kMaxTokens;
  bounds["heads"] = limits::kMaxHeads;
  bounds["steps"] = limits::kMaxSteps;
  m.attr("_LIMITS") = bounds;
}

}  // namespace seqpar::python
