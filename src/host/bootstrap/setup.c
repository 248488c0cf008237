/* setup.c - the setup protocol (bootstrap_private.h, top): hellos, rank 0 accepting and
 * checking every rank, the table of addresses, the mesh of links, and setup errors told to
 * every rank. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

/* A connection accepted during setup whose handshake is still under way. */
typedef struct maco__pending {
    int fd;
    int64_t since_ms;
    maco__sockaddr_t from;
    maco__hs_server_t hs;
} maco__pending_t;

static maco_status_t maco__send_setup_frame(int fd, uint16_t kind, const void *payload, size_t len,
                                            int64_t deadline, const char *what);

/* Rank 0: sends the setup error `text` to a connection that presented a hello as `rank`
 * (bounded: a rank that does not read it gets its connection closed). */
static void maco__tell_setup_error(int fd, const char *text, int rank)
{
    char what[32];
    if (rank >= 0)
        snprintf(what, sizeof(what), "rank %d", rank);
    else
        snprintf(what, sizeof(what), "a process of another MACO");
    maco__send_setup_frame(fd, MACO__FRAME_INIT_ERROR, text, strlen(text), maco__deadline_ms(500),
                           what);
}

/*
 * Accepts connections on bs->listen_fd until every rank in `expect` (a bitmap over ranks,
 * cleared as they arrive) has presented a valid hello of `kind`. For each, `on_hello` is
 * called; a non-OK return fails setup. Strays are refused with a warning.
 */
typedef maco_status_t (*maco__on_hello_t)(maco_bootstrap_t bs, int rank, int fd,
                                          const uint8_t *hello, const maco__sockaddr_t *from);

/* The state of one maco__accept_ranks call. */
typedef struct maco__accept {
    maco_bootstrap_t bs;
    uint16_t kind;
    char *expect; /* a bitmap over ranks, cleared as they arrive */
    int nexpect;
    int64_t deadline;
    maco__on_hello_t on_hello;
    /* This rank's own handshakes still under way on links it opened (out[r] for those ranks,
     * NULL when none), advanced as their answers arrive, and how many are not done. */
    maco__hs_client_t *out;
    int nout;
    /* Connections that have not said hello yet, and what poll watches ([0] the listener, then
     * pend's, then the established links; pfd_rank: -1, -2 - pending index, or the rank). */
    maco__pending_t *pend;
    int npend;
    struct pollfd *pfds;
    int *pfd_rank;
    /* Rank 0 only: which ranks were told a job error (told[r]), and until when it lingers. */
    char job_error[MACO__ABORT_TEXT_BYTES];
    maco_status_t job_status;
    char *told;
    int ntold;
    /* Processes that claim a bigger world than rank 0's (a world-size mismatch) are told too:
     * `world` is the biggest world size any hello claimed, `ntold_beyond` how many of the
     * processes with ranks past rank 0's world were told. Linger bounds the wait for them. */
    int64_t world, ntold_beyond;
    int64_t linger_until;
} maco__accept_t;

/* The deadline passed: the error naming the ranks that have not said hello yet. */
static maco_status_t maco__accept_timed_out(const maco__accept_t *ac)
{
    maco_bootstrap_t bs = ac->bs;
    char missing[256] = "";
    size_t used = 0;
    int listed = 0;
    for (int r = 0; r < bs->nranks && used + 16 < sizeof(missing); r++) {
        if (!ac->expect[r])
            continue;
        if (listed++ == 16) {
            used += (size_t)snprintf(missing + used, sizeof(missing) - used, " ...");
            break;
        }
        used += (size_t)snprintf(missing + used, sizeof(missing) - used, " %d", r);
    }
    for (int r = 0; ac->nexpect == 0 && ac->out != NULL && r < bs->nranks; r++)
        if (ac->out[r].who[0] != '\0' && !ac->out[r].done)
            return maco__handshake_timed_out(&ac->out[r]);
    return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                       "rank %d: setup timed out after %lld ms: no valid hello yet from %d "
                       "rank(s):%s (MACO_BOOTSTRAP_TIMEOUT sets the deadline)",
                       bs->rank, (long long)bs->timeout_ms, ac->nexpect, missing);
}

