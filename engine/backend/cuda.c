/* cuda.c — the CUDA backend (host side; kernels in shaders/; its state in
 * cuda_be.h, its linear-attention ops in cuda_ssm.c, its mixture-of-experts
 * op in cuda_moe.c). Built only with -DANE_CUDA (make cuda).
 *
 * Weights are uploaded once, in their GGUF block layouts (one copy per
 * distinct host pointer, so a tied output shares tok_embd's). Activations
 * and the KV cache are device memory. Every op is queued on one stream;
 * nothing syncs until the logits are read. Each forward pass's ids,
 * positions, sequence slots and page tables go up in one copy (step_begin)
 * into a fixed device block that every op reads. Pure decode passes (every token an
 * output row) are recorded once per batch size as a CUDA graph and replayed.
 * Matmuls: decode rows (be_batch.n_dec) go through GEMVs that read the
 * quantized blocks directly (q4_K, q6_K, q8_0, iq4_nl, iq4_xs and mxfp4 with
 * x quantized to int8 per 32 values and __dp4a, as the CPU's q8 activations; the other types in
 * f32 arithmetic; q8_0 and q6_K are repacked at upload within each row into
 * aligned words); decode batches of CK_GEMV_MAX_T+1 .. CK_MMQB_MAX_T rows of
 * q4_K (and q6_K on Hopper, ck_feat.wgmma) go through a batched kernel that reads
 * the quantized weights once per step for f16 tensor cores; prompt rows,
 * larger decode batches and the other types dequantize W to f16 for
 * cuBLAS (f32 accumulation and output). docs/cuda.md maps ops to kernels.
 * Every GEMV
 * tile size, and every spread of attention over blocks, gives a row the same
 * arithmetic, so a decoding sequence computes the same whatever else is in a
 * batch of up to CK_GEMV_MAX_T (at any size when opened deterministic).
 * Outside a forward pass (tests) batches under GEMM_MIN_T rows take the
 * GEMV. Greedy rows come back as ids.
 * Fusion (the debug switch ANE_CUDA_FUSE=0 turns it off): rope_kv is one
 * kernel (adding the q, k, v biases when the forward pass hands them over);
 * and the ops that produce a matmul's input (rmsnorm, add_rmsnorm,
 * silu_mul, attention) also write the form the matmul reads: int8 into xq,
 * with the GEMV's own quantizer, when an int8 matrix of that width would
 * take all those rows by GEMV; f16 into x16 when all of them go to cuBLAS.
 * Tags (source, rows, n) say what xq and x16 hold; a matmul on exactly that
 * skips the conversion, every op that may write device memory clears them,
 * and they never outlive a pass: being host state, they take the same
 * course while a pass is recorded as a graph. */
#ifdef ANE_CUDA

#include "engine/backend/cuda_be.h"
#include "engine/quant/qtypes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_MIN_T 9           /* outside a pass, batches of this many rows go to cuBLAS */
#define ARGMAX_ROWS 4096

static void *cu_alloc(be *b, size_t n)
{
    cu_be *c = (cu_be *)b;
    cu_dev(c);
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 256) != cudaSuccess) { cudaGetLastError(); return NULL; }
    if (!ok(c, cudaMemsetAsync(p, 0, n ? n : 256, c->st), "memset") || !ok(c, cudaStreamSynchronize(c->st), "memset")) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_free(be *b, void *p)
{
    tag_clear((cu_be *)b);
    cu_dev((cu_be *)b);
    if (p) cudaFree(p);
}

static void graphs_drop(cu_be *c)
{
    for (int i = 0; i <= GRAPH_MAX_T; i++)
        if (c->graph[i]) { cudaGraphExecDestroy(c->graph[i]); c->graph[i] = NULL; }
}

static void cu_close(be *b)
{
    cu_be *c = (cu_be *)b;
    if (!c) return;
    cu_dev(c);
    if (c->st) cudaStreamSynchronize(c->st);
    graphs_drop(c);   /* (before the group ends: graphs hold the communicator's resources) */
    cu_group_leave(c);
    for (int i = 0; i < c->n_up; i++) { cudaFree(c->up[i].dev); cudaFree(c->up[i].dev16); cudaFree(c->up[i].devb); }
    free(c->up);
    cudaFree(c->w16); cudaFree(c->x16); cudaFree(c->x16b); cudaFree(c->xq); cudaFree(c->xq2); cudaFree(c->d_step); cudaFree(c->part); cudaFree(c->blas_ws);
    cudaFree(c->rope_tab);
    if (c->h_step) cudaFreeHost(c->h_step);
    if (c->h_out) cudaFreeHost(c->h_out);
    if (c->h_ids_out) cudaFreeHost(c->h_ids_out);
    if (c->h_ids_q) cudaFreeHost(c->h_ids_q);
    if (c->h_mask) cudaFreeHost(c->h_mask);
    cudaFree(c->d_mask);
    for (int i = 0; i < 2; i++) {
        if (c->ev_ids[i]) cudaEventDestroy(c->ev_ids[i]);
        if (c->ev_step[i]) cudaEventDestroy(c->ev_step[i]);
    }
    cudaFree(c->d_ids_out);
    cudaFree(c->d_amax);
    cudaFree(c->mmqb_part); cudaFree(c->mmqb_cnt);
    if (c->blas) cublasDestroy(c->blas);
    if (c->st) cudaStreamDestroy(c->st);
    free(c);
}

static int cu_weight_prepare(be *b, wt *w)
{
    cu_be *c = (cu_be *)b;
    if (!w->data) return 0;
    cu_dev(c);
    if (!ck_type_ok(w->type) || (w->n_in > 0 && w->row_bytes == 0)) return -1;   /* (no whole blocks) */
    for (int i = 0; i < c->n_up; i++)
        if (c->up[i].data == w->data) { w->dev = c->up[i].dev; goto dims; }
    size_t n = (size_t)w->n_out * w->row_bytes;
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 256) != cudaSuccess) { cudaGetLastError(); return -1; }
    /* on our stream, then waited for: a plain cudaMemcpy from pageable memory
     * may return before its DMA lands, and runs on the legacy stream, which
     * our non-blocking stream does not wait for */
    if (!ok(c, cudaMemcpyAsync(d, w->data, n, cudaMemcpyHostToDevice, c->st), "weight upload") ||
        !ok(c, cudaStreamSynchronize(c->st), "weight upload")) {
        cudaFree(d);
        return -1;
    }
    if (w->type == QT_Q8_0 || w->type == QT_Q6_K) {   /* the kernels read these repacked (aligned words) */
        void *r = NULL;
        if (cudaMalloc(&r, n ? n : 256) != cudaSuccess) { cudaGetLastError(); cudaFree(d); return -1; }
        if (w->type == QT_Q8_0) ck_repack_q8_0(c->st, d, r, w->row_bytes, (int)w->n_in, (int)w->n_out);
        else ck_repack_q6_K(c->st, d, r, w->row_bytes, (int)w->n_in, (int)w->n_out);
        int good = ok(c, cudaStreamSynchronize(c->st), "repack");
        cudaFree(d);
        d = r;
        if (!good) { cudaFree(d); return -1; }
    }
    if (c->n_up == c->cap_up) {
        int cap = c->cap_up ? 2 * c->cap_up : 64;
        upl *u = realloc(c->up, (size_t)cap * sizeof *u);
        if (!u) { cudaFree(d); return -1; }
        c->up = u; c->cap_up = cap;
    }
    c->up[c->n_up] = (upl){ .data = w->data, .dev = d };
    c->n_up++;
    w->dev = d;
dims:
    /* (stacked experts go only to the moe kernels: no cuBLAS scratch or
     * GEMV input forms for them) */
    if (w->n_out > 1 && w->n_mat <= 1) {
        size_t e = (size_t)w->n_in * (size_t)w->n_out;
        if (e > c->max_w_elems) c->max_w_elems = e;
        if (w->n_in > c->max_n_in) c->max_n_in = w->n_in;
        int k = 0;
        while (k < c->n_q_n && c->q_n[k] != (int)w->n_in) k++;
        if (k == c->n_q_n && k < 8 && ck_gemv_int8(w->type, (int)w->n_in)) c->q_n[c->n_q_n++] = (int)w->n_in;
        k = 0;
        while (k < c->n_h_n && c->h_n[k] != (int)w->n_in) k++;
        if (k == c->n_h_n && k < 8 && w->type != QT_F32 && w->type != QT_F16 && w->type != QT_BF16 &&
            !(c->act_int8 && ck_gemv_int8(w->type, (int)w->n_in)))
            c->h_n[c->n_h_n++] = (int)w->n_in;
    }
    return 0;
}

