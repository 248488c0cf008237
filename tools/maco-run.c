/*
 * maco-run - starts N local ranks of a MACO program.
 *
 *   maco-run -n N [--timeout S] [--simulate-nodes K] [--mps auto|on|off] [--gpus G] [--]
 *            PROGRAM [ARGS...]
 *
 * Each rank runs PROGRAM in its own process group with MACO_RANK, MACO_WORLD_SIZE,
 * MACO_LOCAL_RANK, MACO_BOOTSTRAP_ADDR (127.0.0.1 and a free port) and MACO_BOOTSTRAP_NONCE
 * set (an address on one machine: an enclosing launcher's variables, as those of an
 * interactive srun step, are then not read); with --simulate-nodes
 * K the ranks are split into K blocks with distinct MACO_HOST_ID values, so multi-node code paths
 * run on one machine. Every line a rank writes is prefixed with "[rank] " (stdout to stdout, stderr
 * to stderr).
 *
 * Exit status: 0 when every rank exits 0; otherwise the first failing rank's exit status
 * (128 + signal number if it was killed), after the remaining ranks' process groups are
 * sent SIGTERM and, 3 s later, SIGKILL. A rank that exits 77 skipped (MACO's programs do so
 * without a usable GPU, after saying why): it ends the job the same way, so maco-run exits 77
 * when that rank was the first to end with a status other than 0. When --timeout S passes, all
 * ranks are killed the same way and maco-run exits 124. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to
 * maco-run are forwarded to every rank's process group (then SIGKILL 3 s later, as above); maco-run
 * exits 128 + that signal.
 *
 * When maco-run itself dies without ending the job (SIGKILL, a crash, or `kill -9 -- -PGID` of
 * its whole process group): a watchdog process it forks before the ranks (in a process group
 * of its own, so that a signal to maco-run's group does not reach it, ignoring SIGINT,
 * SIGTERM, SIGHUP and SIGQUIT) holds the read end of a pipe only maco-run writes to, and learns
 * each rank's process group through it. When the pipe closes without maco-run's "job ended"
 * record, the watchdog sends SIGTERM (and SIGCONT) to every rank's process group, SIGKILL 2 s
 * later to the groups still there, says so on stderr and exits. Descendants that left their
 * rank's process group (setsid) are out of its reach; the private MPS daemon below too. Should
 * the watchdog itself die while the job runs, maco-run says so and starts another, which is
 * told every running rank's group. And every rank gets SIGTERM from the kernel when maco-run
 * dies (PR_SET_PDEATHSIG; maco-run forks the ranks from its only thread, so the "parent" whose
 * death it watches is maco-run itself), should the watchdog be gone too.
 *
 * Leftover processes: maco-run is a child subreaper (PR_SET_CHILD_SUBREAPER), so descendants
 * of the ranks whose parents exit are reparented to it, even those that left the ranks'
 * process groups (setsid). Output the ranks' streams still carry is read for 3 s after the
 * last rank exited. Then, however the job ended (success, a failing rank, timeout,
 * a forwarded signal, a rank that could not be started), every remaining descendant of maco-run,
 * found through the parent pids in /proc/PID/stat, gets SIGTERM and, 2 s later, SIGKILL, and
 * is reaped; maco-run prints how many it ended. The private MPS daemon below and what it
 * started are left to mps_stop: they hold its CUDA_MPS_PIPE_DIRECTORY but not this job's
 * MACO_BOOTSTRAP_NONCE, which every rank and its descendants inherit.
 *
 * Descriptors: maco-run holds two pipes per rank, so it raises its soft RLIMIT_NOFILE to the
 * hard limit (the ranks are started with the limits maco-run was given). When even the hard
 * limit is below about 2 per rank plus a margin, it exits 1 before starting anything, naming
 * the number needed and the limit.
 *
 * Simulated nodes and GPUs: with K simulated nodes and G >= K visible GPUs, node k's ranks get
 * GPUs k * G/K .. (k + 1) * G/K - 1 through CUDA_VISIBLE_DEVICES (entries of the list maco-run
 * was given, else ordinals), so each node has GPUs of its own as real nodes do; with G < K
 * every node's ranks pick from all GPUs by local rank and the nodes share them.
 *
 * MPS (several ranks on one GPU): with --mps auto (the default), when ranks share GPUs (fewer
 * visible GPUs than ranks per node, fewer GPUs per simulated node than its ranks, or fewer GPUs
 * than simulated nodes), and at least one GPU, and nvidia-cuda-mps-control is on PATH,
 * maco-run starts a private MPS control daemon: its pipe and log folders live in a temporary
 * folder maco-run creates (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, passed to the
 * ranks), so it never talks to an MPS server it did not start. An MPS daemon that the ranks'
 * environment already reaches is used as it is and left running. The daemon maco-run started
 * is stopped ("quit") when the job ends, on success, failure, timeout and a forwarded signal alike;
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
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_LINE = 65536 };
/* The exit status of a rank that skipped (docs/tools.md, "Exit statuses"). */
enum { RUN_EXIT_SKIPPED = 77 };

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

