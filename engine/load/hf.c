/* hf.c — safetensors shards and config.json. */
#include "engine/load/hf.h"
#include "engine/load/mfile.h"
#include "engine/quant/qtypes.h"

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HF_MAX_SHARDS  1024
#define HF_MAX_HEADER  (256u << 20)

typedef mf_map shard;

struct hf_model {
    hf_config cfg;
    shard *shards; int n_shards;
    gguf_tensor *t; uint64_t n_t, cap;
    char **names;              /* storage of the GGUF names */
    void **stacked; int n_stacked;   /* the experts' stacked copies */
    void **owned;              /* [cap] transposed copies (GPT-2's Conv1D weights), or NULL */
    unsigned char *trans;      /* [cap] 1: tensor i is stored transposed (a Conv1D weight) */
};

const hf_config *hf_cfg(const hf_model *h) { return &h->cfg; }
uint64_t hf_n_tensors(const hf_model *h) { return h->n_t; }

void hf_close(hf_model *h)
{
    if (!h) return;
    for (int i = 0; i < h->n_shards; i++) mf_unmap(&h->shards[i]);
    for (uint64_t i = 0; i < h->n_t; i++) free(h->names[i]);
    for (uint64_t i = 0; h->owned && i < h->cap; i++) free(h->owned[i]);
    for (int i = 0; i < h->n_stacked; i++) free(h->stacked[i]);
    free(h->owned); free(h->trans); free(h->names); free(h->stacked); free(h->shards); free(h->t);
    free(h);
}

/* GPT-2's names ("transformer." optional, as older checkpoints lack it);
 * *tr: a Conv1D weight, stored [in][out], the transpose of a Linear's. */
static int map_gpt2(const char *hf, char *out, size_t n, int *tr)
{
    static const struct { const char *hf, *gg; } fixed[] = {
        { "wte.weight", "token_embd.weight" },   { "wpe.weight", "position_embd.weight" },
        { "ln_f.weight", "output_norm.weight" }, { "ln_f.bias", "output_norm.bias" },
    };
    static const struct { const char *hf, *gg; int tr; } per_layer[] = {
        { "ln_1.weight", "attn_norm.weight", 0 },        { "ln_1.bias", "attn_norm.bias", 0 },
        { "attn.c_attn.weight", "attn_qkv.weight", 1 },  { "attn.c_attn.bias", "attn_qkv.bias", 0 },
        { "attn.c_proj.weight", "attn_output.weight", 1 }, { "attn.c_proj.bias", "attn_output.bias", 0 },
        { "ln_2.weight", "ffn_norm.weight", 0 },         { "ln_2.bias", "ffn_norm.bias", 0 },
        { "mlp.c_fc.weight", "ffn_up.weight", 1 },       { "mlp.c_fc.bias", "ffn_up.bias", 0 },
        { "mlp.c_proj.weight", "ffn_down.weight", 1 },   { "mlp.c_proj.bias", "ffn_down.bias", 0 },
    };
    *tr = 0;
    if (!strncmp(hf, "transformer.", 12)) hf += 12;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(hf, fixed[i].hf)) { snprintf(out, n, "%s", fixed[i].gg); return 1; }
    int layer, off = 0;
    if (sscanf(hf, "h.%d.%n", &layer, &off) == 1 && off > 0 && layer >= 0 && layer < 100000)
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++)
            if (!strcmp(hf + off, per_layer[i].hf)) {
                snprintf(out, n, "blk.%d.%s", layer, per_layer[i].gg);
                *tr = per_layer[i].tr;
                return 1;
            }
    return 0;
}

/* HF tensor name → GGUF name; 0 when the name is not one we use. */
static int map_name(const char *hf, char *out, size_t n)
{
    static const struct { const char *hf, *gg; } fixed[] = {
        { "model.embed_tokens.weight", "token_embd.weight" },
        { "model.norm.weight", "output_norm.weight" },
        { "lm_head.weight", "output.weight" },
    };
    static const struct { const char *hf, *gg; } per_layer[] = {
        { "input_layernorm.weight", "attn_norm.weight" },
        { "self_attn.q_proj.weight", "attn_q.weight" },
        { "self_attn.k_proj.weight", "attn_k.weight" },
        { "self_attn.v_proj.weight", "attn_v.weight" },
        { "self_attn.o_proj.weight", "attn_output.weight" },
        { "self_attn.q_proj.bias", "attn_q.bias" },
        { "self_attn.k_proj.bias", "attn_k.bias" },
        { "self_attn.v_proj.bias", "attn_v.bias" },
        { "self_attn.q_norm.weight", "attn_q_norm.weight" },
        { "self_attn.k_norm.weight", "attn_k_norm.weight" },
        { "post_attention_layernorm.weight", "ffn_norm.weight" },
        { "mlp.gate_proj.weight", "ffn_gate.weight" },
        { "mlp.up_proj.weight", "ffn_up.weight" },
        { "mlp.down_proj.weight", "ffn_down.weight" },
        { "mlp.gate.weight", "ffn_gate_inp.weight" },                /* Qwen-MoE router */
        { "block_sparse_moe.gate.weight", "ffn_gate_inp.weight" },   /* Mixtral's */
        /* gpt-oss: output bias, sinks, router with bias; its experts come
         * stacked, gate and up interleaved, [in][out]: gptoss_experts
         * turns them into GGUF's layout */
        { "self_attn.o_proj.bias", "attn_output.bias" },
        { "self_attn.sinks", "attn_sinks.weight" },
        { "mlp.router.weight", "ffn_gate_inp.weight" },
        { "mlp.router.bias", "ffn_gate_inp.bias" },
        { "mlp.experts.gate_up_proj", "gptoss_gate_up" },
        { "mlp.experts.gate_up_proj_bias", "gptoss_gate_up_b" },
        { "mlp.experts.down_proj", "gptoss_down" },
        { "mlp.experts.down_proj_bias", "gptoss_down_b" },
        /* gpt-oss as released: experts in MXFP4, 4-bit codes and E8M0 scales */
        { "mlp.experts.gate_up_proj_blocks", "gptoss_gate_up_blocks" },
        { "mlp.experts.gate_up_proj_scales", "gptoss_gate_up_scales" },
        { "mlp.experts.down_proj_blocks", "gptoss_down_blocks" },
        { "mlp.experts.down_proj_scales", "gptoss_down_scales" },
    };
    /* one expert's matrices, stacked later (stack_experts) */
    static const struct { const char *hf, *gg; } expert_mat[] = {
        { "gate_proj.weight", "gate" }, { "up_proj.weight", "up" }, { "down_proj.weight", "down" },
        { "w1.weight", "gate" }, { "w3.weight", "up" }, { "w2.weight", "down" },
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(hf, fixed[i].hf)) { snprintf(out, n, "%s", fixed[i].gg); return 1; }
    int layer, off = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &off) == 1 && off > 0 && layer >= 0 && layer < 100000) {
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++)
            if (!strcmp(hf + off, per_layer[i].hf)) {
                snprintf(out, n, "blk.%d.%s", layer, per_layer[i].gg);
                return 1;
            }
        for (int i = 0; i < 2; i++) {
            int ex, eo = 0;
            int got = i ? sscanf(hf + off, "block_sparse_moe.experts.%d.%n", &ex, &eo)
                        : sscanf(hf + off, "mlp.experts.%d.%n", &ex, &eo);
            if (got != 1 || eo <= 0 || ex < 0 || ex >= 100000) continue;
            for (size_t j = 0; j < sizeof expert_mat / sizeof expert_mat[0]; j++)
                if (!strcmp(hf + off + eo, expert_mat[j].hf)) {
                    snprintf(out, n, "blk.%d.ffn_%s_exp.%d", layer, expert_mat[j].gg, ex);
                    return 1;
                }
        }
    }
    return 0;
}

