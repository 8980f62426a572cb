/* gemma3.c — the Gemma 3 family (row gemma3 of arch.c), text part:
 *   x = embed(tokens) * sqrt(E)
 *   per layer: x += n_pa(Wo · attn(rope(norm_q(Wq·n(x))), rope(norm_k(Wk·n(x))), Wv·n(x)))
 *              x += n_pf(Wd · (gelu(Wg·n(x)) ∘ Wu·n(x)))
 *   logits = Wout · n(x)  (the embedding: tied)
 * Gemma's RMSNorm is x/rms(x) * (1 + w); llama.cpp's converter stores 1 + w,
 * so the file's weights go to the plain rmsnorm. Layers alternate: sliding-
 * window ones (a token sees the last n_swa positions, rope base
 * rope.freq_base_swa) and global ones (every position, rope.freq_base); by
 * default every sixth layer is global (Gemma 3's pattern), or as
 * attention.sliding_window_pattern says. q·k is scaled by
 * 1/sqrt(query_pre_attn_scalar): head_dim for every released size but 27B
 * (n_embd/n_head there), which the GGUF does not record (llama.cpp tells
 * 27B by its 62 layers; so do we). rope.scaling.type linear (4B and up:
 * factor 8) divides the global layers' frequencies only, as transformers'
 * rotary_emb (the sliding layers' rotary_emb_local has none). Buffers:
 * layers.h's ly_fw, F = n_ff. */
#include "engine/arch/arch.h"
#include "engine/arch/layers.h"
#include "engine/arch/split.h"
#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Which layers slide: attention.sliding_window_pattern as a period P
 * (layer i global when (i+1) % P == 0; 0 or absent: 6) or as one bool per
 * layer (true: sliding). */
static int gemma3_pattern(ld *l)
{
    model *m = l->m;
    const hparams *hp = &m->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch_name);
    const gguf_kv *kv = l->g ? gguf_get(l->g, key) : NULL;
    int period = 6;
    if (kv && kv->type == GGUF_T_ARRAY) {
        if (kv->arr_type != GGUF_T_BOOL && kv->arr_type != GGUF_T_UINT8 && kv->arr_type != GGUF_T_INT8)
            return ld_fail(l, "metadata key '%s' is an array of type %d, expected bools", key, (int)kv->arr_type);
        if (kv->arr_n != (uint64_t)hp->n_layer)
            return ld_fail(l, "metadata key '%s' has %llu entries but %s.block_count is %d (expected one per layer)",
                           key, (unsigned long long)kv->arr_n, m->arch_name, hp->n_layer);
        for (int i = 0; i < hp->n_layer; i++) m->layers[i].swa = kv->arr_data[i] != 0;
        return 0;
    }
    if (kv) {
        int64_t v;
        if (gguf_get_i64(l->g, key, &v) || v < 0 || v > hp->n_layer)
            return ld_fail(l, "metadata key '%s' is not a layer period in 0..%d (%s.block_count)", key, hp->n_layer,
                           m->arch_name);
        if (v > 0) period = (int)v;
    }
    for (int i = 0; i < hp->n_layer; i++) m->layers[i].swa = (i + 1) % period != 0;
    return 0;
}

static int gemma3_load(ld *l)
{
    model *m = l->m;
    hparams *hp = &m->hp;
    int E = hp->n_embd, HD = hp->head_dim, QD = hp->n_head * HD;
    int64_t v;
    double f;
    if (key_ir(l, "attention.sliding_window", &v, 1, 0, 1, hp->n_ctx_train)) return -1;
    hp->n_swa = (int32_t)v;
    if (key_f(l, "rope.freq_base_swa", &f, 10000.0, 1, 3.4e38)) return -1;
    hp->rope_base_swa = (float)f;
    int qpas = hp->n_layer == 62 ? hp->n_embd / hp->n_head : HD;
    hp->attn_scale = qpas == HD ? 0 : (float)(1.0 / sqrt((double)qpas));
    if (ld_common(l, (size_t)2 * E + (size_t)hp->n_layer * (4 * E + 2 * HD) + 64)) return -1;
    if (gemma3_pattern(l)) return -1;
    for (int i = 0; i < hp->n_layer; i++) {
        layer_w *L = &m->layers[i];
        if (get_layer_w(l, &L->attn_norm, i, "attn_norm.weight", E, 0, 1) || ly_load_attn(l, L, i, QD) ||
            get_layer_w(l, &L->q_norm, i, "attn_q_norm.weight", HD, 0, 1) ||
            get_layer_w(l, &L->k_norm, i, "attn_k_norm.weight", HD, 0, 1) ||
            get_layer_w(l, &L->post_attn_norm, i, "post_attention_norm.weight", E, 0, 1) ||
            get_layer_w(l, &L->ffn_norm, i, "ffn_norm.weight", E, 0, 1) || ly_load_ffn_glu(l, L, i) ||
            get_layer_w(l, &L->post_ffn_norm, i, "post_ffw_norm.weight", E, 0, 1))
            return -1;
    }
    hp->n_attn_layers = hp->n_layer;
    return 0;
}