/* The watchdog (see the top of this file): its pid, and the write end of its pipe; -1 when
 * none runs. */
static pid_t g_watchdog_pid = -1;
static int g_watchdog_fd = -1;

/* The descriptor limit maco-run was started with; the ranks and the MPS daemon get it back
 * before exec (raise_fd_limit raised maco-run's own soft limit). */
static struct rlimit g_nofile_at_start;
static int g_nofile_saved;

static void restore_fd_limit(void)
{
    if (g_nofile_saved)
        setrlimit(RLIMIT_NOFILE, &g_nofile_at_start);
}

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
               "  --simulate-nodes K   give the ranks K different MACO_HOST_ID values and, with at "
               "least K GPUs,\n"
               "                       each node GPUs of its own (CUDA_VISIBLE_DEVICES)\n"
               "  --mps auto|on|off    start a private MPS daemon so ranks can share GPUs: auto "
               "(default) when\n"
               "                       there are fewer GPUs than ranks, on always, off never\n"
               "  --gpus G             assume G visible GPUs instead of asking the CUDA "
               "driver\n"
               "When the job ends, every process the ranks left behind (in their process "
               "groups or not) gets\nSIGTERM, then SIGKILL 2 s later.\n");
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
/* Writes all of buf[0, len) to `fd`: a signal (maco-run forwards some) or a short write into a
 * full pipe does not cut the line; what is left is written again. */
static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w > 0) {
            buf += w;
            len -= (size_t)w;
        } else if (w == 0 || errno != EINTR) {
            return; /* the reader is gone: nothing better to do */
        }
    }
}

/* Writes "[rank] " text "\n" (one write when it fits, so lines of ranks do not mix). */
static void emit_line(int fd, int rank, const char *text, size_t len)
{
    char line[MAX_LINE + 32];
    int n = snprintf(line, sizeof(line), "[%d] ", rank);
    if (n < 0)
        return;
    if (len > sizeof(line) - (size_t)n - 1)
        len = sizeof(line) - (size_t)n - 1;
    memcpy(line + n, text, len);
    line[(size_t)n + len] = '\n';
    write_all(fd, line, (size_t)n + len + 1);
}

