// The trace recorder (core/trace.h): off by default and silent, thread-safe when on, and its JSON
// is a valid Chrome/Perfetto trace (pid = rank, tid = lane, args).
#include "seqpar/core/trace.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "seqpar/core/error.h"

namespace seqpar {
namespace {

// Every test leaves tracing off (the recorder is process-wide).
class TraceTest : public ::testing::Test {
 protected:
  void TearDown() override { trace::stop(); }
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST_F(TraceTest, OffRecordsNothing) {
  trace::start();
  trace::stop();  // start clears; stop keeps what was recorded (nothing)
  EXPECT_FALSE(trace::enabled());
  trace::complete("x", "test", trace::Lane::kCompute, 0, 1);
  {
    trace::Scope s("y", "test", trace::Lane::kComm);
    EXPECT_FALSE(s.active());
    s.arg("bytes", 1);
  }
  EXPECT_TRUE(trace::events().empty());
}

TEST_F(TraceTest, RecordsSlicesWithRankLaneAndArgs) {
  trace::start();
  trace::set_rank(3);
  const double t0 = trace::now_us();
  trace::complete("step", "ring", trace::Lane::kCompute, t0, t0 + 5, {{"bytes", 4096}});
  {
    trace::Scope s("wait", "comm", trace::Lane::kComm);
    EXPECT_TRUE(s.active());
    s.arg("peer", 2);
  }
  trace::set_rank(0);
  const std::vector<trace::Event> ev = trace::events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].name, "step");
  EXPECT_EQ(ev[0].pid, 3);
  EXPECT_EQ(ev[0].lane, trace::Lane::kCompute);
  EXPECT_DOUBLE_EQ(ev[0].dur_us, 5);
  ASSERT_EQ(ev[0].args.size(), 1u);
  EXPECT_EQ(ev[0].args[0].first, "bytes");
  EXPECT_EQ(ev[0].args[0].second, 4096);
  EXPECT_EQ(ev[1].name, "wait");
  EXPECT_EQ(ev[1].lane, trace::Lane::kComm);
  EXPECT_EQ(ev[1].args[0].second, 2);
}

TEST_F(TraceTest, ThreadSafeAndPerThreadRank) {
  trace::start();
  constexpr int kThreads = 4, kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      trace::set_rank(t);
      for (int i = 0; i < kEach; ++i) {
        trace::Scope s("slice", "test", trace::Lane::kCompute);
        s.arg("i", i);
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::vector<trace::Event> ev = trace::events();
  ASSERT_EQ(ev.size(), static_cast<size_t>(kThreads * kEach));
  std::vector<int> per_rank(kThreads, 0);
  for (const auto& e : ev) ++per_rank.at(e.pid);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(per_rank[t], kEach);
}

TEST_F(TraceTest, WritesChromeTraceJson) {
  trace::start();
  const double t0 = trace::now_us();
  trace::set_rank(1);
  trace::complete("ring step 0", "ring", trace::Lane::kCompute, t0 + 10, t0 + 30);
  trace::complete("all_gather \"quoted\"\n", "comm", trace::Lane::kComm, t0 + 12, t0 + 20,
                  {{"bytes_sent", 123}, {"bytes_recv", 456}});
  trace::set_rank(0);
  const std::string path = ::testing::TempDir() + "seqpar_trace_test.json";
  trace::write_json(path, trace::events(), 2);
  const nlohmann::json j = read_json(path);
  ASSERT_TRUE(j.contains("traceEvents"));
  int meta = 0, slices = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      ++meta;
      continue;
    }
    ++slices;
    EXPECT_EQ(e["ph"], "X");
    EXPECT_EQ(e["pid"], 1);
    if (e["cat"] == "ring") {
      EXPECT_EQ(e["tid"], 0);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0.0);  // relative to the earliest event
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 20.0);
    } else {
      EXPECT_EQ(e["name"], "all_gather \"quoted\"\n");
      EXPECT_EQ(e["tid"], 1);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 2.0);
      EXPECT_EQ(e["args"]["bytes_sent"], 123);
      EXPECT_EQ(e["args"]["bytes_recv"], 456);
    }
  }
  EXPECT_EQ(slices, 2);
  EXPECT_EQ(meta, 2 * 4);  // per rank: process name, sort index, two lane names
  std::remove(path.c_str());
}

// MPI ranks serialize their events relative to a common origin; rank 0 writes them all.
TEST_F(TraceTest, FragmentsFromSeveralProcessesMerge) {
  trace::Event a, b;
  a.name = "a";
  a.pid = 0;
  a.ts_us = 1000;
  a.dur_us = 5;
  b.name = "b";
  b.pid = 1;
  b.lane = trace::Lane::kComm;
  b.ts_us = 990;
  b.dur_us = 1;
  const double origin = std::min(trace::earliest_us({a}), trace::earliest_us({b}));
  EXPECT_EQ(origin, 990);
  const std::string frags =
      trace::to_json_fragments({a}, origin) + "," + trace::to_json_fragments({b}, origin);
  const std::string path = ::testing::TempDir() + "seqpar_trace_frag.json";
  trace::write_json(path, frags, 2);
  const nlohmann::json j = read_json(path);
  std::vector<double> ts;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") ts.push_back(e["ts"].get<double>());
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_DOUBLE_EQ(ts[0], 10.0);
  EXPECT_DOUBLE_EQ(ts[1], 0.0);
  EXPECT_TRUE(trace::to_json_fragments({}, 0).empty());
  std::remove(path.c_str());
}

TEST_F(TraceTest, UnwritablePathThrows) {
  const std::vector<trace::Event> none;
  EXPECT_THROW(trace::write_json("/nonexistent-dir/x.json", none, 1), Error);
}

}  // namespace
}  // namespace seqpar
