// dequant.cuh — dq32<TYPE>: 32 consecutive values of a weight row (GGUF
// block layouts; q8_0 and q6_K repacked within each row) as f32, with the
// reference dequantizer's expressions (engine/quant/qtypes.c). Shared by
// the embedding and cuBLAS dequantization (convert.cu) and the experts'
// matmuls (moe.cu).
#pragma once

#include "shaders/common.cuh"
#include "shaders/iq.cuh"

/* The int8 form of dq32's values where a type has one: value i = (i < 16 ?
 * d0 : d1) * q_i - m, q_i a signed byte, four to a word (byte j of q[k]:
 * value 4k + j). These are the types whose values are small integers times
 * one or two scales per 32 values, less an offset: x quantized per 32
 * values (int8, scale, sum of the ints) dots them in integers. */
__host__ __device__ constexpr bool dq32i_type(int ty)
{
    return ty == QT_Q4_0 || ty == QT_Q4_1 || ty == QT_Q5_0 || ty == QT_Q5_1 || ty == QT_Q8_0 || ty == QT_Q3_K ||
           ty == QT_Q4_K || ty == QT_Q5_K || ty == QT_Q6_K || ty == QT_IQ4_NL || ty == QT_IQ4_XS || ty == QT_MXFP4;
}

__device__ __forceinline__ int pack4(const int *v)
{
    return (int)((uint32_t)(v[0] & 255) | ((uint32_t)(v[1] & 255) << 8) | ((uint32_t)(v[2] & 255) << 16) |
                 ((uint32_t)v[3] << 24));
}

/* Rows as the device holds them: each weight in an allocation of its own
 * (256-byte aligned), rows of whole blocks, so q4_K/q5_K super-blocks lie
 * on 16-byte words and iq4_xs's on 8-byte ones (read whole); repacked q8_0
 * and q6_K rows and iq4_nl blocks start at even bytes, mxfp4's at any. */
