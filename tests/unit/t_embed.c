/* t_embed — embed jobs (engine.h ENG_JOB_EMBED) against references made by
 * other tools and by a separate computation:
 *  - qwen2-tiny ties its output to token_embd, so a position's final-norm
 *    hidden state times the embedding matrix is that position's logits: the
 *    hidden states of one forward pass (forward.h fw_hidden) are checked
 *    against the transformers float64 logits (tests/fixtures/refs, the
 *    tolerance of t_models, 0.05), every position of every case;
 *  - the engine's vectors for last, mean and CLS pooling are those hidden
 *    states (the last; the mean over positions; the first), L2-normalised;
 *  - a vector is bit for bit the same alone or in a batch of 16 beside
 *    decoding generate jobs; a text with itself has cosine 1, two texts less;
 *  - bad input: a prompt over the context, a token outside the vocabulary,
 *    a system message; cancel.
 * ANE_BACKEND=cuda runs the engine's side on CUDA (the references stay the
 * CPU's: then within 2e-3 per component instead of 1e-6). */
#include "engine/engine.h"
#include "engine/arch/forward.h"
#include "engine/backend/backend.h"
#include "engine/pool.h"
#include "tests/check.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QWEN2 FIXTURE("models/qwen2-tiny.bf16.gguf")
#define QWEN2_REF FIXTURE("refs/qwen2-tiny.dev.json")
#define MAXJ 32

static double vec_tol(void)
{
    const char *bk = getenv("ANE_BACKEND");
    return bk && strcmp(bk, "cpu") ? 2e-3 : 1e-6;
}

static eng *open_eng(const char *path, int pooling, int max_seqs)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = path;
    o.n_threads = 2;
    o.max_seqs = max_seqs;
    o.pooling = pooling;
    o.backend = getenv("ANE_BACKEND");
    o.deterministic = 1;   /* (the CPU always is; CUDA at every batch size with it) */
    CHECKF(eng_open(&e, &o, err, sizeof err) == 0, "%s", err);
    return e;
}

/* A job's outcome: its vector (NULL when none came), the DONE or ERROR. */
typedef struct res {
    float *v; int n;
    int done, err, n_gen;
    eng_finish finish;
    eng_err code;
    int32_t prompt_tokens;
    char msg[160];
} res;

/* Submits the n jobs d and gathers their events until each has ended. */
static void run_jobs(eng *e, int n, const eng_job_desc *d, res *r)
{
    uint64_t ids[MAXJ];
    int live = 0;
    memset(r, 0, (size_t)n * sizeof *r);
    for (int i = 0; i < n; i++) {
        char err[sizeof r->msg];
        eng_err code;
        if (eng_submit(e, &d[i], &ids[i], &code, err, sizeof err)) {
            r[i].done = r[i].err = 1;
            r[i].code = code;
            snprintf(r[i].msg, sizeof r[i].msg, "%s", err);
            ids[i] = 0;
        } else live++;
    }
    for (int spins = 0; live > 0 && spins < 400000; spins++) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(250); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            int i = 0;
            while (i < n && ids[i] != ev->job_id) i++;
            if (i < n) {
                if (ev->type == ENG_EV_EMBEDDING) {
                    CHECK(r[i].v == NULL);   /* one vector per job */
                    free(r[i].v);
                    r[i].v = ev->embd;
                    r[i].n = ev->n_embd;
                    ev->embd = NULL;
                } else if (ev->type == ENG_EV_TOKEN) {
                    r[i].n_gen++;
                } else if (ev->type == ENG_EV_DONE || ev->type == ENG_EV_ERROR) {
                    r[i].done = 1;
                    r[i].err = ev->type == ENG_EV_ERROR;
                    r[i].finish = ev->finish;
                    r[i].code = ev->code;
                    r[i].prompt_tokens = ev->prompt_tokens;
                    snprintf(r[i].msg, sizeof r[i].msg, "%s", ev->message);
                    live--;
                }
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
}

static eng_job_desc embed_text(const char *s)
{
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_EMBED;
    d.text = s;
    d.text_len = strlen(s);
    return d;
}

static eng_job_desc embed_tokens(const int32_t *t, size_t n)
{
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_EMBED;
    d.tokens = t;
    d.n_tokens = n;
    return d;
}

static double dot(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* max |a[i] - b[i] / |b|| over n */
static double diff_normalised(const float *a, const double *b, int n)
{
    double ss = 0, worst = 0;
    for (int i = 0; i < n; i++) ss += b[i] * b[i];
    double inv = 1.0 / sqrt(ss);
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i] * inv);
        if (d > worst) worst = d;
    }
    return worst;
}

