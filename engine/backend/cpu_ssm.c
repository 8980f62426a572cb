/* cpu_ssm.c — the CPU backend's linear-attention (Gated DeltaNet)
 * and gated-attention ops (see backend.h for their contracts). Runs of
 * tokens of one sequence go through the delta rule in chunks of DN_CHUNK
 * (the chunked parallel form: the state meets a chunk through three matrix
 * products, the chunk's own tokens through a triangular solve); a run of
 * one token (decoding) is the plain recurrent step. Work is split over value
 * heads (deltanet) and channel blocks (conv); each job walks the batch in
 * order, so several tokens of one sequence in a batch are always applied
 * in position order. */
#include "engine/backend/cpu_ssm.h"
#include "engine/pool.h"

#include <math.h>
#include <string.h>

#define DN_CHUNK 64

void cpu_copy_rows(be *b, float *dst, size_t dst_stride, const float *src, size_t src_stride, int rows, int n)
{
    (void)b;
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride, (size_t)n * 4);
}

/* elementwise ops in blocks of EW_BLOCK over the pool */
#define EW_BLOCK 4096

typedef struct ew_job {
    float *x;
    const float *g, *z;
    const float *w;
    size_t n;        /* sigmoid_mul: elements; rmsnorm_gated: rows */
    int rn;          /* rmsnorm_gated: row length */
    float eps;
    const float *xin;
} ew_job;

static void sigmoid_block(void *arg, int i, int ith)
{
    (void)ith;
    ew_job *j = arg;
    size_t a = (size_t)i * EW_BLOCK, e = a + EW_BLOCK < j->n ? a + EW_BLOCK : j->n;
    for (size_t k = a; k < e; k++) j->x[k] = j->x[k] / (1.0f + expf(-j->g[k]));
}

void cpu_sigmoid_mul(be *b, float *x, const float *g, size_t n)
{
    ew_job j = { .x = x, .g = g, .n = n };
    pool_run(be_cpu_pool(b), sigmoid_block, &j, (int)((n + EW_BLOCK - 1) / EW_BLOCK));
}

static void rmsg_block(void *arg, int i, int ith)
{
    (void)ith;
    ew_job *j = arg;
    int n = j->rn;
    size_t per = EW_BLOCK / (size_t)n ? EW_BLOCK / (size_t)n : 1;
    size_t r0 = (size_t)i * per, r1 = r0 + per < j->n ? r0 + per : j->n;
    for (size_t r = r0; r < r1; r++) {
        const float *xr = j->xin + r * n, *zr = j->z + r * n;
        float *o = j->x + r * n;
        double ss = 0;
        for (int k = 0; k < n; k++) ss += (double)xr[k] * xr[k];
        float scale = (float)(1.0 / sqrt(ss / n + j->eps));
        for (int k = 0; k < n; k++) o[k] = xr[k] * scale * j->w[k] * (zr[k] / (1.0f + expf(-zr[k])));
    }
}

void cpu_rmsnorm_gated(be *b, const float *x, const float *z, const wt *wv, int rows, int n, float eps, float *out)
{
    ew_job j = { .x = out, .xin = x, .z = z, .w = wv->data, .n = (size_t)rows, .rn = n, .eps = eps };
    size_t per = EW_BLOCK / (size_t)n ? EW_BLOCK / (size_t)n : 1;
    pool_run(be_cpu_pool(b), rmsg_block, &j, (int)(((size_t)rows + per - 1) / per));
}

/* ---- causal conv ---------------------------------------------------------- */

#define CONV_BLOCK 64   /* channels per job */

typedef struct conv_job {
    const float *x;
    const float *w;
    float *state;
    const be_batch *bt;
    int C, K;
    const be_save *sv;
    int n_sv;
    float *out;
} conv_job;

