/* config.c - the configuration table, its checks and the unknown-variable check (the text
 * parsers: parse.c). */
#include "src/host/base/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "src/host/base/log.h"
#include "maco/bootstrap.h"
#include "maco/config.h"

typedef struct maco__config_row {
    const char *name;
    maco__config_type_t type;
    const char *def;
    const char *unit;
    const char *doc;
} maco__config_row_t;

static const maco__config_row_t maco__config_rows[MACO_CFG_COUNT] = {
#define MACO__CONFIG_ROW(id, type, def, unit, doc)                                                 \
    { "MACO_" #id, MACO_CONFIG_##type, def, unit, doc },
    MACO_CONFIG_TABLE(MACO__CONFIG_ROW)
#undef MACO__CONFIG_ROW
};

static const char *maco__config_type_names[] = { "string", "int", "size", "duration", "bool" };

static const char *maco__config_accepts(maco__config_type_t type)
{
    switch (type) {
    case MACO_CONFIG_INT:
        return "a decimal integer";
    case MACO_CONFIG_SIZE:
        return "a byte count with an optional K, M, G or T suffix (e.g. 4096, 64M)";
    case MACO_CONFIG_DURATION:
        return "a duration: an integer with us, ms, s or m (e.g. 500ms, 30s), bare = ms; "
               "longer than 9223372036854 ms counts as that";
    case MACO_CONFIG_BOOL:
        return "1/0, true/false, yes/no or on/off";
    case MACO_CONFIG_STRING:
        break;
    }
    return "text";
}

const char *maco__config_name(maco__config_id_t id)
{
    return (unsigned)id < MACO_CFG_COUNT ? maco__config_rows[id].name : "MACO_?";
}

int maco__config_is_set(maco__config_id_t id)
{
    const char *v = getenv(maco__config_name(id));
    return v != NULL && v[0] != '\0';
}

const char *maco__config_string(maco__config_id_t id)
{
    if ((unsigned)id >= MACO_CFG_COUNT)
        return "";
    const char *v = getenv(maco__config_rows[id].name);
    return (v != NULL && v[0] != '\0') ? v : maco__config_rows[id].def;
}

/* Checks of STRING variables that need a parser (the readers use the same one). */
static int maco__check_nonce(const char *text, char *why, size_t cap)
{
    uint64_t v;
    if (maco__parse_nonce(text, &v) == 0)
        return 1;
    snprintf(why, cap, "1 to 16 hex digits (no sign, no 0x)");
    return 0;
}

static int maco__check_address(const char *text, char *why, size_t cap)
{
    struct sockaddr_storage ss;
    unsigned len;
    char what[200];
    if (maco__parse_address(text, &ss, &len, what, sizeof(what)) == 0)
        return 1;
    snprintf(why, cap,
             "host:port or [ipv6]:port, a port from 1 to 65535 and a host that resolves "
             "(%s)",
             what);
    return 0;
}

/* Parses `text` as a value of a numeric row; returns 0, or -1 on bad text or a STRING row. */
static int maco__config_parse(const maco__config_row_t *row, const char *text, int64_t *value_p)
{
    int64_t v = 0;
    int rc = -1;
    switch (row->type) {
    case MACO_CONFIG_INT:
        rc = maco__parse_int(text, &v);
        break;
    case MACO_CONFIG_SIZE:
        rc = maco__parse_size(text, &v);
        break;
    case MACO_CONFIG_DURATION:
        rc = maco__parse_duration_ms(text, &v);
        break;
    case MACO_CONFIG_BOOL: {
        int b = 0;
        rc = maco__parse_bool(text, &b);
        v = b;
        break;
    }
    case MACO_CONFIG_STRING:
        break;
    }
    if (rc == 0)
        *value_p = v;
    return rc;
}

/*
 * What each variable accepts beyond its type's syntax, in one place: maco__config_validate
 * (maco-info --env) and the readers (maco__config_int64, maco__config_word) both apply it,
 * so the checker and the library agree. The bounds mirror the code that uses the values
 * (algorithms/common/state.h, p2p_plan.h, transport_tcp.c, transport_ib.c, proxy.c, plan_exec.c).
 */
typedef struct maco__config_rule {
    maco__config_id_t id;
    int64_t min, max;  /* numbers: the range, both included */
    int pow2;          /* numbers: a power of two too */
    const char *words; /* strings: accepted words ("a|b"; "plan:*" any text after plan:) */
    size_t max_len;    /* strings: most bytes; 0 any */
    int zero_auto;     /* numbers: 0 (automatic) accepted too */
    /* strings: the reader's own parser; 1 when it takes the text, else 0 with what the
     * variable accepts in `why` */
    int (*check)(const char *text, char *why, size_t cap);
} maco__config_rule_t;

#define MACO__NUM(id, lo, hi)                                                                      \
    {                                                                                              \
        MACO_CFG_##id, (lo), (hi), 0, NULL, 0, 0, NULL                                             \
    }
#define MACO__WORDS(id, w)                                                                         \
    {                                                                                              \
        MACO_CFG_##id, 0, -1, 0, (w), 0, 0, NULL                                                   \
    }
#define MACO__PARSED(id, fn)                                                                       \
    {                                                                                              \
        MACO_CFG_##id, 0, -1, 0, NULL, 0, 0, (fn)                                                  \
    }
static const maco__config_rule_t maco__config_rules[] = {
    MACO__NUM(RANK, 0, MACO_MAX_RANKS - 1),
    MACO__NUM(WORLD_SIZE, 1, MACO_MAX_RANKS),
    MACO__NUM(LOCAL_RANK, 0, MACO_MAX_RANKS - 1),
    MACO__NUM(BOOTSTRAP_PORT, 1, 65535),
    MACO__WORDS(LAUNCHER, "auto|maco|torchrun|ompi|mpich|pmix|slurm"),
    MACO__PARSED(BOOTSTRAP_NONCE, maco__check_nonce),
    MACO__PARSED(BOOTSTRAP_ADDR, maco__check_address),
    { MACO_CFG_HOST_ID, 0, -1, 0, NULL, 127, 0, NULL }, /* a host id's 128 bytes with the NUL */
    MACO__WORDS(GEMM_TILE, "auto|gmma|cublasdx"),
    MACO__WORDS(GEMM_TILE_WIDTH, "auto|128|256"),
    MACO__NUM(SCRATCH_SIZE, (int64_t)1 << 20, (int64_t)16 << 30),
    MACO__WORDS(ALGO_ALLREDUCE, "oneshot_ll|twoshot_ll|rsag|hier|plan:*"),
    MACO__WORDS(ALGO_ALLGATHER, "ll|mesh|hier|plan:*"),
    MACO__WORDS(ALGO_REDUCE_SCATTER, "ll|mesh|hier|plan:*"),
    MACO__WORDS(ALGO_BROADCAST, "ll|mesh|hier"),
    MACO__WORDS(ALGO_REDUCE, "ll|mesh|hier"),
    MACO__WORDS(ALGO_ALLTOALL, "ll|copy|hier"),
    MACO__WORDS(ALGO_SENDRECV, "ll|copy"),
    MACO__NUM(P2P_LL_MAX, 0, (int64_t)1 << 40),
    MACO__NUM(P2P_LANES, 1, 32), /* MACO__P2P_MAX_LANES */
    { MACO_CFG_P2P_CHUNK_SIZE, (int64_t)16 << 10, (int64_t)4 << 20, 0, NULL, 0, 1, NULL },
    MACO__NUM(ALLREDUCE_ONESHOT_MAX, 16, (int64_t)64 << 20),
    MACO__NUM(ALLREDUCE_INPLACE_MAX, 0, (int64_t)1 << 50),
    MACO__NUM(ALLREDUCE_RSAG_CTAS, 1, 128), /* MACO__RSAG_MAX_SLOTS */
    MACO__NUM(MESH_GATE_MIN, 0, (int64_t)1 << 50),
    MACO__NUM(COLL_MAX_CTAS, 0, INT32_MAX),
    MACO__NUM(HIER_CTAS, 1, 64), /* MACO__HIER_MAX_SLOTS */
    { MACO_CFG_PROXY_FIFO_SIZE, 2, 65536, 1, NULL, 0, 0, NULL },
    MACO__WORDS(TRANSPORT, "auto|cuda|host|ib|tcp"),
    MACO__NUM(TCP_NSOCKS, 1, 8), /* MACO__TCP_MAX_SOCKS */
    MACO__NUM(TCP_CHUNK_SIZE, (int64_t)64 << 10, (int64_t)64 << 20),
    MACO__NUM(IB_GID_INDEX, -1, INT32_MAX),
    MACO__NUM(IB_TIMEOUT, 1, 31),
    MACO__NUM(IB_RETRY_CNT, 0, 7),
    MACO__NUM(PLAN_MAX_BYTES, 256, (int64_t)16 << 30),
    MACO__WORDS(NCCL_FALLBACK, "auto|never"),
};
#undef MACO__NUM
#undef MACO__WORDS
#undef MACO__PARSED

static const maco__config_rule_t *maco__config_rule(maco__config_id_t id)
{
    for (size_t i = 0; i < sizeof(maco__config_rules) / sizeof(maco__config_rules[0]); i++)
        if (maco__config_rules[i].id == id)
            return &maco__config_rules[i];
    return NULL;
}

/* A number of the row's type as the user would write it (sizes with a binary suffix). */
static void maco__config_fmt(const maco__config_row_t *row, int64_t v, char *buf, size_t cap)
{
    static const char suffix[] = "KMGT";
    int k = -1;
    while (row->type == MACO_CONFIG_SIZE && k < 3 && v != 0 && v % 1024 == 0) {
        v /= 1024;
        k++;
    }
    if (k >= 0)
        snprintf(buf, cap, "%lld%c", (long long)v, suffix[k]);
    else
        snprintf(buf, cap, "%lld", (long long)v);
}

/* What the rule accepts, in words ("an integer from 1 to 16", "auto, gmma or cublasdx"). */
static void maco__config_rule_text(const maco__config_row_t *row, const maco__config_rule_t *r,
                                   char *buf, size_t cap)
{
    if (r->words != NULL) {
        size_t used = 0;
        const char *w = r->words;
        int n = 0;
        for (const char *c = w; *c; c++)
            n += *c == '|';
        for (int i = 0; i <= n && used < cap; i++) {
            size_t len = strcspn(w, "|");
            const char *sep = i == 0 ? "" : i == n ? " or " : ", ";
            int star = len > 0 && w[len - 1] == '*';
            used += (size_t)snprintf(buf + used, cap - used, "%s%.*s%s", sep,
                                     (int)(star ? len - 1 : len), w, star ? "FILE" : "");
            w += len + (w[len] == '|');
        }
    } else if (r->max_len > 0) {
        snprintf(buf, cap, "text of at most %zu bytes", r->max_len);
    } else {
        char lo[32], hi[32];
        maco__config_fmt(row, r->min, lo, sizeof(lo));
        maco__config_fmt(row, r->max, hi, sizeof(hi));
        snprintf(buf, cap, "%s from %s to %s%s", r->pow2 ? "a power of two" : "a value", lo, hi,
                 r->zero_auto ? ", or 0 (automatic)" : "");
    }
}

/* Whether `text` (number v where the row is numeric) passes the rule of row `id`; when not,
 * what it accepts in why. No rule: it passes. */
static int maco__config_rule_ok(maco__config_id_t id, const char *text, int64_t v, char *why,
                                size_t cap)
{
    const maco__config_rule_t *r = maco__config_rule(id);
    const maco__config_row_t *row = &maco__config_rows[id];
    if (r == NULL)
        return 1;
    int ok = 1;
    if (r->check != NULL) {
        char what[300] = "";
        ok = r->check(text, what, sizeof(what));
        if (!ok && cap > 0)
            snprintf(why, cap, "%s", what);
        return ok;
    }
    if (r->words != NULL) {
        ok = 0;
        const char *w = r->words;
        while (*w && !ok) {
            size_t len = strcspn(w, "|");
            if (len > 0 && w[len - 1] == '*')
                ok = strncasecmp(text, w, len - 1) == 0 && text[len - 1] != '\0';
            else
                ok = strlen(text) == len && strncasecmp(text, w, len) == 0;
            w += len + (w[len] == '|');
        }
    } else if (r->max_len > 0) {
        ok = strlen(text) <= r->max_len;
    } else if (row->type != MACO_CONFIG_STRING) {
        ok = (r->zero_auto && v == 0) ||
             (v >= r->min && v <= r->max && (!r->pow2 || (v & (v - 1)) == 0));
    }
    if (!ok && cap > 0)
        maco__config_rule_text(row, r, why, cap);
    return ok;
}

maco_status_t maco__config_word(maco__config_id_t id, const char **value_p)
{
    if ((unsigned)id >= MACO_CFG_COUNT || value_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "config id %d out of range or null output", (int)id);
    const char *text = maco__config_string(id);
    char accepts[256];
    /* Unset or empty: the default, as maco__config_validate takes it (an empty default, e.g.
     * MACO_ALGO_ALLREDUCE's "pick by size", is not among the words a user may set). */
    if (maco__config_is_set(id) && !maco__config_rule_ok(id, text, 0, accepts, sizeof(accepts)))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "%s='%s' is invalid: it accepts %s", maco__config_rows[id].name, text,
                           accepts);
    *value_p = text;
    return MACO_OK;
}