/* The hidden states of every position of toks[0..n) after the final norm,
 * by one forward pass on the CPU backend (f16 KV, as the engine's default)
 * with every row out: H [n][E]. */
static float *hidden_states(model *m, be *b, const int32_t *toks, int n)
{
    char err[256];
    fw *f = NULL;
    int pages_n = (n + KV_PAGE - 1) / KV_PAGE;
    if (fw_open(&f, m, b, n, n, pages_n, 1, err, sizeof err)) { CHECKF(0, "%s", err); return NULL; }
    int32_t *pos = malloc((size_t)n * sizeof *pos), *out = malloc((size_t)n * sizeof *out),
            *slot = calloc((size_t)n, sizeof *slot), *pages = malloc((size_t)pages_n * sizeof *pages);
    const int32_t **pt = malloc((size_t)n * sizeof *pt);
    float *lg = malloc((size_t)n * m->hp.n_vocab * sizeof *lg), *H = malloc((size_t)n * m->hp.n_embd * sizeof *H);
    for (int i = 0; i < pages_n; i++) pages[i] = i;
    for (int t = 0; t < n; t++) { pos[t] = t; out[t] = t; pt[t] = pages; }
    be_batch bt = { .T = n, .pos = pos, .pages = pt, .slot = slot, .n_dec = 0 };
    fw_seq_reset(f, 0);
    fw_run(f, toks, &bt, out, n, lg);
    fw_hidden(f, H, n);
    fw_close(f);
    free(pos); free(out); free(slot); free(pages); free(pt); free(lg);
    return H;
}

