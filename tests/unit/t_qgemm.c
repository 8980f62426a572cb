/* t_qgemm.c — every SIMD gemm against the scalar reference, and the
 * reference against a double-precision dot of the dequantized operands.
 *
 * Weights are random block bytes (so every field takes arbitrary values:
 * 6-bit scales, signed scales of -128, q8 weights of -128) with the fp16
 * scale fields forced to small finite values; activations are random floats
 * quantized with qt_quantize_row.
 *
 * Tolerances, relative to mag = sum |w_i * a_i| of the dequantized operands:
 *  - K-quants and small blocks: SIMD == reference bit for bit (same int32
 *    sums per block or super-block, same float expression in the same
 *    order; holds as long as the compiler does not fuse a*b+c into FMAs: ISO
 *    C mode, as the Makefile builds, or clang with the pragma in the
 *    sources).
 *  - float weights: |simd - ref| <= 2e-6 * mag (float lanes summed in
 *    another order; ~n/8 roundings of 6e-8 each at worst).
 *  - reference vs double: <= 1e-5 * mag, plus for q4_1/q5_1 the fp16
 *    rounding of the activation block sums s (2^-11 relative) times |m|. */
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <stdint.h>
#include <stdlib.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frand(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f; }

static const uint32_t wtypes[] = { QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                                   QT_Q8_0, QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K,
                                   QT_IQ4_NL, QT_MXFP4, QT_IQ4_XS, QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S,
                                   QT_IQ3_XXS, QT_IQ3_S, QT_IQ1_S };

static void fp16_fields(uint32_t type, int off[2], int *cnt)
{
    *cnt = 1; off[0] = 0; off[1] = 0;
    switch (type) {
    case QT_Q4_1: case QT_Q5_1: case QT_Q4_K: case QT_Q5_K: *cnt = 2; off[1] = 2; break;
    case QT_Q2_K: *cnt = 2; off[0] = 80; off[1] = 82; break;
    case QT_Q3_K: off[0] = 108; break;
    case QT_Q6_K: off[0] = 208; break;
    default: break;
    }
}

static void make_weights(uint32_t type, uint8_t *w, int64_t rows, int64_t n)
{
    const qt_traits *t = qt_get(type);
    const size_t rs = qt_row_size(type, n);
    if (type == QT_F32 || type == QT_F16 || type == QT_BF16) {
        for (int64_t i = 0; i < rows * n; i++) {
            float f = frand();
            if (type == QT_F32) memcpy(w + 4 * i, &f, 4);
            else {
                uint16_t h = type == QT_F16 ? qt_fp32_to_fp16(f) : qt_fp32_to_bf16(f);
                memcpy(w + 2 * i, &h, 2);
            }
        }
        return;
    }
    for (size_t i = 0; i < rs * (size_t)rows; i++) w[i] = (uint8_t)rnd();
    if (type == QT_MXFP4) {   /* E8M0 scales 2^-12 .. 2^3, and the subnormal 0 and 1 */
        for (size_t b = 0; b < rs * (size_t)rows / t->type_size; b++)
            w[b * t->type_size] = (uint8_t)((rnd() & 31) == 0 ? rnd() & 1 : 116 + rnd() % 16);
        return;
    }
    int off[2], cnt;
    fp16_fields(type, off, &cnt);
    for (size_t b = 0; b < rs * (size_t)rows / t->type_size; b++)
        for (int f = 0; f < cnt; f++) {
            float v = (0.2f + 0.8f * (float)(rnd() & 1023) / 1024.f) * (t->blck == 256 ? 0.01f : 0.05f);
            if (f == 1 && t->blck == 32 && (rnd() & 1)) v = -v;   /* q4_1/q5_1 min may be negative */
            uint16_t h = qt_fp32_to_fp16(v);
            memcpy(w + b * t->type_size + off[f], &h, 2);
        }
}

/* Double-precision dot of dequantized operands, its magnitude and the
 * allowance for the fp16 rounding of q8_1 block sums. */
