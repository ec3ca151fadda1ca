// read_bench: this machine's streaming read rate (a sum over a buffer no cache holds, in the
// storage a weight of its size gets: on huge pages as SEQPAR_HUGE_PAGES says), the ceiling of a
// decode step that reads every weight once. bench/compare_llamacpp.sh measures it
// before each round, beside the decode rates it compares.
//
//   read_bench [--mib 1024] [--threads all] [--rounds 3] [--min-time 0.3] [--json]
//
// Prints the best round in GB/s. Not a test: timing decides nothing.
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"

int main(int argc, char** argv) {
  int64_t mib = 1024;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int rounds = 3;
  double min_time = 0.3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "read_bench [--mib 1024] [--threads all] [--rounds 3] [--min-time 0.3] [--json]\n");
      return 0;
    }
    if (a == "--json") {
      json = true;
      continue;
    }
    if (i + 1 >= argc) seqpar::bench::usage_error("read_bench", a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--mib") {
      mib = seqpar::bench::parse_one("read_bench", a, v);
    } else if (a == "--threads") {
      threads = static_cast<int>(seqpar::bench::parse_one("read_bench", a, v));
    } else if (a == "--rounds") {
      rounds = static_cast<int>(seqpar::bench::parse_one("read_bench", a, v));
    } else if (a == "--min-time") {
      min_time = seqpar::bench::parse_min_time("read_bench", v);
    } else {
      seqpar::bench::usage_error("read_bench", "unknown argument " + a + " (see --help)");
    }
  }
  const double gbs = seqpar::bench::read_rate_gbs(mib << 20, threads, rounds, min_time);
  if (json)
    std::printf("{\"read_gb_per_s\": %.3f, \"mib\": %lld, \"threads\": %d}\n", gbs,
                static_cast<long long>(mib), threads);
  else
    std::printf("streaming read, %lld MiB on %d threads: %.1f GB/s\n", static_cast<long long>(mib),
                threads, gbs);
  return 0;
}
