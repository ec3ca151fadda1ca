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
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "progress.h"
#include "seqpar/core/error.h"
#include "seqpar/model/presets.h"
#include "seqpar/parallel/strategy_table.h"
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

// ---- text: a rendering of the JSON object ---------------------------------------------------

using nlohmann::json;

long long i64(const json& v) { return v.get<long long>(); }
// JSON writes a number that is not finite as null.
double f64(const json& v) { return v.is_null() ? std::nan("") : v.get<double>(); }
const char* str(const json& v) { return v.get_ref<const std::string&>().c_str(); }

// "ring", "ulysses(uaa)", "usp(strict) const-max", "ring steal": the strategy and the options
// that apply to it.
std::string strategy_cell(const json& m) {
  std::string s = m["strategy"];
  if (!m["ulysses_mode"].is_null()) s += detail::concat("(", str(m["ulysses_mode"]), ")");
  if (m["softmax"] == "const-max") s += " const-max";
  if (m["schedule"] != "default") s += detail::concat(" ", str(m["schedule"]));
  return s;
}

double mesh_bytes_per_rank(const json& m) {
  return static_cast<double>(std::max(m["max_bytes_sent_per_rank"].get<uint64_t>(),
                                      m["max_bytes_recv_per_rank"].get<uint64_t>()) +
                             m["tp_all_reduce_bytes"].get<uint64_t>());
}

void print_mesh_row(const json& m, int same) {
  const double layer = f64(m["layer_seconds"]);
  const double compute_frac = layer > 0 ? f64(m["compute_seconds"]) / layer : 1;
  std::printf(
      "  %-4lld %3lld %3lld %4lld %4lld  %-14s %-10s %-3s %10s %10s %7.0f%% %7.0f%% %10.3g %8.1f "
      "%6.2f %5s\n",
      i64(m["rank"]), i64(m["cfg"]), i64(m["tp"]), i64(m["ulysses_degree"]), i64(m["ring_degree"]),
      strategy_cell(m).c_str(), str(m["layout"]), m["pad"].get<bool>() ? "yes" : "-",
      seconds_text(f64(m["step_seconds"])).c_str(), seconds_text(layer).c_str(), 100 * compute_frac,
      100 * (1 - compute_frac), mesh_bytes_per_rank(m) / 1e6, f64(m["memory_bytes"]) / 1e9,
      f64(m["work_imbalance"]), same > 0 ? ("+" + std::to_string(same)).c_str() : "");
}

// Rows the table folds into the one above: the same degrees and strategy within 0.1% of its
// predicted time and memory (layouts of a non-causal model, a few padding tokens, strict vs uaa).
bool equivalent(const json& a, const json& b) {
  for (const char* k : {"cfg", "tp", "ulysses_degree", "ring_degree", "strategy"})
    if (a[k] != b[k]) return false;
  const double sa = f64(a["step_seconds"]), sb = f64(b["step_seconds"]);
  const double ma = f64(a["memory_bytes"]), mb = f64(b["memory_bytes"]);
  return std::fabs(sa - sb) <= 1e-3 * sb && std::fabs(ma - mb) <= 1e-3 * mb;
}

void print_workload(const json& j) {
  if (j["family"] == "attention") {
    std::printf(
        "seqpar plan: one attention call, S = %lld tokens, %lld heads (%lld kv) x %lld, "
        "batch %lld, %s, %s\n",
        i64(j["seq_len"]), i64(j["heads"]), i64(j["kv_heads"]), i64(j["head_dim"]), i64(j["batch"]),
        j["causal"].get<bool>() ? "causal" : "non-causal", str(j["dtype"]));
    return;
  }
  if (j.contains("latent")) {
    const json &l = j["latent"], &g = j["patch_grid"];
    if (j["video"].get<bool>())
      std::printf(
          "seqpar plan: %s (%s), %lld frames x %lld x %lld -> latent %lld x %lld x %lld "
          "-> %lld x %lld x %lld patches = %lld tokens\n",
          str(j["model"]), str(j["family"]), i64(j["frames"]), i64(j["height"]), i64(j["width"]),
          i64(l[0]), i64(l[1]), i64(l[2]), i64(g[0]), i64(g[1]), i64(g[2]), i64(j["seq_len"]));
    else
      std::printf(
          "seqpar plan: %s (%s), %lld x %lld -> latent %lld x %lld -> %lld x %lld "
          "patches = %lld tokens\n",
          str(j["model"]), str(j["family"]), i64(j["height"]), i64(j["width"]), i64(l[1]),
          i64(l[2]), i64(g[1]), i64(g[2]), i64(j["seq_len"]));
  } else {
    std::printf("seqpar plan: %s (%s), %lld tokens\n", str(j["model"]), str(j["family"]),
                i64(j["seq_len"]));
  }
  std::printf(
      "  model: %lld layers, %lld heads (%lld kv) x %lld, hidden %lld, ffn %lld, batch %lld",
      i64(j["layers"]), i64(j["heads"]), i64(j["kv_heads"]), i64(j["head_dim"]), i64(j["hidden"]),
      i64(j["ffn_dim"]), i64(j["batch"]));
  if (i64(j["guidance_branches"]) > 1)
    std::printf(" x %lld guidance branches", i64(j["guidance_branches"]));
  if (i64(j["cross_tokens"]) > 0)
    std::printf(", %lld text tokens (cross-attention)", i64(j["cross_tokens"]));
  if (i64(j["text_tokens"]) > 0)
    std::printf(", %lld text tokens (joint attention)", i64(j["text_tokens"]));
  std::printf(", %s%s\n", str(j["dtype"]), j["causal"].get<bool>() ? ", causal" : "");
}

