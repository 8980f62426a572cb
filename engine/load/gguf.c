/* gguf.c — GGUF v2/v3 reader. Everything read from the file is checked
 * against the bytes that remain before it is used; after gguf_open returns,
 * the tables in struct gguf are trustworthy. */
#include "engine/load/gguf.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GGUF_MAX_KV       (1u << 20)
#define GGUF_MAX_TENSORS  (1u << 20)
#define GGUF_MAX_KEY      65535
#define GGUF_MAX_DIMS     4

typedef struct rd {
    const uint8_t *p, *end, *base;
    char *err; size_t errlen;
    const char *path;
} rd;

static int rd_fail(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rd_fail(rd *r, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(r->err, r->errlen, "%s: %s (at byte %zu)", r->path, msg, (size_t)(r->p - r->base));
}

static int rd_need(rd *r, uint64_t n, const char *what)
{
    if ((uint64_t)(r->end - r->p) < n)
        return rd_fail(r, "truncated file: %s needs %llu bytes, %zu left", what,
                       (unsigned long long)n, (size_t)(r->end - r->p));
    return 0;
}

static int rd_u32(rd *r, uint32_t *v, const char *what)
{
    if (rd_need(r, 4, what)) return -1;
    memcpy(v, r->p, 4); r->p += 4;
    return 0;
}

static int rd_u64(rd *r, uint64_t *v, const char *what)
{
    if (rd_need(r, 8, what)) return -1;
    memcpy(v, r->p, 8); r->p += 8;
    return 0;
}

static int rd_str(rd *r, gguf_str *s, uint64_t max, const char *what)
{
    uint64_t n;
    if (rd_u64(r, &n, what)) return -1;
    if (n > max) return rd_fail(r, "%s length %llu exceeds limit %llu", what,
                                (unsigned long long)n, (unsigned long long)max);
    if (rd_need(r, n, what)) return -1;
    s->s = (const char *)r->p; s->n = n; r->p += n;
    return 0;
}

/* Block geometry of the ggml tensor types this reader can size. Tensors of
 * other types are kept with nbytes = 0; the model loader rejects them by name. */
static int ggml_geom(uint32_t type, uint32_t *blck, uint32_t *bsize)
{
    static const uint16_t g[][2] = {
        [0] = {1, 4}, [1] = {1, 2}, [2] = {32, 18}, [3] = {32, 20}, [6] = {32, 22},
        [7] = {32, 24}, [8] = {32, 34}, [9] = {32, 36}, [10] = {256, 84}, [11] = {256, 110},
        [12] = {256, 144}, [13] = {256, 176}, [14] = {256, 210}, [15] = {256, 292},
        [16] = {256, 66}, [17] = {256, 74}, [18] = {256, 98}, [19] = {256, 50}, [20] = {32, 18},
        [21] = {256, 110}, [22] = {256, 82}, [23] = {256, 136}, [24] = {1, 1}, [25] = {1, 2}, [26] = {1, 4}, [27] = {1, 8}, [28] = {1, 8}, [30] = {1, 2},
        [39] = {32, 17},
    };
    if (type >= sizeof g / sizeof g[0] || g[type][0] == 0) return -1;
    *blck = g[type][0]; *bsize = g[type][1];
    return 0;
}

static size_t vtype_size(gguf_vtype t)
{
    switch (t) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

static void scalar_read(gguf_kv *kv, const uint8_t *p)
{
    switch (kv->type) {
    case GGUF_T_UINT8:  kv->v.u = p[0]; break;
    case GGUF_T_BOOL:   kv->v.u = p[0] != 0; break;
    case GGUF_T_INT8:   kv->v.i = (int8_t)p[0]; break;
    case GGUF_T_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case GGUF_T_INT16:  { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case GGUF_T_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case GGUF_T_INT32:  { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case GGUF_T_FLOAT32:{ float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case GGUF_T_UINT64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case GGUF_T_INT64:  { int64_t x; memcpy(&x, p, 8); kv->v.i = x; break; }
    case GGUF_T_FLOAT64:{ double x; memcpy(&x, p, 8); kv->v.f = x; break; }
    default: break;
    }
}

static int read_kv(rd *r, gguf_kv *kv)
{
    uint32_t t;
    if (rd_str(r, &kv->key, GGUF_MAX_KEY, "metadata key")) return -1;
    if (rd_u32(r, &t, "metadata value type")) return -1;
    if (t > GGUF_T_FLOAT64)
        return rd_fail(r, "key '%.*s': unknown value type %u", (int)kv->key.n, kv->key.s, t);
    kv->type = (gguf_vtype)t;
    if (t == GGUF_T_STRING)
        return rd_str(r, &kv->str, (uint64_t)(r->end - r->p), "metadata string");
    if (t != GGUF_T_ARRAY) {
        size_t sz = vtype_size(kv->type);
        if (rd_need(r, sz, "metadata value")) return -1;
        scalar_read(kv, r->p);
        r->p += sz;
        return 0;
    }
    uint32_t at;
    if (rd_u32(r, &at, "array element type")) return -1;
    if (at > GGUF_T_FLOAT64 || at == GGUF_T_ARRAY)
        return rd_fail(r, "key '%.*s': unsupported array element type %u", (int)kv->key.n, kv->key.s, at);
    kv->arr_type = (gguf_vtype)at;
    if (rd_u64(r, &kv->arr_n, "array length")) return -1;
    kv->arr_data = r->p;
    if (at == GGUF_T_STRING) {
        /* each element takes at least its 8-byte length */
        if (kv->arr_n > (uint64_t)(r->end - r->p) / 8)
            return rd_fail(r, "key '%.*s': array of %llu strings cannot fit in the file",
                           (int)kv->key.n, kv->key.s, (unsigned long long)kv->arr_n);
        kv->arr_off = malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *kv->arr_off);
        if (!kv->arr_off) return rd_fail(r, "out of memory");
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            gguf_str s;
            kv->arr_off[i] = (uint64_t)(r->p - kv->arr_data);
            if (rd_str(r, &s, (uint64_t)(r->end - r->p), "array string")) return -1;
        }
        return 0;
    }
    size_t sz = vtype_size(kv->arr_type);
    if (kv->arr_n > (uint64_t)(r->end - r->p) / sz)
        return rd_fail(r, "key '%.*s': array of %llu elements runs past the end of the file",
                       (int)kv->key.n, kv->key.s, (unsigned long long)kv->arr_n);
    r->p += kv->arr_n * sz;
    return 0;
}

static int str_cmp(gguf_str a, gguf_str b)
{
    int c = memcmp(a.s, b.s, a.n < b.n ? (size_t)a.n : (size_t)b.n);
    return c ? c : a.n < b.n ? -1 : a.n > b.n;
}

static int kv_cmp(const void *a, const void *b)
{
    return str_cmp((*(const gguf_kv *const *)a)->key, (*(const gguf_kv *const *)b)->key);
}

static int tname_cmp(const void *a, const void *b)
{
    return str_cmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

static int tdata_cmp(const void *a, const void *b)
{
    const uint8_t *x = (*(const gguf_tensor *const *)a)->data, *y = (*(const gguf_tensor *const *)b)->data;
    return x < y ? -1 : x > y;
}

/* No metadata key twice, no tensor name twice, no two tensors sharing a
 * byte (sorting: the counts may be a million). */
static int unique_and_apart(gguf *g, char *err, size_t errlen)
{
    uint64_t n = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    const void **ix = malloc((size_t)(n ? n : 1) * sizeof *ix);
    if (!ix) { snprintf(err, errlen, "%s: out of memory", g->path); return -1; }
    int rc = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) ix[i] = &g->kv[i];
    qsort(ix, (size_t)g->n_kv, sizeof *ix, kv_cmp);
    for (uint64_t i = 1; i < g->n_kv && !rc; i++) {
        const gguf_kv *a = ix[i - 1], *b = ix[i];
        if (!str_cmp(a->key, b->key)) {
            snprintf(err, errlen, "%s: metadata key '%.*s' appears twice (expected each key once)", g->path,
                     (int)(a->key.n > 200 ? 200 : a->key.n), a->key.s);
            rc = -1;
        }
    }
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) ix[i] = &g->tensors[i];
    if (!rc) qsort(ix, (size_t)g->n_tensors, sizeof *ix, tname_cmp);
    for (uint64_t i = 1; i < g->n_tensors && !rc; i++) {
        const gguf_tensor *a = ix[i - 1], *b = ix[i];
        if (!str_cmp(a->name, b->name)) {
            snprintf(err, errlen, "%s: duplicate tensor name '%.*s'", g->path, (int)a->name.n, a->name.s);
            rc = -1;
        }
    }
    if (!rc) qsort(ix, (size_t)g->n_tensors, sizeof *ix, tdata_cmp);
    /* tensors of a type this reader cannot size (nbytes 0) are refused by the loader if used */
    const gguf_tensor *last = NULL;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        const gguf_tensor *t = ix[i];
        if (!t->nbytes) continue;
        if (last && (const uint8_t *)last->data + last->nbytes > (const uint8_t *)t->data) {
            snprintf(err, errlen, "%s: tensors '%.*s' (bytes %llu..%llu) and '%.*s' (from byte %llu) overlap "
                     "(expected each tensor's data apart)", g->path, (int)last->name.n, last->name.s,
                     (unsigned long long)((const uint8_t *)last->data - g->map),
                     (unsigned long long)((const uint8_t *)last->data - g->map + last->nbytes),
                     (int)t->name.n, t->name.s, (unsigned long long)((const uint8_t *)t->data - g->map));
            rc = -1;
        }
        last = t;
    }
    free(ix);
    return rc;
}

void gguf_close(gguf *g)
{
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].arr_off);
    free(g->kv);
    free(g->tensors);
    mf_unmap(&g->mm);
    free((void *)g->path);
    free(g);
}

