/*
 * launch.c - a task graph made launchable: the CTA split, the upload (one allocation for what
 * never changes, one zeroed allocation for the counters and queues the kernel advances), the
 * launch, and the profile's records.
 *
 * The memory layout is maco__pk_layout's (graph_lower.c).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/host/comm/comm_internal.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "runtime/host/runtime_internal.h"
#include "runtime/device/launch.h"

enum { MACO__PK_DEFAULT_THREADS = 256 };

struct maco_persistent_kernel {
    maco_comm_t comm;
    maco_pk_view_t view;
    maco_persistent_config_t config;
    int grid;
    int gemm; /* runs a kernel with GEMM tiles: MACO__PK_GEMM_* */
    uint32_t ntasks;
    void *fixed, *state;
    void *gemm_maps; /* the GMMA kernel's TMA tensor maps (view.gemm_maps), or NULL */
    char **labels;   /* [ntasks] task names for the profile */
    uint8_t *roles;  /* [ntasks] MACO_PK_ROLE_* */
};

/* Which kernel runs a graph with GEMM tiles. */
enum { MACO__PK_GEMM_NONE = 0, MACO__PK_GEMM_CUBLASDX = 1, MACO__PK_GEMM_GMMA = 2 };

/* Picks the GEMM tiles by MACO_GEMM_TILE (default auto: the GMMA ones where the
 * library has them and the current GPU runs sm_90a code, else cuBLASDx's) and how many of its
 * CTAs fit on an SM. */
static maco_status_t maco__pk_gemm_pick(const char *fn, int *kind_p, int *per_sm_p)
{
    const char *want = NULL;
    maco_status_t wst = maco__config_word(MACO_CFG_GEMM_TILE, &want); /* auto, gmma, cublasdx */
    if (wst != MACO_OK)
        return wst; /* the message names MACO_GEMM_TILE and what it accepts */
    int auto_ = strcasecmp(want, "auto") == 0, gmma = strcasecmp(want, "gmma") == 0;
    if (gmma && !maco__pk_gemm_gmma_built())
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PERSIST,
                           "%s: MACO_GEMM_TILE=gmma: this library was built without the GMMA "
                           "tiles (they need 90 among CMAKE_CUDA_ARCHITECTURES)",
                           fn);
    if ((auto_ || gmma) && maco__pk_gemm_gmma_built()) {
        cudaError_t cerr = maco__pk_gemm_gmma_ctas_per_sm(per_sm_p);
        if (cerr == cudaSuccess) {
            *kind_p = MACO__PK_GEMM_GMMA;
            return MACO_OK;
        }
        (void)cudaGetLastError(); /* not sticky: the kernel's image does not fit this GPU */
        if (gmma)
            return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PERSIST,
                               "%s: MACO_GEMM_TILE=gmma: this GPU cannot run the sm_90a GMMA "
                               "tiles: %s",
                               fn, cudaGetErrorString(cerr));
        MACO_LOG(MACO_LOG_INFO, MACO_SUBSYS_PERSIST,
                 "%s: GMMA tiles not usable on this GPU (%s): cuBLASDx tiles", fn,
                 cudaGetErrorString(cerr));
    }
    cudaError_t cerr = maco__pk_gemm_ctas_per_sm(per_sm_p);
    if (cerr != cudaSuccess)
        return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PERSIST,
                           "%s: cudaOccupancyMaxActiveBlocksPerMultiprocessor failed: %s", fn,
                           cudaGetErrorString(cerr));
    *kind_p = MACO__PK_GEMM_CUBLASDX;
    return MACO_OK;
}

