/* place.c — where the model runs (engine-internal): its backend, the
 * size of the KV pool, and with eng_opts.gpus naming several GPUs, the
 * model split over them (engine/arch/split.h) as one tensor-parallel
 * group whose rank 0 the worker drives like any forward pass; with
 * eng_opts.gpu_layers, the first layers on the CPU and the rest on the GPU
 * as a layer split of two stages. */
#include "engine/engine_int.h"
#include "engine/arch/split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The KV pool's pages: --kv-budget, else what fits (the CPU: a quarter of
 * physical memory; an accelerator: its free memory less everything else
 * fw_mem_estimate counts, a margin of 1/16 of the device and, where that
 * leaves a context, room for the f16 weight copies), never more than
 * max_seqs full contexts. Pages are taken as sequences grow, so the pool is
 * shared by what sequences hold, not by what they could reach. Without --ctx
 * the context is lowered to what the pool holds; a pool below a --ctx
 * context is an error (with the default budget, the device check says what
 * does not fit). */
static int kv_size(eng *e, const eng_opts *opt, model *m, be *b, int max_T, int max_out, size_t *out, char *err,
                   size_t errlen)
{
    size_t page_bytes = fw_kv_page_bytes(m, b->kv_type);
    size_t pages_per_ctx = ((size_t)e->n_ctx + KV_PAGE - 1) / KV_PAGE;
    size_t n_pages, dev_free = 0, dev_total = 0;
    int dev = b->ops->mem_free && !b->ops->mem_free(b, &dev_free, &dev_total);
    if (opt->kv_budget) {
        n_pages = opt->kv_budget / page_bytes;
    } else {
        n_pages = pages_per_ctx * (size_t)e->max_seqs;
        size_t room;
        if (dev) {
            fw_mem need;
            fw_mem_estimate(m, b->kv_type, 0, max_T, max_out, e->max_seqs, &need);   /* (rings included) */
            size_t keep = need.total + dev_total / 16;
            room = dev_free > keep ? dev_free - keep : 0;
            /* leave the f16 weight copies for prompts their room too (at
             * most 2 bytes a weight), unless that leaves less than a context */
            size_t f16 = opt->cuda_f16_cache_off ? 0 : (size_t)2 * m->n_params;
            if (room > f16 + pages_per_ctx * page_bytes) room -= f16;
        } else {
            long pg = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
            room = pg > 0 && psz > 0 ? (size_t)pg * (size_t)psz / 4 : (size_t)1 << 30;
            size_t rings = (size_t)e->max_seqs * fw_kv_ring_bytes(m, b->kv_type);
            room = room > rings ? room - rings : 0;
        }
        if (room / page_bytes < n_pages) n_pages = room / page_bytes;
        if (opt->n_ctx > 0 && n_pages < pages_per_ctx) n_pages = pages_per_ctx;
    }
    if (n_pages > (size_t)1 << 24 && !(dev && opt->kv_budget)) n_pages = (size_t)1 << 24;   /* (page tables) */
    if (n_pages < pages_per_ctx) {
        if (opt->n_ctx > 0 || n_pages * KV_PAGE < 64) {
            snprintf(err, errlen, "%s: a KV pool of %zu MiB (%zu tokens) is below one full context of %d tokens "
                     "(%zu MiB in %s); raise --kv-budget or lower --ctx", m->path, n_pages * page_bytes >> 20,
                     n_pages * KV_PAGE, e->n_ctx, pages_per_ctx * page_bytes >> 20, be_kv_name(b->kv_type));
            return -1;
        }
        e->n_ctx = (int)(n_pages * KV_PAGE);
    }
    if (dev) {
        /* the whole need against the device's free memory, before any of it is taken */
        fw_mem need;
        fw_mem_estimate(m, b->kv_type, n_pages, max_T, max_out, e->max_seqs, &need);
        if (need.total > dev_free) {
            /* the layers that would fit beside the rest (the output, the
             * scratch), each with its share of the weights and the pool */
            char fit[96] = "";
            size_t rest = need.total - need.weights - need.kv, per = (need.weights + need.kv) / (size_t)m->hp.n_layer;
            long n_fit = per && dev_free > rest ? (long)((dev_free - rest) / per) : 0;
            if (!m->n_stages && n_fit > 0 && n_fit < m->hp.n_layer)
                snprintf(fit, sizeof fit, ", --gpu-layers %ld (about that many of its %d layers fit)", n_fit,
                         m->hp.n_layer);
            snprintf(err, errlen,
                     "%s: the model needs about %zu MiB of %s device memory (weights %zu, KV pool %zu for %zu "
                     "tokens in %s, state %zu, activations %zu, scratch %zu MiB) but %zu MiB of %zu are free; "
                     "lower --ctx, --max-seqs or --kv-budget, use --kv-type q8_0%s, or a smaller model",
                     m->path, need.total >> 20, b->ops->name, need.weights >> 20, need.kv >> 20,
                     n_pages * KV_PAGE, be_kv_name(b->kv_type), need.state >> 20, need.act >> 20,
                     need.scratch >> 20, dev_free >> 20, dev_total >> 20, fit);
            return -1;
        }
    }
    if (n_pages > (size_t)1 << 24) n_pages = (size_t)1 << 24;
    *out = n_pages;
    return 0;
}


