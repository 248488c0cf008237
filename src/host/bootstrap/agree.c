/*
 * agree.c - shrinking a bootstrap whose ranks may die at any time (maco__bootstrap_shrink): the
 * survivors agree on who stays, build the new bootstrap and what goes on it (the communicator),
 * and agree that every member built its part before any of them keeps it.
 *
 * Failure model. Ranks stop by crashing or by leaving (a BYE or ABORT frame); they do not lie.
 * A link ends only after everything its peer wrote before it stopped has been read (TCP
 * delivers in order, and this file writes every message into the kernel before acting on
 * anything else), so "rank r is gone" (its link ended) is never said of a live rank, and every
 * message a gone rank sent is read before its end is seen: a perfect failure detector in the
 * sense of Chandra and Toueg, "Unreliable failure detectors for reliable distributed systems"
 * (JACM 1996), wherever the operating system reports a peer's death (on one machine always; a
 * host that vanishes without closing its sockets shows only at the deadline). Ranks a caller
 * excludes while they are alive must be excluded by every caller, as ncclCommShrink requires;
 * dead ranks need not be listed anywhere.
 *
 * Protocol, instance k = 0, 1, ... of the bootstrap (tags MACO__TAG_AGREE_* + k % 256, and k in
 * every payload, so messages of other instances are never taken for this one's):
 *  - PROPOSAL: every participant sends one to its coordinator, the lowest rank it neither knows
 *    gone nor excludes (possibly itself): the ranks it knows gone or excludes, and how its part
 *    of the previous instance's new bootstrap went. When that coordinator goes, to the next.
 *  - The coordinator waits until every rank that it neither knows gone nor finds out in some
 *    proposal (the union of everyone's failures and exclusions) has proposed, then decides:
 *    COMMIT when the previous instance's members all proposed, all built their part and the
 *    members would not change; else NEW with the members (the proposers not out), or FAIL when
 *    the same members failed to build three times.
 *  - A DECISION is sent on, by whoever gets it first, to every rank it does not know gone,
 *    before it acts on it. So when any live rank has it, every live rank gets it, also if the
 *    coordinator died halfway through sending it; and no second coordinator can decide the same
 *    instance while a live rank holds a decision, since it waits for that rank's proposal,
 *    which never comes, until the forwarded decision arrives.
 *  - NEW: ranks not among the members return NULL. The members make the new bootstrap: its rank
 *    0 (the lowest member) creates a unique id and sends it to the others (tag AGREE_ID), all
 *    join, each wait of the setup asking whether the rank awaited is gone from this bootstrap
 *    or some member gave up (a member whose part failed says so to the others, tag
 *    AGREE_ABANDON, so none waits for it); then how->build. Instance k + 1 then decides
 *    whether they keep it.
 *  - COMMIT: every member returns what it built. FAIL: every member frees it and returns the
 *    error.
 * Each instance needs only messages among live ranks, so a death at any point (even of the
 * coordinator, or during the new bootstrap's setup) costs one more instance, never a wait for
 * the deadline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

enum {
    AGREE_MAGIC_PROPOSAL = 0x5047414Du, /* "MAGP" */
    AGREE_MAGIC_DECISION = 0x4447414Du, /* "MAGD" */
    AGREE_HDR = 32,                     /* both messages: 32 bytes, then a bitmap of nranks bits */
    AGREE_NEW = 1,
    AGREE_COMMIT = 2,
    AGREE_FAIL = 3,
    AGREE_MAX_TRIES = 3, /* NEWs of the same members that may fail to build before FAIL */
    AGREE_POLL_MS = 1000,
};

/* Proposal flags. */
enum { PROP_HAD_NEW = 1, PROP_BUILT = 2 };

