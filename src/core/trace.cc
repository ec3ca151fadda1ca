#include "seqpar/core/trace.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>

#include "seqpar/core/error.h"
#include "seqpar/core/files.h"

namespace seqpar::trace {

namespace {

std::atomic<bool> g_enabled{false};
thread_local int t_rank = 0;

struct Recorder {
  std::mutex mu;
  std::vector<Event> events;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

void record(Event e) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lk(r.mu);
  r.events.push_back(std::move(e));
}

// JSON string body: quotes, backslashes and control characters escaped.
void append_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
}

void append_number(std::string& out, double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", x);
  out += buf;
}

}  // namespace

void start() {
  {
    Recorder& r = recorder();
    std::lock_guard<std::mutex> lk(r.mu);
    r.events.clear();
  }
  g_enabled.store(true, std::memory_order_relaxed);
}

void stop() { g_enabled.store(false, std::memory_order_relaxed); }

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

void set_rank(int rank) { t_rank = rank; }
int rank() { return t_rank; }

double now_us() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::micro>(clock::now().time_since_epoch()).count();
}

void complete(std::string_view name, const char* category, Lane lane, double t0_us, double t1_us,
              std::initializer_list<Arg> args) {
  if (!enabled()) return;
  Event e;
  e.name = std::string(name);
  e.category = category;
  e.pid = t_rank;
  e.lane = lane;
  e.ts_us = t0_us;
  e.dur_us = std::max(0.0, t1_us - t0_us);
  for (const Arg& a : args) e.args.emplace_back(a.first, a.second);
  record(std::move(e));
}

Scope::Scope(std::string_view name, const char* category, Lane lane)
    : active_(enabled()), category_(category), lane_(lane) {
  if (!active_) return;
  name_ = std::string(name);
  t0_ = now_us();
}

Scope::~Scope() {
  if (!active_) return;
  Event e;
  e.name = std::move(name_);
  e.category = category_;
  e.pid = t_rank;
  e.lane = lane_;
  e.ts_us = t0_;
  e.dur_us = std::max(0.0, now_us() - t0_);
  e.args = std::move(args_);
  record(std::move(e));
}

void Scope::arg(const char* key, int64_t value) {
  if (active_) args_.emplace_back(key, value);
}

std::vector<Event> events() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.events;
}

double earliest_us(const std::vector<Event>& events) {
  double t = std::numeric_limits<double>::infinity();
  for (const Event& e : events) t = std::min(t, e.ts_us);
  return t;
}

std::string to_json_fragments(const std::vector<Event>& events, double origin_us) {
  if (!std::isfinite(origin_us)) origin_us = 0;
  std::string out;
  out.reserve(events.size() * 128);
  for (const Event& e : events) {
    if (!out.empty()) out += ",\n";
    out += "{\"name\":\"";
    append_escaped(out, e.name);
    out += "\",\"cat\":\"";
    append_escaped(out, e.category);
    out += "\",\"ph\":\"X\",\"ts\":";
    append_number(out, e.ts_us - origin_us);
    out += ",\"dur\":";
    append_number(out, e.dur_us);
    out += ",\"pid\":" + std::to_string(e.pid);
    out += ",\"tid\":" + std::to_string(static_cast<int>(e.lane));
    out += ",\"args\":{";
    for (size_t i = 0; i < e.args.size(); ++i) {
      if (i > 0) out += ",";
      out += "\"";
      append_escaped(out, e.args[i].first);
      out += "\":" + std::to_string(e.args[i].second);
    }
    out += "}}";
  }
  return out;
}

std::string to_json(const std::string& fragments, int ranks) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (int r = 0; r < ranks; ++r) {
    const std::string pid = std::to_string(r);
    out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"args\":{\"name\":\"rank " + pid + "\"}},\n";
    out += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"args\":{\"sort_index\":" + pid + "}},\n";
    out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"tid\":0,\"args\":{\"name\":\"compute\"}},\n";
    out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"tid\":1,\"args\":{\"name\":\"comm\"}}";
    if (r + 1 < ranks || !fragments.empty()) out += ",\n";
  }
  out += fragments;
  out += "\n]}\n";
  return out;
}

void write_json(const std::string& path, const std::string& fragments, int ranks) {
  files::write_atomically("trace", path, to_json(fragments, ranks));
}

void write_json(const std::string& path, const std::vector<Event>& events, int ranks) {
  write_json(path, to_json_fragments(events, earliest_us(events)), ranks);
}

}  // namespace seqpar::trace
