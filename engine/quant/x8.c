/* x8.c — q4_K, q6_K and q8_0 matrices repacked in groups of 8 rows for the AVX2
 * and AVX-512 VNNI kernels, and for AMX's prompt tiles (q8_0 and q4_K, in
 * x86/amx.c) (qtypes.h, "Matrices in 8-row groups"): one
 * table of layouts, one pack and one batch driver over it; a type's block
 * packer and tiles are its own.
 *
 * Why: in GGUF's layout a super-block's dot with one activation row ends in
 * a horizontal sum and a float finish of its own, and its scales are spread
 * per chunk for every row: on AVX2 that instruction count, not memory,
 * bounds the kernels (~12 multiply-adds a cycle of the 32 the multipliers
 * allow). With 8 rows side by side each vector lane is a row: 4 values of
 * each of the 8 rows against 4 activation bytes broadcast, 8 such products
 * summed in int16 before one multiply by the 8 rows' scales, no horizontal
 * sums, one float finish for 8 rows. Per 256 multiply-adds a token takes 18
 * vector operations where the GGUF-layout kernel takes ~44.
 *
 * q4_K layout, per group g of 8 rows and super-block i, 1,184 bytes at
 * (g * nsb + i) * 1184:
 *   [0, 1024)     nibbles: for chunk c (values 32c..32c+31) and h in 0..3 the
 *                 32 bytes at (4c + h) * 32; byte 4r + j holds row r's value
 *                 32c + 4h + j (low nibble) and 32c + 16 + 4h + j (high)
 *   [1024, 1088)  scales: byte 8c + r = row r's 6-bit scale of chunk c
 *   [1088, 1152)  mins: byte 16p + 2r + e = row r's min of chunk 2p + e
 *   [1152, 1168)  d of rows 0..7 (f16, as in the file)
 *   [1168, 1184)  dmin of rows 0..7 (f16)
 *
 * Arithmetic: per (row, activation row, super-block) the same exact int32
 * totals as the reference (isum = sum over chunks of scale x dot, msum =
 * sum of mins x the activation's 32-value sums), then its float expression
 * sum + d_a * (d * isum - dmin * msum) lane-wise, super-blocks in order:
 * bit-identical to qt_gemm_ref on the GGUF bytes, whatever nb or the rows.
 * int16 partial sums: 8 products of 2 pairs, each |15 * 128| * 2 = 3840,
 * stay below 2^15.
 *
 * q6_K layout, per group and super-block, 1,680 bytes (the file's 8 x 210):
 *   [0, 1024)     low nibbles, as q4_K's: byte 4r + j of (4c + h) * 32 holds
 *                 row r's values 32c + 4h + j (low) and 32c + 16 + 4h + j
 *   [1024, 1536)  their high 2 bits: byte 4r + j of 1024 + 64c + 32e (e 0,
 *                 1) holds, 2 bits each from bit 0, those two values' for
 *                 h = e, then for h = e + 2
 *   [1536, 1664)  scales: byte 8k + r = row r's int8 scale of sub-block k
 *                 (values 16k..16k+15)
 *   [1664, 1680)  d of rows 0..7 (f16)
 * Arithmetic: the reference's isum = sum of scale x dot over the 16
 * sub-blocks and msum = sum of 32 x scale x the activation's sums, then
 * sum + d_a * (d * isum - d * msum): the same bits. */
#include "engine/quant/qtypes.h"

#include <string.h>

