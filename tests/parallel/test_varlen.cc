// Packed variable-length sequences (varlen, cu_seqlens): every strategy over documents packed into
// one sequence, and pass-Q / pass-KV over a batch of requests packed over a K/V cache, against
// reference_attention on the unsharded tensors with the document mask built here from the lengths
// (not from document_of); the schedules' bytes, work and peak K/V against the measured CommStats
// and CpStats exactly; the document lookup and the run counting against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/attention/error_bound.h"
#include "seqpar/comm/threads.h"
#include "seqpar/parallel/position_runs.h"
#include "seqpar/parallel/runner.h"
#include "seqpar/parallel/schedule.h"
#include "seqpar/parallel/strategy_table.h"
#include "seqpar/parallel/synthetic.h"

namespace seqpar {
namespace {

constexpr uint64_t kSeed = 7;

std::vector<int64_t> iota_vec(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The oracle's document ids: document i repeated lens[i] times (then `tail` more ids for padding).
std::vector<int32_t> brute_ids(const std::vector<int64_t>& lens) {
  std::vector<int32_t> ids;
  for (size_t d = 0; d < lens.size(); ++d)
    for (int64_t j = 0; j < lens[d]; ++j) ids.push_back(static_cast<int32_t>(d));
  return ids;
}

struct Outcome {
  double max_out_err = 0, max_lse_err = 0;
  ErrorBound bound;
  std::vector<int64_t> work;
};

// Runs the job on its ranks and checks every real query row against the oracle over the whole
// packed sequence (positions 0..S-1 of documents `docs`), and the schedule against the measured
// figures on every rank.
Outcome run_and_check(const AttnJob& job, const std::vector<int64_t>& docs) {
  const AttnShape& s = job.shape;
  const int n = job.ranks();
  const int64_t S = s.seq, B = s.batch, H = s.heads, D = s.head_dim;
  std::vector<RankCall> calls(n);
  ThreadWorld::run(n, [&](Communicator& comm) {
    const RankInputs in = synthetic_inputs(job, comm.rank(), kSeed);
    JobComms comms(comm, job);
    calls[comm.rank()] = run_attention_call(comms, job, in);
  });

  // Oracle: the whole packed sequence, the document mask from the lengths.
  const std::vector<int64_t> all = iota_vec(S);
  const Tensor q = synthetic_rows(kSeed, SyntheticTensor::kQ, B, all, H, D, s.dtype);
  const Tensor k = synthetic_rows(kSeed, SyntheticTensor::kK, B, all, s.kv(), D, s.dtype);
  const Tensor v = synthetic_rows(kSeed, SyntheticTensor::kV, B, all, s.kv(), D, s.dtype);
  const std::vector<int32_t> ids = brute_ids(docs);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), S);
  AttnParams params;
  params.mask.causal = s.causal;
  params.mask.q_segment = ids;
  params.mask.k_segment = ids;
  const AttnState ref = reference_attention(q, k, v, params);
  double max_v = 0;
  for (int64_t i = 0; i < v.numel(); ++i) max_v = std::max(max_v, std::fabs((double)v.at(i)));

  Outcome o;
  o.bound = attention_error_bound(s.dtype, S, D, max_v);
  for (int r = 0; r < n; ++r) {
    auto pos = job.q_pos(r);
    const AttnState& got = calls[r].state;
    const int64_t nq = static_cast<int64_t>(pos.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < nq; ++i) {
        if (pos[i] >= S) continue;  // padding rows are dropped
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t d = 0; d < D; ++d) {
            const double a = got.out.data<float>()[((b * nq + i) * H + h) * D + d];
            const double e = ref.out.data<float>()[((b * S + pos[i]) * H + h) * D + d];
            o.max_out_err = std::max(o.max_out_err, std::isnan(a) ? INFINITY : std::fabs(a - e));
          }
          const double a = got.lse.data<float>()[(b * nq + i) * H + h];
          const double e = ref.lse.data<float>()[(b * S + pos[i]) * H + h];
          o.max_lse_err = std::max(o.max_lse_err, std::isnan(a) ? INFINITY : std::fabs(a - e));
        }
      }
  }

  // The schedule: bytes, work and peak K/V of every rank, exactly.
  const Schedule sched = attention_schedule(job.config, s);
  EXPECT_EQ(sched.sp(), n);
  for (int r = 0; r < n && sched.sp() == n; ++r) {
    const CommPrediction want = schedule_bytes(sched, r);
    EXPECT_EQ(calls[r].comm.total_sent(), want.sent) << "rank " << r;
    EXPECT_EQ(calls[r].comm.total_recv(), want.recv) << "rank " << r;
    EXPECT_EQ(calls[r].cp.work, schedule_work(sched, r)) << "rank " << r;
    EXPECT_EQ(calls[r].cp.peak_kv_bytes, sched.ranks[r].peak_kv_bytes) << "rank " << r;
    o.work.push_back(calls[r].cp.work);
  }
  return o;
}

