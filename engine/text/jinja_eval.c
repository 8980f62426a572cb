/* jinja_eval.c — running the tree: expressions with Python's operators,
 * jinja2's attribute and item lookup (the sandboxed getattr/getitem: dict
 * keys through `.`, methods that change a list or dict refused), statements
 * with jinja2's scoping (a for iteration, macro call, set/filter block or
 * with block is a new scope; if is not: hence namespace()), macros with
 * defaults, varargs/kwargs and caller, and the render entry point with its
 * bounds. Errors unwind with longjmp to jinja_render, which frees every
 * object the render made. */
#include "engine/text/jinja_int.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void exec_list(jctx *c, jnode **v, uint32_t n);

static void stack_check(jctx *c)
{
    char probe;
    uintptr_t a = (uintptr_t)c->stack_base, b = (uintptr_t)&probe;
    if ((a > b ? a - b : b - a) > c->lim.max_stack)
        jfail(c, JE_LIMIT, "the template nests too deeply (more than %zu bytes of stack)", c->lim.max_stack);
}

void jstep(jctx *c)
{
    if (++c->steps > c->lim.max_steps)
        jfail(c, JE_LIMIT, "the template ran more than %llu loop iterations and calls",
              (unsigned long long)c->lim.max_steps);
}

/* ---- attribute and item access ---- */

static int is_int(val v) { return v.t == JT_INT || v.t == JT_BOOL; }

static val loop_attr(jctx *c, jloop *l, const jstr *name)
{
    const char *s = name->s;
    size_t n = l->items->n, i = l->i;
    if (!strcmp(s, "index")) return vint((int64_t)i + 1);
    if (!strcmp(s, "index0")) return vint((int64_t)i);
    if (!strcmp(s, "revindex")) return vint((int64_t)(n - i));
    if (!strcmp(s, "revindex0")) return vint((int64_t)(n - i - 1));
    if (!strcmp(s, "first")) return vbool(i == 0);
    if (!strcmp(s, "last")) return vbool(i + 1 == n);
    if (!strcmp(s, "length")) return vint((int64_t)n);
    if (!strcmp(s, "depth")) return vint(l->depth);
    if (!strcmp(s, "depth0")) return vint(l->depth - 1);
    if (!strcmp(s, "previtem"))
        return i > 0 ? jref(l->items->v[i - 1]) : vundef_hint(c, JE_UNDEFINED, "there is no previous item");
    if (!strcmp(s, "nextitem"))
        return i + 1 < n ? jref(l->items->v[i + 1]) : vundef_hint(c, JE_UNDEFINED, "there is no next item");
    val lv = vobj(JT_LOOP, l);
    val m = jmethod(c, lv, name);
    return m.t != JT_UNDEF || m.o ? m : vundef_attr(c, lv, vobj(JT_STR, (void *)name), 0);
}

/* Python's getattr(obj, name) under the sandbox: methods (a refused one is
 * an undefined that raises SecurityError when used), a namespace's
 * attributes, a loop's; vundef0() when there is no such attribute. */
static val py_getattr(jctx *c, val obj, const jstr *name)
{
    if (obj.t == JT_LOOP) return loop_attr(c, (jloop *)obj.o, name);
    if (obj.t == JT_NS) {
        val *v = jdict_gets(D(obj), name->s, name->len);
        return v ? jref(*v) : vundef0();
    }
    return jmethod(c, obj, name);
}

/* the attr filter: getattr(obj, name) alone, no item lookup */
val jattr(jctx *c, val obj, const jstr *name)
{
    if (obj.t == JT_UNDEF) jundef_fail(c, obj);
    val m = py_getattr(c, obj, name);
    if (m.t != JT_UNDEF || m.o) return m;
    return vundef_attr(c, obj, vobj(JT_STR, (void *)name), 0);
}

/* environment.getattr: getattr(obj, name), else obj[name], else undefined */
val jgetattr(jctx *c, val obj, const jstr *name)
{
    if (obj.t == JT_UNDEF) jundef_fail(c, obj);
    val m = py_getattr(c, obj, name);
    if (m.t != JT_UNDEF || m.o) return m;
    if (obj.t == JT_DICT) {
        val *v = jdict_gets(D(obj), name->s, name->len);
        if (v) return jref(*v);
    }
    return vundef_attr(c, obj, vobj(JT_STR, (void *)name), 0);
}

static int hashable(val v)
{
    if (v.t == JT_DICT) return 0;
    if (v.t == JT_LIST) {
        if (L(v)->h.sub != L_TUPLE) return 0;
        for (size_t i = 0; i < L(v)->n; i++)
            if (!hashable(L(v)->v[i])) return 0;
    }
    return 1;
}

static int64_t seq_len(val v) { return v.t == JT_STR ? jstr_nchars(S(v)) : (int64_t)L(v)->n; }

/* byte offset of code point k in s (k <= nchars) */
static size_t cp_off(jstr *s, int64_t k)
{
    if (jstr_nchars(s) == (int64_t)s->len) return (size_t)k;
    size_t i = 0;
    for (; i < s->len && k > 0; i++)
        if (((unsigned char)s->s[i + 1] & 0xC0) != 0x80) k--;
    return i;
}

static int sliceable(val v)
{
    if (v.t == JT_STR) return 1;
    if (v.t != JT_LIST) return 0;
    int k = L(v)->h.sub;
    return k == L_LIST || k == L_TUPLE || k == L_RANGE;
}

