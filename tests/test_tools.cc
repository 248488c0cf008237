/*
 * test_tools.cc - maco-perf's command line and maco-info's output, on the CPU.
 *
 * maco-perf's parser (tools/perf_args.c) is called in-process: an nccl-tests command line
 * pasted as is, nccl-tests' long and attached forms, type and op names, the flags that are
 * noted (one line each) or refused (naming the flag), in place and out of place by default, and
 * --help anywhere. The built tools are then run as a user would: `--help` on standard output
 * with exit status 0, `--dry-run` without a GPU, maco-info's "built with" section against what
 * CMake configured (maco_build_info.h), and the no-GPU message of both naming the cause and the
 * next step (CUDA_VISIBLE_DEVICES="" hides every GPU where there are some).
 */
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "maco_build_info.h"
#include "maco_test.h"
#include "tools/perf_args.h"

namespace
{

using maco_test::RunShell;

/* One parse of `args` (the program name is added), with what it wrote. */
struct Parsed {
    maco_perf_parse_t result;
    maco_perf_opts_t opts;
    std::string out, err;
    /* The arguments, alive as long as opts: its strings (json_path...) point into them. Held
     * through a pointer so that moving a Parsed moves no string (short ones live inline). */
    std::shared_ptr<std::vector<std::string>> args;
};

Parsed Parse(std::vector<std::string> args_in)
{
    Parsed p;
    p.args = std::make_shared<std::vector<std::string>>(std::move(args_in));
    std::vector<std::string> &args = *p.args;
    args.insert(args.begin(), "maco-perf");
    std::vector<char *> argv;
    for (std::string &a : args)
        argv.push_back(&a[0]);
    argv.push_back(nullptr);
    char *out = nullptr, *err = nullptr;
    size_t out_len = 0, err_len = 0;
    FILE *fo = open_memstream(&out, &out_len);
    FILE *fe = open_memstream(&err, &err_len);
    p.result = maco_perf_args_parse((int)args.size(), argv.data(), &p.opts, fo, fe);
    fclose(fo);
    fclose(fe);
    p.out = out;
    p.err = err;
    free(out);
    free(err);
    return p;
}

int Lines(const std::string &s)
{
    int n = 0;
    for (char c : s)
        n += c == '\n';
    return n;
}

bool Has(const std::string &s, const std::string &sub)
{
    return s.find(sub) != std::string::npos;
}

class PerfArgs : public maco_test::Test
{
};

TEST_F(PerfArgs, PastedNcclTestsCommandLine)
{
    /* nccl-tests' README example with every flag at the value that matches maco-perf. */
    Parsed p = Parse({ "./build/all_reduce_perf",
                       "-b",
                       "8",
                       "-e",
                       "128M",
                       "-f",
                       "2",
                       "-g",
                       "1",
                       "-t",
                       "1",
                       "-z",
                       "0",
                       "-c",
                       "1",
                       "-n",
                       "20",
                       "-w",
                       "5",
                       "-a",
                       "1",
                       "-m",
                       "1",
                       "-N",
                       "1",
                       "-I",
                       "0",
                       "-K",
                       "0",
                       "-p",
                       "0",
                       "-y",
                       "0",
                       "-C",
                       "0",
                       "-S",
                       "0",
                       "-M",
                       "0",
                       "-u",
                       "0",
                       "-D",
                       "0",
                       "-d",
                       "float",
                       "-o",
                       "sum",
                       "-r",
                       "0",
                       "-G",
                       "0",
                       "-R",
                       "0" });
    ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN) << p.err;
    EXPECT_EQ(p.err, "") << "flags at values maco-perf honours print nothing";
    EXPECT_EQ(p.opts.coll, MACO_COLL_ALLREDUCE);
    EXPECT_EQ(p.opts.min_bytes, 8u);
    EXPECT_EQ(p.opts.max_bytes, (size_t)128 << 20);
    EXPECT_EQ(p.opts.factor, 2.0);
    ASSERT_EQ(p.opts.ndtypes, 1);
    EXPECT_EQ(p.opts.dtypes[0], MACO_FLOAT32);
    ASSERT_EQ(p.opts.nops, 1);
    EXPECT_EQ(p.opts.ops[0], MACO_SUM);
    EXPECT_EQ(p.opts.iters, 20);
    EXPECT_EQ(p.opts.warmup, 5);
    EXPECT_EQ(p.opts.checks, 1);
    EXPECT_EQ(p.opts.average, MACO_PERF_TIME_AVG);
    EXPECT_EQ(p.opts.placements, MACO_PERF_OUT_OF_PLACE | MACO_PERF_IN_PLACE);
}

