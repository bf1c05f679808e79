/*
 * mpi.c - the MPI backend: MPI moves the bytes, comm/base reduces them.
 *
 * Results must be the bits every backend gives, so reductions never use
 * MPI's own operators (whose tree order, NaN and overflow rules are MPI's):
 *   all_reduce      small: all_gather every input, reduce locally in rank order;
 *                   large: all_to_all so rank k holds chunk k of every input,
 *                   reduce it in rank order, all_gather the chunks (the
 *                   bandwidth of a ring all-reduce; the threads backend's split)
 *   reduce_scatter  all_to_all of the blocks, then the local reduction
 *   reduce          two ranks: MPI_Reduce with mpu's kernel as a non-commutative
 *                   operator (one combine, in rank order); more: small calls
 *                   gather the inputs at the root, large ones are all_reduce's
 *                   chunks with a gather to the root
 * Bytes move as unsigned integers of the element's width, so a NaN's payload
 * or a float16 travels untouched.
 *
 * Safety (call checking, on by default): each collective first exchanges
 * its signature with every member in a small fixed-size block, so mismatched
 * calls fail on every rank with MPU_ERR_MISMATCH. The exchange is point to
 * point on communicators of up to MPU_MPI_P2P_CHECK_RANKS ranks (an Isend
 * and an Irecv per peer on the private duplicate nb: half the cost of Open
 * MPI's MPI_Iallgather on 2 processes), one MPI_Iallgather above; either
 * way the same MPI calls on every member whatever else it has pending (MPI
 * never matches a blocking collective with a non-blocking one), polled
 * (while it waits, the rank starts the data phases of its non-blocking
 * calls, see below). Without a timeout (the default: MPI has none) an 8-byte
 * call's input rides in the same block, so such a call costs one exchange.
 * With a timeout the polling is bounded, so a
 * rank that never comes ends the wait with MPU_ERR_TIMEOUT; the data phase
 * then also runs non-blocking under the timeout (a rank that arrives after
 * its peers gave up must not hang either), which is why the data never rides
 * with the signature there. A timed-out communicator is
 * broken: every later call fails at once. MPI cannot cancel a collective, so
 * the buffers of the timed-out request stay with MPI: the library's are
 * handed to the orphan list (freed when the request completes or at
 * mpu_mpi_finalize), the caller's must not be reused (docs/mpi.md).
 * With checking off, collectives are the plain blocking MPI calls.
 *
 * Point to point: send is eager (MPI_Isend of a private copy, tag = a base +
 * the dtype); recv matches a message with MPI_Improbe, polled against the
 * timeout, checks its dtype (the tag) and size before receiving it straight
 * into the caller's buffer, and drops a mismatched one as the threads backend
 * does. destroy never waits: sends still in flight are cancelled or orphaned.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "comm/mpi_internal.h"
#include "core/error.h"
#include "core/options.h"

#include <sched.h>

#include "comm/base/reduce.h"
#include "comm/base/module.h"
#include "comm/base/signature.h"
#include "core/env.h"
#include "mpu/comm_mpi.h"
#include "mpu/version.h"

/* Calls whose inputs together fit here gather everything and reduce locally:
 * one collective, latency-bound anyway. */
#define SMALL_BYTES ((size_t)32 << 10)
/* Large all_reduce calls go a segment at a time, so the chunks received are
 * still in cache when reduced and sent on: measured on 2 and 4 processes,
 * 1 MiB beat 256 KiB, 2 MiB, 4 MiB and unsegmented (which lost 40% to
 * MPI_Allreduce at 16 MiB). */
#define SEGMENT_BYTES ((size_t)1 << 20)
#define P2P_TAG 7000 /* + dtype: the tag tells recv what was sent */

/* ---- orphans: buffers MPI may still touch after we stopped waiting ------- */

#define ORPHAN_BUFS 4

typedef struct orphan {
  struct orphan *next;
  void *bufs[ORPHAN_BUFS];
  int nreqs;
  MPI_Request reqs[]; /* every one must complete before the buffers go */
} orphan;

static orphan *orphans;

/* Keep bufs until every one of reqs[n] completes (or MPI is finalised).
 * Without memory for the record, the buffers leak: freeing them under MPI
 * would be worse. */
static void orphan_add_all(const MPI_Request *reqs, int n, void *a, void *b, void *c, void *d) {
  orphan *o = malloc(sizeof *o + (size_t)n * sizeof *reqs);
  if (!o) return;
  *o = (orphan){orphans, {a, b, c, d}, n};
  memcpy(o->reqs, reqs, (size_t)n * sizeof *reqs);
  orphans = o;
}

static void orphan_add(MPI_Request req, void *a, void *b, void *c, void *d) {
  orphan_add_all(&req, 1, a, b, c, d);
}

static void orphan_free(orphan *o) {
  for (int i = 0; i < ORPHAN_BUFS; i++) free(o->bufs[i]);
  free(o);
}

/* Free the orphans whose requests have completed (all of them at finalize). */
static void orphans_progress(int all) {
  for (orphan **p = &orphans; *p;) {
    int done = all;
    if (!done) MPI_Testall((*p)->nreqs, (*p)->reqs, &done, MPI_STATUSES_IGNORE);
    if (done) {
      orphan *o = *p;
      *p = o->next;
      orphan_free(o);
    } else {
      p = &(*p)->next;
    }
  }
}

/* ---- the communicator ----------------------------------------------------- */

typedef struct pending_send {
  MPI_Request req;
  void *copy;
} pending_send;

/* What every checked collective exchanges first, one fixed-size block per
 * rank (the same size on every rank whatever it called, so even mismatched
 * calls are one valid MPI_Allgather): the call's signature, and a small
 * call's whole input with it, so that call is complete after this one
 * exchange (no extra round trip). The block is kept small: on Open MPI 4.1's
 * shared memory a 40-byte block (signature + 8) made an 8-byte all_reduce
 * 1.13x the raw MPI_Allreduce on 2 processes, 48 or 64 bytes 1.25x, 96 1.3x. */
#define CARRIED_BYTES 8
typedef struct carrier {
  mpu__sig sig;
  unsigned char data[CARRIED_BYTES];
} carrier;

/* Communicators of up to MPU_MPI_P2P_CHECK_RANKS ranks (default 16, at most
 * P2P_SIG_RANKS) exchange the blocks point to point: each rank sends its
 * block to every peer and receives one from each, on the private duplicate
 * `nb`; larger ones in one MPI_Iallgather. The size and the knob are the same
 * on every member, so all make the same MPI calls. On Open MPI 4.1's shared
 * memory the messages beat the MPI_Iallgather at every size measured (2: 0.24
 * vs 0.48 us; 4 to 32 oversubscribed on 2 cores, by a third), but their
 * number grows with the size while a network's latency does not. */
#define P2P_SIG_RANKS 64
#define SIG_TAG 1 /* the blocks' tag on nb (MPI keeps it apart from nb's collectives) */
#define SIG_REQS (2 * (P2P_SIG_RANKS - 1)) /* an exchange's requests, at most */

typedef struct mpi_impl {
  MPI_Comm comm;
  int checked;        /* signatures exchanged and compared on collectives */
  double timeout_s;
  mpu_result_t broken; /* the failure that broke it (0: not broken) */
  char why[320];
  pending_send *sends;
  int nsends, cap;
  int timed;          /* checked with a timeout: moves are non-blocking, polled */
  struct carrier *blk; /* this rank's signature block, then every member's [1 + size] */
  char *scratch;      /* the reductions' staging buffer */
  size_t scratch_cap;
  int *v;             /* [4 * size]: counts and displacements of the v-collectives */
  const void **ptrs;  /* [size]: the local reduction's sources */
  struct roll *roll;  /* timed: who a timeout missed (NULL: the message cannot say) */
  MPI_Comm nb;        /* checked, 2+ ranks: a duplicate where non-blocking data phases run */
  uint64_t nb_issued; /* checked non-blocking calls issued, */
  uint64_t nb_next;   /* and the next whose data phase may start */
  int orphaned;       /* non-blocking calls released while MPI still ran them */
  int p2p;            /* signatures exchanged point to point on nb (else MPI_Iallgather) */
  int sig_left;       /* an exchange was abandoned: a peer's block may still come to nb */
  MPI_Request x[SIG_REQS]; /* the blocking calls' exchange */
} mpi_impl;

static const mpu__comm_ops mpi_ops;
static int we_initialised;
static void drive(void);

static mpi_impl *impl_of(const mpu_comm *c) { return c->impl; }
static MPI_Comm comm_of(const mpu_comm *c) { return impl_of(c)->comm; }

static mpu_result_t check(int err, const char *what) {
  if (err == MPI_SUCCESS) return MPU_SUCCESS;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, text, &len);
  return mpu__error(MPU_ERR_BACKEND, "%s: MPI error: %.*s", what, len, text);
}

/* The type that moves elements of dt as bits. */
static MPI_Datatype bits_of(mpu_dtype dt) {
  switch (mpu_dtype_size(dt)) {
  case 1: return MPI_UINT8_T;
  case 2: return MPI_UINT16_T;
  case 4: return MPI_UINT32_T;
  default: return MPI_UINT64_T;
  }
}

/* MPI counts and displacements are int: count x blocks elements must fit. */
static mpu_result_t fits(const char *fn, size_t count, int blocks) {
  size_t elements;
  if (!__builtin_mul_overflow(count, (size_t)blocks, &elements) && elements <= INT32_MAX)
    return MPU_SUCCESS;
  return mpu__error(MPU_ERR_UNSUPPORTED,
                    "%s: %zu x %d elements in one MPI call (MPI counts are int; split the call)",
                    fn, count, blocks);
}

static mpu_result_t scratch(mpu_comm *c, size_t bytes, const char *fn, char **out) {
  mpi_impl *m = impl_of(c);
  if (bytes > m->scratch_cap) {
    char *grown = realloc(m->scratch, bytes);
    if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes of scratch", fn, bytes);
    m->scratch = grown;
    m->scratch_cap = bytes;
  }
  *out = m->scratch;
  return MPU_SUCCESS;
}

