/* toolcall_json.c — strict JSON checking and compaction for tool-call
 * arguments. Our own small reader rather than a DOM: arguments must come out
 * exactly as the model wrote them (big integers, 1.0 vs 1, escapes), less
 * whitespace. */
#include "engine/text/toolcall_int.h"

#include "common/hex.h"
#include "common/strbuf.h"
#include "common/utf8.h"

#include <stdlib.h>
#include <string.h>

/* ---- the compactor: recursive descent over s[*i..n) ---- */

typedef struct rd {
    const char *s;
    size_t n, i;
    strbuf *out;
} rd;

static void skip_ws(rd *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

static int rd_string(rd *r)
{
    size_t st = r->i++;   /* the opening quote */
    while (r->i < r->n) {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            strbuf_add(r->out, r->s + st, r->i - st);
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (r->i + 1 >= r->n) return -1;
            char e = r->s[r->i + 1];
            if (e == 'u') {
                if (r->i + 6 > r->n) return -1;
                for (int k = 2; k < 6; k++) if (hex_digit(r->s[r->i + k]) < 0) return -1;
                r->i += 6;
            } else if (strchr("\"\\/bfnrt", e) && e) {
                r->i += 2;
            } else {
                return -1;
            }
            continue;
        }
        if (c < 0x80) { r->i++; continue; }
        int l = utf8_char(r->s + r->i, r->n - r->i);
        if (l <= 0) return -1;
        r->i += (size_t)l;
    }
    return -1;
}

static int digits(rd *r)
{
    size_t st = r->i;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    return r->i > st ? 0 : -1;
}

static int rd_number(rd *r)
{
    size_t st = r->i;
    if (r->s[r->i] == '-') r->i++;
    if (r->i < r->n && r->s[r->i] == '0') r->i++;
    else if (digits(r) < 0) return -1;
    if (r->i < r->n && r->s[r->i] == '.') { r->i++; if (digits(r) < 0) return -1; }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        if (digits(r) < 0) return -1;
    }
    strbuf_add(r->out, r->s + st, r->i - st);
    return 0;
}

static int rd_value(rd *r, int depth)
{
    if (depth > TCJ_MAX_DEPTH) return -1;
    skip_ws(r);
    if (r->i >= r->n) return -1;
    char c = r->s[r->i];
    if (c == '"') return rd_string(r);
    if (c == '-' || (c >= '0' && c <= '9')) return rd_number(r);
    static const char *const lit[] = { "true", "false", "null" };
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lit[k]);
        if (r->n - r->i >= l && !memcmp(r->s + r->i, lit[k], l)) {
            strbuf_add(r->out, lit[k], l);
            r->i += l;
            return 0;
        }
    }
    if (c != '{' && c != '[') return -1;
    char close = c == '{' ? '}' : ']';
    strbuf_addc(r->out, c);
    r->i++;
    skip_ws(r);
    if (r->i < r->n && r->s[r->i] == close) { r->i++; strbuf_addc(r->out, close); return 0; }
    for (;;) {
        if (c == '{') {
            skip_ws(r);
            if (r->i >= r->n || r->s[r->i] != '"' || rd_string(r) < 0) return -1;
            skip_ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') return -1;
            r->i++;
            strbuf_addc(r->out, ':');
        }
        if (rd_value(r, depth + 1) < 0) return -1;
        skip_ws(r);
        if (r->i >= r->n) return -1;
        if (r->s[r->i] == ',') { r->i++; strbuf_addc(r->out, ','); continue; }
        if (r->s[r->i] == close) { r->i++; strbuf_addc(r->out, close); return 0; }
        return -1;
    }
}

int tcj_compact(const char *s, size_t n, strbuf *out)
{
    size_t n0 = out->n;
    rd r = { s, n, 0, out };
    int rc = rd_value(&r, 0);
    if (rc == 0) { skip_ws(&r); if (r.i != n) rc = -1; }
    if (rc < 0 || out->oom) {
        out->n = n0;
        if (out->p) out->p[n0] = 0;
        return -1;
    }
    return 0;
}

/* ---- reading compact JSON (known valid: no checks needed) ---- */

