// seqpar denoise on a FLUX.1 checkpoint (diffusers' FluxPipeline or FluxTransformer2DModel
// directory) on a cfg x tp x ring x ulysses mesh: one transformer call as the pipeline makes it,
// fed the tensors of its call from a safetensors file:
//   IN:  hidden_states (or latents) [B, S, in_channels] (packed latents), img_ids [S, 3],
//        encoder_hidden_states [B, L, text_dim], txt_ids [L, 3], pooled_projections
//        [B, pooled_dim], timestep [B] in [0, 1], guidance [B] (FLUX.1-dev only: required when
//        the config has guidance_embeds, refused otherwise); for true CFG
//        negative_encoder_hidden_states [B, L', text_dim], negative_pooled_projections and
//        negative_txt_ids [L', 3] (default: txt_ids)
//   OUT: noise_pred [B, S, p·p·out_channels], guided as the pipeline's true CFG (neg + s·(pos −
//        neg), s = --guidance) when the negative states are given and --guidance > 1.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "mesh_run.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/core/process_memory.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/model/flux.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/safetensors.h"
#include "trace_file.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The values of tensor `name` of `f` as fp32 ids [n, 3] (shape checked by the request).
std::vector<float> ids_of(const SafetensorsFile& f, const std::string& name, const std::string& p,
                          const std::string& what) {
  SEQPAR_ARG_CHECK(f.contains(name), p, ": tensor '", name, "' is missing; expected [", what,
                   ", 3] position ids");
  const std::vector<int64_t>& shape = f.entry(name).shape;
  SEQPAR_ARG_CHECK(shape.size() == 2 && shape[1] == 3, p, ": tensor '", name, "' has shape ",
                   shape_text(shape), "; expected [", what, ", 3]");
  std::vector<float> v;
  for (const double x : tensor_values(f, name)) v.push_back(static_cast<float>(x));
  return v;
}

FluxRequest read_request(const DenoiseOptions& o, const FluxConfig& m) {
  const SafetensorsFile f(o.inputs);
  const std::string& p = o.inputs;
  const std::string hidden = f.contains("hidden_states") ? "hidden_states" : "latents";
  SEQPAR_ARG_CHECK(f.contains(hidden), p, ": tensor 'hidden_states' is missing; expected [B, S, ",
                   m.in_channels, "] (the packed latents)");
  FluxRequest r;
  r.hidden = f.tensor(hidden, DType::kF32);
  const int64_t B = r.hidden.ndim() == 3 ? r.hidden.dim(0) : 1;
  SEQPAR_ARG_CHECK(f.contains("encoder_hidden_states"), p,
                   ": tensor 'encoder_hidden_states' is missing; expected [", B, ", L, ",
                   m.text_dim, "]");
  r.text = f.tensor("encoder_hidden_states", DType::kF32);
  SEQPAR_ARG_CHECK(f.contains("pooled_projections"), p,
                   ": tensor 'pooled_projections' is missing; expected [", B, ", ", m.pooled_dim,
                   "]");
  r.pooled = f.tensor("pooled_projections", DType::kF32);
  r.img_ids = ids_of(f, "img_ids", p, "S");
  r.txt_ids = ids_of(f, "txt_ids", p, "L");
  if (f.contains("negative_encoder_hidden_states")) {
    r.negative = f.tensor("negative_encoder_hidden_states", DType::kF32);
    SEQPAR_ARG_CHECK(f.contains("negative_pooled_projections"), p,
                     ": tensor 'negative_pooled_projections' is missing; expected [", B, ", ",
                     m.pooled_dim, "] with negative_encoder_hidden_states");
    r.negative_pooled = f.tensor("negative_pooled_projections", DType::kF32);
    // The pipeline's negative_text_ids; its txt_ids when not given (both are zeros in
    // FluxPipeline).
    r.negative_txt_ids =
        f.contains("negative_txt_ids") ? ids_of(f, "negative_txt_ids", p, "L'") : r.txt_ids;
  }
  SEQPAR_ARG_CHECK(f.contains("timestep"), p, ": tensor 'timestep' is missing; expected [", B,
                   "] in [0, 1] (the pipeline's t / 1000)");
  for (const double t : tensor_values(f, "timestep")) r.timesteps.push_back(static_cast<float>(t));
  if (f.contains("guidance")) {
    SEQPAR_ARG_CHECK(m.guidance_embeds, p,
                     ": tensor 'guidance' is given but the checkpoint has guidance_embeds false "
                     "(FLUX.1-schnell embeds no guidance); expected no 'guidance'");
    for (const double g : tensor_values(f, "guidance")) r.guidance.push_back(static_cast<float>(g));
  } else {
    SEQPAR_ARG_CHECK(!m.guidance_embeds, p, ": tensor 'guidance' is missing; expected [", B,
                     "] (the checkpoint has guidance_embeds true: FLUX.1-dev's guidance scale)");
  }
  r.true_cfg = static_cast<float>(o.guidance);
  check_flux_request(m, r, p);
  return r;
}

