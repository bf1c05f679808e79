/*
 * mpu/comm_mpi.h - the MPI backend: communicators over MPI communicators, for
 * many processes on one or many hosts. Only when mpu was built with MPI
 * (mpu_mpi_available() says so); this header needs <mpi.h>.
 *
 * Each rank is a process that calls mpu from one thread at a time, so MPI is
 * initialised with MPI_THREAD_FUNNELED. The library's communicators are
 * duplicates of the caller's, with MPI_ERRORS_RETURN: MPI errors come back
 * as MPU_ERR_BACKEND with MPI's error string. float16 and bfloat16
 * reductions are computed in float32 and rounded once, as on the threads
 * backend. MPI has no timeouts and no fault tolerance: a rank that dies ends
 * the job, and mpu_comm_abort calls MPI_Abort, which ends every process of
 * the communicator's job.
 */
#ifndef MPU_COMM_MPI_H
#define MPU_COMM_MPI_H

#include <mpi.h>

#include "mpu/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over (a duplicate of) an MPI communicator the caller has.
 * options may be NULL (the defaults). */
MPU_API mpu_result_t mpu_comm_from_mpi(MPI_Comm comm, mpu_comm **out);
MPU_API mpu_result_t mpu_comm_from_mpi_ex(MPI_Comm comm, const mpu_mpi_options *options,
                                          mpu_comm **out);

#ifdef __cplusplus
}
#endif

#endif
