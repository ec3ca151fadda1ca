// A planning question as users ask it (a model preset and its input shape, or one bare attention
// call; the world size; pinned degrees), resolved into a PlanRequest, and the plan as the one JSON
// object `seqpar plan --json` prints and the Python module's seqpar.plan() returns as a dict.
// Names follow the API (seqpar.plan's keywords); the command line's flags map onto them.
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "seqpar/model/presets.h"
#include "seqpar/plan/hardware.h"
#include "seqpar/plan/planner.h"
#include "seqpar/plan/simulate.h"

namespace seqpar {

struct PlanSpec {
  std::string model;                          // preset; empty: one bare attention call
  int64_t frames = 0, height = 0, width = 0;  // dit / mmdit input (frames 0: 1 for images)
  int64_t seq = 0;  // tokens (llm prompt, bare attention, or dit tokens directly)
  int64_t heads = 0, kv_heads = 0, head_dim = 128;  // bare attention (kv_heads 0: heads)
  int64_t batch = 1;
  bool causal = false;                 // bare attention
  std::optional<int64_t> text_tokens;  // mmdit joint text tokens (unset: the preset's; bare: 0)
  bool guidance = true;                // dit / mmdit: two branches (classifier-free guidance)
  int64_t ranks = 8;
  std::optional<int64_t> ranks_per_node;  // unset: the hardware profile's
  double memory_limit_gb = 0;             // 0: the profile's
  std::string dtype;                      // empty: the profile's
  int64_t cfg = 0, tp = 0, ulysses_degree = 0, ring_degree = 0;  // 0: enumerate
  int64_t sequence_parallel_size = 0;  // ulysses_degree x ring_degree (0: enumerate)
  std::string strategy, layout, ulysses_mode;                    // empty: enumerate
  std::string softmax;  // empty: online; "const-max": ring and usp with const-max
  std::string schedule;  // empty: every schedule that applies; pinned: only it (parse_schedule_kind)
  std::optional<bool> pad;                                       // unset: both
  int64_t cached = 0, fresh = 0;  // decode / partial prefill: cached tokens P, new tokens T
};

struct ResolvedPlanSpec {
  PlanRequest req;
  std::optional<LatentShape> latent;  // dit / mmdit given by frames x height x width
};

// Checks every size against core/limits.h and resolves the preset, the workload and the pins on
// the hardware profile `hw` (InvalidArgument naming the parameter and what is valid).
ResolvedPlanSpec resolve_plan_spec(const PlanSpec& spec, HardwareProfile hw);

// The scaling simulation beside the plan (plan/simulate.h) on the layout, cfg and tp pinned (else
// zigzag for a causal workload, contiguous otherwise; cfg and tp 1), at the sequence-parallel
// sizes `sim_ranks` ("FIRST:LAST", doubling; InvalidArgument naming sim_ranks and the last size
// that fits when plan and simulation together would pass the planning limit), or, empty, from 8
// doubling up to 1024 as far as that limit allows (Simulation::note says where it stopped).
// on_mesh as simulate_scaling's.
Simulation plan_simulation(const ResolvedPlanSpec& r, const std::string& sim_ranks,
                           const std::function<void(int64_t done, int64_t total)>& on_mesh = {});
// The title of the simulation's SVG chart: model, tokens, hardware.
std::string simulation_title(const ResolvedPlanSpec& r);

// The `seqpar plan --json` object: the workload, divisibility, the ranked meshes (per-rank lists,
// collectives and memory for the first `top`, 0: all), those over the memory limit, the rejected
// ones, the decode choice, and the simulation when `sim` is given.
std::string plan_json(const ResolvedPlanSpec& r, const Plan& plan, const Simulation* sim,
                      int top);

}  // namespace seqpar