/* Raw bytes (safetensors U8): only MXFP4 expert codes and scales, which
 * gptoss_experts turns into MXFP4 tensors; no other code sees this type. */
#define HF_U8 0xFFFFu

static int dtype_of(const char *s, uint32_t *t, size_t *esz)
{
    if (!strcmp(s, "U8")) { *t = HF_U8; *esz = 1; return 0; }
    if (!strcmp(s, "BF16")) { *t = QT_BF16; *esz = 2; return 0; }
    if (!strcmp(s, "F16")) { *t = QT_F16; *esz = 2; return 0; }
    if (!strcmp(s, "F32")) { *t = QT_F32; *esz = 4; return 0; }
    return -1;
}

static int tdata_cmp(const void *a, const void *b)
{
    const uint8_t *x = (*(const gguf_tensor *const *)a)->data, *y = (*(const gguf_tensor *const *)b)->data;
    return x < y ? -1 : x > y;
}

/* The tensors h->t[first..] (one shard's) share no byte. */
static int apart(hf_model *h, uint64_t first, const char *path, char *err, size_t errlen)
{
    uint64_t n = h->n_t - first;
    if (n < 2) return 0;
    const gguf_tensor **ix = malloc((size_t)n * sizeof *ix);
    if (!ix) { snprintf(err, errlen, "%s: out of memory", path); return -1; }
    for (uint64_t i = 0; i < n; i++) ix[i] = &h->t[first + i];
    qsort(ix, (size_t)n, sizeof *ix, tdata_cmp);
    int rc = 0;
    for (uint64_t i = 1; i < n && !rc; i++)
        if ((const uint8_t *)ix[i - 1]->data + ix[i - 1]->nbytes > (const uint8_t *)ix[i]->data) {
            snprintf(err, errlen, "%s: the data_offsets of tensors '%s' and '%s' overlap (expected each tensor's "
                     "bytes apart)", path, ix[i - 1]->name.s, ix[i]->name.s);
            rc = -1;
        }
    free(ix);
    return rc;
}

