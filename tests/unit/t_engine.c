/* t_engine — the engine through its public header: greedy decoding against
 * the llama2.c reference, batch invariance, prefix reuse, cancellation, stop
 * strings, seeded sampling, greedy decoding under grammars, every
 * submit-time error, and text prompts
 * tokenized off the caller's thread (errors as events, cancel, order). */
#include "engine/engine.h"
#include "tests/check.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STORIES FIXTURE("models/stories260K.gguf")

/* First 64 ids of refs/stories260K.greedy.json (float64 llama2.c, BOS prompt). */
static const int32_t ref_ids[64] = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
    337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310,
};

typedef struct res {
    int32_t ids[512];
    int n;
    char text[8192];
    size_t text_len;
    int done, error;
    eng_finish finish;
    int cached, prompt_tokens;
    int n_logits;
    int32_t top1[512];
} res;

static eng *open_eng(const char *path, int max_seqs)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = path;
    o.n_threads = 2;
    o.max_seqs = max_seqs;
    if (eng_open(&e, &o, err, sizeof err)) fprintf(stderr, "eng_open: %s\n", err);
    return e;
}

/* Pumps events into results[user index] until every listed job is done. */
static void pump(eng *e, res *r, int n)
{
    int left = n;
    for (int spins = 0; left > 0 && spins < 200000; spins++) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(500); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            res *x = &r[(intptr_t)ev->user];
            if (ev->type == ENG_EV_TOKEN) {
                if (x->n < 512) x->ids[x->n++] = ev->token;
                if (x->text_len + ev->text_len < sizeof x->text) {
                    memcpy(x->text + x->text_len, ev->text, ev->text_len);
                    x->text_len += ev->text_len;
                }
            } else if (ev->type == ENG_EV_LOGITS) {
                if (x->n_logits < 512) x->top1[x->n_logits] = ev->top_ids[0];
                x->n_logits++;
            } else if (ev->type == ENG_EV_DONE) {
                x->done = 1; x->finish = ev->finish; x->cached = ev->cached_tokens;
                x->prompt_tokens = ev->prompt_tokens;
                left--;
            } else if (ev->type == ENG_EV_ERROR) {
                x->error = 1; left--;
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
}

static int submit(eng *e, const int32_t *toks, size_t n, int max_tokens, float temp, uint64_t seed,
                  intptr_t user, uint64_t *id)
{
    eng_job_desc d = { 0 };
    char err[256];
    eng_err code;
    d.kind = ENG_JOB_GENERATE;
    d.tokens = toks;
    d.n_tokens = n;
    d.max_tokens = max_tokens;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = temp;
    d.sampling.seed = seed;
    d.user = (void *)user;
    d.owner = (uint64_t)user;
    int rc = eng_submit(e, &d, id, &code, err, sizeof err);
    if (rc) fprintf(stderr, "submit: %s\n", err);
    return rc;
}

static void test_greedy_reference(void)
{
    eng *e = open_eng(STORIES, 4);
    CHECK(e != NULL);
    if (!e) return;
    int32_t bos = 1;
    uint64_t id;
    res r[1];
    memset(r, 0, sizeof r);
    CHECK(submit(e, &bos, 1, 64, 0, 0, 0, &id) == 0);
    pump(e, r, 1);
    CHECK(r[0].done);
    CHECK_EQ_INT(r[0].n, 64);
    int match = 0;
    while (match < r[0].n && r[0].ids[match] == ref_ids[match]) match++;
    CHECKF(match == 64, "greedy ids match the reference for %d of 64", match);
    CHECK(r[0].finish == ENG_FINISH_LENGTH);
    CHECK(r[0].text_len > 20 && !memcmp(r[0].text, "Once upon a time, there was a little girl named Lily.", 53));
    eng_close(e);
}

/* Eight different prompts at once give what each gives alone (greedy), for
 * float weights and for quantized ones whose kernels tile the batch. */
static void batch_invariance(const char *model, int32_t vocab_lo)
{
    eng *e = open_eng(model, 8);
    if (!e) { CHECK(0); return; }
    static res solo[8], many[8];
    int32_t prompts[8][3];
    uint64_t id;
    memset(solo, 0, sizeof solo);
    memset(many, 0, sizeof many);
    for (int i = 0; i < 8; i++) {
        prompts[i][0] = 1; prompts[i][1] = vocab_lo + 7 * i; prompts[i][2] = vocab_lo + 100 - 3 * i;
        CHECK(submit(e, prompts[i], 3, 40, 0, 0, i, &id) == 0);
        pump(e, solo, 1 + 0 * i);
    }
    for (int i = 0; i < 8; i++) CHECK(submit(e, prompts[i], 3, 40, 0, 0, i, &id) == 0);
    pump(e, many, 8);
    for (int i = 0; i < 8; i++) {
        CHECK(solo[i].done && many[i].done);
        CHECK_EQ_INT(solo[i].n, many[i].n);
        CHECKF(!memcmp(solo[i].ids, many[i].ids, sizeof(int32_t) * (size_t)solo[i].n), "stream %d differs", i);
    }
    eng_close(e);
}

static void test_batch_invariance(void)
{
    batch_invariance(STORIES, 300);
    batch_invariance(FIXTURE("models/llama-q.Q4_K_M.gguf"), 1000);
    batch_invariance(FIXTURE("models/llama-q.Q8_0.gguf"), 1000);
    batch_invariance(FIXTURE("models/llama-q.Q4_0.gguf"), 1000);
    batch_invariance(FIXTURE("models/qwen2-tiny.bf16.gguf"), 1000);
}

/* Greedy decoding under grammars: the choice made where the logits stay on
 * the device (CUDA masks them there) is the one made from the host's copy
 * (logprobs need the logits on the host), alone and with other grammars and
 * an unconstrained job in the same pass; a closed grammar ends the reply. */
static int submit_g(eng *e, const int32_t *toks, size_t n, const char *grammar, const char *schema, int logprobs,
                    intptr_t user)
{
    eng_job_desc d = { 0 };
    char err[256];
    eng_err code;
    uint64_t id;
    d.kind = ENG_JOB_GENERATE;
    d.tokens = toks;
    d.n_tokens = n;
    d.max_tokens = 48;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    d.grammar = grammar;
    d.grammar_len = grammar ? strlen(grammar) : 0;
    d.json_schema = schema;
    d.json_schema_len = schema ? strlen(schema) : 0;
    d.logprobs = logprobs;
    d.user = (void *)user;
    d.owner = (uint64_t)user;
    int rc = eng_submit(e, &d, &id, &code, err, sizeof err);
    if (rc) fprintf(stderr, "submit: %s\n", err);
    return rc;
}

static void grammar_greedy(const char *model, int32_t t0)
{
    static const char *const gram[3] = {
        "root ::= (\"Tom\" | \"Lily\" | \"Ben\") \" \" (\"ran\" | \"sat\" | \"ate\") \".\"",
        NULL,
        "root ::= [a-z]+ (\" \" [a-z]+)* \".\"",
    };
    static const char *const schema =
        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},\"s\":{\"type\":\"string\",\"maxLength\":8}},"
        "\"required\":[\"n\",\"s\"],\"additionalProperties\":false}";
    eng *e = open_eng(model, 4);
    if (!e) { CHECK(0); return; }
    int32_t prompt[4][3];
    static res solo[4], host[4], many[4];
    memset(solo, 0, sizeof solo);
    memset(host, 0, sizeof host);
    memset(many, 0, sizeof many);
    for (int g = 0; g < 4; g++) {
        prompt[g][0] = 1; prompt[g][1] = t0 + 11 * g; prompt[g][2] = t0 + 5;
    }
    for (int g = 0; g < 3; g++) {
        CHECK(submit_g(e, prompt[g], 3, gram[g], g == 1 ? schema : NULL, 0, g) == 0);
        pump(e, solo, 1);
        CHECK(submit_g(e, prompt[g], 3, gram[g], g == 1 ? schema : NULL, 1, g) == 0);
        pump(e, host, 1);
    }
    CHECK(submit_g(e, prompt[3], 3, NULL, NULL, 0, 3) == 0);
    pump(e, solo, 1);
    for (int g = 0; g < 4; g++) CHECK(submit_g(e, prompt[g], 3, g < 3 ? gram[g] : NULL, g == 1 ? schema : NULL, 0, g) == 0);
    pump(e, many, 4);
    for (int g = 0; g < 4; g++) {
        CHECKF(solo[g].done && !solo[g].error && many[g].done && !many[g].error, "%s grammar %d: done", model, g);
        if (g < 3) {
            CHECKF(host[g].done && !host[g].error, "%s grammar %d: done (logprobs)", model, g);
            CHECKF(solo[g].n == host[g].n && !memcmp(solo[g].ids, host[g].ids, sizeof(int32_t) * (size_t)solo[g].n),
                   "%s grammar %d: greedy %.*s, from the host's logits %.*s", model, g, (int)solo[g].text_len,
                   solo[g].text, (int)host[g].text_len, host[g].text);
        }
        CHECKF(solo[g].n == many[g].n && !memcmp(solo[g].ids, many[g].ids, sizeof(int32_t) * (size_t)solo[g].n),
               "%s job %d: alone %.*s, batched %.*s", model, g, (int)solo[g].text_len, solo[g].text,
               (int)many[g].text_len, many[g].text);
    }
    /* the closed grammar: one of its nine sentences, then the end */
    const char *t = solo[0].text;
    int ok = solo[0].finish == ENG_FINISH_EOS && solo[0].text_len >= 7 && t[solo[0].text_len - 1] == '.' &&
             (!strncmp(t, "Tom ", 4) || !strncmp(t, "Lily ", 5) || !strncmp(t, "Ben ", 4));
    CHECKF(ok, "%s: closed grammar gave %.*s (finish %d)", model, (int)solo[0].text_len, t, (int)solo[0].finish);
    size_t k = 0;   /* (JSON may open with white space) */
    while (k < solo[1].text_len && strchr(" \t\r\n", solo[1].text[k])) k++;
    CHECKF(k == solo[1].text_len || solo[1].text[k] == '{', "%s: schema gave %.*s", model, (int)solo[1].text_len,
           solo[1].text);
    eng_close(e);
}

