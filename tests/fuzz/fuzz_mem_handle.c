/*
 * fuzz_mem_handle.c - libFuzzer harness for the memory handle decoder,
 * maco__mem_handle_decode (mem_handle.c), which reads the 128 bytes that maco_mem_serialize
 * wrote in another process and that maco_mem_import is handed.
 *
 * Feeds: u8 world-size selector (nranks = byte + 1; 255 means INT32_MAX ranks), u8 rank
 * selector (rank = byte % nranks), then the 128-byte handle (zero-padded or truncated), so
 * inputs are at most 130 bytes.
 * Checks, besides AddressSanitizer and UBSan, the decoder's documented contract (mem_handle.h):
 *   - on failure: MACO_ERR_INVALID_ARGUMENT or MACO_ERR_UNSUPPORTED, and *h untouched;
 *   - on success: a known kind, an owner that is another rank of [0, nranks), 0 < bytes,
 *     offset + bytes <= alloc_bytes <= 4 PiB (without wrapping), host kinds on device -1 and
 *     device kinds on a device >= 0, and every decoded field equal to its bytes in the input.
 * A broken invariant abort()s, which libFuzzer reports as a crash.
 */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "src/host/memory/mem_handle.h"
#include "src/host/base/wire.h"

enum { HANDLE_BYTES = 128 };

MACO_FUZZ_QUIET_INITIALIZE()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int nranks = data[0] == 0xFF ? INT32_MAX : data[0] + 1;
    int rank = data[1] % nranks;
    uint8_t p[HANDLE_BYTES];
    memset(p, 0, sizeof(p));
    memcpy(p, data + 2, size - 2 < sizeof(p) ? size - 2 : sizeof(p));

    maco__mem_handle_t h, canary;
    memset(&canary, 0xA5, sizeof(canary));
    h = canary;
    maco_status_t st = maco__mem_handle_decode(p, nranks, rank, &h);
    if (st != MACO_OK) {
        MACO_FUZZ_CHECK(st == MACO_ERR_INVALID_ARGUMENT || st == MACO_ERR_UNSUPPORTED);
        MACO_FUZZ_CHECK(memcmp(&h, &canary, sizeof(h)) == 0);
        return 0;
    }
    MACO_FUZZ_CHECK(maco__get_u32(p) == MACO__MEM_MAGIC);
    MACO_FUZZ_CHECK(maco__get_u16(p + 4) == MACO__MEM_VERSION);
    MACO_FUZZ_CHECK(h.kind >= MACO__KIND_CUDA_IPC && h.kind <= MACO__KIND_LOCAL);
    MACO_FUZZ_CHECK(h.owner >= 0 && h.owner < nranks && h.owner != rank);
    MACO_FUZZ_CHECK(h.bytes > 0 && h.alloc_bytes > 0);
    MACO_FUZZ_CHECK(h.offset <= h.alloc_bytes && h.bytes <= h.alloc_bytes - h.offset);
    MACO_FUZZ_CHECK(h.offset + h.bytes <= h.alloc_bytes); /* no wrap, given the line above */
    MACO_FUZZ_CHECK(h.alloc_bytes <= ((uint64_t)1 << 52));
    int host = h.kind == MACO__KIND_HOST_FD || h.kind == MACO__KIND_LOCAL;
    MACO_FUZZ_CHECK(host ? h.owner_device == -1 : h.owner_device >= 0);
    /* Every field is its bytes, as mem_handle.h lays them out. */
    MACO_FUZZ_CHECK(h.kind == maco__get_u16(p + 6));
    MACO_FUZZ_CHECK(h.owner == (int32_t)maco__get_u32(p + 8));
    MACO_FUZZ_CHECK(h.owner_device == (int32_t)maco__get_u32(p + 12));
    MACO_FUZZ_CHECK(h.bytes == maco__get_u64(p + 16));
    MACO_FUZZ_CHECK(h.offset == maco__get_u64(p + 24));
    MACO_FUZZ_CHECK(h.alloc_bytes == maco__get_u64(p + 32));
    MACO_FUZZ_CHECK(h.node_hash == maco__get_u64(p + 40));
    MACO_FUZZ_CHECK(h.owner_token == maco__get_u64(p + 48));
    MACO_FUZZ_CHECK(h.owner_ptr == maco__get_u64(p + 56));
    if (h.kind == MACO__KIND_CUDA_IPC)
        MACO_FUZZ_CHECK(memcmp(h.ipc, p + 64, MACO__MEM_IPC_BYTES) == 0);
    MACO_FUZZ_CHECK(h.fd_pid == maco__get_u32(p + 64));
    MACO_FUZZ_CHECK(h.fd_nonce == maco__get_u64(p + 72));
    MACO_FUZZ_CHECK(h.fd_token == maco__get_u64(p + 80));
    return 0;
}