/* environment.getitem: obj[key], else (for a string key) getattr, else undefined */
val jgetitem(jctx *c, val obj, val key)
{
    if (obj.t == JT_UNDEF) jundef_fail(c, obj);
    if (obj.t == JT_DICT && hashable(key)) {
        val *v = jdict_get(c, D(obj), key);
        if (v) return jref(*v);
    } else if (sliceable(obj) && is_int(key)) {
        int64_t n = seq_len(obj), i = key.i;
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            if (obj.t == JT_LIST) return jref(L(obj)->v[i]);
            jstr *s = S(obj);
            size_t a = cp_off(s, i);
            uint32_t cp;
            val r = vstr(c, s->s + a, (size_t)utf8_dec(s->s + a, s->len - a, &cp));
            return is_markup(obj) ? jmark(c, r) : r;
        }
    }
    if (key.t == JT_STR) {
        val m = py_getattr(c, obj, S(key));
        if (m.t != JT_UNDEF || m.o) return m;
    }
    return vundef_attr(c, obj, key, key.t != JT_STR);
}

static int64_t slice_bound(jctx *c, val v, int *none)
{
    *none = v.t == JT_NONE;
    if (*none) return 0;
    if (!is_int(v)) jfail(c, JE_TYPE, "slice indices must be integers or None or have an __index__ method");
    return v.i;
}

static val do_slice(jctx *c, val obj, val a, val b, val st)
{
    if (obj.t == JT_UNDEF) jundef_fail(c, obj);
    if (!sliceable(obj)) return vundef_attr(c, obj, vnone(), 1);
    int na, nb, ns;
    int64_t start = slice_bound(c, a, &na), stop = slice_bound(c, b, &nb), step = slice_bound(c, st, &ns);
    if (ns) step = 1;
    if (step == 0) jfail(c, JE_VALUE, "slice step cannot be zero");
    int64_t n = seq_len(obj);
    int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? n - 1 : n;
    if (na) start = step < 0 ? upper : lower;
    else { if (start < 0) start += n; if (start < lower) start = lower; else if (start > upper) start = upper; }
    if (nb) stop = step < 0 ? lower : upper;
    else { if (stop < 0) stop += n; if (stop < lower) stop = lower; else if (stop > upper) stop = upper; }
    if (obj.t == JT_STR) {
        jstr *s = S(obj);
        jbuf out;
        jbuf_init(c, &out);
        if (step == 1) {
            if (stop > start) {
                size_t x = cp_off(s, start), y = cp_off(s, stop);
                jbuf_put(c, &out, s->s + x, y - x);
            }
        } else {
            /* general steps: the code points as offsets */
            jlist *chars = jiterate(c, obj);
            uint64_t cnt = jrange_len(start, stop, step);
            for (uint64_t j = 0; j < cnt; j++) {
                int64_t i = (int64_t)((uint64_t)start + j * (uint64_t)step);
                jbuf_put(c, &out, S(chars->v[i])->s, S(chars->v[i])->len);
            }
            jobj_unref(c, &chars->h);
        }
        val r = jbuf_take(c, &out);
        return is_markup(obj) ? jmark(c, r) : r;
    }
    jlist *src = L(obj);
    jlist *r = jlist_new(c, src->h.sub == L_TUPLE ? L_TUPLE : L_LIST, 0);
    uint64_t cnt = jrange_len(start, stop, step);
    for (uint64_t j = 0; j < cnt; j++) jlist_push(c, r, jref(src->v[(int64_t)((uint64_t)start + j * (uint64_t)step)]));
    return vlist(r);
}

/* ---- operators ---- */

static int is_num(val v) { return v.t == JT_BOOL || v.t == JT_INT || v.t == JT_FLOAT; }
static double num(val v) { return v.t == JT_FLOAT ? v.f : (double)v.i; }

_Noreturn static void unsupported(jctx *c, const char *op, val a, val b)
{
    jfail(c, JE_TYPE, "unsupported operand type(s) for %s: '%s' and '%s'", op, jtype_name(a), jtype_name(b));
}

static double py_fmod(double x, double y)
{
    double m = fmod(x, y);
    if (m) { if ((y < 0) != (m < 0)) m += y; }
    else m = copysign(0.0, y);
    return m;
}

static double py_floordiv(double x, double y)
{
    double m = fmod(x, y), d = (x - m) / y;
    if (m && ((y < 0) != (m < 0))) d -= 1.0;
    if (d) {
        double f = floor(d);
        if (d - f > 0.5) f += 1.0;
        return f;
    }
    return copysign(0.0, x / y);
}

static val repeat(jctx *c, val s, int64_t k)
{
    if (k <= 0) return s.t == JT_STR ? vstr(c, "", 0) : vlist(jlist_new(c, L(s)->h.sub, 0));
    if (s.t == JT_STR) {
        size_t n = S(s)->len;
        if (n && (uint64_t)k > c->lim.max_memory / n) jfail(c, JE_LIMIT, "the template used more than %zu bytes of memory", c->lim.max_memory);
        size_t total = n * (size_t)k;
        jstr *r = jstr_new(c, NULL, total);
        /* copy doubling: k copies in log2(k) memcpy calls */
        if (n) memcpy(r->s, S(s)->s, n);
        for (size_t have = n; have < total;) {
            size_t m = have < total - have ? have : total - have;
            memcpy(r->s + have, r->s, m);
            have += m;
        }
        jcharge(c, total);
        return vobj(JT_STR, r);
    }
    jlist *l = L(s);
    if (l->n && (uint64_t)k > c->lim.max_memory / (l->n * sizeof(val))) jfail(c, JE_LIMIT, "the template used more than %zu bytes of memory", c->lim.max_memory);
    jlist *r = jlist_new(c, l->h.sub, l->n * (size_t)k);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < l->n; j++) jlist_push(c, r, jref(l->v[j]));
    return vlist(r);
}

