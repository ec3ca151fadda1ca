// int8 activations times Q8_0 weights (gemm_q8.h): the activations' quantization and packing, the
// portable reference, and the AVX-512 VNNI variant.
#include "gemm_q8.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "simd_ops.h"
#include "simd_preamble.inc"

namespace seqpar::model_simd {

namespace {

constexpr int64_t kGroups = kQ8Block / 4;                  // 32-bit lanes of inputs per block
constexpr int64_t kPanelBlockBytes = kQ8Panel * kQ8Block;  // 512: one panel's block
// A vector tile: 6 weight rows times 2 panels of 16 rows, 24 accumulators of 32 vector registers.
// One thread, m 256 by a 8192 x 2048 weight (bench/linear_bench --dtype int8 --activations int8,
// a Zen 4 core): 319 G operations/s, where 3 panels x 4 rows gave 303 and 1 x 12 312
// (docs/performance.md section 19).
constexpr int kTileCols = 6;
constexpr int kTilePanels = 2;

// x (m, k) per block of 32 (gemm_q8.h): the blocks' scales s (m, k / 32) and values q (m, k).
void quantize_blocks(const float* x, int64_t m, int64_t k, std::vector<float>& s,
                     std::vector<int8_t>& q) {
  SEQPAR_CHECK(m >= 1 && k >= kQ8Block && k % kQ8Block == 0, "int8 activations: ", m, " x ", k,
               "; valid: k a multiple of ", kQ8Block);
  const Kernels& kern = kernels();
  const int64_t blocks = m * (k / kQ8Block);  // each block of 32 a row of its own
  s.resize(static_cast<size_t>(blocks));
  q.resize(static_cast<size_t>(m * k));
  kern.row_abs_max(x, blocks, kQ8Block, s.data());
  for (float& a : s) a /= 127.f;
  kern.quantize_rows_s8(x, blocks, kQ8Block, s.data(), Ties::kEven, q.data());
}

}  // namespace

void quantize_q8_rows(const float* x, int64_t m, int64_t k, Q8Rows& out) {
  thread_local std::vector<float> s;
  thread_local std::vector<int8_t> q;
  quantize_blocks(x, m, k, s, q);
  const int64_t nb = k / kQ8Block;
  out.m = m;
  out.k = k;
  out.panels = (m + kQ8Panel - 1) / kQ8Panel;
  out.q.resize(static_cast<size_t>(out.panels * nb * kPanelBlockBytes));
  out.s.resize(static_cast<size_t>(out.panels * nb * kQ8Panel));
  // The panels on the team (the thread-local buffers named through pointers: inside the region
  // the names are each thread's own); the last panel's rows past m are zeros (q + 128, s 0).
  const int8_t* qv = q.data();
  const float* sv = s.data();
  uint8_t* oq = out.q.data();
  float* os = out.s.data();
  const int team = omp_in_parallel() ? 1 : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1 && m * k >= (1 << 18))
  for (int64_t p = 0; p < out.panels; ++p)
    for (int64_t lane = 0; lane < kQ8Panel; ++lane) {
      const int64_t r = p * kQ8Panel + lane;
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* dst = oq + (p * nb + b) * kPanelBlockBytes + lane * 4;
        for (int64_t g = 0; g < kGroups; ++g)
          for (int64_t e = 0; e < 4; ++e)
            dst[g * kQ8Panel * 4 + e] =
                r < m ? static_cast<uint8_t>(qv[r * k + b * kQ8Block + g * 4 + e] ^ 0x80) : 0x80;
        os[(p * nb + b) * kQ8Panel + lane] = r < m ? sv[r * nb + b] : 0.f;
      }
    }
}

void dequantize_q8_rows(const float* x, int64_t m, int64_t k, float* out) {
  thread_local std::vector<float> s;
  thread_local std::vector<int8_t> q;
  quantize_blocks(x, m, k, s, q);
  kernels().dequant_i8_channel(q.data(), s.data(), m * (k / kQ8Block), kQ8Block, out);
}

