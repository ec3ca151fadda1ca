// seqpar run: seeded Q/K/V, one distributed attention per repetition (parallel/runner.h), optional
// verification against reference_attention, a table or one JSON object.
//
// Two kinds of job, both checked against the same oracle:
//   sequence: the S tokens sharded by --layout, every strategy (ring, allgather, ulysses, usp),
//             optionally padded (--pad) and with replicated text tokens (--text-tokens);
//   cache:    --cached P --new T: a distributed K/V cache and T new queries (passq, passkv,
//             auto choosing between them).
// Packed sequences (varlen): --seq-lens (documents of the sequence), --cached-lens with --new-lens
// or --new (a batch of requests over the cache).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "mesh_run.h"
#include "progress.h"
#include "seqpar/comm/threads.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/parallel/runner.h"
#include "seqpar/parallel/strategy_table.h"
#include "seqpar/plan/hardware.h"
#include "seqpar/plan/selection.h"
#include "trace_file.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

// The job and how the command runs it, resolved before any rank starts.
struct Run {
  RunOptions opts;
  AttnJob job;
  int threads = 1;
  std::optional<AttnChoice> choice;  // --strategy auto
};

// What rank 0 reports.
struct Report {
  std::vector<double> seconds;  // per repetition, slowest rank
  JobStats stats;
  Verification check;
  std::string trace_error;  // --trace could not be written (the report still prints)
};

// The strategies `seqpar run` takes: the table's rows over a sharded sequence, then over a K/V
// cache (strategy_table.h), and auto.
std::string run_strategies() {
  std::string names;
  for (bool cache : {false, true})
    for (const StrategyRow& row : strategy_table())
      if (row.over_cache == cache && row.degrees != SpDegrees::kOne)
        names += std::string(strategy_name(row.strategy)) + ", ";
  return names + "auto";
}

// The command's own flags against core/limits.h; the shape and the layout are validated by
// resolve_job.
void validate(const RunOptions& o) {
  using limits::check_range;
  if (o.ranks) check_range("--ranks", *o.ranks, 1, limits::kMaxRanks);
  check_range("--repeat", o.repeat, 1, limits::kMaxSteps);
  check_range("--warmup", o.warmup, 0, limits::kMaxSteps);
  check_range("--threads", o.threads, 0, limits::kMaxThreads);
  check_range("--ulysses-degree", o.ulysses_degree, 0, limits::kMaxRanks);
  check_range("--ring-degree", o.ring_degree, 0, limits::kMaxRanks);
  if (o.timeout_s)
    check_range("--timeout", *o.timeout_s, limits::kMinTimeoutSeconds, limits::kMaxTimeoutSeconds);
  bool known = o.strategy == "auto";
  try {
    known = known || parse_strategy(o.strategy) != Strategy::kLocal;
  } catch (const InvalidArgument&) {
  }
  SEQPAR_ARG_CHECK(known, "--strategy '", o.strategy, "' is unknown; valid: ", run_strategies());
  SEQPAR_ARG_CHECK(o.backend == "threads" || o.backend == "mpi", "--backend '", o.backend,
                   "' is unknown; valid: threads, mpi");
  (void)load_profile_checked(o.hardware);  // a bad name is refused even when not used
}

