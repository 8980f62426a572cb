/* tok_hf.c — Hugging Face tokenizer.json (+ tokenizer_config.json) loader.
 * tokenizer.json files are 10+ MB; a general-purpose JSON library takes
 * 200-300 ms on them, so this file carries a small arena-based JSON reader
 * (strict RFC 8259, depth-limited) that parses them in a few tens of ms. */
#include "common/hex.h"
#include "common/mem.h"
#include "engine/load/mfile.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tok_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON ------------------------------------------------------------- */

enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    uint8_t t;
    uint32_t n;          /* string bytes / array items / object members */
    union { const char *s; struct jv *a; double d; } u;   /* object: a[2i] key, a[2i+1] value */
} jv;

typedef struct jchunk { struct jchunk *next; size_t used, cap; char data[]; } jchunk;

typedef struct jp {
    const char *p, *end, *base;
    jchunk *chunks;
    jv *stack; size_t sn, scap;
    int depth;
    /* tokenizer.json: model.vocab and model.merges (most of the file) are
     * read straight into these lists instead of into the tree */
    int hooks, in_model;
    tok_sv *vk; int32_t *vid; size_t vn, vcap; int have_vocab;
    tok_merge *mg; size_t mn, mcap; int have_merges;
    char msg[128];
} jp;

static void *ja_alloc(jp *j, size_t n)
{
    n = (n + 7) & ~(size_t)7;
    jchunk *c = j->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ((size_t)4 << 20) ? n : ((size_t)4 << 20);
        c = malloc(sizeof(jchunk) + cap);
        if (!c) return NULL;
        c->next = j->chunks; c->used = 0; c->cap = cap;
        j->chunks = c;
    }
    void *r = c->data + c->used;
    c->used += n;
    return r;
}

static void ja_free(jp *j)
{
    for (jchunk *c = j->chunks, *nx; c; c = nx) { nx = c->next; free(c); }
    j->chunks = NULL;
    free(j->stack);
    j->stack = NULL;
    free(j->vk); free(j->vid); free(j->mg);
    j->vk = NULL; j->vid = NULL; j->mg = NULL;
}

static int jerr(jp *j, const char *what)
{
    if (!j->msg[0]) snprintf(j->msg, sizeof j->msg, "%s at byte %zu", what, (size_t)(j->p - j->base));
    return -1;
}

static void jws(jp *j)
{
    const char *p = j->p, *end = j->end;
    for (;;) {
        /* pretty-printed files are mostly indentation: skip 8 spaces at a time */
        while (end - p >= 8) {
            uint64_t v;
            memcpy(&v, p, 8);
            if (v != 0x2020202020202020ull) break;
            p += 8;
        }
        if (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) { p++; continue; }
        break;
    }
    j->p = p;
}

static int j_hex4(jp *j, const char *p, unsigned *v)
{
    if (j->end - p < 4) return -1;
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_digit(p[i]);
        if (h < 0) return -1;
        x = x * 16 + (unsigned)h;
    }
    *v = x;
    return 0;
}

/* Strings are decoded in place: the decoded form is never longer than the
 * source, so it overwrites the source and a NUL replaces the closing quote's
 * byte or one before it. The parser's buffer must be writable. */
