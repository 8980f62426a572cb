/* forward.c — forward.h over the model's architecture family (arch.h): the
 * family queues the ops of a pass, this file what is the same for all of
 * them (the ops check, the KV caches, recorded passes, logits to the host,
 * greedy ids, state hooks). */
#include "engine/arch/forward.h"
#include "engine/arch/arch.h"
#include "engine/arch/layers.h"
#include "common/err.h"

#include <string.h>

static int swa_layers(const model *m)
{
    int n = 0;
    for (int l = 0; m->layers && l < m->hp.n_layer; l++) n += m->layers[l].swa && !m->layers[l].linear;
    return n;
}

size_t fw_kv_page_bytes(const model *m, int kv_type)
{
    const hparams *hp = &m->hp;
    size_t layers = (size_t)hp->n_attn_layers - (m->swa_ring ? (size_t)swa_layers(m) : 0);
    return (size_t)2 * layers * KV_PAGE * be_kv_bytes(kv_type, (size_t)hp->n_head_kv * hp->head_dim);
}

size_t fw_kv_ring_bytes(const model *m, int kv_type)
{
    const hparams *hp = &m->hp;
    return (size_t)2 * (size_t)swa_layers(m) * (size_t)m->swa_ring *
           be_kv_bytes(kv_type, (size_t)hp->n_head_kv * hp->head_dim);
}

int fw_swa_ring(const model *m, const be_ops *o, int max_T, int n_ctx)
{
    int w = m->hp.n_swa > 0 ? m->hp.n_swa : m->hp.swa_window;
    if (w <= 0 || !swa_layers(m) || !o->kv_ring) return 0;
    long ring = ((long)w + max_T - 1 + KV_PAGE - 1) / KV_PAGE * KV_PAGE;
    return ring < n_ctx ? (int)ring : 0;
}

/* What the families' fw_open allocate (llama.c, qwen35.c), with the
 * widest of their buffers for every kind, so never less than they take */
void fw_mem_estimate(const model *m, int kv_type, size_t n_pages, int max_T, int max_out, int max_seqs, fw_mem *out)
{
    const hparams *hp = &m->hp;
    size_t T = (size_t)(max_T > 0 ? max_T : 1), E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * hp->head_dim,
           K = (size_t)hp->n_head_kv * hp->head_dim, F = (size_t)hp->n_ff, V = (size_t)hp->n_vocab;
    size_t CD = (size_t)2 * hp->ssm_nk * hp->ssm_dk + (size_t)hp->ssm_nv * hp->ssm_dv;
    size_t SV = (size_t)hp->ssm_nv * hp->ssm_dv, big = 2 * Q > CD ? 2 * Q : CD, wide = Q > SV ? Q : SV;
    size_t ssm_layers = hp->n_layer > hp->n_attn_layers ? (size_t)(hp->n_layer - hp->n_attn_layers) : 0;
    memset(out, 0, sizeof *out);
    out->weights = m->weight_bytes;
    out->kv = n_pages * fw_kv_page_bytes(m, kv_type) + (size_t)(max_seqs > 0 ? max_seqs : 1) * fw_kv_ring_bytes(m, kv_type);
    if (ssm_layers) {   /* a slot's state per layer, for max_seqs slots and 2 * max_seqs snapshots */
        size_t slot = ((size_t)hp->ssm_nv * hp->ssm_dk * hp->ssm_dv +
                       (size_t)(hp->ssm_conv_k > 1 ? hp->ssm_conv_k - 1 : 0) * CD) * 4;
        out->state = ssm_layers * slot * (size_t)3 * (size_t)(max_seqs > 0 ? max_seqs : 1);
    }
    out->act = T * 4 * (2 * E + big + Q + 2 * wide + 2 * K + 2 * (size_t)hp->ssm_nv + 2 * F) +
               (size_t)(max_out > 0 ? max_out : 1) * 4 * (E + V) +
               (size_t)hp->n_layer * 4096;   /* (small per-layer buffers) */
    size_t mx = V * E;   /* the largest matrix: embeddings / output, or an FFN / attention one */
    if (F * E > mx) mx = F * E;
    if (big * E > mx) mx = big * E;
    out->scratch = 2 * mx + FW_MEM_BACKEND;
    out->total = out->weights + out->kv + out->state + out->act + out->scratch;
}

const char *fw_lacks(const model *m, const be_ops *o)
{
    const arch_family *fam = m->arch ? m->arch->fam : NULL;
    return fam && fam->lacks ? fam->lacks(m, o) : NULL;
}

