/* t_cuda_ssm — the linear-attention ops (copy_rows, sigmoid_mul,
 * rmsnorm_gated, the causal conv and the delta rule with per-sequence state
 * and save points) against the CPU backend. */
#include "tests/unit/t_cuda.h"

/* ---- linear-attention ops against the CPU backend ---- */

void test_ssm_elementwise(void)
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

void test_conv1d(void)
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

void test_deltanet(void)
{
    if (!gpu->ops->deltanet) { CHECK(gpu->ops->deltanet != NULL); return; }
    deltanet_case(2, 4, 128, 128);   /* the Qwen3.5 head shape, tiled value heads */
    deltanet_case(1, 3, 64, 64);
    deltanet_case(2, 2, 48, 80);     /* value columns not a multiple of a warp */
    deltanet_case(2, 4, 160, 96);
    deltanet_case(1, 2, 256, 256);   /* state too large for shared memory: in global memory */
}
