/*
 * replay.c - run the fuzz target over files (the corpus) without libFuzzer,
 * so every build, sanitized or not, replays it under ctest.
 * Usage: fuzz_layout_replay FILE...
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
  int runs = 0;
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) {
      perror(argv[i]);
      return 1;
    }
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    runs++;
  }
  printf("replayed %d input(s)\n%d passed, 0 failed\n", runs, runs);
  return 0;
}
