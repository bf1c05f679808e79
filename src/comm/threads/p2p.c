/*
 * p2p.c - send and recv between threads ranks.
 *
 * Each world rank has a mailbox: a queue of messages under a mutex. send
 * copies the data into a new message and queues it at the peer (eager, like
 * MPI's buffered sends: it never waits for the receiver, so two stages may
 * both send before they receive); recv takes the oldest message from that
 * peer on that communicator, waiting for it if need be.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/threads/threads.h"
#include "core/error.h"

#define SLICE_S 0.01

mpu_result_t mpu__tsend(mpu_comm *c, const mpu__call *k) {
  const void *buf = k->send;
  size_t count = (size_t)k->sig.count;
  mpu_dtype dt = (mpu_dtype)k->sig.dtype;
  int peer = k->peer;
  tcomm *tc = c->impl;
  tgroup *g = tc->g;
  tworld *w = g->world;
  int dst = g->members[peer];
  size_t bytes = count * mpu_dtype_size(dt);
  char reason[200];
  uint64_t poison = atomic_load(&w->poison);
  if (poison) {
    mpu__treason_text(poison, reason, sizeof reason);
    return mpu__error(MPU_ERR_ABORTED, "mpu_comm_send: %s", reason);
  }
  if (atomic_load(&w->gone[dst]) || atomic_load(&g->mem[peer].departed))
    return mpu__error(MPU_ERR_ABORTED,
                      "mpu_comm_send: peer rank %d (world %d) has already left this communicator",
                      peer, dst);
  tmsg *m = malloc(sizeof *m + bytes);
  if (!m) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_send: %zu bytes", bytes);
  *m = (tmsg){NULL, g->id, g->members[tc->me], count, dt};
  if (bytes) memcpy(m->data, buf, bytes);
  tmailbox *box = &w->boxes[dst];
  pthread_mutex_lock(&box->lock);
  if (box->tail) box->tail->next = m;
  else box->head = m;
  box->tail = m;
  pthread_cond_broadcast(&box->cond);
  pthread_mutex_unlock(&box->lock);
  return MPU_SUCCESS;
}

/* Unlink and return the oldest message from src on group id (NULL if none). */
static tmsg *take(tmailbox *box, uint64_t group, int src) {
  tmsg *prev = NULL;
  for (tmsg *m = box->head; m; prev = m, m = m->next) {
    if (m->group != group || m->src != src) continue;
    if (prev) prev->next = m->next;
    else box->head = m->next;
    if (box->tail == m) box->tail = prev;
    return m;
  }
  return NULL;
}

struct timespec mpu__tabs_after(double seconds) {
  double t = mpu__now() + seconds;
  struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
  return ts;
}

mpu_result_t mpu__trecv(mpu_comm *c, const mpu__call *k) {
  void *buf = k->recv;
  size_t count = (size_t)k->sig.count;
  mpu_dtype dt = (mpu_dtype)k->sig.dtype;
  int peer = k->peer;
  tcomm *tc = c->impl;
  tgroup *g = tc->g;
  tworld *w = g->world;
  int src = g->members[peer];
  tmailbox *box = &w->boxes[g->members[tc->me]];
  double deadline = mpu__now() + w->timeout_s;
  mpu_result_t r = MPU_SUCCESS;
  char reason[200];
  tmsg *m;

  pthread_mutex_lock(&box->lock);
  while (!(m = take(box, g->id, src))) {
    uint64_t poison = atomic_load(&w->poison);
    if (poison) {
      mpu__treason_text(poison, reason, sizeof reason);
      r = mpu__error(MPU_ERR_ABORTED, "mpu_comm_recv from rank %d: %s", peer, reason);
      break;
    }
    /* a peer that has left can send nothing more; look once more first, as
     * its last message may have arrived just before it left */
    if (atomic_load(&w->gone[src]) || atomic_load(&g->mem[peer].departed)) {
      if ((m = take(box, g->id, src))) break;
      r = mpu__error(MPU_ERR_ABORTED,
                     "mpu_comm_recv: peer rank %d (world %d) left without sending the message",
                     peer, src);
      break;
    }
    if (mpu__now() >= deadline) {
      r = mpu__error(MPU_ERR_TIMEOUT,
                     "mpu_comm_recv: no message from rank %d (world %d) within %.3g s", peer,
                     src, w->timeout_s);
      break;
    }
    struct timespec until = mpu__tabs_after(SLICE_S);
    pthread_cond_timedwait(&box->cond, &box->lock, &until);
  }
  pthread_mutex_unlock(&box->lock);
  if (!m) return r;

  r = mpu__deliver(buf, count, dt, m->data, m->count, m->dtype, peer);
  free(m);
  return r;
}

void mpu__tmailbox_drain(tmailbox *box) {
  while (box->head) {
    tmsg *m = box->head;
    box->head = m->next;
    free(m);
  }
  box->tail = NULL;
}
