/* llama.c — the llama family (rows llama, qwen2, qwen3, qwen3moe of arch.c):
 *   x = embed(tokens)
 *   per layer: x += Wo · attn(rope(norm_q(Wq·n(x)+bq)), rope(norm_k(Wk·n(x)+bk)), Wv·n(x)+bv)
 *              x += Wd · (silu(Wg·n(x)) ∘ Wu·n(x))
 *   logits = Wout · n(x)  (only for the rows asked for)
 * The biases (qwen2, ARCH_QKV_BIAS) and the per-head q/k norms (qwen3,
 * ARCH_QK_NORM) are there when the row says so. A file with expert_count
 * (Mixtral as llama, qwen3moe) has a mixture of SiLU-GLU experts in place
 * of every FFN (moe.c): softmax router, top-k, the chosen weights
 * renormalised unless the file says otherwise. Buffers: layers.h's ly_fw,
 * F = n_ff (1 with experts). */
#include "engine/arch/arch.h"
#include "engine/arch/layers.h"
#include "engine/arch/split.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>

static int llama_load(ld *l)
{
    model *m = l->m;
    hparams *hp = &m->hp;
    int E = hp->n_embd, HD = hp->head_dim, QD = hp->n_head * HD, KD = hp->n_head_kv * HD;
    if (ld_common(l, (size_t)2 * E + hp->n_rot + (size_t)hp->n_layer * (2 * E + QD + 2 * KD + 2 * HD + ly_moe_vec(hp)) +
                         64))
        return -1;
    int moe = hp->n_expert > 0;
    if (moe) {
        if (hp->expert_gating < 0) hp->expert_gating = BE_MOE_SOFTMAX;
        if (hp->expert_norm < 0) hp->expert_norm = 1;   /* (llama.cpp: Mixtral and Qwen-MoE renormalise) */
    } else {
        char nm[64];
        snprintf(nm, sizeof nm, "blk.0.ffn_gate_exps.weight");
        if (ld_tensor(l, nm))
            return ld_fail(l, "tensor '%s' holds experts but %s.expert_count is absent (expected the number of "
                           "experts)", nm, m->arch_name);
    }
    if (get_w(l, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, 0, 0)) return -1;
    int bias = (m->arch->opt & ARCH_QKV_BIAS) != 0, qkn = (m->arch->opt & ARCH_QK_NORM) != 0;
    for (int i = 0; i < hp->n_layer; i++) {
        layer_w *L = &m->layers[i];
        if (get_layer_w(l, &L->attn_norm, i, "attn_norm.weight", E, 0, 1) || ly_load_attn(l, L, i, QD) ||
            get_layer_w(l, &L->ffn_norm, i, "ffn_norm.weight", E, 0, 1) ||
            (moe ? ly_load_moe(l, L, i) : ly_load_ffn_glu(l, L, i)))
            return -1;
        if (get_layer_w(l, &L->bq, i, "attn_q.bias", QD, 0, bias) ||
            get_layer_w(l, &L->bk, i, "attn_k.bias", KD, 0, bias) ||
            get_layer_w(l, &L->bv, i, "attn_v.bias", KD, 0, bias))
            return -1;
        if (get_layer_w(l, &L->q_norm, i, "attn_q_norm.weight", HD, 0, qkn) ||
            get_layer_w(l, &L->k_norm, i, "attn_k_norm.weight", HD, 0, qkn))
            return -1;
    }
    hp->n_attn_layers = hp->n_layer;
    return 0;
}

static int llama_open(fw **out, model *m, be *b, int max_T, int max_out, int max_seqs, char *err, size_t errlen)
{
    const be_moe silu_glu = { .act = BE_MOE_SILU };
    /* (no dense FFN with experts) */
    return ly_fw_open(out, &arch_llama, m, b, m->hp.n_expert ? 1 : (size_t)m->hp.n_ff, 1, &silu_glu, max_T, max_out,
                      err, errlen);
}

