// seqpar model: runs a transformer (dit or llm preset) on a cfg x tp x ring x ulysses mesh, and
// with --verify compares it with the same model on one rank.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "commands.h"
#include "mesh_run.h"
#include "progress.h"
#include "seqpar/core/timer.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/safetensors.h"
#include "seqpar/parallel/mesh.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

// What a run produced on rank 0 (for comparison and the report).
struct ModelResult {
  Tensor output;                       // dit: the sample (or velocity); llm: all logits stacked
  std::vector<int32_t> tokens;         // llm
  std::vector<Decoder::Chunk> chunks;  // llm
  double seconds = 0;
  int64_t seq = 0;
  CommStats comm;  // rank 0's traffic over all mesh groups
};

struct Resolved {
  ModelPreset preset;
  ParallelConfig mesh;
  MeshShape shape;
  Strategy strategy = Strategy::kRing;
  Layout layout = Layout::kContiguous;
  std::vector<WeightStore::Spec> specs;
  Decoder::Options chunking;  // llm: max_new_tokens, --prefill-chunk, --chunk-strategy, --hardware
};

// --seq-lens: seeded documents of those lengths (the same on every rank and run).
std::vector<std::vector<int32_t>> document_prompts(const ModelOptions& o, int64_t vocab) {
  std::mt19937_64 rng(o.seed + 3);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : o.seq_lens) {
    prompts.emplace_back(len);
    for (auto& t : prompts.back()) t = static_cast<int32_t>(rng() % vocab);
  }
  return prompts;
}

int64_t total_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s = limits::checked_add(s, x, "--seq-lens");
  return s;
}

// Sizes against core/limits.h, before anything is sized by them.
void validate(const ModelOptions& o) {
  using limits::check_range;
  check_range("--frames", o.frames, 1, limits::kMaxPixels);
  check_range("--height", o.height, 1, limits::kMaxPixels);
  check_range("--width", o.width, 1, limits::kMaxPixels);
  check_range("--steps", o.steps, 1, limits::kMaxSteps);
  check_range("--decode", o.decode, 1, limits::kMaxSteps);
  check_range("--prompt-len", o.prompt_len, 1, limits::kMaxTokens);
  for (int64_t len : o.seq_lens) check_range("--seq-lens length", len, 1, limits::kMaxTokens);
  check_range("--guidance", static_cast<double>(o.guidance), 0.0, 100.0);
}

// Bytes the run holds: the fp32 weights (every rank of the threads backend shares them; MPI
// processes each hold them, usually on one machine), activations, an llm's K/V caches (every
// rank's, at --kv-cache-dtype; --verify's one-rank reference holds no more) and the logits kept
// for the report; refused when the machine lacks them. Checked arithmetic: a preset's shapes are
// trusted but their product is not.
void check_model_memory(const Resolved& r, const ModelOptions& o, int64_t tokens,
                        int64_t processes) {
  using limits::checked_product;
  int64_t params = 0;
  for (const auto& spec : r.specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n = limits::checked_mul(n, d, "parameter count");
    params = limits::checked_add(params, n, "parameter count");
  }
  const ModelPreset& m = r.preset;
  const double weights = 4.0 * static_cast<double>(params) * processes;
  const double activations = 4.0 * static_cast<double>(tokens) *
                             (16.0 * m.hidden + 2.0 * m.ffn_dim + 2.0 * m.heads * tokens / 1024);
  const bool llm = m.family == ModelFamily::kLlm;
  const bool cached = llm && o.seq_lens.empty();  // packed documents keep no cache
  const double logits = llm ? 8.0 * o.decode * static_cast<double>(m.vocab) : 0;
  const int tp = r.shape.tp;
  const double caches =
      cached ? tp * Decoder::cache_bytes(decoder_preset(m.name), tp, tokens, r.chunking.kv_cache)
             : 0;
  limits::check_fits_memory(
      detail::concat("model ", m.name, " (", params, " parameters, fp32, ", tokens, " tokens",
                     cached ? ", K/V cache " + o.kv_cache_dtype : "", ")"),
      weights + activations * (o.verify ? 2 : 1) + caches + logits);
}