void print_hardware(const json& hw, long long world) {
  const bool shared = hw["shared_node"].get<bool>();
  std::printf("  hardware: %s (%s): %s attention per %s, ", str(hw["name"]), str(hw["source"]),
              rate_text(f64(hw["attention_flops"])).c_str(), shared ? "core" : "rank");
  if (i64(hw["ranks_per_node"]) > 0)
    std::printf("%lld ranks per node, %s inside, %s between nodes", i64(hw["ranks_per_node"]),
                bw_text(f64(hw["intra_node_bw"])).c_str(),
                bw_text(f64(hw["inter_node_bw"])).c_str());
  else
    std::printf("all ranks on one node, %s between ranks",
                bw_text(f64(hw["intra_node_bw"])).c_str());
  std::printf(", %.4g GB per %s\n", f64(hw["memory_bytes"]) / 1e9, shared ? "node" : "rank");
  std::printf("  world: %lld ranks\n\n", world);
}

void print_divisibility(const json& j) {
  const json& d = j["divisibility"];
  const long long seq = i64(j["seq_len"]), sp = i64(j["sequence_parallel_size"]);
  if (d["divides"].get<bool>()) {
    std::printf(
        "sequence length S = %lld; sequence-parallel size %lld: %lld %% %lld = 0, every rank "
        "holds %lld tokens\n",
        seq, sp, seq, sp, i64(d["shard_floor"]));
    return;
  }
  std::printf(
      "sequence length S = %lld; sequence-parallel size %lld: %lld %% %lld = %lld, the "
      "tokens do not divide\n",
      seq, sp, seq, sp, i64(j["remainder"]));
  std::printf("  ways out:\n");
  const long long ceil_ranks = i64(d["ranks_with_ceil"]);
  std::printf(
      "    uneven shards: %lld rank%s %lld tokens, %lld %s %lld (imbalance %.4f); "
      "ring and allgather take them, ulysses and usp in uaa mode\n",
      ceil_ranks, ceil_ranks == 1 ? " holds" : "s hold", i64(d["shard_ceil"]), sp - ceil_ranks,
      sp - ceil_ranks == 1 ? "holds" : "hold", i64(d["shard_floor"]), f64(d["shard_imbalance"]));
  std::printf(
      "    padding (--pad): to %lld tokens (+%lld, %.2f%% more tokens, %.2f%% more "
      "attention work); zigzag pads to %lld; strict ulysses needs it\n",
      i64(d["padded_seq"]), i64(d["padded_seq"]) - seq, 100 * f64(d["pad_token_overhead"]),
      100 * f64(d["pad_work_overhead"]), i64(d["padded_seq_zigzag"]));
  const json& alts = d["alternatives"];
  if (alts.empty()) return;
  std::printf("    nearest shapes that divide by %lld:", sp);
  for (size_t i = 0; i < alts.size(); ++i)
    std::printf("%s --%s %lld (S = %lld)", i ? "," : "", str(alts[i]["parameter"]),
                i64(alts[i]["value"]), i64(alts[i]["seq_len"]));
  std::printf("\n");
}

void print_decode(const json& j) {
  const json& c = j["decode"];
  std::printf(
      "\ndecode / partial prefill: T = %lld new tokens over P = %lld cached, %lld "
      "sequence-parallel ranks (C = %s per rank, BW = %s between nodes)\n",
      i64(j["new"]), i64(j["cached"]), i64(c["ranks"]), rate_text(f64(c["flops_per_s"])).c_str(),
      bw_text(f64(c["bytes_per_s"])).c_str());
  std::printf("  Meta's rule:           %s\n", str(c["meta_rule"]["reason"]));
  std::printf("  All2All-aware variant: %s\n", str(c["all2all_rule"]["reason"]));
  std::printf("  choice: %s (threshold %.0f tokens)", str(j["choice"]), f64(j["threshold_tokens"]));
  const json &kv = c["passkv_step_seconds"], &q = c["passq_step_seconds"],
             &qr = c["passq_ring_step_seconds"];
  if (!kv.is_null() && !q.is_null() && !qr.is_null())
    std::printf(
        "\n  cost model: passkv %s, passq ring %s, passq (all-gathered queries) %s per step",
        seconds_text(f64(kv)).c_str(), seconds_text(f64(qr)).c_str(), seconds_text(f64(q)).c_str());
  std::printf("\n");
}

