// Hardware profiles (built-in JSON, files, user directory), position runs against Partition and
// visible_score_elements, and the scaling simulation with its SVG.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "seqpar/attention/attention.h"
#include "seqpar/plan/hardware.h"
#include "seqpar/parallel/position_runs.h"
#include "seqpar/plan/simulate.h"

namespace seqpar {
namespace {

// ---- hardware profiles -------------------------------------------------------------------------

TEST(Hardware, BuiltInProfiles) {
  const auto names = hardware_profile_names();
  for (const char* n : {"h100", "h200", "cpu-ethernet", "local"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  const HardwareProfile h100 = hardware_profile("h100");
  EXPECT_DOUBLE_EQ(h100.attention_flops, 989e12);
  EXPECT_DOUBLE_EQ(h100.intra_node_bw, 450e9);
  EXPECT_DOUBLE_EQ(h100.inter_node_bw, 50e9);
  EXPECT_EQ(h100.ranks_per_node, 8);
  EXPECT_DOUBLE_EQ(h100.memory_bytes, 80e9);
  EXPECT_EQ(h100.source, "built-in");
  EXPECT_DOUBLE_EQ(hardware_profile("h200").memory_bytes, 141e9);
  EXPECT_TRUE(hardware_profile("local").shared_node);
  EXPECT_THROW(hardware_profile("tpu"), InvalidArgument);
}

TEST(Hardware, JsonRoundTripAndErrors) {
  HardwareProfile p = hardware_profile("cpu-ethernet");
  const HardwareProfile q = hardware_profile_from_json(hardware_profile_to_json(p), "x");
  EXPECT_EQ(q.name, p.name);
  EXPECT_DOUBLE_EQ(q.inter_node_bw, p.inter_node_bw);
  EXPECT_DOUBLE_EQ(q.inter_node_latency_s, p.inter_node_latency_s);
  EXPECT_EQ(q.ranks_per_node, p.ranks_per_node);
  EXPECT_THROW(hardware_profile_from_json("{", "x"), InvalidArgument);
  EXPECT_THROW(hardware_profile_from_json(R"({"name":"a","attention_flops":1,"intra_node_bw":1,
      "inter_node_bw":1,"bogus":3})",
                                          "x"),
               InvalidArgument);
  EXPECT_THROW(hardware_profile_from_json(R"({"name":"a","attention_flops":"fast",
      "intra_node_bw":1,"inter_node_bw":1})",
                                          "x"),
               InvalidArgument);
  EXPECT_THROW(hardware_profile_from_json(R"({"name":"a"})", "x"), InvalidArgument);
  // An older profile without the planner's fields keeps their defaults.
  const HardwareProfile old = hardware_profile_from_json(
      R"({"name":"old","attention_flops":1e12,"intra_node_bw":1e10,"inter_node_bw":1e9,
          "latency_s":1e-5,"ranks_per_node":4,"memory_bytes":1e10})",
      "x");
  EXPECT_DOUBLE_EQ(old.overlap, 1.0);
  EXPECT_FALSE(old.shared_node);
}

TEST(Hardware, FilesAndTheUserDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("seqpar_profiles_" + std::to_string(getpid()));
  fs::create_directories(dir);
  HardwareProfile p = hardware_profile("local");
  p.attention_flops = 123e9;
  p.description = "calibrated";
  std::ofstream(dir / "local.json") << hardware_profile_to_json(p);
  // A path.
  const HardwareProfile by_path = load_hardware_profile((dir / "local.json").string());
  EXPECT_DOUBLE_EQ(by_path.attention_flops, 123e9);
  EXPECT_EQ(by_path.source, (dir / "local.json").string());
  // By name through SEQPAR_PROFILE_DIR, before the built-in one.
  setenv("SEQPAR_PROFILE_DIR", dir.c_str(), 1);
  EXPECT_EQ(user_profile_dir(), dir.string());
  EXPECT_DOUBLE_EQ(load_hardware_profile("local").attention_flops, 123e9);
  EXPECT_DOUBLE_EQ(load_hardware_profile("h100").attention_flops, 989e12);  // no file: built-in
  // The built-in lookup never reads files.
  EXPECT_DOUBLE_EQ(hardware_profile("local").attention_flops, 50e9);
  unsetenv("SEQPAR_PROFILE_DIR");
  EXPECT_THROW(load_hardware_profile((dir / "missing.json").string()), InvalidArgument);
  fs::remove_all(dir);
}