static int shard_load(hf_model *h, const char *path, char *err, size_t errlen)
{
    uint64_t first = h->n_t;
    if (h->n_shards >= HF_MAX_SHARDS) { snprintf(err, errlen, "%s: too many shards", path); return -1; }
    shard *sh = &h->shards[h->n_shards];
    struct stat st;
    int fd = mf_open(path, &st, err, errlen);
    if (fd < 0) return -1;
    if (st.st_size < 8) {
        snprintf(err, errlen, "%s: not a safetensors file (%lld bytes, expected at least 8)", path,
                 (long long)st.st_size);
        close(fd);
        return -1;
    }
    int rc0 = mf_map_fd(sh, fd, &st, path, err, errlen);
    h->n_shards++;   /* (mf_unmap of a failed one is fine) */
    if (rc0) return -1;
    uint64_t hlen;
    memcpy(&hlen, sh->map, 8);
    if (hlen > HF_MAX_HEADER || hlen > sh->size - 8) {
        snprintf(err, errlen, "%s: header length %llu does not fit the file (%zu bytes)", path,
                 (unsigned long long)hlen, sh->size);
        return -1;
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)sh->map + 8, (size_t)hlen, 0, &je);
    if (!root || !json_is_object(root)) {
        snprintf(err, errlen, "%s: header is not a JSON object: %s", path, root ? "" : je.text);
        json_decref(root);
        return -1;
    }
    size_t base = 8 + (size_t)hlen, data_len = sh->size - base;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        char gname[96];
        int tr = 0;
        if (!(strcmp(h->cfg.arch, "gpt2") ? map_name(key, gname, sizeof gname) : map_gpt2(key, gname, sizeof gname, &tr)))
            continue;   /* e.g. rotary inv_freq buffers, GPT-2's attn.bias masks */
        int layer, ex, eo = 0;
        if (sscanf(gname, "blk.%d.", &layer) == 1 && layer >= h->cfg.layers) {
            snprintf(err, errlen, "%s: tensor '%s' belongs to layer %d but config.json has %lld layers",
                     path, key, layer, (long long)h->cfg.layers);
            rc = -1; break;
        }
        const char *dot = strrchr(gname, '.');
        if (strstr(gname, "_exp.") && sscanf(dot + 1, "%d%n", &ex, &eo) == 1 && ex >= h->cfg.n_expert) {
            snprintf(err, errlen, "%s: tensor '%s' is for expert %d but config.json has %lld experts (expected "
                     "experts 0..%lld)", path, key, ex, (long long)h->cfg.n_expert, (long long)h->cfg.n_expert - 1);
            rc = -1; break;
        }
        if (h->n_t >= h->cap) { snprintf(err, errlen, "%s: too many tensors", path); rc = -1; break; }
        json_t *dt = json_object_get(val, "dtype"), *shp = json_object_get(val, "shape"),
               *offs = json_object_get(val, "data_offsets");
        uint32_t type;
        size_t esz;
        if (!json_is_string(dt) || !json_is_array(shp) || !json_is_array(offs) || json_array_size(offs) != 2) {
            snprintf(err, errlen, "%s: tensor '%s': expected dtype, shape and data_offsets", path, key);
            rc = -1; break;
        }
        const int mx = strstr(gname, "_blocks") || strstr(gname, "_scales");   /* gpt-oss MXFP4 parts */
        if (dtype_of(json_string_value(dt), &type, &esz) || (type == HF_U8) != mx) {
            snprintf(err, errlen, "%s: tensor '%s' has dtype %s (supported: %s)", path, key, json_string_value(dt),
                     mx ? "U8" : "BF16, F16, F32");
            rc = -1; break;
        }
        size_t nd = json_array_size(shp);
        /* (3: stacked experts, gpt_oss's; 4: their MXFP4 codes) */
        if (nd < 1 || nd > (mx ? 4u : 3u)) {
            snprintf(err, errlen, "%s: tensor '%s' has %zu dimensions (expected 1 to %d)", path, key, nd, mx ? 4 : 3);
            rc = -1; break;
        }
        int64_t dims[4] = { 1, 1, 1, 1 };
        uint64_t elems = 1;
        for (size_t d = 0; d < nd; d++) {
            json_t *x = json_array_get(shp, d);
            if (!json_is_integer(x) || json_integer_value(x) <= 0 || json_integer_value(x) > (1ll << 40)) {
                snprintf(err, errlen, "%s: tensor '%s': bad shape", path, key);
                rc = -1; break;
            }
            dims[d] = json_integer_value(x);
            elems *= (uint64_t)dims[d];
            if (elems > (1ull << 40)) { snprintf(err, errlen, "%s: tensor '%s': too large", path, key); rc = -1; break; }
        }
        if (rc) break;
        json_t *o0 = json_array_get(offs, 0), *o1 = json_array_get(offs, 1);
        if (!json_is_integer(o0) || !json_is_integer(o1)) {
            snprintf(err, errlen, "%s: tensor '%s': bad data_offsets", path, key);
            rc = -1; break;
        }
        json_int_t b = json_integer_value(o0), e = json_integer_value(o1);
        if (b < 0 || e < b || (uint64_t)e > data_len || (uint64_t)(e - b) != elems * esz) {
            snprintf(err, errlen, "%s: tensor '%s': data_offsets [%lld, %lld] do not match its shape "
                     "or run past the end of the file", path, key, (long long)b, (long long)e);
            rc = -1; break;
        }
        for (uint64_t i = 0; i < h->n_t; i++)
            if (!strcmp(h->names[i], gname)) {
                snprintf(err, errlen, "%s: tensor '%s' appears twice", path, key);
                rc = -1; break;
            }
        if (rc) break;
        gguf_tensor *t = &h->t[h->n_t];
        h->names[h->n_t] = strdup(gname);
        if (!h->names[h->n_t]) { snprintf(err, errlen, "out of memory"); rc = -1; break; }
        t->name.s = h->names[h->n_t];
        t->name.n = strlen(gname);
        t->type = type;
        t->n_dims = (uint32_t)nd;
        /* safetensors [out, in] row-major is ggml's ne = {in, out}; [n, out, in] ne = {in, out, n} */
        t->ne[0] = dims[nd - 1];
        t->ne[1] = nd >= 2 ? dims[nd - 2] : 1;
        t->ne[2] = nd >= 3 ? dims[nd - 3] : 1;
        t->ne[3] = nd == 4 ? dims[0] : 1;
        t->data = sh->map + base + b;
        t->nbytes = (uint64_t)(e - b);
        h->trans[h->n_t] = tr && nd == 2;
        h->n_t++;
    }
    json_decref(root);
    if (!rc) rc = apart(h, first, path, err, errlen);
    /* GPT-2's Conv1D weights, [in][out]: copied into rows of in values; and
     * any tensor whose data does not start on a multiple of its element size
     * (a header whose length is not a multiple of 8): copied as is, so that
     * every tensor is read aligned (after apart, which looks at the file's
     * own ranges) */
    for (uint64_t i = first; !rc && i < h->n_t; i++) {
        gguf_tensor *t = &h->t[i];
        const size_t esz = t->nbytes / ((size_t)t->ne[0] * (size_t)t->ne[1] * (size_t)t->ne[2] * (size_t)t->ne[3]);
        const int odd = esz > 1 && (uintptr_t)t->data % esz != 0;
        if (!h->trans[i]) {
            if (!odd) continue;
            void *c = malloc((size_t)t->nbytes);
            if (!c) { snprintf(err, errlen, "out of memory"); rc = -1; break; }
            memcpy(c, t->data, (size_t)t->nbytes);
            h->owned[i] = c;
            t->data = c;
            continue;
        }
        size_t in = (size_t)t->ne[1], outn = (size_t)t->ne[0];
        uint8_t *c = malloc((size_t)t->nbytes);
        if (!c) { snprintf(err, errlen, "out of memory"); rc = -1; break; }
        for (size_t r = 0; r < outn; r++)
            for (size_t k = 0; k < in; k++)
                memcpy(c + (r * in + k) * esz, (const uint8_t *)t->data + (k * outn + r) * esz, esz);
        h->owned[i] = c;
        t->data = c;
        t->ne[0] = (int64_t)in;
        t->ne[1] = (int64_t)outn;
    }
    return rc;
}

/* config.json fields: each of the type and in the range it must have, else
 * an error naming the file, the field and what was expected. A null field
 * counts as absent. */
typedef struct cfgrd { const char *path; char *err; size_t errlen; } cfgrd;

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* An integral JSON number into *out; 0 when v is not one. */
static int jint_of(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) { *out = json_integer_value(v); return 1; }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e15) { *out = (int64_t)d; return 1; }
    }
    return 0;
}

static int cint(cfgrd *r, json_t *o, const char *k, int required, int64_t dflt, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(r->err, r->errlen, "%s: %s is missing (expected an integer in [%lld, %lld])", r->path, k,
                     (long long)lo, (long long)hi);
            return -1;
        }
        *out = dflt;
        return 0;
    }
    if (!jint_of(v, out)) {
        snprintf(r->err, r->errlen, "%s: %s is %s, expected an integer in [%lld, %lld]", r->path, k, jtype(v),
                 (long long)lo, (long long)hi);
        return -1;
    }
    if (*out < lo || *out > hi) {
        snprintf(r->err, r->errlen, "%s: %s is %lld, expected an integer in [%lld, %lld]", r->path, k,
                 (long long)*out, (long long)lo, (long long)hi);
        return -1;
    }
    return 0;
}

/* A number in (lo, hi] (lo itself excluded). */
static int cnum(cfgrd *r, json_t *o, const char *k, double dflt, double lo, double hi, double *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    if (!json_is_number(v)) {
        snprintf(r->err, r->errlen, "%s: %s is %s, expected a number in (%g, %g]", r->path, k, jtype(v), lo, hi);
        return -1;
    }
    *out = json_number_value(v);
    if (!(*out > lo && *out <= hi)) {
        snprintf(r->err, r->errlen, "%s: %s is %g, expected a number in (%g, %g]", r->path, k, *out, lo, hi);
        return -1;
    }
    return 0;
}

/* A token id below vocab, or null/absent (-1); lists (eos_token_id) give their first. */
static int ctoken(cfgrd *r, json_t *o, const char *k, int64_t vocab, int64_t *out)
{
    json_t *v = json_object_get(o, k);
    *out = -1;
    if (!v || json_is_null(v)) return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        int64_t id;
        if (!jint_of(x, &id) || id < 0 || id >= vocab) {
            if (jint_of(x, &id))
                snprintf(r->err, r->errlen, "%s: %s is %lld, expected a token id below vocab_size %lld", r->path, k,
                         (long long)id, (long long)vocab);
            else
                snprintf(r->err, r->errlen, "%s: %s is %s, expected a token id (or a list of them) below vocab_size %lld",
                         r->path, k, jtype(x), (long long)vocab);
            return -1;
        }
        if (i == 0) *out = id;
    }
    return 0;
}

