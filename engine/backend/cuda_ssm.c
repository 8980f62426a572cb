/* cuda_ssm.c — the CUDA backend's linear-attention ops (host side;
 * kernels in shaders/ssm.cu): the recurrent ones run a batch in segments
 * that end at the save points, copying the state there. */
#ifdef ANE_CUDA

#include "engine/backend/cuda_be.h"
#include "shaders/ssm.h"

void cu_copy_rows(be *b, float *dst, size_t ds, const float *src, size_t ss, int rows, int n)
{
    tag_clear((cu_be *)b);
    cs_copy_rows(((cu_be *)b)->st, dst, ds, src, ss, rows, n);
}

void cu_sigmoid_mul(be *b, float *x, const float *g, size_t n)
{
    tag_clear((cu_be *)b);
    cs_sigmoid_mul(((cu_be *)b)->st, x, g, n);
}

void cu_rmsnorm_gated(be *b, const float *x, const float *z, const wt *w, int rows, int n, float eps,
                      float *out)
{
    tag_clear((cu_be *)b);
    cs_rmsnorm_gated(((cu_be *)b)->st, x, z, w->dev, rows, n, eps, out);
}

static int ssm_fail(cu_be *c, const char *what)
{
    if (!c->failed) fprintf(stderr, "cuda backend: %s\n", what);
    c->failed = 1;
    return -1;
}

/* Save points need the host batch: never inside a recorded pass. */
static int ssm_ready(cu_be *c, const be_batch *bt, int n_sv)
{
    tag_clear(c);
    if (!bt->slot) return ssm_fail(c, "recurrent op without sequence slots");
    if (n_sv > 0 && c->capturing) return ssm_fail(c, "save points in a recorded pass");
    cu_use_batch(c, bt);
    return 0;
}

/* The batch is run in segments t0..t1-1 that end at tokens with save points. */
static int ssm_seg_end(const be_batch *bt, int t0, const be_save *sv, int n_sv)
{
    for (int t = t0; t < bt->T; t++)
        for (int i = 0; i < n_sv; i++)
            if (sv[i].slot == bt->slot[t] && sv[i].pos == bt->pos[t] + 1) return t + 1;
    return bt->T;
}

/* After a segment ending at token t1-1: the state of the save points there. */
static void ssm_saves(cu_be *c, const be_batch *bt, int t1, const be_save *sv, int n_sv, const float *state,
                      size_t slot_floats)
{
    int t = t1 - 1;
    for (int i = 0; i < n_sv; i++)
        if (sv[i].slot == bt->slot[t] && sv[i].pos == bt->pos[t] + 1 && slot_floats)
            ok(c, cudaMemcpyAsync(sv[i].dst, state + (size_t)sv[i].slot * slot_floats, slot_floats * 4,
                                  cudaMemcpyDeviceToDevice, c->st), "save point");
}

void cu_conv1d_silu(be *b, const float *x, const wt *w, float *state, const be_batch *bt, int C, int K,
                    const be_save *sv, int n_sv, float *out)
{
    cu_be *c = (cu_be *)b;
    if (ssm_ready(c, bt, n_sv)) return;
    for (int t0 = 0; t0 < bt->T;) {
        int t1 = n_sv > 0 ? ssm_seg_end(bt, t0, sv, n_sv) : bt->T;
        if (cs_conv1d_silu(c->st, x, w->dev, state, d_pos(c), d_slot(c), t0, t1, C, K, out)) {
            ssm_fail(c, "conv1d: unsupported kernel size");
            return;
        }
        if (n_sv > 0) ssm_saves(c, bt, t1, sv, n_sv, state, (size_t)(K - 1) * C);
        t0 = t1;
    }
}

void cu_deltanet(be *b, const float *qkv, size_t stride, const float *a, const float *bb, const wt *A,
                 const wt *dt_bias, float *state, const be_batch *bt, int nk, int nv, int dk, int dv,
                        float eps, const be_save *sv, int n_sv, float *out)
{
    cu_be *c = (cu_be *)b;
    if (ssm_ready(c, bt, n_sv)) return;
    for (int t0 = 0; t0 < bt->T;) {
        int t1 = n_sv > 0 ? ssm_seg_end(bt, t0, sv, n_sv) : bt->T;
        if (cs_deltanet(c->st, qkv, stride, a, bb, A->dev, dt_bias->dev, state, d_pos(c), d_slot(c), t0, t1, nk,
                        nv, dk, dv, eps, out)) {
            ssm_fail(c, "deltanet: unsupported head size");
            return;
        }
        if (n_sv > 0) ssm_saves(c, bt, t1, sv, n_sv, state, (size_t)nv * dk * dv);
        t0 = t1;
    }
}

#else
typedef int backend_cuda_ssm_unused;   /* CPU-only builds: nothing here */
#endif
