/* jsonschema.c — JSON Schema → GBNF (what is enforced: jsonschema.h). */
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gram_int.h"

#define PRIMS \
    "ws ::= [ \\t\\n]{0,20}\n" \
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n" \
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n" \
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n" \
    "string ::= \"\\\"\" char* \"\\\"\"\n" \
    "char ::= [^\"\\\\\\x00-\\x1F] | esc\n" \
    "esc ::= \"\\\\\" ([\"\\\\/bfnrt] | \"u\" (hex-bmp | [dD] [89abAB] hex hex \"\\\\u\" [dD] [c-fC-F] hex hex))\n" \
    "hex ::= [0-9a-fA-F]\n" \
    "hex-bmp ::= [0-9a-cA-CeEfF] hex hex hex | [dD] [0-7] hex hex\n" \
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n" \
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" \"0\"{1,16})?\n" \
    "boolean ::= \"true\" | \"false\"\n" \
    "null ::= \"null\"\n"

typedef struct { char *s; size_t n, cap; } sbuf;

typedef struct {
    sbuf out;
    json_t *root;
    unsigned next;
    char *err; size_t errlen;
    int failed;
    json_t *refs;           /* ref string → rule name */
    int depth;
    const char *no_raw;     /* characters strings write only as escapes */
} js;

static void sb_add(js *j, sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->s, nc);
        if (!q) { j->failed = 1; snprintf(j->err, j->errlen, "out of memory"); return; }
        b->s = q; b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(js *j, sbuf *b, const char *s) { sb_add(j, b, s, strlen(s)); }

static void sb_printf(js *j, sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap; va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < (int)sizeof tmp) { sb_add(j, b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { j->failed = 1; return; }
    va_start(ap, fmt); vsnprintf(big, (size_t)n + 1, fmt, ap); va_end(ap);
    sb_add(j, b, big, (size_t)n);
    free(big);
}

static void fail(js *j, const char *path, const char *fmt, ...)
{
    if (j->failed) return;
    j->failed = 1;
    char msg[256];
    va_list ap; va_start(ap, fmt); vsnprintf(msg, sizeof msg, fmt, ap); va_end(ap);
    snprintf(j->err, j->errlen, "json_schema at %s: %s", *path ? path : "/", msg);
}

/* A GBNF literal for raw bytes. */
static void lit(js *j, sbuf *b, const char *s, size_t n)
{
    sb_str(j, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { char e[2] = { '\\', (char)c }; sb_add(j, b, e, 2); }
        else if (c < 0x20 || c == 0x7F) sb_printf(j, b, "\\x%02X", c);
        else sb_add(j, b, (const char *)&c, 1);
    }
    sb_str(j, b, "\"");
}

static void lit_json(js *j, sbuf *b, const json_t *v)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) { fail(j, "", "cannot serialize a value"); return; }
    lit(j, b, t, strlen(t));
    free(t);
}

static unsigned new_rule(js *j) { return j->next++; }

static unsigned gen(js *j, json_t *s, const char *path);

/* A constant value: objects in any member order, whitespace between
 * tokens, through the object and array rules. */
static void gen_const(js *j, sbuf *b, json_t *v, const char *path)
{
    if (!json_is_object(v) && !json_is_array(v)) { lit_json(j, b, v); return; }
    json_t *s = json_object();
    if (json_is_object(v)) {
        json_t *props = json_object(), *req = json_array();
        const char *k; json_t *x;
        json_object_foreach(v, k, x) {
            json_t *c = json_object();
            json_object_set(c, "const", x);
            json_object_set_new(props, k, c);
            json_array_append_new(req, json_string(k));
        }
        json_object_set_new(s, "type", json_string("object"));
        json_object_set_new(s, "properties", props);
        json_object_set_new(s, "required", req);
        json_object_set_new(s, "additionalProperties", json_false());
    } else {
        json_t *pre = json_array();
        size_t i; json_t *x;
        json_array_foreach(v, i, x) { json_t *c = json_object(); json_object_set(c, "const", x); json_array_append_new(pre, c); }
        json_object_set_new(s, "type", json_string("array"));
        json_object_set_new(s, "prefixItems", pre);
        json_object_set_new(s, "items", json_false());
        json_object_set_new(s, "minItems", json_integer((json_int_t)json_array_size(v)));
    }
    unsigned r = gen(j, s, path);
    json_decref(s);
    sb_printf(j, b, "r%u", r);
}

/* ---- pattern (a small regex subset) → GBNF ----
 * Inside a JSON string (a schema's pattern) no character that needs a JSON
 * escape is written raw; a regex of its own (raw) ranges over any text. */
typedef struct {
    const char *p, *end;
    js *j;
    const char *path;
    sbuf *b;
    int depth, raw;
    const char *at;   /* where the piece being read starts (for errors) */
} rx;

static int rx_alt(rx *r);

