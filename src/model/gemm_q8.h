// int8 activations times Q8_0 weights (ops.h linear() with int8 activations and a Q8_0 weight),
// private to src/model/: both operands in blocks of 32 along k, each block with its own scale,
// the block's 32 products summed exactly in int32 (tdpbssd on AMX's int8 tiles, vpdpbusd with
// AVX512-VNNI or AVX-VNNI, vpmaddubsw with AVX2), then scaled.
//
// Activations, per block of 32 of a row: a = max |x| over the block (+Inf where it holds a NaN or
// an Inf), s = a / 127 (fp32), q = x / s (the fp32 quotient) rounded to nearest, ties to even,
// clamped to [-127, 127] (0 where s is 0 or not finite): simd_ops.h's int8 activations with rows
// of 32. They are packed for the product: rows in panels of 16 (the last padded with rows of
// zeros), per panel and block the 16 rows' q + 128 as unsigned bytes, 4 consecutive inputs of one
// row in each 32-bit lane (the vpdpbusd layout), and the 16 rows' scales.
//
// The product, for output (r, j), with S_b = Σ_(i in block b) q_x[r, i]·q_w[j, i] (exact in
// int32: |S_b| <= 32·127² < 2^24, so exact in fp32 too) and d_b the weight block's fp16 scale
// (exact in fp32):
//   acc = 0; for b in order: acc = fma(S_b, fl(d_b · s_x[r, b]), acc); y = acc (+ bias[j], one
//   rounding)
// the same bits in every variant and on any number of threads. Error against the quantized
// values, u = 2^-24, nb = k / 32: |y - (Σ_b d_b·s_x·S_b + bias)| <= γ_(nb+2)·(Σ_b |d_b·s_x·S_b| +
// |bias|) (each term's scale rounded once, nb fused adds, the bias), away from fp32's overflow
// and subnormal range. A row whose block holds a NaN or an Inf gives NaN in every output (its
// block scale is +Inf: S_b·Inf with S_b = 0 is NaN).
//
// The same variants also give plain int32 sums, for per-channel int8 weights (linear() with int8
// activations where oneDNN's int8 matmul does not sum exactly, as on CPUs with AVX2 alone):
// y[r, j] = Σ_i q_x[r, i]·q_w[j, i] over all k inputs, exact in int32 for k <= 2^31 / 127², so
// the same bits as oneDNN's int8 matmul. The rows are packed as above from int8 values quantized
// elsewhere (no scales), the inputs past the last full block of 32 kept beside the panels.
// Thread-safety: reentrant; the product splits its columns over the calling thread's OpenMP team.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "seqpar/core/cpu_isa.h"

