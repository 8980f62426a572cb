/* model.c — hyper-parameters and weights of a GGUF model or a Hugging Face
 * directory. The shared hyper-parameters are read here, the rest by the
 * architecture family's load hook (engine/arch/) through loader.h. Every
 * tensor the architecture needs is looked up by name, its type checked
 * against the kernels we have and its shape against the metadata, so a wrong
 * file fails here with its name and the field, never later in a kernel.
 * Weight matrices stay in the mapping; small vectors (norms, biases) are
 * widened to f32. */
#include "engine/load/model.h"
#include "common/err.h"
#include "engine/arch/arch.h"
#include "engine/backend/backend.h"
#include "engine/load/loader.h"
#include "engine/load/mfile.h"
#include "engine/quant/qtypes.h"
#include "engine/text/tokenizer.h"

#include <float.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <math.h>

int ld_fail(ld *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(l->err, l->errlen, l->m->path, fmt, ap);
    va_end(ap);
    return -1;
}

/* "<arch>.<suffix>" into key; 1 present, 0 absent (error when required), -1 error. */
static int key_has(ld *l, const char *suffix, char *key, size_t n, int required)
{
    snprintf(key, n, "%s.%s", l->m->arch_name, suffix);
    if (gguf_get(l->g, key)) return 1;
    return required ? ld_fail(l, "missing metadata key '%s'", key) : 0;
}

int key_i(ld *l, const char *suffix, int64_t *v, int required, int64_t dflt)
{
    char key[128];
    int has = key_has(l, suffix, key, sizeof key, required);
    if (has <= 0) { *v = dflt; return has; }
    if (gguf_get_i64(l->g, key, v)) return ld_fail(l, "metadata key '%s' is not an integer", key);
    if (*v < 0 || *v > INT32_MAX) return ld_fail(l, "metadata key '%s' is out of range (%lld)", key, (long long)*v);
    return 0;
}

/* key_i within [lo, hi], the default included. */
int key_ir(ld *l, const char *suffix, int64_t *v, int required, int64_t dflt, int64_t lo, int64_t hi)
{
    char key[128];
    int has = key_has(l, suffix, key, sizeof key, required);
    if (has < 0) return -1;
    if (has && gguf_get_i64(l->g, key, v))
        return ld_fail(l, "metadata key '%s' is not an integer (expected one in [%lld, %lld])", key, (long long)lo,
                       (long long)hi);
    if (!has) *v = dflt;
    if (*v < lo || *v > hi)
        return ld_fail(l, "metadata key '%s' is %lld%s, expected an integer in [%lld, %lld]", key, (long long)*v,
                       has ? "" : " (its default)", (long long)lo, (long long)hi);
    return 0;
}

/* A number in (lo, hi]: NaN, infinities and out-of-range values refused. */
int key_f(ld *l, const char *suffix, double *v, double dflt, double lo, double hi)
{
    char key[128];
    int has = key_has(l, suffix, key, sizeof key, 0);
    if (has <= 0) { *v = dflt; return has; }
    if (gguf_get_f64(l->g, key, v)) return ld_fail(l, "metadata key '%s' is not a number", key);
    if (!(*v > lo && *v <= hi))
        return ld_fail(l, "metadata key '%s' is %g, expected a number in (%g, %g]", key, *v, lo, hi);
    return 0;
}

/* Rope scaling: YaRN where the row takes it (its keys into hp: llama,
 * qwen2, qwen3, qwen3moe, gpt-oss), else none; other scaling (Llama 3.1's
 * comes as rope_freqs.weight) is refused rather than run as something
 * else. */
