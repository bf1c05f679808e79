/*
 * test_ckpt_read.c - what reading a checkpoint refuses, and what merge may
 * not overwrite (mpu/checkpoint.h).
 *
 * The checkpoints here are written by hand (an index.json and one piece
 * file of 16 floats with their CRC-32s computed here), so that each case
 * says exactly what the index holds: numbers longer than 63 characters,
 * offsets near INT64_MAX, pieces that overlap and leave a gap of the same
 * size, ranks that opened different checkpoints, merges onto the
 * checkpoint's own files or onto what is not a regular file, an index that
 * is a FIFO. Then the size arithmetic of the descriptions: boxes and shapes
 * near the limits, chunk_layers with pp x vp past INT_MAX.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

/* ---- a checkpoint by hand ---------------------------------------------------------------- */

/* tensor "x", shape [4, 4], element i = i; file r.bin holds them in order after 8 bytes (where
 * a safetensors file has its header's length) */
enum { N = 16, HEAD = 8 };

static uint32_t crc32_ref(const void *data, size_t n) { /* zlib's crc32, bit by bit */
  const unsigned char *p = data;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

static float file_data[N];

/* A piece of x: box (offsets, lengths), its flat span, at byte blo of the data in r.bin. */
static void piece(char *out, size_t cap, int64_t o0, int64_t o1, int64_t l0, int64_t l1,
                  int64_t flo, int64_t fhi, int64_t blo) {
  size_t n = (size_t)(fhi - flo) * 4;
  uint32_t crc = crc32_ref((const char *)file_data + blo, n);
  snprintf(out + strlen(out), cap - strlen(out),
           "%s{\"file\": \"r.bin\", \"offsets\": [%lld, %lld], \"lengths\": [%lld, %lld], "
           "\"flat\": [%lld, %lld], \"bytes\": [%lld, %lld], \"crc32\": \"%08x\"}",
           strchr(out, '{') ? ", " : "", (long long)o0, (long long)o1, (long long)l0,
           (long long)l1, (long long)flo, (long long)fhi, (long long)blo + HEAD,
           (long long)(blo + HEAD + (int64_t)n), crc);
}

static char dir_a[128], dir_b[128];

static void write_text(const char *dir, const char *name, const char *text, size_t n) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* dir with r.bin and an index of step `step`, optimizer `opt` (JSON), metadata `meta`
 * (JSON object) and x's pieces `pieces` (a list's items) */
static void write_ckpt(const char *dir, long step, const char *opt, const char *meta,
                       const char *pieces) {
  mkdir(dir, 0755);
  char bin[HEAD + sizeof file_data] = {0};
  memcpy(bin + HEAD, file_data, sizeof file_data);
  write_text(dir, "r.bin", bin, sizeof bin);
  size_t cap = 8192 + strlen(opt) + strlen(meta) + strlen(pieces);
  char *ix = malloc(cap);
  assert_non_null(ix);
  snprintf(ix, cap,
           "{\"format\": \"mpu-checkpoint\", \"version\": 1, \"step\": %ld,\n"
           " \"layout\": {\"world\": 1, \"tp\": 1, \"pp\": 1, \"vp\": 0, \"dp\": 1, \"cp\": 1, "
           "\"ep\": 1, \"zero1\": false, \"flavor\": \"core\"},\n"
           " \"optimizer\": %s, \"metadata\": %s, \"rng\": [],\n"
           " \"files\": [{\"name\": \"r.bin\", \"bytes\": %zu}],\n"
           " \"tensors\": {\"x\": {\"kind\": \"param\", \"dtype\": \"F32\", \"shape\": [4, 4], "
           "\"pieces\": [%s]}}}\n",
           step, opt, meta, HEAD + sizeof file_data, pieces);
  write_text(dir, "index.json", ix, strlen(ix));
  free(ix);
}

/* replace the first `from` in dir's index by `to` (of the same length) */
static void patch_index(const char *dir, const char *from, const char *to) {
  char path[300], text[8192];
  snprintf(path, sizeof path, "%s/index.json", dir);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  char *at = strstr(text, from);
  assert_non_null(at);
  assert_int_equal(strlen(from), strlen(to));
  memcpy(at, to, strlen(to));
  write_text(dir, "index.json", text, n);
}

static char whole[512]; /* one piece: all of x */

