// seqpar run: seeded Q/K/V, one distributed attention per repetition, optional verification
// against reference_attention, a table or one JSON object.
//
// Three kinds of job, all checked against the same oracle:
//   sequence: the S tokens sharded by --layout, every strategy (ring, allgather, ulysses, usp),
//             optionally padded (--pad) and with replicated text tokens (--text-tokens);
//   decode:   --cached P --new T: a distributed K/V cache and T new queries (passq, passkv,
//             auto choosing between them).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "trace_file.h"
#include "synthetic.h"
#include "seqpar/attention/attention.h"
#include "seqpar/attention/error_bound.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/parallel/decode.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/strategies.h"
#include "seqpar/plan/hardware.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

// Largest number of query rows whose reference (double, naive) stays cheap: rows·B·S·H·D <= this.
constexpr double kVerifyBudget = 6e8;

enum class Kind { kSequence, kDecode };

// Everything a rank needs, resolved from the options before any rank starts.
struct Job {
  RunOptions opts;
  Kind kind = Kind::kSequence;
  std::string strategy_label;  // as reported: ring, ulysses, passq, ...
  Strategy strategy = Strategy::kRing;
  PassKind pass = PassKind::kPassKv;
  std::optional<PassChoice> choice;  // --strategy auto
  Layout layout = Layout::kContiguous;
  DType dtype = DType::kF32;
  int ranks = 0;
  int threads = 1;
  int ulysses_degree = 1;
  int ring_degree = 1;
  int64_t kv_heads = 0;
  int64_t seq = 0;         // real tokens (sequence job) or cached + new (decode job)
  int64_t padded_seq = 0;  // tokens after --pad (== seq without it)
  Partition part;          // sequence job
  KvPlacement place;       // decode job
  CpOptions cp;

  std::span<const int64_t> q_pos(int r) const {
    return kind == Kind::kSequence ? part.positions(r) : std::span<const int64_t>(place.q_pos[r]);
  }
  std::span<const int64_t> kv_pos(int r) const {
    return kind == Kind::kSequence ? part.positions(r) : std::span<const int64_t>(place.kv_pos[r]);
  }
};

// What rank 0 reports.
struct Report {
  std::vector<double> seconds;  // per repetition, slowest rank
  std::vector<int64_t> sent, recv, peak_kv, work, tokens;
  std::vector<int64_t> measured_kv;  // K/V storage actually allocated (CpStats::measured_kv_bytes)
  int64_t fallback_rows = 0;  // const-max softmax: summed over ranks
  double max_abs_err = NAN;
  double max_lse_err = NAN;
  double max_abs_v = 1;  // largest |v| of the inputs (the out error bound scales with it)
  int64_t verified_rows = 0;
  double wait_fraction = 0;
  // Per rank: median over the timed runs of (time blocked in communication during the steps /
  // call time), and of (time waiting at the end for peers done with this rank's memory / call
  // time; zero-copy ring only). Their sum is the rank's whole communication wait.
  std::vector<double> exposed, end_sync;
  // Per rank: peak resident memory (VmHWM; under threads the one process's, shared by all
  // ranks) and the bytes of this rank's tensors (q, k, v, the result, K/V blocks in flight).
  std::vector<int64_t> peak_rss, tensor_bytes;
  std::string trace_error;  // --trace could not be written (the report still prints)
};

// Peak resident set size of this process (VmHWM in /proc/self/status), bytes; 0 if unknown.
int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

// The strategies `seqpar run` takes: over a sharded sequence, then over a K/V cache.
constexpr const char* kRunStrategies = "ring, allgather, ulysses, usp, passq, passkv, auto";

// Every size against core/limits.h, before anything is sized by it.
void validate(const RunOptions& o) {
  using limits::check_range;
  if (o.ranks) check_range("--ranks", *o.ranks, 1, limits::kMaxRanks);
  check_range("--seq", o.seq, 1, limits::kMaxTokens);
  check_range("--heads", o.heads, 1, limits::kMaxHeads);
  SEQPAR_ARG_CHECK(o.kv_heads >= 0 && o.kv_heads <= limits::kMaxHeads, "--kv-heads ", o.kv_heads,
                   " is invalid; it must divide --heads (0 means equal to --heads)");
  SEQPAR_ARG_CHECK(o.head_dim >= 1 && o.head_dim <= 1024, "--head-dim ", o.head_dim,
                   " is invalid; valid: 1 to 1024");
  check_range("--batch", o.batch, 1, limits::kMaxBatch);
  check_range("--repeat", o.repeat, 1, limits::kMaxSteps);
  check_range("--warmup", o.warmup, 0, limits::kMaxSteps);
  check_range("--threads", o.threads, 0, limits::kMaxThreads);
  check_range("--ulysses-degree", o.ulysses_degree, 0, limits::kMaxRanks);
  check_range("--ring-degree", o.ring_degree, 0, limits::kMaxRanks);
  if (o.timeout_s)
    check_range("--timeout", *o.timeout_s, limits::kMinTimeoutSeconds, limits::kMaxTimeoutSeconds);
  check_range("--text-tokens", o.text_tokens, 0, limits::kMaxTokens);
  check_range("--cached", o.cached, 0, limits::kMaxTokens);
  check_range("--new", o.fresh, 0, limits::kMaxTokens);
  const std::string strategies = std::string(", ") + kRunStrategies + ",";
  SEQPAR_ARG_CHECK(strategies.find(", " + o.strategy + ",") != std::string::npos, "--strategy '",
                   o.strategy, "' is unknown; valid: ", kRunStrategies);
  const int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
  SEQPAR_ARG_CHECK(o.heads % kv == 0, "--heads ", o.heads, " is not divisible by --kv-heads ", kv,
                   "; valid kv-heads: ", divisors_text(o.heads));
  SEQPAR_ARG_CHECK(o.backend == "threads" || o.backend == "mpi", "--backend '", o.backend,
                   "' is unknown; valid: threads, mpi");
  (void)load_profile_checked(o.hardware);  // a bad name is refused even when not used
}

