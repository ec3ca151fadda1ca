// Safetensors weights: a validating reader (SafetensorsFile), a writer (write_safetensors) and
// load_checked, the one call a model makes per parameter.
//
// File layout (https://github.com/huggingface/safetensors):
//   [8 bytes: N, little-endian u64] [N bytes: JSON header] [data section]
//   header = {"<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"<key>": "<string>", ...}}
//   (data_offsets are relative to the start of the data section)
//
// The reader validates the whole header when the file is opened (docs/weights.md lists the rules):
// N <= 100 MB and within the file, valid JSON nesting at most JsonLimits{}.max_depth (64) levels
// (core/json_limits.h; checked before parsing) with unique names, every entry has a known dtype, a
// shape and data_offsets with shape product x dtype size == end - begin, and the byte ranges,
// sorted, cover the data section exactly (no gap, no overlap, nothing past the end). Any
// violation throws InvalidArgument with one line naming the file, the tensor and the problem:
//   "weights.safetensors: tensor 'blocks.0.attn.q.weight' has shape [64, 64] (16384 bytes as F32)
//    but its byte range is 8192 bytes"
// Headers may name any safetensors dtype (F64, I64, U8, ...) so that such files open and list;
// only F32, BF16 and F16 tensors can be read as a seqpar::Tensor (others throw when read).
//
// Thread-safety: a SafetensorsFile is immutable after construction (the file is memory-mapped
// read-only); concurrent reads from any threads are safe. Tensors it returns own their storage and
// may outlive it; bytes() views do not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/core/files.h"
#include "seqpar/core/tensor.h"

namespace seqpar {

// Largest JSON header accepted (as the reference implementation: 100 MB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor of the header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // as written in the file: "F32", "BF16", "F16", "F64", "I64", ...
  std::vector<int64_t> shape;   // may be empty (a scalar) or hold zeros (an empty tensor)
  uint64_t begin = 0, end = 0;  // byte range [begin, end) within the data section
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
  // The seqpar dtype, if seqpar can read this tensor (F32, BF16, F16); nullopt otherwise.
  std::optional<DType> seqpar_dtype() const;
};

// "F32", "BF16", "F16": the safetensors spelling of a seqpar dtype.
std::string_view safetensors_dtype_name(DType dtype);

// The validated header of a safetensors file held in memory.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + the JSON header's size: where the data section starts
};

// Validates `file` (the whole file's bytes) by the rules above and returns its header; tensor
// bytes are file[data_offset + begin, data_offset + end). Throws InvalidArgument ("<label>: ...",
// one line, untrusted names and values quoted to a fixed length) as SafetensorsFile does.
// SafetensorsFile reads through it; so does the fuzz target (fuzz/fuzz_safetensors.cc).
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& label);

class SafetensorsFile {
 public:
  // Opens, maps and validates `path`. Throws InvalidArgument ("<path>: ...", one line) if the file
  // cannot be read or breaks any rule above.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, sorted by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return entries_.size(); }
  bool contains(const std::string& name) const;
  // Throws InvalidArgument naming the file and the missing tensor.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The "__metadata__" map (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The raw bytes of a tensor (little-endian, row-major), valid while this file lives.
  std::span<const std::byte> bytes(const std::string& name) const;
  // Tells the kernel that this process is done with `range` (a part of some bytes() view) for
  // now: its pages leave the process's resident set (they stay in the page cache, and a later
  // read maps them again). A loader that copies what it needs calls this after each copy, so the
  // mapped checkpoint does not count as resident memory on top of the copies.
  void release(std::span<const std::byte> range) const;
  // A copy of the tensor in its stored dtype, with its stored shape. Throws InvalidArgument if
  // the tensor is missing or its dtype is not F32/BF16/F16.
  Tensor tensor(const std::string& name) const;
  // The same, converted to `to` (bf16/fp16 -> fp32 exactly; fp32 -> bf16/fp16 rounds to nearest).
  Tensor tensor(const std::string& name, DType to) const;

 private:
  void unmap();

  std::string path_;
  const std::byte* map_ = nullptr;  // the whole file, read-only
  size_t map_bytes_ = 0;
  size_t data_offset_ = 0;  // 8 + header size
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (each in its own dtype, F32/BF16/F16) and `metadata` as a safetensors file:
// the header padded with spaces to a multiple of 8 bytes, tensors laid out in name order.
// Throws InvalidArgument for the reserved name "__metadata__" and for a path that is an input of
// this process, Error if the file cannot be written. The file appears whole or not at all
// (core/files.h); the first form writes into `out` without committing it.
void write_safetensors(files::AtomicOutput& out, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The tensors of a sharded checkpoint by name: `index_path` (JSON {"weight_map": {tensor: file
// name}}, the files in `dir`) read and checked, each shard opened once. Refused in one line naming
// the index or the shard (FileContentError): a file name with a folder, a missing shard, a tensor
// missing from the shard the index names, a shard's tensor the index does not list (unless
// `ignorable(name)`), a tensor in two shards.
using SafetensorsFiles = std::map<std::string, std::shared_ptr<const SafetensorsFile>>;
SafetensorsFiles open_safetensors_index(const std::string& index_path, const std::string& dir,
                                        bool (*ignorable)(const std::string&) = nullptr);

// Every value of tensor `name` of `file` as a double (small inputs: timesteps, masks, shapes): F32,
// BF16, F16, F64, I64, I32, I16, I8, U8 or BOOL; InvalidArgument naming the tensor otherwise.
std::vector<double> tensor_values(const SafetensorsFile& file, const std::string& name);

// Every tensor of `file` is one of `known` (an input file's names, as the model's call spells
// them); otherwise InvalidArgument: "PATH: tensor 'x' is not an input of WHAT; valid: ...", so no
// tensor a user gave is silently left unread.
void check_tensor_names(const SafetensorsFile& file, std::span<const std::string_view> known,
                        std::string_view what);

// The model loader's call: tensor `name` of `file`, checked to have exactly `expected_shape`, and
// converted to `to`. Throws InvalidArgument (one line: file, tensor, expected and found shape,
// or that the tensor is missing) otherwise.
Tensor load_checked(const SafetensorsFile& file, const std::string& name,
                    const std::vector<int64_t>& expected_shape, DType to);

}  // namespace seqpar