static void conv_block(void *arg, int i, int ith)
{
    (void)ith;
    conv_job *j = arg;
    int C = j->C, K = j->K, c0 = i * CONV_BLOCK, c1 = c0 + CONV_BLOCK;
    if (c1 > C) c1 = C;
    size_t slot_sz = (size_t)(K - 1) * C;
    for (int t = 0; t < j->bt->T; t++) {
        float *st = j->state + (size_t)j->bt->slot[t] * slot_sz;
        if (j->bt->pos[t] == 0)
            for (int p = 0; p < K - 1; p++) memset(st + (size_t)p * C + c0, 0, (size_t)(c1 - c0) * 4);
        const float *xt = j->x + (size_t)t * C;
        float *ot = j->out + (size_t)t * C;
        for (int c = c0; c < c1; c++) {
            const float *w = j->w + (size_t)c * K;
            float xc = xt[c], y = w[K - 1] * xc;
            for (int p = 0; p < K - 1; p++) y += w[p] * st[(size_t)p * C + c];
            for (int p = 0; p + 1 < K - 1; p++) st[(size_t)p * C + c] = st[(size_t)(p + 1) * C + c];
            if (K > 1) st[(size_t)(K - 2) * C + c] = xc;
            ot[c] = y / (1.0f + expf(-y));
        }
        for (int s = 0; s < j->n_sv; s++)
            if (j->sv[s].slot == j->bt->slot[t] && j->sv[s].pos == j->bt->pos[t] + 1)
                for (int p = 0; p < K - 1; p++)
                    memcpy(j->sv[s].dst + (size_t)p * C + c0, st + (size_t)p * C + c0, (size_t)(c1 - c0) * 4);
    }
}

void cpu_conv1d_silu(be *b, const float *x, const wt *w, float *state, const be_batch *bt, int C, int K,
                     const be_save *sv, int n_sv, float *out)
{
    conv_job j = { x, w->data, state, bt, C, K, sv, n_sv, out };
    pool_run(be_cpu_pool(b), conv_block, &j, (C + CONV_BLOCK - 1) / CONV_BLOCK);
}

/* ---- gated delta rule ------------------------------------------------------ */

typedef struct dn_job {
    const float *qkv;
    size_t stride;
    const float *a, *bb, *A, *dt;
    float *state;
    const be_batch *bt;
    int nk, nv, dk, dv;
    float eps;
    const be_save *sv;
    int n_sv;
    float *out;
    float *scratch;        /* per thread: dn_scratch_floats(dk, dv) */
    size_t scratch_n;
} dn_job;

static size_t dn_scratch_floats(int dk, int dv)
{
    return (size_t)DN_CHUNK * (2 * (size_t)dk + 3 * (size_t)dv + 4) + (size_t)dk + (size_t)dv;
}

static float softplus(float x) { return x > 20 ? x : log1pf(expf(x)); }

/* Copies q or k of token t, head kh, L2-normalized and scaled, to dst. */
static void dn_load_norm(const float *src, int d, float eps, float scale, float *dst)
{
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)src[i] * src[i];
    float s = (float)(scale / sqrt(ss + eps));
    for (int i = 0; i < d; i++) dst[i] = src[i] * s;
}

/* Vector helpers: GCC vector extensions (8 floats; AVX where the CPU has it
 * through target clones, two SSE halves otherwise), scalar tails. */
typedef float vf8 __attribute__((vector_size(32), aligned(4), may_alias));
/* (not under ThreadSanitizer: the clones' ifunc resolvers run before its
 * runtime is up, and crash) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DN_CLONES
#endif

/* y += a * x */
DN_CLONES static void v_axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    vf8 va = { a, a, a, a, a, a, a, a };
    for (; i + 8 <= n; i += 8) *(vf8 *)(y + i) += va * *(const vf8 *)(x + i);
    for (; i < n; i++) y[i] += a * x[i];
}

