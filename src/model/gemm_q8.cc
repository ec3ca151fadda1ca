// int8 activations times Q8_0 weights (gemm_q8.h): the activations' quantization and packing, the
// portable reference, and the vector variants (AVX512-VNNI, AVX-VNNI, AVX2) on one generic body.
#include "gemm_q8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "simd_ops.h"
#include "simd_preamble.inc"

namespace seqpar::model_simd {

namespace {

constexpr int64_t kGroups = kQ8Block / 4;  // 32-bit lanes of inputs per block
// AMX's tiles from this many rows (the others below it). One thread, a 8192 x 2048 weight
// (bench/gemv_bench --dtype int8 --activations int8, an AMX Xeon): AMX 62, 122, 278 and 312
// G operations/s at m 8, 16, 64 and 256, AVX512-VNNI 104, 223, 335 and 263.
constexpr int64_t kAmxMinRows = 128;

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

void pack_s8_rows(const int8_t* q, int64_t m, int64_t k, int64_t ldq, Q8Rows& out,
                  Q8Layout layout) {
  const int64_t nb = k / kQ8Block;
  out.m = m;
  out.k = nb * kQ8Block;
  out.panels = (m + kQ8Panel - 1) / kQ8Panel;
  out.layout = layout;
  out.q.resize(static_cast<size_t>(out.panels * nb * kQ8PanelBlockBytes));
  out.s.clear();
  out.tail_k = k - out.k;
  out.tail.resize(static_cast<size_t>(m * out.tail_k));
  // The panels on the team (the buffers named through pointers: inside a chunk a thread_local
  // name is each thread's own); the last panel's rows past m are zeros (q + 128 in kPanels).
  uint8_t* oq = out.q.data();
  int8_t* ot = out.tail.data();
  const int64_t tail_k = out.tail_k, kp = out.k;
  const bool tiles = layout == Q8Layout::kTiles;
  auto pack_panel = [&](int64_t p) {
    for (int64_t lane = 0; lane < kQ8Panel; ++lane) {
      const int64_t r = p * kQ8Panel + lane;
      for (int64_t b = 0; b < nb; ++b) {
        if (tiles) {
          uint8_t* dst = oq + (p * nb + b) * kQ8PanelBlockBytes + lane * kQ8Block;
          if (r < m)
            std::memcpy(dst, q + r * ldq + b * kQ8Block, kQ8Block);
          else
            std::fill_n(dst, kQ8Block, uint8_t{0});
        } else {
          uint8_t* dst = oq + (p * nb + b) * kQ8PanelBlockBytes + lane * 4;
          for (int64_t g = 0; g < kGroups; ++g)
            for (int64_t e = 0; e < 4; ++e)
              dst[g * kQ8Panel * 4 + e] =
                  r < m ? static_cast<uint8_t>(q[r * ldq + b * kQ8Block + g * 4 + e] ^ 0x80) : 0x80;
        }
      }
      if (r < m) std::copy_n(q + r * ldq + kp, tail_k, ot + r * tail_k);
    }
  };
  if (m * k >= (1 << 18)) return parallel_for(out.panels, pack_panel);
  for (int64_t p = 0; p < out.panels; ++p) pack_panel(p);
}

void quantize_q8_rows(const float* x, int64_t m, int64_t k, Q8Rows& out, Q8Layout layout) {
  thread_local std::vector<float> s;
  thread_local std::vector<int8_t> q;
  quantize_blocks(x, m, k, s, q);
  pack_s8_rows(q.data(), m, k, k, out, layout);
  // The scales beside the values: per panel and block, its 16 rows' (0 past m).
  const int64_t nb = k / kQ8Block;
  out.s.resize(static_cast<size_t>(out.panels * nb * kQ8Panel));
  for (int64_t p = 0; p < out.panels; ++p)
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t lane = 0; lane < kQ8Panel; ++lane) {
        const int64_t r = p * kQ8Panel + lane;
        out.s[(p * nb + b) * kQ8Panel + lane] = r < m ? s[r * nb + b] : 0.f;
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
  over_columns(n, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t r = 0; r < x.m; ++r) {
      const int64_t p = r / kQ8Panel, lane = r % kQ8Panel;
      for (int64_t j = j0; j < j1; ++j) {
        float acc = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* xb = x.q.data() + (p * nb + b) * kQ8PanelBlockBytes + lane * 4;
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

void add_s8_tail(const Q8Rows& x, const int8_t* q, int64_t j0, int64_t j1, int32_t* y,
                 int64_t ldy) {
  if (x.tail_k == 0) return;
  const int64_t ldw = x.k + x.tail_k;
  for (int64_t r = 0; r < x.m; ++r)
    for (int64_t j = j0; j < j1; ++j) {
      int32_t sum = 0;
      for (int64_t i = 0; i < x.tail_k; ++i)
        sum += int32_t{x.tail[r * x.tail_k + i]} * q[j * ldw + x.k + i];
      y[r * ldy + j] += sum;
    }
}

#if SEQPAR_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#if defined(__clang__)
#pragma clang attribute push(                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
    apply_to = function)
#endif
// AVX512-VNNI: vpdpbusd on the bytes as packed (q + 128) times the weights.
namespace avx512_vnni {
using VI = __m512i;
using VF = __m512;
using XV = __m512i;
using WB = __m512i;
constexpr int kLanes = 16;
// 6 weight rows times 2 vectors of 16 rows: 24 accumulators of 32 vector registers. One thread, m
// 256 by a 8192 x 2048 weight (bench/linear_bench --dtype int8 --activations int8, a Zen 4 core):
// 319 G operations/s, where 3 panels x 4 rows gave 303 and 1 x 12 312 (docs/performance.md section
// 19).
constexpr int kTileVecs = 2, kTileCols = 6;
constexpr bool kOffset = true;
inline XV xload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline WB wprep(int32_t four) { return _mm512_set1_epi32(four); }
inline VI dot(VI sum, XV x, WB w) { return _mm512_dpbusd_epi32(sum, x, w); }
inline VI vizero() { return _mm512_setzero_si512(); }
inline VI viset1(int32_t a) { return _mm512_set1_epi32(a); }
inline VF vfzero() { return _mm512_setzero_ps(); }
inline VF vfload(const float* p) { return _mm512_loadu_ps(p); }
inline VF vfset1(float a) { return _mm512_set1_ps(a); }
inline VF vfmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF vfadd(VF a, VF b) { return _mm512_add_ps(a, b); }
inline VF vfmadd(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF vfcvt(VI a) { return _mm512_cvtepi32_ps(a); }
inline void vfstore(float* p, VF v) { _mm512_store_ps(p, v); }
inline void vistore(int32_t* p, VI v) { _mm512_store_si512(p, v); }
#include "gemm_q8_body.inc"
}  // namespace avx512_vnni
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options

// The two 256-bit variants' vectors. Their tile: 2 vectors of 8 rows by 4 weight rows. One
// thread, m 256 by a 8192 x 2048 weight (bench/gemv_bench --dtype int8 --activations int8, an
// Intel Xeon with AVX-VNNI): AVX-VNNI 258 G operations/s and AVX2 105, where 2 x 3 gave 222 and
// 105, 1 x 6 230 and 100, 3 x 2 207 and 102, 4 x 2 215 and 92.
#define SEQPAR_Q8_YMM                                                     \
  using VI = __m256i;                                                     \
  using VF = __m256;                                                      \
  constexpr int kLanes = 8;                                               \
  inline VI vizero() { return _mm256_setzero_si256(); }                   \
  inline VI viset1(int32_t a) { return _mm256_set1_epi32(a); }            \
  inline VF vfzero() { return _mm256_setzero_ps(); }                      \
  inline VF vfload(const float* p) { return _mm256_loadu_ps(p); }         \
  inline VF vfset1(float a) { return _mm256_set1_ps(a); }                 \
  inline VF vfmul(VF a, VF b) { return _mm256_mul_ps(a, b); }             \
  inline VF vfadd(VF a, VF b) { return _mm256_add_ps(a, b); }             \
  inline VF vfmadd(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); } \
  inline VF vfcvt(VI a) { return _mm256_cvtepi32_ps(a); }                 \
  inline void vfstore(float* p, VF v) { _mm256_store_ps(p, v); }          \
  inline void vistore(int32_t* p, VI v) { _mm256_store_si256(reinterpret_cast<VI*>(p), v); }

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#endif
// AVX-VNNI: the same on 8 lanes (16 vector registers).
namespace avx_vnni {
SEQPAR_Q8_YMM
using XV = __m256i;
using WB = __m256i;
constexpr int kTileVecs = 2, kTileCols = 4;
constexpr bool kOffset = true;
inline XV xload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const XV*>(p)); }
inline WB wprep(int32_t four) { return _mm256_set1_epi32(four); }
inline VI dot(VI sum, XV x, WB w) { return _mm256_dpbusd_avx_epi32(sum, x, w); }
#include "gemm_q8_body.inc"
}  // namespace avx_vnni
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#endif
// AVX2: vpmaddubsw multiplies unsigned by signed bytes and adds pairs in int16, with saturation:
// the activations' bytes as stored (up to 255) would overflow it. So the weight's magnitude is the
// unsigned side and the activation takes the weight's sign (vpsignb): |w| · (±q_x) <= 128 · 127,
// a pair <= 32512 < 2^15, exact for every int8 weight (-128 too) and activation (|q_x| <= 127);
// vpmaddwd by 1 adds the pairs into int32.
namespace avx2 {
SEQPAR_Q8_YMM
using XV = __m256i;  // the activations as signed bytes
struct WB {
  __m256i mag, sign;  // |w| (unsigned), w
};
constexpr int kTileVecs = 2, kTileCols = 4;
constexpr bool kOffset = false;
inline XV xload(const uint8_t* p) {
  return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const XV*>(p)),
                          _mm256_set1_epi8(static_cast<char>(0x80)));
}
inline WB wprep(int32_t four) {
  const __m256i w = _mm256_set1_epi32(four);
  return {_mm256_abs_epi8(w), w};
}
inline VI dot(VI sum, XV x, const WB& w) {
  const __m256i pairs = _mm256_maddubs_epi16(w.mag, _mm256_sign_epi8(x, w.sign));
  return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#include "gemm_q8_body.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#undef SEQPAR_Q8_YMM
#endif  // SEQPAR_X86_SIMD

std::vector<GemmQ8Variant> gemm_q8_variants() {
  std::vector<GemmQ8Variant> v;
#if SEQPAR_X86_SIMD
  if (cpu_has(Isa::kAvx512) && amx_int8_usable())
    v.push_back({"amx-int8", Isa::kAvx512, &gemm_q8_amx, &sums_s8_amx, false, Q8Layout::kTiles,
                 kAmxMinRows});
  if (cpu_has(Isa::kAvx512) && __builtin_cpu_supports("avx512vnni"))
    v.push_back({"avx512-vnni", Isa::kAvx512, &avx512_vnni::gemm, &avx512_vnni::sums, false});
  if (cpu_has_avx_vnni())
    v.push_back({"avx-vnni", Isa::kAvx2, &avx_vnni::gemm, &avx_vnni::sums, true});
  if (cpu_has(Isa::kAvx2)) v.push_back({"avx2", Isa::kAvx2, &avx2::gemm, &avx2::sums, false});
#endif
  return v;
}

const GemmQ8Variant* gemm_q8(int64_t m) {
  static const std::vector<GemmQ8Variant> allowed = [] {
    std::vector<GemmQ8Variant> v;
    const bool capped = kernel_isa() < best_isa();
    for (const GemmQ8Variant& g : gemm_q8_variants())
      if (g.isa <= kernel_isa() && !(g.extension && capped)) v.push_back(g);
    return v;
  }();
  for (const GemmQ8Variant& v : allowed)
    if (m >= v.min_rows) return &v;
  return nullptr;
}

const char* gemm_q8_path() {
  static const std::string path = [] {
    const GemmQ8Variant* wide = gemm_q8();
    if (!wide) return std::string("fp32 of the quantized values");
    const GemmQ8Variant* few = gemm_q8(wide->min_rows - 1);
    if (wide->min_rows == 0 || few == wide) return std::string(wide->name);
    return std::string(wide->name) + " from " + std::to_string(wide->min_rows) + " rows, else " +
           (few ? few->name : "fp32 of the quantized values");
  }();
  return path.c_str();
}

}  // namespace seqpar::model_simd
