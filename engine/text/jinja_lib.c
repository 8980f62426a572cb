/* jinja_lib.c — jinja2's built-in filters and tests (as filters.py and
 * tests.py define them, with the transformers tojson). */
#include "engine/text/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names ---- */

enum {
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E, F_ESCAPE,
    F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST,
    F_LOWER, F_MAP, F_MAX, F_MIN, F_PPRINT, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE,
    F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_TRUNCATE, F_UNIQUE, F_UPPER,
    F_WORDCOUNT, F_N
};
static const char *const filter_names[F_N] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "first", "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list",
    "lower", "map", "max", "min", "pprint", "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "truncate", "unique", "upper",
    "wordcount",
};

enum {
    TS_BOOLEAN, TS_CALLABLE, TS_DEFINED, TS_DIVISIBLEBY, TS_EQ, TS_EQ2, TS_EQUALTO, TS_ESCAPED, TS_EVEN, TS_FALSE,
    TS_FILTER, TS_FLOAT, TS_GE, TS_GE2, TS_GT, TS_GT2, TS_GREATERTHAN, TS_IN, TS_INTEGER, TS_ITERABLE, TS_LE, TS_LE2,
    TS_LOWER, TS_LESSTHAN, TS_LT, TS_LT2, TS_MAPPING, TS_NE, TS_NE2, TS_NONE, TS_NUMBER, TS_ODD, TS_SAMEAS, TS_SEQUENCE,
    TS_STRING, TS_TEST, TS_TRUE, TS_UNDEFINED, TS_UPPER, TS_N
};
static const char *const test_names[TS_N] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "==", "equalto", "escaped", "even", "false",
    "filter", "float", "ge", ">=", "gt", ">", "greaterthan", "in", "integer", "iterable", "le", "<=",
    "lower", "lessthan", "lt", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence",
    "string", "test", "true", "undefined", "upper",
};

static int lookup(const char *const *tab, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(tab[i]) == len && memcmp(tab[i], s, len) == 0) return i;
    return -1;
}

int jfilter_id(const char *s, size_t n) { return lookup(filter_names, F_N, s, n); }
int jtest_id(const char *s, size_t n) { return lookup(test_names, TS_N, s, n); }
/* ---- helpers ---- */

static int64_t want_int(jctx *c, val v)
{
    if (v.t == JT_UNDEF) jundef_fail(c, v);
    if (v.t != JT_INT && v.t != JT_BOOL)
        jfail(c, JE_TYPE, "'%s' object cannot be interpreted as an integer", jtype_name(v));
    return v.i;
}

static int64_t length_of(jctx *c, val v)
{
    switch (v.t) {
    case JT_UNDEF: return 0;
    case JT_STR: return jstr_nchars(S(v));
    case JT_DICT: return (int64_t)D(v)->n;
    case JT_LIST:
        if (L(v)->h.sub != L_GEN && L(v)->h.sub != L_REVITER) return (int64_t)L(v)->n;
        break;
    }
    jfail(c, JE_TYPE, "object of type '%s' has no len()", jtype_name(v));
}

/* an attribute path as make_attrgetter prepares it: "a.b.0" or an int */
typedef struct apath { int n; val part[16]; } apath;

static void apath_prep(jctx *c, apath *p, val attr, const char *s, size_t n)
{
    p->n = 0;
    if (!s) {
        if (attr.t != JT_STR) { p->part[p->n++] = jref(attr); return; }
        s = S(attr)->s;
        n = S(attr)->len;
    }
    size_t i = 0;
    for (;;) {
        size_t e = i;
        while (e < n && s[e] != '.') e++;
        if (p->n == 16) jfail(c, JE_VALUE, "attribute path too long");
        int digits = e > i;
        for (size_t k = i; k < e; k++)
            if (s[k] < '0' || s[k] > '9') digits = 0;
        if (digits && e - i < 18) {
            int64_t x = 0;
            for (size_t k = i; k < e; k++) x = x * 10 + (s[k] - '0');
            p->part[p->n++] = vint(x);
        } else {
            p->part[p->n++] = vstr(c, s + i, e - i);
        }
        if (e >= n) break;
        i = e + 1;
    }
}

static void apath_free(jctx *c, apath *p)
{
    for (int i = 0; i < p->n; i++) junref(c, p->part[i]);
}

/* new reference */
static val apath_get(jctx *c, const apath *p, val item, val dflt)
{
    val v = jref(item);
    for (int i = 0; i < p->n; i++) {
        val nv = jgetitem(c, v, p->part[i]);
        junref(c, v);
        v = nv;
        if (given(dflt) && dflt.t != JT_NONE && v.t == JT_UNDEF) { junref(c, v); v = jref(dflt); }
    }
    return v;
}

static val ignore_case(jctx *c, val v)
{
    if (v.t != JT_STR) return v;
    val r = jcase(c, S(v), CASE_LOWER);
    junref(c, v);
    return r;
}

/* key for sort / min / max / unique: the attributes (comma separated for
 * sort), lower-cased when not case sensitive */
typedef struct keyspec { int multi, n, ci; apath p[8]; } keyspec;

static void keyspec_prep(jctx *c, keyspec *k, val attr, int multi, int ci)
{
    k->multi = multi;
    k->ci = ci;
    k->n = 0;
    if (!given(attr) || attr.t == JT_NONE) return;
    if (multi && attr.t == JT_STR) {
        const char *s = S(attr)->s;
        size_t n = S(attr)->len, i = 0;
        for (;;) {
            size_t e = i;
            while (e < n && s[e] != ',') e++;
            if (k->n == 8) jfail(c, JE_VALUE, "too many sort attributes");
            apath_prep(c, &k->p[k->n++], attr, s + i, e - i);
            if (e >= n) break;
            i = e + 1;
        }
    } else {
        apath_prep(c, &k->p[k->n++], attr, NULL, 0);
    }
}

