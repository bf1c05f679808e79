/*
 * mpu/dtensor.h - placements of a tensor on a device mesh and redistribute,
 * what PyTorch's DTensor puts on top of DeviceMesh.
 *
 * A tensor spec gives the global shape and dtype of a row-major tensor and,
 * for every mesh dim, a placement:
 *   Shard(d)       the tensor is cut along its dim d over the mesh dim, as
 *                  torch.chunk cuts (pieces of ceil(n / size), the last ones
 *                  short or empty); several mesh dims sharding the same
 *                  tensor dim nest in mesh-dim order, as DTensor's do. A
 *                  negative d counts from the end (Shard(-1) is the last
 *                  dim), as DTensor's API normalizes it.
 *   Replicate      every rank of the mesh dim holds the same values
 *   Partial(op)    the global value is the reduction over the mesh dim of
 *                  what the ranks hold, op one of MPU_SUM, MPU_AVG, MPU_MAX,
 *                  MPU_MIN, as mpu_comm_all_reduce computes it: integer sums
 *                  wrap, as NCCL's and MPI's do; an integer mean is the sum,
 *                  exact (never wrapped), divided with truncation toward
 *                  zero. As in DTensor, a spec mixes Partial ops only as sum
 *                  with avg (max and min do not commute with the others).
 * Each rank holds its local piece, contiguous, of the shape and at the
 * offset mpu_dtensor_local_shape gives: torch 2.15's
 * compute_local_shape_and_global_offset, an empty piece's offset included
 * (the tensor dim's global size, wherever its outer pieces start).
 *
 * mpu_redistribute takes the steps torch 2.15's DTensor redistribute takes
 * (_redistribute.py, generate_greedy_transform_infos), in its order, so each
 * rank's piece after it is torch's, Partials included. Each step changes one
 * mesh dim with that dim's communicator, one collective or a local step:
 *   Shard(d) -> Replicate     all_gather         Partial -> Replicate  all_reduce
 *   Shard(d) -> Shard(e)      all_to_all         Partial -> Shard(d)   reduce_scatter
 *   Replicate -> Shard(d)     local slice
 *   Shard(d) -> Partial(sum)  local: the piece in place, zeros elsewhere (added
 *                             to zeros, as torch's index_add: -0.0 becomes +0.0)
 *   Replicate -> Partial      local: sum divides by the dim's size on every rank
 *                             (torch's Partial._partition_value); avg, max and
 *                             min keep the value
 * When the source shards anything, the mesh dims are visited innermost
 * first, each going to its target, or to Replicate where its target shard
 * would nest under other outer shards than it holds now; then outermost
 * first, each to its target. A mesh dim of one rank changes with no step.
 * mpu_redistribute_plan says which steps it takes.
 *
 * Beyond torch: changes its DTensor refuses work here too (torch raises
 * "not supported yet" or "unsupported" for them), with a global value that
 * is exact:
 *   Shard(d) -> Partial(avg)         local, the piece scaled by the dim's size
 *   Partial(sum) <-> Partial(avg)    local, scaled by the dim's size
 *   Shard(d) -> Partial(max|min),    through Replicate: all_gather or
 *   a Partial of max or min to or    all_reduce, then the local step
 *   from any other op
 * The local scale is made in the float dtypes only (float16 and bfloat16
 * in float32, rounded once). In the integer dtypes nothing scales in place,
 * so no division truncates and no product overflows: Replicate ->
 * Partial(sum), where torch's division would make the integer tensor a
 * float one, leaves the value on the first rank and zeros on the others;
 * the changes above that would scale go through Replicate: Partial(avg) ->
 * Partial(sum) is an all_reduce(avg), then that step (int32 [1, 1] over 2
 * ranks gives [1, 0], whose sum is their mean, 1); Partial(sum) ->
 * Partial(avg) an all_reduce(sum), then every rank holds it; Shard(d) ->
 * Partial(avg) an all_gather, then every rank holds it.
 *
 * The tensor-parallel regions of mpu/regions.h are special cases, on the
 * one dim of a (tp) mesh, of activations of shape (tokens, hidden):
 *   region                 forward                        backward
 *   copy_to_tp             (identity)                     Partial(sum) -> Replicate
 *   reduce_from_tp         Partial(sum) -> Replicate      (identity)
 *   scatter_to_tp          Replicate -> Shard(1)          Shard(1) -> Replicate
 *   gather_from_tp         Shard(1) -> Replicate          Replicate -> Shard(1)
 *   scatter_to_sp          Replicate -> Shard(0)          Shard(0) -> Replicate
 *   gather_from_sp         Shard(0) -> Replicate          Partial(sum) -> Shard(0)
 *   reduce_scatter_to_sp   Partial(sum) -> Shard(0)       Shard(0) -> Replicate
 * The regions stay their own calls (they run on any mpu_tensor dtype and
 * move the tensor with one collective, no spec); these are the same moves.
 */
