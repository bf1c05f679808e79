/*
 * mpu/comm.h - communicators and collectives, one interface for every backend.
 *
 * A communicator (mpu_comm) is one rank's handle on a group of ranks. Every
 * call below is made by each member with matching arguments, as in MPI and
 * NCCL, and blocks until this rank's part is done. Backends:
 *
 *   threads  ranks are threads of one process (mpu_launch); data moves through
 *            shared memory. The embedded default.
 *   fake     this process pretends to be rank R of W (mpu_comm_fake_create); no
 *            data moves: collectives over more than one rank succeed and leave
 *            outputs as they are; a communicator of one rank behaves exactly.
 *
 * Buffers: counts are in elements of `dtype`. A buffer may be NULL only when
 * its count is 0, and must be aligned to the element size (a float32 buffer
 * to 4 bytes); a misaligned one is refused with MPU_ERR_INVALID_ARGUMENT. Collectives are out of place unless the in-place form named
 * at each call is used; any other overlap of input and output is rejected.
 *
 * Threads: a handle belongs to one rank and is used by one thread at a time
 * (mpu_comm_abort excepted); different handles may be used concurrently.
 *
 * Failures: every call returns MPU_SUCCESS or an error code with a message in
 * mpu_last_error(). A rank that aborts, fails or exits while others wait for it
 * makes their calls fail with MPU_ERR_ABORTED naming it; a wait longer than the
 * timeout fails with MPU_ERR_TIMEOUT naming the ranks that never came. After
 * such a failure the communicator is broken: later calls on it fail at once.
 */
#ifndef MPU_COMM_H
#define MPU_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/result.h"
#include "mpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpu_comm mpu_comm;
typedef struct mpu_request mpu_request;

typedef enum mpu_op {
  MPU_SUM = 0,
  MPU_PROD,
  MPU_MIN,
  MPU_MAX,
  MPU_AVG, /* sum / size; integers divide with truncation toward zero */
  MPU_OP_COUNT
} mpu_op;

/* "sum", "prod", "min", "max", "avg"; "invalid" otherwise. */
MPU_API const char *mpu_op_name(mpu_op op);
MPU_API mpu_result_t mpu_op_from_name(const char *name, mpu_op *out);

/* Call checking: before any byte moves, the ranks of a collective agree that
 * they all made the same call (collective, count, dtype, op, root), and a
 * mismatch fails on every rank with MPU_ERR_MISMATCH naming the differing
 * ranks (like TORCH_DISTRIBUTED_DEBUG=DETAIL). Free on the threads backend;
 * on MPI each call's signature travels in one small all_gather that also
 * carries an 8-byte call's input (docs/mpi.md). */
enum {
  MPU_CHECKS_DEFAULT = 0, /* MPU_CHECK_CALLS decides; on unless it is 0 */
  MPU_CHECKS_ON = 1,
  MPU_CHECKS_OFF = -1, /* threads: collective, count and dtype are still compared
                          (free, and memory safety needs them); MPI: none, and
                          collectives have no timeout: raw MPI speed */
};

/* The collectives, one list for the calls below, the call checks' messages
 * and mpu bench. The first MPU_COLL_COUNT take one count per rank (mpu bench
 * measures those); the uneven ones take counts per rank. */
typedef enum mpu_collective {
  MPU_COLL_ALL_REDUCE = 0,
  MPU_COLL_ALL_GATHER,
  MPU_COLL_REDUCE_SCATTER,
  MPU_COLL_BROADCAST,
  MPU_COLL_REDUCE,
  MPU_COLL_ALL_TO_ALL,
  MPU_COLL_BARRIER,
  MPU_COLL_ALL_GATHER_V,
  MPU_COLL_REDUCE_SCATTER_V,
  MPU_COLL_ALL_TO_ALL_V,
  MPU_COLL_KINDS /* how many there are */
} mpu_collective;

/* the collectives of one count per rank: MPU_COLL_ALL_REDUCE .. MPU_COLL_ALL_TO_ALL */
#define MPU_COLL_COUNT MPU_COLL_BARRIER

/* "all_reduce", ..., "all_to_all_v"; "invalid" otherwise. */
MPU_API const char *mpu_collective_name(mpu_collective c);
MPU_API mpu_result_t mpu_collective_from_name(const char *name, mpu_collective *out);

/* Color for mpu_comm_split meaning "not in any new communicator". */
#define MPU_COMM_SPLIT_NOCOLOR (-1)

