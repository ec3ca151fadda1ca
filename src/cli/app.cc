#include "cli/app.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "seqpar/core/error.h"

namespace seqpar::cli {

std::unique_ptr<CLI::App> make_app(Options& opts) {
  auto app = std::make_unique<CLI::App>("seqpar: sequence (context) parallel transformer inference",
                                        "seqpar");
  app->require_subcommand(1);
  app->option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
  add_run_command(*app, opts.run);
  add_info_command(*app, opts.info);
  add_mesh_command(*app, opts.mesh);
  add_model_command(*app, opts.model);
  add_denoise_command(*app, opts.denoise);
  add_generate_command(*app, opts.generate);
  add_plan_command(*app, opts.plan);
  add_calibrate_command(*app, opts.calibrate);
  return app;
}

int parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (auto& c : msg)
      if (c == '\n') c = ' ';
    msg += " (see seqpar --help)";
    if (reporting_rank()) std::fprintf(stderr, "seqpar: error: %s\n", msg.c_str());
    // The flag may be what failed to parse, so --json anywhere on the line asks for the object.
    if (std::find(argv + 1, argv + argc, std::string_view("--json")) != argv + argc)
      print_json_error(msg, 2);
    return 2;
  }
  return -1;
}

int run_subcommand(const CLI::App& app, const Options& opts) {
  try {
    if (app.got_subcommand("run")) return run_command(opts.run);
    if (app.got_subcommand("info")) return info_command(opts.info);
    if (app.got_subcommand("mesh")) return mesh_command(opts.mesh);
    if (app.got_subcommand("model")) return model_command(opts.model);
    if (app.got_subcommand("denoise")) return denoise_command(opts.denoise);
    if (app.got_subcommand("generate")) return generate_command(opts.generate);
    if (app.got_subcommand("plan")) return plan_command(opts.plan);
    if (app.got_subcommand("calibrate")) return calibrate_command(opts.calibrate);
  } catch (const seqpar::InvalidArgument& e) {
    // Under mpirun every rank finds the same argument error; one line is enough.
    if (reporting_rank()) std::fprintf(stderr, "seqpar: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seqpar: error: %s\n", e.what());
    return 1;
  }
  return 2;
}

}  // namespace seqpar::cli
