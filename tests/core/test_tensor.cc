#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "seqpar/core/tensor.h"

namespace seqpar {

TEST(Tensor, ZeroFilledAligned) {
  Tensor t({2, 3, 4, 5});
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(t.nbytes(), 480u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.at(i), 0.f);
}

// The storage of Tensor::uninitialized is the same kind as a zero-filled tensor's (aligned, its
// shape and dtype), not zero-filled; with SEQPAR_POISON_UNINITIALIZED=1 (scripts/sanitize.sh, and
// ctest's test_core_poisoned) every byte is 0xff: NaN in fp32, bf16 and fp16.
TEST(Tensor, UninitializedHasItsShapeAndIsPoisonedOnRequest) {
  const char* env = std::getenv("SEQPAR_POISON_UNINITIALIZED");
  const bool poisoned = env != nullptr && std::string_view(env) == "1";
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8}) {
    Tensor t = Tensor::uninitialized({3, 7}, dt);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{3, 7}));
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
    for (int64_t i = 0; i < t.numel() && poisoned; ++i) {
      if (dt == DType::kI8)
        ASSERT_EQ(t.data<int8_t>()[i], -1) << i;
      else
        ASSERT_TRUE(std::isnan(t.at(i))) << dtype_name(dt) << " element " << i;
    }
  }
  // Copies and conversions write every element, so they take such storage too.
  Tensor a({5});
  a.fill(1.5f);
  const Tensor b = a;
  const Tensor c = a.to(DType::kBF16);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(b.at(i), 1.5f);
    EXPECT_EQ(c.at(i), 1.5f);
  }
}

TEST(Tensor, CopyIsDeep) {
  Tensor a({4});
  a.fill(2.f);
  Tensor b = a;
  b.data<float>()[0] = 7.f;
  EXPECT_EQ(a.at(0), 2.f);
  EXPECT_EQ(b.at(0), 7.f);
}

TEST(Tensor, ConvertAndDiff) {
  Tensor a({3});
  a.data<float>()[0] = 1.f;
  a.data<float>()[1] = 2.5f;
  a.data<float>()[2] = -3.f;
  Tensor b = a.to(DType::kBF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  b.fill(0.f);
  EXPECT_EQ(max_abs_diff(a, b), 3.0);
  EXPECT_THROW(max_abs_diff(a, Tensor({4})), Error);
}

TEST(Tensor, ResizeReusesStorage) {
  Tensor t({1, 100, 2, 8});
  const void* p = t.raw();
  t.resize({1, 50, 2, 8});
  EXPECT_EQ(t.raw(), p);
  EXPECT_EQ(t.dim(1), 50);
  EXPECT_EQ(t.numel(), 800);
  t.resize({1, 200, 2, 8});
  EXPECT_EQ(t.numel(), 3200);
  EXPECT_GE(t.capacity_bytes(), t.nbytes());
}

// reserve() grows the storage and keeps the contents; a resize within it keeps the old elements
// when the shape grows along the first dimension (what an appending K/V cache relies on).
TEST(Tensor, ReserveKeepsContents) {
  Tensor t({3, 2});
  for (int64_t i = 0; i < 6; ++i) t.data<float>()[i] = static_cast<float>(i + 1);
  t.reserve(1000);
  EXPECT_GE(t.capacity_bytes(), 1000u);
  EXPECT_EQ(t.dim(0), 3);
  const void* p = t.raw();
  t.resize({5, 2});
  EXPECT_EQ(t.raw(), p);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.at(i), static_cast<float>(i + 1));
  t.reserve(8);  // already large enough: nothing moves
  EXPECT_EQ(t.raw(), p);
  std::vector<float> data = {1, 2};
  Tensor view = Tensor::borrow(data.data(), {2}, DType::kF32);
  view.reserve(4);  // a view becomes an owning copy
  EXPECT_FALSE(view.is_borrowed());
  EXPECT_EQ(view.at(1), 2.f);
}

TEST(Tensor, RejectsNegativeDims) { EXPECT_THROW(Tensor({2, -1}), Error); }

// A borrowed view reads someone else's bytes in place, never frees them, and copies or resizes
// into owning storage.
TEST(Tensor, BorrowIsANonOwningView) {
  std::vector<float> data = {1, 2, 3, 4, 5, 6};
  {
    Tensor view = Tensor::borrow(data.data(), {1, 3, 1, 2}, DType::kF32);
    EXPECT_TRUE(view.is_borrowed());
    EXPECT_EQ(view.raw(), static_cast<void*>(data.data()));
    EXPECT_EQ(view.nbytes(), 24u);
    EXPECT_EQ(view.capacity_bytes(), 0u);
    EXPECT_EQ(view.at(5), 6.f);
    Tensor copy = view;
    EXPECT_FALSE(copy.is_borrowed());
    EXPECT_NE(copy.raw(), view.raw());
    EXPECT_EQ(copy.at(3), 4.f);
    view.resize({2, 1});  // fits in 24 bytes, but a view is never written: fresh storage
    EXPECT_FALSE(view.is_borrowed());
    EXPECT_NE(view.raw(), static_cast<void*>(data.data()));
  }  // destroying views frees nothing of `data`
  EXPECT_EQ(data[0], 1.f);
  EXPECT_FALSE(Tensor({2}).is_borrowed());
  EXPECT_THROW(Tensor::borrow(nullptr, {2}, DType::kF32), Error);
  EXPECT_TRUE(Tensor::borrow(nullptr, {0}, DType::kF32).empty());
}

}  // namespace seqpar
