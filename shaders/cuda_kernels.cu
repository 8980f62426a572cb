// cuda_kernels.cu — the CUDA backend's kernels. Weights are read in their
// GGUF block layouts (q8_0 and q6_K repacked within each row): dq32<TYPE> turns 32 consecutive values of a row into
// f32 with the reference dequantizer's expressions (engine/qtypes.c), and
// every weight kernel (embedding, GEMV, dequantize-for-GEMM) is built on it.
#include "shaders/cuda_kernels.h"

#include <cuda_fp16.h>
#include "shaders/cuda_launch.cuh"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30
};

__device__ __forceinline__ float h2f(const uint8_t *p)
{
    unsigned short u = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(u));
}

/* f32 -> f16 for the GEMMs' inputs, saturated at the f16 range (one
 * expression for every kernel that writes an f16 copy of an activation) */
__device__ __forceinline__ __half f2h_sat(float v)
{
    return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f));
}

__device__ __forceinline__ uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

__device__ __forceinline__ uint32_t ld32a2(const uint8_t *p)   /* 2-byte aligned */
{
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

__device__ __forceinline__ int2 ld8(const uint8_t *p)   /* 2-byte aligned at least */
{
    if (((uintptr_t)p & 7) == 0) return *(const int2 *)p;
    return make_int2((int)ld32a2(p), (int)ld32a2(p + 4));
}

/* Weight loads of the decode GEMVs: each byte is read once per token, so
 * marked first to leave L2 (and not kept in L1). A token streams gigabytes
 * of weights through the 50 MB L2; without the hint they push out what the
 * small kernels between the GEMVs reuse: their code, the activations, the
 * KV rows. (-DANE_CUDA_NO_EVICT: the normal policy, for comparison.) */
__device__ __forceinline__ uint64_t wpol()   /* the L2 policy of weight loads */
{
    uint64_t p;
#ifdef ANE_CUDA_NO_EVICT
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
#else
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}
#define WLD "ld.global.nc.L1::no_allocate.L2::cache_hint"
__device__ __forceinline__ uint4 wld16(const void *p, uint64_t pol)
{
    uint4 v;
    asm(WLD ".v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ uint2 wld8(const void *p, uint64_t pol)
{
    uint2 v;
    asm(WLD ".v2.u32 {%0, %1}, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ uint32_t wld4(const void *p, uint64_t pol)
{
    uint32_t v;
    asm(WLD ".u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ unsigned short wld2(const void *p, uint64_t pol)
{
    unsigned short v;
    asm(WLD ".u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(pol));
    return v;
}

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int &d, int &m)
{
    if (j < 4) {
        d = q[j] & 63; m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* q6_K lives on the device repacked at upload (k_repack_q6_K; same bytes
 * per row) so that the int8 GEMV reads it in aligned words. A row of n
 * values is nu = n/64 units of 64 values: QL [n/2] (8 words per unit), QH
 * [n/4] (4 words per unit), SC [n/16] (a unit's 4 sub-block scales, one
 * word), D [n/256] (f16 per super-block). QL and QH words are interleaved
 * over groups of 32 units (word w of the group's units side by side), so
 * lanes on consecutive units read one contiguous piece per word. In unit u
 * (values 64u..): QL word w byte j has value 4w+j in its low nibble and
 * 32+4w+j in its high one; QH word k byte j holds the top two bits of values
 * 8k+j, 32+8k+j, 8k+4+j, 32+8k+4+j (bits 0-1, 2-3, 4-5, 6-7); SC byte s
 * scales values 16s..16s+15. */
__device__ __forceinline__ int q6_word(int nu, int u, int w, int wpu)   /* byte offset of word w in QL / QH */
{
    int g0 = u & ~31, gs = min(32, nu - g0);
    return (g0 * wpu + w * gs + (u - g0)) * 4;
}

/* value l (0..31) of half hh of a unit: 6-bit q from its QL word l / 4 and QH word l / 8 */
__device__ __forceinline__ int q6_bits(uint32_t qlw, uint32_t qhw, int hh, int l)
{
    int w = l >> 2, j = l & 3;
    return (int)(((qlw >> (8 * j + 4 * hh)) & 0xF) | (((qhw >> (8 * j + 4 * (w & 1) + 2 * hh)) & 3) << 4));
}
/* ... from all of the unit's words */
__device__ __forceinline__ int q6_val(const uint32_t (&ql)[8], const uint32_t (&qh)[4], int hh, int l)
{
    return q6_bits(ql[l >> 2], qh[l >> 3], hh, l);
}

// 32 values c*32 .. c*32+31 of a row (n values; float types mask past n).
template <int TY>
__device__ __forceinline__ void dq32(const uint8_t *row, int c, int n, float w[32])
{
    if (TY == T_F32) {
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
    } else if (TY == T_F16 || TY == T_BF16) {
        const unsigned short *r = (const unsigned short *)row + c * 32;
        if (c * 32 + 32 <= n && ((uintptr_t)r & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 v = __ldg((const uint4 *)r + i);
                uint32_t u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    unsigned short lo = (unsigned short)(u[k] & 0xffff), hi = (unsigned short)(u[k] >> 16);
                    if (TY == T_F16) {
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
                w[i] = TY == T_F16 ? __half2float(__ushort_as_half(u)) : __uint_as_float((uint32_t)u << 16);
            }
        }
    } else if (TY == T_Q4_0) {
        const uint8_t *b = row + c * 18;
        float d = h2f(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[2 + j];
            w[j] = (float)((q & 0xF) - 8) * d;
            w[j + 16] = (float)((q >> 4) - 8) * d;
        }
    } else if (TY == T_Q4_1) {
        const uint8_t *b = row + c * 20;
        float d = h2f(b), m = h2f(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[4 + j];
            w[j] = (float)(q & 0xF) * d + m;
            w[j + 16] = (float)(q >> 4) * d + m;
        }
    } else if (TY == T_Q5_0) {
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
    } else if (TY == T_Q5_1) {
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
    } else if (TY == T_Q8_0) {
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
    } else if (TY == T_Q2_K) {
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
    } else if (TY == T_Q3_K) {
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
    } else if (TY == T_Q4_K) {
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
    } else if (TY == T_Q5_K) {
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
    } else if (TY == T_Q6_K) {   /* repacked (q6_word) */
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


__device__ __forceinline__ void nib8(uint32_t lo4, uint32_t hi4, int high, float *q)
{
    /* 8 bytes (two words) -> 8 nibbles (low or high) */
#pragma unroll
    for (int k = 0; k < 4; k++) {
        q[k] = (float)(((lo4 >> (8 * k)) >> (high ? 4 : 0)) & 0xF);
        q[4 + k] = (float)(((hi4 >> (8 * k)) >> (high ? 4 : 0)) & 0xF);
    }
}


// 8 values g*8 .. g*8+7 of a row (n values; n % 8 == 0 for quantized types;
// float types mask past n). Consecutive g read consecutive bytes, so a warp
// over consecutive g reads the row coalesced.
template <int TY>
__device__ __forceinline__ void dq8(const uint8_t *__restrict__ row, int g, int n, float w[8])
{
    if (TY == T_F32) {
        const float *r = (const float *)row + g * 8;
        if (g * 8 + 8 <= n && ((uintptr_t)r & 15) == 0) {
            float4 a = __ldg((const float4 *)r), b = __ldg((const float4 *)r + 1);
            w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = g * 8 + i < n ? r[i] : 0.f;
        }
    } else if (TY == T_F16 || TY == T_BF16) {
        const unsigned short *r = (const unsigned short *)row + g * 8;
        if (g * 8 + 8 <= n && ((uintptr_t)r & 15) == 0) {
            uint4 v = __ldg((const uint4 *)r);
            uint32_t u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
            for (int k = 0; k < 4; k++) {
                unsigned short lo = (unsigned short)(u[k] & 0xffff), hi = (unsigned short)(u[k] >> 16);
                if (TY == T_F16) { w[2 * k] = __half2float(__ushort_as_half(lo)); w[2 * k + 1] = __half2float(__ushort_as_half(hi)); }
                else { w[2 * k] = __uint_as_float((uint32_t)lo << 16); w[2 * k + 1] = __uint_as_float((uint32_t)hi << 16); }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                unsigned short u = g * 8 + i < n ? r[i] : 0;
                w[i] = TY == T_F16 ? __half2float(__ushort_as_half(u)) : __uint_as_float((uint32_t)u << 16);
            }
        }
    } else if (TY == T_Q8_0) {
        int2 v = ld8(row + g * 8);
        float d = h2f(row + n + 2 * (g >> 2));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            w[k] = (float)(int8_t)(v.x >> (8 * k)) * d;
            w[4 + k] = (float)(int8_t)(v.y >> (8 * k)) * d;
        }
    } else if (TY == T_Q4_0 || TY == T_Q4_1 || TY == T_Q5_0 || TY == T_Q5_1) {
        const int bs = TY == T_Q4_0 ? 18 : TY == T_Q4_1 ? 20 : TY == T_Q5_0 ? 22 : 24;
        const uint8_t *b = row + (g >> 2) * bs;
        int j8 = g & 3;
        float d = h2f(b);
        {
            const int qo = TY == T_Q4_0 ? 2 : TY == T_Q4_1 ? 4 : TY == T_Q5_0 ? 6 : 8;
            const uint8_t *q = b + qo + 8 * (j8 & 1);
            uint32_t a0 = TY == T_Q4_1 || TY == T_Q5_1 ? *(const uint32_t *)q : ld32a2(q);
            uint32_t a1 = TY == T_Q4_1 || TY == T_Q5_1 ? *(const uint32_t *)(q + 4) : ld32a2(q + 4);
            float v[8];
            nib8(a0, a1, j8 >> 1, v);
            if (TY == T_Q5_0 || TY == T_Q5_1) {
                uint32_t qh = TY == T_Q5_0 ? ld32a2(b + 2) : *(const uint32_t *)(b + 4);
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] += (float)(((qh >> (8 * j8 + k)) & 1) << 4);
            }
            if (TY == T_Q4_0) {
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = (v[k] - 8.f) * d;
            } else if (TY == T_Q5_0) {
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = (v[k] - 16.f) * d;
            } else {
                float m = h2f(b + 2);
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = v[k] * d + m;
            }
        }
    } else {
        /* K-quants: super-block of 256 = 32 groups; chunk c of 32, offset o */
        int gi = g & 31, c = gi >> 2, o = (gi & 3) * 8;
        if (TY == T_Q2_K || TY == T_Q3_K) {
            const int bs = TY == T_Q2_K ? 84 : 110;
            const uint8_t *b = row + (g >> 5) * bs;
            int half = c >> 2, j = c & 3, shift = 2 * j, is = half * 8 + 2 * j + (o >= 16);
            const uint8_t *q = b + (TY == T_Q2_K ? 16 : 32) + 32 * half + o;
            uint32_t a0 = ld32a2(q), a1 = ld32a2(q + 4);
            float v[8];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[k] = (float)((a0 >> (8 * k + shift)) & 3);
                v[4 + k] = (float)((a1 >> (8 * k + shift)) & 3);
            }
            if (TY == T_Q2_K) {
                float d = h2f(b + 80), mn = h2f(b + 82);
                int sc = b[is];
                float dl = d * (float)(sc & 0xF), ml = mn * (float)(sc >> 4);
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = dl * v[k] - ml;
            } else {
                const uint8_t *s12 = b + 96;
                int lo = is < 8 ? (s12[is] & 0xF) : (s12[is - 8] >> 4);
                int hi = (s12[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
                float dl = h2f(b + 108) * (float)((lo | (hi << 4)) - 32);
                uint32_t h0 = ld32a2(b + o), h1 = ld32a2(b + o + 4);
                int mb = half * 4 + j;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    w[k] = dl * (v[k] - (((h0 >> (8 * k + mb)) & 1) ? 0.f : 4.f));
                    w[4 + k] = dl * (v[4 + k] - (((h1 >> (8 * k + mb)) & 1) ? 0.f : 4.f));
                }
            }
        } else if (TY == T_Q4_K || TY == T_Q5_K) {
            const int bs = TY == T_Q4_K ? 144 : 176;
            const uint8_t *b = row + (g >> 5) * bs;
            int gg = c >> 1, hi = c & 1;
            float d = h2f(b), mn = h2f(b + 2);
            int sc, m;
            scale_min_k4(c, b + 4, sc, m);
            float d1 = d * (float)sc, m1 = mn * (float)m;
            const uint8_t *q = b + (TY == T_Q4_K ? 16 : 48) + 32 * gg + o;
            uint2 a = *(const uint2 *)q;   /* 8-byte aligned: super-blocks are */
            float v[8];
            nib8(a.x, a.y, hi, v);
            if (TY == T_Q5_K) {
                uint2 h = *(const uint2 *)(b + 16 + o);
                int bit = 2 * gg + hi;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    v[k] += (float)(((h.x >> (8 * k + bit)) & 1) << 4);
                    v[4 + k] += (float)(((h.y >> (8 * k + bit)) & 1) << 4);
                }
            }
#pragma unroll
            for (int k = 0; k < 8; k++) w[k] = d1 * v[k] - m1;
        } else if (TY == T_Q6_K) {   /* repacked (q6_word): values v0..v0+7 of unit u */
            int nu = n >> 6, u = g >> 3, v0 = (g & 7) * 8, hh = v0 >> 5, w0 = (v0 & 31) >> 2;
            uint32_t l0 = ld32a2(row + q6_word(nu, u, w0, 8)), l1 = ld32a2(row + q6_word(nu, u, w0 + 1, 8));
            uint32_t h = ld32a2(row + n / 2 + q6_word(nu, u, w0 >> 1, 4));
            float d = h2f(row + 13 * (n / 16) + 2 * (u >> 2)) * (float)((const int8_t *)row)[3 * (n / 4) + 4 * u + (v0 >> 4)];
#pragma unroll
            for (int k = 0; k < 4; k++) {   /* (w0 even: its top bits at 0-1, word w0+1's at 4-5) */
                int v0q = (int)(((l0 >> (8 * k + 4 * hh)) & 0xF) | (((h >> (8 * k + 2 * hh)) & 3) << 4));
                int v1q = (int)(((l1 >> (8 * k + 4 * hh)) & 0xF) | (((h >> (8 * k + 4 + 2 * hh)) & 3) << 4));
                w[k] = d * (float)(v0q - 32);
                w[4 + k] = d * (float)(v1q - 32);
            }
        }
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

/* ---------------- GEMV: up to 16 tokens ----------------
 * A block of 4 warps takes 4/K rows, K warps per row (split over the row for
 * long rows). Lane l of a row's warp k takes 8-value groups l + 32*k, +32*K,
 * ...: each warp reads the row's bytes and x's floats contiguously. */
/* (sp, per, pb, cb: k_mmqh's K split) */
struct gv_mat { const uint8_t *W; const float *bias; float *out; int n_out, blk0, sp, per, pb, cb; };
struct gv_set {   /* matrices of one type and n_in, one launch; pf: gv_pf() */
    gv_mat m[CK_MULTI_MAX];
    int nm, pf;
    const uint8_t *glu_u;   /* the batched q4_K kernels' gate-and-up form (ck_mmq_glu): the up matrix */
    __half *glu_h;          /* ... and out's f16 form */
};

/* Weights are never written, so a GEMV block may start pulling its rows
 * into L2 before pdl_begin(), while the kernel before it (whose output is
 * x) still runs: the weight stream starts early instead of after a cold
 * ramp. Every thread of the block prefetches every blockDim-th 128-byte
 * line of [p, p + n). */
__device__ __forceinline__ void l2_prefetch(const void *p, size_t n)
{
    for (size_t o = (size_t)threadIdx.x * 128; o < n; o += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o) : "memory");
}

/* Whether a GEMV launch over `bytes` of weights prefetches its rows: sets
 * of up to 5 MiB. Measured (BENCHMARKS.md): a launch-bound small model
 * gains, a 7b loses 1-3% when its 7-17 MB matrices prefetch (the prefetch
 * runs beside attention and the norms, which are latency-bound).
 * ANE_CUDA_PREFETCH_MB sets the limit (0: never), for comparison. */
static int gv_pf(size_t bytes)
{
    static long mb = -1;
    if (mb < 0) {
        const char *e = getenv("ANE_CUDA_PREFETCH_MB");
        mb = e && *e ? atol(e) : 5;
    }
    return bytes <= ((size_t)mb << 20);
}

/* The set of nm matrices for one launch (blk0 and the split fields 0),
 * their outputs from token t0 on */
static gv_set gv_fill(int nm, const void *const *W, const int *n_out, const float *const *bias, float *const *out,
                      int t0)
{
    gv_set S;
    memset(&S, 0, sizeof S);
    S.nm = nm;
    for (int i = 0; i < nm; i++) {
        S.m[i].W = (const uint8_t *)W[i];
        S.m[i].bias = bias[i];
        S.m[i].out = out[i] + (size_t)t0 * n_out[i];
        S.m[i].n_out = n_out[i];
    }
    return S;
}

/* the matrix of S this block works on (blocks blk0.. of matrix i) */
__device__ __forceinline__ int gv_pick(const gv_set &S)
{
    int mi = 0;
#pragma unroll
    for (int i = 1; i < CK_MULTI_MAX; i++) if (i < S.nm && (int)blockIdx.x >= S.m[i].blk0) mi = i;
    return mi;
}

/* The row of a one-row GEMV's warp: matrix mi of the set, row r (row 0's
 * bytes when r is past the end: live false), part of its K warps. */
struct gv_row { int mi, r, part; bool live; const uint8_t *row; };

template <int K>
__device__ __forceinline__ gv_row gv_row_of(const gv_set &S, size_t rb, int warp)
{
    gv_row g;
    g.mi = gv_pick(S);
    g.r = ((int)blockIdx.x - S.m[g.mi].blk0) * (4 / K) + warp / K;
    g.part = warp % K;
    g.live = g.r < S.m[g.mi].n_out;
    g.row = S.m[g.mi].W + (size_t)(g.live ? g.r : 0) * rb;
    return g;
}

/* End of the one-row GEMVs: each warp's lane sums to one value per token,
 * the K warps of a row are added in warp order, and lane t of the row's
 * first warp writes token t (plus bias). Every thread of the block calls it. */
template <int NT, int K>
__device__ __forceinline__ void gv_finish(float (&acc)[NT], int warp, int lane, int part, bool live, int r, int T,
                                          const gv_mat &m)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        acc[t] = s;
    }
    if (K > 1) {
        __shared__ float red[4][NT];
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++) red[warp][t] = acc[t];
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < K; k++) v += red[warp + k][t];
            acc[t] = v;
        }
    }
    if (live && lane < T) {
        float v = 0.f;
#pragma unroll
        for (int t = 0; t < NT; t++) if (t == lane) v = acc[t];
        m.out[(size_t)lane * m.n_out + r] = v + (m.bias ? m.bias[r] : 0.f);
    }
}

template <int TY, int NT, int K>
__global__ void __launch_bounds__(128) k_gemv(const gv_set S, size_t rb, int n, const float *__restrict__ x, int T)
{
    pdl_begin();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    gv_row g = gv_row_of<K>(S, rb, warp);
    int mi = g.mi, r = g.r, part = g.part;
    bool live = g.live;
    const uint8_t *row = g.row;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int ng = live ? (n + 7) / 8 : 0;
    bool vec = (n & 7) == 0;
#pragma unroll 4
    for (int g = lane + 32 * part; g < ng; g += 32 * K) {
        float w[8];
        dq8<TY>(row, g, n, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const float *xt = x + (size_t)t * n + g * 8;
            float s;
            if (vec) {
                float4 a = __ldg((const float4 *)xt), b = __ldg((const float4 *)xt + 1);
                s = __fmul_rn(w[0], a.x);
                s = __fmaf_rn(w[1], a.y, s); s = __fmaf_rn(w[2], a.z, s); s = __fmaf_rn(w[3], a.w, s);
                s = __fmaf_rn(w[4], b.x, s); s = __fmaf_rn(w[5], b.y, s); s = __fmaf_rn(w[6], b.z, s);
                s = __fmaf_rn(w[7], b.w, s);
            } else {
                s = __fmul_rn(w[0], xt[0]);
#pragma unroll
                for (int i = 1; i < 8; i++)
                    if (g * 8 + i < n) s = __fmaf_rn(w[i], xt[i], s);
            }
            acc[t] = __fadd_rn(acc[t], s);
        }
    }
    gv_finish<NT, K>(acc, warp, lane, part, live, r, T, S.m[mi]);
}


/* ---------------- int8 GEMV (q4_K, q8_0): x quantized per 32 values ----------------
 * xq [T][n] int8, xd [T][n/32] scale, xs [T][n/32] sum of the block's ints.
 * Dot products with __dp4a, as the CPU's q8 activations (same error class). */
/* Where the int8 form of x [T][n] lives in a scratch of CK_XQ_BYTES(T, n):
 * xq [T][n], then xd and xs [T][n/32], then the block-major copies xdt, xst
 * [n/32][tp] (tp = T rounded up to 8), written only for the tensor-core
 * kernel (ANE_CUDA_MMQ=1; dt, st NULL otherwise). */
struct xq_lay { int8_t *q; float *d; int *s; float *dt; int *st; int nbr, tp; __half *h; };

static int mmq_off(void);

static xq_lay xq_layout(void *scratch, int T, int n)
{
    xq_lay L;
    size_t nbt = (size_t)T * (n / 32);
    L.q = (int8_t *)scratch;
    L.d = (float *)(L.q + (size_t)T * n);
    L.s = (int *)(L.d + nbt);
    L.tp = (T + 7) & ~7;
    L.dt = (float *)(L.s + nbt);
    L.st = (int *)(L.dt + (size_t)L.tp * (n / 32));
    if (mmq_off()) { L.dt = NULL; L.st = NULL; }
    L.nbr = n / 32;
    L.h = NULL;
    return L;
}

/* Block b (of the flattened [T][n/32]) of x quantized by one warp, lane l
 * holding value l. The only quantizer of GEMV input: k_quant_x and the
 * producers that quantize their own output (rmsnorm, add_rmsnorm,
 * silu_mul) give the same bits. Every lane of the warp must call it.
 * quant_blocks: N blocks at once (v[k]: this lane's value of block b[k];
 * their shuffles interleaved), the first nlive of them stored. */
template <int N>
__device__ __forceinline__ void quant_blocks(const float (&v)[N], int lane, const size_t (&b)[N], int nlive,
                                             const xq_lay &L)
{
    float a[N];
#pragma unroll
    for (int k = 0; k < N; k++) a[k] = fabsf(v[k]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) a[k] = fmaxf(a[k], __shfl_xor_sync(0xffffffffu, a[k], o));
    float d[N];
    int q[N], sum[N];
#pragma unroll
    for (int k = 0; k < N; k++) {
        float amax = fmaxf(0.f, a[k]);   /* (all NaN: 0, as a running max from 0) */
        d[k] = amax / 127.f;
        float id = d[k] > 0.f ? 1.f / d[k] : 0.f;
        q[k] = __float2int_rn(v[k] * id);
        sum[k] = q[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], o);
#pragma unroll
    for (int k = 0; k < N; k++) {
        if (k >= nlive) break;
        L.q[b[k] * 32 + lane] = (int8_t)q[k];
        if (lane == 0) {
            L.d[b[k]] = d[k];
            L.s[b[k]] = sum[k];
            if (L.dt) {
                size_t t = b[k] / L.nbr, k2 = b[k] - t * L.nbr;
                L.dt[k2 * L.tp + t] = d[k];
                L.st[k2 * L.tp + t] = sum[k];
            }
        }
    }
}

__device__ __forceinline__ void quant_block(float v, int lane, size_t b, const xq_lay &L)
{
    const float vv[1] = { v };
    const size_t bb[1] = { b };
    quant_blocks<1>(vv, lane, bb, 1, L);
}

/* a warp per 32-value block; rows are whole blocks: n % 32 == 0 */
__global__ void k_quant_x(const float *__restrict__ x, size_t nb_total, xq_lay L)
{
    pdl_begin();
    size_t b = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (b >= nb_total) return;   /* whole warps */
    quant_block(x[b * 32 + lane], lane, b, L);
}

/* Per-unit sums of the int8 GEMVs, rounded step by step (no contraction),
 * so that every kernel and tile size gives a (row, token) the same result. */
__device__ __forceinline__ float q4k_unit(float acc, float dx0, float d0, int dot0, float mm0, int s0, float dx1,
                                          float d1, int dot1, float mm1, int s1)
{
    float a = __fsub_rn(__fmul_rn(d0, (float)dot0), __fmul_rn(mm0, (float)s0));
    float b = __fsub_rn(__fmul_rn(d1, (float)dot1), __fmul_rn(mm1, (float)s1));
    return __fadd_rn(acc, __fadd_rn(__fmul_rn(dx0, a), __fmul_rn(dx1, b)));
}

__device__ __forceinline__ float q8_unit(float acc, float dw, float dx, int dot)
{
    return __fadd_rn(acc, __fmul_rn(__fmul_rn(dw, dx), (float)dot));
}

/* Warps per row (K) of every int8 GEMV: a function of the units per row
 * only, since the lane -> unit split and the reduction depend on it. A
 * one-token GEMV's time is its loads' latency, a round per unit a lane
 * takes, so K grows early: measured, 7b q4_k decode +4% with 2 warps at 56
 * units, 0.5b +4.5% with 4 at 152; but 7b q8_0 -2% with 4 at 112 (four
 * times the blocks of 2), and 7b -3.5% with 8 (256-thread blocks) from 256
 * (all at 4 rows per group, gemv_mr_q). */
static inline int gv_warps(int nu) { return nu >= 128 ? 4 : nu > 32 ? 2 : 1; }

__device__ __forceinline__ int byte_of3(uint4 h, int k)   /* byte k (0..11) of h.y, h.z, h.w */
{
    uint32_t w = k < 4 ? h.y : k < 8 ? h.z : h.w;
    return (int)((w >> (8 * (k & 3))) & 0xFF);
}

/* q4_K scales of pair j (0..3) of a super-block with header h, as q4k_unit takes them */
__device__ __forceinline__ void q4k_scales(uint4 h, int j, float &d0, float &d1, float &mm0, float &mm1)
{
    int c0 = 2 * j, c1 = 2 * j + 1, sc0, m0, sc1, m1;
    float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffff)));
    float dm = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
    if (j < 2) {
        sc0 = byte_of3(h, c0) & 63; m0 = byte_of3(h, c0 + 4) & 63;
        sc1 = byte_of3(h, c1) & 63; m1 = byte_of3(h, c1 + 4) & 63;
    } else {
        sc0 = (byte_of3(h, c0 + 4) & 0xF) | ((byte_of3(h, c0 - 4) >> 6) << 4);
        m0 = (byte_of3(h, c0 + 4) >> 4) | ((byte_of3(h, c0) >> 6) << 4);
        sc1 = (byte_of3(h, c1 + 4) & 0xF) | ((byte_of3(h, c1 - 4) >> 6) << 4);
        m1 = (byte_of3(h, c1 + 4) >> 4) | ((byte_of3(h, c1) >> 6) << 4);
    }
    d0 = d * (float)sc0; d1 = d * (float)sc1; mm0 = dm * (float)m0; mm1 = dm * (float)m1;
}

/* q4_K: lane takes one 64-value pair of a super-block (16-byte header and
 * 32 bytes of nibbles in three 16-byte loads); x as int8. */
template <int NT, int K>
__global__ void __launch_bounds__(128) k_gemv_q4k(const gv_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                  const float *__restrict__ xd, const int *__restrict__ xs, int T)
{
    pdl_begin();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    gv_row g = gv_row_of<K>(S, rb, warp);
    int mi = g.mi, r = g.r, part = g.part;
    bool live = g.live;
    const uint8_t *row = g.row;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int np = live ? n / 64 : 0, nbx = n / 32;
#pragma unroll 2
    for (int p = lane + 32 * part; p < np; p += 32 * K) {
        const uint8_t *b = row + (p >> 2) * 144;
        int j = p & 3;
        uint4 h = *(const uint4 *)b;
        uint4 q0 = *(const uint4 *)(b + 16 + 32 * j), q1 = *(const uint4 *)(b + 32 + 32 * j);
        float d0, d1, mm0, mm1;
        q4k_scales(h, j, d0, d1, mm0, mm1);
        uint32_t qw[8] = { q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w };
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const int4 *xv = (const int4 *)(xq + (size_t)t * n + 64 * p);
            int4 xa = xv[0], xb = xv[1], xc = xv[2], xe = xv[3];
            int xl[8] = { xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w };
            int xh[8] = { xc.x, xc.y, xc.z, xc.w, xe.x, xe.y, xe.z, xe.w };
            int dot0 = 0, dot1 = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                dot0 = __dp4a((int)(qw[k] & 0x0F0F0F0Fu), xl[k], dot0);
                dot1 = __dp4a((int)((qw[k] >> 4) & 0x0F0F0F0Fu), xh[k], dot1);
            }
            size_t xb0 = (size_t)t * nbx + 2 * p;
            float dx0 = __ldg(xd + xb0), dx1 = __ldg(xd + xb0 + 1);
            int s0 = __ldg(xs + xb0), s1 = __ldg(xs + xb0 + 1);
            acc[t] = q4k_unit(acc[t], dx0, d0, dot0, mm0, s0, dx1, d1, dot1, mm1, s1);
        }
    }
    gv_finish<NT, K>(acc, warp, lane, part, live, r, T, S.m[mi]);
}

/* q8_0 (repacked): lane takes one 32-value block: 32 quant bytes, one scale */
template <int NT, int K>
__global__ void __launch_bounds__(128) k_gemv_q8(const gv_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                 const float *__restrict__ xd, int T)
{
    pdl_begin();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    gv_row g = gv_row_of<K>(S, rb, warp);
    int mi = g.mi, r = g.r, part = g.part;
    bool live = g.live;
    const uint8_t *row = g.row;
    bool a16 = ((uintptr_t)row & 15) == 0;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int nb = live ? n / 32 : 0;
#pragma unroll 2
    for (int c = lane + 32 * part; c < nb; c += 32 * K) {
        int q[8];
        if (a16) {
            int4 u = *(const int4 *)(row + 32 * c), v = *(const int4 *)(row + 32 * c + 16);
            q[0] = u.x; q[1] = u.y; q[2] = u.z; q[3] = u.w; q[4] = v.x; q[5] = v.y; q[6] = v.z; q[7] = v.w;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) { int2 u = ld8(row + 32 * c + 8 * i); q[2 * i] = u.x; q[2 * i + 1] = u.y; }
        }
        float dw = h2f(row + n + 2 * c);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const int4 *xv = (const int4 *)(xq + (size_t)t * n + 32 * c);
            int4 xa = xv[0], xb = xv[1];
            int dot = __dp4a(q[0], xa.x, 0);
            dot = __dp4a(q[1], xa.y, dot); dot = __dp4a(q[2], xa.z, dot); dot = __dp4a(q[3], xa.w, dot);
            dot = __dp4a(q[4], xb.x, dot); dot = __dp4a(q[5], xb.y, dot); dot = __dp4a(q[6], xb.z, dot);
            dot = __dp4a(q[7], xb.w, dot);
            acc[t] = q8_unit(acc[t], dw, __ldg(xd + (size_t)t * (n / 32) + c), dot);
        }
    }
    gv_finish<NT, K>(acc, warp, lane, part, live, r, T, S.m[mi]);
}

