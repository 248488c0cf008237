/* fd_server.c - see fd_server.h. */
#include "src/host/os/fd_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "src/host/base/log.h"
#include "src/host/os/socket.h"
#include "src/host/base/wire.h"

#define MACO__FD_MAGIC 0x44464D4Du /* "MFD" + 'D' */
#define MACO__FD_VERSION 1u

enum { MACO__FD_REQ_BYTES = 16, MACO__FD_REP_BYTES = 8 };

typedef struct maco__fd_entry {
    uint64_t token;
    int fd;
} maco__fd_entry_t;

static pthread_mutex_t maco__fd_life = PTHREAD_MUTEX_INITIALIZER;  /* start/stop */
static pthread_mutex_t maco__fd_table = PTHREAD_MUTEX_INITIALIZER; /* entries */
static maco__fd_entry_t *maco__fd_entries;
static int maco__fd_count, maco__fd_cap;
static int maco__fd_running;
static int maco__fd_listen = -1;
static int maco__fd_stop[2] = { -1, -1 };
static uint64_t maco__fd_nonce;
static pthread_t maco__fd_thread;
static pthread_once_t maco__fd_atfork_once = PTHREAD_ONCE_INIT;

uint64_t maco__process_token(void)
{
    static uint64_t token;
    static pid_t token_pid;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pid_t pid = getpid();
    /* A forked child is another process: it gets its own token. Under the lock, so that
     * threads of one process (ranks driving several GPUs) never see two tokens. */
    pthread_mutex_lock(&lock);
    if (token_pid != pid) {
        token = maco__random_u64();
        token_pid = pid;
    }
    uint64_t t = token;
    pthread_mutex_unlock(&lock);
    return t;
}

static socklen_t maco__fd_addr(uint32_t pid, uint64_t nonce, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    /* Abstract namespace: sun_path starts with a NUL byte; nothing touches the file system. */
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "maco-fd-%u-%016llx", pid,
                     (unsigned long long)nonce);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* A forked child has no server thread; it must not believe it has one. */
static void maco__fd_atfork_child(void)
{
    maco__fd_running = 0;
    if (maco__fd_listen >= 0)
        close(maco__fd_listen);
    maco__fd_listen = -1;
    for (int i = 0; i < 2; i++)
        if (maco__fd_stop[i] >= 0)
            close(maco__fd_stop[i]);
    maco__fd_stop[0] = maco__fd_stop[1] = -1;
    for (int i = 0; i < maco__fd_count; i++)
        close(maco__fd_entries[i].fd);
    maco__fd_count = 0;
    pthread_mutex_init(&maco__fd_life, NULL);
    pthread_mutex_init(&maco__fd_table, NULL);
}

static void maco__fd_register_atfork(void)
{
    pthread_atfork(NULL, NULL, maco__fd_atfork_child);
}

/*
 * Waits until `fd` is ready for `events` or `deadline_ms` (maco__now_ms() clock) passes:
 * 1 ready (or an error or hang-up to read), 0 the deadline passed, -1 poll failed (errno). A
 * signal that interrupts the wait (EINTR, also under SA_RESTART: poll is never restarted)
 * only shortens one round: the time left is recomputed from the deadline.
 */
static int maco__fd_wait(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - maco__now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = { .fd = fd, .events = events, .revents = 0 };
        int rc = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

/*
 * Sends all of msg's one iovec on a non-blocking socket before the deadline, its ancillary
 * data with the first byte: 0, or -1 with errno (ETIMEDOUT at the deadline).
 */
static int maco__fd_send_msg(int s, struct msghdr *msg, int64_t deadline_ms)
{
    struct iovec *iov = msg->msg_iov;
    while (iov->iov_len > 0) {
        ssize_t n = sendmsg(s, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
            msg->msg_control = NULL; /* went with the first byte */
            msg->msg_controllen = 0;
            continue;
        }
        if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        int w = n < 0 && errno == EINTR ? 1 : maco__fd_wait(s, POLLOUT, deadline_ms);
        if (w == 0)
            errno = ETIMEDOUT;
        if (w <= 0)
            return -1;
    }
    return 0;
}

/* Closes every descriptor that arrived as SCM_RIGHTS in `msg` (a reply refused or doubled). */
static void maco__fd_close_passed(struct msghdr *msg)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            close(fd);
        }
    }
}

