// seqpar denoise: a Wan checkpoint (diffusers or original layout) on a cfg x tp x ring x ulysses
// mesh, fed the latents and text embeddings of a safetensors file:
//   IN:  latents [B, C, F, H, W], encoder_hidden_states [B, L, text_dim],
//        negative_encoder_hidden_states [B, L', text_dim] (guidance), timestep [B] (one call),
//        encoder_hidden_states_image [B, 257, image_dim] (image-to-video checkpoints only; the
//        text states then hold 512 tokens)
//   OUT: noise_pred [B, C_out, F, H, W] (one call, guided when the negative states are given and
//        --guidance > 1, as WanPipeline combines them), or latents after --steps K Euler steps of
//        diffusers' FlowMatchEulerDiscreteScheduler with --shift (experts switched at the
//        boundary as WanPipeline does).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "mesh_run.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/process_memory.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/model/diffusion_family.h"
#include "seqpar/model/dit.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/ops.h"
#include "seqpar/model/safetensors.h"
#include "seqpar/model/wan.h"
#include "trace_file.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

// Reads and checks IN against the model (model_run.h's read_wan_inputs).
WanInputs read_inputs(const DenoiseOptions& o, const DiTConfig& m) {
  return read_wan_inputs(o.inputs, m, o.steps,
                         std::max(o.guidance, o.guidance_2.value_or(o.guidance)));
}

struct Plan {
  WanModel model;
  ParallelConfig mesh;
  FlowMatchSchedule schedule;  // sampling loop only
  double boundary = 0;         // timestep where the second expert takes over (experts: 2)
  bool guide = false;          // two branches combined with the guidance scale
};

Plan resolve(const DenoiseOptions& o, int world) {
  SEQPAR_ARG_CHECK(!o.model.empty(), "--model is required: a Wan checkpoint directory");
  SEQPAR_ARG_CHECK(!o.inputs.empty(),
                   "--inputs is required: a safetensors file with latents, "
                   "encoder_hidden_states and timestep");
  SEQPAR_ARG_CHECK(!o.output.empty(), "--output is required: the safetensors file to write");
  limits::check_range("--steps", o.steps, 0, limits::kMaxSteps);
  for (auto [flag, v] : {std::pair{"--guidance", o.guidance},
                         std::pair{"--guidance-2", o.guidance_2.value_or(o.guidance)}})
    SEQPAR_ARG_CHECK(std::isfinite(v) && v >= 0 && v <= 100, flag, " ", v,
                     " is invalid; valid: 0..100");
  SEQPAR_ARG_CHECK(std::isfinite(o.shift) && o.shift > 0 && o.shift <= 100, "--shift ", o.shift,
                   " is invalid; valid: (0, 100]");
  SEQPAR_ARG_CHECK(!o.boundary_ratio || (*o.boundary_ratio > 0 && *o.boundary_ratio < 1),
                   "--boundary-ratio ", o.boundary_ratio.value_or(0), " is invalid; valid: (0, 1)");
  Plan p;
  p.model = open_wan_model(o.model);
  p.model.activations = activations_flag(o.activations, false);
  const DiTConfig& m = p.model.experts[0].preset;
  p.mesh = resolve_mesh(o, world);
  SEQPAR_ARG_CHECK(m.heads % p.mesh.mesh.tp == 0, "--tp ", p.mesh.mesh.tp, " does not divide the ",
                   m.heads, " heads of ", o.model, "; valid: ", divisors_text(m.heads));
  if (p.model.experts.size() == 2)
    p.boundary = o.boundary_ratio.value_or(*p.model.boundary_ratio) * 1000.0;
  if (o.steps > 0) {
    SEQPAR_ARG_CHECK(m.in_channels == m.out_channels, o.model, ": predicts ", m.out_channels,
                     " channels from ", m.in_channels,
                     "; the sampling loop needs them equal (use one call with a timestep)");
    p.schedule = flow_match_schedule(static_cast<int>(o.steps), o.shift);
  }
  return p;
}

