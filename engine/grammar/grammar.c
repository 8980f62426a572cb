/* grammar.c — the matcher: pushdown stacks over code points, the
 * vocabulary trie and the per-step token mask.
 *
 * A stack is a chain of interned nodes (pos, parent): pos is the element
 * to match next (a character set) or, in a parent, the element to go on
 * with when the child rule ends. Interning makes equal stacks the same id,
 * so a state is a sorted set of ids (0 = the empty stack: the grammar may
 * end here) and duplicates fold away. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gram_int.h"

typedef struct { uint32_t pos, parent; } gnode;

#define CACHE_N 32

typedef struct {
    const gram_vocab *v;
    uint32_t *set, n;          /* state: ids */
    uint32_t cp, left;         /* partial code point */
    uint32_t *mask;
    int64_t count;
    uint64_t used;
} mcache;

struct gram_match {
    const gram *g;
    gnode *nodes; uint32_t n_nodes, cap_nodes;     /* ids from 1 */
    uint32_t *ht; uint32_t ht_cap;                 /* id per slot, 0 = empty */
    uint32_t *cur; uint32_t n_cur, cap_cur;        /* committed state */
    uint32_t cp, left;                             /* committed partial code point */
    uint32_t *buf; uint32_t n_buf, cap_buf;        /* scratch state sets */
    uint32_t *work; uint32_t cap_work;             /* expansion worklist (pairs) */
    uint32_t n_expand;
    int over;                                      /* a bound was passed */
    mcache cache[CACHE_N];
    uint64_t tick;
    /* transitions seen before: (state, code point) → state; most trie
     * nodes repeat one (inside a string every character leads to the same
     * state), so a walk mostly looks them up */
    struct memo { uint64_t h; uint32_t cp, in_off, in_n, out_off, out_n; } *memo;
    uint32_t memo_cap, n_memo;
    uint32_t *marena; uint32_t n_marena, cap_marena;
};

/* The memo starts small and doubles up to these (then is cleared when
 * full): a matcher that takes a few values touches a few KiB, not the
 * 18 MiB of the largest. */
#define MEMO_MIN (1u << 10)
#define MEMO_CAP (1u << 16)
#define MEMO_ARENA_MIN (1u << 14)
#define MEMO_ARENA (1u << 22)

struct gram_vocab {
    int32_t n_vocab;
    uint32_t n_nodes, max_depth;
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *end;             /* past the node's subtree (preorder) */
    uint32_t *tok_off, *tok_n; /* tokens ending at the node */
    int32_t *toks;
    int32_t *special; uint32_t n_special;   /* matched as symbols, not text */
};

