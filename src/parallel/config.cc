#include "seqpar/parallel/config.h"

#include <array>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"

namespace seqpar {

namespace {

constexpr std::array kStrategies = {Strategy::kLocal, Strategy::kAllGather, Strategy::kRing,
                                    Strategy::kUlysses, Strategy::kUsp,      Strategy::kPassKv,
                                    Strategy::kPassQ};

// Every name a value may be given by that is not its canonical one.
constexpr NameAlias kAliases[] = {
    {"strategy", "all-gather", "allgather"}, {"strategy", "all_gather", "allgather"},
    {"strategy", "pass-kv", "passkv"},       {"strategy", "pass_kv", "passkv"},
    {"strategy", "pass-q", "passq"},         {"strategy", "pass_q", "passq"},
    {"strategy", "hybrid", "usp"},           {"softmax", "const_max", "const-max"},
    {"softmax", "constmax", "const-max"},    {"ulysses_mode", "advanced_uaa", "uaa"},
};

// The canonical name `name` stands for in `kind` (itself when it is no alias).
std::string_view canonical(std::string_view kind, std::string_view name) {
  for (const NameAlias& a : kAliases)
    if (a.kind == kind && a.alias == name) return a.name;
  return name;
}

// Finds `name` (canonical or alias) among values [first, last] of an enum named by `name_of`.
// Messages call it `parameter` (default: kind).
template <typename E, typename NameOf, size_t N>
E parse_named(std::string_view kind, std::string_view name, const std::array<E, N>& values,
              NameOf&& name_of, std::string_view parameter = {}) {
  const std::string_view c = canonical(kind, name);
  std::string valid;
  for (E e : values) {
    if (name_of(e) == c) return e;
    valid += detail::concat(valid.empty() ? "" : ", ", name_of(e));
  }
  const std::string_view p = parameter.empty() ? kind : parameter;
  throw ParamError(std::string(p), valid,
                   detail::concat(param(p), " '", name, "' is unknown; valid: ", valid));
}

}  // namespace

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kLocal:
      return "local";
    case Strategy::kAllGather:
      return "allgather";
    case Strategy::kRing:
      return "ring";
    case Strategy::kUlysses:
      return "ulysses";
    case Strategy::kUsp:
      return "usp";
    case Strategy::kPassKv:
      return "passkv";
    case Strategy::kPassQ:
      return "passq";
  }
  return "?";
}

Strategy parse_strategy(std::string_view name, std::string_view parameter) {
  return parse_named("strategy", name, kStrategies, strategy_name, parameter);
}

std::span<const Strategy> all_strategies() { return kStrategies; }

std::string_view ulysses_mode_name(UlyssesMode m) {
  return m == UlyssesMode::kStrict ? "strict" : "uaa";
}

UlyssesMode parse_ulysses_mode(std::string_view name) {
  return parse_named("ulysses_mode", name, std::array{UlyssesMode::kStrict, UlyssesMode::kUaa},
                     ulysses_mode_name);
}

std::string_view softmax_mode_name(SoftmaxMode m) {
  return m == SoftmaxMode::kConstMax ? "const-max" : "online";
}

SoftmaxMode parse_softmax_mode(std::string_view name) {
  return parse_named("softmax", name, std::array{SoftmaxMode::kOnline, SoftmaxMode::kConstMax},
                     softmax_mode_name);
}

std::string_view schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kDefault:
      return "default";
    case ScheduleKind::kSteal:
      return "steal";
    case ScheduleKind::kRing:
      return "ring";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name, std::string_view parameter) {
  return parse_named("schedule", name,
                     std::array{ScheduleKind::kDefault, ScheduleKind::kSteal, ScheduleKind::kRing},
                     schedule_kind_name, parameter);
}

Layout parse_layout(std::string_view name) {
  return parse_named("layout", name,
                     std::array{Layout::kContiguous, Layout::kStriped, Layout::kZigzag},
                     layout_name);
}

std::span<const NameAlias> name_aliases() { return kAliases; }

std::string mesh_shape_text(const MeshShape& s) {
  return detail::concat("cfg ", s.cfg, " x tp ", s.tp, " x ring ", s.ring, " x ulysses ",
                        s.ulysses);
}