/* Polls the listener, the pending connections and the established links (at most 200 ms);
 * returns how many descriptors it watched. A failed poll sets *st. */
static int maco__accept_poll(maco__accept_t *ac, int64_t now, maco_status_t *st)
{
    maco_bootstrap_t bs = ac->bs;
    struct pollfd *pfds = ac->pfds;
    int *pfd_rank = ac->pfd_rank;
    int n = 0;
    pfds[n].fd = bs->listen_fd;
    pfds[n].events = POLLIN;
    pfd_rank[n++] = -1;
    for (int i = 0; i < ac->npend; i++) {
        pfds[n].fd = ac->pend[i].fd;
        pfds[n].events = POLLIN;
        pfd_rank[n++] = -2 - i;
    }
    /* Watch established links too: a peer dying during setup fails it at once. */
    for (int r = 0; r < bs->nranks; r++) {
        if (r != bs->rank && bs->peers[r].fd >= 0) {
            pfds[n].fd = bs->peers[r].fd;
            pfds[n].events = POLLIN;
            pfd_rank[n++] = r;
        }
    }
    int64_t left = ac->deadline - now;
    int rc = poll(pfds, (nfds_t)n, (int)(left > 200 ? 200 : left));
    if (rc < 0 && errno != EINTR)
        *st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "poll: %s", strerror(errno));
    return n;
}

/* Established links: on one whose handshake this rank started, the answer arrived (advanced);
 * on the others any readable event now is a closed connection or an error report from rank 0
 * (after a job error they close as told: not a new failure). */
static maco_status_t maco__accept_check_links(maco__accept_t *ac, int n)
{
    maco_bootstrap_t bs = ac->bs;
    maco_status_t st = MACO_OK;
    for (int i = 0; i < n && st == MACO_OK && ac->job_error[0] == '\0'; i++) {
        if (ac->pfd_rank[i] < 0 || ac->pfds[i].revents == 0)
            continue;
        int r = ac->pfd_rank[i];
        if (ac->out != NULL && ac->out[r].who[0] != '\0' && !ac->out[r].done) {
            st = maco__handshake_advance(&ac->out[r], bs->peers[r].fd, ac->deadline);
            if (st == MACO_OK && ac->out[r].done)
                ac->nout--;
            continue;
        }
        char c;
        ssize_t got = recv(bs->peers[r].fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                             "rank %d: rank %d closed its connection during setup (did it "
                             "fail or crash?)",
                             bs->rank, r);
    }
    return st;
}

/* A bootstrap made by a shrink: a rank still awaited whose process is known gone (its link
 * in the shrunk bootstrap ended) fails setup now instead of at the deadline. */
static maco_status_t maco__accept_check_watch(const maco__accept_t *ac)
{
    maco_bootstrap_t bs = ac->bs;
    if (bs->watch_gone == NULL || ac->job_error[0] != '\0')
        return MACO_OK;
    for (int r = 0; r < bs->nranks; r++) {
        /* Awaited: its hello, or its answer to this rank's own hello. */
        int awaited =
            ac->expect[r] || (ac->out != NULL && ac->out[r].who[0] != '\0' && !ac->out[r].done);
        if (awaited && bs->watch_gone(bs->watch_ctx, r))
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                               "rank %d: stopped waiting for rank %d of the new communicator: it "
                               "is gone (its process ended) or gave up this setup",
                               bs->rank, r);
    }
    return MACO_OK;
}

/* Rank 0 tells the process on `fd` (its hello said `rank`) the job error, and counts it. */
static void maco__accept_tell(maco__accept_t *ac, int fd, int rank)
{
    maco_bootstrap_t bs = ac->bs;
    maco__tell_setup_error(fd, ac->job_error, rank);
    if (rank > 0 && rank < bs->nranks && !ac->told[rank]) {
        ac->told[rank] = 1;
        ac->ntold++;
    } else if (rank >= bs->nranks) {
        ac->ntold_beyond++; /* told, it gives up: it does not come again */
    }
}

