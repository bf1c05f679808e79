/*
 * test_rendezvous.c - the TCPStore behind mpu_comm_nccl_from_env (store.c,
 * store_server.c, rendezvous.c), with torchrun's variables:
 *   - the wire format byte for byte, as torch's TCPStore client writes each
 *     query (captured from torch 2.x), and the parser on whole, cut and bad
 *     queries;
 *   - client and server on 127.0.0.1, ::1 and "localhost": set, get, add,
 *     compare_set, check, wait (answered, and timed out then cancelled),
 *     the key prefix; many clients at once; a silent client neither blocks
 *     the others nor stays;
 *   - the rendezvous: WORLD_SIZE processes (forked) with rank 0 serving and
 *     starting last; the agent's store (TORCHELASTIC_USE_AGENT_STORE=True)
 *     where rank 0 is a client too; a stray of another job refused; a rank
 *     claimed twice refused; MASTER_ADDR unset an error; a rank 0 that never
 *     comes (timeout); an abort posted by one rank seen by its peer, and one
 *     whose rank cannot be read not reported as an abort by rank -1.
 * Compiled with the sources themselves: these functions are internal.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/clock.h"
#include "mpu.h"

#define WHO "mpu_comm_nccl_from_env" /* the call whose messages the checks read */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

static size_t unhex(const char *h, uint8_t *out) {
  size_t n = strlen(h) / 2;
  for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(hexval(h[2 * i]) << 4 | hexval(h[2 * i + 1]));
  return n;
}

/* ---- the wire format: queries as torch's TCPStore client sends them ---- */

/* captured from torch's TCPStore client (is_master=False) */
static const struct {
  const char *what, *hex;
  int type;
} torch_queries[] = {
    {"validate", "00cef7853c", MPU__STORE_VALIDATE},
    {"ping", "0d8f5c0000", MPU__STORE_PING},
    {"set /ab xyz", "0103000000000000002f6162030000000000000078797a", MPU__STORE_SET},
    {"wait [/ab]", "06010000000000000003000000000000002f6162", MPU__STORE_WAIT},
    {"get /ab", "0303000000000000002f6162", MPU__STORE_GET},
    {"add /n 5", "0402000000000000002f6e0500000000000000", MPU__STORE_ADD},
    {"compare_set /ab xyz q",
     "0203000000000000002f6162030000000000000078797a010000000000000071", MPU__STORE_COMPARE_SET},
    {"check [/ab /zz]", "05020000000000000003000000000000002f616203000000000000002f7a7a",
     MPU__STORE_CHECK},
    {"num_keys", "07", MPU__STORE_GETNUMKEYS},
    {"delete_key /n", "0802000000000000002f6e", MPU__STORE_DELETE_KEY},
    {"PrefixStore(pre).set k v", "0106000000000000002f7072652f6b010000000000000076",
     MPU__STORE_SET},
    {"cancel_wait", "0c", MPU__STORE_CANCEL_WAIT},
};

