/* privsep.c — privilege separation and confinement.
 *
 * aned started as root opens everything it needs (socket, log, pidfile, the
 * model file, the accelerator) and then gives root up for good: supplementary
 * groups, gid, uid (glibc applies each to every thread), after which regaining
 * root must fail. no_new_privs is set before the engine starts its threads, so
 * every thread inherits it; the process is made non-dumpable so other users
 * cannot ptrace it or read its memory.
 *
 * The seccomp filter is an allow-list written by hand (no libseccomp: the list
 * is short and fixed, and one fewer library runs as root). It is installed
 * with SECCOMP_FILTER_FLAG_TSYNC so the engine's threads get it too. Calls
 * not listed fail with EPERM ("enforce") or are allowed and logged by the
 * kernel ("log", to find what a new code path needs). Absent on purpose:
 * execve, fork/clone, socket/connect/bind, ptrace, ioctl, and open except
 * relative to the log directory with the log's flags (for SIGHUP reopen:
 * write-only, create, append, no link followed — never for reading). The
 * filter sees the directory descriptor but not the path, so an absolute or
 * "../" name gets past it; Landlock, applied on every thread, confines the
 * path (and unlink, which the filter allows for the socket and pidfile).
 *
 * Also here: the allow-list of peers (SO_PEERCRED, SO_PEERGROUPS) and the
 * systemd notification socket (sd_notify(3) protocol, written by hand). */
#include "daemon/aned.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <pwd.h>
#include <stdarg.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

/* ---------------------------------------------------------------- ids */

static int parse_id(const char *s, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v >= (uid_t)-1) return -1;
    *out = v;
    return 0;
}

int priv_user_lookup(priv_user *u, const char *user, const char *group, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    struct passwd *pw = getpwnam(user);
    unsigned long id;
    if (pw) {
        u->uid = pw->pw_uid;
        u->gid = pw->pw_gid;
        snprintf(u->name, sizeof u->name, "%s", pw->pw_name);
    } else if (parse_id(user, &id) == 0) {
        u->uid = (uid_t)id;
        pw = getpwuid(u->uid);
        u->gid = pw ? pw->pw_gid : (gid_t)id;
        snprintf(u->name, sizeof u->name, "%s", pw ? pw->pw_name : user);
    } else {
        snprintf(err, errlen, "--user: no user '%s'", user);
        return -1;
    }
    if (u->uid == 0) {
        snprintf(err, errlen, "--user %s is root: nothing would be dropped", user);
        return -1;
    }
    if (group) {
        struct group *gr = getgrnam(group);
        if (gr) u->gid = gr->gr_gid;
        else if (parse_id(group, &id) == 0) u->gid = (gid_t)id;
        else { snprintf(err, errlen, "--group: no group '%s'", group); return -1; }
        u->n_groups = 0; /* an explicit group: no supplementary groups */
        return 0;
    }
    /* The user's own supplementary groups, as login(1) would give them. */
    int n = PRIV_MAX_GROUPS;
    if (pw && getgrouplist(pw->pw_name, u->gid, u->groups, &n) >= 0) u->n_groups = n;
    else { u->groups[0] = u->gid; u->n_groups = 1; }
    return 0;
}

/* Every thread's real/effective/saved/fs ids (the "Uid:" and "Gid:" lines of
 * /proc/self/task/N/status) must be the target's. */