/* ---- node pool ---- */
static uint32_t hash2(uint32_t a, uint32_t b)
{
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static int ht_rebuild(gram_match *m, uint32_t cap)
{
    uint32_t *ht = calloc(cap, sizeof *ht);
    if (!ht) return -1;
    for (uint32_t id = 1; id <= m->n_nodes; id++) {
        uint32_t h = hash2(m->nodes[id].pos, m->nodes[id].parent) & (cap - 1);
        while (ht[h]) h = (h + 1) & (cap - 1);
        ht[h] = id;
    }
    free(m->ht);
    m->ht = ht; m->ht_cap = cap;
    return 0;
}

static uint32_t intern(gram_match *m, uint32_t pos, uint32_t parent)
{
    uint32_t h = hash2(pos, parent) & (m->ht_cap - 1);
    while (m->ht[h]) {
        gnode *n = &m->nodes[m->ht[h]];
        if (n->pos == pos && n->parent == parent) return m->ht[h];
        h = (h + 1) & (m->ht_cap - 1);
    }
    if (m->n_nodes + 2 > m->cap_nodes) {
        uint32_t nc = m->cap_nodes * 2;
        gnode *q = realloc(m->nodes, (size_t)nc * sizeof *q);
        if (!q) { m->over = 1; return 0; }
        m->nodes = q; m->cap_nodes = nc;
    }
    uint32_t id = ++m->n_nodes;
    m->nodes[id] = (gnode){ pos, parent };
    if ((uint64_t)m->n_nodes * 2 > m->ht_cap) {
        if (ht_rebuild(m, m->ht_cap * 2)) { m->over = 1; return 0; }
    } else m->ht[h] = id;
    return id;
}

static int buf_reserve(gram_match *m, uint32_t extra)
{
    if (m->n_buf + extra <= m->cap_buf) return 0;
    uint32_t nc = m->cap_buf ? m->cap_buf : 1024;
    while (nc < m->n_buf + extra) nc *= 2;
    uint32_t *q = realloc(m->buf, (size_t)nc * sizeof *q);
    if (!q) return -1;
    m->buf = q; m->cap_buf = nc;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Expands the worklist until every stack's top is a character set (or the
 * stack is empty), appending ids at m->buf[m->n_buf...]. */
static void expand_all(gram_match *m, uint32_t nw)
{
    const gram *g = m->g;
    while (nw && !m->over) {
        nw--;
        uint32_t pos = m->work[2 * nw], parent = m->work[2 * nw + 1];
        for (;;) {
            if (++m->n_expand > GRAM_MAX_EXPAND) { m->over = 1; return; }
            const gram_el *e = &g->el[pos];
            if (e->type == GEL_CHAR) {
                uint32_t id = intern(m, pos, parent);
                if (m->over || buf_reserve(m, 1)) { m->over = 1; return; }
                m->buf[m->n_buf++] = id;
                break;
            }
            if (e->type == GEL_END) {
                if (!parent) {
                    if (buf_reserve(m, 1)) { m->over = 1; return; }
                    m->buf[m->n_buf++] = 0;
                    break;
                }
                pos = m->nodes[parent].pos;
                parent = m->nodes[parent].parent;
                continue;
            }
            /* a reference: the return point (none in tail position) */
            uint32_t ret = g->el[pos + 1].type == GEL_END ? parent : intern(m, pos + 1, parent);
            if (m->over) return;
            const gram_rule *r = &g->rules[e->a];
            if (nw + r->n_alt > m->cap_work / 2) {
                uint32_t nc = m->cap_work ? m->cap_work : 256;
                while (nc / 2 < nw + r->n_alt) nc *= 2;
                uint32_t *q = realloc(m->work, (size_t)nc * sizeof *q);
                if (!q) { m->over = 1; return; }
                m->work = q; m->cap_work = nc;
            }
            for (uint32_t a = r->n_alt; a-- > 0;) {
                m->work[2 * nw] = g->alt_start[r->alt_off + a];
                m->work[2 * nw + 1] = ret;
                nw++;
            }
            break;
        }
    }
}

static int char_ok(const gram *g, const gram_el *e, uint32_t c)
{
    int in = 0;
    for (uint32_t i = 0; i < e->b; i++)
        if (c >= g->ranges[e->a + i].lo && c <= g->ranges[e->a + i].hi) { in = 1; break; }
    /* token symbols (past U+10FFFF) match only a set that names them */
    if (c > 0x10FFFF && e->neg) return 0;
    return in != e->neg;
}

/* Could some code point in [lo, hi] match e? (negated sets: unless one
 * range covers it all; a union covering it is let through, and refused a
 * byte later.) */
static int char_may(const gram *g, const gram_el *e, uint32_t lo, uint32_t hi)
{
    for (uint32_t i = 0; i < e->b; i++) {
        const gram_range *r = &g->ranges[e->a + i];
        if (!e->neg && r->lo <= hi && r->hi >= lo) return 1;
        if (e->neg && r->lo <= lo && r->hi >= hi) return 0;
    }
    return e->neg;
}

/* Sorts and dedups buf[off..n_buf), checks the bound. */
static int finish_set(gram_match *m, uint32_t off)
{
    uint32_t n = m->n_buf - off;
    if (n > 1) {
        qsort(m->buf + off, n, sizeof *m->buf, cmp_u32);
        uint32_t k = 1;
        for (uint32_t i = 1; i < n; i++) if (m->buf[off + i] != m->buf[off + k - 1]) m->buf[off + k++] = m->buf[off + i];
        m->n_buf = off + k;
    }
    if (m->n_buf - off > GRAM_MAX_STACKS) m->over = 1;
    return m->over ? -1 : 0;
}

/* The state after code point c from the set at buf[in..in+n): appended at
 * the end of buf. Returns its size (0: refused), or -1 past a bound. */
static int64_t step(gram_match *m, uint32_t in, uint32_t n, uint32_t c)
{
    const gram *g = m->g;
    uint32_t off = m->n_buf;
    m->n_expand = 0;
    uint32_t nw = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = m->buf[in + i];
        if (!id) continue;
        const gnode *nd = &m->nodes[id];
        if (!char_ok(g, &g->el[nd->pos], c)) continue;
        if (nw + 1 > m->cap_work / 2) {
            uint32_t nc = m->cap_work ? m->cap_work * 2 : 256;
            uint32_t *q = realloc(m->work, (size_t)nc * sizeof *q);
            if (!q) { m->over = 1; return -1; }
            m->work = q; m->cap_work = nc;
        }
        m->work[2 * nw] = nd->pos + 1;
        m->work[2 * nw + 1] = nd->parent;
        nw++;
        /* expand now so the worklist stays small */
        expand_all(m, nw);
        nw = 0;
        if (m->over) return -1;
    }
    if (finish_set(m, off)) return -1;
    return m->n_buf - off;
}

