#include "seqpar/plan/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

namespace {

std::vector<int> divisors(int x) {
  std::vector<int> d;
  for (int64_t v : limits::divisors(x)) d.push_back(static_cast<int>(v));
  return d;
}

// Candidate world sizes the "nearest" searches try at most (each one enumerates and costs).
constexpr int kNearestTries = 64;

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

// The options a mesh of a strategy row takes, in the order they are enumerated; meshes of equal
// predicted time keep this order in the ranking (tie_order).
constexpr UlyssesMode kUlyssesModes[] = {UlyssesMode::kUaa, UlyssesMode::kStrict};
constexpr Layout kLayouts[] = {Layout::kContiguous, Layout::kZigzag, Layout::kStriped};

// The SpDegrees a sequence-parallel group of ulysses u x ring r ranks has: the rows that take it.
SpDegrees degrees_of(int u, int r) {
  if (u * r == 1) return SpDegrees::kOne;
  if (u == 1) return SpDegrees::kRing;
  return r == 1 ? SpDegrees::kUlysses : SpDegrees::kUlyssesRing;
}

// Does the row run this kind of call (over a K/V cache or over a sequence)? One rank runs either.
bool runs_call(const StrategyRow& row, bool over_cache) {
  return row.degrees == SpDegrees::kOne || row.over_cache == over_cache;
}

// Where an unpinned schedule beside the default is planned: where it can help. The table has no
// trait for it: work stealing balances causal work, with the online softmax it runs with.
bool schedule_helps(ScheduleKind k, const Workload& w, SoftmaxMode softmax) {
  return k != ScheduleKind::kSteal || (w.causal && softmax == SoftmaxMode::kOnline);
}

// The row's position in the strategy table.
int row_index(Strategy s) {
  const auto table = strategy_table();
  for (size_t i = 0; i < table.size(); ++i)
    if (table[i].strategy == s) return static_cast<int>(i);
  return 0;
}

int index_of(auto value, const auto& list) {
  int i = 0;
  for (const auto& v : list) {
    if (v == value) return i;
    ++i;
  }
  return i;
}

// The order of meshes of equal predicted time: by degrees (cfg, tp, ulysses), the strategy that
// holds less K/V first (a ring before an all-gather), then table order; then the options in the
// order they are listed (uaa before strict, unpadded first, contiguous, zigzag, striped) and the
// strategy's default schedule first. A rejection of the degrees alone (ulysses 0) comes before
// the meshes of those degrees.
using TieOrder = std::array<int, 9>;
TieOrder tie_order(const ParallelConfig& c) {
  const StrategyRow& row = strategy_row(c.strategy);
  return {c.mesh.cfg,
          c.mesh.tp,
          c.mesh.ulysses,
          row.gathers_kv ? 1 : 0,
          row_index(c.strategy),
          index_of(c.ulysses_mode, kUlyssesModes),
          c.pad ? 1 : 0,
          index_of(c.layout, kLayouts),
          c.schedule == ScheduleKind::kDefault ? 0 : 1};
}

// Calls visit(mesh) for every mesh the request allows: for each mesh of degrees (cfg x tp x
// ulysses x ring), each strategy table row that takes those degrees and this kind of call, each
// of the row's schedules, and the options that apply to the row (Ulysses modes where it uses
// Ulysses, padding, layouts). Pins narrow the same loops; a pinned strategy or schedule the mesh
// cannot run is visited all the same, so that validation says why. Degrees (cfg, tp) that cannot
// run are reported once through reject_degrees.
template <typename Visit, typename Reject>
void enumerate(const PlanRequest& req, Visit&& visit, Reject&& reject_degrees) {
  const Workload& w = req.work;
  const AttnShape shape = workload_shape(w);
  const SoftmaxMode softmax = req.softmax.value_or(SoftmaxMode::kOnline);
  for (int cfg : {1, 2}) {
    if (req.world % cfg != 0 || (req.cfg != 0 && req.cfg != cfg)) continue;
    if (cfg > 1 && w.cfg_branches == 1 && req.cfg == 0) continue;  // nothing to split
    for (int tp : divisors(req.world / cfg)) {
      if (req.tp != 0 && req.tp != tp) continue;
      if (tp > 1 && w.attention_only && req.tp == 0) continue;
      ParallelConfig m;
      m.mesh = {.cfg = cfg, .tp = tp, .ring = 0, .ulysses = 0};
      try {
        check_mesh_degrees(w, cfg, tp);
      } catch (const InvalidArgument& e) {
        reject_degrees(m, e.what());
        continue;
      }
      const int sp = req.world / cfg / tp;
      if (req.sp != 0 && req.sp != sp) continue;
      for (int u : divisors(sp)) {
        m.mesh.ulysses = u;
        m.mesh.ring = sp / u;
        if ((req.ulysses != 0 && req.ulysses != u) || (req.ring != 0 && req.ring != sp / u))
          continue;
        for (const StrategyRow& row : strategy_table()) {
          if (row.degrees != degrees_of(u, sp / u)) continue;
          if (req.strategy ? *req.strategy != row.strategy : !runs_call(row, w.decode())) continue;
          // const-max needs a ring; a pinned strategy without one is rejected with the reason.
          if (softmax != SoftmaxMode::kOnline && !row.has_ring && !req.strategy) continue;
          m.strategy = row.strategy;
          m.softmax = softmax;
          std::vector<const ScheduleRow*> schedules;
          if (!req.schedule) {
            for (const ScheduleRow& sr : row.schedules)
              if (schedule_helps(sr.kind, w, softmax)) schedules.push_back(&sr);
          } else if (schedule_applies(*req.schedule, row.strategy)) {
            schedules.push_back(&schedule_row(row.strategy, *req.schedule));
          } else if (req.strategy) {
            schedules.push_back(nullptr);  // validation says which schedules the strategy runs
          }
          for (const ScheduleRow* sr : schedules) {
            m.schedule = sr ? sr->kind : *req.schedule;
            for (UlyssesMode mode : kUlyssesModes) {
              if (uses_ulysses(row.strategy) ? req.ulysses_mode && *req.ulysses_mode != mode
                                             : mode != UlyssesMode::kUaa)
                continue;
              m.ulysses_mode = mode;
              for (bool pad : {false, true}) {
                if (req.pad ? *req.pad != pad : pad && w.decode()) continue;
                if (pad && sp == 1) continue;
                m.pad = pad;
                for (Layout layout : kLayouts) {
                  if (req.layout ? *req.layout != layout : sp == 1 && layout != Layout::kContiguous)
                    continue;
                  m.layout = layout;
                  // Padding that adds nothing is not a separate mesh.
                  if (pad && w.seq % pad_multiple(sp, layout) == 0 && !req.pad) continue;
                  // A schedule's own check (steal: contiguous shards) narrows the options that
                  // are not pinned along with it.
                  if (sr && sr->check && !(req.schedule && req.layout)) {
                    try {
                      sr->check(m, shape);
                    } catch (const InvalidArgument&) {
                      continue;
                    }
                  }
                  visit(m);
                }
              }
            }
          }
        }
      }
    }
  }
}

struct Enumerated {
  std::vector<MeshCost> fit, over;
  std::vector<Rejection> rejected;
};

// Every mesh of the request costed: those that fit ranked fastest first, those over the memory
// limit smallest first (equal ones in tie_order), the rejections in tie_order, those of one mesh
// that fail for every layout merged into one "any layout" entry. stop_when_runs: stop at the
// first mesh that runs (fits or not).
Enumerated enumerate_and_cost(const PlanRequest& req, bool stop_when_runs = false) {
  Enumerated out;
  struct Group {
    std::vector<Rejection> rejected;
    int tried = 0;
    TieOrder order{};
  };
  std::vector<Group> groups;
  std::map<std::string, size_t> index;
  enumerate(
      req,
      [&](const ParallelConfig& m) {
        if (stop_when_runs && !(out.fit.empty() && out.over.empty())) return;
        ParallelConfig key = m;
        key.layout = Layout::kContiguous;
        auto [it, inserted] = index.emplace(config_label(key), groups.size());
        if (inserted) groups.push_back({{}, 0, tie_order(m)});
        Group& g = groups[it->second];
        g.order = std::min(g.order, tie_order(m));
        ++g.tried;
        try {
          MeshCost c = cost_mesh(req.work, m, req.hw, req.memory_limit);
          (c.fits_memory ? out.fit : out.over).push_back(std::move(c));
        } catch (const InvalidArgument& e) {
          g.rejected.push_back({m, false, e.what()});
        }
      },
      [&](const ParallelConfig& m, const std::string& reason) {
        groups.push_back({{{m, true, reason}}, 1, tie_order(m)});
      });
  auto in_order = [](const auto& a, const auto& b) {
    return tie_order(a.config) < tie_order(b.config);
  };
  std::stable_sort(out.fit.begin(), out.fit.end(), in_order);
  std::stable_sort(out.fit.begin(), out.fit.end(), [](const MeshCost& a, const MeshCost& b) {
    return a.step_s < b.step_s * (1 - 1e-12);
  });
  std::stable_sort(out.over.begin(), out.over.end(), in_order);
  std::stable_sort(out.over.begin(), out.over.end(), [](const MeshCost& a, const MeshCost& b) {
    return a.memory_bytes < b.memory_bytes;
  });
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.order < b.order; });
  for (Group& g : groups) {
    if (g.rejected.empty()) continue;
    std::stable_sort(g.rejected.begin(), g.rejected.end(), in_order);
    if (static_cast<int>(g.rejected.size()) == g.tried && g.tried > 1) {
      Rejection r = g.rejected.front();
      r.any_layout = true;
      out.rejected.push_back(std::move(r));
    } else {
      for (auto& r : g.rejected) out.rejected.push_back(std::move(r));
    }
  }
  return out;
}

