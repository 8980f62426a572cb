/* jinja_lex.c — the template lexer, jinja2's rules with trim_blocks and
 * lstrip_blocks: line endings normalised to \n and one trailing newline
 * dropped; {{- / -}} (and the block and comment forms) strip whitespace on
 * their side; a block or comment tag alone on its line takes the indentation
 * before it (unless written {%+) and the newline after it (unless +%});
 * {% raw %} passes text through; `}}` and `%}` end a tag only while its
 * brackets are balanced. String literals decode Python escapes. Also the
 * template's storage: an arena for the tree and interned names. */
#include "engine/text/jinja_int.h"
#include "common/err.h"
#include "common/hex.h"
#include "common/mem.h"
#include "common/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena and atoms ---- */

void *jarena_alloc(jinja_tpl *t, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    jarena *a = t->arena;
    if (!a || a->used + n > a->cap) {
        size_t cap = n > 65536 ? n : 65536;
        a = malloc(sizeof *a + cap);
        if (!a) return NULL;
        a->cap = cap;
        a->used = 0;
        a->next = t->arena;
        t->arena = a;
    }
    void *p = a->buf + a->used;
    a->used += n;
    memset(p, 0, n);
    return p;
}

jstr *jimmortal_str(jinja_tpl *t, const char *s, size_t n)
{
    jstr *r = jarena_alloc(t, sizeof *r + n + 1);
    if (!r) return NULL;
    r->h.rc = RC_IMMORTAL;
    r->h.kind = O_STR;
    r->len = n;
    r->nchars = -1;
    memcpy(r->s, s, n);
    r->s[n] = 0;
    return r;
}

static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

const jstr *jatom(jinja_tpl *t, const char *s, size_t n)
{
    if (t->natoms * 2 >= t->capatoms) {
        size_t nc = t->capatoms ? t->capatoms * 2 : 256;
        jstr **na = calloc(nc, sizeof *na);
        if (!na) return NULL;
        for (size_t i = 0; i < t->capatoms; i++) {
            jstr *a = t->atoms[i];
            if (!a) continue;
            size_t k = fnv(a->s, a->len) & (nc - 1);
            while (na[k]) k = (k + 1) & (nc - 1);
            na[k] = a;
        }
        free(t->atoms);
        t->atoms = na;
        t->capatoms = nc;
    }
    size_t k = fnv(s, n) & (t->capatoms - 1);
    while (t->atoms[k]) {
        jstr *a = t->atoms[k];
        if (a->len == n && memcmp(a->s, s, n) == 0) return a;
        k = (k + 1) & (t->capatoms - 1);
    }
    jstr *a = jimmortal_str(t, s, n);
    if (!a) return NULL;
    t->atoms[k] = a;
    t->natoms++;
    return a;
}

void jinja_free(jinja_tpl *t)
{
    if (!t) return;
    jarena *a = t->arena;
    while (a) {
        jarena *nx = a->next;
        free(a);
        a = nx;
    }
    free(t->atoms);
    free(t);
}

typedef struct lexer {
    jinja_tpl *t;
    const char *s;
    size_t n;
    jtok *tok;
    size_t ntok, cap;
    char *err;
    size_t errlen;
    int line;              /* line of position `pos` */
    size_t line_pos;       /* position that `line` was counted to */
} lexer;

static int line_at(lexer *L, size_t pos)
{
    while (L->line_pos < pos) {
        if (L->s[L->line_pos] == '\n') L->line++;
        L->line_pos++;
    }
    return L->line;
}

static int lfail(lexer *L, size_t pos, const char *msg)
{
    err_set(L->err, L->errlen, "line %d: %s", line_at(L, pos), msg);
    return -1;
}

static jtok *push(lexer *L, int type, size_t pos)
{
    jtok *nt = mem_grow(L->tok, &L->cap, L->ntok + 1, sizeof *nt, 256);
    if (!nt) return NULL;
    L->tok = nt;
    jtok *k = &L->tok[L->ntok++];
    memset(k, 0, sizeof *k);
    k->type = type;
    k->line = line_at(L, pos);
    k->a = pos;
    return k;
}

/* Python's str.isspace for one code point at s; its byte length, or 0. */
static size_t space_at(const char *s, size_t n)
{
    uint32_t cp;
    if (n == 0) return 0;
    if ((unsigned char)s[0] < 0x80) return py_isspace((unsigned char)s[0]) ? 1 : 0;
    size_t k = (size_t)utf8_dec(s, n, &cp);
    return py_isspace(cp) ? k : 0;
}