void print_meshes(const json& j, int top) {
  const json &ranked = j["meshes"], &over = j["over_memory"], &rejected = j["rejected"];
  const double limit = j["memory_limit_bytes"].is_null() ? 0 : f64(j["memory_limit_bytes"]);
  std::printf(
      "\nmeshes: %zu of %zu fit %s per rank", ranked.size(),
      ranked.size() + over.size() + rejected.size(),
      j["memory_limit_bytes"].is_null() ? "the limit" : fmt("%.4g GB", limit / 1e9).c_str());
  std::printf(", %zu over it, %zu cannot run; predicted per step, fastest first", over.size(),
              rejected.size());
  // Fold equivalent rows.
  std::vector<std::pair<size_t, int>> rows;  // (index, equivalents folded into it)
  for (size_t i = 0; i < ranked.size(); ++i) {
    if (!rows.empty() && equivalent(ranked[rows.back().first], ranked[i]))
      ++rows.back().second;
    else
      rows.push_back({i, 0});
  }
  if (top > 0 && rows.size() > static_cast<size_t>(top))
    std::printf(" (%d of %zu distinct; --top 0 for all)", top, rows.size());
  std::printf("\n  %-4s %3s %3s %4s %4s  %-14s %-10s %-3s %10s %10s %8s %8s %10s %8s %6s %5s\n",
              "#", "cfg", "tp", "ulys", "ring", "strategy", "layout", "pad", "step", "layer",
              "compute", "exposed", "MB/rank/L", "mem GB", "imbal", "same");
  for (size_t i = 0; i < rows.size() && (top == 0 || i < static_cast<size_t>(top)); ++i)
    print_mesh_row(ranked[rows[i].first], rows[i].second);
  if (std::any_of(rows.begin(), rows.end(), [](const auto& r) { return r.second > 0; }))
    std::printf(
        "  (same: meshes folded into the row: other layouts, padding or Ulysses modes "
        "within 0.1%% of its time and memory; --json lists every one)\n");
  if (!ranked.empty()) {
    const json& b = ranked[0];
    const long long crit = i64(b["critical_rank"]);
    std::printf("\nbest: %s: %s per step (%s per layer x %lld layers), critical rank %lld:\n",
                str(b["label"]), seconds_text(f64(b["step_seconds"])).c_str(),
                seconds_text(f64(b["layer_seconds"])).c_str(), i64(j["layers"]), crit);
    std::printf(
        "  per layer: %.4g GFLOP attention, %.4g GFLOP linear; compute %s, "
        "communication %s of which %s exposed\n",
        f64(b["attention_flops_per_layer"]) / 1e9, f64(b["linear_flops_per_layer"]) / 1e9,
        seconds_text(f64(b["compute_seconds"])).c_str(),
        seconds_text(f64(b["comm_seconds"])).c_str(),
        seconds_text(f64(b["exposed_comm_seconds"])).c_str());
    for (const json& c : b["collectives"])
      std::printf("    %-11s %-16s in %-7s %12llu B sent %12llu B recv  x%-4lld %s%s %s\n",
                  str(c["op"]), str(c["what"]), str(c["group"]),
                  c["sent"].get<unsigned long long>(), c["recv"].get<unsigned long long>(),
                  i64(c["calls"]), c["inter_node"].get<bool>() ? "inter-node" : "intra-node",
                  c["overlapped"].get<bool>() ? ", overlapped" : "",
                  seconds_text(f64(c["seconds"])).c_str());
    const json& mem = b["memory"];
    std::printf(
        "  memory per rank: %.2f GB weights + %.2f GB KV cache + %.2f GB activations "
        "(K/V peak %.3g MB) = %.2f GB of %.4g GB\n",
        f64(mem["weights"]) / 1e9, f64(mem["kv_cache"]) / 1e9, f64(mem["activations"]) / 1e9,
        f64(b["peak_kv_bytes_per_rank"][crit]) / 1e6, f64(mem["total"]) / 1e9,
        f64(mem["limit"]) / 1e9);
  }
  if (!over.empty()) {
    std::printf("\nover the memory limit (%zu), smallest first:\n", over.size());
    for (size_t i = 0; i < over.size() && (top == 0 || i < static_cast<size_t>(top)); ++i)
      std::printf("  %-60s %s\n", str(over[i]["label"]), str(over[i]["reason"]));
  }
  if (!rejected.empty()) {
    std::printf("\ncannot run (%zu):\n", rejected.size());
    for (const json& x : rejected) std::printf("  %-60s %s\n", str(x["label"]), str(x["reason"]));
  }
  if (j.contains("warning")) std::printf("\nwarning: %s\n", str(j["warning"]));
}

