/*
 * maco-run - starts N local ranks of a MACO program.
 *
 *   maco-run -n N [--timeout S] [--simulate-nodes K] [--mps auto|on|off] [--gpus G] [--]
 *            PROGRAM [ARGS...]
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
 *
 * MPS (several ranks on one GPU): with --mps auto (the default), when this machine has fewer
 * visible GPUs than ranks (and at least one) and nvidia-cuda-mps-control is on PATH,
 * maco-run starts a private MPS control daemon: its pipe and log folders live in a temporary
 * folder maco-run creates (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, passed to the
 * ranks), so it never talks to an MPS server it did not start. An MPS daemon that the ranks'
 * environment already reaches is used as it is and left running. The daemon maco-run started
 * is stopped ("quit") when the job ends, on success, failure, timeout and SIGINT/SIGTERM alike;
 * processes still carrying its pipe folder in their environment 10 s later are killed, and
 * the folder is removed. --mps on starts one whatever the GPU count and fails (exit 1, ranks
 * not started) when it cannot; --mps off never starts one. --gpus G replaces the GPU count
 * maco-run reads from the CUDA driver (cuDeviceGetCount in a child process, so maco-run
 * itself never initialises CUDA).
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
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
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
    fprintf(f, "usage: maco-run -n N [--timeout SECONDS] [--simulate-nodes K] [--mps MODE] "
               "[--gpus G] [--] PROGRAM [ARGS...]\n"
               "  -n N                 number of ranks to start (1..4096)\n"
               "  --timeout SECONDS    kill every rank and exit 124 after this long (default: "
               "none)\n"
               "  --simulate-nodes K   give the ranks K different MACO_HOST_ID values\n"
               "  --mps auto|on|off    start a private MPS daemon so ranks can share GPUs: auto "
               "(default) when\n"
               "                       there are fewer GPUs than ranks, on always, off never\n"
               "  --gpus G             assume G visible GPUs instead of asking the CUDA "
               "driver\n");
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

/* ------------------------------------------------------------------ MPS */

#define MPS_CONTROL "nvidia-cuda-mps-control"

/* GPUs the CUDA driver shows this process (CUDA_VISIBLE_DEVICES applies), counted in a
 * child so that maco-run never initialises CUDA itself; 0 without a driver. */
static int count_gpus(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return 0;
    }
    if (pid == 0) {
        close(fds[0]);
        int count = 0;
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib != NULL) {
            int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
            int (*get_count)(int *) = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
            if (init == NULL || get_count == NULL || init(0) != 0 || get_count(&count) != 0)
                count = 0;
        }
        ssize_t w = write(fds[1], &count, sizeof(count));
        _exit(w == (ssize_t)sizeof(count) ? 0 : 1);
    }
    close(fds[1]);
    int count = 0;
    if (read(fds[0], &count, sizeof(count)) != (ssize_t)sizeof(count))
        count = 0;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    return count;
}

/* True when PROGRAM is an executable file in one of PATH's folders. */
static int on_path(const char *program)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        return 0;
    char dir[4096];
    while (*path != '\0') {
        size_t len = strcspn(path, ":");
        if (len > 0 && len < sizeof(dir) - strlen(program) - 2) {
            snprintf(dir, sizeof(dir), "%.*s/%s", (int)len, path, program);
            if (access(dir, X_OK) == 0)
                return 1;
        }
        path += len + (path[len] == ':');
    }
    return 0;
}

/* Runs nvidia-cuda-mps-control with `args` (NULL-terminated, after the program name) and
 * `input` on its standard input; its output goes to the file `out_path` (appended), or is
 * discarded when NULL (a daemon it forks must not hold maco-run's output open). Returns its
 * exit status, or -1 when it could not run or took longer than `timeout_ms`. */
static int run_mps_control(const char *const *args, const char *input, const char *out_path,
                           int timeout_ms)
{
    int in[2];
    if (pipe2(in, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        int out = out_path != NULL ? open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0600)
                                   : open("/dev/null", O_WRONLY);
        if (out >= 0) {
            dup2(out, 1);
            dup2(out, 2);
            close(out);
        }
        char *argv[8] = { (char *)MPS_CONTROL };
        for (int i = 0; args[i] != NULL && i < 6; i++)
            argv[i + 1] = (char *)args[i];
        execvp(MPS_CONTROL, argv);
        _exit(127);
    }
    close(in[0]);
    if (input != NULL) {
        ssize_t w = write(in[1], input, strlen(input));
        (void)w;
    }
    close(in[1]);
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        int status;
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (w < 0 && errno != EINTR)
            return -1;
        if (now_ms() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        usleep(10000);
    }
}

