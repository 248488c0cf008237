/*
 * make_corpus.c - writes the fuzzers' seed corpus (tests/fuzz/corpus): a few valid and
 * near-valid inputs per harness, valid unique ids made by the library's own encoder.
 * Built by build.sh; run as `make_corpus tests/fuzz/corpus` to regenerate what is committed.
 * Deterministic: the same files every time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/memory/mem_handle.h"
#include "src/host/os/socket.h"
#include "src/host/base/wire.h"

static const char *out_dir;

static void write_seed(const char *fuzzer, const char *name, const void *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", out_dir, fuzzer);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", out_dir, fuzzer, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* ------------------------------------------------------------------ unique ids */

static void seeds_unique_id(void)
{
    maco__sockaddr_t a;
    maco_unique_id_t id;
    memset(&a, 0, sizeof(a));
    struct sockaddr_in *v4 = (struct sockaddr_in *)&a.ss;
    v4->sin_family = AF_INET;
    v4->sin_port = htons(29500);
    inet_pton(AF_INET, "127.0.0.1", &v4->sin_addr);
    a.len = sizeof(*v4);
    maco__unique_id_encode(&id, 0x0123456789ABCDEFull, &a);
    write_seed("fuzz_unique_id", "valid_ipv4", &id, sizeof(id));
    maco__put_u16(id.bytes + 4, 2); /* a future version */
    write_seed("fuzz_unique_id", "bad_version", &id, sizeof(id));
    maco__put_u16(id.bytes + 4, 1);
    maco__put_u16(id.bytes + 16, 5); /* no such address family */
    write_seed("fuzz_unique_id", "bad_family", &id, sizeof(id));
    write_seed("fuzz_unique_id", "truncated", &id, 20);

    memset(&a, 0, sizeof(a));
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&a.ss;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(65535);
    inet_pton(AF_INET6, "fe80::1:2:3:4", &v6->sin6_addr);
    v6->sin6_scope_id = 2;
    a.len = sizeof(*v6);
    maco__unique_id_encode(&id, 1, &a);
    write_seed("fuzz_unique_id", "valid_ipv6_scope", &id, sizeof(id));
    inet_pton(AF_INET6, "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", &v6->sin6_addr);
    maco__unique_id_encode(&id, 0, &a);
    write_seed("fuzz_unique_id", "valid_ipv6_longest", &id, sizeof(id));
}

/* ------------------------------------------------------------------ link frames */

/* An input of maco__bootstrap_fuzz_link being built: prefix, then the stream. */
typedef struct link_input {
    uint8_t bytes[4096];
    size_t len;
} link_input_t;

/* flags: receives posted first (0..2) | 4 for one posted after the first part. */
static void link_start(link_input_t *in, uint8_t flags, const uint8_t tags[3],
                       const uint16_t sizes[3], uint16_t split)
{
    memset(in, 0, sizeof(*in));
    in->bytes[0] = flags;
    for (int i = 0; i < 3; i++) {
        in->bytes[1 + 3 * i] = tags[i];
        maco__put_u16(in->bytes + 2 + 3 * i, sizes[i]);
    }
    maco__put_u16(in->bytes + 10, split);
    in->len = 12;
}

/* Appends a frame header announcing `len` bytes and `have` payload bytes (a pattern). */
static void link_frame(link_input_t *in, uint16_t kind, uint32_t tag, uint64_t len, size_t have)
{
    uint8_t *h = in->bytes + in->len;
    memset(h, 0, 16);
    maco__put_u16(h, kind);
    maco__put_u32(h + 4, tag);
    maco__put_u64(h + 8, len);
    in->len += 16;
    for (size_t i = 0; i < have; i++)
        in->bytes[in->len++] = (uint8_t)(i * 7 + 1);
}

static void link_abort(link_input_t *in, uint32_t culprit, int32_t status, const char *text)
{
    size_t tlen = strlen(text);
    link_frame(in, 4, 0, 8 + tlen, 0);
    maco__put_u32(in->bytes + in->len, culprit);
    maco__put_u32(in->bytes + in->len + 4, (uint32_t)status);
    memcpy(in->bytes + in->len + 8, text, tlen);
    in->len += 8 + tlen;
}

