/*
 * persistent.cpp - PKernel: a task graph, the memory and port channels its fused operators use,
 * and the persistent kernel made from it (maco/persistent.h); maco.PersistentKernel builds on
 * it. And Comm.persistent_kernel, which makes an empty one.
 */
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

namespace
{

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

    /* The copy-engine mode's channels (maco_fused_comm_t): registers `src` (src_bytes) and
     * `dst` (dst_bytes; the same registration when dst == src), imports every peer's dst
     * (collective), starts this kernel's proxy the first time and makes a port channel from
     * src into each peer's dst (MACO_TRANSPORT_AUTO: the copy engines between GPUs of a
     * node); returns the graph's port channel index per rank (-1 for this rank). */
    std::vector<int> setup_port_channels(uintptr_t src, size_t src_bytes, uintptr_t dst,
                                         size_t dst_bytes);

    int add_fused(int kind, int mode, const std::vector<int> &channels,
                  const std::vector<int> &out_channels, const std::vector<int> &ports,
                  const std::vector<int> &out_ports, uintptr_t a, uintptr_t b, uintptr_t out,
                  uintptr_t scratch, uint32_t m, uint32_t n, uint32_t kk, int out_type,
                  const std::string &name);

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
        if (proxy != nullptr)
            maco_proxy_stop(proxy); /* nothing in flight once stopped */
        for (auto pc : ports)
            maco_port_channel_destroy(pc);
        ports.clear();
        maco_proxy_destroy(proxy);
        proxy = nullptr;
        for (auto m : mems)
            maco_mem_deregister(m);
        mems.clear();
        st.reset();
    }

    std::shared_ptr<CommState> st;
    maco_task_graph_t graph = nullptr;
    maco_persistent_kernel_t kernel = nullptr;
    std::vector<maco_memory_channel_t> chans;
    maco_proxy_t proxy = nullptr; /* the copy-engine mode's, made on first use */
    std::vector<maco_port_channel_t> ports;
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

std::vector<int> PKernel::setup_port_channels(uintptr_t src, size_t src_bytes, uintptr_t dst,
                                              size_t dst_bytes)
{
    maco_comm_t c = comm();
    maco_task_graph_t gr = g();
    int rank = 0, n = 0;
    maco_comm_get_rank(c, &rank);
    maco_comm_get_nranks(c, &n);
    std::vector<int> index((size_t)n, -1);
    if (n < 2)
        return index;
    maco_bootstrap_t bs = nullptr;
    maco_comm_get_bootstrap(c, &bs);
    maco_mem_t s = nullptr, d = nullptr;
    checked("maco_mem_register", c, [&] { return maco_mem_register(c, ptr(src), src_bytes, &s); });
    mems.push_back(s);
    d = s;
    if (dst != src) {
        checked("maco_mem_register", c,
                [&] { return maco_mem_register(c, ptr(dst), dst_bytes, &d); });
        mems.push_back(d);
    }
    std::vector<uint8_t> h((size_t)n * MACO_MEM_HANDLE_BYTES);
    checked("maco_mem_serialize", c,
            [&] { return maco_mem_serialize(d, &h[(size_t)rank * MACO_MEM_HANDLE_BYTES]); });
    checked("maco_bootstrap_allgather", c,
            [&] { return maco_bootstrap_allgather(bs, h.data(), MACO_MEM_HANDLE_BYTES); });
    if (proxy == nullptr) {
        checked("maco_proxy_create", c, [&] { return maco_proxy_create(c, &proxy); });
        checked("maco_proxy_start", c, [&] { return maco_proxy_start(proxy); });
    }
    for (int q = 0; q < n; q++) { /* pairwise collective: every rank in the order of q */
        if (q == rank)
            continue;
        maco_mem_t peer = nullptr;
        checked("maco_mem_import", c,
                [&] { return maco_mem_import(c, &h[(size_t)q * MACO_MEM_HANDLE_BYTES], &peer); });
        mems.push_back(peer);
        maco_port_channel_t pc = nullptr;
        checked("maco_port_channel_create", c, [&] {
            nb::gil_scoped_release nogil; /* blocks on the peer */
            return maco_port_channel_create(proxy, q, MACO_TRANSPORT_AUTO, s, peer, &pc);
        });
        ports.push_back(pc);
        checked("maco_task_graph_add_port_channel", c,
                [&] { return maco_task_graph_add_port_channel(gr, pc, &index[(size_t)q]); });
    }
    return index;
}

int PKernel::add_fused(int kind, int mode, const std::vector<int> &channels,
                       const std::vector<int> &out_channels, const std::vector<int> &ports,
                       const std::vector<int> &out_ports, uintptr_t a, uintptr_t b, uintptr_t out,
                       uintptr_t scratch, uint32_t m, uint32_t n, uint32_t kk, int out_type,
                       const std::string &name)
{
    maco_fused_gemm_t op{};
    op.comm = comm();
    op.comm_mode = mode;
    op.channels = channels.empty() ? nullptr : channels.data();
    op.out_channels = out_channels.empty() ? nullptr : out_channels.data();
    op.port_channels = ports.empty() ? nullptr : ports.data();
    op.out_port_channels = out_ports.empty() ? nullptr : out_ports.data();
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

} // namespace

void bind_persistent(nb::module_ &m, nb::class_<Comm> &c)
{
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
        .def("setup_port_channels", &PKernel::setup_port_channels, nb::arg("src"),
             nb::arg("src_bytes"), nb::arg("dst"), nb::arg("dst_bytes"),
             "Registers src and dst, imports every peer's dst, makes a port channel from src "
             "into each (collective; this kernel's proxy); the graph's port channel index per "
             "rank (-1: this rank).")
        .def("add_fused", &PKernel::add_fused, nb::arg("kind"), nb::arg("mode"),
             nb::arg("channels"), nb::arg("out_channels"), nb::arg("ports"), nb::arg("out_ports"),
             nb::arg("a"), nb::arg("b"), nb::arg("out"), nb::arg("scratch"), nb::arg("m"),
             nb::arg("n"), nb::arg("k"), nb::arg("out_type"), nb::arg("name"),
             "maco_task_graph_add_gemm_allreduce (kind 0), _gemm_reduce_scatter (1) or "
             "_allgather_gemm (2) in communication mode `mode` (maco_fused_comm_t); empty "
             "channel lists pass NULL; returns the id of the operator's last task.")
        .def("compile", &PKernel::compile, nb::arg("workers"), nb::arg("schedulers"),
             nb::arg("comm_workers"), nb::arg("threads"), nb::arg("profile"),
             "maco_persistent_kernel_create (validates and uploads; blocking).")
        .def("launch", &PKernel::launch, nb::arg("stream"))
        .def("config", &PKernel::config)
        .def("profile", &PKernel::profile, nb::arg("ntasks"))
        .def("write_trace", &PKernel::write_trace, nb::arg("path"))
        .def("summary", &PKernel::summary)
        .def("close", &PKernel::close);

    c.def(
        "persistent_kernel", [](const Comm &c) { return new PKernel(c.st); },
        nb::rv_policy::take_ownership, "A new, empty PKernel on this communicator.");
}

} // namespace maco_py
