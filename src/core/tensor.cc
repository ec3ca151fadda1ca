#include "seqpar/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string_view>

#include "seqpar/core/block_cache.h"

namespace seqpar {

void Tensor::Free::operator()(void* p) const {
  if (owned) block_cache::give(p, bytes);
}

Tensor Tensor::borrow(const void* data, std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.numel_ = 1;
  for (int64_t d : shape) {
    SEQPAR_CHECK(d >= 0, "negative dimension in shape");
    t.numel_ *= d;
  }
  SEQPAR_CHECK(data != nullptr || t.numel_ == 0, "Tensor::borrow of a null pointer");
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.capacity_ = 0;
  t.data_ = std::unique_ptr<void, Free>(const_cast<void*>(data), Free{false});
  return t;
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype)
    : Tensor(std::move(shape), dtype, Fill::kZero) {}

Tensor Tensor::uninitialized(std::vector<int64_t> shape, DType dtype) {
  static const bool poison = [] {
    const char* v = std::getenv("SEQPAR_POISON_UNINITIALIZED");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return Tensor(std::move(shape), dtype, poison ? Fill::kPoison : Fill::kNone);
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Fill fill)
    : shape_(std::move(shape)), dtype_(dtype) {
  numel_ = 1;
  for (int64_t d : shape_) {
    SEQPAR_CHECK(d >= 0, "negative dimension in shape");
    numel_ *= d;
  }
  // The block may be larger (its size class, core/block_cache.h); the capacity is what was asked
  // for, in whole 64 bytes, so that what a tensor reports holding does not depend on the cache.
  const size_t bytes = nbytes();
  void* p = block_cache::take(bytes);
  capacity_ = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (fill != Fill::kNone) std::memset(p, fill == Fill::kZero ? 0 : 0xff, capacity_);
  data_ = std::unique_ptr<void, Free>(p, Free{true, bytes});
}

void Tensor::resize(std::vector<int64_t> shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) {
    SEQPAR_CHECK(d >= 0, "negative dimension in shape");
    n *= d;
  }
  if (static_cast<size_t>(n) * dtype_size(dtype) > capacity_ || !data_ || is_borrowed()) {
    *this = Tensor(std::move(shape), dtype);
    return;
  }
  shape_ = std::move(shape);
  numel_ = n;
  dtype_ = dtype;
}

void Tensor::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ && !is_borrowed()) return;
  Tensor grown({static_cast<int64_t>((std::max(bytes, nbytes()) + 63) / 64 * 64)}, DType::kI8);
  if (nbytes() > 0) std::memcpy(grown.raw(), raw(), nbytes());
  grown.shape_ = std::move(shape_);
  grown.numel_ = numel_;
  grown.dtype_ = dtype_;
  *this = std::move(grown);
}

Tensor::Tensor(const Tensor& other) : Tensor(uninitialized(other.shape_, other.dtype_)) {
  if (other.nbytes() > 0) std::memcpy(raw(), other.raw(), nbytes());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

float Tensor::at(int64_t i) const {
  switch (dtype_) {
    case DType::kF32:
      return data<float>()[i];
    case DType::kBF16:
      return bf16_to_f32(data<uint16_t>()[i]);
    case DType::kF16:
      return f16_to_f32(data<uint16_t>()[i]);
    case DType::kI8:  // the quantized value itself, without its scale
      return static_cast<float>(data<int8_t>()[i]);
  }
  return 0.f;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = uninitialized(shape_, dtype);
  convert(raw(), dtype_, t.raw(), dtype, static_cast<size_t>(numel_));
  return t;
}

void Tensor::fill(float value) {
  if (dtype_ == DType::kF32) {
    std::fill_n(data<float>(), numel_, value);
    return;
  }
  SEQPAR_CHECK(dtype_ != DType::kI8, "fill: an int8 tensor holds quantized values");
  uint16_t h = dtype_ == DType::kBF16 ? f32_to_bf16(value) : f32_to_f16(value);
  std::fill_n(data<uint16_t>(), numel_, h);
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

std::string Tensor::shape_str() const { return shape_text(shape_); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  SEQPAR_CHECK(a.shape() == b.shape(), "shapes differ: ", a.shape_str(), " vs ", b.shape_str());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = std::fabs(static_cast<double>(a.at(i)) - static_cast<double>(b.at(i)));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

Tensor random_normal(std::vector<int64_t> shape, uint64_t seed, DType dtype) {
  Tensor t(std::move(shape), DType::kF32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  float* x = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) x[i] = n(rng);
  return dtype == DType::kF32 ? t : t.to(dtype);
}

}  // namespace seqpar
