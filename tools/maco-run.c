/*
 * maco-run - starts N local ranks of a MACO program.
 *
 *   maco-run -n N [--timeout S] [--simulate-nodes K] [--] PROGRAM [ARGS...]
 *
 * Each rank runs PROGRAM in its own process group with MACO_RANK, MACO_WORLD_SIZE,
 * MACO_LOCAL_RANK, MACO_BOOTSTRAP_ADDR (127.0.0.1 and a free port) and MACO_BOOTSTRAP_NONCE
 * set; with --simulate-nodes K the ranks are split into K blocks with distinct
 * MACO_HOST_ID values, so multi-node code paths run on one machine. Every line a rank
 * writes is prefixed with "[rank] " (stdout to stdout, stderr to stderr).
 *
 * Exit status: 0 when every rank exits 0; otherwise the first failing rank's exit status
 * (128 + signal number if it was killed), after the remaining ranks' process groups are
 * sent SIGTERM and, 3 s later, SIGKILL. When --timeout S passes, all ranks are killed the
 * same way and maco-run exits 124. SIGINT and SIGTERM sent to maco-run are forwarded to
 * every rank's process group.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_LINE = 65536 };

typedef struct stream {
    int fd;
    int out_fd; /* 1 or 2 */
    char *buf;
    size_t len;
} stream_t;

typedef struct rank_proc {
    pid_t pid;
    int running;
    int status;
    stream_t streams[2];
} rank_proc_t;

static volatile sig_atomic_t g_forward_signal;

static void on_signal(int sig)
{
    g_forward_signal = sig;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: maco-run -n N [--timeout SECONDS] [--simulate-nodes K] [--] PROGRAM "
               "[ARGS...]\n"
               "  -n N                 number of ranks to start (1..4096)\n"
               "  --timeout SECONDS    kill every rank and exit 124 after this long (default: "
               "none)\n"
               "  --simulate-nodes K   give the ranks K different MACO_HOST_ID values\n");
}

