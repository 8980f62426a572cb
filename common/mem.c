/* mem.c — growing arrays (mem.h). */
#include "common/mem.h"

#include <stdint.h>
#include <stdlib.h>

void *mem_grow(void *p, size_t *cap, size_t need, size_t size, size_t first)
{
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : first;
    while (c < need) {
        if (c > SIZE_MAX / 2) return NULL;
        c *= 2;
    }
    if (c > SIZE_MAX / size) return NULL;
    void *q = realloc(p, c * size);
    if (q) *cap = c;
    return q;
}