static int check_threads(uid_t uid, gid_t gid, int *n_threads, char *err, size_t errlen)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) { snprintf(err, errlen, "cannot list /proc/self/task: %s", strerror(errno)); return -1; }
    struct dirent *de;
    int n = 0, rc = 0;
    while ((de = readdir(d)) && rc == 0) {
        if (de->d_name[0] == '.') continue;
        char p[64], line[256];
        snprintf(p, sizeof p, "/proc/self/task/%.20s/status", de->d_name);
        FILE *f = fopen(p, "re");
        if (!f) continue; /* a thread that just ended */
        int seen = 0;
        while (fgets(line, sizeof line, f)) {
            unsigned long a[4];
            int isu = strncmp(line, "Uid:", 4) == 0, isg = strncmp(line, "Gid:", 4) == 0;
            if (!isu && !isg) continue;
            if (sscanf(line + 4, "%lu %lu %lu %lu", &a[0], &a[1], &a[2], &a[3]) != 4) { rc = -1; break; }
            unsigned long want = isu ? (unsigned long)uid : (unsigned long)gid;
            for (int i = 0; i < 4; i++)
                if (a[i] != want) rc = -1;
            seen++;
        }
        fclose(f);
        if (rc < 0 || seen != 2) {
            snprintf(err, errlen, "thread %s still has other ids after the drop", de->d_name);
            rc = -1;
        }
        n++;
    }
    closedir(d);
    *n_threads = n;
    return rc;
}

int priv_drop(const priv_user *u, char *err, size_t errlen)
{
    if (setgroups((size_t)u->n_groups, u->n_groups ? u->groups : NULL) < 0) {
        snprintf(err, errlen, "setgroups: %s", strerror(errno));
        return -1;
    }
    if (setresgid(u->gid, u->gid, u->gid) < 0) {
        snprintf(err, errlen, "setresgid(%lu): %s", (unsigned long)u->gid, strerror(errno));
        return -1;
    }
    if (setresuid(u->uid, u->uid, u->uid) < 0) {
        snprintf(err, errlen, "setresuid(%lu): %s", (unsigned long)u->uid, strerror(errno));
        return -1;
    }
    /* Paranoia that costs nothing: root must be gone for good. */
    if (setuid(0) == 0 || seteuid(0) == 0 || setgid(0) == 0 || getuid() != u->uid ||
        geteuid() != u->uid || getgid() != u->gid || getegid() != u->gid) {
        snprintf(err, errlen, "privileges could be regained after dropping to %s", u->name);
        return -1;
    }
    int nth = 0;
    if (check_threads(u->uid, u->gid, &nth, err, errlen) < 0) return -1;
    /* setuid makes us non-dumpable already; say it. */
    if (ANED_SANITIZED) log_info("sanitizer build: staying dumpable for the leak check");
    if (prctl(PR_SET_DUMPABLE, ANED_SANITIZED, 0, 0, 0) < 0) {
        snprintf(err, errlen, "PR_SET_DUMPABLE: %s", strerror(errno));
        return -1;
    }
    log_info("running as %s (uid %lu gid %lu, %d supplementary group(s)); %d thread(s) checked",
             u->name, (unsigned long)u->uid, (unsigned long)u->gid, u->n_groups, nth);
    return 0;
}

