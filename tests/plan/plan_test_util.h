// Runs one distributed attention on threads for a planner Workload and ParallelConfig, and returns what
// every rank measured (CommStats after SpComms is built, CpStats): the oracle the cost model's
// predictions are checked against.
#pragma once

#include <random>
#include <vector>

#include "seqpar/comm/threads.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/strategies.h"
#include "seqpar/plan/cost_model.h"

namespace seqpar::testing {

struct Measured {
  std::vector<CommStats> comm;  // per sequence-parallel rank
  std::vector<CpStats> cp;
};

inline Tensor random_rows(int64_t b, int64_t n, int64_t h, int64_t d, DType dtype, uint32_t seed) {
  Tensor t({b, n, h, d});
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return dtype == DType::kF32 ? t : t.to(dtype);
}

// The workload must be attention_only (the shapes of one call); cfg = tp = 1.
inline Measured measure(const Workload& w, const ParallelConfig& m) {
  const int n = m.sp();
  Measured out;
  out.comm.resize(n);
  out.cp.resize(n);
  const int64_t B = w.batch, H = w.heads, Hkv = w.kv_heads, D = w.head_dim;
  CpOptions opts;
  opts.causal = w.causal;
  opts.ulysses_mode = m.ulysses_mode;
  opts.softmax = m.softmax;
  if (w.decode()) {
    const KvPlacement place = decode_placement(w.cached, w.fresh, n, m.layout);
    ThreadWorld::run(n, [&](Communicator& comm) {
      const int r = comm.rank();
      Tensor q = random_rows(B, place.q_pos[r].size(), H, D, w.dtype, 10 + r);
      Tensor k = random_rows(B, place.kv_pos[r].size(), Hkv, D, w.dtype, 100 + r);
      Tensor v = random_rows(B, place.kv_pos[r].size(), Hkv, D, w.dtype, 200 + r);
      comm.barrier();
      comm.stats().reset();
      if (m.strategy == Strategy::kPassQ && m.schedule == ScheduleKind::kRing)
        passq_ring_attention(comm, place, q, k, v, opts, &out.cp[r]);
      else if (m.strategy == Strategy::kPassQ)
        passq_attention(comm, place, q, k, v, opts, &out.cp[r]);
      else
        passkv_attention(comm, place, q, k, v, opts, &out.cp[r]);
      out.comm[r] = comm.stats();
    });
    return out;
  }
  int64_t S = w.seq;
  if (m.pad) {
    const int64_t mult = m.layout == Layout::kZigzag ? 2 * int64_t{n} : n;
    S = (w.seq + mult - 1) / mult * mult;
    if (S != w.seq) opts.valid_len = w.seq;
  }
  const Partition part(S, n, m.layout);
  const Strategy st = m.strategy == Strategy::kAllGather ? Strategy::kAllGather
                      : m.strategy == Strategy::kRing    ? Strategy::kRing
                      : m.strategy == Strategy::kUlysses ? Strategy::kUlysses
                                                     : Strategy::kUsp;
  ThreadWorld::run(n, [&](Communicator& comm) {
    const int r = comm.rank();
    const int64_t nr = part.count(r);
    Tensor q = random_rows(B, nr, H, D, w.dtype, 10 + r);
    Tensor k = random_rows(B, nr, Hkv, D, w.dtype, 100 + r);
    Tensor v = random_rows(B, nr, Hkv, D, w.dtype, 200 + r);
    SpComms comms(comm, m.mesh.ulysses);
    comm.barrier();
    comms.reset_stats();
    if (w.text_tokens > 0) {
      const int64_t T = w.text_tokens;
      Tensor tq = random_rows(B, T, H, D, w.dtype, 7), tk = random_rows(B, T, Hkv, D, w.dtype, 8),
             tv = random_rows(B, T, Hkv, D, w.dtype, 9);
      joint_attention(st, comms, part, q, k, v, tq, tk, tv, opts, &out.cp[r]);
    } else {
      context_parallel_attention(st, comms, part, q, k, v, opts, &out.cp[r]);
    }
    out.comm[r] = comms.stats();
  });
  return out;
}

}  // namespace seqpar::testing
