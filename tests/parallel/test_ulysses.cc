// ulysses and usp against reference_attention: layouts, rank counts, odd head counts, GQA with
// split or replicated kv heads, uneven lengths, strict-mode errors, and exact bytes.
#include <gtest/gtest.h>

#include "parallel/cp_test_util.h"

namespace seqpar {

using seqpar::testing::Problem;
using seqpar::testing::inputs_for;
using seqpar::testing::max_err_lse;
using seqpar::testing::run_cp;

// Within the kernel path's error bound (docs/kernel.md "Error bounds").
void expect_matches(const Problem& p, const seqpar::testing::CpRun& run, const std::string& what) {
  const auto& ref = inputs_for(p).ref;
  const ErrorBound tol = seqpar::testing::bound_for(p);
  EXPECT_LE(max_abs_diff(run.state.out, ref.out), tol.out) << what;
  EXPECT_LE(max_err_lse(run.state.lse, ref.lse), tol.lse) << what;
}

// (layout, ranks, causal, (heads, kv_heads), seq)
using UlyssesParam = std::tuple<Layout, int, bool, std::pair<int, int>, int64_t>;
class UlyssesSweep : public ::testing::TestWithParam<UlyssesParam> {};

TEST_P(UlyssesSweep, MatchesReference) {
  auto [layout, ranks, causal, hk, seq] = GetParam();
  if (ranks > seq) GTEST_SKIP();
  Problem p;
  p.seq = seq;
  p.heads = hk.first;
  p.kv_heads = hk.second;
  p.head_dim = 32;
  p.causal = causal;
  expect_matches(p, run_cp(p, Strategy::kUlysses, layout, ranks), "ulysses");
}

INSTANTIATE_TEST_SUITE_P(
    All, UlyssesSweep,
    ::testing::Combine(::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Values(1, 2, 3, 4, 6, 8), ::testing::Bool(),
                       ::testing::Values(std::pair{4, 4}, std::pair{8, 2}, std::pair{3, 3},
                                         std::pair{7, 7}, std::pair{9, 3}, std::pair{6, 1}),
                       ::testing::Values(int64_t{9}, int64_t{130})));

TEST(Ulysses, IssueCases) {
  // (ranks, S, H) = (2,6,3), (2,5,4), (4,9,30), (4,10,8); heads 3 and 7 on 4 ranks.
  for (auto [ranks, seq, heads] : std::vector<std::tuple<int, int64_t, int64_t>>{
           {2, 6, 3}, {2, 5, 4}, {4, 9, 30}, {4, 10, 8}, {4, 64, 3}, {4, 64, 7}}) {
    for (bool causal : {false, true}) {
      Problem p;
      p.seq = seq;
      p.heads = heads;
      p.kv_heads = heads;
      p.head_dim = 16;
      p.causal = causal;
      expect_matches(p, run_cp(p, Strategy::kUlysses, Layout::kContiguous, ranks),
                     "ranks " + std::to_string(ranks) + " S " + std::to_string(seq) + " H " +
                         std::to_string(heads));
    }
  }
}

TEST(Ulysses, BatchAndBf16) {
  Problem p;
  p.batch = 2;
  p.seq = 41;
  p.heads = 6;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.causal = true;
  expect_matches(p, run_cp(p, Strategy::kUlysses, Layout::kZigzag, 4), "batch 2");
  expect_matches(p, run_cp(p, Strategy::kUsp, Layout::kZigzag, 4, {}, 2), "usp batch 2");
  p.batch = 1;
  p.dtype = DType::kBF16;
  expect_matches(p, run_cp(p, Strategy::kUlysses, Layout::kContiguous, 3), "bf16");
}

TEST(Ulysses, StrictRejectsIndivisibleShapes) {
  CpOptions strict;
  strict.ulysses_mode = UlyssesMode::kStrict;
  Partition even(64, 4, Layout::kContiguous);
  EXPECT_THROW(check_strategy_shape(Strategy::kUlysses, even, 5, 5, 4, strict), InvalidArgument);
  EXPECT_NO_THROW(check_strategy_shape(Strategy::kUlysses, even, 8, 8, 4, strict));
  Partition uneven(63, 4, Layout::kContiguous);
  EXPECT_THROW(check_strategy_shape(Strategy::kUlysses, uneven, 8, 8, 4, strict),
               InvalidArgument);
  try {
    check_strategy_shape(Strategy::kUlysses, even, 5, 5, 4, strict);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("valid degrees here: 1"), std::string::npos) << e.what();
  }
  // uaa takes both.
  EXPECT_NO_THROW(check_strategy_shape(Strategy::kUlysses, uneven, 5, 5, 4, {}));
}

// (ulysses degree, ring degree, layout, causal, (heads, kv_heads))
using UspParam = std::tuple<std::pair<int, int>, Layout, bool, std::pair<int, int>>;
class UspSweep : public ::testing::TestWithParam<UspParam> {};

