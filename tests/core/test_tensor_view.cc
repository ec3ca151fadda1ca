// TensorView / MutableTensorView against element indexing written out by hand.
#include <gtest/gtest.h>

#include <tuple>

#include "seqpar/core/error.h"
#include "seqpar/core/tensor_view.h"

namespace seqpar {
namespace {

// Element (b, s, h, d) of a row-major [B, S, H, D] tensor: its value encodes its indices.
float code(int64_t b, int64_t s, int64_t h, int64_t d) {
  return static_cast<float>(((b * 100 + s) * 100 + h) * 100 + d);
}

Tensor coded(int64_t B, int64_t S, int64_t H, int64_t D) {
  Tensor t({B, S, H, D});
  float* p = t.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) *p++ = code(b, s, h, d);
  return t;
}

TEST(TensorView, WholeTensorIsContiguous) {
  const Tensor t = coded(2, 3, 4, 5);
  const TensorView v = t;
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.strides(), (std::vector<int64_t>{60, 20, 5, 1}));
  EXPECT_EQ(v.device(), Device::kHost);
  EXPECT_EQ(device_name(v.device()), "host");
  const Tensor c = v.contiguous();
  EXPECT_TRUE(c.is_borrowed());
  EXPECT_EQ(c.raw(), t.raw());
}

// Head slices, row runs and the [B, H, S, D] layout read as [B, S, H, D], packed by contiguous():
// every element where hand indexing puts it, in every dtype.
TEST(TensorView, NarrowAndTransposeReadTheRightElements) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor t = coded(2, 5, 6, 3).to(dt);  // codes up to 1e6 are not exact in bf16: compare
    const Tensor ref = t.to(DType::kF32);       // against the stored values
    for (auto [dim, b0, len] :
         {std::tuple{2, 1, 3}, std::tuple{1, 2, 2}, std::tuple{0, 1, 1}, std::tuple{3, 1, 2}}) {
      const Tensor c = TensorView(t).narrow(dim, b0, len).contiguous();
      ASSERT_EQ(c.dtype(), dt);
      int64_t i = 0;
      for (int64_t b = 0; b < c.dim(0); ++b)
        for (int64_t s = 0; s < c.dim(1); ++s)
          for (int64_t h = 0; h < c.dim(2); ++h)
            for (int64_t d = 0; d < c.dim(3); ++d, ++i) {
              int64_t idx[4] = {b, s, h, d};
              idx[dim] += b0;
              EXPECT_EQ(c.at(i), ref.at(((idx[0] * 5 + idx[1]) * 6 + idx[2]) * 3 + idx[3]));
            }
    }
  }
  // [B, H, S, D] memory seen as [B, S, H, D].
  const Tensor bhsd = coded(2, 4, 3, 5);  // (b, h, s, d) coded as (b, h, s, d)
  const TensorView bshd = TensorView(bhsd).transpose(1, 2);
  EXPECT_FALSE(bshd.is_contiguous());
  EXPECT_EQ(bshd.shape(), (std::vector<int64_t>{2, 3, 4, 5}));
  const Tensor c = bshd.contiguous();
  EXPECT_FALSE(c.is_borrowed());
  int64_t i = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 3; ++s)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t d = 0; d < 5; ++d) EXPECT_EQ(c.at(i++), code(b, h, s, d));
}

// last_dim_dense: the view itself where the last dimension's elements are adjacent (a head slice,
// [B, H, S, D] seen as [B, S, H, D]), a packed copy where they are not (a transposed last pair).
TEST(TensorView, LastDimDenseCopiesOnlyWhereItMust) {
  const Tensor bhsd = coded(2, 4, 3, 5);
  Tensor keep;
  const TensorView bshd = TensorView(bhsd).transpose(1, 2);
  EXPECT_EQ(bshd.last_dim_dense(keep).raw(), bhsd.raw());
  EXPECT_EQ(TensorView(bhsd).narrow(1, 1, 2).last_dim_dense(keep).raw(),
            TensorView(bhsd).narrow(1, 1, 2).raw());
  EXPECT_EQ(keep.numel(), 0);
  const TensorView swapped = TensorView(bhsd).transpose(2, 3);  // (b, h, d, s)
  const TensorView dense = swapped.last_dim_dense(keep);
  EXPECT_EQ(dense.raw(), keep.raw());
  EXPECT_TRUE(dense.is_contiguous());
  int64_t i = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t d = 0; d < 5; ++d)
        for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(keep.at(i++), code(b, h, s, d));
}

TEST(TensorView, CopyFromWritesOnlyTheView) {
  Tensor dst({2, 4, 3, 2}, DType::kBF16);
  dst.fill(-1.f);
  const Tensor src = coded(2, 2, 3, 2);
  MutableTensorView(dst).narrow(1, 1, 2).copy_from(src);
  int64_t i = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t d = 0; d < 2; ++d, ++i) {
          const bool inside = s >= 1 && s < 3;
          EXPECT_EQ(dst.at(i), inside ? bf16_to_f32(f32_to_bf16(code(b, s - 1, h, d))) : -1.f);
        }
  // Into a transposed view: [B, H, S, D] memory written from [B, S, H, D].
  Tensor bhsd({2, 3, 2, 2});
  MutableTensorView(bhsd).transpose(1, 2).copy_from(src);
  i = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t d = 0; d < 2; ++d) EXPECT_EQ(bhsd.at(i++), code(b, s, h, d));
}

TEST(TensorView, BadArgumentsSayWhatIsValid) {
  const Tensor t({2, 3});
  EXPECT_THROW(TensorView(t).narrow(1, 2, 2), InvalidArgument);
  EXPECT_THROW(TensorView(t).narrow(2, 0, 1), InvalidArgument);
  EXPECT_THROW(TensorView::strided(t.raw(), {2, 3}, {3}, DType::kF32), InvalidArgument);
  EXPECT_THROW(TensorView::strided(t.raw(), {2, 3}, {-3, 1}, DType::kF32), InvalidArgument);
  Tensor d({3, 2});
  EXPECT_THROW(MutableTensorView(d).copy_from(t), InvalidArgument);
  try {
    TensorView(t).narrow(1, 2, 2);
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "elements [2, 4) of dimension 1 of a view of shape [2, 3] are out of range; "
                 "valid: within [0, 3]");
  }
}

}  // namespace
}  // namespace seqpar
