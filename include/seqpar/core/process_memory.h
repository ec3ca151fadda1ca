// Resident memory of this process, as Linux reports it in /proc/self/status. Under the threads
// backend every rank is a thread of one process, so the figures are the process's, shared.
// Thread-safety: safe to call from any thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace seqpar {

// A "Key:   N kB" line of /proc/self/status ("VmRSS", "VmHWM"), bytes; 0 if unknown.
inline int64_t proc_status_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long long kb = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, key, n) == 0 && line[n] == ':' &&
        std::sscanf(line + n + 1, "%lld", &kb) == 1)
      break;
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

// Peak resident set size of this process (VmHWM), bytes; 0 if unknown.
inline int64_t peak_resident_bytes() { return proc_status_bytes("VmHWM"); }

// Resident set size of this process now (VmRSS), bytes; 0 if unknown.
inline int64_t resident_bytes() { return proc_status_bytes("VmRSS"); }

}  // namespace seqpar
