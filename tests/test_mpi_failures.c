/*
 * test_mpi_failures.c - the MPI backend's safety, under mpirun with 3 or more
 * processes: with call checking on, mismatched collectives (count, dtype, op,
 * root, kind, a collective against a barrier) fail with MPU_ERR_MISMATCH on
 * every rank within a second and leave the communicator usable; a rank that
 * never arrives ends its peers' wait with MPU_ERR_TIMEOUT within the timeout
 * plus a second, the communicator is then broken, and the late rank does not
 * hang either; point-to-point dtype and count mismatches are caught; recv
 * times out; destroy returns at once with sends nobody received.
 *
 * Each scenario uses a fresh communicator; a healthy one (`ctl`) keeps the
 * ranks in step between scenarios and adds up the failures.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpu.h"
#include "test_helpers.h"

static int rank, size, failures;
static mpu_comm *ctl;

#define CHECK MCHECK


static void sync_all(void) { mpu_comm_barrier(ctl); }

/* ---- mismatched collectives ------------------------------------------------ */

typedef enum { COUNT, DTYPE, OP, ROOT, KIND, BARRIER, TINY_OP, TINY_ROOT, LARGE, LARGE_KIND } mismatch;
static const char *const names[] = {"count",   "dtype",     "op",      "root",  "kind",
                                    "barrier", "tiny op",   "tiny root", "large", "large kind"};

/* Rank 1 makes a call that differs from everyone else's in one way. Calls of
 * 8 bytes carry their input with the signature when there is no timeout: the
 * TINY cases have both sides carry it, LARGE ones one side only. */
static mpu_result_t mismatched_call(mpu_comm *c, mismatch m) {
  static float buf[4096], out[4096];
  int odd = rank == 1;
  switch (m) {
  case TINY_OP: return mpu_comm_all_reduce(c, buf, out, 2, MPU_FLOAT32, odd ? MPU_MAX : MPU_SUM);
  case TINY_ROOT: return mpu_comm_broadcast(c, buf, 2, MPU_FLOAT32, odd ? 2 : 0);
  case LARGE: return mpu_comm_all_reduce(c, buf, out, odd ? 4096 : 2, MPU_FLOAT32, MPU_SUM);
  case LARGE_KIND:
    return odd ? mpu_comm_all_gather(c, buf, out, 4096 / (size_t)size, MPU_FLOAT32)
               : mpu_comm_broadcast(c, buf, 2, MPU_FLOAT32, 0);
  case COUNT: return mpu_comm_all_reduce(c, buf, out, odd ? 8 : 16, MPU_FLOAT32, MPU_SUM);
  case DTYPE: return mpu_comm_all_reduce(c, buf, out, 16, odd ? MPU_INT32 : MPU_FLOAT32, MPU_SUM);
  case OP: return mpu_comm_all_reduce(c, buf, out, 16, MPU_FLOAT32, odd ? MPU_MAX : MPU_SUM);
  case ROOT: return mpu_comm_broadcast(c, buf, 16, MPU_FLOAT32, odd ? 1 : 0);
  case KIND:
    return odd ? mpu_comm_all_gather(c, buf, out, 4, MPU_FLOAT32)
               : mpu_comm_all_reduce(c, buf, out, 16, MPU_FLOAT32, MPU_SUM);
  default:
    return odd ? mpu_comm_barrier(c) : mpu_comm_all_reduce(c, buf, out, 16, MPU_FLOAT32, MPU_SUM);
  }
}

/* timeout_s: 30 (polled, signature first) or 0 / INFINITY (no timeout:
 * blocking calls, small inputs travelling with the signature). */
static void test_mismatches(double timeout_s) {
  mpu_comm *c = MFRESH(timeout_s, MPU_CHECKS_ON);
  for (int m = COUNT; m <= LARGE_KIND; m++) {
    sync_all();
    double t0 = test_now();
    mpu_result_t r = mismatched_call(c, (mismatch)m);
    double took = test_now() - t0;
    CHECK(r == MPU_ERR_MISMATCH, "%s mismatch (timeout %g) -> %s, want MPU_ERR_MISMATCH",
          names[m], timeout_s, mpu_result_name(r));
    CHECK(strstr(mpu_last_error(), "ranks differing from rank 0: 1") != NULL,
          "%s mismatch: the message does not name rank 1: %s", names[m], mpu_last_error());
    CHECK(took < 1.0, "%s mismatch took %.3f s", names[m], took);
    /* every rank saw the same verdict: the communicator still works */
    int32_t one = 1, sum = 0;
    r = mpu_comm_all_reduce(c, &one, &sum, 1, MPU_INT32, MPU_SUM);
    CHECK(r == MPU_SUCCESS && sum == size, "after a %s mismatch: %s, sum %d", names[m],
          mpu_result_name(r), sum);
  }
  mpu_comm_destroy(c);
}

