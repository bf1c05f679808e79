/*
 * gloo.h - the gloo backend's state, shared by its files:
 *   create.c  the module, mpu_comm_gloo_from_env, groups, abort, destroy
 *   calls.c   the collectives and send/recv over gloo's unbound buffers
 *   round.c   one round of a collective: every peer's message at once, the
 *             small ones eagerly into buffers each pair keeps posted
 *   shim.cc   the C++ calls of gloo (shim.h)
 */
#ifndef MPU_COMM_GLOO_H
#define MPU_COMM_GLOO_H

#include <pthread.h>
#include <stdint.h>

#include "comm/comm_internal.h"
#include "comm/gloo/shim.h"
#include "comm/rendezvous.h"

/* a send that returned before its peer received it (send is eager) */
typedef struct gloo_pending {
  struct gloo_pending *next;
  mpu__gl_buf *buf;
  void *bytes; /* header + payload, ours until both sends completed */
  int sends;   /* how many sends buf carries */
} gloo_pending;

/* how many groups this rank made with one member list (their store names) */
typedef struct gloo_made {
  struct gloo_made *next;
  uint64_t digest;
  int times;
} gloo_made;

typedef struct gloo_impl {
  mpu__gl *g;          /* NULL for a group of one (base answers every call) */
  mpu__rendezvous *rv; /* the store: this communicator's key folder and abort key */
  char master[256];     /* MASTER_ADDR: where its groups listen follows from it */
  double timeout_s;
  int check_calls;
  pthread_mutex_t lock; /* broken and why: mpu_comm_abort may come from any thread */
  mpu_result_t broken;  /* MPU_SUCCESS while usable */
  char why[640];
  mpu__gl_buf **waiting; /* the buffers the owner waits on now (NULL: none); an abort */
  int nwaiting;          /* from another thread interrupts their waits */
  gloo_pending *sends, **sends_tail;
  gloo_pending *to_self, **to_self_tail; /* sends to this rank itself (bytes only, no buf) */
  gloo_made *made;
  void *staging; /* the reductions' pieces from the peers (calls.c), kept between calls */
  size_t staging_bytes;
  /* round.c's eager messages: per peer, receives always posted (rb, into
   * rx) and a slot to send from (sb, over tx); NULL for a group of one */
  size_t eager_cap; /* payload bytes a message may carry eagerly */
  char *eager_rx, *eager_tx;
  mpu__gl_buf **eager_rb, **eager_sb;
  int *eager_next; /* per peer, which of its posted buffers its next message fills */
  unsigned char *eager_lost; /* per posted buffer: posting it again failed (the peer left) */
  uint32_t calls;            /* collective calls started (their eager messages carry it) */
} gloo_impl;

/* Gloo matches messages per connection and slot in order, so each kind of
 * round has its own slot; the eager messages share one. */
enum {
  MPU__GLOO_SLOT_SIG = 1,
  MPU__GLOO_SLOT_ROWS,
  MPU__GLOO_SLOT_SPREAD,
  MPU__GLOO_SLOT_GATHER,
  MPU__GLOO_SLOT_TOKEN,
  MPU__GLOO_SLOT_HEAD,
  MPU__GLOO_SLOT_BODY,
  MPU__GLOO_SLOT_EAGER
};
#define MPU__GLOO_SLOT(k) ((UINT64_C(0x6d7075) << 40) | (uint64_t)(k))

/* One round: sn[j] bytes at sp[j] go to peer j, rn[j] bytes from peer j
 * land at rp[j] (the rank's own entries and empty ones move nothing). */
typedef struct mpu__round {
  const void **sp;
  size_t *sn;
  void **rp;
  size_t *rn;
} mpu__round;

static inline gloo_impl *gloo_of(const mpu_comm *c) { return (gloo_impl *)c->impl; }

/* create.c: the error that ends c (MPU_ERR_TIMEOUT or MPU_ERR_ABORTED), left
 * in mpu_last_error() and kept for its later calls. rc is shim.h's wait
 * result (1: timed out), pending lists the ranks not heard from (n flags,
 * or NULL), what says what was awaited, gloo is gloo's message. A peer's
 * abort posted in the store is named as such. */
