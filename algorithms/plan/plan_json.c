/*
 * plan_json.c - reads an execution plan (docs/plan-format.md) into maco__plan_desc_t.
 *
 * JSON is parsed by Jansson (Debian's libjansson4), loaded at run time like libibverbs
 * (docs/design.md, "No link-time dependency"): its entry points are one X-macro table
 * filled with dlsym from MACO_JSON_LIBRARY, so libmaco.so and libmaco.a need nothing at
 * link time and only plan loading fails, saying why, where the library is missing.
 * Every rule of algorithms/plans/plan.schema.json is checked here as well (the C side does
 * not trust a schema check it did not make), with messages that name the JSON path.
 */
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/host/base/config.h"
#include "algorithms/plan/plan_internal.h"

/* X(name, return type, parameters): the exported Jansson symbol "json_" #name. The header's
 * inline json_decref calls json_delete; maco__json_decref does the same through the table. */
#define MACO_JSON_SYMBOLS(X)                                                                       \
    X(loadb, json_t *, (const char *buffer, size_t buflen, size_t flags, json_error_t *error))     \
    X(delete, void, (json_t * json))                                                               \
    X(object_get, json_t *, (const json_t *object, const char *key))                               \
    X(object_iter, void *, (json_t * object))                                                      \
    X(object_iter_next, void *, (json_t * object, void *iter))                                     \
    X(object_iter_key, const char *, (void *iter))                                                 \
    X(array_size, size_t, (const json_t *array))                                                   \
    X(array_get, json_t *, (const json_t *array, size_t index))                                    \
    X(string_value, const char *, (const json_t *string))                                          \
    X(integer_value, json_int_t, (const json_t *integer))

typedef struct maco__json_table {
#define MACO__JSON_FIELD(name, ret, params) ret(*name) params;
    MACO_JSON_SYMBOLS(MACO__JSON_FIELD)
#undef MACO__JSON_FIELD
} maco__json_table_t;

static maco__json_table_t maco__json_table;
static const maco__json_table_t *maco__json_loaded;
static char maco__json_why[400];
static pthread_once_t maco__json_once = PTHREAD_ONCE_INIT;

/* Each table entry's exported name and where its pointer sits in the table. */
static const struct {
    const char *name;
    size_t offset;
} maco__json_symbols[] = {
#define MACO__JSON_ENTRY(name, ret, params) { "json_" #name, offsetof(maco__json_table_t, name) },
    MACO_JSON_SYMBOLS(MACO__JSON_ENTRY)
#undef MACO__JSON_ENTRY
};