/* One rank's state during one maco__bootstrap_shrink call. */
typedef struct agree {
    maco_bootstrap_t bs;
    int n, me;
    size_t map_bytes; /* bitmap bytes: (n + 7) / 8 */
    int64_t deadline; /* of the whole call */
    uint32_t k;       /* the instance being decided */
    char *excluded;   /* [n]: this caller's exclude list */
    char *out;        /* [n]: gone (link ended) or out (excluded, or not a member of a NEW) */
    /* The coordinator's collection for instance k. */
    char *have;          /* [n]: proposed */
    char *out_union;     /* [n]: union of the proposals' out sets */
    uint8_t *prop_flags; /* [n] */
    int32_t *prop_status;
    uint64_t *prop_hash;
    uint32_t max_tries;
    /* Where this rank is. */
    int proposed_to;   /* the coordinator this instance's proposal went to, or -1 */
    int had_new;       /* the previous instance decided NEW with this rank a member */
    uint64_t new_hash; /* its members' hash */
    char *members;     /* [n]: its members */
    uint32_t tries;    /* failed NEWs in a row with these members */
    maco_status_t built_status;
    void *built; /* what how->build made, or NULL */
    int new_rank;
    uint8_t *msg;  /* scratch for one message: AGREE_HDR + map_bytes */
    int abandoned; /* a member gave up this instance's new bootstrap (AGREE_ABANDON) */
} agree_t;

static int bit_get(const uint8_t *map, int r)
{
    return (map[r >> 3] >> (r & 7)) & 1;
}

static void bit_put(uint8_t *map, const char *set, int n)
{
    for (int r = 0; r < n; r++)
        if (set[r])
            map[r >> 3] |= (uint8_t)(1u << (r & 7));
}

/* FNV-1a over the member ranks and the instance that named them. */
static uint64_t members_hash(const char *members, int n, uint32_t k)
{
    uint64_t h = 14695981039346656037ull ^ k;
    for (int r = 0; r < n; r++)
        if (members[r])
            for (int b = 0; b < 4; b++)
                h = (h ^ (((uint32_t)r >> (8 * b)) & 0xffu)) * 1099511628211ull;
    return h;
}

/* Marks ranks whose links ended (or that left) as out; reads nothing. */
static void agree_note_gone(agree_t *a)
{
    for (int r = 0; r < a->n; r++)
        if (r != a->me && !a->out[r] && maco__bs_peer_is_gone(a->bs, r))
            a->out[r] = 1;
}

/* The coordinator in this rank's view: the lowest rank neither out nor excluded here. */
static int agree_coordinator(const agree_t *a)
{
    for (int r = 0; r < a->n; r++)
        if (!a->out[r] && !a->excluded[r])
            return r;
    return -1;
}

/* Writes `len` bytes of `data` under `tag` to every rank in to[] (n entries, nonzero: send)
 * whose link is open, until the kernel took them or the link ended; the deadline bounds it. */
static maco_status_t agree_send(agree_t *a, const char *to, uint32_t tag, const void *data,
                                size_t len)
{
    maco_bootstrap_t bs = a->bs;
    maco__tx_t *tx = (maco__tx_t *)calloc((size_t)a->n, sizeof(*tx));
    if (tx == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "shrink: no host memory");
    for (int r = 0; r < a->n; r++)
        if (to[r] && r != a->me && !maco__bs_peer_is_gone(bs, r))
            maco__bs_queue(bs, r, &tx[r], MACO__FRAME_DATA, tag, data, len);
    maco_status_t st = MACO_OK;
    for (;;) {
        int pending = 0;
        for (int r = 0; r < a->n; r++)
            pending += to[r] && r != a->me && tx[r].hdr_sent != (size_t)-1 &&
                       !maco__bs_peer_is_gone(bs, r);
        if (pending == 0)
            break;
        if (maco__now_ms() >= a->deadline) {
            int first = -1;
            for (int r = 0; r < a->n && first < 0; r++)
                if (to[r] && r != a->me && tx[r].hdr_sent != (size_t)-1 &&
                    !maco__bs_peer_is_gone(bs, r))
                    first = r;
            st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                             "rank %d: shrink: %d live peer(s), rank %d first, took no message "
                             "before the deadline (they read nothing: MACO_BOOTSTRAP_TIMEOUT)",
                             a->me, pending, first);
            break;
        }
        st = maco__bs_progress_links(bs, a->deadline);
        if (st != MACO_OK)
            break;
    }
    for (int r = 0; r < a->n; r++)
        if (to[r] && r != a->me && tx[r].hdr_sent != (size_t)-1)
            maco__bs_unqueue(bs, r, &tx[r]);
    free(tx);
    agree_note_gone(a);
    return st;
}

