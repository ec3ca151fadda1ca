// The vocabulary of a parallel layout (parallel/config.h) and the parallel-config files and
// degree names of other engines (parallel/config_file.h), each against a brute-force or
// hand-written oracle.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "seqpar/core/dtype.h"
#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"
#include "seqpar/parallel/config.h"
#include "seqpar/parallel/config_file.h"
#include "seqpar/parallel/mesh.h"
#include "seqpar/parallel/strategy_table.h"

namespace seqpar {
namespace {

// The message of the InvalidArgument fn throws ("" if it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Names, EveryCanonicalNameAndAliasParses) {
  for (Strategy s : all_strategies()) EXPECT_EQ(parse_strategy(strategy_name(s)), s);
  const std::pair<const char*, Strategy> aliases[] = {
      {"all-gather", Strategy::kAllGather}, {"all_gather", Strategy::kAllGather},
      {"pass-kv", Strategy::kPassKv},       {"pass_kv", Strategy::kPassKv},
      {"pass-q", Strategy::kPassQ},         {"pass_q", Strategy::kPassQ},
      {"hybrid", Strategy::kUsp}};
  for (const auto& [alias, s] : aliases) EXPECT_EQ(parse_strategy(alias), s) << alias;
  EXPECT_EQ(parse_ulysses_mode("advanced_uaa"), UlyssesMode::kUaa);
  EXPECT_EQ(parse_ulysses_mode("strict"), UlyssesMode::kStrict);
  EXPECT_EQ(parse_softmax_mode("const_max"), SoftmaxMode::kConstMax);
  EXPECT_EQ(parse_layout("zigzag"), Layout::kZigzag);
  // Every alias of the table resolves to its canonical value.
  for (const NameAlias& a : name_aliases()) {
    if (a.kind == "strategy") {
      EXPECT_EQ(strategy_name(parse_strategy(a.alias)), a.name);
    } else if (a.kind == "ulysses_mode") {
      EXPECT_EQ(ulysses_mode_name(parse_ulysses_mode(a.alias)), a.name);
    } else {
      EXPECT_EQ(softmax_mode_name(parse_softmax_mode(a.alias)), a.name);
    }
  }
  EXPECT_EQ(error_of([] { parse_strategy("rign"); }),
            "strategy 'rign' is unknown; valid: local, allgather, ring, ulysses, usp, passkv, "
            "passq");
  EXPECT_EQ(error_of([] { parse_layout("custom"); }),
            "layout 'custom' is unknown; valid: contiguous, striped, zigzag");
}

TEST(Padding, SmallestMultipleOfTheRanksOrTwiceForZigzag) {
  for (int sp = 1; sp <= 9; ++sp)
    for (int64_t seq = 1; seq <= 60; ++seq)
      for (Layout layout : {Layout::kContiguous, Layout::kStriped, Layout::kZigzag}) {
        const int64_t m = layout == Layout::kZigzag ? 2 * sp : sp;
        int64_t want = seq;
        while (want % m != 0) ++want;  // the oracle: count up
        EXPECT_EQ(padded_seq(seq, sp, layout), want) << seq << " on " << sp;
        ParallelConfig c;
        c.mesh.ring = sp;
        c.layout = layout;
        AttnShape s;
        s.seq = seq;
        EXPECT_EQ(sharded_seq(c, s), seq);
        c.pad = true;
        EXPECT_EQ(sharded_seq(c, s), want);
      }
}

TEST(Degrees, FilledDegreesMultiplyToTheRanks) {
  for (int n = 1; n <= 12; ++n)
    for (int64_t heads = 1; heads <= 12; ++heads) {
      ParallelConfig c;
      c.strategy = Strategy::kUsp;
      c.mesh.ulysses = c.mesh.ring = 0;
      fill_sp_degrees(c, n, heads);
      int best = 1;  // the oracle: the largest divisor of n dividing heads
      for (int d = 1; d <= n; ++d)
        if (n % d == 0 && heads % d == 0) best = d;
      EXPECT_EQ(c.mesh.ulysses, best) << n << " ranks, " << heads << " heads";
      EXPECT_EQ(c.mesh.ulysses * c.mesh.ring, n);
      for (Strategy s : {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses}) {
        ParallelConfig d;
        d.strategy = s;
        d.mesh.ulysses = d.mesh.ring = 0;
        fill_sp_degrees(d, n, heads);
        EXPECT_EQ(d.mesh.sp(), n);
        EXPECT_EQ(d.mesh.ulysses, s == Strategy::kUlysses ? n : 1);
      }
    }
  ParallelConfig c;
  c.strategy = Strategy::kUsp;
  c.mesh.ulysses = 3;
  c.mesh.ring = 0;
  EXPECT_EQ(error_of([&] { fill_sp_degrees(c, 4, 4); }),
            "ulysses_degree 3 x ring_degree 0 must equal the 4 ranks; valid ulysses degrees: 1, "
            "2, 4");
  c.strategy = Strategy::kRing;
  c.mesh.ulysses = 2;
  EXPECT_NE(error_of([&] { fill_sp_degrees(c, 4, 4); }).find("use strategy usp"),
            std::string::npos);
}

TEST(Degrees, StrategyFollowsTheDegrees) {
  EXPECT_EQ(strategy_for_degrees(2, 2, Strategy::kRing), Strategy::kUsp);
  EXPECT_EQ(strategy_for_degrees(2, 1, Strategy::kAllGather), Strategy::kUlysses);
  EXPECT_EQ(strategy_for_degrees(1, 4, Strategy::kAllGather), Strategy::kAllGather);
  EXPECT_EQ(strategy_for_degrees(1, 1, Strategy::kRing), Strategy::kRing);
  EXPECT_NE(error_of([] { strategy_for_degrees(1, 2, Strategy::kUsp); }), "");
}

// A valid config and shape that each case below breaks in one way.
struct Base {
  ParallelConfig c;
  AttnShape s;
  Base() {
    c.mesh.ring = 4;
    s.seq = 64;
    s.heads = 8;
    s.kv_heads = 2;
    s.head_dim = 16;
  }
};

TEST(Validate, EachRuleNamesWhatWasWrong) {
  EXPECT_EQ(error_of([] { Base b; validate_config(b.c, b.s); }), "");
  const std::pair<std::string, std::function<void(Base&)>> cases[] = {
      {"ring_degree 0 is invalid", [](Base& b) { b.c.mesh.ring = 0; }},
      {"heads 8 is not divisible by kv_heads 3", [](Base& b) { b.s.kv_heads = 3; }},
      {"tp 3 does not divide the 8 heads", [](Base& b) { b.c.mesh.tp = 3; }},
      {"tp 3 neither divides", [](Base& b) { b.s.kv_heads = 8, b.s.heads = 24, b.c.mesh.tp = 3; }},
      {"strategy local needs one", [](Base& b) { b.c.strategy = Strategy::kLocal; }},
      {"strategy ring takes no ulysses_degree", [](Base& b) { b.c.mesh.ulysses = 2; }},
      {"ring_degree 4 needs strategy usp", [](Base& b) { b.c.strategy = Strategy::kUlysses; }},
      {"softmax 'const-max' needs a ring",
       [](Base& b) { b.c.strategy = Strategy::kAllGather, b.c.softmax = SoftmaxMode::kConstMax; }},
      {"bidirectional; drop causal", [](Base& b) { b.s.text_tokens = 3, b.s.causal = true; }},
      {"runs over a K/V cache", [](Base& b) { b.c.strategy = Strategy::kPassQ; }},
      {"does not run over a K/V cache", [](Base& b) { b.s.cached = 10, b.s.fresh = 1; }},
      {"cached 3 is too small",
       [](Base& b) { b.c.strategy = Strategy::kPassKv, b.s.cached = 3, b.s.fresh = 1; }},
      {"takes no pad", [](Base& b) {
         b.c.strategy = Strategy::kPassKv, b.s.cached = 8, b.s.fresh = 1, b.c.pad = true;
       }},
      {"4 sequence-parallel ranks exceed seq 3", [](Base& b) { b.s.seq = 3; }},
      {"ulysses_mode 'strict' needs heads 6 divisible", [](Base& b) {
         b.c.strategy = Strategy::kUlysses, b.c.mesh = {1, 1, 1, 4}, b.s.heads = 6,
         b.s.kv_heads = 6, b.c.ulysses_mode = UlyssesMode::kStrict;
       }},
  };
  for (const auto& [want, breaks] : cases) {
    Base b;
    breaks(b);
    const std::string got = error_of([&] { validate_config(b.c, b.s); });
    EXPECT_NE(got.find(want), std::string::npos) << "want '" << want << "', got '" << got << "'";
  }
}

// Runs `fails` and checks its error carries `parameter` and `expected` as data, spells as
// `command_line` (somewhere in it) on the command line, and has no marks in what().
void expect_param_error(const std::function<void()>& fails, const std::string& parameter,
                        const std::string& expected, const std::string& command_line) {
  try {
    fails();
    ADD_FAILURE() << "no error for " << command_line;
  } catch (const ParamError& e) {
    EXPECT_EQ(e.parameter(), parameter) << e.what();
    EXPECT_EQ(e.expected(), expected) << e.what();
    const std::string cli = e.spelled(
        [](std::string_view n) { return "--" + front_end_name(n, FrontEnd::kCommandLine); });
    const std::string plain = e.what();
    EXPECT_NE(cli.find(command_line), std::string::npos) << cli;
    EXPECT_EQ(plain.find_first_of("\x01\x02"), std::string::npos) << plain;
    EXPECT_EQ(plain, e.spelled([](std::string_view n) { return std::string(n); }));
  } catch (const InvalidArgument& e) {
    ADD_FAILURE() << "prose, not a ParamError, for " << command_line << ": " << e.what();
  }
}

// Errors as data (core/param_error.h): each rule's error names the parameter that was wrong and
// what would be valid, and spells every parameter it mentions as the front end asks; what()
// keeps the vocabulary's names and no marks.
TEST(Validate, ErrorsCarryTheParameter) {
  struct Case {
    std::string parameter, expected, command_line;
    std::function<void(Base&)> breaks;
  };
  const Case cases[] = {
      {"ring_degree", "at least 1",
       "--ring-degree 0 is invalid; every degree (--cfg, --tp, "
       "--ring-degree, --ulysses-degree) must be at least 1",
       [](Base& b) { b.c.mesh.ring = 0; }},
      {"kv_heads", "1, 2, 4, 8",
       "--heads 8 is not divisible by --kv-heads 3; valid --kv-heads: "
       "1, 2, 4, 8",
       [](Base& b) { b.s.kv_heads = 3; }},
      {"tp", "1, 2, 4, 8", "--tp 3 does not divide the 8 heads; valid --tp: 1, 2, 4, 8",
       [](Base& b) { b.c.mesh.tp = 3; }},
      {"sequence_parallel_size", "1", "--strategy local needs one sequence-parallel rank, not 4",
       [](Base& b) { b.c.strategy = Strategy::kLocal; }},
      {"ulysses_degree", "1",
       "--strategy ring takes no --ulysses-degree (2); use --strategy usp "
       "to combine --ulysses-degree and --ring-degree",
       [](Base& b) { b.c.mesh.ulysses = 2; }},
      {"softmax", "online", "--softmax 'const-max' needs a ring",
       [](Base& b) { b.c.strategy = Strategy::kAllGather, b.c.softmax = SoftmaxMode::kConstMax; }},
      {"causal", "false", "--text-tokens (joint attention) are bidirectional; drop --causal",
       [](Base& b) { b.s.text_tokens = 3, b.s.causal = true; }},
      {"cached", "at least 4", "--cached 3 is too small",
       [](Base& b) { b.c.strategy = Strategy::kPassKv, b.s.cached = 3, b.s.fresh = 1; }},
      {"cached", "at least 1", "runs over a K/V cache: --cached 0 and --new 0 must both be",
       [](Base& b) { b.c.strategy = Strategy::kPassQ; }},
      {"seq", "at least 4", "4 sequence-parallel ranks exceed --seq 3",
       [](Base& b) { b.s.seq = 3; }},
      {"heads", "1 to 65536 (2^16)", "--heads 0 is out of range; valid: 1 to 65536 (2^16)",
       [](Base& b) { b.s.heads = 0; }},
      {"ulysses_mode", "uaa",
       "--ulysses-mode 'strict' needs --heads 6 divisible by the Ulysses degree 4; valid degrees "
       "here: 1, 2; or use --ulysses-mode 'uaa'",
       [](Base& b) {
         b.c.strategy = Strategy::kUlysses, b.c.mesh = {1, 1, 1, 4}, b.s.heads = 6,
         b.s.kv_heads = 6, b.c.ulysses_mode = UlyssesMode::kStrict;
       }},
      {"fresh_lens", "lengths summing to 2", "--new-lens sum to 3 but --new is 2",
       [](Base& b) {
         b.c.strategy = Strategy::kPassKv, b.s.cached = 8, b.s.fresh = 2;
         b.s.cached_lens = {4, 4}, b.s.fresh_lens = {1, 2};
       }},
  };
  for (const Case& c : cases) {
    expect_param_error(
        [&] {
          Base b;
          c.breaks(b);
          validate_config(b.c, b.s);
        },
        c.parameter, c.expected, c.command_line);
  }
  EXPECT_EQ(front_end_name("fresh_lens", FrontEnd::kCommandLine), "new-lens");
  EXPECT_EQ(front_end_name("fresh_lens", FrontEnd::kPython), "fresh_lens");
  EXPECT_EQ(front_end_name("ulysses_degree", FrontEnd::kPython), "ulysses_degree");
  EXPECT_EQ(front_end_name("ulysses_degree", FrontEnd::kCommandLine), "ulysses-degree");
  EXPECT_EQ(front_end_name("--seq", FrontEnd::kCommandLine), "--seq");
}

// The library's other parameter checks (the degrees of a parallel config, dtype, threads, the
// mesh's size, sums and products of named counts) carry their parameter the same way.
TEST(Validate, LibraryChecksCarryTheParameter) {
  struct Case {
    std::string parameter, expected, command_line;
    std::function<void()> fails;
  };
  auto spec = [](std::optional<int64_t> sp, std::optional<int64_t> u, std::optional<int64_t> r) {
    DegreeSpec d;
    d.sp = sp, d.ulysses = u, d.ring = r;
    return d;
  };
  const Case cases[] = {
      {"sequence_parallel_size", "6",
       "--sequence-parallel-size 4 must equal --ulysses-degree x --ring-degree = 2 x 3",
       [&] { (void)resolve_degrees(spec(4, 2, 3)); }},
      {"ulysses_degree", "1, 2, 4", "--ulysses-degree 3 does not divide --sequence-parallel-size 4",
       [&] { (void)resolve_degrees(spec(4, 3, std::nullopt)); }},
      {"ring_degree", "1, 2, 4", "--ring-degree 3 does not divide --sequence-parallel-size 4",
       [&] { (void)resolve_degrees(spec(4, std::nullopt, 3)); }},
      {"dtype", "fp32, bf16, fp16", "--dtype 'int8' is unknown; valid: fp32, bf16, fp16",
       [] { (void)parse_dtype("int8"); }},
      {"ranks", "", "--ranks 100 x --threads 100 = 10000 threads in one process",
       [] { limits::check_threads(100, 100); }},
      {"cfg", "", "the world size --cfg 1 x --tp 2 x --ring-degree 256 x --ulysses-degree 256",
       [] {
         (void)Mesh(MeshShape{1, 2, 256, 256});
       }},
      {"seq", "", "tokens (--seq + --text-tokens) (9223372036854775807 + 1) exceeds",
       [] {
         (void)limits::checked_add(
             INT64_MAX, 1,
             detail::concat("tokens (", param("seq"), " + ", param("text_tokens"), ")"));
       }},
  };
  for (const Case& c : cases) expect_param_error(c.fails, c.parameter, c.expected, c.command_line);
  // A count named in prose stays prose.
  try {
    (void)limits::checked_add(INT64_MAX, 1, "parameter count");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(dynamic_cast<const ParamError*>(&e), nullptr) << e.what();
    EXPECT_STREQ(
        e.what(),
        "parameter count (9223372036854775807 + 1) exceeds the maximum 9223372036854775807");
  }
}

TEST(ConfigFile, JsonFlatAndNested) {
  DegreeSpec d = parse_parallel_config(
      R"({"tensor_parallel_size": 2, "ulysses_degree": 4, "ulysses_mode": "advanced_uaa"})", "f");
  EXPECT_EQ(d.tp, 2);
  EXPECT_EQ(d.ulysses, 4);
  EXPECT_EQ(d.ulysses_mode, "uaa");
  EXPECT_FALSE(d.ring || d.cfg || d.sp);
  d = parse_parallel_config(
      R"({"stage_args": [{"stage_id": 0, "engine_args": {"model": "x",
          "parallel_config": {"ring_degree": 2, "cfg_parallel_size": 2}}}]})",
      "f");
  EXPECT_EQ(d.ring, 2);
  EXPECT_EQ(d.cfg, 2);
  EXPECT_FALSE(d.tp);
}