/* per-unit sum of the q6_K GEMV: i0, i1 the exact integer dots of the
 * unit's two x blocks (their scales and -32 offsets applied) */
__device__ __forceinline__ float q6k_unit(float acc, float d, float dx0, int i0, float dx1, int i1)
{
    return __fadd_rn(acc, __fadd_rn(__fmul_rn(__fmul_rn(d, dx0), (float)i0), __fmul_rn(__fmul_rn(d, dx1), (float)i1)));
}

/* x's int8 values 64u .. 64u+63 of token t (xl the first 32, xh the
 * second, as words) and their two blocks' scales */
__device__ __forceinline__ void x_unit64(const int8_t *xq, const float *xd, int n, int t, int u, int (&xl)[8],
                                        int (&xh)[8], float &dx0, float &dx1)
{
    const int4 *xv = (const int4 *)(xq + (size_t)t * n + 64 * u);
    int4 xa = __ldg(xv), xb = __ldg(xv + 1), xc = __ldg(xv + 2), xe = __ldg(xv + 3);
    xl[0] = xa.x; xl[1] = xa.y; xl[2] = xa.z; xl[3] = xa.w; xl[4] = xb.x; xl[5] = xb.y; xl[6] = xb.z; xl[7] = xb.w;
    xh[0] = xc.x; xh[1] = xc.y; xh[2] = xc.z; xh[3] = xc.w; xh[4] = xe.x; xh[5] = xe.y; xh[6] = xe.z; xh[7] = xe.w;
    size_t xb0 = (size_t)t * (n / 32) + 2 * u;
    dx0 = __ldg(xd + xb0);
    dx1 = __ldg(xd + xb0 + 1);
}

__device__ __forceinline__ float silu_mul1(float a, float u) { return a / (1.0f + expf(-a)) * u; }

enum { GV_Q8 = 0, GV_Q4K = 1, GV_Q6K = 2 };   /* k_gemv_mr's weight kinds */

/* (the KV cache and rope helpers, for k_gemv_mr's rope epilogue) */
__device__ __forceinline__ size_t kv_slot(const int32_t *off, const int32_t *pages, int t, int p);
__device__ __forceinline__ void kv_put(void *c, int f16, size_t s, float v);
__device__ __forceinline__ void rope_cs(int p, int i, int n_rot, float base, const float *fd, float &cs, float &sn);

/* ---------------- int8 GEMV for decode batches (up to 16 tokens): several rows per group ----------------
 * A block of 4 warps holds 4/K groups of K warps; a group takes R rows. Each
 * thread loads its x units once per token and reuses them for the R rows, so
 * x traffic and the reduction are amortized over R rows and every thread has
 * R independent 16-byte weight loads in flight. KD (GV_*): q4_K, unit =
 * 64-value pair of a super-block (as k_gemv_q4k); q8_0 repacked, unit =
 * 32-value block; q6_K repacked, unit = 64 values (q6_word). */
/* GLU (one token, K 1, R 4; 512 threads): the set is (gate, up) of n_out
 * rows each, n_out % 32 == 0; block b takes outputs 32b .. 32b+31, warp w
 * the gate and up rows of outputs 32b+2w, +1 (each row's arithmetic is the
 * same as in any other launch), and the block writes silu(gate) * up of
 * its 32 outputs to the gate's out, with their int8 block (and f16 form)
 * by qo: the arithmetic of k_silu_mul, without its launch. */
/* ROPE (one token, R 1, K 2; the set q, k, v of a layer; rp): the rope
 * and KV store of k_rope_kv in the epilogue. A q or k block's two groups
 * take the two rows of one rope pair (neox: dims j and j + hd/2 of a
 * head, else 2j and 2j + 1, the plain mapping), so one thread holds both
 * sums; it adds the biases, ropes the pair (the table's angles, or
 * rope_cs's, read or computed before the launch wait), writes q or k, and
 * k's cache row; a v block writes v and its cache row plus bias. Every
 * value is k_gemv_mr's then k_rope_kv's (the same bits). */
template <int NT, int R, int K, int KD, int GLU, int PRE = 1, int ROPE = 0>
__global__ void __launch_bounds__(GLU ? 512 : 128) k_gemv_mr(const gv_set S, size_t rb, int n,
                                                             const int8_t *__restrict__ xq,
                                                             const float *__restrict__ xd,
                                                             const int *__restrict__ xs, int T, const xq_lay qo,
                                                             const ck_qkv_rope rp)
{
    static_assert(!ROPE || (NT == 1 && R == 1 && K == 2 && !GLU), "the rope epilogue: one pair a block");
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int mi = GLU ? 0 : gv_pick(S);
    const uint8_t *W = S.m[mi].W;
    int n_out = S.m[mi].n_out;
    int row0 = GLU ? 32 * (int)blockIdx.x : ((int)blockIdx.x - S.m[mi].blk0) * (4 / K) * R;   /* the block's first row */
    if (S.pf) {
        if (GLU) {
            l2_prefetch(W + (size_t)row0 * rb, 32 * rb);
            l2_prefetch(S.m[1].W + (size_t)row0 * rb, 32 * rb);
        } else {
            l2_prefetch(W + (size_t)row0 * rb, (size_t)min(4 / K * R, n_out - row0) * rb);
        }
    }
    const uint64_t pol = wpol();
    int r0 = row0 + warp / K * R, part = warp % K;
    /* the rope's inputs: angle, biases, cache slot (none written by the
     * kernels of this pass before it: the batch block and angle table come
     * first, biases are weights) */
    float rcs = 0.f, rsn = 0.f, rbA = 0.f, rbB = 0.f;
    size_t rslot = 0;
    if constexpr (ROPE != 0) {
        const int half = rp.head_dim / 2, pr = (int)blockIdx.x - S.m[mi].blk0;
        if (mi < 2 && rp.neox) r0 = pr / half * rp.head_dim + pr % half + (warp / K) * half;
        if (lane == 0 && part == 0) {
            const int p = rp.pos[0];
            rslot = kv_slot(rp.off, rp.pages, 0, p) * (size_t)(rp.n_head_kv * rp.head_dim);
            const float *bm = mi == 0 ? rp.bq : mi == 1 ? rp.bk : rp.bv;
            if (mi < 2 && warp == 0) {
                if (rp.tab) {
                    float2 a = ((const float2 *)rp.tab)[pr % half];
                    rcs = a.x; rsn = a.y;
                } else {
                    rope_cs(p, pr % half, rp.n_rot, rp.base, rp.fd, rcs, rsn);
                }
                if (bm) { rbA = bm[r0]; rbB = bm[rp.neox ? r0 + half : r0 + 1]; }
            } else if (mi == 2 && bm) {
                rbA = bm[min(r0, S.m[mi].n_out - 1)];
            }
        }
    }
    const uint8_t *rows[R];
    if (GLU) {
        r0 = row0 + 2 * warp;
#pragma unroll
        for (int r = 0; r < R; r++) rows[r] = (r < 2 ? W : S.m[1].W) + (size_t)(r0 + (r & 1)) * rb;
    } else {
#pragma unroll
        for (int r = 0; r < R; r++) rows[r] = W + (size_t)min(r0 + r, n_out - 1) * rb;
    }
    const bool Q4K = KD == GV_Q4K;
    int nu = KD == GV_Q8 ? n / 32 : n / 64, nbx = n / 32;
    /* the weights of a lane's unit u for the R rows (never written: q8_0's
     * first unit is loaded before the launch wait, off the path that waits
     * for x) */
    auto ld_q4k = [&](int u, uint4 (&h)[R], uint4 (&q0)[R], uint4 (&q1)[R]) {
        const int j = u & 3;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *b = rows[r] + (u >> 2) * 144;
            h[r] = wld16(b, pol);
            q0[r] = wld16(b + 16 + 32 * j, pol);
            q1[r] = wld16(b + 32 + 32 * j, pol);
        }
    };
    auto ld_q8 = [&](int u, int (&q)[R][8], float (&dw)[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *p = rows[r] + 32 * u;
            if (((uintptr_t)rows[r] & 15) == 0) {
                uint4 a = wld16(p, pol), c = wld16(p + 16, pol);
                q[r][0] = a.x; q[r][1] = a.y; q[r][2] = a.z; q[r][3] = a.w;
                q[r][4] = c.x; q[r][5] = c.y; q[r][6] = c.z; q[r][7] = c.w;
            } else if (((uintptr_t)rows[r] & 7) == 0) {
#pragma unroll
                for (int i = 0; i < 4; i++) { uint2 v = wld8(p + 8 * i, pol); q[r][2 * i] = v.x; q[r][2 * i + 1] = v.y; }
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) { int2 v = ld8(p + 8 * i); q[r][2 * i] = v.x; q[r][2 * i + 1] = v.y; }
            }
            dw[r] = __half2float(__ushort_as_half(wld2(rows[r] + n + 2 * u, pol)));
        }
    };
    /* q8_0: a unit's dot products for the R rows and every token */
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    auto dot_q8 = [&](int u, const int (&q)[R][8], const float (&dw)[R]) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const int4 *xv = (const int4 *)(xq + (size_t)t * n + 32 * u);
            int4 xa = __ldg(xv), xb = __ldg(xv + 1);
            float dx = __ldg(xd + (size_t)t * nbx + u);
#pragma unroll
            for (int r = 0; r < R; r++) {
                int dot = __dp4a(q[r][0], xa.x, 0);
                dot = __dp4a(q[r][1], xa.y, dot); dot = __dp4a(q[r][2], xa.z, dot); dot = __dp4a(q[r][3], xa.w, dot);
                dot = __dp4a(q[r][4], xb.x, dot); dot = __dp4a(q[r][5], xb.y, dot); dot = __dp4a(q[r][6], xb.z, dot);
                dot = __dp4a(q[r][7], xb.w, dot);
                acc[r][t] = q8_unit(acc[r][t], dw[r], dx, dot);
            }
        }
    };
    /* q8_0: a lane's first PRE units are loaded before the wait (off the
     * path that waits for x), then used in order (the same sums): two or
     * more in a loop of their own ahead of the main loop, one by the main
     * loop's first trip (either form for the other measured 2-3% slower,
     * BENCHMARKS.md); for q4_K the registers held across the wait cost more
     * than they gain (measured: 7b q4_k decode -6%, 7b q8_0 +5%, one unit) */
    const int u0 = lane + 32 * part;
    constexpr int PQ = KD == GV_Q8 ? PRE : 1;
    int pq[PQ][R][8];
    float pdw[PQ][R];
    if constexpr (KD == GV_Q8) {
#pragma unroll
        for (int i = 0; i < PQ; i++)
            if (u0 + 32 * K * i < nu) ld_q8(u0 + 32 * K * i, pq[i], pdw[i]);
    }
    pdl_begin();
    int u = u0;
    if constexpr (KD == GV_Q8 && PQ > 1) {
#pragma unroll
        for (int i = 0; i < PQ; i++, u += 32 * K)
            if (u < nu) dot_q8(u, pq[i], pdw[i]);
    }
    for (; u < nu; u += 32 * K) {
        if (KD == GV_Q6K) {
            /* 14 aligned words per row (8 QL, 4 QH, the scales, d's half); the
             * -32 offset as 32 times x's sum per 16 values (once per token) */
            uint32_t ql[R][8], qh[R][4], sw[R];
            float dd[R];
            int oq[8], oh[4];
#pragma unroll
            for (int k = 0; k < 8; k++) oq[k] = q6_word(nu, u, k, 8);
#pragma unroll
            for (int k = 0; k < 4; k++) oh[k] = n / 2 + q6_word(nu, u, k, 4);
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int k = 0; k < 8; k++) ql[r][k] = wld4(rows[r] + oq[k], pol);
#pragma unroll
                for (int k = 0; k < 4; k++) qh[r][k] = wld4(rows[r] + oh[k], pol);
                sw[r] = wld4(rows[r] + 3 * (n / 4) + 4 * u, pol);
                dd[r] = __half2float(__ushort_as_half(wld2(rows[r] + 13 * (n / 16) + 2 * (u >> 2), pol)));
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= T) break;
                int xl[8], xh[8];
                float dx0, dx1;
                x_unit64(xq, xd, n, t, u, xl, xh, dx0, dx1);
                int s16[4] = { 0, 0, 0, 0 };
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    s16[k >> 2] = __dp4a(xl[k], 0x01010101, s16[k >> 2]);
                    s16[2 + (k >> 2)] = __dp4a(xh[k], 0x01010101, s16[2 + (k >> 2)]);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int a[4] = { 0, 0, 0, 0 };
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        uint32_t hb = qh[r][k >> 1] >> (4 * (k & 1));
                        int lo = (int)((ql[r][k] & 0x0F0F0F0Fu) | ((hb & 0x03030303u) << 4));
                        int hi = (int)(((ql[r][k] >> 4) & 0x0F0F0F0Fu) | (((hb >> 2) & 0x03030303u) << 4));
                        a[k >> 2] = __dp4a(lo, xl[k], a[k >> 2]);
                        a[2 + (k >> 2)] = __dp4a(hi, xh[k], a[2 + (k >> 2)]);
                    }
                    int s = (int)sw[r];
                    int i0 = (int)(int8_t)s * (a[0] - 32 * s16[0]) + (int)(int8_t)(s >> 8) * (a[1] - 32 * s16[1]);
                    int i1 = (int)(int8_t)(s >> 16) * (a[2] - 32 * s16[2]) + (int)(int8_t)(s >> 24) * (a[3] - 32 * s16[3]);
                    acc[r][t] = q6k_unit(acc[r][t], dd[r], dx0, i0, dx1, i1);
                }
            }
        } else if (Q4K && NT <= 2) {
            /* one or two tokens: x loaded with the weights, before any of them is used */
            const int j = u & 3;
            uint4 h[R], q0[R], q1[R];
            ld_q4k(u, h, q0, q1);
            int xl[NT][8], xh[NT][8];
            float dx0[NT], dx1[NT];
            int s0[NT], s1[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int4 *xv = (const int4 *)(xq + (size_t)t * n + 64 * u);
                int4 xa = __ldg(xv), xb = __ldg(xv + 1), xc = __ldg(xv + 2), xe = __ldg(xv + 3);
                xl[t][0] = xa.x; xl[t][1] = xa.y; xl[t][2] = xa.z; xl[t][3] = xa.w;
                xl[t][4] = xb.x; xl[t][5] = xb.y; xl[t][6] = xb.z; xl[t][7] = xb.w;
                xh[t][0] = xc.x; xh[t][1] = xc.y; xh[t][2] = xc.z; xh[t][3] = xc.w;
                xh[t][4] = xe.x; xh[t][5] = xe.y; xh[t][6] = xe.z; xh[t][7] = xe.w;
                size_t xb0 = (size_t)t * nbx + 2 * u;
                dx0[t] = __ldg(xd + xb0); dx1[t] = __ldg(xd + xb0 + 1);
                s0[t] = __ldg(xs + xb0); s1[t] = __ldg(xs + xb0 + 1);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float d0, d1, mm0, mm1;
                q4k_scales(h[r], j, d0, d1, mm0, mm1);
                uint32_t qw[8] = { q0[r].x, q0[r].y, q0[r].z, q0[r].w, q1[r].x, q1[r].y, q1[r].z, q1[r].w };
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int dot0 = 0, dot1 = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        dot0 = __dp4a((int)(qw[k] & 0x0F0F0F0Fu), xl[t][k], dot0);
                        dot1 = __dp4a((int)((qw[k] >> 4) & 0x0F0F0F0Fu), xh[t][k], dot1);
                    }
                    acc[r][t] = q4k_unit(acc[r][t], dx0[t], d0, dot0, mm0, s0[t], dx1[t], d1, dot1, mm1, s1[t]);
                }
            }
        } else if (Q4K) {
            const int j = u & 3;
            float d0[R], d1[R], mm0[R], mm1[R];
            uint32_t qw[R][8];
            uint4 h[R], q0[R], q1[R];
            ld_q4k(u, h, q0, q1);
#pragma unroll
            for (int r = 0; r < R; r++) {
                q4k_scales(h[r], j, d0[r], d1[r], mm0[r], mm1[r]);
                qw[r][0] = q0[r].x; qw[r][1] = q0[r].y; qw[r][2] = q0[r].z; qw[r][3] = q0[r].w;
                qw[r][4] = q1[r].x; qw[r][5] = q1[r].y; qw[r][6] = q1[r].z; qw[r][7] = q1[r].w;
            }
            /* token by token: x is loaded once per unit and used for the R rows */
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= T) break;
                int xl[8], xh[8];
                float dx0, dx1;
                x_unit64(xq, xd, n, t, u, xl, xh, dx0, dx1);
                size_t xb0 = (size_t)t * nbx + 2 * u;
                int s0 = __ldg(xs + xb0), s1 = __ldg(xs + xb0 + 1);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int dot0 = 0, dot1 = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        dot0 = __dp4a((int)(qw[r][k] & 0x0F0F0F0Fu), xl[k], dot0);
                        dot1 = __dp4a((int)((qw[r][k] >> 4) & 0x0F0F0F0Fu), xh[k], dot1);
                    }
                    acc[r][t] = q4k_unit(acc[r][t], dx0, d0[r], dot0, mm0[r], s0, dx1, d1[r], dot1, mm1[r], s1);
                }
            }
        } else {
            int q[R][8];
            float dw[R];
            if (PQ == 1 && u == u0) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    dw[r] = pdw[0][r];
#pragma unroll
                    for (int k = 0; k < 8; k++) q[r][k] = pq[0][r][k];
                }
            } else {
                ld_q8(u, q, dw);
            }
            dot_q8(u, q, dw);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = acc[r][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            acc[r][t] = s;
        }
    /* (after the butterfly every lane holds every sum; lane l writes the
     * values l, l+32, ... of the R*NT) */
    const float *bias = S.m[mi].bias;
    float *out = S.m[mi].out;
    if constexpr (GLU) {
        __shared__ float hs[32];
        const float *bu = S.m[1].bias;
        if (lane < 2) {
            int r = r0 + lane;
            float g = (lane ? acc[1][0] : acc[0][0]) + (bias ? bias[r] : 0.f);
            float u = (lane ? acc[3][0] : acc[2][0]) + (bu ? bu[r] : 0.f);
            hs[2 * warp + lane] = silu_mul1(g, u);
        }
        __syncthreads();
        if (warp == 0) {
            float v = hs[lane];
            out[row0 + lane] = v;
            if (qo.q) quant_block(v, lane, (size_t)blockIdx.x, qo);
            if (qo.h) qo.h[row0 + lane] = f2h_sat(v);
        }
        return;
    }
    if (K > 1) {
        __shared__ float red[4][R * NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) if ((r * NT + t) % 32 == lane) red[warp][r * NT + t] = acc[r][t];
        __syncthreads();
        if (part != 0) return;
        if constexpr (ROPE != 0) {
            if (lane != 0) return;
            /* each row's sum as below (no bias there: + 0), then k_rope_kv's steps */
            float a = 0.f, c = 0.f;
#pragma unroll
            for (int k = 0; k < K; k++) a += red[warp + k][0];
            a = __fadd_rn(a, 0.f);
            if (mi == 2) {
                if (r0 < n_out) {
                    out[r0] = a;
                    kv_put(rp.vc, rp.f16, rslot + r0, rp.bv ? __fadd_rn(a, rbA) : a);
                }
                return;
            }
            if (warp != 0) return;
#pragma unroll
            for (int k = 0; k < K; k++) c += red[K + k][0];
            c = __fadd_rn(c, 0.f);
            const float *bm = mi == 0 ? rp.bq : rp.bk;
            if (bm) { a = __fadd_rn(a, rbA); c = __fadd_rn(c, rbB); }
            const int rB = rp.neox ? r0 + rp.head_dim / 2 : r0 + 1;
            float o0 = __fsub_rn(__fmul_rn(a, rcs), __fmul_rn(c, rsn));
            float o1 = __fadd_rn(__fmul_rn(a, rsn), __fmul_rn(c, rcs));
            out[r0] = o0;
            out[rB] = o1;
            if (mi == 1) {
                kv_put(rp.kc, rp.f16, rslot + r0, o0);
                kv_put(rp.kc, rp.f16, rslot + rB, o1);
            }
        } else {
            for (int i = lane; i < R * NT; i += 32) {
                float v = 0.f;
#pragma unroll
                for (int k = 0; k < K; k++) v += red[warp + k][i];
                int r = r0 + i / NT, t = i % NT;
                if (r < n_out && t < T) out[(size_t)t * n_out + r] = v + (bias ? bias[r] : 0.f);
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                if ((r * NT + t) % 32 == lane && r0 + r < n_out && t < T)
                    out[(size_t)t * n_out + r0 + r] = acc[r][t] + (bias ? bias[r0 + r] : 0.f);
    }
}

/* ---------------- one-token q8_0 GEMV of long rows by bulk copies ----------------
 * k_gemv_mr's one-token launch for rows of four warps (K 4, R 1: a block a
 * row; the 7b down projection's 592 units), with the row's bytes (quants,
 * then scales) brought into shared memory by one bulk copy that the block
 * issues before the launch wait, and x of all of a lane's units (at most
 * GB_UNITS) loaded at once after it. A lane's units, their order, the dot
 * products and the reduction are k_gemv_mr's, so every sum is the same;
 * only the loads differ: a block has its whole row in flight at once
 * instead of two units a lane ahead, so the launch's last, partial wave
 * still fills the memory pipe. Needs rb % 16 == 0 (n % 256 == 0). */
#define GB_UNITS 5
__device__ __forceinline__ void mb_init(uint64_t *mb, unsigned count)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(mb);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *mb, uint64_t pol)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst), m = (unsigned)__cvta_generic_to_shared(mb);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(d), "l"(src), "r"(bytes), "r"(m), "l"(pol) : "memory");
}
__device__ __forceinline__ void mb_expect(uint64_t *mb, unsigned bytes)
{
    unsigned m = (unsigned)__cvta_generic_to_shared(mb);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(m), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_wait0(uint64_t *mb)   /* phase 0 */
{
    unsigned m = (unsigned)__cvta_generic_to_shared(mb), done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(m) : "memory");
}