static void scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63; *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* one super-block of 8 rows (src[r]: row r's) into its 1,184 bytes. The
 * nibbles 4 bytes at a time: GGUF's byte l of chunk pair p holds value l of
 * chunk 2p (low nibble) and of chunk 2p + 1 (high); the packed byte wants
 * values i and 16 + i of one chunk, so from the words a (values 4h..4h+3)
 * and b (16 + 4h..) of the pair, chunk 2p's bytes are a's low nibbles with
 * b's as high, chunk 2p + 1's a's high nibbles moved down with b's. */
static void q4k_pack8(const uint8_t *const *src, uint8_t *o)
{
    for (int r = 0; r < 8; r++) {
        const qt_block_q4_K *b = (const qt_block_q4_K *)(const void *)src[r];
        for (int p = 0; p < 4; p++)
            for (int h = 0; h < 4; h++) {
                uint32_t a, bb;
                memcpy(&a, b->qs + 32 * p + 4 * h, 4);
                memcpy(&bb, b->qs + 32 * p + 16 + 4 * h, 4);
                const uint32_t lo = (a & 0x0F0F0F0Fu) | (bb & 0x0F0F0F0Fu) << 4;
                const uint32_t hi = (a >> 4 & 0x0F0F0F0Fu) | (bb & 0xF0F0F0F0u);
                memcpy(o + (4 * (2 * p) + h) * 32 + 4 * r, &lo, 4);
                memcpy(o + (4 * (2 * p + 1) + h) * 32 + 4 * r, &hi, 4);
            }
        for (int c = 0; c < 8; c++) {
            uint8_t sc, mn;
            scale_min(c, b->scales, &sc, &mn);
            o[1024 + 8 * c + r] = sc;
            o[1088 + 16 * (c / 2) + 2 * r + (c & 1)] = mn;
        }
        memcpy(o + 1152 + 2 * r, &b->d, 2);
        memcpy(o + 1168 + 2 * r, &b->dmin, 2);
    }
}

/* one q6_K super-block of 8 rows into its 1,680 bytes, through each row's
 * 256 values (0..63, the file's order: per 128, ql's low nibbles with qh's
 * bits 0-1, the next 32 with bits 2-3, ql's high nibbles with 4-5, 6-7) */
static void q6k_pack8(const uint8_t *const *src, uint8_t *o)
{
    for (int r = 0; r < 8; r++) {
        const qt_block_q6_K *b = (const qt_block_q6_K *)(const void *)src[r];
        uint8_t q[256];
        for (int hf = 0; hf < 2; hf++) {
            const uint8_t *ql = b->ql + 64 * hf, *qh = b->qh + 32 * hf;
            uint8_t *v = q + 128 * hf;
            for (int l = 0; l < 32; l++) {
                v[l] = (uint8_t)((ql[l] & 15) | (qh[l] & 3) << 4);
                v[l + 32] = (uint8_t)((ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4);
                v[l + 64] = (uint8_t)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4);
                v[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4);
            }
        }
        for (int c = 0; c < 8; c++)
            for (int j = 0; j < 4; j++) {
                const uint8_t *v = q + 32 * c + j;
                for (int h = 0; h < 4; h++) o[(4 * c + h) * 32 + 4 * r + j] = (uint8_t)((v[4 * h] & 15) | (v[16 + 4 * h] & 15) << 4);
                for (int e = 0; e < 2; e++)
                    o[1024 + 64 * c + 32 * e + 4 * r + j] = (uint8_t)(v[4 * e] >> 4 | (v[16 + 4 * e] >> 4) << 2 |
                                                                      (v[4 * e + 8] >> 4) << 4 | (v[16 + 4 * e + 8] >> 4) << 6);
            }
        for (int k = 0; k < 16; k++) o[1536 + 8 * k + r] = (uint8_t)b->scales[k];
        memcpy(o + 1664 + 2 * r, &b->d, 2);
    }
}

/* q8_0 layout, per group and block of 32 values 272 bytes: [0, 256) the
 * values, 32 bytes for each k in 0..7 whose byte 4r + j is row r's value
 * 4k + j; [256, 272) d of rows 0..7 (f16). The same size as the file's 8
 * blocks; no per-block transposes left for the kernel. */
static void q80_pack8(const uint8_t *const *src, uint8_t *o)
{
    for (int r = 0; r < 8; r++) {
        const qt_block_q8_0 *b = (const qt_block_q8_0 *)(const void *)src[r];
        for (int k = 0; k < 8; k++) memcpy(o + 32 * k + 4 * r, b->qs + 4 * k, 4);
        memcpy(o + 256 + 2 * r, &b->d, 2);
    }
}

/* A tile: 8 rows (group block p, nblk blocks) against T activation rows
 * a[t] (T <= the layout's tmax), the 8 results of row t to y[t]. */
typedef void x8_tile_fn(int T, const uint8_t *p, int64_t nblk, const uint8_t *const *a, float *const *y);

typedef struct x8_lay {
    uint32_t type;
    int64_t block_n;        /* values per block */
    size_t bytes;           /* per 8 rows x block */
    void (*pack8)(const uint8_t *const *src, uint8_t *o);
    x8_tile_fn *tile;       /* AVX2, or NULL (the layout is AVX-512's only) */
    int tmax;               /* activation rows it takes */
    x8_tile_fn *tile_vnni;  /* AVX-512 VNNI (vpdpbusd on 8 lanes), or NULL */
    int tmax_vnni;
    int amx;                /* has AMX prompt tiles (qt_gemm_amx_x8); without, not packed with AMX */
} x8_lay;

static x8_tile_fn q4k_tile, q80_tile, q4k_tile_vnni, q80_tile_vnni, q6k_tile_vnni;

/* whether the tiles can run: they are AVX2 (x86 with more than the scalar
 * kernels); elsewhere qt_x8_gemm refuses and the caller keeps the GGUF
 * layout */
static int x8_cpu_ok(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return qt_isa_cpu() != QT_ISA_SCALAR;
#else
    return 0;
#endif
}

static const x8_lay x8_lays[] = {
    { QT_Q4_K, 256, 1184, q4k_pack8, q4k_tile, 2, q4k_tile_vnni, 4, 1 },
    { QT_Q8_0, 32, 272, q80_pack8, q80_tile, 4, q80_tile_vnni, 8, 1 },
    { QT_Q6_K, 256, 1680, q6k_pack8, NULL, 0, q6k_tile_vnni, 4, 0 },
};

static const x8_lay *x8_find(uint32_t type)
{
    for (size_t i = 0; i < sizeof x8_lays / sizeof x8_lays[0]; i++)
        if (x8_lays[i].type == type) return &x8_lays[i];
    return NULL;
}

/* the tile of L for the CPU (qt_isa_get), and the activation rows it
 * takes; NULL where there is none */
static x8_tile_fn *x8_tile_of(const x8_lay *L, int *tmax)
{
    const qt_isa isa = qt_isa_get();
    const int vnni = (isa == QT_ISA_AVX512 || isa == QT_ISA_AMX) && L->tile_vnni;
    *tmax = vnni ? L->tmax_vnni : L->tmax;
    return x8_cpu_ok() ? (vnni ? L->tile_vnni : L->tile) : NULL;
}

size_t qt_x8_bytes(uint32_t type, int64_t n, int64_t rows)
{
    const x8_lay *L = x8_find(type);
    int tmax;
    if (!L || n <= 0 || rows <= 0 || n % L->block_n || rows % 8) return 0;
    if (!L->tile && !x8_tile_of(L, &tmax)) return 0;   /* (an AVX-512-only layout elsewhere) */
    if (qt_isa_get() == QT_ISA_AMX && !L->amx) return 0;   /* (AMX's prompt tiles read the GGUF layout) */
    return (size_t)(rows / 8) * (size_t)(n / L->block_n) * L->bytes;
}

int qt_x8_pack(uint32_t type, const void *W, size_t w_stride, int64_t n, int64_t r0, int64_t r1, void *dst)
{
    const x8_lay *L = x8_find(type);
    if (!qt_x8_bytes(type, n, 8) || r0 < 0 || r1 < r0 || r0 % 8 || r1 % 8) return -1;
    const int64_t nblk = n / L->block_n;
    const size_t sb = qt_row_size(type, L->block_n);
    for (int64_t g = r0 / 8; g < r1 / 8; g++)
        for (int64_t i = 0; i < nblk; i++) {
            const uint8_t *src[8];
            for (int r = 0; r < 8; r++) src[r] = (const uint8_t *)W + (size_t)(g * 8 + r) * w_stride + (size_t)i * sb;
            L->pack8(src, (uint8_t *)dst + (size_t)(g * nblk + i) * L->bytes);
        }
    return 0;
}

int qt_x8_gemm(uint32_t type, int64_t n, const void *P, int64_t r0, int64_t r1, const void *A, size_t a_stride,
               int nb, float *Y, int64_t ldy)
{
    const x8_lay *L = x8_find(type);
    int tmax;
    x8_tile_fn *tile = L ? x8_tile_of(L, &tmax) : NULL;
    if (!tile || n <= 0 || n % L->block_n || r0 % 8 || r1 % 8 || r1 < r0 || nb < 0) return -1;
    const int64_t nblk = n / L->block_n;
    int bs = 0;   /* activation rows done on AMX tiles */
#if defined(__x86_64__)
    if (L->amx && qt_isa_get() == QT_ISA_AMX && nb >= 16 && r1 - r0 >= 16) {
        /* whole panels of 16 rows and tiles of 16 activation rows on AMX;
         * the rows of a last half panel, and the last activation rows,
         * below (the same bits) */
        const int np = (int)((r1 - r0) / 16);
        bs = nb / 16 * 16;
        qt_gemm_amx_x8(type, n, P, r0, np, A, a_stride, nb / 16, Y, ldy);
        if (r0 + 16 * np < r1 && qt_x8_gemm(type, n, P, r0 + 16 * np, r1, A, a_stride, bs, Y, ldy)) return -1;
    }
#endif
    /* tmax activation rows against every group of the range, 16 rows at a
     * time: a group of them stays in L2 while the weight rows go by */
    for (int b0 = bs; b0 < nb; b0 += 16) {
        const int be = nb - b0 < 16 ? nb : b0 + 16;
        for (int64_t g = r0 / 8; g < r1 / 8; g++) {
            const uint8_t *p = (const uint8_t *)P + (size_t)g * (size_t)nblk * L->bytes;
            for (int b = b0; b < be; b += tmax) {
                const int T = be - b < tmax ? be - b : tmax;
                const uint8_t *a[8];
                float *y[8];
                for (int t = 0; t < T; t++) {
                    a[t] = (const uint8_t *)A + (size_t)(b + t) * a_stride;
                    y[t] = Y + (size_t)(b + t) * (size_t)ldy + (size_t)g * 8;
                }
                tile(T, p, nblk, a, y);
            }
        }
    }
    return 0;
}

#if defined(__x86_64__) || defined(__i386__)
#include "engine/quant/x86/avx2_target.h"
#include <immintrin.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define X8_AI static inline __attribute__((always_inline))
#if defined(__clang__)
#define X8_UNROLL _Pragma("unroll")
#else
#define X8_UNROLL _Pragma("GCC unroll 8")
#endif

/* a q4_K super-block's float finish for T activation rows: the mins
 * against the activations' 32-value sums, then d, dmin and the
 * activation's d as the reference orders them */
X8_AI void q4k_finish(int T, const uint8_t *p, const qt_block_q8_K *const *ab, const __m256i *acc, __m256 *sums)
{
    const __m256 fd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 1152)));
    const __m256 fm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 1168)));
    X8_UNROLL
    for (int t = 0; t < T; t++) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)ab[t]->bsums);
        const __m128i b8 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        const __m256i bb = _mm256_broadcastsi128_si256(b8);
        __m256i ms = _mm256_setzero_si256();
        X8_UNROLL
        for (int q = 0; q < 4; q++) {
            const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p + 1088 + 16 * q)));
            __m256i bq;
            switch (q) {   /* (the shuffle takes an immediate) */
            case 0: bq = _mm256_shuffle_epi32(bb, 0x00); break;
            case 1: bq = _mm256_shuffle_epi32(bb, 0x55); break;
            case 2: bq = _mm256_shuffle_epi32(bb, 0xAA); break;
            default: bq = _mm256_shuffle_epi32(bb, 0xFF); break;
            }
            ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mn, bq));
        }
        const __m256 v = _mm256_sub_ps(_mm256_mul_ps(fd, _mm256_cvtepi32_ps(acc[t])),
                                       _mm256_mul_ps(fm, _mm256_cvtepi32_ps(ms)));
        sums[t] = _mm256_add_ps(sums[t], _mm256_mul_ps(_mm256_set1_ps(ab[t]->d), v));
    }
}

