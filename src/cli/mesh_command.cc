// seqpar mesh: where every rank of a cfg x tp x ring x ulysses mesh sits, which heads it computes
// and which tokens it holds. Pure arithmetic over the Mesh (parallel/mesh.h); starts no ranks.
#include <cstdio>
#include <string>

#include "commands.h"
#include "seqpar/parallel/mesh.h"

namespace seqpar::cli {

void add_mesh_command(CLI::App& app, MeshOptions& o) {
  CLI::App* mesh = app.add_subcommand(
      "mesh", "Print each rank's mesh coordinates, heads and tokens (cfg x tp x ring x ulysses)");
  mesh->add_option("--tp,--tensor-parallel-size,--tensor_parallel_size", o.tp,
                   "tensor_parallel_size: heads split over tp ranks");
  mesh->add_option("--ulysses-degree,--ulysses_degree", o.ulysses_degree,
                   "ulysses_degree: the inner sequence-parallel axis");
  mesh->add_option("--ring-degree,--ring_degree", o.ring_degree,
                   "ring_degree: the outer sequence-parallel axis");
  mesh->add_option("--cfg,--cfg-parallel-size,--cfg_parallel_size", o.cfg,
                   "cfg_parallel_size: classifier-free-guidance branches (outermost)");
  mesh->add_option("--heads", o.heads, "attention heads H (divisible by --tp)")->required();
  mesh->add_option("--seq", o.seq, "sequence length S (tokens; at least ulysses x ring)")
      ->required();
  mesh->add_option_function<int64_t>(
          "--ranks", [&o](int64_t v) { o.ranks = v; },
          "world size (default: the product of the degrees; at most 2^16)")
      ->default_str("product");
  mesh->add_flag("--json", o.json, "print a JSON list, one object per rank");
  guard_integer_options(mesh);
}

namespace {

int print_mesh(const MeshOptions& o) {
  using limits::check_range;
  check_range("--cfg", o.cfg, 1, limits::kMaxRanks);
  check_range("--tp", o.tp, 1, limits::kMaxRanks);
  check_range("--ring-degree", o.ring_degree, 1, limits::kMaxRanks);
  check_range("--ulysses-degree", o.ulysses_degree, 1, limits::kMaxRanks);
  if (o.ranks) check_range("--ranks", *o.ranks, 1, limits::kMaxRanks);
  check_range("--heads", o.heads, 1, limits::kMaxHeads);
  check_range("--seq", o.seq, 1, limits::kMaxTokens);
  const MeshShape shape{.cfg = static_cast<int>(o.cfg),
                        .tp = static_cast<int>(o.tp),
                        .ring = static_cast<int>(o.ring_degree),
                        .ulysses = static_cast<int>(o.ulysses_degree)};
  const Mesh mesh(shape, static_cast<int>(o.ranks.value_or(0)));
  mesh.check(o.heads, o.seq);

  if (o.json) {
    std::printf("%s\n", mesh_rows_json(mesh, o.heads, o.seq).c_str());
    return finish_output(0);
  }

  const int64_t per_tp = o.heads / shape.tp;
  const int64_t lo = o.seq / shape.sp(), hi = (o.seq + shape.sp() - 1) / shape.sp();
  std::printf(
      "mesh: cfg_parallel_size %d x tensor_parallel_size %d x ring_degree %d x "
      "ulysses_degree %d = %d ranks; sequence_parallel_size %d\n",
      shape.cfg, shape.tp, shape.ring, shape.ulysses, shape.world(), shape.sp());
  std::printf("      %lld heads, %lld per tp rank; %lld tokens, %lld%s per sp rank\n",
              static_cast<long long>(o.heads), static_cast<long long>(per_tp),
              static_cast<long long>(o.seq), static_cast<long long>(lo),
              lo == hi ? "" : (" or " + std::to_string(hi)).c_str());
  std::printf("%6s %8s %7s %9s %12s %7s  %-13s %s\n", "rank", "cfg_rank", "tp_rank", "ring_rank",
              "ulysses_rank", "cp_rank", "heads", "tokens");
  for (int r = 0; r < mesh.world_size(); ++r) {
    const MeshCoord c = mesh.coord(r);
    const IndexRange h = mesh.heads(o.heads, c.tp_rank);
    const IndexRange t = mesh.tokens(o.seq, c.cp_rank);
    // Inclusive ranges for reading ("heads 10-19"); the JSON holds half-open [first, end).
    const std::string heads = std::to_string(h.begin) + "-" + std::to_string(h.end - 1);
    const std::string tokens = std::to_string(t.begin) + "-" + std::to_string(t.end - 1);
    std::printf("%6d %8d %7d %9d %12d %7d  %-13s %s\n", c.rank, c.cfg_rank, c.tp_rank, c.ring_rank,
                c.ulysses_rank, c.cp_rank, heads.c_str(), tokens.c_str());
  }
  return finish_output(0);
}

}  // namespace

int mesh_command(const MeshOptions& o) {
  return with_json_errors(o.json, [&] { return print_mesh(o); });
}

}  // namespace seqpar::cli
