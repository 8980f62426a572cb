/* jinja_int.h — what the parts of the Jinja interpreter share (engine-internal;
 * the public surface is jinja.h).
 *
 * Values. A `val` is a small tagged union: undefined, none, bool, int (int64),
 * float, or a pointer to a heap object (string, list, dict, namespace,
 * function, macro, loop). Heap objects are reference-counted, and every one a
 * render allocates is also linked into that render's list, so an error (which
 * unwinds with longjmp) or a reference cycle (a namespace holding itself)
 * frees nothing late and leaks nothing: the render frees whatever is left on
 * its list when it ends. Objects the parser makes (string constants, names)
 * are immortal: never counted, never freed by a render, shared read-only by
 * concurrent renders of one template.
 *
 * Lists carry a kind: a plain list, a tuple, or one of the lazy views Python
 * returns (generator, dict_items, ...), which print, serialise and index the
 * way Python's do (a generator has no len() and is not JSON serialisable). */
#ifndef ANE_JINJA_INT_H
#define ANE_JINJA_INT_H

#include "engine/text/jinja.h"

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

typedef enum jt {
    JT_UNDEF, JT_NONE, JT_BOOL, JT_INT, JT_FLOAT,
    JT_STR, JT_LIST, JT_DICT, JT_NS, JT_FUNC, JT_MACRO, JT_LOOP,
} jt;

typedef struct jobj jobj;
typedef struct val {
    uint8_t t;
    union { int64_t i; double f; jobj *o; };
} val;

enum { O_STR = 1, O_LIST, O_DICT, O_FUNC, O_MACRO, O_LOOP, O_UNDEF, O_SCOPE, O_BLOB };
#define RC_IMMORTAL UINT32_MAX

struct jobj {
    jobj *prev, *next;     /* the render's list (NULL for immortal objects) */
    size_t bytes;          /* what was counted against the memory limit */
    uint32_t rc;
    uint8_t kind, sub;
};

/* h.sub of a string: STR_MARKUP for markupsafe's Markup (what |safe and
 * |escape return): combining one with a plain string escapes the plain one */
#define STR_MARKUP 1
typedef struct jstr {
    jobj h;
    size_t len;
    int64_t nchars;        /* code points; -1 until counted */
    char s[];              /* len bytes and a NUL */
} jstr;

enum { L_LIST, L_TUPLE, L_GEN, L_REVITER, L_ITEMS, L_KEYS, L_VALUES, L_RANGE };
typedef struct jlist {
    jobj h;
    size_t n, cap, pos;    /* a generator yields v[pos..n) and is used up */
    val *v;
    int64_t r0, r1, r2;    /* range(start, stop, step), for its repr */
} jlist;

typedef struct jent { val k, v; uint64_t hash; } jent;
typedef struct jdict {
    jobj h;
    size_t n, cap;
    jent *e;
    uint32_t *idx;         /* open addressing over e (slot+1; 0 empty) */
    size_t idxcap;         /* 0 while small: lookups scan */
} jdict;

typedef struct jscope jscope;
typedef struct jnode jnode;
/* a call's arguments: positional v[n], keyword kn[i] = kv[i] (borrowed) */
typedef struct jargs { int n; val *v; int nk; const jstr **kn; val *kv; } jargs;

typedef struct jfunc { jobj h; int id; val self; } jfunc;
typedef struct jmacro {
    jobj h;
    const jnode *def;      /* N_MACRO or N_CALLBLOCK */
    jscope *closure;
    val caller;            /* the caller a call block passes, else undefined */
    const jstr *name;
} jmacro;
typedef struct jloop {
    jobj h;
    jlist *items;
    size_t i;
    int depth;
    val changed_last;
    int changed_set;
    const jnode *def;      /* the for loop, for recursive loops */
    jscope *scope;         /* where a recursive loop runs again */
} jloop;
typedef struct jundef {
    jobj h;
    const char *otype;     /* the owning object's type ("dict object"), or NULL */
    val key;               /* the missing name / attribute / element */
    jstr *hint;            /* a whole message instead, or NULL */
    int exc;               /* JE_UNDEFINED or JE_SECURITY */
    int is_elem;           /* "has no element" rather than "has no attribute" */
} jundef;

typedef struct jvar { const jstr *name; val v; } jvar;
struct jscope {
    jobj h;
    jscope *parent;
    size_t n, cap;
    jvar *v;
};

