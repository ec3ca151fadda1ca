#include "seqpar/model/ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <dnnl.hpp>
#include <exception>
#include <limits>
#include <unordered_map>
#include <vector>

#include "gemm_packed.h"
#include "gemm_q8.h"
#include "seqpar/core/error.h"
#include "seqpar/core/team.h"
#include "simd_ops.h"

namespace seqpar {

namespace {

// The operands' types: all fp32; x and w bf16 (fp32 accumulation and y); x and w int8 with int32
// y (exact sums, no bias).
enum class MatmulTypes { kF32, kBF16, kS8 };

struct MatmulKey {
  int64_t m, n, k;
  bool bias;
  MatmulTypes types;
  int64_t ldc;  // the row stride of y (n, or wider when y is a column block of a wider matrix)
  int threads;  // oneDNN's team when the primitive was made (1 inside a parallel region)
  bool operator==(const MatmulKey&) const = default;
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& s) const {
    return std::hash<int64_t>()(s.m) * 1000003u ^ std::hash<int64_t>()(s.n) * 10007u ^
           std::hash<int64_t>()(s.k) * 31u ^ std::hash<int64_t>()(s.ldc) * 7u ^
           static_cast<size_t>(s.bias) ^ static_cast<size_t>(s.types) << 1 ^
           static_cast<size_t>(s.threads) << 20;
  }
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// y (m, n) = x (m, k) · wᵀ (w is (n, k) row-major, i.e. B (k, n) with strides {1, k}) + bias.
// Throws dnnl::error where the CPU has no such matmul (bf16 below AVX-512).
dnnl::memory::data_type input_type(MatmulTypes t) {
  using dt = dnnl::memory::data_type;
  return t == MatmulTypes::kBF16 ? dt::bf16 : t == MatmulTypes::kS8 ? dt::s8 : dt::f32;
}
dnnl::memory::data_type output_type(MatmulTypes t) {
  using dt = dnnl::memory::data_type;
  return t == MatmulTypes::kS8 ? dt::s32 : dt::f32;
}

dnnl::matmul::primitive_desc matmul_pd(const MatmulKey& key) {
  using dt = dnnl::memory::data_type;
  const dt in = input_type(key.types);
  dnnl::memory::desc a({key.m, key.k}, in, dnnl::memory::dims{key.k, 1});
  dnnl::memory::desc b({key.k, key.n}, in, dnnl::memory::dims{1, key.k});
  dnnl::memory::desc c({key.m, key.n}, output_type(key.types), dnnl::memory::dims{key.ldc, 1});
  if (key.bias) {
    dnnl::memory::desc bias({1, key.n}, dt::f32, dnnl::memory::dims{key.n, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), engine());
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine());
}

dnnl::matmul& matmul_for(const MatmulKey& key) {
  thread_local std::unordered_map<MatmulKey, dnnl::matmul, MatmulKeyHash> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache.emplace(key, dnnl::matmul(matmul_pd(key))).first->second;
}

int64_t rows_of(const Tensor& x) { return x.numel() / x.dim(-1); }

}  // namespace

namespace {

// A block of columns of y (ldc > n) is computed into rows of its own and copied out, where those
// rows hold at most this many bytes (kS8: int32 sums). oneDNN writing the block into y's rows
// directly, at their stride (a power of two, 2048 or 8192 floats), ran slower: a 256-token prefill
// of Llama-3.2-1B's shape, 1 rank x 2 threads on an Intel Xeon with AMX, 470 -> 750-790 tokens/s
// with per-channel int8 weights and int8 activations, 390-425 -> 460-500 with bf16 activations,
// 118-133 -> 143 with fp32 ones; its first strided fp32 call in a process also generated code for
// about 22 ms. Larger buffers cost more in the copy than they save (fp32, 2048 rows, 16 MiB: 158
// -> 143 GFLOP/s on one thread), except for the int8 products.
constexpr int64_t kBlockOutBytes = int64_t{2} << 20;
constexpr int64_t kBlockOutBytesS8 = int64_t{16} << 20;

// y[:, j0 : j0+n) (row stride ldc) = x (m, k) · w (n, k)ᵀ + bias (n, or null); bias fp32; x and w
// fp32, bf16 (uint16_t) or int8 as `types` says, y fp32 (int32 for int8, bias null).
void matmul(const void* x, int64_t m, int64_t k, const void* w, int64_t n, const float* bias,
            void* y, int64_t ldc, MatmulTypes types) {
  static_assert(sizeof(float) == sizeof(int32_t));
  if (ldc != n && 4 * m * n <= (types == MatmulTypes::kS8 ? kBlockOutBytesS8 : kBlockOutBytes)) {
    thread_local std::vector<float> block;  // fp32 or int32 outputs, 4 bytes each
    block.resize(static_cast<size_t>(m * n));
    matmul(x, m, k, w, n, bias, block.data(), n, types);
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(static_cast<std::byte*>(y) + 4 * r * ldc, block.data() + r * n,
                  static_cast<size_t>(4 * n));
    return;
  }
  const int threads = parallel_threads();
  dnnl::matmul& mm = matmul_for({m, n, k, bias != nullptr, types, ldc, threads});
  using dt = dnnl::memory::data_type;
  const dt in = input_type(types);
  dnnl::memory am({{m, k}, in, dnnl::memory::dims{k, 1}}, engine(), const_cast<void*>(x));
  dnnl::memory bm({{k, n}, in, dnnl::memory::dims{1, k}}, engine(), const_cast<void*>(w));
  dnnl::memory cm({{m, n}, output_type(types), dnnl::memory::dims{ldc, 1}}, engine(), y);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias != nullptr)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory({{1, n}, dt::f32, dnnl::memory::dims{n, 1}}, engine(),
                                             const_cast<float*>(bias)));
  dnnl::stream s(engine());
  mm.execute(s, args);
  s.wait();
}

