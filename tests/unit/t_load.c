/* t_load — loading model files that are wrong, odd or replaced under us.
 *
 * Small GGUFs are built here in memory (a tiny llama: SentencePiece vocab,
 * f32 weights) with one defect each; Hugging Face directories are copies of
 * tests/fixtures/hf/qwen2-tiny with one file changed. Each must be refused at
 * load with a message naming the file, the key or field and what was
 * expected. FIFOs, directories and devices where files belong are refused
 * without blocking (loads run in a child under a time limit, so the old
 * hang shows as a failure). Model files rewritten or truncated while loaded
 * end the jobs that used them with ENG_EMODEL_CHANGED and never kill the
 * process: a read past a truncated end (SIGBUS) finds zero pages. */
#include "engine/engine.h"
#include "engine/load/gguf.h"
#include "engine/load/model.h"
#include "tests/check.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STORIES FIXTURE("models/stories260K.gguf")

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif
#define HF_DIR FIXTURE("hf/qwen2-tiny")

static char tmp[64];

/* ---- files ------------------------------------------------------------- */

static int write_file(const char *path, const void *d, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, (const char *)d + off, n - off);
        if (w <= 0) { close(fd); return -1; }
        off += (size_t)w;
    }
    return close(fd);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static int copy_file(const char *from, const char *to)
{
    size_t n;
    uint8_t *b = read_all(from, &n);
    if (!b) return -1;
    int rc = write_file(to, b, n);
    free(b);
    return rc;
}

static int rm_one(const char *p, const struct stat *st, int fl, struct FTW *f)
{
    (void)st; (void)fl; (void)f;
    return remove(p);
}

