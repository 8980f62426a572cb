/* t_cuda — every op of the CUDA backend against the CPU reference on random
 * data: matmul for every weight type (the GEMV path and the cuBLAS path) against
 * the dequantized weights in double, embedding rows bit-exact, and rmsnorm,
 * add, silu_mul, rope, kv_store + paged attention (f16 and f32 caches, GQA,
 * several sequences, prefill and split decode) against the CPU backend's ops,
 * and the linear-attention ops (copy_rows, sigmoid_mul, rmsnorm_gated, the
 * causal conv and the delta rule with per-sequence state and save points),
 * and the fused ops bit for bit against the plain ones (rope_kv; GEMV input
 * quantized by the op that produced it), and the mixture-of-experts op.
 * Builds without CUDA print "0 passed, 0 failed" (nothing to test). */
#include "engine/backend/backend.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef ANE_CUDA
#include <cuda_runtime_api.h>
#include "shaders/kernels.h"
#endif

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 11);
}
static float frand(void) { return (float)rnd() / 2097152.0f / 1024.0f * 2.0f - 1.0f; }  /* [-1, 1) */

static double rel_err(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        double d = a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_err_f(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void put_f16(uint8_t *p, float v) { uint16_t h = qt_fp32_to_fp16(v); memcpy(p, &h, 2); }

/* Random weight bytes of a valid layout: random quants, small positive scales. */
static void *make_weight(uint32_t type, int n_in, int n_out, size_t *row_bytes)
{
    size_t rb = qt_row_size(type, n_in);
    uint8_t *w = malloc(rb * (size_t)n_out);
    *row_bytes = rb;
    if (type == QT_F32 || type == QT_F16 || type == QT_BF16) {
        for (size_t i = 0; i < (size_t)n_in * n_out; i++) {
            float v = frand() * 0.5f;
            if (type == QT_F32) memcpy(w + 4 * i, &v, 4);
            else {
                uint16_t h = type == QT_F16 ? qt_fp32_to_fp16(v) : qt_fp32_to_bf16(v);
                memcpy(w + 2 * i, &h, 2);
            }
        }
        return w;
    }
    for (size_t i = 0; i < rb * (size_t)n_out; i++) w[i] = (uint8_t)rnd();
    const qt_traits *tr = qt_get(type);
    size_t nb = rb * (size_t)n_out / tr->type_size;
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * tr->type_size;
        float d = 0.002f + 0.01f * (float)(rnd() % 1000) / 1000.0f, m = 0.001f * (float)(rnd() % 1000) / 1000.0f;
        switch (type) {
        case QT_Q4_0: case QT_Q5_0: case QT_Q8_0: put_f16(p, d); break;
        case QT_Q4_1: case QT_Q5_1: put_f16(p, d); put_f16(p + 2, m); break;
        case QT_Q2_K: put_f16(p + 80, d); put_f16(p + 82, m); break;
        case QT_Q3_K: put_f16(p + 108, d * 0.1f); break;
        case QT_Q4_K: case QT_Q5_K: put_f16(p, d * 0.1f); put_f16(p + 2, m * 0.1f); break;
        case QT_Q6_K: put_f16(p + 208, d * 0.05f); break;
        case QT_IQ4_NL: put_f16(p, d * 0.1f); break;
        case QT_MXFP4: p[0] = (uint8_t)(118 + rnd() % 6); break;   /* E8M0: 2^-10 .. 2^-5 */
        case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ2_S: case QT_IQ3_XXS: case QT_IQ3_S: case QT_IQ1_S:
        case QT_IQ4_XS: put_f16(p, d * 0.1f); break;
        default: break;
        }
    }
    return w;
}

static const uint32_t TYPES[] = { QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0,
                                  QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4,
                                  QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_IQ1_S };
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static be *gpu, *gpu32, *cpu, *cpu32;
/* weight bytes stay alive to the end: backends key uploads by host pointer */
static void *keep[1024];
static int n_keep;
static void *kept(void *p) { if (n_keep < 1024) keep[n_keep++] = p; return p; }
static pool *pl;

/* 1 in the second round of the tests: every backend on the portable path
 * (no Hopper feature), as on an 8.x device */
static int portable;

/* A CUDA backend with the paths f forces (NULL: the defaults), in this
 * round's path */
static int gpu_open(be **b, int kv_type, const be_cuda_force *f, char *err, size_t errlen)
{
    int bad = be_open(b, "cuda", pl, kv_type, err, errlen);
#ifdef ANE_CUDA
    be_cuda_force ff = { 0 };
    if (f) ff = *f;
    ff.portable = portable;
    if (!bad) be_cuda_force_set(*b, &ff);
#else
    (void)f;
#endif
    return bad;
}

/* perm = 0 .. n-1 shuffled: the scrambled page tables of the attention tests */
static void page_perm(int32_t *perm, int n)
{
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) { int j = (int)(rnd() % (uint32_t)(i + 1)); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
}

static float *dev_from(be *b, const float *h, size_t n)
{
    float *d = b->ops->alloc(b, n * 4);
    b->ops->to_dev(b, d, h, n * 4);
    return d;
}

static void test_matmul(void)
{
    const int Ts[] = { 1, 2, 3, 5, 8, 9, 17, 32, 33, 64, 100 };
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        int fl = type == QT_F32 || type == QT_F16 || type == QT_BF16;
        /* (18944: a 7b down projection's rows, several load rounds a lane) */
        int shapes[6][2] = { { 512, 77 }, { fl ? 72 : 256, 40 }, { 1536, 21 }, { 4352, 13 }, { 3584, 9 }, { 18944, 5 } };
        for (int si = 0; si < 6; si++) {
            int n_in = shapes[si][0], n_out = shapes[si][1];
            size_t rb;
            void *wd = kept(make_weight(type, n_in, n_out, &rb));
            float *wf = malloc((size_t)n_in * n_out * 4);
            for (int r = 0; r < n_out; r++) qt_dequant_row(type, (char *)wd + (size_t)r * rb, wf + (size_t)r * n_in, n_in);
            float *bias = malloc((size_t)n_out * 4);
            for (int r = 0; r < n_out; r++) bias[r] = frand();
            wt w = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wd };
            wt bw = { .type = QT_F32, .n_in = n_out, .n_out = 1, .row_bytes = (size_t)n_out * 4, .data = bias };
            CHECK(gpu->ops->weight_prepare(gpu, &w) == 0);
            CHECK(gpu->ops->weight_prepare(gpu, &bw) == 0);
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                int T = Ts[k];
                float *x = malloc((size_t)T * n_in * 4), *y = malloc((size_t)T * n_out * 4);
                double *ref = malloc((size_t)T * n_out * sizeof *ref);
                for (int i = 0; i < T * n_in; i++) x[i] = frand();
                int use_bias = (k & 1) == 0;
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < n_out; r++) {
                        double s = use_bias ? bias[r] : 0;
                        for (int i = 0; i < n_in; i++) s += (double)wf[(size_t)r * n_in + i] * x[(size_t)t * n_in + i];
                        ref[(size_t)t * n_out + r] = s;
                    }
                float *dx = dev_from(gpu, x, (size_t)T * n_in), *dy = gpu->ops->alloc(gpu, (size_t)T * n_out * 4);
                for (int i = 0; i < T * n_out; i++) y[i] = NAN;
                gpu->ops->to_dev(gpu, dy, y, (size_t)T * n_out * 4);   /* poison */
                gpu->ops->matmul(gpu, &w, use_bias ? &bw : NULL, dx, T, dy);
                gpu->ops->to_host(gpu, y, dy, (size_t)T * n_out * 4);
                gpu->ops->sync(gpu);
                double e = rel_err(y, ref, (size_t)T * n_out);
                /* int8 activations (q4_K, q8_0, q6_K of whole super-block pairs GEMV; q4_K
                 * 17..32 rows: f16 tensor cores on the quantized weights); else f32 GEMV,
                 * f16 tensor cores from 9 */
                int i8 = type == QT_Q4_K || type == QT_Q8_0 || (type == QT_Q6_K && n_in % 512 == 0) ||
                         type == QT_IQ4_NL || type == QT_IQ4_XS || type == QT_MXFP4;
                double tol = i8 ? 1e-2 : T > 8 ? 2e-3 : 2e-5;
                CHECKF(e <= tol, "matmul %s %dx%d T=%d: rel err %.3g (tol %g)", qt_name(type), n_out, n_in, T, e, tol);
                gpu->ops->free(gpu, dx);
                gpu->ops->free(gpu, dy);
                free(x); free(y); free(ref);
            }
            free(wf);
            kept(bias);
        }
    }
}

/* Decode-sized batches (17..32 rows) of q4_K and q6_K (q6_K on Hopper only; in
 * its own layout, made at the first such batch): the batched f16
 * tensor-core kernel against the dequantized weights in double (q6_K's f16
 * values as close as cuBLAS's f16 copy), on shapes that reach
 * each of its cases: rows split over several blocks (short matrices, down
 * to one chunk per split) and not (many rows), row and token tiles cut
 * short; the same bits on a second run (the
 * split counters are left at zero); and the f16 input written by rmsnorm
 * gives the same bits as the matmul's own conversion. */
static void test_mmqb(void)
{
    const struct { uint32_t type; int n_in, n_out, T; } cs[] = {
        { QT_Q4_K, 768, 200, 17 }, { QT_Q4_K, 768, 200, 32 }, { QT_Q4_K, 3584, 260, 32 }, { QT_Q4_K, 4352, 130, 25 },
        { QT_Q4_K, 256, 300, 31 }, { QT_Q4_K, 1024, 55000, 24 }, { QT_Q4_K, 512, 52000, 19 },
        { QT_Q6_K, 768, 200, 17 }, { QT_Q6_K, 3584, 260, 32 }, { QT_Q6_K, 4352, 130, 25 },
        { QT_Q6_K, 256, 300, 31 }, { QT_Q6_K, 1024, 30000, 24 }, { QT_Q6_K, 3584, 9000, 32 },
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        uint32_t type = cs[k].type;
        int n_in = cs[k].n_in, n_out = cs[k].n_out, T = cs[k].T;
        size_t rb, ny = (size_t)T * n_out;
        void *wd = kept(make_weight(type, n_in, n_out, &rb));
        float *wf = malloc((size_t)n_in * 4), *bias = kept(malloc((size_t)n_out * 4));
        float *x = malloc((size_t)T * n_in * 4), *y = malloc(ny * 4), *y2 = malloc(ny * 4);
        double *ref = calloc(ny, sizeof *ref);
        for (int r = 0; r < n_out; r++) bias[r] = frand();
        for (int i = 0; i < T * n_in; i++) x[i] = frand();
        for (int r = 0; r < n_out; r++) {
            qt_dequant_row(type, (char *)wd + (size_t)r * rb, wf, n_in);
            for (int t = 0; t < T; t++) {
                double a = bias[r];
                for (int i = 0; i < n_in; i++) a += (double)wf[i] * x[(size_t)t * n_in + i];
                ref[(size_t)t * n_out + r] = a;
            }
        }
        wt w = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wd };
        wt bw = { .type = QT_F32, .n_in = n_out, .n_out = 1, .row_bytes = (size_t)n_out * 4, .data = bias };
        CHECK(gpu->ops->weight_prepare(gpu, &w) == 0);
        CHECK(gpu->ops->weight_prepare(gpu, &bw) == 0);
        float *dx = dev_from(gpu, x, (size_t)T * n_in), *dy = gpu->ops->alloc(gpu, ny * 4);
        for (size_t i = 0; i < ny; i++) y[i] = NAN;
        gpu->ops->to_dev(gpu, dy, y, ny * 4);   /* poison */
        gpu->ops->matmul(gpu, &w, &bw, dx, T, dy);
        gpu->ops->to_host(gpu, y, dy, ny * 4);
        gpu->ops->sync(gpu);
        double e = rel_err(y, ref, ny), tol = type == QT_Q6_K ? 2e-3 : 1e-2;
        CHECKF(e <= tol, "batched %s %dx%d T=%d: rel err %.3g", qt_name(type), n_out, n_in, T, e);
        /* the same again (counters were left at zero; nothing carried over) */
        gpu->ops->matmul(gpu, &w, &bw, dx, T, dy);
        gpu->ops->to_host(gpu, y2, dy, ny * 4);
        gpu->ops->sync(gpu);
        CHECKF(!memcmp(y, y2, ny * 4), "batched %s %dx%d T=%d: a second run differs", qt_name(type), n_out,
               n_in, T);
        /* input from rmsnorm, which writes its f16 form for this matmul */
        float *ones = kept(malloc((size_t)n_in * 4)), *h = malloc((size_t)T * n_in * 4);
        for (int i = 0; i < n_in; i++) ones[i] = 1.0f + 0.01f * (float)(i % 7);
        wt nw = { .type = QT_F32, .n_in = n_in, .n_out = 1, .row_bytes = (size_t)n_in * 4, .data = ones };
        CHECK(gpu->ops->weight_prepare(gpu, &nw) == 0);
        float *dn = gpu->ops->alloc(gpu, (size_t)T * n_in * 4);
        gpu->ops->rmsnorm(gpu, dx, &nw, T, n_in, 1e-6f, dn);
        gpu->ops->matmul(gpu, &w, &bw, dn, T, dy);
        gpu->ops->to_host(gpu, y, dy, ny * 4);
        gpu->ops->to_host(gpu, h, dn, (size_t)T * n_in * 4);
        float *dn2 = dev_from(gpu, h, (size_t)T * n_in);   /* the same values, no f16 form at hand */
        gpu->ops->matmul(gpu, &w, &bw, dn2, T, dy);
        gpu->ops->to_host(gpu, y2, dy, ny * 4);
        gpu->ops->sync(gpu);
        CHECKF(!memcmp(y, y2, ny * 4), "batched %s %dx%d T=%d: rmsnorm's f16 output gives other bits",
               qt_name(type), n_out, n_in, T);
        gpu->ops->free(gpu, dn); gpu->ops->free(gpu, dn2); gpu->ops->free(gpu, dx); gpu->ops->free(gpu, dy);
        free(wf); free(x); free(y); free(y2); free(ref); free(h);
    }
}

