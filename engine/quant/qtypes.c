/* qtypes.c — type traits, fp16/bf16 conversion, reference dequantizers,
 * activation quantizers, the scalar reference gemm and ISA dispatch.
 *
 * The dequantizers evaluate the same float expressions, in the same order, as
 * llama.cpp's reference code, so results are bit-identical; this file must be
 * built without floating-point contraction (ISO C mode does that by default).
 *
 * The reference dot products work per block in integers, as llama.cpp's
 * vec_dot does, then scale in float. The SIMD kernels for K-quants and small
 * blocks evaluate the very same integer sums and the same float expression
 * per (super-)block, so they agree with qt_vec_dot_ref bit for bit. */
#include "engine/quant/qtypes.h"

#include "engine/quant/iq.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Float expressions must not be fused into FMAs (bit-exactness); gcc in
 * ISO C mode does not fuse, clang needs telling. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

static const qt_traits g_traits[QT_COUNT] = {
    [QT_F32]  = { "f32",  1, 4, 1 },
    [QT_F16]  = { "f16",  1, 2, 1 },
    [QT_BF16] = { "bf16", 1, 2, 1 },
    [QT_Q4_0] = { "q4_0", 32, sizeof(qt_block_q4_0), 1 },
    [QT_Q4_1] = { "q4_1", 32, sizeof(qt_block_q4_1), 1 },
    [QT_Q5_0] = { "q5_0", 32, sizeof(qt_block_q5_0), 1 },
    [QT_Q5_1] = { "q5_1", 32, sizeof(qt_block_q5_1), 1 },
    [QT_Q8_0] = { "q8_0", 32, sizeof(qt_block_q8_0), 1 },
    [QT_Q8_1] = { "q8_1", 32, sizeof(qt_block_q8_1), 0 },
    [QT_Q2_K] = { "q2_K", 256, sizeof(qt_block_q2_K), 1 },
    [QT_Q3_K] = { "q3_K", 256, sizeof(qt_block_q3_K), 1 },
    [QT_Q4_K] = { "q4_K", 256, sizeof(qt_block_q4_K), 1 },
    [QT_Q5_K] = { "q5_K", 256, sizeof(qt_block_q5_K), 1 },
    [QT_Q6_K] = { "q6_K", 256, sizeof(qt_block_q6_K), 1 },
    [QT_Q8_K] = { "q8_K", 256, sizeof(qt_block_q8_K), 0 },
    [QT_IQ2_XXS] = { "iq2_xxs", 256, sizeof(qt_block_iq2_xxs), 1 },
    [QT_IQ2_XS]  = { "iq2_xs", 256, sizeof(qt_block_iq2_xs), 1 },
    [QT_IQ2_S]   = { "iq2_s", 256, sizeof(qt_block_iq2_s), 1 },
    [QT_IQ3_XXS] = { "iq3_xxs", 256, sizeof(qt_block_iq3_xxs), 1 },
    [QT_IQ3_S]   = { "iq3_s", 256, sizeof(qt_block_iq3_s), 1 },
    [QT_IQ1_S]   = { "iq1_s", 256, sizeof(qt_block_iq1_s), 1 },
    [QT_IQ4_NL]  = { "iq4_nl", 32, sizeof(qt_block_iq4_nl), 1 },
    [QT_IQ4_XS]  = { "iq4_xs", 256, sizeof(qt_block_iq4_xs), 1 },
    [QT_MXFP4]   = { "mxfp4", 32, sizeof(qt_block_mxfp4), 1 },
};

const qt_traits *qt_get(uint32_t type)
{
    if (type >= QT_COUNT || !g_traits[type].name) return NULL;
    return &g_traits[type];
}

const char *qt_name(uint32_t type)
{
    /* ggml's names of the ids this engine does not run, for error messages */
    static const char *const other[] = {
        [4] = "q4_2", [5] = "q4_3", [24] = "i8", [25] = "i16", [26] = "i32", [27] = "i64",
        [28] = "f64", [29] = "iq1_m", [31] = "q4_0_4_4", [32] = "q4_0_4_8", [33] = "q4_0_8_8",
        [34] = "tq1_0", [35] = "tq2_0", [36] = "iq4_nl_4_4", [37] = "iq4_nl_4_8", [38] = "iq4_nl_8_8",
    };
    static _Thread_local char buf[40];
    const qt_traits *t = qt_get(type);
    if (t) return t->name;
    if (type < sizeof other / sizeof other[0] && other[type])
        snprintf(buf, sizeof buf, "%s (type %u)", other[type], type);
    else
        snprintf(buf, sizeof buf, "type %u", type);
    return buf;
}

