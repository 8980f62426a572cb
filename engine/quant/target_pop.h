/* target_pop.h — ends the instruction-set region that a kernel file opened
 * with a clang attribute push or GCC push_options (included at its end). */
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
