/*
 * order.h - the test double's stream-order checker.
 *
 * A vector clock per stream and per host thread ("actor"). Every piece of
 * work the host puts on a stream (a copy, a memset, an NCCL call) ticks the
 * stream's own entry; cudaEventRecord captures the stream's clock,
 * cudaStreamWaitEvent merges it into the waiting stream, and host
 * synchronisation (cudaStreamSynchronize, cudaEventSynchronize,
 * cudaDeviceSynchronize, a completed cudaStreamQuery / cudaEventQuery, a
 * blocking cudaMemcpy, cudaFree) merges it into the calling thread's. Work
 * enqueued by a thread carries what that thread has seen. The legacy default
 * stream (NULL, cudaStreamLegacy) is ordered after every blocking stream of
 * its device and they after it; cudaStreamNonBlocking streams are not.
 *
 * Device allocations (cudaMalloc, cudaMallocManaged) remember which actor
 * last wrote each byte range and who read it since. Work that reads memory
 * whose last writer its stream is not ordered after, or writes memory whose
 * last writer or readers it is not ordered after, is a violation: the call
 * is refused (NCCL: ncclInvalidUsage, its message naming both streams;
 * CUDA: cudaErrorIllegalState), counted, and printed. The check is logical,
 * on the clocks, when the work is enqueued: it does not depend on timing.
 * A process that ends with violations no test claimed
 * (double_order_take_violations) exits with status 70.
 *
 * The forgiving switch "order" (switches.h) turns the checks off.
 */
#ifndef MPU_TESTS_NCCL_DOUBLE_ORDER_H
#define MPU_TESTS_NCCL_DOUBLE_ORDER_H

#include <stddef.h>

typedef struct order_actor order_actor; /* a stream's (or host thread's) clock */
typedef struct order_clock order_clock; /* a captured clock (an event's) */

typedef struct double_span {
  const void *p;
  size_t bytes;
} double_span;

/* ---- for cuda.c and collectives.c ------------------------------------------- */

/* A new stream's actor; legacy: the device's legacy default stream. */
order_actor *double_order_stream_new(int device, int blocking, int legacy);
void double_order_stream_gone(order_actor *a);

/* Work on stream a that reads and writes the given spans (what: the call's
 * name). 0, or -1 with the violation in the double's last error (the work must
 * then not be enqueued). */
int double_order_access(order_actor *a, const char *what, const double_span *reads, int nr,
                        const double_span *writes, int nw);

/* An NCCL call's spans from its kind (double.h's K_*), on this rank. */
int double_order_nccl(order_actor *a, int kind, const void *send, void *recv, size_t count,
                      size_t elem, int nranks, int rank, int root);

/* cudaEventRecord: *snap = a's clock. cudaStreamWaitEvent: a after snap. */
void double_order_record(order_actor *a, order_clock **snap);
void double_order_wait(order_actor *a, const order_clock *snap);
void double_order_clock_free(order_clock *snap);

/* Host synchronisation: the calling thread is ordered after a's work (or
 * the captured clock, or every stream of the device). */
void double_order_host_after(order_actor *a);
void double_order_host_after_clock(const order_clock *snap);
void double_order_host_after_device(int device);

void double_order_alloc(const void *p, size_t bytes);
void double_order_free(const void *p);
int double_order_tracked(const void *p); /* 1: inside a device allocation */

/* ---- for tests (exported by libmpu_nccl_double) ----------------------------- */

/* The host wrote [p, p + bytes) (host stores to managed memory, which the
 * double cannot see): checked and recorded as the calling thread's work. */
int double_order_host_write(const void *p, size_t bytes);

/* Violations so far, and the last one's message. */
long double_order_violations(void);
const char *double_order_message(void);

/* A test that provoked violations on purpose claims them (returns how many
 * there were; the count starts again from 0). */
long double_order_take_violations(void);

/* How many times cudaStreamQuery asked about a stream (cuda.c). */
long double_stream_queries(struct CUstream_st *s);

#endif
