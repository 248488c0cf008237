/* types.c - the element types, reduction ops and collectives by name and size (public,
 * maco/collectives.h). A leaf of algorithms/: it calls nothing. */
#include "maco/collectives.h"

size_t maco_datatype_size(maco_datatype_t datatype)
{
    static const size_t sizes[MACO_DATATYPE_COUNT] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1 };
    return (unsigned)datatype < MACO_DATATYPE_COUNT ? sizes[datatype] : 0;
}

const char *maco_datatype_name(maco_datatype_t datatype)
{
    static const char *names[MACO_DATATYPE_COUNT] = {
        "int8",    "uint8",    "int32",   "uint32",  "int64",    "uint64",
        "float16", "bfloat16", "float32", "float64", "fp8_e4m3", "fp8_e5m2"
    };
    return (unsigned)datatype < MACO_DATATYPE_COUNT ? names[datatype] : "unknown";
}

const char *maco_redop_name(maco_redop_t op)
{
    static const char *names[MACO_REDOP_COUNT] = { "sum", "prod", "min", "max", "avg" };
    return (unsigned)op < MACO_REDOP_COUNT ? names[op] : "unknown";
}

const char *maco_collective_name(maco_collective_t coll)
{
    static const char *names[MACO_COLLECTIVE_COUNT] = { "allreduce", "allgather", "reduce_scatter",
                                                        "broadcast", "reduce",    "alltoall",
                                                        "sendrecv" };
    return (unsigned)coll < MACO_COLLECTIVE_COUNT ? names[coll] : "unknown";
}
