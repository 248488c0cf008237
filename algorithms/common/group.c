/*
 * group.c - maco_group_start / maco_group_end: the calling thread's group of calls, issued
 * together when the outermost group ends.
 *
 * Every call goes through here once its arguments are checked: inside a group it is queued
 * (its arguments copied), outside one it is a group of its own and issued at once. At the
 * end of the outermost group, per communicator in the order each first appeared:
 *   1. everything is checked before anything is issued: each collective's preparation
 *      (GPU, one node, no earlier asynchronous error, the forced algorithm) and the plan of
 *      the sends and receives (p2p_plan.c: local sends matched with local receives, no
 *      receive buffer overlapping another receive buffer, the launch's limits);
 *   2. the collectives are launched in call order, then the sends that overlap a receive
 *      buffer (in place) are copied aside, then one p2p kernel (p2p_kernels.cu) moves every
 *      send and receive of the communicator.
 * A call that failed its checks inside a group fails the group: maco_group_end returns its
 * status, names it, and issues nothing. Groups nest (only the outermost end issues) and are
 * per thread (thread-local state), as NCCL's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/collectives/collectives.h"
#include "algorithms/common/group.h"
#include "algorithms/common/select.h"
#include "algorithms/p2p/p2p.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"

enum { MACO__P2P_LAUNCH_THREADS = 512 }; /* p2p_kernels.cu's __launch_bounds__ */

typedef struct maco__group_op {
    int is_coll;
    int call; /* 1-based number of the call in its group */
    const char *fn;
    maco_comm_t comm;
    maco_stream_t stream;
    maco__coll_call_t coll;
    maco__p2p_msg_t *msgs; /* p2p: owned */
    int nmsgs;
    int next; /* the next op of the group on the same communicator, or -1 */
} maco__group_op_t;

/* A communicator of the group: its stream (one per communicator and group), its first and last
 * op (the ops chained by `next`, in call order). */
typedef struct maco__group_member {
    maco_comm_t comm;
    maco_stream_t stream;
    int first, last;
} maco__group_member_t;

/*
 * A group's queue. Every step is linear in the calls: a call's communicator is found in a hash
 * table of the group's communicators (open addressing over the handle), and each
 * communicator's ops are chained, so maco_group_end visits each op a fixed number of times
 * whatever the number of communicators (tests/bench_group.c states and measures the bound).
 */
typedef struct maco__group {
    int depth;
    int implicit; /* a call outside any group made this one: it speaks as that call */
    int ncalls;   /* calls seen by the group, numbered from 1 (failed and empty ones too) */
    maco__group_op_t *ops;
    int nops, cap;
    maco__group_member_t *members; /* in the order each communicator first appeared */
    int nmembers, members_cap;
    int *slots; /* the hash table: 1 + index into members, 0 when empty; nslots a power of 2 */
    int nslots;
    maco_status_t failed; /* the first call that failed its checks */
    int failed_call;
    const char *failed_fn;
    char failed_msg[600];
} maco__group_t;

static _Thread_local maco__group_t maco__grp;

int maco__group_depth(void)
{
    return maco__grp.depth;
}

static void maco__group_clear(maco__group_t *g)
{
    for (int i = 0; i < g->nops; i++)
        free(g->ops[i].msgs);
    free(g->ops);
    g->ops = NULL;
    g->nops = g->cap = 0;
    free(g->members);
    free(g->slots);
    g->members = NULL;
    g->slots = NULL;
    g->nmembers = g->members_cap = g->nslots = 0;
    g->ncalls = 0;
    g->implicit = 0;
    g->failed = MACO_OK;
    g->failed_call = 0;
    g->failed_fn = NULL;
    g->failed_msg[0] = '\0';
}

maco_status_t maco_group_start(void)
{
    maco__group_t *g = &maco__grp;
    if (g->depth >= 1 << 20)
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_COLL,
                           "maco_group_start: groups nested %d deep on this thread; missing "
                           "maco_group_end calls?",
                           g->depth);
    g->depth++;
    return MACO_OK;
}