static void maco__json_load(void)
{
    const char *path = maco__config_string(MACO_CFG_JSON_LIBRARY);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    char beside[4096];
    Dl_info self;
    /* Not installed system-wide: a copy next to libmaco.so (a bundle) is used too. */
    if (lib == NULL && !maco__config_is_set(MACO_CFG_JSON_LIBRARY) &&
        dladdr((void *)maco__json_load, &self) != 0 && self.dli_fname != NULL &&
        strrchr(self.dli_fname, '/') != NULL) {
        int dir = (int)(strrchr(self.dli_fname, '/') - self.dli_fname);
        snprintf(beside, sizeof(beside), "%.*s/%s", dir, self.dli_fname, path);
        dlerror();
        lib = dlopen(beside, RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == NULL) {
        const char *dl = dlerror();
        snprintf(maco__json_why, sizeof(maco__json_why),
                 "the JSON library could not be loaded (MACO_JSON_LIBRARY=%s%s): %s; install "
                 "Jansson (Debian/Ubuntu: libjansson4)",
                 path,
                 maco__config_is_set(MACO_CFG_JSON_LIBRARY) ? ""
                                                            : ", also looked for next to libmaco",
                 dl != NULL ? dl : "dlopen failed");
        return;
    }
    for (size_t i = 0; i < sizeof(maco__json_symbols) / sizeof(maco__json_symbols[0]); i++) {
        void *fn = dlsym(lib, maco__json_symbols[i].name);
        if (fn == NULL) {
            snprintf(maco__json_why, sizeof(maco__json_why),
                     "the JSON library %s (MACO_JSON_LIBRARY%s) lacks %s (not Jansson 2.x?)", path,
                     maco__config_is_set(MACO_CFG_JSON_LIBRARY) ? "" : "'s default",
                     maco__json_symbols[i].name);
            dlclose(lib);
            return;
        }
        memcpy((char *)&maco__json_table + maco__json_symbols[i].offset, &fn, sizeof(fn));
    }
    maco__json_loaded = &maco__json_table;
}

static void maco__json_decref(const maco__json_table_t *J, json_t *j)
{
    /* As jansson.h's json_decref: (size_t)-1 marks the immortal singletons. */
    if (j != NULL && j->refcount != (size_t)-1 && --j->refcount == 0)
        J->delete (j);
}

/* ------------------------------------------------------------------ names */

static const char *const maco__op_names[MACO__POP_COUNT] = {
    "signal",
    "wait",
    "flush",
    "put",
    "get",
    "put_with_signal",
    "put_with_signal_and_flush",
    "put_packets",
    "read_put_packets",
    "copy",
    "reduce",
};
static const char *const maco__buf_names[MACO__PBUF_COUNT] = { "input", "output", "scratch" };

const char *maco__plan_op_name(int code)
{
    return code >= 0 && code < MACO__POP_COUNT ? maco__op_names[code] : "unknown";
}

const char *maco__plan_buffer_name(int buffer)
{
    return buffer >= 0 && buffer < MACO__PBUF_COUNT ? maco__buf_names[buffer] : "unknown";
}

uint32_t maco__plan_chunks(const maco__plan_desc_t *d, int buffer)
{
    uint32_t k = (uint32_t)d->parts, n = (uint32_t)d->world_size;
    switch (buffer) {
    case MACO__PBUF_INPUT:
        return d->coll == MACO_COLL_REDUCE_SCATTER ? n * k : k;
    case MACO__PBUF_OUTPUT:
        return d->coll == MACO_COLL_ALLGATHER ? n * k : k;
    case MACO__PBUF_SCRATCH:
        return (uint32_t)d->scratch_chunks;
    default:
        return 0;
    }
}

void maco__plan_chunk_range(const maco__plan_desc_t *d, uint32_t index, uint64_t count,
                            uint64_t *offset_p, uint64_t *elems_p)
{
    uint64_t k = (uint64_t)d->parts, s = index / k, p = index % k;
    /* p * count fits: count < 2^48 (checked by the executor), p < 1024. */
    uint64_t lo = p * count / k, hi = (p + 1) * count / k;
    *offset_p = s * count + lo;
    *elems_p = hi - lo;
}

uint64_t maco__plan_scratch_slot(const maco__plan_desc_t *d, uint64_t count, uint64_t esz)
{
    uint64_t k = (uint64_t)d->parts;
    uint64_t bytes = (count + k - 1) / k * esz; /* the largest part */
    return (bytes + 7) / 8 * 16;                /* as LL16 packets; a multiple of 16 */
}

/* ------------------------------------------------------------------ parsing */

typedef struct maco__parser {
    const maco__json_table_t *J;
    const char *origin;
    char *why;
    size_t cap;
    int failed;
    maco__plan_desc_t *d;
    size_t refs_used;
} maco__parser_t;

static maco_status_t maco__pfail(maco__parser_t *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static maco_status_t maco__pfail(maco__parser_t *ps, const char *fmt, ...)
{
    if (!ps->failed) {
        int n = snprintf(ps->why, ps->cap, "%s: ", ps->origin);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < ps->cap)
            vsnprintf(ps->why + n, ps->cap - (size_t)n, fmt, ap);
        va_end(ap);
        ps->failed = 1;
    }
    return MACO_ERR_INVALID_ARGUMENT;
}

/* Fails on a key of `obj` that is not in the NULL-terminated `known`. */
static maco_status_t maco__pkeys(maco__parser_t *ps, json_t *obj, const char *path,
                                 const char *const *known)
{
    for (void *it = ps->J->object_iter(obj); it != NULL; it = ps->J->object_iter_next(obj, it)) {
        const char *key = ps->J->object_iter_key(it);
        int ok = 0;
        for (const char *const *k = known; *k != NULL && !ok; k++)
            ok = strcmp(*k, key) == 0;
        if (!ok)
            return maco__pfail(ps, "%s: unknown field \"%s\"", path, key);
    }
    return MACO_OK;
}

static maco_status_t maco__pobject(maco__parser_t *ps, json_t *v, const char *path)
{
    if (v == NULL || !json_is_object(v))
        return maco__pfail(ps, "%s: must be an object", path);
    return MACO_OK;
}

/* obj[key] as an integer in [lo, hi]; optional keys give `def` when absent (required: def
 * < lo). */
static maco_status_t maco__pint(maco__parser_t *ps, json_t *obj, const char *key, const char *path,
                                int64_t lo, int64_t hi, int64_t def, int64_t *v_p)
{
    json_t *v = ps->J->object_get(obj, key);
    if (v == NULL) {
        if (def >= lo) {
            *v_p = def;
            return MACO_OK;
        }
        return maco__pfail(ps, "%s: missing field \"%s\"", path, key);
    }
    if (!json_is_integer(v))
        return maco__pfail(ps, "%s.%s: must be an integer", path, key);
    json_int_t x = ps->J->integer_value(v);
    if (x < lo || x > hi)
        return maco__pfail(ps, "%s.%s = %lld is outside [%lld, %lld]", path, key, (long long)x,
                           (long long)lo, (long long)hi);
    *v_p = x;
    return MACO_OK;
}

/* obj[key] as one of `names` (count n); *v_p: its index. */
static maco_status_t maco__penum(maco__parser_t *ps, json_t *obj, const char *key, const char *path,
                                 const char *const *names, int n, int *v_p)
{
    json_t *v = ps->J->object_get(obj, key);
    if (v == NULL)
        return maco__pfail(ps, "%s: missing field \"%s\"", path, key);
    const char *s = json_is_string(v) ? ps->J->string_value(v) : NULL;
    for (int i = 0; s != NULL && i < n; i++)
        if (names[i] != NULL && strcmp(names[i], s) == 0) {
            *v_p = i;
            return MACO_OK;
        }
    char list[256] = "";
    for (int i = 0; i < n; i++)
        if (names[i] != NULL)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", list[0] ? ", " : "",
                     names[i]);
    return maco__pfail(ps, "%s.%s: must be one of %s", path, key, list);
}

