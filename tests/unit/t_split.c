/* t_split — a model split over the ranks of a tensor-parallel group
 * (engine/arch/split.h, group.c) computes what the whole model computes:
 * on groups of CPU backends (whose all-reduce sums host memory) for every
 * family that splits (llama, qwen2, qwen3, qwen3moe, Mixtral, gemma3, gpt2,
 * gpt-oss), the logits of a prompt within 1e-3 of the unsplit
 * pass at every position and the same greedy tokens, at 2 and 4 ranks;
 * split by layers instead (model_stages), the same bits, also unevenly
 * with backends not joined and the hand-over through host memory (the
 * relay of --gpu-layers); with each rank whole experts (expert
 * parallelism), within 1e-3 as by heads.
 * With ANE_BACKEND=cuda and ANE_GPUS=0,1[,...] the same over NCCL on those
 * GPUs. Models and shapes that do not split are refused naming why. */
#include "engine/engine.h"
#include "engine/arch/forward.h"
#include "engine/arch/split.h"
#include "engine/backend/backend.h"
#include "engine/load/model.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_T 48
#define PAGES ((MAX_T + GEN) / KV_PAGE + 2)
#define GEN 12
#define RANKS 8

typedef struct runner {
    int n;
    pool *pools[RANKS];
    be *b[RANKS];
    model *m[RANKS];       /* the ranks' (split) models; [0] the whole one when n == 1 */
    fw *f;
} runner;

static int gpus_of(const char *s, int *ids)
{
    int n = 0;
    for (const char *p = s; p && *p && n < RANKS;) {
        ids[n++] = atoi(p);
        p = strchr(p, ',');
        if (p) p++;
    }
    return n;
}

/* How a runner splits its model: by heads (model_split), by layers
 * (model_stages), by heads with every expert whole (model_split_experts),
 * or by layers with the last stage one layer, through a relay (fw_join's:
 * the backends not joined, as the CPU and a GPU of --gpu-layers) */
enum { BY_HEADS, BY_LAYERS, BY_EXPERTS, BY_RELAY };
static const char *const how_name[] = { "ranks", "stages", "experts", "relayed stages" };

/* devs: CUDA device numbers (NULL: CPU backends) */
static int runner_open(runner *r, model *m, int n, const int *devs, int how, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    for (int i = 0; i < n; i++) {
        if (pool_open(&r->pools[i], 1)) return -1;
        /* (relayed over GPUs: the CPU, then the first GPU, as --gpu-layers) */
        int gpu = devs && !(how == BY_RELAY && n > 1 && i == 0);
        be_opts o = { .kv_type = BE_KV_F32, .device = gpu ? devs[how == BY_RELAY ? 0 : i] : 0,
                      .no_graphs = how == BY_RELAY && n > 1 };
        if (be_open_opts(&r->b[i], gpu ? "cuda" : "cpu", r->pools[i], &o, err, errlen)) return -1;
    }
    fw *fs[RANKS] = { 0 };
    if (n == 1) {
        r->m[0] = m;
        if (model_prepare(m, r->b[0], err, errlen)) return -1;
        return fw_open(&r->f, m, r->b[0], MAX_T, MAX_T, PAGES, 1, err, errlen);
    }
    if (how == BY_RELAY) {
        int first[RANKS] = { 0 };
        for (int i = 0; i < n; i++) first[i] = i ? m->hp.n_layer - n + i : 0;
        if (model_stages_from(m, n, first, r->m, err, errlen)) return -1;
    } else if ((how == BY_LAYERS ? model_stages : how == BY_EXPERTS ? model_split_experts : model_split)(
                   m, n, r->m, err, errlen)) {
        return -1;
    }
    if (how != BY_RELAY && r->b[0]->ops->group(r->b, n, err, errlen)) return -1;
    for (int i = 0; i < n; i++)
        if (model_prepare(r->m[i], r->b[i], err, errlen) ||
            fw_open(&fs[i], r->m[i], r->b[i], MAX_T, MAX_T, PAGES, 1, err, errlen)) {
            for (int j = 0; j < i; j++) fw_close(fs[j]);
            return -1;
        }
    if (fw_join(fs, n, how == BY_RELAY ? (size_t)MAX_T * m->hp.n_embd : 0, err, errlen)) {
        for (int j = 0; j < n; j++) fw_close(fs[j]);
        return -1;
    }
    r->f = fs[0];
    return 0;
}

