/* t_cuda_moe — the mixture-of-experts op against the CPU's. */
#include "tests/unit/t_cuda.h"

/* moe: the CUDA op against the CPU's on random weights of every type
 * (stacked experts), every gating and activation, with and without
 * biases: within the tolerances below, unless the CPU saw a router
 * near-tie (reported); batches with several tiles of an expert (T = 100);
 * a token alone the same bits as in its batch, also where the batch takes
 * the tiled down products and the token alone the per-token kernel (more
 * pairs than experts: X 8, K 2, T 5). */
static void moe_gpu_case_ef(uint32_t type, int gating, int act, int biases, int X, int K, int T, int E, int F)
{
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
    /* The CPU quantizes the activations of both matmuls to 8 bits (its
     * dot products' format). The GPU's int8 experts (ck_moe_int8) do so
     * too, per 32 values: where the CPU's format is also per 32 (q8_0,
     * q8_1) only the sums' order and the odd rounding of a value that a
     * last-bit difference moves across a step differ (on an H100 at most
     * 0.0029 relative over these cases; 5e-3); per 256 (q8_K)
     * the two roundings differ. The other types keep f32: on an H200 the
     * two differ by 0.020-0.029 relative for the 2- and 3-bit types and the
     * clamped SwiGLU with biases; a wrong expert, weight or bias is off by
     * far more. */
    uint32_t at = qt_act_type(type);
    int i8 = ck_moe_int8(type, E), same32 = i8 && (at == QT_Q8_0 || at == QT_Q8_1);
    double e = rel_err_f(yg, yc, (size_t)T * E), tol = type == QT_F32 ? 1e-5 : same32 ? 5e-3 : 4e-2;
    if (ties)
        fprintf(stderr, "  moe %s gating %d: %ld router near-ties on the CPU, not compared\n", qt_name(type), gating,
                ties);
    else
        CHECKF(e <= tol, "moe %s gating %d act %d biases %d X %d K %d T %d: rel err %.3g (tol %g)", qt_name(type),
               gating, act, biases, X, K, T, e, tol);
    if (T <= 8) {   /* (larger batches: the router's matmul is not batch-invariant) */
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

static void moe_gpu_case(uint32_t type, int gating, int act, int biases, int X, int K, int T)
{
    moe_gpu_case_ef(type, gating, act, biases, X, K, T, 256, 256);
}

void test_moe(void)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        moe_gpu_case(TYPES[ti], BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 8, 2, 5);
        moe_gpu_case(TYPES[ti], BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 8, 2, 100);
    }
    for (int g = BE_MOE_SOFTMAX; g <= BE_MOE_SIGMOID; g++)
        for (int a = BE_MOE_SILU; a <= BE_MOE_SWIGLU_OAI; a++) moe_gpu_case(QT_Q8_0, g, a, 1, 8, 3, 7);
    moe_gpu_case(QT_Q4_K, BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 128, 8, 3);    /* Qwen3-30B-A3B's routing */
    moe_gpu_case(QT_Q4_K, BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 128, 8, 40);   /* its batches: tiles, route apart */
    moe_gpu_case(QT_MXFP4, BE_MOE_TOPK_SOFTMAX, BE_MOE_SWIGLU_OAI, 1, 16, 4, 6);   /* gpt-oss's kind */
    moe_gpu_case(QT_BF16, BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 4, 4, 40);     /* every expert */
    /* prompt batches (the tensor-core tiles): an expert's tokens over two
     * tiles, the last one part full; rows and values that leave part of a
     * block's rows and of its last stage (96: three chunks) */
    moe_gpu_case(QT_Q4_K, BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 4, 2, 200);
    moe_gpu_case(QT_Q6_K, BE_MOE_SOFTMAX, BE_MOE_SILU, 0, 4, 2, 70);
    moe_gpu_case_ef(QT_Q8_0, BE_MOE_SOFTMAX, BE_MOE_SILU, 1, 4, 2, 90, 96, 96);
    moe_gpu_case_ef(QT_MXFP4, BE_MOE_TOPK_SOFTMAX, BE_MOE_SWIGLU_OAI, 1, 8, 4, 50, 96, 160);
    moe_gpu_case_ef(QT_Q4_1, BE_MOE_SIGMOID, BE_MOE_GELU, 0, 4, 1, 60, 160, 96);
}

