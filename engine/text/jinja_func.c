/* jinja_func.c — the globals chat templates call (range with the sandbox's
 * MAX_RANGE, namespace, dict, raise_exception, strftime_now, joiner) and the
 * methods of strings, dicts, lists and loops the sandbox allows; the ones
 * that would change a list or dict in place are refused with jinja2's
 * SecurityError message. */
#include "engine/text/jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANGE 100000

static const char *const global_names[] = { "range", "namespace", "dict", "raise_exception", "strftime_now", "joiner" };

int jglobal_id(const char *s, size_t n)
{
    for (size_t i = 0; i < sizeof global_names / sizeof *global_names; i++)
        if (strlen(global_names[i]) == n && memcmp(global_names[i], s, n) == 0) return (int)i;
    return -1;
}

static int64_t want_int(jctx *c, val v)
{
    if (v.t == JT_UNDEF) jundef_fail(c, v);
    if (v.t != JT_INT && v.t != JT_BOOL)
        jfail(c, JE_TYPE, "'%s' object cannot be interpreted as an integer", jtype_name(v));
    return v.i;
}

static const struct { const char *name; int id; } str_methods[] = {
    { "capitalize", JF_S_CAPITALIZE }, { "casefold", JF_S_CASEFOLD }, { "center", JF_S_CENTER },
    { "count", JF_S_COUNT }, { "endswith", JF_S_ENDSWITH }, { "find", JF_S_FIND }, { "format", JF_S_FORMAT },
    { "index", JF_S_INDEX }, { "isalnum", JF_S_ISALNUM }, { "isalpha", JF_S_ISALPHA },
    { "isdecimal", JF_S_ISDECIMAL }, { "isdigit", JF_S_ISDIGIT }, { "islower", JF_S_ISLOWER },
    { "isnumeric", JF_S_ISNUMERIC }, { "isspace", JF_S_ISSPACE }, { "istitle", JF_S_ISTITLE },
    { "isupper", JF_S_ISUPPER }, { "join", JF_S_JOIN }, { "ljust", JF_S_LJUST }, { "lower", JF_S_LOWER },
    { "lstrip", JF_S_LSTRIP }, { "partition", JF_S_PARTITION }, { "removeprefix", JF_S_REMOVEPREFIX },
    { "removesuffix", JF_S_REMOVESUFFIX }, { "replace", JF_S_REPLACE }, { "rfind", JF_S_RFIND },
    { "rindex", JF_S_RINDEX }, { "rjust", JF_S_RJUST }, { "rpartition", JF_S_RPARTITION },
    { "rsplit", JF_S_RSPLIT }, { "rstrip", JF_S_RSTRIP }, { "split", JF_S_SPLIT },
    { "splitlines", JF_S_SPLITLINES }, { "startswith", JF_S_STARTSWITH }, { "strip", JF_S_STRIP },
    { "swapcase", JF_S_SWAPCASE }, { "title", JF_S_TITLE }, { "upper", JF_S_UPPER }, { "zfill", JF_S_ZFILL },
};

const char *jfunc_name(int id)
{
    if (id < JF_NGLOBALS) return global_names[id < 6 ? id : 0];
    for (size_t i = 0; i < sizeof str_methods / sizeof *str_methods; i++)
        if (str_methods[i].id == id) return str_methods[i].name;
    static const char *const other[] = { "get", "items", "keys", "values", "copy", "count", "index", "copy",
                                         "cycle", "changed", "joiner", "next", "reset" };
    return id >= JF_D_GET && id < JF_COUNT ? other[id - JF_D_GET] : "function";
}

static val vfunc(jctx *c, int id, val self)
{
    jfunc *f = jalloc(c, O_FUNC, sizeof *f);
    f->id = id;
    f->self = jref(self);
    return vobj(JT_FUNC, f);
}

val vglobal(jctx *c, int id) { return vfunc(c, id, vundef0()); }

