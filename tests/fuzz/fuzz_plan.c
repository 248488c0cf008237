/*
 * fuzz_plan.c - libFuzzer harness for execution plans: maco__plan_parse (plan_json.c) on the
 * bytes as JSON text, then, for what parses, maco__plan_verify (plan_verify.c), the two steps
 * maco_plan_load runs on every rank for a file a user (or anyone who can write it) supplies.
 *
 * Feeds: the plan text itself (seeds: the shipped plans of algorithms/plans).
 * Checks, besides AddressSanitizer and UBSan, the documented contracts (plan_internal.h):
 *   - parse: MACO_OK with a description, or MACO_ERR_INVALID_ARGUMENT / MACO_ERR_NO_MEMORY
 *     with a non-empty, NUL-terminated message and no description;
 *   - verify: a problem count >= 0, -1 (no memory) or -2 (too large), and a NUL-terminated
 *     report within its buffer that is empty exactly when the count is 0.
 * Time per input is bounded by the verifier's step budget; libFuzzer's -timeout catches a loop
 * that escapes it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "algorithms/plan/plan_internal.h"

enum { WHY_BYTES = 512, REPORT_BYTES = 4096 };

MACO_FUZZ_QUIET_INITIALIZE()

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = (char *)malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char why[WHY_BYTES];
    memset(why, 0x5A, sizeof(why));
    maco__plan_desc_t *d = NULL;
    maco_status_t st = maco__plan_parse(text, size, "fuzz", &d, why, sizeof(why));
    free(text);
    MACO_FUZZ_CHECK(st != MACO_ERR_UNSUPPORTED); /* the JSON library must load (Jansson) */
    if (st != MACO_OK) {
        MACO_FUZZ_CHECK(st == MACO_ERR_INVALID_ARGUMENT || st == MACO_ERR_NO_MEMORY);
        MACO_FUZZ_CHECK(d == NULL);
        MACO_FUZZ_CHECK(memchr(why, '\0', sizeof(why)) != NULL && why[0] != '\0');
        return 0;
    }
    MACO_FUZZ_CHECK(d != NULL);
    char *report = (char *)malloc(REPORT_BYTES);
    if (report == NULL) {
        maco__plan_desc_free(d);
        return 0;
    }
    memset(report, 0x5A, REPORT_BYTES);
    int problems = maco__plan_verify(d, report, REPORT_BYTES);
    MACO_FUZZ_CHECK(problems >= -2);
    MACO_FUZZ_CHECK(memchr(report, '\0', REPORT_BYTES) != NULL);
    MACO_FUZZ_CHECK((problems == 0) == (report[0] == '\0'));
    free(report);
    maco__plan_desc_free(d);
    return 0;
}
