/*
 * sibling_calls.c - a sibling's side of comm/base/sibling.h, compiled into each
 * library and program built beside libmpu that uses its internals (never into
 * libmpu): each mpu__ function they call, as a call through libmpu's table.
 *
 * The table is libmpu's one exported object, named after the version: a
 * sibling loaded with a libmpu of another version fails to load.
 */
#include <stdarg.h>
#include <stdio.h>

#include "comm/base/reduce.h"
#include "comm/services.h"
#include "core/clock.h"
#include "core/env.h"
#include "core/options.h"
#include "comm/base/sibling.h"


/* the last error is public (mpu_fail): no table needed */
mpu_result_t mpu__error(mpu_result_t code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mpu_fail(code, "%s", msg);
}

void mpu__trace(const char *file, int line, mpu_result_t code) { MPU_SIBLING_TABLE.trace(file, line, code); }
double mpu__now(void) { return MPU_SIBLING_TABLE.now(); }
mpu_result_t mpu__take_options(const char *fn, const char *what, const char *init,
                               const void *given, size_t full_size, size_t min_size, void *full) {
  return MPU_SIBLING_TABLE.take_options(fn, what, init, given, full_size, min_size, full);
}
int mpu__env_check_calls(int mode) { return MPU_SIBLING_TABLE.env_check_calls(mode); }
double mpu__env_timeout(double timeout_s) { return MPU_SIBLING_TABLE.env_timeout(timeout_s); }
int mpu__env_timeout_given(void) { return MPU_SIBLING_TABLE.env_timeout_given(); }
long mpu__env_mpi_p2p_check_ranks(void) { return MPU_SIBLING_TABLE.env_mpi_p2p_check_ranks(); }
int mpu__env_nccl_one_rank(void) { return MPU_SIBLING_TABLE.env_nccl_one_rank(); }

void mpu__module_register(const mpu__module *m) { MPU_SIBLING_TABLE.module_register(m); }
mpu_comm *mpu__comm_new(const mpu__comm_ops *ops, int rank, int size, const int *world_ranks,
                        void *impl) {
  return MPU_SIBLING_TABLE.comm_new(ops, rank, size, world_ranks, impl);
}
mpu_result_t mpu__comm_for_host(mpu_comm *comm, const char *fn, mpu_comm **out) {
  return MPU_SIBLING_TABLE.comm_for_host(comm, fn, out);
}
mpu_result_t mpu__recv_mismatch(size_t count, mpu_dtype dt, size_t got_count, mpu_dtype got,
                                int peer) {
  return MPU_SIBLING_TABLE.recv_mismatch(count, dt, got_count, got, peer);
}
mpu_result_t mpu__deliver(void *buf, size_t count, mpu_dtype dt, const void *data,
                          size_t got_count, mpu_dtype got, int peer) {
  return MPU_SIBLING_TABLE.deliver(buf, count, dt, data, got_count, got, peer);
}
void mpu__reduce(void *dst, const void *const *srcs, int n, size_t count, mpu_dtype dtype,
                 mpu_op op, int divisor) {
  MPU_SIBLING_TABLE.reduce(dst, srcs, n, count, dtype, op, divisor);
}
const mpu__coll *mpu__coll_of(int kind) { return MPU_SIBLING_TABLE.coll_of(kind); }
const char *mpu__coll_fn(int kind) { return MPU_SIBLING_TABLE.coll_fn(kind); }
mpu_result_t mpu__sig_compare(const char *fn, const void *sigs, size_t stride, int n,
                              const int *world, mpu__check_level level) {
  return MPU_SIBLING_TABLE.sig_compare(fn, sigs, stride, n, world, level);
}

