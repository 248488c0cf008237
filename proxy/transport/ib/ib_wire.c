/*
 * ib_wire.c - the IB transport's endpoint and ready messages (proxy/transport/ib/ib_wire.h).
 */
#include "proxy/transport/ib/ib_wire.h"

#include <string.h>

#include "src/host/base/wire.h"

void maco__ib_endpoint_encode(uint8_t *out, const maco__ib_endpoint_t *e)
{
    memset(out, 0, MACO__IB_ENDPOINT);
    maco__put_u32(out, MACO__IB_MAGIC);
    maco__put_u16(out + 4, MACO__IB_VERSION);
    maco__put_u16(out + 6, e->flags);
    maco__put_u64(out + 8, e->uid);
    maco__put_u32(out + 16, e->qpn);
    maco__put_u32(out + 20, e->psn & 0xffffffu);
    maco__put_u16(out + 24, e->lid);
    out[26] = e->link_layer;
    out[27] = e->mtu;
    out[28] = e->gid_valid;
    out[29] = e->port;
    memcpy(out + 32, e->gid, 16);
    maco__put_u64(out + 48, e->recv_addr);
    maco__put_u64(out + 56, e->recv_bytes);
    maco__put_u32(out + 64, e->recv_rkey);
    maco__put_u32(out + 68, e->sem_rkey);
    maco__put_u64(out + 72, e->sem_addr);
    maco__put_u32(out + 80, e->channel);
}

int maco__ib_endpoint_decode(const uint8_t *in, maco__ib_endpoint_t *e)
{
    memset(e, 0, sizeof(*e));
    e->flags = maco__get_u16(in + 6);
    e->uid = maco__get_u64(in + 8);
    e->qpn = maco__get_u32(in + 16);
    e->psn = maco__get_u32(in + 20) & 0xffffffu;
    e->lid = maco__get_u16(in + 24);
    e->link_layer = in[26];
    e->mtu = in[27];
    e->gid_valid = in[28];
    e->port = in[29];
    memcpy(e->gid, in + 32, 16);
    e->recv_addr = maco__get_u64(in + 48);
    e->recv_bytes = maco__get_u64(in + 56);
    e->recv_rkey = maco__get_u32(in + 64);
    e->sem_rkey = maco__get_u32(in + 68);
    e->sem_addr = maco__get_u64(in + 72);
    e->channel = maco__get_u32(in + 80);
    return maco__get_u32(in) == MACO__IB_MAGIC && maco__get_u16(in + 4) == MACO__IB_VERSION ? 0
                                                                                            : -1;
}

int maco__ib_endpoint_port_ok(const maco__ib_endpoint_t *e, uint8_t link_layer)
{
    return e->link_layer == link_layer && e->mtu >= MACO__IB_MTU_MIN &&
           e->mtu <= MACO__IB_MTU_MAX && (link_layer != MACO__IB_LINK_ETH || e->gid_valid != 0);
}

void maco__ib_ready_encode(uint8_t *out, int ok)
{
    memset(out, 0, MACO__IB_READY);
    maco__put_u32(out, MACO__IB_MAGIC);
    maco__put_u16(out + 4, MACO__IB_VERSION);
    maco__put_u16(out + 6, ok ? 1u : 0u);
}

int maco__ib_ready_ok(const uint8_t *in)
{
    return maco__get_u32(in) == MACO__IB_MAGIC && maco__get_u16(in + 4) == MACO__IB_VERSION &&
           maco__get_u16(in + 6) == 1u;
}