Resolved resolve(const ModelOptions& o, int world) {
  validate(o);
  Resolved r;
  r.mesh = resolve_mesh(o, world);
  const std::vector<std::string> names = model_preset_names();
  if (std::find(names.begin(), names.end(), o.preset) == names.end()) {
    std::string valid;
    for (const std::string& n : names) valid += (valid.empty() ? "" : ", ") + n;
    throw InvalidArgument(detail::concat("--preset '", o.preset, "' is unknown; valid: ", valid));
  }
  r.preset = model_preset(o.preset);
  r.shape = r.mesh.mesh;
  r.strategy = r.mesh.strategy;
  r.layout = r.mesh.layout;
  SEQPAR_ARG_CHECK(r.preset.family != ModelFamily::kLlm || r.shape.cfg == 1, "--cfg ", r.shape.cfg,
                   ": classifier-free guidance is for diffusion models; use --cfg 1 with ",
                   r.preset.name);
  SEQPAR_ARG_CHECK(r.preset.family != ModelFamily::kMMDiT, "model ", r.preset.name,
                   " (mmdit) is available to `seqpar plan` only; runnable presets: the dit and "
                   "llm ones (tiny-dit, tiny-llm, wan2.1-t2v-1.3b, llama3-8b, ...)");
  SEQPAR_ARG_CHECK(r.preset.heads % r.shape.tp == 0, "--tp ", r.shape.tp, " does not divide the ",
                   r.preset.heads, " heads of ", r.preset.name,
                   "; valid: ", divisors_text(r.preset.heads));
  SEQPAR_ARG_CHECK(r.preset.family == ModelFamily::kLlm || o.prefill_chunk == 0,
                   "--prefill-chunk is for llm presets (tiny-llm, llama3-8b, ...), not ",
                   r.preset.name);
  SEQPAR_ARG_CHECK(r.preset.family == ModelFamily::kLlm || o.kv_cache_dtype == "fp32",
                   "--kv-cache-dtype is for llm presets (tiny-llm, llama3-8b, ...), not ",
                   r.preset.name);
  if (!o.seq_lens.empty()) {
    SEQPAR_ARG_CHECK(r.preset.family == ModelFamily::kLlm, "--seq-lens (packed documents) is for ",
                     "llm presets (tiny-llm, llama3-8b, ...), not ", r.preset.name);
    SEQPAR_ARG_CHECK(!o.decode_given && o.prefill_chunk == 0 && o.kv_cache_dtype == "fp32",
                     "--seq-lens prefill packed documents in one pass and decode nothing after ",
                     "them (several sequences' caches are not supported): leave out --decode, ",
                     "--prefill-chunk and --kv-cache-dtype");
    (void)Decoder::check_documents(decoder_preset(r.preset.name), r.mesh,
                                   document_prompts(o, r.preset.vocab), true, {"--seq-lens"});
  }
  apply_chunk_flags(o, r.chunking);
  r.chunking.max_new_tokens = o.decode;
  r.specs = r.preset.family == ModelFamily::kDiT
                ? DiT::parameters(dit_preset(r.preset.name))
                : Decoder::parameters(decoder_preset(r.preset.name));
  int64_t tokens = o.prompt_len + o.decode;
  if (!o.seq_lens.empty()) tokens = total_of(o.seq_lens);
  if (r.preset.family == ModelFamily::kDiT)
    tokens = latent_shape(r.preset, o.frames, o.height, o.width).tokens;
  check_model_memory(r, o, tokens, world == 0 ? 1 : world);
  return r;
}

