// The pass-KV / ring pass-Q / all-gather pass-Q choice by replayed schedules.
#include "seqpar/plan/cache_choice.h"

#include <cstdio>
#include <utility>

#include "seqpar/core/error.h"
#include "seqpar/plan/cost_model.h"

namespace seqpar {

std::string cache_strategy_label(const ParallelConfig& c) {
  if (c.strategy == Strategy::kPassQ)
    return c.schedule == ScheduleKind::kRing ? "passq ring" : "passq";
  return std::string(strategy_name(c.strategy));
}

CacheStrategyChoice choose_cache_strategy(const ParallelConfig& c, const AttnShape& s,
                                          const HardwareProfile& hw) {
  SEQPAR_ARG_CHECK(s.over_cache() && s.cached > 0 && s.fresh > 0,
                   "the cache strategy choice needs cached and new tokens, both at least 1");
  CacheStrategyChoice out;
  const int n = c.sp();
  out.rule = choose_pass(s.fresh, s.cached, n, s.heads, s.kv(), dtype_size(s.dtype),
                         hw.attention_flops, hw.inter_node_bw);
  const Workload w = attention_workload(s.seq, s.heads, s.kv(), s.head_dim, s.batch, s.causal,
                                        s.dtype, 0, s.cached, s.fresh);
  // In order of preference on a tie.
  const std::pair<Strategy, ScheduleKind> candidates[] = {
      {Strategy::kPassKv, ScheduleKind::kDefault},
      {Strategy::kPassQ, ScheduleKind::kDefault},
      {Strategy::kPassQ, ScheduleKind::kRing}};
  std::optional<double>* times[] = {&out.passkv_s, &out.passq_s, &out.passq_ring_s};
  out.config = c;
  out.config.strategy = out.rule.kind;
  out.config.schedule = ScheduleKind::kDefault;
  std::optional<double> best;
  for (int i = 0; i < 3; ++i) {
    ParallelConfig m = c;
    m.strategy = candidates[i].first;
    m.schedule = candidates[i].second;
    try {
      *times[i] = cost_mesh(w, m, hw).layer_s;
    } catch (const InvalidArgument&) {
      continue;
    }
    if (!best || **times[i] < *best) {
      best = **times[i];
      out.config = m;
    }
  }
  auto ms = [](const std::optional<double>& t) {
    if (!t) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g ms", *t * 1e3);
    return std::string(buf);
  };
  out.reason = cache_strategy_label(out.config) +
               (best ? ": fastest replayed schedule" : ": one rank, Meta's rule") + " (passkv " +
               ms(out.passkv_s) + ", passq ring " + ms(out.passq_ring_s) + ", passq " +
               ms(out.passq_s) + "); Meta's rule: " + out.rule.reason;
  return out;
}

}  // namespace seqpar
