#include "seqpar/parallel/runner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "seqpar/attention/attention.h"
#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/core/process_memory.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/parallel/strategy_table.h"
#include "seqpar/parallel/synthetic.h"

namespace seqpar {

namespace {

std::vector<int64_t> iota(int64_t from, int64_t count) {
  std::vector<int64_t> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = from + i;
  return v;
}

bool in_range(int64_t x, int64_t lo, int64_t hi) { return x >= lo && x <= hi; }

// Bytes the job holds at its peak over all ranks (inputs, outputs, K/V in flight, positions, the
// reference's K/V with verify), with overflow-checked sizes; refused if the machine lacks them.
// Under MPI every process holds its share, but the ranks usually share the machine as well.
void check_job_memory(const ParallelConfig& c, const AttnShape& s, int ranks, bool verify) {
  using limits::checked_add;
  using limits::checked_product;
  const int64_t tokens =
      s.over_cache() ? checked_add(s.cached, s.fresh, "cached + new tokens") : sharded_seq(c, s);
  const int64_t all = checked_add(tokens, s.text_tokens, "tokens with text_tokens");
  const int64_t e = static_cast<int64_t>(dtype_size(s.dtype));
  const int64_t kv_bytes = checked_product({s.batch, all, 2 * s.kv(), s.head_dim, e}, "K/V bytes");
  const int64_t q_bytes = checked_product({s.batch, all, s.heads, s.head_dim, e}, "Q bytes");
  const int64_t out_bytes =
      checked_product({s.batch, all, s.heads, s.head_dim + 1, 4}, "output bytes");
  const bool gathers = strategy_row(c.strategy).gathers_kv;
  const double held = static_cast<double>(kv_bytes) * (gathers ? ranks + 1 : 3) +
                      static_cast<double>(q_bytes) + static_cast<double>(out_bytes) +
                      (verify ? 2.0 * kv_bytes * 4 / e : 0) + 24.0 * all;
  limits::check_fits_memory(detail::concat("attention of ", all, " tokens x ", s.heads, " heads x ",
                                           s.head_dim, " dims on ", ranks, " ranks"),
                            held);
  (void)checked_product({s.batch, s.heads, all, all}, "attention score elements (B·H·S·S)",
                        limits::kMaxScoreElements);
}

// The sizes validate_config checks by range, all within them (the memory check can size by them).
bool sizes_in_range(const AttnShape& s) {
  const int64_t t = limits::kMaxTokens;
  return in_range(s.batch, 1, limits::kMaxBatch) && in_range(s.heads, 1, limits::kMaxHeads) &&
         in_range(s.kv(), 1, limits::kMaxHeads) && in_range(s.head_dim, 1, limits::kMaxHeadDim) &&
         in_range(s.text_tokens, 0, t) && in_range(s.seq, 0, t) && in_range(s.cached, 0, t) &&
         in_range(s.fresh, 0, t);
}

// Max |got - want| over `count` values into err; matching infinities agree, NaN is infinite.
void accumulate_err(const float* got, const float* want, int64_t count, double& err) {
  for (int64_t x = 0; x < count; ++x) {
    const float a = got[x], b = want[x];
    if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) continue;
    const double d = std::fabs(static_cast<double>(a) - b);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
  }
}

// Query positions checked among `candidates` (sorted): all if cheap, else an even spread with
// both ends.
std::vector<int64_t> verify_sample(const AttnJob& job, const std::vector<int64_t>& candidates,
                                   double row_budget) {
  const AttnShape& s = job.shape;
  const double per_row =
      static_cast<double>(s.batch) * (s.seq + s.text_tokens) * s.heads * s.head_dim;
  const int64_t n = static_cast<int64_t>(candidates.size());
  const int64_t want =
      std::clamp<int64_t>(static_cast<int64_t>(row_budget / per_row), std::min<int64_t>(16, n), n);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < want; ++i)
    out.push_back(candidates[want == 1 ? 0 : i * (n - 1) / (want - 1)]);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Rows a at image_pos followed by the T text rows (joint attention): (B, |image_pos| + T, h, D).
Tensor with_text(uint64_t seed, const AttnShape& s, SyntheticTensor image, SyntheticTensor text,
                 std::span<const int64_t> image_pos, int64_t heads) {
  Tensor a = synthetic_rows(seed, image, s.batch, image_pos, heads, s.head_dim, s.dtype);
  const int64_t T = s.text_tokens;
  if (T == 0) return a;
  Tensor b = synthetic_rows(seed, text, s.batch, iota(0, T), heads, s.head_dim, s.dtype);
  Tensor c({s.batch, a.dim(1) + T, heads, s.head_dim}, s.dtype);
  const size_t ra = a.dim(1) * heads * s.head_dim * dtype_size(s.dtype);
  const size_t rb = T * heads * s.head_dim * dtype_size(s.dtype);
  for (int64_t bb = 0; bb < s.batch; ++bb) {
    std::memcpy(static_cast<char*>(c.raw()) + bb * (ra + rb),
                static_cast<const char*>(a.raw()) + bb * ra, ra);
    std::memcpy(static_cast<char*>(c.raw()) + bb * (ra + rb) + ra,
                static_cast<const char*>(b.raw()) + bb * rb, rb);
  }
  return c;
}

}  // namespace

