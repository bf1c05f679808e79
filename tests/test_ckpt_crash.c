/*
 * test_ckpt_crash.c - the last complete checkpoint is never lost.
 *
 *   test_ckpt_crash killed   50 saves SIGKILLed at random points: a child
 *                            process saves iteration after iteration into one
 *                            root (two thread ranks) until it is killed; then
 *                            the root must open, verify and load the newest
 *                            save that returned (or the one in flight, if the
 *                            kill came after its rename), every value the
 *                            one that save wrote.
 *   test_ckpt_full           a full disk: a 1 MiB tmpfs in a private mount
 *                            namespace (as scripts/multihost.sh makes its
 *                            namespaces) holds a saved iteration; a ballast
 *                            file leaves 0, 4 KiB, 8 KiB, ... free, and the
 *                            next save must fail with "No space left on
 *                            device" naming its file (a rank file, the index,
 *                            the tracker), leave no folder behind, and the
 *                            root must load the earlier save's values, until
 *                            the space suffices and the save succeeds. Exits
 *                            77 (skipped) where mount namespaces are refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

enum { RANKS = 2, ELEMS = 1 << 14 }; /* each rank's half of one tensor: 64 KiB */

/* element g of the tensor saved at step k: exact in float32 for k < 4096 */
static float value(int64_t k, int64_t g) { return (float)(k * 4096 + g % 4096); }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char root[512];

typedef struct saver {
  int64_t from, count;        /* steps from, from + 1, ... (count 0: forever) */
  volatile int64_t *done;     /* the last step whose save returned (shared with the parent) */
  mpu_result_t r[RANKS];
  char msg[RANKS][512];
} saver;

/* one rank: its half of "x" and the AdamW record, step after step */
static mpu_result_t save_steps(mpu_comm *world, void *arg) {
  saver *s = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  float *data = malloc(ELEMS * sizeof(float));
  if (!data) return MPU_ERR_OUT_OF_MEMORY;
  int64_t shape[1] = {(int64_t)RANKS * ELEMS}, local[1] = {ELEMS};
  mpu_ckpt_box box;
  memset(&box, 0, sizeof box);
  box.global_offset[0] = (int64_t)rank * ELEMS, box.length[0] = ELEMS;
  mpu_result_t r = MPU_SUCCESS;
  for (int64_t k = s->from; !r && (!s->count || k < s->from + s->count); k++) {
    for (int64_t i = 0; i < ELEMS; i++) data[i] = value(k, box.global_offset[0] + i);
    mpu_ckpt_set set;
    mpu_ckpt_set_init(&set);
    mpu_ckpt_span sp = {0, ELEMS, data};
    r = mpu_ckpt_add(&set, "x", MPU_CKPT_PARAM, 1, shape, local, &box, 1, &sp, 1, &sp, 1);
    set.step = k, set.has_adamw = 1, set.adamw = (mpu_adamw_options)MPU_ADAMW_OPTIONS_INIT;
    set.optimizer_step = 2 * k, set.layout.dp = RANKS; /* no state here to take the layout from */
    if (!r) r = mpu_ckpt_save(root, world, &set);
    mpu_ckpt_set_free(&set);
    if (!r && rank == 0 && s->done) __atomic_store_n(s->done, k, __ATOMIC_SEQ_CST);
  }
  s->r[rank] = r;
  snprintf(s->msg[rank], sizeof s->msg[rank], "%s", r ? mpu_last_error() : "");
  free(data);
  return r;
}

/* The root's checkpoint: it opens, every piece's CRC holds, and every
 * value is the one its step wrote; its step. */