static void test_reference(void)
{
    char err[512];
    json_error_t je;
    json_t *root = json_load_file(QWEN2_REF, 0, &je);
    CHECKF(root != NULL, "%s: %s", QWEN2_REF, je.text);
    if (!root) return;
    pool *p = NULL;
    be *b = NULL;
    model *m = NULL;
    CHECK(pool_open(&p, 2) == 0);
    CHECK(be_cpu_open(&b, p, BE_KV_F16, err, sizeof err) == 0);
    CHECKF(model_load(&m, QWEN2, err, sizeof err) == 0, "%s", err);
    CHECKF(model_prepare(m, b, err, sizeof err) == 0, "%s", err);
    int E = m->hp.n_embd;
    /* the engines of each pooling */
    eng *el = open_eng(QWEN2, ENG_POOL_LAST, 4), *em = open_eng(QWEN2, ENG_POOL_MEAN, 4),
        *ec = open_eng(QWEN2, ENG_POOL_CLS, 4);
    eng *ed = open_eng(QWEN2, ENG_POOL_MODEL, 4);
    if (!el || !em || !ec || !ed) goto out;
    /* qwen2-tiny names no pooling_type: last token by default, said in info */
    CHECK(strcmp(eng_model(ed)->pooling, "last") == 0 && strcmp(eng_model(ed)->pooling_source, "default") == 0);
    CHECK(strcmp(eng_model(em)->pooling, "mean") == 0 && strcmp(eng_model(em)->pooling_source, "option") == 0);
    CHECK(strcmp(eng_model(ec)->pooling, "cls") == 0);
    float *wrow = malloc((size_t)E * sizeof *wrow);
    double worst = 0, worst_l = 0, worst_m = 0, worst_c = 0;
    int positions = 0;
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t ci;
    json_array_foreach(cases, ci, c) {
        json_t *jt = json_object_get(c, "tokens"), *top = json_object_get(c, "top10");
        int n = (int)json_array_size(jt);
        int32_t *toks = malloc((size_t)n * sizeof *toks);
        for (int i = 0; i < n; i++) toks[i] = (int32_t)json_integer_value(json_array_get(jt, i));
        float *H = hidden_states(m, b, toks, n);
        if (!H) { free(toks); continue; }
        /* each position's hidden state times token_embd: the reference logits */
        for (int q = 0; q < n && q < (int)json_array_size(top); q++) {
            json_t *tp = json_array_get(top, (size_t)q);
            positions++;
            for (size_t k = 0; k < json_array_size(tp); k++) {
                int32_t id = (int32_t)json_integer_value(json_array_get(json_array_get(tp, k), 0));
                double want = json_number_value(json_array_get(json_array_get(tp, k), 1));
                wt_row_f32(&m->tok_embd, id, wrow);
                double got = 0;
                for (int i = 0; i < E; i++) got += (double)H[(size_t)q * E + i] * wrow[i];
                double dv = fabs(got - want);
                if (dv > worst) worst = dv;
                CHECKF(dv <= 0.05, "case %zu pos %d token %d: %g vs %g", ci, q, id, got, want);
            }
        }
        /* the engine's vectors: the last, the mean, the first, normalised */
        double *last = malloc((size_t)E * sizeof *last), *mean = calloc((size_t)E, sizeof *mean),
               *cls = malloc((size_t)E * sizeof *cls);
        for (int i = 0; i < E; i++) {
            last[i] = H[(size_t)(n - 1) * E + i];
            cls[i] = H[i];
            for (int q = 0; q < n; q++) mean[i] += H[(size_t)q * E + i];
            mean[i] /= n;
        }
        eng_job_desc d = embed_tokens(toks, (size_t)n);
        res r;
        eng *es[3] = { el, em, ec };
        double *want[3] = { last, mean, cls }, *w[3] = { &worst_l, &worst_m, &worst_c };
        for (int k = 0; k < 3; k++) {
            run_jobs(es[k], 1, &d, &r);
            CHECKF(r.done && !r.err && r.v && r.n == E, "case %zu pooling %d: %s", ci, k, r.msg);
            CHECK(r.prompt_tokens == n && r.finish == ENG_FINISH_LENGTH);
            if (r.v) {
                double dv = diff_normalised(r.v, want[k], E);
                if (dv > *w[k]) *w[k] = dv;
                CHECKF(dv <= vec_tol(), "case %zu pooling %d: %g", ci, k, dv);
                CHECK_NEAR(dot(r.v, r.v, E), 1.0, 1e-5);
            }
            free(r.v);
        }
        free(last); free(mean); free(cls);
        free(H);
        free(toks);
    }
    fprintf(stderr, "  qwen2-tiny: %d positions, max |h.W - logit| %.4f (tol 0.05); engine vs per-position "
            "last %.2g, mean %.2g, cls %.2g\n", positions, worst, worst_l, worst_m, worst_c);
    free(wrow);
out:
    eng_close(el); eng_close(em); eng_close(ec); eng_close(ed);
    model_free(m);
    if (b) b->ops->close(b);
    pool_close(p);
    json_decref(root);
}

static const char *const texts[16] = {
    "The capital of France is Paris.", "A quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.", "hello", "Once upon a time there was a little cat.",
    "1 2 3 4 5 6 7 8 9 10", "Rain falls on the hills in spring and the rivers rise.", "x",
    "Quantum computers use qubits.", "She sells sea shells by the sea shore.", "The end.",
    "Water boils at one hundred degrees Celsius at sea level.", "ok ok ok ok", "Good morning!",
    /* long (521 tokens here): prefilled alone in passes of 512 + 9 tokens,
     * beside decoding streams in others (345 + 101 + 75 in one run), mean
     * pooling's in passes of 64 rows */
#define L10 "Tokens, tokens, tokens: the model reads them one after another, and then some more. "
    L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10 L10, "Why?",
#undef L10
};

/* One input alone, then in a batch of 16 beside generate jobs that decode
 * meanwhile: the same bits. */
