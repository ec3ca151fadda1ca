// Internals of the mpi backend that tests reach into. Private to src/comm/mpi/ and tests.
// Thread-safety: call from the MPI thread only, between operations.
#pragma once

#include <cstddef>

namespace seqpar::mpi_detail {

struct Limits {
  // Largest count passed to MPI in one int argument (default INT_MAX); byte counts above it
  // travel as derived datatypes (chunks of up to 1 GiB).
  size_t max_count;
  // Collectives whose buffers total at most this many bytes (default 64 KiB) run on an internal
  // copy, so a failed collective never leaves MPI writing into the caller's memory.
  size_t stage_bytes;
};
Limits default_limits();
// Tests lower the limits to run the large-count and unstaged paths with small buffers. Returns
// the previous limits.
Limits set_limits_for_testing(Limits limits);

}  // namespace seqpar::mpi_detail
