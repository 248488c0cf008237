/*
 * port_channel.cu - the exchange of memory_channel.cu through port channels: instead of
 * storing into the peer's memory itself, the kernel pushes a trigger (put this range, then
 * signal) into a FIFO that a CPU proxy thread serves; the proxy carries it out with the GPU's
 * copy engines (cudaMemcpyAsync into the peer's mapped buffer) and a stream-ordered write of
 * the peer's semaphore. One thread issues everything, and the SMs are free while data moves.
 *
 *   maco-run -n 2 ./port_channel       (any number of ranks >= 2 on the GPUs of one machine)
 *
 * Every rank owns a buffer of nranks slots and fills slot r = its rank. The kernel
 * put_with_signal's slot r into slot r of every peer's buffer, flushes (waits until the proxy
 * carried out those puts, so slot r could be reused), and waits for every peer's signal; then
 * slot q of every rank's buffer holds rank q's pattern, which the host checks. The steps:
 *   1. cudaMalloc the buffer and register it (maco_mem_register);
 *   2. exchange the registrations (maco_mem_serialize, maco_bootstrap_allgather,
 *      maco_mem_import);
 *   3. create and start a proxy (maco_proxy_create, maco_proxy_start), create a port channel
 *      to each peer over MACO_TRANSPORT_CUDA_COPY (maco_port_channel_create) and copy its
 *      device handle (maco_port_channel_get_device_handle) into device memory;
 *   4. launch the kernel, synchronise, check the statuses it wrote and the data;
 *   5. stop the proxy, destroy the channels, then the proxy.
 *
 * Every MACO and CUDA status is checked; on failure the program prints the call and why and
 * exits 1. Without a usable GPU it prints a line starting with "SKIP:" and exits 77.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include <maco/device/port_channel.h>
#include <maco/maco.h>

#include "../common/slots.cuh"

#define MACO_CHECK(call)                                                                           \
    do {                                                                                           \
        maco_status_t st_ = (call);                                                                \
        if (st_ != MACO_OK) {                                                                      \
            fprintf(stderr, "port_channel: rank %d: %s failed: %s: %s\n", rank, #call,             \
                    maco_status_string(st_), maco_comm_get_last_error(comm));                      \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "port_channel: rank %d: %s failed: %s (%s)\n", rank, #call,            \
                    cudaGetErrorName(err_), cudaGetErrorString(err_));                             \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/*
 * One thread per CTA (every device call of a port channel is made by one thread). chans[q] is
 * the channel to peer q (chans[rank] is unused). The peers are numbered j = 0 .. nranks - 2
 * from the next rank up (peer (rank + 1 + j) % nranks); CTA b serves peers j = b,
 * b + gridDim.x, ... It pushes a put_with_signal to each of them, flushes, then waits for each
 * one's signal and writes the status to status[q]. All calls return a status: a full FIFO, a
 * flush or a signal that does not come within MACO_DEVICE_TIMEOUT, or a proxy that stopped,
 * end the kernel with an error instead of a hang.
 *
 * Why the grid is at most maco_comm_get_coresident_ctas() CTAs: a CTA's wait ends only when the
 * peer's CTA for this rank has pushed its put. If some CTAs cannot be resident until others
 * finish (more CTAs than the GPU holds at once, or ranks that share one GPU under MPS), every
 * resident CTA may be waiting for a peer CTA that is not resident, and the waits can only time
 * out. Launching at most that many CTAs keeps every CTA of every rank resident together.
 */
static __global__ void exchange(const maco_port_channel_device_t *chans, int nranks, int rank,
                                uint64_t slot_bytes, int *status)
{
    const uint64_t mine = (uint64_t)rank * slot_bytes; /* offset of this rank's slot */
    maco_status_t st = MACO_OK;
    const maco_port_channel_device_t *last = NULL;
    /* The copy engines read slot `rank`, written by an earlier kernel. Data that other threads
     * of this kernel wrote needs a __syncthreads() before the push, and writes to other GPUs'
     * or host memory that the peer relies on a __threadfence_system() before the signal
     * (maco/device/port_channel.h). */
    for (int j = (int)blockIdx.x; j < nranks - 1 && st == MACO_OK; j += (int)gridDim.x) {
        last = &chans[(rank + 1 + j) % nranks];
        st = maco_port_channel_put_with_signal(last, mine, mine, slot_bytes);
    }
    /* One flush covers every earlier trigger of this GPU's FIFO, whichever channel. */
    if (st == MACO_OK && last != NULL)
        st = maco_port_channel_flush(last);
    for (int j = (int)blockIdx.x; j < nranks - 1; j += (int)gridDim.x) {
        int q = (rank + 1 + j) % nranks;
        /* Acquire: once it returns, peer q's put into our slot q has landed. */
        status[q] = st != MACO_OK ? (int)st : (int)maco_port_channel_wait(&chans[q]);
    }
}

