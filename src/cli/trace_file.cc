#include "trace_file.h"

#include <vector>

#include "seqpar/core/trace.h"

namespace seqpar::cli {

void write_trace(Communicator& comm, OutputFile* out, std::string* error) {
  const int n = comm.size();
  auto write = [&](const std::string& fragments) {
    try {
      out->write(trace::to_json(fragments, n));
    } catch (const Error& e) {
      if (error) *error = e.what();
    }
  };
  comm.barrier();
  if (comm.backend() != "mpi") {
    if (comm.rank() == 0) {
      trace::stop();
      const std::vector<trace::Event> events = trace::events();
      write(trace::to_json_fragments(events, trace::earliest_us(events)));
    }
    comm.barrier();
    return;
  }
  trace::stop();
  const std::vector<trace::Event> events = trace::events();
  const double origin = -comm.all_reduce_max(-trace::earliest_us(events));
  std::string mine = trace::to_json_fragments(events, origin);
  if (comm.rank() != 0 && !mine.empty()) mine.insert(mine.begin(), ',');
  std::vector<size_t> counts(n);
  const size_t my_count = mine.size();
  comm.all_gather(&my_count, sizeof(size_t), counts.data());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::string all(total, '\0');
  comm.all_gatherv(mine.data(), all.data(), counts);
  if (comm.rank() == 0) {
    if (!all.empty() && all[0] == ',') all.erase(all.begin());
    write(all);
  }
  comm.barrier();
}

}  // namespace seqpar::cli