static int name_is(const jstr *n, const char *s) { return strcmp(n->s, s) == 0; }

static int in_names(const jstr *n, const char *const *names)
{
    for (; *names; names++)
        if (name_is(n, *names)) return 1;
    return 0;
}

val jmethod(jctx *c, val obj, const jstr *name)
{
    static const char *const dict_unsafe[] = { "clear", "pop", "popitem", "setdefault", "update", NULL };
    static const char *const list_unsafe[] = { "append", "clear", "pop", "reverse", "insert", "sort", "extend",
                                               "remove", NULL };
    if (name->len > 4 && name->s[0] == '_' && name->s[1] == '_' && name->s[name->len - 1] == '_')
        return vundef_hint(c, JE_SECURITY, "access to attribute '%s' of '%s' object is unsafe.", name->s,
                           jtype_name(obj));
    switch (obj.t) {
    case JT_STR:
        for (size_t i = 0; i < sizeof str_methods / sizeof *str_methods; i++)
            if (name_is(name, str_methods[i].name)) return vfunc(c, str_methods[i].id, obj);
        break;
    case JT_DICT:
        if (name_is(name, "get")) return vfunc(c, JF_D_GET, obj);
        if (name_is(name, "items")) return vfunc(c, JF_D_ITEMS, obj);
        if (name_is(name, "keys")) return vfunc(c, JF_D_KEYS, obj);
        if (name_is(name, "values")) return vfunc(c, JF_D_VALUES, obj);
        if (name_is(name, "copy")) return vfunc(c, JF_D_COPY, obj);
        if (in_names(name, dict_unsafe))
            return vundef_hint(c, JE_SECURITY, "access to attribute '%s' of 'dict' object is unsafe.", name->s);
        break;
    case JT_LIST: {
        int k = L(obj)->h.sub;
        if (k != L_LIST && k != L_TUPLE) break;
        if (name_is(name, "count")) return vfunc(c, JF_L_COUNT, obj);
        if (name_is(name, "index")) return vfunc(c, JF_L_INDEX, obj);
        if (k == L_LIST && name_is(name, "copy")) return vfunc(c, JF_L_COPY, obj);
        if (k == L_LIST && in_names(name, list_unsafe))
            return vundef_hint(c, JE_SECURITY, "access to attribute '%s' of 'list' object is unsafe.", name->s);
        break;
    }
    case JT_LOOP:
        if (name_is(name, "cycle")) return vfunc(c, JF_LOOP_CYCLE, obj);
        if (name_is(name, "changed")) return vfunc(c, JF_LOOP_CHANGED, obj);
        break;
    }
    return vundef0();
}

/* ---- globals and methods ---- */

static val dict_from(jctx *c, jargs *a, int sub, const char *fn)
{
    jdict *d = jdict_new(c, sub);
    val dv = vobj(sub ? JT_NS : JT_DICT, d);
    if (a->n > 1) jfail(c, JE_TYPE, "%s expected at most 1 argument, got %d", fn, a->n);
    if (a->n == 1) {
        val src = a->v[0];
        if (src.t == JT_DICT || src.t == JT_NS) {
            for (size_t i = 0; i < D(src)->n; i++) jdict_set(c, d, jref(D(src)->e[i].k), jref(D(src)->e[i].v));
        } else {
            jlist *items = jiterate(c, src);
            for (size_t i = 0; i < items->n; i++) {
                jlist *pair = jiterate(c, items->v[i]);
                if (pair->n != 2)
                    jfail(c, JE_VALUE, "dictionary update sequence element #%zu has length %zu; 2 is required", i, pair->n);
                jdict_set(c, d, jref(pair->v[0]), jref(pair->v[1]));
                jobj_unref(c, &pair->h);
            }
            jobj_unref(c, &items->h);
        }
    }
    for (int i = 0; i < a->nk; i++) jdict_set(c, d, jref(vobj(JT_STR, (void *)a->kn[i])), jref(a->kv[i]));
    return dv;
}

