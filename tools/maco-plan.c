/*
 * maco-plan - checks execution plans (docs/plan-format.md) without a GPU.
 *
 *   maco-plan verify FILE...   verifies each plan; prints "FILE: ok" or one line per problem
 *                              (each naming rank, thread block, operation and chunk)
 *
 * Exit status: 0 when every plan is valid, 1 when one is not, 2 on a usage error or when
 * plans cannot be read at all here (no JSON library: MACO_JSON_LIBRARY).
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "maco/plan.h"

static int usage(FILE *f)
{
    fprintf(f, "usage: maco-plan verify FILE...\n"
               "  Verifies MACO execution plans (postcondition, races, deadlocks, bounds).\n");
    return f == stdout ? 0 : 2;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0))
        return usage(stdout);
    if (argc < 3 || strcmp(argv[1], "verify") != 0)
        return usage(stderr);
    enum { REPORT_BYTES = 1 << 16 };
    char *report = (char *)malloc(REPORT_BYTES);
    if (report == NULL) {
        fprintf(stderr, "maco-plan: out of memory\n");
        return 2;
    }
    int rc = 0;
    for (int i = 2; i < argc; i++) {
        maco_status_t st = maco_plan_verify_file(argv[i], report, REPORT_BYTES);
        if (st == MACO_OK) {
            printf("%s: ok\n", argv[i]);
            continue;
        }
        if (st == MACO_ERR_UNSUPPORTED) {
            fprintf(stderr, "maco-plan: %s\n", report);
            free(report);
            return 2;
        }
        /* A report of the verifier, or the reader's one-line reason. */
        printf("%s: rejected (%s)\n", argv[i], maco_status_string(st));
        char *save = NULL;
        for (char *line = strtok_r(report, "\n", &save); line != NULL;
             line = strtok_r(NULL, "\n", &save))
            printf("  %s\n", line);
        rc = 1;
    }
    free(report);
    return rc;
}
