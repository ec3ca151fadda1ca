// The strategies over the mpi backend (run under mpiexec with 2 and 4 ranks): results equal the
// reference and measured bytes equal the formulas, as on the threads backend; every strategy
// and option (usp, const-max, passq, passkv, padding, joint text) with fp32, bf16 and fp16
// inputs and batch 1-3 against the reference at the kernel path's error bound.
#include <gtest/gtest.h>

#include "parallel/cp_check.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/parallel/schedule.h"

namespace seqpar {

using seqpar::testing::inputs_for;
using seqpar::testing::max_err_lse;
using seqpar::testing::Problem;

class MpiStrategies : public ::testing::TestWithParam<std::tuple<Strategy, Layout, bool, int64_t>> {
};

TEST_P(MpiStrategies, MatchReferenceAndFormula) {
  auto [strategy, layout, causal, seq] = GetParam();
  auto comm = mpi_world();
  const int n = comm->size(), r = comm->rank();
  Problem p;
  p.seq = seq;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.causal = causal;
  const auto& in = inputs_for(p);  // every rank builds the same inputs from the seed
  Partition part(seq, n, layout);
  Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
  CpOptions opts;
  opts.causal = causal;
  SpComms comms(*comm);
  CpStats stats;
  AttnState s = testing::cp_call(strategy, comms, part, q, k, v, opts, &stats);
  Tensor want_out = shard(in.ref.out, part, r);
  const ErrorBound tol = seqpar::testing::bound_for(p);
  EXPECT_LE(max_abs_diff(s.out, want_out), tol.out) << "rank " << r;
  Tensor lse4 = in.ref.lse;
  lse4.resize({p.batch, p.seq, p.heads, 1});
  Tensor want_lse = shard(lse4, part, r);
  want_lse.resize({p.batch, part.count(r), p.heads});
  EXPECT_LE(max_err_lse(s.lse, want_lse), tol.lse) << "rank " << r;
  CommPrediction pred =
      predict_comm_bytes(strategy, part, r, p.batch, p.heads, p.kv_heads, p.head_dim, 4);
  EXPECT_EQ(comms.stats().total_sent(), pred.sent) << "rank " << r;
  EXPECT_EQ(comms.stats().total_recv(), pred.recv) << "rank " << r;
  // K/V storage: MPI copies every block, so what the call allocated is what it reads at once.
  EXPECT_EQ(stats.measured_kv_bytes, stats.peak_kv_bytes) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    All, MpiStrategies,
    ::testing::Combine(::testing::Values(Strategy::kAllGather, Strategy::kRing, Strategy::kUlysses),
                       ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Bool(), ::testing::Values(int64_t{64}, int64_t{517})));

// Every strategy and option on the world's ranks, each rank checking the rows it holds. Per
// kind six (batch, dtype) pairs, every batch with two dtypes and every dtype with two batches
// (oversubscribed MPI ranks make each case cost ~0.2 s); causal and the layout vary with them.
std::vector<seqpar::testing::CheckCase> mpi_cases() {
  using seqpar::testing::Op;
  std::vector<seqpar::testing::CheckCase> v;
  const std::pair<int64_t, DType> pairs[] = {{1, DType::kF32}, {2, DType::kBF16}, {3, DType::kF16},
                                             {2, DType::kF32}, {3, DType::kBF16}, {1, DType::kF16}};
  const Layout layouts[] = {Layout::kContiguous, Layout::kZigzag, Layout::kStriped};
  for (const auto& kind : seqpar::testing::kinds())
    for (int i = 0; i < 6; ++i) {
      auto [batch, dtype] = pairs[i];
      // Every batch both causal and not (joint attention is bidirectional only).
      const bool causal = kind.op != Op::kJoint && (i < 3) == (batch != 2);
      v.push_back(seqpar::testing::make_case(kind, batch, dtype, causal, layouts[i % 3]));
    }
  return v;
}

class MpiEveryStrategy : public ::testing::TestWithParam<seqpar::testing::CheckCase> {};

TEST_P(MpiEveryStrategy, MatchesReferenceWithinBound) {
  const seqpar::testing::CheckCase& c = GetParam();
  auto comm = mpi_world();
  const seqpar::testing::CaseData data = seqpar::testing::make_case_data(c);
  const seqpar::testing::RankErrors e = seqpar::testing::check_on_rank(*comm, c, data);
  seqpar::testing::expect_within_bound(c, data, e, comm->size(), comm->rank());
}

INSTANTIATE_TEST_SUITE_P(All, MpiEveryStrategy, ::testing::ValuesIn(mpi_cases()),
                         [](const ::testing::TestParamInfo<seqpar::testing::CheckCase>& info) {
                           return info.param.name();
                         });

// ring with schedule steal over processes: each rank's rows equal the reference, and its bytes
// (per kind of op), work and peak K/V equal the schedule (batch 2, GQA, bf16 and fp32).
class MpiSteal : public ::testing::TestWithParam<std::tuple<int64_t, DType>> {};

TEST_P(MpiSteal, MatchesReferenceAndSchedule) {
  auto [seq, dtype] = GetParam();
  auto comm = mpi_world();
  const int n = comm->size(), r = comm->rank();
  Problem p;
  p.seq = seq;
  p.batch = 2;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 32;
  p.causal = true;
  p.dtype = dtype;
  const auto& in = inputs_for(p);
  Partition part(seq, n, Layout::kContiguous);
  Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
  CpOptions opts;
  opts.causal = true;
  opts.schedule = ScheduleKind::kSteal;
  SpComms comms(*comm);
  CpStats stats;
  AttnState s = testing::cp_call(Strategy::kRing, comms, part, q, k, v, opts, &stats);
  const ErrorBound tol = seqpar::testing::bound_for(p);
  EXPECT_LE(max_abs_diff(s.out, shard(in.ref.out, part, r)), tol.out) << "rank " << r;
  Tensor lse4 = in.ref.lse;
  lse4.resize({p.batch, p.seq, p.heads, 1});
  Tensor want_lse = shard(lse4, part, r);
  want_lse.resize({p.batch, part.count(r), p.heads});
  EXPECT_LE(max_err_lse(s.lse, want_lse), tol.lse) << "rank " << r;
  ParallelConfig cfg;
  cfg.schedule = ScheduleKind::kSteal;
  cfg.mesh.ring = n;
  const Schedule sched = attention_schedule(cfg, {.batch = p.batch,
                                                  .seq = seq,
                                                  .heads = p.heads,
                                                  .kv_heads = p.kv_heads,
                                                  .head_dim = p.head_dim,
                                                  .causal = true,
                                                  .dtype = dtype});
  const CommPrediction want = schedule_bytes(sched, r);
  EXPECT_EQ(comms.stats().total_sent(), want.sent) << "rank " << r;
  EXPECT_EQ(comms.stats().total_recv(), want.recv) << "rank " << r;
  EXPECT_EQ(stats.work, schedule_work(sched, r)) << "rank " << r;
  EXPECT_EQ(stats.peak_kv_bytes, sched.ranks[r].peak_kv_bytes) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(All, MpiSteal,
                         ::testing::Combine(::testing::Values(int64_t{64}, int64_t{517}),
                                            ::testing::Values(DType::kF32, DType::kBF16)));

// The ring lending its own K/V's storage as a receive buffer (CpOptions::kv_use) over processes:
// each rank's rows equal the reference; bytes, peak K/V and the storage allocated equal
// ring_schedule with AttnShape::kv_use; kLend returns k and v as given (the own block brought
// home); even shards hold the own shard plus one block (kKeep: plus two).
class MpiRingKvUse : public ::testing::TestWithParam<std::tuple<KvUse, Layout, int64_t>> {};

TEST_P(MpiRingKvUse, MatchesReferenceAndSchedule) {
  auto [use, layout, seq] = GetParam();
  auto comm = mpi_world();
  const int n = comm->size(), r = comm->rank();
  Problem p;
  p.seq = seq;
  p.batch = 2;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 32;
  p.causal = true;
  const auto& in = inputs_for(p);
  Partition part(seq, n, layout);
  Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
  CpOptions opts;
  opts.causal = true;
  opts.kv_use = use;
  CpStats stats;
  comm->stats().reset();
  AttnState s = ring_attention(*comm, part, q, k, v, opts, &stats);
  const ErrorBound tol = seqpar::testing::bound_for(p);
  EXPECT_LE(max_abs_diff(s.out, shard(in.ref.out, part, r)), tol.out) << "rank " << r;
  Tensor lse4 = in.ref.lse;
  lse4.resize({p.batch, p.seq, p.heads, 1});
  Tensor want_lse = shard(lse4, part, r);
  want_lse.resize({p.batch, part.count(r), p.heads});
  EXPECT_LE(max_err_lse(s.lse, want_lse), tol.lse) << "rank " << r;
  if (use == KvUse::kLend) {
    EXPECT_EQ(max_abs_diff(k, shard(in.k, part, r)), 0) << "rank " << r;
    EXPECT_EQ(max_abs_diff(v, shard(in.v, part, r)), 0) << "rank " << r;
  }
  ParallelConfig cfg;
  cfg.layout = layout;
  cfg.mesh.ring = n;
  AttnShape shape = seqpar::testing::shape_of(p);
  shape.kv_use = use;
  const Schedule sched = ring_schedule(cfg, shape);
  const CommPrediction want = schedule_bytes(sched, r);
  EXPECT_EQ(comm->stats().total_sent(), want.sent) << "rank " << r;
  EXPECT_EQ(comm->stats().total_recv(), want.recv) << "rank " << r;
  EXPECT_EQ(stats.peak_kv_bytes, sched.ranks[r].peak_kv_bytes) << "rank " << r;
  EXPECT_EQ(stats.measured_kv_bytes, stats.peak_kv_bytes) << "rank " << r;
  if (seq % (2 * n) == 0) {
    EXPECT_EQ(stats.peak_kv_bytes, 2 * static_cast<int64_t>(k.nbytes() + v.nbytes()))
        << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(All, MpiRingKvUse,
                         ::testing::Combine(::testing::Values(KvUse::kLend, KvUse::kConsume),
                                            ::testing::Values(Layout::kContiguous, Layout::kStriped,
                                                              Layout::kZigzag),
                                            ::testing::Values(int64_t{64}, int64_t{517})));

}  // namespace seqpar
