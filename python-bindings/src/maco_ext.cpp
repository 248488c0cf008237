/*
 * maco_ext.cpp - the extension module maco._maco: a thin layer over MACO's public C API.
 *
 * Buffers and streams cross this layer as integers (device addresses, cudaStream_t values);
 * the pure-Python package (maco/_tensor.py) turns tensors into them. Every call that can block
 * or launch work releases the GIL. A failing MACO call raises the package's exception for its
 * status (maco/_errors.py) with the message MACO logged for it on this thread (held back from
 * MACO's log, so that it appears once), else the communicator's first error, else the status
 * text.
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <maco/maco.h>

namespace nb = nanobind;

namespace
{

/* ------------------------------------------------------------------ errors */

/* The ERROR lines MACO logs on this thread while a call of this module runs. MACO holds them
 * back from its log during the call (maco_log_set_error_capture), so that an error appears
 * once: in the exception raised for the call. Lines the exception does not carry are written to
 * the log when the call ends (Capture's destructor). */
thread_local std::vector<std::string> tl_error_lines;
thread_local bool tl_capturing = false;
thread_local bool tl_raised = false; /* the first captured line went into an exception */

void log_handler(maco_log_level_t level, const char *line, void *)
{
    if (level != MACO_LOG_ERROR || !tl_capturing || line == nullptr)
        return;
    tl_error_lines.emplace_back(line);
}

