/*
 * read_text.c - a bounded read of a file the user names: open without
 * blocking (a FIFO with no writer would block open itself), refuse what is
 * not a regular file, check every read.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "read_text.h"

static const char *kind_of(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

mpu_result_t cli_read_text(const char *option, const char *path, size_t max, unsigned char **out,
                           size_t *n) {
  *out = NULL, *n = 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "cannot open %s %s: %s", option, path,
                              strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    int e = errno;
    close(fd);
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "cannot stat %s %s: %s", option, path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "%s %s is %s, not a regular file", option, path,
                    kind_of(st.st_mode));
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
