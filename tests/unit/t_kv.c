/* t_kv — the KV pool as sequences use it: the default context and pool,
 * pages taken as a sequence grows (a job holds what its tokens need, not
 * what max_tokens could reach), a full pool preempting the youngest job
 * with unchanged results, and the sliding-window layers' rings (gemma3,
 * gpt-oss): the same logits and ids as every position kept, past many
 * turns of the ring, with KV for those layers that does not grow. */
#include "engine/arch/forward.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/load/model.h"
#include "engine/pool.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define M(f) FIXTURE("models/" f)
#define MAXG 2048

typedef struct kres {
    int32_t ids[MAXG];
    int n;
    int done, error;
    char msg[256];
    /* eval: top-1 id and logit per position */
    int32_t top_id[MAXG];
    float top_val[MAXG];
    int n_pos;
} kres;

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static eng *kv_open(const char *path, int max_seqs, int n_ctx, size_t budget, int swa_full)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = path;
    o.n_threads = 2;
    o.max_seqs = max_seqs;
    o.n_ctx = n_ctx;
    o.kv_budget = budget;
    o.swa_full = swa_full;
    o.backend = "cpu";
    if (eng_open(&e, &o, err, sizeof err)) {
        CHECKF(0, "%s: %s", path, err);
        return NULL;
    }
    return e;
}

