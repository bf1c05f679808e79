/*
 * test_ckpt_root.c - a checkpoint root (mpu/checkpoint.h) as Megatron-LM
 * lays it out: which folder a root means (the tracker, the highest complete
 * iteration, a folder given directly), a save that clears what killed saves
 * left but never through a link, one save at a time (the root's lock), and
 * a merge that never writes over the tracker that chose its folder.
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

/* ---- which folder a root means ------------------------------------------------------------ */

static void touch(const char *dir, const char *name, const char *text) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void expect_latest(const char *dir, const char *want) {
  char got[600], path[600];
  assert_int_equal(mpu_ckpt_latest(dir, got, sizeof got), 0);
  snprintf(path, sizeof path, "%s%s", dir, want);
  if (strcmp(got, path)) fail_msg("%s means '%s', not '%s'", dir, got, path);
}

static void test_latest(void **state) {
  (void)state;
  char dir[256], sub[400];
  make_dir("latest", dir, sizeof dir);
  expect_latest(dir, ""); /* nothing there: the folder itself (open then says why) */
  assert_int_equal(mkdir(dir, 0755), 0);
  touch(dir, "index.json", "{}"); /* saved before roots: the folder itself */
  expect_latest(dir, "");
  const char *iters[] = {"iter_0000010", "iter_0000020", "iter_0000030", "iter_0000040.tmp",
                         "iter_0000050", "iter_x"};
  for (int i = 0; i < 6; i++) {
    snprintf(sub, sizeof sub, "%s/%s", dir, iters[i]);
    assert_int_equal(mkdir(sub, 0755), 0);
    if (i != 4) touch(sub, "index.json", "{}"); /* 50 did not finish */
  }
  expect_latest(dir, "/iter_0000030"); /* no tracker: the highest complete iteration */
  touch(dir, "latest_checkpointed_iteration.txt", "20\n");
  expect_latest(dir, "/iter_0000020"); /* the tracker, as Megatron-LM */
  touch(dir, "latest_checkpointed_iteration.txt", "50");
  expect_latest(dir, "/iter_0000030"); /* it names a folder without an index */
  touch(dir, "latest_checkpointed_iteration.txt", "-20");
  expect_latest(dir, "/iter_0000030");
  touch(dir, "latest_checkpointed_iteration.txt", "99999999999999999999999");
  expect_latest(dir, "/iter_0000030");
  snprintf(sub, sizeof sub, "%s/latest_checkpointed_iteration.txt", dir);
  assert_int_equal(unlink(sub), 0);
  assert_int_equal(mkfifo(sub, 0644), 0); /* read without blocking, and refused */
  expect_latest(dir, "/iter_0000030");
  snprintf(sub, sizeof sub, "%s/iter_0000010", dir);
  expect_latest(sub, ""); /* one iteration's folder given directly */
  char small[8];
  assert_int_equal(mpu_ckpt_latest(dir, small, sizeof small), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_ckpt_latest(NULL, small, sizeof small), MPU_ERR_INVALID_ARGUMENT);
  remove_dir(dir);
}

/* A save clears what killed saves left (iter_N.tmp folders), never through a
 * link of that name: the folder it points to keeps its files. */
static void test_stage_link(void **state) {
  (void)state;
  char dir[256], other[256], link[600], kept[600];
  make_dir("stage_link", dir, sizeof dir);
  make_dir("stage_link_other", other, sizeof other);
  assert_int_equal(mkdir(other, 0755), 0);
  touch(other, "keep.txt", "mine");
  mpu_ckpt_set set;
  one_rank_set(&set, "b", 6);
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  snprintf(link, sizeof link, "%s/iter_0000009.tmp", dir);
  char target[600];
  snprintf(target, sizeof target, "../%s", other);
  assert_int_equal(symlink(target, link), 0);
  set.step = 1;
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  mpu_ckpt_set_free(&set);
  snprintf(kept, sizeof kept, "%s/keep.txt", other);
  struct stat st;
  if (stat(kept, &st)) fail_msg("a save removed %s through the link %s", kept, link);
  expect_latest(dir, "/iter_0000001");
  remove_dir(dir);
  remove_dir(other);
}

/* Two saves into one root: the second is refused while the first runs
 * (whose folder in the making it would otherwise take for a killed save's
 * and empty, so that the first "succeeds" with files missing). */
static void test_save_lock(void **state) {
  (void)state;
  char dir[256], stage[400], file[500];
  make_dir("save_lock", dir, sizeof dir);
  mpu_ckpt_set set;
  one_rank_set(&set, "b", 6);
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  int fd = open(dir, O_RDONLY | O_DIRECTORY); /* another save, running */
  assert_true(fd >= 0);
  assert_int_equal(flock(fd, LOCK_EX), 0);
  snprintf(stage, sizeof stage, "%s/iter_0000007.tmp", dir);
  assert_int_equal(mkdir(stage, 0755), 0);
  touch(stage, "rank00000.safetensors", "being written");
  set.step = 1;
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), MPU_ERR_INVALID_USAGE);
  if (!strstr(mpu_last_error(), "another save")) fail_msg("'%s'", mpu_last_error());
  struct stat st;
  snprintf(file, sizeof file, "%s/rank00000.safetensors", stage);
  assert_int_equal(stat(file, &st), 0); /* the running save's file is untouched */
  expect_latest(dir, "/iter_0000000");
  close(fd); /* it ended (or was killed): the next save goes ahead and clears its folder */
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  mpu_ckpt_set_free(&set);
  assert_int_not_equal(stat(stage, &st), 0);
  expect_latest(dir, "/iter_0000001");
  remove_dir(dir);
}

/* The tracker that chose the folder is an input of the merge: never its
 * output (written over, the root would mean its newest iteration instead of
 * the one the tracker named). */
static void test_merge_tracker(void **state) {
  (void)state;
  char dir[256], tracker[400];
  make_dir("merge_tracker", dir, sizeof dir);
  mpu_ckpt_set set;
  one_rank_set(&set, "b", 6);
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  set.step = 5;
  assert_int_equal(mpu_ckpt_save(dir, NULL, &set), 0);
  mpu_ckpt_set_free(&set);
  touch(dir, "latest_checkpointed_iteration.txt", "0\n"); /* rolled back, as Megatron-LM users do */
  snprintf(tracker, sizeof tracker, "%s/latest_checkpointed_iteration.txt", dir);
  mpu_ckpt *ck;
  assert_int_equal(mpu_ckpt_open(dir, &ck), 0);
  assert_int_equal(mpu_ckpt_merge(ck, tracker, 0), MPU_ERR_INVALID_ARGUMENT);
  if (!strstr(mpu_last_error(), "reads")) fail_msg("'%s'", mpu_last_error());
  mpu_ckpt_free(ck);
  expect_latest(dir, "/iter_0000000");
  remove_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_latest),
      cmocka_unit_test(test_stage_link),
      cmocka_unit_test(test_save_lock),
      cmocka_unit_test(test_merge_tracker),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
