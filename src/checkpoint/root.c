/*
 * root.c - a checkpoint root: one folder per saved iteration and a tracker
 * written last, as Megatron-LM (megatron/training/checkpointing.py:
 * iter_0000100/, latest_checkpointed_iteration.txt). A save builds its
 * folder under a temporary name (iter_0000100.tmp), every file fsync'd and
 * the index last, renames it into place, syncs the root, then replaces the
 * tracker (temporary name, fsync, rename, sync). A process killed at any
 * byte, or a disk that fills, leaves every earlier iteration as it was and
 * the new one either complete or ignored.
 *
 * Which folder a root means (mpu_ckpt_latest): the tracker's iteration if
 * its folder holds an index; else the highest iteration folder that holds
 * one; else the root itself (a folder saved before roots, or one iteration
 * folder given directly).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "checkpoint/ckpt_internal.h"
#include "core/error.h"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1) /* linux/fs.h */
#endif

/* The iteration of a folder named iter_<digits> (exactly), or -1. */
static int64_t iteration_of(const char *name, const char *suffix) {
  if (strncmp(name, "iter_", 5)) return -1;
  const char *c = name + 5;
  int64_t it = 0;
  int digits = 0;
  for (; *c >= '0' && *c <= '9'; c++, digits++) {
    if (it > (INT64_MAX - (*c - '0')) / 10) return -1;
    it = it * 10 + (*c - '0');
  }
  return digits && !strcmp(c, suffix) ? it : -1;
}

int mpu__ckpt_iter_name(char *out, size_t cap, int64_t iteration, const char *suffix) {
  int n = snprintf(out, cap, CKPT_ITER_PREFIX "%07" PRId64 "%s", iteration, suffix);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Whether root/name/index.json is a regular file: the save of that folder finished. */
static int complete(const char *root, const char *name) {
  char path[4200];
  struct stat st;
  int n = snprintf(path, sizeof path, "%s/%s/%s", root, name, CKPT_INDEX);
  return n > 0 && (size_t)n < sizeof path && !stat(path, &st) && S_ISREG(st.st_mode);
}

/* The tracker's iteration, or -1 if it is missing, not a regular file or not a number. */
static int64_t read_tracker(const char *root) {
  char path[4200], text[32];
  if (mpu__ckpt_path(path, sizeof path, root, CKPT_TRACKER)) return -1;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block */
  if (fd < 0) return -1;
  struct stat st;
  ssize_t got = -1;
  if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size < (off_t)sizeof text)
    got = mpu__ckpt_pread_all(fd, text, sizeof text - 1, 0);
  close(fd);
  if (got <= 0) return -1;
  text[got] = '\0';
  while (got > 0 && (text[got - 1] == '\n' || text[got - 1] == ' ')) text[--got] = '\0';
  char name[64];
  snprintf(name, sizeof name, "iter_%s", text);
  return iteration_of(name, "");
}

mpu_result_t mpu_ckpt_latest(const char *dir, char *out, size_t cap) {
  static const char fn[] = "mpu_ckpt_latest";
  if (!dir || !out || !cap) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  char name[64] = "";
  int64_t it = read_tracker(dir);
  if (it < 0 || mpu__ckpt_iter_name(name, sizeof name, it, "") || !complete(dir, name)) {
    name[0] = '\0', it = -1; /* no tracker, or it names no finished folder: scan */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
      int64_t k = iteration_of(e->d_name, "");
      if (k > it && strlen(e->d_name) < sizeof name && complete(dir, e->d_name))
        it = k, snprintf(name, sizeof name, "%s", e->d_name);
    }
    if (d) closedir(d);
  }
  int n = *name ? snprintf(out, cap, "%s/%s", dir, name) : snprintf(out, cap, "%s", dir);
  if (n < 0 || (size_t)n >= cap)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the path %s/%s is longer than %zu bytes", fn,
                      dir, name, cap - 1);
  return MPU_SUCCESS;
}

/* ---- saving ------------------------------------------------------------------------------ */