static void rx_class_char(rx *r, char c)
{
    /* a class member: characters GBNF classes need escaped */
    if (c == ']' || c == '[' || c == '\\' || c == '^' || c == '-' || c == '"') { char e[2] = { '\\', c }; sb_add(r->j, r->b, e, 2); }
    else if ((unsigned char)c < 0x20) sb_printf(r->j, r->b, "\\x%02X", (unsigned char)c);
    else sb_add(r->j, r->b, &c, 1);
}

static int rx_escape_class(rx *r, char c, int in_class)
{
    const char *cls = NULL;
    switch (c) {
    case 'd': cls = "0-9"; break;
    case 'w': cls = "a-zA-Z0-9_"; break;
    case 's': cls = " \\t\\n\\r\\x0B\\x0C"; break;
    case 'D': cls = r->raw ? "^0-9" : "^0-9\"\\\\"; break;
    case 'W': cls = r->raw ? "^a-zA-Z0-9_" : "^a-zA-Z0-9_\"\\\\"; break;
    case 'S': cls = r->raw ? "^ \\t\\n\\r\\x0B\\x0C" : "^ \\t\\n\\r\\x0B\\x0C\"\\\\"; break;
    default: break;
    }
    if (cls) {
        if (in_class) {
            if (cls[0] == '^') return -1;    /* negated shorthand inside a class */
            sb_add(r->j, r->b, cls, strlen(cls));
        } else {
            sb_str(r->j, r->b, "["); sb_add(r->j, r->b, cls, strlen(cls));
            if (cls[0] == '^' && !r->raw) sb_str(r->j, r->b, "\\x00-\\x1F");
            sb_str(r->j, r->b, "]");
        }
        return 1;
    }
    return 0;
}

static int rx_atom(rx *r)
{
    char c = *r->p;
    r->at = r->p;
    if (c == '(') {
        r->p++;
        if (r->p + 1 < r->end && r->p[0] == '?' && r->p[1] == ':') r->p += 2;
        else if (r->p < r->end && r->p[0] == '?') return -1;     /* lookaround */
        if (++r->depth > 64) return -1;
        sb_str(r->j, r->b, "(");
        if (rx_alt(r)) return -1;
        r->depth--;
        if (r->p >= r->end || *r->p != ')') return -1;
        r->p++;
        sb_str(r->j, r->b, ")");
        return 0;
    }
    if (c == '[') {
        r->p++;
        sb_str(r->j, r->b, "[");
        int neg = 0;
        if (r->p < r->end && *r->p == '^') { neg = 1; r->p++; sb_str(r->j, r->b, "^"); }
        int first = 1;
        while (r->p < r->end && (*r->p != ']' || first)) {
            first = 0;
            char d = *r->p++;
            if (d == '\\') {
                if (r->p >= r->end) return -1;
                char e = *r->p++;
                int k = rx_escape_class(r, e, 1);
                if (k < 0) return -1;
                if (k == 0) {
                    if (e == 'n') sb_str(r->j, r->b, "\\n");
                    else if (e == 't') sb_str(r->j, r->b, "\\t");
                    else if (e == 'r') sb_str(r->j, r->b, "\\r");
                    else if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) return -1;
                    else rx_class_char(r, e);
                }
            } else if (d == '-' && r->p < r->end && *r->p != ']' && r->b->n && r->b->s[r->b->n - 1] != '[') {
                sb_str(r->j, r->b, "-");
            } else rx_class_char(r, d);
        }
        if (r->p >= r->end) return -1;
        r->p++;
        if (neg && !r->raw) sb_str(r->j, r->b, "\"\\\\\\x00-\\x1F");   /* never a bare quote, backslash or control */
        sb_str(r->j, r->b, "]");
        return 0;
    }
    if (c == '.') { r->p++; sb_str(r->j, r->b, r->raw ? "[^\\n]" : "[^\\n\"\\\\\\x00-\\x1F]"); return 0; }
    if (c == '\\') {
        r->p++;
        if (r->p >= r->end) return -1;
        char e = *r->p++;
        int k = rx_escape_class(r, e, 0);
        if (k) return k < 0 ? -1 : 0;
        if (r->raw && (e == 'n' || e == 't' || e == 'r')) e = e == 'n' ? '\n' : e == 't' ? '\t' : '\r';
        else if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) return -1;  /* \b, backrefs, ... */
        else if ((e == '"' || e == '\\') && !r->raw) return -1;
        lit(r->j, r->b, &e, 1);
        return 0;
    }
    if ((c == '"' || (unsigned char)c < 0x20) && !r->raw) return -1;
    /* one UTF-8 character */
    size_t n = 1;
    while (r->p + n < r->end && ((unsigned char)r->p[n] & 0xC0) == 0x80) n++;
    lit(r->j, r->b, r->p, n);
    r->p += n;
    return 0;
}

