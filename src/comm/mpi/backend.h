/*
 * backend.h - what the MPI backend's files share: the communicator's state
 * and each file's entry points. MPI moves the bytes, comm/base reduces them.
 *
 * The backend by job, one file each:
 *   comm.c     making and ending communicators, the entry points, the ops table
 *   calls.c    the blocking collectives: which MPI calls move a call's bytes
 *   check.c    call checking: the signature exchange every collective starts with
 *   pending.c  the process-wide list of pending non-blocking calls, re-entered
 *              (mpu__mpi_drive) from every wait, test, recv and signature exchange
 *   timeout.c  polled waits under the timeout, and the notes that name the
 *              ranks a timeout missed
 *   retire.c   what MPI may still touch after mpu stopped waiting: orphaned
 *              buffers, retired duplicates of destroyed communicators
 *   p2p.c      send and recv
 *   native.c   the raw MPI call mpu bench times beside mpu's
 *   abort.c    the out-of-band abort channel a device communicator tells
 *              its peers through
 *
 * Results must be the bits every backend gives, so reductions never use
 * MPI's own operators (whose tree order, NaN and overflow rules are MPI's):
 * calls.c says how each collective gets mpu's bits. Bytes move as unsigned
 * integers of the element's width, so a NaN's payload or a float16 travels
 * untouched.
 *
 * The backend is FUNNELED: one thread calls MPI, so the process-wide state
 * (the pending list, the orphans, the retired duplicates) needs no lock.
 */
#ifndef MPU_COMM_MPI_BACKEND_H
#define MPU_COMM_MPI_BACKEND_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm_internal.h"
#include "core/error.h"

/* The largest message, in 64-bit words, sent on a duplicate the backend
 * keeps after its communicator ends: what a late one is drained into. */
#define MPU__MPI_LATE_WORDS 32

/* a timeout's phase after the signatures matched */
#define DATA_PHASE "in the data phase (a peer left the call)"

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

static inline mpi_impl *impl_of(const mpu_comm *c) { return c->impl; }
static inline MPI_Comm comm_of(const mpu_comm *c) { return impl_of(c)->comm; }

/* The type that moves elements of dt as bits. */
static inline MPI_Datatype bits_of(mpu_dtype dt) {
  switch (mpu_dtype_size(dt)) {
  case 1: return MPI_UINT8_T;
  case 2: return MPI_UINT16_T;
  case 4: return MPI_UINT32_T;
  default: return MPI_UINT64_T;
  }
}

/* ---- comm.c ---- */

/* MPU_SUCCESS, or MPU_ERR_BACKEND with MPI's text for err. */
mpu_result_t mpu__mpi_check(int err, const char *what);
/* MPI counts and displacements are int: count x blocks elements must fit. */
mpu_result_t mpu__mpi_fits(const char *fn, size_t count, int blocks);
/* The failure that broke m, for a call fn. */
mpu_result_t mpu__mpi_broken(const mpi_impl *m, const char *fn);
/* int counts and displacements for MPI's v-calls, from a list of c->size. */
mpu_result_t mpu__mpi_ints(mpu_comm *c, const char *fn, const size_t *a, int *out);
/* the MPI communicator of c (abort.c) */
MPI_Comm mpu__mpi_comm_of(const mpu_comm *c);

/* ---- calls.c ---- */

/* The backend's start: every blocking call runs to its end here. */
mpu_result_t mpu__mpi_start(mpu_comm *c, const mpu__call *k, void **handle);
/* Two ranks' reduce: MPI's own, with mpu's kernel as a non-commutative
 * operator (its types and operators made once, freed at finalize). */
mpu_result_t mpu__mpi_pair_setup(const char *fn);
MPI_Datatype mpu__mpi_pair_type(mpu_dtype dt);
MPI_Op mpu__mpi_pair_op(mpu_op op);
void mpu__mpi_pair_free(void);

/* ---- check.c ---- */

/* The bytes of this rank's input a call carries in its signature block, or
 * SIZE_MAX where the call is too large (or uneven) to ride along. */
size_t mpu__mpi_carried_bytes(const mpu_comm *c, const mpu__call *k);
/* This rank's block for call k: its signature, and its input where the
 * call's input rides along (a timed communicator's never does). Returns the
 * bytes carried, or SIZE_MAX where the call's data moves after. */