static int plain_seq(val v) { return v.t == JT_LIST && (L(v)->h.sub == L_LIST || L(v)->h.sub == L_TUPLE); }

/* a + b, a - b or a * b on ints; where int64 overflows (Python's ints would
 * grow), an error */
static val int_arith(jctx *c, int op, int64_t x, int64_t y)
{
    int64_t r;
    int over = op == OP_ADD ? __builtin_add_overflow(x, y, &r)
             : op == OP_SUB ? __builtin_sub_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r);
    if (over) jfail(c, JE_OVERFLOW, "integer too large");
    return vint(r);
}

/* Python's a // b (mod 0) or a % b (mod 1) on numbers: the quotient
 * rounded down, the remainder with b's sign. */
static val floordiv_mod(jctx *c, int mod, val a, val b, int ints)
{
    if (ints) {
        if (!b.i) jfail(c, JE_ZERODIV, "integer division or modulo by zero");
        if (b.i == -1) {   /* INT64_MIN / -1 overflows in C */
            if (mod) return vint(0);
            if (a.i == INT64_MIN) jfail(c, JE_OVERFLOW, "integer too large");
            return vint(-a.i);
        }
        int64_t q = a.i / b.i, m = a.i % b.i;
        if (m && ((m < 0) != (b.i < 0))) { q--; m += b.i; }
        return vint(mod ? m : q);
    }
    if (is_num(a) && is_num(b)) {
        if (num(b) == 0) jfail(c, JE_ZERODIV, mod ? "float modulo" : "float floor division by zero");
        return vfloat(mod ? py_fmod(num(a), num(b)) : py_floordiv(num(a), num(b)));
    }
    unsupported(c, mod ? "%" : "//", a, b);
}

static val binop(jctx *c, int op, val a, val b)
{
    static const char *sym[] = { "", "+", "-", "*", "/", "//", "%", "** or pow()" };
    if (a.t == JT_UNDEF) jundef_fail(c, a);
    if (b.t == JT_UNDEF) jundef_fail(c, b);
    int ints = is_int(a) && is_int(b);
    switch (op) {
    case OP_ADD:
        if (ints) return int_arith(c, op, a.i, b.i);
        if (is_num(a) && is_num(b)) return vfloat(num(a) + num(b));
        if (a.t == JT_STR && b.t == JT_STR) {
            int mk = is_markup(a) || is_markup(b);
            val x = mk ? jescape(c, a, 0) : jref(a), y = mk ? jescape(c, b, 0) : jref(b);
            jbuf o;
            jbuf_init(c, &o);
            jbuf_put(c, &o, S(x)->s, S(x)->len);
            jbuf_put(c, &o, S(y)->s, S(y)->len);
            junref(c, x);
            junref(c, y);
            val r = jbuf_take(c, &o);
            return mk ? jmark(c, r) : r;
        }
        if (plain_seq(a) && plain_seq(b) && L(a)->h.sub == L(b)->h.sub) {
            jlist *r = jlist_new(c, L(a)->h.sub, L(a)->n + L(b)->n);
            for (size_t i = 0; i < L(a)->n; i++) jlist_push(c, r, jref(L(a)->v[i]));
            for (size_t i = 0; i < L(b)->n; i++) jlist_push(c, r, jref(L(b)->v[i]));
            return vlist(r);
        }
        if (a.t == JT_STR || plain_seq(a))
            jfail(c, JE_TYPE, "can only concatenate %s (not \"%s\") to %s", jtype_name(a), jtype_name(b), jtype_name(a));
        unsupported(c, "+", a, b);
    case OP_SUB:
        if (ints) return int_arith(c, op, a.i, b.i);
        if (is_num(a) && is_num(b)) return vfloat(num(a) - num(b));
        unsupported(c, "-", a, b);
    case OP_MUL:
        if (ints) return int_arith(c, op, a.i, b.i);
        if (is_num(a) && is_num(b)) return vfloat(num(a) * num(b));
        if ((a.t == JT_STR || plain_seq(a)) && is_int(b)) { val r = repeat(c, a, b.i); return is_markup(a) ? jmark(c, r) : r; }
        if ((b.t == JT_STR || plain_seq(b)) && is_int(a)) { val r = repeat(c, b, a.i); return is_markup(b) ? jmark(c, r) : r; }
        if (a.t == JT_STR || plain_seq(a) || b.t == JT_STR || plain_seq(b))
            jfail(c, JE_TYPE, "can't multiply sequence by non-int of type '%s'",
                  jtype_name(a.t == JT_STR || plain_seq(a) ? b : a));
        unsupported(c, "*", a, b);
    case OP_DIV:
        if (is_num(a) && is_num(b)) {
            if (num(b) == 0) jfail(c, JE_ZERODIV, ints ? "division by zero" : "float division by zero");
            return vfloat(num(a) / num(b));
        }
        unsupported(c, "/", a, b);
    case OP_FLOORDIV:
        return floordiv_mod(c, 0, a, b, ints);
    case OP_MOD:
        if (a.t == JT_STR && is_markup(a)) {
            /* Markup % args: the string arguments are escaped */
            val args = b;
            if (b.t == JT_LIST && L(b)->h.sub == L_TUPLE) {
                jlist *t = jlist_new(c, L_TUPLE, L(b)->n);
                for (size_t i = 0; i < L(b)->n; i++)
                    jlist_push(c, t, L(b)->v[i].t == JT_STR ? jescape(c, L(b)->v[i], 0) : jref(L(b)->v[i]));
                args = vlist(t);
            } else if (b.t == JT_STR) {
                args = jescape(c, b, 0);
            } else {
                args = jref(b);
            }
            val r = jformat_percent(c, a, args);
            junref(c, args);
            return jmark(c, r);
        }
        if (a.t == JT_STR) return jformat_percent(c, a, b);
        return floordiv_mod(c, 1, a, b, ints);
    case OP_POW:
        if (ints && b.i >= 0) {
            int64_t r = 1, base = a.i, e = b.i;
            while (e) {
                if (e & 1 && __builtin_mul_overflow(r, base, &r)) jfail(c, JE_OVERFLOW, "integer too large");
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) jfail(c, JE_OVERFLOW, "integer too large");
            }
            return vint(r);
        }
        if (is_num(a) && is_num(b)) {
            double x = num(a), y = num(b);
            if (x == 0 && y < 0) jfail(c, JE_ZERODIV, "0.0 cannot be raised to a negative power");
            return vfloat(pow(x, y));
        }
        unsupported(c, sym[op], a, b);
    }
    unsupported(c, "?", a, b);
}

