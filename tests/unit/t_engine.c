/* t_engine — the engine through its public header: greedy decoding against
 * the llama2.c reference, batch invariance, prefix reuse, cancellation, stop
 * strings, seeded sampling, and every submit-time error. */
#include "engine/engine.h"
#include "tests/check.h"

#include <stdlib.h>
#include <string.h>
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
    memset(r, 0, sizeof r);
    uint64_t id;
    CHECK(submit(e, &bos, 1, 64, 0, 0, 0, &id) == 0);
    eng_pause(e, id, 1);
    /* a step already under way may still deliver its token (on a busy
     * machine a step can take long): wait for a quiet window, then nothing */
    int before = 0, quiet = 0, ended = 0;
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
    /* tokens made before the pause reached the worker are fine; the job
     * must stand still, unfinished, until it is resumed */
    CHECKF(quiet == 3 && !ended && before < 64, "%d tokens, ended %d", before, ended);
    eng_stats st;
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.active + st.queued, 1);   /* kept, in the batch or waiting */
    eng_pause(e, id, 0);
    pump(e, r, 1);
    CHECK(r[0].done && r[0].finish == ENG_FINISH_LENGTH);
    CHECK_EQ_INT(r[0].n + before, 64);
    eng_close(e);

    /* a paused job gives its place in the batch to others: one slot, A paused, B runs */
    e = open_eng(STORIES, 1);
    if (!e) { CHECK(0); return; }
    res r2[2];
    memset(r2, 0, sizeof r2);
    uint64_t a, b2;
    CHECK(submit(e, &bos, 1, 64, 0, 0, 0, &a) == 0);
    eng_pause(e, a, 1);
    CHECK(submit(e, &bos, 1, 16, 0, 0, 1, &b2) == 0);
    pump(e, r2, 1);
    CHECKF(r2[1].done && r2[1].n == 16, "B done %d n %d; A done %d n %d", r2[1].done, r2[1].n, r2[0].done, r2[0].n);
    CHECK(!r2[0].done);
    eng_pause(e, a, 0);
    pump(e, r2, 1);
    CHECK(r2[0].done && r2[0].finish == ENG_FINISH_LENGTH);
    CHECK_EQ_INT(r2[0].n, 64);
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
    d.sampling.top_p = 0;
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

int main(void)
{
    RUN(test_greedy_reference);
    RUN(test_batch_invariance);
    RUN(test_prefix_reuse);
    RUN(test_cancel);
    RUN(test_pause);
    RUN(test_seeded_sampling);
    RUN(test_stop_string);
    RUN(test_eval);
    RUN(test_submit_errors);
    RUN(test_tokenizer_only);
    RUN(test_open_errors);
    return CHECK_DONE();
}
