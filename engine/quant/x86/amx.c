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
 * The tile instructions are written here as inline assembly, not with
 * gcc 12's <amxtileintrin.h>: its _tile_loadd has neither a memory operand
 * nor a memory clobber, so stores into a tile's source buffer may be moved
 * past the load or dropped, and its _tile_loadconfig does not declare the
 * 64 configuration bytes as read, so gcc 12 -O2 drops the stores of the
 * rows and column widths (it keeps 16 zero bytes and the palette): the
 * tiles stay unconfigured and the first tile instruction raises SIGILL.
 * That is the fault of llama.cpp's AMX build under gcc 12, at a tilezero
 * in tinygemm_kernel_amx after ggml_tile_config_init's ldtilecfg; clang
 * 14 keeps the stores. Every statement below takes the whole object or
 * clobbers memory. */
#include "engine/quant/iq.h"
#include "engine/quant/qtypes.h"

#if defined(__x86_64__)
#include "engine/quant/x86/avx512_target.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
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
#define AMX_LAG 3        /* blocks between a tile's store and its read-back (<= 3: cb ring of 4) */
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

/* Weight block bytes and the activation block (q8_1 for the types with a
 * min, q8_0 for the others). */
static size_t small_wbytes(uint32_t type)
{
    switch (type) {
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_Q8_0: case QT_IQ4_NL: case QT_MXFP4:
        return qt_block_bytes(type);
    default: return 0;
    }
}

static int small_has_min(uint32_t type) { return type == QT_Q4_1 || type == QT_Q5_1; }

/* One weight row's block -> 32 int8 values, its scale d and min m (0 for
 * the types without): the reference's unpack_small. */
static void small_unpack(uint32_t type, const uint8_t *b, int8_t *q, float *d, float *m)
{
    *m = 0;
    switch (type) {
    case QT_Q8_0:
        *d = h2f(b);
        memcpy(q, b + 2, 32);
        return;
    case QT_Q4_0: case QT_Q4_1: {
        const int mn = type == QT_Q4_1;
        *d = h2f(b);
        if (mn) *m = h2f(b + 2);
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + (mn ? 4 : 2)));
        const __m128i lo = _mm_set1_epi8(0x0F), off = _mm_set1_epi8(mn ? 0 : 8);
        _mm_storeu_si128((__m128i *)(void *)q, _mm_sub_epi8(_mm_and_si128(v, lo), off));
        _mm_storeu_si128((__m128i *)(void *)(q + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), lo), off));
        return;
    }
    case QT_Q5_0: case QT_Q5_1: {
        const int mn = type == QT_Q5_1;
        *d = h2f(b);
        if (mn) *m = h2f(b + 2);
        const uint8_t *qh8 = b + (mn ? 4 : 2), *qs = qh8 + 4;
        const int off = mn ? 0 : 16;
        uint32_t qh;
        memcpy(&qh, qh8, 4);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - off);
            q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
        }
        return;
    }
    default: {   /* iq4_nl, mxfp4: 4-bit indices into a table of int8 levels */
        const int8_t *kv = type == QT_MXFP4 ? qt_mxfp4_values() : qt_iq4nl_values();
        *d = type == QT_MXFP4 ? qt_e8m0_half(b[0]) : h2f(b);
        qt_nibbles_i8(kv, b + (type == QT_MXFP4 ? 1 : 2), q);
        return;
    }
    }
}

/* x8.c's bytes per 8-row group and block: q8_0's (272) and q4_K's (1,184) */
#define X8_Q80 272
#define X8_Q4K 1184

/* 32 bytes of an 8-row group and the same 32 of the next group, side by
 * side: rows 0-7 and 8-15 of one B tile row */
static inline __m512i x8_pair(const uint8_t *a, const uint8_t *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a)),
                              _mm256_loadu_si256((const __m256i *)(const void *)b), 1);
}

/* the 8 f16 of a group and the next group's 8, as 16 floats */
static inline __m512 x8_pair_ph(const uint8_t *a, const uint8_t *b)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)a))),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)b)), 1);
}

