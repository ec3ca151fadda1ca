// fp32 activations times a bf16, fp16 or int8 weight made fp32 in the packing step (gemm_packed.h):
// the portable reference and the AVX2 + FMA variant.
#include "gemm_packed.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
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
// The tile after the primitives it uses.
#include "../core/panel_tile.inc"
static_assert(kPanelW == kPackedPanel);

// Blocking, one thread, m 256 by a 8192 x 2048 bf16 weight and m 256 by 2048 x 8192 (a
// stand-alone copy of this loop nest on an AMD EPYC Zen 3 core, AVX2): 85-90 GFLOP/s with kDepth
// 512 and 8 panels against 72 with 128 inputs a pass or 2 panels; rows in blocks of 256 held 89
// GFLOP/s at m 4096, where all 4096 rows a pass fell to 73 (the tiles' outputs no longer in L2).
constexpr int64_t kDepth = 512;  // inputs a pass over the rows (each panel's part stays in L1/L2)
constexpr int64_t kPanels = 8;   // panels packed at a time (128 columns, all k inputs)
constexpr int64_t kRowBlock = 256;  // rows a block: its outputs of kPanels panels stay in L2

// 8 consecutive values ŵ[j, i .. i+8) of a weight of kind K.
template <Kind K>
inline __m256 load8(const PackedWeight& w, int64_t j, int64_t i) {
  const int64_t at = j * w.k + i;
  if constexpr (K == Kind::kBF16) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w.w) + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (K == Kind::kF16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w.w) + at)));
  } else {
    const __m128i q =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(w.w) + at));
    // (The fp16 scale widened by F16C: exact, as f16_to_f32.)
    const float s =
        K == Kind::kI8Channel
            ? static_cast<const float*>(w.scale)[j]
            : _cvtsh_ss(static_cast<const uint16_t*>(w.scale)[j * (w.k / kQ8Block) + i / kQ8Block]);
    return _mm256_mul_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
  }
}

