/*
 * registry.c - which registered buffers of each rank its peers have mapped, so collectives
 * can read and write registered user buffers in place.
 *
 * Registration (maco_mem_register, maco_mem_alloc) is not collective, and a collective call
 * names buffers only its own rank knows, so the ranks agree on using buffers in place inside
 * the kernel, from what each rank publishes:
 *
 *   1. Each rank has a directory in shared host memory (maco_mem_alloc_host, mapped by every
 *      local peer at communicator creation): entry i holds the serialized handle of the
 *      rank's i-th published registration (id i + 1) and a "dead" flag set when it is
 *      deregistered. Ids are never reused, and the entry count is published with a release
 *      store after the entry is written.
 *   2. In maco_collective_map_registrations (an explicit step, never a collective launch:
 *      importing may fetch a file descriptor from the peer's fd server), the host of each
 *      rank imports every peer entry it has not seen yet (maco_mem_import; dead entries are
 *      skipped) and writes the mapped address into a table of pinned host memory the GPU
 *      reads: table[peer][id - 1]. seen[peer] counts the entries it has looked at.
 *   3. The kernel gets this rank's descriptor (registry.h): the ids and offsets of its send
 *      and receive buffers and seen[]; every rank sends its descriptor to every peer as LL
 *      packets. Buffers are used in place only if every rank's buffers are registered and
 *      every rank has seen every peer's ids: all ranks decide the same from the same
 *      descriptors, and otherwise the call goes through scratch.
 *
 * Peer mappings live until the communicator is destroyed (a kernel still queued on a
 * lagging rank may name an id its owner has since deregistered, so an unmapping would need
 * the peer's stream to be idle, which a host call cannot know without waiting). The
 * directory holds MACO__REG_MAX entries per rank; later registrations work but are not
 * used in place (logged once).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/common/registry.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"

/* One directory entry, in shared host memory (written by the owner, read by peers). */
typedef struct maco__dir_entry {
    volatile uint32_t dead; /* 1 once deregistered */
    uint32_t pad;
    uint64_t bytes;
    uint8_t handle[MACO_MEM_HANDLE_BYTES];
} maco__dir_entry_t;

typedef struct maco__dir {
    volatile uint32_t count; /* published entries (release-stored after the entry) */
    uint32_t pad[15];
    maco__dir_entry_t entry[MACO__REG_MAX];
} maco__dir_t;

_Static_assert(sizeof(maco__dir_entry_t) == 144, "directory entry is 144 bytes");
_Static_assert(sizeof(maco__dir_t) == 64 + 144 * MACO__REG_MAX, "directory layout");

/* This rank's published registrations. */
typedef struct maco__reg_local {
    maco_mem_t mem;
    const char *ptr;
    size_t bytes;
    int live;
} maco__reg_local_t;

struct maco__registry {
    pthread_mutex_t lock;
    int n, rank;
    maco__dir_t *dir;     /* mine */
    maco_mem_t dir_mem;   /* its registration */
    maco__dir_t **peer;   /* [n] mapped peer directories */
    maco_mem_t *peer_mem; /* [n] their imports */
    maco__reg_local_t local[MACO__REG_MAX];
    uint32_t nlocal;
    int full_logged;
    uint32_t *seen;      /* [n] peer entries looked at */
    uint32_t *failed;    /* [n] id of the peer's entry whose failure was last logged */
    maco_mem_t *imp;     /* [n][MACO__REG_MAX] imports of peer entries */
    uint64_t *table;     /* [n][MACO__REG_MAX] pinned, mapped: peer entry address here */
    uint64_t *table_dev; /* its device address */
    uint64_t *cache;     /* [n][MACO__REG_MAX] device memory, filled by kernels */
};

