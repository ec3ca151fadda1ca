// omp_sync_bench: what one synchronisation point of a rank's thread team costs in three forms:
// the rank's persistent team as the model's products take it (core/team.h: a loop published to
// workers that stay, chunks claimed from one counter, the caller waiting for the chunks only),
// each product its own OpenMP region (a fork and a join, chunks handed out one at a time;
// SEQPAR_TEAM=0), and one OpenMP region kept open with each product a worksharing loop and its
// closing barrier. The differences, times the loops a forward pass runs (bench/omp_regions.sh
// counts them), say what each form costs a pass.
//
//   omp_sync_bench [--threads 2] [--chunks 16] [--rounds 5] [--min-time 0.2]
//
// Prints microseconds per synchronisation point (median and min over the rounds) for both forms.
// Not a test: timing decides nothing.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "seqpar/core/team.h"

namespace {

constexpr int kPerCall = 1000;  // synchronisation points per timed call
std::atomic<long> sink{0};

// One chunk's work: enough that the loop is not optimised away, nothing more.
inline void chunk(int64_t c) { sink.fetch_add(c, std::memory_order_relaxed); }

// kPerCall regions, each a dynamic loop of `chunks` chunks on `threads` threads.
void regions(int threads, int64_t chunks) {
  for (int i = 0; i < kPerCall; ++i) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t c = 0; c < chunks; ++c) chunk(c);
  }
}

// One region holding kPerCall dynamic loops of `chunks` chunks, each ending at the team's barrier.
void one_region(int threads, int64_t chunks) {
#pragma omp parallel num_threads(threads)
  for (int i = 0; i < kPerCall; ++i) {
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; ++c) chunk(c);
  }
}

// kPerCall loops of `chunks` chunks on the calling thread's persistent team.
void team_loops(int64_t chunks) {
  for (int i = 0; i < kPerCall; ++i) seqpar::parallel_for(chunks, [](int64_t c) { chunk(c); });
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  int64_t chunks = 16;
  int rounds = 5;
  double min_time = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("omp_sync_bench [--threads 2] [--chunks 16] [--rounds 5] [--min-time 0.2]\n");
      return 0;
    }
    if (i + 1 >= argc)
      seqpar::bench::usage_error("omp_sync_bench", a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--threads") {
      threads = static_cast<int>(seqpar::bench::parse_one("omp_sync_bench", a, v));
    } else if (a == "--chunks") {
      chunks = seqpar::bench::parse_one("omp_sync_bench", a, v);
    } else if (a == "--rounds") {
      rounds = static_cast<int>(seqpar::bench::parse_one("omp_sync_bench", a, v));
    } else if (a == "--min-time") {
      min_time = seqpar::bench::parse_min_time("omp_sync_bench", v);
    } else {
      seqpar::bench::usage_error("omp_sync_bench", "unknown argument " + a + " (see --help)");
    }
  }
  // Rounds alternate the three forms, so that all see the same minutes of a shared machine.
  omp_set_num_threads(threads);
  std::vector<double> per_team, per_region, per_loop;
  for (int r = 0; r < rounds; ++r) {
    per_team.push_back(seqpar::bench::time_per_call([&] { team_loops(chunks); }, min_time) /
                       kPerCall);
    per_region.push_back(seqpar::bench::time_per_call([&] { regions(threads, chunks); }, min_time) /
                         kPerCall);
    per_loop.push_back(
        seqpar::bench::time_per_call([&] { one_region(threads, chunks); }, min_time) / kPerCall);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto least = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  std::printf(
      "threads %d, %lld dynamic chunks per loop, %d rounds (us per synchronisation point)\n",
      threads, static_cast<long long>(chunks), rounds);
  std::printf("%-34s %8s %8s\n", "form", "median", "min");
  std::printf("%-34s %8.2f %8.2f\n", "the rank's team (as built)", 1e6 * median(per_team),
              1e6 * least(per_team));
  std::printf("%-34s %8.2f %8.2f\n", "a region per product", 1e6 * median(per_region),
              1e6 * least(per_region));
  std::printf("%-34s %8.2f %8.2f\n", "one region, a loop per product", 1e6 * median(per_loop),
              1e6 * least(per_loop));
  return 0;
}