/* Resolves the CTA split (maco/persistent.h, maco_persistent_kernel_create). */
static maco_status_t maco__pk_split(maco_comm_t comm, const maco__pk_lowered_t *l,
                                    const maco_persistent_config_t *in,
                                    maco_persistent_config_t *out, int *gemm_kind_p)
{
    const char *fn = "maco_persistent_kernel_create";
    maco_persistent_config_t c;
    memset(&c, 0, sizeof(c));
    if (in != NULL)
        c = *in;
    int gemm = l->ngemm_tasks > 0;
    if (gemm && !maco__pk_gemm_available())
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PERSIST,
                           "%s: the graph has %u GEMM tiles, and this library was built without "
                           "cuBLASDx (configure with -DMACO_MATHDX_DIR=<nvidia-mathdx's "
                           "nvidia/mathdx folder>)",
                           fn, l->ngemm_tasks);
    if (c.threads == 0)
        c.threads = gemm ? MACO__PK_GEMM_THREADS : MACO__PK_DEFAULT_THREADS;
    if (gemm && c.threads != MACO__PK_GEMM_THREADS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: threads = %d: a graph with GEMM tiles runs with %d threads per "
                           "CTA",
                           fn, c.threads, MACO__PK_GEMM_THREADS);
    if (c.threads < 64 || c.threads > MACO__PK_MAX_THREADS || c.threads % 32 != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: threads = %d: a multiple of 32 in [64, %d]", fn, c.threads,
                           MACO__PK_MAX_THREADS);
    int per_sm = 0, kind = MACO__PK_GEMM_NONE;
    if (gemm) {
        maco_status_t st = maco__pk_gemm_pick(fn, &kind, &per_sm);
        if (st != MACO_OK)
            return st;
        if (kind == MACO__PK_GEMM_CUBLASDX && l->npartial_gemm > 0)
            return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PERSIST,
                               "%s: %u GEMM tiles belong to a GEMM whose m is not a multiple of "
                               "%d; only the GMMA tiles (Hopper, MACO_GEMM_TILE=auto or gmma) "
                               "store a partial last row of tiles, and this kernel uses "
                               "cuBLASDx's",
                               fn, l->npartial_gemm, MACO_GEMM_TILE_M);
        if (kind == MACO__PK_GEMM_CUBLASDX && l->nstrided_gemm > 0)
            return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PERSIST,
                               "%s: %u GEMM tiles read a slice of K of a wider A (ld_in, "
                               "split-K); only the GMMA tiles (Hopper, MACO_GEMM_TILE=auto or "
                               "gmma) do, and this kernel uses cuBLASDx's",
                               fn, l->nstrided_gemm);
        /* The GMMA tiles add a producer warpgroup to the MACO_GEMM_TILE_THREADS that compute. */
        if (kind == MACO__PK_GEMM_GMMA)
            c.threads = MACO__PK_GEMM_GMMA_THREADS;
    } else {
        cudaError_t cerr = maco__pk_ctas_per_sm(c.threads, &per_sm);
        if (cerr != cudaSuccess)
            return maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PERSIST,
                               "%s: cudaOccupancyMaxActiveBlocksPerMultiprocessor failed: %s", fn,
                               cudaGetErrorString(cerr));
    }
    int T = comm->coresident_ctas;
    if (c.comm_workers == 0 && l->ncomm_tasks > 0 && l->comm_workers_hint > 0)
        c.comm_workers =
            l->comm_workers_hint < T / 2 ? l->comm_workers_hint : (T / 2 > 1 ? T / 2 : 1);
    else if (c.comm_workers == 0)
        c.comm_workers = l->ncomm_tasks > 0 ? (T / 16 > 1 ? T / 16 : 1) : 0;
    else if (c.comm_workers == MACO_PERSISTENT_NONE)
        c.comm_workers = 0;
    int avail = T - c.comm_workers;
    if (c.workers == 0 && c.schedulers == 0) {
        if (per_sm >= 2) { /* a worker on every SM; schedulers share SMs with them */
            c.workers = avail;
            c.schedulers = avail / 8 > 1 ? avail / 8 : 1;
        } else { /* one CTA per SM: few schedulers, each on an SM of its own */
            c.schedulers = avail / 32 > 1 ? avail / 32 : 1;
            c.workers = avail - c.schedulers;
        }
    } else if (c.workers == 0) {
        c.workers = avail - c.schedulers;
    } else if (c.schedulers == 0) {
        c.schedulers = c.workers / 8 > 1 ? c.workers / 8 : 1;
    }
    if (c.comm_workers < 0 || c.workers < 1 || c.schedulers < 1 || c.schedulers > c.workers)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: split of %d workers, %d schedulers, %d communication workers: "
                           "needs workers >= 1, 1 <= schedulers <= workers, communication "
                           "workers >= 0 (of %d CTAs that fit at one per SM)",
                           fn, c.workers, c.schedulers, c.comm_workers, T);
    long total = (long)c.workers + c.schedulers + c.comm_workers;
    if (per_sm < 1 || total > (long)per_sm * T)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: %ld CTAs (%d workers, %d schedulers, %d communication workers) "
                           "of %d threads cannot all be resident at once: at most %d per SM on "
                           "this rank's %d SMs",
                           fn, total, c.workers, c.schedulers, c.comm_workers, c.threads, per_sm,
                           T);
    *out = c;
    *gemm_kind_p = kind;
    return MACO_OK;
}