maco_status_t maco__config_int64(maco__config_id_t id, int64_t *value_p)
{
    if ((unsigned)id >= MACO_CFG_COUNT || value_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "config id %d out of range or null output", (int)id);
    const maco__config_row_t *row = &maco__config_rows[id];
    if (row->type == MACO_CONFIG_STRING)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "%s is a string variable, not a number", row->name);
    const char *text = maco__config_string(id);
    int64_t v = 0;
    if (maco__config_parse(row, text, &v) != 0) {
        if (text[0] == '\0')
            return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                               "%s is not set and has no default", row->name);
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "%s='%s' is invalid: it accepts %s", row->name, text,
                           maco__config_accepts(row->type));
    }
    char accepts[256];
    if (!maco__config_rule_ok(id, text, v, accepts, sizeof(accepts)))
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "%s='%s' is invalid: it accepts %s", row->name, text, accepts);
    *value_p = v;
    return MACO_OK;
}

/* Levenshtein distance, bounded to short names (variable names are < 64 characters). */
static int maco__edit_distance(const char *a, const char *b)
{
    enum { MAXLEN = 64 };
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la >= MAXLEN || lb >= MAXLEN)
        return INT_MAX;
    int prev[MAXLEN + 1], cur[MAXLEN + 1];
    for (int j = 0; j <= lb; j++)
        prev[j] = j;
    for (int i = 1; i <= la; i++) {
        cur[0] = i;
        for (int j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (size_t)(lb + 1));
    }
    return prev[lb];
}