size_t qt_row_size(uint32_t type, int64_t n)
{
    const qt_traits *t = qt_get(type);
    if (!t || n < 0 || n % t->blck) return 0;
    return (size_t)(n / t->blck) * t->type_size;
}

/* ---- scalar conversions ---- */

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float qt_fp16_to_fp32(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float norm = u2f((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denorm = u2f((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t r = sign | (two_w < (1u << 27) ? f2u(denorm) : f2u(norm));
    return u2f(r);
}

/* Round to nearest even, like F16C's vcvtps2ph with rounding mode 0. */
uint16_t qt_fp32_to_fp16(float f)
{
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f2u(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = u2f((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f2u(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mant_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mant_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float qt_bf16_to_fp32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t qt_fp32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

static inline float h2f(uint16_t h) { return qt_fp16_to_fp32(h); }

/* ---- reference dequantizers (llama.cpp's expressions, same order) ---- */

static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63; *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* The 16 6-bit scales of a q3_K block, as signed bytes before the -32. */
static inline void q3k_scales(const uint8_t *s12, int8_t out[16])
{
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[4];
    memcpy(aux, s12, 12);
    uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(out, aux, 16);
}

static void deq_q4_0(const void *vx, float *y, int64_t nb)
{
    const qt_block_q4_0 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + 16] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const void *vx, float *y, int64_t nb)
{
    const qt_block_q4_1 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            y[j + 16] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

static void deq_q5_0(const void *vx, float *y, int64_t nb)
{
    const qt_block_q5_0 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = h2f(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
            y[j] = (float)(((x[i].qs[j] & 0x0F) | xh0) - 16) * d;
            y[j + 16] = (float)(((x[i].qs[j] >> 4) | xh1) - 16) * d;
        }
    }
}

static void deq_q5_1(const void *vx, float *y, int64_t nb)
{
    const qt_block_q5_1 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
            y[j] = (float)((x[i].qs[j] & 0x0F) | xh0) * d + m;
            y[j + 16] = (float)((x[i].qs[j] >> 4) | xh1) * d + m;
        }
    }
}

static void deq_q8_0(const void *vx, float *y, int64_t nb)
{
    const qt_block_q8_0 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

static void deq_q8_1(const void *vx, float *y, int64_t nb)
{
    const qt_block_q8_1 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

static void deq_q2_K(const void *vx, float *y, int64_t nb)
{
    const qt_block_q2_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int n = 0; n < QT_QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                uint8_t sc = x[i].scales[is++];
                float dl = d * (float)(sc & 0xF), ml = min * (float)(sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((int8_t)((q[l] >> shift) & 3)) - ml;
                sc = x[i].scales[is++];
                dl = d * (float)(sc & 0xF); ml = min * (float)(sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((int8_t)((q[l + 16] >> shift) & 3)) - ml;
                shift += 2;
            }
            q += 32;
        }
    }
}

static void deq_q3_K(const void *vx, float *y, int64_t nb)
{
    const qt_block_q3_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        int8_t scales[16];
        q3k_scales(x[i].scales, scales);
        const float d_all = h2f(x[i].d);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < QT_QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                float dl = d_all * (float)(scales[is++] - 32);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
                dl = d_all * (float)(scales[is++] - 32);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m = (uint8_t)(m << 1);
            }
            q += 32;
        }
    }
}

static void deq_q4_K(const void *vx, float *y, int64_t nb)
{
    const qt_block_q4_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QT_QK_K; j += 64) {
            scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32; is += 2;
        }
    }
}

static void deq_q5_K(const void *vx, float *y, int64_t nb)
{
    const qt_block_q5_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < QT_QK_K; j += 64) {
            scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32; is += 2;
            u1 = (uint8_t)(u1 << 2); u2 = (uint8_t)(u2 << 2);
        }
    }
}

static void deq_q6_K(const void *vx, float *y, int64_t nb)
{
    const qt_block_q6_K *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < QT_QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128; ql += 64; qh += 32; sc += 8;
        }
    }
}

static void deq_q8_K(const void *vx, float *y, int64_t nb)
{
    const qt_block_q8_K *x = vx;
    for (int64_t i = 0; i < nb; i++, y += 256)
        for (int j = 0; j < 256; j++) y[j] = x[i].d * (float)x[i].qs[j];
}