AttnJob resolve_job(ParallelConfig config, const AttnShape& shape, int ranks, bool verify) {
  SEQPAR_PARAM_CHECK(ranks >= 1 && ranks <= limits::kMaxRanks, "ranks",
                     detail::concat("1 to ", limits::kMaxRanks), param("ranks"), " ", ranks,
                     " is out of range; valid: 1 to ", limits::kMaxRanks);
  AttnJob job;
  job.shape = shape;
  if (shape.over_cache() && in_range(shape.cached, 0, limits::kMaxTokens) &&
      in_range(shape.fresh, 0, limits::kMaxTokens))  // else validate_config refuses them
    job.shape.seq = shape.cached + shape.fresh;
  fill_sp_degrees(config, ranks, shape.heads);
  // The memory first where the sizes allow it: validation may size a partition by them.
  if (sizes_in_range(job.shape)) check_job_memory(config, job.shape, ranks, verify);
  validate_config(config, job.shape);
  check_job_memory(config, job.shape, ranks, verify);
  job.config = config;
  job.padded_seq = job.over_cache() ? job.shape.seq : sharded_seq(config, shape);
  job.place = place_call(config, job.shape);
  return job;
}

RankInputs synthetic_inputs(const AttnJob& job, int rank, uint64_t seed) {
  const AttnShape& s = job.shape;
  // Rows at positions, with padded positions (>= seq) zeroed as padding is.
  auto rows = [&](SyntheticTensor which, std::span<const int64_t> pos, int64_t heads) {
    Tensor t = synthetic_rows(seed, which, s.batch, pos, heads, s.head_dim, s.dtype);
    if (job.padded_seq != s.seq && !job.over_cache()) {  // zero bits are 0 in every dtype
      const size_t row_bytes = heads * s.head_dim * dtype_size(s.dtype);
      char* data = static_cast<char*>(t.raw());
      for (int64_t b = 0; b < s.batch; ++b)
        for (size_t i = 0; i < pos.size(); ++i)
          if (pos[i] >= s.seq) std::memset(data + (b * pos.size() + i) * row_bytes, 0, row_bytes);
    }
    return t;
  };
  RankInputs in;
  in.q = rows(SyntheticTensor::kQ, job.q_pos(rank), s.heads);
  in.k = rows(SyntheticTensor::kK, job.kv_pos(rank), s.kv());
  in.v = rows(SyntheticTensor::kV, job.kv_pos(rank), s.kv());
  if (s.text_tokens > 0) {
    const std::vector<int64_t> t = iota(0, s.text_tokens);
    in.text_q =
        synthetic_rows(seed, SyntheticTensor::kTextQ, s.batch, t, s.heads, s.head_dim, s.dtype);
    in.text_k =
        synthetic_rows(seed, SyntheticTensor::kTextK, s.batch, t, s.kv(), s.head_dim, s.dtype);
    in.text_v =
        synthetic_rows(seed, SyntheticTensor::kTextV, s.batch, t, s.kv(), s.head_dim, s.dtype);
  }
  return in;
}

JobComms::JobComms(Communicator& comm, const AttnJob& job)
    : comm_(comm), sp_(comm, job.config.mesh.ulysses) {}

RankCall run_attention_call(JobComms& comms, const AttnJob& job, const RankInputs& in) {
  RankCall call;
  comms.comm().barrier();
  comms.reset_stats();
  const double t0 = now_seconds();
  const bool text = job.shape.text_tokens > 0;
  AttnShape shape = job.shape;
  shape.kv_use = runner_kv_use(comms.comm().borrows());
  AttnInputs inputs{in.q, in.k, in.v};
  if (text) {
    inputs.text_q = in.text_q;
    inputs.text_k = in.text_k;
    inputs.text_v = in.text_v;
  }
  AttnOutputs out;
  attention(job.config, shape, comms.sp(), job.place, inputs, out, &call.cp, job.kernel);
  call.state = {std::move(out.out), std::move(out.lse)};
  call.text = {std::move(out.text_out), std::move(out.text_lse)};
  call.seconds = now_seconds() - t0;
  call.comm = comms.stats();
  return call;
}