maco_status_t maco__group_fail(const char *fn, maco_status_t status)
{
    maco__group_t *g = &maco__grp;
    if (g->depth == 0 || status == MACO_OK)
        return status;
    int call = ++g->ncalls;
    if (g->failed == MACO_OK) {
        g->failed = status;
        g->failed_call = call;
        g->failed_fn = fn;
        snprintf(g->failed_msg, sizeof(g->failed_msg), "%s", maco__last_error());
    }
    return status;
}

/* The hash table slot of `comm`: the one that holds it, else the empty one where it goes. */
static int maco__group_slot(const maco__group_t *g, maco_comm_t comm)
{
    uint64_t h = (uint64_t)(uintptr_t)comm * 0x9E3779B97F4A7C15ull; /* Fibonacci hashing */
    int i = (int)(h >> 40) & (g->nslots - 1);
    while (g->slots[i] != 0 && g->members[g->slots[i] - 1].comm != comm)
        i = (i + 1) & (g->nslots - 1);
    return i;
}

/* The index of `comm` among the group's members, or -1. */
static int maco__group_find(const maco__group_t *g, maco_comm_t comm)
{
    return g->nslots == 0 ? -1 : g->slots[maco__group_slot(g, comm)] - 1;
}

/* Adds `comm` (not a member yet) with `stream`: its index, or -1 when out of memory. The
 * table stays at most half full. */
static int maco__group_add_member(maco__group_t *g, maco_comm_t comm, maco_stream_t stream)
{
    if (g->nmembers == g->members_cap) {
        int cap = g->members_cap ? 2 * g->members_cap : 8;
        maco__group_member_t *m =
            (maco__group_member_t *)realloc(g->members, (size_t)cap * sizeof(*m));
        if (m == NULL)
            return -1;
        g->members = m;
        g->members_cap = cap;
    }
    if (2 * (g->nmembers + 1) > g->nslots) {
        int nslots = g->nslots ? 2 * g->nslots : 16;
        int *slots = (int *)calloc((size_t)nslots, sizeof(int));
        if (slots == NULL)
            return -1;
        free(g->slots);
        g->slots = slots;
        g->nslots = nslots;
        for (int k = 0; k < g->nmembers; k++)
            g->slots[maco__group_slot(g, g->members[k].comm)] = k + 1;
    }
    int k = g->nmembers++;
    g->members[k] = (maco__group_member_t){ comm, stream, -1, -1 };
    g->slots[maco__group_slot(g, comm)] = k + 1;
    return k;
}

/* Queues op (its msgs already owned by it); checks the one-stream rule. O(1) amortized. */
static maco_status_t maco__group_push(maco__group_t *g, maco__group_op_t *op)
{
    op->call = ++g->ncalls;
    int m = maco__group_find(g, op->comm);
    if (m >= 0 && g->members[m].stream != op->stream) {
        const maco__group_op_t *first = &g->ops[g->members[m].first];
        free(op->msgs);
        maco_status_t st = maco__comm_record(
            op->comm,
            maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                        "%s: stream %p differs from stream %p of call %d (%s) on "
                        "the same communicator in this group; a group's calls on "
                        "one communicator must use one stream",
                        op->fn, (void *)op->stream, (void *)first->stream, first->call, first->fn));
        g->ncalls--; /* maco__group_fail numbers it */
        return maco__group_fail(op->fn, st);
    }
    int room = g->nops < g->cap;
    if (!room) {
        int cap = g->cap ? 2 * g->cap : 16;
        maco__group_op_t *ops = (maco__group_op_t *)realloc(g->ops, (size_t)cap * sizeof(*ops));
        if (ops != NULL) {
            g->ops = ops;
            g->cap = cap;
            room = 1;
        }
    }
    if (room && m < 0)
        m = maco__group_add_member(g, op->comm, op->stream);
    if (!room || m < 0) {
        free(op->msgs);
        maco_status_t st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL,
                                       "%s: no memory to queue the call in its group", op->fn);
        g->ncalls--;
        return maco__group_fail(op->fn, st);
    }
    int i = g->nops++;
    op->next = -1;
    g->ops[i] = *op;
    maco__group_member_t *mb = &g->members[m];
    if (mb->first < 0)
        mb->first = i;
    else
        g->ops[mb->last].next = i;
    mb->last = i;
    return MACO_OK;
}

