/*
 * maco/device/packet.h - LL ("low latency") packets: data and a flag in one store.
 *
 * Protocol (docs/design.md, "LL packets"): the writer stores data together with a flag in a single
 * vector store; the reader spins until the flag(s) equal the value it expects, then uses
 * the data. No semaphore and no fence are needed because one aligned vector store is
 * observed whole (MSCCL++ and NCCL's LL protocol rely on the same property of 8- and
 * 16-byte stores on NVLink and PCIe). The flag must differ from whatever the slot held
 * before: collectives take it from a device-resident counter advanced once per launch and
 * double-buffer their scratch by flag parity, so a slot is never rewritten while its
 * previous contents may still be read.
 *
 *   LL16: 16 bytes = {data0 u32, flag u32, data1 u32, flag u32}: 8 payload bytes.
 *   LL8:   8 bytes = {data u32, flag u32}: 4 payload bytes.
 * Packets must be 16- (LL16) or 8-byte (LL8) aligned.
 */
#ifndef MACO_DEVICE_PACKET_H
#define MACO_DEVICE_PACKET_H

#include <stdint.h>

#include "maco/device/error.h"

#if defined(__CUDACC__)

typedef struct __align__(16) maco_ll16_packet
{
    uint32_t data0, flag0, data1, flag1;
}
maco_ll16_packet_t;

typedef struct __align__(8) maco_ll8_packet
{
    uint32_t data, flag;
}
maco_ll8_packet_t;

static_assert(sizeof(maco_ll16_packet_t) == 16, "LL16 packet is 16 bytes");
static_assert(sizeof(maco_ll8_packet_t) == 8, "LL8 packet is 8 bytes");

/** Stores 8 payload bytes with `flag` as one 16-byte volatile store (one thread). */
static __device__ __forceinline__ void maco_ll16_store(maco_ll16_packet_t *p, uint2 data,
                                                       uint32_t flag);

/** Stores 4 payload bytes with `flag` as one 8-byte volatile store (one thread). */
static __device__ __forceinline__ void maco_ll8_store(maco_ll8_packet_t *p, uint32_t data,
                                                      uint32_t flag);

/** One attempt: true and *data set when the packet carries `flag`. */
static __device__ __forceinline__ int maco_ll16_try_load(const maco_ll16_packet_t *p, uint32_t flag,
                                                         uint2 *data);

static __device__ __forceinline__ int maco_ll8_try_load(const maco_ll8_packet_t *p, uint32_t flag,
                                                        uint32_t *data);

/**
 * Spins until the LL16 packet carries `flag`, then returns its payload in *data.
 * Bounded: on timeout records (peer, slot, flag, observed flag) in the report and returns
 * MACO_ERR_TIMEOUT; returns MACO_ERR_REMOTE if another wait already failed.
 */
static __device__ __forceinline__ maco_status_t maco_ll16_load(const maco_ll16_packet_t *p,
                                                               uint32_t flag, uint2 *data,
                                                               const maco_device_wait_bound_t *b,
                                                               int peer, int slot);

/** LL8 counterpart of maco_ll16_load(). */
static __device__ __forceinline__ maco_status_t maco_ll8_load(const maco_ll8_packet_t *p,
                                                              uint32_t flag, uint32_t *data,
                                                              const maco_device_wait_bound_t *b,
                                                              int peer, int slot);

#include "maco/device/impl/packet.h"

#endif /* __CUDACC__ */

#endif /* MACO_DEVICE_PACKET_H */
