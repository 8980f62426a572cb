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

void cpu_copy_rows(be *b, float *dst, size_t dst_stride, const float *src, size_t src_stride, int rows, int n);
void cpu_sigmoid_mul(be *b, float *x, const float *g, size_t n);
void cpu_rmsnorm_gated(be *b, const float *x, const float *z, const wt *w, int rows, int n, float eps, float *out);
void cpu_conv1d_silu(be *b, const float *x, const wt *w, float *state, const be_batch *bt, int C, int K,
                     const be_save *sv, int n_sv, float *out);
void cpu_deltanet(be *b, const float *qkv, size_t stride, const float *a, const float *bb, const wt *A,
                  const wt *dt_bias, float *state, const be_batch *bt, int nk, int nv, int dk, int dv, float eps,
                  const be_save *sv, int n_sv, float *out);

#endif