static void emit_lines(stream_t *s, int rank, int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n')
            continue;
        emit_line(s->out_fd, rank, s->buf + start, i - start);
        start = i + 1;
    }
    if (flush && start < s->len) {
        emit_line(s->out_fd, rank, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (s->len == MAX_LINE) { /* an over-long line: emit it in pieces */
        emit_line(s->out_fd, rank, s->buf, s->len);
        s->len = 0;
    }
}

static void kill_all(rank_proc_t *ranks, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (ranks[r].running)
            kill(-ranks[r].pid, sig);
}

/* Reaps every child of maco-run that has exited: descendants reparented to it (a child
 * subreaper) and the MPS daemon's processes; supervise reaps the ranks itself. */
static void reap_exited(void)
{
    pid_t w;
    while ((w = waitpid(-1, NULL, WNOHANG)) > 0) {
        if (w == g_watchdog_pid) { /* reaped: its pid may be reused, never signal it again */
            close(g_watchdog_fd);
            g_watchdog_fd = -1;
            g_watchdog_pid = -1;
        }
    }
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
    ssize_t got;
    while ((got = read(fds[0], &count, sizeof(count))) < 0 && errno == EINTR)
        ;
    if (got != (ssize_t)sizeof(count))
        count = 0;
    close(fds[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
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
        restore_fd_limit();
        dup2(in[0], 0);
        int out = out_path != NULL ? open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0600)
                                   : open("/dev/null", O_WRONLY);
        if (out >= 0) {
            dup2(out, 1);
            dup2(out, 2);
            close(out);
        }
        char *argv[8] = { (char *)MPS_CONTROL };
        for (int i = 0; i < 6 && args[i] != NULL; i++)
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
        /* cppcheck-suppress readdirCalled ; one thread per stream (readdir_r: deprecated) */
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

/* True when the environment of process `pid` holds `entry` ("NAME=value") exactly; false
 * when it does not, or cannot be read (a zombie's, another user's). */
static int environ_has(pid_t pid, const char *entry)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    static char buf[1 << 16];
    ssize_t got = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (got <= 0)
        return 0;
    buf[got] = '\0';
    size_t elen = strlen(entry);
    for (ssize_t i = 0; i < got;) {
        size_t len = strnlen(buf + i, (size_t)(got - i));
        if (len == elen && memcmp(buf + i, entry, elen) == 0)
            return 1;
        i += (ssize_t)len + 1;
    }
    return 0;
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
    /* cppcheck-suppress readdirCalled ; one thread per stream (readdir_r: deprecated) */
    while ((e = readdir(proc)) != NULL && n < max) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == (long)getpid())
            continue;
        if (environ_has((pid_t)pid, entry))
            pids[n++] = (pid_t)pid;
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
        reap_exited(); /* its processes may be maco-run's children (a subreaper) */
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

/* ------------------------------------------------------------------ leftover processes */

typedef struct proc_entry {
    pid_t pid;
    pid_t ppid;
    char state; /* from /proc/PID/stat: R, S, D, T, Z (zombie), ... */
    int kind;   /* KIND_*, filled by classify */
} proc_entry_t;

enum {
    KIND_UNKNOWN = 0,
    KIND_JOB,   /* a descendant of maco-run that the sweep ends */
    KIND_MPS,   /* the private MPS daemon or one of its descendants: mps_stop stops those */
    KIND_OTHER, /* not a descendant of maco-run */
};

static int compare_pid(const void *a, const void *b)
{
    pid_t x = ((const proc_entry_t *)a)->pid, y = ((const proc_entry_t *)b)->pid;
    return (x > y) - (x < y);
}

/* Reads pid, state and parent pid of every process from /proc/PID/stat into *table_p
 * (sorted by pid, malloc'd, the caller frees it). Returns the count (0 when /proc cannot be
 * read). Processes that end meanwhile are simply missing. */
static int read_process_table(proc_entry_t **table_p)
{
    *table_p = NULL;
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return 0;
    proc_entry_t *t = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    /* cppcheck-suppress readdirCalled ; one thread per stream (readdir_r: deprecated) */
    while ((e = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0)
            continue;
        char path[64], buf[1024];
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t got = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (got <= 0)
            continue;
        buf[got] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces and ')', so the last ')' ends it. */
        char *close_paren = strrchr(buf, ')');
        char state;
        int ppid;
        if (close_paren == NULL || sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2)
            continue;
        if (n == cap) {
            int grown = cap > 0 ? cap * 2 : 256;
            proc_entry_t *bigger = realloc(t, (size_t)grown * sizeof(*t));
            if (bigger == NULL)
                break;
            t = bigger;
            cap = grown;
        }
        t[n++] = (proc_entry_t){ (pid_t)pid, (pid_t)ppid, state, KIND_UNKNOWN };
    }
    closedir(proc);
    if (n > 0)
        qsort(t, (size_t)n, sizeof(*t), compare_pid);
    *table_p = t;
    return n;
}

/*
 * Which processes the sweep ends: descendants of maco-run (parent pids lead back to it),
 * except the private MPS daemon maco-run started and whatever it started (its server). The
 * daemon is told apart by its environment: it holds `mps_entry`
 * ("CUDA_MPS_PIPE_DIRECTORY=<our folder>") but not `nonce_entry` ("MACO_BOOTSTRAP_NONCE=<this
 * job's nonce>"); the ranks and their descendants inherit both, so they are not mistaken for
 * it. `mps_entry` is NULL when maco-run started no daemon. Memoized in t[i].kind; `depth`
 * bounds the walk where a snapshot taken while processes come and go holds a cycle.
 */
static int classify(proc_entry_t *t, int n, int i, int depth, const char *mps_entry,
                    const char *nonce_entry)
{
    if (t[i].kind != KIND_UNKNOWN)
        return t[i].kind;
    int kind = KIND_OTHER;
    if (t[i].pid == g_watchdog_pid) {
        kind = KIND_OTHER; /* it ends when maco-run tells it to (watchdog_stop) */
    } else if (t[i].ppid == getpid()) {
        kind = KIND_JOB;
    } else if (depth < 4096) {
        proc_entry_t key = { .pid = t[i].ppid };
        proc_entry_t *parent = bsearch(&key, t, (size_t)n, sizeof(*t), compare_pid);
        if (parent != NULL)
            kind = classify(t, n, (int)(parent - t), depth + 1, mps_entry, nonce_entry);
    }
    if (kind == KIND_JOB && mps_entry != NULL && environ_has(t[i].pid, mps_entry) &&
        !environ_has(t[i].pid, nonce_entry))
        kind = KIND_MPS;
    t[i].kind = kind;
    return kind;
}

/* True when `pid` is one of the `n` pids in `pids`. */
static int pid_in(const pid_t *pids, size_t n, pid_t pid)
{
    for (size_t i = 0; i < n; i++)
        if (pids[i] == pid)
            return 1;
    return 0;
}

/*
 * Ends every process the job left behind (see classify for which), before mps_stop: maco-run
 * is a child subreaper, so descendants that left the ranks' process groups (setsid) and lost
 * their parents are reparented to it and still found. Each gets SIGTERM (and SIGCONT, should
 * it be stopped); those still running 2 s later get SIGKILL; all are reaped. Gives up, saying
 * so, 4 s after it began. Prints how many processes it ended, ranks not counted (they have
 * normally been reaped by then).
 */
static void end_leftovers(const rank_proc_t *ranks, long nranks, const char *mps_entry,
                          const char *nonce_entry)
{
    pid_t *ended = NULL;
    size_t n_ended = 0, cap = 0;
    int64_t kill_at = now_ms() + 2000, give_up_at = kill_at + 2000;
    for (;;) {
        reap_exited();
        proc_entry_t *t;
        int n = read_process_table(&t);
        int left = 0;
        int64_t now = now_ms();
        for (int i = 0; i < n; i++) {
            if (classify(t, n, i, 0, mps_entry, nonce_entry) != KIND_JOB)
                continue;
            left++; /* a zombie too: it goes once its parent (maco-run in the end) reaps it */
            if (t[i].state == 'Z')
                continue;
            int known = pid_in(ended, n_ended, t[i].pid);
            if (now < kill_at && known)
                continue;
            int sig = now >= kill_at ? SIGKILL : SIGTERM;
            if (kill(t[i].pid, sig) != 0)
                continue;
            if (sig == SIGTERM)
                kill(t[i].pid, SIGCONT);
            if (!known) {
                if (n_ended == cap) {
                    size_t grown = cap > 0 ? cap * 2 : 16;
                    pid_t *bigger = realloc(ended, grown * sizeof(*ended));
                    if (bigger == NULL)
                        continue;
                    ended = bigger;
                    cap = grown;
                }
                ended[n_ended++] = t[i].pid;
            }
        }
        free(t);
        if (left == 0)
            break;
        if (now >= give_up_at) {
            fprintf(stderr,
                    "maco-run: %d process(es) the ranks left behind did not end within 4 s "
                    "(SIGKILL sent)\n",
                    left);
            break;
        }
        usleep(20000);
    }
    int strays = 0;
    for (size_t i = 0; i < n_ended; i++) {
        int is_rank = 0;
        for (long r = 0; r < nranks && !is_rank; r++)
            is_rank = ranks[r].pid == ended[i];
        strays += !is_rank;
    }
    if (strays > 0)
        fprintf(stderr, "maco-run: ended %d process(es) the ranks left behind\n", strays);
    free(ended);
}

/* ------------------------------------------------------------------ descriptors */

/* Descriptors open in maco-run besides 0, 1 and 2: inherited ones use up the limit too. */
static long count_extra_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0;
    long n = 0;
    struct dirent *e;
    /* cppcheck-suppress readdirCalled ; one thread per stream (readdir_r: deprecated) */
    while ((e = readdir(d)) != NULL) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (e->d_name[0] != '\0' && *end == '\0' && fd > 2 && fd != dirfd(d))
            n++;
    }
    closedir(d);
    return n;
}