maco_status_t maco__registry_setup(maco_comm_t comm)
{
    /* Peers are the ranks of this node, by local index (state.h). */
    const maco__coll_t *c = maco__coll_of(comm);
    const int n = c->local_nranks, nranks = comm->nranks;
    const int *local = c->rank_at + (size_t)c->node * (size_t)c->local_nranks;
    maco__registry_t *g = (maco__registry_t *)calloc(1, sizeof(*g));
    if (g == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "registry: no host memory");
    pthread_mutex_init(&g->lock, NULL);
    g->n = n;
    g->rank = c->local_index;
    maco__coll_of(comm)->reg = g; /* freed by maco__registry_free on any failure below */
    g->peer = (maco__dir_t **)calloc((size_t)n, sizeof(*g->peer));
    g->peer_mem = (maco_mem_t *)calloc((size_t)n, sizeof(*g->peer_mem));
    g->seen = (uint32_t *)calloc((size_t)n, sizeof(*g->seen));
    g->failed = (uint32_t *)calloc((size_t)n, sizeof(*g->failed));
    g->imp = (maco_mem_t *)calloc((size_t)n * MACO__REG_MAX, sizeof(*g->imp));
    uint8_t *handles = (uint8_t *)calloc((size_t)nranks, MACO_MEM_HANDLE_BYTES);
    maco_status_t st = MACO_OK;
    if (g->peer == NULL || g->peer_mem == NULL || g->seen == NULL || g->failed == NULL ||
        g->imp == NULL || handles == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "registry: no host memory");
        goto out;
    }
    size_t tbytes = (size_t)n * MACO__REG_MAX * sizeof(uint64_t);
    MACO_CUDA_GOTO(cudaHostAlloc((void **)&g->table, tbytes, cudaHostAllocMapped), st, out);
    memset(g->table, 0, tbytes);
    MACO_CUDA_GOTO(cudaHostGetDevicePointer((void **)&g->table_dev, g->table, 0), st, out);
    MACO_CUDA_GOTO(cudaMalloc((void **)&g->cache, tbytes), st, out);
    MACO_CUDA_GOTO(cudaMemset(g->cache, 0, tbytes), st, out);
    void *d = NULL;
    st = maco_mem_alloc_host(comm, sizeof(maco__dir_t), &d);
    if (st != MACO_OK)
        goto out;
    g->dir = (maco__dir_t *)d;
    memset(d, 0, sizeof(maco__dir_t));
    st = maco_mem_register(comm, d, sizeof(maco__dir_t), &g->dir_mem);
    if (st == MACO_OK)
        st = maco_mem_serialize(g->dir_mem, handles + (size_t)comm->rank * MACO_MEM_HANDLE_BYTES);
    /* Every rank takes part in the allgather; each maps the directories of its node's. */
    if (st == MACO_OK)
        st = maco_bootstrap_allgather(comm->bs, handles, MACO_MEM_HANDLE_BYTES);
    for (int p = 0; p < n && st == MACO_OK; p++) {
        if (p == g->rank)
            continue;
        st = maco_mem_import(comm, handles + (size_t)local[p] * MACO_MEM_HANDLE_BYTES,
                             &g->peer_mem[p]);
        if (st == MACO_OK) {
            void *q = NULL;
            maco_mem_get_pointer(g->peer_mem[p], &q);
            g->peer[p] = (maco__dir_t *)q;
        }
    }
out:
    free(handles);
    return st;
}

void maco__registry_free(maco_comm_t comm)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    if (g == NULL)
        return;
    maco__coll_of(comm)->reg = NULL;
    for (uint32_t i = 0; i < g->nlocal; i++)
        if (g->local[i].live)
            maco__mem_unpublish(g->local[i].mem);
    if (g->imp != NULL)
        for (size_t i = 0; i < (size_t)g->n * MACO__REG_MAX; i++)
            maco_mem_deregister(g->imp[i]);
    if (g->peer_mem != NULL)
        for (int p = 0; p < g->n; p++)
            maco_mem_deregister(g->peer_mem[p]);
    maco_mem_deregister(g->dir_mem);
    if (g->dir != NULL)
        maco_mem_free(comm, g->dir);
    if (g->table != NULL)
        cudaFreeHost(g->table);
    if (g->cache != NULL)
        cudaFree(g->cache);
    cudaGetLastError();
    free(g->peer);
    free(g->peer_mem);
    free(g->seen);
    free(g->failed);
    free(g->imp);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

int maco__registry_publish(maco_comm_t comm, maco_mem_t mem, const void *ptr, size_t bytes)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    if (g == NULL || g->dir == NULL)
        return 0;
    pthread_mutex_lock(&g->lock);
    int published = 0;
    if (g->nlocal == MACO__REG_MAX) {
        if (!g->full_logged)
            MACO_INFO(MACO_SUBSYS_MEM,
                      "registry full: registrations after the first %d of this "
                      "communicator are not used in place by collectives",
                      MACO__REG_MAX);
        g->full_logged = 1;
    } else {
        uint32_t i = g->nlocal;
        maco__dir_entry_t *e = &g->dir->entry[i];
        if (maco_mem_serialize(mem, e->handle) == MACO_OK) {
            e->bytes = bytes;
            e->dead = 0;
            g->local[i].mem = mem;
            g->local[i].ptr = (const char *)ptr;
            g->local[i].bytes = bytes;
            g->local[i].live = 1;
            g->nlocal = i + 1;
            /* Pairs with the acquire load in maco__registry_map: a peer that sees the
             * count sees the entry. */
            __atomic_store_n(&g->dir->count, i + 1, __ATOMIC_RELEASE);
            published = 1;
        }
    }
    pthread_mutex_unlock(&g->lock);
    return published;
}