/* error kinds, as jinja2/Python name them */
enum { JE_SYNTAX = 1, JE_RAISE, JE_UNDEFINED, JE_SECURITY, JE_TYPE, JE_VALUE,
       JE_ZERODIV, JE_OVERFLOW, JE_RUNTIME, JE_LIMIT, JE_NOMEM };

/* ---- parse tree ---- */
enum {
    /* statements */
    N_DATA = 1, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_FILTERBLOCK, N_WITH, N_BREAK, N_CONTINUE, N_GENERATION,
    /* expressions */
    E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NOT, E_NEG, E_POS, E_BIN, E_AND, E_OR, E_CONCAT, E_CMP, E_OPERAND,
    E_COND, E_LIST, E_TUPLE, E_DICT, E_NSREF,
};
/* E_BIN / E_OPERAND operators */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };
/* N_MACRO flags: what the body refers to */
enum { MF_CALLER = 1, MF_VARARGS = 2, MF_KWARGS = 4, MF_RECURSIVE = 8 };

struct jnode {
    uint8_t kind, op;
    uint16_t flags;
    int line;
    jnode *a, *b, *c, *d;
    jnode **list;  uint32_t nlist;    /* body / args / items / keys */
    jnode **list2; uint32_t nlist2;   /* else body / kwarg values / dict values / defaults */
    const jstr **names; uint32_t nnames; /* kwarg names / parameters */
    const jstr *name;                 /* identifier, attribute, filter or test name, text */
    val cst;
    int fid;                          /* filter or test index; -1: unknown (raises when run) */
};

typedef struct jarena { struct jarena *next; size_t used, cap; char buf[]; } jarena;

struct jinja_tpl {
    jnode **body;
    uint32_t nbody;
    jarena *arena;
    jstr **atoms;                     /* interned names */
    size_t natoms, capatoms;
};

/* ---- render context ---- */
typedef struct jbuf { char *s; size_t n, cap; jobj *blob; } jbuf;

typedef struct jctx {
    const jinja_tpl *tpl;
    jinja_limits lim;
    jmp_buf jb;
    jobj live;                        /* list head of the render's objects */
    size_t mem;                       /* bytes live */
    uint64_t steps, work;
    int depth, vdepth;
    char *stack_base;
    jscope *sc;                       /* the scope names resolve in now */
    jbuf *out;                        /* where output goes now */
    int64_t now;
    int err_kind, err_line, cur_line;
    char *err;
    size_t errlen;
    int brk;                          /* 1 break, 2 continue pending */
    jscope *root;
} jctx;

/* template storage and lexer (jinja_lex.c), parser (jinja_parse.c) */
void *jarena_alloc(jinja_tpl *t, size_t n);
const jstr *jatom(jinja_tpl *t, const char *s, size_t n);   /* interned, immortal */
jstr *jimmortal_str(jinja_tpl *t, const char *s, size_t n);

typedef struct jtok { int type; int line; size_t a, n; const jstr *sv; int64_t iv; double fv; } jtok;
enum { T_EOF, T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP };
/* operator tokens: T_OP with iv = one of these */
enum { P_ADD = 1, P_SUB, P_DIV, P_FLOORDIV, P_MUL, P_MOD, P_POW, P_TILDE, P_LBRACKET, P_RBRACKET,
       P_LPAREN, P_RPAREN, P_LBRACE, P_RBRACE, P_EQ, P_NE, P_GT, P_GE, P_LT, P_LE, P_ASSIGN,
       P_DOT, P_COLON, P_PIPE, P_COMMA, P_SEMICOLON };
/* Tokenizes src as jinja2 does with trim_blocks and lstrip_blocks. 0, or -1 with err set. */
int jlex(jinja_tpl *t, const char *src, size_t len, jtok **toks, size_t *ntoks, char *err, size_t errlen);