static void rm_rf(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* ---- a GGUF builder ---------------------------------------------------- */

enum { G_U32 = 4, G_I32 = 5, G_F32 = 6, G_BOOL = 7, G_STR = 8, G_ARR = 9, G_U64 = 10 };

typedef struct gkv {
    char key[96];
    int type;
    uint64_t u;          /* U32, U64, I32 (as int64 bits) */
    double f;            /* F32 */
    const char *s;       /* STR */
    int at;              /* ARR: element type (STR, I32, F32) */
    size_t an;
    const char **as;
    const int32_t *ai;
    const float *af;
} gkv;

/* off: -1 the next free offset; -2 - j: tensor j's offset */
typedef struct gten { char name[64]; uint64_t ne[2]; int nd; int64_t off; uint32_t type; } gten;   /* type: ggml id, 0 = F32 */

typedef struct gspec { gkv kv[64]; int nkv; gten t[48]; int nt; } gspec;

typedef struct buf { uint8_t *p; size_t n, cap; } buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put64(buf *b, uint64_t v) { put(b, &v, 8); }
static void putstr(buf *b, const char *s) { put64(b, strlen(s)); put(b, s, strlen(s)); }

static gkv *kv_find(gspec *s, const char *key)
{
    for (int i = 0; i < s->nkv; i++)
        if (!strcmp(s->kv[i].key, key)) return &s->kv[i];
    return NULL;
}

static gkv *kv_add(gspec *s, const char *key, int type)
{
    gkv *k = &s->kv[s->nkv++];
    memset(k, 0, sizeof *k);
    snprintf(k->key, sizeof k->key, "%s", key);
    k->type = type;
    return k;
}

/* Sets (or adds) a scalar. */
static void set_u32(gspec *s, const char *key, uint32_t v)
{
    gkv *k = kv_find(s, key);
    if (!k) k = kv_add(s, key, G_U32);
    k->type = G_U32;
    k->u = v;
}
static void set_i32(gspec *s, const char *key, int32_t v)
{
    gkv *k = kv_find(s, key);
    if (!k) k = kv_add(s, key, G_I32);
    k->type = G_I32;
    k->u = (uint64_t)(int64_t)v;
}
static void set_f32(gspec *s, const char *key, double v)
{
    gkv *k = kv_find(s, key);
    if (!k) k = kv_add(s, key, G_F32);
    k->type = G_F32;
    k->f = v;
}
static void set_str(gspec *s, const char *key, const char *v)
{
    gkv *k = kv_find(s, key);
    if (!k) k = kv_add(s, key, G_STR);
    k->type = G_STR;
    k->s = v;
}

static void add_t(gspec *s, const char *name, uint64_t n0, uint64_t n1)
{
    gten *t = &s->t[s->nt++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ne[0] = n0;
    t->ne[1] = n1;
    t->nd = n1 ? 2 : 1;
    t->off = -1;
}

static gten *t_find(gspec *s, const char *name)
{
    for (int i = 0; i < s->nt; i++)
        if (!strcmp(s->t[i].name, name)) return &s->t[i];
    return NULL;
}

/* the vocabulary: <unk> <s> </s>, 256 byte tokens, a few words */
#define NV (3 + 256 + 8)
static const char *vtok[NV];
static int32_t vtype[NV];
static float vscore[NV];
static char vbytes[256][8];

static void vocab_init(void)
{
    static const char *words[8] = { "\xe2\x96\x81", "\xe2\x96\x81the", "\xe2\x96\x81" "a", "e", "t", "o",
                                    "\xe2\x96\x81Once", "h" };
    vtok[0] = "<unk>"; vtok[1] = "<s>"; vtok[2] = "</s>";
    vtype[0] = 2; vtype[1] = vtype[2] = 3;
    for (int i = 0; i < 256; i++) {
        snprintf(vbytes[i], sizeof vbytes[i], "<0x%02X>", i);
        vtok[3 + i] = vbytes[i];
        vtype[3 + i] = 6;
    }
    for (int i = 0; i < 8; i++) {
        vtok[259 + i] = words[i];
        vtype[259 + i] = 1;
        vscore[259 + i] = -(float)i;
    }
}

enum { E = 8, F = 16, H = 2, HKV = 1 };

/* A tiny llama of one block that loads. */
static void base_spec(gspec *s)
{
    memset(s, 0, sizeof *s);
    set_str(s, "general.architecture", "llama");
    set_str(s, "general.name", "tiny");
    set_u32(s, "llama.context_length", 64);
    set_u32(s, "llama.embedding_length", E);
    set_u32(s, "llama.feed_forward_length", F);
    set_u32(s, "llama.block_count", 1);
    set_u32(s, "llama.attention.head_count", H);
    set_u32(s, "llama.attention.head_count_kv", HKV);
    set_f32(s, "llama.attention.layer_norm_rms_epsilon", 1e-5);
    set_f32(s, "llama.rope.freq_base", 10000.0);
    set_str(s, "tokenizer.ggml.model", "llama");
    gkv *k = kv_add(s, "tokenizer.ggml.tokens", G_ARR);
    k->at = G_STR; k->an = NV; k->as = vtok;
    k = kv_add(s, "tokenizer.ggml.scores", G_ARR);
    k->at = G_F32; k->an = NV; k->af = vscore;
    k = kv_add(s, "tokenizer.ggml.token_type", G_ARR);
    k->at = G_I32; k->an = NV; k->ai = vtype;
    set_u32(s, "tokenizer.ggml.bos_token_id", 1);
    set_u32(s, "tokenizer.ggml.eos_token_id", 2);
    set_u32(s, "tokenizer.ggml.unknown_token_id", 0);
    int hd = E / H;
    add_t(s, "token_embd.weight", E, NV);
    add_t(s, "output_norm.weight", E, 0);
    add_t(s, "blk.0.attn_norm.weight", E, 0);
    add_t(s, "blk.0.attn_q.weight", E, H * hd);
    add_t(s, "blk.0.attn_k.weight", E, HKV * hd);
    add_t(s, "blk.0.attn_v.weight", E, HKV * hd);
    add_t(s, "blk.0.attn_output.weight", H * hd, E);
    add_t(s, "blk.0.ffn_norm.weight", E, 0);
    add_t(s, "blk.0.ffn_gate.weight", E, F);
    add_t(s, "blk.0.ffn_up.weight", E, F);
    add_t(s, "blk.0.ffn_down.weight", F, E);
}

static uint64_t t_bytes(const gten *t) { return t->ne[0] * (t->nd == 2 ? t->ne[1] : 1) * 4; }

static void put_val(buf *b, const gkv *k)
{
    switch (k->type) {
    case G_U32: put32(b, (uint32_t)k->u); break;
    case G_I32: put32(b, (uint32_t)(int32_t)(int64_t)k->u); break;
    case G_U64: put64(b, k->u); break;
    case G_F32: { float f = (float)k->f; put(b, &f, 4); break; }
    case G_STR: putstr(b, k->s); break;
    case G_ARR:
        put32(b, (uint32_t)k->at);
        put64(b, k->an);
        for (size_t i = 0; i < k->an; i++) {
            if (k->at == G_STR) putstr(b, k->as[i]);
            else if (k->at == G_I32) put32(b, (uint32_t)k->ai[i]);
            else if (k->at == G_BOOL) { uint8_t v = k->ai[i] != 0; put(b, &v, 1); }
            else put(b, &k->af[i], 4);
        }
        break;
    }
}

/* Serializes s into path: f32 tensors, 32-byte alignment, offsets in order
 * unless a tensor's off says otherwise. */
static int write_gguf(const gspec *s, const char *path)
{
    buf b = { 0 };
    put(&b, "GGUF", 4);
    put32(&b, 3);
    put64(&b, (uint64_t)s->nt);
    put64(&b, (uint64_t)s->nkv);
    for (int i = 0; i < s->nkv; i++) {
        putstr(&b, s->kv[i].key);
        put32(&b, (uint32_t)s->kv[i].type);
        put_val(&b, &s->kv[i]);
    }
    uint64_t next = 0, end = 0, offs[48];
    for (int i = 0; i < s->nt; i++) {
        const gten *t = &s->t[i];
        uint64_t off = t->off >= 0 ? (uint64_t)t->off : t->off <= -2 ? offs[-t->off - 2] : next;
        offs[i] = off;
        putstr(&b, t->name);
        put32(&b, (uint32_t)t->nd);
        for (int d = 0; d < t->nd; d++) put64(&b, t->ne[d]);
        put32(&b, t->type);   /* data is written as F32 whatever the type */
        put64(&b, off);
        uint64_t e = off + t_bytes(t);
        next = (e + 31) / 32 * 32;
        if (e > end) end = e;
    }
    while (b.n % 32) put(&b, "", 1);
    for (uint64_t i = 0; i < (end + 3) / 4; i++) {
        float v = 0.02f * (float)((int)(i % 11) - 5);
        put(&b, &v, 4);
    }
    int rc = write_file(path, b.p, b.n);
    free(b.p);
    return rc;
}

/* Builds s into a temp file and loads it: 0 loaded, -1 refused (err set). */
static int load_spec(const gspec *s, char *path, size_t pn, char *err, size_t errlen)
{
    static int seq;
    snprintf(path, pn, "%s/m%d.gguf", tmp, seq++);
    err[0] = 0;
    if (write_gguf(s, path)) { snprintf(err, errlen, "cannot write %s", path); return -2; }
    model *m = NULL;
    int rc = model_load(&m, path, err, errlen);
    model_free(m);
    return rc;
}

/* Expects s refused with a message holding the file's path and each needle. */
static void expect_refused(const gspec *s, const char *what, const char *n1, const char *n2)
{
    char path[256], err[512];
    int rc = load_spec(s, path, sizeof path, err, sizeof err);
    CHECKF(rc == -1, "%s: loaded (rc %d) but should be refused", what, rc);
    if (rc != -1) return;
    CHECKF(strstr(err, path) != NULL, "%s: message does not name the file: %s", what, err);
    CHECKF(!n1 || strstr(err, n1), "%s: message lacks '%s': %s", what, n1, err);
    CHECKF(!n2 || strstr(err, n2), "%s: message lacks '%s': %s", what, n2, err);
}

static void test_base_loads(void)
{
    gspec s;
    base_spec(&s);
    char path[256], err[512];
    CHECKF(load_spec(&s, path, sizeof path, err, sizeof err) == 0, "the base spec must load: %s", err);
    /* "none" as converters write it */
    set_u32(&s, "tokenizer.ggml.padding_token_id", UINT32_MAX);
    set_i32(&s, "tokenizer.ggml.seperator_token_id", -1);
    CHECKF(load_spec(&s, path, sizeof path, err, sizeof err) == 0, "none-ids must load: %s", err);
    set_u32(&s, "llama.vocab_size", NV);
    CHECKF(load_spec(&s, path, sizeof path, err, sizeof err) == 0, "a matching vocab_size must load: %s", err);
}

static void test_duplicate_keys(void)
{
    gspec s;
    base_spec(&s);
    kv_add(&s, "llama.block_count", G_U32)->u = 2;
    expect_refused(&s, "block_count twice", "llama.block_count", "twice");
    base_spec(&s);
    kv_add(&s, "general.name", G_STR)->s = "other";
    expect_refused(&s, "general.name twice", "general.name", "twice");
}

static void test_overlapping_tensors(void)
{
    gspec s;
    base_spec(&s);
    /* attn_k and attn_v have the same size: v over k */
    t_find(&s, "blk.0.attn_v.weight")->off = -2 - (t_find(&s, "blk.0.attn_k.weight") - s.t);
    expect_refused(&s, "two tensors at one offset", "overlap", "blk.0.attn_");
    base_spec(&s);
    t_find(&s, "output_norm.weight")->off = 32;   /* inside token_embd */
    expect_refused(&s, "a tensor inside another", "overlap", "token_embd.weight");
}

static void test_bad_numbers(void)
{
    static const struct { const char *key; double v; } bad[] = {
        { "llama.attention.layer_norm_rms_epsilon", NAN },
        { "llama.attention.layer_norm_rms_epsilon", -1e-5 },
        { "llama.attention.layer_norm_rms_epsilon", 0 },
        { "llama.attention.layer_norm_rms_epsilon", INFINITY },
        { "llama.rope.freq_base", 0 },
        { "llama.rope.freq_base", INFINITY },
        { "llama.rope.freq_base", NAN },
        { "llama.rope.freq_base", -10000 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gspec s;
        base_spec(&s);
        set_f32(&s, bad[i].key, bad[i].v);
        char what[160];
        snprintf(what, sizeof what, "%s = %g", bad[i].key, bad[i].v);
        expect_refused(&s, what, bad[i].key, "expected");
    }
}

static void test_token_ids(void)
{
    static const char *keys[] = { "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                  "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id",
                                  "tokenizer.ggml.unknown_token_id" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        gspec s;
        base_spec(&s);
        set_u32(&s, keys[i], NV);   /* one past the vocabulary */
        expect_refused(&s, keys[i], keys[i], "vocabulary");
        base_spec(&s);
        set_i32(&s, keys[i], -7);
        expect_refused(&s, keys[i], keys[i], "token id");
    }
    gspec s;
    base_spec(&s);
    set_str(&s, "tokenizer.ggml.bos_token_id", "1");
    expect_refused(&s, "bos as a string", "tokenizer.ggml.bos_token_id", "not an integer");
}

/* What the engine does not compute is refused, not run as something else. */
static void test_unsupported(void)
{
    gspec s;
    base_spec(&s);
    set_str(&s, "llama.rope.scaling.type", "linear");
    expect_refused(&s, "rope scaling linear", "llama.rope.scaling.type", "not supported for llama (expected none or yarn)");
    base_spec(&s);
    set_f32(&s, "llama.rope.scale_linear", 4);
    expect_refused(&s, "rope.scale_linear 4", "llama.rope.scale_linear", "not supported");
    base_spec(&s);
    set_f32(&s, "llama.rope.scaling.factor", 8);
    expect_refused(&s, "rope.scaling.factor 8", "llama.rope.scaling.factor", "not supported");
    base_spec(&s);
    static float nan_scores[NV];
    memcpy(nan_scores, vscore, sizeof nan_scores);
    nan_scores[100] = NAN;
    kv_find(&s, "tokenizer.ggml.scores")->af = nan_scores;
    expect_refused(&s, "a NaN score", "tokenizer.ggml.scores[100]", "NaN");
    /* weight types it cannot run: named with the tensor and the file */
    base_spec(&s);
    t_find(&s, "blk.0.attn_q.weight")->type = 29;
    expect_refused(&s, "an IQ1_M tensor", "blk.0.attn_q.weight", "unsupported weight type iq1_m (type 29)");
    base_spec(&s);
    t_find(&s, "blk.0.ffn_down.weight")->type = 34;
    expect_refused(&s, "a TQ1_0 tensor", "blk.0.ffn_down.weight", "unsupported weight type tq1_0 (type 34)");
    base_spec(&s);
    t_find(&s, "blk.0.attn_k.weight")->type = 77;
    expect_refused(&s, "a tensor of an unknown type", "blk.0.attn_k.weight", "type 77 (supported: f32, f16, q4_0");
    base_spec(&s);
    set_str(&s, "llama.rope.scaling.type", "none");
    set_f32(&s, "llama.rope.scaling.factor", 8);
    char path[256], err[512];
    CHECKF(load_spec(&s, path, sizeof path, err, sizeof err) == 0, "scaling type none must load: %s", err);
}

/* base_spec as a Gemma 3 file of n_layer layers (its keys renamed, its
 * extra norms added) with a sliding window of 8. */
static void gemma3_spec(gspec *s, int n_layer)
{
    base_spec(s);
    for (int i = 0; i < s->nkv; i++)
        if (!strncmp(s->kv[i].key, "llama.", 6)) {
            char k[96];
            snprintf(k, sizeof k, "gemma3.%s", s->kv[i].key + 6);
            snprintf(s->kv[i].key, sizeof s->kv[i].key, "%s", k);
        }
    set_str(s, "general.architecture", "gemma3");
    set_u32(s, "gemma3.block_count", (uint32_t)n_layer);
    set_u32(s, "gemma3.attention.sliding_window", 8);
    int hd = E / H;
    s->nt = 2;   /* token_embd, output_norm */
    for (int l = 0; l < n_layer; l++) {
        static const char *const vec[] = { "attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm" };
        char n[64];
        for (int v = 0; v < 4; v++) { snprintf(n, sizeof n, "blk.%d.%s.weight", l, vec[v]); add_t(s, n, E, 0); }
        snprintf(n, sizeof n, "blk.%d.attn_q_norm.weight", l); add_t(s, n, hd, 0);
        snprintf(n, sizeof n, "blk.%d.attn_k_norm.weight", l); add_t(s, n, hd, 0);
        snprintf(n, sizeof n, "blk.%d.attn_q.weight", l); add_t(s, n, E, H * hd);
        snprintf(n, sizeof n, "blk.%d.attn_k.weight", l); add_t(s, n, E, HKV * hd);
        snprintf(n, sizeof n, "blk.%d.attn_v.weight", l); add_t(s, n, E, HKV * hd);
        snprintf(n, sizeof n, "blk.%d.attn_output.weight", l); add_t(s, n, H * hd, E);
        snprintf(n, sizeof n, "blk.%d.ffn_gate.weight", l); add_t(s, n, E, F);
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l); add_t(s, n, E, F);
        snprintf(n, sizeof n, "blk.%d.ffn_down.weight", l); add_t(s, n, F, E);
    }
}

/* Gemma 3's sliding window and layer pattern: missing, past the context,
 * a pattern that does not fit block_count, not bools; a missing norm. */
static void test_gemma3_keys(void)
{
    gspec s;
    char path[256], err[512];
    gemma3_spec(&s, 2);
    CHECKF(load_spec(&s, path, sizeof path, err, sizeof err) == 0, "gemma3 spec must load: %s", err);
    s.nkv--;   /* (the sliding window was the last key added) */
    expect_refused(&s, "no sliding window", "gemma3.attention.sliding_window", NULL);
    gemma3_spec(&s, 2);
    set_u32(&s, "gemma3.attention.sliding_window", 65);
    expect_refused(&s, "window past the context", "gemma3.attention.sliding_window", "64");
    gemma3_spec(&s, 2);
    static const int32_t three[3] = { 1, 1, 0 }, two[2] = { 1, 0 };
    gkv *k = kv_add(&s, "gemma3.attention.sliding_window_pattern", G_ARR);
    k->at = G_BOOL; k->an = 3; k->ai = three;
    expect_refused(&s, "pattern of 3 for 2 layers", "gemma3.attention.sliding_window_pattern", "block_count is 2");
    k->an = 2; k->ai = two;
    CHECKF(load_spec(&s, path, sizeof path, err, sizeof err) == 0, "a pattern of 2 bools must load: %s", err);
    k->at = G_I32;
    expect_refused(&s, "pattern of ints", "gemma3.attention.sliding_window_pattern", "expected bools");
    gemma3_spec(&s, 2);
    set_u32(&s, "gemma3.attention.sliding_window_pattern", 3);
    expect_refused(&s, "period past the layers", "gemma3.attention.sliding_window_pattern", "0..2");
    gemma3_spec(&s, 2);
    t_find(&s, "blk.1.post_ffw_norm.weight")->name[0] = 'x';
    expect_refused(&s, "no post_ffw_norm", "blk.1.post_ffw_norm.weight", NULL);
}

static void test_vocab_size(void)
{
    gspec s;
    base_spec(&s);
    set_u32(&s, "llama.vocab_size", NV + 100);
    expect_refused(&s, "vocab_size above the tokenizer's", "llama.vocab_size", "tokenizer");
    base_spec(&s);
    set_u32(&s, "llama.vocab_size", 32);
    expect_refused(&s, "vocab_size below the tokenizer's", "llama.vocab_size", "tokenizer");
}

static void test_shapes_and_counts(void)
{
    gspec s;
    base_spec(&s);
    add_t(&s, "blk.1.attn_norm.weight", E, 0);   /* a block past block_count */
    expect_refused(&s, "a tensor of block 1 with block_count 1", "blk.1.attn_norm.weight", "block_count");
    base_spec(&s);
    set_u32(&s, "llama.attention.head_count", 3);   /* 8 is no multiple of 3, no key_length */
    expect_refused(&s, "embedding_length % head_count", "llama.embedding_length", "multiple");
    base_spec(&s);
    set_u32(&s, "llama.attention.head_count", 4);
    set_u32(&s, "llama.attention.head_count_kv", 3);
    expect_refused(&s, "head_count % head_count_kv", "llama.attention.head_count_kv", "multiple");
    base_spec(&s);
    set_u32(&s, "llama.attention.head_count_kv", 4);   /* more kv heads than heads */
    expect_refused(&s, "head_count_kv above head_count", "llama.attention.head_count_kv", "expected");
    base_spec(&s);
    set_u32(&s, "llama.context_length", 0);
    expect_refused(&s, "context_length 0", "llama.context_length", "expected");
    base_spec(&s);
    set_u32(&s, "llama.context_length", 1u << 30);
    expect_refused(&s, "context_length 2^30", "llama.context_length", "expected");
    base_spec(&s);
    set_str(&s, "llama.block_count", "1");
    expect_refused(&s, "block_count as a string", "llama.block_count", "not an integer");
    base_spec(&s);
    set_u32(&s, "llama.block_count", 0);
    expect_refused(&s, "block_count 0", "llama.block_count", "expected");
    base_spec(&s);
    t_find(&s, "blk.0.ffn_up.weight")->ne[1] = F * 2;   /* against feed_forward_length */
    expect_refused(&s, "ffn_up shape", "blk.0.ffn_up.weight", "expected");
}

/* ---- non-regular files, without blocking ------------------------------- */

/* model_load(path) in a child, given limit_s seconds: 0 loaded, -1 refused
 * (message in err), -2 timed out or crashed. */
static int load_in_child(const char *path, int limit_s, char *err, size_t errlen)
{
    int p[2];
    err[0] = 0;
    if (pipe(p)) return -2;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        char e[512] = "";
        model *m = NULL;
        int rc = model_load(&m, path, e, sizeof e);
        model_free(m);
        char out[520];
        int n = snprintf(out, sizeof out, "%c%s", rc == 0 ? '0' : '1', e);
        if (write(p[1], out, (size_t)n) < 0) _exit(3);
        _exit(0);
    }
    close(p[1]);
    struct pollfd pf = { .fd = p[0], .events = POLLIN };
    char in[520];
    ssize_t n = 0;
    if (poll(&pf, 1, limit_s * 1000) == 1) n = read(p[0], in, sizeof in - 1);
    close(p[0]);
    if (n <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        snprintf(err, errlen, "no answer within %d s", limit_s);
        return -2;
    }
    waitpid(pid, NULL, 0);
    in[n] = 0;
    snprintf(err, errlen, "%.500s", in + 1);
    return in[0] == '0' ? 0 : -1;
}

static void expect_child_refused(const char *path, const char *what, const char *n1, const char *n2)
{
    char err[512];
    int rc = load_in_child(path, 10, err, sizeof err);
    CHECKF(rc == -1, "%s: %s (rc %d)", what, rc == -2 ? err : "loaded", rc);
    if (rc != -1) return;
    CHECKF(!n1 || strstr(err, n1), "%s: message lacks '%s': %s", what, n1, err);
    CHECKF(!n2 || strstr(err, n2), "%s: message lacks '%s': %s", what, n2, err);
}

static void hf_copy_of(const char *src, char *dir, size_t n);
/* A fresh copy of the qwen2-tiny directory under tmp. */
static void hf_copy(char *dir, size_t n) { hf_copy_of(HF_DIR, dir, n); }

static void hf_copy_of(const char *src, char *dir, size_t n)
{
    static int seq;
    static const char *files[] = { "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" };
    snprintf(dir, n, "%s/hf%d", tmp, seq++);
    mkdir(dir, 0755);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (copy_file(a, b)) fprintf(stderr, "cannot copy %s\n", a);
    }
}

