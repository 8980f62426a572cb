/* qwen35.c — the Qwen3.5 hybrid family (row qwen35 of arch.c):
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
 * [max_seqs][nv][dk][dv] (f32): fixed memory per sequence, whatever its
 * length; KV cache pages for full-attention layers only; and up to
 * 2*max_seqs snapshots of the state for prefix reuse (within SNAP_BUDGET). */
#include "engine/arch/arch.h"
#include "engine/arch/layers.h"
#include "engine/quant/qtypes.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

#define SNAP_BUDGET ((size_t)512 << 20)   /* bytes of recurrent-state snapshots at most */

typedef struct fwq {
    fw base;
    int max_seqs;
    float *x, *xb, *big, *q, *gz, *att, *k, *v, *ga, *gb, *hg, *hu, *xo;
    float **conv, **ssm;        /* [n_layer]: linear layers only */
    float **conv_snap, **ssm_snap;  /* [n_layer]: n_snap copies of one slot's state */
    int n_snap;
    struct fwq_req { int slot, pos, snap; } *req;  /* [max_seqs] save points of the next run */
    be_save *sv;                /* [max_seqs] the same for one op */
    int n_req;
    size_t conv_slot, ssm_slot; /* floats per slot */
    float *zero;                /* host zeros for resets: max(conv_slot, ssm_slot) */
} fwq;

static int q35_conv_dim(const hparams *hp) { return 2 * hp->ssm_nk * hp->ssm_dk + hp->ssm_nv * hp->ssm_dv; }

/* Qwen3.5 hybrid: Gated DeltaNet (linear attention) layers with a full
 * gated-attention layer every full_attention_interval layers. The GGUF
 * converter already stores norm weights as 1 + w and ssm_a as -exp(A_log). */
static int q35_load(ld *l)
{
    model *m = l->m;
    hparams *hp = &m->hp;
    int64_t nk, nv, dk, inner, interval, ck;
    if (key_i(l, "ssm.conv_kernel", &ck, 1, 0) || key_i(l, "ssm.state_size", &dk, 1, 0) ||
        key_i(l, "ssm.group_count", &nk, 1, 0) || key_i(l, "ssm.time_step_rank", &nv, 1, 0) ||
        key_i(l, "ssm.inner_size", &inner, 1, 0) || key_i(l, "full_attention_interval", &interval, 0, 4))
        return -1;
    if (ck < 1 || ck > 16 || dk < 1 || dk > 1024 || nk < 1 || nk > 1024 || nv < 1 || nv > 1024 || nv % nk ||
        inner < 1 || inner % nv || inner / nv > 1024 || interval < 1 || interval > hp->n_layer)
        return ld_fail(l, "implausible linear-attention hyper-parameters (conv %lld, state %lld, groups %lld, "
                       "heads %lld, inner %lld, interval %lld)", (long long)ck, (long long)dk, (long long)nk,
                       (long long)nv, (long long)inner, (long long)interval);
    hp->ssm_conv_k = (int32_t)ck;
    hp->ssm_dk = (int32_t)dk;
    hp->ssm_nk = (int32_t)nk;
    hp->ssm_nv = (int32_t)nv;
    hp->ssm_dv = (int32_t)(inner / nv);
    m->recurrent = 1;

    int E = hp->n_embd, HD = hp->head_dim, QD = hp->n_head * HD;
    int CD = q35_conv_dim(hp), SV = hp->ssm_nv * hp->ssm_dv;
    size_t per_layer = (size_t)2 * E + 2 * HD + 2 * (size_t)nv + (size_t)hp->ssm_dv + (size_t)CD * (size_t)ck;
    if (ld_common(l, (size_t)2 * E + (size_t)hp->n_layer * per_layer + 64)) return -1;

    hp->n_attn_layers = 0;
    for (int i = 0; i < hp->n_layer; i++) {
        layer_w *L = &m->layers[i];
        L->linear = (i + 1) % interval != 0;
        if (get_layer_w(l, &L->attn_norm, i, "attn_norm.weight", E, 0, 1) ||
            get_layer_w(l, &L->ffn_norm, i, "post_attention_norm.weight", E, 0, 1) || ly_load_ffn_glu(l, L, i))
            return -1;
        if (!L->linear) {
            hp->n_attn_layers++;
            if (ly_load_attn(l, L, i, 2 * QD) ||   /* per head: HD query, HD gate */
                get_layer_w(l, &L->q_norm, i, "attn_q_norm.weight", HD, 0, 1) ||
                get_layer_w(l, &L->k_norm, i, "attn_k_norm.weight", HD, 0, 1))
                return -1;
            continue;
        }
        if (get_layer_w(l, &L->ssm_qkv, i, "attn_qkv.weight", E, CD, 1) ||
            get_layer_w(l, &L->ssm_z, i, "attn_gate.weight", E, SV, 1) ||
            get_layer_w(l, &L->ssm_alpha, i, "ssm_alpha.weight", E, nv, 1) ||
            get_layer_w(l, &L->ssm_beta, i, "ssm_beta.weight", E, nv, 1) ||
            get_layer_w(l, &L->ssm_a, i, "ssm_a", nv, 0, 1) ||
            get_layer_w(l, &L->ssm_dt_bias, i, "ssm_dt.bias", nv, 0, 1) ||
            get_layer_w(l, &L->ssm_norm, i, "ssm_norm.weight", hp->ssm_dv, 0, 1) ||
            get_layer_w(l, &L->ssm_out, i, "ssm_out.weight", SV, E, 1) ||
            get_layer_w(l, &L->ssm_conv, i, "ssm_conv1d.weight", ck, CD, 1))
            return -1;
        /* the conv taps are read as f32 by the ops: widen them */
        wt *c = &L->ssm_conv;
        if (c->type != QT_F32) {
            float *dst = l->vec_buf + l->vec_used;
            if (l->vec_used + (size_t)CD * (size_t)ck > l->vec_cap) return ld_fail(l, "internal: vector buffer too small");
            for (int r = 0; r < CD; r++) wt_row_f32(c, r, dst + (size_t)r * ck);
            l->vec_used += (size_t)CD * (size_t)ck;
            c->type = QT_F32;
            c->row_bytes = (size_t)ck * 4;
            c->data = dst;
        }
    }
    if (hp->n_attn_layers == 0) return ld_fail(l, "no full-attention layer (full_attention_interval %lld)", (long long)interval);
    return 0;
}