/* "host:pid:tid [rank] ERROR subsys: text (status)\n" -> "text (status)", and its subsystem. */
std::string strip_log_prefix(const std::string &line, std::string *subsys = nullptr)
{
    std::string text = line;
    size_t at = text.find("] ERROR ");
    if (at != std::string::npos) {
        size_t colon = text.find(": ", at);
        if (colon != std::string::npos) {
            if (subsys != nullptr)
                *subsys = text.substr(at + 8, colon - (at + 8));
            text = text.substr(colon + 2);
        }
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
        text.pop_back();
    return text;
}

struct StatusError {
    int status;
    std::string message;
};

/* One call's capture: nested captures (a call made while another is reported) keep theirs. */
class Capture
{
  public:
    Capture()
        : saved_lines_(std::move(tl_error_lines)), saved_capturing_(tl_capturing),
          saved_raised_(tl_raised), saved_mode_(maco_log_set_error_capture(1))
    {
        tl_error_lines.clear();
        tl_capturing = true;
        tl_raised = false;
    }
    /* Writes the lines no exception carries, then restores the outer capture. */
    ~Capture()
    {
        maco_log_set_error_capture(saved_mode_);
        tl_capturing = false;
        for (size_t i = tl_raised ? 1 : 0; i < tl_error_lines.size(); i++) {
            std::string subsys;
            std::string text = strip_log_prefix(tl_error_lines[i], &subsys);
            maco_log_write(MACO_LOG_ERROR, subsys.c_str(), "%s", text.c_str());
        }
        tl_error_lines = std::move(saved_lines_);
        tl_capturing = saved_capturing_;
        tl_raised = saved_raised_;
    }
    Capture(const Capture &) = delete;
    Capture &operator=(const Capture &) = delete;

  private:
    std::vector<std::string> saved_lines_;
    bool saved_capturing_;
    bool saved_raised_;
    int saved_mode_;
};

[[noreturn]] void raise_status(maco_status_t st, maco_comm_t comm, const char *call)
{
    std::string msg;
    if (tl_capturing && !tl_error_lines.empty()) {
        msg = strip_log_prefix(tl_error_lines.front());
        tl_raised = true;
    }
    if (msg.empty() && comm != nullptr)
        msg = maco_comm_get_last_error(comm);
    if (msg.empty())
        msg = maco_log_last_error(); /* errors that leave the communicator usable */
    if (msg.empty())
        msg = std::string(call) + ": " + maco_status_string(st);
    throw StatusError{ static_cast<int>(st), msg };
}

/* Runs f() (a MACO call) without the GIL and raises on a failed status. */
template <class F> void checked(const char *call, maco_comm_t comm, F &&f)
{
    Capture capture;
    maco_status_t st;
    {
        nb::gil_scoped_release release;
        st = f();
    }
    if (st != MACO_OK)
        raise_status(st, comm, call);
}

/* ------------------------------------------------------------------ communicator state */

/* Owns a communicator and, when this module created it, its bootstrap. Shared by the Comm
 * object, its registrations and the memory of maco.empty(), so the communicator outlives
 * every buffer and registration made with it. */
struct CommState {
    maco_comm_t comm = nullptr;
    maco_bootstrap_t bs = nullptr; /* owned; NULL when the communicator owns its bootstrap */

    CommState() = default;
    CommState(const CommState &) = delete;
    CommState &operator=(const CommState &) = delete;
    /* Runs where the last owner lets go: Comm.close() (without the GIL), or the garbage
     * collection of the Comm, a registration or a maco.empty tensor. Touches no Python. */
    ~CommState()
    {
        if (comm != nullptr)
            maco_comm_destroy(comm);
        if (bs != nullptr)
            maco_bootstrap_destroy(bs);
    }
};

class Comm
{
  public:
    explicit Comm(std::shared_ptr<CommState> s) : st(std::move(s)) {}

    maco_comm_t get() const
    {
        if (!st || st->comm == nullptr)
            throw StatusError{ MACO_ERR_INVALID_USAGE, "the communicator is closed" };
        return st->comm;
    }

    int query(maco_status_t (*fn)(maco_comm_t, int *), const char *name) const
    {
        int v = 0;
        maco_comm_t c = get();
        Capture capture;
        maco_status_t s = fn(c, &v);
        if (s != MACO_OK)
            raise_status(s, c, name);
        return v;
    }

    /* maco_comm_destroy waits for the device (bounded): not while holding the GIL. */
    void close()
    {
        std::shared_ptr<CommState> last = std::move(st);
        nb::gil_scoped_release release;
        last.reset();
    }

    bool closed() const
    {
        return !st;
    }

    std::shared_ptr<CommState> st;
};

Comm comm_from_unique_id(nb::bytes id, int rank, int nranks, int device, int timeout_ms)
{
    if (id.size() != MACO_UNIQUE_ID_BYTES)
        throw nb::value_error(("unique_id: expected " + std::to_string(MACO_UNIQUE_ID_BYTES) +
                               " bytes, got " + std::to_string(id.size()))
                                  .c_str());
    maco_unique_id_t uid;
    std::memcpy(uid.bytes, id.c_str(), MACO_UNIQUE_ID_BYTES);
    auto state = std::make_shared<CommState>();
    checked("maco_bootstrap_create", nullptr,
            [&] { return maco_bootstrap_create(&uid, rank, nranks, timeout_ms, &state->bs); });
    checked("maco_comm_create", nullptr,
            [&] { return maco_comm_create(state->bs, device, &state->comm); });
    return Comm(state);
}

Comm comm_from_env(int device)
{
    auto state = std::make_shared<CommState>();
    if (device < 0) {
        checked("maco_comm_init_from_env", nullptr,
                [&] { return maco_comm_init_from_env(&state->comm); });
    } else {
        checked("maco_bootstrap_create_from_env", nullptr,
                [&] { return maco_bootstrap_create_from_env(&state->bs); });
        checked("maco_comm_create", nullptr,
                [&] { return maco_comm_create(state->bs, device, &state->comm); });
    }
    return Comm(state);
}

nb::bytes unique_id_create()
{
    maco_unique_id_t uid;
    checked("maco_unique_id_create", nullptr, [&] { return maco_unique_id_create(&uid); });
    return nb::bytes(reinterpret_cast<const char *>(uid.bytes), MACO_UNIQUE_ID_BYTES);
}

maco_bootstrap_t comm_bootstrap(const Comm &c)
{
    maco_bootstrap_t bs = nullptr;
    maco_comm_t comm = c.get();
    Capture capture;
    maco_status_t s = maco_comm_get_bootstrap(comm, &bs);
    if (s != MACO_OK)
        raise_status(s, comm, "maco_comm_get_bootstrap");
    return bs;
}

/* ------------------------------------------------------------------ pointers */

void *ptr(uintptr_t p)
{
    return reinterpret_cast<void *>(p);
}

maco_stream_t stream_of(uintptr_t s)
{
    return reinterpret_cast<maco_stream_t>(s);
}

maco_datatype_t dtype_of(int d)
{
    if (d < 0 || d >= MACO_DATATYPE_COUNT)
        throw nb::value_error(
            ("datatype: " + std::to_string(d) + " is not a MACO datatype").c_str());
    return static_cast<maco_datatype_t>(d);
}

maco_redop_t op_of(int o)
{
    if (o < 0 || o >= MACO_REDOP_COUNT)
        throw nb::value_error(("op: " + std::to_string(o) + " is not a MACO reduction").c_str());
    return static_cast<maco_redop_t>(o);
}

/* ------------------------------------------------------------------ registrations */

class Mem
{
  public:
    Mem(std::shared_ptr<CommState> s, maco_mem_t m, uintptr_t p, size_t n)
        : st(std::move(s)), mem(m), address(p), bytes(n)
    {
    }
    Mem(const Mem &) = delete;
    Mem &operator=(const Mem &) = delete;
    ~Mem()
    {
        release();
    }

    void deregister()
    {
        if (mem == nullptr)
            return;
        maco_comm_t comm = st ? st->comm : nullptr;
        maco_mem_t m = mem;
        mem = nullptr;
        checked("maco_mem_deregister", comm, [&] { return maco_mem_deregister(m); });
        st.reset();
    }

    void release() noexcept
    {
        if (mem != nullptr) {
            maco_mem_deregister(mem);
            mem = nullptr;
        }
        st.reset();
    }

    std::shared_ptr<CommState> st;
    maco_mem_t mem;
    uintptr_t address;
    size_t bytes;
};

/* ------------------------------------------------------------------ plans */

/* A loaded execution plan (maco_plan_t); keeps its communicator alive. destroy() waits for
 * the device (maco_plan_destroy synchronises), so it runs without the GIL. */
class Plan
{
  public:
    Plan(std::shared_ptr<CommState> s, maco_plan_t p) : st(std::move(s)), plan(p) {}
    Plan(const Plan &) = delete;
    Plan &operator=(const Plan &) = delete;
    ~Plan()
    {
        if (plan != nullptr) {
            nb::gil_scoped_release release;
            maco_plan_destroy(plan);
        }
    }

    maco_plan_t get() const
    {
        if (plan == nullptr)
            throw StatusError{ MACO_ERR_INVALID_USAGE, "the plan is destroyed" };
        return plan;
    }

    void destroy()
    {
        if (plan == nullptr)
            return;
        maco_plan_t p = plan;
        plan = nullptr;
        maco_comm_t comm = st ? st->comm : nullptr;
        checked("maco_plan_destroy", comm, [&] { return maco_plan_destroy(p); });
        st.reset();
    }

    std::shared_ptr<CommState> st;
    maco_plan_t plan;
};

/* ------------------------------------------------------------------ persistent kernels */

/* A task graph, the memory channels its fused operators use, and the persistent kernel made
 * from it (maco/persistent.h). The Python class maco.PersistentKernel builds on it. */
class PKernel
{
  public:
    explicit PKernel(std::shared_ptr<CommState> s) : st(std::move(s))
    {
        maco_status_t r = maco_task_graph_create(&graph);
        if (r != MACO_OK)
            raise_status(r, st->comm, "maco_task_graph_create");
    }
    PKernel(const PKernel &) = delete;
    PKernel &operator=(const PKernel &) = delete;
    ~PKernel()
    {
        nb::gil_scoped_release nogil; /* maco_persistent_kernel_destroy blocks (as ~Plan) */
        release();
    }

    maco_comm_t comm() const
    {
        if (!st || st->comm == nullptr)
            throw StatusError{ MACO_ERR_INVALID_USAGE, "the persistent kernel is closed" };
        return st->comm;
    }
    maco_task_graph_t g() const
    {
        if (graph == nullptr)
            throw StatusError{ MACO_ERR_INVALID_USAGE,
                               "the task graph is compiled (or closed): no more tasks" };
        return graph;
    }
    maco_persistent_kernel_t k() const
    {
        if (kernel == nullptr)
            throw StatusError{ MACO_ERR_INVALID_USAGE, "the persistent kernel is not compiled" };
        return kernel;
    }

    int add_task(const nb::dict &d);

    int ntasks() const
    {
        int n = 0;
        maco_task_graph_t gr = g();
        checked("maco_task_graph_get_ntasks", comm(),
                [&] { return maco_task_graph_get_ntasks(gr, &n); });
        return n;
    }

    void add_dependency(int task, int depends_on)
    {
        maco_task_graph_t gr = g();
        checked("maco_task_graph_add_dependency", comm(),
                [&] { return maco_task_graph_add_dependency(gr, task, depends_on); });
    }

    /* Registers `bytes` at `scratch` (device memory of this rank), imports every peer's
     * (collective: bootstrap allgather of the handles) and makes a memory channel to each
     * peer over them; returns the graph's channel index per rank (-1 for this rank). */
    std::vector<int> setup_channels(uintptr_t scratch, size_t bytes);

    int add_fused(int kind, const std::vector<int> &channels, const std::vector<int> &out_channels,
                  uintptr_t a, uintptr_t b, uintptr_t out, uintptr_t scratch, uint32_t m,
                  uint32_t n, uint32_t kk, int out_type, const std::string &name);

    /* Creates the kernel (validates and uploads the graph); the graph is freed then. */
    void compile(int workers, int schedulers, int comm_workers, int threads, bool profile);

    void launch(uintptr_t stream)
    {
        maco_persistent_kernel_t kk = k();
        checked("maco_persistent_kernel_launch", comm(),
                [&] { return maco_persistent_kernel_launch(kk, stream_of(stream)); });
    }

    nb::dict config() const;

    /* (start_ns, end_ns, sm, cta) per task of the last profiled launch. */
    std::vector<std::vector<uint64_t>> profile(size_t ntasks) const;

    void write_trace(const std::string &path) const
    {
        maco_persistent_kernel_t kk = k();
        checked("maco_persistent_kernel_write_trace", comm(),
                [&] { return maco_persistent_kernel_write_trace(kk, path.c_str()); });
    }

    std::string summary() const;

    void close()
    {
        nb::gil_scoped_release nogil;
        release();
    }

  private:
    void release() noexcept
    {
        if (kernel != nullptr) {
            maco_persistent_kernel_destroy(kernel);
            kernel = nullptr;
        }
        if (graph != nullptr) {
            maco_task_graph_destroy(graph);
            graph = nullptr;
        }
        for (auto ch : chans)
            maco_memory_channel_destroy(ch);
        chans.clear();
        for (auto m : mems)
            maco_mem_deregister(m);
        mems.clear();
        st.reset();
    }

    std::shared_ptr<CommState> st;
    maco_task_graph_t graph = nullptr;
    maco_persistent_kernel_t kernel = nullptr;
    std::vector<maco_memory_channel_t> chans;
    std::vector<maco_mem_t> mems;
};

/* PKernel's longer members, defined here so the class reads as its interface. */

int PKernel::add_task(const nb::dict &d)
{
    /* maco_task_t's fields (maco/persistent.h); another key is a typo that would
     * otherwise leave its field 0. */
    static const char *const fields[] = {
        "type", "role",       "datatype",   "channel",  "count",  "alpha",  "out", "a",
        "b",    "src_offset", "dst_offset", "rows",     "ld_in",  "ld_out", "m",   "n",
        "k",    "ldc",        "tile_row",   "tile_col", "tile_n", "name"
    };
    for (auto item : d) {
        std::string key = nb::cast<std::string>(item.first);
        bool known = false;
        for (const char *f : fields)
            known = known || key == f;
        if (!known)
            throw nb::value_error(("add_task: unknown field '" + key +
                                   "' (maco_task_t has type, role, datatype, channel, count, "
                                   "alpha, out, a, b, src_offset, dst_offset, rows, ld_in, "
                                   "ld_out, m, n, k, ldc, tile_row, tile_col, tile_n, "
                                   "name)")
                                      .c_str());
    }
    maco_task_t t{};
    auto u64 = [&](const char *key) -> uint64_t {
        return d.contains(key) ? nb::cast<uint64_t>(d[key]) : 0;
    };
    t.type = (maco_task_type_t)u64("type");
    t.role = (maco_task_role_t)u64("role");
    t.datatype = (maco_datatype_t)u64("datatype");
    t.channel = (uint32_t)u64("channel");
    t.count = u64("count");
    t.alpha = d.contains("alpha") ? nb::cast<float>(d["alpha"]) : 0.0f;
    t.out = ptr((uintptr_t)u64("out"));
    t.a = ptr((uintptr_t)u64("a"));
    t.b = ptr((uintptr_t)u64("b"));
    t.src_offset = u64("src_offset");
    t.dst_offset = u64("dst_offset");
    t.rows = (uint32_t)u64("rows");
    t.ld_in = (uint32_t)u64("ld_in");
    t.ld_out = (uint32_t)u64("ld_out");
    t.m = (uint32_t)u64("m");
    t.n = (uint32_t)u64("n");
    t.k = (uint32_t)u64("k");
    t.ldc = (uint32_t)u64("ldc");
    t.tile_row = (uint32_t)u64("tile_row");
    t.tile_col = (uint32_t)u64("tile_col");
    t.tile_n = (uint32_t)u64("tile_n");
    std::string name = d.contains("name") ? nb::cast<std::string>(d["name"]) : std::string();
    t.name = name.empty() ? nullptr : name.c_str();
    int id = -1;
    maco_task_graph_t gr = g();
    checked("maco_task_graph_add_task", comm(),
            [&] { return maco_task_graph_add_task(gr, &t, &id); });
    return id;
}

std::vector<int> PKernel::setup_channels(uintptr_t scratch, size_t bytes)
{
    maco_comm_t c = comm();
    maco_task_graph_t gr = g();
    int rank = 0, n = 0;
    maco_comm_get_rank(c, &rank);
    maco_comm_get_nranks(c, &n);
    maco_bootstrap_t bs = nullptr;
    maco_comm_get_bootstrap(c, &bs);
    maco_mem_t mine = nullptr;
    checked("maco_mem_register", c,
            [&] { return maco_mem_register(c, ptr(scratch), bytes, &mine); });
    mems.push_back(mine);
    std::vector<uint8_t> h((size_t)n * MACO_MEM_HANDLE_BYTES);
    checked("maco_mem_serialize", c,
            [&] { return maco_mem_serialize(mine, &h[(size_t)rank * MACO_MEM_HANDLE_BYTES]); });
    checked("maco_bootstrap_allgather", c,
            [&] { return maco_bootstrap_allgather(bs, h.data(), MACO_MEM_HANDLE_BYTES); });
    std::vector<int> index((size_t)n, -1);
    for (int q = 0; q < n; q++) {
        if (q == rank)
            continue;
        maco_mem_t peer = nullptr;
        checked("maco_mem_import", c,
                [&] { return maco_mem_import(c, &h[(size_t)q * MACO_MEM_HANDLE_BYTES], &peer); });
        mems.push_back(peer);
        maco_memory_channel_t ch = nullptr;
        checked("maco_memory_channel_create", c,
                [&] { return maco_memory_channel_create(c, q, mine, peer, &ch); });
        chans.push_back(ch);
        maco_memory_channel_device_t dh;
        checked("maco_memory_channel_get_device_handle", c,
                [&] { return maco_memory_channel_get_device_handle(ch, &dh); });
        checked("maco_task_graph_add_channel", c,
                [&] { return maco_task_graph_add_channel(gr, &dh, &index[(size_t)q]); });
    }
    return index;
}

int PKernel::add_fused(int kind, const std::vector<int> &channels,
                       const std::vector<int> &out_channels, uintptr_t a, uintptr_t b,
                       uintptr_t out, uintptr_t scratch, uint32_t m, uint32_t n, uint32_t kk,
                       int out_type, const std::string &name)
{
    maco_fused_gemm_t op{};
    op.comm = comm();
    op.channels = channels.data();
    op.out_channels = out_channels.empty() ? nullptr : out_channels.data();
    op.a = ptr(a);
    op.b = ptr(b);
    op.out = ptr(out);
    op.scratch = ptr(scratch);
    op.m = m;
    op.n = n;
    op.k = kk;
    op.out_type = static_cast<maco_datatype_t>(out_type);
    op.name = name.empty() ? nullptr : name.c_str();
    int last = -1;
    maco_task_graph_t gr = g();
    if (kind == MACO_FUSED_ALLGATHER_GEMM)
        checked("maco_task_graph_add_allgather_gemm", op.comm,
                [&] { return maco_task_graph_add_allgather_gemm(gr, &op, &last); });
    else if (kind == MACO_FUSED_GEMM_REDUCE_SCATTER)
        checked("maco_task_graph_add_gemm_reduce_scatter", op.comm,
                [&] { return maco_task_graph_add_gemm_reduce_scatter(gr, &op, &last); });
    else
        checked("maco_task_graph_add_gemm_allreduce", op.comm,
                [&] { return maco_task_graph_add_gemm_allreduce(gr, &op, &last); });
    return last;
}

void PKernel::compile(int workers, int schedulers, int comm_workers, int threads, bool profile)
{
    maco_comm_t c = comm();
    maco_task_graph_t gr = g();
    maco_persistent_config_t cfg{};
    cfg.workers = workers;
    cfg.schedulers = schedulers;
    cfg.comm_workers = comm_workers;
    cfg.threads = threads;
    cfg.profile = profile ? 1 : 0;
    checked("maco_persistent_kernel_create", c,
            [&] { return maco_persistent_kernel_create(c, gr, &cfg, &kernel); });
    maco_task_graph_destroy(graph);
    graph = nullptr;
}

nb::dict PKernel::config() const
{
    maco_persistent_config_t cfg{};
    maco_persistent_kernel_t kk = k();
    checked("maco_persistent_kernel_get_config", comm(),
            [&] { return maco_persistent_kernel_get_config(kk, &cfg); });
    nb::dict d;
    d["workers"] = cfg.workers;
    d["schedulers"] = cfg.schedulers;
    d["comm_workers"] = cfg.comm_workers;
    d["threads"] = cfg.threads;
    d["profile"] = cfg.profile != 0;
    return d;
}

std::vector<std::vector<uint64_t>> PKernel::profile(size_t ntasks) const
{
    std::vector<maco_task_profile_t> rec(ntasks);
    maco_persistent_kernel_t kk = k();
    checked("maco_persistent_kernel_get_profile", comm(),
            [&] { return maco_persistent_kernel_get_profile(kk, rec.data(), rec.size()); });
    std::vector<std::vector<uint64_t>> out;
    for (const auto &r : rec)
        out.push_back({ r.start_ns, r.end_ns, (uint64_t)r.sm, (uint64_t)r.cta });
    return out;
}

std::string PKernel::summary() const
{
    maco_persistent_kernel_t kk = k();
    char *text = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == nullptr)
        throw StatusError{ MACO_ERR_NO_MEMORY, "open_memstream failed" };
    Capture capture;
    maco_status_t r;
    {
        nb::gil_scoped_release release;
        r = maco_persistent_kernel_print_summary(kk, f);
    }
    fclose(f);
    std::string out(text != nullptr ? text : "", len);
    free(text);
    if (r != MACO_OK)
        raise_status(r, comm(), "maco_persistent_kernel_print_summary");
    return out;
}

