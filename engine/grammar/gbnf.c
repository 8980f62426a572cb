/* gbnf.c — the GBNF parser: text → rules of alternatives of elements
 * (characters sets and rule references), with repetitions rewritten into
 * generated rules, then checked (every rule defined, `root` present, no
 * left recursion). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gram_int.h"
#include "common/hex.h"

typedef struct {
    const char *s, *end, *base;
    gram *g;
    char *err; size_t errlen;
    int failed;
    const char *cur_rule;           /* name of the rule being parsed (errors) */
    int depth;                      /* group nesting (bounded) */
} gp;

/* ---- growable arrays ---- */
static int grow(void **p, uint32_t *cap, uint32_t need, size_t sz)
{
    if (need <= *cap) return 0;
    uint32_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * sz);
    if (!q) return -1;
    *p = q; *cap = nc;
    return 0;
}

static void line_col(const char *base, const char *at, int *line, int *col)
{
    int l = 1, c = 1;
    for (const char *p = base; p < at; p++) {
        if (*p == '\n') { l++; c = 1; } else if (((unsigned char)*p & 0xC0) != 0x80) c++;
    }
    *line = l; *col = c;
}

static void fail(gp *p, const char *at, const char *fmt, ...)
{
    if (p->failed) return;
    p->failed = 1;
    int line, col;
    line_col(p->base, at, &line, &col);
    char msg[256];
    va_list ap; va_start(ap, fmt); vsnprintf(msg, sizeof msg, fmt, ap); va_end(ap);
    if (p->cur_rule)
        snprintf(p->err, p->errlen, "grammar: rule '%s' at %d:%d: %s", p->cur_rule, line, col, msg);
    else
        snprintf(p->err, p->errlen, "grammar: at %d:%d: %s", line, col, msg);
}

/* ---- rules ---- */
static int32_t rule_find(gram *g, const char *name, size_t n)
{
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (strlen(g->rules[i].name) == n && memcmp(g->rules[i].name, name, n) == 0) return (int32_t)i;
    return -1;
}

static int32_t rule_add(gram *g, const char *name, size_t n)
{
    if (g->n_rules >= GRAM_MAX_RULES) return -1;
    if (grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) return -1;
    gram_rule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    r->name = strndup(name, n);
    if (!r->name) return -1;
    return (int32_t)g->n_rules++;
}

static int32_t rule_get(gp *p, const char *name, size_t n, const char *at)
{
    int32_t id = rule_find(p->g, name, n);
    if (id < 0) {
        id = rule_add(p->g, name, n);
        if (id < 0) { fail(p, at, "too many rules (at most %d)", GRAM_MAX_RULES); return -1; }
        p->g->rules[id].ref_at = (uint32_t)(at - p->base);
    }
    return id;
}

/* A generated rule: parent name + "_" + number. */
static int32_t rule_gen(gp *p, const char *at)
{
    char nm[160];
    snprintf(nm, sizeof nm, "%s_%u", p->cur_rule ? p->cur_rule : "g", p->g->n_rules);
    int32_t id = rule_add(p->g, nm, strlen(nm));
    if (id < 0) { fail(p, at, "too many rules (at most %d)", GRAM_MAX_RULES); return -1; }
    p->g->rules[id].defined = 1;
    p->g->rules[id].generated = 1;
    p->g->rules[id].def_at = (uint32_t)(at - p->base);
    return id;
}

/* ---- sequences under construction ---- */
typedef struct { gram_el *e; uint32_t n, cap; } seq;

static int seq_push(gp *p, seq *q, gram_el el)
{
    if (q->n >= GRAM_MAX_ELEMS || grow((void **)&q->e, &q->cap, q->n + 1, sizeof *q->e)) {
        fail(p, p->s, "grammar too large"); return -1;
    }
    q->e[q->n++] = el;
    return 0;
}