static const char *q35_lacks(const model *m, const be_ops *o)
{
    (void)m;
    return !o->copy_rows || !o->sigmoid_mul || !o->rmsnorm_gated || !o->conv1d_silu || !o->deltanet
               ? "linear-attention ops" : NULL;
}

static void q35_close(fw *base)
{
    fwq *f = (fwq *)base;
    be *b = base->b;
    void *bufs[] = { f->x, f->xb, f->big, f->q, f->gz, f->att, f->k, f->v, f->ga, f->gb, f->hg, f->hu, f->xo, base->lg };
    ly_free(b, bufs, sizeof bufs / sizeof bufs[0]);
    float **state[] = { f->conv, f->ssm, f->conv_snap, f->ssm_snap };   /* [n_layer] each */
    for (int k = 0; k < 4; k++) {
        for (int l = 0; state[k] && l < base->m->hp.n_layer; l++)
            if (state[k][l]) b->ops->free(b, state[k][l]);
        free(state[k]);
    }
    free(f->req); free(f->sv); free(f->zero);
    free(f);
}

static void q35_seq_reset(fw *base, int slot)
{
    fwq *f = (fwq *)base;
    be *b = base->b;
    if (slot < 0 || slot >= f->max_seqs) return;
    for (int l = 0; l < base->m->hp.n_layer; l++) {
        if (!base->m->layers[l].linear) continue;
        b->ops->to_dev(b, f->conv[l] + (size_t)slot * f->conv_slot, f->zero, f->conv_slot * 4);
        b->ops->to_dev(b, f->ssm[l] + (size_t)slot * f->ssm_slot, f->zero, f->ssm_slot * 4);
    }
}