mpu_result_t mpu__gloo_fail(mpu_comm *c, const char *fn, int rc, const char *what,
                            const unsigned char *pending, const char *gloo);
/* The owner's thread waits on bufs[0..n) from now until unwatch (an abort
 * interrupts them); MPU_SUCCESS, or the error that broke c meanwhile. */
mpu_result_t mpu__gloo_watch(mpu_comm *c, const char *fn, mpu__gl_buf **bufs, int n);
void mpu__gloo_unwatch(mpu_comm *c);
/* After a round whose waits all completed in waited_s: MPU_SUCCESS, or,
 * when that was long enough for a peer to have aborted meanwhile and one
 * did (its post in the store), MPU_ERR_ABORTED naming it. A rank whose
 * messages all came before a peer aborted would otherwise go on, and learn
 * of it only at its next call. */
mpu_result_t mpu__gloo_after_wait(mpu_comm *c, const char *fn, const char *what, double waited_s);
/* MPU_SUCCESS, or the error that broke c (said again for fn). */
mpu_result_t mpu__gloo_usable(mpu_comm *c, const char *fn);
/* c is broken from now on, with code and why (unless it already was): the error */
mpu_result_t mpu__gloo_break(mpu_comm *c, mpu_result_t code, const char *why);

/* round.c */
mpu_result_t mpu__round_new(int n, mpu__round *rd);
void mpu__round_free(mpu__round *rd);
/* every peer gets the same bytes, and each one's land at its place */
void mpu__round_all(mpu__round *rd, int n, const void *sp, size_t sn, char *rbase, size_t stride,
                    size_t rn);
/* Move rd's messages (slot_kind: which kind of round; what: what is awaited,
 * for the messages) and wait for all of them, within the timeout. */
mpu_result_t mpu__gloo_round(mpu_comm *c, const char *fn, const char *what, int slot_kind,
                             const mpu__round *rd);
/* The same in two steps, so a round's receives can be posted before an
 * earlier round runs (its senders then find them there and write at once):
 * post_recvs, then run_posted with the same rd (its sends, the waits), or
 * posted_drop for a round that will not run (after a failure: a buffer
 * freed takes nothing more). */
typedef struct mpu__gloo_posted {
  mpu__gl_buf **rb, **sb;
  unsigned char *eg;      /* per peer: 1 its receive (2 its send) is eager */
  unsigned char *pending; /* per peer: not heard from (the waits) */
  mpu__gl_buf **all;      /* rb and sb, for an abort to interrupt */
  int posted_bad, failed_at, oom;
  char err[512];
} mpu__gloo_posted;
mpu_result_t mpu__gloo_post_recvs(mpu_comm *c, const char *fn, int slot_kind, const mpu__round *rd,
                                  mpu__gloo_posted *p);
mpu_result_t mpu__gloo_run_posted(mpu_comm *c, const char *fn, const char *what, int slot_kind,
                                  const mpu__round *rd, mpu__gloo_posted *p);
void mpu__gloo_posted_drop(mpu_comm *c, mpu__gloo_posted *p);
/* A posted round that will not run because the call failed with why:
 * c broken for it (unless it already was), its connections closed (a peer's
 * message for a freed buffer would otherwise wedge gloo's connection), p
 * dropped. */
void mpu__gloo_posted_abandon(mpu_comm *c, mpu__gloo_posted *p, mpu_result_t why);
/* the payload a message to a peer of a communicator of n may carry eagerly */
size_t mpu__gloo_eager_cap(int n);
/* c's eager buffers made and their receives posted (c->size >= 2); freed */
mpu_result_t mpu__gloo_eager_init(mpu_comm *c);
void mpu__gloo_eager_free(mpu_comm *c);

/* calls.c: the table's entries */
mpu_result_t mpu__gloo_start(mpu_comm *c, const mpu__call *call, void **handle);
mpu_result_t mpu__gloo_send(mpu_comm *c, const void *buf, size_t count, mpu_dtype dt, int peer);
mpu_result_t mpu__gloo_recv(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int peer);
/* free the eager sends that completed; with wait_s > 0, wait that long for
 * the others first (destroy); with wait_s < 0, free them all (destroy of a
 * broken communicator, whose connections it closed first) */
void mpu__gloo_reap(mpu_comm *c, double wait_s);

#endif