static int64_t check_root(float *all) {
  mpu_ckpt *ck = NULL;
  if (mpu_ckpt_open(root, &ck) || mpu_ckpt_verify(ck)) fail_msg("the root is lost: %s", mpu_last_error());
  mpu_ckpt_info in;
  assert_int_equal(mpu_ckpt_get_info(ck, &in), 0);
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  int64_t shape[1] = {(int64_t)RANKS * ELEMS};
  mpu_ckpt_box box;
  memset(&box, 0, sizeof box);
  box.length[0] = shape[0];
  mpu_ckpt_span sp = {0, (size_t)shape[0], all};
  assert_int_equal(mpu_ckpt_add(&set, "x", MPU_CKPT_PARAM, 1, shape, shape, &box, 1, &sp, 1, NULL, 0), 0);
  assert_int_equal(mpu_ckpt_load(ck, NULL, &set), 0);
  for (int64_t g = 0; g < shape[0]; g++)
    if (all[g] != value(in.step, g))
      fail_msg("element %lld is %g, step %lld wrote %g", (long long)g, (double)all[g],
               (long long)in.step, (double)value(in.step, g));
  assert_true(in.has_adamw && in.optimizer_step == 2 * in.step);
  mpu_ckpt_set_free(&set);
  mpu_ckpt_free(ck);
  return in.step;
}

static void remove_tree(const char *dir) {
  char cmd[1100];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* ---- killed saves ------------------------------------------------------------------------ */

enum { KILLS = 50 };

static void test_killed_saves(void **state) {
  (void)state;
  snprintf(root, sizeof root, "test_ckpt_crash_%d", (int)getpid());
  float *all = malloc((size_t)RANKS * ELEMS * sizeof(float));
  volatile int64_t *done = mmap(NULL, sizeof *done, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_non_null(all);
  assert_true(done != MAP_FAILED);
  /* the first save, whole, and how long one takes (the kills fall within two) */
  saver first = {1, 3, done, {0}, {""}};
  double t0 = now();
  assert_int_equal(mpu_launch(RANKS, save_steps, &first, NULL, NULL), MPU_SUCCESS);
  double one = (now() - t0) / 3;
  int64_t found = check_root(all);
  assert_int_equal(found, 3);
  unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  int in_flight = 0, none_returned = 0;
  int64_t saves = 0;
  for (int round = 0; round < KILLS; round++) {
    *done = found;
    saver s = {found + 1, 0, done, {0}, {""}};
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      mpu_launch(RANKS, save_steps, &s, NULL, NULL);
      fprintf(stderr, "the saving child stopped: %s %s\n", s.msg[0], s.msg[1]);
      _exit(3);
    }
    /* anywhere in the first two saves of the child, its start included */
    usleep((useconds_t)(1e6 * 2 * one * (double)rand_r(&seed) / RAND_MAX));
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status)) fail_msg("round %d: the child exited by itself (%d)", round, status);
    int64_t returned = __atomic_load_n(done, __ATOMIC_SEQ_CST);
    int64_t step = check_root(all);
    /* the newest save that returned, or the one after it, renamed before the kill */
    if (step != returned && step != returned + 1)
      fail_msg("round %d: the root holds step %lld; the last save that returned was %lld", round,
               (long long)step, (long long)returned);
    in_flight += step == returned + 1;
    none_returned += returned == found;
    saves += step - found;
    /* the older iterations go, so that the root stays small */
    char old[600];
    for (int64_t k = found; k < step; k++) {
      snprintf(old, sizeof old, "%s/iter_%07lld", root, (long long)k);
      remove_tree(old);
    }
    found = step;
  }
  printf("%d saves killed (one save: %.0f ms): %lld iterations completed, %d kills found the "
         "save in flight already in place, %d kills came before any save of the child returned\n",
         KILLS, 1e3 * one, (long long)saves, in_flight, none_returned);
  munmap((void *)done, sizeof *done);
  free(all);
  remove_tree(root);
}

/* ---- a full disk ------------------------------------------------------------------------- */

static char mnt[256];

/* bytes free on the tmpfs */
static int64_t free_bytes(void) {
  struct statvfs v;
  assert_int_equal(statvfs(mnt, &v), 0);
  return (int64_t)v.f_bavail * (int64_t)v.f_frsize;
}

