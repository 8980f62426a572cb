/* gemm_entry.h — the end of each ISA's gemm kernels (x86/kernels.h,
 * arm/neon.c): one non-inlined instance per weight type of the ISA's kernel
 * families QT_GE_FAM(small), QT_GE_FAM(kquant), QT_GE_FAM(iqk) and QT_GE_FAM(float), so each
 * is specialised for its type, and the entry QT_GE_NAME that picks one (-1:
 * a type without kernels, or n not whole blocks). Define both, then include
 * once, after the kernels. */

/* Every weight type with SIMD kernels: X(name, family, type). */
#define QT_GE_TYPES(X) \
    X(q4_0, small, QT_Q4_0) X(q4_1, small, QT_Q4_1) X(q5_0, small, QT_Q5_0) X(q5_1, small, QT_Q5_1) \
    X(q8_0, small, QT_Q8_0) X(q2_K, kquant, QT_Q2_K) X(q3_K, kquant, QT_Q3_K) X(q4_K, kquant, QT_Q4_K) \
    X(q5_K, kquant, QT_Q5_K) X(q6_K, kquant, QT_Q6_K) X(f32, float, QT_F32) X(f16, float, QT_F16) \
    X(bf16, float, QT_BF16) X(iq4_nl, small, QT_IQ4_NL) X(mxfp4, small, QT_MXFP4) \
    X(iq4_xs, iqk, QT_IQ4_XS) X(iq2_xxs, iqk, QT_IQ2_XXS) X(iq2_xs, iqk, QT_IQ2_XS) X(iq2_s, iqk, QT_IQ2_S) \
    X(iq3_xxs, iqk, QT_IQ3_XXS) X(iq3_s, iqk, QT_IQ3_S) X(iq1_s, iqk, QT_IQ1_S)

#define QT_GE_INST(nm, fam, T) \
    static void qt_ge_##nm(int64_t n, const uint8_t *W, size_t ws, int64_t r0, int64_t r1, \
                           const uint8_t *A, size_t as, int nb, float *Y, int64_t ldy) \
    { QT_GE_FAM(fam)(T, n, W, ws, r0, r1, A, as, nb, Y, ldy); }
QT_GE_TYPES(QT_GE_INST)

int QT_GE_NAME(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
               int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
               float *Y, int64_t ldy)
{
    void (*fn)(int64_t, const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, size_t, int,
               float *, int64_t);
    switch (wtype) {
#define QT_GE_CASE(nm, fam, T) case T: fn = qt_ge_##nm; break;
    QT_GE_TYPES(QT_GE_CASE)
    default: return -1;
    }
    const qt_traits *t = qt_get(wtype);
    if (n <= 0 || n % t->blck) return -1;
    fn(n, W, w_stride, r0, r1, A, a_stride, nb, Y, ldy);
    return 0;
}
