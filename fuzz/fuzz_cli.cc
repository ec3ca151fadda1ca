// Fuzzes the command-line parser: the input, split at newlines, is the argument list after
// "seqpar" (at most kMaxArgs). It is parsed by the same app main() builds (src/cli/app.h); a parse
// either succeeds or throws CLI::ParseError. No subcommand runs: their work is not bounded.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "app.h"

namespace {
constexpr size_t kMaxArgs = 64;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args = {"seqpar"};
  std::string current;
  for (size_t i = 0; i < size && args.size() <= kMaxArgs; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n') {
      args.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty() && args.size() <= kMaxArgs) args.push_back(current);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());

  seqpar::cli::Options opts;
  const auto app = seqpar::cli::make_app(opts);
  try {
    app->parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    // help, or an argument error: main() prints it and exits 0 or 2
  }
  return 0;
}
