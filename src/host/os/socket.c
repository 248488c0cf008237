/* socket.c - TCP helpers for the bootstrap; see socket.h. */
#include "src/host/os/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "src/host/base/config.h"
#include "src/host/base/log.h"
#include "src/host/base/wire.h"

uint64_t maco__random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = (uint64_t)maco__now_ms() * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

int64_t maco__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t maco__deadline_ms(int64_t timeout_ms)
{
    int64_t now = maco__now_ms();
    if (timeout_ms <= 0)
        return now;
    return timeout_ms > INT64_MAX - now ? INT64_MAX : now + timeout_ms;
}

uint64_t maco__timeout_ns(int64_t timeout_ms)
{
    if (timeout_ms <= 0)
        return 0;
    return (uint64_t)timeout_ms > UINT64_MAX / 1000000u ? UINT64_MAX
                                                        : (uint64_t)timeout_ms * 1000000u;
}

/*
 * Wire layout (24 bytes, little-endian):
 *   0  u16 family (4 = IPv4, 6 = IPv6, 0 = none)
 *   2  u16 port (host order value)
 *   4  u8[16] address (IPv4 uses the first 4 bytes)
 *  20  u32 IPv6 scope id
 */
void maco__sockaddr_to_wire(const maco__sockaddr_t *addr, uint8_t out[MACO__WIRE_ADDR_BYTES])
{
    memset(out, 0, MACO__WIRE_ADDR_BYTES);
    if (addr->ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&addr->ss;
        maco__put_u16(out, 4);
        maco__put_u16(out + 2, ntohs(in->sin_port));
        memcpy(out + 4, &in->sin_addr, 4);
    } else if (addr->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&addr->ss;
        maco__put_u16(out, 6);
        maco__put_u16(out + 2, ntohs(in6->sin6_port));
        memcpy(out + 4, &in6->sin6_addr, 16);
        maco__put_u32(out + 20, in6->sin6_scope_id);
    }
}

int maco__sockaddr_from_wire(const uint8_t in[MACO__WIRE_ADDR_BYTES], maco__sockaddr_t *addr)
{
    memset(addr, 0, sizeof(*addr));
    uint16_t family = maco__get_u16(in);
    if (family == 4) {
        struct sockaddr_in *a = (struct sockaddr_in *)&addr->ss;
        a->sin_family = AF_INET;
        a->sin_port = htons(maco__get_u16(in + 2));
        memcpy(&a->sin_addr, in + 4, 4);
        addr->len = sizeof(*a);
        return 0;
    }
    if (family == 6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&addr->ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(maco__get_u16(in + 2));
        memcpy(&a->sin6_addr, in + 4, 16);
        a->sin6_scope_id = maco__get_u32(in + 20);
        addr->len = sizeof(*a);
        return 0;
    }
    return -1;
}

void maco__sockaddr_format(const maco__sockaddr_t *addr, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (addr->ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&addr->ss;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(in->sin_port));
    } else if (addr->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&addr->ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(out, cap, "[%s]:%u", host, (unsigned)ntohs(in6->sin6_port));
    } else {
        snprintf(out, cap, "(no address)");
    }
}

uint16_t maco__sockaddr_port(const maco__sockaddr_t *addr)
{
    if (addr->ss.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)&addr->ss)->sin_port);
    if (addr->ss.ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)&addr->ss)->sin6_port);
    return 0;
}

void maco__sockaddr_set_port(maco__sockaddr_t *addr, uint16_t port)
{
    if (addr->ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&addr->ss)->sin_port = htons(port);
    else if (addr->ss.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&addr->ss)->sin6_port = htons(port);
}

maco_status_t maco__sockaddr_parse(const char *text, const char *what, maco__sockaddr_t *addr)
{
    if (text == NULL || text[0] == '\0')
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s is empty: expected host:port or [ipv6]:port", what);
    /* The one check of an address (config.c): maco-info --env gives the same verdict. */
    char why[300];
    unsigned len = 0;
    maco__sockaddr_t parsed;
    if (maco__parse_address(text, &parsed.ss, &len, why, sizeof(why)) != 0)
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "%s='%s' is invalid: %s", what, text, why);
    parsed.len = (socklen_t)len;
    *addr = parsed;
    return MACO_OK;
}

