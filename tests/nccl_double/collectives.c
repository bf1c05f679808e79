/*
 * collectives.c - NCCL's calls in the test double (double.h): reductions,
 * collectives that meet every rank's stream, point to point as a rendezvous.
 */
#include "nccl_double/double.h"

static size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  default: return 8;
  }
}

static float half_in(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(1024 + m), e - 25);
  return h & 0x8000 ? -v : v;
}

/* float -> binary16 or bfloat16, nearest even (the double's own rounding) */
static uint16_t narrow(float f, int bf) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if (bf) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
  }
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  if (isnan(f)) return sign | 0x7e00;
  float a = fabsf(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < ldexpf(1, -14)) { /* subnormal: units of 2^-24, nearest even */
    float u = a * 16777216.0f, r = nearbyintf(u);
    return sign | (uint16_t)r;
  }
  int e;
  float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  float scaled = nearbyintf(ldexpf(m, 11)); /* 11 bits of mantissa, nearest even */
  if (scaled >= 2048.0f) scaled /= 2, e++;
  return sign | (uint16_t)(((e + 14) << 10) | ((int)scaled - 1024));
}

static double load(ncclDataType_t t, const void *p, size_t i) {
  switch (t) {
  case ncclFloat32: return ((const float *)p)[i];
  case ncclFloat64: return ((const double *)p)[i];
  case ncclFloat16: return half_in(((const uint16_t *)p)[i]);
  case ncclBfloat16: {
    uint32_t x = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
  }
  default: return 0;
  }
}

/* out[i] = fold over ranks of src(k)[i] */
static void fold(ncclDataType_t t, ncclRedOp_t op, int n, const void *const *src, void *out,
                 size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (t == ncclUint64) { /* unsigned: compared and divided as such */
      uint64_t acc = 0, x;
      for (int k = 0; k < n; k++) {
        x = ((const uint64_t *)src[k])[i];
        if (!k) acc = x;
        else if (op == ncclSum || op == ncclAvg) acc += x;
        else if (op == ncclProd) acc *= x;
        else if (op == ncclMin) acc = x < acc ? x : acc;
        else acc = x > acc ? x : acc;
      }
      if (op == ncclAvg) acc /= (uint64_t)n;
      ((uint64_t *)out)[i] = acc;
      continue;
    }
    if (t == ncclInt8 || t == ncclUint8 || t == ncclInt32 || t == ncclUint32 || t == ncclInt64) {
      int64_t acc = 0, x;
      for (int k = 0; k < n; k++) {
        x = t == ncclInt8     ? ((const int8_t *)src[k])[i]
            : t == ncclUint8  ? ((const uint8_t *)src[k])[i]
            : t == ncclInt32  ? ((const int32_t *)src[k])[i]
            : t == ncclUint32 ? ((const uint32_t *)src[k])[i]
                              : ((const int64_t *)src[k])[i];
        if (!k) acc = x;
        else if (op == ncclSum || op == ncclAvg) acc = (int64_t)((uint64_t)acc + (uint64_t)x);
        else if (op == ncclProd) acc = (int64_t)((uint64_t)acc * (uint64_t)x);
        else if (op == ncclMin) acc = x < acc ? x : acc;
        else acc = x > acc ? x : acc;
      }
      if (op == ncclAvg) acc /= n;
      if (t == ncclInt32 || t == ncclUint32) ((uint32_t *)out)[i] = (uint32_t)(uint64_t)acc;
      else if (t == ncclInt64) ((int64_t *)out)[i] = acc;
      else ((uint8_t *)out)[i] = (uint8_t)(uint64_t)acc;
      continue;
    }
    double acc = 0;
    for (int k = 0; k < n; k++) {
      double x = load(t, src[k], i);
      if (!k) acc = x;
      else if (op == ncclSum || op == ncclAvg) acc = t == ncclFloat64 ? acc + x : (double)((float)acc + (float)x);
      else if (op == ncclProd) acc = t == ncclFloat64 ? acc * x : (double)((float)acc * (float)x);
      else if (op == ncclMin) acc = x < acc ? x : acc;
      else acc = x > acc ? x : acc;
    }
    if (op == ncclAvg) acc = t == ncclFloat64 ? acc / n : (double)((float)acc / (float)n);
    if (t == ncclFloat32) ((float *)out)[i] = (float)acc;
    else if (t == ncclFloat64) ((double *)out)[i] = acc;
    else ((uint16_t *)out)[i] = narrow((float)acc, t == ncclBfloat16);
  }
}