static void memo_clear(gram_match *m)
{
    if (m->memo) memset(m->memo, 0, (size_t)m->memo_cap * sizeof *m->memo);
    m->n_memo = 0;
    m->n_marena = 0;
}

static uint64_t set_hash(const uint32_t *s, uint32_t n, uint32_t c)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ c;
    for (uint32_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001B3ull;
    /* a full mix: the slot is taken from the bits (the loop alone leaves
     * most of them alike for small ids) */
    h ^= h >> 33; h *= 0xFF51AFD7ED558CCDull; h ^= h >> 33; h *= 0xC4CEB9FE1A85EC53ull; h ^= h >> 33;
    return h | 1;    /* 0 marks a free slot */
}

/* Room for one more entry and `need` arena words by doubling the table
 * (its entries placed again by their hashes) or the arena; -1 where that
 * would pass the caps or memory ran out (the caller clears instead). */
static int memo_grow(gram_match *m, uint32_t need)
{
    uint32_t cap = m->memo_cap, acap = m->cap_marena;
    if (m->n_memo * 2 >= cap) cap *= 2;
    while ((uint64_t)m->n_marena + need > acap && acap <= MEMO_ARENA) acap *= 2;
    if (cap > MEMO_CAP || acap > MEMO_ARENA) return -1;
    if (acap != m->cap_marena) {
        uint32_t *a = realloc(m->marena, (size_t)acap * sizeof *a);
        if (!a) return -1;
        m->marena = a;
        m->cap_marena = acap;
    }
    if (cap != m->memo_cap) {
        struct memo *t = calloc(cap, sizeof *t);
        if (!t) return -1;
        for (uint32_t i = 0; i < m->memo_cap; i++) {
            if (!m->memo[i].h) continue;
            uint32_t s = (uint32_t)(m->memo[i].h >> 1) & (cap - 1);
            while (t[s].h) s = (s + 1) & (cap - 1);
            t[s] = m->memo[i];
        }
        free(m->memo);
        m->memo = t;
        m->memo_cap = cap;
    }
    return 0;
}

