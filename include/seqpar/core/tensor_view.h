// TensorView and MutableTensorView: non-owning, strided windows onto tensor memory that say where
// the memory lives (a Device tag; the host only for now). They let a call read a head slice
// ([B, S, H, D] -> heads [h0, h1)), a transposed layout (PyTorch's [B, H, S, D] seen as
// [B, S, H, D]) or a run of rows of a caller's tensor without a copy, and write its results into
// the caller's memory in place.
//
//   TensorView v = tensor;                         // the whole tensor, row-major strides
//   v.narrow(2, h0, h1 - h0)                       // a head slice: same memory
//   TensorView::strided(p, {B, S, H, D}, {H*S*D, D, S*D, 1}, dtype)   // [B, H, S, D] memory
//   v.contiguous()                                 // a Tensor: borrowed if dense, else packed
//   out_view.copy_from(result)                     // element by element, converting the dtype
//
// Strides are in elements and never negative. A view does not keep its memory alive: the caller
// keeps the tensor (or buffer) it came from valid while the view is used.
// Thread-safety: values; reads through views are safe concurrently, writes need external sync.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/dtype.h"
#include "seqpar/core/tensor.h"

namespace seqpar {

// Where a view's memory lives. Kernels and communicators of a backend take the views of their
// device; today every backend is the host's.
enum class Device { kHost };
std::string_view device_name(Device d);  // "host"

class TensorView {
 public:
  TensorView() = default;
  // The whole of t (row-major strides, host). Implicit, so a Tensor goes wherever a view does.
  TensorView(const Tensor& t);  // NOLINT(google-explicit-constructor)
  // A view of `data` with the given shape and strides (elements, each >= 0; none: row-major).
  // InvalidArgument when the two lengths differ or a dimension or stride is negative.
  static TensorView strided(const void* data, std::vector<int64_t> shape,
                            std::vector<int64_t> strides, DType dtype,
                            Device device = Device::kHost);

  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(axis(i)); }
  int64_t stride(int i) const { return strides_.at(axis(i)); }
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const void* raw() const { return data_; }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  // Row-major strides: the memory a Tensor of this shape would have.
  bool is_contiguous() const;
  std::string shape_str() const;

  // Elements [begin, begin + length) of dimension `dim`, the same memory.
  TensorView narrow(int dim, int64_t begin, int64_t length) const;
  // Dimensions a and b swapped, the same memory.
  TensorView transpose(int a, int b) const;
  // The elements as a row-major Tensor: a borrowed view of the same memory when the view is
  // contiguous (host), else an owning packed copy.
  Tensor contiguous() const;
  // This view when its last dimension's elements are adjacent, else a view of a packed copy
  // held in `keep` (which must outlive the result).
  TensorView last_dim_dense(Tensor& keep) const;

 protected:
  int axis(int i) const { return i < 0 ? i + ndim() : i; }
  void* data_ = nullptr;
  std::vector<int64_t> shape_, strides_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kHost;
};

class MutableTensorView : public TensorView {
 public:
  MutableTensorView() = default;
  MutableTensorView(Tensor& t);  // NOLINT(google-explicit-constructor)
  static MutableTensorView strided(void* data, std::vector<int64_t> shape,
                                   std::vector<int64_t> strides, DType dtype,
                                   Device device = Device::kHost);
  void* mutable_raw() const { return data_; }
  template <typename T>
  T* mutable_data() const {
    return static_cast<T*>(data_);
  }
  MutableTensorView narrow(int dim, int64_t begin, int64_t length) const;
  MutableTensorView transpose(int a, int b) const;
  // Writes src's elements (same shape; any strides and dtype, converted as convert() does) into
  // this view. InvalidArgument naming both shapes when they differ.
  void copy_from(const TensorView& src) const;
};

}  // namespace seqpar
