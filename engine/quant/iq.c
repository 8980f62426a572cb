/* iq.c — the i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S),
 * IQ4_NL, IQ4_XS and MXFP4: reference dequantizers and the integer form of
 * a super-block that the dot products use (qt_iq_unpack).
 *
 * The dequantizers evaluate gguf-py's float32 expressions in its order
 * (tests/fixtures/refs/dequant2.json and dequant_iq.json hold its results),
 * so they match bit for bit; no floating-point contraction here. */
#include "engine/quant/iq.h"

#include "engine/quant/iq_tables.h"

#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static inline float h2f(uint16_t h) { return qt_fp16_to_fp32(h); }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float qt_e8m0_half(uint8_t e)
{
    /* 2^(e-128): e = 0, 1 are subnormal */
    return u2f(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

const int8_t *qt_iq4nl_values(void) { return qt_kvalues_iq4nl; }
const int8_t *qt_mxfp4_values(void) { return qt_kvalues_mxfp4; }

/* ---- per super-block decoding shared by dequantization and unpacking:
 * for each group of 8 values, the grid bytes (unsigned magnitudes, or
 * signed -1/0/1 for iq1_s) and a sign byte (bit j: value j negative) ---- */

static inline const uint8_t *g8(uint64_t const *grid, unsigned i) { return (const uint8_t *)(grid + i); }

/* iq2_xxs/iq2_xs/iq2_s/iq3_xxs/iq3_s: 8 magnitudes and signs of group l
 * (0..31) and the 4-bit scale field ls of its 16 values. */
static void iq_group(uint32_t type, const uint8_t *b, int l, uint8_t mag[8], uint8_t *sgn, int *ls)
{
    const int ib = l / 4, k = l % 4;
    switch (type) {
    case QT_IQ2_XXS: {
        uint32_t aux[2];
        memcpy(aux, b + 2 + 8 * ib, 8);
        memcpy(mag, g8(qt_iq2xxs_grid, ((const uint8_t *)aux)[k]), 8);
        *sgn = qt_ksigns[(aux[1] >> (7 * k)) & 127];
        *ls = (int)(aux[1] >> 28);
        break;
    }
    case QT_IQ2_XS: {
        const qt_block_iq2_xs *x = (const void *)b;
        uint16_t q;
        memcpy(&q, b + 2 + 2 * l, 2);
        memcpy(mag, g8(qt_iq2xs_grid, q & 511), 8);
        *sgn = qt_ksigns[q >> 9];
        *ls = (x->scales[ib] >> (4 * (k / 2))) & 15;
        break;
    }
    case QT_IQ2_S: {
        const qt_block_iq2_s *x = (const void *)b;
        memcpy(mag, g8(qt_iq2s_grid, x->qs[l] | ((x->qh[ib] << (8 - 2 * k)) & 0x300)), 8);
        *sgn = x->qs[32 + l];
        *ls = (x->scales[ib] >> (4 * (k / 2))) & 15;
        break;
    }
    case QT_IQ3_XXS: {
        const qt_block_iq3_xxs *x = (const void *)b;
        uint32_t aux;
        memcpy(&aux, x->qs + 64 + 4 * ib, 4);
        const uint32_t g1 = qt_iq3xxs_grid[x->qs[8 * ib + 2 * k]], g2 = qt_iq3xxs_grid[x->qs[8 * ib + 2 * k + 1]];
        memcpy(mag, &g1, 4);
        memcpy(mag + 4, &g2, 4);
        *sgn = qt_ksigns[(aux >> (7 * k)) & 127];
        *ls = (int)(aux >> 28);
        break;
    }
    default: { /* QT_IQ3_S */
        const qt_block_iq3_s *x = (const void *)b;
        const uint8_t *qs = x->qs + 8 * ib;
        const int qh = x->qh[ib];
        const uint32_t g1 = qt_iq3s_grid[qs[2 * k] | ((qh << (8 - 2 * k)) & 256)];
        const uint32_t g2 = qt_iq3s_grid[qs[2 * k + 1] | ((qh << (7 - 2 * k)) & 256)];
        memcpy(mag, &g1, 4);
        memcpy(mag + 4, &g2, 4);
        *sgn = x->signs[4 * ib + k];
        *ls = (x->scales[ib / 2] >> (4 * (ib % 2))) & 15;
        break;
    }
    }
}

static inline int iq4xs_ls(const qt_block_iq4_xs *x, int ib)
{
    return ((x->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((x->scales_h >> (2 * ib)) & 3) << 4);
}

/* iq1_s group l: signed grid values, and of its 32: scale field, delta sign */
static void iq1s_group(const qt_block_iq1_s *x, int l, int8_t v[8], int *ls, int *neg)
{
    const int ib = l / 4, k = l % 4;
    const unsigned qh = x->qh[ib];
    memcpy(v, g8(qt_iq1s_grid, x->qs[l] | (((qh >> (3 * k)) & 7) << 8)), 8);
    *ls = (int)((qh >> 12) & 7);
    *neg = (qh & 0x8000) != 0;
}

/* ---- reference dequantizers ---- */

/* y[0..32) = d * kv[nibble]: the low nibbles of qs[0..16), then the high */
static inline void deq_nibbles(const int8_t *kv, const uint8_t *qs, float d, float *y)
{
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)kv[qs[j] & 15];
        y[j + 16] = d * (float)kv[qs[j] >> 4];
    }
}

void qt_iq_dequant(uint32_t type, const void *src, float *y, int64_t nb)
{
    const uint8_t *base = src;
    switch (type) {
    case QT_IQ4_NL: case QT_MXFP4: {   /* a scale (f16; mxfp4: e8m0), then 16 bytes of nibbles */
        const int mx = type == QT_MXFP4;
        const size_t bs = qt_get(type)->type_size;
        for (int64_t i = 0; i < nb; i++, y += 32) {
            const uint8_t *b = base + i * bs;
            uint16_t hd;
            memcpy(&hd, b, 2);
            deq_nibbles(mx ? qt_kvalues_mxfp4 : qt_kvalues_iq4nl, b + (mx ? 1 : 2),
                        mx ? qt_e8m0_half(b[0]) : h2f(hd), y);
        }
        return;
    }
    case QT_IQ4_XS:
        for (int64_t i = 0; i < nb; i++) {
            const qt_block_iq4_xs *x = (const void *)(base + i * sizeof *x);
            const float d = h2f(x->d);
            for (int ib = 0; ib < 8; ib++, y += 32)
                deq_nibbles(qt_kvalues_iq4nl, x->qs + 16 * ib, d * (float)(iq4xs_ls(x, ib) - 32), y);
        }
        return;
    case QT_IQ1_S:
        for (int64_t i = 0; i < nb; i++) {
            const qt_block_iq1_s *x = (const void *)(base + i * sizeof *x);
            const float d = h2f(x->d);
            for (int l = 0; l < 32; l++, y += 8) {
                int8_t v[8];
                int ls, neg;
                iq1s_group(x, l, v, &ls, &neg);
                const float dl = d * (float)(2 * ls + 1), delta = neg ? -0.125f : 0.125f;
                for (int j = 0; j < 8; j++) y[j] = dl * ((float)v[j] + delta);
            }
        }
        return;
    default: { /* iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s */
        const size_t bs = qt_get(type)->type_size;
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *b = base + i * bs;
            uint16_t hd;
            memcpy(&hd, b, 2);
            const float d = h2f(hd);
            for (int l = 0; l < 32; l++, y += 8) {
                uint8_t mag[8], sgn;
                int ls;
                iq_group(type, b, l, mag, &sgn, &ls);
                float db;
                if (type == QT_IQ3_S) db = d * (float)(1 + 2 * ls);
                else if (type == QT_IQ3_XXS) db = d * (0.5f + (float)ls) * 0.5f;
                else db = d * (0.5f + (float)ls) * 0.25f;
                for (int j = 0; j < 8; j++) y[j] = db * (float)mag[j] * ((sgn >> j) & 1 ? -1.f : 1.f);
            }
        }
        return;
    }
    }
}

