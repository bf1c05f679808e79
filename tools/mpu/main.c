/*
 * main.c - `mpu`, one tool with subcommands. Each subcommand parses its own
 * arguments, calls the library and formats what it returns.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mpu.h"

int cmd_bench(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_mesh(int argc, char **argv);
int cmd_plan(int argc, char **argv);

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} commands[] = {
    {"bench", cmd_bench, "time collectives (threads, MPI or NCCL; nccl-tests style), or an MLP block"},
    {"ckpt", cmd_ckpt, "inspect a distributed checkpoint, merge it into one safetensors file, or export it"},
    {"demo", cmd_demo, "run a self-checking demo (gpt, hsdp, mappings, train)"},
    {"mesh", cmd_mesh, "show a device mesh's groups, or time its queries (--bench)"},
    {"plan", cmd_plan, "plan a Megatron layout: its rank groups and every getter's answer"},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpu <command> [options]\n"
          "\n"
          "mpu %d.%d.%d: model-parallel groups and communicators for C training programs.\n"
          "\n"
          "commands:\n",
          MPU_VERSION_MAJOR, MPU_VERSION_MINOR, MPU_VERSION_PATCH);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\noptions:\n"
             "  -h, --help     this text\n"
             "  -V, --version  the tool's and the library's version\n"
             "\n'mpu <command> --help' describes a command's options.\n\n");
  cli_help_exit_status("the command failed: a demo's check, a wrong benchmark result, a run");
  fprintf(f, "\n"
             "examples:\n"
             "  mpu demo gpt\n"
             "  mpu plan --world-size 16 --tp 2 --pp 2 --format html >plan.html\n"
             "  mpu bench -b 8 -e 64M -t 4\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "mpu: missing command (see 'mpu --help')\n");
    return CLI_USAGE_EXIT;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
    printf("mpu %s (libmpu %s)\n", MPU_VERSION_STRING, mpu_version());
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "mpu: unknown command '%s' (see 'mpu --help')\n", argv[1]);
  return CLI_USAGE_EXIT;
}
