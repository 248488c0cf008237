/*
 * ib_device.c - the IB verbs transport: which device port a proxy uses (MACO_IB_HCA,
 * else the nearest ACTIVE one in the PCI tree), its GID, the proxy's state and opening the
 * port (transport_ib.c has the design).
 */
#include "proxy/transport/ib/ib_internal.h"

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

int maco__ib_available(maco_comm_t comm, int peer, char *why, size_t cap)
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

maco_status_t maco__ib_proxy_setup(struct maco_proxy *p, void **state_p)
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
maco_status_t maco__ib_open(struct maco_proxy *p, maco__ib_state_t *t)
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