// One model run on `world` (every rank calls it); rank 0's result. `reference`: --verify's
// one-rank run (with --seq-lens: each document alone).
ModelResult run_model(Communicator& world, const Resolved& r, const ModelOptions& o,
                      const WeightStore& ws, MeshShape shape, bool reference) {
  const std::string what =
      shape.world() == 1 && r.shape.world() > 1 ? "the one-rank reference" : "the mesh";
  Progress progress("model", o.json || world.rank() != 0);
  progress.phase("running " + what);
  MeshComms mc(world, shape);
  ParallelContext ctx = model_context(mc, r.mesh);
  ModelResult res;
  world.barrier();
  mc.reset_stats();
  const double t0 = now_seconds();
  if (r.preset.family == ModelFamily::kDiT) {
    const DiTConfig& m = dit_preset(r.preset.name);
    LatentShape s = latent_shape(m, o.frames, o.height, o.width);
    Tensor latent = random_normal(
        {1, m.in_channels, s.latent_frames, s.latent_height, s.latent_width}, o.seed + 1);
    Tensor text = random_normal({1, m.text_len, m.text_dim}, o.seed + 2);
    Tensor null_text({1, m.text_len, m.text_dim});
    DiT dit(m, ws, ctx);
    res.output = dit.sample(latent, o.steps, text, null_text, o.guidance, ctx);
    res.seq = s.tokens;
  } else if (!o.seq_lens.empty()) {
    // Packed documents on the mesh; the reference prefills each document alone.
    const std::vector<std::vector<int32_t>> prompts = document_prompts(o, r.preset.vocab);
    Decoder dec(decoder_preset(r.preset.name), ws, ctx);
    std::vector<Tensor> logits;
    if (reference) {
      for (const std::vector<int32_t>& p : prompts) {
        Decoder::Output one = dec.generate(p, 0, ctx);
        res.tokens.push_back(one.tokens[0]);
        logits.push_back(std::move(one.logits[0]));
      }
    } else {
      Decoder::DocumentsOutput docs = dec.prefill_documents(prompts, ctx);
      res.tokens = docs.tokens;
      logits = std::move(docs.logits);
    }
    res.output = Tensor({static_cast<int64_t>(logits.size()), r.preset.vocab});
    for (size_t i = 0; i < logits.size(); ++i)
      std::copy_n(logits[i].data<float>(), r.preset.vocab,
                  res.output.data<float>() + i * r.preset.vocab);
    res.seq = total_of(o.seq_lens);
  } else {
    std::mt19937_64 rng(o.seed + 3);
    std::vector<int32_t> prompt(o.prompt_len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % r.preset.vocab);
    Decoder dec(decoder_preset(r.preset.name), ws, ctx);
    // The single-rank reference (--verify) takes the prompt whole, unless the cache is rounded to
    // 16 bits: then the chunks after the first attend rounded keys, values and queries, which the
    // whole prompt's attention does not, and the reference takes the same chunks.
    Decoder::Options opts = r.chunking;
    if (shape.world() == 1 && r.shape.world() > 1 && opts.kv_cache == DType::kF32)
      opts.prefill_chunk = 0;
    if (progress.on())
      opts.on_token = [&](int64_t tokens, double, double) {
        progress.step(tokens, opts.max_new_tokens, "tokens of " + what);
      };
    Decoder::Output out = dec.generate(prompt, opts, ctx);
    res.tokens = out.tokens;
    res.chunks = out.chunks;
    res.output = Tensor({static_cast<int64_t>(out.logits.size()), r.preset.vocab});
    for (size_t i = 0; i < out.logits.size(); ++i)
      std::copy_n(out.logits[i].data<float>(), r.preset.vocab,
                  res.output.data<float>() + i * r.preset.vocab);
    res.seq = o.prompt_len;
  }
  res.seconds = world.all_reduce_max(now_seconds() - t0);
  res.comm = mc.stats();
  return res;
}