// Where the packed product has no variant (gemm_packed()): rows of a bf16/fp16 weight converted
// per block, as bytes of fp32 a block: as many as x holds
// (m·k·4), between 2 and 64 MiB, so that each block's matmul reads about as much of the block as
// of x, and the block is still in cache when the matmul reads it. Few rows of x (a prefill chunk,
// 16..64 rows): 2 MiB; smaller blocks pay oneDNN's fixed cost per call (from 16 rows of x its jit
// sgemm packs and allocates per call): linear() of 16..64 rows by a 8192 x 2048 bf16 weight took
// 2-2.7x longer with 512 KiB blocks than with 2 MiB, and 8 MiB was no faster (2 threads, AMD EPYC
// with AVX-512). Many rows (a DiT's tokens): one wide GEMM instead of hundreds of 32-column ones,
// up to a whole weight of 16M parameters; a Qwen-Image block (4608 tokens, bf16) took 10.2 s with
// 512 KiB blocks, 7.9 s with 64 MiB, 7.7 s with the weights stored in fp32 (bench/mmdit_step.sh).
// Between them, one thread, 256 rows by a 8192 x 2048 bf16 weight (bench/linear_bench, an Intel
// Xeon, oneDNN capped at AVX2): 70 GFLOP/s with one block of 64 MiB, 92 with 4 MiB.
constexpr int64_t kConvertedBlockBytesMin = int64_t{2} << 20;
constexpr int64_t kConvertedBlockBytesMax = int64_t{64} << 20;
int64_t converted_block_bytes(int64_t m, int64_t k) {
  return std::clamp<int64_t>(4 * m * k, kConvertedBlockBytesMin, kConvertedBlockBytesMax);
}
// oneDNN's int8 matmul reads an int8 weight as stored, with no block to keep in cache: from
// kManyRows rows of x its blocks are as large as the team allows (one thread, 256 rows by a
// 8192 x 2048 weight on AMX: 1421 G operations/s with one call, 618 with blocks of 256 rows).
constexpr int64_t kManyRows = 256;
int64_t int8_matmul_block_bytes(int64_t m) {
  return m >= kManyRows ? kConvertedBlockBytesMax : kConvertedBlockBytesMin;
}
// Up to this many rows of x the decode kernels multiply the weights as stored, in groups of
// model_simd::kRowGroup rows (linear()); more go to oneDNN. One thread, a 8192 x 2048 weight
// (bench/linear_bench, an Intel Xeon with AVX-512): bf16 and per-channel int8 at 82-103 GFLOP/s
// from 9 to 64 rows, where oneDNN on converted blocks ran at 24-96; Q8_0 (its per-block scales)
// at 54-61, level with oneDNN at 32 rows and behind it at 64.
constexpr int64_t kFewRows = 64;
constexpr int64_t kFewRowsQ8 = 32;
// With int8 activations oneDNN's int8 matmul overtakes the decode product on x̂ from 5 rows (one
// thread, a 8192 x 2048 per-channel weight, the same machine): 4 rows 1.40 ms against 1.93, 8
// rows 2.94 against 2.15, 9 rows 3.3 against 2.28, 64 rows 11.0 against 5.55.
constexpr int64_t kFewRowsInt8Activations = 4;
// With Q8_0 weights the product of gemm_q8.h overtakes the Q8_0 decode product on x̂ from
// kFewRowsQ8Int8Activations + 1 rows.
constexpr int64_t kFewRowsQ8Int8Activations = 5;

}  // namespace

