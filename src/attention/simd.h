// Vectorized inner loops of the flash-attention kernel (private to src/attention/): the online
// softmax update of one score row, the fast exp2, and dtype conversions of packed blocks.
//
// Each routine exists for three instruction sets: portable scalar C++, AVX2+FMA+F16C and
// AVX-512 (F, BW, DQ, VL). They are compiled with per-function target attributes (never
// -march=native) from one generic body (simd_body.inc) and chosen at run time with
// __builtin_cpu_supports, so one binary runs everywhere.
//
// Thread-safety: the tables are immutable; force_softmax_isa() is an atomic process-wide override
// meant for tests and benchmarks.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "seqpar/core/cpu_isa.h"

namespace seqpar::attn_simd {

// The instruction sets and the CPU's answer: one for every kernel (core/cpu_isa.h).
using seqpar::best_isa;
using seqpar::cpu_has;
using seqpar::Isa;
using seqpar::isa_name;

// Rows of the score block are padded to a multiple of this many floats (the widest vector), so
// every row routine may read and write whole vectors up to round_up(n, kRowAlign).
constexpr int kRowAlign = 16;
constexpr int64_t round_up_row(int64_t n) { return (n + kRowAlign - 1) / kRowAlign * kRowAlign; }

// The degree of the exp2 polynomial: 5 (rel. err. ~2e-7, for fp32 inputs) or 3 (~7.5e-5,
// enough for bf16/fp16 inputs, whose own rounding is ~4e-3).
enum class Exp2Degree { kDeg3 = 3, kDeg5 = 5 };

// Online softmax update of one query row against one key block (log2 domain).
//   s     (round_up_row(n)) raw scores q·k of the row; only s[lo, hi) are candidates, and any
//         -inf among them is masked. On return s[0, n) holds p_j = 2^(c·s_j - m) (0 where masked);
//         entries in [n, round_up_row(n)) are scratch.
//   c     softmax scale · log2(e) (> 0)
//   m     running max in log2 units (-inf before the row saw any key)
//   l     running sum of 2^(c·s - m)
//   o     (d) the row's output accumulator; rescaled with l when m moves
// The max is stale: m moves only when the block's max exceeds it by more than kStaleMaxSlack,
// so p_j <= 2^kStaleMaxSlack and the common case needs no rescale.
constexpr float kStaleMaxSlack = 8.f;
using RowUpdateF32 = void (*)(float* s, int64_t lo, int64_t hi, int64_t n, float c, float* m,
                              double* l, float* o, int64_t d);
// Same, but p is written as bf16 to p16 (round_up_row(n)) for a bf16 P·V matmul; s is scratch.
using RowUpdateBF16 = void (*)(float* s, uint16_t* p16, int64_t lo, int64_t hi, int64_t n, float c,
                               float* m, double* l, float* o, int64_t d);

// The element type of K and V for the few-row matmuls.
enum class KvType : uint8_t { kF32, kBF16, kF16 };

struct Kernels {
  Isa isa;
  RowUpdateF32 row_update_deg5;
  RowUpdateF32 row_update_deg3;
  RowUpdateBF16 row_update_bf16_deg3;
  // y[i] = 2^x[i] with the degree-5 or degree-3 polynomial (for tests).
  void (*exp2_deg5)(const float* x, float* y, int64_t n);
  void (*exp2_deg3)(const float* x, float* y, int64_t n);
  // dst = src · f (n elements), e.g. the final out = o / l.
  void (*scale_copy)(const float* src, float f, float* dst, int64_t n);
  // Storage conversions to fp32 (packing bf16/fp16 blocks for the fp32 matmul path).
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  // fp32 -> bf16, round to nearest even.
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n);
  // Whether any of n fp32, bf16 or fp16 elements is an Inf or a NaN.
  bool (*any_nonfinite_f32)(const float* x, int64_t n);
  bool (*any_nonfinite_bf16)(const uint16_t* x, int64_t n);
  bool (*any_nonfinite_f16)(const uint16_t* x, int64_t n);
  // Few-row matmuls for decode shapes (rows <= 64): register-blocked FMA loops, which, unlike a
  // general GEMM, need no packing of their own on every call. K and V are fp32, bf16 or fp16
  // (kt, vt), read where they lie and widened to fp32 in the loops:
  //   small_qk: S (rows × n, row stride ld_s) = Q·Kᵀ, with q (rows × d, row stride d), qt = Qᵀ
  //             (d × rp; rp = rows rounded up to small_row_align(), padding columns zero) and k
  //             (n × d, row stride ld_k); up to 4 rows take q with D in the vector lanes, more
  //             take qt with the rows in the lanes;
  //   small_pv: O (rows × d, row stride d) += P (rows × n, row stride ld_p) · V (n × d, row
  //             stride ld_v).
  void (*small_qk)(const float* q, const float* qt, int64_t rp, int64_t rows, const void* k,
                   KvType kt, int64_t ld_k, int64_t n, int64_t d, float* s, int64_t ld_s);
  void (*small_pv)(const float* p, int64_t ld_p, int64_t rows, const void* v, KvType vt,
                   int64_t ld_v, int64_t n, int64_t d, float* o);
  // Panel products of the fp32 blocks of query tiles (flash.cc, docs/kernel.md "Panel
  // products"): B is packed once per key block into panels of panel_width columns (pack_*: panel
  // j (depth, panel_width) at j·depth·panel_width, its columns past the last zero) and A's rows
  // are multiplied 6 at a time against every panel; each output is one FMA chain over depth in
  // order.
  //   pack_panels:   B (depth × cols) = X, X (depth × cols, row stride ld): V for P·V;
  //   pack_panels_t: B (depth × cols) = Xᵀ, X (cols × depth, row stride ld): K for Q·Kᵀ;
  //   panel_product: C (rows × cols, row stride ldc) = A (rows × depth, row stride lda)·B, B's
  //                  panel j at b + j·ldb (rows of a packed B from row i: b + i·panel_width,
  //                  ldb its depth·panel_width); with accumulate C += A·B (the chain from zero,
  //                  then added to C: a sum post-op, so O's error grows per key block as with
  //                  oneDNN's). Only C's rows × cols are written.
  int64_t panel_width;
  void (*pack_panels)(const float* x, int64_t ld, int64_t depth, int64_t cols, float* out);
  void (*pack_panels_t)(const float* x, int64_t ld, int64_t depth, int64_t cols, float* out);
  void (*panel_product)(const float* a, int64_t lda, int64_t rows, const float* b, int64_t depth,
                        int64_t ldb, int64_t cols, float* c, int64_t ldc, bool accumulate);
  // row_update_bf16_deg3 rounds P with AVX512_BF16's vcvtneps2bf16 (the avx512 variant on a CPU
  // that has it; denormal probabilities become 0) rather than in software.
  bool p_rounded_by_avx512_bf16;
};

// Qᵀ for small_qk has its rows padded to a multiple of this (the widest vector, any variant).
constexpr int64_t small_row_align() { return kRowAlign; }

// The variant in use: force_softmax_isa()'s choice if set, else the environment variable
// SEQPAR_KERNEL_ISA (scalar|avx2|avx512, capped at what the CPU runs), else best_isa().
const Kernels& kernels();
// A specific variant; throws seqpar::InvalidArgument if the CPU cannot run it.
const Kernels& kernels(Isa isa);
// Process-wide override for tests and benchmarks (std::nullopt restores the default).
// Throws InvalidArgument if the CPU cannot run it.
void force_softmax_isa(std::optional<Isa> isa);

}  // namespace seqpar::attn_simd