// A profile nesting 100,000 lists used to overflow the stack when the error quoted the value
// (plan --hardware FILE, run --strategy auto); it is rejected before parsing, with one line.
// Long keys and values are quoted cut short.
TEST(Hardware, RejectsDeepNestingAndQuotesShort) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  const std::string base = R"("attention_flops":1,"intra_node_bw":1,"inter_node_bw":1)";
  auto message = [](const std::string& text) -> std::string {
    try {
      hardware_profile_from_json(text, "p.json");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    ADD_FAILURE() << "accepted: " << text.substr(0, 200);
    return "";
  };
  for (const std::string& text : {R"({"name":)" + deep + "," + base + "}",
                                  R"({"name":"a","description":)" + deep + "," + base + "}",
                                  R"({"name":"a",)" + base + R"(,"x":)" + deep + "}", deep}) {
    const std::string msg = message(text);
    EXPECT_NE(msg.find("hardware profile p.json: the JSON nests arrays and objects deeper than"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 150u) << msg;
  }
  const std::string long_text(1 << 16, 'x');
  for (const std::string& text :
       {R"({"name":")" + long_text + R"(",)" + base + R"(,"ranks_per_node":")" + long_text +
            R"("})",
        R"({"name":"a",)" + base + R"(,")" + long_text + R"(":1})",
        R"({"name":"a",)" + base + R"(,"description":[")" + long_text + R"("]})",
        R"({"name":")" + long_text}) {
    const std::string msg = message(text);
    EXPECT_NE(msg.find("..."), std::string::npos) << msg.substr(0, 400);
    EXPECT_LT(msg.size(), 400u) << msg.substr(0, 400);
  }
  // A number past double's range is an argument error too (found by fuzz_hardware_profile: it
  // escaped as nlohmann's out_of_range, quoting the whole number).
  const std::string huge = "1e" + std::string(5000, '3');
  for (const std::string& text :
       {R"({"name":)" + huge + "," + base + "}",
        R"({"name":"a","attention_flops":)" + huge + R"(,"intra_node_bw":1,"inter_node_bw":1})"}) {
    const std::string msg = message(text);
    EXPECT_NE(msg.find("hardware profile p.json is not valid JSON: "), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 300u) << msg;
  }
  // Over the size limit, before parsing.
  EXPECT_NE(
      message(R"({"description":")" + std::string(2 << 20, 'd') + R"("})").find("over the limit"),
      std::string::npos);
  // The same through the file reader behind --hardware FILE.
  namespace fs = std::filesystem;
  const fs::path file =
      fs::temp_directory_path() / ("seqpar_deep_" + std::to_string(getpid()) + ".json");
  std::ofstream(file) << R"({"name":)" << deep << "," << base << "}";
  try {
    load_hardware_profile(file.string());
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("deeper than"), std::string::npos) << e.what();
  }
  fs::remove(file);
}

TEST(Hardware, SharedNodeRates) {
  HardwareProfile p = hardware_profile("local");
  p.cores_per_node = 4;
  p.attention_flops = 10e9;
  p.thread_efficiency = 0.9;
  EXPECT_EQ(threads_per_rank(p, 1), 4);
  EXPECT_DOUBLE_EQ(rank_attention_flops(p, 1), 4 * 0.9 * 10e9);
  EXPECT_DOUBLE_EQ(rank_attention_flops(p, 2), 2 * 0.9 * 10e9);
  EXPECT_DOUBLE_EQ(rank_attention_flops(p, 4), 10e9);
  EXPECT_DOUBLE_EQ(rank_attention_flops(p, 8), 5e9);  // 8 one-thread ranks share 4 cores
  EXPECT_DOUBLE_EQ(rank_memory_bytes(p, 4), p.memory_bytes / 4);
  const HardwareProfile gpu = hardware_profile("h100");
  EXPECT_DOUBLE_EQ(rank_attention_flops(gpu, 8), gpu.attention_flops);
}

