/* proto_read.c — the framing reader (a frame is one msgpack map, skimmed
 * before it is parsed so that size and depth limits hold before any
 * allocation) and the request and event decoders. See proto.h. */
#include "common/chatvars.h"
#include "common/err.h"
#include "common/utf8.h"
#include "proto/proto.h"
#include "proto/proto_int.h"
#include "proto/proto_json.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

/* ------------------------------------------------------------------ reader */

#define RD_MIN_CAP   16384u
#define RD_IDLE_CAP  65536u   /* buffers above this are released when idle */

struct proto_reader {
    size_t max_frame;
    char *buf;
    size_t cap, start, end;       /* unread bytes are buf[start..end) */
    /* Skimmer state for the frame at buf[start], kept across calls so a
     * frame arriving in pieces is scanned once. */
    size_t sk_pos;                /* bytes of the frame accepted so far */
    int sk_depth;                 /* open containers */
    uint64_t sk_rem[PROTO_MAX_DEPTH + 1]; /* elements left per level (0 = top slot) */
    uint64_t sk_pending;          /* sum of sk_rem: each needs >= 1 more byte */
    int sk_started;
    /* Decoding. */
    msgpack_zone *zone;
    char *arena;                  /* decoded strings/arrays of the last message */
    size_t arena_cap, arena_len;
    struct arena_chunk *extra;    /* what did not fit in arena (same lifetime) */
    int broken;                   /* after -1 every call returns -1 */
    proto_err broken_code;
    uint64_t claimed;             /* too_large: the least size the frame's headers claimed */
};

static void sk_reset(proto_reader *r)
{
    r->sk_pos = 0;
    r->sk_depth = 0;
    r->sk_rem[0] = 1;
    r->sk_pending = 1;
    r->sk_started = 0;
}

proto_reader *proto_reader_new(size_t max_frame)
{
    proto_reader *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->max_frame = max_frame ? max_frame : PROTO_MAX_FRAME;
    r->zone = msgpack_zone_new(8192);
    if (!r->zone) { free(r); return NULL; }
    sk_reset(r);
    return r;
}

static void arena_drop_extra(proto_reader *r);

void proto_reader_free(proto_reader *r)
{
    if (!r) return;
    free(r->buf);
    free(r->arena);
    arena_drop_extra(r);
    if (r->zone) msgpack_zone_free(r->zone);
    free(r);
}

/* The buffer never needs more than one frame plus a read's worth. */
static size_t rd_cap_max(const proto_reader *r) { return r->max_frame + RD_MIN_CAP; }

static void rd_compact(proto_reader *r)
{
    if (r->start == 0) return;
    if (r->end > r->start) memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start;
    r->start = 0;
}

static int rd_reserve(proto_reader *r, size_t want)
{
    if (r->cap - r->end >= want) return 0;
    rd_compact(r);
    if (r->cap - r->end >= want) return 0;
    size_t need = r->end + want;
    size_t cap = r->cap ? r->cap : RD_MIN_CAP;
    while (cap < need) cap *= 2;
    if (cap > rd_cap_max(r) && need <= rd_cap_max(r)) cap = rd_cap_max(r);
    char *p = realloc(r->buf, cap);
    if (!p) return -1;
    r->buf = p;
    r->cap = cap;
    return 0;
}

char *proto_reader_space(proto_reader *r, size_t *avail)
{
    /* Ask for a read's worth; settle for what fits under the cap. */
    size_t lim = rd_cap_max(r);
    size_t pending = r->end - r->start;
    size_t want = RD_MIN_CAP;
    if (pending + want > lim) want = lim > pending ? lim - pending : 0;
    if (want && r->cap - r->end < want && rd_reserve(r, want) < 0) want = 0;
    if (r->cap - r->end == 0 && r->start) rd_compact(r);
    *avail = r->cap - r->end;
    return r->buf ? r->buf + r->end : NULL;
}

void proto_reader_commit(proto_reader *r, size_t n)
{
    if (n > r->cap - r->end) n = r->cap - r->end;
    r->end += n;
}

int proto_reader_feed(proto_reader *r, const void *data, size_t n)
{
    if (n == 0) return 0;
    /* Pending bytes beyond two frames cannot be a valid stream the caller
     * is draining; refuse instead of growing without bound. */
    if (r->end - r->start + n > 2 * r->max_frame + RD_MIN_CAP) return -1;
    if (rd_reserve(r, n) < 0) return -1;
    memcpy(r->buf + r->end, data, n);
    r->end += n;
    return 0;
}

size_t proto_reader_pending(const proto_reader *r) { return r->end - r->start; }

uint64_t proto_reader_claimed(const proto_reader *r)
{
    return r->broken && r->broken_code == PROTO_E_TOO_LARGE ? r->claimed : 0;
}

static uint64_t rd_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* Scans msgpack headers of the frame at buf[start] without trusting any
 * length. 1: the frame is complete (*len), 0: need more bytes, -1: broken. */
static int rd_skim(proto_reader *r, size_t *len, proto_err *code, char *err, size_t errlen)
{
    const unsigned char *p = (const unsigned char *)r->buf + r->start;
    size_t n = r->end - r->start;
    uint64_t lim = r->max_frame;
    for (;;) {
        if (r->sk_rem[0] == 0 && r->sk_depth == 0) { *len = r->sk_pos; return 1; }
        size_t pos = r->sk_pos;
        if (pos >= n) return 0;
        unsigned b = p[pos];
        int hdr = 1, lenbytes = 0;
        uint64_t payload = 0, count = 0;
        int container = 0;   /* 1 array, 2 map */
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool */
        } else if (b >= 0x80 && b <= 0x8f) { container = 2; count = b & 0x0f; }
        else if (b >= 0x90 && b <= 0x9f) { container = 1; count = b & 0x0f; }
        else if (b >= 0xa0 && b <= 0xbf) { payload = b & 0x1f; }
        else switch (b) {
            case 0xc4: case 0xd9: lenbytes = 1; break;               /* bin8 str8 */
            case 0xc5: case 0xda: lenbytes = 2; break;               /* bin16 str16 */
            case 0xc6: case 0xdb: lenbytes = 4; break;               /* bin32 str32 */
            case 0xca: payload = 4; break;                           /* float32 */
            case 0xcb: payload = 8; break;                           /* float64 */
            case 0xcc: case 0xd0: payload = 1; break;
            case 0xcd: case 0xd1: payload = 2; break;
            case 0xce: case 0xd2: payload = 4; break;
            case 0xcf: case 0xd3: payload = 8; break;
            case 0xdc: container = 1; lenbytes = 2; break;
            case 0xdd: container = 1; lenbytes = 4; break;
            case 0xde: container = 2; lenbytes = 2; break;
            case 0xdf: container = 2; lenbytes = 4; break;
            default:   /* 0xc1, ext types */
                *code = PROTO_E_MALFORMED;
                err_set(err, errlen, "malformed message: byte 0x%02x at offset %zu is not allowed", b, pos);
                return -1;
        }
        if (!r->sk_started && container != 2) {
            *code = PROTO_E_MALFORMED;
            err_set(err, errlen, "malformed message: top level is not a map");
            return -1;
        }
        hdr += lenbytes;
        /* Every element still owed (sk_pending, this one included) needs a byte. */
        r->claimed = (uint64_t)pos + hdr + (r->sk_pending - 1);
        if (r->claimed > lim) goto too_large;
        if (pos + hdr > n) return 0;
        if (lenbytes) {
            uint64_t v = rd_be(p + pos + 1, lenbytes);
            if (container) count = v; else payload = v;
        }
        uint64_t elems = container == 2 ? count * 2 : count;
        r->claimed = (uint64_t)pos + hdr + payload + elems + (r->sk_pending - 1);
        if (r->claimed > lim) goto too_large;
        if (!container && pos + hdr + payload > n) return 0;
        /* Accept this element. */
        r->sk_started = 1;
        r->sk_pos = pos + hdr + (size_t)payload;
        r->sk_rem[r->sk_depth]--;
        r->sk_pending--;
        if (container) {
            if (r->sk_depth + 1 > PROTO_MAX_DEPTH) {
                *code = PROTO_E_TOO_DEEP;
                err_set(err, errlen, "message nests deeper than %d levels", PROTO_MAX_DEPTH);
                return -1;
            }
            r->sk_depth++;
            r->sk_rem[r->sk_depth] = elems;
            r->sk_pending += elems;
        }
        while (r->sk_depth > 0 && r->sk_rem[r->sk_depth] == 0) r->sk_depth--;
    }
