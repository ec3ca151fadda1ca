// Simulation past one machine: the cost model's replay of ring, Ulysses, USP (and all-gather)
// steps for growing world sizes on the profile's two-level topology (fast links inside a node of
// ranks_per_node, slower between nodes), pure sequence parallelism (cfg and tp as pinned, else 1).
// Reports, per strategy, the step time at each size and where communication stops hiding behind
// compute (exposed communication above a threshold of the step); draws it as an SVG.
// Thread-safety: pure functions of values.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "seqpar/plan/cost_model.h"
#include "seqpar/plan/planner.h"

namespace seqpar {

struct SimPoint {
  int ranks = 0;
  bool valid = false;
  std::string note;  // why not valid, or the mesh chosen (usp: its degrees)
  int ulysses = 1, ring = 1;
  double step_s = 0, compute_s = 0, comm_s = 0, exposed_s = 0;  // step, and per layer
  double exposed_fraction = 0;                                  // exposed comm / layer time
  bool inter_node = false;  // the sequence-parallel group spans nodes
  double memory_bytes = 0;
};

struct SimCurve {
  Strategy strategy = Strategy::kRing;
  std::vector<SimPoint> points;
  int hidden_up_to = 0;  // largest size with exposed fraction <= threshold (0: none)
  int stops_hiding_at =
      0;  // first size above it where the fraction exceeds the threshold (0: never)
  bool overlaps = false;  // some transfer of its meshes may hide behind compute (a ring's)
};

struct Simulation {
  Workload work;
  std::string hardware;
  int ranks_per_node = 0;
  Layout layout = Layout::kContiguous;
  double threshold = 0.05;  // exposed communication fraction that counts as "not hidden"
  std::vector<int> sizes;
  // One per strategy table row that runs the call on more than one rank (over a sequence: ring,
  // ulysses, usp, then allgather; over a cache: passkv, passq).
  std::vector<SimCurve> curves;
  std::vector<std::string> findings;  // one line per strategy
  std::string note;                   // why the sizes stop where they do, when it is not asked
};

// Sizes from `first` to `last`, doubling.
std::vector<int> doubling_sizes(int first, int last);

// The work of simulate_scaling with these arguments (planner.h), and the largest of `sizes` up
// to which (sizes[0] to it) the work stays within `budget` (0: not even the first).
PlanWork simulation_work(const Workload& w, const std::vector<int>& sizes, Layout layout,
                         int cfg = 1, int tp = 1);
int largest_simulated_size(const Workload& w, const std::vector<int>& sizes, Layout layout, int cfg,
                           int tp, int64_t budget);

// Communication counts as hidden up to this fraction of the step (exposed / step).
inline constexpr double kHiddenFraction = 0.05;

// Replays every size. cfg and tp: the degrees outside sequence parallelism (world = cfg·tp·sp;
// sizes are sequence-parallel sizes). usp takes the fastest ulysses x ring split with both
// degrees above 1. Throws InvalidArgument (naming the work and the largest last size that fits)
// when the work is more than max_work (PlanWork::ns). on_mesh, if given, hears (meshes costed,
// meshes in all) after each mesh.
Simulation simulate_scaling(const Workload& w, const HardwareProfile& hw,
                            const std::vector<int>& sizes, Layout layout, int cfg = 1, int tp = 1,
                            double threshold = kHiddenFraction, int64_t max_work = kMaxPlanWork,
                            const std::function<void(int64_t done, int64_t total)>& on_mesh = {});

// Predicted step time against ranks, one line per strategy, log-log axes, the node boundary and
// the points where communication stops hiding marked. A complete standalone SVG document.
std::string simulation_svg(const Simulation& sim, const std::string& title);

}  // namespace seqpar
