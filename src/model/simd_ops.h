// Vectorized inner loops of the model's dense operations (private to src/model/): the few-row
// product of fp32 activations with a bf16, fp16, Q8_0 or per-channel int8 weight (decode), widened
// to fp32 in the load, the int8 weights' dequantization (prefill), and the elementwise and
// normalisation ops of ops.h and blocks/rope.h (norms, activations, residual adds, modulation,
// RoPE).
//
// Each routine exists for three instruction sets, like the attention kernel's (src/attention/
// simd.h): portable scalar C++ (the reference, and the path of CPUs without AVX2), AVX2+FMA+F16C
// and AVX-512 (F, BW, VL), compiled under per-function target attributes and chosen once at run
// time from cpuid. The environment variable SEQPAR_KERNEL_ISA (scalar|avx2|avx512) caps the
// choice for these, for convert()'s widening (core/dtype.cc) and for the attention kernel alike.
//
// Thread-safety: the tables are immutable; kernels() picks its variant once. The products and the
// elementwise and normalisation ops split their columns or rows over the calling thread's OpenMP
// team, as linear() does (one thread inside a parallel region: ranks as threads keep their kernels
// single-threaded); each output is computed by one thread in a fixed order, so no result depends
// on the number of threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "seqpar/core/cpu_isa.h"
#include "seqpar/core/team.h"

