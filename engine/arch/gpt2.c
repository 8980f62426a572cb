/* gpt2.c — the GPT-2 family (row gpt2 of arch.c):
 *   x = embed(tokens) + P[pos]             (learned absolute positions)
 *   per layer: x += Wo · attn(Wq·n(x)+bq, Wk·n(x)+bk, Wv·n(x)+bv) + bo
 *              x += Wd · gelu(Wu·n(x) + bu) + bd
 *   logits = Wout · n(x)  (the embedding: tied)
 * n is a LayerNorm with bias; gelu the tanh approximation; no rope. The
 * file's fused attn_qkv (rows q, then k, then v) is taken as three views.
 * Buffers: layers.h's ly_fw, Q = K = E, F = n_ff (hg the FFN's, no hu). */
#include "engine/arch/arch.h"
#include "engine/arch/layers.h"
#include "engine/arch/split.h"
#include "common/err.h"
#include "engine/quant/qtypes.h"

#include <stdlib.h>

/* rows [r0, r0+n) of w as a weight of its own */
static wt rows_of(const wt *w, int64_t r0, int64_t n)
{
    wt v = *w;
    v.n_out = n;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.dev = NULL;
    v.pack = NULL;
    return v;
}

/* elements [e0, e0+n) of an f32 vector */
static wt vec_of(const wt *w, int64_t e0, int64_t n)
{
    wt v = *w;
    v.n_in = n;
    v.row_bytes = (size_t)n * 4;
    v.data = (const float *)w->data + e0;
    v.dev = NULL;
    v.pack = NULL;
    return v;
}

static int gpt2_load(ld *l)
{
    model *m = l->m;
    hparams *hp = &m->hp;
    int E = hp->n_embd, F = hp->n_ff;
    double f;
    if (hp->n_head_kv != hp->n_head || hp->head_dim * hp->n_head != E)
        return ld_fail(l, "%s.attention.head_count_kv %d and head size %d: expected %d heads of %d (GPT-2 has "
                       "neither grouped heads nor a key_length of its own)", m->arch_name, hp->n_head_kv,
                       hp->head_dim, hp->n_head, E / hp->n_head);
    if (l->g) {   /* (a Hugging Face directory's is config.json's, read already) */
        if (key_f(l, "attention.layer_norm_epsilon", &f, 1e-5, 0, 1)) return -1;
        hp->norm_eps = (float)f;
    }
    if (ld_common(l, (size_t)2 * E + (size_t)hp->n_layer * (4 * E + 3 * E + E + F + E) + 64)) return -1;
    if (get_w(l, &m->output_norm_b, "output_norm.bias", E, 0, 1) ||
        get_w(l, &m->pos_embd, "position_embd.weight", E, hp->n_ctx_train, 1))
        return -1;
    if (m->pos_embd.type != QT_F32 && m->pos_embd.type != QT_F16 && m->pos_embd.type != QT_BF16)
        return ld_fail(l, "position_embd.weight is of type %u, expected f32, f16 or bf16", m->pos_embd.type);
    for (int i = 0; i < hp->n_layer; i++) {
        layer_w *L = &m->layers[i];
        wt qkv, bqkv;
        if (get_layer_w(l, &L->attn_norm, i, "attn_norm.weight", E, 0, 1) ||
            get_layer_w(l, &L->attn_norm_b, i, "attn_norm.bias", E, 0, 1) ||
            get_layer_w(l, &qkv, i, "attn_qkv.weight", E, 3 * (int64_t)E, 1) ||
            get_layer_w(l, &bqkv, i, "attn_qkv.bias", 3 * (int64_t)E, 0, 1) ||
            get_layer_w(l, &L->wo, i, "attn_output.weight", E, E, 1) ||
            get_layer_w(l, &L->bo, i, "attn_output.bias", E, 0, 1) ||
            get_layer_w(l, &L->ffn_norm, i, "ffn_norm.weight", E, 0, 1) ||
            get_layer_w(l, &L->ffn_norm_b, i, "ffn_norm.bias", E, 0, 1) ||
            get_layer_w(l, &L->w_up, i, "ffn_up.weight", E, F, 1) ||
            get_layer_w(l, &L->b_up, i, "ffn_up.bias", F, 0, 1) ||
            get_layer_w(l, &L->w_down, i, "ffn_down.weight", F, E, 1) ||
            get_layer_w(l, &L->b_down, i, "ffn_down.bias", E, 0, 1))
            return -1;
        L->wq = rows_of(&qkv, 0, E);
        L->wk = rows_of(&qkv, E, E);
        L->wv = rows_of(&qkv, 2 * (int64_t)E, E);
        L->bq = vec_of(&bqkv, 0, E);
        L->bk = vec_of(&bqkv, E, E);
        L->bv = vec_of(&bqkv, 2 * (int64_t)E, E);
    }
    hp->n_attn_layers = hp->n_layer;
    return 0;
}