double imbalance(const std::vector<int64_t>& work) {
  if (work.empty()) return 0;
  const double mean = std::accumulate(work.begin(), work.end(), 0.0) / work.size();
  return mean > 0 ? *std::max_element(work.begin(), work.end()) / mean : 1.0;
}

// ---- the document lookup and the run counting, against brute force -------------------------

TEST(VarlenDocuments, LookupMatchesBruteForce) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> lens(1 + rng() % 9);
    for (auto& l : lens) l = 1 + rng() % (trial % 3 == 0 ? 3 : 20);
    const std::vector<int64_t> cu = cu_seqlens(lens);
    const std::vector<int32_t> ids = brute_ids(lens);
    ASSERT_EQ(cu.back(), static_cast<int64_t>(ids.size()));
    for (int64_t p = 0; p < cu.back(); ++p) ASSERT_EQ(document_of(cu, p), ids[p]) << "pos " << p;
    // Padding after the last document: one document past the last.
    for (int64_t p = cu.back(); p < cu.back() + 3; ++p)
      ASSERT_EQ(document_of(cu, p), static_cast<int32_t>(lens.size()));
  }
  EXPECT_THROW(cu_seqlens(std::vector<int64_t>{3, 0, 2}), InvalidArgument);
  EXPECT_EQ(document_of({}, 5), 0);
}

// visible_pairs with documents equals a count of (q, k) pairs with the document mask, causal,
// and padding, for runs of every layout and per-document splits.
TEST(VarlenDocuments, VisiblePairsMatchBruteForce) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> lens(1 + rng() % 6);
    for (auto& l : lens) l = 1 + rng() % 15;
    const std::vector<int64_t> cu = cu_seqlens(lens);
    const std::vector<int32_t> ids = brute_ids(lens);
    const int64_t real = cu.back(), seq = real + rng() % 4;
    const int ranks = 1 + static_cast<int>(rng() % std::min<int64_t>(5, seq));
    const Layout layout =
        std::array{Layout::kContiguous, Layout::kStriped, Layout::kZigzag}[trial % 3];
    const bool causal = trial % 2 == 0;
    const int64_t valid = seq > real ? real : 0;
    Partition part = seq > real || layout == Layout::kContiguous
                         ? Partition(seq, ranks, layout)
                         : Partition::documents(lens, seq, ranks, layout);
    for (int qr = 0; qr < ranks; ++qr)
      for (int kr = 0; kr < ranks; ++kr) {
        int64_t want = 0;
        for (int64_t qp : part.positions(qr))
          for (int64_t kp : part.positions(kr)) {
            const int32_t qd = qp < real ? ids[qp] : static_cast<int32_t>(lens.size());
            const int32_t kd = kp < real ? ids[kp] : static_cast<int32_t>(lens.size());
            want += qd == kd && (!causal || kp <= qp) && (valid == 0 || kp < valid);
          }
        ASSERT_EQ(visible_pairs(runs_of(part.positions(qr)), runs_of(part.positions(kr)), causal,
                                valid, cu),
                  want)
            << "trial " << trial << " q rank " << qr << " k rank " << kr;
      }
  }
}