static void test_wire_parse(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof torch_queries / sizeof *torch_queries; i++) {
    uint8_t b[128];
    size_t n = unhex(torch_queries[i].hex, b);
    mpu__store_query q;
    const char *why;
    assert_int_equal(mpu__store_parse(b, n, &q, &why), (long)n);
    assert_int_equal(q.type, torch_queries[i].type);
    for (size_t cut = 0; cut < n; cut++) /* every cut short is "more to come" */
      assert_int_equal(mpu__store_parse(b, cut, &q, &why), 0);
  }
  uint8_t b[128];
  mpu__store_query q;
  const char *why;
  size_t n = unhex("0203000000000000002f6162030000000000000078797a010000000000000071", b);
  assert_int_equal(mpu__store_parse(b, n, &q, &why), (long)n);
  assert_int_equal(q.key.n, 3);
  assert_memory_equal(q.key.p, "/ab", 3);
  assert_memory_equal(q.a.p, "xyz", 3);
  assert_int_equal(q.b.n, 1);
  n = unhex("0402000000000000002f6e0500000000000000", b);
  assert_int_equal(mpu__store_parse(b, n, &q, &why), (long)n);
  assert_int_equal(q.i64, 5);
  n = unhex("00cef7853c", b);
  assert_int_equal(mpu__store_parse(b, n, &q, &why), 5);
  assert_int_equal(q.u32, MPU__STORE_MAGIC);
  n = unhex("05020000000000000003000000000000002f616203000000000000002f7a7a", b);
  assert_int_equal(mpu__store_parse(b, n, &q, &why), (long)n);
  assert_int_equal(q.count, 2);
  const uint8_t *at = q.list;
  mpu__store_str k = mpu__store_next_str(&at);
  assert_memory_equal(k.p, "/ab", 3);
  k = mpu__store_next_str(&at);
  assert_memory_equal(k.p, "/zz", 3);
  /* refused for good: an unknown type, a key over the limit, too many keys */
  b[0] = 99;
  assert_int_equal(mpu__store_parse(b, 1, &q, &why), -1);
  assert_non_null(strstr(why, "unknown"));
  n = unhex("030020000000000000", b); /* GET with an 8193-byte key */
  b[1] = 0x01;
  assert_int_equal(mpu__store_parse(b, n, &q, &why), -1);
  assert_non_null(strstr(why, "key"));
  n = unhex("05ffffffffffffffff", b);
  assert_int_equal(mpu__store_parse(b, n, &q, &why), -1);
}

static void test_wire_encode(void **state) {
  (void)state;
  mpu__store_buf b = {0};
  mpu__store_put_u8(&b, MPU__STORE_VALIDATE);
  mpu__store_put_u32(&b, MPU__STORE_MAGIC);
  mpu__store_put_u8(&b, MPU__STORE_ADD);
  mpu__store_put_bytes(&b, "/n", 2);
  mpu__store_put_u64(&b, 5);
  uint8_t want[64];
  size_t n = unhex("00cef7853c" "0402000000000000002f6e0500000000000000", want);
  assert_false(b.failed);
  assert_int_equal(b.n, n);
  assert_memory_equal(b.p, want, n);
  mpu__store_buf_free(&b);
}

/* ---- client and server ---- */

/* A raw socket on the server, to play a client that misbehaves. */
static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* whether this machine has an IPv6 loopback to test on */
static int have_ipv6(void) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a = {0};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  int have = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  if (fd >= 0) close(fd);
  return have;
}