// Before a tensor is read: per rank its share of the experts' weights as stored (tp splits the
// matrices), the inputs in fp32, the latents' copies (the state, a velocity, a guidance branch)
// and a block's activations over its part of the tokens; all ranks on this machine together
// against MemAvailable.
void check_memory(const DenoiseOptions& o, const Plan& p) {
  const DiTConfig& m = p.model.experts[0].preset;
  const double weights = wan_weight_bytes(p.model);
  const SafetensorsFile f(o.inputs);
  double inputs = 0, latents = 0, tokens = 0;
  for (const std::string& name : f.names()) {
    const double bytes = 4.0 * static_cast<double>(f.entry(name).numel());
    inputs += bytes;
    if (name != "latents") continue;
    latents = bytes;
    const std::vector<int64_t>& s = f.entry(name).shape;
    if (s.size() == 5)
      tokens = static_cast<double>(s[0]) * std::ceil(static_cast<double>(s[2]) / m.patch[0]) *
               std::ceil(static_cast<double>(s[3]) / m.patch[1]) *
               std::ceil(static_cast<double>(s[4]) / m.patch[2]);
  }
  const double tp = static_cast<double>(p.mesh.mesh.tp), sp = static_cast<double>(p.mesh.sp());
  const double activations =
      4.0 * std::ceil(tokens / sp) * (10.0 * m.hidden + 2.0 * static_cast<double>(m.ffn_dim) / tp);
  limits::check_ranks_fit_memory(
      detail::concat("denoise with ", o.model, " (", limits::bytes_text(weights),
                     " of weights, --tp ", p.mesh.mesh.tp, ") on ", o.inputs, " (",
                     limits::bytes_text(inputs), " in fp32)"),
      weights / tp + inputs + 3.0 * latents + activations, p.mesh.mesh.world(), o.backend);
}

// One rank's work; every rank returns the output, rank 0 of world reports.
struct RankResult {
  Tensor output;
  std::vector<double> step_seconds;  // slowest rank's
  std::vector<float> step_timesteps;
  std::vector<int> step_expert;
  std::vector<int64_t> weight_bytes;  // per rank: bytes of weights it read
  std::vector<int64_t> peak_rss;      // per rank: its process's peak RSS (threads share one)
  CommStats comm;
  double load_seconds = 0;
};

RankResult run_rank(Communicator& world, const Plan& p, const WanInputs& in,
                    const DenoiseOptions& o, bool report) {
  MeshComms mc(world, p.mesh.mesh);
  ParallelContext ctx = model_context(mc, p.mesh);
  RankResult res;
  const double t_load = now_seconds();
  const WanRank wan(p.model, ctx);
  res.load_seconds = world.all_reduce_max(now_seconds() - t_load);
  const int64_t mine = wan.weight_bytes();
  res.weight_bytes.resize(world.size());
  world.all_gather(&mine, sizeof(mine), res.weight_bytes.data());

  const int64_t B = in.latents.dim(0);
  WanGuidance guidance;
  guidance.guidance = static_cast<float>(o.guidance);
  guidance.guidance_2 = static_cast<float>(o.guidance_2.value_or(o.guidance));
  guidance.boundary = p.boundary;
  auto velocity = [&](const Tensor& latents, const std::vector<float>& t) {
    return wan.velocity(latents, t, in.text, in.negative, guidance, ctx, in.image);
  };
  auto timed = [&](auto&& body, size_t i, size_t n, float t) {
    world.barrier();
    const double t0 = now_seconds();
    body();
    const double s = world.all_reduce_max(now_seconds() - t0);
    res.step_seconds.push_back(s);
    if (report)
      std::fprintf(stderr, "seqpar denoise: step %zu/%zu  t=%.1f  %.3f s\n", i + 1, n, t, s);
  };

  mc.reset_stats();
  if (o.steps == 0) {
    timed([&] { res.output = velocity(in.latents, in.timestep); }, 0, 1, in.timestep[0]);
    res.step_timesteps.push_back(in.timestep[0]);
    res.step_expert.push_back(wan.expert_at(in.timestep[0], guidance));
  } else {
    Tensor x = in.latents;
    const auto& sig = p.schedule.sigmas;
    const size_t n = p.schedule.timesteps.size();
    for (size_t i = 0; i < n; ++i) {
      const float t = p.schedule.timesteps[i];
      timed(
          [&] {
            trace::Scope span(trace::enabled() ? "step " + std::to_string(i) : std::string(),
                              "denoise", trace::Lane::kCompute);
            const Tensor v = velocity(x, std::vector<float>(B, t));
            const float dt = sig[i + 1] - sig[i];
            for (int64_t j = 0; j < x.numel(); ++j) x.data<float>()[j] += dt * v.data<float>()[j];
          },
          i, n, t);
      res.step_timesteps.push_back(t);
      res.step_expert.push_back(wan.expert_at(t, guidance));
    }
    res.output = std::move(x);
  }
  res.comm = mc.stats();
  const int64_t rss = peak_resident_bytes();
  res.peak_rss.resize(world.size());
  world.all_gather(&rss, sizeof(rss), res.peak_rss.data());
  return res;
}

