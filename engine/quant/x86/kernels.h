/* kernels.h — x86 SIMD gemm kernels, written once and compiled twice:
 * avx2.c (AVX2+FMA+F16C; u8*s8 dot = maddubs+madd) and avx512.c
 * (adds AVX-512 VNNI: u8*s8 dot = vpdpbusd). Include only from those files,
 * after the target pragma, with QT_DOT_US(acc, u, s) and QT_KERNEL_NAME
 * defined.
 *
 * Shape of every kernel: one weight row at a time, several activation rows
 * per weight block load (register tiling 8 x QT_SGMAX for small blocks, 1 x 4
 * for float weights, 1 x 16 for K-quants whose super-block is unpacked to a 256-
 * byte stack buffer and reused by every activation row). A weight row is read
 * from memory once per call whatever nb is; the re-reads of later activation
 * groups hit L1/L2. Software prefetch runs about 1 KiB ahead of the stream.
 * K-quants at nb == 1 (decode) instead take 4 weight rows per pass, unpacked
 * in registers, their reductions and float finishes done together (one lane
 * per row), prefetched into L2 a few tiles ahead; with VNNI (QT_VNNI) q4_K
 * and q6_K use 512-bit vpdpbusd + vpdpwssd (on Zen 4, which splits zmm ops,
 * half the instructions of the 256-bit form for the same work).
 *
 * Batch invariance: a (weight row, activation row) result is bit-identical
 * whatever nb, the row range and the activation row's place in the batch:
 * every tile size runs the same operations in the same order per pair.
 *
 * Arithmetic: small blocks get exact int32 totals per block and then
 * evaluate the reference's float expression in the same order: bit-identical
 * to qt_vec_dot_ref. K-quants reduce to exact int32 totals per super-block
 * and then evaluate the very same float expression as qt_vec_dot_ref, in the
 * same order: bit-identical. */
#ifndef QT_X86_TEMPLATE
#define QT_X86_TEMPLATE

#include "engine/quant/iq.h"

#include <immintrin.h>
#include <string.h>

/* Float expressions must not be fused into FMAs (bit-exactness); gcc in
 * ISO C mode does not fuse, clang needs telling. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define QT_AI static inline __attribute__((always_inline))
#define QT_PF 1024

QT_AI float x_h2f(const void *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

QT_AI float x_hsum_ps(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

QT_AI int32_t x_hsum_i32(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* 32 bits -> 32 bytes, 0xFF where the bit is set. */
QT_AI __m256i x_bits_to_bytes(const uint8_t *p)
{
    uint32_t x32;
    memcpy(&x32, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* 16 packed bytes -> 32 nibbles: low nibbles first (values 0..15), then high. */
QT_AI __m256i x_nibbles(const uint8_t *p)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)(const void *)p);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* Small block -> signed int8 x 32 (q4_0, q5_0, q8_0). */
QT_AI __m256i x_unpack_s(uint32_t type, const uint8_t *b)
{
    switch (type) {
    case QT_Q4_0:
        return _mm256_sub_epi8(x_nibbles(b + 2), _mm256_set1_epi8(8));
    case QT_Q5_0: {
        const __m256i hb = _mm256_and_si256(x_bits_to_bytes(b + 2), _mm256_set1_epi8(0x10));
        return _mm256_sub_epi8(_mm256_or_si256(x_nibbles(b + 6), hb), _mm256_set1_epi8(16));
    }
    default:
        return _mm256_loadu_si256((const __m256i *)(const void *)(b + 2));
    }
}

/* Small block -> unsigned int8 x 32 (q4_1, q5_1). */
QT_AI __m256i x_unpack_u(uint32_t type, const uint8_t *b)
{
    if (type == QT_Q4_1) return x_nibbles(b + 4);
    const __m256i hb = _mm256_and_si256(x_bits_to_bytes(b + 4), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(x_nibbles(b + 8), hb);
}

#if defined(__clang__)
#define QT_UNROLL8 _Pragma("unroll 8")
#else
#define QT_UNROLL8 _Pragma("GCC unroll 8")
#endif

QT_AI __m256i x_ld(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }

/* ---- small blocks (q4_0, q5_0, q8_0 with q8_0 activations; q4_1, q5_1
 * with q8_1 activations) ----
 * Tile: 8 weight rows x G activation rows. Per 32-value block the 8 weight
 * rows are unpacked to unsigned bytes (q4 nibbles, q5 5-bit values, q8_0
 * plus 128) and transposed so that lane l of vector g holds bytes 4g..4g+3
 * of one weight row; each activation row's 4-byte group g is broadcast and
 * u8*s8-dotted into it. Lanes are weight rows: no horizontal sums. The
 * unsigned offset c comes back as an exact int32 term -c * sum(a) per
 * activation block, precomputed per call, so each lane ends with the exact
 * int32 block dot, and then runs the reference's float expression per block,
 * in block order:
 *   sum = sum + (float)isum * (d * da)                (q4_0, q5_0, q8_0)
 *   sum = sum + ((d * da) * (float)isum + m * s)      (q4_1, q5_1)
 * Results equal qt_vec_dot_ref bit for bit, hence do not depend on nb, the
 * row range or the tile (batch invariance). Without VNNI (maddubs saturates
 * past 2 * 255 * 127) q8_0 keeps its sign: |w| against sign(a, w), c = 0. */

#ifndef QT_SGMAX
#define QT_SGMAX 4        /* activation rows per tile (float accumulators in registers), <= 16 */
#endif
#ifndef QT_SVNNI
#define QT_SVNNI 0        /* 1: QT_DOT_US is vpdpbusd (no int16 saturation) */
#endif
#ifndef QT_DOT_BCAST   /* acc += u . (4 signed bytes at p, broadcast) */
#define QT_DOT_BCAST(acc, u, p) QT_DOT_US((acc), (u), _mm256_set1_epi32(x_u32(p)))
#endif
#if defined(__clang__)
#define QT_UNROLL16 _Pragma("unroll 16")
#else
#define QT_UNROLL16 _Pragma("GCC unroll 16")
#endif
#define QT_MAXB (5120 / QT_SGMAX)   /* blocks per column chunk: 60 KiB of x_sact */
#define QT_RB 128         /* weight rows per pass over several activation groups */
#ifndef QT_SPFB
#define QT_SPFB 16384     /* prefetch distance in bytes of a tile's rows */
#endif
#ifndef QT_SPFH
#define QT_SPFH _MM_HINT_T1
#endif

QT_AI int x_u16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

QT_AI int x_u32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* fp16 at p[l] + off, l = 0..7 -> 8 floats */
QT_AI __m256 x_h2f8p(const uint8_t *const *p, size_t off)
{
    __m128i h = _mm_cvtsi32_si128(x_u16(p[0] + off));
    h = _mm_insert_epi16(h, x_u16(p[1] + off), 1);
    h = _mm_insert_epi16(h, x_u16(p[2] + off), 2);
    h = _mm_insert_epi16(h, x_u16(p[3] + off), 3);
    h = _mm_insert_epi16(h, x_u16(p[4] + off), 4);
    h = _mm_insert_epi16(h, x_u16(p[5] + off), 5);
    h = _mm_insert_epi16(h, x_u16(p[6] + off), 6);
    h = _mm_insert_epi16(h, x_u16(p[7] + off), 7);
    return _mm256_cvtph_ps(h);
}

/* E8M0 byte at p[l] + off, l = 0..7 -> 8 floats 2^(e-128) (qt_e8m0_half) */
QT_AI __m256 x_e8m08p(const uint8_t *const *p, size_t off)
{
    const __m256i e = _mm256_setr_epi32(p[0][off], p[1][off], p[2][off], p[3][off],
                                        p[4][off], p[5][off], p[6][off], p[7][off]);
    const __m256i nrm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i lt2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(nrm, sub, lt2));
}