/* Appends one alternative (elements + END) to rule r. */
static int rule_add_alt(gp *p, int32_t r, const gram_el *e, uint32_t n)
{
    gram *g = p->g;
    if (g->n_el + n + 1 > GRAM_MAX_ELEMS) { fail(p, p->s, "grammar too large"); return -1; }
    if (grow((void **)&g->el, &g->cap_el, g->n_el + n + 1, sizeof *g->el) ||
        grow((void **)&g->alts, &g->cap_alts, g->n_alts + 1, sizeof *g->alts)) { fail(p, p->s, "out of memory"); return -1; }
    /* alternatives of one rule are linked: alts[] holds (rule, start) and are gathered at the end */
    g->alts[g->n_alts].rule = (uint32_t)r;
    g->alts[g->n_alts].start = g->n_el;
    g->n_alts++;
    if (n) memcpy(g->el + g->n_el, e, n * sizeof *e);
    g->n_el += n;
    g->el[g->n_el++] = (gram_el){ .type = GEL_END };
    return 0;
}

static int add_range(gp *p, uint32_t lo, uint32_t hi)
{
    gram *g = p->g;
    if (g->n_ranges >= GRAM_MAX_ELEMS || grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + 1, sizeof *g->ranges)) {
        fail(p, p->s, "grammar too large"); return -1;
    }
    g->ranges[g->n_ranges].lo = lo;
    g->ranges[g->n_ranges].hi = hi;
    g->n_ranges++;
    return 0;
}

/* ---- lexing ---- */
static int is_name_ch(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

static void skip_space(gp *p, int newline_ok)
{
    while (p->s < p->end) {
        char c = *p->s;
        if (c == '#') { while (p->s < p->end && *p->s != '\n' && *p->s != '\r') p->s++; }
        else if (c == ' ' || c == '\t') p->s++;
        else if (newline_ok && (c == '\n' || c == '\r')) p->s++;
        else break;
    }
}

/* One UTF-8 code point from raw text. */
static int64_t decode_utf8(gp *p)
{
    const unsigned char *u = (const unsigned char *)p->s;
    size_t left = (size_t)(p->end - p->s);
    uint32_t c = u[0]; int n;
    if (c < 0x80) n = 1;
    else if ((c & 0xE0) == 0xC0) { n = 2; c &= 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 3; c &= 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 4; c &= 0x07; }
    else { fail(p, p->s, "invalid UTF-8"); return -1; }
    if ((size_t)n > left) { fail(p, p->s, "invalid UTF-8"); return -1; }
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) { fail(p, p->s, "invalid UTF-8"); return -1; }
        c = (c << 6) | (u[i] & 0x3F);
    }
    p->s += n;
    return c;
}

/* A character inside a literal or class, escapes resolved. */
static int64_t parse_char(gp *p)
{
    if (p->s >= p->end) { fail(p, p->s, "unexpected end of input"); return -1; }
    if (*p->s != '\\') return decode_utf8(p);
    const char *at = p->s;
    p->s++;
    if (p->s >= p->end) { fail(p, at, "unexpected end of input after '\\'"); return -1; }
    char c = *p->s++;
    int nhex = 0;
    switch (c) {
    case 'x': nhex = 2; break;
    case 'u': nhex = 4; break;
    case 'U': nhex = 8; break;
    case 't': return '\t';
    case 'r': return '\r';
    case 'n': return '\n';
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return c;
    default: fail(p, at, "unknown escape '\\%c'", c); return -1;
    }
    uint32_t v = 0;
    for (int i = 0; i < nhex; i++) {
        int h = p->s < p->end ? hex_digit((unsigned char)*p->s) : -1;
        if (h < 0) { fail(p, at, "expected %d hex digits after '\\%c'", nhex, c); return -1; }
        v = v * 16 + (uint32_t)h; p->s++;
    }
    if (v > 0x10FFFF) { fail(p, at, "code point beyond U+10FFFF"); return -1; }
    return v;
}

static int parse_alternates(gp *p, int32_t rule);