// A comma-separated list of token counts ("3000,17,9000"): each item an integer 1 to
// kMaxTokens; empty text: no list.
std::vector<int64_t> parse_lengths(const char* flag, const std::string& text) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t at = 0;
  for (int item = 1;; ++item) {
    const size_t comma = text.find(',', at);
    const std::string s =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    bool digits = !s.empty() && s.size() <= 18;
    for (char ch : s) digits = digits && ch >= '0' && ch <= '9';
    const int64_t v = digits ? std::stoll(s) : 0;
    SEQPAR_ARG_CHECK(digits && v >= 1 && v <= limits::kMaxTokens, flag, " item ", item, " '", s,
                     "' is invalid; valid: comma-separated token counts, each 1 to ",
                     limits::kMaxTokens, " (e.g. 3000,17,9000)");
    out.push_back(v);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// The shape of the flags: --seq-lens (seq their sum when --seq is not given), --cached-lens with
// --new-lens or --new (new tokens per request).
AttnShape shape_of(const RunOptions& o) {
  AttnShape s{o.batch,  o.seq,         o.heads,  o.kv_heads, o.head_dim,
              o.causal, o.text_tokens, o.cached, o.fresh,    parse_dtype(o.dtype)};
  s.seq_lens = parse_lengths("--seq-lens", o.seq_lens);
  if (!s.seq_lens.empty()) {
    SEQPAR_ARG_CHECK(o.cached_lens.empty() && o.cached == 0, "--seq-lens describe a sequence; ",
                     "over a K/V cache give --cached-lens with --new-lens");
    const int64_t sum = sum_of(s.seq_lens);
    SEQPAR_ARG_CHECK(!o.seq_given || o.seq == sum, "--seq-lens sum to ", sum, " but --seq is ",
                     o.seq, "; omit --seq or make the lengths add up to it");
    s.seq = sum;
  }
  s.cached_lens = parse_lengths("--cached-lens", o.cached_lens);
  s.fresh_lens = parse_lengths("--new-lens", o.new_lens);
  SEQPAR_ARG_CHECK(!s.cached_lens.empty() || s.fresh_lens.empty(),
                   "--new-lens needs --cached-lens (one cached length per request)");
  if (!s.cached_lens.empty()) {
    const size_t m = s.cached_lens.size();
    SEQPAR_ARG_CHECK(s.fresh_lens.empty() || o.fresh == 0, "give --new-lens (per request) or ",
                     "--new (every request), not both");
    if (s.fresh_lens.empty()) {
      SEQPAR_ARG_CHECK(o.fresh >= 1, "--cached-lens needs --new-lens (one per request) or --new ",
                       "(new tokens of every request)");
      s.fresh_lens.assign(m, o.fresh);
    }
    SEQPAR_ARG_CHECK(s.fresh_lens.size() == m, "--new-lens has ", s.fresh_lens.size(),
                     " items but --cached-lens ", m, "; valid: one per request");
    const int64_t sum = sum_of(s.cached_lens);
    SEQPAR_ARG_CHECK(o.cached == 0 || o.cached == sum, "--cached-lens sum to ", sum,
                     " but --cached is ", o.cached, "; omit --cached or make them agree");
    s.cached = sum;
    s.fresh = sum_of(s.fresh_lens);
  }
  return s;
}

// Builds the run for `ranks` ranks; every argument error surfaces here, before ranks start.
Run make_run(const RunOptions& o, int ranks, int threads) {
  validate(o);
  Run run{o, {}, threads, {}};
  ParallelConfig c;
  c.mesh.ulysses = static_cast<int>(o.ulysses_degree);  // 0: filled by resolve_job
  c.mesh.ring = static_cast<int>(o.ring_degree);
  c.layout = parse_layout(o.layout);
  c.ulysses_mode = parse_ulysses_mode(o.ulysses_mode);
  c.softmax = parse_softmax_mode(o.softmax);
  c.schedule = parse_schedule_kind(o.schedule);
  c.pad = o.pad;
  const AttnShape s = shape_of(o);
  if (o.strategy == "auto") {
    // The planner's fastest strategy and schedule for this call (plan/selection.h).
    run.choice = choose_attention(c, ranks, s, load_profile_checked(o.hardware));
    c = run.choice->config;
  } else {
    c.strategy = parse_strategy(o.strategy);
    if (s.over_cache() && c.strategy == Strategy::kRing) c.strategy = Strategy::kPassKv;
  }
  SEQPAR_ARG_CHECK(s.over_cache() || s.seq < 1 || ranks <= s.seq, "--ranks ", ranks,
                   " exceeds --seq ", s.seq, "; every rank needs a token: use at most ", s.seq,
                   " ranks");
  run.job = resolve_job(c, s, ranks, o.verify);
  return run;
}

// JSON has no NaN or Inf (nlohmann writes null, which reads as "not verified"): a non-finite
// error is written as the string "nan", "inf" or "-inf".
json error_json(double err) {
  if (std::isfinite(err)) return json(err);
  return json(std::isnan(err) ? "nan" : err > 0 ? "inf" : "-inf");
}

// One rank's part of `seqpar run`: --warmup untimed calls, --repeat timed ones, the figures
// gathered, the trace written, the last call verified. Rank 0 fills *report.
void run_rank(Communicator& comm, const Run& run, Report* report, OutputFile* trace_out) {
  const RunOptions& o = run.opts;
  omp_set_num_threads(run.threads);
  trace::set_rank(comm.rank());
  const RankInputs in = synthetic_inputs(run.job, comm.rank(), o.seed);
  JobComms comms(comm, run.job);
  RankCall call;
  CallTimes times;
  std::vector<double> seconds;
  Progress progress("run", o.json || comm.rank() != 0);
  for (int rep = 0; rep < o.warmup + o.repeat; ++rep) {
    const bool timed = rep >= o.warmup;
    trace::Scope rep_span(trace::enabled() ? detail::concat(timed ? "run " : "warm-up ",
                                                            timed ? rep - o.warmup + 1 : rep + 1)
                                           : std::string(),
                          "run", trace::Lane::kCompute);
    // The previous call's state released first, so that this call reuses its storage (as a
    // model's calls do) rather than taking fresh pages beside it.
    call = RankCall{};
    call = run_attention_call(comms, run.job, in);
    progress.step(rep + 1, o.warmup + o.repeat, "calls (warm-up included)");
    if (!timed) continue;
    seconds.push_back(comm.all_reduce_max(call.seconds));
    times.add(call);
  }
  JobStats stats = gather_job_stats(comm, run.job, in, call, times);
  std::string trace_error;
  if (!o.trace.empty()) write_trace(comm, trace_out, &trace_error);  // the runs, not verify
  Verification check;
  if (o.verify) {
    progress.phase("verifying against the single-rank reference");
    check = verify_call(comm, run.job, o.seed, call);
  }
  if (comm.rank() == 0 && report) *report = {seconds, std::move(stats), check, trace_error};
}

int print_report(const Run& run, const Report& rep, const std::string& backend) {
  const RunOptions& o = run.opts;
  const AttnJob& job = run.job;
  const JobStats& st = rep.stats;
  const std::string label(strategy_name(job.config.strategy));
  const double secs = median(rep.seconds);
  int64_t total_work = 0, max_work = 0;
  for (int64_t w : st.work) {
    total_work += w;
    max_work = std::max(max_work, w);
  }
  const double mean_work = static_cast<double>(total_work) / job.ranks();
  const double imbalance = mean_work > 0 ? max_work / mean_work : 1.0;
  const double gflops = secs > 0 ? 4.0 * o.head_dim * total_work / secs / 1e9 : 0;
  const ErrorBound tol = o.verify ? rep.check.bound : job_error_bound(job, 1);
  const bool ok = !o.verify || rep.check.ok;
  auto worst = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  const double exposed = worst(st.exposed), end_sync = worst(st.end_sync);

  if (o.json) {
    json j;
    j["strategy"] = label;
    j["layout"] = layout_name(job.config.layout);
    j["backend"] = backend;
    j["ranks"] = job.ranks();
    j["seq"] = job.shape.seq;
    j["heads"] = o.heads;
    j["kv_heads"] = job.shape.kv();
    j["head_dim"] = o.head_dim;
    j["batch"] = o.batch;
    j["dtype"] = dtype_name(job.shape.dtype);
    j["causal"] = o.causal;
    j["threads"] = run.threads;
    j["repeat"] = o.repeat;
    // The deadline of every communication wait (--timeout, else SEQPAR_TIMEOUT_S or 60 s).
    j["timeout_s"] = o.timeout_s ? *o.timeout_s : Communicator::default_timeout().count() / 1e3;
    j["seconds"] = secs;
    j["seconds_all"] = rep.seconds;
    j["gflops"] = gflops;
    j["max_abs_err"] = o.verify ? error_json(rep.check.max_abs_err) : json(nullptr);
    j["max_lse_err"] = o.verify ? error_json(rep.check.max_lse_err) : json(nullptr);
    j["tolerance"] = tol.out;
    j["lse_tolerance"] = tol.lse;
    j["kernel_path"] = kernel_path_name(kernel_path(job.shape.dtype));
    j["verified_rows"] = rep.check.rows;
    j["ok"] = ok;
    j["tokens_per_rank"] = st.tokens;
    j["bytes_sent_per_rank"] = st.sent;
    j["bytes_recv_per_rank"] = st.recv;
    j["peak_kv_bytes_per_rank"] = st.peak_kv;
    j["measured_kv_bytes_per_rank"] = st.measured_kv;
    j["work_per_rank"] = st.work;
    j["work_imbalance"] = imbalance;
    j["comm_wait_fraction"] = st.wait_fraction;
    j["exposed_comm_fraction"] = exposed;
    j["exposed_comm_fraction_per_rank"] = st.exposed;
    j["end_sync_fraction"] = end_sync;
    j["end_sync_fraction_per_rank"] = st.end_sync;
    j["peak_rss_bytes_per_rank"] = st.peak_rss;
    j["rss_shared_by_ranks"] = backend != "mpi";
    j["tensor_bytes_per_rank"] = st.tensor_bytes;
    j["warmup"] = o.warmup;
    if (!o.trace.empty()) j["trace"] = o.trace;
    j["softmax"] = softmax_mode_name(job.config.softmax);
    j["schedule"] = schedule_kind_name(job.config.schedule);
    j["fallback_rows"] = st.fallback_rows;
    if (!job.over_cache()) {
      j["ulysses_degree"] = job.config.mesh.ulysses;
      j["ring_degree"] = job.config.mesh.ring;
      j["ulysses_mode"] = ulysses_mode_name(job.config.ulysses_mode);
      j["padded_seq"] = job.padded_seq;
      j["text_tokens"] = o.text_tokens;
      j["seq_lens"] = job.shape.seq_lens;
    } else {
      j["cached"] = job.shape.cached;
      j["new"] = job.shape.fresh;
      j["cached_lens"] = job.shape.cached_lens;
      j["new_lens"] = job.shape.fresh_lens;
    }
    if (run.choice) {
      j["choice"] = strategy_name(run.choice->config.strategy);
      j["choice_schedule"] = schedule_kind_name(run.choice->config.schedule);
      j["choice_label"] = candidate_label(run.choice->config);
      j["choice_reason"] = run.choice->reason;
      j["predicted_seconds"] = json::object();
      for (const auto& [label, seconds] : run.choice->candidates)
        j["predicted_seconds"][label] = seconds;
      if (run.choice->rule) {
        j["threshold_tokens"] = run.choice->rule->threshold_tokens;
        j["rule_choice"] = strategy_name(run.choice->rule->kind);
      }
      j["hardware"] = o.hardware;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar run: %s attention, %s layout, %s backend, %d ranks x %d threads\n",
                label.c_str(), std::string(layout_name(job.config.layout)).c_str(), backend.c_str(),
                job.ranks(), run.threads);
    if (run.choice)
      std::printf("  auto (%s profile): %s\n", o.hardware.c_str(), run.choice->reason.c_str());
    if (job.over_cache()) {
      std::printf("  K/V cache of %lld tokens + %lld new tokens", (long long)job.shape.cached,
                  (long long)job.shape.fresh);
      if (!job.shape.cached_lens.empty())
        std::printf(" in %zu requests", job.shape.cached_lens.size());
      if (job.config.schedule == ScheduleKind::kRing)
        std::printf(", Q blocks passed around the ring");
      std::printf("\n");
    } else {
      if (job.config.strategy == Strategy::kUsp || job.config.strategy == Strategy::kUlysses)
        std::printf("  ulysses degree %d x ring degree %d, ulysses mode %s\n",
                    job.config.mesh.ulysses, job.config.mesh.ring,
                    std::string(ulysses_mode_name(job.config.ulysses_mode)).c_str());
      if (job.padded_seq != job.shape.seq)
        std::printf("  padded to %lld tokens (%lld padding, masked)\n", (long long)job.padded_seq,
                    (long long)(job.padded_seq - job.shape.seq));
      if (!job.shape.seq_lens.empty())
        std::printf("  %zu packed documents (seq_lens), attention within each\n",
                    job.shape.seq_lens.size());
      if (o.text_tokens > 0)
        std::printf("  joint attention with %lld replicated text tokens\n",
                    (long long)o.text_tokens);
      if (job.config.softmax == SoftmaxMode::kConstMax)
        std::printf("  softmax const-max: %lld query rows fell back to online softmax\n",
                    (long long)st.fallback_rows);
    }
    std::printf("  seq %lld  batch %lld  heads %lld  kv_heads %lld  head_dim %lld  %s  %s\n",
                (long long)job.shape.seq, (long long)o.batch, (long long)o.heads,
                (long long)job.shape.kv(), (long long)o.head_dim,
                std::string(dtype_name(job.shape.dtype)).c_str(),
                o.causal ? "causal" : "non-causal");
    std::printf("  time     %.6f s (median of %lld, slowest rank)\n", secs, (long long)o.repeat);
    std::printf("  rate     %.2f GFLOP/s (4*D flops per visible score)\n", gflops);
    std::printf("  work imbalance %.3f (max/mean over ranks), comm wait %.1f%% of call time\n",
                imbalance, 100 * st.wait_fraction);
    std::printf("  exposed communication %.1f%% of step time (worst rank, median run)",
                100 * exposed);
    if (end_sync > 0)
      std::printf("; end-of-call sync %.1f%% (zero copy: waiting for peers to finish reading)",
                  100 * end_sync);
    std::printf("\n");
    if (!o.trace.empty()) std::printf("  trace    %s\n", o.trace.c_str());
    std::printf("\n  %-5s %10s %15s %15s %16s %14s %12s\n", "rank", "queries", "bytes sent",
                "bytes recv", "peak K/V bytes", "tensor bytes", "peak RSS MB");
    for (int i = 0; i < job.ranks(); ++i)
      std::printf("  %-5d %10lld %15lld %15lld %16lld %14lld %12.1f\n", i, (long long)st.tokens[i],
                  (long long)st.sent[i], (long long)st.recv[i], (long long)st.peak_kv[i],
                  (long long)st.tensor_bytes[i], st.peak_rss[i] / 1048576.0);
    if (backend != "mpi")
      std::printf("  (threads backend: the ranks share one process; peak RSS is the process's)\n");
    if (o.verify)
      std::printf(
          "\n  verify   max abs err %.3g (lse %.3g) over %lld query rows, tolerance %.2g (lse "
          "%.2g, %s path): %s\n",
          rep.check.max_abs_err, rep.check.max_lse_err, (long long)rep.check.rows, tol.out, tol.lse,
          std::string(kernel_path_name(kernel_path(job.shape.dtype))).c_str(),
          ok ? "ok" : "FAILED");
  }
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace

void add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand(
      "run", "Run one distributed attention on seeded inputs, optionally verify it, report it");
  run->add_option("--strategy", o.strategy,
                  run_strategies() + " (auto: the planner's fastest on --hardware)");
  run->add_option("--layout", o.layout, "contiguous | striped | zigzag");
  run->add_option("--ulysses-degree,--ulysses_degree", o.ulysses_degree,
                  "usp: ranks per Ulysses group (default: ranks / ring degree)");
  run->add_option("--ring-degree,--ring_degree", o.ring_degree,
                  "usp: number of ring groups (default: ranks / ulysses degree)");
  run->add_option("--ulysses-mode,--ulysses_mode", o.ulysses_mode,
                  "strict (divisible shapes) | uaa (any length and head count)");
  run->add_option_function<int64_t>(
         "--ranks", [&o](int64_t v) { o.ranks = v; },
         "ranks (default on threads: --ulysses-degree x --ring-degree when given, else 2; "
         "the MPI world size; at most 2^16)")
      ->default_str("2");
  run->add_option("--seq", o.seq,
                  "sequence length S (tokens); with --seq-lens their sum if omitted")
      ->each([&o](const std::string&) { o.seq_given = true; });
  run->add_option("--seq-lens,--seq_lens", o.seq_lens,
                  "packed documents (varlen, flash-attn's cu_seqlens): lengths L1,L2,... summing "
                  "to --seq; tokens attend only their own document; zigzag splits each document");
  run->add_option("--heads", o.heads, "query heads H");
  run->add_option("--kv-heads,--kv_heads", o.kv_heads, "key/value heads (divides H; default H)");
  run->add_option("--head-dim,--head_dim", o.head_dim, "head dimension D");
  run->add_option("--batch", o.batch, "batch size B");
  run->add_flag("--causal", o.causal, "causal mask");
  run->add_flag("--pad", o.pad, "pad S to a multiple of the ranks and mask the padding");
  run->add_option("--text-tokens,--text_tokens", o.text_tokens,
                  "joint attention: T text tokens replicated on every rank");
  run->add_option("--cached", o.cached, "tokens in the distributed K/V cache (decode)");
  run->add_option("--new", o.fresh,
                  "new tokens attending the cache (decode); with --cached-lens: per request");
  run->add_option("--cached-lens,--cached_lens", o.cached_lens,
                  "a batch of requests over the cache: cached tokens P1,P2,... per request, each "
                  "request's cache split over the ranks by --layout; with --new-lens or --new");
  run->add_option("--new-lens,--new_lens", o.new_lens,
                  "new tokens T1,T2,... per request (with --cached-lens)");
  run->add_option("--hardware", o.hardware,
                  "profile for --strategy auto: h100 | h200 | "
                  "cpu-ethernet | local");
  run->add_option("--softmax", o.softmax,
                  "online | const-max (ring, usp: fixed per-row max from key norms, partial "
                  "sums added without rescaling; loose rows fall back to online)");
  run->add_option("--schedule", o.schedule, schedule_choices());
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
// The report printed; a lost trace makes the exit code 1 (the report stands).
int finish_report(const Run& run, const Report& report, const std::string& backend) {
  const int code = print_report(run, report, backend);
  if (report.trace_error.empty()) return code;
  std::fprintf(stderr, "seqpar: error: %s\n", report.trace_error.c_str());
  return 1;
}

int run_threads(const RunOptions& opts, std::chrono::milliseconds timeout) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Unset: the degrees given make the group (ulysses x ring, either alone), else 2.
  const int64_t from_degrees =
      std::max<int64_t>(1, opts.ulysses_degree) * std::max<int64_t>(1, opts.ring_degree);
  const int64_t given =
      opts.ranks.value_or(opts.ulysses_degree > 0 || opts.ring_degree > 0 ? from_degrees : 2);
  limits::check_range("--ranks", given, 1, limits::kMaxRanks);
  const int ranks = static_cast<int>(given);
  const int threads =
      opts.threads > 0 ? static_cast<int>(opts.threads) : std::max(1, cores / std::max(1, ranks));
  limits::check_threads(ranks, threads);
  const Run run = make_run(opts, ranks, threads);  // argument errors before any thread starts
  std::optional<OutputFile> trace_out;
  if (!opts.trace.empty()) trace_out.emplace("--trace", opts.trace);
  Report report;
  if (!opts.trace.empty()) trace::start();
  ThreadWorld::run(
      ranks,
      [&](Communicator& comm) {
        const bool first = comm.rank() == 0;
        run_rank(comm, run, first ? &report : nullptr, first && trace_out ? &*trace_out : nullptr);
      },
      timeout);
  return finish_report(run, report, "threads");
}

// mpi: every process runs this; rank 0 prints.
int run_mpi(const RunOptions& opts, std::chrono::milliseconds timeout) {
  Run run;
  auto prepare = [&](int world) {  // every rank sees the same arguments and stops here alike
    SEQPAR_ARG_CHECK(!opts.ranks || *opts.ranks == world, "--ranks ", opts.ranks.value_or(0),
                     " does not match the MPI world size ", world,
                     "; omit --ranks or launch mpirun -np ", opts.ranks.value_or(0));
    run = make_run(opts, world, opts.threads > 0 ? static_cast<int>(opts.threads) : 1);
  };
  return run_on_mpi(opts.json, prepare, [&](Communicator& comm) {
    comm.set_timeout(timeout);
    // Rank 0 opens the trace file before the work; every rank learns whether it could.
    std::optional<OutputFile> trace_out;
    if (!opts.trace.empty())
      if (const int code =
              on_rank0_first(comm, opts.json, [&] { trace_out.emplace("--trace", opts.trace); }))
        return code;
    Report report;
    if (!opts.trace.empty()) trace::start();
    run_rank(comm, run, &report, trace_out ? &*trace_out : nullptr);
    return comm.rank() == 0 ? finish_report(run, report, "mpi") : 0;
  });
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