/*
 * Receives exactly `len` bytes on a non-blocking socket before the deadline. The first
 * descriptor passed with them (SCM_RIGHTS) goes to *fd_p (left -1 when none came); any other
 * is closed. Returns `len`, the bytes received before the peer closed the connection, or -1
 * with errno (ETIMEDOUT at the deadline; EINTR never: an interrupted receive is retried).
 */
static ssize_t maco__fd_recv_all(int s, uint8_t *buf, size_t len, int64_t deadline_ms, int *fd_p)
{
    size_t got = 0;
    while (got < len) {
        union {
            struct cmsghdr hdr;
            char buf[CMSG_SPACE(sizeof(int))];
        } ctrl;
        struct iovec iov = { .iov_base = buf + got, .iov_len = len - got };
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl.buf;
        msg.msg_controllen = sizeof(ctrl.buf);
        ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n > 0) {
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            if (fd_p != NULL && *fd_p < 0 && c != NULL && c->cmsg_level == SOL_SOCKET &&
                c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
                memcpy(fd_p, CMSG_DATA(c), sizeof(int));
            else
                maco__fd_close_passed(&msg);
            got += (size_t)n;
            continue;
        }
        if (n == 0)
            return (ssize_t)got;
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        int w = errno == EINTR ? 1 : maco__fd_wait(s, POLLIN, deadline_ms);
        if (w == 0)
            errno = ETIMEDOUT;
        if (w <= 0)
            return -1;
    }
    return (ssize_t)got;
}

/* Answers one request on an accepted (non-blocking) connection, within 2 s. */
static void maco__fd_serve(int conn)
{
    int64_t deadline = maco__deadline_ms(2000);
    uint8_t req[MACO__FD_REQ_BYTES];
    if (maco__fd_recv_all(conn, req, sizeof(req), deadline, NULL) != (ssize_t)sizeof(req))
        return;
    if (maco__get_u32(req) != MACO__FD_MAGIC || maco__get_u16(req + 4) != MACO__FD_VERSION) {
        MACO_WARN(MACO_SUBSYS_MEM, "fd server: ignored a request without MACO's magic");
        return;
    }
    uint64_t token = maco__get_u64(req + 8);
    uint8_t rep[MACO__FD_REP_BYTES];
    maco__put_u32(rep, MACO__FD_MAGIC);
    pthread_mutex_lock(&maco__fd_table);
    int fd = -1;
    for (int i = 0; i < maco__fd_count; i++)
        if (maco__fd_entries[i].token == token)
            fd = maco__fd_entries[i].fd;
    maco__put_u32(rep + 4, fd >= 0 ? 0u : 1u);
    struct iovec iov = { .iov_base = rep, .iov_len = sizeof(rep) };
    union {
        struct cmsghdr hdr;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctrl;
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd >= 0) {
        memset(&ctrl, 0, sizeof(ctrl));
        msg.msg_control = ctrl.buf;
        msg.msg_controllen = sizeof(ctrl.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    /* Sent while the table is locked, so the descriptor cannot be closed meanwhile. */
    if (maco__fd_send_msg(conn, &msg, deadline) != 0)
        MACO_DEBUG(MACO_SUBSYS_MEM, "fd server: reply failed: %s", strerror(errno));
    pthread_mutex_unlock(&maco__fd_table);
}

static void *maco__fd_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct pollfd p[2] = { { .fd = maco__fd_listen, .events = POLLIN, .revents = 0 },
                               { .fd = maco__fd_stop[0], .events = POLLIN, .revents = 0 } };
        int rc = poll(p, 2, -1); /* woken by a request or by the stop pipe */
        if (rc < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (p[0].revents & POLLIN) {
            int conn = accept4(maco__fd_listen, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (conn >= 0) {
                maco__fd_serve(conn);
                close(conn);
            }
        }
    }
    return NULL;
}

/* Called with maco__fd_life held. */
static maco_status_t maco__fd_start(void)
{
    pthread_once(&maco__fd_atfork_once, maco__fd_register_atfork);
    maco__fd_nonce = maco__random_u64();
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM, "fd server: socket(AF_UNIX): %s",
                           strerror(errno));
    struct sockaddr_un a;
    socklen_t len = maco__fd_addr((uint32_t)getpid(), maco__fd_nonce, &a);
    if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 128) != 0) {
        int err = errno;
        close(fd);
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM,
                           "fd server: bind/listen on abstract socket %s: %s", a.sun_path + 1,
                           strerror(err));
    }
    if (pipe2(maco__fd_stop, O_CLOEXEC) != 0) {
        int err = errno;
        close(fd);
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM, "fd server: pipe: %s", strerror(err));
    }
    maco__fd_listen = fd;
    int err = pthread_create(&maco__fd_thread, NULL, maco__fd_main, NULL);
    if (err != 0) {
        close(fd);
        close(maco__fd_stop[0]);
        close(maco__fd_stop[1]);
        maco__fd_listen = maco__fd_stop[0] = maco__fd_stop[1] = -1;
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM, "fd server: pthread_create: %s",
                           strerror(err));
    }
    maco__fd_running = 1;
    MACO_DEBUG(MACO_SUBSYS_MEM, "fd server listening on @%s", a.sun_path + 1);
    return MACO_OK;
}