too_large:
    *code = PROTO_E_TOO_LARGE;
    err_set(err, errlen, "message larger than %zu bytes", r->max_frame);
    return -1;
}

/* --- arena: decoded strings and arrays of the current message --- */

/* An allocation the arena had no room for: kept until the next message.
 * Sizing the arena from the frame covers every valid request; this keeps
 * an odd but valid message (e.g. an info event with many empty per_client
 * maps, 16 bytes decoded per 1-byte map) from failing as out of memory. */
typedef struct arena_chunk {
    struct arena_chunk *next;
    max_align_t data[];
} arena_chunk;

static void arena_drop_extra(proto_reader *r)
{
    while (r->extra) {
        arena_chunk *c = r->extra;
        r->extra = c->next;
        free(c);
    }
}

static void *arena_alloc(proto_reader *r, size_t n, size_t align)
{
    size_t off = (r->arena_len + align - 1) & ~(align - 1);
    if (off <= r->arena_cap && n <= r->arena_cap - off) {
        r->arena_len = off + n;
        return r->arena + off;
    }
    if (n > SIZE_MAX - sizeof(arena_chunk)) return NULL;
    arena_chunk *c = malloc(sizeof *c + (n ? n : 1));
    if (!c) return NULL;
    c->next = r->extra;
    r->extra = c;
    return c->data;
}

/* Worst case for one valid frame: int32 per one-byte array element, or a
 * 32-byte proto_msg (+ its role's copy) per message of at least 8 bytes
 * (entries are checked before their array is allocated), plus alignment
 * and NUL terminators. */
static int arena_prepare(proto_reader *r, size_t frame_len)
{
    size_t need = frame_len * 5 + 1024;
    r->arena_len = 0;
    arena_drop_extra(r);
    if (r->arena_cap >= need) return 0;
    size_t cap = r->arena_cap ? r->arena_cap : 4096;
    while (cap < need) cap *= 2;
    char *p = malloc(cap);
    if (!p) return -1;
    free(r->arena);
    r->arena = p;
    r->arena_cap = cap;
    return 0;
}

/* --- field decoding --- */

typedef struct dctx {
    proto_reader *r;
    proto_err *code;
    char *err;
    size_t errlen;
    const char *what;   /* message type name, for error texts */
    int events;         /* decoding events: text is passed on unchecked */
} dctx;

static int fail(dctx *d, proto_err c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(dctx *d, proto_err c, const char *fmt, ...)
{
    if (*d->code == PROTO_OK) {
        *d->code = c;
        if (d->err && d->errlen) {
            int k = snprintf(d->err, d->errlen, "%s: ", d->what);
            if (k < 0) k = 0;
            if ((size_t)k < d->errlen) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(d->err + k, d->errlen - (size_t)k, fmt, ap);
                va_end(ap);
            }
        }
    }
    return -1;
}

static int key_is(const msgpack_object *k, const char *s)
{
    size_t n = strlen(s);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, s, n) == 0;
}

/* A number as double; integers exactly when they fit. */
static int obj_number(const msgpack_object *o, double *v)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *v = (double)o->via.u64; return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *v = (double)o->via.i64; return 0;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *v = o->via.f64; return 0;
    default: return -1;
    }
}

/* An integer field: any int encoding, or a float with an integral value. */
static int get_int(dctx *d, const msgpack_object *o, const char *name,
                   int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v = 0;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" out of range [%lld, %lld]", name, (long long)lo, (long long)hi);
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) {
        double f = o->via.f64;
        if (!isfinite(f) || f != floor(f) || f < -9.2e18 || f > 9.2e18)
            return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" must be an integer", name);
        v = (int64_t)f;
    } else {
        return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be an integer", name);
    }
    if (v < lo || v > hi)
        return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" = %lld out of range [%lld, %lld]",
                    name, (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int get_u64(dctx *d, const msgpack_object *o, const char *name, uint64_t *out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) { *out = o->via.u64; return 0; }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" must not be negative", name);
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) {
        double f = o->via.f64;
        if (!isfinite(f) || f != floor(f) || f < 0 || f >= 18446744073709551616.0)
            return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" must be a non-negative integer", name);
        *out = (uint64_t)f;
        return 0;
    }
    return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be a non-negative integer", name);
}

static int get_u32(dctx *d, const msgpack_object *o, const char *name, uint32_t *out)
{
    uint64_t v;
    if (get_u64(d, o, name, &v) < 0) return -1;
    if (v > UINT32_MAX) return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" out of range [0, 4294967295]", name);
    *out = (uint32_t)v;
    return 0;
}

static int get_i32(dctx *d, const msgpack_object *o, const char *name, int64_t lo, int64_t hi, int32_t *out)
{
    int64_t v = 0;
    if (get_int(d, o, name, lo, hi, &v) < 0) return -1;
    *out = (int32_t)v;
    return 0;
}

static int get_double(dctx *d, const msgpack_object *o, const char *name, double *out)
{
    if (obj_number(o, out) < 0) return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be a number", name);
    if (!isfinite(*out)) return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" must be finite", name);
    return 0;
}

static int get_float(dctx *d, const msgpack_object *o, const char *name, double lo, double hi,
                     int lo_open, float *out)
{
    double v = 0;
    if (get_double(d, o, name, &v) < 0) return -1;
    if (v < lo || v > hi || (lo_open && v == lo))
        return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" = %g out of range %c%g, %g]",
                    name, v, lo_open ? '(' : '[', lo, hi);
    *out = (float)v;
    return 0;
}

static int get_bool(dctx *d, const msgpack_object *o, const char *name, int *out)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN) return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be a boolean", name);
    *out = o->via.boolean ? 1 : 0;
    return 0;
}

