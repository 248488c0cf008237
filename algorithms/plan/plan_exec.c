/*
 * plan_exec.c - the public plan calls (maco/plan.h): verification of a file, and the
 * executor's host side: buffers, channels and the launch (plan_kernels.cu has the kernel).
 *
 * Each rank's plan buffer (one cudaMalloc, registered, mapped by every peer):
 *   0        counters (plan_exec.h), 256 bytes
 *   in_off   input:   input units x MACO_PLAN_MAX_BYTES
 *   out_off  output:  output units x MACO_PLAN_MAX_BYTES
 *   scr_off  scratch: scratch_chunks x the largest slot (maco__plan_scratch_slot)
 * Offsets are multiples of 256. The k-th memory channel of the plan from rank r to peer p is
 * the k-th memory channel set up between them (maco__memory_channels_setup, peers in rank
 * order), the k-th port channel the k-th port channel created between them (peers in rank
 * order, after every memory channel: the pairwise creations follow one global order, so none
 * waits in a cycle); one more channel per peer carries the executor's barriers, a port
 * channel when the peer is on another node or the plan has port channels to it, else a memory
 * channel.
 *
 * Plans with port channels also get a host buffer per rank: shared pinned host memory
 * (maco_mem_alloc_host), mapped for the GPU and by the ranks of the node, with the plan
 * buffer's layout. Every chunk that some port put writes lives there instead of in the plan
 * buffer (the same on every rank: each works out every rank's map from the plan), and the
 * port channels put from host buffer to host buffer (TCP between nodes, the host-memory
 * transport inside one). So the proxies never copy GPU memory: a CUDA copy of a proxy can wait
 * behind work the application queued after the launch, which then waits for the launch
 * (algorithms/common/setup.c, maco__coll_rails, has the measurement). Sources of port puts that
 * live in the plan buffer are copied to the same offset of the host buffer by the kernel first.
 */
#include "maco/plan.h"
#include "maco/port_channel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/comm/comm_internal.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "algorithms/plan/plan_exec.h"
#include "algorithms/plan/plan_internal.h"

enum { MACO__PLAN_THREADS = 256, MACO__PLAN_REPORT = 4096 };

struct maco_plan {
    maco_comm_t comm;
    maco__plan_desc_t *desc;
    int ntbs, nchannels, npeers;
    uint64_t max_bytes; /* MACO_PLAN_MAX_BYTES */
    uint64_t in_off, out_off, scr_off, total;
    char *buf;
    maco_mem_t mem;
    char **peer_buf;
    maco_mem_t *peer_mem;
    maco_memory_channel_device_t *d_chans;
    /* Plans with port channels (port = 1); else all NULL. */
    int port;
    char *host, *host_dev; /* this rank's host buffer: its address, its device address */
    maco_mem_t host_mem;
    char **peer_host; /* [nranks]: device addresses of the node's peers' host buffers */
    maco_mem_t *peer_host_mem;
    maco_proxy_t proxy;
    maco_port_channel_t *ports; /* [nchannels + npeers]: NULL where not a port channel */
    maco_port_channel_device_t *d_ports;
    maco__pexec_chan_t *d_cinfo;
    uint8_t *d_res;
    uint32_t res_stride, res_out, res_scr;
    maco__pexec_op_t *d_ops;
    maco__plan_ref_t *d_refs;
    int32_t *d_tb_first;
};

static uint64_t maco__round256(uint64_t v)
{
    return (v + 255) / 256 * 256;
}

/* Parses and verifies the file; on failure `why` has the reason (the verifier's report). */
static maco_status_t maco__plan_open(const char *path, maco__plan_desc_t **desc_p, char *why,
                                     size_t cap)
{
    char *text = NULL;
    size_t len = 0;
    maco_status_t st = maco__plan_read_file(path, &text, &len, why, cap);
    if (st != MACO_OK)
        return st;
    maco__plan_desc_t *d = NULL;
    st = maco__plan_parse(text, len, path, &d, why, cap);
    free(text);
    if (st != MACO_OK)
        return st;
    int problems = maco__plan_verify(d, why, cap);
    if (problems != 0) {
        maco__plan_desc_free(d);
        return problems == -1 ? MACO_ERR_NO_MEMORY : MACO_ERR_INVALID_ARGUMENT;
    }
    *desc_p = d;
    return MACO_OK;
}

