// One configured attention call on a sequence-parallel group, with its inputs, statistics and
// verification: what `seqpar run`, the calibration and the test harnesses run.
//
//   resolve_job          ParallelConfig + AttnShape + ranks -> AttnJob (degrees filled, validated,
//                        padded, memory checked, partition or cache placement made);
//   synthetic_inputs     the seeded inputs of one rank (parallel/synthetic.h);
//   run_attention_call   one call on one rank: a sequence strategy, joint text attention, or
//                        pass-KV / pass-Q over a cache; its state, CpStats, CommStats, seconds;
//   gather_job_stats     per-rank figures of the calls, gathered on every rank;
//   verify_call          the call's rows against reference_attention, at the kernel path's error
//                        bound (attention/error_bound.h);
//   gather_trace         every rank's trace events (core/trace.h) as one Chrome/Perfetto document.
// Messages name parameters as the API does (strategy, seq, heads, cached, new, ...).
// Thread-safety: a job is a value shared read-only by the ranks; JobComms, run_attention_call and
// the gather and verify functions are used by one rank thread each, and the last three are
// collectives over the rank's communicator (every rank calls them).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "seqpar/attention/error_bound.h"
#include "seqpar/comm/communicator.h"
#include "seqpar/parallel/config.h"
#include "seqpar/parallel/cp_attention.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar {

// One attention call over config.sp() ranks, resolved before any rank starts: what the one entry
// point (cp_attention.h) takes, besides the tensors. Over a sequence the place.part.seq() tokens
// (padded_seq) are sharded by place.part; over a cache (shape.over_cache()) place.cache holds each
// rank's K/V and queries. A caller may also fill it directly (the tests do, with partitions and
// kernel options of their own); run_attention_call runs what it holds.
struct AttnJob {
  ParallelConfig config;   // the degrees filled: ulysses x ring = the ranks
  AttnShape shape;         // over a cache: seq = cached + fresh
  int64_t padded_seq = 0;  // sharded_seq(config, shape): the tokens after padding
  Placement place;
  KernelOptions kernel;  // scale and block sizes (0: the kernel's choice)

  int ranks() const { return place.ranks(); }
  bool over_cache() const { return shape.over_cache(); }
  // Global positions of rank r's queries and of its keys and values (ascending).
  std::span<const int64_t> q_pos(int r) const { return place.q_pos(r); }
  std::span<const int64_t> kv_pos(int r) const { return place.kv_pos(r); }
  // The options the strategies run with (cp_options).
  CpOptions cp() const { return cp_options(config, shape, place, kernel); }
};

// The job of `shape` under `config` on `ranks` ranks: the degrees left 0 in config.mesh filled
// (fill_sp_degrees), everything validated (validate_config), the sequence padded (padded_seq) and
// partitioned, or the cache placed (decode_placement). Before anything is sized by it, the bytes
// the job holds on all ranks at its peak (inputs, outputs, K/V in flight, and with `verify` the
// reference's full K/V) are checked against the machine's memory and the score elements against
// limits::kMaxScoreElements. InvalidArgument names what does not fit.
AttnJob resolve_job(ParallelConfig config, const AttnShape& shape, int ranks, bool verify = false);

// The tensors of one rank: q (B, |q_pos(r)|, H, D), k and v (B, |kv_pos(r)|, Hkv, D); with text
// tokens, text_q (B, T, H, D), text_k and text_v (B, T, Hkv, D), the same on every rank.
struct RankInputs {
  Tensor q, k, v;
  Tensor text_q, text_k, text_v;
};
// The seeded inputs of rank r (synthetic_rows): rows at the rank's global positions, the padding
// rows (positions >= shape.seq) zeroed.
RankInputs synthetic_inputs(const AttnJob& job, int rank, uint64_t seed);

// The communicators of one rank for a job's calls: the Ulysses and ring groups of
// config.mesh.ulysses (SpComms; making them is a collective).
class JobComms {
 public:
  JobComms(Communicator& comm, const AttnJob& job);
  Communicator& comm() { return comm_; }
  SpComms& sp() { return sp_; }
  CommStats stats() const { return sp_.stats(); }  // of every communicator the calls use
  void reset_stats() { sp_.reset_stats(); }

