// Dense operations of the transformer modules, on fp32 row-major matrices: x (rows, features).
// Activations of shape (B, S, ...) are viewed as rows = B·S. Each call runs on the calling
// thread's OpenMP team (ranks as threads set it to 1).
// Thread-safety: reentrant; oneDNN primitives are cached per thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "seqpar/core/tensor.h"

namespace seqpar {

// y (rows, out) = x (rows, in) · wᵀ + bias, w (out, in) as stored by PyTorch's nn.Linear, bias
// (out) or empty. x, bias and y are fp32; w is fp32, or bf16/fp16 as a checkpoint stores it
// (up to 64 rows of x: widened in the load of a vectorized product, past 8 rows in groups of 4;
// more: converted to fp32 a block of rows at a time, the block kept in cache for oneDNN's matmul).
// w may also be int8 with its scales w_scale (below), told apart by the scales: Q8_0 (fp16, (out,
// in / 32)) or per-channel (fp32, (out)). Up to 64 rows (per-channel) or 32 (Q8_0) multiply the
// int8 values directly, more multiply blocks of rows dequantized to fp32.
// activations kBF16: x is rounded to bf16 (to nearest even) first, as llama.cpp multiplies a BF16
// weight; a bf16 or per-channel int8 weight times more than 8 rows is then multiplied by oneDNN's
// bf16 matmul where the CPU has AVX512-BF16 or AMX (products exact, sums fp32), else by the fp32
// paths on the rounded values (the same products). kF32: x as it is.
// activations kI8 with Q8_0 weights: each block of 32 of a row of x quantized to int8 with its
// own fp32 scale (as below with the block for the row; x_row_max is not used), as llama.cpp
// multiplies a Q8_0 weight; past 5 rows the block's products summed exactly in int32 where the
// CPU has AVX512-VNNI (src/model/gemm_q8.h states the summation and its bound, gamma_(k/32+2)
// against the quantized values), else the Q8_0 paths on x̂ = fl(s_x·q_x).
// activations kI8 with per-channel int8 weights: each row of x quantized to int8 with one fp32
// scale, s_x = a / 127 with a = max |x| over the row (or x_row_max's value, a row-parallel rank's
// maximum over the whole row), q_x = x / s_x (the fp32 quotient) rounded to nearest, ties to even,
// clamped to [-127, 127] (0 where a is 0); then y = s_x·s_w·(q_x · q_wᵀ) + b: past 4 rows the
// sums exact in int32 (oneDNN's int8 matmul, on CPUs with VNNI) and y = fl(fl(fl(sum)·s_x)·s_w)
// (+ b, one more rounding); up to 4 rows (decode), and at any row count on CPUs without VNNI
// (where oneDNN's int8 sums saturate), the per-channel fp32 paths on x̂ = fl(s_x·q_x). A row
// holding a NaN or an Inf gives NaN. Error, u = 2^-24: against the quantized values, |y -
// (s_x·s_w·Σ q_x·q_w + b)| <= gamma_4·(|s_x·s_w·Σ q_x·q_w| + |b|) on the int8 matmul; on the fp32
// paths the per-channel product's bound on x̂, which adds u·|x̂| per element; the quantization
// itself moves x by at most s_x·(1/2 + 128u) per element.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias,
              const Tensor& w_scale = Tensor(), DType activations = DType::kF32,
              const Tensor& x_row_max = Tensor());
// max |x| over each row of x (rows, features) -> (rows), fp32; +Inf for a row holding a NaN or an
// Inf (int8 activations' scale, all-reduced by a row-parallel layer's ranks).
Tensor row_abs_max(const Tensor& x);
// Where linear() multiplies bf16 activations by a bf16 weight on this CPU: "onednn bf16" or
// "fp32 of the rounded values".
std::string_view bf16_activations_path();
// Where linear() multiplies int8 activations past 4 rows: "onednn s8 " and oneDNN's
// implementation (e.g. "brg:avx512_core_vnni") where it sums exactly (VNNI), else "int32 sums "
// and the vector variant giving the same sums (e.g. "avx2"), or "fp32 of the quantized values"
// (SEQPAR_KERNEL_ISA=scalar without VNNI).
std::string_view int8_activations_path();
// The instruction set each of linear()'s kernels runs on this CPU, e.g. "gemv_bf16 avx512,
// gemv_f16 avx512, gemv_q8 avx512, gemv_i8_channel avx512, convert avx512, ..., int8
// activations x Q8_0 avx512-vnni"
// (SEQPAR_KERNEL_ISA=scalar|avx2|avx512 caps them).
std::string model_kernel_info();
// The instruction set each elementwise and normalisation op (below, and apply_rope_) runs on this
// CPU, in a fixed order: {"sum_squares", "avx512"}, {"rms_norm", "avx512"}, ..., {"rope",
// "avx512"} (SEQPAR_KERNEL_ISA caps them as it caps linear()'s).
std::vector<std::pair<std::string, std::string>> model_op_paths();
// The same as one line: "sum_squares avx512, rms_norm avx512, ...".
std::string model_op_info();

