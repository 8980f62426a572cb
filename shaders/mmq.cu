// mmq.cu — decode batches past the GEMV's (CK_GEMV_MAX_T+1 ..
// CK_MMQB_MAX_T tokens) of q4_K and q6_K matrices on f16 tensor cores,
// reading the quantized weights once per step.
#include "shaders/common.cuh"

/* ---------------- q4_K matmul for decode batches (f16 tensor cores) ----------------
 * Decode batches of CK_GEMV_MAX_T+1 .. CK_MMQB_MAX_T tokens (past the
 * batch-invariant GEMVs) of q4_K matrices: the quantized weights are read
 * once per step, where cuBLAS reads an f16 copy (3.6x the bytes). A CTA
 * takes 128 rows (8 warps x 16) and walks its K range a super-block (256
 * values) at a time; each chunk's weight bytes and x (f16, JN tiles of 8
 * tokens) come into shared memory by cp.async while the chunk before is
 * computed. The CTA decodes the chunk's sub-block scales once; each lane
 * dequantizes its share of the nibbles to f16 in registers (0x6400 | q is
 * the half 1024 + q) and mma.m16n8k16 accumulates whole chunks in f32.
 * Short matrices split K over sp CTAs per row tile (chosen per matrix,
 * never by the batch around it): their partials go to scratch and the
 * tile's last CTA to finish (a counter) sums them in split order.
 * Fragments: in a sub-block, lane (g, q) takes values 8q..8q+7, the first
 * four in k-step 0 and the last four in k-step 1: a0 / a2 row g's values
 * +0, +1 / +2, +3 of its four (a1, a3: row g+8), b0 / b1 the same values of
 * token g; so a lane reads 8 bytes of nibbles per row and group and 16
 * bytes of x per sub-block and token tile. */
#define MMQB_WARPS 8
#define MMQB_ROWS (MMQB_WARPS * 16)
#define MMQB_CHUNK 256                /* values per chunk: a super-block */
#define MMQB_XPITCH (MMQB_CHUNK + 32)       /* halves per token row of x in shared memory (no bank conflicts) */
#define MMQB_WPITCH 160                /* bytes per row and chunk: the super-block, padded (no bank conflicts) */
#define MMQB_SUBS (MMQB_CHUNK / 32)       /* sub-blocks per chunk */
#define MMQB_STAGES 2                  /* chunk buffers (the prologues load one chunk ahead) */

template <int J> struct mma_smem {
    __half x[MMQB_STAGES][J * 8][MMQB_XPITCH];
    uint8_t w[MMQB_STAGES][MMQB_ROWS][MMQB_WPITCH];
    uint2 sc[2][MMQB_ROWS][MMQB_SUBS + 1];   /* per row, the chunk's sub-blocks: (d * sc, -dmin * m) as half2s (padded) */
};

/* bytes b0..b3 of u, nibble plane P, as the halves (b0, b1) and (b2, b3) of q * ds + nmm */
template <int P>
__device__ __forceinline__ void q4_pair(uint32_t u, __half2 ds, __half2 nmm, uint32_t &lo, uint32_t &hi)
{
    uint32_t s01 = __byte_perm(u, 0, 0x4140), s23 = __byte_perm(u, 0, 0x4342);
    __half2 a, b;
    if (P == 0) {   /* 1024 + q, exact; minus 1024 */
        const __half2 k1024 = __floats2half2_rn(1024.f, 1024.f);
        a = __hsub2(u2h((s01 & 0x000F000Fu) | 0x64006400u), k1024);
        b = __hsub2(u2h((s23 & 0x000F000Fu) | 0x64006400u), k1024);
    } else {        /* 1024 + 16 q; / 16 - 64, exact */
        const __half2 r16 = __floats2half2_rn(0.0625f, 0.0625f), m64 = __floats2half2_rn(-64.f, -64.f);
        a = __hfma2(u2h((s01 & 0x00F000F0u) | 0x64006400u), r16, m64);
        b = __hfma2(u2h((s23 & 0x00F000F0u) | 0x64006400u), r16, m64);
    }
    lo = h2u(__hfma2(a, ds, nmm));
    hi = h2u(__hfma2(b, ds, nmm));
}

/* The last CTA of a row tile: the sp splits' partials (J * 8 tokens x
 * MMQB_ROWS rows each, from part0) summed in split order, plus bias, into
 * out. A thread takes 4 rows of token tid / 32 + 8 j for each j; the loads
 * of U splits are issued together. Gate and up (glu_h): lane l < 16 holds
 * gate rows 4 l.. of the tile's features, lane l + 16 their up rows; the
 * gate lanes write silu(g) * u and its f16 form. */