static void test_grammar_greedy(void)
{
    grammar_greedy(STORIES, 300);
    grammar_greedy(FIXTURE("models/qwen2-tiny.bf16.gguf"), 1000);
}

static void test_prefix_reuse(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    int32_t p[80];
    p[0] = 1;
    for (int i = 1; i < 80; i++) p[i] = 260 + (i * 37) % 200;
    res r[2];
    memset(r, 0, sizeof r);
    uint64_t id;
    CHECK(submit(e, p, 80, 16, 0, 0, 0, &id) == 0);
    pump(e, r, 1);
    CHECK(submit(e, p, 80, 16, 0, 0, 1, &id) == 0);
    pump(e, r, 1);
    CHECK_EQ_INT(r[0].cached, 0);
    CHECKF(r[1].cached >= 64, "reused %d prompt tokens", r[1].cached);
    CHECK_EQ_INT(r[1].prompt_tokens, 80);
    CHECK(r[0].n == r[1].n && !memcmp(r[0].ids, r[1].ids, sizeof(int32_t) * (size_t)r[0].n));
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK(st.cached_tokens >= 64);
    CHECK_EQ_INT(st.active, 0);
    CHECK_EQ_INT(st.kv_used, 0);
    eng_close(e);
}

static void test_cancel(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    int32_t bos = 1;
    res r[1];
    memset(r, 0, sizeof r);
    uint64_t id;
    CHECK(submit(e, &bos, 1, 0, 0.8f, 1, 0, &id) == 0);   /* until the context ends */
    usleep(20000);
    eng_cancel(e, id);
    pump(e, r, 1);
    CHECK(r[0].done);
    CHECK(r[0].finish == ENG_FINISH_CANCELLED);
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.active, 0);
    CHECK_EQ_INT(st.kv_used, 0);
    eng_cancel(e, 987654);     /* unknown: ignored */
    eng_close(e);
}

