/*
 * memory_channel.cu - a custom kernel that talks to the other ranks' GPUs directly, through
 * memory channels: the GPU writes into a peer's buffer with plain stores (NVLink or PCIe) and
 * tells it so with a semaphore signal.
 *
 *   maco-run -n 2 ./memory_channel     (any number of ranks >= 2 on the GPUs of one machine)
 *
 * Every rank owns a buffer of nranks slots. Rank r fills slot r with its pattern, and the
 * kernel puts slot r into slot r of every peer's buffer, signals each peer, and waits for each
 * peer's signal; then slot q of every rank's buffer holds rank q's pattern, which the host
 * checks. The steps on the host:
 *   1. cudaMalloc the buffer and register it (maco_mem_register);
 *   2. exchange the registrations: serialize (maco_mem_serialize), gather every rank's handle
 *      (maco_bootstrap_allgather), map each peer's buffer here (maco_mem_import);
 *   3. create a memory channel to each peer (maco_memory_channel_create) and copy its device
 *      handle (maco_memory_channel_get_device_handle) into device memory for the kernel;
 *   4. launch the kernel, synchronise, check the statuses it wrote and the data.
 *
 * Every MACO and CUDA status is checked; on failure the program prints the call and why and
 * exits 1. Without a usable GPU it prints a line starting with "SKIP:" and exits 77.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include <maco/device/memory_channel.h>
#include <maco/maco.h>

#include "../common/slots.cuh"

#define MACO_CHECK(call)                                                                           \
    do {                                                                                           \
        maco_status_t st_ = (call);                                                                \
        if (st_ != MACO_OK) {                                                                      \
            fprintf(stderr, "memory_channel: rank %d: %s failed: %s: %s\n", rank, #call,           \
                    maco_status_string(st_), maco_comm_get_last_error(comm));                      \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "memory_channel: rank %d: %s failed: %s (%s)\n", rank, #call,          \
                    cudaGetErrorName(err_), cudaGetErrorString(err_));                             \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/*
 * chans[q] is the channel to peer q (chans[rank] is unused). The peers are numbered
 * j = 0 .. nranks - 2 from the next rank up (peer (rank + 1 + j) % nranks), so the ranks start
 * with different peers; CTA b serves peers j = b, b + gridDim.x, ... For each, all its threads
 * copy slot `rank` into the peer's buffer and one thread signals. Then thread 0 waits for each
 * of its peers' signals and writes the status to status[q].
 *
 * Why the grid is at most maco_comm_get_coresident_ctas() CTAs: a CTA's wait ends only when the
 * peer's CTA for this rank has run far enough to signal. If some CTAs cannot be resident until
 * others finish (more CTAs than the GPU holds at once, or ranks that share one GPU under MPS),
 * every resident CTA may be waiting for a peer CTA that is not resident, on both sides, and the
 * waits can only time out. Launching at most that many CTAs keeps every CTA of every rank
 * resident at the same time.
 */
static __global__ void exchange(const maco_memory_channel_device_t *chans, int nranks, int rank,
                                uint64_t slot_bytes, int *status)
{
    const uint64_t mine = (uint64_t)rank * slot_bytes; /* offset of this rank's slot */
    for (int j = (int)blockIdx.x; j < nranks - 1; j += (int)gridDim.x) {
        const maco_memory_channel_device_t *ch = &chans[(rank + 1 + j) % nranks];
        /* Cooperative copy by the whole CTA: local[mine..] -> the peer's remote[mine..]. */
        maco_memory_channel_put(ch, mine, mine, slot_bytes, threadIdx.x, blockDim.x);
        /* Every thread's stores are done before thread 0's release signal publishes them. */
        __syncthreads();
        if (threadIdx.x == 0)
            maco_memory_channel_signal(ch);
    }
    if (threadIdx.x != 0)
        return;
    for (int j = (int)blockIdx.x; j < nranks - 1; j += (int)gridDim.x) {
        int q = (rank + 1 + j) % nranks;
        /* Acquire: once it returns, peer q's put into our slot q is visible. The wait is
         * bounded by MACO_DEVICE_TIMEOUT; a timeout is also reported to the host through
         * maco_comm_get_async_error, with the peer and the semaphore named. */
        status[q] = (int)maco_memory_channel_wait(&chans[q]);
    }
}

