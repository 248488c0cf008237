/*
 * perf_args.c - maco-perf's command line (perf_args.h). nccl-tests' flags, their long names and
 * their meanings are those of NVIDIA/nccl-tests' src/common.cu (2.19); its type names are
 * nccl.h's (ncclFloat is "float", ncclFloat8e4m3 "f8e4m3").
 */
#include "perf_args.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define PERF_COLLECTIVES                                                                           \
    "allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, sendrecv"

/* nccl-tests' long option names and the short flag each stands for. */
static const struct {
    const char *name;
    char flag;
} perf_long_flags[] = {
    { "nthreads", 't' },
    { "ngpus", 'g' },
    { "minbytes", 'b' },
    { "maxbytes", 'e' },
    { "stepbytes", 'i' },
    { "stepfactor", 'f' },
    { "iters", 'n' },
    { "agg_iters", 'm' },
    { "warmup_iters", 'w' },
    { "run_cycles", 'N' },
    { "parallel_init", 'p' },
    { "check", 'c' },
    { "op", 'o' },
    { "datatype", 'd' },
    { "root", 'r' },
    { "blocking", 'z' },
    { "stream_null", 'y' },
    { "timeout", 'T' },
    { "cudagraph", 'G' },
    { "report_cputime", 'C' },
    { "report_timestamps", 'S' },
    { "output_file", 'J' },
    { "average", 'a' },
    { "local_register", 'R' },
    { "cta_policy", 'x' },
    { "device_implementation", 'D' },
    { "device_cta_count", 'V' },
    { "memory", 'M' },
    { "unalign", 'u' },
    { "per_iter_timing", 'I' },
    { "per_iter_skip", 'K' },
};

/* Every short flag that takes a value (all of nccl-tests' but -h). */
static const char perf_value_flags[] = "tgbeifnmwNpcodrzyTGCSJaRxDVMuIK";

/* nccl-tests' type names (and nccl.h's older ones), then MACO's. */
static const struct {
    const char *name;
    maco_datatype_t type;
} perf_type_names[] = {
    { "int8", MACO_INT8 },       { "char", MACO_INT8 },         { "uint8", MACO_UINT8 },
    { "int32", MACO_INT32 },     { "int", MACO_INT32 },         { "uint32", MACO_UINT32 },
    { "int64", MACO_INT64 },     { "uint64", MACO_UINT64 },     { "half", MACO_FLOAT16 },
    { "float16", MACO_FLOAT16 }, { "bfloat16", MACO_BFLOAT16 }, { "bf16", MACO_BFLOAT16 },
    { "float", MACO_FLOAT32 },   { "float32", MACO_FLOAT32 },   { "double", MACO_FLOAT64 },
    { "float64", MACO_FLOAT64 }, { "f8e4m3", MACO_FP8_E4M3 },   { "fp8_e4m3", MACO_FP8_E4M3 },
    { "f8e5m2", MACO_FP8_E5M2 }, { "fp8_e5m2", MACO_FP8_E5M2 },
};

/* nccl-tests' program names (one per src/<name>.cu, built as <name>_perf) and MACO's
 * collectives. */
static const struct {
    const char *name;
    maco_collective_t coll;
} perf_program_names[] = {
    { "all_reduce", MACO_COLL_ALLREDUCE },
    { "all_gather", MACO_COLL_ALLGATHER },
    { "reduce_scatter", MACO_COLL_REDUCE_SCATTER },
    { "broadcast", MACO_COLL_BROADCAST },
    { "reduce", MACO_COLL_REDUCE },
    { "alltoall", MACO_COLL_ALLTOALL },
    { "sendrecv", MACO_COLL_SENDRECV },
};

static void perf_line(FILE *f, const char *kind, const char *fmt, ...)
{
    if (f == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "maco-perf: %s", kind);
    vfprintf(f, fmt, ap);
    fprintf(f, "\n");
    va_end(ap);
}

#define PERF_ERROR(err, ...) (perf_line((err), "", __VA_ARGS__), MACO_PERF_PARSE_USAGE)
#define PERF_NOTE(err, ...) perf_line((err), "note: ", __VA_ARGS__)

