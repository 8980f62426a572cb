/* jinja_val.c — the interpreter's values: allocation with a memory bound,
 * reference counts and the per-render list that frees what errors and cycles
 * leave behind; strings, lists, dicts and scopes; and Python's semantics for
 * them: truth, ==, ordering, hashing, str() and repr(), json.dumps (the
 * transformers tojson: non-ASCII kept, indent, separators, sort_keys). */
#include "engine/text/jinja_int.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_VALUE_DEPTH 500

/* ---- errors and bounds ---- */

void jfail(jctx *c, int kind, const char *fmt, ...)
{
    static const char *names[] = { "", "TemplateSyntaxError", "TemplateError", "UndefinedError", "SecurityError",
                                   "TypeError", "ValueError", "ZeroDivisionError", "OverflowError",
                                   "TemplateRuntimeError", "LimitError", "MemoryError" };
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->err_kind = kind;
    c->err_line = c->cur_line;
    if (c->err && c->errlen) {
        if (kind == JE_RAISE) snprintf(c->err, c->errlen, "%s", msg);
        else snprintf(c->err, c->errlen, "%s: %s (line %d)", names[kind], msg, c->cur_line);
    }
    longjmp(c->jb, 1);
}

void jcharge(jctx *c, uint64_t work)
{
    c->work += work;
    if (c->work > c->lim.max_work)
        jfail(c, JE_LIMIT, "the template did more than %llu bytes of string and list work",
              (unsigned long long)c->lim.max_work);
}

static void mem_add(jctx *c, jobj *o, size_t bytes)
{
    if (c->mem + bytes > c->lim.max_memory || c->mem + bytes < c->mem)
        jfail(c, JE_LIMIT, "the template used more than %zu bytes of memory", c->lim.max_memory);
    c->mem += bytes;
    if (o) o->bytes += bytes;
    jcharge(c, bytes);
}

static void mem_sub(jctx *c, jobj *o, size_t bytes)
{
    c->mem -= bytes;
    if (o) o->bytes -= bytes;
}

void *jalloc(jctx *c, int kind, size_t bytes)
{
    mem_add(c, NULL, bytes);
    jobj *o = calloc(1, bytes);
    if (!o) {
        c->mem -= bytes;
        jfail(c, JE_NOMEM, "out of memory");
    }
    o->bytes = bytes;
    o->rc = 1;
    o->kind = (uint8_t)kind;
    o->next = c->live.next;
    o->prev = &c->live;
    c->live.next->prev = o;
    c->live.next = o;
    return o;
}

/* a growable array owned by o (its bytes counted to o) */
static void *grow(jctx *c, jobj *o, void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t nc = *cap ? *cap : 4;
    while (nc < need) nc *= 2;
    if (nc > SIZE_MAX / elem / 2) jfail(c, JE_LIMIT, "value too large");
    mem_add(c, o, (nc - *cap) * elem);
    void *np = realloc(p, nc * elem);
    if (!np) jfail(c, JE_NOMEM, "out of memory");
    *cap = nc;
    return np;
}

typedef struct jblob { jobj h; char *p; } jblob;

static void free_one(jctx *c, jobj *o)
{
    switch (o->kind) {
    case O_LIST: free(((jlist *)o)->v); break;
    case O_DICT: free(((jdict *)o)->e); free(((jdict *)o)->idx); break;
    case O_SCOPE: free(((jscope *)o)->v); break;
    case O_BLOB: free(((jblob *)o)->p); break;
    }
    c->mem -= o->bytes;
    o->prev->next = o->next;
    o->next->prev = o->prev;
    free(o);
}

val jref(val v)
{
    if (vheap(v) && v.o->rc != RC_IMMORTAL) v.o->rc++;
    return v;
}

/* Drops one reference; objects reaching zero are freed with a work list
 * (not recursion), so a deeply nested value cannot exhaust the stack. */
static void drop(jobj **work, jobj *o)
{
    if (!o || o->rc == RC_IMMORTAL) return;
    if (--o->rc) return;
    /* unlink from the live list; reuse `next` as the work list link */
    o->prev->next = o->next;
    o->next->prev = o->prev;
    o->prev = NULL;
    o->next = *work;
    *work = o;
}

static void dropv(jobj **work, val v)
{
    if (vheap(v)) drop(work, v.o);
}

void jobj_unref(jctx *c, jobj *o)
{
    jobj *work = NULL;
    drop(&work, o);
    while (work) {
        jobj *x = work;
        work = x->next;
        switch (x->kind) {
        case O_LIST: {
            jlist *l = (jlist *)x;
            for (size_t i = 0; i < l->n; i++) dropv(&work, l->v[i]);
            free(l->v);
            break;
        }
        case O_DICT: {
            jdict *d = (jdict *)x;
            for (size_t i = 0; i < d->n; i++) { dropv(&work, d->e[i].k); dropv(&work, d->e[i].v); }
            free(d->e);
            free(d->idx);
            break;
        }
        case O_FUNC: dropv(&work, ((jfunc *)x)->self); break;
        case O_MACRO:
            drop(&work, &((jmacro *)x)->closure->h);
            dropv(&work, ((jmacro *)x)->caller);
            break;
        case O_LOOP: {
            jloop *l = (jloop *)x;
            drop(&work, &l->items->h);
            dropv(&work, l->changed_last);
            if (l->scope) drop(&work, &l->scope->h);
            break;
        }
        case O_UNDEF: {
            jundef *u = (jundef *)x;
            dropv(&work, u->key);
            if (u->hint) drop(&work, &u->hint->h);
            break;
        }
        case O_SCOPE: {
            jscope *s = (jscope *)x;
            if (s->parent) drop(&work, &s->parent->h);
            for (size_t i = 0; i < s->n; i++) {
                dropv(&work, s->v[i].v);
                drop(&work, (jobj *)&s->v[i].name->h);
            }
            free(s->v);
            break;
        }
        case O_BLOB: free(((jblob *)x)->p); break;
        }
        c->mem -= x->bytes;
        free(x);
    }
}

