#include "seqpar/plan/hardware.h"

#include "seqpar/core/error.h"

namespace seqpar {

namespace {
std::vector<HardwareProfile> builtin_profiles() {
  return {
      // Dense bf16 tensor-core peak; NVLink 4 (450 GB/s per direction per GPU) inside a node,
      // 400 Gb/s (50 GB/s) per GPU between nodes.
      {"h100", "NVIDIA H100 SXM, 8 per node, NVLink inside, 50 GB/s per GPU between nodes",
       989e12, 450e9, 50e9, 10e-6, 8, 80e9},
      {"h200", "NVIDIA H200 SXM, 8 per node, NVLink inside, 50 GB/s per GPU between nodes",
       989e12, 450e9, 50e9, 10e-6, 8, 141e9},
      {"cpu-ethernet", "CPU nodes (one rank per core), 25 Gb/s Ethernet between nodes", 50e9,
       10e9, 3.1e9, 30e-6, 32, 8e9},
      {"local", "this machine, ranks as threads: about 50 GFLOP/s fp32 attention per core, memory copies between ranks",
       50e9, 8e9, 8e9, 5e-6, 2, 12e9},
  };
}
}  // namespace

std::vector<std::string> hardware_profile_names() {
  std::vector<std::string> names;
  for (const auto& p : builtin_profiles()) names.push_back(p.name);
  return names;
}

HardwareProfile hardware_profile(std::string_view name) {
  for (auto& p : builtin_profiles())
    if (p.name == name) return p;
  std::string valid;
  for (const auto& n : hardware_profile_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw InvalidArgument(detail::concat("--hardware '", name, "' is unknown; valid: ", valid));
}

}  // namespace seqpar
