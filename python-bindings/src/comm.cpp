/*
 * comm.cpp - the class Comm of maco._maco: creation (from a unique id or the environment),
 * properties, errors and the bootstrap's host-side calls (barrier, allgather, broadcast).
 */
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

CommState::~CommState()
{
    if (comm != nullptr)
        maco_comm_destroy(comm);
    if (bs != nullptr)
        maco_bootstrap_destroy(bs);
}

maco_comm_t Comm::get() const
{
    if (!st || st->comm == nullptr)
        throw StatusError{ MACO_ERR_INVALID_USAGE, "the communicator is closed" };
    return st->comm;
}

int Comm::query(maco_status_t (*fn)(maco_comm_t, int *), const char *name) const
{
    int v = 0;
    maco_comm_t c = get();
    Capture capture;
    maco_status_t s = fn(c, &v);
    if (s != MACO_OK)
        raise_status(s, c, name);
    return v;
}

void Comm::close()
{
    std::shared_ptr<CommState> last = std::move(st);
    nb::gil_scoped_release release;
    last.reset();
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

namespace
{

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

/* A communicator made from another one (split, shrink, grow, join), which owns its bootstrap;
 * None when this rank is not a member. */
nb::object adopt(maco_comm_t made)
{
    if (made == nullptr)
        return nb::none();
    auto state = std::make_shared<CommState>();
    state->comm = made;
    return nb::cast(Comm(state));
}

maco_unique_id_t grow_id_of(nb::bytes id)
{
    if (id.size() != MACO_UNIQUE_ID_BYTES)
        throw nb::value_error(("grow_id: expected " + std::to_string(MACO_UNIQUE_ID_BYTES) +
                               " bytes, got " + std::to_string(id.size()))
                                  .c_str());
    maco_unique_id_t uid;
    std::memcpy(uid.bytes, id.c_str(), MACO_UNIQUE_ID_BYTES);
    return uid;
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

} // namespace

static void bind_fault_tolerance(nb::class_<Comm> &c);

void bind_comm(nb::class_<Comm> &c)
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
            nb::arg("data"), "Gathers equally sized bytes from every rank (collective).")
        .def(
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
            nb::arg("data"), nb::arg("root"), "Root's bytes to every rank (collective).");
    bind_fault_tolerance(c);
}

/* Communicators made from a communicator, and surviving failures (maco/comm.h). */
static void bind_fault_tolerance(nb::class_<Comm> &c)
{
    c.def(
         "revoke",
         [](const Comm &c) {
             maco_comm_t comm = c.get();
             checked("maco_comm_revoke", comm, [&] { return maco_comm_revoke(comm); });
         },
         "maco_comm_revoke: ends this rank's and the peers' waits (thread-safe).")
        .def(
            "shrink",
            [](const Comm &c, std::vector<int> exclude, bool abort) {
                maco_comm_t comm = c.get(), made = nullptr;
                checked("maco_comm_shrink", comm, [&] {
                    return maco_comm_shrink(comm, exclude.data(), static_cast<int>(exclude.size()),
                                            abort ? MACO_SHRINK_ABORT : 0u, &made);
                });
                return adopt(made);
            },
            nb::arg("exclude"), nb::arg("abort"),
            "maco_comm_shrink: the live, non-excluded ranks' communicator, or None.")
        .def(
            "split",
            [](const Comm &c, int color, int key) {
                maco_comm_t comm = c.get(), made = nullptr;
                checked("maco_comm_split", comm,
                        [&] { return maco_comm_split(comm, color, key, &made); });
                return adopt(made);
            },
            nb::arg("color"), nb::arg("key"),
            "maco_comm_split: this color's communicator, or None.")
        .def(
            "grow_id",
            [](const Comm &c) {
                maco_comm_t comm = c.get();
                maco_unique_id_t id;
                checked("maco_comm_get_grow_id", comm,
                        [&] { return maco_comm_get_grow_id(comm, &id); });
                return nb::bytes(reinterpret_cast<const char *>(id.bytes), sizeof(id.bytes));
            },
            "maco_comm_get_grow_id (rank 0): the id new ranks join with.")
        .def(
            "grow",
            [](const Comm &c, int nranks, std::optional<nb::bytes> id) {
                maco_comm_t comm = c.get(), made = nullptr;
                maco_unique_id_t uid;
                if (id)
                    uid = grow_id_of(*id);
                checked("maco_comm_grow", comm,
                        [&] { return maco_comm_grow(comm, nranks, id ? &uid : nullptr, &made); });
                return adopt(made);
            },
            nb::arg("nranks"), nb::arg("grow_id").none(),
            "maco_comm_grow: the grown communicator (existing ranks).")
        .def_static(
            "join",
            [](nb::bytes id, int rank, int nranks, int device) {
                maco_unique_id_t uid = grow_id_of(id);
                maco_comm_t made = nullptr;
                checked("maco_comm_join", nullptr,
                        [&] { return maco_comm_join(&uid, rank, nranks, device, &made); });
                return adopt(made);
            },
            nb::arg("grow_id"), nb::arg("rank"), nb::arg("nranks"), nb::arg("device") = -1,
            "maco_comm_join: a new rank's side of a grow.");
}

} // namespace maco_py