static void cu_to_host(be *b, void *dst, const void *src, size_t n)
{
    cu_be *c = (cu_be *)b;
    cu_dev(c);
    if (n > c->h_out_cap) {
        if (c->h_out) cudaFreeHost(c->h_out);
        c->h_out = NULL; c->h_out_cap = 0;
        if (!ok(c, cudaMallocHost(&c->h_out, n), "pinned staging")) {
            ok(c, cudaStreamSynchronize(c->st), "sync");
            ok(c, cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "to_host");
            return;
        }
        c->h_out_cap = n;
    }
    ok(c, cudaMemcpyAsync(c->h_out, src, n, cudaMemcpyDeviceToHost, c->st), "to_host");
    ok(c, cudaStreamSynchronize(c->st), "sync");
    memcpy(dst, c->h_out, n);
}

static void cu_to_dev(be *b, void *dst, const void *src, size_t n)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    cu_dev(c);
    /* (see cu_weight_prepare: a plain cudaMemcpy could still be in flight) */
    ok(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->st), "to_dev");
    ok(c, cudaStreamSynchronize(c->st), "sync");
}

static int cu_mem_free(be *b, size_t *free_bytes, size_t *total_bytes)
{
    cu_dev((cu_be *)b);
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) { cudaGetLastError(); return -1; }
    return 0;
}

static void cu_sync(be *b)
{
    cu_be *c = (cu_be *)b;
    cu_dev(c);
    ok(c, cudaStreamSynchronize(c->st), "sync");
    ok(c, cudaGetLastError(), "kernel");
}

/* ---- the per-step block ---- */

/* Uploads ids (may be NULL) and bt's positions and page tables (bt may be
 * NULL). Not while capturing. */
static int stage(cu_be *c, const int32_t *ids, int T, const be_batch *bt)
{
    size_t n_pages = 0;
    if (bt) {
        const int32_t *prev = NULL;
        int have = 0;
        for (int t = 0; t < T; t++) {
            int need = bt->pos[t] / KV_PAGE + 1;
            if (bt->pages[t] == prev) { if (need > have) { n_pages += (size_t)(need - have); have = need; } }
            else { n_pages += (size_t)need; have = need; prev = bt->pages[t]; }
        }
    }
    int capT = c->cap_T;
    if (T > capT) capT = T < 1024 ? 1024 : T;
    size_t need = (size_t)4 * capT + n_pages;
    if (capT != c->cap_T || need > c->step_cap) {
        size_t cap = need > c->step_cap ? need * 2 : c->step_cap;
        ok(c, cudaStreamSynchronize(c->st), "sync");
        graphs_drop(c);
        if (c->h_step) cudaFreeHost(c->h_step);
        int32_t *old = c->d_step;
        c->h_step = NULL; c->d_step = NULL; c->step_cap = 0; c->cap_T = 0;
        if (!ok(c, cudaMallocHost((void **)&c->h_step, 2 * cap * 4), "step block") ||
            !ok(c, cudaMalloc((void **)&c->d_step, cap * 4), "step block")) {
            cudaFree(old);
            return -1;
        }
        /* ids the argmax before left for this pass move with the block */
        if (old && bt && bt->ids_dev) {
            ok(c, cudaMemcpyAsync(c->d_step, old, (size_t)T * 4, cudaMemcpyDeviceToDevice, c->st), "step block");
            ok(c, cudaStreamSynchronize(c->st), "sync");
        }
        cudaFree(old);
        c->step_cap = cap;
        c->cap_T = capT;
        c->step_used[0] = c->step_used[1] = 0;
    }
    /* this half's last copy must be done before it is rewritten */
    int half = c->step_half;
    c->step_half ^= 1;
    if (c->step_used[half]) ok(c, cudaEventSynchronize(c->ev_step[half]), "sync");
    int32_t *h = c->h_step + (size_t)half * c->step_cap;
    int32_t *ids_h = h, *pos_h = h + c->cap_T, *off_h = h + 2 * c->cap_T, *pg = h + 4 * c->cap_T;
    int32_t *slot_h = h + 3 * c->cap_T;
    if (ids) memcpy(ids_h, ids, (size_t)T * 4);
    size_t used = 0;
    if (bt) {
        const int32_t *prev = NULL;
        int have = 0;
        int32_t start = 0;
        for (int t = 0; t < T; t++) {
            int need_p = bt->pos[t] / KV_PAGE + 1;
            if (bt->pages[t] != prev) { start = (int32_t)used; have = 0; prev = bt->pages[t]; }
            if (need_p > have) {
                memcpy(pg + start + have, bt->pages[t] + have, (size_t)(need_p - have) * 4);
                used = (size_t)start + (size_t)need_p;
                have = need_p;
            }
            pos_h[t] = bt->pos[t];
            off_h[t] = start;
            slot_h[t] = bt->slot ? bt->slot[t] : 0;
        }
    }
    /* one copy: ids/pos/off/slot rows (T each) and the page tables; ids
     * already on the device (the argmax before wrote them) stay */
    size_t skip = bt && bt->ids_dev ? (size_t)c->cap_T : 0;
    ok(c, cudaMemcpyAsync(c->d_step + skip, h + skip, (4 * (size_t)c->cap_T + used - skip) * 4,
                          cudaMemcpyHostToDevice, c->st),
       "step upload");
    ok(c, cudaEventRecord(c->ev_step[half], c->st), "event");
    c->step_used[half] = 1;
    return 0;
}

static const int32_t *d_ids(cu_be *c) { return c->d_step; }
static const int32_t *d_off(cu_be *c) { return c->d_step + 2 * c->cap_T; }
static const int32_t *d_pages(cu_be *c) { return c->d_step + 4 * c->cap_T; }

/* Makes bt current (outside a step: uploads it now). */
void cu_use_batch(cu_be *c, const be_batch *bt)
{
    if (bt == c->cur_bt && c->cur_bt) return;
    stage(c, NULL, bt->T, bt);
}

static int ensure_gemm(cu_be *c, int T)
{
    size_t w = c->max_w_elems * 4, x = (size_t)T * (size_t)c->max_n_in * 2;
    if (w > c->w16_cap) {
        cudaFree(c->w16); c->w16 = NULL; c->w16_cap = 0;
        if (!ok(c, cudaMalloc(&c->w16, w), "f16 weight scratch")) return -1;
        c->w16_cap = w;
        graphs_drop(c);
    }
    if (x > c->x16_cap) {
        cudaFree(c->x16); c->x16 = NULL; c->x16_cap = 0;
        cudaFree(c->x16b); c->x16b = NULL;
        tag16_set(c, NULL, 0, 0);
        if (!ok(c, cudaMalloc(&c->x16, x), "f16 activation scratch") ||
            !ok(c, cudaMalloc(&c->x16b, x), "f16 activation scratch")) {
            cudaFree(c->x16); c->x16 = NULL;
            return -1;
        }
        c->x16_cap = x;
        graphs_drop(c);
    }
    return 0;
}

/* int8 activation scratch for T tokens of the widest matrix; NULL if none */
static void *xq_for(cu_be *c, int T, int n)
{
    size_t need = CK_XQ_BYTES(T, n), want = CK_XQ_BYTES(T, c->max_n_in > n ? c->max_n_in : n);
    if (need <= c->xq_cap) return c->xq;
    if (c->capturing) return NULL;
    ok(c, cudaStreamSynchronize(c->st), "sync");
    tag_clear(c);
    cudaFree(c->xq); c->xq = NULL; c->xq_cap = 0;
    cudaFree(c->xq2); c->xq2 = NULL;
    graphs_drop(c);
    if (!ok(c, cudaMalloc(&c->xq, want), "int8 scratch") || !ok(c, cudaMalloc(&c->xq2, want), "int8 scratch")) {
        cudaFree(c->xq); c->xq = NULL;
        return NULL;
    }
    c->xq_cap = want;
    return c->xq;
}

/* The spans (CK_ATT_SPAN) of the longest of bt's tokens [0, T) */
static int att_spans(const be_batch *bt, int T)
{
    int need = 1;
    for (int t = 0; t < T; t++) {
        int ns = (bt->pos[t] + CK_ATT_SPAN) / CK_ATT_SPAN;
        if (ns > need) need = ns;
    }
    return need;
}

/* A device scratch that recorded graphs point at, replaced by one of
 * `bytes` (not while recording): after the queued work, with the graphs
 * dropped. -1 (and no scratch) when that fails. */
