/*
 * test_ckpt_refusals.c - what a distributed checkpoint (mpu/checkpoint.h)
 * must refuse: a load whose set and checkpoint differ (a tensor missing or
 * extra, another shape), a corrupted or truncated piece, an index that is
 * missing or not JSON, each naming the tensor and the file and leaving the
 * caller's memory as it was; descriptions that do not fit when added; and a
 * save whose index the loader would refuse (a NaN lr, a negative step, a
 * layout out of range, too many metadata pairs), refused on every rank
 * before anything is written.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"
#include "ckpt_helpers.h"

/* ---- what must fail --------------------------------------------------------------------- */

static void expect_failure(const char *dir, mpu_ckpt_set *set, const char *w1, const char *w2) {
  for (int i = 0; i < 12; i++) one_a[i] = -1.0f;
  for (int i = 0; i < 6; i++) one_b[i] = -1.0f;
  mpu_ckpt *ck = NULL;
  mpu_result_t r = mpu_ckpt_open(dir, &ck);
  if (!r) r = mpu_ckpt_load(ck, NULL, set);
  mpu_ckpt_free(ck);
  assert_int_not_equal(r, MPU_SUCCESS);
  const char *msg = mpu_last_error();
  if (!strstr(msg, w1) || (w2 && !strstr(msg, w2))) fail_msg("'%s' lacks '%s' / '%s'", msg, w1, w2 ? w2 : "");
  for (int i = 0; i < 12; i++) assert_true(one_a[i] == -1.0f); /* nothing changed */
  for (int i = 0; i < 6; i++) assert_true(one_b[i] == -1.0f);
}

static void patch(const char *path, long at, const void *bytes, size_t n) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, at, SEEK_SET);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
}

static void test_refusals(void **state) {
  (void)state;
  char dir[256], folder[300], file[400];
  make_dir("refusals", dir, sizeof dir);
  mpu_ckpt_set set;
  one_rank_set(&set, "b", 6);
  for (int i = 0; i < 12; i++) one_a[i] = (float)i;
  for (int i = 0; i < 6; i++) one_b[i] = 100.0f + (float)i;
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  mpu_ckpt_set_free(&set);
  snprintf(folder, sizeof folder, "%s/iter_0000000", dir); /* step 0 */
  snprintf(file, sizeof file, "%s/rank00000.safetensors", folder);

  one_rank_set(&set, "c", 6); /* c is missing, b is extra */
  expect_failure(dir, &set, "'c'", "missing");
  mpu_ckpt_set_free(&set);
  one_rank_set(&set, NULL, 0); /* the checkpoint's b is not in the model */
  expect_failure(dir, &set, "'b'", "rank00000.safetensors");
  set.strict = 0; /* unless asked to load part of it */
  mpu_ckpt *ck;
  assert_int_equal(mpu_ckpt_open(dir, &ck), 0);
  assert_int_equal(mpu_ckpt_load(ck, NULL, &set), 0);
  assert_true(one_a[5] == 5.0f);
  mpu_ckpt_free(ck);
  mpu_ckpt_set_free(&set);
  one_rank_set(&set, "b", 5); /* shape */
  expect_failure(dir, &set, "'b'", "[6]");
  mpu_ckpt_set_free(&set);

  one_rank_set(&set, "b", 6);
  /* a corrupted piece: one byte of b's data (the last 24 bytes of the file) */
  struct stat st;
  assert_int_equal(stat(file, &st), 0);
  unsigned char x = 0x5a;
  patch(file, (long)st.st_size - 7, &x, 1);
  expect_failure(dir, &set, "'b'", "rank00000.safetensors");
  assert_non_null(strstr(mpu_last_error(), "corrupted"));
  /* a truncated file */
  assert_int_equal(truncate(file, st.st_size - 4), 0);
  expect_failure(dir, &set, "rank00000.safetensors", "truncated");
  /* no index: a save that did not finish */
  char index[400];
  snprintf(index, sizeof index, "%s/index.json", folder);
  assert_int_equal(unlink(index), 0);
  expect_failure(dir, &set, "index.json", "did not finish");
  /* an index that is not JSON */
  FILE *f = fopen(index, "w");
  fputs("{\"format\": \"mpu-checkpoint\", \"version\": 1,", f);
  fclose(f);
  expect_failure(dir, &set, "index.json", "JSON");
  mpu_ckpt_set_free(&set);

  /* bad descriptions are refused when added */
  mpu_ckpt_set_init(&set);
  int64_t s24[2] = {24, 5}, local[2];
  mpu_ckpt_box boxes[MPU_CKPT_MAX_BOXES];
  int n;
  assert_int_equal(mpu_ckpt_partition(2, s24, MPU_PARAM_PARTITIONED(0, 3), 5, 0, local, boxes, &n),
                   MPU_ERR_INVALID_ARGUMENT); /* 5 x 3 does not divide 24 */
  assert_int_equal(mpu_ckpt_partition(2, s24, MPU_PARAM_PARTITIONED(0, 3), 2, 1, local, boxes, &n), 0);
  assert_int_equal(n, 3);
  assert_true(local[0] == 12 && boxes[2].local_offset[0] == 8 && boxes[2].global_offset[0] == 20);
  mpu_ckpt_span sp = {0, 60, one_a};
  assert_int_equal(mpu_ckpt_add(&set, "bad name", MPU_CKPT_PARAM, 2, s24, local, boxes, n, &sp, 1, NULL, 0),
                   MPU_ERR_INVALID_ARGUMENT);
  mpu_ckpt_span past = {0, 61, one_a};
  assert_int_equal(mpu_ckpt_add(&set, "w", MPU_CKPT_PARAM, 2, s24, local, boxes, n, &past, 1, NULL, 0),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_ckpt_add(&set, "w", MPU_CKPT_PARAM, 2, s24, local, boxes, 2, &sp, 1, NULL, 0),
                   MPU_ERR_INVALID_ARGUMENT); /* the boxes do not cover the local tensor */
  int first, count;
  assert_int_equal(mpu_ckpt_chunk_layers(8, 2, 2, 1, 1, &first, &count), 0);
  assert_true(first == 6 && count == 2); /* virtual stage 1 x 2 + 1 = 3 */
  assert_int_equal(mpu_ckpt_chunk_layers(6, 2, 2, 0, 0, &first, &count), MPU_ERR_INVALID_ARGUMENT);
  mpu_ckpt_set_free(&set);
  remove_dir(dir);
}