void CallTimes::add(const RankCall& call) {
  const double dt = call.seconds;
  wait_seconds += call.cp.wait_seconds;
  call_seconds += dt;
  exposed.push_back(dt > 0 ? (call.cp.wait_seconds - call.cp.end_sync_seconds) / dt : 0);
  end_sync.push_back(dt > 0 ? call.cp.end_sync_seconds / dt : 0);
}

JobStats gather_job_stats(Communicator& comm, const AttnJob& job, const RankInputs& in,
                          const RankCall& last, const CallTimes& times) {
  const int n = comm.size(), r = comm.rank();
  const CpStats& cps = last.cp;
  const int64_t own_kv = static_cast<int64_t>(in.k.nbytes() + in.v.nbytes());
  const int64_t tensor_bytes =
      static_cast<int64_t>(in.q.nbytes() + last.state.out.nbytes() + last.state.lse.nbytes()) +
      std::max(own_kv, cps.peak_kv_bytes);
  constexpr int kFigures = 9;
  const std::array<int64_t, kFigures> mine = {static_cast<int64_t>(last.comm.total_sent()),
                                              static_cast<int64_t>(last.comm.total_recv()),
                                              cps.peak_kv_bytes,
                                              cps.work,
                                              static_cast<int64_t>(job.q_pos(r).size()),
                                              cps.fallback_rows,
                                              peak_resident_bytes(),
                                              tensor_bytes,
                                              cps.measured_kv_bytes};
  std::vector<int64_t> all(kFigures * n);
  comm.all_gather(mine.data(), sizeof(mine), all.data());
  JobStats st;
  st.wait_fraction =
      comm.all_reduce_max(times.call_seconds > 0 ? times.wait_seconds / times.call_seconds : 0);
  const double fractions[2] = {median(times.exposed), median(times.end_sync)};
  std::vector<double> all_fractions(2 * n);
  comm.all_gather(fractions, sizeof(fractions), all_fractions.data());
  for (int i = 0; i < n; ++i) {
    const int64_t* f = &all[kFigures * i];
    st.sent.push_back(f[0]);
    st.recv.push_back(f[1]);
    st.peak_kv.push_back(f[2]);
    st.work.push_back(f[3]);
    st.tokens.push_back(f[4]);
    st.fallback_rows += f[5];
    st.peak_rss.push_back(f[6]);
    st.tensor_bytes.push_back(f[7]);
    st.measured_kv.push_back(f[8]);
    st.exposed.push_back(all_fractions[2 * i]);
    st.end_sync.push_back(all_fractions[2 * i + 1]);
  }
  return st;
}

ErrorBound job_error_bound(const AttnJob& job, double max_abs_v) {
  return attention_error_bound(job.shape.dtype, job.shape.seq + job.shape.text_tokens,
                               job.shape.head_dim, max_abs_v);
}

