// Measured CommStats and CpStats of every strategy equal its schedule (schedule.h) exactly:
// bytes per rank and per kind of op, work, peak K/V.
#include <gtest/gtest.h>

#include "parallel/cp_test_util.h"
#include "seqpar/parallel/schedule.h"

namespace seqpar {

using seqpar::testing::Problem;
using seqpar::testing::run_cp;

class CommBytes
    : public ::testing::TestWithParam<std::tuple<Strategy, Layout, int, int64_t, int, DType>> {};

TEST_P(CommBytes, EqualFormula) {
  auto [strategy, layout, ranks, seq, batch, dtype] = GetParam();
  Problem p;
  p.seq = seq;
  p.batch = batch;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.dtype = dtype;
  p.causal = true;
  auto run = run_cp(p, strategy, layout, ranks);
  ParallelConfig c;
  c.strategy = ranks == 1 ? Strategy::kLocal : strategy;
  c.mesh.ring = ranks;
  c.layout = layout;
  AttnShape shape{.batch = batch,
                  .seq = seq,
                  .heads = p.heads,
                  .kv_heads = p.kv_heads,
                  .head_dim = p.head_dim,
                  .causal = true,
                  .dtype = dtype};
  const Schedule s = attention_schedule(c, shape);
  Partition part(seq, ranks, layout);
  // Work, peak K/V, and the ops that carry the bytes, step by step: ring only point-to-point,
  // allgather only all-gathers.
  seqpar::testing::expect_schedule_matches(s, run);
  for (int r = 0; r < ranks; ++r) {
    const CommPrediction want = schedule_bytes(s, r);
    EXPECT_EQ(run.comm[r].total_sent(), want.sent) << "rank " << r;
    EXPECT_EQ(run.comm[r].total_recv(), want.recv) << "rank " << r;
    // The Partition entry gives the same bytes.
    const CommPrediction p_want = predict_comm_bytes(strategy, part, r, batch, p.heads, p.kv_heads,
                                                     p.head_dim, dtype_size(dtype));
    EXPECT_EQ(p_want.sent, want.sent) << "rank " << r;
    EXPECT_EQ(p_want.recv, want.recv) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, CommBytes,
    ::testing::Combine(::testing::Values(Strategy::kAllGather, Strategy::kRing),
                       ::testing::Values(Layout::kContiguous, Layout::kStriped, Layout::kZigzag),
                       ::testing::Values(1, 2, 3, 4, 8),
                       ::testing::Values(int64_t{64}, int64_t{67}), ::testing::Values(1, 2),
                       ::testing::Values(DType::kF32, DType::kBF16)));

TEST(CommBytes, EvenFormulaOfDesign) {
  // 2·S·Hkv·D·e·(N-1)/N per rank for both strategies when S divides.
  const int64_t S = 1024, Hkv = 2, D = 16, e = 4;
  for (int n : {2, 4, 8}) {
    Partition part(S, n, Layout::kContiguous);
    for (Strategy s : {Strategy::kAllGather, Strategy::kRing}) {
      auto p = predict_comm_bytes(s, part, 0, 1, 4, Hkv, D, e);
      EXPECT_EQ(p.sent, static_cast<uint64_t>(2 * S * Hkv * D * e * (n - 1) / n));
      EXPECT_EQ(p.recv, p.sent);
    }
  }
}

}  // namespace seqpar

namespace seqpar {

// The groups a replayer synchronizes: usp's Ulysses groups are consecutive sp ranks, its rings
// the ranks of one Ulysses rank; a ring step overlaps compute, a collective does not; const-max
// starts the ring with the key norms' all-reduce.
TEST(Schedule, UspGroupsAndRingSteps) {
  ParallelConfig c;
  c.strategy = Strategy::kUsp;
  c.mesh.ulysses = 2;
  c.mesh.ring = 3;
  c.softmax = SoftmaxMode::kConstMax;
  const AttnShape shape{.seq = 60, .heads = 4, .kv_heads = 2, .head_dim = 8};
  const Schedule s = attention_schedule(c, shape);
  ASSERT_EQ(s.sp(), 6);
  for (int r = 0; r < 6; ++r) {
    int ring_steps = 0, exchanges = 0;
    bool norms = false;
    for (const Step& step : s.ranks[r].steps) {
      if (!step.comm) continue;
      const Transfer& t = *step.comm;
      if (t.group == CommGroup::kRing) {
        EXPECT_EQ(t.members, (GroupMembers{r % 2, 2, 3})) << "rank " << r;
        if (t.op == OpKind::kAllReduce) {
          EXPECT_EQ(ring_steps, 0) << "rank " << r << ": the key norms come first";
          norms = true;
        } else {
          EXPECT_EQ(t.op, OpKind::kSendRecv);
          EXPECT_TRUE(t.overlaps_compute && norms) << "rank " << r;
          ++ring_steps;
        }
      } else {
        EXPECT_EQ(t.group, CommGroup::kUlysses);
        EXPECT_EQ(t.members, (GroupMembers{r / 2 * 2, 1, 2})) << "rank " << r;
        EXPECT_FALSE(t.overlaps_compute);
        ++exchanges;
        if (t.op == OpKind::kAllToAll) {
          EXPECT_EQ(t.peers.size(), 1u);
        }
      }
    }
    EXPECT_EQ(ring_steps, 2) << "rank " << r;  // R - 1 transfers
    EXPECT_EQ(exchanges, 3) << "rank " << r;   // counts, q + k + v, out + lse
  }
}

}  // namespace seqpar