static void check_invariance(int pooling)
{
    eng *e = open_eng(QWEN2, pooling, 24);
    if (!e) return;
    int E = eng_model(e)->n_embd;
    eng_job_desc d[MAXJ];
    res r[MAXJ];
    float *alone[16];
    for (int i = 0; i < 16; i++) {
        d[0] = embed_text(texts[i]);
        run_jobs(e, 1, d, r);
        CHECKF(r[0].v && r[0].n == E, "%s", r[0].msg);
        alone[i] = r[0].v;
    }
    /* generate jobs first (so they decode while the embeds prefill), then
     * the 16 inputs in another order */
    int ng = 4;
    for (int g = 0; g < ng; g++) {
        memset(&d[g], 0, sizeof d[g]);
        d[g].kind = ENG_JOB_GENERATE;
        d[g].text = texts[g];
        d[g].text_len = strlen(texts[g]);
        d[g].raw = 1;
        d[g].max_tokens = 24;
        eng_sampling_default(&d[g].sampling);
        d[g].sampling.seed = (uint64_t)g + 1;
    }
    for (int i = 0; i < 16; i++) d[ng + i] = embed_text(texts[(i * 7 + 3) % 16]);
    run_jobs(e, ng + 16, d, r);
    int same = 0;
    const char *bk = getenv("ANE_BACKEND");
    const int cuda = bk && !strcmp(bk, "cuda");
    for (int i = 0; i < 16; i++) {
        const float *a = alone[(i * 7 + 3) % 16], *v = r[ng + i].v;
        CHECKF(v && r[ng + i].n == E, "%s", r[ng + i].msg);
        if (v && a) {
            int eq = memcmp(a, v, (size_t)E * sizeof *v) == 0;
            same += eq;
            if (cuda) {
                /* CUDA's prompt matmuls tile by the pass's rows: within
                 * rounding, not bit for bit (docs/engine.md) */
                double dot = 0;
                for (int k = 0; k < E; k++) dot += (double)a[k] * v[k];
                CHECKF(dot > 1 - 1e-5, "pooling %d input %d: cosine %.9f alone and in a batch", pooling,
                       (i * 7 + 3) % 16, dot);
            } else
                CHECKF(eq, "pooling %d input %d: differs in a batch", pooling, (i * 7 + 3) % 16);
        }
    }
    for (int g = 0; g < ng; g++) CHECKF(r[g].done && !r[g].err && r[g].n_gen > 0, "%s", r[g].msg);
    fprintf(stderr, "  pooling %d: %d of 16 vectors bit-identical alone and in a batch with %d generate jobs\n",
            pooling, same, ng);
    /* cosine: a text with itself 1, different texts less */
    for (int i = 0; i < 16; i++) {
        CHECK_NEAR(dot(alone[i], alone[i], E), 1.0, 1e-5);
        for (int k = i + 1; k < 16; k++) CHECKF(dot(alone[i], alone[k], E) < 0.9999, "%d %d", i, k);
    }
    /* the same input as tokens: the same vector as the text */
    int32_t *ids = NULL;
    size_t n = 0;
    eng_err code;
    char err[256];
    CHECK(eng_tokenize(e, texts[0], strlen(texts[0]), 1, 0, &ids, &n, &code, err, sizeof err) == 0);
    d[0] = embed_tokens(ids, n);
    run_jobs(e, 1, d, r);
    CHECK(r[0].v && memcmp(r[0].v, alone[0], (size_t)E * sizeof(float)) == 0);
    CHECK(r[0].prompt_tokens == (int32_t)n);
    free(r[0].v);
    r[0].v = NULL;
    free(ids);
    for (int i = 1; i < ng + 16; i++) free(r[i].v);
    for (int i = 0; i < 16; i++) free(alone[i]);
    eng_close(e);
}

static void test_batch_invariance(void)
{
    check_invariance(ENG_POOL_LAST);
    check_invariance(ENG_POOL_MEAN);
}

/* More output rows than a pass holds (mean pooling's every row up to
 * EVAL_ROWS, then a generate's and a last-token embed's last rows): the
 * rows past the room wait for the next pass; everything ends right. */
