/*
 * shard_internal.h - the box copy with the copy of the memory the arrays
 * live in (host memcpy, or a backend's device copy: DTensor's redistribute
 * on device buffers).
 */
#ifndef MPU_SHARD_INTERNAL_H
#define MPU_SHARD_INTERNAL_H

#include "mpu/shard.h"
#include "tensor/tensor_internal.h"

/* mpu_shard_copy_box with copy2d: one copy per plane of the box's last two
 * dims (rows of its last dim, pitched by each array's last dim), in the
 * order of the box's outer dims; the first failure is returned. */
mpu_result_t mpu__shard_copy_box_with(size_t es, void *dst, const int64_t *dshape,
                                      const int64_t *doff, const void *src, const int64_t *sshape,
                                      const int64_t *soff, const int64_t *box, int ndim,
                                      mpu__copy2d_fn copy2d, void *ctx);

#endif
