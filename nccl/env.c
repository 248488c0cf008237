/*
 * env.c - NCCL's environment variables mapped onto MACO's (shim.h).
 *
 * Launchers and applications set NCCL_* variables; where MACO has a variable of the same
 * meaning it gets the NCCL value, unless the MACO variable is set already (an explicit MACO_*
 * setting wins). Every other NCCL_* variable is accepted quietly: MACO reads only MACO_* names
 * and warns only about unknown MACO_* ones. The mapping runs when the library loads and once
 * more at the first communicator creation (Python programs often set os.environ after the
 * library is loaded). NCCL_COMM_ID is read by ncclGetUniqueId (comm_core.c) and
 * NCCL_COMM_BLOCKING by the communicator creation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shim.h"

/* NCCL_DEBUG's levels as MACO_LOG_LEVEL values (VERSION prints only NCCL's banner). */
static const char *maco_nccl__level_of(const char *v)
{
    static const char *const map[][2] = {
        { "VERSION", "warn" }, { "WARN", "warn" },   { "INFO", "info" },
        { "ABORT", "warn" },   { "TRACE", "trace" },
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcasecmp(v, map[i][0]) == 0)
            return map[i][1];
    return NULL;
}

/* NCCL_DEBUG_SUBSYS (INIT,COLL,P2P,NET,...; ^ inverts) as a MACO_LOG_SUBSYS list. Names with
 * no MACO counterpart are dropped; NULL when none is left. */
static int maco_nccl__subsys_of(const char *v, char *out, size_t cap)
{
    static const char *const map[][2] = {
        { "INIT", "init" },   { "COLL", "coll" },  { "P2P", "coll" },
        { "SHM", "channel" }, { "NET", "proxy" },  { "PROXY", "proxy" },
        { "ALLOC", "mem" },   { "REG", "mem" },    { "BOOTSTRAP", "bootstrap" },
        { "ALL", "all" },     { "GRAPH", "init" }, { "ENV", "init" },
    };
    size_t n = 0;
    int any = 0;
    if (*v == '^' && n + 1 < cap) {
        out[n++] = '^';
        v++;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", v);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
            if (strcasecmp(tok, map[i][0]) != 0)
                continue;
            int m = snprintf(out + n, cap - n, "%s%s", any ? "," : "", map[i][1]);
            if (m > 0 && (size_t)m < cap - n) {
                n += (size_t)m;
                any = 1;
            }
            break;
        }
    }
    out[n < cap ? n : cap - 1] = '\0';
    return any;
}

/* What was mapped, logged once all of it is (the logger reads its settings at first use). */
static char maco_nccl__mapped[1024];

static void maco_nccl__map(const char *nccl_name, const char *maco_name, const char *value)
{
    const char *set = getenv(maco_name);
    if (value == NULL || (set != NULL && set[0] != '\0'))
        return;
    setenv(maco_name, value, 0);
    size_t n = strlen(maco_nccl__mapped);
    snprintf(maco_nccl__mapped + n, sizeof(maco_nccl__mapped) - n, " %s=%s (from %s)", maco_name,
             value, nccl_name);
}

void maco_nccl__env_apply(void)
{
    const char *v;
    if ((v = getenv("NCCL_DEBUG")) != NULL)
        maco_nccl__map("NCCL_DEBUG", "MACO_LOG_LEVEL", maco_nccl__level_of(v));
    char subsys[256];
    if ((v = getenv("NCCL_DEBUG_SUBSYS")) != NULL &&
        maco_nccl__subsys_of(v, subsys, sizeof(subsys)))
        maco_nccl__map("NCCL_DEBUG_SUBSYS", "MACO_LOG_SUBSYS", subsys);
    /* Both expand %h (host) and %p (pid). */
    maco_nccl__map("NCCL_DEBUG_FILE", "MACO_LOG_FILE", getenv("NCCL_DEBUG_FILE"));
    /* The same syntax in both: a comma list of prefixes, "=" for exact names, "^" to exclude. */
    maco_nccl__map("NCCL_SOCKET_IFNAME", "MACO_SOCKET_IFNAME", getenv("NCCL_SOCKET_IFNAME"));
    /* The same syntax in both. */
    maco_nccl__map("NCCL_IB_HCA", "MACO_IB_HCA", getenv("NCCL_IB_HCA"));
    maco_nccl__map("NCCL_IB_GID_INDEX", "MACO_IB_GID_INDEX", getenv("NCCL_IB_GID_INDEX"));
    maco_nccl__map("NCCL_IB_TIMEOUT", "MACO_IB_TIMEOUT", getenv("NCCL_IB_TIMEOUT"));
    maco_nccl__map("NCCL_IB_RETRY_CNT", "MACO_IB_RETRY_CNT", getenv("NCCL_IB_RETRY_CNT"));
    if (maco_nccl__mapped[0] != '\0') {
        maco_log_write(MACO_LOG_INFO, "init", "nccl: set from NCCL's variables:%s",
                       maco_nccl__mapped);
        maco_nccl__mapped[0] = '\0';
    }
}

int maco_nccl__env_blocking_default(void)
{
    const char *v = getenv("NCCL_COMM_BLOCKING");
    return v == NULL || v[0] == '\0' || atoi(v) != 0;
}

__attribute__((constructor)) static void maco_nccl__env_at_load(void)
{
    maco_nccl__env_apply();
}
