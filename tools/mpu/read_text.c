/*
 * read_text.c - a bounded read of a file the user names: opened by the
 * library's rule for inputs (without blocking, a regular file only), every
 * read checked.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "read_text.h"

#include "core/files.h"

mpu_result_t cli_read_text(const char *option, const char *path, size_t max, unsigned char **out,
                           size_t *n) {
  *out = NULL, *n = 0;
  int fd;
  if (mpu__input_open("mpu", option, path, &fd, NULL)) { /* the library's rule for inputs */
    char why[1024];
    snprintf(why, sizeof why, "%s", mpu_last_error() + strlen("mpu: "));
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "%s", why);
  }
  unsigned char *buf = malloc(max ? max : 1);
  if (!buf) {
    close(fd);
    return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", option, max);
  }
  size_t got = 0;
  while (got < max) {
    ssize_t k = read(fd, buf + got, max - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      close(fd);
      free(buf);
      return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "cannot read %s %s: %s", option, path,
                      strerror(e));
    }
    if (k == 0) break;
    got += (size_t)k;
  }
  close(fd);
  *out = buf, *n = got;
  return MPU_SUCCESS;
}