/* A panel's B tiles and scales from q8_0's 8-row groups (g0, g1 at the
 * chunk's first block): each k's 32 bytes are half a B row */
static void q80x8_prepare(const uint8_t *g0, const uint8_t *g1, int kc, int8_t (*b)[512], float (*dw)[16])
{
    for (int j = 0; j < kc; j++, g0 += X8_Q80, g1 += X8_Q80) {
        for (int k = 0; k < 8; k++) _mm512_store_si512((void *)(b[j] + 64 * k), x8_pair(g0 + 32 * k, g1 + 32 * k));
        _mm512_store_ps(dw[j], x8_pair_ph(g0 + 256, g1 + 256));
    }
}

/* Small types: rows [r0, r0 + 16 np) x activation rows [0, nt * 16); Y
 * points at row r0's column. X8: q8_0's 8-row groups instead of W
 * (q80x8_prepare). */
static void amx_small(uint32_t type, int64_t n, const uint8_t *W, size_t ws, const uint8_t *X8, int64_t r0, int np,
                      const uint8_t *A, size_t as, int nt, float *Y, int64_t ldy)
{
    const int hm = small_has_min(type);
    const size_t wbs = small_wbytes(type);
    const size_t abs = hm ? sizeof(qt_block_q8_1) : sizeof(qt_block_q8_0), aq = hm ? 4 : 2;
    const int64_t nbk = n / 32;
    int8_t bbuf[NPAN][KC][512] __attribute__((aligned(64)));
    float dwb[NPAN][KC][16] __attribute__((aligned(64)));
    float mwb[NPAN][KC][16] __attribute__((aligned(64)));
    float da[KC][16], sa[KC][16];
    int8_t tmp[16 * 32] __attribute__((aligned(64)));
    int32_t cb[4][256] __attribute__((aligned(64)));
#define SMALL_STEP(c, ta, tb, jj) do { TLOAD(ta, a0 + (size_t)(jj) * abs, as); TLOAD(tb, bbuf[p][jj], 64); \
        TZERO(c); TDP(c, ta, tb); TSTORE(c, cb[(jj) & 3], 64); } while (0)
    for (int p0 = 0; p0 < np; p0 += NPAN) {
        const int pn = np - p0 < NPAN ? np - p0 : NPAN;
        for (int64_t k0 = 0; k0 < nbk; k0 += KC) {
            const int kc = nbk - k0 < KC ? (int)(nbk - k0) : KC;
            for (int p = 0; p < pn; p++) {
                if (X8) {
                    const uint8_t *g0 = X8 + ((size_t)((r0 + 16 * (p0 + p)) / 8) * (size_t)nbk + (size_t)k0) * X8_Q80;
                    q80x8_prepare(g0, g0 + (size_t)nbk * X8_Q80, kc, bbuf[p], dwb[p]);
                } else {
                    for (int j = 0; j < kc; j++) {
                        for (int r = 0; r < 16; r++)
                            small_unpack(type, W + (size_t)(r0 + 16 * (p0 + p) + r) * ws + (size_t)(k0 + j) * wbs,
                                         tmp + 32 * r, &dwb[p][j][r], &mwb[p][j][r]);
                        to_b_layout(tmp, bbuf[p][j]);
                    }
                }
            }
            for (int t = 0; t < nt; t++) {
                const uint8_t *at = A + (size_t)(16 * t) * as;
                for (int j = 0; j < kc; j++)
                    for (int m = 0; m < 16; m++) {
                        const uint8_t *ab = at + (size_t)m * as + (size_t)(k0 + j) * abs;
                        da[j][m] = h2f(ab);
                        sa[j][m] = hm ? h2f(ab + 2) : 0;
                    }
                for (int p = 0; p < pn; p++) {
                    float *y = Y + (size_t)(16 * t) * (size_t)ldy + 16 * (p0 + p);
                    /* 16 named accumulators: an array of them is kept in
                     * memory by gcc (a load and a store per row and block) */
#define R16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define RDECL(m) __m512 v##m = k0 ? _mm512_loadu_ps(y + (size_t)(m) * (size_t)ldy) : _mm512_setzero_ps();
#define RC(m) _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cbf + 16 * (m))))
#define RDD(m) _mm512_mul_ps(dw, _mm512_set1_ps(daf[m]))
/* the reference's sum + (float)isum * (d * da), with a min
 * sum + ((d * da) * (float)isum + m * s) */
#define RFIN(m) v##m = _mm512_add_ps(v##m, _mm512_mul_ps(RC(m), RDD(m)));
#define RFINM(m) v##m = _mm512_add_ps(v##m, _mm512_add_ps(_mm512_mul_ps(RDD(m), RC(m)), \
                                                        _mm512_mul_ps(mw, _mm512_set1_ps(saf[m]))));
#define RSTORE(m) _mm512_storeu_ps(y + (size_t)(m) * (size_t)ldy, v##m);
                    R16(RDECL)
                    const uint8_t *a0 = at + (size_t)k0 * abs + aq;
                    /* software-pipelined: block j's product is read back
                     * AMX_LAG blocks after its tile store (a tile store's
                     * bytes are not forwarded to vector loads at once) */
#define RLOOP(FIN) \
                    for (int j = 0; j < kc + AMX_LAG; j++) { \
                        if (j < kc) { \
                            if (j & 1) SMALL_STEP(1, 3, 5, j); \
                            else SMALL_STEP(0, 2, 4, j); \
                        } \
                        const int f = j - AMX_LAG; \
                        if (f < 0) continue; \
                        const int32_t *cbf = cb[f & 3]; \
                        const float *daf = da[f], *saf = sa[f]; \
                        const __m512 dw = _mm512_load_ps(dwb[p][f]), mw = _mm512_load_ps(mwb[p][f]); \
                        (void)saf; (void)mw; \
                        R16(FIN) \
                    }
                    if (hm) { RLOOP(RFINM) }
                    else { RLOOP(RFIN) }
                    R16(RSTORE)
#undef R16
#undef RDECL
#undef RC
#undef RDD
#undef RFIN
#undef RFINM
#undef RSTORE
#undef RLOOP
                }
            }
        }
    }
}