static json_t *maco__parray(maco__parser_t *ps, json_t *obj, const char *key, const char *path,
                            size_t lo, size_t hi, size_t *n_p)
{
    json_t *v = ps->J->object_get(obj, key);
    if (v == NULL || !json_is_array(v)) {
        maco__pfail(ps, "%s.%s: %s", path, key, v == NULL ? "missing" : "must be an array");
        return NULL;
    }
    size_t n = ps->J->array_size(v);
    if (n < lo || n > hi) {
        maco__pfail(ps, "%s.%s has %zu entries; it must have %zu to %zu", path, key, n, lo, hi);
        return NULL;
    }
    *n_p = n;
    return v;
}

/* A chunk reference; `src`: a copy or reduce source (may have "packets" and "channel"). */
static maco_status_t maco__pref(maco__parser_t *ps, json_t *v, const char *path, int src,
                                maco__plan_ref_t *ref)
{
    static const char *const keys_src[] = {
        "buffer", "index", "count", "packets", "channel", NULL
    };
    static const char *const keys_dst[] = { "buffer", "index", "count", NULL };
    int64_t index = 0, count = 1, channel = -1;
    int buffer = 0;
    if (maco__pobject(ps, v, path) != MACO_OK ||
        maco__pkeys(ps, v, path, src ? keys_src : keys_dst) != MACO_OK ||
        maco__penum(ps, v, "buffer", path, maco__buf_names, MACO__PBUF_COUNT, &buffer) != MACO_OK ||
        maco__pint(ps, v, "index", path, 0, MACO__PLAN_MAX_INDEX, -1, &index) != MACO_OK ||
        maco__pint(ps, v, "count", path, 1, MACO__PLAN_MAX_INDEX + 1, 1, &count) != MACO_OK ||
        maco__pint(ps, v, "channel", path, -1, MACO__PLAN_MAX_CHANNELS - 1, -1, &channel) !=
            MACO_OK)
        return MACO_ERR_INVALID_ARGUMENT;
    json_t *pk = ps->J->object_get(v, "packets");
    if (pk != NULL && !json_is_boolean(pk))
        return maco__pfail(ps, "%s.packets: must be true or false", path);
    memset(ref, 0, sizeof(*ref));
    ref->buffer = (uint8_t)buffer;
    ref->packets = pk != NULL && json_is_true(pk);
    ref->channel = (int16_t)channel;
    ref->index = (uint32_t)index;
    ref->count = (uint32_t)count;
    return MACO_OK;
}

