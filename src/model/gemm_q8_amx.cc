// gemm_q8.h's two products on AMX's int8 tiles (Intel's Xeons since Sapphire Rapids): the Q8_0
// product with the bits of the portable loops, and the int32 sums.
//
// Tiles: C (tmm0-3) 16 rows x 16 int32, A (tmm4, tmm6) 16 rows of activations x one block of 32
// inputs (signed bytes, 512 contiguous bytes as Q8Layout::kTiles packs them), B (tmm5, tmm7) the
// same block of 16 weight rows in the layout
// tdpbssd takes (8 rows of 16 x 4 bytes: 4 consecutive inputs of one weight row in each 32-bit
// element). tdpbssd multiplies signed by signed bytes into int32, exactly: C = S_b, the block's
// sums for 16 x 16 outputs.
// - Q8_0: C is stored after each block and every row goes through the FMAs of the other variants
//   (acc = fma(S_b, fl(d_b · s_x), acc), blocks in order, then the bias), in AVX-512 registers:
//   the same bits.
// - int32 sums: C accumulates over every block, then the inputs past the last block
//   (add_s8_tail).
// Each thread of the team takes chunks of weight rows (over_columns), packs their blocks into B's
// layout once (a gather per 16 elements), and passes over the activations in blocks of rows that
// stay in its cache. A thread configures the tiles at the start of its chunk and releases them at
// its end. Linux hands the tile state to a process that asks (arch_prctl, once): where it says
// no, the variant is not offered.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "gemm_q8.h"
#include "seqpar/core/cpu_isa.h"
#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "simd_ops.h"
#include "simd_preamble.inc"

namespace seqpar::model_simd {

#if SEQPAR_X86_SIMD && defined(__linux__)

bool amx_int8_usable() {
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA (asm/prctl.h; not every libc's headers have them),
  // which fails where the OS keeps no tile state.
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  static const bool usable =
      cpu_has_amx_int8() && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  return usable;
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-int8")
#if defined(__clang__)
#pragma clang attribute push(                                                                     \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-int8"))), \
    apply_to = function)
#endif

namespace {

constexpr int64_t kCols = 16;              // weight rows a tile's columns
constexpr int64_t kBlockInts = kQ8Block / 4 * kCols;  // 128 int32 a packed B tile

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0-3: C, 16 x 16 int32; tmm4 and tmm6: A, 16 rows x 32 bytes; tmm5 and tmm7: B, 8 rows x
// 16 x 4 bytes.
void configure() {
  TileConfig c;
  for (int t = 0; t < 4; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  for (int t : {4, 6}) {
    c.rows[t] = 16;
    c.colsb[t] = kQ8Block;
    c.rows[t + 1] = kQ8Block / 4;
    c.colsb[t + 1] = 64;
  }
  _tile_loadconfig(&c);
}

// C tile C += block b of the panel's A tiles (at a) times the weights' B tile (at wb), loaded
// into tiles A and B. (Macros: GCC's tile intrinsics paste the tile's number into the
// instruction's text, so it must be a literal.)
#define SEQPAR_AMX_BLOCK(C, A, B, b)                      \
  do {                                                    \
    _tile_loadd(A, a + (b)*kQ8PanelBlockBytes, kQ8Block); \
    _tile_loadd(B, wb + (b)*kBlockInts, 64);              \
    _tile_dpbssd(C, A, B);                                \
  } while (false)

// Weight rows j..j + cols - 1 of q (row stride ldq; the tile's other columns zeros), blocks of 32
// from input 0 to nb · 32, into B tiles: out[b][g][c] = the 4 bytes of row j + c at b·32 + g·4.
void pack_weights(const int8_t* q, int64_t ldq, int64_t cols, int64_t nb, int32_t* out) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i index = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(ldq)));
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t g = 0; g < kQ8Block / 4; ++g) {
      const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, index,
                                                    q + b * kQ8Block + g * 4, 1);
      _mm512_storeu_si512(out + b * kBlockInts + g * kCols, v);
    }
}

// The scales of the same weight rows by block: dw[b][c] (0 past cols).
void pack_scales(const uint16_t* d, int64_t nb, int64_t cols, float* dw) {
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < kCols; ++c) dw[b * kCols + c] = c < cols ? f16_to_f32(d[c * nb + b]) : 0.f;
}

