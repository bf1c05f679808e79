/*
 * collectives.c - the threads backend's collectives over shared memory.
 *
 * Small calls (what a rank contributes fits in MPU_THREADS_SCRATCH) copy
 * their input into the group's staging buffer before the barrier and need
 * that one barrier: afterwards each rank computes its output from the staged
 * inputs. Tiny ones (at most MPU_THREADS_BOX bytes) stage in the member's box
 * beside the call's signature, so a peer reads the signature and the data on
 * one line (on 2 ranks of a 2-CPU Xeon an 8-byte all_reduce takes 0.43-0.48
 * us a call so, 0.57-0.59 through a scratch slot: docs/bench.md). Large calls
 * publish their buffer pointers instead and work on the peers' buffers
 * directly (zero-copy), then meet at an exit barrier so no rank returns, and
 * reuses its buffers, while a peer still reads them.
 *
 * Large calls split the work so that every input byte is read once and every
 * output byte written once, the least memory traffic there is: in an
 * all_reduce rank k reduces chunk k of the vector from every input and writes
 * the result into every rank's output; in an all_gather each rank writes its
 * input into every output; a broadcast's chunks are pushed by different
 * ranks. Every chunk is reduced by one rank in rank order, so all ranks get
 * the same bits. Calls whose buffers (everything read and written) do not
 * fit in the last-level cache write with streaming stores (copy.h): their
 * outputs would be evicted before anyone read them. An all_to_all, and an
 * all_gather in place, stream too where a core's reads fit its level-2 cache,
 * its reads and writes together do not, and it writes no more than it reads
 * (mpu__stream_rule).
 *
 * That work comes in n tasks, task k by default done by rank k. When ranks
 * outnumber the cores, only as many ranks as there are cores work, rank w
 * taking tasks w, w + W, ...; the others go straight to the exit barrier and
 * sleep, so the workers run without being time-sliced against them.
 *
 * A large call's tasks come in parts (a few hundred KiB each) that a rank
 * claims one at a time, its own tasks' from the front. On a crowded machine
 * (more runnable threads than CPUs, sync.c) a rank done with its own tasks
 * claims the parts its peers have not begun, from the back: a peer the
 * scheduler took off its CPU then holds up the call by one part, not by its
 * whole share. Who moves a part changes no bit of the result: each element
 * is still combined from every input in rank order.
 *
 * What a kind reads and writes (its blocks, its in-place form) is the
 * collective table's (collective.h); this file's own table (kinds[]) says
 * how the threads backend moves each kind: its tasks and its small path.
 */
#include <stdio.h>
#include <string.h>

#include "comm/base/copy.h"
#include "comm/base/reduce.h"
#include "comm/threads/threads.h"
#include "core/error.h"

static const mpu__call *g_calls(const tcomm *tc, int parity) { return tc->g->calls[parity]; }

/* Where the members stage a small call of parity p: member k's at base + k *
 * stride, in its box when it fits there (one line a peer reads for the
 * signature and the data together), else in the group's scratch. */
typedef struct tstaged {
  unsigned char *base;
  size_t stride;
} tstaged;

static tstaged staged_at(const tgroup *g, int p, int boxed) {
  if (boxed) return (tstaged){g->mem[0].box[p].data, sizeof(tmember)};
  return (tstaged){(unsigned char *)g->scratch[p], MPU_THREADS_SCRATCH};
}

static unsigned char *staged(tstaged s, int member) { return s.base + (size_t)member * s.stride; }

/* The verdict on the members' signatures (member m's at sigs + m * stride)
 * and, for an uneven call, on their count lists (calls). */
static mpu_result_t check(const tcomm *tc, const mpu__sig *sigs, size_t stride,
                          const mpu__call *calls, const char *fn);

/* Enter a call: sign it in this member's box, describe it in full when its
 * tasks need every member's buffers (`describe`: large and uneven calls),
 * stage `stage_bytes` of `stage` (in the box when `boxed`), meet every member
 * and check that they all made this call. The signatures are compared from
 * the boxes, which every call writes: so the verdict never reads a
 * description a member did not write for this call, and members that agree
 * on the signature agree on whether the call is boxed, small or described.
 * Sets *parity for the data phase. */