static int j_string(jp *j, jv *out)
{
    char *p = (char *)++j->p;   /* past the quote */
    char *q = p;
    while (q < j->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
    if (q < j->end && *q == '"') {      /* fast path: no escapes */
        *q = 0;
        out->t = J_STR; out->n = (uint32_t)(q - p); out->u.s = p;
        j->p = q + 1;
        return 0;
    }
    const char *e = q;
    while (e < j->end && *e != '"') { if (*e == '\\') e++; e++; }
    if (e >= j->end) return jerr(j, "unterminated string");
    char *s = p, *o = p;
    while (p < e) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20) { j->p = p; return jerr(j, "control character in string"); }
        if (c != '\\') { *o++ = (char)c; p++; continue; }
        p++;
        switch (*p) {
        case '"': *o++ = '"'; p++; break;
        case '\\': *o++ = '\\'; p++; break;
        case '/': *o++ = '/'; p++; break;
        case 'b': *o++ = '\b'; p++; break;
        case 'f': *o++ = '\f'; p++; break;
        case 'n': *o++ = '\n'; p++; break;
        case 'r': *o++ = '\r'; p++; break;
        case 't': *o++ = '\t'; p++; break;
        case 'u': {
            unsigned cp, lo;
            if (j_hex4(j, p + 1, &cp)) { j->p = p; return jerr(j, "bad \\u escape"); }
            p += 5;
            if (cp >= 0xD800 && cp < 0xDC00) {
                if (p + 6 <= e && p[0] == '\\' && p[1] == 'u' && j_hex4(j, p + 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                } else {
                    cp = 0xFFFD;
                }
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                cp = 0xFFFD;
            }
            /* \uXXXX is 6 source bytes, at most 3 decoded; a pair 12 → 4 */
            if (cp < 0x80) *o++ = (char)cp;
            else if (cp < 0x800) { *o++ = (char)(0xC0 | (cp >> 6)); *o++ = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *o++ = (char)(0xE0 | (cp >> 12)); *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (char)(0xF0 | (cp >> 18)); *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: j->p = p; return jerr(j, "bad escape");
        }
    }
    *o = 0;
    out->t = J_STR; out->n = (uint32_t)(o - s); out->u.s = s;
    j->p = e + 1;
    return 0;
}

static int j_value(jp *j, jv *out);

static int j_push(jp *j, const jv *v)
{
    if (j->sn == j->scap) {
        size_t nc = j->scap ? j->scap * 2 : 1024;
        jv *ns = realloc(j->stack, nc * sizeof(jv));
        if (!ns) return jerr(j, "out of memory");
        j->stack = ns; j->scap = nc;
    }
    j->stack[j->sn++] = *v;
    return 0;
}

static int j_lit(jp *j, char c, const char *what)
{
    jws(j);
    if (j->p >= j->end || *j->p != c) return jerr(j, what);
    j->p++;
    return 0;
}

/* At close (after white space): consumes it, 1; else 0. */
static int j_close(jp *j, char close)
{
    jws(j);
    if (j->p < j->end && *j->p == close) { j->p++; return 1; }
    return 0;
}

/* After an item of a container that ends in close: 1 when a ',' (consumed)
 * says another follows, 0 at close (consumed), else -1 (what: the error). */
static int j_more(jp *j, char close, const char *what)
{
    jws(j);
    if (j->p < j->end && *j->p == ',') { j->p++; return 1; }
    return j_close(j, close) ? 0 : jerr(j, what);
}

static int j_vocab(jp *j)
{
    if (j_lit(j, '{', "model.vocab: expected an object")) return -1;
    for (int more = !j_close(j, '}'); more;) {
        jv k, v;
        jws(j);
        if (j->p >= j->end || *j->p != '"') return jerr(j, "model.vocab: expected a token");
        if (j_string(j, &k) || j_lit(j, ':', "expected ':'") || j_value(j, &v)) return -1;
        if (v.t != J_NUM || v.u.d < 0 || v.u.d >= (1 << 24) || v.u.d != (double)(int64_t)v.u.d)
            return jerr(j, "model.vocab: bad token id");
        if (j->vn == j->vcap) {
            size_t nc = j->vcap ? j->vcap * 2 : 65536;
            tok_sv *a = realloc(j->vk, nc * sizeof(tok_sv));
            if (a) j->vk = a;
            int32_t *b = realloc(j->vid, nc * sizeof(int32_t));
            if (b) j->vid = b;
            if (!a || !b) return jerr(j, "out of memory");
            j->vcap = nc;
        }
        j->vk[j->vn].s = k.u.s;
        j->vk[j->vn].n = k.n;
        j->vid[j->vn++] = (int32_t)v.u.d;
        if ((more = j_more(j, '}', "model.vocab: expected ',' or '}'")) < 0) return -1;
    }
    j->have_vocab = 1;
    return 0;
}

/* merges: "a b" strings or ["a", "b"] pairs */
static int j_merges(jp *j)
{
    if (j_lit(j, '[', "model.merges: expected an array")) return -1;
    for (int more = !j_close(j, ']'); more;) {
        jv a, b;
        tok_merge m;
        jws(j);
        if (j->p < j->end && *j->p == '"') {
            if (j_string(j, &a)) return -1;
            const char *sp = a.n > 1 ? memchr(a.u.s + 1, ' ', a.n - 1) : NULL;
            if (!sp) return jerr(j, "model.merges: a merge without a space");
            m.a.s = a.u.s; m.a.n = (size_t)(sp - a.u.s);
            m.b.s = sp + 1; m.b.n = a.n - m.a.n - 1;
        } else {
            if (j_lit(j, '[', "model.merges: expected a string or a pair")) return -1;
            jws(j);
            if (j->p >= j->end || *j->p != '"' || j_string(j, &a)) return jerr(j, "model.merges: expected a string");
            if (j_lit(j, ',', "model.merges: expected a pair")) return -1;
            jws(j);
            if (j->p >= j->end || *j->p != '"' || j_string(j, &b)) return jerr(j, "model.merges: expected a string");
            if (j_lit(j, ']', "model.merges: expected a pair")) return -1;
            m.a.s = a.u.s; m.a.n = a.n;
            m.b.s = b.u.s; m.b.n = b.n;
        }
        tok_merge *x = mem_grow(j->mg, &j->mcap, j->mn + 1, sizeof *x, 65536);
        if (!x) return jerr(j, "out of memory");
        j->mg = x;
        j->mg[j->mn++] = m;
        if ((more = j_more(j, ']', "model.merges: expected ',' or ']'")) < 0) return -1;
    }
    j->have_merges = 1;
    return 0;
}

static int key_is(const jv *k, const char *s) { return k->n == strlen(s) && memcmp(k->u.s, s, k->n) == 0; }

static int j_container(jp *j, jv *out, int obj)
{
    if (++j->depth > 64) return jerr(j, "nesting too deep");
    j->p++;
    size_t base = j->sn;
    char close = obj ? '}' : ']';
    for (int more = !j_close(j, close); more;) {
        jv v;
        jws(j);
        if (obj) {
            if (j->p >= j->end || *j->p != '"') return jerr(j, "expected member name");
            if (j_string(j, &v) || j_push(j, &v)) return -1;
            jws(j);
            if (j->p >= j->end || *j->p != ':') return jerr(j, "expected ':'");
            j->p++;
            if (j->hooks && j->depth == 2 && j->in_model && (key_is(&v, "vocab") || key_is(&v, "merges"))) {
                if (key_is(&v, "vocab") ? j_vocab(j) : j_merges(j)) return -1;
                v.t = J_NULL;
                if (j_push(j, &v)) return -1;
                goto next;
            }
            if (j->hooks && j->depth == 1 && key_is(&v, "model")) {
                j->in_model = 1;
                int r = j_value(j, &v);
                j->in_model = 0;
                if (r || j_push(j, &v)) return -1;
                goto next;
            }
        }
        if (j_value(j, &v) || j_push(j, &v)) return -1;
next:
        if ((more = j_more(j, close, obj ? "expected ',' or '}'" : "expected ',' or ']'")) < 0) return -1;
    }
    size_t cnt = j->sn - base;
    jv *items = ja_alloc(j, (cnt ? cnt : 1) * sizeof(jv));
    if (!items) return jerr(j, "out of memory");
    memcpy(items, j->stack + base, cnt * sizeof(jv));
    j->sn = base;
    out->t = obj ? J_OBJ : J_ARR;
    out->n = (uint32_t)(obj ? cnt / 2 : cnt);
    out->u.a = items;
    j->depth--;
    return 0;
}

static int j_value(jp *j, jv *out)
{
    jws(j);
    if (j->p >= j->end) return jerr(j, "unexpected end");
    char c = *j->p;
    if (c == '"') return j_string(j, out);
    if (c == '{') return j_container(j, out, 1);
    if (c == '[') return j_container(j, out, 0);
    if (c == 't' && j->end - j->p >= 4 && memcmp(j->p, "true", 4) == 0) { j->p += 4; out->t = J_TRUE; return 0; }
    if (c == 'f' && j->end - j->p >= 5 && memcmp(j->p, "false", 5) == 0) { j->p += 5; out->t = J_FALSE; return 0; }
    if (c == 'n' && j->end - j->p >= 4 && memcmp(j->p, "null", 4) == 0) { j->p += 4; out->t = J_NULL; return 0; }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const char *q = j->p;
        int neg = *q == '-';
        if (neg) q++;
        uint64_t v = 0;
        const char *d0 = q;
        while (q < j->end && *q >= '0' && *q <= '9' && q - d0 < 18) v = v * 10 + (uint64_t)(*q++ - '0');
        if (q > d0 && (q >= j->end || (*q != '.' && *q != 'e' && *q != 'E' && !(*q >= '0' && *q <= '9')))) {
            out->t = J_NUM;                       /* plain integer: the common case */
            out->u.d = neg ? -(double)v : (double)v;
            j->p = q;
            return 0;
        }
        q = j->p;
        char buf[64];
        while (q < j->end && (*q == '+' || *q == '-' || *q == '.' || *q == 'e' || *q == 'E' || (*q >= '0' && *q <= '9'))) q++;
        size_t k = (size_t)(q - j->p);
        if (k >= sizeof buf) k = sizeof buf - 1;   /* huge numbers: precision is irrelevant here */
        memcpy(buf, j->p, k);
        buf[k] = 0;
        char *e;
        out->t = J_NUM;
        out->u.d = strtod(buf, &e);
        if (e == buf) return jerr(j, "bad number");
        j->p = q;
        return 0;
    }
    return jerr(j, "unexpected character");
}

static int j_parse(jp *j, char *buf, size_t n, jv *root, int hooks)
{
    memset(j, 0, sizeof *j);
    j->hooks = hooks;
    j->p = j->base = buf;
    j->end = buf + n;
    if (j_value(j, root)) return -1;
    jws(j);
    if (j->p != j->end) return jerr(j, "trailing characters");
    return 0;
}

static const jv *jget(const jv *o, const char *key)
{
    if (!o || o->t != J_OBJ) return NULL;
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < o->n; i++)
        if (o->u.a[2 * i].n == kl && memcmp(o->u.a[2 * i].u.s, key, kl) == 0) return &o->u.a[2 * i + 1];
    return NULL;
}