maco_status_t maco_plan_verify_file(const char *path, char *report, size_t report_bytes)
{
    if (path == NULL || (report == NULL && report_bytes > 0))
        return maco__error_quiet(MACO_ERR_INVALID_ARGUMENT, "maco_plan_verify_file: %s is NULL",
                                 path == NULL ? "path" : "report (with report_bytes > 0)");
    char local[8];
    char *out = report_bytes > 0 ? report : local;
    size_t cap = report_bytes > 0 ? report_bytes : sizeof(local);
    out[0] = '\0';
    maco__plan_desc_t *d = NULL;
    maco_status_t st = maco__plan_open(path, &d, out, cap);
    if (st == MACO_OK)
        out[0] = '\0';
    maco__plan_desc_free(d);
    return st;
}

/* maco_plan_destroy's work, with the plan's device current. */
static maco_status_t maco__plan_destroy_on_its_device(maco_plan_t plan)
{
    maco_status_t st = MACO_OK;
    if (plan->buf != NULL && cudaDeviceSynchronize() != cudaSuccess)
        st = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                         "maco_plan_destroy: cudaDeviceSynchronize failed: %s",
                         cudaGetErrorString(cudaGetLastError()));
    if (plan->proxy != NULL)
        maco_proxy_stop(plan->proxy);
    if (plan->ports != NULL)
        for (int c = 0; c < plan->nchannels + plan->npeers; c++)
            maco_port_channel_destroy(plan->ports[c]);
    maco_proxy_destroy(plan->proxy);
    if (plan->peer_host_mem != NULL)
        for (int r = 0; r < plan->comm->nranks; r++)
            if (plan->peer_host_mem[r] != NULL)
                maco_mem_deregister(plan->peer_host_mem[r]);
    if (plan->host_mem != NULL)
        maco_mem_deregister(plan->host_mem);
    if (plan->host != NULL)
        maco_mem_free(plan->comm, plan->host);
    if (plan->peer_mem != NULL)
        for (int r = 0; r < plan->comm->nranks; r++)
            if (plan->peer_mem[r] != NULL)
                maco_mem_deregister(plan->peer_mem[r]);
    if (plan->mem != NULL)
        maco_mem_deregister(plan->mem);
    cudaFree(plan->buf);
    cudaFree(plan->d_chans);
    cudaFree(plan->d_ops);
    cudaFree(plan->d_refs);
    cudaFree(plan->d_tb_first);
    cudaFree(plan->d_ports);
    cudaFree(plan->d_cinfo);
    cudaFree(plan->d_res);
    cudaGetLastError();
    free(plan->peer_buf);
    free(plan->peer_mem);
    free(plan->peer_host);
    free(plan->peer_host_mem);
    free(plan->ports);
    maco__plan_desc_free(plan->desc);
    free(plan);
    return st;
}

maco_status_t maco_plan_destroy(maco_plan_t plan)
{
    if (plan == NULL)
        return MACO_OK;
    /* Synchronisation and frees on the communicator's device; the caller's stays current. */
    int saved = -1;
    (void)maco__device_enter(plan->comm->cuda_device, &saved);
    maco_status_t st = maco__plan_destroy_on_its_device(plan);
    maco__device_leave(saved);
    return st;
}

