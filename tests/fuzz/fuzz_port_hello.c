/*
 * fuzz_port_hello.c - libFuzzer harness for the port channel's hello (proxy/port_wire.c): what
 * a peer rank, or anything speaking for it on the bootstrap, answers when a channel is created.
 *
 * Feeds: MACO__PORT_HELLO_BYTES of hello, then three u16 limits (host semaphores, device
 * semaphores, channel ids; each at least 1). Missing bytes read as zero.
 * Checks: a hello that maco__port_hello_decode accepts has every slot and id below its limit,
 * flags 0 or 1, a dst range that does not wrap, and encodes back to the same bytes; a refused
 * one comes with a non-empty reason that fits its buffer; a hello made by the encoder from
 * in-range fields is accepted with the same fields. Any of these abort()s.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "proxy/port_wire.h"
#include "src/host/base/wire.h"

MACO_FUZZ_QUIET_INITIALIZE()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t in[MACO__PORT_HELLO_BYTES + 6];
    memset(in, 0, sizeof(in));
    memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
    const uint8_t *l = in + MACO__PORT_HELLO_BYTES;
    maco__port_hello_limits_t lim = { (uint32_t)maco__get_u16(l) + 1u,
                                      (uint32_t)maco__get_u16(l + 2) + 1u,
                                      (uint32_t)maco__get_u16(l + 4) + 1u };
    maco__port_hello_t h;
    char why[48]; /* short: a long reason must be cut, not overflow */
    memset(why, 'x', sizeof(why));
    if (maco__port_hello_decode(in, &lim, &h, why, sizeof(why)) == 0) {
        MACO_FUZZ_CHECK(h.host_slot < lim.host_sems && h.dev_slot < lim.dev_sems);
        MACO_FUZZ_CHECK(h.channel < lim.channels);
        MACO_FUZZ_CHECK(h.dst_host <= 1 && h.src_host <= 1);
        MACO_FUZZ_CHECK(h.dst_bytes <= UINT64_MAX - h.dst_addr);
        uint8_t again[MACO__PORT_HELLO_BYTES];
        maco__port_hello_encode(again, &h);
        MACO_FUZZ_CHECK(memcmp(again, in, MACO__PORT_HELLO_BYTES) == 0);
    } else {
        MACO_FUZZ_CHECK(memchr(why, '\0', sizeof(why)) != NULL && why[0] != '\0');
    }
    /* The encoder's hello, fields brought into range, is accepted as it was made. */
    maco__port_hello_t mine = h;
    mine.host_slot %= lim.host_sems;
    mine.dev_slot %= lim.dev_sems;
    mine.channel %= lim.channels;
    mine.dst_host &= 1u;
    mine.src_host &= 1u;
    if (mine.dst_bytes > UINT64_MAX - mine.dst_addr)
        mine.dst_bytes = UINT64_MAX - mine.dst_addr;
    uint8_t made[MACO__PORT_HELLO_BYTES];
    maco__port_hello_encode(made, &mine);
    maco__port_hello_t back;
    char why2[160];
    MACO_FUZZ_CHECK(maco__port_hello_decode(made, &lim, &back, why2, sizeof(why2)) == 0);
    MACO_FUZZ_CHECK(memcmp(&back, &mine, sizeof(back)) == 0);
    return 0;
}