/* matmul_n equals the single matmuls; add_rmsnorm equals add + rmsnorm */
static void test_fused(void)
{
    CHECK(gpu->ops->matmul_n != NULL && gpu->ops->add_rmsnorm != NULL);
    if (!gpu->ops->matmul_n || !gpu->ops->add_rmsnorm) return;
    const uint32_t mix[3][3] = { { QT_Q8_0, QT_Q8_0, QT_Q8_0 }, { QT_Q4_K, QT_Q4_K, QT_Q6_K },
                                 { QT_Q4_K, QT_Q4_K, QT_Q4_K } };
    const int Ts[] = { 1, 3, 16, 40 };
    int n_in = 1024, n_out[3] = { 96, 32, 32 };
    for (int mi = 0; mi < 3; mi++) {
        wt w[3], bw[3];
        for (int i = 0; i < 3; i++) {
            size_t rb;
            void *wd = kept(make_weight(mix[mi][i], n_in, n_out[i], &rb));
            float *bias = kept(malloc((size_t)n_out[i] * 4));
            for (int r = 0; r < n_out[i]; r++) bias[r] = frand();
            w[i] = (wt){ .type = mix[mi][i], .n_in = n_in, .n_out = n_out[i], .row_bytes = rb, .data = wd };
            bw[i] = (wt){ .type = QT_F32, .n_in = n_out[i], .n_out = 1, .row_bytes = (size_t)n_out[i] * 4, .data = bias };
            CHECK(gpu->ops->weight_prepare(gpu, &w[i]) == 0);
            CHECK(gpu->ops->weight_prepare(gpu, &bw[i]) == 0);
        }
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k];
            float *x = malloc((size_t)T * n_in * 4);
            for (int i = 0; i < T * n_in; i++) x[i] = frand();
            float *dx = dev_from(gpu, x, (size_t)T * n_in);
            float *o1[3], *o2[3];
            const wt *ws[3] = { &w[0], &w[1], &w[2] }, *bs[3] = { &bw[0], NULL, &bw[2] };
            for (int i = 0; i < 3; i++) {
                o1[i] = gpu->ops->alloc(gpu, (size_t)T * n_out[i] * 4);
                o2[i] = gpu->ops->alloc(gpu, (size_t)T * n_out[i] * 4);
                gpu->ops->matmul(gpu, ws[i], bs[i], dx, T, o1[i]);
            }
            gpu->ops->matmul_n(gpu, 3, ws, bs, dx, T, o2);
            for (int i = 0; i < 3; i++) {
                size_t n = (size_t)T * n_out[i];
                float *a = malloc(n * 4), *g = malloc(n * 4);
                gpu->ops->to_host(gpu, a, o1[i], n * 4);
                gpu->ops->to_host(gpu, g, o2[i], n * 4);
                CHECKF(memcmp(a, g, n * 4) == 0, "matmul_n set %d T=%d matrix %d differs", mi, T, i);
                free(a); free(g);
                gpu->ops->free(gpu, o1[i]); gpu->ops->free(gpu, o2[i]);
            }
            gpu->ops->free(gpu, dx);
            free(x);
        }
    }
    int rows = 5, n = 3584;
    size_t N = (size_t)rows * n;
    float *x = malloc(N * 4), *y = malloc(N * 4), *w = kept(malloc((size_t)n * 4)), *a = malloc(N * 4), *g = malloc(N * 4);
    for (size_t i = 0; i < N; i++) { x[i] = frand() * 3; y[i] = frand(); }
    for (int i = 0; i < n; i++) w[i] = frand();
    wt wv = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = w };
    CHECK(gpu->ops->weight_prepare(gpu, &wv) == 0);
    float *dx = dev_from(gpu, x, N), *dy = dev_from(gpu, y, N);
    cpu->ops->add(cpu, x, y, N);
    cpu->ops->rmsnorm(cpu, x, &wv, rows, n, 1e-6f, a);
    gpu->ops->add_rmsnorm(gpu, dx, dy, &wv, rows, n, 1e-6f, dy);
    gpu->ops->to_host(gpu, g, dy, N * 4);
    double e = rel_err_f(g, a, N);
    CHECKF(e < 1e-5, "add_rmsnorm out rel err %.3g", e);
    gpu->ops->to_host(gpu, g, dx, N * 4);
    CHECK(memcmp(g, x, N * 4) == 0);
    gpu->ops->sync(gpu);
    gpu->ops->free(gpu, dx); gpu->ops->free(gpu, dy);
    free(x); free(y); free(a); free(g);
}

static void test_embed(void)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        int n_in = 512, n_out = 50, T = 7;
        size_t rb;
        void *wd = kept(make_weight(type, n_in, n_out, &rb));
        wt w = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wd };
        CHECK(gpu->ops->weight_prepare(gpu, &w) == 0);
        int32_t ids[7];
        for (int t = 0; t < T; t++) ids[t] = (int32_t)(rnd() % (uint32_t)n_out);
        float *ref = malloc((size_t)T * n_in * 4), *y = malloc((size_t)T * n_in * 4);
        for (int t = 0; t < T; t++) wt_row_f32(&w, ids[t], ref + (size_t)t * n_in);
        float *dy = gpu->ops->alloc(gpu, (size_t)T * n_in * 4);
        gpu->ops->embed(gpu, &w, ids, T, dy);
        gpu->ops->to_host(gpu, y, dy, (size_t)T * n_in * 4);
        gpu->ops->sync(gpu);
        CHECKF(memcmp(y, ref, (size_t)T * n_in * 4) == 0, "embed %s differs", qt_name(type));
        gpu->ops->free(gpu, dy);
        free(ref); free(y);
    }
}

static void test_elementwise(void)
{
    int rows = 9, n = 896;
    size_t N = (size_t)rows * n;
    float *x = malloc(N * 4), *y = malloc(N * 4), *w = malloc((size_t)n * 4), *a = malloc(N * 4), *g = malloc(N * 4);
    for (size_t i = 0; i < N; i++) { x[i] = frand() * 3; y[i] = frand(); }
    for (int i = 0; i < n; i++) w[i] = frand();
    wt wv = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = w };
    CHECK(gpu->ops->weight_prepare(gpu, &wv) == 0);
    float *dx = dev_from(gpu, x, N), *dy = dev_from(gpu, y, N), *dout = gpu->ops->alloc(gpu, N * 4);

    cpu->ops->rmsnorm(cpu, x, &wv, rows, n, 1e-6f, a);
    gpu->ops->rmsnorm(gpu, dx, &wv, rows, n, 1e-6f, dout);
    gpu->ops->to_host(gpu, g, dout, N * 4);
    double e = rel_err_f(g, a, N);
    CHECKF(e < 1e-5, "rmsnorm rel err %.3g", e);

    cpu->ops->silu_mul(cpu, x, y, N, a);
    gpu->ops->silu_mul(gpu, dx, dy, N, dout);
    gpu->ops->to_host(gpu, g, dout, N * 4);
    e = rel_err_f(g, a, N);
    CHECKF(e < 1e-6, "silu_mul rel err %.3g", e);

    memcpy(a, x, N * 4);
    cpu->ops->add(cpu, a, y, N);
    gpu->ops->add(gpu, dx, dy, N);
    gpu->ops->to_host(gpu, g, dx, N * 4);
    CHECK(memcmp(a, g, N * 4) == 0);
    gpu->ops->sync(gpu);
    gpu->ops->free(gpu, dx); gpu->ops->free(gpu, dy); gpu->ops->free(gpu, dout);
    free(x); free(y); kept(w); free(a); free(g);
}

/* rmsnorm and add_rmsnorm (out = y, in place) at row sizes one block takes
 * and sizes split over a cluster of blocks (1 and 2 values a thread), and
 * one that splits into no whole 32-value blocks: against the CPU, the
 * residual x + y bit for bit */
static void test_norms(void)
{
    const int ns[] = { 896, 1000, 3584, 4096, 8192 };
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        int rows = 5, n = ns[c];
        size_t N = (size_t)rows * n;
        float *x = malloc(N * 4), *y = malloc(N * 4), *w = malloc((size_t)n * 4), *a = malloc(N * 4), *g = malloc(N * 4);
        float *ax = malloc(N * 4), *gx = malloc(N * 4);
        for (size_t i = 0; i < N; i++) { x[i] = frand() * 3; y[i] = frand(); }
        for (int i = 0; i < n; i++) w[i] = frand();
        wt wv = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = kept(w) };
        CHECK(gpu->ops->weight_prepare(gpu, &wv) == 0);
        float *dx = dev_from(gpu, x, N), *dy = dev_from(gpu, y, N), *dout = gpu->ops->alloc(gpu, N * 4);
        cpu->ops->rmsnorm(cpu, x, &wv, rows, n, 1e-6f, a);
        gpu->ops->rmsnorm(gpu, dx, &wv, rows, n, 1e-6f, dout);
        gpu->ops->to_host(gpu, g, dout, N * 4);
        gpu->ops->sync(gpu);
        double e = rel_err_f(g, a, N);
        CHECKF(e < 1e-5, "rmsnorm n=%d rel err %.3g", n, e);
        memcpy(ax, x, N * 4);
        cpu->ops->add(cpu, ax, y, N);
        cpu->ops->rmsnorm(cpu, ax, &wv, rows, n, 1e-6f, a);
        gpu->ops->add_rmsnorm(gpu, dx, dy, &wv, rows, n, 1e-6f, dy);
        gpu->ops->to_host(gpu, g, dy, N * 4);
        gpu->ops->to_host(gpu, gx, dx, N * 4);
        gpu->ops->sync(gpu);
        e = rel_err_f(g, a, N);
        CHECKF(e < 1e-5, "add_rmsnorm n=%d rel err %.3g", n, e);
        CHECKF(!memcmp(gx, ax, N * 4), "add_rmsnorm n=%d: x + y differs", n);
        gpu->ops->free(gpu, dx); gpu->ops->free(gpu, dy); gpu->ops->free(gpu, dout);
        free(x); free(y); free(a); free(g); free(ax); free(gx);
    }
}

static void test_rope(void)
{
    int T = 6, nh = 4, hd = 64;
    size_t N = (size_t)T * nh * hd;
    int32_t pos[6] = { 0, 1, 17, 300, 4095, 9000 };
    int32_t pg[1] = { 0 };
    const int32_t *pages[6] = { pg, pg, pg, pg, pg, pg };
    int32_t slot[6] = { 0 };
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
    float fd[32];
    for (int i = 0; i < 32; i++) fd[i] = 1.0f + (float)i * 0.37f;
    wt fdw = { .type = QT_F32, .n_in = 32, .n_out = 1, .row_bytes = 128, .data = fd };
    CHECK(gpu->ops->weight_prepare(gpu, &fdw) == 0);
    float *x = malloc(N * 4), *a = malloc(N * 4), *g = malloc(N * 4);
    /* with_fd 2: a YaRN table (divisors and the cos/sin factor) */
    float yt[2][33];
    wt yw[2];
    for (int r = 0; r < 2; r++) {
        rope_yarn_table(1e6, 32 * (r + 1), 32, 4096, 32, 1, 0, 1 + 0.1 * log(32), yt[r]);
        yw[r] = (wt){ .type = QT_F32, .n_in = 16 * (r + 1) + 1, .n_out = 1, .row_bytes = (size_t)(16 * (r + 1) + 1) * 4,
                      .data = yt[r] };
        CHECK(gpu->ops->weight_prepare(gpu, &yw[r]) == 0);
    }
    for (int neox = 0; neox < 2; neox++)
        for (int with_fd = 0; with_fd < 3; with_fd++)
            for (int n_rot = 32; n_rot <= 64; n_rot += 32) {
                for (size_t i = 0; i < N; i++) x[i] = frand();
                memcpy(a, x, N * 4);
                float *dx = dev_from(gpu, x, N);
                const wt *f = with_fd == 2 ? &yw[n_rot / 32 - 1] : with_fd ? &fdw : NULL;
                cpu->ops->rope(cpu, a, &bt, nh, hd, n_rot, 1e6f, neox, f);
                gpu->ops->rope(gpu, dx, &bt, nh, hd, n_rot, 1e6f, neox, f);
                gpu->ops->to_host(gpu, g, dx, N * 4);
                double e = rel_err_f(g, a, N);
                CHECKF(e < 1e-6, "rope neox=%d fd=%d n_rot=%d rel err %.3g", neox, with_fd, n_rot, e);
                gpu->ops->free(gpu, dx);
            }
    free(x); free(a); free(g);
}

/* Random q [T][n_head*hd], k and v [T][kvd] (host, freed by the caller)
 * and their projections' biases, prepared on g */
static void qkv_rand(be *g, int T, int n_head, int kvd, int hd, float **q, float **k, float **v, wt bw[3])
{
    size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
    *q = malloc(nq * 4); *k = malloc(nk * 4); *v = malloc(nk * 4);
    for (size_t i = 0; i < nq; i++) (*q)[i] = frand() * 2;
    for (size_t i = 0; i < nk; i++) { (*k)[i] = frand() * 2; (*v)[i] = frand() * 2; }
    float *bq = kept(malloc((size_t)n_head * hd * 4)), *bk = kept(malloc((size_t)kvd * 4)), *bv = kept(malloc((size_t)kvd * 4));
    for (int i = 0; i < n_head * hd; i++) bq[i] = frand();
    for (int i = 0; i < kvd; i++) { bk[i] = frand(); bv[i] = frand(); }
    bw[0] = (wt){ .type = QT_F32, .n_in = n_head * hd, .n_out = 1, .row_bytes = (size_t)n_head * hd * 4, .data = bq };
    bw[1] = (wt){ .type = QT_F32, .n_in = kvd, .n_out = 1, .row_bytes = (size_t)kvd * 4, .data = bk };
    bw[2] = (wt){ .type = QT_F32, .n_in = kvd, .n_out = 1, .row_bytes = (size_t)kvd * 4, .data = bv };
    for (int i = 0; i < 3; i++) CHECK(g->ops->weight_prepare(g, &bw[i]) == 0);
}

/* rope_kv equals rope, rope, kv_store bit for bit (q, k and both caches);
 * with_bias: rope_kv given the q, k, v biases equals the plain ops on
 * q + bq, k + bk, v + bv */