static int contains(jctx *c, val container, val x)
{
    switch (container.t) {
    case JT_UNDEF: return 0;
    case JT_STR:
        if (x.t != JT_STR)
            jfail(c, JE_TYPE, "'in <string>' requires string as left operand, not %s", jtype_name(x));
        jcharge(c, S(container)->len);
        return S(x)->len == 0 || memmem(S(container)->s, S(container)->len, S(x)->s, S(x)->len) != NULL;
    case JT_DICT: return jdict_get(c, D(container), x) != NULL;
    case JT_LIST: {
        jlist *l = L(container);
        jcharge(c, l->n);
        for (size_t i = l->pos; i < l->n; i++)
            if (jeq(c, l->v[i], x)) return 1;
        return 0;
    }
    }
    jfail(c, JE_TYPE, "argument of type '%s' is not iterable", jtype_name(container));
}

static int compare(jctx *c, int op, val a, val b)
{
    switch (op) {
    case OP_EQ: return jeq(c, a, b);
    case OP_NE: return !jeq(c, a, b);
    case OP_IN: return contains(c, b, a);
    case OP_NOTIN: return !contains(c, b, a);
    }
    return jcmp(c, a, b, op);
}

/* ---- calls ---- */

#define INLINE_ARGS 8
typedef struct callargs {
    int n, nk;
    val *v;
    const jstr **kn;
    val *kv;
    jobj *blob;              /* storage when the inline arrays are too small */
    val sv[INLINE_ARGS], skv[INLINE_ARGS];
    const jstr *skn[INLINE_ARGS];
} callargs;

static void args_free(jctx *c, callargs *a)
{
    for (int i = 0; i < a->n; i++) junref(c, a->v[i]);
    for (int i = 0; i < a->nk; i++) { junref(c, a->kv[i]); junref(c, vobj(JT_STR, (void *)a->kn[i])); }
    if (a->blob) jobj_unref(c, a->blob);
}

/* Evaluates a call's arguments (with *args and **kwargs spread). */
static void eval_args(jctx *c, const jnode *n, callargs *a, int extra_kw)
{
    memset(a, 0, sizeof *a);
    val star = vundef0(), dstar = vundef0();
    jlist *sl = NULL;
    if (n->c) {
        star = jeval(c, n->c);
        sl = jiterate(c, star);
    }
    if (n->d) {
        dstar = jeval(c, n->d);
        if (dstar.t != JT_DICT) jfail(c, JE_TYPE, "argument after ** must be a mapping, not %s", jtype_name(dstar));
    }
    size_t np = n->nlist + (sl ? sl->n : 0), nk = n->nnames + (n->d ? D(dstar)->n : 0) + (size_t)extra_kw;
    if (np <= INLINE_ARGS && nk <= INLINE_ARGS) {
        a->v = a->sv;
        a->kv = a->skv;
        a->kn = a->skn;
    } else {
        size_t bytes = np * sizeof(val) + nk * (sizeof(val) + sizeof(jstr *)) + 16;
        jobj *blob = jalloc(c, O_STR, sizeof(jstr) + bytes);   /* plain storage (an unused string) */
        a->blob = blob;
        char *p = ((jstr *)blob)->s;
        a->v = (val *)p;
        a->kv = (val *)(p + np * sizeof(val));
        a->kn = (const jstr **)(p + (np + nk) * sizeof(val));
    }
    for (uint32_t i = 0; i < n->nlist; i++) a->v[a->n++] = jeval(c, n->list[i]);
    if (sl) {
        for (size_t i = 0; i < sl->n; i++) a->v[a->n++] = jref(sl->v[i]);
        jobj_unref(c, &sl->h);
        junref(c, star);
    }
    for (uint32_t i = 0; i < n->nnames; i++) {
        a->kv[a->nk] = jeval(c, n->list2[i]);
        a->kn[a->nk++] = n->names[i];
    }
    if (n->d) {
        jdict *d = D(dstar);
        for (size_t i = 0; i < d->n; i++) {
            if (d->e[i].k.t != JT_STR) jfail(c, JE_TYPE, "keywords must be strings");
            a->kv[a->nk] = jref(d->e[i].v);
            a->kn[a->nk++] = (const jstr *)jref(d->e[i].k).o;
        }
        junref(c, dstar);
    }
}

