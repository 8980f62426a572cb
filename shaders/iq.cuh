// iq.cuh — device decoders of the i-quants (iq2_xxs, iq2_xs, iq2_s,
// iq3_xxs, iq3_s, iq1_s), iq4_nl, iq4_xs and mxfp4: 8 values at a time with
// the reference dequantizer's expressions (engine/quant/iq.c), rounded step
// by step (no contraction), so they equal the CPU's bit for bit. Blocks are
// read bytewise: mxfp4 blocks (17 bytes) have no alignment.
#pragma once

#include "shaders/common.cuh"

#define QT_TAB static const __device__
#include "engine/quant/iq_tables.h"
#undef QT_TAB

/* 1 for the types decoded here */
__host__ __device__ constexpr bool iq_type(int ty)
{
    return ty == QT_IQ2_XXS || ty == QT_IQ2_XS || ty == QT_IQ2_S || ty == QT_IQ3_XXS || ty == QT_IQ3_S ||
           ty == QT_IQ1_S || ty == QT_IQ4_NL || ty == QT_IQ4_XS || ty == QT_MXFP4;
}

/* values per block and bytes per block */
__host__ __device__ constexpr int iq_blck(int ty) { return ty == QT_IQ4_NL || ty == QT_MXFP4 ? 32 : 256; }
__host__ __device__ constexpr int iq_bsize(int ty)
{
    return ty == QT_IQ2_XXS ? 66 : ty == QT_IQ2_XS ? 74 : ty == QT_IQ2_S ? 82 : ty == QT_IQ3_XXS ? 98
         : ty == QT_IQ3_S ? 110 : ty == QT_IQ1_S ? 50 : ty == QT_IQ4_NL ? 18 : ty == QT_IQ4_XS ? 136 : 17;
}

__device__ __forceinline__ uint32_t iq_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

