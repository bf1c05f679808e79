/*
 * files.h - the one rule for the files mpu reads and writes by a name a user
 * gave (checkpoints, merged safetensors, the tool's CSV):
 *   - an input is opened without blocking (a FIFO with no writer would block
 *     open itself) and must be a regular file;
 *   - an output is a regular file or absent (never a device, FIFO, socket or
 *     directory: `rename` over /dev/full as root would replace the node), is
 *     never one of the inputs of the same call (same st_dev and st_ino), and
 *     is written through a temporary file in its own directory (PATH.tmp,
 *     created exclusively, never through a link), synced and renamed, so
 *     that a failed write leaves PATH as it was.
 * Exported for the mpu tool, which writes its outputs through it too.
 */
#ifndef MPU_CORE_FILES_H
#define MPU_CORE_FILES_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "core/error.h"
#include "mpu/result.h"

/* Which file a path named when it was read: compared with an output. */
typedef struct mpu__file_id {
  dev_t dev;
  ino_t ino;
} mpu__file_id;

/* Open path for reading (O_NONBLOCK, O_CLOEXEC, O_NOCTTY) and check it is a
 * regular file: *fd and *st (may be NULL) on success; on failure nothing is
 * open and the message says "<fn>: <what> <path> ..." (what names the file's
 * role, "index"). */
MPU_SIBLING_API mpu_result_t mpu__input_open(const char *fn, const char *what, const char *path,
                                             int *fd, struct stat *st);

/* The id of a stat result. */
mpu__file_id mpu__file_id_of(const struct stat *st);

/* Whether path may be written now: its directory exists and is writable, and
 * path is absent or a regular file that is none of inputs[0, ninputs). */
MPU_SIBLING_API mpu_result_t mpu__output_check(const char *fn, const char *path,
                                               const mpu__file_id *inputs, int ninputs);

/* fsync the folder dir, so that a rename or creation in it is durable. 0,
 * or -1 (errno); a file system that cannot sync folders (EINVAL) counts as
 * done. */
int mpu__dir_sync(const char *dir);

/* Write the concatenation of parts[0, nparts) (lens bytes each) to path by
 * the rule above (checked again just before the rename). On failure path is
 * unchanged and the temporary file removed. */
MPU_SIBLING_API mpu_result_t mpu__output_write(const char *fn, const char *path,
                                               const void *const *parts, const size_t *lens,
                                               int nparts, const mpu__file_id *inputs, int ninputs);

#endif
