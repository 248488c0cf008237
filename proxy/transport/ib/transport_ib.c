/*
 * transport_ib.c - the IB verbs transport: port channels over RDMA, InfiniBand or RoCE
 * (docs/design.md, "Transports").
 *
 * libibverbs is dlopen'ed (ib_symbols.h); without it, or without an ACTIVE port, the
 * transport is unavailable and says why. Each proxy uses one device port: MACO_IB_HCA's
 * choice, else the ACTIVE port nearest the GPU in the PCI tree, local ranks spread over equally
 * near ones. The GID is MACO_IB_GID_INDEX, else a RoCE v2 IPv4-mapped GID (sysfs says each
 * entry's type); on the InfiniBand link layer the LID addresses the peer.
 *
 * Connections. Two proxies with channels between them share one RC queue pair (a
 * "connection": this proxy, the peer's proxy), made at their first channel. Every channel's
 * connect exchanges an endpoint over the bootstrap (layout below): the queue pair's number,
 * PSN, LID, GID and MTU when the connection is new, and always the rkey and address of what
 * the peer's channel writes here: its destination buffer (ch->recv) and the semaphore its
 * signals raise (ch->inbound, or ch->inbound_dev in the comm buffer). A new connection is
 * brought to RTS on both sides, then a second exchange says both are ready, so the first
 * write never reaches a queue pair that cannot take it yet.
 *
 * The endpoint and ready messages: proxy/ib_wire.h.
 *
 * Puts are RDMA WRITEs from the source's memory region (split at the port's max_msg_sz);
 * a signal is an 8-byte RDMA WRITE of the channel's new count to the peer's semaphore
 * (inline where the QP takes inline data, else from a registered slot untouched until its
 * completion), posted after the channel's data on the same QP: an RC responder executes a
 * QP's writes in PSN order, so a waiter that sees the count sees the data. (GPU memory on the
 * receiving side: a NIC's writes over PCIe stay in order as long as relaxed ordering is off,
 * and it is not asked for; NCCL also reads back before a GPU consumes received data, which is
 * not done here. Not run on our machines.)
 *
 * Posting. put and signal queue operations on the connection (a ring indexed by a local
 * sequence number); progress posts what waits, as one linked list per ibv_post_send, as far
 * as the send queue has room, then polls the connection's CQ. A WR is signalled every
 * MACO__IB_SIGNAL_EVERY, when it is the last one a flush marker covers, and when it empties
 * the queue, so no posted WR is left without a later signalled one (a completion means every
 * earlier WR of its QP completed). Markers are the transport's operation sequence number;
 * one is done when no connection has an operation at or before it outstanding.
 *
 * Memory regions cover whole allocations (maco__mem_lookup), with LOCAL_WRITE, REMOTE_WRITE,
 * REMOTE_READ and REMOTE_ATOMIC, cached per proxy and counted by the channels that use them.
 * Host memory uses ibv_reg_mr; GPU memory a dma-buf from the CUDA driver
 * (cuMemGetHandleForAddressRange, ibv_reg_dmabuf_mr), else ibv_reg_mr (nvidia-peermem).
 *
 * Failures. An error completion, a failed post or a failed poll fails the connection: the
 * communicator's async error names the peer, the device, the QP and the status, `alive` says
 * 0, later flushes complete at once and their callers see MACO_ERR_REMOTE. A dead peer is
 * found when the QP's retries run out (MACO_IB_TIMEOUT, MACO_IB_RETRY_CNT: about
 * 4.096 us * 2^timeout * (retry_cnt + 1)), or sooner when work to it has waited 2 s for a
 * completion and its bootstrap link says its process is gone; a peer that leaves with nothing
 * in flight is no error (nothing is sent to it, nothing is looked at).
 */
#include <stdio.h>

#include "proxy_internal.h"

#ifndef MACO_HAVE_IBVERBS

/* Built without <infiniband/verbs.h>: IB is never offered. */
static int maco__ib_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    snprintf(why, cap,
             "MACO was built without the IB transport (no infiniband/verbs.h at build time: "
             "install libibverbs-dev and rebuild)");
    return 0;
}

const maco__transport_ops_t maco__transport_ib_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "IB verbs",
    .available = maco__ib_available,
};

#else /* MACO_HAVE_IBVERBS */

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap_internal.h"
#include "config.h"
#include "cuda_driver.h"
#include "ib_symbols.h"
#include "ib_wire.h"
#include "log.h"
#include "socket.h"
#include "wire.h"

enum {
    MACO__IB_DEPTH = 256,       /* send queue depth (at most the device's max_qp_wr) */
    MACO__IB_SIGNAL_EVERY = 32, /* a signalled WR at least this often (< depth) */
    MACO__IB_POLL = 32,         /* completions per poll */
    MACO__IB_INLINE = 64,       /* inline bytes asked for */
    MACO__IB_MAX_PORTS = 64,    /* candidate ports remembered */
    MACO__IB_OP_PUT = 1,        /* operation kinds */
    MACO__IB_OP_SIGNAL = 2,     /* ... */
    MACO__IB_NAME = 64,         /* device name bytes */
    MACO__IB_STALL_MS = 2000,   /* posted work waiting this long for a completion: peer alive? */
};
_Static_assert((int)MACO__IB_LINK_IB == (int)IBV_LINK_LAYER_INFINIBAND &&
                   (int)MACO__IB_LINK_ETH == (int)IBV_LINK_LAYER_ETHERNET &&
                   (int)MACO__IB_MTU_MIN == (int)IBV_MTU_256 &&
                   (int)MACO__IB_MTU_MAX == (int)IBV_MTU_4096,
               "ib_wire.h's codes are the verbs' own");
#define MACO__IB_ACCESS                                                                            \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |                   \
     IBV_ACCESS_REMOTE_ATOMIC)

/* ------------------------------------------------------------------ state */

/* A memory region over one allocation, shared by the channels that use it (caller thread). */
typedef struct maco__ib_mr {
    struct maco__ib_mr *next;
    char *base;
    size_t bytes;
    int is_host;
    struct ibv_mr *mr;
    int refs;
} maco__ib_mr_t;

/* A queued or posted operation (proxy thread). */
typedef struct maco__ib_op {
    uint64_t seq;   /* the transport's operation sequence number (flush markers) */
    uint64_t laddr; /* PUT: source address */
    uint64_t raddr; /* destination in the peer's process */
    uint64_t value; /* SIGNAL: the count written */
    uint32_t lkey, rkey;
    uint32_t bytes;
    uint8_t kind;
    uint8_t host_src; /* PUT: the source is host memory (may go inline) */
} maco__ib_op_t;

/* The RC queue pair between this proxy and one peer proxy. */
typedef struct maco__ib_conn {
    struct maco__ib_conn *next; /* published list (release/acquire) */
    int peer;
    uint64_t peer_uid;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t remote_qpn;
    uint32_t depth;      /* send queue slots */
    uint32_t max_inline; /* what the QP took */
    /* Operations by local sequence number: [tail, posted) posted and not known complete,
     * [posted, head) waiting to be posted. ops has cap (a power of two) entries. */
    maco__ib_op_t *ops;
    uint64_t cap;
    uint64_t tail, posted, head;
    uint64_t signal_at; /* 1 + the local number a flush marker wants signalled (0: none) */
    uint64_t *slots;    /* [depth] signal values when they cannot go inline */
    struct ibv_mr *slots_mr;
    int64_t moved_ms;     /* the last completion, or when posted work began to wait */
    int64_t next_look_ms; /* the next look at the peer's bootstrap link while stalled */
    int failed;           /* set once (release): the connection is unusable */
} maco__ib_conn_t;