static void ops_on(const char *host) {
  mpu__store_server *srv = NULL;
  assert_int_equal(mpu__store_serve("test", 0, 5, &srv), MPU_SUCCESS);
  int port = mpu__store_server_port(srv);
  mpu__store *a = NULL, *b = NULL;
  assert_int_equal(mpu__store_connect("test", host, port, "", 5, &a), MPU_SUCCESS);
  assert_int_equal(mpu__store_connect("test", host, port, "pre", 5, &b), MPU_SUCCESS);
  assert_int_equal(mpu__store_set(a, "pre/k", "v1", 2, 5), MPU_SUCCESS);
  void *v = NULL;
  size_t n = 0;
  assert_int_equal(mpu__store_get(b, "k", &v, &n, 5), MPU_SUCCESS); /* "/pre/k" both ways */
  assert_int_equal(n, 2);
  assert_memory_equal(v, "v1", 2);
  free(v);
  int64_t x = 0;
  assert_int_equal(mpu__store_add(a, "n", 5, &x, 5), MPU_SUCCESS);
  assert_int_equal(x, 5);
  assert_int_equal(mpu__store_add(a, "n", -7, &x, 5), MPU_SUCCESS);
  assert_int_equal(x, -2);
  assert_int_equal(mpu__store_get(a, "n", &v, &n, 5), MPU_SUCCESS); /* decimal text, as torch */
  assert_int_equal(n, 2);
  assert_memory_equal(v, "-2", 2);
  free(v);
  /* compare_set: missing + "" sets; a wrong expectation answers the value held */
  assert_int_equal(mpu__store_compare_set(a, "c", "", 0, "one", 3, &v, &n, 5), MPU_SUCCESS);
  assert_memory_equal(v, "one", 3);
  free(v);
  assert_int_equal(mpu__store_compare_set(a, "c", "xx", 2, "two", 3, &v, &n, 5), MPU_SUCCESS);
  assert_memory_equal(v, "one", 3);
  free(v);
  assert_int_equal(mpu__store_compare_set(a, "c", "one", 3, "two", 3, &v, &n, 5), MPU_SUCCESS);
  assert_memory_equal(v, "two", 3);
  free(v);
  int ready = 1;
  assert_int_equal(mpu__store_check(a, "late", &ready, 5), MPU_SUCCESS);
  assert_false(ready);
  /* a wait that times out is cancelled, and the connection stays usable */
  double t0 = mpu__now();
  assert_int_equal(mpu__store_wait(a, "late", 0.3), MPU_ERR_TIMEOUT);
  assert_true(mpu__now() - t0 < 3);
  assert_non_null(strstr(mpu_last_error(), "late"));
  assert_int_equal(mpu__store_set(a, "late", "z", 1, 5), MPU_SUCCESS);
  assert_int_equal(mpu__store_wait(a, "late", 5), MPU_SUCCESS);
  assert_int_equal(mpu__store_check(a, "late", &ready, 5), MPU_SUCCESS);
  assert_true(ready);
  /* the non-blocking check sees a key within a few polls */
  ready = 0;
  for (int i = 0; i < 200 && !ready; i++) {
    assert_int_equal(mpu__store_poll_key(b, "k", &ready), MPU_SUCCESS);
    if (!ready) sleep_ms(10);
  }
  assert_true(ready);
  mpu__store_close(a);
  mpu__store_close(b);
  mpu__store_server_stop(srv);
}

static void test_ops_ipv4(void **state) {
  (void)state;
  ops_on("127.0.0.1");
}

static void test_ops_ipv6(void **state) {
  (void)state;
  if (!have_ipv6()) skip(); /* no IPv6 loopback on this machine */
  ops_on("::1");
}

static void test_ops_hostname(void **state) {
  (void)state;
  ops_on("localhost");
}

typedef struct adder {
  int port, id;
  mpu_result_t r;
} adder;

static void *add_and_wait(void *arg) {
  adder *a = arg;
  mpu__store *s = NULL;
  a->r = mpu__store_connect("test", "127.0.0.1", a->port, "", 20, &s);
  int64_t x = 0;
  if (!a->r) a->r = mpu__store_add(s, "count", 1, &x, 20);
  if (!a->r && x == 16) a->r = mpu__store_set(s, "all", "", 0, 20);
  if (!a->r) a->r = mpu__store_wait(s, "all", 20); /* 15 waits held open at once */
  mpu__store_close(s);
  return NULL;
}

/* Many clients at once, with a silent one and one that stops halfway
 * through a query: the others go on, and the deadline drops both. */
