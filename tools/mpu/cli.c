/*
 * cli.c - shared helpers of the `mpu` subcommands.
 */
#include "cli.h"

#include "checkpoint/json.h"
#include "core/files.h"
#include "mpu.h"

#include <ctype.h>
#include <math.h>
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

void cli_help_exit_status(const char *one) {
  printf("exit status:\n"
         "  0  success\n"
         "  1  %s\n"
         "  2  a bad option or value (one line on stderr says which)\n", one);
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

int cli_parse_rxs(const char *s, long max, long *r, long *x) {
  char first[24];
  const char *sep = s ? strchr(s, 'x') : NULL;
  size_t len = sep ? (size_t)(sep - s) : 0;
  if (!sep || !len || len >= sizeof first) return -1;
  memcpy(first, s, len);
  first[len] = '\0';
  long a, b; /* each bounded first, so the product cannot overflow */
  if (cli_parse_int(first, 1, max, &a) || cli_parse_int(sep + 1, 1, max, &b) || a * b > max) return -1;
  *r = a, *x = b;
  return 0;
}

int cli_parse_int_list(const char *s, long lo, long hi, long *out, int cap, int *n) {
  if (cli_list_ok(s)) return -1;
  int count = 0;
  for (const char *p = s; *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char item[32];
    if (count == cap || len >= sizeof item) return -1;
    memcpy(item, p, len);
    item[len] = '\0';
    if (cli_parse_int(item, lo, hi, &out[count])) return -1;
    count++;
    p += len + (comma ? 1 : 0);
  }
  *n = count;
  return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *out) {
  if (!s || !*s) return -1;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v) || !(v > lo) || v > hi) return -1;
  *out = v;
  return 0;
}

int cli_list_ok(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (!n || s[0] == ',' || s[n - 1] == ',' || strstr(s, ",,")) return -1;
  return 0;
}

static int parse_format(const char *s, int pictures, cli_format *out) {
  static const char *names[] = {[CLI_TEXT] = "text", [CLI_JSON] = "json", [CLI_SVG] = "svg",
                                [CLI_HTML] = "html"};
  for (int f = 0; f <= (pictures ? CLI_HTML : CLI_JSON); f++)
    if (!strcmp(s, names[f])) return *out = (cli_format)f, 0;
  return -1;
}

int cli_parse_format(const char *s, cli_format *out) { return parse_format(s, 0, out); }
int cli_parse_picture_format(const char *s, cli_format *out) { return parse_format(s, 1, out); }

const char *cli_format_size(size_t bytes, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  size_t v = bytes;
  while (u < 4 && v >= 1024 && v % 1024 == 0) v /= 1024, u++;
  snprintf(buf, len, "%zu %s", v, units[u]);
  return buf;
}

int cli_loss_check(cli_format format, const char *what, const char *loss_key, const double *loss,
                   const double *ref, long steps, double tol) {
  return cli_loss_check_from(format, what, loss_key, loss, ref, 0, steps, tol);
}

int cli_loss_check_from(cli_format format, const char *what, const char *loss_key,
                        const double *loss, const double *ref, long first, long steps, double tol) {
  double worst = 0;
  int finite = 1;
  for (long s = first; s < steps; s++) {
    finite &= isfinite(loss[s]) && isfinite(ref[s]);
    worst = fmax(worst, fabs(loss[s] - ref[s]) / fmax(fabs(ref[s]), 1e-30));
  }
  int pass = finite && worst <= tol; /* a diverged (NaN) run fails too */
  if (format == CLI_JSON) {
    printf("\"steps\": [");
    for (long s = first; s < steps; s++)
      printf("%s\n  {\"step\": %ld, \"%s\": %.9g, \"single_rank_loss\": %.9g}", s > first ? "," : "",
             s + 1, loss_key, loss[s], ref[s]);
    printf("\n ],\n \"max_relative_difference\": %.3g, \"tolerance\": %g, \"pass\": %s}\n", worst,
           tol, pass ? "true" : "false");
    return pass;
  }
  printf("%5s  %14s  %16s  %9s\n", "step", "loss", "single-rank loss", "rel. diff");
  for (long s = first; s < steps; s++)
    printf("%5ld  %14.9f  %16.9f  %9.2e\n", s + 1, loss[s], ref[s],
           fabs(loss[s] - ref[s]) / fmax(fabs(ref[s]), 1e-30));
  printf("check: %s agree with one rank to %g relative at every step (largest difference %.2e): "
         "%s\n",
         what, tol, worst, pass ? "PASS" : "FAIL");
  return pass;
}

/* One clock for the whole run: it starts at the first progress line and is
 * never reset, so a command that runs several configs shows the time since
 * it began; share (0..1) of the known work done gives the time left. */
static double started = -1, last_shown, share = -1;
static int shown, muted;

void cli_progress_mute(void) { muted = 1; }

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress(const char *fmt, ...) {
  if (muted) return;
  double t = cli_now();
  if (started < 0) started = last_shown = t;
  if (t - started < 2.0 || t - last_shown < 2.0) return;
  last_shown = t;
  int tty = isatty(STDERR_FILENO);
  va_list ap;
  va_start(ap, fmt);
  double spent = t - started;
  if (share > 0.02 && share < 1)
    fprintf(stderr, "%s[%5.1f s, ~%.0f s left] ", tty ? "\r\033[K" : "", spent,
            spent * (1 - share) / share);
  else
    fprintf(stderr, "%s[%5.1f s] ", tty ? "\r\033[K" : "", spent);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (!tty) fputc('\n', stderr);
  fflush(stderr);
  shown = 1;
}

void cli_progress_share(double done) { share = done; }

void cli_progress_done(void) {
  if (shown && isatty(STDERR_FILENO)) fputs("\r\033[K", stderr);
  shown = 0;
  share = -1;
}

void cli_json_string(FILE *f, const char *s, int script_safe) {
  json_buf b = {0};
  mpu__jb_string_ex(&b, s, script_safe);
  fputs(b.failed || !b.s ? "null" : b.s, f); /* out of memory: still JSON */
  mpu__jb_free(&b);
}

int cli_check_output(const char *what, const char *path) {
  return mpu__output_check(what, path, NULL, 0) ? -1 : 0;
}

int cli_write_output(const char *cmd, const char *what, const char *path, const void *data,
                     size_t n) {
  const void *parts[1] = {data};
  if (!mpu__output_write(what, path, parts, &n, 1, NULL, 0)) return 0;
  fprintf(stderr, "mpu %s: %s\n", cmd, mpu_last_error());
  return -1;
}
