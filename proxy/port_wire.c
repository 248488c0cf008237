/*
 * port_wire.c - the port channel's hello (proxy/port_wire.h).
 */
#include "proxy/port_wire.h"

#include <stdio.h>
#include <string.h>

#include "src/host/base/wire.h"

void maco__port_hello_encode(uint8_t *out, const maco__port_hello_t *h)
{
    memset(out, 0, MACO__PORT_HELLO_BYTES);
    maco__put_u32(out, MACO__PORT_MAGIC);
    maco__put_u16(out + 4, MACO__PORT_VERSION);
    maco__put_u16(out + 6, h->asked);
    maco__put_u32(out + 8, h->can);
    maco__put_u32(out + 12, h->channel);
    maco__put_u64(out + 16, h->uid);
    maco__put_u32(out + 24, h->host_slot);
    maco__put_u32(out + 28, h->dev_slot);
    maco__put_u64(out + 32, h->dst_addr);
    maco__put_u64(out + 40, h->dst_bytes);
    maco__put_u32(out + 48, h->dst_host);
    maco__put_u32(out + 52, h->src_host);
    memcpy(out + 64, h->sems, MACO_MEM_HANDLE_BYTES);
}

int maco__port_hello_decode(const uint8_t *in, const maco__port_hello_limits_t *lim,
                            maco__port_hello_t *h, char *why, size_t cap)
{
    memset(h, 0, sizeof(*h));
    uint32_t magic = maco__get_u32(in), version = maco__get_u16(in + 4);
    h->asked = maco__get_u16(in + 6);
    h->can = maco__get_u32(in + 8);
    h->channel = maco__get_u32(in + 12);
    h->uid = maco__get_u64(in + 16);
    h->host_slot = maco__get_u32(in + 24);
    h->dev_slot = maco__get_u32(in + 28);
    h->dst_addr = maco__get_u64(in + 32);
    h->dst_bytes = maco__get_u64(in + 40);
    h->dst_host = maco__get_u32(in + 48);
    h->src_host = maco__get_u32(in + 52);
    memcpy(h->sems, in + 64, MACO_MEM_HANDLE_BYTES);
    if (magic != MACO__PORT_MAGIC || version != MACO__PORT_VERSION)
        snprintf(why, cap,
                 "magic 0x%08x version %u (expected 0x%08x version %u): different MACO builds?",
                 magic, version, MACO__PORT_MAGIC, MACO__PORT_VERSION);
    else if (h->host_slot >= lim->host_sems || h->dev_slot >= lim->dev_sems)
        snprintf(why, cap, "semaphore slots %u (host) and %u (device) past the pools of %u and %u",
                 h->host_slot, h->dev_slot, lim->host_sems, lim->dev_sems);
    else if (h->channel >= lim->channels)
        snprintf(why, cap, "channel id %u past the %u a trigger can name", h->channel,
                 lim->channels);
    else if (h->dst_host > 1 || h->src_host > 1)
        snprintf(why, cap, "memory kinds %u and %u are not 0 or 1", h->dst_host, h->src_host);
    else if (h->dst_bytes > UINT64_MAX - h->dst_addr)
        snprintf(why, cap, "dst of %llu bytes at 0x%llx passes 2^64",
                 (unsigned long long)h->dst_bytes, (unsigned long long)h->dst_addr);
    else if (maco__get_u64(in + 56) != 0)
        snprintf(why, cap, "reserved word not zero");
    else
        return 0;
    return -1;
}
