/*
 * proxy.c - the proxy service: thread, FIFO polling, trigger handling, flushes, channels.
 *
 * The thread polls the device FIFO and the host FIFO in turn, carrying out up to 64 triggers
 * of one before looking at the other, then lets every transport in use make progress
 * (transport.h). A trigger's parts run in the order data, signal, flush. A flush completes
 * when every operation carried out before it has completed: immediately if no transport did
 * work since its last marker, else when each such transport's marker has passed; flushes
 * complete in order and the proxy publishes, for each FIFO, 1 + the position of its last
 * completed flush (flush_done), which device and host flush calls compare with. When idle
 * the thread spins with a pause hint, then yields, then sleeps 50 us after 1 ms without work
 * (so idle proxies do not starve 2-core machines).
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"
#include "proxy/proxy_internal.h"
#include "src/host/os/socket.h"
#include "src/host/base/wire.h"

/* ------------------------------------------------------------------ CPU binding */

/* The NUMA node of the communicator's GPU as sysfs reports it (PCI bus id -> numa_node), or
 * -1 (no GPU, no sysfs entry, or a machine with one node). `bus` gets the bus id. */
static int maco__gpu_numa_node(maco_comm_t comm, char *bus, size_t bus_bytes)
{
    bus[0] = '\0';
    if (comm->cuda_device < 0)
        return -1;
    if (cudaDeviceGetPCIBusId(bus, (int)bus_bytes, comm->cuda_device) != cudaSuccess) {
        cudaGetLastError();
        bus[0] = '\0';
        return -1;
    }
    for (char *c = bus; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    char path[256];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "r");
    int node = -1;
    if (f != NULL) {
        if (fscanf(f, "%d", &node) != 1)
            node = -1;
        fclose(f);
    }
    return node;
}

/* Binds the calling thread to the CPUs of the GPU's NUMA node, as sysfs reports them. */
static void maco__proxy_bind(maco_comm_t comm)
{
    char bus[64];
    int node = maco__gpu_numa_node(comm, bus, sizeof(bus));
    if (node < 0) {
        if (bus[0] != '\0')
            MACO_DEBUG(MACO_SUBSYS_PROXY, "GPU %s: no NUMA node in sysfs; proxy thread not bound",
                       bus);
        return;
    }
    char path[256];
    snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char list[1024] = "";
    if (fgets(list, sizeof(list), f) == NULL)
        list[0] = '\0';
    fclose(f);
    cpu_set_t set;
    CPU_ZERO(&set);
    int count = 0;
    for (char *p = list; *p && *p != '\n';) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            break;
        if (*end == '-')
            b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b && c < CPU_SETSIZE; c++, count++)
            CPU_SET((int)c, &set);
        p = *end == ',' ? end + 1 : end;
    }
    if (count > 0 && pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0)
        MACO_INFO(MACO_SUBSYS_PROXY, "proxy thread bound to NUMA node %d (CPUs %s) of GPU %s", node,
                  list, bus);
}

/* ------------------------------------------------------------------ trigger handling */

/* Frees a pending flush's markers (done or not). */
static void maco__pending_free(struct maco_proxy *p, maco__pending_flush_t *pf)
{
    for (int t = 0; t < MACO__TRANSPORT_SLOTS; t++)
        if (pf->has_marker[t])
            p->tp[t].ops->marker_free(p, p->tp[t].state, pf->markers[t]);
    free(pf);
}

