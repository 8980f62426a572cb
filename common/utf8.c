/* utf8.c — see utf8.h. */
#include "common/utf8.h"

int utf8_char(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    if (n == 0) return 0;
    unsigned c = p[0], lo = 0x80, hi = 0xBF;   /* [lo, hi]: the second byte's range */
    size_t len;
    if (c < 0x80) return 1;
    if (c < 0xC2) return -1;                   /* a continuation byte, or an overlong lead */
    if (c < 0xE0) len = 2;
    else if (c < 0xF0) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;              /* overlong */
        else if (c == 0xED) hi = 0x9F;         /* surrogates */
    } else if (c < 0xF5) {
        len = 4;
        if (c == 0xF0) lo = 0x90;              /* overlong */
        else if (c == 0xF4) hi = 0x8F;         /* above U+10FFFF */
    } else return -1;
    for (size_t i = 1; i < len; i++) {
        if (i >= n) return 0;
        if (p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xBF)) return -1;
    }
    return (int)len;
}

int utf8_valid(const char *s, size_t n, size_t *bad)
{
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) { i++; continue; }
        int l = utf8_char(s + i, n - i);
        if (l <= 0) {
            if (bad) *bad = i;
            return 0;
        }
        i += (size_t)l;
    }
    return 1;
}
