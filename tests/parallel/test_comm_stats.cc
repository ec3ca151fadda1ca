// Measured CommStats and CpStats of every strategy equal its schedule (schedule.h) exactly:
// bytes per rank and per kind of op, work, peak K/V.
#include <gtest/gtest.h>

#include "parallel/cp_test_util.h"
#include "seqpar/comm/checked.h"
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

// What the caller gives up of its k and v (AttnShape::kv_use) through the one entry point, where
// blocks are copied (a CheckedCommunicator, which does not borrow): every strategy that runs a
// ring over k and v (ring, schedule steal, usp's ring part, joint attention's image ring) sends,
// receives and holds at peak what attention_schedule predicts for that kv_use (kLend: one more
// block each way, the own block brought home; joint attention lends what it is given to consume),
// the others as with kKeep; the output is the reference's, and kKeep and kLend give k and v back
// as given. (strategy, schedule, ulysses degree, text tokens, kv_use)
using KvUseCase = std::tuple<Strategy, ScheduleKind, int, int64_t, KvUse>;
class DoorKvUse : public ::testing::TestWithParam<KvUseCase> {};

TEST_P(DoorKvUse, AsScheduled) {
  auto [strategy, schedule, u, text, use] = GetParam();
  const int ranks = 4;
  Problem p;
  p.batch = 2;
  p.seq = 64;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.causal = text == 0;
  const auto& in = seqpar::testing::inputs_for(p);
  const Partition part(p.seq, ranks, Layout::kContiguous);
  CpOptions opts;
  opts.causal = p.causal;
  opts.schedule = schedule;
  AttnShape shape = seqpar::testing::shape_of(p);
  shape.text_tokens = text;
  shape.kv_use = use;
  const AttnJob job = seqpar::testing::job_for(strategy, shape, part, opts, u);
  const Schedule sched = attention_schedule(job.config, job.shape);
  const Tensor tq = random_normal({p.batch, text, p.heads, p.head_dim}, 7);
  const Tensor tk = random_normal({p.batch, text, p.kv_heads, p.head_dim}, 8);
  const Tensor tv = random_normal({p.batch, text, p.kv_heads, p.head_dim}, 9);
  std::vector<Tensor> outs(ranks);
  std::vector<CommStats> stats(ranks);
  std::vector<CpStats> cp(ranks);
  std::vector<int> given_back(ranks, 0);
  ThreadWorld::run(ranks, [&](Communicator& world) {
    const int r = world.rank();
    CheckedCommunicator checked(world);
    JobComms comms(checked, job);
    Tensor q = shard(in.q, part, r), k = shard(in.k, part, r), v = shard(in.v, part, r);
    const bool joint = text > 0;
    AttnOutputs out;
    attention(job.config, job.shape, comms.sp(), job.place,
              joint ? AttnInputs{q, k, v, tq, tk, tv} : AttnInputs{q, k, v}, out, &cp[r],
              job.kernel);
    stats[r] = comms.stats();
    given_back[r] =
        max_abs_diff(k, shard(in.k, part, r)) == 0 && max_abs_diff(v, shard(in.v, part, r)) == 0;
    outs[r] = std::move(out.out);
  });
  if (text == 0) {
    EXPECT_LE(max_abs_diff(unshard(outs, part), in.ref.out), seqpar::testing::bound_for(p).out);
  }
  for (int r = 0; r < ranks; ++r) {
    const CommPrediction want = schedule_bytes(sched, r);
    EXPECT_EQ(stats[r].total_sent(), want.sent) << "rank " << r;
    EXPECT_EQ(stats[r].total_recv(), want.recv) << "rank " << r;
    EXPECT_EQ(cp[r].peak_kv_bytes, sched.ranks[r].peak_kv_bytes) << "rank " << r;
    if (use != KvUse::kConsume || text > 0) {
      EXPECT_TRUE(given_back[r]) << "rank " << r;
    }
  }
  // kLend, and kConsume in joint attention: one more block each way than kKeep on a ring.
  AttnJob keep = job;
  keep.shape.kv_use = KvUse::kKeep;
  const Schedule kept = attention_schedule(keep.config, keep.shape);
  const bool lent = use == KvUse::kLend || (use == KvUse::kConsume && text > 0);
  const bool ring = strategy == Strategy::kRing || strategy == Strategy::kUsp;
  for (int r = 0; r < ranks; ++r) {
    const uint64_t extra = schedule_bytes(sched, r).recv - schedule_bytes(kept, r).recv;
    EXPECT_EQ(extra > 0, lent && ring) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, DoorKvUse,
    ::testing::Combine(::testing::Values(Strategy::kRing, Strategy::kUsp, Strategy::kAllGather),
                       ::testing::Values(ScheduleKind::kDefault), ::testing::Values(2),
                       ::testing::Values(int64_t{0}, int64_t{5}),
                       ::testing::Values(KvUse::kKeep, KvUse::kLend, KvUse::kConsume)));
INSTANTIATE_TEST_SUITE_P(
    Steal, DoorKvUse,
    ::testing::Combine(::testing::Values(Strategy::kRing), ::testing::Values(ScheduleKind::kSteal),
                       ::testing::Values(1), ::testing::Values(int64_t{0}),
                       ::testing::Values(KvUse::kKeep, KvUse::kLend, KvUse::kConsume)));

}  // namespace seqpar