/* A text field (str; bin accepted), copied NUL-terminated into the arena. */
static int get_str(dctx *d, const msgpack_object *o, const char *name, size_t maxlen,
                   const char **s, size_t *n)
{
    const char *p;
    size_t len;
    if (o->type == MSGPACK_OBJECT_STR) { p = o->via.str.ptr; len = o->via.str.size; }
    else if (o->type == MSGPACK_OBJECT_BIN) { p = o->via.bin.ptr; len = o->via.bin.size; }
    else return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be a string", name);
    if (len > maxlen) return fail(d, PROTO_E_TOO_LARGE, "\"%s\" is %zu bytes, over the limit of %zu", name, len, maxlen);
    if (!d->events && !proto_utf8_valid(p, len)) return fail(d, PROTO_E_INVALID_UTF8, "\"%s\" is not valid UTF-8", name);
    char *c = arena_alloc(d->r, len + 1, 1);
    if (!c) return fail(d, PROTO_E_INTERNAL, "out of memory");
    if (len) memcpy(c, p, len);
    c[len] = 0;
    *s = c;
    *n = len;
    return 0;
}

/* An array of token ids, converted to int32 in the arena. */
static int get_tokens(dctx *d, const msgpack_object *o, const char *name, size_t min_n,
                      const int32_t **t, size_t *n)
{
    if (o->type != MSGPACK_OBJECT_ARRAY) return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be an array of integers", name);
    size_t cnt = o->via.array.size;
    if (cnt > PROTO_MAX_TOKENS) return fail(d, PROTO_E_TOO_LARGE, "\"%s\" has %zu ids, over the limit of %d", name, cnt, PROTO_MAX_TOKENS);
    if (cnt < min_n) return fail(d, PROTO_E_INVALID_VALUE, "\"%s\" must not be empty", name);
    int32_t *out = arena_alloc(d->r, (cnt ? cnt : 1) * sizeof *out, sizeof *out);
    if (!out) return fail(d, PROTO_E_INTERNAL, "out of memory");
    for (size_t i = 0; i < cnt; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        double v;
        if (obj_number(e, &v) < 0)
            return fail(d, PROTO_E_BAD_REQUEST, "\"%s\"[%zu] must be an integer", name, i);
        /* negative, as every negative number: invalid_value; a fraction
         * or an id no vocabulary can hold: invalid_token */
        if (!isfinite(v) || v != floor(v))
            return fail(d, PROTO_E_INVALID_TOKEN, "\"%s\"[%zu] is not a token id (not a whole number)", name, i);
        if (v < 0)
            return fail(d, PROTO_E_INVALID_VALUE, "\"%s\"[%zu] = %.15g must not be negative", name, i, v);
        if (v > INT32_MAX)
            return fail(d, PROTO_E_INVALID_TOKEN, "\"%s\"[%zu] = %.15g is outside any vocabulary", name, i, v);
        out[i] = (int32_t)v;
    }
    *t = out;
    *n = cnt;
    return 0;
}

static int is_nil(const msgpack_object *o) { return o->type == MSGPACK_OBJECT_NIL; }

/* A value passed on as JSON text, copied into the arena (nil values of a
 * map's keys are left out, as absent). */
static int get_json(dctx *d, const msgpack_object *v, const char *const *skip, const char *name,
                    const char **out, size_t *len)
{
    char *js;
    size_t n;
    const char *why;
    int oom;
    if (pj_to_json(v, skip, &js, &n, &why, &oom))
        return fail(d, oom ? PROTO_E_INTERNAL : PROTO_E_BAD_REQUEST, "%s: %s", name, why);
    char *c = arena_alloc(d->r, n + 1, 1);
    if (!c) { free(js); return fail(d, PROTO_E_INTERNAL, "out of memory"); }
    memcpy(c, js, n + 1);
    free(js);
    *out = c;
    *len = n;
    return 0;
}

static const msgpack_object *map_get(const msgpack_object *m, const char *key)
{
    if (m->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i].key, key) && !is_nil(&m->via.map.ptr[i].val)) return &m->via.map.ptr[i].val;
    return NULL;
}

/* An assistant message's "tool_calls": [{"function": {"name": str,
 * "arguments": str or map}, "id": str, ...}, ...] */
static int check_calls(dctx *d, const msgpack_object *v, uint32_t i)
{
    if (v->type != MSGPACK_OBJECT_ARRAY) return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u].tool_calls must be an array of maps", i);
    for (uint32_t c = 0; c < v->via.array.size; c++) {
        const msgpack_object *tc = &v->via.array.ptr[c], *f = map_get(tc, "function");
        if (tc->type != MSGPACK_OBJECT_MAP || !f || f->type != MSGPACK_OBJECT_MAP)
            return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u].tool_calls[%u] must be a map with a \"function\" map", i, c);
        const msgpack_object *nm = map_get(f, "name"), *a = map_get(f, "arguments");
        if (!nm || nm->type != MSGPACK_OBJECT_STR)
            return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u].tool_calls[%u].function.name must be a string", i, c);
        if (a && a->type != MSGPACK_OBJECT_STR && a->type != MSGPACK_OBJECT_MAP)
            return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u].tool_calls[%u].function.arguments must be a string or a map", i, c);
    }
    return 0;
}

/* "tools": [{"type": "function", "function": {"name": str, "description":
 * str, "parameters": map}}, ...]: each schema a map, kept as JSON text. */
static int get_tools(dctx *d, const msgpack_object *v, proto_req *q)
{
    if (v->type != MSGPACK_OBJECT_ARRAY) return fail(d, PROTO_E_BAD_REQUEST, "\"tools\" must be an array of maps");
    for (uint32_t i = 0; i < v->via.array.size; i++) {
        const msgpack_object *t = &v->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_MAP) return fail(d, PROTO_E_BAD_REQUEST, "\"tools\"[%u] must be a map (a function schema)", i);
        const msgpack_object *f = map_get(t, "function");
        if (f && f->type != MSGPACK_OBJECT_MAP) return fail(d, PROTO_E_BAD_REQUEST, "\"tools\"[%u].function must be a map", i);
        const msgpack_object *nm = f ? map_get(f, "name") : NULL, *pa = f ? map_get(f, "parameters") : NULL;
        if (f && (!nm || nm->type != MSGPACK_OBJECT_STR))
            return fail(d, PROTO_E_BAD_REQUEST, "\"tools\"[%u].function.name must be a string", i);
        if (pa && pa->type != MSGPACK_OBJECT_MAP)
            return fail(d, PROTO_E_BAD_REQUEST, "\"tools\"[%u].function.parameters must be a map (a JSON schema object)", i);
    }
    return get_json(d, v, NULL, "\"tools\"", &q->tools, &q->tools_len);
}

/* An array of at most max_n non-empty strings of at most max_len bytes
 * (stop, choice) into s[], lens[], *n. */
static int get_strs(dctx *d, const msgpack_object *v, const char *name, uint32_t max_n, size_t max_len,
                    const char **s, size_t *lens, size_t *n)
{
    if (v->type != MSGPACK_OBJECT_ARRAY) return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be an array of strings", name);
    if (v->via.array.size > max_n)
        return fail(d, PROTO_E_TOO_LARGE, "\"%s\" has %u strings, over the limit of %u", name, v->via.array.size, max_n);
    *n = 0;
    for (uint32_t j = 0; j < v->via.array.size; j++) {
        if (get_str(d, &v->via.array.ptr[j], name, max_len, &s[j], &lens[j])) return -1;
        if (lens[j] == 0) return fail(d, PROTO_E_INVALID_VALUE, "\"%s\"[%u] is empty", name, j);
        *n = j + 1;
    }
    return 0;
}

