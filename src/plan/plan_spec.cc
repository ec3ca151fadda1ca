// The planning question resolved into a PlanRequest, and the plan as JSON
// (include/seqpar/plan/plan_spec.h).
#include "seqpar/plan/plan_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {

namespace {

using nlohmann::json;

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

const ModelPreset& preset_or_hint(const std::string& name) {
  try {
    return model_preset(name);
  } catch (const InvalidArgument&) {
    std::string valid;
    for (const auto& n : model_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    throw ParamError(
        "model", valid,
        detail::concat(param("model"), " '", name, "' is unknown; nearest: ",
                       nearest_name(name, model_preset_names()), " (valid: ", valid, ")"));
  }
}

// Every size against core/limits.h, before anything is sized by it.
void validate(const PlanSpec& o) {
  using limits::check_range;
  SEQPAR_PARAM_CHECK(o.ranks >= 1, "ranks", "at least 1", param("ranks"), " ", o.ranks,
                     " is invalid; it must be at least 1");
  check_range("ranks", o.ranks, 1, limits::kMaxRanks);
  check_range("batch", o.batch, 1, limits::kMaxBatch);
  check_range("seq", o.seq, 0, limits::kMaxTokens);
  check_range("heads", o.heads, 0, limits::kMaxHeads);
  check_range("kv_heads", o.kv_heads, 0, limits::kMaxHeads);
  check_range("head_dim", o.head_dim, 1, limits::kMaxHeadDim);
  check_range("frames", o.frames, 0, limits::kMaxPixels);
  check_range("height", o.height, 0, limits::kMaxPixels);
  check_range("width", o.width, 0, limits::kMaxPixels);
  check_range("cached", o.cached, 0, limits::kMaxTokens);
  check_range("new", o.fresh, 0, limits::kMaxTokens);
  if (o.text_tokens) check_range("text_tokens", *o.text_tokens, 0, limits::kMaxTokens);
  if (o.ranks_per_node) check_range("ranks_per_node", *o.ranks_per_node, 0, limits::kMaxRanks);
  for (auto [name, v] :
       {std::pair{"cfg", o.cfg}, std::pair{"tp", o.tp}, std::pair{"ulysses_degree", o.ulysses_degree},
        std::pair{"ring_degree", o.ring_degree},
        std::pair{"sequence_parallel_size", o.sequence_parallel_size}})
    check_range(name, v, 0, limits::kMaxRanks);
  SEQPAR_PARAM_CHECK(
      std::isfinite(o.memory_limit_gb) && o.memory_limit_gb >= 0 && o.memory_limit_gb <= 1e9,
      "memory_limit", "0 to 1e9", param("memory_limit"), " ", o.memory_limit_gb,
      " is invalid; give GB per rank, 0 to 1e9 (0: the profile's)");
}

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
  j["label"] = config_label(c.config);
  j["cfg"] = c.config.mesh.cfg;
  j["tp"] = c.config.mesh.tp;
  j["ulysses_degree"] = c.config.mesh.ulysses;
  j["ring_degree"] = c.config.mesh.ring;
  j["sequence_parallel_size"] = c.config.sp();
  j["strategy"] = strategy_name(c.config.strategy);
  j["ulysses_mode"] = uses_ulysses(c.config.strategy)
                          ? json(ulysses_mode_name(c.config.ulysses_mode))
                          : json(nullptr);
  j["layout"] = layout_name(c.config.layout);
  j["softmax"] = has_ring(c.config.strategy) ? json(softmax_mode_name(c.config.softmax))
                                              : json(nullptr);
  j["schedule"] = schedule_kind_name(c.config.schedule);
  j["pad"] = c.config.pad;
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

// What a rejection is of: the degrees alone ("cfg 1 tp 3 (any split)"), a mesh, or a mesh in
// every layout ("... any layout ...").
std::string rejection_label(const Rejection& x) {
  if (x.config.mesh.ulysses == 0)
    return detail::concat("cfg ", x.config.mesh.cfg, " tp ", x.config.mesh.tp, " (any split)");
  std::string label = config_label(x.config);
  if (x.any_layout) {
    const std::string layout(layout_name(x.config.layout));
    const auto pos = label.find(layout);
    if (pos != std::string::npos) label.replace(pos, layout.size(), "any layout");
  }
  return label;
}

json choice_json(const PassChoice& c) {
  return {{"choice", strategy_name(c.kind)},
          {"threshold_tokens", c.threshold_tokens},
          {"miss_rate", c.miss_rate},
          {"miss_threshold", c.miss_threshold},
          {"reason", c.reason}};
}

}  // namespace

ResolvedPlanSpec resolve_plan_spec(const PlanSpec& o, HardwareProfile hw) {
  validate(o);
  SEQPAR_PARAM_CHECK((o.cached > 0) == (o.fresh > 0), o.cached > 0 ? "new" : "cached", "at least 1",
                     "decode / partial prefill needs both ", param("cached"), " P and ",
                     param("new"), " T tokens (at least 1)");
  ResolvedPlanSpec r;
  PlanRequest& req = r.req;
  req.hw = std::move(hw);
  if (o.ranks_per_node) req.hw.ranks_per_node = static_cast<int>(*o.ranks_per_node);
  req.world = static_cast<int>(o.ranks);
  req.memory_limit = o.memory_limit_gb * 1e9;
  const DType dtype = parse_dtype(o.dtype.empty() ? req.hw.dtype : o.dtype);
  const bool decode = o.fresh > 0;

  if (!o.model.empty()) {
    const ModelPreset& m = preset_or_hint(o.model);
    int64_t tokens = o.seq;
    if (m.family == ModelFamily::kLlm) {
      SEQPAR_PARAM_CHECK(o.height == 0 && o.width == 0 && o.frames == 0,
                         o.frames != 0   ? "frames"
                         : o.height != 0 ? "height"
                                         : "width",
                         "none", param("model"), " '", m.name, "' is a language model: give ",
                         param("seq"), " (prompt tokens) or ", param("cached"), " and ",
                         param("new"), ", not ", param("frames"), ", ", param("height"), " and ",
                         param("width"));
      SEQPAR_PARAM_CHECK(decode || tokens >= 1, "seq", "at least 1", param("model"), " '", m.name,
                         "' needs ", param("seq"), " (prompt tokens) or ", param("cached"),
                         " P and ", param("new"), " T");
    } else {
      SEQPAR_PARAM_CHECK(!decode, "cached", "none", param("cached"), " and ", param("new"),
                         " are for language models; ", m.name, " is a ",
                         model_family_name(m.family));
      if (o.height > 0 || o.width > 0) {
        SEQPAR_PARAM_CHECK(o.height > 0 && o.width > 0, o.height > 0 ? "width" : "height",
                           "at least 1", param("height"), " and ", param("width"), " go together");
        const int64_t frames = o.frames > 0 ? o.frames : 1;
        r.latent = latent_shape(m, frames, o.height, o.width);
        tokens = r.latent->tokens;
        req.frames = frames;
        req.height = o.height;
        req.width = o.width;
        req.preset = &m;
      }
      SEQPAR_PARAM_CHECK(tokens >= 1, "seq", "at least 1", param("model"), " '", m.name, "' needs ",
                         param("height"), " and ", param("width"), " (and ", param("frames"),
                         " for video), or ", param("seq"), " tokens");
    }
    const int64_t text = m.family == ModelFamily::kMMDiT ? o.text_tokens.value_or(m.text_len) : 0;
    SEQPAR_PARAM_CHECK(o.text_tokens.value_or(0) == 0 || m.family == ModelFamily::kMMDiT,
                       "text_tokens", "0", param("text_tokens"),
                       " is for mmdit models (joint attention); ", m.name, " is a ",
                       model_family_name(m.family));
    req.work = model_workload(m, tokens, o.batch, dtype, o.guidance, text, o.cached, o.fresh);
  } else {
    SEQPAR_ARG_CHECK(
        o.heads >= 1, "give a model (one of: ",
        [] {
          std::string v;
          for (const auto& n : model_preset_names()) v += (v.empty() ? "" : ", ") + n;
          return v;
        }(),
        ") or a bare attention shape: seq and heads (kv_heads, head_dim, causal)");
    SEQPAR_PARAM_CHECK(decode || o.seq >= 1, "seq", "at least 1", param("seq"), " ", o.seq,
                       " is invalid; it must be at least 1");
    const int64_t kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
    SEQPAR_PARAM_CHECK(kv >= 1 && o.heads % kv == 0, "kv_heads", divisors_text(o.heads),
                       param("heads"), " ", o.heads, " is not divisible by ", param("kv_heads"),
                       " ", kv, "; valid ", param("kv_heads"), ": ", divisors_text(o.heads));
    req.work = attention_workload(o.seq, o.heads, kv, o.head_dim, o.batch, o.causal || decode,
                                  dtype, o.text_tokens.value_or(0), o.cached, o.fresh);
  }
  req.cfg = static_cast<int>(o.cfg);
  req.tp = static_cast<int>(o.tp);
  req.ulysses = static_cast<int>(o.ulysses_degree);
  req.ring = static_cast<int>(o.ring_degree);
  req.sp = static_cast<int>(o.sequence_parallel_size);
  (void)limits::checked_product(
      {std::max<int64_t>(o.cfg, 1), std::max<int64_t>(o.tp, 1),
       std::max<int64_t>(o.ulysses_degree, 1), std::max<int64_t>(o.ring_degree, 1)},
      detail::concat("the ranks of ", param("cfg"), " x ", param("tp"), " x ",
                     param("ulysses_degree"), " x ", param("ring_degree")),
      limits::kMaxRanks);
  if (!o.strategy.empty()) req.strategy = parse_strategy(o.strategy);
  if (!o.layout.empty()) req.layout = parse_layout(o.layout);
  if (!o.ulysses_mode.empty()) req.ulysses_mode = parse_ulysses_mode(o.ulysses_mode);
  if (!o.softmax.empty()) req.softmax = parse_softmax_mode(o.softmax);
  if (!o.schedule.empty()) req.schedule = parse_schedule_kind(o.schedule);
  req.pad = o.pad;
  return r;
}

namespace {

// The simulation replays every size up to LAST: at most kMaxSimRanks (each size costs its meshes).
constexpr int64_t kMaxSimRanks = int64_t{1} << 13;
// sim_ranks unset: from 8 doubling up to 1024, as far as the planning limit allows.
constexpr const char* kDefaultSimRanks = "8:1024";

std::vector<int> parse_sizes(const std::string& s) {
  const auto colon = s.find(':');
  const std::optional<int64_t> first = limits::parse_int64(s.substr(0, colon));
  const std::optional<int64_t> last =
      colon == std::string::npos ? first : limits::parse_int64(s.substr(colon + 1));
  SEQPAR_PARAM_CHECK(first && last, "sim_ranks", "FIRST:LAST", param("sim_ranks"), " '", s,
                     "' is invalid; give FIRST:LAST, e.g. 8:1024");
  SEQPAR_PARAM_CHECK(
      *first >= 1 && *last >= *first && *last <= kMaxSimRanks, "sim_ranks",
      detail::concat("FIRST:LAST, 1 <= FIRST <= LAST <= ", limits::max_text(kMaxSimRanks)),
      param("sim_ranks"), " '", s,
      "' is invalid; give FIRST:LAST with 1 <= FIRST <= LAST <= ", limits::max_text(kMaxSimRanks),
      ", e.g. 8:1024");
  return doubling_sizes(static_cast<int>(*first), static_cast<int>(*last));
}

struct SimulationMesh {
  Layout layout;
  int cfg, tp;
};
SimulationMesh simulation_mesh(const PlanRequest& req) {
  return {req.layout.value_or(req.work.causal ? Layout::kZigzag : Layout::kContiguous),
          req.cfg > 0 ? req.cfg : 1, req.tp > 0 ? req.tp : 1};
}

// The sizes to simulate and, when they were cut short, why (*note).
std::vector<int> simulation_sizes(const std::string& sim_ranks, const PlanRequest& req,
                                  std::string* note) {
  const bool given = !sim_ranks.empty();
  std::vector<int> sizes = parse_sizes(given ? sim_ranks : kDefaultSimRanks);
  const int64_t plan = plan_work(req, req.world).ns;
  if (plan > kMaxPlanWork) return sizes;  // make_plan refuses the plan itself
  const SimulationMesh m = simulation_mesh(req);
  const PlanWork work = simulation_work(req.work, sizes, m.layout, m.cfg, m.tp);
  if (work.ns <= kMaxPlanWork - plan) return sizes;
  const int last =
      largest_simulated_size(req.work, sizes, m.layout, m.cfg, m.tp, kMaxPlanWork - plan);
  PlanWork with_plan = plan_work(req, req.world);
  with_plan += work;
  SEQPAR_PARAM_CHECK(!given && last > 0, "sim_ranks",
                     last > 0 ? detail::concat(sizes.front(), ":", last) : std::string(),
                     param("sim_ranks"), " ", sizes.front(), ":", sizes.back(), ": simulating at ",
                     req.work.seq, " tokens beside the plan means costing ", with_plan.text(),
                     ", more than the limit of about ", kMaxPlanWork / 1'000'000'000.0, " s; ",
                     last > 0 ? detail::concat(param("sim_ranks"), " ", sizes.front(), ":", last)
                              : std::string("plan fewer tokens"));
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.2g", static_cast<double>(with_plan.ns) / 1e9);
  *note = detail::concat(sizes.back(), " ranks would take about ", seconds,
                         " s to cost, more than the limit; sim_ranks to choose");
  while (sizes.back() > last) sizes.pop_back();
  return sizes;
}

}  // namespace

Simulation plan_simulation(const ResolvedPlanSpec& r, const std::string& sim_ranks,
                           const std::function<void(int64_t, int64_t)>& on_mesh) {
  std::string note;
  const std::vector<int> sizes = simulation_sizes(sim_ranks, r.req, &note);
  const SimulationMesh m = simulation_mesh(r.req);
  Simulation sim = simulate_scaling(r.req.work, r.req.hw, sizes, m.layout, m.cfg, m.tp,
                                    kHiddenFraction, kMaxPlanWork, on_mesh);
  sim.note = note;
  return sim;
}

std::string simulation_title(const ResolvedPlanSpec& r) {
  return detail::concat(r.req.work.model, ", S = ", r.req.work.seq, " tokens, ", r.req.hw.name,
                        ": predicted step time");
}

std::string plan_json(const ResolvedPlanSpec& r, const Plan& plan, const Simulation* sim,
                      int top) {
  const PlanRequest& req = r.req;
  const Workload& w = req.work;
  json j;
  j["model"] = w.model;
  j["family"] = w.attention_only ? "attention" : std::string(model_family_name(w.family));
  if (r.latent) {
    j["frames"] = req.frames;
    j["height"] = req.height;
    j["width"] = req.width;
    j["latent"] = {r.latent->latent_frames, r.latent->latent_height, r.latent->latent_width};
    j["patch_grid"] = r.latent->grid;
    j["video"] = req.preset != nullptr && req.preset->video;
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
  j["cross_tokens"] = w.cross_tokens;
  j["hidden"] = w.hidden;
  j["ffn_dim"] = w.ffn_dim;
  j["dtype"] = dtype_name(w.dtype);
  j["hardware"] = json::parse(hardware_profile_to_json(req.hw));
  j["hardware"]["source"] = req.hw.source;
  const Divisibility& d = plan.divisibility;
  j["sequence_parallel_size"] = d.sp;
  j["remainder"] = d.remainder;
  json alts = json::array();
  for (const auto& a : d.alternatives)
    alts.push_back({{"parameter", a.parameter}, {"value", a.value}, {"seq_len", a.tokens}});
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
  const MeshCost* any = !plan.ranked.empty()        ? &plan.ranked.front()
                        : !plan.over_memory.empty() ? &plan.over_memory.front()
                                                    : nullptr;
  j["memory_limit_bytes"] = any ? json(any->memory_limit) : json(nullptr);
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
    m["cfg"] = x.config.mesh.cfg;
    m["tp"] = x.config.mesh.tp;
    m["label"] = rejection_label(x);
    if (x.config.mesh.ulysses > 0) {
      m["ulysses_degree"] = x.config.mesh.ulysses;
      m["ring_degree"] = x.config.mesh.ring;
      m["strategy"] = strategy_name(x.config.strategy);
      if (uses_ulysses(x.config.strategy))
        m["ulysses_mode"] = ulysses_mode_name(x.config.ulysses_mode);
      m["layout"] = x.any_layout ? "any" : std::string(layout_name(x.config.layout));
      m["pad"] = x.config.pad;
    }
    m["reason"] = x.reason;
    rej.push_back(m);
  }
  j["rejected"] = rej;
  if (plan.decode) {
    const DecodeChoice& c = *plan.decode;
    j["cached"] = w.cached;
    j["new"] = w.fresh;
    j["choice"] = strategy_name(c.choice);
    j["threshold_tokens"] = c.all2all.threshold_tokens;
    j["decode"] = {
        {"ranks", c.ranks},
        {"flops_per_s", c.flops_per_s},
        {"bytes_per_s", c.bytes_per_s},
        {"meta_rule", choice_json(c.basic)},
        {"all2all_rule", choice_json(c.all2all)},
        {"passkv_step_seconds", c.passkv_step_s ? json(*c.passkv_step_s) : json(nullptr)},
        {"passq_step_seconds", c.passq_step_s ? json(*c.passq_step_s) : json(nullptr)},
        {"passq_ring_step_seconds",
         c.passq_ring_step_s ? json(*c.passq_ring_step_s) : json(nullptr)},
        {"cost_model_fastest", c.fastest ? json(strategy_name(*c.fastest)) : json(nullptr)},
        {"cost_model_fastest_schedule", schedule_kind_name(c.fastest_schedule)}};
    if (plan.ranked.empty())
      j["warning"] = "no mesh fits the memory limit (see over_memory); the pass choice still holds";
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
      curves.push_back({{"strategy", strategy_name(c.strategy)},
                        {"hidden_up_to", c.hidden_up_to},
                        {"stops_hiding_at", c.stops_hiding_at},
                        {"points", pts}});
    }
    j["simulation"] = {{"sizes", sim->sizes},
                       {"layout", layout_name(sim->layout)},
                       {"threshold", sim->threshold},
                       {"ranks_per_node", sim->ranks_per_node},
                       {"curves", curves},
                       {"findings", sim->findings},
                       {"note", sim->note}};
  }
  return j.dump();
}

}  // namespace seqpar