/* ------------------------------------------------------------------ DLPack */

/* The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), declared here so the
 * module needs no DLPack header. Layouts are fixed by the specification. */
struct DLDeviceAbi {
    int32_t device_type;
    int32_t device_id;
};
struct DLDataTypeAbi {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
};
struct DLTensorAbi {
    void *data;
    DLDeviceAbi device;
    int32_t ndim;
    DLDataTypeAbi dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
};
struct DLManagedTensorAbi {
    DLTensorAbi dl_tensor;
    void *manager_ctx;
    void (*deleter)(DLManagedTensorAbi *self);
};
struct DLPackVersionAbi {
    uint32_t major;
    uint32_t minor;
};
struct DLManagedTensorVersionedAbi {
    DLPackVersionAbi version;
    void *manager_ctx;
    void (*deleter)(DLManagedTensorVersionedAbi *self);
    uint64_t flags;
    DLTensorAbi dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLMaxDims = 64; /* NumPy's limit; no framework makes more */

/* Describes the tensor of a DLPack capsule without consuming it (the producer's capsule
 * destructor frees it as usual): (address, shape, strides or None, type code, bits, lanes,
 * device type, device id, read-only). */
nb::tuple dlpack_describe(nb::handle capsule)
{
    PyObject *cap = capsule.ptr();
    if (!PyCapsule_CheckExact(cap))
        throw nb::type_error("dlpack_describe: expected a DLPack capsule");
    const char *name = PyCapsule_GetName(cap);
    const DLTensorAbi *t = nullptr;
    bool readonly = false;
    if (name != nullptr && std::strcmp(name, "dltensor") == 0) {
        auto *m = static_cast<DLManagedTensorAbi *>(PyCapsule_GetPointer(cap, name));
        if (m == nullptr)
            throw nb::python_error();
        t = &m->dl_tensor;
    } else if (name != nullptr && std::strcmp(name, "dltensor_versioned") == 0) {
        auto *m = static_cast<DLManagedTensorVersionedAbi *>(PyCapsule_GetPointer(cap, name));
        if (m == nullptr)
            throw nb::python_error();
        if (m->version.major != 1)
            throw nb::type_error(("DLPack major version " + std::to_string(m->version.major) +
                                  " is not supported (1 is)")
                                     .c_str());
        t = &m->dl_tensor;
        readonly = (m->flags & kDLFlagReadOnly) != 0;
    } else {
        throw nb::type_error("dlpack_describe: the capsule is not an unconsumed DLPack tensor");
    }
    /* The producer's fields are not trusted: a bad ndim or a NULL shape must be an error, not
     * a read of memory that is not there. */
    if (t->ndim < 0 || t->ndim > kDLMaxDims)
        throw nb::value_error(("dlpack_describe: the DLPack tensor has ndim " +
                               std::to_string(t->ndim) + "; 0 to " + std::to_string(kDLMaxDims) +
                               " dimensions are accepted")
                                  .c_str());
    if (t->ndim > 0 && t->shape == nullptr)
        throw nb::value_error(("dlpack_describe: the DLPack tensor has ndim " +
                               std::to_string(t->ndim) + " but a NULL shape")
                                  .c_str());
    nb::list shape, strides;
    for (int32_t i = 0; i < t->ndim; ++i) {
        if (t->shape[i] < 0)
            throw nb::value_error(("dlpack_describe: dimension " + std::to_string(i) +
                                   " of the DLPack tensor is " + std::to_string(t->shape[i]) +
                                   " (negative)")
                                      .c_str());
        shape.append(t->shape[i]);
        if (t->strides != nullptr)
            strides.append(t->strides[i]);
    }
    uintptr_t address = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
    nb::object strides_obj = t->strides != nullptr ? nb::object(nb::tuple(strides)) : nb::none();
    return nb::make_tuple(address, nb::tuple(shape), strides_obj, (int)t->dtype.code,
                          (int)t->dtype.bits, (int)t->dtype.lanes, (int)t->device.device_type,
                          (int)t->device.device_id, readonly);
}

/* Memory from maco_mem_alloc exported as a DLPack tensor; freed when its consumer lets go. */
struct AllocHolder {
    DLManagedTensorAbi managed;
    std::vector<int64_t> shape;
    std::shared_ptr<CommState> st;
    void *address;
};

void alloc_deleter(DLManagedTensorAbi *m)
{
    auto *h = static_cast<AllocHolder *>(m->manager_ctx);
    if (h->st && h->st->comm != nullptr)
        maco_mem_free(h->st->comm, h->address);
    delete h; /* may destroy the communicator when it was the last user */
}

void alloc_capsule_destructor(PyObject *cap)
{
    /* A consumer renames the capsule "used_dltensor" and owns the tensor from then on. */
    const char *name = PyCapsule_GetName(cap);
    if (name == nullptr || std::strcmp(name, "dltensor") != 0)
        return;
    auto *m = static_cast<DLManagedTensorAbi *>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m != nullptr && m->deleter != nullptr)
        m->deleter(m);
}

