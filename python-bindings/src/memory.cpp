/*
 * memory.cpp - Mem: a buffer registered with a communicator (maco_mem_register) or a local
 * peer's registration mapped here (maco_mem_import); both keep the communicator alive. And the
 * Comm methods that make them: register, import_mem, map_registrations.
 */
#include <cstring>
#include <string>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

namespace
{

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

} // namespace

void bind_memory(nb::module_ &m, nb::class_<Comm> &c)
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

    c.def(
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
            "Maps the local peers' new registrations (not collective; blocking).")
        .def(
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
            "Maps a local peer's registration (maco_mem_import); deregister() unmaps it.");
}

} // namespace maco_py
