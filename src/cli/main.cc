// seqpar: the command-line program. Subcommands: run, info, mesh, model, denoise, generate,
// plan, calibrate (make_app in src/cli/app.cc registers them). Argument errors print one line "seqpar: error: ..." to stderr
// and exit 2.
#include "app.h"
#include "seqpar/core/files.h"

int main(int argc, char** argv) {
  // One process is one run: no output may replace a file the run reads (core/files.h).
  seqpar::files::guard_inputs(true);
  seqpar::cli::Options opts;
  const auto app = seqpar::cli::make_app(opts);
  if (const int code = seqpar::cli::parse_command_line(*app, argc, argv); code >= 0) return code;
  return seqpar::cli::run_subcommand(*app, opts);
}