/* True when an MPS control daemon answers where the ranks' environment points. */
static int mps_reachable(void)
{
    static const char *const none[] = { NULL };
    return run_mps_control(none, "get_server_list\n", NULL, 10000) == 0;
}

typedef struct mps {
    int started;
    char root[256]; /* the temporary folder maco-run owns */
    char pipe_dir[300];
    char log_dir[300];
} mps_t;

/* Removes `dir` and everything in it (the MPS pipe and log folders: files and sockets). */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[1024];
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            struct stat st;
            if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
                remove_tree(path);
            else
                unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Pids of processes (other than maco-run) whose environment holds `entry` exactly
 * ("CUDA_MPS_PIPE_DIRECTORY=<our folder>"): the daemon, its server, and stray clients. */
static int find_processes_with_env(const char *entry, pid_t *pids, int max)
{
    int n = 0;
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return 0;
    struct dirent *e;
    size_t elen = strlen(entry);
    while ((e = readdir(proc)) != NULL && n < max) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == (long)getpid())
            continue;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        static char buf[1 << 16];
        ssize_t got = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (got <= 0)
            continue;
        buf[got] = '\0';
        for (ssize_t i = 0; i < got;) {
            size_t len = strnlen(buf + i, (size_t)(got - i));
            if (len == elen && memcmp(buf + i, entry, elen) == 0) {
                pids[n++] = (pid_t)pid;
                break;
            }
            i += (ssize_t)len + 1;
        }
    }
    closedir(proc);
    return n;
}

/*
 * Starts a private MPS control daemon (the contract is at the top of this file). Returns 0
 * when it answers, -1 (message printed) when it does not; then nothing is left running.
 */