typedef struct maco__ib_state {
    const maco__ibv_table_t *v;
    /* The device port, opened at the first connect (a failed open is tried again). */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    char dev[MACO__IB_NAME];
    uint8_t port;
    uint8_t link_layer;
    uint8_t mtu;
    uint16_t lid;
    int gid_index; /* -1: none (InfiniBand, LID routed) */
    union ibv_gid gid;
    uint64_t max_msg;
    uint32_t depth;
    int timeout, retry_cnt;
    maco__ib_mr_t *mrs;
    maco__ib_conn_t *conns;  /* pushed by the caller thread, read by the proxy thread */
    uint64_t seq;            /* proxy thread: the last operation sequence number given */
    struct ibv_send_wr *wrs; /* [depth] scratch for one post (proxy thread) */
    struct ibv_sge *sges;
} maco__ib_state_t;

/* A channel's state (ch->tp). */
typedef struct maco__ib_channel {
    maco__ib_conn_t *conn;
    maco__ib_mr_t *src_mr, *recv_mr, *sem_mr;
    uint32_t dst_rkey, sem_rkey;
    uint64_t sem_addr; /* the peer's semaphore in its process */
} maco__ib_channel_t;

/* ------------------------------------------------------------------ device ports */

typedef struct maco__ib_port {
    char dev[MACO__IB_NAME];
    uint8_t port;
    uint8_t link_layer;
} maco__ib_port_t;

/* MACO_IB_HCA, parsed: "[^][=]name[:port],..." */
typedef struct maco__ib_filter {
    int exclude, exact, n;
    struct {
        char name[MACO__IB_NAME];
        int port; /* -1: any */
    } e[32];
} maco__ib_filter_t;

static int maco__ib_filter_parse(const char *text, maco__ib_filter_t *f, char *why, size_t cap)
{
    memset(f, 0, sizeof(*f));
    const char *s = text;
    for (; *s == '^' || *s == '='; s++) {
        if (*s == '^')
            f->exclude = 1;
        else
            f->exact = 1;
    }
    while (*s != '\0') {
        size_t len = strcspn(s, ",");
        if (len > 0) {
            if (f->n >= (int)(sizeof(f->e) / sizeof(f->e[0]))) {
                snprintf(why, cap, "MACO_IB_HCA=%s names more than %d devices", text,
                         (int)(sizeof(f->e) / sizeof(f->e[0])));
                return -1;
            }
            char item[128];
            snprintf(item, sizeof(item), "%.*s", (int)(len < 127 ? len : 127), s);
            char *colon = strchr(item, ':');
            f->e[f->n].port = -1;
            if (colon != NULL) {
                *colon = '\0';
                char *end = NULL;
                long port = strtol(colon + 1, &end, 10);
                if (end == colon + 1 || *end != '\0' || port < 1 || port > 255) {
                    snprintf(why, cap, "MACO_IB_HCA=%s: '%s' is not a port number (1..255)", text,
                             colon + 1);
                    return -1;
                }
                f->e[f->n].port = (int)port;
            }
            if (item[0] == '\0' || strlen(item) >= MACO__IB_NAME) {
                snprintf(why, cap, "MACO_IB_HCA=%s: empty or too long a device name", text);
                return -1;
            }
            memcpy(f->e[f->n].name, item, strlen(item) + 1); /* shorter than the field: checked */
            f->n++;
        }
        s += len;
        if (*s == ',')
            s++;
    }
    return 0;
}

static int maco__ib_filter_match(const maco__ib_filter_t *f, const char *dev, int port)
{
    if (f->n == 0)
        return 1;
    int hit = 0;
    for (int i = 0; i < f->n && !hit; i++) {
        int name = f->exact ? strcmp(dev, f->e[i].name) == 0
                            : strncmp(dev, f->e[i].name, strlen(f->e[i].name)) == 0;
        hit = name && (f->e[i].port < 0 || f->e[i].port == port);
    }
    return f->exclude ? !hit : hit;
}

/* The ACTIVE ports MACO_IB_HCA allows, probed once per process. */
static struct {
    pthread_once_t once;
    int n;
    maco__ib_port_t ports[MACO__IB_MAX_PORTS];
    char why[768]; /* n == 0: why there is none */
} maco__ib_probe_result = { PTHREAD_ONCE_INIT, 0, { { "", 0, 0 } }, "" };

static void maco__ib_probe(void)
{
    char *why = maco__ib_probe_result.why;
    size_t cap = sizeof(maco__ib_probe_result.why);
    const maco__ibv_table_t *v = maco__ibv(why, cap);
    if (v == NULL)
        return;
    const char *hca = maco__config_string(MACO_CFG_IB_HCA);
    maco__ib_filter_t f;
    if (maco__ib_filter_parse(hca, &f, why, cap) != 0)
        return;
    int ndev = 0;
    struct ibv_device **list = v->get_device_list(&ndev);
    if (list == NULL || ndev == 0) {
        int err = errno;
        snprintf(why, cap, "no RDMA device (ibv_get_device_list%s%s%s)", list == NULL ? ": " : "",
                 list == NULL ? strerror(err) : "",
                 list == NULL && err == ENOSYS ? ": this kernel has no RDMA support loaded" : "");
        if (list != NULL)
            v->free_device_list(list);
        return;
    }
    char seen[512] = "";
    size_t used = 0;
    for (int d = 0; d < ndev; d++) {
        const char *name = v->get_device_name(list[d]);
        struct ibv_context *ctx = v->open_device(list[d]);
        struct ibv_device_attr da;
        if (ctx == NULL || v->query_device(ctx, &da) != 0) {
            if (used < sizeof(seen))
                used +=
                    (size_t)snprintf(seen + used, sizeof(seen) - used, " %s (cannot open)", name);
            if (ctx != NULL)
                v->close_device(ctx);
            continue;
        }
        for (int port = 1; port <= da.phys_port_cnt; port++) {
            struct ibv_port_attr pa;
            if (maco__ibv_query_port(v, ctx, (uint8_t)port, &pa) != 0)
                continue;
            int ok = pa.state == IBV_PORT_ACTIVE;
            int allowed = maco__ib_filter_match(&f, name, port);
            if (used < sizeof(seen))
                used += (size_t)snprintf(seen + used, sizeof(seen) - used, " %s:%d (%s%s)", name,
                                         port, ok ? "active" : "not active",
                                         allowed ? "" : ", excluded by MACO_IB_HCA");
            if (ok && allowed && maco__ib_probe_result.n < MACO__IB_MAX_PORTS) {
                maco__ib_port_t *pp = &maco__ib_probe_result.ports[maco__ib_probe_result.n++];
                snprintf(pp->dev, sizeof(pp->dev), "%s", name);
                pp->port = (uint8_t)port;
                pp->link_layer = pa.link_layer;
            }
        }
        v->close_device(ctx);
    }
    v->free_device_list(list);
    if (maco__ib_probe_result.n == 0)
        snprintf(why, cap, "no ACTIVE RDMA port%s (MACO_IB_HCA='%s'; seen:%s)",
                 f.n > 0 ? " that MACO_IB_HCA allows" : "", hca, seen[0] ? seen : " nothing");
}