static int parse_uint(gp *p, uint32_t *v)
{
    const char *st = p->s;
    uint64_t x = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        x = x * 10 + (uint64_t)(*p->s - '0');
        if (x > GRAM_MAX_REPEAT) { fail(p, st, "repetition count above %d", GRAM_MAX_REPEAT); return -1; }
        p->s++;
    }
    if (p->s == st) { fail(p, st, "expected a number"); return -1; }
    *v = (uint32_t)x;
    return 0;
}

/* Rewrites the last item q->e[from..] repeated min..max (max UINT32_MAX =
 * unbounded) times, as llama.cpp does: the item min times, then either
 * `R ::= item R |` (unbounded) or nested optionals. */
static int repeat(gp *p, seq *q, uint32_t from, uint32_t min, uint32_t max, const char *at)
{
    uint32_t ilen = q->n - from;
    gram_el *item = malloc((ilen ? ilen : 1) * sizeof *item);
    if (!item) { fail(p, at, "out of memory"); return -1; }
    memcpy(item, q->e + from, ilen * sizeof *item);
    q->n = from;
    int rc = -1;
    if ((uint64_t)ilen * (min ? min : 1) > GRAM_MAX_ELEMS) { fail(p, at, "repetition too large"); goto out; }
    for (uint32_t i = 0; i < min; i++)
        for (uint32_t j = 0; j < ilen; j++)
            if (seq_push(p, q, item[j])) goto out;
    if (max == UINT32_MAX) {
        int32_t r = rule_gen(p, at);
        if (r < 0) goto out;
        seq body = { 0 };
        for (uint32_t j = 0; j < ilen; j++) if (seq_push(p, &body, item[j])) { free(body.e); goto out; }
        if (seq_push(p, &body, (gram_el){ .type = GEL_REF, .a = (uint32_t)r })) { free(body.e); goto out; }
        int e1 = rule_add_alt(p, r, body.e, body.n);
        free(body.e);
        if (e1 || rule_add_alt(p, r, NULL, 0)) goto out;
        if (seq_push(p, q, (gram_el){ .type = GEL_REF, .a = (uint32_t)r })) goto out;
    } else if (max > min) {
        /* opt_k ::= item opt_{k-1} | ; built from the innermost out */
        int32_t prev = -1;
        for (uint32_t k = 0; k < max - min; k++) {
            int32_t r = rule_gen(p, at);
            if (r < 0) goto out;
            seq body = { 0 };
            for (uint32_t j = 0; j < ilen; j++) if (seq_push(p, &body, item[j])) { free(body.e); goto out; }
            if (prev >= 0 && seq_push(p, &body, (gram_el){ .type = GEL_REF, .a = (uint32_t)prev })) { free(body.e); goto out; }
            int e1 = rule_add_alt(p, r, body.e, body.n);
            free(body.e);
            if (e1 || rule_add_alt(p, r, NULL, 0)) goto out;
            prev = r;
        }
        if (seq_push(p, q, (gram_el){ .type = GEL_REF, .a = (uint32_t)prev })) goto out;
    }
    rc = 0;
out:
    free(item);
    return rc;
}