static void seeds_link_frames(void)
{
    const char *f = "fuzz_link_frames";
    link_input_t in;
    /* Posted receive of the right size, then goodbye. */
    link_start(&in, 1, (uint8_t[]){ 7, 0, 0 }, (uint16_t[]){ 16, 0, 0 }, 0);
    link_frame(&in, 0, 7, 16, 16);
    link_frame(&in, 1, 0, 0, 0);
    write_seed(f, "data_posted_bye", in.bytes, in.len);
    /* Nobody posted: buffered as unexpected; the link ends without goodbye. */
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 0, 3, 40, 40);
    link_frame(&in, 0, 3, 0, 0);
    write_seed(f, "data_unexpected_lost", in.bytes, in.len);
    /* Zero-byte receives, matched and not. */
    link_start(&in, 2, (uint8_t[]){ 1, 2, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 0, 1, 0, 0);
    link_frame(&in, 0, 2, 0, 0);
    link_frame(&in, 0, 9, 0, 0);
    link_frame(&in, 1, 0, 0, 0);
    write_seed(f, "data_zero_bytes", in.bytes, in.len);
    /* A receive posted while its message's payload is arriving (split inside the payload),
     * and one posted after its message was buffered. */
    link_start(&in, 4, (uint8_t[]){ 3, 0, 0 }, (uint16_t[]){ 32, 0, 0 }, 30);
    link_frame(&in, 0, 3, 32, 32);
    link_frame(&in, 1, 0, 0, 0);
    write_seed(f, "data_late_post", in.bytes, in.len);
    link_start(&in, 1 | 4, (uint8_t[]){ 4, 5, 0 }, (uint16_t[]){ 8, 24, 0 }, 60);
    link_frame(&in, 0, 5, 24, 24);
    link_frame(&in, 0, 4, 8, 8);
    write_seed(f, "data_late_post_buffered", in.bytes, in.len);
    /* Size mismatch: a posted receive of 8 bytes meets a 12-byte message. */
    link_start(&in, 1, (uint8_t[]){ 5, 0, 0 }, (uint16_t[]){ 8, 0, 0 }, 0);
    link_frame(&in, 0, 5, 12, 12);
    link_frame(&in, 1, 0, 0, 0);
    write_seed(f, "data_size_mismatch", in.bytes, in.len);
    /* Two messages with one tag, two receives. */
    link_start(&in, 2, (uint8_t[]){ 6, 6, 0 }, (uint16_t[]){ 4, 4, 0 }, 20);
    link_frame(&in, 0, 6, 4, 4);
    link_frame(&in, 0, 6, 4, 4);
    link_frame(&in, 1, 0, 0, 0);
    write_seed(f, "data_same_tag_twice", in.bytes, in.len);
    /* ABORT frames: blaming rank 0, blaming nobody, and empty. */
    link_start(&in, 1, (uint8_t[]){ 1, 0, 0 }, (uint16_t[]){ 4, 0, 0 }, 0);
    link_abort(&in, 0, -5, "rank 0 timed out");
    write_seed(f, "abort_culprit", in.bytes, in.len);
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_abort(&in, 0xFFFFFFFFu, -4, "");
    write_seed(f, "abort_nobody", in.bytes, in.len);
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 4, 0, 0, 0);
    write_seed(f, "abort_empty", in.bytes, in.len);
    /* Setup-only kinds on an established link, and an unknown kind. */
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 2, 0, 8, 8);
    write_seed(f, "table_after_setup", in.bytes, in.len);
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 3, 0, 5, 5);
    write_seed(f, "init_error_after_setup", in.bytes, in.len);
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 77, 1, 0, 0);
    write_seed(f, "unknown_kind", in.bytes, in.len);
    /* Lengths announced but not sent: 1 TiB (the largest allowed), 1 TiB + 1 and 2 MiB. */
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 0, 8, (uint64_t)1 << 40, 100);
    write_seed(f, "huge_length", in.bytes, in.len);
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 0, 8, ((uint64_t)1 << 40) + 1, 0);
    write_seed(f, "too_long", in.bytes, in.len);
    link_start(&in, 1, (uint8_t[]){ 8, 0, 0 }, (uint16_t[]){ 1000, 0, 0 }, 0);
    link_frame(&in, 0, 8, 2 << 20, 1000);
    write_seed(f, "truncated_payload", in.bytes, in.len);
    /* A header cut short, and a goodbye with a payload length. */
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 3);
    link_frame(&in, 0, 1, 4, 0);
    in.len -= 6;
    write_seed(f, "truncated_header", in.bytes, in.len);
    link_start(&in, 0, (uint8_t[]){ 0, 0, 0 }, (uint16_t[]){ 0, 0, 0 }, 0);
    link_frame(&in, 1, 0, 64, 0);
    link_frame(&in, 0, 2, 3, 3);
    write_seed(f, "bye_with_length", in.bytes, in.len);
}