/* ---- the threads backend ------------------------------------------------- */

/* Options of a threads world. Always start from MPU_LAUNCH_OPTIONS_INIT so a
 * later version can add fields. */
typedef struct mpu_launch_options {
  size_t size;          /* sizeof(mpu_launch_options), set by the initializer */
  double timeout_s;     /* every wait fails after this long; <= 0: MPU_TIMEOUT or 300 s */
  int check_calls;      /* MPU_CHECKS_DEFAULT, _ON or _OFF (see above) */
  long spin;            /* busy-wait iterations before sleeping; -1: automatic */
  int workers;          /* ranks that move data at once in a large collective;
                           0: as many as there are online CPUs */
} mpu_launch_options;

#define MPU_LAUNCH_OPTIONS_INIT {sizeof(mpu_launch_options), 0.0, 0, -1, 0}
/* The first version's size: older programs are accepted, newer fields default. */
#define MPU_LAUNCH_OPTIONS_MIN_SIZE sizeof(mpu_launch_options)

/* The function each rank runs. `world` spans all nranks; it is owned by the
 * launcher and stays valid until fn returns (do not destroy it). */
typedef mpu_result_t (*mpu_rank_fn)(mpu_comm *world, void *arg);

/* The most ranks one mpu_launch runs. */
#define MPU_LAUNCH_MAX_RANKS 4096

/*
 * Run fn on nranks threads of this process, each with its own world
 * communicator, and wait for all of them. results (nranks entries, or NULL)
 * receives each rank's return value. Returns MPU_SUCCESS when every rank
 * succeeded; otherwise the failure of the rank that failed first in time (not
 * its victims, which fail with MPU_ERR_ABORTED after it), whose own message is
 * then this thread's last error. A rank that returns before its peers are
 * done with it makes their pending and later calls on communicators that
 * include it fail; a rank that returns an error or aborts fails every pending
 * and later call in the world. A rank that returns inside an open
 * mpu_group_start bracket has failed (MPU_ERR_INVALID_USAGE): the calls it
 * posted there never run and are freed. options may be NULL.
 */
MPU_API mpu_result_t mpu_launch(int nranks, mpu_rank_fn fn, void *arg, mpu_result_t *results,
                                const mpu_launch_options *options);

/* ---- the fake backend ---------------------------------------------------- */

/* A world communicator in which this process is rank `rank` of `size`
 * (size >= 1, up to INT32_MAX). Free it with mpu_comm_destroy. */
MPU_API mpu_result_t mpu_comm_fake_create(int rank, int size, mpu_comm **out);

/* ---- the MPI backend ------------------------------------------------------ */

/* 1 if the MPI backend can be used, else 0 with mpu_last_error() saying what
 * is missing. The backend is its own library, libmpu_mpi (docs/design.md):
 * linked by the program, or loaded here on first use. The calls below need
 * no <mpi.h>; without the backend they fail with MPU_ERR_UNSUPPORTED.
 * mpu/comm_mpi.h adds mpu_comm_from_mpi for a caller's own MPI_Comm (link
 * libmpu_mpi: pkg-config mpu-mpi, or CMake's mpu::mpi). */
MPU_API int mpu_mpi_available(void);

/* Options of an MPI communicator. Start from MPU_MPI_OPTIONS_INIT. */
typedef struct mpu_mpi_options {
  size_t size;       /* sizeof(mpu_mpi_options), set by the initializer */
  double timeout_s;  /* checked calls and recv fail after this long; <= 0: MPU_TIMEOUT if
                        set, else none (blocking MPI calls, as raw MPI); INFINITY: none */
  int check_calls;   /* MPU_CHECKS_DEFAULT, _ON or _OFF */
} mpu_mpi_options;

#define MPU_MPI_OPTIONS_INIT {sizeof(mpu_mpi_options), 0.0, MPU_CHECKS_DEFAULT}
#define MPU_MPI_OPTIONS_MIN_SIZE sizeof(mpu_mpi_options)

/* Initialise MPI unless the caller already has (then its thread level must be
 * at least MPI_THREAD_FUNNELED), and give a communicator over (a duplicate
 * of) MPI_COMM_WORLD. argc/argv may be NULL. options may be NULL. */
MPU_API mpu_result_t mpu_comm_mpi_world(int *argc, char ***argv, mpu_comm **out);
MPU_API mpu_result_t mpu_comm_mpi_world_ex(int *argc, char ***argv,
                                           const mpu_mpi_options *options, mpu_comm **out);

