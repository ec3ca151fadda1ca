// Every strategy x layout x ranks x causal x GQA x uneven length against reference_attention.
#include <gtest/gtest.h>

#include "parallel/cp_test_util.h"
#include "seqpar/comm/checked.h"

namespace seqpar {

using seqpar::testing::Inputs;
using seqpar::testing::inputs_for;
using seqpar::testing::max_err_lse;
using seqpar::testing::Problem;
using seqpar::testing::run_cp;
using seqpar::testing::shape_of;

using seqpar::testing::bound_for;

// (strategy, layout, ranks, causal, (heads, kv_heads), seq)
using SweepParam = std::tuple<Strategy, Layout, int, bool, std::pair<int, int>, int64_t>;

// One sweep point with inputs of `dtype` against the reference within the kernel path's error
// bound (out and lse). usp: Ulysses groups of 2 where the ranks allow it, else of 1 (ring
// across all).
void expect_sweep_point(const SweepParam& param, DType dtype) {
  auto [strategy, layout, ranks, causal, hk, seq] = param;
  Problem p;
  p.seq = seq;
  p.heads = hk.first;
  p.kv_heads = hk.second;
  p.head_dim = 64;
  p.causal = causal;
  p.dtype = dtype;
  const int ulysses_degree = strategy == Strategy::kUsp ? (ranks % 2 == 0 ? 2 : 1) : 0;
  auto run = run_cp(p, strategy, layout, ranks, {}, ulysses_degree);
  const auto& ref = inputs_for(p).ref;
  const ErrorBound tol = bound_for(p);
  EXPECT_LE(max_abs_diff(run.state.out, ref.out), tol.out);
  EXPECT_LE(max_err_lse(run.state.lse, ref.lse), tol.lse);
}

class StrategySweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(StrategySweep, MatchesReference) { expect_sweep_point(GetParam(), DType::kF32); }

std::string sweep_name(const ::testing::TestParamInfo<SweepParam>& info) {
  auto [strategy, layout, ranks, causal, hk, seq] = info.param;
  return std::string(strategy_name(strategy)) + "_" + std::string(layout_name(layout)) + "_n" +
         std::to_string(ranks) + (causal ? "_causal" : "_full") + "_h" + std::to_string(hk.first) +
         "kv" + std::to_string(hk.second) + "_s" + std::to_string(seq);
}

INSTANTIATE_TEST_SUITE_P(
    Small, StrategySweep,
    ::testing::Combine(::testing::Values(Strategy::kAllGather, Strategy::kRing),
                       ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Values(1, 2, 3, 4, 8), ::testing::Bool(),
                       ::testing::Values(std::pair{4, 4}, std::pair{4, 1}, std::pair{6, 3}),
                       ::testing::Values(int64_t{8}, int64_t{37}, int64_t{300})),
    sweep_name);

// The uneven lengths of the issue (3816 and 3817 tokens), fewer combinations.
INSTANTIATE_TEST_SUITE_P(Uneven, StrategySweep,
                         ::testing::Combine(::testing::Values(Strategy::kAllGather,
                                                              Strategy::kRing),
                                            ::testing::Values(Layout::kContiguous, Layout::kZigzag),
                                            ::testing::Values(1, 2, 3, 4, 8), ::testing::Bool(),
                                            ::testing::Values(std::pair{2, 1}),
                                            ::testing::Values(int64_t{3816}, int64_t{3817})),
                         sweep_name);

// bf16 inputs through every strategy (communication carries bf16): the reference runs on the
// same bf16-rounded inputs, so the error is the kernel's own, bounded per path
// (docs/kernel.md "Error bounds").

// (strategy, layout, ranks, causal, (heads, kv_heads), seq)
class StrategySweepBf16 : public ::testing::TestWithParam<SweepParam> {};

TEST_P(StrategySweepBf16, MatchesReference) { expect_sweep_point(GetParam(), DType::kBF16); }

INSTANTIATE_TEST_SUITE_P(Bf16, StrategySweepBf16,
                         ::testing::Combine(::testing::Values(Strategy::kAllGather, Strategy::kRing,
                                                              Strategy::kUlysses, Strategy::kUsp),
                                            ::testing::Values(Layout::kContiguous, Layout::kStriped,
                                                              Layout::kZigzag),
                                            ::testing::Values(2, 3, 4), ::testing::Bool(),
                                            ::testing::Values(std::pair{4, 2}, std::pair{6, 3}),
                                            ::testing::Values(int64_t{37}, int64_t{300})),
                         sweep_name);

TEST(Strategies, BatchAndOddShapes) {
  Problem p;
  p.batch = 3;
  p.seq = 53;
  p.heads = 5;
  p.kv_heads = 5;
  p.head_dim = 24;
  for (bool causal : {false, true}) {
    p.causal = causal;
    for (Strategy s : {Strategy::kAllGather, Strategy::kRing}) {
      for (int ranks : {2, 3, 7}) {
        auto run = run_cp(p, s, Layout::kZigzag, ranks);
        EXPECT_LE(max_abs_diff(run.state.out, inputs_for(p).ref.out), bound_for(p).out)
            << strategy_name(s) << " ranks " << ranks << " causal " << causal;
      }
    }
  }
}

TEST(Strategies, Bf16InputsWithinTolerance) {
  // The reference runs on the same bf16-rounded inputs; the bound is the bf16 path's.
  Problem p;
  p.seq = 200;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.dtype = DType::kBF16;
  p.causal = true;
  for (Strategy s : {Strategy::kAllGather, Strategy::kRing}) {
    auto run = run_cp(p, s, Layout::kContiguous, 4);
    EXPECT_LE(max_abs_diff(run.state.out, inputs_for(p).ref.out), bound_for(p).out);
    EXPECT_LE(max_err_lse(run.state.lse, inputs_for(p).ref.lse), bound_for(p).lse);
  }
}

TEST(Strategies, RingKeepsTwoBlocksInFlight) {
  Problem p;
  p.seq = 1000;
  p.heads = 2;
  p.kv_heads = 2;
  p.head_dim = 32;
  const int ranks = 8;
  auto run = run_cp(p, Strategy::kRing, Layout::kContiguous, ranks);
  Partition part(p.seq, ranks, Layout::kContiguous);
  const int64_t token_kv = 2 * p.kv_heads * p.head_dim * 4;
  for (int r = 0; r < ranks; ++r) {
    const int64_t own = part.count(r) * token_kv;
    const int64_t two_blocks = 2 * (part.max_count() * token_kv + 2 * 64);  // + alignment
    EXPECT_GE(run.cp[r].peak_kv_bytes, own);
    EXPECT_LE(run.cp[r].peak_kv_bytes, own + two_blocks) << "rank " << r;
  }
  auto ag = run_cp(p, Strategy::kAllGather, Layout::kContiguous, ranks);
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(ag.cp[r].peak_kv_bytes, p.seq * token_kv);
}

// CpOptions::kv_use kLend and kConsume: the own K/V's storage is one of the ring's two buffers.
// Copying (a CheckedCommunicator, which does not borrow) and zero copy (the threads backend):
// results as the reference's, bytes and peak K/V as ring_schedule predicts (AttnShape::kv_use), the
// storage allocated equal to the peak when copying, and kLend's k and v as given on return.
// Even shards: the own shard plus one block (kKeep: plus two).
using KvUseParam = std::tuple<KvUse, Layout, int, int64_t, bool>;  // use, layout, ranks, seq, copy

class RingKvUse : public ::testing::TestWithParam<KvUseParam> {};

TEST_P(RingKvUse, MatchesReferenceAndSchedule) {
  auto [use, layout, ranks, seq, copy] = GetParam();
  Problem p;
  p.seq = seq;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.causal = true;
  const Inputs& in = inputs_for(p);
  const Partition part(seq, ranks, layout);
  CpOptions opts;
  opts.causal = true;
  opts.kv_use = use;
  std::vector<Tensor> outs(ranks), lses(ranks);
  std::vector<CommStats> comm_stats(ranks);
  std::vector<CpStats> cp(ranks);
  std::vector<int> restored(ranks, 0);
  ThreadWorld::run(ranks, [&](Communicator& world) {
    const int r = world.rank();
    CheckedCommunicator checked(world);
    Communicator& comm = copy ? static_cast<Communicator&>(checked) : world;
    Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
    AttnState s = ring_attention(comm, part, q, k, v, opts, &cp[r]);
    comm_stats[r] = comm.stats();
    restored[r] =
        max_abs_diff(k, shard(in.k, part, r)) == 0 && max_abs_diff(v, shard(in.v, part, r)) == 0;
    outs[r] = std::move(s.out);
    lses[r] = std::move(s.lse);
    lses[r].resize({p.batch, part.count(r), p.heads, 1});
  });
  Tensor out = unshard(outs, part), lse = unshard(lses, part);
  lse.resize({p.batch, p.seq, p.heads});
  EXPECT_LE(max_abs_diff(out, in.ref.out), bound_for(p).out);
  EXPECT_LE(max_err_lse(lse, in.ref.lse), bound_for(p).lse);

  ParallelConfig cfg;
  cfg.layout = layout;
  cfg.mesh.ring = ranks;
  AttnShape shape = shape_of(p);
  shape.kv_use = use;
  const Schedule sched = ring_schedule(cfg, shape);
  const int64_t token_kv = 2 * p.kv_heads * p.head_dim * 4;
  for (int r = 0; r < ranks; ++r) {
    const CommPrediction want = schedule_bytes(sched, r);
    EXPECT_EQ(comm_stats[r].total_sent(), want.sent) << "rank " << r;
    EXPECT_EQ(comm_stats[r].total_recv(), want.recv) << "rank " << r;
    EXPECT_EQ(cp[r].peak_kv_bytes, sched.ranks[r].peak_kv_bytes) << "rank " << r;
    EXPECT_EQ(cp[r].measured_kv_bytes, copy ? cp[r].peak_kv_bytes : part.count(r) * token_kv)
        << "rank " << r;
    if (use == KvUse::kLend || !copy) {
      EXPECT_TRUE(restored[r]) << "rank " << r;
    }
    if (ranks > 1 && seq % (2 * ranks) == 0) {  // even shards, 64-byte multiples: own + a block
      EXPECT_EQ(cp[r].peak_kv_bytes, 2 * part.count(r) * token_kv) << "rank " << r;
    }
  }
  // kLend: one more block each way than kKeep, the own block home.
  const Schedule keep = ring_schedule(cfg, shape_of(p));  // kKeep
  for (int r = 0; r < ranks && ranks > 1 && use == KvUse::kLend; ++r)
    EXPECT_EQ(schedule_bytes(sched, r).recv,
              schedule_bytes(keep, r).recv + static_cast<uint64_t>(part.count(r) * token_kv));
}

INSTANTIATE_TEST_SUITE_P(All, RingKvUse,
                         ::testing::Combine(::testing::Values(KvUse::kLend, KvUse::kConsume),
                                            ::testing::Values(Layout::kContiguous, Layout::kZigzag),
                                            ::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(int64_t{37}, int64_t{120}),
                                            ::testing::Bool()));

TEST(Strategies, CausalWorkMatchesVisiblePairs) {
  Problem p;
  p.seq = 96;
  p.heads = 2;
  p.kv_heads = 2;
  p.causal = true;
  for (Strategy s : {Strategy::kAllGather, Strategy::kRing}) {
    for (Layout layout : {Layout::kContiguous, Layout::kStriped, Layout::kZigzag}) {
      auto run = run_cp(p, s, layout, 4);
      int64_t total = 0;
      for (const auto& c : run.cp) total += c.work;
      EXPECT_EQ(total, p.heads * p.seq * (p.seq + 1) / 2);
    }
  }
}

TEST(Strategies, RejectsMismatchedShapes) {
  Partition part(16, 2, Layout::kContiguous);
  EXPECT_THROW(ThreadWorld::run(2,
                                [&](Communicator& comm) {
                                  Tensor q({1, 8, 4, 16}), k({1, 7, 4, 16}), v({1, 7, 4, 16});
                                  ring_attention(comm, part, q, k, v, {});
                                }),
               InvalidArgument);
  EXPECT_THROW(parse_strategy("spiral"), InvalidArgument);
}

}  // namespace seqpar