template <int J>
__device__ __forceinline__ void mmqb_sum_splits(const float *part0, int sp, int tile, int n_out, int T, const float *bias,
                                       float *out, int tid, __half *glu_h)
{
    constexpr int SLOT4 = J * 8 * MMQB_ROWS / 4, U = 4;   /* (J <= 4) */
    const float4 *p0 = (const float4 *)part0;
    float4 v[J];
#pragma unroll
    for (int j = 0; j < J; j++) v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    int s = 0;
    for (; s < sp; s += U) {
        float4 a[U][J];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < J; j++)
                a[u][j] = s + u < sp ? __ldcg(p0 + (size_t)(s + u) * SLOT4 + tid + j * MMQB_WARPS * 32)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < J; j++) {
                if (s + u >= sp) break;
                v[j].x += a[u][j].x; v[j].y += a[u][j].y; v[j].z += a[u][j].z; v[j].w += a[u][j].w;
            }
    }
    static_assert(MMQB_ROWS / 4 == 32, "a warp's lanes take one token's rows of a tile");
    if (glu_h) {
        const int lane = tid & 31, H = MMQB_ROWS / 2;
#pragma unroll
        for (int j = 0; j < J; j++) {
            float4 u;
            u.x = __shfl_down_sync(0xffffffffu, v[j].x, 16); u.y = __shfl_down_sync(0xffffffffu, v[j].y, 16);
            u.z = __shfl_down_sync(0xffffffffu, v[j].z, 16); u.w = __shfl_down_sync(0xffffffffu, v[j].w, 16);
            int t = tid / 32 + j * (MMQB_WARPS * 32 * 4 / MMQB_ROWS), f = tile * H + lane * 4;
            float e[4] = { silu_mul1(v[j].x, u.x), silu_mul1(v[j].y, u.y), silu_mul1(v[j].z, u.z), silu_mul1(v[j].w, u.w) };
            if (lane < 16 && t < T)
                for (int k = 0; k < 4; k++) {
                    out[(size_t)t * n_out + f + k] = e[k];
                    glu_h[(size_t)t * n_out + f + k] = f2h_sat(e[k]);
                }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < J; j++) {
        int t = tid / (MMQB_ROWS / 4) + j * (MMQB_WARPS * 32 * 4 / MMQB_ROWS), r = tile * MMQB_ROWS + (tid % (MMQB_ROWS / 4)) * 4;
        float e[4] = { v[j].x, v[j].y, v[j].z, v[j].w };
        if (t < T)
            for (int k = 0; k < 4; k++)
                if (r + k < n_out) out[(size_t)t * n_out + r + k] = e[k] + (bias ? bias[r + k] : 0.f);
    }
}

/* What k_mmqb_mma and k_mmqb_wgmma share. A block's weight copies of a
 * chunk: piece p = tid + NT k is row p / 9's 16-byte piece p % 9, so a warp
 * reads whole rows' runs (faster than a row's pieces split over two
 * threads); rows PITCH bytes apart. */
#define MMQB_THREADS (MMQB_WARPS * 32)
#define MMQB_WPIECES ((MMQB_ROWS * 9 + MMQB_THREADS - 1) / MMQB_THREADS)
/* A block's place: its matrix (S.m[mi]), its index among that matrix's
 * blocks, the K split, its row tile and its chunks [c0, c1) */
/* Chunk c of the T rows of x16 (J * 8 rows, rows past T zero-filled) into
 * shared memory by cp.async, 16 bytes (piece pc of row xt) a thread a
 * step, to dst(xt, pc): each kernel's own layout. */
template <int J, class D>
__device__ __forceinline__ void mmqb_load_x(const __half *x16, int T, int n, int c, int tid, D dst)
{
#pragma unroll
    for (int k = 0; k < (J * 8 * 32 + MMQB_THREADS - 1) / MMQB_THREADS; k++) {
        int p = tid + MMQB_THREADS * k, xt = p >> 5, pc = p & 31;
        bool xv = xt < T;
        if (p < J * 8 * 32)
            cp_async16(dst(xt, pc), x16 + (size_t)(xv ? xt : 0) * n + (size_t)c * MMQB_CHUNK + 8 * pc, xv ? 16 : 0);
    }
}

struct mmqb_place { int mi, local, sp, tile, c0, c1; };
__device__ __forceinline__ mmqb_place mmqb_place_of(const mat_set &S, int n)
{
    mmqb_place P;
    P.mi = block_matrix(S);
    const set_matrix &M = S.m[P.mi];
    P.local = (int)blockIdx.x - M.blk0;
    P.sp = M.sp;
    P.tile = P.local / P.sp;
    P.c0 = (P.local - P.tile * P.sp) * M.per;
    P.c1 = min(P.c0 + M.per, n / MMQB_CHUNK);
    return P;
}
template <int PITCH> struct mmqb_wcopy {
    const uint8_t *src[MMQB_WPIECES];
    int off[MMQB_WPIECES];
    __device__ __forceinline__ mmqb_wcopy(const mat_set &S, const set_matrix &M, int tile, size_t rb, int tid)
    {
#pragma unroll
        for (int k = 0; k < MMQB_WPIECES; k++) {
            int p = min(tid + MMQB_THREADS * k, MMQB_ROWS * 9 - 1), r = p / 9, pc = p - r * 9;
            if (S.glu_u)   /* rows 0..63: gate features tile * 64 + r; 64..127: the same features' up rows */
                src[k] = (r < MMQB_ROWS / 2 ? M.W : S.glu_u) + (size_t)(tile * (MMQB_ROWS / 2) + (r & (MMQB_ROWS / 2 - 1))) * rb + 16 * pc;
            else
                src[k] = M.W + (size_t)min(tile * MMQB_ROWS + r, M.n_out - 1) * rb + 16 * pc;
            off[k] = r * PITCH + 16 * pc;
        }
    }
    /* chunk c's weights into w (a stage's rows) */
    __device__ __forceinline__ void copy(uint8_t *w, int c, int tid) const
    {
#pragma unroll
        for (int k = 0; k < MMQB_WPIECES; k++)
            if (tid + MMQB_THREADS * k < MMQB_ROWS * 9) cp_async16(w + off[k], src[k] + (size_t)c * 144, 16);
    }
};
/* the chunk's sub-block scales (d * sc, -dmin * m as half2s): row e / 4, sub-block pair e % 4 */
template <int PITCH>
__device__ __forceinline__ void mmqb_scales(const uint8_t (*w)[PITCH], uint2 (*sc)[MMQB_SUBS + 1], int tid)
{
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int e = tid + k * MMQB_THREADS, jp = e & 3;
        float d0, d1, m0, m1;
        q4k_scales(*(const uint4 *)w[e >> 2], jp, d0, d1, m0, m1);
        sc[e >> 2][2 * jp] = make_uint2(h2u(__floats2half2_rn(d0, d0)), h2u(__floats2half2_rn(-m0, -m0)));
        sc[e >> 2][2 * jp + 1] = make_uint2(h2u(__floats2half2_rn(d1, d1)), h2u(__floats2half2_rn(-m1, -m1)));
    }
}
/* A block's sums (rows ra, ra + 8 of its tile; tokens 8 j + 2 q, + 1) out,
 * or with a split K to its partial slot, the tile's last block summing the
 * slots (mmqb_sum_splits). Gate and up (S.glu_u) unsplit: the up warps' sums go
 * through ex (shared memory of 64 x (8 J + 1) floats, free once every warp
 * is past its last chunk) to the gate warps, which write silu(g) * u as
 * k_silu_mul does, and its f16 form (split: mmqb_sum_splits does the same). */