static int unsupported_keys(ld *l)
{
    hparams *hp = &l->m->hp;
    char key[128];
    gguf_str st;
    int yarn_ok = (l->m->arch->opt & ARCH_YARN) != 0, lin_ok = (l->m->arch->opt & ARCH_ROPE_LINEAR) != 0;
    if (key_has(l, "rope.scaling.type", key, sizeof key, 0) == 1) {
        if (gguf_get_str(l->g, key, &st)) return ld_fail(l, "metadata key '%s' is not a string", key);
        if (st.n == 4 && !memcmp(st.s, "none", 4)) return 0;
        if (lin_ok && st.n == 6 && !memcmp(st.s, "linear", 6)) {
            if (key_f(l, "rope.scaling.factor", &hp->rope_linear, 1, 1e-6, 1e6)) return -1;
            return 0;
        }
        if (!(yarn_ok && st.n == 4 && !memcmp(st.s, "yarn", 4)))
            return ld_fail(l, "metadata key '%s' is '%.*s': rope scaling is not supported for %s (expected none%s)",
                           key, (int)(st.n > 40 ? 40 : st.n), st.s, l->m->arch_name,
                           yarn_ok ? " or yarn" : lin_ok ? " or linear" : "");
        int64_t v;
        double f;
        if (key_f(l, "rope.scaling.factor", &hp->yarn_factor, 1, 0, 1e6)) return -1;
        if (key_ir(l, "rope.scaling.original_context_length", &v, 1, 0, 1, 1 << 24)) return -1;
        hp->yarn_orig_ctx = (double)v;
        if (key_f(l, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast, 32, 0, 1e6) ||
            key_f(l, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow, 1, 0, 1e6) ||
            key_f(l, "rope.scaling.attn_factor", &f, 1, 0, 1e6))
            return -1;
        if (hp->yarn_beta_fast <= hp->yarn_beta_slow)
            return ld_fail(l, "metadata key '%s.rope.scaling.yarn_beta_fast' is %g, expected a number above "
                           "yarn_beta_slow %g", l->m->arch_name, hp->yarn_beta_fast, hp->yarn_beta_slow);
        /* llama.cpp's rope: attn_factor times YaRN's 1 + 0.1 ln(factor) */
        hp->yarn_attn = f * (hp->yarn_factor > 1 ? 1 + 0.1 * log(hp->yarn_factor) : 1);
        hp->yarn_truncate = !(l->m->arch->opt & ARCH_YARN_EXACT);
        hp->rope_yarn = 1;
        return 0;
    }
    static const char *const factors[] = { "rope.scaling.factor", "rope.scale_linear" };
    for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++) {
        double f;
        if (key_has(l, factors[i], key, sizeof key, 0) != 1) continue;
        if (gguf_get_f64(l->g, key, &f)) return ld_fail(l, "metadata key '%s' is not a number", key);
        if (f != 0 && f != 1)
            return ld_fail(l, "metadata key '%s' is %g: rope scaling is not supported (expected 1)", key, f);
    }
    return 0;
}

void rope_yarn_table(double base, int n_rot, double factor, double orig_ctx, double beta_fast, double beta_slow,
                     int truncate, double attn, float *out)
{
    int half = n_rot / 2;
    /* the pair that turns r times over orig_ctx positions */
    double lo = n_rot * log(orig_ctx / (beta_fast * 2 * M_PI)) / (2 * log(base));
    double hi = n_rot * log(orig_ctx / (beta_slow * 2 * M_PI)) / (2 * log(base));
    if (truncate) { lo = floor(lo); hi = ceil(hi); }
    if (lo < 0) lo = 0;
    if (hi > n_rot - 1) hi = n_rot - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double ext = 1 - ramp;   /* 1: the pair keeps its frequency; 0: divided by factor */
        out[i] = (float)(1 / ((1 - ext) / factor + ext));
    }
    out[half] = (float)attn;
}

