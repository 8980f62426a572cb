/* avx2.c — gemm kernels for AVX2 + FMA + F16C (see kernels.h). Built with
 * a per-file target so the library still runs on CPUs without AVX2; qt_gemm
 * only calls in here after cpuid/xgetbv said yes. */
#include "engine/quant/qtypes.h"

#if defined(__x86_64__) || defined(__i386__)
#include "engine/quant/x86/avx2_target.h"

#include <immintrin.h>

#define QT_DOT_US(acc, u, s) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#define QT_MADD_ACC(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#define QT_KERNEL_NAME qt_gemm_avx2
#include "engine/quant/x86/kernels.h"

/* ---- activation quantizers: the same bytes as the scalar references ---- */

#include <math.h>

static inline float q_hmax(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* roundf(): half away from zero. t = trunc(p) and p - t are exact. */
static inline __m256i q_roundf(__m256 p)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
    const __m256 one = _mm256_or_ps(_mm256_and_ps(p, sign), _mm256_set1_ps(1.0f));
    const __m256 adj = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    return _mm256_cvttps_epi32(_mm256_add_ps(t, adj));
}

/* 4 x 8 int32 (each within int8 range) -> 32 int8 in order. */
static inline __m256i q_pack(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    const __m256i a = _mm256_packs_epi32(i0, i1), b = _mm256_packs_epi32(i2, i3);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline int32_t q_hsum(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

static void q8_0_or_1(const float *x, uint8_t *y, int64_t nb, int with_sum)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const size_t bs = with_sum ? 36 : 34, qo = with_sum ? 4 : 2;
    for (int64_t i = 0; i < nb; i++, x += 32, y += bs) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                       _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        const float amax = q_hmax(m);
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t hd = qt_fp32_to_fp16(d);
        memcpy(y, &hd, 2);
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i i0 = q_roundf(_mm256_mul_ps(v0, vid)), i1 = q_roundf(_mm256_mul_ps(v1, vid));
        const __m256i i2 = q_roundf(_mm256_mul_ps(v2, vid)), i3 = q_roundf(_mm256_mul_ps(v3, vid));
        _mm256_storeu_si256((__m256i *)(void *)(y + qo), q_pack(i0, i1, i2, i3));
        if (with_sum) {
            const int32_t sum = q_hsum(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
            const uint16_t hs = qt_fp32_to_fp16((float)sum * d);
            memcpy(y + 2, &hs, 2);
        }
    }
}

static void q8_K(const float *x, qt_block_q8_K *y, int64_t nb)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += 256) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 256; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        const float amax = q_hmax(m);
        if (!(amax > 0)) {   /* all zero (or NaN: leave that to the reference) */
            if (amax != amax) qt_quantize_row_ref(QT_Q8_K, x, &y[i], 256);
            else memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* the first value of largest magnitude, with its sign */
        float max = 0;
        const __m256 va = _mm256_set1_ps(amax);
        for (int j = 0; j < 256; j += 8) {
            const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
            if (mask) { max = x[j + __builtin_ctz((unsigned)mask)]; break; }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int j = 0; j < 256; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++)   /* round half to even, as nearest_int() */
                q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vs)), lim);
            _mm256_storeu_si256((__m256i *)(void *)(y[i].qs + j), q_pack(q[0], q[1], q[2], q[3]));
            y[i].bsums[j / 16] = (int16_t)q_hsum(_mm256_add_epi32(q[0], q[1]));
            y[i].bsums[j / 16 + 1] = (int16_t)q_hsum(_mm256_add_epi32(q[2], q[3]));
        }
        y[i].d = 1 / iscale;
    }
}

int qt_quantize_avx2(uint32_t act_type, const float *x, void *dst, int64_t n)
{
    const qt_traits *t = qt_get(act_type);
    if (!t || n <= 0 || n % t->blck) return -1;
    if ((_mm_getcsr() & 0x6000) != 0) return -1;   /* rounding mode not nearest */
    switch (act_type) {
    case QT_Q8_0: q8_0_or_1(x, dst, n / 32, 0); return 0;
    case QT_Q8_1: q8_0_or_1(x, dst, n / 32, 1); return 0;
    case QT_Q8_K: q8_K(x, dst, n / 256); return 0;
    default: return -1;
    }
}

#include "engine/quant/target_pop.h"
#else
typedef int qt_avx2_unused;
#endif
