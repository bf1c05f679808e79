/*
 * reduce.h - the element-wise reduction kernels every backend shares.
 */
#ifndef MPU_COMM_REDUCE_H
#define MPU_COMM_REDUCE_H

#include <stddef.h>

#include "core/error.h"
#include "mpu/comm.h"

/*
 * dst[i] = op(srcs[0][i], ..., srcs[n-1][i]) for i < count, reading the
 * sources in order 0..n-1 so every rank that reduces the same inputs gets the
 * same bits. float16/bfloat16 accumulate in float32 and round once; integers
 * wrap on overflow; MPU_AVG divides the sum by `divisor` (the communicator
 * size, which may differ from n when partial results are combined). dst may be
 * one of the sources (element for element), never a shifted overlap.
 */
MPU_SIBLING_API void mpu__reduce(void *dst, const void *const *srcs, int n, size_t count, mpu_dtype dtype,
                 mpu_op op, int divisor);

/* The same, writing the result to each of dsts[0..ndst-1] (every destination
 * gets the same bits), with streaming stores when `stream` is set (see
 * copy.h). A destination may be one of the sources, element for element. */
void mpu__reduce_to(void *const *dsts, int ndst, const void *const *srcs, int n, size_t count,
                    mpu_dtype dtype, mpu_op op, int divisor, int stream);

/* First element of chunk k when count elements are cut into n near-equal
 * chunks (the first count % n chunks one longer): how the backends share the
 * work of a large reduction. Chunk k is [lo(k), lo(k + 1)). */
static inline size_t mpu__chunk_lo(size_t count, int n, int k) {
  size_t q = count / (size_t)n, rem = count % (size_t)n;
  return q * (size_t)k + ((size_t)k < rem ? (size_t)k : rem);
}

#endif
