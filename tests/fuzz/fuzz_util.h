/* fuzz_util.h — shared bits of the fuzz targets: bytes to a file the
 * path-taking loaders can open. */
#ifndef ANE_FUZZ_UTIL_H
#define ANE_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes the bytes to fd from offset 0 and cuts the file there. */
static inline int fuzz_write_fd(int fd, const uint8_t *data, size_t size)
{
    if (ftruncate(fd, 0) != 0) return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = pwrite(fd, data + off, size - off, (off_t)off);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

static inline int fuzz_write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = size && fwrite(data, 1, size, f) != size ? -1 : 0;
    if (fclose(f) != 0) rc = -1;
    return rc;
}

/* Finds the next separator; returns the part's length and moves *p past it. */
static inline size_t fuzz_part(const uint8_t **p, size_t *left, const char *sep)
{
    size_t sl = strlen(sep);
    const uint8_t *s = *p;
    const uint8_t *hit = *left >= sl ? memmem(s, *left, sep, sl) : NULL;
    size_t n = hit ? (size_t)(hit - s) : *left;
    *p = s + n + (hit ? sl : 0);
    *left -= n + (hit ? sl : 0);
    return n;
}

#endif
