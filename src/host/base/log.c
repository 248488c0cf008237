/* log.c - leveled, filtered logging; see log.h for the contract. */
#include "src/host/base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t maco__log_lock = PTHREAD_MUTEX_INITIALIZER;
static int maco__log_ready;
static int maco__log_level = MACO_LOG_WARN;
static unsigned maco__log_mask = ~0u;
static int maco__log_fd = 2;
static int maco__log_rank = -1;
static _Thread_local int maco__log_thread_rank = MACO__LOG_RANK_UNSET;
/* 1 while this thread's ERROR lines go to the handler only (maco_log_set_error_capture). */
static _Thread_local int maco__log_capture_errors;
static char maco__log_host[64];
static maco_log_handler_t maco__log_handler;
static void *maco__log_handler_user;

static _Thread_local char maco__last_error_text[1024];

static const char *maco__level_names[] = { "ERROR", "WARN", "INFO", "DEBUG", "TRACE" };

static const struct {
    const char *name;
    unsigned bit;
} maco__subsys_names[] = {
    { "init", MACO_SUBSYS_INIT }, { "bootstrap", MACO_SUBSYS_BOOTSTRAP },
    { "mem", MACO_SUBSYS_MEM },   { "channel", MACO_SUBSYS_CHANNEL },
    { "coll", MACO_SUBSYS_COLL }, { "proxy", MACO_SUBSYS_PROXY },
    { "tool", MACO_SUBSYS_TOOL }, { "persist", MACO_SUBSYS_PERSIST },
};
enum { MACO__NSUBSYS = sizeof(maco__subsys_names) / sizeof(maco__subsys_names[0]) };

static const char *maco__subsys_name(unsigned bit)
{
    for (int i = 0; i < MACO__NSUBSYS; i++)
        if (maco__subsys_names[i].bit == bit)
            return maco__subsys_names[i].name;
    return "?";
}

/* Expands %h and %p in a MACO_LOG_FILE pattern. */
static void maco__expand_log_path(const char *pattern, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = pattern; *p != '\0' && n + 1 < cap; p++) {
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
            char tmp[64];
            if (p[1] == 'h')
                snprintf(tmp, sizeof(tmp), "%s", maco__log_host);
            else
                snprintf(tmp, sizeof(tmp), "%d", (int)getpid());
            for (const char *t = tmp; *t != '\0' && n + 1 < cap; t++)
                out[n++] = *t;
            p++;
        } else {
            out[n++] = *p;
        }
    }
    out[n] = '\0';
}

int maco__log_parse_level(const char *text)
{
    if (text == NULL)
        return -1;
    for (int i = 0; i < 5; i++)
        if (strcasecmp(text, maco__level_names[i]) == 0)
            return i;
    if (strcasecmp(text, "warning") == 0)
        return MACO_LOG_WARN;
    return -1;
}

int maco__log_parse_subsys(const char *text, unsigned *mask_p, char *bad, size_t cap)
{
    if (cap > 0)
        bad[0] = '\0';
    if (text == NULL)
        text = "";
    int invert = text[0] == '^';
    int known = 0, unknown = 0;
    size_t bad_len = 0;
    unsigned mask = 0;
    const char *p = text + invert;
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *next = comma ? comma + 1 : end;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        size_t len = (size_t)(end - p);
        int found = len == 3 && strncasecmp(p, "all", 3) == 0;
        if (found)
            mask = ~0u;
        for (int i = 0; i < MACO__NSUBSYS && !found; i++) {
            if (strlen(maco__subsys_names[i].name) == len &&
                strncasecmp(p, maco__subsys_names[i].name, len) == 0) {
                mask |= maco__subsys_names[i].bit;
                found = 1;
            }
        }
        if (found) {
            known++;
        } else if (len > 0) {
            unknown++;
            if (bad_len < cap) {
                int n = snprintf(bad + bad_len, cap - bad_len, "%s'%.*s'", bad_len ? ", " : "",
                                 (int)len, p);
                bad_len = n > 0 ? bad_len + (size_t)n : bad_len;
            }
        }
        p = next;
    }
    if (known == 0) /* nothing usable is left: as if unset */
        mask = invert ? 0u : ~0u;
    *mask_p = invert ? ~mask : mask;
    return unknown;
}

/* Problems of the MACO_LOG_* values, found with the lock held and logged after it. */
typedef struct maco__log_notes {
    int n;
    char text[3][1024];
} maco__log_notes_t;

/* A MACO_LOG_* variable's text, or `def` when unset or empty. The logger reads its three
 * variables itself, by the names and defaults of config.h's table, so that it sits below the
 * configuration code, which logs (docs/design.md, layers). */
static const char *maco__log_env(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : def;
}

