/* fuzz_toolcall — the streaming tool-call parser on arbitrary replies.
 *
 * Input: one byte choosing the format and its flags, one byte seeding the
 * piece sizes, then the reply. It is parsed twice, whole and in pieces of
 * 1..16 bytes, which must give the same content, reasoning and calls. Every
 * call's arguments must be valid JSON and its name non-empty; for a valid
 * UTF-8 reply, every text piece must be whole UTF-8; TC_PLAIN (and any
 * syntax but Harmony with TC_NO_CALLS) without TC_THINK must give the reply
 * back byte for byte; TC_NO_CALLS never a call. */
#include "common/utf8.h"
#include "engine/text/toolcall.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct out {
    char *p[3];
    size_t n[3];
    FILE *f[3];   /* content, reasoning, calls */
    int valid_in;
} out;

static void piece(out *o, int k, const char *s, size_t n)
{
    if (!n) abort();   /* no empty pieces */
    if (o->valid_in && !utf8_valid(s, n, NULL)) abort();
    fwrite(s, 1, n, o->f[k]);
}
static void on_content(void *ctx, const char *s, size_t n) { piece(ctx, 0, s, n); }
static void on_reasoning(void *ctx, const char *s, size_t n) { piece(ctx, 1, s, n); }

static void on_call(void *ctx, const tc_call *c)
{
    out *o = ctx;
    if (!c->name_len || !c->id_len) abort();
    json_error_t je;
    json_t *j = json_loadb(c->arguments, c->arguments_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j && json_error_code(&je) != json_error_numeric_overflow) abort();
    json_decref(j);
    fprintf(o->f[2], "%zu:", c->name_len);
    fwrite(c->name, 1, c->name_len, o->f[2]);
    fprintf(o->f[2], "%zu:", c->arguments_len);
    fwrite(c->arguments, 1, c->arguments_len, o->f[2]);
    fwrite(c->id, 1, c->id_len, o->f[2]);
    fputc('\n', o->f[2]);
}

static void run(tc_format fmt, const char *s, size_t n, unsigned seed, int whole, out *o)
{
    for (int k = 0; k < 3; k++) {
        o->f[k] = open_memstream(&o->p[k], &o->n[k]);
        if (!o->f[k]) abort();
    }
    tc_parser *p = tc_new(fmt);
    if (!p) abort();
    tc_seed(p, 7);
    tc_callbacks cb = { on_content, on_reasoning, on_call, o };
    uint32_t r = seed * 2654435761u + 1;
    for (size_t i = 0; i < n;) {
        r = r * 1103515245u + 12345u;
        size_t k = whole ? n - i : 1 + (r >> 16) % 16;
        if (k > n - i) k = n - i;
        if (tc_feed(p, s + i, k, &cb) < 0) abort();
        i += k;
    }
    if (tc_finish(p, &cb) < 0) abort();
    tc_free(p);
    for (int k = 0; k < 3; k++) fclose(o->f[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    static const int flags[4] = { 0, TC_THINK, TC_THINK | TC_THINK_OPEN, TC_THINK_OPEN };
    tc_format fmt = (tc_format)((data[0] % 7) | flags[(data[0] >> 3) & 3] | ((data[0] >> 5) & 1 ? TC_NO_CALLS : 0));
    unsigned seed = data[1];
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    out a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.valid_in = b.valid_in = utf8_valid(s, n, NULL);
    run(fmt, s, n, seed, 1, &a);
    run(fmt, s, n, seed, 0, &b);
    for (int k = 0; k < 3; k++)
        if (a.n[k] != b.n[k] || memcmp(a.p[k], b.p[k], a.n[k])) abort();
    int plain = (fmt & TC_SYNTAX_MASK) == TC_PLAIN || ((fmt & TC_NO_CALLS) && (fmt & TC_SYNTAX_MASK) != TC_HARMONY);
    if (plain && !(fmt & TC_THINK) && (a.n[0] != n || memcmp(a.p[0], s, n))) abort();
    if ((fmt & TC_NO_CALLS) && a.n[2]) abort();   /* reasoning alone: never a call */
    for (int k = 0; k < 3; k++) { free(a.p[k]); free(b.p[k]); }
    return 0;
}