TEST(ConfigFile, YamlAsStageConfigsWriteIt) {
  const std::string stage = R"(# stage config
stage_args:
  - stage_id: 0
    engine_args:
      model: "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
      parallel_config:
        tensor_parallel_size: 1
        ulysses_degree: 2   # two heads groups
        ring_degree: 2
        ulysses_mode: 'strict'
      dtype: bf16
  - stage_id: 1
)";
  DegreeSpec d = parse_parallel_config(stage, "stage.yaml");
  EXPECT_EQ(d.tp, 1);
  EXPECT_EQ(d.ulysses, 2);
  EXPECT_EQ(d.ring, 2);
  EXPECT_EQ(d.ulysses_mode, "strict");
  d = parse_parallel_config("sequence_parallel_size: 8\nulysses_degree: 4\n", "flat.yaml");
  EXPECT_EQ(d.sp, 8);
  EXPECT_EQ(d.ulysses, 4);
}

TEST(ConfigFile, MalformedFilesGiveOneLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"ulysses_degree: 2\nfoo: 1\n", "'foo' is not a parallel-config key; valid: "},
      {"ulysses_degree: two\n", "'ulysses_degree' is 'two'; valid: an integer from 1"},
      {"ulysses_degree: 0\n", "valid: an integer from 1"},
      {"ulysses_degree: \"2\"\n", "valid: an integer from 1"},
      {"pipeline_parallel_size: 2\n", "runs no pipeline or data parallelism"},
      {"ulysses_mode: fast\n", "ulysses_mode 'fast' is unknown"},
      {"parallel_config:\n\tulysses_degree: 2\n", "indented with a tab"},
      {"just words\n", "is not 'key: value'"},
      {"parallel_config:\n  ring:\n    x: 1\n", "holds a nested mapping"},
      {"ulysses_degree: 2\nextra:\n  foo: 1\n", "has no parallel_config mapping"},
      {"{\"ulysses_degree\": [2]}", "valid: an integer from 1"},
      {"{\"ulysses_degree\": 2", "not valid JSON"},
  };
  for (const auto& [text, want] : cases) {
    const std::string got = error_of([&] { parse_parallel_config(text, "pc"); });
    EXPECT_NE(got.find(want), std::string::npos) << "text '" << text << "': got '" << got << "'";
    EXPECT_EQ(got.find('\n'), std::string::npos) << got;
  }
  EXPECT_NE(error_of([] {
              read_parallel_config_file("/nonexistent/pc.yaml");
            }).find("cannot open the file"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_parallel_config_file("/"); }).find("is a directory, not a"),
            std::string::npos);
}