static int parse_sequence(gp *p, seq *q, int nested)
{
    uint32_t last = q->n;       /* start of the last item (for postfix operators) */
    int have_last = 0;
    while (p->s < p->end && !p->failed) {
        const char *at = p->s;
        char c = *p->s;
        if (c == '"') {
            p->s++;
            last = q->n; have_last = 1;
            while (p->s < p->end && *p->s != '"') {
                int64_t ch = parse_char(p);
                if (ch < 0) return -1;
                uint32_t ro = p->g->n_ranges;
                if (add_range(p, (uint32_t)ch, (uint32_t)ch)) return -1;
                if (seq_push(p, q, (gram_el){ .type = GEL_CHAR, .a = ro, .b = 1 })) return -1;
            }
            if (p->s >= p->end) { fail(p, at, "unterminated literal"); return -1; }
            p->s++;
            skip_space(p, nested);
        } else if (c == '[') {
            p->s++;
            int neg = 0;
            if (p->s < p->end && *p->s == '^') { neg = 1; p->s++; }
            uint32_t ro = p->g->n_ranges;
            while (p->s < p->end && *p->s != ']') {
                int64_t lo = parse_char(p);
                if (lo < 0) return -1;
                int64_t hi = lo;
                if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    hi = parse_char(p);
                    if (hi < 0) return -1;
                    if (hi < lo) { fail(p, at, "range end below its start"); return -1; }
                }
                if (add_range(p, (uint32_t)lo, (uint32_t)hi)) return -1;
            }
            if (p->s >= p->end) { fail(p, at, "unterminated character class"); return -1; }
            p->s++;
            last = q->n; have_last = 1;
            if (seq_push(p, q, (gram_el){ .type = GEL_CHAR, .neg = (uint8_t)neg, .a = ro, .b = p->g->n_ranges - ro })) return -1;
            skip_space(p, nested);
        } else if (c == '<' && p->s + 1 < p->end && p->s[1] == '[') {
            /* <[N]>: the special token N itself (not its text) */
            p->s += 2;
            uint64_t id = 0;
            const char *d0 = p->s;
            while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && id <= GRAM_MAX_TOKEN) id = id * 10 + (uint64_t)(*p->s++ - '0');
            if (p->s == d0) { fail(p, at, "expected a token id after '<['"); return -1; }
            if (id > GRAM_MAX_TOKEN) { fail(p, at, "token id past %u", GRAM_MAX_TOKEN); return -1; }
            if (p->end - p->s < 2 || p->s[0] != ']' || p->s[1] != '>') { fail(p, at, "expected ']>' after a token id"); return -1; }
            p->s += 2;
            uint32_t ro = p->g->n_ranges;
            if (add_range(p, GRAM_TOKEN_CP + (uint32_t)id, GRAM_TOKEN_CP + (uint32_t)id)) return -1;
            last = q->n; have_last = 1;
            p->g->has_tokens = 1;
            if (seq_push(p, q, (gram_el){ .type = GEL_CHAR, .a = ro, .b = 1 })) return -1;
            skip_space(p, nested);
        } else if (c == '.') {
            p->s++;
            uint32_t ro = p->g->n_ranges;
            if (add_range(p, 0, 0x10FFFF)) return -1;
            last = q->n; have_last = 1;
            if (seq_push(p, q, (gram_el){ .type = GEL_CHAR, .a = ro, .b = 1 })) return -1;
            skip_space(p, nested);
        } else if (is_name_ch((unsigned char)c)) {
            const char *st = p->s;
            while (p->s < p->end && is_name_ch((unsigned char)*p->s)) p->s++;
            /* a name followed by ::= starts the next rule */
            const char *save = p->s;
            skip_space(p, 1);
            if (p->end - p->s >= 3 && memcmp(p->s, "::=", 3) == 0) { p->s = st; return 0; }
            p->s = save;
            int32_t r = rule_get(p, st, (size_t)(save - st), st);
            if (r < 0) return -1;
            last = q->n; have_last = 1;
            if (seq_push(p, q, (gram_el){ .type = GEL_REF, .a = (uint32_t)r })) return -1;
            skip_space(p, nested);
        } else if (c == '(') {
            p->s++;
            if (++p->depth > GRAM_MAX_DEPTH) { fail(p, at, "groups nested deeper than %d", GRAM_MAX_DEPTH); return -1; }
            int32_t r = rule_gen(p, at);
            if (r < 0) return -1;
            skip_space(p, 1);
            if (parse_alternates(p, r)) return -1;
            p->depth--;
            if (p->s >= p->end || *p->s != ')') { fail(p, at, "expected ')'"); return -1; }
            p->s++;
            last = q->n; have_last = 1;
            if (seq_push(p, q, (gram_el){ .type = GEL_REF, .a = (uint32_t)r })) return -1;
            skip_space(p, nested);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (!have_last) { fail(p, at, "'%c' with nothing before it", c); return -1; }
            uint32_t mn = 0, mx = UINT32_MAX;
            p->s++;
            if (c == '+') mn = 1;
            else if (c == '?') mx = 1;
            else if (c == '{') {
                skip_space(p, nested);
                if (parse_uint(p, &mn)) return -1;
                skip_space(p, nested);
                if (p->s < p->end && *p->s == ',') {
                    p->s++;
                    skip_space(p, nested);
                    if (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
                        if (parse_uint(p, &mx)) return -1;
                        if (mx < mn) { fail(p, at, "{m,n} with n < m"); return -1; }
                    }
                } else mx = mn;
                skip_space(p, nested);
                if (p->s >= p->end || *p->s != '}') { fail(p, at, "expected '}'"); return -1; }
                p->s++;
            }
            if (repeat(p, q, last, mn, mx, at)) return -1;
            have_last = 0;
            skip_space(p, nested);
        } else break;
    }
    return p->failed ? -1 : 0;
}