static int parse_positive(const char *text, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < 1 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A free TCP port on 127.0.0.1 (bound then released; rank 0 binds it again at once). */
static int pick_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* Writes complete lines of a stream with the rank prefix; `flush` writes a partial tail. */
static void emit_lines(stream_t *s, int rank, int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n')
            continue;
        dprintf(s->out_fd, "[%d] %.*s\n", rank, (int)(i - start), s->buf + start);
        start = i + 1;
    }
    if (flush && start < s->len) {
        dprintf(s->out_fd, "[%d] %.*s\n", rank, (int)(s->len - start), s->buf + start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (s->len == MAX_LINE) { /* an over-long line: emit it in pieces */
        dprintf(s->out_fd, "[%d] %.*s\n", rank, (int)s->len, s->buf);
        s->len = 0;
    }
}

static void kill_all(rank_proc_t *ranks, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (ranks[r].running)
            kill(-ranks[r].pid, sig);
}

int main(int argc, char **argv)
{
    long nranks = 0, timeout_s = 0, sim_nodes = 0;
    int argi = 1;
    while (argi < argc) {
        const char *a = argv[argi];
        if (strcmp(a, "--") == 0) {
            argi++;
            break;
        }
        if (a[0] != '-')
            break;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (argi + 1 >= argc) {
            fprintf(stderr, "maco-run: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[argi + 1];
        if (strcmp(a, "-n") == 0 || strcmp(a, "--np") == 0) {
            if (parse_positive(v, 4096, &nranks) != 0) {
                fprintf(stderr, "maco-run: -n '%s' is invalid: it must be an integer in 1..4096\n",
                        v);
                return 2;
            }
        } else if (strcmp(a, "--timeout") == 0) {
            if (parse_positive(v, 86400 * 7, &timeout_s) != 0) {
                fprintf(stderr,
                        "maco-run: --timeout '%s' is invalid: it must be a number of seconds in "
                        "1..604800\n",
                        v);
                return 2;
            }
        } else if (strcmp(a, "--simulate-nodes") == 0) {
            if (parse_positive(v, 4096, &sim_nodes) != 0) {
                fprintf(stderr,
                        "maco-run: --simulate-nodes '%s' is invalid: it must be an integer "
                        ">= 1\n",
                        v);
                return 2;
            }
        } else {
            fprintf(stderr, "maco-run: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        argi += 2;
    }
    if (nranks == 0 || argi >= argc) {
        fprintf(stderr, "maco-run: %s\n", nranks == 0 ? "-n N is required" : "no PROGRAM given");
        usage(stderr);
        return 2;
    }
    if (sim_nodes > nranks) {
        fprintf(stderr, "maco-run: --simulate-nodes %ld is more than -n %ld\n", sim_nodes, nranks);
        return 2;
    }
    int port = pick_port();
    if (port < 0) {
        fprintf(stderr, "maco-run: cannot find a free TCP port on 127.0.0.1: %s\n",
                strerror(errno));
        return 1;
    }
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce))
        nonce = (uint64_t)now_ms() ^ ((uint64_t)getpid() << 32);
    char addr[64], nonce_text[32], nranks_text[16];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    snprintf(nonce_text, sizeof(nonce_text), "%016llx", (unsigned long long)nonce);
    snprintf(nranks_text, sizeof(nranks_text), "%ld", nranks);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    rank_proc_t *ranks = calloc((size_t)nranks, sizeof(*ranks));
    if (ranks == NULL) {
        fprintf(stderr, "maco-run: out of memory\n");
        return 1;
    }
    long per_node = sim_nodes > 0 ? (nranks + sim_nodes - 1) / sim_nodes : nranks;
    int exit_code = 0;
    int first_failure = -1;
    for (long r = 0; r < nranks; r++) {
        int out_pipe[2], err_pipe[2];
        if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
            fprintf(stderr, "maco-run: pipe: %s\n", strerror(errno));
            kill_all(ranks, (int)r, SIGKILL);
            return 1;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "maco-run: fork: %s\n", strerror(errno));
            kill_all(ranks, (int)r, SIGKILL);
            return 1;
        }
        if (pid == 0) {
            setpgid(0, 0);
            signal(SIGPIPE, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            dup2(out_pipe[1], 1);
            dup2(err_pipe[1], 2);
            char rank_text[24], local_text[24], host_text[96];
            snprintf(rank_text, sizeof(rank_text), "%ld", r);
            snprintf(local_text, sizeof(local_text), "%ld", r % per_node);
            setenv("MACO_RANK", rank_text, 1);
            setenv("MACO_WORLD_SIZE", nranks_text, 1);
            setenv("MACO_LOCAL_RANK", local_text, 1);
            setenv("MACO_BOOTSTRAP_ADDR", addr, 1);
            setenv("MACO_BOOTSTRAP_NONCE", nonce_text, 1);
            if (sim_nodes > 0) {
                char host[48] = "localhost";
                gethostname(host, sizeof(host));
                host[sizeof(host) - 1] = '\0';
                snprintf(host_text, sizeof(host_text), "%s/simulated-node-%ld", host, r / per_node);
                setenv("MACO_HOST_ID", host_text, 1);
            }
            execvp(argv[argi], argv + argi);
            fprintf(stderr, "maco-run: cannot run %s: %s\n", argv[argi], strerror(errno));
            _exit(127);
        }
        setpgid(pid, pid); /* also here, so kill(-pid) works even before the child runs */
        close(out_pipe[1]);
        close(err_pipe[1]);
        ranks[r].pid = pid;
        ranks[r].running = 1;
        ranks[r].streams[0] = (stream_t){ out_pipe[0], 1, malloc(MAX_LINE), 0 };
        ranks[r].streams[1] = (stream_t){ err_pipe[0], 2, malloc(MAX_LINE), 0 };
        if (ranks[r].streams[0].buf == NULL || ranks[r].streams[1].buf == NULL) {
            fprintf(stderr, "maco-run: out of memory\n");
            kill_all(ranks, (int)r + 1, SIGKILL);
            return 1;
        }
    }

    struct pollfd *pfds = calloc((size_t)nranks * 2, sizeof(*pfds));
    int *owner = calloc((size_t)nranks * 2, sizeof(int));
    int64_t deadline = timeout_s > 0 ? now_ms() + timeout_s * 1000 : INT64_MAX;
    int64_t kill_at = INT64_MAX; /* when SIGTERM'd ranks get SIGKILL */
    int open_streams = (int)nranks * 2, running = (int)nranks;
    int timed_out = 0;
    int64_t all_exited_at = INT64_MAX;
    while (open_streams > 0 || running > 0) {
        if (g_forward_signal) {
            int sig = g_forward_signal;
            g_forward_signal = 0;
            fprintf(stderr, "maco-run: forwarding signal %d to all ranks\n", sig);
            kill_all(ranks, (int)nranks, sig);
            if (exit_code == 0)
                exit_code = 128 + sig;
            if (kill_at == INT64_MAX)
                kill_at = now_ms() + 3000;
        }
        if (!timed_out && now_ms() >= deadline) {
            timed_out = 1;
            fprintf(stderr, "maco-run: timeout of %ld s passed; killing all ranks\n", timeout_s);
            kill_all(ranks, (int)nranks, SIGTERM);
            exit_code = 124;
            kill_at = now_ms() + 3000;
        }
        if (now_ms() >= kill_at) {
            kill_all(ranks, (int)nranks, SIGKILL);
            kill_at = INT64_MAX - 1;
        }
        int np = 0;
        for (int r = 0; r < nranks; r++) {
            for (int k = 0; k < 2; k++) {
                if (ranks[r].streams[k].fd >= 0) {
                    pfds[np].fd = ranks[r].streams[k].fd;
                    pfds[np].events = POLLIN;
                    pfds[np].revents = 0;
                    owner[np++] = r * 2 + k;
                }
            }
        }
        int rc = poll(pfds, (nfds_t)np, np > 0 ? 100 : 50);
        if (np == 0 && rc == 0)
            usleep(20000);
        for (int i = 0; i < np && rc > 0; i++) {
            if (pfds[i].revents == 0)
                continue;
            int r = owner[i] / 2;
            stream_t *s = &ranks[r].streams[owner[i] % 2];
            ssize_t got = read(s->fd, s->buf + s->len, MAX_LINE - s->len);
            if (got > 0) {
                s->len += (size_t)got;
                emit_lines(s, r, 0);
            } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
                emit_lines(s, r, 1);
                close(s->fd);
                s->fd = -1;
                open_streams--;
            }
        }
        for (int r = 0; r < nranks; r++) {
            if (!ranks[r].running)
                continue;
            int status;
            pid_t w = waitpid(ranks[r].pid, &status, WNOHANG);
            if (w != ranks[r].pid)
                continue;
            ranks[r].running = 0;
            ranks[r].status = status;
            running--;
            /* Reap any grandchildren the rank left in its group. */
            kill(-ranks[r].pid, SIGKILL);
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (code != 0 && first_failure < 0 && !timed_out && exit_code == 0) {
                first_failure = r;
                exit_code = code;
                if (WIFEXITED(status))
                    fprintf(stderr,
                            "maco-run: rank %d exited with status %d; stopping the "
                            "other ranks\n",
                            r, code);
                else
                    fprintf(stderr,
                            "maco-run: rank %d was killed by signal %d (%s); stopping "
                            "the other ranks\n",
                            r, WTERMSIG(status), strsignal(WTERMSIG(status)));
                kill_all(ranks, (int)nranks, SIGTERM);
                kill_at = now_ms() + 3000;
            }
        }
        /* Streams of a rank whose group is gone can stay open only through descendants
         * that left the group; stop reading them 3 s after the last rank exited. */
        if (running == 0 && all_exited_at == INT64_MAX)
            all_exited_at = now_ms();
        if (running == 0 && open_streams > 0 && now_ms() - all_exited_at > 3000) {
            for (int r = 0; r < nranks; r++)
                for (int k = 0; k < 2; k++)
                    if (ranks[r].streams[k].fd >= 0) {
                        emit_lines(&ranks[r].streams[k], r, 1);
                        close(ranks[r].streams[k].fd);
                        ranks[r].streams[k].fd = -1;
                        open_streams--;
                    }
        }
    }
    for (int r = 0; r < nranks; r++) {
        free(ranks[r].streams[0].buf);
        free(ranks[r].streams[1].buf);
    }
    free(ranks);
    free(pfds);
    free(owner);
    return exit_code;
}
