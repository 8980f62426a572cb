/* gguf.h — GGUF v2/v3 reader (engine-internal).
 *
 * gguf_open mmaps the file read-only and validates the whole header before
 * returning: magic, version, every key/value (type, string lengths, array
 * counts against the bytes left, no key twice), every tensor record (name
 * unique, dims, type, offset alignment, data inside the file and apart from
 * every other tensor's, no overflow). After that every
 * accessor is bounds-safe. Strings returned point into the mapping and are
 * NOT NUL-terminated: use the length. The gguf owns the mapping; tensors'
 * data pointers stay valid until gguf_close. */
#ifndef ANE_GGUF_H
#define ANE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "engine/load/mfile.h"

typedef enum gguf_vtype {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4, GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
} gguf_vtype;

typedef struct gguf_str { const char *s; uint64_t n; } gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_vtype type;
    /* scalar value (type != STRING/ARRAY) widened; string in .str */
    union { uint64_t u; int64_t i; double f; } v;
    gguf_str str;
    /* ARRAY: element type, count, raw element bytes (strings: length-prefixed) */
    gguf_vtype arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;
    uint64_t *arr_off;    /* STRING arrays: offset of each element in arr_data */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t type;        /* ggml type id (qtypes.h) */
    uint32_t n_dims;
    int64_t ne[4];        /* ne[0] = row length (fastest), unused dims = 1 */
    const void *data;     /* into the mapping */
    uint64_t nbytes;
} gguf_tensor;

typedef struct gguf {
    const char *path;
    const uint8_t *map;
    size_t size;
    mf_map mm;            /* the mapping, watched (mfile.h) */
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
} gguf;

int gguf_open(gguf **out, const char *path, char *err, size_t errlen);
void gguf_close(gguf *g);

const gguf_kv *gguf_get(const gguf *g, const char *key);           /* NULL if absent */
const gguf_tensor *gguf_tensor_find(const gguf *g, const char *name);

/* Typed getters: 0 ok; -1 absent or of an incompatible type (message in err). */
int gguf_get_u64(const gguf *g, const char *key, uint64_t *out);    /* any unsigned/signed >= 0 int */
int gguf_get_i64(const gguf *g, const char *key, int64_t *out);
int gguf_get_f64(const gguf *g, const char *key, double *out);      /* float32/64 or int */
int gguf_get_bool(const gguf *g, const char *key, int *out);
int gguf_get_str(const gguf *g, const char *key, gguf_str *out);

/* Array element access (bounds checked at open). i < kv->arr_n. */
gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i);  /* O(1) after open (index built) */
double gguf_arr_f64(const gguf_kv *kv, uint64_t i);    /* numeric arrays */
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i);

#endif
