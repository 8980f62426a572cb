/* t_pretok.c — the pre-tokenizer's split regex on hostile text.
 *
 * The built-in patterns (gpt-2, qwen2, llama-bpe) have no nested
 * quantifiers: every position matches one alternative after a scan of at
 * most its own run, so 64 KiB runs of every character class split without
 * a PCRE2 limit. A custom pattern from tokenizer.json may be worse:
 *  - a repeated group outgrows the JIT's default 32 KiB stack after a few
 *    thousand iterations: the tokenizer retries on a larger stack, and the
 *    ids equal those of the same split written without the group;
 *  - nested quantifiers ("(?:\p{L}+)+$") hit PCRE2's match limit: the
 *    failure is TOK_ELIMIT ("the split regex gave up"), never an invalid-
 *    UTF-8 error, and the tokenizer keeps working. */
#include "engine/load/gguf.h"
#include "engine/text/tokenizer.h"
#include "tests/check.h"

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* GPT-2's byte -> code point map of byte-level BPE. */
static unsigned byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) n++;
    return 256 + n;
}

/* A byte-level tokenizer.json: the 256 bytes, "aa", "aaaa", "\u0120a" (space
 * + a) and their merges, split by regex (JSON-escaped by the caller). */
static tok *load_regex_tok(const char *regex_json)
{
    char path[] = "/tmp/t_pretok.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) { close(fd); unlink(path); return NULL; }
    fprintf(f, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (unsigned b = 0; b < 256; b++) fprintf(f, "\"\\u%04x\": %u, ", byte_cp(b), b);
    fprintf(f, "\"aa\": 256, \"aaaa\": 257, \"\\u0120a\": 258}, "
               "\"merges\": [\"a a\", \"aa aa\", \"\\u0120 a\"]}, "
               "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
               "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
               "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}}\n", regex_json);
    fclose(f);
    tok *t = NULL;
    char err[256];
    if (tok_load_hf(&t, path, NULL, err, sizeof err)) fprintf(stderr, "%s: %s\n", path, err);
    unlink(path);
    return t;
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

/* unit repeated to about n bytes, then tail */
static char *runs(const char *unit, size_t n, const char *tail, size_t *len)
{
    size_t ul = strlen(unit), tl = strlen(tail), k = n / ul;
    char *s = malloc(k * ul + tl + 1);
    if (!s) return NULL;
    for (size_t i = 0; i < k; i++) memcpy(s + i * ul, unit, ul);
    memcpy(s + k * ul, tail, tl + 1);
    *len = k * ul + tl;
    return s;
}

static void t_builtin_hostile(void)
{
    static const char *const paths[] = {
        "tests/fixtures/tokenizers/llama.cpp/ggml-vocab-gpt-2.gguf",   /* gpt-2 */
        "bin/fixtures/vocab-qwen2.gguf",                              /* qwen2 */
        "bin/fixtures/vocab-llama3.gguf",                             /* llama-bpe */
    };
    static const char *const units[] = {
        " ", "\t", " \t", "\n", " \n", "\r\n", "\n\n ", "  \n", "1", "!", " !", "'", "'s", "a'",
        "\xc2\xa0", "\xcc\x81", "a\xcc\x81", "\xe3\x80\x80", "\xe2\x80\xa8", "\xd9\xa0", "\xf0\x9f\x98\x80",
    };
    static const char *const tails[] = { "", "a", "!" };
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        tok *t = load_gguf_tok(paths[p]);
        CHECKF(t != NULL, "%s", paths[p]);
        if (!t) continue;
        int bad = 0;
        for (size_t u = 0; u < sizeof units / sizeof units[0]; u++)
            for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) {
                size_t len;
                char *s = runs(units[u], 64 << 10, tails[k], &len);
                int32_t *ids = NULL;
                size_t n = 0;
                char err[256];
                int rc = s ? tok_encode(t, s, len, 0, &ids, &n, err, sizeof err) : TOK_ENOMEM;
                if (rc != 0 || n == 0) {
                    bad++;
                    fprintf(stderr, "%s: 64 KiB of unit %zu, tail %zu: rc %d: %s\n", tok_pre_name(t), u, k, rc, err);
                }
                free(ids);
                free(s);
            }
        CHECKF(bad == 0, "%s (%s): %d hostile texts failed", paths[p], tok_pre_name(t), bad);
        tok_free(t);
    }
}

static void t_jit_stack(void)
{
    /* the same split, once as a repeated group (deep JIT stack), once as a class */
    tok *g = load_regex_tok("(?:\\\\p{L}|\\\\p{M})+|\\\\s+|[^\\\\s\\\\p{L}\\\\p{M}]+");
    tok *c = load_regex_tok("[\\\\p{L}\\\\p{M}]+|\\\\s+|[^\\\\s\\\\p{L}\\\\p{M}]+");
    CHECK(g && c);
    if (!g || !c) { tok_free(g); tok_free(c); return; }
    static const char *const units[] = { "a", "a\xcc\x81", "aaaa a", "ab,", " a" };
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t len;
        char *s = runs(units[u], 256 << 10, "!", &len);
        int32_t *x = NULL, *y = NULL;
        size_t nx = 0, ny = 0;
        char err[256] = "";
        int rx = tok_encode(g, s, len, 0, &x, &nx, err, sizeof err);
        CHECKF(rx == 0, "unit %zu through a repeated group: rc %d: %s", u, rx, err);
        int ry = tok_encode(c, s, len, 0, &y, &ny, err, sizeof err);
        CHECKF(ry == 0, "unit %zu through a class: rc %d: %s", u, ry, err);
        CHECKF(rx == 0 && ry == 0 && nx == ny && memcmp(x, y, nx * sizeof *x) == 0,
               "unit %zu: the group and the class split differently (%zu vs %zu ids)", u, nx, ny);
        free(x); free(y); free(s);
    }
    /* merges happen inside split words only: "aaaa" whole, " a" apart */
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256];
    CHECK(tok_encode(g, "aaaa a", 6, 0, &ids, &n, err, sizeof err) == 0 && n == 3
          && ids[0] == 257 && ids[1] == ' ' && ids[2] == 'a');
    free(ids);
    tok_free(g);
    tok_free(c);
}

static void t_match_limit(void)
{
    tok *t = load_regex_tok("(?:\\\\p{L}+)+$|\\\\s+|.");
    CHECK(t != NULL);
    if (!t) return;
    char s[64];
    memset(s, 'a', 40);
    memcpy(s + 40, "!", 2);
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256] = "";
    int rc = tok_encode(t, s, 41, 0, &ids, &n, err, sizeof err);
    CHECKF(rc == TOK_ELIMIT && ids == NULL && strstr(err, "split regex") && strstr(err, "limit"),
           "catastrophic backtracking: rc %d: %s", rc, err);
    free(ids);
    /* the same tokenizer still serves ordinary text (no trailing letters run into the limit) */
    rc = tok_encode(t, "hi there, you", 13, 0, &ids, &n, err, sizeof err);
    CHECKF(rc == 0 && n > 0, "ordinary text after a limit: rc %d: %s", rc, err);
    free(ids);
    /* invalid UTF-8 is still its own failure */
    rc = tok_encode(t, "a\xff", 2, 0, &ids, &n, err, sizeof err);
    CHECK(rc == TOK_EUTF8);
    free(ids);
    tok_free(t);
}

int main(void)
{
    RUN(t_builtin_hostile);
    RUN(t_jit_stack);
    RUN(t_match_limit);
    return CHECK_DONE();
}
