/* t_logprobs — token log-probabilities through the engine's public API,
 * against the log-softmax (float64) of the logits of one forward pass over
 * the same tokens at every position (what eval computes), to 1e-4: prompt
 * tokens (echo), generated tokens greedy and sampled with a repetition
 * penalty (the penalised logits, no temperature), under a grammar (masked
 * tokens count for nothing), the same values alone and batched, and the
 * submit-time errors. */
#include "engine/engine.h"
#include "engine/arch/forward.h"
#include "engine/backend/backend.h"
#include "engine/pool.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STORIES FIXTURE("models/stories260K.gguf")
#define MAXT 128
#define TOL 1e-4

typedef struct lp_tok { int32_t id; int has; float lp; int n; int32_t ids[ENG_MAX_LOGPROBS]; float vals[ENG_MAX_LOGPROBS]; } lp_tok;

typedef struct run {
    lp_tok prompt[MAXT];
    int n_prompt;
    lp_tok gen[MAXT];
    int n_gen;
    int done, error, completion_tokens;
    char msg[160];
} run;

static eng *open_eng(const char *path, int max_seqs)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = path;
    o.backend = "cpu";   /* the reference below is the CPU backend's */
    o.n_threads = 2;
    o.max_seqs = max_seqs;
    if (eng_open(&e, &o, err, sizeof err)) fprintf(stderr, "eng_open: %s\n", err);
    return e;
}

static void take_lp(lp_tok *t, const eng_event *ev)
{
    t->id = ev->token;
    t->has = ev->has_logprob;
    t->lp = ev->logprob;
    t->n = ev->n_lp;
    for (int i = 0; i < ev->n_lp && i < ENG_MAX_LOGPROBS; i++) { t->ids[i] = ev->lp_ids[i]; t->vals[i] = ev->lp_vals[i]; }
}