static void test_concurrent_and_silent(void **state) {
  (void)state;
  mpu__store_server *srv = NULL;
  assert_int_equal(mpu__store_serve("test", 0, 0.5, &srv), MPU_SUCCESS);
  int port = mpu__store_server_port(srv);
  int silent = raw_connect(port), halfway = raw_connect(port);
  uint8_t part[] = {0x00, 0xce, 0xf7, 0x85, 0x3c, 0x01, 0x03, 0, 0}; /* validate, half a SET */
  assert_int_equal(send(halfway, part, sizeof part, 0), (ssize_t)sizeof part);
  pthread_t t[16];
  adder a[16];
  for (int i = 0; i < 16; i++) {
    a[i] = (adder){port, i, MPU_SUCCESS};
    assert_int_equal(pthread_create(&t[i], NULL, add_and_wait, &a[i]), 0);
  }
  for (int i = 0; i < 16; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(a[i].r, MPU_SUCCESS);
  }
  /* both misbehaving clients are dropped by the deadline: their reads end */
  struct timeval tv = {10, 0};
  char c;
  setsockopt(silent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(halfway, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  assert_int_equal(recv(silent, &c, 1, 0), 0);
  assert_int_equal(recv(halfway, &c, 1, 0), 0);
  close(silent);
  close(halfway);
  /* a client that skips the handshake is dropped at its first query */
  int rude = raw_connect(port);
  uint8_t q[] = {0x07};
  assert_int_equal(send(rude, q, 1, 0), 1);
  setsockopt(rude, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  assert_int_equal(recv(rude, &c, 1, 0), 0);
  close(rude);
  mpu__store_server_stop(srv);
}

/* ---- the rendezvous, with torchrun's variables, one process per rank ---- */

/* below the ephemeral range (32768-60999 on Linux), where outgoing connections take ports */
static int port_for_test(int k) { return 20000 + (int)((getpid() * 7 + k * 1009) % 12000); }

static void set_env(int rank, int world, int port, const char *addr) {
  char v[32];
  snprintf(v, sizeof v, "%d", rank);
  setenv("RANK", v, 1);
  snprintf(v, sizeof v, "%d", world);
  setenv("WORLD_SIZE", v, 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", addr, 1);
  snprintf(v, sizeof v, "%d", port);
  setenv("MASTER_PORT", v, 1);
}

/* A child: read the environment, join, check the blob; exit 0 on success,
 * 20 + the error code otherwise (its message on stderr). With abort_ms,
 * rank 1 posts an abort that many ms after joining and the others must see
 * it within 1 s. */
static int child(int rank, int world, int port, const char *addr, int delay_ms, int abort_ms) {
  set_env(rank, world, port, addr);
  if (delay_ms) sleep_ms(delay_ms);
  mpu__rendezvous_env env;
  if (mpu__rendezvous_read_env(WHO, &env)) return 10;
  unsigned char blob[128];
  for (int i = 0; i < 128; i++) blob[i] = rank == 0 ? (unsigned char)(i * 7 + 3) : 0;
  mpu__rendezvous *rv = NULL;
  mpu_result_t r = mpu__rendezvous_join(&env, blob, sizeof blob, 20, &rv);
  if (r) {
    fprintf(stderr, "rank %d: %s\n", rank, mpu_last_error());
    return 20 + (int)r;
  }
  for (int i = 0; i < 128; i++)
    if (blob[i] != (unsigned char)(i * 7 + 3)) return 12;
  int code = 0;
  if (abort_ms && rank == 1) {
    sleep_ms(abort_ms);
    char why[128]; /* when it was posted: CLOCK_MONOTONIC is one clock for every process */
    snprintf(why, sizeof why, "mpu_comm_abort was called on this rank at %.6f", mpu__now());
    mpu__rendezvous_post_abort(rv, 1, why);
    sleep_ms(1500); /* stay until the others have read it */
  } else if (abort_ms) {
    double t0 = mpu__now(), seen = -1;
    int who = -1;
    char why[256] = "";
    while (mpu__now() - t0 < abort_ms / 1000.0 + 5 && seen < 0) {
      if (mpu__rendezvous_poll_abort(rv, &who, why, sizeof why)) seen = mpu__now();
      sleep_ms(5);
    }
    const char *at = strstr(why, " at ");
    double late = at ? seen - atof(at + 4) : 99;
    if (seen < 0 || late > 1.0 || who != 1 || !strstr(why, "mpu_comm_abort")) {
      fprintf(stderr, "rank %d: abort seen=%d late=%.3f who=%d why='%s'\n", rank, seen >= 0,
              late, who, why);
      code = 13;
    }
    if (rank == 0) sleep_ms(500);
  }
  mpu__rendezvous_leave(rv);
  return code;
}

static int wait_child(pid_t pid) {
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

static void share_on(const char *addr, int k) {
  const int world = 5, port = port_for_test(k);
  pid_t pids[5];
  for (int r = world - 1; r >= 0; r--) { /* rank 0 starts last, and late */
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) _exit(child(r, world, port, addr, r == 0 ? 300 : 0, 0));
  }
  for (int r = 0; r < world; r++) assert_int_equal(wait_child(pids[r]), 0);
}

static void test_share(void **state) {
  (void)state;
  share_on("127.0.0.1", 1);
  share_on("localhost", 2);
}

static void test_share_ipv6(void **state) {
  (void)state;
  if (!have_ipv6()) skip();
  share_on("::1", 3);
}

/* Under torchrun the agent serves the store: rank 0 must not try to. */
static void test_agent_store(void **state) {
  (void)state;
  mpu__store_server *agent = NULL;
  assert_int_equal(mpu__store_serve("agent", 0, 5, &agent), MPU_SUCCESS);
  int port = mpu__store_server_port(agent);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  setenv("TORCHELASTIC_RUN_ID", "job-a", 1);
  pid_t pids[3];
  for (int r = 0; r < 3; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(child(r, 3, port, "127.0.0.1", 0, 0));
  }
  for (int r = 0; r < 3; r++) assert_int_equal(wait_child(pids[r]), 0);
  /* the keys are where a torch user would look for them */
  mpu__store *s = NULL;
  assert_int_equal(mpu__store_connect("test", "127.0.0.1", port, "mpu/attempt_2", 5, &s),
                   MPU_SUCCESS);
  int ready = 0;
  assert_int_equal(mpu__store_check(s, "job", &ready, 5), MPU_SUCCESS);
  assert_true(ready);
  mpu__store_close(s);
  unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  unsetenv("TORCHELASTIC_RUN_ID");
  mpu__store_server_stop(agent);
}

/* A process of another job (another MPU_JOB_KEY) is refused; the job goes on. */
static void test_stray_refused(void **state) {
  (void)state;
  const int port = port_for_test(4);
  setenv("MPU_JOB_KEY", "job-a", 1);
  pid_t p0 = fork();
  if (p0 == 0) _exit(child(0, 2, port, "127.0.0.1", 0, 0));
  pid_t stray = fork();
  if (stray == 0) {
    setenv("MPU_JOB_KEY", "job-b", 1);
    _exit(child(1, 2, port, "127.0.0.1", 0, 0));
  }
  assert_int_equal(wait_child(stray), 20 + MPU_ERR_INVALID_USAGE);
  pid_t p1 = fork();
  if (p1 == 0) _exit(child(1, 2, port, "127.0.0.1", 0, 0));
  assert_int_equal(wait_child(p0), 0);
  assert_int_equal(wait_child(p1), 0);
  unsetenv("MPU_JOB_KEY");
}

/* Two processes with the same RANK: the second is refused. */
static void test_duplicate_rank(void **state) {
  (void)state;
  const int port = port_for_test(5);
  pid_t p0 = fork();
  if (p0 == 0) _exit(child(0, 3, port, "127.0.0.1", 0, 0));
  pid_t a = fork();
  if (a == 0) _exit(child(1, 3, port, "127.0.0.1", 0, 0));
  pid_t b = fork();
  if (b == 0) _exit(child(1, 3, port, "127.0.0.1", 100, 0));
  int ea = wait_child(a), eb = wait_child(b);
  /* one of them joined; the other was refused */
  assert_true((ea == 0 && eb == 20 + MPU_ERR_INVALID_USAGE) ||
              (eb == 0 && ea == 20 + MPU_ERR_INVALID_USAGE));
  pid_t p2 = fork();
  if (p2 == 0) _exit(child(2, 3, port, "127.0.0.1", 0, 0));
  assert_int_equal(wait_child(p2), 0);
  assert_int_equal(wait_child(p0), 0);
}

/* A claim needs the job key. A store client without it that claims rank 1
 * as the keys read (comm0/rank1, and under another job's name) before the
 * real rank 1 comes does not lock it out; a process of the job's code
 * without the key is refused before it claims anything. */
static void test_keyless_claim(void **state) {
  (void)state;
  const int port = port_for_test(8);
  setenv("MPU_JOB_KEY", "job-a", 1);
  pid_t p0 = fork();
  if (p0 == 0) _exit(child(0, 2, port, "127.0.0.1", 0, 0));
  mpu__store *s = NULL; /* a bare client of rank 0's store, as torch's would be */
  assert_int_equal(mpu__store_connect("test", "127.0.0.1", port, "mpu", 20, &s), MPU_SUCCESS);
  static const char *const keys[] = {"comm0/rank1", "comm0/rank1/", "comm0/rank1/;world=2",
                                     "comm0/rank1/job-b;world=2"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    int64_t n = 0;
    assert_int_equal(mpu__store_add(s, keys[i], 1, &n, 5), MPU_SUCCESS);
    assert_int_equal(n, 1);
  }
  pid_t keyless = fork();
  if (keyless == 0) {
    unsetenv("MPU_JOB_KEY");
    _exit(child(1, 2, port, "127.0.0.1", 0, 0));
  }
  assert_int_equal(wait_child(keyless), 20 + MPU_ERR_INVALID_USAGE);
  pid_t p1 = fork();
  if (p1 == 0) _exit(child(1, 2, port, "127.0.0.1", 0, 0));
  assert_int_equal(wait_child(p1), 0);
  assert_int_equal(wait_child(p0), 0);
  mpu__store_close(s);
  unsetenv("MPU_JOB_KEY");
}

/* An empty blob (NULL, 0 bytes) is published and read as such: nothing is
 * copied to or from NULL (the sanitizer build checks). */
static int child_empty(int rank, int port) {
  set_env(rank, 2, port, "127.0.0.1");
  mpu__rendezvous_env env;
  if (mpu__rendezvous_read_env(WHO, &env)) return 10;
  mpu__rendezvous *rv = NULL;
  mpu_result_t r = mpu__rendezvous_join(&env, NULL, 0, 20, &rv);
  if (r) fprintf(stderr, "rank %d: %s\n", rank, mpu_last_error());
  mpu__rendezvous_leave(rv);
  return r ? 20 + (int)r : 0;
}

static void test_empty_blob(void **state) {
  (void)state;
  const int port = port_for_test(9);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(child_empty(r, port));
  }
  for (int r = 0; r < 2; r++) assert_int_equal(wait_child(pids[r]), 0);
}

/* An abort posted through the store reaches every peer within 1 s. */
static void test_abort_reaches_peers(void **state) {
  (void)state;
  const int port = port_for_test(6);
  pid_t pids[3];
  for (int r = 0; r < 3; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(child(r, 3, port, "127.0.0.1", 0, 300));
  }
  for (int r = 0; r < 3; r++) assert_int_equal(wait_child(pids[r]), 0);
}

/* An abort key whose rank cannot be read (the store went away between the
 * check and the read, or bytes mpu did not write) is not reported as an
 * abort by rank -1: the poll says nothing, and a later one reads the post. */
static int child_unreadable(int rank, int port) {
  set_env(rank, 2, port, "127.0.0.1");
  mpu__rendezvous_env env;
  if (mpu__rendezvous_read_env(WHO, &env)) return 10;
  mpu__rendezvous *rv = NULL;
  if (mpu__rendezvous_join(&env, NULL, 0, 20, &rv)) return 11;
  int code = 0;
  if (rank == 1) {
    char key[256];
    snprintf(key, sizeof key, "%s/abort", mpu__rendezvous_base(rv));
    if (mpu__store_set(mpu__rendezvous_store(rv), key, "no rank here", 12, 5)) code = 12;
    sleep_ms(600);
    mpu__rendezvous_post_abort(rv, 1, "aborted (mpu_comm_abort)");
    sleep_ms(1500); /* stay until rank 0 has read it */
  } else {
    double t0 = mpu__now();
    int who = -1, seen = 0;
    char why[256] = "";
    while (!seen && mpu__now() - t0 < 5) {
      seen = mpu__rendezvous_poll_abort(rv, &who, why, sizeof why);
      sleep_ms(5);
    }
    if (!seen || who != 1 || !strstr(why, "mpu_comm_abort")) {
      fprintf(stderr, "rank 0: abort seen=%d who=%d why='%s'\n", seen, who, why);
      code = 13;
    }
  }
  mpu__rendezvous_leave(rv);
  return code;
}

static void test_abort_unreadable(void **state) {
  (void)state;
  const int port = port_for_test(10);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(child_unreadable(r, port));
  }
  for (int r = 0; r < 2; r++) assert_int_equal(wait_child(pids[r]), 0);
}

static void test_env_errors(void **state) {
  (void)state;
  mpu__rendezvous_env env;
  set_env(0, 2, 29500, "127.0.0.1");
  assert_int_equal(mpu__rendezvous_read_env(WHO, &env), MPU_SUCCESS);
  assert_int_equal(env.world_size, 2);
  assert_false(env.agent_store);
  unsetenv("RANK");
  assert_int_equal(mpu__rendezvous_read_env(WHO, &env), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "RANK is not set"));
  set_env(0, 2, 29500, "127.0.0.1");
  unsetenv("MASTER_ADDR"); /* never a silent 127.0.0.1 */
  assert_int_equal(mpu__rendezvous_read_env(WHO, &env), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "MASTER_ADDR is not set"));
  static const char *bad[][2] = {{"RANK", "2"},        {"RANK", "-1"},  {"RANK", "1x"},
                                 {"WORLD_SIZE", "0"},   {"WORLD_SIZE", ""}, {"MASTER_PORT", "0"},
                                 {"MASTER_PORT", "65536"}, {"LOCAL_RANK", "x"},
                                 {"TORCHELASTIC_USE_AGENT_STORE", "yes"},
                                 {"TORCHELASTIC_RESTART_COUNT", "-1"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    set_env(0, 2, 29500, "127.0.0.1");
    setenv(bad[i][0], bad[i][1], 1);
    mpu_result_t r = mpu__rendezvous_read_env(WHO, &env);
    assert_int_not_equal(r, MPU_SUCCESS);
    assert_non_null(strstr(mpu_last_error(), bad[i][0]));
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    unsetenv("TORCHELASTIC_RESTART_COUNT");
  }
  set_env(0, 2, 29500, "no-such-host.invalid");
  assert_int_equal(mpu__rendezvous_read_env(WHO, &env), MPU_SUCCESS);
  mpu__rendezvous *rv = NULL;
  set_env(1, 2, 29500, "no-such-host.invalid");
  assert_int_equal(mpu__rendezvous_read_env(WHO, &env), MPU_SUCCESS);
  assert_int_equal(mpu__rendezvous_join(&env, NULL, 0, 1, &rv), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "no-such-host.invalid"));
}

