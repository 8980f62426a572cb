/* tokbench — tokenizer speed: load time of tokenizer.json / GGUF vocabularies
 * and encode throughput (MB/s, one thread) on ~1 MB of mixed text built from
 * llama.cpp's tokenizer test strings plus several scripts.
 * Run from the repository root after `make fixtures`. */
#include "engine/load/gguf.h"
#include "engine/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *make_text(size_t target, size_t *len)
{
    static const char *extra[] = {
        "The quick brown fox jumps over the lazy dog. ",
        "Once upon a time, there was a little girl named Lily who loved to play outside in the sunshine.\n",
        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE6\x96\x87\xE7\xAB\xA0\xE3\x81\xA7\xE3\x81\x99\xE3\x80\x82 ",
        "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80! ",
        "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85 ",
        "int main(void) {\n    return printf(\"%d\\n\", 12345 * 678);\n}\n",
        "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xF0\x9F\x98\x80\xF0\x9F\x9A\x80 ",
    };
    FILE *f = fopen("tests/fixtures/tokenizers/llama.cpp/ggml-vocab-qwen2.gguf.inp", "rb");
    char vec[65536];
    size_t vl = 0;
    if (f) {
        vl = fread(vec, 1, sizeof vec - 1, f);
        fclose(f);
    }
    vec[vl] = 0;
    /* drop the separators */
    for (char *p; (p = strstr(vec, "__ggml_vocab_test__"));) memmove(p, p + 19, strlen(p + 19) + 1);
    vl = strlen(vec);
    char *b = malloc(target + 65536);
    size_t n = 0;
    while (n < target) {
        memcpy(b + n, vec, vl);
        n += vl;
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
            size_t l = strlen(extra[i]);
            for (int r = 0; r < 8; r++) { memcpy(b + n, extra[i], l); n += l; }
        }
    }
    b[n] = 0;
    *len = n;
    return b;
}

static tok *load_gguf(const char *path, double *ms, double *cpu_ms)
{
    char err[256];
    gguf *g = NULL;
    tok *t = NULL;
    if (gguf_open(&g, path, err, sizeof err)) { fprintf(stderr, "%s\n", err); return NULL; }
    *ms = *cpu_ms = 1e9;
    for (int r = 0; r < 3; r++) {
        tok_free(t);
        t = NULL;
        double t0 = now(), c0 = cpu_now();
        if (tok_load_gguf(&t, g, err, sizeof err)) { fprintf(stderr, "%s: %s\n", path, err); break; }
        double dt = (now() - t0) * 1e3, dc = (cpu_now() - c0) * 1e3;
        if (dt < *ms) *ms = dt;
        if (dc < *cpu_ms) *cpu_ms = dc;
    }
    gguf_close(g);
    return t;
}

static void bench_encode(const char *name, const tok *t, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char err[200];
    double best = 1e9, best_cpu = 1e9;
    for (int r = 0; r < 3; r++) {
        double t0 = now(), c0 = cpu_now();
        if (tok_encode(t, text, len, 0, &ids, &n, err, sizeof err)) { fprintf(stderr, "%s: %s\n", name, err); return; }
        double dt = now() - t0, dc = cpu_now() - c0;
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
        free(ids);
    }
    printf("encode %-24s %4.2f MB %7.1f ms %6.1f MB/s (cpu %6.1f ms %6.1f MB/s) %7zu tokens\n", name,
           (double)len / 1e6, best * 1e3, (double)len / 1e6 / best, best_cpu * 1e3, (double)len / 1e6 / best_cpu, n);
}

int main(int argc, char **argv)
{
    size_t target = argc > 1 ? (size_t)atof(argv[1]) * 1000000 : 1000000;
    size_t len;
    char *text = make_text(target, &len);

    static const char *hf[][3] = {
        { "qwen3 tokenizer.json", "bin/fixtures/hf/qwen3-tokenizer.json", "tests/fixtures/tokenizers/hf/qwen3-tokenizer_config.json" },
        { "llama3 tokenizer.json", "bin/fixtures/hf/llama3-tokenizer.json", "tests/fixtures/tokenizers/hf/llama3-tokenizer_config.json" },
    };
    for (int i = 0; i < 2; i++) {
        double best = 1e9, best_cpu = 1e9;
        tok *t = NULL;
        for (int r = 0; r < 5; r++) {
            char err[256];
            tok_free(t);
            t = NULL;
            double t0 = now(), c0 = cpu_now();
            if (tok_load_hf(&t, hf[i][1], hf[i][2], err, sizeof err)) { fprintf(stderr, "%s\n", err); break; }
            double dt = now() - t0, dc = cpu_now() - c0;
            if (dt < best) best = dt;
            if (dc < best_cpu) best_cpu = dc;
        }
        if (!t) continue;
        printf("load   %-24s %7.1f ms (cpu %.1f ms; vocab %d)\n", hf[i][0], best * 1e3, best_cpu * 1e3, tok_n_vocab(t));
        bench_encode(hf[i][0], t, text, len);
        tok_free(t);
    }
    static const char *gg[][2] = {
        { "spm llama (32k)", "tests/fixtures/tokenizers/llama.cpp/ggml-vocab-llama-spm.gguf" },
        { "spm stories260K (512)", "tests/fixtures/models/stories260K.gguf" },
        { "bpe gpt-2 (50k)", "tests/fixtures/tokenizers/llama.cpp/ggml-vocab-gpt-2.gguf" },
        { "bpe qwen2 (152k)", "bin/fixtures/vocab-qwen2.gguf" },
        { "bpe llama3 (128k)", "bin/fixtures/vocab-llama3.gguf" },
    };
    for (int i = 0; i < 5; i++) {
        double ms, cms;
        tok *t = load_gguf(gg[i][1], &ms, &cms);
        if (!t) continue;
        printf("load   %-24s %7.1f ms (cpu %.1f ms; GGUF already mapped)\n", gg[i][0], ms, cms);
        bench_encode(gg[i][0], t, text, len);
        tok_free(t);
    }
    free(text);
    return 0;
}
