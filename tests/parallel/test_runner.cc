// The runner (parallel/runner.h): jobs resolved from a configuration and a shape, the seeded
// inputs of a rank, one call of every kind verified against reference_attention, a wrong
// output caught by the verification, the per-rank figures and the trace document.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "seqpar/comm/threads.h"
#include "seqpar/core/trace.h"
#include "seqpar/parallel/runner.h"
#include "seqpar/parallel/synthetic.h"

namespace seqpar {

namespace {

AttnShape small_shape(int64_t seq, bool causal = false) {
  AttnShape s;
  s.batch = 2;
  s.seq = seq;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.causal = causal;
  return s;
}

ParallelConfig config_of(Strategy strategy, Layout layout = Layout::kContiguous) {
  ParallelConfig c;
  c.strategy = strategy;
  c.layout = layout;
  c.mesh.ulysses = c.mesh.ring = 0;  // filled by resolve_job
  return c;
}

struct Checked {
  std::vector<Verification> checks;  // per rank
  std::vector<RankCall> calls;       // per rank
  JobStats stats;                    // as rank 0 gathered it
};

// Runs the job once on its ranks with seeded inputs and verifies it; `corrupt` adds 1 to the
// first output value of rank 0 before the verification.
Checked run_and_verify(const AttnJob& job, bool corrupt = false) {
  Checked out;
  out.checks.resize(job.ranks());
  out.calls.resize(job.ranks());
  ThreadWorld::run(job.ranks(), [&](Communicator& comm) {
    const int r = comm.rank();
    const RankInputs in = synthetic_inputs(job, r, 7);
    JobComms comms(comm, job);
    RankCall call = run_attention_call(comms, job, in);
    if (corrupt && r == 0 && call.state.out.numel() > 0) call.state.out.data<float>()[0] += 1.f;
    CallTimes times;
    times.add(call);
    JobStats stats = gather_job_stats(comm, job, in, call, times);
    out.checks[r] = verify_call(comm, job, 7, call);
    if (r == 0) out.stats = std::move(stats);
    out.calls[r] = std::move(call);
  });
  return out;
}

}  // namespace

TEST(Runner, ResolveFillsDegreesPadsAndPartitions) {
  ParallelConfig c = config_of(Strategy::kUsp, Layout::kZigzag);
  c.pad = true;
  const AttnJob job = resolve_job(c, small_shape(37), 4);
  EXPECT_EQ(job.config.mesh.ulysses * job.config.mesh.ring, 4);
  EXPECT_EQ(job.config.mesh.ulysses, 4);  // the largest divisor of the ranks dividing the heads
  EXPECT_EQ(job.padded_seq, padded_seq(37, 4, Layout::kZigzag));
  EXPECT_EQ(job.place.part.seq(), job.padded_seq);
  EXPECT_EQ(job.cp().valid_len, 37);
  EXPECT_EQ(job.ranks(), 4);
  // Without padding the sequence is sharded as it is.
  const AttnJob plain = resolve_job(config_of(Strategy::kRing), small_shape(37), 4);
  EXPECT_EQ(plain.padded_seq, 37);
  EXPECT_EQ(plain.cp().valid_len, 0);
  EXPECT_EQ(plain.config.mesh.ring, 4);
}

TEST(Runner, ResolvePlacesACache) {
  AttnShape s = small_shape(0, true);
  s.cached = 50;
  s.fresh = 3;
  const AttnJob job = resolve_job(config_of(Strategy::kPassQ), s, 3);
  EXPECT_EQ(job.shape.seq, 53);
  EXPECT_EQ(job.ranks(), 3);
  size_t queries = 0, keys = 0;
  for (int r = 0; r < 3; ++r) {
    queries += job.q_pos(r).size();
    keys += job.kv_pos(r).size();
  }
  EXPECT_EQ(queries, 3u);
  EXPECT_EQ(keys, 53u);
}

TEST(Runner, ResolveRefusesWhatValidationRefuses) {
  AttnShape s = small_shape(37);
  s.kv_heads = 3;  // does not divide 4 heads
  EXPECT_THROW(resolve_job(config_of(Strategy::kRing), s, 2), InvalidArgument);
  EXPECT_THROW(resolve_job(config_of(Strategy::kPassQ), small_shape(37), 2), InvalidArgument);
  EXPECT_THROW(resolve_job(config_of(Strategy::kRing), small_shape(37), 0), InvalidArgument);
  AttnShape huge = small_shape(int64_t{1} << 31);
  huge.heads = huge.kv_heads = 1024;
  EXPECT_THROW(resolve_job(config_of(Strategy::kRing), huge, 2), InvalidArgument);  // memory
}

TEST(Runner, SyntheticInputsAreTheSeededRowsWithPaddingZeroed) {
  ParallelConfig c = config_of(Strategy::kRing);
  c.pad = true;
  const AttnJob job = resolve_job(c, small_shape(10), 4);  // padded to 12
  ASSERT_EQ(job.padded_seq, 12);
  const int last = 3;
  const RankInputs in = synthetic_inputs(job, last, 5);
  const auto pos = job.q_pos(last);
  const Tensor want = synthetic_rows(5, SyntheticTensor::kK, 2, pos, 2, 16, DType::kF32);
  const int64_t row = 2 * 16, n = static_cast<int64_t>(pos.size());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < row; ++x) {
        const int64_t at = (b * n + i) * row + x;
        EXPECT_EQ(in.k.at(at), pos[i] < 10 ? want.at(at) : 0.f) << "b " << b << " pos " << pos[i];
      }
  EXPECT_TRUE(in.text_q.empty());
}

