/* t_yarn — YaRN rope scaling read for every family that declares it
 * (rope.scaling.type yarn: llama, qwen2, qwen3, qwen3moe as llama.cpp and
 * transformers compute it, ramp ends floored and ceiled; gpt-oss unrounded,
 * t_arch), from GGUF keys and from config.json's rope_scaling; refused
 * with the key named where a family does not take it; Gemma 3's linear
 * scaling of its global layers. The fixtures get the
 * keys added to a copy (inserted after the header, padded to the
 * alignment so the tensor data stay where their offsets say). */
#include "engine/arch/arch.h"
#include "engine/engine.h"
#include "engine/load/model.h"
#include "tests/check.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[64];

typedef struct buf { uint8_t *p; size_t n, cap; } buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_key(buf *b, const char *k, uint32_t type)
{
    uint64_t n = strlen(k);
    put(b, &n, 8);
    put(b, k, n);
    put(b, &type, 4);
}

static void kv_str(buf *b, const char *k, const char *v)
{
    put_key(b, k, 8);
    uint64_t n = strlen(v);
    put(b, &n, 8);
    put(b, v, n);
}

static void kv_f32(buf *b, const char *k, float v) { put_key(b, k, 6); put(b, &v, 4); }
static void kv_u32(buf *b, const char *k, uint32_t v) { put_key(b, k, 4); put(b, &v, 4); }

/* A copy of fixture model f with the keys in kv (n_kv of them) added; its
 * path in out. */
static int with_keys(const char *f, buf *kv, int n_kv, char *out, size_t on)
{
    static int seq;
    char src[256];
    snprintf(src, sizeof src, "tests/fixtures/models/%s", f);
    FILE *in = fopen(src, "rb");
    if (!in) return -1;
    fseek(in, 0, SEEK_END);
    long len = ftell(in);
    fseek(in, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)len);
    if (!d || fread(d, 1, (size_t)len, in) != (size_t)len) { fclose(in); free(d); return -1; }
    fclose(in);
    /* pad with one more key so that what is inserted is a multiple of 32 */
    size_t base = kv->n + 8 + 11 + 4 + 8;   /* a "general.padX" string key, empty value */
    size_t pad = (32 - base % 32) % 32;
    char key[64] = "general.pad";
    for (size_t i = 0; i < pad; i++) key[11 + i] = 'x';
    key[11 + pad] = 0;
    kv_str(kv, key, "");
    n_kv++;
    uint64_t nkv;
    memcpy(&nkv, d + 16, 8);
    nkv += (uint64_t)n_kv;
    memcpy(d + 16, &nkv, 8);
    snprintf(out, on, "%s/y%d.gguf", tmp, seq++);
    FILE *o = fopen(out, "wb");
    int ok = o && fwrite(d, 1, 24, o) == 24 && fwrite(kv->p, 1, kv->n, o) == kv->n &&
             fwrite(d + 24, 1, (size_t)len - 24, o) == (size_t)len - 24;
    if (o) fclose(o);
    free(d);
    return ok ? 0 : -1;
}

/* transformers' _compute_yarn_parameters, truncated: the divisor of each
 * pair's frequency (1 / inv_freq * base^(-2i/dim)) */
static double yarn_div(int i, int dim, double base, double factor, double orig, double bf, double bs)
{
    double lo = floor(dim * log(orig / (bf * 2 * M_PI)) / (2 * log(base)));
    double hi = ceil(dim * log(orig / (bs * 2 * M_PI)) / (2 * log(base)));
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    double r = (i - lo) / (hi - lo);
    r = r < 0 ? 0 : r > 1 ? 1 : r;
    double extra = 1 - r;   /* inv_freq_extrapolation_factor */
    double inv = (1.0 / factor) * (1 - extra) + 1.0 * extra;
    return 1 / inv;
}

static void check_table(const char *what, const model *m, double factor, double orig, double bf, double bs,
                        double attn)
{
    const hparams *hp = &m->hp;
    int half = hp->n_rot / 2;
    CHECKF(hp->rope_yarn == 1 && hp->yarn_truncate == 1, "%s: yarn %d truncate %d", what, hp->rope_yarn,
           hp->yarn_truncate);
    CHECKF(m->rope_freqs.data && m->rope_freqs.n_in == half + 1, "%s: rope_freqs of %lld", what,
           (long long)m->rope_freqs.n_in);
    if (!m->rope_freqs.data) return;
    const float *t = m->rope_freqs.data;
    double worst = 0;
    int ramp = 0;
    for (int i = 0; i < half; i++) {
        double want = yarn_div(i, hp->n_rot, hp->rope_base, factor, orig, bf, bs);
        double d = fabs(t[i] - want) / want;
        if (d > worst) worst = d;
        ramp += t[i] > 1.0001f && t[i] < factor - 1e-3;
    }
    CHECKF(worst < 1e-6, "%s: divisors off by %g", what, worst);
    CHECKF(fabsf(t[0] - 1) < 1e-6f && fabsf(t[half - 1] - (float)factor) < 1e-3f, "%s: ends %g, %g", what, t[0],
           t[half - 1]);
    CHECKF(fabs(t[half] - attn) < 1e-6, "%s: attention factor %g, want %g", what, t[half], attn);
    fprintf(stderr, "  %-34s n_rot %d, %d pairs on the ramp, attention factor %.6f\n", what, hp->n_rot, ramp, t[half]);
}

