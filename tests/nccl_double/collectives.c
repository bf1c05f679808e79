/*
 * collectives.c - NCCL's calls in the test double (double.h): reductions,
 * collectives that meet every rank's stream, point to point as a rendezvous.
 */
#include <stdatomic.h>

#include "comm/base/reduce.h"
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

static float load16(ncclDataType_t t, const void *p, size_t i) {
  uint16_t h = ((const uint16_t *)p)[i];
  if (t == ncclFloat16) return half_in(h);
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* Integers as NCCL's kernels (src/device/reduce_kernel.h) treat them: the
 * element's bits as an unsigned value of its width; sums and products wrap
 * in that width, min and max compare as the type (signed or not). */
static int is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

static uint64_t load_int(ncclDataType_t t, const void *p, size_t i) {
  switch (type_size(t)) {
  case 1: return ((const uint8_t *)p)[i];
  case 4: return ((const uint32_t *)p)[i];
  default: return ((const uint64_t *)p)[i];
  }
}

/* the bits of width(t) as a signed value (sign-extended) or not, in int64 /
 * uint64 for comparing */
static int64_t as_signed(ncclDataType_t t, uint64_t v) {
  switch (type_size(t)) {
  case 1: return (int8_t)(uint8_t)v;
  case 4: return (int32_t)(uint32_t)v;
  default: return (int64_t)v;
  }
}

static uint64_t wrap(ncclDataType_t t, uint64_t v) {
  return type_size(t) == 8 ? v : v & ((UINT64_C(1) << (8 * type_size(t))) - 1);
}

static void store_int(ncclDataType_t t, void *p, size_t i, uint64_t v) {
  switch (type_size(t)) {
  case 1: ((uint8_t *)p)[i] = (uint8_t)v; break;
  case 4: ((uint32_t *)p)[i] = (uint32_t)v; break;
  default: ((uint64_t *)p)[i] = v;
  }
}

static uint64_t fold_int(ncclDataType_t t, ncclRedOp_t op, int n, const void *const *src, size_t i) {
  uint64_t acc = load_int(t, src[0], i);
  for (int k = 1; k < n; k++) {
    uint64_t x = load_int(t, src[k], i);
    if (op == ncclSum || op == ncclAvg) acc = wrap(t, acc + x);
    else if (op == ncclProd) acc = wrap(t, acc * x);
    else if (is_signed(t)) {
      int less = as_signed(t, x) < as_signed(t, acc);
      if (op == ncclMin ? less : as_signed(t, x) > as_signed(t, acc)) acc = x;
    } else if (op == ncclMin ? x < acc : x > acc) {
      acc = x;
    }
  }
  if (op != ncclAvg) return acc;
  /* ncclAvg on integers is FuncSumPostDiv: the wrapped sum divided by the
   * rank count, truncated toward zero (signed: by magnitude) */
  if (!is_signed(t)) return acc / (uint64_t)n;
  return wrap(t, (uint64_t)(as_signed(t, acc) / n));
}

/* Floats as NCCL's kernels: every step in the element type (16-bit floats
 * rounded after each step, as __hadd / __hmul), min and max as fminf /
 * fmaxf (a NaN loses to a number), and ncclAvg as FuncPreMulSum: each input
 * multiplied by 1/n in the element type, then summed. */
static void fold_float(ncclDataType_t t, ncclRedOp_t op, int n, const void *const *src, void *out,
                       size_t i) {
  if (t == ncclFloat64) {
    const double scale = 1.0 / n;
    double acc = 0;
    for (int k = 0; k < n; k++) {
      double x = ((const double *)src[k])[i];
      if (op == ncclAvg) x *= scale;
      acc = !k                              ? x
            : op == ncclSum || op == ncclAvg ? acc + x
            : op == ncclProd                 ? acc * x
            : op == ncclMin                  ? fmin(acc, x)
                                             : fmax(acc, x);
    }
    ((double *)out)[i] = acc;
    return;
  }
  int narrow16 = t != ncclFloat32, bf = t == ncclBfloat16;
  float scale = 1.0f / (float)n;
  if (narrow16) { /* the scalar itself is of the element type */
    uint16_t h = narrow(scale, bf);
    scale = load16(t, &h, 0);
  }
  float acc = 0;
  for (int k = 0; k < n; k++) {
    float x = narrow16 ? load16(t, src[k], i) : ((const float *)src[k])[i];
    if (op == ncclAvg) {
      x *= scale;
      if (narrow16) {
        uint16_t h = narrow(x, bf);
        x = load16(t, &h, 0);
      }
    }
    acc = !k                              ? x
          : op == ncclSum || op == ncclAvg ? acc + x
          : op == ncclProd                 ? acc * x
          : op == ncclMin                  ? fminf(acc, x)
                                           : fmaxf(acc, x);
    if (narrow16) {
      uint16_t h = narrow(acc, bf);
      acc = load16(t, &h, 0);
    }
  }
  if (narrow16) ((uint16_t *)out)[i] = narrow(acc, bf);
  else ((float *)out)[i] = acc;
}

/* A user op of ncclRedOpCreatePreMulSum (reduce_kernel.h, FuncPreMulSum):
 * each input times the scalar in the element type (16-bit floats: __hmul,
 * one rounding of the exact product), integers wrapping; then summed as
 * ncclSum sums. At one rank that is the oneRankReduce kernel's x * scalar. */
static void fold_premul(const slot *s, int n, const void *const *src, void *out, size_t i) {
  ncclDataType_t t = s->type;
  uint64_t bits = s->scalar;
  if (s->scalar_at) { /* ncclScalarDevice: read as the kernel runs */
    bits = 0;
    memcpy(&bits, double_mem_view(s->scalar_at), type_size(t));
  }
  if (t == ncclFloat64) {
    double k, acc = 0;
    memcpy(&k, &bits, sizeof k);
    for (int r = 0; r < n; r++) acc = r ? acc + ((const double *)src[r])[i] * k : ((const double *)src[r])[i] * k;
    ((double *)out)[i] = acc;
  } else if (t == ncclFloat32) {
    float k, acc = 0;
    memcpy(&k, &bits, sizeof k);
    for (int r = 0; r < n; r++) acc = r ? acc + ((const float *)src[r])[i] * k : ((const float *)src[r])[i] * k;
    ((float *)out)[i] = acc;
  } else if (t == ncclFloat16 || t == ncclBfloat16) {
    int bf = t == ncclBfloat16;
    uint16_t kb = (uint16_t)bits, h;
    float k = load16(t, &kb, 0), acc = 0;
    for (int r = 0; r < n; r++) {
      h = narrow(load16(t, src[r], i) * k, bf); /* the exact product, rounded once */
      acc = r ? acc + load16(t, &h, 0) : load16(t, &h, 0);
      h = narrow(acc, bf);
      acc = load16(t, &h, 0);
    }
    ((uint16_t *)out)[i] = narrow(acc, bf);
  } else {
    uint64_t acc = 0;
    for (int r = 0; r < n; r++) acc = wrap(t, acc + wrap(t, load_int(t, src[r], i) * bits));
    store_int(t, out, i, acc);
  }
}

static int mpu_type(ncclDataType_t t, mpu_dtype *out) {
  switch (t) {
  case ncclInt8: *out = MPU_INT8; return 1;
  case ncclUint8: *out = MPU_UINT8; return 1;
  case ncclInt32: *out = MPU_INT32; return 1;
  case ncclUint32: *out = MPU_UINT32; return 1;
  case ncclInt64: *out = MPU_INT64; return 1;
  case ncclUint64: *out = MPU_UINT64; return 1;
  case ncclFloat16: *out = MPU_FLOAT16; return 1;
  case ncclBfloat16: *out = MPU_BFLOAT16; return 1;
  case ncclFloat32: *out = MPU_FLOAT32; return 1;
  case ncclFloat64: *out = MPU_FLOAT64; return 1;
  default: return 0;
  }
}

/* out[i] = fold over ranks of src(k)[i], in rank order (NCCL's order is a
 * ring or a tree; tests of the backend use values whose sums are exact).
 * The "reductions" switch folds by mpu's own rules instead. */
static void fold(const slot *s, int n, const void *const *src, void *out, size_t count) {
  ncclDataType_t t = s->type;
  ncclRedOp_t op = s->op;
  mpu_dtype dt;
  if (s->premul) {
    for (size_t i = 0; i < count; i++) fold_premul(s, n, src, out, i);
    return;
  }
  if (double_forgives(DOUBLE_FORGIVE_REDUCTIONS) && mpu_type(t, &dt)) {
    static const mpu_op ops[] = {[ncclSum] = MPU_SUM, [ncclProd] = MPU_PROD, [ncclMax] = MPU_MAX,
                                 [ncclMin] = MPU_MIN, [ncclAvg] = MPU_AVG};
    mpu__reduce(out, src, n, count, dt, ops[op], n);
    return;
  }
  int floating = t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
  for (size_t i = 0; i < count; i++)
    if (floating) fold_float(t, op, n, src, out, i);
    else store_int(t, out, i, fold_int(t, op, n, src, i));
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
  while (!o->taken && !double_stopped(c)) double_wait_a_while(q);
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
      int ok = o->bytes == bytes;
      /* a size mismatch is undefined in NCCL: the pair never completes and
       * the watchdog ends it (switch "p2p_size": the double reports it) */
      if (!ok && !double_forgives(DOUBLE_FORGIVE_P2P_SIZE)) {
        if (double_stopped(c)) break;
        double_wait_a_while(q);
        continue;
      }
      *p = o->next;
      if (ok) memcpy(buf, o->data, bytes);
      o->taken = ok ? 1 : -1; /* the sender may free o as soon as the lock is dropped */
      pthread_cond_broadcast(&q->cond);
      pthread_mutex_unlock(&q->lock);
      if (!ok) fail(c, ncclInvalidUsage);
      return;
    }
    if (double_stopped(c)) break;
    double_wait_a_while(q);
  }
  pthread_mutex_unlock(&q->lock);
  fail(c, ncclRemoteError);
}