static void fail(ncclComm_t c, ncclResult_t r) {
  pthread_mutex_lock(&c->q->lock);
  if (c->async == ncclSuccess) c->async = r;
  pthread_mutex_unlock(&c->q->lock);
}

static void done(ncclComm_t c) {
  pthread_mutex_lock(&c->q->lock);
  c->inflight--;
  pthread_cond_broadcast(&c->q->cond);
  pthread_mutex_unlock(&c->q->lock);
}

/* Post a send for the peer to take. */
static void post(ncclComm_t c, offer *o, int peer) {
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  offer **p = &q->boxes[peer];
  while (*p) p = &(*p)->next;
  *p = o;
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->lock);
}

/* Wait until the peer took the send (or the clique was aborted). */
static void await_taken(ncclComm_t c, offer *o, int peer) {
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  while (!o->taken && !q->aborted) pthread_cond_wait(&q->cond, &q->lock);
  if (!o->taken) { /* aborted: withdraw it */
    for (offer **p = &q->boxes[peer]; *p; p = &(*p)->next)
      if (*p == o) {
        *p = o->next;
        break;
      }
  }
  int taken = o->taken;
  pthread_mutex_unlock(&q->lock);
  if (taken <= 0) fail(c, taken < 0 ? ncclInvalidUsage : ncclRemoteError);
}

/* Take the oldest send from src into buf. */
static void take(ncclComm_t c, int src, void *buf, size_t bytes) {
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  for (;;) {
    offer **p = &q->boxes[c->rank];
    while (*p && (*p)->src != src) p = &(*p)->next;
    if (*p) {
      offer *o = *p;
      *p = o->next;
      int ok = o->bytes == bytes; /* NCCL's behaviour is undefined; the double reports it */
      if (ok) memcpy(buf, o->data, bytes);
      o->taken = ok ? 1 : -1; /* the sender may free o as soon as the lock is dropped */
      pthread_cond_broadcast(&q->cond);
      pthread_mutex_unlock(&q->lock);
      if (!ok) fail(c, ncclInvalidUsage);
      return;
    }
    if (q->aborted) break;
    pthread_cond_wait(&q->cond, &q->lock);
  }
  pthread_mutex_unlock(&q->lock);
  fail(c, ncclRemoteError);
}

