/* mem_handle.c - decoding and checking serialized memory handles (mem_handle.h). */
#include "src/host/memory/mem_handle.h"

#include <string.h>

#include "src/host/base/log.h"
#include "src/host/base/wire.h"

maco_status_t maco__mem_handle_decode(const void *handle, int nranks, int rank,
                                      maco__mem_handle_t *h)
{
    const uint8_t *p = (const uint8_t *)handle;
    if (maco__get_u32(p) != MACO__MEM_MAGIC || maco__get_u16(p + 4) != MACO__MEM_VERSION)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_import: not a MACO memory handle of version %u (magic "
                           "0x%08x, version %u)",
                           MACO__MEM_VERSION, maco__get_u32(p), maco__get_u16(p + 4));
    maco__mem_handle_t d;
    d.kind = maco__get_u16(p + 6);
    d.owner = (int32_t)maco__get_u32(p + 8);
    d.owner_device = (int32_t)maco__get_u32(p + 12);
    d.bytes = maco__get_u64(p + 16);
    d.offset = maco__get_u64(p + 24);
    d.alloc_bytes = maco__get_u64(p + 32);
    d.node_hash = maco__get_u64(p + 40);
    d.owner_token = maco__get_u64(p + 48);
    d.owner_ptr = maco__get_u64(p + 56);
    if (d.kind < MACO__KIND_CUDA_IPC || d.kind > MACO__KIND_LOCAL)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_MEM,
                           "maco_mem_import: handle kind %d is not supported", d.kind);
    if (d.owner < 0 || d.owner >= nranks || d.owner == rank)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_import: the handle's owner is rank %d; expected another "
                           "rank of [0, %d)",
                           (int)d.owner, nranks);
    /* The fields must agree with each other: a buffer of `bytes` at `offset` inside an
     * allocation of `alloc_bytes` (what the importer maps), host kinds on no device. */
    int host = d.kind == MACO__KIND_HOST_FD || d.kind == MACO__KIND_LOCAL;
    if (d.bytes == 0 || d.alloc_bytes == 0 || d.offset > d.alloc_bytes ||
        d.bytes > d.alloc_bytes - d.offset || d.alloc_bytes > ((uint64_t)1 << 52) ||
        (host ? d.owner_device != -1 : d.owner_device < 0))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_MEM,
                           "maco_mem_import: rank %d's handle is inconsistent: %llu bytes at "
                           "offset %llu of a %llu-byte allocation on device %d (kind %d); it "
                           "was damaged or forged",
                           (int)d.owner, (unsigned long long)d.bytes, (unsigned long long)d.offset,
                           (unsigned long long)d.alloc_bytes, (int)d.owner_device, d.kind);
    if (d.kind == MACO__KIND_CUDA_IPC)
        memcpy(d.ipc, p + 64, MACO__MEM_IPC_BYTES);
    d.fd_pid = maco__get_u32(p + 64);
    d.fd_nonce = maco__get_u64(p + 72);
    d.fd_token = maco__get_u64(p + 80);
    *h = d;
    return MACO_OK;
}