/* Offset c of the unsigned weight bytes: w = u - c. */
QT_AI int x_soff(uint32_t type)
{
    switch (type) {
    case QT_Q4_0: return 8;
    case QT_Q5_0: return 16;
    case QT_Q8_0: case QT_IQ4_NL: case QT_MXFP4: return QT_SVNNI ? 128 : 0;
    default: return 0;
    }
}

/* 4 x 4 dword transpose of (r0|r1), (r2|r3), (r4|r5), (r6|r7) pairs of
 * 128-bit rows: t[g] lane l = dword g of row lane_row[l], lane_row =
 * 0,2,4,6,1,3,5,7. */
QT_AI void x_tr4(__m256i r01, __m256i r23, __m256i r45, __m256i r67, __m256i *t)
{
    const __m256i a = _mm256_unpacklo_epi32(r01, r23), b = _mm256_unpackhi_epi32(r01, r23);
    const __m256i c = _mm256_unpacklo_epi32(r45, r67), d = _mm256_unpackhi_epi32(r45, r67);
    t[0] = _mm256_unpacklo_epi64(a, c);
    t[1] = _mm256_unpackhi_epi64(a, c);
    t[2] = _mm256_unpacklo_epi64(b, d);
    t[3] = _mm256_unpackhi_epi64(b, d);
}

QT_AI __m256i x_pair128(const uint8_t *lo, const uint8_t *hi)
{
    return _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(const void *)hi),
                            _mm_loadu_si128((const __m128i *)(const void *)lo));
}

/* The 16 levels of a 4-bit non-linear type as a pshufb table (both lanes):
 * signed, or plus 128 (unsigned) with VNNI. */
QT_AI __m256i x_nl_table(uint32_t type)
{
    const __m128i t = type == QT_MXFP4
        ? _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
        : _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    const __m256i v = _mm256_set_m128i(t, t);
    return QT_SVNNI ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;
}

/* One block of 8 weight rows (p[r] + off: block start of row r) -> wt[8]
 * transposed unsigned bytes (signed ones for q8_0, iq4_nl, mxfp4 without VNNI). */
QT_AI void x_wtile(uint32_t type, const uint8_t *const *p, size_t off, __m256i *wt)
{
    if (type == QT_Q4_0 || type == QT_Q4_1 || type == QT_IQ4_NL || type == QT_MXFP4) {
        const size_t q = off + (type == QT_Q4_0 || type == QT_IQ4_NL ? 2 : type == QT_MXFP4 ? 1 : 4);
        __m256i t[4];
        x_tr4(x_pair128(p[0] + q, p[1] + q), x_pair128(p[2] + q, p[3] + q),
              x_pair128(p[4] + q, p[5] + q), x_pair128(p[6] + q, p[7] + q), t);
        const __m256i m = _mm256_set1_epi8(0x0F);
        QT_UNROLL8
        for (int g = 0; g < 4; g++) {
            wt[g] = _mm256_and_si256(t[g], m);
            wt[g + 4] = _mm256_and_si256(_mm256_srli_epi16(t[g], 4), m);
        }
        if (type == QT_IQ4_NL || type == QT_MXFP4) {
            const __m256i tab = x_nl_table(type);
            QT_UNROLL8
            for (int g = 0; g < 8; g++) wt[g] = _mm256_shuffle_epi8(tab, wt[g]);
        }
        return;
    }
    __m256i v[8];
    QT_UNROLL8
    for (int r = 0; r < 8; r++) {
        const uint8_t *b = p[r] + off;
        switch (type) {
        case QT_Q5_0:
            v[r] = _mm256_or_si256(x_nibbles(b + 6), _mm256_and_si256(x_bits_to_bytes(b + 2), _mm256_set1_epi8(0x10)));
            break;
        case QT_Q5_1:
            v[r] = x_unpack_u(QT_Q5_1, b);
            break;
        default:
            v[r] = x_ld(b + 2);
            if (QT_SVNNI) v[r] = _mm256_xor_si256(v[r], _mm256_set1_epi8((char)0x80));
            break;
        }
    }
    x_tr4(_mm256_permute2x128_si256(v[0], v[1], 0x20), _mm256_permute2x128_si256(v[2], v[3], 0x20),
          _mm256_permute2x128_si256(v[4], v[5], 0x20), _mm256_permute2x128_si256(v[6], v[7], 0x20), wt);
    x_tr4(_mm256_permute2x128_si256(v[0], v[1], 0x31), _mm256_permute2x128_si256(v[2], v[3], 0x31),
          _mm256_permute2x128_si256(v[4], v[5], 0x31), _mm256_permute2x128_si256(v[6], v[7], 0x31), wt + 4);
}

/* Per activation row and block: da, s (q8_1) and the int32 correction. */
typedef struct {
    float da[QT_SGMAX][QT_MAXB];
    float sa[QT_SGMAX][QT_MAXB];
    int32_t corr[QT_SGMAX][QT_MAXB];
} x_sact;

QT_AI void x_sact_fill(uint32_t type, int G, int64_t cn, const uint8_t *a0, size_t as, x_sact *s)
{
    const int sgn = !(type == QT_Q4_1 || type == QT_Q5_1), c = x_soff(type);
    const size_t abs_ = sgn ? 34 : 36;
    for (int k = 0; k < G; k++)
        for (int64_t i = 0; i < cn; i++) {
            const uint8_t *ab = a0 + k * as + i * abs_;
            s->da[k][i] = x_h2f(ab);
            if (!sgn) s->sa[k][i] = x_h2f(ab + 2);
            if (c) {
                const __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x_ld(ab + 2)),
                                                    _mm256_set1_epi16(1));
                s->corr[k][i] = -c * x_hsum_i32(t);
            }
        }
}

/* lane l of a tile holds weight row x_lane_row[l] (the order x_tr4 leaves) */
static const int x_lane_row[8] = { 0, 2, 4, 6, 1, 3, 5, 7 };

/* 8 weight rows (p[r]: row r at the chunk start) x G activation rows.
 * acc[k] lane l: running sum of activation row k with weight row
 * x_lane_row[l]. */
