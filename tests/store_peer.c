/*
 * store_peer.c - mpu's TCPStore client and server, driven by
 * test_store_torch.py against PyTorch's own TCPStore.
 *   store_peer client PORT   queries torch's server (the script set the
 *                            keys it reads and checks what this one wrote)
 *   store_peer serve         serves a store, prints "port N", stops at EOF
 *                            on stdin
 *   store_peer rendezvous    one rank under torchrun (its variables): joins
 *                            the rendezvous, checks rank 0's blob, posts an
 *                            abort from rank 1 and sees it on the others
 *   store_peer silent SECONDS one rank under torchrun's variables that joins
 *                            the rendezvous, then stays SECONDS without
 *                            calling NCCL (gpu_checks deadline's peer)
 * Exits 0 when every answer was the expected one, else 1 with a message.
 */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/clock.h"
#include "mpu/result.h"
#include "mpu.h"

#define WHO "store_peer"

static int failed;

static void expect(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "store_peer: %s (%s)\n", what, mpu_last_error());
    failed = 1;
  }
}

static int value_is(mpu__store *s, const char *key, const void *want, size_t n) {
  void *v = NULL;
  size_t got = 0;
  int ok = !mpu__store_get(s, key, &v, &got, 10) && got == n && !memcmp(v, want, n);
  free(v);
  return ok;
}

static int client(int port) {
  mpu__store *s = NULL, *p = NULL;
  if (mpu__store_connect("store_peer", "127.0.0.1", port, "", 10, &s) ||
      mpu__store_connect("store_peer", "localhost", port, "pre", 10, &p)) {
    fprintf(stderr, "store_peer: %s\n", mpu_last_error());
    return 1;
  }
  expect(value_is(s, "from_torch", "hello", 5), "get of torch's key");
  expect(!mpu__store_set(s, "from_mpu", "bytes\0x", 7, 10), "set");
  int64_t x = 0;
  expect(!mpu__store_add(s, "counter", 5, &x, 10) && x == 7, "add onto torch's 2");
  void *v = NULL;
  size_t n = 0;
  expect(!mpu__store_compare_set(s, "cas", "", 0, "first", 5, &v, &n, 10) && n == 5 &&
             !memcmp(v, "first", 5),
         "compare_set of a missing key");
  free(v);
  v = NULL;
  expect(!mpu__store_compare_set(s, "cas", "nope", 4, "x", 1, &v, &n, 10) && n == 5 &&
             !memcmp(v, "first", 5),
         "compare_set with a wrong expectation");
  free(v);
  int ready = 1;
  expect(!mpu__store_check(s, "missing", &ready, 10) && !ready, "check of a missing key");
  expect(mpu__store_wait(s, "missing", 0.2) == MPU_ERR_TIMEOUT, "wait timing out");
  expect(!mpu__store_check(s, "from_torch", &ready, 10) && ready, "check after a cancelled wait");
  expect(!mpu__store_wait(s, "late", 20), "wait for a key torch sets later");
  expect(!mpu__store_set(p, "k", "pv", 2, 10), "set under a prefix");
  ready = 0;
  for (int i = 0; i < 2000 && !ready; i++) expect(!mpu__store_poll_key(s, "late", &ready), "poll");
  mpu__store_close(s);
  mpu__store_close(p);
  return failed;
}

static int serve(void) {
  mpu__store_server *srv = NULL;
  if (mpu__store_serve("store_peer", 0, 10, &srv)) {
    fprintf(stderr, "store_peer: %s\n", mpu_last_error());
    return 1;
  }
  printf("port %d\n", mpu__store_server_port(srv));
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
  }
  mpu__store_server_stop(srv);
  return 0;
}

static int rendezvous(void) {
  mpu__rendezvous_env env;
  unsigned char blob[128];
  mpu__rendezvous *rv = NULL;
  if (mpu__rendezvous_read_env(WHO, &env)) {
    fprintf(stderr, "store_peer: %s\n", mpu_last_error());
    return 1;
  }
  for (int i = 0; i < 128; i++) blob[i] = env.rank == 0 ? (unsigned char)(i * 5 + 1) : 0;
  if (mpu__rendezvous_join(&env, blob, sizeof blob, 60, &rv)) {
    fprintf(stderr, "store_peer: rank %d: %s\n", env.rank, mpu_last_error());
    return 1;
  }
  for (int i = 0; i < 128; i++) expect(blob[i] == (unsigned char)(i * 5 + 1), "rank 0's blob");
  if (env.rank == 1) {
    mpu__rendezvous_post_abort(rv, 1, "gave up");
  } else {
    int who = -1, seen = 0;
    char why[64] = "";
    for (double t0 = mpu__now(); !seen && mpu__now() - t0 < 30;) {
      seen = mpu__rendezvous_poll_abort(rv, &who, why, sizeof why);
      struct timespec ts = {0, 10 * 1000000L};
      nanosleep(&ts, NULL);
    }
    expect(seen && who == 1 && !strcmp(why, "gave up"), "rank 1's abort");
  }
  printf("rank %d of %d: %s store, ok=%d\n", env.rank, env.world_size,
         env.agent_store ? "the agent's" : "rank 0's", !failed);
  mpu__rendezvous_leave(rv);
  return failed;
}

static int silent(int seconds) {
  mpu__rendezvous_env env;
  unsigned char id[128] = {0}; /* sizeof(ncclUniqueId) */
  mpu__rendezvous *rv = NULL;
  if (mpu__rendezvous_read_env(WHO, &env) || mpu__rendezvous_join(&env, id, sizeof id, 60, &rv)) {
    fprintf(stderr, "store_peer: %s\n", mpu_last_error());
    return 1;
  }
  printf("rank %d of %d: joined, silent for %d s\n", env.rank, env.world_size, seconds);
  fflush(stdout);
  struct timespec ts = {seconds, 0};
  nanosleep(&ts, NULL);
  mpu__rendezvous_leave(rv);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "rendezvous")) return rendezvous();
  if (argc == 3 && !strcmp(argv[1], "silent")) return silent(atoi(argv[2]));
  if (argc == 3 && !strcmp(argv[1], "client")) return client(atoi(argv[2]));
  if (argc == 2 && !strcmp(argv[1], "serve")) return serve();
  fprintf(stderr, "usage: store_peer client PORT | serve | rendezvous | silent SECONDS\n");
  return 2;
}
