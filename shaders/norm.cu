// norm.cu — rmsnorm, add + rmsnorm and the elementwise ops, each also
// writing its output's int8 and f16 forms when the next matmul reads them.
#include "shaders/common.cuh"

__global__ void k_add_bias(float *out, const float *bias, int T, int n_out)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)T * n_out) out[i] += bias[i % n_out];
}

/* ---------------- elementwise ---------------- */

__global__ void k_add(float *x, const float *y, size_t n)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}


/* qx.q: also the int8 form of out (rows of whole blocks: n % 32 == 0) */
__global__ void k_silu_mul(const float *g, const float *u, size_t n, float *out, act_forms qx)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;   /* whole warps when quantizing */
    float v = silu_mul1(g[i], u[i]);
    out[i] = v;
    if (qx.q) quant_block(v, threadIdx.x & 31, i >> 5, qx);
    if (qx.h) qx.h[i] = f2h_sat(v);
}

/* sum of squares of the block, in every thread: each warp's sum to
 * shared memory, then every warp adds the warps' sums by the same
 * butterfly (the same bits in every thread, one barrier). Once per kernel. */
__device__ __forceinline__ float block_sum(float ss)
{
    __shared__ float red[32];
    for (int k = 16; k > 0; k >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, k);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    int lane = threadIdx.x & 31;
    float v = lane < (int)(blockDim.x + 31) / 32 ? red[lane] : 0.f;
    for (int k = 16; k > 0; k >>= 1) v += __shfl_xor_sync(0xffffffffu, v, k);
    return v;
}

/* Row blockIdx.x of out = x (+ y, written back to x) / rms * w, and with
 * qx.q its int8 form (n % 32 == 0 and blockDim a multiple of 32: a warp's
 * values are one block), with qx.h its f16 form. A thread holds values
 * threadIdx.x + k * blockDim.x (k < NPT) in registers; the norm's weights
 * (never written) are read before pdl_begin(). NPT 0: any n, values
 * re-read from x. */
/* early: the next launch scheduled before the wait (norm_early) */
template <int NPT>
__device__ __forceinline__ void norm_row(float *x, const float *y, const float *w, int n, float eps, float *out,
                                         act_forms qx, int early)
{
    const int bs = blockDim.x, tid = threadIdx.x;
    float *xr = x + (size_t)blockIdx.x * n;
    const float *yr = y ? y + (size_t)blockIdx.x * n : NULL;
    float *o = out + (size_t)blockIdx.x * n;
    float wv[NPT > 0 ? NPT : 1], v[NPT > 0 ? NPT : 1];
#pragma unroll
    for (int k = 0; k < NPT; k++) wv[k] = tid + k * bs < n ? __ldg(w + tid + k * bs) : 0.f;
    pdl_early(early);
    pdl_begin();
    float ss = 0.f;
    if constexpr (NPT > 0) {
#pragma unroll
        for (int k = 0; k < NPT; k++) {
            int i = tid + k * bs;
            v[k] = 0.f;
            if (i < n) {
                v[k] = yr ? xr[i] + yr[i] : xr[i];
                if (yr) xr[i] = v[k];
                ss += v[k] * v[k];
            }
        }
    } else {
        for (int i = tid; i < n; i += bs) {
            float t = yr ? xr[i] + yr[i] : xr[i];
            if (yr) xr[i] = t;
            ss += t * t;
        }
    }
    ss = block_sum(ss);
    /* (single precision: the double division and square root were ~0.5 us
     * of a one-token norm's chain) */
    float scale = rsqrtf(ss / (float)n + eps);
    if constexpr (NPT > 0) {
        const int N = NPT;
        float r[N];
        size_t bq[N];
        int nlive = 0;   /* (the same in a warp when quantizing: n % 32 == 0) */
#pragma unroll
        for (int k = 0; k < N; k++) {
            int i = tid + k * bs;
            r[k] = v[k] * scale * wv[k];
            bq[k] = (size_t)blockIdx.x * (n / 32) + (i >> 5);
            if (i < n) {
                nlive = k + 1;
                o[i] = r[k];
                if (qx.h) qx.h[(size_t)blockIdx.x * n + i] = f2h_sat(r[k]);
            }
        }
        if (qx.q) quant_blocks<N>(r, tid & 31, bq, nlive, qx);
    } else {
        for (int i = tid; i < n; i += bs) {
            float r = xr[i] * scale * w[i];
            o[i] = r;
            if (qx.q) quant_block(r, tid & 31, (size_t)blockIdx.x * (n / 32) + (i >> 5), qx);
            if (qx.h) qx.h[(size_t)blockIdx.x * n + i] = f2h_sat(r);
        }
    }
}

template <int NPT>
__global__ void k_rmsnorm(const float *x, const float *w, int n, float eps, float *out, act_forms qx, int early)
{
    norm_row<NPT>((float *)x, NULL, w, n, eps, out, qx, early);   /* (x only read: y is NULL) */
}

template <int NPT>
__global__ void k_add_rmsnorm(float *x, const float *y, const float *w, int n, float eps, float *out, act_forms qx,
                              int early)
{
    norm_row<NPT>(x, y, w, n, eps, out, qx, early);
}

