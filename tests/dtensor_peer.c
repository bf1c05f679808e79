/*
 * dtensor_peer.c - mpu's side of test_dtensor_torch.py: runs the cases of
 * dtensor_cases.h read on stdin, one a line, and prints every rank's line,
 * in rank order.
 */
#include "dtensor_cases.h"

int main(void) {
  static char buf[1024];
  job j = {0};
  while (fgets(buf, sizeof buf, stdin)) {
    int ranks;
    if (buf[0] == '\n') continue;
    if (case_parse(buf, &j, &ranks)) {
      fprintf(stderr, "dtensor_peer: cannot read the case '%s'\n", buf);
      return 2;
    }
    if (case_run(&j, ranks)) {
      fprintf(stderr, "case %ld: %s\n", j.id, mpu_last_error());
      return 1;
    }
    for (int k = 0; k < ranks; k++) printf("%s\n", j.out[k]);
  }
  case_free(&j);
  return 0;
}