/* hp's YaRN (or linear scaling), once the family has loaded, as m->rope_freqs. */
static int yarn_set(ld *l)
{
    model *m = l->m;
    const hparams *hp = &m->hp;
    if (hp->rope_linear > 0 && hp->rope_linear != 1) {
        if (hp->n_rot / 2 > (int)(sizeof m->yarn_tab / sizeof m->yarn_tab[0]))
            return ld_fail(l, "linear rope scaling over %d rotary dimensions (expected at most 1024)", hp->n_rot);
        for (int i = 0; i < hp->n_rot / 2; i++) m->yarn_tab[i] = (float)hp->rope_linear;
        m->rope_freqs = (wt){ .type = QT_F32, .n_in = hp->n_rot / 2, .n_out = 1,
                              .row_bytes = (size_t)(hp->n_rot / 2) * 4, .data = m->yarn_tab };
        return 0;
    }
    if (!hp->rope_yarn) return 0;
    if (m->rope_freqs.data) return ld_fail(l, "rope_freqs.weight and YaRN rope scaling both given (expected one)");
    if (hp->n_rot / 2 + 1 > (int)(sizeof m->yarn_tab / sizeof m->yarn_tab[0]))
        return ld_fail(l, "YaRN over %d rotary dimensions (expected at most 1024)", hp->n_rot);
    rope_yarn_table(hp->rope_base, hp->n_rot, hp->yarn_factor, hp->yarn_orig_ctx, hp->yarn_beta_fast,
                    hp->yarn_beta_slow, hp->yarn_truncate, hp->yarn_attn, m->yarn_tab);
    m->rope_freqs = (wt){ .type = QT_F32, .n_in = hp->n_rot / 2 + 1, .n_out = 1,
                          .row_bytes = (size_t)(hp->n_rot / 2 + 1) * 4, .data = m->yarn_tab };
    return 0;
}

/* The mixture-of-experts keys (none: a dense model). */
static int expert_keys(ld *l)
{
    hparams *hp = &l->m->hp;
    char key[128];
    int64_t v;
    double f;
    hp->expert_gating = hp->expert_norm = -1;
    hp->expert_scale = 1;
    if (key_ir(l, "expert_count", &v, 0, 0, 0, BE_MOE_MAX)) return -1;
    hp->n_expert = (int32_t)v;
    if (key_ir(l, "expert_shared_count", &v, 0, 0, 0, 0)) return -1;   /* (shared experts: none of ours) */
    if (!hp->n_expert) {
        if (key_has(l, "expert_used_count", key, sizeof key, 0) == 1 && (gguf_get_i64(l->g, key, &v) || v != 0))
            return ld_fail(l, "metadata key '%s' is present but %s.expert_count is 0 or absent (expected both or "
                           "neither)", key, l->m->arch_name);
        return 0;
    }
    if (key_ir(l, "expert_used_count", &v, 1, 0, 1, hp->n_expert)) return -1;
    hp->n_expert_used = (int32_t)v;
    if (key_ir(l, "expert_feed_forward_length", &v, 0, hp->n_ff, 1, 1 << 20)) return -1;
    hp->n_ff_exp = (int32_t)v;
    /* llama.cpp's gating function ids: 1 softmax, 2 sigmoid, 3 softmax over the chosen */
    if (key_has(l, "expert_gating_func", key, sizeof key, 0) == 1) {
        if (key_ir(l, "expert_gating_func", &v, 1, 0, 1, 3)) return -1;
        hp->expert_gating = v == 1 ? BE_MOE_SOFTMAX : v == 2 ? BE_MOE_SIGMOID : BE_MOE_TOPK_SOFTMAX;
    }
    if (key_has(l, "expert_weights_norm", key, sizeof key, 0) == 1) {
        int b;
        if (gguf_get_bool(l->g, key, &b)) return ld_fail(l, "metadata key '%s' is not a boolean", key);
        hp->expert_norm = b;
    }
    if (key_f(l, "expert_weights_scale", &f, 1, 0, 1e6)) return -1;
    hp->expert_scale = (float)f;
    return 0;
}

/* Every blk.N tensor belongs to a block below block_count: a count that
 * leaves blocks out means the rest of the metadata is not this file's. */