static void rope_kv_case(be *g, int n_head, int n_head_kv, int hd, int n_rot, int neox, int with_fd, int with_bias)
{
    enum { NS = 3, MAXP = 32 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(g->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    int32_t pos[64], slot[64];
    const int32_t *pages[64];
    int T = 0;
    const int from[NS] = { 0, 200, 37 }, cnt[NS] = { 20, 1, 3 };
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < cnt[s]; i++) { pos[T] = from[s] + i; pages[T] = perm + s * MAXP; slot[T] = s; T++; }
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
    /* with_fd 2: a YaRN table, n_rot/2 divisors and the cos/sin factor */
    int n_fd = n_rot / 2 + (with_fd == 2);
    float *fd = kept(malloc((size_t)n_fd * 4));
    for (int i = 0; i < n_rot / 2; i++) fd[i] = 1.0f + (float)i * 0.37f;
    if (with_fd == 2) rope_yarn_table(1e6, n_rot, 32, 4096, 32, 1, 0, 1.35, fd);
    wt fdw = { .type = QT_F32, .n_in = n_fd, .n_out = 1, .row_bytes = (size_t)n_fd * 4, .data = fd };
    CHECK(g->ops->weight_prepare(g, &fdw) == 0);
    size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
    float *q, *k, *v;
    wt bw[3];
    qkv_rand(g, T, n_head, kvd, hd, &q, &k, &v, bw);
    const wt *bias[3] = { &bw[0], &bw[1], &bw[2] };
    float *dq[2], *dk[2], *dv[2];
    void *kc[2], *vc[2];
    for (int r = 0; r < 2; r++) {
        if (r == 0 && with_bias) {   /* the reference: the biases added on the host */
            float *q2 = malloc(nq * 4), *k2 = malloc(nk * 4), *v2 = malloc(nk * 4);
            const float *bq = bw[0].data, *bk = bw[1].data, *bv = bw[2].data;
            for (size_t i = 0; i < nq; i++) q2[i] = q[i] + bq[i % ((size_t)n_head * hd)];
            for (size_t i = 0; i < nk; i++) { k2[i] = k[i] + bk[i % (size_t)kvd]; v2[i] = v[i] + bv[i % (size_t)kvd]; }
            dq[r] = dev_from(g, q2, nq); dk[r] = dev_from(g, k2, nk); dv[r] = dev_from(g, v2, nk);
            free(q2); free(k2); free(v2);
        } else {
            dq[r] = dev_from(g, q, nq); dk[r] = dev_from(g, k, nk); dv[r] = dev_from(g, v, nk);
        }
        kc[r] = g->ops->alloc(g, cache); vc[r] = g->ops->alloc(g, cache);
    }
    const wt *f = with_fd ? &fdw : NULL;
    g->ops->rope(g, dq[0], &bt, n_head, hd, n_rot, 1e6f, neox, f);
    g->ops->rope(g, dk[0], &bt, n_head_kv, hd, n_rot, 1e6f, neox, f);
    g->ops->kv_store(g, kc[0], vc[0], &bt, kvd, dk[0], dv[0]);
    g->ops->rope_kv(g, dq[1], dk[1], dv[1], kc[1], vc[1], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox, f,
                    with_bias ? bias : NULL);
    size_t big = cache > nq * 4 ? cache : nq * 4;
    char *a = malloc(big), *b = malloc(big);
    const char *what[4] = { "q", "k", "k cache", "v cache" };
    const void *src[4][2] = { { dq[0], dq[1] }, { dk[0], dk[1] }, { kc[0], kc[1] }, { vc[0], vc[1] } };
    size_t len[4] = { nq * 4, nk * 4, cache, cache };
    for (int i = 0; i < 4; i++) {
        g->ops->to_host(g, a, src[i][0], len[i]);
        g->ops->to_host(g, b, src[i][1], len[i]);
        CHECKF(memcmp(a, b, len[i]) == 0, "rope_kv kv%s heads %d/%d hd %d n_rot %d neox %d fd %d bias %d: %s differs",
               g->kv_type == BE_KV_F16 ? "16" : "32", n_head, n_head_kv, hd, n_rot, neox, with_fd, with_bias, what[i]);
    }
    g->ops->sync(g);
    for (int r = 0; r < 2; r++) {
        g->ops->free(g, dq[r]); g->ops->free(g, dk[r]); g->ops->free(g, dv[r]);
        g->ops->free(g, kc[r]); g->ops->free(g, vc[r]);
    }
    free(q); free(k); free(v); free(a); free(b);
}

static void test_rope_kv(void)
{
    CHECK(gpu->ops->rope_kv != NULL);
    if (!gpu->ops->rope_kv) return;
    be *gs[2] = { gpu, gpu32 };
    for (int i = 0; i < 2; i++) {
        rope_kv_case(gs[i], 14, 2, 64, 64, 1, 0, 0);    /* qwen2.5-0.5b */
        rope_kv_case(gs[i], 8, 2, 128, 128, 0, 1, 0);
        rope_kv_case(gs[i], 4, 2, 64, 32, 1, 0, 0);     /* partial rotary */
        rope_kv_case(gs[i], 6, 3, 48, 32, 0, 1, 0);
        rope_kv_case(gs[i], 16, 8, 256, 64, 1, 0, 0);
        rope_kv_case(gs[i], 14, 2, 64, 64, 1, 0, 1);    /* qwen2.5: q, k, v biases */
        rope_kv_case(gs[i], 4, 2, 64, 32, 1, 1, 1);
        rope_kv_case(gs[i], 6, 3, 48, 32, 0, 0, 1);
        rope_kv_case(gs[i], 64, 8, 64, 64, 1, 2, 1);   /* gpt-oss-20b: YaRN, q, k, v biases */
        rope_kv_case(gs[i], 6, 3, 48, 32, 0, 2, 0);
    }
    /* and with fusion off (the plain ops, biases added first) */
    be *plain = NULL;
    char err[256];
    int bad = gpu_open(&plain, 1, &(be_cuda_force){ .unfused = 1 }, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (!bad) {
        rope_kv_case(plain, 14, 2, 64, 64, 1, 0, 1);
        rope_kv_case(plain, 4, 2, 64, 32, 1, 1, 1);
        plain->ops->close(plain);
    }
}

/* rope_attention on a decode batch inside a pass (the rope done by the
 * attention kernel, from the angles the pass's first rope_kv wrote)
 * equals rope_kv then attention bit for bit: the output and both caches.
 * q left as given shows that the fused kernel ran (rope_kv ropes q in
 * place). T tokens, one per sequence, at positions 3 + 37 t (1 to many
 * spans); enough of them for the attention's unrolled form too. */
static void rope_att_case(be *g, int T, int n_head, int n_head_kv, int hd, int n_rot, int neox, int with_bias)
{
    enum { MAXP = 64 };
    int kvd = n_head_kv * hd, n_pages = T * MAXP;
    size_t cache = be_kv_bytes(g->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t *perm = malloc((size_t)n_pages * 4), *pos = malloc((size_t)T * 4), *slot = malloc((size_t)T * 4);
    int32_t *ids = calloc((size_t)T, 4);
    const int32_t **pages = malloc((size_t)T * sizeof *pages);
    page_perm(perm, n_pages);
    for (int t = 0; t < T; t++) { pos[t] = 3 + 37 * t % 900; pages[t] = perm + t * MAXP; slot[t] = t; }
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot, .n_dec = T };
    size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
    float *q, *k, *v;
    wt bw[3];
    qkv_rand(g, T, n_head, kvd, hd, &q, &k, &v, bw);
    const wt *bias[3] = { &bw[0], &bw[1], &bw[2] }, *const *bs = with_bias ? bias : NULL;
    /* the earlier positions, the same in both caches */
    void *kc[3], *vc[3];
    for (int r = 0; r < 3; r++) { kc[r] = g->ops->alloc(g, cache); vc[r] = g->ops->alloc(g, cache); }
    for (int t = 0; t < T; t++) {
        int n = pos[t];
        int32_t *fp = malloc((size_t)n * 4), *fs = malloc((size_t)n * 4);
        const int32_t **fpg = malloc((size_t)n * sizeof *fpg);
        for (int i = 0; i < n; i++) { fp[i] = i; fpg[i] = pages[t]; fs[i] = t; }
        be_batch fb = { .T = n, .pos = fp, .pages = fpg, .slot = fs };
        float *fk = malloc((size_t)n * kvd * 4), *fv = malloc((size_t)n * kvd * 4);
        for (size_t i = 0; i < (size_t)n * kvd; i++) { fk[i] = frand(); fv[i] = frand(); }
        float *dk = dev_from(g, fk, (size_t)n * kvd), *dv = dev_from(g, fv, (size_t)n * kvd);
        for (int r = 1; r < 3; r++) g->ops->kv_store(g, kc[r], vc[r], &fb, kvd, dk, dv);
        g->ops->sync(g);
        g->ops->free(g, dk); g->ops->free(g, dv);
        free(fk); free(fv); free(fp); free(fs); free(fpg);
    }
    float *dq[3], *dk[3], *dv[3], *out[3];
    for (int r = 0; r < 3; r++) {
        dq[r] = dev_from(g, q, nq); dk[r] = dev_from(g, k, nk); dv[r] = dev_from(g, v, nk);
        out[r] = g->ops->alloc(g, nq * 4);
    }
    CHECK(g->ops->step_begin(g, ids, &bt, NULL, 0) == 0);
    /* the pass's first rope_kv (writes the angles), then each way */
    g->ops->rope_kv(g, dq[0], dk[0], dv[0], kc[0], vc[0], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox, NULL, bs);
    g->ops->rope_kv(g, dq[1], dk[1], dv[1], kc[1], vc[1], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox, NULL, bs);
    g->ops->attention(g, dq[1], kc[1], vc[1], &bt, n_head, n_head_kv, hd, out[1]);
    g->ops->rope_attention(g, dq[2], dk[2], dv[2], kc[2], vc[2], &bt, n_head, n_head_kv, hd, n_rot, 1e6f, neox,
                           NULL, bs, out[2]);
    g->ops->step_end(g);
    size_t big = cache > nq * 4 ? cache : nq * 4;
    char *a = malloc(big), *b = malloc(big);
    const char *what[3] = { "out", "k cache", "v cache" };
    const void *src[3][2] = { { out[1], out[2] }, { kc[1], kc[2] }, { vc[1], vc[2] } };
    size_t len[3] = { nq * 4, cache, cache };
    for (int i = 0; i < 3; i++) {
        g->ops->to_host(g, a, src[i][0], len[i]);
        g->ops->to_host(g, b, src[i][1], len[i]);
        CHECKF(memcmp(a, b, len[i]) == 0, "rope_attention kv%s T %d heads %d/%d hd %d n_rot %d neox %d bias %d: %s "
               "differs", g->kv_type == BE_KV_F16 ? "16" : "32", T, n_head, n_head_kv, hd, n_rot, neox, with_bias, what[i]);
    }
    g->ops->to_host(g, a, dq[2], nq * 4);
    CHECKF(memcmp(a, q, nq * 4) == 0, "rope_attention T %d: q was roped in place (not the fused kernel)", T);
    g->ops->sync(g);
    for (int r = 0; r < 3; r++) {
        g->ops->free(g, dq[r]); g->ops->free(g, dk[r]); g->ops->free(g, dv[r]); g->ops->free(g, out[r]);
        g->ops->free(g, kc[r]); g->ops->free(g, vc[r]);
    }
    free(q); free(k); free(v); free(a); free(b);
    free(perm); free(pos); free(slot); free(ids); free(pages);
}

/* qkv_rope (the q/k/v matmuls with the rope and KV store in their
 * epilogue) inside a pass, after the pass's first rope_kv wrote the
 * angles, against matmul_n then rope_kv: q, k, v and both caches bit for
 * bit. One token at position p; q8_0 rows of 2048 values (two warps a row,
 * the shape the fused launch takes). */
static void qkv_rope_case(int kv_f16, int n_head, int n_head_kv, int neox, int with_bias, int p)
{
    enum { NIN = 2048, MAXP = 64 };
    char err[256];
    be *g = NULL;
    CHECKF(!gpu_open(&g, kv_f16, NULL, err, sizeof err), "%s", err);
    if (!g) return;
    int hd = 128, kvd = n_head_kv * hd, nq = n_head * hd;
    size_t cache = be_kv_bytes(g->kv_type, (size_t)MAXP * KV_PAGE * kvd);
    int32_t perm[MAXP], pos = p, slot = 0, id = 0;
    page_perm(perm, MAXP);
    const int32_t *pages = perm;
    be_batch bt = { .T = 1, .pos = &pos, .pages = &pages, .slot = &slot, .n_dec = 1 };
    wt w[3];
    int no[3] = { nq, kvd, kvd };
    for (int i = 0; i < 3; i++) {
        size_t rb;
        w[i] = (wt){ .type = QT_Q8_0, .n_in = NIN, .n_out = (uint32_t)no[i] };
        w[i].data = kept(make_weight(QT_Q8_0, NIN, no[i], &rb));
        w[i].row_bytes = rb;
        CHECK(g->ops->weight_prepare(g, &w[i]) == 0);
    }
    float *q, *k, *v, *x = malloc(NIN * 4);
    wt bw[3];
    qkv_rand(g, 1, n_head, kvd, hd, &q, &k, &v, bw);
    for (int i = 0; i < NIN; i++) x[i] = frand();
    const wt *ws[3] = { &w[0], &w[1], &w[2] }, *bias[3] = { &bw[0], &bw[1], &bw[2] };
    const wt *none[3] = { NULL, NULL, NULL }, *const *bs = with_bias ? bias : none;
    char *zero = calloc(1, cache);
    void *kc[3], *vc[3];
    float *o[2][3];
    for (int r = 0; r < 3; r++) {
        kc[r] = g->ops->alloc(g, cache); vc[r] = g->ops->alloc(g, cache);
        g->ops->to_dev(g, kc[r], zero, cache); g->ops->to_dev(g, vc[r], zero, cache);
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) o[r][i] = g->ops->alloc(g, (size_t)no[i] * 4);
    float *dx = dev_from(g, x, NIN), *dq = dev_from(g, q, nq), *dk = dev_from(g, k, kvd), *dv = dev_from(g, v, kvd);
    CHECK(g->ops->step_begin(g, &id, &bt, NULL, 0) == 0);
    /* the pass's first rope_kv writes the angles */
    g->ops->rope_kv(g, dq, dk, dv, kc[2], vc[2], &bt, n_head, n_head_kv, hd, hd, 1e6f, neox, NULL, bs);
    g->ops->matmul_n(g, 3, ws, none, dx, 1, o[1]);   /* (x's int8 form, as a norm would leave it) */
    int fused = g->ops->qkv_rope(g, ws, bs, dx, o[1][0], o[1][1], o[1][2], kc[1], vc[1], &bt, n_head, n_head_kv,
                                 hd, hd, 1e6f, neox, NULL);
    CHECKF(fused, "qkv_rope heads %d/%d neox %d: not fused", n_head, n_head_kv, neox);
    g->ops->matmul_n(g, 3, ws, none, dx, 1, o[0]);
    g->ops->rope_kv(g, o[0][0], o[0][1], o[0][2], kc[0], vc[0], &bt, n_head, n_head_kv, hd, hd, 1e6f, neox, NULL,
                    bs);
    g->ops->step_end(g);
    size_t big = cache > (size_t)nq * 4 ? cache : (size_t)nq * 4;
    char *a = malloc(big), *b2 = malloc(big);
    const char *what[5] = { "q", "k", "v", "k cache", "v cache" };
    for (int i = 0; i < 5; i++) {
        const void *s0 = i < 3 ? (const void *)o[0][i] : i == 3 ? kc[0] : vc[0];
        const void *s1 = i < 3 ? (const void *)o[1][i] : i == 3 ? kc[1] : vc[1];
        size_t len = i < 3 ? (size_t)no[i] * 4 : cache;
        g->ops->to_host(g, a, s0, len);
        g->ops->to_host(g, b2, s1, len);
        CHECKF(memcmp(a, b2, len) == 0, "qkv_rope kv%s heads %d/%d neox %d bias %d pos %d: %s differs",
               kv_f16 ? "16" : "32", n_head, n_head_kv, neox, with_bias, p, what[i]);
    }
    g->ops->sync(g);
    for (int r = 0; r < 3; r++) { g->ops->free(g, kc[r]); g->ops->free(g, vc[r]); }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) g->ops->free(g, o[r][i]);
    g->ops->free(g, dx); g->ops->free(g, dq); g->ops->free(g, dk); g->ops->free(g, dv);
    g->ops->close(g);
    free(q); free(k); free(v); free(x); free(zero); free(a); free(b2);
}

static void test_qkv_rope(void)
{
    CHECK(gpu->ops->qkv_rope != NULL);
    if (!gpu->ops->qkv_rope) return;
    qkv_rope_case(1, 4, 2, 1, 1, 37);    /* qwen2-style: neox pairs, biases, f16 cache */
    qkv_rope_case(1, 4, 2, 1, 0, 0);     /* no biases, the first position */
    qkv_rope_case(1, 6, 2, 0, 1, 700);   /* interleaved pairs (llama-style), a later page */
    qkv_rope_case(0, 4, 4, 1, 1, 130);   /* f32 cache */
    /* a 7b's heads: more blocks than a wave at a pair a block, two pairs a block */
    qkv_rope_case(1, 28, 4, 1, 1, 37);
    qkv_rope_case(0, 28, 4, 0, 1, 700);
}

static void test_rope_attention(void)
{
    CHECK(gpu->ops->rope_attention != NULL && gpu->ops->step_begin != NULL);
    if (!gpu->ops->rope_attention || !gpu->ops->step_begin) return;
    /* (fused whatever the q/k/v set before: none here; the unfused side
     * without the tensor-core attention, whose other bits a 24-stream
     * batch would take: outside the promise) */
    char err[256];
    be *gs[2] = { NULL, NULL };
    const be_cuda_force f = { .rope_att = 1, .att_mma = -1 };
    int bad = gpu_open(&gs[0], 1, &f, err, sizeof err) || gpu_open(&gs[1], 0, &f, err, sizeof err);
    CHECKF(!bad, "%s", err);
    for (int i = 0; i < 2 && !bad; i++) {
        rope_att_case(gs[i], 4, 14, 2, 64, 64, 1, 1);     /* qwen2.5-0.5b: few blocks (rolled) */
        rope_att_case(gs[i], 24, 14, 2, 64, 64, 1, 1);    /* many (unrolled) */
        rope_att_case(gs[i], 3, 28, 4, 128, 128, 1, 0);   /* qwen2.5-7b shape, no biases */
        rope_att_case(gs[i], 5, 8, 2, 128, 64, 0, 1);     /* partial rotary, interleaved pairs */
        rope_att_case(gs[i], 2, 6, 3, 48, 32, 1, 1);      /* head_dim not a multiple of 32 */
    }
    for (int i = 0; i < 2; i++)
        if (gs[i]) gs[i]->ops->close(gs[i]);
}

/* GEMV input quantized by the op that produced it (add_rmsnorm, rmsnorm,
 * silu_mul) against a backend that quantizes in the matmul (unfused):
 * a small FFN and a projection, bit for bit. On the fused side the matmul
 * inputs are zeroed behind the backend's back once produced, so the check
 * also shows that the matmuls took the producers' int8 form. */
typedef struct fq_case {
    int T, E, F, ND, NQ;
    const float *x, *r;
    wt *nw, *gate, *up, *down, *wq, *bq;
} fq_case;

static void fq_zero(be *b, void *p, size_t n)
{
#ifdef ANE_CUDA
    b->ops->sync(b);
    cudaMemset(p, 0, n);
    cudaDeviceSynchronize();
#else
    (void)b; (void)p; (void)n;
#endif
}

/* matmul_glu (gate, up and silu_mul in one launch for one token) against
 * matmul_n + silu_mul on a backend with it off (glu_apart), bit for
 * bit: out, and the down projection that takes out's int8 form. x comes
 * from rmsnorm (its int8 form); on the fused side the float buffers are
 * zeroed once produced, so the checks show that each step took the int8
 * form. T 2 takes the ops apart on both sides. */
static void glu_run(be *b, int poison, const wt *nw, const wt *wg, const wt *wu, const wt *wd, int T,
                    const float *x, float *h, float *y)
{
    int n = (int)wg->n_in, F = (int)wg->n_out;
    float *dx = dev_from(b, x, (size_t)T * n);
    float *dg = b->ops->alloc(b, (size_t)T * F * 4), *du = b->ops->alloc(b, (size_t)T * F * 4);
    float *dy = b->ops->alloc(b, (size_t)T * wd->n_out * 4);
    b->ops->rmsnorm(b, dx, nw, T, n, 1e-6f, dx);
    if (poison) fq_zero(b, dx, (size_t)T * n * 4);
    b->ops->matmul_glu(b, wg, wu, dx, T, dg, du, dg);
    b->ops->to_host(b, h, dg, (size_t)T * F * 4);
    if (poison) fq_zero(b, dg, (size_t)T * F * 4);
    b->ops->matmul(b, wd, NULL, dg, T, dy);
    b->ops->to_host(b, y, dy, (size_t)T * wd->n_out * 4);
    b->ops->sync(b);
    b->ops->free(b, dx); b->ops->free(b, dg); b->ops->free(b, du); b->ops->free(b, dy);
}

/* glu_run on bs[0] and then bs[1] (poisoned), the weights ws (gate, up,
 * down, norm) prepared for each; res[side] = { out, the down projection } */
static void glu_both(be *const *bs, wt *const *ws, int T, const float *x, float *res[2][2])
{
    for (int s2 = 0; s2 < 2; s2++) {
        for (int i = 0; i < 4; i++) CHECK(bs[s2]->ops->weight_prepare(bs[s2], ws[i]) == 0);
        res[s2][0] = malloc((size_t)T * ws[0]->n_out * 4);
        res[s2][1] = malloc((size_t)T * ws[2]->n_out * 4);
        glu_run(bs[s2], s2, ws[3], ws[0], ws[1], ws[2], T, x, res[s2][0], res[s2][1]);
    }
}

static void test_glu(void)
{
    char err[256];
    be *bf = NULL, *bn = NULL;
    int bad = gpu_open(&bf, 1, &(be_cuda_force){ .gemv_all = 1 }, err, sizeof err);
    bad |= gpu_open(&bn, 1, &(be_cuda_force){ .gemv_all = 1, .glu_apart = 1 }, err, sizeof err);
    CHECKF(!bad, "%s", err);
    CHECK(!bad && bf->ops->matmul_glu != NULL);
    if (bad || !bf->ops->matmul_glu) goto done;
    const uint32_t types[] = { QT_Q8_0, QT_Q4_K, QT_Q6_K };
    const int ns[] = { 896, 1024, 1024 }, Fs[] = { 4864, 2816, 2048 };
    for (int ti = 0; ti < 3; ti++) {
        int n = ns[ti], F = Fs[ti], ND = 96;
        size_t rb;
        wt wg = { .type = types[ti], .n_in = n, .n_out = F, .data = kept(make_weight(types[ti], n, F, &rb)) };
        wg.row_bytes = rb;
        wt wu = wg;
        wu.data = kept(make_weight(types[ti], n, F, &rb));
        wt wd = { .type = QT_Q8_0, .n_in = F, .n_out = ND, .data = kept(make_weight(QT_Q8_0, F, ND, &rb)) };
        wd.row_bytes = rb;
        float *a = kept(malloc((size_t)n * 4));
        for (int i = 0; i < n; i++) a[i] = 0.5f + frand();
        wt nw = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = a };
        be *bs[2] = { bn, bf };
        for (int T = 1; T <= 2; T++) {
            float *x = malloc((size_t)T * n * 4), *res[2][2];
            for (int i = 0; i < T * n; i++) x[i] = frand() * 2;
            wt *ws[4] = { &wg, &wu, &wd, &nw };
            glu_both(bs, ws, T, x, res);
            CHECKF(memcmp(res[0][0], res[1][0], (size_t)T * F * 4) == 0, "matmul_glu %s T=%d: out differs",
                   qt_name(types[ti]), T);
            CHECKF(memcmp(res[0][1], res[1][1], (size_t)T * ND * 4) == 0,
                   "matmul_glu %s T=%d: the down projection of its int8 out differs", qt_name(types[ti]), T);
            for (int s2 = 0; s2 < 2; s2++) { free(res[s2][0]); free(res[s2][1]); }
            free(x);
        }
    }
done:
    if (bf) bf->ops->close(bf);
    if (bn) bn->ops->close(bn);
}

