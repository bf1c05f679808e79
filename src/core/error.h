/*
 * error.h - internal helpers for returning errors with a message.
 *
 * mpu__error() records a printf-style message in the calling thread's
 * last-error buffer and returns the code, so a failure path is one line:
 *     return mpu__error(MPU_ERR_INVALID_ARGUMENT, "all_reduce: count %zu ...", n);
 * MPU_CHECK() passes a failure up unchanged and, with MPU_DEBUG=1, logs the
 * file:line it travelled through (NCCL's checks.h does the same).
 */
#ifndef MPU_CORE_ERROR_H
#define MPU_CORE_ERROR_H

#include "mpu/result.h"

#define MPU_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Marks the internals the libraries and the tool built beside libmpu use, and
 * only those: hidden like every mpu__ function, they reach them through
 * libmpu's sibling table (comm/base/sibling.h; sibling_calls.c defines each
 * one for them). A change to a marked function's signature is a change to
 * the table. The exports test checks that the marks and the table agree. */
#define MPU_SIBLING_API

MPU_SIBLING_API mpu_result_t mpu__error(mpu_result_t code, const char *fmt, ...) MPU_PRINTF(2, 3);

/* Prepend "what: " to the current last-error message (context as it travels up). */
void mpu__error_prefix(const char *fmt, ...) MPU_PRINTF(1, 2);

/* Log "file:line code message" to stderr when MPU_DEBUG is set. */
MPU_SIBLING_API void mpu__trace(const char *file, int line, mpu_result_t code);

#define MPU_CHECK(call)                                                                 \
  do {                                                                                  \
    mpu_result_t mpu_check_r_ = (call);                                                 \
    if (mpu_check_r_ != MPU_SUCCESS) {                                                  \
      mpu__trace(__FILE__, __LINE__, mpu_check_r_);                                     \
      return mpu_check_r_;                                                              \
    }                                                                                   \
  } while (0)

#define MPU_CHECK_GOTO(call, res, label)                                                \
  do {                                                                                  \
    (res) = (call);                                                                     \
    if ((res) != MPU_SUCCESS) {                                                         \
      mpu__trace(__FILE__, __LINE__, (res));                                            \
      goto label;                                                                       \
    }                                                                                   \
  } while (0)

#endif
