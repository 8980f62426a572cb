/* forward_qwen35.c — Qwen3.5 hybrid transformer:
 *   x = embed(tokens)
 *   per layer: x += mixer(n(x));  x += Wd · (silu(Wg·n(x)) ∘ Wu·n(x))
 * where the mixer is, in linear layers (Gated DeltaNet),
 *   q,k,v = silu(causal_conv(Wqkv · h))      (conv state per sequence)
 *   o     = delta_rule(l2n(q), l2n(k), v; g = A·softplus(Wa·h + dt), beta = sigmoid(Wb·h))
 *   mixer = Wout · (rmsnorm(o) · w ∘ silu(Wz · h))           per value head
 * and, in full-attention layers (every full_attention_interval-th),
 *   [q | gate] = Wq · h per head;  q, k = rope(norm(q)), rope(norm(k)) on the first n_rot dims
 *   mixer = Wo · (attn(q, k, v) ∘ sigmoid(gate))
 * Buffers (T = tokens in the batch, E = n_embd, Q = n_head*head_dim,
 * K = n_head_kv*head_dim, CD = conv channels, SV = nv*dv, F = n_ff):
 *   x, xb [T][E]   big [T][max(2Q, CD)]   q [T][Q]   gz, att [T][max(Q, SV)]
 *   k, v [T][K]   ga, gb [T][nv]   hg, hu [T][F]   xo [max_out][E]   lg [max_out][V]
 * State: per linear layer conv [max_seqs][conv_k-1][CD] and delta-rule
 * [max_seqs][nv][dk][dv] (f32); KV cache pages for full-attention layers only. */
#include "engine/arch/qwen35.h"
#include "engine/arch/forward.h"   /* (fw_out_norm) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SNAP_BUDGET ((size_t)512 << 20)   /* bytes of recurrent-state snapshots at most */

struct fwq {
    model *m;
    be *b;
    int max_T, max_out, n_pages, max_seqs;
    float *x, *xb, *big, *q, *gz, *att, *k, *v, *ga, *gb, *hg, *hu, *xo, *lg;
    void **kc, **vc;            /* [n_layer]: full-attention layers only */
    float **conv, **ssm;        /* [n_layer]: linear layers only */
    float **conv_snap, **ssm_snap;  /* [n_layer]: n_snap copies of one slot's state */
    int n_snap;
    struct fwq_req { int slot, pos, snap; } *req;  /* [max_seqs] save points of the next run */
    be_save *sv;                /* [max_seqs] the same for one op */
    int n_req;
    size_t conv_slot, ssm_slot; /* floats per slot */
    float *zero;                /* host zeros for resets: max(conv_slot, ssm_slot) */
    size_t kv_bytes, state_bytes;
};

static int q35_conv_dim(const hparams *hp) { return 2 * hp->ssm_nk * hp->ssm_dk + hp->ssm_nv * hp->ssm_dv; }

size_t fwq_kv_page_bytes(const model *m, size_t kv_elt)
{
    const hparams *hp = &m->hp;
    return (size_t)2 * hp->n_attn_layers * KV_PAGE * hp->n_head_kv * hp->head_dim * kv_elt;
}

void fwq_close(fwq *f)
{
    if (!f) return;
    be *b = f->b;
    float *bufs[] = { f->x, f->xb, f->big, f->q, f->gz, f->att, f->k, f->v, f->ga, f->gb, f->hg, f->hu, f->xo, f->lg };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) b->ops->free(b, bufs[i]);
    for (int l = 0; l < f->m->hp.n_layer; l++) {
        if (f->kc && f->kc[l]) b->ops->free(b, f->kc[l]);
        if (f->vc && f->vc[l]) b->ops->free(b, f->vc[l]);
        if (f->conv && f->conv[l]) b->ops->free(b, f->conv[l]);
        if (f->ssm && f->ssm[l]) b->ops->free(b, f->ssm[l]);
        if (f->conv_snap && f->conv_snap[l]) b->ops->free(b, f->conv_snap[l]);
        if (f->ssm_snap && f->ssm_snap[l]) b->ops->free(b, f->ssm_snap[l]);
    }
    free(f->conv_snap);
    free(f->ssm_snap);
    free(f->req);
    free(f->sv);
    free(f->kc);
    free(f->vc);
    free(f->conv);
    free(f->ssm);
    free(f->zero);
    free(f);
}

void fwq_seq_reset(fwq *f, int slot)
{
    be *b = f->b;
    if (slot < 0 || slot >= f->max_seqs) return;
    for (int l = 0; l < f->m->hp.n_layer; l++) {
        if (!f->m->layers[l].linear) continue;
        b->ops->to_dev(b, f->conv[l] + (size_t)slot * f->conv_slot, f->zero, f->conv_slot * 4);
        b->ops->to_dev(b, f->ssm[l] + (size_t)slot * f->ssm_slot, f->zero, f->ssm_slot * 4);
    }
}

