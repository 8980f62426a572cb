/* sprof.so — where a CPU program's time goes, for machines without perf.
 * LD_PRELOAD it with SPROF=FILE: SIGPROF every millisecond of the
 * process's CPU time (all threads) records the interrupted instruction; at
 * exit FILE gets one line per distinct address: count, offset in its
 * object, object path. sprof.py turns that into time per function.
 *   make sprof
 *   SPROF=/tmp/p.txt LD_PRELOAD=bin/sprof.so bin/anebench --model M --threads 16 --gen 1
 *   python3 tests/bench/sprof/sprof.py /tmp/p.txt */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
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

__attribute__((constructor)) static void sprof_start(void)
{
    if (!getenv("SPROF") || !(pcs = malloc(MAX_SAMPLES * sizeof *pcs))) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = { { 0, 1000 }, { 0, 1000 } };
    setitimer(ITIMER_PROF, &it, NULL);
}

static int by_pc(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

__attribute__((destructor)) static void sprof_stop(void)
{
    if (!pcs) return;
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_PROF, &off, NULL);
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
