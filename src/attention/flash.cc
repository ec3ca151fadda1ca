// Blockwise flash attention on the CPU (see docs/kernel.md).
//
// Steps, for one work item = (batch b, kv heads [hk0, hk1), a chunk of query blocks, some of the
// query heads that read each of those kv heads; several kv heads, stacked query heads and
// few-row FMA loops instead of oneDNN only for decode shapes, see docs/kernel.md):
//   0. pack each (query block, head) "tile" of Q into a contiguous (rows, D) buffer; O = 0,
//      running max m = -inf, running sum l = 0 per row.
//   1. for each key block kb (Bk keys), for each kv head hk of the item:
//        classify (query block, kb) from the mask: skip (fully masked: never computed), full,
//        range (each row sees one contiguous run of keys: causal with sorted positions,
//        sorted segments) or general (per-element mask);
//        pack K and V of kb for the item's kv heads once (converted to the matmul dtype) and
//        reuse them for every tile;
//        for each tile that is not skipped:
//          S = Q·Kᵀ                         oneDNN matmul (rows × nk, K = D)
//          mask S, then per row the online softmax update with a stale running max
//          (simd.h: exp2 with scale·log2(e) and the max folded into one FMA), P in place
//          O += P·V                         oneDNN matmul with a sum post-op (rows × D, K = nk)
//        call params.progress() (from the calling thread only).
//   2. out = O / l, lse = (m + log2 l)·ln 2; rows that saw no key stay out = 0, lse = -inf.
// Fixed row maximum (params.row_max, const-max softmax): a row with a finite bound starts with
// m = bound·log2(e) instead of -inf. The row update is unchanged: with m preset it rescales
// only if a block's max exceeds m by more than the stale-max slack (the bound was wrong; the row
// is flagged), so l and O stay relative to the bound and partial sums of such rows over
// different key sets add without rescaling.
// Work items run in an OpenMP loop over the caller's thread count (omp_get_max_threads(); never
// changed here); oneDNN runs single-threaded inside it.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/core/error.h"
#include "seqpar/core/trace.h"
#include "simd.h"

namespace seqpar {

namespace {

namespace simd = attn_simd;
using dnnl::memory;

constexpr int64_t kDefaultBlockQ = 256;
constexpr int64_t kDefaultBlockK = 256;
// At most this many (query block, head) tiles per work item (outside decode shapes): bounds the
// per-thread buffers (two (Bq, D) fp32 buffers per tile) while amortizing the K/V packing.
constexpr int64_t kMaxTilesPerItem = 16;
// At most this many query rows per kv head (Sq · group) make a call K/V-bound (decode).
constexpr int64_t kStreamRows = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kLog2e = 1.44269504088896340736;
constexpr double kLn2 = 0.69314718055994530942;

// A fixed row maximum (natural log) as the kernel's preset running max (log2 units); -inf (the
// online softmax) for a non-finite bound or one whose log2 value is not a finite float.
inline float fixed_max_log2(float row_max) {
  const float m = std::isfinite(row_max) ? static_cast<float>(row_max * kLog2e) : kNegInf;
  return std::isfinite(m) ? m : kNegInf;
}

// ---- oneDNN matmuls, cached per thread ---------------------------------------------------------

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// C (m × n, row stride ldc) = A (m × k, row stride lda) · B (k × n) [+ C]; B's element (kk, nn)
// sits at kk·ldb_k + nn·ldb_n (so a row-major K block is a transposed B for Q·Kᵀ).
struct MatmulShape {
  int64_t m, n, k, lda, ldb_k, ldb_n, ldc;
  memory::data_type ab_type;  // f32 or bf16; C is always f32
  bool accumulate;            // C += A·B (sum post-op)
  bool operator==(const MatmulShape&) const = default;
};

struct MatmulShapeHash {
  size_t operator()(const MatmulShape& s) const {
    size_t h = 0;
    for (int64_t x : {s.m, s.n, s.k, s.lda, s.ldb_k, s.ldb_n, s.ldc,
                      static_cast<int64_t>(s.ab_type), static_cast<int64_t>(s.accumulate)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(x);
    }
    return h;
  }
};

dnnl::matmul::primitive_desc make_matmul_pd(const MatmulShape& s) {
  const memory::desc a_md({s.m, s.k}, s.ab_type, memory::dims{s.lda, 1});
  const memory::desc b_md({s.k, s.n}, s.ab_type, memory::dims{s.ldb_k, s.ldb_n});
  const memory::desc c_md({s.m, s.n}, memory::data_type::f32, memory::dims{s.ldc, 1});
  dnnl::primitive_attr attr;
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.f);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
}

// Primitive creation is slow (JIT); execution of a cached one is cheap. One cache per thread, so
// no locking; bounded so that a process seeing many tail shapes does not grow without limit.
class MatmulCache {
 public:
  void run(const MatmulShape& s, const void* a, const void* b, float* c) {
    auto it = map_.find(s);
    if (it == map_.end()) {
      if (map_.size() >= kCapacity) map_.clear();
      auto pd = make_matmul_pd(s);
      Entry e{dnnl::matmul(pd), memory(pd.src_desc(), cpu_engine(), DNNL_MEMORY_NONE),
              memory(pd.weights_desc(), cpu_engine(), DNNL_MEMORY_NONE),
              memory(pd.dst_desc(), cpu_engine(), DNNL_MEMORY_NONE)};
      it = map_.emplace(s, std::move(e)).first;
    }
    Entry& e = it->second;
    e.a.set_data_handle(const_cast<void*>(a));
    e.b.set_data_handle(const_cast<void*>(b));
    e.c.set_data_handle(c);
    e.prim.execute(stream_, {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}});
  }

