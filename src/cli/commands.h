// The seqpar subcommands. Each returns the process exit code: 0 ok, 1 failed (verification, a
// runtime error or a failed write), 2 bad arguments. Sizes are checked against core/limits.h.
#pragma once

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "seqpar/comm/communicator.h"
#include "seqpar/core/error.h"
#include "seqpar/core/files.h"
#include "seqpar/core/limits.h"
#include "seqpar/plan/hardware.h"

namespace seqpar::cli {

// Every integer option of `cmd` refuses a decimal that does not fit int64 (CLI11 would saturate
// it to INT64_MAX); the range of each is checked by its command against core/limits.h.
inline void guard_integer_options(CLI::App* cmd) {
  for (CLI::Option* opt : cmd->get_options()) {
    const std::string type = opt->get_type_name();
    if (type != "INT" && type != "UINT") continue;
    opt->check(CLI::Validator(
        [](std::string& s) -> std::string {
          const bool decimal =
              !s.empty() && s.find_first_not_of("+-0123456789") == std::string::npos;
          if (decimal && !limits::parse_int64(s)) return s + " is out of range (not an int64)";
          return "";
        },
        ""));
  }
}

// Under mpirun every rank meets the same error; rank 0 reports it.
inline bool reporting_rank() {
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return world_rank == nullptr || std::string(world_rank) == "0";
}

// With --json an error is also one JSON object on stdout, {"error": "...", "exit_code": 2}, for
// scripts; the one line on stderr stays.
inline void print_json_error(const std::string& message, int exit_code) {
  if (!reporting_rank()) return;
  nlohmann::json j;
  j["error"] = message;
  j["exit_code"] = exit_code;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// A parameter of the vocabulary (core/param_error.h) as the command line spells it: its flag
// (front_end_name) where the running subcommand has one (once run_subcommand runs it), else the
// name as it is; a name that is already a flag ("--output") as it is.
std::string flag_name(std::string_view name);
// The one line the command line prints for e: a ParamError's message with each parameter it names
// as flag_name spells it; a FileContentError's parameter so, then its detail (the file's own keys)
// as it is; any other error's message as it is.
std::string cli_message(const InvalidArgument& e);

// Runs a command's body; with json, an escaping error is printed as the JSON error object (exit
// code 2 for InvalidArgument, 1 otherwise) and rethrown for the one line on stderr.
template <typename Body>
int with_json_errors(bool json, Body&& body) {
  try {
    return body();
  } catch (const InvalidArgument& e) {
    if (json) print_json_error(cli_message(e), 2);
    throw;
  } catch (const std::exception& e) {
    if (json) print_json_error(e.what(), 1);
    throw;
  }
}

// The command's exit code once stdout is flushed; a failed write to stdout (a full disk, a closed
// pipe) throws Error, which exits 1 with one line.
inline int finish_output(int code) {
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw Error(detail::concat("cannot write the output to stdout: ", std::strerror(errno)));
  return code;
}

// An output file named by `flag`, prepared before the work so that a path that is an input of
// the run (InvalidArgument, exit 2) or whose folder cannot take a file (Error, exit 1) fails up
// front; nothing appears under its name until write() (or commit()) succeeds, and a run that fails
// or is killed before leaves nothing behind (core/files.h).
class OutputFile {
 public:
  OutputFile(std::string flag, const std::string& path) : out_(std::move(flag), path) {}
  const std::string& path() const { return out_.path(); }
  // The whole text, committed.
  void write(const std::string& text) {
    out_.write(text);
    out_.commit();
  }
  // For writers that append (write_safetensors); commit() when they are done.
  files::AtomicOutput& file() { return out_; }
  void commit() { out_.commit(); }

 private:
  files::AtomicOutput out_;
};

// Under MPI, a step that world rank 0 alone takes before the work (opening an output, writing the
// weights to save) and every rank must hear the outcome of, so that no rank waits in a collective
// for a rank that has given up. Every rank calls it; rank 0 runs step; one broadcast tells every
// rank its exit code: 0 when step returned, 2 when it threw InvalidArgument (an output that is an
// input of the run), 1 for any other error (a folder that does not exist). Rank 0 prints the one
// line (and the JSON error object when json). Rank 0 decides alone: on several machines, only its
// file system holds the output.
inline int on_rank0_first(Communicator& world, bool json, const std::function<void()>& step) {
  int32_t code = 0;
  std::string line;
  if (world.rank() == 0) {
    try {
      step();
    } catch (const InvalidArgument& e) {
      line = cli_message(e);
      code = 2;
    } catch (const std::exception& e) {
      line = e.what();
      code = 1;
    }
  }
  world.broadcast(&code, sizeof(code), 0);
  if (code != 0 && world.rank() == 0) {
    if (json) print_json_error(line, code);
    std::fprintf(stderr, "seqpar: error: %s\n", line.c_str());
  }
  return code;
}

// A file read whole (a hardware profile, a config) must be a regular file of at most
// limits::kMaxFileBytes; `what` names the flag. Missing files are left to the reader's message.
inline void check_readable_file(const std::string& what, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  SEQPAR_ARG_CHECK(S_ISREG(st.st_mode), what, " ", path,
                   " is not a regular file; give a profile JSON file");
  SEQPAR_ARG_CHECK(st.st_size <= limits::kMaxFileBytes, what, " ", path, " is ", st.st_size,
                   " bytes; a profile is at most ", limits::max_text(limits::kMaxFileBytes),
                   " bytes");
}

// --hardware NAME or PATH: the files load_hardware_profile would read are checked first (a path,
// or the user profile NAME.json); then the profile is loaded, so an unknown name is refused even
// where the profile is not used.
inline HardwareProfile load_profile_checked(const std::string& name) {
  const bool is_path = name.find('/') != std::string::npos ||
                       (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0);
  if (is_path) {
    check_readable_file("--hardware", name);
  } else if (const std::string dir = user_profile_dir(); !dir.empty() && !name.empty()) {
    check_readable_file("--hardware", dir + "/" + name + ".json");
  }
  return load_hardware_profile(name);
}

struct RunOptions {
  std::string strategy = "ring";
  std::string layout = "contiguous";
  std::string ulysses_mode = "uaa";
  int64_t ulysses_degree = 0;    // usp: ranks / ring_degree if 0
  int64_t ring_degree = 0;       // usp: ranks / ulysses_degree if 0
  std::optional<int64_t> ranks;  // unset: 2 on threads, the world size under MPI
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
  int64_t threads = 0;  // 0: cores / ranks on threads, 1 per process under MPI
  int64_t repeat = 3;
  std::optional<double> timeout_s;  // unset: SEQPAR_TIMEOUT_S or 60
  bool pad = false;                 // pad the sequence to a multiple of the ranks, mask the padding
  int64_t text_tokens = 0;          // joint attention: replicated text tokens
  int64_t cached = 0;               // decode / partial prefill: tokens in the distributed K/V cache
  int64_t fresh = 0;                // decode / partial prefill: new tokens (--new)
  std::string hardware = "local";   // profile for --strategy auto: this machine
  std::string softmax = "online";   // online | const-max (ring, usp)
  std::string schedule = "default";  // default | steal (ring) | ring (passq)
  std::string trace;                 // --trace FILE: Chrome/Perfetto trace of the run (empty: off)
  int64_t warmup = 1;                // untimed runs before the --repeat timed ones
  // Packed sequences (varlen): comma-separated lengths (empty: off); seq_given: --seq was given.
  std::string seq_lens, cached_lens, new_lens;
  bool seq_given = false;
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
  int64_t cfg = 1;
  int64_t tp = 1;
  int64_t ring_degree = 1;
  int64_t ulysses_degree = 1;
  int64_t heads = 0;             // required
  int64_t seq = 0;               // required
  std::optional<int64_t> ranks;  // unset: the product of the degrees
  bool json = false;
};
void add_mesh_command(CLI::App& app, MeshOptions& opts);
int mesh_command(const MeshOptions& opts);

// The mesh flags of the model-running subcommands (src/cli/mesh_run.h registers and resolves
// them).
struct MeshFlags {
  // Unset: from --parallel-config, else 1 (sequence_parallel_size: ulysses x ring, see
  // seqpar/parallel/config_file.h).
  std::optional<int64_t> cfg, tp, ring_degree, ulysses_degree, sequence_parallel_size;
  std::optional<std::string> ulysses_mode;  // unset: from --parallel-config, else uaa
  std::string parallel_config;              // --parallel-config FILE (JSON or YAML)
  std::string strategy = "ring";
  std::string layout = "contiguous";
  std::string schedule = "default";  // ring's steal (the prefill's attention)
  std::string softmax = "online";    // const-max: the rings' fixed maximum
  bool pad = false;
  std::string backend = "threads";
};

// How a decoder takes its prompt after the first chunk and keeps its K/V cache (seqpar model's
// llm presets, seqpar generate; src/cli/mesh_run.h registers and applies them).
struct ChunkFlags {
  int64_t prefill_chunk = 0;               // 0: the whole prompt at once
  std::string chunk_strategy = "auto";     // passkv | passq | auto (the planner's on --hardware)
  std::string chunk_schedule = "default";  // passq: default | ring
  std::string hardware = "local";          // profile auto replays the chunks' schedules on
  std::string kv_cache_dtype = "fp32";     // fp32 | bf16 | fp16 (Decoder::Options::kv_cache)
};

// seqpar model: a dit or llm preset on a cfg x tp x ring x ulysses mesh.
struct ModelOptions : MeshFlags, ChunkFlags {
  std::string preset = "tiny-dit";
  std::optional<std::string> weights;  // unset: seeded random weights
  std::string save_weights;
  int64_t frames = 9, height = 80, width = 112;  // dit
  int64_t steps = 1;
  float guidance = 5.0f;
  int64_t prompt_len = 1024;  // llm
  int64_t decode = 16;
  bool decode_given = false;  // --decode was on the command line
  // llm: packed documents of these lengths (seeded tokens), prefilled together instead of
  // --prompt-len and --decode (Decoder::prefill_documents).
  std::vector<int64_t> seq_lens;
  uint64_t seed = 0;
  bool verify = false;
  bool json = false;
};
void add_model_command(CLI::App& app, ModelOptions& opts);
int model_command(const ModelOptions& opts);

// seqpar generate: greedy decoding of a Hugging Face causal LM directory (Llama, Qwen2, Qwen3) on
// a tp x ring x ulysses mesh.
struct GenerateOptions : MeshFlags, ChunkFlags {
  std::string model;            // the directory
  std::string prompt_ids;       // "1,2,3"
  std::string prompt_ids_file;  // text (whitespace or commas), .safetensors or .npy
  int64_t max_new_tokens = 16;
  bool max_new_tokens_given = false;  // --max-new-tokens was on the command line
  bool ignore_eos = false;
  bool allow_long_context = false;
  std::string output;                 // safetensors: tokens (I64 [N]), logits (F32 [N, vocab])
  std::string trace;                  // Chrome/Perfetto JSON of prefill and decode (after load)
  std::vector<std::string> turn_ids;  // chat turns after the prompt's tokens: "4,5,6" each
  // Packed documents: "1,2,3" each, prefilled together (Decoder::prefill_documents), no decode.
  std::vector<std::string> document_ids;
  std::string weights_dtype = "checkpoint";  // checkpoint | int8 (Q8_0) | int8-channel
  std::string activations = "fp32";  // fp32 | bf16 | int8 (the linear layers' inputs rounded)
  bool json = false;
  bool quiet = false;
};
void add_generate_command(CLI::App& app, GenerateOptions& opts);
// --activations (generate and denoise): the flag's help text, and its value as a dtype
// (InvalidArgument naming the valid names; int8 only where int8_allowed, generate's check).
extern const char* const kActivationsHelp;
DType activations_flag(const std::string& value, bool int8_allowed = true);
int generate_command(const GenerateOptions& opts);

// seqpar denoise: a Wan checkpoint on latents and text embeddings from a safetensors file: one
// transformer call (noise_pred) or a flow-matching Euler loop with guidance (latents).
struct DenoiseOptions : MeshFlags {
  std::string model, inputs, output;
  int64_t steps = 0;  // 0: one transformer call at the inputs' timestep
  double guidance = 5.0;
  std::string activations = "fp32";      // fp32 | bf16 (the linear layers' inputs rounded)
  std::optional<double> guidance_2;      // A14B's low-noise expert (unset: --guidance)
  double shift = 5.0;                    // the scheduler's flow shift
  std::optional<double> boundary_ratio;  // unset: the checkpoint's
  bool json = false;
  std::string trace;
};
void add_denoise_command(CLI::App& app, DenoiseOptions& opts);
int denoise_command(const DenoiseOptions& opts);
// The same on a Qwen-Image checkpoint (denoise_qwen_image.cc): one transformer call.
int denoise_qwen_image(const DenoiseOptions& opts);
// The same on a FLUX.1 checkpoint (denoise_flux.cc): one transformer call.
int denoise_flux(const DenoiseOptions& opts);

// seqpar plan: the cost model's ranking of every mesh for a model (or one attention call) on a
// hardware profile; divisibility, pass-KV / pass-Q, simulation past one machine.
struct PlanOptions {
  std::string model;  // preset; empty: one bare attention call (--seq, --heads)
  int64_t frames = 0, height = 0, width = 0;  // dit / mmdit input (frames 0: 1 for images)
  int64_t seq = 0;  // tokens (llm prompt, bare attention, or dit tokens directly)
  int64_t heads = 0, kv_heads = 0, head_dim = 128;  // bare attention
  int64_t batch = 1;
  bool causal = false;                 // bare attention
  std::optional<int64_t> text_tokens;  // mmdit joint text tokens (unset: the preset's; bare: 0)
  bool no_guidance = false;            // dit / mmdit: one branch instead of two (no CFG)
  int64_t ranks = 8;
  std::string hardware = "h100";
  std::optional<int64_t> ranks_per_node;                         // unset: the profile's
  double memory_limit_gb = 0;                                    // 0: the profile's
  std::string dtype;                                             // empty: the profile's
  int64_t cfg = 0, tp = 0, ulysses_degree = 0, ring_degree = 0;  // 0: enumerate
  int64_t sequence_parallel_size = 0;                            // 0: enumerate
  std::string strategy, layout, ulysses_mode;                    // empty: enumerate
  std::string softmax;                                           // empty: online
  std::string schedule;                                          // empty: every schedule
  bool pad = false, no_pad = false;
  int64_t cached = 0, fresh = 0;  // decode / partial prefill
  bool json = false;
  int64_t top = 15;
  bool simulate = false;
  std::string sim_ranks = "8:1024";
  std::string svg;
};
void add_plan_command(CLI::App& app, PlanOptions& opts);
int plan_command(const PlanOptions& opts);

// seqpar calibrate: measures this machine and writes the `local` hardware profile.
struct CalibrateOptions {
  std::optional<std::string> out;  // unset: user_profile_dir()/local.json
  bool json = false;
  bool quick = false;
};
void add_calibrate_command(CLI::App& app, CalibrateOptions& opts);
int calibrate_command(const CalibrateOptions& opts);

}  // namespace seqpar::cli
