/* comm_ft.c - communicators made from communicators, and surviving failures: split, revoke,
 * shrink (also after ranks died: src/host/bootstrap/agree.c), grow and join (maco/comm.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "maco/comm.h"
#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/comm/comm_internal.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

/* ------------------------------------------------------------------ revoke */

maco_status_t maco_comm_revoke(maco_comm_t comm)
{
    if (comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_revoke: comm is NULL");
    MACO__LOG_RANK_SCOPE(comm->rank);
    int by = maco__bootstrap_revoked_by(comm->bs);
    maco__comm_on_revoke(comm, by >= 0 ? by : comm->rank);
    return maco__bootstrap_revoke(comm->bs);
}

/* ------------------------------------------------------------------ building on a bootstrap */

/* A new communicator over `bs`, which it owns from now on (also on failure: then destroyed). */
static maco_status_t maco__comm_create_owning(maco_bootstrap_t bs, int cuda_device,
                                              maco_comm_t *comm_p)
{
    maco_comm_t comm = NULL;
    maco_status_t st = maco_comm_create(bs, cuda_device, &comm);
    if (st != MACO_OK) {
        maco_bootstrap_destroy(bs);
        return st;
    }
    comm->owns_bootstrap = 1;
    *comm_p = comm;
    return MACO_OK;
}

/* The device a communicator made from `parent` uses: the parent's (never another GPU because
 * the local ranks changed), or -1 when the parent has none. */
static int maco__comm_child_device(maco_comm_t parent)
{
    return parent->cuda_device;
}

/* ------------------------------------------------------------------ split */

maco_status_t maco_comm_split(maco_comm_t comm, int color, int key, maco_comm_t *newcomm_p)
{
    if (comm == NULL || newcomm_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_split: comm and newcomm_p must not be NULL");
    MACO__LOG_RANK_SCOPE(comm->rank);
    int n = comm->nranks, me = comm->rank;
    int32_t *all = (int32_t *)calloc((size_t)n * 2, sizeof(int32_t));
    int *members = (int *)malloc(sizeof(int) * (size_t)n);
    if (all == NULL || members == NULL) {
        free(all);
        free(members);
        return maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_INIT, "maco_comm_split: no memory");
    }
    all[2 * me] = color < 0 ? -1 : color;
    all[2 * me + 1] = key;
    maco_status_t st =
        maco__bootstrap_allgather_tag(comm->bs, MACO__TAG_SPLIT, all, 2 * sizeof(int32_t));
    maco_comm_t child = NULL;
    if (st == MACO_OK && color >= 0) {
        /* Members of this color in (key, rank) order: an insertion sort, stable. */
        int m = 0, my = -1;
        for (int r = 0; r < n; r++) {
            if (all[2 * r] != color)
                continue;
            int j = m++;
            while (j > 0 && all[2 * members[j - 1] + 1] > all[2 * r + 1]) {
                members[j] = members[j - 1];
                j--;
            }
            members[j] = r;
        }
        for (int j = 0; j < m; j++)
            if (members[j] == me)
                my = j;
        /* The first member makes the new bootstrap's id and sends it to the others. */
        maco_unique_id_t id;
        if (my == 0) {
            st = maco_unique_id_create(&id);
            for (int j = 1; j < m && st == MACO_OK; j++)
                st = maco__bootstrap_send(comm->bs, members[j], MACO__TAG_SPLIT, &id, sizeof(id));
        } else {
            st = maco__bootstrap_recv(comm->bs, members[0], MACO__TAG_SPLIT, &id, sizeof(id));
        }
        maco_bootstrap_t bs = NULL;
        if (st == MACO_OK)
            st = maco_bootstrap_create(&id, my, m, -1, &bs);
        if (st == MACO_OK)
            st = maco__comm_create_owning(bs, maco__comm_child_device(comm), &child);
    }
    free(all);
    free(members);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    *newcomm_p = child;
    return MACO_OK;
}

/* ------------------------------------------------------------------ shrink */

typedef struct maco__shrink_ctx {
    int cuda_device;
} maco__shrink_ctx_t;

static maco_status_t maco__shrink_build(void *ctx, maco_bootstrap_t child, void **out_p)
{
    const maco__shrink_ctx_t *c = (const maco__shrink_ctx_t *)ctx;
    maco_comm_t comm = NULL;
    maco_status_t st = maco__comm_create_owning(child, c->cuda_device, &comm);
    if (st == MACO_OK)
        *out_p = comm;
    return st;
}

static void maco__shrink_discard(void *ctx, void *out)
{
    (void)ctx;
    maco_comm_destroy((maco_comm_t)out);
}

maco_status_t maco_comm_shrink(maco_comm_t comm, const int *exclude, int n_exclude, unsigned flags,
                               maco_comm_t *newcomm_p)
{
    if (comm == NULL || newcomm_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_shrink: comm and newcomm_p must not be NULL");
    if ((flags & ~(unsigned)MACO_SHRINK_ABORT) != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_shrink: flags is %#x; only MACO_SHRINK_ABORT (%#x) is "
                           "defined",
                           flags, (unsigned)MACO_SHRINK_ABORT);
    if (n_exclude < 0 || n_exclude > comm->nranks || (exclude == NULL && n_exclude > 0))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_shrink: n_exclude is %d; it must be in [0, %d] (the world "
                           "size), with a list when it is not 0",
                           n_exclude, comm->nranks);
    for (int i = 0; i < n_exclude; i++)
        if (exclude[i] < 0 || exclude[i] >= comm->nranks)
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                               "maco_comm_shrink: exclude[%d] is %d, outside [0, %d)", i,
                               exclude[i], comm->nranks);
    MACO__LOG_RANK_SCOPE(comm->rank);
    if (flags & MACO_SHRINK_ABORT) {
        maco_status_t st = maco_comm_revoke(comm);
        if (st != MACO_OK)
            return st;
    }
    maco__shrink_ctx_t ctx = { maco__comm_child_device(comm) };
    maco__shrink_build_t how = { maco__shrink_build, maco__shrink_discard, &ctx };
    void *out = NULL;
    int new_rank = -1;
    maco_status_t st = maco__bootstrap_shrink(comm->bs, exclude, n_exclude, &how, &out, &new_rank);
    if (st != MACO_OK)
        return st;
    *newcomm_p = (maco_comm_t)out;
    return MACO_OK;
}

/* ------------------------------------------------------------------ grow and join */

/* The wire form of a grow id: a unique id whose reserved bytes say "grow" and the old size. */
enum { MACO__GROW_MARK_AT = 64, MACO__GROW_OLD_AT = 68, MACO__GROW_MARK = 0x574F5247u /*GROW*/ };

maco_status_t maco_comm_get_grow_id(maco_comm_t comm, maco_unique_id_t *id_p)
{
    if (comm == NULL || id_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_get_grow_id: comm and id_p must not be NULL");
    if (comm->rank != 0)
        return maco__error(MACO_ERR_INVALID_USAGE, MACO_SUBSYS_INIT,
                           "maco_comm_get_grow_id: rank %d called it; only rank 0 makes the id "
                           "(it becomes rank 0 of the grown communicator)",
                           comm->rank);
    maco_unique_id_t id;
    maco_status_t st = maco_unique_id_create(&id);
    if (st != MACO_OK)
        return st;
    /* The id's bytes past the address are zero (maco/bootstrap.h): the grow mark goes there,
     * so maco_comm_join can tell the old size and refuse a plain id. */
    maco__put_u32(id.bytes + MACO__GROW_MARK_AT, MACO__GROW_MARK);
    maco__put_u32(id.bytes + MACO__GROW_OLD_AT, (uint32_t)comm->nranks);
    *id_p = id;
    return MACO_OK;
}

/* Reads the old size out of a grow id; MACO_ERR_INVALID_ARGUMENT when it is not one. */
static maco_status_t maco__grow_id_old_size(const maco_unique_id_t *id, const char *fn, int *old_p)
{
    if (maco__get_u32(id->bytes + MACO__GROW_MARK_AT) != MACO__GROW_MARK)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "%s: the id is not a grow id (make it with maco_comm_get_grow_id on "
                           "rank 0 of the communicator)",
                           fn);
    *old_p = (int)maco__get_u32(id->bytes + MACO__GROW_OLD_AT);
    return MACO_OK;
}

maco_status_t maco_comm_grow(maco_comm_t comm, int nranks, const maco_unique_id_t *id,
                             maco_comm_t *newcomm_p)
{
    if (comm == NULL || newcomm_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_grow: comm and newcomm_p must not be NULL");
    MACO__LOG_RANK_SCOPE(comm->rank);
    if (nranks <= comm->nranks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_grow: nranks is %d; it must be more than the communicator's "
                           "%d ranks",
                           nranks, comm->nranks);
    if ((comm->rank == 0) != (id != NULL))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_grow: rank %d passed %s id; rank 0 passes the id from "
                           "maco_comm_get_grow_id, the others NULL",
                           comm->rank, id != NULL ? "an" : "no");
    maco_unique_id_t shared;
    memset(&shared, 0, sizeof(shared));
    maco_status_t st = MACO_OK;
    if (id != NULL) {
        int old = 0;
        st = maco__grow_id_old_size(id, "maco_comm_grow", &old);
        if (st == MACO_OK && old != comm->nranks)
            st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                             "maco_comm_grow: the id was made for a communicator of %d ranks, "
                             "this one has %d",
                             old, comm->nranks);
        if (st != MACO_OK)
            return st;
        shared = *id;
    }
    /* Rank 0 hands the id to the existing ranks; the new ones got it from the application. */
    uint8_t msg[MACO_UNIQUE_ID_BYTES + 4];
    memcpy(msg, shared.bytes, MACO_UNIQUE_ID_BYTES);
    maco__put_u32(msg + MACO_UNIQUE_ID_BYTES, (uint32_t)nranks);
    if (comm->nranks > 1) {
        if (comm->rank == 0) {
            for (int r = 1; r < comm->nranks && st == MACO_OK; r++)
                st = maco__bootstrap_send(comm->bs, r, MACO__TAG_GROW, msg, sizeof(msg));
        } else {
            st = maco__bootstrap_recv(comm->bs, 0, MACO__TAG_GROW, msg, sizeof(msg));
            if (st == MACO_OK && (int)maco__get_u32(msg + MACO_UNIQUE_ID_BYTES) != nranks)
                st = maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                                 "maco_comm_grow: rank %d asked for %d ranks, rank 0 for %u",
                                 comm->rank, nranks,
                                 (unsigned)maco__get_u32(msg + MACO_UNIQUE_ID_BYTES));
            memcpy(shared.bytes, msg, MACO_UNIQUE_ID_BYTES);
        }
    }
    maco_bootstrap_t bs = NULL;
    if (st == MACO_OK)
        st = maco_bootstrap_create(&shared, comm->rank, nranks, -1, &bs);
    maco_comm_t child = NULL;
    if (st == MACO_OK)
        st = maco__comm_create_owning(bs, maco__comm_child_device(comm), &child);
    if (st != MACO_OK)
        return maco__comm_record(comm, st);
    *newcomm_p = child;
    return MACO_OK;
}

maco_status_t maco_comm_join(const maco_unique_id_t *id, int rank, int nranks, int cuda_device,
                             maco_comm_t *newcomm_p)
{
    if (id == NULL || newcomm_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_join: id and newcomm_p must not be NULL");
    int old = 0;
    maco_status_t st = maco__grow_id_old_size(id, "maco_comm_join", &old);
    if (st != MACO_OK)
        return st;
    if (rank < old || rank >= nranks)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_join: rank %d is outside [%d, %d): the communicator had %d "
                           "ranks and grows to %d; new ranks take the ranks from %d",
                           rank, old, nranks, old, nranks, old);
    if (cuda_device < -1)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_comm_join: cuda_device is %d; use -1 or a device index",
                           cuda_device);
    MACO__LOG_RANK_SCOPE(rank);
    maco_bootstrap_t bs = NULL;
    st = maco_bootstrap_create(id, rank, nranks, -1, &bs);
    if (st != MACO_OK)
        return st;
    return maco__comm_create_owning(bs, cuda_device, newcomm_p);
}
