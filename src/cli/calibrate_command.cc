// seqpar calibrate: measures this machine and writes the `local` hardware profile.
//
//   1. attention kernel: flash_attention fp32 (B=1, H=4, S=2048, D=128, non-causal), one
//      one-thread call per core at once (the FLOP/s of a core on a busy machine, as ranks of
//      `seqpar run` see it), alone, and one call on every thread (the thread efficiency);
//   2. threads backend: two ranks exchanging messages the way a ring step does (both send and
//      receive at once): per-rank bandwidth of large messages, latency of 8-byte ones;
//   3. a local memcpy rate (packing, merging inside a rank).
// Writes --out, else $SEQPAR_PROFILE_DIR/local.json, else $XDG_CONFIG_HOME/seqpar/local.json,
// else ~/.config/seqpar/local.json; `seqpar plan --hardware local` then reads it.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "seqpar/attention/attention.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/error.h"
#include "seqpar/core/timer.h"
#include "seqpar/plan/hardware.h"

namespace seqpar::cli {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct KernelInputs {
  Tensor q, k, v;
  int64_t seq;
  double flops() const { return 4.0 * q.dim(3) * static_cast<double>(seq) * seq * q.dim(2); }
};

KernelInputs kernel_inputs(int64_t seq) {
  const int64_t H = 4, D = 128;
  return {random_normal({1, seq, H, D}, 1), random_normal({1, seq, H, D}, 2),
          random_normal({1, seq, H, D}, 3), seq};
}

// Median FLOP/s of one flash_attention call on `threads` threads (4·D flops per score).
double kernel_rate(const KernelInputs& in, int threads, int reps) {
  omp_set_num_threads(threads);
  flash_attention(in.q, in.k, in.v);  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    flash_attention(in.q, in.k, in.v);
    t.push_back(now_seconds() - t0);
  }
  return in.flops() / median(t);
}

// FLOP/s of one core while every core runs its own one-thread call, as `seqpar run` ranks do
// (memory bandwidth and whatever else runs on the machine are shared): median over rounds of
// the total rate / cores.
double kernel_rate_all_busy(const KernelInputs& in, int cores, int reps) {
  std::vector<double> rounds;
  for (int i = 0; i <= reps; ++i) {
    std::vector<std::thread> workers;
    const double t0 = now_seconds();
    for (int c = 0; c < cores; ++c)
      workers.emplace_back([&] {
        omp_set_num_threads(1);
        flash_attention(in.q, in.k, in.v);
      });
    for (auto& w : workers) w.join();
    if (i > 0) rounds.push_back(in.flops() / (now_seconds() - t0));  // per core
  }
  return median(rounds);
}

// Two ranks of the threads backend exchanging `bytes` both ways at once, as a ring step does:
// median seconds per exchange.
double exchange_seconds(size_t bytes, int reps) {
  std::vector<double> times;
  ThreadWorld::run(2, [&](Communicator& comm) {
    std::vector<char> send(bytes, static_cast<char>(comm.rank())), recv(bytes);
    const int peer = 1 - comm.rank();
    std::vector<double> mine;
    for (int i = 0; i <= reps; ++i) {
      comm.barrier();
      const double t0 = now_seconds();
      Request reqs[2] = {comm.irecv(recv.data(), bytes, peer, 7),
                         comm.isend(send.data(), bytes, peer, 7)};
      wait_all(reqs);
      const double dt = comm.all_reduce_max(now_seconds() - t0);
      if (i > 0) mine.push_back(dt);
    }
    if (comm.rank() == 0) times = mine;
  });
  return median(times);
}

double memcpy_rate(size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes);
  std::memcpy(b.data(), a.data(), bytes);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(now_seconds() - t0);
    a[i % bytes] = b[(i * 7) % bytes];  // keep the copies observable
  }
  return static_cast<double>(bytes) / median(t);
}

double mem_total_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemTotal:") return kb * 1024;
  return 0;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto c = line.find(':');
      if (c != std::string::npos) return line.substr(c + 2);
    }
  return "unknown CPU";
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace

