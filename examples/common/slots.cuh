/*
 * slots.cuh - what the channel examples (memory_channel.cu, port_channel.cu) share: every rank
 * owns a buffer of nranks slots of slot_bytes; slot r holds rank r's pattern once the exchange
 * is done. The pattern, the kernel that fills this rank's slot, the exchange of the
 * registrations, the check of the peers' slots, and the message of a rank without a GPU. Each
 * example includes it once.
 */
#ifndef MACO_EXAMPLES_SLOTS_CUH
#define MACO_EXAMPLES_SLOTS_CUH

#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include <maco/maco.h>

/* The exit status of a rank that skips (no usable GPU): 77, as ctest's SKIP_RETURN_CODE and
 * automake use it, so that a script can tell "skipped" from "worked" (0) and "failed" (1). */
#define EXAMPLE_EXIT_SKIPPED 77

/* Word i of rank q's slot. */
static __host__ __device__ uint32_t pattern(int q, uint64_t i)
{
    return (uint32_t)q * 0x9E3779B1u ^ (uint32_t)i;
}

/* This rank's slot (`words` 32-bit words) filled with its pattern; any grid. */
static __global__ void fill_slot(uint32_t *slot, uint64_t words, int rank)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < words;
         i += (uint64_t)gridDim.x * blockDim.x)
        slot[i] = pattern(rank, i);
}

/* Step 2 of both examples: this rank's registration `mine` serialised at its own index of
 * `handles` ([nranks][MACO_MEM_HANDLE_BYTES]), every rank's gathered over `bs` (collective,
 * blocking), and each peer q's buffer imported into peers[q] (peers[rank] is left as it is).
 * Returns 0, or -1 after printing the call that failed, prefixed with `prog`. */
static int import_peer_slots(const char *prog, maco_comm_t comm, maco_bootstrap_t bs, int rank,
                             int nranks, maco_mem_t mine, uint8_t *handles, maco_mem_t *peers)
{
    const char *call = "maco_mem_serialize";
    maco_status_t st = maco_mem_serialize(mine, handles + (size_t)rank * MACO_MEM_HANDLE_BYTES);
    if (st == MACO_OK) {
        call = "maco_bootstrap_allgather";
        st = maco_bootstrap_allgather(bs, handles, MACO_MEM_HANDLE_BYTES);
    }
    for (int q = 0; q < nranks && st == MACO_OK; q++) {
        if (q == rank)
            continue;
        call = "maco_mem_import";
        st = maco_mem_import(comm, handles + (size_t)q * MACO_MEM_HANDLE_BYTES, &peers[q]);
    }
    if (st == MACO_OK)
        return 0;
    fprintf(stderr, "%s: rank %d: %s failed: %s: %s\n", prog, rank, call, maco_status_string(st),
            maco_comm_get_last_error(comm));
    return -1;
}

/* Why a rank without a CUDA device skips (the cause, then what to do); `what` says what could
 * not be made. */
static void print_skip_no_device(const char *what, int rank, int nranks)
{
    char why[512];
    (void)maco_cuda_device_count(why, sizeof(why));
    printf("SKIP: rank %d of %d has no CUDA device, so %s: %s\n", rank, nranks, what,
           why[0] != '\0' ? why
                          : "the communicator got no device (maco_comm_get_cuda_device gave -1)");
}

/*
 * Slot q of `buf` (device memory) must hold rank q's pattern, for every peer q whose exchange
 * succeeded on the device (h_status[q] == MACO_OK; otherwise `failed` is printed with the
 * status). `check` holds one slot (slot_bytes). Messages start with `prog`. Returns how many
 * peers failed or sent a wrong word, or -1 when a cudaMemcpy failed (printed).
 */
static int wrong_peers_of(const char *prog, const char *failed, const char *buf,
                          uint64_t slot_bytes, int rank, int nranks, const int *h_status,
                          uint32_t *check)
{
    int wrong = 0;
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        if (h_status[q] != MACO_OK) {
            fprintf(stderr, "%s: rank %d: %s rank %d: %s\n", prog, rank, failed, q,
                    maco_status_string((maco_status_t)h_status[q]));
            wrong++;
            continue;
        }
        cudaError_t e =
            cudaMemcpy(check, buf + (size_t)q * slot_bytes, slot_bytes, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            fprintf(stderr, "%s: rank %d: cudaMemcpy of rank %d's slot failed: %s (%s)\n", prog,
                    rank, q, cudaGetErrorName(e), cudaGetErrorString(e));
            return -1;
        }
        for (uint64_t i = 0; i < slot_bytes / 4; i++) {
            if (check[i] != pattern(q, i)) {
                fprintf(stderr, "%s: rank %d: word %llu from rank %d is 0x%08x, expected 0x%08x\n",
                        prog, rank, (unsigned long long)i, q, check[i], pattern(q, i));
                wrong++;
                break;
            }
        }
    }
    return wrong;
}

#endif /* MACO_EXAMPLES_SLOTS_CUH */
