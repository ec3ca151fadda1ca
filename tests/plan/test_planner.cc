// The planner: the Wan example (3645 tokens on 8 ranks), the ranking and its rejections, Meta's
// worked examples of the pass-KV / pass-Q choice, and the one-line errors with alternatives.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "seqpar/parallel/schedule.h"
#include "seqpar/parallel/strategy_table.h"
#include "seqpar/plan/planner.h"

namespace seqpar {
namespace {

PlanRequest wan_request(int world) {
  PlanRequest req;
  const ModelPreset& wan = model_preset("wan2.1-t2v-14b");
  const LatentShape s = latent_shape(wan, 33, 240, 432);
  req.work = model_workload(wan, s.tokens, 1, DType::kBF16, true, 0);
  req.world = world;
  req.hw = hardware_profile("h100");
  req.preset = &wan;
  req.frames = 33;
  req.height = 240;
  req.width = 432;
  return req;
}

TEST(Planner, WanSequenceDoesNotDivideEight) {
  const Plan plan = make_plan(wan_request(8));
  const Divisibility& d = plan.divisibility;
  EXPECT_EQ(d.seq, 3645);  // 9 latent frames x 15 x 27 patches
  EXPECT_EQ(d.sp, 8);
  EXPECT_EQ(d.remainder, 5);
  EXPECT_EQ(d.shard_ceil, 456);
  EXPECT_EQ(d.shard_floor, 455);
  EXPECT_EQ(d.ranks_with_ceil, 5);
  EXPECT_EQ(d.padded_seq, 3648);
  EXPECT_EQ(d.padded_seq_zigzag, 3648);
  EXPECT_NEAR(d.pad_token_overhead, 3.0 / 3645, 1e-12);
  // Nearest shapes that divide by 8, each dimension on its own: 29 frames (8 latent frames),
  // height 256 (16 patch rows), width 384 (24 patch columns).
  std::set<std::pair<std::string, int64_t>> alts;
  for (const auto& a : d.alternatives) {
    EXPECT_EQ(a.tokens % 8, 0) << a.parameter << " " << a.value;
    alts.insert({a.parameter, a.value});
  }
  EXPECT_TRUE(alts.count({"frames", 29}));
  EXPECT_TRUE(alts.count({"height", 256}));
  EXPECT_TRUE(alts.count({"width", 384}));
  for (size_t i = 1; i < d.alternatives.size(); ++i)
    EXPECT_LE(std::llabs(d.alternatives[i - 1].tokens - 3645),
              std::llabs(d.alternatives[i].tokens - 3645));
}

TEST(Planner, RanksEveryMeshFastestFirstAndSaysWhyOthersCannotRun) {
  const Plan plan = make_plan(wan_request(8));
  ASSERT_FALSE(plan.ranked.empty());
  for (size_t i = 1; i < plan.ranked.size(); ++i)
    EXPECT_LE(plan.ranked[i - 1].step_s, plan.ranked[i].step_s * (1 + 1e-9));
  std::set<std::string> schemes;
  for (const auto& c : plan.ranked) {
    EXPECT_TRUE(c.fits_memory);
    EXPECT_EQ(c.config.world(), 8);
    schemes.insert(std::string(strategy_name(c.config.strategy)));
  }
  // Every strategy that can run uneven shards is among them.
  for (const char* s : {"ring", "allgather", "ulysses", "usp"}) EXPECT_TRUE(schemes.count(s)) << s;
  // Strict Ulysses over 3645 tokens on 8 ranks needs padding: rejected unpadded, ranked padded.
  bool strict_rejected = false, strict_padded_ranked = false;
  for (const auto& r : plan.rejected) {
    EXPECT_FALSE(r.reason.empty());
    if (r.config.strategy == Strategy::kUlysses && r.config.ulysses_mode == UlyssesMode::kStrict &&
        r.config.mesh.ulysses == 8 && !r.config.pad) {
      strict_rejected = true;
      EXPECT_NE(r.reason.find("3648"), std::string::npos) << r.reason;
    }
  }
  for (const auto& c : plan.ranked)
    if (c.config.strategy == Strategy::kUlysses && c.config.ulysses_mode == UlyssesMode::kStrict &&
        c.config.mesh.ulysses == 8 && c.config.pad)
      strict_padded_ranked = true;
  EXPECT_TRUE(strict_rejected);
  EXPECT_TRUE(strict_padded_ranked);
}

// Meshes of equal predicted time keep a stated order whatever order they are enumerated in: the
// degrees, a ring before an all-gather, uaa before strict, unpadded first, contiguous, zigzag,
// striped. The Wan example's layouts tie (non-causal): its first rows are usp 2 x 2 (its blocks
// keep Ulysses' output in bf16 without the lse) in the three layouts.
TEST(Planner, EqualTimesKeepAStatedOrder) {
  const Plan plan = make_plan(wan_request(8));
  ASSERT_GE(plan.ranked.size(), 3u);
  EXPECT_EQ(config_label(plan.ranked[0].config), "cfg 2 tp 1 ulysses 2 ring 2 usp(uaa) contiguous");
  EXPECT_EQ(config_label(plan.ranked[1].config), "cfg 2 tp 1 ulysses 2 ring 2 usp(uaa) zigzag");
  EXPECT_EQ(config_label(plan.ranked[2].config), "cfg 2 tp 1 ulysses 2 ring 2 usp(uaa) striped");
  auto rank = [](Layout l) { return l == Layout::kContiguous ? 0 : l == Layout::kZigzag ? 1 : 2; };
  for (size_t i = 1; i < plan.ranked.size(); ++i) {
    const ParallelConfig &a = plan.ranked[i - 1].config, &b = plan.ranked[i].config;
    if (plan.ranked[i - 1].step_s != plan.ranked[i].step_s) continue;
    ParallelConfig a_any = a, b_any = b;
    a_any.layout = b_any.layout = Layout::kContiguous;
    if (a_any == b_any) {
      EXPECT_LT(rank(a.layout), rank(b.layout)) << config_label(b);
    }
  }
  // Communication for free: the ring and the all-gather of one split take the same time, and
  // the ring (holding less K/V) comes first.
  PlanRequest req;
  req.work = attention_workload(4096, 8, 0, 128, 1, false, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.hw.latency_s = req.hw.inter_node_latency_s = req.hw.local_copy_bw = 0;
  req.hw.intra_node_bw = req.hw.inter_node_bw = 1e30;
  req.world = 4;
  req.layout = Layout::kContiguous;
  req.ulysses = 1;
  const Plan free = make_plan(req);
  ASSERT_EQ(free.ranked.size(), 2u);
  EXPECT_EQ(free.ranked[0].config.strategy, Strategy::kRing);
  EXPECT_EQ(free.ranked[1].config.strategy, Strategy::kAllGather);
  EXPECT_NEAR(free.ranked[0].step_s, free.ranked[1].step_s, 1e-12 * free.ranked[1].step_s);
}

TEST(Planner, PinsAndTensorParallelRejections) {
  PlanRequest req = wan_request(6);
  const Plan plan = make_plan(req);
  // tp 3 and tp 6 do not divide 40 heads: rejected for every split.
  int tp_rejections = 0;
  for (const auto& r : plan.rejected)
    if (r.config.mesh.ulysses == 0) {
      ++tp_rejections;
      EXPECT_NE(r.reason.find("does not divide the 40 heads"), std::string::npos);
    }
  EXPECT_GE(tp_rejections, 2);
  req.world = 8;
  req.strategy = Strategy::kRing;
  req.layout = Layout::kZigzag;
  req.cfg = 1;
  for (const auto& c : make_plan(req).ranked) {
    EXPECT_EQ(c.config.strategy, Strategy::kRing);
    EXPECT_EQ(c.config.layout, Layout::kZigzag);
    EXPECT_EQ(c.config.mesh.cfg, 1);
  }
}

PlanRequest llama405_decode(int64_t cached, int64_t fresh) {
  PlanRequest req;
  req.work =
      model_workload(model_preset("llama3-405b"), 0, 1, DType::kBF16, false, 0, cached, fresh);
  req.world = 4;
  req.hw = hardware_profile("h100");
  return req;
}

TEST(Planner, SoftmaxIsOnlineUnlessPinned) {
  PlanRequest req;
  req.work = attention_workload(8192, 8, 0, 128, 1, true, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.world = 4;
  std::set<Strategy> strategies;
  for (const MeshCost& c : make_plan(req).ranked) {
    EXPECT_EQ(c.config.softmax, SoftmaxMode::kOnline) << config_label(c.config);
    strategies.insert(c.config.strategy);
  }
  EXPECT_TRUE(strategies.count(Strategy::kAllGather) && strategies.count(Strategy::kUlysses));
  req.softmax = SoftmaxMode::kConstMax;  // ring and usp only, with the key norms' all-reduce
  const Plan plan = make_plan(req);
  ASSERT_FALSE(plan.ranked.empty());
  for (const MeshCost& c : plan.ranked) {
    EXPECT_TRUE(has_ring(c.config.strategy)) << config_label(c.config);
    EXPECT_EQ(c.config.softmax, SoftmaxMode::kConstMax) << config_label(c.config);
    bool norms = false;
    for (const auto& col : c.collectives) norms |= col.what == "key norms";
    EXPECT_TRUE(norms) << config_label(c.config);
  }
  req.strategy = Strategy::kAllGather;  // pinned without a ring: rejected with the reason
  try {
    (void)make_plan(req);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs a ring"), std::string::npos) << e.what();
  }
}

TEST(Planner, MetasWorkedExamples) {
  // Llama3 405B on 4 ranks of the H100 profile with 50 GB/s per rank between nodes, 128K tokens.
  // Threshold N·C·Hkv·e/(2·H·BW) = 4·989e12·8·2 / (2·128·50e9) = 4945 tokens.
  const Plan a = make_plan(llama405_decode(124800, 3200));  // 2.5% new
  ASSERT_TRUE(a.decode.has_value());
  EXPECT_EQ(a.decode->choice, Strategy::kPassQ);
  EXPECT_EQ(a.decode->basic.kind, Strategy::kPassQ);
  EXPECT_NEAR(a.decode->all2all.threshold_tokens, 4945.0, 1e-6);
  // All2All-aware: 2·8/128 - 4·3200·50e9 / (4·989e12·2) = 0.125 - 0.0808898 = 0.0441102.
  EXPECT_NEAR(a.decode->all2all.miss_threshold, 0.125 - 4.0 * 3200 * 50e9 / (4 * 989e12 * 2),
              1e-12);
  EXPECT_NEAR(a.decode->all2all.miss_rate, 0.025, 1e-12);
  const Plan b = make_plan(llama405_decode(115200, 12800));  // 10% new
  EXPECT_EQ(b.decode->choice, Strategy::kPassKv);
  EXPECT_EQ(b.decode->basic.kind, Strategy::kPassKv);
  // 405B does not fit 4 H100s: every mesh is over the memory limit, and the choice stands.
  EXPECT_TRUE(a.ranked.empty());
  EXPECT_FALSE(a.over_memory.empty());
}

TEST(Planner, All2AllVariantCanFlipTheChoice) {
  // Where the basic rule says pass-Q because T/(T+P) < 2·Hkv/H but the all-to-all of pass-Q's
  // partial outputs outweighs it: T = 4000 of 4945, miss rate 0.1 < 0.125 but
  // > 0.125 - 4·4000·50e9/(4·989e12·2) = 0.0239.
  const PassChoice basic = choose_pass(4000, 36000, 4, 128, 8, 2, 989e12, 50e9);
  const PassChoice a2a = choose_pass_all2all(4000, 36000, 4, 128, 8, 2, 989e12, 50e9);
  EXPECT_EQ(basic.kind, Strategy::kPassQ);
  EXPECT_EQ(a2a.kind, Strategy::kPassKv);
  // Decode of a single token over a long cache: pass-Q by both.
  EXPECT_EQ(choose_pass_all2all(1, 1 << 20, 8, 128, 8, 2, 989e12, 50e9).kind, Strategy::kPassQ);
}

TEST(Planner, InvalidRequestsNameTheCauseAndAnAlternative) {
  EXPECT_EQ(nearest_name("wan2.1-14b", model_preset_names()), "wan2.1-t2v-14b");
  EXPECT_EQ(nearest_name("llama3-7b", model_preset_names()), "llama3-8b");
  // More ranks than tokens, no tensor parallelism for a bare attention call.
  PlanRequest tiny;
  tiny.work = attention_workload(4, 1, 1, 16, 1, false, DType::kF32);
  tiny.world = 8;
  tiny.hw = hardware_profile("local");
  try {
    make_plan(tiny);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no mesh of 8 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 4"), std::string::npos) << m;
  }
  // A memory limit nothing fits: names the smallest need and a world size that fits.
  PlanRequest big = wan_request(2);
  big.memory_limit = 10e9;
  try {
    make_plan(big);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fits"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 4"), std::string::npos) << m;  // tp 4: 7 GB of weights
    EXPECT_NE(m.find("memory_limit"), std::string::npos) << m;
  }
  // Bad resolution: the preset's check names the nearest sizes.
  EXPECT_THROW(latent_shape(model_preset("wan2.1-t2v-14b"), 33, 250, 432), InvalidArgument);
}

TEST(Planner, LanguageModelDivisibilityAlternatives) {
  PlanRequest req;
  req.work = model_workload(model_preset("llama3-8b"), 100003, 1, DType::kBF16, false, 0);
  req.world = 8;
  req.hw = hardware_profile("h100");
  const Plan plan = make_plan(req);
  EXPECT_EQ(plan.divisibility.remainder, 100003 % 8);
  ASSERT_EQ(plan.divisibility.alternatives.size(), 2u);
  EXPECT_EQ(plan.divisibility.alternatives[0].value, 100000);
  EXPECT_EQ(plan.divisibility.alternatives[1].value, 100008);
  // Causal: the balanced layouts and ring's steal schedule beat contiguous ring (work imbalance
  // ~(2N-1)/N).
  const MeshCost* contiguous = nullptr;
  const MeshCost* zigzag = nullptr;
  const MeshCost* steal = nullptr;
  for (const auto& c : plan.ranked)
    if (c.config.strategy == Strategy::kRing && c.config.mesh.tp == 1 && !c.config.pad) {
      const bool plain = c.config.schedule == ScheduleKind::kDefault;
      if (c.config.layout == Layout::kContiguous && plain && !contiguous) contiguous = &c;
      if (c.config.layout == Layout::kContiguous && !plain && !steal) steal = &c;
      if (c.config.layout == Layout::kZigzag && !zigzag) zigzag = &c;
    }
  ASSERT_TRUE(contiguous && zigzag && steal);
  EXPECT_GT(contiguous->work_imbalance, 1.8);
  EXPECT_LT(zigzag->work_imbalance, 1.01);
  EXPECT_LT(zigzag->step_s, contiguous->step_s);
  EXPECT_EQ(steal->config.schedule, ScheduleKind::kSteal);
  EXPECT_LT(steal->work_imbalance, 1.01);
  EXPECT_LT(steal->step_s, contiguous->step_s);
}

// Ring's steal schedule: offered beside the plain ring for causal contiguous meshes only; pinned,
// the only schedule planned (other strategies rejected with the reason); the cost model replays
// its schedule (bytes, work and peak K/V per rank as attention_schedule gives them; those equal
// the measured ones in tests/parallel/test_steal.cc).
TEST(Planner, StealScheduleOfferedAndPinned) {
  PlanRequest req;
  req.work = attention_workload(8192, 8, 2, 128, 1, true, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.world = 4;
  int steal = 0;
  for (const MeshCost& c : make_plan(req).ranked)
    if (c.config.schedule == ScheduleKind::kSteal) {
      ++steal;
      EXPECT_EQ(c.config.strategy, Strategy::kRing);
      EXPECT_EQ(c.config.layout, Layout::kContiguous);
      EXPECT_LT(c.work_imbalance, 1.01);
    }
  EXPECT_GE(steal, 1);
  req.schedule = ScheduleKind::kSteal;
  const Plan pinned = make_plan(req);
  ASSERT_FALSE(pinned.ranked.empty());
  for (const MeshCost& c : pinned.ranked) {
    EXPECT_EQ(c.config.schedule, ScheduleKind::kSteal) << config_label(c.config);
    EXPECT_EQ(c.config.strategy, Strategy::kRing) << config_label(c.config);
    // h100 copies blocks: seqpar run's ring lends its k and v (AttnShape::kv_use kLend).
    const Schedule s = attention_schedule(c.config, {.batch = 1,
                                                     .seq = 8192,
                                                     .heads = 8,
                                                     .kv_heads = 2,
                                                     .head_dim = 128,
                                                     .causal = true,
                                                     .dtype = DType::kBF16,
                                                     .kv_use = KvUse::kLend});
    for (int r = 0; r < s.sp(); ++r) {
      EXPECT_EQ(c.ranks[r].sent, schedule_bytes(s, r).sent) << "rank " << r;
      EXPECT_EQ(c.ranks[r].recv, schedule_bytes(s, r).recv) << "rank " << r;
      EXPECT_EQ(c.ranks[r].work, schedule_work(s, r)) << "rank " << r;
      EXPECT_EQ(c.ranks[r].peak_kv_bytes, s.ranks[r].peak_kv_bytes) << "rank " << r;
    }
  }
  req.strategy = Strategy::kUlysses;
  EXPECT_THROW((void)make_plan(req), InvalidArgument);
  // Bidirectional: every mesh keeps its own schedule.
  req = PlanRequest{};
  req.work = attention_workload(8192, 8, 2, 128, 1, false, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.world = 4;
  for (const MeshCost& c : make_plan(req).ranked)
    EXPECT_EQ(c.config.schedule, ScheduleKind::kDefault) << config_label(c.config);
}

// Hostile sizes: refused up front with InvalidArgument, never wrapped, never minutes of work.
TEST(PlannerLimits, HugeSizesAreRefusedWithoutOverflow) {
  // B·H·S·S would wrap int64: the workload is refused naming the product.
  try {
    (void)attention_workload(int64_t{1} << 31, 1 << 16, 0, 128, 1, true, DType::kBF16);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("score elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)attention_workload(1024, 8, 0, int64_t{1} << 40, 1, false, DType::kBF16),
               InvalidArgument);
  EXPECT_THROW((void)attention_workload(0, 8, 0, 128, 1, true, DType::kBF16, 0, int64_t{1} << 62,
                                        int64_t{1} << 62),
               InvalidArgument);
  // A 19-digit prime head count (past the limits): refused by its range, before any divisor
  // listing.
  Workload w = attention_workload(1024, 8, 0, 128, 1, false, DType::kBF16);
  w.attention_only = false;
  w.heads = w.kv_heads = 9223372036854775783;
  try {
    check_mesh_degrees(w, 1, 2);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("heads 9223372036854775783 is out of range"),
              std::string::npos)
        << e.what();
  }
}

TEST(PlannerLimits, WorkIsEstimatedBeforeCosting) {
  PlanRequest req;
  req.work = attention_workload(65536, 8, 0, 128, 1, false, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.world = 8;
  EXPECT_LT(plan_work(req, 8).ns, kMaxPlanWork);
  req.world = 65536;  // 2^16 ranks: every mesh costed step by step would take minutes
  EXPECT_GT(plan_work(req, 65536).ns, kMaxPlanWork);
  try {
    (void)make_plan(req);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("run pairs"), std::string::npos) << e.what();
  }
  req.world = 1 << 20;
  EXPECT_THROW((void)make_plan(req), InvalidArgument);
  req.world = 8;
  req.ulysses = 1 << 16;
  req.ring = 1 << 16;
  EXPECT_THROW((void)make_plan(req), InvalidArgument);
}

// The estimate follows the schedules: at least their entries (steps and all-to-all peers), at most
// three times as many and a few per rank, for every strategy table row and its schedules on the
// splits the planner gives it.
TEST(PlannerLimits, MeshWorkCountsTheScheduleEntries) {
  const Workload seq = attention_workload(4096, 8, 2, 64, 1, true, DType::kBF16);
  const Workload cache = attention_workload(0, 8, 2, 64, 1, true, DType::kBF16, 0, 4096, 100);
  for (const StrategyRow& row : strategy_table())
    for (const ScheduleRow& sr : row.schedules)
      for (int n : {1, 2, 4, 8, 16})
        for (int u : {1, 2, 4, 8, 16}) {
          // The splits the planner gives the row.
          const int r = n / u;
          const SpDegrees d = n == 1   ? SpDegrees::kOne
                              : u == 1 ? SpDegrees::kRing
                              : r == 1 ? SpDegrees::kUlysses
                                       : SpDegrees::kUlyssesRing;
          if (n % u != 0 || d != row.degrees) continue;
          ParallelConfig m;
          m.mesh.ulysses = u;
          m.mesh.ring = n / u;
          m.strategy = row.strategy;
          m.schedule = sr.kind;
          const Workload& w = row.over_cache ? cache : seq;
          Schedule s;
          try {
            validate_config(m, workload_shape(w));
            s = attention_schedule(m, workload_shape(w));
          } catch (const InvalidArgument&) {
            continue;  // degrees the row does not take
          }
          int64_t entries = 0;
          for (const RankSchedule& rs : s.ranks)
            for (const Step& st : rs.steps) entries += 1 + (st.comm ? st.comm->peers.size() : 0);
          const PlanWork x = mesh_work(w, m);
          EXPECT_GE(x.steps, entries) << config_label(m);
          EXPECT_LE(x.steps, 3 * entries + 8 * n) << config_label(m);
          EXPECT_EQ(x.meshes, 1);
        }
}

// Pinned plans over a million tokens: refused up front with the work named and what fits.
TEST(PlannerLimits, PinnedMillionTokenPlansAreRefusedWithWhatFits) {
  PlanRequest req;
  req.work = attention_workload(1 << 20, 8, 0, 128, 1, false, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.world = 4096;
  req.strategy = Strategy::kRing;
  req.layout = Layout::kZigzag;
  try {
    (void)make_plan(req);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("1 mesh (16793600 schedule steps"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 2048"), std::string::npos) << m;
  }
  EXPECT_LE(plan_work(req, 2048).ns, kMaxPlanWork);
  // A striped cache against 10^8 new tokens is counted query by query: refused, naming fewer new
  // tokens that fit.
  PlanRequest decode;
  decode.work =
      attention_workload(0, 1, 0, 128, 1, true, DType::kBF16, 0, 100'000'000, 100'000'000);
  decode.hw = hardware_profile("h100");
  decode.world = 8;
  decode.layout = Layout::kStriped;
  try {
    (void)make_plan(decode);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tokens one by one"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("new "), std::string::npos) << e.what();
  }
}

// A memory limit nothing meets: refused naming the smallest need and the limit that would hold
// it, without searching world sizes that cannot fit (one rank's memory over the world size bounds
// every mesh's from below).
TEST(PlannerLimits, AMemoryLimitNothingMeetsIsRefusedWithTheSmallestNeed) {
  PlanRequest req;
  req.work = attention_workload(4096, 8, 0, 128, 1, false, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.world = 8;
  req.memory_limit = 1e-21;  // 1e-30 GB
  try {
    (void)make_plan(req);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("in 1e-30 GB per rank: the smallest needs 0.00736 GB"), std::string::npos)
        << m;
    EXPECT_NE(m.find("no world size up to 64x fits"), std::string::npos) << m;
    EXPECT_NE(m.find("memory_limit 0.00736 (GB)"), std::string::npos) << m;
  }
  // The calibrated CPU profile's 12 GB node holds no world size of Llama 3 8B: refused the same
  // way, the search skipped.
  PlanRequest llama;
  llama.work = model_workload(model_preset("llama3-8b"), 4097, 1, DType::kBF16, false, 0);
  llama.hw = hardware_profile("local");
  llama.world = 16;
  try {
    (void)make_plan(llama);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no world size up to 64x fits"), std::string::npos)
        << e.what();
  }
}

// The memory floor is below every mesh's memory, for models of each family and a bare call, on
// world sizes that split every degree.
TEST(PlannerLimits, TheMemoryFloorIsBelowEveryMesh) {
  std::vector<PlanRequest> reqs(5);
  reqs[0] = wan_request(1);
  reqs[1].work =
      model_workload(model_preset("llama3-70b"), 0, 1, DType::kBF16, false, 0, 30000, 2000);
  reqs[2].work = model_workload(model_preset("flux.1-dev"), 4096, 1, DType::kBF16, true, 512);
  reqs[3].work = model_workload(model_preset("llama3-8b"), 20000, 2, DType::kBF16, false, 0);
  reqs[4].work = attention_workload(5000, 12, 4, 64, 1, true, DType::kF32);
  for (PlanRequest& req : reqs) {
    req.hw = hardware_profile("h100");
    for (int world : {1, 2, 3, 4, 6, 8, 12, 16, 24}) {
      req.world = world;
      Plan plan;
      try {
        plan = make_plan(req);
      } catch (const InvalidArgument&) {
        continue;
      }
      const double floor = memory_floor(req, world);
      EXPECT_GT(floor, 0) << req.work.model;
      for (const auto* list : {&plan.ranked, &plan.over_memory})
        for (const MeshCost& c : *list)
          EXPECT_GE(c.memory_bytes, floor * (1 - 1e-12))
              << req.work.model << " " << config_label(c.config);
    }
  }
}

// A profile whose rates overflow a step's time: refused naming the rates, not ranked as inf.
TEST(PlannerLimits, RatesThatOverflowTheStepTimeAreRefused) {
  PlanRequest req;
  req.work = attention_workload(4096, 8, 0, 128, 1, false, DType::kBF16);
  req.hw = hardware_profile("h100");
  req.hw.attention_flops = req.hw.gemm_flops = req.hw.intra_node_bw = req.hw.inter_node_bw =
      req.hw.local_copy_bw = 1e-300;
  req.world = 8;
  try {
    (void)make_plan(req);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("attention_flops 1e-300"), std::string::npos) << e.what();
  }
  req.hw.memory_bytes = 1e-300;  // and nothing fits: still the rates, before any search
  EXPECT_THROW((void)make_plan(req), InvalidArgument);
}

}  // namespace
}  // namespace seqpar
