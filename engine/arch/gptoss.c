/* gptoss.c — the gpt-oss family (row gpt-oss of arch.c):
 *   x = embed(tokens)
 *   per layer: h = n(x)
 *              x += Wo · attn_ex(rope(Wq·h+bq), rope(Wk·h+bk), Wv·h+bv) + bo
 *              x += moe(n(x))
 *   logits = Wout · n(x)  (only for the rows asked for)
 * The rope is YaRN (model.c builds its table); the attention of the even
 * layers sees a sliding window of hp->swa_window tokens, the odd ones every
 * token, and each head has a learned sink logit in its softmax denominator
 * (backend.h attention_ex). Every FFN is a mixture of experts: a router with
 * a bias, the top n_used logits chosen and weighted by their softmax, each
 * expert a clamped SwiGLU with biases (BE_MOE_SWIGLU_OAI). Buffers:
 * layers.h's ly_fw (hg unused). */
#include "engine/arch/arch.h"
#include "engine/arch/layers.h"
#include "engine/arch/split.h"
#include "common/err.h"

#include <math.h>
#include <stdlib.h>

/* llama.cpp's fixed values for gpt-oss, which its GGUF files do not carry */
#define GPTOSS_SWIGLU_ALPHA 1.702f
#define GPTOSS_SWIGLU_LIMIT 7.0f

/* The sliding-window layers: the even ones (layer_types alternate
 * sliding_attention, full_attention; llama.cpp's swa pattern 2). */
static int gptoss_swa(int l) { return l % 2 == 0; }

static int gptoss_load(ld *l)
{
    model *m = l->m;
    hparams *hp = &m->hp;
    int E = hp->n_embd, HD = hp->head_dim, QD = hp->n_head * HD, KD = hp->n_head_kv * HD;
    if (l->hf) {
        const hf_config *c = hf_cfg(l->hf);
        hp->swa_window = (int32_t)c->sliding_window;
        hp->swiglu_limit = (float)c->swiglu_limit;
    } else {
        int64_t v;
        if (key_ir(l, "attention.sliding_window", &v, 1, 0, 1, 1 << 24)) return -1;
        hp->swa_window = (int32_t)v;
        hp->swiglu_limit = GPTOSS_SWIGLU_LIMIT;
    }
    if (!hp->n_expert)
        return ld_fail(l, "%s: expert_count is 0 or absent, expected the number of experts (every gpt-oss layer "
                       "is a mixture of experts)", m->arch_name);
    if (hp->expert_gating >= 0 && hp->expert_gating != BE_MOE_TOPK_SOFTMAX)
        return ld_fail(l, "metadata key '%s.expert_gating_func' is not 3 (softmax over the chosen experts, "
                       "gpt-oss's)", m->arch_name);
    hp->expert_gating = BE_MOE_TOPK_SOFTMAX;
    hp->expert_norm = 0;   /* (the softmax over the chosen already sums to 1) */
    if (ld_common(l, (size_t)2 * E + (size_t)hp->n_layer * (3 * E + QD + 2 * KD + hp->n_head + ly_moe_vec(hp)) + 64))
        return -1;
    const char *post = l->hf ? "ffn_norm.weight" : "post_attention_norm.weight";
    for (int i = 0; i < hp->n_layer; i++) {
        layer_w *L = &m->layers[i];
        if (get_layer_w(l, &L->attn_norm, i, "attn_norm.weight", E, 0, 1) || ly_load_attn(l, L, i, QD) ||
            get_layer_w(l, &L->bq, i, "attn_q.bias", QD, 0, 1) || get_layer_w(l, &L->bk, i, "attn_k.bias", KD, 0, 1) ||
            get_layer_w(l, &L->bv, i, "attn_v.bias", KD, 0, 1) ||
            get_layer_w(l, &L->bo, i, "attn_output.bias", E, 0, 1) ||
            get_layer_w(l, &L->attn_sinks, i, "attn_sinks.weight", hp->n_head, 0, 1) ||
            get_layer_w(l, &L->ffn_norm, i, post, E, 0, 1) || ly_load_moe(l, L, i))
            return -1;
        L->swa = gptoss_swa(i);
    }
    hp->n_attn_layers = hp->n_layer;
    return 0;
}

