/* t_tokenizer.c — tokenizers against vectors made by llama.cpp / Hugging Face:
 * llama.cpp's test-tokenizer-0 vectors (gpt-2, llama-spm, qwen2, llama-bpe),
 * llama2.c's SentencePiece vectors, the tiny models' reference prompts, and
 * tokenizer.json vs GGUF agreement. */
#include "tests/check.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

#include <jansson.h>
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

int main(void)
{
    RUN(test_spm_vectors);
    RUN(test_gpt2_vectors);
    RUN(test_qwen2_vectors);
    RUN(test_llama3_vectors);
    RUN(test_llama2_vectors);
    RUN(test_tiny_refs);
    RUN(test_hf_vs_gguf);
    RUN(test_invalid_utf8);
    RUN(test_special_parsing);
    RUN(test_stories);
    RUN(test_load_errors);
    return CHECK_DONE();
}