namespace {

// Runs fn(j0, nb) over blocks of nb rows of a weight (n, k), about block_bytes / (4·k) rows a
// block (at least 16, a multiple of 16): on the rank's team (core/team.h) the blocks are handed
// out one at a time, each converted (where the weight needs it) and multiplied by one thread
// alone (oneDNN runs single-threaded inside the team): the conversions run in parallel too, and a
// descheduled thread's blocks go to the others instead of every thread waiting for it at each
// block's barrier. The first exception is rethrown once the blocks are done.
template <typename Fn>
void over_weight_blocks(int64_t block_bytes, int64_t k, int64_t n, Fn&& fn) {
  const int team = loop_threads();
  int64_t block = std::clamp<int64_t>(block_bytes / (4 * k) / 16 * 16, 16, n);
  if (team > 1)
    block = std::min(block, std::max<int64_t>(16, (n + 4 * team - 1) / (4 * team) / 16 * 16));
  const int64_t blocks = (n + block - 1) / block;
  parallel_for(blocks, [&](int64_t i) { fn(i * block, std::min(block, n - i * block)); });
}

// Row j of a weight w (n, k) as fp32 into row (k); InvalidArgument naming `name`, the value and
// its place where it is not finite.
void finite_row(const Tensor& w, int64_t j, const std::string& name, std::vector<float>& row) {
  const int64_t k = w.dim(1);
  convert(static_cast<const std::byte*>(w.raw()) + j * k * dtype_size(w.dtype()), w.dtype(),
          row.data(), DType::kF32, static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    if (!std::isfinite(row[i]))
      throw InvalidArgument(detail::concat("int8 weights: ", name, " holds ", row[i], " at row ", j,
                                           ", column ", i, "; valid: finite weights"));
}

// The rows of a weight w (n, k) as fp32, a block of rows at a time on the calling thread's team
// (over_weight_blocks), handed to quantize(j0, nb, rows, amax) with each row's max |w|. A weight
// holding a NaN or an Inf is refused (finite_row's error) for its first such row, whichever
// thread met it.
template <typename Fn>
void over_weight_rows(const Tensor& w, const std::string& name, Fn&& quantize) {
  const int64_t n = w.dim(0), k = w.dim(1);
  const size_t esize = dtype_size(w.dtype());
  std::atomic<int64_t> first_bad{n};
  over_weight_blocks(converted_block_bytes(1, k), k, n, [&](int64_t j0, int64_t nb) {
    thread_local std::vector<float> rows, amax;
    rows.resize(static_cast<size_t>(nb * k));
    amax.resize(static_cast<size_t>(nb));
    convert(static_cast<const std::byte*>(w.raw()) + j0 * k * esize, w.dtype(), rows.data(),
            DType::kF32, static_cast<size_t>(nb * k));
    model_simd::kernels().row_abs_max(rows.data(), nb, k, amax.data());  // +Inf: not finite
    for (int64_t j = 0; j < nb; ++j)
      if (!(amax[j] <= std::numeric_limits<float>::max())) {
        int64_t seen = first_bad.load();
        while (j0 + j < seen && !first_bad.compare_exchange_weak(seen, j0 + j)) {
        }
        return;
      }
    quantize(j0, nb, rows.data(), amax.data());
  });
  if (first_bad.load() < n) {
    std::vector<float> row(static_cast<size_t>(k));
    finite_row(w, first_bad.load(), name, row);  // throws
  }
}

}  // namespace

Q8Weight quantize_q8_0(const Tensor& w, const std::string& name) {
  SEQPAR_CHECK(w.ndim() == 2, "int8 weights: ", name, " is ", w.shape_str(), ", not a matrix");
  const int64_t n = w.dim(0), k = w.dim(1);
  if (k % model_simd::kQ8Block != 0) {
    throw InvalidArgument(detail::concat("int8 weights: ", name, " has ", k, " inputs, not a ",
                                         "multiple of the block of ", model_simd::kQ8Block));
  }
  Q8Weight out{Tensor::uninitialized({n, k}, DType::kI8),
               Tensor::uninitialized({n, k / model_simd::kQ8Block}, DType::kF16)};
  over_weight_rows(w, name, [&](int64_t j0, int64_t nb, const float* rows, const float*) {
    model_simd::kernels().quantize_q8(rows, nb, k, out.q.data<int8_t>() + j0 * k,
                                      out.d.data<uint16_t>() + j0 * (k / model_simd::kQ8Block));
  });
  return out;
}

void dequantize_q8_0(const Tensor& q, const Tensor& d, int64_t row0, int64_t rows, float* out) {
  SEQPAR_CHECK(q.dtype() == DType::kI8 && d.dtype() == DType::kF16 && q.ndim() == 2,
               "dequantize_q8_0: ", q.shape_str(), " ", dtype_name(q.dtype()), " with scales ",
               d.shape_str(), " ", dtype_name(d.dtype()));
  const int64_t k = q.dim(1), blocks = k / model_simd::kQ8Block;
  SEQPAR_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= q.dim(0), "dequantize_q8_0: rows [", row0,
               ", ", row0 + rows, ") of ", q.dim(0));
  model_simd::kernels().dequant_q8(q.data<int8_t>() + row0 * k, d.data<uint16_t>() + row0 * blocks,
                                   rows, k, out);
}

Int8ChannelWeight quantize_int8_channel(const Tensor& w, const std::string& name,
                                        const Tensor& row_abs_max) {
  SEQPAR_CHECK(w.ndim() == 2, "int8 weights: ", name, " is ", w.shape_str(), ", not a matrix");
  const int64_t n = w.dim(0), k = w.dim(1);
  SEQPAR_CHECK(
      row_abs_max.empty() || (row_abs_max.dtype() == DType::kF32 && row_abs_max.numel() == n),
      "int8 weights: ", name, " has ", n, " rows, its row maxima are ", row_abs_max.shape_str());
  Int8ChannelWeight out{Tensor::uninitialized({n, k}, DType::kI8), Tensor::uninitialized({n})};
  over_weight_rows(w, name, [&](int64_t j0, int64_t nb, const float* rows, const float* amax) {
    float* s = out.s.data<float>() + j0;
    for (int64_t j = 0; j < nb; ++j) {
      float a = amax[j];
      if (!row_abs_max.empty()) {
        const float given = row_abs_max.data<float>()[j0 + j];
        SEQPAR_CHECK(given >= a, "int8 weights: ", name, " row ", j0 + j, " holds ", a,
                     ", above its row maximum ", given);
        a = given;
      }
      s[j] = a / 127.f;
    }
    model_simd::kernels().quantize_rows_s8(rows, nb, k, s, model_simd::Ties::kAway,
                                           out.q.data<int8_t>() + j0 * k);
  });
  return out;
}