/* ---- K-quants (q4_K, q6_K) against q8_K activations ----
 * The reference per super-block: isum = sum_k s[k] * dot_k over groups of
 * 16 values (q4_K's scale covers 32: its groups pair up), msum = sum_k
 * m[k] * bsums[k], then sum = sum + a.d * (fd * (float)isum - fm *
 * (float)msum). Tiles give dot_k for a group (K = 32 for q4_K, 16 for
 * q6_K); isum and msum are exact int32 (vpmulld, vpdpwssd), the float
 * expression is the reference's, lane n = weight row n. */
#define KCK 4            /* super-blocks per K chunk */

typedef struct kpanel {
    int8_t b[KCK][256 * 16] __attribute__((aligned(64)));   /* B tiles, group after group */
    int32_t sc[KCK][16][16] __attribute__((aligned(64)));   /* [sb][group][n] */
    int32_t mp[KCK][8][16] __attribute__((aligned(64)));    /* [sb][pair][n]: m[2p] | m[2p+1] << 16 */
    float fd[KCK][16] __attribute__((aligned(64)));
    float fm[KCK][16] __attribute__((aligned(64)));
} kpanel;

/* One weight row's super-block -> 256 values (as int8), 16 scales and
 * mins per 16 values, fd and fm: as the reference's unpack_k. */