/* Finalize MPI if mpu_comm_mpi_world initialised it (destroy the
 * communicators first). Frees what timed-out calls left with MPI. */
MPU_API mpu_result_t mpu_mpi_finalize(void);

/* ---- the NCCL backend ------------------------------------------------------ */

/* 1 if the NCCL backend can be used, else 0 with mpu_last_error() saying
 * what is missing. The backend is its own library, libmpu_nccl (it needs the
 * CUDA runtime and NCCL): linked by the program, or loaded here on first use.
 * The calls below need no CUDA header; without the backend they fail with
 * MPU_ERR_UNSUPPORTED. docs/gpu.md has a whole program. */
MPU_API int mpu_nccl_available(void);

typedef struct mpu_nccl_options {
  size_t size;      /* sizeof(mpu_nccl_options), set by the initializer */
  int device;       /* this rank's CUDA device; -1: the local rank modulo the GPUs */
  void *stream;     /* a cudaStream_t to run the work on, as mpu_comm_set_stream; NULL: the
                       communicator makes one, ordered after the legacy default stream */
  double timeout_s; /* the watchdog: waits fail (and NCCL aborts) after this; <= 0: MPU_TIMEOUT */
  int keep_host;    /* 1: keep the host communicator as the twin (default); 0: do not
                       (groups then come from ncclCommSplit, as from the environment) */
  int share_resources; /* 1: its splits share NCCL resources with it (NCCL's splitShare: one
                          abort flag, and one device stream per rank on which the groups' work
                          runs in issue order); 0 (default): every group its own (docs/gpu.md) */
  int one_rank_through_nccl; /* 1: a communicator of one rank (its splits too) calls NCCL, so
                                one GPU runs NCCL's kernels; 0: MPU_NCCL_ONE_RANK decides */
} mpu_nccl_options;

#define MPU_NCCL_OPTIONS_INIT {sizeof(mpu_nccl_options), -1, NULL, 0.0, 1, 0, 0}
/* the size before share_resources: older callers' options are still taken */
#define MPU_NCCL_OPTIONS_MIN_SIZE offsetof(mpu_nccl_options, share_resources)

/*
 * An NCCL communicator over the same ranks as host (collective over host: a
 * threads world, one GPU per thread, or an MPI communicator, one GPU per
 * process). host stays the NCCL communicator's host twin, for groups and for
 * CPU-side work; it must outlive it. Buffers of its calls are device memory
 * (mpu_comm_mem_alloc). options may be NULL.
 */
MPU_API mpu_result_t mpu_comm_nccl_create(mpu_comm *host, const mpu_nccl_options *options,
                                          mpu_comm **out);

/* The same without a host backend, from torchrun's RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR and MASTER_PORT, through a TCPStore: torchrun's agent
 * store (TORCHELASTIC_USE_AGENT_STORE=True) or one rank 0 serves (docs/gpu.md).
 * Groups: mpu_comm_split (ncclCommSplit); create_group needs a host twin.
 * Each rank claims its RANK once in the store, and a claim needs the job key
 * (MPU_JOB_KEY, else TORCHELASTIC_RUN_ID, with WORLD_SIZE): a second process
 * of the job with the same RANK is refused (MPU_ERR_INVALID_USAGE), a process
 * with another key is refused before it claims anything, and a store client
 * without the key (writing the store's keys itself) cannot claim a rank of
 * the job, so it never locks the real rank out. */
MPU_API mpu_result_t mpu_comm_nccl_from_env(const mpu_nccl_options *options, mpu_comm **out);

/* The host twin of an NCCL communicator (same members, host memory). */
MPU_API mpu_result_t mpu_comm_host_twin(const mpu_comm *comm, mpu_comm **host);

/*
 * The ncclComm_t of an NCCL communicator, for NCCL calls mpu does not wrap
 * (a C/CUDA trainer's own ncclAllReduce on a group, as llm.c makes). mpu owns
 * it: never ncclCommDestroy, ncclCommAbort or ncclCommFinalize it (end it with
 * mpu_comm_destroy / mpu_comm_abort); it is valid until then. Calls the
 * caller enqueues on it are ordered with mpu's calls only through the stream
 * they are enqueued on: enqueue them on mpu_comm_stream's stream (or order
 * the streams with events) so they run in the same order on every rank.
 * It is a blocking NCCL communicator (config.blocking = 1; creation keeps its
 * deadline through a non-blocking handle it is split from, docs/gpu.md): a
 * raw call returns ncclSuccess once enqueued, never ncclInProgress.
 * MPU_ERR_UNSUPPORTED for other backends; a broken communicator (aborted,
 * timed out) gives its error, as its handle may be gone. *nccl_comm is NULL
 * on failure.
 */
