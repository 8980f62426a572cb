// att_prompt.cu — a prompt's attention on tensor cores: the q heads of a
// KV head for several consecutive tokens of one sequence in one block, so
// that each tile of cached K and V rows is read once for all of them.
#include "shaders/common.cuh"

#include <limits.h>

/* Outside the batch-invariance promise, as the prompt rows' matmuls are: a
 * warp's 16 MMA rows are NT = 16 / gh tokens' gh q heads of one KV head
 * (row r: token r / gh, head r % gh; rows past NT gh are zero), and a block
 * of APR_WARPS warps takes APR_WARPS NT consecutive tokens. The positions
 * go in tiles of APR_TILE rows of K and V, copied into shared memory once
 * for the block by cp.async, the next tile while this one is computed; a
 * warp takes each tile in two halves of 32 positions: S = Q K^T by
 * mma.m16n8k16 (q rounded to f16, as every attention with an f16 cache
 * rounds it; f32 sums), the causal (and sliding-window) mask per row, one
 * online-softmax step on S's fragments, and O += P V with P split into f16
 * high and low parts (two MMAs: P then carries ~2^-22 of rounding, so the
 * result is f32-accurate, as k_att_mma's). A tile or half that no row of a
 * warp sees is skipped by that warp. A sink (a logit without a value) joins
 * each row's sum at the end. A row's arithmetic does not depend on the
 * other tokens of its block: a tile that masks a row whole leaves its state
 * as it was. The block's tokens of another sequence (a batch's boundary
 * inside a block) are taken in a further round.
 * A q8_0 cache: the tiles hold the blocks' int8 values as f16 (exact) and
 * their scales apart; S sums each 32-dim block on its own and adds it
 * times the position's K scale, and P V takes P times each position's V
 * scale of the block's dims (split high and low as above). So only q's f16
 * rounding differs from the CPU's arithmetic. */
#define APR_WARPS 4
#define APR_TILE 64
template <int HD> struct apr_stage {
    __half k[APR_TILE][HD + 8], v[APR_TILE][HD + 8];   /* (+8: ldmatrix's 8 rows hit 8 bank groups) */
    float dk[HD / 32][APR_TILE], dv[HD / 32][APR_TILE];   /* a q8_0 cache's scales */
};
#define APR_SMEM(HD) (2 * sizeof(apr_stage<HD>))