/* Reads the MACO_LOG_* variables; called with maco__log_lock held. */
static void maco__log_configure_locked(maco__log_notes_t *notes)
{
    notes->n = 0;
    if (gethostname(maco__log_host, sizeof(maco__log_host)) != 0)
        snprintf(maco__log_host, sizeof(maco__log_host), "unknown");
    maco__log_host[sizeof(maco__log_host) - 1] = '\0';

    const char *level = maco__log_env("MACO_LOG_LEVEL", "warn");
    int parsed = maco__log_parse_level(level);
    maco__log_level = parsed >= 0 ? parsed : MACO_LOG_WARN;
    if (parsed < 0)
        snprintf(notes->text[notes->n++], sizeof(notes->text[0]),
                 "MACO_LOG_LEVEL='%s' is invalid: it accepts " MACO__LOG_LEVEL_ACCEPTS
                 "; using warn",
                 level);

    const char *subsys = maco__log_env("MACO_LOG_SUBSYS", "all");
    unsigned mask = ~0u;
    char bad[256];
    int nbad = maco__log_parse_subsys(subsys, &mask, bad, sizeof(bad));
    maco__log_mask = mask;
    if (nbad > 0)
        snprintf(notes->text[notes->n++], sizeof(notes->text[0]),
                 "MACO_LOG_SUBSYS='%s': unknown subsystem%s %s, ignored%s: it "
                 "accepts " MACO__LOG_SUBSYS_ACCEPTS,
                 subsys, nbad > 1 ? "s" : "", bad, mask == ~0u ? " (showing every subsystem)" : "");

    if (maco__log_fd > 2)
        close(maco__log_fd);
    maco__log_fd = 2;
    const char *file = maco__log_env("MACO_LOG_FILE", "");
    if (file[0] != '\0') {
        char path[4096];
        maco__expand_log_path(file, path, sizeof(path));
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0)
            maco__log_fd = fd;
        else
            snprintf(notes->text[notes->n++], sizeof(notes->text[0]),
                     "MACO_LOG_FILE='%.256s': cannot open %.512s: %.128s; logging to standard "
                     "error",
                     file, path, strerror(errno));
    }
    __atomic_store_n(&maco__log_ready, 1, __ATOMIC_RELEASE);
}

/* Logs the problems found in MACO_LOG_*, past the filters: they are about the filters. */
static void maco__log_report(const maco__log_notes_t *notes)
{
    for (int i = 0; i < notes->n; i++)
        maco__log(MACO_LOG_WARN, MACO_SUBSYS_INIT, "%s", notes->text[i]);
}

static void maco__log_ensure(void)
{
    if (__atomic_load_n(&maco__log_ready, __ATOMIC_ACQUIRE))
        return;
    int saved_errno = errno;
    maco__log_notes_t notes = { 0 };
    pthread_mutex_lock(&maco__log_lock);
    if (!maco__log_ready)
        maco__log_configure_locked(&notes);
    pthread_mutex_unlock(&maco__log_lock);
    maco__log_report(&notes);
    errno = saved_errno;
}

void maco__log_reset(void)
{
    maco__log_notes_t notes = { 0 };
    pthread_mutex_lock(&maco__log_lock);
    maco__log_configure_locked(&notes);
    pthread_mutex_unlock(&maco__log_lock);
    maco__log_report(&notes);
}

void maco__log_set_rank(int rank)
{
    __atomic_store_n(&maco__log_rank, rank, __ATOMIC_RELAXED);
    maco__log_thread_rank = rank;
}

int maco__log_swap_thread_rank(int rank)
{
    int previous = maco__log_thread_rank;
    maco__log_thread_rank = rank;
    return previous;
}

void maco__log_restore_thread_rank(const int *saved)
{
    maco__log_thread_rank = *saved;
}

maco_status_t maco_log_set_handler(maco_log_handler_t handler, void *user)
{
    maco__log_handler_user = user;
    maco__log_handler = handler;
    return MACO_OK;
}

int maco_log_set_error_capture(int on)
{
    int previous = maco__log_capture_errors;
    maco__log_capture_errors = on != 0;
    return previous;
}

int maco__log_enabled(maco__log_level_t level, maco__subsys_t subsys)
{
    maco__log_ensure();
    /* Errors pass every subsystem filter: a filter chooses what to watch, not what fails. */
    return (int)level <= maco__log_level &&
           (level == MACO_LOG_ERROR || (maco__log_mask & (unsigned)subsys) != 0);
}

/* Copies src[0, len) into out (at most cap - 1 bytes and a NUL) with control characters
 * escaped; "..." at the end when it did not all fit or `cut`. Returns the bytes written. */