void dequantize_int8_channel(const Tensor& q, const Tensor& s, int64_t row0, int64_t rows,
                             float* out) {
  SEQPAR_CHECK(
      q.dtype() == DType::kI8 && s.dtype() == DType::kF32 && q.ndim() == 2 && s.numel() == q.dim(0),
      "dequantize_int8_channel: ", q.shape_str(), " ", dtype_name(q.dtype()), " with scales ",
      s.shape_str(), " ", dtype_name(s.dtype()));
  const int64_t k = q.dim(1);
  SEQPAR_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= q.dim(0), "dequantize_int8_channel: rows [",
               row0, ", ", row0 + rows, ") of ", q.dim(0));
  model_simd::kernels().dequant_i8_channel(q.data<int8_t>() + row0 * k, s.data<float>() + row0,
                                           rows, k, out);
}

void dequantize_int8(const Tensor& q, const Tensor& scale, int64_t row0, int64_t rows, float* out) {
  if (scale.dtype() == DType::kF32) return dequantize_int8_channel(q, scale, row0, rows, out);
  dequantize_q8_0(q, scale, row0, rows, out);
}

namespace {

// Does oneDNN multiply bf16 by bf16 in hardware here (AVX512-BF16 or AMX)? Elsewhere it would
// emulate, slower than the fp32 path.
bool native_bf16_matmul() {
  static const bool native = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return native;
}

}  // namespace

std::string_view bf16_activations_path() {
  return native_bf16_matmul() ? "onednn bf16" : "fp32 of the rounded values";
}

Tensor row_abs_max(const Tensor& x) {
  SEQPAR_CHECK(x.dtype() == DType::kF32 && x.ndim() >= 1, "row_abs_max: x is ", x.shape_str(), " ",
               dtype_name(x.dtype()), "; valid: fp32 rows");
  Tensor a = Tensor::uninitialized({rows_of(x)});
  model_simd::kernels().row_abs_max(x.data<float>(), rows_of(x), x.dim(-1), a.data<float>());
  return a;
}

namespace {

// The most inputs an int8 x int8 sum may have: |sum| <= k · 127² stays below 2^31.
constexpr int64_t kMaxInt8Inputs = (int64_t{1} << 31) / (127 * 127);

// int8 activations (linear() in ops.h): each row of x (m, k) as int8 values q and a scale s,
// and the row maxima they came from (x_row_max, or this x's own).
struct QuantizedRows {
  Tensor amax, q, s;
};
QuantizedRows quantize_rows(const float* x, int64_t m, int64_t k, const Tensor& x_row_max) {
  SEQPAR_CHECK(x_row_max.empty() || x_row_max.numel() == m, "linear: ", x_row_max.numel(),
               " row maxima for ", m, " rows");
  const model_simd::Kernels& kern = model_simd::kernels();
  QuantizedRows r{Tensor::uninitialized({m}), Tensor::uninitialized({m, k}, DType::kI8),
                  Tensor::uninitialized({m})};
  if (x_row_max.empty())
    kern.row_abs_max(x, m, k, r.amax.data<float>());
  else
    std::copy_n(x_row_max.data<float>(), m, r.amax.data<float>());
  for (int64_t i = 0; i < m; ++i) r.s.data<float>()[i] = r.amax.data<float>()[i] / 127.f;
  kern.quantize_rows_s8(x, m, k, r.s.data<float>(), model_simd::Ties::kEven, r.q.data<int8_t>());
  return r;
}

// Whether oneDNN's int8 matmul sums exactly on this CPU. With VNNI (vpdpbusd) every product of a
// u8 (oneDNN shifts s8 inputs by 128) and an s8 goes into an int32 sum; without it oneDNN adds
// pairs of products in int16 (vpmaddubsw), which saturates (255·127·2 > 32767): measured here
// with ONEDNN_MAX_CPU_ISA=AVX2, errors of 1.8 where the bound is 2e-6. Checked by the ISA and by
// a product that saturates in int16: 64 products of 127·127 per output, exact ±1032256.
bool exact_int8_matmul() {
  static const bool exact = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    if (isa != dnnl::cpu_isa::avx512_core_vnni && isa != dnnl::cpu_isa::avx512_core_bf16 &&
        isa != dnnl::cpu_isa::avx512_core_amx && isa != dnnl::cpu_isa::avx2_vnni)
      return false;
    constexpr int64_t m = 8, n = 16, k = 64;
    std::vector<int8_t> q(m * k, 127), w(n * k);
    for (int64_t i = 0; i < n * k; ++i) w[i] = (i / k) % 2 ? 127 : -127;
    std::vector<int32_t> acc(m * n);
    try {
      matmul(q.data(), m, k, w.data(), n, nullptr, acc.data(), n, MatmulTypes::kS8);
    } catch (const dnnl::error&) {
      return false;
    }
    for (int64_t i = 0; i < m * n; ++i)
      if (acc[i] != ((i % n) % 2 ? 1 : -1) * k * 127 * 127) return false;
    return true;
  }();
  return exact;
}