static int rx_seq(rx *r)
{
    sb_str(r->j, r->b, "(");
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        r->at = r->p;
        if (*r->p == '^' || *r->p == '$') return -1;   /* anchors only at the ends */
        sb_str(r->j, r->b, " ");
        if (rx_atom(r)) return -1;
        if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?')) {
            sb_add(r->j, r->b, r->p, 1); r->p++;
        } else if (r->p < r->end && *r->p == '{') {
            const char *q = r->p + 1;
            while (q < r->end && ((*q >= '0' && *q <= '9') || *q == ',')) q++;
            if (q >= r->end || *q != '}' || q == r->p + 1) return -1;
            sb_add(r->j, r->b, r->p, (size_t)(q + 1 - r->p));
            r->p = q + 1;
        }
        r->at = r->p;
        if (r->p < r->end && (*r->p == '?' || *r->p == '+')) return -1;   /* lazy / possessive */
    }
    sb_str(r->j, r->b, " )");
    return 0;
}

static int rx_alt(rx *r)
{
    sb_str(r->j, r->b, "(");
    for (;;) {
        if (rx_seq(r)) return -1;
        if (r->p < r->end && *r->p == '|') { r->p++; sb_str(r->j, r->b, " | "); continue; }
        break;
    }
    sb_str(r->j, r->b, ")");
    return 0;
}

static void gen_pattern(js *j, unsigned id, const char *pat, const char *path)
{
    size_t n = strlen(pat);
    int a0 = n && pat[0] == '^', a1 = n > (size_t)a0 && pat[n - 1] == '$' && (n < 2 || pat[n - 2] != '\\');
    sbuf b = { 0 };
    rx r = { pat + a0, pat + n - a1, j, path, &b, 0, 0, pat };
    int rc = rx_alt(&r);
    if (rc || r.p != r.end) { free(b.s); fail(j, path, "pattern '%s' uses regex features not supported", pat); return; }
    sb_printf(j, &j->out, "r%u ::= \"\\\"\" %s %s %s \"\\\"\"\n", id, a0 ? "" : "char*", b.s ? b.s : "", a1 ? "" : "char*");
    free(b.s);
}

/* ---- strings ---- */
static void gen_string(js *j, unsigned id, json_t *s, const char *path)
{
    json_t *pat = json_object_get(s, "pattern");
    if (json_is_string(pat)) { gen_pattern(j, id, json_string_value(pat), path); return; }
    json_int_t mn = json_is_integer(json_object_get(s, "minLength")) ? json_integer_value(json_object_get(s, "minLength")) : 0;
    json_int_t mx = json_is_integer(json_object_get(s, "maxLength")) ? json_integer_value(json_object_get(s, "maxLength")) : -1;
    if (mn < 0 || mn > 5000 || mx > 5000) { fail(j, path, "minLength/maxLength beyond 5000"); return; }
    if (mx >= 0 && mx < mn) { sb_printf(j, &j->out, "r%u ::= \"\\\"\" [^\\x00-\\U0010FFFF] \"\\\"\"\n", id); return; }
    if (mx >= 0) sb_printf(j, &j->out, "r%u ::= \"\\\"\" char{%lld,%lld} \"\\\"\"\n", id, (long long)mn, (long long)mx);
    else sb_printf(j, &j->out, "r%u ::= \"\\\"\" char{%lld,} \"\\\"\"\n", id, (long long)mn);
}

/* ---- objects ---- */
typedef struct { const char *name; unsigned rule; int required; } prop;

/* Key strings other than the known names: a trie of the names (by UTF-8
 * characters); each node steps to a child on its character, leaves the
 * names on any other character (or an escape), or ends where no name ends. */
static size_t u8len(const char *s)
{
    unsigned char c = (unsigned char)*s;
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    for (size_t i = 1; i < n; i++) if (!s[i]) return i;
    return n;
}

static uint32_t u8cp(const char *s, size_t n)
{
    uint32_t c = (unsigned char)s[0];
    if (n == 1) return c;
    c &= n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07;
    for (size_t i = 1; i < n; i++) c = (c << 6) | ((unsigned char)s[i] & 0x3F);
    return c;
}

static unsigned gen_other_key(js *j, const prop *p, const size_t *idx, size_t ni, size_t depth)
{
    unsigned id = new_rule(j);
    sbuf b = { 0 }, cls = { 0 };
    int ends_here = 0, first = 1;
    size_t *sub = malloc(sizeof *sub * (ni + 1));
    const char **seen = malloc(sizeof *seen * (ni + 1));
    size_t nseen = 0;
    if (!sub || !seen) { free(sub); free(seen); fail(j, "", "out of memory"); return id; }
    sb_printf(j, &b, "r%u ::= ", id);
    for (size_t k = 0; k < ni; k++) {
        const char *nm = p[idx[k]].name + depth;
        if (!*nm) { ends_here = 1; continue; }
        size_t cl = u8len(nm);
        int dup = 0;
        for (size_t q = 0; q < nseen; q++) if (strncmp(seen[q], nm, cl) == 0 && u8len(seen[q]) == cl) dup = 1;
        if (dup) continue;
        seen[nseen++] = nm;
        size_t ns = 0;
        for (size_t q = 0; q < ni; q++) {
            const char *o = p[idx[q]].name;
            if (strlen(o) >= depth + cl && strncmp(o + depth, nm, cl) == 0) sub[ns++] = idx[q];
        }
        unsigned child = gen_other_key(j, p, sub, ns, depth + cl);
        if (!first) sb_str(j, &b, " | ");
        first = 0;
        lit(j, &b, nm, cl);
        sb_printf(j, &b, " r%u", child);
        sb_printf(j, &cls, "\\U%08X", u8cp(nm, cl));
    }
    if (!first) sb_str(j, &b, " | ");
    sb_str(j, &b, "[^\"\\\\\\x00-\\x1F");
    if (cls.s) sb_add(j, &b, cls.s, cls.n);
    for (const char *c = j->no_raw; c && *c; c++) sb_printf(j, &b, "\\x%02X", (unsigned char)*c);
    sb_str(j, &b, "] char* | esc char*");
    if (!ends_here) sb_str(j, &b, " | ");
    sb_str(j, &b, "\n");
    sb_add(j, &j->out, b.s, b.n);
    free(b.s); free(cls.s); free(sub); free(seen);
    return id;
}

