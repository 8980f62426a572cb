/* pool.c — worker threads that spin briefly on a generation counter, then
 * sleep on a condition variable; work items are handed out with an atomic
 * counter so uneven items balance themselves. */
#include "engine/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* Spin this many pause-loops (tens of microseconds) waiting for the next job
 * before sleeping: ops of one forward pass follow each other closely, and a
 * wake-up through the kernel costs more than the spin. */
#define POOL_SPIN 4000

struct pool {
    int n;                      /* threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;            /* bumped for every job */
    atomic_int next;            /* next item to take */
    atomic_int pending;         /* helper threads still inside the job */
    int stop;
    pool_fn fn;
    void *arg;
    int n_items;
};

typedef struct { pool *p; int ith; } pool_arg;

static void pool_work(pool *p, int ith)
{
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_items) break;
        p->fn(p->arg, i, ith);
    }
}

static void *pool_main(void *a)
{
    pool_arg *pa = a;
    pool *p = pa->p;
    int ith = pa->ith;
    free(pa);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < POOL_SPIN) { cpu_relax(); continue; }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
            int stop = p->stop;
            pthread_mutex_unlock(&p->mu);
            if (stop) return NULL;
            spins = 0;
        }
        seen = g;
        if (p->stop) return NULL;
        pool_work(p, ith);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

int pool_open(pool **out, int n_threads)
{
    pool *p = calloc(1, sizeof *p);
    if (!p) return -1;
    if (n_threads < 1) n_threads = 1;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->th = calloc((size_t)n_threads, sizeof *p->th);
    if (!p->th) { free(p); return -1; }
    for (int i = 1; i < n_threads; i++) {
        pool_arg *pa = malloc(sizeof *pa);
        if (!pa) { p->n = i; pool_close(p); return -1; }
        pa->p = p; pa->ith = i;
        if (pthread_create(&p->th[i], NULL, pool_main, pa) != 0) {
            free(pa); p->n = i; pool_close(p); return -1;
        }
    }
    *out = p;
    return 0;
}

void pool_close(pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->th);
    free(p);
}

int pool_size(const pool *p) { return p->n; }

void pool_run(pool *p, pool_fn fn, void *arg, int n)
{
    if (n <= 0) return;
    if (p->n == 1 || n == 1) {
        for (int i = 0; i < n; i++) fn(arg, i, 0);
        return;
    }
    p->fn = fn; p->arg = arg; p->n_items = n;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pool_work(p, 0);
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < POOL_SPIN) cpu_relax();
        else sched_yield();   /* a helper was descheduled: let it run */
    }
}