static void test_gguf_families(void)
{
    static const struct { const char *file, *arch; } fs[] = {
        { "qwen3-tiny.bf16.gguf", "qwen3" },
        { "qwen2-tiny.bf16.gguf", "qwen2" },
        { "qwen3moe-tiny.bf16.gguf", "qwen3moe" },
        { "llama-q.bf16.gguf", "llama" },
    };
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        buf kv = { 0 };
        char k[96], path[256], err[512];
        snprintf(k, sizeof k, "%s.rope.scaling.type", fs[i].arch);
        kv_str(&kv, k, "yarn");
        snprintf(k, sizeof k, "%s.rope.scaling.factor", fs[i].arch);
        kv_f32(&kv, k, 4);
        snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", fs[i].arch);
        kv_u32(&kv, k, 256);
        CHECK(with_keys(fs[i].file, &kv, 3, path, sizeof path) == 0);
        free(kv.p);
        model *m = NULL;
        CHECKF(model_load(&m, path, err, sizeof err) == 0, "%s: %s", fs[i].file, err);
        if (m) check_table(fs[i].file, m, 4, 256, 32, 1, 1 + 0.1 * log(4.0));
        model_free(m);
        /* beta and the attention factor as given */
        kv = (buf){ 0 };
        snprintf(k, sizeof k, "%s.rope.scaling.type", fs[i].arch);
        kv_str(&kv, k, "yarn");
        snprintf(k, sizeof k, "%s.rope.scaling.factor", fs[i].arch);
        kv_f32(&kv, k, 8);
        snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", fs[i].arch);
        kv_u32(&kv, k, 512);
        snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_fast", fs[i].arch);
        kv_f32(&kv, k, 16);
        snprintf(k, sizeof k, "%s.rope.scaling.yarn_beta_slow", fs[i].arch);
        kv_f32(&kv, k, 2);
        snprintf(k, sizeof k, "%s.rope.scaling.attn_factor", fs[i].arch);
        kv_f32(&kv, k, 0.5f);
        CHECK(with_keys(fs[i].file, &kv, 6, path, sizeof path) == 0);
        free(kv.p);
        m = NULL;
        CHECKF(model_load(&m, path, err, sizeof err) == 0, "%s: %s", fs[i].file, err);
        if (m) check_table(fs[i].file, m, 8, 512, 16, 2, 0.5 * (1 + 0.1 * log(8.0)));
        model_free(m);
        /* no original_context_length: named */
        kv = (buf){ 0 };
        snprintf(k, sizeof k, "%s.rope.scaling.type", fs[i].arch);
        kv_str(&kv, k, "yarn");
        CHECK(with_keys(fs[i].file, &kv, 1, path, sizeof path) == 0);
        free(kv.p);
        m = NULL;
        CHECK(model_load(&m, path, err, sizeof err) != 0 && m == NULL);
        CHECKF(strstr(err, "rope.scaling.original_context_length") && strstr(err, path), "%s", err);
    }
    /* a file with both llama-3.1 divisors and YaRN: refused */
    buf kv = { 0 };
    char path[256], err[512];
    kv_str(&kv, "llama.rope.scaling.type", "yarn");
    kv_u32(&kv, "llama.rope.scaling.original_context_length", 256);
    CHECK(with_keys("llama3-tiny.bf16.gguf", &kv, 2, path, sizeof path) == 0);
    free(kv.p);
    model *m = NULL;
    CHECK(model_load(&m, path, err, sizeof err) != 0);
    CHECKF(strstr(err, "rope_freqs.weight and YaRN"), "%s", err);
    /* families that do not take it */
    kv = (buf){ 0 };
    kv_str(&kv, "gemma3.rope.scaling.type", "yarn");
    CHECK(with_keys("gemma3-tiny.bf16.gguf", &kv, 1, path, sizeof path) == 0);
    free(kv.p);
    CHECK(model_load(&m, path, err, sizeof err) != 0);
    CHECKF(strstr(err, "gemma3.rope.scaling.type") && strstr(err, "not supported for gemma3 (expected none or linear)"), "%s",
           err);
}

