/* amx.c — prompt-batch gemm on AMX tiles (TDPBSSD: int8 x int8 -> int32,
 * 16 x 16 outputs per instruction), for 16 or more activation rows.
 *
 * Layout: C[m][n] (m = activation row, n = weight row) = A . B with A the
 * activation block straight from the q8_0/q8_K rows (16 rows x 32 bytes,
 * strided tile load) and B the weight block of 16 weight rows unpacked to
 * int8 and laid out in AMX's 4-byte interleave (8 rows of 64 bytes),
 * prepared once per weight panel and K chunk and reused by every activation
 * tile of the call.
 *
 * Arithmetic: each tile product is the exact int32 dot of one 32-value
 * block (small types) or sub-block (K-quants), as the reference's integer
 * sums are; the scales are then applied in the reference's float expression,
 * in block order, one lane per weight row. Results are bit-identical to
 * qt_vec_dot_ref, so mixing this path with the AVX-512 kernels (fewer than
 * 16 rows, row ranges not whole panels, decode) keeps batch invariance.
 *
 * The tile instructions are written as inline assembly with memory clobbers:
 * gcc 12's _tile_loadd/_tile_stored macros give the compiler no memory
 * operands, so stores into a tile's source buffer (and loads of a stored
 * tile) may be reordered across them. */
#include "engine/quant/qtypes.h"

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif

#include <immintrin.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define TLOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t :: "r"(base), "r"((long)(stride)) : "memory")
#define TSTORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" :: "r"(base), "r"((long)(stride)) : "memory")
#define TZERO(t) __asm__ volatile("tilezero %%tmm" #t ::: "memory")
#define TDP(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

/* Palette 1: tiles 0, 1 = C (16 x 16 int32); 2, 3 = A (16 rows x kb bytes);
 * 4, 5 = B (kb / 4 rows x 64 bytes). kb = 32 (one block). */
typedef struct __attribute__((aligned(64))) tilecfg {
    uint8_t palette, start_row, pad[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static void tiles_config(int kb)
{
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) { c.colsb[t] = 64; c.rows[t] = 16; }
    for (int t = 2; t < 4; t++) { c.colsb[t] = (uint16_t)kb; c.rows[t] = 16; }
    for (int t = 4; t < 6; t++) { c.colsb[t] = 64; c.rows[t] = (uint8_t)(kb / 4); }
    __asm__ volatile("ldtilecfg %0" :: "m"(c) : "memory");
}

static void tiles_release(void) { __asm__ volatile("tilerelease" ::: "memory"); }

static float h2f(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

#define KC 32            /* blocks per K chunk (1,024 values of a small type) */
#define PANEL 16         /* weight rows per panel: one tile's N */
#define NPAN 4           /* panels prepared at once (64 weight rows) */

/* 16 rows x 32 int8 (row-major, 32 bytes apart) -> B layout:
 * out[k4 * 64 + 4 n + t] = in[n * 32 + 4 k4 + t]. */
static void to_b_layout(const int8_t *in, int8_t *out)
{
    const __m512i idx = _mm512_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224,
                                          256, 288, 320, 352, 384, 416, 448, 480);
    for (int k4 = 0; k4 < 8; k4++)
        _mm512_storeu_si512((void *)(out + 64 * k4), _mm512_i32gather_epi32(idx, in + 4 * k4, 1));
}

/* One weight row's block -> 32 int8 values and its scale (q8_0, q4_0). */
static void small_unpack(uint32_t type, const uint8_t *b, int8_t *q, float *d)
{
    *d = h2f(b);
    if (type == QT_Q8_0) {
        memcpy(q, b + 2, 32);
        return;
    }
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
    const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    _mm_storeu_si128((__m128i *)(void *)q, _mm_sub_epi8(_mm_and_si128(v, m), eight));
    _mm_storeu_si128((__m128i *)(void *)(q + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), eight));
}

/* acc[m] += (float)C[m] * (dw * da[m]), m = 0..15, as the reference's
 * sum = sum + (float)isum * (d * da). */
static inline __attribute__((always_inline)) void finish16(__m512 *acc, const int32_t *cb, __m512 dw,
                                                           const float *da)
{
    for (int m = 0; m < 16; m++) {
        const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb + 16 * m)));
        const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(da[m]));
        acc[m] = _mm512_add_ps(acc[m], _mm512_mul_ps(c, dd));
    }
}

