// convert.cu — weights in their GGUF block layouts (q8_0 and q6_K repacked
// within each row): the embedding and the dequantization for cuBLAS, built
// on dq32<TYPE> (dequant.cuh), and the repacking at upload.
#include "shaders/dequant.cuh"

/* ---------------- embedding ---------------- */

template <int TY>
__global__ void k_embed(const uint8_t *W, size_t rb, int n, const int32_t *ids, float *out)
{
    pdl_begin();
    int t = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c * 32 >= n) return;
    const uint8_t *row = W + (size_t)ids[t] * rb;
    float w[32];
    dq32<TY>(row, c, n, w);
    float *o = out + (size_t)t * n + c * 32;
#pragma unroll
    for (int i = 0; i < 32; i++)
        if (c * 32 + i < n) o[i] = w[i];
}

/* GGUF q8_0 rows (34-byte blocks) -> a row's 32-byte quant blocks, then its f16 scales */
__global__ void k_repack_q8_0(const uint8_t *src, uint8_t *dst, size_t rb, int n, int n_out)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int nb = n / 32;
    if (i >= (size_t)nb * n_out) return;
    int r = (int)(i / nb), c = (int)(i % nb);
    const uint8_t *b = src + (size_t)r * rb + (size_t)c * 34;
    uint8_t *row = dst + (size_t)r * rb;
    row[n + 2 * c] = b[0];
    row[n + 2 * c + 1] = b[1];
    for (int k = 0; k < 32; k++) row[32 * c + k] = b[2 + k];
}

/* GGUF q6_K rows (210-byte super-blocks) -> the repacked layout (q6_word);
 * a thread per (row, unit) */
__global__ void k_repack_q6_K(const uint8_t *src, uint8_t *dst, size_t rb, int n, int n_out)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int nu = n / 64;
    if (i >= (size_t)nu * n_out) return;
    int r = (int)(i / nu), u = (int)(i % nu), v0 = 64 * (u & 3);
    const uint8_t *b = src + (size_t)r * rb + (size_t)(u >> 2) * 210;
    uint8_t *row = dst + (size_t)r * rb;
    uint32_t ql[8] = { 0 }, qh[4] = { 0 };
    for (int v = 0; v < 64; v++) {
        /* GGUF: value 128h + 32m + l: nibble of ql[64h + l + 32(m&1)] (high for m >= 2), qh[32h + l] >> 2m */
        int sv = v0 + v, h = sv >> 7, m = (sv >> 5) & 3, l = sv & 31;
        int nib = (b[64 * h + l + 32 * (m & 1)] >> (m >= 2 ? 4 : 0)) & 0xF;
        int top = (b[128 + 32 * h + l] >> (2 * m)) & 3;
        int hh = v >> 5, w = (v & 31) >> 2, j = v & 3;
        ql[w] |= (uint32_t)nib << (8 * j + 4 * hh);
        qh[w >> 1] |= (uint32_t)top << (8 * j + 4 * (w & 1) + 2 * hh);
    }
    for (int k = 0; k < 8; k++)
        for (int j = 0; j < 4; j++) row[q6_word(nu, u, k, 8) + j] = (uint8_t)(ql[k] >> (8 * j));
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++) row[n / 2 + q6_word(nu, u, k, 4) + j] = (uint8_t)(qh[k] >> (8 * j));
    for (int s2 = 0; s2 < 4; s2++) row[3 * (n / 4) + 4 * u + s2] = b[192 + v0 / 16 + s2];
    if ((u & 3) == 0) {
        row[13 * (n / 16) + 2 * (u >> 2)] = b[208];
        row[13 * (n / 16) + 2 * (u >> 2) + 1] = b[209];
    }
}

/* ---------------- dequantize to f16 (the GEMM path) ---------------- */

/* A thread's 32-value chunk c of row r (rows rb bytes apart, n values, n_out
 * of them) dequantized into w; false for the threads past the last. */
