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
  std::string softmax = "online";  // online | const-max (ring, usp)
  std::string trace;  // --trace FILE: Chrome/Perfetto trace of the run (empty: off)
  int warmup = 1;     // untimed runs before the --repeat timed ones
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

// seqpar model: a dit or llm preset on a cfg x tp x ring x ulysses mesh.
struct ModelOptions {
  std::string preset = "tiny-dit";
  std::string weights, save_weights;
  int cfg = 1, tp = 1, ring_degree = 1, ulysses_degree = 1;
  std::string strategy = "ring";
  std::string layout = "contiguous";
  std::string ulysses_mode = "uaa";
  bool pad = false;
  int64_t frames = 9, height = 80, width = 112;  // dit
  int steps = 1;
  float guidance = 5.0f;
  int64_t prompt_len = 1024;  // llm
  int decode = 16;
  uint64_t seed = 0;
  std::string backend = "threads";
  bool verify = false;
  bool json = false;
};
void add_model_command(CLI::App& app, ModelOptions& opts);
int model_command(const ModelOptions& opts);

// seqpar plan: the cost model's ranking of every mesh for a model (or one attention call) on a
// hardware profile; divisibility, pass-KV / pass-Q, simulation past one machine.
struct PlanOptions {
  std::string model;  // preset; empty: one bare attention call (--seq, --heads)
  int64_t frames = 0, height = 0, width = 0;  // dit / mmdit input (frames 0: 1 for images)
  int64_t seq = 0;      // tokens (llm prompt, bare attention, or dit tokens directly)
  int64_t heads = 0, kv_heads = 0, head_dim = 128;  // bare attention
  int64_t batch = 1;
  bool causal = false;  // bare attention
  int64_t text_tokens = -1;  // mmdit joint text tokens (-1: the preset's); bare attention: 0
  bool no_guidance = false;  // dit / mmdit: one branch instead of two (no CFG)
  int ranks = 8;
  std::string hardware = "h100";
  int ranks_per_node = -1;     // -1: the profile's
  double memory_limit_gb = 0;  // 0: the profile's
  std::string dtype;           // empty: the profile's
  int cfg = 0, tp = 0, ulysses_degree = 0, ring_degree = 0;  // 0: enumerate
  std::string strategy, layout, ulysses_mode;                 // empty: enumerate
  bool pad = false, no_pad = false;
  int64_t cached = 0, fresh = 0;  // decode / partial prefill
  bool json = false;
  int top = 15;
  bool simulate = false;
  std::string sim_ranks = "8:1024";
  std::string svg;
};
void add_plan_command(CLI::App& app, PlanOptions& opts);
int plan_command(const PlanOptions& opts);

// seqpar calibrate: measures this machine and writes the `local` hardware profile.
struct CalibrateOptions {
  std::string out;  // empty: user_profile_dir()/local.json
  bool json = false;
  bool quick = false;
};
void add_calibrate_command(CLI::App& app, CalibrateOptions& opts);
int calibrate_command(const CalibrateOptions& opts);

}  // namespace seqpar::cli