static int maco__ib_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    pthread_once(&maco__ib_probe_result.once, maco__ib_probe);
    if (maco__ib_probe_result.n > 0)
        return 1;
    static int logged;
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_ACQ_REL))
        MACO_INFO(MACO_SUBSYS_PROXY, "IB transport unavailable: %s", maco__ib_probe_result.why);
    snprintf(why, cap, "%s", maco__ib_probe_result.why);
    return 0;
}

/* The PCI path of a sysfs device link (realpath), or "" when it has none (soft-RoCE). */
static void maco__ib_pci_path(const char *link, char *out, size_t cap)
{
    char buf[PATH_MAX];
    out[0] = '\0';
    if (realpath(link, buf) != NULL && strstr(buf, "/pci") != NULL)
        snprintf(out, cap, "%s", buf);
}

/* Hops between two sysfs device paths: the components of each below their common prefix. */
static int maco__ib_pci_distance(const char *a, const char *b)
{
    size_t i = 0, common = 0;
    while (a[i] != '\0' && a[i] == b[i]) {
        i++;
        if ((a[i] == '/' || a[i] == '\0') && (b[i] == '/' || b[i] == '\0'))
            common = i;
    }
    int hops = 0;
    for (const char *p = a + common; *p; p++)
        hops += *p == '/';
    for (const char *p = b + common; *p; p++)
        hops += *p == '/';
    return hops;
}

/* The port this proxy uses: the nearest to its GPU in the PCI tree (every port is equally near
 * without a GPU or a PCI path), local ranks spread over the nearest ones. */
static const maco__ib_port_t *maco__ib_choose_port(maco_comm_t comm, char *how, size_t cap)
{
    int n = maco__ib_probe_result.n;
    int dist[MACO__IB_MAX_PORTS];
    char gpu[PATH_MAX] = "";
    if (comm->cuda_device >= 0 && comm->gpu_unavailable[0] == '\0') {
        char bus[64];
        if (cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), comm->cuda_device) == cudaSuccess) {
            for (char *c = bus; *c; c++)
                *c = (char)tolower((unsigned char)*c);
            char link[128];
            snprintf(link, sizeof(link), "/sys/bus/pci/devices/%s", bus);
            maco__ib_pci_path(link, gpu, sizeof(gpu));
        } else {
            cudaGetLastError();
        }
    }
    int best = INT_MAX, ties = 0;
    for (int i = 0; i < n; i++) {
        char link[160], nic[PATH_MAX];
        snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device",
                 maco__ib_probe_result.ports[i].dev);
        maco__ib_pci_path(link, nic, sizeof(nic));
        dist[i] = gpu[0] != '\0' && nic[0] != '\0' ? maco__ib_pci_distance(gpu, nic) : 0;
        if (dist[i] < best) {
            best = dist[i];
            ties = 0;
        }
        if (dist[i] == best)
            ties++;
    }
    int pick = comm->local_rank % ties, chosen = 0;
    for (int i = 0; i < n; i++)
        if (dist[i] == best && pick-- == 0) {
            chosen = i;
            break;
        }
    if (gpu[0] == '\0')
        snprintf(how, cap, "local rank %d over %d active port(s)", comm->local_rank, ties);
    else
        snprintf(how, cap, "%d PCI hop(s) from the GPU; local rank %d over %d such port(s)", best,
                 comm->local_rank, ties);
    return &maco__ib_probe_result.ports[chosen];
}

/* ------------------------------------------------------------------ GID */

static int maco__ib_gid_zero(const union ibv_gid *g)
{
    for (int i = 0; i < 16; i++)
        if (g->raw[i] != 0)
            return 0;
    return 1;
}

static int maco__ib_gid_v4_mapped(const union ibv_gid *g)
{
    for (int i = 0; i < 10; i++)
        if (g->raw[i] != 0)
            return 0;
    return g->raw[10] == 0xff && g->raw[11] == 0xff;
}

static void maco__ib_gid_text(const union ibv_gid *g, char *out, size_t cap)
{
    if (maco__ib_gid_v4_mapped(g)) {
        snprintf(out, cap, "::ffff:%u.%u.%u.%u", g->raw[12], g->raw[13], g->raw[14], g->raw[15]);
        return;
    }
    size_t used = 0;
    for (int i = 0; i < 16 && used < cap; i += 2)
        used += (size_t)snprintf(out + used, cap - used, "%s%02x%02x", i ? ":" : "", g->raw[i],
                                 g->raw[i + 1]);
}

/* The GID's type from sysfs ("RoCE v2", "IB/RoCE v1"), or "" when it has none. */
static void maco__ib_gid_type(const char *dev, int port, int index, char *out, size_t cap)
{
    char path[256];
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
             index);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    if (fgets(out, (int)cap, f) == NULL)
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* Chooses the GID: MACO_IB_GID_INDEX, or on Ethernet the best of RoCE v2 IPv4-mapped, RoCE v2,
 * RoCE v1 (first of each); on InfiniBand without an index, none (the LID). */
static maco_status_t maco__ib_pick_gid(maco__ib_state_t *t, int gid_tbl_len, char *how, size_t cap)
{
    const maco__ibv_table_t *v = t->v;
    int64_t asked = -1;
    maco_status_t st = maco__config_int64(MACO_CFG_IB_GID_INDEX, &asked);
    if (st != MACO_OK)
        return st;
    char type[32], text[64];
    if (asked >= 0) {
        if (asked >= gid_tbl_len)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                               "IB transport: MACO_IB_GID_INDEX=%lld is unusable: %s port %u has "
                               "%d GID entries (0..%d)",
                               (long long)asked, t->dev, t->port, gid_tbl_len, gid_tbl_len - 1);
        int err = v->query_gid(t->ctx, t->port, (int)asked, &t->gid);
        if (err != 0 || maco__ib_gid_zero(&t->gid))
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                               "IB transport: MACO_IB_GID_INDEX=%lld is unusable: %s port %u's "
                               "GID entry %lld is %s",
                               (long long)asked, t->dev, t->port, (long long)asked,
                               err != 0 ? strerror(err > 0 ? err : errno) : "empty");
        t->gid_index = (int)asked;
        maco__ib_gid_type(t->dev, t->port, t->gid_index, type, sizeof(type));
        maco__ib_gid_text(&t->gid, text, sizeof(text));
        snprintf(how, cap, "GID index %d %s (%s; MACO_IB_GID_INDEX)", t->gid_index, text,
                 type[0] ? type : "type unknown");
        return MACO_OK;
    }
    if (t->link_layer == IBV_LINK_LAYER_INFINIBAND) {
        t->gid_index = -1;
        snprintf(how, cap, "LID %u (InfiniBand link layer; MACO_IB_GID_INDEX picks a GID instead)",
                 t->lid);
        return MACO_OK;
    }
    int best = -1, best_score = 0;
    union ibv_gid g, best_gid;
    memset(&best_gid, 0, sizeof(best_gid));
    for (int i = 0; i < gid_tbl_len && best_score < 3; i++) {
        maco__ib_gid_type(t->dev, t->port, i, type, sizeof(type));
        if (type[0] == '\0')
            continue; /* an unused entry (sysfs refuses to read its type) */
        if (v->query_gid(t->ctx, t->port, i, &g) != 0 || maco__ib_gid_zero(&g))
            continue;
        int v2 = strstr(type, "v2") != NULL;
        int score = v2 ? (maco__ib_gid_v4_mapped(&g) ? 3 : 2) : 1;
        if (score > best_score) {
            best_score = score;
            best = i;
            best_gid = g;
        }
    }
    if (best < 0)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                           "IB transport: %s port %u (Ethernet link layer) has no usable GID "
                           "among its %d entries: give the netdev an IP address, or set "
                           "MACO_IB_GID_INDEX",
                           t->dev, t->port, gid_tbl_len);
    t->gid_index = best;
    t->gid = best_gid;
    maco__ib_gid_type(t->dev, t->port, best, type, sizeof(type));
    maco__ib_gid_text(&t->gid, text, sizeof(text));
    snprintf(how, cap, "GID index %d %s (%s; picked: %s)", best, text, type,
             best_score == 3   ? "the first RoCE v2 IPv4-mapped GID"
             : best_score == 2 ? "no IPv4-mapped RoCE v2 GID, the first RoCE v2 one"
                               : "no RoCE v2 GID, the first RoCE v1 one");
    return MACO_OK;
}