/* Device arrays of this rank's operations. */
static maco_status_t maco__plan_upload(maco_plan_t plan, int rank)
{
    const maco__plan_rank_t *R = &plan->desc->ranks[rank];
    size_t nops = 0, nrefs = 0;
    for (int t = 0; t < R->ntbs; t++)
        for (int i = 0; i < R->tbs[t].nops; i++) {
            nops++;
            nrefs += R->tbs[t].ops[i].nsrcs;
        }
    maco__pexec_op_t *ops = (maco__pexec_op_t *)calloc(nops + 1, sizeof(*ops));
    maco__plan_ref_t *refs = (maco__plan_ref_t *)calloc(nrefs + 1, sizeof(*refs));
    int32_t *first = (int32_t *)calloc((size_t)R->ntbs + 1, sizeof(int32_t));
    maco_status_t st = MACO_OK;
    if (ops == NULL || refs == NULL || first == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_plan_load: no memory");
        goto out;
    }
    size_t o = 0, f = 0;
    for (int t = 0; t < R->ntbs; t++) {
        first[t] = (int32_t)o;
        for (int i = 0; i < R->tbs[t].nops; i++, o++) {
            const maco__plan_op_t *op = &R->tbs[t].ops[i];
            ops[o].code = op->code;
            ops[o].port =
                (uint8_t)(op->channel >= 0 && R->channels[op->channel].type == MACO__PCHAN_PORT);
            ops[o].channel = op->channel;
            ops[o].nsrcs = op->nsrcs;
            ops[o].part0 = op->part0;
            ops[o].src_first = (uint32_t)f;
            ops[o].dst = op->dst;
            for (int s = 0; s < op->nsrcs; s++)
                refs[f++] = op->srcs[s];
        }
    }
    first[R->ntbs] = (int32_t)o;
    MACO_CUDA_GOTO(cudaMalloc((void **)&plan->d_ops, (nops + 1) * sizeof(*ops)), st, out);
    MACO_CUDA_GOTO(cudaMalloc((void **)&plan->d_refs, (nrefs + 1) * sizeof(*refs)), st, out);
    MACO_CUDA_GOTO(cudaMalloc((void **)&plan->d_tb_first, ((size_t)R->ntbs + 1) * sizeof(int32_t)),
                   st, out);
    MACO_CUDA_GOTO(cudaMemcpy(plan->d_ops, ops, (nops + 1) * sizeof(*ops), cudaMemcpyHostToDevice),
                   st, out);
    MACO_CUDA_GOTO(
        cudaMemcpy(plan->d_refs, refs, (nrefs + 1) * sizeof(*refs), cudaMemcpyHostToDevice), st,
        out);
    MACO_CUDA_GOTO(cudaMemcpy(plan->d_tb_first, first, ((size_t)R->ntbs + 1) * sizeof(int32_t),
                              cudaMemcpyHostToDevice),
                   st, out);
out:
    free(ops);
    free(refs);
    free(first);
    return st;
}

/* Whether the executor's barrier with peer p runs on a port channel (the same answer on both
 * ranks: nodes are symmetric, and so are the plan's channels, which the verifier pairs). */
static int maco__plan_bar_port(maco_plan_t plan, int p)
{
    if (plan->peer_buf[p] == NULL)
        return 1; /* another node */
    const maco__plan_rank_t *R = &plan->desc->ranks[plan->comm->rank];
    for (int c = 0; c < R->nchannels; c++)
        if (R->channels[c].peer == p && R->channels[c].type == MACO__PCHAN_PORT)
            return 1;
    return 0;
}

/* Plans with port channels: the host buffer, the peers' (mapped when on this node), the proxy,
 * and which chunks of every rank live in host memory (docs above). */
