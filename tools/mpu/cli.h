/*
 * cli.h - what every `mpu` subcommand shares: usage errors, number and size
 * parsing, output formats and the progress line.
 */
#ifndef MPU_TOOLS_CLI_H
#define MPU_TOOLS_CLI_H

#include <stddef.h>
#include <stdio.h>

/* Exit status for bad arguments, as the conventions of this tool want. */
#define CLI_USAGE_EXIT 2

typedef enum cli_format { CLI_TEXT, CLI_JSON, CLI_SVG, CLI_HTML } cli_format;

/* Print "mpu <cmd>: <message>" and a hint to stderr; exit with status 2. */
void cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* s as a JSON string literal to f: the library's one escaper (quotes, backslashes and control
 * characters escaped, a byte that is not UTF-8 as U+FFFD; script_safe: < > & too, for JSON
 * inside an HTML <script>). */
void cli_json_string(FILE *f, const char *s, int script_safe);

/* Every file the tool writes follows the library's one rule (src/core/files.h): a regular
 * file or none, never a file the same command reads, written through PATH.tmp and renamed.
 * cli_check_output says before the work whether path may be written: 0, or -1 with the
 * reason ("<what>: ...") in mpu_last_error(). cli_write_output writes data there: 0, or -1
 * with "mpu <cmd>: <what>: <why>" on stderr. */
int cli_check_output(const char *what, const char *path);
int cli_write_output(const char *cmd, const char *what, const char *path, const void *data,
                     size_t n);

/* "16M", "1G", "8", "512K" (powers of 1024; also "KiB", "MB" style suffixes).
 * Returns 0 on success, -1 if s is not a size or overflows. */
/* The "exit status:" section of a --help text: 0 success, 1 `one`, 2 a usage
 * error (the man pages are generated from these texts). */
void cli_help_exit_status(const char *one);

int cli_parse_size(const char *s, size_t *out);

/* A whole number in [lo, hi]; returns 0 on success, -1 otherwise. */
int cli_parse_int(const char *s, long lo, long hi, long *out);

/* "text" or "json"; returns 0 on success, -1 otherwise. */
int cli_parse_format(const char *s, cli_format *out);

/* The commands that draw: "text", "json", "svg" or "html". */
int cli_parse_picture_format(const char *s, cli_format *out);

/* "RxS" with R, S in 1..max and R * S <= max (hsdp's --mesh). */
int cli_parse_rxs(const char *s, long max, long *r, long *x);

/* A comma-separated list of up to cap whole numbers in lo..hi (--shape, -n). */
int cli_parse_int_list(const char *s, long lo, long hi, long *out, int cap, int *n);

/* A finite number in (lo, hi] (--lr). */
int cli_parse_double(const char *s, double lo, double hi, double *out);

/* 0 if s is a comma-separated list with no empty element (no leading,
 * trailing or doubled comma), -1 otherwise: every list option checks it. */
int cli_list_ok(const char *s);

/* "16 MiB", "8 B": a short human size for tables and progress lines. */
const char *cli_format_size(size_t bytes, char *buf, size_t len);

/*
 * The demos' self-check: compare each step's loss with a reference run and
 * print the result. Text: a table and a "check: ... PASS|FAIL" line that
 * starts with `what`. JSON: `"steps": [...], "max_relative_difference": ...,
 * "tolerance": ..., "pass": ...}` closing an object the caller opened (each
 * step holds `loss_key` and "single_rank_loss"). Returns 1 if every step is
 * finite and within tol (relative), else 0.
 */
int cli_loss_check(cli_format format, const char *what, const char *loss_key, const double *loss,
                   const double *ref, long steps, double tol);
/* The same over steps [first, steps) only (a run continued from a checkpoint). */
int cli_loss_check_from(cli_format format, const char *what, const char *loss_key,
                        const double *loss, const double *ref, long first, long steps, double tol);

/* Progress on stderr for long runs: nothing for the first 2 seconds, then
 * one line at most every 2 seconds (rewritten in place on a terminal). The
 * clock starts at the first call and runs for the whole command; where the
 * amount of work is known, cli_progress_share(fraction done) adds the time
 * left. cli_progress_done clears the line (the clock keeps running). */
/* Seconds on the monotonic clock (the progress line's clock too). */
double cli_now(void);

void cli_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_share(double done);
void cli_progress_done(void);
/* No progress lines from this process (an MPI job's ranks other than 0). */
void cli_progress_mute(void);

#endif
