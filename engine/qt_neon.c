/* qt_neon.c — aarch64 kernels. Not written yet: on aarch64 qt_gemm_neon
 * declines every type and qt_gemm uses the scalar reference. On other
 * architectures this file compiles to nothing. */
#include "engine/qtypes.h"

#if defined(__aarch64__)
int qt_gemm_neon(uint32_t wtype, int64_t n, const void *W, size_t w_stride,
                 int64_t r0, int64_t r1, const void *A, size_t a_stride, int nb,
                 float *Y, int64_t ldy)
{
    (void)wtype; (void)n; (void)W; (void)w_stride; (void)r0; (void)r1;
    (void)A; (void)a_stride; (void)nb; (void)Y; (void)ldy;
    return -1;
}
#else
typedef int qt_neon_unused;
#endif