int gguf_open(gguf **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    gguf *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, errlen, "%s: out of memory", path); return -1; }
    g->path = strdup(path);
    struct stat st;
    int fd = mf_open(path, &st, err, errlen);
    if (fd < 0) goto fail;
    if (st.st_size < 24) {
        snprintf(err, errlen, "%s: file too small for a GGUF header (%lld bytes)", path, (long long)st.st_size);
        close(fd);
        goto fail;
    }
    if (mf_map_fd(&g->mm, fd, &st, path, err, errlen)) goto fail;
    g->size = g->mm.size;
    g->map = g->mm.map;

    rd r = { .p = g->map, .end = g->map + g->size, .base = g->map, .err = err, .errlen = errlen, .path = path };
    if (memcmp(r.p, "GGUF", 4) != 0) {
        snprintf(err, errlen, "%s: not a GGUF file (magic %02x%02x%02x%02x, expected \"GGUF\")",
                 path, r.p[0], r.p[1], r.p[2], r.p[3]);
        goto fail;
    }
    r.p += 4;
    if (rd_u32(&r, &g->version, "version")) goto fail;
    if (g->version != 2 && g->version != 3) {
        snprintf(err, errlen, "%s: GGUF version %u not supported (expected 2 or 3)", path, g->version);
        goto fail;
    }
    if (rd_u64(&r, &g->n_tensors, "tensor count") || rd_u64(&r, &g->n_kv, "metadata count")) goto fail;
    if (g->n_kv > GGUF_MAX_KV || g->n_kv > g->size / 12) {
        rd_fail(&r, "metadata count %llu is implausible", (unsigned long long)g->n_kv);
        goto fail;
    }
    if (g->n_tensors > GGUF_MAX_TENSORS || g->n_tensors > g->size / 24) {
        rd_fail(&r, "tensor count %llu is implausible", (unsigned long long)g->n_tensors);
        goto fail;
    }
    g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
    g->tensors = calloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) { snprintf(err, errlen, "%s: out of memory", path); goto fail; }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (read_kv(&r, &g->kv[i])) goto fail;

    g->alignment = 32;
    const gguf_kv *al = gguf_get(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_T_UINT32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) || al->v.u > 65536) {
            snprintf(err, errlen, "%s: general.alignment must be a power of two uint32", path);
            goto fail;
        }
        g->alignment = al->v.u;
    }

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        if (rd_str(&r, &t->name, 1024, "tensor name")) goto fail;
        if (rd_u32(&r, &t->n_dims, "tensor dims")) goto fail;
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
            rd_fail(&r, "tensor '%.*s': %u dimensions (expected 1..4)", (int)t->name.n, t->name.s, t->n_dims);
            goto fail;
        }
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t v;
            if (rd_u64(&r, &v, "tensor dim")) goto fail;
            if (v == 0 || v > (1ull << 40)) {
                rd_fail(&r, "tensor '%.*s': dimension %u is %llu", (int)t->name.n, t->name.s, d,
                        (unsigned long long)v);
                goto fail;
            }
            t->ne[d] = (int64_t)v;
        }
        if (rd_u32(&r, &t->type, "tensor type")) goto fail;
        uint64_t off;
        if (rd_u64(&r, &off, "tensor offset")) goto fail;
        t->data = (const void *)(uintptr_t)off; /* fixed up below */
    }
    g->data_offset = (uint64_t)(r.p - g->map);
    g->data_offset = (g->data_offset + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors > 0 && g->data_offset > g->size) {
        snprintf(err, errlen, "%s: truncated file: tensor data would start at %llu, file has %zu bytes",
                 path, (unsigned long long)g->data_offset, g->size);
        goto fail;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t off = (uint64_t)(uintptr_t)t->data;
        uint32_t blck = 0, bsize = 0;
        int sized = ggml_geom(t->type, &blck, &bsize) == 0;
        if (sized && t->ne[0] % blck != 0) {
            snprintf(err, errlen, "%s: tensor '%.*s': row length %lld is not a multiple of its type's block (%u)",
                     path, (int)t->name.n, t->name.s, (long long)t->ne[0], blck);
            goto fail;
        }
        /* overflow-safe size: each factor < 2^40 and total elements bounded by file size */
        uint64_t rows = 1;
        for (int d = 1; d < 4; d++) {
            if (rows > (1ull << 40) / (uint64_t)t->ne[d]) { rows = UINT64_MAX; break; }
            rows *= (uint64_t)t->ne[d];
        }
        uint64_t rowb = sized ? (uint64_t)t->ne[0] / blck * bsize : 0;
        if (rows == UINT64_MAX || (rowb && rows > UINT64_MAX / rowb)) {
            snprintf(err, errlen, "%s: tensor '%.*s': size overflows", path, (int)t->name.n, t->name.s);
            goto fail;
        }
        t->nbytes = rows * rowb;
        if (off % g->alignment) {
            snprintf(err, errlen, "%s: tensor '%.*s': offset %llu not aligned to %llu", path,
                     (int)t->name.n, t->name.s, (unsigned long long)off, (unsigned long long)g->alignment);
            goto fail;
        }
        if (off > g->size - g->data_offset || t->nbytes > g->size - g->data_offset - off) {
            snprintf(err, errlen, "%s: truncated or corrupt: tensor '%.*s' (%llu bytes at offset %llu) "
                     "runs past the end of the file (%zu bytes)", path, (int)t->name.n, t->name.s,
                     (unsigned long long)t->nbytes, (unsigned long long)(g->data_offset + off), g->size);
            goto fail;
        }
        t->data = g->map + g->data_offset + off;
    }
    if (unique_and_apart(g, err, errlen)) goto fail;
    *out = g;
    return 0;
