// --trace FILE for the commands that record one (`seqpar run`, `seqpar denoise`).
// Thread-safety: write_trace is a collective over `comm`; every rank calls it.
#pragma once

#include <string>

#include "commands.h"
#include "seqpar/comm/communicator.h"

namespace seqpar::cli {

// Stops recording (every rank is past its last recorded work: this follows a collective) and
// writes the events of every rank to `out` (opened before the work, held by rank 0) from rank 0;
// a failed write is kept in *error (when given) so the command's report still prints. Threads:
// the ranks share the process's recorder. MPI: each process serializes its events relative to
// the earliest event of any rank and rank 0 gathers them.
void write_trace(Communicator& comm, OutputFile* out, std::string* error);

}  // namespace seqpar::cli
