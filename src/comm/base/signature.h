/*
 * signature.h - the one description of a collective call: made by comm.c's
 * checks, handed to the backend's start, and compared across ranks.
 *
 * Every backend that checks calls across ranks (the threads backend in shared
 * memory, the MPI backend with one small all_gather that may carry the data too) compares the signatures
 * with the same function, so a mismatch reads the same everywhere.
 */
#ifndef MPU_COMM_SIGNATURE_H
#define MPU_COMM_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/base/collective.h"
#include "core/error.h"
#include "mpu/comm.h"

/* Fixed-width fields: the MPI backend sends it between processes as bytes. */
typedef struct mpu__sig {
  int32_t kind;    /* mpu_collective, or MPU__CALL_SEND / _RECV (collective.h) */
  int32_t dtype;   /* mpu_dtype; MPU_UINT8 for a barrier */
  int32_t op;      /* mpu_op; MPU_SUM where the call has none */
  int32_t root;    /* -1 where the call has none */
  uint64_t count;  /* elements per rank; uneven calls: the total every rank agrees on
                      (all_to_all_v: 0, its counts differ by rank by design) */
  uint64_t digest; /* uneven calls: a hash of the counts every rank must agree on */
} mpu__sig;

/* A checked call: what comm.c hands a backend's start (send and recv: its
 * send and recv), and what a request holds until it runs. Buffers and count lists belong to the call until it
 * completes. */
typedef struct mpu__call {
  mpu__sig sig;
  const void *send; /* broadcast: the buffer */
  void *recv;
  /* uneven calls, in elements, one entry per rank:
   *   all_gather_v     counts/displs: what each rank contributes and where it lands in recv
   *   reduce_scatter_v counts: each rank's block of send, blocks one after the other
   *   all_to_all_v     counts/displs: what goes to each rank, from where in send;
   *                    rcounts/rdispls: what comes from each rank, to where in recv */
  const size_t *counts, *displs, *rcounts, *rdispls;
  int peer; /* send: the destination; recv: the source */
} mpu__call;

/* A call's arguments as locals, for a backend's collectives (each reads
 * some of them). */
#define MPU__CALL_ARGS(k)                          \
  const void *send = (k)->send;                    \
  void *recv = (k)->recv;                          \
  size_t count = (size_t)(k)->sig.count;           \
  mpu_dtype dt = (mpu_dtype)(k)->sig.dtype;        \
  mpu_op op = (mpu_op)(k)->sig.op;                 \
  int root = (k)->sig.root;                        \
  int peer = (k)->peer;                            \
  (void)send, (void)recv, (void)count, (void)dt, (void)op, (void)root, (void)peer

/* "all_reduce(count=8, float32, op=sum)" */
void mpu__sig_describe(const mpu__sig *s, char *buf, size_t len);

/* How much of a signature must agree across ranks. */
typedef enum mpu__check_level {
  MPU__CHECK_SAFETY, /* kind, count, dtype: a mismatch would read or write out of bounds */
  MPU__CHECK_ALL,    /* also op and root: a mismatch would give wrong answers */
} mpu__check_level;

/*
 * Compare the n members' signatures (member m's at (char *)sigs + m * stride)
 * with member 0's. MPU_SUCCESS if they agree at `level`; else
 * MPU_ERR_MISMATCH with a message naming the first differing member, both
 * calls, and every member that differs. world (n entries, or NULL) gives the
 * members' world ranks for the message. Every member that runs it on the
 * same signatures reaches the same verdict.
 */
MPU_SIBLING_API mpu_result_t mpu__sig_compare(const char *fn, const void *sigs, size_t stride, int n,
                              const int *world, mpu__check_level level);

#endif