static void k_unpack(uint32_t type, const uint8_t *b, int8_t *q, int32_t *s, int32_t *mn, float *fd, float *fm)
{
    if (type == QT_Q4_K || type == QT_Q5_K) {
        /* q5_K: q4_K's header, then 32 bytes of fifth bits before the nibbles */
        const int five = type == QT_Q5_K;
        const qt_block_q4_K *x = (const void *)b;
        const uint8_t *qs = five ? ((const qt_block_q5_K *)(const void *)b)->qs : x->qs;
        *fd = h2f(b);
        *fm = h2f(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            if (j < 4) { sc = x->scales[j] & 63; m = x->scales[j + 4] & 63; }
            else {
                sc = (x->scales[j + 4] & 0xF) | ((x->scales[j - 4] >> 6) << 4);
                m = (x->scales[j + 4] >> 4) | ((x->scales[j] >> 6) << 4);
            }
            s[2 * j] = s[2 * j + 1] = sc;
            mn[2 * j] = mn[2 * j + 1] = m;
        }
        const __m256i lo = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(const void *)
                                                     ((const qt_block_q5_K *)(const void *)b)->qh)
                                : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * j));
            /* bit 2j of qh[l] -> bit 4 of value 64j + l, bit 2j + 1 -> of 64j + 32 + l */
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4);
            _mm256_storeu_si256((__m256i *)(void *)(q + 64 * j), _mm256_or_si256(_mm256_and_si256(v, lo), h0));
            _mm256_storeu_si256((__m256i *)(void *)(q + 64 * j + 32),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo), h1));
        }
        return;
    }
    const qt_block_q6_K *x = (const void *)b;
    *fd = *fm = h2f((const uint8_t *)&x->d);
    for (int k = 0; k < 16; k++) { s[k] = x->scales[k]; mn[k] = 32 * s[k]; }
    const __m256i lo = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        int8_t *o = q + 128 * h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
        const __m256i hh = _mm256_loadu_si256((const __m256i *)(const void *)qh);
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(hh, three), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 2), three), 4);
        const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 4), three), 4);
        const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 6), three), 4);
        _mm256_storeu_si256((__m256i *)(void *)o, _mm256_or_si256(_mm256_and_si256(l0, lo), h0));
        _mm256_storeu_si256((__m256i *)(void *)(o + 32), _mm256_or_si256(_mm256_and_si256(l1, lo), h1));
        _mm256_storeu_si256((__m256i *)(void *)(o + 64),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo), h2));
        _mm256_storeu_si256((__m256i *)(void *)(o + 96),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo), h3));
    }
}

/* 16 rows x 256 int8 (row-major) -> B tiles of G-value groups:
 * out[g * 16 G + k4 * 64 + 4 n + t] = in[n * 256 + G g + 4 k4 + t]. */
static void k_to_b(const int8_t *in, int8_t *out, int G)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(256));
    for (int c = 0; c < 64; c++)   /* 64 dword columns: group c / (G / 4), k4 c % (G / 4) */
        _mm512_storeu_si512((void *)(out + 64 * c), _mm512_i32gather_epi32(idx, in + 4 * c, 1));
    (void)G;   /* the dword columns of consecutive groups are consecutive: one layout serves G = 16, 32 */
}

static void k_prepare(uint32_t type, const uint8_t *W, size_t ws, int64_t r, int64_t i0, int kc, kpanel *P)
{
    const size_t bs = type == QT_Q4_K ? sizeof(qt_block_q4_K)
                    : type == QT_Q5_K ? sizeof(qt_block_q5_K) : sizeof(qt_block_q6_K);
    int8_t tmp[16 * 256] __attribute__((aligned(64)));
    for (int i = 0; i < kc; i++) {
        for (int n = 0; n < 16; n++) {
            int32_t s[16], mn[16];
            k_unpack(type, W + (size_t)(r + n) * ws + (size_t)(i0 + i) * bs, tmp + 256 * n, s, mn,
                     &P->fd[i][n], &P->fm[i][n]);
            for (int k = 0; k < 16; k++) P->sc[i][k][n] = s[k];
            for (int p = 0; p < 8; p++)
                P->mp[i][p][n] = (int32_t)(((uint32_t)mn[2 * p] & 0xFFFF) | ((uint32_t)mn[2 * p + 1] << 16));
        }
        k_to_b(tmp, P->b[i], 0);
    }
}