static maco_status_t maco__pop(maco__parser_t *ps, json_t *v, const char *path, maco__plan_op_t *op)
{
    static const char *const keys_sync[] = { "op", "channel", NULL };
    static const char *const keys_xfer[] = { "op", "channel", "src", "dst", NULL };
    static const char *const keys_copy[] = { "op", "src", "dst", NULL };
    static const char *const keys_reduce[] = { "op", "srcs", "dst", NULL };
    int code = 0;
    char sub[192];
    if (maco__pobject(ps, v, path) != MACO_OK ||
        maco__penum(ps, v, "op", path, maco__op_names, MACO__POP_COUNT, &code) != MACO_OK)
        return MACO_ERR_INVALID_ARGUMENT;
    memset(op, 0, sizeof(*op));
    op->code = (uint8_t)code;
    op->channel = -1;
    op->dst.channel = -1;
    const char *const *keys = code <= MACO__POP_FLUSH    ? keys_sync
                              : code == MACO__POP_COPY   ? keys_copy
                              : code == MACO__POP_REDUCE ? keys_reduce
                                                         : keys_xfer;
    if (maco__pkeys(ps, v, path, keys) != MACO_OK)
        return MACO_ERR_INVALID_ARGUMENT;
    if (code != MACO__POP_COPY && code != MACO__POP_REDUCE) {
        int64_t ch;
        if (maco__pint(ps, v, "channel", path, 0, MACO__PLAN_MAX_CHANNELS - 1, -1, &ch) != MACO_OK)
            return MACO_ERR_INVALID_ARGUMENT;
        op->channel = (int16_t)ch;
    }
    if (code <= MACO__POP_FLUSH)
        return MACO_OK;
    snprintf(sub, sizeof(sub), "%s.dst", path);
    if (maco__pref(ps, ps->J->object_get(v, "dst"), sub, 0, &op->dst) != MACO_OK)
        return MACO_ERR_INVALID_ARGUMENT;
    if (code == MACO__POP_REDUCE) {
        size_t n;
        json_t *a = maco__parray(ps, v, "srcs", path, 1, MACO__PLAN_MAX_SRCS, &n);
        if (a == NULL)
            return MACO_ERR_INVALID_ARGUMENT;
        op->nsrcs = (uint16_t)n;
    } else {
        op->nsrcs = 1;
    }
    if (ps->refs_used + op->nsrcs > ps->d->nrefs)
        return maco__pfail(ps, "%s: internal: reference pool exhausted", path);
    op->srcs = ps->d->ref_pool + ps->refs_used;
    ps->refs_used += op->nsrcs;
    if (code != MACO__POP_REDUCE) {
        snprintf(sub, sizeof(sub), "%s.src", path);
        return maco__pref(ps, ps->J->object_get(v, "src"), sub, code == MACO__POP_COPY,
                          &op->srcs[0]);
    }
    json_t *a = ps->J->object_get(v, "srcs");
    for (size_t i = 0; i < op->nsrcs; i++) {
        snprintf(sub, sizeof(sub), "%s.srcs[%zu]", path, i);
        if (maco__pref(ps, ps->J->array_get(a, i), sub, 1, &op->srcs[i]) != MACO_OK)
            return MACO_ERR_INVALID_ARGUMENT;
    }
    return MACO_OK;
}