/* Layer l's q, k, v from f->xb and its attention into f->att. */
static void llama_attention(ly_fw *f, int l, const be_batch *bt)
{
    const model *m = f->base.m;
    const hparams *hp = &m->hp;
    const layer_w *L = &m->layers[l];
    be *b = f->base.b;
    const be_ops *o = b->ops;
    int T = bt->T, HD = hp->head_dim;
    const wt *freq_div = &m->rope_freqs;
    /* with a fused rope_kv and no q/k norm between, the biases go there
     * (one pass over q, k, v instead of one per matmul) */
    const wt *qkv_b[3] = { &L->bq, &L->bk, &L->bv }, *none[3] = { NULL, NULL, NULL };
    const wt *const *mb = o->rope_kv && !L->q_norm.data ? none : qkv_b;
    const wt *wqkv[3] = { &L->wq, &L->wk, &L->wv };
    /* (a backend may take the q/k/v matmuls and the rope in one go) */
    if (mb == none && o->qkv_rope &&
        o->qkv_rope(b, wqkv, qkv_b, f->xb, f->q, f->k, f->v, f->base.kc[l], f->base.vc[l], bt, hp->n_head,
                    hp->n_head_kv, HD, hp->n_rot, hp->rope_base, hp->rope_neox, freq_div)) {
        o->attention(b, f->q, f->base.kc[l], f->base.vc[l], bt, hp->n_head, hp->n_head_kv, HD, f->att);
        return;
    }
    float *const qkv[3] = { f->q, f->k, f->v };
    ly_matmuls(b, 3, wqkv, mb, f->xb, T, qkv);
    ly_attn a = { hp->n_head, hp->n_head_kv, HD, hp->n_rot, hp->rope_base, hp->rope_neox, freq_div,
                  L->q_norm.data ? &L->q_norm : NULL, L->q_norm.data ? &L->k_norm : NULL, hp->norm_eps, 1, 0, NULL, 0 };
    ly_attend(b, &a, f->q, f->k, f->v, f->base.kc[l], f->base.vc[l], bt, mb == none ? qkv_b : NULL, f->att);
}

/* (backends with fused ops: each residual add runs with the next norm) */
static void llama_layer(ly_fw *f, const layer_w *L, int l, const be_batch *bt)
{
    const model *m = f->base.m;
    const hparams *hp = &m->hp;
    be *b = f->base.b;
    const be_ops *o = b->ops;
    int T = bt->T, E = hp->n_embd, fuse = o->add_rmsnorm != NULL;
    if (!fuse || l == 0) o->rmsnorm(b, f->x, &L->attn_norm, T, E, hp->norm_eps, f->xb);
    llama_attention(f, l, bt);
    o->matmul(b, &L->wo, NULL, f->att, T, f->xb);
    ly_reduce(f, f->xb, (size_t)T * E);
    ly_add_norm(b, f->x, f->xb, &L->ffn_norm, T, E, hp->norm_eps, f->xb);
    if (L->ffn_gate_exps.data) ly_moe_ffn(b, &f->moe, l, f->xb, T, f->xb);
    else ly_ffn_glu(b, L, f->xb, T, hp->n_ff, 1, f->hg, f->hu, f->xb);
    ly_reduce(f, f->xb, (size_t)T * E);
    if (fuse && l + 1 < hp->n_layer)
        o->add_rmsnorm(b, f->x, f->xb, &m->layers[l + 1].attn_norm, T, E, hp->norm_eps, f->xb);
    else if (!(fuse && f->every_row && f->last_here))   /* (else llama_last adds it, with the output norm) */
        o->add(b, f->x, f->xb, (size_t)T * E);
}

/* every row out (decode) with fused ops: the last residual add with the
 * output norm (the batch's T rows are the n_out) */
static void llama_last(ly_fw *f, const int32_t *out_idx, int n_out)
{
    const model *m = f->base.m;
    be *b = f->base.b;
    if (!b->ops->add_rmsnorm || !f->every_row) {
        ly_logits(b, m, f->x, out_idx, n_out, m->hp.norm_eps, f->xo, f->base.lg);
        return;
    }
    b->ops->add_rmsnorm(b, f->x, f->xb, &m->output_norm, n_out, m->hp.n_embd, m->hp.norm_eps, f->xo);
    if (n_out > 0) b->ops->matmul(b, &m->output, NULL, f->xo, n_out, f->base.lg);
}

static void llama_pass(fw *base, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    static const ly_pass p = { .layer = llama_layer, .last = llama_last };
    ly_fw_pass((ly_fw *)base, &p, tokens, bt, out_idx, n_out);
}

const arch_family arch_llama = { .load = llama_load, .lacks = ly_moe_lacks, .open = llama_open, .close = ly_fw_close,
                                 .pass = llama_pass, .greedy = 1, .split = sp_layers };
