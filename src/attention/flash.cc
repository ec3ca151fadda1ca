// Blockwise flash attention on the CPU (see docs/kernel.md).
//
// Steps, for one work item = (batch b, kv heads [hk0, hk1), a chunk of query blocks, some of the
// query heads that read each of those kv heads; several kv heads, stacked query heads and
// few-row FMA loops instead of oneDNN only for decode shapes, see docs/kernel.md):
//   0. pack each (query block, head) "tile" of Q into a contiguous (rows, D) buffer; O = 0,
//      running max m = -inf, running sum l = 0 per row (item_tiles, pack_q_tiles,
//      reset_accumulators).
//   1. for each key block kb (Bk keys), for each kv head hk of the item:
//        classify (query block, kb) from the mask: skip (fully masked: never computed), full,
//        range (each row sees one contiguous run of keys: causal with sorted positions,
//        sorted segments) or general (per-element mask) (classify_query_blocks, mask_rows);
//        pack K and V of kb for the item's kv heads once (converted to the matmul dtype) and
//        reuse them for every tile, or with fp32 decode shapes read them in place
//        (load_key_block);
//        for each tile that is not skipped:
//          tile_scores:      S = Q·Kᵀ, oneDNN matmul (rows × nk, K = D)
//          tile_softmax:     mask S, then per row the online softmax update with a stale
//                            running max (simd.h: exp2 with scale·log2(e) and the max folded
//                            into one FMA), P in place
//          tile_pv:          O += P·V, oneDNN matmul with a sum post-op (rows × D, K = nk)
//          poison_tile_rows: rows that meet a non-finite input (docs/kernel.md "Numerics")
//        call params.progress() (from the calling thread only).
//   2. out = O / l, lse = (m + log2 l)·ln 2; rows that saw no key stay out = 0, lse = -inf
//      (write_rows).
// Fixed row maximum (params.row_max, const-max softmax): a row with a finite bound starts with
// m = bound·log2(e) instead of -inf. The row update is unchanged: with m preset it rescales
// only if a block's max exceeds m by more than the stale-max slack (the bound was wrong; the row
// is flagged), so l and O stay relative to the bound and partial sums of such rows over
// different key sets add without rescaling.
// Work items run on the calling thread's team (core/team.h: omp_get_max_threads() threads, never
// changed here); oneDNN runs single-threaded inside it.
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
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/core/error.h"
#include "seqpar/core/team.h"
#include "seqpar/core/tensor_view.h"
#include "seqpar/core/trace.h"
#include "simd.h"

namespace seqpar {

namespace {

namespace simd = attn_simd;
using dnnl::memory;

constexpr int64_t kDefaultBlockQ = 256;
// Key blocks: 256 keys, and 512 where the blocks are multiplied in fp32 and no causal or segment
// mask cuts them (half the online-softmax rescales of O and twice the depth of each P·V product:
// 1.04x the kernel's rate on a Zen 4 core; with a causal mask the blocks on the diagonal compute
// twice the masked scores, 0.95x there; docs/kernel.md).
constexpr int64_t kDefaultBlockK = 256;
constexpr int64_t kUnmaskedBlockK = 512;
// Rows of a query tile a strip of the panel products (tile_by_panels): its scores (48 × 512 fp32,
// 96 KiB) stay in L2 between Q·Kᵀ, the softmax and P·V.
constexpr int64_t kPanelStrip = 48;
// The largest default key block read in place (decode shapes).
constexpr int64_t kMaxInPlaceBlockK = 256;
// At most this many (query block, head) tiles per work item (outside decode shapes): bounds the
// per-thread buffers (two (Bq, D) fp32 buffers per tile) while amortizing the K/V packing.
constexpr int64_t kMaxTilesPerItem = 16;
// At most this many query rows per kv head (Sq · group) make a call K/V-bound (decode).
constexpr int64_t kStreamRows = 64;
// At most this many query rows per kv head take the few-row loops on bf16 K/V in place even where
// oneDNN's bf16 matmul runs (which was faster for 16 rows on AMX: docs/kernel.md).
constexpr int64_t kFewRowsInPlace = 4;
// At least this many full tiles per kv head read a key block before its K and V are copied into
// oneDNN's layout for their products (BlockedKv).
constexpr int64_t kMinBlockedKvUses = 4;
// K/V read in place (kv_in_place): the default key block holds about this many bytes of K and V
// of all kv heads, so that it stays in L2 from the non-finite check to the products.
constexpr int64_t kInPlaceBlockBytes = 256 * 1024;
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
// sits at kk·ldb_k + nn·ldb_n (so a row-major K block is a transposed B for Q·Kᵀ), or with
// b_blocked B lies in the layout oneDNN picks for this product, written by MatmulCache::pack_b
// from that strided one.
struct MatmulShape {
  int64_t m, n, k, lda, ldb_k, ldb_n, ldc;
  memory::data_type ab_type;  // f32 or bf16; C is always f32
  bool accumulate;            // C += A·B (sum post-op)
  bool b_blocked = false;
  bool operator==(const MatmulShape&) const = default;
};

struct MatmulShapeHash {
  size_t operator()(const MatmulShape& s) const {
    size_t h = 0;
    for (int64_t x :
         {s.m, s.n, s.k, s.lda, s.ldb_k, s.ldb_n, s.ldc, static_cast<int64_t>(s.ab_type),
          static_cast<int64_t>(s.accumulate), static_cast<int64_t>(s.b_blocked)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(x);
    }
    return h;
  }
};

// B as the caller's strided block.
memory::desc plain_b_desc(const MatmulShape& s) {
  return memory::desc({s.k, s.n}, s.ab_type, memory::dims{s.ldb_k, s.ldb_n});
}

dnnl::matmul::primitive_desc make_matmul_pd(const MatmulShape& s) {
  const memory::desc a_md({s.m, s.k}, s.ab_type, memory::dims{s.lda, 1});
  const memory::desc b_md =
      s.b_blocked ? memory::desc({s.k, s.n}, s.ab_type, memory::format_tag::any) : plain_b_desc(s);
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
    Entry& e = entry(s);
    e.a.set_data_handle(const_cast<void*>(a));
    e.b.set_data_handle(const_cast<void*>(b));
    e.c.set_data_handle(c);
    e.prim.execute(stream_, {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}});
  }

  // Bytes of B in the layout of the b_blocked shape s.
  size_t blocked_b_bytes(const MatmulShape& s) { return entry(s).b.get_desc().get_size(); }

  // B of the b_blocked shape s, from the strided block `plain` (s's ldb_k, ldb_n) into `blocked`
  // (blocked_b_bytes(s) bytes): a copy.
  void pack_b(const MatmulShape& s, const void* plain, void* blocked) {
    Entry& e = entry(s);
    if (!e.pack) {
      e.plain_b = memory(plain_b_desc(s), cpu_engine(), DNNL_MEMORY_NONE);
      e.pack = dnnl::reorder(e.plain_b, e.b);
    }
    e.plain_b.set_data_handle(const_cast<void*>(plain));
    e.b.set_data_handle(blocked);
    e.pack.execute(stream_, e.plain_b, e.b);
  }

 private:
  static constexpr size_t kCapacity = 256;
  struct Entry {
    dnnl::matmul prim;
    memory a, b, c;
    memory plain_b;      // pack_b's source (b_blocked shapes)
    dnnl::reorder pack;  // plain_b -> b, made on the first pack_b
  };

