// The seqpar subcommands. Each returns the process exit code: 0 ok, 1 failed (verification or a
// runtime error), 2 bad arguments.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace seqpar::cli {

struct RunOptions {
  std::string strategy = "ring";
  std::string layout = "contiguous";
  std::string ulysses_mode = "uaa";
  int ulysses_degree = 0;  // usp: ranks / ring_degree if 0
  int ring_degree = 0;     // usp: ranks / ulysses_degree if 0
  int ranks = kUnset;  // unset: 2 on threads, the world size under MPI
  static constexpr int kUnset = -1000000;
  int64_t seq = 4096;
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t head_dim = 128;
  int64_t batch = 1;
  bool causal = false;
  std::string dtype = "fp32";
  std::string backend = "threads";
  bool verify = false;
  bool json = false;
  uint64_t seed = 0;
  int threads = 0;  // 0: cores / ranks on threads, 1 per process under MPI
  int repeat = 3;
  double timeout_s = 0;  // 0: SEQPAR_TIMEOUT_S or 60
  bool pad = false;           // pad the sequence to a multiple of the ranks, mask the padding
  int64_t text_tokens = 0;    // joint attention: replicated text tokens
  int64_t cached = 0;         // decode / partial prefill: tokens in the distributed K/V cache
  int64_t fresh = 0;          // decode / partial prefill: new tokens (--new)
  std::string hardware = "h100";  // profile for --strategy auto
};

void add_run_command(CLI::App& app, RunOptions& opts);
int run_command(const RunOptions& opts);

struct InfoOptions {
  bool json = false;
};
void add_info_command(CLI::App& app, InfoOptions& opts);
int info_command(const InfoOptions& opts);

// seqpar mesh: per-rank coordinates, heads and tokens of a cfg x tp x ring x ulysses mesh.
struct MeshOptions {
  int cfg = 1;
  int tp = 1;
  int ring_degree = 1;
  int ulysses_degree = 1;
  int64_t heads = 0;  // required
  int64_t seq = 0;    // required
  int ranks = kUnset;  // unset: the product of the degrees
  static constexpr int kUnset = -1000000;
  bool json = false;
};
void add_mesh_command(CLI::App& app, MeshOptions& opts);
int mesh_command(const MeshOptions& opts);

}  // namespace seqpar::cli