/* step() through the memo. */
static int64_t step_memo(gram_match *m, uint32_t in, uint32_t n, uint32_t c)
{
    if (!m->memo) {
        m->memo = calloc(MEMO_MIN, sizeof *m->memo);
        m->marena = malloc(MEMO_ARENA_MIN * sizeof *m->marena);
        if (!m->memo || !m->marena) { free(m->memo); free(m->marena); m->memo = NULL; m->marena = NULL; return step(m, in, n, c); }
        m->memo_cap = MEMO_MIN; m->cap_marena = MEMO_ARENA_MIN;
    }
    uint64_t h = set_hash(m->buf + in, n, c);
    uint32_t slot = (uint32_t)(h >> 1) & (m->memo_cap - 1);
    while (m->memo[slot].h) {
        struct memo *e = &m->memo[slot];
        if (e->h == h && e->cp == c && e->in_n == n && memcmp(m->marena + e->in_off, m->buf + in, n * sizeof *m->buf) == 0) {
            if (buf_reserve(m, e->out_n)) { m->over = 1; return -1; }
            memcpy(m->buf + m->n_buf, m->marena + e->out_off, e->out_n * sizeof *m->buf);
            m->n_buf += e->out_n;
            return e->out_n;
        }
        slot = (slot + 1) & (m->memo_cap - 1);
    }
    int64_t k = step(m, in, n, c);
    if (k < 0) return k;
    if (m->n_memo * 2 >= m->memo_cap || m->n_marena + n + (uint32_t)k > m->cap_marena) {
        if (memo_grow(m, n + (uint32_t)k) < 0) memo_clear(m);
        slot = (uint32_t)(h >> 1) & (m->memo_cap - 1);
        while (m->memo[slot].h) slot = (slot + 1) & (m->memo_cap - 1);
    }
    struct memo *e = &m->memo[slot];
    e->h = h; e->cp = c;
    e->in_off = m->n_marena; e->in_n = n;
    memcpy(m->marena + m->n_marena, m->buf + in, n * sizeof *m->buf);
    m->n_marena += n;
    e->out_off = m->n_marena; e->out_n = (uint32_t)k;
    memcpy(m->marena + m->n_marena, m->buf + m->n_buf - k, (size_t)k * sizeof *m->buf);
    m->n_marena += (uint32_t)k;
    m->n_memo++;
    return k;
}

static int set_may(gram_match *m, uint32_t in, uint32_t n, uint32_t lo, uint32_t hi)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = m->buf[in + i];
        if (id && char_may(m->g, &m->g->el[m->nodes[id].pos], lo, hi)) return 1;
    }
    return 0;
}

/* One byte from a state (the set at buf[in..in+n) and a partial code point
 * cp, left) into a new state out_in, out_n (possibly the same set).
 * 1 ok, 0 refused, -1 bound. */
static int step_byte(gram_match *m, uint32_t in, uint32_t n, uint32_t *cp, uint32_t *left,
                     uint8_t b, uint32_t *out_in, uint32_t *out_n)
{
    /* *left: bytes still to come (low 4 bits) and the sequence's length
     * (above), so overlong forms, surrogates and code points past U+10FFFF
     * are refused as UTF-8 is */
    static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    uint32_t c;
    if (*left) {
        uint32_t rem = *left & 15, len = *left >> 4;
        if ((b & 0xC0) != 0x80) return 0;
        c = (*cp << 6) | (b & 0x3F);
        rem--;
        uint32_t sh = 6 * rem, lo = c << sh, hi = (c << sh) | ((1u << sh) - 1);
        if (lo < min_cp[len]) lo = min_cp[len];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return 0;
        if (rem) {
            if (!set_may(m, in, n, lo, hi)) return 0;
            *cp = c; *left = len << 4 | rem; *out_in = in; *out_n = n;
            return 1;
        }
        *left = 0;
    } else if (b < 0x80) {
        c = b;
    } else {
        uint32_t l;
        if (b >= 0xC2 && b <= 0xDF) { l = 1; c = b & 0x1F; }
        else if (b >= 0xE0 && b <= 0xEF) { l = 2; c = b & 0x0F; }
        else if (b >= 0xF0 && b <= 0xF4) { l = 3; c = b & 0x07; }
        else return 0;
        uint32_t sh = 6 * l, lo = c << sh, hi = (c << sh) | ((1u << sh) - 1);
        if (lo < min_cp[l + 1]) lo = min_cp[l + 1];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi || !set_may(m, in, n, lo, hi)) return 0;
        *cp = c; *left = (l + 1) << 4 | l; *out_in = in; *out_n = n;
        return 1;
    }
    *cp = 0;
    int64_t k = step_memo(m, in, n, c);
    if (k < 0) return -1;
    if (k == 0) return 0;
    *out_in = m->n_buf - (uint32_t)k; *out_n = (uint32_t)k;
    return 1;
}

