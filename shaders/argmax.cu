// argmax.cu — the greedy ids of logit rows.
#include "shaders/common.cuh"

/* Block (row, part) of P: the best (value, first index) of its share of the
 * row, to part[row][P] (the index as the float's bits); with P == 1 the
 * index itself to ids. Max with the smaller index on ties is associative,
 * so the split does not change the result. mask (NULL or [rows][nw] bits):
 * only the tokens whose bit is set compete. */
__global__ void k_argmax(const float *x, int n, const uint32_t *mask, int nw, int32_t *ids, float2 *part)
{
    pdl_begin();
    const float *r = x + (size_t)blockIdx.x * n;
    const uint32_t *mr = mask ? mask + (size_t)blockIdx.x * nw : NULL;
    int P = gridDim.y, per = (n + P - 1) / P, i0 = blockIdx.y * per, i1 = min(n, i0 + per);
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        float v = r[i];
        if (mr && !((mr[i >> 5] >> (i & 31)) & 1u)) continue;
        if (v > best) { best = v; bi = i; }
    }
    __shared__ float sv[1024];
    __shared__ int si[1024];
    sv[threadIdx.x] = best; si[threadIdx.x] = bi;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            float v = sv[threadIdx.x + k];
            int j = si[threadIdx.x + k];
            if (v > sv[threadIdx.x] || (v == sv[threadIdx.x] && j < si[threadIdx.x])) { sv[threadIdx.x] = v; si[threadIdx.x] = j; }
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    if (P == 1) ids[blockIdx.x] = si[0] == 0x7fffffff ? 0 : si[0];
    else part[(size_t)blockIdx.x * P + blockIdx.y] = make_float2(sv[0], __int_as_float(si[0]));
}

/* one warp per row: the P (<= 32) parts of k_argmax, combined */
__global__ void k_argmax_fin(const float2 *part, int P, int32_t *ids)
{
    pdl_begin();
    int lane = threadIdx.x;
    float v = -INFINITY;
    int j = 0x7fffffff;
    if (lane < P) {
        float2 p = part[(size_t)blockIdx.x * P + lane];
        v = p.x; j = __float_as_int(p.y);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int j2 = __shfl_xor_sync(0xffffffffu, j, o);
        if (v2 > v || (v2 == v && j2 < j)) { v = v2; j = j2; }
    }
    if (lane == 0) ids[blockIdx.x] = j == 0x7fffffff ? 0 : j;
}

extern "C" {

void ck_argmax(cudaStream_t st, const float *x, int rows, int n, const uint32_t *mask, int32_t *ids, void *part)
{
    /* a row per block when there are enough rows; else each row split in
     * up to 32 parts (one block scanning a 150k vocabulary is latency-bound) */
    int P = !part || rows >= 64 ? 1 : min(32, max(1, n / 4096));
    dim3 g(rows, P);
    lk(k_argmax, g, 1024, 0, st, x, n, mask, (n + 31) / 32, ids, (float2 *)part);
    if (P > 1) lk(k_argmax_fin, rows, 32, 0, st, (const float2 *)part, P, ids);
}

}  /* extern "C" */
