/* fuzz_gguf — the GGUF reader and the model loader on arbitrary files.
 *
 * The bytes go into a memfd, opened by path (/proc/self/fd/N) exactly as a
 * user's file would be. gguf_open must validate or reject; after a
 * successful open every accessor is walked. Then model_load runs on the same
 * file: it must reject cleanly or give a model whose tokenizer and weight
 * rows can be used. */
#include "engine/load/gguf.h"
#include "engine/load/model.h"
#include "engine/text/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64];

static void walk_gguf(const gguf *g)
{
    volatile double sink = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        char key[256];
        size_t n = kv->key.n < sizeof key - 1 ? (size_t)kv->key.n : sizeof key - 1;
        memcpy(key, kv->key.s, n);
        key[n] = 0;
        if (!memchr(key, 0, n) && gguf_get(g, key) == NULL && n == kv->key.n) abort();
        uint64_t u; int64_t s; double f; int b; gguf_str str;
        if (gguf_get_u64(g, key, &u) == 0) sink += (double)u;
        if (gguf_get_i64(g, key, &s) == 0) sink += (double)s;
        if (gguf_get_f64(g, key, &f) == 0) sink += f;
        if (gguf_get_bool(g, key, &b) == 0) sink += b;
        if (gguf_get_str(g, key, &str) == 0 && str.n) sink += (unsigned char)str.s[str.n - 1];
        if (kv->type != GGUF_T_ARRAY) continue;
        for (uint64_t k = 0; k < kv->arr_n && k < 64; k++) {
            uint64_t j = k < 32 ? k : kv->arr_n - 1 - (k - 32);
            if (kv->arr_type == GGUF_T_STRING) {
                gguf_str e = gguf_arr_str(kv, j);
                if (e.n) sink += (unsigned char)e.s[e.n - 1];
            } else if (kv->arr_type != GGUF_T_ARRAY) {
                sink += gguf_arr_f64(kv, j) + (double)gguf_arr_i64(kv, j);
            }
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (t->nbytes) {
            const uint8_t *p = t->data;
            sink += p[0] + p[t->nbytes - 1];   /* inside the mapping */
        }
        char name[256];
        size_t n = t->name.n < sizeof name - 1 ? (size_t)t->name.n : sizeof name - 1;
        memcpy(name, t->name.s, n);
        name[n] = 0;
        (void)gguf_tensor_find(g, name);
    }
    (void)sink;
}

static void use_model(model *m)
{
    static const char text[] = "Hello world! <s> \xe2\x96\x81x 123";
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256];
    for (int special = 0; special < 2; special++) {
        if (tok_encode(m->tok, text, sizeof text - 1, special, &ids, &n, err, sizeof err) == 0) {
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= tok_n_vocab(m->tok)) abort();
            char *out = NULL;
            size_t len = 0;
            if (tok_decode(m->tok, ids, n, &out, &len) == 0) free(out);
        }
        free(ids);
        ids = NULL;
    }
    if (m->tokenizer_only || !m->tok_embd.data) return;
    int64_t cols = m->tok_embd.n_in;
    if (cols <= 0 || cols > (1 << 20)) return;
    float *row = malloc((size_t)cols * sizeof *row);
    if (!row) return;
    wt_row_f32(&m->tok_embd, 0, row);
    wt_row_f32(&m->tok_embd, m->tok_embd.n_out - 1, row);
    free(row);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memfd < 0) {
        memfd = memfd_create("fuzz_gguf", MFD_CLOEXEC);
        if (memfd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    if (fuzz_write_fd(memfd, data, size)) abort();
    char err[512];
    gguf *g = NULL;
    if (gguf_open(&g, path, err, sizeof err) == 0) {
        walk_gguf(g);
        gguf_close(g);
        model *m = NULL;
        if (model_load(&m, path, err, sizeof err) == 0) {
            use_model(m);
            model_free(m);
        } else if (!err[0]) {
            abort();   /* a rejection must say why */
        }
    } else if (!err[0]) {
        abort();
    }
    return 0;
}
