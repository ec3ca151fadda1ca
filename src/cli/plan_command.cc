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

#include "cli/commands.h"
#include "seqpar/core/error.h"
#include "seqpar/model/presets.h"
#include "seqpar/plan/planner.h"
#include "seqpar/plan/simulate.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

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

const ModelPreset& preset_or_hint(const std::string& name) {
  try {
    return model_preset(name);
  } catch (const InvalidArgument&) {
    std::string valid;
    for (const auto& n : model_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    throw InvalidArgument(detail::concat(
        "--model '", name, "' is unknown; nearest: ", nearest_name(name, model_preset_names()),
        " (valid: ", valid, ")"));
  }
}

struct Resolved {
  PlanRequest req;
  const ModelPreset* preset = nullptr;
  LatentShape latent;
  bool has_latent = false;
};

// Every size against core/limits.h, before anything is sized by it.
void validate(const PlanOptions& o) {
  using limits::check_range;
  SEQPAR_ARG_CHECK(o.ranks >= 1, "--ranks ", o.ranks, " is invalid; it must be at least 1");
  check_range("--ranks", o.ranks, 1, limits::kMaxRanks);
  check_range("--batch", o.batch, 1, limits::kMaxBatch);
  check_range("--top", o.top, 0, limits::kMaxRanks);
  check_range("--seq", o.seq, 0, limits::kMaxTokens);
  check_range("--heads", o.heads, 0, limits::kMaxHeads);
  check_range("--kv-heads", o.kv_heads, 0, limits::kMaxHeads);
  check_range("--head-dim", o.head_dim, 1, limits::kMaxHeadDim);
  check_range("--frames", o.frames, 0, limits::kMaxPixels);
  check_range("--height", o.height, 0, limits::kMaxPixels);
  check_range("--width", o.width, 0, limits::kMaxPixels);
  check_range("--cached", o.cached, 0, limits::kMaxTokens);
  check_range("--new", o.fresh, 0, limits::kMaxTokens);
  if (o.text_tokens) check_range("--text-tokens", *o.text_tokens, 0, limits::kMaxTokens);
  if (o.ranks_per_node) check_range("--ranks-per-node", *o.ranks_per_node, 0, limits::kMaxRanks);
  for (auto [flag, v] :
       {std::pair{"--cfg", o.cfg}, std::pair{"--tp", o.tp},
        std::pair{"--ulysses-degree", o.ulysses_degree}, std::pair{"--ring-degree", o.ring_degree}})
    check_range(flag, v, 0, limits::kMaxRanks);
  SEQPAR_ARG_CHECK(
      std::isfinite(o.memory_limit_gb) && o.memory_limit_gb >= 0 && o.memory_limit_gb <= 1e9,
      "--memory-limit ", o.memory_limit_gb,
      " is invalid; give GB per rank, 0 to 1e9 (0: the profile's)");
}

Resolved resolve(const PlanOptions& o) {
  validate(o);
  SEQPAR_ARG_CHECK((o.cached > 0) == (o.fresh > 0),
                   "decode / partial prefill needs both --cached P and --new T (at least 1)");
  SEQPAR_ARG_CHECK(o.memory_limit_gb >= 0, "--memory-limit ", o.memory_limit_gb,
                   " is invalid; give GB per rank (0: the profile's)");
  SEQPAR_ARG_CHECK(!(o.pad && o.no_pad), "--pad and --no-pad contradict each other");
  Resolved r;
  PlanRequest& req = r.req;
  req.hw = load_profile_checked(o.hardware);
  if (o.ranks_per_node) req.hw.ranks_per_node = static_cast<int>(*o.ranks_per_node);
  req.world = static_cast<int>(o.ranks);
  req.memory_limit = o.memory_limit_gb * 1e9;
  const DType dtype = parse_dtype(o.dtype.empty() ? req.hw.dtype : o.dtype);
  const bool decode = o.fresh > 0;

  if (!o.model.empty()) {
    const ModelPreset& m = preset_or_hint(o.model);
    r.preset = &m;
    int64_t tokens = o.seq;
    if (m.family == ModelFamily::kLlm) {
      SEQPAR_ARG_CHECK(o.height == 0 && o.width == 0 && o.frames == 0, "--model ", m.name,
                       " is a language model: give --seq (prompt tokens) or --cached/--new, not "
                       "--frames/--height/--width");
      SEQPAR_ARG_CHECK(decode || tokens >= 1, "--model ", m.name,
                       " needs --seq (prompt tokens) or --cached P --new T");
    } else {
      SEQPAR_ARG_CHECK(!decode, "--cached/--new are for language models; ", m.name, " is a ",
                       model_family_name(m.family));
      if (o.height > 0 || o.width > 0) {
        SEQPAR_ARG_CHECK(o.height > 0 && o.width > 0, "--height and --width go together");
        const int64_t frames = o.frames > 0 ? o.frames : 1;
        r.latent = latent_shape(m, frames, o.height, o.width);
        r.has_latent = true;
        tokens = r.latent.tokens;
        req.frames = frames;
        req.height = o.height;
        req.width = o.width;
        req.preset = &m;
      }
      SEQPAR_ARG_CHECK(tokens >= 1, "--model ", m.name,
                       " needs --height and --width (and --frames for video), or --seq tokens");
    }
    const int64_t text = m.family == ModelFamily::kMMDiT ? o.text_tokens.value_or(m.text_len) : 0;
    SEQPAR_ARG_CHECK(o.text_tokens.value_or(0) == 0 || m.family == ModelFamily::kMMDiT,
                     "--text-tokens is for mmdit models (joint attention); ", m.name, " is a ",
                     model_family_name(m.family));
    req.work = model_workload(m, tokens, o.batch, dtype, !o.no_guidance, text, o.cached, o.fresh);
  } else {
    SEQPAR_ARG_CHECK(
        o.heads >= 1, "give --model (one of: ",
        [] {
          std::string v;
          for (const auto& n : model_preset_names()) v += (v.empty() ? "" : ", ") + n;
          return v;
        }(),
        ") or a bare attention shape: --seq S --heads H [--kv-heads --head-dim --causal]");
    SEQPAR_ARG_CHECK(decode || o.seq >= 1, "--seq ", o.seq, " is invalid; it must be at least 1");
    const int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
    SEQPAR_ARG_CHECK(kv >= 1 && o.heads % kv == 0, "--heads ", o.heads,
                     " is not divisible by --kv-heads ", kv);
    SEQPAR_ARG_CHECK(o.head_dim >= 1, "--head-dim ", o.head_dim, " is invalid");
    req.work = attention_workload(o.seq, o.heads, kv, o.head_dim, o.batch, o.causal || decode,
                                  dtype, o.text_tokens.value_or(0), o.cached, o.fresh);
  }
  req.cfg = static_cast<int>(o.cfg);
  req.tp = static_cast<int>(o.tp);
  req.ulysses = static_cast<int>(o.ulysses_degree);
  req.ring = static_cast<int>(o.ring_degree);
  (void)limits::checked_product(
      {std::max<int64_t>(o.cfg, 1), std::max<int64_t>(o.tp, 1),
       std::max<int64_t>(o.ulysses_degree, 1), std::max<int64_t>(o.ring_degree, 1)},
      "ranks of --cfg x --tp x --ulysses-degree x --ring-degree", limits::kMaxRanks);
  if (!o.strategy.empty()) req.scheme = parse_scheme(o.strategy);
  if (!o.layout.empty()) req.layout = parse_layout(o.layout);
  if (!o.ulysses_mode.empty()) req.mode = parse_ulysses_mode(o.ulysses_mode);
  if (o.pad) req.pad = true;
  if (o.no_pad) req.pad = false;
  return r;
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

// ---- JSON -------------------------------------------------------------------------------------

// x to 6 significant digits: the model is not more precise, and the object stays small.
double r6(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  const double scale = std::pow(10.0, 5 - static_cast<int>(std::floor(std::log10(std::fabs(x)))));
  return std::round(x * scale) / scale;
}

// Summary fields of a mesh; with `detailed` also the per-rank lists, the collectives and the
// memory breakdown (kept to the first --top meshes so the object stays small).
json mesh_json(const MeshCost& c, int rank, bool detailed) {
  json j;
  if (rank > 0) j["rank"] = rank;
  j["cfg"] = c.mesh.cfg;
  j["tp"] = c.mesh.tp;
  j["ulysses_degree"] = c.mesh.ulysses;
  j["ring_degree"] = c.mesh.ring;
  j["sequence_parallel_size"] = c.mesh.sp();
  j["strategy"] = scheme_name(c.mesh.scheme);
  j["ulysses_mode"] = (c.mesh.scheme == Scheme::kUlysses || c.mesh.scheme == Scheme::kUsp)
                          ? json(ulysses_mode_name(c.mesh.mode))
                          : json(nullptr);
  j["layout"] = layout_name(c.mesh.layout);
  j["pad"] = c.mesh.pad;
  j["padded_seq"] = c.padded_seq;
  j["remainder"] = c.remainder;
  j["step_seconds"] = r6(c.step_s);
  j["layer_seconds"] = r6(c.layer_s);
  j["compute_seconds"] = r6(c.compute_s);
  j["comm_seconds"] = r6(c.comm_s);
  j["exposed_comm_seconds"] = r6(c.exposed_comm_s);
  j["critical_rank"] = c.critical_rank;
  j["work_imbalance"] = r6(c.work_imbalance);
  uint64_t max_sent = 0, max_recv = 0;
  int64_t max_peak = 0;
  for (const auto& r : c.ranks) {
    max_sent = std::max<uint64_t>(max_sent, r.sent);
    max_recv = std::max<uint64_t>(max_recv, r.recv);
    max_peak = std::max(max_peak, r.peak_kv_bytes);
  }
  j["max_bytes_sent_per_rank"] = max_sent;
  j["max_bytes_recv_per_rank"] = max_recv;
  j["max_peak_kv_bytes"] = max_peak;
  j["tp_all_reduce_bytes"] = c.tp_bytes;
  j["memory_bytes"] = r6(c.memory_bytes);
  j["fits_memory"] = c.fits_memory;
  if (!detailed) return j;
  std::vector<uint64_t> sent, recv;
  std::vector<int64_t> peak, work, tokens;
  for (const auto& r : c.ranks) {
    sent.push_back(r.sent);
    recv.push_back(r.recv);
    peak.push_back(r.peak_kv_bytes);
    work.push_back(r.work);
    tokens.push_back(r.tokens);
  }
  j["tokens_per_rank"] = tokens;
  j["bytes_sent_per_rank"] = sent;
  j["bytes_recv_per_rank"] = recv;
  j["peak_kv_bytes_per_rank"] = peak;
  j["work_per_rank"] = work;
  const RankCost& crit = c.ranks[c.critical_rank];
  j["attention_flops_per_layer"] = r6(crit.attention_flops);
  j["linear_flops_per_layer"] = r6(crit.linear_flops);
  json cols = json::array();
  for (const auto& x : c.collectives)
    cols.push_back({{"op", x.op},
                    {"what", x.what},
                    {"group", x.group},
                    {"sent", x.sent},
                    {"recv", x.recv},
                    {"calls", x.calls},
                    {"inter_node", x.inter_node},
                    {"overlapped", x.overlapped},
                    {"seconds", r6(x.seconds)}});
  j["collectives"] = cols;
  j["memory"] = {{"weights", c.weight_bytes},         {"kv_cache", c.kv_cache_bytes},
                 {"activations", c.activation_bytes}, {"total", c.memory_bytes},
                 {"limit", c.memory_limit},           {"fits", c.fits_memory}};
  return j;
}

json choice_json(const PassChoice& c) {
  return {{"choice", pass_name(c.kind)},
          {"threshold_tokens", c.threshold_tokens},
          {"miss_rate", c.miss_rate},
          {"miss_threshold", c.miss_threshold},
          {"reason", c.reason}};
}

void print_json(const Resolved& r, const Plan& plan, const Simulation* sim, int top) {
  const PlanRequest& req = r.req;
  const Workload& w = req.work;
  json j;
  j["model"] = w.model;
  j["family"] = w.attention_only ? "attention" : std::string(model_family_name(w.family));
  if (r.has_latent) {
    j["frames"] = req.frames;
    j["height"] = req.height;
    j["width"] = req.width;
    j["latent"] = {r.latent.latent_frames, r.latent.latent_height, r.latent.latent_width};
    j["patch_grid"] = r.latent.grid;
  }
  j["seq_len"] = w.seq;
  j["world"] = req.world;
  j["batch"] = w.batch;
  j["guidance_branches"] = w.cfg_branches;
  j["heads"] = w.heads;
  j["kv_heads"] = w.kv_heads;
  j["head_dim"] = w.head_dim;
  j["layers"] = w.attention_only ? 1 : w.layers;
  j["causal"] = w.causal;
  j["text_tokens"] = w.text_tokens;
  j["dtype"] = dtype_name(w.dtype);
  j["hardware"] = json::parse(hardware_profile_to_json(req.hw));
  j["hardware"]["source"] = req.hw.source;
  const Divisibility& d = plan.divisibility;
  j["sequence_parallel_size"] = d.sp;
  j["remainder"] = d.remainder;
  json alts = json::array();
  for (const auto& a : d.alternatives)
    alts.push_back({{"flag", a.flag}, {"value", a.value}, {"seq_len", a.tokens}});
  j["divisibility"] = {{"divides", d.remainder == 0},
                       {"shard_floor", d.shard_floor},
                       {"shard_ceil", d.shard_ceil},
                       {"ranks_with_ceil", d.ranks_with_ceil},
                       {"shard_imbalance", d.shard_imbalance},
                       {"padded_seq", d.padded_seq},
                       {"padded_seq_zigzag", d.padded_seq_zigzag},
                       {"pad_token_overhead", d.pad_token_overhead},
                       {"pad_work_overhead", d.pad_work_overhead},
                       {"alternatives", alts}};
  json meshes = json::array();
  for (size_t i = 0; i < plan.ranked.size(); ++i)
    meshes.push_back(mesh_json(plan.ranked[i], static_cast<int>(i + 1),
                               top == 0 || i < static_cast<size_t>(top)));
  j["meshes"] = meshes;
  json over = json::array();
  for (const auto& c : plan.over_memory) {
    json m = mesh_json(c, 0, false);
    m["reason"] = detail::concat("needs ", fmt("%.1f", c.memory_bytes / 1e9), " GB per rank > ",
                                 fmt("%.1f", c.memory_limit / 1e9), " GB");
    over.push_back(m);
  }
  j["over_memory"] = over;
  json rej = json::array();
  for (const auto& x : plan.rejected) {
    json m;
    m["cfg"] = x.mesh.cfg;
    m["tp"] = x.mesh.tp;
    if (x.mesh.ulysses > 0) {
      m["ulysses_degree"] = x.mesh.ulysses;
      m["ring_degree"] = x.mesh.ring;
      m["strategy"] = scheme_name(x.mesh.scheme);
      if (x.mesh.scheme == Scheme::kUlysses || x.mesh.scheme == Scheme::kUsp)
        m["ulysses_mode"] = ulysses_mode_name(x.mesh.mode);
      m["layout"] = x.any_layout ? "any" : std::string(layout_name(x.mesh.layout));
      m["pad"] = x.mesh.pad;
    }
    m["reason"] = x.reason;
    rej.push_back(m);
  }
  j["rejected"] = rej;
  if (plan.decode) {
    const DecodeChoice& c = *plan.decode;
    j["cached"] = w.cached;
    j["new"] = w.fresh;
    j["choice"] = pass_name(c.choice);
    j["threshold_tokens"] = c.all2all.threshold_tokens;
    j["decode"] = {
        {"ranks", c.ranks},
        {"flops_per_s", c.flops_per_s},
        {"bytes_per_s", c.bytes_per_s},
        {"meta_rule", choice_json(c.basic)},
        {"all2all_rule", choice_json(c.all2all)},
        {"passkv_step_seconds", c.passkv_step_s ? json(*c.passkv_step_s) : json(nullptr)},
        {"passq_step_seconds", c.passq_step_s ? json(*c.passq_step_s) : json(nullptr)},
        {"cost_model_fastest", c.fastest ? json(pass_name(*c.fastest)) : json(nullptr)}};
    if (plan.ranked.empty()) j["warning"] = "no mesh fits the memory limit; see over_memory";
  }
  if (sim) {
    json curves = json::array();
    for (const auto& c : sim->curves) {
      json pts = json::array();
      for (const auto& p : c.points)
        pts.push_back({{"ranks", p.ranks},
                       {"valid", p.valid},
                       {"note", p.note},
                       {"ulysses_degree", p.ulysses},
                       {"ring_degree", p.ring},
                       {"step_seconds", p.step_s},
                       {"compute_seconds", p.compute_s},
                       {"comm_seconds", p.comm_s},
                       {"exposed_comm_seconds", p.exposed_s},
                       {"exposed_fraction", p.exposed_fraction},
                       {"inter_node", p.inter_node},
                       {"memory_bytes", p.memory_bytes}});
      curves.push_back({{"strategy", scheme_name(c.scheme)},
                        {"hidden_up_to", c.hidden_up_to},
                        {"stops_hiding_at", c.stops_hiding_at},
                        {"points", pts}});
    }
    j["simulation"] = {{"sizes", sim->sizes},
                       {"layout", layout_name(sim->layout)},
                       {"threshold", sim->threshold},
                       {"ranks_per_node", sim->ranks_per_node},
                       {"curves", curves},
                       {"findings", sim->findings}};
  }
  std::printf("%s\n", j.dump().c_str());
}

// ---- text -------------------------------------------------------------------------------------

std::string strategy_cell(const Mesh& m) {
  std::string s(scheme_name(m.scheme));
  if (m.scheme == Scheme::kUlysses || m.scheme == Scheme::kUsp)
    s += detail::concat("(", ulysses_mode_name(m.mode), ")");
  return s;
}

void print_mesh_row(int idx, const MeshCost& c, int same) {
  uint64_t bytes = 0;
  for (const auto& r : c.ranks) bytes = std::max<uint64_t>(bytes, std::max(r.sent, r.recv));
  bytes += c.tp_bytes;
  const double compute_frac = c.layer_s > 0 ? c.compute_s / c.layer_s : 1;
  std::printf(
      "  %-4d %3d %3d %4d %4d  %-14s %-10s %-3s %10s %10s %7.0f%% %7.0f%% %10.3g %8.1f %6.2f %5s\n",
      idx, c.mesh.cfg, c.mesh.tp, c.mesh.ulysses, c.mesh.ring, strategy_cell(c.mesh).c_str(),
      std::string(layout_name(c.mesh.layout)).c_str(), c.mesh.pad ? "yes" : "-",
      seconds_text(c.step_s).c_str(), seconds_text(c.layer_s).c_str(), 100 * compute_frac,
      100 * (1 - compute_frac), bytes / 1e6, c.memory_bytes / 1e9, c.work_imbalance,
      same > 0 ? ("+" + std::to_string(same)).c_str() : "");
}

// Rows the table folds into the one above: the same degrees and strategy within 0.1% of its
// predicted time and memory (layouts of a non-causal model, a few padding tokens, strict vs uaa).
bool equivalent(const MeshCost& a, const MeshCost& b) {
  return a.mesh.cfg == b.mesh.cfg && a.mesh.tp == b.mesh.tp && a.mesh.ulysses == b.mesh.ulysses &&
         a.mesh.ring == b.mesh.ring && a.mesh.scheme == b.mesh.scheme &&
         std::fabs(a.step_s - b.step_s) <= 1e-3 * b.step_s &&
         std::fabs(a.memory_bytes - b.memory_bytes) <= 1e-3 * b.memory_bytes;
}

void print_text(const Resolved& r, const Plan& plan, const Simulation* sim, int top) {
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
  } else if (r.has_latent) {
    const LatentShape& l = r.latent;
    if (r.preset != nullptr && r.preset->video)
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
    std::printf("  choice: %s (threshold %.0f tokens)", std::string(pass_name(c.choice)).c_str(),
                c.all2all.threshold_tokens);
    if (c.passkv_step_s && c.passq_step_s)
      std::printf(
          "\n  cost model (seqpar's passq: all-gathered queries, fp32 partials): passkv %s, "
          "passq %s per step",
          seconds_text(*c.passkv_step_s).c_str(), seconds_text(*c.passq_step_s).c_str());
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
                b.mesh.label().c_str(), seconds_text(b.step_s).c_str(),
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
      std::printf("  %-60s needs %.1f GB > %.1f GB\n", c.mesh.label().c_str(), c.memory_bytes / 1e9,
                  c.memory_limit / 1e9);
    }
  }
  if (!plan.rejected.empty()) {
    std::printf("\ncannot run (%zu):\n", plan.rejected.size());
    for (const auto& x : plan.rejected) {
      std::string what;
      if (x.mesh.ulysses == 0) {
        what = detail::concat("cfg ", x.mesh.cfg, " tp ", x.mesh.tp, " (any split)");
      } else {
        Mesh m = x.mesh;
        what = m.label();
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
      std::printf(" %22s", (std::string(scheme_name(c.scheme)) + " step (exp)").c_str());
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
  p->add_option("--cfg", o.cfg, "pin the cfg degree (1 or 2)");
  p->add_option("--tp", o.tp, "pin the tensor-parallel degree");
  p->add_option("--ulysses-degree,--ulysses_degree", o.ulysses_degree, "pin the ulysses degree");
  p->add_option("--ring-degree,--ring_degree", o.ring_degree, "pin the ring degree");
  p->add_option("--strategy", o.strategy,
                "pin: allgather | ring | ulysses | usp | passkv | passq | local");
  p->add_option("--layout", o.layout, "pin: contiguous | striped | zigzag");
  p->add_option("--ulysses-mode,--ulysses_mode", o.ulysses_mode, "pin: strict | uaa");
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
  const Resolved r = resolve(o);
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
    print_json(r, plan, sim ? &*sim : nullptr, static_cast<int>(o.top));
  else
    print_text(r, plan, sim ? &*sim : nullptr, static_cast<int>(o.top));
  return finish_output(0);
}

}  // namespace

int plan_command(const PlanOptions& o) {
  return with_json_errors(o.json, [&] { return run_plan(o); });
}

}  // namespace seqpar::cli