static int parse_alternates(gp *p, int32_t rule)
{
    for (;;) {
        seq q = { 0 };
        int rc = parse_sequence(p, &q, 1 /* newlines inside groups; rule ends found by ::= */);
        if (rc == 0) rc = rule_add_alt(p, rule, q.e, q.n);
        free(q.e);
        if (rc) return -1;
        if (p->s < p->end && *p->s == '|') { p->s++; skip_space(p, 1); continue; }
        return 0;
    }
}

/* Nullable rules (fixpoint), then left recursion: a rule reachable from
 * itself through leading references that may all match nothing. */
static int check_left_recursion(gp *p)
{
    gram *g = p->g;
    int changed = 1;
    while (changed) {
        changed = 0;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (g->rules[r].nullable) continue;
            for (uint32_t a = 0; a < g->rules[r].n_alt; a++) {
                const gram_el *e = g->el + g->alt_start[g->rules[r].alt_off + a];
                for (; e->type == GEL_REF && g->rules[e->a].nullable; e++) {}
                if (e->type == GEL_END) { g->rules[r].nullable = 1; changed = 1; break; }
            }
        }
    }
    /* DFS over the "may start with" graph */
    uint8_t *state = calloc(g->n_rules, 1);
    uint32_t *stk = malloc(sizeof *stk * 2 * (g->n_rules + 1));
    if (!state || !stk) { free(state); free(stk); fail(p, p->s, "out of memory"); return -1; }
    int rc = 0;
    for (uint32_t root = 0; root < g->n_rules && !rc; root++) {
        if (state[root]) continue;
        /* stack entries: (rule, next edge index) with edges enumerated lazily */
        uint32_t sp = 0;
        stk[sp++] = root; stk[sp++] = 0;
        state[root] = 1;
        while (sp && !rc) {
            uint32_t r = stk[sp - 2], k = stk[sp - 1];
            /* the k-th leading reference of r */
            uint32_t cnt = 0, next = UINT32_MAX;
            for (uint32_t a = 0; a < g->rules[r].n_alt && next == UINT32_MAX; a++) {
                const gram_el *e = g->el + g->alt_start[g->rules[r].alt_off + a];
                for (; e->type == GEL_REF; e++) {
                    if (cnt++ == k) { next = e->a; break; }
                    if (!g->rules[e->a].nullable) break;
                }
            }
            if (next == UINT32_MAX) { state[r] = 2; sp -= 2; continue; }
            stk[sp - 1] = k + 1;
            if (state[next] == 1) {
                /* name the user's rule the cycle goes through */
                uint32_t who = next, from = 0;
                while (from < sp && stk[from] != next) from += 2;
                for (uint32_t i = from; i < sp; i += 2)
                    if (!g->rules[stk[i]].generated) { who = stk[i]; break; }
                p->cur_rule = g->rules[who].name;
                fail(p, p->base + g->rules[who].def_at, "left recursion (the rule can reach itself without consuming input)");
                rc = -1;
            } else if (state[next] == 0) {
                state[next] = 1;
                stk[sp++] = next; stk[sp++] = 0;
            }
        }
    }
    free(state); free(stk);
    return rc;
}

