/* neon.c — aarch64 gemm kernels (NEON + dot product, ARMv8.2 SDOT).
 * Compiled only on aarch64 (elsewhere this file is empty); qt_gemm calls in
 * only when the CPU reports asimddp. Same arithmetic contract as the x86
 * kernels: small blocks get exact int32 totals per block and then the
 * reference's float expression in block order (bit-identical); K-quants reduce to exact int32 totals per super-block and evaluate the
 * same float expression as qt_vec_dot_ref (bit-identical); float weights
 * accumulate in 16 float lanes. */
#include "engine/quant/qtypes.h"

#include "engine/quant/iq.h"

#if defined(__aarch64__)
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#include <arm_neon.h>
#include <string.h>

#define N_AI static inline __attribute__((always_inline))

/* SDOT. clang 14 declares vdotq_s32 only when the whole file targets
 * dotprod, so there it is spelled in assembly. */
#if defined(__clang__)
N_AI int32x4_t n_sdot(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    __asm__(".arch armv8.2-a+dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
}
#else
#define n_sdot vdotq_s32
#endif

N_AI float n_h2f(const void *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return qt_fp16_to_fp32(h);
}

/* ---- small blocks ---- */

/* 32 values of a small block as int8 (signed types) or uint8-in-int8. */
N_AI void n_unpack_small(uint32_t type, const uint8_t *b, int8x16_t *lo, int8x16_t *hi)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    switch (type) {
    case QT_IQ4_NL: case QT_MXFP4: {   /* nibbles through the 16-level table */
        const int8x16_t tab = vld1q_s8(type == QT_MXFP4 ? qt_mxfp4_values() : qt_iq4nl_values());
        const uint8x16_t v = vld1q_u8(b + (type == QT_MXFP4 ? 1 : 2));
        *lo = vqtbl1q_s8(tab, vandq_u8(v, m4));
        *hi = vqtbl1q_s8(tab, vshrq_n_u8(v, 4));
        return;
    }
    case QT_Q8_0:
        *lo = vld1q_s8((const int8_t *)(b + 2));
        *hi = vld1q_s8((const int8_t *)(b + 18));
        return;
    case QT_Q4_0: case QT_Q4_1: {
        const uint8x16_t v = vld1q_u8(b + (type == QT_Q4_0 ? 2 : 4));
        int8x16_t l = vreinterpretq_s8_u8(vandq_u8(v, m4)), h = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        if (type == QT_Q4_0) { l = vsubq_s8(l, vdupq_n_s8(8)); h = vsubq_s8(h, vdupq_n_s8(8)); }
        *lo = l; *hi = h;
        return;
    }
    default: { /* q5_0, q5_1 */
        const uint8_t *qhp = b + (type == QT_Q5_0 ? 2 : 4);
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        const uint8x16_t v = vld1q_u8(qhp + 4);
        /* bit j of qh -> 0x10 in byte j */
        static const uint8_t bitsel[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
        const uint8x16_t sel = vld1q_u8(bitsel);
        const uint8x16_t b01 = vcombine_u8(vdup_n_u8((uint8_t)qh), vdup_n_u8((uint8_t)(qh >> 8)));
        const uint8x16_t b23 = vcombine_u8(vdup_n_u8((uint8_t)(qh >> 16)), vdup_n_u8((uint8_t)(qh >> 24)));
        const uint8x16_t h0 = vandq_u8(vtstq_u8(b01, sel), vdupq_n_u8(0x10));
        const uint8x16_t h1 = vandq_u8(vtstq_u8(b23, sel), vdupq_n_u8(0x10));
        int8x16_t l = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, m4), h0));
        int8x16_t h = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), h1));
        if (type == QT_Q5_0) { l = vsubq_s8(l, vdupq_n_s8(16)); h = vsubq_s8(h, vdupq_n_s8(16)); }
        *lo = l; *hi = h;
        return;
    }
    }
}

/* Lanes are activation rows (4 at a time). Per block each lane gets the
 * exact int32 dot (SDOT partial sums added pairwise, exact in int32), then
 * the reference's float expression, in block order and unfused:
 *   sum = sum + (float)isum * (d * da)                (q4_0, q5_0, q8_0)
 *   sum = sum + ((d * da) * (float)isum + m * s)      (q4_1, q5_1)
 * so results equal qt_vec_dot_ref bit for bit whatever nb or the row range. */