/* For the GMMA kernel: encodes the TMA tensor maps of each distinct GEMM of the graph (same A,
 * B, M, N, K, A's row stride and tile width: the width sets B's TMA box) into device memory at
 * *maps_p and sets each GEMM tile's gemm.map in `l`. */
static maco_status_t maco__pk_gemm_maps(const char *fn, maco_task_graph_t g, maco__pk_lowered_t *l,
                                        void **maps_p)
{
    size_t bytes = maco__pk_gemm_gmma_map_bytes();
    uint32_t *first = malloc(l->ngemm_tasks * sizeof(uint32_t)); /* task of each distinct GEMM */
    unsigned char *host = aligned_alloc(64, (l->ngemm_tasks * bytes + 63) / 64 * 64);
    void *dev = NULL;
    uint32_t nmaps = 0;
    maco_status_t st = MACO_OK;
    if (first == NULL || host == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                         "%s: out of host memory for the tensor maps of %u GEMM tasks (%zu bytes)",
                         fn, l->ngemm_tasks, (size_t)l->ngemm_tasks * (bytes + sizeof(uint32_t)));
        goto out;
    }
    for (uint32_t i = 0; i < l->ntasks; i++) {
        const maco_task_t *t = &g->tasks[i];
        if (t->type != MACO_TASK_GEMM_TILE)
            continue;
        uint32_t j = 0;
        for (; j < nmaps; j++) {
            const maco_task_t *u = &g->tasks[first[j]];
            if (u->a == t->a && u->b == t->b && u->m == t->m && u->n == t->n && u->k == t->k &&
                maco__gemm_lda(u) == maco__gemm_lda(t) &&
                maco__gemm_tile_n(u) == maco__gemm_tile_n(t))
                break;
        }
        if (j == nmaps) {
            if (nmaps == MACO__PK_GEMM_MAPS_MAX) {
                st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                                 "%s: GEMM tile %u: more than %d distinct GEMMs (A, B, m, n, k, "
                                 "tile_n) in one graph",
                                 fn, i, MACO__PK_GEMM_MAPS_MAX);
                goto out;
            }
            if (maco__pk_gemm_gmma_map_encode(host + (size_t)nmaps * bytes, t->a, t->b, t->m, t->n,
                                              t->k, maco__gemm_lda(t), maco__gemm_tile_n(t)) != 0) {
                st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                                 "%s: GEMM tile %u (m %u, n %u, k %u): the GMMA tiles read A "
                                 "(%p) and B (%p) with TMA, which needs 16-byte aligned bases "
                                 "and rows (n and k multiples of 8 bf16)",
                                 fn, i, (unsigned)t->m, (unsigned)t->n, (unsigned)t->k, t->a, t->b);
                goto out;
            }
            first[nmaps++] = i;
        }
        l->tasks[i].gemm.map = (uint16_t)j;
    }
    MACO_CUDA_GOTO(cudaMalloc(&dev, nmaps * bytes), st, out);
    MACO_CUDA_GOTO(cudaMemcpy(dev, host, nmaps * bytes, cudaMemcpyHostToDevice), st, out);
    *maps_p = dev;
    dev = NULL;
