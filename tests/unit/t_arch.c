/* t_arch.c — the architecture table (engine/arch/arch.c): lookups, the
 * rows' options reaching their family's load (a llama file renamed to qwen2
 * must bring q/k/v biases, to qwen3 q/k norms), the message for a name not in
 * the table, and what each family asks of a backend. */
#include "engine/arch/arch.h"
#include "engine/backend/backend.h"
#include "engine/load/model.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static void test_table(void)
{
    char buf[200];
    CHECK(strcmp(arch_names(buf, sizeof buf), "llama, qwen2, qwen3, qwen3moe, qwen35, gemma3, gpt2, gpt-oss") == 0);
    CHECK(strcmp(arch_names(buf, 9), "llama, q") == 0);   /* cut, still a string */
    const arch *q2 = arch_find("qwen2"), *q3 = arch_find("qwen3"), *ll = arch_find("llama");
    CHECK(q2 && q3 && ll && q2->fam == ll->fam && q3->fam == ll->fam);
    CHECK(q2 && (q2->opt & ARCH_QKV_BIAS) && !(q2->opt & ARCH_QK_NORM));
    CHECK(q3 && (q3->opt & ARCH_QK_NORM) && !(q3->opt & ARCH_QKV_BIAS));
    CHECK(ll && !(ll->opt & ARCH_ROPE_NEOX));
    const arch *qm = arch_find("qwen3moe");
    CHECK(qm && qm->fam == ll->fam && (qm->opt & ARCH_QK_NORM) && (qm->opt & ARCH_ROPE_NEOX));
    const arch *q35 = arch_find("qwen35");
    CHECK(q35 && q35->fam != ll->fam && q35->fam->seq && !q35->fam->greedy);
    const arch *oss = arch_find("gpt-oss");
    CHECK(oss && oss->fam != ll->fam && oss->fam != q35->fam && (oss->opt & ARCH_YARN) && (oss->opt & ARCH_ROPE_NEOX) &&
          !oss->fam->seq && oss->fam->greedy);
    /* YaRN: the llama family's rows ramp as llama.cpp (floored, ceiled), gpt-oss unrounded */
    CHECK((ll->opt & ARCH_YARN) && (q2->opt & ARCH_YARN) && (qm->opt & ARCH_YARN) && !(q35->opt & ARCH_YARN));
    CHECK((oss->opt & ARCH_YARN_EXACT) && !(ll->opt & ARCH_YARN_EXACT) && !(q2->opt & ARCH_YARN_EXACT));
    CHECK(arch_find("qwen") == NULL && arch_find("") == NULL && arch_find("LLAMA") == NULL);
}

/* stories260K with its architecture renamed (metadata keys too when
 * `keys`); the model_load error into err, "" when it loads. */
static void load_renamed(const char *name, int keys, char *err, size_t errlen)
{
    FILE *f = fopen(FIXTURE("models/stories260K.gguf"), "rb");
    CHECK(f != NULL);
    if (!f) return;
    static char d[4 << 20];
    size_t n = fread(d, 1, sizeof d, f);
    fclose(f);
    char *a = memmem(d, n, "general.architecture", 20);
    CHECK(a && n < sizeof d && !memcmp(a + 32, "llama", 5));
    if (!a) return;
    memcpy(a + 32, name, 5);
    for (char *k = d; keys && (k = memmem(k, n - (size_t)(k - d), "llama.", 6)) != NULL; k += 6) memcpy(k, name, 5);
    char path[] = "/tmp/t_arch.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, d, n) == (ssize_t)n);
    close(fd);
    model *m = NULL;
    err[0] = 0;
    if (model_load(&m, path, err, errlen) == 0) {
        CHECK(m->arch == arch_find(name));
        err[0] = 0;
    }
    model_free(m);
    unlink(path);
}

static void test_rows(void)
{
    char err[512];
    load_renamed("gptxx", 0, err, sizeof err);
    CHECKF(strstr(err, ": unsupported architecture 'gptxx' in general.architecture (supported: llama, qwen2, "
                       "qwen3, qwen3moe, qwen35, gemma3, gpt2, gpt-oss)") != NULL, "%s", err);
    load_renamed("qwen2", 1, err, sizeof err);
    CHECKF(strstr(err, ": missing tensor 'blk.0.attn_q.bias'") != NULL, "%s", err);
    load_renamed("qwen3", 1, err, sizeof err);
    CHECKF(strstr(err, ": missing tensor 'blk.0.attn_q_norm.weight'") != NULL, "%s", err);
    load_renamed("qwen3", 0, err, sizeof err);   /* keys still under llama. */
    CHECKF(strstr(err, ": missing metadata key 'qwen3.embedding_length'") != NULL, "%s", err);
    load_renamed("llama", 1, err, sizeof err);
    CHECKF(err[0] == 0, "%s", err);
}