maco_status_t maco__group_add_coll(const maco__coll_call_t *c, maco_comm_t comm,
                                   maco_stream_t stream)
{
    maco__group_op_t op;
    memset(&op, 0, sizeof(op));
    op.is_coll = 1;
    op.fn = c->fn;
    op.comm = comm;
    op.stream = stream;
    op.coll = *c;
    return maco__group_push(&maco__grp, &op);
}

maco_status_t maco__group_add_p2p(const char *fn, const maco__p2p_msg_t *msgs, int nmsgs,
                                  maco_comm_t comm, maco_stream_t stream)
{
    maco__group_t *g = &maco__grp;
    int implicit = g->depth == 0;
    if (implicit) {
        maco_group_start();
        g->implicit = 1;
    }
    maco__group_op_t op;
    memset(&op, 0, sizeof(op));
    op.fn = fn;
    op.comm = comm;
    op.stream = stream;
    if (nmsgs > 0) {
        op.msgs = (maco__p2p_msg_t *)malloc((size_t)nmsgs * sizeof(*msgs));
        if (op.msgs == NULL) {
            maco_status_t st = maco__group_fail(
                fn, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "%s: no memory", fn));
            if (implicit) {
                g->depth = 0;
                maco__group_clear(g);
            }
            return st;
        }
        memcpy(op.msgs, msgs, (size_t)nmsgs * sizeof(*msgs));
        op.nmsgs = nmsgs;
    }
    maco_status_t st = maco__group_push(g, &op);
    for (int i = 0; st == MACO_OK && i < nmsgs; i++) {
        g->ops[g->nops - 1].msgs[i].call = g->ops[g->nops - 1].call;
        g->ops[g->nops - 1].msgs[i].fn = fn;
    }
    if (!implicit)
        return st;
    maco_status_t end = maco_group_end();
    return st != MACO_OK ? st : end;
}

/* What the end of a group found for one communicator. */
typedef struct maco__group_comm {
    maco_comm_t comm;
    maco_stream_t stream;
    maco__coll_t *coll;
    int has_p2p;
    maco__p2p_plan_t plan; /* pairs inside this node, peers by local index */
    maco__p2p_plan_t
        internode_plan; /* pairs with ranks of other nodes, peers by rank (internode.c) */
} maco__group_comm_t;

/* The p2p kernel's arguments for `plan` on this communicator, and its launch. */
static maco_status_t maco__group_launch_p2p(maco_comm_t comm, maco__coll_t *c,
                                            const maco__p2p_plan_t *plan, maco_stream_t stream,
                                            const char *prefix)
{
    if (plan->npairs == 0)
        return MACO_OK;
    maco__p2p_args_t a;
    memset(&a, 0, sizeof(a));
    a.plan = *plan;
    a.buf = c->buf;
    for (int r = 0; r < c->local_nranks; r++) /* the node's view: plans name peers by local index */
        a.peer_buf[r] = c->peer_buf[r];
    a.chans = c->p2p_channels;
    a.bound = comm->bound;
    const maco__coll_layout_t *l = &c->layout;
    a.ctr_offset = l->p2p_ctr_offset;
    a.hdr_offset = l->p2p_hdr_offset;
    a.ll_offset = l->p2p_ll_offset;
    a.cp_offset = l->p2p_cp_offset;
    a.cp_slot_bytes = l->p2p_cp_slot_bytes;
    a.chunk = l->p2p_chunk;
    a.rank = c->local_index;
    a.nranks = c->local_nranks;
    a.lanes = l->p2p_lanes;
    a.lanes_used = 1;
    for (int i = 0; i < plan->nops; i++) {
        int used = (int)maco__p2p_msg_lanes(plan->ops[i].bytes, (uint32_t)a.lanes);
        a.lanes_used = used > a.lanes_used ? used : a.lanes_used;
    }
    /* Every item may wait on a peer: at most the co-resident CTAs (comm_internal.h), and
     * the cap of maco_collective_set_max_ctas. */
    int items = plan->npairs * a.lanes_used;
    int cap = maco__coll_ctas(comm, c);
    int blocks = items < cap ? items : cap;
    if (blocks < 1)
        blocks = 1;
    cudaError_t cerr = maco__launch_p2p(&a, blocks, MACO__P2P_LAUNCH_THREADS, (cudaStream_t)stream);
    if (cerr != cudaSuccess)
        return maco__comm_record(comm,
                                 maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                             "%slaunching the send/recv kernel (%d ops, "
                                             "%d CTAs) failed: %s (%s)",
                                             prefix, plan->nops, blocks, cudaGetErrorName(cerr),
                                             cudaGetErrorString(cerr)));
    c->last_ctas = blocks;
    MACO_TRACE(MACO_SUBSYS_COLL, "%ssend/recv kernel: %d pairs, %d ops, %d CTAs", prefix,
               plan->npairs, plan->nops, blocks);
    return MACO_OK;
}