int priv_no_new_privs(void)
{
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

/* ---------------------------------------------------------------- seccomp */

int priv_seccomp_parse(const char *s, priv_seccomp_mode *m)
{
    if (!strcmp(s, "auto")) *m = PRIV_SECCOMP_AUTO;
    else if (!strcmp(s, "off")) *m = PRIV_SECCOMP_OFF;
    else if (!strcmp(s, "log")) *m = PRIV_SECCOMP_LOG;
    else if (!strcmp(s, "enforce")) *m = PRIV_SECCOMP_ENFORCE;
    else return -1;
    return 0;
}

#if defined(__x86_64__)
#define PRIV_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define PRIV_ARCH AUDIT_ARCH_AARCH64
#endif

#ifdef PRIV_ARCH
/* What the running daemon and the engine's threads call once start-up is
 * over: I/O on descriptors it already has, accept, the event loop, memory,
 * locks, time, signals. */
static const int allowed[] = {
    SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_close, SYS_lseek,
    SYS_fstat, SYS_newfstatat, SYS_fcntl, SYS_dup, SYS_dup3,
    SYS_accept4, SYS_accept, SYS_recvfrom, SYS_recvmsg, SYS_sendto, SYS_sendmsg, SYS_shutdown,
    SYS_getsockopt, SYS_getsockname,
    SYS_epoll_ctl, SYS_epoll_pwait, SYS_ppoll, SYS_pselect6,
    SYS_eventfd2, SYS_timerfd_settime, SYS_timerfd_gettime,
    SYS_mmap, SYS_munmap, SYS_mprotect, SYS_mremap, SYS_madvise, SYS_brk,
    SYS_futex, SYS_set_robust_list, SYS_get_robust_list, SYS_sched_yield, SYS_sched_getaffinity,
    SYS_membarrier,
    SYS_clock_gettime, SYS_clock_getres, SYS_gettimeofday, SYS_nanosleep, SYS_clock_nanosleep,
    SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_sigaltstack, SYS_restart_syscall,
    SYS_getpid, SYS_gettid, SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_tgkill,
    SYS_getrandom, SYS_exit, SYS_exit_group, SYS_unlinkat,
#ifdef SYS_rseq
    SYS_rseq,
#endif
#ifdef SYS_epoll_pwait2
    SYS_epoll_pwait2,
#endif
#ifdef SYS_futex_waitv
    SYS_futex_waitv,
#endif
#ifdef SYS_clock_gettime64
    SYS_clock_gettime64,
#endif
#if defined(__x86_64__)
    SYS_epoll_wait, SYS_poll, SYS_select, SYS_dup2, SYS_time, SYS_unlink, SYS_arch_prctl,
#endif
};
#endif

int priv_seccomp_install(priv_seccomp_mode mode, int open_dirfd, char *err, size_t errlen)
{
#ifndef PRIV_ARCH
    (void)open_dirfd;
    if (mode == PRIV_SECCOMP_OFF) return 0;
    snprintf(err, errlen, "seccomp filter not available on this architecture");
    return -1;
#else
    if (mode == PRIV_SECCOMP_OFF || mode == PRIV_SECCOMP_AUTO) return 0;
    enum { N = sizeof allowed / sizeof allowed[0] };
    struct sock_filter f[2 * N + 32];
    unsigned k = 0;
    const unsigned deny = mode == PRIV_SECCOMP_LOG ? SECCOMP_RET_LOG : SECCOMP_RET_ERRNO | EPERM;
#define STMT(c, v) (f[k++] = (struct sock_filter)BPF_STMT(c, v))
#define JUMP(c, v, t, e) (f[k++] = (struct sock_filter)BPF_JUMP(c, v, t, e))
    /* Another ABI's numbers mean other calls: kill. */
    STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    JUMP(BPF_JMP | BPF_JEQ | BPF_K, PRIV_ARCH, 1, 0);
    STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
#if defined(__x86_64__)
    JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u /* x32 */, 0, 1);
    STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
#endif
    for (unsigned i = 0; i < N; i++) {
        JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)allowed[i], 0, 1);
        STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    /* openat only relative to the log directory, with exactly the log's
     * flags (SIGHUP reopen): the low word of the directory argument (an
     * int), both words of the flags. */
    if (open_dirfd >= 0) {
        const unsigned lo = offsetof(struct seccomp_data, args[0]) + (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 0 : 4);
        const unsigned f_lo = offsetof(struct seccomp_data, args[2]) + (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 0 : 4);
        const unsigned f_hi = offsetof(struct seccomp_data, args[2]) + (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 4 : 0);
        JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 0, 7);
        STMT(BPF_LD | BPF_W | BPF_ABS, lo);
        JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)open_dirfd, 0, 5);
        STMT(BPF_LD | BPF_W | BPF_ABS, f_lo);
        JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)LOG_OPEN_FLAGS, 0, 3);
        STMT(BPF_LD | BPF_W | BPF_ABS, f_hi);
        JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1);
        STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    STMT(BPF_RET | BPF_K, deny);