/* q4_K: activation rows in q8_K, two a pass: with more, the int16 and int32
 * sums no longer fit the 16 registers (4 spilled and ran at 2/3 the
 * speed). */
#define Q4K_TILE_VNNI 0
#include "engine/quant/x86/q4k_tile.h"
#undef Q4K_TILE_VNNI

static void q4k_tile(int T, const uint8_t *p, int64_t nsb, const uint8_t *const *a, float *const *y)
{
    if (T == 2) q4k_tile_avx2(2, p, nsb, a, y);
    else q4k_tile_avx2(1, p, nsb, a, y);
}

/* a q6_K super-block's float finish for T activation rows: msum = 32 x the
 * scales against the activation's 16-value sums (pairs of sub-blocks by
 * madd), then the reference's d * isum - d * msum and the activation's d */
X8_AI void q6k_finish(int T, const uint8_t *p, const qt_block_q8_K *const *ab, const __m256i *acc, __m256 *sums)
{
    const __m256 fd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 1664)));
    __m256i sp[8];   /* row r's scales of sub-blocks 2q and 2q + 1 as two int16 */
    X8_UNROLL
    for (int q = 0; q < 8; q++) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(p + 1536 + 16 * q));
        sp[q] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, _mm_srli_si128(x, 8)));
    }
    X8_UNROLL
    for (int t = 0; t < T; t++) {
        __m256i ms = _mm256_setzero_si256();
        X8_UNROLL
        for (int q = 0; q < 8; q++) {
            int32_t bp;
            memcpy(&bp, ab[t]->bsums + 2 * q, 4);
            ms = _mm256_add_epi32(ms, _mm256_madd_epi16(sp[q], _mm256_set1_epi32(bp)));
        }
        ms = _mm256_slli_epi32(ms, 5);
        const __m256 v = _mm256_sub_ps(_mm256_mul_ps(fd, _mm256_cvtepi32_ps(acc[t])),
                                       _mm256_mul_ps(fd, _mm256_cvtepi32_ps(ms)));
        sums[t] = _mm256_add_ps(sums[t], _mm256_mul_ps(_mm256_set1_ps(ab[t]->d), v));
    }
}

