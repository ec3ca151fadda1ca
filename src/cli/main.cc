// seqpar: the command-line program. Subcommands: run, info, mesh.
// Argument errors print one line "seqpar: error: ..." to stderr and exit 2.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <exception>

#include "cli/commands.h"
#include "seqpar/core/error.h"

int main(int argc, char** argv) {
  using namespace seqpar::cli;
  CLI::App app{"seqpar: sequence (context) parallel transformer inference", "seqpar"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
  RunOptions run;
  InfoOptions info;
  MeshOptions mesh;
  add_run_command(app, run);
  add_info_command(app, info);
  add_mesh_command(app, mesh);
  ModelOptions model;
  add_model_command(app, model);
  PlanOptions plan;
  add_plan_command(app, plan);
  CalibrateOptions calibrate;
  add_calibrate_command(app, calibrate);
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
    std::fprintf(stderr, "seqpar: error: %s (see seqpar --help)\n", msg.c_str());
    return 2;
  }
  try {
    if (app.got_subcommand("run")) return run_command(run);
    if (app.got_subcommand("info")) return info_command(info);
    if (app.got_subcommand("mesh")) return mesh_command(mesh);
    if (app.got_subcommand("model")) return model_command(model);
    if (app.got_subcommand("plan")) return plan_command(plan);
    if (app.got_subcommand("calibrate")) return calibrate_command(calibrate);
  } catch (const seqpar::InvalidArgument& e) {
    // Under mpirun every rank finds the same argument error; one line is enough.
    const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (world_rank == nullptr || std::string(world_rank) == "0")
      std::fprintf(stderr, "seqpar: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seqpar: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
