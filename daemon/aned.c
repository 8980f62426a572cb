/* aned.c — main: options, start-up order, daemonizing, pidfile, signals.
 *
 * Start-up order: options → no_new_privs → (detach) → signal thread → log
 * file → listening socket (fails fast when another server owns the path) →
 * model (the engine's threads start here) → pidfile → drop root (--user) →
 * Landlock (every thread) → seccomp filter → ready (the detached parent
 * exits 0 only now, so `aned --daemonize && aneclient ...` works; systemd
 * gets READY=1) → serve.
 *
 * Signals: SIGTERM, SIGINT and SIGHUP stay blocked in every thread for the
 * daemon's whole life; one thread reads them (signalfd). During start-up a
 * SIGTERM/SIGINT stops the daemon at once, whatever stage the main thread is
 * in (loading a model can take minutes): it removes what start-up created
 * (socket, lock, pidfile) and exits 0. While serving it hands them to the
 * event loop (ev_feed_signal). During teardown they are ignored, so a
 * repeated signal can never kill a clean shutdown. */
#include "daemon/aned.h"
#include "common/sig.h"
#include "proto/proto.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <ev.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
"usage: aned --model PATH [options]\n"
"\n"
"Serves one resident model to local clients over a Unix socket.\n"
"\n"
"  -m, --model PATH        GGUF file or Hugging Face model directory (required)\n"
"  -s, --socket PATH       socket to listen on; default: $ANE_SOCKET, else\n"
"                          " ANED_SYSTEM_SOCKET " for root, else\n"
"                          $XDG_RUNTIME_DIR/aned.sock, else /tmp/aned-$UID.sock.\n"
"                          A socket passed by systemd (LISTEN_FDS) wins.\n"
"      --socket-mode MODE  octal permissions of the socket (default 0660)\n"
"      --socket-group G    group owning the socket, by name or number (default:\n"
"                          the daemon's); with 0660 its members may connect\n"
"      --backend NAME      cpu or cuda (default: the best present)\n"
"      --gpus LIST         CUDA devices, e.g. 0,1: the model split over them\n"
"                          through NCCL; one number: that GPU alone (default 0);\n"
"                          docs/cuda.md\n"
"      --split heads|layers  how --gpus splits: heads (default; each GPU holds\n"
"                          its share of every layer's heads and FFN, for GPUs\n"
"                          linked by NVLink) or layers (each GPU whole layers\n"
"                          in turn, one hand-over a pass, for GPUs on PCIe)\n"
"      --gpu-layers N      only the last N layers (and the output) on the GPU,\n"
"                          the others on the CPU: a model larger than the GPU\n"
"  -t, --threads N         matmul threads (default: online cores)\n"
"  -c, --ctx N             tokens per sequence, 8..16777216 (default: the model's\n"
"                          trained context, or what the KV pool holds if less);\n"
"                          past the trained context is allowed, with a warning\n"
"      --max-seqs N        sequences batched together (default 16)\n"
"      --max-queued N      jobs waiting beyond --max-seqs before \"busy\" (default 256)\n"
"      --kv-budget MIB     KV cache pool size, shared by the sequences, which take\n"
"                          pages as they grow (default: what fits: a quarter of\n"
"                          physical memory, or the GPU's free memory after the\n"
"                          model, its f16 weight copies and 1/16 of the device;\n"
"                          at most --max-seqs full contexts)\n"
"      --kv-type f16|q8_0|f32  how the KV cache holds keys and values (default\n"
"                          f16); q8_0: blocks of 32 with an f16 scale, about half\n"
"                          f16's bytes, slightly less accurate and, on CUDA,\n"
"                          slower at long contexts (docs/cuda.md); needs a\n"
"                          head_dim that is a multiple of 32\n"
"      --pooling mean|cls|last  how embed requests pool the hidden states (default:\n"
"                          the GGUF's <arch>.pooling_type; last token when it\n"
"                          names none, as decoder embedding models want)\n"
"      --swa-full          sliding-window layers (gemma3, gpt-oss) keep the KV of\n"
"                          every position, paged with the rest, so prompts can\n"
"                          reuse a cached prefix; by default (CPU) each sequence\n"
"                          keeps only its window for them, in a ring, and their\n"
"                          models reuse no prefix\n"
"      --deterministic     a sequence's results never depend on what is batched\n"
"                          with it, at every batch size (CUDA: slower past 16\n"
"                          decoding streams; the CPU always is)\n"
"      --chat-template FILE  a Jinja chat template instead of the model's own\n"
"                          (a regular file; as root a symbolic link is refused)\n"
"      --cuda-f16-cache auto|off  f16 copies of quantized weights on the GPU for\n"
"                          prompt matmuls while memory allows (auto), or none:\n"
"                          less GPU memory, slower prompts (off)\n"
"      --cpu-repack auto|off  the CPU backend's copies of weights in its kernels'\n"
"                          own layouts (auto: q4_K and q8_0 in 8-row groups\n"
"                          on AVX2, AVX-512 and AMX, q6_K too on AVX-512\n"
"                          without AMX; about the matrices' size, in place\n"
"                          of the file's pages of them), or none:\n"
"                          the file's bytes only, slower (off)\n"
"      --max-clients N     connections at once (default 256)\n"
"      --max-backlog KIB   output waiting for one client before its jobs are\n"
"                          cancelled with \"busy\" (default 16384); past a\n"
"                          quarter of it (at most 1024) its jobs are paused\n"
"      --stall-timeout S   seconds a client's jobs may stay paused before they\n"
"                          are cancelled with \"busy\" (default 60)\n"
"      --shutdown-grace S  seconds running jobs may finish after SIGTERM (default 5)\n"
"      --hello-timeout S   seconds a new connection has to say hello (default 10)\n"
"      --idle-timeout S    seconds a connection with nothing in flight may stay\n"
"                          silent before it is closed (default 300; 0: never)\n"
"\n"
"Access (README.md, \"Access control and privilege separation\"):\n"
"  -u, --user USER         started as root: drop to USER (name or uid) once the\n"
"                          socket, log, pidfile and model are open; with USER's\n"
"                          supplementary groups\n"
"  -g, --group GROUP       with --user: this primary group, no supplementary ones\n"
"      --allow-user U      peers with this user (name or uid) may connect;\n"
"                          repeatable. root and the daemon's own user always may\n"
"      --allow-group G     peers with this group (primary or supplementary) may\n"
"                          connect; repeatable. Others get \"denied\" and are closed\n"
"      --max-jobs-per-uid N     jobs in flight + queued per peer user, across its\n"
"                          connections, before \"busy\" (default 0: no limit)\n"
"      --max-clients-per-uid N  connections per peer user; past it \"busy\",\n"
"                          closed (default 64; 0: no limit); not the daemon's\n"
"                          own user. A sixteenth of --max-clients is kept for\n"
"                          root and the daemon's own user\n"
"      --seccomp MODE      enforce, log, off or auto (default: enforce on the cpu\n"
"                          backend, off on cuda, whose driver needs ioctl/open);\n"
"                          not off: Landlock confines every thread as well\n"
"\n"
"  -d, --daemonize         detach; the parent exits once the model is loaded\n"
"  -l, --log FILE          log to FILE (reopened on SIGHUP) instead of stderr\n"
"      --log-level LEVEL   error, warn, info (default) or debug\n"
"  -p, --pidfile FILE      write the daemon's pid to FILE\n"
"  -V, --version           print the version and exit\n"
"  -h, --help              this text\n"
"\n"
"SIGTERM/SIGINT: stop accepting, let running jobs finish (--shutdown-grace),\n"
"cancel the rest, flush replies, remove the socket, exit 0. A second signal\n"
"cancels at once. During start-up (even while the model loads): stop at once,\n"
"exit 0. SIGHUP reopens the log file.\n");
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "aned: %s: expected an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "aned: %s: expected a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Readiness pipe of --daemonize: the daemon writes one byte when serving. */
static int ready_fd = -1;

