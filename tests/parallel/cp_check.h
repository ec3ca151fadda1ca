// One check per rank for every strategy and option against reference_attention, at the kernel
// path's error bound (seqpar/attention/error_bound.h). The same check runs on the threads
// backend (ThreadWorld, one call per rank thread) and under mpiexec (one call per process):
// every rank builds the same seeded global inputs and reference, runs its part, and compares
// the rows it holds with the reference rows at their global positions.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "parallel/cp_test_util.h"
#include "seqpar/attention/error_bound.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/runner.h"

namespace seqpar::testing {

// What runs: a sequence strategy, the decode passes, joint text attention, or a strategy on the
// sequence padded to a multiple of the ranks (auto_pad).
enum class Op { kSequence, kPassQ, kPassKv, kJoint, kPadded };

struct CheckCase {
  Op op = Op::kSequence;
  Strategy strategy = Strategy::kRing;  // kSequence, kJoint, kPadded
  SoftmaxMode softmax = SoftmaxMode::kOnline;
  Layout layout = Layout::kContiguous;
  int64_t batch = 1, seq = 37, heads = 4, kv_heads = 2, head_dim = 16;
  int64_t extra = 0;  // kJoint: text tokens; kPassQ/kPassKv: new tokens (seq = cached tokens)
  bool causal = false;
  DType dtype = DType::kF32;
  uint32_t seed = 1;

  int64_t total() const { return op == Op::kSequence || op == Op::kPadded ? seq : seq + extra; }
  std::string name() const {
    std::string s;
    switch (op) {
      case Op::kSequence:
        s = std::string(strategy_name(strategy));
        break;
      case Op::kPassQ:
        s = "passq";
        break;
      case Op::kPassKv:
        s = "passkv";
        break;
      case Op::kJoint:
        s = "joint_" + std::string(strategy_name(strategy));
        break;
      case Op::kPadded:
        s = "pad_" + std::string(strategy_name(strategy));
        break;
    }
    if (softmax == SoftmaxMode::kConstMax) s += "_constmax";
    s += "_" + std::string(layout_name(layout)) + "_b" + std::to_string(batch) + "_s" +
         std::to_string(seq) + "_h" + std::to_string(heads) + "kv" + std::to_string(kv_heads) +
         "_d" + std::to_string(head_dim) + (causal ? "_causal" : "_full") + "_" +
         std::string(dtype_name(dtype));
    for (char& ch : s)
      if (ch == '-') ch = '_';
    return s;
  }
};

struct Kind {
  Op op;
  Strategy strategy;
  SoftmaxMode softmax;
};

// Every strategy and option once.
inline const std::vector<Kind>& kinds() {
  static const std::vector<Kind> k = {
      {Op::kSequence, Strategy::kAllGather, SoftmaxMode::kOnline},
      {Op::kSequence, Strategy::kRing, SoftmaxMode::kOnline},
      {Op::kSequence, Strategy::kRing, SoftmaxMode::kConstMax},
      {Op::kSequence, Strategy::kUlysses, SoftmaxMode::kOnline},
      {Op::kSequence, Strategy::kUsp, SoftmaxMode::kOnline},
      {Op::kSequence, Strategy::kUsp, SoftmaxMode::kConstMax},
      {Op::kPassQ, Strategy::kRing, SoftmaxMode::kOnline},
      {Op::kPassKv, Strategy::kRing, SoftmaxMode::kOnline},
      {Op::kJoint, Strategy::kRing, SoftmaxMode::kOnline},
      {Op::kJoint, Strategy::kUsp, SoftmaxMode::kConstMax},
      {Op::kJoint, Strategy::kUlysses, SoftmaxMode::kOnline},
      {Op::kPadded, Strategy::kRing, SoftmaxMode::kOnline},
      {Op::kPadded, Strategy::kUlysses, SoftmaxMode::kOnline},
      {Op::kPadded, Strategy::kUsp, SoftmaxMode::kConstMax},
  };
  return k;
}

// A case for kind x batch x dtype x causal x layout: shapes vary with the batch (heads, GQA,
// head dim) so the sweep covers them without multiplying the cases.
inline CheckCase make_case(const Kind& kind, int64_t batch, DType dtype, bool causal,
                           Layout layout) {
  CheckCase c;
  c.op = kind.op;
  c.strategy = kind.strategy;
  c.softmax = kind.softmax;
  c.layout = layout;
  c.batch = batch;
  c.dtype = dtype;
  c.causal = causal;
  c.heads = batch == 3 ? 6 : 4;
  c.kv_heads = batch == 1 ? 4 : (batch == 2 ? 2 : 3);
  c.head_dim = dtype == DType::kF32 ? 16 : (dtype == DType::kBF16 ? 32 : 24);
  c.seq = 37;
  if (kind.op == Op::kPassQ || kind.op == Op::kPassKv) c.extra = 3;  // new tokens
  if (kind.op == Op::kJoint) {
    c.seq = 29;
    c.extra = 5;  // text tokens
  }
  c.seed = static_cast<uint32_t>(100 * batch + 10 * static_cast<int>(dtype) + causal);
  return c;
}

// gtest prints a failing case by its name (instead of its bytes).
inline void PrintTo(const CheckCase& c, std::ostream* os) { *os << c.name(); }

// Rows `pos` of x (B, S, h, d), any dtype -> (B, |pos|, h, d).
inline Tensor rows_at(const Tensor& x, std::span<const int64_t> pos) {
  const int64_t B = x.dim(0), S = x.dim(1), n = static_cast<int64_t>(pos.size());
  Tensor y({B, n, x.dim(2), x.dim(3)}, x.dtype());
  const size_t row = x.dim(2) * x.dim(3) * dtype_size(x.dtype());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(y.raw()) + (b * n + i) * row,
                  static_cast<const char*>(x.raw()) + (b * S + pos[i]) * row, row);
  return y;
}

