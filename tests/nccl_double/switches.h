/*
 * switches.h - the test double's forgiving shortcuts, off by default.
 *
 * The double behaves like NCCL and the CUDA runtime where a GPU run would
 * differ from a CPU one: what they refuse, leave undefined or do not tell
 * peers. A test that relies on a forgiving shortcut names it, in-process
 * with double_forgive() or for a whole program with the environment
 * variable MPU_DOUBLE_FORGIVE (a comma-separated list of the names below),
 * and says why in a comment.
 */
#ifndef MPU_TESTS_NCCL_DOUBLE_SWITCHES_H
#define MPU_TESTS_NCCL_DOUBLE_SWITCHES_H

typedef enum double_switch {
  DOUBLE_FORGIVE_POINTERS,   /* "pointers": any pointer is device memory */
  DOUBLE_FORGIVE_ABORT,      /* "abort": ncclCommAbort also fails its peers' pending work */
  DOUBLE_FORGIVE_ORDER,      /* "order": no stream-order checker */
  DOUBLE_FORGIVE_REDUCTIONS, /* "reductions": mpu's reduction rules, not NCCL's */
  DOUBLE_FORGIVE_P2P_SIZE,   /* "p2p_size": a send/recv size mismatch fails at once */
  DOUBLE_FORGIVE_SPLIT_EARLY, /* "split_early": a non-blocking split hands out the child at
                                 once and leaves the parent free (NCCL: NULL until done) */
  DOUBLE_FORGIVE_SHARE,      /* "share": splitShare = 1 shares neither abort flag nor stream */
  DOUBLE_FORGIVE_GROUP_ORDER, /* "group_order": a group launches in issue order, not commHash */
  DOUBLE_FORGIVE_PAGEABLE,   /* "pageable": an async copy from pageable memory reads it late */
  DOUBLE_FORGIVE_HOST_ACCESS, /* "host_access": the host may read and write cudaMalloc memory
                                 (CUDA: it faults) */
  DOUBLE_FORGIVE_FREE_NOWAIT, /* "free_nowait": cudaFree returns without waiting for the device */
  DOUBLE_SWITCHES
} double_switch;

/* Turn the named shortcuts (a comma-separated list) on or off; 0, or -1 if a
 * name is unknown. Exported by libmpu_nccl_double. */
int double_forgive(const char *names, int on);

/* Whether a shortcut is on (the environment is read on first use). */
int double_forgives(double_switch s);

/* What the double counted since the process started, for tests that check
 * how communicators are made: "init" (bootstraps by ncclCommInitRank or
 * ncclCommInitRankConfig), "split" (ncclCommSplit calls), "split_shared"
 * (those whose parent's config has splitShare = 1, as NCCL decides), "split_blocking_child"
 * (those whose config asked for a blocking child). -1 for an unknown name. */
long double_count(const char *name);

#endif