/* ------------------------------------------------------------------ proxy instance */

static maco_status_t maco__ib_proxy_setup(struct maco_proxy *p, void **state_p)
{
    char why[512];
    const maco__ibv_table_t *v = maco__ibv(why, sizeof(why));
    if (v == NULL)
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY, "IB transport: %s", why);
    int64_t timeout = 18, retry = 7;
    maco_status_t st = maco__config_int64(MACO_CFG_IB_TIMEOUT, &timeout);
    if (st == MACO_OK)
        st = maco__config_int64(MACO_CFG_IB_RETRY_CNT, &retry);
    if (st != MACO_OK)
        return st;
    if (timeout < 1 || timeout > 31)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "MACO_IB_TIMEOUT=%lld is outside 1..31", (long long)timeout);
    if (retry < 0 || retry > 7)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_PROXY,
                           "MACO_IB_RETRY_CNT=%lld is outside 0..7", (long long)retry);
    maco__ib_state_t *t = (maco__ib_state_t *)calloc(1, sizeof(*t));
    if (t == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
    t->v = v;
    t->gid_index = -1;
    t->timeout = (int)timeout;
    t->retry_cnt = (int)retry;
    *state_p = t;
    return MACO_OK;
}

/* Opens the device port (first connect): device, port attributes, GID, protection domain. */
static maco_status_t maco__ib_open(struct maco_proxy *p, maco__ib_state_t *t)
{
    if (t->ctx != NULL)
        return MACO_OK;
    const maco__ibv_table_t *v = t->v;
    char why[768];
    if (!maco__ib_available(p->comm, -1, why, sizeof(why)))
        return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY, "IB transport: %s", why);
    char how_port[160];
    const maco__ib_port_t *choice = maco__ib_choose_port(p->comm, how_port, sizeof(how_port));
    snprintf(t->dev, sizeof(t->dev), "%s", choice->dev);
    t->port = choice->port;
    int ndev = 0;
    struct ibv_device **list = v->get_device_list(&ndev);
    for (int d = 0; list != NULL && d < ndev && t->ctx == NULL; d++)
        if (strcmp(v->get_device_name(list[d]), t->dev) == 0)
            t->ctx = v->open_device(list[d]);
    int err = errno;
    if (list != NULL)
        v->free_device_list(list);
    if (t->ctx == NULL)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                           "IB transport: opening %s failed: %s", t->dev, strerror(err));
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    maco_status_t st = MACO_OK;
    char how_gid[256] = "";
    if ((err = v->query_device(t->ctx, &da)) != 0 ||
        (err = maco__ibv_query_port(v, t->ctx, t->port, &pa)) != 0) {
        st =
            maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY, "IB transport: querying %s port %u: %s",
                        t->dev, t->port, strerror(err > 0 ? err : errno));
        goto fail;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                         "IB transport: %s port %u is no longer active", t->dev, t->port);
        goto fail;
    }
    t->link_layer =
        pa.link_layer == IBV_LINK_LAYER_UNSPECIFIED ? IBV_LINK_LAYER_INFINIBAND : pa.link_layer;
    t->mtu = (uint8_t)pa.active_mtu;
    t->lid = pa.lid;
    t->max_msg = pa.max_msg_sz > 0 ? pa.max_msg_sz : (1u << 30);
    t->depth =
        da.max_qp_wr > 0 && da.max_qp_wr < MACO__IB_DEPTH ? (uint32_t)da.max_qp_wr : MACO__IB_DEPTH;
    if (da.max_cqe > 0 && (uint32_t)da.max_cqe < t->depth)
        t->depth = (uint32_t)da.max_cqe;
    if (t->depth < 2 * MACO__IB_SIGNAL_EVERY) {
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                         "IB transport: %s allows %d WRs per queue pair and %d CQ entries; "
                         "MACO needs %d",
                         t->dev, da.max_qp_wr, da.max_cqe, 2 * MACO__IB_SIGNAL_EVERY);
        goto fail;
    }
    st = maco__ib_pick_gid(t, pa.gid_tbl_len, how_gid, sizeof(how_gid));
    if (st != MACO_OK)
        goto fail;
    t->pd = v->alloc_pd(t->ctx);
    if (t->pd == NULL) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                         "IB transport: ibv_alloc_pd on %s failed: %s", t->dev, strerror(errno));
        goto fail;
    }
    t->wrs = (struct ibv_send_wr *)calloc(t->depth, sizeof(*t->wrs));
    t->sges = (struct ibv_sge *)calloc(t->depth, sizeof(*t->sges));
    if (t->wrs == NULL || t->sges == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
        goto fail;
    }
    MACO_INFO(MACO_SUBSYS_PROXY,
              "IB transport of rank %d: %s port %u (%s; %s), %s link layer, MTU %d, %s; queue "
              "pairs: %u WRs, timeout %d, retry_cnt %d",
              p->comm->rank, t->dev, t->port,
              maco__config_is_set(MACO_CFG_IB_HCA) ? "MACO_IB_HCA allows it" : "no MACO_IB_HCA",
              how_port, t->link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand",
              128 << t->mtu, how_gid, t->depth, t->timeout, t->retry_cnt);
    return MACO_OK;
fail:
    free(t->wrs);
    free(t->sges);
    t->wrs = NULL;
    t->sges = NULL;
    if (t->pd != NULL)
        v->dealloc_pd(t->pd);
    t->pd = NULL;
    v->close_device(t->ctx);
    t->ctx = NULL;
    return st;
}

/* ------------------------------------------------------------------ memory regions */

