/* cpu_moe.c — the CPU backend's mixture-of-experts FFN (contract in
 * backend.h, be_moe). Per batch:
 *   1. router logits (the matmul), gating and top-k per token;
 *   2. the (token, rank) pairs grouped by expert: pair slots ordered by
 *      expert, then token;
 *   3. each token's row quantized once per pair slot, then every expert's
 *      gate and up rows run over its own slots only (qt_gemm), biases and
 *      the activation applied in the same work item;
 *   4. the hidden rows quantized, every expert's down rows over its slots;
 *   5. out[t] = sum over rank k of weight * y[slot of (t, k)], in rank order.
 * A backend holding some of the experts (be_moe.n_held) routes over all of
 * them and skips the pairs routed elsewhere.
 * qt_gemm's results do not depend on the rows batched with a row, and every
 * other step is per row, so a token's output is the same in any batch. */
#include "engine/backend/cpu_moe.h"
#include "engine/backend/cpu_ssm.h"
#include "engine/backend/moe_lay.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The scratch: the shared parts (moe_lay.h), then the per-expert counts
 * and the quantized activations, 64-byte aligned. */
typedef struct cpu_moe_lay {
    moe_lay p;
    size_t cnt, act_g, act_u, act_d;
    size_t sg, su, sd;          /* quantized row strides */
    uint32_t tg, tu, td;        /* activation types */
} cpu_moe_lay;

static size_t moe_layout(const be_moe *m, int max_T, cpu_moe_lay *L)
{
    moe_lay_of(m, max_T, 64, &L->p);
    const size_t N = L->p.N;
    L->tg = qt_act_type(m->gate->type);
    L->tu = qt_act_type(m->up->type);
    L->td = qt_act_type(m->down->type);
    L->sg = qt_row_size(L->tg, (int64_t)L->p.E);
    L->su = qt_row_size(L->tu, (int64_t)L->p.E);
    L->sd = qt_row_size(L->td, (int64_t)L->p.F);
    L->cnt = moe_lay_part(&L->p, (L->p.X + 1) * 4, 64);
    L->act_g = moe_lay_part(&L->p, N * L->sg, 64);
    L->act_u = L->tu == L->tg ? L->act_g : moe_lay_part(&L->p, N * L->su, 64);
    L->act_d = moe_lay_part(&L->p, N * L->sd, 64);
    return L->p.end;
}

size_t cpu_moe_scratch(be *b, const be_moe *m, int max_T)
{
    cpu_moe_lay L;
    return moe_layout(m, max_T, &L);
}

/* The n_used best of s[n] (ties: the lower index) into ids, in descending
 * order; returns 1 when the last chosen and the best unchosen are within
 * 1e-5 (a near-tie). */
static int top_k(const float *s, int n, int k, int32_t *ids)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j && !taken; i++) taken = ids[i] == e;
            if (!taken && (best < 0 || s[e] > s[best])) best = e;
        }
        ids[j] = best;
    }
    if (k == n) return 0;
    float next = -INFINITY;
    for (int e = 0; e < n; e++) {
        int taken = 0;
        for (int i = 0; i < k && !taken; i++) taken = ids[i] == e;
        if (!taken && s[e] > next) next = s[e];
    }
    return fabsf(s[ids[k - 1]] - next) < 1e-5f;
}

/* Routing of one token: logits lg[n_expert] (bias added) -> ids, wts.
 * Softmax and sigmoid keep the order of the logits, so the choice is made
 * on the logits in every mode (probabilities can round equal where the
 * logits differ). */
static int route(const be_moe *m, const float *lg, int32_t *ids, float *wts)
{
    int n = m->n_expert, k = m->n_used, tie = top_k(lg, n, k, ids);
    if (m->gating == BE_MOE_SIGMOID) {
        for (int j = 0; j < k; j++) wts[j] = 1.0f / (1.0f + expf(-lg[ids[j]]));
    } else {
        /* softmax over all experts, or over the chosen (TOPK_SOFTMAX) */
        float mx = lg[ids[0]];
        double all = 0;
        if (m->gating == BE_MOE_SOFTMAX)
            for (int e = 0; e < n; e++) all += expf(lg[e] - mx);
        for (int j = 0; j < k; j++) wts[j] = expf(lg[ids[j]] - mx);
        if (m->gating == BE_MOE_SOFTMAX)
            for (int j = 0; j < k; j++) wts[j] = (float)(wts[j] / all);
    }
    if (m->norm || m->gating == BE_MOE_TOPK_SOFTMAX) {
        double sum = 0;
        for (int j = 0; j < k; j++) sum += wts[j];
        for (int j = 0; j < k; j++) wts[j] = (float)(wts[j] / sum);
    }
    if (m->scale != 0 && m->scale != 1)
        for (int j = 0; j < k; j++) wts[j] *= m->scale;
    return tie;
}