/* "template_vars": a map of further variables for the chat template; the
 * request's own (messages, tools, add_generation_prompt) are not among them */
static int get_tvars(dctx *d, const msgpack_object *v, proto_req *q)
{
    if (v->type != MSGPACK_OBJECT_MAP) return fail(d, PROTO_E_BAD_REQUEST, "\"template_vars\" must be a map");
    for (uint32_t i = 0; i < v->via.map.size; i++) {
        const msgpack_object *kk = &v->via.map.ptr[i].key;
        if (kk->type != MSGPACK_OBJECT_STR) return fail(d, PROTO_E_BAD_REQUEST, "\"template_vars\" keys must be strings");
        const char *own = chat_own_var(kk->via.str.ptr, kk->via.str.size);
        if (own) return fail(d, PROTO_E_INVALID_VALUE, "\"template_vars\".%s: set by the request itself", own);
    }
    return get_json(d, v, NULL, "\"template_vars\"", &q->template_vars, &q->template_vars_len);
}

/* "tool_choice": "auto", "none", "required", or {"type": "function",
 * "function": {"name": str}} */
static int get_tool_choice(dctx *d, const msgpack_object *v, proto_req *q)
{
    if (v->type == MSGPACK_OBJECT_STR) {
        static const char *const names[] = { "auto", "none", "required" };
        for (int i = 0; i < 3; i++)
            if (key_is(v, names[i])) { q->tool_choice = i; return 0; }
        return fail(d, PROTO_E_INVALID_VALUE, "\"tool_choice\" must be \"auto\", \"none\", \"required\" or a function");
    }
    const msgpack_object *f = map_get(v, "function"), *nm = f ? map_get(f, "name") : NULL;
    if (!nm) return fail(d, PROTO_E_BAD_REQUEST, "\"tool_choice\" must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (get_str(d, nm, "tool_choice.function.name", 256, &q->tool_name, &q->tool_name_len) < 0) return -1;
    q->tool_choice = PROTO_TOOLS_NAMED;
    return 0;
}

/* "reasoning": "split" or "raw" */
static int get_reasoning(dctx *d, const msgpack_object *v, proto_req *q)
{
    if (v->type != MSGPACK_OBJECT_STR) return fail(d, PROTO_E_BAD_REQUEST, "\"reasoning\" must be a string");
    if (key_is(v, "split")) q->reasoning = PROTO_REASONING_SPLIT;
    else if (key_is(v, "raw")) q->reasoning = PROTO_REASONING_RAW;
    else return fail(d, PROTO_E_INVALID_VALUE, "\"reasoning\" must be \"split\" or \"raw\"");
    return 0;
}

/* "messages": [{"role": str, "content": str}, ...], 1..PROTO_MAX_MSGS of
 * them, contents adding up to at most PROTO_MAX_PROMPT bytes. */
static int get_msgs(dctx *d, const msgpack_object *v, proto_req *q)
{
    if (v->type != MSGPACK_OBJECT_ARRAY) return fail(d, PROTO_E_BAD_REQUEST, "\"messages\" must be an array of maps");
    uint32_t n = v->via.array.size;
    if (n > PROTO_MAX_MSGS)
        return fail(d, PROTO_E_TOO_LARGE, "\"messages\" has %u entries, over the limit of %d", n, PROTO_MAX_MSGS);
    if (n == 0) return fail(d, PROTO_E_INVALID_VALUE, "\"messages\" must not be empty");
    /* Shape first, so that garbage (e.g. 1024 empty maps) is refused for
     * what it is before any storage is taken for it. */
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *e = &v->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_MAP) return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u] must be a map", i);
        const msgpack_object *role = NULL;
        for (uint32_t j = 0; j < e->via.map.size; j++)
            if (key_is(&e->via.map.ptr[j].key, "role") && !is_nil(&e->via.map.ptr[j].val)) role = &e->via.map.ptr[j].val;
        if (!role) return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u] has no \"role\"", i);
    }
    proto_msg *m = arena_alloc(d->r, n * sizeof *m, 8);
    if (!m) return fail(d, PROTO_E_INTERNAL, "out of memory");
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *e = &v->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_MAP) return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u] must be a map", i);
        m[i] = (proto_msg){ NULL, 0, "", 0, NULL, 0 };
        int extra = 0;
        for (uint32_t j = 0; j < e->via.map.size; j++) {
            const msgpack_object *k = &e->via.map.ptr[j].key, *x = &e->via.map.ptr[j].val;
            if (is_nil(x)) continue;
            if (key_is(k, "role")) {
                if (get_str(d, x, "role", PROTO_MAX_ROLE, &m[i].role, &m[i].role_len) < 0) return -1;
            } else if (key_is(k, "content")) {
                if (get_str(d, x, "content", PROTO_MAX_PROMPT, &m[i].content, &m[i].content_len) < 0) return -1;
            } else if (k->type == MSGPACK_OBJECT_STR) {
                if (key_is(k, "tool_calls") && check_calls(d, x, i) < 0) return -1;
                if (key_is(k, "reasoning_content") && x->type != MSGPACK_OBJECT_STR)
                    return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u].reasoning_content must be a string", i);
                extra = 1;
            }
        }
        if (extra) {
            static const char *const own[] = { "role", "content", NULL };
            char buf[48];
            snprintf(buf, sizeof buf, "\"messages\"[%u]", i);
            if (get_json(d, e, own, buf, &m[i].extra, &m[i].extra_len) < 0) return -1;
        }
        if (!m[i].role || m[i].role_len == 0)
            return fail(d, PROTO_E_BAD_REQUEST, "\"messages\"[%u] has no \"role\"", i);
        total += m[i].content_len;
        if (total > PROTO_MAX_PROMPT)
            return fail(d, PROTO_E_TOO_LARGE, "\"messages\" hold over %d bytes of content", PROTO_MAX_PROMPT);
    }
    q->msgs = m;
    q->n_msgs = n;
    return 0;
}

/* Reads "type" and "id" of a message map (a request's, or an event's when
 * `events`); the rest is per type. The id is kept even when the type is bad,
 * so that the error answers it. */