static mpu_result_t broken_error(const mpi_impl *m, const char *fn) {
  return mpu__error(m->broken, "%s: communicator is broken: %s", fn, m->why);
}

/* ---- who is missing: the notes behind a timeout's message -------------------
 *
 * MPI cannot say which ranks a timed-out collective still waits for, so
 * the ranks tell each other, on a duplicate of the communicator made with it
 * (timed communicators of 2+ ranks): a rank whose wait at step s of call k
 * lasts longer than note_after sends each member one note "waiting at (k, s)";
 * a rank that times out sends "gave up at (k, s)". The one that timed out
 * reads the notes that came (MPI_Iprobe, never blocking; up to a grace for
 * late ones) and names the members that neither waited at its step nor gave
 * up: they did not arrive. Fast calls send nothing (a counter moves); notes
 * are read every 64 calls and at destroy, where a note still in flight is
 * cancelled or left with the orphans. */

enum { NOTE_WAITING = 1, NOTE_GAVE_UP = 2 };
#define NOTE_AFTER_MAX_S 0.05 /* a wait this long (or a quarter of the timeout) sends notes */
#define NOTE_GRACE_S 0.2      /* after the timeout, how long notes in flight may take */

typedef struct note {
  int64_t call, step;
} note;

typedef struct roll {
  MPI_Comm comm;
  int size, me;
  double note_after;
  note at;           /* where this rank is: call k (entered), step s (waits in it) */
  int noted;         /* this step's "waiting" note is sent */
  note *reached;     /* [size]: the latest step each member said it waited at */
  note *gave_up;     /* [size]: where each member gave up (call 0: it has not) */
  MPI_Request *out;  /* [size]: this rank's last note to each member */
  note **out_buf;    /* [size]: its payload, freed when the send completes */
} roll;

static int note_before(note a, note b) {
  return a.call < b.call || (a.call == b.call && a.step < b.step);
}

/* Over comm (a duplicate, taken; every member makes it, whatever happens
 * after, so none waits for another's MPI_Comm_dup); NULL where a part cannot
 * be made: timeouts then say MPI cannot name anyone. */
static roll *roll_make(MPI_Comm comm, int size, int me, double timeout_s) {
  roll *r = comm == MPI_COMM_NULL ? NULL : calloc(1, sizeof *r);
  if (r) {
    r->reached = calloc((size_t)size, sizeof *r->reached);
    r->gave_up = calloc((size_t)size, sizeof *r->gave_up);
    r->out = malloc((size_t)size * sizeof *r->out);
    r->out_buf = calloc((size_t)size, sizeof *r->out_buf);
  }
  if (!r || !r->reached || !r->gave_up || !r->out || !r->out_buf) {
    if (r) free(r->reached), free(r->gave_up), free(r->out), free(r->out_buf), free(r);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    return NULL;
  }
  r->comm = comm;
  for (int p = 0; p < size; p++) r->out[p] = MPI_REQUEST_NULL;
  r->size = size, r->me = me;
  r->note_after = timeout_s / 4 < NOTE_AFTER_MAX_S ? timeout_s / 4 : NOTE_AFTER_MAX_S;
  return r;
}

/* Read every note that has come. */
static void roll_read(roll *r) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    note n;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, r->comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    if (MPI_Recv(&n, 2, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, r->comm, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS ||
        st.MPI_SOURCE < 0 || st.MPI_SOURCE >= r->size)
      continue;
    note *slot = st.MPI_TAG == NOTE_GAVE_UP ? &r->gave_up[st.MPI_SOURCE] : &r->reached[st.MPI_SOURCE];
    if (note_before(*slot, n)) *slot = n;
  }
}

/* Send every member a note of where this rank is. Skipped: a member whose
 * last note is still in flight (notes never pile up), and one that gave up
 * (it is leaving the communicator). */
static void roll_tell(roll *r, int tag) {
  roll_read(r);
  for (int p = 0; p < r->size; p++) {
    if (p == r->me || r->gave_up[p].call) continue;
    int done = 1;
    if (r->out[p] != MPI_REQUEST_NULL) MPI_Test(&r->out[p], &done, MPI_STATUS_IGNORE);
    if (!done) continue;
    free(r->out_buf[p]);
    r->out_buf[p] = malloc(sizeof(note));
    if (!r->out_buf[p]) continue;
    *r->out_buf[p] = r->at;
    if (MPI_Isend(r->out_buf[p], 2, MPI_INT64_T, p, tag, r->comm, &r->out[p]) != MPI_SUCCESS) {
      free(r->out_buf[p]);
      r->out_buf[p] = NULL, r->out[p] = MPI_REQUEST_NULL;
    }
  }
}

/* A checked call begins: its number, and now and then the notes read. */
static void roll_enter(roll *r) {
  r->at.call++, r->at.step = 0;
  if ((r->at.call & 63) == 0) roll_read(r);
}

/* Member p at this rank's step: 0 here (waiting at it or later, or gave up
 * there: a peer of this timeout), 1 missing, 2 gave up at an earlier step. */
static int roll_where(const roll *r, int p) {
  if (p == r->me || !note_before(r->reached[p], r->at) || !note_before(r->gave_up[p], r->at))
    return 0;
  return r->gave_up[p].call ? 2 : 1;
}

/* After the timeout: say so, give late notes the grace, and write who did
 * not arrive (and who had given up) into text, "rank 3 did not arrive". */
static void roll_names(const mpu_comm *c, roll *r, char *text, size_t cap) {
  roll_tell(r, NOTE_GAVE_UP);
  double start = MPI_Wtime(), grace = r->note_after + NOTE_GRACE_S;
  int missing = 0, gone = 0;
  for (;;) {
    roll_read(r);
    missing = gone = 0;
    for (int p = 0; p < r->size; p++) {
      int where = roll_where(r, p);
      missing += where == 1, gone += where == 2;
    }
    if (!missing || MPI_Wtime() - start > grace) break;
    sched_yield();
  }
  size_t used = 0;
  text[0] = 0;
  for (int pass = 0; pass < 2; pass++) { /* the missing, then those that gave up */
    int want = pass ? gone : missing, listed = 0;
    if (!want) continue;
    used += (size_t)snprintf(text + used, cap - used, "%s%s ", used ? "; " : "",
                             want == 1 ? "rank" : "ranks");
    for (int p = 0; p < r->size && used < cap; p++) {
      if (roll_where(r, p) != 1 + pass) continue;
      if (listed == 8) {
        used += (size_t)snprintf(text + used, cap - used, " and %d more", want - listed);
        break;
      }
      used += (size_t)snprintf(text + used, cap - used, "%s%d", listed ? ", " : "", p);
      if (c->world_ranks && c->world_ranks[p] != p && used < cap)
        used += (size_t)snprintf(text + used, cap - used, " (world %d)", c->world_ranks[p]);
      listed++;
    }
    if (used < cap)
      used += (size_t)snprintf(text + used, cap - used, "%s",
                               pass ? " had given up (timed out) before" : " did not arrive");
    if (used >= cap) used = cap - 1;
  }
}

/* The duplicates of destroyed communicators, freed at mpu_mpi_finalize: Open
 * MPI gives a freed communicator's id to the next one made, and a note still
 * on its way to a freed one would land in that successor, out of its message
 * order, and stall it. Kept, a late note lands here and is drained. */
static MPI_Comm *retired;
static int nretired, retired_cap;

static void drain(MPI_Comm comm) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    int64_t late[MPU__MPI_LATE_WORDS]; /* a note, or an abort channel's message */
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    MPI_Recv(late, MPU__MPI_LATE_WORDS, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, comm,
             MPI_STATUS_IGNORE);
  }
}

static void retire(MPI_Comm comm) {
  if (nretired == retired_cap) {
    int cap = retired_cap ? 2 * retired_cap : 16;
    MPI_Comm *grown = realloc(retired, (size_t)cap * sizeof *grown);
    if (!grown) { /* freed now, then: a late note is unlikely, a leak is not better */
      MPI_Comm_free(&comm);
      return;
    }
    retired = grown, retired_cap = cap;
  }
  retired[nretired++] = comm;
}

void mpu__mpi_retire(MPI_Comm comm) { retire(comm); }

/* A send (or MPI_REQUEST_NULL) that may never be received, ended without
 * blocking: done, or cancelled, its buffer freed; else left with the orphans. */
void mpu__mpi_end_send(MPI_Request *req, void *buf) {
  int done = 1;
  if (*req != MPI_REQUEST_NULL) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(req);
      MPI_Test(req, &done, MPI_STATUS_IGNORE);
    }
  }
  if (done) free(buf);
  else orphan_add(*req, buf, NULL, NULL, NULL);
}

/* At finalize: every late note read, every duplicate freed. */
static void retired_free(void) {
  for (int i = 0; i < nretired; i++) {
    drain(retired[i]);
    MPI_Comm_free(&retired[i]);
  }
  free(retired);
  retired = NULL, nretired = retired_cap = 0;
}

/* Never blocks: notes that came are read, notes still going out cancelled
 * or left with the orphans (MPI may still read them), the duplicate retired. */
static void roll_free(roll *r) {
  if (!r) return;
  roll_read(r);
  for (int p = 0; p < r->size; p++) mpu__mpi_end_send(&r->out[p], r->out_buf[p]);
  retire(r->comm);
  free(r->reached), free(r->gave_up), free(r->out), free(r->out_buf), free(r);
}

/* Wait for req, polling, no longer than the timeout. On timeout the
 * communicator breaks and the request, with the library's buffers it may
 * still use, goes to the orphans. */
