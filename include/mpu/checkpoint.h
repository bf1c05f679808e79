/*
 * mpu/checkpoint.h - distributed checkpoints that survive a change of layout,
 * as Megatron core's dist_checkpointing and torch.distributed.checkpoint:
 * every rank writes the pieces it holds of each global tensor into one
 * safetensors file, rank 0 writes an index (index.json) that says where
 * every piece of every global tensor is, and any layout loads it back, each
 * rank reading only the pieces it needs (docs/checkpoint.md has the format).
 *
 * A rank describes its state as a set of sharded tensors. Each has a global
 * name and shape, the shape of the rank's local tensor, the boxes of the
 * global tensor the local one holds (one for a plain tensor-parallel slice,
 * `stride` of them for a fused QKV weight: the stride undone), and spans of
 * the local tensor's elements (row-major) with the memory that holds them:
 * the whole tensor for parameters, each ZeRO-1 shard of a bucket for the
 * distributed optimizer's state, this rank's piece of each bucket of a
 * sharded buffer (mpu/fsdp.h: FSDP, ZeRO-2, HSDP).
 *
 * Saving is collective over the world; a save that dies midway never leaves
 * a directory that opens: files are written under temporary names, synced
 * and renamed, and the index is written last (after removing the old one).
 * Loading reads each needed piece once with pread, checks its CRC-32, copies
 * its overlap with every box and span of the rank, and changes nothing in
 * the caller's memory unless every rank loaded everything.
 */
#ifndef MPU_CHECKPOINT_H
#define MPU_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/comm.h"
#include "mpu/fsdp.h"
#include "mpu/state.h"
#include "mpu/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPU_CKPT_MAX_DIMS 4
#define MPU_CKPT_MAX_BOXES 8   /* a stride up to 8 */
#define MPU_CKPT_NAME_MAX 128  /* printable ASCII, no '"' or '\\' */
#define MPU_CKPT_META_MAX 32

/* A box of the global tensor held by a local one: global[global_offset +
 * i] is local[local_offset + i] for every i < length (per dim). */
typedef struct mpu_ckpt_box {
  int64_t local_offset[MPU_CKPT_MAX_DIMS], global_offset[MPU_CKPT_MAX_DIMS];
  int64_t length[MPU_CKPT_MAX_DIMS];
} mpu_ckpt_box;

/* Local elements [lo, hi) of a tensor (row-major); data[k] is element lo + k. */
typedef struct mpu_ckpt_span {
  size_t lo, hi;
  float *data;
} mpu_ckpt_span;

/* What a tensor is, for the tools (mpu ckpt merge writes parameters only
 * unless asked for everything). */
typedef enum mpu_ckpt_kind {
  MPU_CKPT_PARAM = 0,     /* a model parameter (its float32 main weight) */
  MPU_CKPT_EXP_AVG = 1,   /* AdamW's first moment */
  MPU_CKPT_EXP_AVG_SQ = 2 /* AdamW's second moment */
} mpu_ckpt_kind;

/* "param", "exp_avg", "exp_avg_sq" (the index's names); "?" for another value */
MPU_API const char *mpu_ckpt_kind_name(mpu_ckpt_kind kind);

typedef struct mpu_ckpt_tensor {
  char name[MPU_CKPT_NAME_MAX];
  mpu_ckpt_kind kind;
  int ndim;
  int64_t shape[MPU_CKPT_MAX_DIMS];        /* global */
  int64_t local_shape[MPU_CKPT_MAX_DIMS];
  int nboxes;
  mpu_ckpt_box boxes[MPU_CKPT_MAX_BOXES];
  int nspans;                              /* what this rank loads */
  mpu_ckpt_span *spans;
  int nsave;                               /* what this rank writes: one rank writes each element */
  mpu_ckpt_span *save;
} mpu_ckpt_tensor;

/* What a checkpoint records besides tensors. */
typedef struct mpu_ckpt_layout {
  int world, tp, pp, vp, dp, cp, ep;
  int zero1;             /* the optimizer was distributed */
  char flavor[16];       /* "core", "core-0.19", "deepspeed" */
} mpu_ckpt_layout;

/* Fill a layout from a parallel state (s, or NULL: this thread's current
 * one): its world, tp, pp, vp (0: none), dp, cp, ep and flavour; zero1 is
 * the optimizer's and is kept. Fails, with out unchanged, without a state. */
MPU_API mpu_result_t mpu_ckpt_layout_from_state(const mpu_state *s, mpu_ckpt_layout *out);

typedef struct mpu_ckpt_set {
  int n, cap;
  mpu_ckpt_tensor *t;
  int64_t step;                      /* training steps done */
  mpu_ckpt_layout layout;            /* mpu_ckpt_layout_from_state fills it; a save of
                                        more ranks than mpu_ckpt_set_init's 1 x 1 x 1 fills it
                                        from the current state, or is refused */
  int has_adamw;
  mpu_adamw_options adamw;           /* the optimizer's hyper-parameters ... */
  int64_t optimizer_step;            /* ... and its step count */
  mpu_rng_states rng;                /* this rank's random streams */
  mpu_rng default_rng;
  int n_meta;                        /* free-form string pairs (the model's config) */
  char meta[MPU_CKPT_META_MAX][2][64];
  int strict;                        /* load: a tensor of the checkpoint that the set lacks
                                        is an error (1, the default) */
} mpu_ckpt_set;

