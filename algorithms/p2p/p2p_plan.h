/*
 * p2p_plan.h - send/recv and all-to-all: how one group's messages become one kernel launch
 * (the plan), and how a message is cut into chunks on lanes. Plain C with no CUDA: the host
 * builds plans (p2p_plan.c), the kernel (p2p_kernels.cu) reads them, and the CPU tests check
 * the pure functions. The protocol itself is described in p2p_kernels.cu and in
 * docs/design.md ("Send/recv and all-to-all").
 *
 * Words: a *message* is one send matched with one receive (the k-th send from rank s to rank
 * d matches d's k-th receive from s). A *pair* is one direction to one peer (send to q,
 * receive from q) or the local copies (sends to this rank matched with receives from it). A
 * pair's messages travel on `lanes` lanes, each with its own scratch slots, credit semaphore
 * and sequence counters, and each handled by its own kernel work item.
 * Slots: a rank's buffer holds slots for its n - 1 peers only (no pair sends to itself
 * through scratch): source s's slots in the buffer of rank d are at index
 * maco__p2p_src_index(s, d).
 */
#ifndef MACO_P2P_PLAN_H
#define MACO_P2P_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "algorithms/tuning.h"
#include "maco/device/macros.h"
#include "maco/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MACO__P2P_MAX_OPS = 128,   /* sends and receives of one launch (kernel parameter space) */
    MACO__P2P_MAX_PAIRS = 16,  /* 2 per peer (at most 7 on a node) + the local pair */
    MACO__P2P_MAX_LANES = 32,  /* MACO_P2P_LANES' upper bound (and its default) */
    MACO__P2P_SLOTS = 2,       /* scratch slots per lane: a sender runs at most 2 chunks ahead */
    MACO__P2P_LL_SLOT = 16384, /* bytes of LL16 packets per slot: 8 KiB of payload */
    MACO__P2P_LANE_BYTES = MACO__P2P_LL_SLOT / 2, /* maco__p2p_msg_lanes: bytes per lane */
    MACO__P2P_MAX_ITEMS = MACO__P2P_MAX_PAIRS * MACO__P2P_MAX_LANES,
};

/* Directions of a pair. */
enum { MACO__P2P_SEND = 0, MACO__P2P_RECV = 1, MACO__P2P_SELF = 2 };

/* What a message belongs to, for error messages (maco__p2p_op_flags_t's low bits). */
enum { MACO__P2P_KIND_SENDRECV = 0, MACO__P2P_KIND_ALLTOALL = 1, MACO__P2P_KIND_ALLTOALLV = 2 };

/*
 * Per-op flags byte: bits 0-1 kind (above), bits 2-3 log2 of the element size (for the
 * receiver's mismatch message), bit 6 STAGE (host only, the kernel ignores it: the op's
 * source shares bytes with a receive buffer of the group, so the launch copies the source
 * aside first and the op reads the copy; group.c), bit 7 LL (the sender sends this message
 * as LL packets; the receiver learns the mode from each chunk's header, so it does not need
 * this bit).
 */
#define MACO__P2P_FLAG_STAGE 0x40u
#define MACO__P2P_FLAG_LL 0x80u
#define MACO__P2P_FLAGS(kind, esz_log2, ll)                                                        \
    ((uint8_t)((kind) | ((esz_log2) << 2) | ((ll) ? MACO__P2P_FLAG_LL : 0u)))

/* One op of a launch: a send reads src, a receive writes dst, a local copy does both. */
typedef struct maco__p2p_op {
    const void *src;
    void *dst;
    uint64_t bytes;
} maco__p2p_op_t;
MACO_STATIC_ASSERT(sizeof(maco__p2p_op_t) == 24, "maco__p2p_op_t is 24 bytes");

/*
 * A launch's plan, passed to the kernel by value inside maco__p2p_args_t (p2p.h):
 * pairs in the order q = 0..n-1 (send to q, then receive from q; q != rank), then the local
 * pair; each pair's ops are ops[first .. first + nops), in call order.
 * Layout: 128 ops x 24 bytes, then 16 pairs' peer (i32), first and nops (u16), dir (u8),
 * the ops' flags (u8 x 128), counts: 3072 + 64 + 32 + 32 + 16 + 128 + 8 = 3352 bytes.
 */
typedef struct maco__p2p_plan {
    maco__p2p_op_t ops[MACO__P2P_MAX_OPS];
    int32_t pair_peer[MACO__P2P_MAX_PAIRS];
    uint16_t pair_first[MACO__P2P_MAX_PAIRS];
    uint16_t pair_nops[MACO__P2P_MAX_PAIRS];
    uint8_t pair_dir[MACO__P2P_MAX_PAIRS];
    uint8_t op_flags[MACO__P2P_MAX_OPS];
    int32_t npairs;
    int32_t nops;
} maco__p2p_plan_t;
MACO_STATIC_ASSERT(sizeof(maco__p2p_plan_t) == 3352, "maco__p2p_plan_t is 3352 bytes");