/* The experts of a qwen3_moe or mixtral config. */
/* Families whose rope_scaling may be yarn (as the architecture table's
 * ARCH_YARN rows) */
static int yarn_arch(const char *a)
{
    return !strcmp(a, "gpt-oss") || !strcmp(a, "llama") || !strcmp(a, "qwen2") || !strcmp(a, "qwen3") ||
           !strcmp(a, "qwen3moe");
}

static int config_experts(hf_model *h, cfgrd *r, json_t *c, int mixtral)
{
    hf_config *g = &h->cfg;
    const char *nk = json_object_get(c, "num_experts") ? "num_experts" : "num_local_experts";
    if (cint(r, c, nk, 1, 0, 1, 512, &g->n_expert) ||
        cint(r, c, "num_experts_per_tok", 1, 0, 1, g->n_expert, &g->n_expert_used) ||
        cint(r, c, mixtral ? "intermediate_size" : "moe_intermediate_size", 1, 0, 1, 1 << 20, &g->ff_exp))
        return -1;
    g->norm_topk = 1;
    if (!mixtral) {
        json_t *nt = json_object_get(c, "norm_topk_prob");
        if (nt && !json_is_boolean(nt) && !json_is_null(nt)) {
            snprintf(r->err, r->errlen, "%s: norm_topk_prob is %s, expected true or false", r->path, jtype(nt));
            return -1;
        }
        g->norm_topk = json_is_true(nt);   /* (transformers' default: false) */
        /* every layer sparse: dense layers among them are not run here */
        int64_t step;
        json_t *mo = json_object_get(c, "mlp_only_layers");
        if (cint(r, c, "decoder_sparse_step", 0, 1, 1, 1, &step)) return -1;
        if (mo && !json_is_null(mo) && !(json_is_array(mo) && json_array_size(mo) == 0)) {
            snprintf(r->err, r->errlen, "%s: mlp_only_layers is not empty: dense layers in a mixture-of-experts "
                     "model are not supported (expected [])", r->path);
            return -1;
        }
    }
    return 0;
}

/* GPT-2's config.json: its own field names, no rope, GELU (tanh form) */
static int config_gpt2(cfgrd *r, json_t *c, hf_config *g)
{
    if (cint(r, c, "n_embd", 1, 0, 1, 65536, &g->hidden) || cint(r, c, "n_layer", 1, 0, 1, 4096, &g->layers) ||
        cint(r, c, "n_head", 1, 0, 1, 1024, &g->heads) || cint(r, c, "vocab_size", 1, 0, 1, 1 << 24, &g->vocab) ||
        cint(r, c, "n_positions", 0, 1024, 1, 1 << 24, &g->ctx))
        return -1;
    if (g->hidden % g->heads) {
        snprintf(r->err, r->errlen, "%s: n_embd %lld is not a multiple of n_head %lld", r->path,
                 (long long)g->hidden, (long long)g->heads);
        return -1;
    }
    g->kv_heads = g->heads;
    g->head_dim = g->hidden / g->heads;
    if (cint(r, c, "n_inner", 0, 4 * g->hidden, 1, 1 << 20, &g->ff) ||
        cnum(r, c, "layer_norm_epsilon", 1e-5, 0, 1, &g->eps) || ctoken(r, c, "bos_token_id", g->vocab, &g->bos) ||
        ctoken(r, c, "eos_token_id", g->vocab, &g->eos))
        return -1;
    json_t *act = json_object_get(c, "activation_function");
    const char *as = json_is_string(act) ? json_string_value(act) : NULL;
    if (act && !json_is_null(act) && !(as && (!strcmp(as, "gelu_new") || !strcmp(as, "gelu_pytorch_tanh")))) {
        snprintf(r->err, r->errlen, "%s: activation_function is %s%s%s, expected \"gelu_new\"", r->path,
                 as ? "\"" : jtype(act), as ? as : "", as ? "\"" : "");
        return -1;
    }
    json_t *tie = json_object_get(c, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie) && !json_is_null(tie)) {
        snprintf(r->err, r->errlen, "%s: tie_word_embeddings is %s, expected true or false", r->path, jtype(tie));
        return -1;
    }
    g->tie = json_is_boolean(tie) ? json_is_true(tie) : -1;
    g->rope_theta = 10000.0;
    return 0;
}

/* gpt_oss: the sliding window and its layer pattern (every even layer
 * windowed, the odd ones full, as GGUF files imply), the SwiGLU clamp. */
static int config_gptoss(cfgrd *r, json_t *c, hf_config *g)
{
    int64_t layers = 0;
    if (cint(r, c, "sliding_window", 1, 0, 1, 1 << 24, &g->sliding_window) ||
        cint(r, c, "num_hidden_layers", 1, 0, 1, 4096, &layers) ||
        cnum(r, c, "swiglu_limit", 7, 0, 1e6, &g->swiglu_limit))
        return -1;
    json_t *lt = json_object_get(c, "layer_types");
    if (!lt || json_is_null(lt)) return 0;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != layers) {
        snprintf(r->err, r->errlen, "%s: layer_types is %s of %zu, expected a list of num_hidden_layers %lld",
                 r->path, jtype(lt), json_is_array(lt) ? json_array_size(lt) : (size_t)0, (long long)layers);
        return -1;
    }
    for (int64_t i = 0; i < layers; i++) {
        json_t *v = json_array_get(lt, (size_t)i);
        const char *want = i % 2 ? "full_attention" : "sliding_attention";
        if (!json_is_string(v) || strcmp(json_string_value(v), want)) {
            snprintf(r->err, r->errlen, "%s: layer_types[%lld] is %s%s%s, expected \"%s\" (gpt-oss alternates "
                     "sliding and full attention, sliding first)", r->path, (long long)i,
                     json_is_string(v) ? "\"" : jtype(v), json_is_string(v) ? json_string_value(v) : "",
                     json_is_string(v) ? "\"" : "", want);
            return -1;
        }
    }
    return 0;
}

