/*
 * options.h - option and config structs that can grow.
 *
 * Every public options struct starts with `size_t size` (set by its INIT
 * macro). A program built against an older, shorter version passes a smaller
 * size: its fields are taken and the newer ones keep their defaults, as
 * NCCL's ncclConfig_t does. One rule, here, for every such struct.
 */
#ifndef MPU_CORE_OPTIONS_H
#define MPU_CORE_OPTIONS_H

#include <stddef.h>

#include "core/error.h"
#include "mpu/result.h"

/* MPU_SUCCESS if a struct's size lies in min_size..full_size; else
 * MPU_ERR_INVALID_ARGUMENT naming the struct and its INIT macro. The one size
 * rule of every options and result struct. */
mpu_result_t mpu__check_size(const char *fn, const char *what, const char *init, size_t size,
                             size_t min_size, size_t full_size);

/* Copy `given` (its size read from its first field) over `full`, which holds
 * the current defaults and is full_size bytes; then full's size is full_size.
 * A size smaller than min_size (the struct's first version) or larger than
 * full_size (a newer library's) is refused with MPU_ERR_INVALID_ARGUMENT. */
MPU_SIBLING_API mpu_result_t mpu__take_options(const char *fn, const char *what, const char *init,
                               const void *given, size_t full_size, size_t min_size, void *full);

/* Hand a result struct back to a caller whose struct has out->size bytes (an
 * older, shorter version gets its part): copy full over out, keeping out's
 * size. A size below min_size or above full_size is refused. */
mpu_result_t mpu__give_out(const char *fn, const char *what, const char *init, void *out,
                           const void *full, size_t full_size, size_t min_size);

#endif
