/*
 * copy.h - moving bytes between ranks' buffers.
 */
#ifndef MPU_COMM_COPY_H
#define MPU_COMM_COPY_H

#include <stddef.h>

/* Calls touching at least this many bytes in all (everything read and
 * written) write with streaming (non-temporal) stores: their output would not
 * stay in cache anyway, and
 * streaming skips reading each destination line before overwriting it.
 * Below it, outputs stay in cache for whoever reads them next. It is 3/4 of
 * the last-level cache, as glibc's memcpy chooses its non-temporal threshold
 * (MPU_STREAM_MIN_BYTES overrides it); read once. */
size_t mpu__stream_min_bytes(void);

/* The threshold for a last-level cache of llc bytes (0: unknown) shared by
 * `sharing` CPUs (0: unknown): 3/4 of it, the cache counted at most 24 MiB
 * per sharing CPU (a virtual machine may report its host's whole cache). */
size_t mpu__stream_threshold(size_t llc, int sharing);

/* The CPUs a sysfs cpu list names ("0-1", "0-3,8-11"); 0 if unparsable. */
int mpu__cpulist_count(const char *list);

/* Whether work touching `footprint` bytes (read + written) should stream. */
static inline int mpu__streams(size_t footprint) { return footprint >= mpu__stream_min_bytes(); }

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
