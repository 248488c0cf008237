/* transport_ib.c - placeholder until the verbs transport lands: IB is never offered. */
#include <stdio.h>

#include "proxy_internal.h"

static int maco__ib_available(maco_comm_t comm, int peer, char *why, size_t cap)
{
    snprintf(why, cap, "the IB transport is not built in this version");
    return 0;
}

const maco__transport_ops_t maco__transport_ib_ops = {
    .size = sizeof(maco__transport_ops_t),
    .name = "IB verbs",
    .available = maco__ib_available,
};
