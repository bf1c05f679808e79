/*
 * mpu/result.h - result codes and the per-thread "last error" message.
 *
 * Every public mpu call returns an mpu_result_t: 0 (MPU_SUCCESS) or one of the
 * codes below. On failure the calling thread's last-error message says what
 * went wrong (which rank, which argument, what to do next); it stays valid until
 * the same thread's next failing mpu call.
 */
#ifndef MPU_RESULT_H
#define MPU_RESULT_H

#include "mpu/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MPU_API
#else
#define MPU_API __attribute__((visibility("default")))
#endif
/* an old name kept for one release beside its new one (docs/api.md, "Lifecycles and names") */
#define MPU_DEPRECATED(msg) __attribute__((deprecated(msg)))

/* X(name, value, text): the one list the enum, names and texts come from. */
#define MPU_RESULT_MAP(X)                                                             \
  X(MPU_SUCCESS, 0, "success")                                                        \
  X(MPU_ERR_INVALID_ARGUMENT, 1, "invalid argument")                                  \
  X(MPU_ERR_INVALID_USAGE, 2, "invalid usage (wrong order of calls or state)")        \
  X(MPU_ERR_OUT_OF_MEMORY, 3, "out of memory")                                        \
  X(MPU_ERR_SYSTEM, 4, "system call failed")                                          \
  X(MPU_ERR_TIMEOUT, 5, "timed out waiting for other ranks")                          \
  X(MPU_ERR_ABORTED, 6, "a peer rank failed, exited or aborted")                      \
  X(MPU_ERR_MISMATCH, 7, "ranks made mismatched calls")                               \
  X(MPU_ERR_UNSUPPORTED, 8, "not supported by this backend or build")                 \
  X(MPU_ERR_BACKEND, 9, "backend error")                                              \
  X(MPU_ERR_INTERNAL, 10, "internal error (a bug in mpu)")

typedef enum mpu_result {
#define MPU_RESULT_ENUM_(name, value, text) name = value,
  MPU_RESULT_MAP(MPU_RESULT_ENUM_)
#undef MPU_RESULT_ENUM_
  MPU_RESULT_COUNT_
} mpu_result_t;

/* "MPU_ERR_TIMEOUT"; "MPU_ERR_UNKNOWN" for a value outside the list. */
MPU_API const char *mpu_result_name(mpu_result_t r);

/* "timed out waiting for other ranks": the generic text of a code. */
MPU_API const char *mpu_result_string(mpu_result_t r);

/* The detailed message of the calling thread's last failed call ("" if none).
 * Thread-local: one thread's failures never overwrite another's message. */
MPU_API const char *mpu_last_error(void);

/* The loaded library's version ("0.3.0") and MPU_VERSION_NUMBER; a program
 * compiled against other headers can compare them with MPU_VERSION_STRING. */
MPU_API const char *mpu_version(void);
MPU_API int mpu_version_number(void);

/* Forget the calling thread's last error. */
MPU_API void mpu_clear_error(void);

/* Set the calling thread's last error message (printf-style) and return
 * code: how a rank function of mpu_launch / mpu_with_state says why it
 * failed, so that the launcher reports the message, not a stale one. */
MPU_API mpu_result_t mpu_fail(mpu_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif /* MPU_RESULT_H */
