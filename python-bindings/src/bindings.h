/*
 * bindings.h - the topics of the extension maco._maco, one source file each; module.cpp calls
 * them in this order from its NB_MODULE. Each adds its functions to the module and, where the
 * topic has calls on a communicator, its methods to the class Comm.
 */
#ifndef MACO_PY_BINDINGS_H
#define MACO_PY_BINDINGS_H

#include <nanobind/nanobind.h>
/* The type casters of every topic: a value of a type whose caster a file lacks would compile
 * and fail only at run time (std::bad_cast), so they all come with this header. */
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "comm.h"

namespace maco_py
{

namespace nb = nanobind;

/* library.cpp: versions, names, the configuration table, CUDA devices, unique ids, groups,
 * batched copies, GEMM tile plans, fused-operator scratch sizes, the plan verifier. */
void bind_library(nb::module_ &m);

/* comm.cpp: Comm's creation, properties, errors and the bootstrap's host calls. */
void bind_comm(nb::class_<Comm> &c);

/* collectives.cpp: Comm's collectives, send/recv, algorithm choice, CTA cap and statistics. */
void bind_collectives(nb::class_<Comm> &c);

/* memory.cpp: Mem (a registration or an import) and Comm.register, import_mem,
 * map_registrations. */
void bind_memory(nb::module_ &m, nb::class_<Comm> &c);

/* dlpack.cpp: dlpack_describe and Comm.alloc_dlpack (maco_mem_alloc memory as DLPack). */
void bind_dlpack(nb::module_ &m, nb::class_<Comm> &c);

/* plan.cpp: Plan (maco_plan_t) and Comm.plan_load. */
void bind_plan(nb::module_ &m, nb::class_<Comm> &c);

/* persistent.cpp: PKernel (task graph, fused operators' channels, persistent kernel) and
 * Comm.persistent_kernel. */
void bind_persistent(nb::module_ &m, nb::class_<Comm> &c);

/* ep.cpp: EpBuffer (maco/ep.h) and ep_buffer_create. */
void bind_ep(nb::module_ &m);

} // namespace maco_py

#endif /* MACO_PY_BINDINGS_H */
