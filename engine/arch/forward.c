/* forward.c — llama-family transformer (llama, qwen2, qwen3):
 *   x = embed(tokens)
 *   per layer: x += Wo · attn(rope(norm_q(Wq·n(x)+bq)), rope(norm_k(Wk·n(x)+bk)), Wv·n(x)+bv)
 *              x += Wd · (silu(Wg·n(x)) ∘ Wu·n(x))
 *   logits = Wout · n(x)  (only for the rows asked for)
 * Buffers (T = tokens in the batch, E = n_embd, Q = n_head*head_dim,
 * K = n_head_kv*head_dim, F = n_ff, V = n_vocab):
 *   x, xb [T][E]   q, att [T][Q]   k, v [T][K]   hg, hu [T][F]
 *   xo [max_out][E]   lg [max_out][V] */
#include "engine/arch/forward.h"
#include "engine/arch/qwen35.h"

#include <stdio.h>
#include <stdlib.h>

struct fw {
    model *m;
    be *b;
    int max_T, max_out, n_pages;
    float *x, *xb, *q, *k, *v, *att, *hg, *hu, *xo, *lg;
    void **kc, **vc;           /* [n_layer] cache of each layer */
    size_t kv_bytes;
    fwq *q35;                  /* qwen35 models run there */
};

size_t fw_kv_page_bytes(const model *m, size_t kv_elt)
{
    const hparams *hp = &m->hp;
    if (hp->arch == ARCH_QWEN35) return fwq_kv_page_bytes(m, kv_elt);
    return (size_t)2 * hp->n_layer * KV_PAGE * hp->n_head_kv * hp->head_dim * kv_elt;
}

void fw_close(fw *f)
{
    if (!f) return;
    fwq_close(f->q35);
    be *b = f->b;
    float *bufs[] = { f->x, f->xb, f->q, f->k, f->v, f->att, f->hg, f->hu, f->xo, f->lg };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) b->ops->free(b, bufs[i]);
    for (int l = 0; l < f->m->hp.n_layer; l++) {
        if (f->kc && f->kc[l]) b->ops->free(b, f->kc[l]);
        if (f->vc && f->vc[l]) b->ops->free(b, f->vc[l]);
    }
    free(f->kc);
    free(f->vc);
    free(f);
}

void fw_seq_reset(fw *f, int slot)
{
    if (f->q35) fwq_seq_reset(f->q35, slot);   /* others keep no state outside the KV pages */
}

int fw_open(fw **out, model *m, be *b, int max_T, int max_out, int n_pages, int max_seqs,
            char *err, size_t errlen)
{
    (void)max_seqs;
    const hparams *hp = &m->hp;
    fw *f = calloc(1, sizeof *f);
    if (!f) goto oom;
    f->m = m; f->b = b; f->max_T = max_T; f->max_out = max_out; f->n_pages = n_pages;
    if (hp->arch == ARCH_QWEN35) {
        if (fwq_open(&f->q35, m, b, max_T, max_out, n_pages, max_seqs, err, errlen)) { free(f); return -1; }
        *out = f;
        return 0;
    }
    size_t T = (size_t)max_T, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           K = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    f->x = b->ops->alloc(b, T * E * 4);
    f->xb = b->ops->alloc(b, T * E * 4);
    f->q = b->ops->alloc(b, T * Q * 4);
    f->att = b->ops->alloc(b, T * Q * 4);
    f->k = b->ops->alloc(b, T * K * 4);
    f->v = b->ops->alloc(b, T * K * 4);
    f->hg = b->ops->alloc(b, T * F * 4);
    f->hu = b->ops->alloc(b, T * F * 4);
    f->xo = b->ops->alloc(b, (size_t)max_out * E * 4);
    f->lg = b->ops->alloc(b, (size_t)max_out * hp->n_vocab * 4);
    f->kc = calloc((size_t)hp->n_layer, sizeof *f->kc);
    f->vc = calloc((size_t)hp->n_layer, sizeof *f->vc);
    if (!f->x || !f->xb || !f->q || !f->att || !f->k || !f->v || !f->hg || !f->hu || !f->xo || !f->lg ||
        !f->kc || !f->vc)
        goto oom;
    size_t layer_bytes = (size_t)n_pages * KV_PAGE * K * b->kv_elt;
    for (int l = 0; l < hp->n_layer; l++) {
        f->kc[l] = b->ops->alloc(b, layer_bytes);
        f->vc[l] = b->ops->alloc(b, layer_bytes);
        if (!f->kc[l] || !f->vc[l]) {
            snprintf(err, errlen, "cannot allocate the KV cache (%zu MiB)",
                     (size_t)2 * hp->n_layer * layer_bytes >> 20);
            fw_close(f);
            return -1;
        }
    }
    f->kv_bytes = (size_t)2 * hp->n_layer * layer_bytes;
    *out = f;
    return 0;
oom:
    snprintf(err, errlen, "out of memory for activation buffers");
    fw_close(f);
    return -1;
}