static void gen_object(js *j, unsigned id, json_t *s, const char *path)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    size_t np = json_is_object(props) ? json_object_size(props) : 0;
    prop *p = calloc(np + 1, sizeof *p);
    size_t *idx = calloc(np + 1, sizeof *idx);
    if (!p || !idx) { free(p); free(idx); fail(j, path, "out of memory"); return; }
    size_t k = 0;
    const char *key; json_t *sub;
    char sp[1024];
    if (np) json_object_foreach(props, key, sub) {
        if (json_is_false(sub)) { p[k].name = key; p[k].rule = UINT32_MAX; idx[k] = k; k++; continue; }
        p[k].name = key;
        snprintf(sp, sizeof sp, "%s/properties/%s", path, key);
        p[k].rule = gen(j, sub, sp);
        idx[k] = k;
        k++;
    }
    /* required names that are not in properties: any value */
    size_t nreq_extra = 0;
    if (json_is_array(req)) {
        size_t i; json_t *r;
        json_array_foreach(req, i, r) {
            if (!json_is_string(r)) continue;
            int found = 0;
            for (size_t q = 0; q < k; q++) if (strcmp(p[q].name, json_string_value(r)) == 0) { p[q].required = 1; found = 1; }
            for (size_t q = 0; q < k; q++)
                if (p[q].required && p[q].rule == UINT32_MAX) {
                    fail(j, path, "required property '%s' has the schema false", p[q].name);
                    free(p); free(idx); return;
                }
            if (!found) {
                prop *np2 = realloc(p, sizeof *p * (k + 2));
                size_t *ni2 = realloc(idx, sizeof *idx * (k + 2));
                if (!np2 || !ni2) { free(np2 ? np2 : p); free(ni2 ? ni2 : idx); fail(j, path, "out of memory"); return; }
                p = np2; idx = ni2;
                p[k] = (prop){ json_string_value(r), 0, 1 };
                unsigned vr = new_rule(j);
                sb_printf(j, &j->out, "r%u ::= value\n", vr);
                p[k].rule = vr;
                idx[k] = k;
                k++; nreq_extra++;
            }
        }
    }
    np = k;
    /* one key-value rule per property */
    unsigned *kv = calloc(np + 1, sizeof *kv);
    for (size_t i = 0; i < np; i++) {
        if (p[i].rule == UINT32_MAX) { kv[i] = UINT32_MAX; continue; }
        kv[i] = new_rule(j);
        sb_printf(j, &j->out, "r%u ::= ", kv[i]);
        json_t *js_name = json_string(p[i].name);
        lit_json(j, &j->out, js_name);
        json_decref(js_name);
        sb_printf(j, &j->out, " ws \":\" ws r%u ws\n", p[i].rule);
    }
    /* other keys */
    /* patternProperties are not enforced: their keys pass as other keys */
    int other = !json_is_false(addl) || json_object_get(s, "patternProperties");
    if (json_object_get(s, "patternProperties")) addl = NULL;
    unsigned okv = 0;
    if (other) {
        unsigned ov = json_is_object(addl) ? (snprintf(sp, sizeof sp, "%s/additionalProperties", path), gen(j, addl, sp)) : 0;
        unsigned ok = gen_other_key(j, p, idx, np, 0);
        okv = new_rule(j);
        if (ov) sb_printf(j, &j->out, "r%u ::= \"\\\"\" r%u \"\\\"\" ws \":\" ws r%u ws\n", okv, ok, ov);
        else sb_printf(j, &j->out, "r%u ::= \"\\\"\" r%u \"\\\"\" ws \":\" ws value ws\n", okv, ok);
    }
    /* tracked members come at most once each, in any order: all the known
     * ones when at most 8, else the required ones when at most 6 (else the
     * required ones in the schema's order). Untracked optional members and
     * other keys may repeat. */
    size_t nknown = 0, nreq = 0;
    for (size_t i = 0; i < np; i++) if (kv[i] != UINT32_MAX) { nknown++; nreq += p[i].required; }
    int track_all = nknown <= 8, track = track_all || nreq <= 6;
    unsigned opt = new_rule(j);
    sb_printf(j, &j->out, "r%u ::= ", opt);
    int first = 1;
    if (!track_all)
        for (size_t i = 0; i < np; i++) if (!p[i].required && kv[i] != UINT32_MAX) { sb_printf(j, &j->out, "%sr%u", first ? "" : " | ", kv[i]); first = 0; }
    if (other) { sb_printf(j, &j->out, "%sr%u", first ? "" : " | ", okv); first = 0; }
    sb_str(j, &j->out, "\n");
    int have_opt = !first;
    if (track) {
        size_t ridx[8]; unsigned m = 0, reqmask = 0;
        for (size_t i = 0; i < np; i++)
            if (kv[i] != UINT32_MAX && (track_all || p[i].required)) { if (p[i].required) reqmask |= 1u << m; ridx[m++] = i; }
        unsigned base = j->next, nst = 1u << m;
        j->next += 2 * nst;
        for (unsigned st = 0; st < nst; st++) {
            /* rs(st) after a member (a comma first), rf(st) the first one; st: members still free */
            for (int firstm = 0; firstm < 2; firstm++) {
                const char *sep = firstm ? "" : "\",\" ws ";
                sb_printf(j, &j->out, "r%u ::= ", base + 2 * st + (unsigned)firstm);
                int any = 0;
                for (unsigned b2 = 0; b2 < m; b2++) if (st & (1u << b2)) {
                    sb_printf(j, &j->out, "%s%sr%u r%u", any ? " | " : "", sep, kv[ridx[b2]], base + 2 * (st & ~(1u << b2)));
                    any = 1;
                }
                if (have_opt) { sb_printf(j, &j->out, "%s%sr%u r%u", any ? " | " : "", sep, opt, base + 2 * st); any = 1; }
                if (!(st & reqmask) && any) sb_str(j, &j->out, " | ");
                sb_str(j, &j->out, "\n");
            }
        }
        sb_printf(j, &j->out, "r%u ::= \"{\" ws r%u \"}\"\n", id, base + 2 * (nst - 1) + 1);
    } else {
        sb_printf(j, &j->out, "r%u ::= \"{\" ws ", id);
        int firstm = 1;
        for (size_t i = 0; i < np; i++) if (p[i].required) { sb_printf(j, &j->out, "%sr%u", firstm ? "" : "\",\" ws ", kv[i]); firstm = 0; }
        if (have_opt) sb_printf(j, &j->out, " (\",\" ws r%u)*", opt);
        sb_str(j, &j->out, " \"}\"\n");
    }
    (void)nreq_extra;
    free(kv); free(p); free(idx);
}

