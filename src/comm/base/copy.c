/*
 * copy.c - memcpy with optional streaming stores (x86-64: SSE2 movntdq).
 *
 * Streaming stores write around the cache: for large collectives whose
 * output is bigger than the cache, this saves the read-for-ownership of each
 * destination line, a third of the memory traffic of a copy.
 */
#include "comm/base/copy.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/env.h"

static size_t stream_min, stream_l2; /* stream_l2: 0 where unknown or MPU_STREAM_MIN_BYTES is set */
static pthread_once_t stream_once = PTHREAD_ONCE_INIT;

/* The CPUs a sysfs cpu list names ("0-1", "0-3,8-11", "5"); 0 where it
 * cannot be parsed. */
int mpu__cpulist_count(const char *list) {
  int count = 0;
  const char *p = list;
  while (*p && *p != '\n') {
    char *end;
    long lo = strtol(p, &end, 10), hi = lo;
    if (end == p || lo < 0) return 0;
    p = end;
    if (*p == '-') {
      hi = strtol(p + 1, &end, 10);
      if (end == p + 1 || hi < lo) return 0;
      p = end;
    }
    if (hi - lo >= INT_MAX - count) return 0;
    count += (int)(hi - lo + 1);
    if (*p == ',') p++;
    else if (*p && *p != '\n') return 0;
  }
  return count;
}

/* Cache `index` of CPU 0 as sysfs gives it: its size in bytes (0: none),
 * its level (*level) and how many CPUs share it (*sharing; 0: unknown). */
static long sysfs_cache(int index, int *level, int *sharing) {
  char path[80], unit = 0, list[256];
  *level = 0, *sharing = 0;
  snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
  FILE *f = fopen(path, "r");
  long k = 0;
  int got = f ? fscanf(f, "%ld%c", &k, &unit) : 0;
  if (f) fclose(f);
  if (got < 1 || k <= 0) return 0;
  snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
  if ((f = fopen(path, "r"))) {
    if (fscanf(f, "%d", level) != 1) *level = 0;
    fclose(f);
  }
  snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/shared_cpu_list", index);
  if ((f = fopen(path, "r"))) {
    if (fgets(list, sizeof list, f)) *sharing = mpu__cpulist_count(list);
    fclose(f);
  }
  if (k > LONG_MAX >> 20) return 0;
  return unit == 'M' ? k << 20 : unit == 'K' ? k << 10 : k;
}

/* The last-level cache one CPU sees: sysfs gives the instance this CPU
 * shares (sysconf can report the whole package's on AMD: 384 MiB where one
 * CCX has 32) and how many CPUs share it (*sharing; 0: unknown), then
 * sysconf, 0 if neither knows. */
static long llc_bytes(int *sharing) {
  for (int index = 3; index >= 2; index--) {
    int level;
    long v = sysfs_cache(index, &level, sharing);
    if (v > 0) return v;
  }
  *sharing = 0;
  long v = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return v > 0 ? v : 0;
}

/* The level-2 cache one core has to itself: sysfs's level-2 cache over the
 * CPUs that share it, else sysconf's; 0 if neither knows. */
static size_t l2_bytes(void) {
  for (int index = 0; index < 8; index++) {
    int level, sharing;
    long v = sysfs_cache(index, &level, &sharing);
    if (v > 0 && level == 2) return (size_t)v / (size_t)(sharing > 0 ? sharing : 1);
  }
  long v = 0;
#ifdef _SC_LEVEL2_CACHE_SIZE
  v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return v > 0 ? (size_t)v : 0;
}

/* More last-level cache per CPU than any processor has (AMD's 3D V-cache
 * parts: 96 MiB per 8 cores, 12 each). A virtual machine may report its
 * host's whole cache as shared by its own few CPUs: a 2-CPU VM of an Intel
 * Xeon says 480 MiB, so nothing streamed, while there streaming paid from
 * about 48 MiB of buffers (docs/bench.md). */
#define LLC_PER_CPU_MAX ((size_t)24 << 20)

size_t mpu__stream_threshold(size_t llc, int sharing) {
  if (!llc) return (size_t)8 << 20; /* unknown cache: 8 MiB */
  if (sharing > 0 && llc / (size_t)sharing > LLC_PER_CPU_MAX) llc = LLC_PER_CPU_MAX * (size_t)sharing;
  return llc / 4 * 3;
}

static void stream_init(void) {
  long forced = mpu__env()->stream_min;
  if (forced >= 0) {
    stream_min = (size_t)forced;
    return;
  }
  int sharing;
  long llc = llc_bytes(&sharing);
  stream_min = mpu__stream_threshold(llc > 0 ? (size_t)llc : 0, sharing);
  stream_l2 = l2_bytes();
}

size_t mpu__stream_min_bytes(void) {
  pthread_once(&stream_once, stream_init);
  return stream_min;
}

int mpu__stream_rule(size_t footprint, size_t reads, size_t writes, size_t threshold, size_t l2) {
  if (footprint >= threshold) return 1;
  /* what streaming saves is the reads' trip back from the last-level cache;
   * what it costs is every write going to memory: it pays for writes no
   * larger than the reads */
  return l2 && reads <= l2 && writes > l2 - reads && writes <= reads;
}

size_t mpu__stream_l2_bytes(void) {
  pthread_once(&stream_once, stream_init);
  return stream_l2;
}

int mpu__streams_task(size_t footprint, size_t reads, size_t writes) {
  pthread_once(&stream_once, stream_init);
  return mpu__stream_rule(footprint, reads, writes, stream_min, stream_l2);
}

/* Small enough to stay in L1/L2 between the copies of one slice. */
#define SLICE ((size_t)16 << 10)

void mpu__copy_to(void *const *dsts, int ndst, const void *src, size_t bytes, int stream) {
  for (size_t off = 0; off < bytes; off += SLICE) {
    size_t len = bytes - off < SLICE ? bytes - off : SLICE;
    for (int d = 0; d < ndst; d++)
      if (dsts[d]) mpu__copy((char *)dsts[d] + off, (const char *)src + off, len, stream);
  }
  if (stream) mpu__copy_fence();
}

#if defined(__x86_64__)
#include <emmintrin.h>

void mpu__copy(void *dst, const void *src, size_t bytes, int stream) {
  if (!bytes) return; /* a zero-element buffer may be NULL: memcpy may not see it */
  if (!stream || bytes < 256) {
    memcpy(dst, src, bytes);
    return;
  }
  char *d = dst;
  const char *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  size_t body = bytes & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
    _mm_stream_si128((__m128i *)(d + i), a);
    _mm_stream_si128((__m128i *)(d + i + 16), b);
    _mm_stream_si128((__m128i *)(d + i + 32), c);
    _mm_stream_si128((__m128i *)(d + i + 48), e);
  }
  memcpy(d + body, s + body, bytes - body);
}

void mpu__copy_fence(void) { _mm_sfence(); }

#else

void mpu__copy(void *dst, const void *src, size_t bytes, int stream) {
  (void)stream;
  if (bytes) memcpy(dst, src, bytes); /* a zero-element buffer may be NULL */
}

void mpu__copy_fence(void) {}

#endif
