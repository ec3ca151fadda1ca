// comm_bench: the threads backend's collective latency, the cost a tensor-parallel decode step
// pays 2 times a layer (the all-reduces of its attention and MLP outputs) and once for the logits.
//
//   comm_bench [--ranks 2] [--floats 2048,65536] [--iters 2000] [--rounds 3]
//
// Each rank calls the collective `iters` times back to back; the table gives microseconds per
// call, the best round. Not a test: timing decides nothing.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "seqpar/comm/threads.h"

namespace {

using seqpar::Communicator;

// Microseconds per call of op(comm, buffer) on `ranks` threads, the best of `rounds`.
double us_per_call(int ranks, int64_t floats, int iters, int rounds,
                   const std::function<void(Communicator&, std::vector<float>&)>& op) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> seconds(static_cast<size_t>(ranks));
    seqpar::ThreadWorld::run(ranks, [&](Communicator& comm) {
      std::vector<float> buf(static_cast<size_t>(floats), 1.f);
      comm.barrier();
      const double t0 = seqpar::now_seconds();
      for (int i = 0; i < iters; ++i) op(comm, buf);
      seconds[comm.rank()] = seqpar::now_seconds() - t0;
    });
    double slowest = 0;
    for (double s : seconds) slowest = std::max(slowest, s);
    best = std::min(best, slowest / iters * 1e6);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, iters = 2000, rounds = 3;
  std::vector<int64_t> floats = {2048, 65536};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("comm_bench [--ranks 2] [--floats 2048,65536] [--iters 2000] [--rounds 3]\n");
      return 0;
    }
    if (i + 1 >= argc) seqpar::bench::usage_error("comm_bench", a + " needs a value (see --help)");
    const std::vector<int64_t> v = seqpar::bench::parse_list("comm_bench", a, argv[++i]);
    if (a == "--floats") {
      floats = v;
    } else if (v.size() != 1) {
      seqpar::bench::usage_error("comm_bench", a + " takes one positive integer");
    } else if (a == "--ranks") {
      ranks = static_cast<int>(v[0]);
    } else if (a == "--iters") {
      iters = static_cast<int>(v[0]);
    } else if (a == "--rounds") {
      rounds = static_cast<int>(v[0]);
    } else {
      seqpar::bench::usage_error("comm_bench", "unknown argument " + a + " (see --help)");
    }
  }
  std::printf("threads backend, %d ranks, %d calls a round, best of %d rounds\n\n", ranks, iters,
              rounds);
  std::printf("| collective | floats | us per call |\n|---|---|---|\n");
  std::printf("| barrier | - | %.2f |\n",
              us_per_call(ranks, 1, iters, rounds, [](Communicator& c, auto&) { c.barrier(); }));
  std::printf("| broadcast | 1 | %.2f |\n",
              us_per_call(ranks, 1, iters, rounds, [](Communicator& c, std::vector<float>& b) {
                c.broadcast(b.data(), sizeof(float), 0);
              }));
  if (ranks >= 2) {
    // Rank 0 sends to rank 1, which sends it back; the others wait at the barrier.
    std::printf("| send + recv, round trip (ranks 0, 1) | 1 | %.2f |\n",
                us_per_call(ranks, 1, iters, rounds, [](Communicator& c, std::vector<float>& b) {
                  if (c.rank() == 0) {
                    c.isend(b.data(), sizeof(float), 1, 0).wait();
                    c.irecv(b.data(), sizeof(float), 1, 0).wait();
                  } else if (c.rank() == 1) {
                    c.irecv(b.data(), sizeof(float), 0, 0).wait();
                    c.isend(b.data(), sizeof(float), 0, 0).wait();
                  }
                }));
  }
  for (int64_t n : floats) {
    std::printf("| all_reduce | %lld | %.2f |\n", static_cast<long long>(n),
                us_per_call(ranks, n, iters, rounds, [](Communicator& c, std::vector<float>& b) {
                  c.all_reduce(std::span<float>(b), seqpar::ReduceOp::kSum);
                }));
  }
  return 0;
}
