// moe_tc.cu — the experts' products of prompt batches on int8 tensor
// cores (cuda_moe.c takes them past CK_MOE_RG_MAX_T tokens unless the
// daemon is deterministic). A block takes a tile of up to CK_MOE_TC_TT
// slots of one expert and 64 rows, four warps of 32 rows x 32 slots. Each
// stage of TC_KC chunks (32 values) brings the rows' int8 form (dq32i, the
// decode kernels' decoder) and the slots' int8 activations into shared
// memory; mma.sync gives every (row, slot, chunk) its exact integer dot
// (m16n8k32, or two k16 for the types with a scale per 16 values), and
// the chunk's scales fold it into the f32 sum as mvq_unit's expression
// does, chunk after chunk. The prompt's tokens of an expert share a tile:
// its rows are decoded once per 64 tokens, and the products run at the
// tensor cores' rate instead of eight __dp4a per slot and unit.
#include "shaders/moe.cuh"

#define TC_ROWS 64
#define TC_KC 4
#define TC_PITCH (TC_KC * 32 + 16)   /* bytes a row or slot: the fragments' loads hit 32 banks */

struct tc_smem {
    int8_t a[TC_ROWS][TC_PITCH];
    int8_t b[CK_MOE_TC_TT][TC_PITCH];
    float ad0[TC_KC][TC_ROWS], ad1[TC_KC][TC_ROWS], am[TC_KC][TC_ROWS];
    float bd[TC_KC][CK_MOE_TC_TT];
    int bs[TC_KC][CK_MOE_TC_TT];
    int src[CK_MOE_TC_TT];
};

