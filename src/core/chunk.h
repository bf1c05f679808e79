/*
 * chunk.h - how a length is cut into n equal pieces, torch.chunk's rule:
 * every piece is ceil(len / n) long except the last ones, which are short or
 * empty. DTensor's Shard(d) splits a dim this way; FSDP pads each bucket to
 * n pieces of that length so the equal-count collectives (all_gather,
 * reduce_scatter) can move it, ZeRO-1 moves the pieces as they are with the
 * uneven ones (all_gather_v, reduce_scatter_v).
 */
#ifndef MPU_CORE_CHUNK_H
#define MPU_CORE_CHUNK_H

#include <stddef.h>

/* Piece `i` of `n` of [0, len): [*lo, *hi); returns the padded piece length. */
static inline size_t mpu__chunk(size_t len, size_t n, size_t i, size_t *lo, size_t *hi) {
  size_t piece = n ? (len + n - 1) / n : 0;
  size_t a = i * piece < len ? i * piece : len;
  size_t z = a + piece < len ? a + piece : len;
  if (lo) *lo = a;
  if (hi) *hi = z;
  return piece;
}

#endif