static int config_load(hf_model *h, const char *dir, char *err, size_t errlen)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *buf;
    size_t len;
    if (mf_read(path, 16u << 20, 0, &buf, &len, err, errlen)) return -1;
    json_error_t je;
    json_t *c = json_loadb(buf, len, 0, &je);
    free(buf);
    if (!c || !json_is_object(c)) {
        if (c) snprintf(err, errlen, "%s: is %s, expected a JSON object", path, jtype(c));
        else snprintf(err, errlen, "%s: line %d: %s", path, je.line, je.text);
        json_decref(c);
        return -1;
    }
    hf_config *g = &h->cfg;
    cfgrd r = { path, err, errlen };
    int rc = -1;
    json_t *mt = json_object_get(c, "model_type");
    const char *t = json_is_string(mt) ? json_string_value(mt) : "";
    if (strcmp(t, "llama") && strcmp(t, "qwen2") && strcmp(t, "qwen3") && strcmp(t, "qwen3_moe") &&
        strcmp(t, "mixtral") && strcmp(t, "gpt2") &&
        strcmp(t, "gpt_oss")) {
        snprintf(err, errlen, "%s: model_type '%s' is not supported (supported: llama, qwen2, qwen3, qwen3_moe, "
                 "mixtral, gpt2, gpt_oss)", path, t);
        goto out;
    }
    /* (as GGUF names them: Mixtral is the llama architecture with experts) */
    snprintf(g->arch, sizeof g->arch, "%s", !strcmp(t, "qwen3_moe") ? "qwen3moe" : !strcmp(t, "mixtral") ? "llama"
                                            : !strcmp(t, "gpt_oss") ? "gpt-oss" : t);
    int gptoss = !strcmp(t, "gpt_oss");
    if ((!strcmp(t, "qwen3_moe") || !strcmp(t, "mixtral") || gptoss) &&
        config_experts(h, &r, c, !strcmp(t, "mixtral") || gptoss))
        goto out;
    if (gptoss && config_gptoss(&r, c, g)) goto out;
    json_t *qc = json_object_get(c, "quantization_config");
    if (qc && !json_is_null(qc)) {
        json_t *qm = json_is_object(qc) ? json_object_get(qc, "quant_method") : NULL;
        const char *m = json_is_string(qm) ? json_string_value(qm) : "?";
        if (!gptoss || strcmp(m, "mxfp4")) {
            snprintf(err, errlen, "%s: quantization_config.quant_method \"%s\" is not supported (expected an "
                     "unquantized checkpoint, or \"mxfp4\" for gpt_oss)", path, m);
            goto out;
        }
    }
    if (!strcmp(t, "gpt2")) { rc = config_gpt2(&r, c, g); goto out; }
    if (cint(&r, c, "hidden_size", 1, 0, 1, 65536, &g->hidden) ||
        cint(&r, c, "num_hidden_layers", 1, 0, 1, 4096, &g->layers) ||
        cint(&r, c, "num_attention_heads", 1, 0, 1, 1024, &g->heads) ||
        cint(&r, c, "num_key_value_heads", 0, g->heads, 1, g->heads, &g->kv_heads) ||
        cint(&r, c, "intermediate_size", 1, 0, 1, 1 << 20, &g->ff) ||
        cint(&r, c, "vocab_size", 1, 0, 1, 1 << 24, &g->vocab) ||
        cint(&r, c, "max_position_embeddings", 0, 4096, 1, 1 << 24, &g->ctx))
        goto out;
    if (g->heads % g->kv_heads) {
        snprintf(err, errlen, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", path,
                 (long long)g->heads, (long long)g->kv_heads);
        goto out;
    }
    json_t *hd = json_object_get(c, "head_dim");
    if ((!hd || json_is_null(hd)) && g->hidden % g->heads) {
        snprintf(err, errlen, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld "
                 "(and there is no head_dim)", path, (long long)g->hidden, (long long)g->heads);
        goto out;
    }
    if (cint(&r, c, "head_dim", 0, g->hidden / g->heads, 2, 1024, &g->head_dim)) goto out;
    if (g->head_dim % 2) {
        snprintf(err, errlen, "%s: head_dim %lld is odd, expected an even number", path, (long long)g->head_dim);
        goto out;
    }
    if (cnum(&r, c, "rms_norm_eps", 1e-6, 0, 1, &g->eps) ||
        ctoken(&r, c, "bos_token_id", g->vocab, &g->bos) || ctoken(&r, c, "eos_token_id", g->vocab, &g->eos))
        goto out;
    json_t *tie = json_object_get(c, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie) && !json_is_null(tie)) {
        snprintf(err, errlen, "%s: tie_word_embeddings is %s, expected true or false", path, jtype(tie));
        goto out;
    }
    g->tie = json_is_boolean(tie) ? json_is_true(tie) : -1;
    /* the MLP is SwiGLU: another activation would compute something else */
    json_t *act = json_object_get(c, "hidden_act");
    if (act && !json_is_null(act) && !(json_is_string(act) && !strcmp(json_string_value(act), "silu"))) {
        snprintf(err, errlen, "%s: hidden_act is %s%s%s, expected \"silu\"", path,
                 json_is_string(act) ? "\"" : jtype(act), json_is_string(act) ? json_string_value(act) : "",
                 json_is_string(act) ? "\"" : "");
        goto out;
    }
    /* rope base: (1, FLT_MAX] (1 or below turns no pair, inf or NaN spoils every one) */
    if (cnum(&r, c, "rope_theta", 10000.0, 1, FLT_MAX, &g->rope_theta)) goto out;
    json_t *rp = json_object_get(c, "rope_parameters");
    if (!json_is_object(rp)) rp = json_object_get(c, "rope_scaling");
    if (rp && !json_is_object(rp) && !json_is_null(rp)) {
        snprintf(err, errlen, "%s: rope_scaling is %s, expected an object or null", path, jtype(rp));
        goto out;
    }
    if (json_is_object(rp)) {
        if (cnum(&r, rp, "rope_theta", g->rope_theta, 1, FLT_MAX, &g->rope_theta)) goto out;
        json_t *rt = json_object_get(rp, "rope_type");
        if (!json_is_string(rt)) rt = json_object_get(rp, "type");
        const char *rts = json_is_string(rt) ? json_string_value(rt) : "default";
        if (!strcmp(rts, "llama3")) {
            g->rope_llama3 = 1;
            if (cnum(&r, rp, "factor", 8, 0, 1e6, &g->rope_factor) ||
                cnum(&r, rp, "low_freq_factor", 1, 0, 1e6, &g->rope_low) ||
                cnum(&r, rp, "high_freq_factor", 4, 0, 1e6, &g->rope_high) ||
                cnum(&r, rp, "original_max_position_embeddings", 8192, 0, 1 << 24, &g->rope_orig_ctx))
                goto out;
            if (g->rope_high <= g->rope_low) {
                snprintf(err, errlen, "%s: rope_scaling high_freq_factor %g is not above low_freq_factor %g", path,
                         g->rope_high, g->rope_low);
                goto out;
            }
        } else if (!strcmp(rts, "yarn") && yarn_arch(g->arch)) {
            /* transformers' _compute_yarn_parameters */
            g->rope_yarn = 1;
            double ms = 0, msa = 0;
            if (cnum(&r, rp, "factor", 1, 0, 1e6, &g->rope_factor) ||
                cnum(&r, rp, "original_max_position_embeddings", (double)g->ctx, 0, 1 << 24, &g->rope_orig_ctx) ||
                cnum(&r, rp, "beta_fast", 32, 0, 1e6, &g->yarn_beta_fast) ||
                cnum(&r, rp, "beta_slow", 1, 0, 1e6, &g->yarn_beta_slow) ||
                cnum(&r, rp, "attention_factor", -1, 0, 1e6, &g->yarn_attn) ||
                cnum(&r, rp, "mscale", 0, -1, 1e6, &ms) || cnum(&r, rp, "mscale_all_dim", 0, -1, 1e6, &msa))
                goto out;
            if (g->yarn_beta_fast <= g->yarn_beta_slow) {
                snprintf(err, errlen, "%s: rope_parameters beta_fast %g is not above beta_slow %g", path,
                         g->yarn_beta_fast, g->yarn_beta_slow);
                goto out;
            }
            json_t *tr = json_object_get(rp, "truncate");
            if (tr && !json_is_boolean(tr) && !json_is_null(tr)) {
                snprintf(err, errlen, "%s: rope_parameters truncate is %s, expected true or false", path, jtype(tr));
                goto out;
            }
            g->yarn_truncate = !json_is_false(tr);   /* (transformers' default: true) */
            double f = g->rope_factor;
#define YARN_MSCALE(m) (f <= 1 ? 1.0 : 0.1 * (m) * log(f) + 1.0)
            if (g->yarn_attn < 0) g->yarn_attn = ms > 0 && msa > 0 ? YARN_MSCALE(ms) / YARN_MSCALE(msa) : YARN_MSCALE(1);
#undef YARN_MSCALE
        } else if (strcmp(rts, "default")) {
            snprintf(err, errlen, "%s: rope type '%s' is not supported (supported: default, llama3%s)", path, rts,
                     yarn_arch(g->arch) ? ", yarn" : "");
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(c);
    return rc;
}

/* Each layer's per-expert matrices (blk.N.ffn_<m>_exp.<e>) copied into one
 * stacked tensor blk.N.ffn_<m>_exps.weight of ne {in, out, n_expert}, as GGUF
 * stores them; every expert must be there, each of one shape and type. */
static int stack_experts(hf_model *h, const char *dir, char *err, size_t errlen)
{
    static const char *const mats[3] = { "gate", "up", "down" };
    int64_t X = h->cfg.n_expert;
    for (int64_t l = 0; l < h->cfg.layers; l++)
        for (int k = 0; k < 3; k++) {
            char nm[96];
            const gguf_tensor *t0 = NULL;
            int seen = 0;
            for (int64_t e = 0; e < X; e++) {
                snprintf(nm, sizeof nm, "blk.%lld.ffn_%s_exp.%lld", (long long)l, mats[k], (long long)e);
                const gguf_tensor *t = hf_tensor_find(h, nm);
                seen += t != NULL;
                if (!t0) t0 = t;
            }
            if (!seen) continue;
            if (seen != X) {
                snprintf(err, errlen, "%s: layer %lld has %s_proj weights for %d of its %lld experts (config.json "
                         "num_experts; expected all)", dir, (long long)l, mats[k], seen, (long long)X);
                return -1;
            }
            if (h->n_t >= h->cap) { snprintf(err, errlen, "%s: too many tensors", dir); return -1; }
            uint8_t *buf = malloc((size_t)(t0->nbytes * (uint64_t)X));
            void **st = realloc(h->stacked, (size_t)(h->n_stacked + 1) * sizeof *st);
            if (!buf || !st) { free(buf); if (st) h->stacked = st; snprintf(err, errlen, "out of memory"); return -1; }
            h->stacked = st;
            h->stacked[h->n_stacked++] = buf;
            for (int64_t e = 0; e < X; e++) {
                snprintf(nm, sizeof nm, "blk.%lld.ffn_%s_exp.%lld", (long long)l, mats[k], (long long)e);
                const gguf_tensor *t = hf_tensor_find(h, nm);
                if (t->type != t0->type || t->ne[0] != t0->ne[0] || t->ne[1] != t0->ne[1]) {
                    snprintf(err, errlen, "%s: layer %lld expert %lld's %s_proj differs in shape or dtype from "
                             "expert 0's (expected all alike)", dir, (long long)l, (long long)e, mats[k]);
                    return -1;
                }
                memcpy(buf + (size_t)(t0->nbytes * (uint64_t)e), t->data, (size_t)t0->nbytes);
            }
            snprintf(nm, sizeof nm, "blk.%lld.ffn_%s_exps.weight", (long long)l, mats[k]);
            gguf_tensor *t = &h->t[h->n_t];
            h->names[h->n_t] = strdup(nm);
            if (!h->names[h->n_t]) { snprintf(err, errlen, "out of memory"); return -1; }
            *t = *t0;
            t->name.s = h->names[h->n_t];
            t->name.n = strlen(nm);
            t->n_dims = 3;
            t->ne[2] = X;
            t->data = buf;
            t->nbytes = t0->nbytes * (uint64_t)X;
            h->n_t++;
        }
    return 0;
}

/* A tensor of this model's own buffer (freed with it) under GGUF name nm. */
static gguf_tensor *add_owned(hf_model *h, const char *nm, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                              size_t esz, char *err, size_t errlen)
{
    if (h->n_t >= h->cap) { snprintf(err, errlen, "too many tensors"); return NULL; }
    size_t nbytes = (size_t)(ne0 * ne1 * ne2) * esz;
    uint8_t *buf = malloc(nbytes ? nbytes : 1);
    void **st = realloc(h->stacked, (size_t)(h->n_stacked + 1) * sizeof *st);
    if (st) h->stacked = st;
    char *name = strdup(nm);
    if (!buf || !st || !name) { free(buf); free(name); snprintf(err, errlen, "out of memory"); return NULL; }
    h->stacked[h->n_stacked++] = buf;
    h->names[h->n_t] = name;
    gguf_tensor *t = &h->t[h->n_t++];
    *t = (gguf_tensor){ .name = { name, strlen(name) }, .type = type, .n_dims = ne2 > 1 ? 3 : 2,
                        .ne = { ne0, ne1, ne2, 1 }, .data = buf, .nbytes = nbytes };
    return t;
}

/* gpt_oss expert biases: gate_up_proj_bias [X][2F] (gate and up
 * interleaved) and down_proj_bias [X][E] into the f32 ffn_{gate,up,down}_exps
 * biases gb, ub [X][F] and db [X][E]; -1 with err when out of memory. */
static int gptoss_biases(const gguf_tensor *gu, const gguf_tensor *dn, int64_t X, int64_t F, int64_t E, float *gb,
                         float *ub, float *db, char *err, size_t errlen)
{
    float *row = malloc((size_t)(2 * F) * 4);
    if (!row) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int64_t x = 0; x < X; x++) {
        qt_dequant_row(gu->type, (const uint8_t *)gu->data + (size_t)x * qt_row_size(gu->type, 2 * F), row, 2 * F);
        for (int64_t f = 0; f < F; f++) {
            gb[x * F + f] = row[2 * f];
            ub[x * F + f] = row[2 * f + 1];
        }
        qt_dequant_row(dn->type, (const uint8_t *)dn->data + (size_t)x * qt_row_size(dn->type, E), db + x * E, E);
    }
    free(row);
    return 0;
}