void maco__registry_withdraw(maco_comm_t comm, maco_mem_t mem)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->lock);
    for (uint32_t i = 0; i < g->nlocal; i++) {
        if (g->local[i].live && g->local[i].mem == mem) {
            g->local[i].live = 0;
            g->dir->entry[i].dead = 1;
        }
    }
    pthread_mutex_unlock(&g->lock);
}

uint32_t maco__registry_find(maco_comm_t comm, const void *ptr, size_t bytes, uint64_t *offset_p)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    if (g == NULL)
        return 0;
    const char *p = (const char *)ptr;
    uint32_t id = 0;
    pthread_mutex_lock(&g->lock);
    for (uint32_t i = g->nlocal; i-- > 0 && id == 0;) {
        const maco__reg_local_t *l = &g->local[i];
        if (l->live && p >= l->ptr && bytes <= l->bytes &&
            (size_t)(p - l->ptr) <= l->bytes - bytes) {
            id = i + 1;
            *offset_p = (uint64_t)(p - l->ptr);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return id;
}

maco_status_t maco__registry_map(maco_comm_t comm)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    if (g == NULL)
        return MACO_OK;
    maco_status_t first = MACO_OK;
    pthread_mutex_lock(&g->lock);
    for (int p = 0; p < g->n; p++) {
        if (p == g->rank || g->peer[p] == NULL)
            continue;
        uint32_t count = __atomic_load_n(&g->peer[p]->count, __ATOMIC_ACQUIRE);
        if (count > MACO__REG_MAX)
            count = MACO__REG_MAX;
        while (g->seen[p] < count) {
            uint32_t i = g->seen[p];
            const maco__dir_entry_t *e = &g->peer[p]->entry[i];
            if (e->dead) {
                g->seen[p]++;
                continue;
            }
            /* Mapping is allowed while a stream of this thread captures a graph (it is not
             * stream work); relaxed mode keeps CUDA from invalidating the capture. */
            enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
            cudaThreadExchangeStreamCaptureMode(&mode);
            maco_mem_t m = NULL;
            maco_status_t st = maco_mem_import(comm, e->handle, &m);
            cudaThreadExchangeStreamCaptureMode(&mode);
            if (st == MACO_OK) {
                void *q = NULL;
                maco_mem_get_pointer(m, &q);
                g->imp[(size_t)p * MACO__REG_MAX + i] = m;
                g->table[(size_t)p * MACO__REG_MAX + i] = (uint64_t)(uintptr_t)q;
            } else if (!e->dead) {
                /* Not mapped: the next map call tries again (collectives on it go through
                 * scratch meanwhile). A deregistration racing the import is not an error. */
                if (first == MACO_OK) {
                    /* Logged once per entry; a retry that fails again only sets the text. */
                    const maco__coll_t *c = maco__coll_of(comm);
                    char msg[512];
                    snprintf(msg, sizeof(msg),
                             "maco_collective_map_registrations: rank %d's registration %u (%llu "
                             "bytes) not mapped (calls on it use scratch): %s",
                             c->rank_at[(size_t)c->node * (size_t)c->local_nranks + (size_t)p],
                             i + 1, (unsigned long long)e->bytes, maco__last_error());
                    first = g->failed[p] == i + 1 ? maco__error_quiet(st, "%s", msg)
                                                  : maco__error(st, MACO_SUBSYS_MEM, "%s", msg);
                    g->failed[p] = i + 1;
                }
                break;
            }
            /* seen[] grows only after table[] is written: a kernel whose descriptor counts
             * the entry finds its address (mesh.cuh). */
            g->seen[p]++;
        }
    }
    pthread_mutex_unlock(&g->lock);
    return first;
}

void maco__registry_seen(maco_comm_t comm, uint32_t *seen_p)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    if (g == NULL) {
        memset(seen_p, 0, (size_t)comm->local_nranks * sizeof(*seen_p));
        return;
    }
    pthread_mutex_lock(&g->lock);
    memcpy(seen_p, g->seen, (size_t)g->n * sizeof(*seen_p));
    pthread_mutex_unlock(&g->lock);
}

const uint64_t *maco__registry_table(maco_comm_t comm)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    return g != NULL ? g->table_dev : NULL;
}

uint64_t *maco__registry_cache(maco_comm_t comm)
{
    maco__registry_t *g = maco__coll_of(comm) != NULL ? maco__coll_of(comm)->reg : NULL;
    return g != NULL ? g->cache : NULL;
}
