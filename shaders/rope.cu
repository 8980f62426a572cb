// rope.cu — rotary embedding and the paged KV-cache store.
#include "shaders/common.cuh"

/* block per token: the angles once per pair into shared memory, then every
 * (head, pair) in parallel */
__global__ void k_rope(float *x, const int32_t *pos, int n_heads, int hd, int n_rot, float base, int neox,
                       const float *fd)
{
    pdl_begin();
    __shared__ float cs[512], sn[512];
    int t = blockIdx.x, half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cs(pos[t], i, n_rot, base, fd, neox, cs[i], sn[i]);
    __syncthreads();
    for (int k = threadIdx.x; k < half * n_heads; k += blockDim.x) {
        int h = k / half, i = k % half, i0, i1;
        float o0, o1;
        rope_pair(x + ((size_t)t * n_heads + h) * hd, i, half, neox, cs[i], sn[i], o0, o1, i0, i1);
    }
}

__global__ void k_kv_store(void *kc, void *vc, int f16, const int32_t *pos, const int32_t *off,
                           const int32_t *pages, int kv_dim, const float *k, const float *v)
{
    pdl_begin();
    int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    size_t s = kv_slot(off, pages, t, pos[t]) * (size_t)kv_dim + i;
    kv_put(kc, f16, s, k[(size_t)t * kv_dim + i]);
    kv_put(vc, f16, s, v[(size_t)t * kv_dim + i]);
}

/* The KV store into a q8_0 cache: a warp per block of 32 values of a
 * token's k and v rows (kv_put_q8) */
__global__ void k_kv_store_q8(void *kc, void *vc, const int32_t *pos, const int32_t *off, const int32_t *pages,
                              int kv_dim, const float *k, const float *v)
{
    pdl_begin();
    const int t = blockIdx.y, lane = threadIdx.x & 31;
    const int blk = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), nb = kv_dim / 32;
    if (blk >= nb) return;
    const size_t row = kv_slot(off, pages, t, pos[t]) * (size_t)nb + blk;
    for (int w = 0; w < 2; w++)
        kv_put_q8((uint8_t *)(w ? vc : kc) + row * CK_KV_Q8_BLOCK,
                  (w ? v : k)[(size_t)t * kv_dim + (size_t)blk * 32 + lane], lane);
}

/* rope of q and k, then kv_store of k and v, in one launch: block (t, h),
 * h < n_head a head of q, else head h - n_head of k (and v): the same
 * values as k_rope, k_rope, k_kv_store. f16: the cache type (0 f32, 1
 * f16, CK_KV_Q8_0: the head's k and v rows, once roped, by the block's
 * warps a 32-value block each, k_kv_store_q8's bytes). */
__global__ void k_rope_kv(float *q, float *k, const float *v, void *kc, void *vc, int f16, const int32_t *pos,
                          const int32_t *off, const int32_t *pages, int n_head, int n_head_kv, int hd, int n_rot,
                          float base, int neox, const float *fd, const float *bq, const float *bk,
                          const float *bv, float2 *tab, int tmode)
{
    pdl_begin();
    int t = blockIdx.x, h = blockIdx.y, half = n_rot / 2, p = pos[t];
    int isk = h >= n_head, hh = isk ? h - n_head : h;
    float *x = isk ? k + ((size_t)t * n_head_kv + hh) * hd : q + ((size_t)t * n_head + hh) * hd;
    const float *bx = isk ? (bk ? bk + (size_t)hh * hd : NULL) : (bq ? bq + (size_t)hh * hd : NULL);
    const float *bvh = bv ? bv + (size_t)hh * hd : NULL;
    int kvd = n_head_kv * hd;
    size_t s = isk ? kv_slot(off, pages, t, p) * (size_t)kvd + (size_t)hh * hd : 0;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float cs, sn, o0, o1;
        int i0, i1;
        if (tmode == 2) {
            float2 a = tab[(size_t)t * half + i];
            cs = a.x; sn = a.y;
        } else {
            rope_cs(p, i, n_rot, base, fd, neox, cs, sn);
            if (tmode == 1 && h == 0) tab[(size_t)t * half + i] = make_float2(cs, sn);
        }
        rope_pair(x, i, half, neox, cs, sn, o0, o1, i0, i1, bx);
        if (isk && f16 != CK_KV_Q8_0) { kv_put(kc, f16, s + i0, o0); kv_put(kc, f16, s + i1, o1); }
    }
    /* past the rotated dims: as they are (with the bias) */
    if (bx)
        for (int d = n_rot + threadIdx.x; d < hd; d += blockDim.x) x[d] = __fadd_rn(x[d], bx[d]);
    if (!isk) return;
    const float *vr = v + ((size_t)t * n_head_kv + hh) * hd;
    if (f16 == CK_KV_Q8_0) {
        __syncthreads();   /* (every value of the k row is written) */
        const int lane = threadIdx.x & 31;
        for (int b = threadIdx.x >> 5; b < hd / 32; b += blockDim.x >> 5) {
            const int d = 32 * b + lane;
            const size_t blk = (s + 32 * b) / 32 * CK_KV_Q8_BLOCK;
            kv_put_q8((uint8_t *)kc + blk, x[d], lane);
            kv_put_q8((uint8_t *)vc + blk, bvh ? __fadd_rn(vr[d], bvh[d]) : vr[d], lane);
        }
        return;
    }
    if (bx) __syncthreads();   /* (the tail written above is read below by other threads) */
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        if (d >= n_rot) kv_put(kc, f16, s + d, x[d]);
        kv_put(vc, f16, s + d, bvh ? __fadd_rn(vr[d], bvh[d]) : vr[d]);
    }
}

extern "C" {

void ck_rope(cudaStream_t st, float *x, const int32_t *pos, int T, int n_heads, int hd, int n_rot, float base,
             int neox, const float *fd)
{
    lk(k_rope, T, 256, 0, st, x, pos, n_heads, hd, n_rot, base, neox, fd);
}

void ck_kv_store(cudaStream_t st, void *kc, void *vc, int f16, const int32_t *pos, const int32_t *off,
                 const int32_t *pages, int T, int kv_dim, const float *k, const float *v)
{
    if (f16 == CK_KV_Q8_0) {
        dim3 g(nblk((size_t)kv_dim, 128), T);   /* (4 blocks of 32 per 128 threads) */
        lk(k_kv_store_q8, g, 128, 0, st, kc, vc, pos, off, pages, kv_dim, k, v);
        return;
    }
    dim3 g(nblk(kv_dim, 128), T);
    lk(k_kv_store, g, 128, 0, st, kc, vc, f16, pos, off, pages, kv_dim, k, v);
}

void ck_rope_kv(cudaStream_t st, float *q, float *k, const float *v, void *kc, void *vc, int f16,
                const int32_t *pos, const int32_t *off, const int32_t *pages, int T, int n_head, int n_head_kv,
                int hd, int n_rot, float base, int neox, const float *fd, const float *bq, const float *bk,
                const float *bv, void *tab, int tab_mode)
{
    dim3 g(T, n_head + n_head_kv);
    int bs = hd / 2 > 32 ? 128 : 32;
    lk(k_rope_kv, g, bs, 0, st, q, k, v, kc, vc, f16, pos, off, pages, n_head, n_head_kv, hd, n_rot, base, neox, fd,
       bq, bk, bv, (float2 *)tab, tab ? tab_mode : 0);
}

}  /* extern "C" */