// Q8_0, llama.cpp's 8-bit weight format, as two tensors: a weight w (n, k), k a multiple of 32,
// becomes int8 values q (n, k) and one fp16 scale per block of 32 along k, d (n, k / 32), with
// w[j, i] ≈ d[j, i / 32] · q[j, i]. Per block, as llama.cpp computes it (ggml's
// quantize_row_q8_0_ref, gguf-py's Q8_0): a = max |w| over the block, s = a / 127 (fp32),
// q = round(w · (1 / s)) (half away from zero; 0 where s is 0) in [-127, 127], d = fp16(s): the
// same bytes as a GGUF Q8_0 file made from the same weights.
// Error per element: |w - d·q| <= s / 2 + 127 · |s - d|, |s - d| <= 2^-11 · s for a normal fp16
// (and <= 2^-25 for a subnormal one).
struct Q8Weight {
  Tensor q;  // int8 (n, k)
  Tensor d;  // fp16 (n, k / 32)
};
// w is fp32, bf16 or fp16 and finite (InvalidArgument otherwise, naming `name`).
Q8Weight quantize_q8_0(const Tensor& w, const std::string& name);
// Rows [row0, row0 + rows) of a Q8_0 weight (q, d) as fp32, into out (rows, k); exact.
void dequantize_q8_0(const Tensor& q, const Tensor& d, int64_t row0, int64_t rows, float* out);

// Per-channel int8: a weight w (n, k), any k, becomes int8 values q (n, k) and one fp32 scale per
// output row s (n): s[j] = a / 127 (fp32) with a = max_i |w[j, i]|, q = round(w / s) (the fp32
// quotient, rounded half away from zero, clamped to [-127, 127]; 0 where s is 0), w ≈ s[j]·q[j, i].
// Error per element, u = 2^-24: the quotient w / s lies within 128u of the exact one (|w / s| <=
// 127·(1 + u)), so |w - s·q| <= s·(1/2 + 128u); the product s·q in fp32 (the dequantized weight)
// adds at most 127u·s, so |w - fl(s·q)| <= s·(1/2 + 255u). Where s is subnormal (a < 127·2^-126)
// both carry another absolute 2^-143 (s's own rounding, times at most 127, halved).
// row_abs_max (n, fp32), when given, holds a of each row of a larger matrix of which w is a
// slice of columns (a row-parallel rank's share): every rank then holds the same s and the same
// q for its columns as one rank holding the whole matrix, and the sum of the ranks' products is
// that rank's product up to the rounding of the sum.
struct Int8ChannelWeight {
  Tensor q;  // int8 (n, k)
  Tensor s;  // fp32 (n)
};
// w is fp32, bf16 or fp16 and finite (InvalidArgument otherwise, naming `name`); row_abs_max's
// values at least w's own (an Error otherwise).
Int8ChannelWeight quantize_int8_channel(const Tensor& w, const std::string& name,
                                        const Tensor& row_abs_max = Tensor());
// Rows [row0, row0 + rows) of a per-channel weight (q, s) as fp32 s·q (one rounding), into out
// (rows, k).
void dequantize_int8_channel(const Tensor& q, const Tensor& s, int64_t row0, int64_t rows,
                             float* out);
// Rows of either int8 format, told apart by its scales (fp16 (n, k / 32): Q8_0; fp32 (n):
// per-channel).
void dequantize_int8(const Tensor& q, const Tensor& scale, int64_t row0, int64_t rows, float* out);

// The norms and elementwise ops below run the vector kernels of src/model/simd_ops.h (scalar,
// AVX2, AVX-512, as model_op_paths() names them), whose header states each one's error bound;
// NaN and Inf come out where the scalar loops give them, and no result depends on the thread count.
//
// y = x / sqrt(mean(x²) + eps) · weight, over the last dimension (weight empty: no scale).
// sum_sq, when given, replaces the local sum of squares per row (for statistics reduced over a
// group): then mean = sum_sq[row] / full_width.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps);
// Row-wise sums of squares of x (rows, features) -> (rows).
Tensor row_sum_squares(const Tensor& x);
// rms_norm with given per-row sums of squares over a width of full_width features.
Tensor rms_norm_with_stats(const Tensor& x, const Tensor& sum_sq, int64_t full_width,
                           const Tensor& weight, float eps);
// LayerNorm over the last dimension, optional affine weight/bias (empty: none).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);

// Elementwise, in place.
void gelu_tanh_(Tensor& x);
void silu_(Tensor& x);
void add_(Tensor& x, const Tensor& y);  // same numel
// x (rows, F) <- x · (1 + scale) + shift, scale/shift (F) broadcast over rows (adaLN).
void modulate_(Tensor& x, const float* shift, const float* scale);
// x (rows, F) += gate (F) · y (rows, F)
void gated_add_(Tensor& x, const float* gate, const Tensor& y);
// SwiGLU: silu(a) · b, a and b (rows, F) -> (rows, F)
Tensor swiglu(const Tensor& a, const Tensor& b);

// Reinterprets the shape (same number of elements, row-major); returns the moved tensor.
Tensor reshape(Tensor t, std::vector<int64_t> shape);
// Rows [begin, end) of the leading dimension viewed as (rows, features); a copy.
Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end);
// Columns [begin, end) of x (rows, cols); a copy.
Tensor slice_cols(const Tensor& x, int64_t begin, int64_t end);
// Concatenates x (rows, a) and y (rows, b) along columns -> (rows, a+b).
Tensor concat_cols(const Tensor& x, const Tensor& y);

// A model run stops where an overflow first appears instead of returning NaN: throws Error
// "layers.3.mlp produced a non-finite value (inf) at row r, feature f of its (shape) output; ..."
// when fp32 `t`, the output of module `op` (of `group`.`index`: "layers", 3, "mlp"; as the
// checkpoint names the module), holds an Inf or NaN. One pass over t.
void expect_finite(const Tensor& t, std::string_view op);
void expect_finite(const Tensor& t, std::string_view group, int64_t index, std::string_view op);

// Sinusoidal timestep embedding (cos then sin halves) of t·scale, t a scalar -> (dim).
Tensor timestep_embedding(float t, int64_t dim, float scale = 1.0f);

}  // namespace seqpar