static void float_dot(uint32_t wt, int64_t n, const uint8_t *w, const uint8_t *a,
                      double *dot, double *mag, double *s_allow)
{
    float *wf = malloc((size_t)n * 4), *af = malloc((size_t)n * 4);
    const uint32_t at = qt_act_type(wt);
    qt_dequant_row(wt, w, wf, n);
    qt_dequant_row(at, a, af, n);
    double s = 0, m = 0, al = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * af[i];
        m += fabs((double)wf[i] * af[i]);
    }
    if (at == QT_Q8_1) {
        for (int64_t b = 0; b < n / 32; b++) {
            const qt_block_q8_1 *ab = (const void *)(a + b * sizeof(qt_block_q8_1));
            uint16_t hm;
            memcpy(&hm, w + b * qt_get(wt)->type_size + 2, 2);
            al += fabs((double)qt_fp16_to_fp32(hm) * qt_fp16_to_fp32(ab->s)) * (1.0 / 1024);
        }
    }
    free(wf); free(af);
    *dot = s; *mag = m; *s_allow = al;
}

static int isa_fail[4];

static void one_case(uint32_t wt, int64_t n, int64_t rows, int nb)
{
    const uint32_t at = qt_act_type(wt);
    const size_t ws = qt_row_size(wt, n), as = qt_row_size(at, n);
    uint8_t *W = malloc(ws * (size_t)rows + 64), *A = malloc(as * (size_t)nb + 64);
    float *x = malloc((size_t)n * 4);
    const int64_t ldy = rows + 3;
    float *Yr = calloc((size_t)(ldy * nb), 4), *Ys = calloc((size_t)(ldy * nb), 4);
    make_weights(wt, W, rows, n);
    for (int b = 0; b < nb; b++) {
        const float sc = (b & 1) ? 3.0f : 0.25f;
        for (int64_t i = 0; i < n; i++) x[i] = frand() * sc;
        qt_quantize_row(at, x, A + (size_t)b * as, n);
    }
    qt_gemm_ref(wt, n, W, ws, 0, rows, A, as, nb, Yr, ldy);

    /* reference vs double */
    int bad = 0;
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++) {
            double d, m, al;
            float_dot(wt, n, W + r * ws, A + b * as, &d, &m, &al);
            double e = fabs(Yr[b * ldy + r] - d);
            if (e > 1e-5 * m + al + 1e-30) bad++;
            if (m > 0 && e / m > worst) worst = e / m;
        }
    CHECKF(bad == 0, "%s n=%lld rows=%lld nb=%d: ref vs double: %d bad (worst rel %g)",
           qt_name(wt), (long long)n, (long long)rows, nb, bad, worst);

    const int exact = qt_get(wt)->blck >= 32;   /* small blocks and K-quants */
    for (int isa = QT_ISA_AVX2; isa <= QT_ISA_AMX; isa++) {
        qt_isa_set((qt_isa)isa);
        if ((int)qt_isa_get() != isa) continue;
        for (size_t i = 0; i < (size_t)(ldy * nb); i++) Ys[i] = -12345.f;
        /* two calls over split row ranges, as threads do */
        int64_t mid = rows / 2;
        qt_gemm(wt, n, W, ws, 0, mid, A, as, nb, Ys, ldy);
        qt_gemm(wt, n, W, ws, mid, rows, A, as, nb, Ys, ldy);
        bad = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int b = 0; b < nb; b++) {
                const float s = Ys[b * ldy + r], f = Yr[b * ldy + r];
                if (exact) {
                    if (memcmp(&s, &f, 4)) bad++;
                } else {
                    double d, m, al;
                    float_dot(wt, n, W + r * ws, A + b * as, &d, &m, &al);
                    if (!(fabs((double)s - f) <= 2e-6 * m + 1e-30)) bad++;
                }
            }
        /* untouched padding */
        for (int b = 0; b < nb; b++)
            for (int64_t r = rows; r < ldy; r++)
                if (Ys[b * ldy + r] != -12345.f) bad++;
        if (bad) isa_fail[isa]++;
        CHECKF(bad == 0, "%s %s n=%lld rows=%lld nb=%d: %d mismatches vs reference",
               qt_isa_name((qt_isa)isa), qt_name(wt), (long long)n, (long long)rows, nb, bad);
    }
    qt_isa_set(QT_ISA_NEON);   /* back to the best available */
    free(W); free(A); free(x); free(Yr); free(Ys);
}

