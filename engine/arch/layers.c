/* layers.c — see layers.h. */
#include "engine/arch/layers.h"
#include "engine/arch/arch.h"
#include "common/err.h"

#include <stdlib.h>

void ly_attend(be *b, const ly_attn *a, float *q, float *k, float *v, void *kc, void *vc, const be_batch *bt,
               const wt *const *rope_bias, float *att)
{
    const be_ops *o = b->ops;
    int T = bt->T, HD = a->head_dim;
    if (a->q_norm) {
        o->rmsnorm(b, q, a->q_norm, T * a->n_head, HD, a->norm_eps, q);
        o->rmsnorm(b, k, a->k_norm, T * a->n_head_kv, HD, a->norm_eps, k);
    }
    int ex = a->window > 0 || a->sinks || a->scale != 0;
    if (a->fused && o->rope_attention && !ex) {
        o->rope_attention(b, q, k, v, kc, vc, bt, a->n_head, a->n_head_kv, HD, a->n_rot, a->rope_base, a->rope_neox,
                          a->freq_div, rope_bias, att);
        return;
    }
    if (a->fused && o->rope_kv) {
        o->rope_kv(b, q, k, v, kc, vc, bt, a->n_head, a->n_head_kv, HD, a->n_rot, a->rope_base, a->rope_neox,
                   a->freq_div, rope_bias);
    } else {
        o->rope(b, q, bt, a->n_head, HD, a->n_rot, a->rope_base, a->rope_neox, a->freq_div);
        o->rope(b, k, bt, a->n_head_kv, HD, a->n_rot, a->rope_base, a->rope_neox, a->freq_div);
        o->kv_store(b, kc, vc, bt, a->n_head_kv * HD, k, v);
    }
    if (ex) {
        be_attn_ex e = { a->window, a->sinks, a->scale };
        o->attention_ex(b, q, kc, vc, bt, a->n_head, a->n_head_kv, HD, &e, att);
    } else {
        o->attention(b, q, kc, vc, bt, a->n_head, a->n_head_kv, HD, att);
    }
}

void ly_matmuls(be *b, int n, const wt *const *w, const wt *const *bias, const float *x, int T, float *const *out)
{
    const be_ops *o = b->ops;
    if (o->matmul_n) {
        o->matmul_n(b, n, w, bias, x, T, out);
        return;
    }
    for (int i = 0; i < n; i++) o->matmul(b, w[i], bias[i], x, T, out[i]);
}

void ly_ffn_glu(be *b, const layer_w *L, const float *x, int T, int n_ff, int fused, float *hg, float *hu,
                float *out)
{
    const be_ops *o = b->ops;
    if (fused && o->matmul_glu) {
        o->matmul_glu(b, &L->w_gate, &L->w_up, x, T, hg, hu, hg);
    } else {
        if (fused) {
            const wt *ws[2] = { &L->w_gate, &L->w_up }, *bs[2] = { NULL, NULL };
            float *const outs[2] = { hg, hu };
            ly_matmuls(b, 2, ws, bs, x, T, outs);
        } else {
            o->matmul(b, &L->w_gate, NULL, x, T, hg);
            o->matmul(b, &L->w_up, NULL, x, T, hu);
        }
        o->silu_mul(b, hg, hu, (size_t)T * n_ff, hg);
    }
    o->matmul(b, &L->w_down, NULL, hg, T, out);
}

void ly_out_norm(be *b, const float *x, const wt *w, const int32_t *out_idx, int n_out, int E, float eps,
                 float *xo)
{
    for (int i = 0, j; i < n_out; i = j) {
        for (j = i + 1; j < n_out && out_idx[j] == out_idx[j - 1] + 1; j++) {}
        b->ops->rmsnorm(b, x + (size_t)out_idx[i] * E, w, j - i, E, eps, xo + (size_t)i * E);
    }
}

int ly_fw_open(fw **out, const arch_family *fam, model *m, be *b, size_t F, int glu, const be_moe *how, int max_T,
               int max_out, char *err, size_t errlen)
{
    const hparams *hp = &m->hp;
    ly_fw *f = calloc(1, sizeof *f);
    if (!f) return err_set(err, errlen, "out of memory for activation buffers");
    f->base = (fw){ .fam = fam, .m = m, .b = b };
    size_t T = (size_t)max_T, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           K = (size_t)hp->n_head_kv * hp->head_dim, O = (size_t)max_out;
    const ly_buf bufs[] = { { &f->x, T * E }, { &f->xb, T * E }, { &f->q, T * Q }, { &f->att, T * Q },
                            { &f->k, T * K }, { &f->v, T * K }, { &f->hg, T * F }, { &f->xo, O * E },
                            { &f->base.lg, O * hp->n_vocab }, { &f->hu, T * F } };
    if (ly_bufs_alloc(b, bufs, sizeof bufs / sizeof bufs[0] - !glu, err, errlen) ||
        (how && ly_moe_open(&f->moe, b, m, how, max_T, NULL, err, errlen))) {
        ly_fw_close(&f->base);
        return -1;
    }
    f->base.xo = f->xo;
    *out = &f->base;
    return 0;
}

void ly_fw_close(fw *base)
{
    ly_fw *f = (ly_fw *)base;
    void *bufs[] = { f->x, f->xb, f->q, f->k, f->v, f->att, f->hg, f->hu, f->xo, base->lg };
    ly_free(base->b, bufs, sizeof bufs / sizeof bufs[0]);
    ly_moe_close(&f->moe, base->b);
    free(f);
}

