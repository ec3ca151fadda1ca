// Fuzzes the safetensors reader with whole files as bytes: parse_safetensors runs every check
// SafetensorsFile runs on a mapped file. Any input must either be rejected with InvalidArgument
// (one short line) or give entries whose byte ranges lie inside the input and whose readable
// tensors convert; anything else (another exception, a sanitizer report, a crash) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "one_line.h"
#include "seqpar/core/error.h"
#include "seqpar/model/safetensors.h"

namespace {
// The longest one-line message a rejection may produce (quoted values are cut to a fixed length).
// Tensors up to this many bytes are also read back as seqpar tensors and converted to fp32.
constexpr uint64_t kReadBackBytes = 1 << 16;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqpar;
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const SafetensorsHeader h = parse_safetensors(file, "fuzz.safetensors");
    for (const SafetensorsEntry& e : h.entries) {
      if (e.end < e.begin || h.data_offset + e.end > size) __builtin_trap();
      const auto dtype = e.seqpar_dtype();
      if (!dtype || e.nbytes() > kReadBackBytes) continue;
      Tensor t(e.shape, *dtype);
      if (t.nbytes() != e.nbytes()) __builtin_trap();
      if (e.nbytes() > 0) std::memcpy(t.raw(), data + h.data_offset + e.begin, e.nbytes());
      (void)t.to(DType::kF32);
    }
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
  }
  return 0;
}