template <int J>
__device__ __forceinline__ void mmqb_finish(const float (&acc)[J][4], const mat_set &S, const mmqb_place &P, int ra,
                                          int q, int T, float *part, int *cnt, int tid, int &last, float *ex)
{
    const set_matrix &M = S.m[P.mi];
    const float *bias = M.bias;
    float *out = M.out;
    const int n_out = M.n_out, sp = P.sp, tile = P.tile;
    if (S.glu_u && sp == 1) {
        constexpr int H = MMQB_ROWS / 2, XS = J * 8 + 1;
        __syncthreads();
        if (ra >= H)
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) ex[(ra - H + (i >> 1) * 8) * XS + 8 * j + 2 * q + (i & 1)] = acc[j][i];
        __syncthreads();
        if (ra < H)
#pragma unroll
            for (int j = 0; j < J; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = ra + (i >> 1) * 8, f = tile * H + r, t = 8 * j + 2 * q + (i & 1);
                    if (t < T) {
                        float v = silu_mul1(acc[j][i], ex[r * XS + t]);
                        out[(size_t)t * n_out + f] = v;
                        S.glu_h[(size_t)t * n_out + f] = f2h_sat(v);
                    }
                }
        return;
    }
    if (sp == 1) {
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = tile * MMQB_ROWS + ra + (i >> 1) * 8, t = 8 * j + 2 * q + (i & 1);
                if (r < n_out && t < T) out[(size_t)t * n_out + r] = acc[j][i] + (bias ? bias[r] : 0.f);
            }
        return;
    }
    float *mine = part + ((size_t)M.pb + P.local) * (J * 8 * MMQB_ROWS);
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) mine[(8 * j + 2 * q + (i & 1)) * MMQB_ROWS + ra + (i >> 1) * 8] = acc[j][i];
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(cnt + M.cb + tile, 1) == sp - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    mmqb_sum_splits<J>(part + ((size_t)M.pb + (size_t)tile * sp) * (J * 8 * MMQB_ROWS), sp, tile, n_out, T, bias, out, tid,
              S.glu_u ? S.glu_h : NULL);
    if (tid == 0) cnt[M.cb + tile] = 0;   /* ready for the next launch */
}

template <int J>
__global__ void __launch_bounds__(MMQB_WARPS * 32, 2)
    k_mmqb_mma(const mat_set S, size_t rb, int n, const __half *__restrict__ x16, int T, float *__restrict__ part,
           int *__restrict__ cnt)
{
    extern __shared__ __align__(16) unsigned char mma_raw[];
    mma_smem<J> &sm = *(mma_smem<J> *)mma_raw;
    __shared__ int last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const mmqb_place P = mmqb_place_of(S, n);
    const set_matrix &M = S.m[P.mi];
    const int c0 = P.c0, c1 = P.c1, ra = warp * 16 + g;
    const mmqb_wcopy<MMQB_WPITCH> wc(S, M, P.tile, rb, tid);
    auto load_w = [&](int c, int st) { wc.copy(&sm.w[st][0][0], c, tid); };
    auto load_x = [&](int c, int st) {
        mmqb_load_x<J>(x16, T, n, c, tid, [&](int xt, int pc) { return &sm.x[st][xt][8 * pc]; });
    };
    auto load = [&](int c, int st) { load_w(c, st); load_x(c, st); };

    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    /* the first chunk's weights before the wait (no kernel writes them: they
     * stream in while the kernel before ends), x after */
    if (c0 < c1) load_w(c0, 0);
    pdl_begin();
    if (c0 < c1) load_x(c0, 0);
    cp_commit();
    for (int c = c0, i = 0; c < c1; c++, i++) {
        const int st = i % MMQB_STAGES, sb = i & 1;
        cp_wait<MMQB_STAGES - 2>();   /* chunk c is in */
        __syncthreads();        /* ... for every thread; and chunk c - 1's buffers are free */
        if (c + MMQB_STAGES - 1 < c1) load(c + MMQB_STAGES - 1, (i + MMQB_STAGES - 1) % MMQB_STAGES);
        cp_commit();
        mmqb_scales<MMQB_WPITCH>(sm.w[st], sm.sc[sb], tid);
        __syncthreads();
        /* group gi (sub-blocks 2 gi, 2 gi + 1): this lane's 8 bytes of each row */
#pragma unroll
        for (int gi = 0; gi < MMQB_SUBS / 2; gi++) {
            uint2 ua = *(const uint2 *)&sm.w[st][ra][16 + 32 * gi + 8 * q];
            uint2 ub = *(const uint2 *)&sm.w[st][ra + 8][16 + 32 * gi + 8 * q];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int s = 2 * gi + h;
                uint2 sca = sm.sc[sb][ra][s], scb = sm.sc[sb][ra + 8][s];
                uint32_t a[2][4];   /* [kk]: a0..a3 */
                if (h) {
                    q4_pair<1>(ua.x, u2h(sca.x), u2h(sca.y), a[0][0], a[0][2]);
                    q4_pair<1>(ub.x, u2h(scb.x), u2h(scb.y), a[0][1], a[0][3]);
                    q4_pair<1>(ua.y, u2h(sca.x), u2h(sca.y), a[1][0], a[1][2]);
                    q4_pair<1>(ub.y, u2h(scb.x), u2h(scb.y), a[1][1], a[1][3]);
                } else {
                    q4_pair<0>(ua.x, u2h(sca.x), u2h(sca.y), a[0][0], a[0][2]);
                    q4_pair<0>(ub.x, u2h(scb.x), u2h(scb.y), a[0][1], a[0][3]);
                    q4_pair<0>(ua.y, u2h(sca.x), u2h(sca.y), a[1][0], a[1][2]);
                    q4_pair<0>(ub.y, u2h(scb.x), u2h(scb.y), a[1][1], a[1][3]);
                }
#pragma unroll
                for (int j = 0; j < J; j++) {
                    uint4 xv4 = *(const uint4 *)&sm.x[st][8 * j + g][32 * s + 8 * q];
                    mma_f16(acc[j], a[0][0], a[0][1], a[0][2], a[0][3], xv4.x, xv4.y);
                    mma_f16(acc[j], a[1][0], a[1][1], a[1][2], a[1][3], xv4.z, xv4.w);
                }
            }
        }
    }
    cp_wait<0>();
    mmqb_finish<J>(acc, S, P, ra, q, T, part, cnt, tid, last, (float *)&sm.w[0][0][0]);
}