fail:
    gguf_close(g);
    return -1;
}

static int str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.n == n && memcmp(s.s, c, n) == 0;
}

const gguf_kv *gguf_get(const gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int is_int(gguf_vtype t)
{
    return t == GGUF_T_UINT8 || t == GGUF_T_INT8 || t == GGUF_T_UINT16 || t == GGUF_T_INT16 ||
           t == GGUF_T_UINT32 || t == GGUF_T_INT32 || t == GGUF_T_UINT64 || t == GGUF_T_INT64 ||
           t == GGUF_T_BOOL;
}

static int is_signed(gguf_vtype t)
{
    return t == GGUF_T_INT8 || t == GGUF_T_INT16 || t == GGUF_T_INT32 || t == GGUF_T_INT64;
}

int gguf_get_i64(const gguf *g, const char *key, int64_t *out)
{
    const gguf_kv *kv = gguf_get(g, key);
    if (!kv || !is_int(kv->type)) return -1;
    if (is_signed(kv->type)) *out = kv->v.i;
    else {
        if (kv->v.u > INT64_MAX) return -1;
        *out = (int64_t)kv->v.u;
    }
    return 0;
}

int gguf_get_u64(const gguf *g, const char *key, uint64_t *out)
{
    int64_t v;
    const gguf_kv *kv = gguf_get(g, key);
    if (kv && is_int(kv->type) && !is_signed(kv->type)) { *out = kv->v.u; return 0; }
    if (gguf_get_i64(g, key, &v) || v < 0) return -1;
    *out = (uint64_t)v;
    return 0;
}

int gguf_get_f64(const gguf *g, const char *key, double *out)
{
    const gguf_kv *kv = gguf_get(g, key);
    if (!kv) return -1;
    if (kv->type == GGUF_T_FLOAT32 || kv->type == GGUF_T_FLOAT64) { *out = kv->v.f; return 0; }
    int64_t v;
    if (gguf_get_i64(g, key, &v)) return -1;
    *out = (double)v;
    return 0;
}

int gguf_get_bool(const gguf *g, const char *key, int *out)
{
    const gguf_kv *kv = gguf_get(g, key);
    if (!kv || !is_int(kv->type)) return -1;
    *out = kv->v.u != 0;
    return 0;
}

int gguf_get_str(const gguf *g, const char *key, gguf_str *out)
{
    const gguf_kv *kv = gguf_get(g, key);
    if (!kv || kv->type != GGUF_T_STRING) return -1;
    *out = kv->str;
    return 0;
}

gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i)
{
    gguf_str s = { "", 0 };
    if (kv->type != GGUF_T_ARRAY || kv->arr_type != GGUF_T_STRING || i >= kv->arr_n) return s;
    const uint8_t *p = kv->arr_data + kv->arr_off[i];
    memcpy(&s.n, p, 8);
    s.s = (const char *)p + 8;
    return s;
}

