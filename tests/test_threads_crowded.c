/*
 * test_threads_crowded.c - how threads ranks wait on a crowded machine: two
 * ranks that share one CPU with busy threads of other work sleep until the
 * peer's arrival wakes them instead of yielding (a yield there first runs a
 * stranger's time slice), and their waits still end at the deadline and on
 * an abort.
 *
 * The test counts the ranks' sched_yield() calls by defining sched_yield in
 * this executable, which the dynamic linker binds libmpu's calls to; a
 * control (more ranks than CPUs, where waiters do yield) shows the count
 * sees them. The crowd is online CPUs + 1 busy threads pinned to one CPU, so
 * /proc/loadavg counts more runnable threads than CPUs on any machine.
 *
 * On such a machine a rank done with its share of a large call takes the
 * parts of a peer's share that the peer has not begun. The test sees who
 * copies what by defining memcpy here too (libmpu's cached copies call it),
 * and holds the peer inside its first part until someone else has copied
 * into the peer's share. The same memcpy shows that an all_gather's ranks
 * read only their own inputs.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

static _Atomic long yields;

/* ---- who copies into rank 1's share of an all_gather ---- */
static _Thread_local int copier = -1;  /* the rank this thread is, while watched */
static char *share_lo[2], *share_hi[2]; /* [output]: block 1, rank 1's share */
static _Atomic int watching, taken, held_too_long;
/* ---- whose input each rank copies from in an all_gather ---- */
static const char *input_lo[2], *input_hi[2]; /* [rank]: its send buffer */
static _Atomic int watching_inputs, foreign_reads;

static int in_share(const void *p) {
  for (int k = 0; k < 2; k++)
    if ((const char *)p >= share_lo[k] && (const char *)p < share_hi[k]) return 1;
  return 0;
}

/* Every memcpy of the process comes here (memmove does the copy: a plain
 * loop might be compiled back into a call to memcpy). Rank 1's first copy
 * into its share waits until rank 0 has copied into it, for at most 20 s
 * (once: its later copies do not wait). */
void *memcpy(void *dst, const void *src, size_t n) {
  if (copier >= 0 && atomic_load_explicit(&watching_inputs, memory_order_acquire)) {
    const char *other_lo = input_lo[1 - copier], *other_hi = input_hi[1 - copier];
    if ((const char *)src >= other_lo && (const char *)src < other_hi) atomic_fetch_add(&foreign_reads, 1);
  }
  if (copier >= 0 && atomic_load_explicit(&watching, memory_order_acquire) && in_share(dst)) {
    if (copier == 0) atomic_store(&taken, 1);
    for (int ms = 0; copier == 1 && !atomic_load(&taken) && !atomic_load(&held_too_long); ms++) {
      if (ms == 20000) {
        atomic_store(&held_too_long, 1);
        break;
      }
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  return memmove(dst, src, n);
}

/* Every sched_yield of the process, libmpu's included, comes here. */
int sched_yield(void) {
  atomic_fetch_add(&yields, 1);
  return (int)syscall(SYS_sched_yield);
}

static int the_cpu; /* the one CPU the crowd and the ranks share */
static _Atomic int stop;

static void pin_here(void) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(the_cpu, &one);
  sched_setaffinity(0, sizeof one, &one);
}

static void *busy(void *arg) {
  (void)arg;
  pin_here();
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
  }
  return NULL;
}

typedef struct crowd {
  int n;
  pthread_t *threads;
} crowd;

/* online + 1 busy threads on the_cpu: more runnable threads than CPUs. */
static crowd crowd_start(void) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  crowd c = {(int)online + 1, NULL};
  c.threads = calloc((size_t)c.n, sizeof *c.threads);
  assert_non_null(c.threads);
  atomic_store(&stop, 0);
  for (int i = 0; i < c.n; i++) assert_int_equal(pthread_create(&c.threads[i], NULL, busy, NULL), 0);
  return c;
}

static void crowd_stop(crowd *c) {
  atomic_store(&stop, 1);
  for (int i = 0; i < c->n; i++) pthread_join(c->threads[i], NULL);
  free(c->threads);
}

static void setup_cpu(void) {
  cpu_set_t allowed;
  assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  for (the_cpu = 0; the_cpu < CPU_SETSIZE && !CPU_ISSET(the_cpu, &allowed); the_cpu++) {
  }
}

static int rank_of(mpu_comm *c) {
  int r = -1;
  mpu_comm_rank(c, &r);
  return r;
}

