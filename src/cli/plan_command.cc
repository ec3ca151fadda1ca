// seqpar plan: which parallel layout to use, before anything runs.
//
//   seqpar plan --model wan2.1-t2v-14b --height 240 --width 432 --frames 33 --ranks 8
//   seqpar plan --model llama3-405b --ranks 4 --cached 124800 --new 3200
//   seqpar plan --seq 16384 --heads 8 --head-dim 128 --ranks 4 --hardware local   (one attention)
//   seqpar plan ... --simulate [--sim-ranks 8:1024] [--svg FILE]
//
// Prints the sequence length and whether it divides, the ranked meshes with their predicted step
// time, bytes and memory per rank, the rejected ones with the reason, the pass-KV / pass-Q choice
// for --cached/--new, and the scaling simulation; or one JSON object with --json.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "commands.h"
#include "seqpar/core/error.h"
#include "seqpar/model/presets.h"
#include "seqpar/plan/plan_spec.h"
#include "seqpar/plan/planner.h"
#include "seqpar/plan/simulate.h"

namespace seqpar::cli {

namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// 3 significant digits in s, ms or us.
std::string seconds_text(double s) {
  if (s >= 1) return fmt("%.3g s", s);
  if (s >= 1e-3) return fmt("%.3g ms", s * 1e3);
  return fmt("%.3g us", s * 1e6);
}

std::string rate_text(double flops) {
  return flops >= 1e12 ? fmt("%.4g TFLOP/s", flops / 1e12) : fmt("%.4g GFLOP/s", flops / 1e9);
}
std::string bw_text(double b) { return fmt("%.4g GB/s", b / 1e9); }

// The flags as the library's planning question; --top, --simulate, --sim-ranks, --svg and --json
// are the command's own.
ResolvedPlanSpec resolve(const PlanOptions& o) {
  limits::check_range("--top", o.top, 0, limits::kMaxRanks);
  SEQPAR_ARG_CHECK(!(o.pad && o.no_pad), "--pad and --no-pad contradict each other");
  PlanSpec spec;
  spec.model = o.model;
  spec.frames = o.frames;
  spec.height = o.height;
  spec.width = o.width;
  spec.seq = o.seq;
  spec.heads = o.heads;
  spec.kv_heads = o.kv_heads;
  spec.head_dim = o.head_dim;
  spec.batch = o.batch;
  spec.causal = o.causal;
  spec.text_tokens = o.text_tokens;
  spec.guidance = !o.no_guidance;
  spec.ranks = o.ranks;
  spec.ranks_per_node = o.ranks_per_node;
  spec.memory_limit_gb = o.memory_limit_gb;
  spec.dtype = o.dtype;
  spec.cfg = o.cfg;
  spec.tp = o.tp;
  spec.sequence_parallel_size = o.sequence_parallel_size;
  spec.ulysses_degree = o.ulysses_degree;
  spec.ring_degree = o.ring_degree;
  spec.strategy = o.strategy;
  spec.layout = o.layout;
  spec.ulysses_mode = o.ulysses_mode;
  spec.softmax = o.softmax;
  spec.schedule = o.schedule;
  if (o.pad) spec.pad = true;
  if (o.no_pad) spec.pad = false;
  spec.cached = o.cached;
  spec.fresh = o.fresh;
  return resolve_plan_spec(spec, load_profile_checked(o.hardware));
}

// The simulation replays every size up to LAST: at most kMaxSimRanks (each size costs its meshes).
constexpr int64_t kMaxSimRanks = int64_t{1} << 13;

std::vector<int> parse_sizes(const std::string& s) {
  const auto colon = s.find(':');
  const std::optional<int64_t> first = limits::parse_int64(s.substr(0, colon));
  const std::optional<int64_t> last =
      colon == std::string::npos ? first : limits::parse_int64(s.substr(colon + 1));
  SEQPAR_ARG_CHECK(first && last, "--sim-ranks '", s, "' is invalid; give FIRST:LAST, e.g. 8:1024");
  SEQPAR_ARG_CHECK(*first >= 1 && *last >= *first && *last <= kMaxSimRanks, "--sim-ranks '", s,
                   "' is invalid; give FIRST:LAST with 1 <= FIRST <= LAST <= ",
                   limits::max_text(kMaxSimRanks), ", e.g. 8:1024");
  return doubling_sizes(static_cast<int>(*first), static_cast<int>(*last));
}

// ---- text -------------------------------------------------------------------------------------

std::string strategy_cell(const ParallelConfig& m) {
  std::string s(strategy_name(m.strategy));
  if (m.strategy == Strategy::kUlysses || m.strategy == Strategy::kUsp)
    s += detail::concat("(", ulysses_mode_name(m.ulysses_mode), ")");
  if (m.softmax == SoftmaxMode::kConstMax) s += " const-max";
  if (m.schedule != ScheduleKind::kDefault)
    s += detail::concat(" ", schedule_kind_name(m.schedule));
  return s;
}

void print_mesh_row(int idx, const MeshCost& c, int same) {
  uint64_t bytes = 0;
  for (const auto& r : c.ranks) bytes = std::max<uint64_t>(bytes, std::max(r.sent, r.recv));
  bytes += c.tp_bytes;
  const double compute_frac = c.layer_s > 0 ? c.compute_s / c.layer_s : 1;
  std::printf(
      "  %-4d %3d %3d %4d %4d  %-14s %-10s %-3s %10s %10s %7.0f%% %7.0f%% %10.3g %8.1f %6.2f %5s\n",
      idx, c.config.mesh.cfg, c.config.mesh.tp, c.config.mesh.ulysses, c.config.mesh.ring, strategy_cell(c.config).c_str(),
      std::string(layout_name(c.config.layout)).c_str(), c.config.pad ? "yes" : "-",
      seconds_text(c.step_s).c_str(), seconds_text(c.layer_s).c_str(), 100 * compute_frac,
      100 * (1 - compute_frac), bytes / 1e6, c.memory_bytes / 1e9, c.work_imbalance,
      same > 0 ? ("+" + std::to_string(same)).c_str() : "");
}

// Rows the table folds into the one above: the same degrees and strategy within 0.1% of its
// predicted time and memory (layouts of a non-causal model, a few padding tokens, strict vs uaa).
bool equivalent(const MeshCost& a, const MeshCost& b) {
  return a.config.mesh.cfg == b.config.mesh.cfg && a.config.mesh.tp == b.config.mesh.tp && a.config.mesh.ulysses == b.config.mesh.ulysses &&
         a.config.mesh.ring == b.config.mesh.ring && a.config.strategy == b.config.strategy &&
         std::fabs(a.step_s - b.step_s) <= 1e-3 * b.step_s &&
         std::fabs(a.memory_bytes - b.memory_bytes) <= 1e-3 * b.memory_bytes;
}

void print_text(const ResolvedPlanSpec& r, const Plan& plan, const Simulation* sim, int top) {
  const PlanRequest& req = r.req;
  const Workload& w = req.work;
  const HardwareProfile& hw = req.hw;
  if (w.attention_only) {
    std::printf(
        "seqpar plan: one attention call, S = %lld tokens, %lld heads (%lld kv) x %lld, "
        "batch %lld, %s, %s\n",
        (long long)w.seq, (long long)w.heads, (long long)w.kv_heads, (long long)w.head_dim,
        (long long)w.batch, w.causal ? "causal" : "non-causal",
        std::string(dtype_name(w.dtype)).c_str());
  } else if (r.latent) {
    const LatentShape& l = *r.latent;
    if (req.preset != nullptr && req.preset->video)
      std::printf(
          "seqpar plan: %s (%s), %lld frames x %lld x %lld -> latent %lld x %lld x %lld "
          "-> %lld x %lld x %lld patches = %lld tokens\n",
          w.model.c_str(), std::string(model_family_name(w.family)).c_str(), (long long)req.frames,
          (long long)req.height, (long long)req.width, (long long)l.latent_frames,
          (long long)l.latent_height, (long long)l.latent_width, (long long)l.grid[0],
          (long long)l.grid[1], (long long)l.grid[2], (long long)l.tokens);
    else
      std::printf(
          "seqpar plan: %s (%s), %lld x %lld -> latent %lld x %lld -> %lld x %lld "
          "patches = %lld tokens\n",
          w.model.c_str(), std::string(model_family_name(w.family)).c_str(), (long long)req.height,
          (long long)req.width, (long long)l.latent_height, (long long)l.latent_width,
          (long long)l.grid[1], (long long)l.grid[2], (long long)l.tokens);
  } else {
    std::printf("seqpar plan: %s (%s), %lld tokens\n", w.model.c_str(),
                std::string(model_family_name(w.family)).c_str(), (long long)w.seq);
  }
  if (!w.attention_only) {
    std::printf(
        "  model: %lld layers, %lld heads (%lld kv) x %lld, hidden %lld, ffn %lld, "
        "batch %lld",
        (long long)w.layers, (long long)w.heads, (long long)w.kv_heads, (long long)w.head_dim,
        (long long)w.hidden, (long long)w.ffn_dim, (long long)w.batch);
    if (w.cfg_branches > 1) std::printf(" x %d guidance branches", w.cfg_branches);
    if (w.cross_tokens > 0)
      std::printf(", %lld text tokens (cross-attention)", (long long)w.cross_tokens);
    if (w.text_tokens > 0)
      std::printf(", %lld text tokens (joint attention)", (long long)w.text_tokens);
    std::printf(", %s%s\n", std::string(dtype_name(w.dtype)).c_str(), w.causal ? ", causal" : "");
  }
  std::printf("  hardware: %s (%s): %s attention per %s, ", hw.name.c_str(), hw.source.c_str(),
              rate_text(hw.attention_flops).c_str(), hw.shared_node ? "core" : "rank");
  if (hw.ranks_per_node > 0)
    std::printf("%d ranks per node, %s inside, %s between nodes", hw.ranks_per_node,
                bw_text(hw.intra_node_bw).c_str(), bw_text(hw.inter_node_bw).c_str());
  else
    std::printf("all ranks on one node, %s between ranks", bw_text(hw.intra_node_bw).c_str());
  std::printf(", %.4g GB per %s\n", hw.memory_bytes / 1e9, hw.shared_node ? "node" : "rank");
  std::printf("  world: %d ranks\n\n", req.world);

  const Divisibility& d = plan.divisibility;
  if (d.remainder == 0) {
    std::printf(
        "sequence length S = %lld; sequence-parallel size %d: %lld %% %d = 0, every rank "
        "holds %lld tokens\n",
        (long long)d.seq, d.sp, (long long)d.seq, d.sp, (long long)d.shard_floor);
  } else {
    std::printf(
        "sequence length S = %lld; sequence-parallel size %d: %lld %% %d = %lld, the "
        "tokens do not divide\n",
        (long long)d.seq, d.sp, (long long)d.seq, d.sp, (long long)d.remainder);
    std::printf("  ways out:\n");
    std::printf(
        "    uneven shards: %d rank%s %lld tokens, %d %s %lld (imbalance %.4f); "
        "ring and allgather take them, ulysses and usp in uaa mode\n",
        d.ranks_with_ceil, d.ranks_with_ceil == 1 ? " holds" : "s hold", (long long)d.shard_ceil,
        d.sp - d.ranks_with_ceil, d.sp - d.ranks_with_ceil == 1 ? "holds" : "hold",
        (long long)d.shard_floor, d.shard_imbalance);
    std::printf(
        "    padding (--pad): to %lld tokens (+%lld, %.2f%% more tokens, %.2f%% more "
        "attention work); zigzag pads to %lld; strict ulysses needs it\n",
        (long long)d.padded_seq, (long long)(d.padded_seq - d.seq), 100 * d.pad_token_overhead,
        100 * d.pad_work_overhead, (long long)d.padded_seq_zigzag);
    if (!d.alternatives.empty()) {
      std::printf("    nearest shapes that divide by %d:", d.sp);
      for (size_t i = 0; i < d.alternatives.size(); ++i)
        std::printf("%s %s %lld (S = %lld)", i ? "," : "", d.alternatives[i].flag.c_str(),
                    (long long)d.alternatives[i].value, (long long)d.alternatives[i].tokens);
      std::printf("\n");
    }
  }

  if (plan.decode) {
    const DecodeChoice& c = *plan.decode;
    std::printf(
        "\ndecode / partial prefill: T = %lld new tokens over P = %lld cached, %d "
        "sequence-parallel ranks (C = %s per rank, BW = %s between nodes)\n",
        (long long)w.fresh, (long long)w.cached, c.ranks, rate_text(c.flops_per_s).c_str(),
        bw_text(c.bytes_per_s).c_str());
    std::printf("  Meta's rule:           %s\n", c.basic.reason.c_str());
    std::printf("  All2All-aware variant: %s\n", c.all2all.reason.c_str());
    std::printf("  choice: %s (threshold %.0f tokens)", std::string(strategy_name(c.choice)).c_str(),
                c.all2all.threshold_tokens);
    if (c.passkv_step_s && c.passq_step_s && c.passq_ring_step_s)
      std::printf(
          "\n  cost model: passkv %s, passq ring %s, passq (all-gathered queries) %s per step",
          seconds_text(*c.passkv_step_s).c_str(), seconds_text(*c.passq_ring_step_s).c_str(),
          seconds_text(*c.passq_step_s).c_str());
    std::printf("\n");
  }

  const size_t total = plan.ranked.size() + plan.over_memory.size() + plan.rejected.size();
  std::printf(
      "\nmeshes: %zu of %zu fit %s per rank", plan.ranked.size(), total,
      plan.ranked.empty() && plan.over_memory.empty()
          ? "the limit"
          : fmt("%.4g GB", (plan.ranked.empty() ? plan.over_memory.front() : plan.ranked.front())
                                   .memory_limit /
                               1e9)
                .c_str());
  std::printf(", %zu over it, %zu cannot run; predicted per step, fastest first",
              plan.over_memory.size(), plan.rejected.size());
  // Fold equivalent rows.
  std::vector<std::pair<size_t, int>> rows;  // (index, equivalents folded into it)
  for (size_t i = 0; i < plan.ranked.size(); ++i) {
    if (!rows.empty() && equivalent(plan.ranked[rows.back().first], plan.ranked[i]))
      ++rows.back().second;
    else
      rows.push_back({i, 0});
  }
  if (top > 0 && rows.size() > static_cast<size_t>(top))
    std::printf(" (%d of %zu distinct; --top 0 for all)", top, rows.size());
  std::printf("\n  %-4s %3s %3s %4s %4s  %-14s %-10s %-3s %10s %10s %8s %8s %10s %8s %6s %5s\n",
              "#", "cfg", "tp", "ulys", "ring", "strategy", "layout", "pad", "step", "layer",
              "compute", "exposed", "MB/rank/L", "mem GB", "imbal", "same");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (top > 0 && i >= static_cast<size_t>(top)) break;
    print_mesh_row(static_cast<int>(rows[i].first + 1), plan.ranked[rows[i].first], rows[i].second);
  }
  if (std::any_of(rows.begin(), rows.end(), [](const auto& r) { return r.second > 0; }))
    std::printf(
        "  (same: meshes folded into the row: other layouts, padding or Ulysses modes "
        "within 0.1%% of its time and memory; --json lists every one)\n");
  if (!plan.ranked.empty()) {
    const MeshCost& b = plan.ranked.front();
    std::printf("\nbest: %s: %s per step (%s per layer x %lld layers), critical rank %d:\n",
                config_label(b.config).c_str(), seconds_text(b.step_s).c_str(),
                seconds_text(b.layer_s).c_str(), (long long)(w.attention_only ? 1 : w.layers),
                b.critical_rank);
    const RankCost& cr = b.ranks[b.critical_rank];
    std::printf(
        "  per layer: %.4g GFLOP attention, %.4g GFLOP linear; compute %s, "
        "communication %s of which %s exposed\n",
        cr.attention_flops / 1e9, cr.linear_flops / 1e9, seconds_text(b.compute_s).c_str(),
        seconds_text(b.comm_s).c_str(), seconds_text(b.exposed_comm_s).c_str());
    for (const auto& c : b.collectives)
      std::printf("    %-11s %-16s in %-7s %12llu B sent %12llu B recv  x%-4lld %s%s %s\n",
                  c.op.c_str(), c.what.c_str(), c.group.c_str(), (unsigned long long)c.sent,
                  (unsigned long long)c.recv, (long long)c.calls,
                  c.inter_node ? "inter-node" : "intra-node", c.overlapped ? ", overlapped" : "",
                  seconds_text(c.seconds).c_str());
    std::printf(
        "  memory per rank: %.2f GB weights + %.2f GB KV cache + %.2f GB activations "
        "(K/V peak %.3g MB) = %.2f GB of %.4g GB\n",
        b.weight_bytes / 1e9, b.kv_cache_bytes / 1e9, b.activation_bytes / 1e9,
        cr.peak_kv_bytes / 1e6, b.memory_bytes / 1e9, b.memory_limit / 1e9);
  }
  if (!plan.over_memory.empty()) {
    std::printf("\nover the memory limit (%zu), smallest first:\n", plan.over_memory.size());
    const size_t n =
        top > 0 ? std::min<size_t>(top, plan.over_memory.size()) : plan.over_memory.size();
    for (size_t i = 0; i < n; ++i) {
      const MeshCost& c = plan.over_memory[i];
      std::printf("  %-60s needs %.1f GB > %.1f GB\n", config_label(c.config).c_str(), c.memory_bytes / 1e9,
                  c.memory_limit / 1e9);
    }
  }
  if (!plan.rejected.empty()) {
    std::printf("\ncannot run (%zu):\n", plan.rejected.size());
    for (const auto& x : plan.rejected) {
      std::string what;
      if (x.config.mesh.ulysses == 0) {
        what = detail::concat("cfg ", x.config.mesh.cfg, " tp ", x.config.mesh.tp, " (any split)");
      } else {
        ParallelConfig m = x.config;
        what = config_label(m);
        if (x.any_layout) {
          const std::string lay(layout_name(m.layout));
          const auto pos = what.find(lay);
          if (pos != std::string::npos) what.replace(pos, lay.size(), "any layout");
        }
      }
      std::printf("  %-60s %s\n", what.c_str(), x.reason.c_str());
    }
  }
  if (plan.decode && plan.ranked.empty())
    std::printf("\nwarning: no mesh fits the memory limit; the pass choice above still holds\n");