__global__ void __launch_bounds__(128) k_gemv_q8bulk(const gv_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                    const float *__restrict__ xd)
{
    extern __shared__ __align__(16) uint8_t wrow[];
    __shared__ uint64_t mb;
    __shared__ float red[4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int mi = gv_pick(S);
    const int r = (int)blockIdx.x - S.m[mi].blk0;
    if (threadIdx.x == 0) {
        mb_init(&mb, 1);
        mb_expect(&mb, (unsigned)rb);
        bulk_g2s(wrow, S.m[mi].W + (size_t)r * rb, (unsigned)rb, &mb, wpol());
    }
    __syncthreads();   /* (the barrier's init, for the other threads' waits) */
    pdl_begin();
    const int nu = n / 32, u0 = lane + 32 * warp;
    int4 xa[GB_UNITS], xb[GB_UNITS];
    float dx[GB_UNITS];
#pragma unroll
    for (int i = 0; i < GB_UNITS; i++) {   /* x while the row arrives */
        const int u = u0 + 128 * i;
        if (u < nu) {
            const int4 *xv = (const int4 *)(xq + 32 * u);
            xa[i] = __ldg(xv); xb[i] = __ldg(xv + 1);
            dx[i] = __ldg(xd + u);
        }
    }
    mb_wait0(&mb);
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < GB_UNITS; i++) {
        const int u = u0 + 128 * i;
        if (u >= nu) break;
        const int4 qa = *(const int4 *)(wrow + 32 * u), qb = *(const int4 *)(wrow + 32 * u + 16);
        const float dw = __half2float(*(const __half *)(wrow + n + 2 * u));
        int dot = __dp4a(qa.x, xa[i].x, 0);
        dot = __dp4a(qa.y, xa[i].y, dot); dot = __dp4a(qa.z, xa[i].z, dot); dot = __dp4a(qa.w, xa[i].w, dot);
        dot = __dp4a(qb.x, xb[i].x, dot); dot = __dp4a(qb.y, xb[i].y, dot); dot = __dp4a(qb.z, xb[i].z, dot);
        dot = __dp4a(qb.w, xb[i].w, dot);
        acc = q8_unit(acc, dw, dx[i], dot);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = 0.f;   /* (k_gemv_mr's K > 1 sum) */
#pragma unroll
        for (int k = 0; k < 4; k++) v += red[k];
        const float *bias = S.m[mi].bias;
        S.m[mi].out[r] = v + (bias ? bias[r] : 0.f);
    }
}

/* ---------------- int8 tensor-core matmul (q8_0, q4_K) ----------------
 * mma.m16n8k32 (s8): a warp multiplies 16 weight rows by 8 tokens over one
 * 32-value block, exact in int32, then adds the block's scaled sum in float,
 * block by block in order (q8_unit / q4k_unit). The MQ_WARPS warps of a CTA
 * take blocks w, w+MQ_WARPS, ... of the same 16 rows and are summed in warp
 * order; J tiles of 8 tokens share each weight load. Nothing in a (row,
 * token) result depends on T or on the token's place in the batch, so every
 * row of every batch, decode or prompt, gets the same arithmetic.
 * Fragments: lane = 4*g + q; A rows g and g+8, B token g; the 8 bytes a lane
 * gives for one block are bytes 8q..8q+7 of it in A and in B alike (the k
 * order within a block does not change an exact integer dot). */
#define MQ_WARPS 8
#define MQ_ROWS 16

__device__ __forceinline__ void mma_s8(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}


template <int J, bool Q4K>
__global__ void __launch_bounds__(MQ_WARPS * 32) k_mmq(const gv_set S, size_t rb, int n, const int8_t *__restrict__ xq,
                                                      const float *__restrict__ xd, const int *__restrict__ xs, int T,
                                                      int tp)
{
    pdl_begin();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int mi = gv_pick(S);
    const uint8_t *W = S.m[mi].W;
    int n_out = S.m[mi].n_out;
    int r0 = ((int)blockIdx.x - S.m[mi].blk0) * MQ_ROWS;
    int t0 = (int)blockIdx.y * 8 * J;
    const uint8_t *wa = W + (size_t)min(r0 + g, n_out - 1) * rb, *wb = W + (size_t)min(r0 + g + 8, n_out - 1) * rb;
    /* this lane's B token per tile; its two C tokens are tc, tc+1 (xd, xs:
     * the block-major copies, tp tokens per block) */
    const int8_t *xb[J];
#pragma unroll
    for (int j = 0; j < J; j++) xb[j] = xq + (size_t)min(t0 + 8 * j + g, T - 1) * n + 8 * q;
    const int tc = t0 + 2 * q;
    int jn = (T - t0 + 7) / 8;   /* live tiles (uniform over the CTA) */
    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    if (!Q4K) {
        int nbx = n / 32;
#pragma unroll 2
        for (int b = warp; b < nbx; b += MQ_WARPS) {
            int2 qa = ld8(wa + 32 * b + 8 * q), qb = ld8(wb + 32 * b + 8 * q);
            float dwa = h2f(wa + n + 2 * b), dwb = h2f(wb + n + 2 * b);
#pragma unroll
            for (int j = 0; j < J; j++) {
                if (j >= jn) break;
                int2 xv = *(const int2 *)(xb[j] + 32 * b);
                int c[4] = { 0, 0, 0, 0 };
                mma_s8(c, qa.x, qb.x, qa.y, qb.y, xv.x, xv.y);
                float2 dx = __ldg((const float2 *)(xd + (size_t)b * tp + tc + 8 * j));
                float dx0 = dx.x, dx1 = dx.y;
                acc[j][0] = q8_unit(acc[j][0], dwa, dx0, c[0]);
                acc[j][1] = q8_unit(acc[j][1], dwa, dx1, c[1]);
                acc[j][2] = q8_unit(acc[j][2], dwb, dx0, c[2]);
                acc[j][3] = q8_unit(acc[j][3], dwb, dx1, c[3]);
            }
        }
    } else {
        int nu = n / 64;
#pragma unroll 2
        for (int u = warp; u < nu; u += MQ_WARPS) {
            int sb = u >> 2, j4 = u & 3;
            const uint8_t *ba = wa + (size_t)sb * 144, *bb = wb + (size_t)sb * 144;
            uint4 ha = __ldg((const uint4 *)ba), hb = __ldg((const uint4 *)bb);
            int2 qa = *(const int2 *)(ba + 16 + 32 * j4 + 8 * q), qb = *(const int2 *)(bb + 16 + 32 * j4 + 8 * q);
            float da0, da1, ma0, ma1, db0, db1, mb0, mb1;
            q4k_scales(ha, j4, da0, da1, ma0, ma1);
            q4k_scales(hb, j4, db0, db1, mb0, mb1);
            const int lo = 0x0F0F0F0F;
            int al0 = qa.x & lo, al1 = qb.x & lo, al2 = qa.y & lo, al3 = qb.y & lo;
            int ah0 = (qa.x >> 4) & lo, ah1 = (qb.x >> 4) & lo, ah2 = (qa.y >> 4) & lo, ah3 = (qb.y >> 4) & lo;
            int xo = 64 * u;
#pragma unroll
            for (int j = 0; j < J; j++) {
                if (j >= jn) break;
                int2 x0 = *(const int2 *)(xb[j] + xo), x1 = *(const int2 *)(xb[j] + xo + 32);
                int c0[4] = { 0, 0, 0, 0 }, c1[4] = { 0, 0, 0, 0 };
                mma_s8(c0, al0, al1, al2, al3, x0.x, x0.y);
                mma_s8(c1, ah0, ah1, ah2, ah3, x1.x, x1.y);
                size_t k0 = (size_t)(2 * u) * tp + tc + 8 * j, k1 = k0 + tp;
                float2 dA = __ldg((const float2 *)(xd + k0)), dB = __ldg((const float2 *)(xd + k1));
                int2 sA = __ldg((const int2 *)(xs + k0)), sB = __ldg((const int2 *)(xs + k1));
                float e0 = dA.x, f0 = dA.y, e1 = dB.x, f1 = dB.y;
                int s0 = sA.x, z0 = sA.y, s1 = sB.x, z1 = sB.y;
                acc[j][0] = q4k_unit(acc[j][0], e0, da0, c0[0], ma0, s0, e1, da1, c1[0], ma1, s1);
                acc[j][1] = q4k_unit(acc[j][1], f0, da0, c0[1], ma0, z0, f1, da1, c1[1], ma1, z1);
                acc[j][2] = q4k_unit(acc[j][2], e0, db0, c0[2], mb0, s0, e1, db1, c1[2], mb1, s1);
                acc[j][3] = q4k_unit(acc[j][3], f0, db0, c0[3], mb0, z0, f1, db1, c1[3], mb1, z1);
            }
        }
    }
    __shared__ float red[MQ_WARPS][J * 4][32];
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][j * 4 + i][lane] = acc[j][i];
    __syncthreads();
    /* warp w sums value slots w, w+MQ_WARPS, ... over the warps, in warp order */
    const float *bias = S.m[mi].bias;
    float *out = S.m[mi].out;
    for (int k = warp; k < J * 4; k += MQ_WARPS) {
        int j = k >> 2, i = k & 3;
        float v = red[0][k][lane];
#pragma unroll
        for (int w = 1; w < MQ_WARPS; w++) v = __fadd_rn(v, red[w][k][lane]);
        int r = r0 + g + (i >= 2 ? 8 : 0), t = t0 + 8 * j + 2 * q + (i & 1);
        if (r < n_out && t < T) out[(size_t)t * n_out + r] = v + (bias ? bias[r] : 0.f);
    }
}

/* ---------------- q4_K matmul for decode batches (f16 tensor cores) ----------------
 * Decode batches of CK_GEMV_MAX_T+1 .. CK_MMQB_MAX_T tokens (past the
 * batch-invariant GEMVs) of q4_K matrices: the quantized weights are read
 * once per step, where cuBLAS reads an f16 copy (3.6x the bytes). A CTA
 * takes 128 rows (8 warps x 16) and walks its K range a super-block (256
 * values) at a time; each chunk's weight bytes and x (f16, JN tiles of 8
 * tokens) come into shared memory by cp.async while the chunk before is
 * computed. The CTA decodes the chunk's sub-block scales once; each lane
 * dequantizes its share of the nibbles to f16 in registers (0x6400 | q is
 * the half 1024 + q) and mma.m16n8k16 accumulates whole chunks in f32.
 * Short matrices split K over sp CTAs per row tile (chosen per matrix,
 * never by the batch around it): their partials go to scratch and the
 * tile's last CTA to finish (a counter) sums them in split order.
 * Fragments: in a sub-block, lane (g, q) takes values 8q..8q+7, the first
 * four in k-step 0 and the last four in k-step 1: a0 / a2 row g's values
 * +0, +1 / +2, +3 of its four (a1, a3: row g+8), b0 / b1 the same values of
 * token g; so a lane reads 8 bytes of nibbles per row and group and 16
 * bytes of x per sub-block and token tile. */
#define MB_WARPS 8
#define MB_ROWS (MB_WARPS * 16)
#define MH_CH 256                /* values per chunk: a super-block */
#define MH_XS (MH_CH + 32)       /* halves per token row of x in shared memory (no bank conflicts) */
#define MH_WB 160                /* bytes per row and chunk: the super-block, padded (no bank conflicts) */
#define MH_SB (MH_CH / 32)       /* sub-blocks per chunk */
#define MH_ST 2                  /* chunk buffers (the prologues load one chunk ahead) */

template <int J> struct mh_smem {
    __half x[MH_ST][J * 8][MH_XS];
    uint8_t w[MH_ST][MB_ROWS][MH_WB];
    uint2 sc[2][MB_ROWS][MH_SB + 1];   /* per row, the chunk's sub-blocks: (d * sc, -dmin * m) as half2s (padded) */
};

__device__ __forceinline__ void cp_async16(void *smem, const void *g, int bytes)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *(uint32_t *)&h; }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *(__half2 *)&u; }

/* bytes b0..b3 of u, nibble plane P, as the halves (b0, b1) and (b2, b3) of q * ds + nmm */
template <int P>
__device__ __forceinline__ void q4_pair(uint32_t u, __half2 ds, __half2 nmm, uint32_t &lo, uint32_t &hi)
{
    uint32_t s01 = __byte_perm(u, 0, 0x4140), s23 = __byte_perm(u, 0, 0x4342);
    __half2 a, b;
    if (P == 0) {   /* 1024 + q, exact; minus 1024 */
        const __half2 k1024 = __floats2half2_rn(1024.f, 1024.f);
        a = __hsub2(u2h((s01 & 0x000F000Fu) | 0x64006400u), k1024);
        b = __hsub2(u2h((s23 & 0x000F000Fu) | 0x64006400u), k1024);
    } else {        /* 1024 + 16 q; / 16 - 64, exact */
        const __half2 r16 = __floats2half2_rn(0.0625f, 0.0625f), m64 = __floats2half2_rn(-64.f, -64.f);
        a = __hfma2(u2h((s01 & 0x00F000F0u) | 0x64006400u), r16, m64);
        b = __hfma2(u2h((s23 & 0x00F000F0u) | 0x64006400u), r16, m64);
    }
    lo = h2u(__hfma2(a, ds, nmm));
    hi = h2u(__hfma2(b, ds, nmm));
}

/* The last CTA of a row tile: the sp splits' partials (J * 8 tokens x
 * MB_ROWS rows each, from part0) summed in split order, plus bias, into
 * out. A thread takes 4 rows of token tid / 32 + 8 j for each j; the loads
 * of U splits are issued together. Gate and up (glu_h): lane l < 16 holds
 * gate rows 4 l.. of the tile's features, lane l + 16 their up rows; the
 * gate lanes write silu(g) * u and its f16 form. */
template <int J>
__device__ __forceinline__ void mb_sum(const float *part0, int sp, int tile, int n_out, int T, const float *bias,
                                       float *out, int tid, __half *glu_h)
{
    constexpr int SLOT4 = J * 8 * MB_ROWS / 4, U = 4;   /* (J <= 4) */
    const float4 *p0 = (const float4 *)part0;
    float4 v[J];
#pragma unroll
    for (int j = 0; j < J; j++) v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    int s = 0;
    for (; s < sp; s += U) {
        float4 a[U][J];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < J; j++)
                a[u][j] = s + u < sp ? __ldcg(p0 + (size_t)(s + u) * SLOT4 + tid + j * MB_WARPS * 32)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < J; j++) {
                if (s + u >= sp) break;
                v[j].x += a[u][j].x; v[j].y += a[u][j].y; v[j].z += a[u][j].z; v[j].w += a[u][j].w;
            }
    }
    static_assert(MB_ROWS / 4 == 32, "a warp's lanes take one token's rows of a tile");
    if (glu_h) {
        const int lane = tid & 31, H = MB_ROWS / 2;
#pragma unroll
        for (int j = 0; j < J; j++) {
            float4 u;
            u.x = __shfl_down_sync(0xffffffffu, v[j].x, 16); u.y = __shfl_down_sync(0xffffffffu, v[j].y, 16);
            u.z = __shfl_down_sync(0xffffffffu, v[j].z, 16); u.w = __shfl_down_sync(0xffffffffu, v[j].w, 16);
            int t = tid / 32 + j * (MB_WARPS * 32 * 4 / MB_ROWS), f = tile * H + lane * 4;
            float e[4] = { silu_mul1(v[j].x, u.x), silu_mul1(v[j].y, u.y), silu_mul1(v[j].z, u.z), silu_mul1(v[j].w, u.w) };
            if (lane < 16 && t < T)
                for (int k = 0; k < 4; k++) {
                    out[(size_t)t * n_out + f + k] = e[k];
                    glu_h[(size_t)t * n_out + f + k] = f2h_sat(e[k]);
                }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < J; j++) {
        int t = tid / (MB_ROWS / 4) + j * (MB_WARPS * 32 * 4 / MB_ROWS), r = tile * MB_ROWS + (tid % (MB_ROWS / 4)) * 4;
        float e[4] = { v[j].x, v[j].y, v[j].z, v[j].w };
        if (t < T)
            for (int k = 0; k < 4; k++)
                if (r + k < n_out) out[(size_t)t * n_out + r + k] = e[k] + (bias ? bias[r + k] : 0.f);
    }
}

/* What k_mmqh and k_mmqw share. A block's weight copies of a chunk: piece
 * p = tid + NT k is row p / 9's 16-byte piece p % 9, so a warp reads whole
 * rows' runs (measured: the gate+up of a 7b at 19% less time than with a
 * row's pieces split over two threads); rows PITCH bytes apart. */
#define MH_NT (MB_WARPS * 32)
#define MH_WP ((MB_ROWS * 9 + MH_NT - 1) / MH_NT)
/* A block's place: its matrix (S.m[mi]), its index among that matrix's
 * blocks, the K split, its row tile and its chunks [c0, c1) */
struct mh_place { int mi, local, sp, tile, c0, c1; };
__device__ __forceinline__ mh_place mh_where(const gv_set &S, int n)
{
    mh_place P;
    P.mi = gv_pick(S);
    const gv_mat &M = S.m[P.mi];
    P.local = (int)blockIdx.x - M.blk0;
    P.sp = M.sp;
    P.tile = P.local / P.sp;
    P.c0 = (P.local - P.tile * P.sp) * M.per;
    P.c1 = min(P.c0 + M.per, n / MH_CH);
    return P;
}
template <int PITCH> struct mh_wcp {
    const uint8_t *src[MH_WP];
    int off[MH_WP];
    __device__ __forceinline__ mh_wcp(const gv_set &S, const gv_mat &M, int tile, size_t rb, int tid)
    {
#pragma unroll
        for (int k = 0; k < MH_WP; k++) {
            int p = min(tid + MH_NT * k, MB_ROWS * 9 - 1), r = p / 9, pc = p - r * 9;
            if (S.glu_u)   /* rows 0..63: gate features tile * 64 + r; 64..127: the same features' up rows */
                src[k] = (r < MB_ROWS / 2 ? M.W : S.glu_u) + (size_t)(tile * (MB_ROWS / 2) + (r & (MB_ROWS / 2 - 1))) * rb + 16 * pc;
            else
                src[k] = M.W + (size_t)min(tile * MB_ROWS + r, M.n_out - 1) * rb + 16 * pc;
            off[k] = r * PITCH + 16 * pc;
        }
    }
    /* chunk c's weights into w (a stage's rows) */
    __device__ __forceinline__ void copy(uint8_t *w, int c, int tid) const
    {
#pragma unroll
        for (int k = 0; k < MH_WP; k++)
            if (tid + MH_NT * k < MB_ROWS * 9) cp_async16(w + off[k], src[k] + (size_t)c * 144, 16);
    }
};
/* the chunk's sub-block scales (d * sc, -dmin * m as half2s): row e / 4, sub-block pair e % 4 */
template <int PITCH>
__device__ __forceinline__ void mh_scales(const uint8_t (*w)[PITCH], uint2 (*sc)[MH_SB + 1], int tid)
{
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int e = tid + k * MH_NT, jp = e & 3;
        float d0, d1, m0, m1;
        q4k_scales(*(const uint4 *)w[e >> 2], jp, d0, d1, m0, m1);
        sc[e >> 2][2 * jp] = make_uint2(h2u(__floats2half2_rn(d0, d0)), h2u(__floats2half2_rn(-m0, -m0)));
        sc[e >> 2][2 * jp + 1] = make_uint2(h2u(__floats2half2_rn(d1, d1)), h2u(__floats2half2_rn(-m1, -m1)));
    }
}
/* A block's sums (rows ra, ra + 8 of its tile; tokens 8 j + 2 q, + 1) out,
 * or with a split K to its partial slot, the tile's last block summing the
 * slots (mb_sum). Gate and up (S.glu_u) unsplit: the up warps' sums go
 * through ex (shared memory of 64 x (8 J + 1) floats, free once every warp
 * is past its last chunk) to the gate warps, which write silu(g) * u as
 * k_silu_mul does, and its f16 form (split: mb_sum does the same). */
