#include "seqpar/plan/simulate.h"

#include <algorithm>
#include <cstdio>

#include "seqpar/core/error.h"

namespace seqpar {

std::vector<int> doubling_sizes(int first, int last) {
  SEQPAR_ARG_CHECK(first >= 1 && last >= first, "simulation sizes ", first, ":", last,
                   " are invalid; give FIRST:LAST with 1 <= FIRST <= LAST, e.g. 8:1024");
  std::vector<int> v;
  for (int64_t n = first; n <= last; n *= 2) v.push_back(static_cast<int>(n));
  return v;
}

namespace {

SimPoint point_of(const MeshCost& c, const Workload&, const HardwareProfile& hw, int n) {
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

}  // namespace

Simulation simulate_scaling(const Workload& w, const HardwareProfile& hw,
                            const std::vector<int>& sizes, Layout layout, int cfg, int tp,
                            double threshold) {
  Simulation sim;
  sim.work = w;
  sim.hardware = hw.name;
  sim.ranks_per_node = hw.ranks_per_node;
  sim.layout = layout;
  sim.threshold = threshold;
  sim.sizes = sizes;
  const std::vector<Strategy> schemes =
      w.decode()
          ? std::vector<Strategy>{Strategy::kPassKv, Strategy::kPassQ}
          : std::vector<Strategy>{Strategy::kRing, Strategy::kUlysses, Strategy::kUsp, Strategy::kAllGather};
  for (Strategy s : schemes) {
    SimCurve curve;
    curve.strategy = s;
    for (int n : sizes) {
      SimPoint best;
      best.ranks = n;
      std::vector<std::pair<int, int>> degrees;  // (ulysses, ring)
      if (n == 1) {
        degrees.push_back({1, 1});
      } else if (s == Strategy::kUlysses) {
        degrees.push_back({n, 1});
      } else if (s == Strategy::kUsp) {
        for (int u = 2; u < n; ++u)
          if (n % u == 0) degrees.push_back({u, n / u});
      } else {
        degrees.push_back({1, n});
      }
      if (degrees.empty()) best.note = "usp needs a size with a divisor between 1 and itself";
      for (auto [u, r] : degrees) {
        ParallelConfig m;
        m.mesh.cfg = cfg;
        m.mesh.tp = tp;
        m.mesh.ulysses = u;
        m.mesh.ring = r;
        m.strategy = n == 1 ? Strategy::kLocal : s;
        m.layout = layout;
        m.ulysses_mode = UlyssesMode::kUaa;
        try {
          MeshCost c = cost_mesh(w, m, hw);
          if (!best.valid || c.step_s < best.step_s) best = point_of(c, w, hw, n);
        } catch (const InvalidArgument& e) {
          if (!best.valid) best.note = e.what();
        }
      }
      if (best.valid && s == Strategy::kUsp)
        best.note = detail::concat("ulysses ", best.ulysses, " x ring ", best.ring);
      curve.points.push_back(best);
    }
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
    // One line of findings.
    const SimPoint* first = nullptr;
    const SimPoint* last = nullptr;
    for (const SimPoint& p : curve.points)
      if (p.valid) {
        if (!first) first = &p;
        last = &p;
      }
    std::string line = std::string(strategy_name(s)) + ": ";
    if (!first) {
      line += "no size runs (" +
              (curve.points.empty() ? std::string("no sizes") : curve.points[0].note) + ")";
    } else if (curve.stops_hiding_at == 0) {
      line += detail::concat("communication stays hidden behind compute up to ", last->ranks,
                             " ranks (exposed <= ", percent(threshold), " of a layer)");
    } else {
      const SimPoint* at = nullptr;
      for (const SimPoint& p : curve.points)
        if (p.ranks == curve.stops_hiding_at) at = &p;
      if (curve.hidden_up_to > 0)
        line +=
            detail::concat("communication hides behind compute up to ", curve.hidden_up_to,
                           " ranks (exposed <= ", percent(threshold), " of a layer); from ",
                           curve.stops_hiding_at, " ranks it is ", percent(at->exposed_fraction),
                           " of a layer", at->inter_node ? " (the group spans nodes)" : "", ", ",
                           percent(last->exposed_fraction), " at ", last->ranks);
      else
        line += detail::concat("communication is exposed at every size: ",
                               percent(at->exposed_fraction), " of a layer at ", at->ranks,
                               " ranks, ", percent(last->exposed_fraction), " at ", last->ranks);
      if (s == Strategy::kUlysses || s == Strategy::kAllGather || s == Strategy::kPassQ)
        line += " (its collectives are never overlapped with compute)";
    }
    sim.findings.push_back(line);
    sim.curves.push_back(std::move(curve));
  }
  return sim;
}

}  // namespace seqpar
