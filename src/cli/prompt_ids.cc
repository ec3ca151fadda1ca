// Token ids as users give them: a list in text, a .npy or a .safetensors file (prompt_ids.h).
#include "prompt_ids.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string_view>

#include "seqpar/core/error.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/limits.h"
#include "seqpar/model/safetensors.h"

namespace seqpar::cli {

std::string read_file(const std::string& flag, const std::string& path) {
  return files::read_input(flag, path, "a file of token ids", kMaxPromptFileBytes);
}

std::vector<int64_t> parse_id_text(const std::string& flag, const std::string& text,
                                   bool trailing_comma) {
  std::vector<int64_t> ids;
  std::string item;
  bool comma = false;  // a comma since the last id: the next must be an id
  auto flush = [&] {
    if (item.empty()) return;
    const auto v = limits::parse_int64(item);
    SEQPAR_ARG_CHECK(v.has_value(), flag, ": '", quote_for_message(item),
                     "' is not a token id; valid: integers separated by commas or whitespace");
    ids.push_back(*v);
    item.clear();
    comma = false;
  };
  for (char c : text) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      flush();
      if (c != ',') continue;
      SEQPAR_ARG_CHECK(!comma && !ids.empty(), flag, ": an empty item ",
                       ids.empty() ? "before the first comma" : "between two commas",
                       "; valid: integers separated by commas or whitespace");
      comma = true;
    } else {
      item += c;
    }
  }
  flush();
  SEQPAR_ARG_CHECK(!comma || trailing_comma, flag,
                   ": a comma ends the list; valid: integers separated by commas or whitespace");
  return ids;
}

namespace {

// Little-endian integers of a numpy/safetensors dtype, widened to int64.
std::vector<int64_t> widen(const std::string& what, const std::byte* p, int64_t n, char kind,
                           int size) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* e = p + i * size;
    uint64_t u = 0;
    std::memcpy(&u, e, size);
    if (kind == 'i' && size < 8 && (u >> (8 * size - 1)) & 1) u |= ~uint64_t{0} << (8 * size);
    SEQPAR_ARG_CHECK(kind == 'i' || u <= static_cast<uint64_t>(INT64_MAX), what, ": element ", i,
                     " does not fit int64");
    ids[i] = static_cast<int64_t>(u);
  }
  return ids;
}

}  // namespace

std::vector<int64_t> read_safetensors_ids(const std::string& flag, const std::string& path) {
  SafetensorsFile f(path);
  SEQPAR_ARG_CHECK(f.size() == 1, flag, " ", path, ": holds ", f.size(),
                   " tensors; expected one integer tensor of token ids");
  const SafetensorsEntry& e = f.entries()[0];
  static const std::vector<std::pair<std::string, std::pair<char, int>>> kinds = {
      {"I64", {'i', 8}}, {"I32", {'i', 4}}, {"I16", {'i', 2}}, {"I8", {'i', 1}},
      {"U64", {'u', 8}}, {"U32", {'u', 4}}, {"U16", {'u', 2}}, {"U8", {'u', 1}}};
  auto k = std::find_if(kinds.begin(), kinds.end(), [&](auto& x) { return x.first == e.dtype; });
  SEQPAR_ARG_CHECK(k != kinds.end(), flag, " ", path, ": tensor '", quote_for_message(e.name),
                   "' is ", e.dtype, "; valid: I64, I32, I16, I8, U64, U32, U16, U8");
  SEQPAR_ARG_CHECK(e.shape.size() == 1 || (e.shape.size() == 2 && e.shape[0] == 1), flag, " ", path,
                   ": tensor '", quote_for_message(e.name),
                   "' must have shape [N] or [1, N] (one prompt)");
  return widen(flag + " " + path, f.bytes(e.name).data(), e.numel(), k->second.first,
               k->second.second);
}

std::vector<int64_t> parse_npy_ids(const std::string& where, const std::string& data) {
  SEQPAR_ARG_CHECK(data.size() >= 10 && data.compare(0, 6, "\x93NUMPY") == 0, where,
                   ": not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(data[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(data[8]) | static_cast<unsigned char>(data[9]) << 8;
    start = 10;
  } else {
    SEQPAR_ARG_CHECK(data.size() >= 12, where, ": truncated .npy header");
    for (int i = 0; i < 4; ++i)
      header_len |= size_t{static_cast<unsigned char>(data[8 + i])} << (8 * i);
    start = 12;
  }
  SEQPAR_ARG_CHECK(start + header_len <= data.size(), where, ": truncated .npy header");
  const std::string header = data.substr(start, header_len);
  // The text after 'key': (spaces skipped), up to the header's end.
  auto value_of = [&](const std::string& key) {
    const size_t k = header.find("'" + key + "'");
    SEQPAR_ARG_CHECK(k != std::string::npos, where, ": .npy header has no '", key, "'");
    size_t v = header.find(':', k);
    SEQPAR_ARG_CHECK(v != std::string::npos, where, ": .npy header has no value for '", key, "'");
    ++v;
    while (v < header.size() && header[v] == ' ') ++v;
    return std::string_view(header).substr(v);
  };
  // The text between `open` and the next `close` at the start of `value`.
  auto enclosed = [&](std::string_view value, char open, char close, const char* key) {
    const size_t end =
        value.empty() || value[0] != open ? std::string_view::npos : value.find(close, 1);
    SEQPAR_ARG_CHECK(end != std::string_view::npos, where, ": .npy header's '", key, "' is not ",
                     open, "...", close);
    return std::string(value.substr(1, end - 1));
  };
  const std::string descr = enclosed(value_of("descr"), '\'', '\'', "descr");
  SEQPAR_ARG_CHECK(descr.size() == 3 && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=') &&
                       (descr[1] == 'i' || descr[1] == 'u') &&
                       (descr[2] == '1' || descr[2] == '2' || descr[2] == '4' || descr[2] == '8'),
                   where, ": dtype '", quote_for_message(descr),
                   "' is not supported; valid: little-endian integers (<i8, <i4, <u4, ...)");
  SEQPAR_ARG_CHECK(value_of("fortran_order").starts_with("False"), where,
                   ": fortran_order arrays are not supported");
  const std::vector<int64_t> shape =
      parse_id_text(where + " shape", enclosed(value_of("shape"), '(', ')', "shape"), true);
  SEQPAR_ARG_CHECK(shape.size() == 1 || (shape.size() == 2 && shape[0] == 1), where,
                   ": shape must be (N,) or (1, N) (one prompt)");
  const int size = descr[2] - '0';
  const int64_t n = shape.back();
  const size_t available = (data.size() - start - header_len) / static_cast<size_t>(size);
  SEQPAR_ARG_CHECK(n >= 0 && static_cast<uint64_t>(n) <= available, where,
                   ": holds fewer than the ", n, " elements its header says");
  return widen(where, reinterpret_cast<const std::byte*>(data.data() + start + header_len), n,
               descr[1], size);
}

std::vector<int64_t> read_npy_ids(const std::string& flag, const std::string& path) {
  return parse_npy_ids(flag + " " + path, read_file(flag, path));
}

}  // namespace seqpar::cli
