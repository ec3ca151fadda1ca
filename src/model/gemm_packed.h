// fp32 activations times a weight stored narrower than fp32 (bf16, fp16, per-channel int8, Q8_0),
// for many rows (linear() past its few-row products, up to kPackedMaxRows), private to src/model/:
// each weight row's fp32 values are made in the product's own packing step (widened, or dequantized
// as simd_ops.h's dequant_* do: fl(s·q), one rounding), transposed into panels of two vectors'
// columns (16 with AVX2, 32 with AVX-512) that stay in the core's cache while every row of x passes
// over them; no separate conversion pass over the weight, no block of it written out whole and read
// again.
//
// The product, for output (r, j), with ŵ the weight's fp32 values:
//   acc = 0; for i = 0 .. k-1 in order: acc = fma(x[r, i], ŵ[j, i], acc); y = acc (+ bias[j], one
//   rounding)
// the same bits in every variant and on any number of threads (gemm_packed_scalar is that loop).
// Error against the exact Σ_i x[r, i]·ŵ[j, i] + bias[j], u = 2^-24: at most γ_(k+1)·(Σ_i |x[r, i]·
// ŵ[j, i]| + |bias[j]|) (k fused adds, the bias), away from fp32's overflow and subnormal range.
// Thread-safety: reentrant; the product splits its columns over the calling thread's OpenMP team.
#pragma once

#include <cstdint>

namespace seqpar::model_simd {

// linear() takes the packed product up to this many rows of x, oneDNN on converted blocks past
// them. Medians of the ratio over 9 alternating calls in one process (bench/linear_bench
// --compare-packed 9, a 8192 x 2048 weight, one thread, an AMD EPYC Zen 3 core, AVX2): bf16 0.95-
// 1.05x at 128 rows, 1.16-1.17x at 256, 1.02-1.08x at 512, 0.93-1.01x at 1024, 0.95-1.00x at
// 2048; Q8_0 1.02, 1.13, 1.01, 0.96, 0.89; per-channel int8 1.03, 1.07, 1.01, 0.87, 0.93. The
// AVX-512 variant on an Intel Xeon (5 calls each): bf16 1.15, 1.07, 1.05 and 1.01 at 128 to 1024.
// Past 512 rows x no longer stays in cache between blocks of columns; a prefetch of the next tile's
// rows recovered little in a stand-alone copy (0.93 -> 0.95 at 2048 rows; not kept).
constexpr int64_t kPackedMaxRows = 512;  // (gemm_packed_path() names it)
// The rows up to which linear() takes the packed product: kPackedMaxRows, unless set (0: never;
// bench/linear_bench --compare-packed times both paths in one process this way). A call of
// linear() running while it is set takes either path.
int64_t packed_max_rows();
void set_packed_max_rows(int64_t rows);

// A weight (n, k) as linear() holds it: values w of `kind`, and its scales (per-channel: fp32 (n);
// Q8_0: fp16 (n, k / 32); none for bf16 and fp16).
struct PackedWeight {
  enum class Kind { kBF16, kF16, kI8Channel, kQ8 };
  Kind kind = Kind::kBF16;
  const void* w = nullptr;
  const void* scale = nullptr;
  int64_t n = 0, k = 0;
};

// y (m, n; row stride ldy) = x (m, k; rows contiguous) · ŵᵀ (+ bias (n), or null).
using GemmPacked = void (*)(const float* x, int64_t m, const PackedWeight& w, const float* bias,
                            float* y, int64_t ldy);
// The portable loop (the reference the tests compare the vector variant's bits with).
void gemm_packed_scalar(const float* x, int64_t m, const PackedWeight& w, const float* bias,
                        float* y, int64_t ldy);
// The vector variants (core/panel_tile.inc's tiles): AVX2 + FMA, 6 rows by two vectors of 8
// columns a step; AVX-512 (F, BW, DQ, VL), 12 rows by two vectors of 16. Each throws
// seqpar::InvalidArgument where the CPU lacks its instructions.
void gemm_packed_avx2(const float* x, int64_t m, const PackedWeight& w, const float* bias, float* y,
                      int64_t ldy);
void gemm_packed_avx512(const float* x, int64_t m, const PackedWeight& w, const float* bias,
                        float* y, int64_t ldy);
// The variant linear() takes: SEQPAR_KERNEL_ISA's choice (avx2 or avx512), else null (the scalar
// cap: linear() converts blocks of the weight and multiplies them with oneDNN there).
GemmPacked gemm_packed();
// linear()'s path for `seqpar info`: "avx512 packed up to 512 rows, then onednn fp32 of converted
// blocks" (or avx2's), or "onednn fp32 of converted blocks".
const char* gemm_packed_path();

}  // namespace seqpar::model_simd