void add_calibrate_command(CLI::App& app, CalibrateOptions& o) {
  CLI::App* c = app.add_subcommand(
      "calibrate", "Measure this machine and write the `local` hardware profile for seqpar plan");
  c->add_option("--out", o.out,
                "profile file (default $SEQPAR_PROFILE_DIR/local.json, else "
                "~/.config/seqpar/local.json)");
  c->add_flag("--json", o.json, "print the profile as one JSON object");
  c->add_flag("--quick", o.quick, "fewer, smaller measurements (for tests)");
}

namespace {

int calibrate(const CalibrateOptions& o) {
  std::string path = o.out;
  if (path.empty()) {
    const std::string dir = user_profile_dir();
    SEQPAR_ARG_CHECK(!dir.empty(),
                     "no place for the profile: set SEQPAR_PROFILE_DIR or HOME, "
                     "or give --out FILE");
    path = dir + "/local.json";
  }
  // The profile file opens before the measurements (its folder is made first).
  std::error_code ec;
  const std::filesystem::path fp(path);
  if (fp.has_parent_path()) std::filesystem::create_directories(fp.parent_path(), ec);
  OutputFile out("--out", path);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t seq = o.quick ? 512 : 2048;
  const int reps = o.quick ? 3 : 7;

  const KernelInputs in = kernel_inputs(seq);
  const double rate_alone = kernel_rate(in, 1, reps);
  const double rate_busy = cores > 1 ? kernel_rate_all_busy(in, cores, reps) : rate_alone;
  const double rate_wide = cores > 1 ? kernel_rate(in, cores, reps) : rate_alone;
  const double efficiency = std::clamp(rate_wide / (cores * rate_busy), 0.05, 1.0);
  const size_t big = o.quick ? (4u << 20) : (32u << 20);
  const double latency = exchange_seconds(8, o.quick ? 50 : 400);
  const double t_big = exchange_seconds(big, reps);
  const double bw = static_cast<double>(big) / std::max(1e-9, t_big - latency);
  const double copy = memcpy_rate(big, reps);

  HardwareProfile p = hardware_profile("local");
  p.description =
      detail::concat("this machine as measured by seqpar calibrate on ", today(), ": ", cpu_model(),
                     ", ", cores, " hardware threads; ", attention_kernel_info());
  p.dtype = "fp32";
  // Per core with every core busy: what each rank of a full machine gets.
  p.attention_flops = rate_busy;
  p.gemm_flops = rate_busy;  // the kernel's matmuls are oneDNN GEMMs; one rate for both
  p.intra_node_bw = p.inter_node_bw = bw;
  p.latency_s = p.inter_node_latency_s = latency;
  p.ranks_per_node = 0;
  p.memory_bytes = mem_total_bytes();
  p.local_copy_bw = copy;
  p.overlap = 0;  // threads backend: the rendezvous copy runs on a rank's own thread
  p.shared_node = true;
  p.cores_per_node = cores;
  p.thread_efficiency = efficiency;
  // Reading it back checks every field.
  const std::string text = hardware_profile_to_json(p);
  (void)hardware_profile_from_json(text, path);

  out.write(text);

  if (o.json) {
    nlohmann::json j = nlohmann::json::parse(text);
    j["path"] = path;
    j["kernel_flops_one_thread_alone"] = rate_alone;
    j["kernel_flops_one_call_all_threads"] = rate_wide;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar calibrate: %s\n", p.description.c_str());
    std::printf(
        "  attention kernel  %.2f GFLOP/s per core with all %d busy (%.2f alone); one call "
        "on %d threads %.2f GFLOP/s (efficiency %.2f)\n",
        rate_busy / 1e9, cores, rate_alone / 1e9, cores, rate_wide / 1e9, efficiency);
    std::printf(
        "  threads backend   %.2f GB/s per rank (ring-step exchange of %zu MB), latency "
        "%.2f us\n",
        bw / 1e9, big >> 20, latency * 1e6);
    std::printf("  memcpy            %.2f GB/s\n", copy / 1e9);
    std::printf("  memory            %.1f GB\n", p.memory_bytes / 1e9);
    std::printf("wrote %s (seqpar plan --hardware local)\n", path.c_str());
  }
  return finish_output(0);
}

}  // namespace

int calibrate_command(const CalibrateOptions& o) {
  return with_json_errors(o.json, [&] { return calibrate(o); });
}

}  // namespace seqpar::cli