/* The batched q4_K kernels' gate-and-up form (decode batches of 17..32,
 * both kernels: T <= 24 and past it) against matmul_n + silu_mul
 * (glu_apart), bit for bit: out, and the down projection on its f16
 * form (the fused side's float buffers zeroed once produced, as in
 * test_glu). Features F = 2816 (two blocks' halves of 128 rows) and 4160
 * (F % 128 = 64); n 1024 splits K, n 256 not. Also the CPU within 1e-2. */
static void test_glu_batched(void)
{
    char err[256];
    be *bf = NULL, *bn = NULL;
    int bad = gpu_open(&bf, 1, NULL, err, sizeof err);
    bad |= gpu_open(&bn, 1, &(be_cuda_force){ .glu_apart = 1 }, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (bad) goto done;
    const struct { int n, F; } cs[] = { { 1024, 2816 }, { 1024, 4160 }, { 256, 2816 } };
    const int Ts[] = { 17, 24, 25, 32 };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        int n = cs[ci].n, F = cs[ci].F, ND = 128;
        size_t rb;
        wt wg = { .type = QT_Q4_K, .n_in = n, .n_out = F, .data = kept(make_weight(QT_Q4_K, n, F, &rb)) };
        wg.row_bytes = rb;
        wt wu = wg;
        wu.data = kept(make_weight(QT_Q4_K, n, F, &rb));
        /* (the down projection q8_0 where F is no whole number of q4_K super-blocks) */
        uint32_t dt = F % 256 ? QT_Q8_0 : QT_Q4_K;
        wt wd = { .type = dt, .n_in = F, .n_out = ND, .data = kept(make_weight(dt, F, ND, &rb)) };
        wd.row_bytes = rb;
        float *a = kept(malloc((size_t)n * 4));
        for (int i = 0; i < n; i++) a[i] = 0.002f * (0.5f + frand());   /* (out well inside f16's range) */
        wt nw = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = a };
        be *bs[2] = { bn, bf };
        /* first a run of the widest batch unpoisoned: the scratches grow to
         * it (a growing scratch drops its tag, so the step after a poisoned
         * buffer would read zeros) */
        for (int s2 = 0; s2 < 2; s2++) {
            wt *ws[4] = { &wg, &wu, &wd, &nw };
            for (int i = 0; i < 4; i++) CHECK(bs[s2]->ops->weight_prepare(bs[s2], ws[i]) == 0);
            int T = Ts[sizeof Ts / sizeof Ts[0] - 1];
            float *x = calloc((size_t)T * n, 4), *h = malloc((size_t)T * F * 4), *y = malloc((size_t)T * ND * 4);
            glu_run(bs[s2], 0, &nw, &wg, &wu, &wd, T, x, h, y);
            free(x); free(h); free(y);
        }
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k];
            float *x = malloc((size_t)T * n * 4), *res[2][2];
            for (int i = 0; i < T * n; i++) x[i] = frand() * 2;
            wt *ws[4] = { &wg, &wu, &wd, &nw };
            glu_both(bs, ws, T, x, res);
            CHECKF(memcmp(res[0][0], res[1][0], (size_t)T * F * 4) == 0,
                   "batched matmul_glu n=%d F=%d T=%d: out differs", n, F, T);
            CHECKF(memcmp(res[0][1], res[1][1], (size_t)T * ND * 4) == 0,
                   "batched matmul_glu n=%d F=%d T=%d: the down projection of its f16 out differs", n, F, T);
            /* against the CPU: norm, both matmuls, silu_mul in float */
            float *cx = malloc((size_t)T * n * 4), *cg = malloc((size_t)T * F * 4), *cu = malloc((size_t)T * F * 4);
            wt *cw[3] = { &wg, &wu, &nw };
            for (int i = 0; i < 3; i++) CHECK(cpu->ops->weight_prepare(cpu, cw[i]) == 0);
            cpu->ops->rmsnorm(cpu, x, &nw, T, n, 1e-6f, cx);
            cpu->ops->matmul(cpu, &wg, NULL, cx, T, cg);
            cpu->ops->matmul(cpu, &wu, NULL, cx, T, cu);
            cpu->ops->silu_mul(cpu, cg, cu, (size_t)T * F, cg);
            float big = 0;
            for (size_t i = 0; i < (size_t)T * F; i++) big = fabsf(cg[i]) > big ? fabsf(cg[i]) : big;
            CHECKF(big > 1e-3f && big < 1e4f, "batched matmul_glu n=%d F=%d T=%d: out's range (max %g)", n, F, T, big);
            double e = rel_err_f(res[1][0], cg, (size_t)T * F);
            CHECKF(e <= 1e-2, "batched matmul_glu n=%d F=%d T=%d: rel err %.3g against the CPU", n, F, T, e);
            for (int s2 = 0; s2 < 2; s2++) { free(res[s2][0]); free(res[s2][1]); }
            free(x); free(cx); free(cg); free(cu);
        }
    }
done:
    if (bf) bf->ops->close(bf);
    if (bn) bn->ops->close(bn);
}

/* out: xb, hg (after silu_mul), y (down), q (wq on rmsnorm(x)) */
static void fq_run(be *b, const fq_case *fc, int poison, float *xb, float *hg, float *y, float *q)
{
    int T = fc->T, E = fc->E, F = fc->F;
    wt *ws[6] = { fc->nw, fc->gate, fc->up, fc->down, fc->wq, fc->bq };
    for (int i = 0; i < 6; i++) CHECK(b->ops->weight_prepare(b, ws[i]) == 0);
    float *dx = dev_from(b, fc->x, (size_t)T * E), *dr = dev_from(b, fc->r, (size_t)T * E);
    float *dxb = b->ops->alloc(b, (size_t)T * E * 4), *dhg = b->ops->alloc(b, (size_t)T * F * 4);
    float *dhu = b->ops->alloc(b, (size_t)T * F * 4), *dy = b->ops->alloc(b, (size_t)T * fc->ND * 4);
    float *dq = b->ops->alloc(b, (size_t)T * fc->NQ * 4);
    b->ops->add_rmsnorm(b, dx, dr, fc->nw, T, E, 1e-6f, dxb);
    b->ops->to_host(b, xb, dxb, (size_t)T * E * 4);
    if (poison) fq_zero(b, dxb, (size_t)T * E * 4);
    const wt *gu[2] = { fc->gate, fc->up }, *nb[2] = { NULL, NULL };
    float *outs[2] = { dhg, dhu };
    b->ops->matmul_n(b, 2, gu, nb, dxb, T, outs);
    b->ops->silu_mul(b, dhg, dhu, (size_t)T * F, dhg);
    b->ops->to_host(b, hg, dhg, (size_t)T * F * 4);
    if (poison) fq_zero(b, dhg, (size_t)T * F * 4);
    b->ops->matmul(b, fc->down, NULL, dhg, T, dy);
    b->ops->rmsnorm(b, dx, fc->nw, T, E, 1e-6f, dxb);
    if (poison) fq_zero(b, dxb, (size_t)T * E * 4);
    b->ops->matmul(b, fc->wq, fc->bq, dxb, T, dq);
    b->ops->to_host(b, y, dy, (size_t)T * fc->ND * 4);
    b->ops->to_host(b, q, dq, (size_t)T * fc->NQ * 4);
    b->ops->sync(b);
    float *bufs[] = { dx, dr, dxb, dhg, dhu, dy, dq };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) b->ops->free(b, bufs[i]);
}

static void test_fused_quant(void)
{
    char err[256];
    be *bf = NULL, *bn = NULL;
    /* every batch by GEMV, with and without the fusion */
    int bad = gpu_open(&bf, 1, &(be_cuda_force){ .gemv_all = 1 }, err, sizeof err);
    bad |= gpu_open(&bn, 1, &(be_cuda_force){ .gemv_all = 1, .unfused = 1 }, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (bad) goto done;
    const uint32_t types[] = { QT_Q8_0, QT_Q4_K };
    const int Ts[] = { 1, 3, 16, 40 };
    for (int ti = 0; ti < 2; ti++) {
        uint32_t type = types[ti];
        int E = type == QT_Q4_K ? 1024 : 896, F = 4864, ND = 64, NQ = 96;
        size_t rb;
        wt gate = { .type = type, .n_in = E, .n_out = F }, up = gate;
        gate.data = kept(make_weight(type, E, F, &rb)); gate.row_bytes = rb;
        up.data = kept(make_weight(type, E, F, &rb)); up.row_bytes = rb;
        wt down = { .type = type, .n_in = F, .n_out = ND, .data = kept(make_weight(type, F, ND, &rb)) };
        down.row_bytes = rb;
        wt wq = { .type = type, .n_in = E, .n_out = NQ, .data = kept(make_weight(type, E, NQ, &rb)) };
        wq.row_bytes = rb;
        float *nwd = kept(malloc((size_t)E * 4)), *bqd = kept(malloc((size_t)NQ * 4));
        for (int i = 0; i < E; i++) nwd[i] = 0.5f + frand();
        for (int i = 0; i < NQ; i++) bqd[i] = frand();
        wt nw = { .type = QT_F32, .n_in = E, .n_out = 1, .row_bytes = (size_t)E * 4, .data = nwd };
        wt bq = { .type = QT_F32, .n_in = NQ, .n_out = 1, .row_bytes = (size_t)NQ * 4, .data = bqd };
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k];
            float *x = malloc((size_t)T * E * 4), *r = malloc((size_t)T * E * 4);
            for (int i = 0; i < T * E; i++) { x[i] = frand() * 3; r[i] = frand(); }
            fq_case fc = { T, E, F, ND, NQ, x, r, &nw, &gate, &up, &down, &wq, &bq };
            float *res[2][4];
            size_t len[4] = { (size_t)T * E, (size_t)T * F, (size_t)T * ND, (size_t)T * NQ };
            for (int s = 0; s < 2; s++)
                for (int i = 0; i < 4; i++) res[s][i] = malloc(len[i] * 4);
            fq_run(bn, &fc, 0, res[0][0], res[0][1], res[0][2], res[0][3]);
            fq_run(bf, &fc, 1, res[1][0], res[1][1], res[1][2], res[1][3]);
            const char *what[4] = { "add_rmsnorm out", "silu_mul out", "down (silu_mul's int8)",
                                    "wq (rmsnorm's int8)" };
            for (int i = 0; i < 4; i++)
                CHECKF(memcmp(res[0][i], res[1][i], len[i] * 4) == 0, "fused quantization %s n=%d T=%d: %s differs",
                       qt_name(type), E, T, what[i]);
            /* gate/up (add_rmsnorm's int8) show in silu_mul's out */
            for (int s = 0; s < 2; s++)
                for (int i = 0; i < 4; i++) free(res[s][i]);
            free(x); free(r);
        }
    }
