/*
 * signature.h - what a collective call is, as the ranks compare it.
 *
 * Every backend that checks calls across ranks (the threads backend in shared
 * memory, the MPI backend with one small all_gather) compares these
 * signatures with the same function, so a mismatch reads the same everywhere.
 */
#ifndef MPU_COMM_SIGNATURE_H
#define MPU_COMM_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/comm.h"

typedef enum mpu__kind {
  MPU__ALL_REDUCE = 1, /* 0 is "no call", so zeroed memory is never a valid call */
  MPU__ALL_GATHER,
  MPU__REDUCE_SCATTER,
  MPU__BROADCAST,
  MPU__REDUCE,
  MPU__ALL_TO_ALL,
  MPU__BARRIER,
} mpu__kind;

/* Fixed-width fields: the MPI backend sends it between processes as bytes. */
typedef struct mpu__sig {
  int32_t kind;  /* mpu__kind */
  int32_t dtype; /* mpu_dtype; MPU_UINT8 for a barrier */
  int32_t op;    /* mpu_op; MPU_SUM where the call has none */
  int32_t root;  /* -1 where the call has none */
  uint64_t count;
} mpu__sig;

/* A call with its buffers: what a request holds until it runs. */
typedef struct mpu__call {
  mpu__sig sig;
  const void *send; /* broadcast: the buffer */
  void *recv;
} mpu__call;

/* The signature of a call; op and root are normalised for kinds without them. */
mpu__sig mpu__sig_make(mpu__kind kind, size_t count, mpu_dtype dtype, mpu_op op, int root);

const char *mpu__kind_name(int kind);

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
mpu_result_t mpu__sig_compare(const char *fn, const void *sigs, size_t stride, int n,
                              const int *world, mpu__check_level level);

#endif
