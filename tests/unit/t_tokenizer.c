/* t_tokenizer.c — tokenizers against vectors made by llama.cpp / Hugging Face:
 * llama.cpp's test-tokenizer-0 vectors (gpt-2, llama-spm, qwen2, llama-bpe),
 * llama2.c's SentencePiece vectors, the tiny models' reference prompts, and
 * tokenizer.json vs GGUF agreement. */
#include "tests/check.h"
#include "engine/load/gguf.h"
#include "engine/text/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TOKDIR "tests/fixtures/tokenizers/llama.cpp/"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[sz] = 0; if (n) *n = (size_t)sz; }
    return b;
}

typedef struct vecs {
    char *inp, *out;
    char *str[64]; size_t len[64];
    int32_t *ids[64]; size_t nids[64];
    int n;
} vecs;

static int vecs_load(vecs *v, const char *base)
{
    char p[256];
    memset(v, 0, sizeof *v);
    snprintf(p, sizeof p, "%s.inp", base);
    v->inp = slurp(p, NULL);
    snprintf(p, sizeof p, "%s.out", base);
    v->out = slurp(p, NULL);
    if (!v->inp || !v->out) return -1;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *s = v->inp, *e;
    while ((e = strstr(s, sep)) && v->n < 64) {
        v->str[v->n] = s;
        v->len[v->n] = (size_t)(e - s);
        *e = 0;
        v->n++;
        s = e + strlen(sep);
    }
    char *line = v->out;
    for (int i = 0; i < v->n; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        v->ids[i] = malloc(sizeof(int32_t) * (strlen(line) / 2 + 1));
        char *q = line, *r;
        for (;;) {
            long x = strtol(q, &r, 10);
            if (r == q) break;
            v->ids[i][v->nids[i]++] = (int32_t)x;
            q = r;
        }
        line = nl ? nl + 1 : line + strlen(line);
    }
    return 0;
}

static void vecs_free(vecs *v)
{
    for (int i = 0; i < v->n; i++) free(v->ids[i]);
    free(v->inp);
    free(v->out);
}

static tok *load_gguf_tok(const char *path)
{
    char err[256];
    gguf *g = NULL;
    tok *t = NULL;
    if (gguf_open(&g, path, err, sizeof err)) { fprintf(stderr, "%s\n", err); return NULL; }
    if (tok_load_gguf(&t, g, err, sizeof err)) fprintf(stderr, "%s: %s\n", path, err);
    gguf_close(g);
    return t;
}

static int ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(int32_t)) == 0);
}

static void print_ids(const char *what, const int32_t *a, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "\n");
}

static char *nfc(const char *s, size_t n, size_t *on)
{
    utf8proc_uint8_t *o = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &o,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) { free(o); return NULL; }
    *on = (size_t)r;
    return (char *)o;
}

/* Every vector string gives exactly the expected ids, and decodes back. */
static int run_vectors(const tok *t, const char *base, int is_nfc)
{
    vecs v;
    int ok = 0;
    CHECKF(vecs_load(&v, base) == 0, "%s", base);
    CHECKF(v.n >= 40, "%s: %d strings", base, v.n);
    for (int i = 0; i < v.n; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        char err[200] = "";
        int rc = tok_encode(t, v.str[i], v.len[i], 0, &ids, &n, err, sizeof err);
        int same = rc == 0 && ids_eq(ids, n, v.ids[i], v.nids[i]);
        CHECKF(same, "%s: string %d '%.40s' (%s)", base, i, v.str[i], err);
        if (!same) { print_ids("got", ids, n); print_ids("want", v.ids[i], v.nids[i]); }
        ok += same;
        char *txt = NULL;
        size_t tl = 0;
        if (rc == 0) {
            CHECK(tok_decode(t, ids, n, &txt, &tl) == 0);
            size_t el = v.len[i];
            char *want = is_nfc ? nfc(v.str[i], v.len[i], &el) : NULL;
            const char *w = want ? want : v.str[i];
            CHECKF(txt && tl == el && memcmp(txt, w, el) == 0, "%s: decode of string %d '%.40s' gave '%.40s'",
                   base, i, v.str[i], txt ? txt : "(null)");
            free(want);
        }
        free(txt);
        free(ids);
    }
    fprintf(stderr, "  %s: %d/%d vectors\n", base, ok, v.n);
    vecs_free(&v);
    return ok;
}

static void test_spm_vectors(void)
{
    tok *t = load_gguf_tok(TOKDIR "ggml-vocab-llama-spm.gguf");
    CHECK(t != NULL);
    if (!t) return;
    CHECK_EQ_INT(tok_n_vocab(t), 32000);
    CHECK_EQ_INT(tok_bos(t), 1);
    CHECK_EQ_INT(tok_eos(t), 2);
    CHECK(tok_add_bos(t) == 1);
    CHECK(strcmp(tok_kind_name(t), "spm") == 0);
    run_vectors(t, TOKDIR "ggml-vocab-llama-spm.gguf", 0);
    tok_free(t);
}

static void test_gpt2_vectors(void)
{
    tok *t = load_gguf_tok(TOKDIR "ggml-vocab-gpt-2.gguf");
    CHECK(t != NULL);
    if (!t) return;
    CHECK(strcmp(tok_pre_name(t), "gpt-2") == 0);
    CHECK(tok_add_bos(t) == 0);
    run_vectors(t, TOKDIR "ggml-vocab-gpt-2.gguf", 0);
    CHECK(tok_is_eog(t, 50256));
    tok_free(t);
}

