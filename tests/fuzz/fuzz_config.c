/*
 * fuzz_config.c - libFuzzer harness for the parsers of environment variables, which another
 * process (a launcher, a job script) writes: the typed parsers of config.c
 * (maco__parse_size, maco__parse_duration_ms, maco__parse_int, maco__parse_bool),
 * maco__parse_nonce (MACO_BOOTSTRAP_NONCE, config.c) and the logger's
 * maco__log_parse_level and maco__log_parse_subsys (MACO_LOG_LEVEL, MACO_LOG_SUBSYS, log.c).
 *
 * Feeds: a NUL-terminated copy of the input (-max_len 64; the text ends at the first NUL, as
 * an environment variable's would) to every parser.
 * Checks, besides AddressSanitizer and UBSan:
 *   - a failed parse leaves its output untouched;
 *   - size >= 0; duration in [0, MACO__DURATION_MAX_MS]; bool 0 or 1; level in [-1, 4];
 *   - a text that parses as an integer v >= 0 is also the size v and the duration
 *     min(v, MACO__DURATION_MAX_MS) ms (a bare number means bytes, resp. milliseconds), and the
 *     integer prints back to a text that parses to the same value;
 *   - a nonce is 1 to 16 hex digits and prints back to itself;
 *   - the unknown-subsystem list fits the buffer it is given (a heap buffer of exactly
 *     0 to 63 bytes, from the input's first byte), NUL-terminated.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/bootstrap/bootstrap_internal.h"
#include "src/host/base/config.h"
#include "fuzz_common.h"
#include "src/host/base/log.h"

MACO_FUZZ_QUIET_INITIALIZE()

static const int64_t CANARY = -0x5A5A5A5A5A5A5A5Bll;

static void check_numbers(const char *text)
{
    int64_t i = CANARY, sz = CANARY, ms = CANARY;
    int i_ok = maco__parse_int(text, &i) == 0;
    int sz_ok = maco__parse_size(text, &sz) == 0;
    int ms_ok = maco__parse_duration_ms(text, &ms) == 0;
    MACO_FUZZ_CHECK(i_ok || i == CANARY);
    MACO_FUZZ_CHECK(sz_ok ? sz >= 0 : sz == CANARY);
    MACO_FUZZ_CHECK(ms_ok ? ms >= 0 && ms <= MACO__DURATION_MAX_MS : ms == CANARY);
    if (i_ok) {
        char back[32];
        snprintf(back, sizeof(back), "%" PRId64, i);
        int64_t again = CANARY;
        MACO_FUZZ_CHECK(maco__parse_int(back, &again) == 0 && again == i);
    }
    if (i_ok && i >= 0) {
        MACO_FUZZ_CHECK(sz_ok && sz == i);
        MACO_FUZZ_CHECK(ms_ok && ms == (i < MACO__DURATION_MAX_MS ? i : MACO__DURATION_MAX_MS));
    }
}

static void check_bool_nonce_level(const char *text)
{
    int b = -7;
    if (maco__parse_bool(text, &b) == 0)
        MACO_FUZZ_CHECK(b == 0 || b == 1);
    else
        MACO_FUZZ_CHECK(b == -7);

    uint64_t nonce = 0x5A5A5A5A5A5A5A5Aull;
    if (maco__parse_nonce(text, &nonce) == 0) {
        size_t n = strlen(text);
        MACO_FUZZ_CHECK(n >= 1 && n <= 16 && strspn(text, "0123456789abcdefABCDEF") == n);
        char back[24];
        snprintf(back, sizeof(back), "%016" PRIx64, nonce);
        uint64_t again = 0;
        MACO_FUZZ_CHECK(maco__parse_nonce(back, &again) == 0 && again == nonce);
    } else {
        MACO_FUZZ_CHECK(nonce == 0x5A5A5A5A5A5A5A5Aull);
    }

    int level = maco__log_parse_level(text);
    MACO_FUZZ_CHECK(level >= -1 && level <= MACO_LOG_TRACE);
}

static void check_subsys(const char *text, size_t cap)
{
    char *bad = (char *)malloc(cap ? cap : 1); /* exactly cap bytes: ASan sees any overrun */
    MACO_FUZZ_CHECK(bad != NULL);
    unsigned mask = 0;
    int unknown = maco__log_parse_subsys(text, &mask, bad, cap);
    MACO_FUZZ_CHECK(unknown >= 0);
    if (cap > 0)
        MACO_FUZZ_CHECK(memchr(bad, '\0', cap) != NULL);
    if (cap > 0 && unknown == 0)
        MACO_FUZZ_CHECK(bad[0] == '\0');
    free(bad);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = (char *)malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    check_numbers(text);
    check_bool_nonce_level(text);
    check_subsys(text, size > 0 ? data[0] % 64 : 0);
    free(text);
    return 0;
}