void ly_fw_pass(ly_fw *f, const ly_pass *p, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx,
                int n_out)
{
    const model *m = f->base.m;
    be *b = f->base.b;
    /* a layer split's stage (split.h): x from the stage before, to the next */
    int in = m->n_stages > 1 && m->stage > 0, out = m->n_stages > 1 && m->stage < m->n_stages - 1;
    size_t xn = (size_t)bt->T * m->hp.n_embd;
    f->every_row = n_out == bt->T;
    for (int i = 0; f->every_row && i < n_out; i++) f->every_row = out_idx[i] == i;
    f->last_here = !out;
    if (in) {
        fw_recv(&f->base, f->x, xn, m->stage - 1);
    } else {
        b->ops->embed(b, &m->tok_embd, tokens, bt->T, f->x);
        if (p->first) p->first(f, bt);
    }
    for (int l = 0; l < m->hp.n_layer; l++) p->layer(f, &m->layers[l], l, bt);
    if (out) fw_send(&f->base, f->x, xn, m->stage + 1);
    else if (p->last) p->last(f, out_idx, n_out);
    else ly_logits(b, m, f->x, out_idx, n_out, m->hp.norm_eps, f->xo, f->base.lg);
}

void ly_logits(be *b, const model *m, const float *x, const int32_t *out_idx, int n_out, float eps, float *xo,
               float *lg)
{
    ly_out_norm(b, x, &m->output_norm, out_idx, n_out, (int)m->hp.n_embd, eps, xo);
    if (n_out > 0) b->ops->matmul(b, &m->output, NULL, xo, n_out, lg);
}

void ly_add_norm(be *b, float *x, const float *y, const wt *w, int T, int E, float eps, float *out)
{
    if (b->ops->add_rmsnorm) {
        b->ops->add_rmsnorm(b, x, y, w, T, E, eps, out);
    } else {
        b->ops->add(b, x, y, (size_t)T * E);
        b->ops->rmsnorm(b, x, w, T, E, eps, out);
    }
}

int ly_kv_open(be *b, const model *m, int n_pages, int max_seqs, void ***kc, void ***vc, size_t *bytes,
               char *err, size_t errlen)
{
    const hparams *hp = &m->hp;
    *kc = calloc((size_t)hp->n_layer, sizeof **kc);
    *vc = calloc((size_t)hp->n_layer, sizeof **vc);
    if (!*kc || !*vc) return err_set(err, errlen, "out of memory for activation buffers");
    for (int l = 0; l < hp->n_layer; l++) {
        if (m->layers[l].linear) continue;
        const int ring = m->swa_ring && m->layers[l].swa;
        const size_t rows = ring ? (size_t)m->swa_ring * (size_t)(max_seqs > 0 ? max_seqs : 1)
                                 : (size_t)n_pages * KV_PAGE;
        const size_t layer_bytes = rows * be_kv_bytes(b->kv_type, (size_t)hp->n_head_kv * hp->head_dim);
        (*kc)[l] = b->ops->alloc(b, layer_bytes);
        (*vc)[l] = b->ops->alloc(b, layer_bytes);
        if (!(*kc)[l] || !(*vc)[l])
            return err_set(err, errlen, "cannot allocate the KV cache of layer %d (%zu MiB)", l,
                           (size_t)2 * layer_bytes >> 20);
        *bytes += 2 * layer_bytes;
    }
    return 0;
}

const be_batch *ly_kv_batch(const model *m, int l, const be_batch *bt, be_batch *ring)
{
    if (!m->swa_ring || !m->layers[l].swa) return bt;
    *ring = *bt;
    ring->ring = m->swa_ring;
    return ring;
}

void ly_kv_close(be *b, const model *m, void **kc, void **vc)
{
    for (int l = 0; l < m->hp.n_layer; l++) {
        if (kc && kc[l]) b->ops->free(b, kc[l]);
        if (vc && vc[l]) b->ops->free(b, vc[l]);
    }
    free(kc);
    free(vc);
}

int ly_bufs_alloc(be *b, const ly_buf *bufs, size_t n, char *err, size_t errlen)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        *bufs[i].p = b->ops->alloc(b, bufs[i].n * 4);
        bad |= !*bufs[i].p;
    }
    return bad ? err_set(err, errlen, "out of memory for activation buffers") : 0;
}

void ly_free(be *b, void *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) b->ops->free(b, p[i]);
}

int ly_load_attn(ld *l, layer_w *L, int i, int64_t q_out)
{
    const hparams *hp = &l->m->hp;
    int E = hp->n_embd, QD = hp->n_head * hp->head_dim, KD = hp->n_head_kv * hp->head_dim;
    return get_layer_w(l, &L->wq, i, "attn_q.weight", E, q_out, 1) ||
           get_layer_w(l, &L->wk, i, "attn_k.weight", E, KD, 1) ||
           get_layer_w(l, &L->wv, i, "attn_v.weight", E, KD, 1) ||
           get_layer_w(l, &L->wo, i, "attn_output.weight", QD, E, 1) ? -1 : 0;
}

int ly_load_ffn_glu(ld *l, layer_w *L, int i)
{
    int E = l->m->hp.n_embd, F = l->m->hp.n_ff;
    return get_layer_w(l, &L->w_gate, i, "ffn_gate.weight", E, F, 1) ||
           get_layer_w(l, &L->w_up, i, "ffn_up.weight", E, F, 1) ||
           get_layer_w(l, &L->w_down, i, "ffn_down.weight", F, E, 1) ? -1 : 0;
}