/* gpt_oss experts as released, in MXFP4: gate_up_proj_blocks [X][2F][E/32][16]
 * and _scales [X][2F][E/32] (rows: gate and up interleaved), down_proj_blocks
 * [X][E][F/32][16] and _scales [X][E][F/32]; rows of out, 32-value blocks.
 * A code byte holds values 2k (low nibble) and 2k + 1; GGUF's MXFP4 block
 * is the scale byte, then 16 bytes holding values j (low) and j + 16. The
 * 4-bit codes and E8M0 scales are the same on both sides (as llama.cpp's
 * converter moves them): no value changes. */
static void mxfp4_block(const uint8_t *codes, uint8_t scale, uint8_t *out)
{
    uint8_t v[32];
    for (int k = 0; k < 16; k++) {
        v[2 * k] = codes[k] & 15;
        v[2 * k + 1] = codes[k] >> 4;
    }
    out[0] = scale;
    for (int j = 0; j < 16; j++) out[1 + j] = (uint8_t)(v[j] | v[j + 16] << 4);
}

static int gptoss_mxfp4(hf_model *h, const char *dir, int64_t l, char *err, size_t errlen)
{
    int64_t X = h->cfg.n_expert, E = h->cfg.hidden, F = h->cfg.ff_exp;
    static const char *const part[6] = { "gptoss_gate_up_blocks", "gptoss_gate_up_scales", "gptoss_down_blocks",
                                         "gptoss_down_scales", "gptoss_gate_up_b", "gptoss_down_b" };
    static const char *const hfn[6] = { "gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                        "down_proj_scales", "gate_up_proj_bias", "down_proj_bias" };
    const gguf_tensor *t[6];
    char nm[96];
    if (E % 32 || F % 32) {
        snprintf(err, errlen, "%s: hidden_size %lld and intermediate_size %lld must be multiples of 32 for MXFP4 "
                 "experts", dir, (long long)E, (long long)F);
        return -1;
    }
    const int64_t want[6][4] = { { 16, E / 32, 2 * F, X }, { E / 32, 2 * F, X, 1 }, { 16, F / 32, E, X },
                                 { F / 32, E, X, 1 }, { 2 * F, X, 1, 1 }, { E, X, 1, 1 } };
    for (int k = 0; k < 6; k++) {
        snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)l, part[k]);
        t[k] = hf_tensor_find(h, nm);
        if (!t[k]) {
            snprintf(err, errlen, "%s: layer %lld lacks mlp.experts.%s (MXFP4 experts need gate_up_proj and "
                     "down_proj _blocks and _scales, and both biases)", dir, (long long)l, hfn[k]);
            return -1;
        }
        if (t[k]->ne[0] != want[k][0] || t[k]->ne[1] != want[k][1] || t[k]->ne[2] != want[k][2] ||
            t[k]->ne[3] != want[k][3]) {
            char got[96], exp[96];
            int nd = k == 0 || k == 2 ? 4 : k < 4 ? 3 : 2;
            int g = 0, x = 0;
            g += snprintf(got + g, sizeof got - (size_t)g, "[");
            x += snprintf(exp + x, sizeof exp - (size_t)x, "[");
            for (int d = nd - 1; d >= 0; d--) {
                g += snprintf(got + g, sizeof got - (size_t)g, "%lld%s", (long long)t[k]->ne[d], d ? ", " : "]");
                x += snprintf(exp + x, sizeof exp - (size_t)x, "%lld%s", (long long)want[k][d], d ? ", " : "]");
            }
            snprintf(err, errlen, "%s: layer %lld mlp.experts.%s has shape %s, expected %s", dir, (long long)l,
                     hfn[k], got, exp);
            return -1;
        }
    }
    /* rows of E (gate, up) or F (down) values, 17 bytes a block */
    const int64_t rg = E / 32 * 17, rd = F / 32 * 17;
    static const char *const out[6] = { "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                                        "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias" };
    const int64_t dims[6][3] = { { rg, F, X }, { rg, F, X }, { rd, E, X }, { F, X, 1 }, { F, X, 1 }, { E, X, 1 } };
    gguf_tensor *o[6];
    for (int k = 0; k < 6; k++) {
        snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)l, out[k]);
        o[k] = add_owned(h, nm, k < 3 ? QT_MXFP4 : QT_F32, dims[k][0], dims[k][1], dims[k][2], k < 3 ? 1 : 4, err,
                         errlen);
        if (!o[k]) return -1;
        if (k < 3) o[k]->ne[0] = k < 2 ? E : F;   /* (sized in bytes above) */
    }
    const uint8_t *gb = t[0]->data, *gs = t[1]->data, *db = t[2]->data, *ds = t[3]->data;
    for (int64_t x = 0; x < X; x++) {
        for (int64_t r = 0; r < 2 * F; r++) {   /* even rows gate, odd rows up */
            uint8_t *dst = (uint8_t *)o[r & 1]->data + (size_t)((x * F + r / 2) * rg);
            for (int64_t b = 0; b < E / 32; b++) {
                const size_t i = (size_t)((x * 2 * F + r) * (E / 32) + b);
                mxfp4_block(gb + i * 16, gs[i], dst + b * 17);
            }
        }
        for (int64_t r = 0; r < E; r++) {
            uint8_t *dst = (uint8_t *)o[2]->data + (size_t)((x * E + r) * rd);
            for (int64_t b = 0; b < F / 32; b++) {
                const size_t i = (size_t)((x * E + r) * (F / 32) + b);
                mxfp4_block(db + i * 16, ds[i], dst + b * 17);
            }
        }
    }
    return gptoss_biases(t[4], t[5], X, F, E, (float *)o[3]->data, (float *)o[4]->data,
                         (float *)o[5]->data, err, errlen);
}