static const char *gptoss_lacks(const model *m, const be_ops *o)
{
    if (!o->attention_ex) return "attention with a sliding window and sinks (attention_ex)";
    return ly_moe_lacks(m, o);
}

static int gptoss_open(fw **out, model *m, be *b, int max_T, int max_out, int max_seqs, char *err, size_t errlen)
{
    const be_moe swiglu = { .act = BE_MOE_SWIGLU_OAI, .alpha = GPTOSS_SWIGLU_ALPHA, .limit = m->hp.swiglu_limit };
    return ly_fw_open(out, &arch_gptoss, m, b, 1, 0, &swiglu, max_T, max_out, err, errlen);   /* (no dense FFN) */
}

/* Layer l's attention of f->xb into f->xb (through f->att). */
static void gptoss_attention(ly_fw *f, const layer_w *L, int l, const be_batch *bt)
{
    const model *m = f->base.m;
    const hparams *hp = &m->hp;
    be *b = f->base.b;
    const be_ops *o = b->ops;
    int T = bt->T, HD = hp->head_dim;
    const wt *wqkv[3] = { &L->wq, &L->wk, &L->wv }, *bqkv[3] = { &L->bq, &L->bk, &L->bv };
    float *const qkv[3] = { f->q, f->k, f->v };
    ly_matmuls(b, 3, wqkv, bqkv, f->xb, T, qkv);
    o->rope(b, f->q, bt, hp->n_head, HD, hp->n_rot, hp->rope_base, hp->rope_neox, &m->rope_freqs);
    o->rope(b, f->k, bt, hp->n_head_kv, HD, hp->n_rot, hp->rope_base, hp->rope_neox, &m->rope_freqs);
    be_batch rb;
    const be_batch *kb = ly_kv_batch(m, l, bt, &rb);
    o->kv_store(b, f->base.kc[l], f->base.vc[l], kb, hp->n_head_kv * HD, f->k, f->v);
    be_attn_ex ax = { .window = L->swa ? hp->swa_window : 0, .sinks = &L->attn_sinks,
                      .scale = 1.0f / sqrtf((float)HD) };
    o->attention_ex(b, f->q, f->base.kc[l], f->base.vc[l], kb, hp->n_head, hp->n_head_kv, HD, &ax, f->att);
    o->matmul(b, &L->wo, &L->bo, f->att, T, f->xb);
    ly_reduce(f, f->xb, (size_t)T * hp->n_embd);
}

static void gptoss_layer(ly_fw *f, const layer_w *L, int l, const be_batch *bt)
{
    const hparams *hp = &f->base.m->hp;
    be *b = f->base.b;
    const be_ops *o = b->ops;
    int T = bt->T, E = hp->n_embd;
    o->rmsnorm(b, f->x, &L->attn_norm, T, E, hp->norm_eps, f->xb);
    gptoss_attention(f, L, l, bt);
    ly_add_norm(b, f->x, f->xb, &L->ffn_norm, T, E, hp->norm_eps, f->xb);
    ly_moe_ffn(b, &f->moe, l, f->xb, T, f->xb);
    ly_reduce(f, f->xb, (size_t)T * E);
    o->add(b, f->x, f->xb, (size_t)T * E);
}

static void gptoss_pass(fw *base, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    static const ly_pass p = { .layer = gptoss_layer };
    ly_fw_pass((ly_fw *)base, &p, tokens, bt, out_idx, n_out);
}

const arch_family arch_gptoss = { .load = gptoss_load, .lacks = gptoss_lacks, .open = gptoss_open,
                                  .close = ly_fw_close, .pass = gptoss_pass, .greedy = 1, .split = sp_layers };