/*
 * maco-run holds two pipes per rank (its stdout and stderr) for the whole job. Raises the
 * soft RLIMIT_NOFILE to the hard limit (the ranks get the limit back: restore_fd_limit) and
 * returns 0; returns -1, message printed, when even the hard limit is too low for `nranks`.
 */
static int raise_fd_limit(long nranks)
{
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0)
        return 0; /* cannot tell: pipe() says so if descriptors run out */
    g_nofile_at_start = lim;
    g_nofile_saved = 1;
    /* 2 per rank, those open already, and a margin: the port probe, MPS control pipes, /proc. */
    long need = 2 * nranks + 10 + count_extra_fds();
    if (lim.rlim_cur != lim.rlim_max) {
        struct rlimit raised = { lim.rlim_max, lim.rlim_max };
        /* RLIM_INFINITY is above fs.nr_open, which setrlimit refuses: then ask for `need`. */
        if (setrlimit(RLIMIT_NOFILE, &raised) != 0 && lim.rlim_cur < (rlim_t)need &&
            lim.rlim_max >= (rlim_t)need)
            raised.rlim_cur = (rlim_t)need;
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            lim = raised;
    }
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < (rlim_t)need) {
        fprintf(stderr,
                "maco-run: -n %ld needs about %ld file descriptors but the limit is %llu "
                "(ulimit -n); no rank was started\n",
                nranks, need, (unsigned long long)lim.rlim_cur);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ the job */

static void watchdog_replace(const rank_proc_t *ranks, long nranks, int status);

/*
 * Runs the started job to its end: passes the ranks' output on, reaps them, stops them all
 * when one fails, on timeout and on a forwarded signal (the contract at the top of this file).
 * `pfds` and `owner` have room for two entries per rank. Returns maco-run's exit status.
 */
static int supervise(rank_proc_t *ranks, long nranks, long timeout_s, struct pollfd *pfds,
                     int *owner)
{
    int exit_code = 0;
    int first_failure = -1;
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
        /* Any child: a rank, or a descendant reparented to maco-run (a subreaper) that
         * ended, which is only reaped here so that zombies do not pile up. */
        for (;;) {
            int status;
            pid_t w = waitpid(-1, &status, WNOHANG);
            if (w <= 0)
                break;
            if (w == g_watchdog_pid) {
                watchdog_replace(ranks, nranks, status);
                continue;
            }
            int r = 0;
            while (r < nranks && ranks[r].pid != w)
                r++;
            if (r == nranks || !ranks[r].running)
                continue;
            ranks[r].running = 0;
            ranks[r].status = status;
            running--;
            /* End whatever the rank left in its group (end_leftovers finds the rest). */
            kill(-ranks[r].pid, SIGKILL);
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (code != 0 && first_failure < 0 && !timed_out && exit_code == 0) {
                first_failure = r;
                exit_code = code;
                if (WIFEXITED(status) && code == RUN_EXIT_SKIPPED)
                    fprintf(stderr,
                            "maco-run: rank %d skipped (exit status %d: it printed why); "
                            "stopping the other ranks\n",
                            r, code);
                else if (WIFEXITED(status))
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
    return exit_code;
}

/* Starts the ranks and runs the job to its end (the contract at the top of this file);
 * `mps_pipe_dir` is the private MPS daemon's pipe folder, NULL when maco-run started none. */
/* Simulated node `node`'s share of the GPUs: `per` of the visible ones from node * per on, as
 * a CUDA_VISIBLE_DEVICES value in `out` (entries of an existing CUDA_VISIBLE_DEVICES list, else
 * ordinals). Returns -1 when that list has too few entries (the variable is then left alone). */
static int node_gpu_list(long node, long per, char *out, size_t cap)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    size_t len = 0;
    out[0] = '\0';
    for (long i = node * per; i < (node + 1) * per; i++) {
        char item[128];
        if (vis != NULL) {
            const char *p = vis;
            for (long k = 0; k < i && p != NULL; k++) {
                p = strchr(p, ',');
                p = p != NULL ? p + 1 : NULL;
            }
            if (p == NULL || *p == '\0' || *p == ',')
                return -1;
            size_t n = strcspn(p, ",");
            if (n >= sizeof(item))
                return -1;
            memcpy(item, p, n);
            item[n] = '\0';
        } else {
            snprintf(item, sizeof(item), "%ld", i);
        }
        int w = snprintf(out + len, cap - len, "%s%s", len ? "," : "", item);
        if (w < 0 || (size_t)w >= cap - len)
            return -1;
        len += (size_t)w;
    }
    return 0;
}

/* ------------------------------------------------------------------ the watchdog */

/* The watchdog's loop (in the child): records are process group ids, 0 means the job ended. */
static void watchdog_main(int fd)
{
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    pid_t parent = getppid();
    pid_t *groups = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        int32_t rec;
        ssize_t got = read(fd, &rec, sizeof(rec));
        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)sizeof(rec))
            break; /* maco-run is gone (a record is written whole: 4 bytes < PIPE_BUF) */
        if (rec == 0)
            _exit(0);
        if (n == cap) {
            size_t grown = cap > 0 ? cap * 2 : 64;
            pid_t *bigger = realloc(groups, grown * sizeof(*groups));
            if (bigger == NULL)
                continue; /* that group goes unwatched; nothing better to do here */
            groups = bigger;
            cap = grown;
        }
        groups[n++] = (pid_t)rec;
    }
    if (n == 0)
        _exit(0);
    fprintf(stderr,
            "maco-run: the launcher (pid %d) died without ending its job; its watchdog sends "
            "SIGTERM to the %zu rank process group(s), SIGKILL 2 s later\n",
            (int)parent, n);
    for (size_t i = 0; i < n; i++) {
        kill(-groups[i], SIGTERM);
        kill(-groups[i], SIGCONT);
    }
    for (int tick = 0; tick < 100; tick++) { /* 2 s, or until every group is gone */
        int left = 0;
        for (size_t i = 0; i < n; i++)
            left += kill(-groups[i], 0) == 0;
        if (left == 0)
            _exit(0);
        usleep(20000);
    }
    for (size_t i = 0; i < n; i++)
        kill(-groups[i], SIGKILL);
    _exit(0);
}