int report(const DenoiseOptions& o, const Plan& p, const WanInputs& in, const RankResult& r,
           const std::string& backend, OutputFile& output) {
  const std::string out_name = o.steps == 0 ? "noise_pred" : "latents";
  write_safetensors(output.file(), {{out_name, r.output}}, {{"format", "pt"}});
  output.commit();
  double total = 0;
  for (double s : r.step_seconds) total += s;
  const ModelPreset& m = p.model.experts[0].preset;
  const int64_t tokens = in.latents.dim(2) / m.patch[0] * (in.latents.dim(3) / m.patch[1]) *
                         (in.latents.dim(4) / m.patch[2]);
  if (o.json) {
    json j;
    j["model"] = o.model;
    j["checkpoint_layout"] = wan_layout_name(p.model.experts[0].layout);
    j["experts"] = p.model.experts.size();
    add_mesh_json(j, p.mesh, backend, /*with_cfg=*/true);
    j["batch"] = in.latents.dim(0);
    j["tokens"] = tokens;
    j["steps"] = o.steps;
    j["activations"] = o.activations;
    j["output"] = o.output;
    j["output_tensor"] = out_name;
    j["seconds"] = total;
    j["load_seconds"] = r.load_seconds;
    j["step_seconds"] = r.step_seconds;
    j["step_timesteps"] = r.step_timesteps;
    j["step_expert"] = r.step_expert;
    j["weight_bytes_per_rank"] = r.weight_bytes;
    j["peak_rss_bytes_per_rank"] = r.peak_rss;
    j["bytes_sent_rank0"] = r.comm.total_sent();
    if (!o.trace.empty()) j["trace"] = o.trace;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar denoise: %s (%s layout, %zu expert%s) on %s, %s backend\n", o.model.c_str(),
                std::string(wan_layout_name(p.model.experts[0].layout)).c_str(),
                p.model.experts.size(), p.model.experts.size() == 1 ? "" : "s",
                mesh_shape_text(p.mesh.mesh).c_str(), backend.c_str());
    std::printf("  %lld tokens x batch %lld, %s attention, %s layout%s\n", (long long)tokens,
                (long long)in.latents.dim(0), std::string(strategy_name(p.mesh.strategy)).c_str(),
                std::string(layout_name(p.mesh.layout)).c_str(), p.mesh.pad ? ", padded" : "");
    std::printf("  time     %.4f s over %zu transformer step%s (slowest rank)\n", total,
                r.step_seconds.size(), r.step_seconds.size() == 1 ? "" : "s");
    std::printf("  output   %s: %s %s\n", o.output.c_str(), out_name.c_str(),
                shape_text(r.output.shape()).c_str());
  }
  return 0;
}

// --cfg 2 runs the two guidance branches side by side: both must be there.
void check_cfg(const DenoiseOptions& o, const Plan& p, const WanInputs& in) {
  SEQPAR_ARG_CHECK(p.mesh.mesh.cfg == 1 || (!in.negative.empty() && o.guidance > 1), "--cfg ",
                   p.mesh.mesh.cfg,
                   " runs the two guidance branches side by side; it needs "
                   "negative_encoder_hidden_states in --inputs and --guidance > 1");
}