MPU_API mpu_result_t mpu_comm_nccl_handle(const mpu_comm *comm, void **nccl_comm);

/* ---- the gloo backend ------------------------------------------------------ */

/* 1 if the gloo backend can be used, else 0 with mpu_last_error() saying
 * what is missing. The backend is its own library, libmpu_gloo (it needs
 * gloo, Debian's libgloo-dev): linked by the program, or loaded here on first
 * use. Host memory, many processes on one host or many, as torch's
 * ProcessGroupGloo (docs/gloo.md). */
MPU_API int mpu_gloo_available(void);

typedef struct mpu_gloo_options {
  size_t size;      /* sizeof(mpu_gloo_options), set by the initializer */
  double timeout_s; /* every wait fails after this long; <= 0: MPU_TIMEOUT or 300 s */
  int check_calls;  /* MPU_CHECKS_DEFAULT, _ON or _OFF: the ranks compare each call's
                       signature first (one small message to every peer; an 8-byte
                       all_reduce travels in it); off: no comparison and no naming of
                       the ranks that never came, data only */
} mpu_gloo_options;

#define MPU_GLOO_OPTIONS_INIT {sizeof(mpu_gloo_options), 0.0, MPU_CHECKS_DEFAULT}
#define MPU_GLOO_OPTIONS_MIN_SIZE sizeof(mpu_gloo_options)

/* A gloo communicator of every process of the job, from torchrun's RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT through a TCPStore:
 * torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) or one rank 0
 * serves; the same rendezvous, job key and rank claims as
 * mpu_comm_nccl_from_env. Gloo listens on GLOO_SOCKET_IFNAME's interface
 * when it is set (as torch's), else on 127.0.0.1 when MASTER_ADDR is this
 * host's loopback, else on this host's name. Groups: mpu_comm_create_group
 * and mpu_comm_split, among their members only. mpu_comm_abort tells the
 * peers through the store and closes this rank's connections: their pending
 * and later calls fail with MPU_ERR_ABORTED naming it. options may be NULL. */
MPU_API mpu_result_t mpu_comm_gloo_from_env(const mpu_gloo_options *options, mpu_comm **out);

/* A gloo communicator over the ranks of host (collective over host: a threads world,
 * one rank per thread, or an MPI communicator, one rank per process), as
 * mpu_comm_nccl_create makes an NCCL twin: host's rank 0 serves the store
 * its peers meet through (its process's, if it serves one already), gloo
 * listens on the loopback when every member is on one host, else as above.
 * host need not outlive it. options may be NULL. */
MPU_API mpu_result_t mpu_comm_gloo_create(mpu_comm *host, const mpu_gloo_options *options,
                                          mpu_comm **out);

/* ---- facts about a communicator ----------------------------------------- */

MPU_API mpu_result_t mpu_comm_rank(const mpu_comm *comm, int *rank);
MPU_API mpu_result_t mpu_comm_size(const mpu_comm *comm, int *size);

/* The rank in the backend's world of member `rank` of comm. */
MPU_API mpu_result_t mpu_comm_world_rank(const mpu_comm *comm, int rank, int *world_rank);

/* "threads", "fake", ...; "invalid" for a bad handle. */
MPU_API const char *mpu_comm_backend(const mpu_comm *comm);

/* ---- memory, streams and what a backend can do ------------------------------ */

typedef enum mpu_memory {
  MPU_MEMORY_HOST = 0, /* buffers are host memory */
  MPU_MEMORY_DEVICE,   /* buffers are device (GPU) memory */
} mpu_memory;

typedef struct mpu_comm_caps {
  size_t size;            /* sizeof(mpu_comm_caps): set it before the call */
  mpu_memory memory;      /* the buffers this communicator's calls take */
  int streams;            /* work is ordered on a stream (mpu_comm_stream) */
  int native_nonblocking; /* requests progress without being waited for */
  int fault_detection;    /* an absent or dead peer ends in an error, not a hang */
  int call_checking;      /* mismatched calls are caught, now (checking on) */
  int exact_reductions;   /* results follow docs/api.md's rule bit for bit */
  int moves_data;         /* collectives over several ranks move data (0: the fake backend,
                             whose ranks cannot see each other's inputs) */
  int described_groups;   /* groups of a layout can be made from their description, without
                             listing members (the fake backend's huge worlds) */
  int groups_by_split;    /* groups come only from mpu_comm_split, collective over all ranks
                             (an NCCL world from the environment, without a host twin) */
  int device;             /* the device this rank's buffers live on; -1 for host memory */
  int nan_propagates;     /* float min/max give NaN when any input is NaN (docs/api.md's rule);
                             0: a NaN loses to a number (NCCL's fminf/fmaxf) */
  int exact_int_avg;      /* integer avg divides the exact sum (docs/api.md's rule); 0: the
                             sum wraps in the element type first (NCCL's) */
} mpu_comm_caps;

