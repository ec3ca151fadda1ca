#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "seqpar/model/context.h"
#include "seqpar/model/safetensors.h"

namespace seqpar {

namespace {
constexpr std::pair<WeightFormat, std::string_view> kWeightFormatNames[] = {
    {WeightFormat::kCheckpoint, "checkpoint"},
    {WeightFormat::kQ8_0, "int8"},
    {WeightFormat::kInt8Channel, "int8-channel"}};
}  // namespace

std::optional<WeightFormat> weight_format_named(std::string_view name) {
  for (const auto& [f, n] : kWeightFormatNames)
    if (n == name) return f;
  return std::nullopt;
}

std::string_view weight_format_name(WeightFormat f) {
  for (const auto& [g, n] : kWeightFormatNames)
    if (g == f) return n;
  return "?";
}

std::optional<DType> activations_named(std::string_view name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "int8") return DType::kI8;
  return std::nullopt;
}

std::string activations_names(std::string_view quote) {
  const std::string q(quote);
  return q + "fp32" + q + ", " + q + "bf16" + q + ", " + q + "int8" + q;
}

std::string weight_format_names(std::string_view quote) {
  std::string out;
  for (const auto& [f, n] : kWeightFormatNames)
    out += (out.empty() ? "" : ", ") + std::string(quote) + std::string(n) + std::string(quote);
  return out;
}

WeightStore WeightStore::random(const std::vector<Spec>& specs, uint64_t seed) {
  WeightStore ws;
  for (const auto& s : specs) {
    Tensor t(s.shape);
    if (s.init_std < 0) {
      t.fill(1.f);
    } else if (s.init_std > 0) {
      // Each parameter has its own stream, so adding a parameter changes no other.
      std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                        static_cast<uint32_t>(std::hash<std::string>()(s.name))};
      std::mt19937 rng(seq);
      std::normal_distribution<float> dist(0.f, s.init_std);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    }
    ws.tensors_[s.name] = std::move(t);
  }
  return ws;
}

namespace {

// True if any element of `t` (fp32, bf16 or fp16) is Inf or NaN: its exponent bits all set.
bool has_non_finite(const Tensor& t) {
  unsigned bad = 0;  // branch-free, so that the loop vectorizes
  if (t.dtype() == DType::kF32) {
    const uint32_t* u = static_cast<const uint32_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
  } else {
    const uint16_t mask = t.dtype() == DType::kBF16 ? 0x7f80 : 0x7c00;
    const uint16_t* u = static_cast<const uint16_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) bad |= (u[i] & mask) == mask;
  }
  return bad != 0;
}

// A weight with an Inf or NaN would make every output that reads it NaN (docs/kernel.md
// "Numerics: non-finite inputs"): refuse it at load time, naming the tensor and the first one.
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  if (!has_non_finite(t)) return;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = t.at(i);
    SEQPAR_ARG_CHECK(std::isfinite(x), path, ": tensor '", name, "' holds a non-finite value (", x,
                     " at element ", i, " of ", t.numel(), "); valid: finite weights");
  }
}

}  // namespace

WeightStore WeightStore::from_safetensors(const std::string& path, const std::vector<Spec>& specs) {
  SafetensorsFile file(path);
  WeightStore ws;
  for (const auto& s : specs) {
    Tensor t = load_checked(file, s.name, s.shape, DType::kF32);
    check_finite(path, s.name, t);
    ws.tensors_[s.name] = std::move(t);
  }
  SEQPAR_ARG_CHECK(file.names().size() == specs.size(), path, ": holds ", file.names().size(),
                   " tensors, the model has ", specs.size(), " parameters");
  return ws;
}

void WeightStore::map(const std::string& name, std::shared_ptr<const SafetensorsFile> file,
                      const std::string& stored) {
  const SafetensorsEntry& e = file->entry(stored);  // InvalidArgument naming file and tensor
  SEQPAR_ARG_CHECK(e.seqpar_dtype().has_value(), file->path(), ": tensor '", stored, "' is ",
                   e.dtype, "; valid: F32, BF16, F16");
  tensors_.erase(name);
  files_[name] = FileTensor{std::move(file), stored};
}

void WeightStore::set(const std::string& name, Tensor t) {
  files_.erase(name);
  tensors_[name] = std::move(t);
}

bool WeightStore::has(const std::string& name) const {
  return tensors_.count(name) > 0 || files_.count(name) > 0;
}

const WeightStore::FileTensor* WeightStore::file_tensor(const std::string& name) const {
  auto it = files_.find(name);
  return it == files_.end() ? nullptr : &it->second;
}

const Tensor& WeightStore::memory_tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  SEQPAR_CHECK(it != tensors_.end(), "no weight named '", name, "'");
  return it->second;
}

std::vector<int64_t> WeightStore::shape(const std::string& name) const {
  if (const FileTensor* f = file_tensor(name)) return f->file->entry(f->stored).shape;
  return memory_tensor(name).shape();
}