static maco_status_t maco__plan_host(maco_plan_t plan)
{
    maco_comm_t comm = plan->comm;
    const maco__plan_desc_t *d = plan->desc;
    const int n = comm->nranks;
    const uint32_t nin = maco__plan_chunks(d, MACO__PBUF_INPUT);
    const uint32_t nout = maco__plan_chunks(d, MACO__PBUF_OUTPUT);
    plan->res_out = nin;
    plan->res_scr = nin + nout;
    plan->res_stride = nin + nout + (uint32_t)d->scratch_chunks;
    size_t res_bytes = (size_t)n * plan->res_stride;
    uint8_t *res = (uint8_t *)calloc(res_bytes + 1, 1);
    char **ptr = (char **)calloc((size_t)n, sizeof(char *));
    plan->peer_host = (char **)calloc((size_t)n, sizeof(char *));
    plan->peer_host_mem = (maco_mem_t *)calloc((size_t)n, sizeof(maco_mem_t));
    maco_status_t st = MACO_OK;
    if (res == NULL || ptr == NULL || plan->peer_host == NULL || plan->peer_host_mem == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_plan_load: no memory");
        goto out;
    }
    /* Every chunk a port put writes, on the put's peer. */
    for (int r = 0; r < d->world_size; r++) {
        const maco__plan_rank_t *R = &d->ranks[r];
        for (int t = 0; t < R->ntbs; t++)
            for (int i = 0; i < R->tbs[t].nops; i++) {
                const maco__plan_op_t *op = &R->tbs[t].ops[i];
                if (op->channel < 0 || R->channels[op->channel].type != MACO__PCHAN_PORT ||
                    op->code <= MACO__POP_FLUSH)
                    continue;
                uint32_t base = op->dst.buffer == MACO__PBUF_OUTPUT    ? plan->res_out
                                : op->dst.buffer == MACO__PBUF_SCRATCH ? plan->res_scr
                                                                       : 0;
                size_t row = (size_t)R->channels[op->channel].peer * plan->res_stride;
                for (uint32_t j = 0; j < op->dst.count; j++)
                    res[row + base + op->dst.index + j] = 1;
            }
    }
    /* LL packets are read and written by the plan buffer's address only. */
    for (int r = 0; r < d->world_size; r++) {
        const maco__plan_rank_t *R = &d->ranks[r];
        for (int t = 0; t < R->ntbs; t++)
            for (int i = 0; i < R->tbs[t].nops; i++) {
                const maco__plan_op_t *op = &R->tbs[t].ops[i];
                if (op->code != MACO__POP_PUT_PACKETS)
                    continue;
                const maco__plan_ref_t *src = &op->srcs[0];
                uint32_t base = src->buffer == MACO__PBUF_OUTPUT    ? plan->res_out
                                : src->buffer == MACO__PBUF_SCRATCH ? plan->res_scr
                                                                    : 0;
                for (uint32_t j = 0; j < src->count; j++)
                    if (res[(size_t)r * plan->res_stride + base + src->index + j]) {
                        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                                         "maco_plan_load: rank %d tb %d op %d (put_packets) "
                                         "reads %s[%u], which a port channel writes; the "
                                         "executor sends packets only from chunks no port "
                                         "channel writes",
                                         r, t, i, maco__plan_buffer_name(src->buffer),
                                         src->index + j);
                        goto out;
                    }
            }
    }
    MACO_CUDA_GOTO(cudaMalloc((void **)&plan->d_res, res_bytes + 1), st, out);
    MACO_CUDA_GOTO(cudaMemcpy(plan->d_res, res, res_bytes + 1, cudaMemcpyHostToDevice), st, out);
    st = maco_mem_alloc_host(comm, plan->total, (void **)&plan->host);
    if (st != MACO_OK)
        goto out;
    memset(plan->host, 0, plan->total);
    MACO_CUDA_GOTO(cudaHostGetDevicePointer((void **)&plan->host_dev, plan->host, 0), st, out);
    st = maco_mem_register(comm, plan->host, plan->total, &plan->host_mem);
    if (st == MACO_OK)
        st = maco__mem_exchange(comm, plan->host_mem, ptr, plan->peer_host_mem);
    if (st != MACO_OK)
        goto out;
    for (int r = 0; r < n; r++)
        if (r != comm->rank && ptr[r] != NULL)
            MACO_CUDA_GOTO(cudaHostGetDevicePointer((void **)&plan->peer_host[r], ptr[r], 0), st,
                           out);
    st = maco_proxy_create(comm, &plan->proxy);
    if (st == MACO_OK)
        st = maco_proxy_start(plan->proxy);
out:
    free(res);
    free(ptr);
    return st;
}

/* The plan's channels, then one barrier channel per peer (peers in rank order): memory
 * channels first, then port channels (the file comment has the order). */
