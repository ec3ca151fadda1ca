#include "seqpar/plan/calibrate.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/error.h"
#include "seqpar/core/timer.h"
#include "seqpar/parallel/runner.h"

namespace seqpar {

namespace {

// The measured attention call: one rank, strategy local, fp32 (B=1, S=seq, H=4, D=128).
struct KernelCall {
  AttnJob job;
  RankInputs inputs;
  double flops() const {
    const AttnShape& s = job.shape;
    return 4.0 * s.head_dim * static_cast<double>(s.seq) * s.seq * s.heads;
  }
};

KernelCall kernel_call(int64_t seq) {
  ParallelConfig c;
  c.strategy = Strategy::kLocal;
  AttnShape s;
  s.seq = seq;
  s.heads = 4;
  s.head_dim = 128;
  KernelCall k;
  k.job = resolve_job(c, s, 1);
  k.inputs = synthetic_inputs(k.job, 0, 1);
  return k;
}

// Seconds of `calls` calls on one rank of `threads` threads (the first `skip` not kept).
std::vector<double> call_seconds(const KernelCall& k, int threads, int calls, int skip) {
  std::vector<double> t;
  ThreadWorld::run(1, [&](Communicator& comm) {
    omp_set_num_threads(threads);
    JobComms comms(comm, k.job);
    for (int i = 0; i < calls; ++i) {
      const double dt = run_attention_call(comms, k.job, k.inputs).seconds;
      if (i >= skip) t.push_back(dt);
    }
  });
  return t;
}

// Median FLOP/s of one call on `threads` threads (4·D flops per score), after a warm-up.
double kernel_rate(const KernelCall& k, int threads, int reps) {
  return k.flops() / median(call_seconds(k, threads, reps + 1, 1));
}

// FLOP/s of one core while every core runs its own one-thread call, as `seqpar run` ranks do
// (memory bandwidth and whatever else runs on the machine are shared): median over rounds of
// the total rate / cores.
double kernel_rate_all_busy(const KernelCall& k, int cores, int reps) {
  std::vector<double> rounds;
  for (int i = 0; i <= reps; ++i) {
    std::vector<std::thread> workers;
    const double t0 = now_seconds();
    for (int c = 0; c < cores; ++c) workers.emplace_back([&] { call_seconds(k, 1, 1, 0); });
    for (auto& w : workers) w.join();
    if (i > 0) rounds.push_back(k.flops() / (now_seconds() - t0));  // per core
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

}  // namespace

MachineMeasurements measure_machine(bool quick,
                                    const std::function<void(const char* what)>& on_phase) {
  auto phase = [&](const char* what) {
    if (on_phase) on_phase(what);
  };
  MachineMeasurements m;
  m.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  m.kernel_seq = quick ? 512 : 2048;
  const int reps = quick ? 3 : 7;
  const KernelCall k = kernel_call(m.kernel_seq);
  phase("measuring the attention kernel on one core");
  m.kernel_flops_alone = kernel_rate(k, 1, reps);
  phase("measuring the attention kernel with every core busy");
  m.kernel_flops_busy = m.cores > 1 ? kernel_rate_all_busy(k, m.cores, reps) : m.kernel_flops_alone;
  phase("measuring one kernel call on every core");
  m.kernel_flops_wide = m.cores > 1 ? kernel_rate(k, m.cores, reps) : m.kernel_flops_alone;
  m.thread_efficiency =
      std::clamp(m.kernel_flops_wide / (m.cores * m.kernel_flops_busy), 0.05, 1.0);
  m.exchange_bytes = quick ? (4u << 20) : (32u << 20);
  phase("measuring latency and bandwidth between ranks");
  m.latency_s = exchange_seconds(8, quick ? 50 : 400);
  const double t_big = exchange_seconds(m.exchange_bytes, reps);
  m.bandwidth = static_cast<double>(m.exchange_bytes) / std::max(1e-9, t_big - m.latency_s);
  phase("measuring memcpy");
  m.memcpy_bw = memcpy_rate(m.exchange_bytes, reps);
  m.memory_bytes = mem_total_bytes();
  m.cpu_model = cpu_model();
  return m;
}

HardwareProfile calibrated_profile(const MachineMeasurements& m, const std::string& date) {
  HardwareProfile p = hardware_profile("local");
  p.description =
      detail::concat("this machine as measured by seqpar calibrate on ", date, ": ", m.cpu_model,
                     ", ", m.cores, " hardware threads; ", attention_kernel_info());
  p.dtype = "fp32";
  // Per core with every core busy: what each rank of a full machine gets.
  p.attention_flops = m.kernel_flops_busy;
  p.gemm_flops = m.kernel_flops_busy;  // the kernel's matmuls are oneDNN GEMMs; one rate for both
  p.intra_node_bw = p.inter_node_bw = m.bandwidth;
  p.latency_s = p.inter_node_latency_s = m.latency_s;
  p.ranks_per_node = 0;
  p.memory_bytes = m.memory_bytes;
  p.local_copy_bw = m.memcpy_bw;
  p.overlap = 0;  // threads backend: the rendezvous copy runs on a rank's own thread
  p.shared_node = true;
  p.cores_per_node = m.cores;
  p.thread_efficiency = m.thread_efficiency;
  return p;
}

}  // namespace seqpar
