/*
 * test_lifecycle.c - set up and tear down worlds, groups and fake
 * communicators many times in one process. Run plain it checks that no thread
 * is left behind and memory does not grow; ctest also runs it under valgrind
 * (fewer cycles), which checks that nothing leaks, including what a rank left
 * behind: undestroyed groups and messages never received.
 *
 * Usage: test_lifecycle [cycles]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpu.h"

static long status_field(const char *name) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t len = strlen(name);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, name, len)) v = strtol(line + len, NULL, 10);
  if (f) fclose(f);
  return v;
}

static mpu_result_t one_cycle(mpu_comm *world, void *arg) {
  (void)arg;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  mpu_comm *half = NULL, *kept = NULL;
  mpu_result_t r = mpu_comm_split(world, rank % 2, rank, &half);
  if (r) return r;
  double x[4096] = {0}, y[4096];
  x[0] = rank;
  if ((r = mpu_comm_all_reduce(half, x, y, 4096, MPU_FLOAT64, MPU_SUM))) return r;
  if ((r = mpu_comm_all_reduce(world, x, y, 16, MPU_FLOAT64, MPU_MAX))) return r;
  if (y[0] != n - 1) return MPU_ERR_INTERNAL;
  /* leave a group undestroyed and a message unreceived: the launcher frees both */
  if ((r = mpu_comm_split(world, 0, 0, &kept))) return r;
  if ((r = mpu_comm_send(world, x, 64, MPU_FLOAT64, (rank + 1) % n))) return r;
  if ((r = mpu_comm_barrier(kept))) return r;
  return mpu_comm_destroy(half);
}

static mpu_result_t state_cycle(mpu_state *s, void *arg) {
  (void)arg;
  mpu_comm *tp;
  double x = 1, y;
  mpu_result_t r = mpu_state_comm(s, MPU_GROUP_TP, &tp);
  return r ? r : mpu_comm_all_reduce(tp, &x, &y, 1, MPU_FLOAT64, MPU_SUM);
}

int main(int argc, char **argv) {
  int cycles = argc > 1 ? atoi(argv[1]) : 300;
  long rss_after_warmup = 0, threads_before = 0;
  for (int i = 0; i < cycles; i++) {
    mpu_result_t r = mpu_launch(1 + i % 4, one_cycle, NULL, NULL, NULL);
    if (r) {
      fprintf(stderr, "cycle %d: %s: %s\n", i, mpu_result_name(r), mpu_last_error());
      return 1;
    }
    /* a parallel state on thread ranks and a mocked one, set up and torn down */
    mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
    cfg.tp = 2;
    if (mpu_with_state(4, &cfg, (uint64_t)i, state_cycle, NULL, NULL, NULL)) {
      fprintf(stderr, "cycle %d: with-state: %s\n", i, mpu_last_error());
      return 1;
    }
    mpu_state *mock;
    cfg.world_size = 4096;
    cfg.pp = 4;
    if (mpu_state_mock(i % 4096, &cfg, 42, &mock)) return 1;
    mpu_state_destroy(mock);
    mpu_comm *f, *g;
    int members[2] = {7, 8};
    if (mpu_comm_fake_create(7, 4096, &f) || mpu_comm_create_group(f, members, 2, &g)) return 1;
    mpu_comm_destroy(g);
    mpu_comm_destroy(f);
    if (i == 0) /* after one launch: a sanitizer's runtime may have started its own thread */
      threads_before = status_field("Threads:");
    if (i == cycles / 4) rss_after_warmup = status_field("VmRSS:");
  }
  long threads = status_field("Threads:"), rss = status_field("VmRSS:");
  printf("%d cycles: %ld thread(s) after the first, %ld after the last; VmRSS %ld kB (%ld kB after warm-up)\n",
         cycles, threads_before, threads, rss, rss_after_warmup);
  if (threads != threads_before) {
    fprintf(stderr, "FAIL: %ld threads after the first launch, %ld after the last\n",
            threads_before, threads);
    return 1;
  }
  /* allocator noise is a few hundred kB; a leak of one group per cycle is more.
   * (Under a sanitizer freed memory sits in quarantine: LeakSanitizer judges.) */
#ifndef MPU_SANITIZED
  if (cycles >= 100 && rss - rss_after_warmup > 4096) {
    fprintf(stderr, "FAIL: memory grew by %ld kB over %d cycles\n", rss - rss_after_warmup,
            cycles * 3 / 4);
    return 1;
  }
#endif
  printf("1 passed, 0 failed\n");
  return 0;
}