static void pump(eng *e, run *r, int n)
{
    int left = n;
    for (int spins = 0; left > 0 && spins < 400000; spins++) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(500); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            run *x = &r[(intptr_t)ev->user];
            if (ev->type == ENG_EV_PROMPT_TOKEN && x->n_prompt < MAXT) {
                CHECKF(ev->pos == x->n_prompt, "prompt token at %d, expected %d", ev->pos, x->n_prompt);
                take_lp(&x->prompt[x->n_prompt++], ev);
            } else if (ev->type == ENG_EV_TOKEN && x->n_gen < MAXT) {
                CHECKF(x->n_gen > 0 || x->n_prompt == 0 || 1, "order");
                take_lp(&x->gen[x->n_gen++], ev);
            } else if (ev->type == ENG_EV_DONE) {
                x->done = 1; x->completion_tokens = ev->completion_tokens; left--;
            } else if (ev->type == ENG_EV_ERROR) {
                x->error = 1; snprintf(x->msg, sizeof x->msg, "%s", ev->message); left--;
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
}

static int submit(eng *e, const int32_t *toks, size_t n, int max_tokens, int top, int echo, int prompt_only,
                  const eng_sampling *s, const char *grammar, intptr_t user, char *err, size_t errlen, eng_err *code)
{
    eng_job_desc d = { 0 };
    uint64_t id;
    d.kind = ENG_JOB_GENERATE;
    d.tokens = toks;
    d.n_tokens = n;
    d.max_tokens = max_tokens;
    if (s) d.sampling = *s; else { eng_sampling_default(&d.sampling); d.sampling.temperature = 0; }
    d.logprobs = 1;
    d.top_logprobs = top;
    d.echo = echo;
    d.prompt_only = prompt_only;
    if (grammar) { d.grammar = grammar; d.grammar_len = strlen(grammar); }
    d.user = (void *)user;
    d.owner = (uint64_t)user;
    return eng_submit(e, &d, &id, code, err, errlen);
}

/* The logits at every position of toks[0..T), computed as the engine does
 * for a job alone: the prompt's P tokens in one pass (every position out,
 * as eval), then each later token in a pass of its own (a decode step). */
static float *ref_logits(const char *path, const int32_t *toks, int P, int T, int32_t *n_vocab)
{
    model *m = NULL;
    pool *p = NULL;
    be *b = NULL;
    fw *f = NULL;
    char err[512];
    float *lg = NULL;
    if (model_load(&m, path, err, sizeof err) || pool_open(&p, 2) ||
        be_cpu_open(&b, p, BE_KV_F16, err, sizeof err) || model_prepare(m, b, err, sizeof err) ||
        fw_open(&f, m, b, MAXT, MAXT, MAXT / 16 + 1, 1, err, sizeof err)) {
        CHECKF(0, "%s: cannot run (%s)", path, err);
        goto out;
    }
    int32_t pos[MAXT], out[MAXT], pages[MAXT / 16 + 1], slot[MAXT];
    const int32_t *pg[MAXT];
    for (int i = 0; i < MAXT / 16 + 1; i++) pages[i] = i;
    for (int i = 0; i < T; i++) { pos[i] = i; out[i] = i; pg[i] = pages; slot[i] = 0; }
    fw_seq_reset(f, 0);
    size_t nv = (size_t)m->hp.n_vocab;
    *n_vocab = m->hp.n_vocab;
    lg = malloc((size_t)T * nv * sizeof *lg);
    if (!lg) goto out;
    be_batch bt = { .T = P, .pos = pos, .pages = pg, .slot = slot };
    fw_run(f, toks, &bt, out, P, lg);
    for (int i = P; i < T; i++) {
        int32_t o = 0;
        be_batch bd = { .T = 1, .pos = pos + i, .pages = pg, .slot = slot, .n_dec = 1 };
        fw_run(f, toks + i, &bd, &o, 1, lg + (size_t)i * nv);
    }
out:
    fw_close(f);
    if (b) b->ops->close(b);
    pool_close(p);
    model_free(m);
    return lg;
}

/* Checks one reported token against the log-softmax of row (float64). */
static int check_row(const float *row, int32_t nv, const lp_tok *t, const char *what, int k)
{
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < nv; i++) if (row[i] > mx) mx = row[i];
    for (int32_t i = 0; i < nv; i++) if (row[i] > -INFINITY) sum += exp((double)row[i] - mx);
    double lse = mx + log(sum);
    int ok = 1;
    double want = (double)row[t->id] - lse;
    if (!t->has || fabs(t->lp - want) > TOL) {
        CHECKF(0, "%s %d: token %d logprob %.6f, log-softmax %.6f", what, k, t->id, t->lp, want);
        ok = 0;
    }
    /* the alternatives: the likeliest, best first, each its own value */
    for (int i = 0; i < t->n && ok; i++) {
        double v = (double)row[t->ids[i]] - lse;
        int better = 0;
        for (int32_t q = 0; q < nv; q++) better += (double)row[q] - lse > v + TOL;
        if (fabs(t->vals[i] - v) > TOL || better > i || (i && t->vals[i] > t->vals[i - 1])) {
            CHECKF(0, "%s %d: alternative %d (id %d) %.6f, log-softmax %.6f, %d likelier", what, k, i, t->ids[i],
                   t->vals[i], v, better);
            ok = 0;
        }
        if (t->ids[i] == t->id && t->vals[i] != t->lp) { CHECKF(0, "%s %d: chosen's two values differ", what, k); ok = 0; }
    }
    return ok;
}

static void penalize(float *row, int32_t nv, const int32_t *recent, int n, float pen, int last_n)
{
    int from = n > last_n ? n - last_n : 0;
    for (int i = from; i < n; i++) {
        int seen = 0;
        for (int j = from; j < i; j++) seen |= recent[j] == recent[i];
        if (seen || recent[i] < 0 || recent[i] >= nv) continue;
        float *l = &row[recent[i]];
        *l = *l > 0 ? *l / pen : *l * pen;
    }
}

