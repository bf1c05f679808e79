/*
 * rendezvous.c - the TCP rendezvous behind mpu_comm_nccl_from_env.
 *
 * Rank 0 listens on MASTER_PORT; every other rank connects (retrying until
 * the timeout, since rank 0 may start last), says its rank, and reads the
 * blob. Rank 0 answers each rank once and returns when all world_size - 1
 * have been served. Sockets are non-blocking under poll(), so no step waits
 * past the deadline.
 */
#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"


static mpu_result_t env_int(const char *name, const char *fallback, long lo, long hi, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) v = fallback;
  if (!v)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "mpu_comm_nccl_from_env: %s is not set (torchrun sets RANK, WORLD_SIZE, "
                      "LOCAL_RANK, MASTER_ADDR and MASTER_PORT)",
                      name);
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || end == v || x < lo || x > hi)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_comm_nccl_from_env: %s=%s (want a whole number %ld..%ld)", name, v, lo,
                      hi);
  *out = (int)x;
  return MPU_SUCCESS;
}

mpu_result_t mpu__rendezvous_read_env(mpu__rendezvous_env *env) {
  memset(env, 0, sizeof *env);
  MPU_CHECK(env_int("WORLD_SIZE", NULL, 1, 1 << 24, &env->world_size));
  MPU_CHECK(env_int("RANK", NULL, 0, env->world_size - 1, &env->rank));
  MPU_CHECK(env_int("LOCAL_RANK", "0", 0, 1 << 16, &env->local_rank));
  MPU_CHECK(env_int("MASTER_PORT", NULL, 1, 65535, &env->port));
  const char *addr = getenv("MASTER_ADDR");
  if (!addr || !*addr) addr = "127.0.0.1";
  if (strlen(addr) >= sizeof env->addr)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_comm_nccl_from_env: MASTER_ADDR is too long");
  snprintf(env->addr, sizeof env->addr, "%s", addr);
  return MPU_SUCCESS;
}

/* Move len bytes on a non-blocking socket before the deadline. */
static int move_all(int fd, void *buf, size_t len, int sending, double deadline) {
  char *p = buf;
  while (len) {
    struct pollfd pfd = {fd, sending ? POLLOUT : POLLIN, 0};
    int left = (int)((deadline - mpu__now()) * 1000);
    if (left <= 0 || poll(&pfd, 1, left) <= 0) return -1;
    ssize_t k = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return -1;
    if (k > 0) p += k, len -= (size_t)k;
  }
  return 0;
}

static mpu_result_t serve(const mpu__rendezvous_env *env, const void *blob, size_t len,
                          double deadline) {
  static const char fn[] = "mpu_comm_nccl_from_env (rank 0)";
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
  if (fd < 0) return mpu__error(MPU_ERR_SYSTEM, "%s: socket: %s", fn, strerror(errno));
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)env->port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 128)) {
    mpu_result_t r = mpu__error(MPU_ERR_SYSTEM, "%s: cannot listen on port %d: %s", fn,
                                env->port, strerror(errno));
    close(fd);
    return r;
  }
  char *served = calloc((size_t)env->world_size, 1);
  int left = env->world_size - 1;
  mpu_result_t r = served ? MPU_SUCCESS : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  while (!r && left > 0) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int ms = (int)((deadline - mpu__now()) * 1000);
    if (ms <= 0 || poll(&pfd, 1, ms) <= 0) {
      r = mpu__error(MPU_ERR_TIMEOUT, "%s: %d of %d ranks never connected to port %d", fn, left,
                     env->world_size - 1, env->port);
      break;
    }
    int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) continue;
    int32_t who = -1;
    if (!move_all(c, &who, sizeof who, 0, deadline) && who > 0 && who < env->world_size &&
        !served[who] && !move_all(c, (void *)blob, len, 1, deadline)) {
      served[who] = 1;
      left--;
    }
    close(c);
  }
  free(served);
  close(fd);
  return r;
}

static mpu_result_t fetch(const mpu__rendezvous_env *env, void *blob, size_t len,
                          double deadline) {
  static const char fn[] = "mpu_comm_nccl_from_env";
  char port[16];
  snprintf(port, sizeof port, "%d", env->port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int g = getaddrinfo(env->addr, port, &hints, &res);
  if (g) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: MASTER_ADDR=%s: %s", fn, env->addr, gai_strerror(g));
  mpu_result_t r = MPU_ERR_TIMEOUT;
  while (mpu__now() < deadline) { /* rank 0 may not be listening yet */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    int ok = connect(fd, res->ai_addr, res->ai_addrlen) == 0 || errno == EINPROGRESS;
    if (ok) {
      struct pollfd pfd = {fd, POLLOUT, 0};
      int err = 0;
      socklen_t el = sizeof err;
      ok = poll(&pfd, 1, 1000) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) && !err;
    }
    int32_t me = env->rank;
    if (ok && !move_all(fd, &me, sizeof me, 1, deadline) && !move_all(fd, blob, len, 0, deadline)) {
      close(fd);
      r = MPU_SUCCESS;
      break;
    }
    close(fd);
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  freeaddrinfo(res);
  if (r)
    return mpu__error(MPU_ERR_TIMEOUT, "%s: rank %d got nothing from %s:%d (rank 0) in time", fn,
                      env->rank, env->addr, env->port);
  return MPU_SUCCESS;
}

mpu_result_t mpu__rendezvous_share(const mpu__rendezvous_env *env, void *blob, size_t len,
                                   double timeout_s) {
  double deadline = mpu__now() + timeout_s;
  if (env->world_size == 1) return MPU_SUCCESS;
  return env->rank == 0 ? serve(env, blob, len, deadline) : fetch(env, blob, len, deadline);
}
