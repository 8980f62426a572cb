/* utf8.h — UTF-8 validation for every part (proto, engine, daemon, client),
 * by RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF. */
#ifndef ANE_COMMON_UTF8_H
#define ANE_COMMON_UTF8_H

#include <stddef.h>

/* The character that starts s[0..n): its length (1 to 4) when whole and
 * valid; 0 when s holds only the valid start of one (it may yet complete,
 * e.g. at the end of a stream's chunk; also for n = 0); -1 when invalid. */
int utf8_char(const char *s, size_t n);
/* 1 when s[0..n) is valid UTF-8 throughout (a character cut at the end is
 * not); otherwise 0, and *bad (when not NULL) is the offset of the first
 * byte that does not start a valid character. */
int utf8_valid(const char *s, size_t n, size_t *bad);

#endif
