/* t_cuda_gemv — matmul of every weight type (the GEMV, the batched q4_K/q6_K
 * kernels and cuBLAS) against the dequantized weights in double, matmul_n,
 * matmul_glu and the GEMV input quantized by its producer bit for bit against
 * the plain ops, batch invariance, deterministic passes and q6_K's repacked
 * layout. */
#include "tests/unit/t_cuda.h"

void test_matmul(void)
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
                /* int8 activations (q4_K, q8_0, q6_K of whole super-block pairs GEMV; q4_K
                 * 17..32 rows: f16 tensor cores on the quantized weights); else f32 GEMV,
                 * f16 tensor cores from 9 */
                int i8 = type == QT_Q4_K || type == QT_Q8_0 || (type == QT_Q6_K && n_in % 512 == 0) ||
                         type == QT_IQ4_NL || type == QT_IQ4_XS || type == QT_MXFP4;
                double tol = i8 ? 1e-2 : T > 8 ? 2e-3 : 2e-5;
                const char *vs = "";
                if (i8 && T < 9) {   /* (outside a pass the GEMV takes batches under GEMM_MIN_T, 9) */
                    /* the GEMV's rows: against x as its quantizer gives it (per
                     * 32 values d = amax / 127, q = x / d rounded to even: the
                     * same float operations), so only the kernel's own rounding
                     * is left (a few rows' 0.4% activation error had left a
                     * 1e-2 bound to chance) */
                    for (int t = 0; t < T; t++) {
                        const float *xt = x + (size_t)t * n_in;
                        double *xq = malloc((size_t)n_in * sizeof *xq);
                        for (int b0 = 0; b0 < n_in; b0 += 32) {
                            float amax = 0.f;
                            for (int i = b0; i < b0 + 32; i++) amax = fmaxf(amax, fabsf(xt[i]));
                            float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
                            for (int i = b0; i < b0 + 32; i++) xq[i] = (double)rintf(xt[i] * id) * d;
                        }
                        for (int r = 0; r < n_out; r++) {
                            double s2 = use_bias ? bias[r] : 0;
                            for (int i = 0; i < n_in; i++) s2 += (double)wf[(size_t)r * n_in + i] * xq[i];
                            ref[(size_t)t * n_out + r] = s2;
                        }
                        free(xq);
                    }
                    tol = 1e-3;
                    vs = " against the quantized x";
                }
                double e = rel_err(y, ref, (size_t)T * n_out);
                CHECKF(e <= tol, "matmul %s %dx%d T=%d: rel err %.3g%s (tol %g)", qt_name(type), n_out, n_in, T, e,
                       vs, tol);
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
void test_mmqb(void)
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
void test_fused(void)
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

void test_glu(void)
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
void test_glu_batched(void)
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

void test_fused_quant(void)
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

/* Batch invariance of matmul: a row's result has the same bits whatever the
 * batch size and its place in the batch: the GEMV of every type at every
 * tile size (gpuv: a backend whose GEMV takes every batch). (Prompt rows go
 * through cuBLAS, whose kernel choice follows the batch size: not tested
 * here.) */
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

void test_invariance(void)
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
void test_deterministic(void)
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
void test_q6b_layout(void)
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
