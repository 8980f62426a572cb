/* moe.c — mixture-of-experts layers (layers.h): loading a layer's router
 * and stacked experts, checked against the metadata, and handing them to
 * the backend's moe op (backend.h, be_moe) with the scratch it asks for. */
#include "engine/arch/layers.h"
#include "common/err.h"
#include "engine/quant/qtypes.h"

#include <stdio.h>
#include <stdlib.h>

size_t ly_moe_vec(const hparams *hp) { return (size_t)hp->n_expert; }

int ly_load_moe(ld *l, layer_w *L, int i)
{
    const hparams *hp = &l->m->hp;
    int E = hp->n_embd, F = hp->n_ff_exp, X = hp->n_expert;
    char key[96], nm[96];
    if (l->hf) snprintf(key, sizeof key, "config.json num_experts");
    else snprintf(key, sizeof key, "%s.expert_count", l->m->arch_name);
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", i);
    if (!ld_tensor(l, nm))
        return ld_fail(l, "missing tensor '%s' (the router of the %d experts of %s)", nm, X, key);
    static const char *const exps[3] = { "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight" };
    for (int k = 0; k < 3; k++) {
        snprintf(nm, sizeof nm, "blk.%d.%s", i, exps[k]);
        const gguf_tensor *t = ld_tensor(l, nm);
        if (t && t->ne[2] != X)
            return ld_fail(l, "tensor '%s' holds %lld experts but %s is %d (expected the same)", nm,
                           (long long)t->ne[2], key, X);
    }
    if (get_layer_w(l, &L->ffn_gate_inp, i, "ffn_gate_inp.weight", E, X, 1) ||
        get_layer_w(l, &L->ffn_gate_inp_b, i, "ffn_gate_inp.bias", X, 0, 0))
        return -1;
    char old[96];
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.weight", i);
    snprintf(old, sizeof old, "blk.%d.ffn_gate.0.weight", i);
    if (!ld_tensor(l, nm) && ld_tensor(l, old))
        return ld_fail(l, "tensor '%s': each expert stored apart (an older Mixtral conversion); expected the "
                       "stacked %s (convert the model again)", old, nm);
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.weight", i);
    if (get_w3(l, &L->ffn_gate_exps, nm, E, F, X, 1)) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_up_exps.weight", i);
    if (get_w3(l, &L->ffn_up_exps, nm, E, F, X, 1)) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.weight", i);
    if (get_w3(l, &L->ffn_down_exps, nm, F, E, X, 1)) return -1;
    /* per-expert biases (gpt-oss): f32 [n_expert][rows] */
    static const char *const bs[3] = { "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias" };
    wt *bw[3] = { &L->ffn_gate_exps_b, &L->ffn_up_exps_b, &L->ffn_down_exps_b };
    for (int k = 0; k < 3; k++) {
        if (get_layer_w(l, bw[k], i, bs[k], k == 2 ? E : F, X, 0)) return -1;
        if (bw[k]->data && bw[k]->type != QT_F32)
            return ld_fail(l, "tensor 'blk.%d.%s' has type %s, expected f32", i, bs[k], qt_name(bw[k]->type));
    }
    return 0;
}

/* w, or NULL where the file has no such tensor */
static const wt *present(const wt *w) { return w->data ? w : NULL; }

void ly_moe_desc(const model *m, int l, const be_moe *how, be_moe *d)
{
    const hparams *hp = &m->hp;
    const layer_w *L = &m->layers[l];
    *d = (be_moe){ .n_expert = hp->n_expert, .n_used = hp->n_expert_used, .n_ff = hp->n_ff_exp,
                   .gating = hp->expert_gating, .norm = hp->expert_norm, .scale = hp->expert_scale,
                   .act = how->act, .alpha = how->alpha, .limit = how->limit,
                   .router = &L->ffn_gate_inp, .router_b = present(&L->ffn_gate_inp_b),
                   .gate = &L->ffn_gate_exps, .up = &L->ffn_up_exps, .down = &L->ffn_down_exps,
                   .gate_b = present(&L->ffn_gate_exps_b), .up_b = present(&L->ffn_up_exps_b),
                   .down_b = present(&L->ffn_down_exps_b), .expert0 = m->expert0,
                   .n_held = m->n_held };
}

const char *ly_moe_lacks(const model *m, const be_ops *o)
{
    return m->hp.n_expert && (!o->moe || !o->moe_scratch) ? "mixture-of-experts op" : NULL;
}

int ly_moe_open(ly_moe *mo, be *b, const model *m, const be_moe *how, int max_T, size_t *bytes, char *err,
                size_t errlen)
{
    const hparams *hp = &m->hp;
    *mo = (ly_moe){ 0 };
    if (!hp->n_expert) return 0;
    mo->d = calloc((size_t)hp->n_layer, sizeof *mo->d);
    if (!mo->d) return err_set(err, errlen, "out of memory for activation buffers");
    size_t need = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        if (!m->layers[l].ffn_gate_exps.data) continue;
        ly_moe_desc(m, l, how, &mo->d[l]);
        size_t n = b->ops->moe_scratch(b, &mo->d[l], max_T);
        if (n > need) need = n;
    }
    mo->scratch = b->ops->alloc(b, need);
    if (!mo->scratch) {
        free(mo->d);
        mo->d = NULL;
        return err_set(err, errlen, "cannot allocate the experts' scratch (%zu MiB)", need >> 20);
    }
    if (bytes) *bytes += need;
    return 0;
}

void ly_moe_close(ly_moe *mo, be *b)
{
    if (mo->scratch) b->ops->free(b, mo->scratch);
    free(mo->d);
    *mo = (ly_moe){ 0 };
}

void ly_moe_ffn(be *b, const ly_moe *mo, int l, const float *x, int T, float *out)
{
    b->ops->moe(b, &mo->d[l], x, T, mo->scratch, out);
}