template <int TY>
__device__ __forceinline__ void dq32i(const uint8_t *row, int c, int n, int (&q)[8], float &d0, float &d1, float &m)
{
    m = 0.f;
    int v[32];
    if (TY == QT_Q8_0) {   /* repacked (ck_repack_q8_0): rows at even bytes */
        if (((uintptr_t)row & 15) == 0) {
            uint32_t w[8];
            ld16x2(row + c * 32, w);
#pragma unroll
            for (int k = 0; k < 8; k++) q[k] = (int)w[k];
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int2 w = ld8(row + c * 32 + 8 * i);
                q[2 * i] = w.x;
                q[2 * i + 1] = w.y;
            }
        }
        d0 = d1 = __half2float(__ushort_as_half(__ldg((const unsigned short *)(row + n + 2 * c))));
    } else if (TY == QT_Q4_0 || TY == QT_Q4_1) {
        const int o = TY == QT_Q4_0 ? 2 : 4;
        const uint8_t *b = row + c * (16 + o);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t u = ld32a2(b + o + 4 * k), lo = u & 0x0F0F0F0Fu, hi = (u >> 4) & 0x0F0F0F0Fu;
            if (TY == QT_Q4_0) { lo = __vsub4(lo, 0x08080808u); hi = __vsub4(hi, 0x08080808u); }
            q[k] = (int)lo;
            q[4 + k] = (int)hi;
        }
        d0 = d1 = h2f(b);
        if (TY == QT_Q4_1) m = -h2f(b + 2);
    } else if (TY == QT_Q5_0 || TY == QT_Q5_1) {
        const int o = TY == QT_Q5_0 ? 0 : 2, off = TY == QT_Q5_0 ? 16 : 0;
        const uint8_t *b = row + c * (22 + o);
        uint32_t qh = ld32(b + 2 + o);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int x = b[6 + o + j];
            v[j] = ((x & 0xF) | (((qh >> j) << 4) & 0x10)) - off;
            v[j + 16] = ((x >> 4) | ((qh >> (j + 12)) & 0x10)) - off;
        }
        d0 = d1 = h2f(b);
        if (TY == QT_Q5_1) m = -h2f(b + 2);
    } else if (TY == QT_Q3_K) {
        const uint8_t *b = row + (c >> 3) * 110;
        int sub = c & 7, half = sub >> 2, j = sub & 3, shift = 2 * j;
        const uint8_t *hm = b, *qs = b + 32 + 32 * half, *s12 = b + 96;
        int mk = 1 << (half * 4 + j), is = half * 8 + 2 * j, sc[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int i = is + k;
            int lo = i < 8 ? (s12[i] & 0xF) : (s12[i - 8] >> 4);
            int hi = (s12[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            sc[k] = (lo | (hi << 4)) - 32;
        }
#pragma unroll
        for (int l = 0; l < 32; l++) v[l] = ((qs[l] >> shift) & 3) - ((hm[l] & mk) ? 0 : 4);
        float d = h2f(b + 108);
        d0 = d * (float)sc[0];
        d1 = d * (float)sc[1];
    } else if (TY == QT_Q4_K || TY == QT_Q5_K) {
        const uint8_t *b = row + (c >> 3) * (TY == QT_Q4_K ? 144 : 176);
        const int sub = c & 7, g = sub >> 1, hi = sub & 1;
        const uint8_t *ql = b + (TY == QT_Q4_K ? 16 : 48) + 32 * g;
        uint32_t w[8], h5[8];
        const uint4 h = __ldg((const uint4 *)b);
        k4_sub_h(h, sub, d0, m);
        ld16x2(ql, w);
        if (TY == QT_Q5_K) ld16x2(b + 16, h5);
        d1 = d0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t u = (w[k] >> (hi ? 4 : 0)) & 0x0F0F0F0Fu;
            if (TY == QT_Q5_K) u |= ((h5[k] >> (2 * g + hi)) & 0x01010101u) << 4;
            q[k] = (int)u;
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
        d0 = d * (float)sc[0];
        d1 = d * (float)sc[1];
#pragma unroll
        for (int l = 0; l < 32; l++) v[l] = q6_val(ql, qh, hh, l) - 32;
    } else {   /* iq4_nl, iq4_xs, mxfp4: 16 signed levels per scale */
        uint32_t a[4];   /* the 16 bytes of 32 nibbles */
        if (TY == QT_IQ4_XS) {
            const uint8_t *b = row + (size_t)(c >> 3) * 136;
            const int ib = c & 7;
            const uint2 h = __ldg((const uint2 *)b), q0 = __ldg((const uint2 *)(b + 8 + 16 * ib)),
                        q1 = __ldg((const uint2 *)(b + 16 + 16 * ib));
            const int ls = ((h.y >> (4 * ib)) & 0xf) | (((h.x >> (16 + 2 * ib)) & 3) << 4);
            d0 = __fmul_rn(__half2float(__ushort_as_half((unsigned short)(h.x & 0xffff))), (float)(ls - 32));
            a[0] = q0.x; a[1] = q0.y; a[2] = q1.x; a[3] = q1.y;
        } else {
            /* iq4_nl (18-byte blocks: f16 d, 16 bytes; at even bytes) and
             * mxfp4 (17: e8m0 e, 16 bytes; at any byte): the five aligned
             * words that hold the block (its last byte is in the fifth),
             * the bytes shifted out of them */
            const int hb = TY == QT_IQ4_NL ? 2 : 1;
            const uint8_t *b = row + (size_t)c * (16 + hb);
            const int o = (int)((uintptr_t)b & 3);
            const uint32_t *wp = (const uint32_t *)(b - o);
            uint32_t w[5];
#pragma unroll
            for (int i = 0; i < 5; i++) w[i] = __ldg(wp + i);
            const uint32_t h = __funnelshift_r(w[0], w[1], 8 * o);   /* the block's first 4 bytes */
            d0 = TY == QT_IQ4_NL ? __half2float(__ushort_as_half((unsigned short)(h & 0xffff))) : iq_e8m0_half((int)(h & 0xff));
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = __funnelshift_rc(w[i], w[i + 1], 8 * (o + hb));
        }
        d1 = d0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (TY == QT_MXFP4) {
                q[i] = (int)iq_lookup4(a[i] & 0x0F0F0F0Fu, IQ_FP4_TAB);
                q[4 + i] = (int)iq_lookup4((a[i] >> 4) & 0x0F0F0F0Fu, IQ_FP4_TAB);
            } else {
                q[i] = (int)iq_lookup4(a[i] & 0x0F0F0F0Fu, IQ_NL_TAB);
                q[4 + i] = (int)iq_lookup4((a[i] >> 4) & 0x0F0F0F0Fu, IQ_NL_TAB);
            }
        }
    }
    if (TY == QT_Q5_0 || TY == QT_Q5_1 || TY == QT_Q3_K || TY == QT_Q6_K) {
#pragma unroll
        for (int k = 0; k < 8; k++) q[k] = pack4(v + 4 * k);
    }
}

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
                    w[8 * i + 2 * k] = w16_to_f<TY>(lo);
                    w[8 * i + 2 * k + 1] = w16_to_f<TY>(hi);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) {
                unsigned short u = c * 32 + i < n ? r[i] : 0;
                w[i] = w16_to_f<TY>(u);
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
    } else if (TY == QT_Q3_K || TY == QT_Q6_K) {   /* small integers times two scales: dq32i's */
        int q[8];
        float d0, d1, m;
        dq32i<TY>(row, c, n, q, d0, d1, m);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = (l < 16 ? d0 : d1) * (float)(int8_t)(q[l >> 2] >> (8 * (l & 3)));
    } else if (TY == QT_Q4_K) {
        const uint8_t *b = row + (c >> 3) * 144;
        int g, hi;
        float d1, m1;
        k4_sub(b, c, g, hi, d1, m1);
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
        int g, hi;
        float d1, m1;
        k4_sub(b, c, g, hi, d1, m1);
        const uint8_t *qh = b + 16, *ql = b + 48 + 32 * g;
        int bit = 2 * g + hi;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int v = (hi ? ql[l] >> 4 : ql[l] & 0xF) + (((qh[l] >> bit) & 1) << 4);
            w[l] = d1 * (float)v - m1;
        }
    }
}
