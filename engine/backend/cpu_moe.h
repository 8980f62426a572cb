/* cpu_moe.h — the CPU backend's mixture-of-experts op (engine-internal;
 * contract in backend.h, be_moe). */
#ifndef ANE_BACKEND_CPU_MOE_H
#define ANE_BACKEND_CPU_MOE_H

#include "engine/backend/backend.h"

size_t cpu_moe_scratch(be *b, const be_moe *m, int max_T);
void cpu_moe(be *b, const be_moe *m, const float *x, int T, void *scratch, float *out);
/* From cpu.c: the backend's count of near-tie router choices. */
long *be_cpu_moe_tie_count(be *b);

#endif