static const char *jstr(const jv *v) { return v && v->t == J_STR ? v->u.s : NULL; }
static int jis(const jv *v, const char *s) { return v && v->t == J_STR && strcmp(v->u.s, s) == 0; }
static int jbool(const jv *v, int def) { return !v ? def : v->t == J_TRUE ? 1 : v->t == J_FALSE ? 0 : def; }

/* ---- files ------------------------------------------------------------ */

/* Regular files only, opened without blocking (mfile.h); at most 1 GiB. */
static int read_file(const char *path, int optional, char **buf, size_t *n, char *err, size_t errlen)
{
    return mf_read(path, (size_t)1 << 30, optional, buf, n, err, errlen);
}

/* ---- loader ----------------------------------------------------------- */

typedef struct hf {
    tok_sv *text;
    uint8_t *types;
    tok_merge *merges;
    int32_t n;
} hf;

static int32_t find_text(const hf *h, const char *s)
{
    if (!s) return -1;
    size_t l = strlen(s);
    for (int32_t i = h->n - 1; i >= 0; i--)   /* added tokens sit at the end */
        if (h->text[i].n == l && h->types[i] != TT_NORMAL && memcmp(h->text[i].s, s, l) == 0) return i;
    for (int32_t i = 0; i < h->n; i++)
        if (h->text[i].n == l && memcmp(h->text[i].s, s, l) == 0) return i;
    return -1;
}