/* q8_0: activation rows in q8_0, up to 4 a pass; per block the int32 dot by the sign trick (|w| times a with
 * w's sign; pairs up to 2 * 128 * 127), then the reference's
 * sum + isum * (d * d_a) lane-wise, blocks in order: the same bits. No
 * software prefetch: a group's blocks are one sequential stream that the
 * hardware prefetchers follow (one 2 KiB ahead cost 15% of decode). */
X8_AI void q80_tile_t(int T, const uint8_t *p, int64_t nblk, const uint8_t *const *a, float *const *y)
{
    const __m256i one = _mm256_set1_epi16(1);
    __m256 sums[4];
    X8_UNROLL
    for (int t = 0; t < T; t++) sums[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nblk; i++, p += 272) {
        const uint8_t *ab[4];
        X8_UNROLL
        for (int t = 0; t < T; t++) ab[t] = a[t] + (size_t)i * sizeof(qt_block_q8_0);
        __m256i acc[4];
        X8_UNROLL
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
        X8_UNROLL
        for (int k = 0; k < 8; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * k));
            const __m256i va = _mm256_sign_epi8(v, v);
            X8_UNROLL
            for (int t = 0; t < T; t++) {
                int32_t x;
                memcpy(&x, ab[t] + 2 + 4 * k, 4);
                const __m256i pr = _mm256_maddubs_epi16(va, _mm256_sign_epi8(_mm256_set1_epi32(x), v));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(pr, one));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 256)));
        X8_UNROLL
        for (int t = 0; t < T; t++) {
            uint16_t h;
            memcpy(&h, ab[t], 2);
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(h)));
            sums[t] = _mm256_add_ps(sums[t], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[t]), sc));
        }
    }
    X8_UNROLL
    for (int t = 0; t < T; t++) _mm256_storeu_ps(y[t], sums[t]);
}

