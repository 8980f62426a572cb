/* err.h — error messages into a caller's buffer, for every part (proto,
 * engine, daemon, client): functions that fail take (char *err, size_t
 * errlen) and fill it with what went wrong. */
#ifndef ANE_COMMON_ERR_H
#define ANE_COMMON_ERR_H

#include <stdarg.h>
#include <stddef.h>

/* Formats the message into err[errlen] (nothing when err is NULL or errlen
 * is 0). Returns -1, so that `return err_set(...)` fails the caller. */
int err_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same from a va_list, after "ctx: " when ctx is not NULL (the file or
 * the message the error is about). Returns -1. */
int err_vset(char *err, size_t errlen, const char *ctx, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif
