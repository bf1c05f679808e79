/*
 * layers_internal.h - what the layer files share.
 */
#ifndef MPU_LAYERS_INTERNAL_H
#define MPU_LAYERS_INTERNAL_H

#include "mpu/layers.h"
#include "mpu/state.h"

/* The layer's tensor-parallel group for its host buffers (*tp becomes the
 * host twin of an NCCL group: mpu__comm_for_host), its size and rank. */
mpu_result_t mpu__layer_comm(const char *fn, mpu_comm **tp, int *size, int *rank);
/* _initialize_affine_weight_cpu: the master (rows, cols) drawn by init from
 * a stream seeded by seed, split along dim in tp x stride pieces; this rank
 * keeps pieces rank, rank + tp, ... concatenated along dim; *keep_master (if
 * not NULL) gets the master, else it is freed. */
mpu_result_t mpu__init_partition(mpu_init_method init, void *arg, uint64_t seed, int rows,
                                 int cols, int dim, int stride, int tp_size, int tp_rank,
                                 float *out, float **keep_master);
mpu_tensor mpu__view(float *p, int rows, int cols);
/* run a primitive on (rows, cols) float buffers */
mpu_result_t mpu__run(mpu_primitive prim, mpu_comm *tp, float *in, int in_rows, int in_cols,
                      float *out, int out_rows, int out_cols);

#endif