static int scratch_regrow(cu_be *c, void **p, size_t bytes, const char *what)
{
    if (c->capturing) return -1;
    ok(c, cudaStreamSynchronize(c->st), "sync");
    graphs_drop(c);
    cudaFree(*p);
    *p = NULL;
    return ok(c, cudaMalloc(p, bytes), what) ? 0 : -1;
}

#define ATT_GRP_PART ((size_t)64 << 20)   /* the most partials kept for grouped attention's rows */
/* Spans from which a token's heads go grouped however few the rows: a long
 * context's decode reads each KV row once per group instead of once per
 * q head */
#define ATT_GRP_NS 8

/* Room in part for `rows` (token, head) rows of `need` spans each. The
 * rows a grouped batch added are kept while they fit ATT_GRP_PART. */
static int att_room_rows(cu_be *c, int need, int rows)
{
    if (need <= c->att_maxs && rows <= c->att_rows) return 0;
    int m = need <= c->att_maxs ? c->att_maxs : c->att_maxs * 2 > need ? c->att_maxs * 2 : need;
    int r = rows > c->att_rows ? rows : c->att_rows;
    if ((size_t)r * (size_t)m * (256 + 2) * 4 > ATT_GRP_PART) r = rows > 2 * c->n_sm ? rows : 2 * c->n_sm;
    size_t cap = (size_t)r * (size_t)m * (256 + 2);
    c->part_cap = 0; c->att_maxs = 0; c->att_rows = 0;
    if (scratch_regrow(c, (void **)&c->part, cap * 4, "attention partials")) return -1;
    c->part_cap = cap;
    c->att_maxs = m;
    c->att_rows = r;
    return 0;
}

static int att_room(cu_be *c, int need)
{
    return att_room_rows(c, need, 2 * c->n_sm);
}

/* Blocks per (token, head): several for short batches (flash-decoding),
 * no more than keep each block's warps on a span of the longest token
 * (or each block on one, where its warps take a span together). */
static int att_blocks(cu_be *c, int T, int ns, int n_head, int head_dim)
{
    int work = T * n_head, want = 2 * c->n_sm;
    if (work >= want || c->att_maxs < 2) return 1;
    if ((size_t)work * c->att_maxs * (size_t)(head_dim + 2) > c->part_cap) return 1;
    int coop = ck_att_coop(head_dim), par = ck_att_par(head_dim), g, gs;
    if (coop && ns <= coop) return 1;
    if (par && ns <= par && work <= c->n_sm) return 1;
    if (coop) {   /* (a span per block, while up to 8 blocks per SM) */
        g = (8 * c->n_sm + work - 1) / work;
        gs = ns;
    } else {
        g = (want + work - 1) / work;
        gs = (ns + CK_ATT_WARPS - 1) / CK_ATT_WARPS;
    }
    if (g > gs) g = gs;
    return g > c->att_maxs ? c->att_maxs : g < 1 ? 1 : g;
}

/* Grouped attention (ck_attention's grp) for a batch of at least 2 rows
 * per SM, or tokens of ATT_GRP_NS spans or more: blocks per (token, KV head)
 * for about att_grp blocks per SM (2, 4 and 8 alike on a 7b, 32 streams).
 * 0 (the ungrouped kernel, the same bits) when
 * the heads do not group, or the partials would pass ATT_GRP_PART (a
 * prompt's batch, or long contexts), or part cannot grow now (in a
 * capture). */
static int att_group(cu_be *c, int T, int ns, int n_head, int n_head_kv, int head_dim, int mma)
{
    if (!c->att_grp || (T * n_head < 2 * c->n_sm && ns < ATT_GRP_NS) ||
        !ck_att_grp_ok(c->base.kv_type, n_head, n_head_kv, head_dim))
        return 0;
    int per = T * n_head_kv, g = (mma ? c->att_mma_bps : c->att_grp) * c->n_sm / per;
    g = g > ns ? ns : g < 1 ? 1 : g;
    int rows = T * n_head;
    if (g > 1 && rows > c->att_rows) {
        if ((size_t)rows * (size_t)c->att_maxs * (256 + 2) * 4 > ATT_GRP_PART) return 0;
        if (c->capturing || att_room_rows(c, ns, rows)) return 0;
    }
    return g;
}

static int decode_shape(int T, const int32_t *out_idx, int n_out)
{
    if (n_out != T || T > GRAPH_MAX_T) return 0;
    for (int i = 0; i < n_out; i++) if (out_idx[i] != i) return 0;
    return 1;
}

static int cu_step_begin(be *b, const int32_t *tokens, const be_batch *bt, const int32_t *out_idx, int n_out)
{
    cu_be *c = (cu_be *)b;
    int T = bt->T;
    tag_clear(c);
    cu_dev(c);
    /* the scratch is taken at the first pass: GEMM for batches up to 1024 */
    if (ensure_gemm(c, T > 1024 ? T : 1024)) return 0;
    xq_for(c, T > 16 ? T : 16, (int)c->max_n_in);   /* before any capture */
    att_room(c, att_spans(bt, bt->T));
    stage(c, tokens, T, bt);
    c->cur_bt = bt;
    c->cur_ids = tokens;
    c->in_step = 1;
    c->rope_have = 0;
    c->n_dec = bt->n_dec;
    if (c->failed || c->no_graphs || bt->n_dec != T || !decode_shape(T, out_idx, n_out)) return 0;
    if (c->graph[T]) {
        if (!ok(c, cudaGraphLaunch(c->graph[T], c->st), "graph launch")) return 0;
        return 1;
    }
    /* record a shape once it repeats (the first passes run eagerly, warming cuBLAS) */
    if (c->seen[T] < 2) { c->seen[T]++; return 0; }
    if (!ok(c, cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal), "begin capture")) return 0;
    c->capturing = 1;
    c->cap_graph_T = T;
    return 0;
}

static void cu_step_end(be *b)
{
    cu_be *c = (cu_be *)b;
    if (c->capturing) {
        cudaGraph_t g = NULL;
        c->capturing = 0;
        int T = c->cap_graph_T;
        if (ok(c, cudaStreamEndCapture(c->st, &g), "end capture")) {
            cudaGraphExec_t ex = NULL;
            if (ok(c, cudaGraphInstantiate(&ex, g, 0), "graph instantiate")) {
                c->graph[T] = ex;
                ok(c, cudaGraphLaunch(ex, c->st), "graph launch");
            }
            cudaGraphDestroy(g);
        }
    }
    tag_clear(c);
    c->cur_bt = NULL;
    c->cur_ids = NULL;
    c->in_step = 0;
    c->n_dec = 0;
}

/* ---- ops ---- */

static void cu_embed(be *b, const wt *emb, const int32_t *ids, int T, float *out)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    if (ids != c->cur_ids) stage(c, ids, T, NULL);
    ck_embed(c->st, emb->type, emb->dev, emb->row_bytes, (int)emb->n_in, d_ids(c), T, out);
}

/* Rows [0, nd) by GEMV, the rest by cuBLAS; *batched: rows [0, nd) go to
 * the batched kernel instead (decode rows past CK_GEMV_MAX_T of the
 * matrices it takes: mb).
 * In a pass: its decode rows while they are at most CK_GEMV_MAX_T (or
 * invariant is set), so a decoding sequence computes the same alone or
 * among up to that many; larger decode batches go to the tensor cores.
 * Elsewhere (tests): all rows of a batch under GEMM_MIN_T. */
static int gemv_take(const cu_be *c, int mb, int T, int *batched)
{
    *batched = 0;
    if (c->gemv_all) return T;
    int nd = T;
    if (c->in_step) {
        nd = c->n_dec < T ? c->n_dec : T;
        if (nd <= CK_GEMV_MAX_T || c->invariant) return nd;
    } else if (T < GEMM_MIN_T) {
        return T;
    }
    if (!mb || nd <= CK_GEMV_MAX_T || nd > CK_MMQB_MAX_T) return 0;
    *batched = 1;
    return nd;
}

static upl *upl_of(cu_be *c, const wt *w)
{
    for (int i = 0; i < c->n_up; i++)
        if (c->up[i].dev == w->dev) return &c->up[i];
    return NULL;
}