static void ready_signal(char status)
{
    if (ready_fd < 0) return;
    ssize_t w;
    do w = write(ready_fd, &status, 1); while (w < 0 && errno == EINTR);
    close(ready_fd);
    ready_fd = -1;
}

static volatile sig_atomic_t parent_sig;
static void parent_on_signal(int sig) { parent_sig = sig; }

/* The original process of --daemonize waits for the daemon's start-up status;
 * a SIGTERM/SIGINT it gets meanwhile (Ctrl-C) goes on to the daemon's process
 * group, which then stops as any start-up does. */
static void parent_wait(int rfd, pid_t child)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = parent_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    char st = 1;
    ssize_t r = -1;
    int sent = 0;
    for (;;) {
        /* before the child's setsid() its group does not exist yet: retried */
        if (parent_sig && !sent && kill(-child, parent_sig) == 0) sent = 1;
        struct pollfd pf = { .fd = rfd, .events = POLLIN };
        if (poll(&pf, 1, parent_sig && !sent ? 50 : -1) <= 0) continue;
        do r = read(rfd, &st, 1); while (r < 0 && errno == EINTR);
        break;
    }
    int status;
    waitpid(child, &status, 0);
    _exit(r == 1 && st == 0 ? 0 : 1);
}

static int devnull_fd = -1;

/* Returns in the daemon (grandchild); the original process exits with the
 * daemon's start-up status. */
static int daemonize(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) { perror("aned: pipe"); return -1; }
    pid_t pid = fork();
    if (pid < 0) { perror("aned: fork"); return -1; }
    if (pid > 0) {
        close(p[1]);
        parent_wait(p[0], pid);
    }
    close(p[0]);
    if (setsid() < 0) { perror("aned: setsid"); _exit(1); }
    signal(SIGHUP, SIG_IGN);
    pid = fork();
    if (pid < 0) { perror("aned: fork"); _exit(1); }
    if (pid > 0) _exit(0); /* the session leader goes; the daemon can never regain a tty */
    signal(SIGHUP, SIG_DFL);
    ready_fd = p[1];
    if (chdir("/") < 0) { perror("aned: chdir /"); _exit(1); }
    /* kept: stderr goes there once ready (no --log), when open() is refused */
    devnull_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull_fd >= 0) {
        dup2(devnull_fd, 0);
        dup2(devnull_fd, 1);
    }
    /* stderr stays the terminal until ready: start-up errors are seen there */
    return 0;
}