static int blocks_in_range(ld *l)
{
    for (uint64_t i = 0; i < l->g->n_tensors; i++) {
        gguf_str nm = l->g->tensors[i].name;
        if (nm.n < 5 || memcmp(nm.s, "blk.", 4)) continue;
        uint64_t b = 0;
        size_t k = 4;
        while (k < nm.n && k < 14 && nm.s[k] >= '0' && nm.s[k] <= '9') b = b * 10 + (uint64_t)(nm.s[k++] - '0');
        if (k == 4 || k >= nm.n || nm.s[k] != '.') continue;
        if (b >= (uint64_t)l->m->hp.n_layer)
            return ld_fail(l, "tensor '%.*s' is for block %llu but %s.block_count is %d (expected blocks 0..%d)",
                           (int)(nm.n > 100 ? 100 : nm.n), nm.s, (unsigned long long)b, l->m->arch_name,
                           l->m->hp.n_layer, l->m->hp.n_layer - 1);
    }
    return 0;
}

const gguf_tensor *ld_tensor(ld *l, const char *name)
{
    return l->hf ? hf_tensor_find(l->hf, name) : gguf_tensor_find(l->g, name);
}

int get_w3(ld *l, wt *w, const char *name, int64_t n_in, int64_t n_out, int64_t n_mat, int required)
{
    memset(w, 0, sizeof *w);
    const gguf_tensor *t = ld_tensor(l, name);
    if (!t) {
        if (required) return ld_fail(l, "missing tensor '%s'", name);
        return 0;
    }
    const qt_traits *tr = qt_get(t->type);
    if (!tr || !tr->weight_ok || t->nbytes == 0) {
        char sup[256];
        size_t o = 0;
        sup[0] = 0;
        for (uint32_t i = 0; i < QT_COUNT; i++)
            if (qt_get(i) && qt_get(i)->weight_ok && o < sizeof sup)
                o += (size_t)snprintf(sup + o, sizeof sup - o, "%s%s", o ? ", " : "", qt_name(i));
        return ld_fail(l, "tensor '%s' has unsupported weight type %s (supported: %s)", name, qt_name(t->type), sup);
    }
    int64_t e1 = n_out ? n_out : 1;
    if (t->ne[0] != n_in || t->ne[1] != e1 || t->ne[2] != n_mat || t->ne[3] != 1) {
        if (n_mat == 1)
            return ld_fail(l, "tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld]", name,
                           (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)n_in,
                           (long long)e1);
        return ld_fail(l, "tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)n_in,
                       (long long)e1, (long long)n_mat);
    }
    w->type = t->type;
    w->n_in = t->ne[0];
    w->n_out = e1 * n_mat;
    w->n_mat = (int32_t)n_mat;
    w->row_bytes = qt_row_size(t->type, t->ne[0]);
    w->data = t->data;
    l->m->n_params += (uint64_t)(t->ne[0] * e1 * n_mat);
    l->m->weight_bytes += t->nbytes;
    l->m->active_bytes += n_mat > 1 && l->m->hp.n_expert == n_mat
                              ? t->nbytes / (uint64_t)n_mat * (uint64_t)l->m->hp.n_expert_used
                              : t->nbytes;
    if (!n_out) { /* vector: widen to f32 into the model's buffer */
        if (l->vec_used + (size_t)n_in > l->vec_cap) return ld_fail(l, "internal: vector buffer too small");
        float *dst = l->vec_buf + l->vec_used;
        qt_dequant_row(t->type, t->data, dst, n_in);
        l->vec_used += (size_t)n_in;
        w->type = QT_F32;
        w->row_bytes = (size_t)n_in * 4;
        w->data = dst;
    }
    return 0;
}

int get_w(ld *l, wt *w, const char *name, int64_t n_in, int64_t n_out, int required)
{
    return get_w3(l, w, name, n_in, n_out, 1, required);
}

int get_layer_w(ld *l, wt *w, int i, const char *what, int64_t n_in, int64_t n_out, int required)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", i, what);
    return get_w(l, w, name, n_in, n_out, required);
}

#define LAYER_WTS 39
#define TOP_WTS 6