#ifndef MPU_DTENSOR_H
#define MPU_DTENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/comm.h"
#include "mpu/mesh.h"
#include "mpu/shard.h"
#include "mpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mpu_placement_kind {
  MPU_PLACE_REPLICATE = 0,
  MPU_PLACE_SHARD,
  MPU_PLACE_PARTIAL,
} mpu_placement_kind;

typedef struct mpu_placement {
  mpu_placement_kind kind;
  int dim;    /* Shard: the tensor dim, -ndim..ndim-1 (negative: from the end) */
  mpu_op op;  /* Partial: MPU_SUM, MPU_AVG, MPU_MAX or MPU_MIN */
} mpu_placement;

#define MPU_REPLICATE ((mpu_placement){MPU_PLACE_REPLICATE, -1, MPU_SUM})
#define MPU_SHARD(d) ((mpu_placement){MPU_PLACE_SHARD, (d), MPU_SUM})
#define MPU_PARTIAL(op_) ((mpu_placement){MPU_PLACE_PARTIAL, -1, (op_)})

typedef struct mpu_dtensor_spec {
  int ndim;                                   /* 1..MPU_TENSOR_MAX_DIMS */
  int64_t shape[MPU_TENSOR_MAX_DIMS];         /* the global shape */
  mpu_placement placements[MPU_MESH_MAX_DIMS]; /* one per mesh dim */
  mpu_dtype dtype;                            /* MPU_FLOAT32 (0) unless set; any dtype */
} mpu_dtensor_spec;

/* "Shard(0)", "Replicate", "Partial(sum)", "Partial(max)", ... Returns buf. */
MPU_API char *mpu_placement_describe(mpu_placement p, char *buf, size_t len);

/* This rank's piece of a tensor of that spec on the mesh: its shape and its
 * offset in the global tensor, as torch's compute_local_shape_and_global_offset
 * gives them (an empty piece sits at the tensor dim's global size). */
MPU_API mpu_result_t mpu_dtensor_local_shape(const mpu_mesh *mesh, int rank,
                                             const mpu_dtensor_spec *spec, int64_t *shape,
                                             int64_t *offset);
/* The same piece as a shard (mpu/shard.h): one box of the global tensor at
 * that offset, every element kept (no span if the piece is empty: its box
 * has a size 0 and sits at the dim's end), so a consumer that takes shards
 * (mpu_ckpt_add_shards) saves and loads any DTensor. At most
 * MPU_SHARD_MAX_DIMS dims, each of global size 1 or more. */
MPU_API mpu_result_t mpu_dtensor_describe(const mpu_mesh *mesh, int rank,
                                          const mpu_dtensor_spec *spec, mpu_shard *out);
/* Its element count. */
MPU_API mpu_result_t mpu_dtensor_local_numel(const mpu_mesh *mesh, int rank,
                                             const mpu_dtensor_spec *spec, size_t *numel);

/*
 * Move this rank's piece `in` of a tensor placed as src to its piece `out`
 * placed as dst (same global shape; out holds mpu_dtensor_local_numel of
 * dst elements of the dtype; in and out may not overlap). Collective over the mesh: every rank of
 * dm calls it with the same specs.
 * On a device mesh over NCCL communicators in and out are device memory
 * (mpu_comm_mem_alloc), which the host never touches: the steps are NCCL's
 * collectives, box copies cudaMemcpy2DAsync, and scaling NCCL's
 * pre-multiplying sum on the device, x * scalar with scalar n or 1 / n
 * rounded to the dtype (exact where n is a power of two; docs/gpu.md).
 * There a -0.0 moved by Shard -> Partial(sum) stays -0.0, and each step
 * waits on the host.
 */
MPU_API mpu_result_t mpu_redistribute(mpu_device_mesh *dm, const mpu_dtensor_spec *src,
                                      const void *in, const mpu_dtensor_spec *dst, void *out);

/*
 * The steps mpu_redistribute takes, one line each, e.g.
 *   "Shard(0) -> Replicate on dim 'dp': all_gather of 4 MiB"
 * (bytes: what this rank's collective call moves: the gathered output, the
 * reduce-scatter input, the all-reduce or all-to-all buffer), written into
 * buf (always terminated; truncated to len). *ncollectives (may be NULL)
 * gets the number of collectives. No communication.
 */
MPU_API mpu_result_t mpu_redistribute_plan(const mpu_device_mesh *dm,
                                           const mpu_dtensor_spec *src,
                                           const mpu_dtensor_spec *dst, char *buf, size_t len,
                                           int *ncollectives);

#ifdef __cplusplus
}
#endif

#endif