// y = s_x·s_w·(q_x · q_wᵀ) + b from 5 rows: the sums in int32 by oneDNN where
// exact_int8_matmul() (each block of the weight's rows on one thread of the team), else by
// gemm_q8.h's vector variant (the same sums, so the same bits), then one vector pass.
void linear_int8_matmul(const QuantizedRows& xq, int64_t m, int64_t k, const Tensor& w,
                        const Tensor& w_scale, const float* b, Tensor& y) {
  const int64_t n = w.dim(0);
  const float* s = xq.s.data<float>();
  float* yd = y.data<float>();
  // The int32 sums land in y's own storage (4 bytes each), then become floats in place.
  if (exact_int8_matmul()) {
    over_weight_blocks(int8_matmul_block_bytes(m), k, n, [&](int64_t j0, int64_t nb) {
      matmul(xq.q.raw(), m, k, w.data<int8_t>() + j0 * k, nb, nullptr, yd + j0, n,
             MatmulTypes::kS8);
      model_simd::kernels().scale_int32_rows(yd + j0, m, nb, n, s, w_scale.data<float>() + j0,
                                             b ? b + j0 : nullptr);
    });
  } else {
    thread_local model_simd::Q8Rows packed;
    const model_simd::GemmQ8Variant* gemm = model_simd::gemm_q8(m);
    model_simd::pack_s8_rows(xq.q.data<int8_t>(), m, k, k, packed, gemm->layout);
    gemm->sums(packed, w.data<int8_t>(), n, reinterpret_cast<int32_t*>(yd), n);
    model_simd::over_columns(n, 16, [&](int64_t j0, int64_t j1) {
      model_simd::kernels().scale_int32_rows(yd + j0, m, j1 - j0, n, s, w_scale.data<float>() + j0,
                                             b ? b + j0 : nullptr);
    });
  }
  // A row holding a NaN or an Inf has no scale: its outputs are NaN, as the fp32 product gives.
  for (int64_t r = 0; r < m; ++r)
    if (!std::isfinite(xq.amax.data<float>()[r]))
      std::fill_n(yd + r * n, n, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

std::string_view int8_activations_path() {
  static const std::string path =
      exact_int8_matmul()
          ? "onednn s8 " +
                std::string(
                    matmul_pd({256, 256, 256, false, MatmulTypes::kS8, 256, 1}).impl_info_str())
      : model_simd::gemm_q8() ? std::string("int32 sums ") + model_simd::gemm_q8_path()
                              : std::string("fp32 of the quantized values");
  return path;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& w_scale,
              DType activations, const Tensor& x_row_max) {
  SEQPAR_CHECK(x.dtype() == DType::kF32, "linear: x is ", dtype_name(x.dtype()), ", not fp32");
  SEQPAR_CHECK(
      activations == DType::kF32 || activations == DType::kBF16 || activations == DType::kI8,
      "linear: activations ", dtype_name(activations), " are not fp32, bf16 or int8");
  SEQPAR_CHECK(w.ndim() == 2 && x.dim(-1) == w.dim(1), "linear: x ", x.shape_str(), " vs w ",
               w.shape_str());
  SEQPAR_CHECK(bias.empty() || bias.dtype() == DType::kF32, "linear: the bias is not fp32");
  const bool int8 = w.dtype() == DType::kI8;
  SEQPAR_CHECK(int8 == !w_scale.empty(), "linear: scales go with int8 weights only");
  // Q8_0: fp16 scales (out, in / 32); per-channel: fp32 scales (out).
  const bool q8 = int8 && w_scale.dtype() == DType::kF16;
  const bool channel = int8 && !q8;
  SEQPAR_CHECK(
      !q8 || (w.dim(1) % model_simd::kQ8Block == 0 && w_scale.ndim() == 2 &&
              w_scale.dim(0) == w.dim(0) && w_scale.dim(1) == w.dim(1) / model_simd::kQ8Block),
      "linear: Q8_0 scales ", w_scale.shape_str(), " for int8 weights ", w.shape_str());
  SEQPAR_CHECK(!channel || (w_scale.dtype() == DType::kF32 && w_scale.ndim() == 1 &&
                            w_scale.dim(0) == w.dim(0)),
               "linear: per-channel scales ", w_scale.shape_str(), " ", dtype_name(w_scale.dtype()),
               " for int8 weights ", w.shape_str());
  const int64_t m = rows_of(x), k = w.dim(1), n = w.dim(0);
  std::vector<int64_t> shape = x.shape();
  shape.back() = n;
  Tensor y = Tensor::uninitialized(shape);  // every path below writes all of it
  if (m == 0 || n == 0) return y;
  const bool has_bias = !bias.empty();
  SEQPAR_CHECK(!has_bias || bias.numel() == n, "linear: bias ", bias.shape_str(), " for ", n,
               " outputs");
  if (k == 0) {  // no inputs: y = bias, or zeros
    for (int64_t r = 0; r < m; ++r) {
      if (has_bias)
        std::memcpy(y.data<float>() + r * n, bias.data<float>(), n * sizeof(float));
      else
        std::fill_n(y.data<float>() + r * n, n, 0.f);
    }
    return y;
  }
  const float* b = has_bias ? bias.data<float>() : nullptr;
  // bf16 activations: x rounded to bf16 (to nearest even) before the product, as llama.cpp
  // multiplies a BF16 weight. With a bf16 weight each product is exact in fp32 and the sums are
  // fp32: oneDNN's bf16 matmul where the CPU has it (the weight read as stored, no conversion),
  // else the fp32 paths below on the rounded values.
  // Per-channel int8 weights take the same matmul, each block of rows widened to bf16 (exactly:
  // an 8-bit integer is a bf16 value), then y = s·(x·qᵀ) + b, the order of gemv_i8_channel (the
  // sum, one multiply by s, the bias): every product exact, so each output is within
  // gamma_(k+1) · (s·Σ|x_r·q| + |b|) of the exact value on the rounded x.
  // (Tensors, not vectors: their storage is reused from call to call, core/block_cache.h.)
  const float* xs = x.data<float>();
  Tensor xb, rounded;
  bool channel_bf16 = false;
  // int8 activations: x quantized per row; from 5 rows int32 sums (oneDNN's int8 matmul where it
  // sums exactly, else gemm_q8.h's variant), else the per-channel paths below on
  // x̂ = fl(s_x·q_x) (a NaN row's x̂ is NaN: s is Inf).
  // With Q8_0 weights: x quantized per block of 32; past kFewRowsQ8Int8Activations rows the
  // product of gemm_q8.h where the CPU has AVX2 (SEQPAR_KERNEL_ISA not scalar), else the Q8_0
  // paths below on x̂.
  if (activations == DType::kI8 && q8) {
    const model_simd::GemmQ8Variant* gemm = model_simd::gemm_q8(m);
    if (m > kFewRowsQ8Int8Activations && gemm) {
      thread_local model_simd::Q8Rows xq;
      model_simd::quantize_q8_rows(xs, m, k, xq, gemm->layout);
      gemm->gemm(xq, w.data<int8_t>(), w_scale.data<uint16_t>(), n, b, y.data<float>(), n);
      return y;
    }
    rounded = Tensor::uninitialized({m, k});
    model_simd::dequantize_q8_rows(xs, m, k, rounded.data<float>());
    xs = rounded.data<float>();
  }
  if (activations == DType::kI8 && !q8) {
    SEQPAR_CHECK(channel, "linear: int8 activations with ", dtype_name(w.dtype()),
                 " weights; valid: int8 weights (--weights-dtype int8 or int8-channel)");
    SEQPAR_CHECK(k <= kMaxInt8Inputs, "linear: int8 activations over ", k,
                 " inputs; valid: at most ", kMaxInt8Inputs, " (an int32 sum)");
    const QuantizedRows xq = quantize_rows(xs, m, k, x_row_max);
    if (m > kFewRowsInt8Activations && (exact_int8_matmul() || model_simd::gemm_q8(m))) {
      linear_int8_matmul(xq, m, k, w, w_scale, b, y);
      return y;
    }
    rounded = Tensor::uninitialized({m, k});
    model_simd::kernels().dequant_i8_channel(xq.q.data<int8_t>(), xq.s.data<float>(), m, k,
                                             rounded.data<float>());
    xs = rounded.data<float>();
  }
  if (activations == DType::kBF16) {
    xb = Tensor::uninitialized({m, k}, DType::kBF16);
    convert(xs, DType::kF32, xb.raw(), DType::kBF16, static_cast<size_t>(m * k));
    const bool bf16_matmul = m > model_simd::kMaxRows && native_bf16_matmul();
    if (w.dtype() == DType::kBF16 && bf16_matmul) {
      matmul(xb.raw(), m, k, w.raw(), n, b, y.data<float>(), n, MatmulTypes::kBF16);
      return y;
    }
    channel_bf16 = channel && bf16_matmul;
    if (!channel_bf16) {
      rounded = xb.to(DType::kF32);
      xs = rounded.data<float>();
    }
  }
  if (w.dtype() == DType::kF32) {
    matmul(xs, m, k, w.data<float>(), n, b, y.data<float>(), n, MatmulTypes::kF32);
    return y;
  }
  // Up to kFewRows rows of x (decode, a short prompt) multiply a 16-bit or int8 weight directly:
  // each weight is read once, as stored, widened in the load, instead of converted to fp32,
  // written and read again; past kMaxRows in groups of model_simd::kRowGroup rows (simd_ops.h).
  // (Per-channel int8 with bf16 activations past kMaxRows: oneDNN's bf16 matmul, below.)
  if (m <= (q8 ? kFewRowsQ8 : kFewRows) && !channel_bf16) {
    const model_simd::Kernels& kern = model_simd::kernels();
    if (q8) {
      kern.gemv_q8(xs, m, k, w.data<int8_t>(), w_scale.data<uint16_t>(), n, b, y.data<float>());
      return y;
    }
    if (channel) {
      kern.gemv_i8_channel(xs, m, k, w.data<int8_t>(), w_scale.data<float>(), n, b,
                           y.data<float>());
      return y;
    }
    (w.dtype() == DType::kBF16 ? kern.gemv_bf16 : kern.gemv_f16)(
        xs, m, k, static_cast<const uint16_t*>(w.raw()), n, b, y.data<float>());
    return y;
  }
  // Past those rows, up to model_simd::packed_max_rows(): the packed product (gemm_packed.h), each
  // weight row made fp32 in its packing step, where the CPU's variant is written.
  if (const model_simd::GemmPacked packed = model_simd::gemm_packed();
      packed && !channel_bf16 && m <= model_simd::packed_max_rows()) {
    using Kind = model_simd::PackedWeight::Kind;
    const Kind kind = q8                          ? Kind::kQ8
                      : channel                   ? Kind::kI8Channel
                      : w.dtype() == DType::kBF16 ? Kind::kBF16
                                                  : Kind::kF16;
    packed(xs, m, {kind, w.raw(), int8 ? w_scale.raw() : nullptr, n, k}, b, y.data<float>(), n);
    return y;
  }
  // Elsewhere (and past those rows) a weight kept in its checkpoint's 16-bit dtype, or int8:
  // converted a block of rows at a time and multiplied (over_weight_blocks).
  const size_t esize = dtype_size(w.dtype());
  const int64_t scales_per_row = q8 ? k / model_simd::kQ8Block : 0;
  over_weight_blocks(converted_block_bytes(m, k), k, n, [&](int64_t j0, int64_t nb) {
    thread_local std::vector<float> converted;
    thread_local std::vector<uint16_t> widened;
    if (channel_bf16) {
      widened.resize(static_cast<size_t>(nb * k));
      model_simd::kernels().widen_i8_bf16(w.data<int8_t>() + j0 * k, nb * k, widened.data());
      float* yb = y.data<float>() + j0;
      matmul(xb.raw(), m, k, widened.data(), nb, nullptr, yb, n, MatmulTypes::kBF16);
      const float* s = w_scale.data<float>() + j0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < nb; ++j) yb[r * n + j] *= s[j];
      if (b)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < nb; ++j) yb[r * n + j] += b[j0 + j];
      return;
    }
    converted.resize(static_cast<size_t>(nb * k));
    if (q8) {
      model_simd::kernels().dequant_q8(w.data<int8_t>() + j0 * k,
                                       w_scale.data<uint16_t>() + j0 * scales_per_row, nb, k,
                                       converted.data());
    } else if (channel) {
      model_simd::kernels().dequant_i8_channel(w.data<int8_t>() + j0 * k,
                                               w_scale.data<float>() + j0, nb, k, converted.data());
    } else {
      convert(static_cast<const std::byte*>(w.raw()) + j0 * k * esize, w.dtype(), converted.data(),
              DType::kF32, static_cast<size_t>(nb * k));
    }
    matmul(xs, m, k, converted.data(), nb, b ? b + j0 : nullptr, y.data<float>() + j0, n,
           MatmulTypes::kF32);
  });
  return y;
}

