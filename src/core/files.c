/*
 * files.c - inputs opened without blocking and refused unless regular;
 * outputs that are regular files, never an input, written through a
 * temporary name and renamed (files.h has the rule).
 */
#include "core/files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
  return S_ISDIR(m)    ? "a directory"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "not a regular file";
}

mpu__file_id mpu__file_id_of(const struct stat *st) {
  mpu__file_id id = {st->st_dev, st->st_ino};
  return id;
}

mpu_result_t mpu__input_open(const char *fn, const char *what, const char *path, int *fd,
                             struct stat *out) {
  *fd = -1;
  int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f < 0)
    return mpu__error(errno == ENOENT ? MPU_ERR_INVALID_ARGUMENT : MPU_ERR_SYSTEM,
                      "%s: cannot open %s %s: %s", fn, what, path, strerror(errno));
  struct stat st;
  if (fstat(f, &st)) {
    int e = errno;
    close(f);
    return mpu__error(MPU_ERR_SYSTEM, "%s: cannot stat %s %s: %s", fn, what, path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(f);
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s %s is %s, not a regular file", fn, what,
                      path, kind_of(st.st_mode));
  }
  *fd = f;
  if (out) *out = st;
  return MPU_SUCCESS;
}

/* path's directory ("." for a bare name) into dir */
static int dir_of(const char *path, char *dir, size_t cap) {
  const char *slash = strrchr(path, '/');
  int n = !slash ? snprintf(dir, cap, ".")
                 : snprintf(dir, cap, "%.*s", (int)(slash == path ? 1 : slash - path), path);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static int is_input(const struct stat *st, const mpu__file_id *inputs, int ninputs) {
  for (int i = 0; i < ninputs; i++)
    if (inputs[i].dev == st->st_dev && inputs[i].ino == st->st_ino) return 1;
  return 0;
}

mpu_result_t mpu__output_check(const char *fn, const char *path, const mpu__file_id *inputs,
                               int ninputs) {
  if (!path || !*path) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: an empty output path", fn);
  char dir[4096];
  if (dir_of(path, dir, sizeof dir))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the output path %s is too long", fn, path);
  struct stat st;
  if (!stat(path, &st)) {
    if (!S_ISREG(st.st_mode))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: output %s is %s; mpu writes only regular files", fn, path,
                        kind_of(st.st_mode));
    if (is_input(&st, inputs, ninputs))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: output %s is one of the files this command reads", fn, path);
  } else if (errno != ENOENT) {
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: output %s: %s", fn, path, strerror(errno));
  }
  if (stat(dir, &st) || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: output %s: its directory %s %s", fn, path,
                      dir, errno == ENOENT ? "does not exist" : "is not a writable directory");
  return MPU_SUCCESS;
}

/* A new PATH.tmp, never through a link: a regular leftover of a write that
 * died is replaced, anything else refused. */
static mpu_result_t create_tmp(const char *fn, const char *tmp, const mpu__file_id *inputs,
                               int ninputs, int *fd) {
  for (int tries = 0; tries < 2; tries++) {
    *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (*fd >= 0) return MPU_SUCCESS;
    if (errno != EEXIST) break;
    struct stat st;
    if (lstat(tmp, &st) || !S_ISREG(st.st_mode) || is_input(&st, inputs, ninputs))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: %s exists and is not a leftover temporary file; remove it", fn, tmp);
    if (unlink(tmp) && errno != ENOENT) break;
  }
  return mpu__error(MPU_ERR_SYSTEM, "%s: cannot create %s: %s", fn, tmp, strerror(errno));
}

int mpu__dir_sync(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int bad = fsync(fd) && errno != EINVAL;
  int e = errno;
  close(fd);
  errno = e;
  return bad ? -1 : 0;
}

mpu_result_t mpu__output_write(const char *fn, const char *path, const void *const *parts,
                               const size_t *lens, int nparts, const mpu__file_id *inputs,
                               int ninputs) {
  MPU_CHECK(mpu__output_check(fn, path, inputs, ninputs));
  char tmp[4096 + 8], dir[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp || dir_of(path, dir, sizeof dir))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the output path %s is too long", fn, path);
  int fd;
  MPU_CHECK(create_tmp(fn, tmp, inputs, ninputs, &fd));
  int bad = 0, e = 0;
  for (int i = 0; i < nparts && !bad; i++) {
    const char *p = parts[i];
    size_t n = lens[i];
    while (n && !bad) {
      ssize_t w = write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) bad = 1, e = w < 0 ? errno : ENOSPC;
      else p += w, n -= (size_t)w;
    }
  }
  if (!bad && fsync(fd)) bad = 1, e = errno;
  if (close(fd) && !bad) bad = 1, e = errno;
  if (bad) {
    unlink(tmp);
    return mpu__error(MPU_ERR_SYSTEM, "%s: cannot write %s: %s", fn, path, strerror(e));
  }
  /* again: the output may have been replaced while the data was written */
  mpu_result_t r = mpu__output_check(fn, path, inputs, ninputs);
  if (!r && rename(tmp, path))
    r = mpu__error(MPU_ERR_SYSTEM, "%s: cannot write %s: %s", fn, path, strerror(errno));
  if (r) {
    unlink(tmp);
    return r;
  }
  mpu__dir_sync(dir); /* the rename itself made durable; the file is whole either way */
  return MPU_SUCCESS;
}
