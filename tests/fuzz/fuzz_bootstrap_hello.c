/*
 * fuzz_bootstrap_hello.c - libFuzzer harness for the bootstrap's setup handshake
 * (src/host/bootstrap/handshake.c): what a connecting process sends to a rank that accepts,
 * and what an accepting process answers a rank that connects.
 *
 * Feeds: u64 job nonce, one byte of options (bit 0: the accepting side takes HELLO, else
 * PEER_HELLO; bits 1-2: the hello arrives in pieces of 1, 7, 64 or all its bytes), then a
 * 184-byte hello, a 40-byte proof message and a 56-byte answer (fewer bytes are zeros). Both
 * sides run over socket pairs, never waiting (their deadline has passed).
 * Checks: the accepting side's verdict follows from the bytes (MACO's magic, the version,
 * the kind); after a good hello it sends a challenge whose proof is the one
 * maco__hello_proof gives; a made-up proof never passes and a REFUSED message is reported as
 * such; the right proof passes. The connecting side never takes a made-up answer, and takes
 * the right one, after which its own proof is the right one.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/wire.h"
#include "fuzz_common.h"

MACO_FUZZ_QUIET_INITIALIZE()

enum { IN_BYTES = 9 + MACO__HELLO_BYTES + MACO__HS_PROOF_BYTES + MACO__HS_CHALLENGE_BYTES };

/* Reads exactly `len` bytes that are already in the socket: 1, else 0. */
static int take(int fd, uint8_t *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, buf + got, len - got, MSG_DONTWAIT);
        if (n <= 0)
            return 0;
        got += (size_t)n;
    }
    return 1;
}

/* The verdict the accepting side must reach on `hello` (MORE: it answers with a challenge). */
static int expected_verdict(const uint8_t *hello, uint16_t kind)
{
    if (maco__get_u32(hello) != MACO__ID_MAGIC)
        return MACO__HS_NOT_MACO;
    if (maco__get_u16(hello + 4) == 1)
        return MACO__HS_OLD_VERSION;
    if (maco__get_u16(hello + 4) != MACO__HELLO_VERSION || maco__get_u16(hello + 6) != kind)
        return MACO__HS_BAD_HELLO;
    return MACO__HS_MORE;
}

/* The accepting side: the hello in pieces, then the proof message (NULL: the right one);
 * returns the challenge the side sent in challenge[] (when it sent one) and its last verdict. */
static int serve(uint64_t nonce, uint16_t kind, const uint8_t *hello, size_t piece,
                 const uint8_t *proof_msg, uint8_t *challenge)
{
    int sv[2];
    MACO_FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    maco__hs_server_t hs;
    memset(&hs, 0, sizeof(hs));
    int r = MACO__HS_MORE;
    for (size_t at = 0; at < MACO__HELLO_BYTES && r == MACO__HS_MORE; at += piece) {
        size_t n = MACO__HELLO_BYTES - at < piece ? MACO__HELLO_BYTES - at : piece;
        MACO_FUZZ_CHECK(send(sv[1], hello + at, n, 0) == (ssize_t)n);
        r = maco__handshake_serve(&hs, sv[0], kind, nonce);
    }
    if (r == MACO__HS_MORE) {
        uint8_t msg[MACO__HS_CHALLENGE_BYTES];
        MACO_FUZZ_CHECK(take(sv[1], msg, sizeof(msg)));
        MACO_FUZZ_CHECK(maco__get_u32(msg) == MACO__ID_MAGIC);
        MACO_FUZZ_CHECK(maco__get_u16(msg + 4) == MACO__HELLO_VERSION);
        MACO_FUZZ_CHECK(maco__get_u16(msg + 6) == MACO__KIND_CHALLENGE);
        memcpy(challenge, msg + 8, MACO__HS_CHALLENGE);
        uint8_t want[MACO__HS_PROOF];
        maco__hello_proof(nonce, 1, hello, challenge, want);
        MACO_FUZZ_CHECK(memcmp(msg + 8 + MACO__HS_CHALLENGE, want, sizeof(want)) == 0);
        uint8_t right[MACO__HS_PROOF_BYTES];
        if (proof_msg == NULL) { /* the connecting side's right proof */
            memset(right, 0, sizeof(right));
            maco__put_u32(right, MACO__ID_MAGIC);
            maco__put_u16(right + 4, MACO__HELLO_VERSION);
            maco__put_u16(right + 6, MACO__KIND_PROOF);
            maco__hello_proof(nonce, 0, hello, challenge, right + 8);
            proof_msg = right;
        }
        MACO_FUZZ_CHECK(send(sv[1], proof_msg, MACO__HS_PROOF_BYTES, 0) == MACO__HS_PROOF_BYTES);
        r = maco__handshake_serve(&hs, sv[0], kind, nonce);
    }
    close(sv[0]);
    close(sv[1]);
    return r;
}

