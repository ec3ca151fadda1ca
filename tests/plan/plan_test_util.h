// Runs one distributed attention on threads for a planner Workload and ParallelConfig, and returns
// what every rank measured (CommStats after SpComms is built, CpStats): the oracle the cost model's
// predictions are checked against.
#pragma once

#include <random>
#include <vector>

#include "seqpar/comm/checked.h"
#include "seqpar/comm/threads.h"
#include "seqpar/parallel/cp_attention.h"
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

// The workload must be attention_only (the shapes of one call); cfg = tp = 1. The call goes
// through the one entry point (cp_attention.h), as every other attention does.
// The call as the cost model predicts it on profile hw (workload_shape(w, hw): what it gives up of
// k and v), where blocks are copied (a CheckedCommunicator) unless hw is a shared node's threads.
inline Measured measure(const Workload& w, const ParallelConfig& m, const HardwareProfile& hw) {
  const int n = m.sp();
  Measured out;
  out.comm.resize(n);
  out.cp.resize(n);
  const int64_t B = w.batch, H = w.heads, Hkv = w.kv_heads, D = w.head_dim, T = w.text_tokens;
  AttnShape shape{B, w.seq, H, Hkv, D, w.causal, T, w.cached, w.fresh, w.dtype};
  if (w.decode()) shape.seq = w.cached + w.fresh;
  shape.kv_use = workload_shape(w, hw).kv_use;
  const Placement place = place_call(m, shape);
  ThreadWorld::run(n, [&](Communicator& world) {
    CheckedCommunicator checked(world);
    Communicator& comm = hw.shared_node ? world : static_cast<Communicator&>(checked);
    const int r = comm.rank();
    const int64_t nq = static_cast<int64_t>(place.q_pos(r).size());
    const int64_t nkv = static_cast<int64_t>(place.kv_pos(r).size());
    const Tensor q = random_rows(B, nq, H, D, w.dtype, 10 + r);
    const Tensor k = random_rows(B, nkv, Hkv, D, w.dtype, 100 + r);
    const Tensor v = random_rows(B, nkv, Hkv, D, w.dtype, 200 + r);
    const Tensor tq = random_rows(B, T, H, D, w.dtype, 7);
    const Tensor tk = random_rows(B, T, Hkv, D, w.dtype, 8);
    const Tensor tv = random_rows(B, T, Hkv, D, w.dtype, 9);
    SpComms comms(comm, m.mesh.ulysses);
    comm.barrier();
    comms.reset_stats();
    AttnOutputs result;
    attention(m, shape, comms, place, T > 0 ? AttnInputs{q, k, v, tq, tk, tv} : AttnInputs{q, k, v},
              result, &out.cp[r]);
    out.comm[r] = comms.stats();
  });
  return out;
}

}  // namespace seqpar::testing