/* Step 3 of main: a started proxy in *proxy_p (set as soon as it exists, so that the caller
 * tears it down on failure) and a CUDA-copy port channel to every peer q in chans[q], with its
 * device handle in h_dev[q]. Returns 0, or -1 after printing the failed call. */
static int open_channels(maco_comm_t comm, int rank, int nranks, maco_mem_t mine,
                         const maco_mem_t *peers, maco_proxy_t *proxy_p, maco_port_channel_t *chans,
                         maco_port_channel_device_t *h_dev)
{
    MACO_CHECK(maco_proxy_create(comm, proxy_p));
    MACO_CHECK(maco_proxy_start(*proxy_p));
    for (int q = 0; q < nranks; q++) {
        if (q == rank)
            continue;
        MACO_CHECK(maco_port_channel_create(*proxy_p, q, MACO_TRANSPORT_CUDA_COPY, mine, peers[q],
                                            &chans[q]));
        MACO_CHECK(maco_port_channel_get_device_handle(chans[q], &h_dev[q]));
    }
    return 0;
out:
    return -1;
}

int main(void)
{
    const uint64_t slot_bytes = 1 << 20; /* what each rank sends to each peer */
    int rc = 1, rank = -1, nranks = 0, device = -1, ctas = 0, grid = 0, wrong_peers = 0;
    maco_comm_t comm = NULL;
    maco_bootstrap_t bs = NULL;
    char *buf = NULL;
    maco_mem_t mine = NULL;
    maco_mem_t *peers = NULL; /* [nranks], the peers' imported buffers */
    uint8_t *handles = NULL;  /* [nranks][MACO_MEM_HANDLE_BYTES] */
    maco_proxy_t proxy = NULL;
    maco_port_channel_t *chans = NULL;                       /* [nranks] */
    maco_port_channel_device_t *h_dev = NULL, *d_dev = NULL; /* [nranks] device handles */
    int *h_status = NULL, *d_status = NULL;                  /* [nranks] kernel statuses */
    uint32_t *check = NULL;
    maco_status_t st, async = MACO_OK;

    st = maco_comm_init_from_env(&comm);
    if (st != MACO_OK) {
        fprintf(stderr,
                "port_channel: maco_comm_init_from_env failed: %s (the log line above says "
                "why); start the ranks with maco-run (maco-run -n 2 ./port_channel), srun, "
                "mpirun or torchrun\n",
                maco_status_string(st));
        return 1;
    }
    MACO_CHECK(maco_comm_get_rank(comm, &rank));
    MACO_CHECK(maco_comm_get_nranks(comm, &nranks));
    MACO_CHECK(maco_comm_get_cuda_device(comm, &device));
    MACO_CHECK(maco_comm_get_bootstrap(comm, &bs));
    if (device < 0) {
        print_skip_no_device("no port channel can be made here (this example needs GPUs)", rank,
                             nranks);
        rc = EXAMPLE_EXIT_SKIPPED;
        goto out;
    }
    if (nranks < 2) {
        fprintf(stderr, "port_channel: needs at least 2 ranks: maco-run -n 2 ./port_channel\n");
        goto out;
    }

    /* 1. This rank's buffer: slot `rank` filled, the peers' slots zero. */
    CUDA_CHECK(cudaMalloc((void **)&buf, (size_t)nranks * slot_bytes));
    /* MACO_ERR_UNSUPPORTED: the job has no usable GPU path (a rank without a GPU, several
     * nodes, ranks that share a GPU without MPS); decided for the whole job, so every rank
     * skips alike. */
    st = maco_mem_register(comm, buf, (size_t)nranks * slot_bytes, &mine);
    if (st == MACO_ERR_UNSUPPORTED) {
        printf("SKIP: rank %d of %d: port channels are unsupported here: %s\n", rank, nranks,
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
    chans = (maco_port_channel_t *)calloc((size_t)nranks, sizeof(*chans));
    h_dev = (maco_port_channel_device_t *)calloc((size_t)nranks, sizeof(*h_dev));
    h_status = (int *)calloc((size_t)nranks, sizeof(*h_status));
    check = (uint32_t *)malloc(slot_bytes);
    if (handles == NULL || peers == NULL || chans == NULL || h_dev == NULL || h_status == NULL ||
        check == NULL) {
        fprintf(stderr, "port_channel: rank %d: out of host memory\n", rank);
        goto out;
    }
    if (import_peer_slots("port_channel", comm, bs, rank, nranks, mine, handles, peers) != 0)
        goto out;

    /* 3. A proxy thread for this rank's GPU, and one channel per peer on it. Creation is
     * pairwise collective (the two ranks exchange semaphore ids): every rank creates its
     * channels in the same order, peer 0 first. */
    if (open_channels(comm, rank, nranks, mine, peers, &proxy, chans, h_dev) != 0)
        goto out;
    CUDA_CHECK(cudaMalloc((void **)&d_dev, (size_t)nranks * sizeof(*d_dev)));
    CUDA_CHECK(cudaMemcpy(d_dev, h_dev, (size_t)nranks * sizeof(*d_dev), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc((void **)&d_status, (size_t)nranks * sizeof(*d_status)));
    CUDA_CHECK(cudaMemset(d_status, 0, (size_t)nranks * sizeof(*d_status)));

    /* 4. Launch. No rank may write into a peer's buffer before that peer has cleared it (step
     * 1), hence the barrier. Co-residency (see the kernel): at most `ctas` CTAs. */
    MACO_CHECK(maco_comm_get_coresident_ctas(comm, &ctas));
    if (ctas < 1) {
        fprintf(stderr, "port_channel: rank %d: %d co-resident CTAs\n", rank, ctas);
        goto out;
    }
    grid = nranks - 1 < ctas ? nranks - 1 : ctas;
    MACO_CHECK(maco_bootstrap_barrier(bs));
    exchange<<<grid, 1>>>(d_dev, nranks, rank, slot_bytes, d_status);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    /* Failures of the proxy thread (a copy that failed, a trigger it refused) and device
     * timeouts are reported here, with the peer named. */
    MACO_CHECK(maco_comm_get_async_error(comm, &async));
    if (async != MACO_OK) {
        fprintf(stderr, "port_channel: rank %d: the exchange failed asynchronously: %s: %s\n", rank,
                maco_status_string(async), maco_comm_get_last_error(comm));
        goto out;
    }
    CUDA_CHECK(
        cudaMemcpy(h_status, d_status, (size_t)nranks * sizeof(*h_status), cudaMemcpyDeviceToHost));

    wrong_peers = wrong_peers_of("port_channel", "exchange failed on the device with", buf,
                                 slot_bytes, rank, nranks, h_status, check);
    if (wrong_peers != 0)
        goto out;
    printf("port_channel: rank %d of %d: %llu bytes from each of %d peers correct (%d CTAs)\n",
           rank, nranks, (unsigned long long)slot_bytes, nranks - 1, grid);
    rc = 0;

out:
    /* 5. Teardown in reverse order: stop the proxy (it drains what was pushed), destroy the
     * channels, then the proxy; unmap the peers' buffers, end our registration; then, after a
     * successful exchange, a barrier, so that no peer still maps our buffer when we free it
     * (after a failure, maco-run ends the job: a barrier could wait for a rank that failed). */
    if (proxy != NULL && maco_proxy_stop(proxy) != MACO_OK)
        rc = 1;
    if (chans != NULL)
        for (int q = 0; q < nranks; q++)
            maco_port_channel_destroy(chans[q]);
    if (maco_proxy_destroy(proxy) != MACO_OK)
        rc = 1;
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
