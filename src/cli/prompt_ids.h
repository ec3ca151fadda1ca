// Token ids as users give them (seqpar generate's --prompt-ids, --prompt-ids-file, --turn-ids):
// a list in text, a .npy or a .safetensors file of integers. Every refusal is InvalidArgument,
// one line naming the flag (and file) and what is valid.
// Thread-safety: pure functions (the readers read their file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace seqpar::cli {

// Largest prompt file read whole (text or .npy): 8 bytes per token of limits::kMaxTokens would
// not fit memory anyway.
inline constexpr int64_t kMaxPromptFileBytes = int64_t{1} << 30;

// `path` read whole: a regular file of at most kMaxPromptFileBytes (`flag` names it).
std::string read_file(const std::string& flag, const std::string& path);

// "1, 2 3\n4": integers separated by commas and/or whitespace. A comma must sit between two ids
// (an npy shape's "3," with trailing_comma may end with one).
std::vector<int64_t> parse_id_text(const std::string& flag, const std::string& text,
                                   bool trailing_comma = false);

// A .npy file's bytes (`where` names it): an array of little-endian integers, shape (N,) or
// (1, N), C order, widened to int64.
std::vector<int64_t> parse_npy_ids(const std::string& where, const std::string& data);
std::vector<int64_t> read_npy_ids(const std::string& flag, const std::string& path);

// One tensor of integers of shape [N] or [1, N] in a safetensors file.
std::vector<int64_t> read_safetensors_ids(const std::string& flag, const std::string& path);

}  // namespace seqpar::cli