N_AI void n_small(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                  const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    const size_t bs = qt_get(type)->type_size;
    const int64_t nblk = n / 32;
    const int q81 = type == QT_Q4_1 || type == QT_Q5_1;
    const size_t abs_ = q81 ? 36 : 34, aoff = q81 ? 4 : 2;
    static const int8_t zero16[16];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = W + r * ws;
        for (int b0 = 0; b0 < nb; b0 += 4) {
            const int g = nb - b0 < 4 ? nb - b0 : 4;
            /* missing activation rows of the last group read a zero block */
            const uint8_t *arow[4];
            for (int k = 0; k < 4; k++) arow[k] = k < g ? A + (size_t)(b0 + k) * as : NULL;
            float32x4_t acc = vdupq_n_f32(0);
            for (int64_t i = 0; i < nblk; i++) {
                const uint8_t *wb = wr + i * bs;
                __builtin_prefetch(wb + 1024);
                int8x16_t w0, w1;
                n_unpack_small(type, wb, &w0, &w1);
                const float d = type == QT_MXFP4 ? qt_e8m0_half(wb[0]) : n_h2f(wb);
                int32x4_t p[4];
                float da[4] = { 0, 0, 0, 0 }, sa[4] = { 0, 0, 0, 0 };
                for (int k = 0; k < 4; k++) {
                    const int8_t *q = arow[k] ? (const int8_t *)(arow[k] + i * abs_ + aoff) : zero16;
                    p[k] = n_sdot(vdupq_n_s32(0), w0, vld1q_s8(q));
                    p[k] = n_sdot(p[k], w1, vld1q_s8(arow[k] ? q + 16 : zero16));
                    if (arow[k]) {
                        da[k] = n_h2f(arow[k] + i * abs_);
                        if (q81) sa[k] = n_h2f(arow[k] + i * abs_ + 2);
                    }
                }
                const int32x4_t isum = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
                const float32x4_t fi = vcvtq_f32_s32(isum);
                const float32x4_t sc = vmulq_f32(vdupq_n_f32(d), vld1q_f32(da));
                if (q81)
                    acc = vaddq_f32(acc, vaddq_f32(vmulq_f32(sc, fi),
                                                   vmulq_f32(vdupq_n_f32(n_h2f(wb + 2)), vld1q_f32(sa))));
                else
                    acc = vaddq_f32(acc, vmulq_f32(fi, sc));
            }
            float out[4];
            vst1q_f32(out, acc);
            for (int k = 0; k < g; k++) Y[(b0 + k) * ldy + r] = out[k];
        }
    }
}

/* ---- K-quants ---- */