/* Registers GPU memory: a dma-buf of the range from the CUDA driver, else the address itself
 * (nvidia-peermem). The range is widened to whole host pages, as both need. Not run on our
 * machines (no GPU next to an RDMA NIC): kept small. */
static struct ibv_mr *maco__ib_reg_gpu(maco__ib_state_t *t, char *base, size_t bytes, char *why,
                                       size_t cap)
{
    const maco__ibv_table_t *v = t->v;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)base & ~(page - 1);
    size_t len = (size_t)((((uintptr_t)base + bytes + page - 1) & ~(page - 1)) - start);
    struct ibv_mr *mr = NULL;
    why[0] = '\0';
    if (v->reg_dmabuf_mr == NULL) {
        snprintf(why, cap, "libibverbs has no ibv_reg_dmabuf_mr");
    } else if (maco__cu()->cuMemGetHandleForAddressRange == NULL) {
        snprintf(why, cap, "the CUDA driver has no cuMemGetHandleForAddressRange");
    } else {
        int fd = -1;
        CUresult res = maco__cu()->cuMemGetHandleForAddressRange(
            &fd, (CUdeviceptr)start, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (res != CUDA_SUCCESS) {
            char txt[160];
            snprintf(why, cap, "cuMemGetHandleForAddressRange: %s",
                     maco__cu_error_text(res, txt, sizeof(txt)));
        } else {
            /* The MR's addresses are the GPU's virtual addresses (iova), as for host memory. */
            mr = v->reg_dmabuf_mr(t->pd, 0, len, (uint64_t)start, fd, MACO__IB_ACCESS);
            if (mr == NULL)
                snprintf(why, cap, "ibv_reg_dmabuf_mr: %s", strerror(errno));
            close(fd);
        }
    }
    if (mr == NULL) {
        mr = v->reg_mr(t->pd, (void *)start, len, MACO__IB_ACCESS);
        if (mr == NULL) {
            size_t used = strlen(why);
            snprintf(why + used, cap - used, "; ibv_reg_mr (nvidia-peermem): %s", strerror(errno));
        }
    }
    return mr;
}

/* The memory region over the allocation holding [addr, addr + bytes): cached, one more ref. */
static maco_status_t maco__ib_mr_get(maco__ib_state_t *t, uint64_t addr, uint64_t bytes,
                                     const char *what, maco__ib_mr_t **mr_p)
{
    maco__mem_region_t r;
    maco_status_t st = maco__mem_lookup(addr, bytes, &r);
    if (st != MACO_OK)
        return st;
    for (maco__ib_mr_t *m = t->mrs; m != NULL; m = m->next) {
        if (m->base == r.base && m->bytes == r.bytes) {
            m->refs++;
            *mr_p = m;
            return MACO_OK;
        }
    }
    maco__ib_mr_t *m = (maco__ib_mr_t *)calloc(1, sizeof(*m));
    if (m == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
    char why[400] = "";
    if (r.is_host) {
        m->mr = t->v->reg_mr(t->pd, r.base, r.bytes, MACO__IB_ACCESS);
        if (m->mr == NULL)
            snprintf(why, sizeof(why), "ibv_reg_mr: %s", strerror(errno));
    } else {
        m->mr = maco__ib_reg_gpu(t, r.base, r.bytes, why, sizeof(why));
    }
    if (m->mr == NULL) {
        free(m);
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                           "IB transport: registering the %s (%s memory at %p, %zu bytes) with %s "
                           "failed: %s",
                           what, r.is_host ? "host" : "GPU", (void *)r.base, r.bytes, t->dev, why);
    }
    m->base = r.base;
    m->bytes = r.bytes;
    m->is_host = r.is_host;
    m->refs = 1;
    m->next = t->mrs;
    t->mrs = m;
    *mr_p = m;
    return MACO_OK;
}

static void maco__ib_mr_put(maco__ib_state_t *t, maco__ib_mr_t *m)
{
    if (m == NULL || --m->refs > 0)
        return;
    for (maco__ib_mr_t **pp = &t->mrs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    t->v->dereg_mr(m->mr);
    free(m);
}

/* ------------------------------------------------------------------ connections */

static void maco__ib_conn_free(maco__ib_state_t *t, maco__ib_conn_t *c)
{
    if (c == NULL)
        return;
    if (c->qp != NULL)
        t->v->destroy_qp(c->qp);
    if (c->cq != NULL)
        t->v->destroy_cq(c->cq);
    if (c->slots_mr != NULL)
        t->v->dereg_mr(c->slots_mr);
    free(c->slots);
    free(c->ops);
    free(c);
}

/* A new connection's CQ, QP (INIT) and signal slots. */
static maco_status_t maco__ib_conn_create(struct maco_port_channel *ch, maco__ib_state_t *t,
                                          maco__ib_conn_t **c_p)
{
    const maco__ibv_table_t *v = t->v;
    maco__ib_conn_t *c = (maco__ib_conn_t *)calloc(1, sizeof(*c));
    if (c == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
    c->peer = ch->peer;
    c->peer_uid = ch->peer_proxy_uid;
    c->depth = t->depth;
    for (c->cap = 1; c->cap < 2u * t->depth;)
        c->cap *= 2;
    c->ops = (maco__ib_op_t *)calloc(c->cap, sizeof(*c->ops));
    c->slots = (uint64_t *)calloc(c->depth, sizeof(uint64_t));
    maco_status_t st = MACO_OK;
    if (c->ops == NULL || c->slots == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
        goto fail;
    }
    c->cq = v->create_cq(t->ctx, (int)c->depth, NULL, NULL, 0);
    if (c->cq == NULL) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                         "IB transport: ibv_create_cq (%u entries) on %s failed: %s", c->depth,
                         t->dev, strerror(errno));
        goto fail;
    }
    struct ibv_qp_init_attr qa;
    for (int inl = MACO__IB_INLINE; c->qp == NULL && inl >= 0; inl = inl > 0 ? 0 : -1) {
        memset(&qa, 0, sizeof(qa));
        qa.send_cq = c->cq;
        qa.recv_cq = c->cq;
        qa.qp_type = IBV_QPT_RC;
        qa.sq_sig_all = 0;
        qa.cap.max_send_wr = c->depth;
        qa.cap.max_recv_wr = 1;
        qa.cap.max_send_sge = 1;
        qa.cap.max_recv_sge = 1;
        qa.cap.max_inline_data = (uint32_t)inl;
        c->qp = v->create_qp(t->pd, &qa);
    }
    if (c->qp == NULL) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                         "IB transport: ibv_create_qp (RC, %u WRs) on %s for rank %d failed: %s",
                         c->depth, t->dev, ch->peer, strerror(errno));
        goto fail;
    }
    c->max_inline = qa.cap.max_inline_data;
    if (c->max_inline < sizeof(uint64_t)) {
        c->slots_mr =
            v->reg_mr(t->pd, c->slots, c->depth * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE);
        if (c->slots_mr == NULL) {
            st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                             "IB transport: registering signal slots on %s failed: %s", t->dev,
                             strerror(errno));
            goto fail;
        }
    }
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = t->port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    int err = v->modify_qp(c->qp, &a,
                           IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err != 0) {
        st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                         "IB transport: QP %u on %s to INIT failed: %s", c->qp->qp_num, t->dev,
                         strerror(err));
        goto fail;
    }
    *c_p = c;
    return MACO_OK;
