// How new tokens over a distributed K/V cache run: pass-KV (the K/V shards around the ring),
// ring pass-Q (the Q blocks around the ring, the partials back in one all-to-all) or all-gather
// pass-Q (the queries all-gathered), chosen by replaying each one's schedule
// (parallel/schedule.h) on a hardware profile with the cost model (cost_model.h) and taking the
// fastest. Meta's rule (parallel/decode.h choose_pass) is kept beside it, in the reason, for
// reference.
// Thread-safety: pure functions of values.
#pragma once

#include <optional>
#include <string>

#include "seqpar/parallel/config.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/plan/hardware.h"

namespace seqpar {

struct CacheStrategyChoice {
  ParallelConfig config;  // the input's, with strategy and schedule chosen
  // Predicted seconds of one attention call (cost_mesh's layer time of a bare call); unset where
  // the candidate cannot run (one rank: none is costed, the rule decides).
  std::optional<double> passkv_s, passq_ring_s, passq_s;
  PassChoice rule;     // Meta's rule at the profile's attention rate and between-node bandwidth
  std::string reason;  // one line: the choice, the three predicted times, the rule's verdict
};

// "passkv", "passq ring" or "passq" (all-gather): a candidate's name in reasons and tables.
std::string cache_strategy_label(const ParallelConfig& c);

// The fastest of the three for shape s (over a cache: s.cached, s.fresh) on c's sequence-parallel
// group (c.mesh, c.layout; c.strategy and c.schedule are replaced). Ties go to pass-KV, then to
// all-gather pass-Q (the simpler schedule). InvalidArgument if s is not over a cache.
CacheStrategyChoice choose_cache_strategy(const ParallelConfig& c, const AttnShape& s,
                                          const HardwareProfile& hw);

}  // namespace seqpar