/* ---- arrays ---- */
static void gen_array(js *j, unsigned id, json_t *s, const char *path)
{
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    char sp[1024];
    unsigned *pr = NULL; size_t npr = 0;
    unsigned extra = 0; int extra_ok = 1;    /* extra 0 with extra_ok: any value */
    json_t *tuple = json_is_array(prefix) ? prefix : json_is_array(items) ? items : NULL;
    if (tuple) {
        npr = json_array_size(tuple);
        pr = calloc(npr + 1, sizeof *pr);
        for (size_t i = 0; i < npr; i++) {
            snprintf(sp, sizeof sp, "%s/%s/%zu", path, tuple == prefix ? "prefixItems" : "items", i);
            if (json_is_false(json_array_get(tuple, i))) { npr = i; extra_ok = 0; break; }   /* no item here, nor after */
            pr[i] = gen(j, json_array_get(tuple, i), sp);
        }
        json_t *rest = tuple == prefix ? items : addi;
        if (!extra_ok || json_is_false(rest)) extra_ok = 0;
        else if (json_is_object(rest) || json_is_true(rest)) { snprintf(sp, sizeof sp, "%s/items", path); extra = gen(j, rest, sp); }
    } else if (items && !json_is_array(items)) {
        if (json_is_false(items)) extra_ok = 0;
        else { snprintf(sp, sizeof sp, "%s/items", path); extra = gen(j, items, sp); }
    }
    json_int_t mn = json_is_integer(json_object_get(s, "minItems")) ? json_integer_value(json_object_get(s, "minItems")) : 0;
    json_int_t mx = json_is_integer(json_object_get(s, "maxItems")) ? json_integer_value(json_object_get(s, "maxItems")) : -1;
    if (mn < 0 || mn > 1000 || mx > 100000) { free(pr); fail(j, path, "minItems/maxItems beyond 1000"); return; }
    if (!extra_ok && (mx < 0 || mx > (json_int_t)npr)) mx = (json_int_t)npr;
    if (mx >= 0 && mx < mn) { free(pr); sb_printf(j, &j->out, "r%u ::= \"[\" [^\\x00-\\U0010FFFF] \"]\"\n", id); return; }
    /* seq(i): the items from index i on (after a comma) */
    size_t lim = (size_t)(mn > (json_int_t)npr ? mn : (json_int_t)npr);
    unsigned base = j->next;
    j->next += (unsigned)lim + 2;
    char ex[32];
    if (extra) snprintf(ex, sizeof ex, "r%u", extra); else snprintf(ex, sizeof ex, "value");
    for (size_t i = 1; i <= lim + 1; i++) {
        sb_printf(j, &j->out, "r%u ::= ", base + (unsigned)i);
        if (mx >= 0 && (json_int_t)i >= mx) { sb_str(j, &j->out, "\n"); continue; }
        if (i < lim || (i == lim && i < npr)) {
            const char *it = i < npr ? NULL : ex;
            if (it) sb_printf(j, &j->out, "\",\" ws %s ws r%u", it, base + (unsigned)i + 1);
            else sb_printf(j, &j->out, "\",\" ws r%u ws r%u", pr[i], base + (unsigned)i + 1);
            if ((json_int_t)i >= mn) sb_str(j, &j->out, " | ");
        } else if (extra_ok) {
            if (mx >= 0) sb_printf(j, &j->out, "(\",\" ws %s ws){0,%lld}", ex, (long long)(mx - (json_int_t)i));
            else sb_printf(j, &j->out, "(\",\" ws %s ws)*", ex);
        }
        sb_str(j, &j->out, "\n");
    }
    int can_have = (mx != 0) && (npr > 0 || extra_ok);
    sb_printf(j, &j->out, "r%u ::= \"[\" ws ", id);
    if (can_have) {
        if (npr) sb_printf(j, &j->out, "(r%u ws r%u)", pr[0], base + 1);
        else sb_printf(j, &j->out, "(%s ws r%u)", ex, base + 1);
        if (mn == 0) sb_str(j, &j->out, "?");
    } else if (mn > 0) sb_str(j, &j->out, "[^\\x00-\\U0010FFFF]");
    sb_str(j, &j->out, " \"]\"\n");
    free(pr);
}

