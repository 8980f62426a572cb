/* jinja_str.c — Python's str for templates: the methods the sandbox allows
 * (split, strip, startswith, replace, format, ...), case mapping over
 * Unicode (utf8proc), and Markup's escaping versions of them. Indexes and
 * lengths count code points, as Python's do. */
#include "engine/text/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>
#include <utf8proc.h>


/* ---- argument binding ---- */

int64_t jbind(jctx *c, const char *fn, jargs *a, const char *const *names, int n, val *out)
{
    for (int i = 0; i < n; i++) out[i] = vundef0();
    if (a->n > n) jfail(c, JE_TYPE, "%s() takes at most %d argument%s (%d given)", fn, n, n == 1 ? "" : "s", a->n);
    for (int i = 0; i < a->n; i++) out[i] = a->v[i];
    for (int k = 0; k < a->nk; k++) {
        int i;
        for (i = 0; i < n; i++)
            if (!strcmp(names[i], a->kn[k]->s)) break;
        if (i == n) jfail(c, JE_TYPE, "%s() got an unexpected keyword argument '%s'", fn, a->kn[k]->s);
        if (given(out[i])) jfail(c, JE_TYPE, "%s() got multiple values for argument '%s'", fn, names[i]);
        out[i] = a->kv[k];
    }
    return 0;
}

static jstr *want_str(jctx *c, val v, const char *what)
{
    if (v.t != JT_STR) jfail(c, JE_TYPE, "%s must be str, not %s", what, jtype_name(v));
    return S(v);
}

int64_t jwant_int(jctx *c, val v, const char *what)
{
    if (v.t != JT_INT && v.t != JT_BOOL)
        jfail(c, JE_TYPE, "'%s' object cannot be interpreted as an integer (%s)", jtype_name(v), what);
    return v.i;
}

/* ---- code points ---- */

typedef struct cps { uint32_t *v; size_t n; size_t *off; jobj *blob; } cps;

/* the string as code points (and their byte offsets, off[n] = len) */
static void cps_of(jctx *c, jstr *s, cps *o)
{
    size_t n = (size_t)jstr_nchars(s);
    o->blob = jalloc(c, O_STR, sizeof(jstr) + (n + 1) * (sizeof(uint32_t) + sizeof(size_t)) + 16);
    char *p = ((jstr *)o->blob)->s;
    o->off = (size_t *)p;
    o->v = (uint32_t *)(p + (n + 1) * sizeof(size_t));
    o->n = n;
    size_t i = 0, k = 0;
    while (i < s->len) {
        o->off[k] = i;
        i += (size_t)utf8_dec(s->s + i, s->len - i, &o->v[k]);
        k++;
    }
    o->off[n] = s->len;
    jcharge(c, s->len);
}

static void cps_free(jctx *c, cps *o) { jobj_unref(c, o->blob); }

static int cased_lower(uint32_t cp) { return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_LL; }
static int cased_upper(uint32_t cp)
{
    int k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT;
}
static int is_cased(uint32_t cp) { return cased_lower(cp) || cased_upper(cp); }

int py_isalnum_cp(uint32_t cp)
{
    switch ((int)utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return 1;
    }
    return 0;
}

static void put_cp(jctx *c, jbuf *b, uint32_t cp)
{
    char tmp[4];
    jbuf_put(c, b, tmp, utf8_enc(cp, tmp));
}

