// Hardware profiles: the rates the cost model and the pass-KV / pass-Q rule use.
// Built-in profiles: h100, h200 (NVLink inside a node, 50 GB/s per GPU between nodes),
// cpu-ethernet, local (this kind of CPU machine, in-process ranks).
// Thread-safety: immutable values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace seqpar {

struct HardwareProfile {
  std::string name;
  std::string description;
  double attention_flops = 0;   // attention FLOP/s of one rank at the working dtype
  double intra_node_bw = 0;     // bytes/s per rank inside a node
  double inter_node_bw = 0;     // bytes/s per rank between nodes
  double latency_s = 0;         // per message
  int ranks_per_node = 1;
  double memory_bytes = 0;      // per rank
};

// Throws InvalidArgument listing the known names.
HardwareProfile hardware_profile(std::string_view name);
std::vector<std::string> hardware_profile_names();

}  // namespace seqpar