/* ---- integer form for the dot products ---- */

void qt_iq_unpack(uint32_t type, const void *bv, int8_t q[256], int16_t s[16], int8_t g[8], float *fd)
{
    const uint8_t *b = bv;
    uint16_t hd;
    memcpy(&hd, b, 2);
    const float d = h2f(hd);
    memset(g, 0, 8);
    switch (type) {
    case QT_IQ4_XS: {
        const qt_block_iq4_xs *x = bv;
        for (int ib = 0; ib < 8; ib++) {
            s[2 * ib] = s[2 * ib + 1] = (int16_t)(iq4xs_ls(x, ib) - 32);
            for (int j = 0; j < 16; j++) {
                q[32 * ib + j] = qt_kvalues_iq4nl[x->qs[16 * ib + j] & 15];
                q[32 * ib + j + 16] = qt_kvalues_iq4nl[x->qs[16 * ib + j] >> 4];
            }
        }
        *fd = d;
        return;
    }
    case QT_IQ1_S:
        for (int l = 0; l < 32; l++) {
            int ls, neg;
            iq1s_group(bv, l, q + 8 * l, &ls, &neg);
            s[l / 2] = (int16_t)(2 * ls + 1);
            g[l / 4] = (int8_t)(neg ? -1 : 1);
        }
        *fd = d;
        return;
    default:
        /* 8 values at a time as one word: magnitudes (all >= 1) with the
         * bytes of set sign bits negated, (g ^ m) + (m & 1s), no carries */
        for (int l = 0; l < 32; l++) {
            uint64_t g8v;
            unsigned sgn;
            int ls;
            const int ib = l / 4, k = l % 4;
            switch (type) {
            case QT_IQ2_XXS: {
                uint32_t aux[2];
                memcpy(aux, b + 2 + 8 * ib, 8);
                g8v = qt_iq2xxs_grid[(aux[0] >> (8 * k)) & 255];
                sgn = qt_ksigns[(aux[1] >> (7 * k)) & 127];
                ls = (int)(aux[1] >> 28);
                break;
            }
            case QT_IQ2_XS: {
                uint16_t q16;
                memcpy(&q16, b + 2 + 2 * l, 2);
                g8v = qt_iq2xs_grid[q16 & 511];
                sgn = qt_ksigns[q16 >> 9];
                ls = (b[66 + ib] >> (4 * (k / 2))) & 15;
                break;
            }
            case QT_IQ2_S:
                g8v = qt_iq2s_grid[b[2 + l] | ((b[66 + ib] << (8 - 2 * k)) & 0x300)];
                sgn = b[34 + l];
                ls = (b[74 + ib] >> (4 * (k / 2))) & 15;
                break;
            case QT_IQ3_XXS: {
                uint32_t aux;
                memcpy(&aux, b + 66 + 4 * ib, 4);
                g8v = qt_iq3xxs_grid[b[2 + 8 * ib + 2 * k]] | (uint64_t)qt_iq3xxs_grid[b[3 + 8 * ib + 2 * k]] << 32;
                sgn = qt_ksigns[(aux >> (7 * k)) & 127];
                ls = (int)(aux >> 28);
                break;
            }
            default: { /* QT_IQ3_S */
                const uint8_t *qs = b + 2 + 8 * ib;
                const int qh = b[66 + ib];
                g8v = qt_iq3s_grid[qs[2 * k] | ((qh << (8 - 2 * k)) & 256)] |
                      (uint64_t)qt_iq3s_grid[qs[2 * k + 1] | ((qh << (7 - 2 * k)) & 256)] << 32;
                sgn = b[74 + 4 * ib + k];
                ls = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
                break;
            }
            }
            const uint64_t ones = 0x0101010101010101ull, hi = 0x8080808080808080ull;
            const uint64_t bits = ((uint64_t)sgn * ones) & 0x8040201008040201ull;   /* byte j: bit j of sgn */
            const uint64_t nz = (((bits & ~hi) + ~hi) | bits) & hi;               /* 0x80 where nonzero */
            const uint64_t m = (nz >> 7) * 0xFF;
            const uint64_t v = (g8v ^ m) + (m & ones);
            memcpy(q + 8 * l, &v, 8);
            s[l / 2] = (int16_t)(type == QT_IQ3_S ? 1 + 2 * ls : 2 * ls + 1);
        }
        /* iq2: d (0.5 + ls) / 4 = d/8 (2 ls + 1); iq3_xxs: d/4 (2 ls + 1); iq3_s: d (1 + 2 ls) */
        *fd = type == QT_IQ3_S ? d : type == QT_IQ3_XXS ? d * 0.25f : d * 0.125f;
        return;
    }
}

float qt_iq_dot_ref(uint32_t type, int64_t n, const void *w, const void *a)
{
    const size_t bs = qt_get(type)->type_size;
    const qt_block_q8_K *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / 256; i++) {
        int8_t q[256], g[8];
        int16_t s[16];
        float fd;
        qt_iq_unpack(type, (const uint8_t *)w + i * bs, q, s, g, &fd);
        int32_t isum = 0, msum = 0;
        for (int k = 0; k < 16; k++) {
            int32_t dk = 0;
            for (int l = 0; l < 16; l++) dk += q[16 * k + l] * y[i].qs[16 * k + l];
            isum += s[k] * dk;
        }
        for (int j = 0; j < 8; j++) msum += g[j] * s[2 * j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        sum += (fd * y[i].d) * ((float)isum + 0.125f * (float)msum);
    }
    return sum;
}
