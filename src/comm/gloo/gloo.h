/*
 * gloo.h - the gloo backend's state, shared by its files:
 *   create.c  the module, mpu_comm_gloo_from_env, groups, abort, destroy
 *   calls.c   the collectives and send/recv over gloo's unbound buffers
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
} gloo_impl;

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

/* calls.c: the table's entries */
mpu_result_t mpu__gloo_start(mpu_comm *c, const mpu__call *call, void **handle);
mpu_result_t mpu__gloo_send(mpu_comm *c, const void *buf, size_t count, mpu_dtype dt, int peer);
mpu_result_t mpu__gloo_recv(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int peer);
/* free the eager sends that completed; with wait_s > 0, wait that long for
 * the others first (destroy); with wait_s < 0, free them all (destroy of a
 * broken communicator, whose connections it closed first) */
void mpu__gloo_reap(mpu_comm *c, double wait_s);

#endif