static val capture(jctx *c, jnode **body, uint32_t n, jscope *sc)
{
    jbuf b;
    jbuf_init(c, &b);
    jbuf *saved = c->out;
    jscope *ssc = c->sc;
    c->out = &b;
    c->sc = sc;
    exec_list(c, body, n);
    c->out = saved;
    c->sc = ssc;
    return jbuf_take(c, &b);
}

static val call_macro(jctx *c, jmacro *m, int nargs, val *args, int nkw, const jstr **kwn, val *kwv)
{
    const jnode *def = m->def;
    const char *name = m->name->s;
    if (++c->depth > c->lim.max_depth)
        jfail(c, JE_LIMIT, "macro calls nested more than %d deep", c->lim.max_depth);
    jscope *s = jscope_new(c, m->closure);
    uint32_t np = def->nnames;
    unsigned char used[256] = { 0 };
    if (nkw > 256) jfail(c, JE_TYPE, "too many keyword arguments");
    int found_caller = 0;
    for (uint32_t i = 0; i < np; i++) {
        const jstr *pn = def->names[i];
        if (!strcmp(pn->s, "caller")) found_caller = 1;
        if ((int)i < nargs) { jscope_set(c, s, pn, jref(args[i])); continue; }
        int k;
        for (k = 0; k < nkw; k++)
            if (!used[k] && kwn[k]->len == pn->len && !memcmp(kwn[k]->s, pn->s, pn->len)) break;
        if (k < nkw) {
            used[k] = 1;
            jscope_set(c, s, pn, jref(kwv[k]));
        } else if (def->list2 && def->list2[i]) {
            jscope *saved = c->sc;
            c->sc = s;
            val d = jeval(c, def->list2[i]);
            c->sc = saved;
            jscope_set(c, s, pn, d);
        } else {
            jscope_set(c, s, pn, vundef_hint(c, JE_UNDEFINED, "parameter '%s' was not provided", pn->s));
        }
    }
    if ((def->flags & MF_CALLER) && !found_caller) {
        val caller = vundef0();
        for (int k = 0; k < nkw; k++)
            if (!used[k] && !strcmp(kwn[k]->s, "caller")) { used[k] = 1; caller = jref(kwv[k]); }
        if (caller.t == JT_UNDEF) caller = vundef_hint(c, JE_UNDEFINED, "No caller defined");
        jscope_set(c, s, jname(JN_CALLER), caller);
    }
    if (def->flags & MF_KWARGS) {
        jdict *kd = jdict_new(c, 0);
        jscope_set(c, s, jname(JN_KWARGS), vobj(JT_DICT, kd));
        for (int k = 0; k < nkw; k++)
            if (!used[k]) jdict_set(c, kd, jref(vobj(JT_STR, (void *)kwn[k])), jref(kwv[k]));
    } else {
        for (int k = 0; k < nkw; k++)
            if (!used[k]) {
                if (!strcmp(kwn[k]->s, "caller"))
                    jfail(c, JE_TYPE, "macro '%s' was invoked with two values for the special caller argument. "
                          "This is most likely a bug.", name);
                jfail(c, JE_TYPE, "macro '%s' takes no keyword argument '%s'", name, kwn[k]->s);
            }
    }
    if (def->flags & MF_VARARGS) {
        jlist *va = jlist_new(c, L_TUPLE, 0);
        jscope_set(c, s, jname(JN_VARARGS), vlist(va));
        for (int i = (int)np; i < nargs; i++) jlist_push(c, va, jref(args[i]));
    } else if (nargs > (int)np) {
        jfail(c, JE_TYPE, "macro '%s' takes not more than %u argument(s)", name, np);
    }
    int line = c->cur_line;
    val r = capture(c, def->list, def->nlist, s);
    c->cur_line = line;
    jobj_unref(c, &s->h);
    c->depth--;
    return r;
}

static val run_loop(jctx *c, const jnode *n, jlist *items, int depth, jscope *outer, int capture_out);

val jcall(jctx *c, val fn, int nargs, val *args, int nkw, const jstr **kwn, val *kwv)
{
    switch (fn.t) {
    case JT_MACRO:
        jstep(c);
        return call_macro(c, (jmacro *)fn.o, nargs, args, nkw, kwn, kwv);
    case JT_FUNC: {
        jargs a = { nargs, args, nkw, kwn, kwv };
        return jfunc_call(c, (jfunc *)fn.o, &a);
    }
    case JT_LOOP: {
        jloop *l = (jloop *)fn.o;
        if (!(l->def->flags & MF_RECURSIVE))
            jfail(c, JE_TYPE, "The loop must have the 'recursive' marker to be called recursively.");
        if (nargs != 1 || nkw) jfail(c, JE_TYPE, "loop() takes exactly one argument");
        jstep(c);
        if (++c->depth > c->lim.max_depth)
            jfail(c, JE_LIMIT, "recursive loop calls nested more than %d deep", c->lim.max_depth);
        jlist *items = jiterate(c, args[0]);
        val r = run_loop(c, l->def, items, l->depth + 1, l->scope, 1);
        jobj_unref(c, &items->h);
        c->depth--;
        return r;
    }
    case JT_UNDEF: jundef_fail(c, fn);
    }
    jfail(c, JE_TYPE, "'%s' object is not callable", jtype_name(fn));
}

