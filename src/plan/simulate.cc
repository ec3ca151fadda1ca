#include "seqpar/plan/simulate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "seqpar/core/error.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

std::vector<int> doubling_sizes(int first, int last) {
  SEQPAR_ARG_CHECK(first >= 1 && last >= first, "simulation sizes ", first, ":", last,
                   " are invalid; give FIRST:LAST with 1 <= FIRST <= LAST, e.g. 8:1024");
  std::vector<int> v;
  for (int64_t n = first; n <= last; n *= 2) v.push_back(static_cast<int>(n));
  return v;
}

namespace {

SimPoint point_of(const MeshCost& c, const HardwareProfile& hw, int n) {
  SimPoint p;
  p.ranks = n;
  p.valid = true;
  p.ulysses = c.config.mesh.ulysses;
  p.ring = c.config.mesh.ring;
  p.step_s = c.step_s;
  p.compute_s = c.compute_s;
  p.comm_s = c.comm_s;
  p.exposed_s = c.exposed_comm_s;
  p.exposed_fraction = c.layer_s > 0 ? c.exposed_comm_s / c.layer_s : 0;
  p.inter_node = hw.ranks_per_node > 0 && n > hw.ranks_per_node;
  p.memory_bytes = c.memory_bytes;
  return p;
}

std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100 * f);
  return buf;
}

// The rows simulated: every strategy table row that runs this kind of call (over a K/V cache or
// over a sequence) on more than one rank, in table order, except that all-gather (the row that
// gathers the whole K/V on every rank without splitting heads: the fallback to compare with)
// comes last.
std::vector<const StrategyRow*> simulated_rows(bool over_cache) {
  std::vector<const StrategyRow*> rows;
  for (const StrategyRow& row : strategy_table())
    if (row.degrees != SpDegrees::kOne && row.over_cache == over_cache) rows.push_back(&row);
  std::stable_partition(rows.begin(), rows.end(), [](const StrategyRow* r) {
    return !(r->gathers_kv && r->degrees == SpDegrees::kRing);
  });
  return rows;
}

// The (ulysses, ring) degrees a row takes on n sequence-parallel ranks: one rank is the local
// row's; a row taking both takes every split with both above 1.
std::vector<std::pair<int, int>> degrees_on(const StrategyRow& row, int n) {
  if (n == 1) return {{1, 1}};
  switch (row.degrees) {
    case SpDegrees::kOne:
      return {};
    case SpDegrees::kRing:
      return {{1, n}};
    case SpDegrees::kUlysses:
      return {{n, 1}};
    case SpDegrees::kUlyssesRing: {
      std::vector<std::pair<int, int>> d;
      for (int u = 2; u < n; ++u)
        if (n % u == 0) d.push_back({u, n / u});
      return d;
    }
  }
  return {};
}

// Calls visit(curve, size index, mesh) for every mesh the simulation costs.
template <typename Visit>
void for_each_simulated_mesh(const Workload& w, const std::vector<int>& sizes, Layout layout,
                             int cfg, int tp, Visit&& visit) {
  const std::vector<const StrategyRow*> rows = simulated_rows(w.decode());
  for (size_t c = 0; c < rows.size(); ++c)
    for (size_t i = 0; i < sizes.size(); ++i)
      for (auto [u, r] : degrees_on(*rows[c], sizes[i])) {
        ParallelConfig m;
        m.mesh = {.cfg = cfg, .tp = tp, .ring = r, .ulysses = u};
        m.strategy = sizes[i] == 1 ? Strategy::kLocal : rows[c]->strategy;
        m.layout = layout;
        m.ulysses_mode = UlyssesMode::kUaa;
        visit(c, i, m);
      }
}

// The finding of one curve, one line.
std::string finding(const SimCurve& curve, double threshold) {
  const SimPoint* first = nullptr;
  const SimPoint* last = nullptr;
  for (const SimPoint& p : curve.points)
    if (p.valid) {
      if (!first) first = &p;
      last = &p;
    }
  std::string line = std::string(strategy_name(curve.strategy)) + ": ";
  if (!first)
    return line + "no size runs (" +
           (curve.points.empty() ? std::string("no sizes") : curve.points[0].note) + ")";
  if (curve.stops_hiding_at == 0)
    return line + detail::concat("communication stays hidden behind compute up to ", last->ranks,
                                 " ranks (exposed <= ", percent(threshold), " of a layer)");
  const SimPoint* at = nullptr;
  for (const SimPoint& p : curve.points)
    if (p.ranks == curve.stops_hiding_at) at = &p;
  if (curve.hidden_up_to > 0)
    line += detail::concat("communication hides behind compute up to ", curve.hidden_up_to,
                           " ranks (exposed <= ", percent(threshold), " of a layer); from ",
                           curve.stops_hiding_at, " ranks it is ", percent(at->exposed_fraction),
                           " of a layer", at->inter_node ? " (the group spans nodes)" : "", ", ",
                           percent(last->exposed_fraction), " at ", last->ranks);
  else
    line +=
        detail::concat("communication is exposed at every size: ", percent(at->exposed_fraction),
                       " of a layer at ", at->ranks, " ranks, ", percent(last->exposed_fraction),
                       " at ", last->ranks);
  if (!curve.overlaps) line += " (its collectives are never overlapped with compute)";
  return line;
}

}  // namespace