size_t mpu__mpi_sig_fill(const mpu_comm *c, const mpu__call *k, carrier *mine);
/* Start the exchange of blk[0] into blk[1 + p] of every member p. */
mpu_result_t mpu__mpi_sig_start(mpu_comm *c, carrier *blk, MPI_Request *reqs, int *nreqs,
                                const char *fn);
/* A failed exchange: the communicator is broken, what was posted stays with MPI. */
mpu_result_t mpu__mpi_sig_abandon(mpu_comm *c, MPI_Request *reqs, int nreqs, carrier *blk,
                                  mpu_result_t r);
/* Start of every blocking collective (*done: the inputs came with the signatures). */
mpu_result_t mpu__mpi_enter(mpu_comm *c, const mpu__call *k, const char *fn, int *done);
/* Complete a call whose inputs all arrived in the signature blocks. */
mpu_result_t mpu__mpi_finish_carried(mpu_comm *c, const mpu__call *k, const carrier *blk);

/* ---- pending.c: the process-wide list of non-blocking calls ---- */

/* One pass over every pending call of the process: starts the data phases
 * that may start, completes those MPI finished. Called from every wait of
 * the backend (timeout.c, p2p.c, pending.c) and every signature exchange:
 * only mpu code can start a data phase a peer may be waiting for. */
void mpu__mpi_drive(void);
mpu_result_t mpu__mpi_start_nb(mpu_comm *c, const mpu__call *call, void **handle);
mpu_result_t mpu__mpi_test(mpu_comm *c, void *handle, int *done);
mpu_result_t mpu__mpi_wait(mpu_comm *c, void *handle, double timeout_s);
void mpu__mpi_release(mpu_comm *c, void *handle);

/* ---- timeout.c ---- */

struct roll;
/* The notes over a duplicate comm (taken), NULL where a part cannot be made. */
struct roll *mpu__mpi_roll_make(MPI_Comm comm, int size, int me, double timeout_s);
/* A checked call begins. */
void mpu__mpi_roll_enter(struct roll *r);
/* Never blocks; NULL is accepted. */
void mpu__mpi_roll_free(struct roll *r);
/* Wait for reqs, polling (and driving the pending calls), no longer than the
 * timeout; on timeout the communicator breaks, naming the missing ranks. */
mpu_result_t mpu__mpi_wait_all(mpu_comm *c, MPI_Request *reqs, int nreqs, const char *fn,
                               const char *phase);
mpu_result_t mpu__mpi_wait_for(mpu_comm *c, MPI_Request *req, const char *fn, const char *phase);
/* A blocking call begins after c's earlier non-blocking calls completed. */
mpu_result_t mpu__mpi_settle(mpu_comm *c, const char *fn);

/* ---- retire.c ---- */

/* Keep a..d until every one of reqs[n] completes (or MPI is finalised). */
void mpu__mpi_orphan_add_all(const MPI_Request *reqs, int n, void *a, void *b, void *c, void *d);
void mpu__mpi_orphan_add(MPI_Request req, void *a, void *b, void *c, void *d);
/* Free the orphans whose requests completed (all of them with `all`). */
void mpu__mpi_orphans_progress(int all);
/* Keep a duplicate until mpu_mpi_finalize, drain late messages then (Open
 * MPI gives a freed id to the next communicator made). */
void mpu__mpi_retire(MPI_Comm comm);
void mpu__mpi_retired_free(void);
/* End a send that may never be received without blocking (cancel it, or
 * keep buf until it completes or MPI is finalised). */
void mpu__mpi_end_send(MPI_Request *req, void *buf);

/* ---- p2p.c ---- */

mpu_result_t mpu__mpi_send(mpu_comm *c, const mpu__call *k);
mpu_result_t mpu__mpi_recv(mpu_comm *c, const mpu__call *k);
/* At destroy, never blocking: sends nobody received cancelled or orphaned. */
void mpu__mpi_sends_end(mpi_impl *m);

/* ---- native.c ---- */

mpu_result_t mpu__mpi_native(mpu_comm *c, const mpu__call *call);

/* ---- abort.c: the out-of-band abort channel (mpu__comm_ops.oob_*) ---- */

mpu_result_t mpu__mpi_abort(mpu_comm *c);
mpu_result_t mpu__mpi_oob_open(mpu_comm *c, void **ctx);
void mpu__mpi_oob_post(void *ctx, int rank, const char *why);
int mpu__mpi_oob_poll(void *ctx, int *who, char *why, size_t len);
void mpu__mpi_oob_close(void *ctx);

#endif
