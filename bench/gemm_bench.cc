// gemm_bench: this machine's one-thread fp32 GEMM rate (oneDNN, M = N = K = --size), alone and
// as T copies running at once, one per thread (what T single-threaded ranks can reach together).
// The peer comparison (bench/compare_peer.sh) measures it in the same run as the attention
// benchmarks, because this machine's speed drifts.
//
//   gemm_bench [--threads 2] [--size 1024] [--rounds 3] [--min-time 0.5] [--json]
//
// Each round times, back to back: one GEMM on one thread ("one"), then T GEMMs at once on T
// threads ("together", summed over the threads); the best of --rounds rounds is reported.
// Not a test: timing never decides pass or fail.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

using seqpar::bench::Gemm;

[[noreturn]] void usage_error(const std::string& msg) {
  seqpar::bench::usage_error("gemm_bench", msg);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, rounds = 3;
  int64_t size = 1024;
  double min_time = 0.5;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      std::printf(
          "gemm_bench [--threads 2] [--size 1024] [--rounds 3] [--min-time 0.5] [--json]\n");
      return 0;
    }
    if (i + 1 >= argc) usage_error(a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (a == "--size") {
      size = std::atoll(v.c_str());
    } else if (a == "--rounds") {
      rounds = std::atoi(v.c_str());
    } else if (a == "--min-time") {
      min_time = seqpar::bench::parse_min_time("gemm_bench", v);
    } else {
      usage_error("unknown option " + a + " (see --help)");
    }
  }
  if (threads < 1 || size < 16 || rounds < 1 || !(min_time > 0))
    usage_error("invalid value: need --threads >= 1, --size >= 16, --rounds >= 1, --min-time > 0");

  omp_set_num_threads(threads);
  std::vector<std::unique_ptr<Gemm>> gemms;
  for (int t = 0; t < threads; ++t) gemms.push_back(std::make_unique<Gemm>(size));
  double best_one = 0, best_together = 0;
  std::vector<double> per_thread(threads, 0);
  for (int r = 0; r < rounds; ++r) {
    // One GEMM on one thread. (Not inside a one-thread parallel region: that region is
    // inactive, so oneDNN would use every thread; limiting the threads is what works.)
    {
      omp_set_num_threads(1);
      const double t = seqpar::bench::time_per_call([&] { gemms[0]->run(); }, min_time);
      best_one = std::max(best_one, gemms[0]->flops() / t * 1e-9);
      omp_set_num_threads(threads);
    }
    // T GEMMs at once, one per thread, each repeated for min_time.
    std::vector<double> rate(threads, 0);
#pragma omp parallel num_threads(threads)
    {
      const int id = omp_get_thread_num();
      const double t = seqpar::bench::time_per_call([&] { gemms[id]->run(); }, min_time);
      rate[id] = gemms[id]->flops() / t * 1e-9;
    }
    double sum = 0;
    for (double x : rate) sum += x;
    if (sum > best_together) {
      best_together = sum;
      per_thread = rate;
    }
  }
  if (json) {
    std::printf(
        "{\"size\": %lld, \"threads\": %d, \"rounds\": %d, \"impl\": \"%s\", "
        "\"one_thread_gflops\": %.2f, \"together_gflops\": %.2f, \"per_thread_gflops\": [",
        static_cast<long long>(size), threads, rounds, gemms[0]->impl().c_str(), best_one,
        best_together);
    for (int t = 0; t < threads; ++t) std::printf("%s%.2f", t ? ", " : "", per_thread[t]);
    std::printf("]}\n");
  } else {
    std::printf("GEMM %lld^3 fp32 (oneDNN %s), best of %d rounds\n", static_cast<long long>(size),
                gemms[0]->impl().c_str(), rounds);
    std::printf("| one thread alone GFLOP/s | %d threads at once, total GFLOP/s | per thread |\n",
                threads);
    std::printf("|---|---|---|\n| %.1f | %.1f |", best_one, best_together);
    for (int t = 0; t < threads; ++t) std::printf(" %.1f", per_thread[t]);
    std::printf(" |\n");
  }
  return 0;
}