// Q8_0: panel p's 16 rows by the packed weight rows (column j of y, cols of them) into y. Blocks
// go in pairs, two pairs in flight: the tiles multiply the next pair (C tiles 2 and 3, or 0 and 1)
// while the vector unit scales the last (each tile stored, then every row's FMA), so neither waits
// on the other's latency (one pair at a time: 260-325 G operations/s, a tile store waiting on
// its product and the next product on that store).
void q8_panel(const Q8Rows& x, int64_t p, const int32_t* wb, const float* dw, int64_t cols,
              const float* bias, float* y, int64_t ldy, int64_t j) {
  const int64_t nb = x.k / kQ8Block;
  alignas(64) int32_t c[2][16 * kCols];
  __m512 acc[16];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const uint8_t* a = x.q.data() + p * nb * kQ8PanelBlockBytes;
  const float* s = x.s.data() + p * nb * kQ8Panel;
  // Each row's blocks in order: acc = fma(S_b, fl(d_b · s_x), acc).
  auto scale = [&](const int32_t* cb, int64_t b) {
    const __m512 dv = _mm512_loadu_ps(dw + b * kCols);
    for (int r = 0; r < 16; ++r) {
      const __m512 t = _mm512_mul_ps(dv, _mm512_set1_ps(s[b * kQ8Panel + r]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb + r * kCols)), t, acc[r]);
    }
  };
  // Pair q: blocks 2q and 2q + 1 (if there is one) into C tiles C0 and C1, then out.
  const int64_t pairs = (nb + 1) / 2;
#define SEQPAR_AMX_ISSUE(C0, C1, q)                                    \
  do {                                                                 \
    _tile_zero(C0);                                                    \
    SEQPAR_AMX_BLOCK(C0, 4, 5, 2 * (q));                               \
    if (2 * (q) + 1 < nb) {                                            \
      _tile_zero(C1);                                                  \
      SEQPAR_AMX_BLOCK(C1, 6, 7, 2 * (q) + 1);                         \
    }                                                                  \
  } while (false)
#define SEQPAR_AMX_DRAIN(C0, C1, q)                                    \
  do {                                                                 \
    _tile_stored(C0, c[0], 64);                                        \
    if (2 * (q) + 1 < nb) _tile_stored(C1, c[1], 64);                  \
    scale(c[0], 2 * (q));                                              \
    if (2 * (q) + 1 < nb) scale(c[1], 2 * (q) + 1);                    \
  } while (false)
  if (pairs > 0) SEQPAR_AMX_ISSUE(0, 1, 0);
  for (int64_t q = 0; q < pairs; q += 2) {
    if (q + 1 < pairs) SEQPAR_AMX_ISSUE(2, 3, q + 1);
    SEQPAR_AMX_DRAIN(0, 1, q);
    if (q + 1 < pairs) {
      if (q + 2 < pairs) SEQPAR_AMX_ISSUE(0, 1, q + 2);
      SEQPAR_AMX_DRAIN(2, 3, q + 1);
    }
  }
#undef SEQPAR_AMX_ISSUE
#undef SEQPAR_AMX_DRAIN
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + j) : _mm512_setzero_ps();
  const int64_t r0 = p * kQ8Panel, rows = std::min<int64_t>(kQ8Panel, x.m - r0);
  for (int64_t r = 0; r < rows; ++r)
    _mm512_mask_storeu_ps(y + (r0 + r) * ldy + j, mask, bias ? _mm512_add_ps(acc[r], bv) : acc[r]);
}