/* ---------------- Gemma and GPT-2: gelu, layernorm, scale, positions ---------------- */

/* gelu, the tanh approximation */
__device__ __forceinline__ float gelu_tanh1(float x)
{
    return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

__global__ void k_gelu_mul(const float *x, const float *u, size_t n, float *out)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = u ? gelu_tanh1(x[i]) * u[i] : gelu_tanh1(x[i]);
}

__global__ void k_scale(float *x, size_t n, float s)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

/* row blockIdx.x: (x - mean) / sqrt(var + eps) * w (+ b); in place allowed */
__global__ void k_layernorm(const float *x, const float *w, const float *b, int n, float eps, float *out)
{
    pdl_begin();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    float mean = block_sum(s) / (float)n;
    __syncthreads();   /* (block_sum's shared words are used again) */
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
    float inv = rsqrtf(block_sum(ss) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.f);
}

/* x[t][c] += tab[pos[t]][c]; kind 0 f32, 1 f16, 2 bf16 */
__global__ void k_add_pos(float *x, const void *tab, int kind, size_t row_bytes, const int32_t *pos, int T, int n)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * n) return;
    int t = (int)(i / n), c = (int)(i % n);
    const char *row = (const char *)tab + (size_t)pos[t] * row_bytes;
    float v;
    if (kind == 0) v = ((const float *)row)[c];
    else if (kind == 1) v = __half2float(((const __half *)row)[c]);
    else v = __uint_as_float((unsigned)((const unsigned short *)row)[c] << 16);
    x[i] += v;
}

extern "C" {

void ck_gelu_mul(cudaStream_t st, const float *x, const float *u, size_t n, float *out)
{
    lk(k_gelu_mul, nblk(n, 256), 256, 0, st, x, u, n, out);
}

void ck_scale(cudaStream_t st, float *x, size_t n, float s)
{
    lk(k_scale, nblk(n, 256), 256, 0, st, x, n, s);
}

void ck_layernorm(cudaStream_t st, const float *x, const float *w, const float *b, int rows, int n, float eps,
                  float *out)
{
    int bs = n >= 1024 ? 1024 : ((n + 31) / 32) * 32;
    lk(k_layernorm, rows, bs, 0, st, x, w, b, n, eps, out);
}

void ck_add_pos(cudaStream_t st, float *x, const void *tab, int kind, size_t row_bytes, const int32_t *pos, int T,
                int n)
{
    lk(k_add_pos, nblk((size_t)T * n, 256), 256, 0, st, x, tab, kind, row_bytes, pos, T, n);
}

/* Whether a norm schedules the next launch before its own wait, so that
 * the matmul after it loads its weights while the norm's predecessor
 * drains (every kernel reads only weights and the pass's constants before
 * its wait): rows under 2048 values, launch-bound models (docs/benchmarks-cuda.md). */
static inline int norm_early(int n) { return n < 2048; }

/* a block per row: up to 1024 threads, each with up to 8 values in registers */
#define L_NORM(KER, ...)                                                                                  \
    do {                                                                                                  \
        int bs = n >= 1024 ? 1024 : ((n + 31) / 32) * 32, npt = (n + bs - 1) / bs, ne = norm_early(n);    \
        act_forms L = act_forms_for(xq, x16, rows, n);                                                        \
        if (npt == 1) lk(KER<1>, rows, bs, 0, st, __VA_ARGS__, L, ne);                                    \
        else if (npt == 2) lk(KER<2>, rows, bs, 0, st, __VA_ARGS__, L, ne);                               \
        else if (npt <= 4) lk(KER<4>, rows, bs, 0, st, __VA_ARGS__, L, ne);                               \
        else if (npt <= 8) lk(KER<8>, rows, bs, 0, st, __VA_ARGS__, L, ne);                               \
        else lk(KER<0>, rows, bs, 0, st, __VA_ARGS__, L, ne);                                             \
    } while (0)

void ck_add_rmsnorm(cudaStream_t st, float *x, const float *y, const float *w, int rows, int n, float eps,
                    float *out, void *xq, void *x16)
{
    L_NORM(k_add_rmsnorm, x, y, w, n, eps, out);
}

void ck_rmsnorm(cudaStream_t st, const float *x, const float *w, int rows, int n, float eps, float *out, void *xq,
                void *x16)
{
    L_NORM(k_rmsnorm, x, w, n, eps, out);
}

void ck_add_bias(cudaStream_t st, float *out, const float *bias, int T, int n_out)
{
    size_t n = (size_t)T * n_out;
    lk(k_add_bias, nblk(n, 256), 256, 0, st, out, bias, T, n_out);
}

void ck_add(cudaStream_t st, float *x, const float *y, size_t n)
{
    lk(k_add, nblk(n, 256), 256, 0, st, x, y, n);
}

void ck_silu_mul(cudaStream_t st, const float *g, const float *u, size_t n, float *out, void *xq, void *x16, int rows)
{
    act_forms L = act_forms_for(xq && rows > 0 && n % (size_t)rows == 0 ? xq : NULL, x16, rows, rows > 0 ? (int)(n / rows) : 0);
    lk(k_silu_mul, nblk(n, 256), 256, 0, st, g, u, n, out, L);
}

}  /* extern "C" */
