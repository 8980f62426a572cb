/* jinja_str.c — Python's str for templates: the methods the sandbox allows
 * (split, strip, startswith, replace, format, ...), case mapping over
 * Unicode (utf8proc), printf-style `%` formatting and str.format. Indexes
 * and lengths count code points, as Python's do. */
#include "engine/text/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* the numeric conversions hand Python's format specs to snprintf */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

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

static int64_t want_int(jctx *c, val v, const char *what)
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

static void put_upper(jctx *c, jbuf *b, uint32_t cp)
{
    if (cp == 0xDF) { jbuf_put(c, b, "SS", 2); return; }   /* full case mapping of ß */
    put_cp(c, b, (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp));
}

static void put_title(jctx *c, jbuf *b, uint32_t cp)
{
    if (cp == 0xDF) { jbuf_put(c, b, "Ss", 2); return; }
    put_cp(c, b, (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp));
}

static void put_lower(jctx *c, jbuf *b, uint32_t cp) { put_cp(c, b, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp)); }

val jcase(jctx *c, jstr *s, int mode)
{
    jbuf b;
    jbuf_init(c, &b);
    int prev_cased = 0, first = 1, word_start = 1;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        size_t k = (size_t)utf8_dec(s->s + i, s->len - i, &cp);
        switch (mode) {
        case CASE_LOWER: if (cp < 0x80) jbuf_putc(c, &b, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp)); else put_lower(c, &b, cp); break;
        case CASE_UPPER: if (cp < 0x80) jbuf_putc(c, &b, (char)(cp >= 'a' && cp <= 'z' ? cp - 32 : cp)); else put_upper(c, &b, cp); break;
        case CASE_CAPITALIZE: if (first) put_title(c, &b, cp); else put_lower(c, &b, cp); break;
        case CASE_SWAP:
            if (cased_lower(cp)) put_upper(c, &b, cp);
            else if (cased_upper(cp)) put_lower(c, &b, cp);
            else put_cp(c, &b, cp);
            break;
        case CASE_TITLE:
            /* str.title(): a cased character after an uncased one starts a word */
            if (is_cased(cp)) {
                if (prev_cased) put_lower(c, &b, cp); else put_title(c, &b, cp);
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
                if (word_start) put_upper(c, &b, cp); else put_lower(c, &b, cp);
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
static size_t cp_index(jstr *s, int64_t k)
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

static int64_t cp_count(const char *s, size_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static void range_args(jctx *c, jstr *s, val a, val b, size_t *lo, size_t *hi)
{
    *lo = 0;
    *hi = s->len;
    if (given(a) && a.t != JT_NONE) *lo = cp_index(s, want_int(c, a, "start"));
    if (given(b) && b.t != JT_NONE) *hi = cp_index(s, want_int(c, b, "end"));
}

static int64_t find(jctx *c, jstr *s, jstr *sub, size_t lo, size_t hi, int rev)
{
    jcharge(c, s->len);
    if (hi < lo || hi - lo < sub->len) return -1;
    if (!rev) {
        const char *h = sub->len ? memmem(s->s + lo, hi - lo, sub->s, sub->len) : s->s + lo;
        return h ? cp_count(s->s, (size_t)(h - s->s)) : -1;
    }
    for (size_t q = hi - sub->len + 1; q-- > lo;)
        if (memcmp(s->s + q, sub->s, sub->len) == 0) return cp_count(s->s, q);
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
    int64_t w = want_int(c, width, "width"), n = jstr_nchars(s);
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
    size_t b = cp_index(s, at);
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
        int64_t maxsplit = given(v[1]) ? want_int(c, v[1], "maxsplit") : -1;
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
                        given(v[2]) ? want_int(c, v[2], "count") : -1);
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
            if (!sub->len) return vint(cp_count(s->s + lo, hi - lo) + 1);
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

/* ---- printf-style formatting ---- */

static void put_padded(jctx *c, jbuf *b, const char *s, size_t n, int64_t width, int left)
{
    int64_t k = cp_count(s, n);
    if (!left) for (int64_t i = k; i < width; i++) jbuf_putc(c, b, ' ');
    jbuf_put(c, b, s, n);
    if (left) for (int64_t i = k; i < width; i++) jbuf_putc(c, b, ' ');
}

val jformat_percent(jctx *c, val fmtv, val args)
{
    jstr *f = S(fmtv);
    jlist *tup = args.t == JT_LIST && L(args)->h.sub == L_TUPLE ? L(args) : NULL;
    int is_map = args.t == JT_DICT;
    size_t ai = 0;
    int used_single = 0;
    jbuf b;
    jbuf_init(c, &b);
    for (size_t i = 0; i < f->len;) {
        const char *pct = memchr(f->s + i, '%', f->len - i);
        if (!pct) { jbuf_put(c, &b, f->s + i, f->len - i); break; }
        size_t p = (size_t)(pct - f->s);
        jbuf_put(c, &b, f->s + i, p - i);
        size_t q = p + 1;
        val arg = vundef0();
        int have_key = 0;
        if (q < f->len && f->s[q] == '(') {
            size_t e = q + 1;
            int depth = 1;
            while (e < f->len && depth) { if (f->s[e] == '(') depth++; else if (f->s[e] == ')') depth--; e++; }
            if (depth) jfail(c, JE_VALUE, "incomplete format key");
            if (!is_map) jfail(c, JE_TYPE, "format requires a mapping");
            val *x = jdict_gets(D(args), f->s + q + 1, e - q - 2);
            if (!x) {
                val k = vstr(c, f->s + q + 1, e - q - 2);
                jbuf kb;
                jbuf_init(c, &kb);
                jrepr(c, &kb, k);
                jfail(c, JE_RUNTIME, "KeyError: %s", kb.s);
            }
            arg = *x;
            have_key = 1;
            q = e;
        }
        char flags[8];
        int nf = 0;
        while (q < f->len && strchr("-+ #0", f->s[q]) && nf < 7) flags[nf++] = f->s[q++];
        flags[nf] = 0;
        int64_t width = -1, prec = -1;
#define NEXT_ARG(dst) do { \
            if (tup) { if (ai >= tup->n) jfail(c, JE_TYPE, "not enough arguments for format string"); dst = tup->v[ai++]; } \
            else { if (used_single) jfail(c, JE_TYPE, "not enough arguments for format string"); dst = args; used_single = 1; } \
        } while (0)
        if (q < f->len && f->s[q] == '*') {
            val w;
            NEXT_ARG(w);
            width = want_int(c, w, "* wants int");
            q++;
        } else {
            while (q < f->len && f->s[q] >= '0' && f->s[q] <= '9') { width = (width < 0 ? 0 : width) * 10 + (f->s[q++] - '0'); if (width > 1000000) jfail(c, JE_VALUE, "width too big"); }
        }
        if (q < f->len && f->s[q] == '.') {
            q++;
            prec = 0;
            if (q < f->len && f->s[q] == '*') {
                val w;
                NEXT_ARG(w);
                prec = want_int(c, w, "* wants int");
                q++;
            } else {
                while (q < f->len && f->s[q] >= '0' && f->s[q] <= '9') { prec = prec * 10 + (f->s[q++] - '0'); if (prec > 1000) jfail(c, JE_VALUE, "precision too big"); }
            }
        }
        while (q < f->len && strchr("hlL", f->s[q])) q++;
        if (q >= f->len) jfail(c, JE_VALUE, "incomplete format");
        char conv = f->s[q++];
        i = q;
        if (conv == '%') { jbuf_putc(c, &b, '%'); continue; }
        if (!have_key) {
            if (is_map) arg = args, used_single = 1;
            else NEXT_ARG(arg);
        }
        int left = strchr(flags, '-') != NULL;
        switch (conv) {
        case 's': case 'r': case 'a': {
            jbuf t;
            jbuf_init(c, &t);
            if (conv == 's') jstr_of(c, &t, arg); else jrepr(c, &t, arg);
            size_t n = t.n;
            if (prec >= 0) {
                size_t o = 0;
                for (int64_t k = 0; k < prec && o < n; k++) {
                    o++;
                    while (o < n && ((unsigned char)t.s[o] & 0xC0) == 0x80) o++;
                }
                n = o;
            }
            put_padded(c, &b, t.s ? t.s : "", n, width, left);
            jbuf_free(c, &t);
            break;
        }
        case 'c': {
            char tmp[8];
            size_t n;
            if (arg.t == JT_STR && jstr_nchars(S(arg)) == 1) { n = S(arg)->len; memcpy(tmp, S(arg)->s, n); }
            else if (arg.t == JT_INT && arg.i >= 0 && arg.i <= 0x10FFFF) n = utf8_enc((uint32_t)arg.i, tmp);
            else jfail(c, JE_TYPE, "%%c requires int or char");
            put_padded(c, &b, tmp, n, width, left);
            break;
        }
        case 'd': case 'i': case 'u': case 'o': case 'x': case 'X': case 'e': case 'E': case 'f': case 'F':
        case 'g': case 'G': {
            int is_float = strchr("eEfFgG", conv) != NULL;
            if (arg.t == JT_UNDEF) jundef_fail(c, arg);
            if (arg.t != JT_INT && arg.t != JT_BOOL && arg.t != JT_FLOAT) {
                if (is_float) jfail(c, JE_TYPE, "must be real number, not %s", jtype_name(arg));
                jfail(c, JE_TYPE, "%%%c format: %s is required, not %s", conv,
                      strchr("oxX", conv) ? "an integer" : "a real number", jtype_name(arg));
            }
            if (!is_float && arg.t == JT_FLOAT && strchr("oxX", conv))
                jfail(c, JE_TYPE, "%%%c format: an integer is required, not float", conv);
            char spec[32], out[1100];
            if (is_float) {
                double x = arg.t == JT_FLOAT ? arg.f : (double)arg.i;
                if (!isfinite(x)) {
                    const char *t = isnan(x) ? "nan" : x < 0 ? "-inf" : (strchr(flags, '+') ? "+inf" : "inf");
                    put_padded(c, &b, t, strlen(t), width, left);
                    break;
                }
                snprintf(spec, sizeof spec, "%%%s%s%s%c", flags, width >= 0 ? "*" : "", ".*", conv == 'F' ? 'f' : conv);
                if (width >= 0) snprintf(out, sizeof out, spec, (int)width, (int)(prec < 0 ? 6 : prec), x);
                else snprintf(out, sizeof out, spec, (int)(prec < 0 ? 6 : prec), x);
            } else {
                long long x = arg.t == JT_FLOAT ? (long long)arg.f : (long long)arg.i;
                char cv = conv == 'i' || conv == 'u' ? 'd' : conv;
                snprintf(spec, sizeof spec, "%%%s%s%sll%c", flags, width >= 0 ? "*" : "", prec >= 0 ? ".*" : "", cv);
                if (width >= 0 && prec >= 0) snprintf(out, sizeof out, spec, (int)width, (int)prec, x);
                else if (width >= 0) snprintf(out, sizeof out, spec, (int)width, x);
                else if (prec >= 0) snprintf(out, sizeof out, spec, (int)prec, x);
                else snprintf(out, sizeof out, spec, x);
                if (conv == 'o' && strchr(flags, '#')) {
                    /* Python writes 0o17 where C writes 017 */
                    char *z = strchr(out, '0');
                    if (z) { memmove(z + 2, z + 1, strlen(z + 1) + 1); z[1] = 'o'; }
                }
            }
            jbuf_put(c, &b, out, strlen(out));
            break;
        }
        default:
            jfail(c, JE_VALUE, "unsupported format character '%c' (0x%x) at index %zu", conv, (unsigned char)conv, q - 1);
        }
#undef NEXT_ARG
    }
    if ((tup && ai < tup->n) || (!tup && !is_map && !used_single))
        jfail(c, JE_TYPE, "not all arguments converted during string formatting");
    return jbuf_take(c, &b);
}

/* ---- str.format ---- */

static val format_spec(jctx *c, val v, const char *spec, size_t sn)
{
    if (!sn) return vstr_of(c, v);
    /* [[fill]align][sign][#][0][width][,_][.precision][type] */
    size_t i = 0;
    const char *fill = " ";
    size_t fill_n = 1;
    char align = 0, sign = 0, type = 0;
    int alt = 0, zero = 0, grouping = 0;
    int64_t width = -1, prec = -1;
    uint32_t cp;
    size_t k = sn ? (size_t)utf8_dec(spec, sn, &cp) : 0;
    if (k < sn && strchr("<>=^", spec[k])) { fill = spec; fill_n = k; align = spec[k]; i = k + 1; }
    else if (sn && strchr("<>=^", spec[0])) { align = spec[0]; i = 1; }
    if (i < sn && strchr("+- ", spec[i])) sign = spec[i++];
    if (i < sn && spec[i] == '#') { alt = 1; i++; }
    if (i < sn && spec[i] == '0') { zero = 1; i++; }
    while (i < sn && spec[i] >= '0' && spec[i] <= '9') { width = (width < 0 ? 0 : width) * 10 + (spec[i++] - '0'); if (width > 1000000) jfail(c, JE_VALUE, "Too many decimal digits in format string"); }
    if (i < sn && (spec[i] == ',' || spec[i] == '_')) { grouping = spec[i]; i++; }
    if (i < sn && spec[i] == '.') {
        i++;
        prec = 0;
        while (i < sn && spec[i] >= '0' && spec[i] <= '9') { prec = prec * 10 + (spec[i++] - '0'); if (prec > 1000) jfail(c, JE_VALUE, "Too many decimal digits in format string"); }
    }
    if (i < sn) type = spec[i++];
    if (i < sn) jfail(c, JE_VALUE, "Invalid format specifier");
    (void)alt;
    (void)grouping;
    char body[1200];
    size_t bn;
    int numeric = 0;
    if (v.t == JT_STR || v.t == JT_NONE || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_UNDEF) {
        if (type && type != 's') jfail(c, JE_VALUE, "Unknown format code '%c' for object of type '%s'", type, jtype_name(v));
        if (v.t != JT_STR && (sign || zero)) jfail(c, JE_VALUE, "Sign not allowed in string format specifier");
        val sv = vstr_of(c, v);
        jstr *s = S(sv);
        size_t n = prec >= 0 ? cp_index(s, prec) : s->len;
        jbuf b;
        jbuf_init(c, &b);
        int64_t nc = cp_count(s->s, n), pad_n = width > nc ? width - nc : 0;
        char al = align ? align : '<';
        int64_t left = al == '>' ? pad_n : al == '^' ? pad_n / 2 : 0;
        for (int64_t j = 0; j < left; j++) jbuf_put(c, &b, fill, fill_n);
        jbuf_put(c, &b, s->s, n);
        for (int64_t j = left; j < pad_n; j++) jbuf_put(c, &b, fill, fill_n);
        junref(c, sv);
        return jbuf_take(c, &b);
    }
    if (v.t == JT_INT || v.t == JT_BOOL || v.t == JT_FLOAT) {
        numeric = 1;
        char cs[40];
        int is_f = v.t == JT_FLOAT || (type && strchr("eEfFgG%", type));
        if (is_f) {
            double x = v.t == JT_FLOAT ? v.f : (double)v.i;
            char t = type ? type : 'g';
            if (t == '%') { x *= 100; t = 'f'; }
            if (!type && prec < 0) { jfloat_repr(body, sizeof body, x); bn = strlen(body); goto signed_; }
            snprintf(cs, sizeof cs, "%%%s.*%c", sign == '+' ? "+" : sign == ' ' ? " " : "", t == 'F' ? 'f' : t);
            snprintf(body, sizeof body, cs, (int)(prec < 0 ? 6 : prec), x);
            if (type == '%') strcat(body, "%");
        } else {
            if (type && !strchr("dxXobcn", type)) jfail(c, JE_VALUE, "Unknown format code '%c' for object of type 'int'", type);
            long long x = v.i;
            char t = type ? type : 'd';
            if (t == 'n') t = 'd';
            if (t == 'b') {
                char tmp[80];
                int n = 0;
                unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
                do { tmp[n++] = (char)('0' + (u & 1)); u >>= 1; } while (u);
                size_t o = 0;
                if (x < 0) body[o++] = '-'; else if (sign == '+') body[o++] = '+'; else if (sign == ' ') body[o++] = ' ';
                while (n) body[o++] = tmp[--n];
                body[o] = 0;
            } else if (t == 'c') {
                body[utf8_enc((uint32_t)x, body)] = 0;
            } else {
                snprintf(cs, sizeof cs, "%%%sll%c", sign == '+' ? "+" : sign == ' ' ? " " : "", t);
                snprintf(body, sizeof body, cs, x);
            }
        }
        bn = strlen(body);
    signed_:;
        jbuf b;
        jbuf_init(c, &b);
        int64_t pad_n = width > (int64_t)bn ? width - (int64_t)bn : 0;
        char al = align ? align : (zero ? '=' : '>');
        if (zero && !align) { fill = "0"; fill_n = 1; }
        if (al == '=') {
            size_t sgn = (bn && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
            jbuf_put(c, &b, body, sgn);
            for (int64_t j = 0; j < pad_n; j++) jbuf_put(c, &b, fill, fill_n);
            jbuf_put(c, &b, body + sgn, bn - sgn);
        } else {
            int64_t left = al == '>' ? pad_n : al == '^' ? pad_n / 2 : 0;
            for (int64_t j = 0; j < left; j++) jbuf_put(c, &b, fill, fill_n);
            jbuf_put(c, &b, body, bn);
            for (int64_t j = left; j < pad_n; j++) jbuf_put(c, &b, fill, fill_n);
        }
        (void)numeric;
        return jbuf_take(c, &b);
    }
    jfail(c, JE_TYPE, "unsupported format string passed to %s.__format__", jtype_name(v));
}

val jformat_brace(jctx *c, jstr *f, jargs *a)
{
    jbuf b;
    jbuf_init(c, &b);
    int auto_idx = 0, manual = 0;
    for (size_t i = 0; i < f->len;) {
        char ch = f->s[i];
        if (ch == '}') {
            if (i + 1 < f->len && f->s[i + 1] == '}') { jbuf_putc(c, &b, '}'); i += 2; continue; }
            jfail(c, JE_VALUE, "Single '}' encountered in format string");
        }
        if (ch != '{') {
            size_t e = i;
            while (e < f->len && f->s[e] != '{' && f->s[e] != '}') e++;
            jbuf_put(c, &b, f->s + i, e - i);
            i = e;
            continue;
        }
        if (i + 1 < f->len && f->s[i + 1] == '{') { jbuf_putc(c, &b, '{'); i += 2; continue; }
        /* {field!conv:spec} */
        size_t e = i + 1;
        int depth = 1;
        while (e < f->len && depth) {
            if (f->s[e] == '{') depth++;
            else if (f->s[e] == '}') depth--;
            if (depth) e++;
        }
        if (e >= f->len) jfail(c, JE_VALUE, "expected '}' before end of string");
        const char *fld = f->s + i + 1;
        size_t fl = e - i - 1, name_end = 0;
        while (name_end < fl && fld[name_end] != '!' && fld[name_end] != ':') name_end++;
        size_t first_end = 0;
        while (first_end < name_end && fld[first_end] != '.' && fld[first_end] != '[') first_end++;
        val v;
        if (first_end == 0) {
            if (manual) jfail(c, JE_VALUE, "cannot switch from manual field specification to automatic field numbering");
            if (auto_idx >= a->n) jfail(c, JE_RUNTIME, "IndexError: Replacement index %d out of range for positional args tuple", auto_idx);
            v = jref(a->v[auto_idx++]);
        } else if (fld[0] >= '0' && fld[0] <= '9') {
            if (auto_idx) jfail(c, JE_VALUE, "cannot switch from automatic field numbering to manual field specification");
            manual = 1;
            long idx = strtol(fld, NULL, 10);
            if (idx >= a->n) jfail(c, JE_RUNTIME, "IndexError: Replacement index %ld out of range for positional args tuple", idx);
            v = jref(a->v[idx]);
        } else {
            int k;
            for (k = 0; k < a->nk; k++)
                if (a->kn[k]->len == first_end && !memcmp(a->kn[k]->s, fld, first_end)) break;
            if (k == a->nk) jfail(c, JE_RUNTIME, "KeyError: '%.*s'", (int)first_end, fld);
            v = jref(a->kv[k]);
        }
        for (size_t p = first_end; p < name_end;) {
            if (fld[p] == '.') {
                size_t q = ++p;
                while (q < name_end && fld[q] != '.' && fld[q] != '[') q++;
                val key = vstr(c, fld + p, q - p);
                val nv = jgetattr(c, v, S(key));
                junref(c, key);
                junref(c, v);
                v = nv;
                p = q;
            } else {
                size_t q = ++p;
                while (q < name_end && fld[q] != ']') q++;
                val key;
                char *endp;
                char tmp[32];
                size_t kl = q - p < sizeof tmp - 1 ? q - p : sizeof tmp - 1;
                memcpy(tmp, fld + p, kl);
                tmp[kl] = 0;
                long idx = strtol(tmp, &endp, 10);
                key = kl && *endp == 0 ? vint(idx) : vstr(c, fld + p, q - p);
                val nv = jgetitem(c, v, key);
                junref(c, key);
                junref(c, v);
                v = nv;
                p = q + 1;
            }
        }
        size_t p = name_end;
        char conv = 0;
        if (p < fl && fld[p] == '!') { conv = p + 1 < fl ? fld[p + 1] : 0; p += 2; }
        const char *spec = "";
        size_t sn = 0;
        if (p < fl && fld[p] == ':') { spec = fld + p + 1; sn = fl - p - 1; }
        if (conv == 'r' || conv == 'a') {
            jbuf t;
            jbuf_init(c, &t);
            jrepr(c, &t, v);
            junref(c, v);
            v = jbuf_take(c, &t);
        } else if (conv == 's') {
            val sv = vstr_of(c, v);
            junref(c, v);
            v = sv;
        } else if (conv) {
            jfail(c, JE_VALUE, "Unknown conversion specifier %c", conv);
        }
        val r = format_spec(c, v, spec, sn);
        jbuf_put(c, &b, S(r)->s, S(r)->len);
        junref(c, r);
        junref(c, v);
        i = e + 1;
    }
    return jbuf_take(c, &b);
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