TEST(ConfigFile, ReadFromDisk) {
  const std::string path = testing::TempDir() + "/seqpar_pc.yaml";
  {
    std::ofstream f(path);
    f << "parallel_config:\n  ulysses_degree: 2\n  ring_degree: 3\n";
  }
  const DegreeSpec d = read_parallel_config_file(path);
  std::remove(path.c_str());
  EXPECT_EQ(d.ulysses, 2);
  EXPECT_EQ(d.ring, 3);
}

TEST(ConfigFile, SequenceParallelSizeResolvesTheDegrees) {
  auto degrees = [](std::optional<int64_t> sp, std::optional<int64_t> u,
                    std::optional<int64_t> r) {
    DegreeSpec d;
    d.sp = sp;
    d.ulysses = u;
    d.ring = r;
    const MeshShape m = resolve_degrees(d);
    return std::pair{m.ulysses, m.ring};
  };
  EXPECT_EQ(degrees(std::nullopt, std::nullopt, std::nullopt), std::pair(1, 1));
  EXPECT_EQ(degrees(8, std::nullopt, std::nullopt), std::pair(1, 8));
  EXPECT_EQ(degrees(8, 2, std::nullopt), std::pair(2, 4));
  EXPECT_EQ(degrees(8, std::nullopt, 2), std::pair(4, 2));
  EXPECT_EQ(degrees(8, 4, 2), std::pair(4, 2));
  EXPECT_EQ(degrees(std::nullopt, 2, 3), std::pair(2, 3));
  EXPECT_NE(error_of([&] { degrees(8, 3, std::nullopt); }).find("does not divide"),
            std::string::npos);
  EXPECT_NE(error_of([&] { degrees(8, 2, 2); }).find("must equal"), std::string::npos);
  // Flags replace what the file gave.
  DegreeSpec file, flags;
  file.ulysses = 2;
  file.tp = 2;
  flags.ulysses = 4;
  const DegreeSpec m = file.merged_with(flags);
  EXPECT_EQ(m.ulysses, 4);
  EXPECT_EQ(m.tp, 2);
}

}  // namespace
}  // namespace seqpar
