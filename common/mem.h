/* mem.h — growing arrays, for every part: one doubling policy in place of a
 * realloc loop at each array. */
#ifndef ANE_COMMON_MEM_H
#define ANE_COMMON_MEM_H

#include <stddef.h>

/* Room for need (>= 1) elements of size bytes at p, which holds *cap: p
 * itself when it does, else p reallocated to *cap (or first, when *cap is 0)
 * doubled until it holds need, and *cap set to that. NULL when out of memory
 * (or the size overflows); p and *cap are then unchanged. */
void *mem_grow(void *p, size_t *cap, size_t need, size_t size, size_t first);

#endif