/* A complete hello of this job from pending connection `pc` (from `from`): the rank joins
 * (on_hello), or the job fails, and then the offender, every rank that joined, and every rank
 * that still arrives (for a while) is told, so none is left waiting for its deadline or
 * reading a reset connection. */
static maco_status_t maco__accept_hello(maco__accept_t *ac, maco__pending_t *pc, const char *from)
{
    maco_bootstrap_t bs = ac->bs;
    maco_status_t st = MACO_OK;
    int rank = (int)maco__get_u32(pc->hs.hello + 8);
    int nranks = (int)maco__get_u32(pc->hs.hello + 12);
    if (nranks > ac->world)
        ac->world = nranks;
    if (ac->job_error[0] != '\0') {
        /* Setup already failed: tell this newcomer why. */
        maco__accept_tell(ac, pc->fd, rank);
    } else if (nranks != bs->nranks) {
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                         "world size mismatch: rank %d was started with %d "
                         "ranks but rank %d (from %s) with %d",
                         bs->rank, bs->nranks, rank, from, nranks);
    } else if (rank < 0 || rank >= bs->nranks) {
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                         "a process at %s joined as rank %d, outside [0, %d)", from, rank,
                         bs->nranks);
    } else if (!ac->expect[rank]) {
        st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                         "rank %d joined twice (again from %s): two processes "
                         "were given the same rank",
                         rank, from);
    } else {
        st = ac->on_hello(bs, rank, pc->fd, pc->hs.hello, &pc->from);
        if (st == MACO_OK) {
            ac->expect[rank] = 0;
            ac->nexpect--;
            pc->fd = -1; /* now owned by the peer table */
        }
    }
    if (st != MACO_OK && ac->told != NULL && ac->job_error[0] == '\0' &&
        st == MACO_ERR_INVALID_ARGUMENT) {
        /* A job error: told to the offender, every rank that joined and every later one. */
        snprintf(ac->job_error, sizeof(ac->job_error), "%s", maco__last_error());
        ac->job_status = st;
        st = MACO_OK;
        maco__accept_tell(ac, pc->fd, rank);
        for (int r = 1; r < bs->nranks; r++) {
            if (bs->peers[r].fd >= 0) {
                maco__tell_setup_error(bs->peers[r].fd, ac->job_error, r);
                if (!ac->told[r]) {
                    ac->told[r] = 1;
                    ac->ntold++;
                }
            }
        }
        ac->linger_until = maco__deadline_ms(MACO__ERROR_LINGER_MS);
        if (ac->linger_until > ac->deadline)
            ac->linger_until = ac->deadline;
    }
    return st;
}

/* Why the handshake of a pending connection from `from` ended without a rank (a warning), and
 * for a process of MACO's setup wire version 1 an INIT_ERROR it reads, so that it fails now
 * rather than at its deadline. */
static void maco__accept_refuse(maco__accept_t *ac, maco__pending_t *pc, int why, const char *from)
{
    int rank = ac->bs->rank;
    switch (why) {
    case MACO__HS_CLOSED:
        MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                  "rank %d: a connection from %s closed before the end of the setup "
                  "handshake; ignored",
                  rank, from);
        break;
    case MACO__HS_NOT_MACO:
        MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                  "rank %d: refused a connection from %s: it did not present MACO's magic (a "
                  "port scanner or another program?)",
                  rank, from);
        break;
    case MACO__HS_OLD_VERSION:
        MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                  "rank %d: refused a connection from %s: it runs MACO setup wire version 1; "
                  "this rank runs version %u",
                  rank, from, MACO__HELLO_VERSION);
        maco__tell_setup_error(pc->fd,
                               "it runs a newer MACO (setup wire version 2, which proves the "
                               "job nonce without sending it); every rank needs the same MACO",
                               -1);
        break;
    case MACO__HS_BAD_HELLO:
        MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                  "rank %d: refused a connection from %s: a hello of another setup wire "
                  "version (%u) or kind (%u; expected %u)",
                  rank, from, maco__get_u16(pc->hs.hello + 4), maco__get_u16(pc->hs.hello + 6),
                  ac->kind);
        break;
    case MACO__HS_BAD_PROOF:
        MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                  "rank %d: refused a connection from %s: it did not prove that it knows the "
                  "job nonce (a process of another job, or not a MACO rank)",
                  rank, from);
        break;
    case MACO__HS_PEER_REFUSED:
        MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                  "rank %d: the process at %s (claiming rank %u) refused this rank: its job "
                  "nonce is not this job's (every rank needs the same MACO_BOOTSTRAP_NONCE or "
                  "unique id; a process of another job on this port?)",
                  rank, from, maco__get_u32(pc->hs.hello + 8));
        break;
    default:
        break;
    }
}

