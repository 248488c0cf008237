/* torch_store.c - the unique id through torchrun's key-value store.
 *
 * torchrun's agent listens on MASTER_ADDR:MASTER_PORT itself (a c10d TCPStore its workers
 * share: TORCHELASTIC_USE_AGENT_STORE=True), so rank 0 of a MACO job started by torchrun cannot
 * listen there. Instead rank 0 creates a unique id (a socket of its own, any free port) and
 * publishes it in that store; the other ranks wait for the key and read it. The Python package
 * does the same through torch's client (python-bindings/maco/_comm.py); this is the C side, for
 * programs that have no Python.
 *
 * The wire protocol is c10d's TCPStore client protocol (PyTorch's
 * torch/csrc/distributed/c10d/TCPStore.cpp and TCPStoreBackend.hpp, stable since PyTorch 2.0;
 * checked in CI against torchrun of the PyTorch in the tests' virtual environment): a query is
 * one byte of query type followed by its arguments; a string or byte vector is a little-endian
 * uint64 length and the bytes; every connection first sends VALIDATE with the magic number.
 *   VALIDATE(0) u32 magic                   -> (nothing)
 *   SET(1)      string key, bytes value     -> (nothing)
 *   GET(3)      string key                  -> bytes value
 *   WAIT(6)     u64 nkeys, string key...    -> u8 0 (STOP_WAITING) once every key exists
 * (A GET is sent only after its WAIT was answered, as torch's own client does.)
 * Keys are written with torch's prefix "/" so a Python `store.get("maco/...")` sees them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"

enum {
    MACO__TS_VALIDATE = 0,
    MACO__TS_SET = 1,
    MACO__TS_GET = 3,
    MACO__TS_WAIT = 6,
};
#define MACO__TS_MAGIC 0x3C85F7CEu

/* Appends a little-endian integer of `n` bytes. */
static size_t maco__ts_put(uint8_t *out, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = (uint8_t)(v >> (8 * i));
    return (size_t)n;
}

/* Appends a c10d string: u64 length, then the bytes. */
static size_t maco__ts_put_bytes(uint8_t *out, const void *data, size_t len)
{
    size_t n = maco__ts_put(out, len, 8);
    memcpy(out + n, data, len);
    return n + len;
}

int maco__torch_store_wanted(void)
{
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    return agent != NULL && strcasecmp(agent, "true") == 0 &&
           !maco__config_is_set(MACO_CFG_BOOTSTRAP_ADDR);
}

maco_status_t maco__torch_store_unique_id(const maco__sockaddr_t *store, const char *store_text,
                                          int rank, maco_unique_id_t *id)
{
    static int counter; /* creations from the environment so far in this process */
    int seq = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    const char *run = getenv("TORCHELASTIC_RUN_ID"),
               *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    char key[320];
    /* Its own prefix: the Python package's keys are "maco/unique_id/...", and a process may use
     * both (each counts its own creations). */
    snprintf(key, sizeof(key), "/maco/c_unique_id/%.200s/%.16s/%d", run ? run : "run",
             restart ? restart : "0", seq);
    int64_t timeout = 0;
    maco_status_t st = maco__config_int64(MACO_CFG_BOOTSTRAP_TIMEOUT, &timeout);
    if (st != MACO_OK)
        return st;
    int64_t deadline = maco__deadline_ms(timeout);
    char what[320];
    snprintf(what, sizeof(what), "torchrun's store at %s", store_text);
    if (rank == 0) {
        st = maco_unique_id_create(id);
        if (st != MACO_OK)
            return st;
    }
    int fd = -1;
    st = maco__socket_connect(store, deadline, "torchrun's store", &fd); /* adds the address */
    if (st != MACO_OK)
        return st;
    uint8_t msg[8 + 2 * (9 + sizeof(key)) + MACO_UNIQUE_ID_BYTES];
    size_t n = 0;
    msg[n++] = MACO__TS_VALIDATE;
    n += maco__ts_put(msg + n, MACO__TS_MAGIC, 4);
    if (rank == 0) {
        msg[n++] = MACO__TS_SET;
        n += maco__ts_put_bytes(msg + n, key, strlen(key));
        n += maco__ts_put_bytes(msg + n, id->bytes, MACO_UNIQUE_ID_BYTES);
    }
    /* Every rank (rank 0 too: it proves the store took the value) waits for the key, then
     * reads it. The GET goes out only after the wait's answer: a store answers a GET of a key
     * that does not exist yet at once (libuv's with an empty value), without queueing it. */
    msg[n++] = MACO__TS_WAIT;
    n += maco__ts_put(msg + n, 1, 8);
    n += maco__ts_put_bytes(msg + n, key, strlen(key));
    st = maco__write_all(fd, msg, n, deadline, what);
    uint8_t reply[8] = { 0 };
    if (st == MACO_OK)
        st = maco__read_all(fd, reply, 1, deadline, what);
    if (st == MACO_ERR_TIMEOUT)
        st = maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                         "rank 0 did not publish its unique id under key '%s' in %s within "
                         "%lld ms (MACO_BOOTSTRAP_TIMEOUT sets the deadline): is rank 0 running?",
                         key, what, (long long)timeout);
    if (st == MACO_OK && reply[0] != 0)
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                         "%s answered the wait for key '%s' with %u, not 0 (STOP_WAITING): is "
                         "MASTER_PORT torchrun's store?",
                         what, key, reply[0]);
    if (st == MACO_OK) {
        n = 0;
        msg[n++] = MACO__TS_GET;
        n += maco__ts_put_bytes(msg + n, key, strlen(key));
        st = maco__write_all(fd, msg, n, deadline, what);
    }
    if (st == MACO_OK)
        st = maco__read_all(fd, reply, 8, deadline, what);
    uint64_t len = 0;
    for (int i = 0; i < 8; i++)
        len |= (uint64_t)reply[i] << (8 * i);
    if (st == MACO_OK && len != MACO_UNIQUE_ID_BYTES)
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                         "key '%s' in %s holds %llu bytes, not a %d-byte unique id", key, what,
                         (unsigned long long)len, MACO_UNIQUE_ID_BYTES);
    maco_unique_id_t got;
    if (st == MACO_OK)
        st = maco__read_all(fd, got.bytes, MACO_UNIQUE_ID_BYTES, deadline, what);
    close(fd);
    if (st != MACO_OK)
        return st;
    if (rank == 0 && memcmp(got.bytes, id->bytes, MACO_UNIQUE_ID_BYTES) != 0)
        return maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_BOOTSTRAP,
                           "key '%s' in %s holds another unique id than the one rank 0 just "
                           "stored: two jobs with the same TORCHELASTIC_RUN_ID?",
                           key, what);
    if (rank != 0)
        *id = got;
    MACO_INFO(MACO_SUBSYS_BOOTSTRAP, "unique id %s key '%s' of %s",
              rank == 0 ? "stored as" : "read from", key, what);
    return MACO_OK;
}