QT_AI void x_small_tile(uint32_t type, int G, int64_t cn, const uint8_t *const *p, int lin, size_t step,
                        const uint8_t *a0, size_t as, const x_sact *s, __m256 *acc)
{
    const size_t bs = qt_block_bytes(type);
    const int sgn = !(type == QT_Q4_1 || type == QT_Q5_1), c = x_soff(type);
    const size_t abs_ = sgn ? 34 : 36, aoff = sgn ? 2 : 4;
    const size_t pfd = lin && step * (size_t)cn > QT_SPFB ? step * (size_t)cn : QT_SPFB;
    __m256 f[QT_SGMAX];
    QT_UNROLL16
    for (int k = 0; k < G; k++) f[k] = acc[k];
    for (int64_t i = 0; i < cn; i++) {
        const size_t off = (size_t)i * bs;
        /* a tile reads 8 rows side by side, which stream prefetchers do not
         * follow: prefetch the rows' bytes as one stream, a whole tile (at
         * least QT_SPFB) ahead, so that all 8 rows of the next tile are
         * fetched before it starts (QT_SPFB alone left row 7 of a 4096-wide
         * q8_0 tile, 30 KiB in, unfetched for the first half of the tile) */
        if (lin) {
            const char *q = (const char *)p[0] + pfd + (size_t)i * step;
            for (size_t o = 0; o < step; o += 64) _mm_prefetch(q + o, QT_SPFH);
        } else {
            QT_UNROLL8
            for (int r = 0; r < 8; r++) _mm_prefetch((const char *)p[r] + off + QT_PF, QT_SPFH);
        }
        __m256i wt[8], wa[8];
        x_wtile(type, p, off, wt);
        const int sgntrick = (type == QT_Q8_0 || type == QT_IQ4_NL || type == QT_MXFP4) && !QT_SVNNI;
        if (sgntrick) {
            QT_UNROLL8
            for (int g = 0; g < 8; g++) wa[g] = _mm256_sign_epi8(wt[g], wt[g]);
        }
        const uint8_t *const pl[8] = { p[0], p[2], p[4], p[6], p[1], p[3], p[5], p[7] };
        const __m256 dw = type == QT_MXFP4 ? x_e8m08p(pl, off) : x_h2f8p(pl, off);
        const __m256 mw = sgn ? _mm256_setzero_ps() : x_h2f8p(pl, off + 2);
        QT_UNROLL16
        for (int k = 0; k < G; k++) {
            const uint8_t *y = a0 + k * as + i * abs_ + aoff;
            __m256i t0 = c ? _mm256_set1_epi32(s->corr[k][i]) : _mm256_setzero_si256();
            __m256i t1 = _mm256_setzero_si256();
            QT_UNROLL8
            for (int g = 0; g < 8; g += 2) {
                if (sgntrick) {
                    const __m256i y0 = _mm256_set1_epi32(x_u32(y + 4 * g)), y1 = _mm256_set1_epi32(x_u32(y + 4 * g + 4));
                    t0 = QT_DOT_US(t0, wa[g], _mm256_sign_epi8(y0, wt[g]));
                    t1 = QT_DOT_US(t1, wa[g + 1], _mm256_sign_epi8(y1, wt[g + 1]));
                } else {
                    t0 = QT_DOT_BCAST(t0, wt[g], y + 4 * g);
                    t1 = QT_DOT_BCAST(t1, wt[g + 1], y + 4 * g + 4);
                }
            }
            const __m256 isum = _mm256_cvtepi32_ps(_mm256_add_epi32(t0, t1));
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(s->da[k][i]));
            if (sgn)
                f[k] = _mm256_add_ps(f[k], _mm256_mul_ps(isum, sc));
            else
                f[k] = _mm256_add_ps(f[k], _mm256_add_ps(_mm256_mul_ps(sc, isum),
                                                         _mm256_mul_ps(mw, _mm256_set1_ps(s->sa[k][i]))));
        }
    }
    QT_UNROLL16
    for (int k = 0; k < G; k++) acc[k] = f[k];
}