// The norms and elementwise ops run the kernels of simd_ops.h (the variant kernels() chose), on
// the calling thread's team.

Tensor row_sum_squares(const Tensor& x) {
  const int64_t rows = rows_of(x), f = x.dim(-1);
  Tensor s = Tensor::uninitialized({rows});
  model_simd::kernels().sum_squares(x.data<float>(), rows, f, s.data<float>());
  return s;
}

Tensor rms_norm_with_stats(const Tensor& x, const Tensor& sum_sq, int64_t full_width,
                           const Tensor& weight, float eps) {
  const int64_t rows = rows_of(x), f = x.dim(-1);
  SEQPAR_CHECK(weight.empty() || weight.numel() == f, "rms_norm weight ", weight.shape_str());
  SEQPAR_CHECK(sum_sq.numel() >= rows, "rms_norm: ", sum_sq.numel(), " sums of squares for ", rows,
               " rows");
  Tensor y = Tensor::uninitialized(x.shape());
  model_simd::kernels().rms_norm(x.data<float>(), rows, f, sum_sq.data<float>(), full_width,
                                 weight.empty() ? nullptr : weight.data<float>(), eps,
                                 y.data<float>());
  return y;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  return rms_norm_with_stats(x, row_sum_squares(x), x.dim(-1), weight, eps);
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  const int64_t rows = rows_of(x), f = x.dim(-1);
  SEQPAR_CHECK(weight.empty() || weight.numel() == f, "layer_norm weight ", weight.shape_str());
  SEQPAR_CHECK(bias.empty() || bias.numel() == f, "layer_norm bias ", bias.shape_str());
  Tensor y = Tensor::uninitialized(x.shape());
  model_simd::kernels().layer_norm(
      x.data<float>(), rows, f, weight.empty() ? nullptr : weight.data<float>(),
      bias.empty() ? nullptr : bias.data<float>(), eps, y.data<float>());
  return y;
}