// Per-document zigzag: every document split into 2N chunks, rank r holding chunks r and 2N-1-r of
// each; one document is exactly Partition(seq, N, zigzag); the runs and the partition agree.
TEST(VarlenDocuments, PerDocumentZigzag) {
  for (int n = 1; n <= 6; ++n)
    for (int64_t seq : {int64_t{12}, int64_t{37}, int64_t{64}}) {
      if (seq < n) continue;
      const std::vector<int64_t> one = {seq};
      const Partition a = Partition::documents(one, seq, n, Layout::kZigzag);
      const Partition b(seq, n, Layout::kZigzag);
      for (int r = 0; r < n; ++r)
        EXPECT_TRUE(std::ranges::equal(a.positions(r), b.positions(r))) << n << " " << seq;
    }
  const std::vector<int64_t> lens = {16, 1, 9, 3, 24, 2};
  const std::vector<int64_t> cu = cu_seqlens(lens);
  const int n = 4;
  const Partition part = Partition::documents(lens, cu.back(), n, Layout::kZigzag);
  EXPECT_EQ(part.layout(), Layout::kZigzag);
  // A document of 16 tokens on 4 ranks: chunks of 2, rank r holding [2r, 2r+2) and [14-2r, 16-2r).
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> first;
    for (int64_t p : part.positions(r))
      if (p < 16) first.push_back(p);
    EXPECT_EQ(first, (std::vector<int64_t>{2 * r, 2 * r + 1, 14 - 2 * r, 15 - 2 * r}));
  }
  // Every token once; the runs give the same positions.
  std::vector<int64_t> starts(cu.begin(), cu.end() - 1);
  const std::vector<PositionRuns> runs = piece_layout_runs(starts, lens, n, Layout::kZigzag);
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> pos;
    for (const auto& run : runs[r])
      for (int64_t i = 0; i < run.count; ++i) pos.push_back(run.start + i * run.stride);
    EXPECT_TRUE(std::ranges::equal(pos, part.positions(r))) << "rank " << r;
  }
  // Short documents spread: 12 documents of 1 token over 4 ranks, 3 each.
  const std::vector<int64_t> ones(12, 1);
  const Partition spread = Partition::documents(ones, 12, 4, Layout::kZigzag);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(spread.count(r), 3);
  // A rank without a token is refused with one line.
  try {
    (void)Partition::documents(std::vector<int64_t>{1, 1}, 2, 3, Layout::kZigzag);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("would hold no token"), std::string::npos) << e.what();
  }
}

