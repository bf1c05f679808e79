/*
 * mpu/checkpoint.h - distributed checkpoints that survive a change of layout,
 * as Megatron core's dist_checkpointing and torch.distributed.checkpoint:
 * every rank writes the pieces it holds of each global tensor into one
 * safetensors file, rank 0 writes an index (index.json) that says where
 * every piece of every global tensor is, and any layout loads it back, each
 * rank reading only the pieces it needs (docs/checkpoint.md has the format).
 *
 * A rank's state is a set of sharded tensors, each a shard of mpu/shard.h
 * (global name and shape, the local tensor as boxes of the global one, the
 * spans of it the rank keeps) with the memory of those spans. Their holders
 * describe them (mpu_param_buffer_describe for a buffer and its plain or
 * ZeRO-1 optimizer, mpu_fsdp_describe for a sharded buffer) and the set
 * takes any such list (mpu_ckpt_add_shards): the checkpoint knows no
 * strategy. A piece that is a box of the global tensor (whole rows of
 * it) is stored as that box, as DCP's chunks are.
 *
 * Saving is collective over the world and goes into a checkpoint root, one
 * folder per iteration as Megatron-LM's (root/iter_0000100/ and the tracker
 * root/latest_checkpointed_iteration.txt): the folder is written under a
 * temporary name, every file and the folder synced, the index last, then
 * renamed into place, and the tracker replaced last of all. A save killed at
 * any byte, or one that runs out of disk, leaves every earlier iteration as
 * it was, and the new one complete or ignored. Loading reads each needed piece once with pread, checks its CRC-32, copies
 * its overlap with every box and span of the rank, and changes nothing in
 * the caller's memory unless every rank loaded everything.
 */
#ifndef MPU_CHECKPOINT_H
#define MPU_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/comm.h"
#include "mpu/fsdp.h"
#include "mpu/shard.h"
#include "mpu/state.h"
#include "mpu/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPU_CKPT_MAX_DIMS MPU_SHARD_MAX_DIMS
#define MPU_CKPT_MAX_BOXES MPU_SHARD_MAX_BOXES /* a stride up to 8 */
#define MPU_CKPT_NAME_MAX 128  /* printable ASCII, no '"' or '\\' */
#define MPU_CKPT_META_MAX 32

/* mpu/shard.h's box and span in memory under their old names. Kept for one
 * release; mpu_shard_box and mpu_shard_mem instead. */
typedef mpu_shard_box mpu_ckpt_box;
typedef mpu_shard_mem mpu_ckpt_span;

/* What a tensor is, for the tools (mpu ckpt merge writes parameters only
 * unless asked for everything). */
typedef enum mpu_ckpt_kind {
  MPU_CKPT_PARAM = MPU_SHARD_PARAM,          /* a model parameter (its float32 main weight) */
  MPU_CKPT_EXP_AVG = MPU_SHARD_EXP_AVG,      /* AdamW's first moment */
  MPU_CKPT_EXP_AVG_SQ = MPU_SHARD_EXP_AVG_SQ /* AdamW's second moment */
} mpu_ckpt_kind;

/* "param", "exp_avg", "exp_avg_sq" (the index's names); "?" for another value */
MPU_API const char *mpu_ckpt_kind_name(mpu_ckpt_kind kind);

/* A tensor of a set, as mpu_ckpt_add_shards (or mpu_ckpt_add) took it: its
 * shard's fields and memory. Private to the checkpoint: what a rank holds is
 * said by the shards it was given (mpu/shard.h). */
typedef struct mpu_ckpt_tensor mpu_ckpt_tensor;

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
  mpu_ckpt_tensor *t;                /* private (the tensors added) */
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
  int nwritten;                      /* the holders mpu_ckpt_add_shards added, told after a */
  struct mpu_shard_written *written; /* load wrote their memory (FSDP reshards its buckets) */
} mpu_ckpt_set;

MPU_API void mpu_ckpt_set_init(mpu_ckpt_set *set);
MPU_API void mpu_ckpt_set_free(mpu_ckpt_set *set);
MPU_API mpu_result_t mpu_ckpt_set_meta(mpu_ckpt_set *set, const char *key, const char *value);

