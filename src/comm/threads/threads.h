/*
 * threads.h - the threads backend's shared structures.
 *
 * A world is n ranks, each a thread of this process. A group is the state the
 * members of one communicator share: a barrier, each member's box (the
 * signature of its current call, and a tiny call's data), its full
 * description of a large call, and small staging buffers. Each member holds a
 * handle (tcomm) on the group with its own call counter.
 *
 * One call on a group goes: sign the call in mem[me].box[parity]; stage a
 * tiny call's input (at most MPU_THREADS_BOX bytes) beside the signature, a
 * small one's in scratch[parity][me], or describe a large call in full in
 * calls[parity][me]; arrive at the barrier; compare the signatures; move the
 * data; for large messages, wait at a second barrier so no rank returns while
 * a peer still reads its buffers. A tiny call so moves one line per peer
 * besides the barrier's. Alternating parity between consecutive calls lets a
 * small call need one barrier: a member cannot write parity p again before
 * every member has passed the next call's barrier, i.e. finished reading
 * parity p.
 *
 * Only the entry barrier of a call can fail (time out, see a peer abort, exit
 * or destroy its handle). Once every member has entered, the call completes:
 * the members are all inside it and need nothing else to finish.
 */
#ifndef MPU_COMM_THREADS_H
#define MPU_COMM_THREADS_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "comm/base/signature.h"
#include "comm/comm_internal.h"
#include "core/clock.h"

/* Per-member staging buffer for small calls; larger ones go zero-copy. */
#define MPU_THREADS_SCRATCH 16384

/* Why a group broke: packed into one word so the first breaker's reason is
 * what everyone reports. */
typedef enum tcause {
  TC_NONE = 0,
  TC_ABORTED,   /* the rank called mpu_comm_abort */
  TC_FAILED,    /* the rank's function returned an error */
  TC_EXITED,    /* the rank's function returned while peers waited for it */
  TC_DESTROYED, /* the rank destroyed its handle while peers waited for it */
  TC_TIMEOUT,   /* the rank never arrived within the timeout */
  TC_START,     /* the rank's thread could not be started */
} tcause;

/* reason word: cause << 48 | result code << 32 | (world rank + 1) */
static inline uint64_t tc_pack(tcause cause, mpu_result_t code, int world_rank) {
  return (uint64_t)cause << 48 | (uint64_t)code << 32 | (uint32_t)(world_rank + 1);
}

/* Lines every member writes on each call sit alone in 128 bytes (a line and
 * the neighbour that x86's adjacent-line prefetcher fetches with it): a read
 * of a field that merely shares such a line, or a member's write to its own
 * word beside another's, would move the line between cores once more per call. */
#define MPU_THREADS_LINE 128

typedef struct tbarrier {
  _Alignas(MPU_THREADS_LINE) _Atomic uint64_t state; /* BROKEN | generation << 32 | arrivals */
  _Atomic uint32_t futex;    /* generation's low bits: what sleepers wait on */
  _Atomic uint32_t sleepers; /* wake only when someone sleeps */
} tbarrier;

typedef struct tworld tworld;

/* A non-blocking call of a group (progress.c): each member's description,
 * and its state. It is ready when its last member starts it; the first member
 * that then waits for, tests or settles it moves its data. */
typedef struct top {
  struct top *next;
  uint64_t seq;          /* the members' seq-th non-blocking call on the group */
  int state;             /* TOP_PENDING, TOP_READY, TOP_RUNNING, TOP_DONE */
  int posted;            /* members that started it */
  int released;          /* members done with it (their handle released) */
  int moving;            /* TOP_RUNNING and checked: its tasks may be claimed */
  int next_task;         /* the next member's task to claim (one per member) */
  int tasks_done;        /* tasks finished: the op is done at n */
  mpu_result_t result;   /* TOP_DONE */
  char message[1024];    /* the failure's message, for every member */
  mpu__call *calls;      /* [member] */
  char *has;             /* [member]: started it */
} top;

/* What a tiny call stages in place of a scratch slot: at most this many
 * bytes, beside the signature on the same 128 bytes. */
#define MPU_THREADS_BOX (MPU_THREADS_LINE - sizeof(mpu__sig))