static int mps_start(mps_t *m)
{
    memset(m, 0, sizeof(*m));
    const char *tmp = getenv("TMPDIR");
    snprintf(m->root, sizeof(m->root), "%s/maco-mps-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(m->root) == NULL) {
        fprintf(stderr, "maco-run: MPS: cannot create a folder %s: %s\n", m->root, strerror(errno));
        return -1;
    }
    snprintf(m->pipe_dir, sizeof(m->pipe_dir), "%s/pipe", m->root);
    snprintf(m->log_dir, sizeof(m->log_dir), "%s/log", m->root);
    if (mkdir(m->pipe_dir, 0700) != 0 || mkdir(m->log_dir, 0700) != 0) {
        fprintf(stderr, "maco-run: MPS: cannot create %s/{pipe,log}: %s\n", m->root,
                strerror(errno));
        remove_tree(m->root);
        return -1;
    }
    /* The ranks and every later control command see these. */
    setenv("CUDA_MPS_PIPE_DIRECTORY", m->pipe_dir, 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", m->log_dir, 1);
    static const char *const daemon_args[] = { "-d", NULL };
    char out_path[400];
    snprintf(out_path, sizeof(out_path), "%s/maco-run-start.txt", m->log_dir);
    int rc = run_mps_control(daemon_args, NULL, out_path, 30000);
    m->started = 1; /* from here on, mps_stop cleans up whatever did start */
    int ready = 0;
    if (rc == 0) {
        /* -d returns once the daemon forked; wait (bounded) until it answers. */
        for (int i = 0; i < 50 && !ready; i++) {
            ready = mps_reachable();
            if (!ready)
                usleep(100000);
        }
    }
    if (!ready) {
        fprintf(stderr, "maco-run: MPS: '%s -d' %s (CUDA_MPS_PIPE_DIRECTORY=%s)\n", MPS_CONTROL,
                rc == 0  ? "started, but the daemon did not answer within 5 s"
                : rc < 0 ? "could not run or hung"
                         : "failed",
                m->pipe_dir);
        /* What it said, and its own log, before the folder goes. */
        const char *files[] = { "maco-run-start.txt", "control.log" };
        for (int f = 0; f < 2; f++) {
            char path[400], line[512];
            snprintf(path, sizeof(path), "%s/%s", m->log_dir, files[f]);
            FILE *in = fopen(path, "r");
            for (int k = 0; in != NULL && k < 20 && fgets(line, sizeof(line), in) != NULL; k++)
                fprintf(stderr, "maco-run: MPS %s: %s%s", files[f], line,
                        strchr(line, '\n') ? "" : "\n");
            if (in != NULL)
                fclose(in);
        }
        return -1;
    }
    fprintf(stderr, "maco-run: started a private MPS control daemon (CUDA_MPS_PIPE_DIRECTORY=%s)\n",
            m->pipe_dir);
    return 0;
}

/* Stops the daemon mps_start started, waits for it and its server, removes the folder. */
static void mps_stop(mps_t *m)
{
    if (!m->started)
        return;
    m->started = 0;
    static const char *const none[] = { NULL };
    run_mps_control(none, "quit\n", NULL, 10000);
    char entry[400];
    snprintf(entry, sizeof(entry), "CUDA_MPS_PIPE_DIRECTORY=%s", m->pipe_dir);
    pid_t pids[64];
    int n = 0;
    for (int64_t deadline = now_ms() + 10000; now_ms() < deadline; usleep(50000)) {
        n = find_processes_with_env(entry, pids, 64);
        if (n == 0)
            break;
    }
    for (int i = 0; i < n; i++) {
        fprintf(stderr,
                "maco-run: MPS: process %d of the private daemon is still running 10 s after "
                "'quit'; killing it\n",
                (int)pids[i]);
        kill(pids[i], SIGKILL);
    }
    remove_tree(m->root);
}

/* Starts the ranks and runs the job to its end (the contract at the top of this file). */
static int run_ranks(long nranks, long timeout_s, long sim_nodes, char **prog)
{
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
            execvp(prog[0], prog);
            fprintf(stderr, "maco-run: cannot run %s: %s\n", prog[0], strerror(errno));
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

int main(int argc, char **argv)
{
    long nranks = 0, timeout_s = 0, sim_nodes = 0, gpus = -1;
    const char *mps_mode = "auto";
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
        } else if (strcmp(a, "--mps") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
                fprintf(stderr, "maco-run: --mps '%s' is invalid: use auto, on or off\n", v);
                return 2;
            }
            mps_mode = v;
        } else if (strcmp(a, "--gpus") == 0) {
            if (strcmp(v, "0") == 0)
                gpus = 0;
            else if (parse_positive(v, 4096, &gpus) != 0) {
                fprintf(stderr,
                        "maco-run: --gpus '%s' is invalid: it must be an integer in "
                        "0..4096\n",
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
    /* Installed before MPS starts, so a signal never leaves its daemon behind. */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* MPS: ranks sharing GPUs need one MPS server to run at the same time. All ranks of
     * this machine count, simulated nodes included (they pick GPUs by local rank). */
    mps_t mps;
    memset(&mps, 0, sizeof(mps));
    if (strcmp(mps_mode, "off") != 0 && (strcmp(mps_mode, "on") == 0 || nranks > 1)) {
        int want = strcmp(mps_mode, "on") == 0;
        if (!want) {
            if (gpus < 0)
                gpus = count_gpus();
            want = gpus > 0 && gpus < nranks;
        }
        if (want && !on_path(MPS_CONTROL)) {
            if (strcmp(mps_mode, "on") == 0) {
                fprintf(stderr,
                        "maco-run: --mps on: %s is not on PATH (it comes with the NVIDIA "
                        "driver); no rank was started\n",
                        MPS_CONTROL);
                return 1;
            }
            fprintf(stderr,
                    "maco-run: %ld ranks share %ld GPU(s) and %s is not on PATH: ranks on one "
                    "GPU need MPS, or MACO_SHARED_GPU=1 (slow time slices)\n",
                    nranks, gpus, MPS_CONTROL);
        } else if (want && mps_reachable()) {
            fprintf(stderr, "maco-run: using the MPS control daemon the environment reaches "
                            "(CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps); it is left running\n");
        } else if (want && mps_start(&mps) != 0) {
            mps_stop(&mps);
            fprintf(stderr, "maco-run: MPS could not be started; no rank was started%s\n",
                    strcmp(mps_mode, "on") == 0 ? "" : " (--mps off runs without it)");
            return 1;
        }
    }
    int rc = run_ranks(nranks, timeout_s, sim_nodes, argv + argi);
    mps_stop(&mps);
    return rc;
}
