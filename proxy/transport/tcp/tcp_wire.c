/*
 * tcp_wire.c - the TCP transport's hello and message header (proxy/transport/tcp/tcp_wire.h).
 */
#include "proxy/transport/tcp/tcp_wire.h"

#include "src/host/base/wire.h"

void maco__tcp_hello_encode(uint8_t *out, const maco__tcp_hello_t *h)
{
    maco__put_u32(out, MACO__TCP_HELLO_MAGIC);
    maco__put_u32(out + 4, MACO__TCP_VERSION);
    maco__put_u32(out + 8, h->rank);
    maco__put_u32(out + 12, h->sock);
    maco__put_u64(out + 16, h->uid);
    maco__put_u64(out + 24, h->secret);
}

int maco__tcp_hello_check(const uint8_t *in, uint32_t peer, uint64_t uid, uint64_t secret,
                          uint32_t nsocks, uint32_t *sock_p)
{
    uint32_t s = maco__get_u32(in + 12);
    if (maco__get_u32(in) != MACO__TCP_HELLO_MAGIC || maco__get_u32(in + 4) != MACO__TCP_VERSION ||
        maco__get_u32(in + 8) != peer || maco__get_u64(in + 16) != uid ||
        maco__get_u64(in + 24) != secret || s >= nsocks)
        return 0;
    *sock_p = s;
    return 1;
}

void maco__tcp_header_encode(uint8_t *out, const maco__tcp_header_t *m)
{
    maco__put_u32(out, m->kind);
    maco__put_u32(out + 4, m->channel);
    maco__put_u64(out + 8, m->offset);
    maco__put_u64(out + 16, m->bytes);
    maco__put_u64(out + 24, m->value);
    for (int q = 0; q < MACO__TCP_MAX_SOCKS; q++)
        maco__put_u32(out + 32 + 4 * q, m->deps[q]);
}

void maco__tcp_header_decode(const uint8_t *in, maco__tcp_header_t *m)
{
    m->kind = maco__get_u32(in);
    m->channel = maco__get_u32(in + 4);
    m->offset = maco__get_u64(in + 8);
    m->bytes = maco__get_u64(in + 16);
    m->value = maco__get_u64(in + 24);
    for (int q = 0; q < MACO__TCP_MAX_SOCKS; q++)
        m->deps[q] = maco__get_u32(in + 32 + 4 * q);
}

int maco__tcp_header_data_ok(const maco__tcp_header_t *m, uint64_t recv_bytes, uint64_t chunk)
{
    if (m->kind != MACO__TCP_PUT && m->kind != MACO__TCP_VALUE)
        return 0;
    if (m->offset > recv_bytes || m->bytes > recv_bytes - m->offset || m->bytes == 0 ||
        m->bytes > chunk)
        return 0;
    return m->kind != MACO__TCP_VALUE || m->bytes == 4 || m->bytes == 8;
}