nb::object alloc_dlpack(const Comm &c, std::vector<int64_t> shape, int code, int bits)
{
    maco_comm_t comm = c.get();
    if (bits <= 0 || bits % 8 != 0)
        throw nb::value_error("alloc: bits must be a positive multiple of 8");
    size_t n = 1;
    for (int64_t d : shape) {
        if (d < 0)
            throw nb::value_error("alloc: shape has a negative dimension");
        if (d != 0 && n > SIZE_MAX / (size_t)d)
            throw nb::value_error("alloc: the shape's element count overflows");
        n *= (size_t)d;
    }
    size_t bytes = n * (size_t)(bits / 8);
    int device = -1;
    maco_comm_get_cuda_device(comm, &device);
    void *address = nullptr;
    /* maco_mem_alloc rejects 0 bytes; an empty tensor still gets one granule. */
    checked("maco_mem_alloc", comm,
            [&] { return maco_mem_alloc(comm, bytes == 0 ? 1 : bytes, &address); });
    auto *h = new AllocHolder();
    h->shape = std::move(shape);
    h->st = c.st;
    h->address = address;
    h->managed.dl_tensor.data = address;
    h->managed.dl_tensor.device = DLDeviceAbi{ kDLCUDA, device };
    h->managed.dl_tensor.ndim = (int32_t)h->shape.size();
    h->managed.dl_tensor.dtype = DLDataTypeAbi{ (uint8_t)code, (uint8_t)bits, 1 };
    h->managed.dl_tensor.shape = h->shape.data();
    h->managed.dl_tensor.strides = nullptr; /* compact, row-major */
    h->managed.dl_tensor.byte_offset = 0;
    h->managed.manager_ctx = h;
    h->managed.deleter = alloc_deleter;
    PyObject *cap = PyCapsule_New(&h->managed, "dltensor", alloc_capsule_destructor);
    if (cap == nullptr) {
        alloc_deleter(&h->managed);
        throw nb::python_error();
    }
    return nb::steal(cap);
}

