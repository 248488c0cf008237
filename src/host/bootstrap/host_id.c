/* host_id.c - this rank's host identity (host name + boot id, or MACO_HOST_ID) and the
 * node topology computed from every rank's. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/host/bootstrap/bootstrap_private.h"
#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

/* ------------------------------------------------------------------ host identity */

static pthread_once_t maco__host_once = PTHREAD_ONCE_INIT;
static char maco__host_text[MACO__HOST_ID_BYTES];

static void maco__host_id_init(void)
{
    if (maco__config_is_set(MACO_CFG_HOST_ID)) {
        snprintf(maco__host_text, sizeof(maco__host_text), "%s",
                 maco__config_string(MACO_CFG_HOST_ID));
        return;
    }
    char host[64] = "unknown";
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(maco__host_text, sizeof(maco__host_text), "%s/%s", host, boot);
}

maco_status_t maco__host_id_check(void)
{
    if (!maco__config_is_set(MACO_CFG_HOST_ID))
        return MACO_OK;
    size_t n = strlen(maco__config_string(MACO_CFG_HOST_ID));
    if (n >= MACO__HOST_ID_BYTES)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "MACO_HOST_ID is %zu bytes long; at most %d (a longer one would be "
                           "cut, and hosts that differ only past that would share a node)",
                           n, MACO__HOST_ID_BYTES - 1);
    return MACO_OK;
}

const char *maco__host_id(void)
{
    pthread_once(&maco__host_once, maco__host_id_init);
    return maco__host_text;
}

void maco__topology_compute(const char *const *ids, int nranks, int rank, maco__topology_t *t)
{
    const char *mine = ids[rank];
    t->local_rank = 0;
    t->local_nranks = 0;
    t->nnodes = 0;
    t->node = -1;
    for (int r = 0; r < nranks; r++) {
        int first = 1; /* the lowest rank of its node */
        for (int q = 0; q < r && first; q++)
            first = strcmp(ids[r], ids[q]) != 0;
        if (first) {
            if (strcmp(ids[r], mine) == 0)
                t->node = t->nnodes;
            t->nnodes++;
        }
        if (strcmp(ids[r], mine) == 0) {
            if (r < rank)
                t->local_rank++;
            t->local_nranks++;
        }
    }
}