int maco__ifname_match(const char *spec, const char *name)
{
    int exclude = spec[0] == '^';
    if (exclude)
        spec++;
    int exact = spec[0] == '=';
    if (exact)
        spec++;
    int hit = 0;
    while (!hit && *spec != '\0') {
        size_t len = strcspn(spec, ",");
        if (len > 0)
            hit = exact ? strlen(name) == len && strncmp(name, spec, len) == 0
                        : strncmp(name, spec, len) == 0;
        spec += len;
        if (*spec == ',')
            spec++;
    }
    return exclude ? !hit : hit;
}

maco_status_t maco__socket_default_address(maco__sockaddr_t *addr)
{
    const char *want = maco__config_string(MACO_CFG_SOCKET_IFNAME);
    /* An exclusion list ("^docker,lo") chooses as the default does among what it leaves. */
    int include = want[0] != '\0' && want[0] != '^';
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "getifaddrs failed: %s",
                           strerror(errno));
    const struct ifaddrs *pick = NULL;
    for (const struct ifaddrs *it = ifs; it != NULL; it = it->ifa_next) {
        if (it->ifa_addr == NULL || !(it->ifa_flags & IFF_UP))
            continue;
        int family = it->ifa_addr->sa_family;
        if (family != AF_INET && family != AF_INET6)
            continue;
        if (want[0] != '\0' && !maco__ifname_match(want, it->ifa_name))
            continue;
        if (!include && ((it->ifa_flags & IFF_LOOPBACK) || family != AF_INET))
            continue;
        pick = it;
        break;
    }
    memset(addr, 0, sizeof(*addr));
    if (pick != NULL) {
        size_t len = pick->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                          : sizeof(struct sockaddr_in6);
        memcpy(&addr->ss, pick->ifa_addr, len);
        addr->len = (socklen_t)len;
        MACO_DEBUG(MACO_SUBSYS_BOOTSTRAP, "bootstrap interface %s", pick->ifa_name);
    } else if (want[0] != '\0') {
        freeifaddrs(ifs);
        return maco__error(MACO_ERR_INVALID_ARGUMENT, MACO_SUBSYS_BOOTSTRAP,
                           "MACO_SOCKET_IFNAME='%s' matches no interface that is up with an "
                           "IPv4 or IPv6 address",
                           want);
    } else {
        struct sockaddr_in *in = (struct sockaddr_in *)&addr->ss;
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr->len = sizeof(*in);
    }
    freeifaddrs(ifs);
    maco__sockaddr_set_port(addr, 0);
    return MACO_OK;
}

