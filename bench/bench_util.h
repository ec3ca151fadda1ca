// What the benchmark programs share: argument parsing helpers, a timing loop and a cached oneDNN
// fp32 matmul (the GEMM rate the kernels are compared with); random inputs: seqpar::random_normal.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "seqpar/core/cpu_isa.h"
#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "seqpar/core/tensor.h"
#include "seqpar/core/timer.h"

namespace seqpar::bench {

// Prints "<program>: <msg>" on stderr and exits with 2 (bad arguments).
[[noreturn]] inline void usage_error(const char* program, const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", program, msg.c_str());
  std::exit(2);
}

// "1024,4096" -> {1024, 4096}; anything but positive integers is a usage error.
inline std::vector<int64_t> parse_list(const char* program, const std::string& flag,
                                       const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      v.push_back(std::stoll(item, &used));
      if (used != item.size() || v.back() <= 0) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      usage_error(program,
                  flag + " '" + s + "' is invalid; valid: positive integers, comma separated");
    }
  }
  if (v.empty()) {
    usage_error(program, flag + " is empty; valid: positive integers, comma separated");
  }
  return v;
}

// One positive integer; a list or anything else is a usage error.
inline int64_t parse_one(const char* program, const std::string& flag, const std::string& v) {
  const std::vector<int64_t> list = parse_list(program, flag, v);
  if (list.size() != 1)
    usage_error(program, flag + " '" + v + "' is invalid; valid: one positive integer");
  return list[0];
}

// A --dtype value (fp32, bf16, fp16); anything else is a usage error.
inline DType parse_dtype_arg(const char* program, const std::string& v) {
  try {
    return parse_dtype(v);
  } catch (const InvalidArgument& e) {
    usage_error(program, e.what());
  }
}

// A --min-time value in seconds (> 0); anything else is a usage error.
inline double parse_min_time(const char* program, const std::string& v) {
  const double t = std::atof(v.c_str());
  if (!(t > 0)) usage_error(program, "--min-time '" + v + "' is invalid; valid: > 0");
  return t;
}

// Seconds per call of f: repeated until min_time has passed (at least once).
inline double time_per_call(const std::function<void()>& f, double min_time) {
  int calls = 0;
  const double t0 = now_seconds();
  double t = 0;
  do {
    f();
    ++calls;
    t = now_seconds() - t0;
  } while (t < min_time);
  return t / calls;
}

// Two ways of making one call compared in one process: call(true) and call(false) each return
// the seconds of one call; after a warm-up of both, `rounds` rounds of one of each, alternating
// which goes first. Per way, the median seconds; per round, the ratio false / true (> 1: the
// true way faster), sorted.
struct Alternated {
  double with, without;        // median seconds
  std::vector<double> ratios;  // sorted
};
inline Alternated alternate(int64_t rounds, const std::function<double(bool)>& call) {
  (void)call(true);
  (void)call(false);
  std::vector<double> with, without, ratio;
  for (int64_t r = 0; r < rounds; ++r) {
    const bool first = r % 2 == 0;
    const double a = call(first), b = call(!first);
    with.push_back(first ? a : b);
    without.push_back(first ? b : a);
    ratio.push_back(without.back() / with.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::sort(ratio.begin(), ratio.end());
  return {median(with), median(without), ratio};
}

// The table row "| label | work / with | work / without | ratio min | median | max |".
inline void print_alternated(const std::string& label, double work, const Alternated& a) {
  std::printf("| %s | %.1f | %.1f | %.2f | %.2f | %.2f |\n", label.c_str(), work / a.with,
              work / a.without, a.ratios.front(), a.ratios[a.ratios.size() / 2], a.ratios.back());
  std::fflush(stdout);
}

// A cached fp32 matmul C (m × n) [+]= A (m × k) · B (k × n), B with strides (ldb_k, ldb_n);
// single-threaded when run inside a parallel region.
class Gemm {
 public:
  // in: the type of A and B (f32, or bf16 as the attention kernel's bf16 matmul takes them: bf16
  // A and B, fp32 C); C is fp32 either way.
  Gemm(int64_t m, int64_t n, int64_t k, int64_t ldb_k, int64_t ldb_n, bool accumulate,
       dnnl::memory::data_type in = dnnl::memory::data_type::f32)
      : m_(m), n_(n), k_(k), eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {
    using dnnl::memory;
    const memory::desc a_md({m, k}, in, memory::dims{k, 1});
    const memory::desc b_md({k, n}, in, memory::dims{ldb_k, ldb_n});
    const memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{n, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.f);
      attr.set_post_ops(ops);
    }
    const auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng_);
    impl_ = pd.impl_info_str();
    prim_ = dnnl::matmul(pd);
    const bool bf16 = in == memory::data_type::bf16;
    const auto fill = [bf16](std::vector<float>& v, int64_t n, float x) {
      if (!bf16) return v.assign(n, x);
      uint32_t bits;  // x rounded to bf16 (these constants are exact in it), two to a float
      std::memcpy(&bits, &x, 4);
      const uint32_t pair = (bits >> 16) | (bits & 0xffff0000u);
      float f;
      std::memcpy(&f, &pair, 4);
      v.assign((n + 1) / 2, f);
    };
    fill(a_, m * k, 0.01f);
    fill(b_, k * n, 0.02f);
    c_.assign(m * n, 0.f);
    am_ = memory(a_md, eng_, a_.data());
    bm_ = memory(b_md, eng_, b_.data());
    cm_ = memory(c_md, eng_, c_.data());
  }
  // The square n × n × n GEMM, row-major.
  explicit Gemm(int64_t n, dnnl::memory::data_type in = dnnl::memory::data_type::f32)
      : Gemm(n, n, n, n, 1, false, in) {}

  void run() {
    prim_.execute(strm_, {{DNNL_ARG_SRC, am_}, {DNNL_ARG_WEIGHTS, bm_}, {DNNL_ARG_DST, cm_}});
  }
  double flops() const { return 2.0 * m_ * n_ * k_; }
  const std::string& impl() const { return impl_; }

 private:
  int64_t m_, n_, k_;
  dnnl::engine eng_;
  dnnl::stream strm_;
  dnnl::matmul prim_;
  std::string impl_;
  std::vector<float> a_, b_, c_;  // A and B hold two bf16 values per float when in is bf16
  dnnl::memory am_, bm_, cm_;
};