static void test_rows_full(void)
{
    eng *e = open_eng(QWEN2, ENG_POOL_MEAN, 16);
    if (!e) return;
    int32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = 200 + i;
    eng_job_desc d[3];
    res r[3];
    d[0] = embed_tokens(toks, 100);
    memset(&d[1], 0, sizeof d[1]);
    d[1].kind = ENG_JOB_GENERATE;
    d[1].tokens = toks;
    d[1].n_tokens = 3;
    d[1].max_tokens = 4;
    eng_sampling_default(&d[1].sampling);
    d[2] = embed_tokens(toks + 50, 50);
    res alone;
    run_jobs(e, 1, &d[0], &alone);
    run_jobs(e, 3, d, r);
    CHECK(r[0].v && alone.v && memcmp(r[0].v, alone.v, (size_t)r[0].n * sizeof(float)) == 0);
    CHECKF(r[1].done && !r[1].err && r[1].n_gen == 4, "%s", r[1].msg);
    CHECK(r[2].v && !r[2].err);
    for (int i = 0; i < 3; i++) free(r[i].v);
    free(alone.v);
    eng_close(e);
}

static void test_bad_input(void)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = QWEN2;
    o.n_threads = 2;
    o.n_ctx = 32;
    o.backend = getenv("ANE_BACKEND");
    CHECKF(eng_open(&e, &o, err, sizeof err) == 0, "%s", err);
    if (!e) return;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = 100 + i;
    eng_job_desc d = embed_tokens(toks, 40);
    uint64_t id;
    eng_err code;
    /* tokens over the context: refused at once */
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) != 0 && code == ENG_ECTX);
    CHECKF(strstr(err, "40 tokens") && strstr(err, "context of 32"), "%s", err);
    /* exactly the context fits (nothing is generated) */
    d.n_tokens = 32;
    res r;
    run_jobs(e, 1, &d, &r);
    CHECKF(r.v && !r.err && r.prompt_tokens == 32, "%s", r.msg);
    free(r.v);
    /* a text over the context: the job's error after tokenizing */
    char big[2048];
    for (int i = 0; i < 2047; i++) big[i] = i % 2 ? ' ' : 'a';
    big[2047] = 0;
    d = embed_text(big);
    run_jobs(e, 1, &d, &r);
    CHECKF(r.err && r.code == ENG_ECTX && strstr(r.msg, "context of 32") && !r.v, "%s", r.msg);
    /* a token outside the vocabulary */
    toks[3] = 1 << 30;
    d = embed_tokens(toks, 8);
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) != 0 && code == ENG_ETOKEN);
    /* no system message, no messages */
    d = embed_text("hi");
    d.system = "be brief";
    d.system_len = 8;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) != 0 && code == ENG_EINVAL);
    /* invalid UTF-8 */
    d = embed_text("\xff\xfe");
    run_jobs(e, 1, &d, &r);
    CHECK(r.err && r.code == ENG_EUTF8 && !r.v);
    /* cancelled at once: DONE cancelled, no vector */
    d = embed_text(texts[6]);
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == 0);
    eng_cancel(e, id);
    int done = 0, vec = 0;
    for (int spins = 0; !done && spins < 100000; spins++) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(200); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            if (ev->job_id == id && ev->type == ENG_EV_EMBEDDING) vec = 1;
            if (ev->job_id == id && ev->type == ENG_EV_DONE) done = 1 + (ev->finish == ENG_FINISH_CANCELLED);
            eng_event_free(ev);
            ev = nx;
        }
    }
    /* (it may have finished before the cancel was seen: then with its vector) */
    CHECK(done == 2 ? !vec : done == 1 && vec);
    /* the engine goes on */
    d = embed_text("still here");
    run_jobs(e, 1, &d, &r);
    CHECK(r.v != NULL);
    free(r.v);
    eng_close(e);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_reference);
    RUN(test_batch_invariance);
    RUN(test_rows_full);
    RUN(test_bad_input);
    return CHECK_DONE();
}