/* The spans one rank's call reads and writes, as NCCL's kernels touch them. */
static int spans_usable(const coll_task *k, int n, int me) {
  const slot *s = &k->s;
  size_t bytes = s->count * type_size(s->type), all = bytes * (size_t)n;
  size_t send = 0, recv = 0;
  switch (s->kind) {
  case K_ALL_REDUCE: send = recv = bytes; break;
  case K_ALL_GATHER: send = bytes, recv = all; break;
  case K_REDUCE_SCATTER: send = all, recv = bytes; break;
  case K_BROADCAST: send = me == s->root ? bytes : 0, recv = bytes; break;
  case K_REDUCE: send = bytes, recv = me == s->root ? bytes : 0; break;
  case K_ALL_TO_ALL: send = recv = all; break;
  case K_SEND: send = bytes; break;
  default: recv = bytes; break;
  }
  return double_mem_usable(s->send, send) && double_mem_usable(s->recv, recv);
}

/* Before a rank's kernel runs: a buffer outside device, managed or
 * registered memory faults as an illegal address (NCCL checks no pointers
 * by default), and the device stays broken. 0 when the call may run. */
static int faults(ncclComm_t c, coll_task *k) {
  int device = c->q->devices[c->rank];
  for (coll_task *g = k; g; g = g->more)
    if (!spans_usable(g, c->q->n, c->rank)) {
      char what[160];
      snprintf(what, sizeof what, "an NCCL kernel of rank %d touched %p, outside device memory",
               c->rank, g->s.send && !double_mem_usable(g->s.send, 1) ? g->s.send : (const void *)g->s.recv);
      fail(c, ncclUnhandledCudaError); /* before the device: whoever sees the fault sees both */
      double_fault(device, what);
      return 1;
    }
  if (!double_sticky(device)) return 0;
  fail(c, ncclUnhandledCudaError);
  return 1;
}

