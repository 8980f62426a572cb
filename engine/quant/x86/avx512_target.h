/* avx512_target.h — opens the AVX-512 (F, BW, VL, DQ, VNNI) region of the
 * AVX-512 and AMX kernel files; engine/quant/target_pop.h ends it. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif
