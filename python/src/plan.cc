// seqpar._core's planning part: PlanSpec and the `seqpar plan --json` object
// (seqpar/plan/plan_spec.h), for seqpar.plan().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "gil.h"
#include "seqpar/plan/plan_spec.h"

namespace py = pybind11;

namespace seqpar::python {

void bind_plan(py::module_& m) {
  py::class_<PlanSpec>(m, "_PlanSpec")
      .def(py::init<>())
      .def_readwrite("model", &PlanSpec::model)
      .def_readwrite("frames", &PlanSpec::frames)
      .def_readwrite("height", &PlanSpec::height)
      .def_readwrite("width", &PlanSpec::width)
      .def_readwrite("seq", &PlanSpec::seq)
      .def_readwrite("heads", &PlanSpec::heads)
      .def_readwrite("kv_heads", &PlanSpec::kv_heads)
      .def_readwrite("head_dim", &PlanSpec::head_dim)
      .def_readwrite("batch", &PlanSpec::batch)
      .def_readwrite("causal", &PlanSpec::causal)
      .def_readwrite("text_tokens", &PlanSpec::text_tokens)
      .def_readwrite("guidance", &PlanSpec::guidance)
      .def_readwrite("ranks", &PlanSpec::ranks)
      .def_readwrite("ranks_per_node", &PlanSpec::ranks_per_node)
      .def_readwrite("memory_limit_gb", &PlanSpec::memory_limit_gb)
      .def_readwrite("dtype", &PlanSpec::dtype)
      .def_readwrite("cfg", &PlanSpec::cfg)
      .def_readwrite("tp", &PlanSpec::tp)
      .def_readwrite("ulysses_degree", &PlanSpec::ulysses_degree)
      .def_readwrite("ring_degree", &PlanSpec::ring_degree)
      .def_readwrite("sequence_parallel_size", &PlanSpec::sequence_parallel_size)
      .def_readwrite("schedule", &PlanSpec::schedule)
      .def_readwrite("strategy", &PlanSpec::strategy)
      .def_readwrite("layout", &PlanSpec::layout)
      .def_readwrite("ulysses_mode", &PlanSpec::ulysses_mode)
      .def_readwrite("softmax", &PlanSpec::softmax)
      .def_readwrite("pad", &PlanSpec::pad)
      .def_readwrite("cached", &PlanSpec::cached)
      .def_readwrite("new", &PlanSpec::fresh);
  // (the plan's JSON, the simulation's SVG chart or "" without simulate)
  m.def("_plan_json", [](const PlanSpec& spec, const std::string& hardware, int top, bool simulate,
                         const std::string& sim_ranks) {
    return without_gil([&] {
      const ResolvedPlanSpec r = resolve_plan_spec(spec, load_hardware_profile(hardware));
      const Plan plan = make_plan(r.req);
      if (!simulate) return std::pair{plan_json(r, plan, nullptr, top), std::string()};
      const Simulation sim = plan_simulation(r, sim_ranks);
      return std::pair{plan_json(r, plan, &sim, top), simulation_svg(sim, simulation_title(r))};
    });
  });
}

}  // namespace seqpar::python
