#include "seqpar/core/tensor_view.h"

#include <cstring>
#include <utility>

#include "seqpar/core/error.h"

namespace seqpar {

namespace {

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = stride;
    stride *= shape[i];
  }
  return s;
}

// Calls f(src_offset, dst_offset) (elements) for every run of the last dimension of `shape`,
// walking the other dimensions in row-major order.
template <typename F>
void for_each_run(const std::vector<int64_t>& shape, const std::vector<int64_t>& a,
                  const std::vector<int64_t>& b, F&& f) {
  const int n = static_cast<int>(shape.size());
  for (int64_t d : shape)
    if (d == 0) return;
  if (n <= 1) return f(int64_t{0}, int64_t{0});
  std::vector<int64_t> idx(static_cast<size_t>(n - 1), 0);
  int64_t oa = 0, ob = 0;
  while (true) {
    f(oa, ob);
    int i = n - 2;
    for (; i >= 0; --i) {
      oa += a[i];
      ob += b[i];
      if (++idx[i] < shape[i]) break;
      oa -= a[i] * shape[i];
      ob -= b[i] * shape[i];
      idx[i] = 0;
    }
    if (i < 0) return;
  }
}

}  // namespace

std::string_view device_name(Device d) {
  switch (d) {
    case Device::kHost:
      return "host";
  }
  return "?";
}

TensorView::TensorView(const Tensor& t)
    : data_(const_cast<void*>(t.raw())),
      shape_(t.shape()),
      strides_(row_major_strides(t.shape())),
      dtype_(t.dtype()) {}

TensorView TensorView::strided(const void* data, std::vector<int64_t> shape,
                               std::vector<int64_t> strides, DType dtype, Device device) {
  if (strides.empty() && !shape.empty()) strides = row_major_strides(shape);
  SEQPAR_ARG_CHECK(shape.size() == strides.size(), "a view of shape ", shape_text(shape), " has ",
                   strides.size(), " strides; valid: one per dimension (", shape.size(), ")");
  for (size_t i = 0; i < shape.size(); ++i)
    SEQPAR_ARG_CHECK(shape[i] >= 0 && strides[i] >= 0, "a view of shape ", shape_text(shape),
                     " has stride ", strides[i], " at dimension ", i,
                     "; valid: dimensions and strides >= 0");
  TensorView v;
  v.data_ = const_cast<void*>(data);
  v.shape_ = std::move(shape);
  v.strides_ = std::move(strides);
  v.dtype_ = dtype;
  v.device_ = device;
  SEQPAR_ARG_CHECK(v.data_ != nullptr || v.numel() == 0, "a view of shape ", v.shape_str(),
                   " has no memory");
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != stride) return false;
    stride *= shape_[i];
  }
  return true;
}

std::string TensorView::shape_str() const { return shape_text(shape_); }

TensorView TensorView::narrow(int dim, int64_t begin, int64_t length) const {
  const int a = axis(dim);
  SEQPAR_ARG_CHECK(a >= 0 && a < ndim(), "dimension ", dim, " of a view of shape ", shape_str(),
                   " does not exist; valid: 0 to ", ndim() - 1);
  SEQPAR_ARG_CHECK(begin >= 0 && length >= 0 && begin + length <= shape_[a], "elements [", begin,
                   ", ", begin + length, ") of dimension ", a, " of a view of shape ", shape_str(),
                   " are out of range; valid: within [0, ", shape_[a], "]");
  TensorView v = *this;
  v.data_ = static_cast<char*>(data_) + begin * strides_[a] * dtype_size(dtype_);
  v.shape_[a] = length;
  return v;
}

TensorView TensorView::transpose(int a, int b) const {
  const int x = axis(a), y = axis(b);
  SEQPAR_ARG_CHECK(x >= 0 && x < ndim() && y >= 0 && y < ndim(), "dimensions ", a, " and ", b,
                   " of a view of shape ", shape_str(), " do not both exist");
  TensorView v = *this;
  std::swap(v.shape_[x], v.shape_[y]);
  std::swap(v.strides_[x], v.strides_[y]);
  return v;
}

Tensor TensorView::contiguous() const {
  if (is_contiguous()) return Tensor::borrow(data_, shape_, dtype_);
  Tensor t(shape_, dtype_);
  MutableTensorView(t).copy_from(*this);
  return t;
}

TensorView TensorView::last_dim_dense(Tensor& keep) const {
  if (ndim() == 0 || stride(-1) == 1 || dim(-1) <= 1) return *this;
  keep = contiguous();
  return keep;
}

MutableTensorView::MutableTensorView(Tensor& t) : TensorView(t) {}

MutableTensorView MutableTensorView::strided(void* data, std::vector<int64_t> shape,
                                             std::vector<int64_t> strides, DType dtype,
                                             Device device) {
  MutableTensorView v;
  static_cast<TensorView&>(v) =
      TensorView::strided(data, std::move(shape), std::move(strides), dtype, device);
  return v;
}

MutableTensorView MutableTensorView::narrow(int dim, int64_t begin, int64_t length) const {
  MutableTensorView v;
  static_cast<TensorView&>(v) = TensorView::narrow(dim, begin, length);
  return v;
}

MutableTensorView MutableTensorView::transpose(int a, int b) const {
  MutableTensorView v;
  static_cast<TensorView&>(v) = TensorView::transpose(a, b);
  return v;
}

void MutableTensorView::copy_from(const TensorView& src) const {
  SEQPAR_ARG_CHECK(src.shape() == shape_, "a view of shape ", src.shape_str(),
                   " cannot be written into one of shape ", shape_str(), "; valid: equal shapes");
  SEQPAR_CHECK(src.device() == Device::kHost && device_ == Device::kHost,
               "copy_from: host views only");
  if (shape_.empty()) {
    convert(src.raw(), src.dtype(), data_, dtype_, 1);
    return;
  }
  const int64_t n = shape_.back(), sa = src.strides().back(), sb = strides_.back();
  const size_t ea = dtype_size(src.dtype()), eb = dtype_size(dtype_);
  const char* a = static_cast<const char*>(src.raw());
  char* b = static_cast<char*>(data_);
  for_each_run(shape_, src.strides(), strides_, [&](int64_t oa, int64_t ob) {
    if (sa == 1 && sb == 1) return convert(a + oa * ea, src.dtype(), b + ob * eb, dtype_, n);
    for (int64_t i = 0; i < n; ++i)
      convert(a + (oa + i * sa) * ea, src.dtype(), b + (ob + i * sb) * eb, dtype_, 1);
  });
}

}  // namespace seqpar
