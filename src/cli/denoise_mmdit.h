// seqpar denoise on a dual-stream (MMDiT) checkpoint, one transformer call as its diffusers
// pipeline makes it, for any family that gives (a traits struct):
//   Checkpoint, Request, Rank          its checkpoint, one call's inputs, a rank's model
//   kName, kJson                       its name in messages ("Qwen-Image") and in the JSON
//   open(dir) -> Checkpoint            its reader
//   read(options, checkpoint) -> Request   --inputs read and checked
// Request has hidden (B, S, F), text and negative (empty: unguided); Rank(checkpoint, ctx) has
// predict(request, ctx) and weight_bytes(). denoise_qwen_image.cc and denoise_flux.cc say the
// families' inputs; this file runs them on the threads or the MPI backend and reports.
#pragma once

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "mesh_run.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/core/process_memory.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/safetensors.h"
#include "trace_file.h"

namespace seqpar::cli::mmdit {

using nlohmann::json;

template <typename Family>
struct Plan {
  typename Family::Checkpoint ck;
  ParallelConfig mesh;
};

template <typename Family>
Plan<Family> resolve(const DenoiseOptions& o, int world) {
  SEQPAR_ARG_CHECK(o.steps == 0, "--steps ", o.steps,
                   ": the sampling loop runs Wan checkpoints; for ", Family::kName,
                   " give a timestep in --inputs (one transformer call)");
  SEQPAR_ARG_CHECK(!o.guidance_2 && !o.boundary_ratio,
                   "--guidance-2 and --boundary-ratio apply to Wan 2.2's two experts, not to ",
                   Family::kName);
  SEQPAR_ARG_CHECK(std::isfinite(o.guidance) && o.guidance >= 0 && o.guidance <= 100, "--guidance ",
                   o.guidance, " is invalid; valid: 0..100");
  Plan<Family> p;
  p.ck = Family::open(o.model);
  p.ck.activations = activations_flag(o.activations, false);
  p.mesh = resolve_mesh(o, world);
  const auto& m = p.ck.config;
  SEQPAR_ARG_CHECK(m.heads % p.mesh.mesh.tp == 0, "--tp ", p.mesh.mesh.tp, " does not divide the ",
                   m.heads, " heads of ", o.model, "; valid: ", divisors_text(m.heads));
  return p;
}

template <typename Family>
void check_cfg(const DenoiseOptions& o, const Plan<Family>& p, const typename Family::Request& r) {
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

template <typename Family>
RankResult run_rank(Communicator& world, const Plan<Family>& p, const typename Family::Request& r) {
  MeshComms mc(world, p.mesh.mesh);
  ParallelContext ctx = model_context(mc, p.mesh);
  RankResult res;
  const double t_load = now_seconds();
  const typename Family::Rank model(p.ck, ctx);
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

template <typename Family>
int report(const DenoiseOptions& o, const Plan<Family>& p, const typename Family::Request& r,
           const RankResult& res, const std::string& backend, OutputFile& output) {
  write_safetensors(output.file(), {{"noise_pred", res.output}}, {{"format", "pt"}});
  output.commit();
  const bool guided = !r.negative.empty() && o.guidance > 1;
  if (o.json) {
    json j;
    j["model"] = o.model;
    j["family"] = Family::kJson;
    j["checkpoint_layout"] = "diffusers";
    add_mesh_json(j, p.mesh, backend, /*with_cfg=*/true);
    j["batch"] = r.hidden.dim(0);
    j["tokens"] = r.hidden.dim(1);
    j["text_tokens"] = r.text.dim(1);
    j["guided"] = guided;
    j["steps"] = 0;
    j["activations"] = o.activations;
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
    std::printf("seqpar denoise: %s (%s, diffusers layout) on %s, %s backend\n", o.model.c_str(),
                Family::kName, mesh_shape_text(p.mesh.mesh).c_str(), backend.c_str());
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

template <typename Family>
int denoise_mmdit(const DenoiseOptions& o) {
  if (o.backend != "mpi") {
    const Plan<Family> p = resolve<Family>(o, 0);
    const typename Family::Request r = Family::read(o, p.ck);
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
  Plan<Family> p;
  typename Family::Request r;
  std::optional<OutputFile> output, trace_out;
  return run_on_mpi(
      o.json,
      [&](int world_size) {
        p = resolve<Family>(o, world_size);
        r = Family::read(o, p.ck);
        check_cfg(o, p, r);
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

}  // namespace seqpar::cli::mmdit