template <int J>
__device__ __forceinline__ void mh_finish(const float (&acc)[J][4], const gv_set &S, const mh_place &P, int ra,
                                          int q, int T, float *part, int *cnt, int tid, int &last, float *ex)
{
    const gv_mat &M = S.m[P.mi];
    const float *bias = M.bias;
    float *out = M.out;
    const int n_out = M.n_out, sp = P.sp, tile = P.tile;
    if (S.glu_u && sp == 1) {
        constexpr int H = MB_ROWS / 2, XS = J * 8 + 1;
        __syncthreads();
        if (ra >= H)
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) ex[(ra - H + (i >> 1) * 8) * XS + 8 * j + 2 * q + (i & 1)] = acc[j][i];
        __syncthreads();
        if (ra < H)
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = ra + (i >> 1) * 8, f = tile * H + r, t = 8 * j + 2 * q + (i & 1);
                    if (t < T) {
                        float v = silu_mul1(acc[j][i], ex[r * XS + t]);
                        out[(size_t)t * n_out + f] = v;
                        S.glu_h[(size_t)t * n_out + f] = f2h_sat(v);
                    }
                }
        return;
    }
    if (sp == 1) {
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = tile * MB_ROWS + ra + (i >> 1) * 8, t = 8 * j + 2 * q + (i & 1);
                if (r < n_out && t < T) out[(size_t)t * n_out + r] = acc[j][i] + (bias ? bias[r] : 0.f);
            }
        return;
    }
    float *mine = part + ((size_t)M.pb + P.local) * (J * 8 * MB_ROWS);
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) mine[(8 * j + 2 * q + (i & 1)) * MB_ROWS + ra + (i >> 1) * 8] = acc[j][i];
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(cnt + M.cb + tile, 1) == sp - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    mb_sum<J>(part + ((size_t)M.pb + (size_t)tile * sp) * (J * 8 * MB_ROWS), sp, tile, n_out, T, bias, out, tid,
              S.glu_u ? S.glu_h : NULL);
    if (tid == 0) cnt[M.cb + tile] = 0;   /* ready for the next launch */
}

template <int J>
__global__ void __launch_bounds__(MB_WARPS * 32, 2)
    k_mmqh(const gv_set S, size_t rb, int n, const __half *__restrict__ x16, int T, float *__restrict__ part,
           int *__restrict__ cnt)
{
    extern __shared__ __align__(16) unsigned char mh_raw[];
    mh_smem<J> &sm = *(mh_smem<J> *)mh_raw;
    __shared__ int last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const mh_place P = mh_where(S, n);
    const gv_mat &M = S.m[P.mi];
    const int c0 = P.c0, c1 = P.c1, ra = warp * 16 + g;
    constexpr int XP = (J * 8 * 32 + MH_NT - 1) / MH_NT;
    const mh_wcp<MH_WB> wc(S, M, P.tile, rb, tid);
    auto load_w = [&](int c, int st) { wc.copy(&sm.w[st][0][0], c, tid); };
    auto load_x = [&](int c, int st) {
#pragma unroll
        for (int k = 0; k < XP; k++) {
            int p = tid + MH_NT * k, xt = p >> 5, xk = (p & 31) * 8;
            bool xv = xt < T;
            if (p < J * 8 * 32)
                cp_async16(&sm.x[st][xt][xk], x16 + (size_t)(xv ? xt : 0) * n + (size_t)c * MH_CH + xk, xv ? 16 : 0);
        }
    };
    auto load = [&](int c, int st) { load_w(c, st); load_x(c, st); };

    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    /* the first chunk's weights before the wait (no kernel writes them: they
     * stream in while the kernel before ends), x after */
    if (c0 < c1) load_w(c0, 0);
    pdl_begin();
    if (c0 < c1) load_x(c0, 0);
    cp_commit();
    for (int c = c0, i = 0; c < c1; c++, i++) {
        const int st = i % MH_ST, sb = i & 1;
        cp_wait<MH_ST - 2>();   /* chunk c is in */
        __syncthreads();        /* ... for every thread; and chunk c - 1's buffers are free */
        if (c + MH_ST - 1 < c1) load(c + MH_ST - 1, (i + MH_ST - 1) % MH_ST);
        cp_commit();
        mh_scales<MH_WB>(sm.w[st], sm.sc[sb], tid);
        __syncthreads();
        /* group gi (sub-blocks 2 gi, 2 gi + 1): this lane's 8 bytes of each row */
#pragma unroll
        for (int gi = 0; gi < MH_SB / 2; gi++) {
            uint2 ua = *(const uint2 *)&sm.w[st][ra][16 + 32 * gi + 8 * q];
            uint2 ub = *(const uint2 *)&sm.w[st][ra + 8][16 + 32 * gi + 8 * q];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int s = 2 * gi + h;
                uint2 sca = sm.sc[sb][ra][s], scb = sm.sc[sb][ra + 8][s];
                uint32_t a[2][4];   /* [kk]: a0..a3 */
                if (h) {
                    q4_pair<1>(ua.x, u2h(sca.x), u2h(sca.y), a[0][0], a[0][2]);
                    q4_pair<1>(ub.x, u2h(scb.x), u2h(scb.y), a[0][1], a[0][3]);
                    q4_pair<1>(ua.y, u2h(sca.x), u2h(sca.y), a[1][0], a[1][2]);
                    q4_pair<1>(ub.y, u2h(scb.x), u2h(scb.y), a[1][1], a[1][3]);
                } else {
                    q4_pair<0>(ua.x, u2h(sca.x), u2h(sca.y), a[0][0], a[0][2]);
                    q4_pair<0>(ub.x, u2h(scb.x), u2h(scb.y), a[0][1], a[0][3]);
                    q4_pair<0>(ua.y, u2h(sca.x), u2h(sca.y), a[1][0], a[1][2]);
                    q4_pair<0>(ub.y, u2h(scb.x), u2h(scb.y), a[1][1], a[1][3]);
                }
#pragma unroll
                for (int j = 0; j < J; j++) {
                    uint4 xv4 = *(const uint4 *)&sm.x[st][8 * j + g][32 * s + 8 * q];
                    mma_f16(acc[j], a[0][0], a[0][1], a[0][2], a[0][3], xv4.x, xv4.y);
                    mma_f16(acc[j], a[1][0], a[1][1], a[1][2], a[1][3], xv4.z, xv4.w);
                }
            }
        }
    }
    cp_wait<0>();
    mh_finish<J>(acc, S, P, ra, q, T, part, cnt, tid, last, (float *)&sm.w[0][0][0]);
}

/* ---------------- q4_K matmul for decode batches (Hopper warpgroup MMA) ----------------
 * k_mmqh's work on sm_90a with wgmma: each warpgroup (4 warps, 64 rows)
 * issues m64n(8J)k16 MMAs whose x operand the tensor cores read from shared
 * memory themselves, once per warpgroup (k_mmqh's warps each read every x
 * fragment through registers: most of its shared-memory traffic), and which
 * run asynchronously while the warps dequantize the next sub-block. The
 * weights' A fragments come from registers as in k_mmqh, in the canonical
 * k order (lane q: values 2q, 2q+1, 2q+8, 2q+9 of each 16), so a lane
 * gathers 2-byte pieces of the nibbles. x is copied into the K-major
 * layout with the 128-byte swizzle: a token's 64 values of one atom are a
 * 128-byte row whose 16-byte pieces are permuted by the row's index in its
 * group of 8 tokens, so a quarter-warp's 8 pieces of one token are one
 * 128-byte run in global memory and one shared-memory line (measured: the
 * unswizzled layouts split each quarter-warp's copy over 8 lines or 8 half
 * sectors, doubling the copies' L2 reads). Atoms: [K / 64][token group]
 * [8 tokens][128 bytes], 1024-byte aligned. A lane decodes sub-blocks 2q,
 * 2q + 1's scales of its two rows and takes the others from its row
 * group's lanes by shuffle (no barrier or buffer for them: +2.2% on the 7b
 * step; k_mmqh lost by it). Same tiles, chunks, split and
 * partial sums as k_mmqh. Measured on a 7b layer, 32 tokens: gate+up 61.7
 * against 64.2 us, down 36.0 against 37.7; at 24 tokens no gain. The
 * kernel is bound by neither its copies nor its math (issue 44%, tensor
 * 14%, DRAM 39%) but by each warp's chain of waits, as is k_mmqh.
 * Q6: q6_K in the batched layout (k_repack_q6_Kb), the same tiles, chunks
 * and split, a chunk's MMAs by mw_q6_chunk. */
#define MW_WB 176   /* bytes per row and chunk: 2-byte gathers by 8 rows hit 16 banks */
#define MW_AT 1024  /* bytes per swizzle atom (8 tokens x 64 values) */
#define Q6B_CH 224  /* bytes per row and super-block of q6_K in the batched layout (k_repack_q6_Kb) */

/* q6_K (Q6): a chunk is the super-block in the batched layout (Q6B_CH
 * bytes, k_repack_q6_Kb): the values' 192 bytes to w (rows 192 bytes apart:
 * a quarter-warp's rows g, g + 1 on other banks), the 16 scales to sc */
#define MW6_WB 192
struct q6_stage {
    uint8_t w[MB_ROWS][MW6_WB];
    uint4 sc[MB_ROWS][2];
};
template <int J, bool Q6> struct mw_smem;
template <int J> struct mw_smem<J, false> {
    uint4 x[MH_ST][MH_CH / 64 * J * MW_AT / 16];
    uint8_t w[MH_ST][MB_ROWS][MW_WB];
};
template <int J> struct mw_smem<J, true> {
    uint4 x[MH_ST][MH_CH / 64 * J * MW_AT / 16];
    q6_stage w[MH_ST];
};
template <int J> __device__ __forceinline__ uint8_t *mw_wst(mw_smem<J, false> &sm, int st) { return &sm.w[st][0][0]; }
template <int J> __device__ __forceinline__ uint8_t *mw_wst(mw_smem<J, true> &sm, int st) { return (uint8_t *)&sm.w[st]; }
/* A block's weight copies of a q6_K chunk: piece p = tid + NT k is row
 * p / 14's piece p % 14 (0, 1: the scales) */
#define MW6_WP (MB_ROWS * (Q6B_CH / 16) / MH_NT)
struct mw6_wcp {
    const uint8_t *src[MW6_WP];
    int off[MW6_WP];
    __device__ __forceinline__ mw6_wcp(const gv_set &, const gv_mat &M, int tile, size_t rb, int tid)
    {
#pragma unroll
        for (int k = 0; k < MW6_WP; k++) {
            int p = tid + MH_NT * k, r = p / (Q6B_CH / 16), pc = p - r * (Q6B_CH / 16);
            src[k] = M.W + (size_t)min(tile * MB_ROWS + r, M.n_out - 1) * rb + 16 * pc;
            off[k] = pc < 2 ? MB_ROWS * MW6_WB + r * 32 + 16 * pc : r * MW6_WB + 16 * (pc - 2);
        }
    }
    __device__ __forceinline__ void copy(uint8_t *w, int c, int tid) const
    {
#pragma unroll
        for (int k = 0; k < MW6_WP; k++) cp_async16(w + off[k], src[k] + (size_t)c * Q6B_CH, 16);
    }
};
/* four values of q6_K sub-block t (0..3) of a batched-layout group from
 * their ql word (t's 4 low bits: t's low or high nibbles) and qh word (bits
 * 2t, 2t + 1 of each byte), times the sub-block's scale ds: bytes 0, 1 and
 * 2, 3 as half2s. 0x6400 | q is the half 1024 + q; minus 1056, q - 32, exact */