/* d += A (16 x 32, a0..a3) * B (32 x 8, b0, b1), int8 in, int32 out */
__device__ __forceinline__ void mma_s8_k32(int (&d)[4], const int (&a)[4], int b0, int b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* d += A (16 x 16, a0, a1) * B (16 x 8, b0) */
__device__ __forceinline__ void mma_s8_k16(int (&d)[4], int a0, int a1, int b0)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

/* A stage: chunks c0 .. c0 + TC_KC - 1 of the block's rows (row r's
 * pointer by rowp(r)) and of its slots' activations; past nc, zeros. */
template <int TY, class RP>
__device__ __forceinline__ void tc_stage(tc_smem &sm, RP rowp, int c0, int nc, int n, const int8_t *xq,
                                         const float *xd, const int *xs, int tid)
{
    for (int i = tid; i < TC_ROWS * TC_KC; i += 128) {
        int r = i / TC_KC, kc = i % TC_KC, c = c0 + kc, qv[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
        float d0 = 0.f, d1 = 0.f, m = 0.f;
        if (c < nc) dq32i<TY>(rowp(r), c, n, qv, d0, d1, m);
        int4 *dst = (int4 *)&sm.a[r][kc * 32];
        dst[0] = make_int4(qv[0], qv[1], qv[2], qv[3]);
        dst[1] = make_int4(qv[4], qv[5], qv[6], qv[7]);
        sm.ad0[kc][r] = d0;
        sm.ad1[kc][r] = d1;
        sm.am[kc][r] = m;
    }
    for (int i = tid; i < CK_MOE_TC_TT * TC_KC * 2; i += 128) {
        int s = i / (TC_KC * 2), p = i % (TC_KC * 2), c = c0 + (p >> 1), sr = sm.src[s];
        int4 v = make_int4(0, 0, 0, 0);
        if (sr >= 0 && c < nc) v = *(const int4 *)(xq + ((size_t)sr * nc + c) * 32 + 16 * (p & 1));
        *(int4 *)&sm.b[s][16 * p] = v;
    }
    for (int i = tid; i < CK_MOE_TC_TT * TC_KC; i += 128) {
        int s = i / TC_KC, kc = i % TC_KC, c = c0 + kc, sr = sm.src[s];
        bool ok = sr >= 0 && c < nc;
        sm.bd[kc][s] = ok ? xd[(size_t)sr * nc + c] : 0.f;
        sm.bs[kc][s] = ok ? xs[(size_t)sr * nc + c] : 0;
    }
}

/* y[slot][r] = row r of expert e on x of the slot (+ bias), for the tile
 * blockIdx.x and rows 64 blockIdx.y ..; x by token (pair / K) when
 * by_token, else by slot. No tiles: one matrix (expert 0) on the dense_T
 * rows of x, 64 of them a tile. GLU: rows 0..31 of the block are gate rows and
 * 32..63 up rows of features f0 = 32 blockIdx.y ..; act of each pair (+
 * biases bias, bu) goes through shared memory to a warp per slot, which
 * quantizes the 32 values into hq as k_quant_x would. */
template <int TY, bool GLU>
__global__ void __launch_bounds__(128) k_moe_tc(const uint8_t *W, const uint8_t *Wu, size_t rb, int n, int rows,
                                               const int8_t *xq, const float *xd, const int *xs, int by_token, int K,
                                               const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                                               int dense_T, const float *bias, const float *bu, int act,
                                               float alpha, float limit, float *y, act_forms hq)
{
    constexpr bool two = TY == QT_Q3_K || TY == QT_Q6_K,
                   mn = TY == QT_Q4_1 || TY == QT_Q5_1 || TY == QT_Q4_K || TY == QT_Q5_K;
    int e = 0, s0 = blockIdx.x * CK_MOE_TC_TT, ns = min(CK_MOE_TC_TT, dense_T - s0);
    if (!tiles) pdl_begin();
    else if (!moe_tile(tiles, n_tiles, e, s0, ns)) return;
    __shared__ __align__(16) tc_smem sm;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int wr = warp & 1, ws = warp >> 1, nc = n / 32, r0 = GLU ? blockIdx.y * 32 : blockIdx.y * TC_ROWS;
    const uint8_t *We = W + (size_t)e * rows * rb, *Wue = GLU ? Wu + (size_t)e * rows * rb : NULL;
    auto rowp = [&](int r) -> const uint8_t * {
        if (GLU) return (r < 32 ? We : Wue) + (size_t)(r0 + (r & 31)) * rb;
        return We + (size_t)min(r0 + r, rows - 1) * rb;
    };
    if (tid < CK_MOE_TC_TT) sm.src[tid] = tid < ns ? (int)moe_src(by_token, pair, K, s0, tid) : -1;
    float acc[2][4][4];
#pragma unroll
    for (int rf = 0; rf < 2; rf++)
#pragma unroll
        for (int cf = 0; cf < 4; cf++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[rf][cf][i] = 0.f;
    for (int c0 = 0; c0 < nc; c0 += TC_KC) {
        __syncthreads();   /* the stage before is consumed (and src is in) */
        tc_stage<TY>(sm, rowp, c0, nc, n, xq, xd, xs, tid);
        __syncthreads();
        const int kn = min(TC_KC, nc - c0);
        for (int kc = 0; kc < kn; kc++) {
            int af[2][4], bf[4][2];
            float rd0[2][2], rd1[2][2], rm[2][2], sd[4][2];
            int ss[4][2];
#pragma unroll
            for (int rf = 0; rf < 2; rf++) {
                const int R = wr * 32 + rf * 16 + g;
                af[rf][0] = *(const int *)&sm.a[R][kc * 32 + 4 * q];
                af[rf][1] = *(const int *)&sm.a[R + 8][kc * 32 + 4 * q];
                af[rf][2] = *(const int *)&sm.a[R][kc * 32 + 16 + 4 * q];
                af[rf][3] = *(const int *)&sm.a[R + 8][kc * 32 + 16 + 4 * q];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    rd0[rf][h] = sm.ad0[kc][R + 8 * h];
                    rd1[rf][h] = sm.ad1[kc][R + 8 * h];
                    rm[rf][h] = sm.am[kc][R + 8 * h];
                }
            }
#pragma unroll
            for (int cf = 0; cf < 4; cf++) {
                const int S = ws * 32 + cf * 8;
                bf[cf][0] = *(const int *)&sm.b[S + g][kc * 32 + 4 * q];
                bf[cf][1] = *(const int *)&sm.b[S + g][kc * 32 + 16 + 4 * q];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    sd[cf][j] = sm.bd[kc][S + 2 * q + j];
                    ss[cf][j] = sm.bs[kc][S + 2 * q + j];
                }
            }
#pragma unroll
            for (int rf = 0; rf < 2; rf++)
#pragma unroll
                for (int cf = 0; cf < 4; cf++) {
                    int lo[4] = { 0, 0, 0, 0 }, hi[4] = { 0, 0, 0, 0 };
                    if (two) {
                        mma_s8_k16(lo, af[rf][0], af[rf][1], bf[cf][0]);
                        mma_s8_k16(hi, af[rf][2], af[rf][3], bf[cf][1]);
                    } else {
                        mma_s8_k32(lo, af[rf], bf[cf][0], bf[cf][1]);
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int h = i >> 1, j = i & 1;
                        /* (mvq_unit's expression: lo + hi there is this k32 dot) */
                        float v = two ? __fmaf_rn(rd0[rf][h], (float)lo[i], __fmul_rn(rd1[rf][h], (float)hi[i]))
                                      : __fmul_rn(rd0[rf][h], (float)lo[i]);
                        if (mn) v = __fmaf_rn(-rm[rf][h], (float)ss[cf][j], v);
                        acc[rf][cf][i] = __fmaf_rn(sd[cf][j], v, acc[rf][cf][i]);
                    }
                }
        }
    }
    if (!GLU) {
#pragma unroll
        for (int rf = 0; rf < 2; rf++)
#pragma unroll
            for (int cf = 0; cf < 4; cf++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = r0 + wr * 32 + rf * 16 + g + 8 * (i >> 1), s = ws * 32 + cf * 8 + 2 * q + (i & 1);
                    if (s < ns && r < rows)
                        y[(size_t)(s0 + s) * rows + r] = bias ? acc[rf][cf][i] + bias[(size_t)e * rows + r]
                                                              : acc[rf][cf][i];
                }
        return;
    }
    /* the gate and up sums to shared memory, then a warp per slot: the
     * act of its 32 features (+ biases) and their int8 form */
    __syncthreads();
    float(*hv)[CK_MOE_TC_TT][33] = (float(*)[CK_MOE_TC_TT][33]) & sm.a[0][0];   /* [gate, up][slot][feature] */
    static_assert(sizeof(float) * 2 * CK_MOE_TC_TT * 33 <= sizeof sm.a + sizeof sm.b, "hv fits in a and b");
#pragma unroll
    for (int rf = 0; rf < 2; rf++)
#pragma unroll
        for (int cf = 0; cf < 4; cf++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                hv[wr][ws * 32 + cf * 8 + 2 * q + (i & 1)][rf * 16 + g + 8 * (i >> 1)] = acc[rf][cf][i];
    __syncthreads();
    const size_t fb = (size_t)e * rows + r0 + lane;
    const float gb = bias ? bias[fb] : 0.f, ub = bu ? bu[fb] : 0.f;
    for (int s = warp; s < ns; s += 4) {
        float gv = hv[0][s][lane], uv = hv[1][s][lane];
        if (bias) gv = gv + gb;
        if (bu) uv = uv + ub;
        quant_block(moe_act1(gv, uv, act, alpha, limit), lane, (size_t)(s0 + s) * (rows / 32) + r0 / 32, hq);
    }
}

template <int TY>
static void tc_launch(cudaStream_t st, dim3 g, bool glu, const void *W, const void *Wu, size_t rb, int n, int rows,
                      act_forms L, int by_token, int K, const int32_t *pair, const int32_t *tiles,
                      const int32_t *n_tiles, int dense_T, const float *bias, const float *bu, int act, float alpha,
                      float limit, float *y, act_forms H)
{
    if constexpr (dq32i_type(TY))
        lk(glu ? k_moe_tc<TY, true> : k_moe_tc<TY, false>, g, 128, 0, st, (const uint8_t *)W, (const uint8_t *)Wu,
           rb, n, rows, (const int8_t *)L.q, (const float *)L.d, (const int *)L.s, by_token, K, pair, tiles, n_tiles,
           dense_T, bias, bu, act, alpha, limit, y, H);
}

extern "C" {

void ck_moe_tc_mm(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const void *xq,
                  int x_rows, int by_token, int K, const int32_t *pair, const int32_t *tiles, const int32_t *n_tiles,
                  int max_tiles, const float *bias, float *y)
{
    act_forms L = act_int8_at((void *)xq, x_rows, n), H;
    memset(&H, 0, sizeof H);
    dim3 g((unsigned)max_tiles, nblk((size_t)rows, TC_ROWS));
#define L_TC(TY) tc_launch<TY>(st, g, false, W, NULL, rb, n, rows, L, by_token, K, pair, tiles, n_tiles, 0, \
                               bias, NULL, 0, 0.f, 0.f, y, H)
    TYPE_SWITCH(type, L_TC)
}

void ck_moe_tc_glu(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int F,
                   const void *xq, int x_rows, int K, const int32_t *pair, const int32_t *tiles,
                   const int32_t *n_tiles, int max_tiles, const float *bg, const float *bu, int act, float alpha,
                   float limit, void *hq, int N)
{
    act_forms L = act_int8_at((void *)xq, x_rows, n), H = act_int8_at(hq, N, F);
    dim3 g((unsigned)max_tiles, (unsigned)(F / 32));
#define L_TCG(TY) tc_launch<TY>(st, g, true, Wg, Wu, rb, n, F, L, 1, K, pair, tiles, n_tiles, 0, bg, bu, act, \
                                alpha, limit, NULL, H)
    TYPE_SWITCH(type, L_TCG)
}

void ck_tc_matmul(cudaStream_t st, uint32_t type, const void *W, size_t rb, int n, int rows, const void *xq, int T,
                  const float *bias, float *y)
{
    act_forms L = act_int8_at((void *)xq, T, n), H;
    memset(&H, 0, sizeof H);
    dim3 g(nblk((size_t)T, CK_MOE_TC_TT), nblk((size_t)rows, TC_ROWS));
#define L_TCD(TY) tc_launch<TY>(st, g, false, W, NULL, rb, n, rows, L, 0, 1, NULL, NULL, NULL, T, bias, NULL, 0, \
                                0.f, 0.f, y, H)
    TYPE_SWITCH(type, L_TCD)
}

}