template <int HD, int KV>
__global__ void __launch_bounds__(APR_WARPS * 32) k_att_pre(const void *kc, const void *vc, const float *q,
                                                     const int32_t *pos, const int32_t *off, const int32_t *pages,
                                                     int t_first, int T, int n_head, int n_head_kv, int window,
                                                     const float *sinks, float scale, float *out, act_forms qx)
{
    constexpr int KS = HD / 16, DT = HD / 8, PR = HD / 8, FS = HD + 8, NB = HD / 32;
    constexpr bool Q8 = KV == CK_KV_Q8_0;
    const float LOG2E = 1.4426950408889634f;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    const int gh = n_head / n_head_kv, nt = 16 / gh, tb = APR_WARPS * nt, kvh = blockIdx.y;
    /* (the last tokens, with the most positions, first) */
    const int b0 = t_first + (gridDim.x - 1 - blockIdx.x) * tb;
    const size_t kvd = (size_t)n_head_kv * HD;
    pdl_begin();
    extern __shared__ __align__(16) unsigned char apr_raw[];
    apr_stage<HD> *sb = (apr_stage<HD> *)apr_raw;
    __shared__ int s_off[APR_WARPS * 16], s_pos[APR_WARPS * 16];   /* (tb at most: gh >= 1) */
    for (int i = threadIdx.x; i < tb; i += blockDim.x) {
        const int t = b0 + i;
        s_off[i] = t < T ? off[t] : -1;
        s_pos[i] = t < T ? pos[t] : -1;
    }
    __syncthreads();
    int rtok[2];   /* rows g and g + 8: their tokens in the block (-1: none) */
#pragma unroll
    for (int r = 0; r < 2; r++) rtok[r] = (g + 8 * r) / gh < nt ? warp * nt + (g + 8 * r) / gh : -1;
    for (int lead = 0; lead < tb && s_off[lead] >= 0;) {
        /* this round: tokens [lead, next) of one sequence (page table at key) */
        const int key = s_off[lead];
        int next = lead + 1;
        while (next < tb && s_off[next] == key) next++;
        int hi = -1, blo = INT_MAX;
        for (int i = lead; i < next; i++) {
            hi = max(hi, s_pos[i]);
            blo = min(blo, window > 0 ? max(0, s_pos[i] - window + 1) : 0);
        }
        int P[2], lo[2], whi = -1, wlo = INT_MAX;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const bool live = rtok[r] >= lead && rtok[r] < next;
            P[r] = live ? s_pos[rtok[r]] : -1;
            lo[r] = live ? (window > 0 ? max(0, P[r] - window + 1) : 0) : INT_MAX;
            whi = max(whi, P[r]);
            wlo = min(wlo, lo[r]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
            wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        }
        /* the rows' q as A fragments (zero for rows without a token) */
        uint32_t qa[KS][4];
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i & 1, d = 16 * kk + 2 * qd + 8 * (i >> 1);
                float2 v = make_float2(0.f, 0.f);
                if (P[r] >= 0)
                    v = *(const float2 *)(q + ((size_t)(b0 + rtok[r]) * n_head + kvh * gh + (g + 8 * r) % gh) * HD + d);
                qa[kk][i] = h2u(__floats2half2_rn(v.x, v.y));
            }
        float m_r[2] = { -INFINITY, -INFINITY }, l_r[2] = { 0.f, 0.f }, o[DT][4];
#pragma unroll
        for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
        /* tile x's K and V rows (zeros past hi, the last position any row
         * sees) into stage b: f16 rows by cp.async, q8_0 blocks by loads
         * (their int8 values as f16, their scales apart) */
        auto load = [&](int x, int b) {
            const int p0 = x * APR_TILE;
            if constexpr (!Q8) {
                for (int e = threadIdx.x; e < 2 * APR_TILE * PR; e += blockDim.x) {
                    const int v = e / (APR_TILE * PR), j = (e / PR) % APR_TILE, pc = e % PR, p = min(p0 + j, hi);
                    const size_t slot = (size_t)pages[key + p / 16] * 16 + p % 16;
                    const __half *src = (const __half *)(v ? vc : kc) + slot * kvd + (size_t)kvh * HD + 8 * pc;
                    cp_async16(v ? &sb[b].v[j][8 * pc] : &sb[b].k[j][8 * pc], src, p0 + j <= hi ? 16 : 0);
                }
            } else {
                for (int e = threadIdx.x; e < 2 * APR_TILE * NB; e += blockDim.x) {
                    const int v = e / (APR_TILE * NB), j = (e / NB) % APR_TILE, bk = e % NB, p = min(p0 + j, hi);
                    const size_t slot = (size_t)pages[key + p / 16] * 16 + p % 16;
                    const uint16_t *src = (const uint16_t *)((const uint8_t *)(v ? vc : kc) +
                                                             ((slot * kvd + (size_t)kvh * HD) / 32 + bk) * CK_KV_Q8_BLOCK);
                    const bool in = p0 + j <= hi;
                    uint32_t h[16];
#pragma unroll
                    for (int w = 0; w < 16; w++) {
                        const uint32_t u = in ? src[1 + w] : 0u;
                        h[w] = h2u(__halves2half2(__short2half_rn((short)(int8_t)(u & 0xFF)),
                                                  __short2half_rn((short)(int8_t)(u >> 8))));
                    }
                    __half *dst = v ? &sb[b].v[j][32 * bk] : &sb[b].k[j][32 * bk];
#pragma unroll
                    for (int w = 0; w < 4; w++)
                        *(uint4 *)(dst + 8 * w) = make_uint4(h[4 * w], h[4 * w + 1], h[4 * w + 2], h[4 * w + 3]);
                    (v ? sb[b].dv : sb[b].dk)[bk][j] = in ? __half2float(__ushort_as_half(src[0])) : 0.f;
                }
            }
        };
        const int xf = blo / APR_TILE, xl = hi / APR_TILE;
        load(xf, 0);
        cp_commit();
        for (int x = xf, i = 0; x <= xl; x++, i++) {
            if (x < xl) load(x + 1, (i + 1) & 1);
            cp_commit();
            cp_wait<1>();      /* tile x is in ... */
            __syncthreads();   /* ... for every thread */
            const apr_stage<HD> &s = sb[i & 1];
#pragma unroll 1
            for (int h = 0; h < 2; h++) {
                const int q0 = x * APR_TILE + 32 * h, j0 = 32 * h;
                if (q0 > whi || q0 + 32 <= wlo) continue;   /* (warp-uniform) */
                /* S: rows g, g + 8; columns (positions) q0 + 8 n + 2 qd, + 1 */
                float c[4][4];
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
                    for (int kk = 0; kk < KS; kk += 2) {   /* (a q8_0 block: kk, kk + 1) */
                        uint32_t b[4];
                        float cb[4] = { 0.f, 0.f, 0.f, 0.f };
                        float (&cc)[4] = Q8 ? cb : c[n];
                        ldsm_x4(b, &s.k[j0 + 8 * n + (lane & 7)][16 * kk + 8 * ((lane >> 3) & 1) + 16 * (lane >> 4)]);
                        mma_f16(cc, qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[0], b[1]);
                        mma_f16(cc, qa[kk + 1][0], qa[kk + 1][1], qa[kk + 1][2], qa[kk + 1][3], b[2], b[3]);
                        if constexpr (Q8) {
                            const float2 d = *(const float2 *)&s.dk[kk / 2][j0 + 8 * n + 2 * qd];
                            c[n][0] = __fmaf_rn(d.x, cb[0], c[n][0]);
                            c[n][1] = __fmaf_rn(d.y, cb[1], c[n][1]);
                            c[n][2] = __fmaf_rn(d.x, cb[2], c[n][2]);
                            c[n][3] = __fmaf_rn(d.y, cb[3], c[n][3]);
                        }
                    }
                }
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int p = q0 + 8 * n + 2 * qd + (e & 1), r = e >> 1;
                        c[n][e] = p <= P[r] && p >= lo[r] ? c[n][e] * scale : -INFINITY;
                    }
                mma_soft_step<DT>(c, m_r, l_r, o);
                /* O += P V, positions j0 + 16 ks .. + 15 a k-step */
#pragma unroll
                for (int ks = 0; ks < 2; ks++) {
                    uint32_t ah[4], al[4];
#pragma unroll
                    for (int dt = 0; dt < DT; dt += 2) {
                        if (dt % 4 == 0 && (Q8 || dt == 0)) {   /* (q8_0: P times the V scales of dims 8 dt ..) */
                            float2 d0 = make_float2(1.f, 1.f), d1 = d0;
                            if constexpr (Q8) {
                                d0 = *(const float2 *)&s.dv[dt / 4][j0 + 16 * ks + 2 * qd];
                                d1 = *(const float2 *)&s.dv[dt / 4][j0 + 16 * ks + 8 + 2 * qd];
                            }
                            h2_split(c[2 * ks][0] * d0.x, c[2 * ks][1] * d0.y, ah[0], al[0]);
                            h2_split(c[2 * ks][2] * d0.x, c[2 * ks][3] * d0.y, ah[1], al[1]);
                            h2_split(c[2 * ks + 1][0] * d1.x, c[2 * ks + 1][1] * d1.y, ah[2], al[2]);
                            h2_split(c[2 * ks + 1][2] * d1.x, c[2 * ks + 1][3] * d1.y, ah[3], al[3]);
                        }
                        uint32_t b[4];
                        ldsm_x4_t(b, &s.v[j0 + 16 * ks + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * dt + 8 * (lane >> 4)]);
                        mma_f16(o[dt], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
                        mma_f16(o[dt], al[0], al[1], al[2], al[3], b[0], b[1]);
                        mma_f16(o[dt + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
                        mma_f16(o[dt + 1], al[0], al[1], al[2], al[3], b[2], b[3]);
                    }
                }
            }
            __syncthreads();   /* stage i & 1 is free for tile x + 2 */
        }
        cp_wait<0>();
        __syncthreads();
        /* the rows, normalized (a sink's weight joins the sum), through this
         * warp's part of the stages, then written a row at a time by the
         * warp, lane l holding value l of each 32-value block */
        float *fo = (float *)apr_raw + (size_t)warp * 16 * FS;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (P[r] < 0) continue;
            float f = 1.f, l = l_r[r];
            if (sinks) {
                const float sk = sinks[kvh * gh + (g + 8 * r) % gh], mn = fmaxf(m_r[r], sk);
                f = exp2f((m_r[r] - mn) * LOG2E);
                l = l * f + exp2f((sk - mn) * LOG2E);
            }
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *(float2 *)&fo[(g + 8 * r) * FS + 8 * dt + 2 * qd] =
                    make_float2(o[dt][2 * r] * f / l, o[dt][2 * r + 1] * f / l);
        }
        __syncwarp();
        for (int row = 0; row < nt * gh; row++) {
            const int tl = warp * nt + row / gh;
            if (tl < lead || tl >= next) continue;
            const size_t th = (size_t)(b0 + tl) * n_head + kvh * gh + row % gh;
            for (int d = lane; d < HD; d += 32) att_put_out(fo[row * FS + d], th * HD + d, lane, out, qx);
        }
        lead = next;
        __syncthreads();   /* (the stages are read before the next round's tiles) */
    }
}

