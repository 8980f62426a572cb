/* snap.c — recurrent-state snapshot bookkeeping (see snap.h). */
#include "engine/snap.h"

#include <stdlib.h>
#include <string.h>

typedef struct snapent {
    int32_t *toks;
    int len;                 /* 0: holds nothing */
    const void *owner;
    uint64_t used;
} snapent;

struct snapc {
    snapent *e;
    int n, max_len;
    uint64_t tick;
};

int snapc_open(snapc **out, int n, int max_len)
{
    *out = NULL;
    snapc *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->n = n;
    s->max_len = max_len;
    s->e = calloc((size_t)n, sizeof *s->e);
    if (!s->e) { free(s); return -1; }
    for (int i = 0; i < n; i++)
        if (!(s->e[i].toks = malloc((size_t)(max_len > 0 ? max_len : 1) * sizeof(int32_t)))) {
            snapc_close(s);
            return -1;
        }
    *out = s;
    return 0;
}

void snapc_close(snapc *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->e[i].toks);
    free(s->e);
    free(s);
}

int snapc_find(snapc *s, const int32_t *toks, int max_len, int align, int *len)
{
    int best = -1;
    *len = 0;
    for (int i = 0; i < s->n; i++) {
        snapent *e = &s->e[i];
        if (e->len <= *len || e->len > max_len || align <= 0 || e->len % align) continue;
        if (memcmp(e->toks, toks, (size_t)e->len * sizeof(int32_t))) continue;
        best = i;
        *len = e->len;
    }
    if (best >= 0) s->e[best].used = ++s->tick;
    return best;
}

int snapc_take(snapc *s, const void *owner)
{
    int best = -1;
    for (int i = 0; i < s->n; i++) {
        snapent *e = &s->e[i];
        if (e->owner) continue;
        if (best < 0 || (e->len == 0) > (s->e[best].len == 0) ||
            ((e->len == 0) == (s->e[best].len == 0) && e->used < s->e[best].used))
            best = i;
    }
    if (best >= 0) {
        s->e[best].owner = owner;
        s->e[best].len = 0;   /* the state buffer is the owner's to overwrite */
        s->e[best].used = ++s->tick;
    }
    return best;
}

void snapc_set(snapc *s, int i, const int32_t *toks, int len)
{
    snapent *e = &s->e[i];
    if (len > s->max_len) { e->len = 0; return; }
    memcpy(e->toks, toks, (size_t)len * sizeof(int32_t));
    e->len = len;
    e->used = ++s->tick;
}

int snapc_len(const snapc *s, int i) { return s->e[i].len; }

void snapc_release(snapc *s, int i) { s->e[i].owner = NULL; }