/* "<tok>" or {"content": "<tok>", ...} */
static const char *token_name(const jv *v)
{
    if (!v) return NULL;
    if (v->t == J_STR) return v->u.s;
    return jstr(jget(v, "content"));
}

/* Split regex and ByteLevel options of a pre_tokenizer; -1 when unsupported. */
static int pre_tok(const jv *pt, const char **regex, int *bytelevel, int *prefix, char *err, size_t errlen)
{
    if (!pt || pt->t == J_NULL) return 0;
    const jv *ty = jget(pt, "type");
    if (jis(ty, "Sequence")) {
        const jv *l = jget(pt, "pretokenizers");
        if (!l || l->t != J_ARR) return snprintf(err, errlen, "tokenizer.json: Sequence without pretokenizers"), -1;
        for (uint32_t i = 0; i < l->n; i++)
            if (pre_tok(&l->u.a[i], regex, bytelevel, prefix, err, errlen)) return -1;
        return 0;
    }
    if (jis(ty, "ByteLevel")) {
        *bytelevel = 1;
        if (jbool(jget(pt, "add_prefix_space"), 0)) *prefix |= 1;
        if (jbool(jget(pt, "use_regex"), 1)) {
            if (*regex) return snprintf(err, errlen, "tokenizer.json: two split regexes"), -1;
            *regex = TOK_RE_GPT2;
        }
        return 0;
    }
    if (jis(ty, "Digits")) {
        if (!jbool(jget(pt, "individual_digits"), 0))
            return snprintf(err, errlen, "tokenizer.json: only Digits with individual_digits is supported"), -1;
        *prefix |= 8;
        return 0;
    }
    if (jis(ty, "Metaspace")) {
        const char *rep = jstr(jget(pt, "replacement"));
        if (rep && strcmp(rep, "\xE2\x96\x81") != 0)
            return snprintf(err, errlen, "tokenizer.json: Metaspace replacement other than U+2581"), -1;
        const char *scheme = jstr(jget(pt, "prepend_scheme"));
        int p = scheme ? (strcmp(scheme, "always") == 0 ? 1 : strcmp(scheme, "first") == 0 ? 2 : 0)
                       : jbool(jget(pt, "add_prefix_space"), 1);
        *bytelevel = -1;                 /* SentencePiece-style */
        if (p) *prefix |= p;
        if (jbool(jget(pt, "split"), 1)) *prefix |= 4;
        return 0;
    }
    if (jis(ty, "Split")) {
        const jv *pat = jget(pt, "pattern");
        const char *re = jstr(jget(pat, "Regex"));
        if (!re || !jis(jget(pt, "behavior"), "Isolated") || jbool(jget(pt, "invert"), 0))
            return snprintf(err, errlen, "tokenizer.json: only Split with a Regex, Isolated, not inverted, is supported"), -1;
        if (*regex) return snprintf(err, errlen, "tokenizer.json: two split regexes"), -1;
        *regex = re;
        return 0;
    }
    snprintf(err, errlen, "tokenizer.json: unsupported pre_tokenizer '%s'", jstr(ty) ? jstr(ty) : "?");
    return -1;
}

