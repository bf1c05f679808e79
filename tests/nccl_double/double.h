/*
 * double.h - a test double for the subset of the CUDA runtime and NCCL that
 * src/comm/nccl/ uses, over host memory, for ranks that are threads of one
 * process. Only tests link it (libmpu_nccl_double:
 * cuda.c the runtime, comm.c NCCL's communicators, collectives.c its calls,
 * runtime.c the versions and device properties it pretends); it is never installed.
 * The NCCL backend is compiled once, against the real headers; linked with
 * this file instead of libcudart and libnccl it runs on any CPU.
 *
 * What it keeps of NCCL's and CUDA's documented behaviour:
 *   - device memory is memory the "device" owns, which the host cannot
 *     read or write (memory.h: a second mapping the double alone uses);
 *   - a stream runs its work in order, asynchronously to the host: each
 *     stream has a worker thread; events complete when the worker reaches
 *     them; cudaStreamQuery says cudaErrorNotReady while work is queued;
 *   - ncclCommInitRank blocks until all ranks of the id have joined;
 *   - a collective completes when every rank's stream has reached it;
 *     in-place forms as NCCL defines them (recvbuff == sendbuff, and the
 *     rank's block for all_gather / reduce_scatter);
 *   - ncclSend/ncclRecv match per (peer, order); a group holds its calls
 *     until ncclGroupEnd (sends and recvs of one communicator progress together);
 *   - ncclCommInitRank and ncclCommInitRankConfig block until every member
 *     came; with config->blocking = 0 they return ncclInProgress at once and
 *     finish in the background (ncclCommGetAsyncError says ncclInProgress
 *     until then), and ncclCommAbort ends one still in progress; a config not
 *     made with NCCL_CONFIG_INITIALIZER is refused; calls on such a
 *     communicator (a collective, ncclGroupEnd) return ncclInProgress as
 *     NCCL's may, the work enqueued once ncclCommGetAsyncError says so;
 *   - ncclCommSplit as NCCL 2.28's (init.cc, ncclCommInitChildComm and
 *     ncclCommInitRankFunc; group.cc, ncclAsyncLaunch): it blocks or not as
 *     the *parent* was made (the child's config decides only the child's
 *     mode); a non-blocking split leaves *newcomm NULL and runs as a job of
 *     the parent, whose async error says ncclInProgress until the job ends;
 *     the job then writes the child into *newcomm (a failed child too) and
 *     its result into the parent's async error; meanwhile the parent answers
 *     every call with ncclInvalidArgument (ncclCommEnsureReady), its
 *     ncclCommDestroy returns early *inside the group it opened* (this
 *     thread's later calls are held and never launched, as NCCL's; the same
 *     for a communicator whose async error is set), and its ncclCommAbort
 *     ends the job (the job still writes *newcomm first);
 *   - a split's meeting is the bootstrap's, apart from the kernels: a rank
 *     in a split and its peer in a collective on the same parent both hang
 *     until aborted;
 *   - splitShare = 1 (share.c): the child shares the parent's abort flag (an
 *     abort stops every communicator of the family, their pending work
 *     dropped without an error, as NCCL's kernels quit on the flag) and one
 *     device stream per rank on which the family's collectives run in the
 *     order they were issued;
 *   - ncclGroupEnd launches the communicators of a group in ascending
 *     commHash (include/group.h, ncclGroupCommJoin), the hash from the id or,
 *     for a split, from the parent's, its split count and the color;
 *   - ncclCommAbort stops only this rank's communicator: as on NVLink, P2P or
 *     SHM its peers are not told and hang in the collective until their own
 *     watchdog aborts them (switch "abort": they fail with ncclRemoteError);
 *   - the last error is one string for the whole process, as NCCL's (one
 *     static buffer, whichever thread or communicator wrote it last);
 *   - a send/recv pair whose sizes differ is undefined in NCCL: it hangs
 *     until the watchdog (switch "p2p_size": it fails at once);
 *   - memory is what CUDA says it is (memory.c): an NCCL call outside device,
 *     managed or registered memory faults, and the fault is sticky;
 *   - reductions follow NCCL's kernels (fminf/fmaxf, integer avg in the
 *     element type, pre-multiplied float avg, 16-bit rounding per step),
 *     with ncclRedOpCreatePreMulSum's user ops (a table per communicator,
 *     the op's state copied at enqueue) and, at one rank, the blocks of
 *     the oneRankReduce kernel (before NCCL 2.29.7 an odd tail unwritten),
 *     folded in rank order (NCCL's own order is a ring or tree; tests of the
 *     backend use exactly representable values).
 *   - the NCCL version, the driver's allocation ranges, the stream-ordered
 *     allocator and registered memory at another device address are what
 *     runtime.h says.
 * Each forgiving shortcut is a switch (switches.h).
 */
#ifndef MPU_TESTS_NCCL_DOUBLE_H
#define MPU_TESTS_NCCL_DOUBLE_H

#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- streams (cuda.c): a worker thread each ----------------------------------- */

typedef struct task {
  struct task *next;
  void (*run)(struct task *);
  void (*drop)(struct task *); /* the communicator was aborted before it ran */
  struct ncclComm *comm;        /* NULL for copies and events */
} task;

struct CUstream_st {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  task *head, *tail;
  int busy, stop;
  pthread_t worker;
  int device; /* current when it was made: its faults are that device's (memory.c) */
  unsigned flags;              /* cudaStreamNonBlocking or not */
  int legacy;                  /* the device's legacy default stream */
  long queries;                /* cudaStreamQuery calls on it (under lock) */
  struct order_actor *order;   /* its clock (order.h) */
  struct CUstream_st *next;    /* every stream, for the legacy stream's implicit waits */
};