static int decode_head(dctx *d, const msgpack_object *m, int events, proto_type *type, uint64_t *id,
                       int *has_id)
{
    const msgpack_object *ot = NULL, *oid = NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        if (key_is(&kv->key, "type")) ot = &kv->val;
        else if (key_is(&kv->key, "id")) oid = &kv->val;
    }
    d->what = events ? "event" : "request";
    *has_id = oid != NULL;
    if (oid && get_u64(d, oid, "id", id) < 0) *id = 0;
    if (!ot) return fail(d, PROTO_E_BAD_REQUEST, "missing \"type\"");
    if (ot->type != MSGPACK_OBJECT_STR) return fail(d, PROTO_E_BAD_REQUEST, "\"type\" must be a string");
    *type = proto_type_lookup(ot->via.str.ptr, ot->via.str.size, events);
    if (*type == PROTO_T_NONE) {
        if (events) return fail(d, PROTO_E_UNKNOWN_TYPE, "unknown event type");
        size_t n = ot->via.str.size;
        int show = proto_utf8_valid(ot->via.str.ptr, n) && n <= 64;
        return fail(d, PROTO_E_UNKNOWN_TYPE, "unknown request type \"%.*s\"",
                    show ? (int)n : 3, show ? ot->via.str.ptr : "...");
    }
    d->what = proto_type_name(*type);
    return *d->code ? -1 : 0;   /* a bad id */
}

static int decode_req(dctx *d, const msgpack_object *m, proto_req *q)
{
    proto_req_init(q, PROTO_T_NONE, 0);
    int has_id = 0;
    if (decode_head(d, m, 0, &q->type, &q->id, &has_id) < 0) return -1;
    if (!has_id && q->type != PROTO_T_HELLO) return fail(d, PROTO_E_BAD_REQUEST, "missing \"id\"");

    int has_prompt = 0, has_tokens = 0, has_version = 0, has_text = 0, has_msgs = 0, has_choice = 0;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR || key_is(k, "type") || key_is(k, "id")) continue;
        if (is_nil(v)) continue;   /* nil = absent: the default applies */
        int rc = 0;
        switch (q->type) {
        case PROTO_T_HELLO:
            if (key_is(k, "version")) { rc = get_u32(d, v, "version", &q->version); has_version = 1; }
            else if (key_is(k, "client")) rc = get_str(d, v, "client", PROTO_MAX_NAME, &q->client, &q->client_len);
            break;
        case PROTO_T_GENERATE:
        case PROTO_T_EVAL:
            if (key_is(k, "prompt")) { rc = get_str(d, v, "prompt", PROTO_MAX_PROMPT, &q->text, &q->text_len); has_prompt = 1; }
            else if (key_is(k, "tokens")) { rc = get_tokens(d, v, "tokens", 1, &q->tokens, &q->n_tokens); has_tokens = 1; }
            else if (key_is(k, "messages")) { rc = get_msgs(d, v, q); has_msgs = 1; }
            else if (key_is(k, "system")) rc = get_str(d, v, "system", PROTO_MAX_PROMPT, &q->system, &q->system_len);
            else if (key_is(k, "raw")) rc = get_bool(d, v, "raw", &q->raw);
            else if (key_is(k, "tools") && q->type == PROTO_T_GENERATE) rc = get_tools(d, v, q);
            else if (key_is(k, "tool_choice") && q->type == PROTO_T_GENERATE) { rc = get_tool_choice(d, v, q); has_choice = 1; }
            else if (key_is(k, "reasoning") && q->type == PROTO_T_GENERATE) rc = get_reasoning(d, v, q);
            else if (key_is(k, "keep_reasoning")) rc = get_bool(d, v, "keep_reasoning", &q->keep_reasoning);
            else if (key_is(k, "template_vars")) rc = get_tvars(d, v, q);
            else if (key_is(k, "parallel_tool_calls") && q->type == PROTO_T_GENERATE)
                rc = get_bool(d, v, "parallel_tool_calls", &q->parallel_tool_calls);
            else if (q->type == PROTO_T_EVAL) {
                if (key_is(k, "top")) rc = get_i32(d, v, "top", 1, PROTO_MAX_TOP, &q->top);
            }
            else if (key_is(k, "special")) rc = get_bool(d, v, "special", &q->special);
            else if (key_is(k, "max_tokens")) rc = get_i32(d, v, "max_tokens", 0, PROTO_MAX_GEN, &q->max_tokens);
            else if (key_is(k, "temperature")) rc = get_float(d, v, "temperature", 0, PROTO_MAX_TEMPERATURE, 0, &q->temperature);
            else if (key_is(k, "top_k")) rc = get_i32(d, v, "top_k", 0, INT32_MAX, &q->top_k);
            else if (key_is(k, "top_p")) rc = get_float(d, v, "top_p", 0, 1, 0, &q->top_p);
            else if (key_is(k, "min_p")) rc = get_float(d, v, "min_p", 0, 1, 0, &q->min_p);
            else if (key_is(k, "repeat_penalty")) rc = get_float(d, v, "repeat_penalty", 0, PROTO_MAX_PENALTY, 1, &q->repeat_penalty);
            else if (key_is(k, "repeat_last_n")) rc = get_i32(d, v, "repeat_last_n", 0, PROTO_MAX_TOKENS, &q->repeat_last_n);
            else if (key_is(k, "seed")) { rc = get_u64(d, v, "seed", &q->seed); q->has_seed = rc == 0; }
            else if (key_is(k, "grammar")) rc = get_str(d, v, "grammar", PROTO_MAX_PROMPT, &q->grammar, &q->grammar_len);
            else if (key_is(k, "json_schema")) rc = get_str(d, v, "json_schema", PROTO_MAX_PROMPT, &q->json_schema, &q->json_schema_len);
            else if (key_is(k, "json_object")) rc = get_bool(d, v, "json_object", &q->json_object);
            else if (key_is(k, "logprobs")) {
                /* true: the chosen token's alone; N: and N alternatives */
                if (v->type == MSGPACK_OBJECT_BOOLEAN) { q->logprobs = v->via.boolean; q->top_logprobs = 0; }
                else if ((rc = get_i32(d, v, "logprobs", 0, PROTO_MAX_LOGPROBS, &q->top_logprobs)) == 0) q->logprobs = 1;
            }
            else if (key_is(k, "echo")) rc = get_bool(d, v, "echo", &q->echo);
            else if (key_is(k, "prompt_only")) rc = get_bool(d, v, "prompt_only", &q->prompt_only);
            else if (key_is(k, "regex")) {
                rc = get_str(d, v, "regex", PROTO_MAX_CHOICE_LEN, &q->regex, &q->regex_len);
                if (rc == 0 && q->regex_len == 0) rc = fail(d, PROTO_E_INVALID_VALUE, "\"regex\" is empty");
            }
            else if (key_is(k, "choice")) {
                if (v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == 0)
                    rc = fail(d, PROTO_E_INVALID_VALUE, "\"choice\" is empty: it needs 1 to %d texts", PROTO_MAX_CHOICE);
                else rc = get_strs(d, v, "choice", PROTO_MAX_CHOICE, PROTO_MAX_CHOICE_LEN, q->choice, q->choice_len, &q->n_choice);
            }
            else if (key_is(k, "stop")) rc = get_strs(d, v, "stop", PROTO_MAX_STOP, PROTO_MAX_STOP_LEN, q->stop, q->stop_len, &q->n_stop);
            break;
        case PROTO_T_TOKENIZE:
            if (key_is(k, "text")) { rc = get_str(d, v, "text", PROTO_MAX_PROMPT, &q->text, &q->text_len); has_text = 1; }
            else if (key_is(k, "special")) rc = get_bool(d, v, "special", &q->special);
            else if (key_is(k, "add_bos")) rc = get_bool(d, v, "add_bos", &q->add_bos);
            break;
        case PROTO_T_DETOKENIZE:
            if (key_is(k, "tokens")) { rc = get_tokens(d, v, "tokens", 0, &q->tokens, &q->n_tokens); has_tokens = 1; }
            break;
        case PROTO_T_EMBED:
            if (key_is(k, "prompt")) { rc = get_str(d, v, "prompt", PROTO_MAX_PROMPT, &q->text, &q->text_len); has_prompt = 1; }
            else if (key_is(k, "tokens")) { rc = get_tokens(d, v, "tokens", 1, &q->tokens, &q->n_tokens); has_tokens = 1; }
            else if (key_is(k, "special")) rc = get_bool(d, v, "special", &q->special);
            break;
        default:
            break;
        }
        if (rc < 0) return -1;
    }
    switch (q->type) {
    case PROTO_T_HELLO:
        if (!has_version) return fail(d, PROTO_E_BAD_REQUEST, "missing \"version\"");
        break;
    case PROTO_T_GENERATE:
    case PROTO_T_EVAL:
        if (has_prompt + has_tokens + has_msgs > 1)
            return fail(d, PROTO_E_BAD_REQUEST, "give one of \"prompt\", \"tokens\" and \"messages\"");
        if (!has_prompt && !has_tokens && !has_msgs)
            return fail(d, PROTO_E_BAD_REQUEST, "missing \"prompt\", \"tokens\" or \"messages\"");
        if (has_msgs && q->system) return fail(d, PROTO_E_BAD_REQUEST, "\"system\" goes into \"messages\" as a message");
        if (has_msgs && q->raw) return fail(d, PROTO_E_BAD_REQUEST, "\"messages\" are rendered with the chat template: \"raw\" does not apply");
        if (q->tools && !has_msgs) return fail(d, PROTO_E_BAD_REQUEST, "\"tools\" go with \"messages\" (the chat template places them)");
        if (has_choice && !q->tools)
            return fail(d, PROTO_E_BAD_REQUEST, "\"tool_choice\" needs \"tools\"");
        if (q->prompt_only && !q->echo)
            return fail(d, PROTO_E_INVALID_VALUE, "\"prompt_only\" needs \"echo\": true");
        break;
    case PROTO_T_TOKENIZE:
        if (!has_text) return fail(d, PROTO_E_BAD_REQUEST, "missing \"text\"");
        break;
    case PROTO_T_DETOKENIZE:
        if (!has_tokens) return fail(d, PROTO_E_BAD_REQUEST, "missing \"tokens\"");
        break;
    case PROTO_T_EMBED:
        if (has_prompt + has_tokens != 1) return fail(d, PROTO_E_BAD_REQUEST, "give one of \"prompt\" and \"tokens\"");
        break;
    default:
        break;
    }
    return 0;
}

