/*
 * cli.c - shared helpers of the `mpu` subcommands.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

void cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "mpu %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see 'mpu %s --help')\n", cmd);
  exit(CLI_USAGE_EXIT);
}

int cli_parse_size(const char *s, size_t *out) {
  if (!s || !isdigit((unsigned char)*s)) return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
  case '\0': break;
  case 'K': shift = 10; end++; break;
  case 'M': shift = 20; end++; break;
  case 'G': shift = 30; end++; break;
  case 'T': shift = 40; end++; break;
  default: return -1;
  }
  if (shift && (!strcasecmp(end, "iB") || !strcasecmp(end, "B"))) end += strlen(end);
  else if (!shift && !strcasecmp(end, "B")) end++;
  if (*end) return -1;
  if (shift && v > (UINT64_MAX >> shift)) return -1;
  v <<= shift;
  if (v > SIZE_MAX / 2) return -1;
  *out = (size_t)v;
  return 0;
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return -1;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int cli_parse_format(const char *s, cli_format *out) {
  if (!strcmp(s, "text")) return *out = CLI_TEXT, 0;
  if (!strcmp(s, "json")) return *out = CLI_JSON, 0;
  return -1;
}

const char *cli_format_size(size_t bytes, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  size_t v = bytes;
  while (u < 4 && v >= 1024 && v % 1024 == 0) v /= 1024, u++;
  snprintf(buf, len, "%zu %s", v, units[u]);
  return buf;
}

static double started = -1, last_shown;
static int shown;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress(const char *fmt, ...) {
  double t = now_s();
  if (started < 0) started = last_shown = t;
  if (t - started < 2.0 || t - last_shown < 2.0) return;
  last_shown = t;
  int tty = isatty(STDERR_FILENO);
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s[%5.1f s] ", tty ? "\r\033[K" : "", t - started);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (!tty) fputc('\n', stderr);
  fflush(stderr);
  shown = 1;
}

void cli_progress_done(void) {
  if (shown && isatty(STDERR_FILENO)) fputs("\r\033[K", stderr);
  started = -1;
  shown = 0;
}