static void test_all_types(void)
{
    static const int nbs[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 21 };
    static const int64_t rowss[] = { 1, 3, 17, 70 };
    for (size_t t = 0; t < sizeof wtypes / sizeof wtypes[0]; t++) {
        const uint32_t wt = wtypes[t];
        const int blck = qt_get(wt)->blck;
        int64_t ns[4];
        if (blck == 1) { ns[0] = 1; ns[1] = 7; ns[2] = 40; ns[3] = 301; }
        else if (blck == 32) { ns[0] = 32; ns[1] = 96; ns[2] = 288; ns[3] = 1024; }
        else { ns[0] = 256; ns[1] = 512; ns[2] = 1280; ns[3] = 2048; }
        for (int ni = 0; ni < 4; ni++)
            for (size_t ri = 0; ri < 4; ri++)
                for (size_t bi = 0; bi < sizeof nbs / sizeof nbs[0]; bi++) {
                    /* keep the run short: the largest n only with a few shapes */
                    if (ni == 3 && (rowss[ri] >= 17 || nbs[bi] > 4)) continue;
                    if (rowss[ri] == 70 && nbs[bi] != 1 && nbs[bi] != 5) continue;
                    one_case(wt, ns[ni], rowss[ri], nbs[bi]);
                }
    }
}

/* A result does not depend on the batch: each activation row alone, or in
 * a batch of any size at any place, gives the same bits (the engine's
 * batch invariance rests on this). */
static void test_batch_invariance(void)
{
    enum { NB = 21, ROWS = 5 };
    for (size_t t = 0; t < sizeof wtypes / sizeof wtypes[0]; t++) {
        const uint32_t wt = wtypes[t], at = qt_act_type(wt);
        const int64_t n = qt_get(wt)->blck == 1 ? 333 : qt_get(wt)->blck * (qt_get(wt)->blck == 32 ? 19 : 3);
        const size_t ws = qt_row_size(wt, n), as = qt_row_size(at, n);
        uint8_t *W = malloc(ws * ROWS), *A = malloc(as * NB);
        float *x = malloc((size_t)n * 4), Yall[NB * ROWS], Y1[NB * ROWS];
        make_weights(wt, W, ROWS, n);
        for (int b = 0; b < NB; b++) {
            for (int64_t i = 0; i < n; i++) x[i] = frand();
            qt_quantize_row(at, x, A + (size_t)b * as, n);
        }
        for (int isa = QT_ISA_SCALAR; isa <= QT_ISA_AMX; isa++) {
            qt_isa_set((qt_isa)isa);
            if ((int)qt_isa_get() != isa) continue;
            qt_gemm(wt, n, W, ws, 0, ROWS, A, as, NB, Yall, ROWS);
            int bad = 0;
            static const int sizes[] = { 1, 2, 3, 5, 8, 13 };
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
                for (int b0 = 0; b0 < NB; b0 += sizes[si]) {
                    const int g = NB - b0 < sizes[si] ? NB - b0 : sizes[si];
                    qt_gemm(wt, n, W, ws, 0, ROWS, A + (size_t)b0 * as, as, g, Y1 + b0 * ROWS, ROWS);
                }
            for (int i = 0; i < NB * ROWS; i++) bad += memcmp(&Yall[i], &Y1[i], 4) != 0;
            CHECKF(bad == 0, "%s %s: %d results depend on the batch", qt_isa_name((qt_isa)isa), qt_name(wt), bad);
        }
        qt_isa_set(QT_ISA_NEON);
        free(W); free(A); free(x);
    }
}

/* Small blocks: every nb from 1 to 20 (each tile height and the remainders
 * of several activation groups), row ranges that start and end inside an
 * 8-row tile, in split calls as threads make them: equal to the reference
 * bit for bit, so also to every other nb. */
