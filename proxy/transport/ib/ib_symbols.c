/* ib_symbols.c - see ib_symbols.h. */
#include "proxy/transport/ib/ib_symbols.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "src/host/base/config.h"

static maco__ibv_table_t maco__ibv_table;
static const maco__ibv_table_t *maco__ibv_loaded; /* NULL: not usable */
static char maco__ibv_why[512];
static pthread_once_t maco__ibv_once = PTHREAD_ONCE_INIT;

/* Each table entry's exported name, whether loading fails without it, and where its pointer
 * sits in the table. */
static const struct {
    const char *name;
    int required;
    size_t offset;
} maco__ibv_symbols[] = {
#define MACO__IBV_ENTRY(name, required, ret, params)                                               \
    { "ibv_" #name, (required), offsetof(maco__ibv_table_t, name) },
    MACO_IBV_SYMBOLS(MACO__IBV_ENTRY)
#undef MACO__IBV_ENTRY
};

static void maco__ibv_load(void)
{
    const char *path = maco__config_string(MACO_CFG_IB_LIBRARY);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *dl = dlerror();
        snprintf(maco__ibv_why, sizeof(maco__ibv_why),
                 "libibverbs could not be loaded (MACO_IB_LIBRARY=%s): %s; install rdma-core's "
                 "libibverbs1 (and ibverbs-providers)",
                 path, dl != NULL ? dl : "dlopen failed");
        return;
    }
    /* Each symbol's default version: the one a program linked today would bind. */
    for (size_t i = 0; i < sizeof(maco__ibv_symbols) / sizeof(maco__ibv_symbols[0]); i++) {
        void *fn = dlsym(lib, maco__ibv_symbols[i].name);
        if (fn == NULL && maco__ibv_symbols[i].required) {
            snprintf(maco__ibv_why, sizeof(maco__ibv_why), "%s lacks %s (too old a libibverbs?)",
                     path, maco__ibv_symbols[i].name);
            dlclose(lib);
            memset(&maco__ibv_table, 0, sizeof(maco__ibv_table));
            return;
        }
        memcpy((char *)&maco__ibv_table + maco__ibv_symbols[i].offset, &fn, sizeof(fn));
    }
    maco__ibv_loaded = &maco__ibv_table;
}

const maco__ibv_table_t *maco__ibv(char *why, size_t cap)
{
    pthread_once(&maco__ibv_once, maco__ibv_load);
    if (maco__ibv_loaded == NULL && why != NULL && cap > 0)
        snprintf(why, cap, "%s", maco__ibv_why);
    return maco__ibv_loaded;
}

int maco__ibv_query_port(const maco__ibv_table_t *v, struct ibv_context *ctx, uint8_t port,
                         struct ibv_port_attr *attr)
{
    /* What the header's inline ibv_query_port does, with the exported symbol from the table. */
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx != NULL)
        return vctx->query_port(ctx, port, attr, sizeof(*attr));
    memset(attr, 0, sizeof(*attr));
    return v->query_port(ctx, port, attr);
}
