/* t_backend's CUDA part — every op of the CUDA backend against the CPU reference on random
 * data: matmul for every weight type (the GEMV path and the cuBLAS path) against
 * the dequantized weights in double, embedding rows bit-exact, and rmsnorm,
 * add, silu_mul, rope, kv_store + paged attention (f16 and f32 caches, GQA,
 * several sequences, prefill and split decode) against the CPU backend's ops,
 * and the linear-attention ops (copy_rows, sigmoid_mul, rmsnorm_gated, the
 * causal conv and the delta rule with per-sequence state and save points),
 * and the fused ops bit for bit against the plain ones (rope_kv; GEMV input
 * quantized by the op that produced it), and the mixture-of-experts op.
 * The topics sit in t_cuda_*.c over t_cuda.h; this file holds the shared
 * helpers, the path switch's test and t_cuda_run, which t_backend's main
 * calls in CUDA builds after the CPU ops. */
#include "tests/unit/t_cuda.h"

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
uint32_t rnd(void)
{
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 11);
}
float frand(void) { return (float)rnd() / 2097152.0f / 1024.0f * 2.0f - 1.0f; }  /* [-1, 1) */

double rel_err(const float *a, const double *ref, size_t n)
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

double rel_err_f(const float *a, const float *ref, size_t n)
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

void put_f16(uint8_t *p, float v) { uint16_t h = qt_fp32_to_fp16(v); memcpy(p, &h, 2); }

/* Random weight bytes of a valid layout: random quants, small positive scales. */
void *make_weight(uint32_t type, int n_in, int n_out, size_t *row_bytes)
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

be *gpu, *gpu32, *cpu, *cpu32, *gpuv;
/* weight bytes stay alive to the end: backends key uploads by host pointer */
static void *keep[1024];
static int n_keep;
void *kept(void *p) { if (n_keep < 1024) keep[n_keep++] = p; return p; }
pool *pl;

/* 1 in the second round of the tests: every backend on the portable path
 * (no Hopper feature), as on an 8.x device */
int portable;

/* A CUDA backend with the paths f forces (NULL: the defaults), in this
 * round's path */
int gpu_open(be **b, int kv_type, const be_cuda_force *f, char *err, size_t errlen)
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
void page_perm(int32_t *perm, int n)
{
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) { int j = (int)(rnd() % (uint32_t)(i + 1)); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
}

float *dev_from(be *b, const float *h, size_t n)
{
    float *d = b->ops->alloc(b, n * 4);
    b->ops->to_dev(b, d, h, n * 4);
    return d;
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


#define RUN_SOME(fn) do { if (!only || strstr(#fn, only)) RUN(fn); } while (0)

int t_cuda_run(const char *only)
{
    char err[256];
    if (pool_open(&pl, 2)) return -1;
    if (gpu_open(&gpu, 1, NULL, err, sizeof err)) {
        fprintf(stderr, "t_backend: %s: no CUDA op to test\n", err);
        pool_close(pl);
        return 0;
    }
    if (gpu_open(&gpu32, 0, NULL, err, sizeof err) || be_open(&cpu, "cpu", pl, 1, err, sizeof err) ||
        be_open(&cpu32, "cpu", pl, 0, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
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
        RUN_SOME(test_attention_prompt);
        RUN_SOME(test_gelu_layernorm);
        RUN_SOME(test_argmax);
        RUN_SOME(test_argmax_mask);
        RUN_SOME(test_ssm_elementwise);
        RUN_SOME(test_conv1d);
        RUN_SOME(test_deltanet);
        RUN_SOME(test_moe);
        RUN_SOME(test_int8_prompt);
        if (gpu_open(&gpuv, 1, &(be_cuda_force){ .gemv_all = 1 }, err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
        RUN_SOME(test_invariance);
        RUN_SOME(test_deterministic);
        gpuv->ops->close(gpuv);
    }
    gpu->ops->close(gpu); gpu32->ops->close(gpu32); cpu->ops->close(cpu); cpu32->ops->close(cpu32);
    pool_close(pl);
    for (int i = 0; i < n_keep; i++) free(keep[i]);
    return 0;
}
