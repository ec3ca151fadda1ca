// How far flash_attention (and every strategy built on it) may be from reference_attention on
// the same inputs: one bound per kernel path, for out and for lse, from the unit roundoff of the
// arithmetic each path does (docs/kernel.md "Error bounds" gives the derivation and the measured
// errors beside the bounds).
//
// The inputs are those the reference sees too (bf16/fp16 values, converted exactly), so the
// rounding of the inputs to their dtype is no error; what counts is the rounding inside the
// kernel:
//   kF32:        fp32 matmuls, exp2 of degree 5 (relative error eps_exp = 2^-22);
//   kConverted:  bf16/fp16 blocks converted to fp32, fp32 matmuls, exp2 of degree 3
//                (eps_exp = 2^-13);
//   kBf16Matmul: bf16 inputs on a CPU with a bf16 matmul (avx512_bf16, AMX): exp2 of degree 3
//                and the probabilities P rounded to bf16 before P·V (u_bf16 = 2^-8).
// Thread-safety: pure functions; kernel_path() caches its answer (thread-safe static).
#pragma once

#include <cstdint>
#include <string_view>

#include "seqpar/core/dtype.h"

namespace seqpar {

enum class KernelPath { kF32, kConverted, kBf16Matmul };
std::string_view kernel_path_name(KernelPath p);  // "fp32", "converted", "bf16-matmul"

// The path flash_attention takes for inputs of `dtype` on this CPU (bf16 takes the bf16 matmul
// where oneDNN has one and SEQPAR_KERNEL_BF16_MATMUL is not 0, as the kernel decides).
KernelPath kernel_path(DType dtype);

// Max abs error allowed against reference_attention:
//   out: scales with max_abs_v, the largest |v| of the inputs (out is a weighted mean of v rows);
//   lse: absolute (natural log).
// logit_scale: how much larger than unit scale the logits scale·q·k are (1: standard-normal q
// and k with scale 1/sqrt(D), logits of order 1; q multiplied by 30: 30). The logits' rounding
// grows with it.
struct ErrorBound {
  double out = 0;
  double lse = 0;
};

// keys: the most keys one query row sees (the reduction length of the softmax sum and of P·V);
// head_dim: D (the reduction length of q·k).
ErrorBound attention_error_bound(KernelPath path, int64_t keys, int64_t head_dim,
                                 double max_abs_v = 1.0, double logit_scale = 1.0);
// The bound of the path this CPU takes for `dtype`.
ErrorBound attention_error_bound(DType dtype, int64_t keys, int64_t head_dim,
                                 double max_abs_v = 1.0, double logit_scale = 1.0);

}  // namespace seqpar