// JSON has no NaN or Inf (nlohmann writes null, which reads as "not verified"): a non-finite
// error is written as the string "nan", "inf" or "-inf".
json error_json(double err) {
  if (std::isfinite(err)) return json(err);
  return json(std::isnan(err) ? "nan" : err > 0 ? "inf" : "-inf");
}

// The root mean square of the output's elements (a fingerprint of the result in the JSON).
double rms(const Tensor& t) {
  const Tensor f = t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
  double sum = 0;
  for (int64_t i = 0; i < f.numel(); ++i) sum += double(f.data<float>()[i]) * f.data<float>()[i];
  return f.numel() > 0 ? std::sqrt(sum / static_cast<double>(f.numel())) : 0.0;
}

int report(const ModelOptions& o, const Resolved& r, const ModelResult& got,
           const ModelResult* single, const std::string& backend) {
  double err = NAN;
  bool tokens_match = true;
  if (single) {
    err = max_abs_diff(got.output, single->output);
    tokens_match = got.tokens == single->tokens;
  }
  // A NaN or Inf error (non-finite outputs) always fails.
  const bool ok = !single || (std::isfinite(err) && err <= 1e-4 && tokens_match);
  if (o.json) {
    json j;
    j["preset"] = r.preset.name;
    j["family"] = model_family_name(r.preset.family);
    add_mesh_json(j, r.mesh, backend, /*with_cfg=*/true);
    j["seq"] = got.seq;
    j["seconds"] = got.seconds;
    j["bytes_sent_rank0"] = got.comm.total_sent();
    j["max_abs_err"] = single ? error_json(err) : json(nullptr);
    j["output_rms"] = error_json(rms(got.output));
    j["ok"] = ok;
    if (r.preset.family == ModelFamily::kLlm) {
      if (!o.seq_lens.empty()) j["seq_lens"] = o.seq_lens;
      j["tokens"] = got.tokens;
      j["tokens_match"] = single ? json(tokens_match) : json(nullptr);
      j["kv_cache_dtype"] = o.kv_cache_dtype;
      j["prefill_chunks"] = chunks_json(got.chunks);
    } else {
      j["steps"] = o.steps;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar model: %s (%s) on %s, %s backend\n", r.preset.name.c_str(),
                std::string(model_family_name(r.preset.family)).c_str(),
                mesh_shape_text(r.shape).c_str(), backend.c_str());
    if (!o.seq_lens.empty())
      std::printf("  %zu packed documents (--seq-lens), each attending itself\n",
                  o.seq_lens.size());
    std::printf("  %lld tokens, %s attention, %s layout%s\n", (long long)got.seq,
                std::string(strategy_name(r.strategy)).c_str(),
                std::string(layout_name(r.layout)).c_str(), o.pad ? ", padded" : "");
    std::printf("  time     %.4f s (slowest rank)\n", got.seconds);
    if (r.preset.family == ModelFamily::kLlm) {
      std::printf("  tokens  ");
      for (int32_t t : got.tokens) std::printf(" %d", t);
      std::printf("\n");
    }
    if (single)
      std::printf("  verify   max abs err %.3g vs one rank%s%s: %s\n", err,
                  o.seq_lens.empty() ? "" : " (each document alone)",
                  r.preset.family == ModelFamily::kLlm
                      ? (tokens_match ? ", tokens identical" : ", TOKENS DIFFER")
                      : "",
                  ok ? "ok" : "FAILED");
  }
  std::fflush(stdout);
  return ok ? 0 : 1;
}

WeightStore load_weights(const ModelOptions& o, const Resolved& r) {
  if (o.weights) return WeightStore::from_safetensors(*o.weights, r.specs);
  return WeightStore::random(r.specs, o.seed);
}

// --save-weights: the weights in use, written atomically.
void save_weights(const ModelOptions& o, const WeightStore& ws) {
  OutputFile saved("--save-weights", o.save_weights);
  write_safetensors(saved.file(), ws.all());
  saved.commit();
}

}  // namespace