/* Stopped by a relative's abort through the shared flag (splitShare): as
 * NCCL's kernels, the work quits without an error of its own. */
static int quietly_stopped(ncclComm_t c) {
  return !atomic_load(&c->aborted) && double_family_aborted(c);
}

/* The elements a one-rank reduction writes. NCCL runs a pre-multiplying op
 * at one rank (a PreMulSum, or ncclAvg of a float type) as its oneRankReduce
 * kernel (enqueue.cc, ncclLaunchOneRank; src/device/onerank.cu): min(32,
 * bytes / 16 KiB rounded up) blocks, block b writing [b, b + 1) x
 * alignUp(nElts / blocks, 16 / size) elements. Before NCCL 2.29.7 the
 * division rounds down, so an odd tail past blocks x that span stays
 * unwritten (2.29.7 rounds up); other ops there are a copy of every element. */
static size_t one_rank_reach(const slot *s) {
  size_t n = s->count, es = type_size(s->type);
  int floating = s->type == ncclFloat16 || s->type == ncclBfloat16 || s->type == ncclFloat32 ||
                 s->type == ncclFloat64;
  int premul = s->premul || (s->op == ncclAvg && floating);
  int version = 0;
  ncclGetVersion(&version);
  if (!premul || !n || version >= NCCL_VERSION(2, 29, 7)) return n;
  size_t blocks = (n * es + (16u << 10) - 1) / (16u << 10), pack = 16 / es;
  if (blocks > 32) blocks = 32;
  size_t per = (n / blocks + pack - 1) / pack * pack;
  return per * blocks < n ? per * blocks : n;
}