void gelu_tanh_(Tensor& x) { model_simd::kernels().gelu_tanh(x.data<float>(), x.numel()); }

void silu_(Tensor& x) { model_simd::kernels().silu(x.data<float>(), x.numel()); }

void add_(Tensor& x, const Tensor& y) {
  SEQPAR_CHECK(x.numel() == y.numel(), "add_: ", x.shape_str(), " + ", y.shape_str());
  model_simd::kernels().add(x.data<float>(), y.data<float>(), x.numel());
}

namespace {

[[noreturn]] void throw_non_finite(const Tensor& t, const std::string& where) {
  int64_t i = 0;
  while (std::isfinite(t.data<float>()[i])) ++i;
  const int64_t f = t.ndim() > 0 ? std::max<int64_t>(t.dim(-1), 1) : 1;
  throw Error(detail::concat(where, " produced a non-finite value (", t.data<float>()[i],
                             ") at row ", i / f, ", feature ", i % f, " of its ", t.shape_str(),
                             " output; the weights or inputs overflow fp32 there"));
}

// Over the calling thread's team from 2^16 elements (a layer's output in a prefill is millions).
bool all_finite(const Tensor& t) {
  const auto* bits = static_cast<const uint32_t*>(t.raw());
  constexpr uint32_t kExponent = 0x7f800000;  // all set: Inf or NaN
  const int64_t n = t.numel();
  auto any_bad = [&](int64_t i0, int64_t i1) {
    uint32_t bad = 0;
    for (int64_t i = i0; i < i1; ++i)
      bad |= static_cast<uint32_t>((bits[i] & kExponent) == kExponent);
    return bad;
  };
  const int team = n < (int64_t{1} << 16) ? 1 : loop_threads();
  if (team == 1) return !any_bad(0, n);
  std::vector<uint32_t> bad(static_cast<size_t>(team), 0);
  parallel_for(team, [&](int64_t c) { bad[c] = any_bad(n * c / team, n * (c + 1) / team); });
  return std::find(bad.begin(), bad.end(), 1u) == bad.end();
}

}  // namespace