/* --- events --- */

/* embedding: a bin of little-endian float32, into the arena */
static int get_f32le(dctx *d, const msgpack_object *v, proto_ev *e)
{
    if (v->type != MSGPACK_OBJECT_BIN || v->via.bin.size % 4)
        return fail(d, PROTO_E_BAD_REQUEST, "\"embedding\" must be a bin of float32 values");
    size_t n = v->via.bin.size / 4;
    float *f = arena_alloc(d->r, (n ? n : 1) * sizeof *f, sizeof *f);
    if (!f) return fail(d, PROTO_E_INTERNAL, "out of memory");
    const unsigned char *b = (const unsigned char *)v->via.bin.ptr;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                     (uint32_t)b[4 * i + 3] << 24;
        memcpy(&f[i], &u, 4);
    }
    e->embedding = f;
    e->n_embedding = n;
    return 0;
}

/* An array "name" of at most `max` entries: its count, and zeroed arena room
 * for as many `size`-byte records (NULL after fail()). */
static void *get_array(dctx *d, const msgpack_object *v, const char *name, uint32_t max, size_t size, uint32_t *n)
{
    if (v->type != MSGPACK_OBJECT_ARRAY) {
        fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be an array", name);
        return NULL;
    }
    *n = v->via.array.size;
    if (*n > max) {
        fail(d, PROTO_E_TOO_LARGE, "\"%s\" has %u entries, over the limit of %u", name, *n, max);
        return NULL;
    }
    void *t = arena_alloc(d->r, (*n ? *n : 1) * size, 8);
    if (!t) fail(d, PROTO_E_INTERNAL, "out of memory");
    else memset(t, 0, (*n ? *n : 1) * size);
    return t;
}

/* Item i of the array v ("name"): an array [id, number, ...] of k items
 * (shape, e.g. "[id, logit]", names them in errors; num the number). Its
 * items, with the id and the number in *id and *x; NULL on failure. */
static const msgpack_object *get_id_num(dctx *d, const msgpack_object *v, const char *name, uint32_t i,
                                        uint32_t k, const char *shape, const char *num, int32_t *id, double *x)
{
    const msgpack_object *p = &v->via.array.ptr[i];
    if (p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != k) {
        fail(d, PROTO_E_BAD_REQUEST, "\"%s\"[%u] must be %s", name, i, shape);
        return NULL;
    }
    char id_name[32];
    snprintf(id_name, sizeof id_name, "%s id", name);
    if (get_i32(d, &p->via.array.ptr[0], id_name, 0, INT32_MAX, id) < 0) return NULL;
    if (obj_number(&p->via.array.ptr[1], x) < 0) {
        fail(d, PROTO_E_BAD_REQUEST, "\"%s\"[%u] %s must be a number", name, i, num);
        return NULL;
    }
    return p->via.array.ptr;
}

static int get_top(dctx *d, const msgpack_object *v, proto_ev *e)
{
    uint32_t n;
    proto_top *t = get_array(d, v, "top", PROTO_MAX_TOP, sizeof *t, &n);
    if (!t) return -1;
    for (uint32_t i = 0; i < n; i++) {
        double logit;
        if (!get_id_num(d, v, "top", i, 2, "[id, logit]", "logit", &t[i].id, &logit)) return -1;
        t[i].logit = (float)logit;   /* -inf is a legal logit */
    }
    e->top = t;
    e->n_top = n;
    return 0;
}

/* bytes of a token: bin (or str), any bytes */
static int get_bytes(dctx *d, const msgpack_object *o, const char *name, const char **s, size_t *n)
{
    if (o->type != MSGPACK_OBJECT_BIN && o->type != MSGPACK_OBJECT_STR)
        return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be bytes", name);
    const char *p = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.ptr : o->via.str.ptr;
    size_t len = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.size : o->via.str.size;
    char *c = arena_alloc(d->r, len + 1, 1);
    if (!c) return fail(d, PROTO_E_INTERNAL, "out of memory");
    if (len) memcpy(c, p, len);
    c[len] = 0;
    *s = c;
    *n = len;
    return 0;
}

