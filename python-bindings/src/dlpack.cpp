/*
 * dlpack.cpp - DLPack in maco._maco: dlpack_describe reads an unconsumed capsule's tensor
 * (address, shape, strides, type, device) for maco/_tensor.py, and Comm.alloc_dlpack exports
 * maco_mem_alloc memory as a capsule (maco.empty), freed when its consumer lets go.
 */
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"

namespace maco_py
{

namespace
{

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
    uintptr_t data = reinterpret_cast<uintptr_t>(t->data);
    if (t->byte_offset > UINTPTR_MAX - data)
        throw nb::value_error(("dlpack_describe: the DLPack tensor's byte_offset " +
                               std::to_string(t->byte_offset) + " from its data address " +
                               std::to_string(data) + " passes the end of the address space")
                                  .c_str());
    uintptr_t address = data + t->byte_offset;
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

} // namespace

void bind_dlpack(nb::module_ &m, nb::class_<Comm> &c)
{
    m.def("dlpack_describe", &dlpack_describe, nb::arg("capsule"),
          "(address, shape, strides|None, code, bits, lanes, device_type, device_id, readonly) "
          "of an unconsumed DLPack capsule. ValueError when its ndim is outside 0..64, its "
          "shape is NULL, a dimension is negative or data + byte_offset passes 2**64.");
    c.def("alloc_dlpack", &alloc_dlpack, nb::arg("shape"), nb::arg("code"), nb::arg("bits"),
          "maco_mem_alloc memory as an unconsumed DLPack capsule (freed by its consumer).");
}

} // namespace maco_py
