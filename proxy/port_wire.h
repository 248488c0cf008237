/*
 * port_wire.h - the hello two ranks exchange over the bootstrap when they create a port channel
 * (proxy/port_channel.c), little-endian, MACO__PORT_HELLO_BYTES (192) bytes:
 *    0 u32 magic "MPRT"     4 u16 version (1)      6 u16 requested transport (after
 *                                                     MACO_TRANSPORT; 0 = auto)
 *    8 u32 transports this rank can use to reach the peer (bit t for maco_transport_t t)
 *   12 u32 this rank's channel id
 *   16 u64 this rank's proxy uid
 *   24 u32 host semaphore slot  28 u32 device semaphore slot (the ones the peer signals)
 *   32 u64 dst: its address in the peer's process   40 u64 dst bytes
 *   48 u32 dst is host memory  52 u32 src is host memory  56 u64 zero
 *   64 the serialized handle of this proxy's host semaphores (MACO_MEM_HANDLE_BYTES)
 * Pure functions of bytes (no sockets, no CUDA): port_channel.c and the fuzz harness
 * tests/fuzz/fuzz_port_hello.c call the same code. Thread-safe (no state).
 */
#ifndef MACO_PROXY_PORT_WIRE_H
#define MACO_PROXY_PORT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "maco/memory.h"

enum { MACO__PORT_HELLO_BYTES = 64 + MACO_MEM_HANDLE_BYTES };
#define MACO__PORT_MAGIC 0x5452504Du /* "MPRT" */
#define MACO__PORT_VERSION 1u

/* A hello's fields. */
typedef struct maco__port_hello {
    uint16_t asked;                      /* maco_transport_t asked for */
    uint32_t can;                        /* transports the rank can use, one bit each */
    uint32_t channel;                    /* its channel id */
    uint64_t uid;                        /* its proxy's uid */
    uint32_t host_slot, dev_slot;        /* the semaphores the peer signals */
    uint64_t dst_addr, dst_bytes;        /* its dst, in its own process */
    uint32_t dst_host, src_host;         /* 0 or 1 */
    uint8_t sems[MACO_MEM_HANDLE_BYTES]; /* its host semaphores' serialized handle */
} maco__port_hello_t;

/* The limits a received hello is checked against: the semaphore pools' sizes and the channel
 * ids a trigger can carry. */
typedef struct maco__port_hello_limits {
    uint32_t host_sems, dev_sems, channels;
} maco__port_hello_limits_t;

/* Encodes *h into out[MACO__PORT_HELLO_BYTES]. */
void maco__port_hello_encode(uint8_t *out, const maco__port_hello_t *h);

/* Decodes in[MACO__PORT_HELLO_BYTES] into *h and checks it: 0, or -1 with why[cap] saying what
 * is wrong (magic or version: a different MACO build; a semaphore slot or channel id past the
 * limits; a flag neither 0 nor 1; dst_addr + dst_bytes past 2^64; the zero word not zero). *h is
 * filled either way. */
int maco__port_hello_decode(const uint8_t *in, const maco__port_hello_limits_t *lim,
                            maco__port_hello_t *h, char *why, size_t cap);

#endif /* MACO_PROXY_PORT_WIRE_H */
