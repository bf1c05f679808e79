/*
 * tensor_internal.h - split and concatenate with the copy of the memory the
 * tensors live in (host memcpy, or a backend's device copy: regions.c).
 */
#ifndef MPU_TENSOR_INTERNAL_H
#define MPU_TENSOR_INTERNAL_H

#include <stddef.h>

#include "mpu/tensor.h"

/* Copy height rows of width bytes, row i from src + i * spitch to dst + i * dpitch. */
typedef mpu_result_t (*mpu__copy2d_fn)(void *ctx, void *dst, size_t dpitch, const void *src,
                                       size_t spitch, size_t width, size_t height);

mpu_result_t mpu__tensor_split_with(const mpu_tensor *in, int dim, int parts, int index,
                                    mpu_tensor *out, mpu__copy2d_fn copy2d, void *ctx);
mpu_result_t mpu__tensor_concat_with(const mpu_tensor *parts, int nparts, int dim, mpu_tensor *out,
                                     mpu__copy2d_fn copy2d, void *ctx);

#endif