#define CALLS 50

/* Both ranks on the_cpu: each knows its peer last arrived from its CPU. */
static mpu_result_t small_calls(mpu_comm *world, void *arg) {
  long *counted = arg;
  pin_here();
  mpu_result_t r = mpu_comm_barrier(world);
  long before = atomic_load(&yields);
  for (int i = 0; i < CALLS && !r; i++) {
    float x = 1, y = 0;
    r = mpu_comm_all_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM);
    if (!r && y != 2) r = mpu_fail(MPU_ERR_INTERNAL, "sum %g", y);
  }
  if (rank_of(world) == 0) *counted = atomic_load(&yields) - before;
  return r;
}

static void test_crowded_shared_cpu_sleeps(void **state) {
  (void)state;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) skip(); /* one CPU: ranks outnumber it, waiters yield */
  if (access("/proc/loadavg", R_OK)) skip();     /* nothing tells a crowded machine */
  setup_cpu();
  crowd c = crowd_start();
  long counted = -1;
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 120;
  mpu_result_t r = mpu_launch(2, small_calls, &counted, NULL, &o);
  crowd_stop(&c);
  assert_int_equal(r, MPU_SUCCESS);
  /* a yield there runs a busy thread's whole slice before the peer: a
   * waiter must sleep instead (at most a yield per count of the runnable
   * threads may slip through between two counts) */
  if (counted > CALLS / 5)
    fail_msg("%ld sched_yield()s in %d calls of two ranks sharing a crowded CPU", counted, CALLS);
}

/* The control: with more ranks than CPUs, waiters do yield to each other. */
static mpu_result_t barriers(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; i < 20 && !r; i++) r = mpu_comm_barrier(world);
  return r;
}

static void test_yields_are_counted(void **state) {
  (void)state;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online + 1 > MPU_LAUNCH_MAX_RANKS) skip();
  atomic_store(&yields, 0);
  assert_int_equal(mpu_launch((int)online + 1, barriers, NULL, NULL, NULL), MPU_SUCCESS);
  assert_true(atomic_load(&yields) > 0);
}

/* Crowded and sharing a CPU: a wait still ends at the deadline, or when the
 * peer aborts. */
static mpu_result_t late_or_abort(mpu_comm *world, void *arg) {
  int abort_it = *(int *)arg;
  pin_here();
  if (rank_of(world) == 1) {
    /* late by far more than the timeout, so the deadline ends the wait */
    struct timespec ts = {abort_it ? 0 : 2, abort_it ? 300 * 1000000L : 0};
    nanosleep(&ts, NULL);
    if (abort_it) return mpu_comm_abort(world);
    return MPU_SUCCESS; /* returns before the call: its peer's wait times out or sees it gone */
  }
  return mpu_comm_barrier(world);
}

static void test_crowded_waits_end(void **state) {
  (void)state;
  setup_cpu();
  crowd c = crowd_start();
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 0.1;
  mpu_result_t results[2];
  int abort_it = 0;
  mpu_result_t timed = mpu_launch(2, late_or_abort, &abort_it, results, &o);
  mpu_result_t timed0 = results[0];
  char timed_msg[1024];
  snprintf(timed_msg, sizeof timed_msg, "%s", mpu_last_error());
  o.timeout_s = 60;
  abort_it = 1;
  mpu_result_t aborted = mpu_launch(2, late_or_abort, &abort_it, results, &o);
  crowd_stop(&c);
  assert_int_equal(timed, MPU_ERR_TIMEOUT);
  assert_int_equal(timed0, MPU_ERR_TIMEOUT);
  if (!strstr(timed_msg, "timed out waiting for world rank 1")) fail_msg("%s", timed_msg);
  assert_int_equal(aborted, MPU_ERR_ABORTED);
  assert_int_equal(results[0], MPU_ERR_ABORTED);
}

/* Rank 1 is held inside the first part of its share (memcpy above): rank 0,
 * done with its own, must take the rest, and the output is still exact. */
#define GATHERED ((size_t)1 << 20) /* floats per rank: 4 MiB, many parts */

