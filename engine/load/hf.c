/* hf.c — safetensors shards and config.json. */
#include "engine/load/hf.h"
#include "engine/quant/qtypes.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_MAX_SHARDS  1024
#define HF_MAX_HEADER  (256u << 20)

typedef struct shard { const uint8_t *map; size_t size; } shard;

struct hf_model {
    hf_config cfg;
    shard *shards; int n_shards;
    gguf_tensor *t; uint64_t n_t, cap;
    char **names;              /* storage of the GGUF names */
};

const hf_config *hf_cfg(const hf_model *h) { return &h->cfg; }
uint64_t hf_n_tensors(const hf_model *h) { return h->n_t; }

void hf_close(hf_model *h)
{
    if (!h) return;
    for (int i = 0; i < h->n_shards; i++)
        if (h->shards[i].map) munmap((void *)h->shards[i].map, h->shards[i].size);
    for (uint64_t i = 0; i < h->n_t; i++) free(h->names[i]);
    free(h->names);
    free(h->shards);
    free(h->t);
    free(h);
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
    }
    return 0;
}

static int dtype_of(const char *s, uint32_t *t, size_t *esz)
{
    if (!strcmp(s, "BF16")) { *t = QT_BF16; *esz = 2; return 0; }
    if (!strcmp(s, "F16")) { *t = QT_F16; *esz = 2; return 0; }
    if (!strcmp(s, "F32")) { *t = QT_F32; *esz = 4; return 0; }
    return -1;
}

static int shard_load(hf_model *h, const char *path, char *err, size_t errlen)
{
    if (h->n_shards >= HF_MAX_SHARDS) { snprintf(err, errlen, "%s: too many shards", path); return -1; }
    shard *sh = &h->shards[h->n_shards];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return -1; }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < 8) {
        snprintf(err, errlen, "%s: not a safetensors file (too small)", path);
        close(fd);
        return -1;
    }
    sh->size = (size_t)st.st_size;
    void *m = mmap(NULL, sh->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) { snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno)); return -1; }
    sh->map = m;
    h->n_shards++;
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
        if (!map_name(key, gname, sizeof gname)) continue;   /* e.g. rotary inv_freq buffers */
        int layer;
        if (sscanf(gname, "blk.%d.", &layer) == 1 && layer >= h->cfg.layers) {
            snprintf(err, errlen, "%s: tensor '%s' belongs to layer %d but config.json has %lld layers",
                     path, key, layer, (long long)h->cfg.layers);
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
        if (dtype_of(json_string_value(dt), &type, &esz)) {
            snprintf(err, errlen, "%s: tensor '%s' has dtype %s (supported: BF16, F16, F32)", path, key,
                     json_string_value(dt));
            rc = -1; break;
        }
        size_t nd = json_array_size(shp);
        if (nd < 1 || nd > 2) {
            snprintf(err, errlen, "%s: tensor '%s' has %zu dimensions (expected 1 or 2)", path, key, nd);
            rc = -1; break;
        }
        int64_t dims[2] = { 1, 1 };
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
        /* safetensors [out, in] row-major is ggml's ne = {in, out} */
        t->ne[0] = nd == 2 ? dims[1] : dims[0];
        t->ne[1] = nd == 2 ? dims[0] : 1;
        t->ne[2] = t->ne[3] = 1;
        t->data = sh->map + base + b;
        t->nbytes = (uint64_t)(e - b);
        h->n_t++;
    }
    json_decref(root);
    return rc;
}

static int64_t jint(json_t *o, const char *k, int64_t dflt)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v)) return json_integer_value(v);
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0)))
        return json_integer_value(json_array_get(v, 0));
    return dflt;
}