/* token / prompt_token: bytes, logprob, top_logprobs [[id, logprob, bytes], ...] */
static int get_lp_field(dctx *d, const msgpack_object *k, const msgpack_object *v, proto_ev *e)
{
    double x;
    if (key_is(k, "bytes")) return get_bytes(d, v, "bytes", &e->bytes, &e->bytes_len);
    if (key_is(k, "logprob")) {
        if (obj_number(v, &x) < 0) return fail(d, PROTO_E_BAD_REQUEST, "\"logprob\" must be a number");
        e->logprob = (float)x;
        e->has_logprob = 1;
        return 0;
    }
    if (!key_is(k, "top_logprobs")) return 0;
    uint32_t n;
    proto_lp *t = get_array(d, v, "top_logprobs", PROTO_MAX_LOGPROBS, sizeof *t, &n);
    if (!t) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *p = get_id_num(d, v, "top_logprobs", i, 3, "[id, logprob, bytes]", "logprob",
                                                &t[i].id, &x);
        if (!p) return -1;
        t[i].logprob = (float)x;
        if (get_bytes(d, &p[2], "top_logprobs bytes", &t[i].bytes, &t[i].bytes_len) < 0) return -1;
    }
    e->lps = t;
    e->n_lps = n;
    return 0;
}

static int get_per_client(dctx *d, const msgpack_object *v, proto_ev *e)
{
    uint32_t n;
    proto_client_count *c = get_array(d, v, "per_client", UINT32_MAX, sizeof *c, &n);
    if (!c) return -1;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *m = &v->via.array.ptr[i];
        if (m->type != MSGPACK_OBJECT_MAP) return fail(d, PROTO_E_BAD_REQUEST, "\"per_client\"[%u] must be a map", i);
        for (uint32_t j = 0; j < m->via.map.size; j++) {
            const msgpack_object *k = &m->via.map.ptr[j].key, *x = &m->via.map.ptr[j].val;
            int rc = 0;
            if (key_is(k, "uid")) rc = get_u32(d, x, "uid", &c[i].uid);
            else if (key_is(k, "pid")) rc = get_u32(d, x, "pid", &c[i].pid);
            else if (key_is(k, "active")) rc = get_u32(d, x, "active", &c[i].active);
            else if (key_is(k, "queued")) rc = get_u32(d, x, "queued", &c[i].queued);
            if (rc < 0) return -1;
        }
    }
    e->per_client = c;
    e->n_per_client = n;
    return 0;
}

static int decode_submap(dctx *d, const msgpack_object *v, const char *name, proto_ev *e)
{
    if (v->type != MSGPACK_OBJECT_MAP) return fail(d, PROTO_E_BAD_REQUEST, "\"%s\" must be a map", name);
    for (uint32_t j = 0; j < v->via.map.size; j++) {
        const msgpack_object *k = &v->via.map.ptr[j].key, *x = &v->via.map.ptr[j].val;
        int rc = 0;
        if (key_is(k, "prompt_tokens")) rc = get_u32(d, x, "prompt_tokens", &e->prompt_tokens);
        else if (key_is(k, "cached_tokens")) rc = get_u32(d, x, "cached_tokens", &e->cached_tokens);
        else if (key_is(k, "completion_tokens")) rc = get_u32(d, x, "completion_tokens", &e->completion_tokens);
        else if (key_is(k, "queue_ms")) rc = get_double(d, x, "queue_ms", &e->queue_ms);
        else if (key_is(k, "prefill_ms")) rc = get_double(d, x, "prefill_ms", &e->prefill_ms);
        else if (key_is(k, "decode_ms")) rc = get_double(d, x, "decode_ms", &e->decode_ms);
        if (rc < 0) return -1;
    }
    return 0;
}

