/* loader.h — what the architecture families' load hooks (engine/arch/) read
 * a model with (engine-internal): metadata keys under "<arch>.", tensors
 * looked up by name with their type and shape checked, and errors that name
 * the file. model.c reads the hyper-parameters every family shares, then
 * calls the family's hook. */
#ifndef ANE_LOADER_H
#define ANE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/load/gguf.h"
#include "engine/load/hf.h"
#include "engine/load/model.h"

typedef struct ld {
    model *m;
    gguf *g;                    /* the GGUF file, or NULL for */
    hf_model *hf;               /* a Hugging Face directory */
    char *err; size_t errlen;
    float *vec_buf; size_t vec_used, vec_cap;  /* f32 copies of 1-D tensors */
} ld;

/* "<path>: message" into the error buffer; returns -1. */
int ld_fail(ld *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* GGUF metadata "<arch>.<suffix>": 0 read (or absent and not required: *v
 * = dflt), -1 missing when required, or not a number (key_i: an integer in
 * [0, INT32_MAX]). */
int key_i(ld *l, const char *suffix, int64_t *v, int required, int64_t dflt);
/* key_i within [lo, hi], the default included. */
int key_ir(ld *l, const char *suffix, int64_t *v, int required, int64_t dflt, int64_t lo, int64_t hi);
/* An optional number in (lo, hi] (absent: dflt); NaN, infinities and values
 * out of range refused. */
int key_f(ld *l, const char *suffix, double *v, double dflt, double lo, double hi);
/* Tensor `name` with shape {n_in, n_out} (n_out = 0: a 1-D vector, widened
 * to f32 into vec_buf); absent: zeroed *w, an error when required. */
int get_w(ld *l, wt *w, const char *name, int64_t n_in, int64_t n_out, int required);
/* A 3-D tensor {n_in, n_out, n_mat} (stacked experts) as one wt of
 * n_out * n_mat rows. */
int get_w3(ld *l, wt *w, const char *name, int64_t n_in, int64_t n_out, int64_t n_mat, int required);
/* The tensor `name` of the file (GGUF or Hugging Face), or NULL. */
const gguf_tensor *ld_tensor(ld *l, const char *name);
/* The same for "blk.<i>.<what>". */
int get_layer_w(ld *l, wt *w, int i, const char *what, int64_t n_in, int64_t n_out, int required);
/* What every family loads first: n_vocab from token_embd.weight (checked
 * against the tokenizer), vec_cap floats for 1-D tensors, the layers, and
 * the embedding, the output norm and the output (the embedding when absent). */
int ld_common(ld *l, size_t vec_cap);

#endif