/* The other block types' dequantizers, by type. */
static void (*const deq_block[QT_COUNT])(const void *x, float *y, int64_t nb) = {
    [QT_Q4_0] = deq_q4_0, [QT_Q4_1] = deq_q4_1, [QT_Q5_0] = deq_q5_0, [QT_Q5_1] = deq_q5_1,
    [QT_Q8_0] = deq_q8_0, [QT_Q8_1] = deq_q8_1, [QT_Q8_K] = deq_q8_K,
    [QT_Q2_K] = deq_q2_K, [QT_Q3_K] = deq_q3_K, [QT_Q4_K] = deq_q4_K, [QT_Q5_K] = deq_q5_K, [QT_Q6_K] = deq_q6_K,
};

/* The blocks of n values of type (0: an unknown type, or n not whole blocks). */
static int64_t blocks_of(uint32_t type, int64_t n)
{
    const qt_traits *t = qt_get(type);
    return t && n > 0 && n % t->blck == 0 ? n / t->blck : 0;
}

void qt_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const int64_t nb = blocks_of(type, n);
    if (nb <= 0) return;
    switch (type) {
    case QT_F32: memcpy(dst, src, (size_t)n * 4); break;
    case QT_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = h2f(s[i]);
        break;
    }
    case QT_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = qt_bf16_to_fp32(s[i]);
        break;
    }
    case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ2_S: case QT_IQ3_XXS: case QT_IQ3_S:
    case QT_IQ1_S: case QT_IQ4_NL: case QT_IQ4_XS: case QT_MXFP4:
        qt_iq_dequant(type, src, dst, nb);
        break;
    default:
        if (deq_block[type]) deq_block[type](src, dst, nb);
        break;
    }
}

/* ---- activation quantizers (llama.cpp's *_ref: roundf for q8_0/q8_1,
 * round-half-even via nearest_int for q8_K) ---- */

uint32_t qt_act_type(uint32_t wtype)
{
    switch (wtype) {
    case QT_Q4_0: case QT_Q5_0: case QT_Q8_0: case QT_IQ4_NL: case QT_MXFP4: return QT_Q8_0;
    case QT_Q4_1: case QT_Q5_1: return QT_Q8_1;
    case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K:
    case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ2_S: case QT_IQ3_XXS: case QT_IQ3_S:
    case QT_IQ1_S: case QT_IQ4_XS: return QT_Q8_K;
    default: return QT_F32;
    }
}

static inline int nearest_int(float fval)
{
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

/* 32 values as int8 qs of scale d = amax/127; returns d. */
static float quant_block32(const float *x, int8_t *qs)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) qs[j] = (int8_t)roundf(x[j] * id);
    return d;
}

static void quant_q8_0(const float *x, qt_block_q8_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32) y[i].d = qt_fp32_to_fp16(quant_block32(x, y[i].qs));
}

static void quant_q8_1(const float *x, qt_block_q8_1 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32) {
        const float d = quant_block32(x, y[i].qs);
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += y[i].qs[j];
        y[i].d = qt_fp32_to_fp16(d);
        y[i].s = qt_fp32_to_fp16((float)sum * d);
    }
}

static void quant_q8_K(const float *x, qt_block_q8_K *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float max = 0, amax = 0;
        for (int j = 0; j < 256; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < 256; j++) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void qt_quantize_row(uint32_t act_type, const float *x, void *dst, int64_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    if (qt_isa_get() >= QT_ISA_AVX2 && qt_quantize_avx2(act_type, x, dst, n) == 0) return;
#endif
    qt_quantize_row_ref(act_type, x, dst, n);
}

void qt_quantize_row_ref(uint32_t act_type, const float *x, void *dst, int64_t n)
{
    const int64_t nb = blocks_of(act_type, n);
    if (nb <= 0) return;
    switch (act_type) {
    case QT_F32: memcpy(dst, x, (size_t)n * 4); break;
    case QT_Q8_0: quant_q8_0(x, dst, nb); break;
    case QT_Q8_1: quant_q8_1(x, dst, nb); break;
    case QT_Q8_K: quant_q8_K(x, dst, nb); break;
    case QT_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = qt_fp32_to_fp16(x[i]);
        break;
    }
    case QT_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = qt_fp32_to_bf16(x[i]);
        break;
    }
    default: break;
    }
}