/* Element i of a numeric array, widened into tmp; -1 if there is none. */
static int arr_elem(const gguf_kv *kv, uint64_t i, gguf_kv *tmp)
{
    size_t sz = vtype_size(kv->arr_type);
    if (kv->type != GGUF_T_ARRAY || i >= kv->arr_n || !sz) return -1;
    *tmp = (gguf_kv){ .type = kv->arr_type };
    scalar_read(tmp, kv->arr_data + i * sz);
    return 0;
}

double gguf_arr_f64(const gguf_kv *kv, uint64_t i)
{
    gguf_kv tmp;
    if (arr_elem(kv, i, &tmp)) return 0;
    if (tmp.type == GGUF_T_FLOAT32 || tmp.type == GGUF_T_FLOAT64) return tmp.v.f;
    return is_signed(tmp.type) ? (double)tmp.v.i : (double)tmp.v.u;
}

int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i)
{
    gguf_kv tmp;
    if (arr_elem(kv, i, &tmp)) return 0;
    if (tmp.type == GGUF_T_FLOAT32 || tmp.type == GGUF_T_FLOAT64) {
        /* saturate: NaN and values past int64 are not convertible */
        double f = tmp.v.f;
        if (f != f) return 0;
        if (f >= 9.2233720368547758e18) return INT64_MAX;
        if (f <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)f;
    }
    return is_signed(tmp.type) ? tmp.v.i : (int64_t)tmp.v.u;
}