static maco_status_t maco__socket_configure(int fd)
{
    int one = 1;
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "fcntl(O_NONBLOCK): %s",
                           strerror(errno));
    /* Not every socket is TCP (tests use socketpairs); ignore ENOTSUP/EOPNOTSUPP. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return MACO_OK;
}

maco_status_t maco__socket_listen(maco__sockaddr_t *addr, int *fd_p)
{
    char text[96];
    maco__sockaddr_format(addr, text, sizeof(text));
    int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "socket() for %s: %s", text,
                           strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (const struct sockaddr *)&addr->ss, addr->len) != 0) {
        int err = errno;
        close(fd);
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "bind(%s): %s", text,
                           strerror(err));
    }
    if (listen(fd, SOMAXCONN) != 0) {
        int err = errno;
        close(fd);
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "listen(%s): %s", text,
                           strerror(err));
    }
    maco__sockaddr_t bound;
    bound.len = sizeof(bound.ss);
    if (getsockname(fd, (struct sockaddr *)&bound.ss, &bound.len) != 0) {
        int err = errno;
        close(fd);
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "getsockname(%s): %s", text,
                           strerror(err));
    }
    maco_status_t st = maco__socket_configure(fd);
    if (st != MACO_OK) {
        close(fd);
        return st;
    }
    maco__sockaddr_set_port(addr, maco__sockaddr_port(&bound));
    *fd_p = fd;
    return MACO_OK;
}

maco_status_t maco__socket_connect(const maco__sockaddr_t *addr, int64_t deadline_ms,
                                   const char *what, int *fd_p)
{
    return maco__socket_connect_watched(addr, deadline_ms, what, NULL, NULL, fd_p);
}

maco_status_t maco__socket_connect_watched(const maco__sockaddr_t *addr, int64_t deadline_ms,
                                           const char *what, maco_status_t (*stop)(void *ctx),
                                           void *stop_ctx, int *fd_p)
{
    char text[96];
    maco__sockaddr_format(addr, text, sizeof(text));
    int backoff_ms = 5;
    int last_err = 0; /* the last attempt's own error (not our deadline cutting it short) */
    int refused = 0, attempts = 0;
    for (;;) {
        int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "socket() to %s: %s", text,
                               strerror(errno));
        int rc = connect(fd, (const struct sockaddr *)&addr->ss, addr->len);
        if (rc != 0 && errno == EINPROGRESS) {
            int64_t left;
            struct pollfd pfd = { .fd = fd, .events = POLLOUT, .revents = 0 };
            int64_t slice = stop != NULL ? 200 : 1000; /* how often `stop` is asked */
            /* A signal ends a poll early (EINTR): poll again for the time left. */
            do {
                left = deadline_ms - maco__now_ms();
                rc = left > 0 ? poll(&pfd, 1, (int)(left > slice ? slice : left)) : 0;
            } while (rc < 0 && errno == EINTR);
            if (rc > 0) {
                int err = 0;
                socklen_t len = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                rc = err == 0 ? 0 : -1;
                errno = err;
            } else {
                /* Our own deadline cut the attempt short: it says nothing about the peer. */
                int err = rc == 0 ? (left > 0 ? ETIMEDOUT : 0) : errno;
                rc = -1;
                errno = err;
            }
        }
        if (rc == 0) {
            maco_status_t st = maco__socket_configure(fd);
            if (st != MACO_OK) {
                close(fd);
                return st;
            }
            *fd_p = fd;
            return MACO_OK;
        }
        int err = errno;
        close(fd);
        if (err == 0)
            break; /* the deadline passed during this attempt */
        last_err = err;
        attempts++;
        refused += last_err == ECONNREFUSED;
        if (last_err != ECONNREFUSED && last_err != ETIMEDOUT && last_err != EHOSTUNREACH &&
            last_err != ENETUNREACH && last_err != ECONNRESET && last_err != EAGAIN &&
            last_err != EINTR)
            return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "connect to %s at %s: %s",
                               what, text, strerror(last_err));
        if (stop != NULL) {
            maco_status_t st = stop(stop_ctx);
            if (st != MACO_OK)
                return st;
        }
        int64_t now = maco__now_ms();
        if (now >= deadline_ms)
            break;
        int64_t sleep_ms = backoff_ms < deadline_ms - now ? backoff_ms : deadline_ms - now;
        struct timespec ts = { .tv_sec = sleep_ms / 1000, .tv_nsec = (sleep_ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
        if (backoff_ms < 200)
            backoff_ms *= 2;
    }
    if (attempts > 0 && refused == attempts)
        return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                           "could not connect to %s at %s before the deadline: all %d attempts "
                           "were refused (Connection refused: nothing listens there; is it "
                           "running, and is the port right?) (MACO_BOOTSTRAP_TIMEOUT sets the "
                           "deadline)",
                           what, text, attempts);
    return maco__error(MACO_ERR_TIMEOUT, MACO_SUBSYS_BOOTSTRAP,
                       "could not connect to %s at %s before the deadline after %d attempt(s) "
                       "(last error: %s); is it running and reachable? (MACO_BOOTSTRAP_TIMEOUT "
                       "sets the deadline)",
                       what, text, attempts, last_err ? strerror(last_err) : "none finished");
}

maco_status_t maco__socket_accept(int listen_fd, int *fd_p, maco__sockaddr_t *peer)
{
    maco__sockaddr_t tmp;
    tmp.len = sizeof(tmp.ss);
    int fd = accept4(listen_fd, (struct sockaddr *)&tmp.ss, &tmp.len, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
            *fd_p = -1;
            return MACO_OK;
        }
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "accept: %s", strerror(errno));
    }
    maco_status_t st = maco__socket_configure(fd);
    if (st != MACO_OK) {
        close(fd);
        return st;
    }
    if (peer != NULL)
        *peer = tmp;
    *fd_p = fd;
    return MACO_OK;
}

maco_status_t maco__socket_local_address(int fd, maco__sockaddr_t *addr)
{
    addr->len = sizeof(addr->ss);
    if (getsockname(fd, (struct sockaddr *)&addr->ss, &addr->len) != 0)
        return maco__error(MACO_ERR_SYSTEM, MACO_SUBSYS_BOOTSTRAP, "getsockname: %s",
                           strerror(errno));
    return MACO_OK;
}