/* Prompt and greedy tokens, then sampled ones with a penalty. */
static void test_against_logits(const char *path, const int32_t *prompt, int P, int G)
{
    eng *e = open_eng(path, 4);
    if (!e) { CHECK(0); return; }
    static run r[2];
    memset(r, 0, sizeof r);
    char err[256];
    eng_err code;
    CHECKF(submit(e, prompt, (size_t)P, G, 20, 1, 0, NULL, NULL, 0, err, sizeof err, &code) == 0, "%s", err);
    eng_sampling s;
    eng_sampling_default(&s);
    s.temperature = 0.7f;
    s.repeat_penalty = 1.3f;
    s.repeat_last_n = 64;
    s.seed = 7;
    CHECKF(submit(e, prompt, (size_t)P, G, 5, 0, 0, &s, NULL, 1, err, sizeof err, &code) == 0, "%s", err);
    pump(e, r, 2);
    CHECK(r[0].done && r[1].done);
    CHECK_EQ_INT(r[0].n_prompt, P);
    CHECK_EQ_INT(r[0].n_gen, G);
    CHECK_EQ_INT(r[1].n_prompt, 0);
    CHECK_EQ_INT(r[1].n_gen, G);
    CHECK(!r[0].prompt[0].has && r[0].prompt[0].n == 0 && r[0].prompt[0].id == prompt[0]);
    int32_t toks[MAXT], nv = 0;
    int T = P + G;
    for (int i = 0; i < P; i++) { toks[i] = prompt[i]; CHECK(r[0].prompt[i].id == prompt[i]); }
    for (int i = 0; i < G; i++) toks[P + i] = r[0].gen[i].id;
    float *lg = ref_logits(path, toks, P, T, &nv);
    if (lg) {
        int bad = 0;
        for (int i = 1; i < P && bad < 3; i++) bad += !check_row(lg + (size_t)(i - 1) * nv, nv, &r[0].prompt[i], "prompt", i);
        for (int i = 0; i < G && bad < 3; i++) {
            bad += !check_row(lg + (size_t)(P - 1 + i) * nv, nv, &r[0].gen[i], "greedy", i);
            /* greedy: the chosen token is the likeliest */
            CHECK(r[0].gen[i].n == 20 && r[0].gen[i].ids[0] == r[0].gen[i].id);
        }
        free(lg);
    }
    /* sampled with a penalty: the penalised logits, not scaled by temperature */
    for (int i = 0; i < P; i++) toks[i] = prompt[i];
    for (int i = 0; i < G; i++) toks[P + i] = r[1].gen[i].id;
    lg = ref_logits(path, toks, P, T, &nv);
    if (lg) {
        int bad = 0;
        for (int i = 0; i < G && bad < 3; i++) {
            float *row = lg + (size_t)(P - 1 + i) * nv;
            penalize(row, nv, toks, P + i, 1.3f, 64);
            bad += !check_row(row, nv, &r[1].gen[i], "sampled", i);
        }
        free(lg);
    }
    eng_close(e);
}

static void test_stories(void)
{
    int32_t p[12] = { 1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315 };
    test_against_logits(STORIES, p, 12, 24);
}

static void test_qwen2(void)
{
    int32_t p[8] = { 785, 3974, 1387, 3883, 3420, 916, 279, 1567 };
    test_against_logits(FIXTURE("models/qwen2-tiny.bf16.gguf"), p, 8, 12);
}

/* Under a grammar the masked tokens count for nothing: the log-softmax of
 * the logits with every refused token at -inf. */
static void test_grammar(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    static run r[1];
    memset(r, 0, sizeof r);
    char err[256];
    eng_err code;
    int32_t p[4] = { 1, 403, 407, 261 };
    const int G = 6;
    CHECKF(submit(e, p, 4, G, 10, 0, 0, NULL, "root ::= [a-e]+", 0, err, sizeof err, &code) == 0, "%s", err);
    pump(e, r, 1);
    CHECKF(r[0].done && r[0].n_gen >= 1, "done %d, %d tokens (%s)", r[0].done, r[0].n_gen, r[0].msg);
    int32_t toks[MAXT], nv = 0;
    int n = r[0].n_gen;
    for (int i = 0; i < 4; i++) toks[i] = p[i];
    for (int i = 0; i < n; i++) toks[4 + i] = r[0].gen[i].id;
    float *lg = ref_logits(STORIES, toks, 4, 4 + n, &nv);
    const eng_model_info *mi = eng_model(e);
    for (int i = 0; lg && i < n; i++) {
        float *row = lg + (size_t)(3 + i) * nv;
        int allowed = 0;
        for (int32_t q = 0; q < nv; q++) {
            size_t len;
            const char *pc = eng_token_piece(e, q, &len);
            int ok = len > 0 && q != mi->bos && q != mi->eos;
            for (size_t c = 0; c < len && ok; c++) ok = pc[c] >= 'a' && pc[c] <= 'e';
            if (q == mi->eos && i > 0) ok = 1;   /* the grammar may end after a letter */
            if (!ok) row[q] = -INFINITY;
            allowed += ok;
        }
        CHECK(allowed > 1);
        check_row(row, nv, &r[0].gen[i], "grammar", i);
        for (int k = 0; k < r[0].gen[i].n; k++)
            CHECKF(row[r[0].gen[i].ids[k]] > -INFINITY || r[0].gen[i].vals[k] == -INFINITY,
                   "a refused token among the alternatives with a finite logprob");
    }
    free(lg);
    eng_close(e);
}