static mpu_result_t enter(tcomm *tc, const mpu__call *call, int describe, const void *stage,
                          size_t stage_bytes, int boxed, const char *fn, int *parity) {
  tgroup *g = tc->g;
  uint64_t seq = ++tc->seq;
  int p = (int)(seq & 1);
  g->mem[tc->me].box[p].sig = call->sig;
  if (describe) g->calls[p][tc->me] = *call;
  if (stage_bytes) memcpy(staged(staged_at(g, p, boxed), tc->me), stage, stage_bytes);
  /* read by a waiter only to name who is missing: the arrival's
   * read-modify-write right after it orders it, no fence of its own needed */
  atomic_store_explicit(&g->mem[tc->me].entered, seq, memory_order_release);
  MPU_CHECK(mpu__tbarrier(tc, 1, fn));
  /* Every member has now passed the previous call, the last that read this
   * member's other box, and reads it next after the next call's barrier: a
   * store to it now brings its lines here while this call goes on, so the
   * next call's writes do not wait for them (the stored values are
   * overwritten before anyone reads them) */
  tbox *next = &g->mem[tc->me].box[p ^ 1];
  next->sig = call->sig;
  if (boxed && stage_bytes) next->data[stage_bytes - 1] = 0;
  MPU_CHECK(check(tc, &g->mem[0].box[p].sig, sizeof(tmember), g->calls[p], fn));
  *parity = p;
  return MPU_SUCCESS;
}

/* Wait until every member is done with this call's buffers. */
static mpu_result_t leave(tcomm *tc, const char *fn) { return mpu__tbarrier(tc, 0, fn); }

/* Whether a call touching a * b + c * d bytes in all streams (saturating: a
 * product past the address space only has to be big). */
static int streams(size_t a, size_t b, size_t c, size_t d) {
  size_t x, y, z;
  if (__builtin_mul_overflow(a, b, &x) || __builtin_mul_overflow(c, d, &y) ||
      __builtin_add_overflow(x, y, &z))
    return 1;
  return mpu__streams(z);
}


/* Whether any member's call is its kind's in-place form (block: one
 * block's bytes; mpu__coll_in_place). */
static int any_in_place(const mpu__call *calls, int n, size_t block) {
  const mpu__coll *row = mpu__coll_of(calls[0].sig.kind);
  for (int m = 0; m < n; m++)
    if (mpu__coll_in_place(row, calls[m].send, calls[m].recv, m, block)) return 1;
  return 0;
}

/* How many ranks work in a large call: rank w does tasks w, w + W, ... (see
 * the top of the file). */
static int workers(const tcomm *tc) {
  return tc->g->world->cpus < tc->g->n ? tc->g->world->cpus : tc->g->n;
}

/* The most tasks one worker runs in a large call. */
static size_t worker_tasks(const tcomm *tc) {
  size_t n = (size_t)tc->g->n, w = (size_t)workers(tc);
  return (n + w - 1) / w;
}

/* Elements [*lo, *hi) narrowed to part `part` of `parts` of them. */
static void narrow(size_t *lo, size_t *hi, int part, int parts) {
  size_t len = *hi - *lo, base = *lo;
  *lo = base + mpu__chunk_lo(len, parts, part);
  *hi = base + mpu__chunk_lo(len, parts, part + 1);
}


/* ---- the tasks: the data movement of a call every member has entered ----
 * Task t of n, from the members' descriptions `calls`; part `part` of
 * `parts` of it (the uneven ones come whole: part 0 of 1). Which thread runs a
 * task does not matter: a blocking call's members run their own (see the top
 * of the file), a non-blocking call's are all run by the member that claims
 * it (progress.c). Each reads and writes only the buffers the members handed
 * over, so the tasks of one call may run in any order. */