static void test_no_rank0(void **state) {
  (void)state;
  set_env(1, 2, port_for_test(7), "127.0.0.1");
  mpu__rendezvous_env env;
  assert_int_equal(mpu__rendezvous_read_env(WHO, &env), MPU_SUCCESS);
  char blob[128];
  mpu__rendezvous *rv = NULL;
  double t0 = mpu__now();
  assert_int_equal(mpu__rendezvous_join(&env, blob, sizeof blob, 0.5, &rv), MPU_ERR_TIMEOUT);
  assert_true(mpu__now() - t0 <= 3);
  assert_non_null(strstr(mpu_last_error(), "127.0.0.1"));
  assert_null(rv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wire_parse),
      cmocka_unit_test(test_wire_encode),
      cmocka_unit_test(test_ops_ipv4),
      cmocka_unit_test(test_ops_ipv6),
      cmocka_unit_test(test_ops_hostname),
      cmocka_unit_test(test_concurrent_and_silent),
      cmocka_unit_test(test_share),
      cmocka_unit_test(test_share_ipv6),
      cmocka_unit_test(test_agent_store),
      cmocka_unit_test(test_stray_refused),
      cmocka_unit_test(test_duplicate_rank),
      cmocka_unit_test(test_keyless_claim),
      cmocka_unit_test(test_empty_blob),
      cmocka_unit_test(test_abort_reaches_peers),
      cmocka_unit_test(test_abort_unreadable),
      cmocka_unit_test(test_env_errors),
      cmocka_unit_test(test_no_rank0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
