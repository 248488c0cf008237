/* config.c - the configuration table, typed parsers and the unknown-variable check. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
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

/* Skips leading and trailing blanks: returns the start, sets *end_p past the last non-blank. */
static const char *maco__trim(const char *text, const char **end_p)
{
    while (isspace((unsigned char)*text))
        text++;
    const char *end = text + strlen(text);
    while (end > text && isspace((unsigned char)end[-1]))
        end--;
    *end_p = end;
    return text;
}

/* Parses a non-negative or negative decimal integer prefix; *rest_p gets what follows. */
static int maco__parse_int_prefix(const char *text, int64_t *value_p, const char **rest_p)
{
    char *rest;
    errno = 0;
    long long v = strtoll(text, &rest, 10);
    if (rest == text || errno == ERANGE)
        return -1;
    *value_p = (int64_t)v;
    *rest_p = rest;
    return 0;
}

int maco__parse_int(const char *text, int64_t *value_p)
{
    const char *end, *rest;
    int64_t v;
    if (text == NULL)
        return -1;
    text = maco__trim(text, &end);
    if (maco__parse_int_prefix(text, &v, &rest) != 0 || rest != end)
        return -1;
    *value_p = v;
    return 0;
}

int maco__parse_size(const char *text, int64_t *bytes_p)
{
    const char *end, *rest;
    int64_t v;
    if (text == NULL)
        return -1;
    text = maco__trim(text, &end);
    if (maco__parse_int_prefix(text, &v, &rest) != 0 || v < 0)
        return -1;
    int shift = 0;
    if (rest < end) {
        switch (toupper((unsigned char)*rest)) {
        case 'K':
            shift = 10;
            break;
        case 'M':
            shift = 20;
            break;
        case 'G':
            shift = 30;
            break;
        case 'T':
            shift = 40;
            break;
        default:
            return -1;
        }
        rest++;
        /* Accept "64M", "64MB", "64MiB". */
        if (rest < end && (*rest == 'i' || *rest == 'I'))
            rest++;
        if (rest < end && (*rest == 'B' || *rest == 'b'))
            rest++;
    }
    if (rest != end)
        return -1;
    if (shift > 0 && v > (INT64_MAX >> shift))
        return -1;
    *bytes_p = v << shift;
    return 0;
}

int maco__parse_duration_ms(const char *text, int64_t *ms_p)
{
    const char *end, *rest;
    int64_t v;
    if (text == NULL)
        return -1;
    text = maco__trim(text, &end);
    if (maco__parse_int_prefix(text, &v, &rest) != 0 || v < 0)
        return -1;
    size_t unit_len = (size_t)(end - rest);
    int64_t scale; /* ms per unit; 0: microseconds */
    if (unit_len == 0 || (unit_len == 2 && strncasecmp(rest, "ms", 2) == 0))
        scale = 1;
    else if (unit_len == 2 && strncasecmp(rest, "us", 2) == 0)
        scale = 0;
    else if (unit_len == 1 && (*rest == 's' || *rest == 'S'))
        scale = 1000;
    else if (unit_len == 1 && (*rest == 'm' || *rest == 'M'))
        scale = 60000;
    else
        return -1;
    int64_t ms;
    if (scale == 0) /* round up: a non-zero deadline never becomes 0 (v + 999 could overflow) */
        ms = v / 1000 + (v % 1000 != 0);
    else if (v <= MACO__DURATION_MAX_MS / scale)
        ms = v * scale;
    else
        ms = MACO__DURATION_MAX_MS;
    /* Longer than the cap: saturated, not refused (a huge timeout means "practically
     * never"; only text outside int64's range is invalid). */
    if (ms > MACO__DURATION_MAX_MS)
        ms = MACO__DURATION_MAX_MS;
    *ms_p = ms;
    return 0;
}

int maco__parse_bool(const char *text, int *value_p)
{
    static const char *yes[] = { "1", "true", "yes", "on" };
    static const char *no[] = { "0", "false", "no", "off" };
    const char *end;
    if (text == NULL)
        return -1;
    text = maco__trim(text, &end);
    size_t len = (size_t)(end - text);
    for (int i = 0; i < 4; i++) {
        if (strlen(yes[i]) == len && strncasecmp(text, yes[i], len) == 0) {
            *value_p = 1;
            return 0;
        }
        if (strlen(no[i]) == len && strncasecmp(text, no[i], len) == 0) {
            *value_p = 0;
            return 0;
        }
    }
    return -1;
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
    } else if (row->type == MACO_CONFIG_STRING || maco__config_parse(row, text, &v) == 0) {
        return MACO_OK;
    } else if (cap > 0) {
        snprintf(why, cap, "accepts: %s", maco__config_accepts(row->type));
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
