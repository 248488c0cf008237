/* handshake.c - the setup handshake (bootstrap_private.h, "Setup protocol", step 0): every
 * connection of the setup, whatever its kind of hello, proves the job nonce both ways without
 * sending it; and the bounded reads and writes of the setup. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/log.h"
#include "src/host/base/sha256.h"
#include "src/host/base/wire.h"

maco_status_t maco__write_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                              const char *what)
{
    const uint8_t *p = (const uint8_t *)buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP, "sending to %s: %s", what,
                               strerror(errno));
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP, "sending to %s timed out",
                               what);
        struct pollfd pfd = { .fd = fd, .events = POLLOUT, .revents = 0 };
        poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
    }
    return MACO_OK;
}

maco_status_t maco__read_all(int fd, void *buf, size_t len, int64_t deadline_ms, const char *what)
{
    uint8_t *p = (uint8_t *)buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                               "%s closed the connection during setup", what);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP, "receiving from %s: %s",
                               what, strerror(errno));
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                               "waiting for %s timed out (MACO_BOOTSTRAP_TIMEOUT sets the "
                               "deadline)",
                               what);
        struct pollfd pfd = { .fd = fd, .events = POLLIN, .revents = 0 };
        poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
    }
    return MACO_OK;
}

/* ------------------------------------------------------------------ wire */

/* Fills `out` with random bytes (getrandom through maco__random_u64). */
static void maco__random_bytes(uint8_t *out, size_t len)
{
    for (size_t i = 0; i < len; i += 8) {
        uint8_t v[8];
        maco__put_u64(v, maco__random_u64());
        memcpy(out + i, v, len - i < 8 ? len - i : 8);
    }
}

void maco__hello_make(uint8_t *out, maco__hello_t *h, const maco__sockaddr_t *listen_addr,
                      const char *host_id)
{
    maco__random_bytes(h->challenge, sizeof(h->challenge));
    memset(out, 0, MACO__HELLO_BYTES);
    maco__put_u32(out, MACO__ID_MAGIC);
    maco__put_u16(out + 4, MACO__HELLO_VERSION);
    maco__put_u16(out + 6, h->kind);
    maco__put_u32(out + 8, h->rank);
    maco__put_u32(out + 12, h->nranks);
    memcpy(out + 16, h->challenge, MACO__HS_CHALLENGE);
    if (listen_addr != NULL)
        maco__sockaddr_to_wire(listen_addr, out + MACO__HELLO_ENTRY);
    if (host_id != NULL)
        snprintf((char *)out + MACO__HELLO_ENTRY + MACO__WIRE_ADDR_BYTES, MACO__HOST_ID_BYTES, "%s",
                 host_id);
}

int maco__hello_read(const uint8_t *in, maco__hello_t *h)
{
    if (maco__get_u32(in) != MACO__ID_MAGIC || maco__get_u16(in + 4) != MACO__HELLO_VERSION)
        return -1;
    h->kind = maco__get_u16(in + 6);
    h->rank = maco__get_u32(in + 8);
    h->nranks = maco__get_u32(in + 12);
    memcpy(h->challenge, in + 16, MACO__HS_CHALLENGE);
    return 0;
}

void maco__hello_proof(uint64_t nonce, int server, const uint8_t *hello,
                       const uint8_t challenge[MACO__HS_CHALLENGE], uint8_t out[MACO__HS_PROOF])
{
    /* Labels of one length, so that no label is a prefix of the other's message. */
    static const char server_label[] = "MACO-hello-v2 server";
    static const char client_label[] = "MACO-hello-v2 client";
    uint8_t key[8];
    maco__put_u64(key, nonce);
    maco__bytes_t parts[3] = {
        { server ? server_label : client_label, sizeof(server_label) - 1 },
        { hello, MACO__HELLO_BYTES },
        { challenge, MACO__HS_CHALLENGE },
    };
    maco__hmac_sha256(key, sizeof(key), parts, 3, out);
}

/* Writes a PROOF or REFUSED message (`proof` NULL: zeros) into out[MACO__HS_PROOF_BYTES]. */
static void maco__proof_message(uint8_t *out, uint16_t kind, const uint8_t *proof)
{
    memset(out, 0, MACO__HS_PROOF_BYTES);
    maco__put_u32(out, MACO__ID_MAGIC);
    maco__put_u16(out + 4, MACO__HELLO_VERSION);
    maco__put_u16(out + 6, kind);
    if (proof != NULL)
        memcpy(out + 8, proof, MACO__HS_PROOF);
}

/* ------------------------------------------------------------------ the accepting side */

