/*
 * ib_wire.h - what two IB transports exchange over the bootstrap for each port channel
 * (proxy/transport/ib/transport_ib.c says when), little-endian.
 *
 * Endpoint (MACO__IB_ENDPOINT, 128 bytes):
 *    0 u32 magic "MIBV"   4 u16 version (1)   6 u16 flags: 1 ready (0: the sender failed, its
 *                                                log says why), 2 new connection (QP fields valid)
 *    8 u64 the sender's proxy uid
 *   16 u32 QP number   20 u32 initial PSN (24 bits)   24 u16 LID
 *   26 u8 link layer (1 InfiniBand, 2 Ethernet)   27 u8 active MTU (enum ibv_mtu, 1..5)
 *   28 u8 GID valid   29 u8 port   30 u16 zero   32 u8[16] GID
 *   48 u64 receive buffer address   56 u64 its bytes   64 u32 its rkey
 *   68 u32 semaphore rkey   72 u64 semaphore address   80 u32 the sender's channel id
 *   84..127 zero
 * Ready (MACO__IB_READY, 16 bytes, new connections only): u32 magic, u16 version, u16 flags
 * (1: the sender's QP is in RTS).
 *
 * Pure functions of bytes (no verbs, no sockets): the transport and the fuzz harness
 * tests/fuzz/fuzz_ib_endpoint.c call the same code. Thread-safe (no state).
 */
#ifndef MACO_PROXY_IB_WIRE_H
#define MACO_PROXY_IB_WIRE_H

#include <stdint.h>

enum {
    MACO__IB_ENDPOINT = 128, /* endpoint bytes */
    MACO__IB_READY = 16,     /* ready message bytes */
    MACO__IB_FLAG_OK = 1,    /* endpoint flags */
    MACO__IB_FLAG_NEW = 2,   /* ... */
    MACO__IB_LINK_IB = 1,    /* IBV_LINK_LAYER_INFINIBAND */
    MACO__IB_LINK_ETH = 2,   /* IBV_LINK_LAYER_ETHERNET */
    MACO__IB_MTU_MIN = 1,    /* IBV_MTU_256 */
    MACO__IB_MTU_MAX = 5,    /* IBV_MTU_4096 */
};
#define MACO__IB_MAGIC 0x5642494Du /* "MIBV" */
#define MACO__IB_VERSION 1u

/* An endpoint's fields. */
typedef struct maco__ib_endpoint {
    uint16_t flags;
    uint64_t uid;
    uint32_t qpn, psn; /* psn: 24 bits */
    uint16_t lid;
    uint8_t link_layer, mtu, gid_valid, port;
    uint8_t gid[16];
    uint64_t recv_addr, recv_bytes;
    uint32_t recv_rkey, sem_rkey;
    uint64_t sem_addr;
    uint32_t channel;
} maco__ib_endpoint_t;

/* Encodes *e into out[MACO__IB_ENDPOINT] (psn cut to 24 bits). */
void maco__ib_endpoint_encode(uint8_t *out, const maco__ib_endpoint_t *e);

/* Decodes in[MACO__IB_ENDPOINT] into *e (every field, psn cut to 24 bits): 0, or -1 when the
 * magic or version is not this build's (*e is filled either way). */
int maco__ib_endpoint_decode(const uint8_t *in, maco__ib_endpoint_t *e);

/* Whether a new connection to the port that endpoint e describes can be made from a port of
 * link layer `link_layer`: the same link layer, an MTU code from 1 (256) to 5 (4096), and a
 * GID on Ethernet (RoCE). 1 or 0. */
int maco__ib_endpoint_port_ok(const maco__ib_endpoint_t *e, uint8_t link_layer);

/* The ready message: encoded with ok 1 or 0; read back 1 when it is this build's and says the
 * sender's QP is in RTS, else 0. */
void maco__ib_ready_encode(uint8_t *out, int ok);
int maco__ib_ready_ok(const uint8_t *in);

#endif /* MACO_PROXY_IB_WIRE_H */