// One thread's sum of n 64-bit words, in the vectors of the kernels' ISA (kernel_isa()). The
// loads' width sets the rate on a Xeon core: 11 GB/s with 16-byte loads (the compiler's SSE2
// without -m flags), 15.7 with AVX-512's 64-byte ones (docs/performance.md section 37; likely
// the loads a core holds in flight, four a cache line at 16 bytes). Four accumulators keep the
// loads independent.
__attribute__((target("avx512f"))) inline uint64_t sum_words_avx512(const uint64_t* p, int64_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_loadu_si512(p + i + 8));
    c = _mm512_add_epi64(c, _mm512_loadu_si512(p + i + 16));
    d = _mm512_add_epi64(d, _mm512_loadu_si512(p + i + 24));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  uint64_t total = 0;
  for (const uint64_t lane : lanes) total += lane;
  for (; i < n; ++i) total += p[i];
  return total;
}

__attribute__((target("avx2"))) inline uint64_t sum_words_avx2(const uint64_t* p, int64_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_add_epi64(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    c = _mm256_add_epi64(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    d = _mm256_add_epi64(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  uint64_t total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) total += p[i];
  return total;
}

inline uint64_t sum_words(const uint64_t* p, int64_t n) {
  static const Isa isa = kernel_isa();
  if (isa == Isa::kAvx512) return sum_words_avx512(p, n);
  if (isa == Isa::kAvx2) return sum_words_avx2(p, n);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

// Streaming read: a sum over n 64-bit words, split over the threads, so memory is the limit.
inline uint64_t stream_read(const uint64_t* p, int64_t n, int threads) {
  uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
  for (int64_t c = 0; c < threads; ++c) {
    const int64_t lo = n * c / threads, hi = n * (c + 1) / threads;
    total += sum_words(p + lo, hi - lo);
  }
  return total;
}

// The streaming read rate in GB/s over a buffer of `bytes` on `threads` threads: the best of
// `rounds` rounds, each timed for at least min_time seconds.
inline double read_rate_gbs(int64_t bytes, int threads, int rounds, double min_time) {
  // The storage a weight of this size gets (core/block_cache.h: huge pages from 2 MiB as
  // SEQPAR_HUGE_PAGES says), so the rate is that of the weights a decode step reads.
  Tensor storage({bytes / 4});  // fp32 elements, read as 64-bit words
  std::span<uint64_t> buf(static_cast<uint64_t*>(storage.raw()), static_cast<size_t>(bytes / 8));
  std::fill(buf.begin(), buf.end(), uint64_t{1});
  volatile uint64_t sink = 0;
  double best = 0;
  for (int round = 0; round < rounds; ++round)
    best = std::max(best, 8.0 * static_cast<double>(buf.size()) /
                              time_per_call(
                                  [&] {
                                    sink = sink + stream_read(buf.data(),
                                                              static_cast<int64_t>(buf.size()),
                                                              threads);
                                  },
                                  min_time) *
                              1e-9);
  return best;
}

}  // namespace seqpar::bench
