/*
 * fuzz_link_frames.c - libFuzzer harness for the bootstrap's link-frame receive path
 * (maco__peer_read, maco__rx_frame_start, maco__rx_message_done in bootstrap.c): what a peer
 * rank, or anything that reached its socket, sends on an established link.
 *
 * Feeds: maco__bootstrap_fuzz_link's input (bootstrap_internal.h): a 12-byte prefix that
 * chooses up to three posted receives (tag, size) and when the last is posted, then the byte
 * stream peer 1 sends, frames {u16 kind, u16 reserved, u32 tag, u64 length} + payload, read
 * over a socketpair in two parts until the link ends. Keep inputs <= 64 KiB (-max_len) so the
 * stream fits the socket buffer.
 * Checks: AddressSanitizer and UBSan see no error, in particular no write past a posted
 * receive's buffer (each is allocated with exactly its size), no leak of buffered messages,
 * and no leaked descriptor (the setup would fail with MACO_ERR_SYSTEM); afterwards the link
 * has ended or the bootstrap failed, and the receive lists are consistent (the function
 * returns MACO_ERR_INTERNAL otherwise). Any of these abort()s.
 */
#include <stdint.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "fuzz_common.h"

MACO_FUZZ_QUIET_INITIALIZE()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    maco_status_t st = maco__bootstrap_fuzz_link(data, size);
    /* Rejected streams fail the bootstrap (MACO_ERR_REMOTE); anything else is a bug. */
    MACO_FUZZ_CHECK(st == MACO_OK || st == MACO_ERR_REMOTE);
    return 0;
}
