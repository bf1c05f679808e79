/*
 * mpu/regions.h - Megatron's tensor-parallel communication "regions"
 * (mappings.py), with forward and backward as explicit calls.
 *
 * C has no autograd, so each region is a (forward, backward) pair of
 * primitives that the caller runs in order, as llm.c does:
 *
 *   region                         forward                    backward
 *   copy_to_tp                     identity                   all-reduce
 *   reduce_from_tp                 all-reduce                 identity
 *   scatter_to_tp                  split, last dim            gather, last dim
 *   gather_from_tp                 gather, last dim           split, last dim
 *   scatter_to_sp                  split, first dim           gather, first dim
 *   gather_from_sp                 gather, first dim          reduce-scatter, first dim
 *                                                             (split if tensor_parallel_output_grad
 *                                                              is false)
 *   reduce_scatter_to_sp           reduce-scatter, first dim  gather, first dim
 *   all_to_all                     all-to-all, first dim      all-to-all, first dim
 *
 * The communicator is the tensor-parallel group's (mpu_state_comm(s,
 * MPU_GROUP_TP, ...)). With a group of one every region is the identity,
 * as in Megatron. Tensors are contiguous views; out must have the shape the
 * primitive produces (checked), and may alias in only for the identity and
 * the all-reduce.
 */
#ifndef MPU_REGIONS_H
#define MPU_REGIONS_H

#include "mpu/comm.h"
#include "mpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- primitives (mappings.py's _reduce, _split, _gather, ...) ---------------------- */

typedef enum mpu_primitive {
  MPU_PRIM_IDENTITY = 0,
  MPU_PRIM_ALL_REDUCE,           /* _reduce: sum over the group */
  MPU_PRIM_SPLIT_LAST,           /* _split_along_last_dim: keep this rank's part */
  MPU_PRIM_GATHER_LAST,          /* _gather_along_last_dim: concatenate the ranks' parts */
  MPU_PRIM_SPLIT_FIRST,          /* _split_along_first_dim */
  MPU_PRIM_GATHER_FIRST,         /* _gather_along_first_dim */
  MPU_PRIM_REDUCE_SCATTER_FIRST, /* _reduce_scatter_along_first_dim */
  MPU_PRIM_ALL_TO_ALL_FIRST,     /* all_to_all: block j of dim 0 goes to rank j; the blocks
                                    received are stacked along dim 0 (same shape) */
  MPU_PRIM_COUNT
} mpu_primitive;

/* The shape `prim` turns `in` into over a group of `size` ranks; an error if
 * the dim does not divide or the tensor has no such dim. */
MPU_API mpu_result_t mpu_primitive_shape(mpu_primitive prim, int size, const mpu_tensor *in,
                                         mpu_tensor *shape_out);

/* Run a primitive over comm: out = prim(in). */
MPU_API mpu_result_t mpu_primitive_run(mpu_primitive prim, mpu_comm *comm, const mpu_tensor *in,
                                       mpu_tensor *out);

/* ---- regions --------------------------------------------------------------------------- */

typedef enum mpu_region {
  MPU_COPY_TO_TP = 0,
  MPU_REDUCE_FROM_TP,
  MPU_SCATTER_TO_TP,
  MPU_GATHER_FROM_TP,
  MPU_SCATTER_TO_SP,
  MPU_GATHER_FROM_SP,
  MPU_REDUCE_SCATTER_TO_SP,
  MPU_ALL_TO_ALL,           /* DeepSpeed-Ulysses / expert dispatch: all-to-all both ways */
  MPU_REGION_COUNT
} mpu_region;

/* Flags of mpu_region_backward. */
#define MPU_REGION_DEFAULT 0
#define MPU_NO_TP_OUTPUT_GRAD 1 /* gather_from_sp with tensor_parallel_output_grad=False */

MPU_API const char *mpu_region_name(mpu_region r); /* "copy_to_tp", ... */

/* The primitive a region runs forward, and backward (with flags). */
MPU_API mpu_primitive mpu_region_forward_op(mpu_region r);
MPU_API mpu_primitive mpu_region_backward_op(mpu_region r, int flags);

/* out = region's forward of in; grad_in = region's backward of grad_out. */
MPU_API mpu_result_t mpu_region_forward(mpu_region r, mpu_comm *tp, const mpu_tensor *in,
                                        mpu_tensor *out);
MPU_API mpu_result_t mpu_region_backward(mpu_region r, mpu_comm *tp, const mpu_tensor *grad_out,
                                         mpu_tensor *grad_in, int flags);

#ifdef __cplusplus
}
#endif

#endif