/* ---------------- q4_K matmul for decode batches (Hopper warpgroup MMA) ----------------
 * k_mmqb_mma's work on sm_90a with wgmma: each warpgroup (4 warps, 64 rows)
 * issues m64n(8J)k16 MMAs whose x operand the tensor cores read from shared
 * memory themselves, once per warpgroup (k_mmqb_mma's warps each read every x
 * fragment through registers: most of its shared-memory traffic), and which
 * run asynchronously while the warps dequantize the next sub-block. The
 * weights' A fragments come from registers as in k_mmqb_mma, in the canonical
 * k order (lane q: values 2q, 2q+1, 2q+8, 2q+9 of each 16), so a lane
 * gathers 2-byte pieces of the nibbles. x is copied into the K-major
 * layout with the 128-byte swizzle: a token's 64 values of one atom are a
 * 128-byte row whose 16-byte pieces are permuted by the row's index in its
 * group of 8 tokens, so a quarter-warp's 8 pieces of one token are one
 * 128-byte run in global memory and one shared-memory line (unswizzled,
 * each quarter-warp's copy would take 8 lines). Atoms: [K / 64][token
 * group][8 tokens][128 bytes], 1024-byte aligned. A lane decodes sub-blocks
 * 2q, 2q + 1's scales of its two rows and takes the others from its row
 * group's lanes by shuffle (no barrier or buffer for them). Same tiles,
 * chunks, split and partial sums as k_mmqb_mma; faster at 25-32 tokens,
 * bound by each warp's chain of waits as k_mmqb_mma is (docs/benchmarks-cuda.md).
 * Q6: q6_K in the batched layout (k_repack_q6_Kb), the same tiles, chunks
 * and split, a chunk's MMAs by wg_q6_chunk. */
#define WG_WPITCH 176   /* bytes per row and chunk: 2-byte gathers by 8 rows hit 16 banks */
#define WG_ATOM 1024  /* bytes per swizzle atom (8 tokens x 64 values) */
#define Q6B_CH 224  /* bytes per row and super-block of q6_K in the batched layout (k_repack_q6_Kb) */

/* q6_K (Q6): a chunk is the super-block in the batched layout (Q6B_CH
 * bytes, k_repack_q6_Kb): the values' 192 bytes to w (rows 192 bytes apart:
 * a quarter-warp's rows g, g + 1 on other banks), the 16 scales to sc */
#define WG_Q6_WPITCH 192
struct q6_stage {
    uint8_t w[MMQB_ROWS][WG_Q6_WPITCH];
    uint4 sc[MMQB_ROWS][2];
};
template <int J, bool Q6> struct wg_smem;
template <int J> struct wg_smem<J, false> {
    uint4 x[MMQB_STAGES][MMQB_CHUNK / 64 * J * WG_ATOM / 16];
    uint8_t w[MMQB_STAGES][MMQB_ROWS][WG_WPITCH];
};
template <int J> struct wg_smem<J, true> {
    uint4 x[MMQB_STAGES][MMQB_CHUNK / 64 * J * WG_ATOM / 16];
    q6_stage w[MMQB_STAGES];
};
template <int J> __device__ __forceinline__ uint8_t *wg_wstage(wg_smem<J, false> &sm, int st) { return &sm.w[st][0][0]; }
template <int J> __device__ __forceinline__ uint8_t *wg_wstage(wg_smem<J, true> &sm, int st) { return (uint8_t *)&sm.w[st]; }
/* A block's weight copies of a q6_K chunk: piece p = tid + NT k is row
 * p / 14's piece p % 14 (0, 1: the scales) */
