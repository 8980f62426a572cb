/* jinja_parse.c — tokens to a tree, by jinja2's grammar (parser.py): the
 * statements chat templates use (if/elif/else, for with else, filter and
 * `recursive`, set and set blocks, macro, call, filter, with, raw, break,
 * continue, generation) and the whole expression grammar, operator for
 * operator. A check pass afterwards does what jinja2's compiler does at
 * compile time: an unknown filter or test is an error unless it sits in an
 * if statement or an inline if (there it only raises when evaluated), and
 * break/continue must be inside a loop. Nesting is bounded, so neither the
 * parser nor the evaluator can run out of C stack on a deep template. */
#include "engine/text/jinja_int.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST 200

/* ---- parser ---- */

typedef struct parser {
    jinja_tpl *t;
    jtok *tok;
    size_t ntok, i;
    char *err;
    size_t errlen;
    jmp_buf jb;
    int depth;
} parser;

typedef struct nvec { jnode **v; uint32_t n, cap; } nvec;

_Noreturn __attribute__((format(printf, 3, 4)))
static void pfail(parser *P, int line, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(P->err, P->errlen, "line %d: %s", line, msg);
    longjmp(P->jb, 1);
}

static void *palloc(parser *P, size_t n)
{
    void *p = jarena_alloc(P->t, n);
    if (!p) pfail(P, 0, "out of memory");
    return p;
}

