/*
 * env.c - the one table of environment knobs (NCCL keeps its ncclParam list
 * the same way), parsed once.
 */
#include "core/env.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct knob {
  const char *name;
  const char *fallback; /* default, as text */
  const char *meaning;
} knob;

/* Keep in step with docs/api.md ("Environment"). */
static const knob knobs[] = {
    {"MPU_TIMEOUT", "300", "seconds a rank waits for its peers before the call fails"},
    {"MPU_CHECK_CALLS", "0", "1: every collective also checks that all ranks passed the same op and root"},
    {"MPU_SPIN", "-1", "busy-wait iterations before a waiting rank sleeps (-1: automatic)"},
    {"MPU_DEBUG", "0", "1: log the file:line path of every error to stderr"},
};

static mpu__env_values values;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *raw(int i) {
  const char *v = getenv(knobs[i].name);
  return (v && *v) ? v : knobs[i].fallback;
}

static double as_double(int i) {
  const char *s = raw(i);
  char *end;
  errno = 0;
  double d = strtod(s, &end);
  if (errno || *end || d <= 0) {
    fprintf(stderr, "mpu: ignoring %s=%s (want a positive number; %s)\n", knobs[i].name, s,
            knobs[i].meaning);
    d = strtod(knobs[i].fallback, NULL);
  }
  return d;
}

static long as_long(int i) {
  const char *s = raw(i);
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end) {
    fprintf(stderr, "mpu: ignoring %s=%s (want an integer; %s)\n", knobs[i].name, s,
            knobs[i].meaning);
    v = strtol(knobs[i].fallback, NULL, 10);
  }
  return v;
}

static void load(void) {
  values.timeout_s = as_double(0);
  values.check_calls = as_long(1) != 0;
  values.spin = as_long(2);
  values.debug = as_long(3) != 0;
}

const mpu__env_values *mpu__env(void) {
  pthread_once(&once, load);
  return &values;
}
