/*
 * plan.cpp - Plan: an execution plan loaded for a communicator (maco_plan_t, docs/plans.md),
 * and Comm.plan_load, which reads, verifies and sets one up.
 */
#include <string>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

namespace
{

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

} // namespace

void bind_plan(nb::module_ &m, nb::class_<Comm> &c)
{
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

    c.def(
        "plan_load",
        [](const Comm &c, const std::string &path) {
            maco_comm_t comm = c.get();
            maco_plan_t plan = nullptr;
            checked("maco_plan_load", comm,
                    [&] { return maco_plan_load(comm, path.c_str(), &plan); });
            return new Plan(c.st, plan);
        },
        nb::arg("path"), nb::rv_policy::take_ownership,
        "maco_plan_load: reads, verifies and sets up a plan file (collective, blocking).");
}

} // namespace maco_py