// Smallest world size above `world` (up to 64x) whose best mesh fits; 0 if none.
int nearest_fitting_world(const PlanRequest& req, MeshCost* best) {
  const int64_t last = std::min<int64_t>(64 * int64_t{req.world}, limits::kMaxRanks);
  int tries = 0;
  for (int w2 = req.world + 1; w2 <= last && tries < kNearestTries; ++w2) {
    // Try sizes a user would: multiples of the world or of 8, and powers of two.
    const bool pow2 = (w2 & (w2 - 1)) == 0;
    if (!(w2 % req.world == 0 || w2 % 8 == 0 || pow2)) continue;
    if (plan_work(req, w2) > kMaxPlanWork) break;
    ++tries;
    PlanRequest r2 = req;
    r2.world = w2;
    r2.cfg = r2.tp = r2.ulysses = r2.ring = r2.sp = 0;  // pins were for the old world size
    Enumerated e = enumerate_and_cost(r2);
    if (!e.fit.empty()) {
      if (best) *best = e.fit.front();
      return w2;
    }
  }
  return 0;
}

// Nearest world sizes (below and above) where some mesh runs, for "no mesh fits" errors.
std::string nearest_running_worlds(const PlanRequest& req) {
  auto runs = [&](int w2) {
    PlanRequest r2 = req;
    r2.world = w2;
    Enumerated e = enumerate_and_cost(r2, true);
    return !e.fit.empty() || !e.over.empty();
  };
  std::string s;
  for (int w2 = req.world - 1; w2 >= 1 && w2 >= req.world - kNearestTries; --w2)
    if (runs(w2)) {
      s = detail::concat("ranks ", w2);
      break;
    }
  const int64_t last = std::min<int64_t>(
      {4 * int64_t{req.world}, int64_t{req.world} + kNearestTries, limits::kMaxRanks});
  for (int w2 = req.world + 1; w2 <= last && plan_work(req, w2) <= kMaxPlanWork; ++w2)
    if (runs(w2)) {
      s += detail::concat(s.empty() ? "" : " or ", "ranks ", w2);
      break;
    }
  return s.empty() ? "none found" : s;
}

}  // namespace