/* The module-level functions: versions, names, the configuration table, plans, GEMM tiles,
 * unique ids, groups, DLPack descriptors, copies. */
void bind_functions(nb::module_ &m)
{
    m.def(
        "version", [] { return std::string(maco_version_string()); },
        "The C library's version, \"MAJOR.MINOR.PATCH\".");
    m.def(
        "status_string", [](int s) { return std::string(maco_status_string((maco_status_t)s)); },
        nb::arg("status"), "The constant text of a status code.");
    m.def(
        "datatype_size", [](int d) { return maco_datatype_size((maco_datatype_t)d); },
        nb::arg("datatype"), "Bytes per element of a MACO datatype (0 if unknown).");
    m.def(
        "datatype_name", [](int d) { return std::string(maco_datatype_name((maco_datatype_t)d)); },
        nb::arg("datatype"), "Name of a MACO datatype (\"unknown\" if out of range).");
    m.def(
        "redop_name", [](int o) { return std::string(maco_redop_name((maco_redop_t)o)); },
        nb::arg("op"), "Name of a MACO reduction (\"unknown\" if out of range).");
    m.def(
        "cuda_device_count",
        [] {
            char why[512] = { 0 };
            int n = maco_cuda_device_count(why, sizeof(why));
            return std::make_pair(n, std::string(why));
        },
        "(number of usable CUDA devices, why there are none or \"\").");
    m.def(
        "plan_verify_file",
        [](const std::string &path) {
            std::string report(1 << 16, '\0');
            maco_status_t st;
            {
                nb::gil_scoped_release release;
                st = maco_plan_verify_file(path.c_str(), report.data(), report.size());
            }
            report.resize(std::strlen(report.c_str()));
            return std::make_pair(static_cast<int>(st), report);
        },
        nb::arg("path"),
        "(status, report) of MACO's plan verifier on a plan file (maco_plan_verify_file): "
        "status 0 and \"\" when the plan is valid.");
    m.def(
        "fused_scratch_bytes",
        [](int kind, int nranks, uint32_t m, uint32_t n, uint32_t k, int out_type) {
            size_t bytes = 0;
            checked("maco_fused_gemm_scratch_bytes", nullptr, [&] {
                return maco_fused_gemm_scratch_bytes(static_cast<maco_fused_op_t>(kind), nranks, m,
                                                     n, k, static_cast<maco_datatype_t>(out_type),
                                                     &bytes);
            });
            return bytes;
        },
        nb::arg("kind"), nb::arg("nranks"), nb::arg("m"), nb::arg("n"), nb::arg("k"),
        nb::arg("out_type"),
        "Bytes of scratch a fused operator needs on every rank: maco_fused_gemm_scratch_bytes.");
    m.def(
        "plan_gemm_tiles",
        [](uint32_t m, uint32_t n, int workers) {
            size_t count = 0;
            checked("maco_gemm_plan_tiles", nullptr,
                    [&] { return maco_gemm_plan_tiles(m, n, workers, nullptr, &count); });
            std::vector<maco_gemm_tile_t> tiles(count);
            checked("maco_gemm_plan_tiles", nullptr,
                    [&] { return maco_gemm_plan_tiles(m, n, workers, tiles.data(), &count); });
            std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> out;
            for (size_t i = 0; i < count; i++)
                out.emplace_back(tiles[i].tile_row, tiles[i].tile_col, tiles[i].tile_n);
            return out;
        },
        nb::arg("m"), nb::arg("n"), nb::arg("workers"),
        "[(tile_row, tile_col, tile_n), ...] in the order to add them: maco_gemm_plan_tiles.");
    m.def(
        "mem_copy_batch",
        [](const std::vector<uintptr_t> &dst, const std::vector<uintptr_t> &src,
           const std::vector<size_t> &bytes, uintptr_t stream) {
            if (dst.size() != src.size() || dst.size() != bytes.size())
                throw nb::value_error(("mem_copy_batch: dst, src and bytes differ in length (" +
                                       std::to_string(dst.size()) + ", " +
                                       std::to_string(src.size()) + ", " +
                                       std::to_string(bytes.size()) + ")")
                                          .c_str());
            std::vector<maco_mem_copy_t> copies(dst.size());
            for (size_t i = 0; i < copies.size(); i++)
                copies[i] = { ptr(dst[i]), ptr(src[i]), bytes[i] };
            checked("maco_mem_copy_batch", nullptr, [&] {
                return maco_mem_copy_batch(copies.data(), copies.size(), stream_of(stream));
            });
        },
        nb::arg("dst"), nb::arg("src"), nb::arg("bytes"), nb::arg("stream"),
        "cudaMemcpyAsync of bytes[i] from src[i] to dst[i] (addresses), in order, on stream "
        "(a cudaStream_t): maco_mem_copy_batch.");
    m.def("unique_id", &unique_id_create,
          "A new 128-byte unique id; rank 0 of the job must be created in this process.");
    m.def(
        "group_start",
        [] { checked("maco_group_start", nullptr, [] { return maco_group_start(); }); },
        "Opens a group on this thread (maco_group_start).");
    m.def(
        "group_end", [] { checked("maco_group_end", nullptr, [] { return maco_group_end(); }); },
        "Closes the group and issues it (maco_group_end); releases the GIL.");
    m.def("dlpack_describe", &dlpack_describe, nb::arg("capsule"),
          "(address, shape, strides|None, code, bits, lanes, device_type, device_id, readonly) "
          "of an unconsumed DLPack capsule. ValueError when its ndim is outside 0..64, its "
          "shape is NULL or a dimension is negative.");
    m.def(
        "config",
        [] {
            nb::list out;
            int n = maco_config_count();
            for (int i = 0; i < n; ++i) {
                maco_config_info_t info;
                if (maco_config_describe(i, &info) != MACO_OK)
                    continue;
                out.append(
                    nb::make_tuple(info.name, info.type, info.default_value, info.unit, info.doc));
            }
            return out;
        },
        "The configuration table: (name, type, default, unit, doc) for each MACO_* variable.");
}

