/*
 * test_rendezvous.c - the TCP rendezvous behind mpu_comm_nccl_from_env,
 * with torchrun's variables: WORLD_SIZE processes on loopback (forked here),
 * rank 0 serving a 128-byte blob (an NCCL id), the others fetching it, rank 0
 * starting last; and the environment checks: missing, malformed and
 * out-of-range variables, and a rank 0 that never comes (timeout).
 * Compiled with src/comm/rendezvous.c itself: the function is internal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/rendezvous.h"
#include "mpu.h"

static int port_for_test(void) { return 20000 + (int)(getpid() % 20000); }

static void set_env(int rank, int world, int port) {
  char v[32];
  snprintf(v, sizeof v, "%d", rank);
  setenv("RANK", v, 1);
  snprintf(v, sizeof v, "%d", world);
  setenv("WORLD_SIZE", v, 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(v, sizeof v, "%d", port);
  setenv("MASTER_PORT", v, 1);
}

/* A child: read the environment, share, check the blob; exit 0 on success. */
static int child(int rank, int world, int port, int delay_ms) {
  set_env(rank, world, port);
  if (delay_ms) {
    struct timespec ts = {0, (long)delay_ms * 1000000L};
    nanosleep(&ts, NULL);
  }
  mpu__rendezvous_env env;
  if (mpu__rendezvous_read_env(&env)) return 10;
  unsigned char blob[128];
  for (int i = 0; i < 128; i++) blob[i] = rank == 0 ? (unsigned char)(i * 7 + 3) : 0;
  if (mpu__rendezvous_share(&env, blob, sizeof blob, 20)) {
    fprintf(stderr, "rank %d: %s\n", rank, mpu_last_error());
    return 11;
  }
  for (int i = 0; i < 128; i++)
    if (blob[i] != (unsigned char)(i * 7 + 3)) return 12;
  return 0;
}

static void test_share(void **state) {
  (void)state;
  const int world = 5, port = port_for_test();
  pid_t pids[5];
  for (int r = world - 1; r >= 0; r--) { /* rank 0 starts last, and late */
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) _exit(child(r, world, port, r == 0 ? 300 : 0));
  }
  for (int r = 0; r < world; r++) {
    int status = 0;
    assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
}

static void test_env_errors(void **state) {
  (void)state;
  mpu__rendezvous_env env;
  set_env(0, 2, 29500);
  assert_int_equal(mpu__rendezvous_read_env(&env), MPU_SUCCESS);
  assert_int_equal(env.world_size, 2);
  unsetenv("RANK");
  assert_int_equal(mpu__rendezvous_read_env(&env), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "RANK is not set"));
  static const char *bad[][2] = {{"RANK", "2"},        {"RANK", "-1"},  {"RANK", "1x"},
                                 {"WORLD_SIZE", "0"},   {"WORLD_SIZE", ""}, {"MASTER_PORT", "0"},
                                 {"MASTER_PORT", "65536"}, {"LOCAL_RANK", "x"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    set_env(0, 2, 29500);
    setenv(bad[i][0], bad[i][1], 1);
    mpu_result_t r = mpu__rendezvous_read_env(&env);
    assert_int_not_equal(r, MPU_SUCCESS);
    assert_non_null(strstr(mpu_last_error(), bad[i][0]));
  }
}

static void test_no_rank0(void **state) {
  (void)state;
  set_env(1, 2, port_for_test() + 1);
  mpu__rendezvous_env env;
  assert_int_equal(mpu__rendezvous_read_env(&env), MPU_SUCCESS);
  char blob[128];
  time_t t0 = time(NULL);
  assert_int_equal(mpu__rendezvous_share(&env, blob, sizeof blob, 0.5), MPU_ERR_TIMEOUT);
  assert_true(time(NULL) - t0 <= 3);
  assert_non_null(strstr(mpu_last_error(), "rank 0"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_share),
      cmocka_unit_test(test_env_errors),
      cmocka_unit_test(test_no_rank0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