static maco_status_t maco__proxy_flush(struct maco_proxy *p, maco__fifo_t *f, uint64_t pos)
{
    if (p->draining)
        return MACO_OK; /* after a stop no flush completes: its waiter fails instead */
    int work = 0;
    for (int t = 0; t < MACO__TRANSPORT_SLOTS; t++)
        work |= p->tp[t].work_since_marker;
    if (!work && p->pending_head == NULL) {
        /* Nothing outstanding: done now (the common, latency-critical case). */
        __atomic_store_n(f->flush_done, pos + 1, __ATOMIC_RELEASE);
        return MACO_OK;
    }
    maco__pending_flush_t *pf = (maco__pending_flush_t *)calloc(1, sizeof(*pf));
    if (pf == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "flush: no memory");
    pf->fifo = f;
    pf->pos = pos;
    for (int t = 0; t < MACO__TRANSPORT_SLOTS; t++) {
        maco__proxy_transport_t *tp = &p->tp[t];
        if (!tp->work_since_marker)
            continue;
        maco_status_t st = tp->ops->mark(p, tp->state, &pf->markers[t]);
        if (st != MACO_OK) {
            maco__pending_free(p, pf);
            return st;
        }
        pf->has_marker[t] = 1;
        tp->work_since_marker = 0;
    }
    if (p->pending_tail)
        p->pending_tail->next = pf;
    else
        p->pending_head = pf;
    p->pending_tail = pf;
    return MACO_OK;
}

/* Publishes flushes whose work has completed, oldest first. Returns how many. */
static int maco__proxy_poll_flushes(struct maco_proxy *p)
{
    int done = 0;
    while (p->pending_head != NULL) {
        maco__pending_flush_t *pf = p->pending_head;
        int passed = 1;
        for (int t = 0; t < MACO__TRANSPORT_SLOTS && passed; t++)
            if (pf->has_marker[t])
                passed = p->tp[t].ops->marker_done(p, p->tp[t].state, pf->markers[t]);
        if (!passed)
            break;
        /* A newer flush of the same FIFO may have completed first in another FIFO's order;
         * flush_done only grows. */
        if (*pf->fifo->flush_done < pf->pos + 1)
            __atomic_store_n(pf->fifo->flush_done, pf->pos + 1, __ATOMIC_RELEASE);
        p->pending_head = pf->next;
        if (p->pending_head == NULL)
            p->pending_tail = NULL;
        maco__pending_free(p, pf);
        done++;
    }
    return done;
}

/* Moves every transport instance's work along; returns how much happened. */
static int maco__proxy_progress(struct maco_proxy *p)
{
    int work = 0;
    int n = __atomic_load_n(&p->npolled, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        int t = p->polled[i];
        work += p->tp[t].ops->progress(p, p->tp[t].state);
    }
    return work;
}

/* 1 while some transport has work of this rank in flight. */
static int maco__proxy_outstanding(struct maco_proxy *p)
{
    for (int t = 0; t < MACO__TRANSPORT_SLOTS; t++) {
        const maco__transport_ops_t *ops = __atomic_load_n(&p->tp[t].ops, __ATOMIC_ACQUIRE);
        if (ops != NULL && ops->outstanding(p, p->tp[t].state))
            return 1;
    }
    return 0;
}