/* Sends one message to one rank. */
static maco_status_t agree_send_one(agree_t *a, int to, uint32_t tag, const void *data, size_t len)
{
    char *one = (char *)calloc((size_t)a->n, 1);
    if (one == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "shrink: no host memory");
    one[to] = 1;
    maco_status_t st = agree_send(a, one, tag, data, len);
    free(one);
    return st;
}

/* Sends a decision to every rank not known gone (the coordinator's send and every forward). */
static maco_status_t agree_spread(agree_t *a, const uint8_t *decision, size_t len)
{
    char *to = (char *)calloc((size_t)a->n, 1);
    if (to == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "shrink: no host memory");
    for (int r = 0; r < a->n; r++)
        to[r] = r != a->me && !maco__bs_peer_is_gone(a->bs, r);
    maco_status_t st = agree_send(a, to, MACO__TAG_AGREE_DECIDE + (a->k & 0xffu), decision, len);
    free(to);
    return st;
}

/* Takes this instance's next message with tag `base` + k % 256 from a rank in want[] (NULL:
 * any) into a->msg (exactly `len` bytes, the instance at byte 4, or at byte 0 when
 * `k_at` is 0); messages of other instances or sizes are dropped. 0: taken, -1: none. */
static int agree_take(agree_t *a, uint32_t base, const char *want, size_t len, size_t k_at,
                      int *from_p)
{
    maco__msg_t *m;
    while (maco__bs_take_any(a->bs, base + (a->k & 0xffu), want, &m, from_p) == 0) {
        int ok = m->len == len && maco__get_u32(m->data + k_at) == a->k;
        if (ok)
            memcpy(a->msg, m->data, len);
        free(m->data);
        free(m);
        if (ok)
            return 0;
    }
    return -1;
}

static void agree_encode_proposal(agree_t *a, uint8_t *p)
{
    memset(p, 0, AGREE_HDR + a->map_bytes);
    maco__put_u32(p, AGREE_MAGIC_PROPOSAL);
    maco__put_u32(p + 4, a->k);
    maco__put_u32(p + 8, (uint32_t)a->n);
    maco__put_u32(p + 12, (a->had_new ? PROP_HAD_NEW : 0u) |
                              (a->had_new && a->built_status == MACO_OK ? PROP_BUILT : 0u));
    maco__put_u32(p + 16, (uint32_t)a->built_status);
    maco__put_u32(p + 20, a->tries);
    maco__put_u64(p + 24, a->had_new ? a->new_hash : 0);
    bit_put(p + AGREE_HDR, a->out, a->n);
    bit_put(p + AGREE_HDR, a->excluded, a->n);
}

/* The coordinator files a proposal (its own or a peer's). */
static void agree_file(agree_t *a, int from, const uint8_t *p)
{
    if (maco__get_u32(p) != AGREE_MAGIC_PROPOSAL || maco__get_u32(p + 8) != (uint32_t)a->n)
        return;
    a->have[from] = 1;
    a->prop_flags[from] = (uint8_t)maco__get_u32(p + 12);
    a->prop_status[from] = (int32_t)maco__get_u32(p + 16);
    a->prop_hash[from] = maco__get_u64(p + 24);
    if (maco__get_u32(p + 20) > a->max_tries)
        a->max_tries = maco__get_u32(p + 20);
    for (int r = 0; r < a->n; r++)
        if (bit_get(p + AGREE_HDR, r))
            a->out_union[r] = 1;
}

/* The coordinator: when every rank it awaits has proposed, writes the decision into a->msg and
 * returns 1; else 0. */