TEST_F(PerfArgs, LongAndAttachedForms)
{
    Parsed p = Parse({ "-b8K",
                       "--maxbytes=1G",
                       "--stepfactor",
                       "4",
                       "--datatype",
                       "half",
                       "--op=max",
                       "--ngpus=1",
                       "--nthreads",
                       "1",
                       "--iters=7",
                       "--warmup_iters",
                       "2",
                       "--agg_iters=3",
                       "--run_cycles",
                       "2",
                       "--average=0",
                       "--root",
                       "1",
                       "--cudagraph=5",
                       "--check",
                       "0",
                       "--timeout",
                       "30",
                       "reduce_scatter" });
    ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN) << p.err;
    EXPECT_EQ(p.opts.coll, MACO_COLL_REDUCE_SCATTER);
    EXPECT_EQ(p.opts.min_bytes, 8192u);
    EXPECT_EQ(p.opts.max_bytes, (size_t)1 << 30);
    EXPECT_EQ(p.opts.factor, 4.0);
    EXPECT_EQ(p.opts.dtypes[0], MACO_FLOAT16);
    EXPECT_EQ(p.opts.ops[0], MACO_MAX);
    EXPECT_EQ(p.opts.iters, 7);
    EXPECT_EQ(p.opts.warmup, 2);
    EXPECT_EQ(p.opts.agg, 3);
    EXPECT_EQ(p.opts.cycles, 2);
    EXPECT_EQ(p.opts.average, MACO_PERF_TIME_RANK0);
    EXPECT_EQ(p.opts.root, 1);
    EXPECT_EQ(p.opts.graph, 5);
    EXPECT_EQ(p.opts.checks, 0);
    EXPECT_EQ(p.opts.timeout_s, 30);
    /* -m 3 is honoured with a note that the calls are not grouped. */
    EXPECT_EQ(Lines(p.err), 1) << p.err;
    EXPECT_TRUE(Has(p.err, "-m 3")) << p.err;
}

TEST_F(PerfArgs, NcclTestsProgramNames)
{
    const std::pair<const char *, maco_collective_t> names[] = {
        { "all_reduce_perf", MACO_COLL_ALLREDUCE },
        { "./build/all_gather_perf", MACO_COLL_ALLGATHER },
        { "/opt/nccl-tests/build/reduce_scatter_perf", MACO_COLL_REDUCE_SCATTER },
        { "broadcast_perf", MACO_COLL_BROADCAST },
        { "reduce_perf", MACO_COLL_REDUCE },
        { "alltoall_perf", MACO_COLL_ALLTOALL },
        { "sendrecv_perf", MACO_COLL_SENDRECV },
        { "allreduce", MACO_COLL_ALLREDUCE },
        { "reduce_scatter", MACO_COLL_REDUCE_SCATTER },
    };
    for (const auto &n : names) {
        Parsed p = Parse({ n.first });
        ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN) << n.first << ": " << p.err;
        EXPECT_EQ(p.opts.coll, n.second) << n.first;
    }
    Parsed p = Parse({ "./build/gather_perf" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "gather_perf")) << p.err;
    p = Parse({ "-b", "8" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "name a collective")) << p.err;
}

TEST_F(PerfArgs, TypeNames)
{
    const std::pair<const char *, maco_datatype_t> names[] = {
        { "int8", MACO_INT8 },         { "uint8", MACO_UINT8 },       { "int32", MACO_INT32 },
        { "uint32", MACO_UINT32 },     { "int64", MACO_INT64 },       { "uint64", MACO_UINT64 },
        { "half", MACO_FLOAT16 },      { "float16", MACO_FLOAT16 },   { "float", MACO_FLOAT32 },
        { "float32", MACO_FLOAT32 },   { "double", MACO_FLOAT64 },    { "float64", MACO_FLOAT64 },
        { "bfloat16", MACO_BFLOAT16 }, { "f8e4m3", MACO_FP8_E4M3 },   { "f8e5m2", MACO_FP8_E5M2 },
        { "fp8_e4m3", MACO_FP8_E4M3 }, { "fp8_e5m2", MACO_FP8_E5M2 },
    };
    for (const auto &n : names) {
        Parsed p = Parse({ "allreduce", "-d", n.first });
        ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN) << n.first << ": " << p.err;
        ASSERT_EQ(p.opts.ndtypes, 1) << n.first;
        EXPECT_EQ(p.opts.dtypes[0], n.second) << n.first;
    }
    Parsed p = Parse({ "allreduce", "-d", "all" });
    ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN);
    EXPECT_EQ(p.opts.ndtypes, MACO_DATATYPE_COUNT);
    p = Parse({ "allreduce", "-d", "float128" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "-d 'float128'")) << p.err;
}