template <int TY>
__device__ __forceinline__ bool dq_chunk(const uint8_t *W, size_t rb, int n, int n_out, int &r, int &c, float *w)
{
    pdl_begin();
    int nc = (n + 31) / 32;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)nc * n_out) return false;
    r = (int)(i / nc);
    c = (int)(i % nc);
    dq32<TY>(W + (size_t)r * rb, c, n, w);
    return true;
}

__device__ __forceinline__ void put1(float *p, float v) { *p = v; }
__device__ __forceinline__ void put1(__half *p, float v) { *p = __float2half_rn(v); }

/* dst [n_out][n] = W dequantized, as f32 or f16 (OT) */
template <int TY, class OT>
__global__ void k_dequant(const uint8_t *W, size_t rb, int n, int n_out, OT *dst)
{
    int r, c;
    float w[32];
    if (!dq_chunk<TY>(W, rb, n, n_out, r, c, w)) return;
    OT *o = dst + (size_t)r * n + c * 32;
    if (sizeof(OT) == 4) {
#pragma unroll
        for (int k = 0; k < 32; k++)
            if (c * 32 + k < n) put1(o + k, w[k]);
    } else if ((n & 31) == 0) {   /* f16: four 16-byte stores */
        __align__(16) __half h[32];
#pragma unroll
        for (int k = 0; k < 32; k++) h[k] = __float2half_rn(w[k]);
#pragma unroll
        for (int k = 0; k < 4; k++) ((uint4 *)o)[k] = ((const uint4 *)h)[k];
    } else {
        for (int k = 0; k < 32; k++)
            if (c * 32 + k < n) put1(o + k, w[k]);
    }
}

__global__ void k_f32_to_f16(const float *x, size_t n, __half *dst)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f2h_sat(x[i]);
}

extern "C" {

int ck_type_ok(uint32_t type)
{
    switch (type) {
    case QT_F32: case QT_F16: case QT_BF16: case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_Q8_0:
    case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: return 1;
    case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ2_S: case QT_IQ3_XXS: case QT_IQ3_S: case QT_IQ1_S:
    case QT_IQ4_NL: case QT_IQ4_XS: case QT_MXFP4: return 1;
    default: return 0;
    }
}

void ck_embed(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, const int32_t *ids, int T,
              float *out)
{
    int nc = (n + 31) / 32;
    dim3 g(nblk(nc, 64), T);
#define L_EMB(TY) lk(k_embed<TY>, g, 64, 0, st, (const uint8_t *)W, rb, n, ids, out)
    TYPE_SWITCH(type, L_EMB)
}

void ck_repack_q8_0(cudaStream_t st, const void *src, void *dst, size_t rb, int n, int n_out)
{
    size_t tot = (size_t)(n / 32) * n_out;
    lk(k_repack_q8_0, nblk(tot, 256), 256, 0, st, (const uint8_t *)src, (uint8_t *)dst, rb, n, n_out);
}

void ck_repack_q6_K(cudaStream_t st, const void *src, void *dst, size_t rb, int n, int n_out)
{
    size_t tot = (size_t)(n / 64) * n_out;
    lk(k_repack_q6_K, nblk(tot, 256), 256, 0, st, (const uint8_t *)src, (uint8_t *)dst, rb, n, n_out);
}

void ck_dequant_f16(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int n_out, void *dst)
{
    size_t tot = (size_t)((n + 31) / 32) * n_out;
#define L_DQ(TY) lk(k_dequant<TY, __half>, nblk(tot, 256), 256, 0, st, (const uint8_t *)W, rb, n, n_out, (__half *)dst)
    TYPE_SWITCH(type, L_DQ)
}

void ck_dequant_f32(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int n_out, float *dst)
{
    size_t tot = (size_t)((n + 31) / 32) * n_out;
#define L_DQ32(TY) lk(k_dequant<TY, float>, nblk(tot, 256), 256, 0, st, (const uint8_t *)W, rb, n, n_out, dst)
    TYPE_SWITCH(type, L_DQ32)
}

void ck_f32_to_f16(cudaStream_t st, const float *x, size_t n, void *dst)
{
    lk(k_f32_to_f16, nblk(n, 256), 256, 0, st, x, n, (__half *)dst);
}

}  /* extern "C" */
