/* pool.c — worker threads that spin briefly on a generation counter, then
 * sleep on a condition variable; work items are handed out with an atomic
 * counter so uneven items balance themselves.
 *
 * The job waits for its items, not for the threads: the caller returns as
 * soon as every item is done, so a helper that was descheduled (a busy
 * machine) and never took an item costs nothing. Items are claimed with a
 * compare-and-swap on (generation, next item), so a helper that wakes late
 * can never run an item of a job that has moved on. */
#include "engine/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
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
    _Atomic uint64_t work;      /* generation << 32 | next item to take */
    atomic_int done;            /* items finished in the current job */
    atomic_int stop;
    _Atomic(pool_fn) fn;        /* the current job; written only while no item is left */
    _Atomic(void *) arg;
    atomic_int n_items;
};

typedef struct { pool *p; int ith; } pool_arg;

/* Runs items of generation g until none is left or the job has changed. */
static void pool_work(pool *p, uint32_t g, int ith)
{
    pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
    void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
    int n = atomic_load_explicit(&p->n_items, memory_order_relaxed);
    uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(w >> 32) != g || (uint32_t)w >= (uint32_t)n) return;
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(arg, (int)(uint32_t)w, ith);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        w = atomic_load_explicit(&p->work, memory_order_acquire);
    }
}

static void *pool_main(void *a)
{
    pool_arg *pa = a;
    pool *p = pa->p;
    int ith = pa->ith;
    free(pa);
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = (uint32_t)(atomic_load_explicit(&p->work, memory_order_acquire) >> 32)) == seen) {
            if (++spins < POOL_SPIN) { cpu_relax(); continue; }
            pthread_mutex_lock(&p->mu);
            while ((uint32_t)(atomic_load(&p->work) >> 32) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            int stop = atomic_load(&p->stop);
            pthread_mutex_unlock(&p->mu);
            if (stop) return NULL;
            spins = 0;
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        pool_work(p, g, ith);
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
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->work, (uint64_t)1 << 32);
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
    /* The previous job is complete (all its items done). First a generation
     * with no item to take, so that a helper reading the fields below while
     * they change can claim nothing; then the job's own generation. */
    uint64_t w = atomic_load_explicit(&p->work, memory_order_relaxed);
    uint32_t g = (uint32_t)(w >> 32) + 2;
    atomic_store_explicit(&p->work, (uint64_t)(g - 1) << 32 | UINT32_MAX, memory_order_seq_cst);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->n_items, n, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->work, (uint64_t)g << 32, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pool_work(p, g, 0);
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n; spins++) {
        if (spins < POOL_SPIN) cpu_relax();
        else sched_yield();   /* a helper holding an item was descheduled: let it run */
    }
}