/* bytes more of device memory, while an eighth of it plus 1 GiB stays free */
static void *dev_spare(size_t bytes)
{
    size_t fr = 0, tot = 0;
    void *d = NULL;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess || fr < bytes + tot / 8 + ((size_t)1 << 30) ||
        cudaMalloc(&d, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return d;
}

/* The q6_K matrix w in the batched kernel's layout, made at its first
 * batched use (the first passes of a shape run before its capture); NULL
 * while recording before that, or without room */
static const void *mmqb_q6_of(cu_be *c, const wt *w)
{
    upl *u = upl_of(c, w);
    if (!u || u->nob) return NULL;
    if (u->devb || c->capturing) return u->devb;
    void *d = dev_spare(ck_q6b_row_bytes((int)w->n_in) * (size_t)w->n_out);
    if (!d) { u->nob = 1; return NULL; }
    /* waited for: the batched kernel reads its first weights before its
     * launch wait (no kernel writes weights, but for this one) */
    ck_repack_q6_Kb(c->st, w->dev, d, w->row_bytes, (int)w->n_in, (int)w->n_out);
    if (!ok(c, cudaStreamSynchronize(c->st), "q6_K repack")) { cudaFree(d); u->nob = 1; return NULL; }
    u->devb = d;
    return d;
}

/* The bytes the batched kernel reads for w (q6_K: mmqb_q6_of's layout; NULL:
 * none at hand) and their row pitch */
static const void *mmqb_weight(cu_be *c, const wt *w, size_t *rb)
{
    if (w->type != QT_Q6_K) { *rb = w->row_bytes; return w->dev; }
    *rb = ck_q6b_row_bytes((int)w->n_in);
    return mmqb_q6_of(c, w);
}

/* gemv_take for w (rows to the batched kernel only where its bytes are at hand) */
static int gemv_count(cu_be *c, const wt *w, int T, int *batched)
{
    if (c->act_int8 && ck_gemv_int8(w->type, (int)w->n_in)) { *batched = 0; return T; }
    int nd = gemv_take(c, ck_mmqb_ok(w->type, (int)w->n_in), T, batched);
    size_t rb;
    if (*batched && !mmqb_weight(c, w, &rb)) nd = gemv_take(c, 0, T, batched);
    return nd;
}

/* whether n is among the m widths w (the matrices' n_in of a kind) */
static int width_in(const int *w, int m, int n)
{
    for (int k = 0; k < m; k++)
        if (w[k] == n) return 1;
    return 0;
}

/* For an op about to write out [rows][n]: xq, when out should go there in
 * int8 too (an int8 matrix of width n would take all rows by GEMV), with
 * the tag set to out; else NULL, the tag cleared. */
static void *quant_ahead(cu_be *c, const float *out, int rows, int n)
{
    tag_clear(c);
    if (!c->fuse || rows < 1 || n < 32 || n % 32) return NULL;
    int bt;
    if (!width_in(c->q_n, c->n_q_n, n) || (!c->act_int8 && gemv_take(c, 0, rows, &bt) != rows))
        return NULL;   /* (all rows by the GEMV) */
    void *xq = xq_for(c, rows, n);   /* (NULL while recording, if too small) */
    if (xq) tag_set(c, out, rows, n);
    return xq;
}

/* For an op about to write out [rows][n], after quant_ahead: x16 when all
 * rows go to the f16 GEMMs of quantized matrices of width n (cuBLAS, or
 * the batched f16 kernel), with the f16 tag set to out (the matmuls then
 * take it as converted); else NULL. */
static void *f16_ahead(cu_be *c, const float *out, int rows, int n)
{
    if (!c->fuse || rows < 1 || c->xq_src || c->x16_cap < (size_t)rows * (size_t)n * 2) return NULL;
    int bt;
    if (!width_in(c->h_n, c->n_h_n, n) || (gemv_take(c, 1, rows, &bt) != 0 && !bt)) return NULL;
    tag16_set(c, out, rows, n);
    return c->x16;
}

static void cu_rmsnorm(be *b, const float *x, const wt *w, int rows, int n, float eps, float *out)
{
    cu_be *c = (cu_be *)b;
    void *xq = quant_ahead(c, out, rows, n);
    ck_rmsnorm(c->st, x, w->dev, rows, n, eps, out, xq, f16_ahead(c, out, rows, n));
}

/* x16 holding x [T][n] in f16: as tagged, or converted now (then tagged);
 * NULL without the scratch */
static const void *x_f16(cu_be *c, const float *x, int T, int n)
{
    if (c->x16_src == x && c->x16_rows == T && c->x16_n == n) return c->x16;
    if ((!c->capturing && ensure_gemm(c, T)) || c->x16_cap < (size_t)T * n * 2) return NULL;
    ck_f32_to_f16(c->st, x, (size_t)T * n, c->x16);
    tag16_set(c, x, T, n);
    return c->x16;
}

/* The batched kernel for matrices w (one type and n_in) on x's f16 form;
 * 0 when there is no scratch (or q6_K layout) for it */
static int mmqb_try(cu_be *c, int nm, const wt *const *w, const float *const *bv, const float *x, int T,
                    float *const *out)
{
    const void *W[CK_MULTI_MAX];
    int no[CK_MULTI_MAX], n = (int)w[0]->n_in;
    size_t rb = 0;
    for (int i = 0; i < nm; i++) {
        W[i] = mmqb_weight(c, w[i], &rb);
        no[i] = (int)w[i]->n_out;
        if (!W[i]) return 0;
    }
    const void *xh = x_f16(c, x, T, n);
    if (!xh) return 0;
    ck_mmq_dec(c->st, w[0]->type, nm, W, rb, n, no, bv, T, out, xh, c->mmqb_part, CK_MMQB_PART, c->mmqb_cnt,
               CK_MMQB_CNT, c->n_sm);
    return 1;
}

/* Prompt batches of the int8 matrices of a model whose experts take int8
 * activations (be_opts.act_int8): on int8 tensor cores, the GEMV's
 * arithmetic in another order of the sums, so not for deterministic
 * daemons (nor decode batches: the GEMV's bits alone or batched). x's
 * int8 form as tagged, or quantized here (then tagged). 0: not taken. */
static int tc_rows(cu_be *c, int nm, const wt *const *w, const float *const *bv, const float *x, int T,
                   float *const *out)
{
    int n = (int)w[0]->n_in;
    if (!c->act_int8 || !tc_batch(c, T) || !ck_moe_int8(w[0]->type, n)) return 0;
    const void *xq = c->xq;
    if (!tag_is(c, x, T, n)) {
        void *q = xq_for(c, T, n);
        if (!q) return 0;
        ck_quant_x(c->st, x, T, n, q);
        tag_set(c, x, T, n);
        xq = q;
    }
    for (int i = 0; i < nm; i++)
        ck_tc_matmul(c->st, w[i]->type, w[i]->dev, w[i]->row_bytes, n, (int)w[i]->n_out, xq, T, bv[i], out[i]);
    return 1;
}

/* int8 types on x [T][n]: from the tagged xq, or quantized here (then
 * tagged); else f32 */
static void gemv_rows(cu_be *c, const wt *w, const float *bv, const float *x, int T, float *out)
{
    int n = (int)w->n_in;
    if (!ck_gemv_int8(w->type, n)) {
        ck_gemv(c->st, w->type, w->dev, w->row_bytes, n, (int)w->n_out, bv, x, T, out, NULL);
        return;
    }
    if (tc_rows(c, 1, &w, &bv, x, T, &out)) return;
    const void *W = w->dev;
    int no = (int)w->n_out;
    if (tag_is(c, x, T, n)) {
        ck_gemv_multi_q(c->st, w->type, 1, &W, w->row_bytes, n, &no, &bv, T, &out, c->xq);
        return;
    }
    void *xq = xq_for(c, T, n);
    ck_gemv(c->st, w->type, W, w->row_bytes, n, no, bv, x, T, out, xq);
    if (xq) tag_set(c, x, T, n);
}

/* cuBLAS: quantized W over f16 copies of W and x; float W (f32, f16, bf16:
 * unquantized models, held to the transformers reference) in plain f32,
 * since 10-bit inputs (f16, TF32) put the Qwen3.5 gates' logits 0.066 off
 * where f32 gives 0.0016. -1 when it cannot run (no scratch). */
/* The f16 copy of quantized weight w, kept from its first prompt matmul on
 * while free device memory stays above an eighth of it plus 1 GiB (the KV
 * pool is taken before any pass): prompt passes and wide decode batches
 * then skip dequantizing every weight in every pass. NULL: dequantize into
 * the scratch (be_opts.f16_cache_off, no room, or while recording a graph). */
static const void *w16_of(cu_be *c, const wt *w)
{
    if (!c->cache16) return NULL;
    upl *u = upl_of(c, w);
    if (!u || u->no16) return NULL;
    if (u->dev16 || c->capturing) return u->dev16;
    void *d = dev_spare((size_t)w->n_in * (size_t)w->n_out * 2);
    if (!d) { u->no16 = 1; return NULL; }
    ck_dequant_f16(c->st, w->type, w->dev, w->row_bytes, (int)w->n_in, (int)w->n_out, d);
    u->dev16 = d;
    return d;
}

static int gemm_rows(cu_be *c, const wt *w, const float *bv, const float *x, int T, float *out)
{
    int n = (int)w->n_in, no = (int)w->n_out;
    if ((!c->capturing && ensure_gemm(c, T)) || c->w16_cap < (size_t)n * no * 4 || c->x16_cap < (size_t)T * n * 2)
        return -1;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s;
    if (w->type == QT_F32 || w->type == QT_F16 || w->type == QT_BF16) {
        const void *wf = w->dev;
        if (w->type != QT_F32) {
            ck_dequant_f32(c->st, w->type, w->dev, w->row_bytes, n, no, c->w16);
            wf = c->w16;
        }
        s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, no, T, n, &one, wf, CUDA_R_32F, n, x, CUDA_R_32F, n,
                         &zero, out, CUDA_R_32F, no, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        const void *w16 = w16_of(c, w);
        if (!w16) {
            ck_dequant_f16(c->st, w->type, w->dev, w->row_bytes, n, no, c->w16);
            w16 = c->w16;
        }
        x_f16(c, x, T, n);   /* (room checked above) */
        s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, no, T, n, &one, w16, CUDA_R_16F, n, c->x16,
                         CUDA_R_16F, n, &zero, out, CUDA_R_32F, no, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        if (!c->failed) fprintf(stderr, "cuda backend: cublasGemmEx failed (%d)\n", (int)s);
        c->failed = 1;
        return 0;
    }
    if (bv) ck_add_bias(c->st, out, bv, T, no);
    return 0;
}

void cu_matmul(be *b, const wt *w, const wt *bias, const float *x, int T, float *out)
{
    cu_be *c = (cu_be *)b;
    const float *bv = bias && bias->data ? bias->dev : NULL;
    int bt, nd = gemv_count(c, w, T, &bt);
    if (nd < T && gemm_rows(c, w, bv, x + (size_t)nd * w->n_in, T - nd, out + (size_t)nd * w->n_out)) {
        nd = T;   /* (no cuBLAS scratch: every row by the GEMV) */
        bt = 0;
    }
    if (nd > 0 && !(bt && mmqb_try(c, 1, &w, &bv, x, nd, &out))) gemv_rows(c, w, bv, x, nd, out);
    tag_written(c, out, (size_t)T * w->n_out);
    c->mm_out = out; c->mm_rows = T; c->mm_n = (int)w->n_out;
}

/* Whether n matrices take one launch (the same type, n_in and row layout);
 * notes their bytes as the pass's last matmul set (rope_attention's rule) */
static int mm_set(cu_be *c, int n, const wt *const *w)
{
    c->mm_bytes = 0;
    for (int i = 0; i < n; i++) c->mm_bytes += (size_t)w[i]->n_out * w[i]->row_bytes;
    int same = n <= CK_MULTI_MAX;
    for (int i = 1; same && i < n; i++)
        same = w[i]->type == w[0]->type && w[i]->n_in == w[0]->n_in && w[i]->row_bytes == w[0]->row_bytes;
    return same;
}

static void cu_matmul_n(be *b, int n, const wt *const *w, const wt *const *bias, const float *x, int T,
                        float *const *out)
{
    cu_be *c = (cu_be *)b;
    int bt = 0, same = n <= CK_MULTI_MAX && gemv_count(c, w[0], T, &bt) == T;
    same = mm_set(c, n, w) && same;
    if (!same) {
        for (int i = 0; i < n; i++) cu_matmul(b, w[i], bias[i], x, T, out[i]);
        return;
    }
    const void *W[CK_MULTI_MAX];
    const float *bv[CK_MULTI_MAX];
    int no[CK_MULTI_MAX];
    for (int i = 0; i < n; i++) {
        W[i] = w[i]->dev;
        bv[i] = bias[i] && bias[i]->data ? bias[i]->dev : NULL;
        no[i] = (int)w[i]->n_out;
    }
    int nin = (int)w[0]->n_in;
    if (bt && mmqb_try(c, n, w, bv, x, T, out)) {
        /* (done) */
    } else if (!ck_gemv_int8(w[0]->type, nin)) {
        ck_gemv_multi(c->st, w[0]->type, n, W, w[0]->row_bytes, nin, no, bv, x, T, out, NULL);
    } else if (tc_rows(c, n, w, bv, x, T, out)) {
        /* (done) */
    } else if (tag_is(c, x, T, nin)) {
        ck_gemv_multi_q(c->st, w[0]->type, n, W, w[0]->row_bytes, nin, no, bv, T, out, c->xq);
    } else {
        void *xq = xq_for(c, T, nin);
        ck_gemv_multi(c->st, w[0]->type, n, W, w[0]->row_bytes, nin, no, bv, x, T, out, xq);
        if (xq) tag_set(c, x, T, nin);
    }
    for (int i = 0; i < n; i++) tag_written(c, out[i], (size_t)T * no[i]);
    c->mm_out = out[0]; c->mm_rows = T; c->mm_n = no[0];
}

static void cu_add_rmsnorm(be *b, float *x, const float *y, const wt *w, int rows, int n, float eps, float *out)
{
    cu_be *c = (cu_be *)b;
    void *xq = quant_ahead(c, out, rows, n);
    ck_add_rmsnorm(c->st, x, y, w->dev, rows, n, eps, out, xq, f16_ahead(c, out, rows, n));
}

static void cu_silu_mul(be *b, const float *g, const float *u, size_t n, float *out);

/* out = silu(Wg x) * (Wu x). One token whose x is already in int8 (the
 * norm before wrote it) and whose out goes on in int8 (the down
 * projection): one launch that writes out's int8 form into the second
 * scratch, which then becomes xq (the kernel reads x's from the first).
 * A decode batch of the batched q4_K kernel: one launch whose gate and up
 * rows of a feature share a block, writing out's f16 form into the second
 * f16 scratch, which then becomes x16. Else matmul_n and silu_mul. */
static void cu_matmul_glu(be *b, const wt *wg, const wt *wu, const float *x, int T, float *g, float *u, float *out)
{
    cu_be *c = (cu_be *)b;
    int n = (int)wg->n_in, F = (int)wg->n_out, bt;
    int same = wu->type == wg->type && (int)wu->n_in == n && (int)wu->n_out == F && wu->row_bytes == wg->row_bytes;
    if (c->fuse && c->glu && same && gemv_count(c, wg, T, &bt) == T && bt) {
        const void *xh = x_f16(c, x, T, n);
        if (xh && c->x16b && c->x16_cap >= (size_t)T * F * 2 &&
            ck_mmq_glu_try(c->st, wg->type, wg->dev, wu->dev, wg->row_bytes, n, F, T, out, c->x16b, xh, c->mmqb_part,
                       CK_MMQB_PART, c->mmqb_cnt, CK_MMQB_CNT, c->n_sm)) {
            void *t = c->x16; c->x16 = c->x16b; c->x16b = t;
            tag_clear(c);
            tag16_set(c, out, T, F);
            c->mm_out = NULL;
            return;
        }
    }
    if (!c->fuse || !c->glu || !same || !c->xq2 || !width_in(c->q_n, c->n_q_n, F) ||
        !ck_glu_ok(wg->type, n, F, T, c->n_sm) || gemv_count(c, wg, T, &bt) != T || bt || !tag_is(c, x, T, n) ||
        CK_XQ_BYTES(T, F) > c->xq_cap) {
        const wt *ws[2] = { wg, wu }, *bs[2] = { NULL, NULL };
        float *outs[2] = { g, u };
        cu_matmul_n(b, 2, ws, bs, x, T, outs);
        cu_silu_mul(b, g, u, (size_t)T * F, out);
        return;
    }
    tag_clear(c);
    void *x16 = f16_ahead(c, out, T, F);
    ck_gemv_glu(c->st, wg->type, wg->dev, wu->dev, wg->row_bytes, n, F, c->xq, out, c->xq2, x16);
    void *t = c->xq; c->xq = c->xq2; c->xq2 = t;
    tag_set(c, out, T, F);
    c->mm_out = NULL;
}

static void cu_add(be *b, float *x, const float *y, size_t n)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    ck_add(c->st, x, y, n);
}