static void maco__proxy_handle(struct maco_proxy *p, maco__fifo_t *f, maco_trigger_t t)
{
    uint32_t type = maco_trigger_type(t);
    uint32_t id = maco_trigger_channel(t);
    maco_port_channel_t ch = __atomic_load_n(&p->channels[id], __ATOMIC_ACQUIRE);
    if ((type & (MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL)) && ch == NULL) {
        maco__proxy_fail(p, maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                                        "rank %d's proxy got a trigger for channel %u, which "
                                        "does not exist (destroyed, or a corrupt trigger)",
                                        p->comm->rank, id));
        return;
    }
    void *state = ch != NULL ? p->tp[ch->transport].state : NULL;
    if ((type & (MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL)) && !ch->ops->alive(ch, state)) {
        /* The connection failed earlier and said so once (the communicator's async error);
         * the device's later puts and signals on it are dropped without a line each. */
        MACO_DEBUG(MACO_SUBSYS_PROXY,
                   "port channel %u to rank %d: connection failed; trigger dropped", id, ch->peer);
        type &= ~(uint32_t)(MACO_TRIGGER_DATA | MACO_TRIGGER_SIGNAL);
    }
    int signalled = 0;
    uint32_t inline_bytes = maco_trigger_inline_bytes(t);
    if ((type & MACO_TRIGGER_DATA) && inline_bytes != 0) {
        /* The value travels in the trigger (maco/device/fifo.h). */
        uint64_t dst = maco_trigger_dst_offset(t);
        if (dst > ch->dst_bytes || inline_bytes > ch->dst_bytes - dst ||
            ((ch->dst_addr + dst) & (inline_bytes - 1)) != 0) {
            maco__proxy_fail(p, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                                            "port channel %u to rank %d: an inline put of %u "
                                            "bytes to offset %llu leaves the destination (%llu "
                                            "bytes) or is misaligned; skipped",
                                            id, ch->peer, inline_bytes, (unsigned long long)dst,
                                            (unsigned long long)ch->dst_bytes));
        } else {
            int with_signal = (type & MACO_TRIGGER_SIGNAL) != 0;
            maco_status_t st =
                ch->ops->put_value(ch, state, dst, t.src_word, inline_bytes, with_signal);
            if (st != MACO_OK)
                maco__proxy_fail(p, st);
            signalled = with_signal; /* put_value's job, also when it failed */
            p->tp[ch->transport].work_since_marker = 1;
        }
    } else if (type & MACO_TRIGGER_DATA) {
        uint64_t dst = maco_trigger_dst_offset(t), src = maco_trigger_src_offset(t);
        uint64_t size = maco_trigger_size(t);
        if (src > ch->src_bytes || size > ch->src_bytes - src || dst > ch->dst_bytes ||
            size > ch->dst_bytes - dst) {
            maco__proxy_fail(p, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                                            "port channel %u to rank %d: a put of %llu bytes "
                                            "from offset %llu to offset %llu leaves the source "
                                            "(%llu bytes) or destination (%llu bytes); skipped",
                                            id, ch->peer, (unsigned long long)size,
                                            (unsigned long long)src, (unsigned long long)dst,
                                            (unsigned long long)ch->src_bytes,
                                            (unsigned long long)ch->dst_bytes));
        } else if (size > 0) {
            maco_status_t st = ch->ops->put(ch, state, dst, src, size);
            if (st != MACO_OK)
                maco__proxy_fail(p, st);
            p->tp[ch->transport].work_since_marker = 1;
        }
    }
    if ((type & MACO_TRIGGER_SIGNAL) && !signalled) {
        maco_status_t st = ch->ops->signal(ch, state);
        if (st != MACO_OK)
            maco__proxy_fail(p, st);
        p->tp[ch->transport].work_since_marker = 1;
    }
    if (type & MACO_TRIGGER_FLUSH) {
        maco_status_t st = maco__proxy_flush(p, f, f->tail);
        if (st != MACO_OK)
            maco__proxy_fail(p, st);
    }
}

/* Carries out up to `max` published triggers of one FIFO; returns how many. */
static int maco__proxy_drain(struct maco_proxy *p, maco__fifo_t *f, int max)
{
    int n = 0;
    maco_trigger_t t;
    while (n < max && maco__fifo_peek(f, &t)) {
        maco__proxy_handle(p, f, t);
        maco__fifo_pop(f);
        n++;
    }
    return n;
}

