/* t_cuda.h — what t_backend's CUDA files (t_cuda_*.c) share: the random
 * data, the backends every test runs on (opened by t_cuda_run) and the tests
 * themselves. */
#ifndef ANE_T_CUDA_H
#define ANE_T_CUDA_H

#define CHECK_SHARED
#include "engine/backend/backend.h"
#include "engine/pool.h"
#include "engine/quant/qtypes.h"
#include "tests/check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef ANE_CUDA
#include <cuda_runtime_api.h>
#include "shaders/kernels.h"
#endif

uint32_t rnd(void);
float frand(void);                                   /* [-1, 1) */
double rel_err(const float *a, const double *ref, size_t n);
double rel_err_f(const float *a, const float *ref, size_t n);
void put_f16(uint8_t *p, float v);
/* random weight bytes of a valid layout: random quants, small positive scales */
void *make_weight(uint32_t type, int n_in, int n_out, size_t *row_bytes);
/* p kept alive to the end: backends key uploads by host pointer */
void *kept(void *p);
/* a CUDA backend with the paths f forces (NULL: the defaults), in this
 * round's path */
int gpu_open(be **b, int kv_type, const be_cuda_force *f, char *err, size_t errlen);
/* perm = 0 .. n-1 shuffled: the scrambled page tables of the attention tests */
void page_perm(int32_t *perm, int n);
float *dev_from(be *b, const float *h, size_t n);

static const uint32_t TYPES[] = { QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0,
                                  QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4,
                                  QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_IQ1_S };
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* gpu, cpu: f16 KV caches; gpu32, cpu32: f32; gpuv: a GPU backend whose GEMV
 * takes every batch (open only around the invariance tests) */
extern be *gpu, *gpu32, *cpu, *cpu32, *gpuv;
extern pool *pl;
/* 1 in the second round of the tests: every backend on the portable path
 * (no Hopper feature), as on an 8.x device */
extern int portable;

/* every CUDA test on both paths, only those whose name holds only (when not
 * NULL); -1 when a backend does not open, 0 else (no GPU: nothing run) */
int t_cuda_run(const char *only);

void test_matmul(void);
void test_mmqb(void);
void test_fused(void);
void test_glu(void);
void test_glu_batched(void);
void test_fused_quant(void);
void test_invariance(void);
void test_deterministic(void);
void test_int8_prompt(void);
void test_q6b_layout(void);
void test_embed(void);
void test_elementwise(void);
void test_norms(void);
void test_rope(void);
void test_argmax(void);
void test_argmax_mask(void);
void test_gelu_layernorm(void);
void test_rope_kv(void);
void test_qkv_rope(void);
void test_rope_attention(void);
void test_att_group(void);
void test_attention(void);
void test_attention_ex(void);
void test_attention_prompt(void);
void test_ssm_elementwise(void);
void test_conv1d(void);
void test_deltanet(void);
void test_moe(void);

#endif