namespace seqpar::model_simd {

// The instruction sets and the CPU's answer: one for every kernel (core/cpu_isa.h).
using seqpar::best_isa;
using seqpar::cpu_has;
using seqpar::Isa;
using seqpar::isa_name;

// y (m, n) = x (m, k) · w (n, k, 16-bit)ᵀ + bias (n, or null); x, bias, y fp32; m >= 1.
// Output columns are handed out in chunks over the calling thread's OpenMP team; each output is
// one thread's dot product in a fixed order, so the result does not depend on the number of
// threads. Up to kMaxRows rows (decode) are one product of m rows, each weight read once. More
// rows (a short prompt) run in groups of kRowGroup rows (the last one shorter), each output with
// the bits of its group multiplied alone; each thread takes its columns a piece of about
// kRowPieceBytes of weights at a time and runs every group over the piece while the piece is in
// the core's cache. 4 rows: a group's x (4 · k fp32, 32 KiB at k 2048) stays in the first-level
// cache while the piece's columns stream past it; in groups of 8 rows (the decode product's
// largest) 16 to 64 rows took 1.2-1.9x as long, and with the piece widened to fp32 once (twice
// the bytes from the second-level cache) 1.09-1.56x as long in 5 of 6 shapes and 0.91x in one
// (bench/gemv_bench --m 16,32,64 --k 2048,8192, one thread, an Intel Xeon with AVX-512).
constexpr int64_t kMaxRows = 8;
constexpr int64_t kRowGroup = 4;
constexpr int64_t kRowPieceBytes = 128 << 10;
using Gemv16 = void (*)(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                        const float* bias, float* y);

// The summation of one output, which tests derive their error bound from. Vector variants: for m
// rows, gemv_unroll(m, width) accumulators of `width` lanes, each lane a sequential FMA chain over
// about k / (width · unroll) terms; the accumulators are added in sequence, then the lanes by a
// tree of depth log2(width), then the bias. Scalar: `width` = 8 partial sums (multiply, then add),
// added in sequence, then the bias.
// For one row, a step reads one 64-byte line of bf16/fp16 weights (8 lanes x 4, 16 lanes x 2):
// measured at k 2048, n 8192 (bench/gemv_bench), two lines a step streamed 20-30% slower.
constexpr int gemv_unroll(int64_t m, int width) {
  const int u = (m <= 1 ? 32 : m <= 4 ? 16 : 8) / width;
  return u < 1 ? 1 : u;
}
// How many columns a vector variant reads at once, as separate streams (the summation above is
// unchanged): as many as keep m · unroll accumulators per column, at most 4, within 16 vector
// registers of accumulators (8 where the set has 16 registers, width 8). One core keeps more
// lines in flight from several streams: one row, k 2048, n 131072 bf16 (bench/gemv_bench, a
// Xeon with AVX-512, best of 2 rounds) went from 11.1 to 16.2-17.0 GB/s on one thread and from
// 22.2 to 31.2-33.7 on two; Q8_0 at n 262144 from 13.2-13.6 to 15.2-15.4 and from 26.2-26.6 to
// 29.2-29.9.
constexpr int streams_for(int64_t accumulators_per_column, int width) {
  const int s = (width >= 16 ? 16 : 8) / static_cast<int>(accumulators_per_column);
  return s < 1 ? 1 : s > 4 ? 4 : s;
}
constexpr int gemv_streams(int64_t m, int width) {
  return streams_for(m * gemv_unroll(m, width), width);
}
// The same for the Q8_0 product (one accumulator per row and column).
constexpr int gemv_q8_streams(int64_t m, int width) { return streams_for(m, width); }

// Q8_0 (ops.h): y (m, n) = x (m, k) · wᵀ + bias with w[j, i] = d[j, i / 32] · q[j, i], q (n, k)
// int8, d (n, k / 32) fp16; k a multiple of 32, m >= 1; columns and rows split as above.
// The summation of one output: per block of 32, t = x·q over the block's 32 / width vectors (a
// product, then FMAs; scalar: 32 products added in sequence), then acc = t·d + acc (one FMA a
// block, in block order); then the lanes by a tree of depth log2(width); then the bias.
using GemvQ8 = void (*)(const float* x, int64_t m, int64_t k, const int8_t* q, const uint16_t* d,
                        int64_t n, const float* bias, float* y);
constexpr int64_t kQ8Block = 32;
// Q8_0 of w (rows, k) fp32, finite, k a multiple of 32 (ops.h quantize_q8_0): per block of 32,
// a = max |w|, s = a / 127, q = round(w · (1 / s)) (the fp32 product, ties away from zero; 0 where
// s is 0), d = fp16(s): the same bits in every variant.
using QuantizeQ8 = void (*)(const float* w, int64_t rows, int64_t k, int8_t* q, uint16_t* d);
// w (rows, k) fp32 = d · q, exact (an 8-bit integer times an 11-bit significand fits in fp32).
using DequantQ8 = void (*)(const int8_t* q, const uint16_t* d, int64_t rows, int64_t k, float* w);

// Per-channel int8 (ops.h): y (m, n) = x (m, k) · wᵀ + bias with w[j, i] = s[j] · q[j, i], q (n, k)
// int8, s (n) fp32; any k >= 1, m >= 1; columns and rows split as above.
// The summation of one output: t = Σ_i x[i]·q[j, i] exactly as Gemv16 sums (the int8 value widened
// to fp32 exactly in the load; vector variants: gemv_unroll(m, width) accumulators, each lane an
// FMA chain, the accumulators added in sequence, then the lanes by a tree of depth log2(width);
// scalar: `width` partial sums of products, added in sequence), then y = t·s[j] (one multiply),
// then + bias. With d the roundings of the 16-bit gemv's output for the same m and k (its product
// or FMA chain, the accumulator adds, the lane tree, the bias), one output passes through d + 1,
// so |y - Σ_i x_i·s_j·q_ji - b| <= γ_(d+1) · (s_j·Σ_i |x_i·q_ji| + |b|), γ_d = d·u / (1 - d·u),
// u = 2^-24 (outputs away from fp32's subnormal range).
using GemvI8Channel = void (*)(const float* x, int64_t m, int64_t k, const int8_t* q,
                               const float* s, int64_t n, const float* bias, float* y);
// w (rows, k) fp32 = s[j] · q[j, i], the product rounded once to fp32 (the same bits in every
// variant).
using DequantI8Channel = void (*)(const int8_t* q, const float* s, int64_t rows, int64_t k,
                                  float* w);
// w (n) bf16 = q (n) int8, exactly (an integer of at most 8 significant bits is a bf16 value): the
// per-channel int8 blocks that oneDNN's bf16 matmul multiplies with bf16 activations (ops.cc).
using WidenI8Bf16 = void (*)(const int8_t* q, int64_t n, uint16_t* w);
// int8 activations (ops.h linear()), the same bits in every variant:
// amax (rows) = max |x| over each row of x (rows, k); +Inf for a row holding a NaN or an Inf.
using RowAbsMax = void (*)(const float* x, int64_t rows, int64_t k, float* amax);
// q (rows, k) int8 = x / s[r] (the fp32 quotient) clamped to [-127, 127], rounded to nearest,
// ties to even (int8 activations) or away from zero (std::round: per-channel int8 weights); 0 in
// a row whose s is 0 or not finite.
enum class Ties { kEven, kAway };
using QuantizeRowsS8 = void (*)(const float* x, int64_t rows, int64_t k, const float* s, Ties ties,
                                int8_t* q);
// y (rows, n; row stride ldc), each element holding the bits of an int32 sum acc: y =
// fl(fl(fl(acc)·sx[r])·sw[j]) (+ bias[j], one more rounding; bias null: none).
using ScaleInt32Rows = void (*)(float* y, int64_t rows, int64_t n, int64_t ldc, const float* sx,
                                const float* sw, const float* bias);

// ---- elementwise and normalisation ops --------------------------------------------------------
// x (rows, f) row-major fp32 throughout. The scalar variant is the portable reference (the plain
// loops, std::exp and std::tanh); the vector variants compute every element with the same vector
// code wherever it lies (tails through partial loads, not a scalar loop), so neither the split of
// rows over threads nor an element's position changes its value.
//
// Error bounds against the exact value of the same formula on the fp32 inputs (u = 2^-24; the
// constants of the formulas as the scalar code writes them in fp32; outputs in the subnormal range
// carry another absolute 2^-125). Non-finite values propagate as in the scalar code: a NaN or Inf
// input, or an overflow, gives NaN or the same signed Inf in the same outputs.
//   exp (vector variants)     |e - e^x| <= 5u·e^x (+2^-150 below 2^-126); +inf above 88.73, 0
//       below -103.98, NaN for NaN: x = n·ln2 + r (Cody-Waite, two FMAs), 2^n times exp2_poly<5>
//       (attention/exp2_poly.inc) of r·log2(e); 2^n applied in two halves, so one rounding at most.
//   sum_squares   s[r] = Σ x[r, i]² in float64 (exact products), rounded to fp32 once:
//       |s - Σx²| <= 1.01u·Σx² (f <= 2^24). Vector variants: kW/2-lane float64 accumulators, two
//       of them, added, then their lanes, then the tail in order.
//   rms_norm      y = x · inv · w, inv = inverse_scale(sum_sq[r] / full_width + eps), w optional:
//       |y - exact| <= 5.6u·|y| (sum_sq from sum_squares: its rounding included).
//   layer_norm    mean μ and variance Σ(x - μ)²/f in float64 (as sum_squares), inv =
//       inverse_scale(var + eps), y = (x - fp32(μ)) · inv [· w] [+ b]:
//       |y - exact| <= u·|y| + 6.1u·|t| + 1.1u·(|μ| + mean|x| / 32)·inv·|w|, t = (x - μ)·inv·w
//       exact (the second term is fp32's rounding of μ, which no order of the sums avoids).
//   silu          y = x / (1 + exp(-x)):   |y - exact| <= 7.1u·|y| + 2^-120
//   swiglu        y = silu(a) · b:          |y - exact| <= 8.1u·|y| + 2^-120·|b|
//   gelu_tanh     y = 0.5x·(1 + tanh(k·(x + c·x³))), k = 0.7978845608f, c = 0.044715f. Scalar:
//       as written (tanhf within 2 ulp): |y - exact| <= 3.1u·|y| + 2.2u·|x|. Vector: the same
//       value as x / (1 + exp(-2k·(x + c·x³))) (1 + tanh z = 2σ(2z)): |y - exact| <= 7.1u·|y| +
//       0.92u·|x| (the argument's 4.1u relative error, through σ, costs at most 0.224·4.1u·|x|).
//   add           x += y:                   exactly rounded
//   modulate      x = x · (1 + scale) + shift: |y - exact| <= u·|y| + 2.01u·|x·(1 + scale)|
//   gated_add     x += gate · y:            |y - exact| <= u·|y| + 1.01u·|gate·y|
//   rope          per pair (a, c) and its (cos, sin): (a·cos - c·sin, a·sin + c·cos), each
//       within 2.01u·(the sum of its two products' magnitudes) of the exact value.
// Products and sums are never fused (simd_ops.cc is compiled with fp-contract off) but where the
// vector code asks for an FMA (the exp, the GELU argument, the float64 sums): a fused a·b + c
// would turn an overflowing a·b (inf - inf = NaN in the scalar code) into a finite or Inf result.
//
// 1 / sqrt(v) of a norm's mean square or variance v. A v that overflows fp32 would scale the row
// to zeros (as PyTorch does: x · rsqrt(inf) = 0), hiding the overflow from every later check;
// it gives NaN instead, so the model's check after the norm names the layer where it happened.
inline float inverse_scale(float v) {
  return std::isfinite(v) ? 1.0f / std::sqrt(v) : std::numeric_limits<float>::quiet_NaN();
}

// s (rows) = the row sums of squares of x (rows, f).
using SumSquares = void (*)(const float* x, int64_t rows, int64_t f, float* s);
// y (rows, f) = x · inverse_scale(sum_sq[r] / full_width + eps) · weight (f, or null: none).
using RmsNorm = void (*)(const float* x, int64_t rows, int64_t f, const float* sum_sq,
                         int64_t full_width, const float* weight, float eps, float* y);
// y (rows, f) = LayerNorm of x over f, weight and bias (f) optional (null: none).
using LayerNorm = void (*)(const float* x, int64_t rows, int64_t f, const float* weight,
                           const float* bias, float eps, float* y);
// Elementwise over n floats, in place: x = act(x).
using Unary = void (*)(float* x, int64_t n);
// y (n) = silu(a) · b (y may be a or b).
using SwiGlu = void (*)(const float* a, const float* b, int64_t n, float* y);
// x (n) += y (n) (y may be x).
using Add = void (*)(float* x, const float* y, int64_t n);
// x (rows, f) = x · (1 + scale) + shift, scale and shift (f) broadcast over rows.
using Modulate = void (*)(float* x, int64_t rows, int64_t f, const float* shift,
                          const float* scale);
// x (rows, f) += gate (f) · y (rows, f).
using GatedAdd = void (*)(float* x, int64_t rows, int64_t f, const float* gate, const float* y);
// x (tokens, heads, d) rotated in place by table (tokens, d/2, 2) of (cos, sin), the same table
// row for every head; pair j is features (2j, 2j+1) (interleaved) or (j, j + d/2) (halves).
using Rope = void (*)(float* x, int64_t tokens, int64_t heads, int64_t d, const float* table,
                      bool halves);
// y (n) = exp(x) (the vector variants' exp, above; scalar: std::exp); for tests.
using Exp = void (*)(const float* x, float* y, int64_t n);

struct Kernels {
  Isa isa;
  Gemv16 gemv_bf16;
  Gemv16 gemv_f16;
  GemvQ8 gemv_q8;
  QuantizeQ8 quantize_q8;
  DequantQ8 dequant_q8;
  GemvI8Channel gemv_i8_channel;
  DequantI8Channel dequant_i8_channel;
  WidenI8Bf16 widen_i8_bf16;
  RowAbsMax row_abs_max;
  QuantizeRowsS8 quantize_rows_s8;
  ScaleInt32Rows scale_int32_rows;
  int width;  // floats per vector (scalar: partial sums)
  SumSquares sum_squares;
  RmsNorm rms_norm;
  LayerNorm layer_norm;
  Unary silu;
  Unary gelu_tanh;
  SwiGlu swiglu;
  Add add;
  Modulate modulate;
  GatedAdd gated_add;
  Rope rope;
  Exp exp;
};

// Runs cols(j0, j1) over [0, n) on the calling thread's team (core/team.h; one thread inside a
// chunk): chunks of about n / (8 · team) columns, a multiple of `granule` and at least
// max(16, 4 · granule), handed out one at a time, so that a descheduled thread's chunks go to the
// others. The few-row products (granule 1) and gemm_q8's tiles of weight rows share it.
template <typename Cols>
void over_columns(int64_t n, int64_t granule, Cols&& cols) {
  const int team = loop_threads();
  if (team == 1) return cols(0, n);
  const int64_t chunk = std::max<int64_t>(std::max<int64_t>(16, 4 * granule),
                                          (n + 8 * team - 1) / (8 * team) / granule * granule);
  parallel_for((n + chunk - 1) / chunk,
               [&](int64_t c) { cols(c * chunk, std::min(n, (c + 1) * chunk)); });
}

// The variant in use: SEQPAR_KERNEL_ISA's choice (capped at what the CPU runs), else best_isa().
const Kernels& kernels();
// A specific variant; throws seqpar::InvalidArgument if the CPU cannot run it.
const Kernels& kernels(Isa isa);

}  // namespace seqpar::model_simd
