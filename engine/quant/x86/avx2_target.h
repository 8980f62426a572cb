/* avx2_target.h — opens the AVX2 + FMA + F16C region of the AVX2 kernel
 * files (x86/avx2.c, x8.c); engine/quant/target_pop.h ends it. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