/* (q, k, v, att [T][E]: no grouped heads; the FFN's activations in hg) */
static int gpt2_open(fw **out, model *m, be *b, int max_T, int max_out, int max_seqs, char *err, size_t errlen)
{
    return ly_fw_open(out, &arch_gpt2, m, b, (size_t)m->hp.n_ff, 0, NULL, max_T, max_out, err, errlen);
}

static const char *gpt2_lacks(const model *m, const be_ops *o)
{
    return !o->layernorm || !o->gelu_mul || !o->add_pos ? "layernorm, gelu, learned positions" : NULL;
}

static void gpt2_first(ly_fw *f, const be_batch *bt)
{
    f->base.b->ops->add_pos(f->base.b, f->x, &f->base.m->pos_embd, bt, f->base.m->hp.n_embd);
}

static void gpt2_layer(ly_fw *f, const layer_w *L, int l, const be_batch *bt)
{
    const hparams *hp = &f->base.m->hp;
    be *b = f->base.b;
    const be_ops *o = b->ops;
    int T = bt->T, E = hp->n_embd;
    float eps = hp->norm_eps;
    o->layernorm(b, f->x, &L->attn_norm, &L->attn_norm_b, T, E, eps, f->xb);
    const wt *wqkv[3] = { &L->wq, &L->wk, &L->wv }, *bqkv[3] = { &L->bq, &L->bk, &L->bv };
    float *const qkv[3] = { f->q, f->k, f->v };
    ly_matmuls(b, 3, wqkv, bqkv, f->xb, T, qkv);
    o->kv_store(b, f->base.kc[l], f->base.vc[l], bt, hp->n_head_kv * hp->head_dim, f->k, f->v);
    o->attention(b, f->q, f->base.kc[l], f->base.vc[l], bt, hp->n_head, hp->n_head_kv, hp->head_dim, f->att);
    o->matmul(b, &L->wo, &L->bo, f->att, T, f->xb);
    ly_reduce(f, f->xb, (size_t)T * E);
    o->add(b, f->x, f->xb, (size_t)T * E);
    o->layernorm(b, f->x, &L->ffn_norm, &L->ffn_norm_b, T, E, eps, f->xb);
    o->matmul(b, &L->w_up, &L->b_up, f->xb, T, f->hg);
    o->gelu_mul(b, f->hg, NULL, (size_t)T * hp->n_ff, f->hg);
    o->matmul(b, &L->w_down, &L->b_down, f->hg, T, f->xb);
    ly_reduce(f, f->xb, (size_t)T * E);
    o->add(b, f->x, f->xb, (size_t)T * E);
}

/* the final norm of the output rows, a run of consecutive rows at a time */
static void gpt2_last(ly_fw *f, const int32_t *out_idx, int n_out)
{
    const model *m = f->base.m;
    be *b = f->base.b;
    int E = m->hp.n_embd;
    for (int i = 0, j; i < n_out; i = j) {
        for (j = i + 1; j < n_out && out_idx[j] == out_idx[j - 1] + 1; j++) {}
        b->ops->layernorm(b, f->x + (size_t)out_idx[i] * E, &m->output_norm, &m->output_norm_b, j - i, E,
                          m->hp.norm_eps, f->xo + (size_t)i * E);
    }
    if (n_out > 0) b->ops->matmul(b, &m->output, NULL, f->xo, n_out, f->base.lg);
}

static void gpt2_pass(fw *base, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    static const ly_pass p = { .first = gpt2_first, .layer = gpt2_layer, .last = gpt2_last };
    ly_fw_pass((ly_fw *)base, &p, tokens, bt, out_idx, n_out);
}

const arch_family arch_gpt2 = { .load = gpt2_load, .lacks = gpt2_lacks, .open = gpt2_open, .close = ly_fw_close,
                                .pass = gpt2_pass, .greedy = 1, .split = sp_layers };
