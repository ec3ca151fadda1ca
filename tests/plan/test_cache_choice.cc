// choose_cache_strategy: the fastest of pass-KV, ring pass-Q and all-gather pass-Q by replayed
// schedules, on shapes and profiles where each one wins; the predicted times in the reason; the
// planner's decode choice and its schedule pin.
#include <gtest/gtest.h>

#include "seqpar/plan/cache_choice.h"
#include "seqpar/plan/planner.h"

namespace seqpar {
namespace {

AttnShape cache_shape(int64_t cached, int64_t fresh, int64_t heads, int64_t kv_heads) {
  AttnShape s;
  s.batch = 1;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = 128;
  s.causal = true;
  s.cached = cached;
  s.fresh = fresh;
  s.seq = cached + fresh;
  s.dtype = DType::kBF16;
  return s;
}

ParallelConfig group(int n) {
  ParallelConfig c;
  c.mesh.ring = n;
  return c;
}

// One rank per node: every transfer crosses nodes at `bw`.
HardwareProfile nodes(double flops, double bw, double latency) {
  HardwareProfile hw = hardware_profile("h100");
  hw.attention_flops = hw.gemm_flops = flops;
  hw.inter_node_bw = bw;
  hw.inter_node_latency_s = latency;
  hw.ranks_per_node = 1;
  return hw;
}

TEST(CacheChoice, PassKvWhenNewTokensDominate) {
  // A prefill of 8K new tokens over a 1K cache with 8 query heads per K/V head: the K/V shards
  // are a fraction of the queries plus their fp32 partials.
  const CacheStrategyChoice c =
      choose_cache_strategy(group(4), cache_shape(1024, 8192, 32, 4), nodes(989e12, 50e9, 20e-6));
  EXPECT_EQ(c.config.strategy, Strategy::kPassKv) << c.reason;
  ASSERT_TRUE(c.passkv_s && c.passq_s && c.passq_ring_s);
  EXPECT_LT(*c.passkv_s, *c.passq_ring_s);
  EXPECT_LT(*c.passkv_s, *c.passq_s);
  EXPECT_NE(c.reason.find("Meta's rule"), std::string::npos) << c.reason;
}

TEST(CacheChoice, RingPassQForThousandsOfNewTokensOverALongCache) {
  // 4K new tokens over 256K cached, no GQA: the cache is far too big to move, and the queries'
  // transfers hide behind the attention of the Q blocks in the ring (all-gathered they do not).
  const CacheStrategyChoice c = choose_cache_strategy(group(4), cache_shape(262144, 4096, 32, 32),
                                                      nodes(989e12, 50e9, 20e-6));
  EXPECT_EQ(c.config.strategy, Strategy::kPassQ) << c.reason;
  EXPECT_EQ(c.config.schedule, ScheduleKind::kRing) << c.reason;
  ASSERT_TRUE(c.passkv_s && c.passq_s && c.passq_ring_s);
  EXPECT_LT(*c.passq_ring_s, *c.passq_s);
  EXPECT_LT(*c.passq_ring_s, *c.passkv_s);
  EXPECT_EQ(c.reason.rfind("passq ring:", 0), 0u) << c.reason;
}

TEST(CacheChoice, AllGatherPassQForOneNewToken) {
  // Decode of one token: the ring forwards its one Q block over N-1 hops in a row, the
  // all-gather in one collective.
  const CacheStrategyChoice c =
      choose_cache_strategy(group(4), cache_shape(65536, 1, 128, 8), nodes(989e12, 1e9, 20e-6));
  EXPECT_EQ(c.config.strategy, Strategy::kPassQ) << c.reason;
  EXPECT_EQ(c.config.schedule, ScheduleKind::kDefault) << c.reason;
  ASSERT_TRUE(c.passkv_s && c.passq_s && c.passq_ring_s);
  EXPECT_LT(*c.passq_s, *c.passq_ring_s);
  EXPECT_LT(*c.passq_s, *c.passkv_s);
}

TEST(CacheChoice, OneRankFallsBackToTheRule) {
  const CacheStrategyChoice c =
      choose_cache_strategy(group(1), cache_shape(100, 4, 8, 8), hardware_profile("h100"));
  EXPECT_FALSE(c.passkv_s || c.passq_s || c.passq_ring_s);
  EXPECT_EQ(c.config.strategy, c.rule.kind);
  EXPECT_THROW(choose_cache_strategy(group(2), cache_shape(100, 0, 8, 8), hardware_profile("h100")),
               InvalidArgument);
}

TEST(CacheChoice, PlannerEnumeratesBothPassQSchedulesAndPinsOne) {
  PlanRequest req;
  req.work = attention_workload(0, 32, 32, 128, 1, true, DType::kBF16, 0, 262144, 4096);
  req.world = 4;
  req.hw = nodes(989e12, 50e9, 20e-6);
  req.layout = Layout::kContiguous;
  const Plan all = make_plan(req);
  bool ring = false, gather = false;
  for (const MeshCost& m : all.ranked)
    if (m.config.strategy == Strategy::kPassQ && m.config.sp() == 4)
      (m.config.schedule == ScheduleKind::kRing ? ring : gather) = true;
  EXPECT_TRUE(ring);
  EXPECT_TRUE(gather);
  ASSERT_TRUE(all.decode.has_value());
  ASSERT_TRUE(all.decode->passq_ring_step_s.has_value());
  EXPECT_EQ(all.decode->fastest, Strategy::kPassQ);
  EXPECT_EQ(all.decode->fastest_schedule, ScheduleKind::kRing);
  req.schedule = ScheduleKind::kRing;
  const Plan pinned = make_plan(req);
  ASSERT_FALSE(pinned.ranked.empty());
  for (const MeshCost& m : pinned.ranked) {
    EXPECT_EQ(m.config.strategy, Strategy::kPassQ);
    EXPECT_EQ(m.config.schedule, ScheduleKind::kRing);
  }
}

}  // namespace
}  // namespace seqpar