/* ---------------------------------------------------------------- signals */

enum { PH_START, PH_RUN, PH_TEARDOWN };
static struct {
    pthread_mutex_t mu;      /* held by main while it creates what a stop removes */
    int phase;
    /* created by start-up: closed (socket removed) on a stop. Published
     * whole once made; main does not touch it again before serving, so a
     * stop removes it even while main holds mu (a hung start-up step). */
    _Atomic(sock_listener *) lst;
    const char *pidfile;     /* written by start-up: removed on a stop */
    int sfd;                 /* signalfd: SIGTERM, SIGINT, SIGHUP */
    int ctl[2];              /* main → thread: the phase changed */
    pthread_t th;
} sigs = { PTHREAD_MUTEX_INITIALIZER, PH_START, NULL, NULL, -1, { -1, -1 }, 0 };

static const char *sig_name(int s)
{
    return s == SIGTERM ? "SIGTERM" : s == SIGINT ? "SIGINT" : s == SIGHUP ? "SIGHUP" : "signal";
}

static void *sig_main(void *arg)
{
    (void)arg;
    int hup_pending = 0;
    for (;;) {
        struct pollfd pf[2] = { { .fd = sigs.sfd, .events = POLLIN }, { .fd = sigs.ctl[0], .events = POLLIN } };
        if (poll(pf, 2, -1) < 0) continue; /* EINTR */
        if (pf[1].revents & POLLIN) {
            char b[16];
            if (read(sigs.ctl[0], b, sizeof b) <= 0) return NULL; /* closed: main is exiting */
        }
        struct signalfd_siginfo si[8];
        ssize_t r = pf[0].revents & POLLIN ? read(sigs.sfd, si, sizeof si) : 0;
        /* main holds it only across short, non-blocking steps; should one
         * hang anyway, a stop goes ahead without waiting for it */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 2;
        int locked = pthread_mutex_timedlock(&sigs.mu, &dl) == 0;
        int phase = locked ? sigs.phase : PH_START; /* held that long: only in start-up */
        if (phase == PH_RUN && hup_pending) { ev_feed_signal(SIGHUP); hup_pending = 0; }
        for (ssize_t i = 0; i < r / (ssize_t)sizeof si[0]; i++) {
            int s = (int)si[i].ssi_signo;
            if (phase == PH_RUN) {
                ev_feed_signal(s); /* the loop's watchers take it from here */
            } else if (phase == PH_TEARDOWN) {
                log_debug("%s during shutdown: already stopping", sig_name(s));
            } else if (s == SIGHUP) {
                hup_pending = 1; /* the log is reopened once serving */
            } else {
                /* Start-up: main may be anywhere (loading the model); what it
                 * created is published under sigs.mu, held here until exit. */
                log_info("%s during start-up: stopping", sig_name(s));
                if (!locked) log_warn("a start-up step did not finish within 2 s: leaving the pidfile");
                sock_close(atomic_load_explicit(&sigs.lst, memory_order_acquire));
                if (locked && sigs.pidfile && unlink(sigs.pidfile) < 0 && errno != ENOENT)
                    log_debug("cannot remove pidfile %s: %s", sigs.pidfile, strerror(errno));
                notify_send("STOPPING=1");
                _exit(0);
            }
        }
        if (locked) pthread_mutex_unlock(&sigs.mu);
    }
}

/* Called with the stop signals blocked: every later thread inherits that. */
static int sig_start(void)
{
    sigset_t set;
    stop_signals(&set);
    sigs.sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigs.sfd < 0 || pipe2(sigs.ctl, O_CLOEXEC | O_NONBLOCK) < 0) return -1;
    int e = pthread_create(&sigs.th, NULL, sig_main, NULL);
    if (e) { errno = e; return -1; }
    return 0;
}

static void sig_phase(int phase)
{
    pthread_mutex_lock(&sigs.mu);
    sigs.phase = phase;
    pthread_mutex_unlock(&sigs.mu);
    char b = 1;
    if (write(sigs.ctl[1], &b, 1) < 0) { /* full: the thread has wakeups pending anyway */ }
}

