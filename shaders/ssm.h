/* ssm.h — launchers of the CUDA kernels for linear-attention (Gated
 * DeltaNet) and gated-attention layers (shaders/ssm.cu), used by the
 * CUDA backend (engine/backend_cuda.c); contracts as the ops in
 * engine/backend.h. Every launcher queues work on `st` and returns at once;
 * pointers are device memory. pos and slot are the per-step device rows
 * ([T] each) of the batch. The recurrent ops cover the batch tokens t0..t1-1:
 * the backend splits a batch at save points and copies the saved state
 * between launches. They read pos and slot on the device only, so a
 * recorded pass (CUDA graph) replays them for new batches of the same size. */
#ifndef ANE_CUDA_SSM_H
#define ANE_CUDA_SSM_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CS_CONV_KMAX 16     /* conv taps */
#define CS_DN_DVMAX 1024    /* value-head size (one thread per value column) */

/* dst[r*dst_stride + i] = src[r*src_stride + i], i < n, r < rows. */
void cs_copy_rows(cudaStream_t st, float *dst, size_t dst_stride, const float *src, size_t src_stride, int rows,
                  int n);
/* x *= sigmoid(g)                                                   [n] */
void cs_sigmoid_mul(cudaStream_t st, float *x, const float *g, size_t n);
/* out[r] = x[r] / rms(x[r]) * w * silu(z[r]); out == x allowed.  [rows][n] */
void cs_rmsnorm_gated(cudaStream_t st, const float *x, const float *z, const float *w, int rows, int n, float eps,
                      float *out);
/* Causal depthwise conv + SiLU of tokens t0..t1-1 (state [max_seqs][K-1][C],
 * w [C][K]); out == x allowed. -1 (nothing queued) when K > CS_CONV_KMAX. */
int cs_conv1d_silu(cudaStream_t st, const float *x, const float *w, float *state, const int32_t *pos,
                   const int32_t *slot, int t0, int t1, int C, int K, float *out);
/* Gated delta rule of tokens t0..t1-1, token by token in position order per
 * sequence (state [max_seqs][nv][dk][dv], value head h on key head h % nk).
 * -1 (nothing queued) when dv > CS_DN_DVMAX. */
int cs_deltanet(cudaStream_t st, const float *qkv, size_t stride, const float *a, const float *bb, const float *A,
                const float *dt_bias, float *state, const int32_t *pos, const int32_t *slot, int t0, int t1,
                int nk, int nv, int dk, int dv, float eps, float *out);

#ifdef __cplusplus
}
#endif
#endif