static maco_status_t maco__plan_channels(maco_plan_t plan)
{
    maco_comm_t comm = plan->comm;
    const maco__plan_rank_t *R = &plan->desc->ranks[comm->rank];
    int n = comm->nranks, nch = R->nchannels, total = nch + n - 1;
    maco_memory_channel_device_t *h =
        (maco_memory_channel_device_t *)calloc((size_t)total + 1, sizeof(*h));
    maco_memory_channel_device_t *tmp =
        (maco_memory_channel_device_t *)calloc((size_t)nch + 2, sizeof(*tmp));
    maco_port_channel_device_t *ph = NULL;
    maco__pexec_chan_t *info = NULL;
    maco_status_t st = MACO_OK;
    if (h == NULL || tmp == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_plan_load: no memory");
        goto out;
    }
    for (int c = 0; c < nch; c++)
        if (R->channels[c].type == MACO__PCHAN_MEMORY &&
            plan->peer_buf[R->channels[c].peer] == NULL) {
            st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                             "maco_plan_load: plan %s: channel %d of rank %d is a memory channel "
                             "to rank %d, which is on another node of this communicator (the "
                             "plan says %d ranks per node)",
                             plan->desc->name, c, comm->rank, R->channels[c].peer,
                             plan->desc->ranks_per_node);
            goto out;
        }
    for (int p = 0, k = 0; p < n; p++) {
        if (p == comm->rank)
            continue;
        int bar_port = plan->port && maco__plan_bar_port(plan, p);
        int count = 0;
        for (int c = 0; c < nch; c++)
            count += R->channels[c].peer == p && R->channels[c].type == MACO__PCHAN_MEMORY;
        if (count + !bar_port > 0) {
            st = maco__memory_channels_setup(comm, p, plan->mem, plan->peer_mem[p],
                                             count + !bar_port, tmp);
            if (st != MACO_OK)
                goto out;
        }
        for (int c = 0, i = 0; c < nch; c++)
            if (R->channels[c].peer == p && R->channels[c].type == MACO__PCHAN_MEMORY)
                h[c] = tmp[i++];
        if (!bar_port)
            h[nch + k] = tmp[count];
        k++;
    }
    if (plan->port) {
        plan->ports = (maco_port_channel_t *)calloc((size_t)total + 1, sizeof(*plan->ports));
        ph = (maco_port_channel_device_t *)calloc((size_t)total + 1, sizeof(*ph));
        info = (maco__pexec_chan_t *)calloc((size_t)total + 1, sizeof(*info));
        if (plan->ports == NULL || ph == NULL || info == NULL) {
            st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_plan_load: no memory");
            goto out;
        }
        for (int p = 0, k = 0; p < n; p++) {
            if (p == comm->rank)
                continue;
            int bar = nch + k++;
            info[bar].peer = p;
            info[bar].port = maco__plan_bar_port(plan, p);
            for (int c = 0; c <= nch && st == MACO_OK; c++) {
                int idx = c < nch ? c : bar;
                if (c < nch &&
                    (R->channels[c].peer != p || R->channels[c].type != MACO__PCHAN_PORT))
                    continue;
                if (c == nch && !info[bar].port)
                    continue;
                st = maco_port_channel_create(plan->proxy, p, MACO_TRANSPORT_AUTO, plan->host_mem,
                                              plan->peer_host_mem[p], &plan->ports[idx]);
                if (st == MACO_OK)
                    st = maco_port_channel_get_device_handle(plan->ports[idx], &ph[idx]);
            }
            if (st != MACO_OK)
                goto out;
        }
        /* A peer that finished creating a port channel first may signal it before this side
         * published it: the TCP transport holds such a message until the channel appears
         * (proxy/transport/tcp/transport_tcp.c), so no barrier is needed here. */
        for (int c = 0; c < nch; c++) {
            info[c].peer = R->channels[c].peer;
            info[c].port = R->channels[c].type == MACO__PCHAN_PORT;
            info[c].peer_host = info[c].port ? NULL : plan->peer_host[R->channels[c].peer];
        }
        MACO_CUDA_GOTO(cudaMalloc((void **)&plan->d_ports, ((size_t)total + 1) * sizeof(*ph)), st,
                       out);
        MACO_CUDA_GOTO(cudaMemcpy(plan->d_ports, ph, ((size_t)total + 1) * sizeof(*ph),
                                  cudaMemcpyHostToDevice),
                       st, out);
        MACO_CUDA_GOTO(cudaMalloc((void **)&plan->d_cinfo, ((size_t)total + 1) * sizeof(*info)), st,
                       out);
        MACO_CUDA_GOTO(cudaMemcpy(plan->d_cinfo, info, ((size_t)total + 1) * sizeof(*info),
                                  cudaMemcpyHostToDevice),
                       st, out);
    }
    MACO_CUDA_GOTO(cudaMalloc((void **)&plan->d_chans, ((size_t)total + 1) * sizeof(*h)), st, out);
    MACO_CUDA_GOTO(
        cudaMemcpy(plan->d_chans, h, ((size_t)total + 1) * sizeof(*h), cudaMemcpyHostToDevice), st,
        out);