#undef STMT
#undef JUMP
    struct sock_fprog prog = { .len = (unsigned short)k, .filter = f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        snprintf(err, errlen, "PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
        return -1;
    }
    long rc = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
    if (rc != 0) {
        if (rc > 0) snprintf(err, errlen, "seccomp: thread %ld could not take the filter", rc);
        else snprintf(err, errlen, "seccomp: %s", strerror(errno));
        return -1;
    }
    return 0;
#endif
}

/* ---------------------------------------------------------------- landlock */

#ifdef SYS_landlock_create_ruleset
static int ll_rule(int ruleset, const char *file, unsigned long long access, char *err, size_t errlen)
{
    /* the file's directory, beneath which access is granted */
    char dir[4096];
    const char *slash = strrchr(file, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == file) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - file), file);
    int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "landlock: %s: %s", dir, strerror(errno)); return -1; }
    struct landlock_path_beneath_attr pb = { .allowed_access = access, .parent_fd = fd };
    long rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
    int e = errno;
    close(fd);
    if (rc < 0) { snprintf(err, errlen, "landlock: rule for %s: %s", dir, strerror(e)); return -1; }
    return 0;
}
#endif

#ifdef SYS_landlock_create_ruleset
/* Landlock binds the thread that calls landlock_restrict_self (and threads
 * it creates later), so each thread that exists already is sent LL_SIGNAL
 * and restricts itself in the handler; the caller goes last. */
#define LL_MAX_THREADS 4096
static int ll_ruleset = -1;
static atomic_int ll_acked;
static atomic_int ll_tid[LL_MAX_THREADS]; /* who answered: tid, negated if it failed */
static int ll_errno[LL_MAX_THREADS];

static void ll_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig; (void)uc;
    if (si->si_code != SI_TKILL || si->si_pid != getpid()) return; /* not ours */
    int e = errno;
    long rc = syscall(SYS_landlock_restrict_self, ll_ruleset, 0);
    int i = atomic_fetch_add(&ll_acked, 1);
    if (i < LL_MAX_THREADS) {
        ll_errno[i] = rc < 0 ? errno : 0;
        /* release: ll_errno[i] is seen by whoever reads this tid */
        atomic_store_explicit(&ll_tid[i], rc < 0 ? -gettid() : gettid(), memory_order_release);
    }
    errno = e;
}

static int ll_answered(pid_t tid, int n)
{
    for (int i = 0; i < n && i < LL_MAX_THREADS; i++) {
        int t = atomic_load_explicit(&ll_tid[i], memory_order_acquire);
        if (t == tid || t == -tid) return 1;
    }
    return 0;
}

