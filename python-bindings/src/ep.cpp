/*
 * ep.cpp - expert-parallel buffers (maco/ep.h) in maco._maco: the class EpBuffer and the
 * function ep_buffer_create, used by maco/ep.py. Buffers and streams cross as integers (device
 * addresses, cudaStream_t values), as in the rest of the module.
 */
#include <cstdint>
#include <memory>
#include <utility>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

namespace
{

/* An EP buffer (maco_ep_buffer_t); keeps its communicator alive. destroy() waits for the
 * device (maco_ep_buffer_destroy synchronises), so it runs without the GIL. */
class EpBuffer
{
  public:
    EpBuffer(std::shared_ptr<CommState> s, maco_ep_buffer_t b) : st(std::move(s)), buf(b) {}
    EpBuffer(const EpBuffer &) = delete;
    EpBuffer &operator=(const EpBuffer &) = delete;
    ~EpBuffer()
    {
        if (buf != nullptr) {
            nb::gil_scoped_release release;
            maco_ep_buffer_destroy(buf);
        }
    }

    maco_ep_buffer_t get() const
    {
        if (buf == nullptr)
            throw StatusError{ MACO_ERR_INVALID_USAGE, "the EP buffer is destroyed" };
        return buf;
    }

    maco_comm_t comm() const
    {
        return st ? st->comm : nullptr;
    }

    nb::dict info() const
    {
        maco_ep_info_t i{};
        maco_ep_buffer_t b = get();
        checked("maco_ep_buffer_get_info", comm(), [&] { return maco_ep_buffer_get_info(b, &i); });
        nb::dict d;
        d["nranks"] = i.nranks;
        d["rank"] = i.rank;
        d["local_experts"] = i.local_experts;
        d["num_ctas"] = i.num_ctas;
        d["recv_rows"] = i.recv_rows;
        d["expert_capacity"] = i.expert_capacity;
        d["recv_x"] = reinterpret_cast<uintptr_t>(i.recv_x);
        d["buffer_bytes"] = i.buffer_bytes;
        d["handle_bytes"] = i.handle_bytes;
        return d;
    }

    /* maco_ep_dispatch (maco_ep_dispatch_fp8 with use_fp8); returns the rows received when
     * want_num_recv (normal mode: the call waits), else -1. */
    int64_t dispatch(uintptr_t x, int x_dtype, int num_tokens, int hidden, uintptr_t topk_idx,
                     uintptr_t topk_weights, int topk, uintptr_t recv_counts,
                     uintptr_t recv_offsets, uintptr_t recv_topk_weights, uintptr_t handle,
                     bool want_num_recv, uintptr_t stream, bool use_fp8)
    {
        maco_ep_buffer_t b = get();
        int64_t num_recv = -1;
        checked(use_fp8 ? "maco_ep_dispatch_fp8" : "maco_ep_dispatch", comm(), [&] {
            return (use_fp8 ? maco_ep_dispatch_fp8 : maco_ep_dispatch)(
                b, ptr(x), static_cast<maco_datatype_t>(x_dtype), num_tokens, hidden,
                static_cast<const int64_t *>(ptr(topk_idx)),
                static_cast<const float *>(ptr(topk_weights)), topk,
                static_cast<int32_t *>(ptr(recv_counts)), static_cast<int32_t *>(ptr(recv_offsets)),
                static_cast<float *>(ptr(recv_topk_weights)), ptr(handle),
                want_num_recv ? &num_recv : nullptr, stream_of(stream));
        });
        return num_recv;
    }

    void combine(uintptr_t expert_out, int dtype, int hidden, uintptr_t handle,
                 uintptr_t topk_weights, int num_tokens, int topk, uintptr_t y, uintptr_t stream)
    {
        maco_ep_buffer_t b = get();
        checked("maco_ep_combine", comm(), [&] {
            return maco_ep_combine(b, ptr(expert_out), static_cast<maco_datatype_t>(dtype), hidden,
                                   ptr(handle), static_cast<const float *>(ptr(topk_weights)),
                                   num_tokens, topk, ptr(y), stream_of(stream));
        });
    }