static int write_pidfile(const char *path, char *err, size_t errlen)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        snprintf(err, errlen, "pidfile path too long: %.512s", path);
        return -1;
    }
    char e2[PATH_MAX + 128];
    int fd = file_open_regular(AT_FDCWD, tmp, tmp, O_WRONLY | O_CREAT, 0644, e2, sizeof e2);
    if (fd < 0) { snprintf(err, errlen, "pidfile: %.900s", e2); return -1; }
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_uid != geteuid()) {
        snprintf(err, errlen, "pidfile: %.512s belongs to uid %lu, not to aned's; refusing it", tmp,
                 (unsigned long)st.st_uid);
        close(fd);
        return -1;
    }
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    int ok = ftruncate(fd, 0) == 0 && write(fd, buf, (size_t)n) == n;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) < 0) {
        snprintf(err, errlen, "cannot write pidfile %.512s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Room for every allowed connection plus the daemon's own descriptors. */
static void raise_fd_limit(int max_clients)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) return;
    rlim_t want = (rlim_t)max_clients + 64;
    if (rl.rlim_cur >= want) return;
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (rl.rlim_cur > old) setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want)
        log_warn("descriptor limit %llu is below --max-clients + 64 = %llu: connections past it wait",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)want);
}

/* Every option by name; those with a short form are its letter. */
enum {
    OPT_MODEL = 'm', OPT_SOCKET = 's', OPT_THREADS = 't', OPT_CTX = 'c', OPT_USER = 'u', OPT_GROUP = 'g',
    OPT_DAEMONIZE = 'd', OPT_LOG = 'l', OPT_PIDFILE = 'p', OPT_HELP = 'h', OPT_VERSION = 'V',
    OPT_SOCKET_MODE = 256, OPT_SOCKET_GROUP, OPT_BACKEND, OPT_MAX_SEQS, OPT_MAX_QUEUED, OPT_KV_BUDGET, OPT_DETERMINISTIC, OPT_F16_CACHE, OPT_CPU_REPACK, OPT_CHAT_TEMPLATE, OPT_KV_TYPE, OPT_POOLING, OPT_SWA_FULL, OPT_GPUS, OPT_SPLIT, OPT_GPU_LAYERS,
    OPT_MAX_CLIENTS, OPT_MAX_BACKLOG, OPT_STALL, OPT_GRACE, OPT_HELLO, OPT_LOG_LEVEL,
    OPT_ALLOW_USER, OPT_ALLOW_GROUP, OPT_JOBS_UID, OPT_CLIENTS_UID, OPT_SECCOMP, OPT_IDLE,
};

/* --chat-template FILE: a regular file, opened without blocking (a FIFO
 * would hang start-up); as root without following a symbolic link in its
 * last component (file_open_regular), as a user after resolving links. */
#define MAX_TEMPLATE (4u << 20)
static int read_template(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    char resolved[PATH_MAX];
    const char *p = path;
    if (geteuid() != 0) {
        if (!realpath(path, resolved)) {
            snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
            return -1;
        }
        p = resolved;
    }
    int fd = file_open_regular(AT_FDCWD, p, path, O_RDONLY, 0, err, errlen);
    if (fd < 0) return -1;
    size_t cap = 65536, n = 0;
    char *b = malloc(cap + 1);
    for (;;) {
        if (!b) { snprintf(err, errlen, "%s: out of memory", path); close(fd); return -1; }
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
            free(b);
            close(fd);
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n > MAX_TEMPLATE) {
            snprintf(err, errlen, "%s: over %u bytes; a chat template is far smaller", path, MAX_TEMPLATE);
            free(b);
            close(fd);
            return -1;
        }
        if (n == cap) { cap *= 2; char *nb = realloc(b, cap + 1); if (!nb) free(b); b = nb; }
    }
    close(fd);
    b[n] = 0;
    if (n == 0 || strlen(b) != n) {
        snprintf(err, errlen, "%s: %s", path, n ? "holds a NUL byte; expected Jinja text" : "is empty; expected a Jinja template");
        free(b);
        return -1;
    }
    *out = b;
    *len = n;
    return 0;
}

/* arg as one of names (NULL-terminated): its index; else -1, having said
 * which were expected */