int model_wts(model *m, wt **out, int cap)
{
    wt *top[TOP_WTS] = { &m->tok_embd, &m->output_norm, &m->output, &m->rope_freqs, &m->output_norm_b, &m->pos_embd };
    int n = 0;
    for (int i = 0; i < TOP_WTS; i++)
        if (n < cap) out[n++] = top[i];
    for (int l = 0; m->layers && l < m->hp.n_layer; l++) {
        layer_w *L = &m->layers[l];
        wt *ws[LAYER_WTS] = { &L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up,
                     &L->w_down, &L->bq, &L->bk, &L->bv, &L->q_norm, &L->k_norm,
                     &L->ssm_qkv, &L->ssm_z, &L->ssm_alpha, &L->ssm_beta, &L->ssm_a, &L->ssm_dt_bias,
                     &L->ssm_conv, &L->ssm_norm, &L->ssm_out, &L->ffn_gate_inp, &L->ffn_gate_inp_b,
                     &L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps, &L->ffn_gate_exps_b,
                     &L->ffn_up_exps_b, &L->ffn_down_exps_b,
                     &L->post_attn_norm, &L->post_ffn_norm, &L->attn_norm_b, &L->ffn_norm_b, &L->bo, &L->b_up, &L->b_down, &L->attn_sinks };
        for (int i = 0; i < LAYER_WTS; i++)
            if (n < cap) out[n++] = ws[i];
    }
    return n;
}

int model_wts_count(const model *m) { return TOP_WTS + LAYER_WTS * (m->layers ? m->hp.n_layer : 0); }

int model_prepare(model *m, be *b, char *err, size_t errlen)
{
    int n = model_wts_count(m);
    wt **ws = malloc((size_t)n * sizeof *ws);
    if (!ws) { snprintf(err, errlen, "out of memory"); return -1; }
    n = model_wts(m, ws, n);
    int own = 1;   /* whether the backend keeps a copy of every weight */
    for (int i = 0; i < n; i++) {
        if (ws[i]->data && b->ops->weight_prepare(b, ws[i])) { free(ws); goto fail; }
        if (ws[i]->data && (!ws[i]->dev || ws[i]->dev == ws[i]->data)) own = 0;
    }
    free(ws);
    /* what the backend took must be what was loaded */
    char why[400];
    if (model_check(m, 0, why, sizeof why) == MODEL_CHANGED) {
        snprintf(err, errlen, "%s while loading; load it again once it is complete", why);
        return -1;
    }
    m->resident = own;
    return 0;
fail:
    snprintf(err, errlen, "%s: the %s backend could not take the weights (out of device memory?)",
             m->path, b->ops->name);
    return -1;
}

int model_check(model *m, int quick, char *why, size_t n)
{
    if (quick && m->resident) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        if (now < atomic_load(&m->check_due)) return MODEL_SAME;
        atomic_store(&m->check_due, now + 1000);
    }
    char w[400] = "";
    int rc = m->gguf ? mf_check(&m->gguf->mm, quick, w, sizeof w) : m->hf ? hf_check(m->hf, quick, w, sizeof w)
                                                                     : MF_SAME;
    if (rc == MF_SAME) return MODEL_SAME;
    if (rc == MF_CHANGED && !m->resident) {
        snprintf(why, n, "%s", w);
        return MODEL_CHANGED;
    }
    snprintf(why, n, "%s; the weights in use are those loaded at start", w);
    return MODEL_DETACHED;
}

void wt_row_f32(const wt *w, int64_t r, float *dst)
{
    qt_dequant_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, dst, w->n_in);
}

void model_free(model *m)
{
    if (!m) return;
    tok_free(m->tok);
    free(m->layers); free(m->owned);
    gguf_close(m->gguf);
    hf_close(m->hf);
    free(m);
}