fail:
    maco__ib_conn_free(t, c);
    return st;
}

/* Brings a new connection's QP to RTR and RTS with the peer's endpoint. */
static maco_status_t maco__ib_conn_rts(maco__ib_state_t *t, maco__ib_conn_t *c,
                                       const maco__ib_endpoint_t *theirs, uint32_t my_psn)
{
    const maco__ibv_table_t *v = t->v;
    uint8_t their_mtu = theirs->mtu;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)(their_mtu < t->mtu ? their_mtu : t->mtu);
    a.dest_qp_num = theirs->qpn;
    a.rq_psn = theirs->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = t->port;
    a.ah_attr.dlid = theirs->lid;
    a.ah_attr.sl = 0;
    if (theirs->gid_valid != 0 && t->gid_index >= 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, theirs->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)t->gid_index;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.flow_label = 0;
        a.ah_attr.grh.traffic_class = 0;
    }
    c->remote_qpn = a.dest_qp_num;
    int err = v->modify_qp(c->qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                           "IB transport: QP %u on %s to RTR (rank %d's QP %u) failed: %s",
                           c->qp->qp_num, t->dev, c->peer, c->remote_qpn, strerror(err));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = (uint8_t)t->timeout;
    a.retry_cnt = (uint8_t)t->retry_cnt;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 1;
    err = v->modify_qp(c->qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (err != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_PROXY,
                           "IB transport: QP %u on %s to RTS failed: %s", c->qp->qp_num, t->dev,
                           strerror(err));
    return MACO_OK;
}

static void maco__ib_channel_free(maco__ib_state_t *t, maco__ib_channel_t *cs)
{
    if (cs == NULL)
        return;
    maco__ib_mr_put(t, cs->src_mr);
    maco__ib_mr_put(t, cs->recv_mr);
    maco__ib_mr_put(t, cs->sem_mr);
    free(cs);
}

static maco_status_t maco__ib_connect(struct maco_port_channel *ch, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    struct maco_proxy *p = ch->proxy;
    int peer = ch->peer;
    maco__ib_conn_t *c = NULL;
    for (maco__ib_conn_t *it = t->conns; it != NULL; it = it->next)
        if (it->peer == peer && it->peer_uid == ch->peer_proxy_uid)
            c = it;
    int fresh = c == NULL;
    maco__ib_channel_t *cs = (maco__ib_channel_t *)calloc(1, sizeof(*cs));
    maco_status_t st =
        cs != NULL ? maco__ib_open(p, t)
                   : maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
    /* What this rank's memory regions cover: the source, what the peer writes here, the
     * semaphore its signals raise. */
    if (st == MACO_OK)
        st = maco__ib_mr_get(t, (uint64_t)(uintptr_t)ch->src, ch->src_bytes, "source buffer",
                             &cs->src_mr);
    if (st == MACO_OK)
        st = maco__ib_mr_get(t, (uint64_t)(uintptr_t)ch->recv, ch->recv_bytes,
                             "buffer the peer writes", &cs->recv_mr);
    uint64_t sem = (uint64_t)(uintptr_t)(ch->sem_host ? ch->inbound : ch->inbound_dev);
    if (st == MACO_OK && sem == 0)
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                         "IB transport: port channel %u to rank %d has no semaphore address "
                         "for the peer to write",
                         ch->id, peer);
    if (st == MACO_OK)
        st = maco__ib_mr_get(t, sem, sizeof(uint64_t), "semaphore", &cs->sem_mr);
    if (st == MACO_OK && fresh)
        st = maco__ib_conn_create(ch, t, &c);
    else if (st == MACO_OK && __atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                         "IB transport: the connection to rank %d failed earlier (QP %u; the "
                         "communicator's async error says why); no new channel on it",
                         peer, c->qp->qp_num);
    uint32_t psn = (uint32_t)maco__random_u64() & 0xffffffu;
    uint8_t mine[MACO__IB_ENDPOINT], theirs[MACO__IB_ENDPOINT];
    maco__ib_endpoint_t me, te;
    memset(&me, 0, sizeof(me));
    memset(theirs, 0, sizeof(theirs));
    me.flags = (uint16_t)((st == MACO_OK ? MACO__IB_FLAG_OK : 0) | (fresh ? MACO__IB_FLAG_NEW : 0));
    me.uid = p->uid;
    if (st == MACO_OK) {
        if (fresh) {
            me.qpn = c->qp->qp_num;
            me.psn = psn;
            me.lid = t->lid;
            me.link_layer = t->link_layer;
            me.mtu = t->mtu;
            me.gid_valid = t->gid_index >= 0;
            me.port = t->port;
            if (t->gid_index >= 0)
                memcpy(me.gid, t->gid.raw, 16);
        }
        me.recv_addr = (uint64_t)(uintptr_t)ch->recv;
        me.recv_bytes = ch->recv_bytes;
        me.recv_rkey = cs->recv_mr->mr->rkey;
        me.sem_rkey = cs->sem_mr->mr->rkey;
        me.sem_addr = sem;
        me.channel = ch->id;
    }
    maco__ib_endpoint_encode(mine, &me);
    /* Exchange even after a failure, so the peer fails now instead of at its deadline. */
    maco_status_t xst = maco__port_exchange(ch, mine, theirs, sizeof(mine));
    if (st == MACO_OK)
        st = xst;
    int foreign = maco__ib_endpoint_decode(theirs, &te) != 0;
    uint16_t flags = te.flags;
    if (st == MACO_OK && foreign)
        st = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d sent an endpoint with magic 0x%08x version %u "
                         "(expected 0x%08x version %u): different MACO builds?",
                         peer, maco__get_u32(theirs), maco__get_u16(theirs + 4), MACO__IB_MAGIC,
                         MACO__IB_VERSION);
    else if (st == MACO_OK && !(flags & MACO__IB_FLAG_OK))
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d could not set up its side of port channel %u "
                         "(its log says why)",
                         peer, ch->id);
    else if (st == MACO_OK && (!(flags & MACO__IB_FLAG_NEW)) != !fresh)
        st = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d %s a queue pair with this proxy, this rank %s",
                         peer, fresh ? "has" : "has no", fresh ? "has none" : "has one");
    else if (st == MACO_OK && (te.uid != ch->peer_proxy_uid || te.recv_addr != ch->dst_addr ||
                               te.recv_bytes != ch->dst_bytes))
        st = maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d's endpoint names another proxy or destination "
                         "than its channel hello did",
                         peer);
    else if (st == MACO_OK && fresh && !maco__ib_endpoint_port_ok(&te, t->link_layer))
        st = maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                         "IB transport: rank %d's port (link layer %u, MTU code %u, %s GID) "
                         "cannot reach this rank's %s port %u (link layer %u): both must be "
                         "InfiniBand, or both Ethernet with a GID",
                         peer, te.link_layer, te.mtu, te.gid_valid ? "with a" : "without", t->dev,
                         t->port, t->link_layer);
    /* A new connection: both QPs to RTS, then both say so, so that no write reaches a QP not
     * ready for it. Both ranks decide from the two endpoints alone whether this second
     * exchange happens (each sent "ready" and "new"), so neither waits for one that never
     * comes; what fails after the first exchange travels in it. */
    uint16_t mine_flags = me.flags;
    int handshake = xst == MACO_OK && (mine_flags & MACO__IB_FLAG_OK) &&
                    (mine_flags & MACO__IB_FLAG_NEW) && (flags & MACO__IB_FLAG_OK) &&
                    (flags & MACO__IB_FLAG_NEW);
    if (handshake) {
        if (st == MACO_OK)
            st = maco__ib_conn_rts(t, c, &te, psn);
        uint8_t ready[MACO__IB_READY], their_ready[MACO__IB_READY];
        memset(their_ready, 0, sizeof(their_ready));
        maco__ib_ready_encode(ready, st == MACO_OK);
        maco_status_t rst = maco__port_exchange(ch, ready, their_ready, sizeof(ready));
        if (st == MACO_OK && rst != MACO_OK)
            st = rst;
        else if (st == MACO_OK && !maco__ib_ready_ok(their_ready))
            st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                             "IB transport: rank %d could not bring its queue pair to RTS (its "
                             "log says why)",
                             peer);
    }
    if (st != MACO_OK) {
        if (fresh)
            maco__ib_conn_free(t, c);
        maco__ib_channel_free(t, cs);
        return st;
    }
    cs->conn = c;
    cs->dst_rkey = te.recv_rkey;
    cs->sem_rkey = te.sem_rkey;
    cs->sem_addr = te.sem_addr;
    if (fresh) {
        c->next = t->conns;
        __atomic_store_n(&t->conns, c, __ATOMIC_RELEASE); /* the proxy thread picks it up */
        MACO_INFO(MACO_SUBSYS_PROXY,
                  "IB transport: rank %d connected to rank %d: %s port %u QP %u <-> QP %u (%u "
                  "WRs, %u inline bytes)",
                  p->comm->rank, peer, t->dev, t->port, c->qp->qp_num, c->remote_qpn, c->depth,
                  c->max_inline);
    }
    ch->tp = cs;
    return MACO_OK;
}

