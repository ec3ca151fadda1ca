// The seqpar command line as one object: every subcommand and its flags, bound to the options
// they fill. main() and the command-line fuzz target (fuzz/fuzz_cli.cc) build it the same way.
// Thread-safety: an App and its Options belong to one thread.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "commands.h"

namespace seqpar::cli {

// What the flags of every subcommand parse into.
struct Options {
  RunOptions run;
  InfoOptions info;
  MeshOptions mesh;
  ModelOptions model;
  DenoiseOptions denoise;
  GenerateOptions generate;
  PlanOptions plan;
  CalibrateOptions calibrate;
};

// The `seqpar` app with its subcommands, writing into `opts` (which must outlive it). Parsing has
// no side effects beyond `opts`; the work happens in run_subcommand.
std::unique_ptr<CLI::App> make_app(Options& opts);

// Parses argv into `opts`. Returns -1 when a subcommand is ready to run; otherwise the exit code
// after help (0) or an argument error (2, one line "seqpar: error: ..." on stderr).
int parse_command_line(CLI::App& app, int argc, const char* const* argv);

// Runs the subcommand `app` parsed, returning the exit code (0 ok, 1 failed, 2 bad arguments,
// reported as one line on stderr).
int run_subcommand(const CLI::App& app, const Options& opts);

}  // namespace seqpar::cli