__device__ __forceinline__ void q6_pair(uint32_t ql, uint32_t qh, int t, __half2 ds, uint32_t &lo, uint32_t &hi)
{
    uint32_t nib = (t & 1 ? ql >> 4 : ql) & 0x0F0F0F0Fu;
    uint32_t top = (t == 0 ? qh << 4 : t == 1 ? qh << 2 : t == 2 ? qh : qh >> 2) & 0x30303030u;
    uint32_t v = nib | top;
    const __half2 k1056 = __floats2half2_rn(1056.f, 1056.f);
    lo = h2u(__hmul2(__hsub2(u2h(__byte_perm(v, 0x64646464u, 0x4140)), k1056), ds));
    hi = h2u(__hmul2(__hsub2(u2h(__byte_perm(v, 0x64646464u, 0x4342)), k1056), ds));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CK_HAVE_WGMMA 1
__device__ __forceinline__ uint64_t wg_desc(const void *smem)
{
    uint64_t a = (uint64_t)__cvta_generic_to_shared(smem);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(MW_AT >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

/* d += A (64 x 16, registers) * B (16 x 8J, shared memory at desc) */
template <int J> __device__ __forceinline__ void wg_mma(float (&d)[J][4], const uint32_t (&a)[4], uint64_t desc);
template <> __device__ __forceinline__ void wg_mma<4>(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<3>(float (&d)[3][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, %16, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
#endif

#if defined(CK_HAVE_WGMMA)
/* A q6_K chunk's MMAs (k_mmqw): lane q's three pieces of rows ra and
 * ra + 8 hold its values of every sub-block (k-step), each ql piece two
 * groups'; a group's 4 scales of a row come as 8 bytes (the lanes of a row
 * read the same words) */
template <int J>
__device__ __forceinline__ void mw_q6_chunk(float (&acc)[J][4], const q6_stage &w, uint64_t xd, int ra, int q)
{
    const uint4 ha = *(const uint4 *)&w.w[ra][128 + 16 * q], hb = *(const uint4 *)&w.w[ra + 8][128 + 16 * q];
    uint4 la, lb;
    auto word = [](const uint4 &u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; };
    auto scale = [](const uint2 &s, int t) {   /* sub-block t of the group's scales as a half2 pair */
        uint32_t u = t >> 1 ? s.y : s.x;
        return u2h(__byte_perm(u, u, t & 1 ? 0x3232 : 0x1010));
    };
#pragma unroll
    for (int gi = 0; gi < 4; gi++) {
        if (!(gi & 1)) {
            la = *(const uint4 *)&w.w[ra][64 * (gi >> 1) + 16 * q];
            lb = *(const uint4 *)&w.w[ra + 8][64 * (gi >> 1) + 16 * q];
        }
        const uint2 sa = *(const uint2 *)((const uint8_t *)w.sc[ra] + 8 * gi);
        const uint2 sb = *(const uint2 *)((const uint8_t *)w.sc[ra + 8] + 8 * gi);
        const uint32_t qha = word(ha, gi), qhb = word(hb, gi);
#pragma unroll
        for (int tp = 0; tp < 2; tp++) {
            const uint32_t qla = word(la, 2 * (gi & 1) + tp), qlb = word(lb, 2 * (gi & 1) + tp);
            uint32_t a0[4], a1[4];
            q6_pair(qla, qha, 2 * tp, scale(sa, 2 * tp), a0[0], a0[2]);
            q6_pair(qlb, qhb, 2 * tp, scale(sb, 2 * tp), a0[1], a0[3]);
            q6_pair(qla, qha, 2 * tp + 1, scale(sa, 2 * tp + 1), a1[0], a1[2]);
            q6_pair(qlb, qhb, 2 * tp + 1, scale(sb, 2 * tp + 1), a1[1], a1[3]);
            wg_fence();
            /* k-steps 4 gi + 2 tp, + 1: atom gi, 32-byte steps within its rows */
            wg_mma<J>(acc, a0, xd + ((gi * J * MW_AT + 64 * tp) >> 4));
            wg_mma<J>(acc, a1, xd + ((gi * J * MW_AT + 64 * tp + 32) >> 4));
            wg_commit();
        }
    }
    wg_wait<0>();
}
#endif

template <int J, bool Q6>
__global__ void __launch_bounds__(MB_WARPS * 32, 2)
    k_mmqw(const gv_set S, size_t rb, int n, const __half *__restrict__ x16, int T, float *__restrict__ part,
           int *__restrict__ cnt)
{
#if defined(CK_HAVE_WGMMA)
    extern __shared__ __align__(128) unsigned char mw_raw[];
    mw_smem<J, Q6> &sm = *(mw_smem<J, Q6> *)(mw_raw + ((MW_AT - ((unsigned)__cvta_generic_to_shared(mw_raw) & (MW_AT - 1))) & (MW_AT - 1)));
    __shared__ int last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const mh_place P = mh_where(S, n);
    const gv_mat &M = S.m[P.mi];
    const int c0 = P.c0, c1 = P.c1, ra = warp * 16 + g;
    constexpr int XP = (J * 8 * 32 + MH_NT - 1) / MH_NT;
    const typename std::conditional<Q6, mw6_wcp, mh_wcp<MW_WB>>::type wc(S, M, P.tile, rb, tid);
    auto load_w = [&](int c, int st) { wc.copy(mw_wst<J>(sm, st), c, tid); };
    auto load_x = [&](int c, int st) {
#pragma unroll
        for (int k = 0; k < XP; k++) {
            int p = tid + MH_NT * k, xt = p >> 5, pc = p & 31;
            bool xv = xt < T;
            if (p < J * 8 * 32)
                cp_async16(&sm.x[st][((pc >> 3) * J + (xt >> 3)) * (MW_AT / 16) + (xt & 7) * 8 + ((pc ^ xt) & 7)],
                           x16 + (size_t)(xv ? xt : 0) * n + (size_t)c * MH_CH + 8 * pc, xv ? 16 : 0);
        }
    };
    auto load = [&](int c, int st) { load_w(c, st); load_x(c, st); };

    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    if (c0 < c1) load_w(c0, 0);   /* (before the wait, as k_mmqh) */
    pdl_begin();
    if (c0 < c1) load_x(c0, 0);
    cp_commit();
    for (int c = c0, i = 0; c < c1; c++, i++) {
        const int st = i % MH_ST;
        cp_wait<MH_ST - 2>();                                      /* chunk c is in */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   /* ... for the tensor cores' reads too */
        __syncthreads();   /* ... for every thread; chunk c - 1's buffers are free (its MMAs waited for) */
        if (c + MH_ST - 1 < c1) load(c + MH_ST - 1, (i + MH_ST - 1) % MH_ST);
        cp_commit();
        if constexpr (Q6) {
            mw_q6_chunk<J>(acc, sm.w[st], wg_desc(&sm.x[st][0]), ra, q);
        } else {
            /* this lane's scales: sub-blocks 2q, 2q + 1 of rows ra and ra + 8 (d * sc,
             * -dmin * m as half2s); a sub-block's come from its lane by shuffle, so the
             * warps need no second barrier */
            uint32_t scd[2][2], scm[2][2];   /* [row ra, ra + 8][sub-block 2q, 2q + 1] */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float d0, d1, m0, m1;
                q4k_scales(*(const uint4 *)sm.w[st][ra + 8 * r], q, d0, d1, m0, m1);
                scd[r][0] = h2u(__floats2half2_rn(d0, d0)); scm[r][0] = h2u(__floats2half2_rn(-m0, -m0));
                scd[r][1] = h2u(__floats2half2_rn(d1, d1)); scm[r][1] = h2u(__floats2half2_rn(-m1, -m1));
            }
            const uint64_t xd = wg_desc(&sm.x[st][0]);
#pragma unroll
            for (int gi = 0; gi < MH_SB / 2; gi++) {
                /* bytes 2q, 2q + 1 of each 8 of rows ra and ra + 8: k-step 0 (values 0..15), k-step 1 */
                const uint8_t *pa = &sm.w[st][ra][16 + 32 * gi + 2 * q], *pb = pa + 8 * MW_WB;
                uint32_t ua0 = __byte_perm(*(const uint16_t *)pa, *(const uint16_t *)(pa + 8), 0x5410);
                uint32_t ua1 = __byte_perm(*(const uint16_t *)(pa + 16), *(const uint16_t *)(pa + 24), 0x5410);
                uint32_t ub0 = __byte_perm(*(const uint16_t *)pb, *(const uint16_t *)(pb + 8), 0x5410);
                uint32_t ub1 = __byte_perm(*(const uint16_t *)(pb + 16), *(const uint16_t *)(pb + 24), 0x5410);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int s = 2 * gi + h;
                    const int src = (lane & ~3) | (s >> 1);
                    uint2 sca = make_uint2(__shfl_sync(0xffffffffu, scd[0][s & 1], src), __shfl_sync(0xffffffffu, scm[0][s & 1], src));
                    uint2 scb = make_uint2(__shfl_sync(0xffffffffu, scd[1][s & 1], src), __shfl_sync(0xffffffffu, scm[1][s & 1], src));
                    uint32_t a0[4], a1[4];
                    if (h) {
                        q4_pair<1>(ua0, u2h(sca.x), u2h(sca.y), a0[0], a0[2]);
                        q4_pair<1>(ub0, u2h(scb.x), u2h(scb.y), a0[1], a0[3]);
                        q4_pair<1>(ua1, u2h(sca.x), u2h(sca.y), a1[0], a1[2]);
                        q4_pair<1>(ub1, u2h(scb.x), u2h(scb.y), a1[1], a1[3]);
                    } else {
                        q4_pair<0>(ua0, u2h(sca.x), u2h(sca.y), a0[0], a0[2]);
                        q4_pair<0>(ub0, u2h(scb.x), u2h(scb.y), a0[1], a0[3]);
                        q4_pair<0>(ua1, u2h(sca.x), u2h(sca.y), a1[0], a1[2]);
                        q4_pair<0>(ub1, u2h(scb.x), u2h(scb.y), a1[1], a1[3]);
                    }
                    wg_fence();
                    /* k-steps 2s, 2s + 1: atom s / 2, 32-byte steps within its rows */
                    wg_mma<J>(acc, a0, xd + (((s >> 1) * J * MW_AT + (s & 1) * 64) >> 4));
                    wg_mma<J>(acc, a1, xd + (((s >> 1) * J * MW_AT + (s & 1) * 64 + 32) >> 4));
                    wg_commit();
                }
            }
            wg_wait<0>();
        }
    }
    cp_wait<0>();
    mh_finish<J>(acc, S, P, ra, q, T, part, cnt, tid, last, (float *)mw_wst<J>(sm, 0));
#endif
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

/* value v of a q6_K row in the repacked layout (q6_word): its 6 bits */
__device__ __forceinline__ int q6w_get(const uint8_t *row, int n, int v)
{
    int nu = n >> 6, u = v >> 6, l = v & 31;
    return q6_bits(ld32a2(row + q6_word(nu, u, l >> 2, 8)), ld32a2(row + n / 2 + q6_word(nu, u, l >> 3, 4)),
                   (v >> 5) & 1, l);
}

/* q6_K in the repacked layout -> the batched kernel's (k_mmqw<J, true>):
 * per row and super-block a Q6B_CH-byte chunk: its 16 sub-block scales
 * d * sc as f16s (32 bytes), then per lane q (0..3) three 16-byte pieces at
 * 32 + 64 k + 16 q holding the values an MMA A fragment takes from rows of
 * that lane (o = 2q, 2q+1, 2q+8, 2q+9 of each sub-block of 16): pieces 0,
 * 1: ql words (gi, p) of groups gi = 2k, 2k + 1 (4 sub-blocks each), whose
 * byte i holds value o_i's low 4 bits of sub-block 4 gi + 2 p (low nibble)
 * and 4 gi + 2 p + 1 (high); piece 2: qh word gi, byte i bits 2t, 2t + 1
 * the top 2 bits of value o_i of sub-block 4 gi + t. A thread per (row,
 * super-block, lane). */
__global__ void k_repack_q6_Kb(const uint8_t *src, uint8_t *dst, size_t rb, int n, int n_out)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int nc = n / 256;
    if (i >= (size_t)nc * n_out * 4) return;
    int q = (int)(i & 3), r = (int)((i >> 2) / nc), c = (int)((i >> 2) % nc);
    const uint8_t *row = src + (size_t)r * rb;
    uint8_t *o = dst + ((size_t)r * nc + c) * Q6B_CH;
    const int of[4] = { 2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9 }, v0 = 256 * c;
    if (q == 0) {
        float d = h2f(row + 13 * (n / 16) + 2 * c);
        const int8_t *sc = (const int8_t *)row + 3 * (n / 4) + 16 * c;
        /* as 32-bit words: a byte store of an f16 register converts its value (ptxas 13) */
        for (int k = 0; k < 8; k++)
            *(uint32_t *)(o + 4 * k) = h2u(__floats2half2_rn(d * (float)sc[2 * k], d * (float)sc[2 * k + 1]));
    }
    for (int gi = 0; gi < 4; gi++) {
        for (int p = 0; p < 2; p++) {
            uint32_t w = 0;
            for (int k = 0; k < 4; k++) {
                int lo = q6w_get(row, n, v0 + 16 * (4 * gi + 2 * p) + of[k]) & 15;
                int hi = q6w_get(row, n, v0 + 16 * (4 * gi + 2 * p + 1) + of[k]) & 15;
                w |= (uint32_t)(lo | hi << 4) << (8 * k);
            }
            memcpy(o + 32 + 64 * (gi >> 1) + 16 * q + 4 * (2 * (gi & 1) + p), &w, 4);
        }
        uint32_t h = 0;
        for (int t = 0; t < 4; t++)
            for (int k = 0; k < 4; k++)
                h |= (uint32_t)(q6w_get(row, n, v0 + 16 * (4 * gi + t) + of[k]) >> 4) << (8 * k + 2 * t);
        memcpy(o + 32 + 128 + 16 * q + 4 * gi, &h, 4);
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
__global__ void k_silu_mul(const float *g, const float *u, size_t n, float *out, xq_lay qx, int early)
{
    pdl_early(early);
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
                                         xq_lay qx, int early)
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
__global__ void k_rmsnorm(const float *x, const float *w, int n, float eps, float *out, xq_lay qx, int early)
{
    norm_row<NPT>((float *)x, NULL, w, n, eps, out, qx, early);   /* (x only read: y is NULL) */
}

template <int NPT>
__global__ void k_add_rmsnorm(float *x, const float *y, const float *w, int n, float eps, float *out, xq_lay qx,
                              int early)
{
    norm_row<NPT>(x, y, w, n, eps, out, qx, early);
}

/* Rope: the angle of pair i at position p (double, as the CPU reference),
 * and the rotation of one pair, rounded step by step: every rope kernel
 * gives the same bits. */
__device__ __forceinline__ void rope_cs(int p, int i, int n_rot, float base, const float *fd, float &cs, float &sn)
{
    double theta = (double)p * pow((double)base, -2.0 * i / n_rot);
    if (fd) theta /= fd[i];
    cs = (float)cos(theta);
    sn = (float)sin(theta);
}

/* bias (or NULL): added to v's pair first (v + bias, as the matmul would) */
__device__ __forceinline__ void rope_pair(float *v, int i, int half, int neox, float cs, float sn, float &o0,
                                          float &o1, int &i0, int &i1, const float *bias = NULL)
{
    i0 = neox ? i : 2 * i; i1 = neox ? i + half : 2 * i + 1;
    float a = v[i0], c = v[i1];
    if (bias) { a = __fadd_rn(a, bias[i0]); c = __fadd_rn(c, bias[i1]); }
    o0 = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(c, sn));
    o1 = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(c, cs));
    v[i0] = o0;
    v[i1] = o1;
}

/* block per token: the angles once per pair into shared memory, then every
 * (head, pair) in parallel */
__global__ void k_rope(float *x, const int32_t *pos, int n_heads, int hd, int n_rot, float base, int neox,
                       const float *fd)
{
    pdl_begin();
    __shared__ float cs[512], sn[512];
    int t = blockIdx.x, half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cs(pos[t], i, n_rot, base, fd, cs[i], sn[i]);
    __syncthreads();
    for (int k = threadIdx.x; k < half * n_heads; k += blockDim.x) {
        int h = k / half, i = k % half, i0, i1;
        float o0, o1;
        rope_pair(x + ((size_t)t * n_heads + h) * hd, i, half, neox, cs[i], sn[i], o0, o1, i0, i1);
    }
}

__device__ __forceinline__ size_t kv_slot(const int32_t *off, const int32_t *pages, int t, int p)
{
    return (size_t)pages[off[t] + p / 16] * 16 + (size_t)(p % 16);
}

/* A span's two cache pages (np positions of token t from p0, p0 % 32 == 0):
 * the first rows of the pages of positions p0.. and p0+16.. (rowA again
 * when np <= 16) */
__device__ __forceinline__ void att_pages(const int32_t *off, const int32_t *pages, int t, int p0, int np,
                                          size_t &rowA, size_t &rowB)
{
    rowA = (size_t)pages[off[t] + p0 / 16] * 16;
    rowB = np > 16 ? (size_t)pages[off[t] + p0 / 16 + 1] * 16 : rowA;
}

/* the row of span position j (past np: rowA's, a valid address) */
__device__ __forceinline__ size_t att_row(size_t rowA, size_t rowB, int j, int np)
{
    return j < np ? (j < 16 ? rowA + j : rowB + (j - 16)) : rowA;
}

__device__ __forceinline__ void kv_put(void *c, int f16, size_t s, float v)
{
    if (f16) ((__half *)c)[s] = __float2half_rn(v);
    else ((float *)c)[s] = v;
}

__global__ void k_kv_store(void *kc, void *vc, int f16, const int32_t *pos, const int32_t *off,
                           const int32_t *pages, int kv_dim, const float *k, const float *v)
{
    pdl_begin();
    int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    size_t s = kv_slot(off, pages, t, pos[t]) * (size_t)kv_dim + i;
    kv_put(kc, f16, s, k[(size_t)t * kv_dim + i]);
    kv_put(vc, f16, s, v[(size_t)t * kv_dim + i]);
}

/* rope of q and k, then kv_store of k and v, in one launch: block (t, h),
 * h < n_head a head of q, else head h - n_head of k (and v): the same
 * values as k_rope, k_rope, k_kv_store. */
__global__ void k_rope_kv(float *q, float *k, const float *v, void *kc, void *vc, int f16, const int32_t *pos,
                          const int32_t *off, const int32_t *pages, int n_head, int n_head_kv, int hd, int n_rot,
                          float base, int neox, const float *fd, const float *bq, const float *bk,
                          const float *bv, float2 *tab, int tmode)
{
    pdl_begin();
    int t = blockIdx.x, h = blockIdx.y, half = n_rot / 2, p = pos[t];
    int isk = h >= n_head, hh = isk ? h - n_head : h;
    float *x = isk ? k + ((size_t)t * n_head_kv + hh) * hd : q + ((size_t)t * n_head + hh) * hd;
    const float *bx = isk ? (bk ? bk + (size_t)hh * hd : NULL) : (bq ? bq + (size_t)hh * hd : NULL);
    const float *bvh = bv ? bv + (size_t)hh * hd : NULL;
    int kvd = n_head_kv * hd;
    size_t s = isk ? kv_slot(off, pages, t, p) * (size_t)kvd + (size_t)hh * hd : 0;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float cs, sn, o0, o1;
        int i0, i1;
        if (tmode == 2) {
            float2 a = tab[(size_t)t * half + i];
            cs = a.x; sn = a.y;
        } else {
            rope_cs(p, i, n_rot, base, fd, cs, sn);
            if (tmode == 1 && h == 0) tab[(size_t)t * half + i] = make_float2(cs, sn);
        }
        rope_pair(x, i, half, neox, cs, sn, o0, o1, i0, i1, bx);
        if (isk) { kv_put(kc, f16, s + i0, o0); kv_put(kc, f16, s + i1, o1); }
    }
    /* past the rotated dims: as they are (with the bias) */
    if (bx)
        for (int d = n_rot + threadIdx.x; d < hd; d += blockDim.x) x[d] = __fadd_rn(x[d], bx[d]);
    if (!isk) return;
    if (bx) __syncthreads();   /* (the tail written above is read below by other threads) */
    const float *vr = v + ((size_t)t * n_head_kv + hh) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        if (d >= n_rot) kv_put(kc, f16, s + d, x[d]);
        kv_put(vc, f16, s + d, bvh ? __fadd_rn(vr[d], bvh[d]) : vr[d]);
    }
}

/* ---------------- attention ----------------
 * A token's positions are taken in spans of CK_ATT_SPAN (32). A span's
 * partial (max, sum, weighted values) comes from one warp (att_span): lane
 * l ends up with the score of position start+l, the warp takes the span's
 * max and sum, then each lane accumulates its dims over the span's
 * positions in order. A token's spans are merged
 * in span order by one online step, wherever they were computed: in one
 * block (its warps take spans side by side, merged round by round), or
 * spread over G blocks for short batches (flash-decoding: partials in
 * `part`, then k_att_merge). The arithmetic of a token is therefore the
 * same whatever batch it is in and however its spans are spread (batch
 * invariance); products are rounded explicitly so no kernel contracts them
 * differently. */
#define ATT_WARPS CK_ATT_WARPS
#define ATT_DPT 2     /* dims per thread in the merges: head_dim <= 256 */

/* the online merge of a span's (m, l, a) into (M, L, A), N dims per thread */
template <int N>
__device__ __forceinline__ void att_merge_n(float &M, float &L, float (&A)[N], float m, float l, const float (&a)[N])
{
    if (!(m > -INFINITY)) return;
    float mn = fmaxf(M, m), fo = expf(M - mn), fs = expf(m - mn);
    L = __fmaf_rn(l, fs, __fmul_rn(L, fo));
#pragma unroll
    for (int i = 0; i < N; i++) A[i] = __fmaf_rn(a[i], fs, __fmul_rn(A[i], fo));
    M = mn;
}

__device__ __forceinline__ void att_merge_step(float &M, float &L, float (&A)[ATT_DPT], float m, float l,
                                               const float (&a)[ATT_DPT])
{
    att_merge_n<ATT_DPT>(M, L, A, m, l, a);
}

/* ND consecutive cache values from element i, of which the first nv are
 * real (the rest 0); vec: i and ND even, read in pairs (else one by one,
 * since i may be odd when hd % ND != 0) */
template <int ND, int F16>
__device__ __forceinline__ void att_load(const void *c, size_t i, int nv, bool vec, float (&v)[ND])
{
    if (F16 && ND % 2 == 0 && vec) {
        const __half2 *p = (const __half2 *)((const __half *)c + i);
#pragma unroll
        for (int k = 0; k < ND; k += 2) {
            float2 f = __half22float2(p[k / 2]);
            v[k] = f.x; v[k + 1] = f.y;
        }
    } else if (F16) {
#pragma unroll
        for (int k = 0; k < ND; k++) v[k] = k < nv ? __half2float(((const __half *)c)[i + k]) : 0.f;
    } else {
#pragma unroll
        for (int k = 0; k < ND; k++) v[k] = k < nv ? ((const float *)c)[i + k] : 0.f;
    }
}

/* Rows j0 .. j0+15 of a span of np positions on cache pages A and B (row
 * indices rowA.., rowB..; past np, row A's as a valid address), this
 * lane's dims (from base) of each from cache c, 0 where it has none: the
 * K rows and the V rows of att_span alike. */
template <int ND, int F16>
__device__ __forceinline__ void att_rows16(const void *c, size_t rowA, size_t rowB, int j0, int np, int kvd,
                                           size_t base, int nv, bool vec, bool dl, float (&r)[16][ND])
{
#pragma unroll
    for (int j = 0; j < 16; j++) {
        size_t row = att_row(rowA, rowB, j0 + j, np);
#pragma unroll
        for (int k = 0; k < ND; k++) r[j][k] = 0.f;
        if (dl) att_load<ND, F16>(c, row * (size_t)kvd + base, nv, vec, r[j]);
    }
}

/* This lane's share of the dot products of q (its dims qv) with K rows
 * j0 .. j0+15 of a span (as att_rows16) */
template <int ND, int F16>
__device__ __forceinline__ void att_k16(const void *kc, size_t rowA, size_t rowB, int j0, int np, int kvd,
                                        size_t base, int nv, bool vec, bool dl, const float (&qv)[ND],
                                        float (&d)[16])
{
    float kv[16][ND];
    att_rows16<ND, F16>(kc, rowA, rowB, j0, np, kvd, base, nv, vec, dl, kv);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        d[j] = 0.f;
#pragma unroll
        for (int k = 0; k < ND; k++) d[j] = __fmaf_rn(qv[k], kv[j][k], d[j]);
    }
}

/* V rows j0 .. j0+15 of a span (as att_rows16) weighted by their lanes' e, into a */
template <int ND, int F16>
__device__ __forceinline__ void att_v16(const void *vc, size_t rowA, size_t rowB, int j0, int np, int kvd,
                                        size_t base, int nv, bool vec, bool dl, float e, float (&a)[ND])
{
    float vv[16][ND];
    att_rows16<ND, F16>(vc, rowA, rowB, j0, np, kvd, base, nv, vec, dl, vv);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        float ej = __shfl_sync(0xffffffffu, e, j0 + j);
        if (j0 + j < np) {
#pragma unroll
            for (int k = 0; k < ND; k++) a[k] = __fmaf_rn(ej, vv[j][k], a[k]);
        }
    }
}

/* A span's softmax, lane j holding the dot product ps of position j (live:
 * j is in the span): the span's max mx of the scaled scores, this lane's
 * weight e, and their sum in an xor butterfly's order (in every lane) */
__device__ __forceinline__ void att_soft(float ps, bool live, float scale, float &mx, float &e, float &sum)
{
    float sc = live ? __fmul_rn(ps, scale) : -INFINITY;
    mx = sc;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    e = live && mx > -INFINITY ? expf(sc - mx) : 0.f;
    sum = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
}

/* One step of a warp's reduce-scatter of 32 values per lane: after the
 * step of width O a lane keeps the O sums of the half of the indices its
 * bit O selects (constant indices: the values stay in registers). */
template <int O>
__device__ __forceinline__ void att_rs(float (&ps)[32], int lane)
{
    bool up = lane & O;
#pragma unroll
    for (int i = 0; i < O; i++) {
        float keep = up ? ps[i + O] : ps[i], send = up ? ps[i] : ps[i + O];
        ps[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, O));
    }
}

/* The span [p0, p1) of token t (p0 % 32 == 0, 1..32 positions: two cache
 * pages), by the calling warp. Lane l holds dims ND*l .. ND*l+ND-1 of q,
 * of each K and V row read (a warp reads a row as one contiguous piece),
 * and of the result a; lane j ends up with the score of position p0+j, the
 * 32 lanes' shares of its dot product summed in the order of a butterfly.
 * Two forms, the same arithmetic: unrolled (32 rows' loads in flight, the
 * shares summed by a reduce-scatter of 31 shuffles), and for launches of
 * few blocks (ROLL) rolled loops of 16 rows, the shares through the warp's
 * sp ([32][33] floats of shared memory) and summed by lane j in the
 * butterfly's order: a single-token decode runs this once per SM and
 * launch, so its time is the code's fetch as much as its execution. */
/* att_span on rows rowA.. (positions 0..15) and rowB.. (16..31) of caches
 * with rows of kvd values, the head's from kvo: the cache pages, or a
 * block's copy of the span in shared memory (the same values). */
template <int ND, int F16, int ROLL>
__device__ __forceinline__ void att_span_at(const float *qs, const void *kc, const void *vc, size_t rowA,
                                            size_t rowB, size_t kvo, int kvd, int hd, float scale, int np,
                                            float (*sp)[33], float &m, float &l, float (&a)[ND])
{
    int lane = threadIdx.x & 31, d0 = ND * lane;
    bool dl = d0 < hd;
    int nv = min(ND, hd - d0);   /* dims of this lane below hd */
    bool vec = hd % ND == 0;
    float qv[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) qv[k] = dl && k < nv ? qs[d0 + k] : 0.f;
    bool live = lane < np;
    float ps;
    if (ROLL) {
#pragma unroll 1
        for (int j0 = 0; j0 < np; j0 += 16) {
            float d[16];
            att_k16<ND, F16>(kc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, qv, d);
#pragma unroll
            for (int j = 0; j < 16; j++) sp[j0 + j][lane] = d[j];
        }
        __syncwarp();
        /* the reduce-scatter's sum for row `lane`: with b[x] = lane (lane ^
         * x)'s share, each round adds b[x] + b[x + o] for x < o */
        float b[32];
#pragma unroll
        for (int x = 0; x < 32; x++) b[x] = sp[lane][lane ^ x];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int x = 0; x < o; x++) b[x] = __fadd_rn(b[x], b[x + o]);
        ps = b[0];
        __syncwarp();   /* (sp is the warp's next span's) */
    } else {
        float pr[32];
#pragma unroll
        for (int j0 = 0; j0 < 32; j0 += 16) {
            float d[16];
            att_k16<ND, F16>(kc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, qv, d);
#pragma unroll
            for (int j = 0; j < 16; j++) pr[j0 + j] = d[j];
        }
        att_rs<16>(pr, lane);
        att_rs<8>(pr, lane);
        att_rs<4>(pr, lane);
        att_rs<2>(pr, lane);
        att_rs<1>(pr, lane);
        ps = pr[0];
    }
    float mx, e, sum;
    att_soft(ps, live, scale, mx, e, sum);
#pragma unroll
    for (int k = 0; k < ND; k++) a[k] = 0.f;
    if (ROLL) {
#pragma unroll 1
        for (int j0 = 0; j0 < np; j0 += 16) att_v16<ND, F16>(vc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, e, a);
    } else {
#pragma unroll
        for (int j0 = 0; j0 < 32; j0 += 16) {
            if (j0 >= np) break;
            att_v16<ND, F16>(vc, rowA, rowB, j0, np, kvd, kvo + d0, nv, vec, dl, e, a);
        }
    }
    m = mx;
    l = sum;
}

template <int ND, int F16, int ROLL>
__device__ __forceinline__ void att_span(const float *qs, const void *kc, const void *vc, const int32_t *off,
                                         const int32_t *pages, int t, size_t kvo, int kvd, int hd, float scale,
                                         int p0, int p1, float (*sp)[33], float &m, float &l, float (&a)[ND])
{
    int np = p1 - p0;
    size_t rowA, rowB;
    att_pages(off, pages, t, p0, np, rowA, rowB);
    /* (head_dim 32 ND and a whole span, the common case: the same code
     * with the lane's dims and the rows' bounds constant; not in the
     * rolled form, whose launches are few blocks and fetch its code once
     * per SM) */
    if (!ROLL && hd == 32 * ND && np == CK_ATT_SPAN)
        att_span_at<ND, F16, ROLL>(qs, kc, vc, rowA, rowB, kvo, kvd, 32 * ND, scale, CK_ATT_SPAN, sp, m, l, a);
    else
        att_span_at<ND, F16, ROLL>(qs, kc, vc, rowA, rowB, kvo, kvd, hd, scale, np, sp, m, l, a);
}

/* A (token, head) row's output value i (of out [T*n_head][hd]) and its
 * int8 / f16 forms; lane: the caller's lane, whose warp holds i's 32-value block */
__device__ __forceinline__ void att_put_out(float o, size_t i, int lane, float *out, const xq_lay &qx)
{
    out[i] = o;
    if (qx.q) quant_block(o, lane, i >> 5, qx);
    if (qx.h) qx.h[i] = f2h_sat(o);
}

/* Span s's partial (m, l, this lane's dims of a) of row th, for k_att_merge */
template <int ND>
__device__ __forceinline__ void att_put_part(float *part, int th, int maxs, int s, int hd, float m, float l,
                                             const float (&a)[ND])
{
    int lane = threadIdx.x & 31;
    float *pp = part + ((size_t)th * maxs + s) * (hd + 2);
    if (lane == 0) { pp[0] = m; pp[1] = l; }
#pragma unroll
    for (int k = 0; k < ND; k++)
        if (ND * lane + k < hd) pp[2 + ND * lane + k] = a[k];
}

/* Cache row `row` (hd values of eb bytes) of K and of V into L2: a
 * prefetch before the launch wait, of rows earlier launches wrote (one
 * this pass writes is only fetched early, never read stale) */
__device__ __forceinline__ void att_prefetch_row(const void *kc, const void *vc, size_t row, int hd, size_t eb)
{
    for (size_t o = 0; o < hd * eb; o += 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)kc + row * eb + o) : "memory");
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)vc + row * eb + o) : "memory");
    }
}

/* one cache value as a float */
template <int F16>
__device__ __forceinline__ float att_ld1(const void *c, size_t i)
{
    return F16 ? __half2float(((const __half *)c)[i]) : ((const float *)c)[i];
}

/* k_attention with the block's ATT_WARPS warps on each span together, for
 * head_dim 32 * ATT_WARPS: warp w takes the scores of rows 8w .. 8w+7
 * (lane l's share, dims ND*l.., as att_span_at; summed over the lanes by
 * an xor butterfly, which pairs the shares as att_span_at's reduce-scatter
 * does, so the same sums), every warp the span's softmax from the 32
 * scores (as att_span_at), and thread i the weighted V sum of dim i (in
 * row order, as att_span_at's lane of that dim). So a span's (m, l, a) are
 * att_span_at's, with a chain a quarter as long; a one-token decode's
 * attention is that chain (one block per head, or per head and span). */
/* Span [p0, p0 + np) of token t (its pages' first rows rowA, rowB, as
 * att_pages gives them) by every thread of the block, scores through
 * ssc (a [CK_ATT_SPAN] of shared memory the caller alternates between spans:
 * a warp writes the next one's only after every warp passed this one's
 * barrier); m, l the span's, a this thread's dim's */
/* NG > 1: the block is NG groups of ATT_WARPS warps, group threadIdx.x /
 * (32 * ATT_WARPS) on this span (its own named barrier, 1 + group). */
template <int ND, int F16, int NG = 1>
__device__ __forceinline__ void att_coop_span(const float (&qv)[ND], const void *kc, const void *vc, size_t rowA,
                                              size_t rowB, int np, size_t kvo, int kvd, float scale, float *ssc,
                                              float &m, float &l, float &a)
{
    constexpr int RW = CK_ATT_SPAN / ATT_WARPS;   /* score rows per warp */
    const int warp = (threadIdx.x >> 5) % ATT_WARPS, lane = threadIdx.x & 31, dim = threadIdx.x % (32 * ATT_WARPS);
    float kk[RW][ND], vv[CK_ATT_SPAN];
#pragma unroll
    for (int i = 0; i < RW; i++)
        att_load<ND, F16>(kc, att_row(rowA, rowB, RW * warp + i, np) * (size_t)kvd + kvo + ND * lane, ND, true,
                          kk[i]);
#pragma unroll
    for (int j = 0; j < CK_ATT_SPAN; j++) vv[j] = att_ld1<F16>(vc, att_row(rowA, rowB, j, np) * (size_t)kvd + kvo + dim);
    float sc8[RW];
#pragma unroll
    for (int i = 0; i < RW; i++) {
        float d = 0.f;
#pragma unroll
        for (int k = 0; k < ND; k++) d = __fmaf_rn(qv[k], kk[i][k], d);
        sc8[i] = d;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < RW; i++) sc8[i] = __fadd_rn(sc8[i], __shfl_xor_sync(0xffffffffu, sc8[i], o));
#pragma unroll
    for (int i = 0; i < RW; i++)
        if (lane == i) ssc[RW * warp + i] = sc8[i];
    if (NG == 1) __syncthreads();
    else asm volatile("bar.sync %0, %1;" ::"r"(1 + (int)threadIdx.x / (32 * ATT_WARPS)), "r"(32 * ATT_WARPS) : "memory");
    float mx, e, sum;
    att_soft(ssc[lane], lane < np, scale, mx, e, sum);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < CK_ATT_SPAN; j++) {
        float ej = __shfl_sync(0xffffffffu, e, j);
        if (j < np) acc = __fmaf_rn(ej, vv[j], acc);
    }
    m = mx;
    l = sum;
    a = acc;
}

