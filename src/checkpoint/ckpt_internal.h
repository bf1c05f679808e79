/*
 * ckpt_internal.h - what the checkpoint writer, reader and merge share:
 * pieces (whose geometry is mpu/shard.h's), the checks of what a
 * checkpoint may say (names.c), CRC-32, file names and whole-buffer I/O
 * (io.c), the root's folders (root.c).
 */
#ifndef MPU_CHECKPOINT_INTERNAL_H
#define MPU_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/files.h"
#include "mpu/checkpoint.h"
#include "mpu/shard.h"

#define CKPT_INDEX "index.json"
#define CKPT_FORMAT "mpu-checkpoint"
#define CKPT_VERSION 1
#define CKPT_SIZE_MAX (1 << 24) /* the most of any layout size (tp, pp, vp, dp, cp, ep) */
#define CKPT_TRACKER "latest_checkpointed_iteration.txt" /* Megatron-LM's name */
#define CKPT_ITER_PREFIX "iter_"
#define CKPT_STAGE_SUFFIX ".tmp" /* iter_0000100.tmp: a save in progress */

/* A stored piece: a global box, the span [flat_lo, flat_hi) of its elements
 * in row-major order, and their values (mpu/shard.h moves them). */
typedef mpu_shard_piece ckpt_piece_view;

/* The product of the sizes; UINT64_MAX when it overflows or a size is negative. */
static inline uint64_t mpu__ckpt_numel(int ndim, const int64_t *shape) {
  size_t n = mpu_shard_numel(ndim, shape);
  return n == SIZE_MAX ? UINT64_MAX : (uint64_t)n;
}

/* Whether the stored spans of pieces[0, npieces) (each inside a tensor of
 * shape, their sizes summing to its element count) hold every element once:
 * on success *first = *second = -1 if they do, else two pieces that overlap. */
mpu_result_t mpu__ckpt_tiles(int ndim, const int64_t *shape, const ckpt_piece_view *pieces,
                             int npieces, int *first, int *second);

/* A tensor of a set (mpu/checkpoint.h's mpu_ckpt_tensor): a shard's
 * global shape, local shape and boxes, and the memory of what the rank loads
 * and saves. */
struct mpu_ckpt_tensor {
  char name[MPU_CKPT_NAME_MAX];
  mpu_ckpt_kind kind;
  int ndim;
  int64_t shape[MPU_CKPT_MAX_DIMS];        /* global */
  int64_t local_shape[MPU_CKPT_MAX_DIMS];
  int nboxes;
  mpu_shard_box boxes[MPU_CKPT_MAX_BOXES];
  int nspans;                              /* what this rank loads */
  mpu_shard_mem *spans;
  int nsave;                               /* what this rank writes: one rank writes each element */
  mpu_shard_mem *save;
};

/* ---- names.c: what a checkpoint may name and record ---- */

/* A metadata pair as mpu_ckpt_set_meta takes it: key a valid name, both
 * NUL-terminated within their cap and under 64 bytes, the value printable
 * ASCII; else MPU_ERR_INVALID_ARGUMENT naming fn. */
mpu_result_t mpu__ckpt_meta_check(const char *fn, const char *key, size_t key_cap,
                                  const char *value, size_t value_cap);

/* The sizes a layout may record, for save and load alike: world, tp, pp, dp,
 * cp and ep 1 to CKPT_SIZE_MAX, vp 0 (no virtual stages) to CKPT_SIZE_MAX.
 * MPU_SUCCESS, or MPU_ERR_INVALID_ARGUMENT naming fn and the size. */
mpu_result_t mpu__ckpt_layout_check(const char *fn, const mpu_ckpt_layout *l);

/* The optimizer entry of an index, for save and load alike: its six numbers
 * finite (JSON holds no NaN or infinity); else MPU_ERR_INVALID_ARGUMENT
 * naming fn and the number. Their ranges are the optimizer's rule, checked
 * where an optimizer is made from them: the index records what the saver's
 * optimizer was given. */
mpu_result_t mpu__ckpt_adamw_numbers(const char *fn, const mpu_adamw_options *o);

/* 0 if name is a valid tensor name (printable ASCII, no '"' '\\' or space). */
int mpu__ckpt_name_ok(const char *name);

int mpu__ckpt_kind_from_name(const char *name, mpu_ckpt_kind *out);

/* The files ck was opened from (its index, every file it names, and the
 * tracker of a root), which
 * no output of a tool reading ck may replace (core/files.h). */
void mpu__ckpt_inputs(const mpu_ckpt *ck, const mpu__file_id **ids, int *n);

/* Tensor i of ck (mpu_ckpt_tensor_at's order) whole into out (numel floats),
 * every piece's CRC-32 checked and every element found in exactly one piece. */
mpu_result_t mpu__ckpt_read_whole(mpu_ckpt *ck, int i, float *out);

/* The layout a save of world ranks records (layout.c): the set's, or, when
 * the set's is mpu_ckpt_set_init's and this thread's current state has world
 * ranks, the state's; refused unless tp x pp x cp x dp is world. */
mpu_result_t mpu__ckpt_layout_for_save(const mpu_ckpt_layout *given, int world,
                                       mpu_ckpt_layout *out);

/* ---- io.c: CRC-32 and files ---- */

/* CRC-32 (IEEE 802.3, zlib's crc32) of n bytes, continuing crc (0 to start). */
uint32_t mpu__ckpt_crc32(uint32_t crc, const void *data, size_t n);

/* Read exactly n bytes at offset (pread): the count read, or -1 (errno). */
ssize_t mpu__ckpt_pread_all(int fd, void *buf, size_t n, uint64_t offset);

/* path = dir + "/" + name, checked for length; 0 or -1 */
int mpu__ckpt_path(char *out, size_t cap, const char *dir, const char *name);

/* Write data to path through path.tmp: write, fsync, rename, fsync dir. */
mpu_result_t mpu__ckpt_write_file(const char *dir, const char *name, const void *const *parts,
                                  const size_t *lens, int nparts);

/* ---- a checkpoint root (root.c) ---- */

/* "iter_%07d" + suffix; 0 or -1 if it does not fit */
int mpu__ckpt_iter_name(char *out, size_t cap, int64_t iteration, const char *suffix);

/* Rank 0 of a save: create root (if absent), lock it against other saves
 * (*lock: held until mpu__ckpt_unlock; refused if another save holds it),
 * remove what killed saves left, and create the empty folder stage where
 * the ranks write. */
mpu_result_t mpu__ckpt_stage(const char *root, const char *stage, int *lock);
/* Release what mpu__ckpt_stage locked (nothing if *lock is -1). */
void mpu__ckpt_unlock(int *lock);

/* Rank 0, after every file and the index are in stage: rename it to
 * root/iter_N, sync root, replace the tracker. Before the rename root is as
 * it was; after it iteration N is complete (the tracker may still name the
 * one before). */
mpu_result_t mpu__ckpt_publish(const char *root, const char *stage, int64_t iteration);

/* Remove a stage folder and its files (a save that failed); best effort. */
void mpu__ckpt_discard(const char *stage);

#endif