/* Python's full case mappings (SpecialCasing) where they differ from the one-to-one ones: upper, lower, title */
static const struct { uint32_t cp; const char *upper, *lower, *title; } special_case[] = {
    { 0x00df, "\x53\x53", NULL, "\x53\x73" },
    { 0x0130, NULL, "\x69\xcc\x87", NULL },
    { 0x0149, "\xca\xbc\x4e", NULL, "\xca\xbc\x4e" },
    { 0x01f0, "\x4a\xcc\x8c", NULL, "\x4a\xcc\x8c" },
    { 0x0390, "\xce\x99\xcc\x88\xcc\x81", NULL, "\xce\x99\xcc\x88\xcc\x81" },
    { 0x03b0, "\xce\xa5\xcc\x88\xcc\x81", NULL, "\xce\xa5\xcc\x88\xcc\x81" },
    { 0x0587, "\xd4\xb5\xd5\x92", NULL, "\xd4\xb5\xd6\x82" },
    { 0x1e96, "\x48\xcc\xb1", NULL, "\x48\xcc\xb1" },
    { 0x1e97, "\x54\xcc\x88", NULL, "\x54\xcc\x88" },
    { 0x1e98, "\x57\xcc\x8a", NULL, "\x57\xcc\x8a" },
    { 0x1e99, "\x59\xcc\x8a", NULL, "\x59\xcc\x8a" },
    { 0x1e9a, "\x41\xca\xbe", NULL, "\x41\xca\xbe" },
    { 0x1f50, "\xce\xa5\xcc\x93", NULL, "\xce\xa5\xcc\x93" },
    { 0x1f52, "\xce\xa5\xcc\x93\xcc\x80", NULL, "\xce\xa5\xcc\x93\xcc\x80" },
    { 0x1f54, "\xce\xa5\xcc\x93\xcc\x81", NULL, "\xce\xa5\xcc\x93\xcc\x81" },
    { 0x1f56, "\xce\xa5\xcc\x93\xcd\x82", NULL, "\xce\xa5\xcc\x93\xcd\x82" },
    { 0x1f80, "\xe1\xbc\x88\xce\x99", NULL, NULL },
    { 0x1f81, "\xe1\xbc\x89\xce\x99", NULL, NULL },
    { 0x1f82, "\xe1\xbc\x8a\xce\x99", NULL, NULL },
    { 0x1f83, "\xe1\xbc\x8b\xce\x99", NULL, NULL },
    { 0x1f84, "\xe1\xbc\x8c\xce\x99", NULL, NULL },
    { 0x1f85, "\xe1\xbc\x8d\xce\x99", NULL, NULL },
    { 0x1f86, "\xe1\xbc\x8e\xce\x99", NULL, NULL },
    { 0x1f87, "\xe1\xbc\x8f\xce\x99", NULL, NULL },
    { 0x1f88, "\xe1\xbc\x88\xce\x99", NULL, NULL },
    { 0x1f89, "\xe1\xbc\x89\xce\x99", NULL, NULL },
    { 0x1f8a, "\xe1\xbc\x8a\xce\x99", NULL, NULL },
    { 0x1f8b, "\xe1\xbc\x8b\xce\x99", NULL, NULL },
    { 0x1f8c, "\xe1\xbc\x8c\xce\x99", NULL, NULL },
    { 0x1f8d, "\xe1\xbc\x8d\xce\x99", NULL, NULL },
    { 0x1f8e, "\xe1\xbc\x8e\xce\x99", NULL, NULL },
    { 0x1f8f, "\xe1\xbc\x8f\xce\x99", NULL, NULL },
    { 0x1f90, "\xe1\xbc\xa8\xce\x99", NULL, NULL },
    { 0x1f91, "\xe1\xbc\xa9\xce\x99", NULL, NULL },
    { 0x1f92, "\xe1\xbc\xaa\xce\x99", NULL, NULL },
    { 0x1f93, "\xe1\xbc\xab\xce\x99", NULL, NULL },
    { 0x1f94, "\xe1\xbc\xac\xce\x99", NULL, NULL },
    { 0x1f95, "\xe1\xbc\xad\xce\x99", NULL, NULL },
    { 0x1f96, "\xe1\xbc\xae\xce\x99", NULL, NULL },
    { 0x1f97, "\xe1\xbc\xaf\xce\x99", NULL, NULL },
    { 0x1f98, "\xe1\xbc\xa8\xce\x99", NULL, NULL },
    { 0x1f99, "\xe1\xbc\xa9\xce\x99", NULL, NULL },
    { 0x1f9a, "\xe1\xbc\xaa\xce\x99", NULL, NULL },
    { 0x1f9b, "\xe1\xbc\xab\xce\x99", NULL, NULL },
    { 0x1f9c, "\xe1\xbc\xac\xce\x99", NULL, NULL },
    { 0x1f9d, "\xe1\xbc\xad\xce\x99", NULL, NULL },
    { 0x1f9e, "\xe1\xbc\xae\xce\x99", NULL, NULL },
    { 0x1f9f, "\xe1\xbc\xaf\xce\x99", NULL, NULL },
    { 0x1fa0, "\xe1\xbd\xa8\xce\x99", NULL, NULL },
    { 0x1fa1, "\xe1\xbd\xa9\xce\x99", NULL, NULL },
    { 0x1fa2, "\xe1\xbd\xaa\xce\x99", NULL, NULL },
    { 0x1fa3, "\xe1\xbd\xab\xce\x99", NULL, NULL },
    { 0x1fa4, "\xe1\xbd\xac\xce\x99", NULL, NULL },
    { 0x1fa5, "\xe1\xbd\xad\xce\x99", NULL, NULL },
    { 0x1fa6, "\xe1\xbd\xae\xce\x99", NULL, NULL },
    { 0x1fa7, "\xe1\xbd\xaf\xce\x99", NULL, NULL },
    { 0x1fa8, "\xe1\xbd\xa8\xce\x99", NULL, NULL },
    { 0x1fa9, "\xe1\xbd\xa9\xce\x99", NULL, NULL },
    { 0x1faa, "\xe1\xbd\xaa\xce\x99", NULL, NULL },
    { 0x1fab, "\xe1\xbd\xab\xce\x99", NULL, NULL },
    { 0x1fac, "\xe1\xbd\xac\xce\x99", NULL, NULL },
    { 0x1fad, "\xe1\xbd\xad\xce\x99", NULL, NULL },
    { 0x1fae, "\xe1\xbd\xae\xce\x99", NULL, NULL },
    { 0x1faf, "\xe1\xbd\xaf\xce\x99", NULL, NULL },
    { 0x1fb2, "\xe1\xbe\xba\xce\x99", NULL, "\xe1\xbe\xba\xcd\x85" },
    { 0x1fb3, "\xce\x91\xce\x99", NULL, NULL },
    { 0x1fb4, "\xce\x86\xce\x99", NULL, "\xce\x86\xcd\x85" },
    { 0x1fb6, "\xce\x91\xcd\x82", NULL, "\xce\x91\xcd\x82" },
    { 0x1fb7, "\xce\x91\xcd\x82\xce\x99", NULL, "\xce\x91\xcd\x82\xcd\x85" },
    { 0x1fbc, "\xce\x91\xce\x99", NULL, NULL },
    { 0x1fc2, "\xe1\xbf\x8a\xce\x99", NULL, "\xe1\xbf\x8a\xcd\x85" },
    { 0x1fc3, "\xce\x97\xce\x99", NULL, NULL },
    { 0x1fc4, "\xce\x89\xce\x99", NULL, "\xce\x89\xcd\x85" },
    { 0x1fc6, "\xce\x97\xcd\x82", NULL, "\xce\x97\xcd\x82" },
    { 0x1fc7, "\xce\x97\xcd\x82\xce\x99", NULL, "\xce\x97\xcd\x82\xcd\x85" },
    { 0x1fcc, "\xce\x97\xce\x99", NULL, NULL },
    { 0x1fd2, "\xce\x99\xcc\x88\xcc\x80", NULL, "\xce\x99\xcc\x88\xcc\x80" },
    { 0x1fd3, "\xce\x99\xcc\x88\xcc\x81", NULL, "\xce\x99\xcc\x88\xcc\x81" },
    { 0x1fd6, "\xce\x99\xcd\x82", NULL, "\xce\x99\xcd\x82" },
    { 0x1fd7, "\xce\x99\xcc\x88\xcd\x82", NULL, "\xce\x99\xcc\x88\xcd\x82" },
    { 0x1fe2, "\xce\xa5\xcc\x88\xcc\x80", NULL, "\xce\xa5\xcc\x88\xcc\x80" },
    { 0x1fe3, "\xce\xa5\xcc\x88\xcc\x81", NULL, "\xce\xa5\xcc\x88\xcc\x81" },
    { 0x1fe4, "\xce\xa1\xcc\x93", NULL, "\xce\xa1\xcc\x93" },
    { 0x1fe6, "\xce\xa5\xcd\x82", NULL, "\xce\xa5\xcd\x82" },
    { 0x1fe7, "\xce\xa5\xcc\x88\xcd\x82", NULL, "\xce\xa5\xcc\x88\xcd\x82" },
    { 0x1ff2, "\xe1\xbf\xba\xce\x99", NULL, "\xe1\xbf\xba\xcd\x85" },
    { 0x1ff3, "\xce\xa9\xce\x99", NULL, NULL },
    { 0x1ff4, "\xce\x8f\xce\x99", NULL, "\xce\x8f\xcd\x85" },
    { 0x1ff6, "\xce\xa9\xcd\x82", NULL, "\xce\xa9\xcd\x82" },
    { 0x1ff7, "\xce\xa9\xcd\x82\xce\x99", NULL, "\xce\xa9\xcd\x82\xcd\x85" },
    { 0x1ffc, "\xce\xa9\xce\x99", NULL, NULL },
    { 0xfb00, "\x46\x46", NULL, "\x46\x66" },
    { 0xfb01, "\x46\x49", NULL, "\x46\x69" },
    { 0xfb02, "\x46\x4c", NULL, "\x46\x6c" },
    { 0xfb03, "\x46\x46\x49", NULL, "\x46\x66\x69" },
    { 0xfb04, "\x46\x46\x4c", NULL, "\x46\x66\x6c" },
    { 0xfb05, "\x53\x54", NULL, "\x53\x74" },
    { 0xfb06, "\x53\x54", NULL, "\x53\x74" },
    { 0xfb13, "\xd5\x84\xd5\x86", NULL, "\xd5\x84\xd5\xb6" },
    { 0xfb14, "\xd5\x84\xd4\xb5", NULL, "\xd5\x84\xd5\xa5" },
    { 0xfb15, "\xd5\x84\xd4\xbb", NULL, "\xd5\x84\xd5\xab" },
    { 0xfb16, "\xd5\x8e\xd5\x86", NULL, "\xd5\x8e\xd5\xb6" },
    { 0xfb17, "\xd5\x84\xd4\xbd", NULL, "\xd5\x84\xd5\xad" },
};

