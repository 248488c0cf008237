/*
 * module.cpp - the extension module maco._maco: a thin layer over MACO's public C API for the
 * pure-Python package. Buffers and streams cross it as integers (device addresses,
 * cudaStream_t values); every call that can block or launch work releases the GIL; a failing
 * MACO call raises the package's exception for its status (errors.h). The topics are bound by
 * the files that bindings.h lists.
 */
#include <exception>

#include <maco/maco.h>

#include "bindings.h"
#include "errors.h"

NB_MODULE(_maco, m)
{
    using namespace maco_py;
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

    bind_library(m);
    nb::class_<Comm> comm(m, "Comm", "A MACO communicator handle (maco_comm_t) and what owns it.");
    bind_comm(comm);
    bind_collectives(comm);
    bind_memory(m, comm);
    bind_dlpack(m, comm);
    bind_plan(m, comm);
    bind_persistent(m, comm);
    bind_ep(m);
}