/* One send or receive as a group collected it (the planner's input). */
typedef struct maco__p2p_msg {
    int32_t dir;  /* MACO__P2P_SEND or MACO__P2P_RECV */
    int32_t peer; /* the other rank (this rank: a local copy, matched in the group) */
    const void *send;
    void *recv;
    uint64_t bytes;
    uint8_t flags;  /* MACO__P2P_FLAGS */
    int32_t call;   /* the call's number in its group (1-based), for messages */
    const char *fn; /* the call's name, for messages */
} maco__p2p_msg_t;

/*
 * Builds the plan of one communicator's messages of a group, on rank `rank` of `nranks`:
 * sends and receives with a peer become that pair's ops in call order; the k-th send to this
 * rank and the k-th receive from it become one local copy. Messages of 0 bytes that are not
 * local stay (all-to-all exchanges them so the receiver can check the count); local ones are
 * dropped.
 * In place: a send (or a local copy's source) that shares a byte with a receive buffer of
 * the messages is allowed, and its op gets MACO__P2P_FLAG_STAGE: the messages run at the
 * same time and a receive may write those bytes before the send has read them, so the
 * launch must make the op read a copy taken before it (group.c). nccl-tests' in-place
 * sendrecv is such a group: send X to rank r + 1, receive into X from rank r - 1.
 * Errors (MACO_ERR_INVALID_ARGUMENT; *plan untouched; `why` gets a sentence naming the calls
 * by number and name; *call_p the first call at fault):
 *   a send to this rank without a receive from it, or the reverse; a local pair whose byte
 *   counts differ; a receive buffer that shares a byte with another receive buffer of the
 *   messages (which write would land last is undefined); more than MACO__P2P_MAX_OPS ops or
 *   more than MACO__P2P_MAX_PAIRS pairs; a peer outside [0, nranks).
 * Pure: no CUDA, no logging (the caller logs `why`); `plan` may be NULL (checks only).
 */
maco_status_t maco__p2p_plan_build(const maco__p2p_msg_t *msgs, int nmsgs, int rank, int nranks,
                                   maco__p2p_plan_t *plan, int *call_p, char *why,
                                   size_t why_bytes);

/*
 * Chunks of one message of `bytes` bytes, `cap` payload bytes per chunk, on `lanes` lanes:
 * chunk j holds bytes [j cap, min(bytes, (j + 1) cap)) (empty past the end) and travels on
 * lane j % lanes. Every lane carries at least one chunk of every message (an empty one when
 * the message is short), so each lane's receiver learns the sender's byte count from a chunk
 * header of its own and the lanes stay in step whatever the counts.
 */
static MACO_HOST_DEVICE inline uint64_t maco__p2p_nchunks(uint64_t bytes, uint64_t cap,
                                                          uint32_t lanes)
{
    uint64_t n = (bytes + cap - 1) / cap;
    return n < lanes ? (uint64_t)lanes : n;
}

/*
 * Payload bytes per chunk of a copy-mode message of `bytes` bytes (> 0) on `lanes` lanes
 * (>= 1) whose slots hold `chunk` bytes (a multiple of 16, >= 16): the message spread over
 * every lane, so that every lane's CTA copies a share. With t = ceil(bytes / lanes) rounded
 * up to 256 bytes: max(t, MACO__P2P_CAP_MIN) up to MACO__P2P_CAP_ONE (one chunk per lane);
 * above it max(MACO__P2P_CAP_ONE, t / 2 rounded up to 256) (more chunks than lanes, about
 * two per lane from 2 x MACO__P2P_CAP_ONE per lane, so a lane's two slots pipeline); never
 * more than `chunk`. A multiple of 16, so every chunk
 * keeps its source's alignment. Sender and receiver compute it from the message's byte count
 * (the receiver's from the header), so they agree.
 * Why: one CTA per lane copies only a share of a link's speed, so a message must use every
 * lane to reach it (the values: algorithms/tuning.h, P2P_COPY_CHUNK_MIN and _ONE).
 */
#define MACO__P2P_CAP_MIN ((uint64_t)MACO__TUNING_P2P_COPY_CHUNK_MIN)
#define MACO__P2P_CAP_ONE ((uint64_t)MACO__TUNING_P2P_COPY_CHUNK_ONE)
static MACO_HOST_DEVICE inline uint64_t maco__p2p_copy_cap(uint64_t bytes, uint64_t chunk,
                                                           uint32_t lanes)
{
    uint64_t t = (bytes + lanes - 1) / lanes;
    t = (t + 255) / 256 * 256;
    if (t <= MACO__P2P_CAP_ONE) {
        if (t < MACO__P2P_CAP_MIN)
            t = MACO__P2P_CAP_MIN;
    } else {
        t = (t / 2 + 255) / 256 * 256;
        if (t < MACO__P2P_CAP_ONE)
            t = MACO__P2P_CAP_ONE;
    }
    return t < chunk ? t : chunk;
}