QT_AI void x_small(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                   const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    const size_t bs = qt_block_bytes(type);
    const int64_t nblk = n / 32;
    const int sgn = !(type == QT_Q4_1 || type == QT_Q5_1);
    const size_t abs_ = sgn ? 34 : 36;
    /* rows in one chunk: the tile's 8 rows are 8 * ws contiguous bytes */
    const int lin = nblk <= QT_MAXB;
    const size_t step = lin ? (8 * ws + (size_t)nblk - 1) / (size_t)nblk : 0;
    x_sact sa __attribute__((aligned(32)));
    __m256 acc[QT_SGMAX];
    float lane[8] __attribute__((aligned(32)));
    /* rows longer than QT_MAXB blocks go in column chunks: a chunk resumes
     * the running sums from Y, so the float chain is the same as unchunked */
    for (int64_t cb = 0; cb < nblk; cb += QT_MAXB) {
        const int64_t cn = nblk - cb < QT_MAXB ? nblk - cb : QT_MAXB;
        const int64_t rbn = nb <= QT_SGMAX ? r1 - r0 : QT_RB;
        for (int64_t rb = r0; rb < r1; rb += rbn) {
            const int64_t re = rb + rbn < r1 ? rb + rbn : r1;
            for (int b0 = 0; b0 < nb;) {
                const int rem = nb - b0, g = rem >= QT_SGMAX ? QT_SGMAX : rem;
                const uint8_t *a0 = A + b0 * as + cb * abs_;
                x_sact_fill(type, g, cn, a0, as, &sa);
                for (int64_t rt = rb; rt < re; rt += 8) {
                    const uint8_t *p[8];
                    int64_t row[8];
                    for (int l = 0; l < 8; l++) {
                        row[l] = rt + x_lane_row[l] < re ? rt + x_lane_row[l] : -1;
                        p[l] = W + (rt + l < re ? rt + l : re - 1) * ws + cb * bs;
                    }
                    for (int k = 0; k < g; k++) {
                        if (!cb) { acc[k] = _mm256_setzero_ps(); continue; }
                        for (int l = 0; l < 8; l++) lane[l] = row[l] >= 0 ? Y[(b0 + k) * ldy + row[l]] : 0.f;
                        acc[k] = _mm256_load_ps(lane);
                    }
                    switch (g) {
#if QT_SGMAX > 8
                    case 16: x_small_tile(type, 16, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 15: x_small_tile(type, 15, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 14: x_small_tile(type, 14, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 13: x_small_tile(type, 13, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 12: x_small_tile(type, 12, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 11: x_small_tile(type, 11, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 10: x_small_tile(type, 10, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 9: x_small_tile(type, 9, cn, p, lin, step, a0, as, &sa, acc); break;
#endif
#if QT_SGMAX > 4
                    case 8: x_small_tile(type, 8, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 7: x_small_tile(type, 7, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 6: x_small_tile(type, 6, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 5: x_small_tile(type, 5, cn, p, lin, step, a0, as, &sa, acc); break;
#endif
                    case 4: x_small_tile(type, 4, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 3: x_small_tile(type, 3, cn, p, lin, step, a0, as, &sa, acc); break;
                    case 2: x_small_tile(type, 2, cn, p, lin, step, a0, as, &sa, acc); break;
                    default: x_small_tile(type, 1, cn, p, lin, step, a0, as, &sa, acc); break;
                    }
                    for (int k = 0; k < g; k++) {
                        _mm256_store_ps(lane, acc[k]);
                        for (int l = 0; l < 8; l++)
                            if (row[l] >= 0) Y[(b0 + k) * ldy + row[l]] = lane[l];
                    }
                }
                b0 += g;
            }
        }
    }
}

/* ---- K-quants ---- */

typedef struct {
    __m256i sv[8];   /* per 32-value chunk: int16 x16, lanes 0-7 scale of the 1st 16 values, 8-15 of the 2nd */
    __m256i mv;      /* int16 x16: offset coefficient per 16 values */
    float fd, fm;
} x_kscale;

/* s16: the 16 per-16 scales as int8 (all fit: |s| <= 128). */
QT_AI void x_kscales(__m128i s16, x_kscale *ks)
{
    const __m256i w = _mm256_cvtepi8_epi16(s16);
    const __m256i lo = _mm256_permute4x64_epi64(w, 0x44), hi = _mm256_permute4x64_epi64(w, 0xEE);
    QT_UNROLL8
    for (int c = 0; c < 8; c++) {
        const int i = (2 * c) & 7;   /* int16 lane of the 1st scale within its 128-bit half */
        const char a0 = (char)(2 * i), a1 = (char)(2 * i + 1), b0 = (char)(2 * i + 2), b1 = (char)(2 * i + 3);
        const __m256i m = _mm256_setr_epi8(a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1,
                                           b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1);
        ks->sv[c] = _mm256_shuffle_epi8(c < 4 ? lo : hi, m);
    }
}

QT_AI void x_kscales_of(uint32_t type, const uint8_t *b, x_kscale *ks)
{
    switch (type) {
    case QT_Q2_K: {
        const qt_block_q2_K *x = (const void *)b;
        const __m128i sc = _mm_loadu_si128((const __m128i *)(const void *)x->scales);
        x_kscales(_mm_and_si128(sc, _mm_set1_epi8(0x0F)), ks);
        ks->mv = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
        ks->fd = x_h2f(&x->d); ks->fm = x_h2f(&x->dmin);
        break;
    }
    case QT_Q3_K: {
        const qt_block_q3_K *x = (const void *)b;
        const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
        uint32_t a0, a1, tmp;
        memcpy(&a0, x->scales, 4);
        memcpy(&a1, x->scales + 4, 4);
        memcpy(&tmp, x->scales + 8, 4);
        /* built in registers: a 16-byte reload of 4-byte stores would stall */
        const __m128i aux = _mm_setr_epi32((int)((a0 & kmask2) | (((tmp >> 0) & kmask1) << 4)),
                                           (int)((a1 & kmask2) | (((tmp >> 2) & kmask1) << 4)),
                                           (int)(((a0 >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4)),
                                           (int)(((a1 >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4)));
        const __m128i sc = _mm_sub_epi8(aux, _mm_set1_epi8(32));
        x_kscales(sc, ks);
        ks->mv = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2);
        ks->fd = ks->fm = x_h2f(&x->d);
        break;
    }
    case QT_Q4_K: case QT_Q5_K: {
        /* 12 bytes -> 8 six-bit scales and 8 six-bit mins, in registers */
        uint64_t x;
        uint32_t y;
        memcpy(&x, b + 4, 8);
        memcpy(&y, b + 12, 4);
        const uint64_t lo = x & 0x3f3f3f3f3f3f3f3full;                     /* sc0-3, m0-3: low 6 bits */
        const uint64_t hb = (x >> 2) & 0x3030303030303030ull;               /* their top 2 bits -> bits 4-5 */
        const uint64_t hi = ((uint64_t)(y & 0x0f0f0f0fu) | ((uint64_t)((y >> 4) & 0x0f0f0f0fu) << 32)) | hb;
        const __m128i v = _mm_set_epi64x((long long)hi, (long long)lo);   /* sc0-3 m0-3 sc4-7 m4-7 */
        const __m128i sc16 = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 8, 8, 9, 9, 10, 10, 11, 11));
        const __m128i mn16 = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 4, 5, 5, 6, 6, 7, 7, 12, 12, 13, 13, 14, 14, 15, 15));
        x_kscales(sc16, ks);
        ks->mv = _mm256_cvtepu8_epi16(mn16);
        ks->fd = x_h2f(b); ks->fm = x_h2f(b + 2);
        break;
    }
    default: { /* QT_Q6_K */
        const qt_block_q6_K *x = (const void *)b;
        const __m128i sc = _mm_loadu_si128((const __m128i *)(const void *)x->scales);
        x_kscales(sc, ks);
        ks->mv = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 5);
        ks->fd = ks->fm = x_h2f(&x->d);
        break;
    }
    }
}

/* Chunk c (values 32c .. 32c+31) of a K-quant super-block as unsigned bytes.
 * Called with constant c from unrolled loops: loads shared by chunks fold. */
QT_AI __m256i x_kchunk(uint32_t type, const uint8_t *b, int c)
{
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    switch (type) {
    case QT_Q2_K: {
        const __m256i v = x_ld(b + 16 + 32 * (c / 4));
        return _mm256_and_si256(_mm256_srli_epi16(v, 2 * (c % 4)), m3);
    }
    case QT_Q3_K: {
        const __m256i v = x_ld(b + 32 + 32 * (c / 4)), hm = x_ld(b);
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (c % 4)), m3);
        const __m256i four = _mm256_set1_epi8(4);
        const __m256i hi = c >= 2 ? _mm256_and_si256(_mm256_srli_epi16(hm, c - 2), four)
                                  : _mm256_and_si256(_mm256_slli_epi16(hm, 2 - c), four);
        return _mm256_or_si256(lo, hi);
    }
    case QT_Q4_K: case QT_Q5_K: {
        const __m256i v = x_ld(b + (type == QT_Q4_K ? 16 : 48) + 32 * (c / 2));
        __m256i q = (c & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
        if (type == QT_Q5_K) {
            const __m256i qh = x_ld(b + 16);
            q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, c), one), 4));
        }
        return q;
    }
    default: { /* QT_Q6_K: ql at 0, qh at 128 */
        const int h = c / 4, j = c % 4;
        const __m256i l = x_ld(b + 64 * h + 32 * (j & 1)), hh = x_ld(b + 128 + 32 * h);
        const __m256i lo = j < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
        __m256i hb;
        switch (j) {
        case 0: hb = _mm256_slli_epi16(hh, 4); break;
        case 1: hb = _mm256_slli_epi16(hh, 2); break;
        case 2: hb = hh; break;
        default: hb = _mm256_srli_epi16(hh, 2); break;
        }
        return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    }
    }
}

/* 8 int32 x 8 vectors -> the vector of their 8 horizontal sums (exact). */
QT_AI __m256i x_hsum8_i32(const __m256i *v)
{
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* activation row r's q8_K block i (rows as bytes apart in A) */
QT_AI const qt_block_q8_K *x_arow(const uint8_t *A, size_t as, int r, int64_t i)
{
    return (const void *)(A + (size_t)r * as + (size_t)i * sizeof(qt_block_q8_K));
}

/* Activation rows r .. r+7 against one super-block, their dots iv taken:
 * the mins (mvec against each row's bsums), then x_kfinish's float
 * expression lane-wise (same bits): sums[0..7] += d_a * (fd * isum - fm * msum). */
QT_AI void x_k8_finish(const __m256i *iv, __m256i mvec, const uint8_t *A, size_t as, int r, int64_t i,
                       float fd, float fm, float *sums)
{
    __m256i mv[8];
    float dv[8];
    QT_UNROLL8
    for (int u = 0; u < 8; u++) {
        const qt_block_q8_K *a = x_arow(A, as, r + u, i);
        mv[u] = _mm256_madd_epi16(mvec, x_ld((const uint8_t *)a->bsums));
        dv[u] = a->d;
    }
    const __m256 isum = _mm256_cvtepi32_ps(x_hsum8_i32(iv));
    const __m256 msum = _mm256_cvtepi32_ps(x_hsum8_i32(mv));
    const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(fd), isum), _mm256_mul_ps(_mm256_set1_ps(fm), msum));
    _mm256_storeu_ps(sums, _mm256_add_ps(_mm256_loadu_ps(sums), _mm256_mul_ps(_mm256_loadu_ps(dv), t)));
}

/* The nb == 1 K-quant rows (x_krows1): the R <= 8 rows'
 * exact int32 totals iv (dots), mv (mins) to float lanes, one per row (R 4:
 * the low half); a super-block's d * (vd * isum - vm * msum) added lane-wise;
 * the R sums stored. */
QT_AI void x_krows_isum(int R, const __m256i *iv, const __m256i *mv, __m256 *isum, __m256 *msum)
{
    if (R == 4) {
        const __m256i v[8] = { iv[0], iv[1], iv[2], iv[3], mv[0], mv[1], mv[2], mv[3] };
        const __m256i h = x_hsum8_i32(v);
        *isum = _mm256_castps128_ps256(_mm_cvtepi32_ps(_mm256_castsi256_si128(h)));
        *msum = _mm256_castps128_ps256(_mm_cvtepi32_ps(_mm256_extracti128_si256(h, 1)));
    } else {
        *isum = _mm256_cvtepi32_ps(x_hsum8_i32(iv));
        *msum = _mm256_cvtepi32_ps(x_hsum8_i32(mv));
    }
}
QT_AI __m256 x_krows_add(__m256 sums, float d, __m256 vd, __m256 isum, __m256 vm, __m256 msum)
{
    const __m256 t = _mm256_sub_ps(_mm256_mul_ps(vd, isum), _mm256_mul_ps(vm, msum));
    return _mm256_add_ps(sums, _mm256_mul_ps(_mm256_set1_ps(d), t));
}
QT_AI void x_krows_store(int R, float *y, __m256 sums)
{
    if (R == 4) _mm_storeu_ps(y, _mm256_castps256_ps128(sums));
    else _mm256_storeu_ps(y, sums);
}

/* The int32 lanes of one super-block's dot with activation a: the 8
 * weight chunks (unpacked in registers from wb, or read from q, a super-block
 * already unpacked to 256 bytes) times a's bytes, scaled per chunk; two
 * accumulators (vpdpwssd has a 5-cycle latency). */
QT_AI __m256i x_kdot(uint32_t type, const uint8_t *wb, const uint8_t *q, const x_kscale *ks,
                     const qt_block_q8_K *a)
{
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    QT_UNROLL8
    for (int c = 0; c < 8; c += 2) {
        const __m256i w0 = q ? _mm256_load_si256((const __m256i *)(const void *)(q + 32 * c)) : x_kchunk(type, wb, c);
        const __m256i w1 = q ? _mm256_load_si256((const __m256i *)(const void *)(q + 32 * c + 32))
                             : x_kchunk(type, wb, c + 1);
        const __m256i p0 = _mm256_maddubs_epi16(w0, x_ld((const uint8_t *)a->qs + 32 * c));
        const __m256i p1 = _mm256_maddubs_epi16(w1, x_ld((const uint8_t *)a->qs + 32 * c + 32));
        acc0 = QT_MADD_ACC(acc0, p0, ks->sv[c]);
        acc1 = QT_MADD_ACC(acc1, p1, ks->sv[c + 1]);
    }
    return _mm256_add_epi32(acc0, acc1);
}

/* sums += da * (fd * isum - fm * msum), as qt_vec_dot_ref. */
QT_AI float x_kfinish(__m256i acc, const x_kscale *ks, const qt_block_q8_K *a, float sum)
{
    const __m256i ms = _mm256_madd_epi16(ks->mv, x_ld((const uint8_t *)a->bsums));
    const __m256i h = _mm256_hadd_epi32(acc, ms);
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    x = _mm_hadd_epi32(x, x);
    const int32_t isum = _mm_cvtsi128_si32(x), msum = _mm_extract_epi32(x, 1);
    return sum + a->d * (ks->fd * (float)isum - ks->fm * (float)msum);
}

/* Prefetch of the row tiles: the R rows of a tile are read side by side,
 * R short streams that the hardware prefetchers do not follow (rows of 1-2
 * KiB: 4x fewer GB/s than one plain stream). Software prefetch fills in: the
 * same place a whole number of tiles on (>= QT_PFB bytes: the memory latency
 * times the stream rate, with margin), into L2 (prefetcht1: an L1 prefetch
 * would hold a miss buffer for the whole trip). */
#ifndef QT_PFB
#define QT_PFB 16384
#endif
QT_AI size_t x_kpf(int R, size_t ws)
{
    const size_t tile = (size_t)R * ws;
    return (QT_PFB + tile - 1) / tile * tile;
}

#ifndef QT_KR
#define QT_KR 4   /* weight rows per pass at nb == 1 */
#endif

/* nb == 1: R weight rows against one activation row. Per super-block the R
 * rows' exact int32 totals (isum, msum) are reduced together and the float
 * expression of x_kfinish is evaluated lane-wise, one lane per row: the same
 * IEEE operations in the same order per row, so the same bits. */
/* One super-block (at wb0, the R rows ws bytes apart) of the R rows against
 * activation block a: their exact int32 totals (iv, mv) and scales lane-wise
 * (vd, vm) as x_krows_add takes them */
QT_AI void x_krows_gen(uint32_t type, int R, const uint8_t *wb0, size_t ws, size_t pf, const qt_block_q8_K *a,
                       __m256i *iv, __m256i *mv, __m256 *vd, __m256 *vm)
{
    const size_t bs = qt_block_bytes(type);
    float fd[8], fm[8];
    QT_UNROLL8
    for (int u = 0; u < R; u++) {
        const uint8_t *wb = wb0 + (size_t)u * ws;
        for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)wb + pf + o, _MM_HINT_T1);
        x_kscale ks;
        x_kscales_of(type, wb, &ks);
        iv[u] = x_kdot(type, wb, NULL, &ks, a);
        mv[u] = _mm256_madd_epi16(ks.mv, x_ld((const uint8_t *)a->bsums));
        fd[u] = ks.fd;
        fm[u] = ks.fm;
    }
    if (R == 4) {
        *vd = _mm256_castps128_ps256(_mm_setr_ps(fd[0], fd[1], fd[2], fd[3]));
        *vm = _mm256_castps128_ps256(_mm_setr_ps(fm[0], fm[1], fm[2], fm[3]));
    } else {
        *vd = _mm256_setr_ps(fd[0], fd[1], fd[2], fd[3], fd[4], fd[5], fd[6], fd[7]);
        *vm = _mm256_setr_ps(fm[0], fm[1], fm[2], fm[3], fm[4], fm[5], fm[6], fm[7]);
    }
}