/* Each fixture loads under its row, with the tensors its options ask for. */
static void test_families(void)
{
    static const struct { const char *path, *arch; int bias, qk_norm, recurrent, neox, experts, used, ff_exp; } v[] = {
        { "models/stories260K.gguf", "llama", 0, 0, 0, 0, 0, 0, 0 },
        { "models/qwen2-tiny.Q8_0.gguf", "qwen2", 1, 0, 0, 1, 0, 0, 0 },
        { "models/qwen3-tiny.bf16.gguf", "qwen3", 0, 1, 0, 1, 0, 0, 0 },
        { "models/qwen35-tiny.bf16.gguf", "qwen35", 0, 1, 1, 1, 0, 0, 0 },
        { "hf/qwen2-tiny", "qwen2", 1, 0, 0, 1, 0, 0, 0 },
        { "models/qwen3moe-tiny.bf16.gguf", "qwen3moe", 0, 1, 0, 1, 8, 2, 48 },
        { "hf/qwen3moe-tiny", "qwen3moe", 0, 1, 0, 1, 8, 2, 48 },
        { "models/mixtral-tiny.bf16.gguf", "llama", 0, 0, 0, 0, 4, 2, 128 },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char path[256], err[512];
        snprintf(path, sizeof path, "tests/fixtures/%s", v[i].path);
        model *m = NULL;
        CHECKF(model_load(&m, path, err, sizeof err) == 0, "%s: %s", path, err);
        if (!m) continue;
        const hparams *hp = &m->hp;
        int attn = v[i].recurrent ? hp->n_layer / 4 : hp->n_layer;   /* qwen35: every 4th attends */
        int l = v[i].recurrent ? 3 : 0;
        CHECKF(m->arch == arch_find(v[i].arch) && hp->n_attn_layers == attn && m->recurrent == v[i].recurrent &&
               hp->rope_neox == v[i].neox, "%s", path);
        CHECKF((m->layers[l].bq.data != NULL) == v[i].bias && (m->layers[l].q_norm.data != NULL) == v[i].qk_norm,
               "%s", path);
        /* experts: the stacked tensors, the router, softmax gating renormalised */
        const layer_w *L = &m->layers[l];
        CHECKF(hp->n_expert == v[i].experts && hp->n_expert_used == v[i].used && (!v[i].experts ||
               (hp->n_ff_exp == v[i].ff_exp && L->ffn_gate_exps.n_out == (int64_t)v[i].experts * v[i].ff_exp &&
                L->ffn_down_exps.n_in == v[i].ff_exp && L->ffn_down_exps.n_out == (int64_t)v[i].experts * hp->n_embd &&
                L->ffn_gate_inp.n_out == v[i].experts && !L->w_gate.data && hp->expert_gating == BE_MOE_SOFTMAX &&
                hp->expert_norm == 1)), "%s: experts", path);
        model_free(m);
    }
}

/* gpt-oss, from its GGUF file and its directory alike: the biases, sinks,
 * window, experts with biases, gating and the YaRN table (divisors from 1
 * to the factor, then the attention factor 0.1 ln 32 + 1) */
static void test_gptoss(void)
{
    static const char *const paths[2] = { "models/gptoss-tiny.bf16.gguf", "hf/gptoss-tiny" };
    for (int i = 0; i < 2; i++) {
        char path[256], err[512];
        snprintf(path, sizeof path, "tests/fixtures/%s", paths[i]);
        model *m = NULL;
        CHECKF(model_load(&m, path, err, sizeof err) == 0, "%s: %s", path, err);
        if (!m) continue;
        const hparams *hp = &m->hp;
        const layer_w *L = &m->layers[1];
        CHECKF(m->arch == arch_find("gpt-oss") && hp->rope_neox && hp->swa_window == 8 && hp->n_expert == 4 &&
               hp->n_expert_used == 2 && hp->n_ff_exp == 64 && hp->expert_gating == BE_MOE_TOPK_SOFTMAX &&
               hp->expert_norm == 0 && fabsf(hp->swiglu_limit - 7) < 1e-6f, "%s", path);
        CHECKF(L->bq.data && L->bk.data && L->bv.data && L->bo.data && L->attn_sinks.n_in == 4 &&
               L->ffn_gate_inp_b.data && L->ffn_gate_exps_b.type == QT_F32 && L->ffn_up_exps_b.n_in == 64 &&
               L->ffn_down_exps_b.n_in == 64 && L->ffn_down_exps_b.n_out == 4 && L->ffn_gate_exps.n_out == 256,
               "%s: tensors", path);
        const float *y = m->rope_freqs.data;
        CHECKF(hp->rope_yarn && m->rope_freqs.n_in == 17 && y && fabsf(y[0] - 1) < 1e-6f && fabsf(y[15] - 32) < 1e-4f &&
               fabsf(y[16] - (float)(0.1 * log(32.0) + 1)) < 1e-6f, "%s: YaRN table", path);
        model_free(m);
    }
}