/* Called with maco__fd_life held; the table is empty. */
static void maco__fd_stop_server(void)
{
    char c = 1;
    if (write(maco__fd_stop[1], &c, 1) < 0) {
        /* The pipe is ours and empty; a failed write leaves the thread to process exit. */
    }
    pthread_join(maco__fd_thread, NULL);
    close(maco__fd_listen);
    close(maco__fd_stop[0]);
    close(maco__fd_stop[1]);
    maco__fd_listen = maco__fd_stop[0] = maco__fd_stop[1] = -1;
    maco__fd_running = 0;
}

maco_status_t maco__fd_publish(int fd, maco__fd_ref_t *ref_p)
{
    maco_status_t st = MACO_OK;
    pthread_mutex_lock(&maco__fd_life);
    if (!maco__fd_running)
        st = maco__fd_start();
    if (st == MACO_OK) {
        int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        pthread_mutex_lock(&maco__fd_table);
        if (dup < 0) {
            st = maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM, "fd server: dup: %s",
                             strerror(errno));
        } else if (maco__fd_count == maco__fd_cap) {
            int cap = maco__fd_cap ? 2 * maco__fd_cap : 16;
            maco__fd_entry_t *e = realloc(maco__fd_entries, (size_t)cap * sizeof(*e));
            if (e == NULL) {
                close(dup);
                st = maco__error(MACO_ERR_NO_MEMORY, MACO_SUBSYS_MEM, "fd server: no memory");
            } else {
                maco__fd_entries = e;
                maco__fd_cap = cap;
            }
        }
        if (st == MACO_OK) {
            uint64_t token = maco__random_u64();
            maco__fd_entries[maco__fd_count++] = (maco__fd_entry_t){ token, dup };
            ref_p->pid = (uint32_t)getpid();
            ref_p->server_nonce = maco__fd_nonce;
            ref_p->token = token;
        }
        pthread_mutex_unlock(&maco__fd_table);
    }
    pthread_mutex_unlock(&maco__fd_life);
    return st;
}

void maco__fd_withdraw(const maco__fd_ref_t *ref)
{
    pthread_mutex_lock(&maco__fd_life);
    pthread_mutex_lock(&maco__fd_table);
    for (int i = 0; i < maco__fd_count; i++) {
        if (maco__fd_entries[i].token == ref->token) {
            close(maco__fd_entries[i].fd);
            maco__fd_entries[i] = maco__fd_entries[--maco__fd_count];
            break;
        }
    }
    int empty = maco__fd_count == 0;
    pthread_mutex_unlock(&maco__fd_table);
    if (empty && maco__fd_running)
        maco__fd_stop_server();
    pthread_mutex_unlock(&maco__fd_life);
}