done:
    if (bf) bf->ops->close(bf);
    if (bn) bn->ops->close(bn);
}

/* The same random K and V rows at positions from .. from+n-1 of sequence
 * `slot` (page table pg) in the GPU caches and the CPU's */
static void kv_fill(be *gb, void *gkc, void *gvc, be *cb, void *ckc, void *cvc, int kvd, const int32_t *pg,
                    int slot, int from, int n)
{
    if (n <= 0) return;
    int32_t *fp = malloc((size_t)n * 4), *fs = malloc((size_t)n * 4);
    const int32_t **fpg = malloc((size_t)n * sizeof *fpg);
    for (int i = 0; i < n; i++) { fp[i] = from + i; fpg[i] = pg; fs[i] = slot; }
    be_batch fb = { .T = n, .pos = fp, .pages = fpg, .slot = fs };
    float *fk = malloc((size_t)n * kvd * 4), *fv = malloc((size_t)n * kvd * 4);
    for (size_t i = 0; i < (size_t)n * kvd; i++) { fk[i] = frand(); fv[i] = frand(); }
    float *dk = dev_from(gb, fk, (size_t)n * kvd), *dv = dev_from(gb, fv, (size_t)n * kvd);
    cb->ops->kv_store(cb, ckc, cvc, &fb, kvd, fk, fv);
    gb->ops->kv_store(gb, gkc, gvc, &fb, kvd, dk, dv);
    gb->ops->sync(gb);
    gb->ops->free(gb, dk); gb->ops->free(gb, dv);
    free(fk); free(fv); free(fp); free(fs); free(fpg);
}

/* Three sequences with scrambled page tables: a prefill batch of all their
 * tokens, then decode steps at longer contexts (split attention). */
