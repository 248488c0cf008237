/*
 * collectives.c - the collectives' public calls and their argument checks; a checked call
 * goes to group.c (inside maco_group_start/end) or straight to launch.c.
 */
#include "maco/collectives.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "algorithms/collectives/collectives.h"
#include "algorithms/common/group.h"
#include "algorithms/common/registry.h"
#include "algorithms/common/select.h"
#include "src/host/base/config.h"
#include "src/host/cuda/cuda_util.h"
#include "src/host/base/log.h"

/* True when [a, a+na) and [b, b+nb) share a byte. */
static int maco__overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na > 0 && nb > 0 && x < y + nb && y < x + na;
}

static maco_status_t maco__check(const maco__coll_call_t *c, maco_comm_t comm)
{
    if (comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: comm is NULL", c->fn);
    if ((unsigned)c->datatype >= MACO_DATATYPE_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: datatype %d is outside [0, %d)", c->fn, (int)c->datatype,
                           MACO_DATATYPE_COUNT);
    if ((unsigned)c->op >= MACO_REDOP_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: op %d is outside [0, %d)", c->fn, (int)c->op, MACO_REDOP_COUNT);
    int n = comm->nranks, me = comm->rank;
    if ((c->coll == MACO_COLL_BROADCAST || c->coll == MACO_COLL_REDUCE) &&
        (c->root < 0 || c->root >= n))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: root %d is outside [0, %d) (the number of ranks)", c->fn, c->root,
                           n);
    size_t esz = maco_datatype_size(c->datatype);
    /* allgather's receive and reduce-scatter's send buffer hold nranks units. */
    size_t mult =
        c->coll == MACO_COLL_ALLGATHER || c->coll == MACO_COLL_REDUCE_SCATTER ? (size_t)n : 1;
    if (c->count > SIZE_MAX / esz / mult)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: count %zu of %s%s overflows a byte size", c->fn, c->count,
                           maco_datatype_name(c->datatype), mult > 1 ? " times nranks" : "");
    if (c->count == 0)
        return MACO_OK;
    size_t unit = c->count * esz;
    size_t send_bytes = c->coll == MACO_COLL_REDUCE_SCATTER ? unit * mult : unit;
    size_t recv_bytes = c->coll == MACO_COLL_ALLGATHER ? unit * mult : unit;
    int send_used = c->coll != MACO_COLL_BROADCAST || me == c->root;
    int recv_used = c->coll != MACO_COLL_REDUCE || me == c->root;
    if (send_used && c->send == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: sendbuf is NULL with count %zu", c->fn, c->count);
    if (recv_used && c->recv == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: recvbuf is NULL with count %zu", c->fn, c->count);
    if (!send_used || !recv_used)
        return MACO_OK;
    /* In place is one exact placement; any other overlap would read data already
     * overwritten. */
    const char *inplace_send = (const char *)c->recv;
    if (c->coll == MACO_COLL_ALLGATHER)
        inplace_send = (const char *)c->recv + (size_t)me * unit;
    else if (c->coll == MACO_COLL_REDUCE_SCATTER)
        inplace_send = (const char *)c->recv - (size_t)me * unit;
    if (c->send != (const void *)inplace_send &&
        maco__overlap(c->send, send_bytes, c->recv, recv_bytes))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "%s: sendbuf %p (%zu bytes) and recvbuf %p (%zu bytes) overlap but "
                           "are not in place (in place is sendbuf == %p)",
                           c->fn, c->send, send_bytes, c->recv, recv_bytes,
                           (const void *)inplace_send);
    return MACO_OK;
}

static maco_status_t maco__collective(const maco__coll_call_t *c, maco_comm_t comm,
                                      maco_stream_t stream)
{
    maco_status_t st = maco__check(c, comm);
    if (st != MACO_OK) {
        maco__comm_record(comm, st);
        return maco__group_depth() > 0 ? maco__group_fail(c->fn, st) : st;
    }
    if (maco__group_depth() > 0)
        return maco__group_add_coll(c, comm, stream);
    maco__coll_t *coll_state = NULL;
    int kernel = -1;
    st = maco__coll_prepare(c, comm, &coll_state, &kernel);
    if (st == MACO_OK && c->count > 0)
        st = maco__comm_check_stream(comm, stream, c->fn);
    if (st != MACO_OK)
        return st;
    return maco__coll_launch(c, comm, coll_state, kernel, stream);
}

maco_status_t maco_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                             maco_datatype_t datatype, maco_redop_t op, maco_comm_t comm,
                             maco_stream_t stream)
{
    maco__coll_call_t c = {
        MACO_COLL_ALLREDUCE, "maco_allreduce", sendbuf, recvbuf, count, datatype, op, 0
    };
    return maco__collective(&c, comm, stream);
}