/* ---- reference dot products ---- */

/* One 32-value block as integers: signed values (q4_0, q5_0, q8_0, iq4_nl,
 * mxfp4) or unsigned ones plus a min (q4_1, q5_1). */
static void unpack_small(uint32_t type, const uint8_t *b, int8_t q[32], float *d, float *m)
{
    uint16_t hd, hm;
    memcpy(&hd, b, 2);
    *d = type == QT_MXFP4 ? qt_e8m0_half(b[0]) : h2f(hd);
    *m = 0;
    switch (type) {
    case QT_IQ4_NL: case QT_MXFP4: {
        const int8_t *kv = type == QT_MXFP4 ? qt_mxfp4_values() : qt_iq4nl_values();
        qt_nibbles_i8(kv, b + (type == QT_MXFP4 ? 1 : 2), q);
        break;
    }
    case QT_Q4_0: {
        const qt_block_q4_0 *x = (const void *)b;
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((x->qs[j] & 15) - 8);
            q[j + 16] = (int8_t)((x->qs[j] >> 4) - 8);
        }
        break;
    }
    case QT_Q4_1: {
        const qt_block_q4_1 *x = (const void *)b;
        memcpy(&hm, &x->m, 2);
        *m = h2f(hm);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(x->qs[j] & 15);
            q[j + 16] = (int8_t)(x->qs[j] >> 4);
        }
        break;
    }
    case QT_Q5_0: case QT_Q5_1: {
        const uint8_t *qh8 = type == QT_Q5_0 ? ((const qt_block_q5_0 *)(const void *)b)->qh
                                             : ((const qt_block_q5_1 *)(const void *)b)->qh;
        const uint8_t *qs = qh8 + 4;
        const int off = type == QT_Q5_0 ? 16 : 0;
        uint32_t qh;
        memcpy(&qh, qh8, 4);
        if (type == QT_Q5_1) {
            memcpy(&hm, b + 2, 2);
            *m = h2f(hm);
        }
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - off);
            q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
        }
        break;
    }
    case QT_Q8_0:
        memcpy(q, b + 2, 32);
        break;
    default:
        memset(q, 0, 32);
        break;
    }
}

/* One K-quant super-block as unsigned integers q[256] with, per 16 values,
 * a scale s[k] and an offset coefficient m[k]:
 *   dot(w, a) = da * (fd * sum_k s[k] * dot_k(q, a) - fm * sum_k m[k] * bsum_k(a)) */
static void unpack_k(uint32_t type, const uint8_t *b, uint8_t q[256], int16_t s[16],
                     int16_t m[16], float *fd, float *fm)
{
    switch (type) {
    case QT_Q2_K: {
        const qt_block_q2_K *x = (const void *)b;
        *fd = h2f(x->d); *fm = h2f(x->dmin);
        for (int k = 0; k < 16; k++) { s[k] = x->scales[k] & 15; m[k] = x->scales[k] >> 4; }
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    q[(4 * h + j) * 32 + l] = (x->qs[32 * h + l] >> (2 * j)) & 3;
        break;
    }
    case QT_Q3_K: {
        const qt_block_q3_K *x = (const void *)b;
        int8_t sc[16];
        q3k_scales(x->scales, sc);
        *fd = *fm = h2f(x->d);
        for (int k = 0; k < 16; k++) { s[k] = (int16_t)(sc[k] - 32); m[k] = (int16_t)(4 * s[k]); }
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++) {
                const int c = 4 * h + j;
                for (int l = 0; l < 32; l++)
                    q[c * 32 + l] = (uint8_t)(((x->qs[32 * h + l] >> (2 * j)) & 3) |
                                              (((x->hmask[l] >> c) & 1) << 2));
            }
        break;
    }
    case QT_Q4_K: case QT_Q5_K: {
        const uint8_t *sc12 = b + 4;
        const uint8_t *qs = type == QT_Q4_K ? ((const qt_block_q4_K *)(const void *)b)->qs
                                            : ((const qt_block_q5_K *)(const void *)b)->qs;
        uint16_t hd, hm;
        memcpy(&hd, b, 2); memcpy(&hm, b + 2, 2);
        *fd = h2f(hd); *fm = h2f(hm);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            scale_min_k4(j, sc12, &sc, &mn);
            s[2 * j] = s[2 * j + 1] = sc;
            m[2 * j] = m[2 * j + 1] = mn;
        }
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                q[64 * j + l] = qs[32 * j + l] & 15;
                q[64 * j + 32 + l] = qs[32 * j + l] >> 4;
            }
        if (type == QT_Q5_K) {
            const uint8_t *qh = ((const qt_block_q5_K *)(const void *)b)->qh;
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    q[64 * j + l] |= (uint8_t)(((qh[l] >> (2 * j)) & 1) << 4);
                    q[64 * j + 32 + l] |= (uint8_t)(((qh[l] >> (2 * j + 1)) & 1) << 4);
                }
        }
        break;
    }
    case QT_Q6_K: {
        const qt_block_q6_K *x = (const void *)b;
        *fd = *fm = h2f(x->d);
        for (int k = 0; k < 16; k++) { s[k] = x->scales[k]; m[k] = (int16_t)(32 * s[k]); }
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
            uint8_t *o = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (uint8_t)((ql[l] & 15) | ((qh[l] & 3) << 4));
                o[l + 32] = (uint8_t)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
                o[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
        break;
    }
    default:
        memset(q, 0, 256); memset(s, 0, 32); memset(m, 0, 32); *fd = *fm = 0;
        break;
    }
}