 private:
  static constexpr size_t kCapacity = 256;
  struct Entry {
    dnnl::matmul prim;
    memory a, b, c;
  };
  dnnl::stream stream_{cpu_engine()};
  std::unordered_map<MatmulShape, Entry, MatmulShapeHash> map_;
};

MatmulCache& thread_matmul_cache() {
  thread_local MatmulCache cache;
  return cache;
}

// ---- which matmul path bf16 inputs take ---------------------------------------------------------

// oneDNN's cpu_isa values are bit sets: an ISA includes avx512_core_bf16 iff all its bits are set.
bool onednn_has_bf16_isa() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & want) == want;
}

// bf16 inputs use a bf16 matmul (bf16 A/B, fp32 C) only where the CPU has avx512_bf16 or AMX and
// oneDNN can build it; elsewhere the blocks are converted to fp32. SEQPAR_KERNEL_BF16_MATMUL=0
// forces the conversion path.
bool use_bf16_matmul() {
  static const bool use = [] {
    const char* env = std::getenv("SEQPAR_KERNEL_BF16_MATMUL");
    if (env != nullptr && std::string(env) == "0") return false;
    if (!onednn_has_bf16_isa()) return false;
    try {
      make_matmul_pd({256, 256, 128, 128, 1, 128, 256, memory::data_type::bf16, false});
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return use;
}

// Decode shapes (stacked query heads, fp32 blocks) multiply with the register-blocked few-row
// loops of simd.h rather than oneDNN, which repacks K and V on every call; SEQPAR_KERNEL_SMALL_MM=0
// (read on every call, so a benchmark can compare both in one process) uses oneDNN instead.
bool use_small_matmuls() {
  const char* env = std::getenv("SEQPAR_KERNEL_SMALL_MM");
  return env == nullptr || std::string(env) != "0";
}

// ---- the mask, summarized per block ----------------------------------------------------------

enum class BlockKind { kSkip, kFull, kRange, kGeneral };

struct BlockSummary {
  int64_t pos_min, pos_max;
  bool pos_sorted;  // non-decreasing
  int64_t seg_min, seg_max;
  bool seg_sorted;
};

// The first j in [l, h) with pred(j) false, for pred true on a prefix of [l, h).
template <typename Pred>
int64_t partition_point(int64_t l, int64_t h, Pred pred) {
  while (l < h) {
    const int64_t mid = l + (h - l) / 2;
    if (pred(mid)) {
      l = mid + 1;
    } else {
      h = mid;
    }
  }
  return l;
}

class MaskPlan {
 public:
  MaskPlan(const MaskSpec& mask, int64_t batch, int64_t sq, int64_t sk, int64_t bq, int64_t bk)
      : m_(mask), sq_(sq), sk_(sk), bq_(bq), bk_(bk) {
    seg_ = !mask.q_segment.empty();
    const int64_t nqb = (sq + bq - 1) / bq, nkb = (sk + bk - 1) / bk;
    for (int64_t qb = 0; qb < nqb; ++qb) {
      qblk_.push_back(summarize(qb * bq, std::min(sq, (qb + 1) * bq), true));
    }
    for (int64_t kb = 0; kb < nkb; ++kb) {
      kblk_.push_back(summarize(kb * bk, std::min(sk, (kb + 1) * bk), false));
    }
    if (!mask.k_valid.empty()) {
      valid_count_.resize(static_cast<size_t>(batch * nkb));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t kb = 0; kb < nkb; ++kb) {
          int64_t c = 0;
          for (int64_t j = kb * bk; j < std::min(sk, (kb + 1) * bk); ++j) {
            c += mask.k_valid[b * sk + j] != 0;
          }
          valid_count_[b * nkb + kb] = c;
        }
      }
    }
  }

  int64_t qpos(int64_t i) const { return m_.q_pos.empty() ? i : m_.q_pos[i]; }
  int64_t kpos(int64_t j) const { return m_.k_pos.empty() ? j : m_.k_pos[j]; }
  int64_t qseg(int64_t i) const { return seg_ ? m_.q_segment[i] : 0; }
  int64_t kseg(int64_t j) const { return seg_ ? m_.k_segment[j] : 0; }
  bool key_valid(int64_t b, int64_t j) const {
    return m_.k_valid.empty() || m_.k_valid[b * sk_ + j] != 0;
  }
  bool causal() const { return m_.causal; }
  // Keys of block kb that are padding for batch b: none, all or some.
  bool keys_all_valid(int64_t b, int64_t kb) const {
    return m_.k_valid.empty() || valid_count_[b * kblk_.size() + kb] == block_keys(kb);
  }
  int64_t block_keys(int64_t kb) const { return std::min(sk_, (kb + 1) * bk_) - kb * bk_; }

  BlockKind classify(int64_t b, int64_t qb, int64_t kb) const {
    const BlockSummary& q = qblk_[qb];
    const BlockSummary& k = kblk_[kb];
    if (m_.causal && k.pos_min > q.pos_max) return BlockKind::kSkip;
    if (!m_.k_valid.empty() && valid_count_[b * kblk_.size() + kb] == 0) return BlockKind::kSkip;
    if (seg_ && (k.seg_max < q.seg_min || k.seg_min > q.seg_max)) return BlockKind::kSkip;
    const bool causal_full = !m_.causal || k.pos_max <= q.pos_min;
    const bool seg_full =
        !seg_ || (q.seg_min == q.seg_max && k.seg_min == k.seg_max && q.seg_min == k.seg_min);
    if (causal_full && seg_full) return BlockKind::kFull;  // padding handled per key
    // Each row's visible keys form one run when the keys are sorted by what masks them.
    if ((causal_full || k.pos_sorted) && (seg_full || k.seg_sorted)) {
      return BlockKind::kRange;
    }
    return BlockKind::kGeneral;
  }

  // For a kFull/kRange block: the run [lo, hi) of block-relative keys row i (global index)
  // sees, before padding. Requires classify() to have said kFull or kRange.
  void row_run(int64_t i, int64_t kb, int64_t* lo, int64_t* hi) const {
    const int64_t k0 = kb * bk_, nk = block_keys(kb);
    int64_t a = 0, e = nk;
    if (seg_) {
      const int64_t s = qseg(i);
      const BlockSummary& k = kblk_[kb];
      if (!(k.seg_min == k.seg_max && k.seg_min == s)) {  // the run of segment s (sorted)
        a = partition_point(0, nk, [&](int64_t j) { return kseg(k0 + j) < s; });
        e = partition_point(a, nk, [&](int64_t j) { return kseg(k0 + j) <= s; });
      }
    }
    if (m_.causal && kblk_[kb].pos_max > qpos(i)) {  // its prefix with pos <= q pos (sorted)
      const int64_t p = qpos(i);
      e = partition_point(a, e, [&](int64_t j) { return kpos(k0 + j) <= p; });
    }
    *lo = a;
    *hi = e;
  }

 private:
  BlockSummary summarize(int64_t from, int64_t to, bool query) const {
    BlockSummary s{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), true,
                   std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), true};
    for (int64_t i = from; i < to; ++i) {
      const int64_t p = query ? qpos(i) : kpos(i);
      const int64_t g = query ? qseg(i) : kseg(i);
      if (i > from) {
        s.pos_sorted = s.pos_sorted && p >= (query ? qpos(i - 1) : kpos(i - 1));
        s.seg_sorted = s.seg_sorted && g >= (query ? qseg(i - 1) : kseg(i - 1));
      }
      s.pos_min = std::min(s.pos_min, p);
      s.pos_max = std::max(s.pos_max, p);
      s.seg_min = std::min(s.seg_min, g);
      s.seg_max = std::max(s.seg_max, g);
    }
    return s;
  }

  const MaskSpec& m_;
  int64_t sq_, sk_, bq_, bk_;
  bool seg_ = false;
  std::vector<BlockSummary> qblk_, kblk_;
  std::vector<int64_t> valid_count_;  // (B, number of key blocks)
};