static void attn_case(be *gb, be *cb, int n_head, int n_head_kv, int hd)
{
    enum { NS = 3, MAXP = 64 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(gb->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    int32_t *tbl[NS];
    for (int s = 0; s < NS; s++) tbl[s] = perm + s * MAXP;
    void *ckc = calloc(1, cache), *cvc = calloc(1, cache);
    void *gkc = gb->ops->alloc(gb, cache), *gvc = gb->ops->alloc(gb, cache);
    int lens[NS] = { 37, 5, 300 };
    /* an output projection after the attention: the attention's own int8
     * form of its output (when it writes one) gives the same result */
    int nq_in = n_head * hd, wo_n = 40;
    size_t wo_rb;
    wt wo = { .type = QT_Q8_0, .n_in = nq_in, .n_out = wo_n };
    if (nq_in % 32 == 0) {
        wo.data = kept(make_weight(QT_Q8_0, nq_in, wo_n, &wo_rb));
        wo.row_bytes = wo_rb;
        CHECK(gb->ops->weight_prepare(gb, &wo) == 0);
    }
    for (int step = 0; step < 4; step++) {
        /* step 0: prefill lens[s] tokens each; later: one token each at a longer position */
        int T = 0;
        int32_t pos[400], slot[400];
        const int32_t *pages[400];
        for (int s = 0; s < NS; s++) {
            int from = step == 0 ? 0 : lens[s] + 200 * step - 1, to = step == 0 ? lens[s] : from + 1;
            for (int p = from; p < to; p++) { pos[T] = p; pages[T] = tbl[s]; slot[T] = s; T++; }
        }
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *a = malloc(nq * 4), *g = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) q[i] = frand();
        for (size_t i = 0; i < nk; i++) { k[i] = frand(); v[i] = frand(); }
        if (step > 0) {
            /* fill the positions skipped since the last step with the same keys on both sides */
            for (int s = 0; s < NS; s++) {
                int from = step == 1 ? lens[s] : lens[s] + 200 * (step - 1), to = lens[s] + 200 * step - 1;
                kv_fill(gb, gkc, gvc, cb, ckc, cvc, kvd, tbl[s], s, from, to - from);
            }
        }
        float *dq = dev_from(gb, q, nq), *dk = dev_from(gb, k, nk), *dv = dev_from(gb, v, nk);
        float *dout = gb->ops->alloc(gb, nq * 4);
        cb->ops->kv_store(cb, ckc, cvc, &bt, kvd, k, v);
        cb->ops->attention(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, a);
        gb->ops->kv_store(gb, gkc, gvc, &bt, kvd, dk, dv);
        gb->ops->attention(gb, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dout);
        if (wo.data) {
            size_t no = (size_t)T * wo_n;
            float *p1 = gb->ops->alloc(gb, no * 4), *p2 = gb->ops->alloc(gb, no * 4);
            float *h1 = calloc(no, 4), *h2 = calloc(no, 4);
            gb->ops->matmul(gb, &wo, NULL, dout, T, p1);
            gb->ops->to_dev(gb, p2, h1, 4);   /* any write: xq is the matmul's own again */
            gb->ops->matmul(gb, &wo, NULL, dout, T, p2);
            gb->ops->to_host(gb, h1, p1, no * 4);
            gb->ops->to_host(gb, h2, p2, no * 4);
            CHECKF(memcmp(h1, h2, no * 4) == 0, "attention kv%s heads %d/%d hd %d step %d: projection of the "
                   "attention's int8 output differs", be_kv_name(gb->kv_type), n_head, n_head_kv, hd, step);
            gb->ops->free(gb, p1); gb->ops->free(gb, p2);
            free(h1); free(h2);
        }
        gb->ops->to_host(gb, g, dout, nq * 4);
        gb->ops->sync(gb);
        double e = rel_err_f(g, a, nq);
        CHECKF(e < 1e-4, "attention kv%s heads %d/%d hd %d step %d (T=%d): rel err %.3g",
               be_kv_name(gb->kv_type), n_head, n_head_kv, hd, step, T, e);
        /* batch invariance: each token alone gives the very same bits */
        for (int t = 0; t < T; t += step == 0 ? 61 : 1) {
            be_batch one = { .T = 1, .pos = pos + t, .pages = pages + t, .slot = slot + t };
            size_t row = (size_t)n_head * hd;
            float *dq1 = dev_from(gb, q + t * row, row), *do1 = gb->ops->alloc(gb, row * 4), *g1 = malloc(row * 4);
            gb->ops->attention(gb, dq1, gkc, gvc, &one, n_head, n_head_kv, hd, do1);
            gb->ops->to_host(gb, g1, do1, row * 4);
            gb->ops->sync(gb);
            CHECKF(!memcmp(g1, g + t * row, row * 4), "attention kv%s heads %d/%d step %d: token %d (pos %d) "
                   "alone differs from the batch of %d", be_kv_name(gb->kv_type), n_head, n_head_kv, step, t,
                   pos[t], T);
            gb->ops->free(gb, dq1); gb->ops->free(gb, do1); free(g1);
        }
        gb->ops->free(gb, dq); gb->ops->free(gb, dk); gb->ops->free(gb, dv); gb->ops->free(gb, dout);
        free(q); free(k); free(v); free(a); free(g);
    }
    /* the caches hold the same values */
    void *back = malloc(cache);
    gb->ops->to_host(gb, back, gkc, cache);
    CHECK(memcmp(back, ckc, cache) == 0);
    free(back);
    gb->ops->free(gb, gkc); gb->ops->free(gb, gvc);
    free(ckc); free(cvc);
}

/* A decode batch of many sequences (one token each, contexts of 1 to 700
 * positions): the grouped kernel (a block per token and KV head; gb's
 * spans split over blocks, gd's all in one block) against the CPU, bit for
 * bit against the ungrouped kernel (gn: att_grp -1) and against
 * each token alone (split over blocks). gm[0..1]: the tensor-core form
 * (att_mma 1; spans split over blocks, and all in one block) against the CPU as
 * closely, or where it does not apply (f32 caches, head_dim 48) the
 * grouped kernel's bits. */
static void attn_group_case(be *gb, be *gd, be *gn, be *const *gm, be *cb, int n_head, int n_head_kv, int hd)
{
    enum { NS = 40, MAXP = 48 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t elt = gb->kv_type == BE_KV_F16 ? 2 : 4, cache = be_kv_bytes(gb->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    void *ckc = calloc(1, cache), *cvc = calloc(1, cache);
    void *gkc = gb->ops->alloc(gb, cache), *gvc = gb->ops->alloc(gb, cache);
    int32_t pos[NS], slot[NS];
    const int32_t *pages[NS];
    for (int s = 0; s < NS; s++) {
        pos[s] = s % 5 == 0 ? (int)(rnd() % 32) : (int)(rnd() % 700);   /* one-span tokens among them */
        pages[s] = perm + s * MAXP;
        slot[s] = s;
    }
    /* the positions before each token: the same keys and values on both sides */
    for (int s = 0; s < NS; s++) kv_fill(gb, gkc, gvc, cb, ckc, cvc, kvd, pages[s], s, 0, pos[s]);
    be_batch bt = { .T = NS, .pos = pos, .pages = pages, .slot = slot };
    size_t row = (size_t)n_head * hd, nq = NS * row, nk = (size_t)NS * kvd;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *a = malloc(nq * 4);
    float *g = malloc(nq * 4), *h = malloc(nq * 4), *g1 = malloc(row * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand();
    for (size_t i = 0; i < nk; i++) { k[i] = frand(); v[i] = frand(); }
    float *dq = dev_from(gb, q, nq), *dk = dev_from(gb, k, nk), *dv = dev_from(gb, v, nk);
    float *dout = gb->ops->alloc(gb, nq * 4), *dn = gn->ops->alloc(gn, nq * 4);
    cb->ops->kv_store(cb, ckc, cvc, &bt, kvd, k, v);
    cb->ops->attention(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, a);
    gb->ops->kv_store(gb, gkc, gvc, &bt, kvd, dk, dv);
    gb->ops->attention(gb, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dout);
    gb->ops->to_host(gb, g, dout, nq * 4);
    gb->ops->sync(gb);
    const char *kv = elt == 2 ? "16" : "32";
    double e = rel_err_f(g, a, nq);
    CHECKF(e < 1e-4, "grouped attention kv%s heads %d/%d hd %d: rel err %.3g", kv, n_head, n_head_kv, hd, e);
    for (int o = 0; o < 2; o++) {
        be *ob = o ? gd : gn;
        ob->ops->attention(ob, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dn);
        ob->ops->to_host(ob, h, dn, nq * 4);
        ob->ops->sync(ob);
        CHECKF(!memcmp(g, h, nq * 4), "grouped attention kv%s heads %d/%d hd %d: differs from the %s kernel", kv,
               n_head, n_head_kv, hd, o ? "one-block grouped" : "ungrouped");
    }
    int mma = elt == 2 && (hd == 64 || hd == 128);
    for (int o = 0; o < 2; o++) {
        gm[o]->ops->attention(gm[o], dq, gkc, gvc, &bt, n_head, n_head_kv, hd, dn);
        gm[o]->ops->to_host(gm[o], h, dn, nq * 4);
        gm[o]->ops->sync(gm[o]);
        double em = rel_err_f(h, a, nq);
        CHECKF(em < 1e-4, "tensor-core attention (%s) kv%s heads %d/%d hd %d: rel err %.3g",
               o ? "one block" : "split", kv, n_head, n_head_kv, hd, em);
        if (!mma)
            CHECKF(!memcmp(g, h, nq * 4), "attention kv%s heads %d/%d hd %d: the tensor-core form changed bits",
                   kv, n_head, n_head_kv, hd);
    }
    for (int t = 0; t < NS; t++) {
        be_batch one = { .T = 1, .pos = pos + t, .pages = pages + t, .slot = slot + t };
        float *dq1 = dev_from(gb, q + t * row, row), *do1 = gb->ops->alloc(gb, row * 4);
        gb->ops->attention(gb, dq1, gkc, gvc, &one, n_head, n_head_kv, hd, do1);
        gb->ops->to_host(gb, g1, do1, row * 4);
        gb->ops->sync(gb);
        CHECKF(!memcmp(g1, g + t * row, row * 4), "grouped attention kv%s heads %d/%d: token %d (pos %d) alone "
               "differs from the batch of %d", kv, n_head, n_head_kv, t, pos[t], NS);
        gb->ops->free(gb, dq1); gb->ops->free(gb, do1);
    }
    gb->ops->free(gb, dq); gb->ops->free(gb, dk); gb->ops->free(gb, dv); gb->ops->free(gb, dout);
    gn->ops->free(gn, dn);
    gb->ops->free(gb, gkc); gb->ops->free(gb, gvc);
    free(q); free(k); free(v); free(a); free(g); free(h); free(g1); free(ckc); free(cvc);
}

static void test_att_group(void)
{
    char err[256];
    be *gn = NULL, *gn32 = NULL, *gd = NULL, *gd32 = NULL, *gm[2] = { NULL, NULL }, *gm32[2] = { NULL, NULL };
    const be_cuda_force ungrouped = { .att_grp = -1 }, one = { .att_grp = 1 };
    const be_cuda_force mma_split = { .att_mma = 1, .att_grp = 4 }, mma_one = { .att_mma = 1, .att_grp = 1 };
    int bad = gpu_open(&gn, 1, &ungrouped, err, sizeof err) || gpu_open(&gn32, 0, &ungrouped, err, sizeof err) ||
              gpu_open(&gd, 1, &one, err, sizeof err) || gpu_open(&gd32, 0, &one, err, sizeof err) ||
              gpu_open(&gm[0], 1, &mma_split, err, sizeof err) || gpu_open(&gm[1], 1, &mma_one, err, sizeof err) ||
              gpu_open(&gm32[0], 0, &mma_split, err, sizeof err) || gpu_open(&gm32[1], 0, &mma_one, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (!bad) {
        attn_group_case(gpu, gd, gn, gm, cpu, 14, 2, 64);
        attn_group_case(gpu, gd, gn, gm, cpu, 28, 4, 128);
        attn_group_case(gpu, gd, gn, gm, cpu, 8, 2, 48);
        attn_group_case(gpu32, gd32, gn32, gm32, cpu32, 28, 4, 128);
    }
    be *all[8] = { gn, gn32, gd, gd32, gm[0], gm[1], gm32[0], gm32[1] };
    for (int i = 0; i < 8; i++)
        if (all[i]) all[i]->ops->close(all[i]);
}

/* Batch invariance of matmul: a row's result has the same bits whatever the
 * batch size and its place in the batch: the GEMV of every type at every
 * tile size (gpuv: a backend whose GEMV takes every batch). (Prompt rows go
 * through cuBLAS, whose kernel choice follows the batch size: not tested
 * here.) */
static be *gpuv;
static void inv_case(be *b, uint32_t type, int n_in, int n_out, const int *Ts, int nT, const char *what)
{
    size_t rb;
    void *wd = kept(make_weight(type, n_in, n_out, &rb));
    wt w = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = wd };
    CHECK(b->ops->weight_prepare(b, &w) == 0);
    int TM = Ts[nT - 1];
    float *x = malloc((size_t)TM * n_in * 4), *full = malloc((size_t)TM * n_out * 4), *y = malloc((size_t)TM * n_out * 4);
    for (size_t i = 0; i < (size_t)TM * n_in; i++) x[i] = frand();
    float *dx = dev_from(b, x, (size_t)TM * n_in), *dy = b->ops->alloc(b, (size_t)TM * n_out * 4);
    b->ops->matmul(b, &w, NULL, dx, TM, dy);
    b->ops->to_host(b, full, dy, (size_t)TM * n_out * 4);
    b->ops->sync(b);
    for (int k = 0; k < nT - 1; k++) {
        int T = Ts[k], off = (int)(rnd() % (uint32_t)(TM - T + 1));   /* rows off.. of the full batch */
        b->ops->matmul(b, &w, NULL, dx + (size_t)off * n_in, T, dy);
        b->ops->to_host(b, y, dy, (size_t)T * n_out * 4);
        b->ops->sync(b);
        int bad = 0;
        for (int t = 0; t < T; t++) bad += memcmp(y + (size_t)t * n_out, full + (size_t)(off + t) * n_out, (size_t)n_out * 4) != 0;
        CHECKF(bad == 0, "%s %s %dx%d: %d of %d rows (batch of %d at %d) differ from the batch of %d", what,
               qt_name(type), n_out, n_in, bad, T, T, off, TM);
    }
    b->ops->free(b, dx); b->ops->free(b, dy);
    free(x); free(full); free(y);
}

static void test_invariance(void)
{
    const int tv[] = { 1, 2, 3, 4, 5, 8, 9, 16, 17, 40 };
    const uint32_t types[] = { QT_Q8_0, QT_Q4_K, QT_Q6_K, QT_Q4_0, QT_BF16, QT_F32, QT_IQ4_XS, QT_MXFP4, QT_IQ2_XS };
    const int shapes[][2] = { { 896, 64 }, { 4864, 40 }, { 8960, 24 }, { 1536, 33 } };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            if (!qt_row_size(types[ti], shapes[si][0])) continue;   /* (896: no whole K-quant super-blocks) */
            inv_case(gpuv, types[ti], shapes[si][0], shapes[si][1], tv, 10, "gemv");
        }
    /* q6_K's int8 GEMV over whole groups of 32 units and cut ones, by 1, 2 and 4 warps per row */
    const int n6[] = { 3584, 8192, 16384 };
    for (int k = 0; k < 3; k++) inv_case(gpuv, QT_Q6_K, n6[k], 21, tv, 10, "gemv");
    /* rows of a 7b down projection: 592 q8_0 units, 296 q4_K (several load rounds a lane) */
    inv_case(gpuv, QT_Q8_0, 18944, 21, tv, 10, "gemv");
    inv_case(gpuv, QT_Q4_K, 18944, 13, tv, 10, "gemv");
}

/* be_opts.deterministic: a decode batch of 24 streams in a pass, of a q4_K
 * matrix the batched tensor-core kernel takes otherwise, gives each row the
 * bits that row gets alone (the GEMV at every batch size). */
static void test_deterministic(void)
{
    enum { T = 24, NIN = 1024, NOUT = 300 };
    char err[256];
    be *g = NULL;
    const be_opts o = { .kv_type = BE_KV_F16, .deterministic = 1 };
    int bad = be_open_opts(&g, "cuda", pl, &o, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (bad) return;
    size_t rb;
    wt w = { .type = QT_Q4_K, .n_in = NIN, .n_out = NOUT, .data = kept(make_weight(QT_Q4_K, NIN, NOUT, &rb)) };
    w.row_bytes = rb;
    CHECK(g->ops->weight_prepare(g, &w) == 0);
    static int32_t pg[4];
    int32_t pos[T], slot[T], ids[T] = { 0 };
    const int32_t *pages[T];
    for (int t = 0; t < T; t++) { pos[t] = 5 + t; slot[t] = t; pages[t] = pg; }
    float *x = malloc((size_t)T * NIN * 4), *y = malloc((size_t)T * NOUT * 4), *y1 = malloc((size_t)NOUT * 4);
    for (int i = 0; i < T * NIN; i++) x[i] = frand();
    float *dx = dev_from(g, x, (size_t)T * NIN), *dy = g->ops->alloc(g, (size_t)T * NOUT * 4);
    be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot, .n_dec = T };
    CHECK(g->ops->step_begin(g, ids, &bt, NULL, 0) == 0);
    g->ops->matmul(g, &w, NULL, dx, T, dy);
    g->ops->step_end(g);
    g->ops->to_host(g, y, dy, (size_t)T * NOUT * 4);
    int differ = 0;
    for (int t = 0; t < T; t++) {
        be_batch one = { .T = 1, .pos = pos + t, .pages = pages + t, .slot = slot + t, .n_dec = 1 };
        CHECK(g->ops->step_begin(g, ids, &one, NULL, 0) == 0);
        g->ops->matmul(g, &w, NULL, dx + (size_t)t * NIN, 1, dy);
        g->ops->step_end(g);
        g->ops->to_host(g, y1, dy, (size_t)NOUT * 4);
        differ += memcmp(y1, y + (size_t)t * NOUT, (size_t)NOUT * 4) != 0;
    }
    g->ops->sync(g);
    CHECKF(differ == 0, "deterministic: %d of %d rows of a %d-stream decode batch differ from the row alone", differ, T,
           T);
    g->ops->free(g, dx); g->ops->free(g, dy);
    g->ops->close(g);
    free(x); free(y); free(y1);
}

/* rows split over blocks (under 64 rows) and not; ties inside a block's
 * share and across shares: the first wins; a row of -inf gives 0 */
static void test_argmax(void)
{
    const int nrows[2] = { 37, 100 };
    for (int c = 0; c < 2; c++) {
        int rows = nrows[c], n = 151936;
        size_t N = (size_t)rows * n;
        float *x = malloc(N * 4);
        for (size_t i = 0; i < N; i++) x[i] = frand() * 20;
        x[(size_t)3 * n + 77] = 100; x[(size_t)3 * n + 78] = 100;
        x[(size_t)5 * n + 9] = 100; x[(size_t)5 * n + n - 9] = 100;
        x[(size_t)6 * n + n - 9] = 100; x[(size_t)6 * n + 70000] = 100;
        for (int i = 0; i < n; i++) x[(size_t)7 * n + i] = -INFINITY;
        float *dx = dev_from(gpu, x, N);
        int32_t ids[100];
        CHECK(gpu->ops->argmax != NULL);
        if (gpu->ops->argmax) gpu->ops->argmax(gpu, dx, rows, n, ids);
        for (int r = 0; r < rows; r++) {
            int best = 0;
            for (int i = 1; i < n; i++) if (x[(size_t)r * n + i] > x[(size_t)r * n + best]) best = i;
            CHECKF(ids[r] == best, "argmax %d rows, row %d: %d, want %d", rows, r, ids[r], best);
        }
        /* again (the split's counters were left at zero), and queued: two
         * at once, taken in order */
        int32_t again[100], q1[100], q2[100];
        if (gpu->ops->argmax) gpu->ops->argmax(gpu, dx, rows, n, again);
        CHECKF(memcmp(again, ids, (size_t)rows * 4) == 0, "argmax %d rows: a second call differs", rows);
        CHECK(gpu->ops->argmax_queue && gpu->ops->argmax_take);
        if (gpu->ops->argmax_queue && gpu->ops->argmax_take) {
            gpu->ops->argmax_queue(gpu, dx, rows, n);
            gpu->ops->argmax_queue(gpu, dx + n, rows - 1, n);
            gpu->ops->argmax_take(gpu, q1, rows);
            gpu->ops->argmax_take(gpu, q2, rows - 1);
            CHECKF(memcmp(q1, ids, (size_t)rows * 4) == 0, "argmax_queue %d rows: ids differ", rows);
            CHECKF(memcmp(q2, ids + 1, (size_t)(rows - 1) * 4) == 0, "argmax_queue %d rows (second): ids differ",
                   rows);
        }
        gpu->ops->free(gpu, dx);
        free(x);
    }
}

static void test_attention(void)
{
    attn_case(gpu, cpu, 8, 2, 64);
    attn_case(gpu, cpu, 14, 2, 64);
    attn_case(gpu, cpu, 4, 4, 128);
    attn_case(gpu, cpu, 6, 3, 48);
    attn_case(gpu32, cpu32, 8, 2, 64);
    attn_case(gpu32, cpu32, 4, 1, 128);
    /* q8_0 caches: the same blocks as the CPU's, attention within 1e-4 */
    be *gq8 = NULL, *cq8 = NULL;
    char err[256];
    CHECKF(!gpu_open(&gq8, BE_KV_Q8_0, NULL, err, sizeof err), "%s", err);
    CHECKF(!be_open(&cq8, "cpu", pl, BE_KV_Q8_0, err, sizeof err), "%s", err);
    if (gq8 && cq8) {
        attn_case(gq8, cq8, 8, 2, 64);
        attn_case(gq8, cq8, 4, 4, 128);
        attn_case(gq8, cq8, 14, 2, 64);
        attn_case(gq8, cq8, 6, 3, 32);
        attn_case(gq8, cq8, 4, 2, 256);
    }
    if (gq8) gq8->ops->close(gq8);
    if (cq8) cq8->ops->close(cq8);
}

/* attention_ex against the CPU's: a prefill of two sequences (scrambled
 * pages) then a decode step each, with a window, sinks and a scale. */
static void attn_ex_case(be *gb, be *cb, int n_head, int n_head_kv, int hd, int window, int with_sinks, float scale)
{
    enum { NS = 2, MAXP = 24 };
    int n_pages = NS * MAXP, kvd = n_head_kv * hd;
    size_t cache = be_kv_bytes(gb->kv_type, (size_t)n_pages * KV_PAGE * kvd);
    int32_t perm[NS * MAXP];
    page_perm(perm, n_pages);
    void *ckc = calloc(1, cache), *cvc = calloc(1, cache);
    void *gkc = gb->ops->alloc(gb, cache), *gvc = gb->ops->alloc(gb, cache);
    float *sk = kept(malloc((size_t)n_head * 4));
    for (int h = 0; h < n_head; h++) sk[h] = frand() * 3 + (h % 3 == 0 ? 4 : 0);
    wt sinks = { .type = QT_F32, .n_in = n_head, .n_out = 1, .row_bytes = (size_t)n_head * 4, .data = sk };
    CHECK(gb->ops->weight_prepare(gb, &sinks) == 0);
    be_attn_ex ex = { window, with_sinks ? &sinks : NULL, scale };
    int lens[NS] = { 300, 41 };
    for (int step = 0; step < 2; step++) {
        int T = 0;
        int32_t pos[400], slot[400];
        const int32_t *pages[400];
        for (int s = 0; s < NS; s++) {
            int from = step == 0 ? 0 : lens[s], to = step == 0 ? lens[s] : lens[s] + 1;
            for (int p = from; p < to; p++) { pos[T] = p; pages[T] = perm + s * MAXP; slot[T] = s; T++; }
        }
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        size_t nq = (size_t)T * n_head * hd, nk = (size_t)T * kvd;
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *a = malloc(nq * 4), *g = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) q[i] = frand() * 2;
        for (size_t i = 0; i < nk; i++) { k[i] = frand(); v[i] = frand(); }
        float *dq = dev_from(gb, q, nq), *dk = dev_from(gb, k, nk), *dv = dev_from(gb, v, nk);
        float *dout = gb->ops->alloc(gb, nq * 4);
        cb->ops->kv_store(cb, ckc, cvc, &bt, kvd, k, v);
        cb->ops->attention_ex(cb, q, ckc, cvc, &bt, n_head, n_head_kv, hd, &ex, a);
        gb->ops->kv_store(gb, gkc, gvc, &bt, kvd, dk, dv);
        gb->ops->attention_ex(gb, dq, gkc, gvc, &bt, n_head, n_head_kv, hd, &ex, dout);
        gb->ops->to_host(gb, g, dout, nq * 4);
        gb->ops->sync(gb);
        double e = rel_err_f(g, a, nq);
        CHECKF(e < 1e-4, "attention_ex kv%d heads %d/%d hd %d window %d sinks %d scale %g step %d: rel err %.3g",
               gb->kv_type == BE_KV_F16 ? 16 : 32, n_head, n_head_kv, hd, window, with_sinks, scale, step, e);
        gb->ops->free(gb, dq); gb->ops->free(gb, dk); gb->ops->free(gb, dv); gb->ops->free(gb, dout);
        free(q); free(k); free(v); free(a); free(g);
    }
    gb->ops->free(gb, gkc); gb->ops->free(gb, gvc);
    free(ckc); free(cvc);
}

static void test_attention_ex(void)
{
    attn_ex_case(gpu, cpu, 8, 2, 64, 0, 1, 0);
    attn_ex_case(gpu, cpu, 8, 2, 64, 37, 0, 0);
    attn_ex_case(gpu, cpu, 4, 1, 256, 512, 0, 0.0625f);
    attn_ex_case(gpu, cpu, 6, 3, 48, 16, 1, 0.2f);
    attn_ex_case(gpu32, cpu32, 8, 8, 128, 1, 1, 0);
    attn_ex_case(gpu32, cpu32, 4, 2, 32, 100, 1, 0);
}

/* gelu_mul (with and without up), scale, layernorm (with and without bias,
 * in place, rows of odd widths and past a block), add_pos (f32, f16, bf16
 * tables) against the CPU's. */
static void test_gelu_layernorm(void)
{
    static const int widths[] = { 1, 37, 64, 1000, 1536, 5000 };
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        int n = widths[wi], rows = 7;
        size_t N = (size_t)rows * n;
        float *x = malloc(N * 4), *u = malloc(N * 4), *a = malloc(N * 4), *g = malloc(N * 4);
        float *w = kept(malloc((size_t)n * 4)), *bb = kept(malloc((size_t)n * 4));
        for (size_t i = 0; i < N; i++) { x[i] = frand() * 4 + 0.5f; u[i] = frand(); }
        for (int i = 0; i < n; i++) { w[i] = frand() + 1; bb[i] = frand(); }
        wt ww = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = w };
        wt wb = ww;
        wb.data = bb;
        CHECK(gpu->ops->weight_prepare(gpu, &ww) == 0 && gpu->ops->weight_prepare(gpu, &wb) == 0);
        float *dx = dev_from(gpu, x, N), *du = dev_from(gpu, u, N), *dout = gpu->ops->alloc(gpu, N * 4);
        for (int form = 0; form < 5; form++) {
            const char *what[] = { "gelu_mul", "gelu", "layernorm+bias", "layernorm in place", "scale" };
            float *dx2 = dev_from(gpu, x, N);
            memcpy(a, x, N * 4);
            switch (form) {
            case 0: cpu->ops->gelu_mul(cpu, x, u, N, a); gpu->ops->gelu_mul(gpu, dx, du, N, dout); break;
            case 1: cpu->ops->gelu_mul(cpu, x, NULL, N, a); gpu->ops->gelu_mul(gpu, dx, NULL, N, dout); break;
            case 2: cpu->ops->layernorm(cpu, x, &ww, &wb, rows, n, 1e-5f, a);
                    gpu->ops->layernorm(gpu, dx, &ww, &wb, rows, n, 1e-5f, dout); break;
            case 3: cpu->ops->layernorm(cpu, a, &ww, NULL, rows, n, 1e-5f, a);
                    gpu->ops->layernorm(gpu, dx2, &ww, NULL, rows, n, 1e-5f, dx2); break;
            case 4: cpu->ops->scale(cpu, a, N, 0.37f); gpu->ops->scale(gpu, dx2, N, 0.37f); break;
            }
            gpu->ops->to_host(gpu, g, form >= 3 ? dx2 : dout, N * 4);
            gpu->ops->sync(gpu);
            double e = rel_err_f(g, a, N);
            CHECKF(e < 1e-5, "%s n %d: rel err %.3g", what[form], n, e);
            gpu->ops->free(gpu, dx2);
        }
        gpu->ops->free(gpu, dx); gpu->ops->free(gpu, du); gpu->ops->free(gpu, dout);
        free(x); free(u); free(a); free(g);
    }
    /* learned positions */
    static const uint32_t types[] = { QT_F32, QT_F16, QT_BF16 };
    for (size_t ti = 0; ti < 3; ti++) {
        int n = 96, n_pos = 50, T = 9;
        size_t rb;
        wt tab = { .type = types[ti], .n_in = n, .n_out = n_pos };
        tab.data = kept(make_weight(types[ti], n, n_pos, &rb));
        tab.row_bytes = rb;
        CHECK(gpu->ops->weight_prepare(gpu, &tab) == 0);
        int32_t pos[9] = { 0, 1, 2, 49, 17, 18, 19, 3, 48 }, slot[9] = { 0 };
        static const int32_t pg[4] = { 0, 1, 2, 3 };
        const int32_t *pages[9];
        for (int t = 0; t < T; t++) pages[t] = pg;
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        float *x = malloc((size_t)T * n * 4), *g = malloc((size_t)T * n * 4);
        for (int i = 0; i < T * n; i++) x[i] = frand();
        float *dx = dev_from(gpu, x, (size_t)T * n);
        cpu->ops->add_pos(cpu, x, &tab, &bt, n);
        gpu->ops->add_pos(gpu, dx, &tab, &bt, n);
        gpu->ops->to_host(gpu, g, dx, (size_t)T * n * 4);
        gpu->ops->sync(gpu);
        CHECKF(memcmp(g, x, (size_t)T * n * 4) == 0, "add_pos type %u differs", types[ti]);
        gpu->ops->free(gpu, dx);
        free(x); free(g);
    }
}

