/*
 * shim.h - the few calls of gloo (C++) the gloo backend uses, as C: a
 * context connected over the rendezvous store (gloo::rendezvous::Context's
 * full mesh on the TCP transport) and its unbound buffers (send and recv by
 * slot, waits with a deadline). Every call catches gloo's exceptions and
 * returns -1 with gloo's message in err; nothing here throws or aborts.
 *
 * Gloo's rules that shape the backend (gloo/transport/tcp/pair.cc,
 * unbound_buffer.cc, as packaged by Debian's libgloo-dev 0.0~git20220518):
 * a send moves its bytes once the peer posted the matching recv (same slot,
 * in order per pair and slot); a recv may be longer than the send, never
 * shorter; a wait that times out closes every connection of the context.
 */
#ifndef MPU_COMM_GLOO_SHIM_H
#define MPU_COMM_GLOO_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpu__gl mpu__gl;         /* a connected context */
typedef struct mpu__gl_buf mpu__gl_buf; /* an unbound buffer of a context */

/* The store gloo's rendezvous reads and writes: 0 or -1 (message in err).
 * get waits for the key up to timeout_s and hands back malloc'd bytes. */
typedef struct mpu__gl_store {
  void *ctx;
  int (*set)(void *ctx, const char *key, const void *v, size_t n, char *err, size_t errn);
  int (*get)(void *ctx, const char *key, void **v, size_t *n, double timeout_s, char *err,
             size_t errn);
} mpu__gl_store;

/* Rank `rank` of `size`: its pairs' addresses through the store, then a
 * connection to every peer, within timeout_s. host: the address (or, with
 * is_iface, the network interface) this process listens on; the process's
 * one TCP device is made with the first context and shared by the others. */
int mpu__gl_connect(const char *host, int is_iface, int rank, int size, const mpu__gl_store *store,
                    double timeout_s, mpu__gl **out, char *err, size_t errn);
/* Close every connection now (any thread): the peers' pending and later
 * operations with this rank fail at once. */
void mpu__gl_close(mpu__gl *g);
void mpu__gl_free(mpu__gl *g);

mpu__gl_buf *mpu__gl_buf_new(mpu__gl *g, void *p, size_t n, char *err, size_t errn);
/* Free b (once its operations completed or failed, or its connections
 * closed, gloo touches it no more), after taking its lock once so that
 * ThreadSanitizer sees the loop thread's last touch come first. */
void mpu__gl_buf_free(mpu__gl_buf *b);
int mpu__gl_send(mpu__gl_buf *b, int peer, uint64_t slot, size_t off, size_t n, char *err,
                 size_t errn);
int mpu__gl_recv(mpu__gl_buf *b, int peer, uint64_t slot, size_t off, size_t n, char *err,
                 size_t errn);
/* One completion of b's recvs (sends), up to timeout_s: 0 with its peer in
 * *peer; 1 when timeout_s passed (gloo has closed the context's connections);
 * -1 on a failed connection (gloo's message in err). */
int mpu__gl_wait_recv(mpu__gl_buf *b, double timeout_s, int *peer, char *err, size_t errn);
int mpu__gl_wait_send(mpu__gl_buf *b, double timeout_s, int *peer, char *err, size_t errn);
/* Make b's waits, now and later, return -1 at once (any thread). */
void mpu__gl_buf_interrupt(mpu__gl_buf *b);
/* Sends of b that completed and were not waited for yet (never blocks). */
int mpu__gl_sends_done(mpu__gl_buf *b);

#ifdef __cplusplus
}
#endif

#endif