static int decode_ev(dctx *d, const msgpack_object *m, proto_ev *e)
{
    proto_ev_init(e, PROTO_T_NONE, 0);
    int has_id = 0;
    if (decode_head(d, m, 1, &e->type, &e->id, &has_id) < 0) return -1;

    int has_code = 0;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR || key_is(k, "type") || key_is(k, "id") || is_nil(v)) continue;
        int rc = 0;
        const size_t big = PROTO_MAX_FRAME;
        switch (e->type) {
        case PROTO_T_HELLO_OK:
        case PROTO_T_INFO_OK:
            if (key_is(k, "version")) rc = get_u32(d, v, "version", &e->version);
            else if (key_is(k, "server")) rc = get_str(d, v, "server", big, &e->server, &e->server_len);
            else if (key_is(k, "model")) rc = get_str(d, v, "model", big, &e->model, &e->model_len);
            else if (e->type == PROTO_T_HELLO_OK) break;
            else if (key_is(k, "model_path")) rc = get_str(d, v, "model_path", big, &e->model_path, &e->model_path_len);
            else if (key_is(k, "arch")) rc = get_str(d, v, "arch", big, &e->arch, &e->arch_len);
            else if (key_is(k, "backend")) rc = get_str(d, v, "backend", big, &e->backend, &e->backend_len);
            else if (key_is(k, "chat_template")) rc = get_str(d, v, "chat_template", big, &e->chat_template, &e->chat_template_len);
            else if (key_is(k, "tool_format")) rc = get_str(d, v, "tool_format", big, &e->tool_format, &e->tool_format_len);
            else if (key_is(k, "warning")) rc = get_str(d, v, "warning", big, &e->warning, &e->warning_len);
            else if (key_is(k, "n_vocab")) rc = get_i32(d, v, "n_vocab", 0, INT32_MAX, &e->n_vocab);
            else if (key_is(k, "n_ctx")) rc = get_i32(d, v, "n_ctx", 0, INT32_MAX, &e->n_ctx);
            else if (key_is(k, "n_layer")) rc = get_i32(d, v, "n_layer", 0, INT32_MAX, &e->n_layer);
            else if (key_is(k, "n_embd")) rc = get_i32(d, v, "n_embd", 0, INT32_MAX, &e->n_embd);
            else if (key_is(k, "tokenizer_only")) rc = get_bool(d, v, "tokenizer_only", &e->tokenizer_only);
            else if (key_is(k, "active")) rc = get_u32(d, v, "active", &e->active);
            else if (key_is(k, "queued")) rc = get_u32(d, v, "queued", &e->queued);
            else if (key_is(k, "clients")) rc = get_u32(d, v, "clients", &e->clients);
            else if (key_is(k, "jobs_done")) rc = get_u64(d, v, "jobs_done", &e->jobs_done);
            else if (key_is(k, "tokens_served")) rc = get_u64(d, v, "tokens_served", &e->tokens_served);
            else if (key_is(k, "prompt_tokens_total")) rc = get_u64(d, v, "prompt_tokens_total", &e->prompt_tokens_total);
            else if (key_is(k, "kv_used")) rc = get_u64(d, v, "kv_used", &e->kv_used);
            else if (key_is(k, "kv_total")) rc = get_u64(d, v, "kv_total", &e->kv_total);
            else if (key_is(k, "kv_tokens")) rc = get_u64(d, v, "kv_tokens", &e->kv_tokens);
            else if (key_is(k, "swa_ring")) rc = get_u32(d, v, "swa_ring", &e->swa_ring);
            else if (key_is(k, "weight_bytes")) rc = get_u64(d, v, "weight_bytes", &e->weight_bytes);
            else if (key_is(k, "uptime_s")) rc = get_double(d, v, "uptime_s", &e->uptime_s);
            else if (key_is(k, "idle_timeout_s")) rc = get_double(d, v, "idle_timeout_s", &e->idle_timeout_s);
            else if (key_is(k, "max_clients_per_uid")) rc = get_u32(d, v, "max_clients_per_uid", &e->max_clients_per_uid);
            else if (key_is(k, "deterministic")) rc = get_bool(d, v, "deterministic", &e->deterministic);
            else if (key_is(k, "pooling")) { size_t n; rc = get_str(d, v, "pooling", 64, &e->pooling, &n); }
            else if (key_is(k, "pooling_source")) { size_t n; rc = get_str(d, v, "pooling_source", 64, &e->pooling_source, &n); }
            else if (key_is(k, "per_client")) rc = get_per_client(d, v, e);
            break;
        case PROTO_T_TOKEN:
            if (key_is(k, "token")) rc = get_i32(d, v, "token", 0, INT32_MAX, &e->token);
            else if (key_is(k, "text")) rc = get_str(d, v, "text", big, &e->text, &e->text_len);
            else if (key_is(k, "reasoning")) rc = get_str(d, v, "reasoning", big, &e->reasoning, &e->reasoning_len);
            else rc = get_lp_field(d, k, v, e);
            break;
        case PROTO_T_PROMPT_TOKEN:
            if (key_is(k, "token")) rc = get_i32(d, v, "token", 0, INT32_MAX, &e->token);
            else if (key_is(k, "pos")) rc = get_i32(d, v, "pos", 0, INT32_MAX, &e->pos);
            else rc = get_lp_field(d, k, v, e);
            break;
        case PROTO_T_TOOL_CALL:
            if (key_is(k, "index")) rc = get_u32(d, v, "index", &e->call_index);
            else if (key_is(k, "name")) rc = get_str(d, v, "name", big, &e->call_name, &e->call_name_len);
            else if (key_is(k, "arguments")) rc = get_str(d, v, "arguments", big, &e->call_args, &e->call_args_len);
            else if (key_is(k, "call_id")) rc = get_str(d, v, "call_id", big, &e->call_id, &e->call_id_len);
            break;
        case PROTO_T_TEXT:
            if (key_is(k, "text")) rc = get_str(d, v, "text", big, &e->text, &e->text_len);
            break;
        case PROTO_T_LOGITS:
            if (key_is(k, "pos")) rc = get_i32(d, v, "pos", 0, INT32_MAX, &e->pos);
            else if (key_is(k, "top")) rc = get_top(d, v, e);
            break;
        case PROTO_T_DONE:
            if (key_is(k, "finish")) rc = get_str(d, v, "finish", 64, &e->finish, &e->finish_len);
            else if (key_is(k, "usage")) rc = decode_submap(d, v, "usage", e);
            else if (key_is(k, "timings")) rc = decode_submap(d, v, "timings", e);
            break;
        case PROTO_T_ERROR:
            if (key_is(k, "code")) {
                const char *s; size_t n;
                rc = get_str(d, v, "code", 64, &s, &n);
                if (rc == 0) { e->code = proto_err_from_name(s, n); has_code = 1; }
            } else if (key_is(k, "message")) rc = get_str(d, v, "message", big, &e->message, &e->message_len);
            else if (key_is(k, "closing")) rc = get_bool(d, v, "closing", &e->closing);
            break;
        case PROTO_T_TOKENS:
            if (key_is(k, "tokens")) rc = get_tokens(d, v, "tokens", 0, &e->tokens, &e->n_tokens);
            break;
        case PROTO_T_EMBEDDING:
            if (key_is(k, "embedding")) rc = get_f32le(d, v, e);
            break;
        default:
            break;
        }
        if (rc < 0) return -1;
    }
    /* Absent strings read as "" so callers never see NULL. */
    const char **sp[] = { &e->server, &e->model, &e->text, &e->finish, &e->message, &e->arch,
                          &e->backend, &e->chat_template, &e->warning, &e->model_path,
                          &e->call_name, &e->call_args, &e->call_id, &e->tool_format };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) if (!*sp[i]) *sp[i] = "";
    if (e->type == PROTO_T_ERROR && !has_code) e->code = PROTO_E_INTERNAL;
    if (e->type == PROTO_T_DONE && e->finish_len == 0) return fail(d, PROTO_E_BAD_REQUEST, "missing \"finish\"");
    return 0;
}

/* Frames one message and decodes it with fn. */
static int rd_next(proto_reader *r, void *out, int events, proto_err *code, char *err, size_t errlen)
{
    *code = PROTO_OK;
    if (err && errlen) err[0] = 0;
    if (r->broken) {
        *code = r->broken_code;
        err_set(err, errlen, "connection stream is broken (%s)", proto_err_name(r->broken_code));
        return -1;
    }
    /* The previous message's storage is released now. */
    if (r->arena_cap > RD_IDLE_CAP * 4) { free(r->arena); r->arena = NULL; r->arena_cap = 0; }
    arena_drop_extra(r);
    size_t len = 0;
    int rc = rd_skim(r, &len, code, err, errlen);
    if (rc == 0) {
        if (r->start == r->end) {
            r->start = r->end = 0;
            if (r->cap > RD_IDLE_CAP) { free(r->buf); r->buf = NULL; r->cap = 0; }
        }
        return 0;
    }
    if (rc < 0) {
        r->broken = 1;
        r->broken_code = *code;
        return -1;
    }
    const char *frame = r->buf + r->start;
    msgpack_object obj;
    size_t off = 0;
    msgpack_zone_clear(r->zone);
    msgpack_unpack_return ur = msgpack_unpack(frame, len, &off, r->zone, &obj);
    if ((ur != MSGPACK_UNPACK_SUCCESS && ur != MSGPACK_UNPACK_EXTRA_BYTES) || off != len
        || obj.type != MSGPACK_OBJECT_MAP) {
        r->broken = 1;
        r->broken_code = *code = ur == MSGPACK_UNPACK_NOMEM_ERROR ? PROTO_E_INTERNAL : PROTO_E_MALFORMED;
        err_set(err, errlen, ur == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory" : "malformed message");
        return -1;
    }
    if (arena_prepare(r, len) < 0) {
        r->broken = 1;
        r->broken_code = *code = PROTO_E_INTERNAL;
        err_set(err, errlen, "out of memory");
        return -1;
    }
    dctx d = { r, code, err, errlen, "message", events };
    if (events) decode_ev(&d, &obj, out);
    else decode_req(&d, &obj, out);
    /* Strings were copied into the arena: the frame can go. */
    r->start += len;
    sk_reset(r);
    if (len > RD_IDLE_CAP) {
        msgpack_zone_free(r->zone);
        r->zone = msgpack_zone_new(8192);
        if (!r->zone) {
            r->broken = 1;
            r->broken_code = *code = PROTO_E_INTERNAL;
            err_set(err, errlen, "out of memory");
            return -1;
        }
    }
    return 1;
}

int proto_reader_next_req(proto_reader *r, proto_req *req, proto_err *code, char *err, size_t errlen)
{
    return rd_next(r, req, 0, code, err, errlen);
}

int proto_reader_next_ev(proto_reader *r, proto_ev *ev, proto_err *code, char *err, size_t errlen)
{
    return rd_next(r, ev, 1, code, err, errlen);
}