// ---- position runs -----------------------------------------------------------------------------

std::vector<int64_t> expand(const PositionRuns& runs) {
  std::vector<int64_t> v;
  for (const auto& r : runs)
    for (int64_t i = 0; i < r.count; ++i) v.push_back(r.start + i * r.stride);
  std::sort(v.begin(), v.end());
  return v;
}

TEST(PositionRuns, FollowPartition) {
  for (int64_t seq : {1, 7, 64, 67, 100, 1001})
    for (int n : {1, 2, 3, 4, 7, 8})
      for (Layout l : {Layout::kContiguous, Layout::kStriped, Layout::kZigzag}) {
        if (n > seq) continue;
        const Partition part(seq, n, l);
        for (int r = 0; r < n; ++r) {
          auto p = part.positions(r);
          EXPECT_EQ(expand(layout_runs(seq, n, l, r)), std::vector<int64_t>(p.begin(), p.end()))
              << seq << " " << n << " " << layout_name(l) << " " << r;
        }
      }
}

TEST(PositionRuns, VisiblePairsEqualTheKernelsCount) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t seq = 1 + rng() % 90;
    const int n = 1 + static_cast<int>(rng() % std::min<int64_t>(seq, 6));
    const Layout l = static_cast<Layout>(rng() % 3);
    const int a = static_cast<int>(rng() % n), b = static_cast<int>(rng() % n);
    const bool causal = rng() % 2;
    const int64_t valid = rng() % 3 == 0 ? 1 + rng() % seq : 0;
    const PositionRuns q = layout_runs(seq, n, l, a), k = layout_runs(seq, n, l, b);
    const auto qp = expand(q), kp = expand(k);
    std::vector<uint8_t> kv(kp.size());
    for (size_t i = 0; i < kp.size(); ++i) kv[i] = valid == 0 || kp[i] < valid;
    MaskSpec mask;
    mask.causal = causal;
    mask.q_pos = qp;
    mask.k_pos = kp;
    if (valid > 0) mask.k_valid = kv;
    EXPECT_EQ(visible_pairs(q, k, causal, valid),
              visible_score_elements(1, 1, qp.size(), kp.size(), mask))
        << seq << " " << n << " " << layout_name(l) << " " << a << " " << b;
  }
  // Different strides (a striped query set against a contiguous key run).
  const PositionRuns s = {{3, 10, 4}}, c = {{5, 20, 1}};
  int64_t want = 0;
  for (int64_t qpos : expand(s))
    for (int64_t kpos : expand(c)) want += kpos <= qpos;
  EXPECT_EQ(visible_pairs(s, c, true), want);
}

// ---- simulation ---------------------------------------------------------------------------------