static mpu_result_t wait_all(mpu_comm *c, MPI_Request *reqs, int nreqs, const char *fn,
                             const char *phase) {
  mpi_impl *m = impl_of(c);
  roll *r = m->roll;
  double start = MPI_Wtime();
  if (r) r->at.step++, r->noted = 0;
  for (long spins = 0;; spins++) {
    int done = 0;
    MPU_CHECK(check(MPI_Testall(nreqs, reqs, &done, MPI_STATUSES_IGNORE), fn));
    if (done) return MPU_SUCCESS;
    drive(); /* a peer may wait for a non-blocking call only this rank can start */
    if ((spins & 63) == 63) {
      double waited = MPI_Wtime() - start;
      if (waited > m->timeout_s) break;
      if (r && !r->noted && waited > r->note_after) roll_tell(r, NOTE_WAITING), r->noted = 1;
      sched_yield(); /* ranks may outnumber cores: let the late one run */
    }
  }
  char names[160] = "";
  if (r) roll_names(c, r, names, sizeof names);
  snprintf(m->why, sizeof m->why, "%s timed out after %.3g s %s (communicator of %d ranks: %s)",
           fn, m->timeout_s, phase, c->size,
           !r ? "MPI cannot name the missing ones"
           : names[0] ? names
                      : "every rank was waiting at this step, MPI did not complete it");
  m->broken = MPU_ERR_TIMEOUT;
  orphan_add_all(reqs, nreqs, m->blk, m->scratch, m->v, NULL); /* MPI may still write them */
  m->blk = NULL, m->scratch = NULL, m->v = NULL, m->scratch_cap = 0;
  m->sig_left = 1;
  return mpu__error(MPU_ERR_TIMEOUT, "%s", m->why);
}

static mpu_result_t wait_for(mpu_comm *c, MPI_Request *req, const char *fn, const char *phase) {
  return wait_all(c, req, 1, fn, phase);
}

/* A blocking call begins after the non-blocking calls issued before it on
 * its communicator completed (it may read their outputs), driving every
 * pending call meanwhile, under the communicator's timeout. */
static mpu_result_t settle(mpu_comm *c, const char *fn) {
  mpi_impl *m = impl_of(c);
  double start = MPI_Wtime();
  for (long spins = 0; m->nb_next != m->nb_issued; spins++) {
    drive();
    if (m->broken) return broken_error(m, fn);
    if ((spins & 63) == 63) {
      if (MPI_Wtime() - start > m->timeout_s) {
        snprintf(m->why, sizeof m->why,
                 "%s timed out after %.3g s waiting for the non-blocking calls issued before it "
                 "(communicator of %d ranks)",
                 fn, m->timeout_s, c->size);
        m->broken = MPU_ERR_TIMEOUT;
        return mpu__error(MPU_ERR_TIMEOUT, "%s", m->why);
      }
      sched_yield();
    }
  }
  return MPU_SUCCESS;
}

/* The bytes of this rank's input a call carries in its signature block, or
 * SIZE_MAX where the call is too large (or uneven) to ride along. */
static size_t carried_bytes(const mpu_comm *c, const mpu__call *k) {
  size_t bytes, es = mpu_dtype_size((mpu_dtype)k->sig.dtype);
  int whole = k->sig.kind == MPU_COLL_REDUCE_SCATTER || k->sig.kind == MPU_COLL_ALL_TO_ALL;
  switch (k->sig.kind) {
  case MPU_COLL_BARRIER: return 0;
  case MPU_COLL_ALL_REDUCE: case MPU_COLL_REDUCE: case MPU_COLL_ALL_GATHER:
  case MPU_COLL_BROADCAST: case MPU_COLL_REDUCE_SCATTER: case MPU_COLL_ALL_TO_ALL:
    if (__builtin_mul_overflow((size_t)k->sig.count, es, &bytes) ||
        (whole && __builtin_mul_overflow(bytes, (size_t)c->size, &bytes)))
      return SIZE_MAX;
    return bytes <= CARRIED_BYTES ? bytes : SIZE_MAX;
  default: return SIZE_MAX;
  }
}

/* Start the exchange of this rank's block blk[0] into blk[1 + p] of every
 * member p; *nreqs requests (at most SIG_REQS) to complete. Point to point, the
 * k-th call's blocks pair up on every rank whether the call is blocking or
 * not: MPI keeps the messages of one source, communicator and tag in order,
 * and every call of the communicator starts its exchange here, in issue order.
 * If posting fails part way, the posted requests are in reqs[*nreqs]. */
static mpu_result_t sig_start(mpu_comm *c, carrier *blk, MPI_Request *reqs, int *nreqs,
                              const char *fn) {
  mpi_impl *m = impl_of(c);
  int n = c->size, me = c->rank, k = 0, err = MPI_SUCCESS;
  *nreqs = 0;
  if (!m->p2p) {
    MPU_CHECK(check(MPI_Iallgather(&blk[0], (int)sizeof *blk, MPI_BYTE, &blk[1], (int)sizeof *blk,
                                   MPI_BYTE, m->comm, reqs),
                    fn));
    *nreqs = 1;
    return MPU_SUCCESS;
  }
  blk[1 + me] = blk[0];
  for (int i = 1; i < n && err == MPI_SUCCESS; i++) { /* receives first: no unexpected copies */
    int p = (me + i) % n;
    err = MPI_Irecv(&blk[1 + p], (int)sizeof *blk, MPI_BYTE, p, SIG_TAG, m->nb, &reqs[k]);
    k += err == MPI_SUCCESS;
  }
  for (int i = 1; i < n && err == MPI_SUCCESS; i++) {
    int p = (me + n - i) % n;
    err = MPI_Isend(&blk[0], (int)sizeof *blk, MPI_BYTE, p, SIG_TAG, m->nb, &reqs[k]);
    k += err == MPI_SUCCESS;
  }
  *nreqs = k;
  return check(err, fn);
}

/* A failed sig_start (MPI refused to post a message): the communicator is
 * broken, what was posted stays with MPI, with the block buffer. */
static mpu_result_t sig_abandon(mpu_comm *c, MPI_Request *reqs, int nreqs, carrier *blk,
                                mpu_result_t r) {
  mpi_impl *m = impl_of(c);
  orphan_add_all(reqs, nreqs, blk, NULL, NULL, NULL);
  m->sig_left = 1;
  m->broken = r;
  snprintf(m->why, sizeof m->why, "%s", mpu_last_error());
  return r;
}

/* Start of every collective: refuse on a broken communicator, and with
 * checking on exchange the call's signature with every member, in fixed-size
 * blocks (sig_start), polled. A small call's input travels in the same block: *done is set when
 * the exchange brought every input this rank needs (finish_carried then
 * completes the call locally). */
static mpu_result_t enter(mpu_comm *c, const mpu__call *k, const char *fn, int *done) {
  mpi_impl *m = impl_of(c);
  *done = 0;
  if (m->broken) return broken_error(m, fn);
  if (orphans) orphans_progress(0);
  MPU_CHECK(settle(c, fn));
  if (!m->checked || c->size == 1) return MPU_SUCCESS;
  if (m->roll) roll_enter(m->roll);
  size_t carried = m->timed ? SIZE_MAX : carried_bytes(c, k);
  carrier *mine = &m->blk[0];
  mine->sig = k->sig;
  if (carried != SIZE_MAX && carried) {
    const void *src = k->sig.kind == MPU_COLL_BROADCAST ? k->recv : k->send;
    if (k->sig.kind != MPU_COLL_BROADCAST || c->rank == k->sig.root)
      memcpy(mine->data, src, carried);
  }
  /* polled, never a blocking MPI call: while it waits, this rank starts the
   * data phases of its non-blocking calls that peers may be waiting for */
  int nreqs;
  mpu_result_t r = sig_start(c, m->blk, m->x, &nreqs, fn);
  if (r) {
    carrier *blk = m->blk;
    m->blk = NULL;
    return sig_abandon(c, m->x, nreqs, blk, r);
  }
  MPU_CHECK(wait_all(c, m->x, nreqs, fn, "waiting for every rank to enter the call"));
  for (int p = 0; p < c->size; p++) /* the common case: every block says the same */
    if (memcmp(&m->blk[1 + p].sig, &mine->sig, sizeof mine->sig)) {
      MPU_CHECK(mpu__sig_compare(fn, &m->blk[1], sizeof *mine, c->size, c->world_ranks,
                                 MPU__CHECK_ALL));
      break;
    }
  *done = carried != SIZE_MAX;
  return MPU_SUCCESS;
}

/* Complete a call whose inputs all arrived in the signature blocks. */
static mpu_result_t finish_carried(mpu_comm *c, const mpu__call *k, const carrier *blk) {
  MPU__CALL_ARGS(k);
  mpi_impl *m = impl_of(c);
  int n = c->size, me = c->rank;
  size_t bytes = count * mpu_dtype_size(dt);
  const void **ptrs = m->ptrs;
  switch (k->sig.kind) {
  case MPU_COLL_ALL_REDUCE:
  case MPU_COLL_REDUCE:
    if (k->sig.kind == MPU_COLL_REDUCE && me != root) return MPU_SUCCESS;
    for (int p = 0; p < n; p++) ptrs[p] = blk[1 + p].data;
    mpu__reduce(recv, ptrs, n, count, dt, op, n);
    return MPU_SUCCESS;
  case MPU_COLL_REDUCE_SCATTER:
    for (int p = 0; p < n; p++) ptrs[p] = blk[1 + p].data + (size_t)me * bytes;
    mpu__reduce(recv, ptrs, n, count, dt, op, n);
    return MPU_SUCCESS;
  case MPU_COLL_ALL_GATHER:
    for (int p = 0; p < n && bytes; p++)
      memcpy((char *)recv + (size_t)p * bytes, blk[1 + p].data, bytes);
    return MPU_SUCCESS;
  case MPU_COLL_ALL_TO_ALL:
    for (int p = 0; p < n && bytes; p++)
      memcpy((char *)recv + (size_t)p * bytes, blk[1 + p].data + (size_t)me * bytes, bytes);
    return MPU_SUCCESS;
  case MPU_COLL_BROADCAST:
    if (me != root && bytes) memcpy(recv, blk[1 + root].data, bytes);
    return MPU_SUCCESS;
  default: return MPU_SUCCESS; /* barrier: the exchange was the barrier */
  }
}

/* ---- the moves: blocking calls, or non-blocking ones under the timeout ---- */

#define DATA_PHASE "in the data phase (a peer left the call)"