out:
    cudaFree(dev);
    free(host);
    free(first);
    return st;
}

static void maco__pk_free(maco_persistent_kernel_t k)
{
    if (k == NULL)
        return;
    cudaFree(k->fixed);
    cudaFree(k->state);
    cudaFree(k->gemm_maps);
    if (k->labels != NULL)
        for (uint32_t i = 0; i < k->ntasks; i++)
            free(k->labels[i]);
    free(k->labels);
    free(k->roles);
    free(k);
}

maco_status_t maco_persistent_kernel_create(maco_comm_t comm, maco_task_graph_t graph,
                                            const maco_persistent_config_t *config,
                                            maco_persistent_kernel_t *kernel_p)
{
    const char *fn = "maco_persistent_kernel_create";
    if (comm == NULL || graph == NULL || kernel_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: NULL argument", fn);
    MACO__LOG_RANK_SCOPE(comm->rank);
    maco_status_t st = maco__comm_require_gpu(comm, fn);
    if (st != MACO_OK)
        return st;
    maco__pk_lowered_t l;
    st = maco__task_graph_lower(graph, fn, &l);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    /* The kernel's memory goes on the communicator's device whichever device the calling
     * thread has current; the caller's stays current. */
    int saved = -1;
    maco_persistent_kernel_t k = calloc(1, sizeof(*k));
    char *host = NULL;
    if (k == NULL) {
        st =
            maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                        "%s: out of host memory for the kernel object (%zu bytes)", fn, sizeof(*k));
        goto fail;
    }
    k->comm = comm;
    k->ntasks = l.ntasks;
    st = maco__device_enter_status(comm->cuda_device, &saved, fn);
    if (st != MACO_OK)
        goto fail;
    st = maco__pk_split(comm, &l, config, &k->config, &k->gemm);
    if (st != MACO_OK)
        goto fail;
    uint32_t W = (uint32_t)k->config.workers, C = (uint32_t)k->config.comm_workers,
             S = (uint32_t)k->config.schedulers, nq = W + C + S;
    k->grid = (int)nq;

    size_t fixed_bytes = 0, state_bytes = 0;
    maco__pk_layout(&l, graph->channels, graph->nchannels, W, C, S, k->config.profile, NULL, NULL,
                    NULL, &k->view, &fixed_bytes, &state_bytes);
    MACO_CUDA_GOTO(cudaMalloc(&k->fixed, fixed_bytes), st, fail);
    MACO_CUDA_GOTO(cudaMalloc(&k->state, state_bytes), st, fail);
    MACO_CUDA_GOTO(cudaMemset(k->state, 0, state_bytes), st, fail);
    host = calloc(1, fixed_bytes);
    k->labels = calloc(l.ntasks, sizeof(char *));
    k->roles = calloc(l.ntasks, 1);
    if (host == NULL || k->labels == NULL || k->roles == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST,
                         "%s: out of host memory for the graph of %u tasks (%zu bytes)", fn,
                         l.ntasks, (size_t)fixed_bytes + (size_t)l.ntasks * (sizeof(char *) + 1));
        goto fail;
    }
    if (k->gemm == MACO__PK_GEMM_GMMA) {
        st = maco__pk_gemm_maps(fn, graph, &l, &k->gemm_maps);
        if (st != MACO_OK)
            goto fail;
    }
    maco__pk_layout(&l, graph->channels, graph->nchannels, W, C, S, k->config.profile, k->fixed,
                    k->state, host, &k->view, &fixed_bytes, &state_bytes);
    k->view.bound = comm->bound;
    k->view.gemm_maps = k->gemm_maps;
    MACO_CUDA_GOTO(cudaMemcpy(k->fixed, host, fixed_bytes, cudaMemcpyHostToDevice), st, fail);

    for (uint32_t i = 0; i < l.ntasks; i++) {
        k->labels[i] = strdup(maco__task_label(&graph->tasks[i]));
        k->roles[i] = l.tasks[i].role;
        if (k->labels[i] == NULL) {
            st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", fn);
            goto fail;
        }
    }

    MACO_LOG(MACO_LOG_INFO, MACO_SUBSYS_PERSIST,
             "%s: %u tasks (%u roots, %u dependencies, %u communication tasks) on %u workers, "
             "%u schedulers, %u communication workers of %d threads; %zu + %zu bytes of device "
             "memory",
             fn, l.ntasks, l.nroots, l.nsucc, l.ncomm_tasks, W, S, C, k->config.threads,
             fixed_bytes, state_bytes);
    free(host);
    maco__pk_lowered_free(&l);
    maco__device_leave(saved);
    *kernel_p = k;
    return MACO_OK;