/* Pending connections (pfds[1 .. npend] in pend's order): advances the handshake where data
 * arrived; drops slow or stray ones, and every one whose hello was taken. */
static maco_status_t maco__accept_pending(maco__accept_t *ac)
{
    maco_bootstrap_t bs = ac->bs;
    maco_status_t st = MACO_OK;
    int polled = ac->npend;
    for (int i = 0; i < ac->npend && st == MACO_OK; i++) {
        maco__pending_t *pc = &ac->pend[i];
        int r = MACO__HS_MORE;
        if (i < polled && ac->pfds[1 + i].revents != 0)
            r = maco__handshake_serve(&pc->hs, pc->fd, ac->kind, bs->nonce);
        char from[96];
        maco__sockaddr_format(&pc->from, from, sizeof(from));
        int drop = r != MACO__HS_MORE;
        if (r == MACO__HS_DONE) {
            st = maco__accept_hello(ac, pc, from);
        } else if (r != MACO__HS_MORE) {
            maco__accept_refuse(ac, pc, r, from);
        } else if (maco__now_ms() - pc->since_ms > MACO__HELLO_WAIT_MS) {
            MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                      "rank %d: dropped a connection from %s that did not finish the setup "
                      "handshake within %d ms",
                      bs->rank, from, MACO__HELLO_WAIT_MS);
            drop = 1;
        }
        if (drop) {
            if (pc->fd >= 0)
                close(pc->fd);
            /* Keep pend and its poll results in step: move the last of both here. */
            ac->pend[i] = ac->pend[--ac->npend];
            if (ac->npend < polled) {
                ac->pfds[1 + i] = ac->pfds[1 + ac->npend];
                polled--;
            }
            i--;
        }
    }
    return st;
}

/* New connections: all of them; when the table is full, the oldest pending one makes room. */
static maco_status_t maco__accept_new(maco__accept_t *ac)
{
    maco_bootstrap_t bs = ac->bs;
    maco__pending_t *pend = ac->pend;
    maco_status_t st;
    for (;;) {
        int fd;
        maco__sockaddr_t from;
        st = maco__socket_accept(bs->listen_fd, &fd, &from);
        if (st != MACO_OK || fd < 0)
            break;
        if (ac->npend == MACO__PENDING_MAX) {
            int oldest = 0;
            for (int i = 1; i < ac->npend; i++)
                if (pend[i].since_ms < pend[oldest].since_ms)
                    oldest = i;
            char old_from[96];
            maco__sockaddr_format(&pend[oldest].from, old_from, sizeof(old_from));
            MACO_WARN(MACO_SUBSYS_BOOTSTRAP,
                      "rank %d: %d connections are waiting to say hello; dropped the oldest "
                      "(from %s)",
                      bs->rank, MACO__PENDING_MAX, old_from);
            close(pend[oldest].fd);
            pend[oldest] = pend[--ac->npend];
        }
        memset(&pend[ac->npend], 0, sizeof(pend[ac->npend]));
        pend[ac->npend].fd = fd;
        pend[ac->npend].since_ms = maco__now_ms();
        pend[ac->npend].from = from;
        ac->npend++;
    }
    return st;
}