static mpu_result_t x_allgather(mpu_comm *c, const char *fn, const void *s, void *r, int n,
                                MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed) return check(MPI_Allgather(s, n, t, r, n, t, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Iallgather(s, n, t, r, n, t, comm_of(c), &q), fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_allgatherv(mpu_comm *c, const char *fn, void *r, const int *counts,
                                 const int *displs, MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed)
    return check(MPI_Allgatherv(MPI_IN_PLACE, 0, t, r, counts, displs, t, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Iallgatherv(MPI_IN_PLACE, 0, t, r, counts, displs, t, comm_of(c), &q), fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_alltoall(mpu_comm *c, const char *fn, const void *s, void *r, int n,
                               MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed) return check(MPI_Alltoall(s, n, t, r, n, t, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Ialltoall(s, n, t, r, n, t, comm_of(c), &q), fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_alltoallv(mpu_comm *c, const char *fn, const void *s, const int *sc,
                                const int *sd, void *r, const int *rc, const int *rd,
                                MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed)
    return check(MPI_Alltoallv(s, sc, sd, t, r, rc, rd, t, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Ialltoallv(s, sc, sd, t, r, rc, rd, t, comm_of(c), &q), fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_bcast(mpu_comm *c, const char *fn, void *b, int n, MPI_Datatype t,
                            int root) {
  MPI_Request q;
  if (!impl_of(c)->timed) return check(MPI_Bcast(b, n, t, root, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Ibcast(b, n, t, root, comm_of(c), &q), fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_gather(mpu_comm *c, const char *fn, const void *s, void *r, int n,
                             MPI_Datatype t, int root) {
  MPI_Request q;
  if (!impl_of(c)->timed) return check(MPI_Gather(s, n, t, r, n, t, root, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Igather(s, n, t, r, n, t, root, comm_of(c), &q), fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_gatherv(mpu_comm *c, const char *fn, const void *s, int n, void *r,
                              const int *counts, const int *displs, MPI_Datatype t, int root) {
  MPI_Request q;
  if (!impl_of(c)->timed)
    return check(MPI_Gatherv(s, n, t, r, counts, displs, t, root, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Igatherv(s, n, t, r, counts, displs, t, root, comm_of(c), &q), fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}


/* ---- reductions ------------------------------------------------------------ */

/* The chunk plan of a large reduction over count elements: rank k owns chunk
 * k; v = [send counts | send displs | recv counts | recv displs], where each
 * rank sends chunk k of its input to rank k and receives its own chunk from
 * every rank, stacked in rank order. Returns this rank's chunk length. */
static int plan_chunks(mpu_comm *c, size_t count) {
  int n = c->size, *v = impl_of(c)->v;
  size_t lo = mpu__chunk_lo(count, n, c->rank), mine = mpu__chunk_lo(count, n, c->rank + 1) - lo;
  for (int k = 0; k < n; k++) {
    size_t a = mpu__chunk_lo(count, n, k), b = mpu__chunk_lo(count, n, k + 1);
    v[k] = (int)(b - a);
    v[n + k] = (int)a;
    v[2 * n + k] = (int)mine;
    v[3 * n + k] = (int)((size_t)k * mine);
  }
  return (int)mine;
}

/* Sources for the local reduction: the size blocks of `bytes` stacked at base. */
static const void *const *blocks(mpu_comm *c, const char *base, size_t bytes) {
  const void **ptrs = impl_of(c)->ptrs;
  for (int k = 0; k < c->size; k++) ptrs[k] = base + (size_t)k * bytes;
  return ptrs;
}

/* Every member's chunk of the inputs, in rank order, lands in the scratch
 * (which has room for `spare` more chunks after them); *mine is this rank's
 * chunk length. */
static mpu_result_t exchange_chunks(mpu_comm *c, const char *fn, const void *send, size_t count,
                                    mpu_dtype dt, int spare, int *mine, char **stacked) {
  int n = c->size, *v = impl_of(c)->v;
  *mine = plan_chunks(c, count);
  size_t chunk = (size_t)*mine * mpu_dtype_size(dt);
  MPU_CHECK(scratch(c, (size_t)(n + spare) * chunk + 1, fn, stacked));
  return x_alltoallv(c, fn, send, v, v + n, *stacked, v + 2 * n, v + 3 * n, bits_of(dt));
}

static mpu_result_t mpi_all_reduce(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_all_reduce";
  int n = c->size;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(fits(fn, count, n));
  char *stacked = NULL;
  if (bytes * (size_t)n <= SMALL_BYTES) {
    MPU_CHECK(scratch(c, bytes * (size_t)n + 1, fn, &stacked));
    MPU_CHECK(x_allgather(c, fn, send, stacked, (int)count, bits_of(dt)));
    mpu__reduce(recv, blocks(c, stacked, bytes), n, count, dt, op, n);
    return MPU_SUCCESS;
  }
  /* segment by segment, so each segment's chunks are still in cache when
   * they are reduced and sent on */
  size_t seg = SEGMENT_BYTES / es < (size_t)n ? (size_t)n : SEGMENT_BYTES / es;
  for (size_t off = 0; off < count; off += seg) {
    size_t m = count - off < seg ? count - off : seg;
    int mine, *v = impl_of(c)->v;
    char *out = (char *)recv + off * es;
    MPU_CHECK(exchange_chunks(c, fn, (const char *)send + off * es, m, dt, 0, &mine, &stacked));
    mpu__reduce(out + (size_t)v[n + c->rank] * es, blocks(c, stacked, (size_t)mine * es), n,
                (size_t)mine, dt, op, n);
    MPU_CHECK(x_allgatherv(c, fn, out, v, v + n, bits_of(dt)));
  }
  return MPU_SUCCESS;
}

static mpu_result_t mpi_reduce_scatter(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_reduce_scatter";
  int n = c->size;
  size_t bytes = count * mpu_dtype_size(dt);
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(fits(fn, count, n));
  char *stacked = NULL;
  MPU_CHECK(scratch(c, bytes * (size_t)n + 1, fn, &stacked));
  MPU_CHECK(x_alltoall(c, fn, send, stacked, (int)count, bits_of(dt)));
  mpu__reduce(recv, blocks(c, stacked, bytes), n, count, dt, op, n);
  return MPU_SUCCESS;
}

/* ---- two ranks: MPI's own reduce with mpu's kernel as the operator ---------
 *
 * With two ranks there is one combine, x0 op x1, and MPI applies a
 * non-commutative operator in rank order (inoutvec = invec op inoutvec, invec
 * from the lower rank): so MPI_Reduce with mpu's kernel as a user operator
 * gives mpu's bits in one MPI call, the traffic of MPI's own reduce. Each
 * dtype moves as its own committed type, so the operator knows what it got. */

static MPI_Datatype pair_types[MPU_DTYPE_COUNT];
static MPI_Op pair_ops[MPU_OP_COUNT];
static int pair_ready;

static void pair_combine(void *in, void *inout, int *len, MPI_Datatype *type, mpu_op op) {
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    if (*type == pair_types[dt]) {
      const void *srcs[2] = {in, inout};
      mpu__reduce(inout, srcs, 2, (size_t)*len, (mpu_dtype)dt, op, 2);
      return;
    }
}

#define PAIR_OP(name, op) \
  static void name(void *in, void *inout, int *len, MPI_Datatype *type) { \
    pair_combine(in, inout, len, type, op); \
  }
PAIR_OP(pair_sum, MPU_SUM)
PAIR_OP(pair_prod, MPU_PROD)
PAIR_OP(pair_min, MPU_MIN)
PAIR_OP(pair_max, MPU_MAX)
PAIR_OP(pair_avg, MPU_AVG)
#undef PAIR_OP

static mpu_result_t pair_setup(const char *fn) {
  if (pair_ready) return MPU_SUCCESS;
  MPI_User_function *f[MPU_OP_COUNT] = {pair_sum, pair_prod, pair_min, pair_max, pair_avg};
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++) {
    MPU_CHECK(check(MPI_Type_contiguous(1, bits_of((mpu_dtype)dt), &pair_types[dt]), fn));
    MPU_CHECK(check(MPI_Type_commit(&pair_types[dt]), fn));
  }
  for (int op = 0; op < MPU_OP_COUNT; op++)
    MPU_CHECK(check(MPI_Op_create(f[op], 0 /* not commutative: rank order */, &pair_ops[op]), fn));
  pair_ready = 1;
  return MPU_SUCCESS;
}

static mpu_result_t reduce_pair(mpu_comm *c, const char *fn, const void *send, void *recv,
                                size_t count, mpu_dtype dt, mpu_op op, int root) {
  MPU_CHECK(pair_setup(fn));
  int me = c->rank == root;
  const void *s = me && send == recv ? MPI_IN_PLACE : send;
  MPI_Datatype t = pair_types[dt];
  MPI_Request q;
  if (!impl_of(c)->timed)
    return check(MPI_Reduce(s, me ? recv : NULL, (int)count, t, pair_ops[op], root, comm_of(c)), fn);
  MPU_CHECK(check(MPI_Ireduce(s, me ? recv : NULL, (int)count, t, pair_ops[op], root, comm_of(c), &q),
                  fn));
  return wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t mpi_reduce(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_reduce";
  int n = c->size, me = c->rank == root;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(fits(fn, count, n));
  if (n == 2) return reduce_pair(c, fn, send, recv, count, dt, op, root);
  char *stacked = NULL;
  if (bytes * (size_t)n <= SMALL_BYTES) {
    MPU_CHECK(scratch(c, bytes * (size_t)n + 1, fn, &stacked));
    MPU_CHECK(x_gather(c, fn, send, stacked, (int)count, bits_of(dt), root));
    if (me) mpu__reduce(recv, blocks(c, stacked, bytes), n, count, dt, op, n);
    return MPU_SUCCESS;
  }
  /* as all_reduce, segment by segment, with a gather to the root at the end */
  size_t seg = SEGMENT_BYTES / es < (size_t)n ? (size_t)n : SEGMENT_BYTES / es;
  for (size_t off = 0; off < count; off += seg) {
    size_t m = count - off < seg ? count - off : seg;
    int mine, *v = impl_of(c)->v;
    MPU_CHECK(exchange_chunks(c, fn, (const char *)send + off * es, m, dt, 1, &mine, &stacked));
    size_t chunk = (size_t)mine * es;
    /* the root reduces its chunk in place in recv; the others after the stack */
    char *out = me ? (char *)recv + off * es : NULL;
    char *dst = me ? out + (size_t)v[n + c->rank] * es : stacked + (size_t)n * chunk;
    mpu__reduce(dst, blocks(c, stacked, chunk), n, (size_t)mine, dt, op, n);
    MPU_CHECK(x_gatherv(c, fn, me ? MPI_IN_PLACE : dst, mine, out, v, v + n, bits_of(dt), root));
  }
  return MPU_SUCCESS;
}

/* ---- moves ------------------------------------------------------------------ */

/* int counts and displacements for MPI's v-calls (v: 4 x size ints). */
static mpu_result_t ints(mpu_comm *c, const char *fn, const size_t *a, int *out) {
  for (int i = 0; i < c->size; i++) {
    if (a[i] > (size_t)INT_MAX)
      return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu elements exceed what MPI can count (%d)",
                        fn, a[i], INT_MAX);
    out[i] = (int)a[i];
  }
  return MPU_SUCCESS;
}

static mpu_result_t mpi_uneven(mpu_comm *c, const mpu__call *k) {
  const char *fn = k->sig.kind == MPU_COLL_ALL_GATHER_V       ? "mpu_comm_all_gather_v"
                   : k->sig.kind == MPU_COLL_REDUCE_SCATTER_V ? "mpu_comm_reduce_scatter_v"
                                                              : "mpu_comm_all_to_all_v";
  int n = c->size, me = c->rank, *v = impl_of(c)->v;
  mpu_dtype dt = (mpu_dtype)k->sig.dtype;
  size_t es = mpu_dtype_size(dt);
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(ints(c, fn, k->counts, v));
  if (k->sig.kind == MPU_COLL_ALL_GATHER_V) {
    MPU_CHECK(ints(c, fn, k->displs, v + n));
    char *mine = (char *)k->recv + k->displs[me] * es;
    if (mine != k->send && k->counts[me]) memcpy(mine, k->send, k->counts[me] * es);
    return x_allgatherv(c, fn, k->recv, v, v + n, bits_of(dt));
  }
  if (k->sig.kind == MPU_COLL_ALL_TO_ALL_V) {
    MPU_CHECK(ints(c, fn, k->displs, v + n));
    MPU_CHECK(ints(c, fn, k->rcounts, v + 2 * n));
    MPU_CHECK(ints(c, fn, k->rdispls, v + 3 * n));
    return x_alltoallv(c, fn, k->send, v, v + n, k->recv, v + 2 * n, v + 3 * n, bits_of(dt));
  }
  /* reduce_scatter_v: block k of every input to rank k, stacked in rank
   * order, then reduced here in that order (mpu's bits, as reduce_scatter) */
  size_t mine = k->counts[me], off = 0;
  for (int p = 0; p < n; p++) {
    if (off > (size_t)INT_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: offset %zu", fn, off);
    v[n + p] = (int)off;
    off += k->counts[p];
    v[2 * n + p] = (int)mine;
    v[3 * n + p] = (int)((size_t)p * mine);
  }
  MPU_CHECK(fits(fn, mine, n));
  char *stacked = NULL;
  MPU_CHECK(scratch(c, mine * es * (size_t)n + 1, fn, &stacked));
  MPU_CHECK(x_alltoallv(c, fn, k->send, v, v + n, stacked, v + 2 * n, v + 3 * n, bits_of(dt)));
  mpu__reduce(k->recv, blocks(c, stacked, mine * es), n, mine, dt, (mpu_op)k->sig.op, n);
  return MPU_SUCCESS;
}

/* ---- non-blocking calls: started at issue, progressed by every wait ---------
 *
 * A non-blocking call starts when it is issued, so it progresses while its
 * caller waits for something else (a wait in any order completes, as with
 * MPI's own I-calls). Unchecked, the call is one MPI I-call at once (the
 * reductions gather the inputs into the request's own buffer and reduce them
 * in rank order when it completes: mpu's bits). Checked, the signature
 * exchange (sig_start) starts at once, in issue order with the blocking
 * calls' exchanges; the data phase, the same single I-call, starts
 * once the signatures matched, on a duplicate of the communicator (`nb`),
 * where data phases start in issue order on every rank (MPI's rule for a
 * communicator's collectives). Only mpu code can start a data phase, so every
 * wait, test, recv and blocking call's signature exchange drives every pending
 * call of the process (drive). The backend is FUNNELED: one thread calls MPI,
 * so the list needs no lock. */

enum { NB_SIG, NB_READY, NB_DATA, NB_DONE };

typedef struct nbreq {
  struct nbreq *next; /* every pending call of the process, in issue order */
  mpu_comm *c;
  mpu__call call;
  const char *fn;
  int phase;
  int counted;       /* its turn in the communicator's data-phase order is taken */
  uint64_t seq;      /* issue number among the communicator's checked calls */
  MPI_Request req;   /* the data phase */
  MPI_Request x[SIG_REQS]; /* the signature exchange (checked) */
  int nx;
  mpu_result_t result;
  char message[512];
  carrier *blk;      /* [1 + size]: the signatures (checked) */
  char *buf;         /* the gathered inputs of a reduction */
  int *v;            /* [4 * size]: the v-calls' counts and displacements */
  const void **ptrs; /* [size]: the reduction's sources */
} nbreq;

static nbreq *nb_head, *nb_tail;

static const char *coll_fn(int kind) {
  const mpu__coll *k = mpu__coll_of(kind);
  return k ? k->ifn : "mpu non-blocking call";
}

static void nb_fail(nbreq *q, mpu_result_t r) {
  q->phase = NB_DONE;
  q->result = r;
  snprintf(q->message, sizeof q->message, "%s", mpu_last_error());
}

static int nb_finished(const nbreq *q) { return q->phase == NB_DONE && q->counted; }

static void nb_free_bufs(nbreq *q) {
  free(q->blk), free(q->buf), free(q->v), free(q->ptrs);
  q->blk = NULL, q->buf = NULL, q->v = NULL, q->ptrs = NULL;
}

/* The data phase: one MPI I-call over `w` (the caller's buffers, or the
 * request's own where a reduction follows). */
static mpu_result_t nb_data_start(nbreq *q, MPI_Comm w) {
  mpu__call *k = &q->call;
  MPU__CALL_ARGS(k);
  mpu_comm *c = q->c;
  const char *fn = q->fn;
  int n = c->size, me = c->rank, *v = q->v;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  MPI_Datatype t = bits_of(dt);
  switch (k->sig.kind) {
  case MPU_COLL_ALL_REDUCE:
    MPU_CHECK(fits(fn, count, n));
    return check(MPI_Iallgather(send, (int)count, t, q->buf, (int)count, t, w, &q->req), fn);
  case MPU_COLL_ALL_GATHER: {
    const char *in_place = (const char *)recv + (size_t)me * bytes;
    MPU_CHECK(fits(fn, count, n));
    return check(MPI_Iallgather(send == in_place ? MPI_IN_PLACE : send, (int)count, t, recv,
                                (int)count, t, w, &q->req),
                 fn);
  }
  case MPU_COLL_REDUCE_SCATTER:
    MPU_CHECK(fits(fn, count, n));
    return check(MPI_Ialltoall(send, (int)count, t, q->buf, (int)count, t, w, &q->req), fn);
  case MPU_COLL_BROADCAST:
    MPU_CHECK(fits(fn, count, 1));
    return check(MPI_Ibcast(recv, (int)count, t, root, w, &q->req), fn);
  case MPU_COLL_REDUCE:
    MPU_CHECK(fits(fn, count, n));
    if (n == 2) { /* one combine in rank order: MPI's reduce with mpu's kernel */
      MPU_CHECK(pair_setup(fn));
      const void *s = me == root && send == recv ? MPI_IN_PLACE : send;
      return check(MPI_Ireduce(s, me == root ? recv : NULL, (int)count, pair_types[dt], pair_ops[op],
                               root, w, &q->req),
                   fn);
    }
    return check(MPI_Igather(send, (int)count, t, q->buf, (int)count, t, root, w, &q->req), fn);
  case MPU_COLL_ALL_TO_ALL:
    MPU_CHECK(fits(fn, count, n));
    return check(MPI_Ialltoall(send, (int)count, t, recv, (int)count, t, w, &q->req), fn);
  case MPU_COLL_BARRIER: return check(MPI_Ibarrier(w, &q->req), fn);
  case MPU_COLL_ALL_GATHER_V: {
    char *mine = (char *)recv + k->displs[me] * es;
    if (mine != send && k->counts[me]) memcpy(mine, send, k->counts[me] * es);
    return check(MPI_Iallgatherv(MPI_IN_PLACE, 0, t, recv, v, v + n, t, w, &q->req), fn);
  }
  case MPU_COLL_ALL_TO_ALL_V:
    return check(MPI_Ialltoallv(send, v, v + n, t, recv, v + 2 * n, v + 3 * n, t, w, &q->req), fn);
  default: /* reduce_scatter_v: block k of every input to rank k, stacked */
    return check(MPI_Ialltoallv(send, v, v + n, t, q->buf, v + 2 * n, v + 3 * n, t, w, &q->req),
                 fn);
  }
}

/* The data phase completed: the reductions reduce in rank order. */
static void nb_data_finish(nbreq *q) {
  mpu__call *k = &q->call;
  MPU__CALL_ARGS(k);
  int n = q->c->size;
  size_t es = mpu_dtype_size(dt), per = count;
  switch (k->sig.kind) {
  case MPU_COLL_REDUCE:
    if (n == 2 || q->c->rank != root) return;
    break;
  case MPU_COLL_REDUCE_SCATTER_V: per = k->counts[q->c->rank]; break;
  case MPU_COLL_ALL_REDUCE: case MPU_COLL_REDUCE_SCATTER: break;
  default: return;
  }
  for (int p = 0; p < n; p++) q->ptrs[p] = q->buf + (size_t)p * per * es;
  mpu__reduce(recv, q->ptrs, n, per, dt, op, n);
}

/* Buffers and int counts for the data phase (checked where a call can
 * fail, before anything starts). */
static mpu_result_t nb_prepare(nbreq *q) {
  mpu__call *k = &q->call;
  mpu_comm *c = q->c;
  const char *fn = q->fn;
  int n = c->size, kind = k->sig.kind;
  size_t es = mpu_dtype_size((mpu_dtype)k->sig.dtype), count = (size_t)k->sig.count, stack = 0;
  q->v = calloc(4 * (size_t)n, sizeof *q->v);
  q->ptrs = calloc((size_t)n, sizeof *q->ptrs);
  if (!q->v || !q->ptrs) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", fn);
  int *v = q->v;
  if (kind == MPU_COLL_ALL_GATHER_V || kind == MPU_COLL_ALL_TO_ALL_V) {
    MPU_CHECK(ints(c, fn, k->counts, v));
    MPU_CHECK(ints(c, fn, k->displs, v + n));
    if (kind == MPU_COLL_ALL_TO_ALL_V) {
      MPU_CHECK(ints(c, fn, k->rcounts, v + 2 * n));
      MPU_CHECK(ints(c, fn, k->rdispls, v + 3 * n));
    }
  } else if (kind == MPU_COLL_REDUCE_SCATTER_V) {
    size_t mine = k->counts[c->rank], off = 0;
    MPU_CHECK(ints(c, fn, k->counts, v));
    for (int p = 0; p < n; p++) {
      if (off > (size_t)INT_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: offset %zu", fn, off);
      v[n + p] = (int)off;
      off += k->counts[p];
    }
    MPU_CHECK(fits(fn, mine, n));
    for (int p = 0; p < n; p++) v[2 * n + p] = (int)mine, v[3 * n + p] = (int)((size_t)p * mine);
    stack = mine;
  } else if (kind == MPU_COLL_ALL_REDUCE || kind == MPU_COLL_REDUCE_SCATTER ||
             (kind == MPU_COLL_REDUCE && n > 2 && c->rank == k->sig.root)) {
    MPU_CHECK(fits(fn, count, n));
    stack = count;
  }
  if (stack) {
    size_t bytes;
    if (__builtin_mul_overflow(stack * es, (size_t)n, &bytes))
      return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu elements x %d ranks", fn, stack, n);
    q->buf = malloc(bytes);
    if (!q->buf) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", fn, bytes);
  }
  return MPU_SUCCESS;
}

/* Start the data phase of q (its turn has come), or finish it. */
static void nb_begin_data(nbreq *q) {
  mpi_impl *m = impl_of(q->c);
  mpu_result_t r = m->broken ? broken_error(m, q->fn) : nb_data_start(q, m->checked ? m->nb : m->comm);
  if (r) nb_fail(q, r);
  else q->phase = NB_DATA;
}

/* One pass over every pending call of the process, in issue order. */
static void drive(void) {
  for (nbreq *q = nb_head; q; q = q->next) {
    mpu_comm *c = q->c;
    mpi_impl *m = impl_of(c);
    if (m->broken && !nb_finished(q)) { /* a timeout broke it: MPI keeps the call */
      q->phase = NB_DONE, q->counted = 1, q->result = m->broken;
      snprintf(q->message, sizeof q->message, "%s: communicator is broken: %s", q->fn, m->why);
      continue;
    }
    if (q->phase == NB_SIG || q->phase == NB_DATA) {
      int done = 0;
      mpu_result_t r =
          check(q->phase == NB_SIG ? MPI_Testall(q->nx, q->x, &done, MPI_STATUSES_IGNORE)
                                   : MPI_Test(&q->req, &done, MPI_STATUS_IGNORE),
                q->fn);
      if (r) {
        nb_fail(q, r);
      } else if (done && q->phase == NB_DATA) {
        nb_data_finish(q);
        q->phase = NB_DONE;
      } else if (done) { /* the signatures came */
        q->phase = NB_READY;
        for (int p = 0; p < c->size; p++)
          if (memcmp(&q->blk[1 + p].sig, &q->blk[0].sig, sizeof q->blk[0].sig)) {
            r = mpu__sig_compare(q->fn, &q->blk[1], sizeof *q->blk, c->size, c->world_ranks,
                                 MPU__CHECK_ALL);
            if (r) nb_fail(q, r);
            break;
          }
        if (q->phase == NB_READY && carried_bytes(c, &q->call) != SIZE_MAX && !m->timed) {
          /* the inputs rode with the signatures */
          finish_carried(c, &q->call, q->blk);
          q->phase = NB_DONE;
        }
      }
    }
    /* the communicator's calls run one after the other in issue order, as
     * the blocking ones do (a later call may read an earlier one's output):
     * a data phase starts when the one before it completed (a failed or
     * carried call takes its turn without one, on every rank alike) */
    if (!q->counted && q->seq == m->nb_next) {
      if (q->phase == NB_READY) nb_begin_data(q);
      if (q->phase == NB_DONE) q->counted = 1, m->nb_next++;
    }
  }
}

static void nb_unlink(nbreq *q) {
  nbreq *prev = NULL;
  for (nbreq *p = nb_head; p; prev = p, p = p->next)
    if (p == q) {
      if (prev) prev->next = q->next;
      else nb_head = q->next;
      if (nb_tail == q) nb_tail = prev;
      return;
    }
}


static mpu_result_t mpi_start_nb(mpu_comm *c, const mpu__call *call, void **handle) {
  mpi_impl *m = impl_of(c);
  *handle = NULL;
  nbreq *q = calloc(1, sizeof *q);
  if (!q) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", coll_fn(call->sig.kind));
  q->c = c, q->call = *call, q->fn = coll_fn(call->sig.kind), q->req = MPI_REQUEST_NULL;
  mpu_result_t r = m->broken ? broken_error(m, q->fn) : nb_prepare(q);
  if (!r && orphans) orphans_progress(0);
  if (!r && m->checked) {
    size_t carried = m->timed ? SIZE_MAX : carried_bytes(c, call);
    q->blk = calloc((size_t)c->size + 1, sizeof *q->blk);
    if (!q->blk) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", q->fn);
    if (!r) {
      q->blk[0].sig = call->sig;
      if (carried != SIZE_MAX && carried &&
          (call->sig.kind != MPU_COLL_BROADCAST || c->rank == call->sig.root))
        memcpy(q->blk[0].data, call->sig.kind == MPU_COLL_BROADCAST ? call->recv : call->send,
               carried);
      r = sig_start(c, q->blk, q->x, &q->nx, q->fn);
      if (r) { /* what was posted stays with MPI; peers time out as on a lost rank */
        sig_abandon(c, q->x, q->nx, q->blk, r);
        q->blk = NULL;
      }
      q->phase = NB_SIG;
      q->seq = m->nb_issued++;
    }
  } else if (!r) { /* unchecked: the data phase at once where no earlier call is pending */
    q->phase = NB_READY;
    q->seq = m->nb_issued++;
  }
  if (r) { /* nothing was started */
    nb_free_bufs(q);
    free(q);
    return r;
  }
  if (nb_tail) nb_tail->next = q;
  else nb_head = q;
  nb_tail = q;
  drive();
  *handle = q;
  return MPU_SUCCESS;
}

static mpu_result_t nb_result(nbreq *q) {
  if (!q->result) return MPU_SUCCESS;
  return mpu__error(q->result, "%s", q->message);
}

static mpu_result_t mpi_test(mpu_comm *c, void *handle, int *done) {
  (void)c;
  nbreq *q = handle;
  drive();
  *done = nb_finished(q);
  return *done ? nb_result(q) : MPU_SUCCESS;
}

/* Polls every pending call until q completes. timeout_s < 0: the
 * communicator's timeout, after which it is broken (as a blocking call);
 * otherwise q stays pending. */
static mpu_result_t mpi_wait(mpu_comm *c, void *handle, double timeout_s) {
  nbreq *q = handle;
  mpi_impl *m = impl_of(c);
  double limit = timeout_s < 0 ? m->timeout_s : timeout_s, start = MPI_Wtime();
  for (long spins = 0;; spins++) {
    drive();
    if (nb_finished(q)) return nb_result(q);
    if ((spins & 63) == 63) {
      if (MPI_Wtime() - start > limit) break;
      sched_yield(); /* ranks may outnumber cores: let the late one run */
    }
  }
  if (timeout_s >= 0)
    return mpu__error(MPU_ERR_TIMEOUT, "%s: not complete within %.3g s", q->fn, timeout_s);
  snprintf(m->why, sizeof m->why,
           "%s timed out after %.3g s %s (communicator of %d ranks: MPI cannot name the missing "
           "ones of a non-blocking call)",
           q->fn, limit,
           q->phase == NB_SIG ? "waiting for every rank to enter the call" : DATA_PHASE, c->size);
  m->broken = MPU_ERR_TIMEOUT;
  return mpu__error(MPU_ERR_TIMEOUT, "%s", m->why);
}

/* Never blocks: a call MPI still runs keeps its buffers in the orphans. */
static void mpi_release(mpu_comm *c, void *handle) {
  (void)c;
  nbreq *q = handle;
  nb_unlink(q);
  MPI_Request all[1 + SIG_REQS]; /* the data phase and the exchange (left by a broken call) */
  int n = 0, done = 1, sig_done = 1;
  if (q->nx) MPI_Testall(q->nx, q->x, &sig_done, MPI_STATUSES_IGNORE);
  if (q->req != MPI_REQUEST_NULL) all[n++] = q->req;
  for (int i = 0; i < q->nx; i++) all[n++] = q->x[i];
  if (n) MPI_Testall(n, all, &done, MPI_STATUSES_IGNORE);
  if (!done) {
    mpi_impl *m = impl_of(q->c);
    m->orphaned++;
    if (!sig_done) m->sig_left = 1;
    orphan_add_all(all, n, q->blk, q->buf, q->v, (void *)q->ptrs);
    q->blk = NULL, q->buf = NULL, q->v = NULL, q->ptrs = NULL;
  }
  nb_free_bufs(q);
  free(q);
}

/* The backend's start: every call runs to its end here. */
static mpu_result_t mpi_all_gather(mpu_comm *c, const mpu__call *k);
static mpu_result_t mpi_broadcast(mpu_comm *c, const mpu__call *k);
static mpu_result_t mpi_all_to_all(mpu_comm *c, const mpu__call *k);
static mpu_result_t mpi_barrier(mpu_comm *c, const mpu__call *k);

static mpu_result_t mpi_start(mpu_comm *c, const mpu__call *k, void **handle) {
  *handle = NULL;
  switch (k->sig.kind) {
  case MPU_COLL_ALL_REDUCE: return mpi_all_reduce(c, k);
  case MPU_COLL_ALL_GATHER: return mpi_all_gather(c, k);
  case MPU_COLL_REDUCE_SCATTER: return mpi_reduce_scatter(c, k);
  case MPU_COLL_BROADCAST: return mpi_broadcast(c, k);
  case MPU_COLL_REDUCE: return mpi_reduce(c, k);
  case MPU_COLL_ALL_TO_ALL: return mpi_all_to_all(c, k);
  case MPU_COLL_BARRIER: return mpi_barrier(c, k);
  default: return mpi_uneven(c, k);
  }
}

static mpu_result_t mpi_all_gather(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_all_gather";
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(fits(fn, count, c->size));
  const char *in_place = (const char *)recv + (size_t)c->rank * count * mpu_dtype_size(dt);
  return x_allgather(c, fn, send == in_place ? MPI_IN_PLACE : send, recv, (int)count,
                     bits_of(dt));
}

static mpu_result_t mpi_broadcast(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_broadcast";
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(fits(fn, count, 1));
  return x_bcast(c, fn, recv, (int)count, bits_of(dt), root);
}

static mpu_result_t mpi_all_to_all(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_all_to_all";
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(fits(fn, count, c->size));
  return x_alltoall(c, fn, send, recv, (int)count, bits_of(dt));
}

static mpu_result_t mpi_barrier(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_barrier";
  int done;
  MPU_CHECK(enter(c, k, fn, &done));
  if (done) return finish_carried(c, k, impl_of(c)->blk);
  return check(MPI_Barrier(comm_of(c)), fn);
}

/* ---- point to point ---------------------------------------------------------- */

/* Free the sends that have completed. */
static void progress_sends(mpi_impl *m) {
  int kept = 0;
  for (int i = 0; i < m->nsends; i++) {
    int done = 0;
    MPI_Test(&m->sends[i].req, &done, MPI_STATUS_IGNORE);
    if (done) free(m->sends[i].copy);
    else m->sends[kept++] = m->sends[i];
  }
  m->nsends = kept;
}

static mpu_result_t mpi_send(mpu_comm *c, const mpu__call *k) {
  static const char fn[] = "mpu_comm_send";
  MPU__CALL_ARGS(k);
  const void *buf = send;
  mpi_impl *m = impl_of(c);
  if (m->broken) return broken_error(m, fn);
  MPU_CHECK(fits(fn, count, 1));
  progress_sends(m);
  if (m->nsends == m->cap) {
    int cap = m->cap ? 2 * m->cap : 8;
    pending_send *grown = realloc(m->sends, (size_t)cap * sizeof *grown);
    if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    m->sends = grown, m->cap = cap;
  }
  size_t bytes = count * mpu_dtype_size(dt);
  void *copy = malloc(bytes ? bytes : 1);
  if (!copy) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", fn, bytes);
  if (bytes) memcpy(copy, buf, bytes);
  pending_send *p = &m->sends[m->nsends];
  mpu_result_t r =
      check(MPI_Isend(copy, (int)count, bits_of(dt), peer, P2P_TAG + (int)dt, m->comm, &p->req), fn);
  if (r) {
    free(copy);
    return r;
  }
  p->copy = copy;
  m->nsends++;
  return MPU_SUCCESS;
}

static mpu_result_t mpi_recv(mpu_comm *c, const mpu__call *k) {
  static const char fn[] = "mpu_comm_recv";
  MPU__CALL_ARGS(k);
  void *buf = recv;
  mpi_impl *m = impl_of(c);
  if (m->broken) return broken_error(m, fn);
  MPU_CHECK(fits(fn, count, 1));
  progress_sends(m);
  MPI_Message msg;
  MPI_Status st;
  double start = MPI_Wtime();
  for (long spins = 0;; spins++) {
    int found = 0;
    MPU_CHECK(check(MPI_Improbe(peer, MPI_ANY_TAG, m->comm, &found, &msg, &st), fn));
    if (found) break;
    drive(); /* the sender may wait for a non-blocking call of ours first */
    if ((spins & 63) == 63) {
      if (MPI_Wtime() - start > m->timeout_s) {
        /* nothing of ours is pending: the communicator stays usable */
        return mpu__error(MPU_ERR_TIMEOUT, "%s: no message from rank %d within %.3g s", fn, peer,
                          m->timeout_s);
      }
      sched_yield();
    }
  }
  int bytes = 0;
  MPI_Get_count(&st, MPI_BYTE, &bytes);
  int tag_dt = st.MPI_TAG - P2P_TAG;
  mpu_dtype got = tag_dt >= 0 && tag_dt < MPU_DTYPE_COUNT ? (mpu_dtype)tag_dt : dt;
  size_t got_count = (size_t)bytes / mpu_dtype_size(got);
  mpu_result_t r = mpu__recv_mismatch(count, dt, got_count, got, peer);
  if (r) { /* drop it, as every backend does */
    char *sink = malloc(bytes > 0 ? (size_t)bytes : 1);
    MPI_Mrecv(sink ? (void *)sink : NULL, sink ? bytes : 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    free(sink);
    return r;
  }
  return check(MPI_Mrecv(buf, (int)count, bits_of(dt), &msg, MPI_STATUS_IGNORE), fn);
}

/* ---- making and ending communicators --------------------------------------- */

/* A handle over newcomm (taken), with the settings of `like` (or opts). */
static mpu_result_t wrap(MPI_Comm newcomm, int checked, double timeout_s, mpu_comm **out) {
  static const char fn[] = "mpi backend";
  int rank, size;
  MPI_Comm_set_errhandler(newcomm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(newcomm, &rank);
  MPI_Comm_size(newcomm, &size);
  MPI_Comm notes = MPI_COMM_NULL; /* the roll's, first: MPI_Comm_dup is collective */
  if (checked && isfinite(timeout_s) && size > 1 && MPI_Comm_dup(newcomm, &notes) != MPI_SUCCESS)
    notes = MPI_COMM_NULL;
  MPI_Comm nb = MPI_COMM_NULL; /* where checked non-blocking calls move their data */
  if (checked && size > 1 && MPI_Comm_dup(newcomm, &nb) != MPI_SUCCESS) {
    if (notes != MPI_COMM_NULL) MPI_Comm_free(&notes);
    MPI_Comm_free(&newcomm);
    return mpu__error(MPU_ERR_BACKEND, "%s: MPI_Comm_dup failed", fn);
  }
  mpi_impl *impl = calloc(1, sizeof *impl);
  int *mine = malloc((size_t)size * sizeof(int)), *world = malloc((size_t)size * sizeof(int));
  mpu_comm *c = NULL;
  if (impl) {
    impl->nb = MPI_COMM_NULL;
    impl->blk = calloc((size_t)size + 1, sizeof *impl->blk);
    impl->v = calloc(4 * (size_t)size, sizeof(int));
    impl->ptrs = calloc((size_t)size, sizeof *impl->ptrs);
  }
  if (impl && impl->blk && impl->v && impl->ptrs && mine && world) {
    MPI_Group g, wg;
    MPI_Comm_group(newcomm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    for (int i = 0; i < size; i++) mine[i] = i;
    MPI_Group_translate_ranks(g, size, mine, wg, world);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    impl->comm = newcomm;
    impl->checked = checked;
    impl->timeout_s = timeout_s;
    impl->timed = checked && isfinite(timeout_s);
    impl->roll = roll_make(notes, size, rank, timeout_s);
    notes = MPI_COMM_NULL;
    impl->nb = nb;
    nb = MPI_COMM_NULL;
    long p2p_ranks = mpu__env_mpi_p2p_check_ranks();
    impl->p2p = checked && size > 1 && size <= p2p_ranks && size <= P2P_SIG_RANKS;
    for (int i = 0; i < SIG_REQS; i++) impl->x[i] = MPI_REQUEST_NULL;
    c = mpu__comm_new(&mpi_ops, rank, size, world, impl);
  }
  free(mine);
  free(world);
  if (notes != MPI_COMM_NULL) MPI_Comm_free(&notes);
  if (!c) {
    if (impl && impl->nb != MPI_COMM_NULL) MPI_Comm_free(&impl->nb);
    if (nb != MPI_COMM_NULL) MPI_Comm_free(&nb);
    if (impl) free(impl->blk), free(impl->v), free(impl->ptrs), roll_free(impl->roll);
    free(impl);
    MPI_Comm_free(&newcomm);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: communicator of %d", fn, size);
  }
  *out = c;
  return MPU_SUCCESS;
}

static mpu_result_t mpi_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out) {
  static const char fn[] = "mpu_comm_create_group";
  mpi_impl *m = impl_of(c);
  if (m->broken) return broken_error(m, fn);
  MPU_CHECK(settle(c, fn)); /* a collective of the communicator: after the calls before it */
  MPI_Group parent, group;
  MPI_Comm newcomm = MPI_COMM_NULL;
  MPU_CHECK(check(MPI_Comm_group(comm_of(c), &parent), fn));
  mpu_result_t r = check(MPI_Group_incl(parent, n, members, &group), fn);
  MPI_Group_free(&parent);
  if (r) return r;
  r = check(MPI_Comm_create_group(comm_of(c), group, 4242, &newcomm), fn);
  MPI_Group_free(&group);
  return r ? r : wrap(newcomm, m->checked, m->timeout_s, out);
}

static mpu_result_t mpi_split(mpu_comm *c, int color, int key, mpu_comm **out) {
  static const char fn[] = "mpu_comm_split";
  mpi_impl *m = impl_of(c);
  if (m->broken) return broken_error(m, fn);
  MPU_CHECK(settle(c, fn)); /* a collective of the communicator: after the calls before it */
  MPI_Comm newcomm = MPI_COMM_NULL;
  MPU_CHECK(check(MPI_Comm_split(comm_of(c), color == MPU_COMM_SPLIT_NOCOLOR ? MPI_UNDEFINED : color,
                                 key, &newcomm),
                  fn));
  if (newcomm == MPI_COMM_NULL) {
    *out = NULL;
    return MPU_SUCCESS;
  }
  return wrap(newcomm, m->checked, m->timeout_s, out);
}

static mpu_result_t mpi_abort(mpu_comm *c) {
  MPI_Abort(comm_of(c), 1); /* MPI ends every process of the job */
  return MPU_SUCCESS;
}

/* Never blocks: a send nobody received is cancelled, or left to MPI with its
 * buffer in the orphans. */
static void mpi_destroy(mpu_comm *c) {
  mpi_impl *m = c->impl;
  progress_sends(m);
  for (int i = 0; i < m->nsends; i++) {
    int done = 0;
    MPI_Cancel(&m->sends[i].req);
    MPI_Test(&m->sends[i].req, &done, MPI_STATUS_IGNORE);
    if (done) free(m->sends[i].copy);
    else orphan_add(m->sends[i].req, m->sends[i].copy, NULL, NULL, NULL);
  }
  free(m->sends);
  free(m->blk);
  free(m->scratch);
  free(m->v);
  free(m->ptrs);
  roll_free(m->roll);
  if (m->orphaned) {
    /* Open MPI's non-blocking collectives crash when their communicator is
     * freed under them: a communicator with calls still running stays with
     * MPI until it finalizes */
  } else {
    /* a peer's signature block may still be on its way to nb where an
     * exchange was abandoned or the communicator broke (its peers go on
     * sending): kept, it lands there and is drained, never in a successor */
    if (m->nb != MPI_COMM_NULL && m->p2p && (m->broken || m->sig_left)) retire(m->nb);
    else if (m->nb != MPI_COMM_NULL) MPI_Comm_free(&m->nb);
    MPI_Comm_free(&m->comm); /* local in MPI: pending requests still complete */
  }
  free(m);
}

/* ---- the raw MPI call, for mpu bench ------------------------------------------ */

static MPI_Datatype native_type(mpu_dtype dt) {
  switch (dt) {
  case MPU_FLOAT32: return MPI_FLOAT;
  case MPU_FLOAT64: return MPI_DOUBLE;
  case MPU_INT32: return MPI_INT32_T;
  case MPU_INT64: return MPI_INT64_T;
  case MPU_UINT8: return MPI_UINT8_T;
  case MPU_INT8: return MPI_INT8_T;
  case MPU_UINT32: return MPI_UINT32_T;
  case MPU_UINT64: return MPI_UINT64_T;
  default: return MPI_DATATYPE_NULL; /* MPI cannot reduce 16-bit floats */
  }
}

static MPI_Op native_op(mpu_op op) {
  switch (op) {
  case MPU_PROD: return MPI_PROD;
  case MPU_MIN: return MPI_MIN;
  case MPU_MAX: return MPI_MAX;
  default: return MPI_SUM; /* MPI has no average: the sum is the nearest call */
  }
}

static mpu_result_t mpi_native(mpu_comm *c, const mpu__call *call) {
  static const char fn[] = "raw MPI call";
  MPU__CALL_ARGS(call);
  int kind = call->sig.kind;
  int n = c->size, reducing = mpu__coll_of(kind)->has_op;
  MPI_Datatype t = reducing ? native_type(dt) : bits_of(dt);
  if (t == MPI_DATATYPE_NULL)
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: MPI has no %s reduction", fn, mpu_dtype_name(dt));
  MPU_CHECK(fits(fn, count, n));
  int k = (int)count;
  size_t bytes = count * mpu_dtype_size(dt);
  MPI_Comm w = comm_of(c);
  switch (kind) {
  case MPU_COLL_ALL_REDUCE:
    return check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, k, t, native_op(op), w), fn);
  case MPU_COLL_ALL_GATHER: {
    const void *s = send == (const char *)recv + (size_t)c->rank * bytes ? MPI_IN_PLACE : send;
    return check(MPI_Allgather(s, k, t, recv, k, t, w), fn);
  }
  case MPU_COLL_REDUCE_SCATTER:
    if ((const char *)recv == (const char *)send + (size_t)c->rank * bytes)
      return mpu__error(MPU_ERR_UNSUPPORTED, "%s: MPI's in-place reduce_scatter differs", fn);
    return check(MPI_Reduce_scatter_block(send, recv, k, t, native_op(op), w), fn);
  case MPU_COLL_BROADCAST: return check(MPI_Bcast(recv, k, t, root, w), fn);
  case MPU_COLL_REDUCE: {
    const void *s = c->rank == root && send == recv ? MPI_IN_PLACE : send;
    return check(MPI_Reduce(s, recv, k, t, native_op(op), root, w), fn);
  }
  case MPU_COLL_ALL_TO_ALL: return check(MPI_Alltoall(send, k, t, recv, k, t, w), fn);
  default: return check(MPI_Barrier(w), fn);
  }
}

static void mpi_caps(const mpu_comm *c, mpu_comm_caps *caps) {
  caps->fault_detection = impl_of(c)->timed; /* timeouts need the checked, polled path */
  caps->call_checking = impl_of(c)->checked;
}

static const mpu__comm_ops mpi_ops = {
    .name = "mpi",
    .start = mpi_start,
    .start_nb = mpi_start_nb,
    .test = mpi_test,
    .wait = mpi_wait,
    .release = mpi_release,
    .send = mpi_send,
    .recv = mpi_recv,
    .create_group = mpi_create_group,
    .split = mpi_split,
    .abort = mpi_abort,
    .native = mpi_native,
    .caps = mpi_caps,
    .destroy = mpi_destroy,
    .oob_open = mpu__mpi_oob_open,
    .oob_post = mpu__mpi_oob_post,
    .oob_poll = mpu__mpi_oob_poll,
    .oob_close = mpu__mpi_oob_close,
};

MPI_Comm mpu__mpi_comm_of(const mpu_comm *c) { return impl_of(c)->comm; }

/* ---- entry points --------------------------------------------------------------- */

static mpu_result_t check_options(const char *fn, const mpu_mpi_options *given) {
  if (!given) return MPU_SUCCESS;
  mpu_mpi_options full = MPU_MPI_OPTIONS_INIT, *o = &full;
  MPU_CHECK(mpu__take_options(fn, "options", "MPU_MPI_OPTIONS_INIT",
                              given, sizeof full, MPU_MPI_OPTIONS_MIN_SIZE, &full));
  if (o->check_calls < MPU_CHECKS_OFF || o->check_calls > MPU_CHECKS_ON)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: options.check_calls is %d (want MPU_CHECKS_DEFAULT, _ON or _OFF)", fn,
                      o->check_calls);
  return MPU_SUCCESS;
}

/* MPI has no timeouts of its own, so the backend has one only where the
 * caller asked (options.timeout_s > 0 and finite, or MPU_TIMEOUT): without
 * one, checked calls are blocking MPI calls (INFINITY). */
static double mpi_timeout(double given) {
  if (given > 0) return given;
  return mpu__env_timeout_given() ? mpu__env_timeout(0) : INFINITY;
}

mpu_result_t mpu_comm_from_mpi_ex(MPI_Comm comm, const mpu_mpi_options *options, mpu_comm **out) {
  static const char fn[] = "mpu_comm_from_mpi";
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: MPI is not initialised", fn);
  if (!out || comm == MPI_COMM_NULL)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output or MPI_COMM_NULL", fn);
  MPU_CHECK(check_options(fn, options));
  MPI_Comm dup;
  MPU_CHECK(check(MPI_Comm_dup(comm, &dup), fn));
  return wrap(dup, mpu__env_check_calls(options ? options->check_calls : MPU_CHECKS_DEFAULT),
              mpi_timeout(options ? options->timeout_s : 0), out);
}

mpu_result_t mpu_comm_from_mpi(MPI_Comm comm, mpu_comm **out) {
  return mpu_comm_from_mpi_ex(comm, NULL, out);
}

static mpu_result_t mpi_world(int *argc, char ***argv, const mpu_mpi_options *options,
                                   mpu_comm **out) {
  static const char fn[] = "mpu_comm_mpi_world";
  int initialised = 0, provided = 0;
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(check_options(fn, options));
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPU_CHECK(check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), fn));
    we_initialised = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_FUNNELED)
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: MPI gives thread level %d, mpu needs FUNNELED", fn,
                      provided);
  return mpu_comm_from_mpi_ex(MPI_COMM_WORLD, options, out);
}


static mpu_result_t mpi_finalize(void) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (pair_ready && !finalized) { /* the two-rank reduce's types and operators */
    for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++) MPI_Type_free(&pair_types[dt]);
    for (int op = 0; op < MPU_OP_COUNT; op++) MPI_Op_free(&pair_ops[op]);
    pair_ready = 0;
  }
  if (!finalized) retired_free(); /* the notes' duplicates (MPI may be the caller's) */
  if (we_initialised && !finalized) MPU_CHECK(check(MPI_Finalize(), "mpu_mpi_finalize"));
  we_initialised = 0;
  MPI_Finalized(&finalized);
  if (finalized) orphans_progress(1); /* MPI holds nothing any more */
  return MPU_SUCCESS;
}

/* libmpu reaches the backend through this, registered when the library loads */
static const mpu__module mpi_module = {
    .name = "mpi",
    .version = MPU_VERSION_STRING,
    .mpi_world = mpi_world,
    .mpi_finalize = mpi_finalize,
};

__attribute__((constructor)) static void mpi_module_load(void) { mpu__module_register(&mpi_module); }