/* k_prepare from q4_K's 8-row groups (x8.c's layout, 1,184 bytes a group
 * and super-block; g0 and g1 the panel's two groups at super-block i0):
 * the 32 bytes of chunk c's step h hold, 4 a row, the values 32c + 4h + j
 * in their low nibbles and 32c + 16 + 4h + j in their high ones, so two
 * groups' bytes side by side, masked, are B rows h and 4 + h of chunk c. */
static void kx8_prepare(const uint8_t *g0, const uint8_t *g1, int kc, kpanel *P)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), lo16 = _mm512_set1_epi32(0xFFFF);
    for (int i = 0; i < kc; i++, g0 += X8_Q4K, g1 += X8_Q4K) {
        for (int c = 0; c < 8; c++) {
            for (int h = 0; h < 4; h++) {
                const __m512i z = x8_pair(g0 + 32 * (4 * c + h), g1 + 32 * (4 * c + h));
                _mm512_store_si512((void *)(P->b[i] + 512 * c + 64 * h), _mm512_and_si512(z, m4));
                _mm512_store_si512((void *)(P->b[i] + 512 * c + 64 * (4 + h)),
                                   _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
            }
            uint8_t sc[16];
            memcpy(sc, g0 + 1024 + 8 * c, 8);
            memcpy(sc + 8, g1 + 1024 + 8 * c, 8);
            const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)sc));
            _mm512_store_si512((void *)P->sc[i][2 * c], s);
            _mm512_store_si512((void *)P->sc[i][2 * c + 1], s);
        }
        /* mins: bytes 2r + e of pair p are row r's of chunk 2p + e; mp[c]
         * holds chunk c's twice (against the activation's two 16-value sums) */
        for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(g0 + 1088 + 16 * q))),
                _mm_loadu_si128((const __m128i *)(const void *)(g1 + 1088 + 16 * q)), 1));
            const __m512i e0 = _mm512_and_si512(v, lo16), e1 = _mm512_srli_epi32(v, 16);
            _mm512_store_si512((void *)P->mp[i][2 * q], _mm512_or_si512(e0, _mm512_slli_epi32(e0, 16)));
            _mm512_store_si512((void *)P->mp[i][2 * q + 1], _mm512_or_si512(e1, _mm512_slli_epi32(e1, 16)));
        }
        _mm512_store_ps(P->fd[i], x8_pair_ph(g0 + 1152, g1 + 1152));
        _mm512_store_ps(P->fm[i], x8_pair_ph(g0 + 1168, g1 + 1168));
    }
}

/* G = 32: q4_K (scale per 32 values, group k's scale at sc[2k]);
 * G = 16: q6_K. X8: q4_K's 8-row groups instead of W (kx8_prepare). */