static void test_qwen2_vectors(void)
{
    tok *t = load_gguf_tok("bin/fixtures/vocab-qwen2.gguf");
    CHECK(t != NULL);
    if (!t) return;
    CHECK(strcmp(tok_pre_name(t), "qwen2") == 0);
    CHECK(tok_add_bos(t) == 0);
    run_vectors(t, TOKDIR "ggml-vocab-qwen2.gguf", 1);
    CHECK_EQ_INT(tok_eot(t), 151645);
    CHECK(tok_is_eog(t, 151645));
    CHECK(tok_is_eog(t, 151643));
    CHECK(!tok_is_eog(t, 151644));
    CHECK(tok_is_control(t, 151644));
    CHECK(!tok_is_control(t, 9707));
    tok_free(t);
}

static void test_llama3_vectors(void)
{
    tok *t = load_gguf_tok("bin/fixtures/vocab-llama3.gguf");
    CHECK(t != NULL);
    if (!t) return;
    CHECK(strcmp(tok_pre_name(t), "llama-bpe") == 0);
    CHECK(tok_add_bos(t) == 1);
    CHECK_EQ_INT(tok_bos(t), 128000);
    run_vectors(t, TOKDIR "ggml-vocab-llama-bpe.gguf", 0);
    CHECK_EQ_INT(tok_eot(t), 128009);
    CHECK(tok_is_eog(t, 128009));
    CHECK(tok_is_eog(t, 128001));
    CHECK(!tok_is_eog(t, 128000));
    tok_free(t);
}

/* llama2.c's SentencePiece vectors (BOS prepended there). */
static void test_llama2_vectors(void)
{
    tok *t = load_gguf_tok(TOKDIR "ggml-vocab-llama-spm.gguf");
    json_error_t je;
    json_t *root = json_load_file("tests/fixtures/tokenizers/llama2_tokenizer_vectors.json", 0, &je);
    CHECK(t && root);
    if (!t || !root) { tok_free(t); json_decref(root); return; }
    json_t *cases = json_object_get(root, "cases");
    size_t i;
    json_t *c;
    int nc = 0;
    json_array_foreach(cases, i, c) {
        const char *s = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int32_t *ids = NULL;
        size_t n = 0;
        char err[200];
        CHECK(tok_encode(t, s, strlen(s), 0, &ids, &n, err, sizeof err) == 0);
        size_t off = tok_add_bos(t) ? 1 : 0;
        int same = json_array_size(want) == n + off;
        if (off && json_array_size(want) > 0) same = same && json_integer_value(json_array_get(want, 0)) == tok_bos(t);
        for (size_t k = 0; same && k < n; k++) same = json_integer_value(json_array_get(want, k + off)) == ids[k];
        CHECKF(same, "llama2 vector %zu '%.40s'", i, s);
        char *txt = NULL;
        size_t tl;
        CHECK(tok_decode(t, ids, n, &txt, &tl) == 0 && tl == strlen(s) && memcmp(txt, s, tl) == 0);
        free(txt);
        free(ids);
        nc++;
    }
    CHECK_EQ_INT(nc, 5);
    json_decref(root);
    tok_free(t);
}

static void check_ref_cases(const tok *t, const char *ref, int *bos_first)
{
    json_error_t je;
    json_t *root = json_load_file(ref, 0, &je);
    CHECKF(root != NULL, "%s", ref);
    if (!root) return;
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t i;
    int ntext = 0;
    json_array_foreach(cases, i, c) {
        json_t *jt = json_object_get(c, "text");
        if (!json_is_string(jt)) continue;
        ntext++;
        const char *s = json_string_value(jt);
        json_t *want = json_object_get(c, "tokens");
        int32_t *ids = NULL;
        size_t n = 0;
        char err[200];
        CHECK(tok_encode(t, s, strlen(s), 1, &ids, &n, err, sizeof err) == 0);
        /* a leading BOS in the reference is what tok_add_bos promises */
        size_t off = 0;
        if (json_array_size(want) == n + 1 && json_integer_value(json_array_get(want, 0)) == tok_bos(t)) {
            off = 1;
            CHECK(tok_add_bos(t));
        }
        if (bos_first) *bos_first = (int)off;
        int same = json_array_size(want) == n + off;
        for (size_t k = 0; same && k < n; k++) same = json_integer_value(json_array_get(want, k + off)) == ids[k];
        CHECKF(same, "%s case %zu '%.50s'", ref, i, s);
        if (!same) print_ids("got", ids, n);
        free(ids);
    }
    CHECKF(ntext >= 3, "%s: %d text cases", ref, ntext);
    json_decref(root);
}

static void test_tiny_refs(void)
{
    static const char *models[][2] = {
        { "tests/fixtures/models/qwen2-tiny.bf16.gguf", "tests/fixtures/refs/qwen2-tiny.dev.json" },
        { "tests/fixtures/models/qwen3-tiny.bf16.gguf", "tests/fixtures/refs/qwen3-tiny.dev.json" },
        { "tests/fixtures/models/llama3-tiny.bf16.gguf", "tests/fixtures/refs/llama3-tiny.dev.json" },
        { "tests/fixtures/models/qwen35-tiny.bf16.gguf", "tests/fixtures/refs/qwen35-tiny.dev.json" },
        { "tests/fixtures/models/llama-q.bf16.gguf", "tests/fixtures/refs/llama-q.dev.json" },
    };
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        tok *t = load_gguf_tok(models[m][0]);
        CHECKF(t != NULL, "%s", models[m][0]);
        if (!t) continue;
        check_ref_cases(t, models[m][1], NULL);
        tok_free(t);
    }
    /* the same cases through the Hugging Face files of qwen2-tiny */
    char err[256];
    tok *h = NULL;
    CHECKF(tok_load_hf(&h, "tests/fixtures/hf/qwen2-tiny/tokenizer.json",
                       "tests/fixtures/hf/qwen2-tiny/tokenizer_config.json", err, sizeof err) == 0, "%s", err);
    if (h) check_ref_cases(h, "tests/fixtures/refs/qwen2-tiny.dev.json", NULL);
    tok_free(h);
}