int fwq_open(fwq **out, model *m, be *b, int max_T, int max_out, int n_pages, int max_seqs,
             char *err, size_t errlen)
{
    const hparams *hp = &m->hp;
    const be_ops *o = b->ops;
    *out = NULL;
    if (!o->copy_rows || !o->sigmoid_mul || !o->rmsnorm_gated || !o->conv1d_silu || !o->deltanet) {
        snprintf(err, errlen, "the %s backend cannot run %s models yet (no linear-attention ops)", o->name,
                 m->arch_name);
        return -1;
    }
    if (max_seqs < 1) max_seqs = 1;
    fwq *f = calloc(1, sizeof *f);
    if (!f) goto oom;
    f->m = m; f->b = b; f->max_T = max_T; f->max_out = max_out; f->n_pages = n_pages; f->max_seqs = max_seqs;
    size_t T = (size_t)max_T, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           K = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, NV = hp->ssm_nv,
           CD = (size_t)q35_conv_dim(hp), SV = (size_t)hp->ssm_nv * hp->ssm_dv;
    size_t big = 2 * Q > CD ? 2 * Q : CD, wide = Q > SV ? Q : SV;
    f->x = o->alloc(b, T * E * 4);
    f->xb = o->alloc(b, T * E * 4);
    f->big = o->alloc(b, T * big * 4);
    f->q = o->alloc(b, T * Q * 4);
    f->gz = o->alloc(b, T * wide * 4);
    f->att = o->alloc(b, T * wide * 4);
    f->k = o->alloc(b, T * K * 4);
    f->v = o->alloc(b, T * K * 4);
    f->ga = o->alloc(b, T * NV * 4);
    f->gb = o->alloc(b, T * NV * 4);
    f->hg = o->alloc(b, T * F * 4);
    f->hu = o->alloc(b, T * F * 4);
    f->xo = o->alloc(b, (size_t)max_out * E * 4);
    f->lg = o->alloc(b, (size_t)max_out * hp->n_vocab * 4);
    f->kc = calloc((size_t)hp->n_layer, sizeof *f->kc);
    f->vc = calloc((size_t)hp->n_layer, sizeof *f->vc);
    f->conv = calloc((size_t)hp->n_layer, sizeof *f->conv);
    f->ssm = calloc((size_t)hp->n_layer, sizeof *f->ssm);
    f->conv_slot = (size_t)(hp->ssm_conv_k - 1) * CD;
    f->ssm_slot = NV * hp->ssm_dk * hp->ssm_dv;
    f->conv_snap = calloc((size_t)hp->n_layer, sizeof *f->conv_snap);
    f->ssm_snap = calloc((size_t)hp->n_layer, sizeof *f->ssm_snap);
    f->req = calloc((size_t)max_seqs, sizeof *f->req);
    f->sv = calloc((size_t)max_seqs, sizeof *f->sv);
    /* snapshots: two per slot, within SNAP_BUDGET (none: prefixes are recomputed) */
    size_t snap_bytes = (size_t)(hp->n_layer - hp->n_attn_layers) * (f->conv_slot + f->ssm_slot) * 4;
    f->n_snap = 2 * max_seqs;
    while (f->n_snap > 0 && (size_t)f->n_snap * snap_bytes > SNAP_BUDGET) f->n_snap--;
    f->zero = calloc(f->conv_slot > f->ssm_slot ? f->conv_slot + 1 : f->ssm_slot + 1, sizeof(float));
    if (!f->x || !f->xb || !f->big || !f->q || !f->gz || !f->att || !f->k || !f->v || !f->ga || !f->gb ||
        !f->hg || !f->hu || !f->xo || !f->lg || !f->kc || !f->vc || !f->conv || !f->ssm || !f->zero ||
        !f->conv_snap || !f->ssm_snap || !f->req || !f->sv)
        goto oom;
    size_t layer_bytes = (size_t)n_pages * KV_PAGE * K * b->kv_elt;
    for (int l = 0; l < hp->n_layer; l++) {
        if (m->layers[l].linear) {
            f->conv[l] = o->alloc(b, (size_t)max_seqs * f->conv_slot * 4 + 4);
            f->ssm[l] = o->alloc(b, (size_t)max_seqs * f->ssm_slot * 4);
            if (f->n_snap) {
                f->conv_snap[l] = o->alloc(b, (size_t)f->n_snap * f->conv_slot * 4 + 4);
                f->ssm_snap[l] = o->alloc(b, (size_t)f->n_snap * f->ssm_slot * 4);
            }
            if (!f->conv[l] || !f->ssm[l] || (f->n_snap && (!f->conv_snap[l] || !f->ssm_snap[l]))) {
                snprintf(err, errlen, "cannot allocate the recurrent state (%zu MiB)",
                         (size_t)hp->n_layer * (max_seqs + f->n_snap) * (f->conv_slot + f->ssm_slot) * 4 >> 20);
                fwq_close(f);
                return -1;
            }
            f->state_bytes += (size_t)(max_seqs + f->n_snap) * (f->conv_slot + f->ssm_slot) * 4;
            continue;
        }
        f->kc[l] = o->alloc(b, layer_bytes);
        f->vc[l] = o->alloc(b, layer_bytes);
        if (!f->kc[l] || !f->vc[l]) {
            snprintf(err, errlen, "cannot allocate the KV cache (%zu MiB)",
                     (size_t)2 * hp->n_attn_layers * layer_bytes >> 20);
            fwq_close(f);
            return -1;
        }
        f->kv_bytes += 2 * layer_bytes;
    }
    *out = f;
    return 0;
oom:
    snprintf(err, errlen, "out of memory for activation buffers");
    fwq_close(f);
    return -1;
}