/* One small-block weight block against 32 int8 activations: the int32
 * dot, with the block's scale d and min m. */
static int small_dot(uint32_t type, const uint8_t *b, const int8_t *qa, float *d, float *m)
{
    int8_t q[32];
    unpack_small(type, b, q, d, m);
    int isum = 0;
    for (int j = 0; j < 32; j++) isum += q[j] * qa[j];
    return isum;
}

float qt_vec_dot_ref(uint32_t wtype, int64_t n, const void *w, const void *a)
{
    const qt_traits *t = qt_get(wtype);
    if (!t || !t->weight_ok || n <= 0 || n % t->blck) return 0.0f;
    const uint8_t *wb = w;
    switch (wtype) {
    case QT_F32: case QT_F16: case QT_BF16: {
        const float *x = a;
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            float v;
            if (wtype == QT_F32) memcpy(&v, wb + 4 * i, 4);
            else {
                uint16_t h;
                memcpy(&h, wb + 2 * i, 2);
                v = wtype == QT_F16 ? h2f(h) : qt_bf16_to_fp32(h);
            }
            sum += (double)v * (double)x[i];
        }
        return (float)sum;
    }
    case QT_IQ2_XXS: case QT_IQ2_XS: case QT_IQ2_S: case QT_IQ3_XXS: case QT_IQ3_S:
    case QT_IQ1_S: case QT_IQ4_XS:
        return qt_iq_dot_ref(wtype, n, w, a);
    case QT_Q4_0: case QT_Q5_0: case QT_Q8_0: case QT_IQ4_NL: case QT_MXFP4: {
        const qt_block_q8_0 *y = a;
        float sum = 0, d, m;
        for (int64_t i = 0; i < n / 32; i++) {
            const int isum = small_dot(wtype, wb + i * t->type_size, y[i].qs, &d, &m);
            sum += (float)isum * (d * h2f(y[i].d));
        }
        return sum;
    }
    case QT_Q4_1: case QT_Q5_1: {
        const qt_block_q8_1 *y = a;
        float sum = 0, d, m;
        for (int64_t i = 0; i < n / 32; i++) {
            const int isum = small_dot(wtype, wb + i * t->type_size, y[i].qs, &d, &m);
            sum += (d * h2f(y[i].d)) * (float)isum + m * h2f(y[i].s);
        }
        return sum;
    }
    default: {
        const qt_block_q8_K *y = a;
        float sum = 0;
        for (int64_t i = 0; i < n / 256; i++) {
            uint8_t q[256];
            int16_t s[16], m[16];
            float fd, fm;
            unpack_k(wtype, wb + i * t->type_size, q, s, m, &fd, &fm);
            int32_t isum = 0, msum = 0;
            for (int k = 0; k < 16; k++) {
                int32_t dk = 0;
                for (int l = 0; l < 16; l++) dk += q[16 * k + l] * y[i].qs[16 * k + l];
                isum += s[k] * dk;
                msum += m[k] * y[i].bsums[k];
            }
            sum += y[i].d * (fd * (float)isum - fm * (float)msum);
        }
        return sum;
    }
    }
}