static void *maco__proxy_main(void *arg)
{
    struct maco_proxy *p = (struct maco_proxy *)arg;
    maco__log_set_rank(p->comm->rank);
    if (p->comm->cuda_device >= 0)
        cudaSetDevice(p->comm->cuda_device);
    maco__proxy_bind(p->comm);
    uint32_t idle = 0;
    /* An idle proxy still calls progress (a network transport receives there), so it sleeps
     * at most 50 us between looks. */
    int64_t idle_since = 0;
    while (!__atomic_load_n(&p->stop_requested, __ATOMIC_ACQUIRE)) {
        int work = maco__proxy_drain(p, &p->host_fifo, 64);
        if (p->has_device_fifo)
            work += maco__proxy_drain(p, &p->device_fifo, 64);
        work += maco__proxy_progress(p);
        work += maco__proxy_poll_flushes(p);
        if (work > 0 || p->pending_head != NULL) {
            idle = 0;
            idle_since = 0;
            continue;
        }
        if (++idle < 4096) {
            maco__cpu_pause();
        } else if (idle_since == 0) {
            idle_since = maco__now_ms();
        } else if (maco__now_ms() - idle_since < 1) {
            sched_yield();
        } else {
            struct timespec ts = { 0, 50000 };
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ lifecycle */

/* maco_proxy_create's work, with the communicator's device current. */
static maco_status_t maco__proxy_create_on_its_device(maco_comm_t comm, maco_proxy_t *proxy_p)
{
    if (comm == NULL || proxy_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_proxy_create: NULL argument");
    int64_t fifo_size, timeout_ms;
    maco_status_t st = maco__config_int64(MACO_CFG_PROXY_FIFO_SIZE, &fifo_size);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_DEVICE_TIMEOUT, &timeout_ms);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    if (fifo_size < 2 || fifo_size > 65536 || (fifo_size & (fifo_size - 1)) != 0)
        return maco__comm_record(comm, maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                                                   "MACO_PROXY_FIFO_SIZE=%lld is not a power of "
                                                   "two in [2, 65536]",
                                                   (long long)fifo_size));
    struct maco_proxy *p = (struct maco_proxy *)calloc(1, sizeof(*p));
    if (p == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY,
                                                   "maco_proxy_create: no memory"));
    p->comm = comm;
    p->timeout_ms = timeout_ms;
    p->peer_host_sems = (maco_mem_t *)calloc((size_t)comm->nranks, sizeof(maco_mem_t));
    maco_device_wait_bound_t bound = comm->bound;
    bound.timeout_ns = maco__timeout_ns(timeout_ms);
    if (p->peer_host_sems == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "maco_proxy_create: no memory");
        goto fail;
    }
    st = maco__fifo_create(&p->host_fifo, (uint64_t)fifo_size, 0, &bound, -1);
    if (st != MACO_OK)
        goto fail;
    if (comm->gpu_unavailable[0] == '\0') {
        /* The device FIFO's host memory on the GPU's NUMA node, where the proxy thread runs:
         * the GPU's reads of it (flush_done) and writes (triggers) then do not cross the
         * link between sockets. */
        char bus[64];
        st = maco__fifo_create(&p->device_fifo, (uint64_t)fifo_size, 1, &bound,
                               maco__gpu_numa_node(comm, bus, sizeof(bus)));
        if (st != MACO_OK)
            goto fail;
        p->has_device_fifo = 1;
    }
    p->uid = maco__random_u64();
    void *sems = NULL;
    st = maco_mem_alloc_host(comm, MACO__HOST_SEMS * sizeof(uint64_t), &sems);
    if (st != MACO_OK)
        goto fail;
    p->host_sems = (uint64_t *)sems;
    memset(sems, 0, MACO__HOST_SEMS * sizeof(uint64_t));
    st = maco_mem_register(comm, sems, MACO__HOST_SEMS * sizeof(uint64_t), &p->host_sems_mem);
    if (st != MACO_OK)
        goto fail;
    *proxy_p = p;
    return MACO_OK;
fail:
    maco_proxy_destroy(p);
    return maco__comm_record(comm, st);
}

