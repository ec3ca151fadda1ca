// Tensor: an owning, 64-byte aligned, row-major buffer of one dtype and any number of dimensions
// (the shape is a vector; no dimension may be negative).
// The canonical activation layout is token-major [B, S, H, D] ("bshd").
// Thread-safety: a Tensor is a value; concurrent reads are safe, writes need external sync.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"

namespace seqpar {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor of the given shape.
  Tensor(std::vector<int64_t> shape, DType dtype = DType::kF32);
  Tensor(std::initializer_list<int64_t> shape, DType dtype = DType::kF32)
      : Tensor(std::vector<int64_t>(shape), dtype) {}

  // A tensor whose storage is not zero-filled (a block from core/block_cache.h holds whatever it
  // held before): for an output every element of which is written before it is read, where the
  // zero fill would be a second pass over it. With SEQPAR_POISON_UNINITIALIZED=1 in the
  // environment the storage is filled with 0xff bytes instead (NaN in fp32, bf16 and fp16; -1 in
  // int8), so that an element left unwritten shows up (scripts/sanitize.sh sets it).
  static Tensor uninitialized(std::vector<int64_t> shape, DType dtype = DType::kF32);

  // A read-only view of `data` (not owned, not freed): for computing on bytes that live
  // elsewhere, e.g. a peer's K/V block borrowed without a copy (Communicator::irecv_borrow).
  // `data` must stay valid and unchanged while the view is used. Do not write through it;
  // capacity_bytes() is 0, so resize() always allocates fresh storage. Copying a view copies
  // the data into an owning tensor.
  static Tensor borrow(const void* data, std::vector<int64_t> shape, DType dtype);
  bool is_borrowed() const { return !data_.get_deleter().owned; }

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + shape_.size() : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  bool empty() const { return numel_ == 0; }

  void* raw() { return data_.get(); }
  const void* raw() const { return data_.get(); }
  template <typename T>
  T* data() {
    return static_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(raw());
  }

  // Element i as fp32, whatever the storage type (slow; for tests and checks).
  float at(int64_t i) const;
  // Copy converted to another dtype.
  Tensor to(DType dtype) const;
  void fill(float value);
  // Changes the shape (and dtype) in place, reusing the storage when it is large enough (its
  // bytes are then left as they were: a shape grown along the first dimension keeps the old
  // elements, anything else reads as unspecified); otherwise reallocates zero-filled. Lets a
  // receive buffer hold blocks of varying length without new allocations.
  void resize(std::vector<int64_t> shape, DType dtype);
  void resize(std::vector<int64_t> shape) { resize(std::move(shape), dtype_); }
  // Grows the storage to at least `bytes`, keeping the shape and the contents (a view becomes an
  // owning copy), so that later resize() calls up to that size do not reallocate.
  void reserve(size_t bytes);
  size_t capacity_bytes() const { return capacity_; }
  std::string shape_str() const;  // "[2, 128, 8, 64]"

 private:
  enum class Fill { kZero, kNone, kPoison };
  Tensor(std::vector<int64_t> shape, DType dtype, Fill fill);
  struct Free {
    Free() noexcept : owned(true), bytes(0) {}
    explicit Free(bool own, size_t bytes = 0) noexcept : owned(own), bytes(bytes) {}
    bool owned;    // false for borrow() views
    size_t bytes;  // what block_cache::take was asked for (owned storage)
    void operator()(void* p) const;
  };
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
  size_t capacity_ = 0;
  std::unique_ptr<void, Free> data_;
};

// Max |a - b| over all elements (shapes must match; dtypes may differ).
double max_abs_diff(const Tensor& a, const Tensor& b);

// Standard normal values from std::mt19937_64(seed), drawn in fp32 in element order, then
// rounded to dtype (synthetic inputs and weights for benchmarks and the CLI).
Tensor random_normal(std::vector<int64_t> shape, uint64_t seed, DType dtype = DType::kF32);

// A shape as messages write it: "[2, 128, 8, 64]".
std::string shape_text(std::span<const int64_t> shape);

}  // namespace seqpar