/* Starts the watchdog; without one (pipe or fork failed) the job runs unwatched, said once. */
static void watchdog_start(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        fprintf(stderr, "maco-run: no watchdog (pipe: %s): ranks may outlive a killed maco-run\n",
                strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "maco-run: no watchdog (fork: %s): ranks may outlive a killed maco-run\n",
                strerror(errno));
        close(p[0]);
        close(p[1]);
        return;
    }
    if (pid == 0) {
        /* Its own process group: `kill -9 -- -PGID` of maco-run's group must not reach it. */
        setpgid(0, 0);
        close(p[1]);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) { /* only stderr stays: a reader of maco-run's stdout sees its end */
            dup2(null, 0);
            dup2(null, 1);
        }
        watchdog_main(p[0]);
    }
    setpgid(pid, pid); /* also here, so it holds before maco-run forks a rank */
    close(p[0]);
    g_watchdog_pid = pid;
    g_watchdog_fd = p[1];
}

/* Writes one 4-byte record to the watchdog (whole: 4 bytes < PIPE_BUF), retrying when a
 * signal interrupts the write. Returns 0, or -1 with errno. */
static int watchdog_send(int32_t rec)
{
    for (;;) {
        ssize_t w = write(g_watchdog_fd, &rec, sizeof(rec));
        if (w == (ssize_t)sizeof(rec))
            return 0;
        if (w >= 0)
            errno = EIO;
        if (w >= 0 || errno != EINTR)
            return -1;
    }
}

