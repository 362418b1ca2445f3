/* ruda/mpi.h - communicators across processes launched by MPI (mpirun).
 * Link libruda_mpi, libruda and MPI (mpicc app.c -lruda_mpi -lruda). Not
 * included by ruda/ruda.h: it needs <mpi.h>.
 *
 *   MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
 *   ruda_device_open(&cfg, &dev);                   one device per process
 *   ruda_mpi_comm_init(dev, MPI_COMM_WORLD, &comm); every rank
 *   ruda_all_reduce(comm, dev, src, dst, RUDA_DTYPE_F32, RUDA_REDUCE_SUM);
 *   ruda_comm_sync(comm, dev, NULL);
 *   ruda_comm_destroy(comm); ruda_device_close(dev, NULL); MPI_Finalize();
 */
#ifndef RUDA_MPI_H
#define RUDA_MPI_H

/* MPI's C API is all ruda needs; the deprecated C++ bindings some MPIs
 * still ship warn under -Wextra, so they are left out (before any other
 * include of <mpi.h>, this holds for the whole translation unit). */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "ruda/ruda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Joins dev as this process's rank of `comm` (rank and size from it),
 * collectively: every process of comm calls it. On the cuda backend the
 * ranks share NCCL's unique id over comm (broadcast from rank 0) and NCCL
 * carries the data; on the host backend MPI does (MPI_Iallreduce, Isend,
 * Irecv on a duplicate of comm, issued by the rank's worker in stream
 * order, each waited at most RUDA_COMM_TIMEOUT milliseconds: past it the
 * collective fails with RUDA_ETIMEDOUT and the communicator is broken).
 * Ranks that disagree on an all-reduce's count, type or reduction get
 * RUDA_EINVAL saying which values they brought. RUDA_EINVAL at the call
 * for a NULL dev or out, or when MPI is not initialised with
 * MPI_THREAD_MULTIPLE (the workers call it too); other failures are
 * ruda_comm_init_rank's (ruda_last_error describes them). Blocking.
 * Not thread-safe on one MPI communicator: as any MPI collective, one call per process on comm
 * at a time. */
RUDA_EXTERN int ruda_mpi_comm_init(struct ruda_device *dev, MPI_Comm comm, ruda_comm **out);

#ifdef __cplusplus
}
#endif

#endif /* RUDA_MPI_H */