static void cache_clear(gram_match *m)
{
    for (int i = 0; i < CACHE_N; i++) {
        free(m->cache[i].set); free(m->cache[i].mask);
        memset(&m->cache[i], 0, sizeof m->cache[i]);
    }
}

/* Keeps only the nodes the committed state uses (the pool grows with every
 * mask walk). */
static int compact(gram_match *m)
{
    uint32_t *map = calloc((size_t)m->n_nodes + 1, sizeof *map);
    gnode *old = malloc(((size_t)m->n_nodes + 1) * sizeof *old);
    uint32_t *chain = malloc(((size_t)m->n_nodes + 1) * sizeof *chain);
    if (!map || !old || !chain) { free(map); free(old); free(chain); return -1; }
    memcpy(old, m->nodes, ((size_t)m->n_nodes + 1) * sizeof *old);
    m->n_nodes = 0;
    memset(m->ht, 0, (size_t)m->ht_cap * sizeof *m->ht);
    for (uint32_t i = 0; i < m->n_cur; i++) {
        uint32_t id = m->cur[i], nc = 0;
        while (id && !map[id]) { chain[nc++] = id; id = old[id].parent; }
        while (nc--) {
            uint32_t o = chain[nc];
            map[o] = intern(m, old[o].pos, old[o].parent ? map[old[o].parent] : 0);
        }
        m->cur[i] = m->cur[i] ? map[m->cur[i]] : 0;
    }
    free(map); free(old); free(chain);
    qsort(m->cur, m->n_cur, sizeof *m->cur, cmp_u32);
    cache_clear(m);
    memo_clear(m);
    return m->over ? -1 : 0;
}

int gram_match_new(gram_match **out, const gram *g, char *err, size_t errlen)
{
    *out = NULL;
    gram_match *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "out of memory"); return -1; }
    m->g = g;
    m->cap_nodes = 1024;
    m->nodes = malloc(m->cap_nodes * sizeof *m->nodes);
    m->ht_cap = 4096;
    m->ht = calloc(m->ht_cap, sizeof *m->ht);
    if (!m->nodes || !m->ht || buf_reserve(m, 64)) { gram_match_free(m); snprintf(err, errlen, "out of memory"); return -1; }
    const gram_rule *r = &g->rules[g->root];
    m->work = malloc(2 * sizeof *m->work * (r->n_alt + 1));
    m->cap_work = 2 * (r->n_alt + 1);
    if (!m->work) { gram_match_free(m); snprintf(err, errlen, "out of memory"); return -1; }
    for (uint32_t a = 0; a < r->n_alt; a++) { m->work[2 * a] = g->alt_start[r->alt_off + a]; m->work[2 * a + 1] = 0; }
    m->n_buf = 0;
    expand_all(m, r->n_alt);
    if (m->over || finish_set(m, 0)) {
        snprintf(err, errlen, "grammar: the start state passes the bounds (%d stacks, %d expansions)", GRAM_MAX_STACKS, GRAM_MAX_EXPAND);
        gram_match_free(m); return -1;
    }
    m->cap_cur = m->n_buf + 16;
    m->cur = malloc(m->cap_cur * sizeof *m->cur);
    if (!m->cur) { gram_match_free(m); snprintf(err, errlen, "out of memory"); return -1; }
    memcpy(m->cur, m->buf, m->n_buf * sizeof *m->cur);
    m->n_cur = m->n_buf;
    *out = m;
    return 0;
}

void gram_match_free(gram_match *m)
{
    if (!m) return;
    cache_clear(m);
    free(m->memo); free(m->marena);
    free(m->nodes); free(m->ht); free(m->cur); free(m->buf); free(m->work);
    free(m);
}