static void runner_close(runner *r)
{
    fw_close(r->f);
    for (int i = 0; i < r->n; i++) {
        if (r->b[i]) r->b[i]->ops->close(r->b[i]);
        if (r->n > 1) model_split_free(r->m[i]);
        pool_close(r->pools[i]);
    }
}

/* The prompt's logits [T][V] and GEN greedy tokens after it, margin[GEN]
 * the lead of each over the runner-up; hidden [E]: the last step's
 * final-norm output (fw_hidden, what embeddings pool) */
static void runner_go(runner *r, int V, const int32_t *toks, int T, float *logits, int32_t *gen, float *margin,
                      float *hidden)
{
    /* (positions of the prompt and of the GEN steps after it) */
    int32_t pos[MAX_T + GEN], out[MAX_T], slot[MAX_T] = { 0 }, pages[PAGES];
    const int32_t *pg[MAX_T];
    for (int i = 0; i < PAGES; i++) pages[i] = PAGES - 1 - i;   /* (not in order) */
    for (int t = 0; t < MAX_T + GEN; t++) pos[t] = t;
    for (int t = 0; t < MAX_T; t++) { out[t] = t; pg[t] = pages; }
    be_batch bt = { .T = T, .pos = pos, .pages = pg, .slot = slot };
    fw_run(r->f, toks, &bt, out, T, logits);
    float *lg = malloc((size_t)V * sizeof *lg);
    const float *last = logits + (size_t)(T - 1) * V;
    for (int g = 0; g < GEN; g++) {
        int best = 0, second = -1;
        for (int i = 1; i < V; i++) {
            if (last[i] > last[best]) { second = best; best = i; }
            else if (second < 0 || last[i] > last[second]) second = i;
        }
        gen[g] = best;
        margin[g] = last[best] - last[second];
        be_batch d = { .T = 1, .pos = pos + T + g, .pages = pg, .slot = slot, .n_dec = 1 };
        fw_run(r->f, &gen[g], &d, out, 1, lg);
        last = lg;
    }
    fw_hidden(r->f, hidden, 1);
    free(lg);
}

/* Whether some matmul weight is quantized (its GPU kernels round inputs) */
static int rounds_inputs(const model *m)
{
    for (int l = 0; l < m->hp.n_layer; l++) {
        const layer_w *L = &m->layers[l];
        const wt *w[] = { &L->wq, &L->wo, &L->w_down, &L->ffn_down_exps };
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->data && w[i]->type != QT_F32 && w[i]->type != QT_F16 && w[i]->type != QT_BF16) return 1;
    }
    return 0;
}

/* max |a[i] - b[i]|, a NaN on either side counting as infinite */
static double max_diff(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > w || d != d) w = d != d ? INFINITY : d;
    }
    return w;
}

/* max |logit| between the prompt's logits on the GPU (gpu) and the same
 * model whole on the CPU */
static double cpu_gpu_distance(const char *path, int V, const int32_t *toks, int T, const float *gpu)
{
    char err[512];
    model *m = NULL;
    if (model_load(&m, path, err, sizeof err)) { CHECKF(0, "%s", err); return 0; }
    float *cpu = malloc((size_t)T * V * sizeof *cpu), *h = calloc((size_t)m->hp.n_embd, sizeof *h), mg[GEN];
    int32_t g[GEN];
    runner c;
    double d = 0;
    int ok = runner_open(&c, m, 1, NULL, BY_HEADS, err, sizeof err) == 0;
    CHECKF(ok, "%s whole on the CPU: %s", path, err);
    if (ok) {
        runner_go(&c, V, toks, T, cpu, g, mg, h);
        d = max_diff(cpu, gpu, (size_t)T * V);
        CHECKF(d < INFINITY, "%s: NaN in the whole model's logits on the CPU or the GPU", path);
        if (!(d < INFINITY)) d = 0;   /* (no bound to widen) */
    }
    runner_close(&c);
    free(cpu);
    free(h);
    model_free(m);
    return d;
}