static void amx_kquant(uint32_t type, int64_t n, const uint8_t *W, size_t ws, const uint8_t *X8, int64_t r0, int np,
                       const uint8_t *A, size_t as, int nt, float *Y, int64_t ldy)
{
    const int G = type == QT_Q6_K ? 16 : 32, ng = 256 / G;
    const size_t abs = sizeof(qt_block_q8_K);
    const int64_t nsb = n / 256;
    kpanel P[NPAN];   /* 92 KiB */
    int32_t cb[4][256] __attribute__((aligned(64)));
#define KQ_STEP(c, ta, tb, gg) do { TLOAD(ta, a0 + G * (gg), as); TLOAD(tb, K->b[i] + 16 * G * (gg), 64); \
        TZERO(c); TDP(c, ta, tb); TSTORE(c, cb[(gg) & 3], 64); } while (0)
    for (int p0 = 0; p0 < np; p0 += NPAN) {
        const int pn = np - p0 < NPAN ? np - p0 : NPAN;
        for (int64_t i0 = 0; i0 < nsb; i0 += KCK) {
            const int kc = nsb - i0 < KCK ? (int)(nsb - i0) : KCK;
            for (int p = 0; p < pn; p++) {
                if (X8) {
                    const uint8_t *g0 = X8 + ((size_t)((r0 + 16 * (p0 + p)) / 8) * (size_t)nsb + (size_t)i0) * X8_Q4K;
                    kx8_prepare(g0, g0 + (size_t)nsb * X8_Q4K, kc, &P[p]);
                } else {
                    k_prepare(type, W, ws, r0 + 16 * (p0 + p), i0, kc, &P[p]);
                }
            }
            for (int t = 0; t < nt; t++) {
                const uint8_t *at = A + (size_t)(16 * t) * as;
                for (int p = 0; p < pn; p++) {
                    const kpanel *K = &P[p];
                    float *y = Y + (size_t)(16 * t) * (size_t)ldy + 16 * (p0 + p);
                    for (int i = 0; i < kc; i++) {
                        const uint8_t *a0 = at + (size_t)(i0 + i) * abs + 4;
                        __m512i is[16];
                        for (int m = 0; m < 16; m++) is[m] = _mm512_setzero_si512();
                        /* pipelined as amx_small */
                        for (int g = 0; g < ng + AMX_LAG; g++) {
                            if (g < ng) {
                                if (g & 1) KQ_STEP(1, 3, 5, g);
                                else KQ_STEP(0, 2, 4, g);
                            }
                            const int f = g - AMX_LAG;
                            if (f < 0) continue;
                            const __m512i sv = _mm512_load_si512((const void *)K->sc[i][G == 32 ? 2 * f : f]);
                            for (int m = 0; m < 16; m++)
                                is[m] = _mm512_add_epi32(is[m], _mm512_mullo_epi32(
                                    _mm512_load_si512((const void *)(cb[f & 3] + 16 * m)), sv));
                        }
                        const __m512 fd = _mm512_load_ps(K->fd[i]), fm = _mm512_load_ps(K->fm[i]);
                        for (int m = 0; m < 16; m++) {
                            const uint8_t *ab = at + (size_t)m * as + (size_t)(i0 + i) * abs;
                            __m512i ms = _mm512_setzero_si512();
                            for (int q = 0; q < 8; q++) {
                                int32_t bp;
                                memcpy(&bp, ab + 260 + 4 * q, 4);
                                ms = _mm512_dpwssd_epi32(ms, _mm512_load_si512((const void *)K->mp[i][q]),
                                                         _mm512_set1_epi32(bp));
                            }
                            float ad;
                            memcpy(&ad, ab, 4);
                            const __m512 f = _mm512_mul_ps(_mm512_set1_ps(ad),
                                _mm512_sub_ps(_mm512_mul_ps(fd, _mm512_cvtepi32_ps(is[m])),
                                              _mm512_mul_ps(fm, _mm512_cvtepi32_ps(ms))));
                            float *yr = y + (size_t)m * (size_t)ldy;
                            const __m512 prev = (i0 + i) ? _mm512_loadu_ps(yr) : _mm512_setzero_ps();
                            _mm512_storeu_ps(yr, _mm512_add_ps(prev, f));
                        }
                    }
                }
            }
        }
    }
}

static void amx_run(uint32_t wtype, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int np,
                    const uint8_t *A, size_t as, int nt, float *Y, int64_t ldy)
{
    if (small_wbytes(wtype)) amx_small(wtype, n, W, ws, NULL, r0, np, A, as, nt, Y, ldy);
    else amx_kquant(wtype, n, W, ws, NULL, r0, np, A, as, nt, Y, ldy);
}

/* Per-thread scratch for padded tiles, kept between calls (MoE layers make
 * many small calls) and freed when the thread ends. */
static pthread_key_t pad_key;
static pthread_once_t pad_once = PTHREAD_ONCE_INIT;
typedef struct pad_buf { size_t cap; uint8_t *p; } pad_buf;

static void pad_free(void *v)
{
    pad_buf *b = v;
    if (b) free(b->p);
    free(b);
}

static void pad_key_make(void) { (void)pthread_key_create(&pad_key, pad_free); }

static uint8_t *pad_get(size_t bytes)
{
    pthread_once(&pad_once, pad_key_make);
    pad_buf *b = pthread_getspecific(pad_key);
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(pad_key, b)) { free(b); return NULL; }
    }
    if (b->cap < bytes) {
        uint8_t *p = NULL;
        if (posix_memalign((void **)&p, 64, bytes)) return NULL;
        free(b->p);
        b->p = p;
        b->cap = bytes;
    }
    return b->p;
}