static inline float moe_act(const be_moe *m, float g, float u)
{
    switch (m->act) {
    case BE_MOE_GELU:
        return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) * u;
    case BE_MOE_SWIGLU_OAI:
        g = g < m->limit ? g : m->limit;
        u = u < -m->limit ? -m->limit : u > m->limit ? m->limit : u;
        return g / (1.0f + expf(-m->alpha * g)) * (u + 1.0f);
    default:
        return g / (1.0f + expf(-g)) * u;
    }
}

typedef struct moe_job {
    const be_moe *m;
    const cpu_moe_lay *L;
    char *s;                    /* the scratch */
    const float *x;
    float *out;
    int T, K, E, F;
    int n_act;                  /* experts with tokens */
    int32_t act_e[BE_MOE_MAX];  /* those experts */
    int chunk_f, ipe_f;         /* gate/up rows per item, items per expert */
    int chunk_e, ipe_e;         /* down rows per item, items per expert */
} moe_job;

#define P(j, off, ty) ((ty *)((j)->s + (j)->L->off))

/* Pair slot i: the token's row quantized for gate (and up, when its
 * activation type differs). */
static void moe_quant_x(void *arg, int i, int ith)
{
    (void)ith;
    moe_job *j = arg;
    const cpu_moe_lay *L = j->L;
    int t = P(j, p.pair, int32_t)[i] / j->K;
    const float *xr = j->x + (size_t)t * j->E;
    qt_quantize_row(L->tg, xr, j->s + L->act_g + (size_t)i * L->sg, j->E);
    if (L->tu != L->tg) qt_quantize_row(L->tu, xr, j->s + L->act_u + (size_t)i * L->su, j->E);
}

/* Work item it of a step of ipe items per active expert, each `chunk` of
 * the expert's `rows` rows: its expert (returned), rows [r0, r1), and the
 * expert's first slot and slot count. */
static int moe_item(const moe_job *j, int it, int ipe, int chunk, int rows, int64_t *r0, int64_t *r1, int *first,
                    int *nb)
{
    const int e = j->act_e[it / ipe];
    *r0 = (int64_t)(it % ipe) * chunk;
    *r1 = *r0 + chunk < rows ? *r0 + chunk : rows;
    *first = P(j, p.first, int32_t)[e];
    *nb = P(j, cnt, int32_t)[e];
    return e;
}

static void moe_gate_up(void *arg, int it, int ith)
{
    moe_job *j = arg;
    const be_moe *m = j->m;
    const cpu_moe_lay *L = j->L;
    const int F = j->F;
    int64_t r0, r1;
    int first, nb, e = moe_item(j, it, j->ipe_f, j->chunk_f, F, &r0, &r1, &first, &nb);
    float *hg = P(j, p.hg, float) + (size_t)first * F, *hu = P(j, p.hu, float) + (size_t)first * F;
    const char *ag = j->s + L->act_g + (size_t)first * L->sg;
    const char *au = L->tu == L->tg ? ag : j->s + L->act_u + (size_t)first * L->su;
    qt_gemm(m->gate->type, j->E, (const char *)m->gate->data + (size_t)e * F * m->gate->row_bytes,
            m->gate->row_bytes, r0, r1, ag, L->sg, nb, hg, F);
    qt_gemm(m->up->type, j->E, (const char *)m->up->data + (size_t)e * F * m->up->row_bytes, m->up->row_bytes, r0,
            r1, au, L->tu == L->tg ? L->sg : L->su, nb, hu, F);
    const float *gb = m->gate_b && m->gate_b->data ? (const float *)m->gate_b->data + (size_t)e * F : NULL;
    const float *ub = m->up_b && m->up_b->data ? (const float *)m->up_b->data + (size_t)e * F : NULL;
    for (int b = 0; b < nb; b++)
        for (int64_t r = r0; r < r1; r++) {
            float g = hg[(size_t)b * F + r], u = hu[(size_t)b * F + r];
            if (gb) g += gb[r];
            if (ub) u += ub[r];
            hg[(size_t)b * F + r] = moe_act(m, g, u);
        }
}

static void moe_quant_h(void *arg, int i, int ith)
{
    (void)ith;
    moe_job *j = arg;
    const cpu_moe_lay *L = j->L;
    qt_quantize_row(L->td, P(j, p.hg, float) + (size_t)i * j->F, j->s + L->act_d + (size_t)i * L->sd, j->F);
}

static void moe_down(void *arg, int it, int ith)
{
    moe_job *j = arg;
    const be_moe *m = j->m;
    const cpu_moe_lay *L = j->L;
    int64_t r0, r1;
    int first, nb, e = moe_item(j, it, j->ipe_e, j->chunk_e, j->E, &r0, &r1, &first, &nb);
    const int E = j->E;
    float *y = P(j, p.y, float) + (size_t)first * E;
    qt_gemm(m->down->type, j->F, (const char *)m->down->data + (size_t)e * E * m->down->row_bytes,
            m->down->row_bytes, r0, r1, j->s + L->act_d + (size_t)first * L->sd, L->sd, nb, y, E);
    if (m->down_b && m->down_b->data) {
        const float *db = (const float *)m->down_b->data + (size_t)e * E;
        for (int b = 0; b < nb; b++)
            for (int64_t r = r0; r < r1; r++) y[(size_t)b * E + r] += db[r];
    }
}