std::string config_label(const ParallelConfig& c) {
  std::string s = detail::concat("cfg ", c.mesh.cfg, " tp ", c.mesh.tp, " ulysses ",
                                 c.mesh.ulysses, " ring ", c.mesh.ring, " ",
                                 strategy_name(c.strategy));
  if (c.strategy == Strategy::kUlysses || c.strategy == Strategy::kUsp)
    s += detail::concat("(", ulysses_mode_name(c.ulysses_mode), ")");
  s += detail::concat(" ", layout_name(c.layout));
  if (c.pad) s += " padded";
  if (c.softmax != SoftmaxMode::kOnline) s += detail::concat(" ", softmax_mode_name(c.softmax));
  if (c.schedule != ScheduleKind::kDefault)
    s += detail::concat(" ", schedule_kind_name(c.schedule));
  return s;
}

int64_t pad_multiple(int sp, Layout layout) {
  return layout == Layout::kZigzag ? 2 * int64_t{sp} : int64_t{sp};
}

int64_t padded_seq(int64_t seq, int sp, Layout layout) {
  const int64_t m = pad_multiple(sp, layout);
  return (seq + m - 1) / m * m;
}

int64_t sharded_seq(const ParallelConfig& c, const AttnShape& s) {
  return c.pad && !s.over_cache() ? padded_seq(s.seq, c.sp(), c.layout) : s.seq;
}

std::vector<int64_t> shape_cu_seqlens(const AttnShape& s) {
  if (s.over_cache()) {
    if (s.cached_lens.empty()) return {};
    std::vector<int64_t> lens(s.cached_lens.size());
    for (size_t i = 0; i < lens.size(); ++i)
      lens[i] = s.cached_lens[i] + (i < s.fresh_lens.size() ? s.fresh_lens[i] : 0);
    return cu_seqlens(lens);
  }
  return s.seq_lens.empty() ? std::vector<int64_t>{} : cu_seqlens(s.seq_lens);
}

Partition sequence_partition(const ParallelConfig& c, const AttnShape& s) {
  const int64_t n = sharded_seq(c, s);
  if (s.seq_lens.empty() || c.layout == Layout::kContiguous) return Partition(n, c.sp(), c.layout);
  return Partition::documents(s.seq_lens, n, c.sp(), c.layout);
}

namespace {

// A list of lengths: each >= 1 (within kMaxTokens), their sum `total` (named `total_name`).
void check_lengths(const char* name, const std::vector<int64_t>& lens, int64_t total,
                   const char* total_name) {
  int64_t sum = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    SEQPAR_PARAM_CHECK(lens[i] >= 1 && lens[i] <= limits::kMaxTokens, name,
                       detail::concat("1 to ", limits::kMaxTokens), param(name), "[", i,
                       "] = ", lens[i], " is invalid; every length must be 1 to ",
                       limits::kMaxTokens);
    sum += lens[i];
    SEQPAR_PARAM_CHECK(sum <= limits::kMaxTokens, name,
                       detail::concat("at most ", limits::kMaxTokens, " tokens in all"),
                       param(name), " sums past ", limits::kMaxTokens, " tokens");
  }
  SEQPAR_PARAM_CHECK(sum == total, name, detail::concat("lengths summing to ", total), param(name),
                     " sum to ", sum, " but ", param(total_name), " is ", total,
                     "; the lengths must add up to ", param(total_name));
}

}  // namespace