// Bytes the job holds at its peak over all ranks (inputs, outputs, K/V in flight, positions,
// the reference of --verify), with overflow-checked sizes; refused if the machine lacks them.
// Under MPI every process holds its share, but the ranks usually share the machine as well.
void check_job_memory(const RunOptions& o, int64_t ranks, bool allgather_like) {
  using limits::checked_add;
  using limits::checked_product;
  const int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
  const bool decode = o.cached > 0 || o.fresh > 0;
  const int64_t tokens = decode
                             ? checked_add(o.cached, o.fresh, "--cached + --new tokens")
                             : checked_add(o.seq, o.pad ? 2 * ranks : 0, "--seq (padded) tokens");
  const int64_t all = checked_add(tokens, o.text_tokens, "tokens with --text-tokens");
  const int64_t e = o.dtype == "fp32" ? 4 : 2;
  const int64_t kv_bytes = checked_product({o.batch, all, 2 * kv, o.head_dim, e}, "K/V bytes");
  const int64_t q_bytes = checked_product({o.batch, all, o.heads, o.head_dim, e}, "Q bytes");
  const int64_t out_bytes =
      checked_product({o.batch, all, o.heads, o.head_dim + 1, 4}, "output bytes");
  const double held = static_cast<double>(kv_bytes) * (allgather_like ? ranks + 1 : 3) +
                      static_cast<double>(q_bytes) + static_cast<double>(out_bytes) +
                      (o.verify ? 2.0 * kv_bytes * 4 / e : 0) + 24.0 * all;
  limits::check_fits_memory(detail::concat("seqpar run (", all, " tokens x ", o.heads, " heads x ",
                                           o.head_dim, " dims on ", ranks, " ranks)"),
                            held);
  (void)checked_product({o.batch, o.heads, all, all}, "attention score elements (B·H·S·S)",
                        limits::kMaxScoreElements);
}

// Fills the Ulysses and ring degrees of a sequence job (InvalidArgument if they do not fit).
void resolve_degrees(Job& job) {
  const RunOptions& o = job.opts;
  const int n = job.ranks;
  int u = static_cast<int>(o.ulysses_degree), r = static_cast<int>(o.ring_degree);
  SEQPAR_ARG_CHECK(u >= 0 && r >= 0, "--ulysses-degree and --ring-degree must be positive");
  switch (job.strategy) {
    case Strategy::kUsp:
      if (u == 0 && r == 0) {
        u = 1;  // default: the largest divisor of the ranks that divides the heads
        for (int64_t d : limits::divisors(n))
          if (o.heads % d == 0) u = static_cast<int>(d);
      }
      if (u == 0) u = r > 0 && n % r == 0 ? n / r : 0;
      if (r == 0) r = u > 0 && n % u == 0 ? n / u : 0;
      SEQPAR_ARG_CHECK(u > 0 && r > 0 && u * r == n, "--ulysses-degree ", o.ulysses_degree,
                       " x --ring-degree ", o.ring_degree, " must equal the ", n,
                       " ranks; valid ulysses degrees: ", divisors_text(n));
      break;
    case Strategy::kUlysses:
      SEQPAR_ARG_CHECK((u == 0 || u == n) && (r == 0 || r == 1), "--strategy ulysses uses all ", n,
                       " ranks as one Ulysses group; for --ulysses-degree ", u, " --ring-degree ",
                       r, " use --strategy usp");
      u = n;
      r = 1;
      break;
    default:
      SEQPAR_ARG_CHECK((u == 0 || u == 1) && (r == 0 || r == n), "--strategy ",
                       strategy_name(job.strategy), " does not take --ulysses-degree or ",
                       "--ring-degree; use --strategy usp to combine them");
      u = 1;
      r = n;
  }
  job.ulysses_degree = u;
  job.ring_degree = r;
}