static void test_pause(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    int32_t bos = 1;
    res r[1];
    enum { N = 400 };
    uint64_t id;
    int before = 0, quiet = 0, ended = 0;
    /* the pause must reach the worker before the job is through; a thread
     * descheduled between submit and pause on a loaded machine can miss the
     * whole job (then there is nothing to pause): try again, up to 3 times */
    for (int attempt = 0; attempt < 3; attempt++) {
        memset(r, 0, sizeof r);
        CHECK(submit(e, &bos, 1, N, 0, 0, 0, &id) == 0);
        eng_pause(e, id, 1);
        /* a step already under way may still deliver its token (on a busy
         * machine a step can take long): wait for a quiet window, then nothing */
        before = 0; quiet = 0; ended = 0;
        for (int round = 0; round < 50 && quiet < 3; round++) {
            usleep(100000);
            int got = 0;
            for (eng_event *ev = eng_events_take(e); ev;) {
                eng_event *nx = ev->next;
                got += ev->type == ENG_EV_TOKEN;
                ended |= ev->type == ENG_EV_DONE;
                eng_event_free(ev);
                ev = nx;
            }
            before += got;
            quiet = got ? 0 : quiet + 1;
        }
        if (!(ended && before == N)) break;
    }
    /* tokens made before the pause reached the worker are fine; the job
     * must stand still, unfinished, until it is resumed */
    CHECKF(quiet == 3 && !ended && before < N, "%d tokens, ended %d", before, ended);
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.active + st.queued, 1);   /* kept, in the batch or waiting */
    eng_pause(e, id, 0);
    pump(e, r, 1);
    CHECK(r[0].done && r[0].finish == ENG_FINISH_LENGTH);
    CHECK_EQ_INT(r[0].n + before, N);
    eng_close(e);

    /* a paused job gives its place in the batch to others: one slot, A paused, B runs
     * (A long enough that the pause lands first; retried if a descheduled
     * test thread let A finish before pausing it) */
    res r2[2];
    uint64_t a, b2;
    for (int attempt = 0; attempt < 3; attempt++) {
        e = open_eng(STORIES, 1);
        if (!e) { CHECK(0); return; }
        memset(r2, 0, sizeof r2);
        CHECK(submit(e, &bos, 1, N, 0, 0, 0, &a) == 0);
        eng_pause(e, a, 1);
        CHECK(submit(e, &bos, 1, 16, 0, 0, 1, &b2) == 0);
        pump(e, r2, 1);
        if (!(r2[0].done && r2[0].n == N) || attempt == 2) break;
        eng_close(e);
    }
    CHECKF(r2[1].done && r2[1].n == 16, "B done %d n %d; A done %d n %d", r2[1].done, r2[1].n, r2[0].done, r2[0].n);
    CHECK(!r2[0].done);
    eng_pause(e, a, 0);
    pump(e, r2, 1);
    CHECK(r2[0].done && r2[0].finish == ENG_FINISH_LENGTH);
    CHECK_EQ_INT(r2[0].n, N);
    CHECK(!memcmp(r2[0].ids, ref_ids, 64 * sizeof(int32_t)));
    eng_close(e);
}

static void test_seeded_sampling(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    int32_t bos = 1;
    res r[3];
    memset(r, 0, sizeof r);
    uint64_t id;
    CHECK(submit(e, &bos, 1, 48, 1.0f, 42, 0, &id) == 0);
    CHECK(submit(e, &bos, 1, 48, 1.0f, 42, 1, &id) == 0);
    CHECK(submit(e, &bos, 1, 48, 1.0f, 7, 2, &id) == 0);
    pump(e, r, 3);
    CHECK(r[0].n == r[1].n && !memcmp(r[0].ids, r[1].ids, sizeof(int32_t) * (size_t)r[0].n));
    CHECK(r[0].n != r[2].n || memcmp(r[0].ids, r[2].ids, sizeof(int32_t) * (size_t)r[0].n) != 0);
    eng_close(e);
}

static void test_stop_string(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    eng_job_desc d = { 0 };
    int32_t bos = 1;
    const char *stop[1] = { "little girl" };
    size_t stop_len[1] = { 11 };
    d.kind = ENG_JOB_GENERATE;
    d.tokens = &bos;
    d.n_tokens = 1;
    d.max_tokens = 64;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    d.stop = stop;
    d.stop_len = stop_len;
    d.n_stop = 1;
    uint64_t id;
    eng_err code;
    char err[128];
    res r[1];
    memset(r, 0, sizeof r);
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == 0);
    pump(e, r, 1);
    CHECK(r[0].finish == ENG_FINISH_STOP);
    r[0].text[r[0].text_len] = 0;
    CHECKF(!strcmp(r[0].text, "Once upon a time, there was a "), "text before the stop: '%s'", r[0].text);
    eng_close(e);
}

static void test_eval(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    int32_t p[17] = { 1 };
    for (int i = 1; i < 17; i++) p[i] = ref_ids[i - 1];
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_EVAL;
    d.tokens = p;
    d.n_tokens = 17;
    d.top_n = 5;
    uint64_t id;
    eng_err code;
    char err[128];
    res r[1];
    memset(r, 0, sizeof r);
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == 0);
    pump(e, r, 1);
    CHECK_EQ_INT(r[0].n_logits, 17);
    /* the greedy continuation is the argmax at every position */
    int ok = 1;
    for (int i = 0; i < 17 && i < r[0].n_logits; i++) ok &= r[0].top1[i] == ref_ids[i];
    CHECK(ok);
    eng_close(e);
}

static void test_submit_errors(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    char err[256];
    eng_err code;
    uint64_t id;
    eng_job_desc d = { 0 };
    int32_t bad[2] = { 1, 512 };
    d.kind = ENG_JOB_GENERATE;
    d.tokens = bad;
    d.n_tokens = 2;
    eng_sampling_default(&d.sampling);
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_ETOKEN);
    bad[1] = -1;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_ETOKEN);
    bad[1] = 5;
    d.sampling.temperature = NAN;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_EINVAL);
    eng_sampling_default(&d.sampling);
    d.sampling.top_p = -0.1f;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_EINVAL);
    eng_sampling_default(&d.sampling);
    d.max_tokens = -5;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_EINVAL);
    d.max_tokens = 4;
    int n_long = eng_model(e)->n_ctx + 5;
    int32_t *lp = calloc((size_t)n_long, sizeof *lp);
    d.tokens = lp;
    d.n_tokens = (size_t)n_long;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_ECTX);
    free(lp);
    d.kind = ENG_JOB_EVAL;
    d.tokens = bad;
    d.n_tokens = 2;
    d.top_n = 0;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_EINVAL);
    eng_close(e);
}