#define WG_Q6_WPIECES (MMQB_ROWS * (Q6B_CH / 16) / MMQB_THREADS)
struct wg_q6_wcopy {
    const uint8_t *src[WG_Q6_WPIECES];
    int off[WG_Q6_WPIECES];
    __device__ __forceinline__ wg_q6_wcopy(const mat_set &, const set_matrix &M, int tile, size_t rb, int tid)
    {
#pragma unroll
        for (int k = 0; k < WG_Q6_WPIECES; k++) {
            int p = tid + MMQB_THREADS * k, r = p / (Q6B_CH / 16), pc = p - r * (Q6B_CH / 16);
            src[k] = M.W + (size_t)min(tile * MMQB_ROWS + r, M.n_out - 1) * rb + 16 * pc;
            off[k] = pc < 2 ? MMQB_ROWS * WG_Q6_WPITCH + r * 32 + 16 * pc : r * WG_Q6_WPITCH + 16 * (pc - 2);
        }
    }
    __device__ __forceinline__ void copy(uint8_t *w, int c, int tid) const
    {
#pragma unroll
        for (int k = 0; k < WG_Q6_WPIECES; k++) cp_async16(w + off[k], src[k] + (size_t)c * Q6B_CH, 16);
    }
};
/* four values of q6_K sub-block t (0..3) of a batched-layout group from
 * their ql word (t's 4 low bits: t's low or high nibbles) and qh word (bits
 * 2t, 2t + 1 of each byte), times the sub-block's scale ds: bytes 0, 1 and
 * 2, 3 as half2s. 0x6400 | q is the half 1024 + q; minus 1056, q - 32, exact */