int fw_open(fw **out, model *m, be *b, int max_T, int max_out, int n_pages, int max_seqs,
            char *err, size_t errlen)
{
    *out = NULL;
    const char *lacks = fw_lacks(m, b->ops);
    if (lacks)
        return err_set(err, errlen, "the %s backend cannot run %s models yet (no %s)", b->ops->name, m->arch_name,
                       lacks);
    fw *f = NULL;
    if (m->arch->fam->open(&f, m, b, max_T, max_out, max_seqs, err, errlen)) return -1;
    if (ly_kv_open(b, m, n_pages, max_seqs, &f->kc, &f->vc, &f->kv_bytes, err, errlen)) {
        fw_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

void fw_close(fw *f)
{
    if (!f) return;
    fw_group_close(f);
    ly_kv_close(f->b, f->m, f->kc, f->vc);
    f->fam->close(f);
}

void fw_seq_reset(fw *f, int slot)
{
    if (f->fam->seq) f->fam->seq->reset(f, slot);   /* others keep no state outside the KV pages */
}

int fw_snap_count(const fw *f) { return f->fam->seq ? f->fam->seq->snap_count(f) : 0; }
void fw_snap_save(fw *f, int slot, int snap) { if (f->fam->seq) f->fam->seq->snap_save(f, slot, snap); }
void fw_snap_load(fw *f, int snap, int slot) { if (f->fam->seq) f->fam->seq->snap_load(f, snap, slot); }
void fw_snap_at(fw *f, int slot, int pos, int snap) { if (f->fam->seq) f->fam->seq->snap_at(f, slot, pos, snap); }

size_t fw_kv_bytes(const fw *f) { return f->kv_bytes; }

/* Every op of a forward pass, up to the logits in f->lg (queued, not
 * synced); between the backend's step_begin and the ops, wait(arg) where
 * given (a group's ranks meet there: see group.c). */
void fw_pass_one(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out,
                 void (*wait)(void *), void *arg)
{
    be *b = f->b;
    const be_ops *o = b->ops;
    /* a backend that records passes (CUDA graphs) may replay one instead,
     * unless the family must run this one's ops */
    int rec = o->step_begin && (!f->fam->replayable || f->fam->replayable(f));
    int replayed = rec && o->step_begin(b, tokens, bt, out_idx, n_out);
    if (wait) wait(arg);
    if (!replayed) f->fam->pass(f, tokens, bt, out_idx, n_out);
    if (rec && o->step_end) o->step_end(b);
}

/* ... on every rank of a group */
static void fw_pass(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    if (f->grp) fw_group_pass(f, tokens, bt, out_idx, n_out);
    else fw_pass_one(f, tokens, bt, out_idx, n_out, NULL, NULL);
}

/* where a pass's logits are: a layer split's last stage, else f */
static fw *out_of(fw *f) { return f->grp ? fw_group_out(f) : f; }

void fw_run(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out, float *logits)
{
    fw_pass(f, tokens, bt, out_idx, n_out);
    fw *o = out_of(f);
    if (n_out > 0) o->b->ops->to_host(o->b, logits, o->lg, (size_t)n_out * o->m->hp.n_vocab * 4);
    o->b->ops->sync(o->b);
}

void fw_hidden(fw *f, float *hidden, int n_out)
{
    fw *o = out_of(f);
    if (n_out > 0) o->b->ops->to_host(o->b, hidden, o->xo, (size_t)n_out * o->m->hp.n_embd * 4);
    o->b->ops->sync(o->b);
}

int fw_greedy_ok(const fw *f) { return f->fam->greedy && f->b->ops->argmax != NULL; }

int fw_pass_queue(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    be *b = f->b;
    /* (a layer split's ids would have to go back from its last stage to its first) */
    if (!f->fam->greedy || !b->ops->argmax_queue || n_out <= 0 || n_out > BE_QUEUE_ROWS || f->m->n_stages > 1)
        return -1;
    fw_pass(f, tokens, bt, out_idx, n_out);
    return 0;
}

/* (a group's every rank queues the argmax: a next pass with ids_dev reads
 * each rank's own) */
void fw_argmax_queue(fw *f, int n_out, const uint32_t *mask)
{
    if (f->grp) fw_group_argmax(f, n_out, mask);
    else f->b->ops->argmax_queue(f->b, f->lg, n_out, f->m->hp.n_vocab, mask);
}

void fw_greedy_take(fw *f, int32_t *ids, int n_out)
{
    if (f->grp) fw_group_take(f, ids, n_out);
    else f->b->ops->argmax_take(f->b, ids, n_out);
}

void fw_run_greedy(fw *f, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out,
                   const uint32_t *mask, int32_t *ids)
{
    fw_pass(f, tokens, bt, out_idx, n_out);
    fw *o = out_of(f);
    if (n_out > 0) o->b->ops->argmax(o->b, o->lg, n_out, o->m->hp.n_vocab, mask, ids);
    o->b->ops->sync(o->b);
}