/* ---- a rank that never arrives -------------------------------------------------- */

static void test_timeout(void) {
  const double timeout = 0.5;
  mpu_comm *c = MFRESH(timeout, MPU_CHECKS_ON);
  int32_t x = 1, y = 0;
  sync_all();
  if (rank != size - 1) {
    double t0 = test_now();
    mpu_result_t r = mpu_comm_all_reduce(c, &x, &y, 1, MPU_INT32, MPU_SUM);
    double took = test_now() - t0;
    CHECK(r == MPU_ERR_TIMEOUT, "absent rank: %s, want MPU_ERR_TIMEOUT", mpu_result_name(r));
    CHECK(took >= timeout && took < timeout + 1.0, "absent rank: failed after %.3f s", took);
    /* the message names the one rank that never came, and no other */
    char want[64];
    snprintf(want, sizeof want, ": rank %d did not arrive)", size - 1);
    CHECK(strstr(mpu_last_error(), want) != NULL, "no '%s' in: %s", want, mpu_last_error());
    /* broken: later calls fail at once */
    t0 = test_now();
    r = mpu_comm_barrier(c);
    CHECK(r == MPU_ERR_TIMEOUT && test_now() - t0 < 0.1, "broken communicator: %s after %.3f s",
          mpu_result_name(r), test_now() - t0);
    CHECK(strstr(mpu_last_error(), "broken") != NULL, "no 'broken' in: %s", mpu_last_error());
  }
  sync_all(); /* the others have given up; now the last rank comes, late */
  if (rank == size - 1) {
    double t0 = test_now();
    mpu_result_t r = mpu_comm_all_reduce(c, &x, &y, 1, MPU_INT32, MPU_SUM);
    double took = test_now() - t0;
    CHECK(r == MPU_ERR_TIMEOUT, "late rank: %s, want MPU_ERR_TIMEOUT", mpu_result_name(r));
    CHECK(took < timeout + 1.0, "late rank: failed after %.3f s", took);
    /* it names the others as having given up, not as missing */
    CHECK(strstr(mpu_last_error(), "had given up (timed out) before") != NULL &&
              strstr(mpu_last_error(), "did not arrive") == NULL,
          "late rank: %s", mpu_last_error());
  }
  double t0 = test_now();
  mpu_comm_destroy(c);
  CHECK(test_now() - t0 < 1.0, "destroying a timed-out communicator took %.3f s", test_now() - t0);
}

/* In a communicator whose ranks are not the world's (reversed by the split's
 * key), the absent rank is named by both: its rank here and in the world. */
static void test_timeout_in_group(void) {
  mpu_comm *w = MFRESH(0.5, MPU_CHECKS_ON), *c = NULL;
  mpu_result_t r = mpu_comm_split(w, 0, size - 1 - rank, &c);
  CHECK(r == MPU_SUCCESS && c, "split: %s", mpu_result_name(r));
  int32_t x = 1, y = 0;
  sync_all();
  if (c && rank != size - 1) { /* world rank size - 1 is rank 0 here */
    r = mpu_comm_all_reduce(c, &x, &y, 1, MPU_INT32, MPU_SUM);
    char want[64];
    snprintf(want, sizeof want, ": rank 0 (world %d) did not arrive)", size - 1);
    CHECK(r == MPU_ERR_TIMEOUT && strstr(mpu_last_error(), want) != NULL, "in a group: %s, no '%s'",
          mpu_result_name(r), want);
  }
  sync_all();
  mpu_comm_destroy(c);
  mpu_comm_destroy(w);
}

/* Calls that wait long but complete send the notes a timeout would read;
 * nothing of them may reach the communicators made after (Open MPI reuses a
 * freed communicator's id): each round's late calls, destroy, a new
 * communicator and many fast calls, whose sums must be right. */
