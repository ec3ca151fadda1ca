#include "seqpar/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "seqpar/core/error.h"
#include "seqpar/core/limits.h"
#include "seqpar/core/param_error.h"

namespace seqpar::files {
namespace {

struct FileId {
  dev_t dev;
  ino_t ino;
  std::string path;
};

struct Registry {
  std::mutex mu;
  std::vector<FileId> inputs;
  std::vector<std::pair<std::string, std::string>> outputs;  // open AtomicOutputs: target, param
};

std::atomic<bool> g_guard{false};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: outputs may close during exit
  return *r;
}

std::string errno_text(int err) { return std::strerror(err); }

// How messages begin about a file: "<param> '<path>'" (then " is ...", ": ..."), or, when param is
// empty, "<path>:" (then " ...").
// The file named by param (marked, core/param_error.h) or, without one, by its path.
std::string about(std::string_view param, const std::string& path, bool then_is) {
  if (param.empty()) return path + ":";
  return detail::concat(seqpar::param(param), " '", path, "'", then_is ? "" : ":");
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The path with every symbolic link resolved; for a path that does not exist yet, its folder
// resolved and the name kept. Empty if the folder does not exist either.
std::string resolved(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash ? slash : 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (::realpath(dir.c_str(), buf) == nullptr) return {};
  const std::string d = buf;
  return (d == "/" ? "" : d) + "/" + name;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The process's umask without changing it (umask(2) would, briefly, for every thread).
mode_t current_umask() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 022;
  char line[256];
  unsigned int mask = 022;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "Umask: %o", &mask) == 1) break;
  std::fclose(f);
  return static_cast<mode_t>(mask);
}

}  // namespace

int open_input(std::string_view param, const std::string& path, std::string_view what) {
  if (path.empty())
    throw_marked(param.empty() ? detail::concat("the path is empty; give ", what)
                               : detail::concat(seqpar::param(param), " is empty; give ", what));
  // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    throw_marked(
        detail::concat(about(param, path, false), " cannot open the file (", errno_text(err), ")"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    throw_marked(detail::concat(about(param, path, true), " is ", kind_of(mode),
                                ", not a regular file; give ", what));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  bool known = false;
  for (const FileId& id : r.inputs) known = known || (id.dev == st.st_dev && id.ino == st.st_ino);
  if (!known) r.inputs.push_back({st.st_dev, st.st_ino, path});
  return fd;
}

std::string read_input(std::string_view param, const std::string& path, std::string_view what,
                       int64_t max_bytes) {
  const int fd = open_input(param, path, what);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > max_bytes) {
    ::close(fd);
    throw_marked(detail::concat(about(param, path, true), " is ", st.st_size, " bytes; at most ",
                                limits::max_text(max_bytes)));
  }
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw_marked(detail::concat(about(param, path, false), " cannot read the file (",
                                  errno_text(err), ")"));
    }
    text.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > max_bytes) {  // grew while being read
      ::close(fd);
      throw_marked(detail::concat(about(param, path, true), " is over ",
                                  limits::max_text(max_bytes), " bytes; at most ",
                                  limits::max_text(max_bytes)));
    }
  }
  ::close(fd);
  return text;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return false;
    throw InvalidArgument(detail::concat(path, ": cannot open the file (", errno_text(err), ")"));
  }
  if (S_ISREG(st.st_mode)) return true;
  throw InvalidArgument(detail::concat(path, " is ", kind_of(st.st_mode),
                                       ", not a regular file (seqpar reads regular files only)"));
}

void guard_inputs(bool on) { g_guard = on; }

void refuse_input(std::string_view param, const std::string& path) {
  if (!g_guard) return;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // not there: not an input
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const FileId& id : r.inputs)
    SEQPAR_ARG_CHECK(id.dev != st.st_dev || id.ino != st.st_ino, param, " '", path,
                     "' is the input '", id.path,
                     "' of this run; write the output to another file");
}

void forget_inputs() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.inputs.clear();
}