struct Plan {
  FluxCheckpoint ck;
  ParallelConfig mesh;
};

Plan resolve(const DenoiseOptions& o, int world) {
  SEQPAR_ARG_CHECK(o.steps == 0, "--steps ", o.steps,
                   ": the sampling loop runs Wan checkpoints; for FLUX give a timestep in "
                   "--inputs (one transformer call)");
  SEQPAR_ARG_CHECK(!o.guidance_2 && !o.boundary_ratio,
                   "--guidance-2 and --boundary-ratio apply to Wan 2.2's two experts, not to "
                   "FLUX");
  SEQPAR_ARG_CHECK(std::isfinite(o.guidance) && o.guidance >= 0 && o.guidance <= 100, "--guidance ",
                   o.guidance, " is invalid; valid: 0..100");
  Plan p;
  p.ck = open_flux(o.model);
  p.mesh = resolve_mesh(o, world);
  const FluxConfig& m = p.ck.config;
  SEQPAR_ARG_CHECK(m.heads % p.mesh.mesh.tp == 0, "--tp ", p.mesh.mesh.tp, " does not divide the ",
                   m.heads, " heads of ", o.model, "; valid: ", divisors_text(m.heads));
  return p;
}

void check_cfg(const DenoiseOptions& o, const Plan& p, const FluxRequest& r) {
  SEQPAR_ARG_CHECK(p.mesh.mesh.cfg == 1 || (!r.negative.empty() && o.guidance > 1), "--cfg ",
                   p.mesh.mesh.cfg,
                   " runs the two guidance branches side by side; it needs "
                   "negative_encoder_hidden_states in --inputs and --guidance > 1");
}

struct RankResult {
  Tensor output;
  double seconds = 0, load_seconds = 0;
  std::vector<int64_t> weight_bytes, peak_rss;
  CommStats comm;
};

RankResult run_rank(Communicator& world, const Plan& p, const FluxRequest& r) {
  MeshComms mc(world, p.mesh.mesh);
  ParallelContext ctx = model_context(mc, p.mesh);
  RankResult res;
  const double t_load = now_seconds();
  const FluxRank model(p.ck, ctx);
  res.load_seconds = world.all_reduce_max(now_seconds() - t_load);
  const int64_t mine = model.weight_bytes();
  res.weight_bytes.resize(world.size());
  world.all_gather(&mine, sizeof(mine), res.weight_bytes.data());
  mc.reset_stats();
  world.barrier();
  const double t0 = now_seconds();
  {
    trace::Scope span(trace::enabled() ? "step 0" : std::string(), "denoise",
                      trace::Lane::kCompute);
    res.output = model.predict(r, ctx);
  }
  res.seconds = world.all_reduce_max(now_seconds() - t0);
  res.comm = mc.stats();
  const int64_t rss = peak_resident_bytes();
  res.peak_rss.resize(world.size());
  world.all_gather(&rss, sizeof(rss), res.peak_rss.data());
  return res;
}