std::string nearest_name(const std::string& name, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& n : names) {
    std::vector<size_t> prev(n.size() + 1), cur(n.size() + 1);
    for (size_t j = 0; j <= n.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= name.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= n.size(); ++j)
        cur[j] =
            std::min({prev[j] + 1, cur[j - 1] + 1,
                      prev[j - 1] + (std::tolower(name[i - 1]) == std::tolower(n[j - 1]) ? 0 : 1)});
      std::swap(prev, cur);
    }
    if (prev[n.size()] < best_d) {
      best_d = prev[n.size()];
      best = n;
    }
  }
  return best;
}

Divisibility analyse_divisibility(const PlanRequest& req) {
  const Workload& w = req.work;
  Divisibility d;
  d.seq = w.seq;
  int sp = req.world;
  if (req.ulysses > 0 && req.ring > 0) {
    sp = req.ulysses * req.ring;
  } else {
    const int cfg = req.cfg > 0 ? req.cfg : 1, tp = req.tp > 0 ? req.tp : 1;
    if (req.world % (cfg * tp) == 0) sp = req.world / (cfg * tp);
  }
  d.sp = sp;
  d.remainder = w.seq % sp;
  d.shard_floor = w.seq / sp;
  d.shard_ceil = (w.seq + sp - 1) / sp;
  d.ranks_with_ceil = static_cast<int>(d.remainder);
  d.shard_imbalance = d.shard_ceil / (static_cast<double>(w.seq) / sp);
  d.padded_seq = (w.seq + sp - 1) / sp * sp;
  d.padded_seq_zigzag = (w.seq + 2 * sp - 1) / (2 * sp) * (2 * sp);
  d.pad_token_overhead = static_cast<double>(d.padded_seq - w.seq) / w.seq;
  {
    const PositionRuns real = range_runs(0, w.seq), padded = range_runs(0, d.padded_seq);
    const double a = static_cast<double>(visible_pairs(real, real, w.causal));
    const double b = static_cast<double>(
        visible_pairs(padded, padded, w.causal, d.padded_seq != w.seq ? w.seq : 0));
    d.pad_work_overhead = b / a - 1;
  }
  if (d.remainder == 0) return d;

  // Nearest shapes whose token count divides sp: each input dimension on its own, the first
  // value below and above (within 64 steps of its granularity).
  auto add_dim = [&](const std::string& flag, int64_t value, int64_t step, int64_t min_value,
                     auto&& tokens_of) {
    for (int dir : {-1, 1})
      for (int64_t k = 1; k <= 64; ++k) {
        const int64_t v = value + dir * k * step;
        if (v < min_value) break;
        int64_t t = 0;
        try {
          t = tokens_of(v);
        } catch (const InvalidArgument&) {
          continue;
        }
        if (t >= sp && t % sp == 0) {
          d.alternatives.push_back({flag, v, t});
          break;
        }
      }
  };
  const ModelPreset* m = req.preset;
  if (m != nullptr && m->family != ModelFamily::kLlm && req.height > 0) {
    const int64_t sh = m->vae_stride[1] * m->patch[1], sw = m->vae_stride[2] * m->patch[2];
    if (m->video)
      add_dim("--frames", req.frames, m->vae_stride[0], 1,
              [&](int64_t f) { return latent_shape(*m, f, req.height, req.width).tokens; });
    add_dim("--height", req.height, sh, sh,
            [&](int64_t h) { return latent_shape(*m, req.frames, h, req.width).tokens; });
    add_dim("--width", req.width, sw, sw,
            [&](int64_t x) { return latent_shape(*m, req.frames, req.height, x).tokens; });
  } else {
    const int64_t lo = w.seq / sp * sp, hi = lo + sp;
    if (lo >= sp) d.alternatives.push_back({"--seq", lo, lo});
    d.alternatives.push_back({"--seq", hi, hi});
  }
  std::stable_sort(d.alternatives.begin(), d.alternatives.end(),
                   [&](const ShapeAlternative& a, const ShapeAlternative& b) {
                     return std::llabs(a.tokens - w.seq) < std::llabs(b.tokens - w.seq);
                   });
  return d;
}