/* which: 0 upper, 1 lower, 2 title; the special mapping or NULL */
static const char *special(uint32_t cp, int which)
{
    if (cp < 0xdf) return NULL;
    size_t lo = 0, hi = sizeof special_case / sizeof *special_case;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (special_case[m].cp == cp)
            return which == 0 ? special_case[m].upper : which == 1 ? special_case[m].lower : special_case[m].title;
        if (special_case[m].cp < cp) lo = m + 1;
        else hi = m;
    }
    return NULL;
}

static void put_upper(jctx *c, jbuf *b, uint32_t cp)
{
    const char *x = special(cp, 0);
    if (x) jbuf_put(c, b, x, strlen(x));
    else put_cp(c, b, (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp));
}

static void put_title(jctx *c, jbuf *b, uint32_t cp)
{
    const char *x = special(cp, 2);
    if (x) jbuf_put(c, b, x, strlen(x));
    else put_cp(c, b, (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp));
}

static int case_ignorable(uint32_t cp)
{
    if (cp == '\'' || cp == '.' || cp == ':' || cp == 0xAD || cp == 0x2019 || cp == 0xB7) return 1;
    switch ((int)utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
        return 1;
    }
    return 0;
}

/* Python lowers a capital sigma to the final form at the end of a word:
 * after a cased letter and before none (case-ignorable characters skipped) */