TEST(VarlenDocuments, ValidationNamesSeqLens) {
  ParallelConfig c;
  c.mesh.ring = 2;
  AttnShape s{.seq = 10, .heads = 2, .head_dim = 8};
  s.seq_lens = {3, 4};
  try {
    validate_config(c, s);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("seq_lens"), std::string::npos) << m;
    EXPECT_NE(m.find("seq is 10"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  s.seq_lens = {3, 7};
  EXPECT_NO_THROW(validate_config(c, s));
  s.text_tokens = 4;
  EXPECT_THROW(validate_config(c, s), InvalidArgument);  // joint attention with documents
}

// ---- every strategy over packed documents ---------------------------------------------------

struct SeqCase {
  std::string name;
  Strategy strategy;
  SoftmaxMode softmax = SoftmaxMode::kOnline;
  UlyssesMode mode = UlyssesMode::kUaa;
  int ulysses = 0;   // usp: ulysses degree (0: filled)
  bool pad = false;  // padding after the last document
};

std::vector<SeqCase> seq_cases() {
  return {{"allgather", Strategy::kAllGather},
          {"ring", Strategy::kRing},
          {"ring_constmax", Strategy::kRing, SoftmaxMode::kConstMax},
          {"ring_pad", Strategy::kRing, SoftmaxMode::kOnline, UlyssesMode::kUaa, 0, true},
          {"ulysses_uaa", Strategy::kUlysses},
          {"ulysses_strict_pad", Strategy::kUlysses, SoftmaxMode::kOnline, UlyssesMode::kStrict},
          {"usp", Strategy::kUsp},
          {"usp_constmax", Strategy::kUsp, SoftmaxMode::kConstMax}};
}

// Document sets: length-1 documents, lengths that do not divide the ranks, one document spanning
// every rank, many short documents.
const std::vector<std::vector<int64_t>>& doc_sets() {
  static const std::vector<std::vector<int64_t>> sets = {
      {1, 7, 13, 1, 30}, {61}, {3, 1, 2, 5, 1, 4, 2, 3, 1, 6, 2, 2}, {17, 40, 9}};
  return sets;
}

class VarlenSweep : public ::testing::TestWithParam<std::tuple<int, Layout, int, int, bool>> {};

TEST_P(VarlenSweep, MatchesReferenceAndSchedule) {
  const auto [ci, layout, ranks, di, causal] = GetParam();
  const SeqCase sc = seq_cases()[ci];
  const std::vector<int64_t>& docs = doc_sets()[di];
  ParallelConfig c;
  c.mesh.ring = c.mesh.ulysses = 0;  // filled by resolve_job
  c.strategy = sc.strategy;
  c.layout = layout;
  c.softmax = sc.softmax;
  c.ulysses_mode = sc.mode;
  c.pad = sc.pad || sc.mode == UlyssesMode::kStrict;
  if (sc.strategy == Strategy::kUsp) c.mesh.ulysses = ranks % 2 == 0 ? 2 : 1;
  AttnShape s;
  s.seq = std::accumulate(docs.begin(), docs.end(), int64_t{0});
  s.heads = 4;
  s.kv_heads = di % 2 == 0 ? 2 : 4;  // GQA on half the sets
  s.head_dim = 16;
  s.batch = di == 3 ? 2 : 1;
  s.causal = causal;
  s.seq_lens = docs;
  AttnJob job;
  try {
    job = resolve_job(c, s, ranks, false);
  } catch (const InvalidArgument& e) {
    // Strict Ulysses needs equal shards (per-document zigzag rarely gives them) and heads
    // divisible by the ranks; the refusal is one line naming ulysses_mode.
    ASSERT_EQ(sc.mode, UlyssesMode::kStrict) << e.what();
    EXPECT_NE(std::string(e.what()).find("ulysses_mode"), std::string::npos) << e.what();
    GTEST_SKIP() << e.what();
  }
  EXPECT_EQ(job.cp().cu_seqlens, cu_seqlens(docs));
  const Outcome o = run_and_check(job, docs);
  EXPECT_LE(o.max_out_err, o.bound.out) << sc.name;
  EXPECT_LE(o.max_lse_err, o.bound.lse) << sc.name;
  static double worst_ratio = 0;
  worst_ratio = std::max(worst_ratio, o.max_out_err / o.bound.out);
  RecordProperty("max_out_err_over_bound", std::to_string(worst_ratio));
}

std::string sweep_name(const ::testing::TestParamInfo<VarlenSweep::ParamType>& info) {
  const auto [ci, layout, ranks, di, causal] = info.param;
  return seq_cases()[ci].name + "_" + std::string(layout_name(layout)) + "_n" +
         std::to_string(ranks) + "_docs" + std::to_string(di) + (causal ? "_causal" : "_full");
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenSweep,
                         ::testing::Combine(::testing::Range(0, 8),
                                            ::testing::Values(Layout::kContiguous, Layout::kZigzag),
                                            ::testing::Range(1, 6), ::testing::Range(0, 4),
                                            ::testing::Bool()),
                         sweep_name);

// More ranks on a few cases: 8 ranks, zigzag per document, usp 2 x 4 and ring.
TEST(VarlenWide, EightRanks) {
  const std::vector<int64_t> docs = {40, 3, 1, 25, 57, 2, 16};
  for (Strategy st : {Strategy::kRing, Strategy::kUsp, Strategy::kAllGather, Strategy::kUlysses})
    for (Layout layout : {Layout::kZigzag, Layout::kContiguous}) {
      ParallelConfig c;
      c.mesh.ring = c.mesh.ulysses = 0;
      c.strategy = st;
      c.layout = layout;
      if (st == Strategy::kUsp) c.mesh.ulysses = 2;
      AttnShape s{.seq = 144, .heads = 8, .kv_heads = 2, .head_dim = 16, .causal = true};
      s.seq_lens = docs;
      const Outcome o = run_and_check(resolve_job(c, s, 8, false), docs);
      EXPECT_LE(o.max_out_err, o.bound.out) << strategy_name(st) << " " << layout_name(layout);
      EXPECT_LE(o.max_lse_err, o.bound.lse) << strategy_name(st) << " " << layout_name(layout);
    }
}

// The runner's own verification (verify_call) checks with the same document mask.
TEST(VarlenWide, VerifyCallUsesDocuments) {
  ParallelConfig c;
  c.mesh.ring = 0;
  c.strategy = Strategy::kRing;
  c.layout = Layout::kZigzag;
  AttnShape s{.seq = 50, .heads = 2, .head_dim = 16, .causal = true};
  s.seq_lens = {20, 1, 29};
  const AttnJob job = resolve_job(c, s, 3, true);
  std::vector<Verification> checks(3);
  ThreadWorld::run(3, [&](Communicator& comm) {
    const RankInputs in = synthetic_inputs(job, comm.rank(), kSeed);
    JobComms comms(comm, job);
    const RankCall call = run_attention_call(comms, job, in);
    checks[comm.rank()] = verify_call(comm, job, kSeed, call);
  });
  EXPECT_TRUE(checks[0].ok) << checks[0].max_abs_err;
  EXPECT_EQ(checks[0].rows, 50);
  // Without the documents the same outputs are far from the reference.
  AttnJob plain = job;
  plain.shape.seq_lens.clear();
  ThreadWorld::run(3, [&](Communicator& comm) {
    const RankInputs in = synthetic_inputs(job, comm.rank(), kSeed);
    JobComms comms(comm, job);
    const RankCall call = run_attention_call(comms, job, in);
    checks[comm.rank()] = verify_call(comm, plain, kSeed, call);
  });
  EXPECT_FALSE(checks[0].ok);
}

// Work imbalance on a realistic mix of long documents: per-document zigzag close to 1, contiguous
// far from it (causal). From the schedules, which equal the measured work (above).
TEST(VarlenBalance, PerDocumentZigzagBalancesCausalWork) {
  const std::vector<int64_t> docs = {30000, 17, 9000, 4096, 12000, 777, 20000, 1500};
  AttnShape s{.heads = 8, .head_dim = 128, .causal = true};
  s.seq_lens = docs;
  s.seq = std::accumulate(docs.begin(), docs.end(), int64_t{0});
  for (int n : {2, 4, 8}) {
    ParallelConfig c;
    c.strategy = Strategy::kRing;
    c.mesh.ring = n;
    std::vector<double> imb;
    for (Layout layout : {Layout::kZigzag, Layout::kContiguous}) {
      c.layout = layout;
      const Schedule sched = attention_schedule(c, s);
      std::vector<int64_t> work;
      for (int r = 0; r < n; ++r) work.push_back(schedule_work(sched, r));
      imb.push_back(imbalance(work));
    }
    std::printf("[ varlen ] %d ranks: work imbalance zigzag per document %.4f, contiguous %.4f\n",
                n, imb[0], imb[1]);
    EXPECT_LE(imb[0], 1.1) << n << " ranks";
    EXPECT_GT(imb[1], imb[0]) << n << " ranks";
  }
}

// ---- a batch of requests over a K/V cache ------------------------------------------------------

struct CacheCase {
  std::vector<int64_t> cached, fresh;
};

// The ways over a cache: pass-Q (all-gathered queries), ring pass-Q, pass-KV.
struct CacheWay {
  Strategy strategy;
  ScheduleKind schedule;
};
class VarlenCache : public ::testing::TestWithParam<std::tuple<CacheWay, Layout, int, int, bool>> {
};

TEST_P(VarlenCache, MatchesReferenceAndSchedule) {
  const auto [way, layout, ranks, ci, causal] = GetParam();
  static const std::vector<CacheCase> cases = {
      {{5, 1, 12, 3}, {1, 1, 1, 1}},  // decode (T = 1), a cache of 1 token
      {{9, 2, 30}, {4, 1, 7}},        // partial prefill, one cache shorter than the ranks
      {{40}, {3}},                    // one request
      {{7, 7, 7, 7, 7}, {2, 1, 3, 1, 2}}};
  const CacheCase& cc = cases[ci];
  ParallelConfig c;
  c.mesh.ring = c.mesh.ulysses = 0;  // filled by resolve_job
  c.strategy = way.strategy;
  c.schedule = way.schedule;
  c.layout = layout;
  AttnShape s{.heads = 4, .kv_heads = 2, .head_dim = 16, .causal = causal};
  s.batch = ci == 3 ? 2 : 1;
  s.cached_lens = cc.cached;
  s.fresh_lens = cc.fresh;
  s.cached = std::accumulate(cc.cached.begin(), cc.cached.end(), int64_t{0});
  s.fresh = std::accumulate(cc.fresh.begin(), cc.fresh.end(), int64_t{0});
  std::vector<int64_t> docs;
  for (size_t i = 0; i < cc.cached.size(); ++i) docs.push_back(cc.cached[i] + cc.fresh[i]);
  const AttnJob job = resolve_job(c, s, ranks, false);
  // Each rank holds its share of every request's cache: a cache of >= N tokens on every rank.
  const std::vector<int64_t> cu = cu_seqlens(docs);
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < cc.cached.size(); ++i) {
      int64_t held = 0;
      for (int64_t p : job.kv_pos(r)) held += p >= cu[i] && p < cu[i] + cc.cached[i];
      if (cc.cached[i] >= ranks) {
        EXPECT_GE(held, 1) << "rank " << r << " request " << i;
      }
    }
  const Outcome o = run_and_check(job, docs);
  EXPECT_LE(o.max_out_err, o.bound.out);
  EXPECT_LE(o.max_lse_err, o.bound.lse);
}

INSTANTIATE_TEST_SUITE_P(Varlen, VarlenCache,
                         ::testing::Combine(::testing::Values(
                                                CacheWay{Strategy::kPassQ, ScheduleKind::kDefault},
                                                CacheWay{Strategy::kPassQ, ScheduleKind::kRing},
                                                CacheWay{Strategy::kPassKv, ScheduleKind::kDefault}),
                                            ::testing::Values(Layout::kContiguous, Layout::kZigzag),
                                            ::testing::Range(1, 6), ::testing::Range(0, 4),
                                            ::testing::Bool()));

TEST(VarlenCacheRules, RequestsValidated) {
  ParallelConfig c;
  c.mesh.ring = 0;
  c.strategy = Strategy::kPassQ;
  AttnShape s{.heads = 2, .head_dim = 8, .cached = 10, .fresh = 2};
  s.cached_lens = {4, 6};
  s.fresh_lens = {1};
  EXPECT_THROW(resolve_job(c, s, 2), InvalidArgument);  // one length per request
  s.fresh_lens = {1, 2};
  EXPECT_THROW(resolve_job(c, s, 2), InvalidArgument);  // sum 3 != new 2
  s.fresh = 3;
  EXPECT_NO_THROW(resolve_job(c, s, 2));
  // Decode over the requests: the new tokens of each request on the last ranks.
  const KvPlacement p = decode_placement(std::vector<int64_t>{4, 6}, std::vector<int64_t>{1, 1}, 2,
                                         Layout::kContiguous);
  EXPECT_EQ(p.q_pos[0], std::vector<int64_t>{});
  EXPECT_EQ(p.q_pos[1], (std::vector<int64_t>{4, 11}));
  EXPECT_EQ(p.kv_pos[0], (std::vector<int64_t>{0, 1, 5, 6, 7}));
  EXPECT_EQ(p.kv_pos[1], (std::vector<int64_t>{2, 3, 4, 8, 9, 10, 11}));
}

}  // namespace
}  // namespace seqpar