static void task_all_reduce(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  const mpu__call *k = &calls[0];
  int n = tc->g->n;
  mpu_dtype dt = (mpu_dtype)k->sig.dtype;
  size_t count = (size_t)k->sig.count, es = mpu_dtype_size(dt), bytes = count * es;
  /* n inputs, n outputs; in place a task writes the lines it has just read,
   * which are in the cache, and streaming stores would only evict them (16
   * MiB on 8 ranks: 4.0 ms cached, 13.7 streamed, mpu_bench_roof) */
  int stream = streams(bytes, (size_t)n, bytes, (size_t)n) && !any_in_place(calls, n, 0);
  /* task t: reduce chunk t of every input into chunk t of every output */
  size_t lo = mpu__chunk_lo(count, n, t), hi = mpu__chunk_lo(count, n, t + 1);
  narrow(&lo, &hi, part, parts);
  for (int m = 0; m < n; m++) {
    tc->ptrs[m] = (const char *)calls[m].send + lo * es;
    tc->dsts[m] = (char *)calls[m].recv + lo * es;
  }
  mpu__reduce_to(tc->dsts, n, tc->ptrs, n, hi - lo, dt, (mpu_op)k->sig.op, n, stream);
}

/* Whether an all_gather whose members each contribute `bytes` streams. Out
 * of place it touches n inputs and n outputs, and streams past the
 * last-level threshold alone: its writes to its own output cached are
 * faster below it (on 2 ranks of this Xeon, cached pushes of 1 and 2 MiB a
 * rank took 80 and 174 us a call where streaming ones took 89 and 181). In
 * place the inputs lie in the n outputs, and a worker's tasks read its
 * blocks and write them to the n - 1 others: mpu__stream_rule weighs that
 * as an all_to_all's task (on 2 ranks, 2 MiB a rank: 101 us a call
 * streamed, 110 cached; on 8, whose tasks write 7 times what they read,
 * cached is faster: docs/bench.md). Its tasks write n - 1 times what they
 * read, so the L2 rule, which streams no writes larger than the reads, can
 * apply on 2 ranks only. */
static int all_gather_streams(const tcomm *tc, const mpu__call *calls, size_t bytes) {
  size_t n = (size_t)tc->g->n, nn, outs, reads, writes;
  if (!any_in_place(calls, (int)n, bytes)) return streams(bytes, n, bytes * n, n);
  if (__builtin_mul_overflow(n, n, &nn) || __builtin_mul_overflow(bytes, nn, &outs) ||
      __builtin_mul_overflow(bytes, worker_tasks(tc), &reads) || /* its tasks' blocks */
      __builtin_mul_overflow(reads, n - 1, &writes))
    return 1;
  return mpu__streams_task(outs, reads, writes);
}

static void task_all_gather(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  int n = tc->g->n;
  size_t count = (size_t)calls[0].sig.count, es = mpu_dtype_size((mpu_dtype)calls[0].sig.dtype);
  size_t bytes = count * es, lo = 0, hi = count;
  narrow(&lo, &hi, part, parts);
  if (lo == hi) return;
  /* task t pushes rank t's input into every output, a slice at a time, so
   * that each input is read once (from memory past the cache, from this
   * core's cache in it). Pulling every input into one's own output reads n
   * times as much: in cache on 2 ranks it needed 1 MiB of each core's 2 MiB
   * L2 more per MiB gathered, and a 1 MiB call's median was 38-147 us where
   * pushing took 25-27 (docs/bench.md). Each output block is still written
   * by one core, call after call. */
  for (int k = 0; k < n; k++) {
    char *dst = (char *)calls[k].recv + (size_t)t * bytes;
    tc->dsts[k] = dst == calls[t].send ? NULL : dst + lo * es; /* in place: already there */
  }
  mpu__copy_to(tc->dsts, n, (const char *)calls[t].send + lo * es, (hi - lo) * es,
               all_gather_streams(tc, calls, bytes));
}

static void task_reduce_scatter(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  const mpu__call *k0 = &calls[0];
  int n = tc->g->n;
  mpu_dtype dt = (mpu_dtype)k0->sig.dtype;
  size_t count = (size_t)k0->sig.count, bytes = count * mpu_dtype_size(dt);
  size_t total = bytes * (size_t)n, es = mpu_dtype_size(dt), lo = 0, hi = count;
  narrow(&lo, &hi, part, parts);
  /* task t: reduce block t of every input into rank t's output */
  for (int k = 0; k < n; k++) tc->ptrs[k] = (const char *)calls[k].send + (size_t)t * bytes + lo * es;
  void *dst = (char *)calls[t].recv + lo * es;
  mpu__reduce_to(&dst, 1, tc->ptrs, n, hi - lo, dt, (mpu_op)k0->sig.op, n,
                 streams(total, (size_t)n, bytes, (size_t)n) && !any_in_place(calls, n, bytes));
}