static int final_sigma(const char *s, size_t n, size_t from, size_t at, size_t k)
{
    int before = 0, after = 0;
    for (size_t p = at; p > from;) {
        size_t q = p - 1;
        while (q > from && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
        uint32_t cp;
        utf8_dec(s + q, p - q, &cp);
        p = q;
        if (case_ignorable(cp)) continue;
        before = is_cased(cp);
        break;
    }
    for (size_t p = at + k; p < n;) {
        uint32_t cp;
        p += (size_t)utf8_dec(s + p, n - p, &cp);
        if (case_ignorable(cp)) continue;
        after = is_cased(cp);
        break;
    }
    return before && !after;
}

static void put_lower_at(jctx *c, jbuf *b, uint32_t cp, const jstr *s, size_t from, size_t at, size_t k)
{
    if (cp == 0x3A3 && final_sigma(s->s, s->len, from, at, k)) { put_cp(c, b, 0x3C2); return; }
    const char *x = special(cp, 1);
    if (x) jbuf_put(c, b, x, strlen(x));
    else put_cp(c, b, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
}

val jcase(jctx *c, jstr *s, int mode)
{
    jbuf b;
    jbuf_init(c, &b);
    int prev_cased = 0, first = 1, word_start = 1;
    size_t from = 0;   /* the title filter lowers each word's tail on its own */
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        size_t k = (size_t)utf8_dec(s->s + i, s->len - i, &cp);
        switch (mode) {
        case CASE_LOWER: if (cp < 0x80) jbuf_putc(c, &b, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp)); else put_lower_at(c, &b, cp, s, from, i, k); break;
        case CASE_UPPER: if (cp < 0x80) jbuf_putc(c, &b, (char)(cp >= 'a' && cp <= 'z' ? cp - 32 : cp)); else put_upper(c, &b, cp); break;
        case CASE_CAPITALIZE: if (first) put_title(c, &b, cp); else put_lower_at(c, &b, cp, s, from, i, k); break;
        case CASE_SWAP:
            if (cased_lower(cp)) put_upper(c, &b, cp);
            else if (utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_LU) put_lower_at(c, &b, cp, s, from, i, k);
            else put_cp(c, &b, cp);
            break;
        case CASE_TITLE:
            /* str.title(): a cased character after an uncased one starts a word */
            if (is_cased(cp)) {
                if (prev_cased) put_lower_at(c, &b, cp, s, from, i, k); else put_title(c, &b, cp);
                prev_cased = 1;
            } else {
                put_cp(c, &b, cp);
                prev_cased = 0;
            }
            break;
        case CASE_TITLE_JINJA:
            /* jinja2's title filter: words begin after runs of -, whitespace, ( { [ < */
            if (cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp)) {
                put_cp(c, &b, cp);
                word_start = 1;
            } else {
                if (word_start) { put_upper(c, &b, cp); from = i + k; }
                else put_lower_at(c, &b, cp, s, from, i, k);
                word_start = 0;
            }
            break;
        }
        first = 0;
        i += k;
    }
    return jbuf_take(c, &b);
}

static int in_set(uint32_t cp, const jstr *chars)
{
    if (!chars) return py_isspace(cp);
    for (size_t i = 0; i < chars->len;) {
        uint32_t x;
        i += (size_t)utf8_dec(chars->s + i, chars->len - i, &x);
        if (x == cp) return 1;
    }
    return 0;
}

val jstrip(jctx *c, jstr *s, const jstr *chars, int left, int right)
{
    size_t a = 0, b = s->len;
    if (left)
        while (a < b) {
            uint32_t cp;
            size_t k = (size_t)utf8_dec(s->s + a, b - a, &cp);
            if (!in_set(cp, chars)) break;
            a += k;
        }
    if (right)
        while (b > a) {
            size_t q = b - 1;
            while (q > a && ((unsigned char)s->s[q] & 0xC0) == 0x80) q--;
            uint32_t cp;
            utf8_dec(s->s + q, b - q, &cp);
            if (!in_set(cp, chars)) break;
            b = q;
        }
    jcharge(c, s->len);
    return vstr(c, s->s + a, b - a);
}

val jreplace(jctx *c, jstr *s, jstr *old, jstr *rep, int64_t count)
{
    jbuf b;
    jbuf_init(c, &b);
    if (old->len == 0) {
        /* an empty pattern matches between every code point */
        int64_t done = 0;
        size_t i = 0;
        for (;;) {
            if (count < 0 || done < count) { jbuf_put(c, &b, rep->s, rep->len); done++; }
            if (i >= s->len) break;
            uint32_t cp;
            size_t k = (size_t)utf8_dec(s->s + i, s->len - i, &cp);
            jbuf_put(c, &b, s->s + i, k);
            i += k;
        }
        return jbuf_take(c, &b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s->len) {
        const char *hit = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!hit) { jbuf_put(c, &b, s->s + i, s->len - i); break; }
        size_t h = (size_t)(hit - s->s);
        jbuf_put(c, &b, s->s + i, h - i);
        jbuf_put(c, &b, rep->s, rep->len);
        i = h + old->len;
        done++;
    }
    jcharge(c, s->len);
    return jbuf_take(c, &b);
}

/* ---- split ---- */

