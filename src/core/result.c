/*
 * result.c - result names and texts (from MPU_RESULT_MAP) and the thread-local
 * last-error message.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"

#define MPU_ERROR_MAX 1024

static _Thread_local char last_error[MPU_ERROR_MAX];

const char *mpu_result_name(mpu_result_t r) {
  switch (r) {
#define NAME_(name, value, text) \
  case name:                     \
    return #name;
    MPU_RESULT_MAP(NAME_)
#undef NAME_
  default:
    return "MPU_ERR_UNKNOWN";
  }
}

const char *mpu_result_string(mpu_result_t r) {
  switch (r) {
#define TEXT_(name, value, text) \
  case name:                     \
    return text;
    MPU_RESULT_MAP(TEXT_)
#undef TEXT_
  default:
    return "unknown result code";
  }
}

const char *mpu_last_error(void) { return last_error; }

const char *mpu_version(void) { return MPU_VERSION_STRING; }
int mpu_version_number(void) { return MPU_VERSION_NUMBER; }

void mpu_clear_error(void) { last_error[0] = '\0'; }

mpu_result_t mpu__error(mpu_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

mpu_result_t mpu_fail(mpu_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (fmt) vsnprintf(last_error, sizeof last_error, fmt, ap);
  else last_error[0] = '\0';
  va_end(ap);
  return code;
}

void mpu__error_prefix(const char *fmt, ...) {
  char prefix[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  size_t plen = strlen(prefix) + 2, old = strlen(last_error);
  if (old > MPU_ERROR_MAX - 1 - plen) old = MPU_ERROR_MAX - 1 - plen; /* keep the front */
  memmove(last_error + plen, last_error, old);
  last_error[plen + old] = '\0';
  memcpy(last_error, prefix, plen - 2);
  last_error[plen - 2] = ':';
  last_error[plen - 1] = ' ';
}

void mpu__trace(const char *file, int line, mpu_result_t code) {
  if (mpu__env()->debug)
    fprintf(stderr, "mpu: %s:%d %s: %s\n", file, line, mpu_result_name(code), last_error);
}