static json_t *resolve_ref(js *j, const char *ref)
{
    if (strcmp(ref, "#") == 0) return j->root;
    if (strncmp(ref, "#/", 2) != 0) return NULL;
    json_t *cur = j->root;
    const char *p = ref + 2;
    while (*p && cur) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char part[256];
        size_t k = 0;
        for (size_t i = 0; i < n && k + 1 < sizeof part; i++) {
            if (p[i] == '~' && i + 1 < n && p[i + 1] == '1') { part[k++] = '/'; i++; }
            else if (p[i] == '~' && i + 1 < n && p[i + 1] == '0') { part[k++] = '~'; i++; }
            else if (p[i] == '%' && i + 2 < n) { char h[3] = { p[i + 1], p[i + 2], 0 }; part[k++] = (char)strtol(h, NULL, 16); i += 2; }
            else part[k++] = p[i];
        }
        part[k] = 0;
        if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtoul(part, NULL, 10));
        else cur = json_object_get(cur, part);
        p = e ? e + 1 : p + n;
    }
    return cur;
}

/* minimum, maximum, exclusiveMinimum, exclusiveMaximum (a number, or in
 * draft 4 a boolean that makes minimum/maximum exclusive); the tighter of
 * two on the same side. */
static void num_bounds(json_t *s, gram_bound *lo, gram_bound *hi)
{
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
    memset(lo, 0, sizeof *lo); memset(hi, 0, sizeof *hi);
    if (json_is_number(mn)) { lo->on = 1; lo->v = json_number_value(mn); lo->excl = json_is_true(emn); }
    if (json_is_number(mx)) { hi->on = 1; hi->v = json_number_value(mx); hi->excl = json_is_true(emx); }
    if (json_is_number(emn)) {
        double v = json_number_value(emn);
        if (!lo->on || v >= lo->v) { lo->on = 1; lo->v = v; lo->excl = 1; }
    }
    if (json_is_number(emx)) {
        double v = json_number_value(emx);
        if (!hi->on || v <= hi->v) { hi->on = 1; hi->v = v; hi->excl = 1; }
    }
}

static void gen_number(js *j, unsigned id, json_t *s, int integer, const char *path)
{
    gram_bound lo, hi;
    num_bounds(s, &lo, &hi);
    if (!lo.on && !hi.on) { sb_printf(j, &j->out, "r%u ::= %s\n", id, integer ? "integer" : "number"); return; }
    char e[160];
    char *x = numrange_gbnf(&lo, &hi, integer, e, sizeof e);
    if (!x) { fail(j, path, "%s", e); return; }
    sb_printf(j, &j->out, "r%u ::= ", id);
    sb_str(j, &j->out, x);
    sb_str(j, &j->out, "\n");
    free(x);
}

static const char *const type_names[] = { "object", "array", "string", "number", "integer", "boolean", "null" };