// ---- per-thread buffers ----------------------------------------------------------------------

// A grow-only, 64-byte aligned scratch buffer.
class Scratch {
 public:
  template <typename T>
  T* get(int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    if (bytes > size_) {
      const size_t alloc = (bytes + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, alloc);
      if (p == nullptr) throw Error(detail::concat("out of memory allocating ", alloc, " bytes"));
      ptr_.reset(p);
      size_ = alloc;
    }
    return static_cast<T*>(ptr_.get());
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
  size_t size_ = 0;
};

struct Workspace {
  Scratch q, qt, qtile, o, m, l, k, v, s, p16, lo, hi, emask, invalid, kpos, kseg, kvalid;
  Scratch qbad, poison, badk, nbadk;  // non-finite inputs (docs/kernel.md "Numerics")
};

// ---- one call's constants -----------------------------------------------------------------------

struct Problem {
  const Tensor *q, *k, *v;
  int64_t nb, sq, nh, d, sk, nkv, group;
  int64_t bq, bk, ld_s;  // block sizes; row stride of the score block
  int64_t nqb, nkb;
  float c;        // scale · log2(e)
  DType in_type;  // storage of q, k, v
  bool bf16_mm;   // bf16 matmul (else fp32 matmul on converted blocks)
  memory::data_type mm_type;
  const simd::Kernels* kern;
  simd::RowUpdateF32 row_update;
  const MaskPlan* plan;
  const std::function<void()>* progress;
  const float* row_max;  // (B, Sq, H) fixed row maxima, or nullptr (online softmax for all rows)
  bool stack_heads;      // a tile holds all query heads of an item's kv head (few rows: decode)
  bool small_mm;         // with stack_heads and fp32 blocks: simd small_qk / small_pv
};

// n elements of storage in_type as the matmul type: a copy (fp32, or bf16 for the bf16 matmul),
// else a conversion to fp32.
void store_elems(const Problem& p, const void* from, void* to, int64_t n) {
  if (p.in_type == DType::kF32 || p.bf16_mm) {
    std::memcpy(to, from, n * dtype_size(p.in_type));
  } else {
    auto conv = p.in_type == DType::kBF16 ? p.kern->bf16_to_f32 : p.kern->f16_to_f32;
    conv(static_cast<const uint16_t*>(from), static_cast<float*>(to), n);
  }
}

// Makes `rows` rows of d elements (source row stride src_ld elements, storage in_type) available
// as a contiguous (rows, d) block of the matmul type: the source itself when it already is one,
// else a copy (or conversion to fp32) into dst. Returns the block.
const void* pack_rows(const Problem& p, const void* src, int64_t src_ld, int64_t rows, void* dst,
                      int64_t d) {
  const bool same_type = p.in_type == DType::kF32 || p.bf16_mm;
  if (src_ld == d) {  // contiguous rows: the source itself, or one conversion of the whole block
    if (same_type) return src;
    store_elems(p, src, dst, rows * d);
    return dst;
  }
  const size_t in_esz = dtype_size(p.in_type), out_esz = same_type ? in_esz : 4;
  for (int64_t r = 0; r < rows; ++r) {
    store_elems(p, static_cast<const char*>(src) + r * src_ld * in_esz,
                static_cast<char*>(dst) + r * d * out_esz, d);
  }
  return dst;
}

// Packs `rows` rows of nhk heads (source row stride src_ld elements; head h at h·d in a row) as
// nhk contiguous (rows, d) blocks of the matmul type, head after head, reading the source in
// memory order (row by row). One head: pack_rows (which may return the source itself).
const void* pack_heads(const Problem& p, const void* src, int64_t src_ld, int64_t rows, int64_t nhk,
                       void* dst) {
  const int64_t d = p.d;
  if (nhk == 1) return pack_rows(p, src, src_ld, rows, dst, d);
  const size_t in_esz = dtype_size(p.in_type);
  const size_t out_esz = p.in_type == DType::kF32 || p.bf16_mm ? in_esz : 4;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < nhk; ++h) {
      store_elems(p, static_cast<const char*>(src) + (r * src_ld + h * d) * in_esz,
                  static_cast<char*>(dst) + (h * rows + r) * d * out_esz, d);
    }
  }
  return dst;
}