static void bound_err(char *err, size_t errlen)
{
    snprintf(err, errlen, "grammar: a step passed the bounds (%d stacks, %d expansions); the grammar is too ambiguous",
             GRAM_MAX_STACKS, GRAM_MAX_EXPAND);
}

static int advance(gram_match *m, const char *bytes, size_t n, int commit, char *err, size_t errlen)
{
    if (m->over) { bound_err(err, errlen); return -1; }
    m->n_buf = 0;
    if (buf_reserve(m, m->n_cur)) { m->over = 1; bound_err(err, errlen); return -1; }
    memcpy(m->buf, m->cur, m->n_cur * sizeof *m->buf);
    m->n_buf = m->n_cur;
    uint32_t in = 0, cnt = m->n_cur, cp = m->cp, left = m->left;
    for (size_t i = 0; i < n; i++) {
        int r = step_byte(m, in, cnt, &cp, &left, (uint8_t)bytes[i], &in, &cnt);
        if (r < 0) { bound_err(err, errlen); return -1; }
        if (r == 0) return 0;
        /* drop what came before this state */
        if (in > 0) { memmove(m->buf, m->buf + in, cnt * sizeof *m->buf); in = 0; }
        m->n_buf = cnt;
    }
    if (!commit) return 1;
    if (cnt > m->cap_cur) {
        uint32_t *q = realloc(m->cur, (size_t)(cnt + 16) * sizeof *q);
        if (!q) { m->over = 1; bound_err(err, errlen); return -1; }
        m->cur = q; m->cap_cur = cnt + 16;
    }
    memcpy(m->cur, m->buf + in, cnt * sizeof *m->cur);
    m->n_cur = cnt; m->cp = cp; m->left = left;
    if (m->n_nodes > (1u << 20) && compact(m)) { bound_err(err, errlen); return -1; }
    return 1;
}

/* A special token's step: the new state's size at the end of buf (0:
 * refused), -1 past a bound. */
static int64_t token_step(gram_match *m, int32_t id, char *err, size_t errlen)
{
    if (m->over) { bound_err(err, errlen); return -1; }
    if (m->left || id < 0 || (uint32_t)id > GRAM_MAX_TOKEN) return 0;
    m->n_buf = 0;
    if (buf_reserve(m, m->n_cur)) { m->over = 1; bound_err(err, errlen); return -1; }
    memcpy(m->buf, m->cur, m->n_cur * sizeof *m->buf);
    m->n_buf = m->n_cur;
    int64_t k = step_memo(m, 0, m->n_cur, GRAM_TOKEN_CP + (uint32_t)id);
    if (k < 0) bound_err(err, errlen);
    return k;
}

int gram_match_check_token(gram_match *m, int32_t id, char *err, size_t errlen)
{
    int64_t k = token_step(m, id, err, errlen);
    return k < 0 ? -1 : k > 0;
}

int gram_match_accept_token(gram_match *m, int32_t id, char *err, size_t errlen)
{
    int64_t k = token_step(m, id, err, errlen);
    if (k <= 0) return k < 0 ? -1 : 0;
    if ((uint32_t)k > m->cap_cur) {
        uint32_t *q = realloc(m->cur, (size_t)(k + 16) * sizeof *q);
        if (!q) { m->over = 1; bound_err(err, errlen); return -1; }
        m->cur = q; m->cap_cur = (uint32_t)k + 16;
    }
    memcpy(m->cur, m->buf + m->n_buf - k, (size_t)k * sizeof *m->cur);
    m->n_cur = (uint32_t)k;
    return 1;
}

int gram_match_accept(gram_match *m, const char *bytes, size_t n, char *err, size_t errlen)
{
    return advance(m, bytes, n, 1, err, errlen);
}

int gram_match_check(gram_match *m, const char *bytes, size_t n, char *err, size_t errlen)
{
    return advance(m, bytes, n, 0, err, errlen);
}

int gram_match_can_end(const gram_match *m)
{
    return !m->left && m->n_cur && m->cur[0] == 0;
}

int gram_match_must_end(const gram_match *m)
{
    return !m->left && m->n_cur == 1 && m->cur[0] == 0;
}