/* Length of the whitespace run ending at e (scanning back from e, not past b). */
static size_t rspace(const char *s, size_t b, size_t e)
{
    size_t p = e;
    while (p > b) {
        size_t q = p - 1;
        while (q > b && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
        if (space_at(s + q, p - q) != p - q) break;
        p = q;
    }
    return e - p;
}

static size_t lspace(const char *s, size_t p, size_t e)
{
    size_t q = p, k;
    while (q < e && (k = space_at(s + q, e - q)) > 0) q += k;
    return q - p;
}

static int data_tok(lexer *L, size_t a, size_t b)
{
    if (b <= a) return 0;
    jtok *k = push(L, T_DATA, a);
    if (!k) return lfail(L, a, "out of memory");
    k->n = b - a;
    k->sv = jimmortal_str(L->t, L->s + a, b - a);
    return k->sv ? 0 : lfail(L, a, "out of memory");
}

/* Text [a, b) before a tag whose whitespace sign is `sign`: what is kept of it. */
static size_t strip_text(lexer *L, size_t a, size_t b, char sign, int is_var, int line_starting)
{
    if (sign == '-') return b - rspace(L->s, a, b);
    if (sign == '+' || is_var) return b;
    size_t l = b;
    while (l > a && L->s[l - 1] != '\n') l--;
    if (l > a || line_starting) {
        if (b > l && lspace(L->s, l, b) == b - l) return l;
    }
    return b;
}

/* Matches `{%[-+]?\s*NAME\s*` and one of the block ends at p; the end
 * position, the sign in *sign, the end form in *endk ('+', '-', or 0). */
static size_t match_named_block(lexer *L, size_t p, const char *name, char *sign, int trim)
{
    const char *s = L->s;
    size_t n = L->n, nl = strlen(name);
    if (p + 2 > n || s[p] != '{' || s[p + 1] != '%') return 0;
    size_t q = p + 2;
    *sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *sign = s[q++];
    q += lspace(s, q, n);
    if (q + nl > n || memcmp(s + q, name, nl) != 0) return 0;
    q += nl;
    q += lspace(s, q, n);
    if (trim && q + 3 <= n && s[q] == '+' && s[q + 1] == '%' && s[q + 2] == '}') return q + 3;
    if (q + 3 <= n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') return q + 3 + lspace(s, q + 3, n);
    if (q + 2 <= n && s[q] == '%' && s[q + 1] == '}') {
        q += 2;
        if (trim && q < n && s[q] == '\n') q++;
        return q;
    }
    return 0;
}

/* Decodes a string literal's body [a, b) as Python's unicode-escape does. */
static int string_tok(lexer *L, size_t start, size_t a, size_t b)
{
    char *buf = malloc((b - a) * 2 + 16), *o = buf;
    if (!buf) return lfail(L, start, "out of memory");
    const char *s = L->s;
    for (size_t i = a; i < b;) {
        if (s[i] != '\\') { *o++ = s[i++]; continue; }
        if (i + 1 >= b) { *o++ = s[i++]; continue; }
        char c = s[i + 1];
        i += 2;
        uint32_t cp = 0;
        int nd = 0;
        switch (c) {
        case '\\': *o++ = '\\'; continue;
        case '\'': *o++ = '\''; continue;
        case '"': *o++ = '"'; continue;
        case 'a': *o++ = 7; continue;
        case 'b': *o++ = 8; continue;
        case 'f': *o++ = 12; continue;
        case 'n': *o++ = '\n'; continue;
        case 'r': *o++ = '\r'; continue;
        case 't': *o++ = '\t'; continue;
        case 'v': *o++ = 11; continue;
        case '\n': continue;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < b && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += utf8_enc(cp, o);
                continue;
            }
            if ((unsigned char)c >= 0x80) {
                /* the lexer's ascii/backslashreplace round trip turns "\é" into "\xe9" */
                uint32_t u;
                size_t k = (size_t)utf8_dec(s + i - 1, b - (i - 1), &u);
                i += k - 1;
                o += sprintf(o, u < 0x100 ? "\\x%02x" : u < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)u);
                continue;
            }
            *o++ = '\\';
            *o++ = c;
            continue;
        }
        for (int k = 0; k < nd; k++) {
            int h = i < b ? hex_digit(s[i]) : -1;
            if (h < 0) { free(buf); return lfail(L, start, "truncated \\x, \\u or \\U escape in a string"); }
            cp = cp * 16 + (uint32_t)h;
            i++;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            free(buf);
            return lfail(L, start, "string escape is not a Unicode scalar value");
        }
        o += utf8_enc(cp, o);
    }
    jtok *k = push(L, T_STRING, start);
    if (!k) { free(buf); return lfail(L, start, "out of memory"); }
    k->sv = jimmortal_str(L->t, buf, (size_t)(o - buf));
    free(buf);
    return k->sv ? 0 : lfail(L, start, "out of memory");
}