  Entry& entry(const MatmulShape& s) {
    auto it = map_.find(s);
    if (it == map_.end()) {
      if (map_.size() >= kCapacity) map_.clear();
      auto pd = make_matmul_pd(s);
      Entry e{dnnl::matmul(pd),
              memory(pd.src_desc(), cpu_engine(), DNNL_MEMORY_NONE),
              memory(pd.weights_desc(), cpu_engine(), DNNL_MEMORY_NONE),
              memory(pd.dst_desc(), cpu_engine(), DNNL_MEMORY_NONE),
              memory(),
              dnnl::reorder()};
      it = map_.emplace(s, std::move(e)).first;
    }
    return it->second;
  }
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

// Where kMinBlockedKvUses full tiles read a key block, its K and V are copied per kv head into
// the layout oneDNN picks for their products (BlockedKv); SEQPAR_KERNEL_BLOCKED_KV=0 (read on every
// call, so a benchmark can compare both in one process) has every product read the packed blocks.
bool use_blocked_kv() {
  const char* env = std::getenv("SEQPAR_KERNEL_BLOCKED_KV");
  return env == nullptr || std::string(env) != "0";
}

// Query tiles' fp32 products (no decode shapes, no bf16 matmul) take the kernel table's panel
// products where its ISA is AVX2, the tile walked in strips (tile_by_panels; docs/kernel.md "Panel
// products"), else oneDNN. SEQPAR_KERNEL_PANELS=0 (read on every call, so a benchmark can compare
// both in one process) uses oneDNN instead.
bool use_panels(const simd::Kernels& kern) {
  if (kern.isa != simd::Isa::kAvx2) return false;
  const char* env = std::getenv("SEQPAR_KERNEL_PANELS");
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
  Scratch q, qt, qtile, o, m, l, k, v, kblocked, vblocked, s, p16, lo, hi, emask, invalid, kpos,
      kseg, kvalid;
  Scratch qbad, poison, badk, nbadk;  // non-finite inputs (docs/kernel.md "Numerics")
};

// ---- one call's constants -----------------------------------------------------------------------

// Where element (b, token, head, 0) of a (B, S, H, D) view lies: b·b + token·s + head·h elements
// from its start (D is contiguous).
struct Strides {
  int64_t b, s, h;
  int64_t at(int64_t bb, int64_t token, int64_t head) const {
    return bb * b + token * s + head * h;
  }
};
Strides strides_of(const TensorView& x) {
  return {x.stride(0), x.stride(1), x.ndim() > 2 ? x.stride(2) : 0};
}

// Where a call writes its state: out (B, Sq, H, D) and lse (B, Sq, H), fp32, any strides.
struct OutRows {
  float* out;
  float* lse;
  Strides o, l;
};

struct Problem {
  const char *q, *k, *v;  // the inputs' first elements
  Strides qs, ks, vs;
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
  bool small_mm;         // with stack_heads, no bf16 matmul: simd small_qk / small_pv
  bool blocked_kv;       // oneDNN products of full tiles may read BlockedKv
  bool panels;           // the products are the kernel table's panel products (PanelKv)
  DType kv_type;         // K and V as the products read them: the matmul type, or in place in_type
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

// Makes `rows` tokens of `heads` heads of d elements each (source: token r, head g at
// r·row_ld + g·head_ld elements, storage in_type) available as a contiguous (rows·heads, d) block
// of the matmul type, a token's heads adjacent: the source itself when it already is one, else a
// copy (or conversion to fp32) into dst. Returns the block.
const void* pack_rows(const Problem& p, const void* src, int64_t row_ld, int64_t rows,
                      int64_t heads, int64_t head_ld, void* dst) {
  const int64_t d = p.d;
  const bool same_type = p.in_type == DType::kF32 || p.bf16_mm;
  const size_t in_esz = dtype_size(p.in_type), out_esz = same_type ? in_esz : 4;
  if (heads > 1 && head_ld != d) {  // heads apart in memory: one row of d at a time
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < heads; ++g)
        store_elems(p, static_cast<const char*>(src) + (r * row_ld + g * head_ld) * in_esz,
                    static_cast<char*>(dst) + (r * heads + g) * d * out_esz, d);
    return dst;
  }
  const int64_t width = heads * d;
  if (row_ld == width) {  // contiguous rows: the source itself, or one conversion of the block
    if (same_type) return src;
    store_elems(p, src, dst, rows * width);
    return dst;
  }
  for (int64_t r = 0; r < rows; ++r) {
    store_elems(p, static_cast<const char*>(src) + r * row_ld * in_esz,
                static_cast<char*>(dst) + r * width * out_esz, width);
  }
  return dst;
}

// Packs `rows` rows of nhk heads (source row stride src_ld elements; head h at h·head_ld in a
// row) as nhk contiguous (rows, d) blocks of the matmul type, head after head, reading the source
// in memory order (row by row). One head: pack_rows (which may return the source itself).
const void* pack_heads(const Problem& p, const void* src, int64_t src_ld, int64_t rows, int64_t nhk,
                       int64_t head_ld, void* dst) {
  const int64_t d = p.d;
  if (nhk == 1) return pack_rows(p, src, src_ld, rows, 1, head_ld, dst);
  const size_t in_esz = dtype_size(p.in_type);
  const size_t out_esz = p.in_type == DType::kF32 || p.bf16_mm ? in_esz : 4;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < nhk; ++h) {
      store_elems(p, static_cast<const char*>(src) + (r * src_ld + h * head_ld) * in_esz,
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

// Whether d elements of `type` (fp32, bf16 or fp16) hold an Inf or a NaN.
bool any_nonfinite(const Problem& p, DType type, const void* x, int64_t d) {
  switch (type) {
    case DType::kBF16:
      return p.kern->any_nonfinite_bf16(static_cast<const uint16_t*>(x), d);
    case DType::kF16:
      return p.kern->any_nonfinite_f16(static_cast<const uint16_t*>(x), d);
    default:
      return p.kern->any_nonfinite_f32(static_cast<const float*>(x), d);
  }
}

// Makes `block` (bytes, a packed block that may be the caller's input itself) writable by copying
// it into `buf` unless it already lives there; returns the writable block.
char* writable(const void* block, size_t bytes, void* buf) {
  if (block != buf) std::memcpy(buf, block, bytes);
  return static_cast<char*>(buf);
}

// The work item: batch b, kv heads [hk0, hk1), query blocks [qb0, qb1), query heads
// hk·group + [g0, g1) of each kv head hk, key blocks [kb0, kb1). Writes its rows of the state
// (out, lse) over those keys (tiles: see ItemTiles). Items of several kv heads (few query rows:
// decode) read each key block's rows of all heads together, so K/V stream from memory in order
// rather than one head's slice of every row at a time.
struct Item {
  int64_t b, hk0, hk1, qb0, qb1, g0, g1, kb0, kb1;
};

// The tiles of a work item and their accumulators, in per-thread buffers. A tile is
// (query block, kv head, head chunk): tile t has query block qb0 + t / (nhk·ngt), kv head
// hk0 + t / ngt % nhk and head chunk t % ngt; its row r is the state row (token i0(t) + r / gs,
// query head head(t) + r % gs). With p.stack_heads the ng query heads of a kv head share one
// tile (gs = ng), their rows stacked token by token, so each K/V block feeds one matmul of gs
// times the rows instead of gs small ones; else gs = 1.
struct ItemTiles {
  int64_t b, qb0, nqt, hk0, nhk, g0;
  int64_t gs;       // query heads per tile
  int64_t ngt;      // tiles per (query block, kv head): ng / gs
  int64_t tr;       // rows per tile, at most: bq·gs
  int64_t count;    // tiles: nqt·nhk·ngt
  int64_t rp;       // rows of a tile's Qᵀ (few-row matmuls): tr rounded up to small_row_align()
  size_t esz;       // bytes per packed element: 2 (bf16 matmul) or 4
  char* qbuf;       // (count, tr, d) packed Q storage
  const void** q;   // per tile: its Q block (rows, d), in qbuf or the input itself
  float* qt;        // (count, d, rp) Qᵀ per tile (few-row matmuls only, else nullptr)
  uint8_t* qbad;    // (count, tr): the query row holds an Inf or NaN
  uint8_t* poison;  // (count, tr): the row's result is NaN
  float* o;         // (count, tr, d): O, unnormalized
  float* m;         // (count, tr): running max, log2 units
  double* l;        // (count, tr): running sum
  int64_t bq, sq, nh, group;  // the call's (Problem)

  int64_t index(int64_t qt, int64_t h, int64_t gt) const { return (qt * nhk + h) * ngt + gt; }
  int64_t i0(int64_t t) const { return (qb0 + t / (nhk * ngt)) * bq; }
  int64_t head(int64_t t) const { return (hk0 + t / ngt % nhk) * group + g0 + t % ngt * gs; }
  int64_t tokens(int64_t t) const { return std::min(bq, sq - i0(t)); }
  int64_t rows(int64_t t) const { return tokens(t) * gs; }
  int64_t state_row(int64_t t, int64_t r) const {
    return (b * sq + i0(t) + r / gs) * nh + head(t) + r % gs;
  }
};

// Step 0: the item's tiles over the thread's buffers (contents unset).
ItemTiles item_tiles(const Problem& p, const Item& it, Workspace& ws) {
  ItemTiles t{};
  t.bq = p.bq;
  t.sq = p.sq;
  t.nh = p.nh;
  t.group = p.group;
  t.b = it.b;
  t.qb0 = it.qb0;
  t.nqt = it.qb1 - it.qb0;
  t.hk0 = it.hk0;
  t.nhk = it.hk1 - it.hk0;
  t.g0 = it.g0;
  const int64_t ng = it.g1 - it.g0;
  t.gs = p.stack_heads ? ng : 1;
  t.ngt = ng / t.gs;
  t.tr = p.bq * t.gs;
  t.count = t.nqt * t.nhk * t.ngt;
  const int64_t align = simd::small_row_align();
  t.rp = (t.tr + align - 1) / align * align;
  t.esz = p.bf16_mm ? 2 : 4;
  t.qbuf = ws.q.get<char>(t.count * t.tr * p.d * t.esz);
  t.q = ws.qtile.get<const void*>(t.count);
  t.qt = p.small_mm ? ws.qt.get<float>(t.count * p.d * t.rp) : nullptr;
  t.qbad = ws.qbad.get<uint8_t>(t.count * t.tr);
  t.poison = ws.poison.get<uint8_t>(t.count * t.tr);
  t.o = ws.o.get<float>(t.count * t.tr * p.d);
  t.m = ws.m.get<float>(t.count * t.tr);
  t.l = ws.l.get<double>(t.count * t.tr);
  return t;
}

// Step 0: every tile's Q as a contiguous (rows, d) block of the matmul type, a token's gs heads
// adjacent (as they are in a dense q (B, Sq, H, D): then the tile may be q itself); query rows
// with an Inf or NaN flagged in qbad (NaN at the end if they see any key) and zeroed; no row
// poisoned yet.
void pack_q_tiles(const Problem& p, ItemTiles& t) {
  const int64_t d = p.d;
  const size_t in_esz = dtype_size(p.in_type);
  for (int64_t x = 0; x < t.count; ++x) {
    const char* src = p.q + p.qs.at(t.b, t.i0(x), t.head(x)) * in_esz;
    t.q[x] = pack_rows(p, src, p.qs.s, t.tokens(x), t.gs, p.qs.h, t.qbuf + x * t.tr * d * t.esz);
  }
  std::fill_n(t.poison, t.count * t.tr, uint8_t{0});
  for (int64_t x = 0; x < t.count; ++x) {
    const int64_t rows = t.rows(x);
    uint8_t* bad = t.qbad + x * t.tr;
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      bad[r] = any_nonfinite(p, p.mm_type == memory::data_type::bf16 ? DType::kBF16 : DType::kF32,
                             static_cast<const char*>(t.q[x]) + r * d * t.esz, d);
      any = any || bad[r];
    }
    if (!any) continue;
    char* qw = writable(t.q[x], rows * d * t.esz, t.qbuf + x * t.tr * d * t.esz);
    for (int64_t r = 0; r < rows; ++r) {
      if (bad[r]) std::memset(qw + r * d * t.esz, 0, d * t.esz);
    }
    t.q[x] = qw;
  }
}

// Step 0 (few-row matmuls): Qᵀ (d, rp) of every tile, rows past the tile's zero.
void transpose_q_tiles(const Problem& p, ItemTiles& t) {
  const int64_t d = p.d;
  for (int64_t x = 0; x < t.count; ++x) {
    const float* qs = static_cast<const float*>(t.q[x]);
    float* qt = t.qt + x * d * t.rp;
    const int64_t rows = t.rows(x);
    for (int64_t c = 0; c < d; ++c) {
      for (int64_t r = 0; r < rows; ++r) qt[c * t.rp + r] = qs[r * d + c];
      std::fill(qt + c * t.rp + rows, qt + (c + 1) * t.rp, 0.f);
    }
  }
}

// Step 0: O = 0, l = 0, m = -inf; fixed rows (p.row_max) start at their bound and normally stay
// there.
void reset_accumulators(const Problem& p, ItemTiles& t) {
  std::fill_n(t.o, t.count * t.tr * p.d, 0.f);
  std::fill_n(t.m, t.count * t.tr, kNegInf);
  std::fill_n(t.l, t.count * t.tr, 0.0);
  if (p.row_max == nullptr) return;
  for (int64_t x = 0; x < t.count; ++x) {
    for (int64_t r = 0; r < t.rows(x); ++r)
      t.m[x * t.tr + r] = fixed_max_log2(p.row_max[t.state_row(x, r)]);
  }
}

// Step 0 (params.accumulate): the accumulators of the item's rows hold the state `init` over other
// keys, as the online softmax would after those keys: m = lse·log2(e) rounded to fp32, l =
// 2^(lse·log2(e) - m) (in double, so the state keeps its exact weight), O = out·l. Empty rows stay
// empty; rows whose lse is NaN or +inf are poisoned, as merge_into would make them NaN.
void start_from_state(const Problem& p, ItemTiles& t, const OutRows& init) {
  const int64_t d = p.d;
  for (int64_t x = 0; x < t.count; ++x) {
    for (int64_t r = 0; r < t.rows(x); ++r) {
      const int64_t token = t.i0(x) + r / t.gs, head = t.head(x) + r % t.gs, at = x * t.tr + r;
      const float lse = init.lse[init.l.at(t.b, token, head)];
      if (lse == kNegInf) continue;
      const double m = lse * kLog2e;
      if (!std::isfinite(static_cast<float>(m))) {
        t.poison[at] = 1;
        continue;
      }
      t.m[at] = static_cast<float>(m);
      t.l[at] = std::exp2(m - t.m[at]);
      p.kern->scale_copy(init.out + init.o.at(t.b, token, head), static_cast<float>(t.l[at]),
                         t.o + at * d, d);
    }
  }
}

// Step 1: the kind of (query block qb0 + qt, key block kb) for each of the item's query blocks;
// false if every one is skipped (the key block is then never touched).
bool classify_query_blocks(const Problem& p, const ItemTiles& t, int64_t kb,
                           std::vector<BlockKind>& kinds) {
  bool any = false;
  for (int64_t qt = 0; qt < t.nqt; ++qt) {
    kinds[qt] = p.plan->classify(t.b, t.qb0 + qt, kb);
    any = any || kinds[qt] != BlockKind::kSkip;
  }
  return any;
}

// One key block as the item's tiles read it: K and V of its nk keys for the item's nhk kv heads,
// packed or read in place, with what the masks need of its keys.
struct KeyBlock {
  int64_t k0, nk;  // first key, keys
  // K of key j, kv head h (d elements of the matmul type) at k + (h·k_hs + j·k_rs)·esz: packed,
  // nhk blocks (nk, d) head after head (k_rs d, k_hs nk·d), or for the few-row loops key after
  // key, a key's heads adjacent (k_rs nhk·d, k_hs d); in place, the caller's rows.
  const char* k;
  int64_t k_rs, k_hs;
  const char* v;  // the same for V
  int64_t v_rs, v_hs;
  const int64_t* invalid;  // padding keys (block offsets), n_invalid of them
  int64_t n_invalid;
  const int64_t* bad;  // per kv head h: bad[h·bk + x], x < nbad[h], keys with an Inf or NaN
  const int64_t* nbad;
  const int64_t* pos;  // (general mask) position, segment and validity of each key
  const int64_t* seg;
  const uint8_t* valid;

  const void* k_head(int64_t h, size_t esz) const { return k + h * k_hs * esz; }
  const void* v_head(int64_t h, size_t esz) const { return v + h * v_hs * esz; }
};

// The padding keys of the block (offsets into it, for rows whose run comes from positions and
// segments).
void list_padding_keys(const Problem& p, const ItemTiles& t, int64_t kb, KeyBlock& blk,
                       Workspace& ws) {
  int64_t* invalid = ws.invalid.get<int64_t>(p.bk);
  if (!p.plan->keys_all_valid(t.b, kb)) {
    for (int64_t j = 0; j < blk.nk; ++j) {
      if (!p.plan->key_valid(t.b, blk.k0 + j)) invalid[blk.n_invalid++] = j;
    }
  }
  blk.invalid = invalid;
}

// Whether the items read K and V of their key blocks where they are: few query rows (decode),
// where reading K/V is the cost and packing would read and write all of it once more, with fp32
// K/V, or bf16 and fp16 K/V for at most kFewRowsInPlace rows per kv head, which the few-row
// products widen in their loads (more rows broadcast K element by element, where a conversion
// per element is slower than packing: fp16 at 16 rows 2.3x; oneDNN's products on bf16 rows in
// place were slower than on packed blocks).
bool kv_in_place(const Problem& p) {
  return p.small_mm && (p.in_type == DType::kF32 || p.sq * p.group <= kFewRowsInPlace);
}

// K and V of the block, (B, Sk, Hkv, D) -> nhk blocks (nk, d) of the matmul type, packed once for
// all the item's kv heads, reading the rows in memory order; for the few-row loops converted
// key by key in the caller's order (one call per key where its heads are adjacent), or the
// caller's rows themselves (kv_in_place).
void pack_kv(const Problem& p, const ItemTiles& t, KeyBlock& blk, Workspace& ws) {
  const int64_t d = p.d, size = t.nhk * p.bk * d * static_cast<int64_t>(t.esz);
  const size_t in_esz = dtype_size(p.in_type);
  const char* ksrc = p.k + p.ks.at(t.b, blk.k0, t.hk0) * in_esz;
  const char* vsrc = p.v + p.vs.at(t.b, blk.k0, t.hk0) * in_esz;
  if (kv_in_place(p)) {
    blk.k = ksrc;
    blk.v = vsrc;
    blk.k_rs = p.ks.s;
    blk.k_hs = p.ks.h;
    blk.v_rs = p.vs.s;
    blk.v_hs = p.vs.h;
    return;
  }
  if (p.small_mm) {  // converted key by key, a key's heads adjacent
    blk.k = static_cast<const char*>(
        pack_rows(p, ksrc, p.ks.s, blk.nk, t.nhk, p.ks.h, ws.k.get<char>(size)));
    blk.v = static_cast<const char*>(
        pack_rows(p, vsrc, p.vs.s, blk.nk, t.nhk, p.vs.h, ws.v.get<char>(size)));
    blk.k_rs = blk.v_rs = t.nhk * d;
    blk.k_hs = blk.v_hs = d;
    return;
  }
  blk.k = static_cast<const char*>(
      pack_heads(p, ksrc, p.ks.s, blk.nk, t.nhk, p.ks.h, ws.k.get<char>(size)));
  blk.v = static_cast<const char*>(
      pack_heads(p, vsrc, p.vs.s, blk.nk, t.nhk, p.vs.h, ws.v.get<char>(size)));
  blk.k_rs = blk.v_rs = d;
  blk.k_hs = blk.v_hs = blk.nk * d;
}

// Keys with a non-finite K or V element, listed per kv head and zeroed in the packed blocks (a
// block read in place is packed first).
void zero_nonfinite_keys(const Problem& p, const ItemTiles& t, KeyBlock& blk, Workspace& ws) {
  const int64_t d = p.d, bk = p.bk, nhk = t.nhk, nk = blk.nk;
  const size_t esz = dtype_size(p.kv_type);
  int64_t* badk = ws.badk.get<int64_t>(nhk * bk);
  int64_t* nbadk = ws.nbadk.get<int64_t>(nhk);
  // Key after key, each key's heads together: the caller's rows are read in memory order, and
  // where a key's heads are adjacent (read in place) they are checked at once, then one by one
  // only if some element is not finite.
  std::fill(nbadk, nbadk + nhk, 0);
  bool any_bad_key = false;
  const bool heads_adjacent = blk.k_hs == d && blk.v_hs == d;
  for (int64_t j = 0; j < nk; ++j) {
    if (heads_adjacent && !any_nonfinite(p, p.kv_type, blk.k + j * blk.k_rs * esz, nhk * d) &&
        !any_nonfinite(p, p.kv_type, blk.v + j * blk.v_rs * esz, nhk * d)) {
      continue;
    }
    for (int64_t h = 0; h < nhk; ++h) {
      if (any_nonfinite(p, p.kv_type, blk.k + (h * blk.k_hs + j * blk.k_rs) * esz, d) ||
          any_nonfinite(p, p.kv_type, blk.v + (h * blk.v_hs + j * blk.v_rs) * esz, d)) {
        badk[h * bk + nbadk[h]++] = j;
        any_bad_key = true;
      }
    }
  }
  blk.bad = badk;
  blk.nbad = nbadk;
  if (!any_bad_key) return;
  // Writable copies: the block as it is where it already lies in the buffers (packed), else
  // packed head-major into them (the caller's rows, or the caller's block itself).
  auto make_writable = [&](const char*& x, int64_t& rs, int64_t& hs, char* buf) {
    if (x != buf) {
      for (int64_t h = 0; h < nhk; ++h)
        for (int64_t j = 0; j < nk; ++j)
          std::memcpy(buf + (h * nk + j) * d * esz, x + (h * hs + j * rs) * esz, d * esz);
      x = buf;
      rs = d;
      hs = nk * d;
    }
    return buf;
  };
  char* kw = make_writable(blk.k, blk.k_rs, blk.k_hs, ws.k.get<char>(nhk * bk * d * esz));
  char* vw = make_writable(blk.v, blk.v_rs, blk.v_hs, ws.v.get<char>(nhk * bk * d * esz));
  for (int64_t h = 0; h < nhk; ++h) {
    for (int64_t x = 0; x < nbadk[h]; ++x) {
      const int64_t j = badk[h * bk + x];
      std::memset(kw + (h * blk.k_hs + j * blk.k_rs) * esz, 0, d * esz);
      std::memset(vw + (h * blk.v_hs + j * blk.v_rs) * esz, 0, d * esz);
    }
  }
}

// For general masks: the block's keys' positions, segments and validity, gathered once for the
// branch-free mask rows.
void gather_mask_keys(const Problem& p, const ItemTiles& t, KeyBlock& blk, Workspace& ws) {
  int64_t* kpos = ws.kpos.get<int64_t>(p.bk);
  int64_t* kseg = ws.kseg.get<int64_t>(p.bk);
  uint8_t* kvalid = ws.kvalid.get<uint8_t>(p.bk);
  for (int64_t j = 0; j < blk.nk; ++j) {
    kpos[j] = p.plan->kpos(blk.k0 + j);
    kseg[j] = p.plan->kseg(blk.k0 + j);
    kvalid[j] = p.plan->key_valid(t.b, blk.k0 + j);
  }
  blk.pos = kpos;
  blk.seg = kseg;
  blk.valid = kvalid;
}

// Step 1: key block kb as the item's tiles read it (any_general: some tile needs the element
// mask).
KeyBlock load_key_block(const Problem& p, const ItemTiles& t, int64_t kb, bool any_general,
                        Workspace& ws) {
  KeyBlock blk{};
  blk.k0 = kb * p.bk;
  blk.nk = p.plan->block_keys(kb);
  list_padding_keys(p, t, kb, blk, ws);
  pack_kv(p, t, blk, ws);
  zero_nonfinite_keys(p, t, blk, ws);
  if (any_general) gather_mask_keys(p, t, blk, ws);
  return blk;
}

// Which keys of a key block each token of a query block sees, shared by all heads of the item:
// per token (row r < rows of the query block) the run [lo[r], hi[r]) of block keys (full and
// range blocks, padding keys apart) or, for a general block, its row of the element mask
// emask (rows, bk), 1 = visible ([lo, hi) then the whole block).
struct RowMask {
  BlockKind kind;
  int64_t* lo;
  int64_t* hi;
  uint8_t* emask;

  bool sees(const Problem& p, int64_t b, const KeyBlock& blk, int64_t tok, int64_t j) const {
    return kind == BlockKind::kGeneral
               ? emask[tok * p.bk + j] != 0
               : j >= lo[tok] && j < hi[tok] && p.plan->key_valid(b, blk.k0 + j);
  }
};

// Step 1: the mask of (query block starting at token i0, `rows` tokens; key block kb) of `kind`.
void mask_rows(const Problem& p, const KeyBlock& blk, int64_t kb, int64_t i0, int64_t rows,
               RowMask& mask) {
  const int64_t nk = blk.nk;
  if (mask.kind == BlockKind::kGeneral) {
    const bool causal = p.plan->causal();
    for (int64_t r = 0; r < rows; ++r) {
      mask.lo[r] = 0;
      mask.hi[r] = nk;
      const int64_t qp = p.plan->qpos(i0 + r), qs = p.plan->qseg(i0 + r);
      uint8_t* em = mask.emask + r * p.bk;
      for (int64_t j = 0; j < nk; ++j) {
        em[j] =
            static_cast<uint8_t>((!causal || blk.pos[j] <= qp) & (blk.seg[j] == qs) & blk.valid[j]);
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (mask.kind == BlockKind::kFull) {
      mask.lo[r] = 0;
      mask.hi[r] = nk;
    } else {
      p.plan->row_run(i0 + r, kb, &mask.lo[r], &mask.hi[r]);
    }
  }
}

// The few-row products' name for the K/V element type.
simd::KvType kv_elements(const Problem& p) {
  return p.kv_type == DType::kBF16  ? simd::KvType::kBF16
         : p.kv_type == DType::kF16 ? simd::KvType::kF16
                                    : simd::KvType::kF32;
}

// The products of a full tile (tr rows) with key block blk, their B in the layout oneDNN picks.
MatmulShape blocked_qk_shape(const Problem& p, const ItemTiles& t, const KeyBlock& blk) {
  return {t.tr, blk.nk, p.d, p.d, 1, blk.k_rs, p.ld_s, p.mm_type, false, true};
}
MatmulShape blocked_pv_shape(const Problem& p, const ItemTiles& t, const KeyBlock& blk) {
  return {t.tr, p.d, blk.nk, p.ld_s, blk.v_rs, 1, p.d, p.mm_type, true, true};
}

// A key block's K and V per kv head in the layout of the full tiles' products (nhk blocks of
// k_bytes and v_bytes), or k = v = nullptr: every product reads the packed blocks. With K in
// that layout, oneDNN no longer copies it out of its transposed one on each Q·Kᵀ, and P·V reads
// V in column blocks rather than rows d apart (fp32 256 × 512 × 128 one thread here: 1.05x
// and 1.15x the products' rate, the copies 7 us against about 190 us a product; docs/kernel.md "Key
// blocks in oneDNN's layout").
struct BlockedKv {
  const char* k = nullptr;
  const char* v = nullptr;
  size_t k_bytes = 0, v_bytes = 0;
};

// Step 1: BlockedKv of key block blk, for `uses` full tiles per kv head reading it; copied only
// for kMinBlockedKvUses or more (the copies cost about what 2-3 tiles' products gain).
BlockedKv block_kv(const Problem& p, const ItemTiles& t, const KeyBlock& blk, int64_t uses,
                   Workspace& ws) {
  if (!p.blocked_kv || uses < kMinBlockedKvUses) return {};
  MatmulCache& mm = thread_matmul_cache();
  const MatmulShape qk = blocked_qk_shape(p, t, blk), pv = blocked_pv_shape(p, t, blk);
  BlockedKv out;
  out.k_bytes = mm.blocked_b_bytes(qk);
  out.v_bytes = mm.blocked_b_bytes(pv);
  char* k = ws.kblocked.get<char>(static_cast<int64_t>(t.nhk * out.k_bytes));
  char* v = ws.vblocked.get<char>(static_cast<int64_t>(t.nhk * out.v_bytes));
  const size_t esz = dtype_size(p.kv_type);
  for (int64_t h = 0; h < t.nhk; ++h) {
    mm.pack_b(qk, blk.k_head(h, esz), k + h * out.k_bytes);
    mm.pack_b(pv, blk.v_head(h, esz), v + h * out.v_bytes);
  }
  out.k = k;
  out.v = v;
  return out;
}

// Step 1, per tile: S = Q·Kᵀ, (rows, d) · (nk, d)ᵀ -> s (rows, nk), row stride ld_s; K of kv
// head h from bkv for a full tile where it has it, else from blk.
void tile_scores(const Problem& p, const ItemTiles& t, int64_t x, int64_t rows, int64_t h,
                 const KeyBlock& blk, const BlockedKv& bkv, float* s) {
  const void* kblk = blk.k_head(h, dtype_size(p.kv_type));
  if (p.small_mm) {
    p.kern->small_qk(static_cast<const float*>(t.q[x]), t.qt + x * p.d * t.rp, t.rp, rows, kblk,
                     kv_elements(p), blk.k_rs, blk.nk, p.d, s, p.ld_s);
    return;
  }
  if (bkv.k != nullptr && rows == t.tr) {
    thread_matmul_cache().run(blocked_qk_shape(p, t, blk), t.q[x], bkv.k + h * bkv.k_bytes, s);
    return;
  }
  MatmulShape qk{rows, blk.nk, p.d, p.d, 1, blk.k_rs, p.ld_s, p.mm_type, false};
  thread_matmul_cache().run(qk, t.q[x], kblk, s);
}

// Step 1, per tile, its rows [r0, r1): the mask applied to S (row r at s + (r - r0)·ld_s; masked
// scores -inf), then per row the online softmax update of m, l and O with a stale running max; P
// written over S (fp32) or to p16 (rows as s's) (bf16 matmul).
void tile_softmax(const Problem& p, ItemTiles& t, int64_t x, int64_t r0, int64_t r1,
                  const KeyBlock& blk, const RowMask& mask, float* s, uint16_t* p16) {
  const int64_t nk = blk.nk, d = p.d;
  float* o = t.o + x * t.tr * d;
  float* m = t.m + x * t.tr;
  double* l = t.l + x * t.tr;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t tok = r / t.gs;  // the row's token within the query block
    float* srow = s + (r - r0) * p.ld_s;
    if (mask.kind == BlockKind::kGeneral) {
      const uint8_t* em = mask.emask + tok * p.bk;
      for (int64_t j = 0; j < nk; ++j) srow[j] = em[j] ? srow[j] : kNegInf;
    } else {
      for (int64_t i = 0; i < blk.n_invalid; ++i) srow[blk.invalid[i]] = kNegInf;
    }
    if (p.bf16_mm) {
      p.kern->row_update_bf16_deg3(srow, p16 + (r - r0) * p.ld_s, mask.lo[tok], mask.hi[tok], nk,
                                   p.c, m + r, l + r, o + r * d, d);
    } else {
      p.row_update(srow, mask.lo[tok], mask.hi[tok], nk, p.c, m + r, l + r, o + r * d, d);
    }
  }
}

// Step 1, per tile: O += P·V, (rows, nk) · (nk, d) -> O (rows, d); P is s (fp32) or p16 (bf16); V
// of kv head h from bkv for a full tile where it has it, else from blk.
void tile_pv(const Problem& p, ItemTiles& t, int64_t x, int64_t rows, int64_t h,
             const KeyBlock& blk, const BlockedKv& bkv, const float* s, const uint16_t* p16) {
  float* o = t.o + x * t.tr * p.d;
  const void* vblk = blk.v_head(h, dtype_size(p.kv_type));
  if (p.small_mm) {
    p.kern->small_pv(s, p.ld_s, rows, vblk, kv_elements(p), blk.v_rs, blk.nk, p.d, o);
    return;
  }
  const void* a = p.bf16_mm ? static_cast<const void*>(p16) : s;
  if (bkv.v != nullptr && rows == t.tr) {
    thread_matmul_cache().run(blocked_pv_shape(p, t, blk), a, bkv.v + h * bkv.v_bytes, o);
    return;
  }
  MatmulShape pv{rows, p.d, blk.nk, p.ld_s, blk.v_rs, 1, p.d, p.mm_type, true};
  thread_matmul_cache().run(pv, a, vblk, o);
}

// A key block's K and V per kv head as the panel products read them (p.panels): nhk blocks of
// k_size floats (Kᵀ, d × nk) and v_size floats (V, nk × d) in panels.
struct PanelKv {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t k_size = 0, v_size = 0;
};

// Step 1 (p.panels): PanelKv of key block blk, packed once for all the item's tiles.
PanelKv panel_kv(const Problem& p, const ItemTiles& t, const KeyBlock& blk, Workspace& ws) {
  const int64_t w = p.kern->panel_width, d = p.d, nk = blk.nk;
  const size_t esz = dtype_size(p.kv_type);  // fp32
  PanelKv out;
  out.k_size = (nk + w - 1) / w * w * d;
  out.v_size = nk * ((d + w - 1) / w * w);
  float* k = ws.kblocked.get<float>(t.nhk * out.k_size);
  float* v = ws.vblocked.get<float>(t.nhk * out.v_size);
  for (int64_t h = 0; h < t.nhk; ++h) {
    p.kern->pack_panels_t(static_cast<const float*>(blk.k_head(h, esz)), blk.k_rs, d, nk,
                          k + h * out.k_size);
    p.kern->pack_panels(static_cast<const float*>(blk.v_head(h, esz)), blk.v_rs, nk, d,
                        v + h * out.v_size);
  }
  out.k = k;
  out.v = v;
  return out;
}

// Step 1, per tile (p.panels): S = Q·Kᵀ, the mask and online softmax, and O += P·V, kPanelStrip
// rows at a time, so that a strip's scores (in s) stay in cache from one step to the next. Only
// the keys some row of the strip sees are multiplied: from the panel holding the strip's first
// run start to its last run end (the softmax reads no score outside a row's run, and a P·V term
// left out is one of P's zeros); on a causal diagonal block, a staircase of strips.
void tile_by_panels(const Problem& p, ItemTiles& t, int64_t x, int64_t rows, int64_t h,
                    const KeyBlock& blk, const PanelKv& pkv, const RowMask& mask, float* s) {
  const int64_t d = p.d, w = p.kern->panel_width;
  const float* q = static_cast<const float*>(t.q[x]);
  const float* k = pkv.k + h * pkv.k_size;
  const float* v = pkv.v + h * pkv.v_size;
  float* o = t.o + x * t.tr * d;
  for (int64_t r0 = 0; r0 < rows; r0 += kPanelStrip) {
    const int64_t r1 = std::min(rows, r0 + kPanelStrip);
    int64_t c0 = 0, c1 = blk.nk;  // the keys the strip's rows see
    if (mask.kind != BlockKind::kGeneral) {
      c0 = blk.nk;
      c1 = 0;
      for (int64_t tok = r0 / t.gs; tok <= (r1 - 1) / t.gs; ++tok) {
        if (mask.lo[tok] >= mask.hi[tok]) continue;
        c0 = std::min(c0, mask.lo[tok]);
        c1 = std::max(c1, mask.hi[tok]);
      }
      c0 = c0 / w * w;
    }
    if (c0 < c1) {
      p.kern->panel_product(q + r0 * d, d, r1 - r0, k + c0 * d, d, d * w, c1 - c0, s + c0, p.ld_s,
                            false);
    }
    tile_softmax(p, t, x, r0, r1, blk, mask, s, nullptr);
    if (c0 < c1) {
      p.kern->panel_product(s + c0, p.ld_s, r1 - r0, v + c0 * w, c1 - c0, blk.nk * w, d, o + r0 * d,
                            d, true);
    }
  }
}

// Step 1, per tile: rows that see a key with a non-finite K or V (of kv head h of the item), or
// have a non-finite query and see any key, are poisoned (NaN at the end).
void poison_tile_rows(const Problem& p, ItemTiles& t, int64_t x, int64_t rows, int64_t h,
                      const KeyBlock& blk, const RowMask& mask) {
  const int64_t nbad = blk.nbad[h];
  const int64_t* bad = blk.bad + h * p.bk;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t& pr = t.poison[x * t.tr + r];
    const bool bad_q = t.qbad[x * t.tr + r];
    if (pr || (nbad == 0 && !bad_q)) continue;
    const int64_t tok = r / t.gs;
    if (bad_q) {
      for (int64_t j = 0; j < blk.nk && !pr; ++j) pr = mask.sees(p, t.b, blk, tok, j);
    } else {
      for (int64_t i = 0; i < nbad && !pr; ++i) pr = mask.sees(p, t.b, blk, tok, bad[i]);
    }
  }
}

// Step 2: out (B, Sq, H, D) = O / l and lse (B, Sq, H) = (m + log2 l)·ln 2 for the item's rows;
// rows that saw no key stay empty (out 0, lse -inf), poisoned rows and rows whose running max
// is +inf or NaN are NaN. Fixed rows: row_sum (l relative to the bound) and row_flags.
void write_rows(const Problem& p, const ItemTiles& t, const OutRows& dst, float* row_sum,
                uint8_t* row_flags) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  const int64_t d = p.d;
  for (int64_t x = 0; x < t.count; ++x) {
    for (int64_t r = 0; r < t.rows(x); ++r) {
      const double l = t.l[x * t.tr + r];
      const int64_t row = t.state_row(x, r);  // of the dense (B, Sq, H) row_max, row_sum, ...
      const int64_t token = t.i0(x) + r / t.gs, head = t.head(x) + r % t.gs;
      float* out = dst.out + dst.o.at(t.b, token, head);
      float& lse = dst.lse[dst.l.at(t.b, token, head)];
      // NaN for a row that saw a non-finite input, or whose running max is +inf or NaN (logits
      // of finite inputs that overflow fp32: 2^(inf - inf), as IEEE arithmetic would have it).
      const float mr = t.m[x * t.tr + r];
      if (t.poison[x * t.tr + r] || std::isnan(mr) ||
          mr == std::numeric_limits<float>::infinity()) {
        std::fill_n(out, d, kNaN);
        lse = kNaN;
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
          if (row_sum != nullptr)
            row_sum[row] = static_cast<float>(mr == m0 ? l : l * std::exp2(double(mr) - m0));
          if (row_flags != nullptr && mr != m0) row_flags[row] |= AttnParams::kRowMaxExceeded;
        }
      }
      if (!(l > 0)) {  // saw no key: empty (out 0, lse -inf)
        std::fill_n(out, d, 0.f);
        lse = kNegInf;
        continue;
      }
      p.kern->scale_copy(t.o + (x * t.tr + r) * d, static_cast<float>(1.0 / l), out, d);
      lse = static_cast<float>(mr * kLn2 + std::log(l));
    }
  }
}

// The item's rows of the state over its key blocks (the steps at the top of this file), starting
// from the state `init` where given (params.accumulate). With p.row_max, also writes row_sum and
// row_flags (kRowMaxExceeded only) of its fixed rows.
void run_item(const Problem& p, const Item& it, const OutRows* init, const OutRows& dst,
              float* row_sum, uint8_t* row_flags, Workspace& ws, bool calling_thread) {
  // Step 0: the tiles' Q packed, the accumulators reset.
  ItemTiles tiles = item_tiles(p, it, ws);
  pack_q_tiles(p, tiles);
  if (p.small_mm) transpose_q_tiles(p, tiles);
  reset_accumulators(p, tiles);
  if (init != nullptr) start_from_state(p, tiles, *init);

  // Per-thread scratch of one (tile, key block): S (tr, ld_s), P as bf16 (tr, ld_s), each
  // token's run of keys and element mask (bq, bk).
  float* s = ws.s.get<float>(tiles.tr * p.ld_s);
  uint16_t* p16 = p.bf16_mm ? ws.p16.get<uint16_t>(tiles.tr * p.ld_s) : nullptr;
  RowMask mask{BlockKind::kSkip, ws.lo.get<int64_t>(p.bq), ws.hi.get<int64_t>(p.bq),
               ws.emask.get<uint8_t>(p.bq * p.bk)};
  std::vector<BlockKind> kinds(static_cast<size_t>(tiles.nqt));

  // Step 1: walk the key blocks.
  for (int64_t kb = it.kb0; kb < it.kb1; ++kb) {
    if (!classify_query_blocks(p, tiles, kb, kinds)) continue;  // every tile skips it
    const bool any_general =
        std::find(kinds.begin(), kinds.end(), BlockKind::kGeneral) != kinds.end();
    const KeyBlock blk = load_key_block(p, tiles, kb, any_general, ws);
    int64_t full_tiles = 0;  // per kv head
    for (int64_t qt = 0; qt < tiles.nqt; ++qt) {
      full_tiles += kinds[qt] != BlockKind::kSkip && tiles.rows(tiles.index(qt, 0, 0)) == tiles.tr;
    }
    const BlockedKv bkv = block_kv(p, tiles, blk, full_tiles * tiles.ngt, ws);  // not with panels
    const PanelKv pkv = p.panels ? panel_kv(p, tiles, blk, ws) : PanelKv{};
    for (int64_t qt = 0; qt < tiles.nqt; ++qt) {
      mask.kind = kinds[qt];
      if (mask.kind == BlockKind::kSkip) continue;
      const int64_t i0 = (tiles.qb0 + qt) * p.bq, tokens = std::min(p.bq, p.sq - i0);
      mask_rows(p, blk, kb, i0, tokens, mask);
      const int64_t rows = tokens * tiles.gs;
      for (int64_t h = 0; h < tiles.nhk; ++h) {
        for (int64_t gt = 0; gt < tiles.ngt; ++gt) {
          const int64_t x = tiles.index(qt, h, gt);
          if (p.panels) {
            tile_by_panels(p, tiles, x, rows, h, blk, pkv, mask, s);  // S, P, O += P·V
            poison_tile_rows(p, tiles, x, rows, h, blk, mask);
            continue;
          }
          tile_scores(p, tiles, x, rows, h, blk, bkv, s);      // S = Q·Kᵀ
          tile_softmax(p, tiles, x, 0, rows, blk, mask, s, p16);  // mask, online softmax: P
          tile_pv(p, tiles, x, rows, h, blk, bkv, s, p16);     // O += P·V
          poison_tile_rows(p, tiles, x, rows, h, blk, mask);   // non-finite inputs
        }
      }
    }
    if (calling_thread && *p.progress) (*p.progress)();
  }

  // Step 2: normalize and write out (B, Sq, H, D) and lse (B, Sq, H).
  write_rows(p, tiles, dst, row_sum, row_flags);
}

Workspace& thread_workspace() {
  thread_local Workspace ws;
  return ws;
}

}  // namespace