/* Normalizers understood: NFC; Prepend("\u2581") and Replace(" " → "\u2581")
 * as SentencePiece-style tokenizer.json files write them; a Sequence of those. */
static int normalizer(const jv *n, int *nfc, int *prepend, int *space, char *err, size_t errlen)
{
    if (!n || n->t == J_NULL) return 0;
    const jv *ty = jget(n, "type");
    if (jis(ty, "NFC")) { *nfc = 1; return 0; }
    if (jis(ty, "Sequence")) {
        const jv *l = jget(n, "normalizers");
        for (uint32_t i = 0; l && l->t == J_ARR && i < l->n; i++)
            if (normalizer(&l->u.a[i], nfc, prepend, space, err, errlen)) return -1;
        return 0;
    }
    if (jis(ty, "Prepend") && jis(jget(n, "prepend"), "\xE2\x96\x81")) { *prepend = 1; return 0; }
    if (jis(ty, "Replace") && jis(jget(jget(n, "pattern"), "String"), " ") && jis(jget(n, "content"), "\xE2\x96\x81")) {
        *space = 1;
        return 0;
    }
    snprintf(err, errlen, "tokenizer.json: unsupported normalizer '%s'", jstr(ty) ? jstr(ty) : "?");
    return -1;
}

/* BOS from a TemplateProcessing post-processor: the special token that opens "single". */
static const char *post_bos(const jv *pp)
{
    if (!pp || pp->t != J_OBJ) return NULL;
    const jv *ty = jget(pp, "type");
    if (jis(ty, "Sequence")) {
        const jv *l = jget(pp, "processors");
        for (uint32_t i = 0; l && l->t == J_ARR && i < l->n; i++) {
            const char *b = post_bos(&l->u.a[i]);
            if (b) return b;
        }
        return NULL;
    }
    if (jis(ty, "TemplateProcessing")) {
        const jv *single = jget(pp, "single");
        if (single && single->t == J_ARR && single->n > 0)
            return jstr(jget(jget(&single->u.a[0], "SpecialToken"), "id"));
    }
    return NULL;
}