/*
 * In-place sends (MACO__P2P_FLAG_STAGE, p2p_plan.h). The send/recv kernel runs every message
 * of the group at once and stages chunks through the receiver's buffer, so a receive may
 * write bytes of this rank's buffer before a send of the same group has read them (in-place
 * sendrecv: send X to rank r + 1, receive into X from rank r - 1). Each such send's bytes
 * are first copied, on the launch's stream, into one stream-ordered temporary
 * (cudaMallocAsync from the device's default pool), and its op reads the copy: the send
 * carries the contents from before the group, the receive writes the new ones. The caller
 * frees the temporary with cudaFreeAsync on the same stream after the launches. All of it is
 * stream-ordered, so a CUDA graph captures it (allocation, copy and free nodes). Each copy
 * keeps its source's address modulo 16 (the kernel's copies move 16-byte words when both
 * sides are equally aligned). The cost: one device-to-device copy of each in-place send.
 * Runs with the communicator's device current. *temp_p: the temporary, NULL when no op is
 * staged (or on error: nothing stays allocated).
 */
static maco_status_t maco__group_stage(maco__group_comm_t *gc, const char *prefix, void **temp_p)
{
    *temp_p = NULL;
    cudaStream_t stream = (cudaStream_t)gc->stream;
    maco__p2p_plan_t *plans[2] = { &gc->plan, &gc->internode_plan };
    /* The staged ops, in plan order, and where each goes in the temporary. */
    maco__p2p_op_t *ops[2 * MACO__P2P_MAX_OPS];
    uint64_t offs[2 * MACO__P2P_MAX_OPS];
    int n = 0;
    uint64_t total = 0;
    for (int i = 0; i < 2; i++) {
        const maco__p2p_plan_t *p = plans[i];
        for (int k = 0; k < p->npairs; k++) {
            for (int o = p->pair_first[k]; o < p->pair_first[k] + p->pair_nops[k]; o++) {
                if (!(p->op_flags[o] & MACO__P2P_FLAG_STAGE) || p->ops[o].bytes == 0)
                    continue;
                ops[n] = &plans[i]->ops[o];
                offs[n] = (total + 15) / 16 * 16 + ((uintptr_t)p->ops[o].src & 15u);
                total = offs[n] + p->ops[o].bytes;
                n++;
            }
        }
    }
    if (n == 0)
        return MACO_OK;
    char *temp = NULL;
    cudaError_t e = cudaMallocAsync((void **)&temp, (size_t)total, stream);
    if (e != cudaSuccess)
        return maco__comm_record(
            gc->comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                  "%sthe group's %d in-place send(s) (send buffers that overlap a "
                                  "receive buffer) need a %llu-byte copy on device %d, and "
                                  "cudaMallocAsync failed: %s (%s)",
                                  prefix, n, (unsigned long long)total, gc->comm->cuda_device,
                                  cudaGetErrorName(e), cudaGetErrorString(e)));
    for (int j = 0; j < n; j++) {
        e = cudaMemcpyAsync(temp + offs[j], ops[j]->src, (size_t)ops[j]->bytes, cudaMemcpyDefault,
                            stream);
        if (e != cudaSuccess) {
            cudaFreeAsync(temp, stream);
            return maco__comm_record(
                gc->comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                      "%scopying an in-place send's %llu bytes at %p aside "
                                      "(cudaMemcpyAsync) failed: %s (%s)",
                                      prefix, (unsigned long long)ops[j]->bytes, ops[j]->src,
                                      cudaGetErrorName(e), cudaGetErrorString(e)));
        }
    }
    for (int j = 0; j < n; j++)
        ops[j]->src = temp + offs[j];
    *temp_p = temp;
    return MACO_OK;
}