// ---- non-finite inputs (docs/kernel.md "Numerics: non-finite inputs") --------------------------
// Found while packing, once per row of Q and per key of K/V (O(S·D), never in the O(S²) loops):
// such rows are zeroed in the packed blocks, so the matmuls and the softmax only ever see finite
// numbers (and 0·NaN cannot leak into rows that do not see a key through P·V), and every query
// row that sees one is set to NaN at the end.

// Whether d elements of the matmul type (fp32, or bf16 for the bf16 matmul) hold an Inf or a NaN
// (exponent bits all set). Branch-free, so the compiler vectorizes it.
bool any_nonfinite(const Problem& p, const void* x, int64_t d) {
  unsigned bad = 0;
  if (p.bf16_mm) {
    const auto* u = static_cast<const uint16_t*>(x);
    for (int64_t i = 0; i < d; ++i) bad |= (u[i] & 0x7f80u) == 0x7f80u;
  } else {
    const auto* u = static_cast<const uint32_t*>(x);
    for (int64_t i = 0; i < d; ++i) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
  }
  return bad != 0;
}

// Makes `block` (bytes, a packed block that may be the caller's input itself) writable by copying
// it into `buf` unless it already lives there; returns the writable block.
char* writable(const void* block, size_t bytes, void* buf) {
  if (block != buf) std::memcpy(buf, block, bytes);
  return static_cast<char*>(buf);
}

// The work item: batch b, kv heads [hk0, hk1), query blocks [qb0, qb1), query heads
// hk·group + [g0, g1) of each kv head hk, key blocks [kb0, kb1). Writes its rows of the state
// (out, lse) over those keys (tiles: see run_item). Items of several kv heads (few query rows:
// decode) read each key block's rows of all heads together, so K/V stream from memory in order
// rather than one head's slice of every row at a time.
struct Item {
  int64_t b, hk0, hk1, qb0, qb1, g0, g1, kb0, kb1;
};