/* The same strings through tokenizer.json and the matching GGUF. */
static void compare_on_vectors(const tok *a, const tok *b, const char *base, int parse_special)
{
    vecs v;
    if (vecs_load(&v, base)) { CHECKF(0, "%s", base); return; }
    int diff = 0;
    for (int i = 0; i < v.n; i++) {
        int32_t *x = NULL, *y = NULL;
        size_t nx = 0, ny = 0;
        char err[200];
        int ra = tok_encode(a, v.str[i], v.len[i], parse_special, &x, &nx, err, sizeof err);
        int rb = tok_encode(b, v.str[i], v.len[i], parse_special, &y, &ny, err, sizeof err);
        if (ra || rb || !ids_eq(x, nx, y, ny)) {
            diff++;
            fprintf(stderr, "  differs on %s string %d '%.40s'\n", base, i, v.str[i]);
        }
        free(x);
        free(y);
    }
    CHECKF(diff == 0, "%s: %d strings differ", base, diff);
    vecs_free(&v);
}

static void test_hf_vs_gguf(void)
{
    char err[256];
    tok *hq = NULL, *hl = NULL, *ht = NULL;
    CHECKF(tok_load_hf(&hq, "bin/fixtures/hf/qwen3-tokenizer.json",
                       "tests/fixtures/tokenizers/hf/qwen3-tokenizer_config.json", err, sizeof err) == 0, "%s", err);
    CHECKF(tok_load_hf(&hl, "bin/fixtures/hf/llama3-tokenizer.json",
                       "tests/fixtures/tokenizers/hf/llama3-tokenizer_config.json", err, sizeof err) == 0, "%s", err);
    CHECKF(tok_load_hf(&ht, "tests/fixtures/hf/qwen2-tiny/tokenizer.json",
                       "tests/fixtures/hf/qwen2-tiny/tokenizer_config.json", err, sizeof err) == 0, "%s", err);
    tok *gq = load_gguf_tok("bin/fixtures/vocab-qwen2.gguf");
    tok *gl = load_gguf_tok("bin/fixtures/vocab-llama3.gguf");
    tok *gt = load_gguf_tok("tests/fixtures/models/qwen2-tiny.bf16.gguf");
    if (hq) {
        /* the official files give llama.cpp's expected ids directly */
        run_vectors(hq, TOKDIR "ggml-vocab-qwen2.gguf", 1);
        CHECK(tok_add_bos(hq) == 0);
        CHECK_EQ_INT(tok_eos(hq), 151645);
        CHECK_EQ_INT(tok_eot(hq), 151645);
        CHECK(tok_is_eog(hq, 151643));
        CHECK(strstr(tok_chat_template(hq), "<|im_start|>") != NULL);
        CHECK(strcmp(tok_pre_name(hq), "qwen2") == 0);
    }
    if (hl) {
        run_vectors(hl, TOKDIR "ggml-vocab-llama-bpe.gguf", 0);
        CHECK(tok_add_bos(hl) == 1);
        CHECK_EQ_INT(tok_bos(hl), 128000);
        CHECK_EQ_INT(tok_eos(hl), 128009);
        CHECK(strstr(tok_chat_template(hl), "<|start_header_id|>") != NULL);
        CHECK(strcmp(tok_pre_name(hl), "llama-bpe") == 0);
    }
    static const char *bases[] = { TOKDIR "ggml-vocab-qwen2.gguf", TOKDIR "ggml-vocab-llama-bpe.gguf",
                                   TOKDIR "ggml-vocab-gpt-2.gguf", TOKDIR "ggml-vocab-llama-spm.gguf" };
    for (size_t i = 0; i < 4; i++) {
        if (hq && gq) compare_on_vectors(hq, gq, bases[i], 1);
        if (hl && gl) compare_on_vectors(hl, gl, bases[i], 1);
        if (ht && gt) compare_on_vectors(ht, gt, bases[i], 1);
    }
    if (ht && gt) {
        CHECK_EQ_INT(tok_eos(ht), tok_eos(gt));
        CHECK_EQ_INT(tok_eot(ht), tok_eot(gt));
        CHECK_EQ_INT(tok_add_bos(ht), tok_add_bos(gt));
        const char *s = "<|im_start|>user\n<think>caf\xC3\xA9 \xE2\x80\x94 \xE6\x97\xA5\xE6\x9C\xAC 12345!!</think><|im_end|>";
        for (int ps = 0; ps < 2; ps++) {
            int32_t *x = NULL, *y = NULL;
            size_t nx, ny;
            CHECK(tok_encode(ht, s, strlen(s), ps, &x, &nx, err, sizeof err) == 0);
            CHECK(tok_encode(gt, s, strlen(s), ps, &y, &ny, err, sizeof err) == 0);
            CHECK(ids_eq(x, nx, y, ny));
            free(x);
            free(y);
        }
    }
    tok_free(hq); tok_free(hl); tok_free(ht);
    tok_free(gq); tok_free(gl); tok_free(gt);
}

