/*
 * allreduce.c - the first MACO program to read: every rank adds its vector of float32 into the
 * sum over all ranks with maco_allreduce, and checks the result.
 *
 *   maco-run -n 2 ./allreduce          (any number of ranks on the GPUs of one machine)
 *   srun --mpi=pmix ./allreduce        (or mpirun, torchrun --no-python: across nodes)
 *
 * Rank r contributes in[i] = (r + 1) * (i % 13). The sum over n ranks is
 * n (n + 1) / 2 * (i % 13): small integers, exact in float32 whatever the order of the adds,
 * so the check compares for equality.
 *
 * Every MACO and CUDA status is checked; on failure the program prints the call, the status
 * and the communicator's message (maco_comm_get_last_error: which call, which peer, why) and
 * exits 1. Without a usable GPU (none on this machine, or ranks that share one GPU without
 * MPS) it prints a line starting with "SKIP:" that says why and exits 77 (ctest's and
 * automake's "skipped"), so a script or a CI machine without GPUs tells a skip from a pass.
 *
 * Build: examples/CMakeLists.txt (find_package(maco)) or examples/Makefile (pkg-config).
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include <maco/maco.h>

/* The exit status of a rank that skips (no usable GPU): not 0, so that "skipped" is not
 * mistaken for "worked". */
#define EXIT_SKIPPED 77

/* On failure: print what failed and jump to the cleanup at `out` (rc stays 1). */
#define MACO_CHECK(call)                                                                           \
    do {                                                                                           \
        maco_status_t st_ = (call);                                                                \
        if (st_ != MACO_OK) {                                                                      \
            fprintf(stderr, "allreduce: rank %d: %s failed: %s: %s\n", rank, #call,                \
                    maco_status_string(st_), maco_comm_get_last_error(comm));                      \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "allreduce: rank %d: %s failed: %s (%s)\n", rank, #call,               \
                    cudaGetErrorName(err_), cudaGetErrorString(err_));                             \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    const size_t count = (size_t)1 << 20; /* elements per rank: 4 MiB of float32 */
    const size_t bytes = count * sizeof(float);
    int rc = 1, rank = -1, nranks = 0, device = -1;
    maco_comm_t comm = NULL;
    cudaStream_t stream = NULL;
    float *d_in = NULL, *d_out = NULL, *host = NULL;
    maco_status_t st, async = MACO_OK;
    size_t wrong = 0;

    /* The job comes from the environment that the launcher sets: maco-run, srun, mpirun or
     * torchrun (docs/multi-node.md). The communicator picks GPU local_rank % device count and
     * makes it this thread's device. */
    st = maco_comm_init_from_env(&comm);
    if (st != MACO_OK) {
        fprintf(stderr,
                "allreduce: maco_comm_init_from_env failed: %s (the log line above says why); "
                "start the ranks with maco-run (maco-run -n 2 ./allreduce), srun, mpirun or "
                "torchrun\n",
                maco_status_string(st));
        return 1;
    }
    MACO_CHECK(maco_comm_get_rank(comm, &rank));
    MACO_CHECK(maco_comm_get_nranks(comm, &nranks));
    MACO_CHECK(maco_comm_get_cuda_device(comm, &device));
    if (device < 0) {
        /* The communicator works without a GPU (bootstrap only); collectives do not. */
        char why[512];
        (void)maco_cuda_device_count(why, sizeof(why)); /* the cause, then what to do */
        printf("SKIP: rank %d of %d has no CUDA device, so there is nothing to allreduce: %s\n",
               rank, nranks,
               why[0] != '\0'
                   ? why
                   : "the communicator got no device (maco_comm_get_cuda_device gave -1)");
        rc = EXIT_SKIPPED;
        goto out;
    }

    /* Buffers on the GPU; the input is generated on the host and copied over. */
    host = (float *)malloc(bytes);
    if (host == NULL) {
        fprintf(stderr, "allreduce: rank %d: out of host memory (%zu bytes)\n", rank, bytes);
        goto out;
    }
    for (size_t i = 0; i < count; i++)
        host[i] = (float)(rank + 1) * (float)(i % 13);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc((void **)&d_in, bytes));
    CUDA_CHECK(cudaMalloc((void **)&d_out, bytes));
    CUDA_CHECK(cudaMemcpy(d_in, host, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_out, 0, bytes));

    /* Enqueued on `stream` and returns before the data moved, like ncclAllReduce. Every rank
     * makes the same call. MACO_ERR_UNSUPPORTED means the job has no usable GPU path (a rank
     * without a GPU, ranks on several nodes, ranks sharing a GPU without MPS); it is decided
     * for the whole job, so every rank skips alike. */
    st = maco_allreduce(d_in, d_out, count, MACO_FLOAT32, MACO_SUM, comm, (maco_stream_t)stream);
    if (st == MACO_ERR_UNSUPPORTED) {
        printf("SKIP: rank %d of %d: maco_allreduce is unsupported here: %s\n", rank, nranks,
               maco_comm_get_last_error(comm));
        rc = EXIT_SKIPPED;
        goto out;
    }
    MACO_CHECK(st);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    /* A peer that stopped answering makes the kernels give up after MACO_DEVICE_TIMEOUT
     * instead of hanging; that is reported here, with the peer named, not by the stream. */
    MACO_CHECK(maco_comm_get_async_error(comm, &async));
    if (async != MACO_OK) {
        fprintf(stderr, "allreduce: rank %d: the allreduce failed on the device: %s: %s\n", rank,
                maco_status_string(async), maco_comm_get_last_error(comm));
        goto out;
    }

    CUDA_CHECK(cudaMemcpy(host, d_out, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++) {
        float want = (float)nranks * (float)(nranks + 1) / 2.0f * (float)(i % 13);
        if (host[i] != want) {
            if (wrong < 5)
                fprintf(stderr, "allreduce: rank %d: out[%zu] = %g, expected %g\n", rank, i,
                        (double)host[i], (double)want);
            wrong++;
        }
    }
    if (wrong != 0) {
        fprintf(stderr, "allreduce: rank %d: %zu of %zu elements wrong\n", rank, wrong, count);
        goto out;
    }
    printf("allreduce: rank %d of %d: sum of %zu float32 over %d ranks correct\n", rank, nranks,
           count, nranks);
    rc = 0;

out:
    /* Cleanup in reverse order of creation, of what was created. */
    if (d_out != NULL)
        cudaFree(d_out);
    if (d_in != NULL)
        cudaFree(d_in);
    if (stream != NULL)
        cudaStreamDestroy(stream);
    free(host);
    st = maco_comm_destroy(comm); /* waits for its device work; NULL is accepted */
    if (st != MACO_OK) {
        fprintf(stderr, "allreduce: rank %d: maco_comm_destroy failed: %s\n", rank,
                maco_status_string(st));
        rc = 1;
    }
    return rc;
}
