/* t_grammar.c — GBNF compile errors, llama.cpp's sample grammars on accepted
 * and refused texts, the token mask against a token-by-token check on real
 * vocabularies, bounds, and JSON Schema → grammar on the draft7 test suite. */
#include "tests/check.h"
#include "engine/grammar/grammar.h"
#include "engine/load/gguf.h"
#include "engine/text/tokenizer.h"

#include <dirent.h>
#include <math.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)l + 1);
    if (s && fread(s, 1, (size_t)l, f) != (size_t)l) { free(s); s = NULL; }
    if (s) s[l] = 0;
    fclose(f);
    if (n) *n = (size_t)l;
    return s;
}

static gram *compile_str(const char *s, char *err, size_t errlen)
{
    gram *g = NULL;
    if (gram_compile(&g, s, strlen(s), err, errlen)) return NULL;
    return g;
}

/* 1: the whole text is a sentence of g; 0: not; -1: bound. */
static int matches(const gram *g, const char *text, size_t n)
{
    char err[256];
    gram_match *m = NULL;
    if (gram_match_new(&m, g, err, sizeof err)) return -1;
    int r = gram_match_accept(m, text, n, err, sizeof err);
    if (r == 1) r = gram_match_can_end(m);
    gram_match_free(m);
    return r;
}

static gram *load_fixture(const char *name)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "tests/fixtures/grammars/%s", name);
    size_t n;
    char *s = slurp(path, &n);
    if (!s) { fprintf(stderr, "cannot read %s\n", path); return NULL; }
    gram *g = NULL;
    if (gram_compile(&g, s, n, err, sizeof err)) fprintf(stderr, "%s: %s\n", path, err);
    free(s);
    return g;
}

typedef struct { const char *text; int ok; } sample;

static void run_samples(const char *file, const sample *s, size_t n)
{
    gram *g = load_fixture(file);
    CHECKF(g != NULL, "%s", file);
    if (!g) return;
    for (size_t i = 0; i < n; i++) {
        int r = matches(g, s[i].text, strlen(s[i].text));
        CHECKF(r == s[i].ok, "%s: \"%s\" gave %d, expected %d", file, s[i].text, r, s[i].ok);
    }
    gram_free(g);
}

static void test_samples(void)
{
    static const sample json[] = {
        { "{}", 1 }, { "{\"a\": 1}", 1 }, { "{\"a\": [1, 2.5, -3e+4, true, null, \"x\\n\\u00e9\"]}", 1 },
        { "{\n  \"k\": {\"n\": {}}\n}", 1 }, { "{\"é\": \"日本\"}", 1 },
        { "", 0 }, { "[]", 0 }, { "{\"a\" 1}", 0 }, { "{\"a\": 01x}", 0 }, { "{\"a\": tru}", 0 },
        { "{\"a\": \"\x01\"}", 0 }, { "{\"a\": \"\\q\"}", 0 }, { "{", 0 }, { "{}}", 0 },
    };
    static const sample arith[] = {
        { "1+2=3\n", 1 }, { "(a +b) *c = x\n", 1 }, { "(a + b) = x\n", 0 }, { "x=1\ny=2\n", 1 }, { "a_1/b2 = 0\n", 1 },
        { "1+2=3", 0 }, { "=3\n", 0 }, { "1++2=3\n", 0 }, { "A=1\n", 0 }, { "(1=2\n", 0 },
    };
    static const sample list[] = {
        { "- a\n", 1 }, { "- apples\n- pears and plums\n", 1 }, { "- ünïcödé ✓\n", 1 },
        { "- \n", 0 }, { "-a\n", 0 }, { "- \xc1\xab\n", 0 }, { "- \xe0\x81\xab\n", 0 }, { "- \xed\xa0\x80\n", 0 },
        { "- \xf4\x90\x80\x80\n", 0 }, { "- \xf0\x8f\xbf\xbf\n", 0 }, { "- \xf0\x90\x80\x80\xef\xbf\xbf\n", 1 }, { "- a", 0 }, { "- a\rb\n", 0 }, { "- a\xe2\x80\xa8" "b\n", 0 }, { "", 0 },
    };
    static const sample c[] = {
        { "int main(){return 0;}", 1 }, { "int main(){return 0;}int g(char c){}", 1 },
        { "int f(int x){while(x<10){x = x+1;}return x;}", 1 },
        { "float g(){/* note */y = h(1, 2);for(i = 0; i<3; i = i+1){}if(a==b){}else{}}", 1 },
        { "", 1 },
        { "int main(){return 0}", 0 }, { "int f(){/* x */", 0 }, { "main(){}", 0 }, { "int 1x(){}", 0 }, { "int f(){x = ;}", 0 },
    };
    static const sample chess[] = {
        { "1. e4 e5\n2. Nf3 Nc6\n", 1 }, { "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd8+\n", 1 }, { "1. e4 e5\n10. e8=Q# Kh1\n", 1 },
        { "1. e4 e5\n", 0 }, { "1. e9 e5\n2. a1 a2\n", 0 }, { "1. e4\n2. e5 e6\n", 0 }, { "2. e4 e5\n3. a3 a4\n", 0 },
    };
    run_samples("json.gbnf", json, sizeof json / sizeof *json);
    run_samples("arithmetic.gbnf", arith, sizeof arith / sizeof *arith);
    run_samples("list.gbnf", list, sizeof list / sizeof *list);
    run_samples("c.gbnf", c, sizeof c / sizeof *c);
    run_samples("chess.gbnf", chess, sizeof chess / sizeof *chess);
}