static void check_split_as(const char *path, int n, const int *devs, int how)
{
    char err[512];
    model *m = NULL;
    if (model_load(&m, path, err, sizeof err)) { CHECKF(0, "%s", err); return; }
    /* (by experts, a prompt past CK_MOE_RG_MAX_T: CUDA's separate routing
     * and grouping, and its tensor-core experts for int8 types) */
    const int V = m->hp.n_vocab, T = how == BY_EXPERTS ? 40 : 24;
    int32_t toks[MAX_T];
    for (int t = 0; t < T; t++) toks[t] = (int32_t)((t * 7919u + 13u) % (unsigned)(V > 300 ? 300 : V));
    float *whole = malloc((size_t)T * V * sizeof *whole), *part = malloc((size_t)T * V * sizeof *part);
    int32_t g1[GEN], gn[GEN];
    float m1[GEN], mn[GEN];
    float *h1 = calloc((size_t)m->hp.n_embd, sizeof *h1), *hn = calloc((size_t)m->hp.n_embd, sizeof *hn);
    runner a, b;
    int okw = runner_open(&a, m, 1, devs, BY_HEADS, err, sizeof err) == 0;
    CHECKF(okw, "%s whole: %s", path, err);
    if (okw) runner_go(&a, V, toks, T, whole, g1, m1, h1);
    runner_close(&a);
    /* Relayed from the CPU to a GPU, a quantized file meets two kernels
     * that round their inputs differently (int8 blocks on the CPU, the
     * GPU's own): the relay is bounded by how far the whole model on the
     * CPU is from it on the GPU, plus one rounding step. */
    const int mixed = how == BY_RELAY && devs && rounds_inputs(m);
    double cg = 0;
    if (okw && mixed) cg = cpu_gpu_distance(path, V, toks, T, whole);
    int oks = okw && runner_open(&b, m, n, devs, how, err, sizeof err) == 0;
    CHECKF(!okw || oks, "%s over %d: %s", path, n, err);
    if (oks) {
        runner_go(&b, V, toks, T, part, gn, mn, hn);
        const double worst = max_diff(whole, part, (size_t)T * V);
        /* A layer split runs the same ops in the same order: the same bits.
         * A head split sums each block's output in another order, which
         * moves a float model's logits by ~1e-6 (the bound: 1e-3).
         * Quantized weights on a GPU read their inputs rounded to int8 or
         * f16, and that order moves a few of those roundings by one step:
         * a quantized file gets the bound of one such step, 1e-2.
         * Relayed with a GPU, the CPU's layers against the GPU's: ~1e-5
         * apart in floats, and for quantized files as above. */
        const int layers = how == BY_LAYERS || how == BY_RELAY;
        double tol = mixed ? cg + 1e-2 : how == BY_RELAY && devs ? 1e-3
                   : layers ? 0 : devs && rounds_inputs(m) ? 1e-2 : 1e-3;
        CHECKF(worst <= tol, "%s over %d ranks: max |dlogit| %g (bound %g)", path, n, worst, tol);
        /* greedy tokens the same up to a near-tie (a lead within the bound),
         * after which the two continuations are different texts */
        int k = 0;
        while (k < GEN && g1[k] == gn[k]) k++;
        int tie = k < GEN && (m1[k] <= tol || mn[k] <= tol);
        CHECKF(k == GEN || tie, "%s over %d ranks: greedy tokens differ at %d (leads %g, %g)", path, n, k,
               (double)m1[k < GEN ? k : 0], (double)mn[k < GEN ? k : 0]);
        if (k == GEN) {
            const double hw = max_diff(h1, hn, (size_t)m->hp.n_embd);
            CHECKF(layers && !(how == BY_RELAY && devs) ? hw == 0 : hw <= (rounds_inputs(m) ? 5e-2 : 1e-3) + cg,
                   "%s over %d: hidden state differs by %g", path, n, hw);
        }
        char why[80] = "";
        if (mixed) snprintf(why, sizeof why, " (whole on CPU and GPU: %.2e apart)", cg);
        if (k < GEN) snprintf(why + strlen(why), sizeof why - strlen(why), ", a near-tie at token %d", k);
        fprintf(stderr, "  %-46s %d %s %s: max |dlogit| %.2e over %d positions%s, greedy %s\n", path, n,
                devs ? "GPU" : "CPU", how_name[how], worst, T, why, k == GEN ? "same" : "same to the tie");
    }
    if (okw) runner_close(&b);
    free(whole);
    free(part);
    free(h1);
    free(hn);
    model_free(m);
}