static void test_invalid_utf8(void)
{
    static const char *bad[] = { "\xff", "abc\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\x80z",
                                 "\xe2\x82", "ok \xf0\x9f\x98" };
    tok *ts[2] = { load_gguf_tok(TOKDIR "ggml-vocab-llama-spm.gguf"), load_gguf_tok("bin/fixtures/vocab-qwen2.gguf") };
    for (int k = 0; k < 2; k++) {
        CHECK(ts[k] != NULL);
        if (!ts[k]) continue;
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            int32_t *ids = (int32_t *)1;
            size_t n = 7;
            char err[200] = "";
            CHECK(tok_encode(ts[k], bad[i], strlen(bad[i]), 1, &ids, &n, err, sizeof err) == -1);
            CHECK(ids == NULL && n == 0);
            CHECK(strstr(err, "UTF-8") != NULL);
        }
        /* valid 4-byte text and an empty string are fine */
        int32_t *ids = NULL;
        size_t n = 9;
        char err[200];
        CHECK(tok_encode(ts[k], "\xf0\x9f\x98\x80", 4, 1, &ids, &n, err, sizeof err) == 0 && n > 0);
        free(ids);
        ids = NULL;
        CHECK(tok_encode(ts[k], "", 0, 1, &ids, &n, err, sizeof err) == 0 && n == 0);
        free(ids);
        CHECK(tok_encode(ts[k], NULL, 0, 1, &ids, &n, err, sizeof err) == 0 && n == 0);
        free(ids);
        CHECK(tok_encode_segs(ts[k], NULL, 0, &ids, &n, err, sizeof err) == 0 && n == 0);
        free(ids);
        CHECK(tok_encode(ts[k], NULL, 3, 1, &ids, &n, err, sizeof err) == -1);
        /* embedded NUL is text */
        CHECK(tok_encode(ts[k], "a\0b", 3, 0, &ids, &n, err, sizeof err) == 0 && n >= 2);
        char *txt = NULL;
        size_t tl = 0;
        CHECK(tok_decode(ts[k], ids, n, &txt, &tl) == 0 && tl == 3 && memcmp(txt, "a\0b", 3) == 0);
        free(txt);
        free(ids);
        int32_t badid = 1 << 30;
        CHECK(tok_decode(ts[k], &badid, 1, &txt, &tl) == -1);
        tok_free(ts[k]);
    }
}

static int contains(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++) if (ids[i] == id) return 1;
    return 0;
}

static void test_special_parsing(void)
{
    tok *t = load_gguf_tok("bin/fixtures/vocab-qwen2.gguf");
    CHECK(t != NULL);
    if (!t) return;
    const char *s = "hi<|im_end|>\n<|im_start|>user";
    int32_t *ids = NULL;
    size_t n;
    char err[200];
    CHECK(tok_encode(t, s, strlen(s), 1, &ids, &n, err, sizeof err) == 0);
    CHECK(contains(ids, n, 151645) && contains(ids, n, 151644));
    CHECK(n == 5);
    free(ids);
    CHECK(tok_encode(t, s, strlen(s), 0, &ids, &n, err, sizeof err) == 0);
    CHECK(!contains(ids, n, 151645) && !contains(ids, n, 151644));
    char *txt;
    size_t tl;
    CHECK(tok_decode(t, ids, n, &txt, &tl) == 0 && tl == strlen(s) && memcmp(txt, s, tl) == 0);
    free(txt);
    free(ids);
    /* a non-special added token (Qwen's <think>, user-defined) is matched as
     * Hugging Face and llama.cpp match it, with or without parse_special */
    int32_t think = tok_find(t, "<think>", 7);
    CHECK(think > 0);
    CHECK(tok_encode(t, "a<think>b", 9, 0, &ids, &n, err, sizeof err) == 0 && contains(ids, n, think));
    free(ids);
    /* pieces: control tokens give their text; byte-level tokens give bytes */
    size_t pl;
    const char *p = tok_piece(t, 151645, &pl);
    CHECK(pl == 10 && memcmp(p, "<|im_end|>", 10) == 0);
    p = tok_piece(t, 220, &pl);   /* 'Ġ' */
    CHECK(pl == 1 && p[0] == ' ');
    p = tok_piece(t, 198, &pl);   /* 'Ċ' */
    CHECK(pl == 1 && p[0] == '\n');
    int32_t id = tok_find(t, "\xC3\xA9", 2);   /* 'é' stands for byte 0xE9 */
    CHECK(id >= 0);
    p = tok_piece(t, id, &pl);
    CHECK(pl == 1 && (unsigned char)p[0] == 0xE9);
    tok_free(t);

    /* SentencePiece: <s> is parsed only when asked; byte tokens */
    t = load_gguf_tok(TOKDIR "ggml-vocab-llama-spm.gguf");
    CHECK(t != NULL);
    if (!t) return;
    CHECK(tok_encode(t, "<s>Hi", 5, 1, &ids, &n, err, sizeof err) == 0);
    CHECK(n >= 2 && ids[0] == 1);
    free(ids);
    CHECK(tok_encode(t, "<s>Hi", 5, 0, &ids, &n, err, sizeof err) == 0);
    CHECK(!contains(ids, n, 1));
    free(ids);
    p = tok_piece(t, 3 + 0x41, &pl);   /* <0x41> */
    CHECK(pl == 1 && p[0] == 'A');
    p = tok_piece(t, 3 + 0x0A, &pl);
    CHECK(pl == 1 && p[0] == '\n');
    p = tok_piece(t, 3 + 0xE9, &pl);
    CHECK(pl == 1 && (unsigned char)p[0] == 0xE9);
    CHECK(tok_encode(t, "\xf0\x9f\xa6\x99", 4, 0, &ids, &n, err, sizeof err) == 0);   /* byte fallback */
    CHECK(n == 5 && ids[1] == 3 + 0xF0 && ids[4] == 3 + 0x99);
    free(ids);
    tok_free(t);
}

