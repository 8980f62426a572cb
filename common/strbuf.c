/* strbuf.c — growing byte buffer and JSON string literals (strbuf.h). */
#include "common/strbuf.h"
#include "common/mem.h"
#include "common/utf8.h"

#include <stdlib.h>
#include <string.h>

void strbuf_add(strbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    char *p = mem_grow(b->p, &b->cap, b->n + n + 1, 1, 64);
    if (!p) { b->oom = 1; return; }
    b->p = p;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void strbuf_addc(strbuf *b, char c) { strbuf_add(b, &c, 1); }
void strbuf_adds(strbuf *b, const char *s) { strbuf_add(b, s, strlen(s)); }

void strbuf_free(strbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

size_t json_escape(unsigned char c, char e[6])
{
    static const char hex[] = "0123456789abcdef";
    static const char shorts[][2] = { { '"', '"' }, { '\\', '\\' }, { '\n', 'n' }, { '\r', 'r' }, { '\t', 't' } };
    if (c >= 0x20 && c != '"' && c != '\\') return 0;
    e[0] = '\\';
    for (size_t i = 0; i < sizeof shorts / sizeof shorts[0]; i++)
        if (c == (unsigned char)shorts[i][0]) { e[1] = shorts[i][1]; return 2; }
    memcpy(e + 1, "u00", 3);
    e[4] = hex[c >> 4];
    e[5] = hex[c & 15];
    return 6;
}

void strbuf_json_str(strbuf *b, const char *s, size_t n)
{
    strbuf_addc(b, '"');
    size_t run = 0;   /* s[run..i) is added as it is */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        char e[6];
        size_t el;
        if (c >= 0x80) {
            int l = utf8_char(s + i, n - i);
            if (l > 0) { i += (size_t)l; continue; }
            memcpy(e, "\xEF\xBF\xBD", 3);   /* U+FFFD in place of the byte */
            el = 3;
        } else if (!(el = json_escape(c, e))) {
            i++;
            continue;
        }
        if (i > run) strbuf_add(b, s + run, i - run);
        strbuf_add(b, e, el);
        run = ++i;
    }
    if (n > run) strbuf_add(b, s + run, n - run);   /* s may be NULL when n is 0 */
    strbuf_addc(b, '"');
}
