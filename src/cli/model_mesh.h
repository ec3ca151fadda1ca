// The mesh flags the model commands share (`seqpar model`, `seqpar denoise`): cfg x tp x ring x
// ulysses degrees, attention strategy, layout, Ulysses mode and padding; their validation, and
// one rank's ParallelContext on a MeshComms.
// Thread-safety: values; rank_context is called by each rank for its own MeshComms.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "cli/commands.h"
#include "seqpar/model/context.h"
#include "seqpar/parallel/mesh.h"

namespace seqpar::cli {

struct MeshChoice {
  MeshShape shape;
  Strategy strategy = Strategy::kRing;  // usp / ulysses follow from the degrees
  Layout layout = Layout::kContiguous;
  UlyssesMode mode = UlyssesMode::kUaa;
  bool pad = false;
};

// --cfg --tp --ulysses-degree --ring-degree --strategy --layout --ulysses-mode --pad on `cmd`.
void add_mesh_flags(CLI::App* cmd, MeshFlags& f);

// Checks the flags (ranges, names, --tp against `heads` of `model`, the world size under MPI
// when world > 0) and picks the strategy: usp with both degrees > 1, ulysses with only Ulysses,
// else --strategy (ring or allgather). Throws InvalidArgument naming the flag.
MeshChoice resolve_mesh(const MeshFlags& f, int64_t heads, const std::string& model, int world);

// The ParallelContext of this rank of `mc`.
ParallelContext rank_context(MeshComms& mc, const MeshChoice& m);

}  // namespace seqpar::cli
