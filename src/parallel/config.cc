#include "seqpar/parallel/config.h"

#include <array>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"

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
  throw InvalidArgument(detail::concat(parameter.empty() ? kind : parameter, " '", name,
                                       "' is unknown; valid: ", valid));
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
    SEQPAR_ARG_CHECK(lens[i] >= 1 && lens[i] <= limits::kMaxTokens, name, "[", i, "] = ", lens[i],
                     " is invalid; every length must be 1 to ", limits::kMaxTokens);
    sum += lens[i];
    SEQPAR_ARG_CHECK(sum <= limits::kMaxTokens, name, " sums past ", limits::kMaxTokens, " tokens");
  }
  SEQPAR_ARG_CHECK(sum == total, name, " sum to ", sum, " but ", total_name, " is ", total,
                   "; the lengths must add up to ", total_name);
}

}  // namespace

void check_config_fields(const ParallelConfig& c, const AttnShape& s) {
  using limits::check_range;
  // Degrees.
  const MeshShape& m = c.mesh;
  const std::pair<const char*, int> degrees[] = {
      {"cfg", m.cfg}, {"tp", m.tp}, {"ring_degree", m.ring}, {"ulysses_degree", m.ulysses}};
  for (const auto& [name, d] : degrees)
    SEQPAR_ARG_CHECK(d >= 1, name, " ", d, " is invalid; every degree (cfg, tp, ring_degree, ",
                     "ulysses_degree) must be at least 1");
  (void)limits::checked_product({m.cfg, m.tp, m.ring, m.ulysses},
                                "ranks of cfg x tp x ring_degree x ulysses_degree",
                                limits::kMaxRanks);
  // Shape.
  check_range("batch", s.batch, 1, limits::kMaxBatch);
  check_range("heads", s.heads, 1, limits::kMaxHeads);
  check_range("kv_heads", s.kv(), 1, limits::kMaxHeads);
  check_range("head_dim", s.head_dim, 1, limits::kMaxHeadDim);
  check_range("text_tokens", s.text_tokens, 0, limits::kMaxTokens);
  SEQPAR_ARG_CHECK(s.heads % s.kv() == 0, "heads ", s.heads, " is not divisible by kv_heads ",
                   s.kv(), "; valid kv_heads: ", divisors_text(s.heads));
  SEQPAR_ARG_CHECK(s.heads % m.tp == 0, "tp ", m.tp, " does not divide the ", s.heads,
                   " heads; valid tp: ", divisors_text(s.heads));
  SEQPAR_ARG_CHECK(s.kv() % m.tp == 0 || m.tp % s.kv() == 0, "tp ", m.tp,
                   " neither divides nor is a multiple of the ", s.kv(), " kv_heads");
  SEQPAR_ARG_CHECK(s.text_tokens == 0 || !s.causal, "text_tokens (joint attention) are ",
                   "bidirectional; drop causal");
  SEQPAR_ARG_CHECK(!s.text_by_heads || (s.text_tokens > 0 && m.ulysses > 1), "text_by_heads ",
                   "splits the text tokens by head over a Ulysses group: it needs text_tokens ",
                   "and ulysses_degree > 1 (strategy ulysses or usp)");
  SEQPAR_ARG_CHECK(s.out_dtype == DType::kF32 || s.out_dtype == s.dtype, "out_dtype ",
                   dtype_name(s.out_dtype), " is neither fp32 nor the inputs' dtype ",
                   dtype_name(s.dtype));
  const int sp = m.sp();
  if (s.over_cache()) {
    SEQPAR_ARG_CHECK(s.cached_lens.size() == s.fresh_lens.size(), "cached_lens (",
                     s.cached_lens.size(), " requests) and fresh_lens (", s.fresh_lens.size(),
                     " requests) must have one length per request");
    if (!s.cached_lens.empty()) {  // first: cached and new are their sums
      check_lengths("cached_lens", s.cached_lens, s.cached, "cached");
      check_lengths("fresh_lens", s.fresh_lens, s.fresh, "new");
    }
    check_range("cached", s.cached, 1, limits::kMaxTokens);
    check_range("new", s.fresh, 1, limits::kMaxTokens);
    SEQPAR_ARG_CHECK(s.cached >= sp, "cached ", s.cached, " is too small: each of the ", sp,
                     " sequence-parallel ranks needs at least one cached token");
    SEQPAR_ARG_CHECK(!c.pad && s.text_tokens == 0, "a K/V cache (cached, new) takes no pad ",
                     "and no text_tokens");
    SEQPAR_ARG_CHECK(s.seq_lens.empty(), "seq_lens describe a sequence; over a K/V cache give ",
                     "cached_lens and fresh_lens (one per request)");
    return;
  }
  SEQPAR_ARG_CHECK(
      s.cached_lens.empty() && s.fresh_lens.empty(), "cached_lens and fresh_lens ",
      "describe requests over a K/V cache (cached, new); over a sequence give seq_lens");
  check_range("seq", s.seq, 1, limits::kMaxTokens);
  SEQPAR_ARG_CHECK(sp <= s.seq, sp, " sequence-parallel ranks exceed seq ", s.seq,
                   "; every rank needs a real token: at most ", s.seq, " ranks");
  if (!s.seq_lens.empty()) {
    check_lengths("seq_lens", s.seq_lens, s.seq, "seq");
    SEQPAR_ARG_CHECK(s.text_tokens == 0, "text_tokens (joint attention) with seq_lens (packed ",
                     "documents) is not supported; give one or the other");
    (void)sequence_partition(c, s);  // every rank holds a token
  }
}

}  // namespace seqpar
