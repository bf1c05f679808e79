/*
 * ckpt_internal.h - what the checkpoint writer, reader and merge share: the
 * geometry of boxes and spans (one copy routine both ways), CRC-32, file
 * names and whole-buffer I/O.
 */
#ifndef MPU_CHECKPOINT_INTERNAL_H
#define MPU_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mpu/checkpoint.h"

#define CKPT_INDEX "index.json"
#define CKPT_FORMAT "mpu-checkpoint"
#define CKPT_VERSION 1

/* A stored piece: a global box, the span [flat_lo, flat_hi) of its elements
 * in row-major order, and their values (flat_hi - flat_lo floats). */
typedef struct ckpt_piece_view {
  int ndim;
  const int64_t *offset, *length;
  uint64_t flat_lo, flat_hi;
  float *data;
} ckpt_piece_view;

uint64_t mpu__ckpt_numel(int ndim, const int64_t *shape);

/* How many elements of box (in local coordinates) have a local row-major
 * index below x, for a local tensor of local_shape: the elements of a span
 * [lo, hi) of the local tensor that fall in the box are the box's elements
 * [count(lo), count(hi)) in the box's own row-major order. */
uint64_t mpu__ckpt_box_count_below(int ndim, const int64_t *local_shape, const mpu_ckpt_box *box,
                                   uint64_t x);

/* Copy between a piece and a local tensor (its boxes and spans) where they
 * overlap: to_local 1 copies piece -> spans, 0 spans -> piece. hits (may be
 * NULL), one byte per element of each span in order, counts the elements
 * written (saturating); data may be NULL to only count. Returns the number
 * of elements in the overlap. */
uint64_t mpu__ckpt_transfer(const ckpt_piece_view *piece, int ndim, const int64_t *local_shape,
                            const mpu_ckpt_box *boxes, int nboxes, const mpu_ckpt_span *spans,
                            int nspans, int to_local, uint8_t *const *hits);

uint32_t mpu__ckpt_crc32(uint32_t crc, const void *data, size_t n);

/* 0 if name is a valid tensor name (printable ASCII, no '"' '\\' or space). */
int mpu__ckpt_name_ok(const char *name);

int mpu__ckpt_kind_from_name(const char *name, mpu_ckpt_kind *out);

/* Write all of buf at fd; read exactly n bytes at offset (pread). 0 or -1 (errno). */
int mpu__ckpt_write_all(int fd, const void *buf, size_t n);
ssize_t mpu__ckpt_pread_all(int fd, void *buf, size_t n, uint64_t offset);

/* path = dir + "/" + name, checked for length; 0 or -1 */
int mpu__ckpt_path(char *out, size_t cap, const char *dir, const char *name);

/* Tensor i of ck (mpu_ckpt_tensor_at's order) whole into out (numel floats),
 * every piece's CRC-32 checked and every element found in exactly one piece. */
mpu_result_t mpu__ckpt_read_whole(mpu_ckpt *ck, int i, float *out);

/* The layout a save of world ranks records (layout.c): the set's, or, when
 * the set's is mpu_ckpt_set_init's and this thread's current state has world
 * ranks, the state's; refused unless tp x pp x cp x dp is world. */
mpu_result_t mpu__ckpt_layout_for_save(const mpu_ckpt_layout *given, int world,
                                       mpu_ckpt_layout *out);

/* Write data to path through path.tmp: write, fsync, rename, fsync dir. */
mpu_result_t mpu__ckpt_write_file(const char *dir, const char *name, const void *const *parts,
                                  const size_t *lens, int nparts);

#endif