static void check_split(const char *path, int n, const int *devs) { check_split_as(path, n, devs, BY_HEADS); }

#define M(f) FIXTURE("models/" f)

static void test_cpu_groups(void)
{
    /* (llama3-tiny has one key/value head, the others two: at 4 ranks they share them) */
    static const char *const models[] = { M("llama3-tiny.bf16.gguf"), M("qwen2-tiny.bf16.gguf"),
                                          M("qwen3-tiny.bf16.gguf"), M("qwen3moe-tiny.bf16.gguf"),
                                          M("mixtral-tiny.bf16.gguf"), M("gemma3-tiny.bf16.gguf"),
                                          M("gpt2-tiny.bf16.gguf"), M("gptoss-tiny.bf16.gguf") };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        check_split(models[i], 2, NULL);
        check_split(models[i], 4, NULL);
    }
    check_split(M("qwen2-tiny.Q8_0.gguf"), 2, NULL);   /* (its 64-value rows: two q8_0 blocks) */
    check_split(M("gptoss-tiny.MXFP4_MOE.gguf"), 2, NULL);
}

/* Expert parallelism: the mixture-of-experts files with each rank whole
 * experts (qwen3moe-tiny 8, the others 4), the attention by heads */
static const char *const moe_models[] = { M("qwen3moe-tiny.bf16.gguf"), M("mixtral-tiny.bf16.gguf"),
                                          M("gptoss-tiny.bf16.gguf"), M("gptoss-tiny.MXFP4_MOE.gguf") };

static void test_cpu_experts(void)
{
    for (size_t i = 0; i < sizeof moe_models / sizeof moe_models[0]; i++) {
        check_split_as(moe_models[i], 2, NULL, BY_EXPERTS);
        check_split_as(moe_models[i], 4, NULL, BY_EXPERTS);
    }
    /* gptoss MXFP4's 64-unit experts do not split in 4 in whole 32-value
     * blocks (16 each): model_split gives each of 4 ranks an expert whole */
    char err[512];
    model *m = NULL, *r[RANKS];
    CHECK(model_load(&m, M("gptoss-tiny.MXFP4_MOE.gguf"), err, sizeof err) == 0);
    if (m) {
        int rc = model_split(m, 4, r, err, sizeof err);
        CHECKF(rc == 0, "gptoss MXFP4 over 4: %s", err);
        for (int i = 0; rc == 0 && i < 4; i++) {
            CHECK(r[i]->n_held == 1 && r[i]->expert0 == i && r[i]->hp.n_ff_exp == 64);
            model_split_free(r[i]);
        }
        /* over 8 neither: 8 does not divide its 4 experts */
        rc = model_split(m, 8, r, err, sizeof err);
        CHECKF(rc != 0 && (strstr(err, "head_count") || strstr(err, "expert_count 4")), "over 8: %s",
               rc ? err : "split");
        model_free(m);
    }
    check_split(M("gptoss-tiny.MXFP4_MOE.gguf"), 4, NULL);
}

/* A layer split: every family but qwen35, at 2 stages and at one stage a
 * layer (the tiny models' 2 to 4 layers) */