extern char **environ;

/* Names already warned about: each unknown variable is reported once per process. */
static pthread_mutex_t maco__warned_lock = PTHREAD_MUTEX_INITIALIZER;
static char maco__warned[16][128];
static int maco__nwarned;

static int maco__first_warning(const char *name)
{
    int first = 1;
    pthread_mutex_lock(&maco__warned_lock);
    for (int i = 0; i < maco__nwarned && first; i++)
        first = strcmp(maco__warned[i], name) != 0;
    if (first && maco__nwarned < 16)
        snprintf(maco__warned[maco__nwarned++], sizeof(maco__warned[0]), "%s", name);
    pthread_mutex_unlock(&maco__warned_lock);
    return first;
}

int maco__config_lookup(const char *name, int *closest_p)
{
    int best = INT_MAX, closest = 0;
    for (int i = 0; i < MACO_CFG_COUNT; i++) {
        if (strcmp(name, maco__config_rows[i].name) == 0)
            return i;
        int d = maco__edit_distance(name, maco__config_rows[i].name);
        if (d < best) {
            best = d;
            closest = i;
        }
    }
    if (closest_p != NULL)
        *closest_p = closest;
    return -1;
}

int maco__config_check_environment(void)
{
    int unknown = 0;
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "MACO_", 5) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        char name[128];
        if (len >= sizeof(name))
            len = sizeof(name) - 1;
        memcpy(name, *e, len);
        name[len] = '\0';
        int closest = 0;
        if (maco__config_lookup(name, &closest) < 0) {
            unknown++;
            if (maco__first_warning(name))
                MACO_WARN(MACO_SUBSYS_INIT,
                          "unknown variable %s (did you mean %s?); maco-info --env "
                          "lists every variable",
                          name, maco__config_rows[closest].name);
        }
    }
    return unknown;
}