out:
    free(h);
    free(tmp);
    free(ph);
    free(info);
    return st;
}

/* maco_plan_load's work, with the communicator's device current. */
static maco_status_t maco__plan_load_on_its_device(maco_comm_t comm, const char *path,
                                                   maco_plan_t *plan_p)
{
    maco_status_t st = maco__comm_require_gpu(comm, "maco_plan_load");
    if (st != MACO_OK)
        return st;
    char *why = (char *)malloc(MACO__PLAN_REPORT);
    if (why == NULL)
        return maco__comm_record(
            comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_plan_load: no memory"));
    maco__plan_desc_t *d = NULL;
    st = maco__plan_open(path, &d, why, MACO__PLAN_REPORT);
    if (st != MACO_OK) {
        /* The first problem names the cause; the whole report goes to the log at info. */
        char *nl = strchr(why, '\n');
        MACO_INFO(MACO_SUBSYS_COLL, "maco_plan_load: %s:\n%s", path, why);
        if (nl != NULL)
            *nl = '\0';
        st = maco__error(st, MACO_SUBSYS_COLL, "maco_plan_load: %s is rejected: %s", path, why);
        free(why);
        return maco__comm_record(comm, st);
    }
    free(why);
    maco_plan_t plan = NULL;
    int port = 0;
    for (int r = 0; r < d->world_size; r++)
        for (int c = 0; c < d->ranks[r].nchannels; c++)
            port |= d->ranks[r].channels[c].type == MACO__PCHAN_PORT;
    if (d->world_size != comm->nranks)
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                         "maco_plan_load: %s is a plan for %d ranks; the communicator has %d", path,
                         d->world_size, comm->nranks);
    else if (comm->nranks > MACO__MAX_LOCAL_RANKS)
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                         "maco_plan_load: %d ranks; the executor supports at most %d", comm->nranks,
                         MACO__MAX_LOCAL_RANKS);
    int64_t max_bytes = 0;
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_PLAN_MAX_BYTES, &max_bytes);
    if (st == MACO_OK && (max_bytes < 256 || max_bytes > ((int64_t)16 << 30)))
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                         "MACO_PLAN_MAX_BYTES=%lld is outside [256, 16G] bytes",
                         (long long)max_bytes);
    if (st == MACO_OK) {
        plan = (maco_plan_t)calloc(1, sizeof(*plan));
        if (plan == NULL)
            st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_plan_load: no memory");
    }
    if (st != MACO_OK) {
        maco__plan_desc_free(d);
        return maco__comm_record(comm, st);
    }
    plan->comm = comm;
    plan->desc = d;
    plan->ntbs = d->ranks[comm->rank].ntbs;
    plan->nchannels = d->ranks[comm->rank].nchannels;
    plan->npeers = comm->nranks - 1;
    plan->max_bytes = (uint64_t)max_bytes;
    uint64_t B = maco__round256((uint64_t)max_bytes);
    /* The largest slot: any count * esz <= max_bytes has ceil(count / parts) * esz <=
     * ceil(max_bytes / parts) + 8 payload bytes. */
    uint64_t k = (uint64_t)d->parts;
    uint64_t slot_max = ((B + k - 1) / k + 8 + 7) / 8 * 16;
    plan->in_off = MACO__PLAN_CTR_BYTES;
    plan->out_off = plan->in_off + maco__plan_chunks(d, MACO__PBUF_INPUT) / k * B;
    plan->scr_off = plan->out_off + maco__plan_chunks(d, MACO__PBUF_OUTPUT) / k * B;
    plan->total = maco__round256(plan->scr_off + (uint64_t)d->scratch_chunks * slot_max);
    uint32_t one = 1;
    MACO_CUDA_GOTO(cudaMalloc((void **)&plan->buf, plan->total), st, fail);
    MACO_CUDA_GOTO(cudaMemset(plan->buf, 0, plan->total), st, fail);
    MACO_CUDA_GOTO(
        cudaMemcpy(plan->buf + MACO__PLAN_CTR_EPOCH, &one, sizeof(one), cudaMemcpyHostToDevice), st,
        fail);
    st = maco_mem_register(comm, plan->buf, plan->total, &plan->mem);
    if (st != MACO_OK)
        goto fail;
    plan->peer_buf = (char **)calloc((size_t)comm->nranks, sizeof(char *));
    plan->peer_mem = (maco_mem_t *)calloc((size_t)comm->nranks, sizeof(maco_mem_t));
    if (plan->peer_buf == NULL || plan->peer_mem == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_plan_load: no memory");
        goto fail;
    }
    st = maco__mem_exchange(comm, plan->mem, plan->peer_buf, plan->peer_mem);
    if (st == MACO_OK) {
        cudaError_t e = maco__preload_plan();
        if (e != cudaSuccess)
            st = maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                             "maco_plan_load: loading the executor's kernels on device %d "
                             "(cudaFuncGetAttributes) failed: %s (%s)",
                             comm->cuda_device, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    plan->port = port || comm->nnodes > 1;
    if (st == MACO_OK && plan->port)
        st = maco__plan_host(plan);
    if (st == MACO_OK)
        st = maco__plan_channels(plan);
    if (st == MACO_OK)
        st = maco__plan_upload(plan, comm->rank);
    if (st != MACO_OK)
        goto fail;
    MACO_INFO(MACO_SUBSYS_COLL,
              "rank %d: plan %s (%s, %d thread blocks, %d channels) loaded from %s; buffer %llu "
              "bytes%s",
              comm->rank, d->name, maco_collective_name(d->coll), plan->ntbs, plan->nchannels, path,
              (unsigned long long)plan->total,
              plan->port ? ", and as much host memory (port channels)" : "");
    *plan_p = plan;
    return MACO_OK;
fail:
    maco__comm_record(comm, st);
    maco_plan_destroy(plan);
    return st;
}