int tok_load_hf(tok **out, const char *tokenizer_json, const char *tokenizer_config,
                char *err, size_t errlen)
{
    *out = NULL;
    char *buf = NULL, *cbuf = NULL, *tbuf = NULL;
    size_t blen = 0, clen = 0, tlen = 0;
    jp j, jc;
    memset(&j, 0, sizeof j);
    memset(&jc, 0, sizeof jc);
    jv root, croot = { .t = J_NULL };
    hf h = { 0 };
    int rc = -1;
    char note[160] = "";

    if (read_file(tokenizer_json, 0, &buf, &blen, err, errlen)) return -1;
    if (j_parse(&j, buf, blen, &root, 1)) { snprintf(err, errlen, "%s: %s", tokenizer_json, j.msg); goto done; }
    if (tokenizer_config) {
        if (read_file(tokenizer_config, 0, &cbuf, &clen, err, errlen)) goto done;
        if (j_parse(&jc, cbuf, clen, &croot, 0)) { snprintf(err, errlen, "%s: %s", tokenizer_config, jc.msg); goto done; }
    }
    const jv *model = jget(&root, "model");
    if (!jis(jget(model, "type"), "BPE")) {
        const char *mt = jstr(jget(model, "type"));
        snprintf(err, errlen, "%s: unsupported model type '%s' (BPE only)", tokenizer_json, mt ? mt : "?");
        goto done;
    }
    const jv *added = jget(&root, "added_tokens");
    if (!j.have_vocab || !j.have_merges) {
        snprintf(err, errlen, "%s: model.vocab / model.merges missing", tokenizer_json);
        goto done;
    }
    int64_t maxid = -1;
    for (size_t i = 0; i < j.vn; i++) if (j.vid[i] > maxid) maxid = j.vid[i];
    for (uint32_t i = 0; added && added->t == J_ARR && i < added->n; i++) {
        const jv *id = jget(&added->u.a[i], "id");
        if (!id || id->t != J_NUM || id->u.d < 0 || id->u.d >= (1 << 24) || !jstr(jget(&added->u.a[i], "content"))) {
            snprintf(err, errlen, "%s: bad added_tokens entry %u", tokenizer_json, i);
            goto done;
        }
        if ((int64_t)id->u.d > maxid) maxid = (int64_t)id->u.d;
    }
    if (maxid < 0) { snprintf(err, errlen, "%s: empty vocabulary", tokenizer_json); goto done; }
    h.n = (int32_t)maxid + 1;
    h.text = calloc((size_t)h.n, sizeof(tok_sv));
    h.types = malloc((size_t)h.n);
    if (!h.text || !h.types) { snprintf(err, errlen, "tokenizer: out of memory"); goto done; }
    memset(h.types, TT_UNUSED, (size_t)h.n);
    for (size_t i = 0; i < j.vn; i++) {
        h.text[j.vid[i]] = j.vk[i];
        h.types[j.vid[i]] = TT_NORMAL;
    }
    for (uint32_t i = 0; added && added->t == J_ARR && i < added->n; i++) {
        const jv *a = &added->u.a[i];
        const jv *c = jget(a, "content");
        int32_t id = (int32_t)jget(a, "id")->u.d;
        h.text[id].s = c->u.s;
        h.text[id].n = c->n;
        h.types[id] = jbool(jget(a, "special"), 0) ? TT_CONTROL : TT_USER;
    }
    size_t nm = j.mn;
    h.merges = j.mg;

    tok_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.type = TOK_BPE;
    sp.n_vocab = h.n;
    sp.text = h.text;
    sp.ttype = h.types;
    sp.merges = h.merges;
    sp.n_merges = nm;
    sp.ignore_merges = jbool(jget(model, "ignore_merges"), 0);
    sp.eot = sp.eom = sp.unk = -1;

    int nprepend = 0, nspace = 0;
    if (normalizer(jget(&root, "normalizer"), &sp.nfc, &nprepend, &nspace, err, errlen)) goto done;
    int bytelevel = 0, prefix = 0;
    const char *regex = NULL;
    if (pre_tok(jget(&root, "pre_tokenizer"), &regex, &bytelevel, &prefix, err, errlen)) goto done;
    if (bytelevel > 0) {
        sp.regex = regex;
        sp.add_prefix_space = prefix & 1;
        sp.split_digits = (prefix & 8) != 0;
    } else if (bytelevel < 0 || nspace) {
        /* SentencePiece-style: spaces as U+2581, merge ranks, byte fallback */
        sp.type = TOK_SPM;
        sp.add_space_prefix = bytelevel < 0 ? (prefix & 3) : nprepend;
        sp.split_words = bytelevel < 0 && (prefix & 4);
        if (sp.nfc) { snprintf(err, errlen, "%s: NFC with a SentencePiece-style model is not supported", tokenizer_json); goto done; }
        const char *unk = jstr(jget(model, "unk_token"));
        for (int32_t i = 0; i < h.n; i++) {
            const tok_sv *x = &h.text[i];
            if (h.types[i] == TT_NORMAL && x->n == 6 && memcmp(x->s, "<0x", 3) == 0 && x->s[5] == '>' &&
                hex_digit(x->s[3]) >= 0 && hex_digit(x->s[4]) >= 0)
                h.types[i] = TT_BYTE;
        }
        sp.unk = find_text(&h, unk);
        if (sp.unk >= 0 && h.types[sp.unk] == TT_NORMAL) h.types[sp.unk] = TT_UNKNOWN;
        regex = NULL;
    } else {
        snprintf(err, errlen, "%s: neither a byte-level nor a SentencePiece-style BPE", tokenizer_json);
        goto done;
    }
    if (sp.split_digits) sp.pre_name = "digits+regex";
    else if (regex == TOK_RE_GPT2 || (regex && strcmp(regex, TOK_RE_GPT2) == 0)) sp.pre_name = "gpt-2";
    else if (regex && strcmp(regex, TOK_RE_QWEN2) == 0) sp.pre_name = "qwen2";
    else if (regex && strcmp(regex, TOK_RE_LLAMA3) == 0) sp.pre_name = "llama-bpe";
    else sp.pre_name = sp.type == TOK_SPM ? "spm" : regex ? "custom" : "none";

    /* BOS / EOS / add_bos: tokenizer_config.json first, then the post-processor */
    const char *pbos = post_bos(jget(&root, "post_processor"));
    const char *cbos = token_name(jget(&croot, "bos_token"));
    const char *ceos = token_name(jget(&croot, "eos_token"));
    sp.bos = find_text(&h, cbos ? cbos : pbos);
    sp.eos = find_text(&h, ceos);
    const jv *ab = jget(&croot, "add_bos_token");
    sp.add_bos = ab && (ab->t == J_TRUE || ab->t == J_FALSE) ? ab->t == J_TRUE : pbos != NULL;
    if (sp.add_bos && pbos && !cbos) sp.bos = find_text(&h, pbos);
    const jv *ct = jget(&croot, "chat_template");
    if (ct && ct->t == J_STR) {
        sp.chat_template.s = ct->u.s; sp.chat_template.n = ct->n;
        sp.chat_template_from = "tokenizer_config.json";
    } else if (ct && ct->t == J_ARR) {     /* [{name, template}]: the "default" one */
        for (uint32_t i = 0; i < ct->n; i++) {
            const jv *tp = jget(&ct->u.a[i], "template");
            if (tp && tp->t == J_STR && (!sp.chat_template.n || jis(jget(&ct->u.a[i], "name"), "default"))) {
                sp.chat_template.s = tp->u.s; sp.chat_template.n = tp->n;
                sp.chat_template_from = "tokenizer_config.json";
            }
        }
    }
    if (!sp.chat_template.n) {
        /* newer exports keep the template beside the config: chat_template.jinja */
        const char *ref = tokenizer_config ? tokenizer_config : tokenizer_json;
        const char *slash = strrchr(ref, '/');
        size_t dl = slash ? (size_t)(slash - ref) + 1 : 0;
        char path[4096];
        if (dl + 20 < sizeof path) {
            memcpy(path, ref, dl);
            memcpy(path + dl, "chat_template.jinja", 20);
            int r = read_file(path, 1, &tbuf, &tlen, err, errlen);
            if (r < 0) goto done;
            if (r == 0) {
                sp.chat_template.s = tbuf;
                sp.chat_template.n = tlen;
                sp.chat_template_from = "chat_template.jinja";
            }
        }
    }
    sp.note = note[0] ? note : NULL;
    rc = tok_build(out, &sp, err, errlen);
done:
    free(h.text); free(h.types);
    ja_free(&j); ja_free(&jc);
    free(buf); free(cbuf); free(tbuf);
    return rc;
}
