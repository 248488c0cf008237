/* log.c - leveled, filtered logging; see log.h for the contract. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config.h"

static pthread_mutex_t maco__log_lock = PTHREAD_MUTEX_INITIALIZER;
static int maco__log_ready;
static int maco__log_level = MACO_LOG_WARN;
static unsigned maco__log_mask = ~0u;
static int maco__log_fd = 2;
static int maco__log_rank = -1;
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
    { "tool", MACO_SUBSYS_TOOL },
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

/* Reads the MACO_LOG_* variables; called with maco__log_lock held. */
static void maco__log_configure_locked(void)
{
    if (gethostname(maco__log_host, sizeof(maco__log_host)) != 0)
        snprintf(maco__log_host, sizeof(maco__log_host), "unknown");
    maco__log_host[sizeof(maco__log_host) - 1] = '\0';

    const char *level = maco__config_string(MACO_CFG_LOG_LEVEL);
    int parsed = -1;
    for (int i = 0; i < 5; i++)
        if (strcasecmp(level, maco__level_names[i]) == 0)
            parsed = i;
    if (strcasecmp(level, "warning") == 0)
        parsed = MACO_LOG_WARN;
    maco__log_level = parsed >= 0 ? parsed : MACO_LOG_WARN;

    const char *subsys = maco__config_string(MACO_CFG_LOG_SUBSYS);
    int invert = subsys[0] == '^';
    unsigned mask = 0;
    const char *p = subsys + invert;
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 3 && strncasecmp(p, "all", 3) == 0)
            mask = ~0u;
        for (int i = 0; i < MACO__NSUBSYS; i++)
            if (strlen(maco__subsys_names[i].name) == len &&
                strncasecmp(p, maco__subsys_names[i].name, len) == 0)
                mask |= maco__subsys_names[i].bit;
        p += len + (comma != NULL);
    }
    maco__log_mask = invert ? ~mask : mask;

    if (maco__log_fd > 2)
        close(maco__log_fd);
    maco__log_fd = 2;
    const char *file = maco__config_string(MACO_CFG_LOG_FILE);
    if (file[0] != '\0') {
        char path[4096];
        maco__expand_log_path(file, path, sizeof(path));
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0)
            maco__log_fd = fd;
    }
    maco__log_ready = 1;

    /* Report a bad level once the logger is usable (after the fields above are set). */
    if (parsed < 0) {
        char line[256];
        int len = snprintf(line, sizeof(line),
                           "%s:%d [-] WARN init: MACO_LOG_LEVEL='%s' is invalid: it accepts "
                           "error, warn, info, debug or trace; using warn\n",
                           maco__log_host, (int)getpid(), level);
        if (len > 0 && write(maco__log_fd, line, (size_t)len) < 0) {
            /* Nothing sensible to do when the log itself cannot be written. */
        }
    }
}

static void maco__log_ensure(void)
{
    if (__atomic_load_n(&maco__log_ready, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&maco__log_lock);
    if (!maco__log_ready)
        maco__log_configure_locked();
    pthread_mutex_unlock(&maco__log_lock);
}

void maco__log_reset(void)
{
    pthread_mutex_lock(&maco__log_lock);
    maco__log_configure_locked();
    pthread_mutex_unlock(&maco__log_lock);
}

void maco__log_set_rank(int rank)
{
    __atomic_store_n(&maco__log_rank, rank, __ATOMIC_RELAXED);
}

maco_status_t maco_log_set_handler(maco_log_handler_t handler, void *user)
{
    maco__log_handler_user = user;
    maco__log_handler = handler;
    return MACO_OK;
}

int maco__log_enabled(maco__log_level_t level, maco__subsys_t subsys)
{
    maco__log_ensure();
    return (int)level <= maco__log_level && (maco__log_mask & (unsigned)subsys) != 0;
}

void maco__vlog(maco__log_level_t level, maco__subsys_t subsys, const char *fmt, va_list ap)
{
    int saved_errno = errno;
    maco__log_ensure();
    char line[2048];
    int rank = __atomic_load_n(&maco__log_rank, __ATOMIC_RELAXED);
    char rank_text[16];
    if (rank >= 0)
        snprintf(rank_text, sizeof(rank_text), "%d", rank);
    else
        snprintf(rank_text, sizeof(rank_text), "-");
    int n = snprintf(line, sizeof(line), "%s:%d:%ld [%s] %s %s: ", maco__log_host, (int)getpid(),
                     (long)syscall(SYS_gettid), rank_text, maco__level_names[level],
                     maco__subsys_name(subsys));
    if (n < 0)
        n = 0;
    if ((size_t)n < sizeof(line)) {
        int m = vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
        if (m > 0)
            n += m;
    }
    if ((size_t)n >= sizeof(line) - 1)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    line[n] = '\0';
    if (write(maco__log_fd, line, (size_t)n) < 0) {
        /* The log is best effort. */
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