void print_simulation(const json& sim, const json& hw) {
  const json& sizes = sim["sizes"];
  std::printf("\nsimulation: %s, %s layout, sequence-parallel sizes %lld..%lld", str(hw["name"]),
              str(sim["layout"]), i64(sizes.front()), i64(sizes.back()));
  if (i64(sim["ranks_per_node"]) > 0)
    std::printf(", %lld ranks per node", i64(sim["ranks_per_node"]));
  // The note (plan_spec.cc simulation_sizes) names the sizes as the vocabulary does, sim_ranks.
  std::string note = sim["note"].get<std::string>();
  if (const size_t at = note.find("sim_ranks"); at != std::string::npos)
    note.replace(at, std::string_view("sim_ranks").size(), flag_name("sim_ranks"));
  if (!note.empty()) std::printf(" (%s)", note.c_str());
  std::printf("\n  %-6s", "ranks");
  for (const json& c : sim["curves"])
    std::printf(" %22s", detail::concat(str(c["strategy"]), " step (exp)").c_str());
  std::printf("\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::printf("  %-6lld", i64(sizes[i]));
    for (const json& c : sim["curves"]) {
      const json& p = c["points"][i];
      std::printf(" %22s", !p["valid"].get<bool>()
                               ? "-"
                               : (seconds_text(f64(p["step_seconds"])) + " (" +
                                  fmt("%.0f%%", 100 * f64(p["exposed_fraction"])) + ")")
                                     .c_str());
    }
    std::printf("\n");
  }
  for (const json& f : sim["findings"]) std::printf("  %s\n", str(f));
}

// The text report: the JSON object `--json` prints (plan_json), rendered; `top` rows of the
// ranking (0: all).
void print_text(const json& j, int top) {
  print_workload(j);
  print_hardware(j["hardware"], i64(j["world"]));
  print_divisibility(j);
  if (j.contains("decode")) print_decode(j);
  print_meshes(j, top);
  if (j.contains("simulation")) print_simulation(j["simulation"], j["hardware"]);
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
  p->add_option("--cfg,--cfg-parallel-size,--cfg_parallel_size", o.cfg,
                "pin the cfg degree (1 or 2)");
  p->add_option("--tp,--tensor-parallel-size,--tensor_parallel_size", o.tp,
                "pin the tensor-parallel degree");
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
                "pin: " + schedule_choices() + "; unset: every schedule that applies");
  p->add_flag("--pad", o.pad, "only padded meshes");
  p->add_flag("--no-pad,--no_pad", o.no_pad, "only unpadded meshes");
  p->add_option("--cached", o.cached, "llm decode / partial prefill: cached tokens P");
  p->add_option("--new", o.fresh, "llm decode / partial prefill: new tokens T");
  p->add_flag("--json", o.json, "print one JSON object");
  p->add_option("--top", o.top, "meshes to print (0: all)");
  p->add_flag("--simulate", o.simulate, "replay ring/ulysses/usp/allgather at growing sizes");
  o.sim_ranks.clear();  // unset: kDefaultSimRanks as far as the planning limit allows
  p->add_option("--sim-ranks,--sim_ranks", o.sim_ranks,
                "simulation sizes FIRST:LAST (doubling; default 8:1024 as far as the planning "
                "limit allows)");
  p->add_option("--svg", o.svg, "write the simulation's step time vs ranks as an SVG file");
  guard_integer_options(p);
}

namespace {

int run_plan(const PlanOptions& o) {
  const ResolvedPlanSpec r = resolve(o);
  const bool simulate = o.simulate || !o.svg.empty();
  std::optional<OutputFile> svg;
  if (!o.svg.empty()) svg.emplace("--svg", o.svg);
  const Plan plan = make_plan(r.req);
  std::optional<Simulation> sim;
  if (simulate) {
    Progress progress("plan", o.json);
    sim = plan_simulation(r, o.sim_ranks, [&](int64_t done, int64_t total) {
      progress.step(done, total, "simulated meshes");
    });
    if (svg) svg->write(simulation_svg(*sim, simulation_title(r)));
  }
  const std::string text = plan_json(r, plan, sim ? &*sim : nullptr, static_cast<int>(o.top));
  if (o.json)
    std::printf("%s\n", text.c_str());
  else
    print_text(nlohmann::json::parse(text), static_cast<int>(o.top));
  return finish_output(0);
}

}  // namespace

int plan_command(const PlanOptions& o) {
  return with_json_errors(o.json, [&] { return run_plan(o); });
}

}  // namespace seqpar::cli