#ifdef QT_VNNI
/* nb == 1 with vpdpbusd (q4_K, q6_K), 512 bits wide: a zmm holds two
 * 32-value chunks. The int32 x16 vpdpbusd lanes (4 products each,
 * |P| <= 4 * 63 * 128 < 2^15) are packed to int16 (exact) and multiplied by
 * the per-32 (q4_K) / per-16 (q6_K) scales with vpdpwssd: no int16 step per
 * chunk and no scale broadcasts. The lane sums of iv / mv are the
 * super-block's isum / msum. */
/* 512-bit forms: a zmm holds two 32-value chunks. The int32 x16 vpdpbusd
 * lanes (4 products each, |P| <= 4 * 63 * 128 < 2^15) are packed to int16
 * (exact) and multiplied by the per-16 / per-32 scales with vpdpwssd, so the
 * scales need no reduction of their own: one fold of 16 lanes to 8 per row. */
QT_AI __m256i x_fold16(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* A q4_K super-block's 6-bit scales and mins as int16: sc0-7 m0-7 */
QT_AI __m256i x_q4k_s16(const uint8_t *wb)
{
    uint64_t x;
    uint32_t z;
    memcpy(&x, wb + 4, 8);
    memcpy(&z, wb + 12, 4);
    const uint64_t lo = x & 0x3f3f3f3f3f3f3f3full;
    const uint64_t hb = (x >> 2) & 0x3030303030303030ull;
    const uint64_t hi = ((uint64_t)(z & 0x0f0f0f0fu) | ((uint64_t)((z >> 4) & 0x0f0f0f0fu) << 32)) | hb;
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
        _mm_set_epi64x((long long)hi, (long long)lo), _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)));
}

QT_AI void x_q4k_row_z(const uint8_t *wb, const __m512i *az, __m256i bsum, __m256i *iv, __m256i *mv)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m256i s16 = x_q4k_s16(wb);
    const __m512i s = _mm512_castsi256_si512(s16);
    /* packs of [c0|c2] with [c1|c3]: 128-bit lanes c0 c1 | c0 c1 | c2 c3 | c2 c3 (4 words each) */
    const __m512i i0 = _mm512_set_epi16(3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2,
                                        1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(4));
    __m512i acc = _mm512_setzero_si512();
    QT_UNROLL8
    for (int h = 0; h < 2; h++) {
        const __m512i v = _mm512_loadu_si512((const void *)(wb + 16 + 64 * h));
        const __m512i pl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, m4), az[2 * h]);
        const __m512i ph = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                               _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), az[2 * h + 1]);
        acc = _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(pl, ph), _mm512_permutexvar_epi16(h ? i1 : i0, s));
    }
    *iv = x_fold16(acc);
    /* per-16 mins m[k/2] against the activation's sums of 16 */
    const __m256i im = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    *mv = _mm256_madd_epi16(_mm256_permutexvar_epi16(im, s16), bsum);
}

