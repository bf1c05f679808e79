/*
 * replay.c - run the fuzz target over files (the corpus) without libFuzzer,
 * so every build, sanitized or not, replays it under ctest.
 * Usage: fuzz_layout_replay PATH...   (a PATH may be a directory: its files)
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  static uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  return 1;
}

int main(int argc, char **argv) {
  int runs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st)) {
      perror(argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (replay_file(argv[i]) < 0) return 1;
      runs++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (!d) {
      perror(argv[i]);
      return 1;
    }
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      if (replay_file(path) < 0) {
        closedir(d);
        return 1;
      }
      runs++;
    }
    closedir(d);
  }
  printf("replayed %d input(s)\n%d passed, 0 failed\n", runs, runs);
  return 0;
}