static void maco__ib_disconnect(struct maco_port_channel *ch, void *state)
{
    maco__ib_channel_free((maco__ib_state_t *)state, (maco__ib_channel_t *)ch->tp);
    ch->tp = NULL;
}

static void maco__ib_proxy_teardown(struct maco_proxy *p, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    if (t == NULL)
        return;
    for (maco__ib_conn_t *c = t->conns; c != NULL;) {
        maco__ib_conn_t *next = c->next;
        maco__ib_conn_free(t, c);
        c = next;
    }
    while (t->mrs != NULL) {
        maco__ib_mr_t *m = t->mrs;
        t->mrs = m->next;
        t->v->dereg_mr(m->mr);
        free(m);
    }
    if (t->pd != NULL)
        t->v->dealloc_pd(t->pd);
    if (t->ctx != NULL)
        t->v->close_device(t->ctx);
    free(t->wrs);
    free(t->sges);
    free(t);
}

/* ------------------------------------------------------------------ failures */

static void maco__ib_fail(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c,
                          const char *what)
{
    if (c->failed)
        return;
    /* The async error first, then `failed`, so a host flush that sees the connection failed
     * (maco__ib_alive) also finds the communicator's async error set. */
    maco__proxy_fail(p, maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                                    "IB transport: the connection to rank %d (%s port %u, QP %u "
                                    "-> rank %d's QP %u) failed: %s; its channels are dead",
                                    c->peer, t->dev, t->port, c->qp->qp_num, c->peer, c->remote_qpn,
                                    what));
    __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE); /* read by maco__ib_alive */
}

/* ------------------------------------------------------------------ puts and signals */

/* Queues an operation (proxy thread); the ring grows when full. */
static maco_status_t maco__ib_queue(struct maco_port_channel *ch, maco__ib_state_t *t,
                                    maco__ib_op_t *op)
{
    maco__ib_conn_t *c = ((maco__ib_channel_t *)ch->tp)->conn;
    if (__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE))
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_PROXY,
                           "port channel %u: the IB connection to rank %d failed earlier", ch->id,
                           ch->peer);
    if (c->head - c->tail == c->cap) {
        uint64_t cap = 2 * c->cap;
        maco__ib_op_t *ops = (maco__ib_op_t *)malloc(cap * sizeof(*ops));
        if (ops == NULL)
            return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_PROXY, "IB transport: no memory");
        for (uint64_t i = c->tail; i < c->head; i++)
            ops[i & (cap - 1)] = c->ops[i & (c->cap - 1)];
        free(c->ops);
        c->ops = ops;
        c->cap = cap;
    }
    op->seq = ++t->seq;
    c->ops[c->head & (c->cap - 1)] = *op;
    c->head++;
    return MACO_OK;
}

static maco_status_t maco__ib_put(struct maco_port_channel *ch, void *state, uint64_t dst_offset,
                                  uint64_t src_offset, uint64_t bytes)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    maco__ib_channel_t *cs = (maco__ib_channel_t *)ch->tp;
    maco_status_t st = MACO_OK;
    while (bytes > 0 && st == MACO_OK) {
        uint64_t n = bytes < t->max_msg ? bytes : t->max_msg;
        maco__ib_op_t op;
        memset(&op, 0, sizeof(op));
        op.kind = MACO__IB_OP_PUT;
        op.laddr = (uint64_t)(uintptr_t)(ch->src + src_offset);
        op.lkey = cs->src_mr->mr->lkey;
        op.raddr = ch->dst_addr + dst_offset;
        op.rkey = cs->dst_rkey;
        op.bytes = (uint32_t)n;
        op.host_src = (uint8_t)ch->src_host;
        st = maco__ib_queue(ch, t, &op);
        bytes -= n;
        src_offset += n;
        dst_offset += n;
    }
    return st;
}

static maco_status_t maco__ib_signal(struct maco_port_channel *ch, void *state)
{
    maco__ib_channel_t *cs = (maco__ib_channel_t *)ch->tp;
    maco__ib_op_t op;
    memset(&op, 0, sizeof(op));
    op.kind = MACO__IB_OP_SIGNAL;
    op.value = ch->signals_sent + 1;
    op.raddr = cs->sem_addr;
    op.rkey = cs->sem_rkey;
    op.bytes = sizeof(uint64_t);
    maco_status_t st = maco__ib_queue(ch, (maco__ib_state_t *)state, &op);
    if (st == MACO_OK)
        ch->signals_sent++;
    return st;
}

/* ------------------------------------------------------------------ progress, flushes */