maco_status_t maco__fd_fetch(const maco__fd_ref_t *ref, int owner_rank, int64_t timeout_ms,
                             int *fd_p)
{
    /* Non-blocking, every wait in poll against one deadline: a signal arriving meanwhile
     * (a profiler's SIGPROF, a timer, Python's handlers) costs a retry, never the import.
     * (Blocking calls with SO_RCVTIMEO fail with EINTR even under SA_RESTART.) */
    int64_t deadline = maco__deadline_ms(timeout_ms);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_MEM, "socket(AF_UNIX): %s",
                           strerror(errno));
    struct sockaddr_un a;
    socklen_t len = maco__fd_addr(ref->pid, ref->server_nonce, &a);
    maco_status_t st = MACO_OK;
    int fd = -1;
    /* A Unix stream socket connects at once or, while the server's backlog is full, fails
     * with EAGAIN: retried until the deadline. */
    for (;;) {
        if (connect(s, (struct sockaddr *)&a, len) == 0 || errno == EISCONN)
            break;
        int err = errno;
        if (err == EINPROGRESS || err == EALREADY) {
            int w = maco__fd_wait(s, POLLOUT, deadline);
            socklen_t elen = sizeof(err);
            if (w > 0 && getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0)
                break;
            if (w == 0)
                err = ETIMEDOUT;
        } else if ((err == EAGAIN || err == EINTR) && maco__now_ms() < deadline) {
            struct timespec ts = { .tv_sec = 0, .tv_nsec = 1000000 };
            nanosleep(&ts, NULL);
            continue;
        }
        st = maco__error(err == ETIMEDOUT || err == EAGAIN ? MACO_ERR_TIMEOUT : MACO_ERR_REMOTE,
                         MACO_SUBSYS_MEM,
                         "cannot reach rank %d's memory-handle server @%s: %s (has it exited or "
                         "deregistered the memory?)",
                         owner_rank, a.sun_path + 1, strerror(err));
        goto out;
    }
    uint8_t req[MACO__FD_REQ_BYTES];
    memset(req, 0, sizeof(req));
    maco__put_u32(req, MACO__FD_MAGIC);
    maco__put_u16(req + 4, MACO__FD_VERSION);
    maco__put_u64(req + 8, ref->token);
    struct iovec iov = { .iov_base = req, .iov_len = sizeof(req) };
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (maco__fd_send_msg(s, &msg, deadline) != 0) {
        st = maco__error(errno == ETIMEDOUT ? MACO_ERR_TIMEOUT : MACO_ERR_REMOTE, MACO_SUBSYS_MEM,
                         "sending a handle request to rank %d failed: %s", owner_rank,
                         strerror(errno));
        goto out;
    }
    uint8_t rep[MACO__FD_REP_BYTES];
    ssize_t n = maco__fd_recv_all(s, rep, sizeof(rep), deadline, &fd);
    if (n != (ssize_t)sizeof(rep) || maco__get_u32(rep) != MACO__FD_MAGIC) {
        st = maco__error(n < 0 && errno == ETIMEDOUT ? MACO_ERR_TIMEOUT : MACO_ERR_REMOTE,
                         MACO_SUBSYS_MEM,
                         "no valid answer from rank %d's memory-handle server%s%s%s", owner_rank,
                         n < 0 ? ": " : "", n < 0 ? strerror(errno) : "",
                         n >= 0 && n < (ssize_t)sizeof(rep) ? " (it closed the connection)" : "");
        goto out;
    }
    if (maco__get_u32(rep + 4) != 0 || fd < 0) {
        st = maco__error(MACO_ERR_REMOTE, MACO_SUBSYS_MEM,
                         "rank %d no longer exports this memory (deregistered or freed)",
                         owner_rank);
        goto out;
    }
    *fd_p = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    close(s);
    return st;
}