static void cu_gelu_mul(be *b, const float *x, const float *up, size_t n, float *out)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    ck_gelu_mul(c->st, x, up, n, out);
}

static void cu_scale(be *b, float *x, size_t n, float s)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    ck_scale(c->st, x, n, s);
}

static void cu_layernorm(be *b, const float *x, const wt *w, const wt *bias, int rows, int n, float eps, float *out)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    ck_layernorm(c->st, x, w->dev, bias && bias->data ? bias->dev : NULL, rows, n, eps, out);
}

static void cu_add_pos(be *b, float *x, const wt *table, const be_batch *bt, int n)
{
    cu_be *c = (cu_be *)b;
    cu_use_batch(c, bt);
    tag_clear(c);
    int kind = table->type == QT_F16 ? 1 : table->type == QT_BF16 ? 2 : 0;
    ck_add_pos(c->st, x, table->dev, kind, table->row_bytes, d_pos(c), bt->T, n);
}

/* out [rows][F] when g or u is the last matmul's output of that shape */
static void cu_silu_mul(be *b, const float *g, const float *u, size_t n, float *out)
{
    cu_be *c = (cu_be *)b;
    int rows = 0;
    void *xq = NULL, *x16 = NULL;
    if (c->mm_out && (g == c->mm_out || u == c->mm_out) && c->mm_n > 0 && n == (size_t)c->mm_rows * c->mm_n) {
        rows = c->mm_rows;
        xq = quant_ahead(c, out, rows, c->mm_n);
        x16 = f16_ahead(c, out, rows, c->mm_n);
    } else {
        tag_clear(c);
    }
    ck_silu_mul(c->st, g, u, n, out, xq, x16, rows);
}