namespace seqpar::model_simd {

constexpr int64_t kQ8Panel = 16;  // rows of activations per panel (one vector of int32 lanes)
constexpr int64_t kQ8PanelBlockBytes = kQ8Panel * 32;  // 512: one panel's block of 32 inputs
// Packed activations a block of rows holds in every variant's product: each weight row of a
// thread's chunk passes over one block before the next, which then stays in the core's L2. 2
// threads, m 2048 by a 8192 x 2048 weight (bench/gemv_bench --dtype int8 --activations int8
// --threads 2, an Intel Xeon with a 2 MiB L2): AVX512-VNNI 451 -> 647 G operations/s, AVX-VNNI
// 316 -> 486, AVX2 161 -> 204 against all rows at once (their 4 MiB streamed from L3 for every 6
// or 4 weight rows); blocks of 128 and 512 KiB within 5% of 256, and m 256 (one or two blocks)
// unchanged.
constexpr int64_t kQ8RowBlockBytes = int64_t{256} << 10;

// How a variant takes the packed rows.
enum class Q8Layout {
  kPanels,  // per panel of 16 rows and block of 32, 4 inputs of a row in each 32-bit lane, q + 128
            // as unsigned bytes (the vpdpbusd variants)
  kTiles,   // per panel of 16 rows and block of 32, the 16 rows' 32 inputs one row after the
            // other, signed (the A tile of AMX's tdpbssd: 512 contiguous bytes)
};

struct Q8Rows {
  int64_t m = 0, k = 0, panels = 0;  // k: the packed inputs, a multiple of 32
  Q8Layout layout = Q8Layout::kPanels;
  std::vector<uint8_t> q;  // kPanels: (panels, k / 32, 8, 16, 4); kTiles: (panels, k / 32, 16, 32)
  std::vector<float> s;    // (panels, k / 32, 16); empty for int32 sums
  int64_t tail_k = 0;      // int32 sums: inputs past the packed k (fewer than 32)
  std::vector<int8_t> tail;  // (m, tail_k): those inputs' values as they are
};

// x (m, k) fp32, k a multiple of 32, quantized and packed as above, on the calling thread's team.
void quantize_q8_rows(const float* x, int64_t m, int64_t k, Q8Rows& out,
                      Q8Layout layout = Q8Layout::kPanels);

// x̂ (m, k) = fl(s·q) of each block of x (m, k): the values the product multiplies, in fp32 (the
// Q8_0 decode product's input where the vector variant does not run, or for a few rows).
void dequantize_q8_rows(const float* x, int64_t m, int64_t k, float* out);

// q (m, k) int8 (row stride ldq) packed for int32 sums: its first k / 32 · 32 inputs as above, the
// rest into out.tail. On the calling thread's team.
void pack_s8_rows(const int8_t* q, int64_t m, int64_t k, int64_t ldq, Q8Rows& out,
                  Q8Layout layout = Q8Layout::kPanels);
// int32 sums: the inputs past the packed blocks (x.tail), for output columns [j0, j1) of every
// row, added to y (each variant's last step).
void add_s8_tail(const Q8Rows& x, const int8_t* q, int64_t j0, int64_t j1, int32_t* y, int64_t ldy);

// The product's variants: y (m, n; row stride ldy) from the packed rows and a Q8_0 weight q (n, k)
// int8, d (n, k / 32) fp16; bias (n) or null.
using GemmQ8 = void (*)(const Q8Rows& x, const int8_t* q, const uint16_t* d, int64_t n,
                        const float* bias, float* y, int64_t ldy);
// The portable loops (the reference the tests compare the vector variant's bits with), on rows
// packed as kPanels.
void gemm_q8_scalar(const Q8Rows& x, const int8_t* q, const uint16_t* d, int64_t n,
                    const float* bias, float* y, int64_t ldy);
// int32 sums: y (m, n; row stride ldy) = q_x · q_wᵀ from rows packed by pack_s8_rows and int8
// weights q (n, x.k + x.tail_k).
using GemmS32 = void (*)(const Q8Rows& x, const int8_t* q, int64_t n, int32_t* y, int64_t ldy);
struct GemmQ8Variant {
  const char* name;  // "amx-int8", "avx512-vnni", "avx-vnni", "avx2"
  Isa isa;           // the SEQPAR_KERNEL_ISA it needs: avx512, or avx2
  GemmQ8 gemm;
  GemmS32 sums;
  // An extension beyond that set (AVX-VNNI beside AVX2): left out where SEQPAR_KERNEL_ISA caps
  // the CPU below its widest set, so that a cap at avx2 stands for a CPU with AVX2 alone.
  bool extension = false;
  Q8Layout layout = Q8Layout::kPanels;  // how quantize_q8_rows and pack_s8_rows pack for it
  int64_t min_rows = 0;  // fewer rows go to the next variant (fewer than its tiles pay for)
};
// AMX (gemm_q8_amx.cc): whether this CPU has AMX-INT8 and Linux lets the process use its tiles
// (asked once), and the variant's two products, on rows packed as kTiles.
bool amx_int8_usable();
void gemm_q8_amx(const Q8Rows& x, const int8_t* q, const uint16_t* d, int64_t n, const float* bias,
                 float* y, int64_t ldy);
void sums_s8_amx(const Q8Rows& x, const int8_t* q, int64_t n, int32_t* y, int64_t ldy);
// The vector variants this CPU runs, fastest first (all give the scalar loops' bits).
std::vector<GemmQ8Variant> gemm_q8_variants();
// The one linear() takes for m rows: the first of those that SEQPAR_KERNEL_ISA allows and whose
// min_rows m reaches, or null (scalar).
const GemmQ8Variant* gemm_q8(int64_t m = std::numeric_limits<int64_t>::max());
// Where linear() multiplies int8 activations by Q8_0 weights past its few rows: gemm_q8()'s
// name (e.g. "avx512-vnni"; "amx-int8 from 128 rows, else avx512-vnni"), else "fp32 of the
// quantized values" (the Q8_0 product on the dequantized activations).
const char* gemm_q8_path();

}  // namespace seqpar::model_simd