static int agree_decide(agree_t *a)
{
    for (int r = 0; r < a->n; r++)
        if (!a->have[r] && !a->out[r] && !a->out_union[r] && !(a->excluded[r] && r != a->me))
            return 0; /* still awaited */
    uint8_t *d = a->msg;
    memset(d, 0, AGREE_HDR + a->map_bytes);
    maco__put_u32(d, AGREE_MAGIC_DECISION);
    maco__put_u32(d + 4, a->k);
    maco__put_u32(d + 8, (uint32_t)a->n);
    maco__put_u32(d + 16, (uint32_t)a->me);
    int same = a->had_new, nmembers = 0, fail_rank = -1;
    int32_t fail_status = MACO_OK;
    for (int r = 0; r < a->n; r++) {
        int member = a->have[r] && !a->out_union[r] && !a->out[r];
        if (member) {
            d[AGREE_HDR + (r >> 3)] |= (uint8_t)(1u << (r & 7));
            nmembers++;
        }
        if (a->had_new && a->members[r] != member)
            same = 0;
        if (a->had_new && a->members[r] && member) {
            int built = (a->prop_flags[r] & PROP_HAD_NEW) && (a->prop_flags[r] & PROP_BUILT) &&
                        a->prop_hash[r] == a->new_hash;
            if (!built && fail_rank < 0) {
                fail_rank = r;
                fail_status = a->prop_status[r] != MACO_OK ? a->prop_status[r] : MACO_ERR_REMOTE;
            }
        }
    }
    uint32_t kind = AGREE_NEW;
    if (same && fail_rank < 0)
        kind = AGREE_COMMIT;
    else if (same && a->max_tries + 1 >= AGREE_MAX_TRIES)
        kind = AGREE_FAIL;
    maco__put_u32(d + 12, kind);
    maco__put_u32(d + 20, (uint32_t)fail_status);
    maco__put_u32(d + 24, (uint32_t)fail_rank);
    MACO_DEBUG(MACO_SUBSYS_BOOTSTRAP, "rank %d: shrink instance %u decided %s (%d members)", a->me,
               a->k,
               kind == AGREE_NEW      ? "NEW"
               : kind == AGREE_COMMIT ? "COMMIT"
                                      : "FAIL",
               nmembers);
    return 1;
}

/* Resets the coordinator's collection for a new instance. */
static void agree_next_instance(agree_t *a)
{
    a->k++;
    a->proposed_to = -1;
    a->max_tries = 0;
    memset(a->have, 0, (size_t)a->n);
    memset(a->out_union, 0, (size_t)a->n);
}

/* The names of the ranks still awaited, for the timeout's message. */
static void agree_awaited(const agree_t *a, int coordinator, char *text, size_t cap)
{
    size_t used = 0;
    int listed = 0;
    text[0] = '\0';
    if (coordinator != a->me) {
        snprintf(text, cap, " a decision from rank %d (the coordinator)", coordinator);
        return;
    }
    for (int r = 0; r < a->n && used + 16 < cap; r++) {
        if (a->have[r] || a->out[r] || a->out_union[r] || (a->excluded[r] && r != a->me))
            continue;
        if (listed++ == 16) {
            snprintf(text + used, cap - used, " ...");
            return;
        }
        used += (size_t)snprintf(text + used, cap - used, " %d", r);
    }
}

/* Waits until this instance's decision is in a->msg: proposes, coordinates when it is this
 * rank's turn, and forwards the decision it gets. */
