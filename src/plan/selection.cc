// "auto" (selection.h): the planner's ranking of one bare attention call, its first.
#include "seqpar/plan/selection.h"

#include <cstdio>
#include <limits>

#include "seqpar/core/error.h"
#include "seqpar/parallel/strategy_table.h"
#include "seqpar/plan/planner.h"

namespace seqpar {

std::string candidate_label(const ParallelConfig& c) {
  std::string label(strategy_name(c.strategy));
  if (c.schedule != ScheduleKind::kDefault) {
    label += '_';
    label += schedule_kind_name(c.schedule);
  }
  if (c.strategy == Strategy::kUsp)
    label += detail::concat("_u", c.mesh.ulysses, "_r", c.mesh.ring);
  return label;
}

AttnChoice choose_attention(const ParallelConfig& request, int ranks, const AttnShape& s,
                            const HardwareProfile& hw) {
  PlanRequest req;
  req.work = attention_workload(s.seq, s.heads, s.kv(), s.head_dim, s.batch, s.causal, s.dtype,
                                s.text_tokens, s.cached, s.fresh);
  req.world = ranks;
  req.hw = hw;
  // Only the time decides; whether the call fits this machine is the runner's check.
  req.memory_limit = 1e30;
  req.cfg = 1;
  req.tp = 1;
  if (request.mesh.ulysses > 0) req.ulysses = request.mesh.ulysses;
  if (request.mesh.ring > 0) req.ring = request.mesh.ring;
  req.layout = request.layout;
  req.ulysses_mode = request.ulysses_mode;
  req.softmax = request.softmax;
  req.pad = request.pad;
  const Plan plan = make_plan(req);
  SEQPAR_ARG_CHECK(!plan.ranked.empty(), "no strategy can run this call on ", ranks, " ranks");
  AttnChoice out;
  out.config = request;
  const ParallelConfig& best = plan.ranked.front().config;
  out.config.strategy = best.strategy;
  out.config.schedule = best.schedule;
  out.config.mesh.ulysses = best.mesh.ulysses;
  out.config.mesh.ring = best.mesh.ring;
  out.predicted_s = plan.ranked.front().step_s;
  std::string times;
  for (const MeshCost& m : plan.ranked) {
    out.candidates.emplace_back(candidate_label(m.config), m.step_s);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.4g ms", times.empty() ? "" : ", ",
                  candidate_label(m.config).c_str(), m.step_s * 1e3);
    times += buf;
  }
  out.reason = candidate_label(out.config) + ": fastest replayed schedule (" + times + ")";
  if (s.over_cache()) {
    out.rule = choose_pass(s.fresh, s.cached, ranks, s.heads, s.kv(), dtype_size(s.dtype),
                           hw.attention_flops, hw.inter_node_bw);
    out.reason += "; Meta's rule: " + out.rule->reason;
  }
  return out;
}

}  // namespace seqpar