/* values (jinja_val.c) */
_Noreturn void jfail(jctx *c, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *jalloc(jctx *c, int kind, size_t bytes);
void jrelease_all(jctx *c);
void jcharge(jctx *c, uint64_t work);
void jbuf_init(jctx *c, jbuf *b);
void jbuf_put(jctx *c, jbuf *b, const char *s, size_t n);
void jbuf_putc(jctx *c, jbuf *b, char ch);
void jbuf_printf(jctx *c, jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
val jbuf_take(jctx *c, jbuf *b);       /* the buffer as a string value; b is reset */
void jbuf_free(jctx *c, jbuf *b);

static inline val vundef0(void) { val v = { .t = JT_UNDEF }; v.o = NULL; return v; }
static inline val vnone(void) { val v = { .t = JT_NONE }; v.i = 0; return v; }
static inline val vbool(int b) { val v = { .t = JT_BOOL }; v.i = !!b; return v; }
static inline val vint(int64_t i) { val v = { .t = JT_INT }; v.i = i; return v; }
static inline val vfloat(double f) { val v = { .t = JT_FLOAT }; v.f = f; return v; }
static inline val vobj(int t, void *o) { val v = { .t = (uint8_t)t }; v.o = o; return v; }
static inline int vheap(val v) { return v.t >= JT_STR || (v.t == JT_UNDEF && v.o); }

val jref(val v);
void junref(jctx *c, val v);
void jobj_unref(jctx *c, jobj *o);

jstr *jstr_new(jctx *c, const char *s, size_t n);
val vstr(jctx *c, const char *s, size_t n);
val vcstr(jctx *c, const char *s);
static inline jstr *S(val v) { return (jstr *)v.o; }
static inline jlist *L(val v) { return (jlist *)v.o; }
static inline jdict *D(val v) { return (jdict *)v.o; }
int64_t jstr_nchars(jstr *s);

jlist *jlist_new(jctx *c, int sub, size_t cap);
void jlist_push(jctx *c, jlist *l, val v);     /* takes the reference */
val vlist(jlist *l);
jdict *jdict_new(jctx *c, int sub);
void jdict_set(jctx *c, jdict *d, val k, val v); /* takes both references */
val *jdict_get(jctx *c, jdict *d, val k);        /* borrowed, or NULL */
val *jdict_gets(jdict *d, const char *k, size_t n);
jscope *jscope_new(jctx *c, jscope *parent);
void jscope_set(jctx *c, jscope *s, const jstr *name, val v); /* takes v */
val *jscope_find(jscope *s, const jstr *name);
void jscope_clear(jctx *c, jscope *s);       /* drops every variable */

val vundef_name(jctx *c, const jstr *name);
val vundef_attr(jctx *c, val obj, val key, int is_elem);
val vundef_hint(jctx *c, int exc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
_Noreturn void jundef_fail(jctx *c, val u);

const char *jtype_name(val v);           /* Python's type(v).__name__ */
int jtruthy(jctx *c, val v);
int jeq(jctx *c, val a, val b);
int jcmp(jctx *c, val a, val b, int op);  /* OP_LT..OP_GE; raises on unorderable */
uint64_t jhash(jctx *c, val v);
void jrepr(jctx *c, jbuf *b, val v);
void jstr_of(jctx *c, jbuf *b, val v);   /* str(v) */
val vstr_of(jctx *c, val v);             /* str(v) as a value (a string is shared) */
void jtojson(jctx *c, jbuf *b, val v, int ensure_ascii, const char *indent, size_t indent_n,
             const char *isep, size_t isep_n, const char *ksep, size_t ksep_n, int sort_keys);
void jfloat_repr(char *buf, size_t cap, double f);
enum { JN_CALLER, JN_KWARGS, JN_VARARGS, JN_LOOP };
const jstr *jname(int which);          /* immortal names the evaluator binds */
val jfrom_json(jctx *c, const struct json_t *j, int depth);
int py_isspace(uint32_t cp);
int utf8_dec(const char *s, size_t n, uint32_t *cp);  /* length of the char at s (>=1) */
size_t utf8_enc(uint32_t cp, char *out);
void jdepth_enter(jctx *c);
static inline void jdepth_leave(jctx *c) { c->vdepth--; }

/* iteration: every value Python can iterate, as a list (a fresh reference) */
jlist *jiterate(jctx *c, val v);

/* evaluation (jinja_eval.c) */
val jeval(jctx *c, const jnode *n);
val jgetattr(jctx *c, val obj, const jstr *name);
val jgetitem(jctx *c, val obj, val key);
val jattr(jctx *c, val obj, const jstr *name);     /* getattr alone (the attr filter) */
val jcall(jctx *c, val fn, int nargs, val *args, int nkw, const jstr **kwn, val *kwv);
void jstep(jctx *c);

/* builtin functions and bound methods (jfunc.id) */
enum {
    JF_RANGE, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME, JF_JOINER, JF_CYCLER, JF_NGLOBALS,
    /* str methods */
    JF_S_FIRST = JF_NGLOBALS,
    JF_S_CAPITALIZE = JF_S_FIRST, JF_S_CASEFOLD, JF_S_CENTER, JF_S_COUNT, JF_S_ENDSWITH, JF_S_FIND,
    JF_S_FORMAT, JF_S_INDEX, JF_S_ISALNUM, JF_S_ISALPHA, JF_S_ISDECIMAL, JF_S_ISDIGIT, JF_S_ISLOWER,
    JF_S_ISNUMERIC, JF_S_ISSPACE, JF_S_ISTITLE, JF_S_ISUPPER, JF_S_JOIN, JF_S_LJUST, JF_S_LOWER,
    JF_S_LSTRIP, JF_S_PARTITION, JF_S_REMOVEPREFIX, JF_S_REMOVESUFFIX, JF_S_REPLACE, JF_S_RFIND,
    JF_S_RINDEX, JF_S_RJUST, JF_S_RPARTITION, JF_S_RSPLIT, JF_S_RSTRIP, JF_S_SPLIT, JF_S_SPLITLINES,
    JF_S_STARTSWITH, JF_S_STRIP, JF_S_SWAPCASE, JF_S_TITLE, JF_S_UPPER, JF_S_ZFILL, JF_S_END,
    /* dict, list and loop methods */
    JF_D_GET = JF_S_END, JF_D_ITEMS, JF_D_KEYS, JF_D_VALUES, JF_D_COPY,
    JF_L_COUNT, JF_L_INDEX, JF_L_COPY,
    JF_LOOP_CYCLE, JF_LOOP_CHANGED, JF_JOINER_CALL, JF_CYCLER_NEXT, JF_CYCLER_RESET,
    JF_COUNT
};

/* strings (jinja_str.c) */
enum { CASE_LOWER, CASE_UPPER, CASE_CAPITALIZE, CASE_TITLE, CASE_TITLE_JINJA, CASE_SWAP };
val jcase(jctx *c, jstr *s, int mode);
val jstrip(jctx *c, jstr *s, const jstr *chars, int left, int right);
val jreplace(jctx *c, jstr *s, jstr *old, jstr *rep, int64_t count);
val jstr_call(jctx *c, int id, jstr *self, jargs *a);
val jformat_brace(jctx *c, jstr *fmt, jargs *a);        /* jinja_fmt.c */
int py_isalnum_cp(uint32_t cp);
int64_t jcp_count(const char *s, size_t n);      /* code points in s[0..n) */
size_t jcp_index(jstr *s, int64_t k);           /* byte offset of code point k (Python index rules) */
int64_t jwant_int(jctx *c, val v, const char *what);
/* how many of start, start+step, ... lie before stop (Python's range length), exactly */
uint64_t jrange_len(int64_t start, int64_t stop, int64_t step);
static inline int is_markup(val v) { return v.t == JT_STR && S(v)->h.sub == STR_MARKUP; }
val jmark(jctx *c, val v);             /* v (a new string, taken) as Markup; lists: their strings */
val jescape(jctx *c, val v, int force); /* markupsafe.escape(v): a new reference */
int64_t jbind(jctx *c, const char *fn, jargs *a, const char *const *names, int n, val *out);
static inline int given(val v) { return !(v.t == JT_UNDEF && v.o == NULL); }

/* filters and tests (jinja_lib.c), globals and methods (jinja_func.c) */
int jfilter_id(const char *name, size_t n);
int jtest_id(const char *name, size_t n);
val jfilter_call(jctx *c, int id, val in, jargs *a);
int jtest_call(jctx *c, int id, val in, jargs *a);
int jglobal_id(const char *name, size_t n);
val jfunc_call(jctx *c, jfunc *f, jargs *a);
val jmethod(jctx *c, val obj, const jstr *name);   /* bound method, or an undefined */
const char *jfunc_name(int id);
val vglobal(jctx *c, int id);
val jformat_percent(jctx *c, val fmt, val args);        /* jinja_fmt.c */

#endif