extern "C" {

int ck_att_prompt_ok(int kv, int n_head, int n_head_kv, int hd)
{
    if ((kv != 1 && kv != CK_KV_Q8_0) || (hd != 64 && hd != 128) || n_head_kv < 1 || n_head % n_head_kv || n_head / n_head_kv > 16)
        return 0;
    if ((int)(hd == 64 ? APR_SMEM(64) : APR_SMEM(128)) > ck_feat_now()->smem_optin) return 0;
    static unsigned attr = 0;   /* (once a device) */
    if (ck_first_on_device(&attr)) {
        cudaFuncSetAttribute(k_att_pre<64, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)APR_SMEM(64));
        cudaFuncSetAttribute(k_att_pre<64, CK_KV_Q8_0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)APR_SMEM(64));
        if ((int)APR_SMEM(128) <= ck_feat_now()->smem_optin) {
            cudaFuncSetAttribute(k_att_pre<128, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)APR_SMEM(128));
            cudaFuncSetAttribute(k_att_pre<128, CK_KV_Q8_0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)APR_SMEM(128));
        }
    }
    return 1;
}

int ck_att_prompt_tokens(int n_head, int n_head_kv)
{
    return APR_WARPS * (16 / (n_head / n_head_kv));
}

void ck_att_prompt(cudaStream_t st, const float *q, const void *kc, const void *vc, int kv, const int32_t *pos,
                   const int32_t *off, const int32_t *pages, int t_first, int T, int n_head, int n_head_kv, int hd,
                   int window, const float *sinks, float scale, float *out, void *xq, void *x16)
{
    if (t_first >= T) return;
    act_forms L = act_forms_for(xq, x16, T, n_head * hd);
    const int tb = ck_att_prompt_tokens(n_head, n_head_kv);
    dim3 g((unsigned)((T - t_first + tb - 1) / tb), (unsigned)n_head_kv);
#define L_PRE(HD, KV)                                                                                          \
    lk(k_att_pre<HD, KV>, g, APR_WARPS * 32, APR_SMEM(HD), st, kc, vc, q, pos, off, pages, t_first, T, n_head,      \
       n_head_kv, window, sinks, scale, out, L)
    if (hd == 64 && kv == CK_KV_Q8_0) L_PRE(64, CK_KV_Q8_0);
    else if (hd == 64) L_PRE(64, 1);
    else if (kv == CK_KV_Q8_0) L_PRE(128, CK_KV_Q8_0);
    else L_PRE(128, 1);
#undef L_PRE
}

}  /* extern "C" */