MPU_API void mpu_ckpt_set_init(mpu_ckpt_set *set);
MPU_API void mpu_ckpt_set_free(mpu_ckpt_set *set);
MPU_API mpu_result_t mpu_ckpt_set_meta(mpu_ckpt_set *set, const char *key, const char *value);

/*
 * The boxes of a tensor-parallel parameter (Megatron's partition_dim and
 * stride): the global tensor (ndim, shape) is cut along attrs.partition_dim
 * into tp x stride pieces and rank r holds pieces r, r + tp, ... in order
 * (a fused QKV weight with stride 3 holds its Q, K and V rows). A duplicate
 * holds the whole tensor in one box. Fails unless tp x stride divides the
 * partitioned size.
 */
MPU_API mpu_result_t mpu_ckpt_partition(int ndim, const int64_t *shape, mpu_param_attrs attrs,
                                        int tp_size, int tp_rank, int64_t *local_shape,
                                        mpu_ckpt_box *boxes, int *nboxes);

/* Add a tensor with its boxes (copied) and spans (copied); the spans' memory
 * stays the caller's. */
MPU_API mpu_result_t mpu_ckpt_add(mpu_ckpt_set *set, const char *name, mpu_ckpt_kind kind, int ndim,
                                  const int64_t *shape, const int64_t *local_shape,
                                  const mpu_ckpt_box *boxes, int nboxes, const mpu_ckpt_span *spans,
                                  int nspans, const mpu_ckpt_span *save, int nsave);

/* A parameter's global name and shape, for mpu_ckpt_add_buffer. */
typedef struct mpu_ckpt_global {
  const char *name;
  int ndim;
  int64_t shape[MPU_CKPT_MAX_DIMS];
} mpu_ckpt_global;

/*
 * Every parameter of a buffer (globals[i] for parameter i) and, with opt,
 * its AdamW moments ("<name>.exp_avg", "<name>.exp_avg_sq"). The rank saves
 * one replica of each element: plain, the data-parallel rank 0 writes the
 * parameters and moments, and of a tensor-parallel duplicate tensor-parallel
 * rank 0; ZeRO-1 (opt distributed), each rank writes the parameter's float32
 * main weights and moments of its shard (tp rank 0 for duplicates). Loading
 * fills the whole parameter, and the moments the rank keeps.
 */
MPU_API mpu_result_t mpu_ckpt_add_buffer(mpu_ckpt_set *set, const mpu_param_buffer *b,
                                         const mpu_ckpt_global *globals, const mpu_optimizer *opt,
                                         int tp_size, int dp_rank);

/*
 * The same for a sharded buffer of mpu/fsdp.h (any strategy): each rank
 * loads and saves the span of each parameter that its piece of the bucket
 * holds, with the AdamW moments there; one replica saves (tp rank 0 for
 * duplicates, replica 0 of the hybrid strategies), so a checkpoint of any
 * layout loads into it and it loads into any layout. Every bucket is
 * resharded here, so that the next mpu_fsdp_unshard gathers what a load
 * puts in the pieces. The step count is the caller's to record
 * (mpu_fsdp_optimizer_step, mpu_fsdp_set_optimizer_step).
 */
MPU_API mpu_result_t mpu_ckpt_add_fsdp(mpu_ckpt_set *set, mpu_fsdp *f,
                                       const mpu_ckpt_global *globals, int tp_size);

/* The global layers of model chunk `chunk` of pipeline rank pp_rank, with
 * pp x vp virtual stages of layers / (pp x vp) layers each (Megatron's
 * interleaved assignment: virtual stage chunk x pp + pp_rank). */
MPU_API mpu_result_t mpu_ckpt_chunk_layers(int layers, int pp, int vp, int pp_rank, int chunk,
                                           int *first, int *count);

/* Save the set of every rank of world into dir (created if absent). The
 * set's layout must multiply to world's size (tp x pp x cp x dp); left as
 * mpu_ckpt_set_init made it, it is taken from this thread's current state
 * when that has as many ranks, else the save is refused. */
MPU_API mpu_result_t mpu_ckpt_save(const char *dir, mpu_comm *world, const mpu_ckpt_set *set);

/* ---- reading -------------------------------------------------------------------------- */

typedef struct mpu_ckpt mpu_ckpt;

/* Open a checkpoint: read and check its index, and that every file it names
 * has the size it says (a save that did not finish has no index). */
MPU_API mpu_result_t mpu_ckpt_open(const char *dir, mpu_ckpt **out);
MPU_API void mpu_ckpt_close(mpu_ckpt *ck);

/* Read every piece and check its CRC-32 (what `mpu ckpt inspect` does). */
MPU_API mpu_result_t mpu_ckpt_verify(mpu_ckpt *ck);