/* The kernels' rope mode: bit 0 neox, bit 1 the divisor table ends with
 * a factor on cos and sin (YaRN, backend.h). */
static int rope_mode(int neox, int n_rot, const wt *fd)
{
    return (neox ? 1 : 0) | (fd && fd->data && fd->n_in > n_rot / 2 ? 2 : 0);
}

static void cu_rope(be *b, float *x, const be_batch *bt, int n_heads, int head_dim, int n_rot, float base,
                    int neox, const wt *fd)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    cu_use_batch(c, bt);
    ck_rope(c->st, x, d_pos(c), bt->T, n_heads, head_dim, n_rot, base, rope_mode(neox, n_rot, fd),
            fd && fd->data ? fd->dev : NULL);
}

static void cu_kv_store(be *b, void *kc, void *vc, const be_batch *bt, int kv_dim, const float *k, const float *v)
{
    cu_be *c = (cu_be *)b;
    tag_clear(c);
    cu_use_batch(c, bt);
    ck_kv_store(c->st, kc, vc, b->kv_type, d_pos(c), d_off(c), d_pages(c), bt->T, kv_dim, k, v);
}

static const float *bias_dev(const wt *const *bias, int i)
{
    return bias && bias[i] && bias[i]->data ? (const float *)bias[i]->dev : NULL;
}

/* whether this pass's angle table (written by its first rope_kv) holds
 * the angles of base, n_rot and divisors fd */
static int rope_table(const cu_be *c, float base, int n_rot, const float *fd)
{
    return c->in_step && c->rope_have && c->rope_base == base && c->rope_rot == n_rot && c->rope_fd == fd;
}

static void cu_rope_kv(be *b, float *q, float *k, float *v, void *kc, void *vc, const be_batch *bt,
                       int n_head, int n_head_kv, int head_dim, int n_rot, float base, int neox, const wt *fd,
                       const wt *const *bias)
{
    cu_be *c = (cu_be *)b;
    if (!c->fuse) {
        const float *bq = bias_dev(bias, 0), *bk = bias_dev(bias, 1), *bv = bias_dev(bias, 2);
        tag_clear(c);
        if (bq) ck_add_bias(c->st, q, bq, bt->T, n_head * head_dim);
        if (bk) ck_add_bias(c->st, k, bk, bt->T, n_head_kv * head_dim);
        if (bv) ck_add_bias(c->st, v, bv, bt->T, n_head_kv * head_dim);
        cu_rope(b, q, bt, n_head, head_dim, n_rot, base, neox, fd);
        cu_rope(b, k, bt, n_head_kv, head_dim, n_rot, base, neox, fd);
        cu_kv_store(b, kc, vc, bt, n_head_kv * head_dim, k, v);
        return;
    }
    tag_clear(c);
    cu_use_batch(c, bt);
    const float *fdd = fd && fd->data ? fd->dev : NULL;
    /* the angles: from the table when this pass's first rope_kv (same
     * base, dims, divisors) wrote it; else computed, and written when the
     * table is free (or can grow: not while recording) */
    size_t need = (size_t)bt->T * (size_t)(n_rot / 2) * 8;
    int mode = 0;
    if (rope_table(c, base, n_rot, fdd)) {
        mode = 2;
    } else if (c->in_step && !c->rope_have) {
        if (need > c->rope_cap) {
            size_t cap = c->rope_cap * 2 > need ? c->rope_cap * 2 : need;
            if (!c->capturing) c->rope_cap = scratch_regrow(c, &c->rope_tab, cap, "rope table") ? 0 : cap;
        }
        if (need <= c->rope_cap) {
            mode = 1;
            c->rope_have = 1; c->rope_base = base; c->rope_rot = n_rot; c->rope_fd = fdd;
        }
    }
    ck_rope_kv(c->st, q, k, v, kc, vc, b->kv_type, d_pos(c), d_off(c), d_pages(c), bt->T, n_head, n_head_kv,
               head_dim, n_rot, base, rope_mode(neox, n_rot, fd), fdd, bias_dev(bias, 0), bias_dev(bias, 1),
               bias_dev(bias, 2), c->rope_tab, mode);
}

/* Attention on tensor cores allowed: where the matmuls leave the
 * batch-invariance promise too (not deterministic), or forced */
static int att_tc(const cu_be *c)
{
    return c->att_mma == 2 || (c->att_mma == 1 && !c->invariant);
}

/* The first row of bt's prompt rows that go to ck_att_prompt (bt->T:
 * none): rows past the decode rows, where tensor cores are allowed (the
 * prompt's matmuls leave the batch-invariance promise too), in runs of one
 * sequence (at least 2 tokens a run on average), and (unless forced) enough
 * of them to give every SM a block. */
static int att_prompt_from(const cu_be *c, const be_batch *bt, int n_head, int n_head_kv, int head_dim)
{
    int t0 = bt->n_dec, n = bt->T - t0;
    if (n < 2 || !att_tc(c) ||
        !ck_att_prompt_ok(c->base.kv_type, n_head, n_head_kv, head_dim))
        return bt->T;
    int runs = 1;
    for (int t = t0 + 1; t < bt->T; t++) runs += bt->pages[t] != bt->pages[t - 1];
    if (n < 2 * runs) return bt->T;
    int tb = ck_att_prompt_tokens(n_head, n_head_kv);
    if (c->att_mma != 2 && (n + tb - 1) / tb * n_head_kv < c->n_sm) return bt->T;
    return t0;
}

/* Rows [0, T) of bt (T < bt->T: the rest is ck_att_prompt's) */
static void att_run_rows(cu_be *c, const float *q, const void *kc, const void *vc, const be_batch *bt, int T,
                         int n_head, int n_head_kv, int head_dim, float *out, const ck_rope_in *rp, void *xq,
                         void *x16)
{
    int ns = att_spans(bt, T);
    int room = !att_room(c, ns);
    /* (decode batches past CK_GEMV_MAX_T streams) */
    int mma = att_tc(c) && (c->att_mma == 2 || (c->in_step && c->n_dec > CK_GEMV_MAX_T)) &&
              ck_att_mma_ok(c->base.kv_type, n_head, n_head_kv, head_dim);
    int grp = room && !rp && c->att_maxs >= ns ? att_group(c, T, ns, n_head, n_head_kv, head_dim, mma) : 0;
    int G = grp || !room ? 1 : att_blocks(c, T, ns, n_head, head_dim);
    ck_attention(c->st, q, kc, vc, c->base.kv_type, d_pos(c), d_off(c), d_pages(c), T, bt->T, n_head, n_head_kv,
                 head_dim, out, c->part, G, c->att_maxs, xq, x16, c->n_sm, rp, grp, mma);
}

static void att_run(cu_be *c, const float *q, const void *kc, const void *vc, const be_batch *bt, int n_head,
                    int n_head_kv, int head_dim, float *out, const ck_rope_in *rp)
{
    cu_use_batch(c, bt);
    int tp = rp ? bt->T : att_prompt_from(c, bt, n_head, n_head_kv, head_dim);
    void *xq = head_dim % 32 == 0 ? quant_ahead(c, out, bt->T, n_head * head_dim) : (tag_clear(c), NULL);
    void *x16 = f16_ahead(c, out, bt->T, n_head * head_dim);
    if (tp > 0) att_run_rows(c, q, kc, vc, bt, tp, n_head, n_head_kv, head_dim, out, rp, xq, x16);
    ck_att_prompt(c->st, q, kc, vc, c->base.kv_type, d_pos(c), d_off(c), d_pages(c), tp, bt->T, n_head, n_head_kv,
                  head_dim, 0, NULL, 1.0f / sqrtf((float)head_dim), out, xq, x16);
}