AtomicOutput::AtomicOutput(std::string param, const std::string& path)
    : param_(std::move(param)), path_(path) {
  SEQPAR_ARG_CHECK(!path.empty(), param_, " is empty; give a file path (or leave ", param_,
                   " out)");
  refuse_input(param_, path);
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  SEQPAR_ARG_CHECK(!exists || !S_ISDIR(st.st_mode), param_, " '", path,
                   "' is a directory; give a file path");
  target_ = resolved(path);
  if (target_.empty())
    throw Error(
        detail::concat(param_, " '", path, "': the folder '", folder_of(path), "' does not exist"));
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& [target, other] : r.outputs)
      SEQPAR_ARG_CHECK(target != target_, param_, " '", path, "' is also the file of ", other,
                       "; give each output its own file");
    r.outputs.emplace_back(target_, param_);
  }
  if (exists && !S_ISREG(st.st_mode)) {
    // A device or a FIFO (/dev/null, /dev/stdout on a pipe): written in place, nothing to rename.
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ >= 0) {
      ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
      return;
    }
    const int err = errno;
    close_temporary();
    throw Error(detail::concat(param_, " '", path, "': cannot open it for writing (",
                               errno_text(err), ")"));
  }
  const std::string folder = folder_of(target_);
  const mode_t mode = exists ? (st.st_mode & 07777) : (0666 & ~current_umask());
  fd_ = ::open(folder.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd_ < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No unnamed files on this filesystem: a hidden named one, removed unless committed.
    const std::string name = target_.substr(target_.find_last_of('/') + 1);
    std::string temp = folder + "/." + name + ".seqpar-XXXXXX";
    fd_ = ::mkostemp(temp.data(), O_CLOEXEC);
    if (fd_ >= 0) temp_name_ = temp;
  }
  if (fd_ < 0) {
    const int err = errno;
    close_temporary();
    throw Error(detail::concat(param_, " '", path, "': cannot create a file in '", folder, "' (",
                               errno_text(err), ")"));
  }
  ::fchmod(fd_, mode);
}

AtomicOutput::~AtomicOutput() { close_temporary(); }

void AtomicOutput::close_temporary() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_name_.empty() && !committed_) ::unlink(temp_name_.c_str());
  temp_name_.clear();
  if (target_.empty()) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.outputs.begin(); it != r.outputs.end(); ++it)
    if (it->first == target_ && it->second == param_) {
      r.outputs.erase(it);
      break;
    }
  target_.clear();
}

void AtomicOutput::write(const void* data, size_t n) {
  SEQPAR_CHECK(fd_ >= 0 && !committed_, param_, " '", path_, "' is closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;
      throw Error(
          detail::concat(param_, " '", path_, "': cannot write the file (", errno_text(err), ")"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicOutput::commit() {
  SEQPAR_CHECK(fd_ >= 0 && !committed_, param_, " '", path_, "' is closed");
  auto fail = [&](const char* step, int err) {
    throw Error(detail::concat(param_, " '", path_, "': cannot ", step, " the file (",
                               errno_text(err), ")"));
  };
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && !S_ISREG(st.st_mode)) {  // a device or FIFO: written in place
    committed_ = true;
    if (::close(fd_) != 0) {
      fd_ = -1;
      fail("write", errno);
    }
    fd_ = -1;
    return;
  }
  if (::fsync(fd_) != 0) fail("write", errno);
  refuse_input(param_, target_);
  if (!temp_name_.empty()) {
    if (::rename(temp_name_.c_str(), target_.c_str()) != 0) fail("write", errno);
    committed_ = true;
  } else {
    // Give the unnamed file a name: the destination itself when it does not exist yet, else a
    // hidden name beside it, renamed over the destination in one step.
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    auto link_as = [&](const std::string& name) {
      if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0)
        return 0;
      if (errno == EEXIST) return EEXIST;
      // No /proc (a bare chroot): linking the descriptor itself needs CAP_DAC_READ_SEARCH.
      if (::linkat(fd_, "", AT_FDCWD, name.c_str(), AT_EMPTY_PATH) == 0) return 0;
      return errno;
    };
    int err = link_as(target_);
    if (err == EEXIST) {
      const std::string name = target_.substr(target_.find_last_of('/') + 1);
      for (int attempt = 0; attempt < 100 && err != 0; ++attempt) {
        const std::string temp = folder_of(target_) + "/." + name + ".seqpar-" +
                                 std::to_string(::getpid()) + "-" + std::to_string(attempt);
        err = link_as(temp);
        if (err == 0 && ::rename(temp.c_str(), target_.c_str()) != 0) {
          err = errno;
          ::unlink(temp.c_str());
          fail("write", err);
        }
        if (err != 0 && err != EEXIST) break;
      }
    }
    if (err != 0) fail("write", err);
    committed_ = true;
  }
  // The rename itself made durable.
  const int dir = ::open(folder_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  const int err = ::close(fd_) == 0 ? 0 : errno;
  fd_ = -1;
  close_temporary();
  if (err != 0) fail("write", err);
}

void write_atomically(std::string param, const std::string& path, std::string_view bytes) {
  AtomicOutput out(std::move(param), path);
  out.write(bytes);
  out.commit();
}

}  // namespace seqpar::files
