// Fuzzes the sharded checkpoint's index reader (open_safetensors_index): the input is
// model.safetensors.index.json beside two real shards (a.safetensors: x, y; b.safetensors: z),
// written once into a fresh folder. Either every tensor of the shards comes back mapped to the
// shard that holds it, or InvalidArgument says why in one short line naming the index or shard.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "one_line.h"
#include "seqpar/core/error.h"
#include "seqpar/core/tensor.h"
#include "seqpar/model/safetensors.h"
#include "temp_dir.h"

namespace {

const std::string& folder() {
  static const seqpar::fuzz::TempDir tmp("seqpar-fuzz-index");
  static const std::string dir = [] {
    using seqpar::Tensor;
    seqpar::write_safetensors(tmp.path() + "/a.safetensors",
                              {{"x", Tensor({2, 3})}, {"y", Tensor({4})}});
    seqpar::write_safetensors(tmp.path() + "/b.safetensors", {{"z", Tensor({1})}});
    return tmp.path();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqpar;
  const std::string& dir = folder();
  const std::string index = dir + "/model.safetensors.index.json";
  std::FILE* f = std::fopen(index.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    const SafetensorsFiles files = open_safetensors_index(index, dir);
    for (const auto& [name, file] : files)
      if (!file->contains(name)) __builtin_trap();
    // Every tensor of a shard the index names is in the map (else it was refused).
    for (const auto& [name, file] : files)
      for (const std::string& other : file->names())
        if (!files.count(other)) __builtin_trap();
  } catch (const InvalidArgument& e) {
    fuzz::expect_one_short_line(e.what());
    const std::string_view m = e.what();
    if (m.rfind(index, 0) != 0 && m.rfind(dir + "/", 0) != 0) __builtin_trap();
  }
  return 0;
}