fail:
    free(host);
    maco__pk_lowered_free(&l);
    maco__pk_free(k);
    maco__device_leave(saved);
    return maco__comm_record(comm, st);
}

maco_status_t maco_persistent_kernel_launch(maco_persistent_kernel_t k, maco_stream_t stream)
{
    const char *fn = "maco_persistent_kernel_launch";
    if (k == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST, "%s: kernel is NULL",
                           fn);
    MACO__LOG_RANK_SCOPE(k->comm->rank);
    maco_status_t async_st = maco__comm_async_status(k->comm);
    if (async_st != MACO_OK)
        return maco__comm_refuse(k->comm, fn, async_st, MACO_SUBSYS_PERSIST);
    maco_status_t st = maco__comm_check_stream(k->comm, stream, fn);
    if (st != MACO_OK)
        return st;
    /* On the communicator's device (stream 0 is then its legacy stream). */
    int saved = -1;
    st = maco__device_enter_status(k->comm->cuda_device, &saved, fn);
    if (st != MACO_OK)
        return maco__comm_record(k->comm, st);
    cudaError_t cerr;
    switch (k->gemm) {
    case MACO__PK_GEMM_GMMA:
        cerr = maco__pk_gemm_gmma_launch(&k->view, k->grid, (cudaStream_t)stream);
        break;
    case MACO__PK_GEMM_CUBLASDX:
        cerr = maco__pk_gemm_launch(&k->view, k->grid, (cudaStream_t)stream);
        break;
    default:
        cerr = maco__pk_launch(&k->view, k->grid, k->config.threads, (cudaStream_t)stream);
        break;
    }
    maco__device_leave(saved);
    if (cerr != cudaSuccess)
        return maco__comm_record(k->comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PERSIST,
                                                      "%s: launch of %d CTAs of %d threads "
                                                      "failed: %s",
                                                      fn, k->grid, k->config.threads,
                                                      cudaGetErrorString(cerr)));
    return MACO_OK;
}