void junref(jctx *c, val v)
{
    if (vheap(v)) jobj_unref(c, v.o);
}

void jrelease_all(jctx *c)
{
    while (c->live.next != &c->live) free_one(c, c->live.next);
}

void jdepth_enter(jctx *c)
{
    if (++c->vdepth > MAX_VALUE_DEPTH) jfail(c, JE_LIMIT, "value nested more than %d deep", MAX_VALUE_DEPTH);
}

uint64_t jrange_len(int64_t start, int64_t stop, int64_t step)
{
    if (step > 0) return start < stop ? ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1 : 0;
    if (step < 0) return start > stop ? ((uint64_t)start - (uint64_t)stop - 1) / (0 - (uint64_t)step) + 1 : 0;
    return 0;
}

/* ---- output buffers ---- */

void jbuf_init(jctx *c, jbuf *b)
{
    (void)c;
    b->blob = NULL;   /* made on the first write: an empty capture costs nothing */
    b->s = NULL;
    b->n = b->cap = 0;
}

void jbuf_put(jctx *c, jbuf *b, const char *s, size_t n)
{
    if (!n) return;
    if (b->n + n > c->lim.max_output)
        jfail(c, JE_LIMIT, "the template wrote more than %zu bytes", c->lim.max_output);
    if (b->n + n + 1 > b->cap) {
        if (!b->blob) b->blob = jalloc(c, O_BLOB, sizeof(jblob));
        jblob *bl = (jblob *)b->blob;
        bl->p = grow(c, b->blob, bl->p, &b->cap, b->n + n + 1, 1);
        b->s = bl->p;
    } else {
        jcharge(c, n);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void jbuf_putc(jctx *c, jbuf *b, char ch) { jbuf_put(c, b, &ch, 1); }

void jbuf_printf(jctx *c, jbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) jbuf_put(c, b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

val jbuf_take(jctx *c, jbuf *b)
{
    val v = vstr(c, b->s ? b->s : "", b->n);
    jbuf_free(c, b);
    return v;
}

void jbuf_free(jctx *c, jbuf *b)
{
    if (b->blob) jobj_unref(c, b->blob);
    b->blob = NULL;
    b->s = NULL;
    b->n = b->cap = 0;
}

/* ---- UTF-8 ---- */

int utf8_dec(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) { *cp = u[0]; return 1; }
    if (u[0] < 0xE0) { *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); return 2; }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) { *cp = u[0]; return 1; }
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
          (u[3] & 0x3F);
    return 4;
}

