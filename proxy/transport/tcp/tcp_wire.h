/*
 * tcp_wire.h - the TCP transport's wire format (transport_tcp.c says how it is used):
 * the 32-byte hello a connecting proxy sends on each socket and the 64-byte header of every
 * message, little-endian. Pure functions of bytes, no sockets, no CUDA: the transport and the
 * fuzz harness tests/fuzz/fuzz_tcp_wire.c call the same code. Thread-safe (no state).
 *
 * Hello (connector -> listener, per socket):
 *    0 u32 magic "MTCP"   4 u32 version   8 u32 the connector's rank   12 u32 its socket index
 *   16 u64 the connector's proxy uid     24 u64 the listener's secret (sent over the bootstrap)
 * Header:
 *    0 u32 kind (PUT, SIGNAL, ACK, BYE, VALUE)   4 u32 the receiver's channel id
 *    8 u64 offset in the receiver's buffer      16 u64 payload bytes (VALUE: 4 or 8)
 *   24 u64 ACK: the count; VALUE: the value
 *   32 u32 deps[8]: messages the sender had dealt to each socket before this put or signal
 */
#ifndef MACO_PROXY_TCP_WIRE_H
#define MACO_PROXY_TCP_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum {
    MACO__TCP_MAX_SOCKS = 8,
    MACO__TCP_HEADER = 64,
    MACO__TCP_HELLO = 32,
    MACO__TCP_PUT = 1,
    MACO__TCP_SIGNAL = 2,
    MACO__TCP_ACK = 3,
    MACO__TCP_BYE = 4,   /* the sender's proxy is being destroyed, with nothing in flight */
    MACO__TCP_VALUE = 5, /* an inline put: 4 or 8 bytes carried in the header */
};
#define MACO__TCP_HELLO_MAGIC 0x5043544Du /* "MTCP" */
#define MACO__TCP_VERSION 1u

/* A hello's fields. */
typedef struct maco__tcp_hello {
    uint32_t rank, sock;
    uint64_t uid, secret;
} maco__tcp_hello_t;

/* A header's fields. */
typedef struct maco__tcp_header {
    uint32_t kind, channel;
    uint64_t offset, bytes, value; /* value: ACK's count, VALUE's value */
    uint32_t deps[MACO__TCP_MAX_SOCKS];
} maco__tcp_header_t;

/* Encodes a hello into out[MACO__TCP_HELLO]. */
void maco__tcp_hello_encode(uint8_t *out, const maco__tcp_hello_t *h);

/* Whether in[MACO__TCP_HELLO] is the hello of rank `peer`'s proxy `uid` with `secret`, for a
 * socket index below `nsocks` (*sock_p gets it): 1, else 0 (magic, version, rank, uid, secret or
 * socket index wrong). */
int maco__tcp_hello_check(const uint8_t *in, uint32_t peer, uint64_t uid, uint64_t secret,
                          uint32_t nsocks, uint32_t *sock_p);

/* Encodes a header into out[MACO__TCP_HEADER] (deps beyond MACO__TCP_MAX_SOCKS do not exist). */
void maco__tcp_header_encode(uint8_t *out, const maco__tcp_header_t *m);

/* Decodes in[MACO__TCP_HEADER] into *m (every field; nothing is checked). */
void maco__tcp_header_decode(const uint8_t *in, maco__tcp_header_t *m);

/* Checks a decoded PUT or VALUE against its channel's receive buffer of `recv_bytes` bytes and
 * the connection's piece size `chunk`: 1 when the payload lies inside the buffer (offset +
 * bytes <= recv_bytes, no overflow), is not empty, at most `chunk` bytes, and a VALUE carries 4
 * or 8 bytes; else 0. Other kinds: 0. */
int maco__tcp_header_data_ok(const maco__tcp_header_t *m, uint64_t recv_bytes, uint64_t chunk);

#endif /* MACO_PROXY_TCP_WIRE_H */