TEST_P(UspSweep, MatchesReference) {
  auto [deg, layout, causal, hk] = GetParam();
  Problem p;
  p.seq = 101;
  p.heads = hk.first;
  p.kv_heads = hk.second;
  p.head_dim = 16;
  p.causal = causal;
  expect_matches(p, run_cp(p, Strategy::kUsp, layout, deg.first * deg.second, {}, deg.first),
                 "usp");
}

INSTANTIATE_TEST_SUITE_P(
    All, UspSweep,
    ::testing::Combine(::testing::Values(std::pair{2, 2}, std::pair{2, 4}, std::pair{4, 2},
                                         std::pair{1, 4}, std::pair{4, 1}, std::pair{3, 2},
                                         std::pair{2, 3}),
                       ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Bool(),
                       ::testing::Values(std::pair{4, 4}, std::pair{3, 3}, std::pair{8, 2},
                                         std::pair{9, 3})));

TEST(Usp, IssueCaseLengths3232Heads3) {
  const std::vector<int64_t> counts = {3, 2, 3, 2};
  Partition part = Partition::from_counts(counts);
  for (bool causal : {false, true}) {
    Problem p;
    p.seq = 10;
    p.heads = 3;
    p.kv_heads = 3;
    p.head_dim = 8;
    p.causal = causal;
    expect_matches(p, run_cp(p, Strategy::kUsp, part, {}, 2), "usp 2x2 3,2,3,2");
  }
}

TEST(Usp, StrictRejectsRingGroupsOfDifferentLengths) {
  CpOptions strict;
  strict.ulysses_mode = UlyssesMode::kStrict;
  const std::vector<int64_t> counts = {3, 3, 2, 2};
  Partition part = Partition::from_counts(counts);
  try {
    check_strategy_shape(Strategy::kUsp, part, 4, 4, 2, strict);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("group 0: 6 tokens, group 1: 4"), std::string::npos)
        << e.what();
  }
  // uaa runs it.
  Problem p;
  p.seq = 10;
  p.heads = 4;
  p.kv_heads = 4;
  p.head_dim = 8;
  p.causal = true;
  expect_matches(p, run_cp(p, Strategy::kUsp, part, {}, 2), "usp uaa 3,3,2,2");
}

class UlyssesBytes
    : public ::testing::TestWithParam<std::tuple<Strategy, int, int, std::pair<int, int>, int64_t>> {};

TEST_P(UlyssesBytes, EqualFormula) {
  auto [strategy, ranks, udeg, hk, seq] = GetParam();
  if (strategy == Strategy::kUsp && ranks % udeg != 0) GTEST_SKIP();
  Problem p;
  p.seq = seq;
  p.heads = hk.first;
  p.kv_heads = hk.second;
  p.head_dim = 8;
  p.causal = true;
  const int u = strategy == Strategy::kUsp ? udeg : 0;
  auto run = run_cp(p, strategy, Layout::kZigzag, ranks, {}, u);
  Partition part(seq, ranks, Layout::kZigzag);
  for (int r = 0; r < ranks; ++r) {
    auto want = predict_comm_bytes(strategy, part, r, 1, p.heads, p.kv_heads, p.head_dim, 4, u);
    EXPECT_EQ(run.comm[r].total_sent(), want.sent) << "rank " << r;
    EXPECT_EQ(run.comm[r].total_recv(), want.recv) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, UlyssesBytes,
    ::testing::Combine(::testing::Values(Strategy::kUlysses, Strategy::kUsp),
                       ::testing::Values(2, 4, 6, 8), ::testing::Values(2, 3),
                       ::testing::Values(std::pair{8, 8}, std::pair{8, 2}, std::pair{9, 3},
                                         std::pair{3, 1}),
                       ::testing::Values(int64_t{48}, int64_t{53})));

}  // namespace seqpar