/* Every thread but the caller restricts itself; returns threads confined or -1. */
static int ll_all_threads(int rs, char *err, size_t errlen)
{
    static pid_t sent[LL_MAX_THREADS];
    int n_sent = 0, rc = 0;
    const int sig = SIGRTMIN + 5;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = ll_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&sa.sa_mask);
    ll_ruleset = rs;
    atomic_store(&ll_acked, 0);
    if (sigaction(sig, &sa, &old) < 0) { snprintf(err, errlen, "landlock: sigaction: %s", strerror(errno)); return -1; }
    pid_t pid = getpid(), me = gettid();
    /* Until a pass over /proc/self/task finds no thread not yet asked: a
     * thread created meanwhile by one not yet confined shows up in the next. */
    for (int pass = 0; rc == 0; pass++) {
        DIR *d = opendir("/proc/self/task");
        if (!d) { snprintf(err, errlen, "landlock: cannot list /proc/self/task: %s", strerror(errno)); rc = -1; break; }
        int added = 0;
        struct dirent *de;
        while ((de = readdir(d)) && rc == 0) {
            if (de->d_name[0] == '.') continue;
            pid_t tid = (pid_t)strtol(de->d_name, NULL, 10);
            int known = tid == me;
            for (int i = 0; i < n_sent && !known; i++) known = sent[i] == tid;
            if (known) continue;
            if (n_sent == LL_MAX_THREADS) { snprintf(err, errlen, "landlock: too many threads"); rc = -1; break; }
            if (syscall(SYS_tgkill, pid, tid, sig) == 0) { sent[n_sent++] = tid; added++; }
            else if (errno != ESRCH) { snprintf(err, errlen, "landlock: tgkill %d: %s", (int)tid, strerror(errno)); rc = -1; }
        }
        closedir(d);
        if (rc < 0 || (!added && pass > 0)) break;
        /* every thread asked answers, or is gone */
        struct timespec t0, now, nap = { 0, 1000000 };
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            int n = atomic_load(&ll_acked), waiting = 0;
            for (int i = 0; i < n_sent; i++)
                if (!ll_answered(sent[i], n) && syscall(SYS_tgkill, pid, sent[i], 0) == 0) waiting = sent[i];
            if (!waiting) break;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec > 30) { /* a busy thread answers late, one blocking the signal never */
                snprintf(err, errlen, "landlock: thread %d did not confine itself within 30 s (signal %d blocked?)",
                         (int)waiting, sig);
                rc = -1;
                break;
            }
            nanosleep(&nap, NULL);
        }
        if (!added) break;
    }
    int n = atomic_load(&ll_acked);
    for (int i = 0; rc == 0 && i < n && i < LL_MAX_THREADS; i++) {
        int t = atomic_load_explicit(&ll_tid[i], memory_order_acquire);
        if (t < 0) {
            snprintf(err, errlen, "landlock_restrict_self in thread %d: %s", -t, strerror(ll_errno[i]));
            rc = -1;
        }
    }
    sigaction(sig, &old, NULL);
    ll_ruleset = -1;
    return rc < 0 ? -1 : n;
}
#endif

int priv_landlock(const char *log_file, const char *const *remove, int n_remove, int *n_threads,
                  char *err, size_t errlen)
{
    *n_threads = 0;
#ifndef SYS_landlock_create_ruleset
    (void)log_file; (void)remove; (void)n_remove; (void)err; (void)errlen;
    return 0;
#else
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 1) return 0; /* not built in or disabled: nothing to do */
    struct landlock_ruleset_attr ra = { .handled_access_fs = (1ull << 13) - 1 /* ABI 1 */ };
    if (abi >= 2) ra.handled_access_fs |= LANDLOCK_ACCESS_FS_REFER;
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
    if (abi >= 3) ra.handled_access_fs |= LANDLOCK_ACCESS_FS_TRUNCATE;
#endif
    int rs = (int)syscall(SYS_landlock_create_ruleset, &ra, sizeof ra, 0);
    if (rs < 0) { snprintf(err, errlen, "landlock_create_ruleset: %s", strerror(errno)); return -1; }
    int rc = 0;
    if (log_file)
        rc = ll_rule(rs, log_file, LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_MAKE_REG, err, errlen);
    for (int i = 0; i < n_remove && rc == 0; i++)
        if (remove[i]) rc = ll_rule(rs, remove[i], LANDLOCK_ACCESS_FS_REMOVE_FILE, err, errlen);
    int others = rc == 0 ? ll_all_threads(rs, err, errlen) : -1;
    if (others < 0) rc = -1;
    else if (syscall(SYS_landlock_restrict_self, rs, 0) < 0) {
        snprintf(err, errlen, "landlock_restrict_self: %s", strerror(errno));
        rc = -1;
    } else {
        *n_threads = others + 1;
    }
    close(rs);
    return rc < 0 ? -1 : (int)abi;
#endif
}

/* ---------------------------------------------------------------- peers */