size_t utf8_enc(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int py_isspace(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x1f);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- strings, lists, dicts, scopes ---- */

jstr *jstr_new(jctx *c, const char *s, size_t n)
{
    jstr *r = jalloc(c, O_STR, sizeof *r + n + 1);
    r->len = n;
    r->nchars = -1;
    if (n && s) memcpy(r->s, s, n);
    r->s[n] = 0;
    return r;
}

val vstr(jctx *c, const char *s, size_t n) { return vobj(JT_STR, jstr_new(c, s, n)); }
val vcstr(jctx *c, const char *s) { return vstr(c, s, strlen(s)); }

int64_t jstr_nchars(jstr *s)
{
    if (s->nchars >= 0) return s->nchars;
    int64_t k = 0;
    for (size_t i = 0; i < s->len; i++) k += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    if (s->h.rc != RC_IMMORTAL) s->nchars = k;   /* immortal strings are shared: never written */
    return k;
}

jlist *jlist_new(jctx *c, int sub, size_t cap)
{
    jlist *l = jalloc(c, O_LIST, sizeof *l);
    l->h.sub = (uint8_t)sub;
    if (cap) l->v = grow(c, &l->h, NULL, &l->cap, cap, sizeof(val));
    return l;
}

void jlist_push(jctx *c, jlist *l, val v)
{
    if (l->n == l->cap) l->v = grow(c, &l->h, l->v, &l->cap, l->n + 1, sizeof(val));
    l->v[l->n++] = v;
}

val vlist(jlist *l) { return vobj(JT_LIST, l); }

jdict *jdict_new(jctx *c, int sub)
{
    jdict *d = jalloc(c, O_DICT, sizeof *d);
    d->h.sub = (uint8_t)sub;
    return d;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

uint64_t jhash(jctx *c, val v)
{
    switch (v.t) {
    case JT_NONE: return 0x9e3779b97f4a7c15ULL;
    case JT_BOOL:
    case JT_INT: return mix64((uint64_t)v.i);
    case JT_FLOAT:
        if (v.f == floor(v.f) && fabs(v.f) < 9.2e18) return mix64((uint64_t)(int64_t)v.f);
        { uint64_t b; memcpy(&b, &v.f, 8); return mix64(b); }
    case JT_STR: return hash_bytes(S(v)->s, S(v)->len);
    case JT_LIST:
        if (L(v)->h.sub == L_TUPLE) {
            uint64_t h = 0x345678;
            jdepth_enter(c);
            for (size_t i = 0; i < L(v)->n; i++) h = mix64(h ^ jhash(c, L(v)->v[i])) + i;
            jdepth_leave(c);
            return h;
        }
        break;
    case JT_UNDEF: return 0x1234;
    case JT_FUNC: case JT_MACRO: case JT_NS: case JT_LOOP: return mix64((uint64_t)(uintptr_t)v.o);
    }
    jfail(c, JE_TYPE, "unhashable type: '%s'", jtype_name(v));
}

static void index_rebuild(jctx *c, jdict *d)
{
    size_t nc = 16;
    while (nc < d->n * 2 + 2) nc *= 2;
    size_t old = d->idxcap;
    uint32_t *idx = calloc(nc, sizeof *idx);
    if (!idx) jfail(c, JE_NOMEM, "out of memory");
    mem_add(c, &d->h, nc * sizeof *idx);
    free(d->idx);
    mem_sub(c, &d->h, old * sizeof *idx);
    d->idx = idx;
    d->idxcap = nc;
    for (size_t i = 0; i < d->n; i++) {
        size_t k = d->e[i].hash & (nc - 1);
        while (idx[k]) k = (k + 1) & (nc - 1);
        idx[k] = (uint32_t)(i + 1);
    }
}

static long find_slot(jctx *c, jdict *d, val k, uint64_t h)
{
    if (!d->idxcap) {
        for (size_t i = 0; i < d->n; i++)
            if (d->e[i].hash == h && jeq(c, d->e[i].k, k)) return (long)i;
        return -1;
    }
    size_t m = d->idxcap - 1;
    for (size_t p = h & m; d->idx[p]; p = (p + 1) & m) {
        size_t i = d->idx[p] - 1;
        if (d->e[i].hash == h && jeq(c, d->e[i].k, k)) return (long)i;
    }
    return -1;
}

val *jdict_get(jctx *c, jdict *d, val k)
{
    long i = find_slot(c, d, k, jhash(c, k));
    return i < 0 ? NULL : &d->e[i].v;
}

val *jdict_gets(jdict *d, const char *s, size_t n)
{
    uint64_t h = hash_bytes(s, n);
    if (!d->idxcap) {
        for (size_t i = 0; i < d->n; i++) {
            jent *e = &d->e[i];
            if (e->hash == h && e->k.t == JT_STR && S(e->k)->len == n && memcmp(S(e->k)->s, s, n) == 0) return &e->v;
        }
        return NULL;
    }
    size_t m = d->idxcap - 1;
    for (size_t p = h & m; d->idx[p]; p = (p + 1) & m) {
        jent *e = &d->e[d->idx[p] - 1];
        if (e->hash == h && e->k.t == JT_STR && S(e->k)->len == n && memcmp(S(e->k)->s, s, n) == 0) return &e->v;
    }
    return NULL;
}

void jdict_set(jctx *c, jdict *d, val k, val v)
{
    uint64_t h = jhash(c, k);
    long i = find_slot(c, d, k, h);
    if (i >= 0) {
        val old = d->e[i].v;
        d->e[i].v = v;
        junref(c, k);
        junref(c, old);
        return;
    }
    if (d->n == d->cap) d->e = grow(c, &d->h, d->e, &d->cap, d->n + 1, sizeof(jent));
    d->e[d->n++] = (jent){ k, v, h };
    if (d->n > 8 && d->n * 2 + 2 > d->idxcap) index_rebuild(c, d);
    else if (d->idxcap) {
        size_t m = d->idxcap - 1, p = h & m;
        while (d->idx[p]) p = (p + 1) & m;
        d->idx[p] = (uint32_t)d->n;
    }
}

jscope *jscope_new(jctx *c, jscope *parent)
{
    jscope *s = jalloc(c, O_SCOPE, sizeof *s);
    s->parent = parent;
    if (parent) parent->h.rc++;
    return s;
}

static int same_name(const jstr *a, const jstr *b)
{
    return a == b || (a->len == b->len && memcmp(a->s, b->s, a->len) == 0);
}

void jscope_set(jctx *c, jscope *s, const jstr *name, val v)
{
    for (size_t i = 0; i < s->n; i++)
        if (same_name(s->v[i].name, name)) {
            val old = s->v[i].v;
            s->v[i].v = v;
            junref(c, old);
            return;
        }
    if (s->n == s->cap) s->v = grow(c, &s->h, s->v, &s->cap, s->n + 1, sizeof(jvar));
    /* names from the template are immortal; others are held by the scope */
    if (name->h.rc != RC_IMMORTAL) ((jobj *)&name->h)->rc++;
    s->v[s->n++] = (jvar){ name, v };
}

void jscope_clear(jctx *c, jscope *s)
{
    size_t n = s->n;
    s->n = 0;
    for (size_t i = 0; i < n; i++) {
        junref(c, s->v[i].v);
        if (s->v[i].name->h.rc != RC_IMMORTAL) jobj_unref(c, (jobj *)&s->v[i].name->h);
    }
}

val *jscope_find(jscope *s, const jstr *name)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (same_name(s->v[i].name, name)) return &s->v[i].v;
    return NULL;
}

/* ---- undefined ---- */

/* Each type's Python name (type(v).__name__) and what jinja2's undefined
 * messages call an object of it ("'dict object' has no attribute 'x'"). */
typedef struct type_names { const char *name, *obj; } type_names;

static const type_names *names_of(val v)
{
    static const type_names by_type[] = {
        [JT_UNDEF] = { "Undefined", "Undefined" },
        [JT_NONE] = { "NoneType", "None" },
        [JT_BOOL] = { "bool", "bool object" },
        [JT_INT] = { "int", "int object" },
        [JT_FLOAT] = { "float", "float object" },
        [JT_STR] = { "str", "str object" },
        [JT_DICT] = { "dict", "dict object" },
        [JT_NS] = { "Namespace", "jinja2.utils.Namespace object" },
        [JT_LOOP] = { "LoopContext", "jinja2.runtime.LoopContext object" },
        [JT_MACRO] = { "Macro", "jinja2.runtime.Macro object" },
        [JT_FUNC] = { "builtin_function_or_method", "builtin_function_or_method object" },
    };
    static const type_names by_sub[] = {   /* the kinds of JT_LIST */
        [L_LIST] = { "list", "list object" },
        [L_TUPLE] = { "tuple", "tuple object" },
        [L_GEN] = { "generator", "generator object" },
        [L_REVITER] = { "list_reverseiterator", "list_reverseiterator object" },
        [L_ITEMS] = { "dict_items", "dict_items object" },
        [L_KEYS] = { "dict_keys", "dict_keys object" },
        [L_VALUES] = { "dict_values", "dict_values object" },
        [L_RANGE] = { "range", "range object" },
    };
    static const type_names other = { "object", "Undefined" };
    if (v.t == JT_LIST) {
        unsigned sub = L(v)->h.sub;
        return &by_sub[sub < sizeof by_sub / sizeof by_sub[0] ? sub : L_LIST];
    }
    if ((unsigned)v.t < sizeof by_type / sizeof by_type[0] && by_type[v.t].name) return &by_type[v.t];
    return &other;
}

val vundef_name(jctx *c, const jstr *name)
{
    jundef *u = jalloc(c, O_UNDEF, sizeof *u);
    u->key = jref(vobj(JT_STR, (void *)name));
    u->exc = JE_UNDEFINED;
    return vobj(JT_UNDEF, u);
}

val vundef_attr(jctx *c, val obj, val key, int is_elem)
{
    jundef *u = jalloc(c, O_UNDEF, sizeof *u);
    u->key = jref(key);
    u->otype = names_of(obj)->obj;
    u->is_elem = is_elem;
    u->exc = JE_UNDEFINED;
    return vobj(JT_UNDEF, u);
}

val vundef_hint(jctx *c, int exc, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jundef *u = jalloc(c, O_UNDEF, sizeof *u);
    u->hint = jstr_new(c, msg, k < 0 ? 0 : (size_t)k < sizeof msg ? (size_t)k : sizeof msg - 1);
    u->exc = exc;
    return vobj(JT_UNDEF, u);
}

void jundef_fail(jctx *c, val v)
{
    jundef *u = (jundef *)v.o;
    if (!u) jfail(c, JE_UNDEFINED, "undefined value");
    if (u->hint) jfail(c, u->exc, "%s", u->hint->s);
    jbuf b;
    jbuf_init(c, &b);
    jrepr(c, &b, u->key);
    if (!u->otype) jfail(c, u->exc, "%s is undefined", b.s);
    if (u->is_elem) jfail(c, u->exc, "%s has no element %s", u->otype, b.s);
    jfail(c, u->exc, "'%s' has no attribute %s", u->otype, b.s);
}

/* ---- type names, truth, equality, order ---- */

const char *jtype_name(val v) { return names_of(v)->name; }

int jtruthy(jctx *c, val v)
{
    (void)c;
    switch (v.t) {
    case JT_UNDEF: case JT_NONE: return 0;
    case JT_BOOL: case JT_INT: return v.i != 0;
    case JT_FLOAT: return v.f != 0;
    case JT_STR: return S(v)->len > 0;
    case JT_LIST: return L(v)->h.sub == L_GEN || L(v)->h.sub == L_REVITER || L(v)->n > 0;
    case JT_DICT: return D(v)->n > 0;
    }
    return 1;
}

static int is_num(val v) { return v.t == JT_BOOL || v.t == JT_INT || v.t == JT_FLOAT; }
static double num(val v) { return v.t == JT_FLOAT ? v.f : (double)v.i; }

static int seq_kind(val v)
{
    return v.t == JT_LIST && (L(v)->h.sub == L_LIST || L(v)->h.sub == L_TUPLE || L(v)->h.sub == L_RANGE)
               ? (L(v)->h.sub == L_TUPLE ? 2 : L(v)->h.sub == L_RANGE ? 3 : 1) : 0;
}

int jeq(jctx *c, val a, val b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) return a.i == b.i;
        return num(a) == num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JT_UNDEF: case JT_NONE: return 1;
    case JT_STR: return S(a)->len == S(b)->len && memcmp(S(a)->s, S(b)->s, S(a)->len) == 0;
    case JT_LIST: {
        int ka = seq_kind(a), kb = seq_kind(b);
        if (!ka || ka != kb) {
            int va = L(a)->h.sub, vb = L(b)->h.sub;
            if (va == vb && (va == L_KEYS || va == L_ITEMS || va == L_VALUES) && va != L_VALUES) {
                /* dict views compare as sets */
                if (L(a)->n != L(b)->n) return 0;
                for (size_t i = 0; i < L(a)->n; i++) {
                    int f = 0;
                    for (size_t j = 0; j < L(b)->n && !f; j++) f = jeq(c, L(a)->v[i], L(b)->v[j]);
                    if (!f) return 0;
                }
                return 1;
            }
            return a.o == b.o;
        }
        if (L(a)->n != L(b)->n) return 0;
        jdepth_enter(c);
        for (size_t i = 0; i < L(a)->n; i++)
            if (!jeq(c, L(a)->v[i], L(b)->v[i])) { jdepth_leave(c); return 0; }
        jdepth_leave(c);
        return 1;
    }
    case JT_DICT: {
        if (D(a)->n != D(b)->n) return 0;
        jdepth_enter(c);
        for (size_t i = 0; i < D(a)->n; i++) {
            val *o = jdict_get(c, D(b), D(a)->e[i].k);
            if (!o || !jeq(c, D(a)->e[i].v, *o)) { jdepth_leave(c); return 0; }
        }
        jdepth_leave(c);
        return 1;
    }
    }
    return a.o == b.o;
}

