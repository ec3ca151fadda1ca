// Shared helpers of the context-parallel tests: seeded global inputs, a cached oracle, and
// run_cp, which shards the inputs, runs a strategy on every rank through the library's runner
// (parallel/runner.h: run_attention_call) and gathers the result.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include "seqpar/attention/attention.h"
#include "seqpar/attention/error_bound.h"
#include "seqpar/comm/threads.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/runner.h"
#include "seqpar/parallel/schedule.h"
#include "seqpar/parallel/strategies.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar::testing {

struct Problem {
  int64_t batch = 1, seq = 64, heads = 4, kv_heads = 4, head_dim = 32;
  bool causal = false;
  DType dtype = DType::kF32;
  uint32_t seed = 1;
  auto key() const { return std::tuple(batch, seq, heads, kv_heads, head_dim, causal, dtype, seed); }
};

inline Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, DType dtype) {
  Tensor t(std::move(shape));
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return dtype == DType::kF32 ? t : t.to(dtype);
}

struct Inputs {
  Tensor q, k, v;
  AttnState ref;
};

// Global inputs and the reference for a problem, computed once per process.
inline const Inputs& inputs_for(const Problem& p) {
  static std::mutex mu;
  static std::map<decltype(p.key()), Inputs> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(p.key());
  if (it != cache.end()) return it->second;
  std::mt19937 rng(p.seed);
  Inputs in;
  in.q = random_tensor({p.batch, p.seq, p.heads, p.head_dim}, rng, p.dtype);
  in.k = random_tensor({p.batch, p.seq, p.kv_heads, p.head_dim}, rng, p.dtype);
  in.v = random_tensor({p.batch, p.seq, p.kv_heads, p.head_dim}, rng, p.dtype);
  AttnParams params;
  params.mask.causal = p.causal;
  in.ref = reference_attention(in.q, in.k, in.v, params);
  return cache.emplace(p.key(), std::move(in)).first->second;
}

struct CpRun {
  AttnState state;                   // gathered to (B, S, H, D) / (B, S, H)
  std::vector<CommStats> comm;       // per rank
  std::vector<CpStats> cp;           // per rank
};

// The schedule equals what the run measured on every rank: bytes sent and received per kind of
// op, work and peak K/V.
inline void expect_schedule_matches(const Schedule& s, const CpRun& run) {
  ASSERT_EQ(s.sp(), static_cast<int>(run.cp.size()));
  for (int r = 0; r < s.sp(); ++r) {
    std::array<uint64_t, static_cast<size_t>(OpKind::kCount)> sent{}, recv{};
    for (const Step& step : s.ranks[r].steps)
      if (step.comm) {
        sent[static_cast<size_t>(step.comm->op)] += step.comm->sent;
        recv[static_cast<size_t>(step.comm->op)] += step.comm->recv;
      }
    EXPECT_EQ(run.comm[r].bytes_sent, sent) << "rank " << r;
    EXPECT_EQ(run.comm[r].bytes_recv, recv) << "rank " << r;
    EXPECT_EQ(run.cp[r].work, schedule_work(s, r)) << "rank " << r;
    EXPECT_EQ(run.cp[r].peak_kv_bytes, s.ranks[r].peak_kv_bytes) << "rank " << r;
  }
}

// The runner's job for `strategy` over the tests' own partition and options (not resolve_job:
// the tests choose partitions, padding and kernel options it would not). The options say what
// the configuration and shape say to the one entry point: opts.valid_len > 0 is a sequence of
// valid_len real tokens padded to part.seq(), opts.cu_seqlens its documents.
inline AttnJob job_for(Strategy strategy, AttnShape shape, const Partition& part,
                       const CpOptions& opts, int ulysses_degree) {
  AttnJob job;
  const int n = part.ranks();
  job.config.strategy = strategy;
  const int u = !uses_ulysses(strategy) ? 1 : ulysses_degree == 0 ? n : ulysses_degree;
  job.config.mesh = {1, 1, n / u, u};  // ulysses_degree 0: all ranks one Ulysses group
  job.config.layout = part.layout() == Layout::kCustom ? Layout::kContiguous : part.layout();
  job.config.ulysses_mode = opts.ulysses_mode;
  job.config.softmax = opts.softmax;
  job.config.schedule = opts.schedule;
  if (opts.valid_len > 0) shape.seq = opts.valid_len;
  job.config.pad = part.seq() > shape.seq;
  shape.causal = opts.causal;
  if (!opts.cu_seqlens.empty())
    for (size_t i = 0; i + 1 < opts.cu_seqlens.size(); ++i)
      shape.seq_lens.push_back(opts.cu_seqlens[i + 1] - opts.cu_seqlens[i]);
  job.shape = shape;
  job.padded_seq = part.seq();
  job.place.part = part;
  job.kernel = {opts.scale, opts.block_q, opts.block_k};
  return job;
}