static void test_full_disk(void **state) {
  (void)state;
  snprintf(root, sizeof root, "%s/ck", mnt);
  float *all = malloc((size_t)RANKS * ELEMS * sizeof(float));
  assert_non_null(all);
  saver s = {1, 1, NULL, {0}, {""}};
  int64_t empty = free_bytes();
  assert_int_equal(mpu_launch(RANKS, save_steps, &s, NULL, NULL), MPU_SUCCESS);
  assert_int_equal(check_root(all), 1);
  int64_t need = empty - free_bytes(); /* what one save takes */
  char ballast[300], stage[600], iter2[600];
  snprintf(ballast, sizeof ballast, "%s/ballast", mnt);
  snprintf(stage, sizeof stage, "%s/iter_0000002.tmp", root);
  snprintf(iter2, sizeof iter2, "%s/iter_0000002", root);
  int failed = 0, named[3] = {0, 0, 0};
  static const char *const files[3] = {".safetensors", "index.json", "latest_checkpointed_iteration.txt"};
  for (int64_t room = 0; room <= need + 16384; room += 4096) {
    int64_t fill = free_bytes() - room;
    if (fill > 0) {
      int fd = open(ballast, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      assert_true(fd >= 0);
      assert_int_equal(posix_fallocate(fd, 0, (off_t)fill), 0);
      close(fd);
    }
    saver next = {2, 1, NULL, {0}, {""}};
    mpu_result_t r = mpu_launch(RANKS, save_steps, &next, NULL, NULL);
    unlink(ballast);
    struct stat st;
    if (!r) { /* room enough: the new save is the root's */
      assert_int_equal(check_root(all), 2);
      break;
    }
    failed++;
    /* every rank fails; one says why, naming the file */
    assert_true(next.r[0] && next.r[1]);
    int why = -1;
    for (int k = 0; k < RANKS; k++)
      if (strstr(next.msg[k], "No space left on device"))
        for (int f = 0; f < 3; f++)
          if (strstr(next.msg[k], files[f])) why = f;
    if (why < 0) fail_msg("room %lld: no rank says which file met the full disk: '%s' / '%s'",
                          (long long)room, next.msg[0], next.msg[1]);
    named[why]++;
    assert_int_equal(stat(stage, &st), -1); /* the failed save's folder is gone */
    /* the earlier save loads, every value as it was written */
    assert_int_equal(check_root(all), 1);
    /* failing at the tracker leaves iteration 2 complete but not named: remove it */
    if (!stat(iter2, &st)) remove_tree(iter2);
  }
  printf("full disk: one save takes %lld bytes; %d saves failed (a rank file %d, the index %d, the "
         "tracker %d) and left iteration 1 loadable\n",
         (long long)need, failed, named[0], named[1], named[2]);
  assert_true(named[0] > 0 && named[1] > 0 && named[2] > 0);
  free(all);
}

/* A private mount namespace with a 1 MiB tmpfs at mnt; 0, or -1 with why. */
static int private_tmpfs(char *why, size_t cap) {
  if (unshare(CLONE_NEWNS)) /* before any thread: a new namespace needs a single-threaded process */
    return snprintf(why, cap, "unshare(CLONE_NEWNS): %s", strerror(errno)), -1;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
    return snprintf(why, cap, "making / private: %s", strerror(errno)), -1;
  snprintf(mnt, sizeof mnt, "test_ckpt_full_XXXXXX");
  if (!mkdtemp(mnt)) return snprintf(why, cap, "mkdtemp: %s", strerror(errno)), -1;
  if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m")) {
    snprintf(why, cap, "mount -t tmpfs: %s", strerror(errno));
    rmdir(mnt);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "full")) {
    char why[512];
    if (private_tmpfs(why, sizeof why)) {
      printf("test_ckpt_full: skipped: a private mount namespace needs root or CAP_SYS_ADMIN (%s)\n", why);
      return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_full_disk)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    return failed;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_killed_saves)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
