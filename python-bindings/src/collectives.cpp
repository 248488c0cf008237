/*
 * collectives.cpp - Comm's collectives and send/recv (stream-ordered, the GIL released while
 * MACO enqueues), the algorithm choice, the CTA cap and the launch statistics.
 */
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

namespace
{

/* Comm: the algorithm choice, the CTA cap and the launch statistics. */
void bind_settings(nb::class_<Comm> &c)
{
    c.def(
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

void bind_collectives(nb::class_<Comm> &c)
{
    c.def(
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
            nb::arg("stream"));
    bind_settings(c);
}

} // namespace maco_py