/* ---- linear-attention ops against the CPU backend ---- */

static void test_ssm_elementwise(void)
{
    int rows = 37, n = 128, st = 3 * n + 5;
    size_t N = (size_t)rows * n;
    float *x = malloc((size_t)rows * st * 4), *z = malloc(N * 4), *w = malloc((size_t)n * 4);
    float *a = malloc(N * 4), *g = malloc(N * 4);
    for (size_t i = 0; i < (size_t)rows * st; i++) x[i] = frand() * 3;
    for (size_t i = 0; i < N; i++) z[i] = frand() * 4;
    for (int i = 0; i < n; i++) w[i] = frand();
    wt wv = { .type = QT_F32, .n_in = n, .n_out = 1, .row_bytes = (size_t)n * 4, .data = w };
    CHECK(gpu->ops->weight_prepare(gpu, &wv) == 0);
    CHECK(gpu->ops->copy_rows && gpu->ops->sigmoid_mul && gpu->ops->rmsnorm_gated && gpu->ops->conv1d_silu &&
          gpu->ops->deltanet);
    if (!gpu->ops->copy_rows || !gpu->ops->sigmoid_mul || !gpu->ops->rmsnorm_gated) goto done;
    float *dx = dev_from(gpu, x, (size_t)rows * st), *dz = dev_from(gpu, z, N), *dout = gpu->ops->alloc(gpu, N * 4);

    /* strided rows out of x (as the gated-attention split), bit-exact */
    cpu->ops->copy_rows(cpu, a, (size_t)n, x + 7, (size_t)st, rows, n - 3);
    gpu->ops->copy_rows(gpu, dout, (size_t)n, dx + 7, (size_t)st, rows, n - 3);
    gpu->ops->to_host(gpu, g, dout, N * 4);
    int same = 1;
    for (int r = 0; r < rows; r++) same &= memcmp(a + (size_t)r * n, g + (size_t)r * n, (size_t)(n - 3) * 4) == 0;
    CHECK(same);

    /* sigmoid_mul in place on a dense copy */
    cpu->ops->copy_rows(cpu, a, (size_t)n, x, (size_t)st, rows, n);
    gpu->ops->copy_rows(gpu, dout, (size_t)n, dx, (size_t)st, rows, n);
    cpu->ops->sigmoid_mul(cpu, a, z, N);
    gpu->ops->sigmoid_mul(gpu, dout, dz, N);
    gpu->ops->to_host(gpu, g, dout, N * 4);
    double e = rel_err_f(g, a, N);
    CHECKF(e < 1e-6, "sigmoid_mul rel err %.3g", e);

    /* rmsnorm_gated, out of place and in place, two row lengths */
    for (int k = 0; k < 2; k++) {
        int nn = k ? 80 : n, rr = (int)(N / (size_t)nn);
        float *ref = malloc(N * 4), *src = malloc(N * 4);
        for (size_t i = 0; i < N; i++) src[i] = frand() * 2;
        float *ds = dev_from(gpu, src, N);
        wt wn = { .type = QT_F32, .n_in = nn, .n_out = 1, .row_bytes = (size_t)nn * 4, .data = w };
        CHECK(gpu->ops->weight_prepare(gpu, &wn) == 0);
        cpu->ops->rmsnorm_gated(cpu, src, z, &wn, rr, nn, 1e-6f, ref);
        gpu->ops->rmsnorm_gated(gpu, ds, dz, &wn, rr, nn, 1e-6f, k ? ds : dout);
        gpu->ops->to_host(gpu, g, k ? ds : dout, (size_t)rr * nn * 4);
        e = rel_err_f(g, ref, (size_t)rr * nn);
        CHECKF(e < 1e-5, "rmsnorm_gated n=%d %s rel err %.3g", nn, k ? "in place" : "", e);
        gpu->ops->free(gpu, ds);
        free(ref); free(src);
    }
    gpu->ops->sync(gpu);
    gpu->ops->free(gpu, dx); gpu->ops->free(gpu, dz); gpu->ops->free(gpu, dout);
done:
    free(x); free(z); kept(w); free(a); free(g);
}

/* Batches of the recurrent ops: runs of several sequences (prefill of
 * 1..130 tokens, decode tokens, restarts at position 0, state carried in
 * from random initial state, interleaved sequences) with save points. */
enum { SSM_SLOTS = 4, SSM_MAXT = 256 };
typedef struct ssm_tok { int slot, from, n; } ssm_tok;
typedef struct ssm_step { ssm_tok run[6]; int n_run; be_save sv[3]; int n_sv; } ssm_step;

static const ssm_step SSM_STEPS[] = {
    /* prefill of slot 0 from 0, slot 1 resuming at 5 (random state), slot 2 starting */
    { { { 0, 0, 37 }, { 1, 5, 5 }, { 2, 0, 1 } }, 3, { { 0, 20, NULL }, { 1, 10, NULL }, { 3, 4, NULL } }, 3 },
    /* decode of four sequences */
    { { { 0, 37, 1 }, { 1, 10, 1 }, { 2, 1, 1 }, { 3, 0, 1 } }, 4, { { 2, 2, NULL } }, 1 },
    /* decode tokens mixed with two prefill runs (130 tokens, and 70 from a restart) */
    { { { 1, 11, 1 }, { 0, 38, 130 }, { 3, 1, 1 }, { 2, 0, 70 } }, 4, { { 0, 100, NULL }, { 2, 64, NULL } }, 2 },
    /* two sequences interleaved token by token */
    { { { 0, 168, 1 }, { 1, 12, 1 }, { 0, 169, 1 }, { 1, 13, 1 } }, 4, { { 1, 14, NULL } }, 1 },
    /* one token with a save point right after it */
    { { { 3, 2, 1 } }, 1, { { 3, 3, NULL } }, 1 },
    /* a run of 101 tokens from position 0 alone */
    { { { 1, 0, 101 } }, 1, { { 1, 101, NULL } }, 1 },
};
#define SSM_N_STEPS (sizeof SSM_STEPS / sizeof SSM_STEPS[0])

static int ssm_batch(const ssm_step *s, int32_t *pos, int32_t *slot, const int32_t **pages, const int32_t *pg)
{
    int T = 0;
    for (int r = 0; r < s->n_run; r++)
        for (int i = 0; i < s->run[r].n && T < SSM_MAXT; i++) {
            pos[T] = s->run[r].from + i;
            slot[T] = s->run[r].slot;
            pages[T] = pg;
            T++;
        }
    return T;
}

/* The GPU's save points against the CPU's (relative error under tol), then
 * both freed; g: a host scratch of slot_sz floats. */
static void saves_check(be_save *gsv, be_save *csv, int n_sv, size_t slot_sz, float *g, double tol, const char *op,
                        int a, int b, size_t step)
{
    for (int i = 0; i < n_sv; i++) {
        gpu->ops->to_host(gpu, g, gsv[i].dst, slot_sz * 4);
        double e = rel_err_f(g, csv[i].dst, slot_sz);
        CHECKF(e < tol, "%s %d/%d step %zu save %d (slot %d pos %d) rel err %.3g", op, a, b, step, i, gsv[i].slot,
               gsv[i].pos, e);
        free(csv[i].dst);
        gpu->ops->free(gpu, gsv[i].dst);
    }
}

static void conv_case(int C, int K)
{
    size_t slot_sz = (size_t)(K - 1) * C, st_n = SSM_SLOTS * slot_sz;
    float *w = malloc((size_t)C * K * 4), *cst = malloc(st_n * 4 + 4), *g = malloc(st_n * 4 + 4);
    for (int i = 0; i < C * K; i++) w[i] = frand();
    for (size_t i = 0; i < st_n; i++) cst[i] = frand();
    wt ww = { .type = QT_F32, .n_in = K, .n_out = C, .row_bytes = (size_t)K * 4, .data = w };
    CHECK(gpu->ops->weight_prepare(gpu, &ww) == 0);
    float *gst = dev_from(gpu, cst, st_n + 1);
    static int32_t pg[64];
    for (size_t si = 0; si < SSM_N_STEPS; si++) {
        const ssm_step *s = &SSM_STEPS[si];
        int32_t pos[SSM_MAXT], slot[SSM_MAXT];
        const int32_t *pages[SSM_MAXT];
        int T = ssm_batch(s, pos, slot, pages, pg);
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        size_t N = (size_t)T * C;
        float *x = malloc(N * 4), *a = malloc(N * 4), *o = malloc(N * 4);
        for (size_t i = 0; i < N; i++) x[i] = frand() * 2;
        be_save csv[3], gsv[3];
        for (int i = 0; i < s->n_sv; i++) {
            csv[i] = s->sv[i]; gsv[i] = s->sv[i];
            csv[i].dst = calloc(slot_sz + 1, 4);
            gsv[i].dst = gpu->ops->alloc(gpu, (slot_sz + 1) * 4);
        }
        float *dx = dev_from(gpu, x, N);
        int inplace = si % 2 == 0;
        float *dout = inplace ? dx : gpu->ops->alloc(gpu, N * 4);
        memcpy(a, x, N * 4);
        cpu->ops->conv1d_silu(cpu, a, &ww, cst, &bt, C, K, csv, s->n_sv, a);
        gpu->ops->conv1d_silu(gpu, dx, &ww, gst, &bt, C, K, gsv, s->n_sv, dout);
        gpu->ops->to_host(gpu, o, dout, N * 4);
        double e = rel_err_f(o, a, N);
        CHECKF(e < 1e-5, "conv C=%d K=%d step %zu (T=%d) out rel err %.3g", C, K, si, T, e);
        gpu->ops->to_host(gpu, g, gst, st_n * 4);
        e = rel_err_f(g, cst, st_n);
        CHECKF(e < 1e-6, "conv C=%d K=%d step %zu state rel err %.3g", C, K, si, e);
        saves_check(gsv, csv, s->n_sv, slot_sz, g, 1e-6, "conv", C, K, si);
        gpu->ops->sync(gpu);
        gpu->ops->free(gpu, dx);
        if (!inplace) gpu->ops->free(gpu, dout);
        free(x); free(a); free(o);
    }
    gpu->ops->free(gpu, gst);
    kept(w); free(cst); free(g);
}

static void test_conv1d(void)
{
    if (!gpu->ops->conv1d_silu) { CHECK(gpu->ops->conv1d_silu != NULL); return; }
    conv_case(200, 4);
    conv_case(1100, 4);
    conv_case(64, 2);
    conv_case(96, 1);
}

static void deltanet_case(int nk, int nv, int dk, int dv)
{
    size_t head = (size_t)dk * dv, slot_sz = (size_t)nv * head, st_n = SSM_SLOTS * slot_sz;
    size_t row = (size_t)2 * nk * dk + (size_t)nv * dv, stride = row + 7;
    float *A = malloc((size_t)nv * 4), *dt = malloc((size_t)nv * 4);
    for (int h = 0; h < nv; h++) { A[h] = -(0.05f + 0.9f * (frand() + 1) / 2); dt[h] = frand(); }
    wt Aw = { .type = QT_F32, .n_in = nv, .n_out = 1, .row_bytes = (size_t)nv * 4, .data = A };
    wt dw = { .type = QT_F32, .n_in = nv, .n_out = 1, .row_bytes = (size_t)nv * 4, .data = dt };
    CHECK(gpu->ops->weight_prepare(gpu, &Aw) == 0);
    CHECK(gpu->ops->weight_prepare(gpu, &dw) == 0);
    float *cst = malloc(st_n * 4), *g = malloc(st_n * 4);
    for (size_t i = 0; i < st_n; i++) cst[i] = frand() * 0.5f;
    float *gst = dev_from(gpu, cst, st_n);
    static int32_t pg[64];
    for (size_t si = 0; si < SSM_N_STEPS; si++) {
        const ssm_step *s = &SSM_STEPS[si];
        int32_t pos[SSM_MAXT], slot[SSM_MAXT];
        const int32_t *pages[SSM_MAXT];
        int T = ssm_batch(s, pos, slot, pages, pg);
        be_batch bt = { .T = T, .pos = pos, .pages = pages, .slot = slot };
        size_t NQ = (size_t)T * stride, NG = (size_t)T * nv, NO = (size_t)T * nv * dv;
        float *qkv = malloc(NQ * 4), *ga = malloc(NG * 4), *gb = malloc(NG * 4);
        float *a = malloc(NO * 4), *o = malloc(NO * 4);
        for (size_t i = 0; i < NQ; i++) qkv[i] = frand();
        for (size_t i = 0; i < NG; i++) { ga[i] = frand() * 3; gb[i] = frand() * 3; }
        be_save csv[3], gsv[3];
        for (int i = 0; i < s->n_sv; i++) {
            csv[i] = s->sv[i]; gsv[i] = s->sv[i];
            csv[i].dst = calloc(slot_sz, 4);
            gsv[i].dst = gpu->ops->alloc(gpu, slot_sz * 4);
        }
        float *dq = dev_from(gpu, qkv, NQ), *da = dev_from(gpu, ga, NG), *db = dev_from(gpu, gb, NG);
        float *dout = gpu->ops->alloc(gpu, NO * 4);
        cpu->ops->deltanet(cpu, qkv, stride, ga, gb, &Aw, &dw, cst, &bt, nk, nv, dk, dv, 1e-6f, csv, s->n_sv, a);
        gpu->ops->deltanet(gpu, dq, stride, da, db, &Aw, &dw, gst, &bt, nk, nv, dk, dv, 1e-6f, gsv, s->n_sv, dout);
        gpu->ops->to_host(gpu, o, dout, NO * 4);
        double e = rel_err_f(o, a, NO);
        CHECKF(e < 1e-4, "deltanet nk=%d nv=%d dk=%d dv=%d step %zu (T=%d) out rel err %.3g", nk, nv, dk, dv, si, T, e);
        gpu->ops->to_host(gpu, g, gst, st_n * 4);
        e = rel_err_f(g, cst, st_n);
        CHECKF(e < 1e-4, "deltanet nk=%d nv=%d dk=%d dv=%d step %zu state rel err %.3g", nk, nv, dk, dv, si, e);
        saves_check(gsv, csv, s->n_sv, slot_sz, g, 1e-4, "deltanet", dk, dv, si);
        gpu->ops->sync(gpu);
        gpu->ops->free(gpu, dq); gpu->ops->free(gpu, da); gpu->ops->free(gpu, db); gpu->ops->free(gpu, dout);
        free(qkv); free(ga); free(gb); free(a); free(o);
    }
    gpu->ops->free(gpu, gst);
    kept(A); kept(dt); free(cst); free(g);
}

