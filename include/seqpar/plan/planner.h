// The planner: every mesh of a world size (cfg x tp x ulysses x ring degrees, then each strategy
// table row that takes them with each of its schedules and the options that apply to it: Ulysses
// mode, padding, layout; softmax when pinned), costed (cost_model.h) and ranked by predicted step
// time within the memory limit; the ones that cannot run or do not fit, with the reason. Also
// what to do when the sequence does not divide the sequence-parallel size, for decode / partial
// prefill the pass-KV / pass-Q choice by Meta's rule, and the work all this takes, bounded.
// Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "seqpar/plan/cost_model.h"

namespace seqpar {

struct PlanRequest {
  Workload work;
  int world = 1;
  HardwareProfile hw;
  double memory_limit = 0;  // bytes per rank; 0: the profile's
  // Pins: 0 / empty enumerates every value.
  int cfg = 0, tp = 0, ulysses = 0, ring = 0;
  int sp = 0;  // sequence_parallel_size: ulysses x ring (0: any)
  std::optional<Strategy> strategy;
  std::optional<Layout> layout;
  std::optional<UlyssesMode> ulysses_mode;
  std::optional<bool> pad;
  // Unset: online softmax only (const-max would double the ring and usp meshes); pinned
  // const-max: ring and usp with the const-max softmax (docs/algorithms.md "const-max ring").
  std::optional<SoftmaxMode> softmax;
  // Unset: every schedule of each strategy (passq: all-gather and ring), and ring with schedule
  // steal where it balances (causal, contiguous shards, online softmax); pinned: only meshes
  // with that schedule (a strategy pinned with one it does not run is rejected with the reason).
  std::optional<ScheduleKind> schedule;
  // DiT / MMDiT inputs, for the nearest shapes that divide (0: not a DiT request).
  const ModelPreset* preset = nullptr;
  int64_t frames = 0, height = 0, width = 0;
};

struct Rejection {
  ParallelConfig config;
  bool any_layout = false;  // the reason holds for every layout (config.layout is not meaningful)
  std::string reason;
  // The reason with the parameters it names marked (core/param_error.h), for an error quoting it.
  std::string marked;
};

// A shape near the requested one whose token count divides the sequence-parallel size.
struct ShapeAlternative {
  std::string parameter;  // the request's parameter: "frames", "height", "width" or "seq"
  int64_t value = 0;
  int64_t tokens = 0;
};

// Does S divide the sequence-parallel size (world / (cfg x tp), as pinned, else the world)?
struct Divisibility {
  int64_t seq = 0;
  int sp = 1;
  int64_t remainder = 0;
  int64_t shard_floor = 0, shard_ceil = 0;
  int ranks_with_ceil = 0;        // ranks holding shard_ceil tokens (uneven shards)
  double shard_imbalance = 1;     // shard_ceil / (S / sp)
  int64_t padded_seq = 0;         // next multiple of sp
  int64_t padded_seq_zigzag = 0;  // next multiple of 2·sp
  double pad_token_overhead = 0;  // (padded - S) / S
  double pad_work_overhead = 0;   // attention work on the padded length over the real one
  std::vector<ShapeAlternative> alternatives;  // nearest shapes that divide (below, above)
};

// Meta's pass-KV / pass-Q rule (parallel/decode.h) and its All2All-aware variant; the choice is
// the variant's. C is a rank's attention rate, BW the between-node bandwidth per rank (Meta's
// setting: context-parallel ranks on different nodes).
struct DecodeChoice {
  int ranks = 0;  // sequence-parallel size the rule was applied to
  double flops_per_s = 0, bytes_per_s = 0;
  PassChoice basic;
  PassChoice all2all;
  Strategy choice = Strategy::kPassKv;
  // The cost model's step times at that size: pass-KV, all-gather pass-Q (fp32 partials back in
  // an all-to-all) and ring pass-Q (the paper's, Q blocks overlapped with compute; schedule
  // ring), and the fastest of the three (it can disagree with the rule).
  std::optional<double> passkv_step_s, passq_step_s, passq_ring_step_s;
  std::optional<Strategy> fastest;
  ScheduleKind fastest_schedule = ScheduleKind::kDefault;
};

struct Plan {
  PlanRequest request;
  Divisibility divisibility;
  std::vector<MeshCost> ranked;       // fit the memory limit, fastest first
  std::vector<MeshCost> over_memory;  // run but do not fit, smallest memory first
  std::vector<Rejection> rejected;    // cannot run
  std::optional<DecodeChoice> decode;
};

// The work of costing meshes, estimated before any is costed (docs/planner.md "Limits on
// work"). Costing a mesh builds its schedule (parallel/schedule.h: every rank's steps and an
// all-to-all's peers) and replays it, counts its attention over pairs of position runs, and goes
// through tokens one by one where a check or a schedule needs them (the Ulysses exchange lays out
// the shards' positions; work stealing plans row by row; a striped cache meets the new tokens in
// runs of different strides, counted query by query).
struct PlanWork {
  int64_t meshes = 0;
  int64_t refused = 0;    // of them, those validation refuses (costed at their validation)
  int64_t steps = 0;      // schedule entries: rank steps and all-to-all peers
  int64_t run_pairs = 0;  // position-run pairs counted
  int64_t tokens = 0;     // token positions laid out or query rows gone through one by one
  // The parts weighted by what each took on one core of a 2-core VM shared with builds.
  int64_t ns = 0;
  PlanWork& operator+=(const PlanWork& o);
  // "3 meshes (16777216 schedule steps, 67108864 run pairs, 0 tokens one by one; about 4.3 s)"
  std::string text() const;
};
// make_plan and simulate_scaling refuse more work than this (ns: 1.2 s of that core), with one
// line naming the work and what would fit, instead of running for minutes.
inline constexpr int64_t kMaxPlanWork = 1'200'000'000;

// The work of costing mesh m of workload w.
PlanWork mesh_work(const Workload& w, const ParallelConfig& m);
// The work of make_plan(req) at `world` ranks: every mesh it costs (the decode choice's too).
PlanWork plan_work(const PlanRequest& req, int world);

// Enumerates, costs and ranks. Throws InvalidArgument (one line with the cause and the nearest
// valid alternative) when the work is more than kMaxPlanWork, when no mesh can run at this world
// size, or, except for decode requests (whose pass choice stands regardless), when none fits the
// memory limit. The searches for a nearest world size stop where the work would pass
// kMaxPlanWork.
Plan make_plan(const PlanRequest& req);

// A lower bound on the memory a rank needs on any mesh of `world` ranks of req's workload (0 when
// one rank cannot run it): the nearest-world search skips sizes where it is over the limit.
double memory_floor(const PlanRequest& req, int world);

Divisibility analyse_divisibility(const PlanRequest& req);
DecodeChoice decode_choice(const PlanRequest& req);

// The known name nearest to `name` (edit distance), for "did you mean" hints.
std::string nearest_name(const std::string& name, const std::vector<std::string>& names);

}  // namespace seqpar
