/* jinja_fmt.c — Python's string formatting for templates: the `%` operator
 * (printf-style: flags, width, precision, %s %r %d %f %x ..., a tuple or a
 * mapping of arguments) and str.format (auto and explicit fields, attribute
 * and item access, conversions, the format-spec mini-language). */
#include "engine/text/jinja_int.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the numeric conversions hand Python's format specs to snprintf */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

/* ---- printf-style formatting ---- */

static void put_padded(jctx *c, jbuf *b, const char *s, size_t n, int64_t width, int left)
{
    int64_t k = jcp_count(s, n);
    if (!left) for (int64_t i = k; i < width; i++) jbuf_putc(c, b, ' ');
    jbuf_put(c, b, s, n);
    if (left) for (int64_t i = k; i < width; i++) jbuf_putc(c, b, ' ');
}

val jformat_percent(jctx *c, val fmtv, val args)
{
    jstr *f = S(fmtv);
    jlist *tup = args.t == JT_LIST && L(args)->h.sub == L_TUPLE ? L(args) : NULL;
    int is_map = args.t == JT_DICT;
    size_t ai = 0;
    int used_single = 0;
    jbuf b;
    jbuf_init(c, &b);
    for (size_t i = 0; i < f->len;) {
        const char *pct = memchr(f->s + i, '%', f->len - i);
        if (!pct) { jbuf_put(c, &b, f->s + i, f->len - i); break; }
        size_t p = (size_t)(pct - f->s);
        jbuf_put(c, &b, f->s + i, p - i);
        size_t q = p + 1;
        val arg = vundef0();
        int have_key = 0;
        if (q < f->len && f->s[q] == '(') {
            size_t e = q + 1;
            int depth = 1;
            while (e < f->len && depth) { if (f->s[e] == '(') depth++; else if (f->s[e] == ')') depth--; e++; }
            if (depth) jfail(c, JE_VALUE, "incomplete format key");
            if (!is_map) jfail(c, JE_TYPE, "format requires a mapping");
            val *x = jdict_gets(D(args), f->s + q + 1, e - q - 2);
            if (!x) {
                val k = vstr(c, f->s + q + 1, e - q - 2);
                jbuf kb;
                jbuf_init(c, &kb);
                jrepr(c, &kb, k);
                jfail(c, JE_RUNTIME, "KeyError: %s", kb.s);
            }
            arg = *x;
            have_key = 1;
            q = e;
        }
        char flags[8];
        int nf = 0;
        while (q < f->len && strchr("-+ #0", f->s[q]) && nf < 7) flags[nf++] = f->s[q++];
        flags[nf] = 0;
        int64_t width = -1, prec = -1;
#define NEXT_ARG(dst) do { \
            if (tup) { if (ai >= tup->n) jfail(c, JE_TYPE, "not enough arguments for format string"); dst = tup->v[ai++]; } \
            else { if (used_single) jfail(c, JE_TYPE, "not enough arguments for format string"); dst = args; used_single = 1; } \
        } while (0)
        if (q < f->len && f->s[q] == '*') {
            val w;
            NEXT_ARG(w);
            width = jwant_int(c, w, "* wants int");
            if (width < 0) {
                /* a negative * width left-justifies */
                width = width < -1000000 ? 1000001 : -width;
                if (nf < 7 && !strchr(flags, '-')) { flags[nf++] = '-'; flags[nf] = 0; }
            }
            q++;
        } else {
            while (q < f->len && f->s[q] >= '0' && f->s[q] <= '9') { width = (width < 0 ? 0 : width) * 10 + (f->s[q++] - '0'); if (width > 1000000) jfail(c, JE_VALUE, "width too big"); }
        }
        if (q < f->len && f->s[q] == '.') {
            q++;
            prec = 0;
            if (q < f->len && f->s[q] == '*') {
                val w;
                NEXT_ARG(w);
                prec = jwant_int(c, w, "* wants int");
                if (prec < 0) prec = 0;
                if (prec > 1000) jfail(c, JE_VALUE, "precision too big");
                q++;
            } else {
                while (q < f->len && f->s[q] >= '0' && f->s[q] <= '9') { prec = prec * 10 + (f->s[q++] - '0'); if (prec > 1000) jfail(c, JE_VALUE, "precision too big"); }
            }
        }
        while (q < f->len && strchr("hlL", f->s[q])) q++;
        if (q >= f->len) jfail(c, JE_VALUE, "incomplete format");
        char conv = f->s[q++];
        i = q;
        if (conv == '%') { jbuf_putc(c, &b, '%'); continue; }
        if (!have_key) {
            if (is_map) arg = args, used_single = 1;
            else NEXT_ARG(arg);
        }
        int left = strchr(flags, '-') != NULL;
        switch (conv) {
        case 's': case 'r': case 'a': {
            jbuf t;
            jbuf_init(c, &t);
            if (conv == 's') jstr_of(c, &t, arg); else jrepr(c, &t, arg);
            size_t n = t.n;
            if (prec >= 0) {
                size_t o = 0;
                for (int64_t k = 0; k < prec && o < n; k++) {
                    o++;
                    while (o < n && ((unsigned char)t.s[o] & 0xC0) == 0x80) o++;
                }
                n = o;
            }
            put_padded(c, &b, t.s ? t.s : "", n, width, left);
            jbuf_free(c, &t);
            break;
        }
        case 'c': {
            char tmp[8];
            size_t n;
            if (arg.t == JT_STR && jstr_nchars(S(arg)) == 1) { n = S(arg)->len; memcpy(tmp, S(arg)->s, n); }
            else if (arg.t == JT_INT && arg.i >= 0 && arg.i <= 0x10FFFF && !(arg.i >= 0xD800 && arg.i <= 0xDFFF))
                n = utf8_enc((uint32_t)arg.i, tmp);
            else jfail(c, JE_TYPE, "%%c requires int or char");
            put_padded(c, &b, tmp, n, width, left);
            break;
        }
        case 'd': case 'i': case 'u': case 'o': case 'x': case 'X': case 'e': case 'E': case 'f': case 'F':
        case 'g': case 'G': {
            int is_float = strchr("eEfFgG", conv) != NULL;
            if (arg.t == JT_UNDEF) jundef_fail(c, arg);
            if (arg.t != JT_INT && arg.t != JT_BOOL && arg.t != JT_FLOAT) {
                if (is_float) jfail(c, JE_TYPE, "must be real number, not %s", jtype_name(arg));
                jfail(c, JE_TYPE, "%%%c format: %s is required, not %s", conv,
                      strchr("oxX", conv) ? "an integer" : "a real number", jtype_name(arg));
            }
            if (!is_float && arg.t == JT_FLOAT && strchr("oxX", conv))
                jfail(c, JE_TYPE, "%%%c format: an integer is required, not float", conv);
            char spec[32];
            if (width > 1000000 || width < -1000000) jfail(c, JE_VALUE, "width too big");
            int w = (int)width, pr = (int)prec;
            jstr *out;
            if (is_float) {
                double x = arg.t == JT_FLOAT ? arg.f : (double)arg.i;
                if (!isfinite(x)) {
                    const char *t = isnan(x) ? "nan" : x < 0 ? "-inf" : (strchr(flags, '+') ? "+inf" : "inf");
                    put_padded(c, &b, t, strlen(t), width, left);
                    break;
                }
                if (pr < 0) pr = 6;
                snprintf(spec, sizeof spec, "%%%s%s.*%c", flags, width >= 0 ? "*" : "", conv == 'F' ? 'f' : conv);
                int need = width >= 0 ? snprintf(NULL, 0, spec, w, pr, x) : snprintf(NULL, 0, spec, pr, x);
                out = jstr_new(c, NULL, (size_t)need);
                if (width >= 0) snprintf(out->s, (size_t)need + 1, spec, w, pr, x);
                else snprintf(out->s, (size_t)need + 1, spec, pr, x);
            } else {
                if (arg.t == JT_FLOAT && !(fabs(arg.f) < 9.2e18)) jfail(c, JE_OVERFLOW, "integer too large");
                long long x = arg.t == JT_FLOAT ? (long long)arg.f : (long long)arg.i;
                char cv = conv == 'i' || conv == 'u' ? 'd' : conv;
                snprintf(spec, sizeof spec, "%%%s%s%sll%c", flags, width >= 0 ? "*" : "", prec >= 0 ? ".*" : "", cv);
                int need = width >= 0 && prec >= 0 ? snprintf(NULL, 0, spec, w, pr, x)
                         : width >= 0 ? snprintf(NULL, 0, spec, w, x)
                         : prec >= 0 ? snprintf(NULL, 0, spec, pr, x) : snprintf(NULL, 0, spec, x);
                out = jstr_new(c, NULL, (size_t)need + 1);
                size_t cap = (size_t)need + 1;
                if (width >= 0 && prec >= 0) snprintf(out->s, cap, spec, w, pr, x);
                else if (width >= 0) snprintf(out->s, cap, spec, w, x);
                else if (prec >= 0) snprintf(out->s, cap, spec, pr, x);
                else snprintf(out->s, cap, spec, x);
                if (conv == 'o' && strchr(flags, '#')) {
                    /* Python writes 0o17 where C writes 017 (the string has room for the o) */
                    char *z = strchr(out->s, '0');
                    if (z) { memmove(z + 2, z + 1, strlen(z + 1) + 1); z[1] = 'o'; }
                }
            }
            jbuf_put(c, &b, out->s, strlen(out->s));
            jobj_unref(c, &out->h);
            break;
        }
        default:
            jfail(c, JE_VALUE, "unsupported format character '%c' (0x%x) at index %zu", conv, (unsigned char)conv, q - 1);
        }
#undef NEXT_ARG
    }
    if ((tup && ai < tup->n) || (!tup && !is_map && !used_single))
        jfail(c, JE_TYPE, "not all arguments converted during string formatting");
    return jbuf_take(c, &b);
}

