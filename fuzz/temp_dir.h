// A fresh folder under /tmp for the files a fuzz target reads, removed with everything in it when
// the process exits normally (after a crash it stays, beside the reproducing input).
// Thread-safety: none needed (libFuzzer runs one input at a time).
#pragma once

#include <stdlib.h>  // mkdtemp

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace seqpar::fuzz {

class TempDir {
 public:
  // /tmp/<prefix>-XXXXXX, created; aborts if it cannot be.
  explicit TempDir(const std::string& prefix) : path_("/tmp/" + prefix + "-XXXXXX") {
    if (mkdtemp(path_.data()) == nullptr) std::abort();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace seqpar::fuzz