static void keyspec_free(jctx *c, keyspec *k)
{
    for (int i = 0; i < k->n; i++) apath_free(c, &k->p[i]);
}

static val key_of(jctx *c, const keyspec *k, val item)
{
    if (!k->multi) {
        val v = k->n ? apath_get(c, &k->p[0], item, vundef0()) : jref(item);
        return k->ci ? ignore_case(c, v) : v;
    }
    jlist *l = jlist_new(c, L_LIST, 1);
    if (!k->n) jlist_push(c, l, k->ci ? ignore_case(c, jref(item)) : jref(item));
    for (int i = 0; i < k->n; i++) {
        val v = apath_get(c, &k->p[i], item, vundef0());
        jlist_push(c, l, k->ci ? ignore_case(c, v) : v);
    }
    return vlist(l);
}

/* stable merge sort of idx[] by keys[] (Python's sorted, with reverse) */
static int before(jctx *c, val a, val b, int rev) { return rev ? jcmp(c, b, a, OP_LT) : jcmp(c, a, b, OP_LT); }

static void msort(jctx *c, size_t *idx, size_t *tmp, size_t n, val *keys, int rev)
{
    if (n < 2) return;
    size_t h = n / 2;
    msort(c, idx, tmp, h, keys, rev);
    msort(c, idx + h, tmp, n - h, keys, rev);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) tmp[o++] = before(c, keys[idx[j]], keys[idx[i]], rev) ? idx[j++] : idx[i++];
    while (i < h) tmp[o++] = idx[i++];
    while (j < n) tmp[o++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    jcharge(c, n);
}

/* items sorted by their keys; a new list (keys consumed) */
static jlist *sorted(jctx *c, jlist *items, jlist *keys, int rev, int sub)
{
    size_t n = items->n;
    jstr *blob = jstr_new(c, NULL, 2 * n * sizeof(size_t));   /* scratch (string data is 8-aligned) */
    size_t *idx = (size_t *)(void *)blob->s, *tmp = idx + n;
    for (size_t i = 0; i < n; i++) idx[i] = i;
    msort(c, idx, tmp, n, keys->v, rev);
    jlist *r = jlist_new(c, sub, n);
    for (size_t i = 0; i < n; i++) jlist_push(c, r, jref(items->v[idx[i]]));
    jobj_unref(c, &blob->h);
    return r;
}

static val gen(jlist *l) { l->h.sub = L_GEN; return vlist(l); }