static val call_node(jctx *c, const jnode *n, val extra_caller)
{
    val fn = jeval(c, n->a);
    callargs a;
    eval_args(c, n, &a, extra_caller.t != JT_UNDEF);
    if (extra_caller.t != JT_UNDEF) {
        a.kn[a.nk] = jname(JN_CALLER);
        a.kv[a.nk++] = jref(extra_caller);
    }
    c->cur_line = n->line;
    val r = jcall(c, fn, a.n, a.v, a.nk, a.kn, a.kv);
    args_free(c, &a);
    junref(c, fn);
    return r;
}

/* The filter (or with `test`, the test) of node n on x, with n's
 * arguments. Takes x. */
static val apply_named(jctx *c, const jnode *n, val x, int test)
{
    callargs a;
    eval_args(c, n, &a, 0);
    c->cur_line = n->line;
    if (n->fid < 0) jfail(c, JE_RUNTIME, "No %s named '%s' found.", test ? "test" : "filter", n->name->s);
    jargs ja = { a.n, a.v, a.nk, a.kn, a.kv };
    val r = test ? vbool(jtest_call(c, n->fid, x, &ja)) : jfilter_call(c, n->fid, x, &ja);
    args_free(c, &a);
    junref(c, x);
    return r;
}

/* Applies a filter node (and the chain under it) to `in` when the chain's
 * innermost input is absent (set/filter blocks). Takes in. */
static val apply_filter(jctx *c, const jnode *f, val in, int pipe)
{
    val x;
    if (pipe && !f->a) x = in;
    else if (pipe) x = apply_filter(c, f->a, in, 1);
    else x = jeval(c, f->a);
    return apply_named(c, f, x, 0);
}

/* ---- expressions ---- */

val jeval(jctx *c, const jnode *n)
{
    stack_check(c);
    switch (n->kind) {
    case E_CONST: return jref(n->cst);
    case E_NAME: {
        val *v = jscope_find(c->sc, n->name);
        if (v) return jref(*v);
        int g = jglobal_id(n->name->s, n->name->len);
        if (g >= 0) return vglobal(c, g);
        return vundef_name(c, n->name);
    }
    case E_ATTR: {
        val o = jeval(c, n->a);
        c->cur_line = n->line;
        val r = jgetattr(c, o, n->name);
        junref(c, o);
        return r;
    }
    case E_ITEM: {
        val o = jeval(c, n->a), k = jeval(c, n->b);
        c->cur_line = n->line;
        val r = jgetitem(c, o, k);
        junref(c, o);
        junref(c, k);
        return r;
    }
    case E_SLICE: {
        val o = jeval(c, n->a);
        val a = n->b ? jeval(c, n->b) : vnone(), b = n->c ? jeval(c, n->c) : vnone(), s = n->d ? jeval(c, n->d) : vnone();
        c->cur_line = n->line;
        val r = do_slice(c, o, a, b, s);
        junref(c, o); junref(c, a); junref(c, b); junref(c, s);
        return r;
    }
    case E_CALL: return call_node(c, n, vundef0());
    case E_FILTER: return apply_filter(c, n, vundef0(), 0);
    case E_TEST: return apply_named(c, n, jeval(c, n->a), 1);
    case E_NOT: {
        val x = jeval(c, n->a);
        int r = !jtruthy(c, x);
        junref(c, x);
        return vbool(r);
    }
    case E_NEG:
    case E_POS: {
        val x = jeval(c, n->a);
        c->cur_line = n->line;
        if (x.t == JT_UNDEF) jundef_fail(c, x);
        if (x.t == JT_FLOAT) return vfloat(n->kind == E_NEG ? -x.f : x.f);
        if (is_int(x)) {
            if (n->kind == E_POS) return vint(x.i);
            if (x.i == INT64_MIN) jfail(c, JE_OVERFLOW, "integer too large");
            return vint(-x.i);
        }
        jfail(c, JE_TYPE, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jtype_name(x));
    }
    case E_AND:
    case E_OR: {
        val l = jeval(c, n->a);
        int t = jtruthy(c, l);
        if (n->kind == E_AND ? !t : t) return l;
        junref(c, l);
        return jeval(c, n->b);
    }
    case E_CONCAT: {
        jbuf b;
        jbuf_init(c, &b);
        for (uint32_t i = 0; i < n->nlist; i++) {
            val x = jeval(c, n->list[i]);
            jstr_of(c, &b, x);
            junref(c, x);
        }
        return jbuf_take(c, &b);
    }
    case E_BIN: {
        val a = jeval(c, n->a), b = jeval(c, n->b);
        c->cur_line = n->line;
        val r = binop(c, n->op, a, b);
        junref(c, a);
        junref(c, b);
        return r;
    }
    case E_CMP: {
        val l = jeval(c, n->a);
        for (uint32_t i = 0; i < n->nlist; i++) {
            val r = jeval(c, n->list[i]->a);
            c->cur_line = n->line;
            int ok = compare(c, n->list[i]->op, l, r);
            junref(c, l);
            l = r;
            if (!ok) { junref(c, l); return vbool(0); }
        }
        junref(c, l);
        return vbool(1);
    }
    case E_COND: {
        val t = jeval(c, n->a);
        int ok = jtruthy(c, t);
        junref(c, t);
        if (ok) return jeval(c, n->b);
        if (n->c) return jeval(c, n->c);
        return vundef_hint(c, JE_UNDEFINED, "the inline if-expression on line %d evaluated to false and no else "
                           "section was defined.", n->line);
    }
    case E_LIST:
    case E_TUPLE: {
        jlist *l = jlist_new(c, n->kind == E_TUPLE ? L_TUPLE : L_LIST, n->nlist);
        val lv = vlist(l);
        for (uint32_t i = 0; i < n->nlist; i++) jlist_push(c, l, jeval(c, n->list[i]));
        return lv;
    }
    case E_DICT: {
        jdict *d = jdict_new(c, 0);
        val dv = vobj(JT_DICT, d);
        for (uint32_t i = 0; i < n->nlist; i++) {
            val k = jeval(c, n->list[i]);
            val v = jeval(c, n->list2[i]);
            jdict_set(c, d, k, v);
        }
        return dv;
    }
    }
    jfail(c, JE_RUNTIME, "cannot evaluate this node");
}