static int finish(gp *p)
{
    gram *g = p->g;
    /* gather alternatives per rule */
    uint32_t *cnt = calloc(g->n_rules + 1, sizeof *cnt);
    g->alt_start = malloc(sizeof *g->alt_start * (g->n_alts + 1));
    if (!cnt || !g->alt_start) { free(cnt); fail(p, p->s, "out of memory"); return -1; }
    for (uint32_t i = 0; i < g->n_alts; i++) cnt[g->alts[i].rule]++;
    uint32_t off = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) { g->rules[r].alt_off = off; g->rules[r].n_alt = 0; off += cnt[r]; }
    for (uint32_t i = 0; i < g->n_alts; i++) {
        gram_rule *r = &g->rules[g->alts[i].rule];
        g->alt_start[r->alt_off + r->n_alt++] = g->alts[i].start;
    }
    free(cnt);
    for (uint32_t r = 0; r < g->n_rules; r++) {
        if (!g->rules[r].defined) {
            p->cur_rule = NULL;
            char nm[200]; snprintf(nm, sizeof nm, "%s", g->rules[r].name);
            int line, col; line_col(p->base, p->base + g->rules[r].ref_at, &line, &col);
            snprintf(p->err, p->errlen, "grammar: rule '%s' at %d:%d: used but not defined", nm, line, col);
            p->failed = 1;
            return -1;
        }
    }
    int32_t root = rule_find(g, "root", 4);
    if (root < 0) { p->cur_rule = NULL; fail(p, p->base, "no rule named 'root'"); return -1; }
    g->root = (uint32_t)root;
    return check_left_recursion(p);
}

int gram_compile(gram **out, const char *text, size_t len, char *err, size_t errlen)
{
    *out = NULL;
    gram *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, errlen, "out of memory"); return -1; }
    gp p = { .s = text, .end = text + len, .base = text, .g = g, .err = err, .errlen = errlen };
    skip_space(&p, 1);
    while (p.s < p.end && !p.failed) {
        const char *st = p.s;
        while (p.s < p.end && is_name_ch((unsigned char)*p.s)) p.s++;
        if (p.s == st) { fail(&p, st, "expected a rule name"); break; }
        size_t nlen = (size_t)(p.s - st);
        skip_space(&p, 0);
        if (p.end - p.s < 3 || memcmp(p.s, "::=", 3) != 0) { fail(&p, p.s, "expected '::=' after '%.*s'", (int)(nlen > 60 ? 60 : nlen), st); break; }
        p.s += 3;
        int32_t r = rule_get(&p, st, nlen, st);
        if (r < 0) break;
        p.cur_rule = g->rules[r].name;
        if (g->rules[r].defined) { fail(&p, st, "defined twice"); break; }
        g->rules[r].defined = 1;
        g->rules[r].def_at = (uint32_t)(st - text);
        skip_space(&p, 1);
        if (parse_alternates(&p, r)) break;
        skip_space(&p, 1);
        if (p.s < p.end && !is_name_ch((unsigned char)*p.s)) { fail(&p, p.s, "unexpected '%c'", *p.s); break; }
        p.cur_rule = NULL;
    }
    if (!p.failed && g->n_rules == 0) { fail(&p, text, "empty grammar"); }
    if (!p.failed) finish(&p);
    if (p.failed) { gram_free(g); return -1; }
    *out = g;
    return 0;
}

void gram_free(gram *g)
{
    if (!g) return;
    for (uint32_t i = 0; i < g->n_rules; i++) free(g->rules[i].name);
    free(g->rules); free(g->el); free(g->alts); free(g->alt_start); free(g->ranges);
    free(g);
}

size_t gram_n_rules(const gram *g) { return g->n_rules; }