// int32 sums: panel p's rows by the packed weight rows over every block, four blocks in flight
// (C tiles 0-3, added at the end: int32 sums in any order), into y.
void sums_panel(const Q8Rows& x, int64_t p, const int32_t* wb, int64_t cols, int32_t* y,
                int64_t ldy, int64_t j) {
  const int64_t nb = x.k / kQ8Block;
  alignas(64) int32_t c[4][16 * kCols];
  const uint8_t* a = x.q.data() + p * nb * kQ8PanelBlockBytes;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    SEQPAR_AMX_BLOCK(0, 4, 5, b);
    SEQPAR_AMX_BLOCK(1, 6, 7, b + 1);
    SEQPAR_AMX_BLOCK(2, 4, 5, b + 2);
    SEQPAR_AMX_BLOCK(3, 6, 7, b + 3);
  }
  for (; b < nb; ++b) SEQPAR_AMX_BLOCK(0, 4, 5, b);
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  const int64_t r0 = p * kQ8Panel, rows = std::min<int64_t>(kQ8Panel, x.m - r0);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512i v = _mm512_add_epi32(
        _mm512_add_epi32(_mm512_load_si512(c[0] + r * kCols), _mm512_load_si512(c[1] + r * kCols)),
        _mm512_add_epi32(_mm512_load_si512(c[2] + r * kCols), _mm512_load_si512(c[3] + r * kCols)));
    _mm512_mask_storeu_epi32(y + (r0 + r) * ldy + j, mask, v);
  }
}

// The product over the team: d null for int32 sums (y an int32_t*), else Q8_0 (y a float*).
void product(const Q8Rows& x, const int8_t* q, const uint16_t* d, int64_t n, const float* bias,
             void* y, int64_t ldy) {
  SEQPAR_CHECK(x.layout == Q8Layout::kTiles, "gemm_q8 amx-int8: rows packed for another variant");
  const int64_t k = x.k, nb = k / kQ8Block, ldq = k + x.tail_k;
  SEQPAR_CHECK(ldq < (int64_t{1} << 31) / kCols, "gemm_q8 amx-int8: rows of ", ldq, " inputs");
  const int64_t block_panels =
      std::max<int64_t>(1, kQ8RowBlockBytes / (std::max<int64_t>(k, 1) * kQ8Panel));
  over_columns(n, kCols, [&](int64_t j0, int64_t j1) {
    thread_local std::vector<int32_t> wb;
    thread_local std::vector<float> dw;
    const int64_t groups = (j1 - j0 + kCols - 1) / kCols;
    wb.resize(static_cast<size_t>(groups * std::max<int64_t>(nb, 1) * kBlockInts));
    dw.resize(static_cast<size_t>(groups * std::max<int64_t>(nb, 1) * kCols));
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t j = j0 + g * kCols, cols = std::min<int64_t>(kCols, j1 - j);
      pack_weights(q + j * ldq, ldq, cols, nb, wb.data() + g * nb * kBlockInts);
      if (d) pack_scales(d + j * nb, nb, cols, dw.data() + g * nb * kCols);
    }
    configure();
    for (int64_t p0 = 0; p0 < x.panels; p0 += block_panels) {
      const int64_t p1 = std::min(x.panels, p0 + block_panels);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t j = j0 + g * kCols, cols = std::min<int64_t>(kCols, j1 - j);
        for (int64_t p = p0; p < p1; ++p) {
          if (d)
            q8_panel(x, p, wb.data() + g * nb * kBlockInts, dw.data() + g * nb * kCols,
                     cols, bias, static_cast<float*>(y), ldy, j);
          else
            sums_panel(x, p, wb.data() + g * nb * kBlockInts, cols,
                       static_cast<int32_t*>(y), ldy, j);
        }
      }
    }
    _tile_release();
    if (!d) add_s8_tail(x, q, j0, j1, static_cast<int32_t*>(y), ldy);
  });
}

#undef SEQPAR_AMX_BLOCK

}  // namespace

void gemm_q8_amx(const Q8Rows& x, const int8_t* q, const uint16_t* d, int64_t n,
                 const float* bias, float* y, int64_t ldy) {
  product(x, q, d, n, bias, y, ldy);
}

void sums_s8_amx(const Q8Rows& x, const int8_t* q, int64_t n, int32_t* y, int64_t ldy) {
  product(x, q, nullptr, n, nullptr, y, ldy);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options

#else

bool amx_int8_usable() { return false; }
void gemm_q8_amx(const Q8Rows&, const int8_t*, const uint16_t*, int64_t, const float*, float*,
                 int64_t) {
  SEQPAR_CHECK(false, "gemm_q8 amx-int8: not built for this CPU");
}
void sums_s8_amx(const Q8Rows&, const int8_t*, int64_t, int32_t*, int64_t) {
  SEQPAR_CHECK(false, "gemm_q8 amx-int8: not built for this CPU");
}

#endif

}  // namespace seqpar::model_simd