__device__ __forceinline__ void q6_pair(uint32_t ql, uint32_t qh, int t, __half2 ds, uint32_t &lo, uint32_t &hi)
{
    uint32_t nib = (t & 1 ? ql >> 4 : ql) & 0x0F0F0F0Fu;
    uint32_t top = (t == 0 ? qh << 4 : t == 1 ? qh << 2 : t == 2 ? qh : qh >> 2) & 0x30303030u;
    uint32_t v = nib | top;
    const __half2 k1056 = __floats2half2_rn(1056.f, 1056.f);
    lo = h2u(__hmul2(__hsub2(u2h(__byte_perm(v, 0x64646464u, 0x4140)), k1056), ds));
    hi = h2u(__hmul2(__hsub2(u2h(__byte_perm(v, 0x64646464u, 0x4342)), k1056), ds));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CK_HAVE_WGMMA 1
__device__ __forceinline__ uint64_t wg_desc(const void *smem)
{
    uint64_t a = (uint64_t)__cvta_generic_to_shared(smem);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(WG_ATOM >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

/* d += A (64 x 16, registers) * B (16 x 8J, shared memory at desc) */
template <int J> __device__ __forceinline__ void wg_mma(float (&d)[J][4], const uint32_t (&a)[4], uint64_t desc);
template <> __device__ __forceinline__ void wg_mma<4>(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <> __device__ __forceinline__ void wg_mma<3>(float (&d)[3][4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, %16, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
#endif

#if defined(CK_HAVE_WGMMA)
/* A q6_K chunk's MMAs (k_mmqb_wgmma): lane q's three pieces of rows ra and
 * ra + 8 hold its values of every sub-block (k-step), each ql piece two
 * groups'; a group's 4 scales of a row come as 8 bytes (the lanes of a row
 * read the same words) */
template <int J>
__device__ __forceinline__ void wg_q6_chunk(float (&acc)[J][4], const q6_stage &w, uint64_t xd, int ra, int q)
{
    const uint4 ha = *(const uint4 *)&w.w[ra][128 + 16 * q], hb = *(const uint4 *)&w.w[ra + 8][128 + 16 * q];
    uint4 la, lb;
    auto word = [](const uint4 &u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; };
    auto scale = [](const uint2 &s, int t) {   /* sub-block t of the group's scales as a half2 pair */
        uint32_t u = t >> 1 ? s.y : s.x;
        return u2h(__byte_perm(u, u, t & 1 ? 0x3232 : 0x1010));
    };
#pragma unroll
    for (int gi = 0; gi < 4; gi++) {
        if (!(gi & 1)) {
            la = *(const uint4 *)&w.w[ra][64 * (gi >> 1) + 16 * q];
            lb = *(const uint4 *)&w.w[ra + 8][64 * (gi >> 1) + 16 * q];
        }
        const uint2 sa = *(const uint2 *)((const uint8_t *)w.sc[ra] + 8 * gi);
        const uint2 sb = *(const uint2 *)((const uint8_t *)w.sc[ra + 8] + 8 * gi);
        const uint32_t qha = word(ha, gi), qhb = word(hb, gi);
#pragma unroll
        for (int tp = 0; tp < 2; tp++) {
            const uint32_t qla = word(la, 2 * (gi & 1) + tp), qlb = word(lb, 2 * (gi & 1) + tp);
            uint32_t a0[4], a1[4];
            q6_pair(qla, qha, 2 * tp, scale(sa, 2 * tp), a0[0], a0[2]);
            q6_pair(qlb, qhb, 2 * tp, scale(sb, 2 * tp), a0[1], a0[3]);
            q6_pair(qla, qha, 2 * tp + 1, scale(sa, 2 * tp + 1), a1[0], a1[2]);
            q6_pair(qlb, qhb, 2 * tp + 1, scale(sb, 2 * tp + 1), a1[1], a1[3]);
            wg_fence();
            /* k-steps 4 gi + 2 tp, + 1: atom gi, 32-byte steps within its rows */
            wg_mma<J>(acc, a0, xd + ((gi * J * WG_ATOM + 64 * tp) >> 4));
            wg_mma<J>(acc, a1, xd + ((gi * J * WG_ATOM + 64 * tp + 32) >> 4));
            wg_commit();
        }
    }
    wg_wait<0>();
}
#endif

template <int J, bool Q6>
__global__ void __launch_bounds__(MMQB_WARPS * 32, 2)
    k_mmqb_wgmma(const mat_set S, size_t rb, int n, const __half *__restrict__ x16, int T, float *__restrict__ part,
           int *__restrict__ cnt)
{
#if defined(CK_HAVE_WGMMA)
    extern __shared__ __align__(128) unsigned char wg_raw[];
    wg_smem<J, Q6> &sm = *(wg_smem<J, Q6> *)(wg_raw + ((WG_ATOM - ((unsigned)__cvta_generic_to_shared(wg_raw) & (WG_ATOM - 1))) & (WG_ATOM - 1)));
    __shared__ int last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const mmqb_place P = mmqb_place_of(S, n);
    const set_matrix &M = S.m[P.mi];
    const int c0 = P.c0, c1 = P.c1, ra = warp * 16 + g;
    const typename std::conditional<Q6, wg_q6_wcopy, mmqb_wcopy<WG_WPITCH>>::type wc(S, M, P.tile, rb, tid);
    auto load_w = [&](int c, int st) { wc.copy(wg_wstage<J>(sm, st), c, tid); };
    auto load_x = [&](int c, int st) {
        mmqb_load_x<J>(x16, T, n, c, tid, [&](int xt, int pc) {
            return &sm.x[st][((pc >> 3) * J + (xt >> 3)) * (WG_ATOM / 16) + (xt & 7) * 8 + ((pc ^ xt) & 7)];
        });
    };
    auto load = [&](int c, int st) { load_w(c, st); load_x(c, st); };

    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    if (c0 < c1) load_w(c0, 0);   /* (before the wait, as k_mmqb_mma) */
    pdl_begin();
    if (c0 < c1) load_x(c0, 0);
    cp_commit();
    for (int c = c0, i = 0; c < c1; c++, i++) {
        const int st = i % MMQB_STAGES;
        cp_wait<MMQB_STAGES - 2>();                                      /* chunk c is in */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   /* ... for the tensor cores' reads too */
        __syncthreads();   /* ... for every thread; chunk c - 1's buffers are free (its MMAs waited for) */
        if (c + MMQB_STAGES - 1 < c1) load(c + MMQB_STAGES - 1, (i + MMQB_STAGES - 1) % MMQB_STAGES);
        cp_commit();
        if constexpr (Q6) {
            wg_q6_chunk<J>(acc, sm.w[st], wg_desc(&sm.x[st][0]), ra, q);
        } else {
            /* this lane's scales: sub-blocks 2q, 2q + 1 of rows ra and ra + 8 (d * sc,
             * -dmin * m as half2s); a sub-block's come from its lane by shuffle, so the
             * warps need no second barrier */
            uint32_t scd[2][2], scm[2][2];   /* [row ra, ra + 8][sub-block 2q, 2q + 1] */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float d0, d1, m0, m1;
                q4k_scales(*(const uint4 *)sm.w[st][ra + 8 * r], q, d0, d1, m0, m1);
                scd[r][0] = h2u(__floats2half2_rn(d0, d0)); scm[r][0] = h2u(__floats2half2_rn(-m0, -m0));
                scd[r][1] = h2u(__floats2half2_rn(d1, d1)); scm[r][1] = h2u(__floats2half2_rn(-m1, -m1));
            }
            const uint64_t xd = wg_desc(&sm.x[st][0]);
#pragma unroll
            for (int gi = 0; gi < MMQB_SUBS / 2; gi++) {
                /* bytes 2q, 2q + 1 of each 8 of rows ra and ra + 8: k-step 0 (values 0..15), k-step 1 */
                const uint8_t *pa = &sm.w[st][ra][16 + 32 * gi + 2 * q], *pb = pa + 8 * WG_WPITCH;
                uint32_t ua0 = __byte_perm(*(const uint16_t *)pa, *(const uint16_t *)(pa + 8), 0x5410);
                uint32_t ua1 = __byte_perm(*(const uint16_t *)(pa + 16), *(const uint16_t *)(pa + 24), 0x5410);
                uint32_t ub0 = __byte_perm(*(const uint16_t *)pb, *(const uint16_t *)(pb + 8), 0x5410);
                uint32_t ub1 = __byte_perm(*(const uint16_t *)(pb + 16), *(const uint16_t *)(pb + 24), 0x5410);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int s = 2 * gi + h;
                    const int src = (lane & ~3) | (s >> 1);
                    uint2 sca = make_uint2(__shfl_sync(0xffffffffu, scd[0][s & 1], src), __shfl_sync(0xffffffffu, scm[0][s & 1], src));
                    uint2 scb = make_uint2(__shfl_sync(0xffffffffu, scd[1][s & 1], src), __shfl_sync(0xffffffffu, scm[1][s & 1], src));
                    uint32_t a0[4], a1[4];
                    if (h) {
                        q4_pair<1>(ua0, u2h(sca.x), u2h(sca.y), a0[0], a0[2]);
                        q4_pair<1>(ub0, u2h(scb.x), u2h(scb.y), a0[1], a0[3]);
                        q4_pair<1>(ua1, u2h(sca.x), u2h(sca.y), a1[0], a1[2]);
                        q4_pair<1>(ub1, u2h(scb.x), u2h(scb.y), a1[1], a1[3]);
                    } else {
                        q4_pair<0>(ua0, u2h(sca.x), u2h(sca.y), a0[0], a0[2]);
                        q4_pair<0>(ub0, u2h(scb.x), u2h(scb.y), a0[1], a0[3]);
                        q4_pair<0>(ua1, u2h(sca.x), u2h(sca.y), a1[0], a1[2]);
                        q4_pair<0>(ub1, u2h(scb.x), u2h(scb.y), a1[1], a1[3]);
                    }
                    wg_fence();
                    /* k-steps 2s, 2s + 1: atom s / 2, 32-byte steps within its rows */
                    wg_mma<J>(acc, a0, xd + (((s >> 1) * J * WG_ATOM + (s & 1) * 64) >> 4));
                    wg_mma<J>(acc, a1, xd + (((s >> 1) * J * WG_ATOM + (s & 1) * 64 + 32) >> 4));
                    wg_commit();
                }
            }
            wg_wait<0>();
        }
    }
    cp_wait<0>();
    mmqb_finish<J>(acc, S, P, ra, q, T, part, cnt, tid, last, (float *)wg_wstage<J>(sm, 0));
#endif
}

/* value v of a q6_K row in the repacked layout (q6_word): its 6 bits */
__device__ __forceinline__ int q6w_get(const uint8_t *row, int n, int v)
{
    int nu = n >> 6, u = v >> 6, l = v & 31;
    return q6_bits(ld32a2(row + q6_word(nu, u, l >> 2, 8)), ld32a2(row + n / 2 + q6_word(nu, u, l >> 3, 4)),
                   (v >> 5) & 1, l);
}

/* q6_K in the repacked layout -> the batched kernel's (k_mmqb_wgmma<J, true>):
 * per row and super-block a Q6B_CH-byte chunk: its 16 sub-block scales
 * d * sc as f16s (32 bytes), then per lane q (0..3) three 16-byte pieces at
 * 32 + 64 k + 16 q holding the values an MMA A fragment takes from rows of
 * that lane (o = 2q, 2q+1, 2q+8, 2q+9 of each sub-block of 16): pieces 0,
 * 1: ql words (gi, p) of groups gi = 2k, 2k + 1 (4 sub-blocks each), whose
 * byte i holds value o_i's low 4 bits of sub-block 4 gi + 2 p (low nibble)
 * and 4 gi + 2 p + 1 (high); piece 2: qh word gi, byte i bits 2t, 2t + 1
 * the top 2 bits of value o_i of sub-block 4 gi + t. A thread per (row,
 * super-block, lane). */
__global__ void k_repack_q6_Kb(const uint8_t *src, uint8_t *dst, size_t rb, int n, int n_out)
{
    pdl_begin();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int nc = n / 256;
    if (i >= (size_t)nc * n_out * 4) return;
    int q = (int)(i & 3), r = (int)((i >> 2) / nc), c = (int)((i >> 2) % nc);
    const uint8_t *row = src + (size_t)r * rb;
    uint8_t *o = dst + ((size_t)r * nc + c) * Q6B_CH;
    const int of[4] = { 2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9 }, v0 = 256 * c;
    if (q == 0) {
        float d = h2f(row + 13 * (n / 16) + 2 * c);
        const int8_t *sc = (const int8_t *)row + 3 * (n / 4) + 16 * c;
        /* as 32-bit words: a byte store of an f16 register converts its value (ptxas 13) */
        for (int k = 0; k < 8; k++)
            *(uint32_t *)(o + 4 * k) = h2u(__floats2half2_rn(d * (float)sc[2 * k], d * (float)sc[2 * k + 1]));
    }
    for (int gi = 0; gi < 4; gi++) {
        for (int p = 0; p < 2; p++) {
            uint32_t w = 0;
            for (int k = 0; k < 4; k++) {
                int lo = q6w_get(row, n, v0 + 16 * (4 * gi + 2 * p) + of[k]) & 15;
                int hi = q6w_get(row, n, v0 + 16 * (4 * gi + 2 * p + 1) + of[k]) & 15;
                w |= (uint32_t)(lo | hi << 4) << (8 * k);
            }
            memcpy(o + 32 + 64 * (gi >> 1) + 16 * q + 4 * (2 * (gi & 1) + p), &w, 4);
        }
        uint32_t h = 0;
        for (int t = 0; t < 4; t++)
            for (int k = 0; k < 4; k++)
                h |= (uint32_t)(q6w_get(row, n, v0 + 16 * (4 * gi + t) + of[k]) >> 4) << (8 * k + 2 * t);
        memcpy(o + 32 + 128 + 16 * q + 4 * gi, &h, 4);
    }
}

/* CTAs per SM that the batched kernels' K split aims at (docs/benchmarks-cuda.md) */
#define MMQB_CTAS 2

/* k_mmqb_wgmma for four token tiles: where the device runs sm_90a code
 * (ck_feat.wgmma) */
static bool mmqb_wgmma_on(void)
{
    return ck_feat_now()->wgmma != 0;
}

/* The K split of each matrix for k_mmqb_mma: enough CTAs for ~2 per SM,
 * whole chunks per split, but where the set's row tiles fit in the CTA
 * slots, no more CTAs than slots (no small second wave). A function of the
 * set's shapes only, never of the batch. Without room for
 * the partials (or the counters), no split. Gate and up (S.glu_u, one set
 * entry of n_out features): tiles of 64 features' two rows, split as the
 * set {gate, up} would be, so each row's sums are those of ck_mmq_dec. */
template <int J, bool WG, bool Q6 = false>
static void mmqb_launch(cudaStream_t st, mat_set S, size_t rb, int n, const __half *x16, int T, float *part,
                   size_t part_bytes, int *cnt, int n_cnt, int n_sm)
{
    auto kern = WG ? k_mmqb_wgmma<J, Q6> : k_mmqb_mma<J>;
    const size_t smem = WG ? sizeof(wg_smem<J, Q6>) + WG_ATOM : sizeof(mma_smem<J>);   /* (+ the atoms' alignment) */
    static unsigned attr = 0;   /* (the dynamic shared memory past 48 KiB, once a device) */
    if (ck_first_on_device(&attr)) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int nch = n / MMQB_CHUNK, ctas = MMQB_CTAS * n_sm, ttot = 0, cap = 1 << 30;
    for (int i = 0; i < S.nm; i++) ttot += (S.glu_u ? 2 : 1) * (int)nblk(S.m[i].n_out, MMQB_ROWS);
    if (ttot <= ctas) cap = ctas / ttot;
    for (int pass = 0; pass < 2; pass++) {
        unsigned g = 0;
        size_t slots = 0;
        int cb = 0;
        for (int i = 0; i < S.nm; i++) {
            int mt = (int)nblk(S.m[i].n_out, MMQB_ROWS), tiles = S.glu_u ? S.m[i].n_out / (MMQB_ROWS / 2) : mt, sp = 1, per = nch;
            if (pass == 0) {
                int want = (ctas + mt - 1) / mt;
                want = want > cap ? cap : want;
                want = want < 1 ? 1 : want > nch ? nch : want;
                per = (nch + want - 1) / want;
                sp = (nch + per - 1) / per;
            }
            S.m[i].blk0 = (int)g;
            S.m[i].sp = sp;
            S.m[i].per = per;
            S.m[i].pb = (int)slots;
            S.m[i].cb = cb;
            g += (unsigned)(tiles * sp);
            if (sp > 1) { slots += (size_t)tiles * sp; cb += tiles; }
        }
        if (pass == 1 || (slots * J * 8 * MMQB_ROWS * 4 <= part_bytes && cb <= n_cnt)) {
            lk(kern, g, MMQB_WARPS * 32, smem, st, S, rb, n, x16, T, part, cnt);
            return;
        }
    }
}

extern "C" {

int ck_mmqb_ok(uint32_t type, int n_in)
{
    if ((int)sizeof(mma_smem<4>) > ck_feat_now()->smem_optin) return 0;
    return n_in % 256 == 0 && (type == QT_Q4_K || (type == QT_Q6_K && mmqb_wgmma_on()));
}

size_t ck_q6b_row_bytes(int n_in) { return (size_t)(n_in / 256) * Q6B_CH; }

void ck_repack_q6_Kb(cudaStream_t st, const void *src, void *dst, size_t rb, int n, int n_out)
{
    size_t tot = (size_t)(n / 256) * n_out * 4;
    lk(k_repack_q6_Kb, nblk(tot, 256), 256, 0, st, (const uint8_t *)src, (uint8_t *)dst, rb, n, n_out);
}

/* The batched kernel's launcher for type and T: token tiles only live ones
 * (the partial slots keep CK_MMQB_MAX_T tokens); four tiles by warpgroup
 * MMAs where built for them (24 tokens and fewer gain nothing from them);
 * q6_K only by those (ck_mmqb_ok) */
typedef void (*mmqb_fn)(cudaStream_t, mat_set, size_t, int, const __half *, int, float *, size_t, int *, int, int);
static mmqb_fn mmqb_pick(uint32_t type, int T)
{
    if (type == QT_Q6_K) return T <= 24 ? mmqb_launch<3, true, true> : mmqb_launch<4, true, true>;
    return T <= 24 ? mmqb_launch<3, false> : mmqb_wgmma_on() ? mmqb_launch<4, true> : mmqb_launch<4, false>;
}

void ck_mmq_dec(cudaStream_t st, uint32_t type, int nm, const void *const *W, size_t rb, int n, const int *n_out,
                const float *const *bias, int T, float *const *out, const void *x16, void *part, size_t part_bytes,
                int *cnt, int n_cnt, int n_sm)
{
    if (!ck_mmqb_ok(type, n) || T < 1 || T > CK_MMQB_MAX_T || nm < 1 || nm > CK_MULTI_MAX) return;
    mat_set S = mat_set_fill(nm, W, n_out, bias, out, 0);
    mmqb_pick(type, T)(st, S, rb, n, (const __half *)x16, T, (float *)part, part_bytes, cnt, n_cnt, n_sm);
}

int ck_mmq_glu_try(cudaStream_t st, uint32_t type, const void *Wg, const void *Wu, size_t rb, int n, int F, int T,
               float *out, void *h_out, const void *x16, void *part, size_t part_bytes, int *cnt, int n_cnt, int n_sm)
{
    if (type != QT_Q4_K || !ck_mmqb_ok(type, n) || T < 1 || T > CK_MMQB_MAX_T || F % (MMQB_ROWS / 2) || !h_out) return 0;
    const float *nb = NULL;
    mat_set S = mat_set_fill(1, &Wg, &F, &nb, &out, 0);
    S.glu_u = (const uint8_t *)Wu;
    S.glu_h = (__half *)h_out;
    mmqb_pick(type, T)(st, S, rb, n, (const __half *)x16, T, (float *)part, part_bytes, cnt, n_cnt, n_sm);
    return 1;
}

}  /* extern "C" */