/* ---- text prompts: tokenized on the engine's tokenizer thread ------------ */

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* this thread's CPU time: what a call did itself, however long a busy
 * machine kept it waiting */
static double cpu_ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A job's events as they were taken: when, and how it ended. */
typedef struct tres {
    int n_tok;
    int32_t ids[512];
    double first_ms, last_ms, max_gap_ms;
    int n_during;            /* tokens taken while the watched window was open */
    int ended, done, error;
    double end_ms;
    int order;               /* 1 + how many jobs ended before this one */
    eng_finish finish;
    int prompt_tokens;
    eng_err code;
    char message[160];
    int after_end;           /* events after the terminal one (must stay 0) */
} tres;

static int watch_open;       /* set by a test while a huge prompt is in the tokenizer */

static void tpump(eng *e, tres *r, int n, int until, double timeout_ms)
{
    int ended = 0;
    for (int i = 0; i < n; i++) ended += r[i].ended;
    double end = ms_now() + timeout_ms;
    while (ended < until && ms_now() < end) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(200); continue; }
        double t = ms_now();
        while (ev) {
            eng_event *nx = ev->next;
            tres *x = &r[(intptr_t)ev->user];
            if (x->ended) x->after_end++;
            else if (ev->type == ENG_EV_TOKEN) {
                if (x->n_tok < 512) x->ids[x->n_tok] = ev->token;
                if (x->n_tok && t - x->last_ms > x->max_gap_ms) x->max_gap_ms = t - x->last_ms;
                if (!x->n_tok) x->first_ms = t;
                x->last_ms = t;
                x->n_tok++;
                x->n_during += watch_open;
            } else if (ev->type == ENG_EV_DONE || ev->type == ENG_EV_ERROR) {
                x->ended = 1;
                x->end_ms = t;
                x->order = ++ended;
                if (ev->type == ENG_EV_DONE) {
                    x->done = 1; x->finish = ev->finish; x->prompt_tokens = ev->prompt_tokens;
                } else {
                    x->error = 1; x->code = ev->code;
                    snprintf(x->message, sizeof x->message, "%s", ev->message);
                }
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
}

static int submit_text(eng *e, eng_job_kind kind, const char *text, size_t len, int raw, int max_tokens,
                       uint32_t uid, intptr_t user, uint64_t *id, eng_err *code, char *err, size_t errlen)
{
    eng_job_desc d = { 0 };
    d.kind = kind;
    d.text = text;
    d.text_len = len;
    d.raw = raw;
    d.max_tokens = max_tokens;
    d.top_n = 3;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    d.uid = uid;
    d.owner = (uint64_t)user;
    d.user = (void *)user;
    return eng_submit(e, &d, id, code, err, errlen);
}

/* n bytes of story text (valid UTF-8, ASCII). */
static char *story_text(size_t n)
{
    static const char w[] = "Once upon a time there was a little girl named Lily. She liked to play in the park. ";
    char *t = malloc(n + 1);
    if (!t) return NULL;
    for (size_t i = 0; i < n; i++) t[i] = w[i % (sizeof w - 1)];
    t[n] = 0;
    return t;
}

/* A huge text prompt costs eng_submit a copy, not its encoding; a stream
 * already running keeps producing while it is encoded; the prompt's error
 * (over the context) arrives as the job's only event. */
static void test_huge_prompt_async(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    size_t big = 4u << 20;
    char *text = story_text(big);
    char err[256];
    eng_err code;
    int32_t *ids = NULL;
    size_t n = 0;
    double t0 = ms_now();
    CHECK(eng_tokenize(e, text, big, 1, 0, &ids, &n, &code, err, sizeof err) == 0);
    double tok_ms = ms_now() - t0;
    free(ids);

    tres r[2];
    memset(r, 0, sizeof r);
    int32_t bos = 1;
    uint64_t a, b;
    CHECK(submit(e, &bos, 1, 0, 0, 0, 0, &a) == 0);       /* greedy to the context's end */
    tpump(e, r, 2, 0, 0);
    for (double end = ms_now() + 10000; !r[0].n_tok && ms_now() < end;) tpump(e, r, 1, 1, 1);
    CHECK(r[0].n_tok > 0 && !r[0].ended);
    watch_open = 1;
    t0 = cpu_ms_now();
    int rc = submit_text(e, ENG_JOB_GENERATE, text, big, 1, 16, 0, 1, &b, &code, err, sizeof err);
    double sub_ms = cpu_ms_now() - t0;
    free(text);                                          /* eng_submit copied it */
    CHECKF(rc == 0, "%s", err);
    tpump(e, r, 2, 2, 60000);
    watch_open = 0;
    fprintf(stderr, "  encode %.1f ms, submit %.2f ms of CPU, stream's largest gap %.1f ms, %d tokens while encoding\n",
            tok_ms, sub_ms, r[0].max_gap_ms, r[0].n_during);
    /* (CPU time, not wall time: on a loaded machine the call can wait for a
     * core longer than it works; encoding inline would cost tok_ms of work) */
    CHECKF(sub_ms < tok_ms / 4, "submit took %.1f ms of CPU, encoding takes %.1f ms", sub_ms, tok_ms);
    CHECK(r[1].error && r[1].code == ENG_ECTX);
    CHECKF(strstr(r[1].message, "does not fit the context of") != NULL, "'%s'", r[1].message);
    CHECK(r[0].done && r[0].finish == ENG_FINISH_LENGTH);
    CHECK_EQ_INT(r[0].n_tok, eng_model(e)->n_ctx - 1);
    CHECK(!memcmp(r[0].ids, ref_ids, sizeof ref_ids));
    /* the stream went on while the prompt was encoded (tokenizing on the
     * worker would hold every token back until the prompt was through) */
    CHECKF(r[0].order == 1 || r[0].n_during > 0, "stream ended %d, %d tokens while encoding", r[0].order, r[0].n_during);
    CHECK(r[0].after_end == 0 && r[1].after_end == 0);
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.queued + st.active, 0);
    eng_close(e);
}