static void test_stories(void)
{
    tok *t = load_gguf_tok("tests/fixtures/models/stories260K.gguf");
    CHECK(t != NULL);
    if (!t) return;
    CHECK_EQ_INT(tok_n_vocab(t), 512);
    CHECK_EQ_INT(tok_bos(t), 1);
    CHECK_EQ_INT(tok_eos(t), 2);
    CHECK(tok_add_bos(t) == 1);
    CHECK(tok_is_eog(t, 2));
    const char *s[] = { "Once upon a time, there was a little girl named Lily.", "She liked to play\nwith her ball!",
                        "\xE6\x97\xA5\xE6\x9C\xAC \xC3\xA9t\xC3\xA9  spaces  ", "" };
    for (size_t i = 0; i < 4; i++) {
        int32_t *ids = NULL;
        size_t n;
        char err[200], *txt = NULL;
        size_t tl;
        CHECK(tok_encode(t, s[i], strlen(s[i]), 0, &ids, &n, err, sizeof err) == 0);
        for (size_t k = 0; k < n; k++) CHECK(ids[k] >= 0 && ids[k] < 512);
        CHECK(tok_decode(t, ids, n, &txt, &tl) == 0 && tl == strlen(s[i]) && memcmp(txt, s[i], tl) == 0);
        free(txt);
        free(ids);
    }
    /* greedy reference ids decode to the published text */
    json_error_t je;
    json_t *root = json_load_file("tests/fixtures/refs/stories260K.greedy.json", 0, &je);
    CHECK(root != NULL);
    if (root) {
        json_t *g = json_object_get(root, "generated_ids");
        size_t n = json_array_size(g);
        int32_t *ids = malloc(sizeof(int32_t) * (n + 1));
        ids[0] = 1;
        for (size_t k = 0; k < n; k++) ids[k + 1] = (int32_t)json_integer_value(json_array_get(g, k));
        char *txt = NULL;
        size_t tl;
        CHECK(tok_decode(t, ids, n + 1, &txt, &tl) == 0);
        CHECKF(txt && strncmp(txt, "Once upon a time, there was a little girl named Lily.", 53) == 0, "'%.60s'", txt);
        free(txt);
        free(ids);
        json_decref(root);
    }
    tok_free(t);
}

static void test_load_errors(void)
{
    char err[256] = "";
    tok *t = (tok *)1;
    CHECK(tok_load_hf(&t, "/nonexistent/tokenizer.json", NULL, err, sizeof err) == -1 && t == NULL && err[0]);
    const char *bad[] = { "{", "{\"model\": {\"type\": \"BPE\"}}", "[1,2", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
                          "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", "\"\\ud800\"", "nul" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen("bin/t_tokenizer_bad.json", "wb");
        if (!f) { CHECK(0); return; }
        fputs(bad[i], f);
        fclose(f);
        err[0] = 0;
        t = NULL;
        CHECKF(tok_load_hf(&t, "bin/t_tokenizer_bad.json", NULL, err, sizeof err) == -1 && t == NULL && err[0], "bad json %zu", i);
    }
    remove("bin/t_tokenizer_bad.json");
    tok_free(NULL);
}


static uint32_t rng_state = 12345;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 17; rng_state ^= rng_state << 5;
    return rng_state;
}

static size_t put_cp(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) { o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F)); return 3; }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Random valid UTF-8 (ASCII-heavy, with whitespace runs, digits, marks,
 * CJK, emoji, special-token fragments) decodes back exactly; random bytes
 * never crash. */
static void test_random_roundtrip(void)
{
    static const char *paths[] = { TOKDIR "ggml-vocab-llama-spm.gguf", TOKDIR "ggml-vocab-gpt-2.gguf",
                                   "bin/fixtures/vocab-llama3.gguf", "tests/fixtures/models/stories260K.gguf",
                                   "tests/fixtures/models/llama3-tiny.bf16.gguf" };
    static const uint32_t pool[] = { ' ', ' ', ' ', '\n', '\t', '\r', 'a', 'e', 'Z', '0', '7', '\'', '<', '|', '>', '!',
                                     0xA0, 0x301, 0xE9, 0x3000, 0x4E2D, 0x65E5, 0xAC00, 0x0627, 0x1F600, 0x2581, 0x10FFFF,
                                     0x0, 0x7F, 0x85, 0x2028, 0xFEFF, 0x17F };
    char buf[1200];
    for (size_t m = 0; m < sizeof paths / sizeof paths[0]; m++) {
        tok *t = load_gguf_tok(paths[m]);
        CHECK(t != NULL);
        if (!t) continue;
        int bad = 0;
        for (int it = 0; it < 300; it++) {
            size_t n = 0, len = rnd() % 200;
            for (size_t i = 0; i < len; i++) {
                uint32_t r = rnd() % 100;
                uint32_t cp = r < 50 ? 'a' + rnd() % 26 : r < 60 ? 'A' + rnd() % 26 : pool[rnd() % (sizeof pool / sizeof pool[0])];
                /* SentencePiece writes spaces as U+2581: that one character
                 * cannot survive the round trip, by design */
                if (cp == 0x2581 && strcmp(tok_kind_name(t), "spm") == 0) cp = '_';
                n += put_cp(buf + n, cp);
            }
            int32_t *ids = NULL;
            size_t ni;
            char err[200], *txt = NULL;
            size_t tl;
            int ps = it & 1;
            if (tok_encode(t, buf, n, ps, &ids, &ni, err, sizeof err) != 0) { bad++; continue; }
            if (!ps) {
                if (tok_decode(t, ids, ni, &txt, &tl) != 0 || tl != n || memcmp(txt, buf, n) != 0) {
                    if (!bad) {
                        fprintf(stderr, "  roundtrip differs for %s on:", paths[m]);
                        for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)buf[i]);
                        fprintf(stderr, "\n");
                    }
                    bad++;
                }
            }
            free(txt);
            free(ids);
            /* random bytes: an error or ids, never a crash */
            for (size_t i = 0; i < 64; i++) buf[i] = (char)rnd();
            if (tok_encode(t, buf, 64, 1, &ids, &ni, err, sizeof err) == 0) free(ids);
        }
        CHECKF(bad == 0, "%s: %d random strings failed", paths[m], bad);
        tok_free(t);
    }
}