mpu_result_t mpu__rendezvous_read_env(const char *who, mpu__rendezvous_env *env) {
  return MPU_SIBLING_TABLE.rendezvous_read_env(who, env);
}
mpu_result_t mpu__rendezvous_join(const mpu__rendezvous_env *env, void *blob, size_t len,
                                  double timeout_s, mpu__rendezvous **out) {
  return MPU_SIBLING_TABLE.rendezvous_join(env, blob, len, timeout_s, out);
}
void mpu__rendezvous_leave(mpu__rendezvous *r) { MPU_SIBLING_TABLE.rendezvous_leave(r); }
void mpu__rendezvous_post_abort(void *ctx, int rank, const char *why) {
  MPU_SIBLING_TABLE.rendezvous_post_abort(ctx, rank, why);
}
int mpu__rendezvous_poll_abort(void *ctx, int *who, char *why, size_t n) {
  return MPU_SIBLING_TABLE.rendezvous_poll_abort(ctx, who, why, n);
}
int mpu__rendezvous_check_abort(void *ctx, int *who, char *why, size_t n) {
  return MPU_SIBLING_TABLE.rendezvous_check_abort(ctx, who, why, n);
}
void mpu__rendezvous_free(void *ctx) { MPU_SIBLING_TABLE.rendezvous_free(ctx); }
mpu_result_t mpu__rendezvous_child(const mpu__rendezvous *parent, const char *name,
                                   double timeout_s, mpu__rendezvous **out) {
  return MPU_SIBLING_TABLE.rendezvous_child(parent, name, timeout_s, out);
}
mpu_result_t mpu__rendezvous_serve_any(const char *fn, int *port, char *folder, size_t cap) {
  return MPU_SIBLING_TABLE.rendezvous_serve_any(fn, port, folder, cap);
}
void mpu__rendezvous_unserve(void) { MPU_SIBLING_TABLE.rendezvous_unserve(); }
mpu_result_t mpu__rendezvous_attach(const char *fn, int rank, const char *addr, int port,
                                    const char *folder, int serving, double timeout_s,
                                    mpu__rendezvous **out) {
  return MPU_SIBLING_TABLE.rendezvous_attach(fn, rank, addr, port, folder, serving, timeout_s, out);
}
mpu__store *mpu__rendezvous_store(const mpu__rendezvous *r) {
  return MPU_SIBLING_TABLE.rendezvous_store(r);
}
const char *mpu__rendezvous_base(const mpu__rendezvous *r) {
  return MPU_SIBLING_TABLE.rendezvous_base(r);
}
mpu_result_t mpu__store_connect(const char *who, const char *host, int port, const char *prefix,
                                double timeout_s, mpu__store **out) {
  return MPU_SIBLING_TABLE.store_connect(who, host, port, prefix, timeout_s, out);
}
void mpu__store_close(mpu__store *s) { MPU_SIBLING_TABLE.store_close(s); }
mpu_result_t mpu__store_wait(mpu__store *s, const char *key, double timeout_s) {
  return MPU_SIBLING_TABLE.store_wait(s, key, timeout_s);
}
mpu_result_t mpu__store_set(mpu__store *s, const char *key, const void *v, size_t n,
                            double timeout_s) {
  return MPU_SIBLING_TABLE.store_set(s, key, v, n, timeout_s);
}
mpu_result_t mpu__store_get(mpu__store *s, const char *key, void **v, size_t *n,
                            double timeout_s) {
  return MPU_SIBLING_TABLE.store_get(s, key, v, n, timeout_s);
}

mpu_result_t mpu__input_open(const char *fn, const char *what, const char *path, int *fd,
                             struct stat *st) {
  return MPU_SIBLING_TABLE.input_open(fn, what, path, fd, st);
}
mpu_result_t mpu__output_check(const char *fn, const char *path, const mpu__file_id *inputs,
                               int ninputs) {
  return MPU_SIBLING_TABLE.output_check(fn, path, inputs, ninputs);
}
mpu_result_t mpu__output_write(const char *fn, const char *path, const void *const *parts,
                               const size_t *lens, int nparts, const mpu__file_id *inputs,
                               int ninputs) {
  return MPU_SIBLING_TABLE.output_write(fn, path, parts, lens, nparts, inputs, ninputs);
}
void mpu__jb_string_ex(json_buf *b, const char *s, int script_safe) {
  MPU_SIBLING_TABLE.jb_string_ex(b, s, script_safe);
}
void mpu__jb_free(json_buf *b) { MPU_SIBLING_TABLE.jb_free(b); }