static val strftime_now(jctx *c, jargs *a)
{
    static const char *const n[] = { "format" };
    val v[1];
    jbind(c, "strftime_now", a, n, 1, v);
    if (!given(v[0]) || v[0].t != JT_STR) jfail(c, JE_TYPE, "strftime() argument 1 must be str");
    jstr *f = S(v[0]);
    time_t t = (time_t)c->now;
    struct tm tm;
    localtime_r(&t, &tm);
    jbuf b;
    jbuf_init(c, &b);
    char one[4] = { '%', 0, 0, 0 }, out[256];
    for (size_t i = 0; i < f->len; i++) {
        if (f->s[i] != '%' || i + 1 >= f->len) { jbuf_putc(c, &b, f->s[i]); continue; }
        char k = f->s[++i];
        size_t fl = 2;
        one[1] = k;
        one[2] = 0;
        if ((k == '-' || k == '_' || k == '0' || k == '^' || k == '#') && i + 1 < f->len) {
            one[2] = f->s[++i];
            fl = 3;
        }
        (void)fl;
        char conv = one[2] ? one[2] : one[1];
        if (conv == 'f') { jbuf_put(c, &b, "000000", 6); continue; }
        if (conv == 'z' || conv == 'Z') continue;   /* naive datetime: empty */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        size_t m = strftime(out, sizeof out, one, &tm);
#pragma GCC diagnostic pop
        jbuf_put(c, &b, out, m);
    }
    return jbuf_take(c, &b);
}