static maco_status_t agree_instance(agree_t *a)
{
    size_t len = AGREE_HDR + a->map_bytes;
    uint8_t *mine = (uint8_t *)malloc(len);
    if (mine == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "shrink: no host memory");
    maco_status_t st = MACO_OK;
    int from;
    for (;;) {
        agree_note_gone(a);
        int c = agree_coordinator(a);
        if (agree_take(a, MACO__TAG_AGREE_DECIDE, NULL, len, 4, &from) == 0) {
            st = agree_spread(a, a->msg, len); /* before acting on it */
            break;
        }
        if (c < 0) { /* everyone is gone or excluded: nothing to join */
            memset(a->msg, 0, len);
            maco__put_u32(a->msg + 12, AGREE_NEW);
            break;
        }
        if (a->proposed_to != c) {
            agree_encode_proposal(a, mine);
            if (c == a->me)
                agree_file(a, a->me, mine);
            else
                st = agree_send_one(a, c, MACO__TAG_AGREE_PROPOSE + (a->k & 0xffu), mine, len);
            if (st != MACO_OK)
                break;
            a->proposed_to = c;
            continue;
        }
        if (c == a->me) {
            while (agree_take(a, MACO__TAG_AGREE_PROPOSE, NULL, len, 4, &from) == 0)
                agree_file(a, from, a->msg);
            if (agree_decide(a)) {
                st = agree_spread(a, a->msg, len);
                break;
            }
        }
        if (maco__now_ms() >= a->deadline) {
            char awaited[200];
            agree_awaited(a, c, awaited, sizeof(awaited));
            st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                             "rank %d: shrink timed out after %lld ms waiting for%s (a live rank "
                             "that neither calls the shrink nor is excluded by every caller is "
                             "waited for; MACO_BOOTSTRAP_TIMEOUT sets the deadline)",
                             a->me, (long long)a->bs->timeout_ms, awaited);
            break;
        }
        int64_t wake = maco__now_ms() + AGREE_POLL_MS;
        st = maco__bs_progress_links(a->bs, wake < a->deadline ? wake : a->deadline);
        if (st != MACO_OK)
            break;
    }
    free(mine);
    return st;
}

/* ------------------------------------------------------------------ the new bootstrap */

/* What the new bootstrap's setup asks while it waits for its rank `rank`: stop, because that
 * rank is gone from the old bootstrap, or because some member gave this attempt up (it could
 * not build its part, and tells the members so that none waits for it until the deadline)? */
typedef struct agree_watch {
    agree_t *a;
    int *parent_rank; /* [new nranks] */
} agree_watch_t;

static int agree_watch_gone(void *ctx, int rank)
{
    agree_watch_t *w = (agree_watch_t *)ctx;
    agree_t *a = w->a;
    (void)maco__bs_progress_links(a->bs, maco__now_ms()); /* read what arrived, no wait */
    maco__msg_t *m;
    int from;
    while (!a->abandoned && maco__bs_take_any(a->bs, MACO__TAG_AGREE_ABANDON + (a->k & 0xffu),
                                              a->members, &m, &from) == 0) {
        a->abandoned = m->len == 4 && maco__get_u32(m->data) == a->k;
        free(m->data);
        free(m);
    }
    int p = w->parent_rank[rank];
    return a->abandoned || (p != a->me && maco__bs_peer_is_gone(a->bs, p));
}

