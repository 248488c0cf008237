/*
 * registry.h - registered buffers of each rank that its peers have mapped, so collectives can
 * use registered user buffers in place (registry.c has the protocol), and the descriptor a
 * rank sends its peers at the start of a mesh-family kernel.
 */
#ifndef MACO_ALGORITHMS_COMMON_REGISTRY_H
#define MACO_ALGORITHMS_COMMON_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "algorithms/common/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Creates this rank's directory and maps every peer's (collective; at creation). */
maco_status_t maco__registry_setup(maco_comm_t comm);
/** Unmaps everything the registry mapped; live registrations stay registered. */
void maco__registry_free(maco_comm_t comm);
/** Publishes a device-memory registration of this rank; returns 1 if published. */
int maco__registry_publish(maco_comm_t comm, maco_mem_t mem, const void *ptr, size_t bytes);
/** Marks a published registration dead (at deregistration). */
void maco__registry_withdraw(maco_comm_t comm, maco_mem_t mem);
/** Id (1-based) of a live published registration holding [ptr, ptr+bytes), 0 if none;
 * *offset_p: ptr's offset inside it. */
uint32_t maco__registry_find(maco_comm_t comm, const void *ptr, size_t bytes, uint64_t *offset_p);
/** Maps peers' new entries (maco_collective_map_registrations; may fetch descriptors from
 * peers' fd servers: never called on a launch path). Returns the first entry that failed to
 * map (it stays unmapped and is tried again next time); MACO_OK without a registry. Call with
 * the communicator's device current. */
maco_status_t maco__registry_map(maco_comm_t comm);
/** Writes seen[0..local ranks) (peer entries mapped or skipped so far); no I/O, no CUDA. */
void maco__registry_seen(maco_comm_t comm, uint32_t *seen_p);
/** Device addresses of the mapped-address table and the kernels' cache of it
 * ([nranks][MACO__REG_MAX] u64 each), NULL without a registry. */
const uint64_t *maco__registry_table(maco_comm_t comm);
uint64_t *maco__registry_cache(maco_comm_t comm);

/*
 * What a rank tells its peers at the start of a mesh-family kernel (registry.c has the
 * protocol): its send and receive buffers as registry ids (1-based) and byte offsets inside
 * those registrations, and how many registry entries of each peer it has looked at. An id
 * is MACO__DESC_NONE when the buffer cannot be used in place (not registered, or not 16-byte
 * aligned) and MACO__DESC_LOCAL when no peer touches it in place (only its own rank, or no
 * one, uses it). 14 32-bit words, sent as 7 LL16 packets (8 data bytes each) in this order.
 */
typedef struct maco__coll_desc {
    uint32_t send_id, recv_id;
    uint64_t send_off, recv_off;
    uint32_t seen[MACO__MAX_LOCAL_RANKS];
} maco__coll_desc_t;
#define MACO__DESC_NONE 0u
#define MACO__DESC_LOCAL 0xffffffffu
enum { MACO__DESC_WORDS = 14, MACO__DESC_PKTS = 7 };
MACO_STATIC_ASSERT(sizeof(maco__coll_desc_t) == 4 * MACO__DESC_WORDS, "descriptor is 14 words");
MACO_STATIC_ASSERT(16 * MACO__DESC_PKTS <= MACO__DESC_BYTES, "descriptor fits its scratch");

#ifdef __cplusplus
}
#endif

#endif /* MACO_ALGORITHMS_COMMON_REGISTRY_H */