/* A member's box for one parity: the signature of every blocking call it
 * makes (what the members compare at entry) and, when what it stages fits,
 * the staged data itself, so a peer reads one line of it per call. */
typedef struct tbox {
  _Alignas(MPU_THREADS_LINE) mpu__sig sig;
  unsigned char data[MPU_THREADS_BOX];
} tbox;

/* What member m writes about itself, on lines of its own: what it writes on
 * each call (read by the others only when a wait goes long); what the others
 * read on each wait (written when it changes); the claims on task m, which
 * another member writes when fewer members than tasks work (collectives.c);
 * and its two boxes, written on each call and read by every peer. */
typedef struct tmember {
  _Alignas(MPU_THREADS_LINE) _Atomic uint64_t entered; /* number of the last call it entered */
  _Alignas(MPU_THREADS_LINE) _Atomic int cpu; /* the CPU it last arrived from (a hint) */
  _Atomic int departed;                       /* its handle was destroyed */
  _Alignas(MPU_THREADS_LINE) _Atomic uint64_t claims; /* the parts of task m in the large call
                              now running that no member has claimed yet, first << 32 | end */
  tbox box[2]; /* [parity] */
} tmember;

_Static_assert(sizeof(tbarrier) == MPU_THREADS_LINE, "the barrier's words share no line");
_Static_assert(sizeof(tbox) == MPU_THREADS_LINE, "a box is one line and its neighbour");
_Static_assert(offsetof(tmember, cpu) - offsetof(tmember, entered) >= MPU_THREADS_LINE &&
                   offsetof(tmember, claims) - offsetof(tmember, cpu) >= MPU_THREADS_LINE &&
                   offsetof(tmember, box) - offsetof(tmember, claims) >= MPU_THREADS_LINE &&
                   sizeof(tmember) % MPU_THREADS_LINE == 0,
               "a member's per-call words, its hints, its task's claims, its boxes and the next "
               "member's share no line");

typedef struct tgroup {
  uint64_t id;
  tworld *world;
  int n;
  int *members;                 /* world rank of each member */
  _Atomic int refs;             /* handles not yet destroyed */
  tbarrier bar;
  _Atomic uint64_t reason;      /* why the barrier broke (0: it did not) */
  mpu__call *calls[2];          /* [parity][member]: each member's large or uneven call */
  char *scratch[2];             /* [parity][member * MPU_THREADS_SCRATCH] */
  tmember *mem;                 /* [member]: what each member writes about itself */
  _Atomic uint32_t departures;  /* how many handles were destroyed: a waiter rescans the
                                   members only when this (or the world's exits) moved */
  pthread_mutex_t ops_lock;     /* guards ops and every top on it */
  pthread_cond_t ops_cond;      /* a top of this group finished */
  top *ops;                     /* non-blocking calls not yet released by every member */
} tgroup;

/* One rank's handle: the impl of an mpu_comm of the threads backend. */
typedef struct tcomm {
  _Alignas(MPU_THREADS_LINE) tgroup *g; /* seq and spin change on each call: no other rank's
                                           handle may share their line */
  int me;
  uint64_t seq;        /* calls made on this group */
  uint64_t nb_seq;     /* non-blocking calls started on this group */
  uint64_t nb_settled; /* ... of which the first nb_settled are known complete */
  long spin;           /* this rank's spin budget now: adapts between SPIN_MIN and the world's */
  unsigned shared_waits; /* waits that found a peer on this CPU (sync.c) */
  const void **ptrs;   /* [n] scratch for the kernels' source lists ... */
  void **dsts;         /* [n] ... and destination lists */
  mpu_comm *base;
  struct tcomm *prev, *next; /* the world's list of live handles */
} tcomm;

typedef struct tmsg {
  struct tmsg *next;
  uint64_t group;
  int src; /* world rank */
  size_t count;
  mpu_dtype dtype;
  char data[];
} tmsg;

typedef struct tmailbox {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  tmsg *head, *tail;
} tmailbox;

typedef struct tpending tpending;