static const char *op_sym(int op)
{
    return op == OP_LT ? "<" : op == OP_LE ? "<=" : op == OP_GT ? ">" : ">=";
}

static int ord_result(int r, int op)
{
    return op == OP_LT ? r < 0 : op == OP_LE ? r <= 0 : op == OP_GT ? r > 0 : r >= 0;
}

int jcmp(jctx *c, val a, val b, int op)
{
    if (a.t == JT_UNDEF) jundef_fail(c, a);
    if (b.t == JT_UNDEF) jundef_fail(c, b);
    if (is_num(a) && is_num(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) return ord_result(a.i < b.i ? -1 : a.i > b.i, op);
        double x = num(a), y = num(b);
        if (x != x || y != y) return 0;
        return ord_result(x < y ? -1 : x > y, op);
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t n = S(a)->len < S(b)->len ? S(a)->len : S(b)->len;
        int r = memcmp(S(a)->s, S(b)->s, n);
        if (!r) r = S(a)->len < S(b)->len ? -1 : S(a)->len > S(b)->len;
        return ord_result(r, op);
    }
    int ka = seq_kind(a);
    if (ka && ka == seq_kind(b) && ka != 3) {
        jlist *x = L(a), *y = L(b);
        jdepth_enter(c);
        size_t i = 0;
        while (i < x->n && i < y->n && jeq(c, x->v[i], y->v[i])) i++;
        int r;
        if (i < x->n && i < y->n) r = jcmp(c, x->v[i], y->v[i], op);
        else r = ord_result(x->n < y->n ? -1 : x->n > y->n, op);
        jdepth_leave(c);
        return r;
    }
    jfail(c, JE_TYPE, "'%s' not supported between instances of '%s' and '%s'", op_sym(op), jtype_name(a),
          jtype_name(b));
}