maco_status_t maco__config_validate(maco__config_id_t id, char *why, size_t cap)
{
    if ((unsigned)id >= MACO_CFG_COUNT) {
        if (cap > 0)
            snprintf(why, cap, "no such variable (id %d)", (int)id);
        return MACO_ERR_INVALID_ARGUMENT;
    }
    const maco__config_row_t *row = &maco__config_rows[id];
    if (!maco__config_is_set(id))
        return MACO_OK; /* the default, which is valid (a unit test checks every one) */
    const char *text = maco__config_string(id);
    int64_t v;
    unsigned mask;
    char bad[256];
    if (id == MACO_CFG_LOG_LEVEL) {
        if (maco__log_parse_level(text) >= 0)
            return MACO_OK;
        if (cap > 0)
            snprintf(why, cap, "accepts: " MACO__LOG_LEVEL_ACCEPTS);
    } else if (id == MACO_CFG_LOG_SUBSYS) {
        int nbad = maco__log_parse_subsys(text, &mask, bad, sizeof(bad));
        if (nbad == 0)
            return MACO_OK;
        if (cap > 0)
            snprintf(why, cap, "unknown subsystem%s %s; accepts: " MACO__LOG_SUBSYS_ACCEPTS,
                     nbad > 1 ? "s" : "", bad);
    } else if (row->type != MACO_CONFIG_STRING && maco__config_parse(row, text, &v) != 0) {
        if (cap > 0)
            snprintf(why, cap, "accepts: %s", maco__config_accepts(row->type));
    } else {
        char accepts[256];
        if (maco__config_rule_ok(id, text, row->type == MACO_CONFIG_STRING ? 0 : v, accepts,
                                 sizeof(accepts)))
            return MACO_OK;
        if (cap > 0)
            snprintf(why, cap, "accepts: %s", accepts);
    }
    return MACO_ERR_INVALID_ARGUMENT;
}

