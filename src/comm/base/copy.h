/*
 * copy.h - moving bytes between ranks' buffers.
 */
#ifndef MPU_COMM_COPY_H
#define MPU_COMM_COPY_H

#include <stddef.h>

/* Calls moving at least this many bytes in all write with streaming
 * (non-temporal) stores: their output would not fit in cache anyway, and
 * streaming skips reading each destination line before overwriting it. */
#define MPU_STREAM_MIN_BYTES ((size_t)4 << 20)

/* memcpy, with streaming stores when `stream` is set and the CPU has them.
 * After streaming copies, call mpu__copy_fence() before telling another
 * thread the data is there. */
void mpu__copy(void *dst, const void *src, size_t bytes, int stream);
void mpu__copy_fence(void);

/* Copy src to each of dsts[0..ndst-1] (NULL entries are skipped), a slice at
 * a time so the source is read from memory once however many copies are
 * made. Fences by itself when streaming. */
void mpu__copy_to(void *const *dsts, int ndst, const void *src, size_t bytes, int stream);

#endif
