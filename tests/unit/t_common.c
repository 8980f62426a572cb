/* t_common.c — common/: the UTF-8 validator against a decoder written from
 * RFC 3629's definition (every 1- to 3-byte sequence, 4-byte ones over every
 * lead and second byte), the error-message helpers, array growth, the byte
 * buffer and its JSON strings (read back by jansson), hex digits, the chat
 * template variables a request sets itself and the stop signals. */
#include "common/err.h"
#include "common/chatvars.h"
#include "common/hex.h"
#include "common/mem.h"
#include "common/sig.h"
#include "common/strbuf.h"
#include "common/utf8.h"
#include "tests/check.h"

#include <jansson.h>
#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

/* Reference: the length of the character at s[0..n) when whole and valid
 * (decode, then require the shortest form and a scalar value), 0 when a
 * prefix of some valid character, -1 otherwise. */
static int ref_char(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    int len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : -1;
    if (len < 0) return -1;
    if ((size_t)len > n) {   /* a prefix: valid when some completion is */
        unsigned char t[4];
        memcpy(t, s, n);
        for (unsigned b1 = 0x80; b1 <= 0xBF; b1++) {
            t[1] = n > 1 ? s[1] : (unsigned char)b1;
            for (size_t i = 2; i < 4; i++) t[i] = i < n ? s[i] : 0x80;
            if (ref_char(t, (size_t)len) == len) return 0;
        }
        return -1;
    }
    uint32_t cp = len == 1 ? s[0] : s[0] & (0x7Fu >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (cp < min[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return -1;
    return len;
}

static int char_agrees(const unsigned char *s, size_t n)
{
    return utf8_char((const char *)s, n) == ref_char(s, n);
}

static void t_utf8_exhaustive(void)
{
    long bad = 0, valid = 0;
    unsigned char s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (unsigned char)a;
        bad += !char_agrees(s, 1);
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (unsigned char)b;
            bad += !char_agrees(s, 2);
            if (a < 0xE0 || a > 0xEF) continue;
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (unsigned char)c;
                bad += !char_agrees(s, 3);
                valid += ref_char(s, 3) == 3;
            }
        }
    }
    CHECKF(bad == 0, "%ld of the 1- to 3-byte sequences disagree", bad);
    CHECK_EQ_INT(valid, 0x10000 - 0x800 - 0x800);   /* every 3-byte scalar value */
    static const unsigned char tail[] = { 0x00, 0x7F, 0x80, 0xA5, 0xBF, 0xC0, 0xFF };
    bad = 0;
    for (unsigned a = 0xF0; a < 0x100; a++)
        for (unsigned b = 0; b < 256; b++)
            for (size_t c = 0; c < sizeof tail; c++)
                for (size_t d = 0; d < sizeof tail; d++) {
                    s[0] = (unsigned char)a; s[1] = (unsigned char)b; s[2] = tail[c]; s[3] = tail[d];
                    for (size_t n = 1; n <= 4; n++) bad += !char_agrees(s, n);
                }
    CHECKF(bad == 0, "%ld 4-byte cases disagree", bad);
}