/* ---- repr and str ---- */

void jfloat_repr(char *buf, size_t cap, double f)
{
    if (isnan(f)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(f)) { snprintf(buf, cap, f < 0 ? "-inf" : "inf"); return; }
    char e[64];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e is [-]d[.ddd]e[+-]XX: digits and decimal exponent */
    char dig[32];
    int nd = 0, neg = 0;
    const char *q = e;
    if (*q == '-') { neg = 1; q++; }
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = 0;
    int decpt = exp10 + 1;
    char *o = buf;
    size_t left = cap;
#define PUT(...) do { int k_ = snprintf(o, left, __VA_ARGS__); if (k_ < 0 || (size_t)k_ >= left) return; o += k_; left -= (size_t)k_; } while (0)
    if (neg) PUT("-");
    if (decpt <= -4 || decpt > 16) {
        PUT("%c", dig[0]);
        if (nd > 1) PUT(".%s", dig + 1);
        PUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        PUT("0.");
        for (int i = 0; i < -decpt; i++) PUT("0");
        PUT("%s", dig);
    } else if (decpt < nd) {
        PUT("%.*s.%s", decpt, dig, dig + decpt);
    } else {
        PUT("%s", dig);
        for (int i = nd; i < decpt; i++) PUT("0");
        PUT(".0");
    }
#undef PUT
}

static int printable(uint32_t cp)
{
    if (cp == ' ') return 1;
    switch ((int)utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    }
    return 1;
}

/* A character's escape (into tmp, or a literal), NULL when it stands as
 * itself; *k: its length in bytes (1, or a UTF-8 sequence's). */
