/* pool.h — a fixed set of worker threads for data-parallel ops (engine-internal).
 * Created once with the engine; pool_run never allocates or creates threads,
 * so it is safe on the per-token path. Only one thread (the engine worker)
 * calls pool_run at a time. */
#ifndef ANE_POOL_H
#define ANE_POOL_H

typedef struct pool pool;
/* fn(arg, i, n) is called for i = 0..n-1 split over the threads;
 * `ith` is the calling thread's index (0..pool_size-1) for per-thread scratch. */
typedef void (*pool_fn)(void *arg, int i, int ith);

int pool_open(pool **out, int n_threads);   /* n_threads >= 1 (the caller counts as one) */
void pool_close(pool *p);
int pool_size(const pool *p);
/* Runs fn for every i in [0, n); returns when all are done. */
void pool_run(pool *p, pool_fn fn, void *arg, int n);

#endif