static void test_syntax(void)
{
    char err[256];
    gram *g;
    /* repetitions */
    g = compile_str("root ::= \"a\"{2,3} [0-9]{2} \"b\"{1,} x?\nx ::= \"!\"", err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (g) {
        CHECK_EQ_INT(matches(g, "aa12b", 5), 1);
        CHECK_EQ_INT(matches(g, "aaa12bbb!", 9), 1);
        CHECK_EQ_INT(matches(g, "a12b", 4), 0);
        CHECK_EQ_INT(matches(g, "aaaa12b", 7), 0);
        CHECK_EQ_INT(matches(g, "aa1b", 4), 0);
        CHECK_EQ_INT(matches(g, "aa12", 4), 0);
        gram_free(g);
    }
    /* escapes, negation, any char, multi-line alternatives, comments */
    g = compile_str("# c\nroot ::= \"\\x41\\u00e9\\U0001F600\" [^a-c\\n] . # tail\n  | \"z\" (\n \"1\" |\n \"2\" )\n", err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (g) {
        CHECK_EQ_INT(matches(g, "A\xc3\xa9\xf0\x9f\x98\x80" "dx", 9), 1);
        CHECK_EQ_INT(matches(g, "A\xc3\xa9\xf0\x9f\x98\x80" "bx", 9), 0);
        CHECK_EQ_INT(matches(g, "A\xc3\xa9\xf0\x9f\x98\x80" "\nx", 9), 0);
        CHECK_EQ_INT(matches(g, "z2", 2), 1);
        CHECK_EQ_INT(matches(g, "z3", 2), 0);
        gram_free(g);
    }
    /* errors name the rule and the position */
    struct { const char *src, *want; } bad[] = {
        { "root ::= foo", "rule 'foo' at 1:10: used but not defined" },
        { "root ::= \"a\"\nx ::= [a-", "rule 'x' at 2:7" },
        { "root ::= \"a\" \\q", "rule 'root' at 1:14" },
        { "root ::= \"\\q\"", "rule 'root' at 1:11: unknown escape" },
        { "root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]", "rule 'expr' at 2:1: left recursion" },
        { "root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "rule 'a' at 2:1: left recursion" },
        { "root ::= (\"x\"? )* \"y\"", "left recursion" },
        { "x ::= \"a\"", "no rule named 'root'" },
        { "root ::= \"a\"\nroot ::= \"b\"", "rule 'root' at 2:1: defined twice" },
        { "root ::= \"a\"{3,1}", "rule 'root' at 1:13" },
        { "root ::= (\"a\"", "expected ')'" },
        { "root ::= \"abc", "unterminated literal" },
        { "root := \"a\"", "at 1:6: expected '::='" },
        { "root ::= \"a\"{99999}", "repetition count" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        g = compile_str(bad[i].src, err, sizeof err);
        CHECKF(g == NULL && strstr(err, bad[i].want), "%s: got \"%s\", want \"%s\"", bad[i].src, err, bad[i].want);
        gram_free(g);
    }
}

/* Exploding alternatives end in an error, quickly: after n "(" every one
 * of 2^n sequences of closers is a distinct stack. */
static void test_bounds(void)
{
    char err[256];
    gram *g = compile_str("root ::= s\ns ::= \"(\" s \")\" | \"(\" s \"]\" | \"x\"", err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (!g) return;
    CHECK_EQ_INT(matches(g, "((x])", 5), 1);
    CHECK_EQ_INT(matches(g, "((x)]", 5), 1);
    CHECK_EQ_INT(matches(g, "((x)", 4), 0);
    gram_match *m = NULL;
    CHECK(gram_match_new(&m, g, err, sizeof err) == 0);
    int r = 1, i = 0;
    clock_t t0 = clock();
    for (; i < 40 && r == 1; i++) r = gram_match_accept(m, "(", 1, err, sizeof err);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECKF(r == -1 && strstr(err, "bounds"), "r %d after %d: %s", r, i, err);
    /* after k "(": 2^k closer sequences times 3 next characters (two "(" and
     * "x"); 3 * 2^10 fits in 4096 stacks, 3 * 2^11 does not */
    CHECKF(i == 11, "the bound came after %d characters", i);
    CHECKF(s < 2, "%.2f s", s);
    /* the mask reports it too, and later calls keep refusing */
    char e2[256] = "";
    CHECK(gram_match_accept(m, "x", 1, e2, sizeof e2) == -1 && strstr(e2, "bounds"));
    gram_match_free(m);
    gram_free(g);
}

/* Mutated grammars (bytes changed, cut, duplicated) and random texts:
 * every outcome is a compile error or a matcher that answers. */
static void test_mutations(void)
{
    const char *files[] = { "json.gbnf", "arithmetic.gbnf", "list.gbnf", "c.gbnf", "chess.gbnf" };
    static const char alphabet[] = "()[]|*+?{}\"\\^-.#:=\n ab0x";
    uint64_t rng = 12345;
    int compiled = 0, refused = 0;
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/grammars/%s", files[f]);
        size_t n;
        char *src = slurp(path, &n);
        if (!src) { CHECK(0); continue; }
        char *buf = malloc(2 * n + 16);
        for (int it = 0; it < 400; it++) {
            memcpy(buf, src, n);
            size_t len = n;
            for (int k = 0; k < 3; k++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                size_t at = (size_t)(rng >> 33) % len;
                int op = (int)(rng >> 20) % 3;
                if (op == 0) buf[at] = alphabet[(rng >> 40) % (sizeof alphabet - 1)];
                else if (op == 1) len = at + 1;
                else if (len + 8 < 2 * n) { memmove(buf + at + 4, buf + at, len - at); len += 4; }
            }
            char err[256];
            gram *g = NULL;
            if (gram_compile(&g, buf, len, err, sizeof err)) { refused++; CHECK(strstr(err, "grammar") != NULL); continue; }
            compiled++;
            gram_match *m = NULL;
            if (gram_match_new(&m, g, err, sizeof err) == 0) {
                for (int b = 0; b < 64; b++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    char c = alphabet[(rng >> 40) % (sizeof alphabet - 1)];
                    if (gram_match_accept(m, &c, 1, err, sizeof err) < 0) break;
                }
                gram_match_free(m);
            }
            gram_free(g);
        }
        free(buf); free(src);
    }
    printf("mutated grammars: %d compiled, %d refused with a message\n", compiled, refused);
    CHECK(compiled > 0 && refused > 0);
}

/* ---- vocabularies ---- */
static tok *load_tok(const char *path)
{
    char err[256];
    gguf *gg = NULL;
    tok *t = NULL;
    if (gguf_open(&gg, path, err, sizeof err)) { fprintf(stderr, "%s\n", err); return NULL; }
    if (tok_load_gguf(&t, gg, err, sizeof err)) fprintf(stderr, "%s: %s\n", path, err);
    gguf_close(gg);
    return t;
}

static gram_vocab *vocab_of(const tok *t)
{
    int32_t n = tok_n_vocab(t);
    const char **p = calloc((size_t)n, sizeof *p);
    size_t *l = calloc((size_t)n, sizeof *l);
    for (int32_t i = 0; i < n; i++) {
        if (tok_is_control(t, i) || tok_is_eog(t, i)) continue;
        p[i] = tok_piece(t, i, &l[i]);
    }
    gram_vocab *v = gram_vocab_new(p, l, n);
    free(p); free(l);
    return v;
}

static const char *model_paths[] = { "tests/fixtures/models/qwen2-tiny.bf16.gguf", "tests/fixtures/models/llama3-tiny.bf16.gguf" };

/* The trie walk's mask equals checking every token one at a time. */
static void mask_vs_each(const tok *t, const gram_vocab *v, const gram *g, const char *prefix)
{
    char err[256];
    gram_match *m = NULL;
    if (gram_match_new(&m, g, err, sizeof err)) { CHECKF(0, "%s", err); return; }
    CHECKF(gram_match_accept(m, prefix, strlen(prefix), err, sizeof err) == 1, "prefix \"%s\"", prefix);
    int32_t n = tok_n_vocab(t);
    uint32_t *mask = calloc(((size_t)n + 31) / 32, 4);
    int64_t cnt = gram_match_mask(m, v, mask, err, sizeof err);
    int64_t want = 0, bad = 0;
    for (int32_t i = 0; i < n; i++) {
        int exp = 0;
        if (!tok_is_control(t, i) && !tok_is_eog(t, i)) {
            size_t l;
            const char *s = tok_piece(t, i, &l);
            if (l) exp = gram_match_check(m, s, l, err, sizeof err) == 1;
        }
        want += exp;
        int got = (mask[i >> 5] >> (i & 31)) & 1;
        if (got != exp && bad++ < 3) fprintf(stderr, "prefix \"%s\": token %d \"%s\": mask %d, check %d\n", prefix, i, tok_piece(t, i, &(size_t){0}), got, exp);
    }
    CHECKF(bad == 0 && cnt == want, "prefix \"%s\": %lld mismatches; %lld vs %lld", prefix, (long long)bad, (long long)cnt, (long long)want);
    /* a second mask of the same state (cached) is the same */
    uint32_t *mask2 = calloc(((size_t)n + 31) / 32, 4);
    CHECK_EQ_INT(gram_match_mask(m, v, mask2, err, sizeof err), cnt);
    CHECK(memcmp(mask, mask2, ((size_t)n + 31) / 32 * 4) == 0);
    free(mask); free(mask2);
    gram_match_free(m);
}

static void test_mask(void)
{
    for (size_t k = 0; k < sizeof model_paths / sizeof *model_paths; k++) {
        tok *t = load_tok(model_paths[k]);
        CHECKF(t != NULL, "%s", model_paths[k]);
        if (!t) continue;
        gram_vocab *v = vocab_of(t);
        CHECK(v != NULL);
        gram *g = load_fixture("json.gbnf");
        const char *pre[] = { "", "{", "{\"a\": ", "{\"a\": \"x", "{\"a\": \"\xc3", "{\"a\": 1", "{\"a\": [1, {}" };
        for (size_t i = 0; g && v && i < sizeof pre / sizeof *pre; i++) mask_vs_each(t, v, g, pre[i]);
        gram_free(g);
        g = load_fixture("list.gbnf");
        const char *pre2[] = { "", "- ", "- ab\xe2\x80" };
        for (size_t i = 0; g && v && i < sizeof pre2 / sizeof *pre2; i++) mask_vs_each(t, v, g, pre2[i]);
        gram_free(g);
        gram_vocab_free(v);
        tok_free(t);
    }
}

/* Cost of one mask: free text (every token may follow) and structure. */
static void test_mask_speed(void)
{
    /* GPT-2's 50,257 tokens: a real vocabulary of size */
    tok *t = load_tok("tests/fixtures/tokenizers/llama.cpp/ggml-vocab-gpt-2.gguf");
    if (!t) return;
    gram_vocab *v = vocab_of(t);
    gram *g = load_fixture("json.gbnf");
    char err[256];
    if (!g || !v) { gram_free(g); gram_vocab_free(v); tok_free(t); return; }
    const char *pre[] = { "{\"a\": \"x", "{\"a\": 1", "{" };
    int32_t n = tok_n_vocab(t);
    uint32_t *mask = calloc(((size_t)n + 31) / 32, 4);
    for (int k = 0; k < 3; k++) {
        gram_match *m = NULL;
        if (gram_match_new(&m, g, err, sizeof err)) break;
        gram_match_accept(m, pre[k], strlen(pre[k]), err, sizeof err);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int64_t c = 0;
        int reps = 5;
        for (int r = 0; r < reps; r++) {
            /* a fresh state each time (no cache): accept and take back a space-free byte */
            gram_match *m2 = NULL;
            gram_match_new(&m2, g, err, sizeof err);
            gram_match_accept(m2, pre[k], strlen(pre[k]), err, sizeof err);
            c = gram_match_mask(m2, v, mask, err, sizeof err);
            gram_match_free(m2);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = ((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6) / reps;
        printf("mask over %d tokens after '%s': %lld allowed, %.2f ms\n", n, pre[k], (long long)c, ms);
        CHECKF(ms < 500, "%.1f ms", ms);
        /* the same state again: from the cache */
        clock_gettime(CLOCK_MONOTONIC, &a);
        int64_t c2 = gram_match_mask(m, v, mask, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &a);
        c2 = gram_match_mask(m, v, mask, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("  same state again (cached): %.3f ms\n", ((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6));
        CHECK_EQ_INT(c2, c);
        gram_match_free(m);
    }
    free(mask);
    gram_free(g); gram_vocab_free(v); tok_free(t);
}




/* ---- JSON Schema ---- */
#define SUITE "/usr/share/json-schema-test-suite/tests/draft7/"

/* Feeds text through the matcher token by token (as the tokenizer splits
 * it), each token also checked against the mask when check_mask. 1: the
 * whole text is accepted and may end; 0: refused. */
static int feed_tokens(const tok *t, const gram_vocab *v, const gram *g, const char *text, int check_mask, uint32_t *mask)
{
    char err[256];
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(t, text, strlen(text), 0, &ids, &n, err, sizeof err)) return -1;
    gram_match *m = NULL;
    if (gram_match_new(&m, g, err, sizeof err)) { free(ids); return -1; }
    int ok = 1;
    for (size_t i = 0; i < n && ok == 1; i++) {
        size_t l;
        const char *pc = tok_piece(t, ids[i], &l);
        if (check_mask) {
            int64_t c = gram_match_mask(m, v, mask, err, sizeof err);
            int bit = c >= 0 && ((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1);
            int acc = gram_match_check(m, pc, l, err, sizeof err) == 1;
            if (bit != acc) { fprintf(stderr, "mask and check disagree on token %d of \"%s\"\n", ids[i], text); ok = -1; break; }
        }
        ok = gram_match_accept(m, pc, l, err, sizeof err);
    }
    if (ok == 1) ok = gram_match_can_end(m);
    gram_match_free(m);
    free(ids);
    return ok;
}

static const struct { const char *file; int structural; } suite_files[] = {
    { "type.json", 1 }, { "required.json", 1 }, { "additionalProperties.json", 1 }, { "enum.json", 1 },
    { "const.json", 1 }, { "items.json", 1 }, { "additionalItems.json", 1 }, { "minItems.json", 1 },
    { "maxItems.json", 1 }, { "minLength.json", 1 }, { "maxLength.json", 1 }, { "pattern.json", 1 },
    { "minimum.json", 1 }, { "maximum.json", 1 }, { "exclusiveMinimum.json", 1 }, { "exclusiveMaximum.json", 1 },
    { "properties.json", 0 }, { "anyOf.json", 0 }, { "oneOf.json", 0 },
    { "ref.json", 0 }, { "definitions.json", 0 }, { "boolean_schema.json", 0 },
};

static void test_schema_suite(void)
{
    DIR *d = opendir(SUITE);
    if (!d) { printf("notice: %s absent (Debian's json-schema-test-suite): schema suite skipped\n", SUITE); return; }
    closedir(d);
    for (size_t k = 0; k < sizeof model_paths / sizeof *model_paths; k++) {
        tok *t = load_tok(model_paths[k]);
        if (!t) { CHECK(0); continue; }
        gram_vocab *v = vocab_of(t);
        uint32_t *mask = calloc(((size_t)tok_n_vocab(t) + 31) / 32, 4);
        int valid_ok = 0, invalid_rej = 0, invalid_acc_nonstruct = 0, skipped = 0, groups = 0;
        for (size_t f = 0; f < sizeof suite_files / sizeof *suite_files; f++) {
            char path[512];
            snprintf(path, sizeof path, SUITE "%s", suite_files[f].file);
            json_error_t je;
            json_t *arr = json_load_file(path, 0, &je);
            CHECKF(json_is_array(arr), "%s: %s", path, je.text);
            size_t gi; json_t *grp;
            json_array_foreach(arr, gi, grp) {
                json_t *schema = json_object_get(grp, "schema"), *tests = json_object_get(grp, "tests");
                char *st = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
                char err[512];
                char *gb = jsonschema_gbnf(st, strlen(st), err, sizeof err);
                groups++;
                if (!gb) {
                    if (k == 0) printf("skipped %s \"%s\" (%zu tests): %s\n", suite_files[f].file,
                                       json_string_value(json_object_get(grp, "description")), json_array_size(tests), err);
                    skipped += (int)json_array_size(tests);
                    free(st);
                    continue;
                }
                gram *g = NULL;
                int rc = gram_compile(&g, gb, strlen(gb), err, sizeof err);
                CHECKF(rc == 0, "%s: %s: generated grammar does not compile: %s\n%s", suite_files[f].file, st, err, gb);
                size_t ti; json_t *tc;
                json_array_foreach(tests, ti, tc) {
                    if (!g) break;
                    char *data = json_dumps(json_object_get(tc, "data"), JSON_COMPACT | JSON_ENCODE_ANY);
                    int valid = json_is_true(json_object_get(tc, "valid"));
                    int r = feed_tokens(t, v, g, data, k == 0 || ti % 4 == 0, mask);
                    const char *desc = json_string_value(json_object_get(tc, "description"));
                    if (valid) {
                        CHECKF(r == 1, "%s: schema %s: valid %s (%s) gave %d", suite_files[f].file, st, data, desc, r);
                        valid_ok += r == 1;
                    } else if (suite_files[f].structural && !strstr(st, "patternProperties")) {
                        CHECKF(r == 0, "%s: schema %s: invalid %s (%s) gave %d", suite_files[f].file, st, data, desc, r);
                        invalid_rej += r == 0;
                    } else {
                        CHECK(r >= 0);
                        if (r == 0) invalid_rej++;
                        else {
                            invalid_acc_nonstruct++;
                            if (k == 0) printf("accepted (keyword not enforced) %s: schema %s: %s (%s)\n", suite_files[f].file, st, data, desc);
                        }
                    }
                    free(data);
                }
                gram_free(g);
                free(gb); free(st);
            }
            json_decref(arr);
        }
        printf("%s: %d schemas; valid accepted %d; invalid refused %d; invalid accepted where the keyword is not enforced %d; skipped %d\n",
               model_paths[k], groups, valid_ok, invalid_rej, invalid_acc_nonstruct, skipped);
        free(mask);
        gram_vocab_free(v);
        tok_free(t);
    }
}

/* minimum/maximum/exclusive*: random bounds (integers and decimals, either
 * side open, inclusive or not) and random values; a value the grammar
 * takes holds to the bounds (compared as doubles, as validators do), and a
 * value in bounds, written without exponent, is taken. */
static uint64_t nb_rng = 0x243F6A8885A308D3ull;
static uint64_t nb_next(void) { nb_rng ^= nb_rng << 13; nb_rng ^= nb_rng >> 7; nb_rng ^= nb_rng << 17; return nb_rng; }

static void rand_decimal(char *out, size_t cap, int maxfrac, int mag)
{
    long ip = (long)(nb_next() % (uint64_t)mag);
    int nf = (int)(nb_next() % (uint64_t)(maxfrac + 1));
    char fr[8] = "";
    for (int i = 0; i < nf; i++) fr[i] = (char)('0' + nb_next() % 10);
    fr[nf] = 0;
    snprintf(out, cap, "%s%ld%s%s", nb_next() % 3 == 0 ? "-" : "", ip, nf ? "." : "", fr);
}

static void test_number_bounds(void)
{
    int taken = 0, refused_out = 0, trials = 0;
    for (int t = 0; t < 400; t++) {
        int integer = t % 2;
        char lo[32], hi[32];
        rand_decimal(lo, sizeof lo, t % 4 == 1 ? 0 : 3, t % 8 < 4 ? 20 : 3000);
        rand_decimal(hi, sizeof hi, t % 4 == 3 ? 0 : 3, t % 8 < 4 ? 20 : 3000);
        int has_lo = nb_next() % 5 != 0, has_hi = nb_next() % 5 != 0;
        int xlo = (int)(nb_next() % 2), xhi = (int)(nb_next() % 2);
        double vlo = strtod(lo, NULL), vhi = strtod(hi, NULL);
        char schema[256];
        snprintf(schema, sizeof schema, "{\"type\": \"%s\"%s%s%s%s%s}", integer ? "integer" : "number",
                 has_lo ? (xlo ? ", \"exclusiveMinimum\": " : ", \"minimum\": ") : "", has_lo ? lo : "",
                 has_hi ? (xhi ? ", \"exclusiveMaximum\": " : ", \"maximum\": ") : "", has_hi ? hi : "", "");
        char err[256];
        char *gb = jsonschema_gbnf(schema, strlen(schema), err, sizeof err);
        CHECKF(gb != NULL, "%s: %s", schema, err);
        if (!gb) continue;
        gram *g = NULL;
        CHECKF(gram_compile(&g, gb, strlen(gb), err, sizeof err) == 0, "%s: %s\n%s", schema, err, gb);
        free(gb);
        if (!g) continue;
        for (int k = 0; k < 120; k++) {
            char v[48];
            if (k < 8 && (has_lo || has_hi)) {
                /* at and next to the bounds */
                const char *b = (k & 1) && has_hi ? hi : has_lo ? lo : hi;
                double d = strtod(b, NULL) + (k < 2 ? 0 : k < 4 ? 0.001 : k < 6 ? -0.001 : (k < 7 ? 1 : -1));
                snprintf(v, sizeof v, "%.3f", d);
                if (k < 2) snprintf(v, sizeof v, "%s", b);
                if (!strcmp(v, "-0.000")) strcpy(v, "0");
            } else rand_decimal(v, sizeof v, integer && k % 3 ? 0 : 4, k % 2 ? 25 : 3500);
            double x = strtod(v, NULL);
            int integral = x == floor(x);
            int ok = (!integer || integral) && (!has_lo || (xlo ? x > vlo : x >= vlo)) && (!has_hi || (xhi ? x < vhi : x <= vhi));
            int negzero = v[0] == '-' && x == 0;
            int r = matches(g, v, strlen(v));
            trials++;
            if (r == 1) { taken++; CHECKF(ok, "%s: %s taken", schema, v); }
            else if (!negzero) { CHECKF(!ok, "%s: %s refused", schema, v); refused_out += !ok; }
        }
        gram_free(g);
    }
    /* bounds that leave nothing match nothing */
    const char *none[] = { "{\"type\": \"string\", \"minLength\": 3, \"maxLength\": 2}",
                           "{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}",
                           "{\"type\": \"integer\", \"minimum\": 3, \"maximum\": 2}" };
    const char *vals[] = { "\"x\"", "\"xyz\"", "[]", "[1, 2]", "[\"x\"]", "2", "3", "x", "\"F\"" };
    for (size_t i = 0; i < 3; i++) {
        char err[256];
        char *gb = jsonschema_gbnf(none[i], strlen(none[i]), err, sizeof err);
        gram *g = NULL;
        CHECKF(gb && gram_compile(&g, gb, strlen(gb), err, sizeof err) == 0, "%s: %s", none[i], err);
        for (size_t k = 0; g && k < sizeof vals / sizeof *vals; k++)
            CHECKF(matches(g, vals[k], strlen(vals[k])) == 0, "%s takes %s", none[i], vals[k]);
        gram_free(g);
        free(gb);
    }
    printf("number bounds: %d values, %d taken, %d refused out of bounds\n", trials, taken, refused_out);
    CHECK(taken > 1000 && refused_out > 1000);
}

static void test_json_object(void)
{
    char err[256];
    gram *g = compile_str(jsonschema_object_gbnf(), err, sizeof err);
    CHECKF(g != NULL, "%s", err);
    if (!g) return;
    CHECK_EQ_INT(matches(g, "{}", 2), 1);
    CHECK_EQ_INT(matches(g, " {\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}\n", 40), 1);
    CHECK_EQ_INT(matches(g, "[]", 2), 0);
    CHECK_EQ_INT(matches(g, "{\"a\":}", 6), 0);
    gram_free(g);
    /* errors name the place in the schema */
    const char *bad[][2] = {
        { "{\"properties\": {\"a\": {\"type\": \"strin\"}}}", "at /properties/a: unknown type" },
        { "{\"$ref\": \"#/definitions/x\"}", "$ref '#/definitions/x' not found" },
        { "{\"type\": \"string\", \"pattern\": \"(?=a)\"}", "not supported" },
        { "{\"type\":", "not JSON" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        char *gb = jsonschema_gbnf(bad[i][0], strlen(bad[i][0]), err, sizeof err);
        CHECKF(!gb && strstr(err, bad[i][1]), "%s: \"%s\"", bad[i][0], err);
        free(gb);
    }
}

/* Regex and choice constraints: the whole text must match, as Python's
 * re.fullmatch says (the cases' verdicts); features outside the subset are
 * refused naming their offset. */
static void test_regex_choice(void)
{
    static const struct { const char *re, *text; int want; } cases[] = {
        { "[a-z]+@[a-z]+\\.com", "bob@ex.com", 1 }, { "[a-z]+@[a-z]+\\.com", "bob@ex.org", 0 },
        { "[a-z]+@[a-z]+\\.com", "Bob@ex.com", 0 }, { "\\d{3}-\\d{4}", "555-1234", 1 },
        { "\\d{3}-\\d{4}", "55-1234", 0 }, { "(yes|no)", "yes", 1 }, { "(yes|no)", "no", 1 },
        { "(yes|no)", "maybe", 0 }, { "yes|no", "yesno", 0 }, { "^a.c$", "abc", 1 }, { "^a.c$", "a\nc", 0 },
        { "a.c", "a\"c", 1 }, { "\"[^\"]*\"", "\"abc\"", 1 }, { "\"[^\"]*\"", "\"a\"b\"", 0 },
        { "\\w+\\s\\w+", "hello world", 1 }, { "\\w+\\s\\w+", "hello  world", 0 }, { "a{2,3}", "aa", 1 },
        { "a{2,3}", "aaaa", 0 }, { "x\\ty\\n", "x\ty\n", 1 }, { "[^0-9]+", "ab\"\\", 1 }, { "[^0-9]+", "ab1", 0 },
        { "\\D\\W", "a!", 1 }, { "\\D\\W", "1!", 0 }, { "\xc3\xa9+", "\xc3\xa9\xc3\xa9", 1 }, { "a\\\\b", "a\\b", 1 },
        { "(a|b)*c?", "", 1 }, { "(a|b)*c?", "abbac", 1 }, { "(a|b)*c?", "abcc", 0 },
    };
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *text = regex_gbnf(cases[i].re, strlen(cases[i].re), err, sizeof err);
        gram *g = text ? compile_str(text, err, sizeof err) : NULL;
        CHECKF(g != NULL, "regex %s: %s", cases[i].re, err);
        if (g) CHECKF(matches(g, cases[i].text, strlen(cases[i].text)) == cases[i].want, "regex %s on \"%s\": want %d",
                      cases[i].re, cases[i].text, cases[i].want);
        gram_free(g);
        free(text);
    }
    static const struct { const char *re; int at; } unsupported[] = {
        { "(?=a)b", 0 }, { "a\\bc", 1 }, { "(a)\\1", 3 }, { "a^b", 1 }, { "a+?", 2 }, { "[a", 0 },
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        char *text = regex_gbnf(unsupported[i].re, strlen(unsupported[i].re), err, sizeof err);
        char at[32];
        snprintf(at, sizeof at, "offset %d", unsupported[i].at);
        CHECKF(text == NULL && strstr(err, "regex") && strstr(err, at), "regex %s: %s", unsupported[i].re,
               text ? text : err);
        free(text);
    }
    const char *opts[] = { "red", "green", "blue", "a\"b\\c" };
    size_t lens[] = { 3, 5, 4, 5 };
    char *text = choice_gbnf(opts, lens, 4, err, sizeof err);
    gram *g = text ? compile_str(text, err, sizeof err) : NULL;
    CHECKF(g != NULL, "choice: %s", err);
    if (g) {
        CHECK(matches(g, "green", 5) == 1 && matches(g, "a\"b\\c", 5) == 1);
        CHECK(matches(g, "gre", 3) == 0 && matches(g, "greenblue", 9) == 0 && matches(g, "", 0) == 0);
    }
    gram_free(g);
    free(text);
    lens[1] = 0;
    text = choice_gbnf(opts, lens, 4, err, sizeof err);
    CHECK(text == NULL && strstr(err, "text 1 is empty"));
    CHECK(choice_gbnf(opts, lens, 0, err, sizeof err) == NULL);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN(test_samples);
    RUN(test_syntax);
    RUN(test_bounds);
    RUN(test_mutations);
    RUN(test_mask);
    RUN(test_mask_speed);
    RUN(test_number_bounds);
    RUN(test_json_object);
    RUN(test_regex_choice);
    RUN(test_schema_suite);
    return CHECK_DONE();
}