void maco_perf_args_usage(FILE *f)
{
    fprintf(
        f,
        "usage: maco-perf COLLECTIVE [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-d TYPE|all]\n"
        "                 [-o OP|all] [-r ROOT] [-n ITERS] [-m CALLS] [-w WARMUP] [-c CHECKS]\n"
        "                 [-G REPLAYS] [-N CYCLES] [-a 0-3] [-T SECONDS] [-R 0|1|2]\n"
        "                 [--placement both|out|in] [--nccl] [--json FILE] [--dry-run]\n"
        "  COLLECTIVE: allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall,\n"
        "              sendrecv (rank r sends to r+1 and receives from r-1, as nccl-tests), or\n"
        "              nccl-tests' program name (all_reduce_perf, ./build/all_gather_perf, ...)\n"
        "  Run under maco-run, one rank per GPU: maco-run -n 4 maco-perf allreduce ...\n"
        "  An nccl-tests command line works as pasted: `mpirun -np 4 ./build/all_reduce_perf -b 8\n"
        "  -e 1G -f 2 -g 1` becomes `maco-run -n 4 maco-perf all_reduce_perf -b 8 -e 1G -f 2 -g "
        "1`.\n"
        "  Flags take nccl-tests' forms too: -b8, --minbytes 8, --minbytes=8.\n"
        "  -b, -e   smallest and largest size in bytes, nccl-tests' meaning (K, M, G suffixes;\n"
        "           default 8 and 128M)\n"
        "  -f       size multiplier between steps (default 2); -f 1: add -i STEP bytes instead\n"
        "           (default 1M)\n"
        "  -d       data type: int8 uint8 int32 uint32 int64 uint64 half (float16) bfloat16\n"
        "           float (float32) double (float64) f8e4m3 f8e5m2, or all (default bfloat16)\n"
        "  -o       reduction: sum prod min max avg, or all of these (default sum; MACO has no\n"
        "           mulsum)\n"
        "  -r       root of broadcast and reduce (default 0)\n"
        "  -n, -w   timed and warm-up iterations per size (default 20 and 5)\n"
        "  -m       calls per timed iteration (default 1), issued one after another\n"
        "  -c       checked calls per size and placement (default 1; 0: none)\n"
        "  -G       capture the timed calls in a CUDA graph and replay it REPLAYS times\n"
        "  -N       passes over all sizes (default 1; 0: until stopped)\n"
        "  -a       time of a size from the ranks' times: 0 rank 0's, 1 average, 2 smallest,\n"
        "           3 largest (default 3; nccl-tests' default is 1)\n"
        "  -T       deadline of each wait on the GPU in seconds (sets MACO_DEVICE_TIMEOUT)\n"
        "  -R       1 or 2: buffers from maco_mem_alloc (registered: used in place), NCCL's\n"
        "           from ncclMemAlloc registered as symmetric windows (nccl-tests' -R 2);\n"
        "           0: cudaMalloc for both (default)\n"
        "  --placement  out-of-place and in-place (both, the default, as nccl-tests), or one\n"
        "           (out, in); alltoall and sendrecv have only out of place. --inplace: both\n"
        "  --nccl   also run the system NCCL (MACO_NCCL_LIBRARY names it) and show the path\n"
        "           it took (its TUNING log for one extra call per size)\n"
        "  --json   write one JSON object per size and placement to FILE (rank 0); -J FILE too\n"
        "  --dry-run  print what would run and exit, without a GPU\n"
        "  nccl-tests' -t 1, -g 1, -p, -z 0, -y, -C, -S, -x, -V, -M, -u 0, -D 0, -I and -K are\n"
        "  accepted; those that do not apply say so in one line. -t, -g above 1 are refused:\n"
        "  MACO drives one GPU per process (start one rank per GPU with maco-run -n).\n");
}