static int q35_open(fw **out, model *m, be *b, int max_T, int max_out, int max_seqs, char *err, size_t errlen)
{
    const hparams *hp = &m->hp;
    const be_ops *o = b->ops;
    if (max_seqs < 1) max_seqs = 1;
    fwq *f = calloc(1, sizeof *f);
    if (!f) return err_set(err, errlen, "out of memory for activation buffers");
    f->base = (fw){ .fam = &arch_qwen35, .m = m, .b = b };
    f->max_seqs = max_seqs;
    size_t T = (size_t)max_T, E = hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           K = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, NV = hp->ssm_nv,
           CD = (size_t)q35_conv_dim(hp), SV = (size_t)hp->ssm_nv * hp->ssm_dv;
    size_t big = 2 * Q > CD ? 2 * Q : CD, wide = Q > SV ? Q : SV;
    size_t O = (size_t)max_out;
    const ly_buf bufs[] = { { &f->x, T * E }, { &f->xb, T * E }, { &f->big, T * big }, { &f->q, T * Q },
                            { &f->gz, T * wide }, { &f->att, T * wide }, { &f->k, T * K }, { &f->v, T * K },
                            { &f->ga, T * NV }, { &f->gb, T * NV }, { &f->hg, T * F }, { &f->hu, T * F },
                            { &f->xo, O * E }, { &f->base.lg, O * hp->n_vocab } };
    if (ly_bufs_alloc(b, bufs, sizeof bufs / sizeof bufs[0], err, errlen)) goto fail;
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
    if (!f->conv || !f->ssm || !f->zero || !f->conv_snap || !f->ssm_snap || !f->req || !f->sv) {
        err_set(err, errlen, "out of memory for activation buffers");
        goto fail;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        if (!m->layers[l].linear) continue;
        f->conv[l] = o->alloc(b, (size_t)max_seqs * f->conv_slot * 4 + 4);
        f->ssm[l] = o->alloc(b, (size_t)max_seqs * f->ssm_slot * 4);
        if (f->n_snap) {
            f->conv_snap[l] = o->alloc(b, (size_t)f->n_snap * f->conv_slot * 4 + 4);
            f->ssm_snap[l] = o->alloc(b, (size_t)f->n_snap * f->ssm_slot * 4);
        }
        if (!f->conv[l] || !f->ssm[l] || (f->n_snap && (!f->conv_snap[l] || !f->ssm_snap[l]))) {
            err_set(err, errlen, "cannot allocate the recurrent state (%zu MiB)",
                    (size_t)hp->n_layer * (max_seqs + f->n_snap) * (f->conv_slot + f->ssm_slot) * 4 >> 20);
            goto fail;
        }
        f->base.kv_bytes += (size_t)(max_seqs + f->n_snap) * (f->conv_slot + f->ssm_slot) * 4;
    }
    f->base.xo = f->xo;
    *out = &f->base;
    return 0;
fail:
    q35_close(&f->base);
    return -1;
}

static int q35_snap_count(const fw *base) { return ((const fwq *)base)->n_snap; }

/* Copies one slot-sized state between buffers (device memory: copy_rows). */
static void state_copy(fwq *f, float *dst, const float *src, size_t n)
{
    be *b = f->base.b;
    size_t row = f->base.m->hp.ssm_dv > 0 ? (size_t)f->base.m->hp.ssm_dv : 1;
    if (n % row) row = 1;
    if (n) b->ops->copy_rows(b, dst, row, src, row, (int)(n / row), (int)row);
}

/* Copies every linear layer's state of slot into snapshot snap (save) or back (load). */
static void snap_copy(fwq *f, int slot, int snap, int save)
{
    if (slot < 0 || slot >= f->max_seqs || snap < 0 || snap >= f->n_snap) return;
    const model *m = f->base.m;
    for (int l = 0; l < m->hp.n_layer; l++) {
        if (!m->layers[l].linear) continue;
        float *cs = f->conv[l] + (size_t)slot * f->conv_slot, *cn = f->conv_snap[l] + (size_t)snap * f->conv_slot;
        float *ss = f->ssm[l] + (size_t)slot * f->ssm_slot, *sn = f->ssm_snap[l] + (size_t)snap * f->ssm_slot;
        state_copy(f, save ? cn : cs, save ? cs : cn, f->conv_slot);
        state_copy(f, save ? sn : ss, save ? ss : sn, f->ssm_slot);
    }
}