    void check() const
    {
        maco_ep_buffer_t b = get();
        checked("maco_ep_buffer_check", comm(), [&] { return maco_ep_buffer_check(b); });
    }

    void destroy()
    {
        if (buf == nullptr)
            return;
        maco_ep_buffer_t b = buf;
        buf = nullptr;
        maco_comm_t c = comm();
        checked("maco_ep_buffer_destroy", c, [&] { return maco_ep_buffer_destroy(b); });
        st.reset();
    }

    std::shared_ptr<CommState> st;
    maco_ep_buffer_t buf;
};

EpBuffer *ep_buffer_create(const Comm &c, int mode, int max_tokens, int hidden, int num_experts,
                           int topk, int dtype, int64_t max_recv_tokens, int num_ctas)
{
    maco_comm_t comm = c.get();
    maco_ep_config_t cfg{};
    cfg.mode = static_cast<maco_ep_mode_t>(mode);
    cfg.max_tokens_per_rank = max_tokens;
    cfg.hidden = hidden;
    cfg.num_experts = num_experts;
    cfg.topk = topk;
    cfg.dtype = static_cast<maco_datatype_t>(dtype);
    cfg.max_recv_tokens = max_recv_tokens;
    cfg.num_ctas = num_ctas;
    maco_ep_buffer_t b = nullptr;
    checked("maco_ep_buffer_create", comm, [&] { return maco_ep_buffer_create(comm, &cfg, &b); });
    return new EpBuffer(c.st, b);
}

} // namespace

void bind_ep(nb::module_ &m)
{
    nb::class_<EpBuffer>(m, "EpBuffer",
                         "An expert-parallel buffer (maco_ep_buffer_t, maco/ep.h); maco.ep.Buffer "
                         "builds on it.")
        .def("info", &EpBuffer::info, "maco_ep_buffer_get_info as a dict.")
        .def("dispatch", &EpBuffer::dispatch, nb::arg("x"), nb::arg("x_dtype"),
             nb::arg("num_tokens"), nb::arg("hidden"), nb::arg("topk_idx"), nb::arg("topk_weights"),
             nb::arg("topk"), nb::arg("recv_counts"), nb::arg("recv_offsets"),
             nb::arg("recv_topk_weights"), nb::arg("handle"), nb::arg("want_num_recv"),
             nb::arg("stream"), nb::arg("use_fp8") = false,
             "maco_ep_dispatch, or maco_ep_dispatch_fp8 with use_fp8 (addresses as ints, 0 "
             "for NULL); the rows received when want_num_recv (normal mode: waits), else -1. "
             "Releases the GIL.")
        .def("combine", &EpBuffer::combine, nb::arg("expert_out"), nb::arg("dtype"),
             nb::arg("hidden"), nb::arg("handle"), nb::arg("topk_weights"), nb::arg("num_tokens"),
             nb::arg("topk"), nb::arg("y"), nb::arg("stream"), "maco_ep_combine.")
        .def("check", &EpBuffer::check,
             "maco_ep_buffer_check: raises the device-found input error not reported yet.")
        .def("destroy", &EpBuffer::destroy,
             "maco_ep_buffer_destroy (waits for the device); idempotent.")
        .def_prop_ro("destroyed", [](const EpBuffer &b) { return b.buf == nullptr; });
    m.def("ep_buffer_create", &ep_buffer_create, nb::arg("comm"), nb::arg("mode"),
          nb::arg("max_tokens_per_rank"), nb::arg("hidden"), nb::arg("num_experts"),
          nb::arg("topk"), nb::arg("dtype"), nb::arg("max_recv_tokens"), nb::arg("num_ctas"),
          nb::rv_policy::take_ownership,
          "maco_ep_buffer_create (collective, blocking): an EpBuffer on `comm`.");
}

} // namespace maco_py