int fwq_snap_count(const fwq *f) { return f->n_snap; }

/* Copies one slot-sized state between buffers (device memory: copy_rows). */
static void state_copy(fwq *f, float *dst, const float *src, size_t n)
{
    be *b = f->b;
    size_t row = f->m->hp.ssm_dv > 0 ? (size_t)f->m->hp.ssm_dv : 1;
    if (n % row) row = 1;
    if (n) b->ops->copy_rows(b, dst, row, src, row, (int)(n / row), (int)row);
}

void fwq_snap_save(fwq *f, int slot, int snap)
{
    if (slot < 0 || slot >= f->max_seqs || snap < 0 || snap >= f->n_snap) return;
    for (int l = 0; l < f->m->hp.n_layer; l++) {
        if (!f->m->layers[l].linear) continue;
        state_copy(f, f->conv_snap[l] + (size_t)snap * f->conv_slot, f->conv[l] + (size_t)slot * f->conv_slot, f->conv_slot);
        state_copy(f, f->ssm_snap[l] + (size_t)snap * f->ssm_slot, f->ssm[l] + (size_t)slot * f->ssm_slot, f->ssm_slot);
    }
}

void fwq_snap_load(fwq *f, int snap, int slot)
{
    if (slot < 0 || slot >= f->max_seqs || snap < 0 || snap >= f->n_snap) return;
    for (int l = 0; l < f->m->hp.n_layer; l++) {
        if (!f->m->layers[l].linear) continue;
        state_copy(f, f->conv[l] + (size_t)slot * f->conv_slot, f->conv_snap[l] + (size_t)snap * f->conv_slot, f->conv_slot);
        state_copy(f, f->ssm[l] + (size_t)slot * f->ssm_slot, f->ssm_snap[l] + (size_t)snap * f->ssm_slot, f->ssm_slot);
    }
}

void fwq_snap_at(fwq *f, int slot, int pos, int snap)
{
    if (slot < 0 || slot >= f->max_seqs || snap < 0 || snap >= f->n_snap || f->n_req >= f->max_seqs) return;
    f->req[f->n_req++] = (struct fwq_req){ slot, pos, snap };
}

/* The save points of this run for layer l: into its conv (ssm = 0) or
 * delta-rule (ssm = 1) snapshots. */
static const be_save *saves(fwq *f, int l, int ssm)
{
    for (int i = 0; i < f->n_req; i++) {
        size_t snap = (size_t)f->req[i].snap;
        f->sv[i].slot = f->req[i].slot;
        f->sv[i].pos = f->req[i].pos;
        f->sv[i].dst = ssm ? f->ssm_snap[l] + snap * f->ssm_slot : f->conv_snap[l] + snap * f->conv_slot;
    }
    return f->sv;
}

size_t fwq_kv_bytes(const fwq *f) { return f->kv_bytes + f->state_bytes; }