MPU_API mpu_result_t mpu_comm_capabilities(const mpu_comm *comm, mpu_comm_caps *caps);

/* The stream the communicator's work runs on (a cudaStream_t for NCCL);
 * NULL on host backends.
 *
 * NCCL, by default: a stream of the communicator's own (non-blocking), and
 * before every call an event recorded on the legacy default stream
 * (cudaStreamLegacy, where a plain C/CUDA program's kernels run) that this
 * stream waits for (PyTorch's ProcessGroupNCCL does the same with the
 * current stream), so buffers written by the caller's earlier kernels on the
 * default stream are safe. Kernels on other streams must be ordered by the
 * caller (an event) or the host (a synchronisation) before the call.
 *
 * set_stream(comm, stream): from now on the work runs on `stream` itself, in
 * its order, with no event of mpu's: the caller's earlier work on it comes
 * first and its later work after, and ordering against other streams is the
 * caller's. The work issued so far is waited for first. NULL: back to the
 * default (a new stream of the communicator's own). Run the legacy default
 * stream itself with cudaStreamLegacy.
 *
 * Either way a blocking call returns after the host waited for it (an event
 * recorded after the call, never the whole stream), so its results are
 * visible to the host and to any work launched afterwards on any stream. A
 * non-blocking call's results are visible after mpu_request_wait or a
 * completed mpu_request_test, to later work on `stream` after
 * mpu_request_stream_wait(req, stream), and, in the set_stream mode, to
 * later work on the communicator's stream at once.
 * set_stream: MPU_ERR_UNSUPPORTED on host backends. */
MPU_API mpu_result_t mpu_comm_stream(const mpu_comm *comm, void **stream);
MPU_API mpu_result_t mpu_comm_set_stream(mpu_comm *comm, void *stream);

/* Memory of the communicator's kind (host or device), and copies within it,
 * ordered with its calls. The regions use these, so they run unchanged on
 * device buffers. copy2d: height rows of width bytes, pitches in bytes; the
 * destination's and the source's spans must not overlap (as in
 * mpu_tensor_split/concat). mem_free takes only what mem_alloc handed out,
 * once: anything else is MPU_ERR_INVALID_ARGUMENT. */
MPU_API mpu_result_t mpu_comm_mem_alloc(mpu_comm *comm, size_t bytes, void **out);
MPU_API mpu_result_t mpu_comm_mem_free(mpu_comm *comm, void *p);
MPU_API mpu_result_t mpu_comm_copy2d(mpu_comm *comm, void *dst, size_t dpitch, const void *src,
                                     size_t spitch, size_t width, size_t height);

/* ---- collectives ---------------------------------------------------------- */

/* recv[i] = op over ranks of send[i], count elements. In place: send == recv.
 * float16/bfloat16 are reduced in float32 and rounded once. */
MPU_API mpu_result_t mpu_comm_all_reduce(mpu_comm *comm, const void *send, void *recv,
                                         size_t count, mpu_dtype dtype, mpu_op op);

/* recv = concatenation over ranks of send (count elements each); recv holds
 * count * size. In place: send == recv + rank * count elements. */
MPU_API mpu_result_t mpu_comm_all_gather(mpu_comm *comm, const void *send, void *recv,
                                         size_t count, mpu_dtype dtype);

/* send holds count * size elements; this rank gets block `rank` of the
 * reduction. In place: recv == send + rank * count elements. */
MPU_API mpu_result_t mpu_comm_reduce_scatter(mpu_comm *comm, const void *send, void *recv,
                                             size_t count, mpu_dtype dtype, mpu_op op);

/* buf at root is copied to buf at every rank. */
MPU_API mpu_result_t mpu_comm_broadcast(mpu_comm *comm, void *buf, size_t count,
                                        mpu_dtype dtype, int root);