namespace seqpar {

// What the caller keeps (AttnShape::out_dtype, lse) through the one entry point: the output in
// the inputs' dtype is the fp32 result rounded once (bit for bit), so within the oracle's bound
// plus that rounding; without the lse none comes back; ulysses and usp send only what is kept,
// and the bytes each rank sends and receives are the schedule's (attention_schedule).
// (strategy, ulysses degree (0: all ranks), ranks, dtype, lse, layout, (heads, kv_heads))
using OutputParam = std::tuple<Strategy, int, int, DType, bool, Layout, std::pair<int, int>>;
class OutputKept : public ::testing::TestWithParam<OutputParam> {};

TEST_P(OutputKept, RoundedOnceAndScheduled) {
  auto [strategy, u, ranks, dtype, lse, layout, hk] = GetParam();
  Problem p;
  p.batch = 2;
  p.seq = 61;
  p.heads = hk.first;
  p.kv_heads = hk.second;
  p.head_dim = 24;
  p.causal = layout == Layout::kZigzag;
  p.dtype = dtype;
  const auto& in = inputs_for(p);
  const Partition part(p.seq, ranks, layout);
  CpOptions opts;
  opts.causal = p.causal;
  AttnJob job = seqpar::testing::job_for(strategy, seqpar::testing::shape_of(p), part, opts, u);
  AttnJob kept = job;
  kept.shape.out_dtype = dtype;
  kept.shape.lse = lse;
  const Schedule full = attention_schedule(job.config, job.shape);
  const Schedule sched = attention_schedule(kept.config, kept.shape);
  std::vector<Tensor> outs(ranks), wide(ranks);
  std::vector<CommPrediction> measured(ranks);
  ThreadWorld::run(ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    const Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
    JobComms comms(comm, kept);
    AttnOutputs base;
    attention(job.config, job.shape, comms.sp(), job.place, {q, k, v}, base);
    comms.reset_stats();
    AttnOutputs out;
    attention(kept.config, kept.shape, comms.sp(), kept.place, {q, k, v}, out);
    const CommStats st = comms.stats();
    measured[r] = {st.total_sent(), st.total_recv()};
    EXPECT_EQ(out.out.dtype(), dtype);
    EXPECT_EQ(out.lse.ndim() > 0, lse) << "rank " << r;
    const Tensor rounded = base.out.to(dtype);
    ASSERT_EQ(out.out.nbytes(), rounded.nbytes());
    EXPECT_EQ(std::memcmp(out.out.raw(), rounded.raw(), rounded.nbytes()), 0) << "rank " << r;
    if (lse) {
      EXPECT_EQ(max_abs_diff(out.lse, base.lse), 0) << "rank " << r;
    }
    outs[r] = out.out.to(DType::kF32);
  });
  // The oracle: the kernel's bound, then one rounding to the output's precision (unit roundoff
  // 2^-8 for bf16, 2^-11 for fp16).
  const Tensor got = unshard(outs, part);
  const double u_out = dtype == DType::kBF16 ? 0x1p-8 : dtype == DType::kF16 ? 0x1p-11 : 0;
  const double tol = seqpar::testing::bound_for(p).out * (1 + u_out) +
                     u_out * seqpar::testing::max_abs(in.ref.out);
  EXPECT_LE(max_abs_diff(got, in.ref.out), tol);
  uint64_t saved = 0;
  for (int r = 0; r < ranks; ++r) {
    const CommPrediction want = schedule_bytes(sched, r);
    EXPECT_EQ(measured[r].sent, want.sent) << "rank " << r;
    EXPECT_EQ(measured[r].recv, want.recv) << "rank " << r;
    saved += schedule_bytes(full, r).sent - want.sent;
  }
  // Ulysses' second exchange: B·n_j·q_r·(D·(4 - o) + 4·!lse) fewer bytes from each member; the
  // other strategies send no output.
  const int64_t o = static_cast<int64_t>(dtype_size(dtype));
  if (!uses_ulysses(strategy)) {
    EXPECT_EQ(saved, 0u);
  } else if (ranks > 1 && (o < 4 || !lse)) {
    EXPECT_GT(saved, 0u);
    const int ug = u == 0 ? ranks : u;
    uint64_t want_saved = 0;  // every member's rows of the other members' heads
    for (int g = 0; g < ranks / ug; ++g)
      for (int to = 0; to < ug; ++to)
        for (int from = 0; from < ug; ++from)
          if (from != to)
            want_saved += static_cast<uint64_t>(p.batch * part.count(g * ug + to) *
                                                ulysses_q_heads(p.heads, ug, from).size() *
                                                (p.head_dim * (4 - o) + (lse ? 0 : 4)));
    EXPECT_EQ(saved, want_saved);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ulysses, OutputKept,
    ::testing::Combine(::testing::Values(Strategy::kUlysses), ::testing::Values(0),
                       ::testing::Values(2, 3, 4),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16), ::testing::Bool(),
                       ::testing::Values(Layout::kContiguous, Layout::kZigzag),
                       ::testing::Values(std::pair{4, 4}, std::pair{6, 2}, std::pair{3, 1})));
INSTANTIATE_TEST_SUITE_P(Usp, OutputKept,
                         ::testing::Combine(::testing::Values(Strategy::kUsp), ::testing::Values(2),
                                            ::testing::Values(4),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool(),
                                            ::testing::Values(Layout::kContiguous, Layout::kZigzag),
                                            ::testing::Values(std::pair{4, 4}, std::pair{6, 2})));
INSTANTIATE_TEST_SUITE_P(
    Others, OutputKept,
    ::testing::Combine(::testing::Values(Strategy::kRing, Strategy::kAllGather),
                       ::testing::Values(0), ::testing::Values(1, 3),
                       ::testing::Values(DType::kBF16), ::testing::Bool(),
                       ::testing::Values(Layout::kZigzag), ::testing::Values(std::pair{4, 2})));

}  // namespace seqpar
