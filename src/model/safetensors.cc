#include "seqpar/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "config_json.h"
#include "seqpar/core/error.h"
#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"

namespace seqpar {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; seqpar reads it in place");

namespace {

using nlohmann::json;

// Element sizes of the safetensors dtypes with whole-byte elements. Sub-byte types (F4, F6) are
// not listed and are rejected as unknown.
struct DtypeInfo {
  std::string_view name;
  uint64_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8},
};

std::optional<uint64_t> dtype_bytes(std::string_view name) {
  for (const auto& d : kDtypes)
    if (d.name == name) return d.size;
  return std::nullopt;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// "[d0, d1, ...]"; a shape read from a file may hold millions of dimensions: the first
// kShapeTextDims are written, then the count.
constexpr size_t kShapeTextDims = 8;
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < std::min(shape.size(), kShapeTextDims); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() > kShapeTextDims) s += detail::concat(", ... (", shape.size(), " dimensions)");
  return s + "]";
}

// A JSON value of the header as short one-line text for messages.
std::string brief(const json& j) { return json_excerpt(j); }

// A name or string from the header (any length, any bytes) as short one-line text for messages.
std::string short_text(std::string_view s) { return quote_for_message(s); }

// Characters of a parse error kept in the message: nlohmann quotes the whole offending token.

// "<path>: <message>" as InvalidArgument.
template <typename... Args>
[[noreturn]] void fail(const std::string& path, const Args&... args) {
  throw InvalidArgument(detail::concat(path, ": ", args...));
}

// Parses the header JSON, rejecting a key repeated within one object (nlohmann would keep the
// last silently) and, before parsing, nesting deeper than JsonLimits allows. `path` only labels
// errors.
json parse_header(const std::string& path, std::string_view text) {
  check_json_limits(text, path, {.max_bytes = kSafetensorsMaxHeaderBytes});
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string tensor;                       // the top-level key being parsed
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string k = parsed.get<std::string>();
        if (depth == 1) tensor = k;
        if (!keys.empty() && !keys.back().insert(k).second) {
          if (depth == 1)
            fail(path, "tensor '", short_text(k), "' appears more than once in the header");
          fail(path, "the header repeats the key '", short_text(k), "' inside '",
               short_text(tensor), "'");
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(path, "the header is not valid JSON: ", quote_for_message(e.what(), kParseErrorChars));
  }
}

uint64_t read_offset(const std::string& path, std::string_view name, const json& v) {
  if (!v.is_number_unsigned())
    fail(path, "tensor '", name, "' has data offset ", brief(v),
         "; offsets are non-negative integers");
  return v.get<uint64_t>();
}

// `name` is already quoted (short, printable) for messages; `out.name` keeps the real one.
SafetensorsEntry parse_entry(const std::string& path, const std::string& real_name, const json& e) {
  const std::string name = short_text(real_name);
  if (!e.is_object())
    fail(path, "tensor '", name, "' is ", brief(e),
         " in the header; expected an object with dtype, shape and data_offsets");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) fail(path, "tensor '", name, "' has no '", key, "' in the header");
  SafetensorsEntry out;
  out.name = real_name;

  const json& dtype = e["dtype"];
  if (!dtype.is_string())
    fail(path, "tensor '", name, "' has dtype ", brief(dtype),
         "; expected a string such as \"F32\"");
  out.dtype = dtype.get<std::string>();
  const std::optional<uint64_t> elem = dtype_bytes(out.dtype);
  if (!elem)
    fail(path, "tensor '", name, "' has unknown dtype '", short_text(out.dtype),
         "'; known: ", known_dtypes());

  const json& shape = e["shape"];
  if (!shape.is_array())
    fail(path, "tensor '", name, "' has shape ", brief(shape), "; expected a list of integers");
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : shape) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(path, "tensor '", name, "' has shape ", brief(shape),
           "; dimensions are non-negative integers");
    out.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    overflow |= __builtin_mul_overflow(numel, d.get<uint64_t>(), &numel);
  }
  uint64_t want = 0;
  overflow |= __builtin_mul_overflow(numel, *elem, &want);
  if (overflow) fail(path, "tensor '", name, "' has shape ", shape_text(out.shape), ", too large");

  const json& offsets = e["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    fail(path, "tensor '", name, "' has data_offsets ", brief(offsets), "; expected [begin, end]");
  out.begin = read_offset(path, name, offsets[0]);
  out.end = read_offset(path, name, offsets[1]);
  if (out.end < out.begin)
    fail(path, "tensor '", name, "' has data_offsets [", out.begin, ", ", out.end,
         "] which end before they begin");
  if (want != out.nbytes())
    fail(path, "tensor '", name, "' has shape ", shape_text(out.shape), " (", want, " bytes as ",
         out.dtype, ") but its byte range is ", out.nbytes(), " bytes");
  return out;
}