/* A recorded event: done when the stream reaches it. Shared by the event and
 * the streams that wait for it, so an event may be destroyed or recorded
 * again while they wait, as CUDA allows. */
typedef struct double_mark {
  int refs, done; /* under the double's mark lock */
} double_mark;

struct CUevent_st {
  double_mark *mark;          /* the last record; NULL before the first */
  struct order_clock *order;  /* the recording stream's clock then */
};

/* NULL, cudaStreamLegacy and cudaStreamPerThread as the streams they name. */
cudaStream_t double_stream(cudaStream_t s);
void double_push(cudaStream_t s, task *t);
int double_current_device(void);

/* ---- NCCL (comm.c, collectives.c): cliques of ranks that share an id ---------- */

/* A send waiting for its recv: NCCL's point to point is a rendezvous (the
 * send completes when the peer receives), not an eager copy. */
typedef struct offer {
  struct offer *next;
  int src;
  size_t bytes;
  const void *data;
  int taken; /* 1: copied by the receiver; -1: the size differed */
} offer;

typedef struct slot {
  int kind;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  /* a user op of ncclRedOpCreatePreMulSum, copied at enqueue as NCCL copies
   * it (enqueue.cc, taskAppend: the handle may be destroyed before the
   * group ends): each input times the scalar, then summed */
  int premul;
  uint64_t scalar;            /* its bits, in the element type (ncclScalarHostImmediate) */
  const void *scalar_at;      /* or read when the kernel runs (ncclScalarDevice) */
} slot;

/* A comm's user reduction ops (enqueue.cc, ncclRedOpCreatePreMulSum): op
 * ncclNumOps + i is entry i while used. */
typedef struct user_op {
  int used;
  ncclDataType_t type;
  uint64_t scalar;
  const void *scalar_at; /* ncclScalarDevice: a device pointer, read at each kernel */
} user_op;

typedef struct clique {
  struct clique *next;
  ncclUniqueId id;
  int n, joined, refs, aborted;
  int duplicate;   /* two ranks on one device: NCCL refuses the communicator */
  int *devices;    /* [n] */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  uint64_t generation;
  uint64_t serial; /* unique in the process: names the cliques split from it (an address may be reused) */
  int arrived;
  slot *slots;
  /* the bootstrap's meeting (splits), apart from the kernels' */
  uint64_t boot_generation;
  int boot_arrived;
  int *boot_colors, *boot_keys; /* [n] */
  offer **boxes; /* [n]: sends waiting for rank i to receive them */
} clique;

struct ncclComm {
  clique *q;                   /* NULL while a non-blocking split has not found it */
  int rank;
  atomic_int aborted;          /* this rank's ncclCommAbort */
  _Atomic ncclResult_t async;  /* ncclInProgress while a non-blocking init runs */
  int inflight; /* tasks queued or running, under q->lock */
  pthread_t joiner;            /* the background init of a non-blocking config */
  int has_joiner;
  int nonblocking;             /* made with blocking = 0: calls may say ncclInProgress */
  uint64_t hash;               /* NCCL's commHash (group order) */
  int split_share;             /* its config's splitShare: its children share with it */
  int splits;                  /* ncclCommSplit calls on it: a child's hash eats the count */
  struct double_family *family; /* what it shares with splitShare relatives (share.c) */
  user_op *user_ops;           /* [nuser_ops] */
  int nuser_ops;
};
enum { K_ALL_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_BROADCAST, K_REDUCE, K_ALL_TO_ALL, K_SEND, K_RECV };

typedef struct coll_task {
  task t;
  slot s;
  int peer;
  struct coll_task *more; /* a group: the calls issued between ncclGroupStart and End */
} coll_task;

/* How many calls of an NCCL function ("ncclAlltoAll", "ncclSend", ...) were
 * enqueued in this process; -1 for a name it does not count. Exported. */
long double_call_count(const char *nccl_function);
/* NCCL's last error: one string for the process (comm.c) */
void double_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int double_meet(ncclComm_t c, clique *q);                /* comm.c */
/* aborted here, through its family's shared abort flag, or (switch
 * "abort") anywhere in its clique */
int double_stopped(ncclComm_t c);
/* wait on q's condition for a short while (aborts by a relative's flag
 * broadcast no condition of q) */
void double_wait_a_while(clique *q);

/* ---- splitShare (share.c) --------------------------------------------------------- */

/* A new family for a communicator made by init or an unshared split; the
 * parent's for a split with splitShare = 1. 0, or -1 when out of memory. */
int double_family_join(ncclComm_t c, ncclComm_t share_with);
void double_family_leave(ncclComm_t c);
/* NCCL's abort flag: set by ncclCommAbort, for the whole family. */
void double_family_abort(ncclComm_t c);
int double_family_aborted(ncclComm_t c);
/* Run a collective of a shared family: on the family's device stream, in
 * issue order, with `stream` waiting for it. 1 if it took the task. */
int double_family_submit(coll_task *k, cudaStream_t stream);
void double_submit(coll_task *k, cudaStream_t stream);   /* collectives.c */
void double_coll_run(task *t);                            /* collectives.c: a call's kernel */
/* ncclCommEnsureReady for a call: ncclInvalidArgument while an init or
 * split job of c runs (comm.c) */
ncclResult_t double_comm_ready(ncclComm_t c, const char *fn);
/* inside ncclGroupStart/End, calls are held until the end (comm.c) */
ncclResult_t double_group_hold(coll_task *k, cudaStream_t stream, int *was_held);
int double_group_depth(void); /* this thread's ncclGroupStart nesting */

#include "nccl_double/memory.h"
#include "nccl_double/order.h"
#include "nccl_double/switches.h"
#include "nccl_double/runtime.h"

#endif