static void test_small_every_nb(void)
{
    static const uint32_t st[] = { QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0, QT_IQ4_NL, QT_MXFP4 };
    enum { ROWS = 29, NBMAX = 20 };
    const int64_t n = 32 * 37;
    for (size_t t = 0; t < sizeof st / sizeof st[0]; t++) {
        const uint32_t wt = st[t], at = qt_act_type(wt);
        const size_t ws = qt_row_size(wt, n), as = qt_row_size(at, n);
        uint8_t *W = malloc(ws * ROWS), *A = malloc(as * NBMAX);
        float *x = malloc((size_t)n * 4), *Yr = malloc(sizeof(float) * ROWS * NBMAX);
        float *Ys = malloc(sizeof(float) * ROWS * NBMAX);
        make_weights(wt, W, ROWS, n);
        for (int b = 0; b < NBMAX; b++) {
            for (int64_t i = 0; i < n; i++) x[i] = frand() * ((b % 3) ? 1.0f : 7.0f);
            qt_quantize_row(at, x, A + (size_t)b * as, n);
        }
        qt_gemm_ref(wt, n, W, ws, 0, ROWS, A, as, NBMAX, Yr, ROWS);
        for (int isa = QT_ISA_AVX2; isa <= QT_ISA_AMX; isa++) {
            qt_isa_set((qt_isa)isa);
            if ((int)qt_isa_get() != isa) continue;
            int bad = 0;
            for (int nb = 1; nb <= NBMAX; nb++) {
                /* a batch of nb rows starting at row nb % 3 of the activations */
                const int b0 = nb + nb % 3 <= NBMAX ? nb % 3 : 0;
                for (int i = 0; i < ROWS * NBMAX; i++) Ys[i] = -1.f;
                static const int64_t cuts[] = { 0, 3, 11, 12, 27, ROWS };
                for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
                    qt_gemm(wt, n, W, ws, cuts[c], cuts[c + 1], A + (size_t)b0 * as, as, nb, Ys, ROWS);
                for (int b = 0; b < nb; b++)
                    for (int r = 0; r < ROWS; r++)
                        bad += memcmp(&Ys[b * ROWS + r], &Yr[(b0 + b) * ROWS + r], 4) != 0;
            }
            CHECKF(bad == 0, "%s %s: %d results differ from the reference at nb 1..20",
                   qt_isa_name((qt_isa)isa), qt_name(wt), bad);
        }
        qt_isa_set(QT_ISA_NEON);
        free(W); free(A); free(x); free(Yr); free(Ys);
    }
}

/* rows longer than one column chunk of the small-block kernels (10240 values
 * with AVX-512, 40960 with AVX2) */
static void test_long_rows(void)
{
    one_case(QT_Q8_0, 32768 + 64, 3, 2);
    one_case(QT_Q4_1, 2 * 32768 + 32 * 9, 2, 9);
    one_case(QT_Q4_0, 20480 + 32, 17, 11);   /* chunks, several activation groups */
    one_case(QT_Q4_K, 32768 + 512, 2, 3);
    one_case(QT_IQ4_NL, 32768 + 96, 9, 5);
    one_case(QT_MXFP4, 2 * 32768 + 32 * 3, 3, 17);
    one_case(QT_IQ4_XS, 32768 + 256, 2, 3);
}

/* Shapes for the AMX tiles (16 x 16 outputs, 32-block K chunks): whole,
 * padded and partial tiles of activation rows and of weight rows, K past one chunk,
 * row ranges that start off a panel (one_case splits the rows in two). */