inline std::vector<int64_t> iota_positions(int64_t from, int64_t count) {
  std::vector<int64_t> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = from + i;
  return v;
}

// The global inputs (B, total, ·, D) and the reference of the rows that are checked.
struct CaseData {
  Tensor q, k, v;
  std::vector<int64_t> q_pos;  // global positions of the reference's rows
  AttnState ref;               // (B, |q_pos|, H, D)
  ErrorBound bound;
};

inline CaseData make_case_data(const CheckCase& c) {
  CaseData d;
  std::mt19937 rng(c.seed);
  const int64_t total = c.total();
  d.q = random_tensor({c.batch, total, c.heads, c.head_dim}, rng, c.dtype);
  d.k = random_tensor({c.batch, total, c.kv_heads, c.head_dim}, rng, c.dtype);
  d.v = random_tensor({c.batch, total, c.kv_heads, c.head_dim}, rng, c.dtype);
  AttnParams params;
  params.mask.causal = c.causal;
  const bool decode = c.op == Op::kPassQ || c.op == Op::kPassKv;
  d.q_pos = decode ? iota_positions(c.seq, c.extra) : iota_positions(0, total);
  if (decode) params.mask.q_pos = d.q_pos;
  d.ref = reference_attention(decode ? rows_at(d.q, d.q_pos) : d.q, d.k, d.v, params);
  double vmax = 0;
  for (int64_t i = 0; i < d.v.numel(); ++i) vmax = std::max(vmax, std::fabs(double(d.v.at(i))));
  d.bound = attention_error_bound(c.dtype, total, c.head_dim, vmax);
  return d;
}

struct RankErrors {
  double out = 0, lse = 0;
};