void expect_finite(const Tensor& t, std::string_view op) {
  if (!all_finite(t)) throw_non_finite(t, std::string(op));
}

void expect_finite(const Tensor& t, std::string_view group, int64_t index, std::string_view op) {
  if (!all_finite(t)) throw_non_finite(t, detail::concat(group, ".", index, ".", op));
}

void modulate_(Tensor& x, const float* shift, const float* scale) {
  model_simd::kernels().modulate(x.data<float>(), rows_of(x), x.dim(-1), shift, scale);
}

void gated_add_(Tensor& x, const float* gate, const Tensor& y) {
  SEQPAR_CHECK(x.numel() == y.numel(), "gated_add_ shapes");
  model_simd::kernels().gated_add(x.data<float>(), rows_of(x), x.dim(-1), gate, y.data<float>());
}

Tensor swiglu(const Tensor& a, const Tensor& b) {
  SEQPAR_CHECK(a.shape() == b.shape(), "swiglu shapes");
  Tensor y = Tensor::uninitialized(a.shape());
  model_simd::kernels().swiglu(a.data<float>(), b.data<float>(), a.numel(), y.data<float>());
  return y;
}

Tensor reshape(Tensor t, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  SEQPAR_CHECK(n == t.numel(), "reshape ", t.shape_str(), " to ", n, " elements");
  t.resize(std::move(shape));
  return t;
}

Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end) {
  const int64_t f = x.numel() / std::max<int64_t>(1, x.dim(0));
  std::vector<int64_t> shape = x.shape();
  shape[0] = end - begin;
  Tensor y = Tensor::uninitialized(shape, x.dtype());
  const size_t e = dtype_size(x.dtype());
  std::memcpy(y.raw(), static_cast<const char*>(x.raw()) + begin * f * e, (end - begin) * f * e);
  return y;
}

Tensor slice_cols(const Tensor& x, int64_t begin, int64_t end) {
  const int64_t rows = rows_of(x), f = x.dim(-1), w = end - begin;
  std::vector<int64_t> shape = x.shape();
  shape.back() = w;
  Tensor y = Tensor::uninitialized(shape, x.dtype());
  const size_t e = dtype_size(x.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(y.raw()) + r * w * e,
                static_cast<const char*>(x.raw()) + (r * f + begin) * e, w * e);
  return y;
}

Tensor concat_cols(const Tensor& x, const Tensor& y) {
  const int64_t rows = rows_of(x), a = x.dim(-1), b = y.dim(-1);
  SEQPAR_CHECK(rows == rows_of(y), "concat_cols rows");
  std::vector<int64_t> shape = x.shape();
  shape.back() = a + b;
  Tensor z = Tensor::uninitialized(shape);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(z.data<float>() + r * (a + b), x.data<float>() + r * a, a * sizeof(float));
    std::memcpy(z.data<float>() + r * (a + b) + a, y.data<float>() + r * b, b * sizeof(float));
  }
  return z;
}

Tensor timestep_embedding(float t, int64_t dim, float scale) {
  Tensor e({dim});
  const int64_t half = dim / 2;
  // In fp32 step by step, as diffusers' Timesteps computes it: at t ~ 1000 a double argument
  // would differ from the fp32 one by ~1e-4 rad, which the time MLP carries into the output.
  const float log_period = static_cast<float>(-std::log(10000.0));
  for (int64_t i = 0; i < half; ++i) {
    const float freq = std::exp(log_period * static_cast<float>(i) / static_cast<float>(half));
    const float arg = t * freq * scale;  // (t·freq)·scale, as diffusers rounds it
    e.data<float>()[i] = std::cos(arg);
    e.data<float>()[half + i] = std::sin(arg);
  }
  return e;
}

}  // namespace seqpar
