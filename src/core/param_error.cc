#include "seqpar/core/param_error.h"

#include <array>

namespace seqpar {

namespace {

// A marked name: kOpen name kClose. Neither byte occurs in a message's text.
constexpr char kOpen = '\x01', kClose = '\x02';

std::string spell_marked(const std::string& marked,
                         const std::function<std::string(std::string_view)>& spell) {
  std::string out;
  size_t i = 0;
  while (i < marked.size()) {
    const size_t open = marked.find(kOpen, i);
    const size_t close = open == std::string::npos ? open : marked.find(kClose, open);
    if (close == std::string::npos) {
      out.append(marked, i, std::string::npos);
      break;
    }
    out.append(marked, i, open - i);
    out += spell(std::string_view(marked).substr(open + 1, close - open - 1));
    i = close + 1;
  }
  return out;
}

struct Spelling {
  std::string_view name, command_line, python;  // empty: the rule's spelling
};
constexpr std::array<Spelling, 1> kSpellings = {{
    {"fresh_lens", "new-lens", ""},
}};

}  // namespace

std::ostream& operator<<(std::ostream& os, Param p) { return os << kOpen << p.name << kClose; }

ParamError::ParamError(std::string parameter, std::string expected, const std::string& marked)
    : InvalidArgument(spell_marked(marked, [](std::string_view n) { return std::string(n); })),
      parameter_(std::move(parameter)),
      expected_(std::move(expected)),
      marked_(marked) {}

std::string ParamError::spelled(const std::function<std::string(std::string_view)>& spell) const {
  return spell_marked(marked_, spell);
}

void throw_marked(const std::string& marked, std::string expected) {
  const size_t open = marked.find(kOpen);
  const size_t close = open == std::string::npos ? open : marked.find(kClose, open);
  if (close == std::string::npos) throw InvalidArgument(marked);
  throw ParamError(marked.substr(open + 1, close - open - 1), std::move(expected), marked);
}

std::string front_end_name(std::string_view name, FrontEnd f) {
  if (!name.empty() && name.front() == '-') return std::string(name);
  for (const Spelling& s : kSpellings) {
    const std::string_view own = f == FrontEnd::kCommandLine ? s.command_line : s.python;
    if (s.name == name && !own.empty()) return std::string(own);
  }
  std::string out(name);
  if (f == FrontEnd::kCommandLine)
    for (char& c : out)
      if (c == '_') c = '-';
  return out;
}

}  // namespace seqpar