N_AI void n_scale_min_k4(int j, const uint8_t *q, int16_t *d, int16_t *m)
{
    if (j < 4) {
        *d = q[j] & 63; *m = q[j + 4] & 63;
    } else {
        *d = (int16_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (int16_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Super-block -> unsigned values q[256], per-16 scales s and offset
 * coefficients m, float factors (see unpack_k in qtypes.c). */
N_AI void n_unpack_k(uint32_t type, const uint8_t *b, uint8_t *q, int16_t *s, int16_t *m,
                     float *fd, float *fm)
{
    const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1);
    switch (type) {
    case QT_Q2_K: {
        const qt_block_q2_K *x = (const void *)b;
        for (int k = 0; k < 16; k++) { s[k] = x->scales[k] & 15; m[k] = x->scales[k] >> 4; }
        *fd = n_h2f(&x->d); *fm = n_h2f(&x->dmin);
        for (int h = 0; h < 2; h++)
            for (int hf = 0; hf < 2; hf++) {
                const uint8x16_t v = vld1q_u8(x->qs + 32 * h + 16 * hf);
                for (int j = 0; j < 4; j++)
                    vst1q_u8(q + 32 * (4 * h + j) + 16 * hf,
                             vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)(-2 * j))), m3));
            }
        break;
    }
    case QT_Q3_K: {
        const qt_block_q3_K *x = (const void *)b;
        const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
        uint32_t aux[4];
        memcpy(aux, x->scales, 12);
        const uint32_t tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
        aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
        aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
        aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
        int8_t sc[16];
        memcpy(sc, aux, 16);
        for (int k = 0; k < 16; k++) { s[k] = (int16_t)(sc[k] - 32); m[k] = (int16_t)(4 * s[k]); }
        *fd = *fm = n_h2f(&x->d);
        for (int hf = 0; hf < 2; hf++) {
            const uint8x16_t hm = vld1q_u8(x->hmask + 16 * hf);
            for (int h = 0; h < 2; h++) {
                const uint8x16_t v = vld1q_u8(x->qs + 32 * h + 16 * hf);
                for (int j = 0; j < 4; j++) {
                    const int c = 4 * h + j;
                    const uint8x16_t lo = vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)(-2 * j))), m3);
                    const uint8x16_t hi = vshlq_n_u8(vandq_u8(vshlq_u8(hm, vdupq_n_s8((int8_t)-c)), one), 2);
                    vst1q_u8(q + 32 * c + 16 * hf, vorrq_u8(lo, hi));
                }
            }
        }
        break;
    }
    case QT_Q4_K: case QT_Q5_K: {
        for (int j = 0; j < 8; j++) {
            int16_t sc, mn;
            n_scale_min_k4(j, b + 4, &sc, &mn);
            s[2 * j] = s[2 * j + 1] = sc;
            m[2 * j] = m[2 * j + 1] = mn;
        }
        *fd = n_h2f(b); *fm = n_h2f(b + 2);
        const uint8_t *qs = b + (type == QT_Q4_K ? 16 : 48);
        for (int hf = 0; hf < 2; hf++) {
            const uint8x16_t qh = type == QT_Q5_K ? vld1q_u8(b + 16 + 16 * hf) : vdupq_n_u8(0);
            for (int j = 0; j < 4; j++) {
                const uint8x16_t v = vld1q_u8(qs + 32 * j + 16 * hf);
                uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);
                if (type == QT_Q5_K) {
                    lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(-2 * j))), one), 4));
                    hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(-2 * j - 1))), one), 4));
                }
                vst1q_u8(q + 64 * j + 16 * hf, lo);
                vst1q_u8(q + 64 * j + 32 + 16 * hf, hi);
            }
        }
        break;
    }
    default: { /* QT_Q6_K */
        const qt_block_q6_K *x = (const void *)b;
        for (int k = 0; k < 16; k++) { s[k] = x->scales[k]; m[k] = (int16_t)(32 * s[k]); }
        *fd = *fm = n_h2f(&x->d);
        const uint8x16_t m30 = vdupq_n_u8(0x30);
        for (int h = 0; h < 2; h++)
            for (int hf = 0; hf < 2; hf++) {
                const uint8x16_t l0 = vld1q_u8(x->ql + 64 * h + 16 * hf);
                const uint8x16_t l1 = vld1q_u8(x->ql + 64 * h + 32 + 16 * hf);
                const uint8x16_t hh = vld1q_u8(x->qh + 32 * h + 16 * hf);
                uint8_t *o = q + 128 * h + 16 * hf;
                vst1q_u8(o + 0, vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hh, 4), m30)));
                vst1q_u8(o + 32, vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(hh, 2), m30)));
                vst1q_u8(o + 64, vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(hh, m30)));
                vst1q_u8(o + 96, vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hh, 2), m30)));
            }
        break;
    }
    }
}

/* ---- K-quants, i-quants and iq4_xs (q8_K activations) ----
 * A super-block unpacked once per (weight row, group of up to 16 activation
 * rows) to bytes and per-16 scales (K-quants by n_unpack_k, with per-16
 * mins; iq4_xs by table lookups; the grid types by qt_iq_unpack), SDOT per
 * 16 values times the scale into exact int32 totals, then the reference's
 * float expression (qt_dot_k_ref's, qt_iq_dot_ref's: bit-identical). */