static void test_tiles(void)
{
    static const uint32_t types[] = { QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_IQ4_NL, QT_MXFP4 };
    static const int nbs[] = { 16, 17, 32, 47, 12, 24 };   /* 12, 24, 47: a padded last tile */
    static const int64_t rowss[] = { 32, 34, 80 };
    static const int64_t ns[] = { 96, 32 * 33, 32 * 70 };
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t ni = 0; ni < 3; ni++)
            for (size_t ri = 0; ri < 3; ri++)
                for (size_t bi = 0; bi < 6; bi++) {
                    if (ni == 2 && (ri != 2 || bi > 1)) continue;
                    if (t >= 2 && (ni == 1 || bi == 2)) continue;   /* fewer shapes for the rarer types */
                    one_case(types[t], ns[ni], rowss[ri], nbs[bi]);
                }
    /* K-quants: K chunks of 4 super-blocks */
    static const uint32_t ktypes[] = { QT_Q4_K, QT_Q6_K, QT_Q5_K };
    static const int64_t kns[] = { 256, 256 * 5, 256 * 9 };
    for (size_t t = 0; t < 3; t++)
        for (size_t ni = 0; ni < 3; ni++)
            for (size_t ri = 0; ri < 3; ri++)
                for (size_t bi = 0; bi < 6; bi++) {
                    if (ni == 2 && (ri != 2 || bi > 1)) continue;
                    one_case(ktypes[t], kns[ni], rowss[ri], nbs[bi]);
                }
}

static void test_isa(void)
{
    qt_init();
    qt_isa best = qt_isa_get();
    fprintf(stderr, "best ISA: %s\n", qt_isa_name(best));
    qt_isa_set(QT_ISA_SCALAR);
    CHECK(qt_isa_get() == QT_ISA_SCALAR);
    qt_isa_set(QT_ISA_NEON);
    CHECK(qt_isa_get() == best);
#if defined(__x86_64__)
    CHECK(best != QT_ISA_NEON);
#endif
}

static void test_unsupported(void)
{
    /* unknown and activation-only weight types: no crash (the loader rejects them first) */
    float y = 7.f;
    uint8_t buf[512] = { 0 };
    qt_gemm(29, 256, buf, 0, 0, 1, buf, 0, 1, &y, 1);
    qt_gemm(QT_Q8_K, 256, buf, 0, 0, 1, buf, 0, 1, &y, 1);
    CHECK(qt_vec_dot_ref(29, 256, buf, buf) == 0.0f);
}

/* Decode (nb = 1) of K-quants runs in tiles of 4 weight rows: row ranges
 * that start and end off a tile boundary (the rows left over take the
 * one-row path), rows of 1, 5 and 9 super-blocks, must give the reference's
 * bits in every row and leave the rows outside the range alone. */
static void test_decode_tiles(void)
{
    static const uint32_t kt[] = { QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_IQ2_XXS,
                                   QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_IQ1_S };
    enum { ROWS = 19 };
    for (size_t t = 0; t < sizeof kt / sizeof kt[0]; t++)
        for (int64_t nsb = 1; nsb <= 9; nsb += 4) {
            const uint32_t wt = kt[t], at = qt_act_type(wt);
            const int64_t n = 256 * nsb;
            const size_t ws = qt_row_size(wt, n), as = qt_row_size(at, n);
            uint8_t *W = malloc(ws * ROWS), *A = malloc(as);
            float *x = malloc((size_t)n * 4), Yr[ROWS], Y[ROWS];
            make_weights(wt, W, ROWS, n);
            for (int64_t i = 0; i < n; i++) x[i] = frand();
            qt_quantize_row(at, x, A, n);
            qt_gemm_ref(wt, n, W, ws, 0, ROWS, A, as, 1, Yr, ROWS);
            for (int isa = QT_ISA_AVX2; isa <= QT_ISA_AMX; isa++) {
                qt_isa_set((qt_isa)isa);
                if ((int)qt_isa_get() != isa) continue;
                static const int64_t rg[][2] = { { 0, ROWS }, { 1, ROWS - 2 }, { 3, 8 }, { 5, 6 } };
                for (size_t k = 0; k < sizeof rg / sizeof rg[0]; k++) {
                    for (int r = 0; r < ROWS; r++) Y[r] = -12345.f;
                    qt_gemm(wt, n, W, ws, rg[k][0], rg[k][1], A, as, 1, Y, ROWS);
                    int bad = 0;
                    for (int64_t r = 0; r < ROWS; r++) {
                        const int in = r >= rg[k][0] && r < rg[k][1];
                        if (in ? memcmp(&Y[r], &Yr[r], 4) != 0 : Y[r] != -12345.f) bad++;
                    }
                    CHECKF(bad == 0, "%s %s n=%lld rows [%lld, %lld): %d bad", qt_isa_name((qt_isa)isa),
                           qt_name(wt), (long long)n, (long long)rg[k][0], (long long)rg[k][1], bad);
                }
            }
            qt_isa_set(QT_ISA_NEON);
            free(W); free(A); free(x);
        }
}