void add_model_command(CLI::App& app, ModelOptions& o) {
  CLI::App* m = app.add_subcommand(
      "model", "Run a transformer (dit or llm preset) on a cfg x tp x ring x ulysses mesh");
  m->add_option("--preset", o.preset, "tiny-dit | tiny-llm | wan2.1-t2v-1.3b | llama3-8b | ...");
  m->add_option_function<std::string>(
      "--weights", [&o](const std::string& v) { o.weights = v; },
      "safetensors file (default: seeded random weights)");
  m->add_option("--save-weights,--save_weights", o.save_weights,
                "write the weights used to this safetensors file");
  add_mesh_flags(m, o, true);
  m->add_option("--frames", o.frames, "dit: video frames (4k+1)");
  m->add_option("--height", o.height, "dit: height in pixels");
  m->add_option("--width", o.width, "dit: width in pixels");
  m->add_option("--steps", o.steps, "dit: denoising steps");
  m->add_option("--guidance", o.guidance, "dit: classifier-free guidance scale");
  m->add_option("--prompt-len,--prompt_len", o.prompt_len, "llm: prompt tokens (prefill)");
  m->add_option("--decode", o.decode,
                "llm: tokens generated after the prompt (the prefill gives the first, each decode "
                "step one more)")
      ->each([&o](const std::string&) { o.decode_given = true; });
  m->add_option("--seq-lens,--seq_lens", o.seq_lens,
                "llm: packed documents of these lengths (e.g. 300,1,77; seeded tokens) prefilled "
                "together instead of --prompt-len, each attending itself; the tokens are each "
                "one's next token, nothing decoded after")
      ->delimiter(',');
  add_chunk_flags(m, o);
  m->add_option("--seed", o.seed, "seed of weights and inputs");
  m->add_flag("--verify", o.verify,
              "compare with the same model on one rank (llm: the prompt whole; --seq-lens: each "
              "document alone)");
  m->add_flag("--json", o.json, "print one JSON object");
  guard_integer_options(m);
}

namespace {

int run_model_command(const ModelOptions& o) {
  if (o.backend != "mpi") {
    Resolved r = resolve(o, 0);
    const int n = r.shape.world();
    WeightStore ws = load_weights(o, r);
    if (!o.save_weights.empty()) save_weights(o, ws);
    ModelResult got, single;
    run_on_threads(n, [&](Communicator& world) {
      ModelResult res = run_model(world, r, o, ws, r.shape, false);
      if (world.rank() == 0) got = std::move(res);
    });
    if (o.verify)
      run_on_threads(
          1, [&](Communicator& world) { single = run_model(world, r, o, ws, MeshShape{}, true); });
    return finish_output(report(o, r, got, o.verify ? &single : nullptr, "threads"));
  }
  Resolved r;
  WeightStore ws;
  return run_on_mpi(
      o.json,
      [&](int world_size) {
        r = resolve(o, world_size);
        ws = load_weights(o, r);
      },
      [&](Communicator& world) {
        // Rank 0 saves the weights (every rank holds them all) before the run, as on threads.
        if (!o.save_weights.empty())
          if (const int code = on_rank0_first(world, o.json, [&] { save_weights(o, ws); }))
            return code;
        ModelResult got = run_model(world, r, o, ws, r.shape, false);
        // The single-rank reference runs on rank 0 alone.
        std::unique_ptr<Communicator> alone = world.split(world.rank() == 0 ? 0 : 1, world.rank());
        if (world.rank() != 0) return 0;
        ModelResult single;
        if (o.verify) single = run_model(*alone, r, o, ws, MeshShape{}, true);
        return report(o, r, got, o.verify ? &single : nullptr, "mpi");
      });
}

}  // namespace

int model_command(const ModelOptions& o) {
  return with_json_errors(o.json, [&] { return run_model_command(o); });
}

}  // namespace seqpar::cli