/* The reduction lands in recv at root only; recv may be NULL elsewhere.
 * In place at root: send == recv. */
MPU_API mpu_result_t mpu_comm_reduce(mpu_comm *comm, const void *send, void *recv, size_t count,
                                     mpu_dtype dtype, mpu_op op, int root);

/* Block j of send (count elements) goes to rank j; block i of recv comes from
 * rank i. send and recv hold count * size elements and must not overlap. */
MPU_API mpu_result_t mpu_comm_all_to_all(mpu_comm *comm, const void *send, void *recv,
                                         size_t count, mpu_dtype dtype);

MPU_API mpu_result_t mpu_comm_barrier(mpu_comm *comm);

/* ---- uneven collectives ----------------------------------------------------
 * Counts per rank, in elements, which may differ and may be 0 (MPI's
 * Allgatherv, Reduce_scatter and Alltoallv; torch's all_to_all_single with
 * split sizes): MoE token dispatch, shards of any size. Every rank passes the
 * same counts (all_to_all_v: what rank i sends to j is what j receives from
 * i); checking compares them across ranks. Displacements (element offsets)
 * may be NULL: blocks then follow each other in rank order. The blocks of
 * one buffer must not overlap; send and recv must not overlap (all_gather_v
 * in place excepted: send == recv + displs[rank] elements). NCCL has no such
 * calls: there they are grouped sends and receives (reduces for
 * reduce_scatter_v). */

/* recv gets counts[k] elements from rank k at displs[k]; this rank sends its
 * counts[rank] elements from send. */
MPU_API mpu_result_t mpu_comm_all_gather_v(mpu_comm *comm, const void *send, void *recv,
                                           const size_t *counts, const size_t *displs,
                                           mpu_dtype dtype);

/* send holds the blocks of every rank, counts[k] elements for rank k, one
 * after the other; recv gets the reduction of this rank's block
 * (counts[rank] elements). */
MPU_API mpu_result_t mpu_comm_reduce_scatter_v(mpu_comm *comm, const void *send, void *recv,
                                               const size_t *counts, mpu_dtype dtype, mpu_op op);

/* send_counts[j] elements at send_displs[j] go to rank j; recv_counts[i]
 * elements from rank i land at recv_displs[i]. */
MPU_API mpu_result_t mpu_comm_all_to_all_v(mpu_comm *comm, const void *send,
                                           const size_t *send_counts, const size_t *send_displs,
                                           void *recv, const size_t *recv_counts,
                                           const size_t *recv_displs, mpu_dtype dtype);

/* Point to point, for pipeline stages. Messages from one rank to another on
 * one communicator arrive in the order sent. send returns once the data is
 * copied out (it does not wait for the matching recv); recv blocks until a
 * message from peer arrives, and fails with MPU_ERR_MISMATCH if its count or
 * dtype differs (the message is then dropped). On NCCL a send is NCCL's: it
 * completes when the peer receives, and sizes are not checked. */
MPU_API mpu_result_t mpu_comm_send(mpu_comm *comm, const void *buf, size_t count,
                                   mpu_dtype dtype, int peer);
MPU_API mpu_result_t mpu_comm_recv(mpu_comm *comm, void *buf, size_t count, mpu_dtype dtype,
                                   int peer);

/* Send sendcount elements to dst and receive recvcount from src as one step
 * (a ring shift, a pipeline exchange). On NCCL, whose send completes only
 * when the peer receives, the two are one group, so ranks that all send
 * first do not wait on each other; elsewhere it is send, then recv. */
MPU_API mpu_result_t mpu_comm_sendrecv(mpu_comm *comm, const void *sendbuf, size_t sendcount,
                                       int dst, void *recvbuf, size_t recvcount, int src,
                                       mpu_dtype dtype);

/* ---- the communication clock -------------------------------------------------- */

/* The calling thread's time inside mpu's communication calls (blocking
 * collectives, send, recv, sendrecv, and waiting on or testing requests), and
 * how many: what a profile's communication share is made of. A rank of the
 * threads backend is a thread, an MPI rank a process. Set-up calls
 * (create_group, split) are not counted. */
MPU_API void mpu_comm_clock(double *seconds, uint64_t *calls);
MPU_API void mpu_comm_clock_reset(void);

/* ---- non-blocking collectives ---------------------------------------------- */