static void q35_snap_save(fw *base, int slot, int snap) { snap_copy((fwq *)base, slot, snap, 1); }
static void q35_snap_load(fw *base, int snap, int slot) { snap_copy((fwq *)base, slot, snap, 0); }

static void q35_snap_at(fw *base, int slot, int pos, int snap)
{
    fwq *f = (fwq *)base;
    if (slot < 0 || slot >= f->max_seqs || snap < 0 || snap >= f->n_snap || f->n_req >= f->max_seqs) return;
    f->req[f->n_req++] = (struct fwq_req){ slot, pos, snap };
}

/* A pass with save points runs its ops: they copy state out. */
static int q35_replayable(const fw *base) { return ((const fwq *)base)->n_req == 0; }

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

static void linear_layer(fwq *f, const layer_w *L, int l, const be_batch *bt)
{
    const hparams *hp = &f->base.m->hp;
    be *b = f->base.b;
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
    const hparams *hp = &f->base.m->hp;
    be *b = f->base.b;
    const be_ops *o = b->ops;
    int T = bt->T, HD = hp->head_dim, rows = T * hp->n_head;
    o->matmul(b, &L->wq, NULL, f->xb, T, f->big);            /* per head: HD query, HD gate */
    o->copy_rows(b, f->q, (size_t)HD, f->big, (size_t)2 * HD, rows, HD);
    o->copy_rows(b, f->gz, (size_t)HD, f->big + HD, (size_t)2 * HD, rows, HD);
    o->matmul(b, &L->wk, NULL, f->xb, T, f->k);
    o->matmul(b, &L->wv, NULL, f->xb, T, f->v);
    /* rope on the first n_rot dims, rotating halves; the plain ops */
    ly_attn a = { hp->n_head, hp->n_head_kv, HD, hp->n_rot, hp->rope_base, 1, NULL, &L->q_norm, &L->k_norm,
                  hp->norm_eps, 0, 0, NULL, 0 };
    ly_attend(b, &a, f->q, f->k, f->v, f->base.kc[l], f->base.vc[l], bt, NULL, f->att);
    o->sigmoid_mul(b, f->att, f->gz, (size_t)rows * HD);
    o->matmul(b, &L->wo, NULL, f->att, T, f->xb);
}

static void q35_pass(fw *base, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    fwq *f = (fwq *)base;
    const model *m = base->m;
    const hparams *hp = &m->hp;
    be *b = base->b;
    const be_ops *o = b->ops;
    int T = bt->T, E = hp->n_embd;
    o->embed(b, &m->tok_embd, tokens, T, f->x);
    for (int l = 0; l < hp->n_layer; l++) {
        const layer_w *L = &m->layers[l];
        o->rmsnorm(b, f->x, &L->attn_norm, T, E, hp->norm_eps, f->xb);
        if (L->linear) linear_layer(f, L, l, bt);
        else attn_layer(f, L, l, bt);
        o->add(b, f->x, f->xb, (size_t)T * E);
        o->rmsnorm(b, f->x, &L->ffn_norm, T, E, hp->norm_eps, f->xb);
        ly_ffn_glu(b, L, f->xb, T, hp->n_ff, 0, f->hg, f->hu, f->xb);
        o->add(b, f->x, f->xb, (size_t)T * E);
    }
    ly_logits(b, m, f->x, out_idx, n_out, hp->norm_eps, f->xo, base->lg);
    f->n_req = 0;
}

static const arch_seq q35_seq = {
    .reset = q35_seq_reset,
    .snap_count = q35_snap_count,
    .snap_save = q35_snap_save,
    .snap_load = q35_snap_load,
    .snap_at = q35_snap_at,
};

/* no greedy passes: the logits come to the host (fw_run) */
const arch_family arch_qwen35 = { .load = q35_load, .lacks = q35_lacks, .open = q35_open, .close = q35_close,
                                  .pass = q35_pass, .replayable = q35_replayable, .seq = &q35_seq };