// Builds the job for `ranks` ranks; every argument error surfaces here, before ranks start.
Job make_job(const RunOptions& o, int ranks, int threads) {
  validate(o);
  Job job;
  job.opts = o;
  job.ranks = ranks;
  job.threads = threads;
  job.layout = parse_layout(o.layout);
  job.dtype = parse_dtype(o.dtype);
  job.kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  job.cp.causal = o.causal;
  job.cp.ulysses_mode = parse_ulysses_mode(o.ulysses_mode);
  job.cp.softmax = parse_softmax_mode(o.softmax);
  SEQPAR_ARG_CHECK(ranks >= 1, "--ranks ", ranks, " is invalid; it must be at least 1");
  check_job_memory(o, ranks, o.strategy == "allgather" || o.strategy == "ulysses");

  const bool decode = o.cached > 0 || o.fresh > 0 || o.strategy == "passq" || o.strategy == "auto";
  if (decode) {
    job.kind = Kind::kDecode;
    SEQPAR_ARG_CHECK(o.cached > 0 && o.fresh > 0, "--strategy ", o.strategy,
                     " runs over a K/V cache: give --cached P (tokens cached) and --new T "
                     "(new tokens), both at least 1");
    SEQPAR_ARG_CHECK(o.strategy == "passq" || o.strategy == "passkv" || o.strategy == "ring" ||
                         o.strategy == "auto",
                     "--strategy ", o.strategy, " does not run over a K/V cache (--cached/--new);",
                     " valid: passq, passkv, auto");
    SEQPAR_ARG_CHECK(!o.pad && o.text_tokens == 0 && o.ulysses_degree == 0 && o.ring_degree == 0,
                     "--cached/--new take none of --pad, --text-tokens, --ulysses-degree, "
                     "--ring-degree");
    SEQPAR_ARG_CHECK(job.cp.softmax == SoftmaxMode::kOnline, "--softmax const-max needs a ring: ",
                     "valid with --strategy ring or usp (its ring part), not ", o.strategy,
                     " over a K/V cache");
    job.place = decode_placement(o.cached, o.fresh, ranks, job.layout);
    job.seq = job.padded_seq = o.cached + o.fresh;
    if (o.strategy == "auto") {
      const HardwareProfile hw = load_profile_checked(o.hardware);
      job.choice = choose_pass(o.fresh, o.cached, ranks, o.heads, job.kv_heads,
                               dtype_size(job.dtype), hw.attention_flops, hw.inter_node_bw);
      job.pass = job.choice->kind;
    } else {
      job.pass = o.strategy == "passq" ? PassKind::kPassQ : PassKind::kPassKv;
    }
    job.strategy_label = std::string(pass_name(job.pass));
    return job;
  }

  job.strategy = parse_strategy(o.strategy);
  job.strategy_label = std::string(strategy_name(job.strategy));
  job.seq = o.seq;
  job.padded_seq = o.seq;
  if (o.pad) {
    // auto_pad: a multiple of the ranks (of 2·ranks for zigzag, so its chunks are equal).
    const int64_t m = job.layout == Layout::kZigzag ? 2 * int64_t{ranks} : ranks;
    job.padded_seq = (o.seq + m - 1) / m * m;
    if (job.padded_seq != o.seq) job.cp.valid_len = o.seq;
  }
  SEQPAR_ARG_CHECK(ranks <= job.padded_seq, "--ranks ", ranks, " exceeds --seq ", o.seq,
                   "; every rank needs a token: use at most ", job.padded_seq, " ranks");
  job.part = Partition(job.padded_seq, ranks, job.layout);
  resolve_degrees(job);
  check_strategy_shape(job.strategy, job.part, o.heads, job.kv_heads, job.ulysses_degree, job.cp);
  SEQPAR_ARG_CHECK(o.text_tokens == 0 || !o.causal,
                   "--text-tokens (joint attention) is bidirectional; drop --causal");
  return job;
}

// Rows of `which` at positions, with padded positions (>= real) zeroed as auto_pad does.
Tensor rows(const Job& job, Which which, std::span<const int64_t> pos, int64_t heads) {
  const RunOptions& o = job.opts;
  Tensor t = synthetic_rows(o.seed, which, o.batch, pos, heads, o.head_dim, job.dtype);
  if (job.padded_seq != job.seq) {  // zero bits are 0 in every dtype
    const size_t row_bytes = heads * o.head_dim * dtype_size(job.dtype);
    char* data = static_cast<char*>(t.raw());
    for (int64_t b = 0; b < o.batch; ++b)
      for (size_t i = 0; i < pos.size(); ++i)
        if (pos[i] >= job.seq) std::memset(data + (b * pos.size() + i) * row_bytes, 0, row_bytes);
  }
  return t;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Query positions checked by --verify among `candidates` (sorted): all if cheap, else an even
// spread with both ends.
std::vector<int64_t> verify_sample(const Job& job, const std::vector<int64_t>& candidates) {
  const RunOptions& o = job.opts;
  const double per_row =
      static_cast<double>(o.batch) * (job.seq + o.text_tokens) * o.heads * o.head_dim;
  const int64_t n = static_cast<int64_t>(candidates.size());
  int64_t want = std::clamp<int64_t>(static_cast<int64_t>(kVerifyBudget / per_row),
                                     std::min<int64_t>(16, n), n);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < want; ++i)
    out.push_back(candidates[want == 1 ? 0 : i * (n - 1) / (want - 1)]);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// JSON has no NaN or Inf (nlohmann writes null, which reads as "not verified"): a non-finite
// error is written as the string "nan", "inf" or "-inf".
json error_json(double err) {
  if (std::isfinite(err)) return json(err);
  return json(std::isnan(err) ? "nan" : err > 0 ? "inf" : "-inf");
}

// Max |got - want| over out rows (B, n, H, D) and lse rows (B, n, H); NaN counts as infinite.
void accumulate_err(const float* got, const float* want, int64_t count, double& err) {
  for (int64_t x = 0; x < count; ++x) {
    const float a = got[x], b = want[x];
    if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) continue;
    const double d = std::fabs(static_cast<double>(a) - b);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
  }
}