static void cu_attention(be *b, const float *q, const void *kc, const void *vc, const be_batch *bt, int n_head,
                         int n_head_kv, int head_dim, float *out)
{
    att_run((cu_be *)b, q, kc, vc, bt, n_head, n_head_kv, head_dim, out, NULL);
}

static void cu_attention_ex(be *b, const float *q, const void *kc, const void *vc, const be_batch *bt, int n_head,
                            int n_head_kv, int head_dim, const be_attn_ex *ex, float *out)
{
    cu_be *c = (cu_be *)b;
    if (!ex || (ex->window <= 0 && !(ex->sinks && ex->sinks->data) && ex->scale == 0)) {
        att_run(c, q, kc, vc, bt, n_head, n_head_kv, head_dim, out, NULL);
        return;
    }
    cu_use_batch(c, bt);
    tag_clear(c);
    float scale = ex->scale != 0 ? ex->scale : 1.0f / sqrtf((float)head_dim);
    int window = ex->window > 0 ? ex->window : 0, tp = att_prompt_from(c, bt, n_head, n_head_kv, head_dim);
    const float *sinks = ex->sinks && ex->sinks->data ? ex->sinks->dev : NULL;
    if (tp > 0)
        ck_attention_ex(c->st, q, kc, vc, b->kv_type, d_pos(c), d_off(c), d_pages(c), tp, n_head, n_head_kv,
                        head_dim, window, sinks, scale, out);
    ck_att_prompt(c->st, q, kc, vc, b->kv_type, d_pos(c), d_off(c), d_pages(c), tp, bt->T, n_head, n_head_kv,
                  head_dim, window, sinks, scale, out, NULL, NULL);
}

/* rope_kv then attention. A pass's decode batch (a token per sequence) past
 * its first rope_kv (whose angle table the later layers read) does the rope
 * and the KV store inside the attention kernel: one launch less per layer,
 * the same values (the attention reads its token's K/V row only after
 * writing it). Only after a small q/k/v set (ck_small_set: launch-bound
 * layers): a small model gains, a 7b loses (docs/benchmarks-cuda.md). */
static void cu_rope_attention(be *b, float *q, float *k, float *v, void *kc, void *vc, const be_batch *bt,
                              int n_head, int n_head_kv, int head_dim, int n_rot, float base, int neox,
                              const wt *freq_div, const wt *const *bias, float *out)
{
    cu_be *c = (cu_be *)b;
    const float *fdd = freq_div && freq_div->data ? freq_div->dev : NULL;
    int small = c->rope_att_always || (c->mm_bytes && ck_small_set(c->mm_bytes));
    if (!c->fuse || !small || !rope_table(c, base, n_rot, fdd) || bt->n_dec != bt->T || n_rot > head_dim || n_rot % 2 ||
        b->kv_type == BE_KV_Q8_0) {
        cu_rope_kv(b, q, k, v, kc, vc, bt, n_head, n_head_kv, head_dim, n_rot, base, neox, freq_div, bias);
        cu_attention(b, q, kc, vc, bt, n_head, n_head_kv, head_dim, out);
        return;
    }
    tag_clear(c);
    ck_rope_in rp = { k, v, bias_dev(bias, 0), bias_dev(bias, 1), bias_dev(bias, 2), c->rope_tab, n_rot,
                      rope_mode(neox, n_rot, freq_div) };
    att_run(c, q, kc, vc, bt, n_head, n_head_kv, head_dim, out, &rp);
}

/* One decode token's q, k, v (q8_0 rows the one-token GEMV takes two
 * warps a row of) with the rope and KV store in the matmul's epilogue,
 * from the pass's angle table (so not the pass's first layer, whose
 * rope_kv writes it). */
static int cu_qkv_rope(be *b, const wt *const *w, const wt *const *bias, const float *x, float *q, float *k, float *v,
                       void *kc, void *vc, const be_batch *bt, int n_head, int n_head_kv, int head_dim, int n_rot,
                       float base, int neox, const wt *freq_div)
{
    cu_be *c = (cu_be *)b;
    int T = bt->T, bt_;
    const float *fdd = freq_div && freq_div->data ? freq_div->dev : NULL;
    if (!c->fuse || T != 1 || bt->n_dec != T || !rope_table(c, base, n_rot, fdd) || b->kv_type == BE_KV_Q8_0) return 0;
    int nin = (int)w[0]->n_in;
    if (!mm_set(c, 3, w) || gemv_count(c, w[0], T, &bt_) != T || bt_ || !tag_is(c, x, T, nin)) return 0;
    if ((int)w[0]->n_out != n_head * head_dim) return 0;
    const void *W[3] = { w[0]->dev, w[1]->dev, w[2]->dev };
    int no[3] = { (int)w[0]->n_out, (int)w[1]->n_out, (int)w[2]->n_out };
    float *outs[3] = { q, k, v };
    cu_use_batch(c, bt);
    ck_qkv_rope r = { bias_dev(bias, 0), bias_dev(bias, 1), bias_dev(bias, 2), c->rope_tab, d_pos(c), d_off(c),
                      d_pages(c), kc, vc, b->kv_type == BE_KV_F16, head_dim, n_rot, rope_mode(neox, n_rot, freq_div),
                      n_head_kv, base, fdd };
    if (!ck_gemv_qkv_rope_try(c->st, w[0]->type, W, w[0]->row_bytes, nin, no, c->xq, outs, &r)) return 0;
    tag_clear(c);   /* (as rope_kv) */
    c->mm_out = NULL;
    return 1;
}

/* A grammar's host mask for rows argmax rows to the device, through the
 * pinned half h (that of the ids it goes with: a half is written again
 * only after those ids were taken, so no queued copy reads it then).
 * NULL when mask is NULL, or on failure (c->failed). */
static const uint32_t *mask_up(cu_be *c, const uint32_t *mask, int rows, int n, int h)
{
    if (!mask) return NULL;
    size_t words = (size_t)rows * (((size_t)n + 31) / 32);
    if (words > c->mask_cap) {
        ok(c, cudaStreamSynchronize(c->st), "sync");   /* (the copies from the old halves) */
        if (c->h_mask) cudaFreeHost(c->h_mask);
        cudaFree(c->d_mask);
        c->h_mask = NULL;
        c->d_mask = NULL;
        c->mask_cap = 0;
        if (!ok(c, cudaMallocHost((void **)&c->h_mask, 2 * words * 4), "grammar mask") ||
            !ok(c, cudaMalloc((void **)&c->d_mask, 2 * words * 4), "grammar mask"))
            return NULL;
        c->mask_cap = words;
    }
    uint32_t *hm = c->h_mask + (size_t)h * c->mask_cap, *dm = c->d_mask + (size_t)h * c->mask_cap;
    memcpy(hm, mask, words * 4);
    ok(c, cudaMemcpyAsync(dm, hm, words * 4, cudaMemcpyHostToDevice, c->st), "grammar mask");
    return dm;
}

static void cu_argmax(be *b, const float *x, int rows, int n, const uint32_t *mask, int32_t *ids)
{
    cu_be *c = (cu_be *)b;
    cu_dev(c);
    if (mask && c->ids_n == 2) ok(c, cudaStreamSynchronize(c->st), "sync");   /* (both halves queued) */
    const uint32_t *dm = mask_up(c, mask, rows, n, (c->ids_head + c->ids_n) & 1);
    size_t nw = ((size_t)n + 31) / 32;
    for (int r0 = 0; r0 < rows; r0 += ARGMAX_ROWS) {
        int nr = rows - r0 < ARGMAX_ROWS ? rows - r0 : ARGMAX_ROWS;
        ck_argmax(c->st, x + (size_t)r0 * n, nr, n, dm ? dm + (size_t)r0 * nw : NULL, c->d_ids_out, c->d_amax);
        ok(c, cudaMemcpyAsync(c->h_ids_out, c->d_ids_out, (size_t)nr * 4, cudaMemcpyDeviceToHost, c->st), "ids");
        ok(c, cudaStreamSynchronize(c->st), "sync");
        memcpy(ids + r0, c->h_ids_out, (size_t)nr * 4);
    }
}

/* The ids go to the step block's id rows (read by a next pass with
 * ids_dev; a pass with host ids overwrites them) and from there to a host
 * half; the pass queued next does not restage them. */