  if (sim) {
    std::printf("\nsimulation: %s, %s layout, sequence-parallel sizes %d..%d",
                sim->hardware.c_str(), std::string(layout_name(sim->layout)).c_str(),
                sim->sizes.front(), sim->sizes.back());
    if (sim->ranks_per_node > 0) std::printf(", %d ranks per node", sim->ranks_per_node);
    std::printf("\n  %-6s", "ranks");
    for (const auto& c : sim->curves)
      std::printf(" %22s", (std::string(strategy_name(c.strategy)) + " step (exp)").c_str());
    std::printf("\n");
    for (size_t i = 0; i < sim->sizes.size(); ++i) {
      std::printf("  %-6d", sim->sizes[i]);
      for (const auto& c : sim->curves) {
        const SimPoint& p = c.points[i];
        if (!p.valid)
          std::printf(" %22s", "-");
        else
          std::printf(" %22s", (seconds_text(p.step_s) + " (" +
                                fmt("%.0f%%", 100 * p.exposed_fraction) + ")")
                                   .c_str());
      }
      std::printf("\n");
    }
    for (const auto& f : sim->findings) std::printf("  %s\n", f.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

void add_plan_command(CLI::App& app, PlanOptions& o) {
  CLI::App* p = app.add_subcommand(
      "plan", "Rank every parallel layout of a model (or one attention call) by predicted time");
  p->add_option("--model", o.model, "model preset (see seqpar plan --help); none: --seq/--heads");
  p->add_option("--frames", o.frames, "dit: video frames (4k+1)");
  p->add_option("--height", o.height, "dit/mmdit: height in pixels");
  p->add_option("--width", o.width, "dit/mmdit: width in pixels");
  p->add_option("--seq", o.seq, "tokens: llm prompt, bare attention, or dit tokens directly");
  p->add_option("--heads", o.heads, "bare attention: query heads");
  p->add_option("--kv-heads,--kv_heads", o.kv_heads, "bare attention: kv heads (default heads)");
  p->add_option("--head-dim,--head_dim", o.head_dim, "bare attention: head dimension");
  p->add_option("--batch", o.batch, "batch size");
  p->add_flag("--causal", o.causal, "bare attention: causal mask");
  p->add_option_function<int64_t>(
      "--text-tokens,--text_tokens", [&o](int64_t v) { o.text_tokens = v; },
      "mmdit: text tokens in the joint attention (default the preset's)");
  p->add_flag("--no-guidance,--no_guidance", o.no_guidance,
              "dit/mmdit: one branch (no classifier-free guidance)");
  p->add_option("--ranks", o.ranks, "world size (at most 2^16)");
  p->add_option("--hardware", o.hardware,
                "profile: h100 | h200 | cpu-ethernet | local | a path to a JSON profile");
  p->add_option_function<int64_t>(
      "--ranks-per-node,--ranks_per_node", [&o](int64_t v) { o.ranks_per_node = v; },
      "override the profile's ranks per node (0: one node)");
  p->add_option("--memory-limit,--memory_limit", o.memory_limit_gb,
                "GB per rank (default: the profile's)");
  p->add_option("--dtype", o.dtype, "fp32 | bf16 | fp16 (default: the profile's)");
  p->add_option("--cfg,--cfg-parallel-size,--cfg_parallel_size", o.cfg, "pin the cfg degree (1 or 2)");
  p->add_option("--tp,--tensor-parallel-size,--tensor_parallel_size", o.tp, "pin the tensor-parallel degree");
  p->add_option("--sequence-parallel-size,--sequence_parallel_size", o.sequence_parallel_size,
                "pin ulysses_degree x ring_degree (any split)");
  p->add_option("--ulysses-degree,--ulysses_degree", o.ulysses_degree, "pin the ulysses degree");
  p->add_option("--ring-degree,--ring_degree", o.ring_degree, "pin the ring degree");
  p->add_option("--strategy", o.strategy,
                "pin: allgather | ring | ulysses | usp | passkv | passq | local");
  p->add_option("--layout", o.layout, "pin: contiguous | striped | zigzag");
  p->add_option("--ulysses-mode,--ulysses_mode", o.ulysses_mode, "pin: strict | uaa");
  p->add_option("--softmax", o.softmax,
                "online (default) | const-max: plan ring and usp with the const-max softmax");
  p->add_option("--schedule", o.schedule,
                "pin: default | steal (ring, causal, contiguous: work stealing) | ring (passq's "
                "ring of Q blocks); unset: every schedule that applies");
  p->add_flag("--pad", o.pad, "only padded meshes");
  p->add_flag("--no-pad,--no_pad", o.no_pad, "only unpadded meshes");
  p->add_option("--cached", o.cached, "llm decode / partial prefill: cached tokens P");
  p->add_option("--new", o.fresh, "llm decode / partial prefill: new tokens T");
  p->add_flag("--json", o.json, "print one JSON object");
  p->add_option("--top", o.top, "meshes to print (0: all)");
  p->add_flag("--simulate", o.simulate, "replay ring/ulysses/usp/allgather at growing sizes");
  p->add_option("--sim-ranks,--sim_ranks", o.sim_ranks, "simulation sizes FIRST:LAST (doubling)");
  p->add_option("--svg", o.svg, "write the simulation's step time vs ranks as an SVG file");
  guard_integer_options(p);
}

namespace {

int run_plan(const PlanOptions& o) {
  const ResolvedPlanSpec r = resolve(o);
  std::vector<int> sizes;
  if (o.simulate || !o.svg.empty()) sizes = parse_sizes(o.sim_ranks);
  std::optional<OutputFile> svg;
  if (!o.svg.empty()) svg.emplace("--svg", o.svg);
  const Plan plan = make_plan(r.req);
  std::optional<Simulation> sim;
  if (!sizes.empty()) {
    const Layout layout =
        r.req.layout.value_or(r.req.work.causal ? Layout::kZigzag : Layout::kContiguous);
    sim = simulate_scaling(r.req.work, r.req.hw, sizes, layout, r.req.cfg > 0 ? r.req.cfg : 1,
                           r.req.tp > 0 ? r.req.tp : 1);
    if (svg)
      svg->write(simulation_svg(
          *sim, detail::concat(r.req.work.model, ", S = ", r.req.work.seq, " tokens, ",
                               r.req.hw.name, ": predicted step time")));
  }
  if (o.json)
    std::printf("%s\n", plan_json(r, plan, sim ? &*sim : nullptr, static_cast<int>(o.top)).c_str());
  else
    print_text(r, plan, sim ? &*sim : nullptr, static_cast<int>(o.top));
  return finish_output(0);
}

}  // namespace

int plan_command(const PlanOptions& o) {
  return with_json_errors(o.json, [&] { return run_plan(o); });
}

}  // namespace seqpar::cli
