/*
 * fuzz_unique_id.c - libFuzzer harness for the unique id decoder, maco__unique_id_decode
 * (bootstrap.c), which reads the 128 bytes that a job's processes pass each other to meet.
 *
 * Feeds: exactly MACO_UNIQUE_ID_BYTES bytes (the input zero-padded or truncated to 128).
 * Checks, besides AddressSanitizer and UBSan:
 *   - on failure: MACO_ERR_INVALID_ARGUMENT, and the outputs are untouched;
 *   - on success: the nonce and port are the id's fields; formatting the address
 *     (maco__sockaddr_format) fits the 96-byte buffers the library uses, and into a heap
 *     buffer of every smaller capacity it writes a truncated prefix and nothing past the end;
 *   - re-encoding (maco__unique_id_encode) the decoded nonce and address and decoding again
 *     gives them back, and encoding that gives the same id again (a round trip).
 */
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "fuzz_common.h"
#include "src/host/os/socket.h"
#include "src/host/base/wire.h"

MACO_FUZZ_QUIET_INITIALIZE()

/* Formatting the address into every capacity up to its length writes a NUL-terminated prefix. */
static void check_format(const maco__sockaddr_t *root)
{
    char text[96];
    maco__sockaddr_format(root, text, sizeof(text));
    size_t n = strlen(text);
    /* "[" + the longest IPv6 text (45) + "]:" + 5 port digits. */
    MACO_FUZZ_CHECK(n > 0 && n <= 1 + 45 + 2 + 5);
    MACO_FUZZ_CHECK(strchr(text, ':') != NULL);
    for (size_t cap = 1; cap <= n + 1; cap++) {
        char *out = (char *)malloc(cap); /* exactly cap bytes: ASan sees any overrun */
        MACO_FUZZ_CHECK(out != NULL);
        maco__sockaddr_format(root, out, cap);
        size_t m = strlen(out);
        MACO_FUZZ_CHECK(m == (n < cap - 1 ? n : cap - 1));
        MACO_FUZZ_CHECK(memcmp(out, text, m) == 0);
        free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    maco_unique_id_t id;
    memset(&id, 0, sizeof(id));
    memcpy(id.bytes, data, size < sizeof(id.bytes) ? size : sizeof(id.bytes));

    const uint64_t nonce_canary = 0x5A5A5A5A5A5A5A5Aull;
    uint64_t nonce = nonce_canary;
    maco__sockaddr_t root, root_canary;
    memset(&root_canary, 0xA5, sizeof(root_canary));
    root = root_canary;
    maco_status_t st = maco__unique_id_decode(&id, &nonce, &root);
    if (st != MACO_OK) {
        MACO_FUZZ_CHECK(st == MACO_ERR_INVALID_ARGUMENT);
        MACO_FUZZ_CHECK(nonce == nonce_canary);
        MACO_FUZZ_CHECK(memcmp(&root, &root_canary, sizeof(root)) == 0);
        return 0;
    }
    MACO_FUZZ_CHECK(nonce == maco__get_u64(id.bytes + 8));
    int family = root.ss.ss_family;
    MACO_FUZZ_CHECK(family == AF_INET || family == AF_INET6);
    MACO_FUZZ_CHECK(root.len ==
                    (family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)));
    MACO_FUZZ_CHECK(maco__sockaddr_port(&root) == maco__get_u16(id.bytes + 18));
    check_format(&root);

    /* Round trip: encode, decode, encode. */
    maco_unique_id_t id2, id3;
    maco__unique_id_encode(&id2, nonce, &root);
    uint64_t nonce2 = 0;
    maco__sockaddr_t root2;
    MACO_FUZZ_CHECK(maco__unique_id_decode(&id2, &nonce2, &root2) == MACO_OK);
    MACO_FUZZ_CHECK(nonce2 == nonce);
    MACO_FUZZ_CHECK(memcmp(&root2, &root, sizeof(root)) == 0);
    maco__unique_id_encode(&id3, nonce2, &root2);
    MACO_FUZZ_CHECK(memcmp(&id3, &id2, sizeof(id2)) == 0);
    /* The re-encoded id agrees with the input on every field the decoder reads. */
    size_t addr_bytes = family == AF_INET ? 4 : 16;
    MACO_FUZZ_CHECK(memcmp(id2.bytes, id.bytes, 6) == 0);
    MACO_FUZZ_CHECK(memcmp(id2.bytes + 8, id.bytes + 8, 8 + 4 + addr_bytes) == 0);
    if (family == AF_INET6)
        MACO_FUZZ_CHECK(memcmp(id2.bytes + 36, id.bytes + 36, 4) == 0);
    return 0;
}