static void task_broadcast(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  /* chunk t of the root's buffer is pushed to every other rank. Without call
   * checking the roots named may differ: each member's description names the
   * root it was given, and the root's own description is what is read, which
   * is wrong data but stays within buffers of the checked count. */
  int n = tc->g->n, root = calls[0].sig.root;
  mpu_dtype dt = (mpu_dtype)calls[0].sig.dtype;
  size_t count = (size_t)calls[0].sig.count, es = mpu_dtype_size(dt), bytes = count * es;
  size_t lo = mpu__chunk_lo(count, n, t), hi = mpu__chunk_lo(count, n, t + 1);
  narrow(&lo, &hi, part, parts);
  for (int k = 0; k < n; k++) tc->dsts[k] = k == root ? NULL : (char *)calls[k].recv + lo * es;
  mpu__copy_to(tc->dsts, n, (const char *)calls[root].send + lo * es, (hi - lo) * es,
               streams(bytes, (size_t)n, 0, 0));
}

static void task_reduce(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  int n = tc->g->n, root = calls[0].sig.root;
  mpu_dtype dt = (mpu_dtype)calls[0].sig.dtype;
  size_t count = (size_t)calls[0].sig.count, es = mpu_dtype_size(dt), bytes = count * es;
  /* the root's description must say it is the root (unchecked calls may not) */
  if (calls[root].sig.kind != MPU_COLL_REDUCE || calls[root].sig.root != root) return;
  /* task t reduces chunk t straight into the root's output */
  size_t lo = mpu__chunk_lo(count, n, t), hi = mpu__chunk_lo(count, n, t + 1);
  narrow(&lo, &hi, part, parts);
  for (int k = 0; k < n; k++) tc->ptrs[k] = (const char *)calls[k].send + lo * es;
  void *dst = (char *)calls[root].recv + lo * es;
  mpu__reduce_to(&dst, 1, tc->ptrs, n, hi - lo, dt, (mpu_op)calls[0].sig.op, n,
                 streams(bytes, (size_t)n + 1, 0, 0) && calls[root].recv != calls[root].send);
}

/* Whether an all_to_all whose members each send `total` bytes streams: each
 * of the W workers reads and writes `total` bytes per task it runs, the same
 * blocks call after call (n inputs and n outputs in all). */
static int all_to_all_streams(const tcomm *tc, size_t total) {
  size_t n = (size_t)tc->g->n, core, all;
  if (__builtin_mul_overflow(total, worker_tasks(tc), &core) ||
      __builtin_mul_overflow(total, 2 * n, &all))
    return 1;
  return mpu__streams_task(all, core, core);
}

static void task_all_to_all(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  int n = tc->g->n;
  size_t count = (size_t)calls[0].sig.count, es = mpu_dtype_size((mpu_dtype)calls[0].sig.dtype);
  size_t bytes = count * es, total = bytes * (size_t)n, lo = 0, hi = count;
  int stream = all_to_all_streams(tc, total);
  narrow(&lo, &hi, part, parts);
  /* task t: fill rank t's output, block k from rank k's input */
  for (int k = 0; k < n; k++)
    mpu__copy((char *)calls[t].recv + (size_t)k * bytes + lo * es,
              (const char *)calls[k].send + (size_t)t * bytes + lo * es, (hi - lo) * es, stream);
  if (stream) mpu__copy_fence();
}

/* Task t of an uneven collective: member t pulls its own output. Empty
 * blocks are skipped before any pointer arithmetic: their buffers may be
 * NULL. */
static void task_all_gather_v(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  int n = tc->g->n;
  const mpu__call *call = &calls[t];
  size_t es = mpu_dtype_size((mpu_dtype)call->sig.dtype);
  char *recv = call->recv;
  for (int k = 0; k < n; k++)
    if (call->counts[k] && recv + call->displs[k] * es != calls[k].send) /* in place: there */
      mpu__copy(recv + call->displs[k] * es, calls[k].send, call->counts[k] * es, 0);
}

