/* qt_avx2.c — gemm kernels for AVX2 + FMA + F16C (see qt_x86.h). Built with
 * a per-file target so the library still runs on CPUs without AVX2; qt_gemm
 * only calls in here after cpuid/xgetbv said yes. */
#include "engine/qtypes.h"

#if defined(__x86_64__) || defined(__i386__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

#define QT_DOT_US(acc, u, s) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#define QT_MADD_ACC(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#define QT_KERNEL_NAME qt_gemm_avx2
#include "engine/qt_x86.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
typedef int qt_avx2_unused;
#endif