typedef const char *esc_fn(const char *s, size_t n, size_t i, size_t *k, char tmp[16], int arg);

/* s[0..n) between quotes q, each character as esc gives it; the runs that
 * need no escape copied whole. */
static void put_quoted(jctx *c, jbuf *b, const char *s, size_t n, char q, esc_fn *esc_of, int arg)
{
    jbuf_putc(c, b, q);
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        char tmp[16];
        size_t k = 1;
        const char *esc = esc_of(s, n, i, &k, tmp, arg);
        if (esc) {
            jbuf_put(c, b, s + i - run, run);
            run = 0;
            jbuf_put(c, b, esc, strlen(esc));
        } else {
            run += k;
        }
        i += k;
    }
    jbuf_put(c, b, s + n - run, run);
    jbuf_putc(c, b, q);
}

/* Python's repr of a str (arg: the quote) */
static const char *repr_esc(const char *s, size_t n, size_t i, size_t *k, char tmp[16], int q)
{
    unsigned char ch = (unsigned char)s[i];
    if (ch == (unsigned char)q || ch == '\\') { tmp[0] = '\\'; tmp[1] = (char)ch; tmp[2] = 0; return tmp; }
    if (ch == '\t') return "\\t";
    if (ch == '\n') return "\\n";
    if (ch == '\r') return "\\r";
    if (ch < 0x20 || ch == 0x7f) { snprintf(tmp, 16, "\\x%02x", ch); return tmp; }
    if (ch < 0x80) return NULL;
    uint32_t cp;
    *k = (size_t)utf8_dec(s + i, n - i, &cp);
    if (printable(cp)) return NULL;
    snprintf(tmp, 16, cp <= 0xff ? "\\x%02x" : cp <= 0xffff ? "\\u%04x" : "\\U%08x", (unsigned)cp);
    return tmp;
}

static void repr_str(jctx *c, jbuf *b, const char *s, size_t n)
{
    char q = '\'';
    if (memchr(s, '\'', n) && !memchr(s, '"', n)) q = '"';
    put_quoted(c, b, s, n, q, repr_esc, q);
}

static void repr_items(jctx *c, jbuf *b, jlist *l, size_t from)
{
    for (size_t i = from; i < l->n; i++) {
        if (i > from) jbuf_put(c, b, ", ", 2);
        jrepr(c, b, l->v[i]);
    }
}

void jrepr(jctx *c, jbuf *b, val v)
{
    char tmp[64];
    switch (v.t) {
    case JT_UNDEF: jbuf_put(c, b, "Undefined", 9); return;
    case JT_NONE: jbuf_put(c, b, "None", 4); return;
    case JT_BOOL: if (v.i) jbuf_put(c, b, "True", 4); else jbuf_put(c, b, "False", 5); return;
    case JT_INT: jbuf_printf(c, b, "%lld", (long long)v.i); return;
    case JT_FLOAT: jfloat_repr(tmp, sizeof tmp, v.f); jbuf_put(c, b, tmp, strlen(tmp)); return;
    case JT_STR: repr_str(c, b, S(v)->s, S(v)->len); return;
    case JT_LIST: {
        jlist *l = L(v);
        jdepth_enter(c);
        switch (l->h.sub) {
        case L_LIST: jbuf_putc(c, b, '['); repr_items(c, b, l, 0); jbuf_putc(c, b, ']'); break;
        case L_TUPLE:
            jbuf_putc(c, b, '(');
            repr_items(c, b, l, 0);
            if (l->n == 1) jbuf_putc(c, b, ',');
            jbuf_putc(c, b, ')');
            break;
        case L_ITEMS: jbuf_put(c, b, "dict_items([", 12); repr_items(c, b, l, 0); jbuf_put(c, b, "])", 2); break;
        case L_KEYS: jbuf_put(c, b, "dict_keys([", 11); repr_items(c, b, l, 0); jbuf_put(c, b, "])", 2); break;
        case L_VALUES: jbuf_put(c, b, "dict_values([", 13); repr_items(c, b, l, 0); jbuf_put(c, b, "])", 2); break;
        case L_RANGE:
            if (l->r2 == 1) jbuf_printf(c, b, "range(%lld, %lld)", (long long)l->r0, (long long)l->r1);
            else jbuf_printf(c, b, "range(%lld, %lld, %lld)", (long long)l->r0, (long long)l->r1, (long long)l->r2);
            break;
        case L_REVITER: jbuf_printf(c, b, "<list_reverseiterator object at %p>", (void *)l); break;
        default: jbuf_printf(c, b, "<generator object at %p>", (void *)l); break;
        }
        jdepth_leave(c);
        return;
    }
    case JT_DICT:
    case JT_NS: {
        jdict *d = D(v);
        jdepth_enter(c);
        if (v.t == JT_NS) jbuf_put(c, b, "<Namespace ", 11);
        jbuf_putc(c, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jbuf_put(c, b, ", ", 2);
            jrepr(c, b, d->e[i].k);
            jbuf_put(c, b, ": ", 2);
            jrepr(c, b, d->e[i].v);
        }
        jbuf_putc(c, b, '}');
        if (v.t == JT_NS) jbuf_putc(c, b, '>');
        jdepth_leave(c);
        return;
    }
    case JT_MACRO: {
        jmacro *m = (jmacro *)v.o;
        jbuf_put(c, b, "<Macro ", 7);
        repr_str(c, b, m->name->s, m->name->len);
        jbuf_putc(c, b, '>');
        return;
    }
    case JT_LOOP: {
        jloop *l = (jloop *)v.o;
        jbuf_printf(c, b, "<LoopContext %zu/%zu>", l->i + 1, l->items->n);
        return;
    }
    case JT_FUNC: {
        jfunc *f = (jfunc *)v.o;
        if (f->self.t == JT_UNDEF) jbuf_printf(c, b, "<function %s at %p>", jfunc_name(f->id), (void *)f);
        else jbuf_printf(c, b, "<built-in method %s of %s object at %p>", jfunc_name(f->id), jtype_name(f->self), (void *)f);
        return;
    }
    }
}

