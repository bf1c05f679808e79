/*
 * mpu/shard.h - which part of a tensor a rank holds: one description for
 * every strategy, pure arithmetic, as DTensor's
 * compute_local_shape_and_global_offset and DCP's chunk metadata
 * (torch/distributed/checkpoint/metadata.py) describe it in PyTorch.
 *
 * A shard is a global tensor (shape) seen from one rank:
 *   - the rank's local tensor (local_shape, row-major), made of boxes of the
 *     global tensor: global[global_offset + i] is local[local_offset + i]
 *     for every i < length (per dim). One box for a tensor-parallel slice or
 *     a replica, `stride` of them for Megatron's strided partition (a fused
 *     QKV weight holds its Q, K and V rows);
 *   - the elements of the local tensor the rank keeps, as spans [lo, hi) of
 *     its row-major order, each with `at`, where element lo lies in the
 *     holder's storage: the whole tensor (a parameter), its ZeRO-1 shard of
 *     each bucket (the distributed optimizer), its piece of an FSDP flat
 *     parameter, the dim-0 rows of FSDP2's fully_shard.
 *
 * The param buffer, the optimizers and FSDP describe what they hold with it
 * (mpu_param_buffer_describe, mpu_fsdp_describe), the checkpoint saves and
 * loads any list of shards (mpu_ckpt_add_shards) without knowing who made
 * them, and the box copy below moves elements between a shard and a stored
 * piece, or between two row-major arrays (DTensor's redistribute).
 */
#ifndef MPU_SHARD_H
#define MPU_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/result.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPU_SHARD_MAX_DIMS 4
#define MPU_SHARD_MAX_BOXES 8   /* a Megatron stride up to 8 */
#define MPU_SHARD_MAX_SPANS 64  /* a tensor over at most 64 buckets of a ZeRO-1 optimizer */
#define MPU_SHARD_NAME_MAX 144  /* a global name and a suffix (".exp_avg_sq") */

/* A box of the global tensor held by a local one (see above). */
typedef struct mpu_shard_box {
  int64_t local_offset[MPU_SHARD_MAX_DIMS], global_offset[MPU_SHARD_MAX_DIMS];
  int64_t length[MPU_SHARD_MAX_DIMS];
} mpu_shard_box;

/* Local elements [lo, hi) (row-major), element lo at index `at` of the holder's storage. */
typedef struct mpu_shard_span {
  size_t lo, hi, at;
} mpu_shard_span;

typedef struct mpu_shard {
  int ndim;                                  /* 1..MPU_SHARD_MAX_DIMS */
  int64_t shape[MPU_SHARD_MAX_DIMS];         /* global */
  int64_t local_shape[MPU_SHARD_MAX_DIMS];
  int nboxes;
  mpu_shard_box boxes[MPU_SHARD_MAX_BOXES];
  int nspans;                                /* the elements kept, in increasing order */
  mpu_shard_span spans[MPU_SHARD_MAX_SPANS];
} mpu_shard;

/*
 * torch.chunk's rule, the one rule for cutting a length among n ranks
 * (DTensor's Shard, FSDP's flat parameter, FSDP2's dim 0, ZeRO-1's
 * buckets): piece i of [start, end) is [*lo, *hi), every piece ceil(len / n)
 * long except the last ones, which are short or empty (empty ones sit at
 * end). Returns the padded piece length ceil(len / n) (0 if n is 0).
 */
MPU_API size_t mpu_shard_chunk(size_t start, size_t end, size_t n, size_t i, size_t *lo,
                               size_t *hi);

/*
 * Megatron's partition (set_tensor_model_parallel_attributes): the global
 * tensor (ndim, shape) is cut along dim into tp x stride equal pieces and
 * rank tp_rank holds pieces tp_rank, tp_rank + tp, ... in order
 * (weight_list[rank::world_size] of _initialize_affine_weight_cpu); dim -1
 * (or tp 1): the whole tensor in one box. The shard keeps every local
 * element (one span, at 0). MPU_ERR_INVALID_ARGUMENT, out unchanged, unless
 * tp x stride divides the size of dim, stride <= MPU_SHARD_MAX_BOXES and
 * every size is 1..2^40.
 */
MPU_API mpu_result_t mpu_shard_megatron(int ndim, const int64_t *shape, int dim, int stride,
                                        int tp_size, int tp_rank, mpu_shard *out);

/* One box: the local tensor (local_shape) is the global one's box at
 * offset, as DTensor's compute_local_shape_and_global_offset gives it
 * (mpu_dtensor_describe); every local element kept (one span, at 0). An
 * empty piece (a size 0) keeps nothing (no span); its offset may be the
 * dim's size, where torch puts an empty shard. MPU_ERR_INVALID_ARGUMENT, out
 * unchanged, for an outlying box. */
MPU_API mpu_result_t mpu_shard_box_at(int ndim, const int64_t *shape, const int64_t *local_shape,
                                      const int64_t *offset, mpu_shard *out);

/* The product of the first ndim sizes; SIZE_MAX if negative or past size_t. */
MPU_API size_t mpu_shard_numel(int ndim, const int64_t *shape);

/* Keep local elements [lo, hi) at `at` of the storage: appended after the
 * spans already kept (lo at or past the last one's hi). Empty spans are
 * dropped. MPU_ERR_INVALID_ARGUMENT for a span past the local tensor, out of
 * order, or one too many. */
MPU_API mpu_result_t mpu_shard_keep(mpu_shard *s, size_t lo, size_t hi, size_t at);