static void write_plain(const char *dir, long step) {
  whole[0] = '\0';
  piece(whole, sizeof whole, 0, 0, 4, 4, 0, N, 0);
  write_ckpt(dir, step, "null", "{}", whole);
}

static mpu_result_t open_close(const char *dir) {
  mpu_ckpt *ck = NULL;
  mpu_result_t r = mpu_ckpt_open(dir, &ck);
  if (!r) r = mpu_ckpt_verify(ck);
  mpu_ckpt_free(ck);
  return r;
}

static void expect_ok(const char *dir) {
  if (open_close(dir)) fail_msg("%s: %s", dir, mpu_last_error());
}

static void expect_refused(const char *dir, const char *w1, const char *w2) {
  mpu_result_t r = open_close(dir);
  assert_int_not_equal(r, MPU_SUCCESS);
  const char *msg = mpu_last_error();
  if (!strstr(msg, w1) || (w2 && !strstr(msg, w2))) fail_msg("'%s' lacks '%s' / '%s'", msg, w1, w2 ? w2 : "");
}

static int setup(void **state) {
  (void)state;
  for (int i = 0; i < N; i++) file_data[i] = (float)i;
  snprintf(dir_a, sizeof dir_a, "test_ckpt_read_a_%d", (int)getpid());
  snprintf(dir_b, sizeof dir_b, "test_ckpt_read_b_%d", (int)getpid());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir_a, dir_b);
  return system(cmd);
}

/* ---- numbers of the index ------------------------------------------------------------- */

static const char *adamw(const char *lr) {
  static char o[512];
  snprintf(o, sizeof o, "{\"type\": \"adamw\", \"lr\": %s, \"beta1\": 0.9, \"beta2\": 0.999, "
                        "\"eps\": 1e-8, \"weight_decay\": 0.01, \"clip_grad\": 1, \"step\": 3}", lr);
  return o;
}

/* What mpu_optimizer_init said of the options given (one rank). */
static char adamw_refusal[256];

static mpu_result_t optimizer_from(mpu_comm *world, void *arg) {
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  mpu_optimizer opt;
  memset(&opt, 0, sizeof opt);
  mpu_result_t r = mpu_param_buffer_add(&b, "w", 4, MPU_PARAM_DUPLICATE, NULL);
  if (!r) r = mpu_param_buffer_finalize(&b, NULL, NULL);
  if (!r) r = mpu_optimizer_init(&opt, &b, world, 0, arg);
  snprintf(adamw_refusal, sizeof adamw_refusal, "%s", r ? mpu_last_error() : "taken");
  mpu_optimizer_free(&opt);
  mpu_param_buffer_free(&b);
  return MPU_SUCCESS;
}

static void test_numbers(void **state) {
  (void)state;
  write_plain(dir_a, 1);
  expect_ok(dir_a);
  /* 1e-3 written with 70 zeros: a literal longer than 63 characters is read whole */
  char lr[128] = "1.";
  memset(lr + 2, '0', 70);
  snprintf(lr + 72, sizeof lr - 72, "e-3");
  write_ckpt(dir_a, 1, adamw(lr), "{}", whole);
  mpu_ckpt *ck = NULL;
  assert_int_equal(mpu_ckpt_open(dir_a, &ck), 0);
  mpu_ckpt_info in;
  assert_int_equal(mpu_ckpt_get_info(ck, &in), 0);
  assert_true(in.has_adamw);
  assert_true(in.adamw.lr == 1e-3f);
  mpu_ckpt_free(ck);
  /* numbers no optimizer takes: infinite (1e999), past a float, negative, beta of 1 */
  write_ckpt(dir_a, 1, adamw("1e999"), "{}", whole);
  expect_refused(dir_a, "index.json", "lr");
  write_ckpt(dir_a, 1, adamw("1e39"), "{}", whole);
  expect_refused(dir_a, "index.json", "lr");
  /* a negative lr is a number an index holds: the checkpoint gives back what was saved, and
   * the optimizer's range is checked where an optimizer is made from it */
  write_ckpt(dir_a, 1, adamw("-0.1"), "{}", whole);
  assert_int_equal(mpu_ckpt_open(dir_a, &ck), 0);
  assert_int_equal(mpu_ckpt_get_info(ck, &in), 0);
  mpu_ckpt_free(ck);
  assert_true(in.has_adamw && in.adamw.lr == -0.1f);
  assert_int_equal(mpu_launch(1, optimizer_from, &in.adamw, NULL, NULL), 0);
  assert_non_null(strstr(adamw_refusal, "lr -0.1 out of range"));
  /* a layout of tp 0 was never saved */
  write_plain(dir_a, 1);
  patch_index(dir_a, "\"tp\": 1", "\"tp\": 0");
  expect_refused(dir_a, "index.json", "layout");
  /* a CRC-32 is 8 hex digits, not what strtoul also takes */
  char bad[512];
  snprintf(bad, sizeof bad, "%s", whole);
  char *crc = strstr(bad, "\"crc32\": \"") + 10;
  memcpy(crc, "0x", 2);
  write_ckpt(dir_a, 1, "null", "{}", bad);
  expect_refused(dir_a, "'x'", "crc32");
  /* 33 metadata pairs: a set holds 32, and a load would drop the rest without a word */
  char meta[2048] = "{";
  for (int i = 0; i < 33; i++)
    snprintf(meta + strlen(meta), sizeof meta - strlen(meta), "%s\"k%d\": \"v\"", i ? ", " : "", i);
  strcat(meta, "}");
  write_ckpt(dir_a, 1, "null", meta, whole);
  expect_refused(dir_a, "index.json", "metadata");
  char longval[200];
  snprintf(longval, sizeof longval, "{\"k\": \"%070d\"}", 7);
  write_ckpt(dir_a, 1, "null", longval, whole);
  expect_refused(dir_a, "index.json", "metadata");
}