static void linear_layer(fwq *f, const layer_w *L, int l, const be_batch *bt)
{
    const hparams *hp = &f->m->hp;
    be *b = f->b;
    const be_ops *o = b->ops;
    int T = bt->T, CD = q35_conv_dim(hp);
    o->matmul(b, &L->ssm_qkv, NULL, f->xb, T, f->big);
    o->matmul(b, &L->ssm_z, NULL, f->xb, T, f->gz);
    o->matmul(b, &L->ssm_alpha, NULL, f->xb, T, f->ga);
    o->matmul(b, &L->ssm_beta, NULL, f->xb, T, f->gb);
    o->conv1d_silu(b, f->big, &L->ssm_conv, f->conv[l], bt, CD, hp->ssm_conv_k, saves(f, l, 0), f->n_req, f->big);
    o->deltanet(b, f->big, (size_t)CD, f->ga, f->gb, &L->ssm_a, &L->ssm_dt_bias, f->ssm[l], bt, hp->ssm_nk,
                hp->ssm_nv, hp->ssm_dk, hp->ssm_dv, 1e-6f, saves(f, l, 1), f->n_req, f->att);
    o->rmsnorm_gated(b, f->att, f->gz, &L->ssm_norm, T * hp->ssm_nv, hp->ssm_dv, hp->norm_eps, f->att);
    o->matmul(b, &L->ssm_out, NULL, f->att, T, f->xb);
}

static void attn_layer(fwq *f, const layer_w *L, int l, const be_batch *bt)
{
    const hparams *hp = &f->m->hp;
    be *b = f->b;
    const be_ops *o = b->ops;
    int T = bt->T, HD = hp->head_dim, K = hp->n_head_kv * HD, rows = T * hp->n_head;
    o->matmul(b, &L->wq, NULL, f->xb, T, f->big);            /* per head: HD query, HD gate */
    o->copy_rows(b, f->q, (size_t)HD, f->big, (size_t)2 * HD, rows, HD);
    o->copy_rows(b, f->gz, (size_t)HD, f->big + HD, (size_t)2 * HD, rows, HD);
    o->matmul(b, &L->wk, NULL, f->xb, T, f->k);
    o->matmul(b, &L->wv, NULL, f->xb, T, f->v);
    o->rmsnorm(b, f->q, &L->q_norm, rows, HD, hp->norm_eps, f->q);
    o->rmsnorm(b, f->k, &L->k_norm, T * hp->n_head_kv, HD, hp->norm_eps, f->k);
    o->rope(b, f->q, bt, hp->n_head, HD, hp->n_rot, hp->rope_base, 1, NULL);
    o->rope(b, f->k, bt, hp->n_head_kv, HD, hp->n_rot, hp->rope_base, 1, NULL);
    o->kv_store(b, f->kc[l], f->vc[l], bt, K, f->k, f->v);
    o->attention(b, f->q, f->kc[l], f->vc[l], bt, hp->n_head, hp->n_head_kv, HD, f->att);
    o->sigmoid_mul(b, f->att, f->gz, (size_t)rows * HD);
    o->matmul(b, &L->wo, NULL, f->att, T, f->xb);
}

void fwq_run(fwq *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out, float *logits)
{
    const model *m = f->m;
    const hparams *hp = &m->hp;
    be *b = f->b;
    const be_ops *o = b->ops;
    int T = bt->T, E = hp->n_embd, F = hp->n_ff;
    /* a backend that records passes (CUDA graphs) may replay one instead;
     * a pass with save points always runs its ops (they copy state out) */
    int begun = f->n_req == 0 && o->step_begin;
    if (begun && o->step_begin(b, tokens, bt, out_idx, n_out)) goto ops_done;
    o->embed(b, &m->tok_embd, tokens, T, f->x);
    for (int l = 0; l < hp->n_layer; l++) {
        const layer_w *L = &m->layers[l];
        o->rmsnorm(b, f->x, &L->attn_norm, T, E, hp->norm_eps, f->xb);
        if (L->linear) linear_layer(f, L, l, bt);
        else attn_layer(f, L, l, bt);
        o->add(b, f->x, f->xb, (size_t)T * E);
        o->rmsnorm(b, f->x, &L->ffn_norm, T, E, hp->norm_eps, f->xb);
        o->matmul(b, &L->w_gate, NULL, f->xb, T, f->hg);
        o->matmul(b, &L->w_up, NULL, f->xb, T, f->hu);
        o->silu_mul(b, f->hg, f->hu, (size_t)T * F, f->hg);
        o->matmul(b, &L->w_down, NULL, f->hg, T, f->xb);
        o->add(b, f->x, f->xb, (size_t)T * E);
    }
    fw_out_norm(b, f->x, &m->output_norm, out_idx, n_out, E, hp->norm_eps, f->xo);
    if (n_out > 0) o->matmul(b, &m->output, NULL, f->xo, n_out, f->lg);
ops_done:
    if (begun && o->step_end) o->step_end(b);
    f->n_req = 0;
    if (n_out <= 0) { o->sync(b); return; }
    o->to_host(b, logits, f->lg, (size_t)n_out * hp->n_vocab * 4);
    o->sync(b);
}
