// Fuzzes the hardware-profile reader (plan --hardware FILE, run --strategy auto) with JSON text.
// A profile is either rejected with InvalidArgument (one short line) or read, and then writing it
// out and reading that back gives the same text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "one_line.h"
#include "seqpar/core/error.h"
#include "seqpar/plan/hardware.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqpar;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const HardwareProfile p = hardware_profile_from_json(text, "fuzz.json");
    const std::string written = hardware_profile_to_json(p);
    if (hardware_profile_to_json(hardware_profile_from_json(written, "written")) != written)
      __builtin_trap();
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
  }
  return 0;
}
