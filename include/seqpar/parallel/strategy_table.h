// The strategy table: one row per strategy, each strategy said once. A row holds the strategy's
// name, its traits (over a sequence or a K/V cache, whether it has a ring of K/V blocks, which
// degrees it takes), the schedules it accepts (each with its schedule function and its run
// function) and its own shape check. Everything that asks "which strategies ..." loops over the
// table: the validation of a configuration, the degree defaults, the one entry point's dispatch
// (cp_attention.h), the schedules (schedule.h attention_schedule) and the planner's enumeration.
//
// Adding a strategy (or a schedule of one): its run and schedule functions in a file of its own
// (declared in strategies.h), its enum value and name (config.h, config.cc), its row here
// (strategy_table.cc), the file in src/parallel/CMakeLists.txt. The planner, the runner, the
// models and the Python module find it in the table.
// Thread-safety: the table is immutable; the functions are pure.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "seqpar/parallel/config.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/schedule.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// What a run function gets on one rank: the group's communicators, where the tokens are, this
// rank's tensors and the options derived from the configuration (cp_options).
//   over a sequence: q (B, n_r, H, D), k and v (B, n_r, Hkv, D) at place.part.positions(r);
//   over a cache:    q (B, |q_pos(r)|, H, D), k and v (B, |kv_pos(r)|, Hkv, D).
struct StrategyArgs {
  SpComms& comms;
  const Placement& place;
  const TensorView& q;  // any strides: the sequence strategies read them where they lie
  const TensorView& k;
  const TensorView& v;
  const CpOptions& opts;
  CpStats* stats;
};
// -> this rank's state: out (B, |q_pos(r)|, H, D), lse (B, |q_pos(r)|, H).
using RunFn = AttnState (*)(const StrategyArgs& args);
// The schedule of config c (degrees filled) on shape s, the group's view (after tp).
using ScheduleFn = Schedule (*)(const ParallelConfig& c, const AttnShape& s);
// The strategy's own checks of a configuration and shape (InvalidArgument), beyond the checks
// every strategy shares (validate_config); null when it has none.
using CheckFn = void (*)(const ParallelConfig& c, const AttnShape& s);

// Where the planner proposes a schedule the request does not pin: where it can help.
using HelpsFn = bool (*)(const AttnShape& s, SoftmaxMode softmax);

// What a schedule adds to its strategy's host bookkeeping, for the planner's estimate of its own
// time (plan/planner.cc mesh_work): the peers each rank exchanges with beyond the strategy's, and
// whether it plans the sequence token by token.
struct HostWork {
  int64_t peers_per_rank = 0;
  bool per_token = false;
};

// One schedule of a strategy: how its steps are ordered, what it runs.
struct ScheduleRow {
  ScheduleKind kind;
  std::string_view summary;
  ScheduleFn schedule;
  RunFn run;
  // Where this schedule applies beyond the strategy's (null: wherever the strategy does);
  // InvalidArgument naming what does not fit.
  CheckFn check;
  HelpsFn helps = nullptr;  // null: wherever it applies
  HostWork host = {};
};

// The degrees of the sequence-parallel group a strategy takes.
enum class SpDegrees {
  kOne,         // local: one rank
  kRing,        // ring_degree = the group (ulysses_degree 1)
  kUlysses,     // ulysses_degree = the group (ring_degree 1)
  kUlyssesRing  // ulysses_degree x ring_degree = the group
};

struct StrategyRow {
  Strategy strategy;
  std::string_view summary;
  bool over_cache;  // new tokens over a K/V cache (cached, new) instead of a sharded sequence
  bool has_ring;    // K/V blocks pass around a ring: softmax const-max applies
  bool gathers_kv;  // holds the whole sequence's K/V (or its heads' share) at once
  SpDegrees degrees;
  std::span<const ScheduleRow> schedules;  // the default first
  CheckFn check;
};

std::span<const StrategyRow> strategy_table();
const StrategyRow& strategy_row(Strategy s);
// The schedule row of kind k of strategy s; InvalidArgument naming the schedules s accepts.
const ScheduleRow& schedule_row(Strategy s, ScheduleKind k);

// Traits of the table, by name.
bool runs_over_cache(Strategy s);
bool has_ring(Strategy s);
bool uses_ulysses(Strategy s);  // takes ulysses_degree: ulysses, usp
bool schedule_applies(ScheduleKind k, Strategy s);

// The strategy that degrees imply on a model's mesh: the row taking both degrees when ulysses
// and ring are both above 1 (usp), the one taking ulysses alone when only ulysses is (ulysses),
// else `ring_axis` (a row over a sequence taking ring_degree alone: ring or allgather;
// InvalidArgument otherwise).
Strategy strategy_for_degrees(int ulysses, int ring, Strategy ring_axis);

// The degrees of a sequence-parallel group of n ranks running c.strategy, those left 0 in c.mesh
// filled by the row's SpDegrees: ulysses x ring = n (both 0: ulysses the largest divisor of n that
// divides heads); ulysses n, ring 1; ring n, ulysses 1. InvalidArgument (naming ulysses_degree and
// ring_degree and what would fit) when the given degrees do not.
void fill_sp_degrees(ParallelConfig& c, int n, int64_t heads);

// Everything about c and s that can be checked before a rank starts, in one place: the fields
// (check_config_fields), the strategy against the degrees and the kind of call (sequence or
// cache), the options against the strategy (const-max needs a ring, the schedule must be one the
// strategy accepts), then the strategy's and the schedule's own checks. InvalidArgument with one
// line naming what was wrong and what would be valid.
void validate_config(const ParallelConfig& c, const AttnShape& s);
// The options of c (softmax, schedule) against c.strategy, where no shape is known yet (a model's
// mesh): InvalidArgument naming the degrees and what would be valid. validate_config includes it.
void check_options(const ParallelConfig& c);
// "default | steal (ring: ...) | ring (passq: ...)": every schedule, with its strategy and what it
// does, for a --schedule help text.
std::string schedule_choices();

}  // namespace seqpar
