/* proto_json.c — MessagePack values <-> JSON text (proto_json.h). */
#include "proto/proto_json.h"
#include "common/strbuf.h"
#include "common/utf8.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* s[0..n) as a JSON string literal; only valid UTF-8 is taken */
static int put_str(strbuf *b, const char *s, size_t n, const char **why)
{
    if (!utf8_valid(s, n, NULL)) { *why = "a string is not valid UTF-8"; return -1; }
    strbuf_json_str(b, s, n);
    return 0;
}

static int skipped(const msgpack_object *k, const char *const *skip)
{
    for (size_t i = 0; skip && skip[i]; i++)
        if (k->via.str.size == strlen(skip[i]) && !memcmp(k->via.str.ptr, skip[i], k->via.str.size)) return 1;
    return 0;
}

static int conv(strbuf *b, const msgpack_object *o, const char *const *skip, const char **why)
{
    char num[40];
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: strbuf_add(b, "null", 4); return 0;
    case MSGPACK_OBJECT_BOOLEAN: o->via.boolean ? strbuf_add(b, "true", 4) : strbuf_add(b, "false", 5); return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        strbuf_add(b, num, (size_t)snprintf(num, sizeof num, "%llu", (unsigned long long)o->via.u64));
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        strbuf_add(b, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)o->via.i64));
        return 0;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: {
        double v = o->via.f64;
        if (!isfinite(v)) { *why = "a float that is not finite"; return -1; }
        int l = snprintf(num, sizeof num, "%.17g", v);
        strbuf_add(b, num, (size_t)l);
        if (!strpbrk(num, ".eE")) strbuf_add(b, ".0", 2);   /* stays a float */
        return 0;
    }
    case MSGPACK_OBJECT_STR: return put_str(b, o->via.str.ptr, o->via.str.size, why);
    case MSGPACK_OBJECT_BIN: return put_str(b, o->via.bin.ptr, o->via.bin.size, why);
    case MSGPACK_OBJECT_ARRAY:
        strbuf_addc(b, '[');
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i) strbuf_addc(b, ',');
            if (conv(b, &o->via.array.ptr[i], NULL, why)) return -1;
        }
        strbuf_addc(b, ']');
        return 0;
    case MSGPACK_OBJECT_MAP: {
        strbuf_addc(b, '{');
        int first = 1;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR) { *why = "a key is not a string"; return -1; }
            if (skipped(k, skip)) continue;
            /* a repeated key keeps its last value, as JSON readers do */
            if (!first) strbuf_addc(b, ',');
            first = 0;
            if (put_str(b, k->via.str.ptr, k->via.str.size, why)) return -1;
            strbuf_addc(b, ':');
            if (conv(b, &o->via.map.ptr[i].val, NULL, why)) return -1;
        }
        strbuf_addc(b, '}');
        return 0;
    }
    default:
        *why = "an ext value";
        return -1;
    }
}

int pj_to_json(const msgpack_object *o, const char *const *skip, char **out, size_t *len,
               const char **why, int *bad_oom)
{
    strbuf b = { 0 };
    *out = NULL;
    *len = 0;
    *bad_oom = 0;
    *why = NULL;
    int rc = conv(&b, o, skip, why);
    if (!rc && b.oom) { *why = "out of memory"; *bad_oom = 1; rc = -1; }
    if (rc) { free(b.p); return -1; }
    if (!b.p) strbuf_add(&b, "", 0);
    if (b.oom) { *why = "out of memory"; *bad_oom = 1; return -1; }
    *out = b.p;
    *len = b.n;
    return 0;
}

static int pack(msgpack_packer *p, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_NULL: return msgpack_pack_nil(p);
    case JSON_TRUE: return msgpack_pack_true(p);
    case JSON_FALSE: return msgpack_pack_false(p);
    case JSON_INTEGER: return msgpack_pack_int64(p, json_integer_value(j));
    case JSON_REAL: return msgpack_pack_double(p, json_real_value(j));
    case JSON_STRING: return msgpack_pack_str_with_body(p, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        int rc = msgpack_pack_array(p, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j) && !rc; i++) rc = pack(p, json_array_get(j, i));
        return rc;
    }
    case JSON_OBJECT: {
        int rc = msgpack_pack_map(p, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            if (rc) break;
            rc = msgpack_pack_str_with_body(p, k, strlen(k));
            if (!rc) rc = pack(p, v);
        }
        return rc;
    }
    }
    return -1;
}

long pj_members(const char *json, size_t len)
{
    json_t *j = json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    long n = json_is_object(j) ? (long)json_object_size(j) : -1;
    json_decref(j);
    return n;
}

int pj_pack(msgpack_packer *p, const char *json, size_t len, int members_only, size_t *n_members)
{
    json_t *j = json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!j) return -1;
    int rc;
    if (members_only) {
        if (!json_is_object(j)) { json_decref(j); return -1; }
        rc = 0;
        const char *k;
        json_t *v;
        size_t n = 0;
        json_object_foreach(j, k, v) {
            if (rc) break;
            rc = msgpack_pack_str_with_body(p, k, strlen(k));
            if (!rc) rc = pack(p, v);
            n++;
        }
        if (n_members) *n_members = n;
    } else {
        rc = pack(p, j);
    }
    json_decref(j);
    return rc ? -1 : 0;
}