/* What the tokenizer finds wrong ends the job with ENG_EV_ERROR and the same
 * code and message a synchronous refusal had; cheap checks stay synchronous. */
static void test_prompt_errors_as_events(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    char err[256];
    eng_err code;
    uint64_t id;
    tres r[6];
    memset(r, 0, sizeof r);
    char *longt = story_text(20000);   /* some 6000 tokens: over the context of 2048 */
    CHECK(submit_text(e, ENG_JOB_GENERATE, "ab\xff\xfe", 4, 1, 8, 0, 0, &id, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_GENERATE, longt, 20000, 1, 8, 0, 1, &id, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_EVAL, longt, 20000, 1, 0, 0, 2, &id, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_GENERATE, "Once upon a time", 16, 1, 8, 0, 3, &id, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_EVAL, "Once upon a time", 16, 1, 0, 0, 4, &id, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_GENERATE, "", 0, 1, 4, 0, 5, &id, &code, err, sizeof err) == 0);
    free(longt);
    tpump(e, r, 6, 6, 30000);
    CHECK(r[0].error && r[0].code == ENG_EUTF8 && r[0].message[0]);
    CHECK(r[1].error && r[1].code == ENG_ECTX);
    char want[64];
    snprintf(want, sizeof want, "does not fit the context of %d", (int)eng_model(e)->n_ctx);
    CHECKF(!strncmp(r[1].message, "prompt of ", 10) && strstr(r[1].message, want), "'%s'", r[1].message);
    CHECK(r[2].error && r[2].code == ENG_ECTX);
    CHECK(r[3].done && r[3].finish == ENG_FINISH_LENGTH && r[3].n_tok == 8 && r[3].prompt_tokens >= 4);
    CHECK(r[4].done && r[4].prompt_tokens >= 4);
    CHECK(r[5].done && r[5].prompt_tokens == 1);       /* empty text: BOS alone */
    for (int i = 0; i < 6; i++) CHECK(r[i].after_end == 0);
    /* messages without a chat template: refused at once */
    eng_msg m = { "user", 4, "hi", 2, NULL, 0 };
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_GENERATE;
    d.msgs = &m;
    d.n_msgs = 1;
    eng_sampling_default(&d.sampling);
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_EINVAL);
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.queued + st.active, 0);
    eng_close(e);

    /* a model with a chat template: messages and system prompts */
    e = open_eng(FIXTURE("models/qwen2-tiny.bf16.gguf"), 4);
    if (!e) { CHECK(0); return; }
    memset(r, 0, sizeof r);
    eng_msg ok[2] = { { "system", 6, "Be brief.", 9, NULL, 0 }, { "user", 4, "Hello there", 11, NULL, 0 } };
    d.msgs = ok;
    d.n_msgs = 2;
    d.max_tokens = 4;
    d.sampling.temperature = 0;
    d.user = (void *)0;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == 0);
    eng_msg bad_utf8[1] = { { "user", 4, "\xc3", 1, NULL, 0 } };
    d.msgs = bad_utf8;
    d.n_msgs = 1;
    d.user = (void *)1;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == 0);
    eng_msg bad_role[2] = { { "user", 4, "hi", 2, NULL, 0 }, { "robot", 5, "beep", 4, NULL, 0 } };
    d.msgs = bad_role;
    d.n_msgs = 2;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_EINVAL);
    CHECKF(strstr(err, "message 1: role must be") != NULL, "'%s'", err);
    d.msgs = NULL;
    d.n_msgs = 0;
    d.text = "Hello there";
    d.text_len = 11;
    d.system = "Be brief.";
    d.system_len = 9;
    d.user = (void *)2;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == 0);
    tpump(e, r, 3, 3, 30000);
    CHECK(r[0].done && r[0].n_tok == 4);
    CHECK(r[1].error && r[1].code == ENG_EUTF8);
    CHECK(r[2].done && r[2].n_tok == 4);
    /* the same conversation, given as messages or as system + text */
    CHECK_EQ_INT(r[0].prompt_tokens, r[2].prompt_tokens);
    CHECK(!memcmp(r[0].ids, r[2].ids, 4 * sizeof(int32_t)));
    eng_close(e);
}

/* Cancelling a job whose prompt is being encoded, or waits to be, ends it at
 * once; the tokenizer goes on with the next prompt; closing with prompts in
 * the tokenizer frees them (ASan/LSan builds check). */
static void test_cancel_tokenizing(void)
{
    eng *e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    size_t big = 8u << 20;
    char *text = story_text(big);
    char err[256];
    eng_err code;
    uint64_t x, y, z;
    tres r[3];
    memset(r, 0, sizeof r);
    CHECK(submit_text(e, ENG_JOB_GENERATE, text, big, 1, 8, 0, 0, &x, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_GENERATE, text, big, 1, 8, 0, 1, &y, &code, err, sizeof err) == 0);
    usleep(2000);
    double t0 = ms_now();
    eng_cancel(e, x);
    eng_cancel(e, y);
    tpump(e, r, 2, 2, 60000);
    double cancel_ms = ms_now() - t0;
    CHECK(r[0].done && r[0].finish == ENG_FINISH_CANCELLED && r[0].prompt_tokens == 0);
    CHECK(r[1].done && r[1].finish == ENG_FINISH_CANCELLED && r[1].prompt_tokens == 0);
    CHECK(!r[0].error && !r[1].error);
    CHECK(submit_text(e, ENG_JOB_GENERATE, "Once upon a time", 16, 1, 8, 0, 2, &z, &code, err, sizeof err) == 0);
    t0 = ms_now();
    tpump(e, r, 3, 3, 60000);
    double next_ms = ms_now() - t0;
    fprintf(stderr, "  cancel took %.1f ms; the next prompt ended %.1f ms later\n", cancel_ms, next_ms);
    CHECK(r[2].done && r[2].finish == ENG_FINISH_LENGTH && r[2].n_tok == 8);
    CHECK(r[0].after_end == 0 && r[1].after_end == 0);
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.queued + st.active, 0);
    /* close with one prompt being encoded and one waiting */
    CHECK(submit_text(e, ENG_JOB_GENERATE, text, big, 1, 8, 0, 0, &x, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_EVAL, text, big, 1, 0, 0, 1, &y, &code, err, sizeof err) == 0);
    usleep(2000);
    eng_close(e);
    free(text);
}