/* Tells the watchdog about a rank's process group. */
static void watchdog_watch(pid_t group)
{
    if (g_watchdog_fd >= 0 && watchdog_send((int32_t)group) != 0)
        fprintf(stderr, "maco-run: the watchdog is not listening (%s)\n", strerror(errno));
}

/* The watchdog died while the job runs (someone killed it): maco-run says so and starts
 * another, told every running rank's group, so the job is watched again. */
static void watchdog_replace(const rank_proc_t *ranks, long nranks, int status)
{
    fprintf(stderr,
            "maco-run: the watchdog (pid %d) died (%s %d) while the job runs; starting another\n",
            (int)g_watchdog_pid, WIFSIGNALED(status) ? "signal" : "exit status",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    close(g_watchdog_fd);
    g_watchdog_fd = -1;
    g_watchdog_pid = -1;
    watchdog_start();
    for (long r = 0; r < nranks; r++)
        if (ranks[r].running)
            watchdog_watch(ranks[r].pid);
}

/* The job ended the ordinary way: tells the watchdog, which exits, and reaps it. */
static void watchdog_stop(void)
{
    if (g_watchdog_fd < 0)
        return;
    int told = watchdog_send(0) == 0;
    close(g_watchdog_fd);
    g_watchdog_fd = -1;
    if (!told)
        kill(g_watchdog_pid, SIGKILL); /* cannot tell it: it would read EOF and kill groups */
    while (waitpid(g_watchdog_pid, NULL, 0) < 0 && errno == EINTR)
        ;
    g_watchdog_pid = -1;
}

static int run_ranks(long nranks, long timeout_s, long sim_nodes, long node_gpus, char **prog,
                     const char *mps_pipe_dir)
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
    char nonce_entry[64], mps_entry[400];
    snprintf(nonce_entry, sizeof(nonce_entry), "MACO_BOOTSTRAP_NONCE=%s", nonce_text);
    if (mps_pipe_dir != NULL)
        snprintf(mps_entry, sizeof(mps_entry), "CUDA_MPS_PIPE_DIRECTORY=%s", mps_pipe_dir);

    rank_proc_t *ranks = calloc((size_t)nranks, sizeof(*ranks));
    struct pollfd *pfds = calloc((size_t)nranks * 2, sizeof(*pfds));
    int *owner = calloc((size_t)nranks * 2, sizeof(int));
    if (ranks == NULL || pfds == NULL || owner == NULL) {
        fprintf(stderr, "maco-run: out of memory\n");
        free(ranks);
        free(pfds);
        free(owner);
        return 1;
    }
    long per_node = sim_nodes > 0 ? (nranks + sim_nodes - 1) / sim_nodes : nranks;
    int exit_code;
    const pid_t launcher = getpid();
    watchdog_start();
    long started = 0; /* ranks[0..started) hold a process and two streams */
    int launched = 1;
    for (long r = 0; r < nranks && launched; r++) {
        int out_pipe[2], err_pipe[2];
        if (pipe2(out_pipe, O_CLOEXEC) != 0) {
            fprintf(stderr, "maco-run: pipe for rank %ld: %s\n", r, strerror(errno));
            launched = 0;
            break;
        }
        if (pipe2(err_pipe, O_CLOEXEC) != 0) {
            fprintf(stderr, "maco-run: pipe for rank %ld: %s\n", r, strerror(errno));
            close(out_pipe[0]);
            close(out_pipe[1]);
            launched = 0;
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "maco-run: fork: %s\n", strerror(errno));
            close(out_pipe[0]);
            close(out_pipe[1]);
            close(err_pipe[0]);
            close(err_pipe[1]);
            launched = 0;
            break;
        }
        if (pid == 0) {
            setpgid(0, 0);
            /* SIGTERM when maco-run dies (kept across exec). maco-run has one thread, so the
             * thread that forked lives as long as maco-run. It may have died already, before
             * this call: then the parent is no longer maco-run. */
            if (prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0) != 0 || getppid() != launcher)
                _exit(128 + SIGTERM);
            signal(SIGPIPE, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            restore_fd_limit();
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
                char list[1024];
                if (node_gpus > 0 &&
                    node_gpu_list(r / per_node, node_gpus, list, sizeof(list)) == 0)
                    setenv("CUDA_VISIBLE_DEVICES", list, 1);
            }
            execvp(prog[0], prog);
            fprintf(stderr, "maco-run: cannot run %s: %s\n", prog[0], strerror(errno));
            _exit(127);
        }
        setpgid(pid, pid); /* also here, so kill(-pid) works even before the child runs */
        watchdog_watch(pid);
        close(out_pipe[1]);
        close(err_pipe[1]);
        ranks[r].pid = pid;
        ranks[r].running = 1;
        ranks[r].streams[0] = (stream_t){ out_pipe[0], 1, malloc(MAX_LINE), 0 };
        ranks[r].streams[1] = (stream_t){ err_pipe[0], 2, malloc(MAX_LINE), 0 };
        started = r + 1;
        if (ranks[r].streams[0].buf == NULL || ranks[r].streams[1].buf == NULL) {
            fprintf(stderr, "maco-run: out of memory\n");
            launched = 0;
        }
    }

    if (launched) {
        exit_code = supervise(ranks, nranks, timeout_s, pfds, owner);
    } else {
        exit_code = 1;
        kill_all(ranks, (int)started, SIGKILL);
        for (long r = 0; r < started; r++)
            for (int k = 0; k < 2; k++)
                if (ranks[r].streams[k].fd >= 0)
                    close(ranks[r].streams[k].fd);
    }
    /* Every way the job ends comes here, before main's mps_stop. */
    end_leftovers(ranks, started, mps_pipe_dir != NULL ? mps_entry : NULL, nonce_entry);
    watchdog_stop();
    for (long r = 0; r < started; r++) {
        free(ranks[r].streams[0].buf);
        free(ranks[r].streams[1].buf);
    }
    free(ranks);
    free(pfds);
    free(owner);
    return exit_code;
}