/* out[t] = sum_k w[t][k] * y[slot(t, k)], k ascending, over the pairs
 * whose experts are held here (slot -1: held elsewhere; none: zeros). */
static void moe_combine(void *arg, int t, int ith)
{
    (void)ith;
    moe_job *j = arg;
    int K = j->K, E = j->E, any = 0;
    const int32_t *slot = P(j, p.slot, int32_t) + (size_t)t * K;
    const float *w = P(j, p.wts, float) + (size_t)t * K, *y = P(j, p.y, float);
    float *o = j->out + (size_t)t * E;
    for (int k = 0; k < K; k++) {
        if (slot[k] < 0) continue;
        const float *yk = y + (size_t)slot[k] * E;
        if (!any)
            for (int i = 0; i < E; i++) o[i] = w[k] * yk[i];
        else
            for (int i = 0; i < E; i++) o[i] += w[k] * yk[i];
        any = 1;
    }
    if (!any) memset(o, 0, (size_t)E * sizeof *o);
}

/* rows per work item: a multiple of 16, enough items for the threads */
static int moe_chunk(int rows, int n_act, int nth)
{
    int per = n_act >= 2 * nth ? 1 : (2 * nth + n_act - 1) / n_act;
    int c = (rows + per - 1) / per;
    c = (c + 15) / 16 * 16;
    return c < 16 ? 16 : c;
}

void cpu_moe(be *b, const be_moe *m, const float *x, int T, void *scratch, float *out)
{
    if (T <= 0) return;
    cpu_moe_lay L;
    moe_layout(m, T, &L);
    const int XH = be_moe_held(m), e0 = m->expert0;
    moe_job j = { .m = m, .L = &L, .s = scratch, .x = x, .out = out, .T = T, .K = m->n_used,
                  .E = (int)(m->down->n_out / XH), .F = m->n_ff };
    int K = j.K, X = m->n_expert, N = T * K;
    float *lg = P(&j, p.lg, float), *wts = P(&j, p.wts, float);
    int32_t *ids = P(&j, p.ids, int32_t), *cnt = P(&j, cnt, int32_t), *first = P(&j, p.first, int32_t);
    int32_t *slot = P(&j, p.slot, int32_t), *pair = P(&j, p.pair, int32_t);

    b->ops->matmul(b, m->router, m->router_b, x, T, lg);
    long ties = 0;
    for (int t = 0; t < T; t++) ties += route(m, lg + (size_t)t * X, ids + (size_t)t * K, wts + (size_t)t * K);
    *be_cpu_moe_tie_count(b) += ties;

    /* the held experts by their index here; -1: held by another rank */
    for (int i = 0; i < N; i++) ids[i] = ids[i] >= e0 && ids[i] < e0 + XH ? ids[i] - e0 : -1;
    memset(cnt, 0, (size_t)(XH + 1) * 4);
    int n_pairs = 0;   /* pairs held here */
    for (int i = 0; i < N; i++)
        if (ids[i] >= 0) cnt[ids[i]]++, n_pairs++;
    first[0] = 0;
    for (int e = 0; e < XH; e++) first[e + 1] = first[e] + cnt[e];
    memset(cnt, 0, (size_t)XH * 4);
    for (int i = 0; i < N; i++) {   /* token order within an expert */
        int e = ids[i], s = e < 0 ? -1 : first[e] + cnt[e]++;
        slot[i] = s;
        if (s >= 0) pair[s] = i;
    }
    j.n_act = 0;
    for (int e = 0; e < XH; e++)
        if (cnt[e]) j.act_e[j.n_act++] = e;

    pool *p = be_cpu_pool(b);
    int nth = pool_size(p);
    if (j.n_act) {   /* (none: every pair's expert is another rank's) */
        pool_run(p, moe_quant_x, &j, n_pairs);
        j.chunk_f = moe_chunk(j.F, j.n_act, nth);
        j.ipe_f = (j.F + j.chunk_f - 1) / j.chunk_f;
        pool_run(p, moe_gate_up, &j, j.n_act * j.ipe_f);
        pool_run(p, moe_quant_h, &j, n_pairs);
        j.chunk_e = moe_chunk(j.E, j.n_act, nth);
        j.ipe_e = (j.E + j.chunk_e - 1) / j.chunk_e;
        pool_run(p, moe_down, &j, j.n_act * j.ipe_e);
    }
    pool_run(p, moe_combine, &j, T);
}