namespace {

// The state's shapes for these inputs; InvalidArgument when out or lse is not one.
void check_outputs(const TensorView& q, const MutableTensorView& out,
                   const MutableTensorView& lse) {
  const std::vector<int64_t> o = q.shape(), l = {q.dim(0), q.dim(1), q.dim(2)};
  SEQPAR_ARG_CHECK(out.shape() == o && out.dtype() == DType::kF32 && out.stride(3) == 1,
                   "attention out is ", out.shape_str(), " ", dtype_name(out.dtype()),
                   " with head_dim stride ", out.ndim() == 4 ? out.stride(3) : 0,
                   "; valid: ", shape_text(o), " fp32 with head_dim stride 1");
  SEQPAR_ARG_CHECK(lse.shape() == l && lse.dtype() == DType::kF32, "attention lse is ",
                   lse.shape_str(), " ", dtype_name(lse.dtype()), "; valid: ", shape_text(l),
                   " fp32");
}

}  // namespace

AttnState flash_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttnParams& params) {
  validate_attention_inputs(q, k, v, params.mask);
  // Every row is written (an empty call writes the empty state): no zero fill first.
  AttnState st{Tensor::uninitialized(q.shape()),
               Tensor::uninitialized({q.dim(0), q.dim(1), q.dim(2)})};
  flash_attention_into(q, k, v, params, st.out, st.lse);
  return st;
}