static int parse_bytes(const char *text, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || v < 0)
        return -1;
    double mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024.0;
    else if (*end == 'M' || *end == 'm')
        mult = 1024.0 * 1024;
    else if (*end == 'G' || *end == 'g')
        mult = 1024.0 * 1024 * 1024;
    else if (*end != '\0')
        return -1;
    if (*end != '\0' && end[1] != '\0' && strcmp(end + 1, "B") != 0 && strcmp(end + 1, "b") != 0)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *text, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 0);
    if (errno || end == text || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_dtypes(const char *v, maco_perf_opts_t *o)
{
    if (strcmp(v, "all") == 0) {
        for (int t = 0; t < MACO_DATATYPE_COUNT; t++)
            o->dtypes[t] = (maco_datatype_t)t;
        o->ndtypes = MACO_DATATYPE_COUNT;
        return 0;
    }
    for (size_t i = 0; i < sizeof(perf_type_names) / sizeof(perf_type_names[0]); i++)
        if (strcmp(v, perf_type_names[i].name) == 0) {
            o->dtypes[0] = perf_type_names[i].type;
            o->ndtypes = 1;
            return 0;
        }
    return -1;
}

static int parse_ops(const char *v, maco_perf_opts_t *o)
{
    o->nops = 0;
    for (int op = 0; op < MACO_REDOP_COUNT; op++)
        if (strcmp(v, "all") == 0 || strcmp(v, maco_redop_name((maco_redop_t)op)) == 0)
            o->ops[o->nops++] = (maco_redop_t)op;
    return o->nops == 0 ? -1 : 0;
}

/* The collective named by `arg`: MACO's name, or nccl-tests' program (a path, `_perf`). */
static int parse_collective(const char *arg, maco_collective_t *out)
{
    const char *base = strrchr(arg, '/');
    base = base != NULL ? base + 1 : arg;
    char name[64];
    size_t len = strlen(base);
    if (len >= sizeof(name))
        return -1;
    memcpy(name, base, len + 1);
    if (len > 5 && strcmp(name + len - 5, "_perf") == 0)
        name[len - 5] = '\0';
    for (int k = 0; k < MACO_COLLECTIVE_COUNT; k++)
        if (strcmp(name, maco_collective_name((maco_collective_t)k)) == 0) {
            *out = (maco_collective_t)k;
            return 0;
        }
    for (size_t i = 0; i < sizeof(perf_program_names) / sizeof(perf_program_names[0]); i++)
        if (strcmp(name, perf_program_names[i].name) == 0) {
            *out = perf_program_names[i].coll;
            return 0;
        }
    return -1;
}

/* Applies one of the flags maco-perf uses with its value (`given`: the flag as written, for
 * messages); *handled_p is 0 when `flag` is none of them. */
static maco_perf_parse_t apply_perf_flag(char flag, const char *given, const char *v,
                                         maco_perf_opts_t *o, FILE *err, int *handled_p)
{
    int n = 0;
    *handled_p = 1;
    switch (flag) {
    case 't':
        if (parse_int(v, 1, 1 << 20, &n) != 0)
            return PERF_ERROR(err, "%s '%s': a thread count is a positive integer", given, v);
        if (n != 1)
            return PERF_ERROR(err,
                              "%s %d: maco-perf runs one thread per process, driving one GPU; "
                              "start %d ranks with maco-run -n %d instead (-t 1 is accepted)",
                              given, n, n, n);
        return MACO_PERF_PARSE_RUN;
    case 'g':
        if (parse_int(v, 1, 1 << 20, &n) != 0)
            return PERF_ERROR(err, "%s '%s': a GPU count is a positive integer", given, v);
        if (n != 1)
            return PERF_ERROR(err,
                              "%s %d: MACO drives one GPU per process; run one rank per GPU "
                              "(maco-run -n <ranks> maco-perf ...) and leave out -g or pass -g 1",
                              given, n);
        return MACO_PERF_PARSE_RUN;
    case 'b':
        if (parse_bytes(v, &o->min_bytes) != 0)
            return PERF_ERROR(err, "%s '%s': a size in bytes (K, M, G suffixes)", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'e':
        if (parse_bytes(v, &o->max_bytes) != 0)
            return PERF_ERROR(err, "%s '%s': a size in bytes (K, M, G suffixes)", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'i':
        if (parse_bytes(v, &o->step_bytes) != 0 || o->step_bytes == 0)
            return PERF_ERROR(err, "%s '%s': a step in bytes above 0 (K, M, G suffixes)", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'f': {
        char *end;
        errno = 0;
        o->factor = strtod(v, &end);
        if (errno || end == v || *end != '\0' || !(o->factor >= 1.0))
            return PERF_ERROR(err, "%s '%s': a factor of at least 1 (1: steps of -i bytes)", given,
                              v);
        return MACO_PERF_PARSE_RUN;
    }
    case 'n':
        if (parse_int(v, 1, 1000000, &o->iters) != 0)
            return PERF_ERROR(err, "%s '%s': timed iterations, 1 to 1000000", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'm':
        if (parse_int(v, 1, 1000000, &o->agg) != 0)
            return PERF_ERROR(err, "%s '%s': calls per iteration, 1 to 1000000", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'w':
        if (parse_int(v, 0, 1000000, &o->warmup) != 0)
            return PERF_ERROR(err, "%s '%s': warm-up iterations, 0 to 1000000", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'N':
        if (parse_int(v, 0, 1000000, &o->cycles) != 0)
            return PERF_ERROR(err, "%s '%s': passes over the sizes, 0 (until stopped) or more",
                              given, v);
        return MACO_PERF_PARSE_RUN;
    case 'c':
        if (parse_int(v, 0, 1000, &o->checks) != 0)
            return PERF_ERROR(err, "%s '%s': checked calls per size, 0 to 1000", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'd':
        if (parse_dtypes(v, o) != 0)
            return PERF_ERROR(err,
                              "%s '%s': not a type (int8 uint8 int32 uint32 int64 uint64 half "
                              "float16 bfloat16 float float32 double float64 f8e4m3 f8e5m2, all)",
                              given, v);
        return MACO_PERF_PARSE_RUN;
    case 'o':
        if (strcmp(v, "mulsum") == 0)
            return PERF_ERROR(err,
                              "%s mulsum: MACO has no pre-multiplied sum "
                              "(ncclRedOpCreatePreMulSum); use sum, prod, min, max, avg or all",
                              given);
        if (parse_ops(v, o) != 0)
            return PERF_ERROR(err, "%s '%s': not a reduction (sum prod min max avg, all)", given,
                              v);
        return MACO_PERF_PARSE_RUN;
    case 'r':
        if (parse_int(v, 0, 1 << 20, &o->root) != 0)
            return PERF_ERROR(err, "%s '%s': a root is a rank, 0 or more", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'G':
        if (parse_int(v, 0, 1000000, &o->graph) != 0)
            return PERF_ERROR(err, "%s '%s': graph replays, 0 (eager) to 1000000", given, v);
        return MACO_PERF_PARSE_RUN;
    case 'a':
        if (parse_int(v, 0, 3, &n) != 0)
            return PERF_ERROR(err, "%s '%s': 0 (rank 0), 1 (average), 2 (min) or 3 (max)", given,
                              v);
        o->average = (maco_perf_average_t)n;
        return MACO_PERF_PARSE_RUN;
    case 'R':
        if (parse_int(v, 0, 2, &n) != 0)
            return PERF_ERROR(err, "%s '%s': 0 (cudaMalloc), 1 or 2 (registered buffers)", given,
                              v);
        o->reg = n;
        return MACO_PERF_PARSE_RUN;
    case 'T':
        if (parse_int(v, 0, 1000000, &o->timeout_s) != 0)
            return PERF_ERROR(err, "%s '%s': a timeout in seconds, 0 or more", given, v);
        if (o->timeout_s == 0)
            PERF_NOTE(err,
                      "%s 0: MACO's waits on the GPU always have a deadline (MACO_DEVICE_TIMEOUT, "
                      "default 60s), which stays",
                      given);
        return MACO_PERF_PARSE_RUN;
    case 'J':
        o->json_path = v;
        PERF_NOTE(err,
                  "%s %s: writes maco-perf's JSON (one object per size and placement), not "
                  "nccl-tests' layout",
                  given, v);
        return MACO_PERF_PARSE_RUN;
    default:
        break;
    }
    *handled_p = 0;
    return MACO_PERF_PARSE_RUN;
}

/* The rest: nccl-tests' flags that MACO has no use for. Values that match what maco-perf does
 * anyway pass silently; others that change only nccl-tests' reporting are noted; those that
 * change what would be measured are refused. */
static maco_perf_parse_t apply_nccl_tests_flag(char flag, const char *given, const char *v,
                                               FILE *err)
{
    int n = 0;
    if (parse_int(v, -1000000, 1000000, &n) != 0)
        return PERF_ERROR(err, "%s '%s': an integer", given, v);
    switch (flag) {
    case 'p':
        if (n != 0)
            PERF_NOTE(err,
                      "%s %d ignored: parallel init is for several GPUs per process; "
                      "maco-perf has one",
                      given, n);
        break;
    case 'z':
        if (n != 0)
            return PERF_ERROR(err,
                              "%s %d: maco-perf times calls back to back without waiting or a "
                              "barrier between them (nccl-tests' -z 0); leave out -z or pass -z 0",
                              given, n);
        break;
    case 'y':
        if (n != 0)
            PERF_NOTE(err, "%s %d ignored: maco-perf launches on a stream of its own", given, n);
        break;
    case 'C':
        if (n != 0)
            PERF_NOTE(err,
                      "%s %d ignored: maco-perf reports GPU time between CUDA events, not "
                      "CPU time",
                      given, n);
        break;
    case 'S':
        if (n != 0)
            PERF_NOTE(err, "%s %d ignored: maco-perf prints no timestamps", given, n);
        break;
    case 'x':
        PERF_NOTE(err, "%s %d ignored: NCCL's CTA policy; maco-perf leaves NCCL's default", given,
                  n);
        break;
    case 'V':
        PERF_NOTE(err,
                  "%s %d ignored: CTAs of nccl-tests' device-API kernels, which maco-perf "
                  "does not have",
                  given, n);
        break;
    case 'D':
        if (n != 0)
            return PERF_ERROR(err,
                              "%s %d: nccl-tests' own device-API kernels are not part of "
                              "maco-perf; leave out -D or pass -D 0",
                              given, n);
        break;
    case 'M':
        if (n != 0)
            PERF_NOTE(err, "%s %d ignored: maco-perf prints no memory report", given, n);
        break;
    case 'u':
        if (n != 0)
            return PERF_ERROR(err,
                              "%s %d: maco-perf's buffers are not misaligned on request; leave "
                              "out -u or pass -u 0",
                              given, n);
        break;
    case 'I':
        if (n != 0)
            PERF_NOTE(err,
                      "%s %d ignored: maco-perf times all the timed calls together, not "
                      "each one",
                      given, n);
        break;
    case 'K':
        if (n != 0)
            PERF_NOTE(err, "%s %d ignored: no per-iteration timing to skip samples of (see -I)",
                      given, n);
        break;
    default:
        return PERF_ERROR(err, "unknown option %s (maco-perf --help lists them)", given);
    }
    return MACO_PERF_PARSE_RUN;
}

/* Applies one flag with its value. `given` is the flag as written, for messages. */
static maco_perf_parse_t apply_flag(char flag, const char *given, const char *v,
                                    maco_perf_opts_t *o, FILE *err)
{
    int handled = 0;
    maco_perf_parse_t r = apply_perf_flag(flag, given, v, o, err, &handled);
    return handled ? r : apply_nccl_tests_flag(flag, given, v, err);
}

static void perf_defaults(maco_perf_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->coll = MACO_COLLECTIVE_COUNT;
    o->min_bytes = 8;
    o->max_bytes = (size_t)128 << 20;
    o->factor = 2;
    o->step_bytes = (size_t)1 << 20;
    o->dtypes[0] = MACO_BFLOAT16;
    o->ndtypes = 1;
    o->ops[0] = MACO_SUM;
    o->nops = 1;
    o->iters = 20;
    o->agg = 1;
    o->warmup = 5;
    o->checks = 1;
    o->cycles = 1;
    o->placements = MACO_PERF_OUT_OF_PLACE | MACO_PERF_IN_PLACE;
    o->average = MACO_PERF_TIME_MAX;
    o->timeout_s = -1;
}

maco_perf_parse_t maco_perf_args_parse(int argc, char **argv, maco_perf_opts_t *o, FILE *out,
                                       FILE *err)
{
    perf_defaults(o);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            maco_perf_args_usage(out);
            return MACO_PERF_PARSE_HELP;
        }
    int placement_given = 0; /* 1: --inplace or --placement both, 2: --placement in */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == '\0') {
            if (o->coll != MACO_COLLECTIVE_COUNT)
                return PERF_ERROR(err, "unexpected argument '%s' (the collective is %s)", a,
                                  maco_collective_name(o->coll));
            if (parse_collective(a, &o->coll) != 0)
                return PERF_ERROR(err,
                                  "unknown collective '%s' (%s, or nccl-tests' program name "
                                  "such as all_reduce_perf)",
                                  a, PERF_COLLECTIVES);
            continue;
        }
        char flag = 0;
        const char *v = NULL;
        char given[64];
        if (a[1] == '-') {
            /* --name, --name VALUE or --name=VALUE */
            const char *eq = strchr(a, '=');
            size_t len = eq != NULL ? (size_t)(eq - a) : strlen(a);
            snprintf(given, sizeof(given), "%.*s", (int)(len < 63 ? len : 63), a);
            const char *name = given + 2;
            if (strcmp(name, "nccl") == 0 || strcmp(name, "inplace") == 0 ||
                strcmp(name, "dry-run") == 0) {
                if (eq != NULL)
                    return PERF_ERROR(err, "%s takes no value", given);
                if (strcmp(name, "nccl") == 0)
                    o->nccl = 1;
                else if (strcmp(name, "dry-run") == 0)
                    o->dry_run = 1;
                else {
                    o->placements = MACO_PERF_OUT_OF_PLACE | MACO_PERF_IN_PLACE;
                    placement_given = 1;
                }
                continue;
            }
            if (eq != NULL)
                v = eq + 1;
            else if (i + 1 < argc)
                v = argv[++i];
            else
                return PERF_ERROR(err, "%s needs a value", given);
            if (strcmp(name, "json") == 0) {
                o->json_path = v;
                continue;
            }
            if (strcmp(name, "placement") == 0) {
                if (strcmp(v, "both") == 0) {
                    o->placements = MACO_PERF_OUT_OF_PLACE | MACO_PERF_IN_PLACE;
                    placement_given = 1;
                } else if (strcmp(v, "out") == 0) {
                    o->placements = MACO_PERF_OUT_OF_PLACE;
                    placement_given = 0;
                } else if (strcmp(v, "in") == 0) {
                    o->placements = MACO_PERF_IN_PLACE;
                    placement_given = 2;
                } else
                    return PERF_ERROR(err, "%s '%s': both, out or in", given, v);
                continue;
            }
            for (size_t k = 0; k < sizeof(perf_long_flags) / sizeof(perf_long_flags[0]); k++)
                if (strcmp(name, perf_long_flags[k].name) == 0)
                    flag = perf_long_flags[k].flag;
            if (flag == 0)
                return PERF_ERROR(err, "unknown option %s (maco-perf --help lists them)", given);
        } else {
            /* -X VALUE or -XVALUE */
            flag = a[1];
            snprintf(given, sizeof(given), "-%c", flag);
            if (strchr(perf_value_flags, flag) == NULL)
                return PERF_ERROR(err, "unknown option %s (maco-perf --help lists them)", a);
            if (a[2] != '\0')
                v = a + 2;
            else if (i + 1 < argc)
                v = argv[++i];
            else
                return PERF_ERROR(err, "%s needs a value", given);
        }
        maco_perf_parse_t r = apply_flag(flag, given, v, o, err);
        if (r != MACO_PERF_PARSE_RUN)
            return r;
    }
    if (o->coll == MACO_COLLECTIVE_COUNT)
        return PERF_ERROR(err, "name a collective: %s (maco-perf --help)", PERF_COLLECTIVES);
    if ((long long)o->iters * o->agg > 100000000)
        return PERF_ERROR(err, "-n %d times -m %d is more than 1e8 calls per size", o->iters,
                          o->agg);
    if (o->min_bytes == 0 || o->max_bytes < o->min_bytes)
        return PERF_ERROR(err, "need 0 < -b (%zu) <= -e (%zu)", o->min_bytes, o->max_bytes);
    /* Collectives without a reduction run once per type, shown with op "none". */
    if (o->coll == MACO_COLL_ALLGATHER || o->coll == MACO_COLL_BROADCAST ||
        o->coll == MACO_COLL_ALLTOALL || o->coll == MACO_COLL_SENDRECV) {
        o->ops[0] = MACO_SUM;
        o->nops = 1;
    }
    /* All-to-all and send/recv have no in-place form. */
    if (o->coll == MACO_COLL_ALLTOALL || o->coll == MACO_COLL_SENDRECV) {
        if (placement_given == 2)
            return PERF_ERROR(err, "--placement in: %s has no in-place form",
                              maco_collective_name(o->coll));
        if (placement_given == 1)
            PERF_NOTE(err, "in place skipped: %s has no in-place form",
                      maco_collective_name(o->coll));
        o->placements = MACO_PERF_OUT_OF_PLACE;
    }
    if (o->reg == 1 && o->nccl)
        PERF_NOTE(err, "-R 1: NCCL's buffers are registered as symmetric windows (nccl-tests' "
                       "-R 2), not locally");
    if (o->agg > 1)
        PERF_NOTE(err,
                  "-m %d: each timed iteration issues %d calls one after another, not in one "
                  "group as nccl-tests does; the time is per call",
                  o->agg, o->agg);
    return MACO_PERF_PARSE_RUN;
}

double maco_perf_size_next(const maco_perf_opts_t *o, double size)
{
    return o->factor > 1.0 ? size * o->factor : size + (double)o->step_bytes;
}

int maco_perf_size_done(const maco_perf_opts_t *o, double size)
{
    return size > (double)o->max_bytes * 1.0000001;
}

void maco_perf_plan_print(const maco_perf_opts_t *o, FILE *f)
{
    static const char *const averages[] = { "rank 0's (-a 0)", "average (-a 1)", "smallest (-a 2)",
                                            "largest (-a 3)" };
    fprintf(f, "collective: %s\n", maco_collective_name(o->coll));
    int nsizes = 0;
    for (double sz = (double)o->min_bytes; !maco_perf_size_done(o, sz);
         sz = maco_perf_size_next(o, sz))
        nsizes++;
    if (o->factor > 1.0)
        fprintf(f, "sizes: %zu to %zu bytes, times %g: %d sizes\n", o->min_bytes, o->max_bytes,
                o->factor, nsizes);
    else
        fprintf(f, "sizes: %zu to %zu bytes, plus %zu: %d sizes\n", o->min_bytes, o->max_bytes,
                o->step_bytes, nsizes);
    fprintf(f, "datatypes:");
    for (int t = 0; t < o->ndtypes; t++)
        fprintf(f, " %s", maco_datatype_name(o->dtypes[t]));
    fprintf(f, "\nops:");
    int has_op = o->coll == MACO_COLL_ALLREDUCE || o->coll == MACO_COLL_REDUCE_SCATTER ||
                 o->coll == MACO_COLL_REDUCE;
    for (int k = 0; k < o->nops; k++)
        fprintf(f, " %s", has_op ? maco_redop_name(o->ops[k]) : "none");
    fprintf(f, "\nroot: %d\n", o->root);
    fprintf(f, "placements:%s%s\n", o->placements & MACO_PERF_OUT_OF_PLACE ? " out-of-place" : "",
            o->placements & MACO_PERF_IN_PLACE ? " in-place" : "");
    fprintf(f, "iterations: %d timed x %d call(s), %d warm-up, %d checked\n", o->iters, o->agg,
            o->warmup, o->checks);
    if (o->graph > 0)
        fprintf(f, "graph: %d replays\n", o->graph);
    else
        fprintf(f, "graph: no (eager)\n");
    fprintf(f, "cycles: %d%s\n", o->cycles, o->cycles == 0 ? " (until stopped)" : "");
    fprintf(f, "time over ranks: %s\n", averages[o->average]);
    if (o->timeout_s > 0)
        fprintf(f, "device timeout: %ds (MACO_DEVICE_TIMEOUT)\n", o->timeout_s);
    else
        fprintf(f, "device timeout: MACO_DEVICE_TIMEOUT's\n");
    fprintf(f, "buffers: %s\n", o->reg ? "registered (maco_mem_alloc)" : "cudaMalloc");
    fprintf(f, "nccl: %s\n", o->nccl ? "yes" : "no");
    fprintf(f, "json: %s\n", o->json_path != NULL ? o->json_path : "-");
}