/*
 * Add a tensor from the fields of a shard (mpu/shard.h): its global shape,
 * local shape and boxes (copied), the memory of what the rank loads (spans)
 * and writes (save), copied; the memory stays the caller's. A local tensor
 * of size 0 (a rank that holds none of it, as an empty DTensor piece) has
 * boxes of size 0 and no spans. mpu_ckpt_add_shards calls it for every
 * tensor of a list; kept for one release as a call of its own (describe the
 * shards and add them instead).
 */
MPU_API mpu_result_t mpu_ckpt_add(mpu_ckpt_set *set, const char *name, mpu_ckpt_kind kind, int ndim,
                                  const int64_t *shape, const int64_t *local_shape,
                                  const mpu_shard_box *boxes, int nboxes, const mpu_shard_mem *spans,
                                  int nspans, const mpu_shard_mem *save, int nsave);

/* mpu_shard_megatron's boxes for a parameter of those attributes (a
 * duplicate holds the whole tensor in one box). Kept for one release;
 * mpu_shard_megatron instead. */
MPU_API mpu_result_t mpu_ckpt_partition(int ndim, const int64_t *shape, mpu_param_attrs attrs,
                                        int tp_size, int tp_rank, int64_t *local_shape,
                                        mpu_shard_box *boxes, int *nboxes);

/*
 * Add every tensor of a list of shards (mpu/shard.h) that their holder
 * described: its boxes, the memory of what the rank keeps (loaded), and the
 * same saved if the rank is its writer. The holders that asked to be told
 * (mpu_shard_list_on_write) are, after a load that wrote their memory: a
 * sharded buffer (mpu_fsdp_describe) then reshards every bucket, so the next
 * unshard gathers what the load put there. The memory stays the holder's.
 */
MPU_API mpu_result_t mpu_ckpt_add_shards(mpu_ckpt_set *set, const mpu_shard_list *l);

/* mpu/shard.h's global name and shape under its old name. Kept for one
 * release; mpu_shard_global instead. */
typedef mpu_shard_global mpu_ckpt_global;

/*
 * mpu_param_buffer_describe then mpu_ckpt_add_shards, as one call: every
 * parameter of a buffer (globals[i] for parameter i) and, with opt, its
 * AdamW moments. Kept for one release; describe and add instead.
 */
MPU_API mpu_result_t mpu_ckpt_add_buffer(mpu_ckpt_set *set, const mpu_param_buffer *b,
                                         const mpu_shard_global *globals, const mpu_optimizer *opt,
                                         int tp_size, int dp_rank);

/* mpu_fsdp_describe then mpu_ckpt_add_shards, as one call. Kept for one
 * release; describe and add instead. */
MPU_API mpu_result_t mpu_ckpt_add_fsdp(mpu_ckpt_set *set, mpu_fsdp *f,
                                       const mpu_shard_global *globals, int tp_size);

/* The global layers of model chunk `chunk` of pipeline rank pp_rank, with
 * pp x vp virtual stages of layers / (pp x vp) layers each (Megatron's
 * interleaved assignment: virtual stage chunk x pp + pp_rank). pp x vp is
 * computed in 64 bits: any product that does not divide layers is
 * MPU_ERR_INVALID_ARGUMENT. */
MPU_API mpu_result_t mpu_ckpt_chunk_layers(int layers, int pp, int vp, int pp_rank, int chunk,
                                           int *first, int *count);

