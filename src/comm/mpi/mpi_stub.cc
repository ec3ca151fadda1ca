// mpi backend when seqpar is built without MPI (-DSEQPAR_WITH_MPI=OFF): mpi_available() is
// false, mpi_launched() still reads the launcher's environment (so a program can say why it
// cannot run under mpirun), mpi_finalize() does nothing, and the rest throws.
#include <cstdlib>

#include "seqpar/comm/mpi.h"

namespace seqpar {

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw Error(detail::concat(what, ": seqpar was built without MPI (configure with ",
                             "-DSEQPAR_WITH_MPI=ON); use the threads backend"));
}
}  // namespace

bool mpi_available() { return false; }

void mpi_init(int*, char***) { unavailable("mpi_init"); }

void mpi_finalize() {}

bool mpi_launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

std::unique_ptr<Communicator> mpi_world() { unavailable("mpi_world"); }

std::unique_ptr<Communicator> mpi_communicator(std::uintptr_t) {
  unavailable("mpi_communicator");
}

}  // namespace seqpar
