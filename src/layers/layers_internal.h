/*
 * layers_internal.h - what the layer files share.
 */
#ifndef MPU_LAYERS_INTERNAL_H
#define MPU_LAYERS_INTERNAL_H

#include "mpu/layers.h"
#include "mpu/state.h"

mpu_result_t mpu__layer_comm(mpu_comm *tp, int *size, int *rank);
mpu_result_t mpu__master_slice(uint64_t seed, float std, int rows, int cols, int r0, int nr,
                               int c0, int nc, float *out);
mpu_tensor mpu__view(float *p, int rows, int cols);
/* run a primitive on (rows, cols) float buffers */
mpu_result_t mpu__run(mpu_primitive prim, mpu_comm *tp, float *in, int in_rows, int in_cols,
                      float *out, int out_rows, int out_cols);

#endif
