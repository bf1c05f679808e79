/*
 * test_gloo_failures.c - what the gloo backend's peers see when a rank
 * fails, one mode per run, each rank a process (gloo_run.sh 4 ... MODE):
 *   timeout   rank 3 never calls: the others' all_reduce fails with
 *             MPU_ERR_TIMEOUT naming rank 3, and their next call at once
 *   abort     rank 1 calls mpu_comm_abort: the others' all_reduce fails
 *             with MPU_ERR_ABORTED naming rank 1
 *   abort_thread  rank 1 aborts from a second thread while its main thread
 *             waits in an all_reduce (rank 3 comes late): that wait returns
 *             at once, and every rank fails with MPU_ERR_ABORTED naming rank 1
 *   exit      rank 2 exits without a word: the others fail with
 *             MPU_ERR_ABORTED naming rank 2
 *   exit_late rank 3 waits in its all_reduce when rank 2 exits (2 s), and
 *             ranks 0 and 1 call after that (4 s), knowing rank 2 gone: they
 *             still send rank 3 theirs, so it names rank 2 (not them, after
 *             its timeout: ctest sets 10 s here); they stay past it
 *   mismatch  rank 2 asks for another count: MPU_ERR_MISMATCH on every
 *             rank, naming it, and the communicator still works
 *   unchecked with call checking off, rank 3 never calls: the others fail
 *             (timed out, or their peer that timed out closed its connections)
 *   churn     groups made and destroyed at once, 40 times over: no rank may
 *             close a group while a peer is still connecting to it (nor,
 *             once its last message is out, fail a peer still taking it)
 *   unchecked_leave  with call checking off, ranks 1-3 make two small reduces
 *             to rank 0 and leave at once (destroy, exit); rank 0 comes a
 *             second later: both its reduces work (the second message from
 *             each is already in, though the peer has gone)
 *   unchecked_shift  with call checking off, rank 0 sends rank 1 an element in
 *             an all_to_all_v where rank 1 takes none from it, then all make
 *             a matching one: rank 1 fails with MPU_ERR_MISMATCH (the earlier
 *             call's message is not taken as this one's), the others work
 *   last_large  every rank all_gathers 8 MiB, the last a second late (its
 *             peers' receives wait for it, so its sends go at once), and it
 *             leaves at once: the others' all_gather still gets all of its
 *             bytes (a reset connection would drop what the kernel held)
 *   unchecked_mismatch  with call checking off, rank 2 all_reduces 2 elements
 *             where the others take 1 (small: the messages go eagerly): every
 *             rank fails with MPU_ERR_MISMATCH naming a rank, at once, and no
 *             rank's output changes
 * Timeouts are MPU_TIMEOUT's (ctest sets a few seconds). Exits 0 when every
 * rank saw what it should.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpu.h"

static int fail(int rank, const char *mode, const char *what, mpu_result_t r) {
  fprintf(stderr, "rank %d, %s: %s (got %s: %s)\n", rank, mode, what, mpu_result_name(r),
          mpu_last_error());
  return 1;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *abort_later(void *w) {
  sleep(1);
  mpu_comm_abort(w);
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  mpu_gloo_options o = MPU_GLOO_OPTIONS_INIT;
  o.check_calls = strncmp(mode, "unchecked", 9) ? MPU_CHECKS_ON : MPU_CHECKS_OFF;
  mpu_comm *w = NULL;
  if (mpu_comm_gloo_from_env(&o, &w)) return fail(-1, mode, "from_env", 1);
  int rank = 0, size = 0;
  mpu_comm_rank(w, &rank);
  mpu_comm_size(w, &size);
  double x[2] = {1, 1}, y[2];
  mpu_result_t r = mpu_comm_barrier(w);
  if (r) return fail(rank, mode, "the first barrier", r);
  if (!strcmp(mode, "timeout") || !strcmp(mode, "unchecked")) {
    const char *t = getenv("MPU_TIMEOUT");
    if (rank == size - 1) {
      sleep((unsigned)(t ? atof(t) : 5) + 3); /* past the others' timeout */
      mpu_comm_destroy(w);
      return 0;
    }
    double t0 = now();
    r = mpu_comm_all_reduce(w, x, y, 1, MPU_FLOAT64, MPU_SUM);
    char want[32];
    snprintf(want, sizeof want, "rank %d", size - 1);
    /* unchecked, a rank waits for whoever it needs data from, and may see
     * that one give up first (gloo closes a timed-out rank's connections) */
    int unchecked = o.check_calls != MPU_CHECKS_ON;
    if (unchecked ? r != MPU_ERR_TIMEOUT && r != MPU_ERR_ABORTED
                  : r != MPU_ERR_TIMEOUT || !strstr(mpu_last_error(), want))
      return fail(rank, mode, "want MPU_ERR_TIMEOUT naming the last rank", r);
    printf("rank %d, %s after %.1f s: %s\n", rank, mode, now() - t0, mpu_last_error());
    t0 = now();
    r = mpu_comm_barrier(w);
    if (r == MPU_SUCCESS || now() - t0 > 1.0)
      return fail(rank, mode, "want the broken communicator to fail at once", r);
  } else if (!strcmp(mode, "abort") || !strcmp(mode, "exit") || !strcmp(mode, "exit_late")) {
    int victim = !strcmp(mode, "abort") ? 1 : 2, late = !strcmp(mode, "exit_late");
    if (rank == victim) {
      if (late) sleep(2);        /* rank 3 is waiting by now */
      if (victim == 2) _exit(0); /* no destroy, no word: the connections just close */
      sleep(1);                  /* the others are waiting in their all_reduce */
      r = mpu_comm_abort(w);
      if (r) return fail(rank, mode, "abort", r);
      mpu_comm_destroy(w);
      return 0;
    }
    if (late && rank < 2) sleep(4);
    r = mpu_comm_all_reduce(w, x, y, 1, MPU_FLOAT64, MPU_SUM);
    char want[32];
    snprintf(want, sizeof want, "rank %d", victim);
    if (r != MPU_ERR_ABORTED || !strstr(mpu_last_error(), want))
      return fail(rank, mode, "want MPU_ERR_ABORTED naming the rank", r);
    printf("rank %d, %s: %s\n", rank, mode, mpu_last_error());
    if (late && rank < 2) { /* rank 0 serves the store: it stays past rank 3's timeout */
      const char *t = getenv("MPU_TIMEOUT");
      sleep((unsigned)(t ? atof(t) : 5) + 2);
    }
  } else if (!strcmp(mode, "abort_thread")) {
    pthread_t t;
    if (rank == 1 && pthread_create(&t, NULL, abort_later, w)) return fail(rank, mode, "thread", 0);
    if (rank == 3) sleep(4); /* so rank 1's main thread is still waiting when it aborts */
    double t0 = now();
    r = mpu_comm_all_reduce(w, x, y, 1, MPU_FLOAT64, MPU_SUM);
    if (rank == 1) pthread_join(t, NULL);
    if (r != MPU_ERR_ABORTED || !strstr(mpu_last_error(), "rank 1"))
      return fail(rank, mode, "want MPU_ERR_ABORTED naming rank 1", r);
    if (rank == 1 && now() - t0 > 3.0) /* rank 3 comes at 4 s; MPU_TIMEOUT is 5 s */
      return fail(rank, mode, "the abort did not end the waiting call at once", r);
    printf("rank %d, %s after %.1f s: %s\n", rank, mode, now() - t0, mpu_last_error());
  } else if (!strcmp(mode, "mismatch")) {
    r = mpu_comm_all_reduce(w, x, y, rank == 2 ? 2 : 1, MPU_FLOAT64, MPU_SUM);
    if (r != MPU_ERR_MISMATCH || !strstr(mpu_last_error(), "rank 2"))
      return fail(rank, mode, "want MPU_ERR_MISMATCH naming rank 2", r);
    if (rank == 0) printf("%s: %s\n", mode, mpu_last_error());
    r = mpu_comm_all_reduce(w, x, y, 2, MPU_FLOAT64, MPU_SUM);
    if (r || y[0] != size || y[1] != size)
      return fail(rank, mode, "want the next all_reduce to work", r);
  } else if (!strcmp(mode, "unchecked_mismatch")) {
    double out[2] = {-7, -7}, t0 = now();
    r = mpu_comm_all_reduce(w, x, out, rank == 2 ? 2 : 1, MPU_FLOAT64, MPU_SUM);
    if (r != MPU_ERR_MISMATCH || !strstr(mpu_last_error(), "rank "))
      return fail(rank, mode, "want MPU_ERR_MISMATCH naming a rank", r);
    if (now() - t0 > 3.0) /* MPU_TIMEOUT is 5 s: a mismatch is seen when its message comes */
      return fail(rank, mode, "the mismatch was seen only after waiting", r);
    if (out[0] != -7 || out[1] != -7) return fail(rank, mode, "want the output untouched", r);
    if (rank == 0) printf("%s: %s\n", mode, mpu_last_error());
  } else if (!strcmp(mode, "unchecked_leave")) {
    double v = rank + 1, sum = -1;
    if (rank == 0) sleep(1);
    for (int k = 0; k < 2; k++) {
      r = mpu_comm_reduce(w, &v, &sum, 1, MPU_FLOAT64, MPU_SUM, 0);
      if (r) return fail(rank, mode, "want both reduces to work", r);
      if (rank == 0 && sum != size * (size + 1) / 2.0) return fail(rank, mode, "a wrong sum", r);
    }
    if (rank != 0) {
      mpu_comm_destroy(w);
      return 0;
    }
  } else if (!strcmp(mode, "unchecked_shift")) {
    size_t counts[4] = {0}, displs[4] = {0, 1, 2, 3}, rcounts[4] = {0}, rdispls[4] = {0, 1, 2, 3};
    double out[4] = {0}, in[4] = {111, 111, 111, 111};
    if (rank == 0) counts[1] = 1; /* rank 1 takes nothing from rank 0 */
    r = mpu_comm_all_to_all_v(w, in, counts, displs, out, rcounts, rdispls, MPU_FLOAT64);
    if (r) return fail(rank, mode, "want the first call to run (nothing checks it)", r);
    for (int j = 0; j < size; j++) counts[j] = rcounts[j] = 1, in[j] = 200 + rank;
    r = mpu_comm_all_to_all_v(w, in, counts, displs, out, rcounts, rdispls, MPU_FLOAT64);
    if (rank == 1 && r != MPU_ERR_MISMATCH)
      return fail(rank, mode, r ? "want MPU_ERR_MISMATCH" : "took the earlier call's message", r);
    if (rank == 1) printf("%s: %s\n", mode, mpu_last_error());
    if (rank != 1 && (r || out[1] != 201 || out[2] != 202))
      return fail(rank, mode, "want the second call to work", r);
  } else if (!strcmp(mode, "last_large")) {
    size_t each = (size_t)1 << 20; /* 8 MiB of float64 */
    double *in = malloc(each * sizeof *in), *out = malloc((size_t)size * each * sizeof *out);
    if (!in || !out) return fail(rank, mode, "out of memory", 0);
    for (size_t i = 0; i < each; i++) in[i] = rank * 1e7 + (double)i;
    if (rank == size - 1) sleep(1);
    r = mpu_comm_all_gather(w, in, out, each, MPU_FLOAT64);
    if (r) return fail(rank, mode, "want the all_gather to work", r);
    if (rank == size - 1) {
      mpu_comm_destroy(w);
      free(in), free(out);
      return 0;
    }
    for (int j = 0; j < size; j++)
      for (size_t i = 0; i < each; i += 4097)
        if (out[(size_t)j * each + i] != j * 1e7 + (double)i)
          return fail(rank, mode, "a wrong element", r);
    free(in), free(out);
  } else if (!strcmp(mode, "churn")) {
    int all[4] = {0, 1, 2, 3}, pair[2] = {rank & ~1, rank | 1};
    for (int i = 0; i < 40; i++) {
      mpu_comm *g = NULL;
      int whole = i % 2 == 0;
      r = mpu_comm_create_group(w, whole ? all : pair, whole ? size : 2, &g);
      if (r) return fail(rank, mode, whole ? "make a group of all" : "make a pair", r);
      mpu_comm_destroy(g);
    }
    r = mpu_comm_all_reduce(w, x, y, 2, MPU_FLOAT64, MPU_SUM);
    if (r || y[0] != size) return fail(rank, mode, "want the world to work after", r);
  } else {
    fprintf(stderr, "usage: %s timeout|abort|abort_thread|exit|exit_late|mismatch|unchecked|unchecked_leave|unchecked_shift|last_large|unchecked_mismatch|churn\n", argv[0]);
    return 2;
  }
  mpu_comm_destroy(w);
  return 0;
}