static void test_deltanet(void)
{
    if (!gpu->ops->deltanet) { CHECK(gpu->ops->deltanet != NULL); return; }
    deltanet_case(2, 4, 128, 128);   /* the Qwen3.5 head shape, tiled value heads */
    deltanet_case(1, 3, 64, 64);
    deltanet_case(2, 2, 48, 80);     /* value columns not a multiple of a warp */
    deltanet_case(2, 4, 160, 96);
    deltanet_case(1, 2, 256, 256);   /* state too large for shared memory: in global memory */
}


/* q6_K's layout for the batched kernel (ck_repack_q6_Kb, from the GEMV's
 * ck_repack_q6_K) against its definition (shaders/mmq.cu): per row and
 * super-block, the scales d * sc in f16, then per lane q three pieces of
 * its values o = 2q, 2q+1, 2q+8, 2q+9 of each sub-block */
#ifdef ANE_CUDA
static int gguf_q6(const uint8_t *b, int v)   /* value v (0..255) of a q6_K super-block: 6 bits */
{
    int h = v >> 7, m = (v >> 5) & 3, l = v & 31;
    int nib = (b[64 * h + l + 32 * (m & 1)] >> (m >= 2 ? 4 : 0)) & 15;
    return nib | ((b[128 + 32 * h + l] >> (2 * m)) & 3) << 4;
}
#endif
static void test_q6b_layout(void)
{
#ifdef ANE_CUDA
    const int ns[] = { 256, 512, 768, 3584 };
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        int n = ns[ni], n_out = 5, nc = n / 256, bad = 0;
        size_t rb, pb = ck_q6b_row_bytes(n);
        uint8_t *w = make_weight(QT_Q6_K, n, n_out, &rb), *got = malloc(pb * n_out);
        void *d0 = NULL, *d1 = NULL, *d2 = NULL;
        CHECK(cudaMalloc(&d0, rb * n_out) == cudaSuccess && cudaMalloc(&d1, rb * n_out) == cudaSuccess &&
              cudaMalloc(&d2, pb * n_out) == cudaSuccess);
        cudaMemcpy(d0, w, rb * n_out, cudaMemcpyHostToDevice);
        ck_repack_q6_K(0, d0, d1, rb, n, n_out);
        ck_repack_q6_Kb(0, d1, d2, rb, n, n_out);
        CHECK(cudaMemcpy(got, d2, pb * n_out, cudaMemcpyDeviceToHost) == cudaSuccess);
        for (int r = 0; r < n_out; r++)
            for (int c = 0; c < nc; c++) {
                const uint8_t *b = w + (size_t)r * rb + (size_t)c * 210, *o = got + (size_t)r * pb + (size_t)c * 224;
                uint16_t dh;
                memcpy(&dh, b + 208, 2);
                float d = qt_fp16_to_fp32(dh);
                for (int sb = 0; sb < 16; sb++) {
                    uint16_t e = qt_fp32_to_fp16(d * (float)(int8_t)b[192 + sb]), g;
                    memcpy(&g, o + 2 * sb, 2);
                    if (g != e && bad++ < 5) fprintf(stderr, "q6b n=%d row %d sb %d: scale %04x, want %04x\n", n, r, sb, g, e);
                }
                for (int q = 0; q < 4; q++) {
                    const int of[4] = { 2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9 };
                    for (int gi = 0; gi < 4; gi++) {
                        uint32_t qh;
                        memcpy(&qh, o + 160 + 16 * q + 4 * gi, 4);
                        for (int t = 0; t < 4; t++) {
                            uint32_t ql;
                            memcpy(&ql, o + 32 + 64 * (gi >> 1) + 16 * q + 4 * (2 * (gi & 1) + (t >> 1)), 4);
                            for (int i = 0; i < 4; i++) {
                                int v = (((ql >> (8 * i + 4 * (t & 1))) & 15) | ((qh >> (8 * i + 2 * t)) & 3) << 4);
                                int e = gguf_q6(b, 16 * (4 * gi + t) + of[i]);
                                if (v != e && bad++ < 5)
                                    fprintf(stderr, "q6b n=%d row %d lane %d sub-block %d value %d: %d, want %d\n", n, r, q,
                                            4 * gi + t, of[i], v, e);
                            }
                        }
                    }
                }
            }
        CHECKF(bad == 0, "q6_K batched layout n=%d: %d values differ", n, bad);
        cudaFree(d0); cudaFree(d1); cudaFree(d2);
        free(w); free(got);
    }
#endif
}

/* The path switch: the device's features as probed, the kernels' choices
 * they make (q6_K's batched kernel only with warpgroup MMAs, the one-token
 * q8_0 bulk-copy GEMV only with bulk copies) and info's device line follow
 * the forced portable path and come back without it. */
static void test_paths(void)
{
#ifdef ANE_CUDA
    int dev = 0, ma = 0, mi = 0;
    CHECK(cudaGetDevice(&dev) == cudaSuccess);
    CHECK(cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess);
    CHECK(cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess);
    be_cuda_force_set(gpu, &(be_cuda_force){ 0 });
    const ck_feat *f = ck_feat_now();
    CHECKF(f->cc == 10 * ma + mi, "cc %d, device %d.%d", f->cc, ma, mi);
    CHECKF(f->code >= 80 && f->code <= f->cc, "code sm_%d on cc %d", f->code, f->cc);
    CHECK(f->pdl == (ma >= 9 && f->code >= 90));
    CHECK(f->bulk == (f->code >= 90));
    if (ma != 9) CHECK(!f->wgmma);
    CHECK(ck_mmqb_ok(QT_Q6_K, 4096) == f->wgmma);
    CHECK(ck_mmqb_ok(QT_Q4_K, 4096));
    CHECKF(strstr(gpu->device, f->wgmma ? "Hopper path" : "portable path") != NULL, "%s", gpu->device);
    printf("  %s\n", gpu->device);
    int hopper = f->wgmma;
    be_cuda_force_set(gpu, &(be_cuda_force){ .portable = 1 });
    f = ck_feat_now();
    CHECK(!f->wgmma && !f->bulk && !f->pdl);
    CHECK(!ck_mmqb_ok(QT_Q6_K, 4096));
    CHECKF(strstr(gpu->device, "portable path") != NULL, "%s", gpu->device);
    be_cuda_force_set(gpu, &(be_cuda_force){ 0 });
    CHECK(ck_feat_now()->wgmma == hopper);
    be_cuda_force_set(gpu, &(be_cuda_force){ .portable = portable });
#endif
}

/* t_cuda [NAME]: only the tests whose name holds NAME */
/* moe: the CUDA op against the CPU's on random weights of every type
 * (stacked experts), every gating and activation, with and without
 * biases: within 2e-2 (the CPU quantizes the activations of quantized
 * types to 8 bits; 1e-5 for f32), unless the CPU saw a router near-tie
 * (reported); batches with several tiles of an expert (T = 100); a token
 * alone the same bits as in a batch of 5 (the router by GEMV there). */
static void moe_gpu_case(uint32_t type, int gating, int act, int biases, int X, int K, int T)
{
    enum { E = 256, F = 256 };
    size_t rbg, rbu, rbd, rbr;
    wt gate = { .type = type, .n_in = E, .n_out = (int64_t)X * F, .n_mat = X },
       up = { .type = type, .n_in = E, .n_out = (int64_t)X * F, .n_mat = X },
       down = { .type = type, .n_in = F, .n_out = (int64_t)X * E, .n_mat = X },
       router = { .type = QT_F32, .n_in = E, .n_out = X };
    gate.data = kept(make_weight(type, E, X * F, &rbg));
    up.data = kept(make_weight(type, E, X * F, &rbu));
    down.data = kept(make_weight(type, F, X * E, &rbd));
    router.data = kept(make_weight(QT_F32, E, X, &rbr));
    gate.row_bytes = rbg; up.row_bytes = rbu; down.row_bytes = rbd; router.row_bytes = rbr;
    float *rb = kept(malloc((size_t)X * 4)), *gb = kept(malloc((size_t)X * F * 4)), *ub = kept(malloc((size_t)X * F * 4)),
          *db = kept(malloc((size_t)X * E * 4));
    for (int i = 0; i < X; i++) rb[i] = frand();
    for (int i = 0; i < X * F; i++) { gb[i] = frand() * 0.3f; ub[i] = frand() * 0.3f; }
    for (int i = 0; i < X * E; i++) db[i] = frand() * 0.1f;
    wt rbw = { .type = QT_F32, .n_in = X, .n_out = 1, .row_bytes = (size_t)X * 4, .data = rb },
       gbw = { .type = QT_F32, .n_in = F, .n_out = X, .row_bytes = (size_t)F * 4, .data = gb },
       ubw = { .type = QT_F32, .n_in = F, .n_out = X, .row_bytes = (size_t)F * 4, .data = ub },
       dbw = { .type = QT_F32, .n_in = E, .n_out = X, .row_bytes = (size_t)E * 4, .data = db };
    wt *all[] = { &gate, &up, &down, &router, &rbw, &gbw, &ubw, &dbw };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK(gpu->ops->weight_prepare(gpu, all[i]) == 0);
    be_moe m = { .n_expert = X, .n_used = K, .n_ff = F, .gating = gating, .norm = gating != BE_MOE_TOPK_SOFTMAX,
                 .act = act, .alpha = 1.702f, .limit = 0.5f, .router = &router, .router_b = biases ? &rbw : NULL,
                 .gate = &gate, .up = &up, .down = &down, .gate_b = biases ? &gbw : NULL,
                 .up_b = biases ? &ubw : NULL, .down_b = biases ? &dbw : NULL };
    float *x = malloc((size_t)T * E * 4), *yc = malloc((size_t)T * E * 4), *yg = malloc((size_t)T * E * 4),
          *y1 = malloc((size_t)E * 4);
    for (int i = 0; i < T * E; i++) x[i] = frand();
    void *sc = cpu->ops->alloc(cpu, cpu->ops->moe_scratch(cpu, &m, T));
    void *sg = gpu->ops->alloc(gpu, gpu->ops->moe_scratch(gpu, &m, T));
    be_cpu_moe_ties(cpu);
    cpu->ops->moe(cpu, &m, x, T, sc, yc);
    long ties = be_cpu_moe_ties(cpu);
    float *dx = dev_from(gpu, x, (size_t)T * E), *dy = gpu->ops->alloc(gpu, (size_t)T * E * 4);
    gpu->ops->moe(gpu, &m, dx, T, sg, dy);
    gpu->ops->to_host(gpu, yg, dy, (size_t)T * E * 4);
    gpu->ops->sync(gpu);
    /* the CPU quantizes the activations of both matmuls to 8 bits (its
     * dot products' format), the GPU's expert matmuls keep them in f32: on
     * an H200 the two differ by 0.020-0.029 relative for the 2- and 3-bit
     * types and the clamped SwiGLU with biases; a wrong expert, weight or
     * bias is off by far more */
    double e = rel_err_f(yg, yc, (size_t)T * E), tol = type == QT_F32 ? 1e-5 : 4e-2;
    if (ties)
        fprintf(stderr, "  moe %s gating %d: %ld router near-ties on the CPU, not compared\n", qt_name(type), gating,
                ties);
    else
        CHECKF(e <= tol, "moe %s gating %d act %d biases %d X %d K %d T %d: rel err %.3g (tol %g)", qt_name(type),
               gating, act, biases, X, K, T, e, tol);
    if (T <= 8) {
        int same = 1;
        for (int t = 0; t < T; t++) {
            gpu->ops->moe(gpu, &m, dx + (size_t)t * E, 1, sg, dy);
            gpu->ops->to_host(gpu, y1, dy, (size_t)E * 4);
            gpu->ops->sync(gpu);
            same &= memcmp(y1, yg + (size_t)t * E, (size_t)E * 4) == 0;
        }
        CHECKF(same, "moe %s: a token alone differs from its batch of %d", qt_name(type), T);
    }
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dy);
    gpu->ops->free(gpu, sg);
    cpu->ops->free(cpu, sc);
    free(x); free(yc); free(yg); free(y1);
}

static void test_moe(void)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        moe_gpu_case(TYPES[ti], BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 8, 2, 5);
        moe_gpu_case(TYPES[ti], BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 8, 2, 100);
    }
    for (int g = BE_MOE_SOFTMAX; g <= BE_MOE_SIGMOID; g++)
        for (int a = BE_MOE_SILU; a <= BE_MOE_SWIGLU_OAI; a++) moe_gpu_case(QT_Q8_0, g, a, 1, 8, 3, 7);
    moe_gpu_case(QT_Q4_K, BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 128, 8, 3);    /* Qwen3-30B-A3B's routing */
    moe_gpu_case(QT_BF16, BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 4, 4, 40);     /* every expert */
}

static const char *only;
#define RUN_SOME(fn) do { if (!only || strstr(#fn, only)) RUN(fn); } while (0)

int main(int argc, char **argv)
{
    char err[256];
    only = argc > 1 ? argv[1] : NULL;
    if (pool_open(&pl, 2)) return 1;
    if (gpu_open(&gpu, 1, NULL, err, sizeof err)) {
        fprintf(stderr, "t_cuda: %s: nothing to test\n", err);
        pool_close(pl);
        return CHECK_DONE();
    }
    if (gpu_open(&gpu32, 0, NULL, err, sizeof err) || be_open(&cpu, "cpu", pl, 1, err, sizeof err) ||
        be_open(&cpu32, "cpu", pl, 0, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* every test twice on a Hopper card: its own path, then the portable
     * one of 8.x devices (on others, the portable path once) */
    for (portable = 0; portable < 2; portable++) {
#ifdef ANE_CUDA
        const ck_feat *own = ck_feat_now();
        if (portable && !own->wgmma && !own->bulk && !own->pdl) break;
        be_cuda_force_set(gpu, &(be_cuda_force){ .portable = portable });
        be_cuda_force_set(gpu32, &(be_cuda_force){ .portable = portable });
        printf("%s path\n", portable ? "portable" : "the device's own");
#endif
        RUN_SOME(test_paths);
        RUN_SOME(test_q6b_layout);
        RUN_SOME(test_matmul);
        RUN_SOME(test_mmqb);
        RUN_SOME(test_fused);
        RUN_SOME(test_embed);
        RUN_SOME(test_elementwise);
        RUN_SOME(test_norms);
        RUN_SOME(test_rope);
        RUN_SOME(test_rope_kv);
        RUN_SOME(test_rope_attention);
        RUN_SOME(test_qkv_rope);
        RUN_SOME(test_fused_quant);
        RUN_SOME(test_glu);
        RUN_SOME(test_glu_batched);
        RUN_SOME(test_attention);
        RUN_SOME(test_att_group);
        RUN_SOME(test_attention_ex);
        RUN_SOME(test_gelu_layernorm);
        RUN_SOME(test_argmax);
        RUN_SOME(test_ssm_elementwise);
        RUN_SOME(test_conv1d);
        RUN_SOME(test_deltanet);
        RUN_SOME(test_moe);
        if (gpu_open(&gpuv, 1, &(be_cuda_force){ .gemv_all = 1 }, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        RUN_SOME(test_invariance);
        RUN_SOME(test_deterministic);
        gpuv->ops->close(gpuv);
    }
    gpu->ops->close(gpu); gpu32->ops->close(gpu32); cpu->ops->close(cpu); cpu32->ops->close(cpu32);
    pool_close(pl);
    for (int i = 0; i < n_keep; i++) free(keep[i]);
    return CHECK_DONE();
}