void gemm_q8_scalar(const Q8Rows& x, const int8_t* q, const uint16_t* d, int64_t n,
                    const float* bias, float* y, int64_t ldy) {
  const int64_t k = x.k, nb = k / kQ8Block;
  over_columns(n, kTileCols, [&](int64_t j0, int64_t j1) {
    for (int64_t r = 0; r < x.m; ++r) {
      const int64_t p = r / kQ8Panel, lane = r % kQ8Panel;
      for (int64_t j = j0; j < j1; ++j) {
        float acc = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* xb = x.q.data() + (p * nb + b) * kPanelBlockBytes + lane * 4;
          const int8_t* wb = q + j * k + b * kQ8Block;
          int32_t sum = 0;
          for (int64_t g = 0; g < kGroups; ++g)
            for (int64_t e = 0; e < 4; ++e)
              sum += (static_cast<int32_t>(xb[g * kQ8Panel * 4 + e]) - 128) * wb[g * 4 + e];
          const float t = f16_to_f32(d[j * nb + b]) * x.s[(p * nb + b) * kQ8Panel + lane];
          acc = std::fma(static_cast<float>(sum), t, acc);
        }
        y[r * ldy + j] = bias ? acc + bias[j] : acc;
      }
    }
  });
}

#if SEQPAR_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#if defined(__clang__)
#pragma clang attribute push(                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
    apply_to = function)
#endif
namespace vnni {

// For kCols weight rows from w (row stride k): comp[c][b] = -128 · Σ of block b's 32 values (the
// 128 added to the activations, taken back), dw[c][b] = the block's fp16 scale as fp32.
template <int kCols>
void prepare_rows(const int8_t* w, const uint16_t* d, int64_t k, int32_t* comp, float* dw) {
  const int64_t nb = k / kQ8Block;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int c = 0; c < kCols; ++c) {
    const int8_t* row = w + c * k;
    for (int64_t b = 0; b < nb; ++b) {
      // Σ (w + 128) over 32 bytes as four sums of 8 (vpsadbw), then less 32 · 128.
      const __m256i v = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kQ8Block)), flip);
      const __m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
      __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
      comp[c * nb + b] = -128 * (_mm_cvtsi128_si32(t) - 32 * 128);
    }
  }
  convert(d, DType::kF16, dw, DType::kF32, static_cast<size_t>(kCols * nb));  // exact
}

// Rows of kPanels panels (from panel p) by kCols weight rows (from row j) into y.
template <int kPanels, int kCols>
void tile(const Q8Rows& x, int64_t p, const int8_t* w, const int32_t* comp, const float* dw,
          const float* bias, float* y, int64_t ldy, int64_t j) {
  const int64_t k = x.k, nb = k / kQ8Block;
  __m512 acc[kPanels][kCols];
  for (int v = 0; v < kPanels; ++v)
    for (int c = 0; c < kCols; ++c) acc[v][c] = _mm512_setzero_ps();
  const uint8_t* xq = x.q.data() + p * nb * kPanelBlockBytes;
  const float* xs = x.s.data() + p * nb * kQ8Panel;
  const int64_t panel_q = nb * kPanelBlockBytes, panel_s = nb * kQ8Panel;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i sum[kPanels][kCols];
    for (int c = 0; c < kCols; ++c) {
      const __m512i init = _mm512_set1_epi32(comp[c * nb + b]);
      for (int v = 0; v < kPanels; ++v) sum[v][c] = init;
    }
    const uint8_t* xb = xq + b * kPanelBlockBytes;
    const int8_t* wb = w + b * kQ8Block;
    for (int64_t g = 0; g < kGroups; ++g) {
      __m512i xv[kPanels];
      for (int v = 0; v < kPanels; ++v)
        xv[v] = _mm512_loadu_si512(xb + v * panel_q + g * kQ8Panel * 4);
      for (int c = 0; c < kCols; ++c) {
        int32_t four;
        std::memcpy(&four, wb + c * k + g * 4, 4);
        const __m512i wv = _mm512_set1_epi32(four);
        for (int v = 0; v < kPanels; ++v) sum[v][c] = _mm512_dpbusd_epi32(sum[v][c], xv[v], wv);
      }
    }
    for (int v = 0; v < kPanels; ++v) {
      const __m512 s = _mm512_loadu_ps(xs + v * panel_s + b * kQ8Panel);
      for (int c = 0; c < kCols; ++c) {
        const __m512 t = _mm512_mul_ps(s, _mm512_set1_ps(dw[c * nb + b]));
        acc[v][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[v][c]), t, acc[v][c]);
      }
    }
  }
  // Out through a small buffer: a column of 16 rows a vector there, then each row's kCols
  // outputs to y (a scatter per column took as long as a tile's products at k 256).
  alignas(64) float out[kCols][kQ8Panel];
  for (int v = 0; v < kPanels; ++v) {
    const int64_t r0 = (p + v) * kQ8Panel;
    const int64_t rows = std::min<int64_t>(kQ8Panel, x.m - r0);
    for (int c = 0; c < kCols; ++c) {
      __m512 o = acc[v][c];
      if (bias) o = _mm512_add_ps(o, _mm512_set1_ps(bias[j + c]));
      _mm512_store_ps(out[c], o);
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < kCols; ++c) y[(r0 + r) * ldy + j + c] = out[c][r];
  }
}

