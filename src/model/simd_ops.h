// Vectorized inner loops of the model's dense operations (private to src/model/): the few-row
// product of fp32 activations with a bf16, fp16 or Q8_0 weight (decode), widened to fp32 in the
// load, and the Q8_0 weight's dequantization (prefill).
//
// Each routine exists for three instruction sets, like the attention kernel's (src/attention/
// simd.h): portable scalar C++ (the reference, and the path of CPUs without AVX2), AVX2+FMA+F16C
// and AVX-512 (F, BW, VL), compiled under per-function target attributes and chosen once at run
// time from cpuid. The environment variable SEQPAR_KERNEL_ISA (scalar|avx2|avx512) caps the
// choice for these, for convert()'s widening (core/dtype.cc) and for the attention kernel alike.
//
// Thread-safety: the tables are immutable; kernels() picks its variant once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "seqpar/core/cpu_isa.h"

namespace seqpar::model_simd {

// The instruction sets and the CPU's answer: one for every kernel (core/cpu_isa.h).
using seqpar::best_isa;
using seqpar::cpu_has;
using seqpar::Isa;
using seqpar::isa_name;

// y (m, n) = x (m, k) · w (n, k, 16-bit)ᵀ + bias (n, or null); x, bias, y fp32; 1 <= m <= kMaxRows.
// Output columns are handed out in chunks over the calling thread's OpenMP team; each output is
// one thread's dot product in a fixed order, so the result does not depend on the number of
// threads.
constexpr int64_t kMaxRows = 8;
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

// Q8_0 (ops.h): y (m, n) = x (m, k) · wᵀ + bias with w[j, i] = d[j, i / 32] · q[j, i], q (n, k)
// int8, d (n, k / 32) fp16; k a multiple of 32, 1 <= m <= kMaxRows; columns split as above.
// The summation of one output: per block of 32, t = x·q over the block's 32 / width vectors (a
// product, then FMAs; scalar: 32 products added in sequence), then acc = t·d + acc (one FMA a
// block, in block order); then the lanes by a tree of depth log2(width); then the bias.
using GemvQ8 = void (*)(const float* x, int64_t m, int64_t k, const int8_t* q, const uint16_t* d,
                        int64_t n, const float* bias, float* y);
constexpr int64_t kQ8Block = 32;
// w (rows, k) fp32 = d · q, exact (an 8-bit integer times an 11-bit significand fits in fp32).
using DequantQ8 = void (*)(const int8_t* q, const uint16_t* d, int64_t rows, int64_t k, float* w);

struct Kernels {
  Isa isa;
  Gemv16 gemv_bf16;
  Gemv16 gemv_f16;
  GemvQ8 gemv_q8;
  DequantQ8 dequant_q8;
  int width;  // floats per vector (scalar: partial sums)
};

// The variant in use: SEQPAR_KERNEL_ISA's choice (capped at what the CPU runs), else best_isa().
const Kernels& kernels();
// A specific variant; throws seqpar::InvalidArgument if the CPU cannot run it.
const Kernels& kernels(Isa isa);

}  // namespace seqpar::model_simd
