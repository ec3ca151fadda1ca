// The strategy table (strategy_table.h): every strategy's row, and the checks and defaults that
// loop over it.
#include "seqpar/parallel/strategy_table.h"

#include <string>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/decode.h"

namespace seqpar {

namespace {

// ---- run functions: each strategy's entry on the arguments every one gets -------------------
// The strategies over a cache take dense tensors (a dense view as it is, else packed once).

AttnState run_local(const StrategyArgs& a) {  // one rank: over its own cache, or its tokens
  if (a.place.over_cache)
    return passq_attention(a.comms.sp(), a.place.cache, a.q.contiguous(), a.k.contiguous(), a.v.contiguous(), a.opts, a.stats);
  return ring_attention(a.comms.sp(), a.place.part, a.q, a.k, a.v, a.opts, a.stats);
}
AttnState run_allgather(const StrategyArgs& a) {
  return allgather_attention(a.comms.sp(), a.place.part, a.q, a.k, a.v, a.opts, a.stats);
}
AttnState run_ring(const StrategyArgs& a) {
  return ring_attention(a.comms.sp(), a.place.part, a.q, a.k, a.v, a.opts, a.stats);
}
AttnState run_steal(const StrategyArgs& a) {
  return steal_attention(a.comms.sp(), a.place.part, a.q, a.k, a.v, a.opts, a.stats);
}
AttnState run_ulysses(const StrategyArgs& a) {
  return ulysses_attention(a.comms.sp(), a.place.part, a.q, a.k, a.v, a.opts, a.stats);
}
AttnState run_usp(const StrategyArgs& a) {
  return usp_attention(a.comms, a.place.part, a.q, a.k, a.v, a.opts, a.stats);
}
AttnState run_passkv(const StrategyArgs& a) {
  return passkv_attention(a.comms.sp(), a.place.cache, a.q.contiguous(), a.k.contiguous(), a.v.contiguous(), a.opts, a.stats);
}
AttnState run_passq(const StrategyArgs& a) {
  return passq_attention(a.comms.sp(), a.place.cache, a.q.contiguous(), a.k.contiguous(), a.v.contiguous(), a.opts, a.stats);
}
AttnState run_passq_ring(const StrategyArgs& a) {
  return passq_ring_attention(a.comms.sp(), a.place.cache, a.q.contiguous(), a.k.contiguous(), a.v.contiguous(), a.opts, a.stats);
}

// ---- checks of a strategy or schedule of its own ---------------------------------------------

// ulysses and usp: the Ulysses exchange's limits on the heads the group sees (after tp) and, in
// strict mode, on the shards.
void check_ulysses(const ParallelConfig& c, const AttnShape& s) {
  CpOptions opts;
  opts.ulysses_mode = c.ulysses_mode;
  check_strategy_shape(c.strategy, sequence_partition(c, s), s.heads / c.mesh.tp,
                       std::max<int64_t>(1, s.kv() / c.mesh.tp), c.mesh.ulysses, opts);
}

// ring's schedule steal: contiguous shards of one sequence.
void check_steal(const ParallelConfig& c, const AttnShape& s) {
  SEQPAR_PARAM_CHECK(c.layout == Layout::kContiguous, "layout", "contiguous", param("schedule"),
                     " 'steal' balances contiguous shards; ", param("layout"), " '",
                     layout_name(c.layout), "' is not: use ", param("layout"),
                     " 'contiguous' (or zigzag without steal)");
  SEQPAR_PARAM_CHECK(s.seq_lens.empty(), "schedule", "default", param("schedule"),
                     " 'steal' balances a single sequence; with ", param("seq_lens"),
                     " (packed documents) use ", param("layout"),
                     " 'zigzag', which is balanced per document");
}

// Where the planner proposes steal unpinned: work stealing balances causal work, under the online
// softmax it runs with.
bool steal_helps(const AttnShape& s, SoftmaxMode softmax) {
  return s.causal && softmax == SoftmaxMode::kOnline;
}
// Its host bookkeeping: the pieces handed out and back (8 peers a rank), planned row by row.
constexpr HostWork kStealHostWork{.peers_per_rank = 8, .per_token = true};

// ---- the table -------------------------------------------------------------------------------

constexpr ScheduleRow kLocalSchedules[] = {
    {ScheduleKind::kDefault, "attention over the own tokens", local_schedule, run_local, nullptr}};
constexpr ScheduleRow kAllGatherSchedules[] = {{ScheduleKind::kDefault,
                                                "K and V all-gathered, then one local attention",
                                                allgather_schedule, run_allgather, nullptr}};
constexpr ScheduleRow kRingSchedules[] = {
    {ScheduleKind::kDefault, "each rank attends its own queries while the K/V blocks pass",
     ring_schedule, run_ring, nullptr},
    {ScheduleKind::kSteal,
     "causal contiguous shards: late ranks hand part of their queries' work to early ones",
     steal_schedule, run_steal, check_steal, steal_helps, kStealHostWork}};
constexpr ScheduleRow kUlyssesSchedules[] = {
    {ScheduleKind::kDefault, "all-to-all sequence -> heads, attention, all-to-all back",
     ulysses_schedule, run_ulysses, nullptr}};
constexpr ScheduleRow kUspSchedules[] = {{ScheduleKind::kDefault,
                                          "Ulysses inside groups, ring across them", usp_schedule,
                                          run_usp, nullptr}};
constexpr ScheduleRow kPassKvSchedules[] = {
    {ScheduleKind::kDefault, "the K/V shards pass around the ring to the new tokens' queries",
     passkv_schedule, run_passkv, nullptr}};
constexpr ScheduleRow kPassQSchedules[] = {
    {ScheduleKind::kDefault, "the queries all-gathered; partial states back by all-to-all",
     passq_schedule, run_passq, nullptr},
    {ScheduleKind::kRing, "Q blocks pass around the ring; partial states back by all-to-all",
     passq_ring_schedule, run_passq_ring, nullptr}};

const StrategyRow kTable[] = {
    {Strategy::kLocal, "one sequence-parallel rank, no communication", false, false, false,
     SpDegrees::kOne, kLocalSchedules, nullptr},
    {Strategy::kRing, "K/V blocks passed around the ring (pass-KV over a sequence)", false, true,
     false, SpDegrees::kRing, kRingSchedules, nullptr},
    {Strategy::kAllGather, "K and V all-gathered, local attention over the whole sequence", false,
     false, true, SpDegrees::kRing, kAllGatherSchedules, nullptr},
    {Strategy::kUlysses,
     "all-to-all sequence -> heads, full-sequence attention on a share of the heads", false, false,
     true, SpDegrees::kUlysses, kUlyssesSchedules, check_ulysses},
    {Strategy::kUsp, "ulysses inside groups, ring across them", false, true, false,
     SpDegrees::kUlyssesRing, kUspSchedules, check_ulysses},
    {Strategy::kPassQ, "new tokens over a K/V cache: the queries passed to the K/V", true, false,
     false, SpDegrees::kRing, kPassQSchedules, nullptr},
    {Strategy::kPassKv, "new tokens over a K/V cache: the K/V shards passed around the ring", true,
     false, false, SpDegrees::kRing, kPassKvSchedules, nullptr},
};

// "passkv, passq": the strategies over a cache (or over a sequence).
std::string strategies_text(bool over_cache) {
  std::string names;
  for (const StrategyRow& row : kTable)
    if (row.over_cache == over_cache && row.degrees != SpDegrees::kOne)
      names += detail::concat(names.empty() ? "" : ", ", strategy_name(row.strategy));
  return names;
}

// "'steal' with ring, 'ring' with passq, 'default'": the schedules and their strategies.
std::string schedules_text() {
  std::string text;
  for (const StrategyRow& row : kTable)
    for (const ScheduleRow& sr : row.schedules)
      if (sr.kind != ScheduleKind::kDefault)
        text += detail::concat("'", schedule_kind_name(sr.kind), "' with ",
                               strategy_name(row.strategy), ", ");
  return text + "'default'";
}

}  // namespace

std::span<const StrategyRow> strategy_table() { return kTable; }

const StrategyRow& strategy_row(Strategy s) {
  for (const StrategyRow& row : kTable)
    if (row.strategy == s) return row;
  throw Error(detail::concat("strategy ", strategy_name(s), " has no row in the strategy table"));
}

const ScheduleRow& schedule_row(Strategy s, ScheduleKind k) {
  for (const ScheduleRow& sr : strategy_row(s).schedules)
    if (sr.kind == k) return sr;
  throw ParamError(
      "schedule", schedules_text(),
      detail::concat(param("schedule"), " '", schedule_kind_name(k), "' does not apply to ",
                     param("strategy"), " '", strategy_name(s), "'; valid: ", schedules_text()));
}

bool runs_over_cache(Strategy s) { return strategy_row(s).over_cache; }
bool has_ring(Strategy s) { return strategy_row(s).has_ring; }
bool uses_ulysses(Strategy s) {
  const SpDegrees d = strategy_row(s).degrees;
  return d == SpDegrees::kUlysses || d == SpDegrees::kUlyssesRing;
}
bool schedule_applies(ScheduleKind k, Strategy s) {
  for (const ScheduleRow& sr : strategy_row(s).schedules)
    if (sr.kind == k) return true;
  return false;
}

Strategy strategy_for_degrees(int ulysses, int ring, Strategy ring_axis) {
  const SpDegrees want =
      ulysses > 1 ? (ring > 1 ? SpDegrees::kUlyssesRing : SpDegrees::kUlysses) : SpDegrees::kRing;
  if (want == SpDegrees::kRing) {
    const StrategyRow& row = strategy_row(ring_axis);
    SEQPAR_PARAM_CHECK(row.degrees == SpDegrees::kRing && !row.over_cache, "strategy",
                       strategies_text(false), param("strategy"), " ", strategy_name(ring_axis),
                       " needs ", param("ulysses_degree"), " > 1; with only ", param("ring_degree"),
                       " valid: ", strategies_text(false));
    return ring_axis;
  }
  for (const StrategyRow& row : kTable)
    if (row.degrees == want && !row.over_cache) return row.strategy;
  throw Error("no strategy takes these degrees");
}

void fill_sp_degrees(ParallelConfig& c, int n, int64_t heads) {
  int u = c.mesh.ulysses, r = c.mesh.ring;
  SEQPAR_PARAM_CHECK(u >= 0 && r >= 0, u < 0 ? "ulysses_degree" : "ring_degree", "at least 1",
                     param("ulysses_degree"), " and ", param("ring_degree"), " must be positive");
  switch (strategy_row(c.strategy).degrees) {
    case SpDegrees::kUlyssesRing:
      if (u == 0 && r == 0) {
        u = 1;  // the largest divisor of the ranks that divides the heads
        for (int64_t d : limits::divisors(n))
          if (heads % d == 0) u = static_cast<int>(d);
      }
      if (u == 0) u = r > 0 && n % r == 0 ? n / r : 0;
      if (r == 0) r = u > 0 && n % u == 0 ? n / u : 0;
      SEQPAR_PARAM_CHECK(u > 0 && r > 0 && int64_t{u} * r == n, "ulysses_degree", divisors_text(n),
                         param("ulysses_degree"), " ", c.mesh.ulysses, " x ", param("ring_degree"),
                         " ", c.mesh.ring, " must equal the ", n,
                         " ranks; valid ulysses degrees: ", divisors_text(n));
      break;
    case SpDegrees::kUlysses:
      SEQPAR_PARAM_CHECK((u == 0 || u == n) && (r == 0 || r == 1), "strategy", "usp",
                         param("strategy"), " ", strategy_name(c.strategy), " uses all ", n,
                         " ranks as one Ulysses group; for ", param("ulysses_degree"), " ", u, " ",
                         param("ring_degree"), " ", r, " use ", param("strategy"), " usp");
      u = n;
      r = 1;
      break;
    case SpDegrees::kOne:
    case SpDegrees::kRing:
      SEQPAR_PARAM_CHECK((u == 0 || u == 1) && (r == 0 || r == n), "strategy", "usp",
                         param("strategy"), " ", strategy_name(c.strategy), " takes no ",
                         param("ulysses_degree"), " or ", param("ring_degree"), "; use ",
                         param("strategy"), " usp to combine them");
      u = 1;
      r = n;
  }
  c.mesh.ulysses = u;
  c.mesh.ring = r;
}

void validate_config(const ParallelConfig& c, const AttnShape& s) {
  const Strategy st = c.strategy;
  const StrategyRow& row = strategy_row(st);
  // The kind of call first: a strategy over a sequence given a cache, or the other way round.
  if (s.over_cache() && !row.over_cache && row.degrees != SpDegrees::kOne)
    throw ParamError("strategy", strategies_text(true),
                     detail::concat(param("strategy"), " ", strategy_name(st),
                                    " does not run over a K/V cache (", param("cached"), ", ",
                                    param("new"), "); valid: ", strategies_text(true)));
  SEQPAR_PARAM_CHECK(s.over_cache() || !row.over_cache, s.cached < 1 ? "cached" : "new",
                     "at least 1", param("strategy"), " ", strategy_name(st),
                     " runs over a K/V cache: ", param("cached"), " ", s.cached, " and ",
                     param("new"), " ", s.fresh, " must both be at least 1");
  check_config_fields(c, s);
  // The strategy against the degrees.
  const MeshShape& m = c.mesh;
  switch (row.degrees) {
    case SpDegrees::kOne:
      SEQPAR_PARAM_CHECK(m.sp() == 1, "sequence_parallel_size", "1", param("strategy"), " ",
                         strategy_name(st), " needs one sequence-parallel rank, not ", m.sp());
      break;
    case SpDegrees::kRing:
      SEQPAR_PARAM_CHECK(m.ulysses == 1, "ulysses_degree", "1", param("strategy"), " ",
                         strategy_name(st), " takes no ", param("ulysses_degree"), " (", m.ulysses,
                         "); use ", param("strategy"), " usp to combine ", param("ulysses_degree"),
                         " and ", param("ring_degree"));
      break;
    case SpDegrees::kUlysses:
      SEQPAR_PARAM_CHECK(m.ring == 1, "ring_degree", "1", param("strategy"), " ", strategy_name(st),
                         " uses the whole sequence-parallel group; ", param("ring_degree"), " ",
                         m.ring, " needs ", param("strategy"), " usp");
      break;
    case SpDegrees::kUlyssesRing:
      break;
  }
  check_options(c);
  if (row.check) row.check(c, s);
  if (const CheckFn check = schedule_row(st, c.schedule).check) check(c, s);
}

void check_options(const ParallelConfig& c) {
  const Strategy st = c.strategy;
  const std::string degrees = detail::concat(param("ulysses_degree"), " ", c.mesh.ulysses, ", ",
                                             param("ring_degree"), " ", c.mesh.ring);
  if (c.softmax != SoftmaxMode::kOnline && !has_ring(st)) {
    std::string rings;
    for (const StrategyRow& r : kTable)
      if (r.has_ring)
        rings += detail::concat(rings.empty() ? "" : " or ", "'", strategy_name(r.strategy), "'");
    throw ParamError(
        "softmax", "online",
        detail::concat(param("softmax"), " '", softmax_mode_name(c.softmax),
                       "' needs a ring: valid with ", param("strategy"), " ", rings,
                       " (its ring part), not '", strategy_name(st), "' (", degrees, ")"));
  }
  if (!schedule_applies(c.schedule, st))
    throw ParamError(
        "schedule", schedules_text(),
        detail::concat(param("schedule"), " '", schedule_kind_name(c.schedule),
                       "' does not apply to ", param("strategy"), " '", strategy_name(st), "' (",
                       degrees, "); valid: ", schedules_text()));
}

std::string schedule_choices() {
  std::string text = "default";
  for (const StrategyRow& row : kTable)
    for (const ScheduleRow& sr : row.schedules)
      if (sr.kind != ScheduleKind::kDefault)
        text += detail::concat(" | ", schedule_kind_name(sr.kind), " (",
                               strategy_name(row.strategy), ": ", sr.summary, ")");
  return text;
}

}  // namespace seqpar
