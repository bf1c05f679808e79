/*
 * test_mpi_oob.c - the MPI backend's out-of-band abort channel (what an NCCL
 * communicator over an MPI twin uses to reach peers in other processes),
 * under mpirun with 3 or more processes: rank 1 posts, every other rank's
 * poll names rank 1 and its reason within a second, and poll returns at
 * once while nothing came; channels closed with messages nobody read leave
 * nothing behind: 50 communicators made after them run exact all_reduces.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "mpu.h"
#include "test_helpers.h"

static int rank, size, failures;

#define CHECK MCHECK

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_post_reaches_peers(mpu_comm *world) {
  const mpu__comm_ops *ops = world->ops;
  CHECK(ops->oob_open && ops->oob_post && ops->oob_poll && ops->oob_close, "no channel ops");
  if (!ops->oob_open) return;
  void *ch = NULL;
  CHECK(ops->oob_open(world, &ch) == MPU_SUCCESS && ch, "oob_open");
  if (!ch) return;
  int who = -1;
  char why[64] = "";
  /* nothing posted yet: poll answers 0 at once */
  double t0 = now();
  for (int i = 0; i < 1000; i++) CHECK(!ops->oob_poll(ch, &who, why, sizeof why), "poll before post");
  CHECK(now() - t0 < 1.0, "1000 empty polls took %.3f s", now() - t0);
  mpu_comm_barrier(world);
  if (rank == 1) {
    ops->oob_post(ch, 1, "out of memory on cuda:1");
    ops->oob_post(ch, 1, "a second post is not sent");
  } else {
    double start = now();
    int heard = 0;
    while (!(heard = ops->oob_poll(ch, &who, why, sizeof why)) && now() - start < 5) {
    }
    double took = now() - start;
    CHECK(heard, "rank 1's post never came");
    CHECK(took < 1.0, "rank 1's post took %.3f s", took);
    CHECK(who == 1, "poster is %d, not 1", who);
    CHECK(!strcmp(why, "out of memory on cuda:1"), "reason is '%s'", why);
    /* the answer stays, and a short buffer gets a terminated prefix */
    char small[4];
    CHECK(ops->oob_poll(ch, &who, small, sizeof small) && !strcmp(small, "out"),
          "second poll: '%s'", small);
  }
  mpu_comm_barrier(world);
  ops->oob_close(ch);
}

/* Every rank posts and closes without reading; the messages in flight must
 * not land in the communicators made next (Open MPI reuses freed ids). */
static void test_close_unread_then_new_communicators(mpu_comm *world) {
  const mpu__comm_ops *ops = world->ops;
  if (!ops->oob_open) return;
  for (int round = 0; round < 5; round++) {
    void *ch = NULL;
    CHECK(ops->oob_open(world, &ch) == MPU_SUCCESS && ch, "oob_open");
    if (!ch) return;
    ops->oob_post(ch, rank, "gave up");
    ops->oob_close(ch);
  }
  for (int k = 0; k < 50; k++) {
    mpu_comm *c = NULL;
    mpu_result_t r = mpu_comm_mpi_world_ex(NULL, NULL, NULL, &c);
    CHECK(r == MPU_SUCCESS, "communicator %d: %s", k, mpu_result_name(r));
    if (r) return;
    int64_t in[8], out[8];
    for (int i = 0; i < 8; i++) in[i] = (int64_t)(rank + 1) * (i + 1) + k;
    r = mpu_comm_all_reduce(c, in, out, 8, MPU_INT64, MPU_SUM);
    CHECK(r == MPU_SUCCESS, "all_reduce on communicator %d: %s", k, mpu_result_name(r));
    for (int i = 0; !r && i < 8; i++) {
      int64_t want = (int64_t)size * (size + 1) / 2 * (i + 1) + (int64_t)size * k;
      CHECK(out[i] == want, "communicator %d [%d]: %lld, want %lld", k, i, (long long)out[i],
            (long long)want);
    }
    mpu_comm_destroy(c);
  }
}

int main(int argc, char **argv) {
  mpu_comm *world = NULL;
  if (mpu_comm_mpi_world(&argc, &argv, &world)) {
    fprintf(stderr, "test_mpi_oob: %s\n", mpu_last_error());
    return 1;
  }
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  if (size < 3) {
    if (rank == 0) fprintf(stderr, "test_mpi_oob: run with 3 or more processes\n");
    return 1;
  }
  test_post_reaches_peers(world);
  test_close_unread_then_new_communicators(world);
  int32_t total = 0;
  mpu_comm_all_reduce(world, &failures, &total, 1, MPU_INT32, MPU_SUM);
  if (rank == 0) printf("test_mpi_oob: %d processes, %d failed checks\n", size, total);
  mpu_comm_destroy(world);
  mpu_result_t r = mpu_mpi_finalize();
  if (r) fprintf(stderr, "rank %d: mpu_mpi_finalize: %s\n", rank, mpu_last_error());
  return total || r ? 1 : 0;
}
