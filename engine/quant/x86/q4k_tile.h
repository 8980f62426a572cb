/* q4_K's 8-row tile body (x8.c's layout: 8 rows' quants interleaved by
 * 32-byte chunk, then their scales, mins, d and dmin), included by x8.c
 * twice: in the AVX2 region with Q4K_TILE_VNNI 0 (maddubs into int16, then
 * madd by the chunk's scale; T <= 2) and in the AVX-512 region with
 * Q4K_TILE_VNNI 1 (vpdpbusd into int32; T <= 4). Both give the same
 * integers, and q4k_finish the same float expression: the same bits.
 *
 * With VNNI, per chunk the low and the high nibbles' products in int32
 * apart, each 16 products of at most 15 * 128 = 30,720 a lane, so that one
 * vpdpwssd (the lane's low 16 bits times the scale; its high half, the
 * sign, times 0) multiplies each by the chunk's scale. */
#if Q4K_TILE_VNNI
#define Q4K_TILE_T 4
X8_AI void q4k_tile_avx512(int T, const uint8_t *p, int64_t nsb, const uint8_t *const *a, float *const *y)
#else
#define Q4K_TILE_T 2
X8_AI void q4k_tile_avx2(int T, const uint8_t *p, int64_t nsb, const uint8_t *const *a, float *const *y)
#endif
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 sums[Q4K_TILE_T];
    X8_UNROLL
    for (int t = 0; t < T; t++) sums[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; i++, p += 1184) {
#if Q4K_TILE_VNNI
        /* every line of the group's superblock 4 ahead (the scales here,
         * the quants chunk by chunk below): decode +10% on Zen 5, where
         * one line 2 ahead left the rest to the hardware prefetchers */
        _mm_prefetch((const char *)p + 4 * 1184 + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)p + 4 * 1184 + 1088, _MM_HINT_T0);
        _mm_prefetch((const char *)p + 4 * 1184 + 1152, _MM_HINT_T0);
#else
        _mm_prefetch((const char *)p + 2 * 1184, _MM_HINT_T0);
#endif
        const qt_block_q8_K *ab[Q4K_TILE_T];
        X8_UNROLL
        for (int t = 0; t < T; t++) ab[t] = (const qt_block_q8_K *)(const void *)a[t] + i;
        __m256i acc[Q4K_TILE_T];
        X8_UNROLL
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
        X8_UNROLL
        for (int c = 0; c < 8; c++) {
#if Q4K_TILE_VNNI
            _mm_prefetch((const char *)p + 4 * 1184 + 128 * c, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 4 * 1184 + 128 * c + 64, _MM_HINT_T0);
            __m256i lo[Q4K_TILE_T], hi[Q4K_TILE_T];   /* the low and the high nibbles' products */
            X8_UNROLL
            for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_si256();
#else
            __m256i lo[Q4K_TILE_T];   /* both nibbles' products, in int16 */
            X8_UNROLL
            for (int t = 0; t < T; t++) lo[t] = _mm256_setzero_si256();
#endif
            X8_UNROLL
            for (int h = 0; h < 4; h++) {
                const __m256i v = _mm256_load_si256((const __m256i *)(const void *)(p + (4 * c + h) * 32));
                const __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                X8_UNROLL
                for (int t = 0; t < T; t++) {
                    int32_t l, u;
                    memcpy(&l, ab[t]->qs + 32 * c + 4 * h, 4);
                    memcpy(&u, ab[t]->qs + 32 * c + 16 + 4 * h, 4);
#if Q4K_TILE_VNNI
                    lo[t] = _mm256_dpbusd_epi32(lo[t], wl, _mm256_set1_epi32(l));
                    hi[t] = _mm256_dpbusd_epi32(hi[t], wh, _mm256_set1_epi32(u));
#else
                    const __m256i pl = _mm256_maddubs_epi16(wl, _mm256_set1_epi32(l));
                    const __m256i ph = _mm256_maddubs_epi16(wh, _mm256_set1_epi32(u));
                    lo[t] = _mm256_add_epi16(lo[t], _mm256_add_epi16(pl, ph));
#endif
                }
            }
#if Q4K_TILE_VNNI
            const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + 1024 + 8 * c)));
            X8_UNROLL
            for (int t = 0; t < T; t++) acc[t] = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(acc[t], lo[t], s), hi[t], s);
#else
            const __m128i sc = _mm_loadl_epi64((const __m128i *)(const void *)(p + 1024 + 8 * c));
            const __m256i s = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc, sc));
            X8_UNROLL
            for (int t = 0; t < T; t++) acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(lo[t], s));
#endif
        }
        q4k_finish(T, p, ab, acc, sums);
    }
    X8_UNROLL
    for (int t = 0; t < T; t++) _mm256_storeu_ps(y[t], sums[t]);
}
#undef Q4K_TILE_T
