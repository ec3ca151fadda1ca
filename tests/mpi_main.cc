// gtest main for the MPI suites: initializes MPI, prints results from rank 0 only, and makes the
// exit status the same on every rank (failed anywhere = failed everywhere).
#include <gtest/gtest.h>
#include <mpi.h>

#include "seqpar/comm/mpi.h"

int main(int argc, char** argv) {
  seqpar::mpi_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "rank %d: tests failed\n", rank);
  seqpar::mpi_finalize();
  return any_failed;
}