static int list_add(unsigned **v, size_t *n, unsigned x)
{
    for (size_t i = 0; i < *n; i++)
        if ((*v)[i] == x) return 0;
    unsigned *nv = realloc(*v, (*n + 1) * sizeof *nv);
    if (!nv) return -1;
    nv[(*n)++] = x;
    *v = nv;
    return 0;
}

static int list_has(const unsigned *v, size_t n, unsigned x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

/* A user or group for --allow-user/--allow-group: id is its id when the name
 * was found (named), else s must be a number. */
static int acl_add_id(unsigned **v, size_t *n, int named, unsigned long id, const char *s, const char *what,
                      char *err, size_t errlen)
{
    if (!named && parse_id(s, &id) < 0) { snprintf(err, errlen, "--allow-%s: no %s '%s'", what, what, s); return -1; }
    if (list_add(v, n, (unsigned)id) < 0) { snprintf(err, errlen, "out of memory"); return -1; }
    return 0;
}

int acl_add_user(acl *a, const char *s, char *err, size_t errlen)
{
    struct passwd *pw = getpwnam(s);
    return acl_add_id(&a->uids, &a->n_uids, pw != NULL, pw ? pw->pw_uid : 0, s, "user", err, errlen);
}

int acl_add_group(acl *a, const char *s, char *err, size_t errlen)
{
    struct group *gr = getgrnam(s);
    return acl_add_id(&a->gids, &a->n_gids, gr != NULL, gr ? gr->gr_gid : 0, s, "group", err, errlen);
}

int acl_add_uid(acl *a, uid_t uid)
{
    return list_add(&a->uids, &a->n_uids, (unsigned)uid);
}

int acl_allows(const acl *a, int fd, const sock_peer *p)
{
    if (list_has(a->uids, a->n_uids, (unsigned)p->uid)) return 1;
    if (!a->n_gids) return 0;
    if (list_has(a->gids, a->n_gids, (unsigned)p->gid)) return 1;
    /* The peer's supplementary groups as they were at connect(2). */
    gid_t g[256];
    socklen_t len = sizeof g;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) return 0; /* ERANGE: > 256 groups */
    for (size_t i = 0; i < len / sizeof g[0]; i++)
        if (list_has(a->gids, a->n_gids, (unsigned)g[i])) return 1;
    return 0;
}

void acl_free(acl *a)
{
    if (!a) return;
    free(a->uids);
    free(a->gids);
    a->uids = a->gids = NULL;
    a->n_uids = a->n_gids = 0;
}

/* ---------------------------------------------------------------- systemd */

static int notify_fd = -1;
static struct sockaddr_un notify_sa;
static socklen_t notify_len;

int notify_open(void)
{
    const char *p = getenv("NOTIFY_SOCKET");
    if (!p || !*p) return 0;
    size_t n = strlen(p);
    if ((p[0] != '/' && p[0] != '@') || n >= sizeof notify_sa.sun_path) {
        log_warn("NOTIFY_SOCKET '%s' is not a Unix socket path; not notifying", p);
        unsetenv("NOTIFY_SOCKET");
        return -1;
    }
    memset(&notify_sa, 0, sizeof notify_sa);
    notify_sa.sun_family = AF_UNIX;
    memcpy(notify_sa.sun_path, p, n);
    if (p[0] == '@') notify_sa.sun_path[0] = '\0'; /* abstract namespace */
    notify_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (p[0] == '/'));
    /* Opened now: after the drop and under the filter, socket() is gone. */
    notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    unsetenv("NOTIFY_SOCKET");
    if (notify_fd < 0) { log_warn("NOTIFY_SOCKET: socket: %s", strerror(errno)); return -1; }
    return 1;
}

void notify_send(const char *fmt, ...)
{
    if (notify_fd < 0) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    if (sendto(notify_fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT,
               (struct sockaddr *)&notify_sa, notify_len) < 0)
        log_debug("sd_notify: %s", strerror(errno));
}

void notify_close(void)
{
    if (notify_fd >= 0) close(notify_fd);
    notify_fd = -1;
}