/*
 * Load the set's tensors from ck: every tensor of the set must be in the
 * checkpoint with its global shape (and, strict, every tensor of the
 * checkpoint in the set). Each rank reads the pieces that overlap what it
 * loads; with world (NULL: this rank alone) the ranks agree, and the
 * caller's memory is written only if every rank read everything (a rank
 * that could not open the checkpoint calls it with ck NULL, so that the
 * others do not wait for it, and every rank fails). Also sets
 * set->step, layout, adamw, optimizer_step and meta from the index (the
 * caller puts them in place: an optimizer's step, its streams).
 */
MPU_API mpu_result_t mpu_ckpt_load(mpu_ckpt *ck, mpu_comm *world, mpu_ckpt_set *set);

/* What the index says. */
typedef struct mpu_ckpt_info {
  int64_t step;
  mpu_ckpt_layout layout;
  int has_adamw;
  mpu_adamw_options adamw;
  int64_t optimizer_step;
  int ntensors, nfiles;
  uint64_t index_bytes;
} mpu_ckpt_info;

MPU_API mpu_result_t mpu_ckpt_get_info(const mpu_ckpt *ck, mpu_ckpt_info *out);
/* A metadata value, or NULL. */
MPU_API const char *mpu_ckpt_meta(const mpu_ckpt *ck, const char *key);
/* Saved rank `rank`'s random streams. */
MPU_API mpu_result_t mpu_ckpt_rng(const mpu_ckpt *ck, int rank, mpu_rng_states *states,
                                  mpu_rng *default_rng);

typedef struct mpu_ckpt_tensor_info {
  const char *name;
  mpu_ckpt_kind kind;
  const char *dtype;   /* "F32" */
  int ndim;
  int64_t shape[MPU_CKPT_MAX_DIMS];
  int npieces;
  uint64_t bytes;
} mpu_ckpt_tensor_info;

MPU_API mpu_result_t mpu_ckpt_tensor_at(const mpu_ckpt *ck, int i, mpu_ckpt_tensor_info *out);

/* Piece p of tensor i: its file, the global box it covers, the span of the
 * box's elements (row-major) it holds, and its bytes in the file. */
typedef struct mpu_ckpt_piece_info {
  const char *file;
  int64_t offset[MPU_CKPT_MAX_DIMS], length[MPU_CKPT_MAX_DIMS];
  uint64_t flat_lo, flat_hi;
  uint64_t byte_lo, byte_hi;
  uint32_t crc32;
} mpu_ckpt_piece_info;

MPU_API mpu_result_t mpu_ckpt_piece_at(const mpu_ckpt *ck, int i, int p, mpu_ckpt_piece_info *out);
/* Name and size of file f; its size per the index. */
MPU_API mpu_result_t mpu_ckpt_file_at(const mpu_ckpt *ck, int f, const char **name, uint64_t *bytes);

/* Bytes this handle has read so far: the index and every piece read. */
MPU_API uint64_t mpu_ckpt_bytes_read(const mpu_ckpt *ck);

/* One safetensors file with every parameter whole (all: the optimizer's
 * moments too), as safetensors.numpy.load_file / safetensors.torch.load_file
 * read it; written under a temporary name and renamed. */
MPU_API mpu_result_t mpu_ckpt_merge(mpu_ckpt *ck, const char *out_path, int all);

/* Options of mpu_ckpt_export. Start from MPU_CKPT_EXPORT_OPTIONS_INIT. */
typedef struct mpu_ckpt_export_options {
  size_t size;              /* sizeof(mpu_ckpt_export_options), set by the initializer */
  uint64_t max_shard_bytes; /* a shard's tensor bytes at most (a larger tensor gets a shard of
                               its own); 0: 5 GB (10^9 bytes a GB), transformers' default */
  int all;                  /* the optimizer's moments too, as mpu_ckpt_merge's all */
  int nnames;               /* a name map: tensor names[2k] is written as names[2k + 1]; */
  const char *const *names; /* tensors it does not name keep theirs */
} mpu_ckpt_export_options;

#define MPU_CKPT_EXPORT_OPTIONS_INIT {sizeof(mpu_ckpt_export_options), 0, 0, 0, NULL}

/*
 * Write the tensors of mpu_ckpt_merge whole into dir (created if absent) in
 * transformers' sharded layout (modeling_utils.save_pretrained): files
 * model-00001-of-0000N.safetensors, each holding whole tensors (in the
 * checkpoint's order, a new file whenever the next tensor would pass
 * max_shard_bytes), and model.safetensors.index.json with
 * {"metadata": {"total_size": bytes}, "weight_map": {name: file}}, which
 * transformers' from_pretrained / load_sharded_checkpoint read, and so does
 * mpu's python/mpu_dcp.py for torch.distributed.checkpoint.load. A name map
 * entry that names no tensor of the checkpoint, and two tensors given one
 * name, are errors. The old index is removed first and the new one written
 * last, so a directory with an index holds a whole export.
 */
MPU_API mpu_result_t mpu_ckpt_export(mpu_ckpt *ck, const char *dir,
                                     const mpu_ckpt_export_options *options);

#ifdef __cplusplus
}
#endif

#endif