/* ---- statements ---- */

static void assign(jctx *c, const jnode *t, val v, jscope *sc)
{
    if (t->kind == E_NAME) {
        jscope_set(c, sc, t->name, v);
        return;
    }
    if (t->kind == E_NSREF) {
        val *ns = jscope_find(c->sc, t->name);
        if (!ns || ns->t != JT_NS) {
            junref(c, v);
            jfail(c, JE_RUNTIME, "cannot assign attribute on non-namespace object");
        }
        jdict_set(c, D(*ns), jref(vobj(JT_STR, (void *)t->a->name)), v);
        return;
    }
    /* a tuple of targets */
    jlist *items = jiterate(c, v);
    if (items->n != t->nlist) {
        if (items->n > t->nlist) jfail(c, JE_VALUE, "too many values to unpack (expected %u)", t->nlist);
        jfail(c, JE_VALUE, "not enough values to unpack (expected %u, got %zu)", t->nlist, items->n);
    }
    for (uint32_t i = 0; i < t->nlist; i++) assign(c, t->list[i], jref(items->v[i]), sc);
    jobj_unref(c, &items->h);
    junref(c, v);
}

static val run_loop(jctx *c, const jnode *n, jlist *items, int depth, jscope *outer, int capture_out)
{
    jbuf cap;
    jbuf *saved_out = c->out;
    jscope *saved_sc = c->sc;
    if (capture_out) {
        jbuf_init(c, &cap);
        c->out = &cap;
    }
    jlist *run = items;
    items->h.rc++;
    if (n->c) {
        /* the loop filter: items failing it are not part of the loop at all */
        jlist *kept = jlist_new(c, L_LIST, 0);
        for (size_t i = 0; i < items->n; i++) {
            jstep(c);
            jscope *s = jscope_new(c, outer);
            assign(c, n->a, jref(items->v[i]), s);
            c->sc = s;
            val t = jeval(c, n->c);
            c->sc = saved_sc;
            if (jtruthy(c, t)) jlist_push(c, kept, jref(items->v[i]));
            junref(c, t);
            jobj_unref(c, &s->h);
        }
        jobj_unref(c, &run->h);
        run = kept;
    }
    jloop *lp = jalloc(c, O_LOOP, sizeof *lp);
    lp->items = run;
    run->h.rc++;
    lp->depth = depth;
    lp->def = n;
    lp->scope = outer;
    outer->h.rc++;
    jscope *it = NULL;
    for (size_t i = 0; i < run->n; i++) {
        jstep(c);
        lp->i = i;
        /* each iteration is a fresh scope; the last one is reused when
         * nothing (a macro defined in the body) kept hold of it */
        if (it && it->h.rc == 1) jscope_clear(c, it);
        else {
            if (it) jobj_unref(c, &it->h);
            it = jscope_new(c, outer);
        }
        jscope_set(c, it, jname(JN_LOOP), jref(vobj(JT_LOOP, lp)));
        assign(c, n->a, jref(run->v[i]), it);
        c->sc = it;
        exec_list(c, n->list, n->nlist);
        c->sc = saved_sc;
        if (c->brk) {
            int b = c->brk;
            c->brk = 0;
            if (b == 1) break;
        }
    }
    if (it) jobj_unref(c, &it->h);
    if (run->n == 0 && n->nlist2) {
        jscope *s = jscope_new(c, outer);
        c->sc = s;
        exec_list(c, n->list2, n->nlist2);
        c->sc = saved_sc;
        jobj_unref(c, &s->h);
    }
    jobj_unref(c, &lp->h);
    jobj_unref(c, &run->h);
    if (capture_out) {
        c->out = saved_out;
        return jbuf_take(c, &cap);
    }
    return vundef0();
}

static jmacro *new_macro(jctx *c, const jnode *def, const jstr *name)
{
    jmacro *m = jalloc(c, O_MACRO, sizeof *m);
    m->def = def;
    m->closure = c->sc;
    c->sc->h.rc++;
    m->name = name;
    m->caller = vundef0();
    return m;
}