/* The same values whether a job runs alone or beside others (prompt and
 * generated tokens), and echo with prompt_only: the prompt alone. */
static void test_batch_invariance(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    static run a[1], b[4];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    char err[256];
    eng_err code;
    int32_t p[10] = { 1, 403, 407, 261, 378, 432, 383, 286, 261, 376 };
    int32_t q[6] = { 1, 298, 315, 421, 395, 317 };
    CHECK(submit(e, p, 10, 16, 20, 1, 0, NULL, NULL, 0, err, sizeof err, &code) == 0);
    pump(e, a, 1);
    CHECK(submit(e, q, 6, 40, 3, 0, 0, NULL, NULL, 0, err, sizeof err, &code) == 0);
    CHECK(submit(e, q, 3, 30, 3, 1, 0, NULL, NULL, 1, err, sizeof err, &code) == 0);
    CHECK(submit(e, p, 10, 16, 20, 1, 0, NULL, NULL, 2, err, sizeof err, &code) == 0);
    CHECK(submit(e, p, 10, 0, 20, 1, 1, NULL, NULL, 3, err, sizeof err, &code) == 0);
    pump(e, b, 4);
    CHECK(b[2].n_prompt == 10 && b[2].n_gen == 16 && a[0].n_gen == 16);
    CHECK(!memcmp(a[0].prompt, b[2].prompt, sizeof a[0].prompt));
    CHECK(!memcmp(a[0].gen, b[2].gen, sizeof a[0].gen));
    /* prompt_only: the same prompt events, nothing generated */
    CHECK(b[3].done && b[3].n_prompt == 10 && b[3].n_gen == 0 && b[3].completion_tokens == 0);
    CHECK(!memcmp(a[0].prompt, b[3].prompt, sizeof a[0].prompt));
    eng_close(e);
}

static void test_errors(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    char err[256];
    eng_err code;
    int32_t p[2] = { 1, 403 };
    CHECK(submit(e, p, 2, 4, 21, 0, 0, NULL, NULL, 0, err, sizeof err, &code) == -1 && code == ENG_EINVAL);
    CHECK(strstr(err, "logprobs") != NULL);
    CHECK(submit(e, p, 2, 4, -1, 0, 0, NULL, NULL, 0, err, sizeof err, &code) == -1 && code == ENG_EINVAL);
    CHECK(submit(e, p, 2, 4, 2, 0, 1, NULL, NULL, 0, err, sizeof err, &code) == -1 && code == ENG_EINVAL);
    eng_job_desc d = { 0 };
    uint64_t id;
    d.kind = ENG_JOB_EVAL;
    d.tokens = p;
    d.n_tokens = 2;
    d.top_n = 3;
    d.echo = 1;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_EINVAL);
    /* prompt_only may fill the context, as eval */
    int n = eng_model(e)->n_ctx;
    int32_t *full = calloc((size_t)n, sizeof *full);
    for (int i = 0; i < n; i++) full[i] = 1 + i % 400;
    CHECKF(submit(e, full, (size_t)n, 0, 0, 1, 1, NULL, NULL, 0, err, sizeof err, &code) == 0, "%s", err);
    CHECK(submit(e, full, (size_t)n, 0, 0, 1, 0, NULL, NULL, 0, err, sizeof err, &code) == -1 && code == ENG_ECTX);
    static run r[1];
    memset(r, 0, sizeof r);
    pump(e, r, 1);
    CHECK(r[0].done && r[0].n_prompt == MAXT && r[0].n_gen == 0);
    free(full);
    size_t len;
    CHECK(eng_token_piece(e, -1, &len) && len == 0);
    CHECK(eng_token_piece(e, 100000, &len) && len == 0);
    eng_close(e);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_stories);
    RUN(test_qwen2);
    RUN(test_grammar);
    RUN(test_batch_invariance);
    RUN(test_errors);
    return CHECK_DONE();
}