static void task_reduce_scatter_v(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  int n = tc->g->n;
  const mpu__call *call = &calls[t];
  mpu_dtype dt = (mpu_dtype)call->sig.dtype;
  size_t es = mpu_dtype_size(dt), off = 0;
  if (!call->counts[t]) return;
  for (int k = 0; k < t; k++) off += call->counts[k];
  for (int k = 0; k < n; k++) tc->ptrs[k] = (const char *)calls[k].send + off * es;
  mpu__reduce(call->recv, tc->ptrs, n, call->counts[t], dt, (mpu_op)call->sig.op, n);
}

static void task_all_to_all_v(tcomm *tc, const mpu__call *calls, int t, int part, int parts) {
  int n = tc->g->n;
  const mpu__call *call = &calls[t];
  size_t es = mpu_dtype_size((mpu_dtype)call->sig.dtype);
  char *recv = call->recv;
  for (int k = 0; k < n; k++)
    if (call->rcounts[k])
      mpu__copy(recv + call->rdispls[k] * es,
                (const char *)calls[k].send + calls[k].displs[t] * es, call->rcounts[k] * es, 0);
}

/* ---- small calls: every input was staged at the barrier (in the members'
 * boxes or the group's scratch: s); this rank computes its own output from
 * them ---- */

static void small_all_reduce(tcomm *tc, const mpu__call *call, tstaged s) {
  MPU__CALL_ARGS(call);
  int n = tc->g->n;
  for (int k = 0; k < n; k++) tc->ptrs[k] = staged(s, k);
  mpu__reduce(recv, tc->ptrs, n, count, dt, op, n);
}

static void small_all_gather(tcomm *tc, const mpu__call *call, tstaged s) {
  MPU__CALL_ARGS(call);
  int n = tc->g->n, me = tc->me;
  size_t bytes = count * mpu_dtype_size(dt);
  char *out = recv;
  if (!bytes) return;
  for (int k = 0; k < n; k++) /* each rank pulls the staged inputs */
    if (!(k == me && send == out + (size_t)me * bytes)) /* in place: already there */
      memcpy(out + (size_t)k * bytes, staged(s, k), bytes);
}

static void small_reduce_scatter(tcomm *tc, const mpu__call *call, tstaged s) {
  MPU__CALL_ARGS(call);
  int n = tc->g->n, me = tc->me;
  size_t bytes = count * mpu_dtype_size(dt);
  for (int k = 0; k < n; k++) tc->ptrs[k] = staged(s, k) + (size_t)me * bytes;
  mpu__reduce(recv, tc->ptrs, n, count, dt, op, n);
}

static void small_broadcast(tcomm *tc, const mpu__call *call, tstaged s) {
  MPU__CALL_ARGS(call);
  size_t bytes = count * mpu_dtype_size(dt);
  if (tc->me != root && bytes) memcpy(recv, staged(s, root), bytes);
}

static void small_reduce(tcomm *tc, const mpu__call *call, tstaged s) {
  MPU__CALL_ARGS(call);
  int n = tc->g->n;
  if (tc->me != root) return;
  for (int k = 0; k < n; k++) tc->ptrs[k] = staged(s, k);
  mpu__reduce(recv, tc->ptrs, n, count, dt, op, n);
}

static void small_all_to_all(tcomm *tc, const mpu__call *call, tstaged s) {
  MPU__CALL_ARGS(call);
  int n = tc->g->n, me = tc->me;
  size_t bytes = count * mpu_dtype_size(dt);
  for (int k = 0; k < n && bytes; k++)
    memcpy((char *)recv + (size_t)k * bytes, staged(s, k) + (size_t)me * bytes, bytes);
}

/* How the threads backend moves each kind: its tasks (large calls and every
 * non-blocking one), and its small path (NULL: nothing to compute, as a
 * barrier's meeting is the whole call). What a kind reads and writes is the
 * collective table's (collective.h). */
