// mpi backend: one rank per process over Open MPI (mpirun -np N seqpar ... --backend mpi).
// Ops are non-blocking MPI calls polled until their deadline; failures are announced to all
// ranks on a private duplicate communicator so every rank reports them.
// Thread-safety: MPI is initialized with MPI_THREAD_FUNNELED; only the thread that called
// mpi_init() may use MPI communicators.
#pragma once

#include <cstdint>
#include <memory>

#include "seqpar/comm/communicator.h"

namespace seqpar {

bool mpi_available();  // false if built without MPI
// Initializes MPI once per process (idempotent); finalized at exit.
void mpi_init(int* argc, char*** argv);
void mpi_finalize();
bool mpi_launched();  // true if the process seems to run under mpirun (env OMPI_COMM_WORLD_SIZE...)
// A communicator over MPI_COMM_WORLD (duplicated). Requires mpi_init().
std::unique_ptr<Communicator> mpi_world();
// A communicator over a duplicate of the application's MPI communicator, given as the value of
// its MPI_Comm handle (Open MPI: the pointer; mpi4py: MPI._handleof(comm)), so seqpar shares
// the application's MPI world. Collective over that communicator. Requires mpi_init() (which
// adopts an MPI the application initialized).
std::unique_ptr<Communicator> mpi_communicator(std::uintptr_t mpi_comm_handle);

}  // namespace seqpar
