/*
 * share.c - splitShare in the test double (double.h): what a communicator
 * shares with the relatives it was split from or into with splitShare = 1.
 *
 * NCCL 2.28 (init.cc, ncclCommInitChildComm; commAlloc with a parent that
 * shares) gives such a child the parent's abortFlag (one ncclCommAbort stops
 * the kernels of every relative) and the parent's sharedRes, whose
 * deviceStream every relative's launch joins: on one rank their kernels run
 * one after another in the order they were issued, whatever user streams
 * they were enqueued on. A family here is that: one abort flag, one device
 * stream (a stream of the double, made on first use) per rank. Switch
 * "share": nothing is shared.
 */
#include "nccl_double/double.h"

typedef struct double_family {
  atomic_int aborted;  /* NCCL's abortFlag */
  atomic_int refs;
  int shared;          /* a relative joined: collectives go through the device stream */
  pthread_mutex_t lock;
  cudaStream_t device; /* sharedRes->deviceStream, made on first use */
} double_family;

int double_family_join(ncclComm_t c, ncclComm_t share_with) {
  if (share_with && share_with->family) {
    double_family *f = share_with->family;
    atomic_fetch_add(&f->refs, 1);
    pthread_mutex_lock(&f->lock);
    f->shared = 1;
    pthread_mutex_unlock(&f->lock);
    c->family = f;
    return 0;
  }
  double_family *f = calloc(1, sizeof *f);
  if (!f) return -1;
  atomic_store(&f->refs, 1);
  pthread_mutex_init(&f->lock, NULL);
  c->family = f;
  return 0;
}

void double_family_leave(ncclComm_t c) {
  double_family *f = c->family;
  c->family = NULL;
  if (!f || atomic_fetch_sub(&f->refs, 1) != 1) return;
  if (f->device) cudaStreamDestroy(f->device); /* runs what is queued, then ends */
  pthread_mutex_destroy(&f->lock);
  free(f);
}

void double_family_abort(ncclComm_t c) {
  if (c->family) atomic_store(&c->family->aborted, 1);
}

int double_family_aborted(ncclComm_t c) { return c->family && atomic_load(&c->family->aborted); }

/* The device stream's task and the user stream's: the kernel runs on the
 * device stream once the user stream reached the launch (gate), and the
 * user stream goes on once the kernel ran (done). */
typedef struct relay {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int gate, done, refs;
} relay;

typedef struct relay_task {
  task t;
  relay *r;
  coll_task *k; /* the device stream's: the call */
} relay_task;

static void relay_unref(relay *r) { /* under r->lock; unlocks */
  int last = --r->refs == 0;
  pthread_mutex_unlock(&r->lock);
  if (!last) return;
  pthread_mutex_destroy(&r->lock);
  pthread_cond_destroy(&r->cond);
  free(r);
}

static void user_side(task *t) {
  relay *r = ((relay_task *)t)->r;
  pthread_mutex_lock(&r->lock);
  r->gate = 1;
  pthread_cond_broadcast(&r->cond);
  while (!r->done) pthread_cond_wait(&r->cond, &r->lock);
  relay_unref(r);
}

static void device_side(task *t) {
  relay_task *d = (relay_task *)t;
  relay *r = d->r;
  pthread_mutex_lock(&r->lock);
  while (!r->gate) pthread_cond_wait(&r->cond, &r->lock);
  pthread_mutex_unlock(&r->lock);
  double_coll_run(&d->k->t);
  free(d->k);
  pthread_mutex_lock(&r->lock);
  r->done = 1;
  pthread_cond_broadcast(&r->cond);
  relay_unref(r);
}

int double_family_submit(coll_task *k, cudaStream_t stream) {
  double_family *f = k->t.comm->family;
  if (!f) return 0;
  pthread_mutex_lock(&f->lock);
  int shared = f->shared;
  if (shared && !f->device && cudaStreamCreateWithFlags(&f->device, cudaStreamNonBlocking))
    f->device = NULL;
  cudaStream_t device = f->device;
  pthread_mutex_unlock(&f->lock);
  if (!shared || !device) return 0;
  relay *r = calloc(1, sizeof *r);
  relay_task *u = calloc(1, sizeof *u), *d = calloc(1, sizeof *d);
  if (!r || !u || !d) {
    free(r), free(u), free(d);
    return 0; /* out of memory: the user stream runs it */
  }
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  r->refs = 2;
  u->t.run = user_side, u->r = r;
  d->t.run = device_side, d->r = r, d->k = k;
  /* the device stream in issue order: the host's, as NCCL's launches join it */
  double_push(device, &d->t);
  double_push(stream, &u->t);
  return 1;
}