typedef struct tkind {
  void (*task)(tcomm *tc, const mpu__call *calls, int t, int part, int parts);
  void (*small)(tcomm *tc, const mpu__call *call, tstaged s);
} tkind;

static const tkind kinds[MPU_COLL_KINDS] = {
    [MPU_COLL_ALL_REDUCE] = {task_all_reduce, small_all_reduce},
    [MPU_COLL_ALL_GATHER] = {task_all_gather, small_all_gather},
    [MPU_COLL_REDUCE_SCATTER] = {task_reduce_scatter, small_reduce_scatter},
    [MPU_COLL_BROADCAST] = {task_broadcast, small_broadcast},
    [MPU_COLL_REDUCE] = {task_reduce, small_reduce},
    [MPU_COLL_ALL_TO_ALL] = {task_all_to_all, small_all_to_all},
    [MPU_COLL_BARRIER] = {NULL, NULL},
    [MPU_COLL_ALL_GATHER_V] = {task_all_gather_v, NULL},
    [MPU_COLL_REDUCE_SCATTER_V] = {task_reduce_scatter_v, NULL},
    [MPU_COLL_ALL_TO_ALL_V] = {task_all_to_all_v, NULL},
};

void mpu__ttask(tcomm *tc, const mpu__call *calls, int t) {
  void (*task)(tcomm *, const mpu__call *, int, int, int) = kinds[calls[0].sig.kind].task;
  if (task) task(tc, calls, t, 0, 1);
}

/* A large call's parts per task: one per PART_BYTES of a rank's count, at
 * most PARTS_MAX (a claim is one compare-and-swap on a shared line). */
#define PART_BYTES ((size_t)256 << 10)
#define PARTS_MAX 64

static int parts_of(size_t bytes) {
  size_t parts = bytes / PART_BYTES;
  return parts < 1 ? 1 : parts > PARTS_MAX ? PARTS_MAX : (int)parts;
}

/* Claim a part of a task whose unclaimed parts are [lo, hi) in *word (lo <<
 * 32 | hi): the first (its owner) or the last (a rank done with its own).
 * -1 when none is left. */
static int claim(_Atomic uint64_t *word, int last) {
  uint64_t s = atomic_load_explicit(word, memory_order_relaxed);
  for (;;) {
    uint32_t lo = (uint32_t)(s >> 32), hi = (uint32_t)s;
    if (lo >= hi) return -1;
    uint64_t next = last ? s - 1 : s + (UINT64_C(1) << 32);
    if (atomic_compare_exchange_weak_explicit(word, &s, next, memory_order_relaxed,
                                              memory_order_relaxed))
      return (int)(last ? hi - 1 : lo);
  }
}

/* This rank's share of a large call every member has entered: its own
 * tasks, part after part, then (on a crowded machine) the parts of the
 * other workers' tasks that nobody has claimed yet. The call's exit barrier
 * orders every part's writes before any member returns. */
static void run_tasks(tcomm *tc, const mpu__call *calls, int parts) {
  tgroup *g = tc->g;
  int n = g->n, w = workers(tc), part;
  void (*task)(tcomm *, const mpu__call *, int, int, int) = kinds[calls[0].sig.kind].task;
  if (tc->me >= w || !task) return;
  for (int t = tc->me; t < n; t += w)
    while ((part = claim(&g->mem[t].claims, 0)) >= 0) task(tc, calls, t, part, parts);
  if (parts < 2 || !atomic_load_explicit(&g->world->crowded, memory_order_relaxed)) return;
  for (int i = 1; i < n; i++) {
    int t = (tc->me + i) % n;
    if (t % w == tc->me) continue;
    while ((part = claim(&g->mem[t].claims, 1)) >= 0) task(tc, calls, t, part, parts);
  }
}

/* A collective of one count per rank (see the top of the file): a small one
 * stages what this rank contributes (a broadcast: the root alone) and needs
 * the one barrier; a large one publishes its buffers, runs this rank's
 * tasks and meets the others at the exit. */