[[noreturn]] void fail_too_short(const std::string& path, uint64_t file_bytes) {
  fail(path, "the file is ", file_bytes,
       " bytes, too short for the 8-byte header size: truncated or not a safetensors file");
}

// The byte ranges, sorted by (begin, end), must tile [0, data_bytes) exactly.
void check_coverage(const std::string& path, std::vector<const SafetensorsEntry*> by_offset,
                    uint64_t data_bytes) {
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (const SafetensorsEntry* e : by_offset) {
    if (e->end > data_bytes)
      fail(path, "tensor '", short_text(e->name), "' has data_offsets [", e->begin, ", ", e->end,
           "] past the end of the data section (", data_bytes, " bytes): truncated file?");
  }
  uint64_t covered = 0;  // [0, covered) is tiled so far
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < covered)
      fail(path, "tensor '", short_text(e->name), "' (bytes [", e->begin, ", ", e->end,
           ")) overlaps tensor '", short_text(prev->name), "' (bytes [", prev->begin, ", ",
           prev->end, "))");
    if (e->begin > covered)
      fail(path, "bytes [", covered, ", ", e->begin, ") of the data section belong to no tensor",
           " (before tensor '", short_text(e->name), "')");
    covered = e->end;
    prev = e;
  }
  if (covered != data_bytes)
    fail(path, "bytes [", covered, ", ", data_bytes, ") at the end of the data section belong to ",
         "no tensor");
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<DType> SafetensorsEntry::seqpar_dtype() const {
  if (dtype == "F32") return DType::kF32;
  if (dtype == "BF16") return DType::kBF16;
  if (dtype == "F16") return DType::kF16;
  return std::nullopt;
}

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& path) {
  const uint64_t file_bytes = file.size();
  if (file_bytes < 8) fail_too_short(path, file_bytes);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);  // little-endian u64
  if (header_bytes > kSafetensorsMaxHeaderBytes)
    fail(path, "the header size is ", header_bytes, " bytes, over the limit of ",
         kSafetensorsMaxHeaderBytes, " bytes: corrupt or not a safetensors file");
  if (header_bytes > file_bytes - 8)
    fail(path, "the header size is ", header_bytes, " bytes but only ", file_bytes - 8,
         " bytes follow the size field: truncated or not a safetensors file");
  SafetensorsHeader out;
  out.data_offset = 8 + header_bytes;
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), header_bytes);
  const json header = parse_header(path, text);
  if (!header.is_object()) fail(path, "the header is ", brief(header), ", not a JSON object");

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object())
        fail(path, "__metadata__ is ", brief(value), "; expected an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          fail(path, "__metadata__ key '", short_text(k), "' has value ", brief(v),
               "; values are strings");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(path, name, value));
  }
  std::sort(out.entries.begin(), out.entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : out.entries) by_offset.push_back(&e);
  check_coverage(path, std::move(by_offset), file_bytes - out.data_offset);
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = files::open_input("", path, "a safetensors file");
  struct stat st {};
  ::fstat(fd, &st);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    fail_too_short(path, file_bytes);
  }
  void* p = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail(path, "cannot map the file: ", std::strerror(map_errno));
  map_ = static_cast<const std::byte*>(p);
  map_bytes_ = file_bytes;

  try {
    SafetensorsHeader header = parse_safetensors({map_, map_bytes_}, path);
    data_offset_ = header.data_offset;
    entries_ = std::move(header.entries);
    metadata_ = std::move(header.metadata);
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      data_offset_(other.data_offset_),
      entries_(std::move(other.entries_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_offset_ = other.data_offset_;
    entries_ = std::move(other.entries_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

void SafetensorsFile::release(std::span<const std::byte> range) const {
  if (map_ == nullptr || range.empty()) return;
  // Whole pages inside the range only: a page shared with a neighbour's bytes stays mapped.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(range.data());
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + range.size()) / page * page;
  // A read-only private mapping of a file: dropping its pages loses nothing (advice only, so a
  // failure changes nothing but the resident set).
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void SafetensorsFile::unmap() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const {
  auto it =
      std::lower_bound(entries_.begin(), entries_.end(), name,
                       [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  return it != entries_.end() && it->name == name;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it =
      std::lower_bound(entries_.begin(), entries_.end(), name,
                       [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  if (it != entries_.end() && it->name == name) return *it;
  // Name a few tensors that exist, preferring those sharing the longest prefix with `name`.
  std::string hint;
  if (entries_.empty()) {
    hint = "the file holds no tensors";
  } else {
    auto common = [&](const std::string& s) {
      size_t n = 0;
      while (n < s.size() && n < name.size() && s[n] == name[n]) ++n;
      return n;
    };
    std::vector<const SafetensorsEntry*> near;
    for (const auto& e : entries_) near.push_back(&e);
    std::stable_sort(near.begin(), near.end(), [&](const auto* a, const auto* b) {
      return common(a->name) > common(b->name);
    });
    hint = detail::concat("it holds ", entries_.size(), " tensors, e.g. ");
    for (size_t i = 0; i < std::min<size_t>(3, near.size()); ++i)
      hint += (i ? ", '" : "'") + short_text(near[i]->name) + "'";
  }
  fail(path_, "no tensor '", short_text(name), "' (", hint, ")");
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return {map_ + data_offset_ + e.begin, static_cast<size_t>(e.nbytes())};
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const std::optional<DType> dtype = e.seqpar_dtype();
  if (!dtype)
    fail(path_, "tensor '", name, "' has dtype ", e.dtype, "; seqpar reads F32, BF16 and F16");
  Tensor t(e.shape, *dtype);
  if (e.nbytes() > 0) std::memcpy(t.raw(), map_ + data_offset_ + e.begin, e.nbytes());
  return t;
}

Tensor SafetensorsFile::tensor(const std::string& name, DType to) const {
  Tensor t = tensor(name);
  return t.dtype() == to ? t : t.to(to);
}

void write_safetensors(files::AtomicOutput& out, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    SEQPAR_ARG_CHECK(name != "__metadata__", out.path(),
                     ": '__metadata__' is reserved and cannot name a tensor");
    header[name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype()))},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  const uint64_t header_bytes = text.size();
  char size_le[8];
  std::memcpy(size_le, &header_bytes, 8);
  out.write(size_le, 8);
  out.write(text);
  for (const auto& [name, t] : tensors)
    if (t.nbytes() > 0) out.write(t.raw(), t.nbytes());
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  files::AtomicOutput out("output", path);
  write_safetensors(out, tensors, metadata);
  out.commit();
}

Tensor load_checked(const SafetensorsFile& file, const std::string& name,
                    const std::vector<int64_t>& expected_shape, DType to) {
  const SafetensorsEntry& e = file.entry(name);
  if (e.shape != expected_shape)
    fail(file.path(), "tensor '", name, "' has shape ", shape_text(e.shape), " but the model ",
         "expects ", shape_text(expected_shape));
  return file.tensor(name, to);
}

SafetensorsFiles open_safetensors_index(const std::string& index_path, const std::string& dir,
                                        bool (*ignorable)(const std::string&)) {
  const json index = read_json_file(index_path);
  SEQPAR_FILE_CHECK(
      index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
      index_path, ": no \"weight_map\" object; expected {\"weight_map\": {tensor: file}}");
  SafetensorsFiles where, shards;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    SEQPAR_FILE_CHECK(file.is_string(), index_path, ": weight_map['", quote_for_message(name),
                      "'] is ", json_excerpt(file), "; expected a file name");
    const std::string shard = file.get<std::string>();
    SEQPAR_FILE_CHECK(!shard.empty() && shard.find('/') == std::string::npos, index_path,
                      ": weight_map['", quote_for_message(name), "'] is '",
                      quote_for_message(shard), "'; expected a file name in ", dir);
    auto it = shards.find(shard);
    if (it == shards.end()) {
      const std::string shard_path = dir + "/" + shard;
      SEQPAR_FILE_CHECK(files::is_regular_file(shard_path), index_path, ": names shard '",
                        quote_for_message(shard), "' (for '", quote_for_message(name),
                        "'), which is missing from ", dir);
      it = shards.emplace(shard, std::make_shared<const SafetensorsFile>(shard_path)).first;
    }
    SEQPAR_FILE_CHECK(it->second->contains(name), it->second->path(), ": no tensor '",
                      quote_for_message(name), "', which ", index_path, " places there");
    where[name] = it->second;
  }
  // Each tensor once, where the index says: a second copy in another shard, or a tensor the
  // index does not list, would be ignored without a word.
  for (const auto& [shard, file] : shards)
    for (const std::string& name : file->names()) {
      const auto at = where.find(name);
      SEQPAR_FILE_CHECK(at != where.end() || (ignorable && ignorable(name)), file->path(),
                        ": holds tensor '", quote_for_message(name), "', which ", index_path,
                        " does not list; expected every tensor of the shards in its weight_map");
      SEQPAR_FILE_CHECK(at == where.end() || at->second == file, file->path(), ": holds tensor '",
                        quote_for_message(name), "' too, which ", index_path, " places in ",
                        at == where.end() ? "" : at->second->path(),
                        "; expected each tensor in one shard");
    }
  return where;
}

void check_tensor_names(const SafetensorsFile& file, std::span<const std::string_view> known,
                        std::string_view what) {
  for (const std::string& name : file.names()) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string valid;
    for (const std::string_view k : known) valid += (valid.empty() ? "" : ", ") + std::string(k);
    throw InvalidArgument(detail::concat(file.path(), ": tensor '", quote_for_message(name),
                                         "' is not an input of ", what, "; valid: ", valid));
  }
}

std::vector<double> tensor_values(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry& e = file.entry(name);
  if (e.seqpar_dtype()) {
    const Tensor t = file.tensor(name, DType::kF32);
    return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
  }
  const std::span<const std::byte> raw = file.bytes(name);
  auto values = [&]<typename T>(T) {
    std::vector<double> v(raw.size() / sizeof(T));
    for (size_t i = 0; i < v.size(); ++i) {
      T x;
      std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
      v[i] = static_cast<double>(x);
    }
    return v;
  };
  if (e.dtype == "F64") return values(double{});
  if (e.dtype == "I64") return values(int64_t{});
  if (e.dtype == "I32") return values(int32_t{});
  if (e.dtype == "I16") return values(int16_t{});
  if (e.dtype == "I8") return values(int8_t{});
  if (e.dtype == "U8" || e.dtype == "BOOL") return values(uint8_t{});
  throw InvalidArgument(detail::concat(file.path(), ": tensor '", name, "' has dtype ", e.dtype,
                                       "; expected F32, BF16, F16, F64, I64, I32, I16, I8, U8 or "
                                       "BOOL"));
}

}  // namespace seqpar
