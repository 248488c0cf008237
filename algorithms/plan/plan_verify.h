/*
 * plan_verify.h - the plan verifier's state and the calls between its files (private):
 * plan_verify.c (allocation, the driver maco__plan_verify), plan_verify_util.c (what the steps
 * share), plan_verify_structure.c (1. structure and bounds) and plan_verify_exec.c (2.-4.
 * execution, happens-before, values).
 * The method is in plan_verify.c's file comment.
 */
#ifndef MACO_PLAN_VERIFY_H
#define MACO_PLAN_VERIFY_H

#include <stdint.h>

#include "algorithms/plan/plan_internal.h"

enum { MACO__VERIFY_MAX_LINES = 40 };

/* The most steps a verification may take (0.05 s on one core, optimised; 12 times what a
 * 32-rank allreduce of 900 KB takes; plan_verify's cost is in
 * docs/plan-format.md, "Verification"): a plan that needs more is refused, not checked for
 * minutes while the other ranks reach their bootstrap deadline. */
#define MACO__VERIFY_MAX_STEPS (1ull << 28)

typedef struct maco__access {
    int g;     /* global thread block */
    int start; /* op index where it begins */
    int end;   /* op index where it is complete (-1: never inside the plan) */
    uint8_t write, packets;
} maco__access_t;

typedef struct maco__access_list {
    maco__access_t *a;
    int n, cap;
} maco__access_list_t;

typedef struct maco__verifier {
    const maco__plan_desc_t *d;
    char *out;
    size_t cap, used;
    int problems, lines;
    int n, K, T;     /* ranks, parts, thread blocks in all */
    int *tb_base;    /* [n+1]: global id of rank r's tb 0 */
    int *g_rank;     /* [T] */
    int *ev_base;    /* [T+1]: event id of each tb's op 0 */
    uint32_t *vc;    /* [events][T] */
    int **owner;     /* [n][nchannels]: the tb that uses the channel, -1 none */
    int **partner;   /* [n][nchannels]: the partner's channel index on the peer */
    int **nsig;      /* [n][nchannels]: signals sent so far */
    int **nwait;     /* [n][nchannels]: waits returned so far */
    int **sig_total; /* [n][nchannels]: signals in the whole plan */
    int ***sig_ev;   /* [n][nchannels][sig_total]: event of each signal, in order */
    uint32_t chunks[MACO__PBUF_COUNT], loc_per_rank, nlocs, nids;
    int *pkt_writer;               /* [nlocs]: event that wrote packets there, -1 none */
    int *pkt_writes;               /* [nlocs]: packet writes seen (static) */
    uint16_t *val;                 /* [nlocs][nids] */
    int *part;                     /* [nlocs]: part of the value, -1 undefined */
    int *last;                     /* [nlocs]: event of the last write, -1 none */
    maco__access_list_t *access;   /* [nlocs] */
    uint16_t *tmp;                 /* [nids] */
    int *next_flush, *next_signal; /* [events]: maco__port_end's answers */
    int *pkt_ready;                /* [T]: packet chunks of the blocked op known written */
    uint64_t work, budget;         /* steps taken and allowed (MACO__VERIFY_MAX_STEPS) */
} maco__verifier_t;

/* plan_verify_util.c: messages (maco__vsay counts a problem and appends its line to the report),
   where and what (rank, thread block, op; chunk names), op kinds, and chunk locations. */
void maco__vsay(maco__verifier_t *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *maco__vwhere(const maco__verifier_t *v, int g, int i, char *buf, size_t cap);
const char *maco__vwhere_ev(const maco__verifier_t *v, int ev, char *buf, size_t cap);
const char *maco__vchunk(int buffer, uint32_t index, char *buf, size_t cap);
const char *maco__vrange(const maco__plan_ref_t *ref, char *buf, size_t cap);
int maco__is_signal(int code);
int maco__is_flush(int code);
int maco__is_put(int code);
int maco__ref_rank(const maco__plan_desc_t *d, int r, const maco__plan_op_t *op,
                   const maco__plan_ref_t *ref, int is_dst);
uint32_t maco__loc(const maco__verifier_t *v, int rank, int buffer, uint32_t index);

/* plan_verify_structure.c: 1. (nonzero when the plan cannot be executed symbolically). */
int maco__check_structure(maco__verifier_t *v);

/* plan_verify_exec.c: 2.-4. (maco__exec: 0, or -1 out of memory, -2 over the step budget). */
int maco__enabled(maco__verifier_t *v, int g, int i);
int maco__exec(maco__verifier_t *v, int g, int i);
void maco__check_races(maco__verifier_t *v);
void maco__check_post(maco__verifier_t *v);
void maco__report_deadlocks(maco__verifier_t *v, const int *done);

#endif /* MACO_PLAN_VERIFY_H */