/* ---- pieces ---------------------------------------------------------------------------- */

static void test_piece_overflow(void **state) {
  (void)state;
  char p[512] = "";
  piece(p, sizeof p, INT64_MAX - 1, 0, 4, 4, 0, N, 0); /* offset + length wraps below 4 */
  write_ckpt(dir_a, 1, "null", "{}", p);
  expect_refused(dir_a, "'x'", "leaves the tensor");
  p[0] = '\0';
  piece(p, sizeof p, 0, 0, INT64_MAX, 4, 0, N, 0);
  write_ckpt(dir_a, 1, "null", "{}", p);
  expect_refused(dir_a, "'x'", "leaves the tensor");
}

static void test_tiling(void **state) {
  (void)state;
  char p[1024] = "";
  /* rows 0-2 and row 1: 16 elements, row 1 twice and row 3 never */
  piece(p, sizeof p, 0, 0, 3, 4, 0, 12, 0);
  piece(p, sizeof p, 1, 0, 1, 4, 0, 4, 48);
  write_ckpt(dir_a, 1, "null", "{}", p);
  expect_refused(dir_a, "'x'", "overlap");
  /* spans of boxes: the first 10 elements of the whole, then elements 2..8 of the box of
   * rows 2-3 (global 10..15): a tiling */
  p[0] = '\0';
  piece(p, sizeof p, 0, 0, 4, 4, 0, 10, 0);
  piece(p, sizeof p, 2, 0, 2, 4, 2, 8, 40);
  write_ckpt(dir_a, 1, "null", "{}", p);
  expect_ok(dir_a);
  /* elements 1..7 of that box (global 9..14): 9 twice, 15 never */
  p[0] = '\0';
  piece(p, sizeof p, 0, 0, 4, 4, 0, 10, 0);
  piece(p, sizeof p, 2, 0, 2, 4, 1, 7, 36);
  write_ckpt(dir_a, 1, "null", "{}", p);
  expect_refused(dir_a, "'x'", "overlap");
  /* columns: 4x2 boxes side by side tile; a 4x2 and a 4x3 overlap in column 2 ... */
  p[0] = '\0';
  piece(p, sizeof p, 0, 0, 4, 2, 0, 8, 0);
  piece(p, sizeof p, 0, 2, 4, 2, 0, 8, 32);
  write_ckpt(dir_a, 1, "null", "{}", p);
  expect_ok(dir_a);
  p[0] = '\0'; /* ... and, cut to 16 elements, leave column 3 short */
  piece(p, sizeof p, 0, 0, 4, 2, 0, 8, 0);
  piece(p, sizeof p, 0, 1, 4, 3, 4, 12, 32);
  write_ckpt(dir_a, 1, "null", "{}", p);
  expect_refused(dir_a, "'x'", "overlap");
}