// Compares the sampled rows with reference_attention on rank 0; every rank gets the errors.
void verify(Communicator& comm, const Job& job, const AttnState& state, const AttnState* text,
            Report* report) {
  const RunOptions& o = job.opts;
  const int n = comm.size(), r = comm.rank();
  const int64_t H = o.heads, D = o.head_dim, row = H * D, w = row + H;
  // Candidates: the real query positions of the job.
  std::vector<int64_t> candidates;
  for (int i = 0; i < n; ++i)
    for (int64_t p : job.q_pos(i))
      if (p < job.seq) candidates.push_back(p);
  std::sort(candidates.begin(), candidates.end());
  const std::vector<int64_t> sample = verify_sample(job, candidates);

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
      counts[i] += static_cast<size_t>(o.batch * w) * sizeof(float);
      if (i != r) continue;
      const int64_t local = it - pi.begin();
      for (int64_t b = 0; b < o.batch; ++b) {
        const float* out = state.out.data<float>() + (b * pi.size() + local) * row;
        const float* lse = state.lse.data<float>() + (b * pi.size() + local) * H;
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
    const int64_t T = o.text_tokens, ns = static_cast<int64_t>(order.size());
    const std::vector<int64_t> key_pos = iota(job.seq + T);
    const std::vector<int64_t> real = iota(job.seq), text_idx = iota(T);
    auto cat = [&](Which img, Which txt, std::span<const int64_t> img_pos, int64_t heads) {
      Tensor a = synthetic_rows(o.seed, img, o.batch, img_pos, heads, D, job.dtype);
      if (T == 0) return a;
      Tensor b = synthetic_rows(o.seed, txt, o.batch, text_idx, heads, D, job.dtype);
      Tensor c({o.batch, a.dim(1) + T, heads, D}, job.dtype);
      const size_t ra = a.dim(1) * heads * D * dtype_size(job.dtype);
      const size_t rb = T * heads * D * dtype_size(job.dtype);
      for (int64_t bb = 0; bb < o.batch; ++bb) {
        std::memcpy(static_cast<char*>(c.raw()) + bb * (ra + rb),
                    static_cast<const char*>(a.raw()) + bb * ra, ra);
        std::memcpy(static_cast<char*>(c.raw()) + bb * (ra + rb) + ra,
                    static_cast<const char*>(b.raw()) + bb * rb, rb);
      }
      return c;
    };
    Tensor kf = cat(Which::kK, Which::kTextK, real, job.kv_heads);
    Tensor vf = cat(Which::kV, Which::kTextV, real, job.kv_heads);
    for (int64_t i = 0; i < vf.numel(); ++i)
      errs[3] = std::max(errs[3], std::fabs(static_cast<double>(vf.at(i))));
    AttnParams params;
    params.mask.causal = o.causal;
    params.mask.k_pos = key_pos;
    params.mask.q_pos = order;
    Tensor qs = synthetic_rows(o.seed, Which::kQ, o.batch, order, H, D, job.dtype);
    AttnState ref = reference_attention(qs, kf, vf, params);
    for (int64_t j = 0; j < ns; ++j)
      for (int64_t b = 0; b < o.batch; ++b) {
        const float* got = gathered.data() + (j * o.batch + b) * w;
        accumulate_err(got, ref.out.data<float>() + (b * ns + j) * row, row, errs[0]);
        accumulate_err(got + row, ref.lse.data<float>() + (b * ns + j) * H, H, errs[1]);
      }
    errs[2] = static_cast<double>(ns);
    if (text != nullptr && T > 0) {  // the replicated text outputs, checked on rank 0
      std::vector<int64_t> tq_pos(T);
      for (int64_t t = 0; t < T; ++t) tq_pos[t] = job.seq + t;
      Tensor tq = synthetic_rows(o.seed, Which::kTextQ, o.batch, text_idx, H, D, job.dtype);
      params.mask.q_pos = tq_pos;
      AttnState tref = reference_attention(tq, kf, vf, params);
      accumulate_err(text->out.data<float>(), tref.out.data<float>(), tref.out.numel(), errs[0]);
      accumulate_err(text->lse.data<float>(), tref.lse.data<float>(), tref.lse.numel(), errs[1]);
      errs[2] += static_cast<double>(T);
    }
  }
  comm.broadcast(errs, sizeof(errs), 0);
  if (report) {
    report->max_abs_err = errs[0];
    report->max_lse_err = errs[1];
    report->verified_rows = static_cast<int64_t>(errs[2]);
    report->max_abs_v = errs[3];
  }
}