int main(void)
{
    const uint64_t slot_bytes = 1 << 20; /* what each rank sends to each peer */
    const int threads = 512;
    int rc = 1, rank = -1, nranks = 0, device = -1, ctas = 0, grid = 0, wrong_peers = 0;
    maco_comm_t comm = NULL;
    maco_bootstrap_t bs = NULL;
    char *buf = NULL;
    maco_mem_t mine = NULL;
    maco_mem_t *peers = NULL;            /* [nranks], the peers' imported buffers */
    uint8_t *handles = NULL;             /* [nranks][MACO_MEM_HANDLE_BYTES] */
    maco_memory_channel_t *chans = NULL; /* [nranks] */
    maco_memory_channel_device_t *h_dev = NULL, *d_dev = NULL; /* [nranks] device handles */
    int *h_status = NULL, *d_status = NULL;                    /* [nranks] kernel statuses */
    uint32_t *check = NULL;
    maco_status_t st, async = MACO_OK;

    st = maco_comm_init_from_env(&comm);
    if (st != MACO_OK) {
        fprintf(stderr,
                "memory_channel: maco_comm_init_from_env failed: %s (the log line above says "
                "why); start the ranks with maco-run (maco-run -n 2 ./memory_channel), srun, "
                "mpirun or torchrun\n",
                maco_status_string(st));
        return 1;
    }
    MACO_CHECK(maco_comm_get_rank(comm, &rank));
    MACO_CHECK(maco_comm_get_nranks(comm, &nranks));
    MACO_CHECK(maco_comm_get_cuda_device(comm, &device));
    MACO_CHECK(maco_comm_get_bootstrap(comm, &bs));
    if (device < 0) {
        print_skip_no_device("no memory channel can be made (they need GPUs)", rank, nranks);
        rc = EXAMPLE_EXIT_SKIPPED;
        goto out;
    }
    if (nranks < 2) {
        fprintf(stderr, "memory_channel: needs at least 2 ranks: maco-run -n 2 ./memory_channel\n");
        goto out;
    }

    /* 1. This rank's buffer: slot `rank` filled, the peers' slots zero. */
    CUDA_CHECK(cudaMalloc((void **)&buf, (size_t)nranks * slot_bytes));
    /* Registration fails with MACO_ERR_UNSUPPORTED when the job has no usable GPU path (a rank
     * without a GPU, several nodes, ranks that share a GPU without MPS); that is decided for
     * the whole job, so every rank skips alike. */
    st = maco_mem_register(comm, buf, (size_t)nranks * slot_bytes, &mine);
    if (st == MACO_ERR_UNSUPPORTED) {
        printf("SKIP: rank %d of %d: memory channels are unsupported here: %s\n", rank, nranks,
               maco_comm_get_last_error(comm));
        rc = EXAMPLE_EXIT_SKIPPED;
        goto out;
    }
    MACO_CHECK(st);
    CUDA_CHECK(cudaMemset(buf, 0, (size_t)nranks * slot_bytes));
    fill_slot<<<64, 256>>>((uint32_t *)(buf + (size_t)rank * slot_bytes), slot_bytes / 4, rank);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());

    /* 2. Exchange the registrations: each rank writes its handle at its own index. */
    handles = (uint8_t *)calloc((size_t)nranks, MACO_MEM_HANDLE_BYTES);
    peers = (maco_mem_t *)calloc((size_t)nranks, sizeof(*peers));
    chans = (maco_memory_channel_t *)calloc((size_t)nranks, sizeof(*chans));
    h_dev = (maco_memory_channel_device_t *)calloc((size_t)nranks, sizeof(*h_dev));
    h_status = (int *)calloc((size_t)nranks, sizeof(*h_status));
    check = (uint32_t *)malloc(slot_bytes);
    if (handles == NULL || peers == NULL || chans == NULL || h_dev == NULL || h_status == NULL ||
        check == NULL) {
        fprintf(stderr, "memory_channel: rank %d: out of host memory\n", rank);
        goto out;
    }
    if (import_peer_slots("memory_channel", comm, bs, rank, nranks, mine, handles, peers) != 0)
        goto out;

    /* 3. One channel per peer. Creation is pairwise collective (the two ranks exchange
     * semaphore ids): every rank creates its channels in the same order, peer 0 first. */
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        MACO_CHECK(maco_memory_channel_create(comm, q, mine, peers[q], &chans[q]));
        MACO_CHECK(maco_memory_channel_get_device_handle(chans[q], &h_dev[q]));
    }
    CUDA_CHECK(cudaMalloc((void **)&d_dev, (size_t)nranks * sizeof(*d_dev)));
    CUDA_CHECK(cudaMemcpy(d_dev, h_dev, (size_t)nranks * sizeof(*d_dev), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc((void **)&d_status, (size_t)nranks * sizeof(*d_status)));
    CUDA_CHECK(cudaMemset(d_status, 0, (size_t)nranks * sizeof(*d_status)));

    /* 4. Launch. No rank may write into a peer's buffer before that peer has cleared it (step
     * 1), hence the barrier. Co-residency (see the kernel): at most `ctas` CTAs. */
    MACO_CHECK(maco_comm_get_coresident_ctas(comm, &ctas));
    if (ctas < 1) {
        fprintf(stderr, "memory_channel: rank %d: maco_comm_get_coresident_ctas gave %d\n", rank,
                ctas);
        goto out;
    }
    grid = nranks - 1 < ctas ? nranks - 1 : ctas;
    MACO_CHECK(maco_bootstrap_barrier(bs));
    exchange<<<grid, threads>>>(d_dev, nranks, rank, slot_bytes, d_status);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    MACO_CHECK(maco_comm_get_async_error(comm, &async));
    if (async != MACO_OK) {
        fprintf(stderr, "memory_channel: rank %d: a device wait failed: %s: %s\n", rank,
                maco_status_string(async), maco_comm_get_last_error(comm));
        goto out;
    }
    CUDA_CHECK(
        cudaMemcpy(h_status, d_status, (size_t)nranks * sizeof(*h_status), cudaMemcpyDeviceToHost));

    wrong_peers = wrong_peers_of("memory_channel", "no signal from", buf, slot_bytes, rank, nranks,
                                 h_status, check);
    if (wrong_peers != 0)
        goto out;
    printf("memory_channel: rank %d of %d: %llu bytes from each of %d peers correct (%d CTAs)\n",
           rank, nranks, (unsigned long long)slot_bytes, nranks - 1, grid);
    rc = 0;

out:
    /* Teardown in reverse order: channels, the peers' mappings, our registration; then, after
     * a successful exchange, a barrier, so that no peer still maps our buffer when we free it
     * (after a failure, maco-run ends the job: a barrier could wait for a rank that failed). */
    if (chans != NULL)
        for (int q = 0; q < nranks; q++)
            maco_memory_channel_destroy(chans[q]);
    if (peers != NULL)
        for (int q = 0; q < nranks; q++)
            maco_mem_deregister(peers[q]);
    maco_mem_deregister(mine);
    if (rc == 0 && mine != NULL && maco_bootstrap_barrier(bs) != MACO_OK)
        rc = 1;
    if (d_status != NULL)
        cudaFree(d_status);
    if (d_dev != NULL)
        cudaFree(d_dev);
    if (buf != NULL)
        cudaFree(buf);
    free(check);
    free(h_status);
    free(h_dev);
    free(chans);
    free(peers);
    free(handles);
    if (maco_comm_destroy(comm) != MACO_OK)
        rc = 1;
    return rc;
}