static maco_status_t maco__accept_ranks(maco_bootstrap_t bs, uint16_t kind, char *expect,
                                        int nexpect, int64_t deadline, maco__on_hello_t on_hello,
                                        maco__hs_client_t *out, int nout)
{
    /* Every connection is accepted at once and read without blocking, each with its own
     * short hello deadline: silent or slow strangers cost a slot, never a rank's time. */
    maco__accept_t ac;
    memset(&ac, 0, sizeof(ac));
    ac.bs = bs;
    ac.kind = kind;
    ac.expect = expect;
    ac.nexpect = nexpect;
    ac.deadline = deadline;
    ac.on_hello = on_hello;
    ac.out = out;
    ac.nout = nout;
    ac.pend = (maco__pending_t *)calloc(MACO__PENDING_MAX, sizeof(maco__pending_t));
    maco_status_t st = MACO_OK;
    size_t npfd = (size_t)(1 + MACO__PENDING_MAX + bs->nranks);
    ac.pfds = (struct pollfd *)calloc(npfd, sizeof(*ac.pfds));
    ac.pfd_rank = (int *)calloc(npfd, sizeof(int));
    if (ac.pend == NULL || ac.pfds == NULL || ac.pfd_rank == NULL) {
        free(ac.pend);
        free(ac.pfds);
        free(ac.pfd_rank);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
    }
    ac.job_status = MACO_OK;
    ac.told = kind == MACO__KIND_HELLO ? (char *)calloc((size_t)bs->nranks, 1) : NULL;
    ac.world = bs->nranks;
    while (ac.job_error[0] != '\0'
               ? ac.ntold + ac.ntold_beyond < ac.world - 1 && maco__now_ms() < ac.linger_until
               : ac.nexpect > 0 || ac.nout > 0) {
        int64_t now = maco__now_ms();
        if (ac.job_error[0] == '\0' && now >= deadline) {
            st = maco__accept_timed_out(&ac);
            break;
        }
        int n = maco__accept_poll(&ac, now, &st);
        if (st == MACO_OK)
            st = maco__accept_check_watch(&ac);
        if (st == MACO_OK)
            st = maco__accept_check_links(&ac, n);
        if (st == MACO_OK)
            st = maco__accept_pending(&ac);
        if (st == MACO_OK)
            st = maco__accept_new(&ac);
        if (st != MACO_OK)
            break;
    }
    for (int i = 0; i < ac.npend; i++)
        close(ac.pend[i].fd);
    free(ac.pend);
    free(ac.pfds);
    free(ac.pfd_rank);
    free(ac.told);
    if (ac.job_error[0] != '\0') {
        bs->setup_error_told = 1;
        /* The job error is this call's error (its text is still the thread's last error
         * unless something failed since; then that is reported instead). */
        return st != MACO_OK ? st : maco__error_quiet(ac.job_status, "%s", ac.job_error);
    }
    return st;
}

static maco_status_t maco__root_on_hello(maco_bootstrap_t bs, int rank, int fd,
                                         const uint8_t *hello, const maco__sockaddr_t *from)
{
    (void)from;
    bs->peers[rank].fd = fd;
    /* The hello carries (listen address, host id) in exactly a table entry's layout. */
    memcpy(bs->setup_table + (size_t)rank * MACO__TABLE_ENTRY_BYTES, hello + MACO__HELLO_ENTRY,
           MACO__TABLE_ENTRY_BYTES);
    return MACO_OK;
}

static maco_status_t maco__peer_on_hello(maco_bootstrap_t bs, int rank, int fd,
                                         const uint8_t *hello, const maco__sockaddr_t *from)
{
    (void)hello;
    (void)from;
    bs->peers[rank].fd = fd;
    return MACO_OK;
}

/* Sends a setup frame (TABLE or INIT_ERROR) on a link, bounded. */
static maco_status_t maco__send_setup_frame(int fd, uint16_t kind, const void *payload, size_t len,
                                            int64_t deadline, const char *what)
{
    uint8_t hdr[MACO__FRAME_HDR_BYTES];
    memset(hdr, 0, sizeof(hdr));
    maco__put_u16(hdr, kind);
    maco__put_u64(hdr + 8, (uint64_t)len);
    maco_status_t st = maco__write_all(fd, hdr, sizeof(hdr), deadline, what);
    if (st == MACO_OK && len > 0)
        st = maco__write_all(fd, payload, len, deadline, what);
    return st;
}