/* K-quant batches over more than 16 activation rows, rows of 40 super-blocks */
/* Matrices in 8-row groups (qt_x8_*): the packed kernels (AVX2, and VNNI
 * where the CPU has AVX-512) against the
 * reference on the GGUF bytes, bit for bit, for every nb 1..21 (each
 * tile's passes and their remainders), widths ns (up to past L2 for the
 * larger batches), and row ranges of whole groups inside the matrix;
 * activations of both scales and one with all activation bytes at -127 /
 * 127 (q4_K's and q6_K's int16 partial sums' bound). Rows not a multiple of 8 and
 * widths of part of a block are refused. */
static void x8_case(uint32_t type, const int64_t *ns, size_t n_ns)
{
    static const int64_t rowss[] = { 8, 24, 64 };
    const uint32_t at = qt_act_type(type);
    for (size_t ni = 0; ni < n_ns; ni++)
        for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++) {
            const int64_t n = ns[ni], rows = rowss[ri];
            const int nbmax = n >= 10240 ? 9 : 21;
            const size_t ws = qt_row_size(type, n), as = qt_row_size(at, n);
            uint8_t *W = malloc(ws * (size_t)rows), *A = malloc(as * (size_t)nbmax);
            void *P = aligned_alloc(64, (qt_x8_bytes(type, n, rows) + 63) / 64 * 64);   /* (a multiple of the alignment) */
            float *x = malloc((size_t)n * 4);
            const int64_t ldy = rows + 5;
            float *Yr = malloc((size_t)(ldy * nbmax) * 4), *Yp = malloc((size_t)(ldy * nbmax) * 4);
            make_weights(type, W, rows, n);
            for (int b = 0; b < nbmax; b++) {
                const float sc = (b & 1) ? 3.0f : 0.25f;
                for (int64_t i = 0; i < n; i++) x[i] = b == 2 ? (i & 1 ? 1.0f : -1.0f) : frand() * sc;
                qt_quantize_row(at, x, A + (size_t)b * as, n);
            }
            CHECK(qt_x8_pack(type, W, ws, n, 0, 8, P) == 0 && qt_x8_pack(type, W, ws, n, 8, rows, P) == 0);   /* (in parts) */
            int bad = 0, cases = 0;
            for (int nb = 1; nb <= nbmax; nb++) {
                qt_gemm_ref(type, n, W, ws, 0, rows, A, as, nb, Yr, ldy);
                for (int part = 0; part < 2; part++) {
                    for (size_t i = 0; i < (size_t)(ldy * nb); i++) Yp[i] = -12345.f;
                    int64_t r0 = part ? 8 : 0, r1 = part ? rows - 8 : rows;
                    if (r1 <= r0) continue;
                    cases++;
                    if (qt_x8_gemm(type, n, P, r0, r1, A, as, nb, Yp, ldy)) { bad = -1; break; }
                    for (int b = 0; b < nb; b++)
                        for (int64_t r = 0; r < ldy; r++) {
                            const float got = Yp[(size_t)b * ldy + r];
                            const int in = r >= r0 && r < r1;
                            if (in ? memcmp(&got, &Yr[(size_t)b * ldy + r], 4) != 0 : got != -12345.f) bad++;
                        }
                }
            }
            CHECKF(bad == 0, "%s x8 (%s) n=%lld rows=%lld: %d mismatches in %d cases", qt_name(type),
                   qt_isa_name(qt_isa_get()), (long long)n,
                   (long long)rows, bad, cases);
            free(W); free(A); free(P); free(x); free(Yr); free(Yp);
        }
}