/* "fn" of the first call on member `k` in a group of one, else "maco_group_end: call N (fn)":
 * how the group's messages about its communicator begin. */
static void maco__group_who(const maco__group_t *g, int k, char *who, size_t cap)
{
    const maco__group_op_t *op = &g->ops[g->members[k].first];
    if (g->implicit)
        snprintf(who, cap, "%s", op->fn);
    else
        snprintf(who, cap, "maco_group_end: call %d (%s)", op->call, op->fn);
}

/* Checks the p2p messages of gc->comm and builds their plan: first what needs no GPU (the
 * plan's checks), then the communicator (GPU, one node, no asynchronous error, forced
 * algorithms); then marks the sends that travel as LL packets. */
static maco_status_t maco__group_plan(maco__group_t *g, int member, maco__group_comm_t *gc,
                                      const char *prefix)
{
    maco_comm_t comm = gc->comm;
    int n = 0, first_call = 0, has_a2a = 0, has_sr = 0;
    const char *first_fn = NULL;
    for (int i = g->members[member].first; i >= 0; i = g->ops[i].next) {
        if (g->ops[i].is_coll || g->ops[i].nmsgs == 0)
            continue;
        if (first_fn == NULL) {
            first_fn = g->ops[i].fn;
            first_call = g->ops[i].call;
        }
        n += g->ops[i].nmsgs;
        for (int k = 0; k < g->ops[i].nmsgs; k++) {
            if ((g->ops[i].msgs[k].flags & 3u) == MACO__P2P_KIND_SENDRECV)
                has_sr = 1;
            else
                has_a2a = 1;
        }
    }
    if (n == 0)
        return MACO_OK;
    gc->has_p2p = 1;
    maco__p2p_msg_t *msgs = (maco__p2p_msg_t *)malloc((size_t)n * sizeof(*msgs));
    if (msgs == NULL)
        return maco__comm_record(comm, maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL,
                                                   "%sno memory for %d messages", prefix, n));
    int m = 0;
    for (int i = g->members[member].first; i >= 0; i = g->ops[i].next) {
        if (g->ops[i].is_coll)
            continue;
        for (int k = 0; k < g->ops[i].nmsgs; k++)
            msgs[m++] = g->ops[i].msgs[k];
    }
    char why[700];
    int bad_call = 0;
    maco_status_t st = maco__p2p_plan_build(msgs, n, comm->rank, comm->nranks, &gc->plan, &bad_call,
                                            why, sizeof(why));
    free(msgs);
    if (st != MACO_OK) {
        /* Outside a group, "call 1 (maco_send): ..." reads better as "maco_send: ...". */
        const char *text = why;
        char head[64];
        snprintf(head, sizeof(head), "call 1 (%s): ", first_fn);
        if (g->implicit && strncmp(why, head, strlen(head)) == 0)
            text = why + strlen(head);
        return maco__comm_record(comm, maco__error(st, MACO_SUBSYS_COLL, "%s%s%s%s", prefix,
                                                   g->implicit ? first_fn : "",
                                                   g->implicit ? ": " : "", text));
    }
    maco__coll_t *c = NULL;
    st = maco__coll_require(comm, first_fn, &c);
    if (st != MACO_OK)
        return st;
    maco_status_t async_st = maco__comm_async_status(comm); /* no context query: hot path */
    if (async_st != MACO_OK) {
        char who[96];
        if (g->implicit)
            snprintf(who, sizeof(who), "%s", first_fn);
        else
            snprintf(who, sizeof(who), "maco_group_end: call %d (%s)", first_call, first_fn);
        return maco__comm_refuse(comm, who, async_st, MACO_SUBSYS_COLL);
    }
    /* An unknown forced name (MACO_ALGO_ALLTOALL, MACO_ALGO_SENDRECV) is refused here. */
    int kernel;
    if (has_sr && (st = maco__coll_select(comm, c, MACO_COLL_SENDRECV, 1, 1, &kernel)) != MACO_OK)
        return maco__comm_record(comm, st);
    if (has_a2a && (st = maco__coll_select(comm, c, MACO_COLL_ALLTOALL, 1, 1, &kernel)) != MACO_OK)
        return maco__comm_record(comm, st);
    gc->coll = c;
    /* The kernel names peers by local index (common/state.h); pairs with ranks of other nodes
     * move to their own plan (internode.c), launched after this node's. */
    maco__p2p_plan_t *p = &gc->plan, *internode = &gc->internode_plan;
    const int *local = c->rank_at + (size_t)c->node * (size_t)c->local_nranks;
    memset(internode, 0, sizeof(*internode));
    int kept = 0;
    for (int k = 0; k < p->npairs; k++) {
        int q = p->pair_peer[k], i = 0;
        while (i < c->local_nranks && local[i] != q)
            i++;
        if (i < c->local_nranks) { /* this node (the local pair included) */
            p->pair_peer[kept] = i;
            p->pair_first[kept] = p->pair_first[k];
            p->pair_nops[kept] = p->pair_nops[k];
            p->pair_dir[kept] = p->pair_dir[k];
            kept++;
            continue;
        }
        int x = internode->npairs++;
        internode->pair_peer[x] = q;
        internode->pair_dir[x] = p->pair_dir[k];
        internode->pair_first[x] = (uint16_t)internode->nops;
        internode->pair_nops[x] = p->pair_nops[k];
        for (int o = p->pair_first[k]; o < p->pair_first[k] + p->pair_nops[k]; o++) {
            internode->ops[internode->nops] = p->ops[o];
            internode->op_flags[internode->nops] = p->op_flags[o];
            internode->nops++;
        }
    }
    p->npairs = kept;
    st = maco__p2p_internode_connect(comm, c, internode);
    if (st != MACO_OK) {
        char who[96];
        if (g->implicit)
            snprintf(who, sizeof(who), "%s", first_fn);
        else
            snprintf(who, sizeof(who), "maco_group_end: call %d (%s)", first_call, first_fn);
        char text[400];
        snprintf(text, sizeof(text), "%s", maco__last_error());
        return maco__comm_record(comm, maco__error(st, MACO_SUBSYS_COLL, "%s: %s", who, text));
    }
    /* The senders' choice of mode, per message. */
    for (int k = 0; k < p->npairs; k++) {
        if (p->pair_dir[k] != MACO__P2P_SEND)
            continue;
        for (int o = p->pair_first[k]; o < p->pair_first[k] + p->pair_nops[k]; o++) {
            maco_collective_t kind = (p->op_flags[o] & 3u) == MACO__P2P_KIND_SENDRECV
                                         ? MACO_COLL_SENDRECV
                                         : MACO_COLL_ALLTOALL;
            if (maco__p2p_ll(c, kind, p->ops[o].bytes))
                p->op_flags[o] |= MACO__P2P_FLAG_LL;
        }
    }
    return MACO_OK;
}

