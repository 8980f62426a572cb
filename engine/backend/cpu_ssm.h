/* cpu_ssm.h — the CPU backend's optional ops for linear-attention
 * (Gated DeltaNet) and gated-attention layers (engine-internal; contracts in
 * backend.h). */
#ifndef ANE_BACKEND_CPU_SSM_H
#define ANE_BACKEND_CPU_SSM_H

#include "engine/backend/backend.h"

struct pool;
/* From cpu.c: the backend's thread pool, and a scratch buffer of at
 * least `bytes` that lives until the next call (grown on the calling thread,
 * never during pool work; aborts when memory runs out, like matmul). */
struct pool *be_cpu_pool(be *b);
void *be_cpu_scratch(be *b, size_t bytes);

be_copy_rows_fn cpu_copy_rows;
be_sigmoid_mul_fn cpu_sigmoid_mul;
be_rmsnorm_gated_fn cpu_rmsnorm_gated;
be_conv1d_silu_fn cpu_conv1d_silu;
be_deltanet_fn cpu_deltanet;

#endif