// With p.row_max, also writes row_sum and row_flags (kRowMaxExceeded only) of its fixed rows.
void run_item(const Problem& p, const Item& it, float* out, float* lse, float* row_sum,
              uint8_t* row_flags, Workspace& ws, bool calling_thread) {
  const int64_t b = it.b, qb0 = it.qb0, qb1 = it.qb1, g0 = it.g0, g1 = it.g1;
  const int64_t d = p.d, bq = p.bq, bk = p.bk, ld_s = p.ld_s;
  const int64_t ng = g1 - g0, nhk = it.hk1 - it.hk0, nqt = qb1 - qb0;
  // Query heads per tile: with p.stack_heads the ng heads of a kv head share one tile, their
  // rows stacked token by token (row r: token r / gs, head r % gs), so each K/V block feeds one
  // matmul of gs times the rows instead of gs small ones.
  const int64_t gs = p.stack_heads ? ng : 1, ngt = ng / gs, tr = bq * gs;  // tr: rows per tile
  const int64_t tiles = nqt * nhk * ngt;
  const size_t esz = p.bf16_mm ? 2 : 4;  // bytes per packed element
  char* qbuf = ws.q.get<char>(tiles * tr * d * esz);
  float* obuf = ws.o.get<float>(tiles * tr * d);
  float* mbuf = ws.m.get<float>(tiles * tr);
  double* lbuf = ws.l.get<double>(tiles * tr);
  // K/V of one key block: nhk blocks (nk, d), one per kv head of the item.
  char* kbuf = ws.k.get<char>(nhk * bk * d * esz);
  char* vbuf = ws.v.get<char>(nhk * bk * d * esz);
  float* sbuf = ws.s.get<float>(tr * ld_s);
  uint16_t* p16 = p.bf16_mm ? ws.p16.get<uint16_t>(tr * ld_s) : nullptr;
  int64_t* lo = ws.lo.get<int64_t>(bq);
  int64_t* hi = ws.hi.get<int64_t>(bq);
  uint8_t* emask = ws.emask.get<uint8_t>(bq * bk);
  int64_t* invalid = ws.invalid.get<int64_t>(bk);
  int64_t* kpos = ws.kpos.get<int64_t>(bk);
  int64_t* kseg = ws.kseg.get<int64_t>(bk);
  uint8_t* kvalid = ws.kvalid.get<uint8_t>(bk);
  int64_t* badk = ws.badk.get<int64_t>(nhk * bk);  // per kv head: block keys with Inf/NaN
  int64_t* nbadk = ws.nbadk.get<int64_t>(nhk);
  const size_t in_esz = dtype_size(p.in_type);
  const char* qsrc = static_cast<const char*>(p.q->raw());
  const char* ksrc = static_cast<const char*>(p.k->raw());
  const char* vsrc = static_cast<const char*>(p.v->raw());

  // Tile t = (query block, kv head, head chunk): its first token, its first query head, its
  // tokens; its row r is the state row (token i0 + r / gs, head h0 + r % gs).
  auto tile_i0 = [&](int64_t t) { return (qb0 + t / (nhk * ngt)) * bq; };
  auto tile_head = [&](int64_t t) {
    return (it.hk0 + t / ngt % nhk) * p.group + g0 + t % ngt * gs;
  };
  auto tile_tokens = [&](int64_t t) { return std::min(bq, p.sq - tile_i0(t)); };
  auto state_row = [&](int64_t t, int64_t r) {
    return (b * p.sq + tile_i0(t) + r / gs) * p.nh + tile_head(t) + r % gs;
  };
  // Step 0: pack Q tiles (a token's gs heads are adjacent in q); reset the accumulators.
  const void** qtile = ws.qtile.get<const void*>(tiles);
  for (int64_t t = 0; t < tiles; ++t) {
    const char* src = qsrc + state_row(t, 0) * d * in_esz;
    qtile[t] = pack_rows(p, src, p.nh * d, tile_tokens(t), qbuf + t * tr * d * esz, gs * d);
  }
  // Query rows with a non-finite element: flagged (NaN at the end if they see any key) and zeroed.
  uint8_t* qbad = ws.qbad.get<uint8_t>(tiles * tr);
  uint8_t* poison = ws.poison.get<uint8_t>(tiles * tr);  // 1: the row's result is NaN
  std::fill_n(poison, tiles * tr, uint8_t{0});
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rows = tile_tokens(t) * gs;
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      qbad[t * tr + r] = any_nonfinite(p, static_cast<const char*>(qtile[t]) + r * d * esz, d);
      any = any || qbad[t * tr + r];
    }
    if (!any) continue;
    char* qw = writable(qtile[t], rows * d * esz, qbuf + t * tr * d * esz);
    for (int64_t r = 0; r < rows; ++r) {
      if (qbad[t * tr + r]) std::memset(qw + r * d * esz, 0, d * esz);
    }
    qtile[t] = qw;
  }
  // Few-row matmuls take Qᵀ (d × rp, rows zero-padded to rp) per tile.
  const int64_t rp =
      (tr + simd::small_row_align() - 1) / simd::small_row_align() * simd::small_row_align();
  float* qtbuf = p.small_mm ? ws.qt.get<float>(tiles * d * rp) : nullptr;
  if (p.small_mm) {
    for (int64_t t = 0; t < tiles; ++t) {
      const float* qs = static_cast<const float*>(qtile[t]);
      float* qt = qtbuf + t * d * rp;
      const int64_t rows = tile_tokens(t) * gs;
      for (int64_t c = 0; c < d; ++c) {
        for (int64_t r = 0; r < rows; ++r) qt[c * rp + r] = qs[r * d + c];
        std::fill(qt + c * rp + rows, qt + (c + 1) * rp, 0.f);
      }
    }
  }
  std::fill_n(obuf, tiles * tr * d, 0.f);
  std::fill_n(mbuf, tiles * tr, kNegInf);
  std::fill_n(lbuf, tiles * tr, 0.0);
  if (p.row_max != nullptr) {  // fixed rows start at their bound and normally stay there
    for (int64_t t = 0; t < tiles; ++t) {
      for (int64_t r = 0; r < tile_tokens(t) * gs; ++r)
        mbuf[t * tr + r] = fixed_max_log2(p.row_max[state_row(t, r)]);
    }
  }

  std::vector<BlockKind> kinds(static_cast<size_t>(nqt));
  // Step 1: walk the key blocks.
  for (int64_t kb = it.kb0; kb < it.kb1; ++kb) {
    bool any = false;
    for (int64_t qt = 0; qt < nqt; ++qt) {
      kinds[qt] = p.plan->classify(b, qb0 + qt, kb);
      any = any || kinds[qt] != BlockKind::kSkip;
    }
    if (!any) continue;  // fully masked for every tile: never touched
    const int64_t k0 = kb * bk, nk = p.plan->block_keys(kb);
    // Padding keys of this block (for rows whose run is computed from positions/segments).
    int64_t n_invalid = 0;
    if (!p.plan->keys_all_valid(b, kb)) {
      for (int64_t j = 0; j < nk; ++j) {
        if (!p.plan->key_valid(b, k0 + j)) invalid[n_invalid++] = j;
      }
    }
    bool general_keys_ready = false;
    // Packed once per key block for all the item's kv heads, reading K/V in memory order: head
    // hk's (nk, d) block is the (hk - hk0)-th.
    const int64_t kv_off = ((b * p.sk + k0) * p.nkv + it.hk0) * d;
    const char* kall =
        static_cast<const char*>(pack_heads(p, ksrc + kv_off * in_esz, p.nkv * d, nk, nhk, kbuf));
    const char* vall =
        static_cast<const char*>(pack_heads(p, vsrc + kv_off * in_esz, p.nkv * d, nk, nhk, vbuf));
    // Keys with a non-finite K or V element, per kv head: listed and zeroed.
    bool any_bad_key = false;
    for (int64_t h = 0; h < nhk; ++h) {
      int64_t n = 0;
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t off = (h * nk + j) * d * esz;
        if (any_nonfinite(p, kall + off, d) || any_nonfinite(p, vall + off, d)) {
          badk[h * bk + n++] = j;
        }
      }
      nbadk[h] = n;
      any_bad_key = any_bad_key || n > 0;
    }
    if (any_bad_key) {
      char* kw = writable(kall, nhk * nk * d * esz, kbuf);
      char* vw = writable(vall, nhk * nk * d * esz, vbuf);
      for (int64_t h = 0; h < nhk; ++h) {
        for (int64_t x = 0; x < nbadk[h]; ++x) {
          const int64_t off = (h * nk + badk[h * bk + x]) * d * esz;
          std::memset(kw + off, 0, d * esz);
          std::memset(vw + off, 0, d * esz);
        }
      }
      kall = kw;
      vall = vw;
    }
    const MatmulShape qk{0, nk, d, d, 1, d, ld_s, p.mm_type, false};
    const MatmulShape pv{0, d, nk, ld_s, d, 1, d, p.mm_type, true};
    for (int64_t qt = 0; qt < nqt; ++qt) {
      const BlockKind kind = kinds[qt];
      if (kind == BlockKind::kSkip) continue;
      const int64_t i0 = (qb0 + qt) * bq, rows = std::min(bq, p.sq - i0);
      // The mask of this (query block, key block) per token, shared by all heads of the item.
      if (kind == BlockKind::kGeneral) {
        if (!general_keys_ready) {  // the block's keys, gathered once for branch-free rows
          for (int64_t j = 0; j < nk; ++j) {
            kpos[j] = p.plan->kpos(k0 + j);
            kseg[j] = p.plan->kseg(k0 + j);
            kvalid[j] = p.plan->key_valid(b, k0 + j);
          }
          general_keys_ready = true;
        }
        const bool causal = p.plan->causal();
        for (int64_t r = 0; r < rows; ++r) {
          lo[r] = 0;
          hi[r] = nk;
          const int64_t qp = p.plan->qpos(i0 + r), qs = p.plan->qseg(i0 + r);
          uint8_t* em = emask + r * bk;
          for (int64_t j = 0; j < nk; ++j) {
            em[j] = static_cast<uint8_t>((!causal || kpos[j] <= qp) & (kseg[j] == qs) & kvalid[j]);
          }
        }
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          if (kind == BlockKind::kFull) {
            lo[r] = 0;
            hi[r] = nk;
          } else {
            p.plan->row_run(i0 + r, kb, &lo[r], &hi[r]);
          }
        }
      }
      for (int64_t hk = it.hk0; hk < it.hk1; ++hk) {
        const void* kblk = kall + (hk - it.hk0) * nk * d * esz;
        const void* vblk = vall + (hk - it.hk0) * nk * d * esz;
        for (int64_t gt = 0; gt < ngt; ++gt) {
          const int64_t t = (qt * nhk + (hk - it.hk0)) * ngt + gt;
          float* o = obuf + t * tr * d;
          float* m = mbuf + t * tr;
          double* l = lbuf + t * tr;
          if (p.small_mm) {
            p.kern->small_qk(qtbuf + t * d * rp, rp, rows * gs, static_cast<const float*>(kblk), d,
                             nk, d, sbuf, ld_s);
          } else {
            MatmulShape s_qk = qk;
            s_qk.m = rows * gs;
            thread_matmul_cache().run(s_qk, qtile[t], kblk, sbuf);
          }
          for (int64_t r = 0; r < rows * gs; ++r) {
            const int64_t tok = r / gs;  // the row's token within the block
            float* srow = sbuf + r * ld_s;
            if (kind == BlockKind::kGeneral) {
              const uint8_t* em = emask + tok * bk;
              for (int64_t j = 0; j < nk; ++j) srow[j] = em[j] ? srow[j] : kNegInf;
            } else {
              for (int64_t x = 0; x < n_invalid; ++x) srow[invalid[x]] = kNegInf;
            }
            if (p.bf16_mm) {
              p.kern->row_update_bf16_deg3(srow, p16 + r * ld_s, lo[tok], hi[tok], nk, p.c, m + r,
                                           l + r, o + r * d, d);
            } else {
              p.row_update(srow, lo[tok], hi[tok], nk, p.c, m + r, l + r, o + r * d, d);
            }
          }
          if (p.small_mm) {
            p.kern->small_pv(sbuf, ld_s, rows * gs, static_cast<const float*>(vblk), d, nk, d, o);
          } else {
            MatmulShape s_pv = pv;
            s_pv.m = rows * gs;
            thread_matmul_cache().run(s_pv, p.bf16_mm ? static_cast<void*>(p16) : sbuf, vblk, o);
          }
          // Rows that see a non-finite key, or have a non-finite query and see any key.
          const int64_t nbad = nbadk[hk - it.hk0];
          const int64_t* bad = badk + (hk - it.hk0) * bk;
          for (int64_t r = 0; r < rows * gs; ++r) {
            uint8_t& pr = poison[t * tr + r];
            if (pr || (nbad == 0 && !qbad[t * tr + r])) continue;
            const int64_t tok = r / gs;
            auto sees = [&](int64_t j) {
              return kind == BlockKind::kGeneral
                         ? emask[tok * bk + j] != 0
                         : j >= lo[tok] && j < hi[tok] && p.plan->key_valid(b, k0 + j);
            };
            if (qbad[t * tr + r]) {
              for (int64_t j = 0; j < nk && !pr; ++j) pr = sees(j);
            } else {
              for (int64_t x = 0; x < nbad && !pr; ++x) pr = sees(bad[x]);
            }
          }
        }
      }
    }
    if (calling_thread && *p.progress) (*p.progress)();
  }

  // Step 2: normalize and write out (B, Sq, H, D) and lse (B, Sq, H).
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t r = 0; r < tile_tokens(t) * gs; ++r) {
      const double l = lbuf[t * tr + r];
      const int64_t row = state_row(t, r);
      // NaN for a row that saw a non-finite input, or whose running max is +inf or NaN (logits
      // of finite inputs that overflow fp32: 2^(inf - inf), as IEEE arithmetic would have it).
      const float mr = mbuf[t * tr + r];
      if (poison[t * tr + r] || std::isnan(mr) || mr == std::numeric_limits<float>::infinity()) {
        std::fill_n(out + row * d, d, kNaN);
        lse[row] = kNaN;
        if (p.row_max != nullptr && fixed_max_log2(p.row_max[row]) != kNegInf) {
          // Its sums are not relative to the bound: callers that add sums must merge instead.
          if (row_sum != nullptr) row_sum[row] = kNaN;
          if (row_flags != nullptr) row_flags[row] |= AttnParams::kRowMaxExceeded;
        }
        continue;
      }
      if (p.row_max != nullptr) {
        const float m0 = fixed_max_log2(p.row_max[row]);
        if (m0 != kNegInf) {
          const float m = mbuf[t * tr + r];
          if (row_sum != nullptr)
            row_sum[row] = static_cast<float>(m == m0 ? l : l * std::exp2(double(m) - m0));
          if (row_flags != nullptr && m != m0) row_flags[row] |= AttnParams::kRowMaxExceeded;
        }
      }
      if (!(l > 0)) continue;  // saw no key: stays empty (out 0, lse -inf)
      p.kern->scale_copy(obuf + (t * tr + r) * d, static_cast<float>(1.0 / l), out + row * d, d);
      lse[row] = static_cast<float>(mbuf[t * tr + r] * kLn2 + std::log(l));
    }
  }
}

Workspace& thread_workspace() {
  thread_local Workspace ws;
  return ws;
}

}  // namespace

AttnState flash_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttnParams& params) {
  trace::Scope span("attention", "kernel", trace::Lane::kCompute);  // --trace: one kernel call
  span.arg("queries", q.ndim() == 4 ? q.dim(1) : 0);
  span.arg("keys", k.ndim() == 4 ? k.dim(1) : 0);
  validate_attention_inputs(q, k, v, params.mask);
  Problem p{};
  p.q = &q;
  p.k = &k;
  p.v = &v;
  p.nb = q.dim(0);
  p.sq = q.dim(1);
  p.nh = q.dim(2);
  p.d = q.dim(3);
  p.sk = k.dim(1);
  p.nkv = k.dim(2);
  p.group = p.nh / p.nkv;
  AttnState st = AttnState::empty(p.nb, p.sq, p.nh, p.d);

  // Fixed row maxima: outputs start at 0; loose rows are flagged from the final lse.
  const int64_t n_rows = p.nb * p.sq * p.nh;
  const bool fixed = !params.row_max.empty();
  SEQPAR_ARG_CHECK(!fixed || static_cast<int64_t>(params.row_max.size()) == n_rows, "row_max has ",
                   params.row_max.size(), " entries; valid: B·Sq·H = ", n_rows);
  SEQPAR_ARG_CHECK(
      params.row_sum.empty() || (fixed && static_cast<int64_t>(params.row_sum.size()) == n_rows),
      "row_sum has ", params.row_sum.size(), " entries; valid: B·Sq·H = ", n_rows,
      ", with row_max given");
  SEQPAR_ARG_CHECK(params.row_flags.empty() ||
                       (fixed && static_cast<int64_t>(params.row_flags.size()) == n_rows),
                   "row_flags has ", params.row_flags.size(), " entries; valid: B·Sq·H = ", n_rows,
                   ", with row_max given");
  std::fill(params.row_sum.begin(), params.row_sum.end(), 0.f);
  std::fill(params.row_flags.begin(), params.row_flags.end(), uint8_t{0});
  auto flag_loose_rows = [&] {
    if (params.row_flags.empty()) return;
    const float* lse = st.lse.data<float>();
    for (int64_t i = 0; i < n_rows; ++i) {
      const float m = params.row_max[i];
      if (fixed_max_log2(m) == kNegInf) continue;          // online row
      if (!(m - lse[i] <= AttnParams::kRowMaxLooseLimit))  // also lse = -inf (sum 0)
        params.row_flags[i] |= AttnParams::kRowMaxLoose;
    }
  };
  if (p.nb == 0 || p.sq == 0 || p.sk == 0) {
    flag_loose_rows();
    return st;
  }

  SEQPAR_ARG_CHECK(std::isfinite(params.scale) && params.scale >= 0.f, "attention scale ",
                   params.scale, " is invalid; valid: > 0 (or 0 for 1/sqrt(head_dim))");
  SEQPAR_ARG_CHECK(params.block_q >= 0 && params.block_k >= 0, "block sizes (", params.block_q,
                   ", ", params.block_k, ") are invalid; valid: >= 1, or 0 for the default");
  const double scale = params.scale != 0.f ? params.scale : 1.0 / std::sqrt(double(p.d));
  p.c = static_cast<float>(scale * 1.44269504088896340736);  // log2(e)
  p.bq = params.block_q > 0 ? params.block_q : kDefaultBlockQ;
  p.bk = params.block_k > 0 ? params.block_k : kDefaultBlockK;
  p.bq = std::min(p.bq, p.sq);
  p.bk = std::min(p.bk, p.sk);
  p.ld_s = simd::round_up_row(p.bk);
  p.nqb = (p.sq + p.bq - 1) / p.bq;
  p.nkb = (p.sk + p.bk - 1) / p.bk;
  p.in_type = q.dtype();
  p.bf16_mm = p.in_type == DType::kBF16 && use_bf16_matmul();
  p.mm_type = p.bf16_mm ? memory::data_type::bf16 : memory::data_type::f32;
  p.kern = &simd::kernels();
  p.row_update = p.in_type == DType::kF32 ? p.kern->row_update_deg5 : p.kern->row_update_deg3;
  const MaskPlan plan(params.mask, p.nb, p.sq, p.sk, p.bq, p.bk);
  p.plan = &plan;
  p.progress = &params.progress;
  p.row_max = fixed ? params.row_max.data() : nullptr;

  // Work items: (b, kv heads, head sub-group, chunk of query blocks). Big chunks amortize the K/V
  // packing; halve them until there are a few items per thread. With still fewer items than
  // threads (decode, short queries), the key blocks are split too: each split yields a partial
  // state and the partials are merged by LSE (merge_into), like ring steps.
  // Few query rows per kv head (decode): reading K/V from memory is the cost, so an item takes
  // every kv head and walks the key blocks in memory order (one head's slice of every row, 2·D
  // bytes every 2·Hkv·D, streams at a fraction of the bandwidth); threads split the keys.
  const int64_t threads = omp_in_parallel() ? 1 : std::max(1, omp_get_max_threads());
  const bool stream_kv = p.sq * p.group <= kStreamRows;
  const int64_t hk_per_item = stream_kv ? p.nkv : 1;
  p.stack_heads = stream_kv;
  p.small_mm = stream_kv && !p.bf16_mm && use_small_matmuls();
  const int64_t n_hkchunks = (p.nkv + hk_per_item - 1) / hk_per_item;
  const int64_t g_per_item = std::min(p.group, kMaxTilesPerItem);
  const int64_t n_gchunks = (p.group + g_per_item - 1) / g_per_item;
  int64_t chunk = std::clamp<int64_t>(kMaxTilesPerItem / g_per_item, 1, p.nqb);
  if (stream_kv) chunk = p.nqb;
  auto n_items_for = [&](int64_t c) {
    return p.nb * n_hkchunks * n_gchunks * ((p.nqb + c - 1) / c);
  };
  while (!stream_kv && threads > 1 && chunk > 1 && n_items_for(chunk) < 4 * threads) {
    chunk = (chunk + 1) / 2;
  }
  const int64_t n_qchunks = (p.nqb + chunk - 1) / chunk;
  const int64_t n_base = n_items_for(chunk);
  const int64_t n_ksplits =
      threads > 1 && n_base < threads ? std::min(p.nkb, (2 * threads + n_base - 1) / n_base) : 1;
  const int64_t n_items = n_base * n_ksplits;
  std::vector<AttnState> partial(static_cast<size_t>(n_ksplits - 1));
  for (AttnState& ps : partial) ps = AttnState::empty(p.nb, p.sq, p.nh, p.d);
  // Key splits of fixed rows: each split's row sums and flags, added / OR-ed afterwards.
  const bool split_fixed = fixed && n_ksplits > 1;
  std::vector<float> split_sum(split_fixed && !params.row_sum.empty() ? partial.size() * n_rows : 0,
                               0.f);
  std::vector<uint8_t> split_flags(
      split_fixed && !params.row_flags.empty() ? partial.size() * n_rows : 0, 0);

  auto run = [&](int64_t item, bool calling_thread) {
    int64_t x = item;
    const int64_t ks = x % n_ksplits;
    x /= n_ksplits;
    const int64_t qc = x % n_qchunks;
    x /= n_qchunks;
    const int64_t gc = x % n_gchunks;
    x /= n_gchunks;
    const int64_t hc = x % n_hkchunks;
    const Item it{x / n_hkchunks,
                  hc * hk_per_item,
                  std::min(p.nkv, (hc + 1) * hk_per_item),
                  qc * chunk,
                  std::min(p.nqb, (qc + 1) * chunk),
                  gc * g_per_item,
                  std::min(p.group, (gc + 1) * g_per_item),
                  p.nkb * ks / n_ksplits,
                  p.nkb * (ks + 1) / n_ksplits};
    AttnState& dst = ks == 0 ? st : partial[ks - 1];
    float* sum = params.row_sum.empty() ? nullptr
                 : ks == 0              ? params.row_sum.data()
                                        : split_sum.data() + (ks - 1) * n_rows;
    uint8_t* flags = params.row_flags.empty() ? nullptr
                     : ks == 0                ? params.row_flags.data()
                                              : split_flags.data() + (ks - 1) * n_rows;
    run_item(p, it, dst.out.data<float>(), dst.lse.data<float>(), sum, flags, thread_workspace(),
             calling_thread);
  };

  if (threads == 1 || n_items == 1) {
    for (int64_t it = 0; it < n_items; ++it) run(it, true);
    flag_loose_rows();
    return st;
  }
  // Exceptions must not cross the OpenMP region: keep the first, stop handing out work.
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  std::mutex error_mu;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < n_items; ++it) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      run(it, omp_get_thread_num() == 0);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
  }
  if (error) std::rethrow_exception(error);
  for (const AttnState& ps : partial) merge_into(st, ps);
  for (size_t x = 0; x < split_sum.size(); ++x) params.row_sum[x % n_rows] += split_sum[x];
  for (size_t x = 0; x < split_flags.size(); ++x) params.row_flags[x % n_rows] |= split_flags[x];
  flag_loose_rows();
  return st;
}

