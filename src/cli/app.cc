#include "app.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "seqpar/core/error.h"
#include "seqpar/core/param_error.h"
#include "seqpar/version.h"

namespace seqpar::cli {

namespace {

// A real number in decimal: an optional '-', digits with an optional point (at least one digit),
// an optional exponent (e, an optional sign, digits); or inf, infinity or nan in any case.
bool decimal_real(std::string_view text) {
  size_t i = !text.empty() && text[0] == '-' ? 1 : 0;
  std::string word(text.substr(i));
  for (char& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (word == "inf" || word == "infinity" || word == "nan") return true;
  auto digits = [&] {
    const size_t from = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    return i - from;
  };
  size_t mantissa = digits();
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

// Integers and reals as written in decimal (CLI11 alone also takes 0x10, 0b101, 0x1p3, +5 and ''
// as 0), and no empty texts.
void strict_values(CLI::App& app) {
  // signed: an optional leading '-'.
  auto decimal = [](bool is_signed) {
    return CLI::Validator(
        [is_signed](std::string& text) -> std::string {
          const size_t sign = is_signed && !text.empty() && text[0] == '-' ? 1 : 0;
          const bool ok = text.size() > sign &&
                          std::all_of(text.begin() + static_cast<std::ptrdiff_t>(sign), text.end(),
                                      [](unsigned char c) { return std::isdigit(c) != 0; });
          return ok ? std::string()
                    : "'" + text + "' is not a " + (is_signed ? "" : "non-negative ") +
                          "decimal integer";
        },
        "");
  };
  // An empty text is no value: "--output ''" would otherwise read as no --output at all.
  const CLI::Validator non_empty(
      [](std::string& text) -> std::string {
        return text.empty() ? "'' is empty; give a value or leave the flag out" : std::string();
      },
      "");
  // Real numbers as written in decimal (1, -0.5, .5, 2e-3), or inf / nan for the command's range
  // check to name; CLI11 alone also takes '' as 0, hex (0x10, 0x1p3) and a leading '+'.
  const CLI::Validator real(
      [](std::string& text) -> std::string {
        return decimal_real(text) ? std::string()
                                  : "'" + text + "' is not a decimal number (such as 2, 0.5, 1e-3)";
      },
      "");
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type == "INT" || type == "UINT") opt->check(decimal(type == "INT"));
    if (type == "FLOAT") opt->check(real);
    if (type == "TEXT") opt->check(non_empty);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) strict_values(*sub);
}

// The long flags ("--heads") of the subcommand being run; empty until run_subcommand starts one.
std::vector<std::string>& command_flags() {
  static std::vector<std::string> flags;
  return flags;
}

// The long flags ("--heads") of `a`, sorted, each once.
std::vector<std::string> long_flags(const CLI::App& a) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : a.get_options())
    for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// The flag among `names` nearest to `typed` (at most two edits away, or the typed text a prefix
// of exactly one flag), never `typed` itself; or empty.
std::string nearest_flag(const std::vector<std::string>& names, std::string_view typed) {
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = 3;
  for (const std::string& n : names)
    if (const size_t d = distance(typed, n); d > 0 && d < best_distance)
      best = n, best_distance = d;
  if (best.empty() && typed.size() >= 4) {
    size_t prefixed = 0;
    for (const std::string& n : names)
      if (n.starts_with(typed) && n != typed) best = n, ++prefixed;
    if (prefixed != 1) best.clear();
  }
  return best;
}

// What to add to the error for the first unknown --flag among `extras`, given to the subcommand
// `sub` (null when none was parsed): " (did you mean --strategy?)", the nearest flag that `sub`
// (or with no subcommand, any subcommand) takes; else, for a flag that other subcommands take,
// " (--output is a flag of denoise and generate, not of run)"; else empty.
std::string suggestion(const CLI::App& app, const CLI::App* sub,
                       const std::vector<std::string>& extras) {
  std::vector<std::string> names = long_flags(app);
  std::vector<const CLI::App*> others;
  for (const CLI::App* s : app.get_subcommands(nullptr)) {
    if (sub == nullptr || s == sub) {
      const std::vector<std::string> more = long_flags(*s);
      names.insert(names.end(), more.begin(), more.end());
    } else {
      others.push_back(s);
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const std::string& e : extras) {
    if (!e.starts_with("--")) continue;
    const std::string typed = e.substr(0, e.find('='));
    if (const std::string n = nearest_flag(names, typed); !n.empty())
      return " (did you mean " + n + "?)";
    std::vector<std::string> takers;
    for (const CLI::App* s : others) {
      const std::vector<std::string> flags = long_flags(*s);
      if (std::binary_search(flags.begin(), flags.end(), typed)) takers.push_back(s->get_name());
    }
    if (takers.empty()) continue;
    std::string list;
    for (size_t i = 0; i < takers.size(); ++i)
      list += (i == 0 ? "" : i + 1 == takers.size() ? " and " : ", ") + takers[i];
    return " (" + typed + " is a flag of " + list + ", not of " + sub->get_name() + ")";
  }
  return "";
}

}  // namespace

std::unique_ptr<CLI::App> make_app(Options& opts) {
  auto app = std::make_unique<CLI::App>("seqpar: sequence (context) parallel transformer inference",
                                        "seqpar");
  app->require_subcommand(1);
  app->set_version_flag("--version", std::string(version()), "Print seqpar's version and exit");
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
  strict_values(*app);
  return app;
}

int parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (auto& c : msg)
      if (c == '\n') c = ' ';
    std::vector<std::string> extras = app.remaining();
    const CLI::App* parsed = nullptr;
    for (const CLI::App* sub : app.get_subcommands()) {
      parsed = sub;
      for (const std::string& x : sub->remaining()) extras.push_back(x);
    }
    msg += suggestion(app, parsed, extras);
    msg += " (see seqpar --help)";
    if (reporting_rank()) std::fprintf(stderr, "seqpar: error: %s\n", msg.c_str());
    // The flag may be what failed to parse, so --json anywhere on the line asks for the object.
    if (std::find(argv + 1, argv + argc, std::string_view("--json")) != argv + argc)
      print_json_error(msg, 2);
    return 2;
  }
  return -1;
}

std::string flag_name(std::string_view name) {
  const std::string flag = "--" + front_end_name(name, FrontEnd::kCommandLine);
  const std::vector<std::string>& flags = command_flags();
  if (name.starts_with("-") ||
      (!flags.empty() && std::find(flags.begin(), flags.end(), flag) == flags.end()))
    return std::string(name);
  return flag;
}

std::string cli_message(const InvalidArgument& e) {
  // Errors as data: each parameter the error names as its flag, where this subcommand has one.
  if (const auto* p = dynamic_cast<const ParamError*>(&e)) return p->spelled(flag_name);
  if (const auto* file = dynamic_cast<const FileContentError*>(&e))
    return file->parameter().empty() ? file->detail()
                                     : flag_name(file->parameter()) + " " + file->detail();
  return e.what();
}

int run_subcommand(const CLI::App& app, const Options& opts) {
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options())
      for (const std::string& n : opt->get_lnames()) command_flags().push_back("--" + n);
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
    if (reporting_rank()) std::fprintf(stderr, "seqpar: error: %s\n", cli_message(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seqpar: error: %s\n", e.what());
    return 1;
  }
  return 2;
}

}  // namespace seqpar::cli
