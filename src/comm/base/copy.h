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

/* Whether a task that reads `reads` bytes and writes `writes` bytes on one
 * core, the same inputs call after call, in a call touching `footprint`
 * bytes in all, streams its writes: when the call does (threshold), or when
 * its reads fit the core's level-2 cache of l2 bytes (0: unknown), its
 * reads and writes together do not, and it writes no more than it reads:
 * its cached writes would then evict the inputs it reads again, and
 * streaming them costs no more memory traffic than it saves. Measured on
 * one machine (an all_to_all of 2 MiB on 2 ranks of a Xeon with 2 MiB of
 * L2: 118-119 us a call streamed, 141 cached; 1 and 4 MiB are faster
 * cached; an in-place all_gather of 2 MiB in all, 256 KiB a rank, on 8
 * ranks, which writes 7 times what it reads, is faster cached:
 * docs/bench.md); a reader of the outputs right after the call would find
 * streamed ones in memory, cached ones partly in the last-level cache. */
int mpu__stream_rule(size_t footprint, size_t reads, size_t writes, size_t threshold, size_t l2);

/* The level-2 cache per core that mpu__streams_task uses: 0 where unknown
 * or MPU_STREAM_MIN_BYTES is set. */
size_t mpu__stream_l2_bytes(void);

/* mpu__stream_rule with this machine's threshold and level-2 cache per core
 * (MPU_STREAM_MIN_BYTES, where set, is the whole rule). */
int mpu__streams_task(size_t footprint, size_t reads, size_t writes);

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