/* Mem, Plan and PKernel: handles a Comm makes. */
void bind_handles(nb::module_ &m)
{
    nb::class_<Mem>(m, "Mem", "A registration of a buffer with a communicator (maco_mem_t).")
        .def_ro("address", &Mem::address)
        .def_ro("bytes", &Mem::bytes)
        .def_prop_ro("registered", [](const Mem &x) { return x.mem != nullptr; })
        .def("deregister", &Mem::deregister, "Ends the registration; idempotent.")
        .def(
            "serialize",
            [](const Mem &x) {
                if (x.mem == nullptr)
                    throw nb::value_error("serialize: the registration has ended");
                uint8_t h[MACO_MEM_HANDLE_BYTES];
                maco_mem_t mem = x.mem;
                checked("maco_mem_serialize", x.st ? x.st->comm : nullptr,
                        [&] { return maco_mem_serialize(mem, h); });
                return nb::bytes(reinterpret_cast<const char *>(h), sizeof h);
            },
            "The registration's handle (MACO_MEM_HANDLE_BYTES bytes) for a peer's import.");

    nb::class_<Plan>(m, "Plan", "An execution plan loaded for a communicator (maco_plan_t).")
        .def(
            "execute",
            [](const Plan &p, uintptr_t s, uintptr_t r, size_t n, int d, int o, uintptr_t st) {
                maco_plan_t plan = p.get();
                maco_comm_t comm = p.st ? p.st->comm : nullptr;
                maco_datatype_t dt = dtype_of(d);
                maco_redop_t op = op_of(o);
                checked("maco_plan_execute", comm, [&] {
                    return maco_plan_execute(plan, ptr(s), ptr(r), n, dt, op, comm, stream_of(st));
                });
            },
            nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("count"), nb::arg("datatype"),
            nb::arg("op"), nb::arg("stream"), "maco_plan_execute: one launch on `stream`.")
        .def("destroy", &Plan::destroy, "maco_plan_destroy (waits for the device); idempotent.")
        .def_prop_ro("destroyed", [](const Plan &p) { return p.plan == nullptr; });

    nb::class_<PKernel>(m, "PKernel",
                        "A task graph, its fused operators' channels and the persistent kernel "
                        "made from it (maco/persistent.h).")
        .def("add_task", &PKernel::add_task, nb::arg("task"),
             "maco_task_graph_add_task from a dict of maco_task_t's fields; returns the id.")
        .def("add_dependency", &PKernel::add_dependency, nb::arg("task"), nb::arg("depends_on"))
        .def("ntasks", &PKernel::ntasks, "Tasks in the graph so far (before compile).")
        .def("setup_channels", &PKernel::setup_channels, nb::arg("scratch"), nb::arg("bytes"),
             "Registers scratch, imports every peer's, makes a memory channel to each "
             "(collective); the graph's channel index per rank (-1: this rank).")
        .def("add_fused", &PKernel::add_fused, nb::arg("kind"), nb::arg("channels"),
             nb::arg("out_channels"), nb::arg("a"), nb::arg("b"), nb::arg("out"),
             nb::arg("scratch"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("out_type"),
             nb::arg("name"),
             "maco_task_graph_add_gemm_allreduce (kind 0), _gemm_reduce_scatter (1) or "
             "_allgather_gemm (2); returns the id of the operator's last task.")
        .def("compile", &PKernel::compile, nb::arg("workers"), nb::arg("schedulers"),
             nb::arg("comm_workers"), nb::arg("threads"), nb::arg("profile"),
             "maco_persistent_kernel_create (validates and uploads; blocking).")
        .def("launch", &PKernel::launch, nb::arg("stream"))
        .def("config", &PKernel::config)
        .def("profile", &PKernel::profile, nb::arg("ntasks"))
        .def("write_trace", &PKernel::write_trace, nb::arg("path"))
        .def("summary", &PKernel::summary)
        .def("close", &PKernel::close);
}

/* Comm: creation, properties, errors, the bootstrap's barrier and allgather. */
void bind_comm_core(nb::class_<Comm> &c)
{
    c.def_static("from_unique_id", &comm_from_unique_id, nb::arg("unique_id"), nb::arg("rank"),
                 nb::arg("size"), nb::arg("device") = -1, nb::arg("timeout_ms") = -1,
                 "Joins the job of `unique_id` and creates a communicator (collective).")
        .def_static("from_env", &comm_from_env, nb::arg("device") = -1,
                    "Creates a communicator from MACO_* or torchrun variables (collective).")
        .def("close", &Comm::close, "Drops this handle's reference to the communicator.")
        .def_prop_ro("closed", &Comm::closed)
        .def_prop_ro("handle", [](const Comm &c) { return reinterpret_cast<uintptr_t>(c.get()); })
        .def_prop_ro("rank", [](const Comm &c) { return c.query(maco_comm_get_rank, "rank"); })
        .def_prop_ro("size", [](const Comm &c) { return c.query(maco_comm_get_nranks, "size"); })
        .def_prop_ro("local_rank",
                     [](const Comm &c) { return c.query(maco_comm_get_local_rank, "local_rank"); })
        .def_prop_ro(
            "local_size",
            [](const Comm &c) { return c.query(maco_comm_get_local_nranks, "local_size"); })
        .def_prop_ro("node", [](const Comm &c) { return c.query(maco_comm_get_node, "node"); })
        .def_prop_ro("num_nodes",
                     [](const Comm &c) { return c.query(maco_comm_get_nnodes, "num_nodes"); })
        .def_prop_ro("device",
                     [](const Comm &c) { return c.query(maco_comm_get_cuda_device, "device"); })
        .def_prop_ro("gpu_ranks",
                     [](const Comm &c) { return c.query(maco_comm_get_gpu_ranks, "gpu_ranks"); })
        .def_prop_ro("last_error",
                     [](const Comm &c) { return std::string(maco_comm_get_last_error(c.get())); })
        .def(
            "async_error",
            [](const Comm &c) {
                maco_status_t s = MACO_OK;
                maco_comm_t comm = c.get();
                Capture capture;
                maco_status_t r = maco_comm_get_async_error(comm, &s);
                if (r != MACO_OK)
                    raise_status(r, comm, "maco_comm_get_async_error");
                return (int)s;
            },
            "The first asynchronous failure's status (0 when none).")
        .def(
            "host_id",
            [](const Comm &c, int rank) {
                const char *id = nullptr;
                maco_comm_t comm = c.get();
                maco_bootstrap_t bs = comm_bootstrap(c);
                Capture capture;
                maco_status_t r = maco_bootstrap_get_host_id(bs, rank, &id);
                if (r != MACO_OK)
                    raise_status(r, comm, "maco_bootstrap_get_host_id");
                return std::string(id);
            },
            nb::arg("rank"))
        .def(
            "bootstrap_barrier",
            [](const Comm &c) {
                maco_bootstrap_t bs = comm_bootstrap(c);
                checked("maco_bootstrap_barrier", c.get(),
                        [&] { return maco_bootstrap_barrier(bs); });
            },
            "Host barrier over the bootstrap's TCP mesh (collective, blocking).")
        .def(
            "bootstrap_allgather",
            [](const Comm &c, nb::bytes data) {
                maco_bootstrap_t bs = comm_bootstrap(c);
                int rank = c.query(maco_comm_get_rank, "rank");
                int n = c.query(maco_comm_get_nranks, "size");
                size_t each = data.size();
                std::string buf(each * (size_t)n, '\0');
                std::memcpy(&buf[each * (size_t)rank], data.c_str(), each);
                checked("maco_bootstrap_allgather", c.get(),
                        [&] { return maco_bootstrap_allgather(bs, &buf[0], each); });
                nb::list out;
                for (int r = 0; r < n; ++r)
                    out.append(nb::bytes(buf.data() + each * (size_t)r, each));
                return out;
            },
            nb::arg("data"), "Gathers equally sized bytes from every rank (collective).");
}

/* Comm: the bootstrap's broadcast, collectives, send/recv and memory registration. */
void bind_comm_collectives(nb::class_<Comm> &c)
{
    c.def(
         "bootstrap_broadcast",
         [](const Comm &c, nb::bytes data, int root) {
             maco_bootstrap_t bs = comm_bootstrap(c);
             uint64_t len = data.size();
             checked("maco_bootstrap_broadcast", c.get(),
                     [&] { return maco_bootstrap_broadcast(bs, root, &len, sizeof(len)); });
             std::string buf(len, '\0');
             if (c.query(maco_comm_get_rank, "rank") == root)
                 std::memcpy(&buf[0], data.c_str(), len);
             checked("maco_bootstrap_broadcast", c.get(), [&] {
                 return maco_bootstrap_broadcast(bs, root, len ? &buf[0] : nullptr, len);
             });
             return nb::bytes(buf.data(), buf.size());
         },
         nb::arg("data"), nb::arg("root"), "Root's bytes to every rank (collective).")
        .def(
            "allreduce",
            [](const Comm &c, uintptr_t s, uintptr_t r, size_t n, int d, int o, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                maco_redop_t op = op_of(o);
                checked("maco_allreduce", comm, [&] {
                    return maco_allreduce(ptr(s), ptr(r), n, dt, op, comm, stream_of(st));
                });
            },
            nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("count"), nb::arg("datatype"),
            nb::arg("op"), nb::arg("stream"))
        .def(
            "allgather",
            [](const Comm &c, uintptr_t s, uintptr_t r, size_t n, int d, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                checked("maco_allgather", comm,
                        [&] { return maco_allgather(ptr(s), ptr(r), n, dt, comm, stream_of(st)); });
            },
            nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("sendcount"), nb::arg("datatype"),
            nb::arg("stream"))
        .def(
            "reduce_scatter",
            [](const Comm &c, uintptr_t s, uintptr_t r, size_t n, int d, int o, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                maco_redop_t op = op_of(o);
                checked("maco_reduce_scatter", comm, [&] {
                    return maco_reduce_scatter(ptr(s), ptr(r), n, dt, op, comm, stream_of(st));
                });
            },
            nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("recvcount"), nb::arg("datatype"),
            nb::arg("op"), nb::arg("stream"))
        .def(
            "broadcast",
            [](const Comm &c, uintptr_t s, uintptr_t r, size_t n, int d, int root, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                checked("maco_broadcast", comm, [&] {
                    return maco_broadcast(ptr(s), ptr(r), n, dt, root, comm, stream_of(st));
                });
            },
            nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("count"), nb::arg("datatype"),
            nb::arg("root"), nb::arg("stream"))
        .def(
            "reduce",
            [](const Comm &c, uintptr_t s, uintptr_t r, size_t n, int d, int o, int root,
               uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                maco_redop_t op = op_of(o);
                checked("maco_reduce", comm, [&] {
                    return maco_reduce(ptr(s), ptr(r), n, dt, op, root, comm, stream_of(st));
                });
            },
            nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("count"), nb::arg("datatype"),
            nb::arg("op"), nb::arg("root"), nb::arg("stream"))
        .def(
            "alltoall",
            [](const Comm &c, uintptr_t s, uintptr_t r, size_t n, int d, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                checked("maco_alltoall", comm,
                        [&] { return maco_alltoall(ptr(s), ptr(r), n, dt, comm, stream_of(st)); });
            },
            nb::arg("sendbuf"), nb::arg("recvbuf"), nb::arg("count"), nb::arg("datatype"),
            nb::arg("stream"))
        .def(
            "alltoallv",
            [](const Comm &c, uintptr_t s, std::vector<size_t> sc, std::vector<size_t> sd,
               uintptr_t r, std::vector<size_t> rc, std::vector<size_t> rd, int d, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                size_t n = (size_t)c.query(maco_comm_get_nranks, "size");
                if (sc.size() != n || sd.size() != n || rc.size() != n || rd.size() != n)
                    throw nb::value_error("alltoallv: counts and displacements need one entry "
                                          "per rank");
                checked("maco_alltoallv", comm, [&] {
                    return maco_alltoallv(ptr(s), sc.data(), sd.data(), ptr(r), rc.data(),
                                          rd.data(), dt, comm, stream_of(st));
                });
            },
            nb::arg("sendbuf"), nb::arg("sendcounts"), nb::arg("sdispls"), nb::arg("recvbuf"),
            nb::arg("recvcounts"), nb::arg("rdispls"), nb::arg("datatype"), nb::arg("stream"))
        .def(
            "send",
            [](const Comm &c, uintptr_t b, size_t n, int d, int peer, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                checked("maco_send", comm,
                        [&] { return maco_send(ptr(b), n, dt, peer, comm, stream_of(st)); });
            },
            nb::arg("buf"), nb::arg("count"), nb::arg("datatype"), nb::arg("peer"),
            nb::arg("stream"))
        .def(
            "recv",
            [](const Comm &c, uintptr_t b, size_t n, int d, int peer, uintptr_t st) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                checked("maco_recv", comm,
                        [&] { return maco_recv(ptr(b), n, dt, peer, comm, stream_of(st)); });
            },
            nb::arg("buf"), nb::arg("count"), nb::arg("datatype"), nb::arg("peer"),
            nb::arg("stream"))
        .def(
            "register",
            [](const Comm &c, uintptr_t p, size_t bytes) {
                maco_comm_t comm = c.get();
                maco_mem_t mem = nullptr;
                checked("maco_mem_register", comm,
                        [&] { return maco_mem_register(comm, ptr(p), bytes, &mem); });
                return new Mem(c.st, mem, p, bytes);
            },
            nb::arg("address"), nb::arg("bytes"), nb::rv_policy::take_ownership)
        .def(
            "map_registrations",
            [](const Comm &c) {
                maco_comm_t comm = c.get();
                checked("maco_collective_map_registrations", comm,
                        [&] { return maco_collective_map_registrations(comm); });
            },
            "Maps the local peers' new registrations (not collective; blocking).");
}