/* Counts every op's sources first, so the reference pool is one allocation. */
static size_t maco__count_refs(const maco__json_table_t *J, json_t *ranks)
{
    size_t total = 0;
    for (size_t r = 0; r < J->array_size(ranks); r++) {
        json_t *tbs = J->object_get(J->array_get(ranks, r), "thread_blocks");
        for (size_t t = 0; tbs != NULL && t < J->array_size(tbs); t++) {
            json_t *ops = J->object_get(J->array_get(tbs, t), "ops");
            for (size_t i = 0; ops != NULL && i < J->array_size(ops); i++) {
                json_t *srcs = J->object_get(J->array_get(ops, i), "srcs");
                size_t n = srcs != NULL ? J->array_size(srcs) : 0;
                total += n > 1 ? n : 1;
            }
        }
    }
    return total;
}

static maco_status_t maco__pplan(maco__parser_t *ps, json_t *root)
{
    static const char *const keys[] = { "magic",      "version",        "name",
                                        "collective", "world_size",     "ranks_per_node",
                                        "parts",      "scratch_chunks", "ranks",
                                        NULL };
    static const char *const rank_keys[] = { "rank", "channels", "thread_blocks", NULL };
    static const char *const chan_keys[] = { "type", "peer", NULL };
    static const char *const tb_keys[] = { "ops", NULL };
    static const char *const colls[] = { "allreduce", "allgather", "reduce_scatter" };
    static const char *const chan_types[] = { "memory", "port" };
    const maco__json_table_t *J = ps->J;
    maco__plan_desc_t *d = ps->d;
    char path[64];
    if (maco__pobject(ps, root, "plan") != MACO_OK ||
        maco__pkeys(ps, root, "plan", keys) != MACO_OK)
        return MACO_ERR_INVALID_ARGUMENT;
    json_t *magic = J->object_get(root, "magic");
    if (magic == NULL || !json_is_string(magic) ||
        strcmp(J->string_value(magic), MACO__PLAN_MAGIC) != 0)
        return maco__pfail(ps, "magic: must be \"%s\" (not a MACO plan)", MACO__PLAN_MAGIC);
    int64_t version, n, rpn, parts, scratch;
    if (maco__pint(ps, root, "version", "plan", 0, INT32_MAX, -1, &version) != MACO_OK)
        return MACO_ERR_INVALID_ARGUMENT;
    if (version != MACO__PLAN_VERSION)
        return maco__pfail(ps, "version %lld is not supported: this library reads version %d",
                           (long long)version, MACO__PLAN_VERSION);
    json_t *name = J->object_get(root, "name");
    if (name == NULL || !json_is_string(name) || strlen(J->string_value(name)) < 1 ||
        strlen(J->string_value(name)) >= sizeof(d->name))
        return maco__pfail(ps, "name: must be a string of 1 to %zu characters",
                           sizeof(d->name) - 1);
    snprintf(d->name, sizeof(d->name), "%s", J->string_value(name));
    int coll;
    if (maco__penum(ps, root, "collective", "plan", colls, 3, &coll) != MACO_OK ||
        maco__pint(ps, root, "world_size", "plan", 1, MACO__PLAN_MAX_RANKS, -1, &n) != MACO_OK ||
        maco__pint(ps, root, "ranks_per_node", "plan", 1, MACO__PLAN_MAX_RANKS, -1, &rpn) !=
            MACO_OK ||
        maco__pint(ps, root, "parts", "plan", 1, MACO__PLAN_MAX_PARTS, -1, &parts) != MACO_OK ||
        maco__pint(ps, root, "scratch_chunks", "plan", 0, MACO__PLAN_MAX_SCRATCH, -1, &scratch) !=
            MACO_OK)
        return MACO_ERR_INVALID_ARGUMENT;
    if (n % rpn != 0)
        return maco__pfail(ps, "ranks_per_node = %lld does not divide world_size = %lld",
                           (long long)rpn, (long long)n);
    d->coll = coll == 0 ? MACO_COLL_ALLREDUCE
                        : (coll == 1 ? MACO_COLL_ALLGATHER : MACO_COLL_REDUCE_SCATTER);
    d->world_size = (int)n;
    d->ranks_per_node = (int)rpn;
    d->parts = (int)parts;
    d->scratch_chunks = (int)scratch;
    size_t nr;
    json_t *ranks = maco__parray(ps, root, "ranks", "plan", (size_t)n, (size_t)n, &nr);
    if (ranks == NULL)
        return MACO_ERR_INVALID_ARGUMENT;
    d->nrefs = maco__count_refs(J, ranks);
    d->ref_pool = (maco__plan_ref_t *)calloc(d->nrefs ? d->nrefs : 1, sizeof(maco__plan_ref_t));
    d->ranks = (maco__plan_rank_t *)calloc(nr, sizeof(maco__plan_rank_t));
    if (d->ref_pool == NULL || d->ranks == NULL)
        return MACO_ERR_NO_MEMORY;
    for (size_t r = 0; r < nr; r++) {
        json_t *rk = J->array_get(ranks, r);
        maco__plan_rank_t *R = &d->ranks[r];
        int64_t id;
        size_t nch, ntb;
        snprintf(path, sizeof(path), "ranks[%zu]", r);
        if (maco__pobject(ps, rk, path) != MACO_OK ||
            maco__pkeys(ps, rk, path, rank_keys) != MACO_OK ||
            maco__pint(ps, rk, "rank", path, 0, n - 1, -1, &id) != MACO_OK)
            return MACO_ERR_INVALID_ARGUMENT;
        if ((size_t)id != r)
            return maco__pfail(ps, "%s.rank = %lld: ranks must be listed in order (expected %zu)",
                               path, (long long)id, r);
        json_t *chans = maco__parray(ps, rk, "channels", path, 0, MACO__PLAN_MAX_CHANNELS, &nch);
        json_t *tbs = chans == NULL ? NULL
                                    : maco__parray(ps, rk, "thread_blocks", path, 1,
                                                   MACO__PLAN_MAX_TBS, &ntb);
        if (tbs == NULL)
            return MACO_ERR_INVALID_ARGUMENT;
        R->nchannels = (int)nch;
        R->ntbs = (int)ntb;
        R->channels = (maco__plan_channel_t *)calloc(nch ? nch : 1, sizeof(*R->channels));
        R->tbs = (maco__plan_tb_t *)calloc(ntb, sizeof(*R->tbs));
        if (R->channels == NULL || R->tbs == NULL)
            return MACO_ERR_NO_MEMORY;
        for (size_t c = 0; c < nch; c++) {
            json_t *ch = J->array_get(chans, c);
            char cpath[112];
            int type = 0;
            int64_t peer;
            snprintf(cpath, sizeof(cpath), "%s.channels[%zu]", path, c);
            if (maco__pobject(ps, ch, cpath) != MACO_OK ||
                maco__pkeys(ps, ch, cpath, chan_keys) != MACO_OK ||
                maco__penum(ps, ch, "type", cpath, chan_types, 2, &type) != MACO_OK ||
                maco__pint(ps, ch, "peer", cpath, 0, n - 1, -1, &peer) != MACO_OK)
                return MACO_ERR_INVALID_ARGUMENT;
            R->channels[c].type = (uint8_t)type;
            R->channels[c].peer = (int32_t)peer;
        }
        for (size_t t = 0; t < ntb; t++) {
            json_t *tb = J->array_get(tbs, t);
            char tpath[112];
            size_t nops;
            snprintf(tpath, sizeof(tpath), "%s.thread_blocks[%zu]", path, t);
            if (maco__pobject(ps, tb, tpath) != MACO_OK ||
                maco__pkeys(ps, tb, tpath, tb_keys) != MACO_OK)
                return MACO_ERR_INVALID_ARGUMENT;
            json_t *ops = maco__parray(ps, tb, "ops", tpath, 0, MACO__PLAN_MAX_OPS, &nops);
            if (ops == NULL)
                return MACO_ERR_INVALID_ARGUMENT;
            R->tbs[t].nops = (int)nops;
            R->tbs[t].ops = (maco__plan_op_t *)calloc(nops ? nops : 1, sizeof(maco__plan_op_t));
            if (R->tbs[t].ops == NULL)
                return MACO_ERR_NO_MEMORY;
            for (size_t i = 0; i < nops; i++) {
                char opath[144];
                snprintf(opath, sizeof(opath), "%s.ops[%zu]", tpath, i);
                if (maco__pop(ps, J->array_get(ops, i), opath, &R->tbs[t].ops[i]) != MACO_OK)
                    return MACO_ERR_INVALID_ARGUMENT;
            }
        }
    }
    return MACO_OK;
}

