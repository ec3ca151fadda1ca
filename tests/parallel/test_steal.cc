// ring with schedule steal (steal.cc, steal_plan.h): exact against reference_attention at the
// kernel path's error bound over ranks 1-8 x lengths (divisible or not, close to the ranks,
// custom uneven counts) x GQA x batch x dtype x causal, with padding; measured bytes (per kind
// of op), work and peak K/V equal the schedule per rank; work imbalance below 1 + c_max/t (the
// plan's guarantee: c_max the dearest row's keys, t the mean work), so at most 1.05 once
// S >= 64·N; the plan itself gives every row to exactly one rank.
#include <gtest/gtest.h>

#include <numeric>

#include "parallel/cp_test_util.h"
#include "schedule_build.h"
#include "seqpar/parallel/schedule.h"
#include "steal_plan.h"

namespace seqpar {
namespace {

using seqpar::testing::bound_for;
using seqpar::testing::inputs_for;
using seqpar::testing::max_err_lse;
using seqpar::testing::Problem;
using seqpar::testing::run_cp;

CpOptions steal_options() {
  CpOptions o;
  o.schedule = ScheduleKind::kSteal;
  return o;
}

// max rank work / mean rank work.
double imbalance(const std::vector<CpStats>& cp) {
  int64_t mx = 0, sum = 0;
  for (const CpStats& s : cp) {
    mx = std::max(mx, s.work);
    sum += s.work;
  }
  return sum == 0 ? 1.0 : static_cast<double>(mx) * cp.size() / static_cast<double>(sum);
}


// The plan's bound on the work of a rank: below t + c_max (one batch, one head).
void expect_within_plan_bound(const Problem& p, const Partition& part,
                              const std::vector<CpStats>& cp, int64_t keys) {
  const int n = part.ranks();
  int64_t total = 0;
  for (const CpStats& s : cp) total += s.work;
  const double t = static_cast<double>(total) / n;
  const double c_max = static_cast<double>(p.batch * p.heads * keys);
  for (int r = 0; r < n; ++r) EXPECT_LT(static_cast<double>(cp[r].work), t + c_max) << "rank " << r;
}

struct Case {
  int ranks;
  int64_t seq;
  int64_t batch = 1;
  int64_t heads = 4, kv_heads = 2;
  DType dtype = DType::kF32;
  bool causal = true;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "n" << c.ranks << "_s" << c.seq << "_b" << c.batch << "_h" << c.heads << "kv" << c.kv_heads
      << "_" << dtype_name(c.dtype) << (c.causal ? "_causal" : "_full");
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int n = 1; n <= 8; ++n)
    for (int64_t seq : {int64_t{n}, int64_t{n + 3}, int64_t{64 * n}, int64_t{64 * n + 5}})
      for (bool causal : {true, false}) v.push_back({n, seq, 1, 4, 2, DType::kF32, causal});
  // Batch, dtypes, GQA and MHA on a few placements.
  for (int n : {2, 3, 5, 8}) {
    v.push_back({n, 64 * n + 3, 2, 4, 2, DType::kBF16, true});
    v.push_back({n, 64 * n + 1, 3, 4, 1, DType::kF16, true});
    v.push_back({n, 67, 2, 4, 4, DType::kBF16, true});
    v.push_back({n, 64 * n, 2, 2, 2, DType::kF32, false});
  }
  return v;
}

class Steal : public ::testing::TestWithParam<Case> {};

TEST_P(Steal, ExactBalancedAndAsScheduled) {
  const Case c = GetParam();
  Problem p;
  p.batch = c.batch;
  p.seq = c.seq;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = 16;
  p.causal = c.causal;
  p.dtype = c.dtype;
  auto run = run_cp(p, Strategy::kRing, Layout::kContiguous, c.ranks, steal_options());
  const auto& in = inputs_for(p);
  const ErrorBound tol = bound_for(p);
  EXPECT_LE(max_abs_diff(run.state.out, in.ref.out), tol.out);
  EXPECT_LE(max_err_lse(run.state.lse, in.ref.lse), tol.lse);

  ParallelConfig cfg;
  cfg.strategy = Strategy::kRing;
  cfg.schedule = ScheduleKind::kSteal;
  cfg.mesh.ring = c.ranks;
  const AttnShape shape{.batch = c.batch,
                        .seq = c.seq,
                        .heads = c.heads,
                        .kv_heads = c.kv_heads,
                        .head_dim = 16,
                        .causal = c.causal,
                        .dtype = c.dtype};
  seqpar::testing::expect_schedule_matches(attention_schedule(cfg, shape), run);

  expect_within_plan_bound(p, Partition(c.seq, c.ranks, Layout::kContiguous), run.cp, c.seq);
  if (c.seq >= 64 * c.ranks) {
    EXPECT_LE(imbalance(run.cp), 1.05);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Steal, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::ostringstream os;
                           PrintTo(info.param, &os);
                           return os.str();
                         });

// Custom uneven contiguous counts (Partition::from_counts): exact, balanced, as scheduled
// (steal_schedule_of over the partition's runs).
TEST(Steal, CustomUnevenCounts) {
  const std::vector<std::vector<int64_t>> all_counts = {
      {300, 20}, {20, 300}, {1, 1, 400}, {250, 10, 5, 150}, {40, 200, 33, 17, 180, 2, 90, 50}};
  for (const auto& counts : all_counts)
    for (bool causal : {true, false}) {
      const Partition part = Partition::from_counts(counts);
      Problem p;
      p.seq = part.seq();
      p.batch = 2;
      p.head_dim = 16;
      p.causal = causal;
      SCOPED_TRACE(::testing::Message()
                   << part.ranks() << " ranks, seq " << p.seq << " causal " << causal);
      auto run = run_cp(p, Strategy::kRing, part, steal_options());
      const auto& in = inputs_for(p);
      const ErrorBound tol = bound_for(p);
      EXPECT_LE(max_abs_diff(run.state.out, in.ref.out), tol.out);
      EXPECT_LE(max_err_lse(run.state.lse, in.ref.lse), tol.lse);
      CallRuns cr = partition_runs(part, p.batch, p.heads, p.kv_heads, p.head_dim, 4);
      cr.causal = causal;
      seqpar::testing::expect_schedule_matches(steal_schedule_of(cr), run);
      expect_within_plan_bound(p, part, run.cp, p.seq);
      if (p.seq >= 64 * part.ranks()) {
        EXPECT_LE(imbalance(run.cp), 1.05);
      }
    }
}

// Padding (valid_len): keys at positions >= valid_len masked; the real rows exact, the schedule
// (pad on) as measured.
TEST(Steal, Padded) {
  for (int n : {3, 4, 7}) {
    const int64_t valid = 64 * n + 1;
    const int64_t padded = padded_seq(valid, n, Layout::kContiguous);
    ASSERT_GT(padded, valid);
    Problem p;
    p.seq = padded;
    p.head_dim = 16;
    p.causal = true;
    CpOptions opts = steal_options();
    opts.valid_len = valid;
    auto run = run_cp(p, Strategy::kRing, Layout::kContiguous, n, opts);
    // Reference over the padded inputs with the padding keys masked, compared on real rows.
    const auto& in = inputs_for(p);
    std::vector<uint8_t> k_valid(p.batch * padded);
    for (int64_t i = 0; i < padded; ++i) k_valid[i] = i < valid;
    AttnParams params;
    params.mask.causal = true;
    params.mask.k_valid = k_valid;
    const AttnState ref = reference_attention(in.q, in.k, in.v, params);
    const ErrorBound tol = bound_for(p);
    double err = 0;
    const int64_t row = p.heads * p.head_dim;
    for (int64_t i = 0; i < valid * row; ++i)
      err = std::max(err, std::fabs(static_cast<double>(run.state.out.at(i)) - ref.out.at(i)));
    EXPECT_LE(err, tol.out) << n << " ranks";
    ParallelConfig cfg;
    cfg.schedule = ScheduleKind::kSteal;
    cfg.mesh.ring = n;
    cfg.pad = true;
    const AttnShape shape{.seq = valid,
                          .heads = p.heads,
                          .kv_heads = p.kv_heads,
                          .head_dim = p.head_dim,
                          .causal = true};
    seqpar::testing::expect_schedule_matches(attention_schedule(cfg, shape), run);
    EXPECT_LE(imbalance(run.cp), 1.05) << n << " ranks";
  }
}

// The plan: every row computed exactly once, by its owner (a prefix) or one helper that kept
// all of its own; helpers ranked below their donors when causal on equal shards; every rank
// below t + c_max, and at most 1.05 of the mean from S = 64·N up to a million tokens.
TEST(StealPlan, EveryRowOnceAndBalanced) {
  for (int n = 1; n <= 8; ++n)
    for (int64_t seq :
         {int64_t{n}, int64_t{64 * n}, int64_t{64 * n + 7}, int64_t{16384}, int64_t{1} << 20})
      for (bool causal : {true, false}) {
        SCOPED_TRACE(::testing::Message() << n << " ranks, seq " << seq << " causal " << causal);
        const Partition part(seq, n, Layout::kContiguous);
        const StealPlan plan = steal_plan(part, causal, 0);
        std::vector<int64_t> covered(n, 0);
        int64_t total = 0;
        const int64_t c_max = seq;  // the dearest row: every key
        for (int r = 0; r < n; ++r) {
          ASSERT_GE(plan.keep[r], 1);
          covered[r] += plan.keep[r];
          total += plan.cost[r];
        }
        int64_t prev_end = -1;
        int prev_owner = -1;
        for (const StealPiece& pc : plan.pieces) {
          ASSERT_NE(pc.owner, pc.helper);
          EXPECT_EQ(plan.keep[pc.helper], part.count(pc.helper));
          if (pc.owner == prev_owner) {
            EXPECT_EQ(pc.begin, prev_end);
          } else {
            EXPECT_EQ(pc.begin, plan.keep[pc.owner]);
          }
          if (causal) {
            EXPECT_LT(pc.helper, pc.owner);
          }
          covered[pc.owner] += pc.rows();
          prev_end = pc.end;
          prev_owner = pc.owner;
        }
        for (int r = 0; r < n; ++r) EXPECT_EQ(covered[r], part.count(r)) << "rank " << r;
        const int64_t want_total = causal ? seq * (seq + 1) / 2 : seq * seq;
        EXPECT_EQ(total, want_total);
        const int64_t mx = *std::max_element(plan.cost.begin(), plan.cost.end());
        EXPECT_LT(static_cast<double>(mx), static_cast<double>(total) / n + c_max);
        if (seq >= 64 * n) {
          EXPECT_LE(static_cast<double>(mx) * n / static_cast<double>(total), 1.05);
        }
        if (!causal && seq % n == 0) {
          EXPECT_TRUE(plan.pieces.empty());
        }
      }
}

TEST(Steal, RejectsGapsAndConstMax) {
  Problem p;
  p.seq = 64;
  p.causal = true;
  EXPECT_THROW(run_cp(p, Strategy::kRing, Layout::kZigzag, 2, steal_options()), InvalidArgument);
  CpOptions o = steal_options();
  o.softmax = SoftmaxMode::kConstMax;
  EXPECT_THROW(run_cp(p, Strategy::kRing, Layout::kContiguous, 2, o), InvalidArgument);
  ParallelConfig cfg;
  cfg.schedule = ScheduleKind::kSteal;
  cfg.mesh.ring = 2;
  cfg.layout = Layout::kZigzag;
  EXPECT_THROW(attention_schedule(cfg, {.seq = 64, .heads = 4, .head_dim = 16, .causal = true}),
               InvalidArgument);
}

}  // namespace
}  // namespace seqpar