/* Python's int(str, base) and float(str); 0 when the text is not a number */
static int parse_int(const char *s, size_t n, int base, int64_t *out)
{
    size_t i = 0;
    while (i < n && py_isspace((unsigned char)s[i])) i++;
    while (n > i && py_isspace((unsigned char)s[n - 1])) n--;
    int neg = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i + 1 < n && s[i] == '0') {
        char p = (char)(s[i + 1] | 0x20);
        if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) i += 2;
    }
    if (i >= n) return 0;
    uint64_t v = 0;
    int prev_us = 1;
    for (; i < n; i++) {
        if (s[i] == '_') { if (prev_us) return 0; prev_us = 1; continue; }
        int d = s[i] >= '0' && s[i] <= '9' ? s[i] - '0' : (s[i] | 0x20) >= 'a' && (s[i] | 0x20) <= 'z' ? (s[i] | 0x20) - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return 0;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_us = 0;
    }
    if (prev_us || v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static int parse_float(const char *s, size_t n, double *out)
{
    char buf[128];
    size_t i = 0, o = 0;
    while (i < n && py_isspace((unsigned char)s[i])) i++;
    while (n > i && py_isspace((unsigned char)s[n - 1])) n--;
    if (i >= n || n - i >= sizeof buf) return 0;
    for (; i < n; i++) {
        if (s[i] == '_') {
            if (!o || i + 1 >= n || !(s[i + 1] >= '0' && s[i + 1] <= '9') || !(buf[o - 1] >= '0' && buf[o - 1] <= '9')) return 0;
            continue;
        }
        if (!strchr("0123456789+-.eEinfatyINFATY", s[i])) return 0;
        buf[o++] = s[i];
    }
    buf[o] = 0;
    const char *p = buf + (buf[0] == '+' || buf[0] == '-');
    if ((p[0] | 0x20) == 'i' || (p[0] | 0x20) == 'n') {
        if (strcasecmp(p, "inf") && strcasecmp(p, "infinity") && strcasecmp(p, "nan")) return 0;
    } else if (strchr(p, 'x') || strchr(p, 'X')) {
        return 0;
    }
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && end != buf;
}

/* Python's round(x, nd) for floats: correctly rounded, ties to even */
static double py_round(double x, int64_t nd)
{
    if (!isfinite(x)) return x;
    if (nd >= 0) {
        if (nd > 320) return x;
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        return strtod(buf, NULL);
    }
    if (nd < -308) return 0.0 * x;
    double p = pow(10.0, (double)-nd), y = x / p, r = nearbyint(y);
    return r * p;
}

/* ---- filters ---- */

static val call_filter_by_name(jctx *c, val name, val in, jargs *a)
{
    if (name.t != JT_STR) jfail(c, JE_RUNTIME, "No filter named %s.", jtype_name(name));
    int id = jfilter_id(S(name)->s, S(name)->len);
    if (id < 0) jfail(c, JE_RUNTIME, "No filter named '%s'.", S(name)->s);
    return jfilter_call(c, id, in, a);
}

static int call_test_by_name(jctx *c, val name, val in, jargs *a)
{
    if (name.t != JT_STR) jfail(c, JE_RUNTIME, "No test named %s.", jtype_name(name));
    int id = jtest_id(S(name)->s, S(name)->len);
    if (id < 0) jfail(c, JE_RUNTIME, "No test named '%s'.", S(name)->s);
    return jtest_call(c, id, in, a);
}

static val select_reject(jctx *c, val in, jargs *a, int want, int by_attr)
{
    jlist *r = jlist_new(c, L_GEN, 0);
    val rv = vlist(r);
    if (!jtruthy(c, in)) return rv;
    apath p = { 0 };
    int off = 0;
    if (by_attr) {
        if (a->n < 1) jfail(c, JE_RUNTIME, "Missing parameter for attribute name");
        apath_prep(c, &p, a->v[0], NULL, 0);
        off = 1;
    }
    jlist *items = jiterate(c, in);
    jargs ta = { a->n > off + 1 ? a->n - off - 1 : 0, a->v + off + 1, a->nk, a->kn, a->kv };
    for (size_t i = 0; i < items->n; i++) {
        jstep(c);
        val x = by_attr ? apath_get(c, &p, items->v[i], vundef0()) : jref(items->v[i]);
        int t = a->n > off ? call_test_by_name(c, a->v[off], x, &ta) : jtruthy(c, x);
        junref(c, x);
        if (t == want) jlist_push(c, r, jref(items->v[i]));
    }
    jobj_unref(c, &items->h);
    apath_free(c, &p);
    return rv;
}

/* An indent argument: a string as it is, a number as that many spaces
 * (0 to 255, written into spaces). */
static void indent_of(jctx *c, val v, char spaces[256], const char **ind, size_t *ind_n)
{
    if (v.t == JT_STR) {
        *ind = S(v)->s;
        *ind_n = S(v)->len;
        return;
    }
    int64_t k = want_int(c, v);
    if (k > 255) k = 255;
    if (k < 0) k = 0;
    memset(spaces, ' ', (size_t)k);
    *ind = spaces;
    *ind_n = (size_t)k;
}

static val f_tojson(jctx *c, val in, jargs *a)
{
    static const char *const n[] = { "ensure_ascii", "indent", "separators", "sort_keys" };
    val v[4];
    jbind(c, "tojson", a, n, 4, v);
    int ascii = given(v[0]) && jtruthy(c, v[0]);
    char spaces[256];
    const char *ind = NULL;
    size_t ind_n = 0;
    if (given(v[1]) && v[1].t != JT_NONE) indent_of(c, v[1], spaces, &ind, &ind_n);
    const char *isep = ind ? "," : ", ", *ksep = ": ";
    size_t isep_n = ind ? 1 : 2, ksep_n = 2;
    if (given(v[2]) && v[2].t != JT_NONE) {
        jlist *sep = v[2].t == JT_LIST ? L(v[2]) : NULL;
        if (!sep || sep->n != 2 || sep->v[0].t != JT_STR || sep->v[1].t != JT_STR)
            jfail(c, JE_TYPE, "separators must be a pair of strings");
        isep = S(sep->v[0])->s; isep_n = S(sep->v[0])->len;
        ksep = S(sep->v[1])->s; ksep_n = S(sep->v[1])->len;
    }
    jbuf b;
    jbuf_init(c, &b);
    jtojson(c, &b, in, ascii, ind, ind_n, isep, isep_n, ksep, ksep_n, given(v[3]) && jtruthy(c, v[3]));
    return jbuf_take(c, &b);
}

static val f_indent(jctx *c, val in, jargs *a)
{
    static const char *const n[] = { "width", "first", "blank" };
    val v[3];
    jbind(c, "indent", a, n, 3, v);
    if (in.t == JT_UNDEF) jundef_fail(c, in);
    if (in.t != JT_STR) jfail(c, JE_TYPE, "unsupported operand type(s) for +=: '%s' and 'str'", jtype_name(in));
    char spaces[256];
    const char *ind = "    ";
    size_t ind_n = 4;
    if (given(v[0])) indent_of(c, v[0], spaces, &ind, &ind_n);
    int first = given(v[1]) && jtruthy(c, v[1]), blank = given(v[2]) && jtruthy(c, v[2]);
    /* (s + "\n").splitlines() */
    jbuf tmp;
    jbuf_init(c, &tmp);
    jbuf_put(c, &tmp, S(in)->s, S(in)->len);
    jbuf_putc(c, &tmp, '\n');
    val sv = jbuf_take(c, &tmp);
    jstr *nl = jstr_new(c, "\n", 1);
    jargs none = { 0, NULL, 0, NULL, NULL };
    val lines = jstr_call(c, JF_S_SPLITLINES, S(sv), &none);
    jbuf b;
    jbuf_init(c, &b);
    if (first) jbuf_put(c, &b, ind, ind_n);
    jlist *l = L(lines);
    for (size_t i = 0; i < l->n; i++) {
        jstr *line = S(l->v[i]);
        if (i) {
            jbuf_putc(c, &b, '\n');
            if (blank || line->len) jbuf_put(c, &b, ind, ind_n);
        }
        jbuf_put(c, &b, line->s, line->len);
    }
    junref(c, lines);
    junref(c, sv);
    jobj_unref(c, &nl->h);
    return jbuf_take(c, &b);
}

static val f_round(jctx *c, val in, jargs *a)
{
    static const char *const n[] = { "precision", "method" };
    val v[2];
    jbind(c, "round", a, n, 2, v);
    int64_t prec = given(v[0]) ? want_int(c, v[0]) : 0;
    const char *m = "common";
    if (given(v[1])) {
        if (v[1].t != JT_STR) jfail(c, JE_RUNTIME, "method must be common, ceil or floor");
        m = S(v[1])->s;
    }
    if (strcmp(m, "common") && strcmp(m, "ceil") && strcmp(m, "floor"))
        jfail(c, JE_RUNTIME, "method must be common, ceil or floor");
    if (in.t == JT_UNDEF) jfail(c, JE_TYPE, "type Undefined doesn't define __round__ method");
    if (in.t != JT_INT && in.t != JT_BOOL && in.t != JT_FLOAT)
        jfail(c, JE_TYPE, "type %s doesn't define __round__ method", jtype_name(in));
    if (!strcmp(m, "common")) {
        if (in.t != JT_FLOAT) {
            if (prec >= 0) return vint(in.i);
            double r = py_round((double)in.i, prec);
            return vint((int64_t)r);
        }
        return vfloat(py_round(in.f, prec));
    }
    double x = in.t == JT_FLOAT ? in.f : (double)in.i, p = pow(10.0, (double)prec);
    return vfloat((!strcmp(m, "ceil") ? ceil(x * p) : floor(x * p)) / p);
}

static val minmax(jctx *c, val in, jargs *a, int is_max)
{
    static const char *const n[] = { "case_sensitive", "attribute" };
    val v[2];
    jbind(c, is_max ? "max" : "min", a, n, 2, v);
    jlist *items = jiterate(c, in);
    if (!items->n) {
        jobj_unref(c, &items->h);
        return vundef_hint(c, JE_UNDEFINED, "No aggregated item, sequence was empty.");
    }
    keyspec k;
    keyspec_prep(c, &k, v[1], 0, !(given(v[0]) && jtruthy(c, v[0])));
    size_t best = 0;
    val bk = key_of(c, &k, items->v[0]);
    for (size_t i = 1; i < items->n; i++) {
        val x = key_of(c, &k, items->v[i]);
        if (jcmp(c, x, bk, is_max ? OP_GT : OP_LT)) { junref(c, bk); bk = x; best = i; }
        else junref(c, x);
    }
    junref(c, bk);
    val r = jref(items->v[best]);
    keyspec_free(c, &k);
    jobj_unref(c, &items->h);
    return r;
}

/* s|format(*args) or s|format(**kwargs): printf-style, as Python's % */
static val f_format(jctx *c, val in, jargs *a)
{
    if (a->n && a->nk) jfail(c, JE_RUNTIME, "can't handle positional and keyword arguments at the same time");
    val s = vstr_of(c, in);
    val args;
    if (a->nk) {
        jdict *d = jdict_new(c, 0);
        args = vobj(JT_DICT, d);
        for (int i = 0; i < a->nk; i++) jdict_set(c, d, jref(vobj(JT_STR, (void *)a->kn[i])), jref(a->kv[i]));
    } else {
        jlist *t = jlist_new(c, L_TUPLE, (size_t)a->n);
        args = vlist(t);
        for (int i = 0; i < a->n; i++) jlist_push(c, t, jref(a->v[i]));
    }
    val r = jformat_percent(c, s, args);
    junref(c, args);
    junref(c, s);
    return r;
}

/* the items without repeats (first kept), by attribute and case when asked */
static val f_unique(jctx *c, val in, jargs *a)
{
    static const char *const n[] = { "case_sensitive", "attribute" };
    val v[2];
    jbind(c, "unique", a, n, 2, v);
    keyspec k;
    keyspec_prep(c, &k, v[1], 0, !(given(v[0]) && jtruthy(c, v[0])));
    jlist *items = jiterate(c, in);
    jdict *seen = jdict_new(c, 0);
    jlist *r = jlist_new(c, L_GEN, 0);
    for (size_t i = 0; i < items->n; i++) {
        val key = key_of(c, &k, items->v[i]);
        if (jdict_get(c, seen, key)) { junref(c, key); continue; }
        jdict_set(c, seen, key, vnone());
        jlist_push(c, r, jref(items->v[i]));
    }
    jobj_unref(c, &seen->h);
    jobj_unref(c, &items->h);
    keyspec_free(c, &k);
    return gen(r);
}

static val f_truncate(jctx *c, val in, jargs *a)
{
    static const char *const n[] = { "length", "killwords", "end", "leeway" };
    val v[4];
    jbind(c, "truncate", a, n, 4, v);
    if (in.t != JT_STR) jfail(c, JE_TYPE, "object of type '%s' has no len()", jtype_name(in));
    int64_t length = given(v[0]) ? want_int(c, v[0]) : 255, leeway = given(v[3]) && v[3].t != JT_NONE ? want_int(c, v[3]) : 5;
    val endv = given(v[2]) ? v[2] : vundef0();
    const char *end = "...";
    size_t end_n = 3;
    if (given(endv)) {
        if (endv.t != JT_STR) jfail(c, JE_TYPE, "end must be a string");
        end = S(endv)->s;
        end_n = S(endv)->len;
    }
    int64_t end_chars = 0;
    for (size_t i = 0; i < end_n; i++) end_chars += ((unsigned char)end[i] & 0xC0) != 0x80;
    if (length < end_chars) jfail(c, JE_RUNTIME, "AssertionError: expected length >= %lld, got %lld", (long long)end_chars, (long long)length);
    if (leeway < 0) jfail(c, JE_RUNTIME, "AssertionError: expected leeway >= 0, got %lld", (long long)leeway);
    jstr *s = S(in);
    if (jstr_nchars(s) <= length + leeway) return jref(in);
    jlist *chars = jiterate(c, in);
    jbuf b;
    jbuf_init(c, &b);
    int64_t keep = length - end_chars;
    for (int64_t i = 0; i < keep; i++) jbuf_put(c, &b, S(chars->v[i])->s, S(chars->v[i])->len);
    jobj_unref(c, &chars->h);
    if (!(given(v[1]) && jtruthy(c, v[1]))) {
        /* rsplit(" ", 1)[0] */
        size_t cut = b.n;
        while (cut > 0 && b.s[cut - 1] != ' ') cut--;
        if (cut > 0) b.n = cut - 1;
    }
    jbuf_put(c, &b, end, end_n);
    return jbuf_take(c, &b);
}

val jfilter_call(jctx *c, int id, val in, jargs *a)
{
    val v[4];
    switch (id) {
    case F_ABS:
        jbind(c, "abs", a, NULL, 0, v);
        if (in.t == JT_UNDEF) jundef_fail(c, in);
        if (in.t == JT_FLOAT) return vfloat(fabs(in.f));
        if (in.t == JT_INT || in.t == JT_BOOL) {
            if (in.i == INT64_MIN) jfail(c, JE_OVERFLOW, "integer too large");
            return vint(in.i < 0 ? -in.i : in.i);
        }
        jfail(c, JE_TYPE, "bad operand type for abs(): '%s'", jtype_name(in));
    case F_ATTR: {
        static const char *const n[] = { "name" };
        jbind(c, "attr", a, n, 1, v);
        if (v[0].t != JT_STR) return vundef_attr(c, in, v[0], 1);
        return jattr(c, in, S(v[0]));
    }
    case F_BATCH: {
        static const char *const n[] = { "linecount", "fill_with" };
        jbind(c, "batch", a, n, 2, v);
        int64_t k = want_int(c, v[0]);
        jlist *items = jiterate(c, in);
        jlist *r = jlist_new(c, L_GEN, 0);
        val rv = vlist(r);
        jlist *cur = NULL;
        for (size_t i = 0; i < items->n; i++) {
            if (!cur || (int64_t)cur->n == k) { cur = jlist_new(c, L_LIST, 0); jlist_push(c, r, vlist(cur)); }
            jlist_push(c, cur, jref(items->v[i]));
        }
        if (cur && given(v[1]) && v[1].t != JT_NONE)
            while ((int64_t)cur->n < k) jlist_push(c, cur, jref(v[1]));
        jobj_unref(c, &items->h);
        return rv;
    }
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
    case F_TITLE: {
        jbind(c, filter_names[id], a, NULL, 0, v);
        val s = vstr_of(c, in);
        val r = jcase(c, S(s), id == F_CAPITALIZE ? CASE_CAPITALIZE : id == F_LOWER ? CASE_LOWER
                              : id == F_UPPER ? CASE_UPPER : CASE_TITLE_JINJA);
        if (is_markup(s) && id != F_TITLE) r = jmark(c, r);
        junref(c, s);
        return r;
    }
    case F_CENTER: {
        static const char *const n[] = { "width" };
        jbind(c, "center", a, n, 1, v);
        val s = vstr_of(c, in);
        val w = given(v[0]) ? v[0] : vint(80);
        jargs ca = { 1, &w, 0, NULL, NULL };
        val r = jstr_call(c, JF_S_CENTER, S(s), &ca);
        junref(c, s);
        return r;
    }
    case F_COUNT:
    case F_LENGTH:
        jbind(c, "length", a, NULL, 0, v);
        return vint(length_of(c, in));
    case F_D:
    case F_DEFAULT: {
        static const char *const n[] = { "default_value", "boolean" };
        jbind(c, "default", a, n, 2, v);
        int boolean = given(v[1]) && jtruthy(c, v[1]);
        if (in.t == JT_UNDEF || (boolean && !jtruthy(c, in)))
            return given(v[0]) ? jref(v[0]) : vstr(c, "", 0);
        return jref(in);
    }
    case F_DICTSORT: {
        static const char *const n[] = { "case_sensitive", "by", "reverse" };
        jbind(c, "dictsort", a, n, 3, v);
        int pos = 0;
        if (given(v[1])) {
            if (v[1].t == JT_STR && !strcmp(S(v[1])->s, "value")) pos = 1;
            else if (!(v[1].t == JT_STR && !strcmp(S(v[1])->s, "key")))
                jfail(c, JE_RUNTIME, "You can only sort by either \"key\" or \"value\"");
        }
        if (in.t == JT_UNDEF) jundef_fail(c, in);
        if (in.t != JT_DICT) jfail(c, JE_RUNTIME, "'%s' object has no attribute 'items'", jtype_name(in));
        jdict *d = D(in);
        jlist *items = jlist_new(c, L_LIST, d->n), *keys = jlist_new(c, L_LIST, d->n);
        int ci = !(given(v[0]) && jtruthy(c, v[0]));
        for (size_t i = 0; i < d->n; i++) {
            jlist *t = jlist_new(c, L_TUPLE, 2);
            jlist_push(c, t, jref(d->e[i].k));
            jlist_push(c, t, jref(d->e[i].v));
            jlist_push(c, items, vlist(t));
            val k = jref(pos ? d->e[i].v : d->e[i].k);
            jlist_push(c, keys, ci ? ignore_case(c, k) : k);
        }
        jlist *r = sorted(c, items, keys, given(v[2]) && jtruthy(c, v[2]), L_LIST);
        jobj_unref(c, &items->h);
        jobj_unref(c, &keys->h);
        return vlist(r);
    }
    case F_E:
    case F_ESCAPE:
    case F_FORCEESCAPE:
        jbind(c, "escape", a, NULL, 0, v);
        return jescape(c, in, id == F_FORCEESCAPE);
    case F_FIRST: {
        jbind(c, "first", a, NULL, 0, v);
        if (in.t == JT_LIST && (L(in)->h.sub == L_GEN || L(in)->h.sub == L_REVITER)) {
            jlist *l = L(in);
            if (l->pos < l->n) return jref(l->v[l->pos++]);
        } else {
            jlist *items = jiterate(c, in);
            if (items->n) {
                val r = jref(items->v[0]);
                jobj_unref(c, &items->h);
                return r;
            }
            jobj_unref(c, &items->h);
        }
        return vundef_hint(c, JE_UNDEFINED, "No first item, sequence was empty.");
    }
    case F_LAST: {
        jbind(c, "last", a, NULL, 0, v);
        if (in.t == JT_LIST && (L(in)->h.sub == L_GEN || L(in)->h.sub == L_REVITER))
            jfail(c, JE_TYPE, "'%s' object is not reversible", jtype_name(in));
        if (in.t != JT_UNDEF && in.t != JT_STR && in.t != JT_LIST && in.t != JT_DICT)
            jfail(c, JE_TYPE, "'%s' object is not reversible", jtype_name(in));
        jlist *items = jiterate(c, in);
        val r = items->n ? jref(items->v[items->n - 1]) : vundef_hint(c, JE_UNDEFINED, "No last item, sequence was empty.");
        jobj_unref(c, &items->h);
        return r;
    }
    case F_FLOAT: {
        static const char *const n[] = { "default" };
        jbind(c, "float", a, n, 1, v);
        val dflt = given(v[0]) ? v[0] : vfloat(0.0);
        switch (in.t) {
        case JT_UNDEF: jundef_fail(c, in);
        case JT_FLOAT: return in;
        case JT_INT: case JT_BOOL: return vfloat((double)in.i);
        case JT_STR: {
            double d;
            if (parse_float(S(in)->s, S(in)->len, &d)) return vfloat(d);
            return jref(dflt);
        }
        }
        return jref(dflt);
    }
    case F_FORMAT: return f_format(c, in, a);
    case F_INDENT: return f_indent(c, in, a);
    case F_INT: {
        static const char *const n[] = { "default", "base" };
        jbind(c, "int", a, n, 2, v);
        val dflt = given(v[0]) ? v[0] : vint(0);
        int64_t base = given(v[1]) ? want_int(c, v[1]) : 10;
        int64_t r;
        double d;
        switch (in.t) {
        case JT_UNDEF: jundef_fail(c, in);
        case JT_INT: case JT_BOOL: return vint(in.i);
        case JT_FLOAT:
            if (isnan(in.f)) return jref(dflt);
            if (isinf(in.f) || fabs(in.f) >= 9.2e18) jfail(c, JE_OVERFLOW, "cannot convert float infinity to integer");
            return vint((int64_t)in.f);
        case JT_STR:
            if (base >= 2 && base <= 36 && parse_int(S(in)->s, S(in)->len, (int)base, &r)) return vint(r);
            if (parse_float(S(in)->s, S(in)->len, &d) && isfinite(d) && fabs(d) < 9.2e18) return vint((int64_t)d);
            return jref(dflt);
        }
        return jref(dflt);
    }
    case F_ITEMS: {
        jbind(c, "items", a, NULL, 0, v);
        jlist *r = jlist_new(c, L_GEN, 0);
        val rv = vlist(r);
        if (in.t == JT_UNDEF) return rv;
        if (in.t != JT_DICT) jfail(c, JE_TYPE, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < D(in)->n; i++) {
            jlist *t = jlist_new(c, L_TUPLE, 2);
            jlist_push(c, t, jref(D(in)->e[i].k));
            jlist_push(c, t, jref(D(in)->e[i].v));
            jlist_push(c, r, vlist(t));
        }
        return rv;
    }
    case F_JOIN: {
        static const char *const n[] = { "d", "attribute" };
        jbind(c, "join", a, n, 2, v);
        val sep = given(v[0]) ? vstr_of(c, v[0]) : vstr(c, "", 0);
        apath p = { 0 };
        int by_attr = given(v[1]) && v[1].t != JT_NONE;
        if (by_attr) apath_prep(c, &p, v[1], NULL, 0);
        jlist *items = jiterate(c, in);
        jbuf b;
        jbuf_init(c, &b);
        for (size_t i = 0; i < items->n; i++) {
            if (i) jbuf_put(c, &b, S(sep)->s, S(sep)->len);
            val x = by_attr ? apath_get(c, &p, items->v[i], vundef0()) : jref(items->v[i]);
            jstr_of(c, &b, x);
            junref(c, x);
        }
        jobj_unref(c, &items->h);
        apath_free(c, &p);
        junref(c, sep);
        return jbuf_take(c, &b);
    }
    case F_LIST: {
        jbind(c, "list", a, NULL, 0, v);
        jlist *items = jiterate(c, in);
        jlist *r = jlist_new(c, L_LIST, items->n);
        for (size_t i = 0; i < items->n; i++) jlist_push(c, r, jref(items->v[i]));
        jobj_unref(c, &items->h);
        return vlist(r);
    }
    case F_MAP: {
        jlist *r = jlist_new(c, L_GEN, 0);
        val rv = vlist(r);
        jlist *items = jiterate(c, in);
        if (!a->n && a->nk && !strcmp(a->kn[0]->s, "attribute")) {
            val attr = vundef0(), dflt = vundef0();
            for (int i = 0; i < a->nk; i++) {
                if (!strcmp(a->kn[i]->s, "attribute")) attr = a->kv[i];
                else if (!strcmp(a->kn[i]->s, "default")) dflt = a->kv[i];
                else jfail(c, JE_RUNTIME, "Unexpected keyword argument '%s'", a->kn[i]->s);
            }
            apath p;
            apath_prep(c, &p, attr, NULL, 0);
            for (size_t i = 0; i < items->n; i++) jlist_push(c, r, apath_get(c, &p, items->v[i], dflt));
            apath_free(c, &p);
        } else {
            if (!a->n) jfail(c, JE_RUNTIME, "map requires a filter argument");
            jargs fa = { a->n - 1, a->v + 1, a->nk, a->kn, a->kv };
            for (size_t i = 0; i < items->n; i++) {
                jstep(c);
                jlist_push(c, r, call_filter_by_name(c, a->v[0], items->v[i], &fa));
            }
        }
        jobj_unref(c, &items->h);
        return rv;
    }
    case F_MAX: return minmax(c, in, a, 1);
    case F_MIN: return minmax(c, in, a, 0);
    case F_PPRINT: {
        jbind(c, "pprint", a, NULL, 0, v);
        jbuf b;
        jbuf_init(c, &b);
        jrepr(c, &b, in);
        return jbuf_take(c, &b);
    }
    case F_REJECT: return select_reject(c, in, a, 0, 0);
    case F_REJECTATTR: return select_reject(c, in, a, 0, 1);
    case F_SELECT: return select_reject(c, in, a, 1, 0);
    case F_SELECTATTR: return select_reject(c, in, a, 1, 1);
    case F_REPLACE: {
        static const char *const n[] = { "old", "new", "count" };
        jbind(c, "replace", a, n, 3, v);
        if (!given(v[1])) jfail(c, JE_TYPE, "do_replace() missing required arguments");
        val s = vstr_of(c, in), o = vstr_of(c, v[0]), nw = vstr_of(c, v[1]);
        int64_t count = given(v[2]) && v[2].t != JT_NONE ? want_int(c, v[2]) : -1;
        val r = jreplace(c, S(s), S(o), S(nw), count);
        junref(c, s); junref(c, o); junref(c, nw);
        return r;
    }
    case F_REVERSE: {
        jbind(c, "reverse", a, NULL, 0, v);
        if (in.t == JT_STR) {
            jlist *chars = jiterate(c, in);
            jbuf b;
            jbuf_init(c, &b);
            for (size_t i = chars->n; i-- > 0;) jbuf_put(c, &b, S(chars->v[i])->s, S(chars->v[i])->len);
            jobj_unref(c, &chars->h);
            return jbuf_take(c, &b);
        }
        int rev_iter = in.t == JT_LIST && L(in)->h.sub != L_GEN && L(in)->h.sub != L_REVITER;
        if (in.t == JT_DICT) rev_iter = 2;
        jlist *items = jiterate(c, in);
        jlist *r = jlist_new(c, rev_iter ? L_REVITER : L_LIST, items->n);
        for (size_t i = items->n; i-- > 0;) jlist_push(c, r, jref(items->v[i]));
        jobj_unref(c, &items->h);
        return vlist(r);
    }
    case F_ROUND: return f_round(c, in, a);
    case F_SAFE:
        jbind(c, "safe", a, NULL, 0, v);
        return jmark(c, vstr_of(c, in));
    case F_STRING:
        jbind(c, "string", a, NULL, 0, v);
        return vstr_of(c, in);
    case F_SORT: {
        static const char *const n[] = { "reverse", "case_sensitive", "attribute" };
        jbind(c, "sort", a, n, 3, v);
        keyspec k;
        keyspec_prep(c, &k, v[2], 1, !(given(v[1]) && jtruthy(c, v[1])));
        jlist *items = jiterate(c, in);
        jlist *keys = jlist_new(c, L_LIST, items->n);
        for (size_t i = 0; i < items->n; i++) {
            val x = key_of(c, &k, items->v[i]);
            /* a single key compares as itself, not as a one-element list */
            if (L(x)->n == 1) { val one = jref(L(x)->v[0]); junref(c, x); x = one; }
            jlist_push(c, keys, x);
        }
        jlist *r = sorted(c, items, keys, given(v[0]) && jtruthy(c, v[0]), L_LIST);
        jobj_unref(c, &items->h);
        jobj_unref(c, &keys->h);
        keyspec_free(c, &k);
        return vlist(r);
    }
    case F_SUM: {
        static const char *const n[] = { "attribute", "start" };
        jbind(c, "sum", a, n, 2, v);
        apath p = { 0 };
        int by_attr = given(v[0]) && v[0].t != JT_NONE;
        if (by_attr) apath_prep(c, &p, v[0], NULL, 0);
        jlist *items = jiterate(c, in);
        val acc = given(v[1]) ? jref(v[1]) : vint(0);
        for (size_t i = 0; i < items->n; i++) {
            val x = by_attr ? apath_get(c, &p, items->v[i], vundef0()) : jref(items->v[i]);
            if (x.t == JT_STR) jfail(c, JE_TYPE, "unsupported operand type(s) for +: '%s' and 'str'", jtype_name(acc));
            int both_num = (acc.t == JT_INT || acc.t == JT_BOOL || acc.t == JT_FLOAT) &&
                           (x.t == JT_INT || x.t == JT_BOOL || x.t == JT_FLOAT);
            if (x.t == JT_UNDEF) jundef_fail(c, x);
            if (!both_num && !(acc.t == JT_LIST && x.t == JT_LIST))
                jfail(c, JE_TYPE, "unsupported operand type(s) for +: '%s' and '%s'", jtype_name(acc), jtype_name(x));
            val nacc;
            if (acc.t == JT_FLOAT || x.t == JT_FLOAT) nacc = vfloat((acc.t == JT_FLOAT ? acc.f : (double)acc.i) + (x.t == JT_FLOAT ? x.f : (double)x.i));
            else if (both_num) {
                int64_t s;
                if (__builtin_add_overflow(acc.i, x.i, &s)) jfail(c, JE_OVERFLOW, "integer too large");
                nacc = vint(s);
            } else {
                jlist *l = jlist_new(c, L(acc)->h.sub, L(acc)->n + L(x)->n);
                for (size_t j = 0; j < L(acc)->n; j++) jlist_push(c, l, jref(L(acc)->v[j]));
                for (size_t j = 0; j < L(x)->n; j++) jlist_push(c, l, jref(L(x)->v[j]));
                nacc = vlist(l);
            }
            junref(c, acc);
            junref(c, x);
            acc = nacc;
        }
        jobj_unref(c, &items->h);
        apath_free(c, &p);
        return acc;
    }
    case F_TOJSON: return f_tojson(c, in, a);
    case F_TRIM: {
        static const char *const n[] = { "chars" };
        jbind(c, "trim", a, n, 1, v);
        val s = vstr_of(c, in);
        const jstr *chars = given(v[0]) && v[0].t != JT_NONE ? (v[0].t == JT_STR ? S(v[0]) : NULL) : NULL;
        if (given(v[0]) && v[0].t != JT_NONE && v[0].t != JT_STR)
            jfail(c, JE_TYPE, "strip arg must be None or str");
        val r = jstrip(c, S(s), chars, 1, 1);
        if (is_markup(s)) r = jmark(c, r);
        junref(c, s);
        return r;
    }
    case F_TRUNCATE: return f_truncate(c, in, a);
    case F_UNIQUE: return f_unique(c, in, a);
    case F_WORDCOUNT: {
        jbind(c, "wordcount", a, NULL, 0, v);
        val s = vstr_of(c, in);
        int64_t words = 0;
        int in_word = 0;
        for (size_t i = 0; i < S(s)->len;) {
            uint32_t cp;
            i += (size_t)utf8_dec(S(s)->s + i, S(s)->len - i, &cp);
            int w = cp == '_' || py_isalnum_cp(cp);
            if (w && !in_word) words++;
            in_word = w;
        }
        junref(c, s);
        return vint(words);
    }
    }
    jfail(c, JE_RUNTIME, "unknown filter");
}

/* ---- tests ---- */

int jtest_call(jctx *c, int id, val in, jargs *a)
{
    val v[1];
    switch (id) {
    case TS_DEFINED: return in.t != JT_UNDEF;
    case TS_UNDEFINED: return in.t == JT_UNDEF;
    case TS_NONE: return in.t == JT_NONE;
    case TS_BOOLEAN: return in.t == JT_BOOL;
    case TS_FALSE: return in.t == JT_BOOL && !in.i;
    case TS_TRUE: return in.t == JT_BOOL && in.i;
    case TS_INTEGER: return in.t == JT_INT;
    case TS_FLOAT: return in.t == JT_FLOAT;
    case TS_NUMBER: return in.t == JT_INT || in.t == JT_FLOAT || in.t == JT_BOOL;
    case TS_STRING: return in.t == JT_STR;
    case TS_MAPPING: return in.t == JT_DICT;
    case TS_CALLABLE: return in.t == JT_FUNC || in.t == JT_MACRO || in.t == JT_LOOP || in.t == JT_UNDEF;
    case TS_ESCAPED: return 0;
    case TS_ITERABLE:
        return in.t == JT_UNDEF || in.t == JT_STR || in.t == JT_LIST || in.t == JT_DICT;
    case TS_SEQUENCE:
        if (in.t == JT_LIST) return L(in)->h.sub == L_LIST || L(in)->h.sub == L_TUPLE || L(in)->h.sub == L_RANGE;
        return in.t == JT_UNDEF || in.t == JT_STR || in.t == JT_DICT;
    case TS_LOWER:
    case TS_UPPER: {
        val s = vstr_of(c, in);
        jargs none = { 0, NULL, 0, NULL, NULL };
        val r = jstr_call(c, id == TS_LOWER ? JF_S_ISLOWER : JF_S_ISUPPER, S(s), &none);
        junref(c, s);
        return r.i != 0;
    }
    case TS_ODD:
    case TS_EVEN: {
        if (in.t == JT_UNDEF) jundef_fail(c, in);
        if (in.t == JT_FLOAT) {
            double m = fmod(in.f, 2.0);
            if (m < 0) m += 2.0;
            return id == TS_ODD ? m == 1.0 : m == 0.0;
        }
        if (in.t != JT_INT && in.t != JT_BOOL)
            jfail(c, JE_TYPE, "not all arguments converted during string formatting");
        int64_t m = in.i % 2;
        if (m < 0) m += 2;
        return id == TS_ODD ? m == 1 : m == 0;
    }
    case TS_FILTER:
    case TS_TEST:
        if (in.t != JT_STR) return 0;
        return id == TS_FILTER ? jfilter_id(S(in)->s, S(in)->len) >= 0 : jtest_id(S(in)->s, S(in)->len) >= 0;
    }
    static const char *const n[] = { "other" };
    jbind(c, test_names[id], a, n, 1, v);
    if (!given(v[0])) jfail(c, JE_TYPE, "%s() missing 1 required positional argument", test_names[id]);
    val o = v[0];
    switch (id) {
    case TS_DIVISIBLEBY: {
        if (in.t == JT_UNDEF) jundef_fail(c, in);
        if ((in.t == JT_INT || in.t == JT_BOOL) && (o.t == JT_INT || o.t == JT_BOOL)) {
            if (!o.i) jfail(c, JE_ZERODIV, "integer division or modulo by zero");
            return in.i % o.i == 0;
        }
        double x = in.t == JT_FLOAT ? in.f : (double)in.i, y = o.t == JT_FLOAT ? o.f : (double)o.i;
        if (y == 0) jfail(c, JE_ZERODIV, "float modulo");
        return fmod(x, y) == 0;
    }
    case TS_EQ: case TS_EQ2: case TS_EQUALTO: return jeq(c, in, o);
    case TS_NE: case TS_NE2: return !jeq(c, in, o);
    case TS_GE: case TS_GE2: return jcmp(c, in, o, OP_GE);
    case TS_GT: case TS_GT2: case TS_GREATERTHAN: return jcmp(c, in, o, OP_GT);
    case TS_LE: case TS_LE2: return jcmp(c, in, o, OP_LE);
    case TS_LT: case TS_LT2: case TS_LESSTHAN: return jcmp(c, in, o, OP_LT);
    case TS_SAMEAS:
        if (in.t != o.t) return 0;
        if (in.t == JT_NONE || in.t == JT_UNDEF) return in.t == JT_NONE || in.o == o.o;
        if (in.t == JT_BOOL || in.t == JT_INT) return in.i == o.i;
        if (in.t == JT_FLOAT) return 0;
        return in.o == o.o;
    case TS_IN: {
        if (o.t == JT_STR) {
            if (in.t != JT_STR) jfail(c, JE_TYPE, "'in <string>' requires string as left operand, not %s", jtype_name(in));
            return !S(in)->len || memmem(S(o)->s, S(o)->len, S(in)->s, S(in)->len) != NULL;
        }
        if (o.t == JT_DICT) return jdict_get(c, D(o), in) != NULL;
        if (o.t == JT_UNDEF) return 0;
        if (o.t != JT_LIST) jfail(c, JE_TYPE, "argument of type '%s' is not iterable", jtype_name(o));
        for (size_t i = L(o)->pos; i < L(o)->n; i++)
            if (jeq(c, L(o)->v[i], in)) return 1;
        return 0;
    }
    }
    jfail(c, JE_RUNTIME, "unknown test");
}