static size_t maco__log_escape(char *out, size_t cap, const char *src, size_t len, int cut)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)src[i];
        char esc[5];
        size_t k = 0;
        if (c == '\n' || c == '\r' || c == '\t') {
            esc[k++] = '\\';
            esc[k++] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else if (c < 0x20 || c == 0x7f) {
            esc[k++] = '\\';
            esc[k++] = 'x';
            esc[k++] = hex[c >> 4];
            esc[k++] = hex[c & 15];
        } else {
            esc[k++] = (char)c;
        }
        if (o + k + 4 > cap) { /* room for "..." and the NUL */
            cut = 1;
            break;
        }
        memcpy(out + o, esc, k);
        o += k;
    }
    if (cut && o + 4 <= cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    if (cap > 0)
        out[o] = '\0';
    return o;
}

void maco__vlog(maco__log_level_t level, maco__subsys_t subsys, const char *fmt, va_list ap)
{
    int saved_errno = errno;
    maco__log_ensure();
    char line[2048];
    int rank = maco__log_thread_rank;
    if (rank == MACO__LOG_RANK_UNSET)
        rank = __atomic_load_n(&maco__log_rank, __ATOMIC_RELAXED);
    char rank_text[16];
    if (rank >= 0)
        snprintf(rank_text, sizeof(rank_text), "%d", rank);
    else
        snprintf(rank_text, sizeof(rank_text), "-");
    int n = snprintf(line, sizeof(line), "%s:%d:%ld [%s] %s %s: ", maco__log_host, (int)getpid(),
                     (long)syscall(SYS_gettid), rank_text, maco__level_names[level],
                     maco__subsys_name(subsys));
    if (n < 0 || (size_t)n >= sizeof(line))
        n = 0;
    /* The message is escaped once, here, so that nothing it echoes (a configuration value, a
     * peer's text) can forge a log line or drive a terminal: control characters become \n,
     * \r, \t or \xNN; a message cut short for room ends with "...". */
    char text[sizeof(line)];
    int m = vsnprintf(text, sizeof(text), fmt, ap);
    size_t len = m < 0 ? 0 : (size_t)m < sizeof(text) ? (size_t)m : sizeof(text) - 1;
    n = (int)maco__log_escape(line + n, sizeof(line) - 1 - (size_t)n, text, len,
                              (size_t)m >= sizeof(text)) +
        n;
    line[n++] = '\n';
    line[n] = '\0';
    if (level != MACO_LOG_ERROR || !maco__log_capture_errors) {
        /* The log is best effort, but a signal (EINTR) or a short write into a full pipe
         * does not cut a line: what is left is written again. */
        for (size_t done = 0; done < (size_t)n;) {
            ssize_t w = write(maco__log_fd, line + done, (size_t)n - done);
            if (w > 0)
                done += (size_t)w;
            else if (w == 0 || errno != EINTR)
                break;
        }
    }
    if (maco__log_handler != NULL)
        maco__log_handler(level, line, maco__log_handler_user);
    errno = saved_errno;
}

void maco__log(maco__log_level_t level, maco__subsys_t subsys, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    maco__vlog(level, subsys, fmt, ap);
    va_end(ap);
}

maco_status_t maco__error(maco_status_t status, maco__subsys_t subsys, const char *fmt, ...)
{
    int saved_errno = errno;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(maco__last_error_text, sizeof(maco__last_error_text), fmt, ap);
    va_end(ap);
    if (maco__log_enabled(MACO_LOG_ERROR, subsys))
        maco__log(MACO_LOG_ERROR, subsys, "%s (%s)", maco__last_error_text,
                  maco_status_string(status));
    errno = saved_errno;
    return status;
}

maco_status_t maco__error_quiet(maco_status_t status, const char *fmt, ...)
{
    int saved_errno = errno;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(maco__last_error_text, sizeof(maco__last_error_text), fmt, ap);
    va_end(ap);
    errno = saved_errno;
    return status;
}

const char *maco__last_error(void)
{
    return maco__last_error_text;
}

void maco__clear_last_error(void)
{
    maco__last_error_text[0] = '\0';
}

/* The subsystem a public caller names; "tool" when the name is unknown or NULL. */
static maco__subsys_t maco__subsys_of(const char *name)
{
    for (int i = 0; name != NULL && i < MACO__NSUBSYS; i++)
        if (strcasecmp(name, maco__subsys_names[i].name) == 0)
            return (maco__subsys_t)maco__subsys_names[i].bit;
    return MACO_SUBSYS_TOOL;
}

void maco_log_write(maco_log_level_t level, const char *subsys, const char *fmt, ...)
{
    if ((unsigned)level > MACO_LOG_TRACE || fmt == NULL)
        return;
    maco__subsys_t bit = maco__subsys_of(subsys);
    if (!maco__log_enabled(level, bit))
        return;
    va_list ap;
    va_start(ap, fmt);
    maco__vlog(level, bit, fmt, ap);
    va_end(ap);
}

int maco_log_enabled(maco_log_level_t level, const char *subsys)
{
    if ((unsigned)level > MACO_LOG_TRACE)
        return 0;
    return maco__log_enabled(level, maco__subsys_of(subsys));
}

const char *maco_log_last_error(void)
{
    return maco__last_error_text;
}
