// "auto": the one selection of a strategy for an attention call, used by `seqpar run --strategy
// auto`, the decoder's chunks over a cache (through the caller: the model layer does not link
// plan/), `seqpar.attention(strategy="auto")` and `seqpar.decode_attention(pass_="auto")`. It is
// the planner's (planner.h make_plan) ranking of one bare attention call on the group's ranks,
// with cfg and tp 1 and the request's layout, Ulysses mode, softmax, padding and any pinned
// degrees kept: every strategy-table row and schedule that can run the call is costed by
// replaying its schedule on the hardware profile, and the fastest is taken, so that `seqpar plan`
// with the same pins puts the same choice first. Over a K/V cache, Meta's pass-KV / pass-Q rule
// (parallel/decode.h choose_pass) is kept beside it for reference.
// Thread-safety: pure functions of values.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/parallel/config.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/plan/hardware.h"

namespace seqpar {

struct AttnChoice {
  // The request's configuration with the strategy, the schedule and the sequence-parallel
  // degrees (ulysses x ring = the ranks) chosen.
  ParallelConfig config;
  double predicted_s = 0;  // the choice's time of one call on the profile
  // Every candidate that can run, fastest first: its label (candidate_label) and time.
  std::vector<std::pair<std::string, double>> candidates;
  std::optional<PassChoice> rule;  // over a cache: Meta's rule at the profile's rates
  std::string reason;              // one line: the choice, the times, the rule's verdict
};

// "ring", "ring_steal", "allgather", "ulysses", "usp_u2_r4", "passkv", "passq", "passq_ring": a
// candidate's name in reasons, tables and the JSON of `seqpar run`.
std::string candidate_label(const ParallelConfig& c);

// The fastest way for `ranks` sequence-parallel ranks to run shape s (the group's view) with the
// settings of `request`: its strategy and schedule are chosen, its ulysses and ring degrees
// pinned where not 0 (0: chosen), its tp and cfg ignored (1).
// InvalidArgument (one line) when nothing can run it.
AttnChoice choose_attention(const ParallelConfig& request, int ranks, const AttnShape& s,
                            const HardwareProfile& hw);

}  // namespace seqpar
