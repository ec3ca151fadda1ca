// Files: what a process reads, and outputs that can never destroy an input.
//
// Every input file seqpar opens goes through open_input / read_input, which refuse anything that
// is not a regular file (a FIFO, a device, a directory: without blocking on a FIFO's open) and
// record the file (its device and inode) as an input of this process. Every output goes through
// AtomicOutput: the bytes go to an unnamed temporary file in the destination's directory, which
// appears under the destination's name only at commit(), by one rename. A run that fails, or is
// killed, before commit() leaves nothing behind: no partial file, no 0-byte file, the old file (if
// any) untouched; a reader that has the old file mapped keeps reading the old bytes.
//
// In a process that is one run (the seqpar program turns guard_inputs on when it starts), a
// destination that is (through links, "..", or another hard link) a file the process has read is
// refused before anything is written, naming both. A library user's process, which may rewrite
// what it read earlier on purpose, has the guard off unless it turns it on.
//
// Thread-safety: the input record is shared by the process and guarded by a mutex; an
// AtomicOutput is used from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace seqpar::files {

// Opens `path` for reading: a read-only file descriptor (O_CLOEXEC) of a regular file, recorded
// as an input. `param` names the parameter that gave the path in messages ("<param> '<path>'";
// the path alone when empty). InvalidArgument "<param> '<path>': cannot open the file (<errno>)"
// or "<param> '<path>' is a FIFO, not a regular file; give <what>" otherwise. The caller closes
// the descriptor.
int open_input(std::string_view param, const std::string& path, std::string_view what);

// The whole of `path` (opened as open_input does), at most max_bytes: InvalidArgument
// "<param> '<path>' is N bytes; at most M" beyond.
std::string read_input(std::string_view param, const std::string& path, std::string_view what,
                       int64_t max_bytes);

// True when `path` is a regular file (following links), false when nothing is there (nor, maybe,
// its folder). Anything else there is refused rather than taken for missing: InvalidArgument
// "<path> is a FIFO, not a regular file (...)" (a directory, a device, a socket likewise), or
// "<path>: cannot open the file (<errno>)" when it cannot be looked at. Never blocks.
bool is_regular_file(const std::string& path);

// Turns the refusal of outputs that are inputs on or off for the process (default off).
void guard_inputs(bool on);

// With the guard on: InvalidArgument "<param> '<path>' is the input '<input>' of this run; write
// the output to another file" when path resolves to a file recorded by open_input.
void refuse_input(std::string_view param, const std::string& path);

// Forgets the recorded inputs (a long-lived process between unrelated runs).
void forget_inputs();

// An output file written atomically: see the file comment. `param` names the parameter that
// gave the path ("output", "trace", ...). The constructor checks the destination (not an input,
// not another open AtomicOutput's destination, its directory exists and takes a new file) and
// opens the temporary file; Error if the directory cannot take it.
class AtomicOutput {
 public:
  AtomicOutput(std::string param, const std::string& path);
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;
  ~AtomicOutput();  // without commit(): the temporary file is removed, the destination untouched

  // Appends n bytes; Error naming the destination if the write fails (a full disk).
  void write(const void* data, size_t n);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Flushes to disk and renames the temporary file over the destination (following a symbolic
  // link to the file it names); refuses once more if the destination became an input. Error if
  // any step fails; the destination is then untouched.
  void commit();

  const std::string& path() const { return path_; }  // as given
  const std::string& param() const { return param_; }

 private:
  void close_temporary() noexcept;

  std::string param_, path_;
  std::string target_;     // the destination with symbolic links resolved
  std::string temp_name_;  // a named temporary file (filesystems without O_TMPFILE); else empty
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `bytes` to `path` through an AtomicOutput.
void write_atomically(std::string param, const std::string& path, std::string_view bytes);

}  // namespace seqpar::files