QT_AI void x_q6k_row_z(const uint8_t *wb, const __m512i *az, __m256i bsum, __m256i *iv, __m256i *mv)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(wb + 192)));
    const __m512i s = _mm512_castsi256_si512(s16);
    /* packs of [c0|c1] with [c2|c3]: lanes s0 s4 | s1 s5 | s2 s6 | s3 s7 (4 words each) */
    const __m512i i0 = _mm512_set_epi16(7, 7, 7, 7, 3, 3, 3, 3, 6, 6, 6, 6, 2, 2, 2, 2,
                                        5, 5, 5, 5, 1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(8));
    /* per 256-bit half: shift qh so that its bit pair lands on bits 4-5 */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    __m512i acc = _mm512_setzero_si512();
    QT_UNROLL8
    for (int g = 0; g < 2; g++) {
        const __m512i l = _mm512_loadu_si512((const void *)(wb + 64 * g));
        const __m512i hh = _mm512_broadcast_i64x4(x_ld(wb + 128 + 32 * g));
        /* A | (B & C) = 0xF8 */
        const __m512i q01 = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m4), _mm512_sllv_epi16(hh, shl), m30, 0xF8);
        const __m512i q23 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                      _mm512_srlv_epi16(hh, shr), m30, 0xF8);
        const __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q01, az[2 * g]);
        const __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q23, az[2 * g + 1]);
        acc = _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(p01, p23), _mm512_permutexvar_epi16(g ? i1 : i0, s));
    }
    *iv = x_fold16(acc);
    *mv = _mm256_madd_epi16(_mm256_slli_epi16(s16, 5), bsum);
}

/* Batches (nb > 1): one super-block's weights prepared once for every
 * activation row, chunk pairs as contiguous as the activation ([c0|c1],
 * [c2|c3], ..; q4_K nibbles of 32 bytes broadcast to both halves and shifted
 * per half), with the two vpdpwssd scale vectors and the offset
 * coefficients of x_kscale.mv. */
typedef struct {
    __m512i q[4], s[2];
    __m256i mv;
    float fd, fm;
} x_kz;

QT_AI void x_kz_prep(uint32_t type, const uint8_t *wb, x_kz *kz)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (type == QT_Q4_K) {
        const __m512i sh = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
        const __m256i s16 = x_q4k_s16(wb);
        const __m512i s = _mm512_castsi256_si512(s16);
        /* packs of [c0|c1] with [c2|c3]: 128-bit lanes c0 c2 | c0 c2 | c1 c3 | c1 c3 (4 words each) */
        const __m512i i0 = _mm512_set_epi16(3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1,
                                            2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0);
        kz->s[0] = _mm512_permutexvar_epi16(i0, s);
        kz->s[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16(4)), s);
        QT_UNROLL8
        for (int j = 0; j < 4; j++)
            kz->q[j] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(x_ld(wb + 16 + 32 * j)), sh), m4);
        kz->mv = _mm256_permutexvar_epi16(
            _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), s16);
        kz->fd = x_h2f(wb);
        kz->fm = x_h2f(wb + 2);
    } else {   /* QT_Q6_K, as x_q6k_row_z */
        const __m512i m30 = _mm512_set1_epi8(0x30);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(wb + 192)));
        const __m512i s = _mm512_castsi256_si512(s16);
        const __m512i i0 = _mm512_set_epi16(7, 7, 7, 7, 3, 3, 3, 3, 6, 6, 6, 6, 2, 2, 2, 2,
                                            5, 5, 5, 5, 1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 0, 0);
        kz->s[0] = _mm512_permutexvar_epi16(i0, s);
        kz->s[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16(8)), s);
        const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
        QT_UNROLL8
        for (int g = 0; g < 2; g++) {
            const __m512i l = _mm512_loadu_si512((const void *)(wb + 64 * g));
            const __m512i hh = _mm512_broadcast_i64x4(x_ld(wb + 128 + 32 * g));
            kz->q[2 * g] = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m4), _mm512_sllv_epi16(hh, shl), m30, 0xF8);
            kz->q[2 * g + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                         _mm512_srlv_epi16(hh, shr), m30, 0xF8);
        }
        kz->mv = _mm256_slli_epi16(s16, 5);
        kz->fd = kz->fm = x_h2f(wb + 208);
    }
}

/* isum lanes of one activation row against a prepared super-block */
QT_AI __m256i x_kz_dot(const x_kz *kz, const uint8_t *aq)
{
    __m512i acc = _mm512_setzero_si512();
    QT_UNROLL8
    for (int h = 0; h < 2; h++) {
        const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), kz->q[2 * h],
                                               _mm512_loadu_si512((const void *)(aq + 128 * h)));
        const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), kz->q[2 * h + 1],
                                               _mm512_loadu_si512((const void *)(aq + 128 * h + 64)));
        acc = _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(p0, p1), kz->s[h]);
    }
    return x_fold16(acc);
}

/* Activation rows b0 .. b0+g-1 against super-block i (prepared in kz), the
 * float finish as in x_kquant's generic batch loop (same bits). */
QT_AI void x_kz_rows(const x_kz *kz, const uint8_t *A, size_t as, int b0, int g, int64_t i, float *sums)
{
    int k = 0;
    for (; k + 8 <= g; k += 8) {
        __m256i iv[8];
        QT_UNROLL8
        for (int u = 0; u < 8; u++) iv[u] = x_kz_dot(kz, (const uint8_t *)x_arow(A, as, b0 + k + u, i)->qs);
        x_k8_finish(iv, kz->mv, A, as, b0 + k, i, kz->fd, kz->fm, sums + k);
    }
    for (; k < g; k++) {
        const qt_block_q8_K *a = x_arow(A, as, b0 + k, i);
        const __m256i h = _mm256_hadd_epi32(x_kz_dot(kz, (const uint8_t *)a->qs),
                                            _mm256_madd_epi16(kz->mv, x_ld((const uint8_t *)a->bsums)));
        __m128i x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        x = _mm_hadd_epi32(x, x);
        const int32_t isum = _mm_cvtsi128_si32(x), msum = _mm_extract_epi32(x, 1);
        sums[k] = sums[k] + a->d * (kz->fd * (float)isum - kz->fm * (float)msum);
    }
}

QT_AI void x_krows_vnni(uint32_t type, int R, const uint8_t *wb0, size_t ws, size_t pf, const qt_block_q8_K *a,
                        __m256i *iv, __m256i *mv, __m256 *vd, __m256 *vm)
{
    const size_t bs = qt_block_bytes(type);
    const __m256i bsum = x_ld((const uint8_t *)a->bsums);
    /* activation chunk pairs as the weight zmm hold them */
    __m512i az[4];
    const uint8_t *aq = (const uint8_t *)a->qs;
    QT_UNROLL8
    for (int h = 0; h < 4; h++) {
        if (type == QT_Q4_K)   /* [c0|c2] [c1|c3] [c4|c6] [c5|c7] */
            az[h] = _mm512_inserti64x4(_mm512_castsi256_si512(x_ld(aq + 128 * (h / 2) + 32 * (h % 2))),
                                       x_ld(aq + 128 * (h / 2) + 32 * (h % 2) + 64), 1);
        else                   /* [c0|c1] [c2|c3] .. */
            az[h] = _mm512_loadu_si512((const void *)(aq + 64 * h));
    }
    uint32_t dm[8];   /* fp16 pairs (d, dmin); q6_K: (d, d) */
    QT_UNROLL8
    for (int u = 0; u < R; u++) {
        const uint8_t *wb = wb0 + (size_t)u * ws;
        for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)wb + pf + o, _MM_HINT_T1);
        if (type == QT_Q4_K) {
            x_q4k_row_z(wb, az, bsum, &iv[u], &mv[u]);
            memcpy(&dm[u], wb, 4);
        } else {
            x_q6k_row_z(wb, az, bsum, &iv[u], &mv[u]);
            uint16_t d;
            memcpy(&d, wb + 208, 2);
            dm[u] = (uint32_t)d * 0x10001u;
        }
    }
    const __m256i ev = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    if (R == 4) {
        /* d0 m0 d1 m1 .. -> d0-3 m0-3 */
        *vd = _mm256_permutevar8x32_ps(
            _mm256_cvtph_ps(_mm_setr_epi32((int)dm[0], (int)dm[1], (int)dm[2], (int)dm[3])), ev);
        *vm = _mm256_castps128_ps256(_mm256_extractf128_ps(*vd, 1));
    } else {
        const __m256 g0 = _mm256_permutevar8x32_ps(
            _mm256_cvtph_ps(_mm_setr_epi32((int)dm[0], (int)dm[1], (int)dm[2], (int)dm[3])), ev);
        const __m256 g1 = _mm256_permutevar8x32_ps(
            _mm256_cvtph_ps(_mm_setr_epi32((int)dm[4], (int)dm[5], (int)dm[6], (int)dm[7])), ev);
        *vd = _mm256_permute2f128_ps(g0, g1, 0x20);
        *vm = _mm256_permute2f128_ps(g0, g1, 0x31);
    }
}
#endif