// One rank's part of `seqpar run`. Rank 0 fills *report.
void run_rank(Communicator& comm, const Job& job, Report* report, OutputFile* trace_out) {
  const RunOptions& o = job.opts;
  const int r = comm.rank(), n = comm.size();
  omp_set_num_threads(job.threads);
  trace::set_rank(comm.rank());
  Tensor q = rows(job, Which::kQ, job.q_pos(r), o.heads);
  Tensor k = rows(job, Which::kK, job.kv_pos(r), job.kv_heads);
  Tensor v = rows(job, Which::kV, job.kv_pos(r), job.kv_heads);
  Tensor tq, tk, tv;
  if (o.text_tokens > 0) {
    const std::vector<int64_t> t = iota(o.text_tokens);
    tq = synthetic_rows(o.seed, Which::kTextQ, o.batch, t, o.heads, o.head_dim, job.dtype);
    tk = synthetic_rows(o.seed, Which::kTextK, o.batch, t, job.kv_heads, o.head_dim, job.dtype);
    tv = synthetic_rows(o.seed, Which::kTextV, o.batch, t, job.kv_heads, o.head_dim, job.dtype);
  }
  std::optional<SpComms> comms;
  if (job.kind == Kind::kSequence) comms.emplace(comm, job.ulysses_degree);

  AttnState state, text;
  CpStats cps;
  CommStats call_stats;
  std::vector<double> seconds, exposed, end_sync;
  double wait_sum = 0, time_sum = 0;
  for (int rep = 0; rep < o.warmup + o.repeat; ++rep) {  // the first --warmup are not timed
    trace::Scope rep_span(trace::enabled()
                              ? detail::concat(rep < o.warmup ? "warm-up " : "run ",
                                               rep < o.warmup ? rep + 1 : rep - o.warmup + 1)
                              : std::string(),
                          "run", trace::Lane::kCompute);
    comm.barrier();
    if (comms)
      comms->reset_stats();
    else
      comm.stats().reset();
    double t0 = now_seconds();
    if (job.kind == Kind::kDecode) {
      state = job.pass == PassKind::kPassQ
                  ? passq_attention(comm, job.place, q, k, v, job.cp, &cps)
                  : passkv_attention(comm, job.place, q, k, v, job.cp, &cps);
    } else if (o.text_tokens > 0) {
      JointState js =
          joint_attention(job.strategy, *comms, job.part, q, k, v, tq, tk, tv, job.cp, &cps);
      state = std::move(js.image);
      text = std::move(js.text);
    } else {
      state = context_parallel_attention(job.strategy, *comms, job.part, q, k, v, job.cp, &cps);
    }
    double dt = now_seconds() - t0;
    call_stats = comms ? comms->stats() : comm.stats();
    if (rep >= o.warmup) {
      seconds.push_back(comm.all_reduce_max(dt));
      wait_sum += cps.wait_seconds;
      time_sum += dt;
      exposed.push_back(dt > 0 ? (cps.wait_seconds - cps.end_sync_seconds) / dt : 0);
      end_sync.push_back(dt > 0 ? cps.end_sync_seconds / dt : 0);
    }
  }

  // Per-rank figures of the last call, gathered everywhere (rank 0 reports them).
  // Tensors of this rank at their peak: inputs, the result, and K/V held beyond its own shard.
  const int64_t own_kv = static_cast<int64_t>(k.nbytes() + v.nbytes());
  const int64_t tensor_bytes =
      static_cast<int64_t>(q.nbytes() + state.out.nbytes() + state.lse.nbytes()) +
      std::max(own_kv, cps.peak_kv_bytes);
  constexpr int kFigures = 9;
  std::array<int64_t, kFigures> mine = {static_cast<int64_t>(call_stats.total_sent()),
                                        static_cast<int64_t>(call_stats.total_recv()),
                                        cps.peak_kv_bytes,
                                        cps.work,
                                        static_cast<int64_t>(job.q_pos(r).size()),
                                        cps.fallback_rows,
                                        peak_rss_bytes(),
                                        tensor_bytes,
                                        cps.measured_kv_bytes};
  std::vector<int64_t> all(kFigures * n);
  comm.all_gather(mine.data(), sizeof(mine), all.data());
  const double wait_fraction = comm.all_reduce_max(time_sum > 0 ? wait_sum / time_sum : 0);
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double mine_frac[2] = {median_of(exposed), median_of(end_sync)};
  std::vector<double> all_frac(2 * n);
  comm.all_gather(mine_frac, sizeof(mine_frac), all_frac.data());
  if (!o.trace.empty()) write_trace(comm, trace_out, report ? &report->trace_error : nullptr);  // the runs, not the verification
  if (o.verify) verify(comm, job, state, o.text_tokens > 0 ? &text : nullptr, report);
  if (r == 0 && report) {
    report->seconds = seconds;
    for (int i = 0; i < n; ++i) {
      report->sent.push_back(all[kFigures * i + 0]);
      report->recv.push_back(all[kFigures * i + 1]);
      report->peak_kv.push_back(all[kFigures * i + 2]);
      report->work.push_back(all[kFigures * i + 3]);
      report->tokens.push_back(all[kFigures * i + 4]);
      report->fallback_rows += all[kFigures * i + 5];
      report->peak_rss.push_back(all[kFigures * i + 6]);
      report->tensor_bytes.push_back(all[kFigures * i + 7]);
      report->measured_kv.push_back(all[kFigures * i + 8]);
    }
    report->wait_fraction = wait_fraction;
    for (int i = 0; i < n; ++i) {
      report->exposed.push_back(all_frac[2 * i]);
      report->end_sync.push_back(all_frac[2 * i + 1]);
    }
  }
}

