/*
 * copy.c - memcpy with optional streaming stores (x86-64: SSE2 movntdq).
 *
 * Streaming stores write around the cache: for large collectives whose
 * output is bigger than the cache, this saves the read-for-ownership of each
 * destination line, a third of the memory traffic of a copy.
 */
#include "comm/base/copy.h"

#include <stdint.h>
#include <string.h>

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
  memcpy(dst, src, bytes);
}

void mpu__copy_fence(void) {}

#endif