/* gpt_oss experts: gate_up_proj [X][E][2F] (gate and up interleaved, the
 * even and odd columns) and down_proj [X][F][E] are [in][out]; GGUF's
 * ffn_{gate,up}_exps.weight are ne {E, F, X} and ffn_down_exps.weight ne
 * {F, E, X} (rows of in). The biases split likewise, widened to f32. */
static int gptoss_experts(hf_model *h, const char *dir, char *err, size_t errlen)
{
    int64_t X = h->cfg.n_expert, E = h->cfg.hidden, F = h->cfg.ff_exp;
    for (int64_t l = 0; l < h->cfg.layers; l++) {
        static const char *const part[4] = { "gptoss_gate_up", "gptoss_gate_up_b", "gptoss_down", "gptoss_down_b" };
        const int64_t want[4][3] = { { 2 * F, E, X }, { 2 * F, X, 1 }, { E, F, X }, { E, X, 1 } };
        static const char *const hfn[4] = { "gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias" };
        const gguf_tensor *t[4];
        int seen = 0;
        char nm[96];
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)l, part[k]);
            t[k] = hf_tensor_find(h, nm);
            seen += t[k] != NULL;
        }
        snprintf(nm, sizeof nm, "blk.%lld.gptoss_gate_up_blocks", (long long)l);
        if (!t[0] && !t[2] && hf_tensor_find(h, nm)) {
            if (gptoss_mxfp4(h, dir, l, err, errlen)) return -1;
            continue;
        }
        if (!seen) continue;
        for (int k = 0; k < 4; k++) {
            if (!t[k]) {
                snprintf(err, errlen, "%s: layer %lld lacks mlp.experts.%s (expected all four of gate_up_proj, "
                         "down_proj and their biases)", dir, (long long)l, hfn[k]);
                return -1;
            }
            if (t[k]->ne[0] != want[k][0] || t[k]->ne[1] != want[k][1] || t[k]->ne[2] != want[k][2]) {
                /* (in safetensors' order: the reverse of ne) */
                static const char *const legend[4] = {
                    "num_local_experts, hidden_size, 2 x intermediate_size", "num_local_experts, 2 x intermediate_size",
                    "num_local_experts, intermediate_size, hidden_size", "num_local_experts, hidden_size" };
                int three = k % 2 == 0;
                char got[80], exp[80];
                if (three) {
                    snprintf(got, sizeof got, "[%lld, %lld, %lld]", (long long)t[k]->ne[2], (long long)t[k]->ne[1],
                             (long long)t[k]->ne[0]);
                    snprintf(exp, sizeof exp, "[%lld, %lld, %lld]", (long long)want[k][2], (long long)want[k][1],
                             (long long)want[k][0]);
                } else {
                    snprintf(got, sizeof got, "[%lld, %lld]", (long long)t[k]->ne[1], (long long)t[k]->ne[0]);
                    snprintf(exp, sizeof exp, "[%lld, %lld]", (long long)want[k][1], (long long)want[k][0]);
                }
                snprintf(err, errlen, "%s: layer %lld mlp.experts.%s has shape %s, expected %s (%s)", dir,
                         (long long)l, hfn[k], got, exp, legend[k]);
                return -1;
            }
        }
        size_t esz = t[0]->nbytes / (size_t)(2 * F * E * X), dsz = t[2]->nbytes / (size_t)(F * E * X);
        gguf_tensor *o[6];
        static const char *const out[6] = { "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                                            "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias" };
        const int64_t dims[6][3] = { { E, F, X }, { E, F, X }, { F, E, X }, { F, X, 1 }, { F, X, 1 }, { E, X, 1 } };
        for (int k = 0; k < 6; k++) {
            snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)l, out[k]);
            o[k] = add_owned(h, nm, k < 2 ? t[0]->type : k == 2 ? t[2]->type : QT_F32, dims[k][0], dims[k][1],
                             dims[k][2], k < 2 ? esz : k == 2 ? dsz : 4, err, errlen);
            if (!o[k]) return -1;
        }
        const uint8_t *gu = t[0]->data, *dn = t[2]->data;
        for (int64_t x = 0; x < X; x++)
            for (int64_t f = 0; f < F; f++)
                for (int64_t e = 0; e < E; e++) {
                    size_t dst = (size_t)((x * F + f) * E + e);
                    memcpy((uint8_t *)o[0]->data + dst * esz, gu + (size_t)((x * E + e) * 2 * F + 2 * f) * esz, esz);
                    memcpy((uint8_t *)o[1]->data + dst * esz, gu + (size_t)((x * E + e) * 2 * F + 2 * f + 1) * esz, esz);
                    memcpy((uint8_t *)o[2]->data + (size_t)((x * E + e) * F + f) * dsz,
                           dn + (size_t)((x * F + f) * E + e) * dsz, dsz);
                }
        if (gptoss_biases(t[1], t[3], X, F, E, (float *)o[3]->data, (float *)o[4]->data,
                          (float *)o[5]->data, err, errlen)) return -1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int hf_open(hf_model **out, const char *dir, char *err, size_t errlen)
{
    *out = NULL;
    hf_model *h = calloc(1, sizeof *h);
    if (!h) { snprintf(err, errlen, "out of memory"); return -1; }
    char *files[HF_MAX_SHARDS];
    int nf = 0;
    if (config_load(h, dir, err, errlen)) goto fail;
    DIR *d = opendir(dir);
    if (!d) { snprintf(err, errlen, "%s: cannot open directory: %s", dir, strerror(errno)); goto fail; }
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors") && nf < HF_MAX_SHARDS)
            files[nf++] = strdup(de->d_name);
    }
    closedir(d);
    if (nf == 0) { snprintf(err, errlen, "%s: no *.safetensors files", dir); goto fail; }
    qsort(files, (size_t)nf, sizeof *files, cmp_str);
    h->shards = calloc((size_t)nf, sizeof *h->shards);
    /* at most (1 + 15 per layer + 3) tensors are kept, and each expert's 3
     * with their 3 stacked copies */
    size_t cap = (size_t)h->cfg.layers * (25 + 3 * ((size_t)h->cfg.n_expert + 1)) + 8;
    h->cap = cap;
    h->t = calloc(cap, sizeof *h->t);
    h->names = calloc(cap, sizeof *h->names);
    h->owned = calloc(cap, sizeof *h->owned);
    h->trans = calloc(cap, 1);
    if (!h->shards || !h->t || !h->names || !h->owned || !h->trans) { snprintf(err, errlen, "out of memory"); goto fail; }
    for (int i = 0; i < nf; i++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (!files[i] || shard_load(h, p, err, errlen)) goto fail;
    }
    if (stack_experts(h, dir, err, errlen) || gptoss_experts(h, dir, err, errlen)) goto fail;
    for (int i = 0; i < nf; i++) free(files[i]);
    *out = h;
    return 0;
fail:
    for (int i = 0; i < nf; i++) free(files[i]);
    hf_close(h);
    return -1;
}

int hf_check(hf_model *h, int quick, char *why, size_t n)
{
    int rc = MF_SAME;
    for (int i = 0; i < h->n_shards && rc != MF_CHANGED; i++) {
        char w[300];
        int r = mf_check(&h->shards[i], quick, w, sizeof w);
        if (r == MF_CHANGED || (r == MF_REPLACED && rc == MF_SAME)) {
            rc = r;
            snprintf(why, n, "%s", w);
        }
    }
    return rc;
}

const gguf_tensor *hf_tensor_find(const hf_model *h, const char *name)
{
    for (uint64_t i = 0; i < h->n_t; i++)
        if (!strcmp(h->names[i], name)) return &h->t[i];
    return NULL;
}