/* Token t's spans: G == 1 (every span here, merged in order as the direct
 * path's rounds do, per dim, and written to out) or spans y, y + G, ... to
 * part (k_att_merge merges them) */
template <int ND, int F16>
__device__ __forceinline__ void att_coop(const float *qs, const void *kc, const void *vc, const int32_t *off,
                                         const int32_t *pages, int t, int th, int len, int ns, int G, int y,
                                         int maxs, size_t kvo, int kvd, float scale, float *out, float *part,
                                         const xq_lay &qx)
{
    __shared__ float ssc[2][CK_ATT_SPAN];
    const int lane = threadIdx.x & 31, dim = threadIdx.x, hd = 32 * ND;
    float qv[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) qv[k] = qs[ND * lane + k];
    float M = -INFINITY, L = 0.f, A[1] = { 0.f };
    const bool direct = G == 1 || ns == 1;
    for (int s = direct ? 0 : y, i = 0; s < ns; s += direct ? 1 : G, i++) {
        const int p0 = s * CK_ATT_SPAN, np = min(len, p0 + CK_ATT_SPAN) - p0;
        float m, l, a[1];
        size_t rowA, rowB;
        att_pages(off, pages, t, p0, np, rowA, rowB);
        att_coop_span<ND, F16>(qv, kc, vc, rowA, rowB, np, kvo, kvd, scale, ssc[i & 1], m, l, a[0]);
        if (direct) {
            att_merge_n<1>(M, L, A, m, l, a);
        } else {
            float *pp = part + ((size_t)th * maxs + s) * (hd + 2);
            if (threadIdx.x == 0) { pp[0] = m; pp[1] = l; }
            pp[2 + dim] = a[0];
        }
    }
    if (direct) att_put_out(A[0] / L, (size_t)th * hd + dim, lane, out, qx);
}

/* k_attention's direct path (G == 1: a token's spans merged in order and
 * written to out) for head_dim 32 * ATT_WARPS by NG groups of ATT_WARPS
 * warps, each group on one span together (att_coop_span), NG spans at a
 * time; group 0 merges each round's spans in order, as the direct path's
 * rounds do. So every span's (m, l, a) and every merge are k_attention's
 * (the same bits), and a token of up to NG spans is one span's chain
 * instead of one per span. A block per (token, head); the first round's
 * K and V rows prefetched into L2 before the launch wait (the cache rows
 * are written by earlier launches; a prefetch cannot read stale data). */
template <int ND, int F16, int NG>
__global__ void __launch_bounds__(NG * ATT_WARPS * 32) k_att_par(const float *q, const void *kc, const void *vc,
                                                                const int32_t *pos, const int32_t *off,
                                                                const int32_t *pages, int n_head, int n_head_kv,
                                                                float *out, xq_lay qx, int early)
{
    constexpr int hd = 32 * ND;
    static_assert(ND == ATT_WARPS, "a group's threads are the head's dims");
    const int th = blockIdx.x, t = th / n_head, h = th % n_head;
    const int grp = threadIdx.x / hd, dim = threadIdx.x % hd, lane = threadIdx.x & 31;
    const int kvh = h / (n_head / n_head_kv), kvd = n_head_kv * hd;
    const int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    const size_t kvo = (size_t)kvh * hd, eb = F16 ? 2 : 4;
    for (int p = threadIdx.x; p < min(len, NG * CK_ATT_SPAN); p += blockDim.x)
        att_prefetch_row(kc, vc, kv_slot(off, pages, t, p) * (size_t)kvd + kvo, hd, eb);
    /* the first round's pages (the batch block is written before the pass) */
    size_t rA = 0, rB = 0;
    if (grp < ns) att_pages(off, pages, t, grp * CK_ATT_SPAN, min(len - grp * CK_ATT_SPAN, CK_ATT_SPAN), rA, rB);
    pdl_early(early);
    pdl_begin();
    float qv[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) {   /* (as k_attention's qs: f16 caches take q rounded to f16) */
        float v = q[(size_t)th * hd + ND * lane + k];
        qv[k] = F16 ? __half2float(__float2half_rn(v)) : v;
    }
    __shared__ float ssc[NG][2][CK_ATT_SPAN];
    __shared__ float pm[NG], pl[NG], pa[NG][hd];
    const float scale = 1.0f / sqrtf((float)hd);
    float M = -INFINITY, L = 0.f, A[1] = { 0.f };
    for (int s0 = 0, i = 0; s0 < ns; s0 += NG, i++) {
        const int s = s0 + grp;
        if (s < ns) {
            const int p0 = s * CK_ATT_SPAN, np = min(len, p0 + CK_ATT_SPAN) - p0;
            float m, l, a;
            if (i > 0) att_pages(off, pages, t, p0, np, rA, rB);
            att_coop_span<ND, F16, NG>(qv, kc, vc, rA, rB, np, kvo, kvd, scale, ssc[grp][i & 1], m, l, a);
            if (dim == 0) { pm[grp] = m; pl[grp] = l; }
            pa[grp][dim] = a;
        }
        __syncthreads();
        if (grp == 0)
            for (int w = 0; w < NG && s0 + w < ns; w++) {
                float aw[1] = { pa[w][dim] };
                att_merge_n<1>(M, L, A, pm[w], pl[w], aw);
            }
        __syncthreads();   /* (the merges are done with pm, pl, pa) */
    }
    if (grp == 0) att_put_out(A[0] / L, (size_t)th * hd + dim, lane, out, qx);
}

/* The rope of a decode batch done by k_attention (tab NULL: none): k, v
 * the projections' output, biases or NULL, tab the pass's angles (as
 * k_rope_kv's mode 2), kc / vc the caches written. */
struct att_rope { const float *k, *v, *bq, *bk, *bv; const float2 *tab; void *kc, *vc; int n_rot, neox; };

/* Block (token*head, y) of G, ATT_WARPS warps. G == 1 or a one-span token:
 * every span here, merged, written to out. Else warp w of block y takes
 * spans y + G*w, y + G*(w + ATT_WARPS), ... to part (maxs per row).
 * R.tab: a batch of decode tokens (one per sequence) whose rope and KV
 * store come here instead of k_rope_kv: each block ropes its q head, and
 * ropes and stores its token's K and V row; the blocks of one KV head
 * write the same bits to that row, and each reads it only after its own
 * write (so every value is k_rope_kv's, and the row read is this step's). */
template <int ND, int F16, int ROLL>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(const float *q, const void *kc, const void *vc,
                                                   const int32_t *pos, const int32_t *off, const int32_t *pages,
                                                   int n_head, int n_head_kv, int hd, float *out, float *part,
                                                   int G, int maxs, xq_lay qx, const att_rope R, int coop)
{
    int th = blockIdx.x, t = th / n_head, h = th % n_head, y = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (n_head / n_head_kv), kvd = n_head_kv * hd;
    /* (the batch block was written before the pass's first kernel, the
     * cache rows by earlier kernels: read before the wait, into L2) */
    int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    if ((G == 1 || ns == 1) && y != 0) return;
    if (ROLL) {   /* (few blocks: their latency is the launch's) */
        int s = G == 1 || ns == 1 ? warp : y + G * warp, p = s * CK_ATT_SPAN + lane;
        if (s < ns && p < len)
            att_prefetch_row(kc, vc, kv_slot(off, pages, t, p) * (size_t)kvd + (size_t)kvh * hd, hd, F16 ? 2 : 4);
    }
    /* the fused rope's angles and biases: not written by the kernel before
     * (the angles by the pass's first rope_kv, two launches back at least) */
    __shared__ float2 rcs[ND * 16];
    __shared__ float rb[3][ND * 32];
    const float *bqh = R.bq ? R.bq + (size_t)h * hd : NULL, *bkh = R.bk ? R.bk + (size_t)kvh * hd : NULL;
    const float *bvh = R.bv ? R.bv + (size_t)kvh * hd : NULL;
    if (R.tab) {
        const int half = R.n_rot / 2;
        for (int i = threadIdx.x; i < half; i += blockDim.x) rcs[i] = R.tab[(size_t)t * half + i];
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            rb[0][d] = bqh ? bqh[d] : 0.f;
            rb[1][d] = bkh ? bkh[d] : 0.f;
            rb[2][d] = bvh ? bvh[d] : 0.f;
        }
    }
    pdl_begin();
    __shared__ float qs[ND * 32];
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_a[ATT_WARPS][ND * 32];
    extern __shared__ float att_sp[];   /* ROLL: att_span's row shares, [32][33] per warp (dynamic:
                                         * the unrolled form takes none, and keeps its L1) */
    float (*sp)[33] = (float (*)[33])(att_sp + (ROLL ? warp * 32 * 33 : 0));
    const float *qt = q + (size_t)th * hd;
    if (R.tab) {
        __shared__ float ks[ND * 32];
        const int half = R.n_rot / 2;
        const float *kt = R.k + ((size_t)t * n_head_kv + kvh) * hd, *vt = R.v + ((size_t)t * n_head_kv + kvh) * hd;
        const float *sbq = bqh ? rb[0] : NULL, *sbk = bkh ? rb[1] : NULL;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) { qs[d] = qt[d]; ks[d] = kt[d]; }
        __syncthreads();
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float2 a = rcs[i];
            float o0, o1;
            int i0, i1;
            rope_pair(qs, i, half, R.neox, a.x, a.y, o0, o1, i0, i1, sbq);
            rope_pair(ks, i, half, R.neox, a.x, a.y, o0, o1, i0, i1, sbk);
        }
        for (int d = R.n_rot + threadIdx.x; d < hd; d += blockDim.x) {   /* past the rotated dims */
            if (bqh) qs[d] = __fadd_rn(qs[d], rb[0][d]);
            if (bkh) ks[d] = __fadd_rn(ks[d], rb[1][d]);
        }
        __syncthreads();
        size_t s = kv_slot(off, pages, t, pos[t]) * (size_t)kvd + (size_t)kvh * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            kv_put(R.kc, F16, s + d, ks[d]);
            kv_put(R.vc, F16, s + d, bvh ? __fadd_rn(vt[d], rb[2][d]) : vt[d]);
            if (F16) qs[d] = __half2float(__float2half_rn(qs[d]));
        }
    } else {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float v = qt[d];
            qs[d] = F16 ? __half2float(__float2half_rn(v)) : v;
        }
    }
    __syncthreads();
    float scale = 1.0f / sqrtf((float)hd);
    size_t kvo = (size_t)kvh * hd;
    float m, l, a[ND];
    if constexpr (ND == ATT_WARPS) {
        if (coop && hd == 32 * ND && (!(G == 1 || ns == 1) || ns <= coop)) {
            att_coop<ND, F16>(qs, kc, vc, off, pages, t, th, len, ns, G, y, maxs, kvo, kvd, scale, out, part, qx);
            return;
        }
    }
    if (G == 1 || ns == 1) {
        float M = -INFINITY, L = 0.f, A[ATT_DPT];
#pragma unroll
        for (int i = 0; i < ATT_DPT; i++) A[i] = 0.f;
        for (int s0 = 0; s0 < ns; s0 += ATT_WARPS) {
            int s = s0 + warp;
            if (s < ns) {
                att_span<ND, F16, ROLL>(qs, kc, vc, off, pages, t, kvo, kvd, hd, scale, s * CK_ATT_SPAN,
                                  min(len, (s + 1) * CK_ATT_SPAN), sp, m, l, a);
                if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
                for (int k = 0; k < ND; k++) sm_a[warp][ND * lane + k] = a[k];
            }
            __syncthreads();
            for (int w = 0; w < ATT_WARPS && s0 + w < ns; w++) {
                float aw[ATT_DPT];
#pragma unroll
                for (int i = 0; i < ATT_DPT; i++) {
                    int d = threadIdx.x + 128 * i;
                    aw[i] = d < hd ? sm_a[w][d] : 0.f;
                }
                att_merge_step(M, L, A, sm_m[w], sm_l[w], aw);
            }
            __syncthreads();   /* the merges are done with the shared arrays */
        }
#pragma unroll
        for (int i = 0; i < ATT_DPT; i++) {
            int d = threadIdx.x + 128 * i;
            /* (whole warps: hd % 32 == 0 when quantizing) */
            if (d < hd) att_put_out(A[i] / L, (size_t)th * hd + d, lane, out, qx);
        }
        return;
    }
    for (int s = y + G * warp; s < ns; s += G * ATT_WARPS) {
        att_span<ND, F16, ROLL>(qs, kc, vc, off, pages, t, kvo, kvd, hd, scale, s * CK_ATT_SPAN,
                          min(len, (s + 1) * CK_ATT_SPAN), sp, m, l, a);
        att_put_part<ND>(part, th, maxs, s, hd, m, l, a);
    }
}

/* Decode batches by KV head: block (token * n_head_kv + KV head, y) of G,
 * warp w the group's q head w. The block copies each span's K and V rows
 * (this KV head's share) into shared memory by cp.async, the next span's
 * while the warps compute this one, and every head of the group reads
 * them there: a row leaves L2 once per group (k_attention's blocks of one
 * token and head read the rows of a 32-stream 7b step 7 times over), and
 * the loads' latency is hidden (k_attention's warps wait on theirs, span
 * by span). Each warp computes a span with att_span's arithmetic on the
 * copied values. G == 1 or a one-span token: the spans merged in order
 * from the empty state, as k_attention's rounds do, and written to out;
 * else spans y, y + G, ... to part, merged in order by k_att_merge. So
 * every (token, head) has k_attention's bits. Shared memory: two stages of
 * K and V, 32 rows of hd values each (hd * elt <= 512 bytes). */
template <int ND, int F16>
__global__ void __launch_bounds__(256) k_att_grp(const float *q, const void *kc, const void *vc, const int32_t *pos,
                                                 const int32_t *off, const int32_t *pages, int n_head,
                                                 int n_head_kv, int hd, float *out, float *part, int G, int maxs,
                                                 xq_lay qx)
{
    const int t = blockIdx.x / n_head_kv, kvh = blockIdx.x % n_head_kv, y = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int th = t * n_head + kvh * (n_head / n_head_kv) + warp, kvd = n_head_kv * hd;
    const int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    const bool direct = G == 1 || ns == 1;
    if (direct && y != 0) return;
    pdl_begin();
    constexpr int EB = F16 ? 2 : 4;
    extern __shared__ __align__(16) unsigned char ag_raw[];
    const int rowb = hd * EB, pr = rowb / 16;   /* bytes and 16-byte pieces of a row's head share */
    auto stage = [&](int b, int v) { return ag_raw + (size_t)(2 * b + v) * 32 * rowb; };
    __shared__ float qs[8][ND * 32];
    const float *qt = q + (size_t)th * hd;
    for (int d = lane; d < hd; d += 32) {
        float v = qt[d];
        qs[warp][d] = F16 ? __half2float(__float2half_rn(v)) : v;
    }
    const int s0 = direct ? 0 : y, ds = direct ? 1 : G;
    /* span s's rows (zeros past the token's length) into stage b */
    auto load = [&](int s, int b) {
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        for (int e = threadIdx.x; e < 2 * 32 * pr; e += blockDim.x) {
            int v = e / (32 * pr), j = (e / pr) % 32, pc = e % pr;
            const char *src = (const char *)(v ? vc : kc);
            size_t r = kv_slot(off, pages, t, p0 + (j < np ? j : 0));
            cp_async16(stage(b, v) + (size_t)j * rowb + 16 * pc, src + (r * kvd + (size_t)kvh * hd) * EB + 16 * pc,
                       j < np ? 16 : 0);
        }
    };
    const float scale = 1.0f / sqrtf((float)hd);
    float M = -INFINITY, L = 0.f, A[ND], m, l, a[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) A[k] = 0.f;
    load(s0, 0);
    cp_commit();
    for (int s = s0, i = 0; s < ns; s += ds, i++) {
        if (s + ds < ns) load(s + ds, (i + 1) & 1);
        cp_commit();
        cp_wait<1>();      /* span s is in ... */
        __syncthreads();   /* ... for every thread */
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        /* (head_dim 32 ND and whole spans, the common case, with constant
         * row offsets and no bounds: the same code, folded) */
        const void *sk = stage(i & 1, 0), *sv = stage(i & 1, 1);
        if (hd == 32 * ND && np == CK_ATT_SPAN)
            att_span_at<ND, F16, 0>(qs[warp], sk, sv, 0, 16, 0, 32 * ND, 32 * ND, scale, CK_ATT_SPAN, NULL, m, l, a);
        else
            att_span_at<ND, F16, 0>(qs[warp], sk, sv, 0, 16, 0, hd, hd, scale, np, NULL, m, l, a);
        if (direct) att_merge_n<ND>(M, L, A, m, l, a);
        else att_put_part<ND>(part, th, maxs, s, hd, m, l, a);
        __syncthreads();   /* stage i & 1 is free for span s + 2 ds */
    }
    cp_wait<0>();
    if (!direct) return;
    float *ob = qs[warp];   /* (q is done with) */
#pragma unroll
    for (int k = 0; k < ND; k++)
        if (ND * lane + k < hd) ob[ND * lane + k] = A[k] / L;
    __syncwarp();
    for (int d = lane; d < hd; d += 32)   /* (whole warps: hd % 32 == 0 when quantizing) */
        att_put_out(ob[d], (size_t)th * hd + d, lane, out, qx);
}

/* Grouped attention on tensor cores, for decode batches that are outside
 * the batch-invariance promise (more than CK_GEMV_MAX_T streams, as the
 * batched matmuls; f16 caches, head_dim 64 or 128, up to 16 q heads per KV
 * head). k_att_grp's blocks (token, KV head, y of G) and partials, but one
 * warp takes a whole span for all the group's heads: S = Q K^T by
 * mma.m16n8k16 (the heads as the 16 rows; q rounded to f16 as k_attention
 * rounds it; f32 sums), the online softmax on S's fragments, and O += P V
 * with P split into f16 high and low parts (two MMAs: P carries ~2^-22 of
 * rounding, so the result is f32-accurate) and V's fragments by
 * ldmatrix.trans. A block's warps take its spans side by side, each span's
 * K and V rows copied by the warp into its own shared memory by cp.async,
 * the next span's while it computes this one (two stages per warp). G == 1
 * or a one-span token: the warps' states merged in warp order and written
 * to out; else each span's partial to part, merged by k_att_merge. */
#define AM_WARPS 4
template <int HD> struct am_stage {
    __half k[32][HD + 8], v[32][HD + 8];   /* (+8: ldmatrix's 8 rows hit 8 bank groups) */
};
#define AM_SMEM(HD) (AM_WARPS * 2 * sizeof(am_stage<HD>))

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
/* (x, y) as f16 high parts, and what they leave as low parts */
__device__ __forceinline__ void h2_split(float x, float y, uint32_t &hi, uint32_t &lo)
{
    __half2 h = __floats2half2_rn(x, y);
    float2 f = __half22float2(h);
    hi = h2u(h);
    lo = h2u(__floats2half2_rn(x - f.x, y - f.y));
}

template <int HD>
__global__ void __launch_bounds__(AM_WARPS * 32) k_att_mma(const float *q, const __half *kc, const __half *vc,
                                                        const int32_t *pos, const int32_t *off,
                                                        const int32_t *pages, int n_head, int n_head_kv,
                                                        float *out, float *part, int G, int maxs, xq_lay qx)
{
    constexpr int KS = HD / 16, DT = HD / 8, PR = HD * 2 / 16;
    const float LOG2E = 1.4426950408889634f;
    const int t = blockIdx.x / n_head_kv, kvh = blockIdx.x % n_head_kv, y = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    const int gh = n_head / n_head_kv, h0 = t * n_head + kvh * gh, kvd = n_head_kv * HD;
    const int len = pos[t] + 1, ns = (len + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    const bool direct = G == 1 || ns == 1;
    if (direct && y != 0) return;
    pdl_begin();
    extern __shared__ __align__(16) unsigned char am_raw[];
    am_stage<HD> *sbs = (am_stage<HD> *)am_raw + 2 * warp;
    __shared__ float am_ml[AM_WARPS][2][16];
    /* the group's q rows g and g + 8 (zero past gh) as A fragments */
    uint32_t qa[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = g + 8 * (i & 1), d = 16 * kk + 2 * qd + 8 * (i >> 1);
            float2 v = r < gh ? *(const float2 *)(q + (size_t)(h0 + r) * HD + d) : make_float2(0.f, 0.f);
            qa[kk][i] = h2u(__floats2half2_rn(v.x, v.y));
        }
    const float scale = 1.0f / sqrtf((float)HD);
    float m_r[2], l_r[2], o[DT][4];
    auto reset = [&]() {
        m_r[0] = m_r[1] = -INFINITY;
        l_r[0] = l_r[1] = 0.f;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    };
    reset();
    const int s_first = direct ? warp : y + G * warp, s_step = direct ? AM_WARPS : G * AM_WARPS;
    /* span s's K and V rows (zeros past the token's length) into stage b */
    auto load = [&](int s, int b) {
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        const int slot = (int)kv_slot(off, pages, t, p0 + min(lane, np - 1));
        for (int e = lane; e < 2 * 32 * PR; e += 32) {
            int v = e / (32 * PR), j = (e / PR) % 32, pc = e % PR;
            int r = __shfl_sync(0xffffffffu, slot, j);
            const __half *src = (v ? vc : kc) + (size_t)r * kvd + (size_t)kvh * HD + 8 * pc;
            cp_async16(v ? &sbs[b].v[j][8 * pc] : &sbs[b].k[j][8 * pc], src, j < np ? 16 : 0);
        }
    };
    if (s_first < ns) load(s_first, 0);
    cp_commit();
    for (int s = s_first, i = 0; s < ns; s += s_step, i++) {
        const int p0 = s * CK_ATT_SPAN, np = min(len - p0, CK_ATT_SPAN);
        if (s + s_step < ns) load(s + s_step, (i + 1) & 1);
        cp_commit();
        cp_wait<1>();   /* span s is in ... */
        __syncwarp();   /* ... for every lane */
        am_stage<HD> &sb = sbs[i & 1];
        /* S: rows (heads) g, g + 8; columns (positions) 8 nt + 2 qd, + 1 */
        float c[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; kk += 2) {
                uint32_t b[4];
                ldsm_x4(b, &sb.k[8 * nt + (lane & 7)][16 * kk + 8 * ((lane >> 3) & 1) + 16 * (lane >> 4)]);
                mma_f16(c[nt], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[0], b[1]);
                mma_f16(c[nt], qa[kk + 1][0], qa[kk + 1][1], qa[kk + 1][2], qa[kk + 1][3], b[2], b[3]);
            }
        }
        float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float sv = 8 * nt + 2 * qd + (i & 1) < np ? c[nt][i] * scale : -INFINITY;
                c[nt][i] = sv;
                mx[i >> 1] = fmaxf(mx[i >> 1], sv);
            }
        float mn[2], corr[2], rs[2] = { 0.f, 0.f };
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            mn[r] = fmaxf(m_r[r], mx[r]);
            corr[r] = exp2f((m_r[r] - mn[r]) * LOG2E);
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float p = exp2f((c[nt][i] - mn[i >> 1]) * LOG2E);
                c[nt][i] = p;
                rs[i >> 1] += p;
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 1);
            rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], 2);
            l_r[r] = l_r[r] * corr[r] + rs[r];
            m_r[r] = mn[r];
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[dt][i] *= corr[i >> 1];
        /* O += P V, positions 16 ks .. 16 ks + 15 a k-step */
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            uint32_t ah[4], al[4];
            h2_split(c[2 * ks][0], c[2 * ks][1], ah[0], al[0]);
            h2_split(c[2 * ks][2], c[2 * ks][3], ah[1], al[1]);
            h2_split(c[2 * ks + 1][0], c[2 * ks + 1][1], ah[2], al[2]);
            h2_split(c[2 * ks + 1][2], c[2 * ks + 1][3], ah[3], al[3]);