// Max errors of rows (B, n, H, D) / (B, n, H) against the reference rows at `pos` (indices into
// data.q_pos order = global positions minus `pos_base`).
inline void accumulate_errors(const AttnState& got, const CaseData& data,
                              std::span<const int64_t> pos, int64_t pos_base, RankErrors& e) {
  const int64_t B = data.ref.out.dim(0), R = data.ref.out.dim(1), H = data.ref.out.dim(2),
                D = data.ref.out.dim(3), n = static_cast<int64_t>(pos.size());
  if (got.out.numel() != B * n * H * D || got.lse.numel() != B * n * H) {  // missing or misshapen
    e.out = e.lse = INFINITY;
    return;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = pos[i] - pos_base;
      for (int64_t h = 0; h < H; ++h) {
        const float gl = got.lse.at((b * n + i) * H + h), wl = data.ref.lse.at((b * R + j) * H + h);
        const double dl = std::fabs(double(gl) - wl);
        e.lse = std::max(e.lse, std::isnan(dl) ? INFINITY : dl);
        for (int64_t x = 0; x < D; ++x) {
          const double dx = std::fabs(double(got.out.at(((b * n + i) * H + h) * D + x)) -
                                      data.ref.out.at(((b * R + j) * H + h) * D + x));
          e.out = std::max(e.out, std::isnan(dx) ? INFINITY : dx);
        }
      }
    }
}

// Ulysses groups for usp: 2 where the ranks are even, else 1 (a ring over all ranks).
inline int usp_degree(const CheckCase& c, int ranks) {
  return c.strategy == Strategy::kUsp ? (ranks % 2 == 0 ? 2 : 1) : 0;
}

// The case's shape as the runner takes it.
inline AttnShape case_shape(const CheckCase& c) {
  AttnShape s{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.causal, 0, 0, 0, c.dtype};
  if (c.op == Op::kJoint) s.text_tokens = c.extra;
  if (c.op == Op::kPassQ || c.op == Op::kPassKv) {  // c.seq cached tokens, c.extra new ones
    s.cached = c.seq;
    s.fresh = c.extra;
    s.seq = c.seq + c.extra;
  }
  return s;
}