static void q80_tile(int T, const uint8_t *p, int64_t nblk, const uint8_t *const *a, float *const *y)
{
    switch (T) {
    case 4: q80_tile_t(4, p, nblk, a, y); break;
    case 3: q80_tile_t(3, p, nblk, a, y); break;
    case 2: q80_tile_t(2, p, nblk, a, y); break;
    default: q80_tile_t(1, p, nblk, a, y); break;
    }
}

#include "engine/quant/target_pop.h"
#include "engine/quant/x86/avx512_target.h"

/* q4_K's tile with AVX-512 VNNI's vpdpbusd on the 8 lanes (32 vector
 * registers, so 4 activation rows a pass): the products go to int32
 * without the int16 step and its adds. Same integers, same float finish:
 * the same bits. */
#define Q4K_TILE_VNNI 1
#include "engine/quant/x86/q4k_tile.h"
#undef Q4K_TILE_VNNI

static void q4k_tile_vnni(int T, const uint8_t *p, int64_t nsb, const uint8_t *const *a, float *const *y)
{
    switch (T) {
    case 4: q4k_tile_avx512(4, p, nsb, a, y); break;
    case 3: q4k_tile_avx512(3, p, nsb, a, y); break;
    case 2: q4k_tile_avx512(2, p, nsb, a, y); break;
    default: q4k_tile_avx512(1, p, nsb, a, y); break;
    }
}