/* Rank 0: tells every joined rank why setup failed, so none waits for its deadline. */
static void maco__root_broadcast_error(maco_bootstrap_t bs, const char *text)
{
    int64_t deadline = maco__now_ms() + 1000;
    for (int r = 1; r < bs->nranks; r++) {
        if (bs->peers[r].fd >= 0) {
            char what[32];
            snprintf(what, sizeof(what), "rank %d", r);
            maco__send_setup_frame(bs->peers[r].fd, MACO__FRAME_INIT_ERROR, text, strlen(text),
                                   deadline, what);
        }
    }
}

static maco_status_t maco__setup_root(maco_bootstrap_t bs, int64_t deadline)
{
    char *expect = (char *)calloc((size_t)bs->nranks, 1);
    if (expect == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
    for (int r = 1; r < bs->nranks; r++)
        expect[r] = 1;
    maco_status_t st = maco__accept_ranks(bs, MACO__KIND_HELLO, expect, bs->nranks - 1, deadline,
                                          maco__root_on_hello, NULL, 0);
    free(expect);
    if (st != MACO_OK) {
        if (!bs->setup_error_told)
            maco__root_broadcast_error(bs, maco__last_error());
        return st;
    }
    return MACO_OK;
}

/* What maco__connect_rank's `stop` asks: whether the rank being connected to is gone. */
typedef struct maco__connect_watch {
    maco_bootstrap_t bs;
    int rank;
} maco__connect_watch_t;

static maco_status_t maco__connect_stop(void *ctx)
{
    const maco__connect_watch_t *w = (const maco__connect_watch_t *)ctx;
    if (!w->bs->watch_gone(w->bs->watch_ctx, w->rank))
        return MACO_OK;
    return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                       "rank %d: stopped connecting to rank %d of the new communicator: it is "
                       "gone (its process ended) or gave up this setup",
                       w->bs->rank, w->rank);
}

/* Connects to `rank` at `addr` before the deadline; in a bootstrap made by a shrink it stops as
 * soon as that rank is known gone. */
static maco_status_t maco__connect_rank(maco_bootstrap_t bs, int rank, const maco__sockaddr_t *addr,
                                        int64_t deadline, const char *what, int *fd_p)
{
    if (bs->watch_gone == NULL)
        return maco__socket_connect(addr, deadline, what, fd_p);
    maco__connect_watch_t w = { bs, rank };
    return maco__socket_connect_watched(addr, deadline, what, maco__connect_stop, &w, fd_p);
}

/* Installs (or with NULL removes) the watch a setup asks while it waits for a rank. */
static void maco__bs_set_watch(maco_bootstrap_t bs, const maco__watch_t *watch)
{
    bs->watch_gone = watch != NULL ? watch->gone : NULL;
    bs->watch_ctx = watch != NULL ? watch->ctx : NULL;
}

static void maco__apply_table(maco_bootstrap_t bs, const uint8_t *table)
{
    for (int r = 0; r < bs->nranks; r++) {
        memcpy(bs->host_ids[r], table + (size_t)r * MACO__TABLE_ENTRY_BYTES + MACO__WIRE_ADDR_BYTES,
               MACO__HOST_ID_BYTES);
        bs->host_ids[r][MACO__HOST_ID_BYTES - 1] = '\0';
    }
}

/* Rank r > 0: joins through rank 0 (at `root`, `root_text`), reads the table into `table`,
 * then connects to the ranks in [1, r) and accepts those in (r, nranks). */
