#include "seqpar/plan/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

namespace {

// A refused mesh's reason: as the error says it, and marked (core/param_error.h).
Rejection rejection(const ParallelConfig& m, const InvalidArgument& e) {
  const auto* p = dynamic_cast<const ParamError*>(&e);
  return {m, false, e.what(), p ? p->marked() : std::string(e.what())};
}

std::vector<int> divisors(int x) {
  std::vector<int> d;
  for (int64_t v : limits::divisors(x)) d.push_back(static_cast<int>(v));
  return d;
}

// Candidate world sizes the "nearest" searches try at most (each one enumerates and costs).
constexpr int kNearestTries = 64;

// "14.7 GB"; below 0.1 GB three significant digits ("0.0126 GB", "1e-30 GB").
std::string gb(double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, bytes >= 1e8 ? "%.1f GB" : "%.3g GB", bytes / 1e9);
  return buf;
}

// A memory limit in GB that holds `bytes`: whole GB from 1 GB, else three significant digits,
// rounded up.
std::string gb_limit(double bytes) {
  double v = bytes / 1e9;
  if (v >= 1) {
    v = std::ceil(v);
  } else if (v > 0) {
    const double scale = std::pow(10.0, 2 - std::floor(std::log10(v)));
    v = std::ceil(v * scale) / scale;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, v >= 1 ? "%.0f" : "%.3g", v);
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

// The meshes of degrees the request allows (cfg x tp x ulysses x ring; pins applied): cfg 1 or
// 2 (2 with two guidance branches), tp dividing the world (1 for a bare attention call), every
// ulysses x ring split of the rest. Degrees (cfg, tp) that cannot run are reported once through
// reject_degrees.
template <typename Reject>
std::vector<MeshShape> meshes_of(const PlanRequest& req, Reject&& reject_degrees) {
  const Workload& w = req.work;
  std::vector<MeshShape> meshes;
  for (int cfg : {1, 2}) {
    if (req.world % cfg != 0 || (req.cfg != 0 && req.cfg != cfg)) continue;
    if (cfg > 1 && w.cfg_branches == 1 && req.cfg == 0) continue;  // nothing to split
    for (int tp : divisors(req.world / cfg)) {
      if (req.tp != 0 && req.tp != tp) continue;
      if (tp > 1 && w.attention_only && req.tp == 0) continue;
      try {
        check_mesh_degrees(w, cfg, tp);
      } catch (const InvalidArgument& e) {
        ParallelConfig m;
        m.mesh = {.cfg = cfg, .tp = tp, .ring = 0, .ulysses = 0};
        reject_degrees(rejection(m, e));
        continue;
      }
      const int sp = req.world / cfg / tp;
      if (req.sp != 0 && req.sp != sp) continue;
      for (int u : divisors(sp))
        if ((req.ulysses == 0 || req.ulysses == u) && (req.ring == 0 || req.ring == sp / u))
          meshes.push_back({.cfg = cfg, .tp = tp, .ring = sp / u, .ulysses = u});
    }
  }
  return meshes;
}

// Does the row plan on this mesh: it takes the degrees, this kind of call (a pinned strategy
// that does not is still planned, so that validation says why) and the pinned softmax (const-max
// needs a ring; the same for a pinned strategy)?
bool row_fits(const StrategyRow& row, const MeshShape& mesh, const PlanRequest& req) {
  if (row.degrees != degrees_of(mesh.ulysses, mesh.ring)) return false;
  if (req.strategy) return *req.strategy == row.strategy;
  return runs_call(row, req.work.decode()) &&
         (req.softmax.value_or(SoftmaxMode::kOnline) == SoftmaxMode::kOnline || row.has_ring);
}

// The row's schedules to plan: every one where it can help, or the pinned one; a pinned schedule
// the pinned strategy does not run is planned as nullptr (validation says which it runs).
std::vector<const ScheduleRow*> schedules_of(const StrategyRow& row, const PlanRequest& req) {
  std::vector<const ScheduleRow*> schedules;
  if (!req.schedule) {
    for (const ScheduleRow& sr : row.schedules)
      if (!sr.helps ||
          sr.helps(workload_shape(req.work), req.softmax.value_or(SoftmaxMode::kOnline)))
        schedules.push_back(&sr);
  } else if (schedule_applies(*req.schedule, row.strategy)) {
    schedules.push_back(&schedule_row(row.strategy, *req.schedule));
  } else if (req.strategy) {
    schedules.push_back(nullptr);
  }
  return schedules;
}

// The options that apply to the row on this mesh (pins applied): Ulysses modes where the row uses
// Ulysses, padding where it adds tokens (never over a cache unless pinned, so that validation
// says why), layouts (contiguous alone on one rank).
struct Options {
  UlyssesMode mode;
  bool pad;
  Layout layout;
};
std::vector<Options> options_of(const StrategyRow& row, const MeshShape& mesh,
                                const PlanRequest& req) {
  const Workload& w = req.work;
  const int sp = mesh.sp();
  std::vector<Options> options;
  for (UlyssesMode mode : kUlyssesModes) {
    if (uses_ulysses(row.strategy) ? req.ulysses_mode && *req.ulysses_mode != mode
                                   : mode != UlyssesMode::kUaa)
      continue;
    for (bool pad : {false, true}) {
      if (req.pad ? *req.pad != pad : pad && w.decode()) continue;
      if (pad && sp == 1) continue;
      for (Layout layout : kLayouts) {
        if (req.layout ? *req.layout != layout : sp == 1 && layout != Layout::kContiguous) continue;
        // Padding that adds nothing is not a separate mesh.
        if (pad && w.seq % pad_multiple(sp, layout) == 0 && !req.pad) continue;
        options.push_back({mode, pad, layout});
      }
    }
  }
  return options;
}

// Calls visit(mesh) for every mesh the request allows: for each mesh of degrees, each strategy
// table row that plans on it, each of the row's schedules, each of the options that apply to the
// row. A schedule's own check (steal: contiguous shards) narrows the options not pinned along
// with it. Degrees (cfg, tp) that cannot run are reported once through reject_degrees.
template <typename Visit, typename Reject>
void enumerate(const PlanRequest& req, Visit&& visit, Reject&& reject_degrees) {
  const AttnShape shape = workload_shape(req.work);
  for (const MeshShape& mesh : meshes_of(req, reject_degrees))
    for (const StrategyRow& row : strategy_table()) {
      if (!row_fits(row, mesh, req)) continue;
      for (const ScheduleRow* sr : schedules_of(row, req))
        for (const Options& o : options_of(row, mesh, req)) {
          ParallelConfig m;
          m.mesh = mesh;
          m.strategy = row.strategy;
          m.schedule = sr ? sr->kind : *req.schedule;
          m.softmax = req.softmax.value_or(SoftmaxMode::kOnline);
          m.ulysses_mode = o.mode;
          m.pad = o.pad;
          m.layout = o.layout;
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
          g.rejected.push_back(rejection(m, e));
        }
      },
      [&](Rejection r) {
        r.any_layout = true;
        const auto order = tie_order(r.config);
        groups.push_back({{std::move(r)}, 1, order});
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

// A rank's memory limit at `world` ranks (the profile's is shared by the ranks of a node when
// shared_node).
double memory_limit_at(const PlanRequest& req, int world) {
  return req.memory_limit > 0 ? req.memory_limit
                              : rank_memory_bytes(req.hw, ranks_on_node(req.hw, world));
}

// Smallest world size above `world` (up to 64x) whose best mesh fits (the fastest: *best); 0 if
// none, -1 if the search stopped where the work would pass *budget (*budget: what is left).
// Sizes whose memory floor is over their limit are not costed.
int nearest_fitting_world(const PlanRequest& req, int64_t* budget, MeshCost* best) {
  const int64_t last = std::min<int64_t>(64 * int64_t{req.world}, limits::kMaxRanks);
  int tries = 0;
  for (int w2 = req.world + 1; w2 <= last && tries < kNearestTries; ++w2) {
    // Try sizes a user would: multiples of the world or of 8, and powers of two.
    const bool pow2 = (w2 & (w2 - 1)) == 0;
    if (!(w2 % req.world == 0 || w2 % 8 == 0 || pow2)) continue;
    if (memory_floor(req, w2) > memory_limit_at(req, w2)) continue;
    ++tries;
    PlanRequest r2 = req;
    r2.world = w2;
    r2.cfg = r2.tp = r2.ulysses = r2.ring = r2.sp = 0;  // pins were for the old world size
    const int64_t work = plan_work(r2, w2).ns;
    if (work > *budget) return -1;
    *budget -= work;
    Enumerated e = enumerate_and_cost(r2);
    if (!e.fit.empty()) {
      if (best) *best = e.fit.front();
      return w2;
    }
  }
  return 0;
}

// Nearest world sizes (below and above) where some mesh runs, for "no mesh runs" errors; the
// search stops where the work would pass *budget.
std::string nearest_running_worlds(const PlanRequest& req, int64_t* budget) {
  auto runs = [&](int w2) {
    PlanRequest r2 = req;
    r2.world = w2;
    const int64_t work = plan_work(r2, w2).ns;
    if (work > *budget) return std::optional<bool>();
    *budget -= work;
    Enumerated e = enumerate_and_cost(r2, true);
    return std::optional<bool>(!e.fit.empty() || !e.over.empty());
  };
  std::string s;
  for (int w2 = req.world - 1; w2 >= 1 && w2 >= req.world - kNearestTries; --w2) {
    const std::optional<bool> r = runs(w2);
    if (!r) break;
    if (*r) {
      s = detail::concat(param("ranks"), " ", w2);
      break;
    }
  }
  const int64_t last = std::min<int64_t>(
      {4 * int64_t{req.world}, int64_t{req.world} + kNearestTries, limits::kMaxRanks});
  for (int w2 = req.world + 1; w2 <= last; ++w2) {
    const std::optional<bool> r = runs(w2);
    if (!r) break;
    if (*r) {
      s += detail::concat(s.empty() ? "" : " or ", param("ranks"), " ", w2);
      break;
    }
  }
  return s.empty() ? "none found" : s;
}

// The meshes the decode choice times: pass-KV, all-gather pass-Q and ring pass-Q on the world
// over tp, in order of preference on a tie (plan/cache_choice.h).
std::vector<ParallelConfig> decode_meshes(const PlanRequest& req, int world) {
  const int tp = req.tp > 0 ? req.tp : 1;
  const int ranks = std::max(1, world / tp);
  std::vector<ParallelConfig> meshes;
  if (ranks <= 1) return meshes;
  for (auto [s, sched] : {std::pair{Strategy::kPassKv, ScheduleKind::kDefault},
                          std::pair{Strategy::kPassQ, ScheduleKind::kDefault},
                          std::pair{Strategy::kPassQ, ScheduleKind::kRing}}) {
    ParallelConfig m;
    m.mesh.tp = tp;
    m.mesh.ring = ranks;
    m.strategy = s;
    m.schedule = sched;
    m.layout = req.layout.value_or(Layout::kContiguous);
    meshes.push_back(m);
  }
  return meshes;
}

// What would plan within kMaxPlanWork: the pins not given, fewer ranks (the largest halving of
// the world, down to 2, with these pins that has meshes and fits), fewer tokens (the largest
// halving that fits on these ranks).
std::string what_fits(const PlanRequest& req) {
  std::vector<std::string> ways;
  std::vector<const char*> unpinned;
  if (!req.strategy) unpinned.push_back("strategy");
  if (!req.layout) unpinned.push_back("layout");
  if (req.ulysses == 0 && req.sp == 0) unpinned.push_back("ulysses_degree");
  if (req.ring == 0 && req.sp == 0) unpinned.push_back("ring_degree");
  if (!unpinned.empty()) {
    std::string pin = "pin";
    for (size_t i = 0; i < unpinned.size(); ++i)
      pin += detail::concat(i == 0                     ? " "
                            : i + 1 == unpinned.size() ? " and "
                                                       : ", ",
                            param(unpinned[i]));
    ways.push_back(pin);
  }
  auto fits = [](const PlanRequest& r, int world) {
    const PlanWork x = plan_work(r, world);
    return x.meshes > x.refused && x.ns <= kMaxPlanWork;
  };
  for (int w2 = req.world / 2; w2 >= 2; w2 /= 2)
    if (fits(req, w2)) {
      ways.push_back(detail::concat(param("ranks"), " ", w2));
      break;
    }
  PlanRequest r2 = req;
  int64_t& tokens = r2.work.decode() ? r2.work.fresh : r2.work.seq;
  while (tokens > 1) {
    tokens /= 2;
    if (r2.work.decode()) r2.work.seq = r2.work.cached + r2.work.fresh;
    if (fits(r2, req.world)) {
      ways.push_back(detail::concat(param(r2.work.decode() ? "new" : "seq"), " ", tokens));
      break;
    }
  }
  std::string text;
  for (size_t i = 0; i < ways.size(); ++i) text += detail::concat(i == 0 ? "" : ", or ", ways[i]);
  return ways.empty() ? "plan fewer ranks or tokens" : text;
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
  auto add_dim = [&](const std::string& parameter, int64_t value, int64_t step, int64_t min_value,
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
          d.alternatives.push_back({parameter, v, t});
          break;
        }
      }
  };
  const ModelPreset* m = req.preset;
  if (m != nullptr && m->family != ModelFamily::kLlm && req.height > 0) {
    const int64_t sh = m->vae_stride[1] * m->patch[1], sw = m->vae_stride[2] * m->patch[2];
    if (m->video)
      add_dim("frames", req.frames, m->vae_stride[0], 1,
              [&](int64_t f) { return latent_shape(*m, f, req.height, req.width).tokens; });
    add_dim("height", req.height, sh, sh,
            [&](int64_t h) { return latent_shape(*m, req.frames, h, req.width).tokens; });
    add_dim("width", req.width, sw, sw,
            [&](int64_t x) { return latent_shape(*m, req.frames, req.height, x).tokens; });
  } else {
    const int64_t lo = w.seq / sp * sp, hi = lo + sp;
    if (lo >= sp) d.alternatives.push_back({"seq", lo, lo});
    d.alternatives.push_back({"seq", hi, hi});
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
  const std::vector<ParallelConfig> meshes = decode_meshes(req, req.world);
  std::optional<double>* const times[] = {&c.passkv_step_s, &c.passq_step_s, &c.passq_ring_step_s};
  std::optional<double> best;
  for (size_t i = 0; i < meshes.size(); ++i) {
    try {
      *times[i] = cost_mesh(w, meshes[i], req.hw, req.memory_limit).step_s;
    } catch (const InvalidArgument&) {
      continue;
    }
    if (!best || **times[i] < *best) {
      best = **times[i];
      c.fastest = meshes[i].strategy;
      c.fastest_schedule = meshes[i].schedule;
    }
  }
  return c;
}

namespace {

// What one unit of each part of the work took on one core of a 2-core VM shared with builds, in
// nanoseconds (measured: docs/planner.md "Limits on work"): a step of a schedule built and
// replayed (with its memory), a peer of an all-to-all, a position-run pair counted (causal: the
// masked count), a token position laid out in memory, a query row gone through, and a mesh's own
// validation and bookkeeping.
constexpr double kStepNs = 220, kPeerNs = 15, kRunPairNs = 1, kCausalRunPairNs = 2.5,
                 kPositionNs = 15, kRowNs = 2, kMeshNs = 20'000;

}  // namespace

PlanWork& PlanWork::operator+=(const PlanWork& o) {
  // Saturating: the work of 2^16 ranks of every mesh passes int64 long before it matters.
  auto add = [](int64_t& a, int64_t b) { a = b > INT64_MAX - a ? INT64_MAX : a + b; };
  add(meshes, o.meshes);
  add(refused, o.refused);
  add(steps, o.steps);
  add(run_pairs, o.run_pairs);
  add(tokens, o.tokens);
  add(ns, o.ns);
  return *this;
}

std::string PlanWork::text() const {
  const double s = static_cast<double>(ns) / 1e9;
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, s < 10 ? "%.2g" : "%.0f", s);
  return detail::concat(meshes, meshes == 1 ? " mesh (" : " meshes (", steps, " schedule steps, ",
                        run_pairs, " run pairs, ", tokens, " tokens one by one; about ", seconds,
                        " s)");
}

// The schedules of parallel/ (schedule.h), by the row's traits: a rank's steps are a few
// collectives and computes and one per ring step where the row passes blocks around a ring (not
// where it gathers them; in a Ulysses group only members with query heads run the ring), its
// peers those of the four Ulysses exchanges, over a cache those of the partial states sent back
// over the group, and with work stealing those of the pieces handed out and back. A rank's
// attention is counted over its queries' runs and each K/V block's runs (a Ulysses group's runs on
// both sides; over a cache one run of new tokens against the cache share and its new tokens), over
// every block of a ring, or once over the gathered K/V (the whole group's runs where the row does
// not split heads). The Ulysses check lays out the padded sequence's positions; work stealing plans
// row by row; a striped cache meets the new tokens in runs of different strides, counted query by
// query (causal).
PlanWork mesh_work(const Workload& w, const ParallelConfig& m) {
  const StrategyRow& row = strategy_row(m.strategy);
  PlanWork x;
  x.meshes = 1;
  x.ns = static_cast<int64_t>(kMeshNs);
  // A mesh that validation refuses costs its validation (the checks of a row without its own
  // are a few comparisons; the Ulysses check is counted below).
  if (!row.check) {
    try {
      validate_config(m, workload_shape(w));
    } catch (const InvalidArgument&) {
      x.refused = 1;
      return x;
    }
  }
  const bool ulysses = uses_ulysses(m.strategy);
  const int64_t n = m.sp(), u = m.mesh.ulysses, g = m.mesh.ring;
  const int64_t runs = m.layout == Layout::kZigzag ? 2 : 1;
  const int64_t group = ulysses ? u : 1;
  const int64_t q_runs = w.decode() ? 1 : group * runs;
  const int64_t kv_runs = w.decode() ? runs + 1 : group * runs;
  // The ranks that attend over a ring (not a gather): in a Ulysses group only the members
  // that got query heads run the ring across the groups.
  const int64_t ring_ranks =
      row.gathers_kv ? 0
                     : (ulysses ? std::min(u, std::max<int64_t>(1, w.heads / m.mesh.tp)) : 1) * g;
  // What the schedule adds (the table's HostWork; none where it does not apply: refused above).
  const HostWork host = schedule_applies(m.schedule, m.strategy)
                            ? schedule_row(m.strategy, m.schedule).host
                            : HostWork{};
  const int64_t steps = n * (4 + (w.text_tokens > 0 ? 3 : 0)) + ring_ranks * g;
  const int64_t peers = n * ((ulysses ? 4 * u : 0) + (w.decode() ? n : 0) + host.peers_per_rank);
  const int64_t seq = m.pad && !w.decode() ? padded_seq(w.seq, m.sp(), m.layout) : w.seq;
  const int64_t positions = ulysses ? seq : 0;
  const int64_t rows =
      (host.per_token ? seq : 0) +
      (w.decode() && w.causal && m.layout == Layout::kStriped && n > 1 ? n * w.fresh : 0);
  x.steps = steps + peers;
  x.run_pairs = q_runs * kv_runs * (row.gathers_kv ? n * (ulysses ? 1 : n) : ring_ranks * g);
  x.tokens = positions + rows;
  const double ns = kMeshNs + kStepNs * steps + kPeerNs * peers +
                    (w.causal ? kCausalRunPairNs : kRunPairNs) * x.run_pairs +
                    kPositionNs * positions + kRowNs * rows;
  x.ns = static_cast<int64_t>(std::min(ns, 1e18));
  return x;
}

// Every term of a mesh's memory is at least that term of one rank holding everything (the local
// mesh) divided by the degrees that split it (tp the weights and heads, cfg the guidance batch,
// the sequence-parallel ranks the tokens), whose product is the world size; tp divides the heads,
// so the weights are split at most min(world, heads) ways.
double memory_floor(const PlanRequest& req, int world) {
  ParallelConfig one;
  one.strategy = Strategy::kLocal;
  one.mesh = {.cfg = 1, .tp = 1, .ring = 1, .ulysses = 1};
  try {
    const MeshCost c = cost_mesh(req.work, one, req.hw, req.memory_limit);
    return c.weight_bytes / static_cast<double>(std::min<int64_t>(world, req.work.heads)) +
           (c.memory_bytes - c.weight_bytes) / world;
  } catch (const InvalidArgument&) {
    return 0;
  }
}

PlanWork plan_work(const PlanRequest& req, int world) {
  PlanRequest r = req;
  r.world = world;
  PlanWork work;
  enumerate(
      r, [&](const ParallelConfig& m) { work += mesh_work(r.work, m); }, [](const Rejection&) {});
  if (r.work.decode())
    for (const ParallelConfig& m : decode_meshes(r, world)) work += mesh_work(r.work, m);
  return work;
}

Plan make_plan(const PlanRequest& req) {
  SEQPAR_PARAM_CHECK(req.world >= 1 && req.world <= limits::kMaxRanks, "ranks",
                     detail::concat("1 to ", limits::max_text(limits::kMaxRanks)), param("ranks"),
                     " ", req.world, " is invalid; valid: 1 to ",
                     limits::max_text(limits::kMaxRanks));
  SEQPAR_PARAM_CHECK(
      req.sp >= 0 && (req.sp == 0 || (req.ulysses == 0 || req.sp % req.ulysses == 0)),
      "sequence_parallel_size", detail::concat("a multiple of ulysses_degree ", req.ulysses),
      param("sequence_parallel_size"), " ", req.sp, " is not a multiple of ",
      param("ulysses_degree"), " ", req.ulysses);
  SEQPAR_PARAM_CHECK(
      req.sp == 0 || req.ulysses == 0 || req.ring == 0 || req.sp == req.ulysses * req.ring,
      "sequence_parallel_size", detail::concat(int64_t{req.ulysses} * req.ring),
      param("sequence_parallel_size"), " ", req.sp, " must equal ", param("ulysses_degree"), " ",
      req.ulysses, " x ", param("ring_degree"), " ", req.ring);
  SEQPAR_ARG_CHECK(req.cfg >= 0 && req.tp >= 0 && req.ulysses >= 0 && req.ring >= 0 &&
                       limits::checked_product({std::max(req.cfg, 1), std::max(req.tp, 1),
                                                std::max(req.ulysses, 1), std::max(req.ring, 1)},
                                               "the pinned degrees", limits::kMaxRanks) > 0,
                   "the pinned degrees must be 0 (any) or more");
  check_workload_limits(req.work);
  const PlanWork work = plan_work(req, req.world);
  if (work.ns > kMaxPlanWork)
    throw_marked(detail::concat(
        "planning ", req.world, " ranks at ", req.work.seq, " tokens means costing ", work.text(),
        ", more than the limit of about ", kMaxPlanWork / 1'000'000'000.0, " s; ", what_fits(req)));
  int64_t budget = kMaxPlanWork - work.ns;  // for the searches of a nearest world size
  Plan plan;
  plan.request = req;
  plan.divisibility = analyse_divisibility(req);
  if (req.work.decode()) plan.decode = decode_choice(req);
  Enumerated e = enumerate_and_cost(req);
  plan.ranked = std::move(e.fit);
  plan.over_memory = std::move(e.over);
  plan.rejected = std::move(e.rejected);

  const std::string what = detail::concat(req.work.model, " at ", req.work.seq, " tokens");
  const HardwareProfile& hw = req.hw;
  for (const auto* list : {&plan.ranked, &plan.over_memory})
    for (const MeshCost& c : *list)
      SEQPAR_PARAM_CHECK(std::isfinite(c.step_s), "hardware", "", param("hardware"), " profile ",
                         hw.name, " predicts a step time that is not finite for ",
                         config_label(c.config), ": its rates (attention_flops ",
                         hw.attention_flops, ", gemm_flops ", hw.gemm_flops, ", intra_node_bw ",
                         hw.intra_node_bw, ", inter_node_bw ", hw.inter_node_bw, ", local_copy_bw ",
                         hw.local_copy_bw, ") are too small for ", what,
                         "; give FLOP/s and bytes/s");
  if (plan.ranked.empty() && plan.over_memory.empty()) {
    std::string reason =
        plan.rejected.empty() ? "the pins leave no mesh" : plan.rejected.front().marked;
    throw_marked(
        detail::concat("no mesh of ", req.world, " ranks can run ", what, ": ", reason,
                       "; nearest world sizes that run: ", nearest_running_worlds(req, &budget)));
  }
  if (plan.ranked.empty() && !req.work.decode()) {
    const MeshCost& smallest = plan.over_memory.front();
    MeshCost best;
    const int w2 = nearest_fitting_world(req, &budget, &best);
    const std::string alt =
        w2 > 0    ? detail::concat(param("ranks"), " ", w2, " (", config_label(best.config), ", ",
                                   gb(best.memory_bytes), " per rank)")
        : w2 == 0 ? std::string("no world size up to 64x fits")
                  : std::string("no world size fits before the search reaches the work limit");
    throw ParamError("memory_limit", gb_limit(smallest.memory_bytes),
                     detail::concat("no mesh of ", req.world, " ranks fits ", what, " in ",
                                    gb(smallest.memory_limit), " per rank: the smallest needs ",
                                    gb(smallest.memory_bytes), " (", config_label(smallest.config),
                                    "); nearest: ", alt, ", or ", param("memory_limit"), " ",
                                    gb_limit(smallest.memory_bytes), " (GB)"));
  }
  return plan;
}

}  // namespace seqpar
