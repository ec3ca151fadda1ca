// choose_attention ("auto"): the planner's fastest way to run one call, over a cache (pass-KV,
// ring pass-Q, all-gather pass-Q each winning where it should) and over a sequence (ring,
// Ulysses, USP splits, steal); the same first choice as the planner for the same pins over a
// grid of requests; the planner's decode choice and its schedule pin.
#include <gtest/gtest.h>

#include "seqpar/parallel/strategy_table.h"
#include "seqpar/plan/planner.h"
#include "seqpar/plan/selection.h"

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

AttnShape sequence_shape(int64_t seq, int64_t heads, int64_t kv_heads, bool causal) {
  AttnShape s;
  s.seq = seq;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = 128;
  s.causal = causal;
  s.dtype = DType::kBF16;
  return s;
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

// A request that pins nothing but what the test sets: degrees 0 are chosen.
ParallelConfig free_request() {
  ParallelConfig c;
  c.mesh.ulysses = c.mesh.ring = 0;
  return c;
}

double time_of(const AttnChoice& c, const std::string& label) {
  for (const auto& [l, t] : c.candidates)
    if (l == label) return t;
  ADD_FAILURE() << "no candidate " << label << " in " << c.reason;
  return 0;
}

TEST(Selection, PassKvWhenNewTokensDominate) {
  // A prefill of 8K new tokens over a 1K cache with 8 query heads per K/V head: the K/V shards
  // are a fraction of the queries plus their fp32 partials.
  const AttnChoice c = choose_attention(free_request(), 4, cache_shape(1024, 8192, 32, 4),
                                        nodes(989e12, 50e9, 20e-6));
  EXPECT_EQ(c.config.strategy, Strategy::kPassKv) << c.reason;
  EXPECT_LT(time_of(c, "passkv"), time_of(c, "passq_ring"));
  EXPECT_LT(time_of(c, "passkv"), time_of(c, "passq"));
  ASSERT_TRUE(c.rule.has_value());
  EXPECT_NE(c.reason.find("Meta's rule"), std::string::npos) << c.reason;
}

TEST(Selection, RingPassQForThousandsOfNewTokensOverALongCache) {
  // 4K new tokens over 256K cached, no GQA: the cache is far too big to move, and the queries'
  // transfers hide behind the attention of the Q blocks in the ring (all-gathered they do not).
  const AttnChoice c = choose_attention(free_request(), 4, cache_shape(262144, 4096, 32, 32),
                                        nodes(989e12, 50e9, 20e-6));
  EXPECT_EQ(c.config.strategy, Strategy::kPassQ) << c.reason;
  EXPECT_EQ(c.config.schedule, ScheduleKind::kRing) << c.reason;
  EXPECT_LT(time_of(c, "passq_ring"), time_of(c, "passq"));
  EXPECT_LT(time_of(c, "passq_ring"), time_of(c, "passkv"));
  EXPECT_EQ(c.reason.rfind("passq_ring:", 0), 0u) << c.reason;
}

TEST(Selection, AllGatherPassQForOneNewToken) {
  // Decode of one token: the ring forwards its one Q block over N-1 hops in a row, the
  // all-gather in one collective.
  const AttnChoice c =
      choose_attention(free_request(), 4, cache_shape(65536, 1, 128, 8), nodes(989e12, 1e9, 20e-6));
  EXPECT_EQ(c.config.strategy, Strategy::kPassQ) << c.reason;
  EXPECT_EQ(c.config.schedule, ScheduleKind::kDefault) << c.reason;
  EXPECT_LT(time_of(c, "passq"), time_of(c, "passq_ring"));
  EXPECT_LT(time_of(c, "passq"), time_of(c, "passkv"));
}

TEST(Selection, OverASequenceEveryStrategyIsACandidate) {
  // 8 ranks on one NVLink node, 64K causal tokens, 32 heads: the candidates are the sequence
  // strategies (ring, its steal schedule, allgather, ulysses, every usp split), each costed.
  ParallelConfig request = free_request();
  request.layout = Layout::kContiguous;
  const AttnChoice c =
      choose_attention(request, 8, sequence_shape(65536, 32, 8, true), hardware_profile("h100"));
  for (const char* label : {"ring", "ring_steal", "allgather", "ulysses", "usp_u2_r4", "usp_u4_r2"})
    EXPECT_GT(time_of(c, label), 0) << label;
  EXPECT_EQ(c.config.sp(), 8);
  EXPECT_FALSE(c.rule.has_value());
  EXPECT_DOUBLE_EQ(c.predicted_s, c.candidates.front().second);
  // Pinned degrees narrow it: with ring_degree 2 only usp 4 x 2 takes them.
  request.mesh.ring = 2;
  const AttnChoice pinned =
      choose_attention(request, 8, sequence_shape(65536, 32, 8, true), hardware_profile("h100"));
  EXPECT_EQ(pinned.config.strategy, Strategy::kUsp) << pinned.reason;
  EXPECT_EQ(pinned.config.mesh.ulysses, 4);
  EXPECT_EQ(pinned.config.mesh.ring, 2);
}

TEST(Selection, TheRequestsOtherSettingsAreKept) {
  ParallelConfig request = free_request();
  request.layout = Layout::kZigzag;
  request.ulysses_mode = UlyssesMode::kStrict;
  request.pad = true;
  const AttnChoice c =
      choose_attention(request, 4, sequence_shape(4099, 8, 8, true), hardware_profile("h100"));
  EXPECT_EQ(c.config.layout, Layout::kZigzag);
  EXPECT_EQ(c.config.ulysses_mode, UlyssesMode::kStrict);
  EXPECT_TRUE(c.config.pad);
  validate_config(c.config, sequence_shape(4099, 8, 8, true));  // the choice runs
}

// The same first choice as the planner for the same pins, over a grid of requests: shapes over
// a sequence and over a cache, 1 to 8 ranks, GQA or not, causal or not, two profiles.
TEST(Selection, AgreesWithThePlannersFirstChoiceOverAGrid) {
  int checked = 0;
  for (const char* profile : {"h100", "cpu-ethernet"})
    for (int ranks : {1, 2, 3, 4, 8})
      for (bool cache : {false, true})
        for (int64_t kv : {8, 2})
          for (bool causal : {true, false}) {
            if (cache && !causal) continue;
            const AttnShape s = cache ? cache_shape(16384, ranks * 37, 8, kv)
                                      : sequence_shape(8192 + ranks, 8, kv, causal);
            ParallelConfig request = free_request();
            request.layout = Layout::kContiguous;
            const HardwareProfile hw = hardware_profile(profile);
            const AttnChoice c = choose_attention(request, ranks, s, hw);
            PlanRequest req;
            req.work = attention_workload(s.seq, s.heads, s.kv(), s.head_dim, s.batch, s.causal,
                                          s.dtype, 0, s.cached, s.fresh);
            req.world = ranks;
            req.hw = hw;
            req.memory_limit = 1e30;
            req.cfg = req.tp = 1;
            req.layout = Layout::kContiguous;
            req.ulysses_mode = request.ulysses_mode;
            req.softmax = request.softmax;
            req.pad = false;
            const Plan plan = make_plan(req);
            ASSERT_FALSE(plan.ranked.empty());
            const ParallelConfig& first = plan.ranked.front().config;
            EXPECT_EQ(candidate_label(c.config), candidate_label(first))
                << profile << " ranks " << ranks << (cache ? " cache" : " sequence") << " kv " << kv
                << (causal ? " causal" : "");
            validate_config(c.config, s);
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 5 * 2 * 3);
}

TEST(Selection, PlannerEnumeratesBothPassQSchedulesAndPinsOne) {
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