static void test_x8(void)
{
    static const int64_t q4k_ns[] = { 256, 512, 1536, 2816, 10240 };   /* 1 to 40 super-blocks */
    static const int64_t q80_ns[] = { 32, 96, 896, 4864 };             /* 1 to 152 blocks */
    CHECK(qt_x8_bytes(QT_Q4_K, 256, 12) == 0 && qt_x8_bytes(QT_Q4_K, 300, 8) == 0 && qt_x8_bytes(QT_Q4_K, 256, 8) == 1184);
    CHECK(qt_x8_bytes(QT_Q8_0, 32, 12) == 0 && qt_x8_bytes(QT_Q8_0, 40, 8) == 0 && qt_x8_bytes(QT_Q8_0, 64, 8) == 2 * 272);
    CHECK(qt_x8_bytes(QT_Q6_K, 256, 12) == 0 && qt_x8_bytes(QT_Q6_K, 128, 8) == 0);
    CHECK(qt_x8_bytes(QT_Q5_K, 256, 8) == 0 && qt_x8_pack(QT_Q5_K, NULL, 0, 256, 0, 8, NULL) == -1);
#if defined(__x86_64__) || defined(__i386__)
    const int avx2 = qt_isa_cpu() != QT_ISA_SCALAR;
#else
    const int avx2 = 0;
#endif
    if (!avx2) {   /* the tiles are AVX2: refused elsewhere, so the caller keeps the GGUF layout */
        uint8_t P[1184] = { 0 }, A[292] = { 0 };
        float Y[8];
        CHECK(qt_x8_gemm(QT_Q4_K, 256, P, 0, 8, A, sizeof A, 1, Y, 8) == -1);
        fprintf(stderr, "test_x8: no AVX2 here, the kernels not run\n");
        return;
    }
    /* the AVX2 tiles, then the VNNI ones where the CPU has AVX-512, then
     * q8_0's and q4_K's AMX tiles (16 activation rows and more) where it
     * has AMX */
    const qt_isa best = qt_isa_get();
    static const qt_isa isas[] = { QT_ISA_AVX2, QT_ISA_AVX512, QT_ISA_AMX };
    for (size_t k = 0; k < sizeof isas / sizeof isas[0] && isas[k] <= qt_isa_cpu(); k++) {
        const qt_isa isa = isas[k];
        qt_isa_set(isa);
        x8_case(QT_Q4_K, q4k_ns, sizeof q4k_ns / sizeof q4k_ns[0]);
        x8_case(QT_Q8_0, q80_ns, sizeof q80_ns / sizeof q80_ns[0]);
        /* (q6_K's tile is AVX-512's only: below it, no layout; with AMX
         * it keeps the GGUF layout, whose prompt tiles it has) */
        CHECK(qt_x8_bytes(QT_Q6_K, 256, 8) == (isa == QT_ISA_AVX512 ? 1680u : 0u));
        if (isa == QT_ISA_AVX512) x8_case(QT_Q6_K, q4k_ns, sizeof q4k_ns / sizeof q4k_ns[0]);
    }
    qt_isa_set(best);
}

static void test_kquant_long_batches(void)
{
    one_case(QT_Q4_K, 256 * 40, 5, 33);
    one_case(QT_Q6_K, 256 * 40, 3, 33);
    one_case(QT_Q3_K, 256 * 40, 3, 33);
    one_case(QT_IQ4_XS, 256 * 40, 3, 70);   /* more than one group of 64 activation rows */
    one_case(QT_IQ1_S, 256 * 8, 3, 70);
}

int main(void)
{
    RUN(test_isa);
    RUN(test_unsupported);
    RUN(test_all_types);
    RUN(test_small_every_nb);
    RUN(test_long_rows);
    RUN(test_batch_invariance);
    RUN(test_tiles);
    RUN(test_decode_tiles);
    RUN(test_kquant_long_batches);
    RUN(test_x8);
    return CHECK_DONE();
}