/* ------------------------------------------------------------------ memory handles */

static void mem_handle(uint8_t out[130], uint8_t nranks_sel, uint8_t rank_sel, uint16_t kind,
                       int32_t owner, int32_t device, uint64_t bytes, uint64_t offset,
                       uint64_t alloc)
{
    memset(out, 0, 130);
    out[0] = nranks_sel;
    out[1] = rank_sel;
    uint8_t *p = out + 2;
    maco__put_u32(p, MACO__MEM_MAGIC);
    maco__put_u16(p + 4, MACO__MEM_VERSION);
    maco__put_u16(p + 6, kind);
    maco__put_u32(p + 8, (uint32_t)owner);
    maco__put_u32(p + 12, (uint32_t)device);
    maco__put_u64(p + 16, bytes);
    maco__put_u64(p + 24, offset);
    maco__put_u64(p + 32, alloc);
    maco__put_u64(p + 40, 0xCBF29CE484222325ull); /* node hash */
    maco__put_u64(p + 48, 0x1122334455667788ull); /* process token */
    maco__put_u64(p + 56, 0x00007F0000000000ull); /* address in the owner */
    if (kind == MACO__KIND_CUDA_IPC) {
        for (int i = 0; i < MACO__MEM_IPC_BYTES; i++)
            p[64 + i] = (uint8_t)(i * 13 + 5);
    } else if (kind == MACO__KIND_POSIX_FD || kind == MACO__KIND_HOST_FD) {
        maco__put_u32(p + 64, 4242);                  /* server pid */
        maco__put_u64(p + 72, 0x0F0E0D0C0B0A0908ull); /* server nonce */
        maco__put_u64(p + 80, 17);                    /* descriptor token */
    }
}

static void seeds_mem_handle(void)
{
    const char *f = "fuzz_mem_handle";
    uint8_t h[130];
    /* 4 ranks (selector 3), importer rank 0. */
    mem_handle(h, 3, 0, MACO__KIND_HOST_FD, 1, -1, 4096, 0, 4096);
    write_seed(f, "valid_host_fd", h, sizeof(h));
    mem_handle(h, 3, 0, MACO__KIND_CUDA_IPC, 2, 0, 1 << 20, 64 << 10, 2 << 20);
    write_seed(f, "valid_cuda_ipc", h, sizeof(h));
    mem_handle(h, 3, 1, MACO__KIND_POSIX_FD, 3, 7, 256, 0, 2 << 20);
    write_seed(f, "valid_posix_fd", h, sizeof(h));
    mem_handle(h, 1, 1, MACO__KIND_LOCAL, 0, -1, 64, 0, 64);
    write_seed(f, "valid_local", h, sizeof(h));
    mem_handle(h, 3, 0, MACO__KIND_HOST_FD, 1, -1, (uint64_t)1 << 51, (uint64_t)1 << 51,
               (uint64_t)1 << 52);
    write_seed(f, "valid_largest", h, sizeof(h));
    /* Near-valid: each breaks one rule. */
    mem_handle(h, 3, 0, MACO__KIND_HOST_FD, 1, -1, 4096, 1, 4096);
    write_seed(f, "past_allocation", h, sizeof(h));
    mem_handle(h, 3, 0, MACO__KIND_HOST_FD, 1, -1, 16, UINT64_MAX - 7, 4096);
    write_seed(f, "offset_wraps", h, sizeof(h));
    mem_handle(h, 3, 1, MACO__KIND_CUDA_IPC, 1, 0, 4096, 0, 4096);
    write_seed(f, "own_rank", h, sizeof(h));
    mem_handle(h, 3, 0, MACO__KIND_CUDA_IPC, 1, -1, 4096, 0, 4096);
    write_seed(f, "device_kind_on_host", h, sizeof(h));
    mem_handle(h, 3, 0, 9, 1, 0, 4096, 0, 4096);
    write_seed(f, "unknown_kind", h, sizeof(h));
    mem_handle(h, 3, 0, MACO__KIND_HOST_FD, 1, -1, 4096, 0, 4096);
    maco__put_u16(h + 2 + 4, 1);
    write_seed(f, "old_version", h, sizeof(h));
}