__device__ __forceinline__ float iq_e8m0_half(int e)
{
    return __uint_as_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* The 16 levels (signed bytes) of iq4_nl/iq4_xs and of mxfp4, as 4 words */
#define IQ_NL_TAB 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u
#define IQ_FP4_TAB 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu

/* 4 nibble indices (one per byte of idx) -> their 4 levels: two byte
 * permutes (levels 0-7, 8-15) and a per-byte choice by the index's bit 3 */
__device__ __forceinline__ uint32_t iq_lookup4(uint32_t idx, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3)
{
    const uint32_t sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
    const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const uint32_t m = ((idx >> 3) & 0x01010101u) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

/* 8 values of 16 packed nibbles qs (32 values: low nibbles, then high)
 * through the level table, times d: group l = 0..3 */
template <int FP4>
__device__ __forceinline__ void iq_nl8(const uint8_t *qs, int l, float d, float w[8])
{
    const int sh = l >= 2 ? 4 : 0, o = 8 * (l & 1);
    const uint32_t a0 = (iq_u32(qs + o) >> sh) & 0x0F0F0F0Fu, a1 = (iq_u32(qs + o + 4) >> sh) & 0x0F0F0F0Fu;
    const uint32_t v0 = FP4 ? iq_lookup4(a0, IQ_FP4_TAB) : iq_lookup4(a0, IQ_NL_TAB);
    const uint32_t v1 = FP4 ? iq_lookup4(a1, IQ_FP4_TAB) : iq_lookup4(a1, IQ_NL_TAB);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        w[j] = __fmul_rn(d, (float)(int8_t)(v0 >> (8 * j)));
        w[4 + j] = __fmul_rn(d, (float)(int8_t)(v1 >> (8 * j)));
    }
}

/* Values 8l .. 8l+7 of block b of type TY (l < iq_blck(TY) / 8). */
template <int TY>
__device__ __forceinline__ void iq_dq8(const uint8_t *b, int l, float w[8])
{
    if (TY == QT_IQ4_NL) {
        iq_nl8<0>(b + 2, l, h2f(b), w);
    } else if (TY == QT_MXFP4) {
        iq_nl8<1>(b + 1, l, iq_e8m0_half(b[0]), w);
    } else if (TY == QT_IQ4_XS) {
        const int ib = l >> 2;
        const int ls = ((b[4 + ib / 2] >> (4 * (ib & 1))) & 0xf) | ((((b[2] | (b[3] << 8)) >> (2 * ib)) & 3) << 4);
        iq_nl8<0>(b + 8 + 16 * ib, l & 3, __fmul_rn(h2f(b), (float)(ls - 32)), w);
    } else if (TY == QT_IQ1_S) {
        const int ib = l >> 2, k = l & 3;
        const unsigned qh = b[34 + 2 * ib] | (b[35 + 2 * ib] << 8);
        const int8_t *g = (const int8_t *)(qt_iq1s_grid + (b[2 + l] | (((qh >> (3 * k)) & 7) << 8)));
        const float dl = __fmul_rn(h2f(b), (float)(2 * ((qh >> 12) & 7) + 1));
        const float delta = qh & 0x8000 ? -0.125f : 0.125f;
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __fmul_rn(dl, __fadd_rn((float)g[j], delta));
    } else {
        const int ib = l >> 2, k = l & 3;
        uint8_t mag[8];
        int sgn, ls;
        if (TY == QT_IQ2_XXS) {
            const uint32_t a0 = iq_u32(b + 2 + 8 * ib), a1 = iq_u32(b + 6 + 8 * ib);
            const uint64_t gv = qt_iq2xxs_grid[(a0 >> (8 * k)) & 255];
#pragma unroll
            for (int j = 0; j < 8; j++) mag[j] = (uint8_t)(gv >> (8 * j));
            sgn = qt_ksigns[(a1 >> (7 * k)) & 127];
            ls = (int)(a1 >> 28);
        } else if (TY == QT_IQ2_XS) {
            const int q = b[2 + 2 * l] | (b[3 + 2 * l] << 8);
            const uint64_t gv = qt_iq2xs_grid[q & 511];
#pragma unroll
            for (int j = 0; j < 8; j++) mag[j] = (uint8_t)(gv >> (8 * j));
            sgn = qt_ksigns[q >> 9];
            ls = (b[66 + ib] >> (4 * (k / 2))) & 15;
        } else if (TY == QT_IQ2_S) {
            const uint64_t gv = qt_iq2s_grid[b[2 + l] | ((b[66 + ib] << (8 - 2 * k)) & 0x300)];
#pragma unroll
            for (int j = 0; j < 8; j++) mag[j] = (uint8_t)(gv >> (8 * j));
            sgn = b[34 + l];
            ls = (b[74 + ib] >> (4 * (k / 2))) & 15;
        } else if (TY == QT_IQ3_XXS) {
            const uint32_t aux = iq_u32(b + 66 + 4 * ib);
            const uint32_t g1 = qt_iq3xxs_grid[b[2 + 8 * ib + 2 * k]], g2 = qt_iq3xxs_grid[b[3 + 8 * ib + 2 * k]];
#pragma unroll
            for (int j = 0; j < 4; j++) { mag[j] = (uint8_t)(g1 >> (8 * j)); mag[4 + j] = (uint8_t)(g2 >> (8 * j)); }
            sgn = qt_ksigns[(aux >> (7 * k)) & 127];
            ls = (int)(aux >> 28);
        } else {   /* QT_IQ3_S: d, qs[64], qh[8], signs[32], scales[4] */
            const uint8_t *qs = b + 2 + 8 * ib;
            const int qh = b[66 + ib];
            const uint32_t g1 = qt_iq3s_grid[qs[2 * k] | ((qh << (8 - 2 * k)) & 256)];
            const uint32_t g2 = qt_iq3s_grid[qs[2 * k + 1] | ((qh << (7 - 2 * k)) & 256)];
#pragma unroll
            for (int j = 0; j < 4; j++) { mag[j] = (uint8_t)(g1 >> (8 * j)); mag[4 + j] = (uint8_t)(g2 >> (8 * j)); }
            sgn = b[74 + 4 * ib + k];
            ls = (b[106 + ib / 2] >> (4 * (ib & 1))) & 15;
        }
        const float d = h2f(b);
        float db;
        if (TY == QT_IQ3_S) db = __fmul_rn(d, (float)(1 + 2 * ls));
        else db = __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)ls)), TY == QT_IQ3_XXS ? 0.5f : 0.25f);
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __fmul_rn(__fmul_rn(db, (float)mag[j]), (sgn >> j) & 1 ? -1.f : 1.f);
    }
}