/* nb == 1, R rows (x_krows_vnni's where vnni, q4_K and q6_K on VNNI builds) */
QT_AI void x_krows1(uint32_t type, int vnni, int R, int64_t nsb, const uint8_t *wr, size_t ws, const uint8_t *A,
                    float *y)
{
    const size_t bs = qt_block_bytes(type);
    const size_t pf = x_kpf(R, ws);
    __m256 sums = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++) {
        const qt_block_q8_K *a = (const void *)(A + i * sizeof(qt_block_q8_K));
        __m256i iv[8], mv[8];
        __m256 isum, msum, vd, vm;
#ifdef QT_VNNI
        if (vnni) x_krows_vnni(type, R, wr + i * bs, ws, pf, a, iv, mv, &vd, &vm);
        else
#endif
            x_krows_gen(type, R, wr + i * bs, ws, pf, a, iv, mv, &vd, &vm);
        x_krows_isum(R, iv, mv, &isum, &msum);
        sums = x_krows_add(sums, a->d, vd, isum, vm, msum);
    }
    x_krows_store(R, y, sums);
}

QT_AI void x_kquant(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                    const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    const size_t bs = qt_block_bytes(type);
    const int64_t nsb = n / 256;
    uint8_t q[256] __attribute__((aligned(32)));
    x_kscale ks;
    float sums[16];
    int64_t r = r0;
    if (nb == 1 && r1 - r0 >= QT_KR) {
        /* The tiles prefetch x_kpf bytes ahead of themselves, so the first
         * x_kpf bytes of the range would come in on demand: all of a small
         * range (k, v of a 1.5b split in 16 items: 14 KiB each). Start them. */
        const size_t span = (size_t)(r1 - r0) * ws, pre = x_kpf(QT_KR, ws);
        for (size_t o = 0; o < (span < pre ? span : pre); o += 64)
            _mm_prefetch((const char *)(W + r0 * ws) + o, _MM_HINT_T1);
    }
    if (nb == 1)
        for (; r + QT_KR <= r1; r += QT_KR) {
#ifdef QT_VNNI
            if (type == QT_Q4_K || type == QT_Q6_K) { x_krows1(type, 1, QT_KR, nsb, W + r * ws, ws, A, Y + r); continue; }
#endif
            x_krows1(type, 0, QT_KR, nsb, W + r * ws, ws, A, Y + r);
        }
    if (nb == 1) {   /* decode: unpack in registers, no stores */
        for (; r < r1; r++) {
            const uint8_t *wr = W + r * ws;
            float sum = 0;
            for (int64_t i = 0; i < nsb; i++) {
                const uint8_t *wb = wr + i * bs;
                for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)wb + QT_PF + o, _MM_HINT_T0);
                const qt_block_q8_K *a = (const void *)(A + i * sizeof(qt_block_q8_K));
                x_kscales_of(type, wb, &ks);
                sum = x_kfinish(x_kdot(type, wb, NULL, &ks, a), &ks, a, sum);
            }
            Y[r] = sum;
        }
        return;
    }
    /* Batches: 16 activation rows against every row of the range, then the
     * next 16. The group (16 x 292 bytes a super-block) stays in L2 while
     * the rows go by; rows outermost streamed all nb activation rows per
     * weight row, past L2 from nb ~ 64 on for the wide matrices. */
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int g = nb - b0 < 16 ? nb - b0 : 16;
        for (r = r0; r < r1; r++) {
            const uint8_t *wr = W + r * ws;
            for (int k = 0; k < g; k++) sums[k] = 0;
            for (int64_t i = 0; i < nsb; i++) {
                const uint8_t *wb = wr + i * bs;
                for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)wb + QT_PF + o, _MM_HINT_T0);
#ifdef QT_VNNI
                if (type == QT_Q4_K || type == QT_Q6_K) {
                    x_kz kz;
                    x_kz_prep(type, wb, &kz);
                    x_kz_rows(&kz, A, as, b0, g, i, sums);
                    continue;
                }
#endif
                x_kscales_of(type, wb, &ks);
                QT_UNROLL8
                for (int c = 0; c < 8; c++)
                    _mm256_store_si256((__m256i *)(void *)(q + 32 * c), x_kchunk(type, wb, c));
                int k = 0;
                /* 8 rows at once: the horizontal sums as two 8-way reductions and
                 * the float expression of x_kfinish lane-wise (same bits) */
                for (; k + 8 <= g; k += 8) {
                    __m256i iv[8];
                    QT_UNROLL8
                    for (int u = 0; u < 8; u++) iv[u] = x_kdot(type, wb, q, &ks, x_arow(A, as, b0 + k + u, i));
                    x_k8_finish(iv, ks.mv, A, as, b0 + k, i, ks.fd, ks.fm, sums + k);
                }
                for (; k < g; k++) {
                    const qt_block_q8_K *a = x_arow(A, as, b0 + k, i);
                    sums[k] = x_kfinish(x_kdot(type, wb, q, &ks, a), &ks, a, sums[k]);
                }
            }
            for (int k = 0; k < g; k++) Y[(b0 + k) * ldy + r] = sums[k];
        }
    }
}

/* ---- i-quants and iq4_xs (q8_K activations) ----
 * A super-block is unpacked once per (weight row, group of up to 64
 * activation rows) into signed bytes q[256] and per-16 int16 scales (iq4_xs
 * in registers: nibbles through a pshufb table; the grid types through
 * qt_iq_unpack), then dotted with each activation row: |q| against
 * sign(a, q) by maddubs (|q|, |a| <= 127: no int16 saturation), times the
 * scales by madd, into exact int32 totals; the float finish is
 * qt_iq_dot_ref's expression: bit-identical, batch-invariant. */

typedef struct {
    int8_t q[256] __attribute__((aligned(32)));
    __m256i sv[8];   /* per 32-value chunk: lanes 0-7 scale of its 1st 16 values, 8-15 of the 2nd */
    float fd;
    int16_t s[16];
    int8_t g[8];
    int has_g;       /* iq1_s: the delta term */
} x_iqb;

QT_AI void x_iq_prep(uint32_t type, const uint8_t *b, x_iqb *u)
{
    if (type == QT_IQ4_XS) {
        const qt_block_iq4_xs *x = (const void *)b;
        const __m256i tab = x_nl_table(QT_IQ4_NL);
        const __m256i tab_s = QT_SVNNI ? _mm256_xor_si256(tab, _mm256_set1_epi8((char)0x80)) : tab;
        QT_UNROLL8
        for (int c = 0; c < 8; c++) {
            _mm256_store_si256((__m256i *)(void *)(u->q + 32 * c), _mm256_shuffle_epi8(tab_s, x_nibbles(x->qs + 16 * c)));
            const int ls = (((x->scales_l[c / 2] >> (4 * (c % 2))) & 0xf) | (((x->scales_h >> (2 * c)) & 3) << 4)) - 32;
            u->s[2 * c] = u->s[2 * c + 1] = (int16_t)ls;
        }
        u->fd = x_h2f(b);
        u->has_g = 0;
    } else {
        qt_iq_unpack(type, b, u->q, u->s, u->g, &u->fd);
        u->has_g = type == QT_IQ1_S;
    }
    QT_UNROLL8
    for (int c = 0; c < 8; c++)
        u->sv[c] = _mm256_set_m128i(_mm_set1_epi16(u->s[2 * c + 1]), _mm_set1_epi16(u->s[2 * c]));
}