/* Ready jobs are admitted oldest first whatever path their prompt took (a
 * text prompt encoded while later token prompts queue keeps its place); the
 * tokenizer takes uids in turns, so one uid's pile of huge prompts does not
 * hold up another uid's small one. */
static void test_tokenizer_order(void)
{
    eng *e = open_eng(STORIES, 1);
    if (!e) { CHECK(0); return; }
    char err[256];
    eng_err code;
    uint64_t id;
    tres r[4];
    memset(r, 0, sizeof r);
    int32_t bos = 1;
    CHECK(submit(e, &bos, 1, 0, 0, 0, 0, &id) == 0);      /* holds the one slot a while */
    CHECK(submit_text(e, ENG_JOB_GENERATE, "Once upon a time", 16, 1, 4, 0, 1, &id, &code, err, sizeof err) == 0);
    CHECK(submit(e, &bos, 1, 4, 0, 0, 2, &id) == 0);
    tpump(e, r, 3, 3, 60000);
    CHECK(r[0].done && r[1].done && r[2].done);
    CHECKF(r[0].order == 1 && r[1].order == 2 && r[2].order == 3, "order %d %d %d", r[0].order, r[1].order, r[2].order);
    eng_close(e);

    e = open_eng(STORIES, 4);
    if (!e) { CHECK(0); return; }
    size_t big = 4u << 20;
    char *text = story_text(big);
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++)
        CHECK(submit_text(e, ENG_JOB_GENERATE, text, big, 1, 4, 1000, i, &id, &code, err, sizeof err) == 0);
    CHECK(submit_text(e, ENG_JOB_GENERATE, "Once upon a time", 16, 1, 4, 2000, 3, &id, &code, err, sizeof err) == 0);
    tpump(e, r, 4, 4, 60000);
    for (int i = 0; i < 3; i++) CHECK(r[i].error && r[i].code == ENG_ECTX);
    CHECK(r[3].done && r[3].n_tok == 4);
    CHECKF(r[3].order <= 2, "the other uid's prompt ended %d of 4", r[3].order);
    free(text);
    eng_close(e);
}

/* ---- sharing the KV pool and the slots ------------------------------------ */

static int submit_as(eng *e, eng_job_kind kind, const int32_t *toks, size_t n, int max_tokens, uint32_t uid,
                     intptr_t user, uint64_t *id)
{
    eng_job_desc d = { 0 };
    char err[256];
    eng_err code;
    d.kind = kind;
    d.tokens = toks;
    d.n_tokens = n;
    d.max_tokens = max_tokens;
    d.top_n = 1;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    d.uid = uid;
    d.owner = (uint64_t)user;
    d.user = (void *)user;
    int rc = eng_submit(e, &d, id, &code, err, sizeof err);
    if (rc) fprintf(stderr, "submit: %s\n", err);
    return rc;
}

/* Waits until job `i` has at least `n` tokens (or ended). */
static void wait_tokens(eng *e, tres *r, int n_jobs, int i, int n)
{
    for (double end = ms_now() + 20000; r[i].n_tok < n && !r[i].ended && ms_now() < end;)
        tpump(e, r, n_jobs, n_jobs, 1);
}

/* Takes events until none came for quiet_ms. */
static void settle(eng *e, tres *r, int n_jobs, double quiet_ms)
{
    for (;;) {
        int before = 0, after = 0;
        for (int i = 0; i < n_jobs; i++) before += r[i].n_tok + r[i].ended;
        tpump(e, r, n_jobs, n_jobs, quiet_ms);
        for (int i = 0; i < n_jobs; i++) after += r[i].n_tok + r[i].ended;
        if (after == before) return;
    }
}

/* A paused job whose pages another job needs gives them up, and once
 * resumed computes its tokens again and goes on exactly as it would have
 * (greedy ids equal to an uninterrupted run). One sequence slot and the
 * default pool (one full context); B's prompt needs more than A leaves
 * (A holds the pages of its tokens: pages are taken as a sequence grows). */
