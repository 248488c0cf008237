/*
 * fuzz_tcp_wire.c - libFuzzer harness for the TCP transport's wire format
 * (proxy/transport/tcp/tcp_wire.c): the 64-byte message header and the 32-byte hello that
 * anything reaching a proxy's socket can send, decoded and checked by the same functions the
 * transport calls.
 *
 * Feeds: a 64-byte header, then the receiver's state: u32 receive-buffer bytes (below 64 KiB)
 * and u32 piece size (chunk, below 64 KiB); then a 32-byte hello, u32 expected rank, u64
 * expected uid, u64 expected secret, u8 sockets. Missing bytes read as zero.
 * Checks: decode then encode gives the header back byte for byte, and encode then decode the
 * fields; a header that maco__tcp_header_data_ok accepts is a PUT or VALUE whose payload lies
 * inside the receive buffer (it is written into a buffer of exactly that size, so
 * AddressSanitizer sees any overflow), is not empty, is at most a piece, and a VALUE carries 4
 * or 8 bytes; a hello that maco__tcp_hello_check accepts has the expected magic, version, rank,
 * uid and secret and a socket index below the count; the encoder's hello for those fields is
 * accepted with the same socket index. Any of these abort()s.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "proxy/transport/tcp/tcp_wire.h"
#include "src/host/base/wire.h"

/* Up to n bytes of the input from *pos (zeros past its end). */
static void take(const uint8_t *data, size_t size, size_t *pos, uint8_t *out, size_t n)
{
    memset(out, 0, n);
    if (*pos < size) {
        size_t k = size - *pos < n ? size - *pos : n;
        memcpy(out, data + *pos, k);
    }
    *pos += n;
}

MACO_FUZZ_QUIET_INITIALIZE()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t pos = 0;
    uint8_t hdr[MACO__TCP_HEADER], again[MACO__TCP_HEADER], word[8];
    take(data, size, &pos, hdr, sizeof(hdr));
    take(data, size, &pos, word, 8);
    uint64_t recv_bytes = maco__get_u32(word) % 65536u, chunk = maco__get_u32(word + 4) % 65536u;

    /* Round trips. */
    maco__tcp_header_t m, m2;
    maco__tcp_header_decode(hdr, &m);
    maco__tcp_header_encode(again, &m);
    MACO_FUZZ_CHECK(memcmp(hdr, again, sizeof(hdr)) == 0);
    maco__tcp_header_decode(again, &m2);
    MACO_FUZZ_CHECK(memcmp(&m, &m2, sizeof(m)) == 0);

    /* An accepted payload fits the receive buffer: store it there. */
    if (maco__tcp_header_data_ok(&m, recv_bytes, chunk)) {
        MACO_FUZZ_CHECK(m.kind == MACO__TCP_PUT || m.kind == MACO__TCP_VALUE);
        MACO_FUZZ_CHECK(m.bytes > 0 && m.bytes <= chunk);
        MACO_FUZZ_CHECK(m.offset <= recv_bytes && m.bytes <= recv_bytes - m.offset);
        MACO_FUZZ_CHECK(m.kind != MACO__TCP_VALUE || m.bytes == 4 || m.bytes == 8);
        uint8_t *buf = (uint8_t *)malloc((size_t)recv_bytes);
        MACO_FUZZ_CHECK(buf != NULL);
        memset(buf + m.offset, 0xa5, (size_t)m.bytes);
        free(buf);
    } else if ((m.kind == MACO__TCP_PUT || m.kind == MACO__TCP_VALUE) && m.bytes > 0 &&
               m.bytes <= chunk && m.offset <= recv_bytes && m.bytes <= recv_bytes - m.offset) {
        /* Refused although in range: only a VALUE of another size may be. */
        MACO_FUZZ_CHECK(m.kind == MACO__TCP_VALUE && m.bytes != 4 && m.bytes != 8);
    }

    /* The hello. */
    uint8_t hello[MACO__TCP_HELLO], exp[21];
    take(data, size, &pos, hello, sizeof(hello));
    take(data, size, &pos, exp, sizeof(exp));
    uint32_t peer = maco__get_u32(exp), nsocks = exp[20] % (MACO__TCP_MAX_SOCKS + 1);
    uint64_t uid = maco__get_u64(exp + 4), secret = maco__get_u64(exp + 12);
    uint32_t s = 0xffffffffu;
    if (maco__tcp_hello_check(hello, peer, uid, secret, nsocks, &s)) {
        MACO_FUZZ_CHECK(s < nsocks);
        MACO_FUZZ_CHECK(maco__get_u32(hello) == MACO__TCP_HELLO_MAGIC);
        MACO_FUZZ_CHECK(maco__get_u32(hello + 4) == MACO__TCP_VERSION);
        MACO_FUZZ_CHECK(maco__get_u32(hello + 8) == peer && maco__get_u32(hello + 12) == s);
        MACO_FUZZ_CHECK(maco__get_u64(hello + 16) == uid && maco__get_u64(hello + 24) == secret);
    }
    if (nsocks > 0) {
        maco__tcp_hello_t h = { peer, (uint32_t)(hello[0] % nsocks), uid, secret };
        uint8_t made[MACO__TCP_HELLO];
        maco__tcp_hello_encode(made, &h);
        uint32_t got = 0xffffffffu;
        MACO_FUZZ_CHECK(maco__tcp_hello_check(made, peer, uid, secret, nsocks, &got) == 1);
        MACO_FUZZ_CHECK(got == h.sock);
        /* One field off: refused. */
        MACO_FUZZ_CHECK(!maco__tcp_hello_check(made, peer, uid, secret ^ 1u, nsocks, &got));
        MACO_FUZZ_CHECK(!maco__tcp_hello_check(made, peer + 1u, uid, secret, nsocks, &got));
    }
    return 0;
}
