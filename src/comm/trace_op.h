// Trace slices of communication ops (core/trace.h), shared by the backends. Private to src/comm/.
// Thread-safety: a value used by the thread of one communicator.
#pragma once

#include <cstdint>
#include <string_view>

#include "seqpar/comm/communicator.h"
#include "seqpar/core/trace.h"

namespace seqpar::comm_rules {

// A collective as one slice on the communication lane, with the bytes CommStats counted for it
// (logical bytes sent and received by this rank). Construct it before the op's accounting, as
// the first statement of the op; when tracing is off it costs one relaxed atomic load.
class CollectiveTrace {
 public:
  CollectiveTrace(OpKind kind, const CommStats& stats)
      : on_(trace::enabled()), name_(op_kind_name(kind)), stats_(stats) {
    if (!on_) return;
    sent0_ = stats.total_sent();
    recv0_ = stats.total_recv();
    t0_ = trace::now_us();
  }
  ~CollectiveTrace() {
    if (!on_) return;
    trace::complete(name_, "comm", trace::Lane::kComm, t0_, trace::now_us(),
                    {{"bytes_sent", static_cast<int64_t>(stats_.total_sent() - sent0_)},
                     {"bytes_recv", static_cast<int64_t>(stats_.total_recv() - recv0_)}});
  }
  CollectiveTrace(const CollectiveTrace&) = delete;
  CollectiveTrace& operator=(const CollectiveTrace&) = delete;

 private:
  bool on_;
  std::string_view name_;
  const CommStats& stats_;
  uint64_t sent0_ = 0, recv0_ = 0;
  double t0_ = 0;
};

}  // namespace seqpar::comm_rules