void jstr_of(jctx *c, jbuf *b, val v)
{
    if (v.t == JT_STR) jbuf_put(c, b, S(v)->s, S(v)->len);
    else if (v.t != JT_UNDEF) jrepr(c, b, v);
}

val vstr_of(jctx *c, val v)
{
    if (v.t == JT_STR) return jref(v);
    jbuf b;
    jbuf_init(c, &b);
    jstr_of(c, &b, v);
    return jbuf_take(c, &b);
}

/* ---- json.dumps ---- */

typedef struct jsonfmt {
    int ascii, sort;
    const char *ind; size_t ind_n;
    const char *isep; size_t isep_n;
    const char *ksep; size_t ksep_n;
} jsonfmt;

/* json.dumps of a str (arg: ensure_ascii) */
static const char *json_esc(const char *s, size_t n, size_t i, size_t *k, char tmp[16], int ascii)
{
    unsigned char ch = (unsigned char)s[i];
    switch (ch) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: break;
    }
    if (ch < 0x20) { snprintf(tmp, 16, "\\u%04x", ch); return tmp; }
    if (ch < 0x80) return NULL;
    uint32_t cp;
    *k = (size_t)utf8_dec(s + i, n - i, &cp);
    if (!ascii) return NULL;
    if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        snprintf(tmp, 16, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
        snprintf(tmp, 16, "\\u%04x", cp);
    }
    return tmp;
}

static void json_str(jctx *c, jbuf *b, const char *s, size_t n, int ascii)
{
    put_quoted(c, b, s, n, '"', json_esc, ascii);
}

static void json_float(jctx *c, jbuf *b, double f)
{
    char tmp[64];
    if (isnan(f)) jbuf_put(c, b, "NaN", 3);
    else if (isinf(f)) jbuf_printf(c, b, "%sInfinity", f < 0 ? "-" : "");
    else { jfloat_repr(tmp, sizeof tmp, f); jbuf_put(c, b, tmp, strlen(tmp)); }
}

static void json_nl(jctx *c, jbuf *b, const jsonfmt *F, int level)
{
    jbuf_putc(c, b, '\n');
    for (int i = 0; i < level; i++) jbuf_put(c, b, F->ind, F->ind_n);
}

static void json_val(jctx *c, jbuf *b, val v, const jsonfmt *F, int level);

static void json_key(jctx *c, jbuf *b, val k, const jsonfmt *F)
{
    switch (k.t) {
    case JT_STR: json_str(c, b, S(k)->s, S(k)->len, F->ascii); return;
    case JT_FLOAT: jbuf_putc(c, b, '"'); json_float(c, b, k.f); jbuf_putc(c, b, '"'); return;
    case JT_BOOL: jbuf_printf(c, b, "\"%s\"", k.i ? "true" : "false"); return;
    case JT_NONE: jbuf_put(c, b, "\"null\"", 6); return;
    case JT_INT: jbuf_printf(c, b, "\"%lld\"", (long long)k.i); return;
    }
    jfail(c, JE_TYPE, "keys must be str, int, float, bool or None, not %s", jtype_name(k));
}