/* Truncated and corrupted tokenizer.json files fail cleanly. */
static void test_hf_corrupt(void)
{
    size_t n;
    char *src = slurp("tests/fixtures/hf/qwen2-tiny/tokenizer.json", &n);
    CHECK(src != NULL);
    if (!src) return;
    int ok = 0, failed = 0;
    for (int it = 0; it < 40; it++) {
        size_t cut = it < 20 ? (size_t)rnd() % n : n;
        char *cp = malloc(n);
        memcpy(cp, src, n);
        if (it >= 20) for (int k = 0; k < 5; k++) cp[rnd() % n] = "{}[]\",:0a\xff"[rnd() % 10];
        FILE *f = fopen("bin/t_tokenizer_fuzz.json", "wb");
        if (!f) { free(cp); break; }
        fwrite(cp, 1, cut, f);
        fclose(f);
        free(cp);
        tok *t = NULL;
        char err[256];
        if (tok_load_hf(&t, "bin/t_tokenizer_fuzz.json", NULL, err, sizeof err) == 0) {
            int32_t *ids = NULL;
            size_t ni;
            if (tok_encode(t, "Hello world <|im_end|>", 22, 1, &ids, &ni, err, sizeof err) == 0) free(ids);
            tok_free(t);
            ok++;
        } else {
            CHECK(t == NULL && err[0]);
            failed++;
        }
    }
    CHECK(failed >= 20);
    remove("bin/t_tokenizer_fuzz.json");
    free(src);
}

/* A SentencePiece-style tokenizer.json, written the way Hugging Face's
 * LlamaConverter writes one from a SentencePiece model (merges extracted from
 * the vocabulary, ordered by the merged piece's score), from the llama-spm
 * GGUF's vocabulary. Through it, llama.cpp's vectors must come out the same. */
typedef struct xmerge { int32_t l, r; float score; size_t ord; } xmerge;