void maco__plan_desc_free(maco__plan_desc_t *d)
{
    if (d == NULL)
        return;
    for (int r = 0; d->ranks != NULL && r < d->world_size; r++) {
        for (int t = 0; d->ranks[r].tbs != NULL && t < d->ranks[r].ntbs; t++)
            free(d->ranks[r].tbs[t].ops);
        free(d->ranks[r].tbs);
        free(d->ranks[r].channels);
    }
    free(d->ranks);
    free(d->ref_pool);
    free(d);
}

maco_status_t maco__plan_parse(const char *text, size_t len, const char *origin,
                               maco__plan_desc_t **desc_p, char *why, size_t cap)
{
    pthread_once(&maco__json_once, maco__json_load);
    if (maco__json_loaded == NULL) {
        snprintf(why, cap, "%s: %s", origin, maco__json_why);
        return MACO_ERR_UNSUPPORTED;
    }
    const maco__json_table_t *J = maco__json_loaded;
    json_error_t err;
    json_t *root = J->loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (root == NULL) {
        snprintf(why, cap, "%s:%d:%d: not valid JSON: %s", origin, err.line, err.column, err.text);
        return MACO_ERR_INVALID_ARGUMENT;
    }
    maco__parser_t ps = { J, origin, why, cap, 0, NULL, 0 };
    ps.d = (maco__plan_desc_t *)calloc(1, sizeof(maco__plan_desc_t));
    maco_status_t st = ps.d == NULL ? MACO_ERR_NO_MEMORY : maco__pplan(&ps, root);
    maco__json_decref(J, root);
    if (st == MACO_ERR_NO_MEMORY && !ps.failed)
        snprintf(why, cap, "%s: out of memory while reading the plan", origin);
    if (st != MACO_OK) {
        maco__plan_desc_free(ps.d);
        return st;
    }
    *desc_p = ps.d;
    return MACO_OK;
}