/* eng_opts.gpus: "0,1,3" into ids; the count, or -1 with err */
static int parse_gpus(const char *s, int *ids, char *err, size_t errlen)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 255 || (*end && *end != ',') || n == ENG_GPUS_MAX) {
            snprintf(err, errlen, "--gpus '%s': expected up to %d GPU numbers separated by commas, e.g. 0,1", s,
                     ENG_GPUS_MAX);
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (ids[i] == v) {
                snprintf(err, errlen, "--gpus '%s': GPU %ld is named twice", s, v);
                return -1;
            }
        ids[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) {
        snprintf(err, errlen, "--gpus '': expected GPU numbers separated by commas, e.g. 0,1");
        return -1;
    }
    return n;
}

/* The ranks' backends joined and the model split over them; where NCCL
 * cannot make the group, a warning and the first GPU alone (n_ranks 0). */
static int place_group(eng *e, const be_opts *bo, const int *ids, int n, char *err, size_t errlen)
{
    e->rank_be[0] = e->be;
    for (int i = 1; i < n; i++) {
        be_opts o = *bo;
        o.device = ids[i];
        char berr[256];
        if (be_open_opts(&e->rank_be[i], "cuda", e->pool, &o, berr, sizeof berr)) {
            snprintf(err, errlen, "--gpus %s: %s", e->opt.gpus, berr);
            return -1;
        }
        e->n_ranks = i + 1;
    }
    if ((e->opt.split_layers ? model_stages : model_split)(e->m, n, e->rank_m, err, errlen)) return -1;
    char gerr[256];
    if (e->be->ops->group(e->rank_be, n, gerr, sizeof gerr)) {
        char line[400];
        snprintf(line, sizeof line, "--gpus %s: %s; running on GPU %d alone", e->opt.gpus, gerr, ids[0]);
        eng_log(e, 1, line);
        for (int i = 0; i < n; i++) model_split_free(e->rank_m[i]);
        for (int i = 1; i < n; i++) e->rank_be[i]->ops->close(e->rank_be[i]);
        memset(e->rank_m, 0, sizeof e->rank_m);
        memset(e->rank_be, 0, sizeof e->rank_be);
        e->n_ranks = 0;
        return 0;
    }
    e->n_ranks = n;
    return 0;
}

/* --gpu-layers: the CPU takes the layers before the last n as stage 0
 * (with the embeddings), the GPU the rest and the output as stage 1 */
static int place_offload(eng *e, int kvt, int n, char *err, size_t errlen)
{
    be *cpu = NULL;
    if (be_cpu_open(&cpu, e->pool, kvt, err, errlen)) return -1;
    const int first[2] = { 0, e->m->hp.n_layer - n };
    if (model_stages_from(e->m, 2, first, e->rank_m, err, errlen)) {
        cpu->ops->close(cpu);
        return -1;
    }
    e->rank_be[0] = cpu;
    e->rank_be[1] = e->be;
    e->n_ranks = 2;
    e->offload = 1;
    size_t len = strlen(e->be->device);
    snprintf(e->be->device + len, sizeof e->be->device - len, ", %d of %d layers on it, %d on the CPU", n,
             e->m->hp.n_layer, e->m->hp.n_layer - n);
    return 0;
}

