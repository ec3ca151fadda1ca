// Fuzzes the parallel-config reader (--parallel-config FILE: vLLM-Omni's and xDiT's degree names,
// JSON or YAML as a stage config nests it). A text is either refused with InvalidArgument (one
// short line) or read; the degrees it gives then resolve to a mesh or are refused alike.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "one_line.h"
#include "seqpar/core/error.h"
#include "seqpar/parallel/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqpar;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  DegreeSpec d;
  try {
    d = parse_parallel_config(text, "fuzz.yaml");
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
    return 0;
  }
  try {
    const MeshShape m = resolve_degrees(d);
    if (m.cfg < 1 || m.tp < 1 || m.ring < 1 || m.ulysses < 1) __builtin_trap();
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
  }
  return 0;
}