size_t tcj_value_len(const char *s, size_t n)
{
    if (!n) return 0;
    if (s[0] == '"') {
        size_t i = 1;
        while (i < n && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
        return i < n ? i + 1 : n;
    }
    if (s[0] != '{' && s[0] != '[') {
        size_t i = 0;
        while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']') i++;
        return i;
    }
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '"') { i += tcj_value_len(s + i, n - i) - 1; continue; }
        if (c == '{' || c == '[') depth++;
        else if ((c == '}' || c == ']') && --depth == 0) return i + 1;
    }
    return n;
}

int tcj_get(const char *obj, size_t n, const char *key, const char **v, size_t *vl)
{
    if (n < 2 || obj[0] != '{') return 0;
    size_t i = 1;
    strbuf k = {0};
    int found = 0;
    while (i < n && obj[i] == '"') {
        size_t kl = tcj_value_len(obj + i, n - i);
        k.n = 0;
        if (tcj_str_decode(obj + i, kl, &k) < 0 || k.oom) break;
        i += kl + 1;   /* the key and ':' */
        size_t l = tcj_value_len(obj + i, n - i);
        if (k.n == strlen(key) && !memcmp(k.p, key, k.n)) {
            *v = obj + i;
            *vl = l;
            found = 1;
            break;
        }
        i += l;
        if (i < n && obj[i] == ',') i++;
    }
    strbuf_free(&k);
    return found;
}

static void put_utf8(strbuf *b, unsigned cp)
{
    char u[4];
    size_t l;
    if (cp < 0x80) { u[0] = (char)cp; l = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | cp >> 6); u[1] = (char)(0x80 | (cp & 63)); l = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12); u[1] = (char)(0x80 | ((cp >> 6) & 63)); u[2] = (char)(0x80 | (cp & 63)); l = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18); u[1] = (char)(0x80 | ((cp >> 12) & 63));
        u[2] = (char)(0x80 | ((cp >> 6) & 63)); u[3] = (char)(0x80 | (cp & 63)); l = 4;
    }
    strbuf_add(b, u, l);
}

static unsigned hex4(const char *s)
{
    return (unsigned)(hex_digit(s[0]) << 12 | hex_digit(s[1]) << 8 | hex_digit(s[2]) << 4 | hex_digit(s[3]));
}

int tcj_str_decode(const char *s, size_t n, strbuf *out)
{
    if (n < 2 || s[0] != '"' || s[n - 1] != '"') return -1;
    for (size_t i = 1; i + 1 < n; i++) {
        if (s[i] != '\\') { strbuf_addc(out, s[i]); continue; }
        char e = s[++i];
        switch (e) {
        case 'b': strbuf_addc(out, '\b'); break;
        case 'f': strbuf_addc(out, '\f'); break;
        case 'n': strbuf_addc(out, '\n'); break;
        case 'r': strbuf_addc(out, '\r'); break;
        case 't': strbuf_addc(out, '\t'); break;
        case 'u': {
            unsigned cp = hex4(s + i + 1);
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 < n && s[i + 1] == '\\' && s[i + 2] == 'u') {
                unsigned lo = hex4(s + i + 3);
                if (lo >= 0xDC00 && lo < 0xE000) { cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00); i += 6; }
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;   /* a lone surrogate */
            put_utf8(out, cp);
            break;
        }
        default: strbuf_addc(out, e); break;   /* " \ / */
        }
    }
    return 0;
}

int tcj_scan_feed(tcj_scan *sc, const char *s, size_t len)
{
    for (; sc->pos < len; sc->pos++) {
        char c = s[sc->pos];
        if (!sc->started) {
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
            if (c != '{' && c != '[') return -1;
            sc->started = 1;
        }
        if (sc->in_str) {
            if (sc->esc) sc->esc = 0;
            else if (c == '\\') sc->esc = 1;
            else if (c == '"') sc->in_str = 0;
            continue;
        }
        if (c == '"') sc->in_str = 1;
        else if (c == '{' || c == '[') {
            if (++sc->depth > TCJ_MAX_DEPTH) return -1;
        } else if (c == '}' || c == ']') {
            if (--sc->depth == 0) { sc->pos++; return 1; }
        }
    }
    return 0;
}