static double jnum(json_t *o, const char *k, double dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static int config_load(hf_model *h, const char *dir, char *err, size_t errlen)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (!c || !json_is_object(c)) {
        snprintf(err, errlen, "%s: %s", path, c ? "not a JSON object" : je.text);
        json_decref(c);
        return -1;
    }
    hf_config *g = &h->cfg;
    json_t *mt = json_object_get(c, "model_type");
    const char *t = json_is_string(mt) ? json_string_value(mt) : "";
    if (strcmp(t, "llama") && strcmp(t, "qwen2") && strcmp(t, "qwen3")) {
        snprintf(err, errlen, "%s: model_type '%s' is not supported (supported: llama, qwen2, qwen3)", path, t);
        json_decref(c);
        return -1;
    }
    snprintf(g->arch, sizeof g->arch, "%s", t);
    g->hidden = jint(c, "hidden_size", -1);
    g->layers = jint(c, "num_hidden_layers", -1);
    g->heads = jint(c, "num_attention_heads", -1);
    g->kv_heads = jint(c, "num_key_value_heads", g->heads);
    g->ff = jint(c, "intermediate_size", -1);
    g->vocab = jint(c, "vocab_size", -1);
    g->ctx = jint(c, "max_position_embeddings", 4096);
    g->head_dim = jint(c, "head_dim", g->heads > 0 ? g->hidden / g->heads : -1);
    g->eps = jnum(c, "rms_norm_eps", 1e-6);
    g->bos = jint(c, "bos_token_id", -1);
    g->eos = jint(c, "eos_token_id", -1);
    json_t *tie = json_object_get(c, "tie_word_embeddings");
    g->tie = json_is_true(tie);
    g->rope_theta = jnum(c, "rope_theta", 10000.0);
    json_t *rp = json_object_get(c, "rope_parameters");
    if (!json_is_object(rp)) rp = json_object_get(c, "rope_scaling");
    if (json_is_object(rp)) {
        g->rope_theta = jnum(rp, "rope_theta", g->rope_theta);
        json_t *rt = json_object_get(rp, "rope_type");
        if (!json_is_string(rt)) rt = json_object_get(rp, "type");
        const char *rts = json_is_string(rt) ? json_string_value(rt) : "default";
        if (!strcmp(rts, "llama3")) {
            g->rope_llama3 = 1;
            g->rope_factor = jnum(rp, "factor", 8);
            g->rope_low = jnum(rp, "low_freq_factor", 1);
            g->rope_high = jnum(rp, "high_freq_factor", 4);
            g->rope_orig_ctx = jnum(rp, "original_max_position_embeddings", 8192);
        } else if (strcmp(rts, "default")) {
            snprintf(err, errlen, "%s: rope type '%s' is not supported (supported: default, llama3)", path, rts);
            json_decref(c);
            return -1;
        }
    }
    json_decref(c);
    if (g->hidden <= 0 || g->layers <= 0 || g->layers > 4096 || g->heads <= 0 || g->kv_heads <= 0 || g->ff <= 0 || g->vocab <= 0 ||
        g->head_dim <= 0) {
        snprintf(err, errlen, "%s: missing or invalid hidden_size, num_hidden_layers, num_attention_heads, "
                 "intermediate_size or vocab_size", path);
        return -1;
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
    /* at most (1 + 14 per layer + 3) tensors are kept */
    size_t cap = (size_t)h->cfg.layers * 14 + 8;
    h->cap = cap;
    h->t = calloc(cap, sizeof *h->t);
    h->names = calloc(cap, sizeof *h->names);
    if (!h->shards || !h->t || !h->names) { snprintf(err, errlen, "out of memory"); goto fail; }
    for (int i = 0; i < nf; i++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (!files[i] || shard_load(h, p, err, errlen)) goto fail;
    }
    for (int i = 0; i < nf; i++) free(files[i]);
    *out = h;
    return 0;
fail:
    for (int i = 0; i < nf; i++) free(files[i]);
    hf_close(h);
    return -1;
}

const gguf_tensor *hf_tensor_find(const hf_model *h, const char *name)
{
    for (uint64_t i = 0; i < h->n_t; i++)
        if (!strcmp(h->names[i], name)) return &h->t[i];
    return NULL;
}