struct tworld {
  int n;
  double timeout_s;
  int check_calls;
  long spin;                 /* most pause()s a wait spins before yielding (adaptive below it) */
  int yields;                /* sched_yield()s before sleeping, when ranks outnumber cores */
  long online;               /* CPUs online when the world started */
  /* how crowded the machine is (sync.c): sampled by the waits themselves */
  _Atomic int64_t crowd_at_us; /* when the runnable threads were last counted */
  _Atomic int crowded;       /* more runnable threads than CPUs (or a yield that came back late) */
  _Atomic long spin_cap;     /* the spin budget's ceiling now: spin, less on a crowded machine */
  int cpus;                  /* how many ranks work at once in large calls (online CPUs) */
  _Atomic uint64_t poison;   /* first fatal failure in the world (reason word) */
  _Atomic int failures;      /* ranks whose function has failed: numbers them in time */
  _Atomic int *gone;         /* [world rank]: its function returned */
  _Atomic uint32_t exits;    /* how many ranks have returned (see tgroup.departures) */
  tmailbox *boxes;           /* [world rank] */
  pthread_mutex_t lock;      /* guards pending, handles, next_id */
  tpending *pending;         /* group creations some members have joined */
  tcomm *handles;            /* every live handle, freed at the end if leaked */
  uint64_t next_id;
};

/* ---- sync.c ---- */

/* Arrive at g's barrier and wait for all members. With `breakable`, a wait
 * that sees the world poisoned, a member gone or the deadline pass breaks the
 * barrier for everyone and returns the error; without it (inside a call every
 * member has entered) the wait only ends when all arrive. */
mpu_result_t mpu__tbarrier(tcomm *tc, int breakable, const char *what);

/* The CPU mpu_launch binds rank `rank` of `nranks` to, from the CPUs
 * `allowed` and the launch's rotating `start`; -1: unbound (world.c). */
int mpu__tbind_cpu(const cpu_set_t *allowed, int nranks, unsigned start, int rank);

/* The error for a broken group, from its reason word. */
mpu_result_t mpu__tgroup_broken(const tgroup *g, const char *what);

/* Record a fatal failure of world_rank (first one wins) and wake sleepers. */
void mpu__tworld_poison(tworld *w, tcause cause, mpu_result_t code, int world_rank);

/* Text of a reason word ("world rank 3 aborted"). */
void mpu__treason_text(uint64_t reason, char *buf, size_t len);



/* ---- collectives.c / p2p.c ---- */

/* The backend's start: runs a checked call on a group of two or more to its
 * end (*handle = NULL). */
mpu_result_t mpu__tstart(mpu_comm *c, const mpu__call *call, void **handle);

/* The uneven collectives. */
mpu_result_t mpu__tuneven(tcomm *tc, const mpu__call *call);

/* Task t (0..n-1) of the call the members described in calls[0..n-1]: all n
 * tasks together move all its data, in any order, on any thread. */
void mpu__ttask(tcomm *tc, const mpu__call *calls, int t);

/* The verdict every member reaches on the members' descriptions of a call. */
mpu_result_t mpu__tcheck(const tcomm *tc, const mpu__call *calls, const char *fn);

/* The public name of a call kind, for messages. */

/* ---- progress.c: non-blocking calls ---- */

mpu_result_t mpu__tstart_nb(mpu_comm *c, const mpu__call *call, void **handle);
mpu_result_t mpu__ttest(mpu_comm *c, void *handle, int *done);
mpu_result_t mpu__twait(mpu_comm *c, void *handle, double timeout_s);
void mpu__trelease(mpu_comm *c, void *handle);

/* Before a blocking collective: wait until this member's earlier
 * non-blocking calls on the group completed (a blocking call sees their
 * results); their failure is the call's. */
mpu_result_t mpu__tsettle(tcomm *tc, const char *fn);

/* Set up / tear down a group's non-blocking state. */
void mpu__tops_init(tgroup *g);
void mpu__tops_free(tgroup *g);

mpu_result_t mpu__tsend(mpu_comm *c, const mpu__call *k);
mpu_result_t mpu__trecv(mpu_comm *c, const mpu__call *k);

/* The monotonic clock's time `seconds` from now, for pthread_cond_timedwait
 * on a condition variable of CLOCK_MONOTONIC. */
struct timespec mpu__tabs_after(double seconds);

/* Free every message still queued (world teardown). */
void mpu__tmailbox_drain(tmailbox *box);

#endif