/* NEW with this rank a member: gets or makes the new bootstrap's id, joins it, builds on it. */
static maco_status_t agree_build(agree_t *a, const maco__shrink_build_t *how)
{
    int m = 0, my = -1;
    int *parent_rank = (int *)malloc(sizeof(int) * (size_t)a->n);
    if (parent_rank == NULL)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "shrink: no host memory");
    for (int r = 0; r < a->n; r++) {
        if (!a->members[r])
            continue;
        if (r == a->me)
            my = m;
        parent_rank[m++] = r;
    }
    a->new_rank = my;
    uint8_t idmsg[8 + MACO_UNIQUE_ID_BYTES];
    maco_unique_id_t id;
    maco_status_t st = MACO_OK;
    if (my == 0) {
        st = maco_unique_id_create(&id);
        memset(idmsg, 0, sizeof(idmsg));
        maco__put_u32(idmsg, a->k);
        memcpy(idmsg + 8, id.bytes, sizeof(id.bytes));
        if (st == MACO_OK)
            st = agree_send(a, a->members, MACO__TAG_AGREE_ID + (a->k & 0xffu), idmsg,
                            sizeof(idmsg));
        uint64_t nonce;
        maco__sockaddr_t root;
        if (st != MACO_OK && maco__unique_id_decode(&id, &nonce, &root) == MACO_OK) {
            int fd = maco__take_root_socket(nonce); /* nobody joins it: close its socket */
            if (fd >= 0)
                close(fd);
        }
    } else {
        char *want = (char *)calloc((size_t)a->n, 1);
        if (want == NULL) {
            free(parent_rank);
            return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP, "shrink: no memory");
        }
        want[parent_rank[0]] = 1;
        uint8_t *saved = a->msg;
        a->msg = idmsg;
        int from;
        while (agree_take(a, MACO__TAG_AGREE_ID, want, sizeof(idmsg), 0, &from) != 0) {
            if (maco__bs_peer_is_gone(a->bs, parent_rank[0])) {
                st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                                 "rank %d: shrink: rank %d, which makes the new communicator, "
                                 "is gone",
                                 a->me, parent_rank[0]);
                break;
            }
            if (maco__now_ms() >= a->deadline) {
                st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                                 "rank %d: shrink: no id of the new communicator from rank %d "
                                 "before the deadline (MACO_BOOTSTRAP_TIMEOUT)",
                                 a->me, parent_rank[0]);
                break;
            }
            st = maco__bs_progress_links(a->bs, a->deadline);
            if (st != MACO_OK)
                break;
        }
        a->msg = saved;
        free(want);
        if (st == MACO_OK)
            memcpy(id.bytes, idmsg + 8, sizeof(id.bytes));
    }
    if (st == MACO_OK) {
        agree_watch_t w = { a, parent_rank };
        maco__watch_t watch = { agree_watch_gone, &w };
        int64_t left = a->deadline - maco__now_ms();
        maco_bootstrap_t child = NULL;
        st = maco__bootstrap_create_watched(&id, my, m, left > 1 ? left : 1, &watch, &child);
        /* The rest of this call's deadline bounds the setup only: the new bootstrap's waits get
         * the parent's whole timeout, or each shrink of a shrunk one would shorten it further. */
        if (st == MACO_OK)
            child->timeout_ms = a->bs->timeout_ms;
        if (st == MACO_OK)
            st = how->build(how->ctx, child, &a->built);
    }
    free(parent_rank);
    return st;
}

/* ------------------------------------------------------------------ the call */

static void agree_free(agree_t *a)
{
    free(a->excluded);
    free(a->out);
    free(a->have);
    free(a->out_union);
    free(a->prop_flags);
    free(a->prop_status);
    free(a->prop_hash);
    free(a->members);
    free(a->msg);
}

static maco_status_t agree_init(agree_t *a, maco_bootstrap_t bs, const int *exclude, int n_exclude)
{
    memset(a, 0, sizeof(*a));
    a->bs = bs;
    a->n = bs->nranks;
    a->me = bs->rank;
    a->map_bytes = ((size_t)a->n + 7) / 8;
    a->deadline = maco__deadline_ms(bs->timeout_ms);
    a->k = bs->agree_seq;
    a->proposed_to = -1;
    a->new_rank = -1;
    size_t n = (size_t)a->n;
    a->excluded = (char *)calloc(n, 1);
    a->out = (char *)calloc(n, 1);
    a->have = (char *)calloc(n, 1);
    a->out_union = (char *)calloc(n, 1);
    a->prop_flags = (uint8_t *)calloc(n, 1);
    a->prop_status = (int32_t *)calloc(n, sizeof(int32_t));
    a->prop_hash = (uint64_t *)calloc(n, sizeof(uint64_t));
    a->members = (char *)calloc(n, 1);
    a->msg = (uint8_t *)calloc(AGREE_HDR + a->map_bytes + MACO_UNIQUE_ID_BYTES + 8, 1);
    if (!a->excluded || !a->out || !a->have || !a->out_union || !a->prop_flags || !a->prop_status ||
        !a->prop_hash || !a->members || !a->msg)
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_BOOTSTRAP,
                           "shrink: no host memory for %d ranks", a->n);
    for (int i = 0; i < n_exclude; i++)
        a->excluded[exclude[i]] = 1;
    return MACO_OK;
}