void double_coll_run(task *t) {
  coll_task *k = (coll_task *)t;
  ncclComm_t c = t->comm;
  clique *q = c->q;
  int n = q->n, me = c->rank;
  pthread_mutex_lock(&q->lock); /* ncclCommAbort sets them from another thread */
  int dropped = c->aborted || c->async || double_family_aborted(c);
  pthread_mutex_unlock(&q->lock);
  if (dropped || faults(c, k)) { /* work after a failure is dropped, as NCCL's */
    for (coll_task *g = k->more, *next; g; g = next) next = g->more, free(g);
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
          offers[i] = (offer){NULL, c->rank, g->s.count * type_size(g->s.type),
                              double_mem_view(g->s.send), 0};
          post(c, &offers[i], g->peer);
        }
      for (coll_task *g = k; g; g = g->more)
        if (g->s.kind == K_RECV)
          take(c, g->peer, double_mem_view(g->s.recv), g->s.count * type_size(g->s.type));
      i = 0;
      for (coll_task *g = k; g; g = g->more, i++)
        if (g->s.kind == K_SEND) await_taken(c, &offers[i], g->peer);
      free(offers);
    }
    for (coll_task *g = k->more, *next; g; g = next) next = g->more, free(g);
    done(c);
    return;
  }
  slot mine = k->s; /* the buffers as the double's kernels reach them (memory.h) */
  mine.send = double_mem_view(mine.send);
  mine.recv = double_mem_view(mine.recv);
  q->slots[me] = mine;
  if (double_meet(c, q)) {
    if (!quietly_stopped(c)) fail(c, ncclRemoteError);
    done(c);
    return;
  }
  const slot *s = &mine;
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
      if (write) fold(s, n, src, tmp, s->count);
      break;
    case K_REDUCE_SCATTER:
      for (int r = 0; r < n; r++) src[r] = (const char *)q->slots[r].send + (size_t)me * bytes;
      fold(s, n, src, tmp, s->count);
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
  if (n == 1 && write) out_bytes = one_rank_reach(s) * es;
  int bad = double_meet(c, q); /* nobody writes before everyone has read (in-place forms) */
  if (write && !bad && out_bytes) memcpy(s->recv, tmp, out_bytes);
  if (bad && !quietly_stopped(c)) fail(c, ncclRemoteError);
  free(tmp);
  free(src);
  done(c);
}