static maco_status_t maco__setup_join(maco_bootstrap_t bs, const maco__sockaddr_t *root,
                                      const char *root_text, uint8_t *table, int64_t deadline)
{
    int rank = bs->rank, nranks = bs->nranks;
    size_t table_bytes = (size_t)nranks * MACO__TABLE_ENTRY_BYTES;
    char who[160];
    snprintf(who, sizeof(who), "rank 0 at %s", root_text);
    int fd;
    maco_status_t st = maco__connect_rank(bs, 0, root, deadline, "rank 0", &fd);
    if (st != MACO_OK)
        return st;
    bs->peers[0].fd = fd;
    maco__sockaddr_t mine;
    st = maco__socket_local_address(fd, &mine);
    if (st == MACO_OK && maco__config_is_set(MACO_CFG_SOCKET_IFNAME))
        st = maco__socket_default_address(&mine);
    maco__sockaddr_set_port(&mine, 0);
    if (st == MACO_OK)
        st = maco__socket_listen(&mine, &bs->listen_fd);
    if (st == MACO_OK) {
        maco__connect_watch_t w = { bs, 0 };
        st = maco__handshake_connect(fd, MACO__KIND_HELLO, bs->nonce, rank, nranks, &mine,
                                     maco__host_id(), deadline, who,
                                     bs->watch_gone != NULL ? maco__connect_stop : NULL, &w);
    }
    uint8_t hdr[MACO__FRAME_HDR_BYTES];
    if (st == MACO_OK)
        st = maco__read_all(fd, hdr, sizeof(hdr), deadline, "rank 0 (setup table)");
    if (st != MACO_OK)
        return st;
    uint16_t kind = maco__get_u16(hdr);
    uint64_t len = maco__get_u64(hdr + 8);
    if (kind == MACO__FRAME_INIT_ERROR && len < 4096) {
        char text[4096];
        st = maco__read_all(fd, text, (size_t)len, deadline, "rank 0 (setup error)");
        text[st == MACO_OK ? len : 0] = '\0';
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "rank 0 failed the job's setup: %s", text);
    }
    if (kind != MACO__FRAME_TABLE || len != table_bytes)
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "rank 0 sent an unexpected setup frame (kind %u, %llu bytes, "
                           "expected %zu): a different MACO version?",
                           (unsigned)kind, (unsigned long long)len, table_bytes);
    st = maco__read_all(fd, table, table_bytes, deadline, "rank 0 (setup table)");
    if (st != MACO_OK)
        return st;
    maco__apply_table(bs, table);
    /* Mesh: connect to lower ranks (except 0) and send each a hello, then finish those
     * handshakes as the answers come while accepting the higher ranks (a lower rank answers
     * once it reaches its own accepting: waiting for each in turn would chain the ranks). */
    char *expect = (char *)calloc((size_t)nranks, 1);
    maco__hs_client_t *out = (maco__hs_client_t *)calloc((size_t)nranks, sizeof(*out));
    if (expect == NULL || out == NULL) {
        free(expect);
        free(out);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
    }
    for (int q = 1; q < rank && st == MACO_OK; q++) {
        maco__sockaddr_t addr;
        if (maco__sockaddr_from_wire(table + (size_t)q * MACO__TABLE_ENTRY_BYTES, &addr) != 0) {
            st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                             "rank 0's table has no address for rank %d", q);
            break;
        }
        char what[32], addr_text[96];
        snprintf(what, sizeof(what), "rank %d", q);
        maco__sockaddr_format(&addr, addr_text, sizeof(addr_text));
        snprintf(who, sizeof(who), "rank %d at %s", q, addr_text);
        st = maco__connect_rank(bs, q, &addr, deadline, what, &fd);
        if (st == MACO_OK) {
            bs->peers[q].fd = fd;
            st = maco__handshake_begin(&out[q], fd, MACO__KIND_PEER_HELLO, bs->nonce, rank, nranks,
                                       NULL, NULL, deadline, who);
        }
    }
    for (int q = rank + 1; q < nranks; q++)
        expect[q] = 1;
    if (st == MACO_OK && nranks > 2)
        st = maco__accept_ranks(bs, MACO__KIND_PEER_HELLO, expect, nranks - 1 - rank, deadline,
                                maco__peer_on_hello, out, rank > 1 ? rank - 1 : 0);
    free(expect);
    free(out);
    return st;
}

/*
 * Common setup. `listen_fd` is rank 0's already-open root socket, or -1 (rank 0 then
 * binds `root` itself; other ranks always open their own listener).
 */
