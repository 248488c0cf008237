/*
 * fuzz_ib_endpoint.c - libFuzzer harness for the IB transport's endpoint and ready messages
 * (proxy/transport/ib/ib_wire.c): what a peer's transport sends over the bootstrap for each
 * port channel.
 *
 * Feeds: MACO__IB_ENDPOINT bytes of endpoint, one byte of this port's link layer, then
 * MACO__IB_READY bytes of a ready message. Missing bytes read as zero.
 * Checks: an endpoint that decodes is this build's and encodes back to the same bytes but for
 * the reserved ones and the PSN's top byte; decode, encode and decode again give the same
 * fields; maco__ib_endpoint_port_ok holds exactly when the link layers match, the MTU code is
 * 1 to 5 and Ethernet comes with a GID; a ready message is taken exactly when it is this
 * build's and says 1, and the encoder's ready messages read back as made. Any of these abort()s.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "proxy/transport/ib/ib_wire.h"
#include "src/host/base/wire.h"

MACO_FUZZ_QUIET_INITIALIZE()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t in[MACO__IB_ENDPOINT + 1 + MACO__IB_READY];
    memset(in, 0, sizeof(in));
    memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
    const uint8_t link = in[MACO__IB_ENDPOINT];
    const uint8_t *ready = in + MACO__IB_ENDPOINT + 1;

    maco__ib_endpoint_t e, e2;
    int ok = maco__ib_endpoint_decode(in, &e) == 0;
    MACO_FUZZ_CHECK(
        ok == (maco__get_u32(in) == MACO__IB_MAGIC && maco__get_u16(in + 4) == MACO__IB_VERSION));
    MACO_FUZZ_CHECK(e.psn <= 0xffffffu);
    uint8_t again[MACO__IB_ENDPOINT];
    maco__ib_endpoint_encode(again, &e);
    MACO_FUZZ_CHECK(maco__ib_endpoint_decode(again, &e2) == 0);
    MACO_FUZZ_CHECK(memcmp(&e, &e2, sizeof(e)) == 0);
    if (ok) {
        uint8_t want[MACO__IB_ENDPOINT];
        memcpy(want, in, sizeof(want));
        want[23] = 0;                   /* the PSN's top byte */
        memset(want + 30, 0, 2);        /* reserved */
        memset(want + 84, 0, 128 - 84); /* reserved */
        MACO_FUZZ_CHECK(memcmp(again, want, sizeof(want)) == 0);
    }
    int port = maco__ib_endpoint_port_ok(&e, link);
    MACO_FUZZ_CHECK(port == (e.link_layer == link && e.mtu >= 1 && e.mtu <= 5 &&
                             (link != MACO__IB_LINK_ETH || e.gid_valid != 0)));

    int r = maco__ib_ready_ok(ready);
    MACO_FUZZ_CHECK(r == (maco__get_u32(ready) == MACO__IB_MAGIC &&
                          maco__get_u16(ready + 4) == MACO__IB_VERSION &&
                          maco__get_u16(ready + 6) == 1u));
    uint8_t made[MACO__IB_READY];
    maco__ib_ready_encode(made, 1);
    MACO_FUZZ_CHECK(maco__ib_ready_ok(made) == 1);
    maco__ib_ready_encode(made, 0);
    MACO_FUZZ_CHECK(maco__ib_ready_ok(made) == 0);
    return 0;
}