/* Comm: imports, DLPack allocation, persistent kernels, plans, algorithm and CTA settings,
 * statistics. */
void bind_comm_resources(nb::class_<Comm> &c)
{
    c.def(
         "import_mem",
         [](const Comm &c, nb::bytes handle) {
             if (handle.size() != MACO_MEM_HANDLE_BYTES)
                 throw nb::value_error(("handle: " + std::to_string(handle.size()) +
                                        " bytes, a memory handle has " +
                                        std::to_string(MACO_MEM_HANDLE_BYTES))
                                           .c_str());
             maco_comm_t comm = c.get();
             maco_mem_t mem = nullptr;
             void *p = nullptr;
             size_t n = 0;
             uint8_t h[MACO_MEM_HANDLE_BYTES];
             memcpy(h, handle.c_str(), sizeof h);
             checked("maco_mem_import", comm, [&] { return maco_mem_import(comm, h, &mem); });
             maco_mem_get_pointer(mem, &p);
             maco_mem_get_size(mem, &n);
             return new Mem(c.st, mem, reinterpret_cast<uintptr_t>(p), n);
         },
         nb::arg("handle"), nb::rv_policy::take_ownership,
         "Maps a local peer's registration (maco_mem_import); deregister() unmaps it.")
        .def(
            "persistent_kernel", [](const Comm &c) { return new PKernel(c.st); },
            nb::rv_policy::take_ownership, "A new, empty PKernel on this communicator.")
        .def(
            "plan_load",
            [](const Comm &c, const std::string &path) {
                maco_comm_t comm = c.get();
                maco_plan_t plan = nullptr;
                checked("maco_plan_load", comm,
                        [&] { return maco_plan_load(comm, path.c_str(), &plan); });
                return new Plan(c.st, plan);
            },
            nb::arg("path"), nb::rv_policy::take_ownership,
            "maco_plan_load: reads, verifies and sets up a plan file (collective, blocking).")
        .def("alloc_dlpack", &alloc_dlpack, nb::arg("shape"), nb::arg("code"), nb::arg("bits"),
             "maco_mem_alloc memory as an unconsumed DLPack capsule (freed by its consumer).")
        .def(
            "algorithm",
            [](const Comm &c, int coll, size_t count, int d) {
                maco_comm_t comm = c.get();
                maco_datatype_t dt = dtype_of(d);
                const char *name = nullptr;
                checked("maco_collective_get_algorithm", comm, [&] {
                    return maco_collective_get_algorithm(comm, (maco_collective_t)coll, count, dt,
                                                         &name);
                });
                return std::string(name);
            },
            nb::arg("collective"), nb::arg("count"), nb::arg("datatype"))
        .def(
            "set_algorithm",
            [](const Comm &c, int coll, std::optional<std::string> name) {
                maco_comm_t comm = c.get();
                checked("maco_collective_set_algorithm", comm, [&] {
                    return maco_collective_set_algorithm(comm, (maco_collective_t)coll,
                                                         name ? name->c_str() : nullptr);
                });
            },
            nb::arg("collective"), nb::arg("name").none())
        .def(
            "set_max_ctas",
            [](const Comm &c, int n) {
                maco_comm_t comm = c.get();
                checked("maco_collective_set_max_ctas", comm,
                        [&] { return maco_collective_set_max_ctas(comm, n); });
            },
            nb::arg("max_ctas"), "maco_collective_set_max_ctas (collective, blocking).")
        .def(
            "max_ctas",
            [](const Comm &c) {
                maco_comm_t comm = c.get();
                int n = 0;
                checked("maco_collective_get_max_ctas", comm,
                        [&] { return maco_collective_get_max_ctas(comm, &n); });
                int co = 0;
                checked("maco_comm_get_coresident_ctas", comm,
                        [&] { return maco_comm_get_coresident_ctas(comm, &co); });
                return std::make_pair(n, co);
            },
            "(cap set by set_max_ctas or 0, co-resident CTAs of a kernel that waits on peers).")
        .def(
            "last_ctas",
            [](const Comm &c) {
                maco_comm_t comm = c.get();
                int n = 0;
                checked("maco_collective_get_last_ctas", comm,
                        [&] { return maco_collective_get_last_ctas(comm, &n); });
                return n;
            },
            "CTAs of the last collective kernel launched (0: none yet); does not wait for the "
            "device.")
        .def(
            "stats",
            [](const Comm &c) {
                maco_comm_t comm = c.get();
                maco_collective_stats_t s{};
                checked("maco_collective_get_stats", comm,
                        [&] { return maco_collective_get_stats(comm, &s); });
                return std::make_tuple(s.inplace_launches, s.scratch_launches, s.last_launch_ctas);
            },
            "(in-place launches, scratch launches) of the mesh kernels and the CTAs of the last "
            "collective kernel; synchronises the device.");
}

} // namespace

