/* grambench — what a JSON Schema costs per generated token, apart from the
 * forward pass: the text of a valid instance is tokenized with the model's
 * vocabulary and fed through the matcher token by token, taking the full
 * token mask before each token as the worker does.
 *
 *   grambench --model FILE --schema FILE --text FILE [--repeat R]
 *
 * Prints the trie build time, then per token the mean and the worst mask
 * time (a fresh matcher per repeat: its caches start empty). */
#include "engine/grammar/grammar.h"
#include "engine/load/gguf.h"
#include "engine/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "grambench: cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "grambench: cannot read %s\n", path); exit(1); }
    s[n] = 0;
    fclose(f);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' ')) s[--n] = 0;
    return s;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *schema = NULL, *textf = NULL;
    int repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--schema")) schema = argv[i + 1];
        else if (!strcmp(argv[i], "--text")) textf = argv[i + 1];
        else if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[i + 1]);
    }
    if (!model || !schema || !textf || repeat < 1) {
        fprintf(stderr, "usage: grambench --model FILE --schema FILE --text FILE [--repeat R]\n");
        return 1;
    }
    char err[512];
    gguf *g = NULL;
    tok *t = NULL;
    if (gguf_open(&g, model, err, sizeof err) || tok_load_gguf(&t, g, err, sizeof err)) { fprintf(stderr, "grambench: %s\n", err); return 1; }
    gguf_close(g);
    int32_t nv = tok_n_vocab(t);
    const char **p = calloc((size_t)nv, sizeof *p);
    size_t *l = calloc((size_t)nv, sizeof *l);
    for (int32_t i = 0; i < nv; i++) if (!tok_is_control(t, i) && !tok_is_eog(t, i)) p[i] = tok_piece(t, i, &l[i]);
    double t0 = now_ms();
    gram_vocab *v = gram_vocab_new(p, l, nv);
    printf("vocabulary %d tokens: trie built in %.1f ms\n", nv, now_ms() - t0);
    char *sc = slurp(schema), *text = slurp(textf);
    char *gb = jsonschema_gbnf(sc, strlen(sc), err, sizeof err);
    if (!gb) { fprintf(stderr, "grambench: %s\n", err); return 1; }
    gram *gr = NULL;
    t0 = now_ms();
    if (gram_compile(&gr, gb, strlen(gb), err, sizeof err)) { fprintf(stderr, "grambench: %s\n", err); return 1; }
    printf("schema compiled in %.2f ms (%zu rules)\n", now_ms() - t0, gram_n_rules(gr));
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(t, text, strlen(text), 0, &ids, &n, err, sizeof err)) { fprintf(stderr, "grambench: %s\n", err); return 1; }
    uint32_t *mask = malloc(((size_t)nv + 31) / 32 * sizeof *mask);
    double total = 0, worst = 0;
    for (int r = 0; r < repeat; r++) {
        gram_match *m = NULL;
        if (gram_match_new(&m, gr, err, sizeof err)) { fprintf(stderr, "grambench: %s\n", err); return 1; }
        for (size_t i = 0; i < n; i++) {
            double a = now_ms();
            int64_t c = gram_match_mask(m, v, mask, err, sizeof err);
            size_t pl;
            const char *pc = tok_piece(t, ids[i], &pl);
            int ok = c > 0 && ((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1) && gram_match_accept(m, pc, pl, err, sizeof err) == 1;
            double d = now_ms() - a;
            if (!ok) { fprintf(stderr, "grambench: token %zu (\"%.*s\") refused: the text is not valid under the schema\n", i, (int)pl, pc); return 1; }
            if (d > 200) fprintf(stderr, "slow token %zu (\"%.*s\"): %.1f ms, %lld allowed\n", i, (int)pl, pc, d, (long long)c);
            total += d;
            if (d > worst) worst = d;
        }
        if (!gram_match_can_end(m)) { fprintf(stderr, "grambench: the text is incomplete under the schema\n"); return 1; }
        gram_match_free(m);
    }
    printf("%zu tokens: mask + advance %.3f ms per token on average, worst %.2f ms\n", n, total / ((double)n * repeat), worst);
    free(mask); free(ids); free(gb); free(sc); free(text); free(p); free(l);
    gram_free(gr); gram_vocab_free(v); tok_free(t);
    return 0;
}