static unsigned gen(js *j, json_t *s, const char *path)
{
    if (j->failed) return 0;
    if (++j->depth > 64) { fail(j, path, "schema nested deeper than 64"); return 0; }
    unsigned id = new_rule(j);
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        sb_printf(j, &j->out, "r%u ::= value\n", id);
        j->depth--; return id;
    }
    if (json_is_false(s)) { fail(j, path, "the schema false allows no value"); return 0; }
    if (!json_is_object(s)) { fail(j, path, "a schema must be an object or a boolean"); return 0; }
    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        const char *rs = json_string_value(ref);
        json_t *known = json_object_get(j->refs, rs);
        if (known) { sb_printf(j, &j->out, "r%u ::= r%u\n", id, (unsigned)json_integer_value(known)); j->depth--; return id; }
        json_t *target = resolve_ref(j, rs);
        if (!target) { fail(j, path, "$ref '%s' not found (only local references)", rs); return 0; }
        unsigned tid = j->next;     /* the target's rule id, taken before generating (recursion) */
        json_object_set_new(j->refs, rs, json_integer(tid));
        char sp[1024]; snprintf(sp, sizeof sp, "%s", rs + 1);
        unsigned got = gen(j, target, sp);
        (void)got;
        sb_printf(j, &j->out, "r%u ::= r%u\n", id, tid);
        j->depth--; return id;
    }
    json_t *cst = json_object_get(s, "const");
    if (cst) {
        sbuf b = { 0 };
        gen_const(j, &b, cst, path);
        sb_printf(j, &j->out, "r%u ::= %s\n", id, b.s ? b.s : "\"\"");
        free(b.s);
        j->depth--; return id;
    }
    json_t *en = json_object_get(s, "enum");
    if (json_is_array(en)) {
        if (!json_array_size(en)) { fail(j, path, "empty enum"); return 0; }
        sbuf b = { 0 };
        size_t i; json_t *v;
        json_array_foreach(en, i, v) { if (i) sb_str(j, &b, " | "); gen_const(j, &b, v, path); }
        sb_printf(j, &j->out, "r%u ::= %s\n", id, b.s ? b.s : "\"\"");
        free(b.s);
        j->depth--; return id;
    }
    const char *alts[] = { "anyOf", "oneOf" };
    for (int a = 0; a < 2; a++) {
        json_t *arr = json_object_get(s, alts[a]);
        if (!json_is_array(arr)) continue;
        if (!json_array_size(arr)) { fail(j, path, "empty %s", alts[a]); return 0; }
        /* sibling keywords apply too: fold them into each branch */
        json_t *rest = json_deep_copy(s);
        json_object_del(rest, alts[a]);
        unsigned *br = calloc(json_array_size(arr), sizeof *br);
        size_t i; json_t *v;
        size_t nb = 0;
        json_array_foreach(arr, i, v) {
            char sp[1024]; snprintf(sp, sizeof sp, "%s/%s/%zu", path, alts[a], i);
            if (json_is_false(v)) continue;
            json_t *m = json_is_object(v) ? json_deep_copy(v) : json_object();
            const char *k2; json_t *v2;
            json_object_foreach(rest, k2, v2) if (!json_object_get(m, k2)) json_object_set(m, k2, v2);
            br[nb++] = gen(j, m, sp);
            json_decref(m);
        }
        json_decref(rest);
        if (!nb) { free(br); fail(j, path, "no branch of %s allows a value", alts[a]); return 0; }
        sb_printf(j, &j->out, "r%u ::= ", id);
        for (size_t q = 0; q < nb; q++) sb_printf(j, &j->out, "%sr%u", q ? " | " : "", br[q]);
        sb_str(j, &j->out, "\n");
        free(br);
        j->depth--; return id;
    }
    json_t *all = json_object_get(s, "allOf");
    if (json_is_array(all)) {
        if (json_array_size(all) != 1) { fail(j, path, "allOf with more than one schema is not supported"); return 0; }
        json_t *m = json_deep_copy(s);
        json_object_del(m, "allOf");
        json_t *one = json_array_get(all, 0);
        if (json_is_object(one)) json_object_update_missing(m, one);
        char sp[1024]; snprintf(sp, sizeof sp, "%s/allOf/0", path);
        unsigned r = gen(j, m, sp);
        json_decref(m);
        sb_printf(j, &j->out, "r%u ::= r%u\n", id, r);
        j->depth--; return id;
    }
    /* the types allowed; each with its own keywords */
    int want[7] = { 0 };
    json_t *ty = json_object_get(s, "type");
    if (json_is_string(ty) || json_is_array(ty)) {
        size_t n = json_is_array(ty) ? json_array_size(ty) : 1;
        for (size_t i = 0; i < n; i++) {
            json_t *t1 = json_is_array(ty) ? json_array_get(ty, i) : ty;
            int found = 0;
            for (int k = 0; k < 7; k++) if (json_is_string(t1) && strcmp(json_string_value(t1), type_names[k]) == 0) { want[k] = 1; found = 1; }
            if (!found) { fail(j, path, "unknown type"); return 0; }
        }
        if (want[3]) want[4] = 0;
    } else {
        for (int k = 0; k < 7; k++) want[k] = k != 4;
    }
    unsigned sub[7];
    for (int k = 0; k < 7; k++) {
        if (!want[k]) continue;
        sub[k] = new_rule(j);
        switch (k) {
        case 0: gen_object(j, sub[k], s, path); break;
        case 1: gen_array(j, sub[k], s, path); break;
        case 2: gen_string(j, sub[k], s, path); break;
        case 3: gen_number(j, sub[k], s, 0, path); break;
        case 4: gen_number(j, sub[k], s, 1, path); break;
        case 5: sb_printf(j, &j->out, "r%u ::= boolean\n", sub[k]); break;
        case 6: sb_printf(j, &j->out, "r%u ::= null\n", sub[k]); break;
        }
    }
    sb_printf(j, &j->out, "r%u ::= ", id);
    int first = 1;
    for (int k = 0; k < 7; k++) if (want[k]) { sb_printf(j, &j->out, "%sr%u", first ? "" : " | ", sub[k]); first = 0; }
    sb_str(j, &j->out, "\n");
    j->depth--;
    return id;
}