void qt_gemm_ref(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
                 int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
                 float *Y, int64_t ldy)
{
    for (int64_t r = r0; r < r1; r++)
        for (int b = 0; b < nb; b++)
            Y[b * ldy + r] = qt_vec_dot_ref(wtype, n, (const uint8_t *)W + r * w_stride,
                                            (const uint8_t *)A + b * a_stride);
}

/* ---- ISA detection and dispatch ---- */

static qt_isa g_best = QT_ISA_SCALAR;
static qt_isa g_cur = QT_ISA_SCALAR;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static qt_isa detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return QT_ISA_SCALAR;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return QT_ISA_SCALAR;
    const uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 6) != 6) return QT_ISA_SCALAR;          /* OS saves xmm/ymm */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return QT_ISA_SCALAR;
    const int avx2 = (b >> 5) & 1;
    if (!(avx2 && fma && f16c)) return QT_ISA_SCALAR;
    const int f512 = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const int vnni = (c >> 11) & 1;
    if (!(f512 && dq && bw && vl && vnni && (xcr0 & 0xE0) == 0xE0)) return QT_ISA_AVX2;
    /* AMX: tile and int8 support, the OS saving tile state, and Linux's
     * per-process permission for the tile data (granted for every thread) */
    const int amx = ((d >> 24) & 1) && ((d >> 25) & 1) && (xcr0 & 0x60000) == 0x60000;
    if (amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0)
        return QT_ISA_AMX;
    return QT_ISA_AVX512;
}
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
static qt_isa detect(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? QT_ISA_NEON : QT_ISA_SCALAR;
}
#else
static qt_isa detect(void) { return QT_ISA_SCALAR; }
#endif

static void init_once(void)
{
    g_best = detect();
    const char *env = getenv("ANE_QT_ISA");   /* debugging: force a lower ISA */
    qt_isa want = g_best;
    if (env) {
        if (!strcmp(env, "scalar")) want = QT_ISA_SCALAR;
        else if (!strcmp(env, "avx2")) want = QT_ISA_AVX2;
        else if (!strcmp(env, "avx512")) want = QT_ISA_AVX512;
    }
    g_cur = want < g_best ? want : g_best;
}

void qt_init(void) { pthread_once(&g_once, init_once); }

qt_isa qt_isa_get(void)
{
    qt_init();
    return __atomic_load_n(&g_cur, __ATOMIC_RELAXED);
}

qt_isa qt_isa_cpu(void)
{
    qt_init();
    return g_best;
}

const char *qt_isa_name(qt_isa isa)
{
    switch (isa) {
    case QT_ISA_SCALAR: return "scalar";
    case QT_ISA_AVX2: return "avx2";
    case QT_ISA_AVX512: return "avx512";
    case QT_ISA_NEON: return "neon";
    case QT_ISA_AMX: return "amx";
    }
    return "?";
}

void qt_isa_set(qt_isa isa)
{
    qt_init();
    if (isa > g_best) isa = g_best;
    /* an ISA of the other architecture means "as low as that": scalar */
#if defined(__aarch64__)
    if (isa == QT_ISA_AVX2 || isa == QT_ISA_AVX512) isa = QT_ISA_SCALAR;
#else
    if (isa == QT_ISA_NEON) isa = g_best;
#endif
    __atomic_store_n(&g_cur, isa, __ATOMIC_RELAXED);
}

void qt_gemm(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
             int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
             float *Y, int64_t ldy)
{
    const qt_isa isa = qt_isa_get();
    if (r1 <= r0 || nb <= 0) return;
#if defined(__x86_64__) || defined(__i386__)
#if defined(__x86_64__)
    if (isa == QT_ISA_AMX &&
        qt_gemm_amx(wtype, n, W, w_stride, r0, r1, A, a_stride, nb, Y, ldy) == 0) return;
#endif
    if (isa >= QT_ISA_AVX512 &&
        qt_gemm_avx512(wtype, n, W, w_stride, r0, r1, A, a_stride, nb, Y, ldy) == 0) return;
    if (isa >= QT_ISA_AVX2 &&
        qt_gemm_avx2(wtype, n, W, w_stride, r0, r1, A, a_stride, nb, Y, ldy) == 0) return;
#elif defined(__aarch64__)
    if (isa == QT_ISA_NEON &&
        qt_gemm_neon(wtype, n, W, w_stride, r0, r1, A, a_stride, nb, Y, ldy) == 0) return;
#else
    (void)isa;
#endif
    qt_gemm_ref(wtype, n, W, w_stride, r0, r1, A, a_stride, nb, Y, ldy);
}