void flash_attention_into(const TensorView& q_in, const TensorView& k_in, const TensorView& v_in,
                          const AttnParams& params, const MutableTensorView& out,
                          const MutableTensorView& lse_out) {
  trace::Scope span("attention", "kernel", trace::Lane::kCompute);  // --trace: one kernel call
  span.arg("queries", q_in.ndim() == 4 ? q_in.dim(1) : 0);
  span.arg("keys", k_in.ndim() == 4 ? k_in.dim(1) : 0);
  validate_attention_inputs(q_in, k_in, v_in, params.mask);
  check_outputs(q_in, out, lse_out);
  Tensor q_keep, k_keep, v_keep;
  // The kernel packs its blocks from any row and head strides; only head_dim must be dense.
  const TensorView q = q_in.last_dim_dense(q_keep), k = k_in.last_dim_dense(k_keep),
                   v = v_in.last_dim_dense(v_keep);
  Problem p{};
  p.q = static_cast<const char*>(q.raw());
  p.k = static_cast<const char*>(k.raw());
  p.v = static_cast<const char*>(v.raw());
  p.qs = strides_of(q);
  p.ks = strides_of(k);
  p.vs = strides_of(v);
  p.nb = q.dim(0);
  p.sq = q.dim(1);
  p.nh = q.dim(2);
  p.d = q.dim(3);
  p.sk = k.dim(1);
  p.nkv = k.dim(2);
  p.group = p.nh / p.nkv;
  const OutRows dst_rows{out.mutable_data<float>(), lse_out.mutable_data<float>(), strides_of(out),
                         strides_of(lse_out)};

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
    for (int64_t i = 0; i < n_rows; ++i) {
      const float m = params.row_max[i];
      if (fixed_max_log2(m) == kNegInf) continue;  // online row
      const float lse = dst_rows.lse[dst_rows.l.at(i / (p.sq * p.nh), i / p.nh % p.sq, i % p.nh)];
      if (!(m - lse <= AttnParams::kRowMaxLooseLimit))  // also lse = -inf (sum 0)
        params.row_flags[i] |= AttnParams::kRowMaxLoose;
    }
  };
  SEQPAR_ARG_CHECK(!(params.accumulate && fixed),
                   "accumulate with row_max: valid: one or the other (a fixed row maximum adds "
                   "row sums instead)");
  if (p.nb == 0 || p.sq == 0 || p.sk == 0) {  // the empty state: out 0, lse -inf
    if (params.accumulate) return;            // no keys: the state stays as it is
    const AttnState empty = AttnState::empty(p.nb, p.sq, p.nh, p.d);
    out.copy_from(empty.out);
    lse_out.copy_from(empty.lse);
    flag_loose_rows();
    return;
  }

  SEQPAR_ARG_CHECK(std::isfinite(params.scale) && params.scale >= 0.f, "attention scale ",
                   params.scale, " is invalid; valid: > 0 (or 0 for 1/sqrt(head_dim))");
  SEQPAR_ARG_CHECK(params.block_q >= 0 && params.block_k >= 0, "block sizes (", params.block_q,
                   ", ", params.block_k, ") are invalid; valid: >= 1, or 0 for the default");
  const double scale = params.scale != 0.f ? params.scale : 1.0 / std::sqrt(double(p.d));
  p.c = static_cast<float>(scale * 1.44269504088896340736);  // log2(e)
  p.in_type = q.dtype();
  // Few query rows per kv head (decode): reading K/V from memory is the cost, so an item takes
  // every kv head and walks the key blocks in memory order (one head's slice of every row, 2·D
  // bytes every 2·Hkv·D, streams at a fraction of the bandwidth); threads split the keys.
  const bool stream_kv = p.sq * p.group <= kStreamRows;
  // bf16 takes oneDNN's bf16 matmul where it runs, except for at most kFewRowsInPlace rows per kv
  // head (one new token): the few-row loops on K/V in place read half the bytes of fp32 there.
  const bool few_rows = stream_kv && p.sq * p.group <= kFewRowsInPlace && use_small_matmuls();
  p.bf16_mm = p.in_type == DType::kBF16 && use_bf16_matmul() && !few_rows;
  p.mm_type = p.bf16_mm ? memory::data_type::bf16 : memory::data_type::f32;
  p.stack_heads = stream_kv;
  p.small_mm = stream_kv && !p.bf16_mm && use_small_matmuls();
  p.kern = &simd::kernels();
  p.panels = !p.small_mm && !p.bf16_mm && use_panels(*p.kern);
  p.blocked_kv = !p.small_mm && !p.panels && use_blocked_kv();
  p.kv_type = kv_in_place(p) ? p.in_type : p.bf16_mm ? DType::kBF16 : DType::kF32;
  p.bq = params.block_q > 0 ? params.block_q : kDefaultBlockQ;
  // The default key block: with K/V read in place, about kInPlaceBlockBytes of K and V; else
  // kUnmaskedBlockK for fp32 products no mask cuts, kDefaultBlockK for the rest.
  const bool masked = params.mask.causal || !params.mask.q_segment.empty();
  const int64_t default_bk =
      p.small_mm ? std::clamp<int64_t>(
                       kInPlaceBlockBytes / (2 * p.nkv * p.d * int64_t(dtype_size(p.kv_type))), 16,
                       kMaxInPlaceBlockK)
      : p.bf16_mm || masked ? kDefaultBlockK
                            : kUnmaskedBlockK;
  p.bk = params.block_k > 0 ? params.block_k : default_bk;
  p.bq = std::min(p.bq, p.sq);
  p.bk = std::min(p.bk, p.sk);
  p.ld_s = simd::round_up_row(p.bk);
  p.nqb = (p.sq + p.bq - 1) / p.bq;
  p.nkb = (p.sk + p.bk - 1) / p.bk;
  // The degree-5 exp2 polynomial for fp32, and for 16-bit K/V read in place (their products are
  // fp32 on the stored values, and the call is bound by reading K/V); degree 3 for the rest.
  p.row_update = p.in_type == DType::kF32 || kv_in_place(p) ? p.kern->row_update_deg5
                                                            : p.kern->row_update_deg3;
  const MaskPlan plan(params.mask, p.nb, p.sq, p.sk, p.bq, p.bk);
  p.plan = &plan;
  p.progress = &params.progress;
  p.row_max = fixed ? params.row_max.data() : nullptr;

  // Work items: (b, kv heads, head sub-group, chunk of query blocks). Big chunks amortize the K/V
  // packing; halve them until there are a few items per thread. With still fewer items than
  // threads (decode, short queries), the key blocks are split too: each split yields a partial
  // state and the partials are merged by LSE (merge_into), like ring steps.
  const int64_t threads = loop_threads();
  const int64_t hk_per_item = stream_kv ? p.nkv : 1;
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
  // With key splits the first split's state is dense too, merged with the others and then
  // written out; else the items write the caller's rows directly.
  AttnState first = n_ksplits > 1 ? AttnState::empty(p.nb, p.sq, p.nh, p.d) : AttnState{};
  auto dense_rows_of = [&](AttnState& st) {
    return OutRows{st.out.data<float>(), st.lse.data<float>(), strides_of(st.out),
                   strides_of(st.lse)};
  };
  std::vector<OutRows> split_rows{n_ksplits > 1 ? dense_rows_of(first) : dst_rows};
  for (AttnState& ps : partial) split_rows.push_back(dense_rows_of(ps));
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
    float* sum = params.row_sum.empty() ? nullptr
                 : ks == 0              ? params.row_sum.data()
                                        : split_sum.data() + (ks - 1) * n_rows;
    uint8_t* flags = params.row_flags.empty() ? nullptr
                     : ks == 0                ? params.row_flags.data()
                                              : split_flags.data() + (ks - 1) * n_rows;
    // With accumulate, the first key split starts from the caller's state (read before written:
    // each item owns its rows); the others start empty and merge into it.
    const OutRows* init = params.accumulate && ks == 0 ? &dst_rows : nullptr;
    run_item(p, it, init, split_rows[ks], sum, flags, thread_workspace(), calling_thread);
  };

  // Key splits: merged into the first, written to the caller's rows.
  auto finish = [&] {
    if (n_ksplits > 1) {
      for (const AttnState& ps : partial) merge_into(first, ps);
      out.copy_from(first.out);
      lse_out.copy_from(first.lse);
    }
    for (size_t x = 0; x < split_sum.size(); ++x) params.row_sum[x % n_rows] += split_sum[x];
    for (size_t x = 0; x < split_flags.size(); ++x) params.row_flags[x % n_rows] |= split_flags[x];
    flag_loose_rows();
  };
  if (threads == 1 || n_items == 1) {
    for (int64_t it = 0; it < n_items; ++it) run(it, true);
    finish();
    return;
  }
  const std::thread::id caller = std::this_thread::get_id();
  parallel_for(n_items, [&](int64_t it) { run(it, std::this_thread::get_id() == caller); });
  finish();
}