/* q6_K's tile (AVX-512 VNNI on 8 lanes; T <= 4): per chunk c the units
 * (c, h) of 32 bytes, a unit's values = its nibbles | the 2 high bits
 * from the 32 bytes of (c, h & 1) (at bits 0-3 for h < 2, 4-7 after) << 4,
 * 0..63; vpdpbusd against the activation's 4 bytes into the dots of
 * sub-blocks 2c (low nibbles) and 2c + 1 (high), then vpmulld by their
 * scales (a sub-block's 16 products reach 16 x 63 x 128, past int16), and
 * q6k_finish: the reference's integers and float expression, the same
 * bits. A group's super-block is 1,680 bytes, so only 16-byte aligned:
 * unaligned loads. On AVX2 (maddubs into int16, two steps at a time) the
 * tile lost to the GGUF-layout kernel at one row (docs/benchmarks.md),
 * so q6_K keeps that layout there. */
X8_AI void q6k_tile_avx512(int T, const uint8_t *p, int64_t nsb, const uint8_t *const *a, float *const *y)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3f = _mm256_set1_epi8(0x3F);
    __m256 sums[4];
    X8_UNROLL
    for (int t = 0; t < T; t++) sums[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++, p += 1680) {
        _mm_prefetch((const char *)p + 4 * 1680 + 1536, _MM_HINT_T0);
        _mm_prefetch((const char *)p + 4 * 1680 + 1600, _MM_HINT_T0);
        _mm_prefetch((const char *)p + 4 * 1680 + 1664, _MM_HINT_T0);
        /* (every line of the group's super-block 4 ahead, as q4_K's) */
        const qt_block_q8_K *ab[4];
        X8_UNROLL
        for (int t = 0; t < T; t++) ab[t] = (const qt_block_q8_K *)(const void *)a[t] + i;
        __m256i acc[4];
        X8_UNROLL
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
        X8_UNROLL
        for (int c = 0; c < 8; c++) {
            _mm_prefetch((const char *)p + 4 * 1680 + 128 * c, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 4 * 1680 + 128 * c + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 4 * 1680 + 1024 + 64 * c, _MM_HINT_T0);
            __m256i lo[4], hi[4];   /* sub-blocks 2c and 2c + 1: dots */
            X8_UNROLL
            for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_si256();
            X8_UNROLL
            for (int h = 0; h < 4; h++) {
                const __m256i n = _mm256_loadu_si256((const __m256i *)(const void *)(p + (4 * c + h) * 32));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)(p + 1024 + 64 * c + 32 * (h & 1)));
                /* (bits 0-3 from the nibbles, 4-7 from the shifted high
                 * bits: one ternary select, 0xE4 = C ? A : B, then the
                 * value's 6 bits) */
                const __m256i bl = h < 2 ? _mm256_slli_epi16(hb, 4) : hb;
                const __m256i bh = h < 2 ? _mm256_slli_epi16(hb, 2) : _mm256_srli_epi16(hb, 2);
                const __m256i wl = _mm256_and_si256(_mm256_ternarylogic_epi32(n, bl, m4, 0xE4), m3f);
                const __m256i wh = _mm256_and_si256(_mm256_ternarylogic_epi32(_mm256_srli_epi16(n, 4), bh, m4, 0xE4), m3f);
                X8_UNROLL
                for (int t = 0; t < T; t++) {
                    int32_t l, u;
                    memcpy(&l, ab[t]->qs + 32 * c + 4 * h, 4);
                    memcpy(&u, ab[t]->qs + 32 * c + 16 + 4 * h, 4);
                    lo[t] = _mm256_dpbusd_epi32(lo[t], wl, _mm256_set1_epi32(l));
                    hi[t] = _mm256_dpbusd_epi32(hi[t], wh, _mm256_set1_epi32(u));
                }
            }
            const __m256i sl = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + 1536 + 16 * c)));
            const __m256i sh = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + 1544 + 16 * c)));
            X8_UNROLL
            for (int t = 0; t < T; t++)
                acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(_mm256_mullo_epi32(lo[t], sl), _mm256_mullo_epi32(hi[t], sh)));
        }
        q6k_finish(T, p, ab, acc, sums);
    }
    X8_UNROLL
    for (int t = 0; t < T; t++) _mm256_storeu_ps(y[t], sums[t]);
}