static void nv_push(parser *P, nvec *v, jnode *x)
{
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        jnode **nn = palloc(P, nc * sizeof *nn);
        if (v->n) memcpy(nn, v->v, v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static jnode *node(parser *P, int kind, int line)
{
    jnode *n = palloc(P, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    n->cst = vundef0();
    return n;
}

/* A node of kind whose list is v's nodes. */
static jnode *list_node(parser *P, int kind, int line, const nvec *v)
{
    jnode *n = node(P, kind, line);
    n->list = v->v;
    n->nlist = v->n;
    return n;
}

static jtok *cur(parser *P) { return &P->tok[P->i]; }
static jtok *look(parser *P) { return &P->tok[P->i + 1 < P->ntok ? P->i + 1 : P->i]; }
static jtok *next(parser *P)
{
    jtok *k = &P->tok[P->i];
    if (P->i + 1 < P->ntok) P->i++;
    return k;
}

static int is_op(jtok *k, int op) { return k->type == T_OP && k->iv == op; }
static int is_name(jtok *k, const char *s)
{
    return k->type == T_NAME && k->sv->len == strlen(s) && memcmp(k->sv->s, s, k->sv->len) == 0;
}

static const char *op_text(int op)
{
    static const char *t[] = { "", "+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}",
                               "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";" };
    return op > 0 && op < (int)(sizeof t / sizeof *t) ? t[op] : "?";
}

static const char *describe(jtok *k, char *buf, size_t cap)
{
    switch (k->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data / text";
    case T_VBEGIN: return "begin of print statement";
    case T_VEND: return "end of print statement";
    case T_BBEGIN: return "begin of statement block";
    case T_BEND: return "end of statement block";
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    case T_NAME: snprintf(buf, cap, "%s", k->sv->s); return buf;
    default: return op_text((int)k->iv);
    }
}

static void expect_op(parser *P, int op)
{
    jtok *k = cur(P);
    if (!is_op(k, op)) {
        char b[64];
        if (k->type == T_EOF) pfail(P, k->line, "unexpected end of template, expected '%s'.", op_text(op));
        pfail(P, k->line, "expected token '%s', got '%s'", op_text(op), describe(k, b, sizeof b));
    }
    next(P);
}

static void expect_type(parser *P, int type, const char *what)
{
    jtok *k = cur(P);
    if (k->type != type) {
        char b[64];
        if (k->type == T_EOF) pfail(P, k->line, "unexpected end of template, expected '%s'.", what);
        pfail(P, k->line, "expected token '%s', got '%s'", what, describe(k, b, sizeof b));
    }
    next(P);
}

static const jstr *expect_name(parser *P)
{
    jtok *k = cur(P);
    if (k->type != T_NAME) {
        char b[64];
        pfail(P, k->line, "expected token 'name', got '%s'", describe(k, b, sizeof b));
    }
    next(P);
    return k->sv;
}

static void enter(parser *P, int line)
{
    if (++P->depth > MAX_NEST) pfail(P, line, "template nested too deeply (more than %d levels)", MAX_NEST);
}

static jnode *parse_expression(parser *P, int with_condexpr);
static jnode *parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_paren);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *n);
static jnode *parse_filter(parser *P, jnode *n, int start_inline);
static void subparse(parser *P, nvec *body, const char *const *end_tokens);

static jnode *parse_condexpr(parser *P);
static jnode *parse_or(parser *P);

static jnode *parse_expression(parser *P, int with_condexpr)
{
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

static jnode *parse_condexpr(parser *P)
{
    int line = cur(P)->line, d0 = P->depth;
    jnode *e1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        next(P);
        enter(P, line);   /* each `if` nests the expression one deeper */
        jnode *n = node(P, E_COND, line);
        n->b = e1;
        n->a = parse_or(P);
        if (is_name(cur(P), "else")) {
            next(P);
            enter(P, line);
            n->c = parse_condexpr(P);
            P->depth--;
        }
        e1 = n;
        line = cur(P)->line;
    }
    P->depth = d0;
    return e1;
}

static jnode *parse_and(parser *P);
static jnode *parse_not(parser *P);
static jnode *parse_compare(parser *P);

/* operand (kw operand)*, left-associative nodes of kind */
static jnode *parse_left_kw(parser *P, jnode *(*operand)(parser *), const char *kw, int kind)
{
    jnode *l = operand(P);
    int d0 = P->depth;
    while (is_name(cur(P), kw)) {
        int line = next(P)->line;
        enter(P, line);
        jnode *n = node(P, kind, line);
        n->a = l;
        n->b = operand(P);
        l = n;
    }
    P->depth = d0;
    return l;
}

static jnode *parse_or(parser *P) { return parse_left_kw(P, parse_and, "or", E_OR); }
static jnode *parse_and(parser *P) { return parse_left_kw(P, parse_not, "and", E_AND); }

static jnode *parse_not(parser *P)
{
    if (is_name(cur(P), "not")) {
        int line = next(P)->line;
        enter(P, line);
        jnode *n = node(P, E_NOT, line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_math1(parser *P);

static jnode *parse_compare(parser *P)
{
    int line = cur(P)->line;
    jnode *e = parse_math1(P);
    nvec ops = { 0 };
    for (;;) {
        jtok *k = cur(P);
        int op = 0;
        if (k->type == T_OP) {
            switch (k->iv) {
            case P_EQ: op = OP_EQ; break;
            case P_NE: op = OP_NE; break;
            case P_LT: op = OP_LT; break;
            case P_LE: op = OP_LE; break;
            case P_GT: op = OP_GT; break;
            case P_GE: op = OP_GE; break;
            }
            if (op) next(P);
        } else if (is_name(k, "in")) {
            op = OP_IN;
            next(P);
        } else if (is_name(k, "not") && is_name(look(P), "in")) {
            op = OP_NOTIN;
            next(P);
            next(P);
        }
        if (!op) break;
        jnode *o = node(P, E_OPERAND, k->line);
        o->op = (uint8_t)op;
        o->a = parse_math1(P);
        nv_push(P, &ops, o);
    }
    if (!ops.n) return e;
    jnode *n = list_node(P, E_CMP, line, &ops);
    n->a = e;
    return n;
}

static jnode *binop(parser *P, int op, jnode *l, jnode *r, int line)
{
    jnode *n = node(P, E_BIN, line);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static jnode *parse_concat(parser *P);
static jnode *parse_math2(parser *P);
static jnode *parse_pow(parser *P);

static jnode *parse_math1(parser *P)
{
    jnode *l = parse_concat(P);
    int d0 = P->depth;
    for (;;) {
        jtok *k = cur(P);
        if (is_op(k, P_ADD)) { next(P); enter(P, k->line); l = binop(P, OP_ADD, l, parse_concat(P), k->line); }
        else if (is_op(k, P_SUB)) { next(P); enter(P, k->line); l = binop(P, OP_SUB, l, parse_concat(P), k->line); }
        else { P->depth = d0; return l; }
    }
}

static jnode *parse_concat(parser *P)
{
    int line = cur(P)->line;
    jnode *first = parse_math2(P);
    if (!is_op(cur(P), P_TILDE)) return first;
    nvec v = { 0 };
    nv_push(P, &v, first);
    while (is_op(cur(P), P_TILDE)) {
        next(P);
        nv_push(P, &v, parse_math2(P));
    }
    return list_node(P, E_CONCAT, line, &v);
}

static jnode *parse_math2(parser *P)
{
    jnode *l = parse_pow(P);
    int d0 = P->depth;
    for (;;) {
        jtok *k = cur(P);
        int op = 0;
        if (is_op(k, P_MUL)) op = OP_MUL;
        else if (is_op(k, P_DIV)) op = OP_DIV;
        else if (is_op(k, P_FLOORDIV)) op = OP_FLOORDIV;
        else if (is_op(k, P_MOD)) op = OP_MOD;
        if (!op) { P->depth = d0; return l; }
        next(P);
        enter(P, k->line);
        l = binop(P, op, l, parse_pow(P), k->line);
    }
}

static jnode *parse_pow(parser *P)
{
    jnode *l = parse_unary(P, 1);
    int d0 = P->depth;
    while (is_op(cur(P), P_POW)) {
        int line = next(P)->line;
        enter(P, line);
        l = binop(P, OP_POW, l, parse_unary(P, 1), line);
    }
    P->depth = d0;
    return l;
}

static jnode *parse_filter_expr(parser *P, jnode *n);

static jnode *parse_unary(parser *P, int with_filter)
{
    jtok *k = cur(P);
    jnode *n;
    enter(P, k->line);
    if (is_op(k, P_SUB) || is_op(k, P_ADD)) {
        next(P);
        n = node(P, is_op(k, P_SUB) ? E_NEG : E_POS, k->line);
        n->a = parse_unary(P, 0);
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *parse_list(parser *P)
{
    int line = next(P)->line;
    nvec v = { 0 };
    while (!is_op(cur(P), P_RBRACKET)) {
        if (v.n) expect_op(P, P_COMMA);
        if (is_op(cur(P), P_RBRACKET)) break;
        nv_push(P, &v, parse_expression(P, 1));
    }
    expect_op(P, P_RBRACKET);
    return list_node(P, E_LIST, line, &v);
}

static jnode *parse_dict(parser *P)
{
    int line = next(P)->line;
    nvec k = { 0 }, v = { 0 };
    while (!is_op(cur(P), P_RBRACE)) {
        if (k.n) expect_op(P, P_COMMA);
        if (is_op(cur(P), P_RBRACE)) break;
        nv_push(P, &k, parse_expression(P, 1));
        expect_op(P, P_COLON);
        nv_push(P, &v, parse_expression(P, 1));
    }
    expect_op(P, P_RBRACE);
    jnode *n = list_node(P, E_DICT, line, &k);
    n->list2 = v.v;
    n->nlist2 = v.n;
    return n;
}

static jnode *parse_primary(parser *P)
{
    jtok *k = cur(P);
    jnode *n;
    char b[64];
    switch (k->type) {
    case T_NAME:
        next(P);
        n = node(P, E_CONST, k->line);
        if (is_name(k, "true") || is_name(k, "True")) n->cst = vbool(1);
        else if (is_name(k, "false") || is_name(k, "False")) n->cst = vbool(0);
        else if (is_name(k, "none") || is_name(k, "None")) n->cst = vnone();
        else { n->kind = E_NAME; n->name = k->sv; }
        return n;
    case T_STRING: {
        next(P);
        n = node(P, E_CONST, k->line);
        if (cur(P)->type != T_STRING) {
            n->cst = vobj(JT_STR, (void *)k->sv);
            return n;
        }
        size_t tot = k->sv->len;
        size_t j = P->i;
        while (P->tok[j].type == T_STRING) tot += P->tok[j++].sv->len;
        char *buf = palloc(P, tot + 1);
        size_t o = k->sv->len;
        memcpy(buf, k->sv->s, o);
        while (cur(P)->type == T_STRING) {
            jtok *s = next(P);
            memcpy(buf + o, s->sv->s, s->sv->len);
            o += s->sv->len;
        }
        jstr *s = jimmortal_str(P->t, buf, o);
        if (!s) pfail(P, k->line, "out of memory");
        n->cst = vobj(JT_STR, s);
        return n;
    }
    case T_INT:
        next(P);
        n = node(P, E_CONST, k->line);
        n->cst = vint(k->iv);
        return n;
    case T_FLOAT:
        next(P);
        n = node(P, E_CONST, k->line);
        n->cst = vfloat(k->fv);
        return n;
    case T_OP:
        if (k->iv == P_LPAREN) {
            next(P);
            n = parse_tuple(P, 0, 1, NULL, 1);
            expect_op(P, P_RPAREN);
            return n;
        }
        if (k->iv == P_LBRACKET) return parse_list(P);
        if (k->iv == P_LBRACE) return parse_dict(P);
        break;
    case T_EOF:
        pfail(P, k->line, "unexpected end of template");
    }
    pfail(P, k->line, "unexpected '%s'", describe(k, b, sizeof b));
}

static int is_tuple_end(parser *P, const char *extra)
{
    jtok *k = cur(P);
    if (k->type == T_VEND || k->type == T_BEND || is_op(k, P_RPAREN)) return 1;
    return extra && is_name(k, extra);
}

static jnode *parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_paren)
{
    int line = cur(P)->line;
    nvec v = { 0 };
    int is_tuple = 0;
    enter(P, line);
    for (;;) {
        if (v.n) expect_op(P, P_COMMA);
        if (is_tuple_end(P, extra_end)) break;
        nv_push(P, &v, simplified ? parse_primary(P) : parse_expression(P, with_condexpr));
        if (is_op(cur(P), P_COMMA)) is_tuple = 1;
        else break;
    }
    P->depth--;
    if (!is_tuple) {
        if (v.n) return v.v[0];
        if (!explicit_paren) {
            char b[64];
            pfail(P, cur(P)->line, "Expected an expression, got '%s'", describe(cur(P), b, sizeof b));
        }
    }
    return list_node(P, E_TUPLE, line, &v);
}

/* (args, kw=..., *dyn, **dynkw) into n's list / names+list2 / c / d */
static void parse_call_args(parser *P, jnode *n)
{
    int line = cur(P)->line;
    expect_op(P, P_LPAREN);
    nvec args = { 0 }, kwv = { 0 };
    const jstr *kwn[256];
    uint32_t nkw = 0;
    int require_comma = 0;
    while (!is_op(cur(P), P_RPAREN)) {
        if (require_comma) {
            expect_op(P, P_COMMA);
            if (is_op(cur(P), P_RPAREN)) break;
        }
        if (is_op(cur(P), P_MUL)) {
            if (n->c || n->d) pfail(P, line, "invalid syntax for function call expression");
            next(P);
            n->c = parse_expression(P, 1);
        } else if (is_op(cur(P), P_POW)) {
            if (n->d) pfail(P, line, "invalid syntax for function call expression");
            next(P);
            n->d = parse_expression(P, 1);
        } else if (cur(P)->type == T_NAME && is_op(look(P), P_ASSIGN)) {
            if (n->d) pfail(P, line, "invalid syntax for function call expression");
            if (nkw == sizeof kwn / sizeof *kwn) pfail(P, line, "too many keyword arguments");
            kwn[nkw++] = next(P)->sv;
            next(P);
            nv_push(P, &kwv, parse_expression(P, 1));
        } else {
            if (n->c || n->d || nkw) pfail(P, line, "invalid syntax for function call expression");
            nv_push(P, &args, parse_expression(P, 1));
        }
        require_comma = 1;
    }
    expect_op(P, P_RPAREN);
    n->list = args.v;
    n->nlist = args.n;
    n->list2 = kwv.v;
    n->nlist2 = kwv.n;
    if (nkw) {
        n->names = palloc(P, nkw * sizeof *n->names);
        memcpy(n->names, kwn, nkw * sizeof *kwn);
    }
    n->nnames = nkw;
}

static jnode *parse_subscript(parser *P, jnode *obj)
{
    jtok *k = next(P);
    if (is_op(k, P_DOT)) {
        jtok *a = cur(P);
        next(P);
        if (a->type == T_NAME) {
            jnode *n = node(P, E_ATTR, k->line);
            n->a = obj;
            n->name = a->sv;
            return n;
        }
        if (a->type != T_INT) pfail(P, a->line, "expected name or number");
        jnode *n = node(P, E_ITEM, k->line);
        n->a = obj;
        n->b = node(P, E_CONST, a->line);
        n->b->cst = vint(a->iv);
        return n;
    }
    /* [ subscript, ... ] */
    nvec args = { 0 };
    jnode *slice = NULL;
    while (!is_op(cur(P), P_RBRACKET)) {
        if (args.n) expect_op(P, P_COMMA);
        jnode *a[3] = { NULL, NULL, NULL };
        int line = cur(P)->line, is_slice = 0;
        if (!is_op(cur(P), P_COLON)) {
            a[0] = parse_expression(P, 1);
            if (!is_op(cur(P), P_COLON)) { nv_push(P, &args, a[0]); continue; }
        }
        is_slice = 1;
        next(P);   /* colon */
        if (!is_op(cur(P), P_RBRACKET) && !is_op(cur(P), P_COMMA) && !is_op(cur(P), P_COLON))
            a[1] = parse_expression(P, 1);
        if (is_op(cur(P), P_COLON)) {
            next(P);
            if (!is_op(cur(P), P_RBRACKET) && !is_op(cur(P), P_COMMA)) a[2] = parse_expression(P, 1);
        }
        if (is_slice) {
            slice = node(P, E_SLICE, line);
            slice->b = a[0];
            slice->c = a[1];
            slice->d = a[2];
            nv_push(P, &args, slice);
        }
    }
    expect_op(P, P_RBRACKET);
    if (args.n == 1 && args.v[0]->kind == E_SLICE) {
        args.v[0]->a = obj;
        return args.v[0];
    }
    for (uint32_t i = 0; i < args.n; i++)
        if (args.v[i]->kind == E_SLICE) pfail(P, k->line, "slices inside a tuple subscript are not supported");
    jnode *n = node(P, E_ITEM, k->line);
    n->a = obj;
    if (args.n == 1) {
        n->b = args.v[0];
    } else {
        n->b = node(P, E_TUPLE, k->line);
        n->b->list = args.v;
        n->b->nlist = args.n;
    }
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n)
{
    int d0 = P->depth;
    for (;;) {
        jtok *k = cur(P);
        if (is_op(k, P_DOT) || is_op(k, P_LBRACKET)) {
            n = parse_subscript(P, n);
        } else if (is_op(k, P_LPAREN)) {
            jnode *c = node(P, E_CALL, k->line);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            P->depth = d0;
            return n;
        }
        if (++P->depth > MAX_NEST) pfail(P, k->line, "expression nested too deeply");
    }
}

static const jstr *dotted_name(parser *P)
{
    jtok *k = cur(P);
    const jstr *name = expect_name(P);
    if (!is_op(cur(P), P_DOT)) return name;
    char buf[256];
    size_t o = (size_t)snprintf(buf, sizeof buf, "%s", name->s);
    while (is_op(cur(P), P_DOT)) {
        next(P);
        const jstr *x = expect_name(P);
        if (o + x->len + 2 >= sizeof buf) pfail(P, k->line, "name too long");
        o += (size_t)snprintf(buf + o, sizeof buf - o, ".%s", x->s);
    }
    const jstr *r = jatom(P->t, buf, o);
    if (!r) pfail(P, k->line, "out of memory");
    return r;
}

static jnode *parse_filter(parser *P, jnode *n, int start_inline)
{
    int d0 = P->depth;
    while (is_op(cur(P), P_PIPE) || start_inline) {
        if (!start_inline) next(P);
        int line = cur(P)->line;
        jnode *f = node(P, E_FILTER, line);
        f->a = n;
        f->name = dotted_name(P);
        f->fid = jfilter_id(f->name->s, f->name->len);
        if (is_op(cur(P), P_LPAREN)) parse_call_args(P, f);
        n = f;
        start_inline = 0;
        if (++P->depth > MAX_NEST) pfail(P, line, "expression nested too deeply");
    }
    P->depth = d0;
    return n;
}

static jnode *parse_test(parser *P, jnode *n)
{
    int line = next(P)->line;   /* is */
    int negated = 0;
    if (is_name(cur(P), "not")) { next(P); negated = 1; }
    jnode *t = node(P, E_TEST, line);
    t->a = n;
    t->name = dotted_name(P);
    t->fid = jtest_id(t->name->s, t->name->len);
    jtok *k = cur(P);
    if (is_op(k, P_LPAREN)) {
        parse_call_args(P, t);
    } else if ((k->type == T_NAME || k->type == T_STRING || k->type == T_INT || k->type == T_FLOAT ||
                is_op(k, P_LPAREN) || is_op(k, P_LBRACKET) || is_op(k, P_LBRACE)) &&
               !is_name(k, "else") && !is_name(k, "or") && !is_name(k, "and")) {
        if (is_name(k, "is")) pfail(P, k->line, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P));
        t->list = palloc(P, sizeof *t->list);
        t->list[0] = arg;
        t->nlist = 1;
    }
    if (!negated) return t;
    jnode *x = node(P, E_NOT, line);
    x->a = t;
    return x;
}

static jnode *parse_filter_expr(parser *P, jnode *n)
{
    int d0 = P->depth;
    for (;;) {
        jtok *k = cur(P);
        if (is_op(k, P_PIPE)) n = parse_filter(P, n, 0);
        else if (is_name(k, "is")) n = parse_test(P, n);
        else if (is_op(k, P_LPAREN)) {
            jnode *c = node(P, E_CALL, k->line);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else { P->depth = d0; return n; }
        if (++P->depth > MAX_NEST) pfail(P, k->line, "expression nested too deeply");
    }
}

/* ---- statements ---- */

static int can_assign(jnode *n)
{
    if (n->kind == E_NAME) return 1;
    if (n->kind == E_NSREF) return 1;
    if (n->kind == E_TUPLE) {
        for (uint32_t i = 0; i < n->nlist; i++)
            if (!can_assign(n->list[i])) return 0;
        return 1;
    }
    return 0;
}

static jnode *parse_assign_target(parser *P, int with_tuple, int name_only, const char *extra_end, int with_ns)
{
    jtok *k = cur(P);
    jnode *t;
    if (name_only) {
        t = node(P, E_NAME, k->line);
        t->name = expect_name(P);
    } else if (with_ns && k->type == T_NAME && is_op(look(P), P_DOT)) {
        t = node(P, E_NSREF, k->line);
        t->name = next(P)->sv;
        next(P);
        t->a = node(P, E_NAME, k->line);
        t->a->name = expect_name(P);
    } else {
        t = with_tuple ? parse_tuple(P, 1, 1, extra_end, 0) : parse_primary(P);
    }
    if (!can_assign(t)) {
        char b[64];
        pfail(P, k->line, "can't assign to '%s'", describe(k, b, sizeof b));
    }
    return t;
}

static void parse_statements(parser *P, nvec *body, const char *const *end_tokens, int drop_needle, const char *block)
{
    if (is_op(cur(P), P_COLON)) next(P);
    expect_type(P, T_BEND, "end of statement block");
    subparse(P, body, end_tokens);
    if (cur(P)->type == T_EOF) {
        char want[200];
        size_t o = 0;
        want[0] = 0;
        for (int i = 0; end_tokens[i]; i++)
            o += (size_t)snprintf(want + o, sizeof want - (o < sizeof want ? o : sizeof want), "%s'%s'",
                                  i ? " or " : "", end_tokens[i]);
        pfail(P, cur(P)->line, "Unexpected end of template. Jinja was looking for the following tags: %s. "
              "The innermost block that needs to be closed is '%s'.", want, block);
    }
    if (drop_needle) next(P);
}

static void set_body(jnode *n, nvec *v) { n->list = v->v; n->nlist = v->n; }
static void set_else(jnode *n, nvec *v) { n->list2 = v->v; n->nlist2 = v->n; }

/* n's body: the statements up to {% end %} (one tag), which is consumed */
static void parse_body_to(parser *P, jnode *n, const char *end, const char *block)
{
    const char *const e[] = { end, NULL };
    nvec body = { 0 };
    parse_statements(P, &body, e, 1, block);
    set_body(n, &body);
}

static jnode *parse_for(parser *P)
{
    int line = next(P)->line;
    jnode *n = node(P, N_FOR, line);
    n->a = parse_assign_target(P, 1, 0, "in", 0);
    if (!is_name(cur(P), "in")) {
        char b[64];
        pfail(P, cur(P)->line, "expected token 'in', got '%s'", describe(cur(P), b, sizeof b));
    }
    next(P);
    n->b = parse_tuple(P, 0, 0, "recursive", 0);
    if (is_name(cur(P), "if")) { next(P); n->c = parse_expression(P, 1); }
    if (is_name(cur(P), "recursive")) { next(P); n->flags |= MF_RECURSIVE; }
    static const char *const e1[] = { "endfor", "else", NULL };
    static const char *const e2[] = { "endfor", NULL };
    nvec body = { 0 }, els = { 0 };
    parse_statements(P, &body, e1, 0, "for");
    set_body(n, &body);
    if (is_name(next(P), "else")) {
        parse_statements(P, &els, e2, 1, "for");
        set_else(n, &els);
    }
    return n;
}

static jnode *parse_if(parser *P)
{
    int line = next(P)->line;
    jnode *top = node(P, N_IF, line), *n = top;
    int d0 = P->depth;
    static const char *const e1[] = { "elif", "else", "endif", NULL };
    static const char *const e2[] = { "endif", NULL };
    for (;;) {
        n->a = parse_tuple(P, 0, 0, NULL, 0);
        nvec body = { 0 };
        parse_statements(P, &body, e1, 0, "if");
        set_body(n, &body);
        jtok *k = next(P);
        if (is_name(k, "elif")) {
            jnode *e = node(P, N_IF, k->line);
            n->list2 = palloc(P, sizeof *n->list2);
            n->list2[0] = e;
            n->nlist2 = 1;
            n = e;
            enter(P, k->line);
            continue;
        }
        if (is_name(k, "else")) {
            nvec els = { 0 };
            parse_statements(P, &els, e2, 1, "if");
            set_else(n, &els);
        }
        break;
    }
    P->depth = d0;
    return top;
}

static void parse_signature(parser *P, jnode *n)
{
    nvec defs = { 0 };
    const jstr *names[256];
    uint32_t nn = 0;
    int have_default = 0;
    expect_op(P, P_LPAREN);
    while (!is_op(cur(P), P_RPAREN)) {
        if (nn) expect_op(P, P_COMMA);
        int line = cur(P)->line;
        if (nn == sizeof names / sizeof *names) pfail(P, line, "too many parameters");
        names[nn++] = expect_name(P);
        if (is_op(cur(P), P_ASSIGN)) {
            next(P);
            nv_push(P, &defs, parse_expression(P, 1));
            have_default = 1;
        } else {
            if (have_default) pfail(P, line, "non-default argument follows default argument");
            nv_push(P, &defs, NULL);
        }
    }
    expect_op(P, P_RPAREN);
    n->names = palloc(P, (nn ? nn : 1) * sizeof *n->names);
    memcpy(n->names, names, nn * sizeof *names);
    n->nnames = nn;
    set_else(n, &defs);
}

static jnode *parse_macro(parser *P)
{
    int line = next(P)->line;
    jnode *n = node(P, N_MACRO, line);
    n->name = expect_name(P);
    parse_signature(P, n);
    parse_body_to(P, n, "endmacro", "macro");
    return n;
}

static jnode *parse_call_block(parser *P)
{
    int line = next(P)->line;
    jnode *n = node(P, N_CALLBLOCK, line);
    if (is_op(cur(P), P_LPAREN)) parse_signature(P, n);
    n->a = parse_expression(P, 1);
    if (n->a->kind != E_CALL) pfail(P, line, "expected call");
    parse_body_to(P, n, "endcall", "call");
    return n;
}

static jnode *parse_set(parser *P)
{
    int line = next(P)->line;
    jnode *target = parse_assign_target(P, 1, 0, NULL, 1);
    if (is_op(cur(P), P_ASSIGN)) {
        next(P);
        jnode *n = node(P, N_SET, line);
        n->a = target;
        n->b = parse_tuple(P, 0, 1, NULL, 0);
        return n;
    }
    jnode *n = node(P, N_SETBLOCK, line);
    n->a = target;
    n->b = parse_filter(P, NULL, 0);
    parse_body_to(P, n, "endset", "set");
    return n;
}

static jnode *parse_with(parser *P)
{
    int line = next(P)->line;
    jnode *n = node(P, N_WITH, line);
    nvec sets = { 0 };
    while (cur(P)->type != T_BEND) {
        if (sets.n) expect_op(P, P_COMMA);
        jnode *s = node(P, N_SET, cur(P)->line);
        s->a = parse_assign_target(P, 1, 0, NULL, 0);
        expect_op(P, P_ASSIGN);
        s->b = parse_expression(P, 1);
        nv_push(P, &sets, s);
    }
    set_else(n, &sets);
    parse_body_to(P, n, "endwith", "with");
    return n;
}

static jnode *parse_statement(parser *P)
{
    jtok *k = cur(P);
    if (k->type != T_NAME) {
        char b[64];
        pfail(P, k->line, "tag name expected, got '%s'", describe(k, b, sizeof b));
    }
    enter(P, k->line);
    jnode *n = NULL;
    if (is_name(k, "for")) n = parse_for(P);
    else if (is_name(k, "if")) n = parse_if(P);
    else if (is_name(k, "set")) n = parse_set(P);
    else if (is_name(k, "macro")) n = parse_macro(P);
    else if (is_name(k, "call")) n = parse_call_block(P);
    else if (is_name(k, "with")) n = parse_with(P);
    else if (is_name(k, "print")) {
        next(P);
        n = node(P, N_OUT, k->line);
        n->a = parse_tuple(P, 0, 1, NULL, 0);
    } else if (is_name(k, "filter")) {
        next(P);
        n = node(P, N_FILTERBLOCK, k->line);
        n->a = parse_filter(P, NULL, 1);
        parse_body_to(P, n, "endfilter", "filter");
    } else if (is_name(k, "break") || is_name(k, "continue")) {
        next(P);
        n = node(P, is_name(k, "break") ? N_BREAK : N_CONTINUE, k->line);
    } else if (is_name(k, "generation")) {
        next(P);
        n = node(P, N_GENERATION, k->line);
        parse_body_to(P, n, "endgeneration", "generation");
    } else if (is_name(k, "block") || is_name(k, "extends") || is_name(k, "include") || is_name(k, "import") ||
               is_name(k, "from") || is_name(k, "autoescape")) {
        pfail(P, k->line, "tag '%s' is not supported in chat templates", k->sv->s);
    } else {
        pfail(P, k->line, "Encountered unknown tag '%s'.", k->sv->s);
    }
    P->depth--;
    return n;
}

static void subparse(parser *P, nvec *body, const char *const *end_tokens)
{
    for (;;) {
        jtok *k = cur(P);
        if (k->type == T_EOF) return;
        if (k->type == T_DATA) {
            jnode *n = node(P, N_DATA, k->line);
            n->name = k->sv;
            nv_push(P, body, n);
            next(P);
        } else if (k->type == T_VBEGIN) {
            next(P);
            jnode *n = node(P, N_OUT, k->line);
            n->a = parse_tuple(P, 0, 1, NULL, 0);
            expect_type(P, T_VEND, "end of print statement");
            nv_push(P, body, n);
        } else if (k->type == T_BBEGIN) {
            next(P);
            if (end_tokens)
                for (int i = 0; end_tokens[i]; i++)
                    if (is_name(cur(P), end_tokens[i])) return;
            nv_push(P, body, parse_statement(P));
            expect_type(P, T_BEND, "end of statement block");
        } else {
            pfail(P, k->line, "internal parser error");
        }
    }
}

/* ---- the compile-time checks ---- */

static void check_list(parser *P, jnode **v, uint32_t n, int soft, int in_loop);

static void check(parser *P, jnode *n, int soft, int in_loop)
{
    if (!n) return;
    switch (n->kind) {
    case N_IF:
        check(P, n->a, 1, in_loop);
        check_list(P, n->list, n->nlist, 1, in_loop);
        check_list(P, n->list2, n->nlist2, 1, in_loop);
        return;
    case E_COND:
        check(P, n->a, 1, in_loop);
        check(P, n->b, 1, in_loop);
        check(P, n->c, 1, in_loop);
        return;
    case N_FOR:
        check(P, n->a, soft, in_loop);
        check(P, n->b, soft, in_loop);
        check(P, n->c, 0, 0);
        check_list(P, n->list, n->nlist, 0, 1);
        check_list(P, n->list2, n->nlist2, 0, in_loop);
        return;
    case N_MACRO:
    case N_CALLBLOCK:
        check(P, n->a, soft, in_loop);
        check_list(P, n->list2, n->nlist2, 0, 0);
        check_list(P, n->list, n->nlist, 0, 0);
        return;
    case N_GENERATION:
        check_list(P, n->list, n->nlist, 0, 0);
        return;
    case N_SETBLOCK:
    case N_FILTERBLOCK:
        check(P, n->a, soft, in_loop);
        check(P, n->b, 0, in_loop);
        check_list(P, n->list, n->nlist, 0, in_loop);
        return;
    case N_WITH:
        check_list(P, n->list2, n->nlist2, soft, in_loop);
        check_list(P, n->list, n->nlist, 0, in_loop);
        return;
    case N_BREAK:
    case N_CONTINUE:
        if (!in_loop) pfail(P, n->line, "'%s' outside loop", n->kind == N_BREAK ? "break" : "continue");
        return;
    case E_FILTER:
    case E_TEST:
        if (n->fid < 0 && !soft)
            pfail(P, n->line, "No %s named '%s'.", n->kind == E_FILTER ? "filter" : "test", n->name->s);
        break;
    }
    check(P, n->a, soft, in_loop);
    check(P, n->b, soft, in_loop);
    check(P, n->c, soft, in_loop);
    check(P, n->d, soft, in_loop);
    check_list(P, n->list, n->nlist, soft, in_loop);
    check_list(P, n->list2, n->nlist2, soft, in_loop);
}

static void check_list(parser *P, jnode **v, uint32_t n, int soft, int in_loop)
{
    for (uint32_t i = 0; i < n; i++) check(P, v[i], soft, in_loop);
}

/* Whether the subtree loads the name (jinja2's find_undeclared, for a macro's
 * caller / varargs / kwargs). */
static int uses_name(const jnode *n, const char *name)
{
    if (!n) return 0;
    if (n->kind == E_NAME && strcmp(n->name->s, name) == 0) return 1;
    if (uses_name(n->a, name) || uses_name(n->b, name) || uses_name(n->c, name) || uses_name(n->d, name)) return 1;
    for (uint32_t i = 0; i < n->nlist; i++)
        if (uses_name(n->list[i], name)) return 1;
    for (uint32_t i = 0; i < n->nlist2; i++)
        if (uses_name(n->list2[i], name)) return 1;
    return 0;
}

static void macro_flags(jnode *n)
{
    if (!n) return;
    if (n->kind == N_MACRO || n->kind == N_CALLBLOCK) {
        for (uint32_t i = 0; i < n->nlist; i++) {
            if (uses_name(n->list[i], "caller")) n->flags |= MF_CALLER;
            if (uses_name(n->list[i], "varargs")) n->flags |= MF_VARARGS;
            if (uses_name(n->list[i], "kwargs")) n->flags |= MF_KWARGS;
        }
    }
    macro_flags(n->a);
    macro_flags(n->b);
    macro_flags(n->c);
    macro_flags(n->d);
    for (uint32_t i = 0; i < n->nlist; i++) macro_flags(n->list[i]);
    for (uint32_t i = 0; i < n->nlist2; i++) macro_flags(n->list2[i]);
}

jinja_tpl *jinja_parse(const char *src, size_t len, char *err, size_t errlen)
{
    jinja_tpl *volatile t = calloc(1, sizeof *t);
    if (!t) { err_set(err, errlen, "out of memory"); return NULL; }
    jtok *toks = NULL;
    size_t ntoks = 0;
    if (jlex(t, src, len, &toks, &ntoks, err, errlen)) {
        jinja_free(t);
        return NULL;
    }
    parser *P = calloc(1, sizeof *P);
    if (!P) { free(toks); jinja_free(t); err_set(err, errlen, "out of memory"); return NULL; }
    P->t = t;
    P->tok = toks;
    P->ntok = ntoks;
    P->err = err;
    P->errlen = errlen;
    if (setjmp(P->jb)) {
        free(toks);
        free(P);
        jinja_free(t);
        return NULL;
    }
    nvec body = { 0 };
    subparse(P, &body, NULL);
    if (cur(P)->type != T_EOF) pfail(P, cur(P)->line, "unexpected tag");
    check_list(P, body.v, body.n, 0, 0);
    for (uint32_t i = 0; i < body.n; i++) macro_flags(body.v[i]);
    t->body = body.v;
    t->nbody = body.n;
    free(toks);
    free(P);
    return t;
}