/* ---- vocabulary trie ---- */
typedef struct { const uint8_t *s; size_t n; int32_t id; } vtok;

static int vtok_cmp(const void *a, const void *b)
{
    const vtok *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

gram_vocab *gram_vocab_new(const char *const *pieces, const size_t *lens, int32_t n)
{
    gram_vocab *v = calloc(1, sizeof *v);
    vtok *t = malloc(sizeof *t * (size_t)(n > 0 ? n : 1));
    if (!v || !t) { free(v); free(t); return NULL; }
    v->n_vocab = n;
    uint32_t nt = 0;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!pieces[i] || !lens[i] || lens[i] > GRAM_MAX_PIECE) continue;
        t[nt++] = (vtok){ (const uint8_t *)pieces[i], lens[i], i };
        total += lens[i];
    }
    qsort(t, nt, sizeof *t, vtok_cmp);
    size_t cap = total + 1;
    v->byte = malloc(cap); v->depth = malloc(cap * sizeof *v->depth);
    v->end = malloc(cap * sizeof *v->end); v->tok_off = malloc(cap * sizeof *v->tok_off);
    v->tok_n = calloc(cap, sizeof *v->tok_n); v->toks = malloc(sizeof *v->toks * (nt + 1));
    uint32_t *path = malloc(sizeof *path * (GRAM_MAX_PIECE + 1));
    if (!v->byte || !v->depth || !v->end || !v->tok_off || !v->tok_n || !v->toks || !path) {
        free(path); free(t); gram_vocab_free(v); return NULL;
    }
    uint32_t nn = 0, pd = 0, ntok = 0;   /* pd: depth of the current path */
    const uint8_t *prev = NULL; size_t prevn = 0;
    for (uint32_t k = 0; k < nt; k++) {
        size_t l = 0;
        if (prev) while (l < prevn && l < t[k].n && l < pd && prev[l] == t[k].s[l]) l++;
        while (pd > l) v->end[path[--pd]] = nn;
        for (size_t d = pd; d < t[k].n; d++) {
            v->byte[nn] = t[k].s[d];
            v->depth[nn] = (uint16_t)(d + 1);
            if (d + 1 > v->max_depth) v->max_depth = (uint32_t)(d + 1);
            v->tok_n[nn] = 0;
            v->tok_off[nn] = 0;
            path[pd++] = nn++;
        }
        uint32_t node = path[pd - 1];
        if (!v->tok_n[node]) v->tok_off[node] = ntok;
        v->tok_n[node]++;
        v->toks[ntok++] = t[k].id;
        prev = t[k].s; prevn = t[k].n;
    }
    while (pd) v->end[path[--pd]] = nn;
    v->n_nodes = nn;
    free(path); free(t);
    return v;
}

void gram_vocab_free(gram_vocab *v)
{
    if (!v) return;
    free(v->byte); free(v->depth); free(v->end); free(v->tok_off); free(v->tok_n); free(v->toks);
    free(v->special);
    free(v);
}

int32_t gram_vocab_size(const gram_vocab *v) { return v->n_vocab; }

int gram_vocab_set_special(gram_vocab *v, const int32_t *ids, uint32_t n)
{
    int32_t *q = malloc(sizeof *q * (n ? n : 1));
    if (!q) return -1;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < v->n_vocab && (uint32_t)ids[i] <= GRAM_MAX_TOKEN) q[k++] = ids[i];
    free(v->special);
    v->special = q; v->n_special = k;
    return 0;
}

/* The cache slot holding the current state's mask, or -1. */
static int cache_find(const gram_match *m, const gram_vocab *v)
{
    for (int i = 0; i < CACHE_N; i++) {
        const mcache *c = &m->cache[i];
        if (c->mask && c->v == v && c->n == m->n_cur && c->cp == m->cp && c->left == m->left &&
            memcmp(c->set, m->cur, m->n_cur * sizeof *m->cur) == 0)
            return i;
    }
    return -1;
}

int gram_match_mask_cached(const gram_match *m, const gram_vocab *v)
{
    return m->over || gram_match_must_end(m) || cache_find(m, v) >= 0;
}

