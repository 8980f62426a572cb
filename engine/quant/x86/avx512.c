/* avx512.c — gemm kernels for AVX-512 (F, BW, VL, DQ, VNNI): the kernels
 * of kernels.h with the u8*s8 dot done by vpdpbusd. The vectors stay 256 bits
 * wide (the VL encodings): on cores that split 512-bit operations in two
 * halves (Zen 4) that is the same throughput, without zmm frequency
 * penalties elsewhere. The exception is the q4_K / q6_K decode path
 * (QT_VNNI): there the instruction count, not the execution units, bounds
 * the speed, and zmm halves it. Never uses AMX. */
#include "engine/quant/qtypes.h"

#if defined(__x86_64__) || defined(__i386__)
#include "engine/quant/x86/avx512_target.h"

#include <immintrin.h>

#define QT_DOT_US(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define QT_MADD_ACC(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
#define QT_VNNI 1   /* vpdpbusd: K-quant chunks dotted without the int16 step */
#define QT_KERNEL_NAME qt_gemm_avx512

/* Small-block tiles: 16 activation rows (32 vector registers); the
 * broadcast activation bytes as vpdpbusd's memory operand, one op instead of
 * a load and a dot; weights may be unsigned up to 255 (no saturation). */
#define QT_SGMAX 16
#define QT_SVNNI 1
static inline __attribute__((always_inline)) __m256i qt_dot_bcast(__m256i acc, __m256i u, const void *p)
{
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int *)p));
    return acc;
}
#define QT_DOT_BCAST(acc, u, p) qt_dot_bcast((acc), (u), (p))
#include "engine/quant/x86/kernels.h"

#include "engine/quant/target_pop.h"
#else
typedef int qt_avx512_unused;
#endif