// Every kind of call the runner makes, verified; the rows of every rank are checked.
TEST(Runner, EveryKindOfCallVerifies) {
  struct Case {
    const char* name;
    Strategy strategy;
    Layout layout;
    bool pad, causal;
    int64_t text, cached, fresh;
    int ranks;
  };
  const Case cases[] = {
      {"ring zigzag causal", Strategy::kRing, Layout::kZigzag, false, true, 0, 0, 0, 3},
      {"allgather", Strategy::kAllGather, Layout::kStriped, false, true, 0, 0, 0, 2},
      {"ulysses", Strategy::kUlysses, Layout::kContiguous, false, false, 0, 0, 0, 2},
      {"usp padded", Strategy::kUsp, Layout::kZigzag, true, true, 0, 0, 0, 4},
      {"joint ring", Strategy::kRing, Layout::kContiguous, false, false, 5, 0, 0, 3},
      {"joint ulysses", Strategy::kUlysses, Layout::kContiguous, false, false, 4, 0, 0, 2},
      {"passq", Strategy::kPassQ, Layout::kContiguous, false, true, 0, 40, 3, 3},
      {"passkv", Strategy::kPassKv, Layout::kZigzag, false, true, 0, 40, 5, 2},
  };
  for (const Case& k : cases) {
    ParallelConfig c = config_of(k.strategy, k.layout);
    c.pad = k.pad;
    AttnShape s = small_shape(k.cached > 0 ? 0 : 37, k.causal);
    s.text_tokens = k.text;
    s.cached = k.cached;
    s.fresh = k.fresh;
    const AttnJob job = resolve_job(c, s, k.ranks, true);
    const Checked got = run_and_verify(job);
    int64_t real_queries = 0;
    for (int r = 0; r < k.ranks; ++r)
      for (int64_t p : job.q_pos(r)) real_queries += p < job.shape.seq;
    for (int r = 0; r < k.ranks; ++r) {
      const Verification& v = got.checks[r];
      EXPECT_TRUE(v.ok) << k.name << " rank " << r << " err " << v.max_abs_err << " lse "
                        << v.max_lse_err;
      EXPECT_EQ(v.rows, real_queries + k.text) << k.name;  // small: every row
      EXPECT_GT(v.max_abs_v, 0) << k.name;
    }
    if (k.text > 0) {
      EXPECT_EQ(got.calls[0].text.out.dim(1), k.text) << k.name;
    }
  }
}

TEST(Runner, VerificationCatchesAWrongOutput) {
  const AttnJob job = resolve_job(config_of(Strategy::kRing), small_shape(37, true), 2, true);
  const Checked good = run_and_verify(job);
  ASSERT_TRUE(good.checks[0].ok);
  const Checked bad = run_and_verify(job, /*corrupt=*/true);
  for (const Verification& v : bad.checks) {
    EXPECT_FALSE(v.ok);
    EXPECT_GE(v.max_abs_err, 0.99);
  }
}

TEST(Runner, GathersEveryRanksFigures) {
  const AttnJob job = resolve_job(config_of(Strategy::kRing), small_shape(37, true), 3);
  const Checked got = run_and_verify(job);
  const JobStats& st = got.stats;
  ASSERT_EQ(st.sent.size(), 3u);
  int64_t tokens = 0;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st.sent[r], static_cast<int64_t>(got.calls[r].comm.total_sent()));
    EXPECT_EQ(st.recv[r], static_cast<int64_t>(got.calls[r].comm.total_recv()));
    EXPECT_EQ(st.work[r], got.calls[r].cp.work);
    EXPECT_EQ(st.peak_kv[r], got.calls[r].cp.peak_kv_bytes);
    EXPECT_EQ(st.tokens[r], job.place.part.count(r));
    EXPECT_GT(st.peak_rss[r], 0);
    EXPECT_GT(st.tensor_bytes[r], 0);
    EXPECT_GT(st.sent[r], 0);
    tokens += st.tokens[r];
  }
  EXPECT_EQ(tokens, 37);
  EXPECT_EQ(st.exposed.size(), 3u);
}

TEST(Runner, GathersTheTraceOfEveryRank) {
  const AttnJob job = resolve_job(config_of(Strategy::kRing), small_shape(37), 2);
  std::vector<std::string> docs(2);
  trace::start();
  ThreadWorld::run(2, [&](Communicator& comm) {
    trace::set_rank(comm.rank());
    const RankInputs in = synthetic_inputs(job, comm.rank(), 1);
    JobComms comms(comm, job);
    run_attention_call(comms, job, in);
    docs[comm.rank()] = gather_trace(comm);
  });
  EXPECT_FALSE(trace::enabled());
  EXPECT_TRUE(docs[1].empty());
  ASSERT_FALSE(docs[0].empty());
  // A slice ("ph":"X") recorded by each rank.
  for (int rank = 0; rank < 2; ++rank) {
    bool found = false;
    for (size_t at = docs[0].find("\"ph\":\"X\""); at != std::string::npos && !found;
         at = docs[0].find("\"ph\":\"X\"", at + 1)) {
      const std::string slice = docs[0].substr(at, docs[0].find('}', at) - at);
      found = slice.find(",\"pid\":" + std::to_string(rank) + ",") != std::string::npos;
    }
    EXPECT_TRUE(found) << "rank " << rank << ": " << docs[0].substr(0, 400);
  }
}

}  // namespace seqpar