#pragma unroll
            for (int dt = 0; dt < DT; dt += 2) {
                uint32_t b[4];
                ldsm_x4_t(b, &sb.v[16 * ks + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * dt + 8 * (lane >> 4)]);
                mma_f16(o[dt], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
                mma_f16(o[dt], al[0], al[1], al[2], al[3], b[0], b[1]);
                mma_f16(o[dt + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
                mma_f16(o[dt + 1], al[0], al[1], al[2], al[3], b[2], b[3]);
            }
        }
        if (!direct) {   /* the span's partial, rows g and g + 8 */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int hr = g + 8 * r;
                if (hr >= gh) continue;
                float *pp = part + ((size_t)(h0 + hr) * maxs + s) * (HD + 2);
                if (qd == 0) { pp[0] = m_r[r]; pp[1] = l_r[r]; }
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    pp[2 + 8 * dt + 2 * qd] = o[dt][2 * r];
                    pp[3 + 8 * dt + 2 * qd] = o[dt][2 * r + 1];
                }
            }
            reset();
        }
        __syncwarp();   /* stage i & 1 is free for span s + 2 s_step */
    }
    cp_wait<0>();
    if (!direct) return;
    /* the warps' states through shared memory (each warp's stages), merged in warp order */
    __syncwarp();
    float *fo = (float *)sbs;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
        fo[g * HD + 8 * dt + 2 * qd] = o[dt][0];
        fo[g * HD + 8 * dt + 2 * qd + 1] = o[dt][1];
        fo[(g + 8) * HD + 8 * dt + 2 * qd] = o[dt][2];
        fo[(g + 8) * HD + 8 * dt + 2 * qd + 1] = o[dt][3];
    }
    if (qd == 0) {
        am_ml[warp][0][g] = m_r[0]; am_ml[warp][0][g + 8] = m_r[1];
        am_ml[warp][1][g] = l_r[0]; am_ml[warp][1][g + 8] = l_r[1];
    }
    __syncthreads();
    for (int r = warp; r < gh; r += AM_WARPS) {
        float M = -INFINITY, L = 0.f, A[HD / 32];
#pragma unroll
        for (int k = 0; k < HD / 32; k++) A[k] = 0.f;
        for (int w = 0; w < AM_WARPS; w++) {
            const float *fw = (const float *)((am_stage<HD> *)am_raw + 2 * w);
            float a[HD / 32];
#pragma unroll
            for (int k = 0; k < HD / 32; k++) a[k] = fw[r * HD + lane + 32 * k];
            att_merge_n<HD / 32>(M, L, A, am_ml[w][0][r], am_ml[w][1][r], a);
        }
#pragma unroll
        for (int k = 0; k < HD / 32; k++) att_put_out(A[k] / L, (size_t)(h0 + r) * HD + lane + 32 * k, lane, out, qx);
    }
}

/* Tokens of more than one span, after k_attention with G > 1. 128 threads. */
__global__ void k_att_merge(const float *part, const int32_t *pos, int n_head, int hd, int maxs, float *out,
                            xq_lay qx)
{
    pdl_begin();
    int th = blockIdx.x, t = th / n_head;
    int ns = (pos[t] + 1 + CK_ATT_SPAN - 1) / CK_ATT_SPAN;
    if (ns <= 1) return;
    float M = -INFINITY, L = 0.f, A[ATT_DPT];
#pragma unroll
    for (int i = 0; i < ATT_DPT; i++) A[i] = 0.f;
    /* 8 spans' partials loaded at once, then merged in order */
    for (int s0 = 0; s0 < ns; s0 += 8) {
        float pm[8], pl[8], pa[8][ATT_DPT];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float *pp = part + ((size_t)th * maxs + min(s0 + j, ns - 1)) * (hd + 2);
            pm[j] = s0 + j < ns ? pp[0] : -INFINITY;
            pl[j] = pp[1];
#pragma unroll
            for (int i = 0; i < ATT_DPT; i++) {
                int d = threadIdx.x + 128 * i;
                pa[j][i] = d < hd ? pp[2 + d] : 0.f;
            }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) att_merge_step(M, L, A, pm[j], pl[j], pa[j]);
    }
#pragma unroll
    for (int i = 0; i < ATT_DPT; i++) {
        int d = threadIdx.x + 128 * i;
        if (d < hd) att_put_out(A[i] / L, (size_t)th * hd + d, threadIdx.x & 31, out, qx);
    }
}

/* Block (row, part) of P: the best (value, first index) of its share of the
 * row, to part[row][P] (the index as the float's bits); with P == 1 the
 * index itself to ids. Max with the smaller index on ties is associative,
 * so the split does not change the result. */
__global__ void k_argmax(const float *x, int n, int32_t *ids, float2 *part)
{
    pdl_begin();
    const float *r = x + (size_t)blockIdx.x * n;
    int P = gridDim.y, per = (n + P - 1) / P, i0 = blockIdx.y * per, i1 = min(n, i0 + per);
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        float v = r[i];
        if (v > best) { best = v; bi = i; }
    }
    __shared__ float sv[1024];
    __shared__ int si[1024];
    sv[threadIdx.x] = best; si[threadIdx.x] = bi;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            float v = sv[threadIdx.x + k];
            int j = si[threadIdx.x + k];
            if (v > sv[threadIdx.x] || (v == sv[threadIdx.x] && j < si[threadIdx.x])) { sv[threadIdx.x] = v; si[threadIdx.x] = j; }
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    if (P == 1) ids[blockIdx.x] = si[0] == 0x7fffffff ? 0 : si[0];
    else part[(size_t)blockIdx.x * P + blockIdx.y] = make_float2(sv[0], __int_as_float(si[0]));
}

/* one warp per row: the P (<= 32) parts of k_argmax, combined */
__global__ void k_argmax_fin(const float2 *part, int P, int32_t *ids)
{
    pdl_begin();
    int lane = threadIdx.x;
    float v = -INFINITY;
    int j = 0x7fffffff;
    if (lane < P) {
        float2 p = part[(size_t)blockIdx.x * P + lane];
        v = p.x; j = __float_as_int(p.y);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int j2 = __shfl_xor_sync(0xffffffffu, j, o);
        if (v2 > v || (v2 == v && j2 < j)) { v = v2; j = j2; }
    }
    if (lane == 0) ids[blockIdx.x] = j == 0x7fffffff ? 0 : j;
}

/* ---------------- launchers ---------------- */

#define TYPE_SWITCH(type, FN)                   \
    switch (type) {                             \
    case T_F32: FN(T_F32); break;               \
    case T_F16: FN(T_F16); break;               \
    case T_BF16: FN(T_BF16); break;             \
    case T_Q4_0: FN(T_Q4_0); break;             \
    case T_Q4_1: FN(T_Q4_1); break;             \
    case T_Q5_0: FN(T_Q5_0); break;             \
    case T_Q5_1: FN(T_Q5_1); break;             \
    case T_Q8_0: FN(T_Q8_0); break;             \
    case T_Q2_K: FN(T_Q2_K); break;             \
    case T_Q3_K: FN(T_Q3_K); break;             \
    case T_Q4_K: FN(T_Q4_K); break;             \
    case T_Q5_K: FN(T_Q5_K); break;             \
    case T_Q6_K: FN(T_Q6_K); break;             \
    default: break;                             \
    }

static inline unsigned nblk(size_t n, unsigned bs) { return (unsigned)((n + bs - 1) / bs); }

template <int TY, int K>
static void gemv_k(cudaStream_t st, gv_set S, size_t rb, int n, const float *x, int T)
{
    unsigned g = 0;
    for (int i = 0; i < S.nm; i++) { S.m[i].blk0 = (int)g; g += nblk(S.m[i].n_out, 4 / K); }
    switch (T) {
    case 1: lk(k_gemv<TY, 1, K>, g, 128, 0, st, S, rb, n, x, T); break;
    case 2: lk(k_gemv<TY, 2, K>, g, 128, 0, st, S, rb, n, x, T); break;
    case 3: case 4: lk(k_gemv<TY, 4, K>, g, 128, 0, st, S, rb, n, x, T); break;
    case 5: case 6: case 7: case 8: lk(k_gemv<TY, 8, K>, g, 128, 0, st, S, rb, n, x, T); break;
    default: lk(k_gemv<TY, 16, K>, g, 128, 0, st, S, rb, n, x, T); break;
    }
}

template <int K>
static void gemv_qk(cudaStream_t st, gv_set S, size_t rb, int n, const int8_t *xq, const float *xd, const int *xs,
                    int T)
{
    unsigned g = 0;
    for (int i = 0; i < S.nm; i++) { S.m[i].blk0 = (int)g; g += nblk(S.m[i].n_out, 4 / K); }
    switch (T) {
    case 1: lk(k_gemv_q4k<1, K>, g, 128, 0, st, S, rb, n, xq, xd, xs, T); break;
    case 2: lk(k_gemv_q4k<2, K>, g, 128, 0, st, S, rb, n, xq, xd, xs, T); break;
    case 3: case 4: lk(k_gemv_q4k<4, K>, g, 128, 0, st, S, rb, n, xq, xd, xs, T); break;
    case 5: case 6: case 7: case 8: lk(k_gemv_q4k<8, K>, g, 128, 0, st, S, rb, n, xq, xd, xs, T); break;
    default: lk(k_gemv_q4k<16, K>, g, 128, 0, st, S, rb, n, xq, xd, xs, T); break;
    }
}

template <int K>
static void gemv_q8k(cudaStream_t st, gv_set S, size_t rb, int n, const int8_t *xq, const float *xd, int T)
{
    unsigned g = 0;
    for (int i = 0; i < S.nm; i++) { S.m[i].blk0 = (int)g; g += nblk(S.m[i].n_out, 4 / K); }
    switch (T) {
    case 1: lk(k_gemv_q8<1, K>, g, 128, 0, st, S, rb, n, xq, xd, T); break;
    case 2: lk(k_gemv_q8<2, K>, g, 128, 0, st, S, rb, n, xq, xd, T); break;
    case 3: case 4: lk(k_gemv_q8<4, K>, g, 128, 0, st, S, rb, n, xq, xd, T); break;
    case 5: case 6: case 7: case 8: lk(k_gemv_q8<8, K>, g, 128, 0, st, S, rb, n, xq, xd, T); break;
    default: lk(k_gemv_q8<16, K>, g, 128, 0, st, S, rb, n, xq, xd, T); break;
    }
}

static void gemv_q8t(cudaStream_t st, const gv_set &S, size_t rb, int n, const int8_t *xq, const float *xd, int T)
{
    int K = gv_warps(n / 32);
    if (K == 4) gemv_q8k<4>(st, S, rb, n, xq, xd, T);
    else if (K == 2) gemv_q8k<2>(st, S, rb, n, xq, xd, T);
    else gemv_q8k<1>(st, S, rb, n, xq, xd, T);
}

static void gemv_qt(cudaStream_t st, const gv_set &S, size_t rb, int n, const int8_t *xq, const float *xd,
                    const int *xs, int T)
{
    int K = gv_warps(n / 64);
    if (K == 4) gemv_qk<4>(st, S, rb, n, xq, xd, xs, T);
    else if (K == 2) gemv_qk<2>(st, S, rb, n, xq, xd, xs, T);
    else gemv_qk<1>(st, S, rb, n, xq, xd, xs, T);
}

/* ANE_CUDA_GEMV_MR=0: decode through the one-row kernels (for comparison);
 * ANE_CUDA_GEMV_R (2, 4, 8) rows per group for one token (for tuning). */
static int env_int(const char *name, int dflt)
{
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

/* a knob of 0 or more (0: off), dflt when unset or negative */
static int env_count(const char *name, int dflt)
{
    int v = env_int(name, dflt);
    return v >= 0 ? v : dflt;
}

static int gemv_mr_off(void)
{
    static int v = -1;
    if (v < 0) v = env_int("ANE_CUDA_GEMV_MR", 1) == 0;
    return v;
}

/* Batches of 3..16 tokens: R rows per group for rows of 2048 values and
 * more, where re-reading x per row costs most (measured: 7b 1.3-1.5x), one
 * row per warp (k_gemv_q4k, k_gemv_q8) for shorter rows (0.5b: 8% faster
 * there). Both give the same bits. ANE_CUDA_GEMV_BT=0 / 1: always the one
 * or the other (for comparison). */
static int gemv_bt(int n)
{
    static int v = -2;
    if (v == -2) v = env_int("ANE_CUDA_GEMV_BT", -1);
    return v < 0 ? n >= 2048 : v != 0;
}

/* decode: rows per group R, K warps per group by the units per row */
template <int NT, int R, int KD, int PRE = 1>
static void gemv_mr_k(cudaStream_t st, gv_set S, size_t rb, int n, const int8_t *xq, const float *xd, const int *xs,
                      int T)
{
    int K = gv_warps(KD == GV_Q8 ? n / 32 : n / 64);
    unsigned g = 0;
    size_t bytes = 0;
    for (int i = 0; i < S.nm; i++) {
        S.m[i].blk0 = (int)g;
        g += nblk(S.m[i].n_out, (unsigned)(4 / K * R));
        bytes += (size_t)S.m[i].n_out * rb;
    }
    S.pf = gv_pf(bytes);
    xq_lay none;
    memset(&none, 0, sizeof none);
    ck_qkv_rope nr;
    memset(&nr, 0, sizeof nr);
    if (K == 4) lk(k_gemv_mr<NT, R, 4, KD, 0, PRE>, g, 128, 0, st, S, rb, n, xq, xd, xs, T, none, nr);
    else if (K == 2) lk(k_gemv_mr<NT, R, 2, KD, 0, PRE>, g, 128, 0, st, S, rb, n, xq, xd, xs, T, none, nr);
    else lk(k_gemv_mr<NT, R, 1, KD, 0, PRE>, g, 128, 0, st, S, rb, n, xq, xd, xs, T, none, nr);
}

/* Rows per warp group of a one-token GEMV: ANE_CUDA_GEMV_R (1, 2, 4, 8)
 * for comparison, else the kind's default (gemv_mr_q); the same bits at
 * any R */
static int gemv_r(void)
{
    static int R = -1;
    if (R < 0) R = env_int("ANE_CUDA_GEMV_R", 0);
    return R;
}

/* q8_0 units a lane of a one-row-per-group GEMV loads before the launch
 * wait: 2 (ANE_CUDA_GEMV_PRE=1 for one, as before, for comparison). A 7b's
 * rows of 3,584 values are two units per lane at 2 warps per row, so the
 * first wave of each q/k/v, o and gate-and-up launch holds all of its
 * weights before x is written. Measured, 7b q8_0 decode: +1.3-2.8% (BENCHMARKS.md) */
static int gemv_pre(void)
{
    static int P = -1;
    if (P < 0) P = env_int("ANE_CUDA_GEMV_PRE", 2);
    return P;
}

/* One-token q8_0 rows of four warps by k_gemv_q8bulk (the same sums):
 * rows of up to GB_UNITS units a lane, in whole 16-byte pieces.
 * Measured, 7b q8_0 decode +2.1-2.4%, 0.5b +2-4% (BENCHMARKS.md).
 * ANE_CUDA_GEMV_BULK=0: by k_gemv_mr (for comparison). */
static int gemv_bulk(int n, size_t rb)
{
    static int v = -1;
    if (v < 0) v = env_count("ANE_CUDA_GEMV_BULK", 1);
    return v && n % 32 == 0 && gv_warps(n / 32) == 4 && n / 32 <= 128 * GB_UNITS && rb % 16 == 0;
}

static void gemv_q8bulk(cudaStream_t st, gv_set S, size_t rb, int n, const int8_t *xq, const float *xd)
{
    static int carve = 0;
    if (!carve) {   /* as many rows in flight per SM as shared memory holds */
        carve = 1;
        cudaFuncSetAttribute(k_gemv_q8bulk, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    }
    unsigned g = 0;
    for (int i = 0; i < S.nm; i++) { S.m[i].blk0 = (int)g; g += (unsigned)S.m[i].n_out; }
    lk(k_gemv_q8bulk, g, 128, rb, st, S, rb, n, xq, xd);
}

/* One-token q8_0 sets of rows of two warps whose launch at a row per
 * group would leave a second wave of at most a quarter of the first (a
 * 7b's o projection: 1,792 blocks on 1,584 places) take two rows a group
 * (the same sums; one wave). ANE_CUDA_GEMV_R2=0: off. */
static int gemv_r2(const gv_set &S, int n)
{
    static int on = -1, slots = 0;
    if (on < 0) {
        on = env_count("ANE_CUDA_GEMV_R2", 1);
        int dev = 0, sm = 0, per = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, dev) ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_gemv_mr<1, 1, 2, GV_Q8, 0, 2>, 128, 0) != cudaSuccess)
            on = 0;
        slots = sm * per;
    }
    if (!on || gv_warps(n / 32) != 2 || slots <= 0) return 0;
    long blocks = 0;
    for (int i = 0; i < S.nm; i++) blocks += (S.m[i].n_out + 1) / 2;
    return blocks > slots && blocks - slots <= slots / 4;
}

template <int KD>
static void gemv_mr_q(cudaStream_t st, const gv_set &S, size_t rb, int n, const int8_t *xq, const float *xd,
                      const int *xs, int T)
{
    /* one token: rows of 2048 values and more (a 7b's) at 1 row per group
     * for q8_0, 2 for the K-quants; shorter ones (a 0.5b's, launch-bound) 4.
     * Measured, decode at prompt 128: 7b q8_0 266 (R 4) / 302 (2) / 306 (1),
     * 7b q4_k 424 / 437 / 408, 0.5b q8_0 1,226 / 1,180 / 1,211 */
    int R = gemv_r() ? gemv_r() : n < 2048 ? 4 : KD == GV_Q8 ? 1 : 2;
    if (T > 8) gemv_mr_k<16, 4, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (T > 4) gemv_mr_k<8, 4, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (T > 2) gemv_mr_k<4, 4, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (T == 2) gemv_mr_k<2, 2, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (R == 8) gemv_mr_k<1, 8, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (R == 2) gemv_mr_k<1, 2, KD>(st, S, rb, n, xq, xd, xs, T);
    else if (R == 1) {
        if constexpr (KD == GV_Q8) {
            if (gemv_bulk(n, rb)) {
                gemv_q8bulk(st, S, rb, n, xq, xd);
                return;
            }
            if (gemv_pre() != 1) {
                if (gemv_r2(S, n)) gemv_mr_k<1, 2, KD, 2>(st, S, rb, n, xq, xd, xs, T);
                else gemv_mr_k<1, 1, KD, 2>(st, S, rb, n, xq, xd, xs, T);
                return;
            }
        }
        gemv_mr_k<1, 1, KD>(st, S, rb, n, xq, xd, xs, T);
    }
    else gemv_mr_k<1, 4, KD>(st, S, rb, n, xq, xd, xs, T);
}

static void gemv_mr(cudaStream_t st, const gv_set &S, uint32_t type, size_t rb, int n, const int8_t *xq,
                    const float *xd, const int *xs, int T)
{
    if (type == T_Q4_K) gemv_mr_q<GV_Q4K>(st, S, rb, n, xq, xd, xs, T);
    else if (type == T_Q6_K) gemv_mr_q<GV_Q6K>(st, S, rb, n, xq, xd, xs, T);
    else gemv_mr_q<GV_Q8>(st, S, rb, n, xq, xd, xs, T);
}

/* ANE_CUDA_MMQ=1: q8_0 / q4_K through the int8 tensor-core kernel at every
 * batch size (invariant for prompt rows too) instead of GEMV + cuBLAS */
static int mmq_off(void)
{
    static int v = -1;
    if (v < 0) v = env_int("ANE_CUDA_MMQ", 0) == 0;
    return v;
}

template <int J, bool Q4K>
static void mmq_k(cudaStream_t st, gv_set S, size_t rb, int n, const int8_t *xq, const float *xd, const int *xs,
                  int T, int tp)
{
    unsigned g = 0;
    for (int i = 0; i < S.nm; i++) { S.m[i].blk0 = (int)g; g += nblk(S.m[i].n_out, MQ_ROWS); }
    dim3 grid(g, nblk(T, 8 * J));
    lk(k_mmq<J, Q4K>, grid, MQ_WARPS * 32, 0, st, S, rb, n, xq, xd, xs, T, tp);
}

template <bool Q4K>
static void mmq(cudaStream_t st, const gv_set &S, size_t rb, int n, const int8_t *xq, const float *xd, const int *xs,
                int T, int tp)
{
    if (T <= 8) mmq_k<1, Q4K>(st, S, rb, n, xq, xd, xs, T, tp);
    else if (T <= 16) mmq_k<2, Q4K>(st, S, rb, n, xq, xd, xs, T, tp);
    else if (T <= 32) mmq_k<4, Q4K>(st, S, rb, n, xq, xd, xs, T, tp);
    else mmq_k<8, Q4K>(st, S, rb, n, xq, xd, xs, T, tp);
}

/* CTAs per SM that k_mmqh's K split aims at: 2 (measured, 7b gate+up: 2
 * CTAs per SM 7% faster than 3); ANE_CUDA_MMQB_CTAS for comparison */
static int mmqh_ctas(void)
{
    static int v = 0;
    if (!v) {
        const char *e = getenv("ANE_CUDA_MMQB_CTAS");
        v = e && atoi(e) > 0 ? atoi(e) : 2;
    }
    return v;
}

/* Whether a set whose row tiles fit in the CTA slots (ANE_CUDA_MMQB_CTAS
 * per SM) splits K no further than they hold (ANE_CUDA_MMQB_FIT=0: each
 * matrix as if alone, for comparison) */
static int mmqb_fit(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("ANE_CUDA_MMQB_FIT");
        v = !(e && *e && atoi(e) == 0);
    }
    return v;
}


/* k_mmqw for four token tiles: in sm_90a builds (CK_WGMMA), unless
 * ANE_CUDA_WGMMA=0 (for comparison) */
static bool mmqw_on(void)
{
#if defined(CK_WGMMA)
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("ANE_CUDA_WGMMA");
        v = !(e && *e && atoi(e) == 0);
    }
    return v;
#else
    return false;
#endif
}

/* The K split of each matrix for k_mmqh: enough CTAs for ~2 per SM, whole
 * chunks per split, but where the set's row tiles fit in the CTA slots,
 * no more CTAs than slots (measured: a 7b down projection's 28 tiles split
 * 10 ways left 16 CTAs for a second wave; 9 ways, 7b 32 streams +3-4%). A
 * function of the set's shapes only, never of the batch. Without room for
 * the partials (or the counters), no split. Gate and up (S.glu_u, one set
 * entry of n_out features): tiles of 64 features' two rows, split as the
 * set {gate, up} would be, so each row's sums are those of ck_mmq_dec. */