static int isdig(char c) { return c >= '0' && c <= '9'; }
static int isname0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int isname(char c) { return isname0(c) || isdig(c); }

/* (\d+_)*\d+ at p: its end, or p */
static size_t digits_(const char *s, size_t p, size_t n)
{
    size_t q = p;
    if (q >= n || !isdig(s[q])) return p;
    while (q < n && isdig(s[q])) q++;
    while (q + 1 < n && s[q] == '_' && isdig(s[q + 1])) {
        q++;
        while (q < n && isdig(s[q])) q++;
    }
    return q;
}

/* float_re at p: end or 0 */
static size_t match_float(const char *s, size_t p, size_t n)
{
    if (p > 0 && s[p - 1] == '.') return 0;
    size_t q = digits_(s, p, n);
    if (q == p) return 0;
    size_t f = q;
    if (f < n && s[f] == '.') {
        size_t g = digits_(s, f + 1, n);
        if (g > f + 1) f = g;
    }
    if (f < n && (s[f] == 'e' || s[f] == 'E')) {
        size_t e = f + 1;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        size_t g = digits_(s, e, n);
        if (g > e) return g;
    }
    return f > q ? f : 0;
}

static size_t match_int(const char *s, size_t p, size_t n, int *base)
{
    *base = 10;
    if (p + 1 < n && s[p] == '0' && strchr("bBoOxX", s[p + 1]) && s[p + 1]) {
        char k = (char)(s[p + 1] | 0x20);
        *base = k == 'b' ? 2 : k == 'o' ? 8 : 16;
        size_t q = p + 2, last = 0;
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            int h = r < n ? hex_digit(s[r]) : -1;
            if (h < 0 || h >= *base) break;
            q = r + 1;
            last = q;
        }
        if (last) return last;
        *base = 10;
    }
    if (p < n && s[p] >= '1' && s[p] <= '9') {
        size_t q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            if (r < n && isdig(s[r])) q = r + 1;
            else break;
        }
        return q;
    }
    if (p < n && s[p] == '0') {
        size_t q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            if (r < n && s[r] == '0') q = r + 1;
            else break;
        }
        return q;
    }
    return p;
}

static int number_tok(lexer *L, size_t p, size_t e, int is_float, int base)
{
    char buf[128];
    size_t k = 0;
    size_t from = p + (base != 10 ? 2 : 0);
    for (size_t i = from; i < e; i++)
        if (L->s[i] != '_') {
            if (k + 1 >= sizeof buf) return lfail(L, p, "number literal too long");
            buf[k++] = L->s[i];
        }
    buf[k] = 0;
    jtok *t = push(L, is_float ? T_FLOAT : T_INT, p);
    if (!t) return lfail(L, p, "out of memory");
    if (is_float) {
        t->fv = strtod(buf, NULL);
    } else {
        uint64_t v = 0;
        for (size_t i = 0; i < k; i++) {
            uint64_t d = (uint64_t)hex_digit(buf[i]);
            if (v > (UINT64_MAX - d) / (uint64_t)base) return lfail(L, p, "integer literal too large");
            v = v * (uint64_t)base + d;
        }
        if (v > (uint64_t)INT64_MAX) return lfail(L, p, "integer literal too large");
        t->iv = (int64_t)v;
    }
    return 0;
}