DType WeightStore::dtype(const std::string& name) const {
  if (const FileTensor* f = file_tensor(name)) return *f->file->entry(f->stored).seqpar_dtype();
  return memory_tensor(name).dtype();
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : tensors_) out.push_back(n);
  for (const auto& [n, f] : files_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

std::map<std::string, Tensor> WeightStore::all() const {
  std::map<std::string, Tensor> out = tensors_;
  for (const auto& [n, f] : files_) {
    const std::vector<int64_t> s = shape(n);
    out[n] = rows(n, 0, s.empty() ? 1 : s[0]);
  }
  return out;
}

Tensor WeightStore::get(const std::string& name) const {
  if (file_tensor(name) == nullptr) return memory_tensor(name).to(DType::kF32);
  const std::vector<int64_t> s = shape(name);
  return rows(name, 0, s.empty() ? 1 : s[0]).to(DType::kF32);
}

Tensor WeightStore::rows(const std::string& name, int64_t begin, int64_t end) const {
  const std::vector<int64_t> s = shape(name);
  const int64_t n0 = s.empty() ? 1 : s[0];
  SEQPAR_CHECK(0 <= begin && begin <= end && end <= n0, "rows [", begin, ", ", end, ") of '", name,
               "' with ", n0, " rows");
  const FileTensor* f = file_tensor(name);
  if (f == nullptr) {
    const Tensor& t = memory_tensor(name);
    if (s.empty()) return t;
    std::vector<int64_t> out_shape = s;
    out_shape[0] = end - begin;
    Tensor out = Tensor::uninitialized(out_shape, t.dtype());
    const size_t row_bytes = t.nbytes() / std::max<int64_t>(1, n0);
    std::memcpy(out.raw(), static_cast<const std::byte*>(t.raw()) + begin * row_bytes,
                (end - begin) * row_bytes);
    return out;
  }
  const SafetensorsEntry& e = f->file->entry(f->stored);
  std::vector<int64_t> out_shape = s;
  if (!s.empty()) out_shape[0] = end - begin;
  Tensor out = Tensor::uninitialized(out_shape, *e.seqpar_dtype());
  const size_t row_bytes = e.nbytes() / std::max<int64_t>(1, n0);
  const std::span<const std::byte> src =
      f->file->bytes(f->stored).subspan(begin * row_bytes, out.nbytes());
  std::memcpy(out.raw(), src.data(), src.size());
  f->file->release(src);
  bytes_read_ += static_cast<int64_t>(out.nbytes());
  check_finite(f->file->path(), f->stored, out);
  return out;
}

Tensor WeightStore::cols(const std::string& name, int64_t begin, int64_t end) const {
  const std::vector<int64_t> s = shape(name);
  SEQPAR_CHECK(s.size() == 2 && 0 <= begin && begin <= end && end <= s[1], "columns [", begin,
               ", ", end, ") of '", name, "' of shape ", s.size(), "-D");
  const FileTensor* f = file_tensor(name);
  const DType dt = dtype(name);
  const size_t e = dtype_size(dt);
  const std::byte* src = f ? f->file->bytes(f->stored).data()
                           : static_cast<const std::byte*>(memory_tensor(name).raw());
  Tensor out = Tensor::uninitialized({s[0], end - begin}, dt);
  for (int64_t r = 0; r < s[0]; ++r)
    std::memcpy(static_cast<std::byte*>(out.raw()) + r * (end - begin) * e,
                src + (r * s[1] + begin) * e, (end - begin) * e);
  if (f != nullptr) {
    f->file->release(f->file->bytes(f->stored));
    bytes_read_ += static_cast<int64_t>(out.nbytes());
    check_finite(f->file->path(), f->stored, out);
  }
  return out;
}

Tensor WeightStore::row_abs_max(const std::string& name) const {
  const std::vector<int64_t> s = shape(name);
  SEQPAR_CHECK(s.size() == 2, "row_abs_max: '", name, "' is ", s.size(), "-D, not a matrix");
  const int64_t n = s[0], k = s[1];
  Tensor out({n});
  // Blocks of about 1 MiB of fp32, read as rows() reads them (its finiteness check included).
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, k));
  const int64_t counted = bytes_read_;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t r1 = std::min(n, r0 + block);
    const Tensor t = rows(name, r0, r1);
    for (int64_t r = r0; r < r1; ++r) {
      convert(static_cast<const std::byte*>(t.raw()) + (r - r0) * k * dtype_size(t.dtype()),
              t.dtype(), row.data(), DType::kF32, static_cast<size_t>(k));
      float a = 0.f;
      for (float v : row) a = std::max(a, std::fabs(v));
      out.data<float>()[r] = a;
    }
  }
  bytes_read_ = counted;
  return out;
}

}  // namespace seqpar
