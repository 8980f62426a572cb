/* strbuf.h — a growing byte buffer and JSON string literals, for every part
 * that writes JSON text (proto's msgpack-to-JSON, the tool-call parser). */
#ifndef ANE_COMMON_STRBUF_H
#define ANE_COMMON_STRBUF_H

#include <stddef.h>

/* p[0..n) plus a NUL once anything was added; oom is sticky, so a sequence
 * of adds is checked once. Zero-initialised it is empty. */
typedef struct strbuf {
    char *p;
    size_t n, cap;
    int oom;
} strbuf;

void strbuf_add(strbuf *b, const char *s, size_t n);
void strbuf_addc(strbuf *b, char c);
void strbuf_adds(strbuf *b, const char *s);
void strbuf_free(strbuf *b);

/* The escape of byte c inside a JSON string into e: its length (2 for \" \\
 * \n \r \t, 6 for \u00XX of another control), 0 when c stands as itself. */
size_t json_escape(unsigned char c, char e[6]);
/* s[0..n) as a JSON string literal. Bytes that are not valid UTF-8 become
 * U+FFFD, so that the result is always valid JSON. */
void strbuf_json_str(strbuf *b, const char *s, size_t n);

#endif