int run_threads(const DenoiseOptions& o) {
  Plan p = resolve(o, 0);
  check_memory(o, p);
  const WanInputs in = read_inputs(o, p.model.experts[0].preset);
  check_cfg(o, p, in);
  // Both outputs are checked before the work (neither may be an input; their folders must take
  // a file); they appear when written.
  OutputFile output("--output", o.output);
  std::optional<OutputFile> trace_out;
  if (!o.trace.empty()) trace_out.emplace("--trace", o.trace);
  RankResult got;
  std::string trace_error;
  if (!o.trace.empty()) trace::start();
  run_on_threads(p.mesh.mesh.world(), [&](Communicator& world) {
    trace::set_rank(world.rank());
    RankResult r = run_rank(world, p, in, o, world.rank() == 0);
    if (!o.trace.empty())
      write_trace(world, world.rank() == 0 ? &*trace_out : nullptr, &trace_error);
    if (world.rank() == 0) got = std::move(r);
  });
  const int code = report(o, p, in, got, "threads", output);
  if (!trace_error.empty()) {
    std::fprintf(stderr, "seqpar: error: %s\n", trace_error.c_str());
    return finish_output(1);
  }
  return finish_output(code);
}

int run_mpi(const DenoiseOptions& o) {
  Plan p;
  WanInputs in;
  std::optional<OutputFile> output, trace_out;
  return run_on_mpi(
      o.json,
      [&](int world_size) {
        p = resolve(o, world_size);
        check_memory(o, p);
        in = read_inputs(o, p.model.experts[0].preset);
        check_cfg(o, p, in);
      },
      [&](Communicator& world) {
        // Rank 0 opens the outputs before any other collective; a refused one ends every rank.
        if (const int code = on_rank0_first(world, o.json, [&] {
              output.emplace("--output", o.output);
              if (!o.trace.empty()) trace_out.emplace("--trace", o.trace);
            }))
          return code;
        if (!o.trace.empty()) {
          trace::set_rank(world.rank());
          trace::start();
        }
        RankResult r = run_rank(world, p, in, o, world.rank() == 0);
        std::string trace_error;
        if (!o.trace.empty()) write_trace(world, trace_out ? &*trace_out : nullptr, &trace_error);
        if (world.rank() != 0) return 0;
        int code = report(o, p, in, r, "mpi", *output);
        if (!trace_error.empty()) {
          std::fprintf(stderr, "seqpar: error: %s\n", trace_error.c_str());
          code = 1;
        }
        return code;
      });
}

}  // namespace

void add_denoise_command(CLI::App& app, DenoiseOptions& o) {
  CLI::App* d = app.add_subcommand(
      "denoise",
      "Run a Wan checkpoint on latents and text embeddings (noise prediction or a "
      "flow-matching sampling loop) on a cfg x tp x ring x ulysses mesh");
  d->add_option("--model", o.model, "Wan checkpoint directory (diffusers or original layout)");
  d->add_option("--inputs", o.inputs,
                "safetensors: latents [B,C,F,H,W], encoder_hidden_states [B,L,D], optional "
                "negative_encoder_hidden_states, timestep [B] (without --steps), "
                "encoder_hidden_states_image [B,257,image_dim] (image-to-video)");
  d->add_option("--output", o.output, "safetensors to write: noise_pred, or latents with --steps");
  add_mesh_flags(d, o, /*with_cfg=*/true);
  d->add_option("--steps", o.steps, "Euler steps of the flow-matching loop (0: one call)");
  d->add_option("--guidance", o.guidance,
                "classifier-free guidance scale (used when > 1 and the negative states are given)");
  d->add_option_function<double>(
      "--guidance-2,--guidance_2", [&o](double v) { o.guidance_2 = v; },
      "guidance of the low-noise expert (two-expert models; default --guidance)");
  d->add_option("--shift", o.shift, "the scheduler's flow shift");
  d->add_option_function<double>(
      "--boundary-ratio,--boundary_ratio", [&o](double v) { o.boundary_ratio = v; },
      "two-expert models: switch at timestep ratio x 1000 (default: the checkpoint's)");
  d->add_option("--activations", o.activations, kActivationsHelp);
  d->add_flag("--json", o.json, "print one JSON object");
  d->add_option("--trace", o.trace, "write a Chrome/Perfetto trace (JSON) of the steps");
  guard_integer_options(d);
}

int denoise_command(const DenoiseOptions& o) {
  return with_json_errors(o.json, [&] {
    const DiffusionFamily family =
        o.model.empty() ? DiffusionFamily::kWan : diffusion_family(o.model);
    if (family == DiffusionFamily::kQwenImage) return denoise_qwen_image(o);
    if (family == DiffusionFamily::kFlux) return denoise_flux(o);
    return o.backend == "mpi" ? run_mpi(o) : run_threads(o);
  });
}

}  // namespace seqpar::cli
