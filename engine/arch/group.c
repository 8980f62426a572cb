/* group.c — a tensor-parallel group's passes (forward.h fw_join): rank 0
 * runs on the caller's thread, every other rank on a thread of its own,
 * each queueing the same ops on its backend, so that the backends'
 * all-reduces (NCCL's, which may wait on the host until every rank has
 * called) meet. The caller goes on when every rank has queued its part;
 * logits and ids are read from rank 0, whose results every rank shares
 * bit for bit (the all-reduces give all ranks the same sums).
 *
 * A rank must never block on another device's work before it has queued
 * the all-reduces that device waits for: a pass's set-up (the backend's
 * step_begin: uploads, scratch that grows, pinned buffers, whose frees wait
 * for every device) ends on every rank before any rank queues an op.
 *
 * A relay (a layer split over backends of different kinds: the CPU's
 * layers, then a GPU's) hands the residual stream over through host
 * memory: the sender's to_host (which waits for its device) into hand[s],
 * then the next stage's to_dev from there. Each pass hands over once a
 * boundary, and a job ends on every rank before the next starts, so one
 * buffer a boundary and a flag suffice. */
#include "engine/arch/arch.h"
#include "common/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { GJ_NONE = 0, GJ_PASS, GJ_ARGMAX, GJ_TAKE, GJ_STOP };

typedef struct gjob {
    int kind;
    const int32_t *tokens;
    const be_batch *bt;
    const int32_t *out_idx;
    int n_out;
    const uint32_t *mask;
} gjob;

typedef struct fw_rank {
    struct fw_group *g;
    fw *f;
    pthread_t th;
    int started;
    int32_t *ids;            /* GJ_TAKE's ids (BE_QUEUE_ROWS) */
} fw_rank;

struct fw_group {
    int n;                   /* ranks, rank 0 included */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;            /* bumped for each job */
    pthread_barrier_t set;   /* every rank's pass set up */
    int left;                /* ranks still on the current job */
    gjob job;
    float **hand;            /* relay: [n - 1] buffers of relay_n floats, stage s's x for s + 1 */
    int *full;               /* relay: hand[s] holds a pass's x not yet taken */
    size_t relay_n;
    pthread_cond_t handed;
    fw_rank r[];             /* [n]; r[0] is the caller's */
};

static void set_up(void *arg) { pthread_barrier_wait(arg); }

static void run_job(struct fw_group *g, fw *f, const gjob *j, int32_t *ids)
{
    switch (j->kind) {
    case GJ_PASS: fw_pass_one(f, j->tokens, j->bt, j->out_idx, j->n_out, set_up, &g->set); break;
    case GJ_ARGMAX: f->b->ops->argmax_queue(f->b, f->lg, j->n_out, f->m->hp.n_vocab, j->mask); break;
    case GJ_TAKE: f->b->ops->argmax_take(f->b, ids, j->n_out); break;
    default: break;
    }
}

static void *rank_main(void *arg)
{
    fw_rank *rk = arg;
    struct fw_group *g = rk->g;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->gen == seen) pthread_cond_wait(&g->go, &g->mu);
        seen = g->gen;
        gjob j = g->job;
        pthread_mutex_unlock(&g->mu);
        if (j.kind != GJ_STOP) run_job(g, rk->f, &j, rk->ids);
        pthread_mutex_lock(&g->mu);
        if (--g->left == 0) pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
        if (j.kind == GJ_STOP) return NULL;
    }
}

/* j on every rank: the others on their threads, rank 0 here; returns when
 * all are done (ids: rank 0's GJ_TAKE) */