maco_status_t maco__plan_read_file(const char *path, char **text_p, size_t *len_p, char *why,
                                   size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(why, cap, "%s: cannot open: %s", path, strerror(errno));
        return MACO_ERR_INVALID_ARGUMENT;
    }
    size_t size = 0, room = 1 << 16;
    char *buf = (char *)malloc(room);
    while (buf != NULL) {
        size_t got = fread(buf + size, 1, room - size - 1, f);
        size += got;
        if (got == 0)
            break;
        if (size + 1 == room) {
            if (room >= ((size_t)64 << 20)) {
                fclose(f);
                free(buf);
                snprintf(why, cap, "%s: larger than 64 MiB, the largest plan read", path);
                return MACO_ERR_INVALID_ARGUMENT;
            }
            char *b = (char *)realloc(buf, room * 2);
            if (b == NULL)
                free(buf);
            buf = b;
            room *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (buf == NULL) {
        snprintf(why, cap, "%s: out of memory reading it", path);
        return MACO_ERR_NO_MEMORY;
    }
    if (bad) {
        free(buf);
        snprintf(why, cap, "%s: read error", path);
        return MACO_ERR_SYSTEM;
    }
    buf[size] = '\0';
    *text_p = buf;
    *len_p = size;
    return MACO_OK;
}