static const struct { const char *s; int op; } ops[] = {
    { "//", P_FLOORDIV }, { "**", P_POW }, { "==", P_EQ }, { "!=", P_NE }, { ">=", P_GE }, { "<=", P_LE },
    { "+", P_ADD }, { "-", P_SUB }, { "/", P_DIV }, { "*", P_MUL }, { "%", P_MOD }, { "~", P_TILDE },
    { "[", P_LBRACKET }, { "]", P_RBRACKET }, { "(", P_LPAREN }, { ")", P_RPAREN }, { "{", P_LBRACE },
    { "}", P_RBRACE }, { ">", P_GT }, { "<", P_LT }, { "=", P_ASSIGN }, { ".", P_DOT }, { ":", P_COLON },
    { "|", P_PIPE }, { ",", P_COMMA }, { ";", P_SEMICOLON },
};

/* The inside of a {{ }} or {% %} tag from p: tokens up to and including its
 * end. Returns the position after the end (and whether it ended with \n). */
static int lex_tag(lexer *L, size_t *pp, int is_block)
{
    const char *s = L->s;
    size_t n = L->n, p = *pp;
    char bal[256];
    int nbal = 0;
    size_t open = p;
    for (;;) {
        if (p >= n) return lfail(L, open, is_block ? "unexpected end of template: a {% tag is not closed"
                                                   : "unexpected end of template: a {{ tag is not closed");
        if (nbal == 0) {
            size_t e = 0;
            if (is_block) {
                if (p + 3 <= n && s[p] == '+' && s[p + 1] == '%' && s[p + 2] == '}') e = p + 3;
                else if (p + 3 <= n && s[p] == '-' && s[p + 1] == '%' && s[p + 2] == '}') e = p + 3 + lspace(s, p + 3, n);
                else if (p + 2 <= n && s[p] == '%' && s[p + 1] == '}') {
                    e = p + 2;
                    if (e < n && s[e] == '\n') e++;
                }
            } else {
                if (p + 3 <= n && s[p] == '-' && s[p + 1] == '}' && s[p + 2] == '}') e = p + 3 + lspace(s, p + 3, n);
                else if (p + 2 <= n && s[p] == '}' && s[p + 1] == '}') e = p + 2;
            }
            if (e) {
                if (!push(L, is_block ? T_BEND : T_VEND, p)) return lfail(L, p, "out of memory");
                *pp = e;
                return 0;
            }
        }
        size_t w = lspace(s, p, n);
        if (w) { p += w; continue; }
        size_t e;
        int base;
        if ((e = match_float(s, p, n)) > p) {
            if (number_tok(L, p, e, 1, 10)) return -1;
            p = e;
            continue;
        }
        if ((e = match_int(s, p, n, &base)) > p) {
            if (number_tok(L, p, e, 0, base)) return -1;
            p = e;
            continue;
        }
        if (isname0(s[p])) {
            e = p;
            while (e < n && isname(s[e])) e++;
            jtok *k = push(L, T_NAME, p);
            if (!k) return lfail(L, p, "out of memory");
            k->n = e - p;
            k->sv = jatom(L->t, s + p, e - p);
            if (!k->sv) return lfail(L, p, "out of memory");
            p = e;
            continue;
        }
        if (s[p] == '\'' || s[p] == '"') {
            char q = s[p];
            e = p + 1;
            while (e < n && s[e] != q) e += (s[e] == '\\' && e + 1 < n) ? 2 : 1;
            if (e >= n) return lfail(L, p, "unexpected end of string");
            if (string_tok(L, p, p + 1, e)) return -1;
            p = e + 1;
            continue;
        }
        int op = 0;
        size_t ol = 0;
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
            size_t l = strlen(ops[i].s);
            if (p + l <= n && memcmp(s + p, ops[i].s, l) == 0) { op = ops[i].op; ol = l; break; }
        }
        if (!op) {
            char msg[64];
            if ((unsigned char)s[p] >= 0x20 && (unsigned char)s[p] < 0x7f) snprintf(msg, sizeof msg, "unexpected char '%c'", s[p]);
            else snprintf(msg, sizeof msg, "unexpected char (byte 0x%02x)", (unsigned char)s[p]);
            return lfail(L, p, msg);
        }
        if (op == P_LBRACE || op == P_LPAREN || op == P_LBRACKET) {
            if (nbal == (int)sizeof bal) return lfail(L, p, "brackets nested too deeply");
            bal[nbal++] = op == P_LBRACE ? '}' : op == P_LPAREN ? ')' : ']';
        } else if (op == P_RBRACE || op == P_RPAREN || op == P_RBRACKET) {
            char msg[64];
            if (!nbal) { snprintf(msg, sizeof msg, "unexpected '%c'", s[p]); return lfail(L, p, msg); }
            char want = bal[--nbal];
            if (want != s[p]) { snprintf(msg, sizeof msg, "unexpected '%c', expected '%c'", s[p], want); return lfail(L, p, msg); }
        }
        jtok *k = push(L, T_OP, p);
        if (!k) return lfail(L, p, "out of memory");
        k->iv = op;
        p += ol;
    }
}

