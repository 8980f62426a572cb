/* t_models — every architecture and weight format against references made
 * by other tools (tests/fixtures/refs): transformers float64 for bf16 files
 * and Hugging Face directories (tolerance 0.05), llama.cpp for quantized files
 * (0.15). For each case: the top-10 logits at every prompt position within
 * the tolerance, top-1 equal where the reference's top-2 margin exceeds it,
 * and greedy ids equal up to the first step whose margin is below it. */
#include "engine/engine.h"
#include "engine/arch/forward.h"
#include "engine/backend/backend.h"
#include "engine/load/gguf.h"
#include "engine/load/hf.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct evres { int n_pos; int32_t (*ids)[10]; float (*vals)[10]; int32_t gen[64]; int n_gen; int done; } evres;

#define CROWD 32   /* jobs at once in check_crowd */

/* Submits the n jobs d (n <= CROWD) and gathers each one's events into r[i]
 * (done set at its DONE or ERROR) until every submitted job is done. */
static void run_jobs(eng *e, int n, const eng_job_desc *d, evres *r)
{
    uint64_t ids[CROWD];
    int sent[CROWD] = { 0 }, live = 0;
    for (int i = 0; i < n && i < CROWD; i++) {
        char err[256];
        eng_err code;
        if (eng_submit(e, &d[i], &ids[i], &code, err, sizeof err)) fprintf(stderr, "submit: %s\n", err);
        else { sent[i] = 1; live++; }
    }
    for (int spins = 0; live > 0 && spins < 400000; spins++) {
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(250); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            int i = 0;
            while (i < n && !(sent[i] && ids[i] == ev->job_id)) i++;
            evres *x = i < n && !r[i].done ? &r[i] : NULL;
            if (!x) {
                /* (another job's) */
            } else if (ev->type == ENG_EV_LOGITS && ev->pos < x->n_pos) {
                for (int k = 0; k < 10 && k < ev->n_top; k++) {
                    x->ids[ev->pos][k] = ev->top_ids[k];
                    x->vals[ev->pos][k] = ev->top_logits[k];
                }
            } else if (ev->type == ENG_EV_TOKEN && x->n_gen < 64) {
                x->gen[x->n_gen++] = ev->token;
            } else if (ev->type == ENG_EV_DONE || ev->type == ENG_EV_ERROR) {
                x->done = 1;
                live--;
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
}

static void run_job(eng *e, const eng_job_desc *d, evres *r) { run_jobs(e, 1, d, r); }

/* The first step at which the ids generated in g differ from case c's
 * greedy reference while the reference's margin there is at least tol
 * (*want: the reference id); -1 when none. */
static int greedy_miss(json_t *c, const evres *g, double tol, int32_t *want)
{
    json_t *greedy = json_object_get(c, "greedy"), *gm = json_object_get(c, "greedy_margin");
    for (size_t i = 0; i < json_array_size(greedy); i++) {
        if (json_number_value(json_array_get(gm, i)) < tol) break;
        *want = (int32_t)json_integer_value(json_array_get(greedy, i));
        if ((int)i >= g->n_gen || g->gen[i] != *want) return (int)i;
    }
    return -1;
}

/* The greedy references again, CROWD jobs at once (the cases round-robin):
 * decode batches past 16 rows, which a GPU computes with other kernels than
 * a lone sequence's, held to the same bar. */
static void check_crowd(eng *e, const char *mname, json_t *cases, double tol)
{
    size_t nc = json_array_size(cases);
    if (!nc) return;
    eng_job_desc d[CROWD];
    evres r[CROWD];
    memset(d, 0, sizeof d);
    memset(r, 0, sizeof r);
    for (int j = 0; j < CROWD; j++) {
        json_t *c = json_array_get(cases, (size_t)j % nc), *jt = json_object_get(c, "tokens");
        size_t n = json_array_size(jt);
        int32_t *toks = malloc((n ? n : 1) * sizeof *toks);
        for (size_t i = 0; i < n; i++) toks[i] = (int32_t)json_integer_value(json_array_get(jt, i));
        d[j].kind = ENG_JOB_GENERATE;
        d[j].tokens = toks;
        d[j].n_tokens = n;
        d[j].max_tokens = (int32_t)json_array_size(json_object_get(c, "greedy"));
        eng_sampling_default(&d[j].sampling);
        d[j].sampling.temperature = 0;
    }
    run_jobs(e, CROWD, d, r);
    int unfinished = 0, bad = 0;
    for (int j = 0; j < CROWD; j++) unfinished += !r[j].done;
    CHECKF(unfinished == 0, "%s crowd: %d jobs unfinished", mname, unfinished);
    for (int j = 0; j < CROWD; j++) {
        int32_t want = -1;
        int i = greedy_miss(json_array_get(cases, (size_t)j % nc), &r[j], tol, &want);
        if (i >= 0) {
            bad++;
            CHECKF(0, "%s crowd job %d (case %d): greedy step %d gave %d, reference %d", mname, j,
                   (int)((size_t)j % nc), i, i < r[j].n_gen ? r[j].gen[i] : -1, want);
        }
        free((void *)d[j].tokens);
    }
    fprintf(stderr, "  %-44s %d jobs at once: greedy misses %d\n", "", CROWD, bad);
}

static const char *g_gpus;   /* test_gpus: the engine's --gpus, and --split layers */
static int g_split_layers;

static void check_model(const char *mname, const char *ref, double tol, int kv_type)
{
    char err[512];
    json_error_t je;
    json_t *root = json_load_file(ref, 0, &je);
    CHECKF(root != NULL, "%s: %s", ref, je.text);
    if (!root) return;
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = mname;
    o.n_threads = 2;
    o.kv_type = kv_type;
    o.max_seqs = CROWD;
    o.backend = getenv("ANE_BACKEND");   /* e.g. cuda; NULL: the best present */
    o.gpus = g_gpus;
    o.split_layers = g_split_layers;
    if (eng_open(&e, &o, err, sizeof err)) {
        CHECKF(0, "%s", err);
        json_decref(root);
        return;
    }
    json_t *cases = json_object_get(root, "cases");
    size_t ci;
    json_t *c;
    double worst = 0;
    int top1_bad = 0, greedy_bad = 0, positions = 0;
    json_array_foreach(cases, ci, c) {
        json_t *jt = json_object_get(c, "tokens"), *top = json_object_get(c, "top10");
        size_t n = json_array_size(jt);
        int32_t *toks = malloc(n * sizeof *toks);
        for (size_t i = 0; i < n; i++) toks[i] = (int32_t)json_integer_value(json_array_get(jt, i));
        evres r = { 0 };
        r.n_pos = (int)n;
        r.ids = calloc(n, sizeof *r.ids);
        r.vals = calloc(n, sizeof *r.vals);
        eng_job_desc d = { 0 };
        d.kind = ENG_JOB_EVAL;
        d.tokens = toks;
        d.n_tokens = n;
        d.top_n = 10;
        run_job(e, &d, &r);
        CHECK(r.done);
        for (size_t p = 0; p < n && p < json_array_size(top); p++) {
            json_t *tp = json_array_get(top, p);
            positions++;
            for (size_t k = 0; k < json_array_size(tp); k++) {
                int32_t id = (int32_t)json_integer_value(json_array_get(json_array_get(tp, k), 0));
                double v = json_number_value(json_array_get(json_array_get(tp, k), 1));
                for (int q = 0; q < 10; q++)
                    if (r.ids[p][q] == id) {
                        double dv = fabs(r.vals[p][q] - v);
                        if (dv > worst) worst = dv;
                        CHECKF(dv <= tol, "%s case %zu pos %zu token %d: %g vs %g", mname, ci, p, id, r.vals[p][q], v);
                    }
            }
            double margin = json_number_value(json_array_get(json_array_get(tp, 0), 1)) -
                            json_number_value(json_array_get(json_array_get(tp, 1), 1));
            int32_t want = (int32_t)json_integer_value(json_array_get(json_array_get(tp, 0), 0));
            if (margin > tol && r.ids[p][0] != want) {
                top1_bad++;
                CHECKF(0, "%s case %zu pos %zu: top-1 %d, reference %d (margin %.3f)", mname, ci, p, r.ids[p][0], want, margin);
            }
        }
        /* greedy */
        evres g = { 0 };
        d.kind = ENG_JOB_GENERATE;
        d.max_tokens = (int32_t)json_array_size(json_object_get(c, "greedy"));
        eng_sampling_default(&d.sampling);
        d.sampling.temperature = 0;
        run_job(e, &d, &g);
        int32_t want = -1;
        int miss = greedy_miss(c, &g, tol, &want);
        if (miss >= 0) {
            greedy_bad++;
            CHECKF(0, "%s case %zu: greedy step %d gave %d, reference %d", mname, ci, miss,
                   miss < g.n_gen ? g.gen[miss] : -1, want);
        }
        free(r.ids);
        free(r.vals);
        free(toks);
    }
    fprintf(stderr, "  %-44s %4d positions, max |dlogit| %.4f (tol %.2f), top-1 misses %d, greedy misses %d\n",
            mname, positions, worst, tol, top1_bad, greedy_bad);
    check_crowd(e, mname, cases, tol);
    eng_close(e);
    json_decref(root);
}

#define M(f) FIXTURE("models/" f)
#define R(f) FIXTURE("refs/" f)

static void test_bf16_vs_transformers(void)
{
    check_model(M("qwen2-tiny.bf16.gguf"), R("qwen2-tiny.dev.json"), 0.05, 0);
    check_model(M("qwen3-tiny.bf16.gguf"), R("qwen3-tiny.dev.json"), 0.05, 0);
    check_model(M("llama3-tiny.bf16.gguf"), R("llama3-tiny.dev.json"), 0.05, 0);
    check_model(M("llama-q.bf16.gguf"), R("llama-q.dev.json"), 0.05, 0);
    check_model(M("qwen35-tiny.bf16.gguf"), R("qwen35-tiny.dev.json"), 0.05, 0);
}

/* the second set: Gemma 3 (sliding-window and global layers, GeGLU, post
 * norms) and GPT-2 (learned positions, layernorm, fused QKV, GELU) */
static void test_gemma3_gpt2(void)
{
    check_model(M("gemma3-tiny.bf16.gguf"), R("gemma3-tiny.dev.json"), 0.05, 0);
    check_model(M("gemma3-tiny.bf16.gguf"), R("gemma3-tiny.dev.json"), 0.05, ENG_KV_F32);
    check_model(M("gpt2-tiny.bf16.gguf"), R("gpt2-tiny.dev.json"), 0.05, 0);
    check_model(M("gpt2-tiny.bf16.gguf"), R("gpt2-tiny.bf16.llamacpp.dev.json"), 0.05, 0);
}

/* learned positions end at context_length: a longer context is refused */
static void test_gpt2_context(void)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = M("gpt2-tiny.bf16.gguf");
    o.n_threads = 1;
    o.n_ctx = 1025;
    CHECK(eng_open(&e, &o, err, sizeof err) != 0);
    CHECKF(strstr(err, "gpt2-tiny.bf16.gguf") && strstr(err, "gpt2.context_length 1024"), "%s", err);
    o.n_ctx = 1024;
    CHECKF(eng_open(&e, &o, err, sizeof err) == 0, "%s", err);
    if (e) eng_close(e);
}

static void test_kv_f32(void)
{
    check_model(M("qwen3-tiny.bf16.gguf"), R("qwen3-tiny.dev.json"), 0.05, ENG_KV_F32);
}

/* A q8_0 KV cache (aned --kv-type q8_0) against the same references: the
 * keys' and values' rounding to 8 bits costs accuracy, within tolerances
 * docs/cuda.md gives with the measured differences (transformers' float64
 * logits; llama.cpp's ran with an f16 cache, so those rows hold both
 * models' rounding). Models whose head_dim is not a multiple of 32 are
 * refused with a message that says so. */
static void test_kv_q8_0(void)
{
    check_model(M("qwen3-tiny.bf16.gguf"), R("qwen3-tiny.dev.json"), 0.1, ENG_KV_Q8_0);
    check_model(M("llama-q.bf16.gguf"), R("llama-q.dev.json"), 0.1, ENG_KV_Q8_0);
    check_model(M("qwen35-tiny.bf16.gguf"), R("qwen35-tiny.dev.json"), 0.1, ENG_KV_Q8_0);
    /* sliding windows, sinks, a given scale (attention_ex). These two are
     * the most sensitive to the cache's rounding (an f16 cache already
     * costs gemma3-tiny 0.035 where an f32 one gives 0.0000): q8_0 costs
     * them 0.40 and 0.18 */
    check_model(M("gemma3-tiny.bf16.gguf"), R("gemma3-tiny.dev.json"), 0.5, ENG_KV_Q8_0);
    check_model(M("gptoss-tiny.bf16.gguf"), R("gptoss-tiny.dev.json"), 0.25, ENG_KV_Q8_0);
    check_model(M("llama-q.Q8_0.gguf"), R("llama-q.Q8_0.llamacpp.dev.json"), 0.2, ENG_KV_Q8_0);
    check_model(M("llama-q.Q4_K_M.gguf"), R("llama-q.Q4_K_M.llamacpp.dev.json"), 0.2, ENG_KV_Q8_0);
    check_model(M("llama-q.Q6_K.gguf"), R("llama-q.Q6_K.llamacpp.dev.json"), 0.2, ENG_KV_Q8_0);
    char err[512] = "";
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = M("qwen2-tiny.bf16.gguf");   /* head_dim 16 */
    o.n_threads = 1;
    o.kv_type = ENG_KV_Q8_0;
    o.backend = getenv("ANE_BACKEND");
    CHECK(eng_open(&e, &o, err, sizeof err) != 0);
    CHECKF(strstr(err, "q8_0") && strstr(err, "head_dim") && strstr(err, "16"), "%s", err);
    if (e) eng_close(e);
}

/* On an accelerator (ANE_BACKEND=cuda): a KV pool or context the device
 * cannot hold is a start-up error naming the bytes needed and free, before
 * anything is allocated (fw_mem_estimate); the CPU backend has no such
 * check (its memory is the host's, taken as used). */
static void test_too_big(void)
{
    const char *bk = getenv("ANE_BACKEND");
    if (!bk || !strcmp(bk, "cpu")) {
        fprintf(stderr, "  (no accelerator backend asked for: nothing to check)\n");
        return;
    }
    /* (a context alone no longer asks for max_seqs full contexts: pages are
     * taken as sequences grow, and one 16M-token context of this model fits
     * a large card) */
    for (int k = 0; k < 2; k++) {
        char err[512] = "";
        eng *e = NULL;
        eng_opts o = { 0 };
        o.model_path = M("qwen3-tiny.bf16.gguf");
        o.n_threads = 2;
        o.backend = bk;
        o.kv_budget = k == 0 ? (size_t)1 << 42 : (size_t)1 << 41;   /* 4 TiB, 2 TiB with a long context */
        if (k) o.n_ctx = 16777216;
        CHECKF(eng_open(&e, &o, err, sizeof err) != 0, "a KV budget the device cannot hold was accepted");
        CHECKF(strstr(err, "device memory") && strstr(err, "are free") && strstr(err, "KV pool") &&
               strstr(err, "qwen3-tiny"), "%s", err);
        fprintf(stderr, "  %s\n", err);
        if (e) eng_close(e);
        /* and the device is left as it was: a model that fits opens */
        eng_opts ok = { 0 };
        ok.model_path = o.model_path;
        ok.n_threads = 2;
        ok.backend = bk;
        CHECKF(eng_open(&e, &ok, err, sizeof err) == 0, "%s", err);
        if (e) eng_close(e);
    }
}

static void test_hf_directory(void)
{
    /* the directory the qwen2-tiny GGUF was converted from gives the same results */
    check_model(FIXTURE("hf/qwen2-tiny"), R("qwen2-tiny.dev.json"), 0.05, 0);
    check_model(FIXTURE("hf/qwen2-tiny"), R("qwen2-tiny.bf16.llamacpp.dev.json"), 0.05, 0);
    check_model(FIXTURE("hf/gpt2-tiny"), R("gpt2-tiny.dev.json"), 0.05, 0);
}

static void test_quantized_vs_llamacpp(void)
{
    check_model(M("qwen2-tiny.Q8_0.gguf"), R("qwen2-tiny.Q8_0.llamacpp.dev.json"), 0.15, 0);
    check_model(M("llama-q.Q8_0.gguf"), R("llama-q.Q8_0.llamacpp.dev.json"), 0.15, 0);
    check_model(M("llama-q.Q4_0.gguf"), R("llama-q.Q4_0.llamacpp.dev.json"), 0.15, 0);
    check_model(M("llama-q.Q4_K_M.gguf"), R("llama-q.Q4_K_M.llamacpp.dev.json"), 0.15, 0);
    check_model(M("llama-q.Q6_K.gguf"), R("llama-q.Q6_K.llamacpp.dev.json"), 0.15, 0);
    check_model(M("llama-q.IQ4_XS.gguf"), R("llama-q.IQ4_XS.llamacpp.dev.json"), 0.15, 0);
    check_model(M("llama-q.IQ4_NL.gguf"), R("llama-q.IQ4_NL.llamacpp.dev.json"), 0.15, 0);
    check_model(M("llama-q.bf16.gguf"), R("llama-q.bf16.llamacpp.dev.json"), 0.15, 0);
}

/* Mixture-of-experts models: each case's prompt and reference greedy
 * tokens through the CPU in one pass, counting the router choices whose
 * last chosen and first unchosen logits are within 1e-5 (where float64
 * may choose otherwise); reported, not held against the model. */
static void report_router_ties(const char *model_path, const char *ref)
{
    json_error_t je;
    json_t *root = json_load_file(ref, 0, &je);
    model *m = NULL;
    pool *p = NULL;
    be *b = NULL;
    fw *f = NULL;
    char err[512];
    if (!root || model_load(&m, model_path, err, sizeof err) || pool_open(&p, 2) ||
        be_cpu_open(&b, p, 1, err, sizeof err) || model_prepare(m, b, err, sizeof err) ||
        fw_open(&f, m, b, 256, 1, 32, 1, err, sizeof err)) {
        CHECKF(0, "%s: cannot run (%s)", model_path, err);
        goto out;
    }
    long ties = 0, choices = 0;
    size_t ci;
    json_t *c;
    be_cpu_moe_ties(b);
    json_array_foreach(json_object_get(root, "cases"), ci, c) {
        json_t *jt = json_object_get(c, "tokens"), *gr = json_object_get(c, "greedy");
        int n = (int)json_array_size(jt), ng = (int)json_array_size(gr), T = n + ng;
        if (T > 256) T = 256;
        int32_t toks[256], pos[256], pages[16], *pg[256], out = T - 1;
        for (int i = 0; i < T; i++) {
            toks[i] = (int32_t)json_integer_value(i < n ? json_array_get(jt, (size_t)i) : json_array_get(gr, (size_t)(i - n)));
            pos[i] = i;
            pg[i] = pages;
        }
        for (int i = 0; i < 16; i++) pages[i] = i;
        be_batch bt = { .T = T, .pos = pos, .pages = (const int32_t *const *)pg };
        float *lg = malloc((size_t)m->hp.n_vocab * 4);
        fw_run(f, toks, &bt, &out, 1, lg);
        free(lg);
        choices += (long)T * m->hp.n_layer;
    }
    ties = be_cpu_moe_ties(b);
    fprintf(stderr, "  %-44s router near-ties (logits within 1e-5): %ld of %ld token-layer choices\n", model_path,
            ties, choices);
out:
    fw_close(f);
    if (b) b->ops->close(b);
    pool_close(p);
    model_free(m);
    json_decref(root);
}

static void test_moe_vs_transformers(void)
{
    check_model(M("qwen3moe-tiny.bf16.gguf"), R("qwen3moe-tiny.dev.json"), 0.05, 0);
    report_router_ties(M("qwen3moe-tiny.bf16.gguf"), R("qwen3moe-tiny.dev.json"));
    check_model(M("mixtral-tiny.bf16.gguf"), R("mixtral-tiny.dev.json"), 0.05, 0);
    report_router_ties(M("mixtral-tiny.bf16.gguf"), R("mixtral-tiny.dev.json"));
    /* the directory the qwen3moe GGUF was converted from (experts stacked on load) */
    check_model(FIXTURE("hf/qwen3moe-tiny"), R("qwen3moe-tiny.dev.json"), 0.05, 0);
    /* (not against refs/<model>.bf16.llamacpp.dev.json: llama.cpp itself is up to
     * 0.76 (qwen3moe) and 0.59 (mixtral) from transformers on these files,
     * which define the architectures) */
}


/* A gpt-oss directory as released (MXFP4 experts) made from two fixtures:
 * hf/gptoss-tiny's tensors, its experts replaced by the MXFP4 experts of
 * gptoss-tiny.MXFP4_MOE.gguf written in the release's layout (llama.cpp's
 * converter reads it back: gate_up_proj_blocks [X][2F][E/32][16] with gate
 * and up rows interleaved, a code byte holding values 2k and 2k + 1, and
 * _scales [X][2F][E/32] of E8M0 bytes; down_proj likewise [X][E][F/32]).
 * Returns the directory (static) or NULL. */
static const char *make_gptoss_mxfp4(void)
{
    static char dir[64];
    char err[300], p[128];
    snprintf(dir, sizeof dir, "/tmp/t_models_mxfp4.XXXXXX");
    if (!mkdtemp(dir)) return NULL;
    gguf *g = NULL;
    CHECKF(gguf_open(&g, M("gptoss-tiny.MXFP4_MOE.gguf"), err, sizeof err) == 0, "%s", err);
    if (!g) return NULL;
    FILE *f = fopen(FIXTURE("hf/gptoss-tiny/model.safetensors"), "rb");
    CHECK(f != NULL);
    if (!f) { gguf_close(g); return NULL; }
    fseek(f, 0, SEEK_END);
    long fl = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *src = malloc((size_t)fl);
    CHECK(src && fread(src, 1, (size_t)fl, f) == (size_t)fl);
    fclose(f);
    uint64_t hl;
    memcpy(&hl, src, 8);
    json_t *hdr = json_loadb((const char *)src + 8, (size_t)hl, 0, NULL), *nh = json_object();
    const uint8_t *data = src + 8 + hl;
    /* the new file's data, in the order written */
    size_t cap = (size_t)fl * 2, len = 0;
    uint8_t *out = malloc(cap);
    const char *key;
    json_t *v;
    json_object_foreach(hdr, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        const char *dot = strrchr(key, '.');
        if (!strcmp(dot, ".gate_up_proj") || !strcmp(dot, ".down_proj")) continue;   /* replaced below */
        size_t b = (size_t)json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 0)),
               e = (size_t)json_integer_value(json_array_get(json_object_get(v, "data_offsets"), 1));
        memcpy(out + len, data + b, e - b);
        json_object_set_new(nh, key, json_pack("{s:O,s:O,s:[I,I]}", "dtype", json_object_get(v, "dtype"), "shape",
                                               json_object_get(v, "shape"), "data_offsets", (json_int_t)len,
                                               (json_int_t)(len + e - b)));
        len += e - b;
    }
    const int X = 4, E = 64, F = 64;
    for (int l = 0; l < 2; l++) {
        const gguf_tensor *gt[3];
        static const char *const nm[3] = { "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight" };
        for (int k = 0; k < 3; k++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.%s", l, nm[k]);
            gt[k] = gguf_tensor_find(g, n);
            CHECKF(gt[k] && gt[k]->type == QT_MXFP4, "%s: no MXFP4 %s", M("gptoss-tiny.MXFP4_MOE.gguf"), n);
            if (!gt[k]) { free(out); free(src); gguf_close(g); return NULL; }
        }
        for (int part = 0; part < 2; part++) {   /* 0: gate_up, 1: down */
            const int rows = part ? E : 2 * F, nb = (part ? F : E) / 32;
            size_t cb = len, sb = cb + (size_t)X * rows * nb * 16;
            for (int x = 0; x < X; x++)
                for (int r = 0; r < rows; r++) {
                    /* GGUF row: gate row r / 2 (even r), up row r / 2 (odd), or down row r */
                    const gguf_tensor *t = part ? gt[2] : gt[r & 1];
                    const int gr = part ? r : r / 2, grows = part ? E : F;
                    const uint8_t *row = (const uint8_t *)t->data + ((size_t)x * grows + (size_t)gr) * (size_t)nb * 17;
                    for (int bk = 0; bk < nb; bk++) {
                        const uint8_t *blk = row + (size_t)bk * 17;
                        uint8_t val[32];
                        for (int j = 0; j < 16; j++) { val[j] = blk[1 + j] & 15; val[j + 16] = blk[1 + j] >> 4; }
                        const size_t i = ((size_t)x * rows + (size_t)r) * (size_t)nb + (size_t)bk;
                        for (int k = 0; k < 16; k++) out[cb + i * 16 + (size_t)k] = (uint8_t)(val[2 * k] | val[2 * k + 1] << 4);
                        out[sb + i] = blk[0];
                    }
                }
            char kb[96], ks[96];
            snprintf(kb, sizeof kb, "model.layers.%d.mlp.experts.%s_blocks", l, part ? "down_proj" : "gate_up_proj");
            snprintf(ks, sizeof ks, "model.layers.%d.mlp.experts.%s_scales", l, part ? "down_proj" : "gate_up_proj");
            json_object_set_new(nh, kb, json_pack("{s:s,s:[i,i,i,i],s:[I,I]}", "dtype", "U8", "shape", X, rows, nb, 16,
                                                  "data_offsets", (json_int_t)cb, (json_int_t)sb));
            const size_t se = sb + (size_t)X * rows * nb;
            json_object_set_new(nh, ks, json_pack("{s:s,s:[i,i,i],s:[I,I]}", "dtype", "U8", "shape", X, rows, nb,
                                                  "data_offsets", (json_int_t)sb, (json_int_t)se));
            len = se;
        }
    }
    char *hs = json_dumps(nh, JSON_COMPACT);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    f = fopen(p, "wb");
    /* the header padded with spaces to a multiple of 8, as safetensors writes it */
    uint64_t nhl = strlen(hs), padded = (nhl + 7) / 8 * 8;
    CHECK(f && fwrite(&padded, 8, 1, f) == 1 && fwrite(hs, 1, nhl, f) == nhl &&
          fwrite("        ", 1, padded - nhl, f) == padded - nhl && fwrite(out, 1, len, f) == len);
    if (f) fclose(f);
    free(hs); free(out); free(src);
    json_decref(hdr); json_decref(nh);
    gguf_close(g);
    /* config.json with the release's quantization_config; the tokenizer files linked */
    json_t *cfg = json_load_file(FIXTURE("hf/gptoss-tiny/config.json"), 0, NULL);
    json_object_set_new(cfg, "quantization_config",
                        json_pack("{s:s,s:[s,s,s,s]}", "quant_method", "mxfp4", "modules_to_not_convert",
                                  "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                  "lm_head"));
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(cfg && json_dump_file(cfg, p, JSON_INDENT(2)) == 0);
    json_decref(cfg);
    static const char *const link_[3] = { "tokenizer.json", "tokenizer_config.json", "generation_config.json" };
    for (int i = 0; i < 3; i++) {
        char from[PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/%s", dir, link_[i]);
        CHECK(realpath(FIXTURE("hf/gptoss-tiny"), from) != NULL);
        strncat(from, "/", sizeof from - strlen(from) - 1);
        strncat(from, link_[i], sizeof from - strlen(from) - 1);
        CHECK(symlink(from, p) == 0);
    }
    return dir;
}

static void rm_dir(const char *dir)
{
    static const char *const f[4] = { "model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json" };
    char p[128];
    for (int i = 0; i < 4; i++) { snprintf(p, sizeof p, "%s/%s", dir, f[i]); unlink(p); }
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    unlink(p);
    rmdir(dir);
}

/* gpt-oss: YaRN rope, sliding-window and sink attention, biased router and
 * clamped-SwiGLU experts with biases */
static void test_gptoss(void)
{
    check_model(M("gptoss-tiny.bf16.gguf"), R("gptoss-tiny.dev.json"), 0.05, 0);
    report_router_ties(M("gptoss-tiny.bf16.gguf"), R("gptoss-tiny.dev.json"));
    /* the directory it was converted from: experts de-interleaved and
     * transposed on load, YaRN from rope_parameters (truncate false) */
    check_model(FIXTURE("hf/gptoss-tiny"), R("gptoss-tiny.dev.json"), 0.05, 0);
    report_router_ties(FIXTURE("hf/gptoss-tiny"), R("gptoss-tiny.dev.json"));
    /* MXFP4 experts against llama.cpp on the same file. llama.cpp's own run
     * of the bf16 file is up to 0.18 from transformers (case 1 pos 66; its
     * top-1 differs there and at case 4 pos 38), where ours is within
     * 0.0033: the tolerance is 0.15 plus that gap. Measured: 0.2549; past
     * 0.15 only case 1 pos 66 token 2608 (3.2842 here, 3.0292 in llama.cpp:
     * its bf16 gap) and case 4 pos 6 token 2235 (3.2065, 2.9627; there its
     * bf16 run agrees with transformers); top-1 and greedy all equal. */
    check_model(M("gptoss-tiny.MXFP4_MOE.gguf"), R("gptoss-tiny.MXFP4_MOE.llamacpp.dev.json"), 0.15 + 0.18, 0);
    report_router_ties(M("gptoss-tiny.MXFP4_MOE.gguf"), R("gptoss-tiny.MXFP4_MOE.llamacpp.dev.json"));
    /* the same MXFP4 experts in a directory as the release ships them: the
     * loaded experts are the GGUF's bytes exactly, and the model opens. (Not
     * against llama.cpp's logits: with bf16 attention where the GGUF has
     * q8_0, this random model's router picks other experts at a few
     * positions and logits move by up to 1.22; CUDA, which rounds a MoE
     * model's activations as the CPU does (be_opts.act_int8), matches.) */
    const char *dir = make_gptoss_mxfp4();
    CHECK(dir != NULL);
    if (!dir) return;
    char err[300];
    hf_model *h = NULL;
    gguf *g = NULL;
    CHECKF(hf_open(&h, dir, err, sizeof err) == 0, "%s", err);
    CHECKF(gguf_open(&g, M("gptoss-tiny.MXFP4_MOE.gguf"), err, sizeof err) == 0, "%s", err);
    int same = 0;
    for (int l = 0; h && g && l < 2; l++) {
        static const char *const nm[3] = { "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight" };
        for (int k = 0; k < 3; k++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.%s", l, nm[k]);
            const gguf_tensor *a = hf_tensor_find(h, n), *b = gguf_tensor_find(g, n);
            CHECKF(a && b && a->type == QT_MXFP4 && a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] &&
                   a->ne[2] == b->ne[2] && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes),
                   "%s: %s differs from the GGUF's", dir, n);
            same++;
        }
    }
    CHECK(same == 6);
    if (h) hf_close(h);
    if (g) gguf_close(g);
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = dir;
    o.n_threads = 2;
    o.backend = getenv("ANE_BACKEND");
    CHECKF(eng_open(&e, &o, err, sizeof err) == 0, "%s", err);
    if (e) eng_close(e);
    /* a quantization this loader does not know is refused, naming it */
    char cp[128];
    snprintf(cp, sizeof cp, "%s/config.json", dir);
    json_t *cfg = json_load_file(cp, 0, NULL);
    json_object_set_new(json_object_get(cfg, "quantization_config"), "quant_method", json_string("fp8"));
    CHECK(cfg && json_dump_file(cfg, cp, 0) == 0);
    json_decref(cfg);
    h = NULL;
    CHECK(hf_open(&h, dir, err, sizeof err) != 0 && strstr(err, "quant_method \"fp8\" is not supported"));
    if (h) hf_close(h);
    rm_dir(dir);
}