static const char *gemma3_lacks(const model *m, const be_ops *o)
{
    return !o->attention_ex || !o->gelu_mul || !o->scale ? "sliding-window attention, gelu, scale" : NULL;
}

/* (without m->swa_ring, a sliding layer's KV pages past its window are not
 * read again but stay allocated with the sequence's: the page tables are
 * shared) */
static int gemma3_open(fw **out, model *m, be *b, int max_T, int max_out, int max_seqs, char *err, size_t errlen)
{
    return ly_fw_open(out, &arch_gemma3, m, b, (size_t)m->hp.n_ff, 1, NULL, max_T, max_out, err, errlen);
}

static void gemma3_first(ly_fw *f, const be_batch *bt)
{
    int E = f->base.m->hp.n_embd;
    f->base.b->ops->scale(f->base.b, f->x, (size_t)bt->T * E, sqrtf((float)E));
}

static void gemma3_layer(ly_fw *f, const layer_w *L, int l, const be_batch *bt)
{
    const model *m = f->base.m;
    const hparams *hp = &m->hp;
    be *b = f->base.b;
    const be_ops *o = b->ops;
    int T = bt->T, E = hp->n_embd, HD = hp->head_dim;
    float eps = hp->norm_eps;
    o->rmsnorm(b, f->x, &L->attn_norm, T, E, eps, f->xb);
    const wt *wqkv[3] = { &L->wq, &L->wk, &L->wv }, *none[3] = { NULL, NULL, NULL };
    float *const qkv[3] = { f->q, f->k, f->v };
    ly_matmuls(b, 3, wqkv, none, f->xb, T, qkv);
    ly_attn a = { hp->n_head, hp->n_head_kv, HD, hp->n_rot, L->swa ? hp->rope_base_swa : hp->rope_base, 1,
                  L->swa ? NULL : &m->rope_freqs, &L->q_norm, &L->k_norm, eps, 1, L->swa ? hp->n_swa : 0, NULL,
                  hp->attn_scale };
    be_batch rb;
    ly_attend(b, &a, f->q, f->k, f->v, f->base.kc[l], f->base.vc[l], ly_kv_batch(m, l, bt, &rb), NULL, f->att);
    o->matmul(b, &L->wo, NULL, f->att, T, f->xb);
    ly_reduce(f, f->xb, (size_t)T * E);
    o->rmsnorm(b, f->xb, &L->post_attn_norm, T, E, eps, f->xb);
    o->add(b, f->x, f->xb, (size_t)T * E);
    o->rmsnorm(b, f->x, &L->ffn_norm, T, E, eps, f->xb);
    const wt *wgu[2] = { &L->w_gate, &L->w_up };
    float *const gu[2] = { f->hg, f->hu };
    ly_matmuls(b, 2, wgu, none, f->xb, T, gu);
    o->gelu_mul(b, f->hg, f->hu, (size_t)T * hp->n_ff, f->hg);
    o->matmul(b, &L->w_down, NULL, f->hg, T, f->xb);
    ly_reduce(f, f->xb, (size_t)T * E);
    o->rmsnorm(b, f->xb, &L->post_ffn_norm, T, E, eps, f->xb);
    o->add(b, f->x, f->xb, (size_t)T * E);
}

static void gemma3_pass(fw *base, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    static const ly_pass p = { .first = gemma3_first, .layer = gemma3_layer };
    ly_fw_pass((ly_fw *)base, &p, tokens, bt, out_idx, n_out);
}

const arch_family arch_gemma3 = { .load = gemma3_load, .lacks = gemma3_lacks, .open = gemma3_open,
                                  .close = ly_fw_close, .pass = gemma3_pass, .greedy = 1, .split = sp_layers };
