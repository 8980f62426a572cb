#include "engine/kvcache.h"

#include <stdlib.h>
#include <string.h>

typedef struct page {
    uint64_t key;          /* chained hash; valid when published */
    int32_t parent;        /* previous page of the chain, -1 for the first */
    int32_t ref;
    int32_t lru_prev, lru_next;  /* list of published pages with ref 0 */
    uint8_t published;
} page;

struct kvc {
    int n, P;
    page *pg;
    int32_t *toks;         /* [n][P] tokens of published pages */
    int32_t *free_list; int n_free;
    int32_t *ht; int ht_mask;    /* key → page, linear probing, -1 empty */
    int32_t lru_head, lru_tail;  /* head = least recently used */
    int n_cached, n_used;
};

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

static uint64_t page_key(const kvc *c, uint64_t parent_key, const int32_t *t)
{
    uint64_t h = mix(parent_key, 0x51ED270B27AB1ull);
    for (int i = 0; i < c->P; i++) h = mix(h, (uint32_t)t[i]);
    return h ? h : 1;
}

int kvc_open(kvc **out, int n_pages, int page_tokens)
{
    kvc *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->n = n_pages;
    c->P = page_tokens;
    int hs = 16;
    while (hs < 2 * n_pages) hs <<= 1;
    c->ht_mask = hs - 1;
    c->pg = calloc((size_t)n_pages, sizeof *c->pg);
    c->toks = malloc((size_t)n_pages * page_tokens * sizeof *c->toks);
    c->free_list = malloc((size_t)n_pages * sizeof *c->free_list);
    c->ht = malloc((size_t)hs * sizeof *c->ht);
    if (!c->pg || !c->toks || !c->free_list || !c->ht) { kvc_close(c); return -1; }
    for (int i = 0; i < hs; i++) c->ht[i] = -1;
    for (int i = 0; i < n_pages; i++) c->free_list[i] = n_pages - 1 - i;
    c->n_free = n_pages;
    c->lru_head = c->lru_tail = -1;
    *out = c;
    return 0;
}

void kvc_close(kvc *c)
{
    if (!c) return;
    free(c->pg); free(c->toks); free(c->free_list); free(c->ht);
    free(c);
}

int kvc_total(const kvc *c) { return c->n; }
int kvc_available(const kvc *c) { return c->n_free + c->n_cached; }
int kvc_in_use(const kvc *c) { return c->n_used; }
int kvc_cached(const kvc *c) { return c->n_cached; }

static void lru_remove(kvc *c, int32_t p)
{
    page *g = &c->pg[p];
    if (g->lru_prev >= 0) c->pg[g->lru_prev].lru_next = g->lru_next; else c->lru_head = g->lru_next;
    if (g->lru_next >= 0) c->pg[g->lru_next].lru_prev = g->lru_prev; else c->lru_tail = g->lru_prev;
    g->lru_prev = g->lru_next = -1;
    c->n_cached--;
}

static void lru_push(kvc *c, int32_t p)
{
    page *g = &c->pg[p];
    g->lru_next = -1;
    g->lru_prev = c->lru_tail;
    if (c->lru_tail >= 0) c->pg[c->lru_tail].lru_next = p; else c->lru_head = p;
    c->lru_tail = p;
    c->n_cached++;
}

static int32_t ht_find(const kvc *c, uint64_t key, int32_t parent, const int32_t *t)
{
    for (int i = (int)(key & (uint64_t)c->ht_mask);; i = (i + 1) & c->ht_mask) {
        int32_t p = c->ht[i];
        if (p == -1) return -1;
        if (c->pg[p].key == key && c->pg[p].parent == parent &&
            !memcmp(c->toks + (size_t)p * c->P, t, (size_t)c->P * sizeof *t))
            return p;
    }
}

static void ht_insert(kvc *c, int32_t p)
{
    int i = (int)(c->pg[p].key & (uint64_t)c->ht_mask);
    while (c->ht[i] != -1) i = (i + 1) & c->ht_mask;
    c->ht[i] = p;
}

/* Linear-probing delete with backward shift, so no tombstones pile up. */
static void ht_delete(kvc *c, int32_t p)
{
    int i = (int)(c->pg[p].key & (uint64_t)c->ht_mask);
    while (c->ht[i] != p) {
        if (c->ht[i] == -1) return;
        i = (i + 1) & c->ht_mask;
    }
    c->ht[i] = -1;
    for (int j = (i + 1) & c->ht_mask; c->ht[j] != -1; j = (j + 1) & c->ht_mask) {
        int k = (int)(c->pg[c->ht[j]].key & (uint64_t)c->ht_mask);
        /* move ht[j] into the hole at i unless its home k lies cyclically in (i, j] */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            c->ht[i] = c->ht[j];
            c->ht[j] = -1;
            i = j;
        }
    }
}

/* Unpublishes p. Its children keep their own keys, but they can no longer be
 * matched (the chain walk stops at p), so they age out of the LRU. */
static void unpublish(kvc *c, int32_t p)
{
    ht_delete(c, p);
    c->pg[p].published = 0;
}

int kvc_match(kvc *c, const int32_t *toks, int n, int max_pages, int32_t *pages)
{
    int got = 0;
    uint64_t key = 0;
    int32_t parent = -1;
    while (got < max_pages && (got + 1) * c->P <= n) {
        const int32_t *t = toks + (size_t)got * c->P;
        uint64_t k = page_key(c, key, t);
        int32_t p = ht_find(c, k, parent, t);
        if (p < 0) break;
        pages[got++] = p;
        key = k;
        parent = p;
    }
    for (int i = 0; i < got; i++) {
        page *g = &c->pg[pages[i]];
        if (g->ref++ == 0) { lru_remove(c, pages[i]); c->n_used++; }
    }
    return got;
}

int kvc_alloc(kvc *c, int n, int32_t *pages)
{
    if (n > kvc_available(c)) return -1;
    for (int i = 0; i < n; i++) {
        int32_t p;
        if (c->n_free > 0) p = c->free_list[--c->n_free];
        else {
            p = c->lru_head;
            lru_remove(c, p);
            unpublish(c, p);
        }
        page *g = &c->pg[p];
        g->ref = 1;
        g->published = 0;
        g->parent = -1;
        g->lru_prev = g->lru_next = -1;
        c->n_used++;
        pages[i] = p;
    }
    return 0;
}

void kvc_publish(kvc *c, const int32_t *pages, int idx, const int32_t *toks)
{
    int32_t p = pages[idx];
    page *g = &c->pg[p];
    if (g->published) return;
    int32_t parent = idx > 0 ? pages[idx - 1] : -1;
    if (parent >= 0 && !c->pg[parent].published) return;
    uint64_t pk = parent >= 0 ? c->pg[parent].key : 0;
    const int32_t *t = toks + (size_t)idx * c->P;
    uint64_t k = page_key(c, pk, t);
    if (ht_find(c, k, parent, t) >= 0) return;   /* an equal page is already shared */
    g->key = k;
    g->parent = parent;
    memcpy(c->toks + (size_t)p * c->P, t, (size_t)c->P * sizeof *t);
    g->published = 1;
    ht_insert(c, p);
}

void kvc_release(kvc *c, const int32_t *pages, int n)
{
    for (int i = 0; i < n; i++) {
        int32_t p = pages[i];
        page *g = &c->pg[p];
        if (--g->ref > 0) continue;
        c->n_used--;
        if (g->published) lru_push(c, p);
        else c->free_list[c->n_free++] = p;
    }
}