static void exec(jctx *c, const jnode *n)
{
    stack_check(c);
    c->cur_line = n->line;
    switch (n->kind) {
    case N_DATA: jbuf_put(c, c->out, n->name->s, n->name->len); return;
    case N_OUT: {
        val v = jeval(c, n->a);
        jstr_of(c, c->out, v);
        junref(c, v);
        return;
    }
    case N_IF: {
        val t = jeval(c, n->a);
        int ok = jtruthy(c, t);
        junref(c, t);
        if (ok) exec_list(c, n->list, n->nlist);
        else exec_list(c, n->list2, n->nlist2);
        return;
    }
    case N_FOR: {
        val it = jeval(c, n->b);
        c->cur_line = n->line;
        jlist *items = jiterate(c, it);
        junref(c, it);
        run_loop(c, n, items, 1, c->sc, 0);
        jobj_unref(c, &items->h);
        return;
    }
    case N_SET: assign(c, n->a, jeval(c, n->b), c->sc); return;
    case N_SETBLOCK: {
        jscope *s = jscope_new(c, c->sc);
        val v = capture(c, n->list, n->nlist, s);
        jobj_unref(c, &s->h);
        if (n->b) v = apply_filter(c, n->b, v, 1);
        assign(c, n->a, v, c->sc);
        return;
    }
    case N_FILTERBLOCK: {
        jscope *s = jscope_new(c, c->sc);
        val v = capture(c, n->list, n->nlist, s);
        jscope *saved = c->sc;
        c->sc = s;
        v = apply_filter(c, n->a, v, 1);
        c->sc = saved;
        jobj_unref(c, &s->h);
        jstr_of(c, c->out, v);
        junref(c, v);
        return;
    }
    case N_WITH: {
        jscope *s = jscope_new(c, c->sc);
        for (uint32_t i = 0; i < n->nlist2; i++) assign(c, n->list2[i]->a, jeval(c, n->list2[i]->b), s);
        jscope *saved = c->sc;
        c->sc = s;
        exec_list(c, n->list, n->nlist);
        c->sc = saved;
        jobj_unref(c, &s->h);
        return;
    }
    case N_MACRO: {
        jmacro *m = new_macro(c, n, n->name);
        jscope_set(c, c->sc, n->name, vobj(JT_MACRO, m));
        return;
    }
    case N_CALLBLOCK: {
        jmacro *m = new_macro(c, n, jname(JN_CALLER));
        val mv = vobj(JT_MACRO, m);
        val r = call_node(c, n->a, mv);
        junref(c, mv);
        jstr_of(c, c->out, r);
        junref(c, r);
        return;
    }
    case N_GENERATION: {
        jscope *s = jscope_new(c, c->sc);
        val v = capture(c, n->list, n->nlist, s);
        jobj_unref(c, &s->h);
        jstr_of(c, c->out, v);
        junref(c, v);
        return;
    }
    case N_BREAK: c->brk = 1; return;
    case N_CONTINUE: c->brk = 2; return;
    }
}

static void exec_list(jctx *c, jnode **v, uint32_t n)
{
    for (uint32_t i = 0; i < n && !c->brk; i++) exec(c, v[i]);
}

/* ---- entry ---- */

void jinja_default_limits(jinja_limits *lim)
{
    lim->max_output = 64u << 20;
    lim->max_memory = 256u << 20;
    lim->max_steps = 10000000;
    lim->max_work = 2ULL << 30;
    lim->max_depth = 200;
    lim->max_stack = 2u << 20;
}

int jinja_render(const jinja_tpl *t, const json_t *vars, int64_t now, const jinja_limits *lim,
                 char **out, size_t *out_len, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    *out = NULL;
    *out_len = 0;
    if (vars && !json_is_object(vars)) {
        if (err && errlen) snprintf(err, errlen, "the variables must be a JSON object");
        return JINJA_EINPUT;
    }
    jctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return JINJA_ELIMIT;
    }
    char base;
    c->tpl = t;
    if (lim) c->lim = *lim;
    else jinja_default_limits(&c->lim);
    c->live.next = c->live.prev = &c->live;
    c->now = now;
    c->err = err;
    c->errlen = errlen;
    c->stack_base = &base;
    int rc = JINJA_OK;
    if (setjmp(c->jb) == 0) {
        jbuf top;
        jbuf_init(c, &top);
        c->out = &top;
        c->root = c->sc = jscope_new(c, NULL);
        if (vars) {
            const char *k;
            json_t *x;
            json_object_foreach((json_t *)vars, k, x) {
                jstr *name = jstr_new(c, k, strlen(k));
                jscope_set(c, c->root, name, jfrom_json(c, x, 1));
                jobj_unref(c, &name->h);
            }
        }
        exec_list(c, t->body, t->nbody);
        *out = malloc(top.n + 1);
        if (!*out) jfail(c, JE_NOMEM, "out of memory");
        if (top.n) memcpy(*out, top.s, top.n);
        (*out)[top.n] = 0;
        *out_len = top.n;
    } else {
        rc = c->err_kind == JE_RAISE ? JINJA_ERAISE
           : c->err_kind == JE_LIMIT || c->err_kind == JE_NOMEM ? JINJA_ELIMIT : JINJA_ERUNTIME;
        free(*out);
        *out = NULL;
        *out_len = 0;
    }
    jrelease_all(c);
    free(c);
    return rc;
}