/* maco-run's command line. */
typedef struct run_args {
    long nranks, timeout_s, sim_nodes, gpus; /* gpus: -1 until counted */
    const char *mps_mode;                    /* auto, on or off */
    int argi;                                /* argv[argi] is the program */
} run_args_t;

/* Parses the options before PROGRAM into *a. Returns -1 to go on, else the exit status (0
 * after --help, 2 on a bad option, printed). */
static int parse_args(int argc, char **argv, run_args_t *a)
{
    memset(a, 0, sizeof(*a));
    a->gpus = -1;
    a->mps_mode = "auto";
    a->argi = 1;
    while (a->argi < argc) {
        const char *f = argv[a->argi];
        if (strcmp(f, "--") == 0) {
            a->argi++;
            break;
        }
        if (f[0] != '-')
            break;
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (a->argi + 1 >= argc) {
            fprintf(stderr, "maco-run: %s needs a value\n", f);
            usage(stderr);
            return 2;
        }
        const char *v = argv[a->argi + 1];
        if (strcmp(f, "-n") == 0 || strcmp(f, "--np") == 0) {
            if (parse_positive(v, 4096, &a->nranks) != 0) {
                fprintf(stderr, "maco-run: -n '%s' is invalid: it must be an integer in 1..4096\n",
                        v);
                return 2;
            }
        } else if (strcmp(f, "--timeout") == 0) {
            if (parse_positive(v, 86400 * 7, &a->timeout_s) != 0) {
                fprintf(stderr,
                        "maco-run: --timeout '%s' is invalid: it must be a number of seconds in "
                        "1..604800\n",
                        v);
                return 2;
            }
        } else if (strcmp(f, "--simulate-nodes") == 0) {
            if (parse_positive(v, 4096, &a->sim_nodes) != 0) {
                fprintf(stderr,
                        "maco-run: --simulate-nodes '%s' is invalid: it must be an integer "
                        ">= 1\n",
                        v);
                return 2;
            }
        } else if (strcmp(f, "--mps") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
                fprintf(stderr, "maco-run: --mps '%s' is invalid: use auto, on or off\n", v);
                return 2;
            }
            a->mps_mode = v;
        } else if (strcmp(f, "--gpus") == 0) {
            if (strcmp(v, "0") == 0)
                a->gpus = 0;
            else if (parse_positive(v, 4096, &a->gpus) != 0) {
                fprintf(stderr,
                        "maco-run: --gpus '%s' is invalid: it must be an integer in "
                        "0..4096\n",
                        v);
                return 2;
            }
        } else {
            fprintf(stderr, "maco-run: unknown option %s\n", f);
            usage(stderr);
            return 2;
        }
        a->argi += 2;
    }
    if (a->nranks == 0 || a->argi >= argc) {
        fprintf(stderr, "maco-run: %s\n", a->nranks == 0 ? "-n N is required" : "no PROGRAM given");
        usage(stderr);
        return 2;
    }
    if (a->sim_nodes > a->nranks) {
        fprintf(stderr, "maco-run: --simulate-nodes %ld is more than -n %ld\n", a->sim_nodes,
                a->nranks);
        return 2;
    }
    return -1;
}