int eng_place(eng *e, const eng_opts *opt, int max_T, int max_out, char *err, size_t errlen)
{
    model *m = e->m;
    eng_model_info *in = &e->info;
    int ids[ENG_GPUS_MAX] = { 0 }, n_gpus = 1;
    if (opt->gpus) {
        if ((n_gpus = parse_gpus(opt->gpus, ids, err, errlen)) < 0) return -1;
        if (opt->backend && strcmp(opt->backend, "cuda")) {
            snprintf(err, errlen, "--gpus %s: GPUs are the cuda backend's, not --backend %s's", opt->gpus,
                     opt->backend);
            return -1;
        }
    }
    int kvt = opt->kv_type == ENG_KV_F32 ? BE_KV_F32 : opt->kv_type == ENG_KV_Q8_0 ? BE_KV_Q8_0 : BE_KV_F16;
    int offload = opt->gpu_layers > 0 && opt->gpu_layers < m->hp.n_layer;
    if (opt->gpu_layers < 0) {
        snprintf(err, errlen, "--gpu-layers %d: expected a number of layers from 1 (use --backend cpu for none)",
                 opt->gpu_layers);
        return -1;
    }
    if (opt->gpu_layers && ((opt->backend && strcmp(opt->backend, "cuda")) || n_gpus > 1)) {
        snprintf(err, errlen, "--gpu-layers %d: layers go to one GPU (the cuda backend, one --gpus number), not %s",
                 opt->gpu_layers, n_gpus > 1 ? "to several" : opt->backend);
        return -1;
    }
    if (kvt == BE_KV_Q8_0 && m->hp.n_attn_layers > 0 && m->hp.head_dim % 32) {
        snprintf(err, errlen, "%s: --kv-type q8_0 needs a head_dim that is a multiple of 32 (the model's is %d); use f16",
                 m->path, m->hp.head_dim);
        return -1;
    }
    be_opts bo = { .kv_type = kvt, .deterministic = opt->deterministic,
                   .f16_cache_off = opt->cuda_f16_cache_off, .act_int8 = m->hp.n_expert > 0, .device = ids[0],
                   .no_graphs = offload };
    if (be_open_opts(&e->be, opt->gpus || opt->gpu_layers ? "cuda" : opt->backend, e->pool, &bo, err, errlen))
        return -1;
    const char *lacks = fw_lacks(m, e->be->ops);
    if (lacks) {
        /* the architecture needs ops this backend lacks: when the
         * backend was not asked for by name, run the model on the CPU */
        if (opt->backend || opt->gpus || opt->gpu_layers) {
            snprintf(err, errlen, "%s: the %s backend cannot run %s models (%s); use --backend cpu",
                     m->path, e->be->ops->name, m->arch_name, lacks);
            return -1;
        }
        e->be->ops->close(e->be);
        e->be = NULL;
        if (be_cpu_open(&e->be, e->pool, kvt, err, errlen)) return -1;
    }
    in->backend = e->be->ops->name;
    in->kv_type = be_kv_name(e->be->kv_type);
    /* a GPU pass costs about the same for 128 or 512 prompt tokens (each
     * pass reads, and for prompts converts, every weight once): there
     * prompts share passes with decoding streams at full width */
    e->prefill_shared = strcmp(e->be->ops->name, "cpu") ? BATCH_TOKENS : PREFILL_SHARED;

    /* sliding-window layers: a ring per sequence slot, unless --swa-full */
    m->swa_ring = opt->swa_full ? 0 : fw_swa_ring(m, e->be->ops, max_T, e->n_ctx);
    in->swa_ring = m->swa_ring;
    if (n_gpus > 1 && place_group(e, &bo, ids, n_gpus, err, errlen)) return -1;
    if (offload && place_offload(e, kvt, opt->gpu_layers, err, errlen)) return -1;
    if (e->n_ranks && (opt->split_layers || e->rank_m[0]->n_held)) {
        size_t len = strlen(e->be->device);
        snprintf(e->be->device + len, sizeof e->be->device - len, "%s",
                 opt->split_layers ? ", split by layers" : ", experts whole");
    }
    in->device = e->be->device;
    /* each rank's device holds its part of the weights and of every page */
    size_t n_pages = 0;
    for (int r = 0; r < (e->n_ranks ? e->n_ranks : 1); r++) {
        size_t np;
        if (kv_size(e, opt, e->n_ranks ? e->rank_m[r] : m, e->n_ranks ? e->rank_be[r] : e->be, max_T, max_out, &np,
                    err, errlen))
            return -1;
        if (!r || np < n_pages) n_pages = np;
    }
    in->n_ctx = e->n_ctx;
    if (n_pages > (size_t)1 << 24) n_pages = (size_t)1 << 24;
    if (opt->cpu_repack_off && !strcmp(e->be->ops->name, "cpu")) be_cpu_repack(e->be, 0);
    if (opt->cpu_repack_off && e->offload) be_cpu_repack(e->rank_be[0], 0);
    e->n_pages_total = (int)n_pages;
    in->kv_pool_tokens = (uint64_t)n_pages * KV_PAGE;
    if (!e->n_ranks) {
        if (model_prepare(m, e->be, err, errlen)) return -1;
        in->repacked_bytes = e->be->own_bytes;
        return fw_open(&e->fw, m, e->be, max_T, max_out, e->n_pages_total, e->max_seqs, err, errlen);
    }
    fw *fs[ENG_GPUS_MAX] = { 0 };
    for (int r = 0; r < e->n_ranks; r++) {
        if (model_prepare(e->rank_m[r], e->rank_be[r], err, errlen) ||
            fw_open(&fs[r], e->rank_m[r], e->rank_be[r], max_T, max_out, e->n_pages_total, e->max_seqs, err,
                    errlen)) {
            for (int i = 0; i < r; i++) fw_close(fs[i]);
            return -1;
        }
    }
    if (fw_join(fs, e->n_ranks, e->offload ? (size_t)max_T * m->hp.n_embd : 0, err, errlen)) {
        for (int i = 0; i < e->n_ranks; i++) fw_close(fs[i]);
        return -1;
    }
    e->fw = fs[0];
    m->resident = e->rank_m[0]->resident;
    return 0;
}

void eng_unplace(eng *e)
{
    fw_close(e->fw);   /* (a group's other ranks with it) */
    e->fw = NULL;
    for (int r = 0; r < e->n_ranks; r++)
        if (e->rank_be[r] && e->rank_be[r] != e->be) e->rank_be[r]->ops->close(e->rank_be[r]);
    for (int r = 0; r < ENG_GPUS_MAX; r++) model_split_free(e->rank_m[r]);
    memset(e->rank_m, 0, sizeof e->rank_m);
    if (e->be) e->be->ops->close(e->be);
    e->be = NULL;
    e->n_ranks = 0;
    e->offload = 0;
}