/* ---- str.format ---- */

static val format_spec(jctx *c, val v, const char *spec, size_t sn)
{
    if (!sn) return vstr_of(c, v);
    /* [[fill]align][sign][#][0][width][,_][.precision][type] */
    size_t i = 0;
    const char *fill = " ";
    size_t fill_n = 1;
    char align = 0, sign = 0, type = 0;
    int alt = 0, zero = 0, grouping = 0;
    int64_t width = -1, prec = -1;
    uint32_t cp;
    size_t k = sn ? (size_t)utf8_dec(spec, sn, &cp) : 0;
    if (k < sn && strchr("<>=^", spec[k])) { fill = spec; fill_n = k; align = spec[k]; i = k + 1; }
    else if (sn && strchr("<>=^", spec[0])) { align = spec[0]; i = 1; }
    if (i < sn && strchr("+- ", spec[i])) sign = spec[i++];
    if (i < sn && spec[i] == '#') { alt = 1; i++; }
    if (i < sn && spec[i] == '0') { zero = 1; i++; }
    while (i < sn && spec[i] >= '0' && spec[i] <= '9') { width = (width < 0 ? 0 : width) * 10 + (spec[i++] - '0'); if (width > 1000000) jfail(c, JE_VALUE, "Too many decimal digits in format string"); }
    if (i < sn && (spec[i] == ',' || spec[i] == '_')) { grouping = spec[i]; i++; }
    if (i < sn && spec[i] == '.') {
        i++;
        prec = 0;
        while (i < sn && spec[i] >= '0' && spec[i] <= '9') { prec = prec * 10 + (spec[i++] - '0'); if (prec > 1000) jfail(c, JE_VALUE, "Too many decimal digits in format string"); }
    }
    if (i < sn) type = spec[i++];
    if (i < sn) jfail(c, JE_VALUE, "Invalid format specifier");
    (void)alt;
    char body[2400];
    size_t bn;
    int numeric = 0;
    if (v.t == JT_STR || v.t == JT_NONE || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_UNDEF) {
        if (type && type != 's') jfail(c, JE_VALUE, "Unknown format code '%c' for object of type '%s'", type, jtype_name(v));
        if (v.t != JT_STR && (sign || zero)) jfail(c, JE_VALUE, "Sign not allowed in string format specifier");
        val sv = vstr_of(c, v);
        jstr *s = S(sv);
        size_t n = prec >= 0 ? jcp_index(s, prec) : s->len;
        jbuf b;
        jbuf_init(c, &b);
        int64_t nc = jcp_count(s->s, n), pad_n = width > nc ? width - nc : 0;
        char al = align ? align : '<';
        int64_t left = al == '>' ? pad_n : al == '^' ? pad_n / 2 : 0;
        for (int64_t j = 0; j < left; j++) jbuf_put(c, &b, fill, fill_n);
        jbuf_put(c, &b, s->s, n);
        for (int64_t j = left; j < pad_n; j++) jbuf_put(c, &b, fill, fill_n);
        junref(c, sv);
        return jbuf_take(c, &b);
    }
    if (v.t == JT_INT || v.t == JT_BOOL || v.t == JT_FLOAT) {
        numeric = 1;
        char cs[40];
        int is_f = v.t == JT_FLOAT || (type && strchr("eEfFgG%", type));
        if (is_f) {
            double x = v.t == JT_FLOAT ? v.f : (double)v.i;
            char t = type ? type : 'g';
            if (t == '%') { x *= 100; t = 'f'; }
            if (!type && prec < 0) { jfloat_repr(body, sizeof body, x); bn = strlen(body); goto signed_; }
            snprintf(cs, sizeof cs, "%%%s.*%c", sign == '+' ? "+" : sign == ' ' ? " " : "", t == 'F' ? 'f' : t);
            snprintf(body, sizeof body, cs, (int)(prec < 0 ? 6 : prec), x);
            if (type == '%') strcat(body, "%");
        } else {
            if (type && !strchr("dxXobcn", type)) jfail(c, JE_VALUE, "Unknown format code '%c' for object of type 'int'", type);
            long long x = v.i;
            char t = type ? type : 'd';
            if (t == 'n') t = 'd';
            if (t == 'b') {
                char tmp[80];
                int n = 0;
                unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
                do { tmp[n++] = (char)('0' + (u & 1)); u >>= 1; } while (u);
                size_t o = 0;
                if (x < 0) body[o++] = '-'; else if (sign == '+') body[o++] = '+'; else if (sign == ' ') body[o++] = ' ';
                while (n) body[o++] = tmp[--n];
                body[o] = 0;
            } else if (t == 'c') {
                if (x < 0 || x > 0x10FFFF || (x >= 0xD800 && x <= 0xDFFF))
                    jfail(c, JE_OVERFLOW, "%%c arg not in range(0x110000)");
                body[utf8_enc((uint32_t)x, body)] = 0;
            } else {
                snprintf(cs, sizeof cs, "%%%sll%c", sign == '+' ? "+" : sign == ' ' ? " " : "", t);
                snprintf(body, sizeof body, cs, x);
            }
        }
        bn = strlen(body);
        if (grouping) {
            /* thousands separators in the integer digits (every 4 for x, o, b) */
            size_t a = (bn && strchr("+- ", body[0])) ? 1 : 0, e = a;
            while (e < bn && ((body[e] >= '0' && body[e] <= '9') || (type && strchr("xXob", type) && isxdigit((unsigned char)body[e])))) e++;
            size_t every = type && strchr("xXob", type) ? 4 : 3, nd = e - a;
            char g[1300];
            size_t o = 0;
            memcpy(g, body, a);
            o = a;
            for (size_t i2 = 0; i2 < nd; i2++) {
                if (i2 && (nd - i2) % every == 0) g[o++] = (char)grouping;
                g[o++] = body[a + i2];
            }
            memcpy(g + o, body + e, bn - e + 1);
            o += bn - e;
            if (o < sizeof body) { memcpy(body, g, o + 1); bn = o; }
        }
    signed_:;
        jbuf b;
        jbuf_init(c, &b);
        int64_t pad_n = width > (int64_t)bn ? width - (int64_t)bn : 0;
        char al = align ? align : (zero ? '=' : '>');
        if (zero && !align) { fill = "0"; fill_n = 1; }
        if (al == '=') {
            size_t sgn = (bn && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
            jbuf_put(c, &b, body, sgn);
            for (int64_t j = 0; j < pad_n; j++) jbuf_put(c, &b, fill, fill_n);
            jbuf_put(c, &b, body + sgn, bn - sgn);
        } else {
            int64_t left = al == '>' ? pad_n : al == '^' ? pad_n / 2 : 0;
            for (int64_t j = 0; j < left; j++) jbuf_put(c, &b, fill, fill_n);
            jbuf_put(c, &b, body, bn);
            for (int64_t j = left; j < pad_n; j++) jbuf_put(c, &b, fill, fill_n);
        }
        (void)numeric;
        return jbuf_take(c, &b);
    }
    jfail(c, JE_TYPE, "unsupported format string passed to %s.__format__", jtype_name(v));
}

val jformat_brace(jctx *c, jstr *f, jargs *a)
{
    jbuf b;
    jbuf_init(c, &b);
    int auto_idx = 0, manual = 0;
    for (size_t i = 0; i < f->len;) {
        char ch = f->s[i];
        if (ch == '}') {
            if (i + 1 < f->len && f->s[i + 1] == '}') { jbuf_putc(c, &b, '}'); i += 2; continue; }
            jfail(c, JE_VALUE, "Single '}' encountered in format string");
        }
        if (ch != '{') {
            size_t e = i;
            while (e < f->len && f->s[e] != '{' && f->s[e] != '}') e++;
            jbuf_put(c, &b, f->s + i, e - i);
            i = e;
            continue;
        }
        if (i + 1 < f->len && f->s[i + 1] == '{') { jbuf_putc(c, &b, '{'); i += 2; continue; }
        /* {field!conv:spec} */
        size_t e = i + 1;
        int depth = 1;
        while (e < f->len && depth) {
            if (f->s[e] == '{') depth++;
            else if (f->s[e] == '}') depth--;
            if (depth) e++;
        }
        if (e >= f->len) jfail(c, JE_VALUE, "expected '}' before end of string");
        const char *fld = f->s + i + 1;
        size_t fl = e - i - 1, name_end = 0;
        while (name_end < fl && fld[name_end] != '!' && fld[name_end] != ':') name_end++;
        size_t first_end = 0;
        while (first_end < name_end && fld[first_end] != '.' && fld[first_end] != '[') first_end++;
        val v;
        if (first_end == 0) {
            if (manual) jfail(c, JE_VALUE, "cannot switch from manual field specification to automatic field numbering");
            if (auto_idx >= a->n) jfail(c, JE_RUNTIME, "IndexError: Replacement index %d out of range for positional args tuple", auto_idx);
            v = jref(a->v[auto_idx++]);
        } else if (fld[0] >= '0' && fld[0] <= '9') {
            if (auto_idx) jfail(c, JE_VALUE, "cannot switch from automatic field numbering to manual field specification");
            manual = 1;
            long idx = strtol(fld, NULL, 10);
            if (idx >= a->n) jfail(c, JE_RUNTIME, "IndexError: Replacement index %ld out of range for positional args tuple", idx);
            v = jref(a->v[idx]);
        } else {
            int k;
            for (k = 0; k < a->nk; k++)
                if (a->kn[k]->len == first_end && !memcmp(a->kn[k]->s, fld, first_end)) break;
            if (k == a->nk) jfail(c, JE_RUNTIME, "KeyError: '%.*s'", (int)first_end, fld);
            v = jref(a->kv[k]);
        }
        for (size_t p = first_end; p < name_end;) {
            if (fld[p] == '.') {
                size_t q = ++p;
                while (q < name_end && fld[q] != '.' && fld[q] != '[') q++;
                val key = vstr(c, fld + p, q - p);
                val nv = jgetattr(c, v, S(key));
                junref(c, key);
                junref(c, v);
                v = nv;
                p = q;
            } else {
                size_t q = ++p;
                while (q < name_end && fld[q] != ']') q++;
                val key;
                char *endp;
                char tmp[32];
                size_t kl = q - p < sizeof tmp - 1 ? q - p : sizeof tmp - 1;
                memcpy(tmp, fld + p, kl);
                tmp[kl] = 0;
                long idx = strtol(tmp, &endp, 10);
                key = kl && *endp == 0 ? vint(idx) : vstr(c, fld + p, q - p);
                val nv = jgetitem(c, v, key);
                junref(c, key);
                junref(c, v);
                v = nv;
                p = q + 1;
            }
        }
        size_t p = name_end;
        char conv = 0;
        if (p < fl && fld[p] == '!') { conv = p + 1 < fl ? fld[p + 1] : 0; p += 2; }
        const char *spec = "";
        size_t sn = 0;
        if (p < fl && fld[p] == ':') { spec = fld + p + 1; sn = fl - p - 1; }
        if (conv == 'r' || conv == 'a') {
            jbuf t;
            jbuf_init(c, &t);
            jrepr(c, &t, v);
            junref(c, v);
            v = jbuf_take(c, &t);
        } else if (conv == 's') {
            val sv = vstr_of(c, v);
            junref(c, v);
            v = sv;
        } else if (conv) {
            jfail(c, JE_VALUE, "Unknown conversion specifier %c", conv);
        }
        val r = format_spec(c, v, spec, sn);
        jbuf_put(c, &b, S(r)->s, S(r)->len);
        junref(c, r);
        junref(c, v);
        i = e + 1;
    }
    return jbuf_take(c, &b);
}
