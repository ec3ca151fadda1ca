#include "mesh_run.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "seqpar/comm/mpi.h"
#include "seqpar/comm/threads.h"
#include "seqpar/parallel/config_file.h"
#include "seqpar/parallel/strategy_table.h"
#include "seqpar/plan/selection.h"

namespace seqpar::cli {

void add_mesh_flags(CLI::App* cmd, MeshFlags& f, bool with_cfg) {
  auto degree = [&](const std::string& names, std::optional<int64_t>& slot, const char* help) {
    cmd->add_option_function<int64_t>(
        names, [&slot](int64_t v) { slot = v; }, help);
  };
  if (with_cfg)
    degree("--cfg,--cfg-parallel-size,--cfg_parallel_size", f.cfg,
           "classifier-free guidance parallel size (1 or 2)");
  degree("--tp,--tensor-parallel-size,--tensor_parallel_size", f.tp, "tensor parallel size");
  degree("--ulysses-degree,--ulysses_degree", f.ulysses_degree, "Ulysses degree");
  degree("--ring-degree,--ring_degree", f.ring_degree, "ring degree");
  degree("--sequence-parallel-size,--sequence_parallel_size", f.sequence_parallel_size,
         "ulysses degree x ring degree (alone: the ring degree)");
  cmd->add_option("--parallel-config,--parallel_config", f.parallel_config,
                  "JSON or YAML file with tensor_parallel_size, cfg_parallel_size, "
                  "ulysses_degree, ring_degree, sequence_parallel_size, ulysses_mode (flags "
                  "override it)");
  cmd->add_option_function<std::string>(
      "--ulysses-mode,--ulysses_mode", [&f](const std::string& v) { f.ulysses_mode = v; },
      "strict | uaa (alias advanced_uaa)");
  cmd->add_option("--strategy", f.strategy, "ring | allgather (meshes without Ulysses)");
  cmd->add_option("--schedule", f.schedule, schedule_choices());
  cmd->add_option("--softmax", f.softmax, "online | const-max (the rings: ring, usp)");
  cmd->add_option("--layout", f.layout, "contiguous | striped | zigzag");
  cmd->add_flag("--pad", f.pad, "pad the sequence to a multiple of the sequence-parallel size");
  cmd->add_option("--backend", f.backend, "threads | mpi");
}

ParallelConfig resolve_mesh(const MeshFlags& f, int world) {
  DegreeSpec flags;
  flags.cfg = f.cfg;
  flags.tp = f.tp;
  flags.ring = f.ring_degree;
  flags.ulysses = f.ulysses_degree;
  flags.sp = f.sequence_parallel_size;
  flags.ulysses_mode = f.ulysses_mode;
  const DegreeSpec d = f.parallel_config.empty()
                           ? flags
                           : read_parallel_config_file(f.parallel_config).merged_with(flags);
  // The degrees in range before they are narrowed to int; model_mesh checks the rest.
  limits::check_range("--cfg", d.cfg.value_or(1), 1, 2);
  limits::check_range("--tp", d.tp.value_or(1), 1, limits::kMaxRanks);
  limits::check_range("--ring-degree", d.ring.value_or(1), 1, limits::kMaxRanks);
  limits::check_range("--ulysses-degree", d.ulysses.value_or(1), 1, limits::kMaxRanks);
  SEQPAR_ARG_CHECK(f.backend == "threads" || f.backend == "mpi", "--backend '", f.backend,
                   "' is unknown; valid: threads, mpi");
  const MeshShape m = resolve_degrees(d);
  ParallelConfig c = model_mesh(m.cfg, m.tp, m.ring, m.ulysses, f.strategy, f.layout,
                                d.ulysses_mode.value_or("uaa"), f.pad);
  c.schedule = parse_schedule_kind(f.schedule);
  c.softmax = parse_softmax_mode(f.softmax);
  // The options against the strategy the degrees imply (one rank runs locally and takes none).
  if (c.sp() > 1) check_options(c);
  SEQPAR_ARG_CHECK(world == 0 || c.world() == world, "the mesh ", mesh_shape_text(c.mesh),
                   " needs ", c.world(), " ranks but the MPI world has ", world,
                   "; launch mpirun -np ", c.world());
  SEQPAR_ARG_CHECK(world != 0 || c.world() <= limits::max_threads(), "the mesh ",
                   mesh_shape_text(c.mesh), " needs ", c.world(),
                   " rank threads; this process may start at most ", limits::max_threads(),
                   " (core/limits.h and RLIMIT_NPROC); use --backend mpi");
  return c;
}

void add_mesh_json(nlohmann::json& j, const ParallelConfig& m, const std::string& backend,
                   bool with_cfg) {
  j["backend"] = backend;
  j["ranks"] = m.world();
  if (with_cfg) j["cfg"] = m.mesh.cfg;
  j["tp"] = m.mesh.tp;
  j["ring_degree"] = m.mesh.ring;
  j["ulysses_degree"] = m.mesh.ulysses;
  j["strategy"] = strategy_name(m.strategy);
  j["layout"] = layout_name(m.layout);
  j["schedule"] = schedule_kind_name(m.schedule);
  j["softmax"] = softmax_mode_name(m.softmax);
  j["pad"] = m.pad;
}

void add_chunk_flags(CLI::App* cmd, ChunkFlags& f) {
  cmd->add_option("--prefill-chunk,--prefill_chunk", f.prefill_chunk,
                  "prefill the prompt in chunks of this many tokens: the first context parallel, "
                  "each next over the cache by pass-KV or pass-Q (0: all at once)");
  cmd->add_option("--chunk-strategy,--chunk_strategy", f.chunk_strategy,
                  "passkv | passq | auto for every chunk after the first (auto: the planner's "
                  "fastest on --hardware)");
  cmd->add_option("--chunk-schedule,--chunk_schedule", f.chunk_schedule,
                  "default | ring (passq: Q blocks around the ring)");
  cmd->add_option("--hardware", f.hardware,
                  "profile on which --chunk-strategy auto replays the chunks' schedules");
  cmd->add_option("--kv-cache-dtype,--kv_cache_dtype", f.kv_cache_dtype,
                  "fp32 | bf16 | fp16: the K/V cache as computed, or rounded to bf16 or fp16 as "
                  "it is stored (half the memory, and half the bytes a decoded token reads; the "
                  "queries over it rounded too, the products in fp32)")
      ->capture_default_str();
}

DType kv_cache_flag(const ChunkFlags& f) {
  const std::optional<DType> d = kv_cache_dtype_named(f.kv_cache_dtype);
  SEQPAR_ARG_CHECK(d.has_value(), "--kv-cache-dtype '", f.kv_cache_dtype,
                   "' is unknown; valid: ", kv_cache_dtype_names());
  return *d;
}

void apply_chunk_flags(const ChunkFlags& f, Decoder::Options& opts) {
  limits::check_range("--prefill-chunk", f.prefill_chunk, 0, limits::kMaxTokens);
  opts.kv_cache = kv_cache_flag(f);
  opts.prefill_chunk = f.prefill_chunk;
  opts.chunk_strategy.reset();
  opts.chunk_schedule = parse_schedule_kind(f.chunk_schedule, "--chunk-schedule");
  const HardwareProfile hw = load_profile_checked(f.hardware);
  if (f.chunk_strategy == "auto") {
    SEQPAR_ARG_CHECK(opts.chunk_schedule == ScheduleKind::kDefault, "--chunk-schedule ",
                     f.chunk_schedule, " pins a schedule; give it with --chunk-strategy passq");
    opts.choose_chunk = [hw](const AttnShape& call, int ranks) {
      ParallelConfig request;  // the group's settings: degrees chosen, a cache's placement
      request.mesh.ulysses = request.mesh.ring = 0;
      const AttnChoice c = choose_attention(request, ranks, call, hw);
      return std::pair{c.config, c.reason};
    };
    return;
  }
  opts.chunk_strategy = parse_strategy(f.chunk_strategy, "--chunk-strategy");
  SEQPAR_ARG_CHECK(runs_over_cache(*opts.chunk_strategy), "--chunk-strategy ", f.chunk_strategy,
                   " is not one over a cache; valid: passkv, passq, auto");
  SEQPAR_ARG_CHECK(schedule_applies(opts.chunk_schedule, *opts.chunk_strategy), "--chunk-schedule ",
                   f.chunk_schedule, " does not apply to --chunk-strategy ", f.chunk_strategy,
                   "; valid: ring with passq, default");
}

nlohmann::json chunks_json(const std::vector<Decoder::Chunk>& chunks) {
  nlohmann::json out = nlohmann::json::array();
  for (const Decoder::Chunk& c : chunks)
    out.push_back({{"begin", c.begin},
                   {"end", c.end},
                   {"cached", c.cached},
                   {"strategy", strategy_name(c.strategy)},
                   {"schedule", schedule_kind_name(c.schedule)},
                   {"reason", c.reason},
                   {"seconds", c.seconds}});
  return out;
}

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
  } catch (const InvalidArgument& e) {
    // Every rank finds the same argument error; rank 0 reports it before MPI_Finalize, since
    // once a rank has finalized and exits 2, mpiexec may stop the others before they print.
    const std::string line = cli_message(e);
    if (world->rank() == 0) {
      if (json) print_json_error(line, 2);
      std::fprintf(stderr, "seqpar: error: %s\n", line.c_str());
    }
    std::fflush(nullptr);
    world.reset();
    mpi_finalize();
    std::_Exit(2);
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
    // An argument error exits 2 as on threads; a rank that only heard of another's failure
    // stays quiet (that rank reports it).
    const auto* arg = dynamic_cast<const InvalidArgument*>(&e);
    const std::string line = arg ? cli_message(*arg) : std::string(e.what());
    const int exit_code = arg ? 2 : 1;
    if (json && world->rank() == 0) print_json_error(line, exit_code);
    if (dynamic_cast<const PeerFailed*>(&e)) {
      // The failing rank exits at once with its own code; mpiexec reports the first process to
      // exit, so this one leaves it a moment to be that process.
      std::fflush(nullptr);
      std::this_thread::sleep_for(std::chrono::seconds(2));
      std::_Exit(1);
    }
    // The same failure on a lower rank (a bad weight or input every rank reads): that rank
    // reports it, once for all.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (world->rank() > 0 && std::chrono::steady_clock::now() < until) {
      const auto [src, text] =
          world->peer_abort(std::chrono::duration_cast<std::chrono::milliseconds>(
              until - std::chrono::steady_clock::now()));
      if (src < 0) break;
      if (src < world->rank() && text == e.what()) {
        std::fflush(nullptr);
        std::_Exit(exit_code);
      }
    }
    std::fprintf(stderr, "seqpar: error: rank %d: %s\n", world->rank(), line.c_str());
    std::fflush(stderr);
    std::_Exit(exit_code);
  }
  world.reset();
  mpi_finalize();
  return code;
}

}  // namespace seqpar::cli
