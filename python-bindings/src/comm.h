/*
 * comm.h - the communicator as the extension maco._maco holds it, and the conversions every
 * binding uses: device addresses and cudaStream_t values cross the module as integers (the
 * pure-Python package, maco/_tensor.py, turns tensors into them), datatypes and reductions as
 * their enum values.
 */
#ifndef MACO_PY_COMM_H
#define MACO_PY_COMM_H

#include <cstdint>
#include <memory>
#include <utility>

#include <maco/maco.h>

namespace maco_py
{

/* Owns a communicator and, when this module created it, its bootstrap. Shared by the Comm
 * object, its registrations, plans, persistent kernels, EP buffers and the memory of
 * maco.empty(), so the communicator outlives every object made with it. */
struct CommState {
    maco_comm_t comm = nullptr;
    maco_bootstrap_t bs = nullptr; /* owned; NULL when the communicator owns its bootstrap */

    CommState() = default;
    CommState(const CommState &) = delete;
    CommState &operator=(const CommState &) = delete;
    /* Runs where the last owner lets go: Comm.close() (without the GIL), or the garbage
     * collection of the Comm or of an object made with it. Touches no Python. */
    ~CommState();
};

/* The Python class _maco.Comm: a reference to a CommState; close() drops it. */
class Comm
{
  public:
    explicit Comm(std::shared_ptr<CommState> s) : st(std::move(s)) {}

    /* The communicator; raises InvalidUsageError (as StatusError) once closed. */
    maco_comm_t get() const;

    /* fn(comm, &value) for an int property; raises on a failed status. */
    int query(maco_status_t (*fn)(maco_comm_t, int *), const char *name) const;

    /* Drops this reference; maco_comm_destroy waits for the device (bounded), so the last
     * reference is dropped without the GIL. */
    void close();

    bool closed() const
    {
        return !st;
    }

    std::shared_ptr<CommState> st;
};

/* The communicator's bootstrap (maco_comm_get_bootstrap); raises on failure. */
maco_bootstrap_t comm_bootstrap(const Comm &c);

inline void *ptr(uintptr_t p)
{
    return reinterpret_cast<void *>(p);
}

inline maco_stream_t stream_of(uintptr_t s)
{
    return reinterpret_cast<maco_stream_t>(s);
}

/* A MACO datatype or reduction from its value; ValueError outside the enum. */
maco_datatype_t dtype_of(int d);
maco_redop_t op_of(int o);

} // namespace maco_py

#endif /* MACO_PY_COMM_H */
