/*
 * gpu_report.h - the one line a GPU check prints, for the programs that
 * scripts/gpu-test.sh runs: "PASS|FAIL|INFO <check>: <what>". say(1, ...)
 * passes, say(0, ...) fails (and gpu_failed is set: the program's exit
 * status), say(-1, ...) informs.
 */
#ifndef MPU_TESTS_GPU_REPORT_H
#define MPU_TESTS_GPU_REPORT_H

#include <stdarg.h>
#include <stdio.h>

static int gpu_failed;

static void say(int ok, const char *check, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(int ok, const char *check, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s %s: ", ok > 0 ? "PASS" : ok == 0 ? "FAIL" : "INFO", check);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (ok == 0) gpu_failed = 1;
}

#endif