/*
 * Whether the elements [lo, hi) of box k's own row-major order (0 <= lo <
 * hi <= its element count) are a box themselves: they are when they fill
 * whole rows of the dims they cut (a span covering whole rows of a 2-d
 * tensor is a box), as DCP's chunks must be. Returns 1 and the global box
 * (offset, length) they cover, or 0.
 */
MPU_API int mpu_shard_span_box(int ndim, const mpu_shard_box *box, uint64_t lo, uint64_t hi,
                               int64_t *offset, int64_t *length);

/*
 * The one N-d box copy: the box of sizes box[ndim] at soff of src (a
 * row-major array of shape sshape) to doff of dst (shape dshape), elements
 * of es bytes, one copy per plane of its last two dims. Nothing if a size is
 * 0. The caller keeps the boxes inside the arrays (DTensor's
 * redistribute copies its pieces with it).
 */
MPU_API void mpu_shard_copy_box(size_t es, void *dst, const int64_t *dshape, const int64_t *doff,
                                const void *src, const int64_t *sshape, const int64_t *soff,
                                const int64_t *box, int ndim);

/* Local elements [lo, hi) held in memory: data[k] is element lo + k. */
typedef struct mpu_shard_mem {
  size_t lo, hi;
  float *data;
} mpu_shard_mem;

/* The memory of a shard's kept spans in storage `data` (span k at data +
 * spans[k].at), into out (s->nspans entries); returns the count. */
MPU_API int mpu_shard_mem_of(const mpu_shard *s, float *data, mpu_shard_mem *out);

/*
 * A stored piece: the global box (offset, length) and the span [flat_lo,
 * flat_hi) of its elements in its own row-major order, whose values are
 * data[0 .. flat_hi - flat_lo) (NULL: count only).
 */
typedef struct mpu_shard_piece {
  int ndim;
  const int64_t *offset, *length;
  uint64_t flat_lo, flat_hi;
  float *data;
} mpu_shard_piece;

/*
 * Copy between a stored piece and a local tensor (local_shape, made of
 * boxes[nboxes]) held in mem[nmem] (increasing, disjoint), where they
 * overlap: to_local 1 piece -> mem, 0 mem -> piece. hits (may be NULL), one
 * byte per element of each mem span, counts the elements written
 * (saturating). Returns the number of elements in the overlap. The box copy
 * of mpu_shard_copy_box, clipped to the spans.
 */
MPU_API uint64_t mpu_shard_transfer(const mpu_shard_piece *piece, int ndim,
                                    const int64_t *local_shape, const mpu_shard_box *boxes,
                                    int nboxes, const mpu_shard_mem *mem, int nmem, int to_local,
                                    uint8_t *const *hits);

/* How many elements of box (in local coordinates) have a local row-major
 * index below x, for a local tensor of local_shape: the elements of local
 * span [lo, hi) that fall in the box are the box's elements [count(lo),
 * count(hi)) in the box's own row-major order. */
MPU_API uint64_t mpu_shard_box_count_below(int ndim, const int64_t *local_shape,
                                           const mpu_shard_box *box, uint64_t x);

/* ---- a list of named shards: what a holder hands a consumer (a checkpoint) ---------------- */

/* What a tensor is (mpu_ckpt_kind has the same values). */
typedef enum mpu_shard_kind {
  MPU_SHARD_PARAM = 0,      /* a model parameter (its float32 main weight) */
  MPU_SHARD_EXP_AVG = 1,    /* AdamW's first moment */
  MPU_SHARD_EXP_AVG_SQ = 2  /* AdamW's second moment */
} mpu_shard_kind;

typedef struct mpu_shard_tensor {
  char name[MPU_SHARD_NAME_MAX];
  mpu_shard_kind kind;
  mpu_shard shard;  /* its spans: what the rank keeps (and a load fills) */
  float *data;      /* the storage: span k's element lo is data[spans[k].at] */
  int nsave;        /* what the rank saves, spans over the same storage (one replica of each */
  mpu_shard_span save[MPU_SHARD_MAX_SPANS]; /* element saves it): all, part or none of those kept */
} mpu_shard_tensor;

/* Called after a consumer wrote into the storage (a checkpoint load), so the
 * holder can drop what it derived from the old values (FSDP's gathers). */
typedef mpu_result_t (*mpu_shard_written_fn)(void *holder);

typedef struct mpu_shard_list {
  int n, cap;
  mpu_shard_tensor *t;
  int nwritten;
  struct mpu_shard_written {
    mpu_shard_written_fn fn;
    void *holder;
  } *written;
} mpu_shard_list;

MPU_API void mpu_shard_list_init(mpu_shard_list *l);
MPU_API void mpu_shard_list_free(mpu_shard_list *l);
/* Append a copy of t (its name 1..MPU_SHARD_NAME_MAX - 1 bytes, not in the list already). */
MPU_API mpu_result_t mpu_shard_list_add(mpu_shard_list *l, const mpu_shard_tensor *t);
/* Ask to be told (fn(holder)) when a consumer wrote into the list's storage. */
MPU_API mpu_result_t mpu_shard_list_on_write(mpu_shard_list *l, mpu_shard_written_fn fn,
                                             void *holder);

/* A tensor's global name and shape, which its holder describes shards of. */
typedef struct mpu_shard_global {
  const char *name;
  int ndim;
  int64_t shape[MPU_SHARD_MAX_DIMS];
} mpu_shard_global;

#ifdef __cplusplus
}
#endif

#endif