// Runs the case on this rank through the runner (run_attention_call) and returns the max errors
// of the rows it holds.
inline RankErrors check_on_rank(Communicator& comm, const CheckCase& c, const CaseData& data) {
  const int n = comm.size(), r = comm.rank();
  CpOptions opts;
  opts.causal = c.causal;
  opts.softmax = c.softmax;
  RankErrors e;
  RankInputs in;
  switch (c.op) {
    case Op::kSequence: {
      const Partition part(c.seq, n, c.layout);
      const AttnJob job = job_for(c.strategy, case_shape(c), part, opts, usp_degree(c, n));
      in.q = shard(data.q, part, r);
      in.k = shard(data.k, part, r);
      in.v = shard(data.v, part, r);
      JobComms comms(comm, job);
      accumulate_errors(run_attention_call(comms, job, in).state, data, part.positions(r), 0, e);
      break;
    }
    case Op::kPadded: {
      const int64_t m = c.layout == Layout::kZigzag ? 2 * n : n;
      const int64_t padded = (c.seq + m - 1) / m * m + m;  // at least one padded token
      auto pad = [&](const Tensor& x) {
        Tensor y({x.dim(0), padded, x.dim(2), x.dim(3)}, x.dtype());
        y.fill(7.f);  // padding is masked whatever its value
        const size_t row = x.dim(2) * x.dim(3) * dtype_size(x.dtype());
        for (int64_t b = 0; b < x.dim(0); ++b)
          std::memcpy(static_cast<char*>(y.raw()) + b * padded * row,
                      static_cast<const char*>(x.raw()) + b * x.dim(1) * row, x.dim(1) * row);
        return y;
      };
      const Partition part(padded, n, c.layout);
      opts.valid_len = c.seq;
      const AttnJob job = job_for(c.strategy, case_shape(c), part, opts, usp_degree(c, n));
      in.q = shard(pad(data.q), part, r);
      in.k = shard(pad(data.k), part, r);
      in.v = shard(pad(data.v), part, r);
      JobComms comms(comm, job);
      const AttnState s = run_attention_call(comms, job, in).state;
      // Keep the real rows only.
      std::vector<int64_t> keep, real_pos;
      const auto pos = part.positions(r);
      for (size_t i = 0; i < pos.size(); ++i)
        if (pos[i] < c.seq) {
          keep.push_back(static_cast<int64_t>(i));
          real_pos.push_back(pos[i]);
        }
      AttnState real;
      real.out = rows_at(s.out, keep);
      Tensor lse4 = s.lse;
      lse4.resize({s.lse.dim(0), s.lse.dim(1), s.lse.dim(2), 1});
      real.lse = rows_at(lse4, keep);
      accumulate_errors(real, data, real_pos, 0, e);
      break;
    }
    case Op::kJoint: {
      const Partition part(c.seq, n, c.layout);
      const std::vector<int64_t> text_pos = iota_positions(c.seq, c.extra);
      const AttnJob job = job_for(c.strategy, case_shape(c), part, opts, usp_degree(c, n));
      in.q = rows_at(data.q, part.positions(r));
      in.k = rows_at(data.k, part.positions(r));
      in.v = rows_at(data.v, part.positions(r));
      in.text_q = rows_at(data.q, text_pos);
      in.text_k = rows_at(data.k, text_pos);
      in.text_v = rows_at(data.v, text_pos);
      JobComms comms(comm, job);
      const RankCall call = run_attention_call(comms, job, in);
      accumulate_errors(call.state, data, part.positions(r), 0, e);
      accumulate_errors(call.text, data, text_pos, 0, e);
      break;
    }
    case Op::kPassQ:
    case Op::kPassKv: {
      AttnJob job;
      job.config.strategy = c.op == Op::kPassQ ? Strategy::kPassQ : Strategy::kPassKv;
      job.shape = case_shape(c);
      job.padded_seq = job.shape.seq;
      job.config.mesh = {1, 1, n, 1};
      job.config.layout = c.layout;
      job.config.schedule = opts.schedule;
      job.place.over_cache = true;
      job.place.cache = decode_placement(c.seq, c.extra, n, c.layout);
      job.kernel = {opts.scale, opts.block_q, opts.block_k};
      in.q = rows_at(data.q, job.q_pos(r));
      in.k = rows_at(data.k, job.kv_pos(r));
      in.v = rows_at(data.v, job.kv_pos(r));
      JobComms comms(comm, job);
      accumulate_errors(run_attention_call(comms, job, in).state, data, job.q_pos(r), c.seq, e);
      break;
    }
  }
  return e;
}

// SEQPAR_TEST_PRINT_ERRORS=1 prints every checked case's errors beside its bound (the
// measurement behind docs/kernel.md "Error bounds").
inline void expect_within_bound(const CheckCase& c, const CaseData& data, const RankErrors& e,
                                int ranks, int rank = -1) {
  const std::string where = c.name() + " ranks " + std::to_string(ranks) +
                            (rank >= 0 ? " rank " + std::to_string(rank) : std::string());
  EXPECT_LE(e.out, data.bound.out) << where;
  EXPECT_LE(e.lse, data.bound.lse) << where;
  if (std::getenv("SEQPAR_TEST_PRINT_ERRORS") != nullptr)
    std::printf("errors %s %s ranks %d keys %lld d %lld out %.3g / %.3g lse %.3g / %.3g\n",
                std::string(kernel_path_name(kernel_path(c.dtype))).c_str(), c.name().c_str(),
                ranks, static_cast<long long>(c.total()), static_cast<long long>(c.head_dim), e.out,
                data.bound.out, e.lse, data.bound.lse);
}

// The case on `ranks` threads (ThreadWorld), every rank checked.
inline void check_on_threads(const CheckCase& c, int ranks) {
  const CaseData data = make_case_data(c);
  std::vector<RankErrors> errs(ranks);
  ThreadWorld::run(ranks,
                   [&](Communicator& comm) { errs[comm.rank()] = check_on_rank(comm, c, data); });
  RankErrors worst;
  for (const RankErrors& e : errs) {
    worst.out = std::max(worst.out, e.out);
    worst.lse = std::max(worst.lse, e.lse);
  }
  expect_within_bound(c, data, worst, ranks);
}

}  // namespace seqpar::testing