static void q6k_tile_vnni(int T, const uint8_t *p, int64_t nsb, const uint8_t *const *a, float *const *y)
{
    switch (T) {
    case 4: q6k_tile_avx512(4, p, nsb, a, y); break;
    case 3: q6k_tile_avx512(3, p, nsb, a, y); break;
    case 2: q6k_tile_avx512(2, p, nsb, a, y); break;
    default: q6k_tile_avx512(1, p, nsb, a, y); break;
    }
}

/* q8_0's tile with AVX-512 VNNI on 16 lanes: a 64-byte load holds two of a
 * block's 4-value steps for the 8 rows (lanes 0-7 values 8k..8k+3, lanes
 * 8-15 values 8k+4..8k+7), met by the activation's dwords 2k and 2k + 1
 * broadcast to the two halves; vpdpbusd of |w| against a with w's sign
 * (the sign trick: the exact int32 dot, as q80_tile's), the halves added,
 * then the reference's sum + isum * (d * d_a) lane-wise, blocks in order:
 * the same bits. Half the multiply-add instructions of q80_tile's 8 lanes
 * and none of its int16 steps. Up to 8 activation rows a pass. */
X8_AI void q80_tile_vnni_t(int T, const uint8_t *p, int64_t nblk, const uint8_t *const *a, float *const *y)
{
    __m256 sums[8];
    X8_UNROLL
    for (int t = 0; t < T; t++) sums[t] = _mm256_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t i = 0; i < nblk; i++, p += 272) {
        /* (a group's blocks are one stream, which the hardware follows
         * alone at one row; with more rows the tile computes longer per
         * byte and the stream falls behind (nb = 4: 14 GB/s a thread
         * without, 20 with): every line 4 blocks ahead) */
        {
            X8_UNROLL
            for (int l = 0; l < 5; l++) _mm_prefetch((const char *)p + 4 * 272 + 64 * l, _MM_HINT_T0);
        }
        __m512i wa[4];
        __mmask64 neg[4];
        X8_UNROLL
        for (int k = 0; k < 4; k++) {
            const __m512i w = _mm512_loadu_si512((const void *)(p + 64 * k));
            wa[k] = _mm512_abs_epi8(w);
            neg[k] = _mm512_movepi8_mask(w);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 256)));
        X8_UNROLL
        for (int t = 0; t < T; t++) {
            const uint8_t *ab = a[t] + (size_t)i * sizeof(qt_block_q8_0);
            __m512i acc = zero;
            X8_UNROLL
            for (int k = 0; k < 4; k++) {
                int32_t x0, x1;
                memcpy(&x0, ab + 2 + 8 * k, 4);
                memcpy(&x1, ab + 6 + 8 * k, 4);
                __m512i av = _mm512_mask_set1_epi32(_mm512_set1_epi32(x0), 0xFF00, x1);
                av = _mm512_mask_sub_epi8(av, neg[k], zero, av);
                acc = _mm512_dpbusd_epi32(acc, wa[k], av);
            }
            const __m256i is = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
            uint16_t h;
            memcpy(&h, ab, 2);
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(h)));
            sums[t] = _mm256_add_ps(sums[t], _mm256_mul_ps(_mm256_cvtepi32_ps(is), sc));
        }
    }
    X8_UNROLL
    for (int t = 0; t < T; t++) _mm256_storeu_ps(y[t], sums[t]);
}