// The kernel path's error bound (seqpar/attention/error_bound.h) for this job: every query sees
// at most the real tokens plus the text tokens.
ErrorBound tolerance(const Job& job, const Report& rep) {
  return attention_error_bound(job.dtype, job.seq + job.opts.text_tokens, job.opts.head_dim,
                               rep.max_abs_v);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int print_report(const Job& job, const Report& rep, const std::string& backend) {
  const RunOptions& o = job.opts;
  const double secs = median(rep.seconds);
  int64_t total_work = 0, max_work = 0;
  for (int64_t w : rep.work) {
    total_work += w;
    max_work = std::max(max_work, w);
  }
  const double mean_work = static_cast<double>(total_work) / job.ranks;
  const double imbalance = mean_work > 0 ? max_work / mean_work : 1.0;
  const double gflops = secs > 0 ? 4.0 * o.head_dim * total_work / secs / 1e9 : 0;
  const ErrorBound tol = tolerance(job, rep);
  // A NaN or Inf error (a non-finite output where the reference is finite) always fails.
  const bool ok = !o.verify || (std::isfinite(rep.max_abs_err) && std::isfinite(rep.max_lse_err) &&
                                rep.max_abs_err <= tol.out && rep.max_lse_err <= tol.lse);

  if (o.json) {
    json j;
    j["strategy"] = job.strategy_label;
    j["layout"] = layout_name(job.layout);
    j["backend"] = backend;
    j["ranks"] = job.ranks;
    j["seq"] = job.seq;
    j["heads"] = o.heads;
    j["kv_heads"] = job.kv_heads;
    j["head_dim"] = o.head_dim;
    j["batch"] = o.batch;
    j["dtype"] = dtype_name(job.dtype);
    j["causal"] = o.causal;
    j["threads"] = job.threads;
    j["repeat"] = o.repeat;
    // The deadline of every communication wait (--timeout, else SEQPAR_TIMEOUT_S or 60 s).
    j["timeout_s"] = o.timeout_s ? *o.timeout_s : Communicator::default_timeout().count() / 1e3;
    j["seconds"] = secs;
    j["seconds_all"] = rep.seconds;
    j["gflops"] = gflops;
    j["max_abs_err"] = o.verify ? error_json(rep.max_abs_err) : json(nullptr);
    j["max_lse_err"] = o.verify ? error_json(rep.max_lse_err) : json(nullptr);
    j["tolerance"] = tol.out;
    j["lse_tolerance"] = tol.lse;
    j["kernel_path"] = kernel_path_name(kernel_path(job.dtype));
    j["verified_rows"] = rep.verified_rows;
    j["ok"] = ok;
    j["tokens_per_rank"] = rep.tokens;
    j["bytes_sent_per_rank"] = rep.sent;
    j["bytes_recv_per_rank"] = rep.recv;
    j["peak_kv_bytes_per_rank"] = rep.peak_kv;
    j["measured_kv_bytes_per_rank"] = rep.measured_kv;
    j["work_per_rank"] = rep.work;
    j["work_imbalance"] = imbalance;
    j["comm_wait_fraction"] = rep.wait_fraction;
    j["exposed_comm_fraction"] =
        rep.exposed.empty() ? 0.0 : *std::max_element(rep.exposed.begin(), rep.exposed.end());
    j["exposed_comm_fraction_per_rank"] = rep.exposed;
    j["end_sync_fraction"] =
        rep.end_sync.empty() ? 0.0 : *std::max_element(rep.end_sync.begin(), rep.end_sync.end());
    j["end_sync_fraction_per_rank"] = rep.end_sync;
    j["peak_rss_bytes_per_rank"] = rep.peak_rss;
    j["rss_shared_by_ranks"] = backend != "mpi";
    j["tensor_bytes_per_rank"] = rep.tensor_bytes;
    j["warmup"] = o.warmup;
    if (!o.trace.empty()) j["trace"] = o.trace;
    j["softmax"] = softmax_mode_name(job.cp.softmax);
    j["fallback_rows"] = rep.fallback_rows;
    if (job.kind == Kind::kSequence) {
      j["ulysses_degree"] = job.ulysses_degree;
      j["ring_degree"] = job.ring_degree;
      j["ulysses_mode"] = ulysses_mode_name(job.cp.ulysses_mode);
      j["padded_seq"] = job.padded_seq;
      j["text_tokens"] = o.text_tokens;
    } else {
      j["cached"] = o.cached;
      j["new"] = o.fresh;
      if (job.choice) {
        j["choice"] = pass_name(job.choice->kind);
        j["threshold_tokens"] = job.choice->threshold_tokens;
        j["choice_reason"] = job.choice->reason;
        j["hardware"] = o.hardware;
      }
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar run: %s attention, %s layout, %s backend, %d ranks x %d threads\n",
                job.strategy_label.c_str(), std::string(layout_name(job.layout)).c_str(),
                backend.c_str(), job.ranks, job.threads);
    if (job.kind == Kind::kDecode) {
      std::printf("  K/V cache of %lld tokens + %lld new tokens\n", (long long)o.cached,
                  (long long)o.fresh);
      if (job.choice)
        std::printf("  auto (%s profile): %s\n", o.hardware.c_str(), job.choice->reason.c_str());
    } else {
      if (job.strategy == Strategy::kUsp || job.strategy == Strategy::kUlysses)
        std::printf("  ulysses degree %d x ring degree %d, ulysses mode %s\n", job.ulysses_degree,
                    job.ring_degree, std::string(ulysses_mode_name(job.cp.ulysses_mode)).c_str());
      if (job.padded_seq != job.seq)
        std::printf("  padded to %lld tokens (%lld padding, masked)\n", (long long)job.padded_seq,
                    (long long)(job.padded_seq - job.seq));
      if (o.text_tokens > 0)
        std::printf("  joint attention with %lld replicated text tokens\n",
                    (long long)o.text_tokens);
      if (job.cp.softmax == SoftmaxMode::kConstMax)
        std::printf("  softmax const-max: %lld query rows fell back to online softmax\n",
                    (long long)rep.fallback_rows);
    }
    std::printf("  seq %lld  batch %lld  heads %lld  kv_heads %lld  head_dim %lld  %s  %s\n",
                (long long)job.seq, (long long)o.batch, (long long)o.heads, (long long)job.kv_heads,
                (long long)o.head_dim, std::string(dtype_name(job.dtype)).c_str(),
                o.causal ? "causal" : "non-causal");
    std::printf("  time     %.6f s (median of %lld, slowest rank)\n", secs, (long long)o.repeat);
    std::printf("  rate     %.2f GFLOP/s (4*D flops per visible score)\n", gflops);
    std::printf("  work imbalance %.3f (max/mean over ranks), comm wait %.1f%% of call time\n",
                imbalance, 100 * rep.wait_fraction);
    const double exposed =
        rep.exposed.empty() ? 0.0 : *std::max_element(rep.exposed.begin(), rep.exposed.end());
    const double end_sync =
        rep.end_sync.empty() ? 0.0 : *std::max_element(rep.end_sync.begin(), rep.end_sync.end());
    std::printf("  exposed communication %.1f%% of step time (worst rank, median run)",
                100 * exposed);
    if (end_sync > 0)
      std::printf("; end-of-call sync %.1f%% (zero copy: waiting for peers to finish reading)",
                  100 * end_sync);
    std::printf("\n");
    if (!o.trace.empty()) std::printf("  trace    %s\n", o.trace.c_str());
    std::printf("\n  %-5s %10s %15s %15s %16s %14s %12s\n", "rank", "queries", "bytes sent",
                "bytes recv", "peak K/V bytes", "tensor bytes", "peak RSS MB");
    for (int i = 0; i < job.ranks; ++i)
      std::printf("  %-5d %10lld %15lld %15lld %16lld %14lld %12.1f\n", i, (long long)rep.tokens[i],
                  (long long)rep.sent[i], (long long)rep.recv[i], (long long)rep.peak_kv[i],
                  (long long)rep.tensor_bytes[i], rep.peak_rss[i] / 1048576.0);
    if (backend != "mpi")
      std::printf("  (threads backend: the ranks share one process; peak RSS is the process's)\n");
    if (o.verify)
      std::printf(
          "\n  verify   max abs err %.3g (lse %.3g) over %lld query rows, tolerance %.2g (lse "
          "%.2g, %s path): %s\n",
          rep.max_abs_err, rep.max_lse_err, (long long)rep.verified_rows, tol.out, tol.lse,
          std::string(kernel_path_name(kernel_path(job.dtype))).c_str(), ok ? "ok" : "FAILED");
  }
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace

void add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand(
      "run", "Run one distributed attention on seeded inputs, optionally verify it, report it");
  run->add_option("--strategy", o.strategy,
                  "ring | allgather | ulysses | usp; over a K/V cache: passq | passkv | auto");
  run->add_option("--layout", o.layout, "contiguous | striped | zigzag");
  run->add_option("--ulysses-degree,--ulysses_degree", o.ulysses_degree,
                  "usp: ranks per Ulysses group (default: ranks / ring degree)");
  run->add_option("--ring-degree,--ring_degree", o.ring_degree,
                  "usp: number of ring groups (default: ranks / ulysses degree)");
  run->add_option("--ulysses-mode,--ulysses_mode", o.ulysses_mode,
                  "strict (divisible shapes) | uaa (any length and head count)");
  run->add_option_function<int64_t>(
         "--ranks", [&o](int64_t v) { o.ranks = v; },
         "ranks (default 2 on threads; the MPI world size; at most 2^16)")
      ->default_str("2");
  run->add_option("--seq", o.seq, "sequence length S (tokens)");
  run->add_option("--heads", o.heads, "query heads H");
  run->add_option("--kv-heads,--kv_heads", o.kv_heads, "key/value heads (divides H; default H)");
  run->add_option("--head-dim,--head_dim", o.head_dim, "head dimension D");
  run->add_option("--batch", o.batch, "batch size B");
  run->add_flag("--causal", o.causal, "causal mask");
  run->add_flag("--pad", o.pad, "pad S to a multiple of the ranks and mask the padding");
  run->add_option("--text-tokens,--text_tokens", o.text_tokens,
                  "joint attention: T text tokens replicated on every rank");
  run->add_option("--cached", o.cached, "tokens in the distributed K/V cache (decode)");
  run->add_option("--new", o.fresh, "new tokens attending the cache (decode)");
  run->add_option("--hardware", o.hardware,
                  "profile for --strategy auto: h100 | h200 | "
                  "cpu-ethernet | local");
  run->add_option("--softmax", o.softmax,
                  "online | const-max (ring, usp: fixed per-row max from key norms, partial "
                  "sums added without rescaling; loose rows fall back to online)");
  run->add_option("--dtype", o.dtype, "fp32 | bf16 | fp16");
  run->add_option("--backend", o.backend, "threads | mpi (launch with mpirun)");
  run->add_flag("--verify", o.verify, "compare with the single-rank reference");
  run->add_flag("--json", o.json, "print one JSON object");
  run->add_option("--seed", o.seed, "seed of the synthetic inputs");
  run->add_option("--threads", o.threads, "threads per rank (default cores/ranks; 1 under MPI)");
  run->add_option("--repeat", o.repeat, "timed repetitions after the warm-up");
  run->add_option("--warmup", o.warmup, "untimed runs before the timed ones (default 1)");
  run->add_option("--trace", o.trace,
                  "write a Chrome/Perfetto trace (JSON) of the runs to this file: pid = rank, "
                  "lanes compute and comm, ring steps, kernel calls, collectives, waits");
  run->add_option_function<double>(
      "--timeout", [&o](double v) { o.timeout_s = v; },
      "communication deadline in seconds, 0.001 to 604800 (default SEQPAR_TIMEOUT_S or 60)");
  guard_integer_options(run);
}

namespace {

// Threads of one process: ranks x threads per rank, within what the machine lets it start.
void check_threads(int64_t ranks, int64_t threads) {
  const int64_t max = limits::max_threads();
  SEQPAR_ARG_CHECK(
      ranks * threads <= max, "--ranks ", ranks, " x --threads ", threads, " = ", ranks * threads,
      " threads in one process exceeds the maximum ", max,
      " (core/limits.h and RLIMIT_NPROC); use fewer ranks or threads, or --backend mpi");
}

int run_threads(const RunOptions& opts, std::chrono::milliseconds timeout) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int ranks = static_cast<int>(opts.ranks.value_or(2));
  const int threads =
      opts.threads > 0 ? static_cast<int>(opts.threads) : std::max(1, cores / std::max(1, ranks));
  check_threads(ranks, threads);
  const Job job = make_job(opts, ranks, threads);  // argument errors before any thread starts
  std::optional<OutputFile> trace_out;
  if (!opts.trace.empty()) trace_out.emplace("--trace", opts.trace);
  Report report;
  if (!opts.trace.empty()) trace::start();
  ThreadWorld::run(
      ranks,
      [&](Communicator& comm) {
        const bool first = comm.rank() == 0;
        run_rank(comm, job, first ? &report : nullptr, first && trace_out ? &*trace_out : nullptr);
      },
      timeout);
  int code = print_report(job, report, "threads");
  if (!report.trace_error.empty()) {  // the report stands; the exit code says the trace is lost
    std::fprintf(stderr, "seqpar: error: %s\n", report.trace_error.c_str());
    code = 1;
  }
  return code;
}

int run_mpi(const RunOptions& opts, std::chrono::milliseconds timeout) {
  // mpi: every process runs this; rank 0 prints.
  SEQPAR_ARG_CHECK(mpi_available(), "--backend mpi: this build has no MPI; valid: threads");
  mpi_init(nullptr, nullptr);
  std::unique_ptr<Communicator> comm = mpi_world();
  comm->set_timeout(timeout);
  Job job;
  std::optional<OutputFile> trace_out;
  try {  // every rank sees the same arguments, so every rank stops here alike
    SEQPAR_ARG_CHECK(!opts.ranks || *opts.ranks == comm->size(), "--ranks ", opts.ranks.value_or(0),
                     " does not match the MPI world size ", comm->size(),
                     "; omit --ranks or launch mpirun -np ", opts.ranks.value_or(0));
    job = make_job(opts, comm->size(), opts.threads > 0 ? static_cast<int>(opts.threads) : 1);
  } catch (const InvalidArgument&) {
    comm.reset();
    mpi_finalize();
    throw;
  }
  // Rank 0 opens the trace file before the work; every rank learns whether it could.
  std::string open_error;
  if (!opts.trace.empty() && comm->rank() == 0) {
    try {
      trace_out.emplace("--trace", opts.trace);
    } catch (const Error& e) {
      open_error = e.what();
    }
  }
  int32_t open_failed = open_error.empty() ? 0 : 1;
  comm->broadcast(&open_failed, sizeof(open_failed), 0);
  if (open_failed) {
    const bool first = comm->rank() == 0;
    comm.reset();
    mpi_finalize();
    if (first) throw Error(open_error);
    return 1;
  }
  Report report;
  if (!opts.trace.empty()) trace::start();
  try {
    run_rank(*comm, job, &report, trace_out ? &*trace_out : nullptr);
  } catch (const std::exception& e) {
    comm->abort(e.what());
    if (opts.json && comm->rank() == 0) print_json_error(e.what(), 1);
    std::fprintf(stderr, "seqpar: error: rank %d: %s\n", comm->rank(), e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  int32_t code = 0;
  if (comm->rank() == 0) {
    code = print_report(job, report, "mpi");
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      std::fprintf(stderr, "seqpar: error: cannot write the output to stdout: %s\n",
                   std::strerror(errno));
      code = 1;
    }
    if (!report.trace_error.empty()) {
      std::fprintf(stderr, "seqpar: error: %s\n", report.trace_error.c_str());
      code = 1;
    }
  }
  comm->broadcast(&code, sizeof(code), 0);
  comm.reset();
  mpi_finalize();
  return code;
}

}  // namespace

int run_command(const RunOptions& opts) {
  return with_json_errors(opts.json, [&] {
    // An out-of-range --timeout is refused by validate(); until then the default stands in.
    const bool timeout_ok = opts.timeout_s && std::isfinite(*opts.timeout_s) &&
                            *opts.timeout_s >= limits::kMinTimeoutSeconds &&
                            *opts.timeout_s <= limits::kMaxTimeoutSeconds;
    const std::chrono::milliseconds timeout =
        timeout_ok ? std::chrono::milliseconds(std::llround(*opts.timeout_s * 1000))
                   : Communicator::default_timeout();
    if (opts.backend != "mpi") {
      validate(opts);  // before the thread count is sized by --ranks
      return finish_output(run_threads(opts, timeout));
    }
    return run_mpi(opts, timeout);
  });
}

}  // namespace seqpar::cli