TEST_F(PerfArgs, OpNames)
{
    const std::pair<const char *, maco_redop_t> names[] = {
        { "sum", MACO_SUM }, { "prod", MACO_PROD }, { "min", MACO_MIN },
        { "max", MACO_MAX }, { "avg", MACO_AVG },
    };
    for (const auto &n : names) {
        Parsed p = Parse({ "allreduce", "-o", n.first });
        ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN) << n.first << ": " << p.err;
        ASSERT_EQ(p.opts.nops, 1);
        EXPECT_EQ(p.opts.ops[0], n.second) << n.first;
    }
    Parsed p = Parse({ "allreduce", "-o", "all" });
    ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN);
    EXPECT_EQ(p.opts.nops, MACO_REDOP_COUNT);
    p = Parse({ "allreduce", "-o", "mulsum" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_EQ(Lines(p.err), 1) << p.err;
    EXPECT_TRUE(Has(p.err, "-o mulsum")) << p.err;
}

TEST_F(PerfArgs, TwoGpusPerProcessIsRefusedNamingTheFlag)
{
    Parsed p = Parse({ "all_reduce_perf", "-b", "8", "-g", "2" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_EQ(Lines(p.err), 1) << p.err;
    EXPECT_TRUE(Has(p.err, "-g 2")) << p.err;
    EXPECT_TRUE(Has(p.err, "one GPU per process")) << p.err;
    p = Parse({ "all_reduce_perf", "--ngpus=8" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "--ngpus 8")) << p.err;
    p = Parse({ "all_reduce_perf", "-t", "2" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "-t 2")) << p.err;
    EXPECT_TRUE(Has(p.err, "maco-run -n 2")) << p.err;
}

TEST_F(PerfArgs, HelpAnywhere)
{
    const std::vector<std::vector<std::string>> lines = {
        { "--help" },
        { "-h" },
        { "allreduce", "--help" },
        { "allreduce", "-b", "8", "-e", "1G", "-h" },
        { "all_reduce_perf", "-g", "2", "--help" },
        { "--help", "no_such_collective" },
    };
    for (const auto &args : lines) {
        Parsed p = Parse(args);
        EXPECT_EQ(p.result, MACO_PERF_PARSE_HELP) << args.back();
        EXPECT_TRUE(Has(p.out, "usage: maco-perf")) << p.out;
        EXPECT_EQ(p.err, "");
    }
}

TEST_F(PerfArgs, BothPlacementsByDefault)
{
    Parsed p = Parse({ "allreduce" });
    EXPECT_EQ(p.opts.placements, MACO_PERF_OUT_OF_PLACE | MACO_PERF_IN_PLACE);
    p = Parse({ "allreduce", "--placement", "out" });
    EXPECT_EQ(p.opts.placements, MACO_PERF_OUT_OF_PLACE);
    p = Parse({ "allreduce", "--placement=in" });
    EXPECT_EQ(p.opts.placements, MACO_PERF_IN_PLACE);
    p = Parse({ "allreduce", "--placement", "out", "--inplace" });
    EXPECT_EQ(p.opts.placements, MACO_PERF_OUT_OF_PLACE | MACO_PERF_IN_PLACE);
    /* No in-place form: out of place only, silently unless in place was asked for. */
    p = Parse({ "alltoall" });
    EXPECT_EQ(p.opts.placements, MACO_PERF_OUT_OF_PLACE);
    EXPECT_EQ(p.err, "");
    p = Parse({ "sendrecv", "--inplace" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_RUN);
    EXPECT_EQ(p.opts.placements, MACO_PERF_OUT_OF_PLACE);
    EXPECT_EQ(Lines(p.err), 1) << p.err;
    p = Parse({ "alltoall", "--placement", "in" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "no in-place form")) << p.err;
}

TEST_F(PerfArgs, FlagsThatDoNotApplyGetOneLineEach)
{
    const std::vector<std::vector<std::string>> noted = {
        { "-p", "1" },        { "-y", "1" }, { "-C", "1" },           { "-S", "1" }, { "-x", "1" },
        { "-V", "8" },        { "-M", "1" }, { "-I", "1" },           { "-K", "1" }, { "-T", "0" },
        { "-J", "out.json" }, { "-m", "4" }, { "--nccl", "-R", "1" },
    };
    for (const auto &flag : noted) {
        std::vector<std::string> args = { "allreduce" };
        args.insert(args.end(), flag.begin(), flag.end());
        Parsed p = Parse(args);
        EXPECT_EQ(p.result, MACO_PERF_PARSE_RUN) << flag[0] << ": " << p.err;
        EXPECT_EQ(Lines(p.err), 1) << flag[0] << ": " << p.err;
        EXPECT_EQ(p.err.rfind("maco-perf: note: ", 0), 0u) << p.err;
        EXPECT_TRUE(Has(p.err, flag[flag.size() - 2] + " " + flag.back())) << p.err;
    }
    /* Values that would change what is measured are refused, naming the flag. */
    const std::vector<std::vector<std::string>> refused = {
        { "-z", "1" }, { "-u", "4" }, { "-D", "1" }, { "-t", "8" }, { "-g", "4" },
    };
    for (const auto &flag : refused) {
        Parsed p = Parse({ "allreduce", flag[0], flag[1] });
        EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE) << flag[0];
        EXPECT_EQ(Lines(p.err), 1) << p.err;
        EXPECT_TRUE(Has(p.err, flag[0] + " " + flag[1])) << p.err;
    }
    Parsed p = Parse({ "allreduce", "-q", "1" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "unknown option -q")) << p.err;
    p = Parse({ "allreduce", "-b" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
    EXPECT_TRUE(Has(p.err, "-b needs a value")) << p.err;
}

TEST_F(PerfArgs, MacoFlagsStillWork)
{
    /* As tests/CMakeLists.txt and scripts/ call it. */
    Parsed p = Parse({ "allreduce", "-b",  "4",  "-e",  "4M", "-f", "32",     "-n",
                       "2",         "-w",  "1",  "-c",  "2",  "-G", "2",      "--inplace",
                       "-d",        "all", "-o", "all", "-R", "1",  "--json", "x.json" });
    ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN) << p.err;
    EXPECT_EQ(p.err, "");
    EXPECT_EQ(p.opts.min_bytes, 4u);
    EXPECT_EQ(p.opts.max_bytes, (size_t)4 << 20);
    EXPECT_EQ(p.opts.factor, 32.0);
    EXPECT_EQ(p.opts.graph, 2);
    EXPECT_EQ(p.opts.reg, 1);
    EXPECT_EQ(std::string(p.opts.json_path), "x.json");
    EXPECT_EQ(p.opts.average, MACO_PERF_TIME_MAX);
}

TEST_F(PerfArgs, SizeSteps)
{
    Parsed p = Parse({ "allreduce", "-b", "1M", "-e", "4M", "-f", "1", "-i", "1M" });
    ASSERT_EQ(p.result, MACO_PERF_PARSE_RUN) << p.err;
    std::vector<double> sizes;
    for (double s = (double)p.opts.min_bytes; !maco_perf_size_done(&p.opts, s);
         s = maco_perf_size_next(&p.opts, s))
        sizes.push_back(s);
    EXPECT_EQ(sizes, (std::vector<double>{ 1 << 20, 2 << 20, 3 << 20, 4 << 20 }));
    p = Parse({ "allreduce", "-b", "8", "-e", "64" });
    sizes.clear();
    for (double s = (double)p.opts.min_bytes; !maco_perf_size_done(&p.opts, s);
         s = maco_perf_size_next(&p.opts, s))
        sizes.push_back(s);
    EXPECT_EQ(sizes, (std::vector<double>{ 8, 16, 32, 64 }));
    p = Parse({ "allreduce", "-b", "64", "-e", "8" });
    EXPECT_EQ(p.result, MACO_PERF_PARSE_USAGE);
}

/* ------------------------------------------------------------------ the built tools */

class Tools : public maco_test::Test
{
};

const std::string kPerf = MACO_PERF_PATH;
const std::string kInfo = MACO_INFO_PATH;

TEST_F(Tools, PerfHelpOnStdout)
{
    std::string out;
    EXPECT_EQ(RunShell(kPerf + " allreduce --help 2>/dev/null", &out), 0);
    EXPECT_TRUE(Has(out, "usage: maco-perf")) << out;
    EXPECT_EQ(RunShell(kPerf + " allreduce -b 8 --help 2>&1 >/dev/null", &out), 0);
    EXPECT_EQ(out, "") << "--help writes nothing on stderr";
}

TEST_F(Tools, PerfDryRunOfAPastedNcclTestsLine)
{
    std::string out;
    int rc =
        RunShell(kPerf + " ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 1 -t 1 -z 0 -d bfloat16 "
                         "-o sum -n 20 -w 5 -c 1 --dry-run 2>&1",
                 &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_TRUE(Has(out, "collective: allreduce\n")) << out;
    EXPECT_TRUE(Has(out, "sizes: 8 to 134217728 bytes, times 2: 25 sizes\n")) << out;
    EXPECT_TRUE(Has(out, "datatypes: bfloat16\n")) << out;
    EXPECT_TRUE(Has(out, "placements: out-of-place in-place\n")) << out;
    EXPECT_FALSE(Has(out, "maco-perf:")) << "no note or error expected: " << out;
}

TEST_F(Tools, PerfRefusesTwoGpus)
{
    std::string out;
    EXPECT_EQ(RunShell(kPerf + " all_reduce_perf -b 8 -e 1G -g 2 2>&1", &out), 2);
    EXPECT_TRUE(Has(out, "-g 2")) << out;
    EXPECT_TRUE(Has(out, "one GPU per process")) << out;
}

/* The no-GPU text names the cause and then the next step (maco_cuda_device_count). */
void ExpectCauseAndNextStep(const std::string &out)
{
    bool no_driver = Has(out, "no NVIDIA driver") && Has(out, "install the NVIDIA driver");
    bool none_visible = Has(out, "no CUDA device is visible") &&
                        Has(out, "unset CUDA_VISIBLE_DEVICES or name devices");
    EXPECT_TRUE(no_driver || none_visible) << out;
}

TEST_F(Tools, PerfWithoutGpuSaysWhyAndWhatToDo)
{
    std::string out;
    // 77: skipped, not bad usage (2) nor a failure (1), so that scripts tell them apart.
    EXPECT_EQ(RunShell("CUDA_VISIBLE_DEVICES= " + kPerf + " allreduce -b 8 -e 8 2>&1", &out), 77);
    EXPECT_TRUE(Has(out, "maco-perf: no usable CUDA device: ")) << out;
    ExpectCauseAndNextStep(out);
    EXPECT_TRUE(Has(out, "maco-info")) << out;
}

TEST_F(Tools, InfoHelpOnStdout)
{
    std::string out;
    EXPECT_EQ(RunShell(kInfo + " --help 2>/dev/null", &out), 0);
    EXPECT_TRUE(Has(out, "usage: maco-info")) << out;
    EXPECT_EQ(RunShell(kInfo + " -h 2>&1 >/dev/null", &out), 0);
    EXPECT_EQ(out, "");
    EXPECT_EQ(RunShell(kInfo + " --no-such-flag 2>/dev/null", &out), 2);
}

/* The line of `part` in maco-info's "built with" section. */
std::string PartLine(const std::string &out, const std::string &part)
{
    size_t at = out.find("\n  " + part);
    if (at == std::string::npos)
        return "";
    size_t end = out.find('\n', at + 1);
    return out.substr(at + 1, end - at - 1);
}

TEST_F(Tools, InfoBuiltWithSection)
{
    std::string out;
    ASSERT_EQ(RunShell("CUDA_VISIBLE_DEVICES= " + kInfo, &out), 0);
    EXPECT_TRUE(Has(out, "\nbuilt with:\n")) << out;
    const struct {
        const char *part;
        int built;
    } parts[] = {
        { "IB verbs transport", MACO_BUILT_IB },
        { "NCCL-compatible libnccl.so.2", MACO_BUILT_NCCL },
        { "GEMM tiles through cuBLASDx", MACO_BUILT_CUBLASDX },
        { "GEMM tiles through SM90 GMMA", MACO_BUILT_GMMA },
        { "Python bindings", MACO_BUILT_PYTHON },
    };
    for (const auto &p : parts) {
        std::string line = PartLine(out, p.part);
        ASSERT_NE(line, "") << p.part << " missing from:\n" << out;
        /* "built: <what>" or "not built: <why>", as CMake configured it. */
        EXPECT_EQ(Has(line, " not built: "), p.built == 0) << line;
        size_t at = line.find(" built: ");
        ASSERT_NE(at, std::string::npos) << line;
        EXPECT_GT(line.size(), at + 9) << "nothing after built: " << line;
    }
    EXPECT_TRUE(Has(out, "CUDA architectures")) << out;
    EXPECT_TRUE(Has(out, "CUDA devices: none usable: ")) << out;
    ExpectCauseAndNextStep(out);
}

} // namespace