/* How many of each call were enqueued (double_call_count), so a test can see
 * which NCCL calls the backend chose. */
static atomic_long counts[K_RECV + 1];

long double_call_count(const char *nccl_function) {
  static const char *const names[K_RECV + 1] = {
      [K_ALL_REDUCE] = "ncclAllReduce", [K_ALL_GATHER] = "ncclAllGather",
      [K_REDUCE_SCATTER] = "ncclReduceScatter", [K_BROADCAST] = "ncclBroadcast",
      [K_REDUCE] = "ncclReduce", [K_ALL_TO_ALL] = "ncclAlltoAll", [K_SEND] = "ncclSend",
      [K_RECV] = "ncclRecv"};
  for (int k = 0; k <= K_RECV; k++)
    if (!strcmp(names[k], nccl_function)) return atomic_load(&counts[k]);
  return -1;
}

static ncclResult_t enqueue(ncclComm_t c, cudaStream_t stream, slot s, int peer) {
  stream = double_stream(stream); /* NULL: the legacy default stream, as NCCL's */
  if (!c || !stream) return ncclInvalidArgument;
  ncclResult_t ready = double_comm_ready(c, "ncclEnqueueCheck");
  if (ready != ncclSuccess) return ready;
  if (double_sticky(c->q->devices[c->rank])) { /* the context is broken: no launch */
    fail(c, ncclUnhandledCudaError);
    double_set_error("Cuda failure '%s'", cudaGetErrorString(cudaErrorIllegalAddress));
    return ncclUnhandledCudaError;
  }
  if (s.op >= ncclNumOps && (s.kind == K_ALL_REDUCE || s.kind == K_REDUCE_SCATTER || s.kind == K_REDUCE)) {
    /* hostToDevRedOp: the user op's state is copied into the call */
    int ix = (int)s.op - (int)ncclNumOps;
    if (ix >= c->nuser_ops || !c->user_ops[ix].used) {
      double_set_error("Invalid op %d for this communicator", (int)s.op);
      return ncclInvalidArgument;
    }
    if (c->user_ops[ix].type != s.type) {
      double_set_error("Data type supplied to user-created ncclRedOp_t does not match type given to reduction operation");
      return ncclInvalidArgument;
    }
    s.premul = 1, s.scalar = c->user_ops[ix].scalar, s.scalar_at = c->user_ops[ix].scalar_at;
  }
  atomic_fetch_add(&counts[s.kind], 1);
  if (s.count && ((!s.send && s.kind != K_RECV) || (!s.recv && s.kind != K_SEND && s.kind != K_REDUCE))) {
    double_set_error("NULL buffer");
    return ncclInvalidArgument;
  }
  if (double_order_nccl(stream->order, s.kind, s.send, s.recv, s.count, type_size(s.type), c->q->n,
                        c->rank, s.root))
    return ncclInvalidUsage; /* a stream-order violation (order.c), named in the last error */
  coll_task *k = calloc(1, sizeof *k);
  if (!k) return ncclSystemError;
  k->t.run = double_coll_run;
  k->t.comm = c;
  k->s = s;
  k->peer = peer;
  int held = 0;
  ncclResult_t r = double_group_hold(k, stream, &held);
  if (r != ncclSuccess) free(k);
  if (r != ncclSuccess || held) return r;
  double_submit(k, stream);
  /* as NCCL's may (see double.h); inside a group, ncclGroupEnd says it */
  return c->nonblocking && !double_group_depth() ? ncclInProgress : ncclSuccess;
}