maco_status_t maco_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                             maco_datatype_t datatype, maco_comm_t comm, maco_stream_t stream)
{
    maco__coll_call_t c = { MACO_COLL_ALLGATHER, "maco_allgather", sendbuf,  recvbuf,
                            sendcount,           datatype,         MACO_SUM, 0 };
    return maco__collective(&c, comm, stream);
}

maco_status_t maco_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                  maco_datatype_t datatype, maco_redop_t op, maco_comm_t comm,
                                  maco_stream_t stream)
{
    maco__coll_call_t c = { MACO_COLL_REDUCE_SCATTER,
                            "maco_reduce_scatter",
                            sendbuf,
                            recvbuf,
                            recvcount,
                            datatype,
                            op,
                            0 };
    return maco__collective(&c, comm, stream);
}

maco_status_t maco_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                             maco_datatype_t datatype, int root, maco_comm_t comm,
                             maco_stream_t stream)
{
    maco__coll_call_t c = {
        MACO_COLL_BROADCAST, "maco_broadcast", sendbuf, recvbuf, count, datatype, MACO_SUM, root
    };
    return maco__collective(&c, comm, stream);
}

maco_status_t maco_reduce(const void *sendbuf, void *recvbuf, size_t count,
                          maco_datatype_t datatype, maco_redop_t op, int root, maco_comm_t comm,
                          maco_stream_t stream)
{
    maco__coll_call_t c = {
        MACO_COLL_REDUCE, "maco_reduce", sendbuf, recvbuf, count, datatype, op, root
    };
    return maco__collective(&c, comm, stream);
}