static int cmp_xmerge(const void *a, const void *b)
{
    const xmerge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

static void json_put_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int write_spm_tokenizer_json(const char *path)
{
    char err[256];
    gguf *g = NULL;
    if (gguf_open(&g, TOKDIR "ggml-vocab-llama-spm.gguf", err, sizeof err)) return -1;
    tok *t = NULL;
    if (tok_load_gguf(&t, g, err, sizeof err)) { gguf_close(g); return -1; }
    const gguf_kv *tk = gguf_get(g, "tokenizer.ggml.tokens"), *sc = gguf_get(g, "tokenizer.ggml.scores");
    int32_t n = (int32_t)tk->arr_n;
    size_t cap = 1 << 20, nm = 0;
    xmerge *m = malloc(sizeof(xmerge) * cap);
    for (int32_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(tk, (uint64_t)i);
        size_t first = nm;
        for (size_t k = 1; k < s.n; k++) {
            if (((unsigned char)s.s[k] & 0xC0) == 0x80) continue;   /* split between code points */
            int32_t l = tok_find(t, s.s, k), r = tok_find(t, s.s + k, s.n - k);
            if (l < 0 || r < 0 || nm == cap) continue;
            m[nm].l = l; m[nm].r = r; m[nm].score = (float)gguf_arr_f64(sc, (uint64_t)i);
            nm++;
        }
        /* local order: by (left id, right id) */
        for (size_t a = first; a < nm; a++)
            for (size_t b = a + 1; b < nm; b++)
                if (m[b].l < m[a].l || (m[b].l == m[a].l && m[b].r < m[a].r)) { xmerge x = m[a]; m[a] = m[b]; m[b] = x; }
    }
    for (size_t i = 0; i < nm; i++) m[i].ord = i;
    qsort(m, nm, sizeof(xmerge), cmp_xmerge);
    FILE *f = fopen(path, "wb");
    if (!f) { free(m); tok_free(t); gguf_close(g); return -1; }
    fputs("{\"version\":\"1.0\",\"added_tokens\":[", f);
    fputs("{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true},"
          "{\"id\":2,\"content\":\"</s>\",\"special\":true}],", f);
    fputs("\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\u2581\"},"
          "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\u2581\"}]},\"pre_tokenizer\":null,", f);
    fputs("\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
          "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]},", f);
    fputs("\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,\"vocab\":{", f);
    for (int32_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(tk, (uint64_t)i);
        if (i) fputc(',', f);
        json_put_str(f, s.s, s.n);
        fprintf(f, ":%d", i);
    }
    fputs("},\"merges\":[", f);
    for (size_t i = 0; i < nm; i++) {
        gguf_str a = gguf_arr_str(tk, (uint64_t)m[i].l), b = gguf_arr_str(tk, (uint64_t)m[i].r);
        if (i) fputc(',', f);
        fputc('[', f);
        json_put_str(f, a.s, a.n);
        fputc(',', f);
        json_put_str(f, b.s, b.n);
        fputc(']', f);
    }
    fputs("]}}", f);
    fclose(f);
    free(m);
    tok_free(t);
    gguf_close(g);
    return 0;
}

static void test_hf_spm(void)
{
    const char *path = "bin/t_tokenizer_spm.json";
    CHECK(write_spm_tokenizer_json(path) == 0);
    tok *t = NULL;
    char err[256];
    CHECKF(tok_load_hf(&t, path, NULL, err, sizeof err) == 0, "%s", err);
    if (t) {
        CHECK(strcmp(tok_kind_name(t), "spm") == 0);
        CHECK(tok_add_bos(t) == 1 && tok_bos(t) == 1);
        run_vectors(t, TOKDIR "ggml-vocab-llama-spm.gguf", 0);
        tok *g = load_gguf_tok(TOKDIR "ggml-vocab-llama-spm.gguf");
        if (g) compare_on_vectors(t, g, TOKDIR "ggml-vocab-llama-bpe.gguf", 1);
        if (g) compare_on_vectors(t, g, TOKDIR "ggml-vocab-qwen2.gguf", 1);
        tok_free(g);
        tok_free(t);
    }
    remove(path);
}

/* A loaded tok is shared by threads: concurrent encodes give the same ids. */
typedef struct thr_arg { const tok *t; const char *text; size_t len; int32_t *ids; size_t n; int rc; } thr_arg;

static void *thr_encode(void *p)
{
    thr_arg *a = p;
    char err[200];
    for (int r = 0; r < 5 && a->rc == 0; r++) {
        free(a->ids);
        a->ids = NULL;
        a->rc = tok_encode(a->t, a->text, a->len, 1, &a->ids, &a->n, err, sizeof err);
    }
    return NULL;
}

static void test_threads(void)
{
    static const char *paths[] = { "bin/fixtures/vocab-qwen2.gguf", TOKDIR "ggml-vocab-llama-spm.gguf" };
    size_t len;
    char *text = slurp(TOKDIR "ggml-vocab-qwen2.gguf.inp", &len);
    CHECK(text != NULL);
    if (!text) return;
    for (int m = 0; m < 2; m++) {
        tok *t = load_gguf_tok(paths[m]);
        CHECK(t != NULL);
        if (!t) continue;
        thr_arg a[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            a[i] = (thr_arg){ t, text, len, NULL, 0, 0 };
            CHECK(pthread_create(&th[i], NULL, thr_encode, &a[i]) == 0);
        }
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 4; i++) {
            CHECK(a[i].rc == 0);
            CHECK(ids_eq(a[i].ids, a[i].n, a[0].ids, a[0].n));
        }
        for (int i = 0; i < 4; i++) free(a[i].ids);
        tok_free(t);
    }
    free(text);
}

/* Qwen normalizes to NFC (only around characters that need it): encoding a
 * text and encoding its full utf8proc NFC give the same ids. */
static void test_nfc(void)
{
    static const uint32_t pool[] = { 'e', 'a', ' ', '\n', 0x301, 0x300, 0x327, 0x308, 0x323, 0x302, 0xE9, 0x1E9B,
                                     0x212B, 0x2000, 0x387, 0x37E, 0x3099, 0x304B, 0x30AB, 0x1100, 0x1161, 0x11A8,
                                     0xAC00, 0x627, 0x653, 0x64B, 0x928, 0x93C, 0xB47, 0xB3E, 0x41, 0x30A, 0x4E2D,
                                     0x1F600, 0x418, 0x306, 0xFB01, 0x2126, 0xF900 };
    tok *t = load_gguf_tok("bin/fixtures/vocab-qwen2.gguf");
    CHECK(t != NULL);
    if (!t) return;
    char buf[1000];
    int bad = 0;
    for (int it = 0; it < 400; it++) {
        size_t n = 0, len = 1 + rnd() % 60;
        for (size_t i = 0; i < len; i++) n += put_cp(buf + n, pool[rnd() % (sizeof pool / sizeof pool[0])]);
        size_t nn = 0;
        char *norm = nfc(buf, n, &nn);
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        char err[200];
        int ok = norm && tok_encode(t, buf, n, 0, &a, &na, err, sizeof err) == 0 &&
                 tok_encode(t, norm, nn, 0, &b, &nb, err, sizeof err) == 0 && ids_eq(a, na, b, nb);
        if (!ok) {
            if (!bad) {
                fprintf(stderr, "  NFC differs on:");
                for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)buf[i]);
                fprintf(stderr, "\n");
            }
            bad++;
        }
        free(a);
        free(b);
        free(norm);
    }
    CHECKF(bad == 0, "%d strings", bad);
    tok_free(t);
}

/* A Digits(individual_digits) + ByteLevel pre-tokenizer (SmolLM's): every
 * digit is a word of its own, the rest follows the GPT-2 rules. */
