/* parse.c - the text parsers of configuration values (integers, sizes, durations, booleans,
 * the job nonce, host:port addresses), shared by config.c's checks and the readers. */
#include "src/host/base/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

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

int maco__parse_nonce(const char *text, uint64_t *nonce_p)
{
    uint64_t v = 0;
    size_t n = 0;
    for (; text[n] != '\0'; n++) {
        char c = text[n];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0 || n == 16)
            return -1;
        v = v << 4 | (uint64_t)d;
    }
    if (n == 0)
        return -1;
    *nonce_p = v;
    return 0;
}

int maco__parse_address(const char *text, struct sockaddr_storage *ss, unsigned *len_p, char *why,
                        size_t cap)
{
    char host[256];
    const char *port_text;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':' || (size_t)(close - text - 1) >= sizeof(host)) {
            snprintf(why, cap, "expected [ipv6]:port");
            return -1;
        }
        memcpy(host, text + 1, (size_t)(close - text - 1));
        host[close - text - 1] = '\0';
        port_text = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (colon == NULL || (size_t)(colon - text) >= sizeof(host) || colon == text) {
            snprintf(why, cap, "expected host:port");
            return -1;
        }
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port_text = colon + 1;
    }
    int64_t port;
    if (maco__parse_int(port_text, &port) != 0 || port < 1 || port > 65535) {
        snprintf(why, cap, "the port must be 1..65535");
        return -1;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || res == NULL || res->ai_addrlen > sizeof(*ss) ||
        (res->ai_family != AF_INET && res->ai_family != AF_INET6)) {
        snprintf(why, cap, "cannot resolve host '%s': %s", host,
                 rc != 0 ? gai_strerror(rc) : "no IPv4 or IPv6 address");
        if (res != NULL)
            freeaddrinfo(res);
        return -1;
    }
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = (unsigned)res->ai_addrlen;
    freeaddrinfo(res);
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    return 0;
}