TEST(Simulation, RingStopsHidingPastANode) {
  // Wan-like DiT, non-causal, 75600 tokens (81 frames of 720p), one attention layer per rank
  // on the H100 profile: ring hides its transfers while blocks are large, stops when the
  // per-step compute (∝ 1/N²) falls below the transfer (∝ 1/N), worse past 8 ranks per node.
  const Workload w = attention_workload(75600, 40, 40, 128, 1, false, DType::kBF16);
  // Past the planning limit (about 2.4 s of work): asked for with a larger one.
  const Simulation sim = simulate_scaling(w, hardware_profile("h100"), doubling_sizes(8, 1024),
                                          Layout::kContiguous, 1, 1, 0.05, int64_t{4'000'000'000});
  ASSERT_EQ(sim.curves.size(), 4u);
  EXPECT_EQ(sim.sizes, (std::vector<int>{8, 16, 32, 64, 128, 256, 512, 1024}));
  const SimCurve& ring = sim.curves[0];
  EXPECT_EQ(ring.strategy, Strategy::kRing);
  for (const auto& p : ring.points) EXPECT_TRUE(p.valid) << p.ranks << " " << p.note;
  EXPECT_GT(ring.stops_hiding_at, 0);
  for (const auto& p : ring.points) {
    if (p.ranks <= ring.hidden_up_to) {
      EXPECT_LE(p.exposed_fraction, sim.threshold);
    }
    if (p.ranks == ring.stops_hiding_at) {
      EXPECT_GT(p.exposed_fraction, sim.threshold);
    }
    EXPECT_EQ(p.inter_node, p.ranks > 8);
  }
  // Ulysses beyond 40 ranks leaves members without heads: the step stops shrinking.
  const SimCurve& uly = sim.curves[1];
  EXPECT_EQ(uly.strategy, Strategy::kUlysses);
  const SimPoint& u64 = uly.points[3];
  const SimPoint& u1024 = uly.points[7];
  EXPECT_GT(u1024.compute_s, 0.5 * u64.compute_s);
  EXPECT_EQ(sim.findings.size(), 4u);
  // The SVG: a standalone document with one solid and one dashed line per strategy.
  const std::string svg = simulation_svg(sim, "test <&> title");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;&amp;&gt;"), std::string::npos);
  size_t lines = 0;
  for (size_t pos = 0; (pos = svg.find("<polyline", pos)) != std::string::npos; ++pos) ++lines;
  EXPECT_EQ(lines, 8u);
}

TEST(Simulation, DecodeCurves) {
  const Workload w = attention_workload(0, 64, 8, 128, 1, true, DType::kBF16, 0, 1 << 20, 16);
  const Simulation sim =
      simulate_scaling(w, hardware_profile("h200"), doubling_sizes(8, 64), Layout::kContiguous);
  ASSERT_EQ(sim.curves.size(), 2u);  // in the strategy table's order
  const bool q_first = sim.curves[0].strategy == Strategy::kPassQ;
  const auto& passq = sim.curves[q_first ? 0 : 1];
  const auto& passkv = sim.curves[q_first ? 1 : 0];
  EXPECT_EQ(passq.strategy, Strategy::kPassQ);
  EXPECT_EQ(passkv.strategy, Strategy::kPassKv);
  // 16 new tokens over a million cached: passing the queries is far cheaper.
  for (size_t i = 0; i < sim.sizes.size(); ++i)
    EXPECT_LT(passq.points[i].step_s, passkv.points[i].step_s);
  EXPECT_THROW(doubling_sizes(0, 8), InvalidArgument);
}

// A simulation past the planning limit is refused up front, naming the work and the largest last
// size that fits; that size is simulated.
TEST(Simulation, WorkPastTheLimitIsRefusedWithTheLastSizeThatFits) {
  const Workload w = attention_workload(1 << 20, 8, 0, 128, 1, false, DType::kBF16);
  const HardwareProfile hw = hardware_profile("h100");
  const std::vector<int> sizes = doubling_sizes(8, 8192);
  EXPECT_GT(simulation_work(w, sizes, Layout::kContiguous).ns, kMaxPlanWork);
  const int last = largest_simulated_size(w, sizes, Layout::kContiguous, 1, 1, kMaxPlanWork);
  EXPECT_EQ(last, 512);
  try {
    (void)simulate_scaling(w, hw, sizes, Layout::kContiguous);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("simulate sizes up to 512"), std::string::npos)
        << e.what();
  }
  const Simulation sim = simulate_scaling(w, hw, doubling_sizes(8, last), Layout::kContiguous);
  EXPECT_EQ(sim.sizes.back(), 512);
}

}  // namespace
}  // namespace seqpar
