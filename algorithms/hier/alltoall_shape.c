/*
 * alltoall_shape.c - the shape of a hierarchical all-to-all (hier.h: pieces, segments, CTAs),
 * which every rank computes alike. Pure: no CUDA, no logging, so the CPU tests call it.
 */
#include <string.h>

#include "algorithms/hier/hier.h"
#include "algorithms/tuning.h"

int maco__hier_a2a_shape(uint64_t count, uint64_t esz, int local_ranks, uint64_t region_bytes,
                         int slots, maco__hier_a2a_shape_t *shape_p)
{
    if (count == 0 || (esz != 1 && esz != 2 && esz != 4 && esz != 8) || local_ranks < 1 ||
        slots < 1 || region_bytes < 16 * (uint64_t)local_ranks)
        return 0;
    const uint64_t word = 16 / esz; /* elements per 16-byte word */
    const uint64_t pmax = region_bytes / (uint64_t)local_ranks / 16 * word;
    uint64_t p = (count + (uint64_t)slots - 1) / (uint64_t)slots;
    const uint64_t pmin =
        (uint64_t)MACO__TUNING_HIER_ALLTOALL_RAIL_MESSAGE_MIN / (uint64_t)local_ranks / esz;
    if (p < pmin)
        p = pmin;
    p = (p + word - 1) / word * word;
    if (p > pmax)
        p = pmax;
    maco__hier_a2a_shape_t s;
    memset(&s, 0, sizeof(s));
    s.piece = p;
    s.nseg = (count + p - 1) / p;
    s.msg_bytes = (uint64_t)local_ranks * p * esz;
    s.blocks = s.nseg < (uint64_t)slots ? (int32_t)s.nseg : (int32_t)slots;
    *shape_p = s;
    return 1;
}