void check_config_fields(const ParallelConfig& c, const AttnShape& s) {
  using limits::check_range;
  // Degrees.
  const MeshShape& m = c.mesh;
  const std::pair<const char*, int> degrees[] = {
      {"cfg", m.cfg}, {"tp", m.tp}, {"ring_degree", m.ring}, {"ulysses_degree", m.ulysses}};
  for (const auto& [name, d] : degrees)
    SEQPAR_PARAM_CHECK(d >= 1, name, "at least 1", param(name), " ", d,
                       " is invalid; every degree (", param("cfg"), ", ", param("tp"), ", ",
                       param("ring_degree"), ", ", param("ulysses_degree"), ") must be at least 1");
  (void)limits::checked_product(
      {m.cfg, m.tp, m.ring, m.ulysses},
      detail::concat("ranks of ", param("cfg"), " x ", param("tp"), " x ", param("ring_degree"),
                     " x ", param("ulysses_degree")),
      limits::kMaxRanks);
  // Shape.
  check_range("batch", s.batch, 1, limits::kMaxBatch);
  check_range("heads", s.heads, 1, limits::kMaxHeads);
  check_range("kv_heads", s.kv(), 1, limits::kMaxHeads);
  check_range("head_dim", s.head_dim, 1, limits::kMaxHeadDim);
  check_range("text_tokens", s.text_tokens, 0, limits::kMaxTokens);
  SEQPAR_PARAM_CHECK(s.heads % s.kv() == 0, "kv_heads", divisors_text(s.heads), param("heads"), " ",
                     s.heads, " is not divisible by ", param("kv_heads"), " ", s.kv(), "; valid ",
                     param("kv_heads"), ": ", divisors_text(s.heads));
  SEQPAR_PARAM_CHECK(s.heads % m.tp == 0, "tp", divisors_text(s.heads), param("tp"), " ", m.tp,
                     " does not divide the ", s.heads, " heads; valid ", param("tp"), ": ",
                     divisors_text(s.heads));
  SEQPAR_PARAM_CHECK(s.kv() % m.tp == 0 || m.tp % s.kv() == 0, "tp",
                     "a divisor or a multiple of kv_heads", param("tp"), " ", m.tp,
                     " neither divides nor is a multiple of the ", s.kv(), " kv_heads");
  SEQPAR_PARAM_CHECK(s.text_tokens == 0 || !s.causal, "causal", "false", param("text_tokens"),
                     " (joint attention) are bidirectional; drop ", param("causal"));
  SEQPAR_PARAM_CHECK(!s.text_by_heads || (s.text_tokens > 0 && m.ulysses > 1), "text_by_heads",
                     "text_tokens and ulysses_degree > 1", param("text_by_heads"),
                     " splits the text tokens by head over a Ulysses group: it needs ",
                     param("text_tokens"), " and ", param("ulysses_degree"),
                     " > 1 (strategy ulysses or usp)");
  SEQPAR_PARAM_CHECK(s.out_dtype == DType::kF32 || s.out_dtype == s.dtype, "out_dtype",
                     detail::concat("fp32 or ", dtype_name(s.dtype)), param("out_dtype"), " ",
                     dtype_name(s.out_dtype), " is neither fp32 nor the inputs' dtype ",
                     dtype_name(s.dtype));
  const int sp = m.sp();
  if (s.over_cache()) {
    SEQPAR_PARAM_CHECK(s.cached_lens.size() == s.fresh_lens.size(), "fresh_lens",
                       detail::concat(s.cached_lens.size(), " lengths"), param("cached_lens"), " (",
                       s.cached_lens.size(), " requests) and ", param("fresh_lens"), " (",
                       s.fresh_lens.size(), " requests) must have one length per request");
    if (!s.cached_lens.empty()) {  // first: cached and new are their sums
      check_lengths("cached_lens", s.cached_lens, s.cached, "cached");
      check_lengths("fresh_lens", s.fresh_lens, s.fresh, "new");
    }
    check_range("cached", s.cached, 1, limits::kMaxTokens);
    check_range("new", s.fresh, 1, limits::kMaxTokens);
    SEQPAR_PARAM_CHECK(s.cached >= sp, "cached", detail::concat("at least ", sp), param("cached"),
                       " ", s.cached, " is too small: each of the ", sp,
                       " sequence-parallel ranks needs at least one cached token");
    SEQPAR_PARAM_CHECK(!c.pad && s.text_tokens == 0, c.pad ? "pad" : "text_tokens", "none",
                       "a K/V cache (", param("cached"), ", ", param("new"), ") takes no ",
                       param("pad"), " and no ", param("text_tokens"));
    SEQPAR_PARAM_CHECK(s.seq_lens.empty(), "seq_lens", "none", param("seq_lens"),
                       " describe a sequence; over a K/V cache give ", param("cached_lens"),
                       " and ", param("fresh_lens"), " (one per request)");
    return;
  }
  SEQPAR_PARAM_CHECK(s.cached_lens.empty() && s.fresh_lens.empty(),
                     s.cached_lens.empty() ? "fresh_lens" : "cached_lens", "none",
                     param("cached_lens"), " and ", param("fresh_lens"),
                     " describe requests over a K/V cache (", param("cached"), ", ", param("new"),
                     "); over a sequence give ", param("seq_lens"));
  check_range("seq", s.seq, 1, limits::kMaxTokens);
  SEQPAR_PARAM_CHECK(sp <= s.seq, "seq", detail::concat("at least ", sp), sp,
                     " sequence-parallel ranks exceed ", param("seq"), " ", s.seq,
                     "; every rank needs a real token: at most ", s.seq, " ranks");
  if (!s.seq_lens.empty()) {
    check_lengths("seq_lens", s.seq_lens, s.seq, "seq");
    SEQPAR_PARAM_CHECK(s.text_tokens == 0, "text_tokens", "0 with seq_lens", param("text_tokens"),
                       " (joint attention) with ", param("seq_lens"),
                       " (packed documents) is not supported; give one or the other");
    (void)sequence_partition(c, s);  // every rank holds a token
  }
}

}  // namespace seqpar
