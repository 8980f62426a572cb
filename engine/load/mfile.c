/* mfile.c — opening model files without blocking, and watching the mapped
 * ones (see mfile.h). */
#include "engine/load/mfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *kind_of(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

int mf_open(const char *path, struct stat *st, char *err, size_t errlen)
{
    /* stat first: opening a device can itself do something */
    if (stat(path, st) != 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(err, errlen, "%s: is %s, expected a regular file", path, kind_of(st->st_mode));
        return -1;
    }
    /* O_NONBLOCK: the path may have become a FIFO since, and open() would wait for a writer */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    int fl;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || (fl = fcntl(fd, F_GETFL)) < 0 ||
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        snprintf(err, errlen, "%s: is %s, expected a regular file", path, kind_of(st->st_mode));
        close(fd);
        return -1;
    }
    return fd;
}

int mf_read(const char *path, size_t max, int optional, char **buf, size_t *len, char *err, size_t errlen)
{
    *buf = NULL;
    *len = 0;
    struct stat st;
    if (optional && stat(path, &st) != 0 && errno == ENOENT) return 1;
    int fd = mf_open(path, &st, err, errlen);
    if (fd < 0) return -1;
    if ((uint64_t)st.st_size > max) {
        snprintf(err, errlen, "%s: %lld bytes, expected at most %zu", path, (long long)st.st_size, max);
        close(fd);
        return -1;
    }
    size_t cap = (size_t)st.st_size, n = 0;
    char *b = malloc(cap + 1);
    if (!b) { close(fd); snprintf(err, errlen, "%s: out of memory", path); return -1; }
    while (n < cap) {
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
            free(b);
            close(fd);
            return -1;
        }
        if (r == 0) break;   /* shrank meanwhile: what is there */
        n += (size_t)r;
    }
    close(fd);
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

/* ---- the SIGBUS guard ------------------------------------------------------
 * A fixed table, read by the handler without locks: a slot is live while hi
 * is non-zero. Slots are taken and given back under mu. */

#define MF_SLOTS 4096

static struct {
    _Atomic uintptr_t lo, hi;    /* page-rounded range of the mapping */
    atomic_int hit;              /* a read faulted: zero pages were put there */
} slots[MF_SLOTS];
static unsigned char slot_used[MF_SLOTS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct sigaction prev_act;
static int installed;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    uintptr_t a = (uintptr_t)si->si_addr;
    if (si->si_code > 0) {   /* raised by a fault, not sent */
        for (int i = 0; i < MF_SLOTS; i++) {
            uintptr_t hi = atomic_load(&slots[i].hi), lo = atomic_load(&slots[i].lo);
            if (!hi || a < lo || a >= hi) continue;
            /* the raw call: no interposed mmap (sanitizers) inside a handler */
            long r = syscall(SYS_mmap, (void *)lo, (size_t)(hi - lo), PROT_READ,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0L);
            if (r != -1) {
                atomic_store(&slots[i].hit, 1);
                errno = saved;
                return;   /* the read is retried, and finds zeros */
            }
            break;
        }
    }
    errno = saved;
    if ((prev_act.sa_flags & SA_SIGINFO) && prev_act.sa_sigaction) {
        prev_act.sa_sigaction(sig, si, uc);
        return;
    }
    if (!(prev_act.sa_flags & SA_SIGINFO) && prev_act.sa_handler != SIG_DFL && prev_act.sa_handler != SIG_IGN) {
        prev_act.sa_handler(sig);
        return;
    }
    /* the default action: a fault retried after return kills with SIGBUS;
     * a sent one is sent again */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    if (si->si_code <= 0) raise(SIGBUS);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    installed = sigaction(SIGBUS, &sa, &prev_act) == 0;
}

int mf_map_fd(mf_map *m, int fd, const struct stat *st, const char *path, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->fd = -1;
    m->slot = -1;
    m->size = (size_t)st->st_size;
    m->dev = st->st_dev;
    m->ino = st->st_ino;
    m->mtime = st->st_mtim;
    m->path = strdup(path);
    if (!m->path) { close(fd); snprintf(err, errlen, "%s: out of memory", path); return -1; }
    pthread_once(&once, install);
    if (!installed) {
        close(fd);
        snprintf(err, errlen, "%s: cannot install the SIGBUS handler: %s", path, strerror(errno));
        return -1;
    }
    void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    m->map = p;
    m->fd = fd;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MF_SLOTS && m->slot < 0; i++)
        if (!slot_used[i]) {
            slot_used[i] = 1;
            m->slot = i;
            atomic_store(&slots[i].hit, 0);
            atomic_store(&slots[i].lo, (uintptr_t)p);
            atomic_store(&slots[i].hi, (uintptr_t)p + (m->size + pg - 1) / pg * pg);
        }
    pthread_mutex_unlock(&mu);
    if (m->slot < 0) {
        snprintf(err, errlen, "%s: more than %d model files mapped at once", path, MF_SLOTS);
        mf_unmap(m);
        return -1;
    }
    return 0;
}

void mf_unmap(mf_map *m)
{
    if (!m->path) return;   /* zeroed, or unmapped already */
    if (m->slot >= 0) {
        pthread_mutex_lock(&mu);
        atomic_store(&slots[m->slot].hi, 0);
        atomic_store(&slots[m->slot].lo, 0);
        slot_used[m->slot] = 0;
        pthread_mutex_unlock(&mu);
        m->slot = -1;
    }
    if (m->map) munmap((void *)m->map, m->size);
    m->map = NULL;
    if (m->fd >= 0) close(m->fd);
    m->fd = -1;
    free(m->path);
    m->path = NULL;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mf_check(mf_map *m, int quick, char *why, size_t n)
{
    if (!m->map) return MF_SAME;
    if (m->slot >= 0 && atomic_load(&slots[m->slot].hit)) {
        snprintf(why, n, "model file %s changed on disk after load (a read past its new end)", m->path);
        return MF_CHANGED;
    }
    struct stat st;
    if (fstat(m->fd, &st) == 0) {
        if ((size_t)st.st_size != m->size) {
            snprintf(why, n, "model file %s changed on disk after load (%lld bytes, was %zu)", m->path,
                     (long long)st.st_size, m->size);
            return MF_CHANGED;
        }
        if (st.st_mtim.tv_sec != m->mtime.tv_sec || st.st_mtim.tv_nsec != m->mtime.tv_nsec) {
            snprintf(why, n, "model file %s changed on disk after load (modified)", m->path);
            return MF_CHANGED;
        }
    }
    /* a rename over it or a removal leaves the mapped file whole: told, not urgent */
    long long now = now_ms();
    if (quick && now < atomic_load(&m->path_due)) return MF_SAME;
    atomic_store(&m->path_due, now + 1000);
    if (stat(m->path, &st) == 0) {
        if (st.st_dev != m->dev || st.st_ino != m->ino) {
            snprintf(why, n, "model file %s was replaced on disk after load", m->path);
            return MF_REPLACED;
        }
    } else if (errno == ENOENT) {
        snprintf(why, n, "model file %s was removed after load", m->path);
        return MF_REPLACED;
    }
    return MF_SAME;
}
