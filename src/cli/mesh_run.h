// What the model-running subcommands (seqpar model, seqpar generate) share: their mesh flags
// resolved into a mesh and an attention strategy, a rank's ParallelContext, and the two ways to
// start the ranks (threads of this process, or the processes of an MPI world).
// Thread-safety: run_on_threads calls its body from every rank thread at once.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "seqpar/comm/communicator.h"
#include "seqpar/model/context.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/model_run.h"
#include "seqpar/parallel/mesh.h"

namespace seqpar::cli {

// Registers the degrees (--tp / --tensor-parallel-size, --ulysses-degree, --ring-degree,
// --sequence-parallel-size, and --cfg / --cfg-parallel-size when with_cfg), --parallel-config,
// --strategy, --layout, --ulysses-mode, --pad and --backend on `cmd`.
void add_mesh_flags(CLI::App* cmd, MeshFlags& f, bool with_cfg);

// The flags checked against core/limits.h and each other; world: the MPI world size (0 under
// threads), which must equal the mesh's rank count.
ParallelConfig resolve_mesh(const MeshFlags& f, int world);

// The mesh a model command ran on, as its --json reports it: backend, ranks, (cfg,) tp,
// ring_degree, ulysses_degree, strategy, layout, pad.
void add_mesh_json(nlohmann::json& j, const ParallelConfig& m, const std::string& backend, bool with_cfg);

// Registers --prefill-chunk, --chunk-strategy, --chunk-schedule, --hardware and --kv-cache-dtype
// on `cmd`.
void add_chunk_flags(CLI::App* cmd, ChunkFlags& f);
// --kv-cache-dtype as a dtype (InvalidArgument naming the valid names).
DType kv_cache_flag(const ChunkFlags& f);
// The flags checked (limits, names, the profile) and set in a decoder's options.
void apply_chunk_flags(const ChunkFlags& f, Decoder::Options& opts);
// A decoder's chunks as the JSON's prefill_chunks: begin, end, cached, strategy, reason, seconds.
nlohmann::json chunks_json(const std::vector<Decoder::Chunk>& chunks);

// Runs body(world) on n rank threads, each with cores / n OpenMP threads.
void run_on_threads(int n, const std::function<void(Communicator& world)>& body);

// Under MPI: initializes MPI; prepare(world size) on every rank (an InvalidArgument is reported
// by rank 0 as one line (and the JSON error object when json) before MPI is finalized, and every
// rank exits 2); then body(world) on every rank
// with one OpenMP thread. World rank 0's return (and a failed write to its stdout) becomes every
// rank's exit code. An exception on any rank aborts the world: one line on stderr (and the JSON
// error object when json), exit 1.
int run_on_mpi(bool json, const std::function<void(int world_size)>& prepare,
               const std::function<int(Communicator& world)>& body);

}  // namespace seqpar::cli