QT_AI float x_iq_finish(const x_iqb *u, const qt_block_q8_K *a, float sum)
{
    int32_t msum = 0;
    if (u->has_g)
        for (int j = 0; j < 8; j++) msum += u->g[j] * u->s[2 * j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    QT_UNROLL8
    for (int c = 0; c < 8; c += 2) {
        const __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)(u->q + 32 * c));
        const __m256i w1 = _mm256_load_si256((const __m256i *)(const void *)(u->q + 32 * c + 32));
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x_ld((const uint8_t *)a->qs + 32 * c), w0));
        const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(x_ld((const uint8_t *)a->qs + 32 * c + 32), w1));
        acc0 = QT_MADD_ACC(acc0, p0, u->sv[c]);
        acc1 = QT_MADD_ACC(acc1, p1, u->sv[c + 1]);
    }
    const int32_t isum = x_hsum_i32(_mm256_add_epi32(acc0, acc1));
    return sum + (u->fd * a->d) * ((float)isum + 0.125f * (float)msum);
}

/* iq4_xs against one activation row, decoded in registers (decode): the
 * same int32 total and float expression as x_iq_finish. One scale per 32
 * values: maddubs pairs times the broadcast scale. */
QT_AI float x_iq4xs_1(const uint8_t *wb, const qt_block_q8_K *a, float sum)
{
    const qt_block_iq4_xs *x = (const void *)wb;
    const __m256i tab = _mm256_set_m128i(
        _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113),
        _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
    uint32_t sl;
    memcpy(&sl, x->scales_l, 4);
    const uint32_t sh = x->scales_h;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    QT_UNROLL8
    for (int c = 0; c < 8; c += 2) {
        const int l0 = (int)(((sl >> (4 * c)) & 15) | (((sh >> (2 * c)) & 3) << 4)) - 32;
        const int l1 = (int)(((sl >> (4 * c + 4)) & 15) | (((sh >> (2 * c + 2)) & 3) << 4)) - 32;
        const __m256i w0 = _mm256_shuffle_epi8(tab, x_nibbles(x->qs + 16 * c));
        const __m256i w1 = _mm256_shuffle_epi8(tab, x_nibbles(x->qs + 16 * c + 16));
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x_ld((const uint8_t *)a->qs + 32 * c), w0));
        const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(x_ld((const uint8_t *)a->qs + 32 * c + 32), w1));
        acc0 = QT_MADD_ACC(acc0, p0, _mm256_set1_epi16((short)l0));
        acc1 = QT_MADD_ACC(acc1, p1, _mm256_set1_epi16((short)l1));
    }
    const int32_t isum = x_hsum_i32(_mm256_add_epi32(acc0, acc1));
    return sum + (x_h2f(wb) * a->d) * ((float)isum + 0.125f * (float)0);
}

QT_AI void x_iqk(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                 const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    const size_t bs = qt_block_bytes(type);
    const int64_t nsb = n / 256;
    x_iqb u;
    float sums[64];
    if (type == QT_IQ4_XS && nb == 1) {
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = W + r * ws;
            float sum = 0;
            for (int64_t i = 0; i < nsb; i++) {
                _mm_prefetch((const char *)wr + i * bs + QT_PF, _MM_HINT_T0);
                _mm_prefetch((const char *)wr + i * bs + QT_PF + 64, _MM_HINT_T0);
                _mm_prefetch((const char *)wr + i * bs + QT_PF + 128, _MM_HINT_T0);
                sum = x_iq4xs_1(wr + i * bs, (const void *)(A + i * sizeof(qt_block_q8_K)), sum);
            }
            Y[r] = sum;
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = W + r * ws;
        for (int b0 = 0; b0 < nb; b0 += 64) {
            const int g = nb - b0 < 64 ? nb - b0 : 64;
            for (int k = 0; k < g; k++) sums[k] = 0;
            for (int64_t i = 0; i < nsb; i++) {
                const uint8_t *wb = wr + i * bs;
                for (size_t o = 0; o < bs; o += 64) _mm_prefetch((const char *)wb + QT_PF + o, _MM_HINT_T0);
                x_iq_prep(type, wb, &u);
                for (int k = 0; k < g; k++)
                    sums[k] = x_iq_finish(&u, x_arow(A, as, b0 + k, i), sums[k]);
            }
            for (int k = 0; k < g; k++) Y[(b0 + k) * ldy + r] = sums[k];
        }
    }
}

/* ---- float weights, f32 activations ---- */

QT_AI __m256 x_load8(uint32_t type, const uint8_t *w, int64_t i)
{
    if (type == QT_F32) return _mm256_loadu_ps((const float *)(const void *)(w + 4 * i));
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(w + 2 * i));
    if (type == QT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

QT_AI float x_load1(uint32_t type, const uint8_t *w, int64_t i)
{
    if (type == QT_F32) { float f; memcpy(&f, w + 4 * i, 4); return f; }
    uint16_t h;
    memcpy(&h, w + 2 * i, 2);
    if (type == QT_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

QT_AI void x_float_rows(uint32_t type, int NB, int64_t n, const uint8_t *wr, const uint8_t *a0,
                        size_t as, float *out)
{
    const size_t wsz = type == QT_F32 ? 4 : 2;
    __m256 acc[4][2];
    QT_UNROLL8
    for (int k = 0; k < NB; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)wr + i * wsz + QT_PF, _MM_HINT_T0);
        const __m256 w0 = x_load8(type, wr, i), w1 = x_load8(type, wr, i + 8);
        QT_UNROLL8
        for (int k = 0; k < NB; k++) {
            const float *x = (const float *)(const void *)(a0 + k * as);
            acc[k][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc[k][0]);
            acc[k][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc[k][1]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = x_load8(type, wr, i);
        QT_UNROLL8
        for (int k = 0; k < NB; k++) {
            const float *x = (const float *)(const void *)(a0 + k * as);
            acc[k][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc[k][0]);
        }
    }
    QT_UNROLL8
    for (int k = 0; k < NB; k++) {
        const float *x = (const float *)(const void *)(a0 + k * as);
        float s = x_hsum_ps(_mm256_add_ps(acc[k][0], acc[k][1]));
        for (int64_t j = i; j < n; j++) s += x_load1(type, wr, j) * x[j];
        out[k] = s;
    }
}

QT_AI void x_float(uint32_t type, int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1,
                   const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy)
{
    float out[4];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = W + r * ws;
        for (int b0 = 0; b0 < nb;) {
            const int rem = nb - b0, g = rem >= 4 ? 4 : rem;
            const uint8_t *a0 = A + b0 * as;
            switch (g) {
            case 4: x_float_rows(type, 4, n, wr, a0, as, out); break;
            case 3: x_float_rows(type, 3, n, wr, a0, as, out); break;
            case 2: x_float_rows(type, 2, n, wr, a0, as, out); break;
            default: x_float_rows(type, 1, n, wr, a0, as, out); break;
            }
            for (int k = 0; k < g; k++) Y[(b0 + k) * ldy + r] = out[k];
            b0 += g;
        }
    }
}

#define QT_GE_FAM(fam) x_##fam
#define QT_GE_NAME QT_KERNEL_NAME
#include "engine/quant/gemm_entry.h"

#endif