int ld_common(ld *l, size_t vec_cap)
{
    model *m = l->m;
    hparams *hp = &m->hp;
    const gguf_tensor *te = l->hf ? hf_tensor_find(l->hf, "token_embd.weight") : gguf_tensor_find(l->g, "token_embd.weight");
    if (!te) return ld_fail(l, "missing tensor 'token_embd.weight'");
    hp->n_vocab = (int32_t)te->ne[1];
    if (hp->n_vocab != tok_n_vocab(m->tok))
        return ld_fail(l, "token_embd.weight has %d rows but the tokenizer has %d tokens", hp->n_vocab,
                       tok_n_vocab(m->tok));
    l->vec_cap = vec_cap;
    l->vec_buf = malloc(l->vec_cap * sizeof(float));
    m->owned = l->vec_buf;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!l->vec_buf || !m->layers) return ld_fail(l, "out of memory");

    int E = hp->n_embd;
    if (get_w(l, &m->tok_embd, "token_embd.weight", E, hp->n_vocab, 1)) return -1;
    if (get_w(l, &m->output_norm, "output_norm.weight", E, 0, 1)) return -1;
    if (get_w(l, &m->output, "output.weight", E, hp->n_vocab, 0)) return -1;
    m->tok_embd.lookup = 1;
    if (!m->output.data) { m->output = m->tok_embd; m->output.lookup = 0; }   /* tied embeddings */
    return 0;
}

/* A model whose metadata gives experts must have had them loaded by its
 * family; one that cannot run them is refused rather than run dense. */
static int experts_loaded(ld *l)
{
    const model *m = l->m;
    if (!m->hp.n_expert) return 0;
    for (int i = 0; i < m->hp.n_layer; i++)
        if (m->layers[i].ffn_gate_exps.data) return 0;
    return ld_fail(l, "%s.expert_count is %d but the %s architecture here has no mixture-of-experts layers "
                   "(expected 0 or absent)", m->arch_name, m->hp.n_expert, m->arch_name);
}

/* Llama-3.1 rope scaling: per-pair divisors of the rotary frequencies, as
 * the GGUF converter writes them into rope_freqs.weight. */
static void llama3_rope_divisors(const hf_config *c, int n_rot, float *out)
{
    double lo_wavelen = c->rope_orig_ctx / c->rope_low, hi_wavelen = c->rope_orig_ctx / c->rope_high;
    for (int i = 0; i < n_rot / 2; i++) {
        double freq = pow(c->rope_theta, -2.0 * i / n_rot);
        double wavelen = 2 * M_PI / freq;
        double f;
        if (wavelen < hi_wavelen) f = 1;
        else if (wavelen > lo_wavelen) f = c->rope_factor;
        else {
            double smooth = (c->rope_orig_ctx / wavelen - c->rope_low) / (c->rope_high - c->rope_low);
            f = 1 / ((1 - smooth) / c->rope_factor + smooth);
        }
        out[i] = (float)f;
    }
}

/* A Hugging Face directory: hyper-parameters from config.json, the
 * tokenizer from tokenizer.json, tensors from the safetensors shards. */