/*
 * The same collectives, started without waiting (MPI's I-collectives, torch's
 * async_op=True). *req is set on success; the buffers belong to the call
 * until its request completes. Every member issues a communicator's calls,
 * blocking and non-blocking, in the same order, and they happen in that
 * order whatever order the requests are waited in.
 *
 * Where calls progress without a wait (threads: a call runs when its last
 * member starts it, that member's start moving the data; NCCL: enqueued on
 * the stream; fake: nothing moves, a call is done at once), a member that
 * started a call computes while it runs, and requests may be waited for in
 * any order, on one communicator or several. On MPI a call starts at issue
 * (MPI's I-calls) and every wait, test, recv or checked call of the process
 * moves the pending ones on, so waits may come in any order there too (a
 * rank inside an unchecked blocking MPI call starts nothing meanwhile). A
 * blocking call sees the results of the
 * non-blocking calls issued before it on its communicator. A request is
 * completed and freed by mpu_request_wait, by mpu_request_test when it sets
 * *done, or handed over by mpu_request_free; its result is the call's.
 *
 * Buffers (MPI's rule): from the start until the request completes the call
 * owns them: the caller must not write its inputs nor read or write its
 * outputs (peers may read the inputs in place), and mpu never touches them
 * after the call completed.
 *
 * A peer that dies (aborts, fails, exits or destroys its handle) or never
 * comes: every outstanding request of the communicator ends, in whatever
 * order they are waited for. A call the dead peer had not started fails
 * with MPU_ERR_ABORTED naming it, as soon as a wait or test looks (a wait
 * for a later request fails the earlier ones too, since calls complete in
 * order); one every member had started still completes. A call some live
 * member never started fails with MPU_ERR_TIMEOUT naming the missing ranks
 * when a mpu_request_wait passes the communicator's timeout, which ends
 * every earlier such call of the communicator at the same deadline. Each of
 * those requests then returns its own call's failure when waited for or
 * tested (MPU_ERR_ABORTED or MPU_ERR_TIMEOUT), never success, never a hang.
 */
MPU_API mpu_result_t mpu_comm_iall_reduce(mpu_comm *comm, const void *send, void *recv,
                                          size_t count, mpu_dtype dtype, mpu_op op,
                                          mpu_request **req);
MPU_API mpu_result_t mpu_comm_iall_gather(mpu_comm *comm, const void *send, void *recv,
                                          size_t count, mpu_dtype dtype, mpu_request **req);
MPU_API mpu_result_t mpu_comm_ireduce_scatter(mpu_comm *comm, const void *send, void *recv,
                                              size_t count, mpu_dtype dtype, mpu_op op,
                                              mpu_request **req);
MPU_API mpu_result_t mpu_comm_ibroadcast(mpu_comm *comm, void *buf, size_t count,
                                         mpu_dtype dtype, int root, mpu_request **req);
MPU_API mpu_result_t mpu_comm_ireduce(mpu_comm *comm, const void *send, void *recv, size_t count,
                                      mpu_dtype dtype, mpu_op op, int root, mpu_request **req);
MPU_API mpu_result_t mpu_comm_iall_to_all(mpu_comm *comm, const void *send, void *recv,
                                          size_t count, mpu_dtype dtype, mpu_request **req);
MPU_API mpu_result_t mpu_comm_ibarrier(mpu_comm *comm, mpu_request **req);

/* Wait for the request, free it, and return the call's result. */
MPU_API mpu_result_t mpu_request_wait(mpu_request *req);

/* The same, giving up after timeout_s seconds with MPU_ERR_TIMEOUT and the
 * request still pending (wait again, or abort the communicator). A call that
 * has failed meanwhile (a peer's wait passed the communicator's timeout, or
 * a peer died) is not pending: its failure is returned and the request
 * freed, as mpu_request_wait does. Queued calls of backends without native
 * non-blocking calls run here, under the communicator's own timeout. */
MPU_API mpu_result_t mpu_request_wait_timeout(mpu_request *req, double timeout_s);

/* *done = 1 if the call has completed: the request is then freed and its
 * result returned. *done = 0: still pending, MPU_SUCCESS. NCCL: a request
 * still pending after the communicator's timeout, counted from the call's
 * start, fails like a wait would (MPU_ERR_TIMEOUT, the communicator broken). */
MPU_API mpu_result_t mpu_request_test(mpu_request *req, int *done);

/* Order later work on `stream` (a cudaStream_t; NULL: the legacy default
 * stream) after the request's call, without waiting on the host: on NCCL,
 * cudaStreamWaitEvent on the request's event, returning at once (kernels
 * the caller then launches on `stream` see the results). Backends without
 * streams (threads, MPI, fake) wait for the call on the host here and ignore
 * `stream`, so one program is correct on both. The request stays pending:
 * mpu_request_wait or mpu_request_test still complete and free it and
 * return the call's result (the host's watchdog only runs there). */