DecodeChoice decode_choice(const PlanRequest& req) {
  const Workload& w = req.work;
  DecodeChoice c;
  const int tp = req.tp > 0 ? req.tp : 1;
  c.ranks = std::max(1, req.world / tp);
  c.flops_per_s = rank_attention_flops(req.hw, ranks_on_node(req.hw, req.world));
  c.bytes_per_s = req.hw.inter_node_bw;
  const size_t e = dtype_size(w.dtype);
  c.basic =
      choose_pass(w.fresh, w.cached, c.ranks, w.heads, w.kv_heads, e, c.flops_per_s, c.bytes_per_s);
  c.all2all = choose_pass_all2all(w.fresh, w.cached, c.ranks, w.heads, w.kv_heads, e, c.flops_per_s,
                                  c.bytes_per_s);
  c.choice = c.all2all.kind;
  if (c.ranks > 1) {
    // In order of preference on a tie (plan/cache_choice.h).
    const std::tuple<Strategy, ScheduleKind, std::optional<double>*> candidates[] = {
        {Strategy::kPassKv, ScheduleKind::kDefault, &c.passkv_step_s},
        {Strategy::kPassQ, ScheduleKind::kDefault, &c.passq_step_s},
        {Strategy::kPassQ, ScheduleKind::kRing, &c.passq_ring_step_s}};
    std::optional<double> best;
    for (const auto& [s, sched, out] : candidates) {
      ParallelConfig m;
      m.mesh.tp = tp;
      m.mesh.ring = c.ranks;
      m.strategy = s;
      m.schedule = sched;
      m.layout = req.layout.value_or(Layout::kContiguous);
      try {
        *out = cost_mesh(w, m, req.hw, req.memory_limit).step_s;
      } catch (const InvalidArgument&) {
        continue;
      }
      if (!best || **out < *best) {
        best = **out;
        c.fastest = s;
        c.fastest_schedule = sched;
      }
    }
  }
  return c;
}