/* Small types: rows [r0, r0 + 16 np) x activation rows [0, nt * 16). */
static void amx_small(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int np,
                      const uint8_t *A, size_t as, int nt, float *Y, int64_t ldy)
{
    const size_t wbs = type == QT_Q8_0 ? sizeof(qt_block_q8_0) : sizeof(qt_block_q4_0);
    const size_t abs = sizeof(qt_block_q8_0);
    const int64_t nbk = n / 32;
    int8_t bbuf[NPAN][KC][512] __attribute__((aligned(64)));
    float dwb[NPAN][KC][16] __attribute__((aligned(64)));
    float da[KC][16];
    int8_t tmp[16 * 32] __attribute__((aligned(64)));
    int32_t cb[2][256] __attribute__((aligned(64)));
    for (int p0 = 0; p0 < np; p0 += NPAN) {
        const int pn = np - p0 < NPAN ? np - p0 : NPAN;
        for (int64_t k0 = 0; k0 < nbk; k0 += KC) {
            const int kc = nbk - k0 < KC ? (int)(nbk - k0) : KC;
            for (int p = 0; p < pn; p++)
                for (int j = 0; j < kc; j++) {
                    for (int r = 0; r < 16; r++)
                        small_unpack(type, W + (size_t)(r0 + 16 * (p0 + p) + r) * ws + (size_t)(k0 + j) * wbs,
                                     tmp + 32 * r, &dwb[p][j][r]);
                    to_b_layout(tmp, bbuf[p][j]);
                }
            for (int t = 0; t < nt; t++) {
                const uint8_t *at = A + (size_t)(16 * t) * as;
                for (int j = 0; j < kc; j++)
                    for (int m = 0; m < 16; m++) da[j][m] = h2f(at + (size_t)m * as + (size_t)(k0 + j) * abs);
                for (int p = 0; p < pn; p++) {
                    float *y = Y + (size_t)(16 * t) * (size_t)ldy + r0 + 16 * (p0 + p);
                    __m512 acc[16];
                    for (int m = 0; m < 16; m++)
                        acc[m] = k0 ? _mm512_loadu_ps(y + (size_t)m * (size_t)ldy) : _mm512_setzero_ps();
                    const uint8_t *a0 = at + (size_t)k0 * abs + 2;
                    int j = 0;
                    for (; j + 1 < kc; j += 2) {
                        TLOAD(2, a0 + (size_t)j * abs, as);
                        TLOAD(4, bbuf[p][j], 64);
                        TZERO(0);
                        TDP(0, 2, 4);
                        TLOAD(3, a0 + (size_t)(j + 1) * abs, as);
                        TLOAD(5, bbuf[p][j + 1], 64);
                        TZERO(1);
                        TDP(1, 3, 5);
                        TSTORE(0, cb[0], 64);
                        finish16(acc, cb[0], _mm512_load_ps(dwb[p][j]), da[j]);
                        TSTORE(1, cb[1], 64);
                        finish16(acc, cb[1], _mm512_load_ps(dwb[p][j + 1]), da[j + 1]);
                    }
                    if (j < kc) {
                        TLOAD(2, a0 + (size_t)j * abs, as);
                        TLOAD(4, bbuf[p][j], 64);
                        TZERO(0);
                        TDP(0, 2, 4);
                        TSTORE(0, cb[0], 64);
                        finish16(acc, cb[0], _mm512_load_ps(dwb[p][j]), da[j]);
                    }
                    for (int m = 0; m < 16; m++) _mm512_storeu_ps(y + (size_t)m * (size_t)ldy, acc[m]);
                }
            }
        }
    }
}

int qt_gemm_amx(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
                int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
                float *Y, int64_t ldy)
{
    if (wtype != QT_Q8_0 && wtype != QT_Q4_0) return -1;
    const int nt = nb / 16, np = (int)((r1 - r0) / PANEL);
    if (nt == 0 || np == 0 || n <= 0 || n % 32) return -1;
    tiles_config(32);
    amx_small(wtype, n, W, w_stride, r0, np, A, a_stride, nt, Y, ldy);
    tiles_release();
    /* the rest: rows past the last whole panel, activation rows past the
     * last whole tile (bit-identical kernels) */
    const int64_t rp = r0 + (int64_t)np * PANEL;
    if (rp < r1 && qt_gemm_avx512(wtype, n, W, w_stride, rp, r1, A, a_stride, nt * 16, Y, ldy)) return -1;
    if (nb > nt * 16 &&
        qt_gemm_avx512(wtype, n, W, w_stride, r0, r1, (const uint8_t *)A + (size_t)(nt * 16) * a_stride, a_stride,
                       nb - nt * 16, Y + (size_t)(nt * 16) * (size_t)ldy, ldy))
        return -1;
    return 0;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
typedef int qt_amx_unused;
#endif