std::string attention_kernel_info() {
  static const std::string info = [] {
    const auto* ver = dnnl::version();
    std::string mm = "unavailable";
    try {
      mm = make_matmul_pd({256, 256, 128, 128, 1, 128, 256, memory::data_type::f32, false})
               .impl_info_str();
    } catch (const dnnl::error&) {
    }
    std::string s =
        detail::concat("blockwise flash attention (Bq ", kDefaultBlockQ, ", Bk ", kDefaultBlockK,
                       "); softmax ", simd::isa_name(simd::kernels().isa),
                       " (exp2 poly deg 5 for fp32, deg 3 for bf16/fp16); oneDNN ", ver->major, ".",
                       ver->minor, ".", ver->patch, " matmul ", mm, " fp32");
    if (use_bf16_matmul()) {
      std::string bf = "?";
      try {
        bf = make_matmul_pd({256, 256, 128, 128, 1, 128, 256, memory::data_type::bf16, false})
                 .impl_info_str();
      } catch (const dnnl::error&) {
      }
      s += "; bf16 inputs: oneDNN bf16 matmul " + bf;
    } else {
      s += "; bf16/fp16 inputs: converted to fp32 per block (no avx512_bf16/AMX matmul)";
    }
    s += detail::concat("; decode shapes (Sq x H/Hkv <= ", kStreamRows,
                        "): all kv heads per item in memory order, few-row FMA loops",
                        use_bf16_matmul() ? " (fp32/fp16 inputs)" : "");
    return s;
  }();
  return info;
}

}  // namespace seqpar