int report(const DenoiseOptions& o, const Plan& p, const FluxRequest& r, const RankResult& res,
           const std::string& backend, OutputFile& output) {
  write_safetensors(output.file(), {{"noise_pred", res.output}}, {{"format", "pt"}});
  output.commit();
  const bool guided = !r.negative.empty() && o.guidance > 1;
  if (o.json) {
    json j;
    j["model"] = o.model;
    j["family"] = "flux";
    j["checkpoint_layout"] = "diffusers";
    add_mesh_json(j, p.mesh, backend, /*with_cfg=*/true);
    j["batch"] = r.hidden.dim(0);
    j["tokens"] = r.hidden.dim(1);
    j["text_tokens"] = r.text.dim(1);
    j["guided"] = guided;
    j["steps"] = 0;
    j["output"] = o.output;
    j["output_tensor"] = "noise_pred";
    j["seconds"] = res.seconds;
    j["load_seconds"] = res.load_seconds;
    j["weight_bytes_per_rank"] = res.weight_bytes;
    j["peak_rss_bytes_per_rank"] = res.peak_rss;
    j["bytes_sent_rank0"] = res.comm.total_sent();
    if (!o.trace.empty()) j["trace"] = o.trace;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar denoise: %s (FLUX.1, diffusers layout) on %s, %s backend\n",
                o.model.c_str(), mesh_shape_text(p.mesh.mesh).c_str(), backend.c_str());
    std::printf(
        "  %lld image tokens + %lld text tokens x batch %lld, %s attention, %s layout%s%s\n",
        (long long)r.hidden.dim(1), (long long)r.text.dim(1), (long long)r.hidden.dim(0),
        std::string(strategy_name(p.mesh.strategy)).c_str(),
        std::string(layout_name(p.mesh.layout)).c_str(), p.mesh.pad ? ", padded" : "",
        guided ? ", guided" : "");
    std::printf("  time     %.4f s (slowest rank)\n", res.seconds);
    std::printf("  output   %s: noise_pred %s\n", o.output.c_str(),
                shape_text(res.output.shape()).c_str());
  }
  return 0;
}

}  // namespace

int denoise_flux(const DenoiseOptions& o) {
  if (o.backend != "mpi") {
    const Plan p = resolve(o, 0);
    const FluxRequest r = read_request(o, p.ck.config);
    check_cfg(o, p, r);
    OutputFile output("--output", o.output);
    std::optional<OutputFile> trace_out;
    if (!o.trace.empty()) trace_out.emplace("--trace", o.trace);
    RankResult got;
    std::string trace_error;
    if (!o.trace.empty()) trace::start();
    run_on_threads(p.mesh.mesh.world(), [&](Communicator& world) {
      trace::set_rank(world.rank());
      RankResult res = run_rank(world, p, r);
      if (!o.trace.empty())
        write_trace(world, world.rank() == 0 ? &*trace_out : nullptr, &trace_error);
      if (world.rank() == 0) got = std::move(res);
    });
    const int code = report(o, p, r, got, "threads", output);
    if (!trace_error.empty()) {
      std::fprintf(stderr, "seqpar: error: %s\n", trace_error.c_str());
      return finish_output(1);
    }
    return finish_output(code);
  }
  Plan p;
  FluxRequest r;
  std::optional<OutputFile> output, trace_out;
  return run_on_mpi(
      o.json,
      [&](int world_size) {
        p = resolve(o, world_size);
        r = read_request(o, p.ck.config);
        check_cfg(o, p, r);
      },
      [&](Communicator& world) {
        if (world.rank() == 0) {
          output.emplace("--output", o.output);
          if (!o.trace.empty()) trace_out.emplace("--trace", o.trace);
        }
        if (!o.trace.empty()) {
          trace::set_rank(world.rank());
          trace::start();
        }
        RankResult res = run_rank(world, p, r);
        std::string trace_error;
        if (!o.trace.empty()) write_trace(world, trace_out ? &*trace_out : nullptr, &trace_error);
        if (world.rank() != 0) return 0;
        int code = report(o, p, r, res, "mpi", *output);
        if (!trace_error.empty()) {
          std::fprintf(stderr, "seqpar: error: %s\n", trace_error.c_str());
          code = 1;
        }
        return code;
      });
}

}  // namespace seqpar::cli