static void test_slow_calls_then_new_communicators(void) {
  for (int round = 0; round < 3; round++) {
    mpu_comm *c = MFRESH(10, MPU_CHECKS_ON);
    for (int i = 0; i < 3; i++) {
      int32_t one = 1, sum = 0;
      if (rank == round % size) /* the others wait, and send notes */
        nanosleep(&(struct timespec){0, 120000000}, NULL);
      mpu_result_t r = mpu_comm_all_reduce(c, &one, &sum, 1, MPU_INT32, MPU_SUM);
      CHECK(r == MPU_SUCCESS && sum == size, "slow call %d.%d: %s, sum %d", round, i,
            mpu_result_name(r), sum);
    }
    mpu_comm_destroy(c);
    c = MFRESH(10, MPU_CHECKS_ON);
    int bad = 0;
    for (int i = 0; i < 200 && c; i++) {
      int32_t v = rank + i, sum = 0;
      if (mpu_comm_all_reduce(c, &v, &sum, 1, MPU_INT32, MPU_SUM) ||
          sum != size * i + size * (size - 1) / 2)
        bad++;
    }
    CHECK(bad == 0, "round %d: %d of 200 fast calls after slow ones failed or were wrong", round,
          bad);
    mpu_comm_destroy(c);
  }
}

/* ---- point to point ------------------------------------------------------------- */

static void test_p2p(void) {
  mpu_comm *c = MFRESH(0.5, MPU_CHECKS_ON);
  int32_t ints[4] = {1, 2, 3, 4};
  float floats[8];
  sync_all();
  if (rank == 0) {
    mpu_comm_send(c, ints, 4, MPU_INT32, 1);     /* received as float32: dtype mismatch */
    mpu_comm_send(c, ints, 4, MPU_INT32, 1);     /* received as 8 x int32: count mismatch */
    mpu_comm_send(c, ints, 4, MPU_INT32, 1);     /* received right */
  } else if (rank == 1) {
    mpu_result_t r = mpu_comm_recv(c, floats, 4, MPU_FLOAT32, 0);
    CHECK(r == MPU_ERR_MISMATCH, "int32 sent, float32 received: %s", mpu_result_name(r));
    CHECK(strstr(mpu_last_error(), "4 x int32") != NULL, "message: %s", mpu_last_error());
    int32_t got[8] = {0};
    r = mpu_comm_recv(c, got, 8, MPU_INT32, 0);
    CHECK(r == MPU_ERR_MISMATCH, "4 sent, 8 received: %s", mpu_result_name(r));
    r = mpu_comm_recv(c, got, 4, MPU_INT32, 0);
    CHECK(r == MPU_SUCCESS && got[3] == 4, "the third message: %s, [3] = %d", mpu_result_name(r),
          got[3]);
    double t0 = test_now();
    r = mpu_comm_recv(c, got, 4, MPU_INT32, 0); /* nothing comes */
    double took = test_now() - t0;
    CHECK(r == MPU_ERR_TIMEOUT && took >= 0.5 && took < 1.5, "recv of nothing: %s after %.3f s",
          mpu_result_name(r), took);
  }
  sync_all();
  /* sends nobody receives, large enough for a rendezvous protocol */
  size_t big = (size_t)4 << 20;
  char *blob = calloc(big, 1);
  if (rank == 0 && blob)
    for (int k = 0; k < 3; k++) mpu_comm_send(c, blob, big, MPU_UINT8, 1);
  double t0 = test_now();
  mpu_comm_destroy(c);
  CHECK(test_now() - t0 < 1.0, "destroy with unreceived sends took %.3f s", test_now() - t0);
  free(blob);
}

int main(int argc, char **argv) {
  if (mpu_comm_mpi_world(&argc, &argv, &ctl)) {
    fprintf(stderr, "test_mpi_failures: %s\n", mpu_last_error());
    return 1;
  }
  mpu_comm_rank(ctl, &rank);
  mpu_comm_size(ctl, &size);
  if (size < 3) {
    if (rank == 0) fprintf(stderr, "test_mpi_failures: run with 3 or more processes\n");
    return 1;
  }
  test_mismatches(30);
  test_mismatches(0);
  test_mismatches(INFINITY);
  test_timeout();
  test_timeout_in_group();
  test_slow_calls_then_new_communicators();
  test_p2p();
  int32_t total = 0;
  mpu_comm_all_reduce(ctl, &failures, &total, 1, MPU_INT32, MPU_SUM);
  if (rank == 0) printf("test_mpi_failures: %d processes, %d failed checks\n", size, total);
  mpu_comm_destroy(ctl);
  mpu_mpi_finalize();
  return total ? 1 : 0;
}