/* The group's collectives on member `k`'s communicator, in call order: each prepared (its
 * checks), and with `launch` issued. Stops at the first failure. */
static maco_status_t maco__group_colls(maco__group_t *g, int k, int launch)
{
    maco_status_t st = MACO_OK;
    for (int i = g->members[k].first; i >= 0 && st == MACO_OK; i = g->ops[i].next) {
        maco__group_op_t *op = &g->ops[i];
        if (!op->is_coll)
            continue;
        maco__coll_t *c;
        int kernel;
        st = maco__coll_prepare(&op->coll, op->comm, &c, &kernel);
        if (st == MACO_OK && launch)
            st = maco__coll_launch(&op->coll, op->comm, c, kernel, op->stream);
    }
    return st;
}

maco_status_t maco_group_end(void)
{
    maco__group_t *g = &maco__grp;
    if (g->depth == 0)
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_COLL,
                           "maco_group_end: no group is open on this thread (maco_group_end "
                           "without maco_group_start)");
    if (--g->depth > 0)
        return MACO_OK;
    /* A group of one call (outside maco_group_start) speaks as that call. */
    const char *prefix = g->implicit ? "" : "maco_group_end: ";
    maco_status_t st = MACO_OK;
    maco__group_comm_t *gcs = NULL;
    int ncomms = 0;
    if (g->failed != MACO_OK) {
        st =
            maco__error(g->failed, MACO_SUBSYS_COLL,
                        "maco_group_end: call %d of the group (%s) failed (%s): %s; nothing "
                        "of the group was issued",
                        g->failed_call, g->failed_fn, maco_status_string(g->failed), g->failed_msg);
        goto out;
    }
    if (g->nops == 0)
        goto out;
    gcs = (maco__group_comm_t *)calloc((size_t)g->nmembers, sizeof(*gcs));
    if (gcs == NULL) {
        st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_COLL, "maco_group_end: no memory");
        goto out;
    }
    for (ncomms = 0; ncomms < g->nmembers; ncomms++) { /* gcs[k] is member k */
        gcs[ncomms].comm = g->members[ncomms].comm;
        gcs[ncomms].stream = g->members[ncomms].stream;
    }
    /*
     * One thread may drive the communicators of several GPUs (one process, one communicator
     * per GPU): each communicator's part runs with its device current (cuda_util.h, device
     * scopes), so stream 0 is its device's legacy stream and its kernels land on its GPU;
     * the caller's device is current again afterwards. Nothing in step 2 waits for the
     * device or for a peer: the kernels of one communicator wait for its peers' kernels,
     * which this same thread may launch only afterwards. So everything that could block
     * (peer access, connecting point-to-point pairs across nodes) happens in step 1, before
     * any launch of the group; peers' registrations are mapped by
     * maco_collective_map_registrations only, never here.
     */
    /* 1. Check everything. */
    for (int k = 0; k < ncomms && st == MACO_OK; k++) {
        maco_comm_t comm = gcs[k].comm;
        int saved = -1;
        st = maco__device_enter_status(comm->cuda_device, &saved, "maco_group_end");
        if (st != MACO_OK) {
            maco__comm_record(comm, st);
            break;
        }
        char who[96];
        maco__group_who(g, k, who, sizeof(who));
        st = maco__comm_check_stream(comm, gcs[k].stream, who);
        if (st == MACO_OK)
            st = maco__group_colls(g, k, 0);
        if (st == MACO_OK)
            st = maco__group_plan(g, k, &gcs[k], prefix);
        maco__device_leave(saved);
    }
    /* 2. Issue: per communicator its collectives in call order, then its sends and receives
     * (the in-place sends' copies first). */
    for (int k = 0; k < ncomms && st == MACO_OK; k++) {
        maco__group_comm_t *gc = &gcs[k];
        int saved = -1;
        st = maco__device_enter_status(gc->comm->cuda_device, &saved, "maco_group_end");
        if (st != MACO_OK) {
            maco__comm_record(gc->comm, st);
            break;
        }
        void *temp = NULL;
        st = maco__group_colls(g, k, 1);
        if (st == MACO_OK && gc->has_p2p)
            st = maco__group_stage(gc, prefix, &temp);
        if (st == MACO_OK && gc->has_p2p)
            st = maco__group_launch_p2p(gc->comm, gc->coll, &gc->plan, gc->stream, prefix);
        if (st == MACO_OK && gc->has_p2p)
            st = maco__p2p_internode_launch(gc->comm, gc->coll, &gc->internode_plan, gc->stream,
                                            prefix);
        if (temp != NULL && cudaFreeAsync(temp, (cudaStream_t)gc->stream) != cudaSuccess)
            cudaGetLastError(); /* the launches' own errors are the ones to report */
        maco__device_leave(saved);
    }
out:
    free(gcs);
    maco__group_clear(g);
    return st;
}
