#pragma once
// The Open MPI communicator (src/distributed/mpi_communicator.cpp): collectives posted
// non-blocking and waited for with a deadline, so a dead, stuck or failed rank ends the others
// with mpt::Error instead of a hang.
#include <memory>

#include "mpt/distributed.hpp"

namespace mpt::distributed::detail {

/// Joins the MPI job (MPI_Init_thread, unless MPI is initialized already) and returns its world
/// communicator, with this machine's rank and size in `local_rank` / `local_size`. Only in
/// builds with MPI (MPT_WITH_MPI).
std::shared_ptr<Communicator> mpi_world(int& local_rank, int& local_size);
/// MPI_Finalize at exit, unless a collective failed (pending requests would hang it).
void mpi_finalize() noexcept;
[[noreturn]] void mpi_abort(int code) noexcept;

}  // namespace mpt::distributed::detail