/* Sends the challenge and this side's proof for the hello in hs->hello. */
static int maco__handshake_challenge(maco__hs_server_t *hs, int fd, uint64_t nonce)
{
    uint8_t msg[MACO__HS_CHALLENGE_BYTES];
    maco__random_bytes(hs->challenge, sizeof(hs->challenge));
    maco__put_u32(msg, MACO__ID_MAGIC);
    maco__put_u16(msg + 4, MACO__HELLO_VERSION);
    maco__put_u16(msg + 6, MACO__KIND_CHALLENGE);
    memcpy(msg + 8, hs->challenge, MACO__HS_CHALLENGE);
    maco__hello_proof(nonce, 1, hs->hello, hs->challenge, msg + 8 + MACO__HS_CHALLENGE);
    /* A fresh connection's send buffer takes these 56 bytes at once; one that does not is
     * not a rank worth waiting for. */
    ssize_t n;
    do {
        n = send(fd, msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof(msg) ? MACO__HS_MORE : MACO__HS_CLOSED;
}

/* A whole hello arrived: checks it and answers. */
static int maco__handshake_hello(maco__hs_server_t *hs, int fd, uint16_t kind, uint64_t nonce)
{
    maco__hello_t h;
    if (maco__hello_read(hs->hello, &h) != 0 || h.kind != kind)
        return MACO__HS_BAD_HELLO;
    hs->stage = 1;
    hs->got = 0;
    return maco__handshake_challenge(hs, fd, nonce);
}

/* A whole proof (or refusal) arrived: checks it. */
static int maco__handshake_check(const maco__hs_server_t *hs, uint64_t nonce)
{
    const uint8_t *m = hs->proof;
    if (maco__get_u32(m) != MACO__ID_MAGIC || maco__get_u16(m + 4) != MACO__HELLO_VERSION)
        return MACO__HS_BAD_PROOF;
    if (maco__get_u16(m + 6) == MACO__KIND_REFUSED)
        return MACO__HS_PEER_REFUSED;
    uint8_t want[MACO__HS_PROOF];
    maco__hello_proof(nonce, 0, hs->hello, hs->challenge, want);
    if (maco__get_u16(m + 6) != MACO__KIND_PROOF || !maco__bytes_equal(m + 8, want, sizeof(want)))
        return MACO__HS_BAD_PROOF;
    return MACO__HS_DONE;
}

int maco__handshake_serve(maco__hs_server_t *hs, int fd, uint16_t kind, uint64_t nonce)
{
    for (;;) {
        uint8_t *buf = hs->stage == 0 ? hs->hello : hs->proof;
        size_t want = hs->stage == 0 ? MACO__HELLO_BYTES : MACO__HS_PROOF_BYTES;
        ssize_t n = recv(fd, buf + hs->got, want - hs->got, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return MACO__HS_MORE;
        if (n <= 0)
            return MACO__HS_CLOSED;
        hs->got += (size_t)n;
        if (hs->stage == 0) {
            if (hs->got >= 4 && maco__get_u32(hs->hello) != MACO__ID_MAGIC)
                return MACO__HS_NOT_MACO;
            if (hs->got >= 6 && maco__get_u16(hs->hello + 4) != MACO__HELLO_VERSION)
                return maco__get_u16(hs->hello + 4) == 1 ? MACO__HS_OLD_VERSION
                                                         : MACO__HS_BAD_HELLO;
            if (hs->got == want) {
                int r = maco__handshake_hello(hs, fd, kind, nonce);
                if (r != MACO__HS_MORE)
                    return r;
            }
        } else if (hs->got == want) {
            return maco__handshake_check(hs, nonce);
        }
    }
}

/* ------------------------------------------------------------------ the connecting side */

/* Reads exactly `len` bytes before the deadline without logging: 0, or the error that stopped
 * it (MACO_ERR_REMOTE: closed or failed, with *why; MACO_ERR_TIMEOUT). */
static maco_status_t maco__handshake_recv(int fd, uint8_t *buf, size_t len, int64_t deadline_ms,
                                          char *why, size_t cap)
{
    while (len > 0) {
        ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            snprintf(why, cap, "%s", n == 0 ? "it closed the connection" : strerror(errno));
            return MACO_ERR_REMOTE;
        }
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            return MACO_ERR_TIMEOUT;
        struct pollfd pfd = { .fd = fd, .events = POLLIN, .revents = 0 };
        poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
    }
    return MACO_OK;
}

/* The accepting side answered with a frame instead of a challenge (hdr[0, got) arrived, at
 * least its header): an INIT_ERROR says why it refused this process; anything else is outside
 * the protocol. */
static maco_status_t maco__handshake_frame(int fd, const uint8_t *hdr, size_t got,
                                           int64_t deadline_ms, const char *who)
{
    uint64_t len = maco__get_u64(hdr + 8);
    if (maco__get_u16(hdr) == MACO__FRAME_INIT_ERROR && len < 4096) {
        char text[4096], why[128];
        size_t have = got - MACO__FRAME_HDR_BYTES;
        if (have > len)
            have = (size_t)len;
        memcpy(text, hdr + MACO__FRAME_HDR_BYTES, have);
        if (maco__handshake_recv(fd, (uint8_t *)text + have, (size_t)len - have, deadline_ms, why,
                                 sizeof(why)) != MACO_OK)
            len = have;
        text[len] = '\0';
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP, "%s refused this process: %s",
                           who, text);
    }
    return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                       "%s answered this rank's hello with bytes that are not MACO's setup "
                       "handshake (another program listens there, or a MACO of another "
                       "version?); this rank refuses it",
                       who);
}