/* ---- saves that could never be loaded are refused before anything is written ---------- */

/* the set one_rank_set gives, with one field spoiled by how */
static void spoil(mpu_ckpt_set *set, int how) {
  set->has_adamw = 1, set->adamw = (mpu_adamw_options)MPU_ADAMW_OPTIONS_INIT;
  switch (how) {
  case 0: set->adamw.lr = NAN; break;
  case 1: set->adamw.clip_grad = INFINITY; break;
  case 2: set->step = -1; break;
  case 3: set->optimizer_step = -5; break;
  case 4: set->layout.tp = 1 << 25; break;
  case 5: set->layout.dp = -1; break;
  case 6: set->n_meta = MPU_CKPT_META_MAX + 1; break;
  case 7: set->n_meta = -1; break;
  case 8: memset(set->layout.flavor, 'x', sizeof set->layout.flavor); break;
  case 9: /* a key twice: JSON objects hold each once */
    mpu_ckpt_set_meta(set, "k", "1");
    mpu_ckpt_set_meta(set, "j", "2");
    set->meta[1][0][0] = 'k';
    break;
  case 10: /* a value without its NUL */
    mpu_ckpt_set_meta(set, "k", "1");
    memset(set->meta[0][1], 'v', sizeof set->meta[0][1]);
    break;
  case 11: set->layout.pp = 0; break; /* a size the loader refuses: one rule for both */
  }
}

static const char *const spoiled[] = {"lr",     "clip_grad", "step -1", "optimizer step",
                                      "tp",     "dp",        "33 metadata", "-1 metadata",
                                      "flavor", "twice",     "too long", "pp 0"};
enum { NSPOILED = sizeof spoiled / sizeof *spoiled };

typedef struct refusal_job {
  const char *dir;
  mpu_result_t r[2];
  char msg[2][512];
} refusal_job;

