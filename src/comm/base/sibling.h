/*
 * sibling.h - the internals libmpu lends to the libraries and the tool built
 * beside it (libmpu_layers, libmpu_mpi, libmpu_nccl, libmpu_gloo, mpu), which
 * must share its state (the backend registry, the environment's settings, the
 * calling thread's last error, the collective table) rather than carry copies
 * of it, and the TCPStore client and rendezvous that NCCL and gloo both start
 * from.
 *
 * libmpu exports its API alone (mpu_ names, the headers under mpu/); every mpu__ function is
 * hidden. A sibling reaches the few it needs through one table, the one
 * symbol libmpu exports beyond its API: comm/base/sibling_calls.c, compiled into
 * each sibling, defines those mpu__ names as calls through it, so the code
 * calling them reads the same in libmpu and in a sibling. The symbol's name
 * carries the version and the table's revision (mpu_sibling_table_0_2_0_r2),
 * so the loader itself refuses a sibling and a libmpu of different versions
 * or layouts, as glibc's GLIBC_PRIVATE does: a change to the table below
 * raises MPU_SIBLING_REVISION. Tests and fuzzers that need other internals link the objects
 * (mpu_objects) instead of libmpu.
 */
#ifndef MPU_COMM_BASE_SIBLING_H
#define MPU_COMM_BASE_SIBLING_H

#include <stddef.h>
#include <sys/stat.h>

#include "checkpoint/json.h"
#include "comm/base/collective.h"
#include "comm/base/module.h"
#include "comm/comm_internal.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/files.h"

typedef struct mpu__sibling_table {
  /* core */
  void (*trace)(const char *file, int line, mpu_result_t code);
  double (*now)(void);
  mpu_result_t (*take_options)(const char *fn, const char *what, const char *init,
                               const void *given, size_t full_size, size_t min_size, void *full);
  int (*env_check_calls)(int mode);
  double (*env_timeout)(double timeout_s);
  int (*env_timeout_given)(void);
  long (*env_mpi_p2p_check_ranks)(void);
  int (*env_nccl_one_rank)(void);
  /* the communicator's base, for the backend libraries and the layers */
  void (*module_register)(const mpu__module *m);
  mpu_comm *(*comm_new)(const mpu__comm_ops *ops, int rank, int size, const int *world_ranks,
                        void *impl);
  mpu_result_t (*comm_for_host)(mpu_comm *comm, const char *fn, mpu_comm **out);
  mpu_result_t (*recv_mismatch)(size_t count, mpu_dtype dt, size_t got_count, mpu_dtype got,
                                int peer);
  mpu_result_t (*deliver)(void *buf, size_t count, mpu_dtype dt, const void *data,
                          size_t got_count, mpu_dtype got, int peer);
  void (*reduce)(void *dst, const void *const *srcs, int n, size_t count, mpu_dtype dtype,
                 mpu_op op, int divisor);
  const mpu__coll *(*coll_of)(int kind);
  const char *(*coll_fn)(int kind);
  mpu_result_t (*sig_compare)(const char *fn, const void *sigs, size_t stride, int n,
                              const int *world, mpu__check_level level);
  /* torchrun's rendezvous over the TCPStore, for the NCCL and gloo backends */
  mpu_result_t (*rendezvous_read_env)(const char *who, mpu__rendezvous_env *env);
  mpu_result_t (*rendezvous_join)(const mpu__rendezvous_env *env, void *blob, size_t len,
                                  double timeout_s, mpu__rendezvous **out);
  void (*rendezvous_leave)(mpu__rendezvous *r);
  void (*rendezvous_post_abort)(void *ctx, int rank, const char *why);
  int (*rendezvous_poll_abort)(void *ctx, int *who, char *why, size_t n);
  int (*rendezvous_check_abort)(void *ctx, int *who, char *why, size_t n);
  void (*rendezvous_free)(void *ctx);
  mpu_result_t (*rendezvous_child)(const mpu__rendezvous *parent, const char *name,
                                   double timeout_s, mpu__rendezvous **out);
  mpu__store *(*rendezvous_store)(const mpu__rendezvous *r);
  mpu_result_t (*rendezvous_serve_any)(const char *fn, int *port, char *folder, size_t cap);
  void (*rendezvous_unserve)(void);
  mpu_result_t (*rendezvous_attach)(const char *fn, int rank, const char *addr, int port,
                                    const char *folder, int serving, double timeout_s,
                                    mpu__rendezvous **out);
  const char *(*rendezvous_base)(const mpu__rendezvous *r);
  /* the TCPStore client (gloo keeps its addresses there) */
  mpu_result_t (*store_connect)(const char *who, const char *host, int port, const char *prefix,
                                double timeout_s, mpu__store **out);
  void (*store_close)(mpu__store *s);
  mpu_result_t (*store_wait)(mpu__store *s, const char *key, double timeout_s);
  mpu_result_t (*store_set)(mpu__store *s, const char *key, const void *v, size_t n,
                            double timeout_s);
  mpu_result_t (*store_get)(mpu__store *s, const char *key, void **v, size_t *n,
                            double timeout_s);
  /* files and JSON, for the tool */
  mpu_result_t (*input_open)(const char *fn, const char *what, const char *path, int *fd,
                             struct stat *st);
  mpu_result_t (*output_check)(const char *fn, const char *path, const mpu__file_id *inputs,
                               int ninputs);
  mpu_result_t (*output_write)(const char *fn, const char *path, const void *const *parts,
                               const size_t *lens, int nparts, const mpu__file_id *inputs,
                               int ninputs);
  void (*jb_string_ex)(json_buf *b, const char *s, int script_safe);
  void (*jb_free)(json_buf *b);
} mpu__sibling_table;

/* the table's layout: raised whenever a field above is added, removed or changed */
#define MPU_SIBLING_REVISION 2

#define MPU_SIBLING_TABLE_(a, b, c, r) mpu_sibling_table_##a##_##b##_##c##_r##r
#define MPU_SIBLING_TABLE_X(a, b, c, r) MPU_SIBLING_TABLE_(a, b, c, r)
#define MPU_SIBLING_TABLE                                                                    \
  MPU_SIBLING_TABLE_X(MPU_VERSION_MAJOR, MPU_VERSION_MINOR, MPU_VERSION_PATCH,               \
                      MPU_SIBLING_REVISION)

MPU_API extern const mpu__sibling_table MPU_SIBLING_TABLE;

#endif