int fw_snap_count(const fw *f) { return f->q35 ? fwq_snap_count(f->q35) : 0; }
void fw_snap_save(fw *f, int slot, int snap) { if (f->q35) fwq_snap_save(f->q35, slot, snap); }
void fw_snap_load(fw *f, int snap, int slot) { if (f->q35) fwq_snap_load(f->q35, snap, slot); }
void fw_snap_at(fw *f, int slot, int pos, int snap) { if (f->q35) fwq_snap_at(f->q35, slot, pos, snap); }

size_t fw_kv_bytes(const fw *f) { return f->q35 ? fwq_kv_bytes(f->q35) : f->kv_bytes; }

void fw_out_norm(be *b, const float *x, const wt *w, const int32_t *out_idx, int n_out, int E, float eps,
                 float *xo)
{
    for (int i = 0, j; i < n_out; i = j) {
        for (j = i + 1; j < n_out && out_idx[j] == out_idx[j - 1] + 1; j++) {}
        b->ops->rmsnorm(b, x + (size_t)out_idx[i] * E, w, j - i, E, eps, xo + (size_t)i * E);
    }
}

/* Layer l's q, k, v from f->xb, their norms and rope, and the KV store;
 * 1 when the backend did the attention into f->att too (rope_attention). */
static int fw_qkv_rope(fw *f, int l, const be_batch *bt)
{
    const hparams *hp = &f->m->hp;
    const layer_w *L = &f->m->layers[l];
    be *b = f->b;
    const be_ops *o = b->ops;
    int T = bt->T, HD = hp->head_dim;
    const wt *freq_div = &f->m->rope_freqs;
    /* with a fused rope_kv and no q/k norm between, the biases go there
     * (one pass over q, k, v instead of one per matmul) */
    const wt *qkv_b[3] = { &L->bq, &L->bk, &L->bv }, *none[3] = { NULL, NULL, NULL };
    const wt *const *mb = o->rope_kv && !L->q_norm.data ? none : qkv_b;
    const wt *wqkv[3] = { &L->wq, &L->wk, &L->wv };
    /* (a backend may take the q/k/v matmuls and the rope in one go) */
    if (mb == none && o->qkv_rope &&
        o->qkv_rope(b, wqkv, qkv_b, f->xb, f->q, f->k, f->v, f->kc[l], f->vc[l], bt, hp->n_head, hp->n_head_kv, HD,
                    hp->n_rot, hp->rope_base, hp->rope_neox, freq_div))
        return 0;
    if (o->matmul_n) {
        float *outs[3] = { f->q, f->k, f->v };
        o->matmul_n(b, 3, wqkv, mb, f->xb, T, outs);
    } else {
        o->matmul(b, &L->wq, mb[0], f->xb, T, f->q);
        o->matmul(b, &L->wk, mb[1], f->xb, T, f->k);
        o->matmul(b, &L->wv, mb[2], f->xb, T, f->v);
    }
    if (L->q_norm.data) {
        o->rmsnorm(b, f->q, &L->q_norm, T * hp->n_head, HD, hp->norm_eps, f->q);
        o->rmsnorm(b, f->k, &L->k_norm, T * hp->n_head_kv, HD, hp->norm_eps, f->k);
    }
    const wt *const *rb = mb == none ? qkv_b : NULL;
    if (o->rope_attention) {
        o->rope_attention(b, f->q, f->k, f->v, f->kc[l], f->vc[l], bt, hp->n_head, hp->n_head_kv, HD, hp->n_rot,
                          hp->rope_base, hp->rope_neox, freq_div, rb, f->att);
        return 1;
    }
    if (o->rope_kv) {
        o->rope_kv(b, f->q, f->k, f->v, f->kc[l], f->vc[l], bt, hp->n_head, hp->n_head_kv, HD, hp->n_rot,
                   hp->rope_base, hp->rope_neox, freq_div, rb);
    } else {
        o->rope(b, f->q, bt, hp->n_head, HD, hp->n_rot, hp->rope_base, hp->rope_neox, freq_div);
        o->rope(b, f->k, bt, hp->n_head_kv, HD, hp->n_rot, hp->rope_base, hp->rope_neox, freq_div);
        o->kv_store(b, f->kc[l], f->vc[l], bt, hp->n_head_kv * HD, f->k, f->v);
    }
    return 0;
}