static mpu_result_t gather_held(mpu_comm *world, void *arg) {
  (void)arg;
  int me = rank_of(world);
  float *send = malloc(GATHERED * sizeof *send), *recv = malloc(2 * GATHERED * sizeof *recv);
  if (!send || !recv) {
    free(send), free(recv);
    return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "buffers");
  }
  for (size_t i = 0; i < GATHERED; i++) send[i] = (float)(me * 3 + (int)(i % 7));
  for (size_t i = 0; i < 2 * GATHERED; i++) recv[i] = -1;
  share_lo[me] = (char *)(recv + GATHERED), share_hi[me] = (char *)(recv + 2 * GATHERED);
  /* a wait long enough to count the machine's runnable threads: crowded */
  if (me == 0) {
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
  }
  mpu_result_t r = mpu_comm_barrier(world);
  if (!r && me == 0) atomic_store_explicit(&watching, 1, memory_order_release);
  if (!r) r = mpu_comm_barrier(world);
  copier = me;
  if (!r) r = mpu_comm_all_gather(world, send, recv, GATHERED, MPU_FLOAT32);
  copier = -1;
  for (size_t i = 0; !r && i < 2 * GATHERED; i++) {
    float want = (float)((int)(i / GATHERED) * 3 + (int)(i % GATHERED % 7));
    if (recv[i] != want) r = mpu_fail(MPU_ERR_INTERNAL, "rank %d: recv[%zu] = %g, want %g", me, i, recv[i], want);
  }
  free(send), free(recv);
  return r;
}

static void test_crowded_rank_takes_parts_of_a_held_peer(void **state) {
  (void)state;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) skip(); /* one CPU: one rank works, the other sleeps */
  if (access("/proc/loadavg", R_OK)) skip();     /* nothing tells a crowded machine */
  setup_cpu();
  crowd c = crowd_start();
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 120;
  mpu_result_t r = mpu_launch(2, gather_held, NULL, NULL, &o);
  atomic_store(&watching, 0);
  crowd_stop(&c);
  assert_int_equal(r, MPU_SUCCESS);
  if (!atomic_load(&taken) || atomic_load(&held_too_long))
    fail_msg("rank 0 never copied into the share of rank 1, held in its first part");
}

/* An all_gather reads each input once, by its owner, which pushes it into
 * every output (pulling every input into one's own output reads n times as
 * much): no rank copies from a peer's input. */
static mpu_result_t gather_watched(mpu_comm *world, void *arg) {
  (void)arg;
  int me = rank_of(world);
  size_t count = 1 << 16; /* 256 KiB a rank: a large call, in cache */
  float *send = malloc(count * sizeof *send), *recv = malloc(2 * count * sizeof *recv);
  if (!send || !recv) {
    free(send), free(recv);
    return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "buffers");
  }
  for (size_t i = 0; i < count; i++) send[i] = (float)(me + 1);
  input_lo[me] = (const char *)send, input_hi[me] = (const char *)(send + count);
  mpu_result_t r = mpu_comm_barrier(world);
  if (!r && me == 0) atomic_store_explicit(&watching_inputs, 1, memory_order_release);
  if (!r) r = mpu_comm_barrier(world);
  copier = me;
  if (!r) r = mpu_comm_all_gather(world, send, recv, count, MPU_FLOAT32);
  copier = -1;
  for (size_t i = 0; !r && i < 2 * count; i++)
    if (recv[i] != (float)(i / count + 1)) r = mpu_fail(MPU_ERR_INTERNAL, "recv[%zu] = %g", i, recv[i]);
  mpu_result_t b = mpu_comm_barrier(world); /* both done before the buffers go */
  free(send), free(recv);
  return r ? r : b;
}

static void test_all_gather_reads_each_input_by_its_owner(void **state) {
  (void)state;
  atomic_store(&foreign_reads, 0);
  mpu_result_t r = mpu_launch(2, gather_watched, NULL, NULL, NULL);
  atomic_store(&watching_inputs, 0);
  assert_int_equal(r, MPU_SUCCESS);
  if (atomic_load(&foreign_reads))
    fail_msg("%d copies read a peer's input: an all_gather should read each input once, by its owner",
             atomic_load(&foreign_reads));
}

int main(void) {
  /* cached copies (memcpy, which the test sees) at every size */
  setenv("MPU_STREAM_MIN_BYTES", "1099511627776", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_gather_reads_each_input_by_its_owner),
      cmocka_unit_test(test_crowded_rank_takes_parts_of_a_held_peer),
      cmocka_unit_test(test_yields_are_counted),
      cmocka_unit_test(test_crowded_shared_cpu_sleeps),
      cmocka_unit_test(test_crowded_waits_end),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