/* rank 1's set is spoiled (lr NaN), or (r->dir ending in "steps") the ranks save different steps */
static mpu_result_t refused_rank(mpu_comm *world, void *arg) {
  refusal_job *j = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_ckpt_set set;
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {8}, local[1] = {4};
  mpu_ckpt_box box;
  memset(&box, 0, sizeof box);
  box.global_offset[0] = 4 * rank, box.length[0] = 4;
  mpu_ckpt_span sp = {0, 4, x};
  mpu_ckpt_set_init(&set);
  mpu_result_t r = mpu_ckpt_add(&set, "x", MPU_CKPT_PARAM, 1, shape, local, &box, 1, &sp, 1, &sp, 1);
  set.layout.dp = 2; /* no state here to take the layout from */
  int steps = strstr(j->dir, "steps") != NULL;
  if (steps) set.step = 5 + rank;
  else if (rank == 1) spoil(&set, 0);
  if (!r) r = mpu_ckpt_save(j->dir, world, &set);
  j->r[rank] = r;
  snprintf(j->msg[rank], sizeof j->msg[rank], "%s", mpu_last_error());
  mpu_ckpt_set_free(&set);
  return MPU_SUCCESS;
}

static void test_save_refusals(void **state) {
  (void)state;
  char dir[256];
  struct stat st;
  make_dir("unloadable", dir, sizeof dir);
  for (int how = 0; how < NSPOILED; how++) {
    mpu_ckpt_set set;
    one_rank_set(&set, "b", 6);
    spoil(&set, how);
    mpu_result_t r = mpu_ckpt_save(dir, NULL, &set);
    mpu_ckpt_set_free(&set);
    if (r != MPU_ERR_INVALID_ARGUMENT || !strstr(mpu_last_error(), spoiled[how]))
      fail_msg("spoiled %d: %s: '%s' lacks '%s'", how, mpu_result_name(r), mpu_last_error(), spoiled[how]);
    assert_int_equal(stat(dir, &st), -1); /* nothing written, not even the folder */
  }
  /* one rank's set: every rank refuses, the others naming it */
  refusal_job j = {dir, {0, 0}, {"", ""}};
  assert_int_equal(mpu_launch(2, refused_rank, &j, NULL, NULL), MPU_SUCCESS);
  assert_int_equal(j.r[1], MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(j.msg[1], "lr"));
  assert_int_equal(j.r[0], MPU_ERR_ABORTED);
  if (!strstr(j.msg[0], "rank 1")) fail_msg("'%s' does not name rank 1", j.msg[0]);
  assert_int_equal(stat(dir, &st), -1);
  /* ranks that save different steps */
  char steps[300];
  snprintf(steps, sizeof steps, "%s_steps", dir);
  j.dir = steps;
  assert_int_equal(mpu_launch(2, refused_rank, &j, NULL, NULL), MPU_SUCCESS);
  assert_int_equal(j.r[0], MPU_ERR_MISMATCH);
  assert_int_equal(j.r[1], MPU_ERR_MISMATCH);
  if (!strstr(j.msg[0], "step 6")) fail_msg("'%s' does not name step 6", j.msg[0]);
  assert_int_equal(stat(steps, &st), -1);
  /* what a loader reads back of a good one: the same hyper-parameters */
  mpu_ckpt_set set;
  one_rank_set(&set, "b", 6);
  spoil(&set, -1);
  set.adamw.lr = 1.0000001e-3f, set.optimizer_step = 3, set.step = 4;
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  mpu_ckpt *ck = NULL;
  mpu_ckpt_info in;
  assert_int_equal(mpu_ckpt_open(dir, &ck), 0);
  assert_int_equal(mpu_ckpt_get_info(ck, &in), 0);
  assert_true(in.adamw.lr == set.adamw.lr && in.optimizer_step == 3 && in.step == 4);
  mpu_ckpt_free(ck);
  /* the same step again: the new folder takes the old one's place, no *.tmp is left */
  for (int i = 0; i < 12; i++) one_a[i] = 50.0f + (float)i;
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  for (int i = 0; i < 12; i++) one_a[i] = -1.0f;
  assert_int_equal(mpu_ckpt_open(dir, &ck), 0);
  assert_int_equal(mpu_ckpt_load(ck, NULL, &set), 0);
  assert_true(one_a[11] == 61.0f);
  mpu_ckpt_free(ck);
  char tmp[400];
  snprintf(tmp, sizeof tmp, "%s/iter_0000004.tmp", dir);
  assert_int_equal(stat(tmp, &st), -1);
  mpu_ckpt_set_free(&set);
  remove_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_save_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