int64_t gram_match_mask(gram_match *m, const gram_vocab *v, uint32_t *mask, char *err, size_t errlen)
{
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (m->over) { bound_err(err, errlen); return -1; }
    /* a state seen before: its mask again */
    int hit = cache_find(m, v);
    if (hit >= 0) {
        mcache *c = &m->cache[hit];
        memcpy(mask, c->mask, words * sizeof *mask);
        c->used = ++m->tick;
        return c->count;
    }
    memset(mask, 0, words * sizeof *mask);
    uint32_t maxd = v->max_depth;
    uint32_t *lin = malloc(sizeof *lin * 5 * (maxd + 1));
    if (!lin) { snprintf(err, errlen, "out of memory"); return -1; }
    uint32_t *lnum = lin + (maxd + 1), *lcp = lnum + (maxd + 1), *lleft = lcp + (maxd + 1);
    uint32_t *ltop = lleft + (maxd + 1);   /* past every level's set up to this one */
    m->n_buf = 0;
    if (buf_reserve(m, m->n_cur)) { free(lin); snprintf(err, errlen, "out of memory"); return -1; }
    memcpy(m->buf, m->cur, m->n_cur * sizeof *m->buf);
    lin[0] = 0; lnum[0] = m->n_cur; lcp[0] = m->cp; lleft[0] = m->left; ltop[0] = m->n_cur;
    int64_t count = 0;
    uint32_t i = 0;
    while (i < v->n_nodes) {
        uint32_t d = v->depth[i];
        /* the buffer's top is past every live level below d */
        m->n_buf = ltop[d - 1];
        uint32_t cp = lcp[d - 1], left = lleft[d - 1], oin, on;
        int r = step_byte(m, lin[d - 1], lnum[d - 1], &cp, &left, v->byte[i], &oin, &on);
        if (r < 0) { free(lin); bound_err(err, errlen); return -1; }
        if (r == 0) { i = v->end[i]; continue; }
        lin[d] = oin; lnum[d] = on; lcp[d] = cp; lleft[d] = left;
        ltop[d] = oin + on > ltop[d - 1] ? oin + on : ltop[d - 1];
        for (uint32_t k = 0; k < v->tok_n[i]; k++) {
            int32_t id = v->toks[v->tok_off[i] + k];
            mask[id >> 5] |= 1u << (id & 31);
            count++;
        }
        i++;
    }
    free(lin);
    /* special tokens, as symbols: only grammars that name tokens can take them */
    if (m->g->has_tokens && !m->left) {
        for (uint32_t k = 0; k < v->n_special; k++) {
            int32_t id = v->special[k];
            m->n_buf = 0;
            if (buf_reserve(m, m->n_cur)) { snprintf(err, errlen, "out of memory"); return -1; }
            memcpy(m->buf, m->cur, m->n_cur * sizeof *m->buf);
            m->n_buf = m->n_cur;
            int64_t r = step_memo(m, 0, m->n_cur, GRAM_TOKEN_CP + (uint32_t)id);
            if (r < 0) { bound_err(err, errlen); return -1; }
            if (r > 0) { mask[id >> 5] |= 1u << (id & 31); count++; }
        }
    }
    /* remember it (least recently used slot) */
    int slot = 0;
    for (int k = 1; k < CACHE_N; k++) if (m->cache[k].used < m->cache[slot].used) slot = k;
    mcache *c = &m->cache[slot];
    free(c->set); free(c->mask);
    c->set = malloc((m->n_cur + 1) * sizeof *c->set);
    c->mask = malloc(words * sizeof *c->mask);
    if (c->set && c->mask) {
        memcpy(c->set, m->cur, m->n_cur * sizeof *c->set);
        memcpy(c->mask, mask, words * sizeof *mask);
        c->n = m->n_cur; c->cp = m->cp; c->left = m->left; c->v = v; c->count = count;
        c->used = ++m->tick;
    } else { free(c->set); free(c->mask); memset(c, 0, sizeof *c); }
    return count;
}