static mpu_result_t run_even(tcomm *tc, const mpu__call *call) {
  const mpu__coll *row = mpu__coll_of(call->sig.kind);
  tgroup *g = tc->g;
  int p;
  size_t bytes = (size_t)call->sig.count * mpu_dtype_size((mpu_dtype)call->sig.dtype);
  size_t in = bytes * mpu__coll_blocks(row->send_blocks, g->n);
  int small = in <= MPU_THREADS_SCRATCH, boxed = in <= MPU_THREADS_BOX, parts = parts_of(bytes);
  int stages = small && (row->in_place != MPU__IN_PLACE_ONE_BUFFER || tc->me == call->sig.root);
  /* this rank's tasks' parts, all unclaimed: written before the entry
   * barrier, which every claim of this call follows; the last call's claims
   * all came before its exit barrier, which this rank has passed */
  if (!small && tc->me < workers(tc))
    for (int t = tc->me; t < g->n; t += workers(tc))
      atomic_store_explicit(&g->mem[t].claims, (uint64_t)parts, memory_order_relaxed);
  MPU_CHECK(enter(tc, call, !small, call->send, stages ? in : 0, boxed, row->fn, &p));
  if (small) {
    if (kinds[call->sig.kind].small) kinds[call->sig.kind].small(tc, call, staged_at(g, p, boxed));
    return MPU_SUCCESS;
  }
  run_tasks(tc, g->calls[p], parts);
  return leave(tc, row->fn);
}

mpu_result_t mpu__tstart(mpu_comm *c, const mpu__call *call, void **handle) {
  tcomm *tc = c->impl;
  *handle = NULL; /* the threads backend runs every call to its end */
  if (tc->nb_seq != tc->nb_settled) MPU_CHECK(mpu__tsettle(tc, mpu__coll_fn(call->sig.kind)));
  if (mpu__coll_of(call->sig.kind)->listed) return mpu__tuneven(tc, call);
  return run_even(tc, call);
}

/* ---- uneven collectives ------------------------------------------------------------
 * Zero-copy: every member publishes its call, then pulls its own output from
 * the peers' inputs. The count lists are compared in full, not only through
 * the signature's digest, because a mismatch would read past a peer's buffer:
 * every member checks every pair, so all reach the same verdict. */

static mpu_result_t uneven_counts_agree(const tcomm *tc, const mpu__call *calls, const char *fn) {
  const tgroup *g = tc->g;
  int n = g->n;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      const mpu__call *a = &calls[i];
      size_t sent = a->counts[j];
      size_t got = a->sig.kind == MPU_COLL_ALL_TO_ALL_V ? calls[j].rcounts[i] : calls[0].counts[j];
      if (sent != got)
        return mpu__error(MPU_ERR_MISMATCH,
                          "%s: mismatched counts on a communicator of %d ranks: rank %d (world "
                          "%d) says %zu elements for rank %d, rank %d (world %d) says %zu",
                          fn, n, i, g->members[i], sent, j,
                          a->sig.kind == MPU_COLL_ALL_TO_ALL_V ? j : 0,
                          g->members[a->sig.kind == MPU_COLL_ALL_TO_ALL_V ? j : 0], got);
    }
  return MPU_SUCCESS;
}

static mpu_result_t check(const tcomm *tc, const mpu__sig *sigs, size_t stride,
                          const mpu__call *calls, const char *fn) {
  const tgroup *g = tc->g;
  MPU_CHECK(mpu__sig_compare(fn, sigs, stride, g->n, g->members,
                             g->world->check_calls ? MPU__CHECK_ALL : MPU__CHECK_SAFETY));
  if (mpu__coll_of(sigs->kind)->listed) return uneven_counts_agree(tc, calls, fn);
  return MPU_SUCCESS;
}

mpu_result_t mpu__tcheck(const tcomm *tc, const mpu__call *calls, const char *fn) {
  return check(tc, &calls[0].sig, sizeof(mpu__call), calls, fn);
}

mpu_result_t mpu__tuneven(tcomm *tc, const mpu__call *call) {
  int p;
  MPU_CHECK(enter(tc, call, 1, NULL, 0, 0, mpu__coll_fn(call->sig.kind), &p));
  mpu__ttask(tc, g_calls(tc, p), tc->me);
  return leave(tc, mpu__coll_fn(call->sig.kind));
}