maco_status_t maco__handshake_begin(maco__hs_client_t *hc, int fd, uint16_t kind, uint64_t nonce,
                                    int rank, int nranks, const maco__sockaddr_t *listen_addr,
                                    const char *host_id, int64_t deadline_ms, const char *who)
{
    memset(hc, 0, sizeof(*hc));
    hc->nonce = nonce;
    snprintf(hc->who, sizeof(hc->who), "%s", who);
    maco__hello_t h = { .kind = kind, .rank = (uint32_t)rank, .nranks = (uint32_t)nranks };
    maco__hello_make(hc->hello, &h, listen_addr, host_id);
    return maco__write_all(fd, hc->hello, sizeof(hc->hello), deadline_ms, who);
}

/* The whole answer is in: checks the accepting side's proof, then sends this side's. */
static maco_status_t maco__handshake_prove(maco__hs_client_t *hc, int fd, int64_t deadline_ms)
{
    const uint8_t *msg = hc->answer;
    if (maco__get_u16(msg + 4) != MACO__HELLO_VERSION ||
        maco__get_u16(msg + 6) != MACO__KIND_CHALLENGE)
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "%s answered with setup wire version %u (message kind %u); this rank "
                           "runs version %u: every rank needs the same MACO",
                           hc->who, maco__get_u16(msg + 4), maco__get_u16(msg + 6),
                           MACO__HELLO_VERSION);
    const uint8_t *challenge = msg + 8;
    uint8_t want[MACO__HS_PROOF], reply[MACO__HS_PROOF_BYTES];
    maco__hello_proof(hc->nonce, 1, hc->hello, challenge, want);
    if (!maco__bytes_equal(msg + 8 + MACO__HS_CHALLENGE, want, sizeof(want))) {
        /* Said so (a refusal tells nothing about the nonce), then refused. */
        maco__proof_message(reply, MACO__KIND_REFUSED, NULL);
        (void)send(fd, reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "%s did not prove that it knows this job's nonce: it is a process of "
                           "another job (every rank needs the same job nonce: "
                           "MACO_BOOTSTRAP_NONCE or the unique id's) or not a MACO rank at all; "
                           "this rank refuses it and sent it nothing secret",
                           hc->who);
    }
    maco__hello_proof(hc->nonce, 0, hc->hello, challenge, want);
    maco__proof_message(reply, MACO__KIND_PROOF, want);
    maco_status_t st = maco__write_all(fd, reply, sizeof(reply), deadline_ms, hc->who);
    if (st == MACO_OK)
        hc->done = 1;
    return st;
}

maco_status_t maco__handshake_advance(maco__hs_client_t *hc, int fd, int64_t deadline_ms)
{
    while (!hc->done) {
        ssize_t n = recv(fd, hc->answer + hc->got, sizeof(hc->answer) - hc->got, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return MACO_OK;
        if (n <= 0)
            return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                               "%s did not answer this rank's hello (%s) before proving that it "
                               "knows the job nonce: a process of another job refusing this one, "
                               "or a MACO of another version?",
                               hc->who, n == 0 ? "it closed the connection" : strerror(errno));
        hc->got += (size_t)n;
        /* Not a challenge: a frame (an INIT_ERROR), once its header is in. */
        int frame = hc->got >= 4 && maco__get_u32(hc->answer) != MACO__ID_MAGIC;
        if (frame && hc->got >= MACO__FRAME_HDR_BYTES)
            return maco__handshake_frame(fd, hc->answer, hc->got, deadline_ms, hc->who);
        if (!frame && hc->got == sizeof(hc->answer))
            return maco__handshake_prove(hc, fd, deadline_ms);
    }
    return MACO_OK;
}

maco_status_t maco__handshake_connect(int fd, uint16_t kind, uint64_t nonce, int rank, int nranks,
                                      const maco__sockaddr_t *listen_addr, const char *host_id,
                                      int64_t deadline_ms, const char *who,
                                      maco_status_t (*stop)(void *ctx), void *stop_ctx)
{
    maco__hs_client_t hc;
    maco_status_t st = maco__handshake_begin(&hc, fd, kind, nonce, rank, nranks, listen_addr,
                                             host_id, deadline_ms, who);
    int64_t slice = stop != NULL ? 200 : 1000; /* how often `stop` is asked */
    while (st == MACO_OK && !hc.done) {
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            return maco__handshake_timed_out(&hc);
        struct pollfd pfd = { .fd = fd, .events = POLLIN, .revents = 0 };
        if (poll(&pfd, 1, (int)(left > slice ? slice : left)) > 0)
            st = maco__handshake_advance(&hc, fd, deadline_ms);
        else if (stop != NULL)
            st = stop(stop_ctx);
    }
    return st;
}

maco_status_t maco__handshake_timed_out(const maco__hs_client_t *hc)
{
    return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                       "%s accepted the connection but did not answer this rank's hello before "
                       "the deadline (MACO_BOOTSTRAP_TIMEOUT sets it): is that rank stuck, or is "
                       "another program listening there?",
                       hc->who);
}