/* Pumps events until `until` of the n jobs (user = index) ended. */
static void kpump(eng *e, kres *r, int n, int until, double timeout_ms)
{
    int ended = 0;
    for (int i = 0; i < n; i++) ended += r[i].done || r[i].error;
    for (double end = ms_now() + timeout_ms; ended < until && ms_now() < end;) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(200); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            kres *x = &r[(intptr_t)ev->user];
            if (ev->type == ENG_EV_TOKEN && x->n < MAXG) x->ids[x->n++] = ev->token;
            else if (ev->type == ENG_EV_LOGITS && ev->pos >= 0 && ev->pos < MAXG && ev->n_top > 0) {
                x->top_id[ev->pos] = ev->top_ids[0];
                x->top_val[ev->pos] = ev->top_logits[0];
                x->n_pos++;
            } else if (ev->type == ENG_EV_DONE) {
                x->done = 1;
                ended++;
            } else if (ev->type == ENG_EV_ERROR) {
                x->error = 1;
                snprintf(x->msg, sizeof x->msg, "%s", ev->message);
                ended++;
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
}

static int ksubmit(eng *e, eng_job_kind kind, const int32_t *toks, int n, int max_tokens, intptr_t user,
                   uint64_t *id)
{
    eng_job_desc d = { 0 };
    char err[256];
    eng_err code;
    uint64_t tmp;
    d.kind = kind;
    d.tokens = toks;
    d.n_tokens = (size_t)n;
    d.max_tokens = max_tokens;
    d.top_n = 1;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    d.user = (void *)user;
    int rc = eng_submit(e, &d, id ? id : &tmp, &code, err, sizeof err);
    CHECKF(rc == 0, "submit: %s", err);
    return rc;
}

/* A prompt of n tokens: BOS, then ids spread over the vocabulary. */
static int32_t *prompt_of(int n, int n_vocab, uint32_t seed)
{
    int32_t *p = malloc((size_t)n * sizeof *p);
    if (!p) return NULL;
    p[0] = 1;
    for (int i = 1; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (int32_t)(3 + (seed >> 8) % (uint32_t)(n_vocab - 3));
    }
    return p;
}

/* The default context is the model's trained one (131072 for llama3-tiny,
 * past the old 4096 cap) and the pool holds at most max_seqs of them. */
static void test_default_ctx(void)
{
    eng *e = kv_open(M("llama3-tiny.bf16.gguf"), 2, 0, 0, 0);
    if (!e) return;
    const eng_model_info *mi = eng_model(e);
    CHECKF(mi->n_ctx == mi->n_ctx_train && mi->n_ctx == 131072, "n_ctx %d, trained %d", mi->n_ctx, mi->n_ctx_train);
    CHECKF(mi->kv_pool_tokens >= (uint64_t)mi->n_ctx && mi->kv_pool_tokens <= 2 * (uint64_t)mi->n_ctx,
           "pool %llu tokens", (unsigned long long)mi->kv_pool_tokens);
    CHECK(mi->swa_ring == 0);
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK(st.kv_total == mi->kv_bytes && st.kv_total > 0);
    eng_close(e);
    /* a budget below the trained context, no --ctx: the context is what the pool holds */
    e = kv_open(M("llama3-tiny.bf16.gguf"), 2, 0, (size_t)1 << 20, 0);
    if (!e) return;
    mi = eng_model(e);
    CHECKF(mi->n_ctx < 131072 && (uint64_t)mi->n_ctx == mi->kv_pool_tokens, "n_ctx %d, pool %llu", mi->n_ctx,
           (unsigned long long)mi->kv_pool_tokens);
    eng_close(e);
    /* with --ctx, a budget below it is an error that says so */
    char err[512];
    eng *bad = NULL;
    eng_opts o = { 0 };
    o.model_path = M("llama3-tiny.bf16.gguf");
    o.n_threads = 1;
    o.n_ctx = 65536;
    o.kv_budget = (size_t)1 << 20;
    CHECK(eng_open(&bad, &o, err, sizeof err) != 0 && bad == NULL);
    CHECKF(strstr(err, "below one full context") && strstr(err, "--kv-budget"), "%s", err);
}

/* A job that may run to 100000 tokens holds the pages of the tokens it has:
 * the pool's peak use after 30 of them is a few pages, not 100000 tokens'. */
static void test_lazy_pages(void)
{
    eng *e = kv_open(M("llama3-tiny.bf16.gguf"), 1, 0, 0, 0);
    if (!e) return;
    int32_t bos = 1;
    kres *r = calloc(1, sizeof *r);
    uint64_t id;
    ksubmit(e, ENG_JOB_GENERATE, &bos, 1, 100000, 0, &id);
    for (double end = ms_now() + 20000; r->n < 30 && !r->done && !r->error && ms_now() < end;) kpump(e, r, 1, 1, 1);
    eng_cancel(e, id);
    kpump(e, r, 1, 1, 20000);
    CHECKF(r->n >= 30, "%d tokens", r->n);
    eng_stats st;
    eng_stats_get(e, &st);
    /* bytes per token of this model's KV, from the pool itself */
    double per_tok = (double)st.kv_total / (double)eng_model(e)->kv_pool_tokens;
    double held = (double)st.kv_peak / per_tok;
    fprintf(stderr, "  a job of max_tokens 100000 cancelled after %d tokens held at most %.0f tokens' pages\n", r->n,
            held);
    CHECKF(held >= r->n && held <= r->n + 64 + 16, "peak KV of %.0f tokens for a job of %d", held, r->n);
    CHECK_EQ_INT(st.kv_used, 0);
    free(r);
    eng_close(e);
}

/* Two jobs that together outgrow a small pool: the younger is preempted
 * when the older needs a page, computes its tokens again, and both end
 * with the ids each gives alone. */
static void test_grow_preempt(void)
{
    const int n_p = 120, gen = 130;   /* 250 tokens: 16 pages each; the pool 24 */
    eng *e = kv_open(M("llama3-tiny.bf16.gguf"), 2, 256, 0, 0);
    if (!e) return;
    int nv = eng_model(e)->n_vocab;
    size_t page = eng_model(e)->kv_bytes / eng_model(e)->kv_pool_tokens * 16;
    eng_close(e);
    int32_t *pa = prompt_of(n_p, nv, 7), *pb = prompt_of(n_p, nv, 8);
    kres *solo = calloc(2, sizeof *solo), *r = calloc(2, sizeof *r);
    if (!pa || !pb || !solo || !r) { CHECK(0); return; }
    e = kv_open(M("llama3-tiny.bf16.gguf"), 1, 256, 0, 0);
    if (!e) return;
    ksubmit(e, ENG_JOB_GENERATE, pa, n_p, gen, 0, NULL);
    kpump(e, solo, 2, 1, 60000);
    ksubmit(e, ENG_JOB_GENERATE, pb, n_p, gen, 1, NULL);
    kpump(e, solo, 2, 2, 60000);
    eng_close(e);
    CHECKF(solo[0].n == gen && solo[1].n == gen, "solo runs: %d, %d tokens", solo[0].n, solo[1].n);
    e = kv_open(M("llama3-tiny.bf16.gguf"), 2, 256, 24 * page, 0);
    if (!e) return;
    CHECK_EQ_INT(eng_model(e)->kv_pool_tokens, 24 * 16);
    eng_stats st0, st;
    eng_stats_get(e, &st0);
    ksubmit(e, ENG_JOB_GENERATE, pa, n_p, gen, 0, NULL);
    ksubmit(e, ENG_JOB_GENERATE, pb, n_p, gen, 1, NULL);
    kpump(e, r, 2, 2, 120000);
    eng_stats_get(e, &st);
    for (int i = 0; i < 2; i++) {
        CHECKF(r[i].done && r[i].n == gen, "job %d: done %d, %d tokens (%s)", i, r[i].done, r[i].n, r[i].msg);
        CHECKF(!memcmp(r[i].ids, solo[i].ids, sizeof(int32_t) * (size_t)gen), "job %d: ids differ from its solo run", i);
    }
    CHECKF(st.evictions > st0.evictions, "no job was preempted (%llu)", (unsigned long long)st.evictions);
    CHECK(st.kv_peak <= st.kv_total);
    CHECK_EQ_INT(st.kv_used, 0);
    eng_close(e);
    free(pa); free(pb); free(solo); free(r);
}

/* Sliding-window rings against every position kept (--swa-full): a long
 * prompt scored (eval, prompt chunks past the ring's length) and a long
 * greedy generation give the same logits and ids, bit for bit on the CPU;
 * the ring is shorter than the context; and what a sequence holds grows
 * only by the global layers' KV: the peak use of two generations of
 * different lengths, measured by the engine, differs by what the paged
 * (global) layers of those tokens take. */
static void ring_vs_full(const char *path, int n_global, int n_attn)
{
    const int n_eval = 1400, n_gen = 1500;
    eng *e[2];
    kres *r[2];
    for (int k = 0; k < 2; k++) {
        e[k] = kv_open(path, 2, 4096, 0, k);
        r[k] = calloc(4, sizeof *r[k]);
        if (!e[k] || !r[k]) { CHECK(0); return; }
    }
    const eng_model_info *mr = eng_model(e[0]), *mf = eng_model(e[1]);
    CHECKF(mr->swa_ring > 0 && mr->swa_ring < n_gen / 2 && mf->swa_ring == 0, "%s: rings %d, %d", path, mr->swa_ring,
           mf->swa_ring);
    int32_t *p = prompt_of(n_eval, mr->n_vocab, 11);
    int32_t bos = 1;
    for (int k = 0; k < 2; k++) {
        ksubmit(e[k], ENG_JOB_EVAL, p, n_eval, 0, 0, NULL);
        kpump(e[k], r[k], 4, 1, 120000);
        ksubmit(e[k], ENG_JOB_GENERATE, &bos, 1, 40, 1, NULL);
        kpump(e[k], r[k], 4, 2, 120000);
        ksubmit(e[k], ENG_JOB_GENERATE, &bos, 1, n_gen, 2, NULL);
        kpump(e[k], r[k], 4, 3, 300000);
    }
    CHECKF(r[0][0].done && r[0][0].n_pos == n_eval && r[1][0].n_pos == n_eval, "%s: eval %d %d positions", path,
           r[0][0].n_pos, r[1][0].n_pos);
    int same = 0;
    while (same < n_eval && r[0][0].top_id[same] == r[1][0].top_id[same] &&
           r[0][0].top_val[same] == r[1][0].top_val[same])
        same++;
    CHECKF(same == n_eval, "%s: eval logits differ from --swa-full at position %d (ring %d)", path, same, mr->swa_ring);
    for (int j = 1; j < 3; j++) {
        CHECKF(r[0][j].done && r[1][j].done && r[0][j].n == r[1][j].n, "%s job %d: %d vs %d tokens", path, j,
               r[0][j].n, r[1][j].n);
        CHECKF(!memcmp(r[0][j].ids, r[1][j].ids, sizeof(int32_t) * (size_t)r[0][j].n), "%s job %d: ids differ", path, j);
    }
    CHECKF(r[0][2].n > 2 * mr->swa_ring, "%s: a generation of %d tokens does not wrap the ring of %d", path,
           r[0][2].n, mr->swa_ring);
    int ring = mr->swa_ring, n_long = r[0][2].n + 1;
    for (int k = 0; k < 2; k++) eng_close(e[k]);
    /* peak use of a short and a long generation, each alone */
    size_t peak[2][2];
    for (int k = 0; k < 2; k++)
        for (int len = 0; len < 2; len++) {
            eng *x = kv_open(path, 2, 4096, 0, k);
            kres *q = calloc(1, sizeof *q);
            if (!x || !q) { CHECK(0); return; }
            ksubmit(x, ENG_JOB_GENERATE, &bos, 1, len ? n_gen : 200, 0, NULL);
            kpump(x, q, 1, 1, 300000);
            eng_stats st;
            eng_stats_get(x, &st);
            peak[k][len] = st.kv_peak;
            free(q);
            eng_close(x);
        }
    size_t grow_ring = peak[0][1] - peak[0][0], grow_full = peak[1][1] - peak[1][0];
    fprintf(stderr, "  %s: ring %d rows; peak KV for 200 / %d tokens: rings %zu / %zu, every position %zu / %zu bytes\n",
            path, ring, n_long, peak[0][0], peak[0][1], peak[1][0], peak[1][1]);
    CHECKF(grow_full > 0 && grow_ring * (size_t)n_attn == grow_full * (size_t)n_global,
           "%s: growth %zu with rings, %zu without (%d of %d layers global)", path, grow_ring, grow_full, n_global,
           n_attn);
    CHECK(peak[0][1] < peak[1][1]);
    free(p);
    for (int k = 0; k < 2; k++) free(r[k]);
}

static void swa_layers(const char *path, int *n_global, int *n_attn)
{
    char err[256];
    model *m = NULL;
    *n_global = *n_attn = 0;
    CHECKF(model_load(&m, path, err, sizeof err) == 0, "%s", err);
    if (!m) return;
    for (int l = 0; l < m->hp.n_layer; l++) {
        *n_attn += !m->layers[l].linear;
        *n_global += !m->layers[l].linear && !m->layers[l].swa;
    }
    model_free(m);
}

static void test_rings(void)
{
    const char *models[] = { M("gemma3-tiny.bf16.gguf"), M("gptoss-tiny.bf16.gguf") };
    for (int i = 0; i < 2; i++) {
        int g, a;
        swa_layers(models[i], &g, &a);
        CHECKF(g > 0 && g < a, "%s: %d of %d layers global", models[i], g, a);
        ring_vs_full(models[i], g, a);
    }
}

/* At the forward pass: with rings, the KV that fw_open allocates grows
 * with the pool's pages by the global layers' bytes only, and the rings
 * by max_seqs (counted through the backend's alloc). */
static size_t alloc_sum;
static const be_ops *alloc_real;
static void *count_alloc(be *b, size_t bytes)
{
    alloc_sum += bytes;
    return alloc_real->alloc(b, bytes);
}

static size_t kv_alloc(model *m, be *b, int n_pages, int max_seqs)
{
    char err[256];
    fw *f = NULL;
    alloc_sum = 0;
    CHECKF(fw_open(&f, m, b, 16, 2, n_pages, max_seqs, err, sizeof err) == 0, "%s", err);
    size_t kv = f ? fw_kv_bytes(f) : 0, all = alloc_sum;
    if (f) fw_close(f);
    (void)all;
    return kv;
}

static void test_ring_alloc(void)
{
    char err[256];
    pool *p;
    CHECK(pool_open(&p, 1) == 0);
    const char *models[] = { M("gemma3-tiny.bf16.gguf"), M("gptoss-tiny.bf16.gguf") };
    for (int i = 0; i < 2; i++) {
        model *m = NULL;
        CHECKF(model_load(&m, models[i], err, sizeof err) == 0, "%s", err);
        if (!m) continue;
        be *b;
        CHECK(be_cpu_open(&b, p, BE_KV_F16, err, sizeof err) == 0);
        be_ops counting = *b->ops;
        counting.alloc = count_alloc;
        alloc_real = b->ops;
        b->ops = &counting;
        int n_global = 0;
        for (int l = 0; l < m->hp.n_layer; l++) n_global += !m->layers[l].swa;
        size_t row = 2 * be_kv_bytes(BE_KV_F16, (size_t)m->hp.n_head_kv * m->hp.head_dim);   /* k and v */
        m->swa_ring = fw_swa_ring(m, b->ops, 16, 4096);
        CHECKF(m->swa_ring >= 8 + 15 && m->swa_ring % KV_PAGE == 0 && m->swa_ring < 64, "%s: ring %d", models[i],
               m->swa_ring);
        size_t a = kv_alloc(m, b, 24, 2), c = kv_alloc(m, b, 240, 2), d = kv_alloc(m, b, 24, 5);
        CHECKF(c - a == (size_t)(240 - 24) * KV_PAGE * row * (size_t)n_global, "%s: %zu more bytes for 216 pages",
               models[i], c - a);
        CHECKF(d - a == (size_t)3 * (size_t)m->swa_ring * row * (size_t)(m->hp.n_layer - n_global),
               "%s: %zu more bytes for 3 slots", models[i], d - a);
        CHECK(fw_kv_page_bytes(m, BE_KV_F16) == KV_PAGE * row * (size_t)n_global);
        /* and the estimate covers them */
        fw_mem est;
        fw_mem_estimate(m, BE_KV_F16, 240, 16, 2, 2, &est);
        CHECKF(est.kv == c, "%s: estimate %zu, allocated %zu", models[i], est.kv, c);
        m->swa_ring = 0;
        size_t full = kv_alloc(m, b, 24, 2);
        CHECK(full == (size_t)24 * KV_PAGE * row * (size_t)m->hp.n_layer);
        b->ops = alloc_real;
        b->ops->close(b);
        model_free(m);
    }
    pool_close(p);
}

/* The CPU's kv_store and attention_ex on a ring against the paged layout:
 * two sequences fed in chunks of 1..25 tokens (up to position 300: the
 * ring of 32 rows turns 9 times), a window of 8, each cache type, the
 * scalar reference and the SIMD path: the same outputs, bit for bit. */
static uint32_t rng = 12345;
static float frnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static void test_ring_ops(void)
{
    enum { NH = 4, NKV = 2, HD = 64, W = 8, RING = 32, CTX = 320, MAXC = 25 };
    char err[128];
    pool *p;
    CHECK(pool_open(&p, 2) == 0);
    const int kvts[] = { BE_KV_F32, BE_KV_F16, BE_KV_Q8_0 };
    for (int ki = 0; ki < 3; ki++)
        for (int scalar = 0; scalar < 2; scalar++) {
            be *b;
            CHECK(be_cpu_open(&b, p, kvts[ki], err, sizeof err) == 0);
            CHECK(b->ops->kv_ring == 1);
            be_cpu_scalar(b, scalar);
            size_t kvd = NKV * HD, n_pages = 2 * CTX / KV_PAGE;
            void *kp = b->ops->alloc(b, be_kv_bytes(kvts[ki], n_pages * KV_PAGE * kvd));
            void *vp = b->ops->alloc(b, be_kv_bytes(kvts[ki], n_pages * KV_PAGE * kvd));
            void *kr = b->ops->alloc(b, be_kv_bytes(kvts[ki], 2 * RING * kvd));
            void *vr = b->ops->alloc(b, be_kv_bytes(kvts[ki], 2 * RING * kvd));
            int32_t pages[2][CTX / KV_PAGE];
            for (int i = 0; i < CTX / KV_PAGE; i++) { pages[0][i] = 2 * i + 1; pages[1][i] = 2 * i; }
            int at[2] = { 0, 0 }, bad = 0, passes = 0;
            while ((at[0] < CTX - MAXC || at[1] < CTX - MAXC) && !bad) {
                int32_t pos[2 * MAXC], slot[2 * MAXC];
                const int32_t *pg[2 * MAXC];
                int T = 0;
                for (int sq = 0; sq < 2; sq++) {
                    int n = 1 + (int)((uint32_t)(frnd() * 1000 + 1000) % MAXC);
                    if (at[sq] + n > CTX) n = CTX - at[sq];
                    for (int i = 0; i < n; i++, T++) { pos[T] = at[sq] + i; slot[T] = sq; pg[T] = pages[sq]; }
                    at[sq] += n;
                }
                float *k = malloc((size_t)T * kvd * 4), *v = malloc((size_t)T * kvd * 4);
                float *q = malloc((size_t)T * NH * HD * 4), *o1 = malloc((size_t)T * NH * HD * 4),
                      *o2 = malloc((size_t)T * NH * HD * 4);
                for (size_t i = 0; i < (size_t)T * kvd; i++) { k[i] = frnd() * 2; v[i] = frnd(); }
                for (size_t i = 0; i < (size_t)T * NH * HD; i++) q[i] = frnd() * 3;
                be_batch bp = { .T = T, .pos = pos, .pages = pg, .slot = slot };
                be_batch br = bp;
                br.ring = RING;
                be_attn_ex ex = { .window = W };
                b->ops->kv_store(b, kp, vp, &bp, (int)kvd, k, v);
                b->ops->kv_store(b, kr, vr, &br, (int)kvd, k, v);
                b->ops->attention_ex(b, q, kp, vp, &bp, NH, NKV, HD, &ex, o1);
                b->ops->attention_ex(b, q, kr, vr, &br, NH, NKV, HD, &ex, o2);
                bad = memcmp(o1, o2, (size_t)T * NH * HD * 4) != 0;
                passes++;
                free(k); free(v); free(q); free(o1); free(o2);
            }
            CHECKF(!bad && passes > 10, "kv %s scalar %d: ring and pages differ in pass %d", be_kv_name(kvts[ki]),
                   scalar, passes);
            b->ops->free(b, kp); b->ops->free(b, vp); b->ops->free(b, kr); b->ops->free(b, vr);
            b->ops->close(b);
        }
    pool_close(p);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_default_ctx);
    RUN(test_lazy_pages);
    RUN(test_grow_preempt);
    RUN(test_ring_alloc);
    RUN(test_ring_ops);
    RUN(test_rings);
    return CHECK_DONE();
}