/* The connecting side given `answer` (or, when `right`, the accepting side's right answer
 * over answer's challenge): whether it finished. */
static int connect_side(uint64_t nonce, const uint8_t *answer, int right)
{
    int sv[2];
    MACO_FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    maco__hs_client_t hc;
    int64_t past = maco__now_ms() - 1;
    MACO_FUZZ_CHECK(maco__handshake_begin(&hc, sv[1], MACO__KIND_PEER_HELLO, nonce, 2, 3, NULL,
                                          NULL, past, "the fuzzer") == MACO_OK);
    uint8_t hello[MACO__HELLO_BYTES], msg[MACO__HS_CHALLENGE_BYTES];
    MACO_FUZZ_CHECK(take(sv[0], hello, sizeof(hello)));
    memcpy(msg, answer, sizeof(msg));
    if (right) {
        maco__put_u32(msg, MACO__ID_MAGIC);
        maco__put_u16(msg + 4, MACO__HELLO_VERSION);
        maco__put_u16(msg + 6, MACO__KIND_CHALLENGE);
        maco__hello_proof(nonce, 1, hello, msg + 8, msg + 8 + MACO__HS_CHALLENGE);
    }
    MACO_FUZZ_CHECK(send(sv[0], msg, sizeof(msg), 0) == (ssize_t)sizeof(msg));
    maco_status_t st = maco__handshake_advance(&hc, sv[1], past);
    MACO_FUZZ_CHECK(st == MACO_OK || st == MACO_ERR_REMOTE || st == MACO_ERR_TIMEOUT);
    MACO_FUZZ_CHECK(hc.done == (st == MACO_OK));
    if (hc.done) {
        uint8_t proof[MACO__HS_PROOF_BYTES], want[MACO__HS_PROOF];
        MACO_FUZZ_CHECK(take(sv[0], proof, sizeof(proof)));
        maco__hello_proof(nonce, 0, hello, msg + 8, want);
        MACO_FUZZ_CHECK(maco__get_u16(proof + 6) == MACO__KIND_PROOF);
        MACO_FUZZ_CHECK(memcmp(proof + 8, want, sizeof(want)) == 0);
    }
    close(sv[0]);
    close(sv[1]);
    return hc.done;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t in[IN_BYTES];
    memset(in, 0, sizeof(in));
    memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
    uint64_t nonce = maco__get_u64(in);
    uint16_t kind = (in[8] & 1) ? MACO__KIND_HELLO : MACO__KIND_PEER_HELLO;
    static const size_t pieces[4] = { 1, 7, 64, MACO__HELLO_BYTES };
    size_t piece = pieces[(in[8] >> 1) & 3];
    const uint8_t *hello = in + 9;
    const uint8_t *proof_msg = hello + MACO__HELLO_BYTES;
    const uint8_t *answer = proof_msg + MACO__HS_PROOF_BYTES;

    uint8_t challenge[MACO__HS_CHALLENGE];
    int want = expected_verdict(hello, kind);
    int r = serve(nonce, kind, hello, piece, proof_msg, challenge);
    if (want != MACO__HS_MORE) {
        MACO_FUZZ_CHECK(r == want);
    } else {
        /* A made-up proof fails (the challenge was drawn after the input was made). */
        int refused = maco__get_u32(proof_msg) == MACO__ID_MAGIC &&
                      maco__get_u16(proof_msg + 4) == MACO__HELLO_VERSION &&
                      maco__get_u16(proof_msg + 6) == MACO__KIND_REFUSED;
        MACO_FUZZ_CHECK(r == (refused ? MACO__HS_PEER_REFUSED : MACO__HS_BAD_PROOF));
        MACO_FUZZ_CHECK(serve(nonce, kind, hello, piece, NULL, challenge) == MACO__HS_DONE);
    }
    /* Nothing made up is taken for the accepting side's answer; the right one is. */
    MACO_FUZZ_CHECK(!connect_side(nonce, answer, 0));
    MACO_FUZZ_CHECK(connect_side(nonce, answer, 1));
    return 0;
}
