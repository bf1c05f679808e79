/*
 * rendezvous.h - torchrun-style bootstrap without MPI, over a TCPStore
 * (store.h), shared by the backends that start from torchrun's variables
 * (NCCL, gloo): rank 0 puts a small blob (an NCCL unique id) in the store at
 * MASTER_ADDR:MASTER_PORT, the others wait for it and read it. Under torchrun
 * (TORCHELASTIC_USE_AGENT_STORE=True) the store is the elastic agent's;
 * otherwise rank 0 serves one. The communicator keeps its connection: an
 * abort is posted there, and the peers' watch loops see it.
 */
#ifndef MPU_COMM_RENDEZVOUS_H
#define MPU_COMM_RENDEZVOUS_H

#include <stddef.h>

#include "core/error.h"
#include "mpu/result.h"

typedef struct mpu__rendezvous_env {
  const char *who; /* the public call messages name (a static string) */
  int rank, world_size, local_rank, port;
  int agent_store; /* TORCHELASTIC_USE_AGENT_STORE=True: the agent serves the store */
  int attempt;     /* TORCHELASTIC_RESTART_COUNT (0 when unset) */
  char addr[256];
  char job[256];   /* MPU_JOB_KEY, else TORCHELASTIC_RUN_ID, else "" */
} mpu__rendezvous_env;

/* RANK, WORLD_SIZE, LOCAL_RANK (default 0), MASTER_ADDR, MASTER_PORT and
 * the torchrun agent's variables, each checked; a missing or malformed one
 * is an error naming it and who (the public call, e.g.
 * "mpu_comm_gloo_from_env"; a static string, kept in env). */
MPU_SIBLING_API mpu_result_t mpu__rendezvous_read_env(const char *who, mpu__rendezvous_env *env);

typedef struct mpu__rendezvous mpu__rendezvous;

/* Join the job's store: every rank checks the job key (a process of
 * another job is refused), claims its rank once (a second claim of the same
 * rank is refused), then rank 0 publishes blob (len bytes) and the others
 * wait for it and read it into blob. Fails after timeout_s seconds. *out
 * keeps the connection (NULL for a world of one); end it with _leave.
 * A claim needs the job's key: it is made under a name that holds the key
 * and the world size, so only a process of this job can claim rank r; a
 * client of the store without the key (a torch client adding
 * comm<n>/rank<r>, a process of another job) claims nothing this job reads
 * and never locks rank r out. Without MPU_JOB_KEY or TORCHELASTIC_RUN_ID the
 * key is empty, which every client has. */
MPU_SIBLING_API mpu_result_t mpu__rendezvous_join(const mpu__rendezvous_env *env, void *blob, size_t len,
                                  double timeout_s, mpu__rendezvous **out);
MPU_SIBLING_API void mpu__rendezvous_leave(mpu__rendezvous *r);

/* A communicator made over a host communicator (a gloo twin of a threads or
 * MPI world) has its members from the host, not from a rendezvous: its
 * rank 0 serves this process's store (the one from_env serves, if any,
 * else one on a free port), *port, with a key folder of its own, *folder;
 * then every member attaches to it at addr:port (rank 0 with serving set,
 * which holds the store until mpu__rendezvous_leave). */
MPU_SIBLING_API mpu_result_t mpu__rendezvous_serve_any(const char *fn, int *port, char *folder,
                                                       size_t cap);
/* gives back serve_any's hold when rank 0 attaches nothing */
MPU_SIBLING_API void mpu__rendezvous_unserve(void);
MPU_SIBLING_API mpu_result_t mpu__rendezvous_attach(const char *fn, int rank, const char *addr,
                                                    int port, const char *folder, int serving,
                                                    double timeout_s, mpu__rendezvous **out);

/* The out-of-band abort channel of a communicator from the environment, in
 * the shape of nccl_impl's oob hooks (ctx is the mpu__rendezvous):
 * post: tell every peer this rank gave up (why: a short reason); any thread.
 * poll: never blocks and asks the store at most every 100 ms; nonzero once
 * a peer has posted, with its rank (never negative) in *who and its reason
 * in why; a post whose rank cannot be read is not reported.
 * free: mpu__rendezvous_leave. */
MPU_SIBLING_API void mpu__rendezvous_post_abort(void *ctx, int rank, const char *why);
MPU_SIBLING_API int mpu__rendezvous_poll_abort(void *ctx, int *who, char *why, size_t n);
/* The same, asked now (one round trip to the store, up to 1 s), whether
 * reported before or not. */
MPU_SIBLING_API int mpu__rendezvous_check_abort(void *ctx, int *who, char *why, size_t n);
MPU_SIBLING_API void mpu__rendezvous_free(void *ctx);

/* The channel of a communicator split from parent's: a connection of its
 * own to the same store (rank 0's serves while any channel lives), its
 * abort key under parent's, named by name (the same on every member of the
 * split, distinct from its siblings'). */
MPU_SIBLING_API mpu_result_t mpu__rendezvous_child(const mpu__rendezvous *parent, const char *name,
                                   double timeout_s, mpu__rendezvous **out);

/* The channel's connection to the store and the folder of its keys
 * (comm<n>[/<split>...]), for a backend that keeps more there (gloo's
 * addresses). The connection is the channel's: do not close it. */
typedef struct mpu__store mpu__store;
MPU_SIBLING_API mpu__store *mpu__rendezvous_store(const mpu__rendezvous *r);
MPU_SIBLING_API const char *mpu__rendezvous_base(const mpu__rendezvous *r);

#endif
