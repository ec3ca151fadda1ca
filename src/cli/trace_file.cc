#include "trace_file.h"

#include "seqpar/parallel/runner.h"

namespace seqpar::cli {

void write_trace(Communicator& comm, OutputFile* out, std::string* error) {
  const std::string doc = gather_trace(comm);
  if (out == nullptr) return;
  try {
    out->write(doc);
  } catch (const Error& e) {
    if (error) *error = e.what();
  }
}

}  // namespace seqpar::cli