maco_status_t maco_collective_get_stats(maco_comm_t comm, maco_collective_stats_t *stats_p)
{
    if (comm == NULL || stats_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_collective_get_stats: comm and stats_p must not be NULL");
    maco__coll_t *coll = NULL;
    maco_status_t st = maco__coll_require(comm, "maco_collective_get_stats", &coll);
    if (st != MACO_OK)
        return st;
    unsigned long long v[2];
    int prev = -1;
    cudaError_t cerr = cudaGetDevice(&prev);
    if (cerr == cudaSuccess)
        cerr = cudaSetDevice(comm->cuda_device);
    if (cerr == cudaSuccess)
        cerr = cudaDeviceSynchronize();
    if (cerr == cudaSuccess)
        cerr = cudaMemcpy(v, coll->buf + MACO__CTR_INPLACE, sizeof(v), cudaMemcpyDeviceToHost);
    if (prev >= 0)
        cudaSetDevice(prev); /* the caller's device, as it was */
    if (cerr != cudaSuccess)
        return maco__comm_record(comm, maco__error(MACO_ERR_CUDA, MACO_SUBSYS_COLL,
                                                   "maco_collective_get_stats: %s",
                                                   cudaGetErrorString(cerr)));
    stats_p->inplace_launches = v[0];
    stats_p->scratch_launches = v[1];
    stats_p->last_launch_ctas = coll->last_ctas;
    return MACO_OK;
}

maco_status_t maco_collective_map_registrations(maco_comm_t comm)
{
    const char *fn = "maco_collective_map_registrations";
    if (comm == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: comm is NULL", fn);
    if (comm->nranks == 1)
        return MACO_OK; /* no peers */
    maco__coll_t *c = NULL;
    maco_status_t st = maco__coll_require(comm, fn, &c);
    if (st != MACO_OK)
        return st;
    int saved = -1;
    st = maco__device_enter_status(comm->cuda_device, &saved, fn);
    if (st == MACO_OK) {
        /* A registration that did not map leaves the communicator usable (its calls use
         * scratch): the status goes to the caller, not into the communicator's first error. */
        st = maco__registry_map(comm);
        maco__device_leave(saved);
    }
    return st;
}

maco_status_t maco_allreduce_get_algorithm(maco_comm_t comm, size_t count, maco_datatype_t datatype,
                                           const char **name_p)
{
    return maco_collective_get_algorithm(comm, MACO_COLL_ALLREDUCE, count, datatype, name_p);
}

maco_status_t maco_collective_get_algorithm(maco_comm_t comm, maco_collective_t coll, size_t count,
                                            maco_datatype_t datatype, const char **name_p)
{
    if (comm == NULL || name_p == NULL || (unsigned)datatype >= MACO_DATATYPE_COUNT ||
        (unsigned)coll >= MACO_COLLECTIVE_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_collective_get_algorithm: NULL comm or name_p, or collective "
                           "%d / datatype %d out of range",
                           (int)coll, (int)datatype);
    if (comm->nranks == 1) {
        *name_p = "copy";
        return MACO_OK;
    }
    maco__coll_t *c = NULL;
    maco_status_t st = maco__coll_require(comm, "maco_collective_get_algorithm", &c);
    if (st != MACO_OK)
        return st;
    if (c->plans[coll] != NULL) { /* MACO_ALGO_<COLLECTIVE>=plan:FILE */
        *name_p = "plan";
        return MACO_OK;
    }
    int kernel;
    st = maco__coll_select(comm, c, coll, count, maco_datatype_size(datatype), &kernel);
    if (st != MACO_OK)
        return st;
    *name_p = maco__coll_algorithm(coll, kernel);
    return MACO_OK;
}

maco_status_t maco_collective_set_algorithm(maco_comm_t comm, maco_collective_t coll,
                                            const char *name)
{
    if (comm == NULL || (unsigned)coll >= MACO_COLLECTIVE_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL,
                           "maco_collective_set_algorithm: comm is NULL or collective %d is "
                           "outside [0, %d)",
                           (int)coll, MACO_COLLECTIVE_COUNT);
    maco__coll_t *c = NULL;
    maco_status_t st = maco__coll_require(comm, "maco_collective_set_algorithm", &c);
    if (st != MACO_OK)
        return st;
    if (name == NULL || name[0] == '\0') {
        c->forced[coll][0] = '\0';
        return MACO_OK;
    }
    for (int k = 0; k <= MACO__KERNEL_HIER; k++) {
        const char *algo = maco__coll_algorithm(coll, k);
        if (strcmp(algo, "?") != 0 && strcasecmp(name, algo) == 0) {
            snprintf(c->forced[coll], sizeof(c->forced[coll]), "%s", algo);
            return MACO_OK;
        }
    }
    const char *third = maco__coll_algorithm(coll, 2), *fourth = maco__coll_algorithm(coll, 3);
    int has_third = strcmp(third, "?") != 0, has_fourth = strcmp(fourth, "?") != 0;
    return maco__comm_record(
        comm,
        maco__error(MACO_ERR_UNSUPPORTED, MACO_SUBSYS_COLL,
                    "maco_collective_set_algorithm: '%s' is not a %s algorithm: use %s, "
                    "%s%s%s%s%s (or NULL for the choice by size)",
                    name, maco__coll_name(coll), maco__coll_algorithm(coll, 0),
                    maco__coll_algorithm(coll, 1), has_third ? ", " : "", has_third ? third : "",
                    has_fourth ? " or " : "", has_fourth ? fourth : ""));
}

maco_status_t maco_collective_set_max_ctas(maco_comm_t comm, int max_ctas)
{
    const char *fn = "maco_collective_set_max_ctas";
    if (comm == NULL || max_ctas < 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: %s", fn,
                           comm == NULL ? "comm is NULL" : "max_ctas is negative");
    maco__coll_t *c = NULL;
    maco_status_t st = maco__coll_require(comm, fn, &c);
    if (st != MACO_OK)
        return st;
    return maco__coll_agree_max_ctas(comm, c, max_ctas, fn);
}

/* The two CTA getters: checks `comm` and `out_p` (named `out_name`), then *out_p = the cap
 * (last = 0) or the last launch's CTAs (last = 1). */
static maco_status_t maco__coll_get_ctas(maco_comm_t comm, const char *fn, const char *out_name,
                                         int *out_p, int last)
{
    if (comm == NULL || out_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_COLL, "%s: %s is NULL", fn,
                           comm == NULL ? "comm" : out_name);
    maco__coll_t *c = NULL;
    maco_status_t st = maco__coll_require(comm, fn, &c);
    if (st == MACO_OK)
        *out_p = last ? c->last_ctas : c->max_ctas;
    return st;
}

maco_status_t maco_collective_get_max_ctas(maco_comm_t comm, int *max_ctas_p)
{
    return maco__coll_get_ctas(comm, "maco_collective_get_max_ctas", "max_ctas_p", max_ctas_p, 0);
}

maco_status_t maco_collective_get_last_ctas(maco_comm_t comm, int *ctas_p)
{
    return maco__coll_get_ctas(comm, "maco_collective_get_last_ctas", "ctas_p", ctas_p, 1);
}