/*
 * Lanes a message of `bytes` bytes uses out of the pair's `lanes`: min(lanes, ceil(bytes /
 * MACO__P2P_LANE_BYTES)), at least 1. The message's chunks go on lanes [0, L) as above (pass L
 * as `lanes` to the functions here); the other lanes skip the message, carrying nothing for
 * it. Without this a small message sent an empty chunk on every lane (a header to write, to
 * poll and to credit per lane: 7 pairs x 32 lanes = 224 work items for a small all-to-all of
 * 4 ranks). From MACO__P2P_LANE_BYTES x lanes bytes on L = lanes; below, with slots of at
 * least MACO__P2P_CAP_MIN bytes, the chunks are the ones all `lanes` would carry (an LL chunk
 * holds MACO__P2P_LANE_BYTES, a copy chunk MACO__P2P_CAP_MIN, so chunk j is on lane j either
 * way) without the empty ones. Sender and receiver compute L from their own byte counts: they
 * agree whenever the counts match (a mismatch is an error the receiver reports).
 */
static MACO_HOST_DEVICE inline uint32_t maco__p2p_msg_lanes(uint64_t bytes, uint32_t lanes)
{
    uint64_t l = (bytes + MACO__P2P_LANE_BYTES - 1) / MACO__P2P_LANE_BYTES;
    if (l < 1)
        l = 1;
    return l < lanes ? (uint32_t)l : lanes;
}

/** Chunks lane `lane` carries for such a message (chunks lane, lane + lanes, ...). */
static MACO_HOST_DEVICE inline uint64_t maco__p2p_lane_chunks(uint64_t bytes, uint64_t cap,
                                                              uint32_t lanes, uint32_t lane)
{
    return (maco__p2p_nchunks(bytes, cap, lanes) - lane + lanes - 1) / lanes;
}

/** Payload bytes of chunk j (0 past the message's end). */
static MACO_HOST_DEVICE inline uint64_t maco__p2p_chunk_bytes(uint64_t bytes, uint64_t cap,
                                                              uint64_t j)
{
    uint64_t off = j * cap;
    if (off >= bytes)
        return 0;
    return bytes - off < cap ? bytes - off : cap;
}

/** Where source rank `src`'s slots sit among the n - 1 sources of rank `dst`'s buffer. */
static MACO_HOST_DEVICE inline int maco__p2p_src_index(int src, int dst)
{
    return src > dst ? src - 1 : src;
}

/*
 * The chunk header: one LL16 packet {data0, flag, data1, flag} at the head of each slot.
 * data0 = the message's byte count, low 32 bits; data1 = bits 32..47 of it (16 bits), the
 * message's index among its pair's ops in the launch (bits 16-22: < MACO__P2P_MAX_OPS, so a
 * receiver never takes a chunk of another message for its own, even after a count mismatch
 * left lanes out of step: maco__p2p_msg_lanes), the skew (bits 24-27: where a copy-mode
 * payload starts in its slot, 0..15, so that the sender's copy keeps its source's alignment)
 * and the mode (bit 28: payload as LL packets). Messages are limited to 2^48 - 1 bytes.
 */
#define MACO__P2P_HDR_LL (1u << 28)
#define MACO__P2P_MAX_BYTES (((uint64_t)1 << 48) - 1)
MACO_STATIC_ASSERT(MACO__P2P_MAX_OPS <= 128, "a message index fits the header's 7 bits");

static MACO_HOST_DEVICE inline uint32_t maco__p2p_hdr_hi(uint64_t bytes, uint32_t msg,
                                                         uint32_t skew, int ll)
{
    return (uint32_t)((bytes >> 32) & 0xffffu) | ((msg & 0x7fu) << 16) | ((skew & 15u) << 24) |
           (ll ? MACO__P2P_HDR_LL : 0u);
}

static MACO_HOST_DEVICE inline uint64_t maco__p2p_hdr_bytes(uint32_t lo, uint32_t hi)
{
    return (uint64_t)lo | ((uint64_t)(hi & 0xffffu) << 32);
}

static MACO_HOST_DEVICE inline uint32_t maco__p2p_hdr_msg(uint32_t hi)
{
    return (hi >> 16) & 0x7fu;
}

#ifdef __cplusplus
}
#endif

#endif /* MACO_P2P_PLAN_H */