DN_CLONES static float v_dot(const float *restrict x, const float *restrict y, int n)
{
    int i = 0;
    vf8 acc = { 0 };
    for (; i + 8 <= n; i += 8) acc += *(const vf8 *)(x + i) * *(const vf8 *)(y + i);
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

/* y = x^T M for M [rows][n] (y [n] = sum_r x[r] M[r]) */
DN_CLONES static void v_vecmat(float *restrict y, const float *restrict x, const float *restrict M, int rows, int n)
{
    for (int c = 0; c < n; c++) y[c] = 0;
    for (int r = 0; r < rows; r++) {
        const float *Mr = M + (size_t)r * n;
        float a = x[r];
        int i = 0;
        vf8 va = { a, a, a, a, a, a, a, a };
        for (; i + 8 <= n; i += 8) *(vf8 *)(y + i) += va * *(const vf8 *)(Mr + i);
        for (; i < n; i++) y[i] += a * Mr[i];
    }
}

/* One chunk of L tokens (batch indices t0.., consecutive, one sequence) for
 * value head h, state S [dk][dv]. */
static void dn_chunk(const dn_job *j, int h, int t0, int L, float *S, float *sc)
{
    int dk = j->dk, dv = j->dv, kh = h % j->nk;
    float *Q = sc, *K = Q + (size_t)DN_CHUNK * dk, *V = K + (size_t)DN_CHUNK * dk;
    float *W = V + (size_t)DN_CHUNK * dv, *U = W + (size_t)DN_CHUNK * dv;
    float *gc = U + (size_t)DN_CHUNK * dv, *beta = gc + DN_CHUNK;
    float *tmp = beta + DN_CHUNK;   /* [dv] */
    float qscale = 1.0f / sqrtf((float)dk);
    float cum = 0;
    for (int i = 0; i < L; i++) {
        int t = t0 + i;
        const float *row = j->qkv + (size_t)t * j->stride;
        dn_load_norm(row + (size_t)kh * dk, dk, j->eps, qscale, Q + (size_t)i * dk);
        dn_load_norm(row + (size_t)(j->nk + kh) * dk, dk, j->eps, 1.0f, K + (size_t)i * dk);
        memcpy(V + (size_t)i * dv, row + (size_t)2 * j->nk * dk + (size_t)h * dv, (size_t)dv * 4);
        float g = j->A[h] * softplus(j->a[(size_t)t * j->nv + h] + j->dt[h]);
        cum += g;
        gc[i] = cum;
        beta[i] = 1.0f / (1.0f + expf(-j->bb[(size_t)t * j->nv + h]));
    }
    if (L == 1) {   /* the recurrent step: S = e S; u = (v - S^T k) beta; S += k u^T; o = S^T q */
        float e = expf(gc[0]), *o = j->out + ((size_t)t0 * j->nv + h) * dv;
        v_vecmat(tmp, K, S, dk, dv);
        for (int c = 0; c < dv; c++) tmp[c] = (V[c] - e * tmp[c]) * beta[0];
        for (int d = 0; d < dk; d++) {
            float *Sd = S + (size_t)d * dv;
            for (int c = 0; c < dv; c++) Sd[c] *= e;
            v_axpy(Sd, K[d], tmp, dv);
        }
        v_vecmat(o, Q, S, dk, dv);
        return;
    }
    /* W = K S0;  U[i] = beta_i (v_i - exp(gc_i) W[i]) - sum_{j<i} beta_i e^{gc_i-gc_j} (k_i.k_j) U[j] */
    for (int i = 0; i < L; i++) v_vecmat(W + (size_t)i * dv, K + (size_t)i * dk, S, dk, dv);
    for (int i = 0; i < L; i++) {
        float *u = U + (size_t)i * dv;
        const float *w = W + (size_t)i * dv, *v = V + (size_t)i * dv, *ki = K + (size_t)i * dk;
        float gi = expf(gc[i]);
        for (int c = 0; c < dv; c++) u[c] = v[c] - gi * w[c];
        for (int jj = 0; jj < i; jj++)
            v_axpy(u, -v_dot(ki, K + (size_t)jj * dk, dk) * expf(gc[i] - gc[jj]), U + (size_t)jj * dv, dv);
        for (int c = 0; c < dv; c++) u[c] *= beta[i];
    }
    /* out[i] = exp(gc_i) S0^T q_i + sum_{j<=i} e^{gc_i-gc_j} (q_i.k_j) U[j] */
    for (int i = 0; i < L; i++) {
        float *o = j->out + ((size_t)(t0 + i) * j->nv + h) * dv;
        const float *q = Q + (size_t)i * dk;
        v_vecmat(tmp, q, S, dk, dv);
        float gi = expf(gc[i]);
        for (int c = 0; c < dv; c++) o[c] = gi * tmp[c];
        for (int jj = 0; jj <= i; jj++)
            v_axpy(o, v_dot(q, K + (size_t)jj * dk, dk) * expf(gc[i] - gc[jj]), U + (size_t)jj * dv, dv);
    }
    /* S = exp(gc_L) S0 + sum_j e^{gc_L-gc_j} k_j U[j]^T */
    float gl = expf(gc[L - 1]);
    for (int i = 0; i < L; i++) {   /* fold the decay into K, transposed into Q (free now): [dk][L] */
        float f = expf(gc[L - 1] - gc[i]);
        const float *k = K + (size_t)i * dk;
        for (int d = 0; d < dk; d++) Q[(size_t)d * L + i] = k[d] * f;
    }
    for (int d = 0; d < dk; d++) {
        float *Sd = S + (size_t)d * dv;
        for (int c = 0; c < dv; c++) Sd[c] *= gl;
        for (int i = 0; i < L; i++) v_axpy(Sd, Q[(size_t)d * L + i], U + (size_t)i * dv, dv);
    }
}

static void dn_head(void *arg, int h, int ith)
{
    dn_job *j = arg;
    const be_batch *bt = j->bt;
    float *sc = j->scratch + (size_t)ith * j->scratch_n;
    size_t head_sz = (size_t)j->dk * j->dv;
    for (int t = 0; t < bt->T;) {
        int slot = bt->slot[t], n = 1;
        while (t + n < bt->T && bt->slot[t + n] == slot && bt->pos[t + n] == bt->pos[t + n - 1] + 1) n++;
        float *S = j->state + ((size_t)slot * j->nv + h) * head_sz;
        if (bt->pos[t] == 0) memset(S, 0, head_sz * 4);
        /* a save point inside the run cuts the chunks there */
        int cut = n;
        const be_save *save = NULL;
        for (int s = 0; s < j->n_sv; s++) {
            int at = j->sv[s].pos - bt->pos[t];
            if (j->sv[s].slot == slot && at >= 1 && at <= n) { cut = at; save = &j->sv[s]; }
        }
        for (int c = 0; c < n;) {
            int end = c < cut ? cut : n, len = end - c < DN_CHUNK ? end - c : DN_CHUNK;
            dn_chunk(j, h, t + c, len, S, sc);
            c += len;
            if (save && c == cut) memcpy(save->dst + (size_t)h * head_sz, S, head_sz * 4);
        }
        t += n;
    }
}

void cpu_deltanet(be *b, const float *qkv, size_t stride, const float *a, const float *bb, const wt *A,
                  const wt *dt_bias, float *state, const be_batch *bt, int nk, int nv, int dk, int dv, float eps,
                  const be_save *sv, int n_sv, float *out)
{
    pool *p = be_cpu_pool(b);
    size_t per = dn_scratch_floats(dk, dv);
    float *scratch = be_cpu_scratch(b, per * (size_t)pool_size(p) * sizeof(float));
    if (!scratch) return;   /* be_cpu_scratch aborts on allocation failure */
    dn_job j = { qkv, stride, a, bb, A->data, dt_bias->data, state, bt, nk, nv, dk, dv, eps, sv, n_sv, out, scratch, per };
    pool_run(p, dn_head, &j, nv);
}
