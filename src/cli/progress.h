// Progress of long work on stderr, as `generate` and `denoise` report theirs: "seqpar run: 2/4
// calls, 12.3 s, about 12 s left". Shown only where someone watches (stderr is a terminal), on
// the reporting rank, and never with --json or --quiet; at most a line a second, and the last.
// Thread-safety: one Progress belongs to one thread.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "commands.h"
#include "seqpar/core/timer.h"

namespace seqpar::cli {

class Progress {
 public:
  // `command` names the subcommand ("run"); `quiet` is --json or --quiet; SEQPAR_PROGRESS=1
  // shows progress without a terminal (for tests and logs).
  Progress(std::string command, bool quiet)
      : command_(std::move(command)), start_(now_seconds()), last_(start_) {
    const char* forced = std::getenv("SEQPAR_PROGRESS");
    const bool watched = isatty(STDERR_FILENO) == 1 || (forced && std::string_view(forced) == "1");
    on_ = !quiet && watched && reporting_rank();
  }
  bool on() const { return on_; }

  // `done` of `total` `unit` finished: elapsed time, rate and time left.
  void step(int64_t done, int64_t total, std::string_view unit) {
    if (!on_) return;
    const double now = now_seconds(), elapsed = now - start_;
    if (done < total && now - last_ < 1.0) return;
    last_ = now;
    const double left = done > 0 ? elapsed / static_cast<double>(done) * (total - done) : 0;
    std::fprintf(stderr, "seqpar %s: %lld/%lld %.*s, %.1f s", command_.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total),
                 static_cast<int>(unit.size()), unit.data(), elapsed);
    if (done < total) std::fprintf(stderr, ", about %.0f s left", left);
    std::fprintf(stderr, "\n");
  }
  // A phase that starts now ("verifying against the single-rank reference").
  void phase(std::string_view what) {
    if (!on_) return;
    std::fprintf(stderr, "seqpar %s: %.*s (%.1f s so far)\n", command_.c_str(),
                 static_cast<int>(what.size()), what.data(), now_seconds() - start_);
    last_ = now_seconds();
  }

 private:
  std::string command_;
  double start_, last_;
  bool on_ = false;
};

}  // namespace seqpar::cli