static int model_load_hf(model *m, ld *l)
{
    char tj[1100], tc[1100];
    struct stat st;
    if (hf_open(&m->hf, m->path, l->err, l->errlen)) return -1;
    l->hf = m->hf;
    const hf_config *c = hf_cfg(m->hf);
    snprintf(m->arch_name, sizeof m->arch_name, "%s", c->arch);
    const char *b = strrchr(m->path, '/');
    snprintf(m->name, sizeof m->name, "%.127s", b && b[1] ? b + 1 : m->path);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", m->path);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", m->path);
    if (tok_load_hf(&m->tok, tj, stat(tc, &st) == 0 ? tc : NULL, l->err, l->errlen)) return -1;
    hparams *hp = &m->hp;
    m->arch = arch_find(c->arch);   /* (hf_open took only the model types it knows) */
    if (!m->arch) return ld_fail(l, "config.json: model_type '%s' has no architecture here", c->arch);
    /* (config.json's fields are checked by hf_open) */
    if (c->vocab != tok_n_vocab(m->tok))
        return ld_fail(l, "config.json: vocab_size is %lld but tokenizer.json has %d tokens (expected the same)",
                       (long long)c->vocab, tok_n_vocab(m->tok));
    /* (config.json names no pooling type; HF checkpoints rotate halves, only
     * GGUF llama rows are permuted) */
    *hp = (hparams){ .n_embd = (int32_t)c->hidden, .n_layer = (int32_t)c->layers, .n_head = (int32_t)c->heads,
                     .n_head_kv = (int32_t)c->kv_heads, .head_dim = (int32_t)c->head_dim, .n_ff = (int32_t)c->ff,
                     .n_rot = (int32_t)c->head_dim, .n_ctx_train = (int32_t)c->ctx, .pooling_type = -1,
                     .norm_eps = (float)c->eps, .rope_base = (float)c->rope_theta, .rope_neox = 1,
                     .n_expert = (int32_t)c->n_expert, .n_expert_used = (int32_t)c->n_expert_used,
                     .n_ff_exp = (int32_t)c->ff_exp, .expert_gating = -1, .expert_norm = c->norm_topk,
                     .expert_scale = 1, .rope_yarn = c->rope_yarn, .yarn_factor = c->rope_factor,
                     .yarn_orig_ctx = c->rope_orig_ctx, .yarn_beta_fast = c->yarn_beta_fast,
                     .yarn_beta_slow = c->yarn_beta_slow, .yarn_truncate = c->yarn_truncate,
                     .yarn_attn = c->yarn_attn };
    if (m->arch->fam->load(l) || experts_loaded(l) || yarn_set(l)) return -1;
    if (c->tie == 0 && !hf_tensor_find(m->hf, "output.weight"))
        return ld_fail(l, "config.json: tie_word_embeddings is false but no shard has lm_head.weight");
    if (c->rope_llama3) {
        float *dst = l->vec_buf + l->vec_used;
        llama3_rope_divisors(c, hp->n_rot, dst);
        l->vec_used += (size_t)hp->n_rot / 2;
        m->rope_freqs = (wt){ .type = QT_F32, .n_in = hp->n_rot / 2, .n_out = 1,
                              .row_bytes = (size_t)hp->n_rot / 2 * 4, .data = dst };
    }
    return 0;
}

