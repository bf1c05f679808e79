/*
 * mpu/bench.h - measuring collectives the way nccl-tests does.
 *
 * The numbers `mpu bench` prints come from these calls, so a program can take
 * the same measurements on its own communicators. Sizes follow nccl-tests:
 * `bytes` is the whole buffer the collective moves (for all_gather the
 * gathered output, for reduce_scatter and all_to_all the full input), algbw
 * is bytes / time and busbw is algbw times the collective's bus factor.
 */
#ifndef MPU_BENCH_H
#define MPU_BENCH_H

#include <stddef.h>

#include "mpu/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mpu_collective and its names are mpu/comm.h's; mpu bench measures the
 * first MPU_COLL_COUNT of them. */

/* busbw / algbw for a collective over n ranks, as nccl-tests defines it:
 * all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
 * broadcast, reduce 1. */
MPU_API double mpu_bench_bus_factor(mpu_collective c, int nranks);

/* The least memory traffic (bytes read + bytes written, over all ranks) of a
 * collective of nccl-tests size `bytes` over n ranks sharing one memory:
 * every input read once, every output written once. all_reduce and
 * all_to_all 2nS; all_gather, reduce_scatter and reduce (n+1)S; broadcast
 * nS. `mpu bench` divides it by the copy bandwidth of as many threads to get
 * its roofline column. */
MPU_API double mpu_bench_traffic(mpu_collective c, int nranks, size_t bytes);

typedef struct mpu_bench_config {
  size_t size;          /* sizeof(mpu_bench_config), set by the initializer */
  mpu_collective collective;
  mpu_dtype dtype;
  mpu_op op;            /* for the reducing collectives */
  size_t bytes;         /* nccl-tests "size": rounded down to whole elements per rank, and up
                           to at least one element per rank (the result says what ran) */
  int warmup;           /* untimed iterations */
  int iters;            /* timed iterations, 1..100000 */
  int in_place;
  int native;           /* 1: also time the backend library's own call (MPI_Allreduce, ...)
                           on the same buffers, iteration by iteration interleaved */
  int check;            /* 1: after timing, run each variant once on known inputs and count
                           the wrong output elements over all ranks (nccl-tests -c 1) */
  int average;          /* the mean time (mean_us, native_mean_us) over the ranks:
                           MPU_BENCH_SLOWEST (the mean of every iteration's slowest rank) or,
                           as nccl-tests -a, each rank's mean then that of rank 0, the average,
                           the least or the largest of them */
  int barrier;          /* 1: a barrier before every timed call, so that all start together
                           (nccl-tests -z 1; always when several variants are timed) */
  /* Pauses in the timed loop: `pauses` times (0..iters), spread evenly over
   * the timed iterations, every rank calls pause(pause_arg) outside the
   * timing, then makes MPU_BENCH_SETTLE untimed calls of every variant, so
   * that the next timed call finds the caches as calls leave them (one was
   * not enough: an 8 MiB all_gather's second call after a pause is as slow
   * as its first). A pause's error ends
   * the measurement with it; a pause that fails on some ranks only leaves
   * the others in the next call, as any rank that stops calling does. `mpu
   * bench` times its roof in them, so that the
   * roof and the row see the same moments of the machine
   * (mpu_bench_roof_begin). */
  mpu_result_t (*pause)(void *pause_arg);
  void *pause_arg;
  int pauses;
  /* NULL, or called by every rank with its own buffers (host memory only)
   * once they are laid out and filled, before the warm-up: `mpu bench`
   * times its roof on them (mpu_bench_roof_lend). What a pause writes there
   * changes no result: the check refills its inputs. */
  void (*lend)(void *pause_arg, int rank, void *send, void *recv);
} mpu_bench_config;

/* Untimed calls after each pause of mpu_bench_collectives, and untimed
 * iterations before each way's timed ones in a round of mpu_bench_roof:
 * both timed figures then start from the state their own work leaves. */
#define MPU_BENCH_SETTLE 2

enum {
  MPU_BENCH_SLOWEST = -1, /* mpu's: per iteration, the slowest rank's time */
  MPU_BENCH_RANK0 = 0,    /* nccl-tests -a 0 */
  MPU_BENCH_AVG = 1,      /* nccl-tests -a 1 (its default) */
  MPU_BENCH_MIN = 2,      /* nccl-tests -a 2 */
  MPU_BENCH_MAX = 3,      /* nccl-tests -a 3 */
};

#define MPU_BENCH_CONFIG_INIT                                                                    \
  {sizeof(mpu_bench_config), MPU_COLL_ALL_REDUCE, MPU_FLOAT32, MPU_SUM, 1 << 20, 5, 20, 0, 0, 0, \
   MPU_BENCH_SLOWEST, 0, NULL, NULL, 0, NULL}

typedef struct mpu_bench_result {
  size_t size;       /* sizeof(mpu_bench_result): set it (MPU_BENCH_RESULT_INIT) */
  size_t bytes;      /* the size actually measured */
  size_t count;      /* elements per rank's send buffer (nccl-tests "count") */
  double time_us;    /* median over iterations of the slowest rank's time */
  double mean_us;    /* the slowest rank's timed loop over the iterations, less its pauses (one
                        variant without barriers, as nccl-tests times a batch); else the mean of
                        the per-call times */
  double min_us;
  double algbw_gbps; /* bytes / time_us, in GB/s (1e9 bytes per second) */
  double busbw_gbps; /* algbw * bus factor */
  double native_us;  /* with config.native: median of the library's own call; -1 when the
                        backend has none (threads) or it cannot do this call (16-bit sums) */
  double native_mean_us;
  long long wrong;   /* with config.check: wrong output elements over all ranks; -1 unchecked */
  long long native_wrong; /* the same for the native call */
} mpu_bench_result;