static maco_status_t maco__bootstrap_setup(const maco__sockaddr_t *root, uint64_t nonce, int rank,
                                           int nranks, int64_t timeout_ms, int listen_fd,
                                           const maco__watch_t *watch, maco_bootstrap_t *bs_p)
{
    maco_bootstrap_t bs = maco__bs_alloc(rank, nranks, nonce, timeout_ms);
    if (bs == NULL) {
        if (listen_fd >= 0)
            close(listen_fd);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP,
                           "no host memory for a bootstrap of %d ranks", nranks);
    }
    maco__bs_set_watch(bs, watch);
    maco__log_set_rank(rank);
    int64_t deadline = maco__deadline_ms(timeout_ms);
    maco_status_t st = MACO_OK;
    char root_text[96];
    maco__sockaddr_format(root, root_text, sizeof(root_text));
    size_t table_bytes = (size_t)nranks * MACO__TABLE_ENTRY_BYTES;
    uint8_t *table = (uint8_t *)calloc(1, table_bytes);
    if (table == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "setup: no memory");
        goto fail;
    }
    bs->setup_table = table;

    if (rank == 0) {
        if (listen_fd >= 0) {
            bs->listen_fd = listen_fd;
            listen_fd = -1;
        } else {
            maco__sockaddr_t addr = *root;
            st = maco__socket_listen(&addr, &bs->listen_fd);
            if (st != MACO_OK)
                goto fail;
        }
        MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "rank 0 listening on %s for %d ranks", root_text, nranks);
        /* Rank 0's own entry; the others arrive with their hellos. */
        maco__sockaddr_to_wire(root, table);
        snprintf((char *)table + MACO__WIRE_ADDR_BYTES, MACO__HOST_ID_BYTES, "%s", maco__host_id());
        if (nranks > 1) {
            st = maco__setup_root(bs, deadline);
            if (st != MACO_OK)
                goto fail;
        }
        maco__apply_table(bs, table);
        for (int r = 1; r < nranks && st == MACO_OK; r++) {
            char what[32];
            snprintf(what, sizeof(what), "rank %d", r);
            st = maco__send_setup_frame(bs->peers[r].fd, MACO__FRAME_TABLE, table, table_bytes,
                                        deadline, what);
        }
        if (st != MACO_OK)
            goto fail;
    } else {
        st = maco__setup_join(bs, root, root_text, table, deadline);
        if (st != MACO_OK)
            goto fail;
    }
    /* The listening socket has done its work. */
    close(bs->listen_fd);
    bs->listen_fd = -1;
    bs->setup_table = NULL;
    free(table);
    MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "rank %d of %d connected (root %s)", rank, nranks, root_text);
    maco__bs_set_watch(bs, NULL); /* its context lives only as long as the setup */
    *bs_p = bs;
    return MACO_OK;
fail:
    bs->setup_table = NULL;
    free(table);
    if (listen_fd >= 0)
        close(listen_fd);
    maco__bs_free(bs);
    return st;
}

maco_status_t maco_bootstrap_create(const maco_unique_id_t *id, int rank, int nranks,
                                    int timeout_ms, maco_bootstrap_t *bs_p)
{
    return maco__bootstrap_create_watched(id, rank, nranks, timeout_ms, NULL, bs_p);
}

maco_status_t maco__bootstrap_create_watched(const maco_unique_id_t *id, int rank, int nranks,
                                             int64_t timeout_ms, const maco__watch_t *watch,
                                             maco_bootstrap_t *bs_p)
{
    if (id == NULL || bs_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create: id and bs_p must not be NULL");
    if (nranks < 1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create: nranks is %d; it must be at least 1", nranks);
    if (nranks > MACO_MAX_RANKS)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create: nranks is %d; a job has at most %d ranks "
                           "(MACO_MAX_RANKS)",
                           nranks, MACO_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "maco_bootstrap_create: rank %d is outside [0, %d)", rank, nranks);
    MACO__LOG_RANK_SCOPE(rank);
    maco_status_t st = maco__host_id_check();
    if (st != MACO_OK)
        return st;
    uint64_t nonce = 0;
    maco__sockaddr_t root;
    st = maco__unique_id_decode(id, &nonce, &root);
    if (st != MACO_OK)
        return st;
    int64_t timeout = timeout_ms;
    if (timeout_ms < 0) {
        st = maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &timeout);
        if (st != MACO_OK)
            return st;
    }
    maco__config_check_environment();
    int listen_fd = rank == 0 ? maco__take_root_socket(nonce) : -1;
    return maco__bootstrap_setup(&root, nonce, rank, nranks, timeout, listen_fd, watch, bs_p);
}