static void evict_paused(const char *model)
{
    eng *e = open_eng(model, 1);
    if (!e) { CHECK(0); return; }
    int n_ctx = eng_model(e)->n_ctx;
    int N = n_ctx - 2 < 400 ? n_ctx - 2 : 400;
    int total = (n_ctx + 15) / 16;
    int32_t bos = 1;
    uint64_t id, a = 0, b;
    tres ref[1], r[2];
    memset(ref, 0, sizeof ref);
    CHECK(submit_as(e, ENG_JOB_GENERATE, &bos, 1, N, 1, 0, &id) == 0);
    tpump(e, ref, 1, 1, 60000);
    CHECK(ref[0].done && ref[0].n_tok > 40);   /* N, or fewer when the model ends its text */
    /* A pauses part-way (retried when a descheduled test thread let it finish first) */
    for (int attempt = 0; attempt < 5; attempt++) {
        memset(r, 0, sizeof r);
        CHECK(submit_as(e, ENG_JOB_GENERATE, &bos, 1, N, 1, 0, &a) == 0);
        wait_tokens(e, r, 2, 0, 20);
        eng_pause(e, a, 1);
        settle(e, r, 2, 100);
        if (!r[0].ended) break;
    }
    CHECKF(!r[0].ended && r[0].n_tok < ref[0].n_tok, "A ended %d with %d tokens", r[0].ended, r[0].n_tok);
    int paused_at = r[0].n_tok;
    eng_stats st0, st;
    eng_stats_get(e, &st0);
    /* B's prompt takes one page more than A leaves: A holds the pages of
     * its tokens at least (and of the next position, unless it paused
     * before the step after its last token) */
    int held = (1 + paused_at + 15) / 16, n_b = (total - held) * 16 + 1;
    int32_t *pb = malloc((size_t)n_b * sizeof *pb);
    CHECK(pb != NULL && n_b + 4 < n_ctx);
    if (!pb) { eng_close(e); return; }
    pb[0] = bos;
    for (int i = 1; i < n_b; i++) pb[i] = ref[0].ids[i % ref[0].n_tok];
    CHECK(submit_as(e, ENG_JOB_GENERATE, pb, (size_t)n_b, 4, 2, 1, &b) == 0);
    free(pb);
    tpump(e, r, 2, 1, 30000);
    CHECKF(r[1].done && r[1].n_tok > 0, "B (needs pages paused A holds): done %d, %d tokens", r[1].done, r[1].n_tok);
    CHECK(!r[0].ended);
    eng_stats_get(e, &st);
    CHECKF(st.evictions > st0.evictions, "%s: evictions %llu (A paused at %d, B's prompt %d of %d pages)", model,
           (unsigned long long)st.evictions, paused_at, n_b, total);
    eng_pause(e, a, 0);
    tpump(e, r, 2, 2, 60000);
    CHECK(r[0].done && r[0].finish == ref[0].finish);
    CHECK_EQ_INT(r[0].n_tok, ref[0].n_tok);
    /* The ids sent before the eviction are the uninterrupted run's on every
     * backend. After it, the CPU computes the evicted tokens again with the
     * same bits; CUDA computes them through its prompt path (cuBLAS), whose
     * sums differ from the decode GEMVs' in the last bits, as any prefix
     * reuse on CUDA does: there a later id may differ where two logits are
     * that close, which is said, not failed. */
    int m = N < 512 ? N : 512;
    CHECKF(!memcmp(r[0].ids, ref[0].ids, sizeof(int32_t) * (size_t)(paused_at < m ? paused_at : m)),
           "%s: ids sent before the eviction differ", model);
    int same = 0;
    while (same < m && r[0].ids[same] == ref[0].ids[same]) same++;
    if (!strcmp(eng_model(e)->backend, "cpu"))
        CHECKF(same == m, "%s: the evicted job's ids differ from an uninterrupted run at %d", model, same);
    else if (same < m)
        printf("  %s (%s): evicted job's ids equal the uninterrupted run's up to %d of %d\n", model,
               eng_model(e)->backend, same, m);
    CHECK(r[0].after_end == 0 && r[1].after_end == 0);
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.active + st.queued, 0);
    CHECK_EQ_INT(st.kv_used, 0);
    eng_close(e);
}

static void test_evict_paused(void)
{
    evict_paused(STORIES);
    evict_paused(FIXTURE("models/llama-q.Q4_K_M.gguf"));
    evict_paused(FIXTURE("models/qwen2-tiny.Q8_0.gguf"));
    evict_paused(FIXTURE("models/qwen35-tiny.bf16.gguf"));
}

/* Two slots, both taken by one uid's long jobs of one connection: another
 * uid's short job, or another connection's of the same uid, is admitted at
 * once (the younger long job is preempted, and later computes its tokens
 * again, ids unchanged); the same connection's waits its turn. */
static void test_preempt(void)
{
    eng *e = open_eng(STORIES, 2);
    if (!e) { CHECK(0); return; }
    enum { N = 400 };
    int32_t bos = 1;
    uint64_t id;
    tres ref[1], r[3];
    memset(ref, 0, sizeof ref);
    CHECK(submit_as(e, ENG_JOB_GENERATE, &bos, 1, N, 1, 0, &id) == 0);
    tpump(e, ref, 1, 1, 60000);
    static const char *const what[3] = { "another uid", "another connection", "the same connection" };
    for (int c = 0; c < 3; c++) {
        eng_stats st0, st;
        eng_stats_get(e, &st0);
        memset(r, 0, sizeof r);
        /* user doubles as owner: A1 and A2 share owner 10 */
        eng_job_desc d = { 0 };
        char err[256];
        eng_err code;
        d.kind = ENG_JOB_GENERATE;
        d.tokens = &bos;
        d.n_tokens = 1;
        d.max_tokens = N;
        eng_sampling_default(&d.sampling);
        d.sampling.temperature = 0;
        d.uid = 1;
        d.owner = 10;
        for (intptr_t u = 0; u < 3; u++) {
            if (u == 2) {
                d.max_tokens = 16;
                d.uid = c == 0 ? 2 : 1;
                d.owner = c == 2 ? 10 : 11;
            }
            d.user = (void *)u;
            CHECKF(eng_submit(e, &d, &id, &code, err, sizeof err) == 0, "%s", err);
            if (u == 1) {
                wait_tokens(e, r, 3, 0, 10);
                wait_tokens(e, r, 3, 1, 10);
            }
        }
        tpump(e, r, 3, 3, 60000);
        eng_stats_get(e, &st);
        for (int i = 0; i < 2; i++) {
            CHECK(r[i].done && r[i].n_tok == N);
            CHECKF(!memcmp(r[i].ids, ref[0].ids, sizeof(int32_t) * N), "job %d ids differ (%s)", i, what[c]);
        }
        CHECK(r[2].done && r[2].n_tok == 16);
        if (c < 2) {
            CHECKF(r[2].order == 1, "%s: the short job ended %d of 3", what[c], r[2].order);
            CHECK(st.evictions > st0.evictions);
        } else {
            /* no preemption within one connection: the short job waits for a
             * slot (it ends last unless the long ones drifted more than its
             * 16 tokens apart, as a loaded machine can make them) */
            CHECKF(r[2].order > 1, "%s: the short job ended %d of 3", what[c], r[2].order);
            CHECK(st.evictions == st0.evictions);
        }
    }
    eng_close(e);
}

/* Events of an eval job A (user 0) and a generate job B (user 1). */
typedef struct est {
    int32_t top[512];
    int seen[512];
    int n, dup, a_end, b_end, b_tok;
} est;