/* Acts on the decision in a->msg. 1: the call is over (*st set); 0: next instance. */
static int agree_act(agree_t *a, const maco__shrink_build_t *how, maco_status_t *st)
{
    uint32_t kind = maco__get_u32(a->msg + 12);
    if (kind == AGREE_COMMIT) {
        *st = MACO_OK;
        return 1;
    }
    if (a->built != NULL) {
        how->discard(how->ctx, a->built);
        a->built = NULL;
    }
    if (kind == AGREE_FAIL) {
        int rank = (int)maco__get_u32(a->msg + 24);
        maco_status_t why = (maco_status_t)(int32_t)maco__get_u32(a->msg + 20);
        *st = maco__error(why != MACO_OK ? why : MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                          "rank %d: shrink failed: rank %d could not build its part of the new "
                          "communicator %d times (%s; its log says why)",
                          a->me, rank, AGREE_MAX_TRIES, maco_status_string(why));
        return 1;
    }
    uint64_t prev_hash = a->had_new ? a->new_hash : 0;
    for (int r = 0; r < a->n; r++) {
        a->members[r] = (char)bit_get(a->msg + AGREE_HDR, r);
        if (!a->members[r])
            a->out[r] = 1; /* out of every later instance of this call */
    }
    if (!a->members[a->me]) {
        a->new_rank = -1;
        *st = MACO_OK;
        return 1; /* excluded: nothing to build */
    }
    a->new_hash = members_hash(a->members, a->n, 0);
    a->tries = a->had_new && a->new_hash == prev_hash ? a->tries + 1 : 0;
    a->had_new = 1;
    a->new_hash = members_hash(a->members, a->n, a->k);
    a->abandoned = 0;
    a->built_status = agree_build(a, how);
    if (a->built_status != MACO_OK) {
        if (a->built != NULL) {
            how->discard(how->ctx, a->built);
            a->built = NULL;
        }
        /* The members still setting up must not wait for this rank until the deadline. */
        uint8_t k[4];
        maco__put_u32(k, a->k);
        maco_status_t st2 =
            agree_send(a, a->members, MACO__TAG_AGREE_ABANDON + (a->k & 0xffu), k, sizeof(k));
        if (st2 != MACO_OK) {
            *st = st2;
            return 1;
        }
    }
    return 0;
}

maco_status_t maco__bootstrap_shrink(maco_bootstrap_t bs, const int *exclude, int n_exclude,
                                     const maco__shrink_build_t *how, void **out_p, int *new_rank_p)
{
    if (bs == NULL || how == NULL || how->build == NULL || how->discard == NULL || out_p == NULL ||
        new_rank_p == NULL || (exclude == NULL && n_exclude > 0) || n_exclude < 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "shrink: NULL argument, or n_exclude %d without a list", n_exclude);
    for (int i = 0; i < n_exclude; i++)
        if (exclude[i] < 0 || exclude[i] >= bs->nranks)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                               "shrink: exclude[%d] is %d, outside [0, %d)", i, exclude[i],
                               bs->nranks);
    MACO__LOG_RANK_SCOPE(bs->rank);
    agree_t a;
    pthread_mutex_lock(&bs->lock);
    maco__bs_tell_revoke_once(bs); /* a revoke of this rank's reaches the peers first */
    int tolerant = bs->tolerant;
    bs->tolerant = 1;
    maco_status_t st = agree_init(&a, bs, exclude, n_exclude);
    while (st == MACO_OK) {
        st = agree_instance(&a);
        if (st != MACO_OK || agree_act(&a, how, &st))
            break;
        agree_next_instance(&a);
    }
    bs->agree_seq = a.k + 1;
    bs->tolerant = tolerant;
    pthread_mutex_unlock(&bs->lock);
    if (st != MACO_OK && a.built != NULL) {
        how->discard(how->ctx, a.built);
        a.built = NULL;
    }
    if (st == MACO_OK) {
        *out_p = a.new_rank >= 0 ? a.built : NULL;
        *new_rank_p = a.new_rank;
        MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "rank %d: shrink done: %s", bs->rank,
                  a.new_rank >= 0 ? "a member of the new communicator" : "excluded");
    }
    agree_free(&a);
    return st;
}
