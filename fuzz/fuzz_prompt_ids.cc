// Fuzzes the readers of token ids users give seqpar generate: the first byte picks the text list
// (--prompt-ids, --prompt-ids-file as text, --turn-ids) or the .npy reader, the rest is the text
// or the file's bytes. Either ids come back (at most one per input byte: nothing is invented) or
// InvalidArgument says why in one short line naming the flag or file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "one_line.h"
#include "prompt_ids.h"
#include "seqpar/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqpar;
  if (size == 0) return 0;
  const bool npy = data[0] & 1;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string where = npy ? "--prompt-ids-file ids.npy" : "--prompt-ids";
  try {
    const std::vector<int64_t> ids =
        npy ? cli::parse_npy_ids(where, bytes) : cli::parse_id_text(where, bytes);
    if (ids.size() > bytes.size()) __builtin_trap();
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
    if (std::string_view(e.what()).rfind(where, 0) != 0) __builtin_trap();
  }
  return 0;
}