N_AI void n_k256(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1, const uint8_t *A,
                 size_t as, int nb, float *Y, int64_t ldy)
{
    const size_t bs = qt_get(type)->type_size;
    const int64_t nsb = n / 256;
    const int kq = type == QT_Q2_K || type == QT_Q3_K || type == QT_Q4_K || type == QT_Q5_K || type == QT_Q6_K;
    int8_t q[256] __attribute__((aligned(16))), gs[8];
    int16_t s[16], m[16] = { 0 };
    float fd, fm = 0, sums[16];
    const int8x16_t tab = vld1q_s8(qt_iq4nl_values());
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = W + r * ws;
        for (int b0 = 0; b0 < nb; b0 += 16) {
            const int g = nb - b0 < 16 ? nb - b0 : 16;
            for (int k = 0; k < g; k++) sums[k] = 0;
            for (int64_t i = 0; i < nsb; i++) {
                const uint8_t *wb = wr + i * bs;
                for (size_t o = 0; o < bs; o += 64) __builtin_prefetch(wb + 1024 + o);
                if (kq) {
                    n_unpack_k(type, wb, (uint8_t *)q, s, m, &fd, &fm);
                } else if (type == QT_IQ4_XS) {
                    const qt_block_iq4_xs *x = (const void *)wb;
                    for (int c = 0; c < 8; c++) {
                        const uint8x16_t v = vld1q_u8(x->qs + 16 * c);
                        vst1q_s8(q + 32 * c, vqtbl1q_s8(tab, vandq_u8(v, vdupq_n_u8(15))));
                        vst1q_s8(q + 32 * c + 16, vqtbl1q_s8(tab, vshrq_n_u8(v, 4)));
                        const int ls = ((x->scales_l[c / 2] >> (4 * (c % 2))) & 0xf) | (((x->scales_h >> (2 * c)) & 3) << 4);
                        s[2 * c] = s[2 * c + 1] = (int16_t)(ls - 32);
                    }
                    memset(gs, 0, sizeof gs);
                    fd = n_h2f(wb);
                } else {
                    qt_iq_unpack(type, wb, q, s, gs, &fd);
                }
                const int16x8_t m0 = vld1q_s16(m), m1 = vld1q_s16(m + 8);
                for (int k = 0; k < g; k++) {
                    const qt_block_q8_K *a = (const void *)(A + (size_t)(b0 + k) * as + i * sizeof(qt_block_q8_K));
                    int32x4_t acc = vdupq_n_s32(0);
                    for (int c = 0; c < 16; c++)
                        acc = vmlaq_n_s32(acc, n_sdot(vdupq_n_s32(0), vld1q_s8(q + 16 * c), vld1q_s8(a->qs + 16 * c)), s[c]);
                    const int32_t isum = vaddvq_s32(acc);
                    if (kq) {   /* the mins against the activations' 16-value sums */
                        const int16x8_t bs0 = vld1q_s16(a->bsums), bs1 = vld1q_s16(a->bsums + 8);
                        int32x4_t ma = vmull_s16(vget_low_s16(m0), vget_low_s16(bs0));
                        ma = vmlal_s16(ma, vget_high_s16(m0), vget_high_s16(bs0));
                        ma = vmlal_s16(ma, vget_low_s16(m1), vget_low_s16(bs1));
                        ma = vmlal_s16(ma, vget_high_s16(m1), vget_high_s16(bs1));
                        sums[k] += a->d * (fd * (float)isum - fm * (float)vaddvq_s32(ma));
                    } else {
                        int32_t msum = 0;
                        if (type == QT_IQ1_S)
                            for (int j = 0; j < 8; j++) msum += gs[j] * s[2 * j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
                        sums[k] = sums[k] + (fd * a->d) * ((float)isum + 0.125f * (float)msum);
                    }
                }
            }
            for (int k = 0; k < g; k++) Y[(b0 + k) * ldy + r] = sums[k];
        }
    }
}

/* the families' names for the dispatch (QT_GE_FAM) */
N_AI void n_kquant(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                   const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    n_k256(type, n, W, ws, r0, r1, A, as, nb, Y, ldy);
}

N_AI void n_iqk(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    n_k256(type, n, W, ws, r0, r1, A, as, nb, Y, ldy);
}

/* ---- float weights ---- */

N_AI float32x4_t n_load4(uint32_t type, const uint8_t *w, int64_t i)
{
    if (type == QT_F32) return vld1q_f32((const float *)(const void *)(w + 4 * i));
    const uint16x4_t h = vld1_u16((const uint16_t *)(const void *)(w + 2 * i));
    if (type == QT_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

N_AI float n_load1(uint32_t type, const uint8_t *w, int64_t i)
{
    if (type == QT_F32) { float f; memcpy(&f, w + 4 * i, 4); return f; }
    uint16_t h;
    memcpy(&h, w + 2 * i, 2);
    return type == QT_F16 ? qt_fp16_to_fp32(h) : qt_bf16_to_fp32(h);
}

N_AI void n_float(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                  const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = W + r * ws;
        for (int b = 0; b < nb; b++) {
            const float *x = (const float *)(const void *)(A + (size_t)b * as);
            float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
            int64_t i = 0;
            for (; i + 16 <= n; i += 16) {
                a0 = vfmaq_f32(a0, n_load4(type, wr, i), vld1q_f32(x + i));
                a1 = vfmaq_f32(a1, n_load4(type, wr, i + 4), vld1q_f32(x + i + 4));
                a2 = vfmaq_f32(a2, n_load4(type, wr, i + 8), vld1q_f32(x + i + 8));
                a3 = vfmaq_f32(a3, n_load4(type, wr, i + 12), vld1q_f32(x + i + 12));
            }
            for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, n_load4(type, wr, i), vld1q_f32(x + i));
            float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
            for (; i < n; i++) sum += n_load1(type, wr, i) * x[i];
            Y[b * ldy + r] = sum;
        }
    }
}

#define QT_GE_FAM(fam) n_##fam
#define QT_GE_NAME qt_gemm_neon
#include "engine/quant/gemm_entry.h"

#include "engine/quant/target_pop.h"
#else
typedef int qt_neon_unused;
#endif