static void test_hf_digits(void)
{
    size_t n;
    char *src = slurp("tests/fixtures/hf/qwen2-tiny/tokenizer.json", &n);
    CHECK(src != NULL);
    if (!src) return;
    char *a = strstr(src, "\"pre_tokenizer\": "), *b = strstr(src, ", \"post_processor\"");
    CHECK(a && b && a < b);
    if (!a || !b) { free(src); return; }
    FILE *f = fopen("bin/t_tokenizer_digits.json", "wb");
    if (!f) { CHECK(0); free(src); return; }
    fwrite(src, 1, (size_t)(a - src), f);
    fputs("\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": true},"
          " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}]}", f);
    fputs(b, f);
    fclose(f);
    free(src);
    tok *t = NULL;
    char err[256];
    CHECKF(tok_load_hf(&t, "bin/t_tokenizer_digits.json", NULL, err, sizeof err) == 0, "%s", err);
    remove("bin/t_tokenizer_digits.json");
    if (!t) return;
    int32_t *ids = NULL;
    size_t k;
    CHECK(tok_encode(t, "abc 2024 x", 10, 0, &ids, &k, err, sizeof err) == 0);
    int32_t want_tail[] = { 220, 17, 15, 17, 19 };   /* 'Ġ' '2' '0' '2' '4' */
    CHECK(k >= 6 && memcmp(ids + k - 6, want_tail, sizeof want_tail) == 0);
    char *txt = NULL;
    size_t tl;
    CHECK(tok_decode(t, ids, k, &txt, &tl) == 0 && tl == 10 && memcmp(txt, "abc 2024 x", 10) == 0);
    free(txt);
    free(ids);
    tok_free(t);
}

/* Ids made by the sentencepiece library itself for models built from the
 * GGUF vocabularies (tests/fixtures/tokenizers/sentencepiece_vectors.json). */
static void test_sentencepiece_vectors(void)
{
    json_error_t je;
    json_t *root = json_load_file("tests/fixtures/tokenizers/sentencepiece_vectors.json", 0, &je);
    CHECK(root != NULL);
    if (!root) return;
    const char *path;
    json_t *cases;
    json_object_foreach(json_object_get(root, "models"), path, cases) {
        tok *t = load_gguf_tok(path);
        CHECKF(t != NULL, "%s", path);
        if (!t) continue;
        size_t i;
        json_t *c;
        int ok = 0, bad = 0;
        json_array_foreach(cases, i, c) {
            const char *s = json_string_value(json_array_get(c, 0));
            json_t *want = json_array_get(c, 1);
            int32_t *ids = NULL;
            size_t n = 0;
            char err[200];
            int same = s && tok_encode(t, s, strlen(s), 0, &ids, &n, err, sizeof err) == 0 && json_array_size(want) == n;
            for (size_t k = 0; same && k < n; k++) same = json_integer_value(json_array_get(want, k)) == ids[k];
            if (same) ok++;
            else if (bad++ < 3) fprintf(stderr, "  %s: differs on '%s'\n", path, s ? s : "?");
            free(ids);
        }
        CHECKF(bad == 0 && ok >= 500, "%s: %d ok, %d differ", path, ok, bad);
        tok_free(t);
    }
    json_decref(root);
}

/* The second set's references tokenized their texts with the model's own
 * tokenizer (no special tokens): GPT-2's byte-level BPE and Gemma 3's
 * fixture vocabulary give the same ids from the GGUF. */
static void test_model_texts(void)
{
    static const char *const pairs[][2] = {
        { "tests/fixtures/models/gpt2-tiny.bf16.gguf", "tests/fixtures/refs/gpt2-tiny.dev.json" },
        { "tests/fixtures/models/gemma3-tiny.bf16.gguf", "tests/fixtures/refs/gemma3-tiny.dev.json" },
    };
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        tok *t = load_gguf_tok(pairs[k][0]);
        json_t *root = json_load_file(pairs[k][1], 0, NULL);
        CHECK(t != NULL && root != NULL);
        if (!t || !root) { if (t) tok_free(t); json_decref(root); continue; }
        size_t ci, texts = 0;
        json_t *c;
        json_array_foreach(json_object_get(root, "cases"), ci, c) {
            const char *text = json_string_value(json_object_get(c, "text"));
            if (!text) continue;
            json_t *jt = json_object_get(c, "tokens");
            int32_t *ids = NULL;
            size_t n = 0;
            char err[128];
            CHECK(tok_encode(t, text, strlen(text), 0, &ids, &n, err, sizeof err) == 0);
            int same = n == json_array_size(jt);
            for (size_t i = 0; same && i < n; i++) same = ids[i] == (int32_t)json_integer_value(json_array_get(jt, i));
            CHECKF(same, "%s: '%s' tokenizes otherwise than the reference", pairs[k][0], text);
            free(ids);
            texts++;
        }
        CHECK(texts > 0);
        json_decref(root);
        tok_free(t);
    }
}

int main(void)
{
    RUN(test_spm_vectors);
    RUN(test_gpt2_vectors);
    RUN(test_qwen2_vectors);
    RUN(test_llama3_vectors);
    RUN(test_llama2_vectors);
    RUN(test_sentencepiece_vectors);
    RUN(test_tiny_refs);
    RUN(test_hf_vs_gguf);
    RUN(test_invalid_utf8);
    RUN(test_special_parsing);
    RUN(test_stories);
    RUN(test_load_errors);
    RUN(test_random_roundtrip);
    RUN(test_hf_corrupt);
    RUN(test_hf_spm);
    RUN(test_threads);
    RUN(test_nfc);
    RUN(test_hf_digits);
    RUN(test_model_texts);
    return CHECK_DONE();
}