static void group_run(struct fw_group *g, const gjob *j, int32_t *ids)
{
    pthread_mutex_lock(&g->mu);
    g->job = *j;
    g->left = g->n - 1;
    g->gen++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    if (j->kind != GJ_STOP) run_job(g, g->r[0].f, j, ids);
    pthread_mutex_lock(&g->mu);
    while (g->left > 0) pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void group_free(struct fw_group *g, int started)
{
    if (started) {
        gjob stop = { .kind = GJ_STOP };
        /* (threads that did not start take no part: count only those that did) */
        pthread_mutex_lock(&g->mu);
        g->job = stop;
        g->left = started;
        g->gen++;
        pthread_cond_broadcast(&g->go);
        while (g->left > 0) pthread_cond_wait(&g->done, &g->mu);
        pthread_mutex_unlock(&g->mu);
    }
    for (int i = 1; i < g->n; i++) {
        if (g->r[i].started) pthread_join(g->r[i].th, NULL);
        free(g->r[i].ids);
        fw_close(g->r[i].f);
    }
    for (int i = 0; g->hand && i < g->n - 1; i++) free(g->hand[i]);
    free(g->hand);
    free(g->full);
    pthread_cond_destroy(&g->handed);
    pthread_barrier_destroy(&g->set);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

int fw_join(fw *const *fs, int n, size_t relay, char *err, size_t errlen)
{
    if (n < 2) return 0;
    struct fw_group *g = calloc(1, sizeof *g + (size_t)n * sizeof g->r[0]);
    if (!g) return err_set(err, errlen, "out of memory");
    g->n = n;
    if (pthread_barrier_init(&g->set, NULL, (unsigned)n)) {
        free(g);
        return err_set(err, errlen, "cannot set up the threads of %d GPUs", n);
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    pthread_cond_init(&g->handed, NULL);
    if (relay) {
        g->relay_n = relay;
        g->hand = calloc((size_t)n - 1, sizeof *g->hand);
        g->full = calloc((size_t)n - 1, sizeof *g->full);
        int ok = g->hand && g->full;
        for (int i = 0; ok && i < n - 1; i++) ok = (g->hand[i] = malloc(relay * sizeof(float))) != NULL;
        if (!ok) {
            group_free(g, 0);
            return err_set(err, errlen, "out of memory for the hand-over between the CPU and the GPU");
        }
    }
    int started = 0;
    for (int i = 0; i < n; i++) {
        g->r[i] = (fw_rank){ .g = g, .f = fs[i] };
        if (i && !(g->r[i].ids = malloc(BE_QUEUE_ROWS * sizeof(int32_t)))) break;
        if (i && pthread_create(&g->r[i].th, NULL, rank_main, &g->r[i]) != 0) break;
        g->r[i].started = i > 0;
        started += i > 0;
    }
    if (started < n - 1) {
        /* (the ranks stay the caller's to close) */
        for (int i = 1; i < n; i++) g->r[i].f = NULL;
        group_free(g, started);
        return err_set(err, errlen, "cannot start the threads of %d GPUs", n);
    }
    fs[0]->grp = g;
    for (int i = 0; relay && i < n; i++) fs[i]->relay = g;
    return 0;
}

void fw_send(fw *f, const float *x, size_t n, int to)
{
    struct fw_group *g = f->relay;
    if (!g) {
        f->b->ops->send(f->b, x, n, to);
        return;
    }
    if (n > g->relay_n) n = g->relay_n;   /* (never: passes are at most the relay's size) */
    f->b->ops->to_host(f->b, g->hand[to - 1], x, n * sizeof *x);
    pthread_mutex_lock(&g->mu);
    g->full[to - 1] = 1;
    pthread_cond_broadcast(&g->handed);
    pthread_mutex_unlock(&g->mu);
}

void fw_recv(fw *f, float *x, size_t n, int from)
{
    struct fw_group *g = f->relay;
    if (!g) {
        f->b->ops->recv(f->b, x, n, from);
        return;
    }
    if (n > g->relay_n) n = g->relay_n;
    pthread_mutex_lock(&g->mu);
    while (!g->full[from]) pthread_cond_wait(&g->handed, &g->mu);
    pthread_mutex_unlock(&g->mu);
    f->b->ops->to_dev(f->b, x, g->hand[from], n * sizeof *x);
    pthread_mutex_lock(&g->mu);
    g->full[from] = 0;
    pthread_mutex_unlock(&g->mu);
}

void fw_group_pass(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    gjob j = { .kind = GJ_PASS, .tokens = tokens, .bt = bt, .out_idx = out_idx, .n_out = n_out };
    group_run(f->grp, &j, NULL);
}

void fw_group_argmax(fw *f, int n_out, const uint32_t *mask)
{
    gjob j = { .kind = GJ_ARGMAX, .n_out = n_out, .mask = mask };
    group_run(f->grp, &j, NULL);
}

void fw_group_take(fw *f, int32_t *ids, int n_out)
{
    gjob j = { .kind = GJ_TAKE, .n_out = n_out };
    group_run(f->grp, &j, ids);
}

fw *fw_group_out(fw *f)
{
    struct fw_group *g = f->grp;
    return f->m->n_stages > 1 ? g->r[g->n - 1].f : f;
}

void fw_group_close(fw *f)
{
    if (!f->grp) return;
    group_free(f->grp, f->grp->n - 1);
    f->grp = NULL;
}