/* Remove a folder of plain files (what a save writes); best effort. Never
 * through a link: a link named like a killed save's folder is not one, and
 * following it would empty the folder it points to. */
static void remove_folder(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
  closedir(d);
  rmdir(path);
}

mpu_result_t mpu__ckpt_stage(const char *root, const char *stage, int *lock) {
  static const char fn[] = "mpu_ckpt_save";
  struct stat st;
  *lock = -1;
  if (mkdir(root, 0755) && (errno != EEXIST || stat(root, &st) || !S_ISDIR(st.st_mode)))
    return mpu__error(MPU_ERR_SYSTEM, "%s: cannot create the folder %s: %s", fn, root,
                      strerror(errno == EEXIST ? ENOTDIR : errno));
  /* one save into a root at a time: another one's folder in the making
   * would be taken for a killed save's and emptied under it. The lock goes
   * with the process, so a killed save holds it no longer; a file system
   * without locks saves unlocked. */
  int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB)) {
    int e = errno;
    close(fd), fd = -1;
    if (e == EWOULDBLOCK)
      return mpu__error(MPU_ERR_INVALID_USAGE,
                        "%s: another save into %s is running; one save into a root at a time", fn,
                        root);
  }
  *lock = fd;
  /* what killed saves left (never an iteration a root can mean) */
  DIR *d = opendir(root);
  for (struct dirent *e; d && (e = readdir(d));) {
    char path[4200];
    if (iteration_of(e->d_name, CKPT_STAGE_SUFFIX) >= 0 &&
        !mpu__ckpt_path(path, sizeof path, root, e->d_name))
      remove_folder(path);
  }
  if (d) closedir(d);
  if (mkdir(stage, 0755)) {
    mpu_result_t r = mpu__error(MPU_ERR_SYSTEM, "%s: cannot create the folder %s: %s", fn, stage,
                                strerror(errno));
    mpu__ckpt_unlock(lock);
    return r;
  }
  return MPU_SUCCESS;
}

void mpu__ckpt_unlock(int *lock) {
  if (*lock >= 0) flock(*lock, LOCK_UN), close(*lock); /* unlocked even if a fork shares it */
  *lock = -1;
}

void mpu__ckpt_discard(const char *stage) { remove_folder(stage); }

mpu_result_t mpu__ckpt_publish(const char *root, const char *stage, int64_t iteration) {
  static const char fn[] = "mpu_ckpt_save";
  char name[64], final[4200];
  if (mpu__ckpt_iter_name(name, sizeof name, iteration, "") ||
      mpu__ckpt_path(final, sizeof final, root, name))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the path %s is too long", fn, root);
  int swapped = 0;
  if (rename(stage, final)) {
    int e = errno;
    /* the iteration was saved before: swap the folders in one step, so that
     * a complete one is in place at every moment (Linux's RENAME_EXCHANGE) */
    if ((e == ENOTEMPTY || e == EEXIST) &&
        !syscall(SYS_renameat2, AT_FDCWD, stage, AT_FDCWD, final, RENAME_EXCHANGE))
      swapped = 1;
    else if (e == ENOTEMPTY || e == EEXIST)
      return mpu__error(MPU_ERR_UNSUPPORTED,
                        "%s: %s exists and this file system cannot swap it with the new one in "
                        "one step (%s); remove it, or save another iteration",
                        fn, final, strerror(errno));
    else
      return mpu__error(MPU_ERR_SYSTEM, "%s: cannot rename %s to %s: %s", fn, stage, final, strerror(e));
  }
  if (mpu__dir_sync(root))
    return mpu__error(MPU_ERR_SYSTEM, "%s: cannot sync %s: %s", fn, root, strerror(errno));
  char text[32];
  int n = snprintf(text, sizeof text, "%" PRId64 "\n", iteration);
  const void *parts[1] = {text};
  size_t lens[1] = {(size_t)n};
  MPU_CHECK(mpu__ckpt_write_file(root, CKPT_TRACKER, parts, lens, 1));
  if (swapped) remove_folder(stage); /* the iteration's earlier save */
  return MPU_SUCCESS;
}