static void test_fifos(void)
{
    char p[512], dir[256];
    snprintf(p, sizeof p, "%s/pipe.gguf", tmp);
    CHECK(mkfifo(p, 0600) == 0);
    expect_child_refused(p, "a FIFO as the model", p, "FIFO");

    static const char *names[] = { "config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        hf_copy(dir, sizeof dir);
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
        CHECK(mkfifo(p, 0600) == 0);
        char what[96];
        snprintf(what, sizeof what, "a FIFO as %s", names[i]);
        expect_child_refused(dir, what, p, "FIFO");
    }
    /* chat_template.jinja is read when tokenizer_config.json has no template */
    hf_copy(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    json_error_t je;
    json_t *tc = json_load_file(p, 0, &je);
    CHECK(tc != NULL);
    json_object_del(tc, "chat_template");
    json_dump_file(tc, p, 0);
    json_decref(tc);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    CHECK(mkfifo(p, 0600) == 0);
    expect_child_refused(dir, "a FIFO as chat_template.jinja", p, "FIFO");
    /* a FIFO as an extra shard, and a directory named like one */
    hf_copy(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model-00002.safetensors", dir);
    CHECK(mkfifo(p, 0600) == 0);
    expect_child_refused(dir, "a FIFO as a second shard", p, "FIFO");
    hf_copy(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/extra.safetensors", dir);
    CHECK(mkdir(p, 0755) == 0);
    expect_child_refused(dir, "a directory named *.safetensors", p, "directory");
    /* a device as the model */
    expect_child_refused("/dev/zero", "a character device as the model", "/dev/zero", "device");
}

/* ---- Hugging Face config.json ------------------------------------------- */

/* A copy of qwen2-tiny whose config.json has field set to v (NULL: removed),
 * inside rope_parameters when sub. */
static void hf_with(char *dir, size_t n, const char *field, json_t *v, int sub)
{
    hf_copy(dir, n);
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    json_t *o = sub ? json_object_get(c, "rope_parameters") : c;
    if (v) json_object_set_new(o, field, v);
    else json_object_del(o, field);
    json_dump_file(c, p, 0);
    json_decref(c);
}

static void test_hf_config(void)
{
    char dir[256], err[512], cfg[512];
    hf_copy(dir, sizeof dir);
    CHECKF(load_in_child(dir, 30, err, sizeof err) == 0, "the copied directory must load: %s", err);

    static const struct { const char *field; const char *json; int sub; const char *needle; } bad[] = {
        { "hidden_size", "[64, 1]", 0, "array" },
        { "hidden_size", "\"64\"", 0, "string" },
        { "num_hidden_layers", "{\"n\": 2}", 0, "object" },
        { "num_attention_heads", "0", 0, "expected" },
        { "num_key_value_heads", "3", 0, "multiple" },
        { "intermediate_size", "-192", 0, "expected" },
        { "vocab_size", "5000", 0, "tokenizer" },
        { "vocab_size", "[4096]", 0, "array" },
        { "max_position_embeddings", "0", 0, "expected" },
        { "head_dim", "15", 0, "odd" },
        { "rms_norm_eps", "-1e-6", 0, "expected" },
        { "rms_norm_eps", "0", 0, "expected" },
        { "rms_norm_eps", "\"1e-6\"", 0, "string" },
        { "rope_theta", "0", 1, "expected" },
        { "rope_theta", "1e39", 1, "expected" },   /* inf as a float */
        { "bos_token_id", "4096", 0, "vocab_size" },
        { "eos_token_id", "[4072, 99999]", 0, "vocab_size" },
        { "eos_token_id", "-1", 0, "vocab_size" },
        { "tie_word_embeddings", "\"yes\"", 0, "true or false" },
        { "tie_word_embeddings", "false", 0, "lm_head.weight" },   /* (the shard has none) */
        { "hidden_act", "\"gelu\"", 0, "silu" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_error_t je;
        json_t *v = json_loads(bad[i].json, JSON_DECODE_ANY, &je);
        hf_with(dir, sizeof dir, bad[i].field, v, bad[i].sub);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        char what[128];
        snprintf(what, sizeof what, "config.json %s: %s", bad[i].field, bad[i].json);
        expect_child_refused(dir, what, bad[i].field, bad[i].needle);
        if (strcmp(bad[i].json, "5000") && strcmp(bad[i].json, "false"))   /* (those two: the directory's) */
            expect_child_refused(dir, what, cfg, NULL);
    }
    /* null counts as absent; lists of eos ids are fine */
    hf_with(dir, sizeof dir, "head_dim", json_null(), 0);
    CHECKF(load_in_child(dir, 30, err, sizeof err) == 0, "head_dim null must load: %s", err);
    hf_with(dir, sizeof dir, "eos_token_id", json_pack("[i, i]", 4072, 4070), 0);
    CHECKF(load_in_child(dir, 30, err, sizeof err) == 0, "a list of eos ids must load: %s", err);
}

/* The safetensors shard of a copy with v_proj.bias's data_offsets set to k_proj.bias's. */
/* GPT-2's config.json: another activation, a bad n_inner, heads that do
 * not divide n_embd: each refused naming the file and the field. */
static void test_hf_gpt2_config(void)
{
    static const struct { const char *field; const char *json; const char *n1, *n2; } bad[] = {
        { "activation_function", "\"relu\"", "activation_function", "gelu_new" },
        { "n_inner", "-3", "n_inner", NULL },
        { "n_head", "3", "n_embd 64 is not a multiple of n_head 3", NULL },
        { "layer_norm_epsilon", "\"x\"", "layer_norm_epsilon", NULL },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char dir[256], p[512], err[512];
        hf_copy_of(FIXTURE("hf/gpt2-tiny"), dir, sizeof dir);
        snprintf(p, sizeof p, "%s/config.json", dir);
        json_t *c = json_load_file(p, 0, NULL);
        CHECK(c != NULL);
        if (!c) continue;
        json_object_set_new(c, bad[i].field, json_loads(bad[i].json, JSON_DECODE_ANY, NULL));
        json_dump_file(c, p, 0);
        json_decref(c);
        model *m = NULL;
        int rc = model_load(&m, dir, err, sizeof err);
        model_free(m);
        CHECKF(rc == -1, "gpt2 config %s: loaded", bad[i].field);
        CHECKF(strstr(err, "config.json") && strstr(err, bad[i].n1) && (!bad[i].n2 || strstr(err, bad[i].n2)),
               "gpt2 config %s: %s", bad[i].field, err);
    }
    char dir[256], err[512];
    hf_copy_of(FIXTURE("hf/gpt2-tiny"), dir, sizeof dir);
    model *m = NULL;
    CHECKF(model_load(&m, dir, err, sizeof err) == 0, "%s", err);
    model_free(m);
}

static void test_hf_overlap(void)
{
    char dir[256], p[512];
    hf_copy(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    size_t n;
    uint8_t *b = read_all(p, &n);
    CHECK(b != NULL && n > 8);
    if (!b) return;
    uint64_t hl;
    memcpy(&hl, b, 8);
    json_error_t je;
    json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, &je);
    json_t *k = json_object_get(h, "model.layers.0.self_attn.k_proj.bias");
    json_t *v = json_object_get(h, "model.layers.0.self_attn.v_proj.bias");
    CHECK(k && v);
    if (k && v) json_object_set(v, "data_offsets", json_object_get(k, "data_offsets"));
    char *hs = json_dumps(h, JSON_COMPACT);
    size_t hn = strlen(hs);
    buf o = { 0 };
    uint64_t hn64 = hn;
    put(&o, &hn64, 8);
    put(&o, hs, hn);
    put(&o, b + 8 + hl, n - 8 - hl);
    write_file(p, o.p, o.n);
    free(o.p);
    free(hs);
    json_decref(h);
    free(b);
    expect_child_refused(dir, "overlapping safetensors tensors", p, "overlap");
}

/* ---- files changed under a loaded model --------------------------------- */

/* ---- mixture of experts ------------------------------------------------- */

/* Expert keys on a dense file: each refused naming the key and what was expected. */
static void test_moe_keys(void)
{
    gspec s;
    base_spec(&s);
    set_u32(&s, "llama.expert_count", 8);
    expect_refused(&s, "expert_count without expert_used_count", "llama.expert_used_count", "missing");
    static const uint32_t used[] = { 0, 9 };
    for (size_t i = 0; i < 2; i++) {
        base_spec(&s);
        set_u32(&s, "llama.expert_count", 8);
        set_u32(&s, "llama.expert_used_count", used[i]);
        expect_refused(&s, "expert_used_count 0 or above expert_count", "llama.expert_used_count",
                       "expected an integer in [1, 8]");
    }
    base_spec(&s);
    set_u32(&s, "llama.expert_count", 8);
    set_u32(&s, "llama.expert_used_count", 2);
    expect_refused(&s, "experts without a router", "missing tensor 'blk.0.ffn_gate_inp.weight'", "llama.expert_count");
    base_spec(&s);
    set_u32(&s, "llama.expert_count", 100000);
    expect_refused(&s, "expert_count 100000", "llama.expert_count", "expected an integer in [0, 512]");
    base_spec(&s);
    set_u32(&s, "llama.expert_used_count", 2);
    expect_refused(&s, "expert_used_count without expert_count", "llama.expert_used_count", "expert_count");
    base_spec(&s);
    set_u32(&s, "llama.expert_count", 8);
    set_u32(&s, "llama.expert_used_count", 2);
    set_u32(&s, "llama.expert_shared_count", 1);
    expect_refused(&s, "shared experts", "llama.expert_shared_count", "expected an integer in [0, 0]");
}

/* A copy of fixture `from` (under models/) with the bytes `find` replaced
 * by `repl` (same length) at their first place, plus `skip` bytes; path into p. */
static int patched(const char *from, const char *find, size_t skip, const void *repl, size_t n, char *p, size_t pn)
{
    static int seq;
    char src[256];
    snprintf(src, sizeof src, "tests/fixtures/models/%s", from);
    snprintf(p, pn, "%s/moe%d.gguf", tmp, seq++);
    size_t len;
    uint8_t *d = read_all(src, &len);
    uint8_t *at = d ? memmem(d, len, find, strlen(find)) : NULL;
    if (!at || (size_t)(at - d) + skip + n > len) { free(d); return -1; }
    memcpy(at + skip, repl, n);
    /* (a second "key"->"kye" rename: for the used count's key too) */
    uint8_t *k2 = !strcmp(find, "llama.expert_count") ? memmem(d, len, "llama.expert_used_count", 23) : NULL;
    if (k2) memcpy(k2 + 13, "uesd", 4);
    int rc = write_file(p, d, len);
    free(d);
    return rc;
}

static void test_moe_files(void)
{
    char p[256];
    /* expert_count contradicting the expert tensors (8 experts each) */
    uint32_t x16 = 16;
    CHECK(patched("qwen3moe-tiny.bf16.gguf", "qwen3moe.expert_count", 21 + 4, &x16, 4, p, sizeof p) == 0);
    expect_child_refused(p, "expert_count 16 for tensors of 8", "qwen3moe.expert_count is 16", "holds 8 experts");
    uint32_t u9 = 9, u0 = 0;
    CHECK(patched("qwen3moe-tiny.bf16.gguf", "qwen3moe.expert_used_count", 26 + 4, &u9, 4, p, sizeof p) == 0);
    expect_child_refused(p, "expert_used_count 9 of 8", "qwen3moe.expert_used_count", "[1, 8]");
    CHECK(patched("mixtral-tiny.bf16.gguf", "llama.expert_used_count", 23 + 4, &u0, 4, p, sizeof p) == 0);
    expect_child_refused(p, "expert_used_count 0", "llama.expert_used_count", "[1, 4]");
    /* a router renamed away */
    CHECK(patched("mixtral-tiny.bf16.gguf", "blk.1.ffn_gate_inp.weight", 0, "blk.1.ffn_gate_inq.weight", 25, p,
                  sizeof p) == 0);
    expect_child_refused(p, "no router in block 1", "missing tensor 'blk.1.ffn_gate_inp.weight'", "llama.expert_count");
    /* Mixtral's experts without its expert_count (and expert_used_count) keys */
    CHECK(patched("mixtral-tiny.bf16.gguf", "llama.expert_count", 0, "llama.expert_cuont", 18, p, sizeof p) == 0);
    expect_child_refused(p, "experts without expert_count", "ffn_gate_exps.weight", "llama.expert_count is absent");
    /* the untouched files load */
    char err[512];
    CHECKF(load_in_child("tests/fixtures/models/mixtral-tiny.bf16.gguf", 30, err, sizeof err) == 0, "%s", err);
    CHECKF(load_in_child("tests/fixtures/models/qwen3moe-tiny.bf16.gguf", 30, err, sizeof err) == 0, "%s", err);
}

/* A copy of the directory tests/fixtures/hf/<name> with config.json's field
 * set to the JSON v ("(absent)": removed; NULL: as it is). */
static void hf_copy_with(char *dir, size_t n, const char *name, const char *field, const char *v)
{
    static int seq;
    static const char *files[] = { "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" };
    snprintf(dir, n, "%s/hf-%s%d", tmp, name, seq++);
    mkdir(dir, 0755);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s/%s", FIXTURE("hf"), name, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (copy_file(a, b)) fprintf(stderr, "cannot copy %s\n", a);
    }
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    if (v && !strcmp(v, "(absent)")) json_object_del(c, field);
    else if (v) json_object_set_new(c, field, json_loads(v, JSON_DECODE_ANY, &je));
    json_dump_file(c, p, 0);
    json_decref(c);
}

/* A config.json field set to json, and what the refusal names (n1, n2). */
typedef struct hf_bad { const char *field, *json, *n1, *n2; } hf_bad;

/* The copy of tests/fixtures/hf/<name> loads; with each of bad[0..n) it is
 * refused, naming the directory and n1, n2. */
static void hf_refusals(const char *name, const hf_bad *bad, size_t n)
{
    char dir[256], err[512];
    hf_copy_with(dir, sizeof dir, name, "", NULL);
    CHECKF(load_in_child(dir, 30, err, sizeof err) == 0, "the copied directory must load: %s", err);
    for (size_t i = 0; i < n; i++) {
        hf_copy_with(dir, sizeof dir, name, bad[i].field, bad[i].json);
        char what[256];
        snprintf(what, sizeof what, "config.json %s: %s", bad[i].field, bad[i].json);
        expect_child_refused(dir, what, bad[i].n1, bad[i].n2);
        expect_child_refused(dir, what, dir, NULL);
    }
}

static void test_hf_moe(void)
{
    static const hf_bad bad[] = {
        { "num_experts_per_tok", "9", "num_experts_per_tok", "[1, 8]" },
        { "num_experts_per_tok", "0", "num_experts_per_tok", "[1, 8]" },
        { "num_local_experts", "16", "8 of its 16 experts", "num_experts" },
        { "num_local_experts", "4", "expert 4", "4 experts" },
        { "moe_intermediate_size", "64", "ffn_gate_exps.weight", "expected [64, 64, 8]" },
        { "mlp_only_layers", "[0]", "mlp_only_layers", "expected []" },
        { "norm_topk_prob", "1", "norm_topk_prob", "true or false" },
    };
    hf_refusals("qwen3moe-tiny", bad, sizeof bad / sizeof bad[0]);
}

/* gpt-oss: its own keys and tensors, each spoiled in a copy of the file */
static void test_gptoss_files(void)
{
    char p[256], err[512];
    const char *f = "gptoss-tiny.bf16.gguf";
    CHECK(patched(f, "gpt-oss.attention.sliding_window", 0, "gpt-oss.attention.sliding_wondow", 32, p, sizeof p) == 0);
    expect_child_refused(p, "no sliding_window", "gpt-oss.attention.sliding_window", "missing");
    uint32_t w0 = 0;
    CHECK(patched(f, "gpt-oss.attention.sliding_window", 32 + 4, &w0, 4, p, sizeof p) == 0);
    expect_child_refused(p, "sliding_window 0", "gpt-oss.attention.sliding_window", "[1, 16777216]");
    float half = 0.5f;
    CHECK(patched(f, "gpt-oss.rope.scaling.yarn_beta_fast", 35 + 4, &half, 4, p, sizeof p) == 0);
    expect_child_refused(p, "beta_fast below beta_slow", "yarn_beta_fast' is 0.5", "above yarn_beta_slow 1");
    CHECK(patched(f, "gpt-oss.rope.scaling.type", 25 + 4 + 8, "yarm", 4, p, sizeof p) == 0);
    expect_child_refused(p, "rope scaling yarm", "gpt-oss.rope.scaling.type' is 'yarm'", "expected none or yarn");
    CHECK(patched(f, "gpt-oss.rope.scaling.original_context_length", 0, "gpt-oss.rope.scaling.original_context_lenght",
                  44, p, sizeof p) == 0);
    expect_child_refused(p, "no original_context_length", "gpt-oss.rope.scaling.original_context_length", "missing");
    CHECK(patched(f, "blk.1.attn_sinks.weight", 0, "blk.1.attn_sinkz.weight", 23, p, sizeof p) == 0);
    expect_child_refused(p, "no sinks in block 1", "missing tensor 'blk.1.attn_sinks.weight'", NULL);
    CHECK(patched(f, "blk.0.attn_output.bias", 0, "blk.0.attn_output.bian", 22, p, sizeof p) == 0);
    expect_child_refused(p, "no output bias in block 0", "missing tensor 'blk.0.attn_output.bias'", NULL);
    CHECK(patched(f, "blk.0.ffn_up_exps.bias", 0, "blk.0.ffn_up_exps.bian", 22, p, sizeof p) == 0);
    CHECKF(load_in_child(p, 30, err, sizeof err) == 0, "expert biases are optional: %s", err);
    CHECK(patched(f, "gpt-oss.expert_count", 0, "gpt-oss.expert_cuont", 20, p, sizeof p) == 0);
    expect_child_refused(p, "no expert_count", "expert_count", NULL);
    CHECKF(load_in_child("tests/fixtures/models/gptoss-tiny.bf16.gguf", 30, err, sizeof err) == 0, "%s", err);
    /* yarn stays refused where the row does not take it */
    gspec s;
    gemma3_spec(&s, 2);
    set_str(&s, "gemma3.rope.scaling.type", "yarn");
    expect_refused(&s, "gemma3 yarn", "gemma3.rope.scaling.type", "(expected none or linear)");
}

static void test_hf_gptoss(void)
{
    static const hf_bad bad[] = {
        { "sliding_window", "(absent)", "sliding_window", "missing" },
        { "layer_types", "[\"full_attention\", \"sliding_attention\"]", "layer_types[0]", "sliding_attention" },
        { "layer_types", "[\"sliding_attention\"]", "layer_types", "num_hidden_layers 2" },
        { "swiglu_limit", "-1", "swiglu_limit", "(0, 1e+06]" },
        { "rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 32, \"rope_theta\": 150000, \"truncate\": 1}",
          "truncate", "true or false" },
        { "rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 32, \"beta_fast\": 1, \"beta_slow\": 2}",
          "beta_fast 1", "beta_slow 2" },
        { "rope_parameters", "{\"rope_type\": \"dynamic\", \"factor\": 2}", "rope type 'dynamic'", "yarn" },
        { "intermediate_size", "32", "gate_up_proj has shape [4, 64, 128]", "expected [4, 64, 64]" },
        { "num_local_experts", "8", "gate_up_proj has shape [4, 64, 128]", "expected [8, 64, 128]" },
    };
    hf_refusals("gptoss-tiny", bad, sizeof bad / sizeof bad[0]);
}

static int copy_stories(char *path, size_t n)
{
    static int seq;
    snprintf(path, n, "%s/stories%d.gguf", tmp, seq++);
    return copy_file(STORIES, path);
}

/* Truncates path in place, as cp's O_TRUNC does before it writes. */
static void truncate_in_place(const char *path)
{
    int fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
}

/* Same size, other bytes: every byte of the weights' part flipped. */
static void rewrite_same_size(const char *path)
{
    size_t n;
    uint8_t *b = read_all(path, &n);
    CHECK(b != NULL);
    if (!b) return;
    for (size_t i = n / 2; i < n; i++) b[i] ^= 0x5a;
    int fd = open(path, O_WRONLY);   /* in place: same inode, no truncation */
    CHECK(fd >= 0 && pwrite(fd, b, n, 0) == (ssize_t)n);
    if (fd >= 0) close(fd);
    free(b);
}

/* A read past the new end of a truncated model file: zero pages, the file
 * marked changed, the process alive (in a child: on failure it dies). */
static void test_sigbus_model(void)
{
    char path[256];
    CHECK(copy_stories(path, sizeof path) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char err[512], why[400];
        model *m = NULL;
        if (model_load(&m, path, err, sizeof err)) _exit(10);
        if (model_check(m, 0, why, sizeof why) != MODEL_SAME) _exit(11);
        truncate_in_place(path);
        float row[64];
        wt_row_f32(&m->tok_embd, m->tok_embd.n_out - 1, row);   /* past the end now: SIGBUS */
        for (int i = 0; i < 64 && i < m->tok_embd.n_in; i++)
            if (row[i] != 0) _exit(12);
        const layer_w *L = &m->layers[m->hp.n_layer - 1];
        volatile uint8_t x = ((const uint8_t *)L->w_down.data)[0];
        if (x != 0) _exit(13);
        if (model_check(m, 0, why, sizeof why) != MODEL_CHANGED || !strstr(why, path) || !strstr(why, "changed on disk"))
            _exit(14);
        model_free(m);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: %s %d", WIFSIGNALED(st) ? "killed by signal" : "exit",
           WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* A SIGBUS outside every model mapping still takes the default action. */
static void test_sigbus_foreign(void)
{
    char path[256], other[256];
    CHECK(copy_stories(path, sizeof path) == 0);
    snprintf(other, sizeof other, "%s/other.bin", tmp);
    char page[8192];
    memset(page, 1, sizeof page);
    CHECK(write_file(other, page, sizeof page) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char err[512];
        model *m = NULL;
        if (model_load(&m, path, err, sizeof err)) _exit(10);   /* installs the handler */
        int fd = open(other, O_RDWR);
        const volatile uint8_t *p = mmap(NULL, sizeof page, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED || ftruncate(fd, 0)) _exit(11);
        (void)p[4096];   /* SIGBUS: not ours */
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    /* (a sanitizer's handler, there before ours, reports it and exits) */
    CHECKF((WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) ||
           (SANITIZED && ((WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) ||
                          (WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) < 10))), "a foreign SIGBUS: child %s %d",
           WIFSIGNALED(st) ? "killed by signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* model_check: a rename over the path leaves the weights intact; a backend
 * copy of the weights (resident) makes a rewrite harmless too. */
static void test_model_check_kinds(void)
{
    char path[256], err[512], why[400], other[300];
    CHECK(copy_stories(path, sizeof path) == 0);
    model *m = NULL;
    CHECKF(model_load(&m, path, err, sizeof err) == 0, "%s", err);
    if (!m) return;
    CHECK(model_check(m, 0, why, sizeof why) == MODEL_SAME);
    snprintf(other, sizeof other, "%s.new", path);
    CHECK(copy_file(FIXTURE("models/qwen2-tiny.bf16.gguf"), other) == 0 && rename(other, path) == 0);
    CHECK(model_check(m, 0, why, sizeof why) == MODEL_DETACHED);
    CHECKF(strstr(why, "replaced") != NULL, "%s", why);
    model_free(m);

    CHECK(copy_stories(path, sizeof path) == 0);
    CHECKF(model_load(&m, path, err, sizeof err) == 0, "%s", err);
    if (!m) return;
    usleep(50000);   /* past the file system's timestamp granularity */
    rewrite_same_size(path);
    CHECK(model_check(m, 0, why, sizeof why) == MODEL_CHANGED);
    m->resident = 1;
    CHECK(model_check(m, 0, why, sizeof why) == MODEL_DETACHED);
    model_free(m);
}

typedef struct logcap { char line[8][512]; int n; int warn[8]; } logcap;

static void cap_log(void *arg, int warn, const char *line)
{
    logcap *c = arg;
    if (c->n < 8) {
        snprintf(c->line[c->n], sizeof c->line[0], "%s", line);
        c->warn[c->n] = warn;
    }
    c->n++;
}

static eng *open_on(const char *path, logcap *lc)
{
    char err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = path;
    o.n_threads = 2;
    o.max_seqs = 8;
    o.log = cap_log;
    o.log_arg = lc;
    if (eng_open(&e, &o, err, sizeof err)) fprintf(stderr, "eng_open: %s\n", err);
    return e;
}

typedef struct jr { int done, error, n_tok; eng_err code; char msg[160]; } jr;

/* Runs events into r[user] until every one of n jobs ended (or timeout). */
static void drain(eng *e, jr *r, int n, int first_token_only)
{
    for (int spins = 0; spins < 40000; spins++) {
        int ended = 0, started = 0;
        for (int i = 0; i < n; i++) { ended += r[i].done || r[i].error; started += r[i].n_tok > 0; }
        if (ended == n || (first_token_only && started > 0)) return;
        eng_event *ev = eng_events_take(e);
        if (!ev) { usleep(500); continue; }
        while (ev) {
            eng_event *nx = ev->next;
            jr *x = &r[(intptr_t)ev->user];
            if (ev->type == ENG_EV_TOKEN) x->n_tok++;
            else if (ev->type == ENG_EV_DONE) x->done = 1;
            else if (ev->type == ENG_EV_ERROR) {
                x->error = 1;
                x->code = ev->code;
                snprintf(x->msg, sizeof x->msg, "%s", ev->message);
            }
            eng_event_free(ev);
            ev = nx;
        }
    }
}

static int submit_gen(eng *e, int max_tokens, float temp, uint64_t seed, intptr_t user, eng_err *code, char *err,
                      size_t errlen)
{
    static const int32_t bos = 1;
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_GENERATE;
    d.tokens = &bos;
    d.n_tokens = 1;
    d.max_tokens = max_tokens;
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = temp;
    d.sampling.seed = seed;
    d.user = (void *)user;
    uint64_t id;
    return eng_submit(e, &d, &id, code, err, errlen);
}

/* Rewritten in place, same size: the next request is refused with
 * ENG_EMODEL_CHANGED naming the file, logged once; tokenize goes on. */
static void test_engine_rewrite(void)
{
    char path[256], err[512];
    CHECK(copy_stories(path, sizeof path) == 0);
    logcap lc = { 0 };
    eng *e = open_on(path, &lc);
    CHECK(e != NULL);
    if (!e) return;
    jr r[1] = { 0 };
    eng_err code = ENG_OK;
    CHECK(submit_gen(e, 8, 0, 0, 0, &code, err, sizeof err) == 0);
    drain(e, r, 1, 0);
    CHECK(r[0].done && r[0].n_tok == 8);
    usleep(50000);
    rewrite_same_size(path);
    CHECK(submit_gen(e, 8, 0, 0, 0, &code, err, sizeof err) == -1);
    CHECK_EQ_INT(code, ENG_EMODEL_CHANGED);
    CHECKF(strstr(err, path) && strstr(err, "changed on disk"), "%s", err);
    CHECK(submit_gen(e, 8, 0, 0, 0, &code, err, sizeof err) == -1 && code == ENG_EMODEL_CHANGED);
    CHECK_EQ_INT(lc.n, 1);
    CHECKF(lc.n >= 1 && !lc.warn[0] && strstr(lc.line[0], path) && strstr(lc.line[0], "restart aned"), "log: %s",
           lc.line[0]);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(eng_tokenize(e, "Once upon a time", 16, 1, 0, &ids, &n, &code, err, sizeof err) == 0 && n > 2);
    free(ids);
    eng_close(e);
}

/* Truncated while jobs generate: the pass that reads past the end finds
 * zero pages, every running job ends with ENG_EMODEL_CHANGED, nothing dies. */
static void test_engine_truncate_midway(void)
{
    char path[256], err[512];
    CHECK(copy_stories(path, sizeof path) == 0);
    logcap lc = { 0 };
    eng *e = open_on(path, &lc);
    CHECK(e != NULL);
    if (!e) return;
    enum { N = 8 };
    jr r[N];
    memset(r, 0, sizeof r);
    eng_err code;
    for (int i = 0; i < N; i++) CHECK(submit_gen(e, 1500, 1.0f, (uint64_t)i + 1, i, &code, err, sizeof err) == 0);
    drain(e, r, N, 1);
    truncate_in_place(path);
    drain(e, r, N, 0);
    int ended = 0, changed = 0;
    for (int i = 0; i < N; i++) {
        ended += r[i].done || r[i].error;
        changed += r[i].error && r[i].code == ENG_EMODEL_CHANGED;
        if (r[i].error) CHECKF(r[i].code == ENG_EMODEL_CHANGED && strstr(r[i].msg, path), "job %d: %d %s", i,
                               r[i].code, r[i].msg);
    }
    CHECK_EQ_INT(ended, N);
    fprintf(stderr, "  %d of %d jobs ended with model_changed; log: %s\n", changed, N, lc.line[0]);
    CHECKF(changed > 0, "no job ended with model_changed (%d ended)", ended);
    CHECK(submit_gen(e, 8, 0, 0, 0, &code, err, sizeof err) == -1 && code == ENG_EMODEL_CHANGED);
    CHECK_EQ_INT(lc.n, 1);
    eng_close(e);
}

/* Renamed over: the weights in use are intact and go on serving; a warning. */
static void test_engine_replaced(void)
{
    char path[256], other[300], err[512];
    CHECK(copy_stories(path, sizeof path) == 0);
    logcap lc = { 0 };
    eng *e = open_on(path, &lc);
    CHECK(e != NULL);
    if (!e) return;
    snprintf(other, sizeof other, "%s.new", path);
    CHECK(copy_file(FIXTURE("models/qwen2-tiny.bf16.gguf"), other) == 0 && rename(other, path) == 0);
    jr r[1] = { 0 };
    eng_err code = ENG_OK;
    CHECK(submit_gen(e, 8, 0, 0, 0, &code, err, sizeof err) == 0);
    drain(e, r, 1, 0);
    CHECK(r[0].done && r[0].n_tok == 8);
    CHECK_EQ_INT(lc.n, 1);
    CHECKF(lc.n >= 1 && lc.warn[0] && strstr(lc.line[0], "replaced"), "log: %s", lc.line[0]);
    eng_close(e);
}

/* Takes the events there are into r[user] (ENG_EV_TOKENS ends a tokenize
 * request); 0 when there were none. */
static int take_into(eng *e, jr *r)
{
    eng_event *ev = eng_events_take(e);
    if (!ev) return 0;
    while (ev) {
        eng_event *nx = ev->next;
        jr *x = &r[(intptr_t)ev->user];
        if (ev->type == ENG_EV_TOKEN) x->n_tok++;
        else if (ev->type == ENG_EV_DONE) x->done = 1;
        else if (ev->type == ENG_EV_TOKENS) { x->done = 1; x->n_tok = (int)ev->n_ids; }
        else if (ev->type == ENG_EV_ERROR) {
            x->error = 1;
            x->code = ev->code;
            snprintf(x->msg, sizeof x->msg, "%s", ev->message);
        }
        eng_event_free(ev);
        ev = nx;
    }
    return 1;
}

/* take_into until jobs want[0..nw) ended (60 s at most). */
static void drain_until(eng *e, jr *r, const int *want, int nw)
{
    for (int spins = 0; spins < 120000; spins++) {
        int ended = 0;
        for (int i = 0; i < nw; i++) ended += r[want[i]].done || r[want[i]].error;
        if (ended == nw) return;
        if (!take_into(e, r)) usleep(500);
    }
}

static int submit_text(eng *e, const char *text, size_t len, intptr_t user, uint64_t *id)
{
    char err[512];
    eng_err code;
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_GENERATE;
    d.text = text;
    d.text_len = len;
    d.raw = 1;
    d.max_tokens = 8;
    eng_sampling_default(&d.sampling);
    d.user = (void *)user;
    int rc = eng_submit(e, &d, id, &code, err, sizeof err);
    if (rc) fprintf(stderr, "submit: %s\n", err);
    return rc;
}

/* Rewritten while no pass runs: the submit that finds it wakes the worker,
 * which ends at once every job not running: a paused job whose pages were
 * taken back (evicted), a paused one holding its pages, a prompt in the
 * tokenizer's hands and one waiting for it (both megabytes: tokenized,
 * they would fail with ENG_ECTX instead); a tokenize request behind them is
 * answered. One sequence slot and one context's pages. */
static void test_engine_parked_pending(void)
{
    char path[256], err[512];
    CHECK(copy_stories(path, sizeof path) == 0);
    logcap lc = { 0 };
    char eo_err[512];
    eng *e = NULL;
    eng_opts o = { 0 };
    o.model_path = path;
    o.n_threads = 2;
    o.max_seqs = 1;
    o.log = cap_log;
    o.log_arg = &lc;
    CHECKF(eng_open(&e, &o, eo_err, sizeof eo_err) == 0, "%s", eo_err);
    if (!e) return;
    enum { A, B, P, C0, C1, T, N };
    jr r[N];
    memset(r, 0, sizeof r);
    eng_err code;
    static const int32_t bos = 1;
    int n_ctx = eng_model(e)->n_ctx;
    eng_job_desc d = { 0 };
    d.kind = ENG_JOB_GENERATE;
    d.tokens = &bos;
    d.n_tokens = 1;
    d.max_tokens = n_ctx - 2;        /* all of the pool's pages */
    eng_sampling_default(&d.sampling);
    d.sampling.temperature = 0;
    uint64_t id_a = 0, id_p = 0, id;
    /* A pauses part-way (again when a descheduled thread let it finish) */
    for (int attempt = 0; attempt < 5; attempt++) {
        memset(&r[A], 0, sizeof r[A]);
        d.user = (void *)(intptr_t)A;
        CHECK(eng_submit(e, &d, &id_a, &code, err, sizeof err) == 0);
        for (int spins = 0; spins < 40000 && !r[A].n_tok && !r[A].done && !r[A].error; spins++)
            if (!take_into(e, r)) usleep(500);
        eng_pause(e, id_a, 1);
        usleep(100000);
        take_into(e, r);
        if (!r[A].done && !r[A].error) break;
    }
    CHECKF(!r[A].done && !r[A].error, "A ended before it was paused");
    eng_stats st0, st;
    eng_stats_get(e, &st0);
    /* B's prompt needs every page, the one paused A holds too: A is evicted
     * (and stays paused) */
    int n_b = n_ctx - 12;
    int32_t *b_prompt = malloc((size_t)n_b * sizeof *b_prompt);
    CHECK(b_prompt != NULL);
    if (!b_prompt) { eng_close(e); return; }
    b_prompt[0] = bos;
    for (int i = 1; i < n_b; i++) b_prompt[i] = 3 + (i * 37) % 500;
    d.tokens = b_prompt;
    d.n_tokens = (size_t)n_b;
    d.max_tokens = 8;
    d.user = (void *)(intptr_t)B;
    CHECK(eng_submit(e, &d, &id, &code, err, sizeof err) == 0);
    free(b_prompt);
    d.tokens = &bos;
    d.n_tokens = 1;
    int wb[1] = { B };
    drain_until(e, r, wb, 1);
    CHECK(r[B].done && r[B].n_tok == 8);
    eng_stats_get(e, &st);
    CHECKF(st.evictions > st0.evictions, "A was not evicted (%llu)", (unsigned long long)st.evictions);
    /* P pauses holding its pages */
    d.max_tokens = n_ctx - 2;
    d.user = (void *)(intptr_t)P;
    CHECK(eng_submit(e, &d, &id_p, &code, err, sizeof err) == 0);
    eng_pause(e, id_p, 1);
    /* large prompts for the tokenizer (8 MB: 0.2 s or more), a tokenize
     * request behind them; the file rewritten at once (loaded long enough
     * ago for its mtime to change) */
    size_t big = (size_t)8 << 20;
    char *spaces = malloc(big);
    CHECK(spaces != NULL);
    if (!spaces) { eng_close(e); return; }
    memset(spaces, ' ', big);
    CHECK(submit_text(e, spaces, big, C0, &id) == 0);
    usleep(2000);   /* (the tokenizer takes it) */
    CHECK(submit_text(e, spaces, big / 2, C1, &id) == 0);
    CHECK(eng_tokenize_submit(e, "Once upon a time", 16, 1, 0, 0, (void *)(intptr_t)T, &id, &code, err,
                              sizeof err) == 0);
    rewrite_same_size(path);
    CHECK(submit_gen(e, 8, 0, 0, 0, &code, err, sizeof err) == -1 && code == ENG_EMODEL_CHANGED);
    int want[] = { A, P, C0, C1, T };
    drain_until(e, r, want, 5);
    static const char *const names[N] = { "A (evicted, paused)", "B", "P (paused)", "C0 (tokenizing)",
                                          "C1 (waiting for the tokenizer)", "T" };
    for (int i = 0; i < N; i++) {
        if (i == B || i == T) continue;
        CHECKF(r[i].error && r[i].code == ENG_EMODEL_CHANGED && strstr(r[i].msg, path), "%s: done %d error %d "
               "code %d '%s'", names[i], r[i].done, r[i].error, r[i].code, r[i].msg);
    }
    CHECKF(r[T].done && !r[T].error && r[T].n_tok > 2, "tokenize: done %d error %d (%s) ids %d", r[T].done,
           r[T].error, r[T].msg, r[T].n_tok);
    eng_pause(e, id_a, 0);   /* (ended: ignored) */
    eng_stats_get(e, &st);
    CHECK_EQ_INT(st.active + st.queued, 0);
    CHECK_EQ_INT(st.kv_used, 0);
    CHECK_EQ_INT(lc.n, 1);
    free(spaces);
    eng_close(e);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    snprintf(tmp, sizeof tmp, "/tmp/t_load.XXXXXX");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    vocab_init();
    RUN(test_base_loads);
    RUN(test_duplicate_keys);
    RUN(test_overlapping_tensors);
    RUN(test_bad_numbers);
    RUN(test_token_ids);
    RUN(test_unsupported);
    RUN(test_gemma3_keys);
    RUN(test_vocab_size);
    RUN(test_shapes_and_counts);
    RUN(test_fifos);
    RUN(test_hf_config);
    RUN(test_hf_gpt2_config);
    RUN(test_hf_overlap);
    RUN(test_moe_keys);
    RUN(test_moe_files);
    RUN(test_hf_moe);
    RUN(test_gptoss_files);
    RUN(test_hf_gptoss);
    RUN(test_sigbus_model);
    RUN(test_sigbus_foreign);
    RUN(test_model_check_kinds);
    RUN(test_engine_rewrite);
    RUN(test_engine_truncate_midway);
    RUN(test_engine_replaced);
    RUN(test_engine_parked_pending);
    rm_rf(tmp);
    return CHECK_DONE();
}