static void test_cpu_stages(void)
{
    static const char *const models[] = { M("llama3-tiny.bf16.gguf"), M("qwen2-tiny.bf16.gguf"),
                                          M("qwen3-tiny.bf16.gguf"), M("qwen3moe-tiny.bf16.gguf"),
                                          M("mixtral-tiny.bf16.gguf"), M("gemma3-tiny.bf16.gguf"),
                                          M("gpt2-tiny.bf16.gguf"), M("gptoss-tiny.bf16.gguf"),
                                          M("qwen2-tiny.Q8_0.gguf"), M("llama-q.Q4_K_M.gguf") };
    char err[512];
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        check_split_as(models[i], 2, NULL, BY_LAYERS);
        model *m = NULL;
        if (model_load(&m, models[i], err, sizeof err) == 0) {
            int L = m->hp.n_layer;
            model_free(m);
            if (L > 2 && L <= RANKS) check_split_as(models[i], L, NULL, BY_LAYERS);
            check_split_as(models[i], 2, NULL, BY_RELAY);   /* (all but one layer, then one) */
            if (L >= 3) check_split_as(models[i], 3, NULL, BY_RELAY);
        }
    }
    /* stages that do not fit the model */
    model *m = NULL, *r[RANKS];
    CHECK(model_load(&m, M("qwen3-tiny.bf16.gguf"), err, sizeof err) == 0);
    if (m) {
        const int bad[3][2] = { { 0, 0 }, { 1, 2 }, { 0, 99 } };
        for (int i = 0; i < 3; i++) {
            CHECK(model_stages_from(m, 2, bad[i], r, err, sizeof err) != 0);
            CHECKF(strstr(err, "cannot start at layer"), "%s", err);
            CHECK(r[0] == NULL && r[1] == NULL);
        }
        model_free(m);
    }
}

/* What does not split says why, and leaves nothing behind */
static void test_refusals(void)
{
    char err[512];
    model *m = NULL, *r[RANKS];
    CHECK(model_load(&m, M("qwen35-tiny.bf16.gguf"), err, sizeof err) == 0);
    if (m) {
        CHECK(model_split(m, 2, r, err, sizeof err) != 0);
        CHECKF(strstr(err, "qwen35") && strstr(err, "do not split"), "%s", err);
        model_free(m);
    }
    CHECK(model_load(&m, M("qwen3-tiny.bf16.gguf"), err, sizeof err) == 0);
    if (m) {
        CHECK(model_split(m, 3, r, err, sizeof err) != 0);
        CHECKF(strstr(err, "head_count") && strstr(err, "3 GPUs"), "%s", err);
        CHECK(r[0] == NULL && r[1] == NULL);
        model_free(m);
    }
    CHECK(model_load(&m, M("qwen2-tiny.Q8_0.gguf"), err, sizeof err) == 0);
    if (m) {
        CHECK(model_split(m, 4, r, err, sizeof err) != 0);
        CHECKF(strstr(err, "attn_output.weight") && strstr(err, "q8_0 blocks of 32"), "%s", err);
        model_free(m);
    }
    /* q4_K rows of a width whose halves are not whole 256-value blocks */
    CHECK(model_load(&m, M("llama-q.Q4_K_M.gguf"), err, sizeof err) == 0);
    if (m) {
        int w = m->hp.n_head * m->hp.head_dim;
        int rc = model_split(m, 2, r, err, sizeof err);
        if (w / 2 % 256) {
            CHECK(rc != 0);
            CHECKF(strstr(err, "attn_output.weight") && strstr(err, "whole blocks"), "%s", err);
        } else {
            CHECK(rc == 0);
            for (int i = 0; rc == 0 && i < 2; i++) model_split_free(r[i]);
        }
        model_free(m);
    }
}