void flash_attention_fold(AttnState& state, const TensorView& q, const TensorView& k,
                          const TensorView& v, AttnParams params) {
  params.accumulate = true;
  flash_attention_into(q, k, v, params, state.out, state.lse);
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
    std::string s = detail::concat(
        "blockwise flash attention (Bq ", kDefaultBlockQ, ", Bk ", kDefaultBlockK, "; ",
        kUnmaskedBlockK, " in fp32 without a causal or segment mask); softmax ",
        simd::isa_name(simd::kernels().isa),
        " (exp2 poly deg 5 for fp32 and 16-bit K/V read in place, deg 3 for other bf16/fp16); ",
        use_panels(simd::kernels())
            ? detail::concat("fp32 products of query tiles: panel products ",
                             simd::isa_name(simd::kernels().isa), " (tiles of 6 rows x ",
                             simd::kernels().panel_width, " columns, strips of ", kPanelStrip,
                             " rows, the keys a strip sees); ")
            : std::string(),
        "oneDNN ", ver->major, ".", ver->minor, ".", ver->patch, " matmul ", mm, " fp32",
        use_blocked_kv() ? detail::concat(", K/V copied into its layout where ", kMinBlockedKvUses,
                                          " or more full (query block, head) tiles read them")
                         : std::string(", K/V read as packed (SEQPAR_KERNEL_BLOCKED_KV=0)"));
    if (use_bf16_matmul()) {
      std::string bf = "?";
      try {
        bf = make_matmul_pd({256, 256, 128, 128, 1, 128, 256, memory::data_type::bf16, false})
                 .impl_info_str();
      } catch (const dnnl::error&) {
      }
      s += "; bf16 inputs: oneDNN bf16 matmul " + bf;
      if (simd::kernels().p_rounded_by_avx512_bf16) s += ", P rounded to bf16 by vcvtneps2bf16";
    } else {
      s += "; bf16/fp16 inputs: converted to fp32 per block (no avx512_bf16/AMX matmul)";
    }
    s += detail::concat(
        "; decode shapes (Sq x H/Hkv <= ", kStreamRows,
        "): all kv heads per item in memory order, few-row FMA loops",
        use_bf16_matmul()
            ? detail::concat(" (fp32/fp16 inputs; bf16 up to ", kFewRowsInPlace, " rows a kv head)")
            : std::string(),
        ", K/V read in place (fp32; bf16/fp16 up to ", kFewRowsInPlace,
        " rows a kv head; key blocks of ", kInPlaceBlockBytes / 1024, " KiB of K and V)");
    return s;
  }();
  return info;
}

}  // namespace seqpar
