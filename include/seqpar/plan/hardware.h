// Hardware profiles: the rates the cost model and the pass-KV / pass-Q rule use.
//
// A profile is a small JSON object (profiles/*.json in the source tree; the fields are those of
// HardwareProfile below, by name). Built-in profiles, compiled in from profiles/*.json:
//   h100, h200    NVLink inside a node of 8, 50 GB/s per GPU between nodes
//   cpu-ethernet  CPU nodes, one rank per core, 25 Gb/s Ethernet between nodes
//   local         this machine before `seqpar calibrate`: ranks as threads sharing its cores
// `load_hardware_profile(name)` also reads user profiles: a path (anything with a '/' or ending in
// .json), or NAME.json in user_profile_dir() ($SEQPAR_PROFILE_DIR, else $XDG_CONFIG_HOME/seqpar,
// else ~/.config/seqpar), where `seqpar calibrate` writes local.json; then the built-in one.
//
// Network model (two levels): a message between ranks of one node costs
// latency_s + bytes / intra_node_bw, between nodes inter_node_latency_s + bytes / inter_node_bw.
// World rank w sits on node w / ranks_per_node (ranks_per_node <= 0: every rank on one node).
// Thread-safety: immutable values; the loaders read files and the environment only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace seqpar {

struct HardwareProfile {
  std::string name;
  std::string description;
  // Attention FLOP/s of one rank at `dtype` (of one core if shared_node).
  double attention_flops = 0;
  double intra_node_bw = 0;  // bytes/s per rank inside a node, each direction
  double inter_node_bw = 0;  // bytes/s per rank between nodes, each direction
  double latency_s = 0;      // per message inside a node
  int ranks_per_node = 1;    // <= 0: all ranks on one node
  double memory_bytes = 0;   // per rank (per node if shared_node)
  // Fields added with the planner; their defaults keep a profile that lacks them meaningful.
  double inter_node_latency_s = 0;  // per message between nodes; 0: latency_s
  double gemm_flops = 0;            // FLOP/s of the linear layers; 0: attention_flops
  double local_copy_bw = 0;         // bytes/s of copies inside a rank (packing, merging); 0: free
  double overlap = 1;               // fraction of a ring transfer that can hide behind compute
  std::string dtype = "bf16";       // the dtype the rates hold for; the planner's default dtype
  // CPU threads backend: the ranks of a node are threads sharing its cores and memory. The
  // rates are then per core, a rank running max(1, cores / ranks on the node) threads (as
  // `seqpar run` does), and memory_bytes is the node's.
  bool shared_node = false;
  int cores_per_node = 0;           // shared_node: cores; 0: this machine's hardware threads
  double thread_efficiency = 1;     // shared_node: rate of t > 1 threads = t · eff · one core's
  std::string source = "built-in";  // where it was read from (a path, or "built-in")
};

// The built-in profile `name`. Throws InvalidArgument listing the known names.
HardwareProfile hardware_profile(std::string_view name);
std::vector<std::string> hardware_profile_names();

// A profile by name or path, user profiles first (see above). Throws InvalidArgument naming the
// file or the valid names when nothing fits, or the field that is wrong in a file.
HardwareProfile load_hardware_profile(std::string_view name_or_path);

// $SEQPAR_PROFILE_DIR, else $XDG_CONFIG_HOME/seqpar, else $HOME/.config/seqpar ("" if none).
std::string user_profile_dir();

// JSON text <-> profile. Unknown keys are rejected (InvalidArgument naming them); missing keys
// keep their defaults except name, attention_flops and the bandwidths, which are required.
HardwareProfile hardware_profile_from_json(std::string_view text, std::string_view source);
std::string hardware_profile_to_json(const HardwareProfile& p);

// Rates of one rank when `ranks_on_node` ranks share its node (only shared_node profiles depend
// on it): threads it runs, attention and GEMM FLOP/s, memory bytes.
int profile_cores(const HardwareProfile& p);
int threads_per_rank(const HardwareProfile& p, int ranks_on_node);
double rank_attention_flops(const HardwareProfile& p, int ranks_on_node);
double rank_gemm_flops(const HardwareProfile& p, int ranks_on_node);
double rank_memory_bytes(const HardwareProfile& p, int ranks_on_node);

}  // namespace seqpar
