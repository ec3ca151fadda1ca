// Errors, in three channels:
//   - broken invariants and bad arguments inside the library throw seqpar::Error (with file:line);
//   - communication failures are stored in a Request and rethrown by Request::wait();
//   - the CLI turns InvalidArgument into one line on stderr and exit code 2.
// Thread-safety: all types here are values; safe to use from any thread.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace seqpar {

// A broken invariant or a failed operation. what() is one line.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A caller passed something invalid (a shape, a degree, a name). what() names the parameter and
// what would be valid; the CLI reports it as exit code 2.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& msg) : Error(msg) {}
};

// An InvalidArgument about what a file holds: `parameter` is the API parameter that named the
// file, `detail` names the file and what is wrong in it in the file's own words (its keys, as the
// file spells them). what() is "parameter detail".
class FileContentError : public InvalidArgument {
 public:
  // An empty `parameter`: the detail names the file itself ("x/config.json: head_dim 0 ...").
  FileContentError(std::string parameter, std::string detail)
      : InvalidArgument(parameter.empty() ? detail : parameter + " " + detail),
        parameter_(std::move(parameter)),
        detail_(std::move(detail)) {}
  const std::string& parameter() const { return parameter_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string parameter_, detail_;
};

// A communication failure: a timeout, a peer that failed or died, a mismatched collective.
class CommError : public Error {
 public:
  explicit CommError(const std::string& msg) : Error(msg) {}
};

// Another rank failed first and said so: what() is "rank R failed: <its error>". That rank
// reports its own error; a launcher's other ranks need not repeat it.
class PeerFailed : public CommError {
 public:
  explicit PeerFailed(const std::string& msg) : CommError(msg) {}
};

// A communication wait that passed its deadline on this rank (Communicator::timeout()). The
// other ranks learn of it as a CommError naming this rank.
class CommTimeout : public CommError {
 public:
  explicit CommTimeout(const std::string& msg) : CommError(msg) {}
};

// The caller stopped a run from outside (Ctrl-C in Python: ThreadWorld::run's `interrupted`).
class Interrupted : public Error {
 public:
  explicit Interrupted(const std::string& msg) : Error(msg) {}
};

// "1, 2, 4, 8": the divisors of x (x >= 1), for messages that list the valid degrees or counts.
// Any int64 takes microseconds (core/limits.h); beyond 32 divisors the middle ones are elided.
std::string divisors_text(int64_t x);

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace seqpar

// Throws seqpar::Error("file:line: check `cond` failed: <message>") when cond is false.
#define SEQPAR_CHECK(cond, ...)                                                                   \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      throw ::seqpar::Error(::seqpar::detail::concat(__FILE__, ":", __LINE__, ": check `", #cond, \
                                                     "` failed: " __VA_OPT__(, ) __VA_ARGS__));   \
    }                                                                                             \
  } while (0)

// Throws seqpar::InvalidArgument with the concatenated message when cond is false.
#define SEQPAR_ARG_CHECK(cond, ...)                                                      \
  do {                                                                                   \
    if (!(cond)) throw ::seqpar::InvalidArgument(::seqpar::detail::concat(__VA_ARGS__)); \
  } while (0)

// Throws seqpar::FileContentError("", message) when cond is false: a message about what a file
// holds, which starts with the file's path and names its keys as the file spells them.
#define SEQPAR_FILE_CHECK(cond, ...)                                                          \
  do {                                                                                        \
    if (!(cond)) throw ::seqpar::FileContentError("", ::seqpar::detail::concat(__VA_ARGS__)); \
  } while (0)