/*
 * Save the set of every rank of world as iteration set->step of the
 * checkpoint root dir (created if absent; the same path on every rank):
 * dir/iter_<step, 7 digits>/ holds index.json and one rankNNNNN.safetensors
 * per rank, and dir/latest_checkpointed_iteration.txt names the iteration
 * (Megatron-LM's layout). The folder is built as dir/iter_<step>.tmp and
 * renamed into place when every file and the index are synced; a step saved
 * before is swapped with the new folder in one rename (Linux's
 * RENAME_EXCHANGE; MPU_ERR_UNSUPPORTED where the file system has none).
 * One save into a root at a time: rank 0 locks the root (flock) for the
 * save, and a save into a root another save holds is refused
 * (MPU_ERR_INVALID_USAGE, nothing written). Folders *.tmp that killed saves
 * left are then removed (never through a link).
 *
 * Refused on every rank before anything is written (MPU_ERR_INVALID_ARGUMENT
 * on the rank whose set is wrong, MPU_ERR_ABORTED naming it on the others):
 * what the loader would refuse, a layout whose tp x pp x cp x dp is not
 * world's size (left as mpu_ckpt_set_init made it, the layout is taken from
 * this thread's current state when that has as many ranks; see
 * mpu_ckpt_layout_from_state), a negative step or optimizer step, AdamW
 * numbers an index cannot hold (a NaN or infinite lr or clip; their ranges
 * are the optimizer's to check when it is made from them), layout sizes outside
 * 1..2^24 (vp 0..2^24), a flavor without its NUL, n_meta outside 0..MPU_CKPT_META_MAX, a
 * metadata pair or random stream name that mpu_ckpt_set_meta would refuse or
 * that comes twice, and ranks saving different steps (MPU_ERR_MISMATCH).
 * A save that fails later (a full disk: MPU_ERR_SYSTEM naming the file and
 * the reason on the rank that met it) removes its folder; the root then
 * means what it meant before.
 */
MPU_API mpu_result_t mpu_ckpt_save(const char *dir, mpu_comm *world, const mpu_ckpt_set *set);

/*
 * The folder mpu_ckpt_open(dir) reads, into path (cap bytes): the iteration
 * named by dir/latest_checkpointed_iteration.txt if its folder holds an
 * index; else (no tracker, not a number, or its folder incomplete) the
 * highest iteration folder iter_<digits> holding one; else dir itself (one
 * iteration folder given directly, or a checkpoint saved before roots, with
 * index.json in dir). Fails only on NULL arguments or a path over cap.
 */
MPU_API mpu_result_t mpu_ckpt_latest(const char *dir, char *path, size_t cap);

/* ---- reading -------------------------------------------------------------------------- */

typedef struct mpu_ckpt mpu_ckpt;

/* Open a checkpoint (dir: a root, whose newest complete iteration is opened
 * as mpu_ckpt_latest says, or one folder with an index): read and check its
 * index (a regular file; a FIFO is refused, not waited on), every number in
 * it against its range, that the pieces of each tensor hold each of its
 * elements exactly once (pieces that overlap are refused even where their
 * sizes add up), and that every file it names is a regular file of the size
 * it says. */
MPU_API mpu_result_t mpu_ckpt_open(const char *dir, mpu_ckpt **out);
MPU_API void mpu_ckpt_free(mpu_ckpt *ck);
/* The name of mpu 0.2, kept for one release. */
MPU_API void mpu_ckpt_close(mpu_ckpt *ck) MPU_DEPRECATED("use mpu_ckpt_free");

/* Read every piece and check its CRC-32 (what `mpu ckpt inspect` does). */
MPU_API mpu_result_t mpu_ckpt_verify(mpu_ckpt *ck);

/*
 * Load the set's tensors from ck: every tensor of the set must be in the
 * checkpoint with its global shape (and, strict, every tensor of the
 * checkpoint in the set). Each rank reads the pieces that overlap what it
 * loads; with world (NULL: this rank alone) the ranks agree, and the
 * caller's memory is written only if every rank read everything (a rank
 * that could not open the checkpoint calls it with ck NULL, so that the
 * others do not wait for it, and every rank fails). Ranks that opened
 * different checkpoints (another step, or another index: its size and
 * CRC-32 are compared) fail with MPU_ERR_MISMATCH, nothing changed. Also sets
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
 * read it. out_path must be absent or a regular file, and none of the
 * checkpoint's own files nor the root's tracker that chose its folder
 * (compared by device and inode, so not through a link either): anything
 * else is MPU_ERR_INVALID_ARGUMENT before any work.
 * Written to out_path.tmp, synced and renamed, so a failure leaves
 * out_path as it was. */
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
