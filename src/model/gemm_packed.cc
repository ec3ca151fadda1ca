// fp32 activations times a bf16, fp16 or int8 weight made fp32 in the packing step (gemm_packed.h):
// the portable reference and the vector variants (AVX2 + FMA, AVX-512) on one loop nest
// (gemm_packed_body.inc).
#include "gemm_packed.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "seqpar/core/cpu_isa.h"
#include "seqpar/core/dtype.h"
#include "simd_ops.h"
#include "simd_preamble.inc"

namespace seqpar::model_simd {

namespace {

using Kind = PackedWeight::Kind;

// ŵ[j, i]: the weight's fp32 value, as simd_ops.h's dequant_* make it.
float value(const PackedWeight& w, int64_t j, int64_t i) {
  const int64_t at = j * w.k + i;
  switch (w.kind) {
    case Kind::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(w.w)[at]);
    case Kind::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(w.w)[at]);
    case Kind::kI8Channel:
      return static_cast<const float*>(w.scale)[j] *
             static_cast<float>(static_cast<const int8_t*>(w.w)[at]);
    case Kind::kQ8:
      return f16_to_f32(
                 static_cast<const uint16_t*>(w.scale)[j * (w.k / kQ8Block) + i / kQ8Block]) *
             static_cast<float>(static_cast<const int8_t*>(w.w)[at]);
  }
  return 0.f;
}

}  // namespace

void gemm_packed_scalar(const float* x, int64_t m, const PackedWeight& w, const float* bias,
                        float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.k));
  for (int64_t j = 0; j < w.n; ++j) {
    for (int64_t i = 0; i < w.k; ++i) row[i] = value(w, j, i);
    for (int64_t r = 0; r < m; ++r) {
      float acc = 0.f;
      for (int64_t i = 0; i < w.k; ++i) acc = std::fma(x[r * w.k + i], row[i], acc);
      y[r * ldy + j] = bias ? acc + bias[j] : acc;
    }
  }
}

#if SEQPAR_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#endif
namespace avx2 {
#include "../core/simd_vec_avx2.inc"
// The tile after the primitives it uses,
#include "../core/panel_tile.inc"
// the loop nest after the tile.
#include "gemm_packed_body.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")
#if defined(__clang__)
#pragma clang attribute push(                                                    \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl"))), \
    apply_to = function)
#endif
namespace avx512 {
#include "../core/simd_vec_avx512.inc"
// (in this order, as avx2's)
#include "../core/panel_tile.inc"
// (after the tile)
#include "gemm_packed_body.inc"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#endif  // SEQPAR_X86_SIMD

void gemm_packed_avx2(const float* x, int64_t m, const PackedWeight& w, const float* bias, float* y,
                      int64_t ldy) {
  check_cpu_has(Isa::kAvx2);
#if SEQPAR_X86_SIMD
  if (m == 0 || w.n == 0) return;
  if (w.k == 0) return gemm_packed_scalar(x, m, w, bias, y, ldy);  // y = bias, or zeros
  avx2::gemm(x, m, w, bias, y, ldy);
#endif  // (elsewhere check_cpu_has has thrown)
}

void gemm_packed_avx512(const float* x, int64_t m, const PackedWeight& w, const float* bias,
                        float* y, int64_t ldy) {
  check_cpu_has(Isa::kAvx512);
#if SEQPAR_X86_SIMD
  if (m == 0 || w.n == 0) return;
  if (w.k == 0) return gemm_packed_scalar(x, m, w, bias, y, ldy);
  avx512::gemm(x, m, w, bias, y, ldy);
#endif
}

namespace {
std::atomic<int64_t> max_rows{kPackedMaxRows};  // read by every rank's thread
}  // namespace

int64_t packed_max_rows() { return max_rows.load(std::memory_order_relaxed); }
void set_packed_max_rows(int64_t rows) { max_rows.store(rows, std::memory_order_relaxed); }

GemmPacked gemm_packed() {
  // Chosen once, as kernels() is: SEQPAR_KERNEL_ISA is read at the first call only.
  static const GemmPacked chosen = kernel_isa() == Isa::kAvx512 ? &gemm_packed_avx512
                                   : kernel_isa() == Isa::kAvx2 ? &gemm_packed_avx2
                                                                : nullptr;
  return chosen;
}

const char* gemm_packed_path() {
  static const std::string path = gemm_packed()
                                      ? std::string(isa_name(kernel_isa())) + " packed up to " +
                                            std::to_string(kPackedMaxRows) +
                                            " rows, then onednn fp32 of converted blocks"
                                      : "onednn fp32 of converted blocks";
  return path.c_str();
}

}  // namespace seqpar::model_simd