static void t_utf8_valid(void)
{
    static const struct { const char *s; int ok; size_t bad; } v[] = {
        { "", 1, 0 },
        { "plain ascii", 1, 0 },
        { "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 1, 0 },
        { "\xF4\x8F\xBF\xBF", 1, 0 },                 /* U+10FFFF */
        { "ab\xC3", 0, 2 },                           /* cut at the end */
        { "ab\xE2\x82", 0, 2 },
        { "a\xC0\xAF", 0, 1 },                        /* overlong '/' */
        { "ab\xE0\x9F\xBF", 0, 2 },                   /* overlong 3-byte */
        { "\xED\xA0\x80", 0, 0 },                     /* surrogate */
        { "xyz\xF4\x90\x80\x80", 0, 3 },              /* above U+10FFFF */
        { "\xF5\x80\x80\x80", 0, 0 },
        { "ok\x80", 0, 2 },                           /* stray continuation */
        { "\xC3\xA9\xC3(", 0, 2 },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        size_t bad = 99;
        CHECKF(utf8_valid(v[i].s, strlen(v[i].s), &bad) == v[i].ok, "case %zu", i);
        if (!v[i].ok) CHECKF(bad == v[i].bad, "case %zu: bad at %zu, expected %zu", i, bad, v[i].bad);
    }
    CHECK(utf8_valid("a\0b", 3, NULL));               /* NUL is a character */
    CHECK(!utf8_valid("\xFF", 1, NULL));
    CHECK_EQ_INT(utf8_char("\xE2\x82\xAC", 2), 0);      /* may yet complete */
    CHECK_EQ_INT(utf8_char("\xE2\x41", 2), -1);
    CHECK_EQ_INT(utf8_char("x", 0), 0);
}

static int vwrap(char *err, size_t errlen, const char *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = err_vset(err, errlen, ctx, fmt, ap);
    va_end(ap);
    return rc;
}

static void t_err(void)
{
    char e[32];
    CHECK_EQ_INT(err_set(e, sizeof e, "bad %s at %d", "field", 7), -1);
    CHECK(strcmp(e, "bad field at 7") == 0);
    CHECK_EQ_INT(err_set(NULL, 10, "x"), -1);         /* no buffer: still fails */
    memcpy(e, "keep", 5);
    CHECK_EQ_INT(err_set(e, 0, "x"), -1);
    CHECK(strcmp(e, "keep") == 0);
    CHECK_EQ_INT(err_set(e, 8, "%s", "truncated text"), -1);
    CHECK(strcmp(e, "truncat") == 0);
    CHECK_EQ_INT(vwrap(e, sizeof e, "a.gguf", "missing key '%s'", "k"), -1);
    CHECK(strcmp(e, "a.gguf: missing key 'k'") == 0);
    CHECK_EQ_INT(vwrap(e, 5, "longer context", "m"), -1);   /* the context alone overflows */
    CHECK(strcmp(e, "long") == 0);
    CHECK_EQ_INT(vwrap(e, sizeof e, NULL, "n=%d", 3), -1);
    CHECK(strcmp(e, "n=3") == 0);
}

static void t_mem_grow(void)
{
    size_t cap = 0;
    int *a = mem_grow(NULL, &cap, 1, sizeof *a, 8);
    CHECK(a && cap == 8);
    for (int i = 0; i < 8; i++) a[i] = i;
    CHECK(mem_grow(a, &cap, 8, sizeof *a, 8) == a && cap == 8);   /* room enough: unchanged */
    a = mem_grow(a, &cap, 9, sizeof *a, 8);
    CHECK(a && cap == 16);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(a[i], i);             /* kept */
    a = mem_grow(a, &cap, 100, sizeof *a, 8);
    CHECK(a && cap == 128);
    size_t before = cap;
    CHECK(mem_grow(a, &cap, SIZE_MAX / 2, sizeof *a, 8) == NULL);  /* overflow: refused, untouched */
    CHECK(cap == before);
    free(a);
}

static void t_strbuf(void)
{
    strbuf b = { 0 };
    strbuf_add(&b, "", 0);
    CHECK(b.p && b.n == 0 && b.p[0] == 0);
    strbuf_adds(&b, "ab");
    strbuf_addc(&b, 'c');
    strbuf_add(&b, "d\0e", 3);
    CHECK(b.n == 6 && memcmp(b.p, "abcd\0e", 7) == 0 && !b.oom);
    strbuf_free(&b);
    CHECK(!b.p && !b.n && !b.cap);
    for (int i = 0; i < 10000; i++) strbuf_addc(&b, (char)('a' + i % 26));
    CHECK(b.n == 10000 && b.p[9999] == 'a' + 9999 % 26 && b.p[10000] == 0);
    strbuf_free(&b);
}

/* json_escape: the short forms where JSON has them, \u00XX for the other
 * controls, nothing for the rest */
static void t_json_escape(void)
{
    for (int c = 0; c < 256; c++) {
        char e[6];
        size_t n = json_escape((unsigned char)c, e);
        const char *want = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        char u[7];
        snprintf(u, sizeof u, "\\u%04x", c);
        if (!want && c < 0x20) want = u;
        if (!want) CHECKF(n == 0, "byte %d", c);
        else CHECKF(n == strlen(want) && memcmp(e, want, n) == 0, "byte %d", c);
    }
}

/* strbuf_json_str read back by jansson: the same bytes for valid UTF-8 (all
 * controls, quotes, backslashes, 2- to 4-byte characters), U+FFFD for each
 * byte that does not start a valid character */
static void t_json_str(void)
{
    static const char *const ok[] = { "", "plain", "q\"b\\s/", "\x01\x1f\x7f\b\f\n\r\t", "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80" };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        strbuf b = { 0 };
        strbuf_json_str(&b, ok[i], strlen(ok[i]));
        json_error_t je;
        json_t *j = json_loadb(b.p, b.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        CHECKF(j && json_is_string(j) && json_string_length(j) == strlen(ok[i]) &&
               memcmp(json_string_value(j), ok[i], strlen(ok[i])) == 0, "case %zu: %s", i, b.p);
        json_decref(j);
        strbuf_free(&b);
    }
    strbuf b = { 0 };
    strbuf_json_str(&b, "a\xFF\xC3(\xE2\x82", 6);   /* bad lead, bad second byte, cut at the end */
    CHECK(b.p && strcmp(b.p, "\"a\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD\"") == 0);
    strbuf_free(&b);
    /* a random mix: always valid JSON, and valid input comes back whole */
    uint32_t x = 12345;
    for (int r = 0; r < 2000; r++) {
        char s[32];
        size_t n = (size_t)(r % 32);
        for (size_t i = 0; i < n; i++) { x = x * 1664525u + 1013904223u; s[i] = (char)(x >> 24); }
        strbuf_json_str(&b, s, n);
        json_error_t je;
        json_t *j = json_loadb(b.p, b.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        CHECKF(j != NULL, "round %d: %s", r, je.text);
        if (j && utf8_valid(s, n, NULL))
            CHECKF(json_string_length(j) == n && memcmp(json_string_value(j), s, n) == 0, "round %d", r);
        json_decref(j);
        strbuf_free(&b);
    }
}

static void t_hex_digit(void)
{
    static const char digits[] = "0123456789abcdef";
    for (int c = 0; c < 256; c++) {
        const char *p = c ? strchr(digits, tolower(c)) : NULL;
        CHECKF(hex_digit(c) == (p ? (int)(p - digits) : -1), "byte %d", c);
    }
}

/* chat_own_var: the three names whole, nothing else (prefixes, longer names, case) */
static void t_chat_own_var(void)
{
    static const char *const own[] = { "messages", "tools", "add_generation_prompt" };
    for (int i = 0; i < 3; i++) CHECK(chat_own_var(own[i], strlen(own[i])) != NULL && !strcmp(chat_own_var(own[i], strlen(own[i])), own[i]));
    static const char *const other[] = { "", "tool", "toolsx", "Messages", "message", "add_generation_prompt_", "enable_thinking" };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) CHECKF(chat_own_var(other[i], strlen(other[i])) == NULL, "%s", other[i]);
    CHECK(chat_own_var("messagesX", 8) != NULL);   /* (a length, not a terminator, ends the key) */
}

static void t_stop_signals(void)
{
    sigset_t s;
    stop_signals(&s);
    int n = 0;
    for (int sig = 1; sig < 32; sig++) n += sigismember(&s, sig) == 1;
    CHECK_EQ_INT(n, 3);
    CHECK(sigismember(&s, SIGTERM) == 1 && sigismember(&s, SIGINT) == 1 && sigismember(&s, SIGHUP) == 1);
}

int main(void)
{
    RUN(t_utf8_exhaustive);
    RUN(t_utf8_valid);
    RUN(t_err);
    RUN(t_mem_grow);
    RUN(t_strbuf);
    RUN(t_json_escape);
    RUN(t_json_str);
    RUN(t_hex_digit);
    RUN(t_chat_own_var);
    RUN(t_stop_signals);
    return CHECK_DONE();
}