/* fw_lacks: the hybrid needs the linear-attention ops, the llama family none
 * beyond the base set (the moe op where the file has experts) (the engine falls back to the CPU on that answer). */
static void test_lacks(void)
{
    char err[256];
    pool *p;
    be *b;
    CHECK(pool_open(&p, 1) == 0);
    CHECK(be_cpu_open(&b, p, 1, err, sizeof err) == 0);
    be_ops no_delta = *b->ops;
    no_delta.deltanet = NULL;
    model *q35 = NULL, *ll = NULL;
    CHECK(model_load(&q35, FIXTURE("models/qwen35-tiny.bf16.gguf"), err, sizeof err) == 0);
    CHECK(model_load(&ll, FIXTURE("models/stories260K.gguf"), err, sizeof err) == 0);
    if (q35 && ll) {
        CHECK(fw_lacks(q35, b->ops) == NULL && fw_lacks(ll, b->ops) == NULL);
        const char *l = fw_lacks(q35, &no_delta);
        CHECK(l && strcmp(l, "linear-attention ops") == 0);
        CHECK(fw_lacks(ll, &no_delta) == NULL);
        /* experts need the moe op; a dense llama does not */
        be_ops no_moe = *b->ops;
        no_moe.moe = NULL;
        model *mx = NULL;
        CHECK(model_load(&mx, FIXTURE("models/mixtral-tiny.bf16.gguf"), err, sizeof err) == 0);
        if (mx) {
            const char *lm = fw_lacks(mx, &no_moe);
            CHECK(fw_lacks(mx, b->ops) == NULL && lm && strstr(lm, "mixture-of-experts"));
            CHECK(fw_lacks(ll, &no_moe) == NULL);
        }
        model_free(mx);
        /* gpt-oss needs attention_ex and the moe op */
        model *oss = NULL;
        be_ops no_ax = *b->ops;
        no_ax.attention_ex = NULL;
        CHECK(model_load(&oss, FIXTURE("models/gptoss-tiny.bf16.gguf"), err, sizeof err) == 0);
        if (oss) {
            const char *la = fw_lacks(oss, &no_ax), *lm = fw_lacks(oss, &no_moe);
            CHECK(fw_lacks(oss, b->ops) == NULL && la && strstr(la, "attention_ex") && lm && strstr(lm, "mixture"));
            const be_ops *real = b->ops;
            b->ops = &no_ax;
            fw *f = NULL;
            CHECK(fw_open(&f, oss, b, 8, 2, 4, 1, err, sizeof err) == -1 && f == NULL);
            CHECKF(strstr(err, "cannot run gpt-oss models yet (no attention with a sliding window") != NULL, "%s", err);
            b->ops = real;
        }
        model_free(oss);
        /* and the family refuses to open on such a backend */
        const be_ops *real = b->ops;
        b->ops = &no_delta;
        fw *f = NULL;
        CHECK(fw_open(&f, q35, b, 8, 2, 4, 1, err, sizeof err) == -1 && f == NULL);
        CHECKF(strstr(err, "cannot run qwen35 models yet (no linear-attention ops)") != NULL, "%s", err);
        b->ops = real;
    }
    /* gemma3 and gpt2 without their ops */
    be_ops no_ex = *b->ops;
    no_ex.attention_ex = NULL;
    no_ex.layernorm = NULL;
    model *g3 = NULL, *g2 = NULL;
    CHECK(model_load(&g3, FIXTURE("models/gemma3-tiny.bf16.gguf"), err, sizeof err) == 0);
    CHECK(model_load(&g2, FIXTURE("models/gpt2-tiny.bf16.gguf"), err, sizeof err) == 0);
    if (g3 && g2) {
        CHECK(fw_lacks(g3, b->ops) == NULL && fw_lacks(g2, b->ops) == NULL);
        CHECK(fw_lacks(g3, &no_ex) != NULL && fw_lacks(g2, &no_ex) != NULL);
        const be_ops *real = b->ops;
        b->ops = &no_ex;
        fw *f = NULL;
        CHECK(fw_open(&f, g3, b, 8, 2, 4, 1, err, sizeof err) == -1 && f == NULL);
        CHECKF(strstr(err, "cannot run gemma3 models yet (no sliding-window attention") != NULL, "%s", err);
        CHECK(fw_open(&f, g2, b, 8, 2, 4, 1, err, sizeof err) == -1 && f == NULL);
        CHECKF(strstr(err, "cannot run gpt2 models yet (no layernorm") != NULL, "%s", err);
        b->ops = real;
    }
    model_free(g3);
    model_free(g2);
    model_free(q35);
    model_free(ll);
    b->ops->close(b);
    pool_close(p);
}