 private:
  Communicator& comm_;
  SpComms sp_;
};

// What one call did on one rank.
struct RankCall {
  AttnState state;  // this rank's queries: out (B, |q_pos(r)|, H, D), lse (B, |q_pos(r)|, H)
  AttnState text;   // joint attention: the text queries, (B, T, H, D) and (B, T, H)
  CpStats cp;
  CommStats comm;      // bytes of this call alone
  double seconds = 0;  // this rank's wall time of the call
};

// One call of the job on this rank through the one entry point (cp_attention.h attention): a
// barrier (the ranks start together), the statistics reset, the call, timed. Errors of the
// strategy propagate (InvalidArgument for a shape it cannot run).
RankCall run_attention_call(JobComms& comms, const AttnJob& job, const RankInputs& in);
// What the call gives up of its k and v (AttnShape::kv_use): where blocks are copied (MPI,
// borrows false) the ring lends their storage as a receive buffer and brings it home (kLend: 2
// shards of K/V instead of 3, one more block each way); where ranks read peers' blocks in place
// (the threads backend) it keeps them (kKeep). The planner predicts a bare call the same way.
inline KvUse runner_kv_use(bool borrows) { return borrows ? KvUse::kKeep : KvUse::kLend; }

// One rank's times over a job's timed calls.
struct CallTimes {
  std::vector<double> exposed;   // per call: (wait - end sync) / call time
  std::vector<double> end_sync;  // per call: end sync / call time
  double wait_seconds = 0, call_seconds = 0;
  void add(const RankCall& call);
};

// Per-rank figures of a job (index = rank), the same on every rank.
struct JobStats {
  std::vector<int64_t> sent, recv;   // bytes of the last call
  std::vector<int64_t> peak_kv;      // CpStats::peak_kv_bytes
  std::vector<int64_t> measured_kv;  // CpStats::measured_kv_bytes
  std::vector<int64_t> work;         // visible score elements computed
  std::vector<int64_t> tokens;       // queries held
  std::vector<int64_t> peak_rss;     // peak resident bytes of the rank's process
  // Bytes of the rank's tensors at their peak: q, the result, and the larger of its own K/V and
  // the K/V it held at once.
  std::vector<int64_t> tensor_bytes;
  int64_t fallback_rows = 0;     // const-max softmax: summed over the ranks
  double wait_fraction = 0;      // the largest over ranks of wait / call time
  std::vector<double> exposed;   // median over the timed calls of CallTimes::exposed
  std::vector<double> end_sync;  // median over the timed calls of CallTimes::end_sync
};
// Gathers the figures of `last` (this rank's last call) and `times` from every rank (collective).
JobStats gather_job_stats(Communicator& comm, const AttnJob& job, const RankInputs& in,
                          const RankCall& last, const CallTimes& times);

// The kernel path's error bound for the job: every query sees at most the real tokens plus the
// text tokens; max_abs_v is the largest |v| of the inputs.
ErrorBound job_error_bound(const AttnJob& job, double max_abs_v);

// The verification of a call: its rows against reference_attention.
struct Verification {
  double max_abs_err = 0, max_lse_err = 0;  // NaN in the output counts as infinite
  double max_abs_v = 0;
  int64_t rows = 0;  // query rows checked
  ErrorBound bound;
  bool ok = false;  // both errors finite and within the bound
};
// Compares the rows of `call` (made from synthetic_inputs(job, rank, seed)) with
// reference_attention on rank 0 in double precision: every query row when
// rows·B·(S+T)·H·D <= row_budget, else an even spread of them with both ends; with text tokens
// also the text rows. Collective; every rank gets the result.
inline constexpr double kVerifyBudget = 6e8;
Verification verify_call(Communicator& comm, const AttnJob& job, uint64_t seed,
                         const RankCall& call, double row_budget = kVerifyBudget);

// Stops recording trace events (every rank is past its last recorded work: this begins with a
// barrier) and returns every rank's events as one Chrome/Perfetto JSON document on rank 0 (empty
// on the others). Threads: the ranks share the process's recorder. MPI: each process serializes
// its events relative to the earliest event of any rank and rank 0 gathers them. Collective.
std::string gather_trace(Communicator& comm);

}  // namespace seqpar