/* merge named the tensor '' when its pieces did not hold every element once */
static void test_merge_names_tensor(void **state) {
  (void)state;
  char p[1024] = "";
  piece(p, sizeof p, 0, 0, 3, 4, 0, 12, 0);
  piece(p, sizeof p, 1, 0, 1, 4, 0, 4, 48);
  write_ckpt(dir_a, 1, "null", "{}", p);
  char out[300];
  snprintf(out, sizeof out, "%s.safetensors", dir_a);
  mpu_ckpt *ck = NULL;
  mpu_result_t r = mpu_ckpt_open(dir_a, &ck);
  if (!r) r = mpu_ckpt_merge(ck, out, 0);
  mpu_ckpt_free(ck);
  assert_int_not_equal(r, MPU_SUCCESS);
  if (!strstr(mpu_last_error(), "'x'")) fail_msg("'%s' does not name 'x'", mpu_last_error());
  unlink(out);
}

/* ---- ranks that opened different checkpoints ------------------------------------------- */

static float loaded[2][N];
static mpu_result_t load_results[2];

static mpu_result_t load_rank(mpu_comm *world, void *arg) {
  (void)arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_ckpt *ck = NULL;
  mpu_result_t r = mpu_ckpt_open(rank ? dir_b : dir_a, &ck);
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  int64_t shape[2] = {4, 4}, local[2];
  mpu_ckpt_box box;
  int n;
  mpu_ckpt_span sp = {0, N, loaded[rank]};
  if (!r) r = mpu_ckpt_partition(2, shape, MPU_PARAM_DUPLICATE, 1, 0, local, &box, &n);
  if (!r) r = mpu_ckpt_add(&set, "x", MPU_CKPT_PARAM, 2, shape, local, &box, 1, &sp, 1, &sp, 1);
  load_results[rank] = mpu_ckpt_load(r ? NULL : ck, world, &set);
  mpu_ckpt_set_free(&set);
  mpu_ckpt_free(ck);
  return MPU_SUCCESS;
}

static void run_two(void) {
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < N; i++) loaded[r][i] = -1;
  assert_int_equal(mpu_launch(2, load_rank, NULL, NULL, NULL), 0);
}

static void test_different_checkpoints(void **state) {
  (void)state;
  write_plain(dir_a, 100);
  write_plain(dir_b, 100); /* the same index: loads */
  run_two();
  assert_int_equal(load_results[0], 0);
  assert_int_equal(load_results[1], 0);
  assert_true(loaded[1][7] == 7.0f);
  write_plain(dir_b, 200); /* step 100 on rank 0, step 200 on rank 1 */
  run_two();
  for (int r = 0; r < 2; r++) {
    assert_int_equal(load_results[r], MPU_ERR_MISMATCH);
    for (int i = 0; i < N; i++) assert_true(loaded[r][i] == -1.0f); /* nothing changed */
  }
  write_ckpt(dir_b, 100, adamw("0.001"), "{}", whole); /* the same step, another index */
  run_two();
  assert_int_equal(load_results[0], MPU_ERR_MISMATCH);
  assert_int_equal(load_results[1], MPU_ERR_MISMATCH);
}

/* ---- what merge may write -------------------------------------------------------------- */

static mpu_result_t merge_to(const char *out) {
  mpu_ckpt *ck = NULL;
  mpu_result_t r = mpu_ckpt_open(dir_a, &ck);
  if (!r) r = mpu_ckpt_merge(ck, out, 1);
  mpu_ckpt_free(ck);
  return r;
}