val jfunc_call(jctx *c, jfunc *f, jargs *a)
{
    val v[3];
    val self = f->self;
    if (f->id >= JF_S_FIRST && f->id < JF_S_END) return jstr_call(c, f->id, S(self), a);
    switch (f->id) {
    case JF_RANGE: {
        static const char *const n[] = { "start", "stop", "step" };
        jbind(c, "range", a, n, 3, v);
        if (a->nk) jfail(c, JE_TYPE, "range() takes no keyword arguments");
        if (!a->n) jfail(c, JE_TYPE, "range expected at least 1 argument, got 0");
        int64_t start = 0, stop, step = 1;
        if (a->n == 1) stop = want_int(c, v[0]);
        else { start = want_int(c, v[0]); stop = want_int(c, v[1]); if (a->n == 3) step = want_int(c, v[2]); }
        if (!step) jfail(c, JE_VALUE, "range() arg 3 must not be zero");
        uint64_t len = jrange_len(start, stop, step);
        if (len > MAX_RANGE)
            jfail(c, JE_OVERFLOW, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
        jlist *r = jlist_new(c, L_RANGE, (size_t)len);
        r->r0 = start; r->r1 = stop; r->r2 = step;
        for (uint64_t j = 0; j < len; j++) jlist_push(c, r, vint((int64_t)((uint64_t)start + j * (uint64_t)step)));
        return vlist(r);
    }
    case JF_NAMESPACE: return dict_from(c, a, 1, "namespace");
    case JF_DICT: return dict_from(c, a, 0, "dict");
    case JF_RAISE: {
        static const char *const n[] = { "message" };
        jbind(c, "raise_exception", a, n, 1, v);
        if (!given(v[0])) jfail(c, JE_TYPE, "raise_exception() missing 1 required positional argument: 'message'");
        val s = vstr_of(c, v[0]);
        jfail(c, JE_RAISE, "%s", S(s)->s);
    }
    case JF_STRFTIME: return strftime_now(c, a);
    case JF_JOINER: {
        static const char *const n[] = { "sep" };
        jbind(c, "joiner", a, n, 1, v);
        jlist *st = jlist_new(c, L_LIST, 2);
        jlist_push(c, st, given(v[0]) ? jref(v[0]) : vstr(c, ", ", 2));
        jlist_push(c, st, vbool(0));
        val sv = vlist(st);
        val r = vfunc(c, JF_JOINER_CALL, sv);
        junref(c, sv);
        return r;
    }
    case JF_JOINER_CALL: {
        jlist *st = L(self);
        if (!st->v[1].i) { st->v[1] = vbool(1); return vstr(c, "", 0); }
        return jref(st->v[0]);
    }
    case JF_D_GET: {
        static const char *const n[] = { "key", "default" };
        jbind(c, "get", a, n, 2, v);
        if (!given(v[0])) jfail(c, JE_TYPE, "get expected at least 1 argument, got 0");
        val *x = jdict_get(c, D(self), v[0]);
        if (x) return jref(*x);
        return given(v[1]) ? jref(v[1]) : vnone();
    }
    case JF_D_ITEMS:
    case JF_D_KEYS:
    case JF_D_VALUES: {
        jbind(c, "items", a, NULL, 0, v);
        jdict *d = D(self);
        jlist *r = jlist_new(c, f->id == JF_D_ITEMS ? L_ITEMS : f->id == JF_D_KEYS ? L_KEYS : L_VALUES, d->n);
        for (size_t i = 0; i < d->n; i++) {
            if (f->id == JF_D_ITEMS) {
                jlist *t = jlist_new(c, L_TUPLE, 2);
                jlist_push(c, t, jref(d->e[i].k));
                jlist_push(c, t, jref(d->e[i].v));
                jlist_push(c, r, vlist(t));
            } else {
                jlist_push(c, r, jref(f->id == JF_D_KEYS ? d->e[i].k : d->e[i].v));
            }
        }
        return vlist(r);
    }
    case JF_D_COPY: {
        jbind(c, "copy", a, NULL, 0, v);
        jargs one = { 1, &self, 0, NULL, NULL };
        return dict_from(c, &one, 0, "dict");
    }
    case JF_L_COUNT:
    case JF_L_INDEX: {
        static const char *const n[] = { "value" };
        jbind(c, f->id == JF_L_COUNT ? "count" : "index", a, n, 1, v);
        jlist *l = L(self);
        int64_t k = 0;
        for (size_t i = 0; i < l->n; i++)
            if (jeq(c, l->v[i], v[0])) {
                if (f->id == JF_L_INDEX) return vint((int64_t)i);
                k++;
            }
        if (f->id == JF_L_INDEX) {
            jbuf b;
            jbuf_init(c, &b);
            jrepr(c, &b, v[0]);
            jfail(c, JE_VALUE, "%s is not in %s", b.s ? b.s : "", l->h.sub == L_TUPLE ? "tuple" : "list");
        }
        return vint(k);
    }
    case JF_L_COPY: {
        jbind(c, "copy", a, NULL, 0, v);
        jlist *l = L(self), *r = jlist_new(c, L_LIST, l->n);
        for (size_t i = 0; i < l->n; i++) jlist_push(c, r, jref(l->v[i]));
        return vlist(r);
    }
    case JF_LOOP_CYCLE: {
        jloop *l = (jloop *)self.o;
        if (!a->n) jfail(c, JE_TYPE, "no items for cycling given");
        return jref(a->v[l->i % (size_t)a->n]);
    }
    case JF_LOOP_CHANGED: {
        jloop *l = (jloop *)self.o;
        jlist *t = jlist_new(c, L_TUPLE, (size_t)a->n);
        val tv = vlist(t);
        for (int i = 0; i < a->n; i++) jlist_push(c, t, jref(a->v[i]));
        if (l->changed_set && jeq(c, l->changed_last, tv)) { junref(c, tv); return vbool(0); }
        junref(c, l->changed_last);
        l->changed_last = tv;
        l->changed_set = 1;
        return vbool(1);
    }
    }
    jfail(c, JE_TYPE, "'%s' object is not callable", jfunc_name(f->id));
}