static int pick(const char *opt, const char *arg, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(arg, names[i])) return i;
    fprintf(stderr, "aned: %s: expected ", opt);
    for (int i = 0; names[i]; i++) fprintf(stderr, "%s%s", i == 0 ? "" : names[i + 1] ? ", " : " or ", names[i]);
    fprintf(stderr, ", got '%s'\n", arg);
    return -1;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "model", required_argument, 0, OPT_MODEL },
        { "socket", required_argument, 0, OPT_SOCKET },
        { "socket-mode", required_argument, 0, OPT_SOCKET_MODE },
        { "socket-group", required_argument, 0, OPT_SOCKET_GROUP },
        { "backend", required_argument, 0, OPT_BACKEND },
        { "threads", required_argument, 0, OPT_THREADS },
        { "ctx", required_argument, 0, OPT_CTX },
        { "max-seqs", required_argument, 0, OPT_MAX_SEQS },
        { "max-queued", required_argument, 0, OPT_MAX_QUEUED },
        { "kv-budget", required_argument, 0, OPT_KV_BUDGET },
        { "deterministic", no_argument, 0, OPT_DETERMINISTIC },
        { "cuda-f16-cache", required_argument, 0, OPT_F16_CACHE },
        { "cpu-repack", required_argument, 0, OPT_CPU_REPACK },
        { "chat-template", required_argument, 0, OPT_CHAT_TEMPLATE },
        { "kv-type", required_argument, 0, OPT_KV_TYPE },
        { "gpus", required_argument, 0, OPT_GPUS },
        { "split", required_argument, 0, OPT_SPLIT },
        { "gpu-layers", required_argument, 0, OPT_GPU_LAYERS },
        { "pooling", required_argument, 0, OPT_POOLING },
        { "swa-full", no_argument, 0, OPT_SWA_FULL },
        { "max-clients", required_argument, 0, OPT_MAX_CLIENTS },
        { "max-backlog", required_argument, 0, OPT_MAX_BACKLOG },
        { "stall-timeout", required_argument, 0, OPT_STALL },
        { "shutdown-grace", required_argument, 0, OPT_GRACE },
        { "hello-timeout", required_argument, 0, OPT_HELLO },
        { "idle-timeout", required_argument, 0, OPT_IDLE },
        { "user", required_argument, 0, OPT_USER },
        { "group", required_argument, 0, OPT_GROUP },
        { "allow-user", required_argument, 0, OPT_ALLOW_USER },
        { "allow-group", required_argument, 0, OPT_ALLOW_GROUP },
        { "max-jobs-per-uid", required_argument, 0, OPT_JOBS_UID },
        { "max-clients-per-uid", required_argument, 0, OPT_CLIENTS_UID },
        { "seccomp", required_argument, 0, OPT_SECCOMP },
        { "daemonize", no_argument, 0, OPT_DAEMONIZE },
        { "log", required_argument, 0, OPT_LOG },
        { "log-level", required_argument, 0, OPT_LOG_LEVEL },
        { "pidfile", required_argument, 0, OPT_PIDFILE },
        { "help", no_argument, 0, OPT_HELP },
        { "version", no_argument, 0, OPT_VERSION },
        { 0, 0, 0, 0 },
    };
    /* the options that take one of a few words, and what each word sets */
    static const char *const backends[] = { "cpu", "cuda", NULL };
    static const char *const f16_caches[] = { "auto", "off", NULL };   /* (and --cpu-repack's) */
    static const char *const poolings[] = { "mean", "cls", "last", NULL };
    static const char *const splits[] = { "heads", "layers", NULL };
    static const int pooling_of[] = { ENG_POOL_MEAN, ENG_POOL_CLS, ENG_POOL_LAST };
    server_opts so;
    server_opts_default(&so);
    const char *sock_path = NULL, *log_path = NULL, *pidfile = NULL;
    unsigned sock_mode = 0660;
    gid_t sock_gid = (gid_t)-1;
    int detach = 0;
    const char *user = NULL, *group = NULL;
    const char *chat_template = NULL;
    priv_seccomp_mode scm = PRIV_SECCOMP_AUTO;
    static acl allow; /* static: its lists live as long as the server */
    char aerr[256];
    long v;
    double d;
    int c, w;   /* w: the word a pick() found */
    while ((c = getopt_long(argc, argv, "m:s:t:c:u:g:dl:p:hV", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: so.eng.model_path = optarg; break;
        case OPT_SOCKET: sock_path = optarg; break;
        case OPT_SOCKET_MODE: {
            char *end;
            errno = 0;
            unsigned long m = strtoul(optarg, &end, 8);
            if (errno || end == optarg || *end || m > 0777) {
                fprintf(stderr, "aned: --socket-mode: expected octal permissions like 0660, got '%s'\n", optarg);
                return 2;
            }
            sock_mode = (unsigned)m;
            break;
        }
        case OPT_SOCKET_GROUP: {
            struct group *gr = getgrnam(optarg);
            char *end;
            errno = 0;
            unsigned long g = strtoul(optarg, &end, 10);
            if (gr) sock_gid = gr->gr_gid;
            else if (!errno && end != optarg && !*end && g < (gid_t)-1) sock_gid = (gid_t)g;
            else {
                fprintf(stderr, "aned: --socket-group: no group '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case OPT_BACKEND:
            if (pick("--backend", optarg, backends) < 0) return 2;
            so.eng.backend = optarg;
            break;
        case OPT_THREADS: if (parse_int("--threads", optarg, 0, 1024, &v)) return 2; so.eng.n_threads = (int)v; break;
        case OPT_CTX: if (parse_int("--ctx", optarg, 8, 1 << 24, &v)) return 2; so.eng.n_ctx = (int)v; break;
        case OPT_MAX_SEQS: if (parse_int("--max-seqs", optarg, 0, 4096, &v)) return 2; so.eng.max_seqs = (int)v; break;
        case OPT_MAX_QUEUED: if (parse_int("--max-queued", optarg, 0, 1 << 20, &v)) return 2; so.eng.max_queued = (int)v; break;
        case OPT_DETERMINISTIC: so.eng.deterministic = 1; break;
        case OPT_CHAT_TEMPLATE: chat_template = optarg; break;
        case OPT_F16_CACHE:
            if ((w = pick("--cuda-f16-cache", optarg, f16_caches)) < 0) return 2;
            so.eng.cuda_f16_cache_off = w == 1;
            break;
        case OPT_CPU_REPACK:
            if ((w = pick("--cpu-repack", optarg, f16_caches)) < 0) return 2;
            so.eng.cpu_repack_off = w == 1;
            break;
        case OPT_KV_TYPE:
            if ((w = pick("--kv-type", optarg, eng_kv_types)) < 0) return 2;
            so.eng.kv_type = w;
            break;
        case OPT_GPUS:
            so.eng.gpus = optarg;
            break;
        case OPT_SPLIT:
            if ((w = pick("--split", optarg, splits)) < 0) return 2;
            so.eng.split_layers = w == 1;
            break;
        case OPT_GPU_LAYERS: if (parse_int("--gpu-layers", optarg, 1, 1 << 20, &v)) return 2; so.eng.gpu_layers = (int)v; break;
        case OPT_POOLING:
            if ((w = pick("--pooling", optarg, poolings)) < 0) return 2;
            so.eng.pooling = pooling_of[w];
            break;
        case OPT_SWA_FULL: so.eng.swa_full = 1; break;
        case OPT_KV_BUDGET: if (parse_int("--kv-budget", optarg, 0, 1L << 30, &v)) return 2; so.eng.kv_budget = (size_t)v << 20; break;
        case OPT_MAX_CLIENTS: if (parse_int("--max-clients", optarg, 1, 1 << 20, &v)) return 2; so.max_clients = (int)v; break;
        case OPT_MAX_BACKLOG:
            if (parse_int("--max-backlog", optarg, 16, 1L << 22, &v)) return 2;
            so.out_max = (size_t)v << 10;
            /* stop reading requests well before cancelling */
            so.out_pause = so.out_max / 4 < so.out_pause ? so.out_max / 4 : so.out_pause;
            break;
        case OPT_STALL: if (parse_double("--stall-timeout", optarg, 0.1, 86400, &d)) return 2; so.stall_timeout = d; break;
        case OPT_GRACE: if (parse_double("--shutdown-grace", optarg, 0, 3600, &d)) return 2; so.shutdown_grace = d; break;
        case OPT_HELLO: if (parse_double("--hello-timeout", optarg, 0.1, 3600, &d)) return 2; so.handshake_timeout = d; break;
        case OPT_IDLE: if (parse_double("--idle-timeout", optarg, 0, 86400 * 7, &d)) return 2; so.idle_timeout = d; break;
        case OPT_USER: user = optarg; break;
        case OPT_GROUP: group = optarg; break;
        case OPT_ALLOW_USER:
            if (acl_add_user(&allow, optarg, aerr, sizeof aerr) < 0) { fprintf(stderr, "aned: %s\n", aerr); return 2; }
            break;
        case OPT_ALLOW_GROUP:
            if (acl_add_group(&allow, optarg, aerr, sizeof aerr) < 0) { fprintf(stderr, "aned: %s\n", aerr); return 2; }
            break;
        case OPT_JOBS_UID: if (parse_int("--max-jobs-per-uid", optarg, 0, 1 << 20, &v)) return 2; so.max_jobs_per_uid = (int)v; break;
        case OPT_CLIENTS_UID: if (parse_int("--max-clients-per-uid", optarg, 0, 1 << 20, &v)) return 2; so.max_clients_per_uid = (int)v; break;
        case OPT_SECCOMP:
            if (priv_seccomp_parse(optarg, &scm) < 0) {
                fprintf(stderr, "aned: --seccomp: expected enforce, log, off or auto, got '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_DAEMONIZE: detach = 1; break;
        case OPT_LOG: log_path = optarg; break;
        case OPT_LOG_LEVEL: {
            log_level lv;
            if (log_level_parse(optarg, &lv) < 0) {
                fprintf(stderr, "aned: --log-level: expected error, warn, info or debug, got '%s'\n", optarg);
                return 2;
            }
            log_set_level(lv);
            break;
        }
        case OPT_PIDFILE: pidfile = optarg; break;
        case OPT_HELP: usage(stdout); return 0;
        case OPT_VERSION: printf("%s (protocol %d)\n", ANED_SERVER_NAME, PROTO_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "aned: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!so.eng.model_path) {
        fprintf(stderr, "aned: --model PATH is required (see --help)\n");
        return 2;
    }
    if (group && !user) {
        fprintf(stderr, "aned: --group needs --user\n");
        return 2;
    }
    char *tpl_text = NULL;   /* read now: its path means the same as on the command line */
    if (chat_template) {
        char terr[512];
        size_t tl;
        if (read_template(chat_template, &tpl_text, &tl, terr, sizeof terr) < 0) {
            fprintf(stderr, "aned: --chat-template: %s\n", terr);
            return 2;
        }
        so.eng.chat_template = tpl_text;
        so.eng.chat_template_len = tl;
        so.eng.chat_template_name = chat_template;
    }
    priv_user pu;
    if (user) {
        if (geteuid() != 0) {
            fprintf(stderr, "aned: --user %s: only root can change user (running as uid %lu)\n",
                    user, (unsigned long)geteuid());
            return 2;
        }
        if (priv_user_lookup(&pu, user, group, aerr, sizeof aerr) < 0) {
            fprintf(stderr, "aned: %s\n", aerr);
            return 2;
        }
    }

    char err[1024];
    char pathbuf[256];
    if (!sock_path) {
        if (sock_default_path(pathbuf, sizeof pathbuf, err, sizeof err) < 0) {
            fprintf(stderr, "aned: %s\n", err);
            return 1;
        }
        sock_path = pathbuf;
    }
    /* Relative paths would change meaning after chdir("/") in --daemonize. */
    char abs_model[PATH_MAX], abs_log[PATH_MAX], abs_pid[PATH_MAX], abs_sock[PATH_MAX];
    if (detach) {
        const char **ps[] = { &so.eng.model_path, &log_path, &pidfile, &sock_path };
        char *bufs[] = { abs_model, abs_log, abs_pid, abs_sock };
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) { perror("aned: getcwd"); return 1; }
        for (int i = 0; i < 4; i++) {
            if (!*ps[i] || (*ps[i])[0] == '/') continue;
            if (snprintf(bufs[i], PATH_MAX, "%s/%s", cwd, *ps[i]) >= PATH_MAX) {
                fprintf(stderr, "aned: path too long: %s\n", *ps[i]);
                return 1;
            }
            *ps[i] = bufs[i];
        }
        if (!log_path)
            fprintf(stderr, "aned: warning: --daemonize without --log: log lines are discarded\n");
    }

    signal(SIGPIPE, SIG_IGN);
    /* Blocked in every thread for good: the signal thread reads them. */
    sigset_t stop_sigs;
    stop_signals(&stop_sigs);
    sigprocmask(SIG_BLOCK, &stop_sigs, NULL);
    /* Set before any other thread exists, so every thread inherits it (Landlock
     * needs it on each): aned never executes anything, and nothing it runs may
     * gain privileges. */
    if (priv_no_new_privs() < 0) fprintf(stderr, "aned: warning: PR_SET_NO_NEW_PRIVS: %s\n", strerror(errno));
    if (detach && daemonize() < 0) return 1;
    if (sig_start() < 0) {
        fprintf(stderr, "aned: cannot start the signal thread: %s\n", strerror(errno));
        ready_signal(1);
        return 1;
    }
    if (log_path && log_open_file(log_path, err, sizeof err) < 0) {
        fprintf(stderr, "aned: %s\n", err);
        ready_signal(1);
        return 1;
    }

    raise_fd_limit(so.max_clients);

    int rc = 1;
    server *srv = NULL;
    sock_listener lst;
    int have_lst = 0, have_pid = 0;
    int act = sock_listen_activated(&lst, err, sizeof err);
    if (act < 0) { log_error("%s", err); goto out; }
    if (act == 0) {
        pthread_mutex_lock(&sigs.mu);
        int lrc = sock_listen(&lst, sock_path, sock_mode, sock_gid, SOMAXCONN, err, sizeof err);
        if (lrc == 0) atomic_store_explicit(&sigs.lst, &lst, memory_order_release);
        pthread_mutex_unlock(&sigs.mu);
        if (lrc < 0) { log_error("%s", err); goto out; }
    }
    have_lst = 1;
    notify_open(); /* before the drop and the filter: socket() is gone then */

    /* The allow-list: listed users and groups, plus root and the daemon's own
     * user (after the drop). */
    if (acl_add_uid(&allow, 0) < 0 || acl_add_uid(&allow, user ? pu.uid : geteuid()) < 0) {
        log_error("out of memory");
        goto out;
    }
    so.allow = &allow;
    so.daemon_uid = user ? pu.uid : geteuid();

    log_info("loading model %s", so.eng.model_path);
    int orc = server_open(&srv, &so, err, sizeof err);
    pthread_sigmask(SIG_BLOCK, &stop_sigs, NULL); /* server_open unblocks them */
    if (orc < 0) { log_error("%s", err); goto out; }
    const eng_model_info *mi = server_model(srv);
    log_info("model %s: \"%s\", arch %s, %d layers, vocab %d, ctx %d, %s backend, %d thread(s), %d seq(s), "
             "kv %s, pool %llu tokens in %llu MiB%s%s",
             mi->path ? mi->path : so.eng.model_path, mi->name ? mi->name : "?", mi->arch ? mi->arch : "?",
             mi->n_layer, mi->n_vocab, mi->n_ctx, mi->backend ? mi->backend : "?", mi->n_threads,
             mi->max_seqs, mi->kv_type ? mi->kv_type : "?", (unsigned long long)mi->kv_pool_tokens,
             (unsigned long long)(mi->kv_bytes >> 20), mi->swa_ring ? ", sliding-window layers in rings" : "",
             mi->tokenizer_only ? ", tokenizer only" : "");
    if (mi->device && mi->device[0]) log_info("device: %s", mi->device);
    if (mi->repacked_bytes)
        log_info("weights: %.1f MiB of q4_K, q6_K and q8_0 matrices held in 8-row groups (a copy; the "
                 "file's bytes of them are no longer read)", (double)mi->repacked_bytes / (1 << 20));
    if (mi->pooling) log_info("embeddings: %s pooling (%s)", mi->pooling, mi->pooling_source);
    if (mi->warning && mi->warning[0]) log_warn("model: %s", mi->warning);
    if (so.eng.n_ctx > 0 && mi->n_ctx_train > 0 && mi->n_ctx > mi->n_ctx_train)
        log_warn("--ctx %d is larger than the model's trained context of %d tokens: "
                 "text past %d tokens may come out degraded", mi->n_ctx, mi->n_ctx_train, mi->n_ctx_train);
    if (pidfile) {
        pthread_mutex_lock(&sigs.mu);
        int prc = write_pidfile(pidfile, err, sizeof err);
        if (prc == 0) sigs.pidfile = pidfile;
        pthread_mutex_unlock(&sigs.mu);
        if (prc < 0) { log_error("%s", err); goto out; }
        have_pid = 1;
    }
    if (user) {
        if (log_path && log_chown(pu.uid, pu.gid) < 0)
            log_warn("cannot give the log file %s to %s: %s (SIGHUP may fail to reopen it)",
                     log_path, pu.name, strerror(errno));
        if (priv_drop(&pu, err, sizeof err) < 0) { log_error("cannot drop privileges: %s", err); goto out; }
    } else if (geteuid() == 0) {
        log_warn("running as root: give --user USER (a dedicated user) so that a flaw in the "
                 "daemon or engine cannot give root away");
    }
    if (scm == PRIV_SECCOMP_AUTO) {
        scm = mi->backend && !strcmp(mi->backend, "cpu") ? PRIV_SECCOMP_ENFORCE : PRIV_SECCOMP_OFF;
        if (ANED_SANITIZED && scm == PRIV_SECCOMP_ENFORCE) {
            /* the sanitizers' runtimes (leak check: clone + ptrace) need calls the filter refuses */
            log_info("sanitizer build: seccomp filter off unless --seccomp enforce");
            scm = PRIV_SECCOMP_OFF;
        }
    }
    if (scm != PRIV_SECCOMP_OFF && ANED_SANITIZED) {
        log_info("sanitizer build: landlock off (the leak check reads /proc at exit)");
    } else if (scm != PRIV_SECCOMP_OFF) {
        const char *rm[2] = { lst.activated ? NULL : lst.path, pidfile };
        int nth = 0;
        int abi = priv_landlock(log_path, rm, 2, &nth, err, sizeof err);
        if (abi < 0) { log_error("cannot confine the daemon: %s", err); goto out; }
        if (abi > 0)
            log_info("landlock (ABI %d) on all %d thread(s): no file may be read; files may only be created or "
                     "appended to in the log directory, removed in the socket's and pidfile's", abi, nth);
        else log_info("landlock not available in this kernel");
    }
    if (priv_seccomp_install(scm, log_dir_fd(), err, sizeof err) < 0) {
        log_error("cannot confine the daemon: %s (--seccomp off to run without the filter)", err);
        goto out;
    }
    if (scm != PRIV_SECCOMP_OFF)
        log_info("seccomp filter installed (%s)", scm == PRIV_SECCOMP_LOG ? "log" : "enforce");
    else
        log_info("seccomp filter off%s", mi->backend && strcmp(mi->backend, "cpu") ? " (accelerator backend)" : "");
    log_info("%s listening on %s%s (pid %ld)", ANED_SERVER_NAME, lst.path,
             lst.activated ? " (systemd socket)" : "", (long)getpid());
    if (detach) {
        if (!log_path) {
            if (devnull_fd >= 0) dup2(devnull_fd, 2);
        } else {
            log_capture_stderr(); /* anything the engine prints lands in the log */
        }
    }
    sig_phase(PH_RUN); /* from now on the loop takes the signals */
    ready_signal(0);
    notify_send("READY=1\nSTATUS=serving %s on %s\nMAINPID=%ld", mi->name ? mi->name : "model",
                lst.path, (long)getpid());
    rc = server_run(srv, &lst);
    have_lst = 0; /* server_run closed it */
    log_info("exiting");
out:
    sig_phase(PH_TEARDOWN); /* waits out a stop in progress; later signals are ignored */
    ready_signal(1);
    if (have_lst) sock_close(&lst);
    server_close(srv);
    if (have_pid && unlink(pidfile) < 0 && errno != ENOENT)
        log_debug("cannot remove pidfile %s: %s", pidfile, strerror(errno));
    notify_close();
    acl_free(&allow);
    free(tpl_text);
    log_close();
    return rc;
}