/* Polls the connection's completions. Returns how many. */
static int maco__ib_poll(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c)
{
    struct ibv_wc wc[MACO__IB_POLL];
    int n = ibv_poll_cq(c->cq, MACO__IB_POLL, wc);
    if (n < 0) {
        maco__ib_fail(p, t, c, "ibv_poll_cq failed");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) {
            char what[256];
            snprintf(what, sizeof(what),
                     "a write completed with status %s (%d, vendor error 0x%x)%s",
                     t->v->wc_status_str(wc[i].status), (int)wc[i].status, wc[i].vendor_err,
                     wc[i].status == IBV_WC_RETRY_EXC_ERR
                         ? ": the peer did not answer within the QP's retries (gone, or "
                           "unreachable)"
                         : "");
            maco__ib_fail(p, t, c, what);
            return i;
        }
        /* In order on an RC send queue: everything up to this WR has completed. */
        if (wc[i].wr_id + 1 > c->tail && wc[i].wr_id < c->posted)
            c->tail = wc[i].wr_id + 1;
    }
    return n;
}

/* Posts what waits, as far as the send queue has room, with one ibv_post_send. Returns how
 * many WRs. */
static int maco__ib_post(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c)
{
    uint64_t room = c->depth - (c->posted - c->tail);
    uint64_t waiting = c->head - c->posted;
    uint64_t k = room < waiting ? room : waiting;
    if (k == 0)
        return 0;
    for (uint64_t j = 0; j < k; j++) {
        uint64_t idx = c->posted + j;
        maco__ib_op_t *o = &c->ops[idx & (c->cap - 1)];
        struct ibv_send_wr *wr = &t->wrs[j];
        struct ibv_sge *sge = &t->sges[j];
        memset(wr, 0, sizeof(*wr));
        wr->wr_id = idx;
        wr->opcode = IBV_WR_RDMA_WRITE;
        wr->sg_list = sge;
        wr->num_sge = 1;
        wr->wr.rdma.remote_addr = o->raddr;
        wr->wr.rdma.rkey = o->rkey;
        sge->length = o->bytes;
        if (o->kind == MACO__IB_OP_SIGNAL) {
            if (c->max_inline >= sizeof(uint64_t)) {
                sge->addr = (uint64_t)(uintptr_t)&o->value; /* copied by the post */
                sge->lkey = 0;
                wr->send_flags |= IBV_SEND_INLINE;
            } else {
                uint64_t *slot = &c->slots[idx % c->depth]; /* free: its last WR completed */
                *slot = o->value;
                sge->addr = (uint64_t)(uintptr_t)slot;
                sge->lkey = c->slots_mr->lkey;
            }
        } else {
            sge->addr = o->laddr;
            sge->lkey = o->lkey;
            if (o->host_src && o->bytes <= c->max_inline)
                wr->send_flags |= IBV_SEND_INLINE;
        }
        int last = j + 1 == k;
        if ((idx + 1) % MACO__IB_SIGNAL_EVERY == 0 || idx + 1 == c->signal_at ||
            (last && idx + 1 == c->head))
            wr->send_flags |= IBV_SEND_SIGNALED;
        wr->next = last ? NULL : &t->wrs[j + 1];
    }
    struct ibv_send_wr *bad = NULL;
    int err = ibv_post_send(c->qp, &t->wrs[0], &bad);
    if (err != 0) {
        uint64_t ok =
            bad != NULL && bad >= t->wrs && bad < t->wrs + k ? (uint64_t)(bad - t->wrs) : 0;
        c->posted += ok;
        char what[200];
        snprintf(what, sizeof(what), "ibv_post_send of %llu WRs failed at WR %llu: %s",
                 (unsigned long long)k, (unsigned long long)ok, strerror(err));
        maco__ib_fail(p, t, c, what);
        return (int)ok;
    }
    c->posted += k;
    return (int)k;
}

/*
 * Posted work that has seen no completion for MACO__IB_STALL_MS: once every 500 ms, looks at the
 * peer's bootstrap link. A peer whose process is gone cannot answer, so the connection fails
 * now, naming it, instead of when the QP's retries run out (which some providers never do
 * with retry_cnt 7). Nothing is looked at while no work is in flight: a peer that left after
 * everything completed is no error.
 */
static void maco__ib_check_stall(struct maco_proxy *p, maco__ib_state_t *t, maco__ib_conn_t *c)
{
    int64_t now = maco__now_ms();
    if (now - c->moved_ms < MACO__IB_STALL_MS || now < c->next_look_ms)
        return;
    c->next_look_ms = now + 500;
    if (maco__bootstrap_peer_alive(p->comm->bs, c->peer) == MACO_OK)
        return;
    char what[640];
    snprintf(what, sizeof(what),
             "%llu write(s) in flight without a completion for %lld ms, and rank %d's process is "
             "gone (%s)",
             (unsigned long long)(c->posted - c->tail), (long long)(now - c->moved_ms), c->peer,
             maco__last_error());
    maco__ib_fail(p, t, c, what);
}

static int maco__ib_progress(struct maco_proxy *p, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    int work = 0;
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL;
         c = c->next) {
        if (c->failed || c->tail == c->head)
            continue;
        int idle = c->tail == c->posted;
        if (!idle) {
            int n = maco__ib_poll(p, t, c);
            work += n;
            if (n > 0 || c->failed)
                c->moved_ms = maco__now_ms();
            else
                maco__ib_check_stall(p, t, c);
        }
        if (!c->failed) {
            int n = maco__ib_post(p, t, c);
            work += n;
            if (n > 0 && idle)
                c->moved_ms = maco__now_ms();
        }
    }
    return work;
}

static maco_status_t maco__ib_mark(struct maco_proxy *p, void *state, uint64_t *marker_p)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    /* The newest operation of each connection that still waits gets a signalled WR, so the
     * flush does not wait for the next MACO__IB_SIGNAL_EVERY. */
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL; c = c->next)
        if (c->head > c->posted)
            c->signal_at = c->head;
    *marker_p = t->seq;
    return MACO_OK;
}

static int maco__ib_marker_done(struct maco_proxy *p, void *state, uint64_t marker)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL;
         c = c->next) {
        if (c->failed || c->tail == c->head)
            continue; /* failed: the async error says why; the flush must not wait forever */
        if (c->ops[c->tail & (c->cap - 1)].seq <= marker)
            return 0;
    }
    return 1;
}

static int maco__ib_outstanding(struct maco_proxy *p, void *state)
{
    maco__ib_state_t *t = (maco__ib_state_t *)state;
    for (maco__ib_conn_t *c = __atomic_load_n(&t->conns, __ATOMIC_ACQUIRE); c != NULL; c = c->next)
        if (!c->failed && c->tail != c->head)
            return 1;
    return 0;
}

static int maco__ib_alive(struct maco_port_channel *ch, void *state)
{
    maco__ib_channel_t *cs = (maco__ib_channel_t *)ch->tp;
    return cs == NULL || cs->conn == NULL || !__atomic_load_n(&cs->conn->failed, __ATOMIC_ACQUIRE);
}

const maco__transport_ops_t maco__transport_ib_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "IB verbs",
    .available = maco__ib_available,
    .proxy_setup = maco__ib_proxy_setup,
    .proxy_teardown = maco__ib_proxy_teardown,
    .connect = maco__ib_connect,
    .disconnect = maco__ib_disconnect,
    .put = maco__ib_put,
    .signal = maco__ib_signal,
    .mark = maco__ib_mark,
    .marker_done = maco__ib_marker_done,
    .progress = maco__ib_progress,
    .outstanding = maco__ib_outstanding,
    .alive = maco__ib_alive,
};

#endif /* MACO_HAVE_IBVERBS */