static void test_merge_outputs(void **state) {
  (void)state;
  write_plain(dir_a, 5);
  char path[300], fifo[300], link[300];
  /* the checkpoint's own index and piece file: refused, the checkpoint intact */
  snprintf(path, sizeof path, "%s/index.json", dir_a);
  assert_int_equal(merge_to(path), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "reads"));
  snprintf(path, sizeof path, "%s/r.bin", dir_a);
  assert_int_equal(merge_to(path), MPU_ERR_INVALID_ARGUMENT);
  snprintf(link, sizeof link, "%s/link", dir_b); /* a link to the index is the index */
  mkdir(dir_b, 0755);
  char target[300];
  snprintf(target, sizeof target, "../%s/index.json", dir_a);
  assert_int_equal(symlink(target, link), 0);
  assert_int_equal(merge_to(link), MPU_ERR_INVALID_ARGUMENT);
  expect_ok(dir_a);
  /* a FIFO (as /dev/full is a device): never replaced by a regular file */
  snprintf(fifo, sizeof fifo, "%s/fifo", dir_b);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(merge_to(fifo), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "FIFO"));
  struct stat st;
  assert_int_equal(lstat(fifo, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
  assert_int_equal(merge_to(dir_b), MPU_ERR_INVALID_ARGUMENT); /* a directory */
  /* a new file, and over a regular one: written (through out.tmp, gone after) */
  snprintf(path, sizeof path, "%s/out.safetensors", dir_b);
  assert_int_equal(merge_to(path), 0);
  assert_int_equal(merge_to(path), 0);
  assert_int_equal(stat(path, &st), 0);
  assert_true(S_ISREG(st.st_mode) && st.st_size > (off_t)sizeof file_data);
  snprintf(path, sizeof path, "%s/out.safetensors.tmp", dir_b);
  assert_int_equal(access(path, F_OK), -1);
}

/* an index that is a FIFO is refused at once (opening it waited for a writer forever) */
static void test_index_fifo(void **state) {
  (void)state;
  write_plain(dir_a, 5);
  char index[300];
  snprintf(index, sizeof index, "%s/index.json", dir_a);
  unlink(index);
  assert_int_equal(mkfifo(index, 0600), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(20); /* the old hang ends as a failure, not as a stuck test */
    mpu_result_t r = open_close(dir_a);
    _exit(r == MPU_ERR_INVALID_ARGUMENT && strstr(mpu_last_error(), "FIFO") ? 0 : 1);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  unlink(index);
}

/* ---- size arithmetic of the descriptions ----------------------------------------------- */

static void test_sizes(void **state) {
  (void)state;
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  float mem[4];
  mpu_ckpt_span sp = {0, 4, mem};
  int64_t shape[1] = {4}, local[1] = {4};
  mpu_ckpt_box box;
  memset(&box, 0, sizeof box);
  box.length[0] = 4;
  box.global_offset[0] = INT64_MAX - 1; /* + 4 wraps below 4 */
  assert_int_equal(mpu_ckpt_add(&set, "a", MPU_CKPT_PARAM, 1, shape, local, &box, 1, &sp, 1, NULL, 0),
                   MPU_ERR_INVALID_ARGUMENT);
  box.global_offset[0] = 0, box.local_offset[0] = INT64_MAX - 1;
  assert_int_equal(mpu_ckpt_add(&set, "a", MPU_CKPT_PARAM, 1, shape, local, &box, 1, &sp, 1, NULL, 0),
                   MPU_ERR_INVALID_ARGUMENT);
  /* 2^40 in each of 4 dims: 2^160 elements, which wrapped to 0 in 64 bits */
  int64_t big[4] = {1LL << 40, 1LL << 40, 1LL << 40, 1LL << 40};
  mpu_ckpt_box bb;
  memset(&bb, 0, sizeof bb);
  memcpy(bb.length, big, sizeof big);
  assert_int_equal(mpu_ckpt_add(&set, "b", MPU_CKPT_PARAM, 4, big, big, &bb, 1, NULL, 0, NULL, 0),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(set.n, 0);
  mpu_ckpt_set_free(&set);
  /* pp x vp past INT_MAX: 65536 x 65536 wrapped to 0 and divided by it */
  int first = -1, count = -1;
  assert_int_equal(mpu_ckpt_chunk_layers(8, 65536, 65536, 0, 0, &first, &count), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_ckpt_chunk_layers(INT_MAX, 65537, 65537, 65536, 65536, &first, &count),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_ckpt_chunk_layers(1 << 30, 1 << 15, 1 << 15, (1 << 15) - 1, (1 << 15) - 1,
                                         &first, &count), 0);
  assert_true(count == 1 && first == (1 << 30) - 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_numbers),
      cmocka_unit_test(test_piece_overflow),
      cmocka_unit_test(test_tiling),
      cmocka_unit_test(test_merge_names_tensor),
      cmocka_unit_test(test_different_checkpoints),
      cmocka_unit_test(test_merge_outputs),
      cmocka_unit_test(test_index_fifo),
      cmocka_unit_test(test_sizes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