int model_load(model **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "%s: out of memory", path); return -1; }
    snprintf(m->path, sizeof m->path, "%s", path);
    ld l = { .m = m, .err = err, .errlen = errlen };
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (model_load_hf(m, &l)) goto fail;
        goto done;
    }
    if (gguf_open(&m->gguf, path, err, errlen)) goto fail;
    l.g = m->gguf;

    gguf_str s;
    if (gguf_get_str(l.g, "general.architecture", &s) == 0)
        snprintf(m->arch_name, sizeof m->arch_name, "%.*s", (int)(s.n < 31 ? s.n : 31), s.s);
    if (gguf_get_str(l.g, "general.name", &s) == 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(s.n < 127 ? s.n : 127), s.s);
    else {
        const char *b = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%.127s", b ? b + 1 : path);
    }
    if (tok_load_gguf(&m->tok, l.g, err, errlen)) goto fail;
    m->spm = gguf_get_str(l.g, "tokenizer.ggml.model", &s) == 0 && s.n == 5 && !memcmp(s.s, "llama", 5);

    if (l.g->n_tensors == 0) {   /* a vocabulary-only file */
        m->tokenizer_only = 1;
        m->hp.n_vocab = tok_n_vocab(m->tok);
        goto done;
    }
    hparams *hp = &m->hp;
    m->arch = arch_find(m->arch_name);
    if (!m->arch) {
        char names[200];
        ld_fail(&l, "unsupported architecture '%s' in general.architecture (supported: %s)",
                m->arch_name[0] ? m->arch_name : "(missing)", arch_names(names, sizeof names));
        goto fail;
    }
    int64_t v;
    double f;
    if (key_ir(&l, "embedding_length", &v, 1, 0, 1, 65536)) goto fail;
    hp->n_embd = (int32_t)v;
    if (key_ir(&l, "block_count", &v, 1, 0, 1, 1024)) goto fail;
    hp->n_layer = (int32_t)v;
    if (key_ir(&l, "feed_forward_length", &v, 1, 0, 1, 1 << 20)) goto fail;
    hp->n_ff = (int32_t)v;
    if (key_ir(&l, "attention.head_count", &v, 1, 0, 1, 1024)) goto fail;
    hp->n_head = (int32_t)v;
    if (key_ir(&l, "attention.head_count_kv", &v, 0, hp->n_head, 1, hp->n_head)) goto fail;
    hp->n_head_kv = (int32_t)v;
    if (hp->n_head % hp->n_head_kv) {
        ld_fail(&l, "%s.attention.head_count %d is not a multiple of %s.attention.head_count_kv %d", m->arch_name,
                hp->n_head, m->arch_name, hp->n_head_kv);
        goto fail;
    }
    if (key_ir(&l, "context_length", &v, 0, 2048, 1, 1 << 24)) goto fail;
    hp->n_ctx_train = (int32_t)v;
    /* llama.cpp's values: 0 none, 1 mean, 2 cls, 3 last, 4 rank */
    char kl[128];
    hp->pooling_type = -1;
    if (key_has(&l, "pooling_type", kl, sizeof kl, 0) == 1) {
        if (key_ir(&l, "pooling_type", &v, 1, 0, 0, 4)) goto fail;
        hp->pooling_type = (int32_t)v;
    }
    if (key_has(&l, "attention.key_length", kl, sizeof kl, 0) == 0 && hp->n_embd % hp->n_head) {
        ld_fail(&l, "%s.embedding_length %d is not a multiple of %s.attention.head_count %d (and there is no %s)",
                m->arch_name, hp->n_embd, m->arch_name, hp->n_head, kl);
        goto fail;
    }
    if (key_ir(&l, "attention.key_length", &v, 0, hp->n_embd / hp->n_head, 2, 1024)) goto fail;
    hp->head_dim = (int32_t)v;
    if (hp->head_dim % 2) {
        ld_fail(&l, "%s is %d, expected an even number", kl, hp->head_dim);
        goto fail;
    }
    if (key_i(&l, "attention.value_length", &v, 0, hp->head_dim)) goto fail;
    if (v != hp->head_dim) { ld_fail(&l, "attention.value_length %lld differs from key_length %d",
                                     (long long)v, hp->head_dim); goto fail; }
    if (key_i(&l, "rope.dimension_count", &v, 0, hp->head_dim)) goto fail;
    hp->n_rot = (int32_t)v;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2) {
        ld_fail(&l, "rope.dimension_count %d must be even and at most the head size %d", hp->n_rot, hp->head_dim);
        goto fail;
    }
    /* eps in (0, 1]; rope base above 1 and finite as a float (1 or below
     * turns no pair, inf or NaN spoils every one) */
    if (key_f(&l, "attention.layer_norm_rms_epsilon", &f, 1e-5, 0, 1)) goto fail;
    hp->norm_eps = (float)f;
    if (key_f(&l, "rope.freq_base", &f, 10000.0, 1, FLT_MAX)) goto fail;
    hp->rope_base = (float)f;
    if (unsupported_keys(&l)) goto fail;
    if (expert_keys(&l)) goto fail;
    char vk[128];
    if (key_has(&l, "vocab_size", vk, sizeof vk, 0) == 1) {
        if (gguf_get_i64(l.g, vk, &v)) { ld_fail(&l, "metadata key '%s' is not an integer", vk); goto fail; }
        if (v != tok_n_vocab(m->tok)) {
            ld_fail(&l, "metadata key '%s' is %lld but tokenizer.ggml.tokens has %d tokens (expected the same)", vk,
                    (long long)v, tok_n_vocab(m->tok));
            goto fail;
        }
    }
    if (blocks_in_range(&l)) goto fail;
    hp->rope_neox = (m->arch->opt & ARCH_ROPE_NEOX) != 0;

    if (m->arch->fam->load(&l) || experts_loaded(&l) || yarn_set(&l)) goto fail;
done:;
    /* a file rewritten meanwhile may have given any mix of old and new bytes */
    char why[400];
    if (model_check(m, 0, why, sizeof why) == MODEL_CHANGED) {
        snprintf(err, errlen, "%s while loading; load it again once it is complete", why);
        goto fail;
    }
    m->resident = m->tokenizer_only;   /* (the tokenizer keeps copies of what it read) */
    *out = m;
    return 0;
fail:
    model_free(m);
    return -1;
}
