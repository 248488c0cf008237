/*
 * perf_args.h - maco-perf's command line: its own flags and nccl-tests' (NVIDIA/nccl-tests,
 * src/common.cu), parsed without touching the GPU so that test_tools checks it on the CPU.
 *
 * A flag of nccl-tests is either honoured, or accepted with one line on `err` saying why it
 * does not apply, or refused with an error naming the flag and what maco-perf can do instead
 * (`-g 2`: MACO drives one GPU per process). maco-perf.c says what is measured and how.
 */
#ifndef MACO_PERF_ARGS_H
#define MACO_PERF_ARGS_H

#include <stddef.h>
#include <stdio.h>

#include "maco/collectives.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Placements to run (nccl-tests runs both). */
enum {
    MACO_PERF_OUT_OF_PLACE = 1,
    MACO_PERF_IN_PLACE = 2,
};

/* How one time is made of the ranks' times: nccl-tests' -a values. */
typedef enum maco_perf_average {
    MACO_PERF_TIME_RANK0 = 0,
    MACO_PERF_TIME_AVG = 1,
    MACO_PERF_TIME_MIN = 2,
    MACO_PERF_TIME_MAX = 3,
} maco_perf_average_t;

typedef struct maco_perf_opts {
    maco_collective_t coll;
    size_t min_bytes, max_bytes;
    double factor;     /* > 1: each size is the last times factor; 1: plus step_bytes */
    size_t step_bytes; /* -i, used when factor is 1 */
    maco_datatype_t dtypes[MACO_DATATYPE_COUNT];
    int ndtypes;
    maco_redop_t ops[MACO_REDOP_COUNT];
    int nops;
    int root;
    int iters;                   /* -n: timed iterations */
    int agg;                     /* -m: calls per timed iteration (time is per call) */
    int warmup;                  /* -w */
    int checks;                  /* -c: checked calls per size and placement */
    int graph;                   /* -G: replays of a graph of the timed calls; 0: eager */
    int cycles;                  /* -N: passes over every size; 0: until stopped */
    int placements;              /* MACO_PERF_OUT_OF_PLACE | MACO_PERF_IN_PLACE */
    maco_perf_average_t average; /* -a; MACO's default is the largest over ranks */
    int timeout_s;               /* -T seconds; -1: not given */
    int nccl, reg, dry_run;
    const char *json_path;
} maco_perf_opts_t;

/* What maco_perf_args_parse found. */
typedef enum maco_perf_parse {
    MACO_PERF_PARSE_RUN = 0,   /* options in `o`: run (or print the plan with --dry-run) */
    MACO_PERF_PARSE_HELP = 1,  /* --help: usage written to `out`; exit status 0 */
    MACO_PERF_PARSE_USAGE = 2, /* bad usage: one error line written to `err`; exit status 2 */
} maco_perf_parse_t;

/* Parses maco-perf's arguments (argv[0] is the program) into `o`. The collective is the first
 * argument that is not an option, by MACO's name (allreduce) or nccl-tests' program name, with
 * or without a folder (./build/all_reduce_perf). Options may come before or after it, in the
 * forms -b 8, -b8, --minbytes 8 and --minbytes=8; -h and --help anywhere print the usage.
 * Notes about flags that do not apply go to `err`, one line each. Never exits. */
maco_perf_parse_t maco_perf_args_parse(int argc, char **argv, maco_perf_opts_t *o, FILE *out,
                                       FILE *err);

/* The usage text. */
void maco_perf_args_usage(FILE *f);

/* The size after `size` (-f, or -i when the factor is 1), and whether `size` is past -e. */
double maco_perf_size_next(const maco_perf_opts_t *o, double size);
int maco_perf_size_done(const maco_perf_opts_t *o, double size);

/* What a run with `o` would do, one "key: value" line each (--dry-run). */
void maco_perf_plan_print(const maco_perf_opts_t *o, FILE *f);

#ifdef __cplusplus
}
#endif

#endif