// One rank's call of `strategy` through the one entry point (cp_attention.h), over the tests' own
// partition and options (job_for), on communicators of the group: q (B, n_r, H, D), k and v
// (B, n_r, Hkv, D) of this rank.
inline AttnState cp_call(Strategy strategy, SpComms& comms, const Partition& part, const Tensor& q,
                         const Tensor& k, const Tensor& v, const CpOptions& opts,
                         CpStats* stats = nullptr) {
  const AttnShape shape{q.dim(0),    part.seq(), q.dim(2), k.dim(2), q.dim(3),
                        opts.causal, 0,          0,        0,        q.dtype()};
  const AttnJob job = job_for(strategy, shape, part, opts, comms.ulysses_degree());
  AttnOutputs out;
  attention(job.config, job.shape, comms, job.place, {q, k, v}, out, stats, job.kernel);
  return {std::move(out.out), std::move(out.lse)};
}

inline AttnShape shape_of(const Problem& p) {
  return {p.batch, p.seq, p.heads, p.kv_heads, p.head_dim, p.causal, 0, 0, 0, p.dtype};
}

// Runs `strategy` on `ranks` threads over the problem's global inputs.
// ulysses_degree is used by usp (0: all ranks in one Ulysses group).
inline CpRun run_cp(const Problem& p, Strategy strategy, const Partition& part,
                    CpOptions opts = {}, int ulysses_degree = 0) {
  const Inputs& in = inputs_for(p);
  opts.causal = p.causal;
  const AttnJob job = job_for(strategy, shape_of(p), part, opts, ulysses_degree);
  const int ranks = part.ranks();
  std::vector<Tensor> outs(ranks), lses(ranks);
  CpRun result;
  result.comm.resize(ranks);
  result.cp.resize(ranks);
  ThreadWorld::run(ranks, [&](Communicator& comm) {
    const int r = comm.rank();
    RankInputs ri;
    ri.q = shard(in.q, part, r);
    ri.k = shard(in.k, part, r);
    ri.v = shard(in.v, part, r);
    JobComms comms(comm, job);
    RankCall call = run_attention_call(comms, job, ri);
    result.comm[r] = call.comm;
    result.cp[r] = call.cp;
    outs[r] = std::move(call.state.out);
    // lse (B, n, H) is sharded like a (B, n, H, 1) tensor.
    lses[r] = std::move(call.state.lse);
    lses[r].resize({p.batch, part.count(r), p.heads, 1});
  });
  result.state.out = unshard(outs, part);
  result.state.lse = unshard(lses, part);
  result.state.lse.resize({p.batch, p.seq, p.heads});
  return result;
}

inline CpRun run_cp(const Problem& p, Strategy strategy, Layout layout, int ranks,
                    CpOptions opts = {}, int ulysses_degree = 0) {
  return run_cp(p, strategy, Partition(p.seq, ranks, layout), opts, ulysses_degree);
}

// Max |x| over a tensor of any dtype.
inline double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(t.at(i))));
  return m;
}

// The kernel path's error bound for the problem (every query sees at most all p.seq keys).
inline ErrorBound bound_for(const Problem& p) {
  return attention_error_bound(p.dtype, p.seq, p.head_dim, max_abs(inputs_for(p).v));
}

// Max |a - b| treating matching infinities as equal.
inline double max_err_lse(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    float x = a.at(i), y = b.at(i);
    if (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0)) continue;
    double d = std::fabs(static_cast<double>(x) - y);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace seqpar::testing