/* A safetensors header whose length is not a multiple of 8 (one space more
 * than qwen2-tiny's) leaves its bf16 tensors at odd addresses in the
 * mapping: each is read aligned, with the same bytes, and the model answers
 * as the original does. */
static void test_hf_odd_header(void)
{
    static const char *const files[] = { "config.json", "tokenizer.json", "tokenizer_config.json" };
    char dir[64], p[128], err[300];
    snprintf(dir, sizeof dir, "/tmp/t_models_odd.XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    for (int i = 0; i < 3; i++) {
        char a[128], full[PATH_MAX];
        snprintf(a, sizeof a, "%s/%s", FIXTURE("hf/qwen2-tiny"), files[i]);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        CHECK(realpath(a, full) && symlink(full, p) == 0);
    }
    FILE *f = fopen(FIXTURE("hf/qwen2-tiny/model.safetensors"), "rb");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long fl = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *src = malloc((size_t)fl);
    CHECK(src && fread(src, 1, (size_t)fl, f) == (size_t)fl);
    fclose(f);
    uint64_t hl, odd;
    memcpy(&hl, src, 8);
    odd = hl + 1;
    CHECK(hl % 8 == 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    f = fopen(p, "wb");
    CHECK(f && fwrite(&odd, 8, 1, f) == 1 && fwrite(src + 8, 1, hl, f) == hl && fwrite(" ", 1, 1, f) == 1 &&
          fwrite(src + 8 + hl, 1, (size_t)fl - 8 - hl, f) == (size_t)fl - 8 - hl);
    if (f) fclose(f);
    free(src);
    hf_model *a = NULL, *b = NULL;
    CHECKF(hf_open(&a, FIXTURE("hf/qwen2-tiny"), err, sizeof err) == 0, "%s", err);
    CHECKF(hf_open(&b, dir, err, sizeof err) == 0, "%s", err);
    static const char *const nm[] = { "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.bias",
                                      "blk.1.ffn_down.weight", "output_norm.weight" };
    for (size_t i = 0; a && b && i < sizeof nm / sizeof nm[0]; i++) {
        const gguf_tensor *x = hf_tensor_find(a, nm[i]), *y = hf_tensor_find(b, nm[i]);
        CHECKF(x && y && x->type == QT_BF16 && y->type == QT_BF16, "%s", nm[i]);
        if (!x || !y) continue;
        CHECKF((uintptr_t)y->data % 2 == 0, "%s is at an odd address", nm[i]);
        CHECKF(x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes), "%s differs", nm[i]);
    }
    if (a) hf_close(a);
    if (b) hf_close(b);
    check_model(dir, R("qwen2-tiny.dev.json"), 0.05, 0);
    rm_dir(dir);
}