template <int J, bool WG, bool Q6 = false>
static void mmqh_k(cudaStream_t st, gv_set S, size_t rb, int n, const __half *x16, int T, float *part,
                   size_t part_bytes, int *cnt, int n_cnt, int n_sm)
{
    auto kern = WG ? k_mmqw<J, Q6> : k_mmqh<J>;
    const size_t smem = WG ? sizeof(mw_smem<J, Q6>) + MW_AT : sizeof(mh_smem<J>);   /* (+ the atoms' alignment) */
    static bool attr = false;   /* (the dynamic shared memory past 48 KiB, once) */
    if (!attr) {
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr = true;
    }
    int nch = n / MH_CH, ctas = mmqh_ctas() * n_sm, ttot = 0, cap = 1 << 30;
    for (int i = 0; i < S.nm; i++) ttot += (S.glu_u ? 2 : 1) * (int)nblk(S.m[i].n_out, MB_ROWS);
    if (mmqb_fit() && ttot <= ctas) cap = ctas / ttot;
    for (int pass = 0; pass < 2; pass++) {
        unsigned g = 0;
        size_t slots = 0;
        int cb = 0;
        for (int i = 0; i < S.nm; i++) {
            int mt = (int)nblk(S.m[i].n_out, MB_ROWS), tiles = S.glu_u ? S.m[i].n_out / (MB_ROWS / 2) : mt, sp = 1, per = nch;
            if (pass == 0) {
                int want = (ctas + mt - 1) / mt;
                want = want > cap ? cap : want;
                want = want < 1 ? 1 : want > nch ? nch : want;
                per = (nch + want - 1) / want;
                sp = (nch + per - 1) / per;
            }
            S.m[i].blk0 = (int)g;
            S.m[i].sp = sp;
            S.m[i].per = per;
            S.m[i].pb = (int)slots;
            S.m[i].cb = cb;
            g += (unsigned)(tiles * sp);
            if (sp > 1) { slots += (size_t)tiles * sp; cb += tiles; }
        }
        if (pass == 1 || (slots * J * 8 * MB_ROWS * 4 <= part_bytes && cb <= n_cnt)) {
            lk(kern, g, MB_WARPS * 32, smem, st, S, rb, n, x16, T, part, cnt);
            return;
        }
    }
}

template <int TY>
static void gemv_t(cudaStream_t st, const gv_set &S, size_t rb, int n, const float *x, int T)
{
    if (n >= 4096) gemv_k<TY, 4>(st, S, rb, n, x, T);
    else if (n >= 1024) gemv_k<TY, 2>(st, S, rb, n, x, T);
    else gemv_k<TY, 1>(st, S, rb, n, x, T);
}

extern "C" {

int ck_type_ok(uint32_t type)
{
    switch (type) {
    case T_F32: case T_F16: case T_BF16: case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0:
    case T_Q2_K: case T_Q3_K: case T_Q4_K: case T_Q5_K: case T_Q6_K: return 1;
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

/* the layout of xq for out [T][n], or none (q NULL) */
/* The forms a producer writes beside its output [T][n]: int8 (xq, n % 32
 * == 0) and/or f16 (x16) */
static xq_lay xq_out(void *xq, void *x16, int T, int n)
{
    xq_lay L;
    if (xq && n % 32 == 0) L = xq_layout(xq, T, n);
    else memset(&L, 0, sizeof L);
    L.h = (__half *)x16;
    return L;
}

/* Which small kernels schedule the next launch before their wait: the
 * matmul after one then launches while the small kernel's own predecessor
 * drains, and its blocks load their weights then (every kernel reads only
 * weights and the pass's constants before its wait, so nothing it reads
 * early is being written). By default the norms of rows under 2048 values
 * (launch-bound models; measured, decode at prompt 1: 0.5b q8_0 +3.7%, 7b
 * q8_0 within noise, and -0.7% at prompt 512, where the early matmul slows
 * the down projection's end). ANE_CUDA_EARLY, a mask, for comparison: 1
 * norms (any row), 2 silu_mul, 4 the one-token attention. */
static int early_mask(void)
{
    static int v = -2;
    if (v == -2) {
        const char *e = getenv("ANE_CUDA_EARLY");
        v = e && *e ? atoi(e) : -1;
    }
    return v;
}
static int early_on(int bit) { return early_mask() > 0 && (early_mask() & bit); }
static int norm_early(int n) { return early_mask() < 0 ? n < 2048 : early_on(1); }

/* a block per row: up to 1024 threads, each with up to 8 values in registers */
#define L_NORM(KER, ...)                                                                                  \
    do {                                                                                                  \
        int bs = n >= 1024 ? 1024 : ((n + 31) / 32) * 32, npt = (n + bs - 1) / bs, ne = norm_early(n);    \
        xq_lay L = xq_out(xq, x16, rows, n);                                                              \
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

int ck_gemv_int8(uint32_t type, int n_in)
{
    /* (q6_K: rows of an even number of super-blocks are 4-byte aligned) */
    return (type == T_Q4_K && n_in % 256 == 0) || (type == T_Q8_0 && n_in % 32 == 0) ||
           (type == T_Q6_K && n_in % 512 == 0);
}

int ck_mmq(uint32_t type, int n_in)
{
    return ck_gemv_int8(type, n_in) && type != T_Q6_K && !mmq_off();
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

int ck_mmqb_ok(uint32_t type, int n_in)
{
    return n_in % 256 == 0 && (type == T_Q4_K || (type == T_Q6_K && mmqw_on()));
}

size_t ck_q6b_row_bytes(int n_in) { return (size_t)(n_in / 256) * Q6B_CH; }

void ck_repack_q6_Kb(cudaStream_t st, const void *src, void *dst, size_t rb, int n, int n_out)
{
    size_t tot = (size_t)(n / 256) * n_out * 4;
    lk(k_repack_q6_Kb, nblk(tot, 256), 256, 0, st, (const uint8_t *)src, (uint8_t *)dst, rb, n, n_out);
}

/* The batched kernel's launcher for type and T: token tiles only live ones
 * (the partial slots keep CK_MMQB_MAX_T tokens); four tiles by warpgroup
 * MMAs where built for them (measured: 24 tokens and fewer gain nothing);
 * q6_K only by those (ck_mmqb_ok) */
typedef void (*mmqb_fn)(cudaStream_t, gv_set, size_t, int, const __half *, int, float *, size_t, int *, int, int);
static mmqb_fn mmqb_pick(uint32_t type, int T)
{
    if (type == T_Q6_K) return T <= 24 ? mmqh_k<3, true, true> : mmqh_k<4, true, true>;
    return T <= 24 ? mmqh_k<3, false> : mmqw_on() ? mmqh_k<4, true> : mmqh_k<4, false>;
}

void ck_mmq_dec(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n, const int *n_out,
                const float *const *bias, int T, float *const *out, const void *x16, void *part, size_t part_bytes,
                int *cnt, int n_cnt, int n_sm)
{
    if (!ck_mmqb_ok(type, n) || T < 1 || T > CK_MMQB_MAX_T || nm < 1 || nm > CK_MULTI_MAX) return;
    gv_set S = gv_fill(nm, W, n_out, bias, out, 0);
    mmqb_pick(type, T)(st, S, rb, n, (const __half *)x16, T, (float *)part, part_bytes, cnt, n_cnt, n_sm);
}

int ck_mmq_glu(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int F, int T,
               float *out, void *h_out, const void *x16, void *part, size_t part_bytes, int *cnt, int n_cnt, int n_sm)
{
    if (type != T_Q4_K || !ck_mmqb_ok(type, n) || T < 1 || T > CK_MMQB_MAX_T || F % (MB_ROWS / 2) || !h_out) return 0;
    const float *nb = NULL;
    gv_set S = gv_fill(1, &Wg, &F, &nb, &out, 0);
    S.glu_u = (const uint8_t *)Wu;
    S.glu_h = (__half *)h_out;
    mmqb_pick(type, T)(st, S, rb, n, (const __half *)x16, T, (float *)part, part_bytes, cnt, n_cnt, n_sm);
    return 1;
}

/* x [T][n] already quantized into xq_scratch (pre) or not yet */
static void gemv_multi(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n,
                       const int *n_out, const float *const *bias, const float *x, int T, float *const *out,
                       void *xq_scratch, bool pre)
{
    if (xq_scratch && ck_gemv_int8(type, n)) {
        xq_lay L = xq_layout(xq_scratch, T, n);
        size_t nbt = (size_t)T * (n / 32);
        if (!pre) lk(k_quant_x, nblk(nbt * 32, 128), 128, 0, st, x, nbt, L);
        int8_t *xq = L.q;
        float *xd = L.d, *xdt = L.dt;
        int *xs = L.s, *xst = L.st;
        int tp = L.tp;
        if (ck_mmq(type, n)) {
            gv_set S = gv_fill(nm, W, n_out, bias, out, 0);
            if (type == T_Q4_K) mmq<true>(st, S, rb, n, xq, xdt, xst, T, tp);
            else mmq<false>(st, S, rb, n, xq, xdt, xst, T, tp);
            return;
        }
        for (int t0 = 0; t0 < T; t0 += CK_GEMV_MAX_T) {
            int tn = T - t0 < CK_GEMV_MAX_T ? T - t0 : CK_GEMV_MAX_T;
            gv_set S = gv_fill(nm, W, n_out, bias, out, t0);
            const int8_t *q = xq + (size_t)t0 * n;
            const float *d = xd + (size_t)t0 * (n / 32);
            const int *sx = xs + (size_t)t0 * (n / 32);
            /* (q6_K: the R-row kernel only) */
            if (type == T_Q6_K || (tn <= 2 ? !gemv_mr_off() : gemv_bt(n))) gemv_mr(st, S, type, rb, n, q, d, sx, tn);
            else if (type == T_Q8_0) gemv_q8t(st, S, rb, n, q, d, tn);
            else gemv_qt(st, S, rb, n, q, d, sx, tn);
        }
        return;
    }
    for (int t0 = 0; t0 < T; t0 += CK_GEMV_MAX_T) {
        int tn = T - t0 < CK_GEMV_MAX_T ? T - t0 : CK_GEMV_MAX_T;
        gv_set S = gv_fill(nm, W, n_out, bias, out, t0);
        const float *xt = x + (size_t)t0 * n;
#define L_GEMV(TY) gemv_t<TY>(st, S, rb, n, xt, tn)
        TYPE_SWITCH(type, L_GEMV)
    }
}

void ck_gemv_multi(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n,
                   const int *n_out, const float *const *bias, const float *x, int T, float *const *out,
                   void *xq_scratch)
{
    gemv_multi(st, type, nm, W, rb, n, n_out, bias, x, T, out, xq_scratch, false);
}

int ck_gemv_qkv_rope(cudaStream_t st, uint32_t type, const void *const *W, size_t rb, int n, const int *n_out,
                     const void *xq, float *const *out, const ck_qkv_rope *r)
{
    /* the one-token launch gemv_mr_q makes for these rows (R 1, K 2, two
     * preloaded units), so the sums are its; a pair a block */
    if (type != T_Q8_0 || n < 2048 || n % 32 || gv_warps(n / 32) != 2 || gemv_mr_off() || gemv_pre() == 1 ||
        (gemv_r() && gemv_r() != 1))
        return 0;
    if (r->n_rot != r->head_dim || r->head_dim % 2 || n_out[1] != n_out[2] || n_out[1] != r->n_head_kv * r->head_dim ||
        n_out[0] % r->head_dim)
        return 0;
    const float *nob[3] = { NULL, NULL, NULL };
    gv_set S = gv_fill(3, W, n_out, nob, out, 0);
    unsigned g = 0;
    for (int i = 0; i < 3; i++) { S.m[i].blk0 = (int)g; g += nblk(S.m[i].n_out, 2); }
    S.pf = 0;
    xq_lay L = xq_layout((void *)xq, 1, n), none;
    memset(&none, 0, sizeof none);
    lk(k_gemv_mr<1, 1, 2, GV_Q8, 0, 2, 1>, g, 128, 0, st, S, rb, n, L.q, L.d, L.s, 1, none, *r);
    return 1;
}

void ck_gemv_multi_q(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n,
                     const int *n_out, const float *const *bias, int T, float *const *out, void *xq)
{
    if (ck_gemv_int8(type, n)) gemv_multi(st, type, nm, W, rb, n, n_out, bias, NULL, T, out, xq, true);
}

/* Blocks of the GLU kernel resident per SM (its registers decide) */
static int glu_per_sm(uint32_t type)
{
    static int per[3] = { -1, -1, -1 };
    int i = type == T_Q4_K ? 1 : type == T_Q6_K ? 2 : 0;
    if (per[i] < 0) {
        int nb = 0;
        cudaError_t e = i == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_gemv_mr<1, 4, 1, GV_Q4K, 1>, 512, 0)
                      : i == 2 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_gemv_mr<1, 4, 1, GV_Q6K, 1>, 512, 0)
                               : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_gemv_mr<1, 4, 1, GV_Q8, 1>, 512, 0);
        per[i] = e == cudaSuccess ? nb : 0;
    }
    return per[i];
}

/* One token, one warp per row (K 1), and a launch that fits in one wave:
 * its 512-thread blocks, 32 outputs each, are 4x coarser than the GEMV's,
 * and a second wave of them costs more than the launch saved (measured:
 * 7b q4_k gate+up, 592 blocks, decode -6%; 0.5b, 152 blocks, +2%). */
int ck_glu_ok(uint32_t type, int n_in, int n_out, int T, int n_sm)
{
    if (T != 1 || !ck_gemv_int8(type, n_in) || ck_mmq(type, n_in) || n_out % 32) return 0;
    if (type != T_Q6_K && gemv_mr_off()) return 0;
    if (gv_warps(type == T_Q8_0 ? n_in / 32 : n_in / 64) != 1) return 0;
    return n_out / 32 <= glu_per_sm(type) * n_sm;
}

int ck_small_set(size_t bytes) { return gv_pf(bytes); }

void ck_gemv_glu(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int n_out,
                 const void *xq, float *out, void *xq_next, void *x16_next)
{
    const void *W[2] = { Wg, Wu };
    const int no[2] = { n_out, n_out };
    const float *bias[2] = { NULL, NULL };
    float *outs[2] = { out, out };
    gv_set S = gv_fill(2, W, no, bias, outs, 0);
    S.pf = gv_pf((size_t)2 * n_out * rb);
    xq_lay L = xq_layout((void *)xq, 1, n), O = xq_out(xq_next, x16_next, 1, n_out);
    unsigned g = (unsigned)(n_out / 32);
    ck_qkv_rope nr;
    memset(&nr, 0, sizeof nr);
    if (type == T_Q4_K) lk(k_gemv_mr<1, 4, 1, GV_Q4K, 1>, g, 512, 0, st, S, rb, n, L.q, L.d, L.s, 1, O, nr);
    else if (type == T_Q6_K) lk(k_gemv_mr<1, 4, 1, GV_Q6K, 1>, g, 512, 0, st, S, rb, n, L.q, L.d, L.s, 1, O, nr);
    else lk(k_gemv_mr<1, 4, 1, GV_Q8, 1>, g, 512, 0, st, S, rb, n, L.q, L.d, L.s, 1, O, nr);
}

void ck_gemv(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int n_out, const float *bias,
             const float *x, int T, float *out, void *xq_scratch)
{
    ck_gemv_multi(st, type, 1, &W, rb, n, &n_out, &bias, x, T, &out, xq_scratch);
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
    xq_lay L = xq_out(xq && rows > 0 && n % (size_t)rows == 0 ? xq : NULL, x16, rows, rows > 0 ? (int)(n / rows) : 0);
    lk(k_silu_mul, nblk(n, 256), 256, 0, st, g, u, n, out, L, early_on(2));
}

void ck_rope(cudaStream_t st, float *x, const int32_t *pos, int T, int n_heads, int hd, int n_rot, float base,
             int neox, const float *fd)
{
    lk(k_rope, T, 256, 0, st, x, pos, n_heads, hd, n_rot, base, neox, fd);
}

void ck_kv_store(cudaStream_t st, void *kc, void *vc, int f16, const int32_t *pos, const int32_t *off,
                 const int32_t *pages, int T, int kv_dim, const float *k, const float *v)
{
    dim3 g(nblk(kv_dim, 128), T);
    lk(k_kv_store, g, 128, 0, st, kc, vc, f16, pos, off, pages, kv_dim, k, v);
}

void ck_rope_kv(cudaStream_t st, float *q, float *k, const float *v, void *kc, void *vc, int f16,
                const int32_t *pos, const int32_t *off, const int32_t *pages, int T, int n_head, int n_head_kv,
                int hd, int n_rot, float base, int neox, const float *fd, const float *bq, const float *bk,
                const float *bv, void *tab, int tab_mode)
{
    dim3 g(T, n_head + n_head_kv);
    int bs = hd / 2 > 32 ? 128 : 32;
    lk(k_rope_kv, g, bs, 0, st, q, k, v, kc, vc, f16, pos, off, pages, n_head, n_head_kv, hd, n_rot, base, neox, fd,
       bq, bk, bv, (float2 *)tab, tab ? tab_mode : 0);
}

int ck_att_grp_ok(int f16, int n_head, int n_head_kv, int hd)
{
    if (n_head_kv < 1 || n_head % n_head_kv || n_head / n_head_kv < 2 || n_head / n_head_kv > 8) return 0;
    if (hd > 256 || hd * (f16 ? 2 : 4) > 512 || (hd * (f16 ? 2 : 4)) % 16) return 0;
    static bool attr = false;   /* (64 KiB of dynamic shared memory at most, once) */
    if (!attr) {
        int b = 64 << 10;
        cudaFuncSetAttribute(k_att_grp<1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<2, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<4, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<8, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<2, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<4, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_grp<8, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(k_att_mma<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)AM_SMEM(64));
        cudaFuncSetAttribute(k_att_mma<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)AM_SMEM(128));
        attr = true;
    }
    return 1;
}

int ck_att_mma_ok(int f16, int n_head, int n_head_kv, int hd)
{
    return f16 && (hd == 64 || hd == 128) && ck_att_grp_ok(f16, n_head, n_head_kv, hd);
}

/* The block's warps on each span together (att_coop): for head_dim 32 *
 * ATT_WARPS, in the direct path for tokens of up to ANE_CUDA_ATT_COOP spans
 * (default 4: one round of the warps' spans; 0: never) and in every split */
int ck_att_coop(int hd)
{
    static int cv = -1;
    if (cv < 0) cv = env_count("ANE_CUDA_ATT_COOP", 4);
    return hd == 32 * ATT_WARPS ? cv : 0;
}

/* Groups of a k_att_par block (spans at a time) */
#define ATT_PAR_G 4

/* Tokens of up to this many spans, in launches of at most one block per
 * SM, go through k_att_par without a split over blocks (ANE_CUDA_ATT_PAR;
 * 0: never, the direct path and splits as before) */
int ck_att_par(int hd)
{
    static int pv = -1;
    if (pv < 0) pv = env_count("ANE_CUDA_ATT_PAR", 8);
    return hd == 32 * ATT_WARPS ? pv : 0;
}

void ck_attention(cudaStream_t st, const float *q, const void *kc, const void *vc, int f16, const int32_t *pos,
                  const int32_t *off, const int32_t *pages, int T, int n_head, int n_head_kv, int hd, float *out,
                  float *part, int G, int maxs, void *xq, void *x16, int n_sm, const ck_rope_in *rp, int grp,
                  int mma)
{
    if (G < 1 || maxs < 1) G = 1;
    int nd = (hd + 31) / 32;
    if (grp > 0 && !rp && ck_att_grp_ok(f16, n_head, n_head_kv, hd)) {
        xq_lay L = xq_out(hd % 32 == 0 ? xq : NULL, x16, T, n_head * hd);
        dim3 g(T * n_head_kv, grp);
        if (mma && ck_att_mma_ok(f16, n_head, n_head_kv, hd)) {
            const __half *k16 = (const __half *)kc, *v16 = (const __half *)vc;
            if (hd == 64)
                lk(k_att_mma<64>, g, AM_WARPS * 32, AM_SMEM(64), st, q, k16, v16, pos, off, pages, n_head, n_head_kv,
                   out, part, grp, maxs, L);
            else
                lk(k_att_mma<128>, g, AM_WARPS * 32, AM_SMEM(128), st, q, k16, v16, pos, off, pages, n_head,
                   n_head_kv, out, part, grp, maxs, L);
            if (grp > 1) lk(k_att_merge, T * n_head, 128, 0, st, part, pos, n_head, hd, maxs, out, L);
            return;
        }
        int bs = n_head / n_head_kv * 32;
        size_t sm = (size_t)4 * 32 * hd * (f16 ? 2 : 4);
#define L_GRP(ND)                                                                                              \
    do {                                                                                                       \
        if (f16) lk(k_att_grp<ND, 1>, g, bs, sm, st, q, kc, vc, pos, off, pages, n_head, n_head_kv, hd, out,   \
                    part, grp, maxs, L);                                                                       \
        else lk(k_att_grp<ND, 0>, g, bs, sm, st, q, kc, vc, pos, off, pages, n_head, n_head_kv, hd, out, part, \
                grp, maxs, L);                                                                                 \
    } while (0)
        if (nd <= 1) L_GRP(1);
        else if (nd <= 2) L_GRP(2);
        else if (nd <= 4) L_GRP(4);
        else L_GRP(8);
#undef L_GRP
        if (grp > 1) lk(k_att_merge, T * n_head, 128, 0, st, part, pos, n_head, hd, maxs, out, L);
        return;
    }
    att_rope R;
    memset(&R, 0, sizeof R);
    if (rp) {
        R.k = rp->k; R.v = rp->v; R.bq = rp->bq; R.bk = rp->bk; R.bv = rp->bv;
        R.tab = (const float2 *)rp->tab; R.kc = (void *)kc; R.vc = (void *)vc; R.n_rot = rp->n_rot; R.neox = rp->neox;
    }
    xq_lay L = xq_out(hd % 32 == 0 ? xq : NULL, x16, T, n_head * hd);
    dim3 g(T * n_head, G);
    /* rolled span loops for launches of fewer blocks than SMs (ANE_CUDA_ATT_ROLL=0/1 forces) */
    static int rv = -2;
    if (rv == -2) {
        const char *e = getenv("ANE_CUDA_ATT_ROLL");
        rv = e && *e ? atoi(e) : -1;
    }
    bool roll = rv < 0 ? (int)(g.x * g.y) < n_sm : rv != 0;
    int coop = ck_att_coop(hd);
    if (G == 1 && !rp && ck_att_par(hd) && T * n_head <= n_sm) {
        int ea = early_on(4);
        if (f16) lk(k_att_par<ATT_WARPS, 1, ATT_PAR_G>, g, ATT_PAR_G * ATT_WARPS * 32, 0, st, q, kc, vc, pos, off,
                    pages, n_head, n_head_kv, out, L, ea);
        else lk(k_att_par<ATT_WARPS, 0, ATT_PAR_G>, g, ATT_PAR_G * ATT_WARPS * 32, 0, st, q, kc, vc, pos, off,
                pages, n_head, n_head_kv, out, L, ea);
        return;
    }
#define L_ATT2(ND, F16)                                                                                        \
    do {                                                                                                       \
        if (roll) lk(k_attention<ND, F16, 1>, g, ATT_WARPS * 32, ATT_WARPS * 32 * 33 * 4, st, q, kc, vc, pos,   \
                     off, pages, n_head, n_head_kv, hd, out, part, G, maxs, L, R, coop);                       \
        else lk(k_attention<ND, F16, 0>, g, ATT_WARPS * 32, 0, st, q, kc, vc, pos, off, pages, n_head,         \
                n_head_kv, hd, out, part, G, maxs, L, R, coop);                                                \
    } while (0)
#define L_ATT(ND)                                                                                              \
    do {                                                                                                       \
        if (f16) L_ATT2(ND, 1);                                                                                \
        else L_ATT2(ND, 0);                                                                                    \
    } while (0)
    if (nd <= 1) L_ATT(1);
    else if (nd <= 2) L_ATT(2);
    else if (nd <= 4) L_ATT(4);
    else L_ATT(8);
    if (G > 1) lk(k_att_merge, T * n_head, 128, 0, st, part, pos, n_head, hd, maxs, out, L);
}

void ck_argmax(cudaStream_t st, const float *x, int rows, int n, int32_t *ids, void *part)
{
    /* a row per block when there are enough rows; else each row split in
     * up to 32 parts (one block scanning a 150k vocabulary is latency-bound) */
    int P = !part || rows >= 64 ? 1 : min(32, max(1, n / 4096));
    dim3 g(rows, P);
    lk(k_argmax, g, 1024, 0, st, x, n, ids, (float2 *)part);
    if (P > 1) lk(k_argmax_fin, rows, 32, 0, st, (const float2 *)part, P, ids);
}

}  /* extern "C" */