/* SIGINT, SIGTERM, SIGHUP and SIGQUIT end the job (on_signal); SIGPIPE is ignored. */
static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a closed terminal or dropped ssh session */
    sigaction(SIGQUIT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Simulated nodes: ranks pick GPUs by local rank, so every node's local rank 0 would take
 * GPU 0. With at least one GPU per node, each node gets GPUs of its own instead (node k:
 * GPUs k * G/K .. (k + 1) * G/K - 1 of the G visible, through CUDA_VISIBLE_DEVICES), as on
 * real nodes; with fewer GPUs than nodes the nodes share them (MPS below). Returns the GPUs
 * per node (0: shared); counts the GPUs into *gpus when it needs them. */
static long simulated_node_gpus(long sim_nodes, long *gpus_p)
{
    long gpus = *gpus_p;
    long node_gpus = 0;
    if (sim_nodes > 1) {
        if (gpus < 0)
            gpus = count_gpus();
        node_gpus = gpus >= sim_nodes ? gpus / sim_nodes : 0;
        char first[1024], last[1024];
        if (node_gpus > 0 && (node_gpu_list(0, node_gpus, first, sizeof(first)) != 0 ||
                              node_gpu_list(sim_nodes - 1, node_gpus, last, sizeof(last)) != 0)) {
            fprintf(stderr,
                    "maco-run: CUDA_VISIBLE_DEVICES lists fewer than the %ld GPUs the driver "
                    "shows; the simulated nodes share GPUs\n",
                    gpus);
            node_gpus = 0;
        }
        if (node_gpus > 0)
            fprintf(stderr,
                    "maco-run: %ld simulated nodes on %ld GPUs: each node's ranks see %ld GPU(s) "
                    "of their own (CUDA_VISIBLE_DEVICES=%s on the first node, %s on the last)\n",
                    sim_nodes, gpus, node_gpus, first, last);
    }
    *gpus_p = gpus;
    return node_gpus;
}

/* MPS: ranks sharing GPUs need one MPS server to run at the same time. Starts one into *mps
 * where the ranks need it (--mps auto) or it was asked for (--mps on). Returns 0 to go on, 1
 * when no rank may start (printed). */
static int mps_prepare(const char *mps_mode, long nranks, long sim_nodes, long per_node,
                       long node_gpus, long *gpus_p, mps_t *mps)
{
    long gpus = *gpus_p;
    if (strcmp(mps_mode, "off") != 0 && (strcmp(mps_mode, "on") == 0 || nranks > 1)) {
        int want = strcmp(mps_mode, "on") == 0;
        if (!want) {
            if (gpus < 0)
                gpus = count_gpus();
            if (node_gpus > 0)
                want = node_gpus < per_node;
            else
                want = gpus > 0 && (gpus < per_node || sim_nodes > 1);
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
        } else if (want && mps_start(mps) != 0) {
            mps_stop(mps);
            fprintf(stderr, "maco-run: MPS could not be started; no rank was started%s\n",
                    strcmp(mps_mode, "on") == 0 ? "" : " (--mps off runs without it)");
            return 1;
        }
    }
    *gpus_p = gpus;
    return 0;
}

int main(int argc, char **argv)
{
    run_args_t a;
    int st = parse_args(argc, argv, &a);
    if (st >= 0)
        return st;
    if (raise_fd_limit(a.nranks) != 0)
        return 1;
    /* Orphaned descendants of the ranks (and of the MPS daemon) are reparented to maco-run,
     * so that end_leftovers finds every process the job started. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
        fprintf(stderr,
                "maco-run: cannot become a child subreaper (%s): processes that leave the "
                "ranks' process groups and lose their parents may outlive the job\n",
                strerror(errno));
    /* Installed before MPS starts, so a signal never leaves its daemon behind. */
    install_signals();
    long per_node = a.sim_nodes > 0 ? (a.nranks + a.sim_nodes - 1) / a.sim_nodes : a.nranks;
    long node_gpus = simulated_node_gpus(a.sim_nodes, &a.gpus);
    mps_t mps;
    memset(&mps, 0, sizeof(mps));
    if (mps_prepare(a.mps_mode, a.nranks, a.sim_nodes, per_node, node_gpus, &a.gpus, &mps) != 0)
        return 1;
    int rc = run_ranks(a.nranks, a.timeout_s, a.sim_nodes, node_gpus, argv + a.argi,
                       mps.started ? mps.pipe_dir : NULL);
    mps_stop(&mps);
    reap_exited();
    return rc;
}