maco_status_t maco_plan_load(maco_comm_t comm, const char *path, maco_plan_t *plan_p)
{
    if (comm == NULL || path == NULL || plan_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_plan_load: %s is NULL",
                           comm == NULL ? "comm" : (path == NULL ? "path" : "plan_p"));
    /* The plan's buffers go on the communicator's device, whichever device the calling
     * thread has current; the caller's stays current. */
    int saved = -1;
    maco_status_t st = maco__device_enter_status(comm->cuda_device, &saved, "maco_plan_load");
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    st = maco__plan_load_on_its_device(comm, path, plan_p);
    maco__device_leave(saved);
    return st;
}

maco_status_t maco_plan_execute(maco_plan_t plan, const void *sendbuf, void *recvbuf, size_t count,
                                maco_datatype_t type, maco_redop_t op, maco_comm_t comm,
                                maco_stream_t stream)
{
    static const char fn[] = "maco_plan_execute";
    if (plan == NULL || comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: %s is NULL", fn,
                           plan == NULL ? "plan" : "comm");
    if (comm != plan->comm)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                                   "%s: comm is not the communicator the plan "
                                                   "was loaded on",
                                                   fn));
    if ((unsigned)type >= MACO_DATATYPE_COUNT || (unsigned)op >= MACO_REDOP_COUNT)
        return maco__comm_record(
            comm,
            maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: %s %d is outside [0, %d)",
                        fn, (unsigned)type >= MACO_DATATYPE_COUNT ? "type" : "op",
                        (unsigned)type >= MACO_DATATYPE_COUNT ? (int)type : (int)op,
                        (unsigned)type >= MACO_DATATYPE_COUNT ? MACO_DATATYPE_COUNT
                                                              : MACO_REDOP_COUNT));
    if (count == 0)
        return MACO_OK;
    const maco__plan_desc_t *d = plan->desc;
    uint64_t esz = maco_datatype_size(type);
    if (count > plan->max_bytes / esz)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                                   "%s: count %zu of %s is %llu bytes; the plan "
                                                   "executes at most MACO_PLAN_MAX_BYTES = %llu "
                                                   "bytes per unit",
                                                   fn, count, maco_datatype_name(type),
                                                   (unsigned long long)(count * esz),
                                                   (unsigned long long)plan->max_bytes));
    if (sendbuf == NULL || recvbuf == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                                                   "%s: %s is NULL with count %zu", fn,
                                                   sendbuf == NULL ? "sendbuf" : "recvbuf", count));
    maco_status_t async_st = maco__comm_async_status(comm); /* no context query: hot path */
    if (async_st != MACO_OK)
        return maco__comm_refuse(comm, fn, async_st, MACO_SUBSYS_COLL);
    uint64_t k = (uint64_t)d->parts;
    maco__pexec_args_t a;
    memset(&a, 0, sizeof(a));
    a.send = sendbuf;
    a.recv = recvbuf;
    a.buf = plan->buf;
    a.ops = plan->d_ops;
    a.refs = plan->d_refs;
    a.tb_first = plan->d_tb_first;
    a.chans = plan->d_chans;
    a.ports = plan->d_ports;
    a.cinfo = plan->d_cinfo;
    a.res = plan->d_res;
    a.host = plan->host_dev;
    a.rank = comm->rank;
    a.res_stride = plan->res_stride;
    a.res_out = plan->res_out;
    a.res_scr = plan->res_scr;
    a.count = count;
    a.esz = esz;
    a.in_off = plan->in_off;
    a.out_off = plan->out_off;
    a.scr_off = plan->scr_off;
    a.slot_bytes = maco__plan_scratch_slot(d, count, esz);
    a.send_bytes = maco__plan_chunks(d, MACO__PBUF_INPUT) / k * count * esz;
    a.recv_bytes = maco__plan_chunks(d, MACO__PBUF_OUTPUT) / k * count * esz;
    a.bound = comm->bound;
    a.nchannels = plan->nchannels;
    a.npeers = plan->npeers;
    a.parts = d->parts;
    a.nranks = comm->nranks;
    a.avg = op == MACO_AVG;
    a.op = op == MACO_AVG ? (int32_t)MACO_SUM : (int32_t)op;
    maco_status_t st = maco__comm_check_stream(comm, stream, fn);
    if (st != MACO_OK)
        return st;
    /* On the communicator's device whichever the calling thread has current (stream 0 is
     * then its legacy stream). */
    int saved = -1;
    st = maco__device_enter_status(comm->cuda_device, &saved, fn);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    cudaError_t e =
        maco__launch_plan(&a, (int)type, plan->ntbs, MACO__PLAN_THREADS, (cudaStream_t)stream);
    maco__device_leave(saved);
    if (e != cudaSuccess)
        return maco__comm_record(comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                                   "%s: the executor's launch failed: %s (%s)", fn,
                                                   cudaGetErrorName(e), cudaGetErrorString(e)));
    return MACO_OK;
}

maco_collective_t maco__plan_collective(maco_plan_t plan)
{
    return plan->desc->coll;
}
