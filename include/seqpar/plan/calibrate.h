// Measuring this machine for the `local` hardware profile (`seqpar calibrate`):
//   1. the attention kernel: one fp32 attention call (B=1, H=4, S=2048, D=128, non-causal, run by
//      parallel/runner.h on one rank) on one thread per core at once (the FLOP/s of a core on a
//      busy machine, as ranks of `seqpar run` see it), alone, and on every thread (the thread
//      efficiency);
//   2. the threads backend: two ranks exchanging messages the way a ring step does (both send
//      and receive at once): per-rank bandwidth of large messages, latency of 8-byte ones;
//   3. a local memcpy rate (packing, merging inside a rank);
// and the profile these numbers make.
// Thread-safety: measure_machine starts threads of its own and sets the OpenMP thread count of
// the threads it runs on; call it from one thread, with nothing else running if the numbers are
// to mean anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "seqpar/plan/hardware.h"

namespace seqpar {

// What measure_machine found (rates in FLOP/s and bytes/s, medians over repetitions).
struct MachineMeasurements {
  int cores = 1;                  // hardware threads
  int64_t kernel_seq = 0;         // tokens of the measured attention call
  double kernel_flops_busy = 0;   // per core, every core running its own one-thread call
  double kernel_flops_alone = 0;  // one one-thread call alone
  double kernel_flops_wide = 0;   // one call on every thread
  double thread_efficiency = 1;   // wide / (cores x busy), in [0.05, 1]
  size_t exchange_bytes = 0;      // the large message of the bandwidth measurement
  double latency_s = 0;           // one 8-byte exchange
  double bandwidth = 0;           // per rank, each direction, latency removed
  double memcpy_bw = 0;           // one thread copying exchange_bytes
  double memory_bytes = 0;        // MemTotal
  std::string cpu_model;          // /proc/cpuinfo's model name
};

// Measures this machine; quick: fewer and smaller measurements (for tests). on_phase, if
// given, hears each measurement as it starts ("the attention kernel on one core", ...).
MachineMeasurements measure_machine(bool quick,
                                    const std::function<void(const char* what)>& on_phase = {});

// The `local` profile of the measurements, its description dated `date` (YYYY-MM-DD): per-core
// rates with every core busy (what each rank of a full machine gets), a shared node of `cores`.
HardwareProfile calibrated_profile(const MachineMeasurements& m, const std::string& date);

}  // namespace seqpar