#define MPU_BENCH_RESULT_INIT {.size = sizeof(mpu_bench_result)}
/* the first version ended before `wrong` */
#define MPU_BENCH_RESULT_MIN_SIZE offsetof(mpu_bench_result, wrong)

/*
 * Time cfg->iters calls of one collective on comm. Collective over comm: every
 * rank calls it with the same config, and every rank gets the same result
 * (the slowest rank's time of each iteration, then the median). Buffers are
 * allocated and filled here. On error *out is unchanged.
 */
MPU_API mpu_result_t mpu_bench_collective(mpu_comm *comm, const mpu_bench_config *cfg,
                                          mpu_bench_result *out);

/*
 * The same call on several communicators over the same ranks (e.g. one with
 * call checking on and one with it off), iteration by iteration interleaved
 * on the same buffers, with the native call too when cfg->native is set
 * (made on comms[0]). out[i] is comms[i]'s result; every out carries the
 * native time. ncomms is 1..7.
 */
MPU_API mpu_result_t mpu_bench_collectives(mpu_comm *const *comms, int ncomms,
                                           const mpu_bench_config *cfg, mpu_bench_result *out);

/* This thread's copy bandwidth in GB/s (bytes copied per second) over
 * buffers of `bytes`: median of `iters` copies, with streaming stores where
 * the threads backend would use them for the same footprint. */
MPU_API mpu_result_t mpu_bench_memcpy(size_t bytes, int iters, double *gbps);

/* The same with `threads` threads copying at once, each its own buffers:
 * *gbps is one thread's bandwidth while all copy (how far the memory system
 * scales past one core). */
MPU_API mpu_result_t mpu_bench_memcpy_concurrent(size_t bytes, int iters, int threads,
                                                 double *gbps);

/* A ceiling for moving a footprint of threads x 2 x bytes: the most bytes
 * per second, all threads together, of the best iteration of four ways of
 * copying it (threads threads of bytes each, or one thread of threads x bytes;
 * streaming stores or cached ones). `mpu bench`'s roof column divides each
 * collective's least traffic by twice this (a copy reads and writes). */
MPU_API mpu_result_t mpu_bench_copy_ceiling(size_t bytes, int iters, int threads, double *gbps);

/* The roof of one row of `mpu bench`: the collective of cfg (its collective,
 * dtype, op, bytes and in_place) on nranks ranks reduced to its least data
 * movement — every input it combines read once, every output written once —
 * cut into one task per rank's share and run by min(nranks, workers) threads
 * (workers <= 0: the online CPUs; the threads backend's own split), each on a
 * CPU of its own where there are enough, on buffers laid out and filled as
 * mpu_bench_collectives lays them out, with nothing between the threads but a
 * start line per iteration (spun on, where they have a CPU each). Several
 * ways are timed (cached and streaming stores; all_gather and broadcast
 * pulled by each output's owner, pushed from each input, or the two
 * alternating iteration by iteration). In every round each way runs
 * MPU_BENCH_SETTLE untimed iterations and then MPU_BENCH_ROOF_TIMED back to
 * back, and the round's figure is their mean (each iteration its slowest
 * thread's time), as the row is its mean over calls made back to back; *us
 * is the best such figure over mpu_bench_roof_rounds(cfg) rounds: the best
 * sustained rate of that movement on these cores, which the collective can
 * only reach by noise, since it does the same movement and waits for its
 * peers besides. */
MPU_API mpu_result_t mpu_bench_roof(const mpu_bench_config *cfg, int nranks, int workers,
                                    double *us);

/* The timed iterations of each way in a round of the roof (above). */
#define MPU_BENCH_ROOF_TIMED 4

/* The same roof a round at a time, to interleave with the row's own
 * iterations (mpu_bench_config's pauses): begin lays out and fills the
 * buffers, each round times every way once (as above), and end gives the
 * best figure of all rounds and frees everything (NULL us: just free).
 * A round runs its threads while the caller's other threads wait, so that
 * they have the CPUs to themselves; it is not to be called from two threads
 * at once. */
typedef struct mpu_bench_roof_run mpu_bench_roof_run;
MPU_API mpu_result_t mpu_bench_roof_begin(const mpu_bench_config *cfg, int nranks, int workers,
                                          mpu_bench_roof_run **out);
MPU_API mpu_result_t mpu_bench_roof_round(mpu_bench_roof_run *run);
/* Time the later rounds on the row's own buffers: rank's send and recv as
 * mpu_bench_collectives allocated them (the sizes of its layout for cfg,
 * before any in-place view), once every rank has lent its own; until then,
 * and where ranks are not threads of this process, on buffers of the roof's
 * own. So the roof's rounds leave the caches as the row's calls find them:
 * on buffers of their own they would evict the row's lines, and the row's
 * next calls would pay for it (docs/bench.md). Each rank lends its own slot,
 * so ranks may call it at once; rounds must follow every rank's call (the
 * pauses do). The run keeps the pointers, not the memory: lent buffers must
 * stay valid for every later round, so a round after a lender has freed its
 * buffers (after mpu_bench_collectives returned) is the caller's error. */
MPU_API mpu_result_t mpu_bench_roof_lend(mpu_bench_roof_run *run, int rank, void *send, void *recv);
/* How many rounds mpu_bench_roof times for cfg: its iterations, at most 50
 * up to 4 MiB and 40 above (0 for a NULL or bad config). */
MPU_API int mpu_bench_roof_rounds(const mpu_bench_config *cfg);
MPU_API mpu_result_t mpu_bench_roof_end(mpu_bench_roof_run *run, double *us);

#ifdef __cplusplus
}
#endif

#endif
