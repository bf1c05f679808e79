/*
 * io.c - the checkpoint's bytes: CRC-32 (IEEE 802.3, as zlib's crc32), whole
 * reads with pread, paths, and whole files written through a synced
 * temporary and a rename.
 */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "checkpoint/ckpt_internal.h"
#include "core/error.h"
#include "core/files.h"

uint32_t mpu__ckpt_crc32(uint32_t crc, const void *data, size_t n) {
  static uint32_t table[256];
  static int ready; /* idempotent: racing threads write the same values */
  if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      __atomic_store_n(&table[i], c, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
  }
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++)
    crc = __atomic_load_n(&table[(crc ^ p[i]) & 0xFF], __ATOMIC_RELAXED) ^ (crc >> 8);
  return ~crc;
}

ssize_t mpu__ckpt_pread_all(int fd, void *buf, size_t n, uint64_t offset) {
  char *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, p + got, n - got, (off_t)(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

int mpu__ckpt_path(char *out, size_t cap, const char *dir, const char *name) {
  int n = snprintf(out, cap, "%s/%s", dir, name);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

mpu_result_t mpu__ckpt_write_file(const char *dir, const char *name, const void *const *parts,
                                  const size_t *lens, int nparts) {
  char path[4096];
  if (mpu__ckpt_path(path, sizeof path, dir, name))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint: the path %s/%s is too long", dir, name);
  return mpu__output_write("checkpoint", path, parts, lens, nparts, NULL, 0);
}
