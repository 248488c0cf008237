/*
 * plan_internal.h - execution plans (docs/plan-format.md): the parsed form, the parser
 * (plan_json.c), the verifier (plan_verify.c) and the executor's host side (plan_exec.c).
 */
#ifndef MACO_PLAN_INTERNAL_H
#define MACO_PLAN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "maco/collectives.h"
#include "maco/plan.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MACO__PLAN_MAGIC "MACO-PLAN"
enum {
    MACO__PLAN_VERSION = 1,
    MACO__PLAN_MAX_RANKS = 64,
    MACO__PLAN_MAX_PARTS = 1024,
    MACO__PLAN_MAX_SCRATCH = 4096,
    MACO__PLAN_MAX_CHANNELS = 1024, /* per rank */
    MACO__PLAN_MAX_TBS = 64,        /* per rank */
    MACO__PLAN_MAX_OPS = 4096,      /* per thread block */
    MACO__PLAN_MAX_SRCS = 64,       /* per reduce */
    MACO__PLAN_MAX_INDEX = 65535,
};

/* Buffers, as numbered in ops (and in the executor's per-rank plan buffer). */
enum { MACO__PBUF_INPUT = 0, MACO__PBUF_OUTPUT = 1, MACO__PBUF_SCRATCH = 2, MACO__PBUF_COUNT };

enum { MACO__PCHAN_MEMORY = 0, MACO__PCHAN_PORT = 1 };

/* Operations. The order is part of nothing outside this process. */
typedef enum maco__plan_opcode {
    MACO__POP_SIGNAL,
    MACO__POP_WAIT,
    MACO__POP_FLUSH,
    MACO__POP_PUT,
    MACO__POP_GET,
    MACO__POP_PUT_WITH_SIGNAL,
    MACO__POP_PUT_WITH_SIGNAL_AND_FLUSH,
    MACO__POP_PUT_PACKETS,
    MACO__POP_READ_PUT_PACKETS,
    MACO__POP_COPY,
    MACO__POP_REDUCE,
    MACO__POP_COUNT
} maco__plan_opcode_t;

/** The op's name as the plan spells it ("put_with_signal"). */
const char *maco__plan_op_name(int code);
/** "input", "output", "scratch". */
const char *maco__plan_buffer_name(int buffer);

/* `count` chunks of `buffer` from `index`; on the channel's peer when channel >= 0 (a
 * reduce's remote source), as LL packets when packets (scratch only). */
typedef struct maco__plan_ref {
    uint8_t buffer;
    uint8_t packets;
    int16_t channel; /* -1: this rank */
    uint32_t index, count;
} maco__plan_ref_t;

typedef struct maco__plan_op {
    uint8_t code;    /* maco__plan_opcode_t */
    int16_t channel; /* -1: none (copy, reduce) */
    uint16_t nsrcs;  /* reduce: srcs; copy, put...: 1 (srcs[0] = src); signal...: 0 */
    int32_t part0;   /* set by the verifier: the part the data of the first chunk has */
    maco__plan_ref_t dst;
    maco__plan_ref_t *srcs; /* into the plan's ref pool */
} maco__plan_op_t;

typedef struct maco__plan_tb {
    int nops;
    maco__plan_op_t *ops;
} maco__plan_tb_t;

typedef struct maco__plan_channel {
    uint8_t type; /* MACO__PCHAN_* */
    int32_t peer;
} maco__plan_channel_t;

typedef struct maco__plan_rank {
    int nchannels, ntbs;
    maco__plan_channel_t *channels;
    maco__plan_tb_t *tbs;
} maco__plan_rank_t;

/* A parsed plan; every array belongs to it (maco__plan_desc_free). */
typedef struct maco__plan_desc {
    char name[64];
    maco_collective_t coll; /* ALLREDUCE, ALLGATHER or REDUCE_SCATTER */
    int world_size, ranks_per_node;
    int parts;          /* the unit count is cut into this many parts */
    int scratch_chunks; /* per rank */
    maco__plan_rank_t *ranks;
    maco__plan_ref_t *ref_pool;
    size_t nrefs;
} maco__plan_desc_t;

/** Chunks of `buffer` on every rank: input/output = units * parts, scratch = scratch_chunks. */
uint32_t maco__plan_chunks(const maco__plan_desc_t *d, int buffer);

/*
 * Element range of chunk `index` of an input or output buffer for a unit count `count`:
 * segment s = index / parts, part p = index % parts; offset s * count + floor(p * count /
 * parts), size floor((p + 1) * count / parts) - floor(p * count / parts). Scratch chunk j
 * is a slot of maco__plan_scratch_slot() bytes at j times that.
 */
void maco__plan_chunk_range(const maco__plan_desc_t *d, uint32_t index, uint64_t count,
                            uint64_t *offset_p, uint64_t *elems_p);
/** Bytes of one scratch slot for `count` elements of `esz` bytes: the largest part as LL16
 * packets (16 bytes per 8 payload bytes), rounded up to 16. */
uint64_t maco__plan_scratch_slot(const maco__plan_desc_t *d, uint64_t count, uint64_t esz);

/*
 * Parses plan text (JSON) into *desc_p. On a malformed plan returns
 * MACO_ERR_INVALID_ARGUMENT with a message naming the JSON path and the limit in why[]
 * (logged by nobody: callers decide); MACO_ERR_UNSUPPORTED when the JSON library cannot be
 * loaded (MACO_JSON_LIBRARY); MACO_ERR_NO_MEMORY. `origin` names the text in messages.
 */
maco_status_t maco__plan_parse(const char *text, size_t len, const char *origin,
                               maco__plan_desc_t **desc_p, char *why, size_t cap);
/** Reads a whole file (at most 64 MiB) into a NUL-terminated buffer (free()). */
maco_status_t maco__plan_read_file(const char *path, char **text_p, size_t *len_p, char *why,
                                   size_t cap);
void maco__plan_desc_free(maco__plan_desc_t *d);

/*
 * The verifier (plan_verify.c has the method): writes one line per problem, at most `cap`
 * bytes in all (truncated with "..."), into report, and returns the number of problems (0:
 * the plan is correct), -1 when it ran out of memory, or -2 when the plan is too large to check
 * (its clocks and values would need more than 1 GiB, or more than MACO__VERIFY_MAX_STEPS steps:
 * the report says which).
 * On success every data op's part0 is set (the executor sizes scratch-only moves by it).
 */
int maco__plan_verify(maco__plan_desc_t *d, char *report, size_t cap);

/** The collective a loaded plan computes (plan_exec.c). */
maco_collective_t maco__plan_collective(maco_plan_t plan);

/* ---- plan_forced.c, for the collectives' setup (algorithms/common/setup.c) */

struct maco__coll; /* algorithms/common/state.h */

/**
 * Loads the plan of every MACO_ALGO_<COLLECTIVE>=plan:FILE into c->plans (at creation,
 * collective). MACO_ERR_INVALID_ARGUMENT for a plan of another collective or a collective
 * without plans (broadcast, reduce, all-to-all, send/recv), else maco_plan_load's status.
 */
maco_status_t maco__plan_load_forced(maco_comm_t comm, struct maco__coll *c);
/** Destroys c->plans (at destruction). */
void maco__plan_free_forced(struct maco__coll *c);

#ifdef __cplusplus
}
#endif

#endif /* MACO_PLAN_INTERNAL_H */
