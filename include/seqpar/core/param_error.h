// Errors as data: an InvalidArgument that names the parameters it is about as data, not prose,
// so that each front end prints them as its users spell them (the command line as its flags,
// Python as its keywords) from one table, front_end_name().
//
// A message is concatenated as SEQPAR_ARG_CHECK's, with param("tp") where it names a parameter of
// the vocabulary (parallel/config.h's names: "tp", "ulysses_degree", "heads", "seq", ...):
//   SEQPAR_PARAM_CHECK(heads % tp == 0, "tp", divisors_text(heads),
//                      param("tp"), " ", tp, " does not divide the ", heads, " heads; valid ",
//                      param("tp"), ": ", divisors_text(heads));
// what() spells every name as the vocabulary does ("tp 3 does not divide the 8 heads; valid tp:
// 1, 2, 4, 8"); `seqpar run` prints "--tp 3 ... valid --tp: ..."; Python the keyword.
// The error also carries its subject: the parameter that was wrong (parameter()) and what would be
// valid (expected(), as text; empty where the message says it in words).
// Thread-safety: values; safe from any thread.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include "seqpar/core/error.h"

namespace seqpar {

// A parameter's name inside a message (written marked, see ParamError).
struct Param {
  std::string_view name;
};
constexpr Param param(std::string_view name) { return {name}; }
std::ostream& operator<<(std::ostream& os, Param p);

class ParamError : public InvalidArgument {
 public:
  // `marked`: the message as concatenated with param() names in it.
  ParamError(std::string parameter, std::string expected, const std::string& marked);
  const std::string& parameter() const { return parameter_; }
  const std::string& expected() const { return expected_; }
  // The message as concatenated, names marked: for a message that quotes this one.
  const std::string& marked() const { return marked_; }
  // The message with every parameter name as spell(name) writes it.
  std::string spelled(const std::function<std::string(std::string_view)>& spell) const;

 private:
  std::string parameter_, expected_, marked_;
};

// The one table of how the front ends spell the vocabulary's names. The command line: a long
// flag's name without its dashes, '-' for '_' ("ulysses-degree"; "new-lens" for fresh_lens);
// Python: the keyword, the name itself. A name that is already a front end's own spelling (one
// starting with '-') is returned as it is. The new tokens over a cache (AttnShape::fresh) are
// named "new", as both front ends spell them.
enum class FrontEnd { kCommandLine, kPython };
std::string front_end_name(std::string_view name, FrontEnd f);

// For a message whose names come from its caller (a `what` that may hold param() names): throws
// ParamError(the first name `marked` holds, expected, marked), or InvalidArgument(marked) where it
// holds none.
[[noreturn]] void throw_marked(const std::string& marked, std::string expected = "");

}  // namespace seqpar

// Throws seqpar::ParamError(parameter, expected, message) when cond is false; the message is the
// concatenation of the remaining arguments, param() names marked.
#define SEQPAR_PARAM_CHECK(cond, parameter, expected, ...)                                    \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::seqpar::ParamError(parameter, expected, ::seqpar::detail::concat(__VA_ARGS__)); \
  } while (0)