static val split_ws(jctx *c, jstr *s, int64_t maxsplit, int from_right)
{
    jlist *r = jlist_new(c, L_LIST, 0);
    val rv = vlist(r);
    cps p;
    cps_of(c, s, &p);
    if (!from_right) {
        size_t i = 0;
        while (i < p.n) {
            while (i < p.n && py_isspace(p.v[i])) i++;
            if (i >= p.n) break;
            if (maxsplit >= 0 && (int64_t)r->n == maxsplit) {
                size_t e = p.n;
                while (e > i && py_isspace(p.v[e - 1])) e--;
                jlist_push(c, r, vstr(c, s->s + p.off[i], p.off[e] - p.off[i]));
                break;
            }
            size_t j = i;
            while (j < p.n && !py_isspace(p.v[j])) j++;
            jlist_push(c, r, vstr(c, s->s + p.off[i], p.off[j] - p.off[i]));
            i = j;
        }
    } else {
        /* collected right to left, then reversed */
        size_t i = p.n;
        while (i > 0) {
            while (i > 0 && py_isspace(p.v[i - 1])) i--;
            if (i == 0) break;
            if (maxsplit >= 0 && (int64_t)r->n == maxsplit) {
                size_t b = 0;
                while (b < i && py_isspace(p.v[b])) b++;
                jlist_push(c, r, vstr(c, s->s + p.off[b], p.off[i] - p.off[b]));
                break;
            }
            size_t j = i;
            while (j > 0 && !py_isspace(p.v[j - 1])) j--;
            jlist_push(c, r, vstr(c, s->s + p.off[j], p.off[i] - p.off[j]));
            i = j;
        }
        for (size_t a = 0, b = r->n; b > a + 1; a++, b--) { val t = r->v[a]; r->v[a] = r->v[b - 1]; r->v[b - 1] = t; }
    }
    cps_free(c, &p);
    return rv;
}

static val split_sep(jctx *c, jstr *s, jstr *sep, int64_t maxsplit, int from_right)
{
    if (!sep->len) jfail(c, JE_VALUE, "empty separator");
    jlist *r = jlist_new(c, L_LIST, 0);
    val rv = vlist(r);
    jcharge(c, s->len);
    if (!from_right) {
        size_t i = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || (int64_t)r->n < maxsplit) ? memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
            if (!hit) { jlist_push(c, r, vstr(c, s->s + i, s->len - i)); break; }
            size_t h = (size_t)(hit - s->s);
            jlist_push(c, r, vstr(c, s->s + i, h - i));
            i = h + sep->len;
        }
    } else {
        size_t e = s->len;
        for (;;) {
            size_t h = (size_t)-1;
            if ((maxsplit < 0 || (int64_t)r->n < maxsplit) && e >= sep->len)
                for (size_t q = e - sep->len + 1; q-- > 0;)
                    if (memcmp(s->s + q, sep->s, sep->len) == 0) { h = q; break; }
            if (h == (size_t)-1) { jlist_push(c, r, vstr(c, s->s, e)); break; }
            jlist_push(c, r, vstr(c, s->s + h + sep->len, e - h - sep->len));
            e = h;
        }
        for (size_t a = 0, b = r->n; b > a + 1; a++, b--) { val t = r->v[a]; r->v[a] = r->v[b - 1]; r->v[b - 1] = t; }
    }
    return rv;
}

