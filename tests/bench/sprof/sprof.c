/* sprof.so — where a CPU program's time goes, for machines without perf.
 * LD_PRELOAD it with SPROF=FILE: every millisecond a sampler thread sends
 * SIGPROF to each of the program's threads (pthread_create is wrapped to
 * know them), whose handler records the interrupted instruction: wall
 * time, so a thread waiting at a barrier is seen waiting. (A sampler
 * thread, not ITIMER_PROF: some sandboxed kernels never deliver that.) At
 * exit FILE gets one line per distinct address: count, offset in its
 * object, object path. sprof.py turns that into time per function.
 *   make sprof
 *   SPROF=/tmp/p.txt LD_PRELOAD=$PWD/bin/sprof.so bin/anebench --model M --threads 16 --gen 1
 *   python3 tests/bench/sprof/sprof.py /tmp/p.txt */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <ucontext.h>

#define MAX_SAMPLES (1u << 23)

static uintptr_t *pcs;
static atomic_uint n_pcs;

static void on_prof(int sig, siginfo_t *si, void *ctx)
{
    (void)sig; (void)si;
    const ucontext_t *u = ctx;
#if defined(__x86_64__)
    uintptr_t pc = (uintptr_t)u->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    uintptr_t pc = (uintptr_t)u->uc_mcontext.pc;
#else
    uintptr_t pc = 0;
    (void)u;
#endif
    unsigned i = atomic_fetch_add_explicit(&n_pcs, 1, memory_order_relaxed);
    if (i < MAX_SAMPLES) pcs[i] = pc;
}

#define MAX_THREADS 1024
static pid_t threads[MAX_THREADS];   /* kernel thread ids */
static atomic_int n_threads, stopping;
static pthread_t sampler;
typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static create_fn real_create;

static void add_thread(void)
{
    int i = atomic_fetch_add(&n_threads, 1);
    if (i < MAX_THREADS) threads[i] = (pid_t)syscall(SYS_gettid);
}

typedef struct start { void *(*fn)(void *); void *arg; } start;

static void *wrapped(void *p)
{
    start s = *(start *)p;
    free(p);
    add_thread();
    return s.fn(s.arg);
}

static void resolve(void)
{
    if (!real_create) real_create = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
}

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    resolve();
    start *s = pcs ? malloc(sizeof *s) : NULL;
    if (!s) return real_create(t, a, fn, arg);
    s->fn = fn;
    s->arg = arg;
    return real_create(t, a, wrapped, s);
}

/* by kernel thread id: one that has ended is refused (ESRCH), where
 * pthread_kill on its handle would read freed memory */
static void *sample_loop(void *arg)
{
    (void)arg;
    const struct timespec ms = { 0, 1000000 };
    const pid_t pid = getpid();
    while (!atomic_load(&stopping)) {
        int n = atomic_load(&n_threads);
        for (int i = 0; i < n && i < MAX_THREADS; i++) syscall(SYS_tgkill, pid, threads[i], SIGPROF);
        nanosleep(&ms, NULL);
    }
    return NULL;
}

__attribute__((constructor)) static void sprof_start(void)
{
    if (!getenv("SPROF") || !(pcs = malloc(MAX_SAMPLES * sizeof *pcs))) return;
    resolve();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, NULL);
    add_thread();
    if (real_create(&sampler, NULL, sample_loop, NULL)) return;
    /* above the program's threads where allowed: with every core busy an
     * ordinary sampler runs late and busy periods go unsampled */
    struct sched_param sp = { .sched_priority = 1 };
    if (pthread_setschedparam(sampler, SCHED_FIFO, &sp))
        fprintf(stderr, "sprof: the sampler runs at normal priority: with every core busy, busy time is undersampled\n");
}

static int by_pc(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

__attribute__((destructor)) static void sprof_stop(void)
{
    if (!pcs) return;
    atomic_store(&stopping, 1);
    pthread_join(sampler, NULL);
    signal(SIGPROF, SIG_IGN);
    unsigned n = atomic_load(&n_pcs);
    if (n > MAX_SAMPLES) n = MAX_SAMPLES;
    FILE *f = fopen(getenv("SPROF"), "w");
    if (!f) return;
    qsort(pcs, n, sizeof *pcs, by_pc);
    for (unsigned i = 0, j; i < n; i = j) {
        for (j = i; j < n && pcs[j] == pcs[i]; j++) {}
        Dl_info d;
        if (dladdr((void *)pcs[i], &d) && d.dli_fname)
            fprintf(f, "%u %lx %s\n", j - i, (unsigned long)(pcs[i] - (uintptr_t)d.dli_fbase), d.dli_fname);
        else
            fprintf(f, "%u %lx ?\n", j - i, (unsigned long)pcs[i]);
    }
    fclose(f);
}