char *jsonschema_gbnf(const char *schema, size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!root) { snprintf(err, errlen, "json_schema: not JSON: %s at %d:%d", je.text, je.line, je.column); return NULL; }
    js j = { .root = root, .err = err, .errlen = errlen, .refs = json_object() };
    sb_add(&j, &j.out, PRIMS, strlen(PRIMS));
    unsigned top = gen(&j, root, "");
    if (!j.failed) sb_printf(&j, &j.out, "root ::= ws r%u ws\n", top);
    json_decref(j.refs);
    json_decref(root);
    if (j.failed) { free(j.out.s); return NULL; }
    return j.out.s;
}

char *jsonschema_gbnf_set(const char *const *schemas, const size_t *lens, size_t n, const char *prefix,
                          const char *no_raw, char *err, size_t errlen)
{
    js j = { .err = err, .errlen = errlen, .no_raw = no_raw };
    /* the primitives, with the characters of no_raw left to escapes */
    static const char cls[] = "[^\"\\\\\\x00-\\x1F";
    const char *at = strstr(PRIMS, cls);
    size_t pre = at ? (size_t)(at - PRIMS) + sizeof cls - 1 : strlen(PRIMS);
    sb_add(&j, &j.out, PRIMS, pre);
    for (const char *c = no_raw; c && *c; c++) sb_printf(&j, &j.out, "\\x%02X", (unsigned char)*c);
    sb_str(&j, &j.out, &PRIMS[pre]);
    for (size_t i = 0; i < n && !j.failed; i++) {
        json_error_t je;
        json_t *root = json_loadb(schemas[i], lens[i], JSON_DECODE_ANY, &je);
        if (!root) { snprintf(err, errlen, "json_schema: not JSON: %s at %d:%d", je.text, je.line, je.column); j.failed = 1; break; }
        j.root = root;
        j.refs = json_object();
        j.depth = 0;
        unsigned top = gen(&j, root, "");
        if (!j.failed) sb_printf(&j, &j.out, "%s%zu ::= r%u\n", prefix, i, top);
        json_decref(j.refs);
        json_decref(root);
    }
    if (j.failed) { free(j.out.s); return NULL; }
    return j.out.s;
}

const char *jsonschema_object_gbnf(void)
{
    return PRIMS "root ::= ws object ws\n";
}

char *regex_gbnf(const char *re, size_t n, char *err, size_t errlen)
{
    js j = { .err = err, .errlen = errlen };
    int a0 = n && re[0] == '^', a1 = n > (size_t)a0 && re[n - 1] == '$' && (n < 2 || re[n - 2] != '\\');
    sbuf b = { 0 };
    rx r = { re + a0, re + n - a1, &j, "", &b, 0, 1, re };
    int rc = rx_alt(&r);
    if (!j.failed && (rc || r.p != r.end)) {
        j.failed = 1;
        snprintf(err, errlen, "regex: '%.*s' uses a feature not supported, at offset %zu (supported: literals, classes, "
                 "\\d \\w \\s, '.', groups, '|', '*' '+' '?' {m,n}, ^ and $ at the ends)",
                 n > 200 ? 200 : (int)n, re, (size_t)((rc ? r.at : r.p) - re));
    }
    if (!j.failed) sb_printf(&j, &j.out, "root ::= %s\n", b.s ? b.s : "\"\"");
    free(b.s);
    if (j.failed) { free(j.out.s); return NULL; }
    return j.out.s;
}

char *choice_gbnf(const char *const *s, const size_t *lens, size_t k, char *err, size_t errlen)
{
    js j = { .err = err, .errlen = errlen };
    if (k == 0) { snprintf(err, errlen, "choice: no text to choose from"); return NULL; }
    sb_str(&j, &j.out, "root ::= ");
    for (size_t i = 0; i < k && !j.failed; i++) {
        if (!lens[i]) { snprintf(err, errlen, "choice: text %zu is empty", i); free(j.out.s); return NULL; }
        if (i) sb_str(&j, &j.out, " | ");
        lit(&j, &j.out, s[i], lens[i]);
    }
    sb_str(&j, &j.out, "\n");
    if (j.failed) { free(j.out.s); return NULL; }
    return j.out.s;
}