int jlex(jinja_tpl *t, const char *src, size_t len, jtok **toks, size_t *ntoks, char *err, size_t errlen)
{
    size_t bad;
    if (!utf8_valid(src, len, &bad)) return err_set(err, errlen, "template is not valid UTF-8 (byte %zu)", bad);
    if (memchr(src, 0, len)) return err_set(err, errlen, "template contains a NUL byte");
    /* newlines normalised, one trailing newline dropped */
    char *s = malloc(len + 1);
    if (!s) return err_set(err, errlen, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    lexer L = { .t = t, .s = s, .n = n, .err = err, .errlen = errlen, .line = 1 };
    size_t p = 0;
    int line_starting = 1, rc = 0;
    while (p < n && rc == 0) {
        /* the next tag */
        size_t q = p;
        const char *hit = NULL;
        for (;;) {
            hit = memchr(s + q, '{', n - q);
            if (!hit || (size_t)(hit - s) + 1 >= n) { hit = NULL; break; }
            char c = hit[1];
            if (c == '{' || c == '%' || c == '#') break;
            q = (size_t)(hit - s) + 1;
        }
        if (!hit) { rc = data_tok(&L, p, n); p = n; break; }
        size_t tp = (size_t)(hit - s);
        char kind = hit[1];
        char sign = (tp + 2 < n && (s[tp + 2] == '-' || s[tp + 2] == '+')) ? s[tp + 2] : 0;
        char rsign;
        size_t raw_end = kind == '%' ? match_named_block(&L, tp, "raw", &rsign, 0) : 0;
        if (raw_end) sign = rsign;
        size_t keep = strip_text(&L, p, tp, sign, kind == '{', line_starting);
        if ((rc = data_tok(&L, p, keep))) break;
        if (raw_end) {
            /* raw text up to {% endraw %} */
            line_starting = s[raw_end - 1] == '\n';
            size_t r = raw_end, e = 0;
            char es = 0;
            for (;;) {
                const char *h = memmem(s + r, n - r, "{%", 2);
                if (!h) { rc = lfail(&L, tp, "missing end of raw directive"); break; }
                size_t hp = (size_t)(h - s);
                if ((e = match_named_block(&L, hp, "endraw", &es, 1))) {
                    size_t k = strip_text(&L, raw_end, hp, es, 0, line_starting);
                    rc = data_tok(&L, raw_end, k);
                    break;
                }
                r = hp + 1;
            }
            if (rc) break;
            p = e;
            line_starting = s[e - 1] == '\n';
            continue;
        }
        size_t body = tp + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t r = body;
            size_t e = 0;
            for (; r < n; r++) {
                if (s[r] == '+' && r + 2 < n && s[r + 1] == '#' && s[r + 2] == '}') { e = r + 3; break; }
                if (s[r] == '-' && r + 2 < n && s[r + 1] == '#' && s[r + 2] == '}') { e = r + 3 + lspace(s, r + 3, n); break; }
                if (s[r] == '#' && r + 1 < n && s[r + 1] == '}') {
                    e = r + 2;
                    if (e < n && s[e] == '\n') e++;
                    break;
                }
            }
            if (!e) { rc = lfail(&L, tp, "missing end of comment tag"); break; }
            p = e;
            line_starting = s[e - 1] == '\n';
            continue;
        }
        if (!push(&L, kind == '%' ? T_BBEGIN : T_VBEGIN, tp)) { rc = lfail(&L, tp, "out of memory"); break; }
        p = body;
        if ((rc = lex_tag(&L, &p, kind == '%'))) break;
        line_starting = s[p - 1] == '\n';
    }
    if (rc == 0) {
        jtok *k = push(&L, T_EOF, n);
        if (!k) rc = lfail(&L, n, "out of memory");
    }
    free(s);
    if (rc) { free(L.tok); return -1; }
    *toks = L.tok;
    *ntoks = L.ntok;
    return 0;
}