static void q80_tile_vnni(int T, const uint8_t *p, int64_t nblk, const uint8_t *const *a, float *const *y)
{
    switch (T) {
    case 8: q80_tile_vnni_t(8, p, nblk, a, y); break;
    case 7: q80_tile_vnni_t(7, p, nblk, a, y); break;
    case 6: q80_tile_vnni_t(6, p, nblk, a, y); break;
    case 5: q80_tile_vnni_t(5, p, nblk, a, y); break;
    case 4: q80_tile_vnni_t(4, p, nblk, a, y); break;
    case 3: q80_tile_vnni_t(3, p, nblk, a, y); break;
    case 2: q80_tile_vnni_t(2, p, nblk, a, y); break;
    default: q80_tile_vnni_t(1, p, nblk, a, y); break;
    }
}

#include "engine/quant/target_pop.h"
#else
/* (never called: qt_x8_gemm refuses off x86, x8_cpu_ok) */
static void x8_none(int T, const uint8_t *p, int64_t nblk, const uint8_t *const *a, float *const *y)
{
    (void)T; (void)p; (void)nblk; (void)a; (void)y;
}
static void q4k_tile(int T, const uint8_t *p, int64_t n, const uint8_t *const *a, float *const *y) { x8_none(T, p, n, a, y); }
static void q80_tile(int T, const uint8_t *p, int64_t n, const uint8_t *const *a, float *const *y) { x8_none(T, p, n, a, y); }
static void q4k_tile_vnni(int T, const uint8_t *p, int64_t n, const uint8_t *const *a, float *const *y) { x8_none(T, p, n, a, y); }
static void q80_tile_vnni(int T, const uint8_t *p, int64_t n, const uint8_t *const *a, float *const *y) { x8_none(T, p, n, a, y); }
static void q6k_tile_vnni(int T, const uint8_t *p, int64_t n, const uint8_t *const *a, float *const *y) { x8_none(T, p, n, a, y); }
#endif
