/*
 * mpi_internal.h - what the MPI backend's files share (mpi.c, mpi_oob.c).
 */
#ifndef MPU_COMM_MPI_INTERNAL_H
#define MPU_COMM_MPI_INTERNAL_H

#include <mpi.h>
#include <stddef.h>

#include "comm/comm_internal.h"

/* The largest message, in 64-bit words, sent on a duplicate the backend
 * keeps after its communicator ends: what a late one is drained into. */
#define MPU__MPI_LATE_WORDS 32

/* mpi.c: the MPI communicator of c */
MPI_Comm mpu__mpi_comm_of(const mpu_comm *c);
/* mpi.c: keep a duplicate until mpu_mpi_finalize, drain late messages then
 * (Open MPI gives a freed id to the next communicator made) */
void mpu__mpi_retire(MPI_Comm comm);
/* mpi.c: end a send that may never be received without blocking (cancel
 * it, or keep buf until it completes or MPI is finalised) */
void mpu__mpi_end_send(MPI_Request *req, void *buf);

/* mpi_oob.c: the out-of-band abort channel (mpu__comm_ops.oob_*) */
mpu_result_t mpu__mpi_oob_open(mpu_comm *c, void **ctx);
void mpu__mpi_oob_post(void *ctx, int rank, const char *why);
int mpu__mpi_oob_poll(void *ctx, int *who, char *why, size_t len);
void mpu__mpi_oob_close(void *ctx);

#endif
