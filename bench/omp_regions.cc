// An LD_PRELOAD shim that counts OpenMP parallel regions (GOMP_parallel: each one a fork and a
// join of the thread team) and prints the count at exit: how many times a program synchronises
// its threads. Used by bench/omp_regions.sh.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>

namespace {
std::atomic<long> regions{0};
struct Report {
  ~Report() { std::fprintf(stderr, "omp_regions: %ld\n", regions.load()); }
} report;
using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
}  // namespace

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  static const auto real =
      reinterpret_cast<GompParallel>(dlvsym(RTLD_NEXT, "GOMP_parallel", "GOMP_4.0"));
  regions.fetch_add(1, std::memory_order_relaxed);
  real(fn, data, threads, flags);
}