enum { E_QUIET, E_FIRST, E_B_END, E_A_END };

static void ecollect(eng *e, est *x, int until, double timeout_ms)
{
    double end = ms_now() + timeout_ms, last = ms_now();
    for (;;) {
        if ((until == E_FIRST && x->n > 0) || (until == E_B_END && x->b_end) || (until == E_A_END && x->a_end)) return;
        if (until == E_QUIET && ms_now() - last > 100) return;
        if (ms_now() > end) return;
        eng_event *ev = eng_events_take(e);
        if (!ev) { if (until != E_FIRST) usleep(200); continue; }
        last = ms_now();
        for (eng_event *v = ev, *nx; v; v = nx) {
            nx = v->next;
            int user = (int)(intptr_t)v->user;
            int term = v->type == ENG_EV_DONE || v->type == ENG_EV_ERROR;
            if (user == 0 && v->type == ENG_EV_LOGITS && v->pos >= 0 && v->pos < 512) {
                x->dup += x->seen[v->pos]++;
                x->top[v->pos] = v->top_ids[0];
                x->n++;
            }
            if (user == 0 && term) x->a_end = 1;
            if (user == 1 && v->type == ENG_EV_TOKEN) x->b_tok++;
            if (user == 1 && term) x->b_end = 1;
            eng_event_free(v);
        }
    }
}

/* An eval job evicted part-way gives each position's logits once, equal to
 * an uninterrupted run. */
static void test_evict_eval(void)
{
    eng *e = open_eng(STORIES, 1);
    if (!e) { CHECK(0); return; }
    int n_ctx = eng_model(e)->n_ctx;
    int P = n_ctx - 8 < 480 ? n_ctx - 8 : 480;
    int32_t *p = malloc((size_t)P * sizeof *p);
    p[0] = 1;
    for (int i = 1; i < P; i++) p[i] = 260 + (i * 37) % 200;
    int total = (n_ctx + 15) / 16, need_a = (P + 15) / 16, max_b = (total - need_a + 1) * 16 - 1;
    int32_t bos = 1;
    uint64_t id, a = 0;
    static est ref, x;
    memset(&ref, 0, sizeof ref);
    CHECK(submit_as(e, ENG_JOB_EVAL, p, (size_t)P, 0, 1, 0, &id) == 0);
    ecollect(e, &ref, E_A_END, 30000);
    CHECK(ref.n == P && ref.dup == 0);
    int mid = 0;
    for (int attempt = 0; attempt < 8 && !mid; attempt++) {
        memset(&x, 0, sizeof x);
        CHECK(submit_as(e, ENG_JOB_EVAL, p, (size_t)P, 0, 1, 0, &a) == 0);
        ecollect(e, &x, E_FIRST, 30000);
        eng_pause(e, a, 1);
        ecollect(e, &x, E_QUIET, 30000);
        if (x.a_end) continue;                  /* finished before the pause landed */
        mid = 1;
        CHECK(submit_as(e, ENG_JOB_GENERATE, &bos, 1, max_b, 2, 1, &id) == 0);
        ecollect(e, &x, E_B_END, 30000);
        CHECKF(x.b_end && x.b_tok == max_b && !x.a_end, "B ended %d (%d tokens), A ended %d", x.b_end, x.b_tok, x.a_end);
        eng_pause(e, a, 0);
        ecollect(e, &x, E_A_END, 30000);
    }
    CHECKF(mid, "the eval was never paused part-way");
    CHECKF(x.a_end && x.n == P && x.dup == 0, "%d positions of %d, %d twice", x.n, P, x.dup);
    CHECK(!memcmp(x.top, ref.top, sizeof(int32_t) * (size_t)(P < 512 ? P : 512)));
    free(p);
    eng_close(e);
}

static void test_tokenizer_only(void)
{
    eng *e = open_eng(FIXTURE("tokenizers/llama.cpp/ggml-vocab-llama-spm.gguf"), 4);
    CHECK(e != NULL);
    if (!e) return;
    CHECK(eng_model(e)->tokenizer_only);
    char err[256];
    eng_err code;
    uint64_t id;
    int32_t *ids;
    size_t n;
    CHECK(eng_tokenize(e, "Hello world", 11, 1, 0, &ids, &n, &code, err, sizeof err) == 0);
    CHECK(n >= 2 && ids[0] == eng_model(e)->bos);
    char *text;
    size_t len;
    CHECK(eng_detokenize(e, ids, n, &text, &len, &code, err, sizeof err) == 0);
    CHECK(len == 11 && !memcmp(text, "Hello world", 11));
    free(text);
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_GENERATE;
    d.tokens = ids;
    d.n_tokens = n;
    eng_sampling_default(&d.sampling);
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == -1 && code == ENG_ENOMODEL);
    free(ids);
    eng_stats st;   /* (no KV pool to count) */
    eng_stats_get(e, &st);
    CHECK(st.active + st.queued == 0 && st.kv_used == 0 && st.kv_total == 0);
    eng_close(e);
}

static void test_open_errors(void)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = "/nonexistent/model.gguf";
    CHECK(eng_open(&e, &o, err, sizeof err) == -1);
    CHECK(strstr(err, "/nonexistent/model.gguf") != NULL);
    o.model_path = "tests/fixtures/README.md";
    CHECK(eng_open(&e, &o, err, sizeof err) == -1);
    CHECK(strstr(err, "GGUF") != NULL);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_greedy_reference);
    RUN(test_batch_invariance);
    RUN(test_grammar_greedy);
    RUN(test_prefix_reuse);
    RUN(test_cancel);
    RUN(test_pause);
    RUN(test_seeded_sampling);
    RUN(test_stop_string);
    RUN(test_eval);
    RUN(test_submit_errors);
    RUN(test_huge_prompt_async);
    RUN(test_prompt_errors_as_events);
    RUN(test_cancel_tokenizing);
    RUN(test_tokenizer_order);
    RUN(test_evict_paused);
    RUN(test_preempt);
    RUN(test_evict_eval);
    RUN(test_tokenizer_only);
    RUN(test_open_errors);
    return CHECK_DONE();
}