// Rows c of 8 vectors (8 weight rows' values at 8 inputs) into 8 vectors of the 8 rows' value at
// one input each: out[i] = (v[0][i], .., v[7][i]).
inline void transpose8(const __m256* v, __m256* out) {
  const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
  const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
  const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
  const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  out[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  out[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  out[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  out[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  out[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  out[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  out[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  out[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The panel of weight rows j .. j+cols (cols <= 16) as out (k, 16): out[i][c] = ŵ[j + c, i], the
// columns past cols zero.
template <Kind K>
void pack_panel(const PackedWeight& w, int64_t j, int64_t cols, float* out) {
  const int64_t k = w.k, k8 = cols == kPackedPanel ? k / 8 * 8 : 0;
  for (int64_t i = 0; i < k8; i += 8) {
    for (int64_t half = 0; half < 2; ++half) {
      __m256 v[8], t[8];
      SEQPAR_UNROLL for (int64_t c = 0; c < 8; ++c) v[c] = load8<K>(w, j + 8 * half + c, i);
      transpose8(v, t);
      SEQPAR_UNROLL for (int64_t e = 0; e < 8; ++e)
          _mm256_store_ps(out + (i + e) * kPackedPanel + 8 * half, t[e]);
    }
  }
  for (int64_t i = k8; i < k; ++i)
    for (int64_t c = 0; c < kPackedPanel; ++c)
      out[i * kPackedPanel + c] = c < cols ? value(w, j + c, i) : 0.f;
}

// Columns [j0, j1) of y (j0 a multiple of 16): kPanels panels at a time packed, then every block
// of rows passes over them, kDepth inputs a pass. A last panel of fewer than 16 columns is
// computed into a buffer of 16 columns and copied out.
template <Kind K>
void columns(const float* x, int64_t m, const PackedWeight& w, const float* bias, float* y,
             int64_t ldy, int64_t j0, int64_t j1) {
  const int64_t k = w.k;
  thread_local std::vector<float> store, edge;
  store.resize(static_cast<size_t>(kPanels * k * kPackedPanel + 8));
  float* packed = store.data() + (8 - reinterpret_cast<uintptr_t>(store.data()) / 4 % 8) % 8;
  for (int64_t jb = j0; jb < j1; jb += kPanels * kPackedPanel) {
    const int64_t cols = std::min(kPanels * kPackedPanel, j1 - jb);
    const int64_t panels = (cols + kPackedPanel - 1) / kPackedPanel;
    for (int64_t p = 0; p < panels; ++p)
      pack_panel<K>(w, jb + p * kPackedPanel, std::min(kPackedPanel, cols - p * kPackedPanel),
                    packed + p * k * kPackedPanel);
    const int64_t edge_cols = cols % kPackedPanel;
    float edge_bias[kPackedPanel] = {};
    if (edge_cols) {
      edge.resize(static_cast<size_t>(m * kPackedPanel));
      if (bias) std::copy_n(bias + jb + cols - edge_cols, edge_cols, edge_bias);
    }
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
      const int64_t r1 = std::min(m, r0 + kRowBlock);
      for (int64_t i0 = 0; i0 < k; i0 += kDepth) {
        const int64_t depth = std::min(kDepth, k - i0);
        const bool first = i0 == 0, last = i0 + depth == k;
        for (int64_t r = r0; r < r1; r += kPanelRows) {
          const PanelTile t = kPanelTiles[std::min<int64_t>(kPanelRows, r1 - r) - 1];
          const float* xr = x + r * k + i0;
          for (int64_t p = 0; p < panels; ++p) {
            const float* b = packed + p * k * kPackedPanel + i0 * kPackedPanel;
            const int64_t j = jb + p * kPackedPanel;
            if (edge_cols && p == panels - 1)
              t(xr, k, b, depth, edge.data() + r * kPackedPanel, kPackedPanel, !first,
                last && bias ? edge_bias : nullptr, 0);
            else
              t(xr, k, b, depth, y + r * ldy + j, ldy, !first, last && bias ? bias + j : nullptr,
                0);
          }
        }
      }
    }
    if (edge_cols)
      for (int64_t r = 0; r < m; ++r)
        std::copy_n(edge.data() + r * kPackedPanel, edge_cols, y + r * ldy + jb + cols - edge_cols);
  }
}

template <Kind K>
void product(const float* x, int64_t m, const PackedWeight& w, const float* bias, float* y,
             int64_t ldy) {
  over_columns(w.n, kPackedPanel,
               [&](int64_t j0, int64_t j1) { columns<K>(x, m, w, bias, y, ldy, j0, j1); });
}

}  // namespace avx2
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
  switch (w.kind) {
    case Kind::kBF16:
      return avx2::product<Kind::kBF16>(x, m, w, bias, y, ldy);
    case Kind::kF16:
      return avx2::product<Kind::kF16>(x, m, w, bias, y, ldy);
    case Kind::kI8Channel:
      return avx2::product<Kind::kI8Channel>(x, m, w, bias, y, ldy);
    case Kind::kQ8:
      return avx2::product<Kind::kQ8>(x, m, w, bias, y, ldy);
  }
#endif  // (elsewhere check_cpu_has has thrown)
}

namespace {
std::atomic<int64_t> max_rows{kPackedMaxRows};  // read by every rank's thread
}  // namespace

int64_t packed_max_rows() { return max_rows.load(std::memory_order_relaxed); }
void set_packed_max_rows(int64_t rows) { max_rows.store(rows, std::memory_order_relaxed); }

GemmPacked gemm_packed() {
  // Chosen once, as kernels() is: SEQPAR_KERNEL_ISA is read at the first call only.
  static const GemmPacked chosen = kernel_isa() == Isa::kAvx2 ? &gemm_packed_avx2 : nullptr;
  return chosen;
}

const char* gemm_packed_path() {
  static const std::string path = gemm_packed()
                                      ? "avx2 packed up to " + std::to_string(kPackedMaxRows) +
                                            " rows, then onednn fp32 of converted blocks"
                                      : "onednn fp32 of converted blocks";
  return path.c_str();
}

}  // namespace seqpar::model_simd