/* ------------------------------------------------------------------ configuration text */

static void seeds_config(void)
{
    static const char *texts[] = {
        "64M",
        "64MiB",
        "8T",
        "9007199254740992T",
        "30s",
        "500ms",
        "10us",
        "2m",
        "1e99",
        "-1",
        "  42 ",
        "9223372036854775807",
        "9223372036854775808",
        "true",
        "off",
        "0123456789abcdef",
        "0123456789abcdef0",
        "warning",
        "bootstrap, mem",
        "^proxy,bogus",
    };
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "text_%02zu", i);
        write_seed("fuzz_config", name, texts[i], strlen(texts[i]));
    }
}

/* ------------------------------------------------------------------ setup handshake */

/* fuzz_bootstrap_hello: u64 nonce, options, a hello, a proof message and an answer. */
static void seeds_bootstrap_hello(void)
{
    const char *f = "fuzz_bootstrap_hello";
    uint8_t in[9 + MACO__HELLO_BYTES + MACO__HS_PROOF_BYTES + MACO__HS_CHALLENGE_BYTES];
    memset(in, 0, sizeof(in));
    maco__put_u64(in, 0x0123456789ABCDEFull);
    in[8] = 1 | (3 << 1); /* HELLO, the hello in one piece */
    uint8_t *hello = in + 9, *proof = hello + MACO__HELLO_BYTES,
            *answer = proof + MACO__HS_PROOF_BYTES;
    maco__put_u32(hello, MACO__ID_MAGIC);
    maco__put_u16(hello + 4, MACO__HELLO_VERSION);
    maco__put_u16(hello + 6, MACO__KIND_HELLO);
    maco__put_u32(hello + 8, 1);
    maco__put_u32(hello + 12, 2);
    for (int i = 0; i < MACO__HS_CHALLENGE; i++)
        hello[16 + i] = (uint8_t)(i * 37 + 1);
    snprintf((char *)hello + MACO__HELLO_ENTRY + MACO__WIRE_ADDR_BYTES, MACO__HOST_ID_BYTES,
             "node-a");
    maco__put_u32(proof, MACO__ID_MAGIC);
    maco__put_u16(proof + 4, MACO__HELLO_VERSION);
    maco__put_u16(proof + 6, MACO__KIND_PROOF);
    maco__put_u32(answer, MACO__ID_MAGIC);
    maco__put_u16(answer + 4, MACO__HELLO_VERSION);
    maco__put_u16(answer + 6, MACO__KIND_CHALLENGE);
    write_seed(f, "hello_made_up_proof", in, sizeof(in));
    maco__put_u16(proof + 6, MACO__KIND_REFUSED);
    write_seed(f, "hello_refused", in, sizeof(in));
    in[8] = 0 | (1 << 1); /* expects PEER_HELLO, pieces of 7 */
    write_seed(f, "wrong_kind_in_pieces", in, sizeof(in));
    maco__put_u16(hello + 4, 1); /* setup wire version 1 */
    write_seed(f, "version_1", in, sizeof(in));
    maco__put_u16(hello + 4, MACO__HELLO_VERSION);
    hello[0] = 'G'; /* an HTTP client, say */
    write_seed(f, "not_maco", in, sizeof(in));
    hello[0] = 'M';
    /* An answer that is an INIT_ERROR frame of 20 bytes of text. */
    memset(answer, 0, MACO__HS_CHALLENGE_BYTES);
    maco__put_u16(answer, MACO__FRAME_INIT_ERROR);
    maco__put_u64(answer + 8, 20);
    memcpy(answer + 16, "world size mismatch!", 20);
    write_seed(f, "answer_init_error", in, sizeof(in));
    write_seed(f, "truncated", in, 40);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR (e.g. tests/fuzz/corpus)\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        perror(out_dir);
        return 1;
    }
    seeds_unique_id();
    seeds_bootstrap_hello();
    seeds_link_frames();
    seeds_mem_handle();
    seeds_config();
    return 0;
}