int maco_config_count(void)
{
    return MACO_CFG_COUNT;
}

maco_status_t maco_config_describe(int index, maco_config_info_t *info_p)
{
    if (index < 0 || index >= MACO_CFG_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_config_describe: index %d is outside [0, %d)", index,
                           MACO_CFG_COUNT);
    if (info_p == NULL)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_config_describe: info_p is NULL");
    const maco__config_row_t *row = &maco__config_rows[index];
    info_p->name = row->name;
    info_p->type = maco__config_type_names[row->type];
    info_p->default_value = row->def;
    info_p->unit = row->unit;
    info_p->doc = row->doc;
    info_p->current = getenv(row->name);
    return MACO_OK;
}

maco_status_t maco_config_validate(int index, char *why, size_t cap)
{
    if (index < 0 || index >= MACO_CFG_COUNT)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_config_validate: index %d is outside [0, %d)", index,
                           MACO_CFG_COUNT);
    if (why == NULL && cap > 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_INIT,
                           "maco_config_validate: why is NULL but cap is %zu", cap);
    return maco__config_validate((maco__config_id_t)index, why, cap);
}

int maco_config_lookup(const char *name, int *closest_p)
{
    if (name == NULL)
        return -1;
    int closest = 0;
    int index = maco__config_lookup(name, &closest);
    if (index < 0 && closest_p != NULL)
        *closest_p = closest;
    return index;
}
