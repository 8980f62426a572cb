/* split.c — see split.h. */
#include "engine/arch/split.h"
#include "engine/arch/arch.h"
#include "engine/quant/qtypes.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A rank's model and the copies it owns (columns, experts' rows). */
typedef struct rank_model {
    model m;
    void **own;
    int n_own, cap_own;
} rank_model;

void sp_fail(sp *s, const char *fmt, ...)
{
    if (s->failed) return;
    s->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(s->err, s->errlen, "%s: ", s->r->path);
    if (k >= 0 && (size_t)k < s->errlen) vsnprintf(s->err + k, s->errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

static void *sp_take(sp *s, size_t bytes)
{
    rank_model *rm = (rank_model *)s->r;
    if (rm->n_own == rm->cap_own) {
        int cap = rm->cap_own ? 2 * rm->cap_own : 64;
        void **o = realloc(rm->own, (size_t)cap * sizeof *o);
        if (!o) return NULL;
        rm->own = o;
        rm->cap_own = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p) rm->own[rm->n_own++] = p;
    return p;
}

/* w's bytes and values left the rank: weight_bytes, n_params and
 * active_bytes follow */
static void sp_account(sp *s, const wt *old, const wt *w)
{
    model *r = s->r;
    uint64_t ob = (uint64_t)old->row_bytes * (uint64_t)old->n_out, nb = (uint64_t)w->row_bytes * (uint64_t)w->n_out;
    r->weight_bytes -= ob - nb;
    r->n_params -= (uint64_t)(old->n_in * old->n_out - w->n_in * w->n_out);
    r->active_bytes -= old->n_mat > 1 && old->n_mat == r->hp.n_expert
                           ? (ob - nb) / (uint64_t)old->n_mat * (uint64_t)r->hp.n_expert_used
                           : ob - nb;
}

static const char *wname(char *buf, size_t n, const char *name, int layer)
{
    if (layer >= 0) snprintf(buf, n, "blk.%d.%s", layer, name);
    else snprintf(buf, n, "%s", name);
    return buf;
}

void sp_rows_part(sp *s, wt *w, const char *name, int layer, int part, int parts)
{
    if (s->failed || !w->data) return;
    int64_t mats = w->n_mat > 1 ? w->n_mat : 1, per = w->n_out / mats;
    char nm[96];
    if (per % parts) {
        sp_fail(s, "tensor '%s' has %lld rows%s, which do not split in %d", wname(nm, sizeof nm, name, layer),
                (long long)per, mats > 1 ? " per expert" : "", parts);
        return;
    }
    wt old = *w;
    int64_t k = per / parts, r0 = k * part;
    if (mats == 1) {
        w->data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    } else {
        char *d = sp_take(s, (size_t)(mats * k) * w->row_bytes);
        if (!d) { sp_fail(s, "out of memory splitting '%s'", wname(nm, sizeof nm, name, layer)); return; }
        for (int64_t e = 0; e < mats; e++)
            memcpy(d + (size_t)(e * k) * w->row_bytes, (const char *)w->data + (size_t)(e * per + r0) * w->row_bytes,
                   (size_t)k * w->row_bytes);
        w->data = d;
    }
    w->n_out = mats * k;
    w->dev = w->pack = NULL;
    sp_account(s, &old, w);
}

void sp_rows(sp *s, wt *w, const char *name, int layer) { sp_rows_part(s, w, name, layer, s->rank, s->n); }

void sp_cols_part(sp *s, wt *w, const char *name, int layer, int part, int parts)
{
    if (s->failed || !w->data) return;
    const qt_traits *tr = qt_get(w->type);
    int64_t k = w->n_in / parts;
    char nm[96];
    size_t rb = tr ? qt_row_size(w->type, k) : 0;
    if (w->n_in % parts || !rb) {
        sp_fail(s, "tensor '%s' has rows of %lld values in %s blocks of %d, which do not split in %d in whole "
                "blocks", wname(nm, sizeof nm, name, layer), (long long)w->n_in, qt_name(w->type),
                tr ? tr->blck : 0, parts);
        return;
    }
    wt old = *w;
    if (w->n_out == 1) {
        w->data = (const char *)w->data + rb * (size_t)part;
    } else {
        char *d = sp_take(s, rb * (size_t)w->n_out);
        if (!d) { sp_fail(s, "out of memory splitting '%s'", wname(nm, sizeof nm, name, layer)); return; }
        for (int64_t i = 0; i < w->n_out; i++)
            memcpy(d + rb * (size_t)i, (const char *)w->data + (size_t)i * w->row_bytes + rb * (size_t)part, rb);
        w->data = d;
    }
    w->n_in = k;
    w->row_bytes = rb;
    w->dev = w->pack = NULL;
    sp_account(s, &old, w);
}

void sp_cols(sp *s, wt *w, const char *name, int layer) { sp_cols_part(s, w, name, layer, s->rank, s->n); }

void sp_first(sp *s, wt *w)
{
    if (s->failed || !w->data || s->rank == 0) return;
    wt old = *w;
    memset(w, 0, sizeof *w);
    w->n_mat = old.n_mat;
    sp_account(s, &old, w);
}

int sp_divides(sp *s, int64_t v, const char *what)
{
    if (s->failed) return -1;
    if (v % s->n == 0) return 0;
    sp_fail(s, "%s.%s is %lld, which does not split over %d GPUs (expected a multiple of %d)", s->r->arch_name, what,
            (long long)v, s->n, s->n);
    return -1;
}

/* Experts [rank * X/n, (rank + 1) * X/n) of w's X stacked (their rows, or
 * for an f32 bias [X][rows] its X rows): a view into the file. */
static void sp_experts(sp *s, wt *w)
{
    if (s->failed || !w->data) return;
    int64_t X = s->r->hp.n_expert, per = w->n_out / X, nh = X / s->n;
    wt old = *w;
    w->data = (const char *)w->data + (size_t)(s->rank * nh * per) * w->row_bytes;
    w->n_out = nh * per;
    if (w->n_mat == X) w->n_mat = (int)nh;
    w->dev = w->pack = NULL;
    sp_account(s, &old, w);
}

/* Whether every layer's experts split by units: gate and up rows, down's
 * columns in whole blocks of its type (else the experts go whole) */
static int units_split(const model *r, int n, const char **type)
{
    if (r->hp.n_ff_exp % n) return 0;
    for (int i = 0; i < r->hp.n_layer; i++) {
        const wt *d = &r->layers[i].ffn_down_exps;
        if (d->data && !qt_row_size(d->type, d->n_in / n)) {
            *type = qt_name(d->type);
            return 0;
        }
    }
    return 1;
}

int sp_layers(sp *s)
{
    model *r = s->r;
    hparams *hp = &r->hp;
    int moe = hp->n_expert > 0;
    /* experts by units where their rows allow, else each rank whole experts */
    const char *ty = NULL;
    int whole = moe && (s->experts_whole || !units_split(r, s->n, &ty));
    if (whole && hp->n_expert % s->n) {
        sp_fail(s, "the experts split neither by units (%s.expert_feed_forward_length %d over %d GPUs%s%s%s) nor "
                "whole (%s.expert_count %d, expected a multiple of %d)", r->arch_name, hp->n_ff_exp, s->n,
                ty ? ": not whole " : "", ty ? ty : "", ty ? " blocks" : "", r->arch_name, hp->n_expert, s->n);
        return -1;
    }
    /* key/value heads by the ranks, or where fewer, each rank the one of its query heads */
    int kvh = hp->n_head_kv, kv_parts = kvh % s->n == 0 ? s->n : kvh, kv_part = kvh % s->n == 0 ? s->rank : s->rank * kvh / s->n;
    if (kvh % s->n && s->n % kvh) {
        sp_fail(s, "%s.attention.head_count_kv is %d, which does not split over %d GPUs (expected a multiple or a "
                "divisor of %d)", r->arch_name, kvh, s->n, s->n);
        return -1;
    }
    if (sp_divides(s, hp->n_head, "attention.head_count") ||
        (!whole && sp_divides(s, moe ? hp->n_ff_exp : hp->n_ff,
                              moe ? "expert_feed_forward_length" : "feed_forward_length")))
        return -1;
    for (int i = 0; i < hp->n_layer; i++) {
        layer_w *L = &r->layers[i];
        sp_rows(s, &L->wq, "attn_q.weight", i);
        sp_rows_part(s, &L->wk, "attn_k.weight", i, kv_part, kv_parts);
        sp_rows_part(s, &L->wv, "attn_v.weight", i, kv_part, kv_parts);
        sp_cols(s, &L->bq, "attn_q.bias", i);
        sp_cols_part(s, &L->bk, "attn_k.bias", i, kv_part, kv_parts);
        sp_cols_part(s, &L->bv, "attn_v.bias", i, kv_part, kv_parts);
        sp_cols(s, &L->wo, "attn_output.weight", i);
        sp_rows(s, &L->w_gate, "ffn_gate.weight", i);
        sp_rows(s, &L->w_up, "ffn_up.weight", i);
        sp_cols(s, &L->w_down, "ffn_down.weight", i);
        if (whole) {
            wt *ew[6] = { &L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps, &L->ffn_gate_exps_b,
                          &L->ffn_up_exps_b, &L->ffn_down_exps_b };
            for (int k = 0; k < 6; k++) sp_experts(s, ew[k]);
        } else {
            sp_rows(s, &L->ffn_gate_exps, "ffn_gate_exps.weight", i);
            sp_rows(s, &L->ffn_up_exps, "ffn_up_exps.weight", i);
            sp_cols(s, &L->ffn_down_exps, "ffn_down_exps.weight", i);
            sp_cols(s, &L->ffn_gate_exps_b, "ffn_gate_exps.bias", i);
            sp_cols(s, &L->ffn_up_exps_b, "ffn_up_exps.bias", i);
            sp_first(s, &L->ffn_down_exps_b);
        }
        sp_cols(s, &L->b_up, "ffn_up.bias", i);
        sp_first(s, &L->b_down);
        sp_first(s, &L->bo);
        sp_cols(s, &L->attn_sinks, "attn_sinks.weight", i);
    }
    hp->n_head /= s->n;
    hp->n_head_kv /= kv_parts;
    if (whole) {
        r->expert0 = s->rank * (hp->n_expert / s->n);
        r->n_held = hp->n_expert / s->n;
    } else if (moe) {
        hp->n_ff_exp /= s->n;
    } else {
        hp->n_ff /= s->n;
    }
    return s->failed ? -1 : 0;
}

void model_split_free(model *r)
{
    if (!r) return;
    rank_model *rm = (rank_model *)r;
    for (int i = 0; i < rm->n_own; i++) free(rm->own[i]);
    free(rm->own);
    free(r->layers);
    free(rm);
}

/* A rank's copy of m with layers [l0, l1) (the file, tokenizer and m's
 * buffers shared), none of its weights yet prepared by a backend; NULL
 * when out of memory. */
static model *rank_copy(const model *m, int l0, int l1)
{
    rank_model *rm = calloc(1, sizeof *rm);
    layer_w *ls = rm ? malloc((size_t)(l1 - l0) * sizeof *ls) : NULL;
    wt **ws = NULL;
    if (ls) {
        memcpy(&rm->m, m, sizeof *m);
        memcpy(ls, m->layers + l0, (size_t)(l1 - l0) * sizeof *ls);
        rm->m.layers = ls;
        rm->m.owned = NULL;
        rm->m.hp.n_layer = l1 - l0;
        int attn = 0;
        for (int l = 0; l < l1 - l0; l++) attn += !ls[l].linear;
        rm->m.hp.n_attn_layers = attn;
        int nw = model_wts_count(&rm->m);
        if ((ws = malloc((size_t)nw * sizeof *ws))) {
            nw = model_wts(&rm->m, ws, nw);
            for (int i = 0; i < nw; i++) ws[i]->dev = ws[i]->pack = NULL;
        }
    }
    if (!ws) {
        free(ls);
        free(rm);
        return NULL;
    }
    free(ws);
    return &rm->m;
}

/* the bytes of r's weights (shared data, e.g. a tied output, once); 0 when
 * out of memory */
static uint64_t weight_bytes(model *r)
{
    int nw = model_wts_count(r);
    wt **ws = malloc((size_t)nw * sizeof *ws);
    if (!ws) return 0;
    nw = model_wts(r, ws, nw);
    uint64_t b = 0;
    for (int i = 0; i < nw; i++) {
        if (!ws[i]->data) continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = ws[j]->data == ws[i]->data;
        if (!seen) b += (uint64_t)ws[i]->row_bytes * (uint64_t)ws[i]->n_out;
    }
    free(ws);
    return b;
}

int model_stages(const model *m, int n, model **ranks, char *err, size_t errlen)
{
    for (int r = 0; r < n; r++) ranks[r] = NULL;
    if (m->hp.n_layer < n)
        return err_set(err, errlen, "%s: %d layers do not split over %d GPUs (expected at least one layer a GPU)",
                       m->path, m->hp.n_layer, n);
    int first[16];
    if (n > 16) return err_set(err, errlen, "%s: %d stages (16 at most)", m->path, n);
    for (int r = 0; r < n; r++) first[r] = (int)((int64_t)m->hp.n_layer * r / n);
    return model_stages_from(m, n, first, ranks, err, errlen);
}

int model_stages_from(const model *m, int n, const int *first, model **ranks, char *err, size_t errlen)
{
    for (int r = 0; r < n; r++) ranks[r] = NULL;
    const arch_family *fam = m->arch ? m->arch->fam : NULL;
    if (!fam || fam->seq)
        return err_set(err, errlen, "%s: %s models do not split by layers yet (their per-sequence state); run it "
                       "whole on one device", m->path, m->arch_name);
    for (int r = 0; r < n; r++)
        if ((r == 0 && first[0] != 0) || first[r] >= m->hp.n_layer || (r && first[r] <= first[r - 1]))
            return err_set(err, errlen, "%s: stage %d cannot start at layer %d of %d", m->path, r, first[r],
                           m->hp.n_layer);
    for (int r = 0; r < n; r++) {
        int l0 = first[r], l1 = r + 1 < n ? first[r + 1] : m->hp.n_layer;
        model *rm = rank_copy(m, l0, l1);
        if (!rm) {
            for (int i = 0; i < r; i++) model_split_free(ranks[i]);
            for (int i = 0; i < r; i++) ranks[i] = NULL;
            return err_set(err, errlen, "out of memory");
        }
        ranks[r] = rm;
        rm->stage = r;
        rm->n_stages = n;
        /* the embeddings are the first stage's, the output the last's */
        if (r > 0) { memset(&rm->tok_embd, 0, sizeof rm->tok_embd); memset(&rm->pos_embd, 0, sizeof rm->pos_embd); }
        if (r < n - 1) {
            memset(&rm->output, 0, sizeof rm->output);
            memset(&rm->output_norm, 0, sizeof rm->output_norm);
            memset(&rm->output_norm_b, 0, sizeof rm->output_norm_b);
        }
        rm->weight_bytes = weight_bytes(rm);
        rm->active_bytes = m->weight_bytes ? (uint64_t)((double)m->active_bytes * rm->weight_bytes / m->weight_bytes) : 0;
        rm->n_params = m->weight_bytes ? (uint64_t)((double)m->n_params * rm->weight_bytes / m->weight_bytes) : 0;
    }
    return 0;
}

static int split_as(const model *m, int n, int experts_whole, model **ranks, char *err, size_t errlen)
{
    for (int r = 0; r < n; r++) ranks[r] = NULL;
    const arch_family *fam = m->arch ? m->arch->fam : NULL;
    if (!fam || !fam->split)
        return err_set(err, errlen, "%s: %s models do not split over GPUs yet (tensor parallelism takes the "
                       "families of attention and FFN layers: llama, qwen2, qwen3, qwen3moe, gemma3, gpt2, gpt-oss); "
                       "run it on one GPU", m->path, m->arch_name);
    for (int r = 0; r < n; r++) {
        model *rm = rank_copy(m, 0, m->hp.n_layer);
        if (!rm) {
            for (int i = 0; i < r; i++) model_split_free(ranks[i]);
            for (int i = 0; i < r; i++) ranks[i] = NULL;
            return err_set(err, errlen, "out of memory");
        }
        ranks[r] = rm;
        sp s = { .rank = r, .n = n, .r = rm, .err = err, .errlen = errlen, .experts_whole = experts_whole };
        if (fam->split(&s) || s.failed) {
            if (!s.failed) sp_fail(&s, "cannot split the model over %d GPUs", n);
            for (int i = 0; i <= r; i++) model_split_free(ranks[i]);
            for (int i = 0; i <= r; i++) ranks[i] = NULL;
            return -1;
        }
    }
    return 0;
}

int model_split(const model *m, int n, model **ranks, char *err, size_t errlen)
{
    return split_as(m, n, 0, ranks, err, errlen);
}

int model_split_experts(const model *m, int n, model **ranks, char *err, size_t errlen)
{
    return split_as(m, n, 1, ranks, err, errlen);
}