maco_status_t maco_proxy_create(maco_comm_t comm, maco_proxy_t *proxy_p)
{
    if (comm == NULL || proxy_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_proxy_create: NULL argument");
    /* The device FIFO's memory is pinned for, and allocated on, the communicator's device
     * whichever device the calling thread has current; the caller's stays current. */
    int saved = -1;
    maco_status_t st = maco__device_enter_status(comm->cuda_device, &saved, "maco_proxy_create");
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    st = maco__proxy_create_on_its_device(comm, proxy_p);
    maco__device_leave(saved);
    return st;
}

/* maco_proxy_start's work, with the communicator's device current. */
static maco_status_t maco__proxy_start_on_its_device(maco_proxy_t p)
{
    if (p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_proxy_start: proxy is NULL");
    if (p->running)
        return maco__comm_record(p->comm, maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                                                      "maco_proxy_start: the proxy runs already"));
    if (p->started_before && p->has_device_fifo) {
        /* A device push that gave up (its proxy stopped, or its wait timed out) leaves a
         * reserved position unpublished (maco/device/fifo.h); the proxy would stop there
         * for good, so a restart over one is refused. */
        uint64_t head = 0;
        cudaError_t cerr =
            cudaMemcpy(&head, p->device_fifo.view.head, sizeof(head), cudaMemcpyDeviceToHost);
        if (cerr != cudaSuccess) {
            cudaGetLastError();
            return maco__comm_record(p->comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_PROXY,
                                                          "maco_proxy_start: reading the device "
                                                          "FIFO's head: %s",
                                                          cudaGetErrorString(cerr)));
        }
        uint64_t holes = maco__fifo_unpublished(&p->device_fifo, head);
        if (holes > 0)
            return maco__comm_record(
                p->comm, maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                                     "maco_proxy_start: %llu device FIFO position(s) were "
                                     "reserved by kernels that gave up (the proxy was stopped "
                                     "or their wait timed out) and will never be published; "
                                     "destroy this proxy and its channels and create new ones",
                                     (unsigned long long)holes));
    }
    p->stop_requested = 0;
    p->draining = 0;
    __atomic_store_n(p->host_fifo.state, MACO_PROXY_RUNNING, __ATOMIC_RELEASE);
    if (p->has_device_fifo)
        __atomic_store_n(p->device_fifo.state, MACO_PROXY_RUNNING, __ATOMIC_RELEASE);
    int err = pthread_create(&p->thread, NULL, maco__proxy_main, p);
    if (err != 0) {
        __atomic_store_n(p->host_fifo.state, MACO_PROXY_STOPPED, __ATOMIC_RELEASE);
        if (p->has_device_fifo)
            __atomic_store_n(p->device_fifo.state, MACO_PROXY_STOPPED, __ATOMIC_RELEASE);
        return maco__comm_record(p->comm, maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                                                      "maco_proxy_start: pthread_create: %s",
                                                      strerror(err)));
    }
    p->running = 1;
    p->started_before = 1;
    return MACO_OK;
}