/* A last tile of at least this many activation rows runs on the tiles
 * padded with zero rows (a few wasted rows cost less than the AVX-512
 * kernel); fewer go to that kernel. */
#define PAD_MIN 8

int qt_gemm_amx(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
                int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
                float *Y, int64_t ldy)
{
    const int small = small_wbytes(wtype) != 0, kq = wtype == QT_Q4_K || wtype == QT_Q5_K || wtype == QT_Q6_K;
    const int nt = nb / 16, np = (int)((r1 - r0) / PANEL), rem = nb - 16 * nt;
    const int pad = rem >= PAD_MIN;
    if (!(small || kq) || (nt == 0 && !pad) || np == 0 || n <= 0 || n % (small ? 32 : 256)) return -1;
    const uint8_t *w = W, *a = A;
    uint8_t *apad = NULL;
    float *ypad = NULL;
    if (pad) {   /* the last rows with zero rows after them, and their own output */
        const size_t ab = (16 * a_stride + 63) / 64 * 64;
        if (!(apad = pad_get(ab + sizeof(float) * 16 * PANEL * (size_t)np))) return -1;
        ypad = (float *)(void *)(apad + ab);
        memcpy(apad, a + (size_t)(16 * nt) * a_stride, (size_t)rem * a_stride);
        memset(apad + (size_t)rem * a_stride, 0, (size_t)(16 - rem) * a_stride);
    }
    tiles_config(wtype == QT_Q6_K ? 16 : 32);
    if (nt) amx_run(wtype, n, w, w_stride, r0, np, a, a_stride, nt, Y + r0, ldy);
    if (pad) amx_run(wtype, n, w, w_stride, r0, np, apad, a_stride, 1, ypad, (int64_t)PANEL * np);
    tiles_release();
    if (pad) {
        for (int m = 0; m < rem; m++)
            memcpy(Y + (size_t)(16 * nt + m) * (size_t)ldy + r0, ypad + (size_t)m * PANEL * (size_t)np,
                   sizeof(float) * PANEL * (size_t)np);
    }
    /* the rest: rows past the last whole panel, activation rows past the
     * tiles (bit-identical kernels) */
    const int ntiled = pad ? nb : 16 * nt;
    const int64_t rp = r0 + (int64_t)np * PANEL;
    if (rp < r1 && qt_gemm_avx512(wtype, n, W, w_stride, rp, r1, A, a_stride, ntiled, Y, ldy)) return -1;
    if (nb > ntiled &&
        qt_gemm_avx512(wtype, n, W, w_stride, r0, r1, a + (size_t)ntiled * a_stride, a_stride, nb - ntiled,
                       Y + (size_t)ntiled * (size_t)ldy, ldy))
        return -1;
    return 0;
}

/* q8_0 and q4_K in 8-row groups (x8.c's layouts): rows [r0, r0 + 16 np)
 * (r0 a multiple of 8) of the pack P against nt whole tiles of activation
 * rows. Two groups side by side are a panel's B tiles: copies (q8_0) or
 * masks (q4_K's nibbles) are left to prepare, no unpacking or gathers.
 * The same arithmetic as from the GGUF layout: the same bits. */
void qt_gemm_amx_x8(uint32_t wtype, int64_t n, const void *P, int64_t r0, int np, const void *A, size_t a_stride,
                    int nt, float *Y, int64_t ldy)
{
    tiles_config(32);
    if (wtype == QT_Q4_K) amx_kquant(wtype, n, NULL, 0, P, r0, np, A, a_stride, nt, Y + r0, ldy);
    else amx_small(wtype, n, NULL, 0, P, r0, np, A, a_stride, nt, Y + r0, ldy);
    tiles_release();
}

#include "engine/quant/target_pop.h"
#else
typedef int qt_amx_unused;
#endif