/* Gemma 3's linear scaling (rope.scaling.type linear, factor 8 in the 4B
 * and larger files): every pair's frequency divided by the factor, in the
 * global layers; it changes the logits; a factor of 1 is no table. Refused
 * for the families that do not declare it. */
static void test_gemma3_linear(void)
{
    char path[2][256], err[512];
    for (int k = 0; k < 2; k++) {
        buf kv = { 0 };
        kv_str(&kv, "gemma3.rope.scaling.type", "linear");
        kv_f32(&kv, "gemma3.rope.scaling.factor", k ? 1.0f : 8.0f);
        CHECK(with_keys("gemma3-tiny.bf16.gguf", &kv, 2, path[k], sizeof path[k]) == 0);
        free(kv.p);
        model *m = NULL;
        CHECKF(model_load(&m, path[k], err, sizeof err) == 0, "%s", err);
        if (!m) continue;
        if (k == 0) {
            int half = m->hp.n_rot / 2, all = 1;
            CHECK(m->rope_freqs.data && m->rope_freqs.n_in == half && !m->hp.rope_yarn);
            for (int i = 0; m->rope_freqs.data && i < half; i++) all &= ((const float *)m->rope_freqs.data)[i] == 8.0f;
            CHECK(all);
        } else {
            CHECK(m->rope_freqs.data == NULL);
        }
        model_free(m);
    }
    /* the logits change with the factor (positions past a few turns of the slowest pair) */
    float top[2][64];
    const char *paths[2] = { "tests/fixtures/models/gemma3-tiny.bf16.gguf", path[0] };
    for (int k = 0; k < 2; k++) {
        eng *e = NULL;
        eng_opts o = { 0 };
        o.model_path = paths[k];
        o.n_threads = 2;
        o.max_seqs = 1;
        o.n_ctx = 256;
        CHECKF(eng_open(&e, &o, err, sizeof err) == 0, "%s", err);
        if (!e) return;
        int32_t toks[64];
        for (int i = 0; i < 64; i++) toks[i] = 2 + (i * 37) % 200;
        eng_job_desc d = { 0 };
        d.kind = ENG_JOB_EVAL;
        d.tokens = toks;
        d.n_tokens = 64;
        d.top_n = 1;
        uint64_t id;
        eng_err code;
        CHECKF(eng_submit(e, &d, &id, &code, err, sizeof err) == 0, "%s", err);
        int done = 0;
        for (int spins = 0; !done && spins < 200000; spins++) {
            eng_event *ev = eng_events_take(e);
            if (!ev) { usleep(200); continue; }
            while (ev) {
                eng_event *nx = ev->next;
                if (ev->type == ENG_EV_LOGITS && ev->pos >= 0 && ev->pos < 64 && ev->n_top > 0)
                    top[k][ev->pos] = ev->top_logits[0];
                if (ev->type == ENG_EV_DONE || ev->type == ENG_EV_ERROR) done = 1;
                eng_event_free(ev);
                ev = nx;
            }
        }
        CHECK(done);
        eng_close(e);
    }
    CHECKF(top[0][0] == top[1][0], "position 0 turns no pair: %g vs %g", top[0][0], top[1][0]);
    int differ = 0;
    for (int i = 1; i < 64; i++) differ += top[0][i] != top[1][i];
    CHECKF(differ > 32, "linear factor 8 changed %d of 63 positions' logits", differ);
    buf kv = { 0 };
    kv_str(&kv, "qwen3.rope.scaling.type", "linear");
    kv_f32(&kv, "qwen3.rope.scaling.factor", 8.0f);
    CHECK(with_keys("qwen3-tiny.bf16.gguf", &kv, 2, path[0], sizeof path[0]) == 0);
    free(kv.p);
    model *m = NULL;
    CHECK(model_load(&m, path[0], err, sizeof err) != 0);
    CHECKF(strstr(err, "qwen3.rope.scaling.type' is 'linear'") && strstr(err, "(expected none or yarn)"), "%s", err);
}

/* A factor of 1 changes nothing: the same logits as the file without it,
 * bit for bit (the table's divisors and factor all 1). */
