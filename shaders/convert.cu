// convert.cu — weights in their GGUF block layouts (q8_0 and q6_K repacked
// within each row): dq32<TYPE> turns 32 consecutive values of a row into f32
// with the reference dequantizer's expressions (engine/qtypes.c); the
// embedding and the dequantization for cuBLAS are built on it.
#include "shaders/common.cuh"
#include "shaders/iq.cuh"

// 32 values c*32 .. c*32+31 of a row (n values; float types mask past n).
template <int TY>
__device__ __forceinline__ void dq32(const uint8_t *row, int c, int n, float w[32])
{
    if (iq_type(TY)) {   /* i-quants, iq4_nl, iq4_xs, mxfp4 */
        const int per = iq_blck(TY) / 32;   /* 32-value chunks per block */
        const uint8_t *b = row + (size_t)(c / per) * iq_bsize(TY);
#pragma unroll
        for (int l = 0; l < 4; l++) iq_dq8<TY>(b, 4 * (c % per) + l, w + 8 * l);
        return;
    }
    if (TY == QT_F32) {
        const float *r = (const float *)row + c * 32;
        if (c * 32 + 32 <= n && ((uintptr_t)r & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 v = __ldg((const float4 *)r + i);
                w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) w[i] = c * 32 + i < n ? r[i] : 0.f;
        }
    } else if (TY == QT_F16 || TY == QT_BF16) {
        const unsigned short *r = (const unsigned short *)row + c * 32;
        if (c * 32 + 32 <= n && ((uintptr_t)r & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 v = __ldg((const uint4 *)r + i);
                uint32_t u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    unsigned short lo = (unsigned short)(u[k] & 0xffff), hi = (unsigned short)(u[k] >> 16);
                    if (TY == QT_F16) {
                        w[8 * i + 2 * k] = __half2float(__ushort_as_half(lo));
                        w[8 * i + 2 * k + 1] = __half2float(__ushort_as_half(hi));
                    } else {
                        w[8 * i + 2 * k] = __uint_as_float((uint32_t)lo << 16);
                        w[8 * i + 2 * k + 1] = __uint_as_float((uint32_t)hi << 16);
                    }
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) {
                unsigned short u = c * 32 + i < n ? r[i] : 0;
                w[i] = TY == QT_F16 ? __half2float(__ushort_as_half(u)) : __uint_as_float((uint32_t)u << 16);
            }
        }
    } else if (TY == QT_Q4_0) {
        const uint8_t *b = row + c * 18;
        float d = h2f(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[2 + j];
            w[j] = (float)((q & 0xF) - 8) * d;
            w[j + 16] = (float)((q >> 4) - 8) * d;
        }
    } else if (TY == QT_Q4_1) {
        const uint8_t *b = row + c * 20;
        float d = h2f(b), m = h2f(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[4 + j];
            w[j] = (float)(q & 0xF) * d + m;
            w[j + 16] = (float)(q >> 4) * d + m;
        }
    } else if (TY == QT_Q5_0) {
        const uint8_t *b = row + c * 22;
        float d = h2f(b);
        uint32_t qh = ld32(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[6 + j];
            int xh0 = ((qh >> j) << 4) & 0x10, xh1 = (qh >> (j + 12)) & 0x10;
            w[j] = (float)(((q & 0xF) | xh0) - 16) * d;
            w[j + 16] = (float)(((q >> 4) | xh1) - 16) * d;
        }
    } else if (TY == QT_Q5_1) {
        const uint8_t *b = row + c * 24;
        float d = h2f(b), m = h2f(b + 2);
        uint32_t qh = ld32(b + 4);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[8 + j];
            int xh0 = ((qh >> j) << 4) & 0x10, xh1 = (qh >> (j + 12)) & 0x10;
            w[j] = (float)((q & 0xF) | xh0) * d + m;
            w[j + 16] = (float)((q >> 4) | xh1) * d + m;
        }
    } else if (TY == QT_Q8_0) {
        /* repacked on the device (ck_repack_q8_0): a row's quants, then its scales */
        const uint8_t *q = row + c * 32;
        float d = h2f(row + n + 2 * c);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int2 v = ld8(q + 8 * i);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                w[8 * i + k] = (float)(int8_t)(v.x >> (8 * k)) * d;
                w[8 * i + 4 + k] = (float)(int8_t)(v.y >> (8 * k)) * d;
            }
        }
    } else if (TY == QT_Q2_K) {
        const uint8_t *b = row + (c >> 3) * 84;
        int sub = c & 7, half = sub >> 2, j = sub & 3, shift = 2 * j;
        float d = h2f(b + 80), mn = h2f(b + 82);
        const uint8_t *q = b + 16 + 32 * half;
        int is = half * 8 + 2 * j;
        int sc = b[is];
        float dl = d * (float)(sc & 0xF), ml = mn * (float)(sc >> 4);
#pragma unroll
        for (int l = 0; l < 16; l++) w[l] = dl * (float)((q[l] >> shift) & 3) - ml;
        sc = b[is + 1];
        dl = d * (float)(sc & 0xF); ml = mn * (float)(sc >> 4);
#pragma unroll
        for (int l = 0; l < 16; l++) w[16 + l] = dl * (float)((q[l + 16] >> shift) & 3) - ml;
    } else if (TY == QT_Q3_K) {
        const uint8_t *b = row + (c >> 3) * 110;
        int sub = c & 7, half = sub >> 2, j = sub & 3, shift = 2 * j;
        const uint8_t *hm = b, *q = b + 32 + 32 * half, *s12 = b + 96;
        float d_all = h2f(b + 108);
        int m = 1 << (half * 4 + j);
        int is = half * 8 + 2 * j;
        int sc[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int i = is + k;   /* 6-bit scale i: low 4 bits, high 2 bits */
            int lo = i < 8 ? (s12[i] & 0xF) : (s12[i - 8] >> 4);
            int hi = (s12[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            sc[k] = (lo | (hi << 4)) - 32;
        }
        float dl = d_all * (float)sc[0];
#pragma unroll
        for (int l = 0; l < 16; l++) w[l] = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        dl = d_all * (float)sc[1];
#pragma unroll
        for (int l = 0; l < 16; l++)
            w[16 + l] = dl * (float)(((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
    } else if (TY == QT_Q4_K) {
        const uint8_t *b = row + (c >> 3) * 144;
        int sub = c & 7, g = sub >> 1, hi = sub & 1;
        float d = h2f(b), mn = h2f(b + 2);
        int sc, m;
        scale_min_k4(sub, b + 4, sc, m);
        float d1 = d * (float)sc, m1 = mn * (float)m;
        const uint4 *q4 = (const uint4 *)(b + 16 + 32 * g);   /* 16-byte aligned when rows are */
        if (((uintptr_t)q4 & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                uint4 v = q4[i];
                uint32_t u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
                for (int k = 0; k < 16; k++) {
                    int byte = (u[k >> 2] >> (8 * (k & 3))) & 0xff;
                    w[16 * i + k] = d1 * (float)(hi ? byte >> 4 : byte & 0xF) - m1;
                }
            }
        } else {
            const uint8_t *q = b + 16 + 32 * g;
#pragma unroll
            for (int l = 0; l < 32; l++) w[l] = d1 * (float)(hi ? q[l] >> 4 : q[l] & 0xF) - m1;
        }
    } else if (TY == QT_Q5_K) {
        const uint8_t *b = row + (c >> 3) * 176;
        int sub = c & 7, g = sub >> 1, hi = sub & 1;
        float d = h2f(b), mn = h2f(b + 2);
        int sc, m;
        scale_min_k4(sub, b + 4, sc, m);
        float d1 = d * (float)sc, m1 = mn * (float)m;
        const uint8_t *qh = b + 16, *ql = b + 48 + 32 * g;
        int bit = 2 * g + hi;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int v = (hi ? ql[l] >> 4 : ql[l] & 0xF) + (((qh[l] >> bit) & 1) << 4);
            w[l] = d1 * (float)v - m1;
        }
    } else if (TY == QT_Q6_K) {   /* repacked (q6_word) */
        int nu = n >> 6, u = c >> 1, hh = c & 1;
        uint32_t ql[8], qh[4];
#pragma unroll
        for (int k = 0; k < 8; k++) ql[k] = ld32a2(row + q6_word(nu, u, k, 8));
#pragma unroll
        for (int k = 0; k < 4; k++) qh[k] = ld32a2(row + n / 2 + q6_word(nu, u, k, 4));
        const int8_t *sc = (const int8_t *)row + 3 * (n / 4) + 4 * u + 2 * hh;
        float d = h2f(row + 13 * (n / 16) + 2 * (u >> 2));
        float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = (l < 16 ? d0 : d1) * (float)(q6_val(ql, qh, hh, l) - 32);
    }
}


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

template <int TY>
__global__ void k_dequant_f32(const uint8_t *W, size_t rb, int n, int n_out, float *dst)
{
    pdl_begin();
    int nc = (n + 31) / 32;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)nc * n_out) return;
    int r = (int)(i / nc), c = (int)(i % nc);
    float w[32];
    dq32<TY>(W + (size_t)r * rb, c, n, w);
    float *o = dst + (size_t)r * n + c * 32;
#pragma unroll
    for (int k = 0; k < 32; k++)
        if (c * 32 + k < n) o[k] = w[k];
}

template <int TY>
__global__ void k_dequant_f16(const uint8_t *W, size_t rb, int n, int n_out, __half *dst)
{
    pdl_begin();
    int nc = (n + 31) / 32;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)nc * n_out) return;
    int r = (int)(i / nc), c = (int)(i % nc);
    float w[32];
    dq32<TY>(W + (size_t)r * rb, c, n, w);
    __half *o = dst + (size_t)r * n + c * 32;
    if ((n & 31) == 0) {
        __align__(16) __half h[32];
#pragma unroll
        for (int k = 0; k < 32; k++) h[k] = __float2half_rn(w[k]);
#pragma unroll
        for (int k = 0; k < 4; k++) ((uint4 *)o)[k] = ((const uint4 *)h)[k];
    } else {
        for (int k = 0; k < 32; k++)
            if (c * 32 + k < n) o[k] = __float2half_rn(w[k]);
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
#define L_DQ(TY) lk(k_dequant_f16<TY>, nblk(tot, 256), 256, 0, st, (const uint8_t *)W, rb, n, n_out, (__half *)dst)
    TYPE_SWITCH(type, L_DQ)
}

void ck_dequant_f32(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int n_out, float *dst)
{
    size_t tot = (size_t)((n + 31) / 32) * n_out;
#define L_DQ32(TY) lk(k_dequant_f32<TY>, nblk(tot, 256), 256, 0, st, (const uint8_t *)W, rb, n, n_out, dst)
    TYPE_SWITCH(type, L_DQ32)
}

void ck_f32_to_f16(cudaStream_t st, const float *x, size_t n, void *dst)
{
    lk(k_f32_to_f16, nblk(n, 256), 256, 0, st, x, n, (__half *)dst);
}

}  /* extern "C" */
