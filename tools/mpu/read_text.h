/*
 * read_text.h - a bounded read of a file the user names (a training text):
 * regular files only, never blocking, every read error reported.
 */
#ifndef MPU_TOOL_READ_TEXT_H
#define MPU_TOOL_READ_TEXT_H

#include <stddef.h>

#include "mpu.h"

/* The first max bytes of the regular file path (*out malloc'ed, *n bytes).
 * A directory, FIFO, device or socket, a file that cannot be opened or read,
 * or one whose reads fail (/proc/self/mem) is MPU_ERR_INVALID_ARGUMENT with a
 * one-line message naming option and path; a FIFO nobody writes to is
 * refused at once, not waited for. */
mpu_result_t cli_read_text(const char *option, const char *path, size_t max, unsigned char **out,
                           size_t *n);

#endif