static void test_factor_one(void)
{
    buf kv = { 0 };
    char path[256], err[512];
    kv_str(&kv, "qwen3.rope.scaling.type", "yarn");
    kv_f32(&kv, "qwen3.rope.scaling.factor", 1);
    kv_u32(&kv, "qwen3.rope.scaling.original_context_length", 64);
    CHECK(with_keys("qwen3-tiny.bf16.gguf", &kv, 3, path, sizeof path) == 0);
    free(kv.p);
    float top[2][200];
    for (int k = 0; k < 2; k++) {
        eng *e = NULL;
        eng_opts o = { 0 };
        o.model_path = k ? path : "tests/fixtures/models/qwen3-tiny.bf16.gguf";
        o.n_threads = 2;
        o.max_seqs = 1;
        o.n_ctx = 256;
        CHECKF(eng_open(&e, &o, err, sizeof err) == 0, "%s", err);
        if (!e) return;
        int32_t toks[200];
        for (int i = 0; i < 200; i++) toks[i] = 1 + (i * 37) % 500;
        eng_job_desc d = { 0 };
        d.kind = ENG_JOB_EVAL;
        d.tokens = toks;
        d.n_tokens = 200;
        d.top_n = 1;
        uint64_t id;
        eng_err code;
        CHECKF(eng_submit(e, &d, &id, &code, err, sizeof err) == 0, "%s", err);
        int done = 0;
        for (int spins = 0; !done && spins < 200000; spins++) {
            eng_event *ev = eng_events_take(e);
            if (!ev) { usleep(200); continue; }
            while (ev) {
                eng_event *nx = ev->next;
                if (ev->type == ENG_EV_LOGITS && ev->pos >= 0 && ev->pos < 200 && ev->n_top > 0)
                    top[k][ev->pos] = ev->top_logits[0];
                if (ev->type == ENG_EV_DONE || ev->type == ENG_EV_ERROR) done = 1;
                eng_event_free(ev);
                ev = nx;
            }
        }
        CHECK(done);
        eng_close(e);
    }
    int same = 0;
    while (same < 200 && top[0][same] == top[1][same]) same++;
    CHECKF(same == 200, "factor 1: logits differ at position %d (%.7g vs %.7g)", same, same < 200 ? top[0][same] : 0,
           same < 200 ? top[1][same] : 0);
}

/* config.json: rope_scaling yarn for qwen2 (truncate: transformers' default) */
static void test_hf(void)
{
    static const char *files[] = { "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" };
    char dir[128], err[512];
    snprintf(dir, sizeof dir, "%s/hfq2", tmp);
    mkdir(dir, 0755);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "tests/fixtures/hf/qwen2-tiny/%s", files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        FILE *in = fopen(a, "rb"), *out = fopen(b, "wb");
        CHECK(in && out);
        char blk[65536];
        size_t n;
        while (in && out && (n = fread(blk, 1, sizeof blk, in)) > 0) CHECK(fwrite(blk, 1, n, out) == n);
        if (in) fclose(in);
        if (out) fclose(out);
    }
    char p[256];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    CHECK(c != NULL);
    if (!c) return;
    /* (this config has transformers' newer rope_parameters, read before rope_scaling) */
    json_t *rp = json_object_get(c, "rope_parameters");
    CHECK(json_is_object(rp));
    json_object_set_new(rp, "rope_type", json_string("yarn"));
    json_object_set_new(rp, "factor", json_real(4.0));
    json_object_set_new(rp, "original_max_position_embeddings", json_integer(256));
    json_dump_file(c, p, 0);
    json_decref(c);
    model *m = NULL;
    CHECKF(model_load(&m, dir, err, sizeof err) == 0, "%s", err);
    if (m) check_table("hf/qwen2-tiny", m, 4, 256, 32, 1, 1 + 0.1 * log(4.0));
    model_free(m);
}

static void test_table_rows(void)
{
    static const char *yes[] = { "llama", "qwen2", "qwen3", "qwen3moe", "gpt-oss" }, *no[] = { "gemma3", "gpt2", "qwen35" };
    CHECK((arch_find("gemma3")->opt & ARCH_ROPE_LINEAR) && !(arch_find("qwen3")->opt & ARCH_ROPE_LINEAR));
    for (size_t i = 0; i < 5; i++) CHECKF(arch_find(yes[i])->opt & ARCH_YARN, "%s", yes[i]);
    for (size_t i = 0; i < 3; i++) CHECKF(!(arch_find(no[i])->opt & ARCH_YARN), "%s", no[i]);
    CHECK((arch_find("gpt-oss")->opt & ARCH_YARN_EXACT) && !(arch_find("qwen3")->opt & ARCH_YARN_EXACT));
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    snprintf(tmp, sizeof tmp, "/tmp/t_yarn.XXXXXX");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    RUN(test_table_rows);
    RUN(test_gguf_families);
    RUN(test_factor_one);
    RUN(test_gemma3_linear);
    RUN(test_hf);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) {}
    return CHECK_DONE();
}
