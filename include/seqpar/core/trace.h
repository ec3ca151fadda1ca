// Trace events in the Chrome / Perfetto JSON format ("traceEvents", complete "X" slices):
// pid = rank, tid = lane (compute or communication), one slice per ring step, per kernel call,
// per collective and per blocking wait, with byte counts in the args. Open the file in
// https://ui.perfetto.dev or chrome://tracing.
//
// Recording is off by default. When off, trace::enabled() is one relaxed atomic load and every
// recording call returns at once (Scope does not even read the clock), so instrumented code pays
// nothing measurable. When on, events go to one process-wide buffer under a mutex (a handful of
// events per ring step: negligible next to the step).
//
// The rank of an event is the calling thread's rank, set once per rank thread with
// trace::set_rank (the CLI does it for the threads backend; under MPI the process's world rank).
// Timestamps are steady_clock microseconds, which is CLOCK_MONOTONIC on Linux: comparable across
// the processes of one machine, so events of MPI ranks can be merged (write_json subtracts the
// earliest timestamp).
//
// Thread-safety: every function here may be called from any thread at any time.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace seqpar::trace {

enum class Lane { kCompute = 0, kComm = 1 };

// One integer argument of an event ({"bytes", 1024}).
using Arg = std::pair<const char*, int64_t>;

struct Event {
  std::string name;
  const char* category = "";  // static string: "ring", "kernel", "comm", ...
  int pid = 0;                // rank
  Lane lane = Lane::kCompute;
  double ts_us = 0;   // start, steady_clock microseconds
  double dur_us = 0;  // duration
  std::vector<std::pair<std::string, int64_t>> args;
};

// Turns recording on (clearing earlier events) or off.
void start();
void stop();
bool enabled();

// The calling thread's rank (pid of its events); 0 until set.
void set_rank(int rank);
int rank();

// steady_clock now, in microseconds (the clock of every event).
double now_us();

// Records a complete slice [t0_us, t1_us] on the calling thread's rank. No-op when off.
void complete(std::string_view name, const char* category, Lane lane, double t0_us, double t1_us,
              std::initializer_list<Arg> args = {});

// A slice from construction to destruction (RAII). Arguments may be added while it is open.
class Scope {
 public:
  Scope(std::string_view name, const char* category, Lane lane);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  void arg(const char* key, int64_t value);
  bool active() const { return active_; }

 private:
  bool active_;
  std::string name_;
  const char* category_;
  Lane lane_;
  double t0_ = 0;
  std::vector<std::pair<std::string, int64_t>> args_;
};

// A copy of the events recorded so far.
std::vector<Event> events();
// The earliest start over events (+infinity if there are none).
double earliest_us(const std::vector<Event>& events);
// Events as JSON objects separated by commas (no brackets), timestamps relative to origin_us:
// the form in which MPI ranks send their events to rank 0 (origin: the all-reduced minimum of
// earliest_us), which passes the comma-joined fragments of every rank to write_json.
std::string to_json_fragments(const std::vector<Event>& events, double origin_us);
// Writes {"traceEvents": [...], "displayTimeUnit": "ms"} with process and thread name metadata
// for ranks 0..ranks-1 ("rank r"; lanes "compute", "comm") and the given fragments. Throws
// seqpar::Error if the file cannot be written.
void write_json(const std::string& path, const std::string& fragments, int ranks);
// The same for events of this process, relative to their earliest.
void write_json(const std::string& path, const std::vector<Event>& events, int ranks);
// The document write_json writes, for callers that open and check the file themselves.
std::string to_json(const std::string& fragments, int ranks);

}  // namespace seqpar::trace