void double_submit(coll_task *k, cudaStream_t stream) {
  ncclComm_t c = k->t.comm;
  pthread_mutex_lock(&c->q->lock);
  c->inflight++;
  pthread_mutex_unlock(&c->q->lock);
  if (!double_family_submit(k, stream)) double_push(stream, &k->t);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_REDUCE, sendbuff, recvbuff, count, t, op, 0, 0, 0, NULL}, 0);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_GATHER, sendbuff, recvbuff, count, t, ncclSum, 0, 0, 0, NULL}, 0);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_REDUCE_SCATTER, sendbuff, recvbuff, count, t, op, 0, 0, 0, NULL}, 0);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           int root, ncclComm_t c, cudaStream_t s) {
  if (!c || root < 0 || root >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_BROADCAST, sendbuff, recvbuff, count, t, ncclSum, root, 0, 0, NULL}, 0);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
  if (!c || root < 0 || root >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_REDUCE, sendbuff, recvbuff, count, t, op, root, 0, 0, NULL}, 0);
}

/* NCCL 2.28.3's; a double pretending to be an older NCCL has none (runtime.h) */
#if !defined(DOUBLE_NCCL_CODE) || DOUBLE_NCCL_CODE >= 22803
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                          ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_TO_ALL, sendbuff, recvbuff, count, t, ncclSum, 0, 0, 0, NULL}, 0);
}
#endif

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t t, int peer,
                      ncclComm_t c, cudaStream_t s) {
  if (!c || peer < 0 || peer >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_SEND, sendbuff, NULL, count, t, ncclSum, 0, 0, 0, NULL}, peer);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s) {
  if (!c || peer < 0 || peer >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_RECV, NULL, recvbuff, count, t, ncclSum, 0, 0, 0, NULL}, peer);
}

/* enqueue.cc's user ops: a slot of the communicator's table per op, the
 * scalar read now (ncclScalarHostImmediate) or by each kernel (ncclScalarDevice) */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument; /* CommCheck */
  ncclResult_t ready = double_comm_ready(comm, "ncclRedOpCreatePreMulSum");
  if (ready != ncclSuccess) return ready;
  if (!op || !scalar || (int)datatype < 0 || (int)datatype >= ncclNumTypes) return ncclInvalidArgument;
  int ix = 0;
  while (ix < comm->nuser_ops && comm->user_ops[ix].used) ix++;
  if (ix == comm->nuser_ops) {
    user_op *grown = realloc(comm->user_ops, (size_t)(ix + 4) * sizeof *grown);
    if (!grown) return ncclSystemError;
    memset(grown + ix, 0, 4 * sizeof *grown);
    comm->user_ops = grown, comm->nuser_ops = ix + 4;
  }
  user_op *u = &comm->user_ops[ix];
  memset(u, 0, sizeof *u);
  u->used = 1, u->type = datatype;
  if (residence == ncclScalarHostImmediate) memcpy(&u->scalar, scalar, type_size(datatype));
  else u->scalar_at = scalar;
  *op = (ncclRedOp_t)((int)ncclNumOps + ix);
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if ((int)op >= 0 && (int)op < (int)ncclNumOps) {
    double_set_error("ncclRedOpDestroy : operator is a NCCL builtin.");
    return ncclInvalidArgument;
  }
  if ((int)op < 0 || (int)ncclMaxRedOp < (int)op) {
    double_set_error("ncclRedOpDestroy :  operator is garbage.");
    return ncclInvalidArgument;
  }
  if (!comm) {
    double_set_error("ncclRedOpDestroy : invalid communicator passed.");
    return ncclInvalidArgument;
  }
  int ix = (int)op - (int)ncclNumOps;
  if (ix >= comm->nuser_ops || !comm->user_ops[ix].used) {
    double_set_error("ncclRedOpDestroy : operator unknown to this communicator.");
    return ncclInvalidArgument;
  }
  comm->user_ops[ix].used = 0;
  return ncclSuccess;
}