using Tile = void (*)(const Q8Rows&, int64_t, const int8_t*, const int32_t*, const float*,
                      const float*, float*, int64_t, int64_t);
using Prepare = void (*)(const int8_t*, const uint16_t*, int64_t, int32_t*, float*);

template <int kPanels, int... kCols>
constexpr std::array<Tile, kTileCols> tiles_of(std::integer_sequence<int, kCols...>) {
  return {&tile<kPanels, kCols + 1>...};
}
// kTiles[panels - 1][cols - 1]: the tile of that many panels and weight rows.
template <int... kPanels>
constexpr auto tiles(std::integer_sequence<int, kPanels...>) {
  return std::array<std::array<Tile, kTileCols>, kTilePanels>{
      tiles_of<kPanels + 1>(std::make_integer_sequence<int, kTileCols>())...};
}
template <int... kCols>
constexpr std::array<Prepare, kTileCols> preparers(std::integer_sequence<int, kCols...>) {
  return {&prepare_rows<kCols + 1>...};
}

void gemm(const Q8Rows& x, const int8_t* q, const uint16_t* d, int64_t n, const float* bias,
          float* y, int64_t ldy) {
  static constexpr auto kTiles = tiles(std::make_integer_sequence<int, kTilePanels>());
  static constexpr auto kPrepare = preparers(std::make_integer_sequence<int, kTileCols>());
  const int64_t k = x.k, nb = k / kQ8Block;
  over_columns(n, kTileCols, [&](int64_t j0, int64_t j1) {
    thread_local std::vector<int32_t> comp;
    thread_local std::vector<float> dw;
    comp.resize(static_cast<size_t>(kTileCols * nb));
    dw.resize(static_cast<size_t>(kTileCols * nb));
    for (int64_t j = j0; j < j1; j += kTileCols) {
      const int cols = static_cast<int>(std::min<int64_t>(kTileCols, j1 - j));
      const int8_t* w = q + j * k;
      kPrepare[cols - 1](w, d + j * nb, k, comp.data(), dw.data());
      for (int64_t p = 0; p < x.panels; p += kTilePanels) {
        const int64_t panels = std::min<int64_t>(kTilePanels, x.panels - p);
        kTiles[panels - 1][cols - 1](x, p, w, comp.data(), dw.data(), bias, y, ldy, j);
      }
    }
  });
}

}  // namespace vnni
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#endif  // SEQPAR_X86_SIMD

GemmQ8 gemm_q8_vnni() {
#if SEQPAR_X86_SIMD
  static const bool runs = kernel_isa() == Isa::kAvx512 && __builtin_cpu_supports("avx512vnni");
  return runs ? &vnni::gemm : nullptr;
#else
  return nullptr;
#endif
}

const char* gemm_q8_path() {
  return gemm_q8_vnni() ? "avx512-vnni" : "fp32 of the quantized values";
}

}  // namespace seqpar::model_simd