maco_status_t maco_persistent_kernel_get_config(maco_persistent_kernel_t k,
                                                maco_persistent_config_t *config_p)
{
    if (k == NULL || config_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_persistent_kernel_get_config: NULL argument");
    *config_p = k->config;
    return MACO_OK;
}

maco_status_t maco_persistent_kernel_get_launch(maco_persistent_kernel_t k, void *view_p,
                                                size_t view_bytes, int *grid_p, int *block_p)
{
    if (k == NULL || view_p == NULL || grid_p == NULL || block_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_persistent_kernel_get_launch: NULL argument");
    if (view_bytes != sizeof(maco_pk_view_t))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "maco_persistent_kernel_get_launch: view_bytes is %zu, the view is "
                           "%zu bytes (a maco/device/persistent.h of another version?)",
                           view_bytes, sizeof(maco_pk_view_t));
    memcpy(view_p, &k->view, sizeof(k->view));
    *grid_p = k->grid;
    *block_p = k->config.threads;
    return MACO_OK;
}

maco_status_t maco_persistent_kernel_destroy(maco_persistent_kernel_t k)
{
    int saved = -1;
    if (k != NULL)
        (void)maco__device_enter(k->comm->cuda_device, &saved);
    maco__pk_free(k);
    maco__device_leave(saved);
    return MACO_OK;
}

/* ---------------------------------------------------------------- profile */

maco_status_t maco__pk_profile_read(maco_persistent_kernel_t k, const char *fn,
                                    maco_task_profile_t *records, size_t nrecords)
{
    if (k == NULL || records == NULL || nrecords < k->ntasks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "%s: NULL argument or fewer than %u records", fn, k ? k->ntasks : 0);
    if (k->view.profile == NULL)
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PERSIST,
                           "%s: the kernel was created without profiling "
                           "(maco_persistent_config_t.profile)",
                           fn);
    maco_pk_profile_record_t *raw = malloc(k->ntasks * sizeof(*raw));
    if (raw == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PERSIST, "%s: out of host memory", fn);
    maco_status_t st = MACO_OK;
    /* cudaMemcpy orders itself after the legacy stream of the current device: the
     * communicator's, where the kernel ran. */
    int saved = -1;
    st = maco__device_enter_status(k->comm->cuda_device, &saved, fn);
    if (st != MACO_OK)
        goto out;
    cudaError_t cerr =
        cudaMemcpy(raw, k->view.profile, k->ntasks * sizeof(*raw), cudaMemcpyDeviceToHost);
    maco__device_leave(saved);
    MACO_CUDA_GOTO(cerr, st, out);
    for (uint32_t i = 0; i < k->ntasks; i++) {
        records[i].start_ns = raw[i].start_ns;
        records[i].end_ns = raw[i].end_ns;
        records[i].sm = (int)raw[i].sm;
        records[i].cta = (int)raw[i].cta;
    }
out:
    free(raw);
    return st;
}

maco_status_t maco_persistent_kernel_get_profile(maco_persistent_kernel_t k,
                                                 maco_task_profile_t *records, size_t nrecords)
{
    return maco__pk_profile_read(k, "maco_persistent_kernel_get_profile", records, nrecords);
}

const char *maco__pk_label(maco_persistent_kernel_t k, uint32_t task)
{
    return k->labels[task];
}

int maco__pk_role(maco_persistent_kernel_t k, uint32_t task)
{
    return k->roles[task];
}

uint32_t maco__pk_ntasks(maco_persistent_kernel_t k)
{
    return k->ntasks;
}

/* ---------------------------------------------------------------- fused operators
 * The builders (fused.c, host only) with the communicator's rank, world size and CTAs. */

/* Rank, world size and CTAs of op->comm for the public builders. */
static maco_status_t maco__fused_public(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                        maco_fused_op_t kind, int *last_p)
{
    int rank = 0, nranks = 1, ctas = 0;
    if (op == NULL || op->comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PERSIST,
                           "fused operator: op or op->comm is NULL");
    maco_comm_get_rank(op->comm, &rank);
    maco_comm_get_nranks(op->comm, &nranks);
    if (maco_comm_get_coresident_ctas(op->comm, &ctas) != MACO_OK || ctas < 1)
        ctas = 1;
    return maco__fused_build(g, op, kind, rank, nranks, ctas, last_p);
}

maco_status_t maco_task_graph_add_gemm_allreduce(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                                 int *last_p)
{
    return maco__fused_public(g, op, MACO_FUSED_GEMM_ALLREDUCE, last_p);
}

maco_status_t maco_task_graph_add_gemm_reduce_scatter(maco_task_graph_t g,
                                                      const maco_fused_gemm_t *op, int *last_p)
{
    return maco__fused_public(g, op, MACO_FUSED_GEMM_REDUCE_SCATTER, last_p);
}

maco_status_t maco_task_graph_add_allgather_gemm(maco_task_graph_t g, const maco_fused_gemm_t *op,
                                                 int *last_p)
{
    return maco__fused_public(g, op, MACO_FUSED_ALLGATHER_GEMM, last_p);
}
