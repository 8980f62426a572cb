/* toolcall_int.h — the tool-call parser's JSON helpers
 * (engine/text/toolcall*.c only); their buffer is common/strbuf.h. */
#ifndef ANE_TOOLCALL_INT_H
#define ANE_TOOLCALL_INT_H

#include "common/strbuf.h"

#include <stddef.h>

/* Exactly one JSON value in s[0..n) (surrounding whitespace allowed),
 * appended to out without insignificant whitespace; every token (numbers,
 * string escapes) kept as written. Strings must be valid UTF-8 without raw
 * control characters. 0, or -1 when it is not valid JSON (out as before). */
int tcj_compact(const char *s, size_t n, strbuf *out);

/* In a compact JSON object, the value of key (its compact text): 1 when
 * found, 0 when not (or obj is not an object). */
int tcj_get(const char *obj, size_t n, const char *key, const char **v, size_t *vl);

/* The length of the first value of compact JSON text s. */
size_t tcj_value_len(const char *s, size_t n);

/* A compact JSON string token decoded to UTF-8 (appended to out). 0, or -1
 * when s is not a string. */
int tcj_str_decode(const char *s, size_t n, strbuf *out);


/* Finding where a JSON object or array ends in streamed text, without
 * rescanning: fed from pos on as text arrives. */
typedef struct tcj_scan {
    size_t pos;     /* next byte to look at */
    int depth, in_str, esc, started;
} tcj_scan;

/* s is the whole buffer, len its length; scanning resumes at sc->pos.
 * 1: the value ends at sc->pos (exclusive); 0: more text is needed;
 * -1: not an object or array (the first non-space byte is another), or
 * nested deeper than the compactor accepts. */
int tcj_scan_feed(tcj_scan *sc, const char *s, size_t len);

#define TCJ_MAX_DEPTH 128

#endif