static void coll_run(task *t) {
  coll_task *k = (coll_task *)t;
  ncclComm_t c = t->comm;
  clique *q = c->q;
  int n = q->n, me = c->rank;
  if (c->aborted || c->async) { /* work after a failure is dropped, as NCCL's */
    done(c);
    return;
  }
  if (k->s.kind == K_SEND || k->s.kind == K_RECV || k->more) {
    /* point to point, alone or as a group: every send is offered first, then
     * every recv taken, then the sends wait to be taken, so the calls of a
     * group progress together as NCCL's do */
    int m = 0;
    for (coll_task *g = k; g; g = g->more) m++;
    offer *offers = calloc((size_t)m, sizeof *offers);
    if (!offers) {
      fail(c, ncclSystemError);
    } else {
      int i = 0;
      for (coll_task *g = k; g; g = g->more, i++)
        if (g->s.kind == K_SEND) {
          offers[i] = (offer){NULL, c->rank, g->s.count * type_size(g->s.type), g->s.send, 0};
          post(c, &offers[i], g->peer);
        }
      for (coll_task *g = k; g; g = g->more)
        if (g->s.kind == K_RECV) take(c, g->peer, g->s.recv, g->s.count * type_size(g->s.type));
      i = 0;
      for (coll_task *g = k; g; g = g->more, i++)
        if (g->s.kind == K_SEND) await_taken(c, &offers[i], g->peer);
      free(offers);
    }
    for (coll_task *g = k->more, *next; g; g = next) next = g->more, free(g);
    done(c);
    return;
  }
  q->slots[me] = k->s;
  if (double_meet(q)) {
    fail(c, ncclRemoteError);
    done(c);
    return;
  }
  const slot *s = &k->s;
  size_t es = type_size(s->type), bytes = s->count * es;
  size_t out_bytes = s->kind == K_ALL_GATHER || s->kind == K_ALL_TO_ALL ? bytes * (size_t)n : bytes;
  char *tmp = malloc(out_bytes ? out_bytes : 1);
  const void **src = malloc((size_t)n * sizeof *src);
  int write = tmp && src;
  if (write) {
    switch (s->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE:
      for (int r = 0; r < n; r++) src[r] = q->slots[r].send;
      write = s->kind == K_ALL_REDUCE || me == s->root;
      if (write) fold(s->type, s->op, n, src, tmp, s->count);
      break;
    case K_REDUCE_SCATTER:
      for (int r = 0; r < n; r++) src[r] = (const char *)q->slots[r].send + (size_t)me * bytes;
      fold(s->type, s->op, n, src, tmp, s->count);
      break;
    case K_ALL_GATHER:
      for (int r = 0; r < n; r++) memcpy(tmp + (size_t)r * bytes, q->slots[r].send, bytes);
      break;
    case K_BROADCAST: memcpy(tmp, q->slots[s->root].send, bytes); break;
    default: /* all_to_all */
      for (int r = 0; r < n; r++)
        memcpy(tmp + (size_t)r * bytes, (const char *)q->slots[r].send + (size_t)me * bytes, bytes);
      break;
    }
  } else {
    fail(c, ncclSystemError);
  }
  int bad = double_meet(q); /* nobody writes before everyone has read (in-place forms) */
  if (write && !bad && out_bytes) memcpy(s->recv, tmp, out_bytes);
  if (bad) fail(c, ncclRemoteError);
  free(tmp);
  free(src);
  done(c);
}

static ncclResult_t enqueue(ncclComm_t c, cudaStream_t stream, slot s, int peer) {
  if (!c || !stream) return ncclInvalidArgument;
  if (s.count && ((!s.send && s.kind != K_RECV) || (!s.recv && s.kind != K_SEND && s.kind != K_REDUCE))) {
    snprintf(double_last_error, sizeof double_last_error, "NULL buffer");
    return ncclInvalidArgument;
  }
  coll_task *k = calloc(1, sizeof *k);
  if (!k) return ncclSystemError;
  k->t.run = coll_run;
  k->t.comm = c;
  k->s = s;
  k->peer = peer;
  int held = 0;
  ncclResult_t r = double_group_hold(k, stream, &held);
  if (r != ncclSuccess) free(k);
  if (r != ncclSuccess || held) return r;
  double_submit(k, stream);
  return ncclSuccess;
}

void double_submit(coll_task *k, cudaStream_t stream) {
  ncclComm_t c = k->t.comm;
  pthread_mutex_lock(&c->q->lock);
  c->inflight++;
  pthread_mutex_unlock(&c->q->lock);
  double_push(stream, &k->t);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_REDUCE, sendbuff, recvbuff, count, t, op, 0}, 0);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_GATHER, sendbuff, recvbuff, count, t, ncclSum, 0}, 0);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_REDUCE_SCATTER, sendbuff, recvbuff, count, t, op, 0}, 0);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           int root, ncclComm_t c, cudaStream_t s) {
  if (!c || root < 0 || root >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_BROADCAST, sendbuff, recvbuff, count, t, ncclSum, root}, 0);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
  if (!c || root < 0 || root >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_REDUCE, sendbuff, recvbuff, count, t, op, root}, 0);
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                          ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_TO_ALL, sendbuff, recvbuff, count, t, ncclSum, 0}, 0);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t t, int peer,
                      ncclComm_t c, cudaStream_t s) {
  if (!c || peer < 0 || peer >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_SEND, sendbuff, NULL, count, t, ncclSum, 0}, peer);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s) {
  if (!c || peer < 0 || peer >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_RECV, NULL, recvbuff, count, t, ncclSum, 0}, peer);
}