#include "ep_bindings.h" /* expert parallelism (maco/ep.h): EpBuffer, bind_ep */

NB_MODULE(_maco, m)
{
    m.doc() = "MACO's C API for the maco package (internal: use maco's Python API).";
    /* Communicators, registrations and persistent kernels held by module-level caches (maco.tp's
     * workspaces, maco.compile's kernels, torch.compile's graphs) may still be alive when the
     * interpreter tears the module down; nanobind would then print "leaked ... instances" and
     * blame the bindings at every exit (seen under torchrun). The process's exit releases them. */
    nb::set_leak_warnings(false);

    maco_log_set_handler(log_handler, nullptr);

    nb::register_exception_translator([](const std::exception_ptr &p, void *) {
        try {
            std::rethrow_exception(p);
        } catch (const StatusError &e) {
            nb::object errors = nb::module_::import_("maco._errors");
            nb::object exc = errors.attr("_from_status")(e.status, e.message);
            PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
        }
    });

    m.attr("UNIQUE_ID_BYTES") = MACO_UNIQUE_ID_BYTES;
    m.attr("DATATYPE_COUNT") = (int)MACO_DATATYPE_COUNT;
    m.attr("REDOP_COUNT") = (int)MACO_REDOP_COUNT;

    bind_functions(m);
    bind_handles(m);
    nb::class_<Comm> comm(m, "Comm", "A MACO communicator handle (maco_comm_t) and what owns it.");
    bind_comm_core(comm);
    bind_comm_collectives(comm);
    bind_comm_resources(comm);

    bind_ep(m);
}