/* fw_mem_estimate: never less than what fw_open allocates on the backend
 * (counted through its alloc), for a plain and a hybrid model, f16 and q8_0
 * caches, and not wildly more; the KV pool exactly its pages' bytes. */
static size_t alloc_sum;
static const be_ops *alloc_real;
static void *count_alloc(be *b, size_t bytes)
{
    alloc_sum += bytes;
    return alloc_real->alloc(b, bytes);
}

static void test_mem_estimate(void)
{
    char err[256];
    pool *p;
    CHECK(pool_open(&p, 1) == 0);
    const char *models[] = { FIXTURE("models/qwen3-tiny.bf16.gguf"), FIXTURE("models/qwen35-tiny.bf16.gguf"),
                             FIXTURE("models/llama-q.Q4_K_M.gguf") };
    const int kvts[] = { BE_KV_F16, BE_KV_Q8_0, BE_KV_F32 };
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        model *m = NULL;
        CHECKF(model_load(&m, models[mi], err, sizeof err) == 0, "%s", err);
        if (!m) continue;
        const hparams *hp = &m->hp;
        for (size_t ki = 0; ki < 3; ki++) {
            be *b;
            CHECK(be_cpu_open(&b, p, kvts[ki], err, sizeof err) == 0);
            be_ops counting = *b->ops;
            counting.alloc = count_alloc;
            alloc_real = b->ops;
            b->ops = &counting;
            const int max_T = 40, max_out = 8, max_seqs = 4;
            const size_t n_pages = 24;
            fw_mem est;
            fw_mem_estimate(m, kvts[ki], n_pages, max_T, max_out, max_seqs, &est);
            size_t kvd = (size_t)hp->n_head_kv * hp->head_dim;
            size_t kv_want = n_pages * KV_PAGE * 2 * (size_t)hp->n_attn_layers *
                             (kvts[ki] == BE_KV_Q8_0 ? kvd / 32 * 34 : kvd * (kvts[ki] == BE_KV_F16 ? 2 : 4));
            CHECKF(est.kv == kv_want, "%s kv %s: %zu, want %zu", models[mi], be_kv_name(kvts[ki]), est.kv, kv_want);
            CHECK(est.weights == m->weight_bytes);
            CHECK(est.total == est.weights + est.kv + est.state + est.act + est.scratch);
            CHECK(est.scratch >= FW_MEM_BACKEND + 2 * (size_t)hp->n_vocab * hp->n_embd);
            alloc_sum = 0;
            fw *f = NULL;
            CHECKF(fw_open(&f, m, b, max_T, max_out, (int)n_pages, max_seqs, err, sizeof err) == 0, "%s", err);
            size_t need = est.kv + est.state + est.act;
            CHECKF(alloc_sum <= need, "%s kv %s: fw_open took %zu bytes, estimate %zu", models[mi],
                   be_kv_name(kvts[ki]), alloc_sum, need);
            CHECKF(need <= 2 * alloc_sum, "%s kv %s: estimate %zu for %zu taken", models[mi], be_kv_name(kvts[ki]),
                   need, alloc_sum);
            if (f) fw_close(f);
            b->ops = alloc_real;
            b->ops->close(b);
        }
        model_free(m);
    }
    pool_close(p);
}

int main(void)
{
    RUN(test_table);
    RUN(test_rows);
    RUN(test_families);
    RUN(test_gptoss);
    RUN(test_lacks);
    RUN(test_mem_estimate);
    return CHECK_DONE();
}