maco_status_t maco_proxy_start(maco_proxy_t p)
{
    if (p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_proxy_start: proxy is NULL");
    int saved = -1;
    maco_status_t st = maco__device_enter_status(p->comm->cuda_device, &saved, "maco_proxy_start");
    if (st != MACO_OK)
        return maco__comm_record(p->comm, st);
    st = maco__proxy_start_on_its_device(p);
    maco__device_leave(saved);
    return st;
}

/* maco_proxy_stop's work, with the communicator's device current. */
static maco_status_t maco__proxy_stop_on_its_device(maco_proxy_t p)
{
    if (p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_proxy_stop: proxy is NULL");
    if (!p->running)
        return MACO_OK;
    /* First the FIFOs say "stopped": from now on every wait for ring space or for a flush
     * fails at once, so no device or host caller waits for the bound. */
    __atomic_store_n(p->host_fifo.state, MACO_PROXY_STOPPED, __ATOMIC_RELEASE);
    if (p->has_device_fifo)
        __atomic_store_n(p->device_fifo.state, MACO_PROXY_STOPPED, __ATOMIC_RELEASE);
    __atomic_store_n(&p->stop_requested, 1, __ATOMIC_RELEASE);
    pthread_join(p->thread, NULL);
    p->running = 0;
    /* Flushes not completed by now never will be: a waiter, seeing the stopped state, fails
     * with MACO_ERR_REMOTE (completing them would let a kernel that keeps pushing run on). */
    p->draining = 1;
    while (p->pending_head != NULL) {
        maco__pending_flush_t *pf = p->pending_head;
        p->pending_head = pf->next;
        maco__pending_free(p, pf);
    }
    p->pending_tail = NULL;
    /* Then carry out what was already published (and what arrives while doing so) until
     * 10 ms pass without a new trigger and no transport has work in flight, all within the
     * bound. */
    maco_status_t st = MACO_OK;
    int64_t now = maco__now_ms();
    int64_t deadline = now + maco__proxy_host_bound_ms(p);
    int64_t quiet_since = now;
    for (;;) {
        int work = maco__proxy_drain(p, &p->host_fifo, 1 << 30);
        if (p->has_device_fifo)
            work += maco__proxy_drain(p, &p->device_fifo, 1 << 30);
        work += maco__proxy_progress(p);
        work += maco__proxy_poll_flushes(p);
        now = maco__now_ms();
        if (work > 0)
            quiet_since = now;
        else if (now - quiet_since >= 10 && p->pending_head == NULL && !maco__proxy_outstanding(p))
            break;
        if (now > deadline) {
            st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_PROXY,
                             "maco_proxy_stop: triggers were still arriving or transfers still "
                             "in flight at the deadline; the rest is dropped");
            maco__proxy_fail(p, st);
            break;
        }
        if (work == 0)
            sched_yield();
    }
    return maco__comm_record(p->comm, st);
}

maco_status_t maco_proxy_stop(maco_proxy_t p)
{
    if (p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "maco_proxy_stop: proxy is NULL");
    /* The drain below copies on the communicator's device; the caller's stays current. */
    int saved = -1;
    (void)maco__device_enter(p->comm->cuda_device, &saved);
    maco_status_t st = maco__proxy_stop_on_its_device(p);
    maco__device_leave(saved);
    return st;
}

/* maco_proxy_destroy's work, with the communicator's device current. */
static maco_status_t maco__proxy_destroy_on_its_device(maco_proxy_t p)
{
    if (p == NULL)
        return MACO_OK;
    /* Channels point at their proxy: freeing it under them would let a later
     * maco_port_channel_destroy write freed memory. */
    char ids[160] = "";
    size_t used = 0;
    uint32_t live = 0;
    for (uint32_t id = 0; id < p->nchannels; id++) {
        if (__atomic_load_n(&p->channels[id], __ATOMIC_ACQUIRE) == NULL)
            continue;
        if (live++ < 8 && used < sizeof(ids))
            used += (size_t)snprintf(ids + used, sizeof(ids) - used, " %u", id);
    }
    if (live > 0)
        return maco__comm_record(p->comm,
                                 maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                                             "maco_proxy_destroy: the proxy still has %u live "
                                             "port channel(s) (ids%s%s); destroy them first "
                                             "(nothing was freed)",
                                             live, ids, live > 8 ? " ..." : ""));
    maco_proxy_stop(p);
    while (p->pending_head != NULL) {
        maco__pending_flush_t *pf = p->pending_head;
        p->pending_head = pf->next;
        maco__pending_free(p, pf);
    }
    for (int t = 0; t < MACO__TRANSPORT_SLOTS; t++)
        if (p->tp[t].ops != NULL)
            p->tp[t].ops->proxy_teardown(p, p->tp[t].state);
    if (p->peer_host_sems != NULL)
        for (int r = 0; r < p->comm->nranks; r++)
            maco_mem_deregister(p->peer_host_sems[r]);
    maco_mem_deregister(p->host_sems_mem);
    if (p->host_sems)
        maco_mem_free(p->comm, p->host_sems);
    maco__fifo_destroy(&p->host_fifo);
    if (p->has_device_fifo)
        maco__fifo_destroy(&p->device_fifo);
    free(p->peer_host_sems);
    free(p);
    return MACO_OK;
}

maco_status_t maco_proxy_destroy(maco_proxy_t p)
{
    if (p == NULL)
        return MACO_OK;
    int saved = -1;
    (void)maco__device_enter(p->comm->cuda_device, &saved);
    maco_status_t st = maco__proxy_destroy_on_its_device(p);
    maco__device_leave(saved);
    return st;
}
