// ssm.cu — the CUDA backend's kernels for linear-attention (Gated
// DeltaNet) and gated-attention layers; contracts in shaders/ssm.h and
// engine/backend.h, reference in engine/backend_cpu_ssm.c.
//
// The recurrent ops walk each sequence's tokens in batch order on the device:
// the conv with one thread per channel over the whole batch, the delta rule
// with one block per (sequence, value head) and one thread per value column,
// the column of the state in shared memory where it fits. The block
// of a batch token that is not its sequence's first in t0..t1 exits at once,
// so the launch shape depends on the batch size only.
#include "shaders/ssm.h"

#include "shaders/common.cuh"

#include <math.h>
#include <stdint.h>

__global__ void k_copy_rows(float *dst, size_t ds, const float *src, size_t ss, int n, size_t total)
{
    pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)n, k = i % (size_t)n;
        dst[r * ds + k] = src[r * ss + k];
    }
}

__global__ void k_sigmoid_mul(float *x, const float *g, size_t n)
{
    pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = x[i] / (1.0f + expf(-g[i]));
}

// One block per row; x and out may be the same.
__global__ void k_rmsnorm_gated(const float *x, const float *z, const float *w, int n, float eps, float *out)
{
    pdl_begin();
    const float *xr = x + (size_t)blockIdx.x * n, *zr = z + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    __shared__ float red[32];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x + 31) / 32 ? red[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    float scale = (float)(1.0 / sqrt((double)red[0] / n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float zv = zr[i];
        o[i] = xr[i] * scale * w[i] * (zv / (1.0f + expf(-zv)));
    }
}

// One thread per channel, walking the tokens t0..t1-1 in order; the state
// rows of a slot are C floats apart. x and out may be the same.
__global__ void k_conv1d_silu(const float *x, const float *__restrict__ w, float *state, const int32_t *pos,
                              const int32_t *slot, int t0, int t1, int C, int K, float *out)
{
    pdl_begin();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float *wc = w + (size_t)c * K;
    size_t slot_sz = (size_t)(K - 1) * C;
    for (int t = t0; t < t1; t++) {
        float *st = state + (size_t)slot[t] * slot_sz + c;
        if (pos[t] == 0)
            for (int p = 0; p < K - 1; p++) st[(size_t)p * C] = 0.f;
        float xc = x[(size_t)t * C + c], y = wc[K - 1] * xc;
        for (int p = 0; p < K - 1; p++) y += wc[p] * st[(size_t)p * C];
        for (int p = 0; p + 1 < K - 1; p++) st[(size_t)p * C] = st[(size_t)(p + 1) * C];
        if (K > 1) st[(size_t)(K - 2) * C] = xc;
        out[(size_t)t * C + c] = y / (1.0f + expf(-y));
    }
}

// Block (token t0 + blockIdx.x, value head blockIdx.y); thread c owns column c
// of the head's state S [dk][dv] (rows dv apart), which no other thread
// touches: in shared memory when SM (loaded at the walk's first token,
// written back at its end), else in global memory. Shared: q, k of the
// current token [2][dk], then S.
template <bool SM>
__global__ void __launch_bounds__(1024)
k_deltanet(const float *__restrict__ qkv, size_t stride, const float *__restrict__ a, const float *__restrict__ bb,
           const float *__restrict__ A, const float *__restrict__ dtb, float *state, const int32_t *pos,
           const int32_t *slot, int t0, int t1, int nk, int nv, int dk, int dv, float eps, float qscale,
           float *out)
{
    pdl_begin();
    int t = t0 + blockIdx.x, h = blockIdx.y, c = threadIdx.x, nt = blockDim.x;
    int s = slot[t];
    for (int u = t - 1; u >= t0; u--)
        if (slot[u] == s) return;   // the block of the sequence's first token walks this one
    extern __shared__ float sm[];
    float *qs = sm, *ks = sm + dk;
    __shared__ float red[2][32];
    __shared__ float gate[4];
    int kh = h % nk;
    bool act = c < dv;
    float *Sg = state + ((size_t)s * nv + h) * (size_t)dk * dv + c;
    float *S = SM ? sm + 2 * (size_t)dk + c : Sg;
    bool loaded = false;
    for (int u = t; u < t1; u++) {
        if (slot[u] != s) continue;
        const float *row = qkv + (size_t)u * stride;
        float pq = 0.f, pk = 0.f;
        for (int i = c; i < dk; i += nt) {
            float qv = row[(size_t)kh * dk + i], kv = row[(size_t)(nk + kh) * dk + i];
            qs[i] = qv;
            ks[i] = kv;
            pq += qv * qv;
            pk += kv * kv;
        }
        pq = warp_sum(pq);
        pk = warp_sum(pk);
        if ((c & 31) == 0) { red[0][c >> 5] = pq; red[1][c >> 5] = pk; }
        __syncthreads();
        if (c < 32) {
            int nw = (nt + 31) / 32;
            float vq = c < nw ? red[0][c] : 0.f, vk = c < nw ? red[1][c] : 0.f;
            vq = warp_sum(vq);
            vk = warp_sum(vk);
            if (c == 0) {
                float x = a[(size_t)u * nv + h] + dtb[h];
                float sp = x > 20.f ? x : log1pf(expf(x));
                gate[0] = expf(A[h] * sp);
                gate[1] = 1.0f / (1.0f + expf(-bb[(size_t)u * nv + h]));
                gate[2] = (float)(qscale / sqrt((double)vq + eps));
                gate[3] = (float)(1.0 / sqrt((double)vk + eps));
            }
        }
        __syncthreads();
        float sq = gate[2], sk = gate[3];
        for (int i = c; i < dk; i += nt) { qs[i] *= sq; ks[i] *= sk; }
        __syncthreads();
        float e = gate[0], beta = gate[1];
        if (act) {
            if (pos[u] == 0)
                for (int d = 0; d < dk; d++) S[(size_t)d * dv] = 0.f;
            else if (SM && !loaded)
                for (int d = 0; d < dk; d++) S[(size_t)d * dv] = Sg[(size_t)d * dv];
            float v = row[(size_t)2 * nk * dk + (size_t)h * dv + c];
            float kS = 0.f, o = 0.f;
            for (int d = 0; d < dk; d++) kS += ks[d] * S[(size_t)d * dv];
            float uu = (v - e * kS) * beta;
            for (int d = 0; d < dk; d++) {
                float sv = S[(size_t)d * dv] * e + ks[d] * uu;
                S[(size_t)d * dv] = sv;
                o += qs[d] * sv;
            }
            out[((size_t)u * nv + h) * dv + c] = o;
        }
        loaded = true;
        __syncthreads();   // q, k of the next token overwrite these
    }
    if (SM && act && loaded)
        for (int d = 0; d < dk; d++) Sg[(size_t)d * dv] = S[(size_t)d * dv];
}

static unsigned ew_blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

extern "C" {

void cs_copy_rows(cudaStream_t st, float *dst, size_t dst_stride, const float *src, size_t src_stride, int rows,
                  int n)
{
    size_t total = (size_t)rows * (size_t)(n > 0 ? n : 0);
    if (!total) return;
    lk(k_copy_rows, ew_blocks(total), 256, 0, st, dst, dst_stride, src, src_stride, n, total);
}

void cs_sigmoid_mul(cudaStream_t st, float *x, const float *g, size_t n)
{
    if (!n) return;
    lk(k_sigmoid_mul, ew_blocks(n), 256, 0, st, x, g, n);
}

void cs_rmsnorm_gated(cudaStream_t st, const float *x, const float *z, const float *w, int rows, int n, float eps,
                      float *out)
{
    if (rows <= 0 || n <= 0) return;
    int bs = (n + 31) / 32 * 32;
    if (bs > 256) bs = 256;
    lk(k_rmsnorm_gated, rows, bs, 0, st, x, z, w, n, eps, out);
}

int cs_conv1d_silu(cudaStream_t st, const float *x, const float *w, float *state, const int32_t *pos,
                   const int32_t *slot, int t0, int t1, int C, int K, float *out)
{
    if (K < 1 || K > CS_CONV_KMAX) return -1;
    if (t1 <= t0 || C <= 0) return 0;
    lk(k_conv1d_silu, (C + 127) / 128, 128, 0, st, x, w, state, pos, slot, t0, t1, C, K, out);
    return 0;
}

int cs_deltanet(cudaStream_t st, const float *qkv, size_t stride, const float *a, const float *bb, const float *A,
                const float *dt_bias, float *state, const int32_t *pos, const int32_t *slot, int t0, int t1,
                int nk, int nv, int dk, int dv, float eps, float *out)
{
    /* shared memory beyond 48 KiB is opted into once, up to the device's limit */
    static int sm_max = -1;   /* dynamic shared memory of k_deltanet<true> */
    if (sm_max < 0) {
        int dev = 0, v = 0;
        cudaFuncAttributes fa;
        sm_max = (48 << 10) - 1024;
        int good = cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
                   cudaFuncGetAttributes(&fa, k_deltanet<true>) == cudaSuccess;
        int dyn = good ? v - (int)fa.sharedSizeBytes : 0;
        if (good && dyn > sm_max) {
            if (cudaFuncSetAttribute(k_deltanet<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn) == cudaSuccess)
                sm_max = dyn;
            else
                good = 0;
        }
        if (!good) cudaGetLastError();   /* only this query's error */
    }
    if (dv < 1 || dv > CS_DN_DVMAX || dk < 1 || dk > 4096 || nk < 1 || nv < 1) return -1;
    if (t1 <= t0) return 0;
    int bs = (dv + 31) / 32 * 32;
    dim3 g((unsigned)(t1 - t0), (unsigned)nv);
    size_t qk = (size_t)2 * dk * sizeof(float), full = qk + (size_t)dk * dv * sizeof(float);
    float qscale = 1.0f / sqrtf((float)dk);
    if (full <= (size_t)sm_max)
        lk(k_deltanet<true>, g, bs, full, st, qkv, stride, a, bb, A, dt_bias, state, pos, slot, t0, t1, nk, nv, dk,
                                              dv, eps, qscale, out);
    else
        lk(k_deltanet<false>, g, bs, qk, st, qkv, stride, a, bb, A, dt_bias, state, pos, slot, t0, t1, nk, nv, dk,
                                             dv, eps, qscale, out);
    return 0;
}

}