/* A model with experts (be_opts.act_int8): its int8 matrices take prompt
 * batches on int8 tensor cores, the int8 GEMV's arithmetic with the sums
 * in another order; a deterministic daemon keeps the GEMV. The two agree
 * to f32 rounding, for each type, rows and tokens that leave part of a
 * tile (bias or not); decode-sized batches are the GEMV's bits. */
void test_int8_prompt(void)
{
    static const uint32_t ty[] = { QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_MXFP4, QT_IQ4_NL, QT_IQ4_XS };
    char err[256];
    be *tc = NULL, *gv = NULL;
    const be_opts o = { .kv_type = BE_KV_F16, .act_int8 = 1 }, od = { .kv_type = BE_KV_F16, .act_int8 = 1,
                                                                      .deterministic = 1 };
    int bad = be_open_opts(&tc, "cuda", pl, &o, err, sizeof err) || be_open_opts(&gv, "cuda", pl, &od, err, sizeof err);
    CHECKF(!bad, "%s", err);
    if (bad) return;
    for (size_t k = 0; k < sizeof ty / sizeof ty[0]; k++) {
        const int n = ty[k] == QT_Q6_K ? 1024 : 512, rows = 300, Ts[] = { 70, 33, 8 };
        size_t rb;
        void *wd = kept(make_weight(ty[k], n, rows, &rb));
        wt w1 = { .type = ty[k], .n_in = n, .n_out = rows, .row_bytes = rb, .data = wd }, w2 = w1;
        float *bh = kept(malloc((size_t)rows * 4));
        for (int i = 0; i < rows; i++) bh[i] = frand();
        wt b1 = { .type = QT_F32, .n_in = rows, .n_out = 1, .row_bytes = (size_t)rows * 4, .data = bh }, b2 = b1;
        CHECK(tc->ops->weight_prepare(tc, &w1) == 0 && tc->ops->weight_prepare(tc, &b1) == 0);
        CHECK(gv->ops->weight_prepare(gv, &w2) == 0 && gv->ops->weight_prepare(gv, &b2) == 0);
        for (int ti = 0; ti < 3; ti++) {
            const int T = Ts[ti];
            float *x = malloc((size_t)T * n * 4), *ya = malloc((size_t)T * rows * 4),
                  *yb = malloc((size_t)T * rows * 4);
            for (int i = 0; i < T * n; i++) x[i] = frand();
            float *xa = dev_from(tc, x, (size_t)T * n), *xb = dev_from(gv, x, (size_t)T * n);
            float *da = tc->ops->alloc(tc, (size_t)T * rows * 4), *db = gv->ops->alloc(gv, (size_t)T * rows * 4);
            tc->ops->matmul(tc, &w1, ti & 1 ? &b1 : NULL, xa, T, da);
            gv->ops->matmul(gv, &w2, ti & 1 ? &b2 : NULL, xb, T, db);
            tc->ops->to_host(tc, ya, da, (size_t)T * rows * 4);
            gv->ops->to_host(gv, yb, db, (size_t)T * rows * 4);
            tc->ops->sync(tc);
            gv->ops->sync(gv);
            double e = rel_err_f(ya, yb, (size_t)T * rows);
            if (T <= 8)
                CHECKF(memcmp(ya, yb, (size_t)T * rows * 4) == 0, "int8 %s T %d: not the GEMV's bits", qt_name(ty[k]),
                       T);
            else
                CHECKF(e <= 1e-5, "int8 prompt %s n %d rows %d T %d: rel err %.3g against the GEMV", qt_name(ty[k]), n,
                       rows, T, e);
            tc->ops->free(tc, xa); tc->ops->free(tc, da);
            gv->ops->free(gv, xb); gv->ops->free(gv, db);
            free(x); free(ya); free(yb);
        }
    }
    tc->ops->close(tc);
    gv->ops->close(gv);
}
