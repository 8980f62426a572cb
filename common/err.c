/* err.c — see err.h. */
#include "common/err.h"

#include <stdio.h>

int err_vset(char *err, size_t errlen, const char *ctx, const char *fmt, va_list ap)
{
    if (!err || !errlen) return -1;
    int k = ctx ? snprintf(err, errlen, "%s: ", ctx) : 0;
    if (k < 0) k = 0;
    if ((size_t)k < errlen) vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    return -1;
}

int err_set(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(err, errlen, NULL, fmt, ap);
    va_end(ap);
    return -1;
}
