// seqpar run: seeded Q/K/V, one distributed attention per repetition, optional verification
// against reference_attention, a table or one JSON object.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/synthetic.h"
#include "seqpar/attention/attention.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/timer.h"
#include "seqpar/parallel/partition.h"
#include "seqpar/parallel/strategies.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

// Largest number of query rows whose reference (double, naive) stays cheap: rows·B·S·H·D <= this.
constexpr double kVerifyBudget = 6e8;

struct Config {
  RunOptions opts;
  Strategy strategy;
  Layout layout;
  DType dtype;
  int ranks;
  int threads;
  int ulysses_degree;  // usp: the Ulysses group size; ulysses: ranks; else 1
  int ring_degree;     // usp: the number of groups; ring, allgather: ranks
};

std::string divisors(int64_t x);

// Fills the degrees and checks the strategy can run this shape (InvalidArgument otherwise).
void resolve_degrees(Config& cfg) {
  const RunOptions& o = cfg.opts;
  const int n = cfg.ranks;
  int u = o.ulysses_degree, r = o.ring_degree;
  SEQPAR_ARG_CHECK(u >= 0 && r >= 0, "--ulysses-degree and --ring-degree must be positive");
  switch (cfg.strategy) {
    case Strategy::kUsp:
      if (u == 0 && r == 0) {
        u = 1;  // default: the largest divisor of the ranks that divides the heads
        for (int d = 1; d <= n; ++d)
          if (n % d == 0 && o.heads % d == 0) u = d;
      }
      if (u == 0) u = r > 0 && n % r == 0 ? n / r : 0;
      if (r == 0) r = u > 0 && n % u == 0 ? n / u : 0;
      SEQPAR_ARG_CHECK(u > 0 && r > 0 && u * r == n, "--ulysses-degree ", o.ulysses_degree,
                       " x --ring-degree ", o.ring_degree, " must equal the ", n,
                       " ranks; valid ulysses degrees: ", divisors(n));
      break;
    case Strategy::kUlysses:
      SEQPAR_ARG_CHECK((u == 0 || u == n) && (r == 0 || r == 1), "--strategy ulysses uses all ",
                       n, " ranks as one Ulysses group; for --ulysses-degree ", u,
                       " --ring-degree ", r, " use --strategy usp");
      u = n;
      r = 1;
      break;
    default:
      SEQPAR_ARG_CHECK((u == 0 || u == 1) && (r == 0 || r == n), "--strategy ",
                       strategy_name(cfg.strategy), " does not take --ulysses-degree or ",
                       "--ring-degree; use --strategy usp to combine them");
      u = 1;
      r = n;
  }
  cfg.ulysses_degree = u;
  cfg.ring_degree = r;
  CpOptions cp;
  cp.ulysses_mode = parse_ulysses_mode(o.ulysses_mode);
  const int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
  check_strategy_shape(cfg.strategy, Partition(o.seq, n, cfg.layout), o.heads, kv, u, cp);
}

// What rank 0 reports.
struct Report {
  std::vector<double> seconds;  // per repetition, slowest rank
  std::vector<int64_t> sent, recv, peak_kv, work, tokens;
  double max_abs_err = NAN;
  double max_lse_err = NAN;
  int64_t verified_rows = 0;
  double wait_fraction = 0;
};

void validate(const RunOptions& o) {
  SEQPAR_ARG_CHECK(o.seq >= 1, "--seq ", o.seq, " is invalid; it must be at least 1");
  SEQPAR_ARG_CHECK(o.heads >= 1, "--heads ", o.heads, " is invalid; it must be at least 1");
  SEQPAR_ARG_CHECK(o.kv_heads >= 0, "--kv-heads ", o.kv_heads,
                   " is invalid; it must divide --heads (0 means equal to --heads)");
  SEQPAR_ARG_CHECK(o.head_dim >= 1 && o.head_dim <= 1024, "--head-dim ", o.head_dim,
                   " is invalid; valid: 1 to 1024");
  SEQPAR_ARG_CHECK(o.batch >= 1, "--batch ", o.batch, " is invalid; it must be at least 1");
  SEQPAR_ARG_CHECK(o.repeat >= 1, "--repeat ", o.repeat, " is invalid; it must be at least 1");
  SEQPAR_ARG_CHECK(o.threads >= 0, "--threads ", o.threads,
                   " is invalid; it must be at least 1 (0 = automatic)");
  SEQPAR_ARG_CHECK(o.timeout_s >= 0, "--timeout ", o.timeout_s,
                   " is invalid; it must be positive seconds");
  const int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
  if (o.heads % kv != 0) {
    std::string valid;
    for (int64_t d = 1; d <= o.heads; ++d)
      if (o.heads % d == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(d);
    throw InvalidArgument(detail::concat("--heads ", o.heads, " is not divisible by --kv-heads ",
                                         kv, "; valid kv-heads: ", valid));
  }
  SEQPAR_ARG_CHECK(o.backend == "threads" || o.backend == "mpi", "--backend '", o.backend,
                   "' is unknown; valid: threads, mpi");
}

std::string divisors(int64_t x) {
  std::string s;
  for (int64_t d = 1; d <= x; ++d)
    if (x % d == 0) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

// Query positions checked by --verify: all rows if cheap, else an even spread with both ends.
std::vector<int64_t> verify_positions(const RunOptions& o, int64_t kv_heads) {
  const double per_row = static_cast<double>(o.batch) * o.seq * o.heads * o.head_dim;
  int64_t rows = static_cast<int64_t>(kVerifyBudget / per_row);
  rows = std::clamp<int64_t>(rows, std::min<int64_t>(16, o.seq), o.seq);
  std::vector<int64_t> pos;
  for (int64_t i = 0; i < rows; ++i)
    pos.push_back(rows == 1 ? 0 : i * (o.seq - 1) / (rows - 1));
  pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
  return pos;
}

// One rank's part of `seqpar run`. Rank 0 fills *report.
void run_rank(Communicator& comm, const Config& cfg, Report* report) {
  const RunOptions& o = cfg.opts;
  const int r = comm.rank(), n = comm.size();
  omp_set_num_threads(cfg.threads);
  const int64_t kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  Partition part(o.seq, n, cfg.layout);
  auto pos = part.positions(r);
  Tensor q = synthetic_rows(o.seed, Which::kQ, o.batch, pos, o.heads, o.head_dim, cfg.dtype);
  Tensor k = synthetic_rows(o.seed, Which::kK, o.batch, pos, kv_heads, o.head_dim, cfg.dtype);
  Tensor v = synthetic_rows(o.seed, Which::kV, o.batch, pos, kv_heads, o.head_dim, cfg.dtype);
  CpOptions cp;
  cp.causal = o.causal;
  cp.ulysses_mode = parse_ulysses_mode(o.ulysses_mode);
  SpComms comms(comm, cfg.ulysses_degree);

  AttnState state;
  CpStats cps;
  CommStats call_stats;
  std::vector<double> seconds;
  double wait_sum = 0, time_sum = 0;
  for (int rep = 0; rep <= o.repeat; ++rep) {  // rep 0 is the warm-up
    comm.barrier();
    comms.reset_stats();
    double t0 = now_seconds();
    state = context_parallel_attention(cfg.strategy, comms, part, q, k, v, cp, &cps);
    double dt = now_seconds() - t0;
    call_stats = comms.stats();
    if (rep > 0) {
      seconds.push_back(comm.all_reduce_max(dt));
      wait_sum += cps.wait_seconds;
      time_sum += dt;
    }
  }

  // Per-rank figures of the last call, gathered everywhere (rank 0 reports them).
  std::array<int64_t, 5> mine = {static_cast<int64_t>(call_stats.total_sent()),
                                 static_cast<int64_t>(call_stats.total_recv()),
                                 cps.peak_kv_bytes, cps.work, part.count(r)};
  std::vector<int64_t> all(5 * n);
  comm.all_gather(mine.data(), sizeof(mine), all.data());
  const double wait_fraction = comm.all_reduce_max(time_sum > 0 ? wait_sum / time_sum : 0);

  double max_err = NAN, lse_err = NAN;
  int64_t verified = 0;
  if (o.verify) {
    // Every rank sends its out/lse rows for the sampled positions it holds, rank 0 compares.
    const std::vector<int64_t> sample = verify_positions(o, kv_heads);
    const int64_t row = o.heads * o.head_dim;
    std::vector<float> packed;  // per sample owned: for each b: out row, then lse (H)
    std::vector<size_t> counts(n, 0);
    for (int i = 0; i < n; ++i) {
      auto pi = part.positions(i);
      for (int64_t p : sample) {
        auto it = std::lower_bound(pi.begin(), pi.end(), p);
        if (it == pi.end() || *it != p) continue;
        counts[i] += static_cast<size_t>(o.batch * (row + o.heads)) * sizeof(float);
        if (i != r) continue;
        const int64_t local = it - pi.begin();
        for (int64_t b = 0; b < o.batch; ++b) {
          const float* out = state.out.data<float>() + (b * pos.size() + local) * row;
          const float* lse = state.lse.data<float>() + (b * pos.size() + local) * o.heads;
          packed.insert(packed.end(), out, out + row);
          packed.insert(packed.end(), lse, lse + o.heads);
        }
      }
    }
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<float> gathered(total / sizeof(float));
    comm.all_gatherv(packed.data(), gathered.data(), counts);
    double errs[2] = {0, 0};
    if (r == 0) {
      // Rows arrive grouped by owner rank; map each back to its sample index.
      std::vector<int64_t> order;
      for (int i = 0; i < n; ++i) {
        auto pi = part.positions(i);
        for (int64_t p : sample)
          if (std::binary_search(pi.begin(), pi.end(), p)) order.push_back(p);
      }
      std::vector<int64_t> all_pos(o.seq);
      for (int64_t i = 0; i < o.seq; ++i) all_pos[i] = i;
      Tensor qs = synthetic_rows(o.seed, Which::kQ, o.batch, order, o.heads, o.head_dim, cfg.dtype);
      Tensor kf = synthetic_rows(o.seed, Which::kK, o.batch, all_pos, kv_heads, o.head_dim, cfg.dtype);
      Tensor vf = synthetic_rows(o.seed, Which::kV, o.batch, all_pos, kv_heads, o.head_dim, cfg.dtype);
      AttnParams params;
      params.mask.causal = o.causal;
      params.mask.q_pos = order;
      AttnState ref = reference_attention(qs, kf, vf, params);
      const int64_t ns = static_cast<int64_t>(order.size());
      for (int64_t j = 0; j < ns; ++j) {
        for (int64_t b = 0; b < o.batch; ++b) {
          const float* got = gathered.data() + (j * o.batch + b) * (row + o.heads);
          const float* want = ref.out.data<float>() + (b * ns + j) * row;
          const float* want_lse = ref.lse.data<float>() + (b * ns + j) * o.heads;
          for (int64_t x = 0; x < row; ++x) {
            double d = std::fabs(static_cast<double>(got[x]) - want[x]);
            errs[0] = std::isnan(d) ? INFINITY : std::max(errs[0], d);
          }
          for (int64_t h = 0; h < o.heads; ++h) {
            double d = std::fabs(static_cast<double>(got[row + h]) - want_lse[h]);
            errs[1] = std::isnan(d) ? INFINITY : std::max(errs[1], d);
          }
        }
      }
      verified = ns;
    }
    comm.broadcast(errs, sizeof(errs), 0);
    max_err = errs[0];
    lse_err = errs[1];
  }

  if (r == 0 && report) {
    report->seconds = seconds;
    for (int i = 0; i < n; ++i) {
      report->sent.push_back(all[5 * i + 0]);
      report->recv.push_back(all[5 * i + 1]);
      report->peak_kv.push_back(all[5 * i + 2]);
      report->work.push_back(all[5 * i + 3]);
      report->tokens.push_back(all[5 * i + 4]);
    }
    report->max_abs_err = max_err;
    report->max_lse_err = lse_err;
    report->verified_rows = verified;
    report->wait_fraction = wait_fraction;
  }
}

double tolerance(DType t) { return t == DType::kF32 ? 1e-4 : 2e-2; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int print_report(const Config& cfg, const Report& rep, const std::string& backend) {
  const RunOptions& o = cfg.opts;
  const int64_t kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  const double secs = median(rep.seconds);
  int64_t total_work = 0, max_work = 0;
  for (int64_t w : rep.work) {
    total_work += w;
    max_work = std::max(max_work, w);
  }
  const double mean_work = static_cast<double>(total_work) / cfg.ranks;
  const double imbalance = mean_work > 0 ? max_work / mean_work : 1.0;
  const double gflops = secs > 0 ? 4.0 * o.head_dim * total_work / secs / 1e9 : 0;
  const bool verified = o.verify;
  const bool ok = !verified || (rep.max_abs_err <= tolerance(cfg.dtype));

  if (o.json) {
    json j;
    j["strategy"] = strategy_name(cfg.strategy);
    j["layout"] = layout_name(cfg.layout);
    j["ulysses_degree"] = cfg.ulysses_degree;
    j["ring_degree"] = cfg.ring_degree;
    j["ulysses_mode"] = o.ulysses_mode;
    j["backend"] = backend;
    j["ranks"] = cfg.ranks;
    j["seq"] = o.seq;
    j["heads"] = o.heads;
    j["kv_heads"] = kv_heads;
    j["head_dim"] = o.head_dim;
    j["batch"] = o.batch;
    j["dtype"] = dtype_name(cfg.dtype);
    j["causal"] = o.causal;
    j["threads"] = cfg.threads;
    j["repeat"] = o.repeat;
    j["seconds"] = secs;
    j["seconds_all"] = rep.seconds;
    j["gflops"] = gflops;
    j["max_abs_err"] = verified ? json(rep.max_abs_err) : json(nullptr);
    j["max_lse_err"] = verified ? json(rep.max_lse_err) : json(nullptr);
    j["tolerance"] = tolerance(cfg.dtype);
    j["verified_rows"] = rep.verified_rows;
    j["ok"] = ok;
    j["tokens_per_rank"] = rep.tokens;
    j["bytes_sent_per_rank"] = rep.sent;
    j["bytes_recv_per_rank"] = rep.recv;
    j["peak_kv_bytes_per_rank"] = rep.peak_kv;
    j["work_per_rank"] = rep.work;
    j["work_imbalance"] = imbalance;
    j["comm_wait_fraction"] = rep.wait_fraction;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar run: %s attention, %s layout, %s backend, %d ranks x %d threads\n",
                std::string(strategy_name(cfg.strategy)).c_str(),
                std::string(layout_name(cfg.layout)).c_str(), backend.c_str(), cfg.ranks,
                cfg.threads);
    if (cfg.strategy == Strategy::kUsp || cfg.strategy == Strategy::kUlysses)
      std::printf("  ulysses degree %d x ring degree %d, ulysses mode %s\n", cfg.ulysses_degree,
                  cfg.ring_degree, o.ulysses_mode.c_str());
    std::printf("  seq %lld  batch %lld  heads %lld  kv_heads %lld  head_dim %lld  %s  %s\n",
                (long long)o.seq, (long long)o.batch, (long long)o.heads, (long long)kv_heads,
                (long long)o.head_dim, std::string(dtype_name(cfg.dtype)).c_str(),
                o.causal ? "causal" : "non-causal");
    std::printf("  time     %.6f s (median of %d, slowest rank)\n", secs, o.repeat);
    std::printf("  rate     %.2f GFLOP/s (4*D flops per visible score)\n", gflops);
    std::printf("  work imbalance %.3f (max/mean over ranks), comm wait %.1f%% of call time\n",
                imbalance, 100 * rep.wait_fraction);
    std::printf("\n  %-5s %10s %15s %15s %16s\n", "rank", "tokens", "bytes sent", "bytes recv",
                "peak K/V bytes");
    for (int i = 0; i < cfg.ranks; ++i)
      std::printf("  %-5d %10lld %15lld %15lld %16lld\n", i, (long long)rep.tokens[i],
                  (long long)rep.sent[i], (long long)rep.recv[i], (long long)rep.peak_kv[i]);
    if (verified)
      std::printf("\n  verify   max abs err %.3g (lse %.3g) over %lld query rows, tolerance %.0e: %s\n",
                  rep.max_abs_err, rep.max_lse_err, (long long)rep.verified_rows,
                  tolerance(cfg.dtype), ok ? "ok" : "FAILED");
  }
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace

void add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand(
      "run", "Run one distributed attention on seeded inputs, optionally verify it, report it");
  run->add_option("--strategy", o.strategy, "ring | allgather | ulysses | usp");
  run->add_option("--layout", o.layout, "contiguous | striped | zigzag");
  run->add_option("--ulysses-degree,--ulysses_degree", o.ulysses_degree,
                  "usp: ranks per Ulysses group (default: ranks / ring degree)");
  run->add_option("--ring-degree,--ring_degree", o.ring_degree,
                  "usp: number of ring groups (default: ranks / ulysses degree)");
  run->add_option("--ulysses-mode,--ulysses_mode", o.ulysses_mode,
                  "strict (divisible shapes) | uaa (any length and head count)");
  run->add_option("--ranks", o.ranks, "ranks (default 2 on threads; the MPI world size)");
  run->add_option("--seq", o.seq, "sequence length S (tokens)");
  run->add_option("--heads", o.heads, "query heads H");
  run->add_option("--kv-heads,--kv_heads", o.kv_heads, "key/value heads (divides H; default H)");
  run->add_option("--head-dim,--head_dim", o.head_dim, "head dimension D");
  run->add_option("--batch", o.batch, "batch size B");
  run->add_flag("--causal", o.causal, "causal mask");
  run->add_option("--dtype", o.dtype, "fp32 | bf16 | fp16");
  run->add_option("--backend", o.backend, "threads | mpi (launch with mpirun)");
  run->add_flag("--verify", o.verify, "compare with the single-rank reference");
  run->add_flag("--json", o.json, "print one JSON object");
  run->add_option("--seed", o.seed, "seed of the synthetic inputs");
  run->add_option("--threads", o.threads, "threads per rank (default cores/ranks; 1 under MPI)");
  run->add_option("--repeat", o.repeat, "timed repetitions after one warm-up");
  run->add_option("--timeout", o.timeout_s, "communication deadline in seconds (default 60)");
}

int run_command(const RunOptions& opts) {
  validate(opts);
  Config cfg{opts, parse_strategy(opts.strategy), parse_layout(opts.layout),
             parse_dtype(opts.dtype), 0, 0, 1, 1};
  parse_ulysses_mode(opts.ulysses_mode);
  std::chrono::milliseconds timeout =
      opts.timeout_s > 0 ? std::chrono::milliseconds(static_cast<int64_t>(opts.timeout_s * 1000))
                         : Communicator::default_timeout();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  if (opts.backend == "threads") {
    cfg.ranks = opts.ranks == 0 ? 2 : opts.ranks;
    SEQPAR_ARG_CHECK(cfg.ranks >= 1, "--ranks ", opts.ranks, " is invalid; it must be at least 1");
    cfg.threads = opts.threads > 0 ? opts.threads : std::max(1, cores / cfg.ranks);
    Partition check(opts.seq, cfg.ranks, cfg.layout);  // argument errors before any thread starts
    resolve_degrees(cfg);
    Report report;
    ThreadWorld::run(
        cfg.ranks, [&](Communicator& comm) { run_rank(comm, cfg, comm.rank() == 0 ? &report : nullptr); },
        timeout);
    return print_report(cfg, report, "threads");
  }

  // mpi: every process runs this; rank 0 prints.
  SEQPAR_ARG_CHECK(mpi_available(), "--backend mpi: this build has no MPI; valid: threads");
  mpi_init(nullptr, nullptr);
  std::unique_ptr<Communicator> comm = mpi_world();
  comm->set_timeout(timeout);
  cfg.ranks = comm->size();
  cfg.threads = opts.threads > 0 ? opts.threads : 1;
  try {  // every rank sees the same arguments, so every rank stops here alike
    SEQPAR_ARG_CHECK(opts.ranks == 0 || opts.ranks == cfg.ranks, "--ranks ", opts.ranks,
                     " does not match the MPI world size ", cfg.ranks,
                     "; omit --ranks or launch mpirun -np ", opts.ranks);
    Partition check(opts.seq, cfg.ranks, cfg.layout);
    resolve_degrees(cfg);
  } catch (const InvalidArgument&) {
    comm.reset();
    mpi_finalize();
    throw;
  }
  Report report;
  try {
    run_rank(*comm, cfg, &report);
  } catch (const std::exception& e) {
    comm->abort(e.what());
    std::fprintf(stderr, "seqpar: error: rank %d: %s\n", comm->rank(), e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  int code = 0;
  if (comm->rank() == 0) code = print_report(cfg, report, "mpi");
  int32_t codes = code;
  comm->broadcast(&codes, sizeof(codes), 0);
  comm.reset();
  mpi_finalize();
  return codes;
}

}  // namespace seqpar::cli