/* Every op of a forward pass, up to the logits in f->lg (queued, not synced). */
static void fw_pass(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    const model *m = f->m;
    const hparams *hp = &m->hp;
    be *b = f->b;
    const be_ops *o = b->ops;
    int T = bt->T, E = hp->n_embd, HD = hp->head_dim, F = hp->n_ff;
    /* a backend that records passes (CUDA graphs) may replay one instead */
    if (o->step_begin && o->step_begin(b, tokens, bt, out_idx, n_out)) goto ops_done;
    o->embed(b, &m->tok_embd, tokens, T, f->x);
    /* backends with fused ops: each residual add runs with the next norm */
    int fuse = o->add_rmsnorm != NULL, every_row = n_out == T;
    for (int i = 0; every_row && i < n_out; i++) every_row = out_idx[i] == i;
    for (int l = 0; l < hp->n_layer; l++) {
        const layer_w *L = &m->layers[l];
        if (!fuse || l == 0) o->rmsnorm(b, f->x, &L->attn_norm, T, E, hp->norm_eps, f->xb);
        if (!fw_qkv_rope(f, l, bt))
            o->attention(b, f->q, f->kc[l], f->vc[l], bt, hp->n_head, hp->n_head_kv, HD, f->att);
        o->matmul(b, &L->wo, NULL, f->att, T, f->xb);
        if (fuse) {
            o->add_rmsnorm(b, f->x, f->xb, &L->ffn_norm, T, E, hp->norm_eps, f->xb);
        } else {
            o->add(b, f->x, f->xb, (size_t)T * E);
            o->rmsnorm(b, f->x, &L->ffn_norm, T, E, hp->norm_eps, f->xb);
        }
        if (o->matmul_glu) {
            o->matmul_glu(b, &L->w_gate, &L->w_up, f->xb, T, f->hg, f->hu, f->hg);
        } else {
            if (o->matmul_n) {
                const wt *ws[2] = { &L->w_gate, &L->w_up }, *bs[2] = { NULL, NULL };
                float *outs[2] = { f->hg, f->hu };
                o->matmul_n(b, 2, ws, bs, f->xb, T, outs);
            } else {
                o->matmul(b, &L->w_gate, NULL, f->xb, T, f->hg);
                o->matmul(b, &L->w_up, NULL, f->xb, T, f->hu);
            }
            o->silu_mul(b, f->hg, f->hu, (size_t)T * F, f->hg);
        }
        o->matmul(b, &L->w_down, NULL, f->hg, T, f->xb);
        if (fuse && l + 1 < hp->n_layer)
            o->add_rmsnorm(b, f->x, f->xb, &m->layers[l + 1].attn_norm, T, E, hp->norm_eps, f->xb);
        else if (!(fuse && every_row))
            o->add(b, f->x, f->xb, (size_t)T * E);
    }
    /* every row out (decode): the last residual add with the output norm */
    if (fuse && every_row)
        o->add_rmsnorm(b, f->x, f->xb, &m->output_norm, T, E, hp->norm_eps, f->xo);
    else
        fw_out_norm(b, f->x, &m->output_norm, out_idx, n_out, E, hp->norm_eps, f->xo);
    if (n_out > 0) o->matmul(b, &m->output, NULL, f->xo, n_out, f->lg);
ops_done:
    if (o->step_end) o->step_end(b);
}

void fw_run(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out, float *logits)
{
    be *b = f->b;
    if (f->q35) { fwq_run(f->q35, tokens, bt, out_idx, n_out, logits); return; }
    fw_pass(f, tokens, bt, out_idx, n_out);
    if (n_out > 0) b->ops->to_host(b, logits, f->lg, (size_t)n_out * f->m->hp.n_vocab * 4);
    b->ops->sync(b);
}

int fw_greedy_ok(const fw *f) { return !f->q35 && f->b->ops->argmax != NULL; }

int fw_greedy_queue(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    be *b = f->b;
    if (f->q35 || !b->ops->argmax_queue || n_out <= 0 || n_out > BE_QUEUE_ROWS) return -1;
    fw_pass(f, tokens, bt, out_idx, n_out);
    b->ops->argmax_queue(b, f->lg, n_out, f->m->hp.n_vocab);
    return 0;
}

void fw_greedy_take(fw *f, int32_t *ids, int n_out) { f->b->ops->argmax_take(f->b, ids, n_out); }

void fw_run_greedy(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out,
                   int32_t *ids)
{
    be *b = f->b;
    fw_pass(f, tokens, bt, out_idx, n_out);
    if (n_out > 0) b->ops->argmax(b, f->lg, n_out, f->m->hp.n_vocab, ids);
    b->ops->sync(b);
}