MPU_API mpu_result_t mpu_request_stream_wait(mpu_request *req, void *stream);

/* MPI_Request_free: nobody will wait for this request. It completes on its
 * own and releases itself (on a later call on its communicator, or its
 * destroy); req must not be used again, and the call's result is lost. The
 * buffers stay the call's until it completes: the caller knows it has when
 * a later request on the same communicator completed (requests complete in
 * the order they were issued), or when the communicator was destroyed. */
MPU_API mpu_result_t mpu_request_free(mpu_request *req);

/* ---- groups of calls ---------------------------------------------------------
 *
 * Calls issued between mpu_group_start and mpu_group_end on one thread, on
 * any communicators and backends, are one step, like ncclGroupStart/End:
 * on NCCL they are one NCCL group (launched together at the end); so a
 * pipeline's send to the next stage and recv from the previous one, or
 * all-reduces on several groups, cannot wait on each other.
 *
 * Inside a group a blocking call (collective, send, recv, sendrecv) only
 * checks its arguments and posts the call: its return means "posted", and
 * it completes at the outermost mpu_group_end, which returns the first
 * failure of the group's calls (every call is still run). Buffers belong to
 * the calls until then. A non-blocking call's request is waited for after
 * the group ends (a wait or test inside the group that made it is
 * MPU_ERR_INVALID_USAGE). Host backends (threads, MPI, fake) run the posted
 * calls at mpu_group_end: every send first (host sends never wait for the
 * recv), then receives and collectives in the order issued; so sends and
 * receives may be issued in any order, and collectives on several
 * communicators must be issued in the same order on every rank there (NCCL
 * does not need that; a program that keeps it runs on every backend).
 * Backends may be mixed in one group. Nesting is counted per thread, as
 * NCCL's: only the outermost mpu_group_end runs the calls. Not allowed inside
 * a group (MPU_ERR_INVALID_USAGE): mpu_comm_split, mpu_comm_create_group,
 * mpu_comm_set_stream, and mpu_comm_destroy of a communicator the group
 * holds a call on. A thread closes the groups it opens.
 */
MPU_API mpu_result_t mpu_group_start(void);
/* MPU_ERR_INVALID_USAGE when no group is open on this thread. */
MPU_API mpu_result_t mpu_group_end(void);

/* ---- making and ending communicators -------------------------------------- */

/*
 * A new communicator over members[0..n-1] (ranks of comm, distinct, including
 * the caller), in which member i has rank i. Collective over the members only,
 * like MPI_Comm_create_group: ranks outside the list do not call it, and
 * disjoint groups may be created at the same time. *out is set on success only.
 */
MPU_API mpu_result_t mpu_comm_create_group(mpu_comm *comm, const int *members, int n,
                                           mpu_comm **out);

/*
 * Collective over all of comm, like MPI_Comm_split: ranks with the same color
 * form a new communicator, ordered by key, then by rank in comm. A rank with
 * color MPU_COMM_SPLIT_NOCOLOR gets *out = NULL.
 */
MPU_API mpu_result_t mpu_comm_split(mpu_comm *comm, int color, int key, mpu_comm **out);

/* Free this rank's handle (not collective). NULL is accepted. The world
 * communicator of mpu_launch belongs to the launcher and is refused. Peers
 * still waiting for this rank on comm then fail instead of hanging. Requests
 * of comm that have not run fail with MPU_ERR_INVALID_USAGE when waited for. */
MPU_API mpu_result_t mpu_comm_destroy(mpu_comm *comm);

/*
 * Declare this rank failed, like ncclCommAbort: every pending and later call of
 * every rank of the world that involves it fails with MPU_ERR_ABORTED naming
 * it. Safe to call from another thread while this rank waits in a collective:
 * that wait then returns MPU_ERR_ABORTED, never success with partial output.
 * The handle stays allocated until mpu_comm_destroy (or the launcher) frees it.
 * NCCL (whose own transports tell peers only over sockets and IB): the peers
 * learn of it through an out-of-band channel where the communicator has one
 * (members in one process, or made from the environment: the store); the
 * others end by their watchdog (MPU_ERR_TIMEOUT).
 */
MPU_API mpu_result_t mpu_comm_abort(mpu_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* MPU_COMM_H */
