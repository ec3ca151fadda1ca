#include "mesh_run.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "seqpar/comm/mpi.h"
#include "seqpar/comm/threads.h"

namespace seqpar::cli {

void add_mesh_flags(CLI::App* cmd, MeshFlags& f, bool with_cfg) {
  if (with_cfg) cmd->add_option("--cfg", f.cfg, "classifier-free guidance parallel size (1 or 2)");
  cmd->add_option("--tp", f.tp, "tensor parallel size");
  cmd->add_option("--ulysses-degree,--ulysses_degree", f.ulysses_degree, "Ulysses degree");
  cmd->add_option("--ring-degree,--ring_degree", f.ring_degree, "ring degree");
  cmd->add_option("--strategy", f.strategy, "ring | allgather (meshes without Ulysses)");
  cmd->add_option("--layout", f.layout, "contiguous | striped | zigzag");
  cmd->add_option("--ulysses-mode,--ulysses_mode", f.ulysses_mode, "strict | uaa");
  cmd->add_flag("--pad", f.pad, "pad the sequence to a multiple of the sequence-parallel size");
  cmd->add_option("--backend", f.backend, "threads | mpi");
}

MeshChoice resolve_mesh(const MeshFlags& f, int world) {
  using limits::check_range;
  check_range("--cfg", f.cfg, 1, 2);
  check_range("--tp", f.tp, 1, limits::kMaxRanks);
  check_range("--ring-degree", f.ring_degree, 1, limits::kMaxRanks);
  check_range("--ulysses-degree", f.ulysses_degree, 1, limits::kMaxRanks);
  SEQPAR_ARG_CHECK(f.backend == "threads" || f.backend == "mpi", "--backend '", f.backend,
                   "' is unknown; valid: threads, mpi");
  MeshChoice m;
  m.shape = {static_cast<int>(f.cfg), static_cast<int>(f.tp), static_cast<int>(f.ring_degree),
             static_cast<int>(f.ulysses_degree)};
  (void)limits::checked_product({f.cfg, f.tp, f.ring_degree, f.ulysses_degree},
                                "ranks of --cfg x --tp x --ring-degree x --ulysses-degree",
                                limits::kMaxRanks);
  SEQPAR_ARG_CHECK(world == 0 || m.shape.world() == world, "the mesh ", mesh_shape_text(m.shape),
                   " needs ", m.shape.world(), " ranks but the MPI world has ", world,
                   "; launch mpirun -np ", m.shape.world());
  SEQPAR_ARG_CHECK(world != 0 || m.shape.world() <= limits::max_threads(), "the mesh ",
                   mesh_shape_text(m.shape), " needs ", m.shape.world(),
                   " rank threads; this process may start at most ", limits::max_threads(),
                   " (core/limits.h and RLIMIT_NPROC); use --backend mpi");
  m.layout = parse_layout(f.layout);
  m.mode = parse_ulysses_mode(f.ulysses_mode);
  m.pad = f.pad;
  if (f.ring_degree > 1 && f.ulysses_degree > 1) {
    m.strategy = Strategy::kUsp;
  } else if (f.ulysses_degree > 1) {
    m.strategy = Strategy::kUlysses;
  } else {
    m.strategy = parse_strategy(f.strategy);
    SEQPAR_ARG_CHECK(m.strategy == Strategy::kRing || m.strategy == Strategy::kAllGather,
                     "--strategy ", f.strategy, " needs --ulysses-degree > 1; with only ",
                     "--ring-degree use ring or allgather");
  }
  return m;
}

void add_mesh_json(nlohmann::json& j, const MeshChoice& m, const std::string& backend,
                   bool with_cfg) {
  j["backend"] = backend;
  j["ranks"] = m.shape.world();
  if (with_cfg) j["cfg"] = m.shape.cfg;
  j["tp"] = m.shape.tp;
  j["ring_degree"] = m.shape.ring;
  j["ulysses_degree"] = m.shape.ulysses;
  j["strategy"] = strategy_name(m.strategy);
  j["layout"] = layout_name(m.layout);
  j["pad"] = m.pad;
}

ParallelContext rank_context(MeshComms& mc, const MeshChoice& m) { return model_context(mc, m); }

void run_on_threads(int n, const std::function<void(Communicator& world)>& body) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadWorld::run(n, [&](Communicator& world) {
    omp_set_num_threads(std::max(1, cores / n));
    body(world);
  });
}

int run_on_mpi(bool json, const std::function<void(int world_size)>& prepare,
               const std::function<int(Communicator& world)>& body) {
  SEQPAR_ARG_CHECK(mpi_available(), "--backend mpi: this build has no MPI; valid: threads");
  mpi_init(nullptr, nullptr);
  std::unique_ptr<Communicator> world = mpi_world();
  try {
    prepare(world->size());
  } catch (const InvalidArgument&) {
    world.reset();
    mpi_finalize();
    throw;
  }
  int code = 0;
  try {
    omp_set_num_threads(1);
    code = body(*world);
    if (world->rank() == 0 && (std::fflush(stdout) != 0 || std::ferror(stdout))) {
      std::fprintf(stderr, "seqpar: error: cannot write the output to stdout: %s\n",
                   std::strerror(errno));
      code = 1;
    }
    int32_t c = code;
    world->broadcast(&c, sizeof(c), 0);
    code = c;
  } catch (const std::exception& e) {
    world->abort(e.what());
    if (json && world->rank() == 0) print_json_error(e.what(), 1);
    std::fprintf(stderr, "seqpar: error: rank %d: %s\n", world->rank(), e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  world.reset();
  mpi_finalize();
  return code;
}

}  // namespace seqpar::cli