Verification verify_call(Communicator& comm, const AttnJob& job, uint64_t seed,
                         const RankCall& call, double row_budget) {
  const AttnShape& s = job.shape;
  const int n = comm.size(), r = comm.rank();
  const int64_t H = s.heads, D = s.head_dim, row = H * D, w = row + H, B = s.batch;
  // Candidates: the real query positions of the job.
  std::vector<int64_t> candidates;
  for (int i = 0; i < n; ++i)
    for (int64_t p : job.q_pos(i))
      if (p < s.seq) candidates.push_back(p);
  std::sort(candidates.begin(), candidates.end());
  const std::vector<int64_t> sample = verify_sample(job, candidates, row_budget);

  // Every rank sends (out row, lse) of the sampled positions it holds, per batch row.
  std::vector<float> packed;
  std::vector<size_t> counts(n, 0);
  std::vector<int64_t> order;  // sampled positions in arrival order (rank by rank)
  for (int i = 0; i < n; ++i) {
    auto pi = job.q_pos(i);
    for (int64_t p : sample) {
      auto it = std::lower_bound(pi.begin(), pi.end(), p);
      if (it == pi.end() || *it != p) continue;
      order.push_back(p);
      counts[i] += static_cast<size_t>(B * w) * sizeof(float);
      if (i != r) continue;
      const int64_t local = it - pi.begin();
      for (int64_t b = 0; b < B; ++b) {
        const float* out = call.state.out.data<float>() + (b * pi.size() + local) * row;
        const float* lse = call.state.lse.data<float>() + (b * pi.size() + local) * H;
        packed.insert(packed.end(), out, out + row);
        packed.insert(packed.end(), lse, lse + H);
      }
    }
  }
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<float> gathered(total / sizeof(float));
  comm.all_gatherv(packed.data(), gathered.data(), counts);

  double errs[4] = {0, 0, 0, 0};  // out, lse, rows checked, max |v|
  if (r == 0) {
    // Reference keys: the real tokens 0..seq-1, then the text tokens (joint attention).
    const int64_t T = s.text_tokens, ns = static_cast<int64_t>(order.size());
    const std::vector<int64_t> key_pos = iota(0, s.seq + T), real = iota(0, s.seq);
    Tensor kf = with_text(seed, s, SyntheticTensor::kK, SyntheticTensor::kTextK, real, s.kv());
    Tensor vf = with_text(seed, s, SyntheticTensor::kV, SyntheticTensor::kTextV, real, s.kv());
    for (int64_t i = 0; i < vf.numel(); ++i)
      errs[3] = std::max(errs[3], std::fabs(static_cast<double>(vf.at(i))));
    AttnParams params;
    params.mask.causal = s.causal;
    params.mask.k_pos = key_pos;
    params.mask.q_pos = order;
    // Packed documents: the same segments (document_of) as the strategies' kernels.
    std::vector<int32_t> q_doc, k_doc;
    if (const std::vector<int64_t> cu = shape_cu_seqlens(job.shape); !cu.empty()) {
      q_doc = document_ids(cu, order);
      k_doc = document_ids(cu, key_pos);
      params.mask.q_segment = q_doc;
      params.mask.k_segment = k_doc;
    }
    Tensor qs = synthetic_rows(seed, SyntheticTensor::kQ, B, order, H, D, s.dtype);
    AttnState ref = reference_attention(qs, kf, vf, params);
    for (int64_t j = 0; j < ns; ++j)
      for (int64_t b = 0; b < B; ++b) {
        const float* got = gathered.data() + (j * B + b) * w;
        accumulate_err(got, ref.out.data<float>() + (b * ns + j) * row, row, errs[0]);
        accumulate_err(got + row, ref.lse.data<float>() + (b * ns + j) * H, H, errs[1]);
      }
    errs[2] = static_cast<double>(ns);
    if (T > 0) {  // the replicated text outputs, checked on rank 0
      SEQPAR_CHECK(call.text.out.numel() == B * T * row && call.text.lse.numel() == B * T * H,
                   "verify_call: the call holds no text outputs (B, ", T, ", H, D)");
      const std::vector<int64_t> tq_pos = iota(s.seq, T);
      Tensor tq = synthetic_rows(seed, SyntheticTensor::kTextQ, B, iota(0, T), H, D, s.dtype);
      params.mask.q_pos = tq_pos;
      AttnState tref = reference_attention(tq, kf, vf, params);
      accumulate_err(call.text.out.data<float>(), tref.out.data<float>(), tref.out.numel(),
                     errs[0]);
      accumulate_err(call.text.lse.data<float>(), tref.lse.data<float>(), tref.lse.numel(),
                     errs[1]);
      errs[2] += static_cast<double>(T);
    }
  }
  comm.broadcast(errs, sizeof(errs), 0);
  Verification v;
  v.max_abs_err = errs[0];
  v.max_lse_err = errs[1];
  v.rows = static_cast<int64_t>(errs[2]);
  v.max_abs_v = errs[3];
  v.bound = job_error_bound(job, v.max_abs_v);
  // A NaN or Inf error (a non-finite output where the reference is finite) always fails.
  v.ok = std::isfinite(v.max_abs_err) && std::isfinite(v.max_lse_err) &&
         v.max_abs_err <= v.bound.out && v.max_lse_err <= v.bound.lse;
  return v;
}

std::string gather_trace(Communicator& comm) {
  const int n = comm.size();
  comm.barrier();
  if (comm.backend() != "mpi") {
    std::string doc;
    if (comm.rank() == 0) {
      trace::stop();
      const std::vector<trace::Event> events = trace::events();
      doc = trace::to_json(trace::to_json_fragments(events, trace::earliest_us(events)), n);
    }
    comm.barrier();
    return doc;
  }
  trace::stop();
  const std::vector<trace::Event> events = trace::events();
  const double origin = -comm.all_reduce_max(-trace::earliest_us(events));
  std::string mine = trace::to_json_fragments(events, origin);
  if (comm.rank() != 0 && !mine.empty()) mine.insert(mine.begin(), ',');
  std::vector<size_t> counts(n);
  const size_t my_count = mine.size();
  comm.all_gather(&my_count, sizeof(size_t), counts.data());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::string all(total, '\0');
  comm.all_gatherv(mine.data(), all.data(), counts);
  if (comm.rank() != 0) return std::string();
  if (!all.empty() && all[0] == ',') all.erase(all.begin());
  return trace::to_json(all, n);
}

}  // namespace seqpar