static int line_break(uint32_t cp)
{
    return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static val splitlines(jctx *c, jstr *s, int keepends)
{
    jlist *r = jlist_new(c, L_LIST, 0);
    val rv = vlist(r);
    size_t i = 0, start = 0;
    while (i < s->len) {
        uint32_t cp;
        size_t k = (size_t)utf8_dec(s->s + i, s->len - i, &cp);
        if (line_break(cp)) {
            size_t e = i + k;
            if (cp == '\r' && e < s->len && s->s[e] == '\n') e++;
            jlist_push(c, r, vstr(c, s->s + start, (keepends ? e : i) - start));
            start = i = e;
        } else {
            i += k;
        }
    }
    if (start < s->len) jlist_push(c, r, vstr(c, s->s + start, s->len - start));
    jcharge(c, s->len);
    return rv;
}

/* ---- find / count ---- */

/* byte offset of code point index k (clamped, Python slice rules) */
size_t jcp_index(jstr *s, int64_t k)
{
    int64_t n = jstr_nchars(s);
    if (k < 0) k += n;
    if (k < 0) k = 0;
    if (k > n) k = n;
    if (n == (int64_t)s->len) return (size_t)k;
    size_t i = 0;
    while (k > 0 && i < s->len) {
        i++;
        while (i < s->len && ((unsigned char)s->s[i] & 0xC0) == 0x80) i++;
        k--;
    }
    return i;
}

int64_t jcp_count(const char *s, size_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static void range_args(jctx *c, jstr *s, val a, val b, size_t *lo, size_t *hi)
{
    *lo = 0;
    *hi = s->len;
    if (given(a) && a.t != JT_NONE) *lo = jcp_index(s, jwant_int(c, a, "start"));
    if (given(b) && b.t != JT_NONE) *hi = jcp_index(s, jwant_int(c, b, "end"));
}

static int64_t find(jctx *c, jstr *s, jstr *sub, size_t lo, size_t hi, int rev)
{
    jcharge(c, s->len);
    if (hi < lo || hi - lo < sub->len) return -1;
    if (!rev) {
        const char *h = sub->len ? memmem(s->s + lo, hi - lo, sub->s, sub->len) : s->s + lo;
        return h ? jcp_count(s->s, (size_t)(h - s->s)) : -1;
    }
    for (size_t q = hi - sub->len + 1; q-- > lo;)
        if (memcmp(s->s + q, sub->s, sub->len) == 0) return jcp_count(s->s, q);
    return -1;
}

static int affix(jctx *c, jstr *s, val what, size_t lo, size_t hi, int suffix, const char *fn)
{
    if (what.t == JT_LIST && L(what)->h.sub == L_TUPLE) {
        for (size_t i = 0; i < L(what)->n; i++)
            if (affix(c, s, L(what)->v[i], lo, hi, suffix, fn)) return 1;
        return 0;
    }
    if (what.t != JT_STR)
        jfail(c, JE_TYPE, "%s first arg must be str or a tuple of str, not %s", fn, jtype_name(what));
    jstr *x = S(what);
    if (hi < lo || hi - lo < x->len) return 0;
    return memcmp(s->s + (suffix ? hi - x->len : lo), x->s, x->len) == 0;
}

static val pad(jctx *c, jstr *s, val width, val fill, int align, int zfill)
{
    int64_t w = jwant_int(c, width, "width"), n = jstr_nchars(s);
    const char *f = " ";
    size_t fl = 1;
    if (given(fill)) {
        jstr *fs = want_str(c, fill, "fill character");
        if (jstr_nchars(fs) != 1) jfail(c, JE_TYPE, "The fill character must be exactly one character long");
        f = fs->s;
        fl = fs->len;
    }
    if (w <= n) return jref(vobj(JT_STR, s));
    if (w - n > (int64_t)c->lim.max_output) jfail(c, JE_LIMIT, "the template wrote more than %zu bytes", c->lim.max_output);
    int64_t total = w - n, left = align == '<' ? 0 : align == '>' ? total : total / 2 + (total & w & 1);
    jbuf b;
    jbuf_init(c, &b);
    size_t start = 0;
    if (zfill && s->len && (s->s[0] == '-' || s->s[0] == '+')) { jbuf_putc(c, &b, s->s[0]); start = 1; }
    for (int64_t i = 0; i < left; i++) jbuf_put(c, &b, f, fl);
    jbuf_put(c, &b, s->s + start, s->len - start);
    for (int64_t i = left; i < total; i++) jbuf_put(c, &b, f, fl);
    return jbuf_take(c, &b);
}

static int all_cps(jstr *s, int (*pred)(uint32_t))
{
    if (!s->len) return 0;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        i += (size_t)utf8_dec(s->s + i, s->len - i, &cp);
        if (!pred(cp)) return 0;
    }
    return 1;
}

static int p_alpha(uint32_t cp)
{
    int k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
static int p_digit(uint32_t cp) { return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND; }
static int p_numeric(uint32_t cp)
{
    int k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
static int p_space(uint32_t cp) { return py_isspace(cp); }

/* islower / isupper: some cased character, and none of the other case */
static int case_test(jstr *s, int upper)
{
    int any = 0;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        i += (size_t)utf8_dec(s->s + i, s->len - i, &cp);
        if (upper ? cased_lower(cp) : cased_upper(cp)) return 0;
        if (upper ? cased_upper(cp) : cased_lower(cp)) any = 1;
    }
    return any;
}

static int istitle(jstr *s)
{
    int prev = 0, any = 0;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        i += (size_t)utf8_dec(s->s + i, s->len - i, &cp);
        if (cased_upper(cp)) { if (prev) return 0; prev = 1; any = 1; }
        else if (cased_lower(cp)) { if (!prev) return 0; prev = 1; any = 1; }
        else prev = 0;
    }
    return any;
}

static val partition(jctx *c, jstr *s, val sepv, int rev)
{
    jstr *sep = want_str(c, sepv, "separator");
    if (!sep->len) jfail(c, JE_VALUE, "empty separator");
    int64_t at = find(c, s, sep, 0, s->len, rev);
    jlist *r = jlist_new(c, L_TUPLE, 3);
    if (at < 0) {
        val whole = jref(vobj(JT_STR, s));
        if (rev) { jlist_push(c, r, vstr(c, "", 0)); jlist_push(c, r, vstr(c, "", 0)); jlist_push(c, r, whole); }
        else { jlist_push(c, r, whole); jlist_push(c, r, vstr(c, "", 0)); jlist_push(c, r, vstr(c, "", 0)); }
        return vlist(r);
    }
    size_t b = jcp_index(s, at);
    jlist_push(c, r, vstr(c, s->s, b));
    jlist_push(c, r, jref(sepv));
    jlist_push(c, r, vstr(c, s->s + b + sep->len, s->len - b - sep->len));
    return vlist(r);
}

static val str_call(jctx *c, int id, jstr *s, jargs *a)
{
    val v[4];
    val self = vobj(JT_STR, s);
    switch (id) {
    case JF_S_CAPITALIZE: jbind(c, "capitalize", a, NULL, 0, v); return jcase(c, s, CASE_CAPITALIZE);
    case JF_S_CASEFOLD:
    case JF_S_LOWER: jbind(c, "lower", a, NULL, 0, v); return jcase(c, s, CASE_LOWER);
    case JF_S_UPPER: jbind(c, "upper", a, NULL, 0, v); return jcase(c, s, CASE_UPPER);
    case JF_S_SWAPCASE: jbind(c, "swapcase", a, NULL, 0, v); return jcase(c, s, CASE_SWAP);
    case JF_S_TITLE: jbind(c, "title", a, NULL, 0, v); return jcase(c, s, CASE_TITLE);
    case JF_S_STRIP:
    case JF_S_LSTRIP:
    case JF_S_RSTRIP: {
        static const char *const n[] = { "chars" };
        jbind(c, "strip", a, n, 1, v);
        const jstr *chars = given(v[0]) && v[0].t != JT_NONE ? want_str(c, v[0], "strip arg") : NULL;
        return jstrip(c, s, chars, id != JF_S_RSTRIP, id != JF_S_LSTRIP);
    }
    case JF_S_SPLIT:
    case JF_S_RSPLIT: {
        static const char *const n[] = { "sep", "maxsplit" };
        jbind(c, "split", a, n, 2, v);
        int64_t maxsplit = given(v[1]) ? jwant_int(c, v[1], "maxsplit") : -1;
        if (!given(v[0]) || v[0].t == JT_NONE) return split_ws(c, s, maxsplit, id == JF_S_RSPLIT);
        return split_sep(c, s, want_str(c, v[0], "sep"), maxsplit, id == JF_S_RSPLIT);
    }
    case JF_S_SPLITLINES: {
        static const char *const n[] = { "keepends" };
        jbind(c, "splitlines", a, n, 1, v);
        return splitlines(c, s, given(v[0]) && jtruthy(c, v[0]));
    }
    case JF_S_STARTSWITH:
    case JF_S_ENDSWITH: {
        static const char *const n[] = { "prefix", "start", "end" };
        const char *fn = id == JF_S_STARTSWITH ? "startswith" : "endswith";
        jbind(c, fn, a, n, 3, v);
        if (!given(v[0])) jfail(c, JE_TYPE, "%s() takes at least 1 argument (0 given)", fn);
        size_t lo, hi;
        range_args(c, s, v[1], v[2], &lo, &hi);
        return vbool(affix(c, s, v[0], lo, hi, id == JF_S_ENDSWITH, fn));
    }
    case JF_S_REPLACE: {
        static const char *const n[] = { "old", "new", "count" };
        jbind(c, "replace", a, n, 3, v);
        if (!given(v[1])) jfail(c, JE_TYPE, "replace expected at least 2 arguments, got %d", a->n);
        return jreplace(c, s, want_str(c, v[0], "replace() argument 1"), want_str(c, v[1], "replace() argument 2"),
                        given(v[2]) ? jwant_int(c, v[2], "count") : -1);
    }
    case JF_S_FIND:
    case JF_S_RFIND:
    case JF_S_INDEX:
    case JF_S_RINDEX:
    case JF_S_COUNT: {
        static const char *const n[] = { "sub", "start", "end" };
        jbind(c, "find", a, n, 3, v);
        if (!given(v[0])) jfail(c, JE_TYPE, "find() takes at least 1 argument (0 given)");
        jstr *sub = want_str(c, v[0], "substring");
        size_t lo, hi;
        range_args(c, s, v[1], v[2], &lo, &hi);
        if (id == JF_S_COUNT) {
            if (hi < lo) return vint(0);
            if (!sub->len) return vint(jcp_count(s->s + lo, hi - lo) + 1);
            int64_t k = 0;
            for (size_t i = lo; i + sub->len <= hi;) {
                const char *h = memmem(s->s + i, hi - i, sub->s, sub->len);
                if (!h) break;
                k++;
                i = (size_t)(h - s->s) + sub->len;
            }
            jcharge(c, s->len);
            return vint(k);
        }
        int64_t r = find(c, s, sub, lo, hi, id == JF_S_RFIND || id == JF_S_RINDEX);
        if (r < 0 && (id == JF_S_INDEX || id == JF_S_RINDEX)) jfail(c, JE_VALUE, "substring not found");
        return vint(r);
    }
    case JF_S_JOIN: {
        static const char *const n[] = { "iterable" };
        jbind(c, "join", a, n, 1, v);
        if (!given(v[0])) jfail(c, JE_TYPE, "str.join() takes exactly one argument (0 given)");
        jlist *items = jiterate(c, v[0]);
        jbuf b;
        jbuf_init(c, &b);
        for (size_t i = 0; i < items->n; i++) {
            if (items->v[i].t != JT_STR)
                jfail(c, JE_TYPE, "sequence item %zu: expected str instance, %s found", i, jtype_name(items->v[i]));
            if (i) jbuf_put(c, &b, s->s, s->len);
            jbuf_put(c, &b, S(items->v[i])->s, S(items->v[i])->len);
        }
        jobj_unref(c, &items->h);
        return jbuf_take(c, &b);
    }
    case JF_S_CENTER:
    case JF_S_LJUST:
    case JF_S_RJUST: {
        static const char *const n[] = { "width", "fillchar" };
        jbind(c, "center", a, n, 2, v);
        if (!given(v[0])) jfail(c, JE_TYPE, "expected at least 1 argument, got 0");
        return pad(c, s, v[0], v[1], id == JF_S_LJUST ? '<' : id == JF_S_RJUST ? '>' : '^', 0);
    }
    case JF_S_ZFILL: {
        static const char *const n[] = { "width" };
        jbind(c, "zfill", a, n, 1, v);
        if (!given(v[0])) jfail(c, JE_TYPE, "zfill() takes exactly one argument (0 given)");
        val zero = vstr(c, "0", 1);
        val r = pad(c, s, v[0], zero, '>', 1);
        junref(c, zero);
        return r;
    }
    case JF_S_REMOVEPREFIX:
    case JF_S_REMOVESUFFIX: {
        static const char *const n[] = { "affix" };
        jbind(c, "removeprefix", a, n, 1, v);
        jstr *x = want_str(c, v[0], "argument");
        if (x->len > s->len) return jref(self);
        if (id == JF_S_REMOVEPREFIX)
            return memcmp(s->s, x->s, x->len) ? jref(self) : vstr(c, s->s + x->len, s->len - x->len);
        return memcmp(s->s + s->len - x->len, x->s, x->len) ? jref(self) : vstr(c, s->s, s->len - x->len);
    }
    case JF_S_PARTITION:
    case JF_S_RPARTITION: {
        static const char *const n[] = { "sep" };
        jbind(c, "partition", a, n, 1, v);
        return partition(c, s, v[0], id == JF_S_RPARTITION);
    }
    case JF_S_ISALNUM: jbind(c, "isalnum", a, NULL, 0, v); return vbool(all_cps(s, py_isalnum_cp));
    case JF_S_ISALPHA: jbind(c, "isalpha", a, NULL, 0, v); return vbool(all_cps(s, p_alpha));
    case JF_S_ISDECIMAL:
    case JF_S_ISDIGIT: jbind(c, "isdigit", a, NULL, 0, v); return vbool(all_cps(s, p_digit));
    case JF_S_ISNUMERIC: jbind(c, "isnumeric", a, NULL, 0, v); return vbool(all_cps(s, p_numeric));
    case JF_S_ISSPACE: jbind(c, "isspace", a, NULL, 0, v); return vbool(all_cps(s, p_space));
    case JF_S_ISLOWER: jbind(c, "islower", a, NULL, 0, v); return vbool(case_test(s, 0));
    case JF_S_ISUPPER: jbind(c, "isupper", a, NULL, 0, v); return vbool(case_test(s, 1));
    case JF_S_ISTITLE: jbind(c, "istitle", a, NULL, 0, v); return vbool(istitle(s));
    case JF_S_FORMAT: return jformat_brace(c, s, a);
    }
    jfail(c, JE_RUNTIME, "unknown string method");
}

/* ---- Markup ---- */

val jmark(jctx *c, val v)
{
    if (v.t == JT_STR) {
        if (S(v)->h.sub == STR_MARKUP) return v;
        if (S(v)->h.rc == 1) { S(v)->h.sub = STR_MARKUP; return v; }
        val r = vstr(c, S(v)->s, S(v)->len);
        junref(c, v);
        S(r)->h.sub = STR_MARKUP;
        return r;
    }
    if (v.t == JT_LIST)
        for (size_t i = 0; i < L(v)->n; i++)
            if (L(v)->v[i].t == JT_STR) L(v)->v[i] = jmark(c, L(v)->v[i]);
    return v;
}

val jescape(jctx *c, val v, int force)
{
    if (is_markup(v) && !force) return jref(v);
    val s = vstr_of(c, v);
    jbuf b;
    jbuf_init(c, &b);
    size_t run = 0;
    const char *p = S(s)->s;
    for (size_t i = 0; i < S(s)->len; i++) {
        const char *e = NULL;
        switch (p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        if (!e) { run++; continue; }
        jbuf_put(c, &b, p + i - run, run);
        run = 0;
        jbuf_put(c, &b, e, strlen(e));
    }
    jbuf_put(c, &b, p + S(s)->len - run, run);
    junref(c, s);
    return jmark(c, jbuf_take(c, &b));
}

/* Markup's methods: string arguments escaped (replace, format, join), and
 * the results Markup again */
val jstr_call(jctx *c, int id, jstr *s, jargs *a)
{
    if (s->h.sub != STR_MARKUP) return str_call(c, id, s, a);
    int wrapped = 0;
    switch (id) {
    case JF_S_CAPITALIZE: case JF_S_TITLE: case JF_S_LOWER: case JF_S_UPPER: case JF_S_REPLACE: case JF_S_LJUST:
    case JF_S_RJUST: case JF_S_LSTRIP: case JF_S_RSTRIP: case JF_S_CENTER: case JF_S_STRIP: case JF_S_SWAPCASE:
    case JF_S_ZFILL: case JF_S_JOIN: case JF_S_SPLIT: case JF_S_RSPLIT: case JF_S_SPLITLINES: case JF_S_PARTITION:
    case JF_S_RPARTITION: case JF_S_FORMAT:
        wrapped = 1;
    }
    if (!wrapped) return str_call(c, id, s, a);
    int esc_args = id == JF_S_REPLACE || id == JF_S_FORMAT || id == JF_S_JOIN || id == JF_S_PARTITION || id == JF_S_RPARTITION;
    jargs e = *a;
    jlist *hold = NULL;
    if (esc_args) {
        hold = jlist_new(c, L_LIST, (size_t)(a->n + a->nk) + 1);
        e.v = hold->v;
        e.kv = hold->v + a->n;
        for (int i = 0; i < a->n; i++) {
            val x = a->v[i];
            if (id == JF_S_JOIN) {
                jlist *items = jiterate(c, x);
                jlist *esc = jlist_new(c, L_LIST, items->n);
                for (size_t k = 0; k < items->n; k++) jlist_push(c, esc, jescape(c, items->v[k], 0));
                jobj_unref(c, &items->h);
                jlist_push(c, hold, vlist(esc));
            } else {
                jlist_push(c, hold, x.t == JT_STR ? jescape(c, x, 0) : jref(x));
            }
        }
        for (int i = 0; i < a->nk; i++) jlist_push(c, hold, a->kv[i].t == JT_STR ? jescape(c, a->kv[i], 0) : jref(a->kv[i]));
        e.v = hold->v;
        e.kv = hold->v + a->n;
    }
    val r = jmark(c, str_call(c, id, s, &e));
    if (hold) jobj_unref(c, &hold->h);
    return r;
}