static void json_val(jctx *c, jbuf *b, val v, const jsonfmt *F, int level)
{
    switch (v.t) {
    case JT_STR: json_str(c, b, S(v)->s, S(v)->len, F->ascii); return;
    case JT_NONE: jbuf_put(c, b, "null", 4); return;
    case JT_BOOL: if (v.i) jbuf_put(c, b, "true", 4); else jbuf_put(c, b, "false", 5); return;
    case JT_INT: jbuf_printf(c, b, "%lld", (long long)v.i); return;
    case JT_FLOAT: json_float(c, b, v.f); return;
    case JT_LIST:
        if (L(v)->h.sub == L_LIST || L(v)->h.sub == L_TUPLE) {
            jlist *l = L(v);
            if (!l->n) { jbuf_put(c, b, "[]", 2); return; }
            jdepth_enter(c);
            jbuf_putc(c, b, '[');
            if (F->ind) json_nl(c, b, F, level + 1);
            for (size_t i = 0; i < l->n; i++) {
                if (i) {
                    jbuf_put(c, b, F->isep, F->isep_n);
                    if (F->ind) json_nl(c, b, F, level + 1);
                }
                json_val(c, b, l->v[i], F, level + 1);
            }
            if (F->ind) json_nl(c, b, F, level);
            jbuf_putc(c, b, ']');
            jdepth_leave(c);
            return;
        }
        break;
    case JT_DICT: {
        jdict *d = D(v);
        if (!d->n) { jbuf_put(c, b, "{}", 2); return; }
        jdepth_enter(c);
        size_t *ord = NULL;
        jobj *ordo = NULL;
        if (F->sort) {
            /* sorted(d.items()): insertion sort on the keys (dicts in templates are small) */
            jblob *bl = jalloc(c, O_BLOB, sizeof *bl);
            ordo = &bl->h;
            mem_add(c, ordo, d->n * sizeof *ord);
            bl->p = malloc(d->n * sizeof *ord);
            if (!bl->p) jfail(c, JE_NOMEM, "out of memory");
            ord = (size_t *)bl->p;
            for (size_t i = 0; i < d->n; i++) {
                size_t j = i;
                while (j > 0 && jcmp(c, d->e[i].k, d->e[ord[j - 1]].k, OP_LT)) { ord[j] = ord[j - 1]; j--; }
                ord[j] = i;
            }
            jcharge(c, d->n * d->n);
        }
        jbuf_putc(c, b, '{');
        if (F->ind) json_nl(c, b, F, level + 1);
        for (size_t i = 0; i < d->n; i++) {
            jent *e = &d->e[ord ? ord[i] : i];
            if (i) {
                jbuf_put(c, b, F->isep, F->isep_n);
                if (F->ind) json_nl(c, b, F, level + 1);
            }
            json_key(c, b, e->k, F);
            jbuf_put(c, b, F->ksep, F->ksep_n);
            json_val(c, b, e->v, F, level + 1);
        }
        if (F->ind) json_nl(c, b, F, level);
        jbuf_putc(c, b, '}');
        if (ordo) jobj_unref(c, ordo);
        jdepth_leave(c);
        return;
    }
    }
    jfail(c, JE_TYPE, "Object of type %s is not JSON serializable", jtype_name(v));
}

void jtojson(jctx *c, jbuf *b, val v, int ensure_ascii, const char *indent, size_t indent_n,
             const char *isep, size_t isep_n, const char *ksep, size_t ksep_n, int sort_keys)
{
    jsonfmt F = { ensure_ascii, sort_keys, indent, indent_n, isep, isep_n, ksep, ksep_n };
    json_val(c, b, v, &F, 0);
}

/* ---- names the evaluator binds ---- */

typedef struct { jobj h; size_t len; int64_t nchars; char s[8]; } jstr_static;
#define JSTATIC(lit) { { NULL, NULL, 0, RC_IMMORTAL, O_STR, 0 }, sizeof(lit) - 1, sizeof(lit) - 1, lit }
static jstr_static names_[] = { JSTATIC("caller"), JSTATIC("kwargs"), JSTATIC("varargs"), JSTATIC("loop") };

const jstr *jname(int which) { return (const jstr *)(void *)&names_[which]; }

/* ---- JSON input ---- */

val jfrom_json(jctx *c, const json_t *j, int depth)
{
    if (depth > MAX_VALUE_DEPTH) jfail(c, JE_LIMIT, "variables nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = jdict_new(c, 0);
        val dv = vobj(JT_DICT, d);
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) {
            val kv = vstr(c, k, strlen(k));
            jdict_set(c, d, kv, jfrom_json(c, x, depth + 1));
        }
        return dv;
    }
    case JSON_ARRAY: {
        jlist *l = jlist_new(c, L_LIST, json_array_size(j));
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) jlist_push(c, l, jfrom_json(c, x, depth + 1));
        return vlist(l);
    }
    case JSON_STRING: return vstr(c, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return vint((int64_t)json_integer_value(j));
    case JSON_REAL: return vfloat(json_real_value(j));
    case JSON_TRUE: return vbool(1);
    case JSON_FALSE: return vbool(0);
    default: return vnone();
    }
}

/* ---- iteration ---- */

jlist *jiterate(jctx *c, val v)
{
    switch (v.t) {
    case JT_UNDEF: return jlist_new(c, L_LIST, 0);
    case JT_LIST: {
        jlist *l = L(v);
        if (l->h.sub == L_GEN || l->h.sub == L_REVITER) {
            jlist *r = jlist_new(c, L_LIST, l->n - l->pos);
            for (size_t i = l->pos; i < l->n; i++) jlist_push(c, r, jref(l->v[i]));
            l->pos = l->n;
            return r;
        }
        l->h.rc++;
        return l;
    }
    case JT_DICT: {
        jdict *d = D(v);
        jlist *r = jlist_new(c, L_LIST, d->n);
        for (size_t i = 0; i < d->n; i++) jlist_push(c, r, jref(d->e[i].k));
        return r;
    }
    case JT_STR: {
        jstr *s = S(v);
        jlist *r = jlist_new(c, L_LIST, (size_t)jstr_nchars(s));
        for (size_t i = 0; i < s->len;) {
            uint32_t cp;
            size_t k = (size_t)utf8_dec(s->s + i, s->len - i, &cp);
            jlist_push(c, r, vstr(c, s->s + i, k));
            i += k;
        }
        return r;
    }
    }
    jfail(c, JE_TYPE, "'%s' object is not iterable", jtype_name(v));
}
