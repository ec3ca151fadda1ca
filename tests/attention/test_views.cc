// The kernel over strided views: q, k and v read where they lie (PyTorch's (B, H, S, D) memory,
// a head slice of a wider tensor, a run of rows, a head_dim with a stride) and the state written
// into strided outputs. Oracle: reference_attention on dense copies made by hand, within the
// kernel's error bound; and the dense kernel call, which must give the same bits (the kernel
// packs the same blocks either way).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/attention/error_bound.h"
#include "seqpar/core/tensor_view.h"

namespace seqpar {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum class Where { kDense, kBhsd, kHeadSlice, kRowRun, kStridedDim };
const char* where_name(Where w) {
  switch (w) {
    case Where::kDense:
      return "dense";
    case Where::kBhsd:
      return "bhsd";
    case Where::kHeadSlice:
      return "head-slice";
    case Where::kRowRun:
      return "row-run";
    case Where::kStridedDim:
      return "strided-dim";
  }
  return "?";
}

// A tensor x (B, S, H, D) stored as `w` says inside a larger buffer whose other elements are NaN
// (reading one poisons the result), with the view that sees x.
struct Placed {
  Tensor buffer;
  TensorView view;
};

Placed place(const Tensor& x, Where w) {
  const int64_t B = x.dim(0), S = x.dim(1), H = x.dim(2), D = x.dim(3);
  const DType dt = x.dtype();
  const size_t e = dtype_size(dt);
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
  switch (w) {
    case Where::kDense:
      shape = {B, S, H, D};
      strides = {S * H * D, H * D, D, 1};
      break;
    case Where::kBhsd:
      shape = {B, H, S, D};
      strides = {H * S * D, D, S * D, 1};
      break;
    case Where::kHeadSlice:  // heads 2 .. 2 + H of H + 3
      shape = {B, S, H + 3, D};
      strides = {S * (H + 3) * D, (H + 3) * D, D, 1};
      offset = 2 * D;
      break;
    case Where::kRowRun:  // rows 3 .. 3 + S of S + 5
      shape = {B, S + 5, H, D};
      strides = {(S + 5) * H * D, H * D, D, 1};
      offset = 3 * H * D;
      break;
    case Where::kStridedDim:
      shape = {B, S, H, D, 2};
      strides = {S * H * D * 2, H * D * 2, D * 2, 2};
      break;
  }
  Placed p{Tensor(shape, dt), {}};
  p.buffer.fill(kNaN);
  char* base = static_cast<char*>(p.buffer.raw()) + offset * e;
  const char* src = static_cast<const char*>(x.raw());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          std::memcpy(
              base + (b * strides[0] + s * strides[1] + h * strides[2] + d * strides[3]) * e,
              src + (((b * S + s) * H + h) * D + d) * e, e);
  p.view = TensorView::strided(base, {B, S, H, D}, strides, dt);
  return p;
}

Tensor random_input(std::vector<int64_t> shape, uint64_t seed, DType dt) {
  Tensor t(std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t.to(dt);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct Shape {
  int64_t b, sq, sk, h, hkv, d;
};

TEST(KernelViews, StridedInputsAndOutputsMatchTheReference) {
  const Where wheres[] = {Where::kDense, Where::kBhsd, Where::kHeadSlice, Where::kRowRun,
                          Where::kStridedDim};
  const Shape shapes[] = {
      {2, 70, 70, 4, 2, 16}, {1, 1, 300, 6, 2, 32}, {1, 4, 300, 6, 2, 32}, {2, 5, 130, 3, 3, 8}};
  int n = 0;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (const Shape& sh : shapes)
      for (bool causal : {false, true})
        for (int threads : {1, 2})
          for (int wq = 0; wq < 5; ++wq) {
            const Where w[3] = {wheres[wq], wheres[(wq + 1) % 5], wheres[(wq + 3) % 5]};
            const Tensor q = random_input({sh.b, sh.sq, sh.h, sh.d}, 1 + n, dt);
            const Tensor k = random_input({sh.b, sh.sk, sh.hkv, sh.d}, 100 + n, dt);
            const Tensor v = random_input({sh.b, sh.sk, sh.hkv, sh.d}, 200 + n, dt);
            const Placed pq = place(q, w[0]), pk = place(k, w[1]), pv = place(v, w[2]);
            AttnParams params;
            params.mask.causal = causal;
            std::vector<int64_t> q_pos(sh.sq);  // the newest queries of the keys
            for (int64_t i = 0; i < sh.sq; ++i) q_pos[i] = sh.sk - sh.sq + i;
            if (causal) params.mask.q_pos = q_pos;
            params.block_q = 32;
            params.block_k = 64;
            const std::string name = std::string(dtype_name(dt)) + " q " + where_name(w[0]) +
                                     " k " + where_name(w[1]) + " v " + where_name(w[2]) + " B" +
                                     std::to_string(sh.b) + " Sq" + std::to_string(sh.sq) +
                                     (causal ? " causal" : "") + " t" + std::to_string(threads);
            omp_set_num_threads(threads);
            const AttnState dense = flash_attention(q, k, v, params);
            const AttnState got = flash_attention(pq.view, pk.view, pv.view, params);
            // Into (B, H, S, D) output memory and an lse in rows 2 .. 2 + Sq of Sq + 4.
            Tensor out_buf({sh.b, sh.h, sh.sq, sh.d}), lse_buf({sh.b, sh.sq + 4, sh.h});
            out_buf.fill(-7.f);
            lse_buf.fill(-7.f);
            const MutableTensorView out_v = MutableTensorView(out_buf).transpose(1, 2);
            const MutableTensorView lse_v = MutableTensorView(lse_buf).narrow(1, 2, sh.sq);
            flash_attention_into(pq.view, pk.view, pv.view, params, out_v, lse_v);
            omp_set_num_threads(1);
            EXPECT_TRUE(same_bits(got.out, dense.out) && same_bits(got.lse, dense.lse)) << name;
            EXPECT_TRUE(same_bits(out_v.contiguous(), dense.out)) << name;
            EXPECT_TRUE(same_bits(lse_v.contiguous(), dense.lse)) << name;
            for (int64_t b = 0; b < sh.b; ++b)
              for (int64_t s : {int64_t{0}, int64_t{1}, sh.sq + 2, sh.sq + 3})
                for (int64_t h = 0; h < sh.h; ++h)
                  EXPECT_EQ(lse_buf.at((b * (sh.sq + 4) + s) * sh.h + h), -7.f) << name;
            // The independent oracle on dense copies (made above by hand, not through views).
            const AttnState want = reference_attention(q, k, v, params);
            double vmax = 0;
            for (int64_t i = 0; i < v.numel(); ++i)
              vmax = std::max(vmax, std::fabs(double(v.at(i))));
            const ErrorBound tol = attention_error_bound(dt, sh.sk, sh.d, vmax, 1.0);
            double e_out = 0, e_lse = 0;
            for (int64_t i = 0; i < want.out.numel(); ++i)
              e_out = std::max(e_out, std::fabs(double(got.out.at(i)) - want.out.at(i)));
            for (int64_t i = 0; i < want.lse.numel(); ++i)
              e_lse = std::max(e_lse, std::fabs(double(got.lse.at(i)) - want.lse.at(i)));
            EXPECT_LE(e_out, tol.out) << name;
            EXPECT_LE(e_lse, tol.lse) << name;
            ++n;
          }
  EXPECT_EQ(n, 2 * 4 * 2 * 2 * 5);
}

TEST(KernelViews, OutputsOfTheWrongShapeOrTypeAreRefused) {
  const Tensor q({1, 4, 2, 8}), k({1, 6, 2, 8});
  Tensor out({1, 4, 2, 8}), lse({1, 4, 2}), bad_out({1, 4, 2, 8}, DType::kBF16), bad_lse({1, 4, 3});
  EXPECT_NO_THROW(flash_attention_into(q, k, k, {}, out, lse));
  EXPECT_THROW(flash_attention_into(q, k, k, {}, bad_out, lse), InvalidArgument);
  EXPECT_THROW(flash_attention_into(q, k, k, {}, out, bad_lse), InvalidArgument);
  try {
    flash_attention_into(q, k, k, {}, out, bad_lse);
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "attention lse is [1, 4, 3] fp32; valid: [1, 4, 2] fp32");
  }
}

}  // namespace
}  // namespace seqpar
