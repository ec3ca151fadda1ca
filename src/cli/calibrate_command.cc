// seqpar calibrate: measures this machine (plan/calibrate.h) and writes the `local` hardware
// profile to --out, else $SEQPAR_PROFILE_DIR/local.json, else $XDG_CONFIG_HOME/seqpar/local.json,
// else ~/.config/seqpar/local.json; `seqpar plan --hardware local` then reads it.
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "progress.h"
#include "seqpar/core/error.h"
#include "seqpar/plan/calibrate.h"
#include "seqpar/plan/hardware.h"

namespace seqpar::cli {

namespace {

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace

void add_calibrate_command(CLI::App& app, CalibrateOptions& o) {
  CLI::App* c = app.add_subcommand(
      "calibrate", "Measure this machine and write the `local` hardware profile for seqpar plan");
  c->add_option("--out", o.out,
                "profile file (default $SEQPAR_PROFILE_DIR/local.json, else "
                "~/.config/seqpar/local.json)");
  c->add_flag("--json", o.json, "print the profile as one JSON object");
  c->add_flag("--quick", o.quick, "fewer, smaller measurements (for tests)");
}

namespace {

int calibrate(const CalibrateOptions& o) {
  std::string path;
  if (o.out) {
    path = *o.out;  // its folder must exist (an empty text never parses: app.cc)
  } else {
    const std::string dir = user_profile_dir();
    SEQPAR_ARG_CHECK(!dir.empty(),
                     "no place for the profile: set SEQPAR_PROFILE_DIR or HOME, "
                     "or give --out FILE");
    // The default folder is seqpar's own: made when missing.
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    path = dir + "/local.json";
  }
  // Checked before the measurements; the profile appears when written.
  OutputFile out("--out", path);
  Progress progress("calibrate", o.json);
  const MachineMeasurements m =
      measure_machine(o.quick, [&](const char* what) { progress.phase(what); });
  const HardwareProfile p = calibrated_profile(m, today());
  // Reading it back checks every field.
  const std::string text = hardware_profile_to_json(p);
  (void)hardware_profile_from_json(text, path);

  out.write(text);

  if (o.json) {
    nlohmann::json j = nlohmann::json::parse(text);
    j["path"] = path;
    j["kernel_flops_one_thread_alone"] = m.kernel_flops_alone;
    j["kernel_flops_one_call_all_threads"] = m.kernel_flops_wide;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar calibrate: %s\n", p.description.c_str());
    std::printf(
        "  attention kernel  %.2f GFLOP/s per core with all %d busy (%.2f alone); one call "
        "on %d threads %.2f GFLOP/s (efficiency %.2f)\n",
        m.kernel_flops_busy / 1e9, m.cores, m.kernel_flops_alone / 1e9, m.cores,
        m.kernel_flops_wide / 1e9, m.thread_efficiency);
    std::printf(
        "  threads backend   %.2f GB/s per rank (ring-step exchange of %zu MB), latency "
        "%.2f us\n",
        m.bandwidth / 1e9, m.exchange_bytes >> 20, m.latency_s * 1e6);
    std::printf("  memcpy            %.2f GB/s\n", m.memcpy_bw / 1e9);
    std::printf("  memory            %.1f GB\n", p.memory_bytes / 1e9);
    std::printf("wrote %s (seqpar plan --hardware local)\n", path.c_str());
  }
  return finish_output(0);
}

}  // namespace

int calibrate_command(const CalibrateOptions& o) {
  return with_json_errors(o.json, [&] { return calibrate(o); });
}

}  // namespace seqpar::cli