/* The families that split, over the GPUs of ANE_GPUS (e.g. 0,1; CUDA
 * builds), against the same references through the daemon's engine */
static void test_gpus(void)
{
    const char *gs = getenv("ANE_GPUS");
    if (!gs || !strchr(gs, ',')) {
        fprintf(stderr, "  (ANE_GPUS=0,1 runs the models that split over those GPUs)\n");
        return;
    }
    /* (the first two GPUs, for what does not split further: the Q8_0
     * file's 64-value rows are two blocks, qwen3-tiny has two layers) */
    char two[64];
    snprintf(two, sizeof two, "%s", gs);
    char *c2 = strchr(strchr(two, ',') + 1, ',');
    if (c2) *c2 = 0;
    g_gpus = gs;
    check_model(M("qwen2-tiny.bf16.gguf"), R("qwen2-tiny.dev.json"), 0.05, 0);
    check_model(M("qwen3-tiny.bf16.gguf"), R("qwen3-tiny.dev.json"), 0.05, 0);
    check_model(M("llama3-tiny.bf16.gguf"), R("llama3-tiny.dev.json"), 0.05, 0);
    check_model(M("qwen3moe-tiny.bf16.gguf"), R("qwen3moe-tiny.dev.json"), 0.05, 0);
    check_model(M("mixtral-tiny.bf16.gguf"), R("mixtral-tiny.dev.json"), 0.05, 0);
    check_model(M("gemma3-tiny.bf16.gguf"), R("gemma3-tiny.dev.json"), 0.05, 0);
    check_model(M("gpt2-tiny.bf16.gguf"), R("gpt2-tiny.dev.json"), 0.05, 0);
    check_model(M("gptoss-tiny.bf16.gguf"), R("gptoss-tiny.dev.json"), 0.05, 0);
    g_split_layers = 1;   /* (the same references, the model split by layers) */
    check_model(M("gemma3-tiny.bf16.gguf"), R("gemma3-tiny.dev.json"), 0.05, 0);
    g_gpus = two;
    check_model(M("qwen3-tiny.bf16.gguf"), R("qwen3-tiny.dev.json"), 0.05, 0);
    check_model(M("qwen3moe-tiny.bf16.gguf"), R("qwen3moe-tiny.dev.json"), 0.05, 0);
    g_split_layers = 0;
    check_model(M("qwen2-tiny.Q8_0.gguf"), R("qwen2-tiny.Q8_0.llamacpp.dev.json"), 0.15, 0);
    g_gpus = NULL;
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_bf16_vs_transformers);
    RUN(test_gemma3_gpt2);
    RUN(test_gpt2_context);
    RUN(test_kv_f32);
    RUN(test_kv_q8_0);
    RUN(test_too_big);
    RUN(test_hf_directory);
    RUN(test_hf_odd_header);
    RUN(test_quantized_vs_llamacpp);
    RUN(test_moe_vs_transformers);
    RUN(test_gptoss);
    RUN(test_gpus);
    return CHECK_DONE();
}