int64_t plan_work(const PlanRequest& req, int world) {
  PlanRequest r = req;
  r.world = world;
  int64_t work = 0;
  enumerate(
      r,
      [&](const ParallelConfig& m) {
        // Costing a mesh builds its token positions, and counts visible pairs over position runs
        // (a contiguous or striped rank holds one run, a zigzag rank two): every member of a
        // Ulysses group over the group's runs, every ring step over two ranks' runs, all-gather
        // every rank over all runs; plus every rank's steps.
        const int64_t u = m.mesh.ulysses, g = m.mesh.ring, sp = u * g;
        const int64_t runs = m.layout == Layout::kZigzag ? 2 : 1;
        const int64_t pairs =
            runs * runs * (sp * (u * u + g) + (m.strategy == Strategy::kAllGather ? sp * sp : 0));
        work += r.work.seq + r.work.text_tokens + pairs + int64_t{world} * std::max(u, g);
      },
      [](const ParallelConfig&, const std::string&) {});
  return work;
}

Plan make_plan(const PlanRequest& req) {
  SEQPAR_ARG_CHECK(req.world >= 1 && req.world <= limits::kMaxRanks, "ranks ", req.world,
                   " is invalid; valid: 1 to ", limits::max_text(limits::kMaxRanks));
  SEQPAR_ARG_CHECK(req.sp >= 0 && (req.sp == 0 || (req.ulysses == 0 || req.sp % req.ulysses == 0)),
                   "sequence_parallel_size ", req.sp, " is not a multiple of ulysses_degree ",
                   req.ulysses);
  SEQPAR_ARG_CHECK(req.sp == 0 || req.ulysses == 0 || req.ring == 0 ||
                       req.sp == req.ulysses * req.ring,
                   "sequence_parallel_size ", req.sp, " must equal ulysses_degree ", req.ulysses,
                   " x ring_degree ", req.ring);
  SEQPAR_ARG_CHECK(req.cfg >= 0 && req.tp >= 0 && req.ulysses >= 0 && req.ring >= 0 &&
                       limits::checked_product({std::max(req.cfg, 1), std::max(req.tp, 1),
                                                std::max(req.ulysses, 1), std::max(req.ring, 1)},
                                               "the pinned degrees", limits::kMaxRanks) > 0,
                   "the pinned degrees must be 0 (any) or more");
  check_workload_limits(req.work);
  const int64_t work = plan_work(req, req.world);
  SEQPAR_ARG_CHECK(
      work <= kMaxPlanWork, "planning ", req.world, " ranks at ", req.work.seq,
      " tokens means costing about ", work,
      " steps (token positions, run pairs, rank steps) over every mesh, more than the limit ",
      kMaxPlanWork,
      "; pin tp, ulysses_degree, ring_degree, strategy or layout, or plan fewer "
      "ranks or tokens (a simulation extrapolates)");
  Plan plan;
  plan.request = req;
  plan.divisibility = analyse_divisibility(req);
  if (req.work.decode()) plan.decode = decode_choice(req);
  Enumerated e = enumerate_and_cost(req);
  plan.ranked = std::move(e.fit);
  plan.over_memory = std::move(e.over);
  plan.rejected = std::move(e.rejected);

  const std::string what = detail::concat(req.work.model, " at ", req.work.seq, " tokens");
  if (plan.ranked.empty() && plan.over_memory.empty()) {
    std::string reason =
        plan.rejected.empty() ? "the pinned degrees leave no mesh" : plan.rejected.front().reason;
    throw InvalidArgument(
        detail::concat("no mesh of ", req.world, " ranks can run ", what, ": ", reason,
                       "; nearest world sizes that run: ", nearest_running_worlds(req)));
  }
  if (plan.ranked.empty() && !req.work.decode()) {
    const MeshCost& smallest = plan.over_memory.front();
    MeshCost best;
    const int w2 = nearest_fitting_world(req, &best);
    std::string alt = w2 > 0 ? detail::concat("ranks ", w2, " (", config_label(best.config), ", ",
                                              gb(best.memory_bytes), " per rank)")
                             : std::string("no world size up to 64x fits");
    throw InvalidArgument(
        detail::concat("no mesh of ", req.world, " ranks fits ", what, " in ",
                       gb(smallest.memory_limit), " per rank: the smallest needs ",
                       gb(smallest.memory_bytes), " (", config_label(smallest.config), "); nearest: ", alt,
                       ", or memory_limit ", std::ceil(smallest.memory_bytes / 1e9), " (GB)"));
  }
  return plan;
}

}  // namespace seqpar