static void cu_argmax_queue(be *b, const float *x, int rows, int n, const uint32_t *mask)
{
    cu_be *c = (cu_be *)b;
    cu_dev(c);
    if (rows > c->cap_T) stage(c, NULL, rows, NULL);   /* (no pass yet: the step block) */
    if (c->ids_n == 2 || rows > BE_QUEUE_ROWS || rows > c->cap_T) {   /* (outside the contract) */
        c->failed = 1;
        return;
    }
    int s2 = (c->ids_head + c->ids_n) & 1;
    ck_argmax(c->st, x, rows, n, mask_up(c, mask, rows, n, s2), c->d_step, c->d_amax);
    ok(c, cudaMemcpyAsync(c->h_ids_q + (size_t)s2 * BE_QUEUE_ROWS, c->d_step, (size_t)rows * 4,
                          cudaMemcpyDeviceToHost, c->st), "ids");
    ok(c, cudaEventRecord(c->ev_ids[s2], c->st), "event");
    c->ids_n++;
}

static void cu_argmax_take(be *b, int32_t *ids, int rows)
{
    cu_be *c = (cu_be *)b;
    cu_dev(c);
    if (c->ids_n == 0) { memset(ids, 0, (size_t)rows * 4); c->failed = 1; return; }
    int s2 = c->ids_head;
    ok(c, cudaEventSynchronize(c->ev_ids[s2]), "sync");
    memcpy(ids, c->h_ids_q + (size_t)s2 * BE_QUEUE_ROWS, (size_t)rows * 4);
    c->ids_head ^= 1;
    c->ids_n--;
}

static const be_ops cuda_ops = {
    .name = "cuda",
    .moe_scratch = cu_moe_scratch,
    .moe = cu_moe,
    .close = cu_close,
    .alloc = cu_alloc,
    .free = cu_free,
    .weight_prepare = cu_weight_prepare,
    .to_host = cu_to_host,
    .to_dev = cu_to_dev,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .matmul = cu_matmul,
    .add = cu_add,
    .silu_mul = cu_silu_mul,
    .rope = cu_rope,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .attention_ex = cu_attention_ex,
    .gelu_mul = cu_gelu_mul,
    .layernorm = cu_layernorm,
    .scale = cu_scale,
    .add_pos = cu_add_pos,
    .sync = cu_sync,
    .mem_free = cu_mem_free,
    .step_begin = cu_step_begin,
    .step_end = cu_step_end,
    .argmax = cu_argmax,
    .argmax_queue = cu_argmax_queue,
    .argmax_take = cu_argmax_take,
    .matmul_n = cu_matmul_n,
    .matmul_glu = cu_matmul_glu,
    .add_rmsnorm = cu_add_rmsnorm,
    .rope_kv = cu_rope_kv,
    .rope_attention = cu_rope_attention,
    .qkv_rope = cu_qkv_rope,
    .copy_rows = cu_copy_rows,
    .sigmoid_mul = cu_sigmoid_mul,
    .rmsnorm_gated = cu_rmsnorm_gated,
    .conv1d_silu = cu_conv1d_silu,
    .deltanet = cu_deltanet,
    .group = cu_group,
    .allreduce = cu_allreduce,
    .send = cu_send,
    .recv = cu_recv,
};

/* info's device: the card, its compute capability, the code it runs and
 * the kernels' path (docs/cuda.md, "Which GPUs") */
static void cu_device_name(cu_be *c)
{
    struct cudaDeviceProp pr;
    const ck_feat *f = ck_feat_now();
    if (cudaGetDeviceProperties(&pr, c->dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(pr.name, sizeof pr.name, "CUDA device");
    }
    char gpu[24] = "";
    if (c->dev) snprintf(gpu, sizeof gpu, " (GPU %d)", c->dev);
    snprintf(c->base.device, sizeof c->base.device, "%.100s%s, compute capability %d.%d, sm_%d%s code, %s path%s",
             pr.name, gpu, f->cc / 10, f->cc % 10, f->code, f->code == 90 && c->feat.wgmma ? "a" : "",
             f->wgmma ? "Hopper" : "portable", c->act_int8 ? ", int8 activations" : "");
}

void be_cuda_force_set(be *b, const be_cuda_force *f)
{
    cu_be *c = (cu_be *)b;
    cu_dev(c);
    c->fuse = !f->unfused && !ck_debug_off("ANE_CUDA_FUSE");
    c->gemv_all = f->gemv_all;
    c->glu = !f->glu_apart;
    c->rope_att_always = f->rope_att;
    c->att_mma = f->att_mma > 0 ? 2 : f->att_mma < 0 ? 0 : 1;
    c->att_grp = f->att_grp < 0 ? 0 : f->att_grp > 0 ? f->att_grp : 4;
    c->att_mma_bps = f->att_grp > 0 ? f->att_grp : 1;
    /* the portable path: the device's features less every Hopper one
     * (graphs recorded with the other launches are dropped) */
    ck_feat use = c->feat;
    if (f->portable) use.wgmma = use.bulk = use.pdl = 0;
    if (memcmp(&use, ck_feat_now(), sizeof use)) {
        graphs_drop(c);
        ck_feat_use(&use);
    }
    cu_device_name(c);
}

int be_cuda_open(be **out, struct pool *p, const be_opts *o, char *err, size_t errlen)
{
    (void)p;
    const be_opts dflt = { 0 };
    if (!o) o = &dflt;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        cudaGetLastError();
        snprintf(err, errlen, "no CUDA device");
        return -1;
    }
    if (o->device < 0 || o->device >= n) {
        snprintf(err, errlen, "no CUDA device %d (this machine has %d: 0..%d)", o->device, n, n - 1);
        return -1;
    }
    cu_be *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); return -1; }
    c->base.ops = &cuda_ops;
    c->base.kv_type = o->kv_type;
    c->dev = o->device;
    const char *what = "device";
    if (cudaSetDevice(c->dev) != cudaSuccess) goto fail;
    if (cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, c->dev) != cudaSuccess) goto fail;
    if (ck_feat_probe(&c->feat, err, errlen)) {
        cu_close(&c->base);
        return -1;
    }
    what = "stream";
    if (cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking) != cudaSuccess) goto fail;
    what = "cuBLAS";
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) goto fail;
    if (cublasSetStream(c->blas, c->st) != CUBLAS_STATUS_SUCCESS) goto fail;
    size_t ws = (size_t)32 << 20;
    what = "device memory";
    if (cudaMalloc(&c->blas_ws, ws) != cudaSuccess) goto fail;
    if (cublasSetWorkspace(c->blas, c->blas_ws, ws) != CUBLAS_STATUS_SUCCESS) goto fail;
    c->att_maxs = 32;
    c->att_rows = 2 * c->n_sm;
    c->part_cap = (size_t)c->att_rows * (size_t)c->att_maxs * (256 + 2);
    if (cudaMalloc((void **)&c->part, c->part_cap * 4) != cudaSuccess) goto fail;
    if (cudaMalloc((void **)&c->d_ids_out, ARGMAX_ROWS * 4) != cudaSuccess) goto fail;
    if (cudaMallocHost((void **)&c->h_ids_q, 2 * BE_QUEUE_ROWS * 4) != cudaSuccess) goto fail;
    for (int i = 0; i < 2; i++)
        if (cudaEventCreateWithFlags(&c->ev_ids[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&c->ev_step[i], cudaEventDisableTiming) != cudaSuccess)
            goto fail;
    if (cudaMalloc(&c->d_amax, CK_ARGMAX_PART) != cudaSuccess) goto fail;
    if (cudaMallocHost((void **)&c->h_ids_out, ARGMAX_ROWS * 4) != cudaSuccess) goto fail;
    c->cache16 = !o->f16_cache_off;
    c->invariant = o->deterministic;
    c->no_graphs = o->no_graphs;
    c->act_int8 = o->act_int8;
    be_cuda_force_set(&c->base, &(be_cuda_force){ 0 });
    what = "device memory";
    if (cudaMalloc(&c->mmqb_part, CK_MMQB_PART) != cudaSuccess ||
        cudaMalloc((void **)&c->mmqb_cnt, CK_MMQB_CNT * sizeof(int)) != cudaSuccess ||
        cudaMemset(c->mmqb_cnt, 0, CK_MMQB_CNT * sizeof(int)) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        goto fail;
    *out = &c->base;
    return 0;
fail:
    snprintf(err, errlen, "cannot set up the CUDA %s: %s", what, cudaGetErrorString(cudaGetLastError()));
    cu_close(&c->base);
    return -1;
}

#else
typedef int backend_cuda_unused;   /* CPU-only builds: nothing here */
#endif