PlanWork simulation_work(const Workload& w, const std::vector<int>& sizes, Layout layout, int cfg,
                         int tp) {
  PlanWork work;
  for_each_simulated_mesh(w, sizes, layout, cfg, tp, [&](size_t, size_t, const ParallelConfig& m) {
    work += mesh_work(w, m);
  });
  return work;
}

int largest_simulated_size(const Workload& w, const std::vector<int>& sizes, Layout layout, int cfg,
                           int tp, int64_t budget) {
  int last = 0;
  PlanWork work;
  for (int n : sizes) {
    work += simulation_work(w, {n}, layout, cfg, tp);
    if (work.ns > budget) break;
    last = n;
  }
  return last;
}

Simulation simulate_scaling(const Workload& w, const HardwareProfile& hw,
                            const std::vector<int>& sizes, Layout layout, int cfg, int tp,
                            double threshold, int64_t max_work,
                            const std::function<void(int64_t, int64_t)>& on_mesh) {
  const PlanWork work = simulation_work(w, sizes, layout, cfg, tp);
  if (work.ns > max_work) {
    const int last = largest_simulated_size(w, sizes, layout, cfg, tp, max_work);
    throw InvalidArgument(detail::concat("simulating sizes ", sizes.front(), " to ", sizes.back(),
                                         " at ", w.seq, " tokens means costing ", work.text(),
                                         ", more than the limit of about ",
                                         static_cast<double>(max_work) / 1e9, " s; ",
                                         last > 0 ? detail::concat("simulate sizes up to ", last)
                                                  : std::string("simulate fewer tokens")));
  }
  Simulation sim;
  sim.work = w;
  sim.hardware = hw.name;
  sim.ranks_per_node = hw.ranks_per_node;
  sim.layout = layout;
  sim.threshold = threshold;
  sim.sizes = sizes;
  const std::vector<const StrategyRow*> rows = simulated_rows(w.decode());
  for (const StrategyRow* row : rows) {
    SimCurve curve;
    curve.strategy = row->strategy;
    for (int n : sizes) {
      SimPoint p;
      p.ranks = n;
      if (degrees_on(*row, n).empty())
        p.note = detail::concat(strategy_name(row->strategy),
                                " needs a size with a divisor between 1 and itself");
      curve.points.push_back(p);
    }
    sim.curves.push_back(std::move(curve));
  }
  int64_t meshes = 0, costed = 0;
  if (on_mesh)
    for_each_simulated_mesh(w, sizes, layout, cfg, tp,
                            [&](size_t, size_t, const ParallelConfig&) { ++meshes; });
  // Each point: the fastest of the meshes it can take (usp: its ulysses x ring splits).
  for_each_simulated_mesh(
      w, sizes, layout, cfg, tp, [&](size_t c, size_t i, const ParallelConfig& m) {
        if (on_mesh) on_mesh(costed++, meshes);
        SimCurve& curve = sim.curves[c];
        SimPoint& best = curve.points[i];
        MeshCost cost;
        try {
          cost = cost_mesh(w, m, hw);
        } catch (const InvalidArgument& e) {
          if (!best.valid) best.note = e.what();
          return;
        }
        if (!std::isfinite(cost.step_s)) {
          if (!best.valid)
            best.note = detail::concat("the predicted step time is not finite: hardware profile ",
                                       hw.name, "'s rates are too small");
          return;
        }
        if (!best.valid || cost.step_s < best.step_s) best = point_of(cost, hw, sizes[i]);
        if (rows[c]->degrees == SpDegrees::kUlyssesRing)
          best.note = detail::concat("ulysses ", best.ulysses, " x ring ", best.ring);
        for (const CollectiveCost& col : cost.collectives) curve.overlaps |= col.overlapped;
      });
  if (on_mesh) on_mesh(meshes, meshes);
  for (SimCurve& curve : sim.curves) {
    // Where communication stops hiding.
    bool leading = true;
    for (const SimPoint& p : curve.points) {
      if (!p.valid) continue;
      if (p.exposed_fraction <= threshold) {
        if (leading) curve.hidden_up_to = p.ranks;
      } else {
        leading = false;
        if (curve.stops_hiding_at == 0) curve.stops_hiding_at = p.ranks;
      }
    }
    sim.findings.push_back(finding(curve, threshold));
  }
  return sim;
}

}  // namespace seqpar
