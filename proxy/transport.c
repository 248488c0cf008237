/*
 * transport.c - the table of transports: each one's ops completed with defaults (transport.h),
 * their names, and the bootstrap exchange their connect steps use. The only file that names
 * every transport; the proxy reaches them through it.
 */
#include <pthread.h>
#include <string.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/base/log.h"
#include "proxy/proxy_internal.h"

/* Each transport's own table (transport_<name>.c). */
extern const maco__transport_ops_t maco__transport_cuda_ops;
extern const maco__transport_ops_t maco__transport_host_ops;
extern const maco__transport_ops_t maco__transport_ib_ops;
extern const maco__transport_ops_t maco__transport_tcp_ops;

/* ------------------------------------------------------------------ defaults */

static int maco__default_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    return 1;
}

static maco_status_t maco__default_proxy_setup(struct maco_proxy *p, void **state_p)
{
    *state_p = NULL;
    return MACO_OK;
}

static void maco__default_proxy_teardown(struct maco_proxy *p, void *state) {}

static maco_status_t maco__default_connect(struct maco_port_channel *ch, void *state)
{
    return MACO_OK;
}

static void maco__default_disconnect(struct maco_port_channel *ch, void *state) {}

static maco_status_t maco__default_put(struct maco_port_channel *ch, void *state,
                                       uint64_t dst_offset, uint64_t src_offset, uint64_t bytes)
{
    return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                       "port channel %u to rank %d: the %s transport carries no puts", ch->id,
                       ch->peer, ch->ops->name);
}

static maco_status_t maco__default_put_value(struct maco_port_channel *ch, void *state,
                                             uint64_t dst_offset, uint64_t value, uint32_t bytes,
                                             int with_signal)
{
    return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_PROXY,
                       "port channel %u to rank %d: an inline put on the %s transport, which "
                       "takes none (a corrupt trigger); skipped",
                       ch->id, ch->peer, ch->ops->name);
}

static maco_status_t maco__default_signal(struct maco_port_channel *ch, void *state)
{
    return maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_PROXY,
                       "port channel %u to rank %d: the %s transport carries no signals", ch->id,
                       ch->peer, ch->ops->name);
}

static maco_status_t maco__default_mark(struct maco_proxy *p, void *state, uint64_t *marker_p)
{
    *marker_p = 0;
    return MACO_OK;
}

static int maco__default_marker_done(struct maco_proxy *p, void *state, uint64_t marker)
{
    return 1;
}

static void maco__default_marker_free(struct maco_proxy *p, void *state, uint64_t marker) {}

static int maco__default_progress(struct maco_proxy *p, void *state)
{
    return 0;
}

static int maco__default_outstanding(struct maco_proxy *p, void *state)
{
    return 0;
}

static int maco__default_alive(struct maco_port_channel *ch, void *state)
{
    return 1;
}

static const maco__transport_ops_t maco__default_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "(none)",
    .available = maco__default_available,
    .proxy_setup = maco__default_proxy_setup,
    .proxy_teardown = maco__default_proxy_teardown,
    .connect = maco__default_connect,
    .disconnect = maco__default_disconnect,
    .put = maco__default_put,
    .put_value = maco__default_put_value,
    .signal = maco__default_signal,
    .mark = maco__default_mark,
    .marker_done = maco__default_marker_done,
    .marker_free = maco__default_marker_free,
    .progress = maco__default_progress,
    .outstanding = maco__default_outstanding,
    .alive = maco__default_alive,
};

/* ------------------------------------------------------------------ the table */

static maco__transport_ops_t maco__complete[MACO__TRANSPORT_SLOTS];
static pthread_once_t maco__complete_once = PTHREAD_ONCE_INIT;

/* Copies each operation the transport fills over the defaults (every op of the table is a
 * function pointer after `size` and `name`, so a table from a file built with fewer ops
 * fills only what its `size` covers). */
#define MACO__FILL(field)                                                                          \
    if (offsetof(maco__transport_ops_t, field) + sizeof(out->field) <= own->size && own->field)    \
    out->field = own->field

static void maco__transport_complete(const maco__transport_ops_t *own, maco__transport_ops_t *out)
{
    *out = maco__default_ops;
    out->name = own->name;
    MACO__FILL(available);
    MACO__FILL(proxy_setup);
    MACO__FILL(proxy_teardown);
    MACO__FILL(connect);
    MACO__FILL(disconnect);
    MACO__FILL(put);
    MACO__FILL(put_value);
    MACO__FILL(signal);
    MACO__FILL(mark);
    MACO__FILL(marker_done);
    MACO__FILL(marker_free);
    MACO__FILL(progress);
    MACO__FILL(outstanding);
    MACO__FILL(alive);
}

static void maco__transport_init(void)
{
    maco__transport_complete(&maco__transport_cuda_ops, &maco__complete[MACO_TRANSPORT_CUDA_COPY]);
    maco__transport_complete(&maco__transport_host_ops,
                             &maco__complete[MACO_TRANSPORT_HOST_MEMORY]);
    maco__transport_complete(&maco__transport_ib_ops, &maco__complete[MACO_TRANSPORT_IB]);
    maco__transport_complete(&maco__transport_tcp_ops, &maco__complete[MACO_TRANSPORT_TCP]);
}

const maco__transport_ops_t *maco__transport_ops(maco_transport_t id)
{
    if ((int)id < MACO_TRANSPORT_CUDA_COPY || (int)id >= MACO__TRANSPORT_SLOTS)
        return NULL;
    pthread_once(&maco__complete_once, maco__transport_init);
    return &maco__complete[id];
}

int maco__transport_polls(maco_transport_t id)
{
    const maco__transport_ops_t *ops = maco__transport_ops(id);
    return ops != NULL && ops->progress != maco__default_progress;
}

const char *maco__transport_word(maco_transport_t id)
{
    switch (id) {
    case MACO_TRANSPORT_AUTO:
        return "auto";
    case MACO_TRANSPORT_CUDA_COPY:
        return "cuda";
    case MACO_TRANSPORT_HOST_MEMORY:
        return "host";
    case MACO_TRANSPORT_IB:
        return "ib";
    case MACO_TRANSPORT_TCP:
        return "tcp";
    }
    return "?";
}
