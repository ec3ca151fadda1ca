// --trace FILE for the commands that record one (`seqpar run`, `seqpar denoise`).
// Thread-safety: write_trace is a collective over `comm`; every rank calls it.
#pragma once

#include <string>

#include "commands.h"
#include "seqpar/comm/communicator.h"

namespace seqpar::cli {

// Stops recording and writes the events of every rank (gather_trace, parallel/runner.h) to `out`
// (opened before the work, held by rank 0; null on the others); a failed write is kept in *error
// (when given) so the command's report still prints.
void write_trace(Communicator& comm, OutputFile* out, std::string* error);

}  // namespace seqpar::cli