/* aned --gpus: what it takes, and its errors at start-up */
static void test_engine_gpus(void)
{
    static const struct { const char *gpus, *backend, *want; } cases[] = {
        { "0,x", NULL, "expected up to 8 GPU numbers" },
        { "", NULL, "expected GPU numbers" },
        { "1,1", NULL, "named twice" },
        { "0,1,2,3,4,5,6,7,8", NULL, "expected up to 8" },
        { "0,1", "cpu", "the cuda backend's, not --backend cpu's" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        eng *e = NULL;
        eng_opts o = { .model_path = M("qwen3-tiny.bf16.gguf"), .n_threads = 1, .gpus = cases[i].gpus,
                       .backend = cases[i].backend };
        char err[512] = "";
        CHECK(eng_open(&e, &o, err, sizeof err) != 0);
        CHECKF(strstr(err, cases[i].want), "--gpus '%s': %s", cases[i].gpus, err);
        eng_close(e);
    }
    /* --gpu-layers: one GPU, the cuda backend, a count from 1 */
    static const struct { int n; const char *gpus, *backend, *want; } gl[] = {
        { 1, NULL, "cpu", "layers go to one GPU (the cuda backend, one --gpus number), not cpu" },
        { 1, "0,1", NULL, "not to several" },
        { -1, NULL, NULL, "expected a number of layers from 1" },
    };
    for (size_t i = 0; i < sizeof gl / sizeof gl[0]; i++) {
        eng *e = NULL;
        eng_opts o = { .model_path = M("qwen3-tiny.bf16.gguf"), .n_threads = 1, .gpus = gl[i].gpus,
                       .backend = gl[i].backend, .gpu_layers = gl[i].n };
        char err[512] = "";
        CHECK(eng_open(&e, &o, err, sizeof err) != 0);
        CHECKF(strstr(err, gl[i].want), "--gpu-layers %d: %s", gl[i].n, err);
        eng_close(e);
    }
#ifndef ANE_CUDA
    eng *e = NULL;
    eng_opts o = { .model_path = M("qwen3-tiny.bf16.gguf"), .n_threads = 1, .gpus = "0,1" };
    char err[512] = "";
    CHECK(eng_open(&e, &o, err, sizeof err) != 0);
    CHECKF(strstr(err, "cuda") && strstr(err, "not available"), "%s", err);
    eng_close(e);
    o = (eng_opts){ .model_path = M("qwen3-tiny.bf16.gguf"), .n_threads = 1, .gpu_layers = 1 };
    CHECK(eng_open(&e, &o, err, sizeof err) != 0);
    CHECKF(strstr(err, "cuda") && strstr(err, "not available"), "--gpu-layers 1: %s", err);
    eng_close(e);
#endif
}

static void test_gpu_groups(void)
{
    const char *bn = getenv("ANE_BACKEND"), *gs = getenv("ANE_GPUS");
    int ids[RANKS], n = gpus_of(gs, ids);
    if (!bn || strcmp(bn, "cuda") || n < 2) {
        fprintf(stderr, "  (no GPU groups: ANE_BACKEND=cuda ANE_GPUS=0,1 runs them)\n");
        return;
    }
    static const char *const models[] = { M("llama3-tiny.bf16.gguf"), M("qwen2-tiny.bf16.gguf"),
                                          M("qwen3-tiny.bf16.gguf"), M("qwen3moe-tiny.bf16.gguf"),
                                          M("mixtral-tiny.bf16.gguf"), M("qwen2-tiny.Q8_0.gguf"),
                                          M("gemma3-tiny.bf16.gguf"), M("gpt2-tiny.bf16.gguf"),
                                          M("gptoss-tiny.bf16.gguf"), M("gptoss-tiny.MXFP4_MOE.gguf") };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        /* (the Q8_0 file's 64-value rows are two blocks: two ranks at most) */
        int two = strstr(models[i], "Q8_0") != NULL;
        check_split(models[i], two && n > 2 ? 2 : n, ids);
        check_split_as(models[i], 2, ids, BY_LAYERS);
    }
    for (size_t i = 0; i < sizeof moe_models / sizeof moe_models[0]; i++)
        check_split_as(moe_models[i], n > 4 ? 4 : n, ids, BY_EXPERTS);
}

/* --gpu-layers' split: the first layers on the CPU, the last on one GPU,
 * relayed through host memory, against the whole model on that GPU */
static void test_gpu_offload(void)
{
    const char *bn = getenv("ANE_BACKEND"), *gs = getenv("ANE_GPUS");
    int ids[RANKS] = { 0 };
    if (gs) gpus_of(gs, ids);
    if (!bn || strcmp(bn, "cuda")) {
        fprintf(stderr, "  (no GPU: ANE_BACKEND=cuda runs it)\n");
        return;
    }
    static const char *const models[] = { M("llama3-tiny.bf16.gguf"), M("qwen2-tiny.bf16.gguf"),
                                          M("qwen3moe-tiny.bf16.gguf"), M("gemma3-tiny.bf16.gguf"),
                                          M("gpt2-tiny.bf16.gguf"), M("gptoss-tiny.bf16.gguf"),
                                          M("qwen2-tiny.Q8_0.gguf"), M("llama-q.Q4_K_M.gguf") };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) check_split_as(models[i], 2, ids, BY_RELAY);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_cpu_groups);
    RUN(test_cpu_stages);
    RUN(test_cpu_experts);
    RUN(test_refusals);
    RUN(test_engine_gpus);
    RUN(test_gpu_groups);
    RUN(test_gpu_offload);
    return CHECK_DONE();
}
